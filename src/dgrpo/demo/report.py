"""The demo's analysis and reports: every paired comparison, the claims' verdicts, results.json / results.md /
summary.txt and the two figures."""

from __future__ import annotations

import json
import shlex
import statistics
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .. import plotting
from ..config import to_dict
from ..text import counted
from .pipeline import ARMS, SHORT, Demo, items_of, say
from .stats import CHECKPOINTS, CLAIMS, LEVEL, claim_verdicts, compare

#: the comparisons reported, A minus B (every one on every test split, for both checkpoints)
COMPARISONS: tuple[tuple[str, str], ...] = (
    ("grpo_deterministic", "sft"),
    ("dropout_grpo", "sft"),
    ("dropout_grpo", "grpo_sampling"),
    ("dropout_grpo", "grpo_null"),
    ("dropout_grpo", "reinforce_ema"),
    ("grpo_null", "sft"),
    ("grpo_sampling", "sft"),
    ("reinforce_ema", "sft"),
)


def model_items(models: Sequence[Mapping[str, Any]], arm: str, checkpoint: str, split: str) -> dict[Any, list[bool]]:
    """Per-item correctness of an arm's models on a split: keyed by (SFT seed, RL seed), or by the SFT seed for SFT."""
    out: dict[Any, list[bool]] = {}
    for m in models:
        if m["arm"] != arm or (arm != "sft" and m["checkpoint"] != checkpoint):
            continue
        key = m["sft_seed"] if arm == "sft" else (m["sft_seed"], m["rl_seed"])
        out[key] = items_of(m["splits"][split]["items"])
    return out


def all_comparisons(models: Sequence[Mapping[str, Any]], splits: Iterable[str]) -> list[dict[str, Any]]:
    """Every comparison of ``COMPARISONS`` on every split, for both checkpoints."""
    out = []
    for split in splits:
        for ckpt in CHECKPOINTS:
            for a, b in COMPARISONS:
                c = compare(model_items(models, a, ckpt, split), model_items(models, b, ckpt, split))
                out.append({"a": a, "b": b, "checkpoint": ckpt, "split": split, **c})
    return out


def arm_accuracies(models: Sequence[Mapping[str, Any]], split: str) -> dict[str, dict[str, list[float]]]:
    """arm -> checkpoint -> accuracies (one per model) on a split."""
    out: dict[str, dict[str, list[float]]] = {}
    for m in models:
        for ckpt in CHECKPOINTS if m["arm"] == "sft" else (m["checkpoint"],):
            out.setdefault(m["arm"], {}).setdefault(ckpt, []).append(m["splits"][split]["accuracy"])
    return out


def analyse(demo: Demo) -> dict[str, Any]:
    """The comparisons, the claims' verdicts and the per-arm diagnostics, as results.json holds them."""
    comparisons = all_comparisons(demo.models, demo.tests)
    std_max: dict[str, float | None] = {}  # an arm's largest; None when one of its runs logged none (not shown 0)
    for run in demo.runs:
        v, before = run["reward_std_max"], std_max.get(run["arm"], run["reward_std_max"])
        std_max[run["arm"]] = None if v is None or before is None else max(before, v)
    return {
        "comparisons": comparisons,
        "claims": claim_verdicts(comparisons, std_max, next(iter(demo.tests))),
        "accuracy": {s: arm_accuracies(demo.models, s) for s in demo.tests},
        "reward_std_max": std_max,
    }


def _pct(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{100 * x:.{digits}f}%"


def _ci_text(c: Mapping[str, Any]) -> str:
    """The mean difference and its interval; none with one SFT seed, whatever its number of pairs (RL seeds): the
    interval is over the SFT seeds (it said "1 pair" beside "3 pairs" for 1 SFT seed x 3 RL seeds)."""
    if not c.get("n_pairs"):
        return "no pairs"
    interval = "no interval (1 SFT seed)" if c["lo"] is None else f"[{c['lo']:+.2f}, {c['hi']:+.2f}]"
    return f"{c['mean']:+.2f} {interval}"


def accuracy_table(res: Mapping[str, Any]) -> list[str]:
    """Rows = arms; per split, the best-validation and the final checkpoint: mean ± std over models, in %."""
    splits = list(res["splits"])
    head = "| Model | models | " + " | ".join(f"{s}: {c}" for s in splits for c in ("best-valid ckpt", "final")) + " |"
    lines = [head, "|" + "---|" * (2 + 2 * len(splits))]
    for arm, (label, _) in ARMS.items():
        acc = res["analysis"]["accuracy"]
        if arm not in acc[splits[0]]:
            continue
        cells = []
        for s in splits:
            for ckpt in CHECKPOINTS:
                xs = acc[s][arm][ckpt]
                sd = f" ± {100 * statistics.stdev(xs):.2f}" if len(xs) > 1 else ""
                cells.append(f"{100 * statistics.fmean(xs):.2f}%{sd}")
        lines.append(f"| {label} | {len(acc[splits[0]][arm]['final'])} | " + " | ".join(cells) + " |")
    return lines


def comparison_table(res: Mapping[str, Any], split: str) -> list[str]:
    """The paired comparisons on one split: mean difference in points, its CI (:data:`LEVEL`), pairs, items gained /
    lost."""
    lines = [
        f"| A vs B | checkpoint | A - B, points ({LEVEL:.0%} CI) | pairs | items gained / lost per pair (of n) |",
        "|---|---|---|---|---|",
    ]
    for c in res["analysis"]["comparisons"]:
        if c["split"] != split or not c["n_pairs"]:
            continue
        name = f"{SHORT.get(c['a'], 'SFT')} vs {SHORT.get(c['b'], 'SFT')}"
        ckpt = "best-valid" if c["checkpoint"] == "best" else "final"
        items = f"+{_mean_count([c['gained']])} / -{_mean_count([c['lost']])} (n={c['n_items']})"  # (0.04: not +0.0)
        lines.append(f"| {name} | {ckpt} | {_ci_text(c)} | {c['n_pairs']} | {items} |")
    return lines


def claim_lines(res: Mapping[str, Any]) -> list[str]:
    """One line per claim: the verdict under the paper's protocol (best-validation checkpoint) and at the end."""
    lines = []
    for claim in CLAIMS:
        rows = {r["checkpoint"]: r for r in res["analysis"]["claims"] if r["id"] == claim.id}
        parts = []
        for ckpt, name in (("best", "best-valid checkpoint"), ("final", "final checkpoint")):
            r = rows[ckpt]
            num = "" if r["mean"] is None else f" ({_ci_text(r)} points, {r['n_pairs']} pairs)"
            if claim.kind == "exact" and r["n_pairs"]:
                gained, lost = _mean_count([r["gained"]]), _mean_count([r["lost"]])
                num = f" ({gained} items gained, {lost} lost per pair; {r['n_pairs']} pairs)"
            parts.append(f"{name}: **{r['verdict']}**{num}")
        lines.append(f"{claim.id}. {claim.text}: " + "; ".join(parts))
    return lines


def diagnostics_table(res: Mapping[str, Any]) -> list[str]:
    """Per arm, mean over its runs: within-group reward std, kept fraction, distinct answers (first -> last 10
    steps), steps that updated the model, and the best-validation checkpoint's step."""
    lines = [
        "| arm | reward std | groups kept | distinct answers / group | updating steps | best-valid step |",
        "|---|---|---|---|---|---|",
    ]
    for arm in SHORT:
        runs = [r for r in res["runs"] if r["arm"] == arm]
        if not runs:
            continue
        cells = []
        for key in ("reward_std", "frac_groups_kept", "distinct_answers"):
            first, last = ([r[key][i] for r in runs if r[key][i] is not None] for i in (0, 1))
            cells.append(f"{_mean3(first)} -> {_mean3(last)}" if first or last else "-")
        steps = ", ".join(str(r["best_step"]) for r in runs)
        cells += [f"{_mean_count(r['updates'] for r in runs)} of {res['steps']}", steps]
        lines.append(f"| {SHORT[arm]} | " + " | ".join(cells) + " |")
    return lines


def _mean3(values: list[float]) -> str:
    """A mean to 3 decimals; "-" of none (a run with the first steps' value and not the last's)."""
    return f"{statistics.fmean(values):.3f}" if values else "-"


def _mean_count(counts: Iterable[float]) -> str:
    """A mean of counts, as short as exact to 2 decimals: 49.75 stays 49.75 (rounded to 50, "50 of 50" updating
    steps read as every step of every run, where one run skipped one; 0.25 items gained per pair read as 0)."""
    return f"{statistics.fmean(counts):.2f}".rstrip("0").rstrip(".")


def sft_table(res: Mapping[str, Any]) -> list[str]:
    """Per SFT seed: its accuracies, and Dropout-GRPO minus it and minus token sampling per RL seed (test)."""
    splits = list(res["splits"])
    lines = [
        "| SFT seed | valid | " + " | ".join(splits) + " | Dropout-GRPO - SFT (best / final) | "
        "Dropout-GRPO - token sampling (best / final) |",
        "|" + "---|" * (4 + len(splits)),
    ]
    by = {(c["a"], c["b"], c["checkpoint"]): c for c in res["analysis"]["comparisons"] if c["split"] == res["headline"]}
    for m in (m for m in res["models"] if m["arm"] == "sft"):
        s = m["sft_seed"]
        cells = [f"{100 * m['valid_accuracy']:.1f}%"] + [f"{100 * m['splits'][x]['accuracy']:.2f}%" for x in splits]
        for b in ("sft", "grpo_sampling"):
            per = []
            for ckpt in CHECKPOINTS:
                ds = [p["diff"] for p in by.get(("dropout_grpo", b, ckpt), {}).get("pairs", []) if p["sft_seed"] == s]
                per.append(", ".join(f"{d:+.2f}" for d in ds) or "-")
            cells.append(" / ".join(per))
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    return lines


def results_markdown(res: Mapping[str, Any]) -> str:
    """results.md: the claims, the paired comparisons, the accuracy table, per-SFT-seed numbers, diagnostics."""
    n_test = ", ".join(f"{s} n={n}" for s, n in res["splits"].items())
    out = [
        f"# dgrpo demo: {counted(res['n_sft'], 'SFT seed')} x {counted(res['n_rl'], 'RL seed')} per arm"
        f"{_deterministic_once(res)}",
        "",
        f"Command: `{res['command']}`. Wall time {_wall_text(res)}. Test splits: {n_test}; greedy pass@1,"
        " no dropout. `best-valid` = each run's best post-warmup validation checkpoint (the paper's protocol),"
        " `final` = its last checkpoint. A vs B pairs runs that share the SFT checkpoint and the RL seed; the interval"
        f" is a {LEVEL:.0%} t-interval over the SFT checkpoints, each one's pair differences averaged first (points).",
        "",
        f"## Claims ({res['headline']} split)",
        "",
        *claim_lines(res),
        "",
        "Rule: A > B is resolved when the interval of A - B lies above 0 (contradicted when it lies below), A < B "
        "when it lies below 0 (contradicted when it lies above); A <= B is resolved when it lies at or below 0; an "
        "interval of zero width (every SFT seed's difference the same) resolves nothing; claim 1 needs every item "
        "equal and a within-group reward std of exactly 0 at every step. The intervals count the variation between "
        f"training runs (SFT seeds), not that of drawing other test items; each claim is judged at {LEVEL:.0%} on its "
        f"own, {_no_correction()}.",
    ]
    for split in res["splits"]:
        out += ["", f"## Paired comparisons: {split}", "", *comparison_table(res, split)]
    out += ["", "## Accuracy (mean ± std over models)", "", *accuracy_table(res)]
    out += ["", f"## Per SFT seed ({res['headline']}; differences in points, one per RL seed)", "", *sft_table(res)]
    out += ["", "## Training diagnostics (mean over runs; first 10 -> last 10 steps)", "", *diagnostics_table(res)]
    return "\n".join(out) + "\n"


def summary_paragraph(res: Mapping[str, Any]) -> str:
    """summary.txt: one paragraph, every claim's verdict with its numbers."""
    headline = res["headline"]
    acc = res["analysis"]["accuracy"][headline]
    sft = acc["sft"]["final"]
    head = (
        f"{counted(res['n_sft'], 'Coconut SFT checkpoint')} score{'s' if res['n_sft'] == 1 else ''} "
        f"{_pct(statistics.fmean(sft))} on average on the built-in "
        f"{headline} split (n={res['splits'][headline]}; per seed "
        + ", ".join(_pct(x, 1) for x in sft)
        + f"); every RL arm ran {counted(res['n_rl'], 'seed')} from each{_deterministic_once(res)}. Paired over "
        f"(SFT seed, RL seed), {LEVEL:.0%} t-intervals, points: "
    )
    parts = []
    for claim in CLAIMS:
        rows = {r["checkpoint"]: r for r in res["analysis"]["claims"] if r["id"] == claim.id}
        b, f = rows["best"], rows["final"]
        if claim.kind == "exact":
            items = f"{_mean_count([b['gained'] or 0])} items gained and {_mean_count([b['lost'] or 0])} lost per pair"
            parts.append(f"({claim.id}) {claim.text}: {b['verdict']} ({items}; reward std {_std_note(res)})")
        else:
            parts.append(
                f"({claim.id}) {claim.text}: best-valid checkpoint {_ci_text(b)} {b['verdict']}; final {_ci_text(f)} "
                f"{f['verdict']}"
            )
    return head + "; ".join(parts) + f". Total wall time {_wall_text(res)}."


def _wall_text(res: Mapping[str, Any]) -> str:
    """The demo's wall time, and how many of its runs were read back from an earlier run's records (not run)."""
    n, runs = len(res.get("read_back", [])), len([k for k in res["wall_s"] if k != "total"])
    return f"{res['wall_s']['total']:.0f} s" + (f" ({n} of {runs} runs read back from an earlier run)" if n else "")


def _deterministic_once(res: Mapping[str, Any]) -> str:
    """With several RL seeds, that the deterministic arm ran once per SFT seed (it said that every arm ran each)."""
    return " (the deterministic arm 1: it cannot update, whatever its seed)" if res["n_rl"] > 1 else ""


def _no_correction() -> str:
    """The chance of a verdict by chance alone, with the claims judged by interval at both checkpoints."""
    n = sum(claim.kind != "exact" for claim in CLAIMS)
    each, both = 1 - LEVEL**n, 1 - LEVEL ** (2 * n)
    return (
        f"with no correction for judging {n} claims by interval at two checkpoints (were every true difference 0, "
        f"each of the {2 * n} intervals would resolve or contradict its claim 1 time in {round(1 / (1 - LEVEL))}, "
        f"and {each:.0%} to "
        f"{both:.0%} of runs would show one such verdict by chance: {both:.0%} were the {2 * n} independent, "
        f"{each:.0%} were each run's two checkpoints the same model)"
    )


def _std_note(res: Mapping[str, Any]) -> str:
    v = res["analysis"]["reward_std_max"].get("grpo_deterministic")
    return "not logged" if v is None else "identically 0" if v == 0 else f"up to {v:.4g}"


def plot_figures(res: Mapping[str, Any], out: Path) -> list[str]:
    """eval_accuracy.png (validation accuracy over steps) and reward_std.png (within-group reward std and the kept
    fraction over steps), arms grouped, seeds as a band, drawn by :mod:`dgrpo.plotting`."""
    groups = {SHORT[arm]: [plotting.load_run(r["dir"]) for r in res["runs"] if r["arm"] == arm] for arm in SHORT}
    groups = {k: v for k, v in groups.items() if v}
    sft_valid = [m["valid_accuracy"] for m in res["models"] if m["arm"] == "sft"]
    seeds = "1 seed" if len(sft_valid) == 1 else f"mean of {len(sft_valid)} seeds"
    ref = {f"Coconut SFT ({seeds})": statistics.fmean(sft_valid)}
    descs = [
        plotting.plot_runs(groups, out / "eval_accuracy.png", panels=("eval",), reference=ref),
        plotting.plot_runs(groups, out / "reward_std.png", panels=("reward_std", "kept")),
    ]
    return [plotting.describe(d) for d in descs]


def write_results(demo: Demo, command: str, n_sft: int, n_rl: int, quiet: bool = False) -> dict[str, Any]:
    """results.json, results.md, summary.txt and the figures in the output folder (``quiet``: without saying so);
    returns the results."""
    res: dict[str, Any] = {
        "command": command,
        "headline": next(iter(demo.tests)),
        "n_sft": n_sft,
        "n_rl": n_rl,
        "steps": demo.base.grpo.steps,
        "splits": {s: len(r) for s, r in demo.tests.items()},
        "n_valid": len(demo.valid),
        "labels": {a: v[0] for a, v in ARMS.items()},
        "config": to_dict(demo.base),
        "models": demo.models,
        "runs": demo.runs,
        "wall_s": demo.wall,
        "read_back": demo.read_back,
    }
    res["analysis"] = analyse(demo)
    (demo.out / "results.json").write_text(json.dumps(res, indent=1))
    (demo.out / "results.md").write_text(results_markdown(res))
    (demo.out / "summary.txt").write_text(summary_paragraph(res) + "\n")
    for line in plot_figures(res, demo.out):
        if not quiet:
            say(line)
    return res


def command_line(args: Any, program: str = "dgrpo demo", extra: Sequence[str] = ()) -> str:
    """The command that reproduces this run (each value quoted as a shell needs it: ``--set 'data.test=[a, b]'``):
    ``program`` with the demo's options (``--workers`` when given: it sets each task's threads, so the last float
    bits), then ``extra`` (a script's own, as written) before ``--out``."""
    parts = [program]
    parts += ["--quick"] if args.quick else ["--full"] if getattr(args, "full", False) else []
    given = (("--sft-seeds", "sft_seeds"), ("--seeds", "seeds"), ("--workers", "workers"))
    for flag, value in ((flag, getattr(args, name, None)) for flag, name in given):
        parts += [f"{flag} {value}"] if value is not None else []
    parts += [f"--config {shlex.quote(str(c))}" for c in args.config]
    parts += [f"--set {shlex.quote(o)}" for o in args.overrides]
    return " ".join([*parts, *extra, f"--out {shlex.quote(str(args.out))}"])
