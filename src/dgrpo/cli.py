"""Command line: ``dgrpo sft | grpo | eval | demo | bench | data inspect | config show``.

Every training command takes ``--config FILE`` (YAML) and any number of ``--set key=value``
overrides. A bad config, a bad data file or a missing checkpoint exits with code 2 and one line.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
from pathlib import Path

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML config file (see configs/)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one option, e.g. --set sft.lr=1e-4 (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="dgrpo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("sft", help="Coconut curriculum SFT (or a CoT / no-CoT / pause baseline)")
    _common(p)
    p.add_argument("--out", required=True, help="run directory (checkpoints stage-K/, final/, metrics.jsonl)")
    p.add_argument("--init", help="start from this checkpoint instead of model.name_or_path")

    p = sub.add_parser("grpo", help="Dropout-GRPO (and its ablations) from an SFT checkpoint")
    _common(p)
    p.add_argument("--init", required=True, help="SFT checkpoint (run directory or checkpoint directory)")
    p.add_argument("--out", required=True, help="run directory")

    p = sub.add_parser("eval", help="pass@1 of a checkpoint on a dataset")
    _common(p)
    p.add_argument("--model", required=True, help="checkpoint directory, run directory or hub id")
    p.add_argument("--data", required=True, help="dataset name (gsm8k, svamp, builtin:test, ...) or file path")
    p.add_argument("--split", help="dataset split (default: test)")
    p.add_argument("--limit", type=int, help="evaluate the first N records")
    p.add_argument("--out", required=True, help="writes results.json and predictions.jsonl here")
    p.add_argument("--plain", action="store_true", help="plain causal LM with a chain-of-thought prompt (no latents)")
    p.add_argument("--shots", type=int, help="with --plain: worked examples in the prompt (taken from the start of the data)")

    p = sub.add_parser("demo", help="the CPU-scale reproduction of the paper's table and figures")
    _common(p)
    p.add_argument("--out", default="runs/demo", help="output directory (default runs/demo)")
    p.add_argument("--seeds", type=int, default=1, help="RL seeds per arm (default 1)")
    p.add_argument("--quick", action="store_true", help="a tiny smoke-test version (about a minute)")

    p = sub.add_parser("bench", help="the benchmark suite (ratios measured side by side; see bench/RESULTS.md)", add_help=False)
    p.add_argument("bench_args", nargs=argparse.REMAINDER, help="--out DIR [--quick] [--only KEYS]")

    p = sub.add_parser("data", help="dataset utilities")
    dsub = p.add_subparsers(dest="data_cmd", required=True)
    q = dsub.add_parser("inspect", help="count records and show the first one (last line: JSON)")
    q.add_argument("name_or_path")
    q.add_argument("--split")

    p = sub.add_parser("config", help="configuration utilities")
    csub = p.add_subparsers(dest="config_cmd", required=True)
    q = csub.add_parser("show", help="print every option with its default (or the given config's value) and doc")
    q.add_argument("what", nargs="?", default="all", choices=["all", "sft", "grpo"])
    _common(q)
    return ap


def _setup(cfg) -> torch.device:
    from .model.factory import resolve_device

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    seed_everything(cfg.seed)
    return resolve_device(cfg.device)


def cmd_sft(args) -> int:
    from .config import Config, load_config
    from .data import load_spec
    from .eval.evaluate import evaluate, write_results
    from .model.factory import load_model
    from .training.distributed import Dist
    from .training.sft import train_sft

    cfg = load_config(Config, args.config, args.overrides)
    device = _setup(cfg)
    train = load_spec(cfg.data.train, cfg.task)
    valid = load_spec(cfg.data.valid, cfg.task) if cfg.data.valid else None
    tests = {spec: load_spec(spec, cfg.task) for spec in cfg.data.test}
    dist = Dist.from_env(device, fsdp=cfg.fsdp)
    if dist.active and device.type == "cuda":
        device = torch.device("cuda", dist.local_rank)
    lm = load_model(cfg.model, cfg.task, init=args.init, seed=cfg.seed, device=device)
    if dist.active:  # distinct, reproducible RNG streams per rank (the weights are broadcast from rank 0)
        seed_everything(cfg.seed * 1000003 + dist.rank)
    out = Path(args.out)
    if valid and cfg.data.eval_limit:  # the limit applies to the global list, before it is sharded
        valid = valid[:cfg.data.eval_limit]

    def eval_fn(lm_, recs, settings):
        return evaluate(lm_, recs, n_latent=settings.n_latent, batch_size=cfg.eval.batch_size, max_new_tokens=cfg.eval.max_new_tokens,
                        seed=cfg.seed, progress=False).accuracy

    train_sft(lm, train, cfg, out, valid=valid, evaluate_fn=eval_fn, dist=dist)
    for spec, recs in tests.items():  # sharded over ranks, gathered; rank 0 writes
        r = dist.gather_eval(evaluate(lm, dist.shard(recs), dataset=spec, batch_size=cfg.eval.batch_size,
                                      max_new_tokens=cfg.eval.max_new_tokens, seed=cfg.seed, progress=dist.is_main))
        if dist.is_main:
            write_results(r, out / "eval" / spec.replace(":", "_").replace("/", "_"))
            print(json.dumps(r.summary()))
    dist.close()
    return 0


def cmd_eval(args) -> int:
    from .config import Config, load_config
    from .data import load_spec
    from .data.loaders import load_dataset
    from .eval.evaluate import evaluate, write_results
    from .model.factory import load_model

    overrides = list(args.overrides)
    if args.limit is not None:
        overrides.append(f"eval.limit={args.limit}")
    if args.plain:
        overrides.append("eval.plain=true")
    if args.shots is not None:
        overrides.append(f"eval.shots={args.shots}")
    cfg = load_config(Config, args.config, overrides)
    device = _setup(cfg)
    recs = load_dataset(args.data, args.split) if args.split else load_spec(args.data, cfg.task)
    lm = load_model(cfg.model, cfg.task, init=args.model, device=device)
    e = cfg.eval
    r = evaluate(lm, recs, dataset=args.data if not args.split else f"{args.data}:{args.split}", n_latent=e.n_latent, batch_size=e.batch_size,
                 max_new_tokens=e.max_new_tokens, temperature=e.temperature, top_p=e.top_p, seed=cfg.seed, plain=e.plain, shots=e.shots,
                 limit=e.limit, max_question_tokens=cfg.data.max_question_tokens)
    write_results(r, Path(args.out))
    print(json.dumps(r.summary()))
    return 0


def cmd_data(args) -> int:
    from .data import load_spec
    from .data.loaders import load_dataset

    recs = load_dataset(args.name_or_path, args.split) if args.split else load_spec(args.name_or_path)
    print(f"{len(recs)} records")
    print(json.dumps({"n": len(recs), "example": recs[0].to_dict() if recs else None}))
    return 0


def cmd_config(args) -> int:
    from .config import Config, describe, load_config, to_dict

    if args.config or args.overrides:
        cfg = load_config(Config, args.config, args.overrides)
        print(json.dumps(to_dict(cfg), indent=2))
    else:
        print("\n".join(describe(Config)))
    return 0


def cmd_demo(args) -> int:
    from .demo import run_demo

    return run_demo(args)


def cmd_grpo(args) -> int:
    from .config import Config, load_config
    from .data import load_spec
    from .eval.evaluate import evaluate, write_results
    from .model.factory import load_model
    from .training.distributed import Dist
    from .training.grpo import train_grpo

    cfg = load_config(Config, args.config, args.overrides)
    device = _setup(cfg)
    train = load_spec(cfg.data.train, cfg.task)
    valid = {cfg.data.valid: load_spec(cfg.data.valid, cfg.task)} if cfg.data.valid else {}
    tests = {spec: load_spec(spec, cfg.task) for spec in cfg.data.test}
    dist = Dist.from_env(device, fsdp=cfg.fsdp)
    if dist.active and device.type == "cuda":
        device = torch.device("cuda", dist.local_rank)
    lm = load_model(cfg.model, cfg.task, init=args.init, seed=cfg.seed, device=device)
    if dist.active:  # distinct, reproducible RNG streams per rank (rollout seeds come from the global row anyway)
        seed_everything(cfg.seed * 1000003 + dist.rank)
    e = cfg.eval
    if cfg.data.eval_limit:  # the limit applies to the global list, before it is sharded
        valid = {name: recs[:cfg.data.eval_limit] for name, recs in valid.items()}

    def eval_fn(lm_, recs):
        return evaluate(lm_, recs, batch_size=e.batch_size, max_new_tokens=e.max_new_tokens,
                        seed=cfg.seed, max_question_tokens=cfg.data.max_question_tokens, progress=False).accuracy

    out = Path(args.out)
    summary = train_grpo(lm, cfg, train, out, valid=valid, evaluate_fn=eval_fn, dist=dist)
    if dist.is_main:
        print(json.dumps(summary))
    for spec, recs in tests.items():  # sharded over ranks, gathered; rank 0 writes
        r = dist.gather_eval(evaluate(lm, dist.shard(recs), dataset=spec, batch_size=e.batch_size, max_new_tokens=e.max_new_tokens,
                                      seed=cfg.seed, max_question_tokens=cfg.data.max_question_tokens, progress=dist.is_main))
        if dist.is_main:
            write_results(r, out / "eval" / spec.replace(":", "_").replace("/", "_"))
            print(json.dumps(r.summary()))
    dist.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    from .config import ConfigError
    from .data.records import DataError
    from .model.factory import CheckpointError

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:  # the suite parses its own options (--out, --quick, --only)
        from .bench import main as bench_main

        return bench_main(argv[1:])
    args = build_parser().parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    handlers = {"sft": cmd_sft, "eval": cmd_eval, "data": cmd_data, "config": cmd_config, "demo": cmd_demo, "grpo": cmd_grpo}
    try:
        return handlers[args.cmd](args)
    except (ConfigError, DataError, CheckpointError) as e:
        print(f"dgrpo: error: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:
        from .training.grpo import NonFiniteError

        if not isinstance(e, NonFiniteError):
            raise
        print(f"dgrpo: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("dgrpo: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
