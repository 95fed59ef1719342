"""Benchmark item 9: LoRA vs full fine-tuning, one GRPO step on the same model.

Both arms run the paper's step with the KL reference on (``beta0`` default): full fine-tuning keeps a frozen copy
of the model for it, LoRA a frozen adapter (:mod:`dgrpo.training.ref_policy`). Measured: trainable parameters,
optimizer state bytes, the step's peak memory (each arm in a fresh process, as in item 5: peak RSS on CPU,
``max_memory_allocated`` on CUDA; where item 5 ran the full arm's probe, in --quick and on the GPU, its result is
reused) and the step time (alternating, median). The CPU section uses a wider model than
the other items (``LORA_CPU``) so that weights, not the tiny model's activations, set the memory.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
from collections.abc import Callable
from typing import Any

from ..model import lora
from ..model.latent_lm import LatentLM
from ..training.grpo import GRPOTrainer
from .memprobe import run_probe
from .report import Row, fmt_bytes, fmt_s
from .timing import alternate
from .workload import (
    Ctx,
    Shapes,
    add_lora,
    build_lm,
    cpu_item_shapes,
    grpo_config,
    optimizer_state_bytes,
    task_records,
)

LORA_R = 16
#: CPU: a ~38M-parameter Qwen2 (6 layers x 768), few short rollouts, so that a step takes seconds
LORA_CPU = Shapes(
    name="lora-cpu",
    hidden=768,
    layers=6,
    heads=12,
    kv_heads=4,
    ffn=2048,
    prompts=4,
    max_new_tokens=8,
    grpo_K_at=8,
    grpo_T_at=3,
    reps=5,
    warmup=1,
    mem_reps=1,
)


def item_shapes(ctx: Ctx) -> Shapes:
    return cpu_item_shapes(ctx, LORA_CPU)


def build_trainer(s: Shapes, ctx_device, dtype, r: int) -> GRPOTrainer:
    lm = build_lm(s, ctx_device, dtype)
    if r:
        add_lora(lm, r)
    return GRPOTrainer(lm, grpo_config(s, s.grpo_K_at, s.grpo_T_at, "locked"), task_records(s.prompts))


def _probe(ctx: Ctx, s: Shapes, r: int) -> dict:
    """An arm's memory probe; full fine-tuning reuses item 5's locked probe where that ran with the same spec."""
    return run_probe(ctx, s, s.grpo_K_at, s.grpo_T_at, lora_r=r, reuse=not r)


def bench_lora(ctx: Ctx) -> tuple[list[Row], dict]:
    """GRPO step under LoRA (r=16, all linear layers) vs full fine-tuning: parameters, state, memory, time."""
    if importlib.util.find_spec("peft") is None:
        return [], {"skipped": "peft is not installed (pip install 'dgrpo[lora]')"}
    s = item_shapes(ctx)
    arms = {"full": 0, "lora": LORA_R}
    ctx.log(f"[9] lora: full vs LoRA r={LORA_R} on {s.layers} x {s.hidden} Qwen2, K={s.grpo_K_at}, T={s.grpo_T_at}")
    mem = {name: _probe(ctx, s, r) for name, r in arms.items()}  # fresh processes first, before this one grows
    trainers = {name: build_trainer(s, ctx.device, ctx.dtype, r) for name, r in arms.items()}
    prompts = task_records(s.prompts)
    fns: dict[str, Callable[[], Any]] = {n: functools.partial(t.step, prompts=prompts) for n, t in trainers.items()}
    t = alternate(fns, reps=s.reps, warmup=s.warmup, device=ctx.device, log=ctx.log)
    params = {n: lora.trainable_parameters(tr.lm) if tr.lm.peft else _counts(tr.lm) for n, tr in trainers.items()}
    state = {n: optimizer_state_bytes(tr.opt) for n, tr in trainers.items()}
    raw = {
        "shapes": dataclasses.asdict(s),
        "r": LORA_R,
        "params": params,
        "state_bytes": state,
        "memory": mem,
        "timing": t.to_json(),
    }
    what = "peak allocated (CUDA)" if ctx.device.type == "cuda" else "peak RSS"
    conf = (
        f"Qwen2 {s.layers} layers x {s.hidden} ({params['full'][1]:,} params, {ctx.dtype}), K={s.grpo_K_at}, "
        f"T={s.grpo_T_at}, {s.prompts} prompts, {s.max_new_tokens} answer tokens, KL reference on; LoRA r={LORA_R} "
        f"alpha 32 on every linear layer + the 3 latent rows; time: median of {s.reps} alternating repetitions; "
        "memory: fresh process each, step after a warm-up step"
    )
    vals = "; ".join(
        f"{n}: {params[n][0]:,} trainable, optimizer state {fmt_bytes(state[n])}, {what} "
        f"{fmt_bytes(mem[n]['peak_bytes'])} (before the step {fmt_bytes(mem[n]['before_bytes'])}), step "
        f"{fmt_s(t.median(n))}"
        for n in arms
    )
    row = functools.partial(Row, ctx.section, "9. LoRA vs full fine-tuning", "lora", conf, vals)
    return [
        row("trainable params lora / full", params["lora"][0] / params["full"][0], None),
        row("optimizer state lora / full", state["lora"] / state["full"], None),
        row(f"{what} of the step lora / full", mem["lora"]["peak_bytes"] / mem["full"]["peak_bytes"], None),
        row("step time lora / full", t.ratio("lora", "full"), None, t.paired_spread("lora", "full")),
    ], raw


def _counts(lm: LatentLM) -> tuple[int, int]:
    n = sum(p.numel() for p in lm.model.parameters())
    return sum(p.numel() for p in lm.model.parameters() if p.requires_grad), n
