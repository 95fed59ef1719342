"""Benchmark item 11: how to spend the CPUs on the demo's work: threads in one process, or processes side by side.

The work is the demo's Coconut SFT step (``builtin/demo.yaml``: the built-in tiny model, 32 problems, stage 2),
run in fresh processes (``python -m dgrpo.bench.parallel_item SPEC_JSON``): one process with one torch thread, one
process with every CPU as threads, one single-thread process per CPU at the same time, and the threaded process
again with ``OMP_WAIT_POLICY=PASSIVE``. Every process warms up, waits until all of its arm are ready, then times
its steps; an arm's throughput is the sum of its processes' steps per second. The arms alternate over the
repetitions. The suite runs under ``OMP_WAIT_POLICY=PASSIVE``; the other arms run under OpenMP's default policy,
the one ``dgrpo demo`` meets on a user's machine. This is what :func:`dgrpo.demo.pipeline.task_threads` and
``default_workers`` decide from.
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from ..training.distributed import available_cpus
from .report import Row
from .workload import Ctx


def probe(spec: dict) -> dict:
    """Warm up, print ``ready``, wait for a line on stdin, then time ``steps`` SFT steps; the result as a dict."""
    import random

    import torch

    from ..config import Config, load_config
    from ..data.synthetic import generate_split
    from ..model.factory import load_model
    from ..training.curriculum import make_example
    from ..training.distributed import Dist
    from ..training.sft import new_optimizer, sft_step

    torch.set_num_threads(int(spec["threads"]))
    cfg = load_config(Config, "builtin/demo.yaml")
    lm = load_model(cfg.model, cfg.task, seed=int(spec["seed"]))
    lm.train()
    params = [p for p in lm.parameters() if p.requires_grad]
    opt = new_optimizer(params, cfg)
    warmup, b = int(spec["warmup"]), cfg.sft.batch_size
    n = warmup + int(spec["steps"])
    train, rng = generate_split(cfg.task, "train")[: n * b], random.Random(0)
    batches = [[make_example(r, 2, cfg, rng) for r in train[i * b : (i + 1) * b]] for i in range(n)]
    dist = Dist.single()
    for batch in batches[:warmup]:
        sft_step(lm, opt, params, batch, cfg, dist, cfg.sft.lr)
    print("ready", flush=True)
    sys.stdin.readline()
    t0 = time.perf_counter()
    for batch in batches[warmup:]:
        sft_step(lm, opt, params, batch, cfg, dist, cfg.sft.lr)
    seconds = time.perf_counter() - t0
    return {"steps": int(spec["steps"]), "seconds": seconds, "threads": torch.get_num_threads()}


def run_arm(procs: int, threads: int, omp: str | None, steps: int, warmup: int) -> list[dict]:
    """``procs`` probe processes with ``threads`` each, started together; ``omp`` the OpenMP wait policy (None:
    the runtime's default). Their results."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if omp:
        env["OMP_WAIT_POLICY"] = omp
    with tempfile.TemporaryFile("w+") as err:
        ps = [
            subprocess.Popen(
                [sys.executable, "-m", "dgrpo.bench.parallel_item", json.dumps(spec)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                env=env,
            )
            for spec in ({"threads": threads, "seed": i, "steps": steps, "warmup": warmup} for i in range(procs))
        ]
        try:
            for p in ps:
                assert p.stdout is not None and p.stdin is not None
                if p.stdout.readline().strip() != "ready":
                    raise RuntimeError("parallel probe failed")
            for p in ps:
                assert p.stdin is not None
                p.stdin.write("go\n")
                p.stdin.flush()
            outs = [p.communicate(timeout=3600)[0] for p in ps]
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            for p in ps:
                p.kill()
            err.seek(0)
            what = f"{procs} x {threads} threads, OMP {omp or 'default'}"
            raise RuntimeError(f"{e} ({what}):\n{err.read()[-3000:]}") from e
        if any(p.returncode for p in ps):
            err.seek(0)
            raise RuntimeError(f"parallel probe exited with {[p.returncode for p in ps]}:\n{err.read()[-3000:]}")
    return [json.loads(o.strip().splitlines()[-1]) for o in outs]


def throughput(results: list[dict]) -> float:
    """SFT steps per second of an arm: the sum over its processes."""
    return sum(r["steps"] / r["seconds"] for r in results)


def bench_parallel(ctx: Ctx) -> tuple[list[Row], dict]:
    cpus = available_cpus()
    quick = ctx.shapes.name == "quick"
    steps, warmup, reps = (2, 1, 1) if quick else (40, 3, 3)  # (quick: a smoke test, its rates no claim)
    arms = {  # name -> (processes, threads each, OpenMP wait policy)
        "1 x 1 thread": (1, 1, None),
        f"1 x {cpus} threads": (1, cpus, None),
        f"{cpus} x 1 thread": (cpus, 1, None),
        f"1 x {cpus} threads, PASSIVE": (1, cpus, "PASSIVE"),
    }
    if quick:  # (a smoke test of one process and of several side by side: 1 + cpus processes, not 3 + cpus)
        arms = {a: arms[a] for a in ("1 x 1 thread", f"{cpus} x 1 thread")}
    rates: dict[str, list[float]] = {a: [] for a in arms}
    for rep in range(reps):
        for name, (procs, threads, omp) in arms.items():
            rates[name].append(throughput(run_arm(procs, threads, omp, steps, warmup)))
        ctx.log(f"  rep {rep + 1}/{reps}: " + ", ".join(f"{a} {r[-1]:.2f} steps/s" for a, r in rates.items()))
    base = "1 x 1 thread"
    med = {a: statistics.median(r) for a, r in rates.items()}
    conf = (
        f"the demo's Coconut SFT step (builtin/demo.yaml: built-in Qwen2 128 x 4 layers, 32 problems, stage 2), "
        f"{steps} steps timed per process after {warmup} warm-up, fresh processes, {cpus} CPUs; arms alternate, "
        f"median of {reps}; processes x torch threads, OpenMP's default wait policy unless PASSIVE is named"
    )
    vals = "; ".join(f"{a}: {m:.2f} steps/s" for a, m in med.items())
    row = functools.partial(Row, ctx.section, "11. CPU parallelism of the demo's work", "parallel", conf, vals)
    rows = [
        row(
            f"SFT steps/s, {a} / 1 x 1 thread",
            med[a] / med[base],
            None,
            (min(x / y for x, y in zip(rates[a], rates[base])), max(x / y for x, y in zip(rates[a], rates[base]))),
        )
        for a in arms
        if a != base
    ]
    raw: dict[str, Any] = {"cpus": cpus, "steps": steps, "warmup": warmup, "steps_per_s": rates, "median": med}
    return rows, raw


def main() -> int:
    print(json.dumps(probe(json.loads(sys.argv[1]))), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
