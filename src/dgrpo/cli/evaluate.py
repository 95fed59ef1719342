"""``dgrpo eval``: pass@1 of a checkpoint (or of a plain causal LM with a chain-of-thought prompt) on a dataset."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from .common import add_config_options, load, setup, subcommand

EXAMPLES = """  dgrpo eval --model runs/grpo --data builtin:test --out runs/eval    # a run directory means its final/
  dgrpo eval --model runs/grpo/best --data gsm8k --limit 200 --out runs/eval-gsm8k
  dgrpo eval --model Qwen/Qwen2.5-1.5B --data gsm8k --plain --shots 1 --out runs/base   # a plain LM, 1-shot CoT prompt
"""


def register(sub: Any) -> None:
    p = subcommand(sub, "eval", "pass@1 of a checkpoint on a dataset", EXAMPLES)
    add_config_options(p, "eval.max_new_tokens=128")
    p.add_argument("--model", required=True, help="checkpoint directory, run directory or hub id")
    p.add_argument("--data", required=True, help="dataset name (gsm8k, svamp, builtin:test, ...) or file path")
    p.add_argument("--split", help="dataset split (default: test)")
    p.add_argument("--limit", type=int, help="evaluate the first N records")
    p.add_argument("--out", required=True, help="writes results.json and predictions.jsonl here")
    p.add_argument("--plain", action="store_true", help="plain causal LM with a chain-of-thought prompt (no latents)")
    p.add_argument(
        "--shots", type=int, help="with --plain: worked examples in the prompt (taken from the start of the data)"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..data import load_spec
    from ..data.loaders import load_dataset
    from ..eval.evaluate import evaluate, write_results
    from ..model.factory import load_model

    extra = []
    if args.limit is not None:
        extra.append(f"eval.limit={args.limit}")
    if args.plain:
        extra.append("eval.plain=true")
    if args.shots is not None:
        extra.append(f"eval.shots={args.shots}")
    cfg = load(args, extra)
    device = setup(cfg)
    recs = load_dataset(args.data, args.split) if args.split else load_spec(args.data, cfg.task)
    lm = load_model(cfg.model, cfg.task, init=args.model, device=device)
    e = cfg.eval
    name = args.data if not args.split else f"{args.data}:{args.split}"
    r = evaluate(
        lm,
        recs,
        dataset=name,
        n_latent=e.n_latent,
        batch_size=e.batch_size,
        max_new_tokens=e.max_new_tokens,
        temperature=e.temperature,
        top_p=e.top_p,
        seed=cfg.seed,
        plain=e.plain,
        shots=e.shots,
        limit=e.limit,
        max_question_tokens=cfg.data.max_question_tokens,
    )
    write_results(r, Path(args.out))
    print(json.dumps(r.summary()))
    return 0
