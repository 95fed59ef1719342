"""The guards that stop a run that stopped learning: the errors a stopped run raises (exit code 1), the count of
consecutive non-finite steps, the gradient clip that reports a non-finite norm and the weights' finiteness check over
ranks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .distributed import Dist
from .wording import in_command_line, setting_named


class TrainingStopped(RuntimeError):
    """A run stopped on purpose because it stopped learning (its state was saved first); exit code 1. Under torchrun
    every rank raises it at the same step (its guards decide on values the ranks share): rank 0 prints it."""


class NonFiniteError(TrainingStopped):
    """Too many consecutive steps with a non-finite loss or gradient, or non-finite weights after a step."""


class StalledError(TrainingStopped):
    """Every group was filtered out for too many steps in a row: no update happened for that long."""


class NonFiniteGuard:
    """Counts optimizer steps dropped for a non-finite loss or gradient; trips after ``limit`` in a row."""

    def __init__(self, limit: int, what: str, lr_key: str, skips: int = 0, streak: int = 0):
        self.limit, self.what, self.lr_key = limit, what, lr_key
        self.skips, self.streak = skips, streak

    def record(self, finite: bool) -> None:
        self.skips += int(not finite)
        self.streak = 0 if finite else self.streak + 1

    @property
    def tripped(self) -> bool:
        return self.streak >= self.limit

    def error(self, step: int, saved_in: Path) -> NonFiniteError:
        """The stop's line, its resume worded for the caller (:func:`~.wording.in_command_line`)."""
        how = setting_named(self.lr_key, "...", "...", in_command_line(), allow=True)
        return NonFiniteError(
            f"{self.streak} {self.what} optimizer steps in a row had a non-finite loss or gradient (step {step}); "
            f"state saved in {saved_in}; check the data, or resume with a lower {self.lr_key} ({how})"
        )


def clip_gradients(params: list, max_norm: float) -> Any:
    """:func:`torch.nn.utils.clip_grad_norm_` (the 2-norm of the gradients of ``params`` together, scaled down to
    ``max_norm``; ``inf``: not clipped), with the norm summed in float32 when a gradient is of lower precision: a bf16
    run's norm was bf16 (3.9375, 2.859375: three significant digits, logged as ``grad_norm`` and clipped by).
    float32 and float64 gradients take torch's own path, unchanged. Returns the norm (a 0-dim tensor)."""
    import torch

    grads = [p.grad for p in params if p.grad is not None]
    if all(g.dtype in (torch.float32, torch.float64) for g in grads):
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    total = torch.linalg.vector_norm(torch.stack(list(torch._foreach_norm(grads, 2.0, dtype=torch.float32))), 2.0)
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return total


def weights_finite(params: list, dist: Dist) -> bool:
    """Whether every weight is finite (all ranks agree: under FSDP each holds a shard). One fused norm per call."""
    import torch

    local = (
        bool(torch.isfinite(torch.stack(torch._foreach_norm([p.detach() for p in params]))).all()) if params else True
    )
    return dist.sum_int(int(not local)) == 0
