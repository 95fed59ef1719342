"""``dgrpo demo``, ``dgrpo bench`` (its own options), ``dgrpo data inspect`` and ``dgrpo config show``."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
from typing import Any

from .common import add_config_options, check_split, refuse_torchrun, subcommand

DEMO_EXAMPLES = """  dgrpo demo                               # 1 SFT seed x every arm; results in runs/demo
  dgrpo demo --full --out runs/demo-full   # 4 SFT seeds x 1 RL seed per arm: 4 pairs per comparison, 95% intervals
  dgrpo demo --sft-seeds 3 --seeds 2       # any other number of seeds
  dgrpo demo --workers 1                   # every run after the other, in this process
  dgrpo demo --set grpo.steps=100          # again in runs/demo: its SFT checkpoint read back, the RL runs anew
  dgrpo demo --resume never                # every run anew (a run that finished is otherwise read back)
  dgrpo demo --quick                       # a smoke test of the whole pipeline (its numbers mean nothing)
"""
DATA_EXAMPLES = """  dgrpo data inspect gsm8k --split train
  dgrpo data inspect 'builtin:ood_steps?n_test=10'     # quoted: '?' is a shell pattern (zsh refuses it unmatched)
  dgrpo data inspect my_data.jsonl
  dgrpo data inspect my_data.csv --set data.question_key=prompt data.answer_key=target
"""
INSPECT_HELP = "count a dataset's records and show the first one (last line: JSON)"
INSPECT_DESCRIPTION = """Count a dataset's records and show the first one, read as the training and evaluation
commands read a dataset: the same names, files and column keys (data.question_key, data.answer_key, data.steps_key;
a file's format is detected without them). The last line is JSON: {"n": N, "example": {"question": ..., "steps":
[...], "answer": ...}}, with the record's "meta" when it has one."""
SHOW_HELP = "print every option with its default and meaning, or (with --config / --set) the resolved config"
SHOW_DESCRIPTION = """Print every option with its default and meaning (SECTION: only some), or, with --config /
--set, the resolved config as JSON: what dgrpo sft and grpo given the same --config and --set run with (a bad file
or key is the same one-line error)."""
CONFIG_EXAMPLES = """  dgrpo config show                        # every option: default and meaning
  dgrpo config show grpo                   # only the grpo.* options
  dgrpo config show grpo.recompute         # the options whose key starts with grpo.recompute
  dgrpo config show --config paper/grpo_dropout.yaml --set grpo.lr=2e-5   # the resolved config, as JSON
  dgrpo config show --markdown > docs/config.md   # every option as the documentation's tables
"""


def register(sub: Any) -> None:
    """The subcommands ``demo``, ``bench``, ``data`` and ``config``."""
    _add_demo_parser(sub)
    _add_bench_parser(sub)
    _add_data_parser(sub)
    _add_config_parser(sub)


def _add_demo_parser(sub: Any) -> None:
    """The ``demo`` subcommand: config options, output directory, seeds, workers, and --full or --quick."""
    p = subcommand(
        sub,
        "demo",
        "the paper's claims at CPU scale: SFT seeds x every arm, paired comparisons (95% intervals over seeds)",
        DEMO_EXAMPLES,
    )
    add_config_options(p, "grpo.steps=200")
    p.add_argument(
        "--out",
        default="runs/demo",
        help="output directory (default runs/demo); a demo run again there keeps the runs that finished (--resume)",
    )
    p.add_argument(
        "--resume",
        choices=("auto", "never"),
        default="auto",
        help="auto (default): a run (one SFT run, one RL run) that finished in --out under the same settings, seed, "
        "torch threads and versions of Python, dgrpo, torch and transformers is read back from its record, not trained "
        "again, and the others start over; never: every run starts over (after a change to dgrpo's own code)",
    )
    p.add_argument(
        "--sft-seeds", type=int, default=None, help="SFT checkpoints, one per seed (default 1; --full 4; --quick 2)"
    )
    p.add_argument(
        "--seeds", type=int, default=None, help="RL seeds per arm and SFT checkpoint (default 1; --full 1; --quick 1)"
    )
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        help="processes running the demo's tasks side by side (one SFT run, one RL run each; default one per CPU, 1 on "
        "a GPU); each gets an equal share of the CPUs as torch threads unless --set threads=N",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--full",
        action="store_true",
        help="more SFT seeds: --sft-seeds 4 (4 pairs per comparison, with 95%% intervals; SFT seed 0 is the default's)",
    )
    mode.add_argument(
        "--quick",
        action="store_true",
        help="a smoke test of the whole pipeline with the tiny.yaml config (seconds; numbers mean nothing)",
    )
    p.set_defaults(func=run_demo)


def _add_bench_parser(sub: Any) -> None:
    """The ``bench`` subcommand: its arguments passed on unparsed (the suite's own parser reads them)."""
    p = sub.add_parser(
        "bench", help="the benchmark suite (ratios measured side by side; see bench/RESULTS.md)", add_help=False
    )
    p.add_argument("bench_args", nargs=argparse.REMAINDER, help="--out DIR [--quick] [--only KEYS]")


def _add_data_parser(sub: Any) -> None:
    """The ``data`` subcommand and its ``inspect``."""
    p = subcommand(
        sub, "data", "inspect a dataset: count its records, show the first (dgrpo data inspect)", DATA_EXAMPLES
    )
    dsub = p.add_subparsers(dest="data_cmd", required=True, metavar="COMMAND")
    q = subcommand(dsub, "inspect", INSPECT_HELP, DATA_EXAMPLES, INSPECT_DESCRIPTION)
    q.add_argument(
        "name_or_path",
        metavar="DATA",
        help="a dataset name (gsm8k, svamp, builtin:test?n_test=500, ...), a file or folder, or several joined by '+'",
    )
    q.add_argument("--split", help="the split to read (default: the one the name gives, else test)")
    add_config_options(q, "data.question_key=prompt data.answer_key=target")
    q.set_defaults(func=run_data_inspect)


def _add_config_parser(sub: Any) -> None:
    """The ``config`` subcommand and its ``show``."""
    p = subcommand(
        sub, "config", "every option's default and meaning, or a resolved config (dgrpo config show)", CONFIG_EXAMPLES
    )
    csub = p.add_subparsers(dest="config_cmd", required=True, metavar="COMMAND")
    q = subcommand(csub, "show", SHOW_HELP, CONFIG_EXAMPLES, SHOW_DESCRIPTION)
    q.add_argument(
        "section",
        nargs="?",
        default=None,
        metavar="SECTION",
        help="only this section (model, task, data, sft, eval, perturbation, grpo or logging), or the options whose "
        "key starts with this (grpo.recompute, grpo.lr)",
    )
    q.add_argument(
        "--markdown", action="store_true", help="print every option as docs/config.md (its tables, how configs load)"
    )
    add_config_options(q, "grpo.lr=2e-5")
    q.set_defaults(func=run_config_show)


def run_demo(args: argparse.Namespace) -> int:
    from ..demo import run_demo as demo

    refuse_torchrun(
        "demo",
        "each rank would run every SFT and RL run and race for the output folder; the demo starts "
        "its own worker processes: --workers",
    )
    return demo(args)


def run_data_inspect(args: argparse.Namespace) -> int:
    from ..config import Config, load_config
    from ..data import load_spec

    check_split(args.name_or_path, args.split)
    cfg = load_config(Config, list(args.config), args.overrides)  # the column mapping (data.*), the task (builtin)
    recs = load_spec(args.name_or_path, cfg.task, split=args.split, data=cfg.data)
    print(f"{len(recs)} record{'' if len(recs) == 1 else 's'}")
    example = recs[0].to_dict() if recs else None  # (meta may hold a file's dates or bytes: written as text)
    print(json.dumps({"n": len(recs), "example": example}, default=str))
    return 0


def run_config_show(args: argparse.Namespace) -> int:
    from ..config import Config, ConfigError, config_markdown, describe, load_config, matching_keys, to_dict

    if args.markdown:
        if args.section is not None or args.config or args.overrides:
            raise ConfigError("config show --markdown prints every option's default: no SECTION, --config or --set")
        sys.stdout.write(config_markdown())
        return 0
    defaults = Config()
    sections = [f.name for f in dataclasses.fields(Config) if dataclasses.is_dataclass(getattr(defaults, f.name))]
    keys = matching_keys(Config, args.section) if args.section is not None else []
    if args.section is not None and not keys:
        raise ConfigError(
            f"config show: no option is named by {args.section!r}; expected a section ({', '.join(sections)}) or the "
            "start of a key (grpo.recompute)"
        )
    if not (args.config or args.overrides):
        print("\n".join(describe(Config, section=args.section)))
        return 0
    cfg = load_config(Config, list(args.config), args.overrides)
    resolved = to_dict(cfg)
    if args.section in sections:
        print(json.dumps(resolved[args.section], indent=2))
    elif args.section is not None:  # the named keys' values, flat
        print(json.dumps({k: functools.reduce(getattr, k.split("."), cfg) for k in keys}, indent=2))
    else:
        print(json.dumps(resolved, indent=2))
    return 0
