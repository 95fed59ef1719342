"""Perturbations: the exogenous, seed-replayable stochasticity source of Dropout-GRPO (paper Sec. 3.1).

One small interface. ``perturbation.bind(lm, seeds)`` returns a context manager for one batch whose
row ``i`` is perturbed by the noise regenerated from ``seeds[i]`` alone; inside it, every forward of
the :class:`~dgrpo.model.latent_lm.LatentLM` (prompt, each latent step, each answer token) sees the
*same* perturbation of that row (the prompt's and the answer's unperturbed where ``perturb_prompt`` /
``perturb_answer`` are false), ``perturbation=`` given or not; a forward there over a batch of another size is a
ValueError (one line). Only the seeds (int64, 8 bytes per rollout) are ever stored: at
update time the same ``bind`` with the same seeds regenerates the noise exactly (mask replay).

Kinds (``perturbation.kind``; a new one is a :class:`Perturbation` subclass decorated with
``@register("name")``, whose ``bind`` reads its seeds through :func:`as_seeds`; from the command line, where no
module of one's own is imported, ``perturbation.kind: path/to/file.py:Class`` names it):
  ``locked``   one Bernoulli mask per rollout per site over the hidden dimension, inverted scaling
               1/(1-p), shared across positions and latent steps (variational dropout, Gal &
               Ghahramani 2016). Batched: all rollouts of all groups run in one forward.
  ``native``   the model's own attention dropout with the RNG state restored from the seed before
               every forward (the paper's described mechanism); one rollout at a time.
  ``gaussian`` multiplicative Gaussian noise (1 + sigma * eps) per rollout on the same sites, or
               additive noise on the weights of the selected linear layers (paper Sec. A.5).
  ``none``     deterministic.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..config import ConfigError
from ..plugins import PluginError, import_object, name_hint
from .base import (
    PERTURBATIONS,
    BoundPerturbation,
    HookedPerturbation,
    NoPerturbation,
    Perturbation,
    as_seeds,
    register,
    seeds_for,
)
from .gaussian import GaussianNoise
from .locked import LockedDropout
from .native import NativeDropout

if TYPE_CHECKING:
    from ..config import PerturbationConfig


def kind_class(kind: str) -> type[Perturbation]:
    """The class ``perturbation.kind`` names: a registered kind, or a plug-in class ``path/to/file.py:Class`` /
    ``package.module:Class`` (how a kind of one's own is named from the command line); one ConfigError line when
    it names none."""
    if kind in PERTURBATIONS:
        return PERTURBATIONS[kind]
    if ":" not in kind:
        raise ConfigError(
            f"perturbation.kind {kind!r} is not registered (registered: {', '.join(PERTURBATIONS)}): import the module "
            "that registers it first, or name its class, perturbation.kind=path/to/file.py:Class"
            + name_hint(kind, "Class")
        )
    try:
        cls = import_object(kind, "perturbation.kind", "Class")
    except PluginError as e:
        raise ConfigError(str(e)) from None
    if not (isinstance(cls, type) and issubclass(cls, Perturbation)):
        raise ConfigError(f"perturbation.kind {kind!r} is not a subclass of dgrpo.perturbation.Perturbation")
    return cls


def make_perturbation(cfg: PerturbationConfig) -> Perturbation:
    """The perturbation a config names (:func:`kind_class` of ``perturbation.kind``); one ConfigError line when
    ``perturbation.perturb_answer`` is false and the kind leaves it true (its noise would still act on the answer)."""
    cls = kind_class(cfg.kind)
    built = cls.from_config(cfg)
    if not cfg.perturb_answer and getattr(built, "perturb_answer", True):
        raise ConfigError(
            f"perturbation.perturb_answer=false: perturbation.kind={cfg.kind} ({cls.__name__}) does not take it (its "
            "from_config leaves perturb_answer true, so its noise would still act on the answer): set perturb_answer "
            "from cfg.perturb_answer there and pass it to what bind returns (HookedPerturbation(modules, "
            "perturb_prompt, perturb_answer)), or keep perturbation.perturb_answer=true"
        )
    return built


__all__ = [
    "PERTURBATIONS",
    "BoundPerturbation",
    "HookedPerturbation",
    "GaussianNoise",
    "LockedDropout",
    "NativeDropout",
    "NoPerturbation",
    "Perturbation",
    "as_seeds",
    "kind_class",
    "make_perturbation",
    "register",
    "seeds_for",
]
