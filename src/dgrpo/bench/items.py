"""The benchmark items: one function each, ``fn(ctx) -> (rows, raw)``; the short ones live here, the others in their
own modules (engine_item, long_items, lora_item, parallel_item, recompute_item), and :data:`ITEMS` lists them all.

Every claim is the ratio of two ways of doing the same work, timed alternately in one run
(:func:`dgrpo.bench.timing.alternate`), median of ``shapes.reps`` repetitions after a warm-up.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable
from typing import Any

import torch

from ..config import Config
from ..model.anatomy import select_layers
from ..model.latent_lm import LatentLM
from ..model.reference import recompute_generate
from ..perturbation import LockedDropout, NativeDropout, seeds_for
from ..perturbation.locked import draw_keep_rows, draw_threads
from ..training.curriculum import make_example
from ..training.grpo import GRPOTrainer
from ..training.rollouts import collect_rollouts
from ..training.sft import count_target_tokens, sft_loss
from .baselines import naive_coconut_loss
from .engine_item import bench_engine
from .long_items import bench_optimizer, bench_soak
from .lora_item import bench_lora
from .memprobe import run_probe
from .parallel_item import bench_parallel
from .recompute_item import bench_recompute
from .report import Goal, Row, fmt_bytes, fmt_flops, fmt_s
from .timing import Timed, alternate, sync
from .workload import (
    FLOP_FORMULA,
    GPU,
    Ctx,
    Dims,
    Shapes,
    build_lm,
    dims_of,
    grpo_config,
    prompt_widths,
    recurrence_flops,
    task_records,
    tokenizing_lm,
)

P_DROP = 0.1


def _range(xs: list[float]) -> tuple[float, float]:
    return (min(xs), max(xs))


def _peak_note(ctx: Ctx, flops_per_s: float) -> str:
    peak = ctx.results.get("peak_flops")
    return f", {100 * flops_per_s / peak:.1f}% of the measured matmul peak" if peak else ""


# --------------------------------------------------------------------------- 1. rollouts
def bench_rollouts(ctx: Ctx) -> tuple[list[Row], dict]:
    """K rollouts per prompt: one batched forward with locked masks vs one at a time (native dropout,
    RNG restore) vs batch-1 generation that recomputes the whole sequence per token (original Coconut)."""
    s = ctx.shapes
    lm = build_lm(s, ctx.device, ctx.dtype).eval()
    records = task_records(s.prompts)
    n_seq = s.prompts * s.seq_per_prompt  # rollouts timed for the one-at-a-time baselines
    rows, raw = [], {}
    for K in s.rollout_K:
        N = s.prompts * K
        ctx.log(f"[1] rollouts K={K}: {N} batched vs {n_seq} one at a time")
        fns = _rollout_candidates(lm, records, s, K)
        t = alternate(fns, reps=s.reps, warmup=s.warmup, device=ctx.device, log=ctx.log)
        raw[f"K={K}"] = r = _rollout_figures(lm, records, s, K, t)
        conf = (
            f"K={K} x {s.prompts} prompts = {N} rollouts, T={s.T}, {s.max_new_tokens} answer tokens each "
            f"(tokens/rollout: {' / '.join(f'{n:.0f}' for n in r['answer_tokens_per_rollout'].values())})"
        )
        per, fps = r["per_rollout_s"], r["batched_flops_per_s"]
        base = (
            f"batched (locked): {fmt_s(per['batched_locked'])}/rollout ({N} in {fmt_s(t.median('batched_locked'))}, "
            f"{r['batched_tokens_per_s']:,.0f} answer tok/s, {fmt_flops(fps)}{_peak_note(ctx, fps)})"
        )
        note = f"; one-at-a-time: {n_seq} rollouts timed, scaled per rollout"
        gated = K == max(s.rollout_K)
        for key, name, what, label, goal in (  # the two one-at-a-time baselines, each against the batched rollouts
            ("sequential_native", "sequential", "sequential (native, RNG restore)", "sequential replay", 8),
            ("recompute_batch1", "recompute", "batch-1 recompute (no KV cache)", "batch-1 recompute", 30),
        ):
            rows.append(
                Row(
                    ctx.section,
                    "1. rollouts",
                    "flops,rollouts",
                    conf,
                    base + f"; {what}: {fmt_s(per[key])}/rollout" + note,
                    f"{label} / batched, per rollout",
                    r[f"ratio_{name}"],
                    Goal(">=", goal) if gated else None,
                    _range(r[f"paired_ratio_{name}"]),
                )
            )
    return rows, raw


def _rollout_candidates(lm: LatentLM, records: list, s: Shapes, K: int) -> dict[str, Callable[[], float]]:
    """Item 1's three ways to make rollouts, each returning the mean answer length: K batched rollouts per prompt
    under locked masks, ``seq_per_prompt`` per prompt one at a time under native dropout, and batch-1 recompute."""
    seeds, seq_seeds = seeds_for(0, 0, 0, s.prompts * K), seeds_for(0, 0, 0, s.prompts * s.seq_per_prompt, "sequential")

    def rollouts(group_size: int, perturbation: Any, seeds: torch.Tensor) -> float:
        ro = collect_rollouts(
            lm,
            records,
            group_size=group_size,
            n_latent=s.T,
            perturbation=perturbation,
            seeds=seeds,
            max_new_tokens=s.max_new_tokens,
        )
        return float(ro.mask.sum(1).float().mean())

    def recompute() -> float:
        outs = [
            recompute_generate(lm, r.question, s.T, s.max_new_tokens) for r in records for _ in range(s.seq_per_prompt)
        ]
        return statistics.fmean(len(o) for o in outs)

    locked, native = LockedDropout(p=P_DROP), NativeDropout(p=P_DROP)
    return {
        "batched_locked": lambda: rollouts(K, locked, seeds),
        "sequential_native": lambda: rollouts(s.seq_per_prompt, native, seq_seeds),
        "recompute_batch1": recompute,
    }


def _rollout_figures(lm: LatentLM, records: list, s: Shapes, K: int, t: Timed) -> dict:
    """Item 1's figures for one K from the alternated timings ``t``: time per rollout, the ratios (the one-at-a-time
    baselines scaled to the batched rollout count), answer tokens and the batched path's FLOP/s."""
    N, n_seq = s.prompts * K, s.prompts * s.seq_per_prompt
    per = {
        "batched_locked": t.median("batched_locked") / N,
        "sequential_native": t.median("sequential_native") / n_seq,
        "recompute_batch1": t.median("recompute_batch1") / n_seq,
    }
    toks = {k: statistics.fmean(v) for k, v in t.results.items()}
    P = max(w for _, w in prompt_widths(lm, [r.question for r in records], len(records)))
    fl, _ = recurrence_flops(dims_of(lm), N, P, s.T, s.max_new_tokens, backward=False)
    return {
        "K": K,
        "N": N,
        "n_timed_one_at_a_time": n_seq,
        "per_rollout_s": per,
        "answer_tokens_per_rollout": toks,
        "batched_tokens_per_s": N * toks["batched_locked"] / t.median("batched_locked"),
        "batched_flops_per_s": fl / t.median("batched_locked"),
        "timing": t.to_json(),
        "ratio_sequential": per["sequential_native"] / per["batched_locked"],
        "ratio_recompute": per["recompute_batch1"] / per["batched_locked"],
        "paired_ratio_sequential": [x * N / n_seq for x in t.paired_ratios("sequential_native", "batched_locked")],
        "paired_ratio_recompute": [x * N / n_seq for x in t.paired_ratios("recompute_batch1", "batched_locked")],
    }


# --------------------------------------------------------------------------- 2. Coconut SFT step
def bench_sft(ctx: Ctx) -> tuple[list[Row], dict]:
    """One Coconut SFT forward + backward: ``sft_loss`` (KV-cached recurrence) vs the naive multi-pass forward."""
    s = ctx.shapes
    lm = build_lm(s, ctx.device, ctx.dtype, fixed_length=False).train()  # targets end in EOS: keep its logit
    cfg = Config()
    rng = random.Random(0)
    examples = [make_example(r, s.sft_stage, cfg, rng) for r in task_records(s.sft_batch)]
    norm = float(count_target_tokens(lm, examples, cfg))

    def run(loss_fn: Callable) -> Callable[[], float]:
        def f() -> float:
            lm.zero_grad(set_to_none=True)
            loss = loss_fn()
            loss.backward()
            return float(loss.detach())

        return f

    ours = run(lambda: sft_loss(lm, examples, cfg, norm)[0])
    naive = run(lambda: naive_coconut_loss(lm, examples, cfg, norm))
    ctx.log(f"[2] Coconut SFT step: batch {s.sft_batch}, {examples[0].n_latent} latents")
    t = alternate({"ours": ours, "naive": naive}, reps=s.reps, warmup=s.warmup, device=ctx.device, log=ctx.log)
    diff = max(abs(a - b) for a, b in zip(t.results["ours"], t.results["naive"]))
    tol = 1e-5 if ctx.dtype == torch.float32 else 5e-2
    if diff > tol:
        raise AssertionError(
            f"SFT losses differ by {diff:.3g} > {tol:g}: ours {t.results['ours'][0]}, naive {t.results['naive'][0]}"
        )
    ratio = t.ratio("ours", "naive")
    raw = {
        "batch": s.sft_batch,
        "n_latent": examples[0].n_latent,
        "target_tokens": norm,
        "loss": t.results["ours"][0],
        "max_abs_loss_diff": diff,
        "tolerance": tol,
        "timing": t.to_json(),
        "ratio": ratio,
        "paired_ratio": t.paired_ratios("ours", "naive"),
    }
    conf = (
        f"batch {s.sft_batch}, stage {s.sft_stage} ({examples[0].n_latent} latents + remaining steps), forward + "
        "backward; "
        f"same loss ({raw['loss']:.5f}, max |diff| {diff:.1e})"
    )
    vals = f"ours (sft_loss): {fmt_s(t.median('ours'))}; naive Coconut forward: {fmt_s(t.median('naive'))}"
    return [
        Row(
            ctx.section,
            "2. Coconut SFT step",
            "sft",
            conf,
            vals,
            "ours / naive",
            ratio,
            Goal("<=", 0.7),
            _range(raw["paired_ratio"]),
        )
    ], raw


# --------------------------------------------------------------------------- 3. GRPO step scaling
def _trainer(ctx: Ctx, K: int, T: int, kind: str, beta0: float | None = None) -> GRPOTrainer:
    s = ctx.shapes
    return GRPOTrainer(
        build_lm(s, ctx.device, ctx.dtype), grpo_config(s, K, T, kind, beta0=beta0), task_records(s.prompts)
    )


def _step_fn(tr: GRPOTrainer, prompts) -> Callable[[], dict]:
    return lambda: tr.step(prompts=prompts)


def _split(t, name: str) -> dict:
    ms = t.results[name]
    return {
        "rollout_s": statistics.median(m["time_rollout_s"] for m in ms),
        "update_s": statistics.median(m["time_update_s"] for m in ms),
    }


def bench_grpo_scaling(ctx: Ctx) -> tuple[list[Row], dict]:
    """Time of one ``GRPOTrainer.step()`` (locked dropout, filter off) as T and K grow."""
    s = ctx.shapes
    pairs = sorted({(s.grpo_K_at, T) for T in s.grpo_T} | {(K, s.grpo_T_at) for K in s.grpo_K})
    prompts = task_records(s.prompts)
    fns = {f"K={K},T={T}": _step_fn(_trainer(ctx, K, T, "locked"), prompts) for K, T in pairs}
    ctx.log(f"[3] GRPO step scaling: {', '.join(fns)}")
    t = alternate(fns, reps=s.reps, warmup=s.warmup, device=ctx.device, log=ctx.log)
    raw: dict[str, Any] = {
        "timing": t.to_json(),
        "split": {k: _split(t, k) for k in fns},
        "prompts": s.prompts,
        "max_new_tokens": s.max_new_tokens,
    }
    Ka, T0, T1, T2 = s.grpo_K_at, *s.grpo_T
    Ta, K0, K1, K2 = s.grpo_T_at, *s.grpo_K
    rows = []

    def row(a: str, b: str, what: str, goal: Goal | None) -> None:
        r = t.ratio(a, b)
        raw[f"{a} / {b}"] = r
        vals = "; ".join(
            f"{k}: {fmt_s(t.median(k))} (rollout {fmt_s(raw['split'][k]['rollout_s'])}, update "
            f"{fmt_s(raw['split'][k]['update_s'])})"
            for k in (a, b)
        )
        rows.append(
            Row(
                ctx.section,
                "3. GRPO step scaling",
                "grpo_scaling",
                f"{what}; {s.prompts} prompts, {s.max_new_tokens} answer tokens, locked dropout, filter off",
                vals,
                f"step({a}) / step({b})",
                r,
                goal,
                t.paired_spread(a, b),
            )
        )

    row(f"K={Ka},T={T1}", f"K={Ka},T={T0}", f"T {T0} -> {T1} at K={Ka}", None)
    row(f"K={Ka},T={T2}", f"K={Ka},T={T1}", f"T {T1} -> {T2} at K={Ka}", Goal("<=", 2.1))
    row(f"K={K1},T={Ta}", f"K={K0},T={Ta}", f"K {K0} -> {K1} at T={Ta}", None)
    row(f"K={K2},T={Ta}", f"K={K1},T={Ta}", f"K {K1} -> {K2} at T={Ta}", Goal("<=", 2.1))
    return rows, raw


# --------------------------------------------------------------------------- 4. cost of the perturbation
def bench_perturbation(ctx: Ctx) -> tuple[list[Row], dict]:
    """Dropout-GRPO step (locked masks, replayed at update) vs deterministic GRPO step, same shapes."""
    s = ctx.shapes
    K, T = s.grpo_K_at, s.grpo_T_at
    prompts = task_records(s.prompts)
    fns = {
        "locked": _step_fn(_trainer(ctx, K, T, "locked"), prompts),
        "none": _step_fn(_trainer(ctx, K, T, "none"), prompts),
    }
    ctx.log(f"[4] perturbation cost: locked vs none at K={K}, T={T}")
    t = alternate(fns, reps=s.reps, warmup=s.warmup, device=ctx.device, log=ctx.log)
    split = {k: _split(t, k) for k in fns}
    raw = {
        "K": K,
        "T": T,
        "timing": t.to_json(),
        "split": split,
        "ratio": t.ratio("locked", "none"),
        "paired_ratio": t.paired_ratios("locked", "none"),
        "ratio_rollout": split["locked"]["rollout_s"] / split["none"]["rollout_s"],
        "ratio_update": split["locked"]["update_s"] / split["none"]["update_s"],
    }
    vals = (
        f"Dropout-GRPO: {fmt_s(t.median('locked'))} (rollout {fmt_s(split['locked']['rollout_s'])}, update "
        f"{fmt_s(split['locked']['update_s'])}); "
        f"deterministic: {fmt_s(t.median('none'))} (rollout {fmt_s(split['none']['rollout_s'])}, update "
        f"{fmt_s(split['none']['update_s'])}); "
        f"rollout ratio {raw['ratio_rollout']:.3f}, update ratio {raw['ratio_update']:.3f}"
    )
    conf = f"K={K}, T={T}, {s.prompts} prompts, filter off; perturbation.kind locked (p={P_DROP}, mlp sites) vs none"
    step_row = Row(
        ctx.section,
        "4. cost of the perturbation",
        "perturbation",
        conf,
        vals,
        "locked / none",
        raw["ratio"],
        Goal("<=", 1.10),
        _range(raw["paired_ratio"]),
    )
    draw_row, raw["mask_draw"] = _bench_mask_draw(ctx)
    return [step_row, draw_row], raw


def _bench_mask_draw(ctx: Ctx) -> tuple[Row, dict]:
    """The host's part of a locked bind: every row's keep-mask from its own generator, on one thread vs split over
    torch's thread budget (dgrpo.perturbation.locked.draw_keep_rows); the same masks either way."""
    rows, sites, width = ctx.shapes.mask_draw
    seeds = seeds_for(0, 0, 0, rows).tolist()
    threads = draw_threads(rows)
    fns = {  # (results dropped: a run of the suite would keep every repetition's masks)
        "serial": lambda: draw_keep_rows(seeds, sites, width, P_DROP, threads=1) and None,
        "split": lambda: draw_keep_rows(seeds, sites, width, P_DROP, threads=threads) and None,
    }
    ctx.log(f"[4] locked-mask draw: {rows} rows x {sites} x {width}, 1 vs {threads} host threads")
    t = alternate(fns, reps=ctx.shapes.reps, warmup=ctx.shapes.warmup, log=ctx.log)
    ratio, paired = t.ratio("serial", "split"), t.paired_ratios("serial", "split")
    raw = {
        "shape": [rows, sites, width],
        "threads": threads,
        "timing": t.to_json(),
        "ratio": ratio,
        "paired_ratio": paired,
    }
    conf = f"{rows} rows x {sites} sites x {width} units (a paper step's first bind), p={P_DROP}; bit-identical masks"
    vals = f"serial (1 thread): {fmt_s(t.median('serial'))}; split ({threads} threads): {fmt_s(t.median('split'))}"
    return Row(
        ctx.section,
        "4. cost of the perturbation",
        "perturbation",
        conf,
        vals,
        "serial / split mask draw",
        ratio,
        None,
        _range(paired),
    ), raw


# --------------------------------------------------------------------------- 5. memory
def _run_probe(ctx: Ctx, K: int, T: int, kind: str) -> dict:
    return run_probe(ctx, ctx.shapes, K, T, kind)


def bench_memory(ctx: Ctx) -> tuple[list[Row], dict]:
    """Peak memory of a GRPO step (fresh process each), and the bytes kept per rollout for replay."""
    s = ctx.shapes
    K, T = s.grpo_K_at, s.grpo_T_at
    K2 = max(s.grpo_K)
    runs = {"locked": (K, T, "locked"), "none": (K, T, "none"), f"locked,K={K2}": (K2, T, "locked")}
    if s.name == "quick":  # (a smoke test: the larger K is the same code path, one fresh process more)
        del runs[f"locked,K={K2}"]
    probes = _probe_alternately(ctx, runs)
    delta = {k: statistics.median(p["delta_bytes"] for p in v) for k, v in probes.items()}
    peak = {k: statistics.median(p["peak_bytes"] for p in v) for k, v in probes.items()}
    what = "peak allocated (CUDA)" if ctx.device.type == "cuda" else "peak RSS"
    raw = {
        "measure": probes["locked"][0]["kind"],
        "clean_peak": all(p["clean_peak"] for v in probes.values() for p in v),
        "delta_bytes": delta,
        "peak_bytes": peak,
        "probes": probes,
    }
    step_row = Row(
        ctx.section,
        "5. memory",
        "memory",
        f"one GRPO step after a warm-up step, K={K}, T={T}, {s.prompts} prompts, fresh process each; "
        f"{what} during the step minus the level just before it",
        "; ".join(f"{k}: +{fmt_bytes(delta[k])} (peak {fmt_bytes(peak[k])})" for k in runs),
        "locked / none (step increment)",
        delta["locked"] / delta["none"] if delta["none"] > 0 else None,  # (no ratio of a step that added nothing)
        None,
    )
    replay_row, raw["replay_bytes_per_rollout"] = _replay_bytes_row(ctx, K, T)
    return [step_row, replay_row], raw


def _probe_alternately(ctx: Ctx, runs: dict[str, tuple[int, int, str]]) -> dict[str, list[dict]]:
    """Item 5's probes: ``mem_reps`` rounds of one fresh-process probe per run (name: (K, T, kind)), alternating."""
    s = ctx.shapes
    probes: dict[str, list[dict]] = {k: [] for k in runs}
    ctx.log(f"[5] memory: {', '.join(runs)} ({s.mem_reps} fresh process(es) each, alternating)")
    for r in range(s.mem_reps):
        for name, (k, t_, kind) in runs.items():
            probes[name].append(_run_probe(ctx, k, t_, kind))
        ctx.log(
            f"  rep {r + 1}/{s.mem_reps}: "
            + ", ".join(f"{n} +{fmt_bytes(p[-1]['delta_bytes'])}" for n, p in probes.items())
        )
    return probes


def _replay_bytes_row(ctx: Ctx, K: int, T: int) -> tuple[Row, dict]:
    """Item 5's replay row: the bytes kept per rollout to replay its perturbation, the seed vs the masks themselves."""
    s = ctx.shapes
    cfg = grpo_config(s, K, T, "locked")
    n_sites = len(cfg.perturbation.sites) * len(select_layers(cfg.perturbation.layers, s.layers))
    seed_bytes = seeds_for(0, 0, 0, 1).element_size()
    mask_bytes = n_sites * s.hidden * 4  # float32 masks, as LockedDropout builds them
    P = max(w for _, w in prompt_widths(tokenizing_lm(), [r.question for r in task_records(s.prompts)], s.prompts))
    S = P + T + s.max_new_tokens
    native_bytes = s.layers * s.heads * S * (S + 1) // 2  # attention-dropout masks of every forward, 1 byte per entry
    big = GPU.layers * GPU.hidden * 4  # one site per layer at Qwen2-0.5B width (the paper's attention sites)
    raw = {
        "seed": seed_bytes,
        "locked_masks_fp32": mask_bytes,
        "sites": n_sites,
        "width": s.hidden,
        "native_attention_masks_bool": native_bytes,
        "sequence_positions": S,
        "locked_masks_fp32_qwen2_0.5b_one_site_per_layer": big,
    }
    row = Row(
        ctx.section,
        "5. memory",
        "memory",
        f"replay state per rollout: {n_sites} sites ({','.join(cfg.perturbation.sites)}) x hidden {s.hidden}",
        f"seed (int64): {seed_bytes} B; locked masks (fp32): {fmt_bytes(mask_bytes)}; native attention masks "
        f"(bool, {s.layers} layers x {s.heads} heads, {S} positions): {fmt_bytes(native_bytes)}"
        f"; at Qwen2-0.5B width ({GPU.layers} layers x {GPU.hidden}, one site per layer): {fmt_bytes(big)} vs 8 B",
        "locked masks / seed",
        mask_bytes / seed_bytes,
        None,
    )
    return row, raw


# --------------------------------------------------------------------------- 6. distance to the machine's limit
def _mm_fn(
    m: int, k: int, n: int, device: torch.device, dtype: torch.dtype, target_s: float = 0.05
) -> tuple[Callable[[], int], int]:
    """A callable doing ``iters`` (m x k) @ (k x n) products, ``iters`` chosen so one call takes ~target_s."""
    import time

    a, b = torch.randn(m, k, device=device, dtype=dtype), torch.randn(k, n, device=device, dtype=dtype)
    c = torch.empty(m, n, device=device, dtype=dtype)
    for _ in range(3):
        torch.mm(a, b, out=c)
    sync(device)
    t0 = time.perf_counter()
    for _ in range(5):
        torch.mm(a, b, out=c)
    sync(device)
    iters = max(1, math.ceil(target_s / ((time.perf_counter() - t0) / 5)))

    def f() -> int:
        for _ in range(iters):
            torch.mm(a, b, out=c)
        return iters

    return f, iters


MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")


def op_time_breakdown(fn: Callable[[], object], device: torch.device) -> dict:
    """Profile one call: shares of op time in matmuls, attention and everything else (norms, activations,
    rotary, masks, copies, optimizer), the five costliest ops, and the op time as a fraction of wall time."""
    import time

    from torch.profiler import ProfilerActivity

    from .step_profile import quiet_profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    attr = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    with quiet_profile(acts) as prof:
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        wall = time.perf_counter() - t0
    events = [e for e in prof.key_averages() if e.key.startswith("aten::")]
    total = sum(getattr(e, attr) for e in events) or 1.0
    share = {"matmul": 0.0, "attention": 0.0, "other": 0.0}
    for e in events:
        cat = (
            "matmul" if e.key in MATMUL_OPS else "attention" if ("attention" in e.key or "flash" in e.key) else "other"
        )
        share[cat] += getattr(e, attr) / total
    top = sorted(events, key=lambda e: -getattr(e, attr))[:5]
    return {
        "share": share,
        "top_ops": [(e.key, getattr(e, attr) / total, e.count) for e in top],
        "op_time_over_wall": total / 1e6 / wall,
        "wall_s": wall,
    }


def bench_flops(ctx: Ctx) -> tuple[list[Row], dict]:
    """Achieved FLOP/s of the GRPO update vs this machine's dense matmul FLOP/s, measured alternately."""
    s = ctx.shapes
    K, T, L = s.grpo_K_at, s.grpo_T_at, s.max_new_tokens
    tr = _trainer(ctx, K, T, "locked", beta0=0.0)  # no reference model: the update is policy forward + backward only
    prompts = task_records(s.prompts)
    d = dims_of(tr.lm)
    chunks, flops, positions = _update_flops(tr, d, prompts, K, T, L)
    mb_rows, mb_P = chunks[0]
    # the update's own largest matmul shape (prompt pass, MLP)
    sizes = list(s.mm_sizes) + [(mb_rows * mb_P, s.hidden, s.ffn)]
    mm_fns, flop_of = _matmul_candidates(ctx, sizes)
    fns: dict[str, Callable] = {"grpo_step": _step_fn(tr, prompts), **mm_fns}
    ctx.log(f"[6] FLOP/s: GRPO update ({flops / 1e9:.1f} GFLOP) vs {', '.join(n for n in fns if n != 'grpo_step')}")
    t = alternate(fns, reps=s.reps, warmup=s.warmup, device=ctx.device, log=ctx.log)
    upd = statistics.median(m["time_update_s"] for m in t.results["grpo_step"])
    achieved = flops / upd
    rates = {n: flop_of[n] * t.results[n][0] / t.median(n) for n in flop_of}
    peak_name = max(rates, key=lambda n: rates[n])
    peak = rates[peak_name]
    ctx.results["peak_flops"] = peak
    prof = op_time_breakdown(fns["grpo_step"], ctx.device)  # one more step, profiled (not timed)
    raw = {
        "formula": FLOP_FORMULA,
        "dims": d.__dict__,
        "chunks_rows_promptwidth": chunks,
        "update_flops": flops,
        "update_positions": positions,
        "update_time_s": upd,
        "achieved_flops_per_s": achieved,
        "update_tokens_per_s": positions / upd,
        "mm_flops_per_s": rates,
        "peak_name": peak_name,
        "fraction_of_peak": achieved / peak,
        "timing": t.to_json(),
        "profile_one_step": prof,
    }
    return [_flops_row(ctx, raw, d, K, T)], raw


def _update_flops(
    tr: GRPOTrainer, d: Dims, prompts: list, K: int, T: int, L: int
) -> tuple[list[tuple[int, int]], float, float]:
    """Item 6's count for one GRPO update: its micro-batches' (rows, prompt width), its FLOPs and its positions."""
    chunks = prompt_widths(tr.lm, [r.question for r in prompts for _ in range(K)], tr.cfg.grpo.micro_batch_size)
    flops = positions = 0.0
    for rows_c, P in chunks:
        f_, p_ = recurrence_flops(d, rows_c, P, T, L, backward=True)
        flops, positions = flops + f_, positions + p_
    return chunks, flops, positions


def _matmul_candidates(
    ctx: Ctx, sizes: list[tuple[int, int, int]]
) -> tuple[dict[str, Callable[[], int]], dict[str, float]]:
    """Item 6's dense matmuls, one (m, k, n) each: their callables and the FLOPs of one product, by name."""
    fns: dict[str, Callable[[], int]] = {}
    flop_of: dict[str, float] = {}
    for m, k, n in sizes:
        f, _ = _mm_fn(m, k, n, ctx.device, ctx.dtype)
        name = f"mm {m}x{k}@{k}x{n}"
        fns[name] = f
        flop_of[name] = 2.0 * m * k * n
    return fns, flop_of


def _flops_row(ctx: Ctx, raw: dict, d: Dims, K: int, T: int) -> Row:
    """Item 6's row from its figures ``raw``: the update's FLOP/s over the best matmul's, and one step's op shares."""
    s = ctx.shapes
    flops, upd, positions = raw["update_flops"], raw["update_time_s"], raw["update_positions"]
    achieved, prof = raw["achieved_flops_per_s"], raw["profile_one_step"]
    conf = (
        f"GRPO update (policy forward+backward through the recurrence, optimizer step; beta0=0), K={K}, T={T}, "
        f"{s.prompts} prompts, "
        f"{s.max_new_tokens} answer tokens; N={d.params_nonembedding:,} non-embedding params; {flops / 1e9:.1f} GFLOP "
        "by the formula in the notes"
    )
    vals = (
        f"update {fmt_s(upd)} -> {fmt_flops(achieved)} ({positions / upd:,.0f} positions/s); "
        + "; ".join(f"{n}: {fmt_flops(r)}" for n, r in raw["mm_flops_per_s"].items())
        + f"; profile of one step (rollout + update), share of op time: matmul {100 * prof['share']['matmul']:.0f}%, "
        "attention "
        f"{100 * prof['share']['attention']:.0f}%, other ops (norms, activations, rotary, masks, copies, optimizer) "
        f"{100 * prof['share']['other']:.0f}%; ops cover {100 * prof['op_time_over_wall']:.0f}% of that step's wall "
        "time"
    )
    return Row(
        ctx.section,
        "6. distance to the machine's limit",
        "flops",
        conf,
        vals,
        f"achieved / best matmul ({raw['peak_name']})",
        raw["fraction_of_peak"],
        None,
    )


ITEMS: dict[str, Callable[[Ctx], tuple[list[Row], dict]]] = {
    "rollouts": bench_rollouts,
    "sft": bench_sft,
    "grpo_scaling": bench_grpo_scaling,
    "perturbation": bench_perturbation,
    "memory": bench_memory,
    "flops": bench_flops,
    "optimizer": bench_optimizer,
    "soak": bench_soak,
    "lora": bench_lora,
    "recompute": bench_recompute,
    "parallel": bench_parallel,
    "engine": bench_engine,
}
