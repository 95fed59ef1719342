"""What the update's latent steps keep for backward in keys and values, saved once per layer or once per step.

    python bench/latent_kv_bytes.py                    # Qwen2.5-1.5B's layers, bf16, T = 6, prompts 32-160 wide
    python bench/latent_kv_bytes.py --widths 136 --rows 2

Each latent step appends a column to every layer's keys and values; attention saves the concatenation, so per step
autograd would keep the prompt's columns again (``LatentLM.save_kv_once = False``); by default each layer's are kept
once, as views of the last step's (``dgrpo.model.kv_prefixes``). This runs the update's replay (the prompt, T latent
steps, the marker and ``--answer`` answer tokens, with grad, per-layer recomputation with the latent steps keeping
their activations, as the paper recipe runs it) both ways, on a two-layer model of Qwen2.5-1.5B's layer shape with
random weights on the CPU, and counts the bytes kept for backward the way bench item 10 does
(``dgrpo.bench.recompute_item.kept_for_backward``). The difference is per layer and per row, so it is scaled to the
model's 28 layers and ``--scale-rows`` rows (the recipe's 512-row micro-batch).
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from kept_layer_bytes import byte_count_args, layer_shaped_lm  # noqa: E402
from paper_step import QWEN25_15B, T  # noqa: E402

from dgrpo.bench.recompute_item import kept_for_backward  # noqa: E402
from dgrpo.model.latent_lm import LatentLM  # noqa: E402

MEASURED_LAYERS = 2


def replay(lm: LatentLM, ids: torch.Tensor, targets: torch.Tensor) -> None:
    """The update's replay of ``ids`` -> T latent steps -> ``targets``, and its backward."""
    lp, _ = lm.target_logprobs(ids, torch.ones_like(ids), T, targets, torch.ones_like(targets))
    (-lp.sum()).backward()


def main() -> int:
    ap = byte_count_args(__doc__)
    ap.add_argument("--widths", type=int, nargs="+", default=[32, 64, 96, 136, 160], help="prompt columns")
    args = ap.parse_args()
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
