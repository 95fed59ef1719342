"""Benchmark item 10: activation recomputation through the recurrence vs full backprop, one GRPO step.

The same step (same seeds, same micro-batch) with ``grpo.recompute`` off and on at both granularities
(:mod:`dgrpo.model.recompute`): ``call`` (each forward call of the replayed recurrence keeps only its inputs and runs
again in backward) and ``layer`` (each decoder layer of each call keeps its input; one layer is rebuilt at a time);
and per layer with the latent steps' calls not recomputed (``grpo.recompute_latent_steps: false``: they keep their
activations, one position per row each, and skip their second forward).
Measured: the step's peak memory (a fresh process per arm, as in item 5: peak RSS on CPU, ``max_memory_allocated``
on CUDA), the bytes autograd keeps for backward in one micro-batch, and the step time (alternating, median). The CPU
section uses a wider model and a longer chain than the other items (``RECOMPUTE_CPU``) so that activations, not
weights, set the memory.
"""

from __future__ import annotations

import dataclasses
import functools
import unittest.mock
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.utils.checkpoint

from ..config import RecomputeGranularity
from ..model.kv_prefixes import OBSERVER
from ..training.grpo import GRPOTrainer
from ..training.rollouts import replay_logprobs
from .memprobe import run_probe
from .report import Row, fmt_bytes, fmt_s
from .timing import alternate
from .workload import Ctx, Shapes, build_lm, cpu_item_shapes, grpo_config, task_records

#: CPU: a ~10M-parameter Qwen2 (4 layers x 512), 4 prompts x K = 16 rollouts of T = 6 latents and 16 answer tokens,
#: all 64 in one micro-batch
RECOMPUTE_CPU = Shapes(
    name="recompute-cpu",
    hidden=512,
    layers=4,
    heads=8,
    kv_heads=4,
    ffn=2048,
    prompts=4,
    max_new_tokens=16,
    grpo_K_at=16,
    grpo_T_at=6,
    reps=5,
    warmup=1,
    mem_reps=1,
)


def item_shapes(ctx: Ctx) -> Shapes:
    return cpu_item_shapes(ctx, RECOMPUTE_CPU)


#: the arms: no recomputation; recomputation at each granularity; per layer without the latent steps' calls
#: (granularity or None, whether the latent steps are recomputed)
ARMS: dict[str, tuple[RecomputeGranularity | None, bool]] = {
    "full": (None, True),
    "call": ("call", True),
    "layer": ("layer", True),
    "layer, latent steps kept": ("layer", False),
}


def build_trainer(
    s: Shapes,
    device: torch.device,
    dtype: torch.dtype,
    recompute: RecomputeGranularity | None,
    latent_steps: bool = True,
) -> GRPOTrainer:
    cfg = grpo_config(s, s.grpo_K_at, s.grpo_T_at, "locked")
    cfg.grpo.recompute = recompute is not None
    if recompute is not None:  # (set without recompute it warns that it changes nothing)
        cfg.grpo.recompute_granularity = recompute
    cfg.grpo.recompute_latent_steps = latent_steps
    cfg.grpo.micro_batch_size = s.prompts * s.grpo_K_at  # the whole step in one micro-batch
    return GRPOTrainer(build_lm(s, device, dtype), cfg, task_records(s.prompts))


def kept_for_backward(run: Callable[[], Any], params: Iterable[torch.Tensor]) -> int:
    """Bytes kept for backward while ``run()`` builds its graph: the distinct storages of the tensors autograd saves
    (a reentrant checkpointed region's inputs among them) and of the inputs of non-reentrant regions (which such a
    region holds itself), the parameters' own storages left out (saving a weight costs nothing); what a region's
    recomputation saves inside backward is transient, not counted. The latent steps' keys and values saved once
    (dgrpo.model.kv_prefixes) count once: this hook only looks (``OBSERVER``)."""
    skip = {p.untyped_storage().data_ptr() for p in params}
    seen: dict[int, torch.UntypedStorage] = {}  # (held until the count: a freed storage's address could be reused)

    def keep(t: torch.Tensor) -> torch.Tensor:
        if torch._C._current_graph_task_id() != -1:  # saved by a recomputation inside backward: not kept across it
            return t
        st = t.untyped_storage()
        if st.data_ptr() not in skip:
            seen[st.data_ptr()] = st
        return t

    setattr(keep, OBSERVER, True)  # (it only looks: the latent steps still save their keys and values once)
    real = torch.utils.checkpoint.checkpoint

    def checkpoint(fn: Callable, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("use_reentrant") is False:  # (a reentrant region saves its inputs: the hook sees them)
            for a in args:
                if isinstance(a, torch.Tensor):
                    keep(a)
        return real(fn, *args, **kwargs)

    with (
        torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t),
        unittest.mock.patch.object(torch.utils.checkpoint, "checkpoint", checkpoint),
    ):
        run()
    return sum(st.nbytes() for st in seen.values())


def saved_bytes(trainer: GRPOTrainer) -> int:
    """Activation memory of the step's replay in one micro-batch (:func:`kept_for_backward`)."""
    prompts = task_records(trainer.cfg.grpo.prompts_per_step)
    ro = trainer._collect(prompts, torch.arange(len(prompts) * trainer.cfg.grpo.group_size) + 1)
    rows = torch.arange(ro.tokens.shape[0])

    def replay() -> None:
        logp, tm = replay_logprobs(
            trainer.lm,
            ro,
            rows,
            n_latent=trainer.n_latent,
            perturbation=trainer.perturbation,
            seeds=ro.seeds[rows],
            temperature=1.0,
        )
        (logp * tm).sum().backward()

    kept = kept_for_backward(replay, trainer.lm.model.parameters())
    trainer.lm.model.zero_grad(set_to_none=True)
    return kept


def _probe(ctx: Ctx, s: Shapes, recompute: RecomputeGranularity | None, latent_steps: bool = True) -> dict:
    mb = s.prompts * s.grpo_K_at
    return run_probe(
        ctx, s, s.grpo_K_at, s.grpo_T_at, recompute=recompute, recompute_latent_steps=latent_steps, micro_batch_size=mb
    )


def bench_recompute(ctx: Ctx) -> tuple[list[Row], dict]:
    """GRPO step with activation recomputation (per call, per layer) vs full backprop: peak memory, kept
    activations, step time."""
    s = item_shapes(ctx)
    mb = s.prompts * s.grpo_K_at
    ctx.log(f"[10] recompute: {s.layers} x {s.hidden} Qwen2, K={s.grpo_K_at}, T={s.grpo_T_at}, micro-batch {mb}")
    # fresh processes first, before this one grows; not in --quick (a smoke run: item 5 runs the same probe, and at the
    # quick shapes the weights, not the activations, set the peak)
    quick = s.name == "quick"
    mem = {} if quick else {name: _probe(ctx, s, *arm) for name, arm in ARMS.items()}
    trainers = {name: build_trainer(s, ctx.device, ctx.dtype, *arm) for name, arm in ARMS.items()}
    kept = {name: saved_bytes(tr) for name, tr in trainers.items()}
    prompts = task_records(s.prompts)
    fns: dict[str, Callable[[], Any]] = {n: functools.partial(t.step, prompts=prompts) for n, t in trainers.items()}
    t = alternate(fns, reps=s.reps, warmup=s.warmup, device=ctx.device, log=ctx.log)
    raw = {
        "shapes": dataclasses.asdict(s),
        "micro_batch": mb,
        "memory": mem,
        "saved_bytes": kept,
        "timing": t.to_json(),
    }
    what = "peak allocated (CUDA)" if ctx.device.type == "cuda" else "peak RSS"
    conf = (
        f"Qwen2 {s.layers} layers x {s.hidden} ({ctx.dtype}), {s.prompts} prompts x K={s.grpo_K_at}, T={s.grpo_T_at}, "
        f"{s.max_new_tokens} answer tokens, one micro-batch of {mb}, KL reference on; time: median of {s.reps} "
        "alternating repetitions; memory: "
        + ("not measured (--quick)" if quick else "fresh process each, step after a warm-up step")
    )
    vals = "; ".join(
        f"{n}: kept for backward {fmt_bytes(kept[n])}{_peak(mem, n, what)}, step {fmt_s(t.median(n))}" for n in ARMS
    )
    row = functools.partial(Row, ctx.section, "10. Activation recomputation", "recompute", conf, vals)
    growth = {n: mem[n]["peak_bytes"] - mem[n]["before_bytes"] for n in mem}
    rows = []
    for arm in [n for n in ARMS if n != "full"]:
        rows.append(row(f"activations kept for backward {arm} / full", kept[arm] / kept["full"], None))
        if growth:
            rows.append(row(f"{what} growth during the step {arm} / full", growth[arm] / max(1, growth["full"]), None))
        rows.append(row(f"step time {arm} / full", t.ratio(arm, "full"), None, t.paired_spread(arm, "full")))
    return rows, raw


def _peak(mem: dict, arm: str, what: str) -> str:
    """``arm``'s measured peak for the table (nothing when the memory was not measured)."""
    if arm not in mem:
        return ""
    return f", {what} {fmt_bytes(mem[arm]['peak_bytes'])} (before the step {fmt_bytes(mem[arm]['before_bytes'])})"
