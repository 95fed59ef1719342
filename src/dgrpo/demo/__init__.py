"""``dgrpo demo``: the paper's claims measured at CPU scale on the built-in task, with the paper's protocol.

1. **Several SFT checkpoints.** Coconut curriculum SFT once per SFT seed (``--sft-seeds``): the SFT seed moves
   the accuracy by several points, so one checkpoint cannot carry a comparison.
2. **Every arm from each SFT checkpoint** (``ARMS``: each arm is its packaged file merged over the demo's base
   config, ``builtin/demo.yaml``), for ``--seeds`` RL seeds per SFT seed. The deterministic arm runs once per SFT
   checkpoint: it cannot update, whatever the seed.
3. **Test, read once per model**, greedily and without dropout, on the same items for every model: the SFT
   checkpoint, each run's final checkpoint, and its best post-warmup validation checkpoint (``best/``, what the
   paper reports).
4. **Paired statistics.** A comparison "A vs B" pairs each (SFT seed, RL seed) run of A with the run of B from the
   same SFT checkpoint and RL seed (or with that SFT checkpoint itself), takes the accuracy difference on the same
   items, and reports the mean with a 95% t-interval over the SFT checkpoints (each one's pairs averaged first:
   pairs that share a checkpoint are not independent), with the items gained and lost. Each of the paper's claims
   (``CLAIMS``) is then resolved, not resolved or contradicted at 95%.
5. results.json, results.md, summary.txt, and two figures drawn by :mod:`dgrpo.plotting`.

The work is independent tasks (one SFT run per seed; one RL run per arm, SFT seed and RL seed, once its SFT
checkpoint exists): ``--workers N`` runs them in a pool of N processes (default one per CPU, 1 on a GPU). Each task
leaves a record of its results; the same command run again reads back the tasks whose records match and runs the
others (``--resume auto``, the default; ``never`` runs them all).
Modules: :mod:`.pipeline` (running), :mod:`.task_records` (the tasks' records), :mod:`.stats` (the statistics),
:mod:`.report` (analysis, files, figures).

``--quick`` runs the same pipeline on the tiny config (``tiny.yaml``, ``builtin/demo_quick.yaml`` over it): a smoke test
whose numbers mean nothing.
The statistics are small pure functions in :mod:`.stats` (:func:`t_quantile`, :func:`mean_ci`, :func:`flips`,
:func:`compare`, :func:`verdict`, :func:`claim_verdicts`) so that they can be checked by hand.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import torch

from ..config import Config
from ..data.synthetic import generate_split
from ..training.out_dir import RunLock
from .pipeline import (
    ARMS,
    SHORT,
    Demo,
    WorkerDied,
    default_workers,
    demo_config,
    demo_splits,
    merge_seed,
    quiet_transformers,
    run_pipeline,
    valid_split,
)
from .report import command_line, results_markdown, summary_paragraph, write_results
from .stats import CI, CLAIMS, Claim, claim_verdicts, compare, exact_verdict, flips, mean_ci, t_quantile, verdict


def run_demo(args: Any) -> int:
    """``dgrpo demo``: SFT per seed, every arm from each, test once per model, statistics, files, figures."""
    t_start = time.time()
    base, n_sft, n_rl = demo_config(args)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    lock = RunLock(Path(args.out))  # one demo per --out: a second one would start its runs over under this one's
    try:
        return _run(args, base, n_sft, n_rl, t_start)
    except WorkerDied as e:  # (concurrent.futures' BrokenProcessPool, a traceback: one line instead)
        print(f"dgrpo: error: {e}", file=sys.stderr)
        return 1
    finally:
        lock.release()


def _run(args: Any, base: Config, n_sft: int, n_rl: int, t_start: float) -> int:
    """The demo's work, under its --out's lock."""
    if base.threads:
        torch.set_num_threads(base.threads)
    quiet_transformers()
    demo = Demo(base, Path(args.out), generate_split(base.task, "train"), valid_split(base), demo_splits(base.task))
    demo.resume = getattr(args, "resume", "auto") == "auto"
    workers = args.workers if getattr(args, "workers", None) is not None else default_workers(base)

    def partial(done: list[int]) -> None:  # results so far, after each SFT seed: an interrupted demo leaves its table
        if len(done) < n_sft:
            demo.wall["total"] = round(time.time() - t_start, 1)
            seeds = ", ".join(map(str, done))
            write_results(
                demo, command_line(args) + f"  (partial: SFT seeds {seeds} of {n_sft})", len(done), n_rl, True
            )

    run_pipeline(demo, n_sft, n_rl, after_seed=partial, workers=workers)
    demo.wall["total"] = round(time.time() - t_start, 1)
    res = write_results(demo, command_line(args), n_sft, n_rl)
    print(results_markdown(res))
    print(summary_paragraph(res))
    return 0


__all__: list[str] = [
    "ARMS",
    "CI",
    "CLAIMS",
    "SHORT",
    "Claim",
    "Demo",
    "WorkerDied",
    "claim_verdicts",
    "compare",
    "exact_verdict",
    "flips",
    "mean_ci",
    "merge_seed",
    "run_demo",
    "run_pipeline",
    "t_quantile",
    "verdict",
    "write_results",
    "demo_config",
]
