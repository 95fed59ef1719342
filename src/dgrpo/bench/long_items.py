"""Two more benchmark items: the 8-bit optimizer (CUDA only) and the bounded memory soak.

``optimizer``: one GRPO step with torch AdamW vs bitsandbytes AdamW8bit on the same model: step time,
optimizer-state bytes, step peak memory. Needs CUDA and bitsandbytes (skipped, with the reason, otherwise).

``soak``: a real ``dgrpo grpo`` run (the CLI, in a child process: periodic eval, metrics, resumable
checkpoints every 50 steps, KL reference) for ``soak_steps`` steps; the parent reads the child's resident
set size (VmRSS) each time the metrics file passes a multiple of 10 steps and fits a line. A leak
shows as a positive slope; the goal is flat.
"""

from __future__ import annotations

import functools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..run_layout import METRICS_FILE
from ..training.grpo import GRPOTrainer
from .memprobe import status_kb
from .report import Goal, Row, fmt_bytes, fmt_s
from .timing import alternate
from .workload import Ctx, build_lm, grpo_config, optimizer_state_bytes, task_records

SOAK_STEPS = 300
SOAK_EVERY = 10
SOAK_SKIP = 20  # samples before this step are warm-up (allocator pools, first checkpoint) and not fitted
#: --quick's soak: samples at 0, 10, 20 and 30, the line fitted through the last two (a smoke test: its slope no claim)
QUICK_SOAK_STEPS = 30


def bench_optimizer(ctx: Ctx) -> tuple[list[Row], dict]:
    """GRPO step with AdamW vs AdamW8bit (bitsandbytes), same model, shapes and prompts."""
    if ctx.device.type != "cuda":
        return [], {"skipped": "the 8-bit optimizer runs on CUDA only"}
    try:
        import bitsandbytes  # noqa: F401  # type: ignore[import-not-found]
    except ImportError:
        return [], {"skipped": "bitsandbytes is not installed"}

    s = ctx.shapes
    K, T = s.grpo_K_at, s.grpo_T_at
    prompts = task_records(s.prompts)
    trainers = _optimizer_trainers(ctx, K, T, prompts)
    kinds = {n: f"{type(tr.opt).__module__}.{type(tr.opt).__name__}" for n, tr in trainers.items()}
    fns: dict[str, Callable[[], Any]] = {n: functools.partial(tr.step, prompts=prompts) for n, tr in trainers.items()}
    ctx.log(f"[7] optimizer: {', '.join(f'{n} ({k})' for n, k in kinds.items())} at K={K}, T={T}")
    t = alternate(fns, reps=s.reps, warmup=s.warmup, device=ctx.device, log=ctx.log)
    state = {n: optimizer_state_bytes(tr.opt) for n, tr in trainers.items()}
    peaks = _step_peaks(fns)
    n_params = sum(p.numel() for p in trainers["adamw"].lm.model.parameters() if p.requires_grad)
    raw = {"classes": kinds, "timing": t.to_json(), "state_bytes": state, "peaks": peaks, "params": n_params}
    vals = "; ".join(
        f"{n}: step {fmt_s(t.median(n))}, optimizer state {fmt_bytes(state[n])}, resident before step "
        f"{fmt_bytes(peaks[n]['before'])}, step peak {fmt_bytes(peaks[n]['peak'])}"
        for n in fns
    )
    conf = (
        f"{n_params / 1e6:.0f}M trainable params ({ctx.dtype}), K={K}, T={T}, {s.prompts} prompts, "
        "locked dropout, filter off"
    )
    return [
        Row(
            ctx.section,
            "7. 8-bit optimizer",
            "optimizer",
            conf,
            vals,
            "state bytes adamw8bit / adamw",
            state["adamw8bit"] / state["adamw"],
            Goal("<=", 0.6),
        ),
        Row(
            ctx.section,
            "7. 8-bit optimizer",
            "optimizer",
            conf,
            f"adamw {fmt_s(t.median('adamw'))}, adamw8bit {fmt_s(t.median('adamw8bit'))}",
            "step time adamw8bit / adamw",
            t.ratio("adamw8bit", "adamw"),
            None,
        ),
    ], raw


def _optimizer_trainers(ctx: Ctx, K: int, T: int, prompts: list) -> dict[str, GRPOTrainer]:
    """Item 7's two arms: a GRPO trainer per optimizer (adamw, adamw8bit), each on its own copy of the same model."""
    trainers = {}
    for name in ("adamw", "adamw8bit"):
        cfg = grpo_config(ctx.shapes, K, T, "locked")
        cfg.grpo.optimizer = name
        trainers[name] = GRPOTrainer(build_lm(ctx.shapes, ctx.device, ctx.dtype), cfg, prompts)
    return trainers


def _step_peaks(fns: dict[str, Callable[[], Any]]) -> dict[str, dict[str, int]]:
    """One more step of each arm: CUDA memory allocated just before it and the peak allocated during it."""
    peaks = {}
    for n, f in fns.items():
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        f()
        torch.cuda.synchronize()
        peaks[n] = {"before": before, "peak": torch.cuda.max_memory_allocated()}
    return peaks


def _rss_bytes(pid: int) -> int | None:
    """The resident set size of a running process; None once it has exited."""
    try:
        return status_kb("VmRSS", pid) * 1024
    except (OSError, KeyError):
        return None


def fit_slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys over xs."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else 0.0


def bench_soak(ctx: Ctx, steps: int = SOAK_STEPS) -> tuple[list[Row], dict]:
    """``dgrpo grpo`` for ``steps`` steps in a child process; VmRSS every 10 steps; the fitted slope."""
    if ctx.device.type != "cpu":
        return [], {"skipped": "the soak runs in the CPU section"}
    if not Path("/proc/self/status").exists():
        return [], {"skipped": "needs /proc (Linux) to read the child's resident set size"}
    s = ctx.shapes
    steps = min(steps, QUICK_SOAK_STEPS) if s.name == "quick" else steps
    with tempfile.TemporaryDirectory(prefix="dgrpo-soak-") as tmp:
        init = Path(tmp) / "init"
        build_lm(s, torch.device("cpu"), torch.float32, fixed_length=False).save_pretrained(init)
        out = Path(tmp) / "run"
        cmd = _soak_command(init, out, steps, ctx.threads)
        ctx.log(
            f"[8] soak: dgrpo grpo for {steps} steps (16 prompts x K=8, T=2, eval and checkpoint every 50), VmRSS "
            f"every {SOAK_EVERY} steps"
        )
        t0 = time.perf_counter()
        log_file = Path(tmp) / "stderr.txt"  # (not a pipe: read only after the child ends, a full one would block it)
        with log_file.open("w") as err_out:
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err_out, text=True, env=os.environ.copy())
            samples = _sample_rss(proc, out / METRICS_FILE, ctx.log)
        err = log_file.read_text(errors="replace")
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise RuntimeError(f"soak run failed (exit {proc.returncode}):\n{err[-3000:]}")
    raw, vals, ratio = summarize_soak(samples, steps, wall)
    conf = (
        f"dgrpo grpo (CLI, child process), {steps} steps, 16 prompts x K=8, T=2, random-weight Qwen2 "
        f"{s.hidden}x{s.layers}, "
        f"filter off, KL reference on, eval + resumable checkpoint every 50 steps; line fitted from step {SOAK_SKIP}"
    )
    return [
        Row(
            ctx.section,
            "8. memory soak",
            "soak",
            conf,
            vals,
            "fitted RSS, last / first fitted step",
            ratio,
            Goal("<=", 1.02),
        )
    ], raw


def _soak_command(init: Path, out: Path, steps: int, threads: int) -> list[str]:
    """Item 8's child: ``dgrpo grpo`` from ``init`` into ``out`` for ``steps`` steps, at the soak's fixed settings."""
    over = {
        "grpo.steps": steps,
        "grpo.prompts_per_step": 16,
        "grpo.group_size": 8,
        "grpo.n_latent": 2,
        "grpo.max_new_tokens": 16,
        "grpo.filter": "false",
        "grpo.eval_every": 50,
        "grpo.save_every": 50,
        "grpo.log_every": 1,
        "grpo.warmup_steps": 10,
        "grpo.lr": 1e-5,
        "task.n_train": 2048,
        "task.n_valid": 64,
        "data.eval_limit": 64,
        "data.test": "[]",
        "threads": threads,
    }
    cmd = [sys.executable, "-m", "dgrpo", "grpo", "--init", str(init), "--out", str(out)]
    for k, v in over.items():
        cmd += ["--set", f"{k}={v}"]
    return cmd


def _sample_rss(proc: subprocess.Popen, metrics: Path, log: Callable[[str], None]) -> list[tuple[int, int]]:
    """(steps done, RSS) of the running child each time its metrics file passes a multiple of SOAK_EVERY steps."""
    samples: list[tuple[int, int]] = []
    next_step = 0
    while proc.poll() is None:
        time.sleep(0.05)
        if not metrics.exists():
            continue
        done = metrics.read_text().count('"reward_mean"')  # one row per finished step (log_every = 1)
        if done >= next_step:
            rss = _rss_bytes(proc.pid)
            if rss is not None:
                samples.append((done, rss))
                if next_step % 50 == 0:
                    log(f"  step {done}: RSS {fmt_bytes(rss)}")
            next_step = (done // SOAK_EVERY + 1) * SOAK_EVERY
    return samples


def summarize_soak(samples: list[tuple[int, int]], steps: int, wall: float) -> tuple[dict, str, float]:
    """The least-squares line through the (step, RSS) samples from SOAK_SKIP on: slope, and the growth it implies
    over the fitted range as a ratio (single samples move by tens of MiB with the allocator; the line does not)."""
    fit = [(st, b) for st, b in samples if st >= SOAK_SKIP] or samples
    xs, ys = [float(st) for st, _ in fit], [b / 2**20 for _, b in fit]
    slope = fit_slope(xs, ys)  # MiB per step
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    at = lambda x: my + slope * (x - mx)  # noqa: E731
    ratio = at(xs[-1]) / at(xs[0])
    raw = {
        "steps": steps,
        "samples": samples,
        "fitted_from_step": SOAK_SKIP,
        "slope_mib_per_100_steps": 100 * slope,
        "fitted_first_mib": at(xs[0]),
        "fitted_last_mib": at(xs[-1]),
        "rss_first": fit[0],
        "rss_last": fit[-1],
        "rss_min_fitted": min(b for _, b in fit),
        "rss_max": max(b for _, b in samples),
        "wall_s": wall,
    }
    vals = (
        f"{len(samples)} samples; RSS at step 0: {fmt_bytes(samples[0][1])}; from step {fit[0][0]} to {fit[-1][0]}: "
        "between "
        f"{fmt_bytes(raw['rss_min_fitted'])} and {fmt_bytes(max(b for _, b in fit))}, last {fmt_bytes(fit[-1][1])}; "
        "fitted slope "
        f"{100 * slope:+.2f} MiB per 100 steps ({at(xs[0]):.0f} -> {at(xs[-1]):.0f} MiB on the line); run {fmt_s(wall)}"
    )
    return raw, vals, ratio
