"""``dgrpo plot``: figures of run directories (eval accuracy, within-group reward std, ... over steps)."""

from __future__ import annotations

import argparse
from typing import Any

from .common import refuse_torchrun, subcommand

PLOT_EXAMPLES = """  dgrpo plot runs/demo/arms --out runs/demo/arms.png    # every run below it, by arm, mean over seeds
  dgrpo plot runs/grpo runs/sampling --out fig.pdf --reference "Coconut SFT=0.247"
  dgrpo plot runs/a_seed0 runs/a_seed1 runs/b --panels eval,reward_std,reward_mean,kept,distinct --out fig.svg
  dgrpo plot --label "Dropout-GRPO=runs/p01_s0,runs/p01_s1" --label "p = 0.2=runs/p02" --out sweep.png
  dgrpo plot runs/grpo --eval-key valid --title "Dropout-GRPO, p = 0.1" --out fig.png
"""


def register(sub: Any) -> None:
    p = subcommand(sub, "plot", "plot runs: eval accuracy and rollout diagnostics over steps, per arm", PLOT_EXAMPLES)
    p.add_argument(
        "runs",
        nargs="*",
        metavar="RUN",
        help="run directories (with metrics.jsonl), or directories holding them (searched recursively)",
    )
    p.add_argument("--out", required=True, help="the figure file; the format follows the suffix: .png, .pdf, .svg")
    p.add_argument(
        "--panels",
        default="eval,reward_std",
        help="comma list of panels, side by side: eval, reward_std, reward_mean, kept, distinct, reward/<part> (a part "
        "of grpo.rewards the runs log) (default %(default)s); x: GRPO steps, and an SFT run's eval over its "
        "optimizer steps (beside GRPO runs: a panel of its own)",
    )
    p.add_argument(
        "--label",
        action="append",
        default=[],
        metavar="NAME=RUN[,RUN...]",
        help="put these runs in the group NAME (overrides the grouping by seed suffix / config; repeatable): one "
        "mean over them all, with a warning where their configs differ in more than the seed; a NAME that the other "
        "runs' grouping gives too is refused (add those runs to the label, or choose another name); a run in two "
        "labels is drawn in each, with a warning",
    )
    p.add_argument(
        "--eval-key",
        help="which eval/<name>/accuracy to plot, e.g. valid (also a run's builtin:valid; default: each run's "
        "first), or eval/<name>/mean_score (a partial-credit scorer's mean)",
    )
    p.add_argument(
        "--reference",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help='a dashed horizontal line in the eval panel, e.g. "Coconut SFT=0.247" (repeatable)',
    )
    p.add_argument("--title", help="a title over the figure")
    p.set_defaults(func=run_plot)


def _exists(path: str) -> bool:
    """Whether ``path`` exists, a leading ``~`` read as the home folder (as ``dgrpo plot`` reads it)."""
    from ..paths import expand_home

    return expand_home(path).exists()


def _split_pair(v: str) -> tuple[str, str, str]:
    """``NAME=RUN[,RUN...]`` split at the first ``=`` after which every run exists (a name may hold ``=``: ``p =
    0.2=runs/p02``; so may a path), else at the first ``=``."""
    cuts = [i for i, c in enumerate(v) if c == "="]
    for i in cuts:
        runs = [p.strip() for p in v[i + 1 :].split(",") if p.strip()]
        if runs and all(_exists(p) for p in runs):
            return v[:i], "=", v[i + 1 :]
    return v.partition("=")


def parse_pairs(values: list[str], option: str) -> list[tuple[str, str]]:
    """``NAME=VALUE`` strings as pairs; a :class:`DataError` naming the option for a malformed one. A ``--label``
    splits as :func:`_split_pair` says, a ``--reference`` at its last ``=`` (its value is a number, its name may hold
    ``=``: ``"SFT (p = 0.1)=0.247"``)."""
    from ..data.records import DataError

    pairs = []
    for v in values:
        name, sep, value = _split_pair(v) if option == "--label" else v.rpartition("=")
        if not sep or not name.strip() or not value.strip():
            raise DataError(f"{option} wants {'NAME=RUN[,RUN...]' if option == '--label' else 'NAME=VALUE'}, got {v!r}")
        pairs.append((name.strip(), value.strip()))
    return pairs


def run_plot(args: argparse.Namespace) -> int:
    from ..data.records import DataError
    from ..plotting import describe, plot

    refuse_torchrun("plot", "each rank would write the same files at once")
    reference: dict[str, float] = {}
    for name, value in parse_pairs(args.reference, "--reference"):
        try:
            number = float(value)
        except ValueError:
            raise DataError(f"--reference {name}: {value!r} is not a number (NAME=VALUE)") from None
        if not 0.0 <= number <= 1.0:  # (a percentage would squash the runs' accuracies to the bottom of the panel)
            raise DataError(f"--reference {name}={value}: an accuracy as the runs log it, a fraction in [0, 1]")
        if name in reference:
            raise DataError(f"--reference {name}: given twice ({reference[name]:g} and {value})")
        reference[name] = number
    groups: dict[str, list[str]] = {}
    for name, paths in parse_pairs(args.label, "--label"):
        groups.setdefault(name, []).extend(p.strip() for p in paths.split(",") if p.strip())
    if not args.runs and not groups:
        raise DataError("no runs given: name run directories, or groups with --label NAME=RUN[,RUN...]")
    panels = tuple(dict.fromkeys(p.strip() for p in args.panels.split(",") if p.strip()))  # (a panel named twice: once)
    desc = plot(
        args.runs,
        args.out,
        groups=groups,
        panels=panels,
        eval_key=args.eval_key,
        reference=reference,
        title=args.title,
    )
    print(describe(desc))
    return 0
