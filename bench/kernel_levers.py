"""The GPU path's levers one at a time, at the paper step's shapes: each alternated with what it replaces, on the same
inputs, timed (the median of ``--reps`` rounds) and checked to agree.

    python bench/kernel_levers.py                                              # a GPU: Qwen2.5-1.5B's shapes, bf16
    python bench/kernel_levers.py --device cpu --rows 4 --vocab 1000 --reps 3  # a smoke run

Pairs (``candidate`` against ``baseline``):

- ``head_greedy``: one answer token's greedy statistics over [rows, vocab] logits (the rollouts' token choice):
  ``model.compile_head``'s fused reductions against eager argmax, fp32 log-softmax and entropy;
- ``head_scoring``: one scoring chunk's target log-probs, forward and backward, over [rows, 3 positions, vocab] logits
  (the update's chunks; the reference's without backward): compiled against eager ``log_softmax(dtype=float32)``;
- ``attention_call``: one attention call of several positions (the update's answer call: 65 queries over 100
  columns) with its 4-d additive mask, forward and backward: ``model.pack_gqa``'s packed grouped queries against
  Hugging Face's SDPA attention, which repeats the keys and values (the mask's packed rows, made once per forward
  call for all its layers, are reused by the timed rounds; ``mask_packing_ms_per_call`` is that once);
- ``attention_decode``: one answer step's attention (one query per row over a 128-column static cache), forward: plain
  matrix products and a softmax against Hugging Face's SDPA attention (which packs a single query's heads itself).
  No option runs the candidate: it says whether one would pay.

Each pair prints one JSON line: both medians (ms), their ratio (candidate / baseline, below 1: the candidate is
faster), the largest difference between their outputs and, over outputs and gradients together (where a pair takes
them), the largest difference relative to the baseline's largest value. On a CPU the timings are not the GPU's; the
smoke run checks that the pairs run and agree.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import Tensor

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from transformers.integrations.sdpa_attention import sdpa_attention_forward  # noqa: E402

from dgrpo.cli.common import positive_int  # noqa: E402
from dgrpo.model.gqa_attention import packed_gqa_sdpa_forward  # noqa: E402
from dgrpo.model.head_stats import HeadStats  # noqa: E402


def args_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    ap.add_argument("--rows", type=positive_int, default=512, help="rows (the paper step's 16 x 32 rollouts)")
    ap.add_argument("--vocab", type=positive_int, default=151936, help="vocabulary (Qwen2.5's)")
    ap.add_argument("--heads", type=positive_int, default=12, help="query heads (key/value heads: --kv-heads)")
    ap.add_argument("--kv-heads", type=positive_int, default=2)
    ap.add_argument("--head-dim", type=positive_int, default=128)
    ap.add_argument("--queries", type=positive_int, default=65, help="positions of the multi-position attention call")
    ap.add_argument("--columns", type=positive_int, default=100, help="columns that call attends over")
    ap.add_argument("--cache", type=positive_int, default=128, help="columns of the answer steps' static cache")
    ap.add_argument("--chunk", type=positive_int, default=3, help="positions of a scoring chunk")
    ap.add_argument(
        "--reps", type=positive_int, default=20, help="timed rounds (each runs both, alternating who goes first)"
    )
    return ap


def timed(fn: Callable[[], object], device: torch.device) -> float:
    """Milliseconds of one call (CUDA events on a GPU)."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def pair(name: str, candidate: Callable[[], Tensor], baseline: Callable[[], Tensor], args, device) -> dict:
    """Both run twice untimed (compilation, caches), then ``reps`` rounds alternating who goes first."""
    with torch.no_grad():
        diff = (candidate().float() - baseline().float()).abs().max().item()
    cand, base = candidate().detach().float(), baseline().detach().float()  # (gradients too, where a pair takes them)
    rel = ((cand - base).abs().max() / base.abs().max().clamp_min(1e-30)).item()
    for _ in range(2):
        candidate(), baseline()
    times: dict[str, list[float]] = {"candidate": [], "baseline": []}
    for r in range(args.reps):
        order = [("candidate", candidate), ("baseline", baseline)]
        for key, fn in order if r % 2 == 0 else order[::-1]:
            times[key].append(timed(fn, device))
    cand_ms, base_ms = statistics.median(times["candidate"]), statistics.median(times["baseline"])
    return {"pair": name, "candidate_ms": round(cand_ms, 4), "baseline_ms": round(base_ms, 4),
            "ratio": round(cand_ms / base_ms, 3), "max_abs_diff": diff, "max_rel_diff_with_grads": rel}  # fmt: skip


def head_pairs(args, device, dtype) -> list[dict]:
    torch.manual_seed(0)
    compiled, eager = HeadStats(compiled=True), HeadStats()
    logits = (torch.randn(args.rows, args.vocab, device=device) * 3).to(dtype)

    def greedy(stats: HeadStats) -> Callable[[], Tensor]:
        def run() -> Tensor:
            _, logp, entropy = stats.greedy(logits, True)
            assert entropy is not None
            return torch.stack([logp, entropy])

        return run

    out = [pair("head_greedy", greedy(compiled), greedy(eager), args, device)]
    chunk = (torch.randn(args.rows, args.chunk, args.vocab, device=device) * 3).to(dtype).requires_grad_()
    targets = torch.randint(0, args.vocab, (args.rows, args.chunk), device=device)

    def scored(stats: HeadStats) -> Callable[[], Tensor]:
        def run() -> Tensor:
            logp = stats.target_logprobs(chunk, targets)
            if torch.is_grad_enabled():
                (grad,) = torch.autograd.grad(logp.sum(), chunk)
                return torch.cat([logp.flatten(), grad.flatten()[:4096].float()])
            return logp.flatten()

        return run

    out.append(pair("head_scoring", scored(compiled), scored(eager), args, device))
    return out


def attention_pairs(args, device, dtype) -> list[dict]:
    torch.manual_seed(1)
    module: Any = SimpleNamespace(num_key_value_groups=args.heads // args.kv_heads, is_causal=True)
    scale = args.head_dim**-0.5
    B, H, G, D = args.rows, args.heads, args.kv_heads, args.head_dim

    def inputs(L: int, S: int, grad: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        q = torch.randn(B, L, H, D, device=device, dtype=dtype).transpose(1, 2).requires_grad_(grad)
        k = torch.randn(B, G, S, D, device=device, dtype=dtype).requires_grad_(grad)
        v = torch.randn(B, G, S, D, device=device, dtype=dtype).requires_grad_(grad)
        real = torch.arange(S, device=device)[None, :] >= torch.randint(0, S // 4, (B, 1), device=device)
        causal = torch.arange(S, device=device)[None, :] <= torch.arange(S - L, S, device=device)[:, None]
        allowed = real[:, None, None, :] & causal[None, None]
        mask = torch.full(allowed.shape, float("-inf"), device=device, dtype=dtype).masked_fill_(allowed, 0.0)
        return q, k, v, mask

    q, k, v, mask = inputs(args.queries, args.columns, True)

    def call(fn: Callable) -> Callable[[], Tensor]:
        def run() -> Tensor:
            out, _ = fn(module, q, k, v, mask, 0.0, scale)
            if torch.is_grad_enabled():
                grads = torch.autograd.grad(out.float().square().sum(), (q, k, v))
                return torch.cat([out.flatten().float()] + [g.flatten()[:4096].float() for g in grads])
            return out.flatten()

        return run

    out = [pair("attention_call", call(packed_gqa_sdpa_forward), call(sdpa_attention_forward), args, device)]
    # the packed mask is made once per forward call (every layer shares it), so the pair above reuses it; alone:
    packing = [timed(lambda: mask.repeat_interleave(H // G, dim=2), device) for _ in range(args.reps)]
    out[0]["mask_packing_ms_per_call"] = round(statistics.median(packing), 4)
    qd, kd, vd, maskd = inputs(1, args.cache, False)

    def hf_decode() -> Tensor:
        with torch.no_grad():
            return sdpa_attention_forward(module, qd, kd, vd, maskd, 0.0, scale)[0]

    def matmul_decode() -> Tensor:  # the heads of a group as rows of its key/value head, as HF packs one query
        with torch.no_grad():
            qp = qd.reshape(B, G, H // G, D)
            scores = torch.matmul(qp, kd.transpose(-1, -2)) * scale + maskd
            probs = scores.softmax(-1, dtype=torch.float32).to(dtype)
            return torch.matmul(probs, vd).reshape(B, H, 1, D).transpose(1, 2).contiguous()

    out.append(pair("attention_decode", matmul_decode, hf_decode, args, device))
    return out


def checked_device(ap: argparse.ArgumentParser, args: argparse.Namespace) -> torch.device:
    """``--device``, checked with the other options: cpu, or cuda where torch sees a CUDA device; and query heads
    that the key/value heads divide (one argparse error each: they were tracebacks in the first pair)."""
    try:
        device = torch.device(args.device)
    except RuntimeError as e:
        ap.error(f"--device {args.device!r}: {e}")
    if device.type not in ("cpu", "cuda"):
        ap.error(f"--device {args.device!r}: cpu or cuda (this script times no other)")
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda, but this machine has no CUDA device (use --device cpu)")
    if args.heads % args.kv_heads:
        ap.error(f"--heads {args.heads} is no multiple of --kv-heads {args.kv_heads} (grouped-query attention)")
    return device


def main() -> int:
    ap = args_parser()
    args = ap.parse_args()
    device, dtype = checked_device(ap, args), getattr(torch, args.dtype)
    rows = head_pairs(args, device, dtype) + attention_pairs(args, device, dtype)
    for row in rows:
        print(json.dumps(row), flush=True)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    ratios = {r["pair"]: r["ratio"] for r in rows}
    print(json.dumps({"device": name, "dtype": args.dtype, "rows": args.rows, "ratios": ratios}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
