"""The figure: each group's per-step mean over its seeds with a min-max band, one panel per metric, fixed colours for
the well-known arms (:func:`draw`, :func:`plot_runs`, :func:`plot`; matplotlib's Agg canvas, imported inside the
drawing functions)."""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..data.records import DataError

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
from .arms import (
    _check_eval_key,
    _check_one_dataset_per_group,
    _check_one_kind_per_group,
    _check_reward_parts,
    _eval_key,
    _number,
    _warn_if_a_group_validated_on_other_data,
    _warn_if_scorers_differ,
    axes_of,
    config_label,
    group_runs,
)
from .runs import GRPO_AXIS, REWARD_PART, SFT_EVAL, Run, _config_get, _eval_parts, _load_found, find_runs

FORMATS = (".png", ".pdf", ".svg")

#: panel name -> (metrics key, y-axis label, panel title); the eval key is resolved per run
PANELS: dict[str, tuple[str, str, str]] = {
    "eval": ("eval", "validation accuracy (greedy, no dropout)", "accuracy during training"),
    "reward_std": ("reward_std", "within-group reward std", "rollout diversity within groups"),
    "reward_mean": ("reward_mean", "mean rollout reward", "rollout reward"),
    "kept": ("frac_groups_kept", "fraction of groups kept", "groups with a learning signal"),
    "distinct": ("distinct_answers", "distinct answers per group", "answer diversity within groups"),
}

#: the fixed colours of the well-known arms (keys: the label lower-cased, letters and digits only)
ARM_COLORS = {
    "deterministic": "#7f7f7f",
    "reinforceema": "#d62728",
    "reinforce": "#d62728",
    "tokensampling": "#ff7f0e",
    "dropoutgrpo": "#1f77b4",
    "sft": "#000000",
}
#: colours for every other group, in order (tab10 without the fixed ones)
OTHER_COLORS = ("#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf")
REFERENCE_STYLES = (("#000000", "--"), ("#555555", (0, (6, 3))), ("#555555", (0, (2, 2))), ("#555555", "-."))


def _eval_keys(groups: Mapping[str, Sequence[Run]], eval_key: str | None) -> list[str]:
    """The eval columns a figure shows, sorted."""
    return sorted({key for runs in groups.values() for r in runs if (key := _eval_key(r, eval_key))})


def panel_spec(panel: str) -> tuple[str, str, str] | None:
    """(metrics key, y-axis label, title) of a panel: one of :data:`PANELS`, or ``reward/<name>`` (a reward part's
    mean a run logs); None for an unknown name."""
    if panel.startswith(REWARD_PART) and len(panel) > len(REWARD_PART):
        part = panel[len(REWARD_PART) :]
        return panel, f"mean of reward part {part}", f"reward part {part}"
    return PANELS.get(panel)


def _panel(panel: str) -> tuple[str, str, str]:
    spec = panel_spec(panel)
    assert spec is not None, panel  # (draw checks the names first)
    return spec


def run_series(run: Run, panel: str, eval_key: str | None = None) -> dict[int, float]:
    """step -> value of one panel's metric in one run (missing, null and non-finite values left out)."""
    key = _eval_key(run, eval_key) if panel == "eval" else _panel(panel)[0]
    rows = run.evals if panel == "eval" else run.steps
    series: dict[int, float] = {}
    for r in rows:
        v = _number(r.get(key)) if key else None
        if v is not None and _number(r.get("step")) is not None:
            series[int(r["step"])] = v
    return series


def _missing_note(group: str, runs: Sequence[Run], panel: str, eval_key: str | None) -> str:
    """Why a group has nothing to show in a panel, in a few words."""
    if not runs:  # (a group of none: its eval note read runs[0], an IndexError traceback)
        return f"{group}: no runs"
    if panel != "eval" and not any(r.is_grpo for r in runs):
        return f"{group}: no GRPO steps"
    if panel == "reward_std" and all(_config_get(r.config, "grpo.group_size") == 1 for r in runs):
        return f"{group}: no within-group std (K = 1)"
    if panel == "eval":
        return f"{group}: no {_eval_key(runs[0], eval_key) or 'eval'} rows"
    return f"{group}: no {_panel(panel)[0]} values"


def aggregate(series: Sequence[dict[int, float]]) -> tuple[list[int], list[float], list[float], list[float]]:
    """Steps shared by all series, and the mean, min and max over the series at each."""
    shared = sorted(set.intersection(*(set(s) for s in series))) if series else []
    cols = [[s[t] for s in series] for t in shared]
    return shared, [sum(c) / len(c) for c in cols], [min(c) for c in cols], [max(c) for c in cols]


# ------------------------------------------------------------------------ drawing
def _norm(label: str) -> str:
    return re.sub(r"[^a-z0-9]", "", label.lower())


def group_colors(groups: Mapping[str, Sequence[Run]]) -> dict[str, str]:
    """A colour per group: the fixed one of a well-known arm (by name, else by its runs' config), else the cycle."""
    colors: dict[str, str] = {}
    for name in groups:
        c = ARM_COLORS.get(_norm(name))
        if c is not None and c not in colors.values():
            colors[name] = c
    for name, runs in groups.items():
        labels = {_norm(config_label(r)) for r in runs}
        c = ARM_COLORS.get(labels.pop()) if len(labels) == 1 else None
        if name not in colors and c is not None and c not in colors.values():
            colors[name] = c
    cycle = [c for c in OTHER_COLORS if c not in colors.values()] or list(OTHER_COLORS)
    for i, name in enumerate(n for n in groups if n not in colors):
        colors[name] = cycle[i % len(cycle)]
    return colors


def _draw_panel(
    ax: Axes,
    panel: str,
    groups: Mapping[str, Sequence[Run]],
    colors: Mapping[str, str],
    eval_key: str | None,
    reference: Mapping[str, float],
    xlabel: str = GRPO_AXIS,
    sft_apart: bool = False,
) -> dict[str, Any]:
    """One panel: per group the mean line (+ min-max band), the reference lines, the legend below the axes; the x
    axis labelled ``xlabel``, and the title marked SFT's when ``sft_apart`` (the SFT groups' own eval panel)."""
    from matplotlib.lines import Line2D

    handles: list[tuple[Any, str]] = []
    drawn: dict[str, int] = {}
    bands: list[str] = []
    notes: list[str] = []
    for name, runs in groups.items():
        series = [s for s in (run_series(r, panel, eval_key) for r in runs) if s]
        steps, mean, lo, hi = aggregate(series)
        if not steps:
            notes.append(_missing_note(name, runs, panel, eval_key) if not series else f"{name}: runs share no step")
            continue
        last = [max(s) for s in series]
        if steps[-1] < max(last):  # the mean is over the steps every seed logged: say where it stops, and why
            why = (
                f"where its shortest run stops (the longest: {max(last)})"
                if steps[-1] == min(last)
                else f"the last step all its runs logged (they stop at {min(last)} to {max(last)})"
            )
            notes.append(f"{name}: mean to step {steps[-1]}, {why}")
        marker = "o" if len(steps) <= 30 else None
        (line,) = ax.plot(steps, mean, color=colors[name], lw=2, marker=marker, ms=3.5)
        drawn[name] = len(steps)
        if len(series) >= 2:
            band = ax.fill_between(steps, lo, hi, color=colors[name], alpha=0.18, lw=0)
            bands.append(name)
            handles.append(((line, band), f"{name}: mean of {len(series)} seeds (band: min-max)"))
        else:
            handles.append((line, name))
    if panel == "eval":  # reference values are accuracies
        for i, (ref_name, value) in enumerate(reference.items()):
            color, ls = REFERENCE_STYLES[i % len(REFERENCE_STYLES)]
            handles.append((ax.axhline(value, color=color, ls=ls, lw=1.2), f"{ref_name} ({value:.3g})"))
    if not handles and not notes:
        notes.append("no data")
    handles += [(Line2D([], [], ls="none"), note) for note in notes]
    _finish_axes(ax, panel, groups, eval_key, handles, len(notes), xlabel, sft_apart)
    return {"groups": drawn, "lines": len(ax.get_lines()), "bands": bands, "notes": notes}


def _finish_axes(
    ax: Axes,
    panel: str,
    groups: Mapping[str, Sequence[Run]],
    eval_key: str | None,
    handles: list,
    n_notes: int,
    xlabel: str = GRPO_AXIS,
    sft_apart: bool = False,
) -> None:
    """Labels, title, grid, and the legend below the axes (outside them; notes last, in grey italics)."""
    from matplotlib.legend_handler import HandlerTuple
    from matplotlib.ticker import MaxNLocator
    from matplotlib.transforms import ScaledTranslation

    _, ylabel, title = _panel(panel)
    if panel == "eval":
        parts = [_eval_parts(k) for k in _eval_keys(groups, eval_key)]
        names, what = [n for n, _ in parts], "accuracy"
        if parts and all(m == "mean_score" for _, m in parts):
            what = ylabel = "mean score"
        if names and (what != "accuracy" or not all("valid" in n for n in names)):
            ylabel = f"{what} (greedy, no dropout)"
        title = f"{what} on {', '.join(names)}" if names else title
    ax.set_xlabel(xlabel)
    title = f"SFT: {title}" if sft_apart else title
    # (steps are whole: no 0.2 ticks on a short run, nor 3.85 on a run of one point, whose range is under a step)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    _floor_at_zero(ax)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=11)
    ax.grid(alpha=0.3)
    fig = ax.get_figure()
    assert fig is not None
    below = ax.transAxes + ScaledTranslation(0, -0.6, fig.dpi_scale_trans)  # clear of tick labels and x label
    legend = ax.legend(
        [h for h, _ in handles],
        [label for _, label in handles],
        loc="upper center",
        bbox_to_anchor=(0.5, 0.0),
        bbox_transform=below,
        fontsize=9,
        frameon=False,
        handler_map={tuple: HandlerTuple(ndivide=1)},
    )
    for text in legend.get_texts()[len(handles) - n_notes :]:
        text.set_color("#555555")
        text.set_fontstyle("italic")


def _floor_at_zero(ax: Axes) -> None:
    """The y axis from 0 where autoscaling put its bottom below 0 and nothing drawn is negative (flat zero curves,
    an untrained model's: an accuracy or a std of -0.04 is not a value they can take). What is drawn: the data
    limits, the seeds' min-max bands with the curves (a band below 0, a seed's negative mean reward, is not cut)."""
    if ax.dataLim.y0 >= 0.0 and ax.get_ylim()[0] < 0.0:
        ax.set_ylim(bottom=0.0)


def _check_math_text(texts: Sequence[tuple[str, str]]) -> None:
    """DataError naming a text of the figure (``(what, text)``: the title, a group's or a reference's name) that
    matplotlib cannot draw: one with a pair of unescaped ``$`` is math text to it (``$p_0$``), and math text it cannot
    parse (``$\\badcmd$``) raised a ValueError traceback once the figure was laid out."""
    from matplotlib import cbook
    from matplotlib.mathtext import MathTextParser

    parser = MathTextParser("path")
    for what, text in texts:
        if not cbook.is_math_text(text):
            continue
        try:
            parser.parse(text)
        except ValueError as e:
            reason = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
            raise DataError(
                f"{what} '{text}': matplotlib reads the text between two $ as math text and cannot draw it "
                f"({reason}); write a literal dollar as \\$"
            ) from None


def check_format(out: str | Path) -> str:
    """The figure format from the file suffix (png, pdf or svg); a :class:`DataError` otherwise."""
    suffix = Path(out).suffix.lower()
    if suffix not in FORMATS:
        raise DataError(f"{out}: unknown figure format {suffix or '(no suffix)'!r}; use .png, .pdf or .svg")
    return suffix[1:]


def draw(
    groups: Mapping[str, Sequence[Run]],
    *,
    panels: Sequence[str] = ("eval", "reward_std"),
    eval_key: str | None = None,
    reference: Mapping[str, float] | None = None,
    title: str | None = None,
) -> tuple[Figure, dict[str, Any]]:
    """The figure (panels side by side) and the description :func:`plot_runs` returns; nothing is written.
    ``panels`` may be one panel's name."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    panels = (panels,) if isinstance(panels, str) else tuple(panels)
    unknown = [p for p in panels if panel_spec(p) is None]
    if unknown or not panels:
        raise DataError(
            f"unknown panel(s) {', '.join(unknown) or '(none)'}; choose from {', '.join(PANELS)} or "
            f"{REWARD_PART}<part> (a reward part the runs log)"
        )
    if not any(groups.values()):
        raise DataError("no runs to plot")
    everyone = [r for runs in groups.values() for r in runs]
    if "eval" not in panels and (reference or eval_key):  # (both drawn in the eval panel only: dropped unsaid)
        given = [n for n, v in (("the reference lines", reference), ("the eval key", eval_key)) if v]
        verb = "goes" if given == ["the eval key"] else "go"
        warnings.warn(
            f"{' and '.join(given)} {verb} to the eval panel, which the panels ({', '.join(panels)}) leave out",
            stacklevel=2,
        )
    if eval_key and "eval" in panels:
        _check_eval_key(everyone, eval_key)
    _check_reward_parts(everyone, panels)
    if "eval" in panels:
        _check_one_kind_per_group(groups)
        _check_one_dataset_per_group(groups, eval_key)
        _warn_if_a_group_validated_on_other_data(groups, eval_key)
        _warn_if_scorers_differ(everyone)
    texts = [("the title", title or ""), *(("the group", n) for n in groups)]
    _check_math_text([*texts, *(("the reference", n) for n in reference or {})])
    axes = axes_of(panels, groups)
    rows = len(groups) + len(reference or {}) + 1
    fig = Figure(figsize=(6 * len(axes), 4 + 0.6 + 0.22 * rows))
    FigureCanvasAgg(fig)
    colors = group_colors(groups)
    desc: dict[str, Any] = {"panels": {}, "lines": {}, "bands": {}, "notes": {}}
    for ax, (key, panel, drawn, xlabel) in zip(fig.subplots(1, len(axes), squeeze=False)[0], axes):
        d = _draw_panel(ax, panel, drawn, colors, eval_key, reference or {}, xlabel, sft_apart=key == SFT_EVAL)
        for k in ("groups", "lines", "bands", "notes"):
            desc["panels" if k == "groups" else k][key] = d[k]
    desc["eval_keys"] = _eval_keys(groups, eval_key)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig, desc


def plot_runs(
    groups: Mapping[str, Sequence[Run]],
    out: str | Path,
    *,
    panels: Sequence[str] = ("eval", "reward_std"),
    eval_key: str | None = None,
    reference: Mapping[str, float] | None = None,
    title: str | None = None,
) -> dict[str, Any]:
    """Draw the groups' runs into ``out`` (.png, .pdf or .svg, by the suffix): one panel per metric.

    Panels (a list, or one name): ``eval`` (``eval/<name>/accuracy``, ``eval_key`` or each run's first),
    ``reward_std``, ``reward_mean``, ``kept`` (frac_groups_kept), ``distinct`` (distinct_answers), ``reward/<part>``
    (one part of ``grpo.rewards``, as logged). Per group the mean over its runs on the steps they
    share, with a min-max band when it has >= 2 runs; ``reference`` values are dashed lines in the eval panel.
    The x axis is GRPO steps; an SFT group's validation curve is over its optimizer steps, in a panel of its own
    (:data:`SFT_EVAL`, after ``eval``) when GRPO groups are drawn too (:func:`axes_of`); a group holding runs of
    both is a :class:`DataError`.
    Returns ``{"panels": {panel: {group: n_points}}, "lines": {panel: n_Line2D}, "bands": {panel: [group]},
    "notes": {panel: [note]}, "eval_keys": [...], "out": path}`` (``panel``: :data:`SFT_EVAL` for that one).
    """
    fmt = check_format(out)
    fig, desc = draw(groups, panels=panels, eval_key=eval_key, reference=reference, title=title)
    out = Path(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, format=fmt, dpi=120, bbox_inches="tight")
    except OSError as e:  # a file where a folder should be, a folder named like the figure, no permission
        raise DataError(f"{out}: cannot write the figure there ({e.strerror or e})") from None
    desc["out"] = str(out)
    return desc


def plot(
    paths: Sequence[str | Path],
    out: str | Path,
    *,
    groups: Mapping[str, Sequence[str | Path]] | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """Find, load and group the runs under ``paths`` (``groups`` overrides the grouping), then :func:`plot_runs`.
    A run that logged no step yet (one that crashed at start) is skipped with a warning, unless it is the only one."""
    check_format(out)
    runs = _load_found(find_runs(paths))
    return plot_runs(group_runs(runs, groups), out, **kwargs)


def describe(desc: Mapping[str, Any]) -> str:
    """One line: the output path and what each panel shows."""
    parts = []
    for panel, drawn in desc["panels"].items():
        notes = f", {len(desc['notes'][panel])} note(s)" if desc["notes"][panel] else ""
        parts.append(f"{panel}: {len(drawn)} group(s), {desc['lines'][panel]} line(s){notes}")
    return f"{desc.get('out', '')}: " + "; ".join(parts)
