"""The model's own attention dropout, replayed by restoring the RNG state before every forward.

This is the mechanism the paper describes (Algorithm 1: "restoring the chain seed at every latent
step"). PyTorch's dropout draws from the global generator, so a row's mask depends on everything
else in the batch and on the call sequence: it is exact only one rollout at a time, with the update
re-running the same sequence of forwards (the trainer scores answers token by token in this mode).
The global RNG state is saved on entry and restored on exit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from ..config import ConfigError
from ..model.anatomy import attention_modules
from .base import BoundPerturbation, Perturbation, as_seeds, register

if TYPE_CHECKING:
    from ..config import PerturbationConfig
    from ..model.latent_lm import LatentLM


class _BoundNative(BoundPerturbation):
    def __init__(self, attn: list[nn.Module], seed: int, p: float, perturb_prompt: bool, perturb_answer: bool = True):
        super().__init__()
        self.attn, self.seed, self.p = attn, seed, p
        self.perturb_prompt, self.perturb_answer = perturb_prompt, perturb_answer
        self.saved: list = []
        self.switches = [s for m in attn for s in _dropout_switches(m)]
        self.modes: list[bool] = []

    @property
    def rows(self) -> int:
        """One: a forward's masks follow its shape, so one seed bound over several rows gave each row other masks
        than its replay alone (and two copies of one row, two different answers)."""
        return 1

    @property
    def needs_stepwise(self) -> bool:
        """The answer's masks are drawn per forward call: its replay runs one token per call, as decoding did (not
        needed when the answer runs without dropout)."""
        return self.perturb_answer

    def _set(self, on: bool) -> None:
        for m in self.switches:
            m.training = on

    def before_forward(self, phase: str) -> None:
        super().before_forward(phase)
        self._set(self.active)
        torch.manual_seed(self.seed)  # the same stream at every forward of this rollout (CPU and all CUDA devices)

    def resume(self, phase: str) -> None:
        # a recomputed layer: the checkpoint has restored the RNG state it had; only the dropout switch follows phase
        super().resume(phase)
        self._set(self.active)

    def _install(self) -> None:
        self.saved = []
        self.modes = [m.training for m in self.switches]
        self.cpu_state = torch.random.get_rng_state()
        self.cuda_state = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        for m in self.attn:
            mod: Any = m  # the dropout rate is a float (Qwen2 / Llama) or an nn.Dropout module (GPT-2)
            self.saved.append((getattr(mod, "attention_dropout", None), getattr(mod, "attn_dropout", None)))
            if hasattr(mod, "attention_dropout"):
                mod.attention_dropout = self.p
            if isinstance(getattr(mod, "attn_dropout", None), nn.Dropout):
                self.saved[-1] = (self.saved[-1][0], mod.attn_dropout.p)
                mod.attn_dropout.p = self.p

    def _uninstall(self) -> None:
        for m, training in zip(self.switches, self.modes):
            m.training = training
        for m, (rate, module_rate) in zip(self.attn, self.saved):
            mod: Any = m
            if rate is not None:
                mod.attention_dropout = rate
            if module_rate is not None:
                mod.attn_dropout.p = module_rate
        torch.random.set_rng_state(self.cpu_state)
        if self.cuda_state is not None:
            torch.cuda.set_rng_state_all(self.cuda_state)


@register("native")
class NativeDropout(Perturbation):
    """The model's attention dropout at rate ``p``, one rollout at a time, RNG restored before every forward."""

    batched = False

    def __init__(self, p: float = 0.1, perturb_prompt: bool = True, perturb_answer: bool = True):
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout p must be in [0, 1), got {p}")
        self.p, self.perturb_prompt, self.perturb_answer = p, perturb_prompt, perturb_answer

    @classmethod
    def from_config(cls, cfg: PerturbationConfig) -> NativeDropout:
        return cls(p=cfg.p, perturb_prompt=cfg.perturb_prompt, perturb_answer=cfg.perturb_answer)

    def bind(self, lm: LatentLM, seeds: Tensor) -> BoundPerturbation:
        seeds = as_seeds(seeds)
        if seeds.numel() != 1:
            raise ValueError("native dropout replays the global RNG stream: bind one rollout at a time")
        attn = attention_modules(lm.model)
        if not any(_has_rate(m) for m in attn):  # (it would run the deterministic network: every group identical)
            raise ConfigError(
                f"perturbation.kind=native: {type(attn[0]).__name__} has no attention dropout rate dgrpo can set "
                "(an attention_dropout value or an attn_dropout module); use perturbation.kind=locked"
            )
        return _BoundNative(attn, int(seeds.item()), self.p, self.perturb_prompt, self.perturb_answer)


def _dropout_switches(module: nn.Module) -> list[nn.Module]:
    """The modules whose train mode turns an attention module's dropout on: the module itself (its flag gates the rate
    it hands the attention: Qwen2, Llama, GPT-2) and its dropout module when it has one (GPT-2's ``attn_dropout``).
    Not its other sub-modules: GPT-2's ``resid_dropout`` would drop the attention output too, at the config's
    ``resid_pdrop`` (0.1 in the hub's configs), a rate no option sets (p = 0 still perturbed)."""
    dropout = getattr(module, "attn_dropout", None)
    return [module] + ([dropout] if isinstance(dropout, nn.Dropout) else [])


def _has_rate(module: nn.Module) -> bool:
    """Whether the attention module keeps its dropout rate where :class:`_BoundNative` sets it."""
    return hasattr(module, "attention_dropout") or isinstance(getattr(module, "attn_dropout", None), nn.Dropout)
