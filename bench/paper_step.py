"""Time and memory of one Dropout-GRPO step at the paper's full scale, on whatever device is present.

    python bench/paper_step.py --steps 3 [--device cuda] [--out runs/paper-step.json]

Builds a model of Qwen2.5-1.5B's shape with random weights (no hub access needed) in the recipe's dtype, loads
the packaged paper/grpo_dropout.yaml unchanged except: T = 6 is given explicitly (there is no SFT checkpoint to read it
from), the group filter is off and EOS is suppressed, so that every step runs the full update on 16 x 32 rollouts of
exactly ``max_new_tokens`` answer tokens (the worst case a real step can reach). Prints one JSON line per step and a
summary: step time (rollout / update split), peak memory, the optimizer actually used.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from dgrpo.bench.workload import QUICK, Shapes, build_lm, task_records  # noqa: E402
from dgrpo.config import Config, load_config  # noqa: E402
from dgrpo.training.grpo import GRPOTrainer  # noqa: E402

#: Qwen2.5-1.5B: 28 layers, hidden 1536, 12 query / 2 KV heads, FFN 8960, vocabulary 151,936.
QWEN25_15B = Shapes(name="qwen2.5-1.5b", hidden=1536, layers=28, heads=12, kv_heads=2, ffn=8960, vocab=151936)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3, help="timed steps (after one warm-up step)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="extra config overrides")
    ap.add_argument("--out", default="", help="write the summary JSON here too")
    ap.add_argument(
        "--tiny",
        action="store_true",
        help="a tiny model of the same architecture instead (a smoke test of this script)",
    )
    args = ap.parse_args()
    device = torch.device(args.device)
    cfg = load_config(
        Config, "paper/grpo_dropout.yaml", ["grpo.n_latent=6", "grpo.filter=false", "grpo.warmup_steps=0", *args.set]
    )
    dtype = torch.bfloat16 if cfg.model.dtype == "bfloat16" else torch.float32
    t0 = time.perf_counter()
    shape = QUICK if args.tiny else QWEN25_15B
    lm = build_lm(shape, device, dtype)
    prompts = task_records(cfg.grpo.prompts_per_step)
    tr = GRPOTrainer(lm, cfg, prompts)
    n_params = sum(p.numel() for p in lm.model.parameters())
    print(
        json.dumps(
            {
                "built_s": round(time.perf_counter() - t0, 1),
                "params": n_params,
                "optimizer": type(tr.opt).__module__ + "." + type(tr.opt).__name__,
                "device": str(device),
                "dtype": str(dtype),
            }
        ),
        flush=True,
    )
    rows = []
    for i in range(args.steps + 1):
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t = time.perf_counter()
        m = tr.step(prompts=prompts)
        if device.type == "cuda":
            torch.cuda.synchronize()
        row = {
            "step": i,
            "warmup": i == 0,
            "wall_s": round(time.perf_counter() - t, 3),
            "rollout_s": m["time_rollout_s"],
            "update_s": m["time_update_s"],
            "n_rollouts_kept": m["n_rollouts_kept"],
        }
        if device.type == "cuda":
            row["peak_allocated_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        rows.append(row)
        print(json.dumps(row), flush=True)
    timed = [r for r in rows if not r["warmup"]]
    summary = {
        "shape": shape.name,
        "params": n_params,
        "prompts": cfg.grpo.prompts_per_step,
        "K": cfg.grpo.group_size,
        "T": 6,
        "max_new_tokens": cfg.grpo.max_new_tokens,
        "micro_batch_size": cfg.grpo.micro_batch_size,
        "optimizer": type(tr.opt).__name__,
        "median_step_s": statistics.median(r["wall_s"] for r in timed),
        "median_rollout_s": statistics.median(r["rollout_s"] for r in timed),
        "median_update_s": statistics.median(r["update_s"] for r in timed),
        "hours_for_3000_steps": round(3000 * statistics.median(r["wall_s"] for r in timed) / 3600, 2),
    }
    if device.type == "cuda":
        summary.update(
            gpu=torch.cuda.get_device_name(0), peak_allocated_gib=max(r["peak_allocated_gib"] for r in timed)
        )
    print(json.dumps(summary), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"summary": summary, "steps": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
