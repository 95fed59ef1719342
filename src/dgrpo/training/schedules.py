"""Learning-rate and KL-coefficient schedules (pure functions of the step)."""

from __future__ import annotations

import math


def lr_at(step: int, peak: float, total_steps: int, warmup_steps: int, min_ratio: float = 0.0) -> float:
    """Linear warmup to ``peak`` over ``warmup_steps``, then cosine decay to ``min_ratio * peak`` at ``total_steps``
    (paper Sec. 5.3: 200 warmup steps, then cosine decay; the eta_t of Eq. 7).

    ``step`` counts the schedule's steps from 0 (SFT's optimizer steps; GRPO's steps, each ``grpo.mini_epochs``
    optimizer steps at one lr); the value is the lr used *for* that step. The last step, ``total_steps - 1``, is
    above the floor ``min_ratio * peak`` by ``(1 - min_ratio) * peak * (1 - cos(pi / n)) / 2``, ``n`` the cosine's
    ``total_steps - warmup_steps`` steps.
    """
    if step < 0:
        raise ValueError(f"lr_at: step counts optimizer steps from 0, got {step}")
    if warmup_steps > 0 and step < warmup_steps:
        return peak * (step + 1) / warmup_steps
    span = total_steps - warmup_steps  # (none left after the warmup: the floor from total_steps on, as with some)
    progress = min(1.0, max(0.0, (step - warmup_steps) / span)) if span > 0 else 1.0
    return peak * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def constant_lr_at(step: int, peak: float, warmup_steps: int) -> float:
    """Linear warmup to ``peak`` over ``warmup_steps`` (none when 0), then ``peak`` (Coconut's run.py: constant)."""
    if step < 0:
        raise ValueError(f"constant_lr_at: step counts optimizer steps from 0, got {step}")
    return peak * (step + 1) / warmup_steps if step < warmup_steps else peak


def beta_at(
    step: int, beta0: float, peak_lr: float, total_steps: int, warmup_steps: int, min_ratio: float = 0.0
) -> float:
    """Eq. 7 of the paper: beta(t) = beta0 * lr(t) / lr_max, the KL pull annealed with the learning rate."""
    if peak_lr <= 0:
        raise ValueError(f"beta_at: peak_lr must be > 0 (beta follows lr / peak_lr), got {peak_lr}")
    return beta0 * lr_at(step, peak_lr, total_steps, warmup_steps, min_ratio) / peak_lr
