"""What the update's latent steps keep for backward in keys and values, saved once per layer or once per step.

    python bench/latent_kv_bytes.py                    # Qwen2.5-1.5B's layers, bf16, T = 6, prompts 32-160 wide
    python bench/latent_kv_bytes.py --widths 136 --rows 2
    python bench/latent_kv_bytes.py --time             # what it costs: one process, each arm alternated

Each latent step appends a column to every layer's keys and values; attention saves the concatenation, so per step
autograd would keep the prompt's columns again (``LatentLM.save_kv_once = False``); by default each layer's are kept
once, as views of the last step's (``dgrpo.model.kv_prefixes``). This runs the update's replay (the prompt, T latent
steps, the marker and ``--answer`` answer tokens, with grad, per-layer recomputation with the latent steps keeping
their activations, as the paper recipe runs it) both ways, on a two-layer model of Qwen2.5-1.5B's layer shape with
random weights on the CPU, and counts the bytes kept for backward the way bench item 10 does
(``dgrpo.bench.recompute_item.kept_for_backward``). The difference is per layer and per row, so it is scaled to the
model's 28 layers and ``--scale-rows`` rows (the recipe's 512-row micro-batch).

``--time`` times instead, each pair alternated in one process (``dgrpo.bench.timing.alternate``, medians): the
replay's forward and backward with and without, at bench item 10's shape (a 4 x 512 Qwen2 in fp32, 64 rows of 40
prompt and 16 answer tokens) under each recomputation mode; and the latent steps' forward alone on a host-bound proxy
(28 layers of width 32, one thread: what the hooks cost the host, which a GPU's uncaptured update pays), against no
hooks and against hooks that do nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from kept_layer_bytes import byte_count_args, layer_shaped_lm  # noqa: E402
from paper_step import QWEN25_15B, T  # noqa: E402

from dgrpo.bench.recompute_item import ARMS, RECOMPUTE_CPU, kept_for_backward  # noqa: E402
from dgrpo.bench.timing import alternate  # noqa: E402
from dgrpo.bench.workload import QUICK, build_lm  # noqa: E402
from dgrpo.cli.common import positive_int  # noqa: E402
from dgrpo.model.latent_lm import LatentLM  # noqa: E402

MEASURED_LAYERS = 2


def replay(lm: LatentLM, ids: torch.Tensor, targets: torch.Tensor) -> None:
    """The update's replay of ``ids`` -> T latent steps -> ``targets``, and its backward."""
    lp, _ = lm.target_logprobs(ids, torch.ones_like(ids), T, targets, torch.ones_like(targets))
    (-lp.sum()).backward()


def time_replay(reps: int) -> None:
    """The replay's forward and backward, keys and values kept once against once per step, per recomputation mode."""
    lm = build_lm(RECOMPUTE_CPU, torch.device("cpu"), torch.float32, keep=False)
    ids, targets = torch.randint(10, 100, (64, 40)), torch.randint(10, 100, (64, 16))

    def arm(once: bool) -> None:
        lm.save_kv_once = once
        replay(lm, ids, targets)
        lm.model.zero_grad(set_to_none=True)

    for mode, (granularity, latent_steps) in ARMS.items():  # (bench item 10's recomputation modes)
        lm.recompute, lm.recompute_latent_steps = granularity or False, latent_steps
        timed = alternate({"once": functools.partial(arm, True), "each step": functools.partial(arm, False)}, reps=reps)
        row = {
            "replay": mode,
            "once_s": round(timed.median("once"), 3),
            "each_step_s": round(timed.median("each step"), 3),
            "ratio": round(timed.ratio("once", "each step"), 3),
        }
        print(json.dumps(row))


def time_host(reps: int) -> None:
    """The latent steps' forward with grad on a host-bound proxy: no hooks, hooks that do nothing, these."""
    torch.set_num_threads(1)
    lm = build_lm(
        dataclasses.replace(QUICK, layers=QWEN25_15B.layers, hidden=32, heads=4, kv_heads=2, ffn=64),
        torch.device("cpu"),
        torch.float32,
        keep=False,
    )
    ids = torch.randint(10, 100, (4, 40))

    def arm(once: bool, hooks: bool = False) -> None:
        lm.save_kv_once = once
        with torch.no_grad():
            state = lm.prefill(ids, torch.ones_like(ids), 0, markers=False)
        state.last_hidden.requires_grad_(True)
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t) if hooks else contextlib.nullcontext():
            lm.coconut_steps(state, T)

    arms: dict[str, Callable[[], None]] = {
        "none": functools.partial(arm, False),
        "do-nothing hooks": functools.partial(arm, False, True),
        "once": functools.partial(arm, True),
    }
    timed = alternate(arms, reps=reps, warmup=3)
    layer_steps = QWEN25_15B.layers * T
    out = {k: round(timed.median(k) * 1e3, 2) for k in timed.times}
    extra_us = (timed.median("once") - timed.median("none")) / layer_steps * 1e6
    print(json.dumps({"host_proxy_latent_forward_ms": out, "once_extra_us_per_layer_step": round(extra_us, 1)}))


def main() -> int:
    ap = byte_count_args(__doc__)
    ap.add_argument("--widths", type=positive_int, nargs="+", default=[32, 64, 96, 136, 160], help="prompt columns")
    ap.add_argument("--time", action="store_true", help="time the change instead of counting bytes")
    ap.add_argument("--reps", type=positive_int, default=12, help="--time: alternated rounds per pair")
    # --time measures at fixed shapes (bench item 10's and the host proxy's), the byte count at the options' own: an
    # option the mode does not read is refused when given at all, at its default too (defaults filled in after)
    byte_count, timing = ("rows", "answer", "dtype", "scale_rows", "vocab", "widths"), ("reps",)
    defaults = {d: ap.get_default(d) for d in byte_count + timing}
    ap.set_defaults(**dict.fromkeys(defaults))
    args = ap.parse_args()
    given = [f"--{d.replace('_', '-')}" for d in (byte_count if args.time else timing) if getattr(args, d) is not None]
    if given:
        why = "--time measures at fixed shapes" if args.time else "only --time reads it"
        ap.error(f"{why}: {', '.join(given)} would do nothing")
    for d, value in defaults.items():
        if getattr(args, d) is None:
            setattr(args, d, value)
    if args.time:
        time_replay(args.reps)
        time_host(3 * args.reps)
        return 0
    lm = layer_shaped_lm(args, MEASURED_LAYERS)
    lm.recompute, lm.recompute_latent_steps = "layer", False
    scale = QWEN25_15B.layers / MEASURED_LAYERS * args.scale_rows / args.rows
    for width in args.widths:
        ids = torch.randint(10, 1000, (args.rows, width))
        targets = torch.randint(10, 1000, (args.rows, args.answer))
        kept = {}
        for once in (False, True):
            lm.save_kv_once = once
            kept[once] = kept_for_backward(functools.partial(replay, lm, ids, targets), lm.model.parameters())
            lm.model.zero_grad(set_to_none=True)
        fewer = kept[False] - kept[True]
        print(
            json.dumps(
                {
                    "layer": QWEN25_15B.name,
                    "dtype": args.dtype,
                    "prompt_columns": width,
                    "latent_steps": T,
                    f"kept_{MEASURED_LAYERS}_layers_{args.rows}_rows_mib": {
                        "each_step": round(kept[False] / 2**20, 2),
                        "once": round(kept[True] / 2**20, 2),
                    },
                    "fewer_per_layer_per_row_mib": round(fewer / (MEASURED_LAYERS * args.rows) / 2**20, 3),
                    f"fewer_at_{QWEN25_15B.layers}_layers_{args.scale_rows}_rows_gib": round(fewer * scale / 2**30, 2),
                }
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
