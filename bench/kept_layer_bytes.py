"""What one decoder layer left out of recomputation keeps for backward, per row, at a real model's width.

    python bench/kept_layer_bytes.py                   # Qwen2.5-1.5B's layer, bf16, the paper step's positions
    python bench/kept_layer_bytes.py --rows 8 --dtype float32

``grpo.recompute_kept_layers: k`` spares the last k decoder layers their second forward in backward; each keeps its
activations of every recomputed call (the prompt and the answer; the latent steps' calls keep theirs anyway under
``grpo.recompute_latent_steps: false``) until backward. This counts those bytes the way bench item 10 does (the
distinct storages autograd saves, weights left out; ``dgrpo.bench.recompute_item.kept_for_backward``) on a
two-layer model of the layer's shape with random weights, on the CPU, with Hugging Face's layers (Liger's fused
layers keep less), for T = 6 latent steps and ``--answer`` answer tokens: kept(1 layer kept) - kept(0), per row, and
times ``--scale-rows`` (the recipe's 512-row micro-batch). ``--vocab`` sets the embedding's and the head's rows,
which the difference does not hold (the tests count with 1024: the same figures, in less time).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from paper_step import QWEN25_15B, T  # noqa: E402

from dgrpo.bench.recompute_item import kept_for_backward  # noqa: E402
from dgrpo.bench.workload import build_lm, task_records  # noqa: E402
from dgrpo.cli.common import positive_int  # noqa: E402
from dgrpo.model.latent_lm import LatentLM  # noqa: E402


def byte_count_args(doc: str | None) -> argparse.ArgumentParser:
    """The options of a script that counts bytes on a few rows of a Qwen2.5-1.5B-shaped model (this one's and
    bench/latent_kv_bytes.py's)."""
    ap = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
    ap.add_argument("--rows", type=positive_int, default=4, help="rows measured (the bytes scale with rows)")
    ap.add_argument("--answer", type=positive_int, default=64, help="answer tokens per row")
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    ap.add_argument("--scale-rows", type=positive_int, default=512, help="report the bytes for this many rows too")
    ap.add_argument(
        "--vocab",
        type=vocab_size,
        default=QWEN25_15B.vocab,
        help="rows of the embedding and the head (Qwen2.5-1.5B's by default): they are not in the per-layer "
        f"differences counted, and a smaller one builds in less time (>= {MIN_VOCAB}: the token ids drawn)",
    )
    return ap


#: the token ids a byte count draws lie below this
MIN_VOCAB = 1000


def vocab_size(text: str) -> int:
    """``--vocab``: an integer of at least MIN_VOCAB."""
    if not text.strip().isdigit() or int(text) < MIN_VOCAB:
        raise argparse.ArgumentTypeError(f"an integer >= {MIN_VOCAB} (the token ids drawn), got {text!r}")
    return int(text)


def layer_shaped_lm(args: argparse.Namespace, layers: int = 2) -> LatentLM:
    """A ``layers``-layer model of Qwen2.5-1.5B's layer shape, random weights, on the CPU in ``args.dtype``."""
    torch.manual_seed(0)
    shape = dataclasses.replace(QWEN25_15B, layers=layers, vocab=args.vocab)
    return build_lm(shape, torch.device("cpu"), getattr(torch, args.dtype), keep=False)


def main() -> int:
    args = byte_count_args(__doc__).parse_args()
    lm = layer_shaped_lm(args)
    ids, mask = lm.encode_questions([r.question for r in task_records(args.rows)])
    targets = torch.randint(10, 1000, (args.rows, args.answer))
    target_mask = torch.ones_like(targets)
    lm.recompute, lm.recompute_latent_steps = "layer", False
    kept = {}
    for n in (0, 1):
        lm.recompute_kept_layers = n

        def run() -> None:
            lp, _ = lm.target_logprobs(ids, mask, T, targets, target_mask, end_with_targets=True)
            (-(lp * target_mask).sum()).backward()

        kept[n] = kept_for_backward(run, lm.model.parameters())
        lm.model.zero_grad(set_to_none=True)
    per_row = (kept[1] - kept[0]) / args.rows
    positions = ids.shape[1] + T + 1 + args.answer
    print(
        json.dumps(
            {
                "layer": QWEN25_15B.name,
                "dtype": args.dtype,
                "positions_per_row": positions,
                "kept_per_layer_per_row_mib": round(per_row / 2**20, 2),
                f"kept_per_layer_at_{args.scale_rows}_rows_gib": round(per_row * args.scale_rows / 2**30, 2),
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
