"""Benchmark item 12: the fast rollout engine vs the eager one (``grpo.engine``), one GRPO step.

Two trainers from the same weights, one per engine, step alternately on the same prompts and seeds (so they stay
in lockstep). Measured: the rollout phase and the whole step (median of alternating repetitions), and how many
rollouts give the same answer under both engines. On a CPU the fast engine runs its fixed-shape steps eagerly (no
graphs): the row shows what the fixed buffers and the device-side bookkeeping cost or save there. On CUDA it
replays one captured graph per latent and answer step: the ratio the GPU issue's goal (step fast / eager <= 0.2 at
the paper's scale, ``bench/paper_step.py``) is measured by.
"""

from __future__ import annotations

import copy
import dataclasses
import functools

import torch

from ..config import Engine
from ..data.records import Record
from ..training.grpo import GRPOTrainer
from .report import Goal, Row, fmt_s
from .timing import alternate
from .workload import Ctx, build_lm, grpo_config, task_records

ENGINES: tuple[Engine, ...] = ("eager", "fast")


def build_trainers(ctx: Ctx) -> dict[str, GRPOTrainer]:
    """One trainer per engine, on two copies of the same weights."""
    s = ctx.shapes
    lm = build_lm(s, ctx.device, ctx.dtype)
    trainers: dict[str, GRPOTrainer] = {}
    for engine in ENGINES:
        cfg = grpo_config(s, s.grpo_K_at, s.grpo_T_at, "locked")
        cfg.grpo.engine = engine
        trainers[engine] = GRPOTrainer(lm if engine == "eager" else copy.deepcopy(lm), cfg, task_records(s.prompts))
    return trainers


def same_answers(trainers: dict[str, GRPOTrainer], prompts: list[Record], seeds: torch.Tensor) -> float:
    """The share of rollouts whose answer text is the same under both engines (same prompts, same seeds)."""
    texts = {n: tr._collect(prompts, seeds).texts for n, tr in trainers.items()}
    return sum(a == b for a, b in zip(texts["eager"], texts["fast"])) / len(texts["eager"])


def bench_engine(ctx: Ctx) -> tuple[list[Row], dict]:
    """Fast vs eager rollout engine: rollout time, step time, answers that agree."""
    s = ctx.shapes
    ctx.log(f"[12] engine: {s.layers} x {s.hidden} Qwen2, {s.prompts} x K={s.grpo_K_at}, T={s.grpo_T_at}")
    trainers = build_trainers(ctx)
    prompts = task_records(s.prompts)
    seeds = torch.arange(s.prompts * s.grpo_K_at) + 1
    agree = same_answers(trainers, prompts, seeds)
    roll = alternate(
        {n: functools.partial(tr._collect, prompts, seeds) for n, tr in trainers.items()},
        reps=s.reps,
        warmup=s.warmup,
        device=ctx.device,
        log=ctx.log,
    )
    step = alternate(
        {n: functools.partial(tr.step, prompts=prompts) for n, tr in trainers.items()},
        reps=s.reps,
        warmup=s.warmup,
        device=ctx.device,
        log=ctx.log,
    )
    raw = {
        "shapes": dataclasses.asdict(s),
        "answers_agree": agree,
        "rollout_timing": roll.to_json(),
        "step_timing": step.to_json(),
    }
    graphs = "one CUDA graph per latent / answer step" if ctx.device.type == "cuda" else "fixed-shape steps, no graphs"
    conf = (
        f"Qwen2 {s.layers} layers x {s.hidden} ({ctx.dtype}), {s.prompts} prompts x K={s.grpo_K_at}, T={s.grpo_T_at}, "
        f"{s.max_new_tokens} answer tokens, locked dropout; fast: {graphs}; median of {s.reps} alternating repetitions"
    )
    vals = (
        f"rollout eager {fmt_s(roll.median('eager'))}, fast {fmt_s(roll.median('fast'))}; step eager "
        f"{fmt_s(step.median('eager'))}, fast {fmt_s(step.median('fast'))}; the same answer in {agree:.1%} of rollouts"
    )
    row = functools.partial(Row, ctx.section, "12. Rollout engine", "engine", conf, vals)
    gpu = ctx.device.type == "cuda"
    return [
        row("rollout time fast / eager", roll.ratio("fast", "eager"), None, roll.paired_spread("fast", "eager")),
        row(
            "step time fast / eager",
            step.ratio("fast", "eager"),
            None if gpu else Goal("<=", 1.05),
            step.paired_spread("fast", "eager"),
        ),
        row("rollouts with the same answer (share)", agree, Goal(">=", 0.99) if gpu else Goal(">=", 1.0)),
    ], raw
