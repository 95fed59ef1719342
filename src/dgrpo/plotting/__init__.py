"""Plots of finished (or running, or killed) run directories: read ``config.json`` + ``metrics.jsonl``, group the
runs into arms, draw the per-arm mean over seeds with a min-max band, one panel per metric.

matplotlib (Agg canvas, no pyplot state) is imported inside the drawing functions, so importing this package is cheap.
One job per module (each imports only the ones before it): :mod:`.runs` (a run directory read),
:mod:`.arms` (runs grouped into arms) and :mod:`.draw` (the figure). The API (``__all__``) is imported from
``dgrpo.plotting``.
"""

from __future__ import annotations

from .arms import arm_of, axes_of, config_label, group_runs
from .draw import describe, draw, panel_spec, plot, plot_runs, run_series
from .runs import Run, find_runs, load_run

__all__ = [
    "Run",
    "arm_of",
    "axes_of",
    "config_label",
    "describe",
    "draw",
    "find_runs",
    "group_runs",
    "load_run",
    "panel_spec",
    "plot",
    "plot_runs",
    "run_series",
]
