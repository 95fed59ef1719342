"""What every part of the configuration needs: :class:`ConfigError`, the choices' ``Literal`` types, the documented
option field (:func:`opt`), the range checks the sections share, the ``fsdp`` spellings (``DGRPO_FSDP``) and the
``perturbation.layers`` grammar (:func:`parse_layer_spec`)."""

from __future__ import annotations

import copy
import functools
import re
from dataclasses import field
from pathlib import Path
from typing import Any, Literal

#: the largest grpo.huber_delta: e^delta stays finite in float32 and bfloat16 (from 89 on the slope overflows)
MAX_HUBER_DELTA = 50.0

Arch = Literal["qwen2", "llama", "gpt2"]
DType = Literal["float32", "bfloat16"]
LatentTokenInit = Literal["mean", "coconut"]
SFTMode = Literal["coconut", "cot", "no_cot", "pause", "no_curriculum"]
ResetEvery = Literal["stage", "epoch"]
LRSchedule = Literal["cosine", "constant"]
#: an on/off option whose auto says where it is on (each option says where: e.g. on a CUDA device)
AutoSwitch = Literal["auto", "true", "false"]
PerturbationKind = Literal["locked", "native", "gaussian", "none"]
#: choices added to a Literal option in Python: perturbation.kind takes the kinds dgrpo.perturbation.register adds
REGISTERED_CHOICES: dict[str, list[str]] = {"perturbation.kind": []}
GaussianTarget = Literal["activations", "weights"]
Optimizer = Literal["adamw", "adamw8bit"]
Advantage = Literal["drgrpo", "grpo", "rloo", "ema"]
Aggregation = Literal["seq_mean", "token_mean", "constant"]
KLForm = Literal["unbiased", "paper"]
RolloutCache = Literal["dynamic", "static"]
Engine = Literal["auto", "eager", "fast"]
Kernels = Literal["none", "liger"]
CompileBackend = Literal["inductor", "aot_eager", "eager"]
CompileMode = Literal["default", "max-autotune-no-cudagraphs"]
RecomputeGranularity = Literal["call", "layer"]
ReplayMode = Literal["seed", "fresh_mask"]
FSDPMode = Literal["none", "full", "sharded"]
#: what best/ is kept by (grpo.best_metric, sft.best_metric): the validation accuracy, or the mean of the scorer's
#: values (a partial-credit scorer's 0.5 counts 0.5)
BestMetric = Literal["accuracy", "mean_score"]
#: the help of grpo.best_metric and sft.best_metric
BEST_METRIC_HELP = (
    "what best/ is kept by: accuracy (the share of validation answers the scorer scores 1) or mean_score (the mean "
    "of the scorer's values: a partial-credit eval.scorer's 0.5 counts 0.5); mean_score needs an evaluate_fn that "
    "returns an EvalResult (the default's does; one of your own that returns a count is refused, before training when "
    "annotated -> int, else at its first validation)"
)

#: where the packaged YAML configs live (``builtin/``, ``paper/``, ``tiny.yaml``)
CONFIG_DIR = Path(__file__).resolve().parent.with_name("configs")
#: the grammar of ``perturbation.layers`` (:func:`parse_layer_spec`), as error messages and docs state it
LAYER_GRAMMAR = (
    "all; one layer index (3, or -1 for the last); a slice start:stop, either end optional, negatives "
    "counting from the end (0:4, -2:, :3; no step; clipped to the model's layers as a Python slice is, -5: is "
    "every layer of a 2-layer model, and one that selects none is an error); or a comma list of indices (1,3,5)"
)
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
#: the sizes a float option may have besides 0: float32's normal numbers (the tensors an option meets are float32 or
#: bfloat16, of float32's range: grpo.eps_high=1e300 overflowed torch's clamp in a traceback at the first update,
#: grpo.temperature=1e-300 was 0 in float32 and every loss NaN; a subnormal loses its digits)
FLOAT32_TINY, FLOAT32_MAX = 2.0**-126, (2 - 2.0**-23) * 2.0**127


class ConfigError(ValueError):
    """An invalid configuration: unknown key, wrong type or value out of range."""


#: the environment variable that overrides the ``fsdp`` key of dgrpo sft and grpo (and of ``Dist.from_env``)
FSDP_ENV = "DGRPO_FSDP"
_FSDP_SPELLINGS = {"none": ("0", "false", "off", "none"), "full": ("1", "true", "on", "full"), "sharded": ("sharded",)}


def fsdp_mode(text: str, source: str = "fsdp") -> str:
    """An ``fsdp`` value (none, full or sharded) from its spellings (0 / false / off, 1 / true / on)."""
    raw = text.strip().lower()
    mode = next((m for m, spellings in _FSDP_SPELLINGS.items() if raw in spellings), None)
    if mode is None:
        raise ConfigError(f"{source}={raw!r}: expected none, full or sharded (or 0 / false / off, 1 / true / on)")
    return mode


def fsdp_setting(given: str) -> str:
    """The ``fsdp`` mode a command's process group takes: ``DGRPO_FSDP`` when set, else ``given`` (the config key)."""
    return fsdp_from_env() or fsdp_mode(given)


def fsdp_from_env() -> str | None:
    """``DGRPO_FSDP`` as an ``fsdp`` value (none, full or sharded); None when it is unset or empty."""
    import os

    raw = os.environ.get(FSDP_ENV, "").strip()
    return fsdp_mode(raw, FSDP_ENV) if raw else None


def opt(default: Any, doc: str, **kw: Any) -> Any:
    """A documented config field."""
    if isinstance(default, (list, dict)):
        return field(default_factory=functools.partial(copy.deepcopy, default), metadata={"doc": doc, **kw})
    return field(default=default, metadata={"doc": doc, **kw})


def _invalid(key: str, msg: str) -> ConfigError:
    """The error for a bad value of ``key``."""
    return ConfigError(f"invalid config value {key}: {msg}")


def _check(cond: bool, key: str, msg: str) -> None:
    """Raise ``_invalid(key, msg)`` unless ``cond``."""
    if not cond:
        raise _invalid(key, msg)


def _key(p: str, name: str) -> str:
    """The dotted key of option ``name`` of the section with prefix ``p`` ("" at the top level)."""
    return f"{p}.{name}" if p else name


def _at_least(obj: Any, p: str, lo: int, *names: str) -> None:
    """Each named option of section ``obj`` (prefix ``p``) must be >= ``lo``."""
    for n in names:
        v = getattr(obj, n)
        _check(v >= lo, _key(p, n), f"must be >= {lo}, got {v}")


def _positive(obj: Any, p: str, *names: str) -> None:
    """Each named option of section ``obj`` (prefix ``p``) must be > 0."""
    for n in names:
        v = getattr(obj, n)
        _check(v > 0, _key(p, n), f"must be > 0, got {v}")


#: the most torch CPU threads a config may ask for (100,000 failed to start threads, then crashed the interpreter)
MAX_THREADS = 1024
#: the most parameters the built-in tiny model's layers may hold (Qwen2.5-1.5B's hold 1.3e9): beyond, its random
#: weights alone take the memory of a trained model one would load instead
MAX_BUILTIN_PARAMS = 1_000_000_000


def _learning_rate(obj: Any, p: str) -> None:
    """``lr`` of section ``obj``: in (0, 1]. The optimizers are Adam's, whose step moves each weight by about lr:
    above 1 it is no learning rate (and from about 1e38 on, Adam's float32 step size overflowed in a traceback).
    Its ``weight_decay`` such that lr x weight_decay < 1 (1e30 made the weights non-finite at the first step, and the
    error advised a lower lr)."""
    _within(obj, p, "(0, 1]", "lr")
    _check(
        obj.lr * obj.weight_decay < 1,
        _key(p, "weight_decay"),
        f"lr x weight_decay must be below 1 (AdamW multiplies every weight by 1 - lr x weight_decay each step: "
        f"{obj.lr} x {obj.weight_decay} zeroes or flips them), got weight_decay {obj.weight_decay}",
    )


def _within(obj: Any, p: str, interval: str, *names: str) -> None:
    """Each named option of section ``obj`` must lie in ``interval``, written as in maths: ``[0, 1)``, ``(0, 1]``."""
    lo, hi = (float(x) for x in interval[1:-1].split(","))
    for n in names:
        v = getattr(obj, n)
        above = lo <= v if interval[0] == "[" else lo < v
        below = v <= hi if interval[-1] == "]" else v < hi
        _check(above and below, _key(p, n), f"must be in {interval}, got {v}")


def parse_layer_spec(spec: str) -> tuple[str, Any]:
    """The layers a ``perturbation.layers`` value selects, before it meets a model.

    The grammar: ``all``; one integer index (``3``, ``-1``); a Python slice ``start:stop`` with either end optional
    and negatives counting from the end (``0:4``, ``-2:``, ``:3``; no step); or a comma list of integers
    (``1,3,5``). An index may carry a ``+`` sign, as in Python: ``+1`` is ``1`` (a YAML file's ``layers: +1`` was the
    layer 1 when YAML read it as a number; its text is kept, and was refused). Returns ``("all", None)``,
    ``("slice", (start, stop))`` with ``None`` for an open end, or ``("list", [indices])`` (a single index is a
    one-element list). Anything else is a :class:`ConfigError` naming ``perturbation.layers`` (an index with a
    ``_``, YAML 1.1's digit separator, says so); the range against the model's depth is checked where the model is
    known.
    """
    s = spec.strip()
    if s == "all":
        return "all", None
    m = re.fullmatch(r"([-+]?[0-9]+)?\s*:\s*([-+]?[0-9]+)?", s)
    if m:
        start, stop = (None if g is None else int(g) for g in m.groups())
        return "slice", (start, stop)
    items = [x.strip() for x in s.split(",")]
    if all(re.fullmatch(r"[-+]?[0-9]+", x) for x in items):
        indices = [int(x) for x in items]
        if len(set(indices)) < len(indices):  # a layer named twice would carry two masks: dropout 1 - (1 - p)^2
            raise _invalid("perturbation.layers", f"a layer is named twice in {spec!r}")
        return "list", indices
    if re.fullmatch(r"[-+]?[0-9][0-9_]*", s):  # (1_0: YAML 1.1 read the layer 10)
        raise _invalid(
            "perturbation.layers",
            f"a layer index is written without '_', got {spec!r}: {s.replace('_', '')} for one layer, "
            f"{','.join(p for p in s.split('_') if p)} for several",
        )
    raise _invalid("perturbation.layers", f"expected {LAYER_GRAMMAR}; got {spec!r}")
