"""``dgrpo bench``'s options and its item keys, without torch: :mod:`dgrpo.bench.launch` answers ``--help`` and a
usage error with them before any child process starts or torch loads (``dgrpo bench --help`` took 8 s)."""

from __future__ import annotations

import argparse

ORDER = [
    "flops",
    "rollouts",
    "sft",
    "grpo_scaling",
    "perturbation",
    "memory",
    "lora",
    "recompute",
    "engine",
    "parallel",
    "soak",
]  # flops first: its matmul peak annotates later rows
#: the items of the CPU section alone, and of the GPU section alone
CPU_ONLY, CUDA_ONLY = ("soak", "parallel"), ("optimizer",)
GPU_ORDER = [k for k in ORDER if k not in CPU_ONLY] + list(CUDA_ONLY)  # CPU-only items out
ITEM_KEYS = ORDER + ["optimizer"]
#: where the items of one section alone run, as --only's help and its error say it
SECTION_NOTE = f"{' and '.join(CPU_ONLY)} run on the CPU only, {' and '.join(CUDA_ONLY)} on CUDA only"

DESCRIPTION = """Dropout-GRPO performance suite: each claim a ratio of two ways of doing the same work (batched vs
one-at-a-time rollouts, Dropout-GRPO vs deterministic steps, LoRA vs full fine-tuning, ...), timed alternately in
one run. Writes OUT/bench.json and OUT/bench.md (bench/RESULTS.md holds the published run). The CPU section runs a
tiny model; with CUDA, a GPU section runs a ~0.5B Qwen2 in bf16. Launch it without torchrun."""

EXAMPLES = """examples:
  dgrpo bench --quick --out runs/bench-quick                  # a smoke test of every item (about 2 minutes on 2 cores)
  dgrpo bench --out runs/bench                                # the whole suite (about 15 minutes on 2 cores)
  dgrpo bench --only flops,rollouts --out runs/bench-rollouts   # some items (the keys --only lists), full shapes
  dgrpo bench --section gpu --only flops,optimizer --out runs/bench-gpu   # the GPU section alone (CUDA)
"""


def build_parser() -> argparse.ArgumentParser:
    """The suite's options: ``--out``, ``--quick``, ``--only`` and ``--section``."""
    ap = argparse.ArgumentParser(
        prog="dgrpo bench",
        description=DESCRIPTION,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--out", required=True, help="output directory (bench.json, bench.md)")
    ap.add_argument(
        "--quick",
        action="store_true",
        help="tiny shapes, 5 repetitions: a smoke test (about 2 minutes on 2 cores), numbers mean little",
    )
    ap.add_argument(
        "--only",
        default=None,
        metavar="ITEMS",
        help=f"comma-separated subset of: {', '.join(ITEM_KEYS)} (default: all; {SECTION_NOTE})",
    )
    ap.add_argument(
        "--section",
        default="all",
        choices=["all", "cpu", "gpu"],
        help="cpu: the tiny model on the CPU; gpu: a ~0.5B Qwen2 in bf16 on CUDA (refused without CUDA); all: both "
        "(without CUDA, the CPU section alone)",
    )
    return ap
