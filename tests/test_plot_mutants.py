"""Fast checks of :mod:`dgrpo.plotting` found by mutation testing: the data a figure draws (the mean over seeds and
its min-max band on the steps all seeds share, each run's series), checked by hand on small numbers; no pixels."""

from pathlib import Path

import numpy as np
import pytest

from dgrpo.data.records import DataError
from dgrpo.plotting import draw, group_runs, load_run, run_series
from dgrpo.plotting.draw import aggregate

from conftest import write_run

EVAL = "eval/valid/accuracy"


def test_aggregate_is_mean_min_and_max_over_seeds_on_the_steps_all_share() -> None:
    """Three seeds; step 3 only in two of them, so it is left out."""
    series = [{1: 0.0, 2: 0.5, 3: 1.0}, {1: 0.3, 2: 0.2}, {1: 0.6, 2: 0.8, 3: 0.0}]
    steps, mean, lo, hi = aggregate(series)
    assert steps == [1, 2]
    assert mean == pytest.approx([0.3, 0.5]) and lo == [0.0, 0.2] and hi == [0.6, 0.8]
    assert aggregate([]) == ([], [], [], [])


def test_aggregate_of_one_series_is_that_series() -> None:
    assert aggregate([{2: 0.5, 1: 0.25}]) == ([1, 2], [0.25, 0.5], [0.25, 0.5], [0.25, 0.5])


LOCKED: dict = {"seed": 0, "perturbation": {"kind": "locked", "p": 0.1}, "grpo": {"temperature": 0.0, "group_size": 4}}


def _drawn(tmp_path: Path, panel: str) -> tuple[dict, list, list]:
    """(description, [(steps, mean)] per line, [(lo, hi) per step] of the band) of the arm under ``tmp_path``."""
    runs = [load_run(p) for p in sorted((tmp_path / "arm").iterdir())]
    fig, desc = draw({"arm": runs}, panels=(panel,))
    ax = fig.axes[0]
    lines = [(np.asarray(ln.get_xdata()).tolist(), np.asarray(ln.get_ydata()).tolist()) for ln in ax.get_lines()]
    bands = []
    for coll in ax.collections:  # fill_between: one polygon, lo along the steps then hi back
        xy = np.asarray(coll.get_paths()[0].vertices)
        by_step: dict[float, set[float]] = {}
        for x, y in xy:
            by_step.setdefault(round(float(x), 6), set()).add(round(float(y), 6))
        bands.append({x: (min(ys), max(ys)) for x, ys in sorted(by_step.items())})
    return desc, lines, bands


def test_the_eval_panel_draws_the_seeds_mean_with_a_min_max_band(tmp_path: Path) -> None:
    """Two seeds evaluated at steps 0, 2, 4: line = their mean, band = [min, max] at each step."""
    values = {0: [0.1, 0.2, 0.6], 1: [0.3, 0.2, 0.4]}
    for seed, vs in values.items():
        write_run(tmp_path / "arm" / f"seed{seed}", LOCKED, [{"step": 2 * i, EVAL: v} for i, v in enumerate(vs)])
    desc, lines, bands = _drawn(tmp_path, "eval")
    assert desc["bands"]["eval"] == ["arm"] and desc["panels"]["eval"] == {"arm": 3}
    ((steps, mean),) = lines
    assert steps == [0, 2, 4] and mean == pytest.approx([0.2, 0.2, 0.5])
    assert bands == [{0.0: (0.1, 0.3), 2.0: (0.2, 0.2), 4.0: (0.4, 0.6)}]


def test_a_seed_without_the_panel_s_metric_is_left_out_not_the_whole_arm(tmp_path: Path) -> None:
    """seed0 logged kept fractions, seed1 none (null): the arm's line is seed0's, without a band, and no note."""
    write_run(tmp_path / "arm" / "seed0", LOCKED, [{"step": t, "frac_groups_kept": 0.25 * t} for t in (1, 2)])
    write_run(tmp_path / "arm" / "seed1", LOCKED, [{"step": t, "frac_groups_kept": None} for t in (1, 2)])
    desc, lines, bands = _drawn(tmp_path, "kept")
    assert lines == [([1, 2], [0.25, 0.5])] and bands == [] and desc["notes"]["kept"] == []


def test_run_series_reads_eval_rows_and_skips_rows_without_a_step(tmp_path: Path) -> None:
    """Values at null or missing steps are left out (a step of None was int(None): a TypeError traceback)."""
    rows: list[dict] = [
        {"step": 0, EVAL: 0.25},
        {"step": None, EVAL: 0.5},
        {"step": 1, "reward_std": 0.5, "reward_mean": 0.1},
    ]
    run = load_run(write_run(tmp_path / "r", LOCKED, rows))
    assert run_series(run, "eval") == {0: 0.25}
    assert run_series(run, "reward_std") == {1: 0.5}


def test_two_scorers_in_the_eval_panel_are_warned_of(tmp_path: Path) -> None:
    """One run scored by the default rule (numeric), one by exact match: a warning naming both, in the eval panel."""
    rows = [{"step": 0, EVAL: 0.5}]
    a = load_run(write_run(tmp_path / "a", LOCKED, rows))
    b = load_run(write_run(tmp_path / "b", {**LOCKED, "eval": {"scorer": "exact"}}, rows))
    with pytest.warns(UserWarning, match=r"different eval.scorer rules: numeric \(a\); exact \(b\)"):
        draw({"a": [a], "b": [b]}, panels=("eval",))


def test_the_eval_panel_draws_a_run_s_first_logged_eval_column_by_default(tmp_path: Path) -> None:
    rows = [{"step": 0, EVAL: 0.25, "eval/other/accuracy": 0.75}, {"step": 2, "eval/other/accuracy": 1.0, EVAL: 0.5}]
    run = load_run(write_run(tmp_path / "r", LOCKED, rows))
    assert run_series(run, "eval") == {0: 0.25, 2: 0.5}
    assert run_series(run, "eval", "other") == {0: 0.75, 2: 1.0}


def test_a_bool_is_not_plotted_as_a_number(tmp_path: Path) -> None:
    rows: list[dict] = [{"step": 1, "frac_groups_kept": True}, {"step": 2, "frac_groups_kept": 0.5}]
    assert run_series(load_run(write_run(tmp_path / "r", LOCKED, rows)), "kept") == {2: 0.5}


def test_an_eval_key_no_run_logged_is_a_data_error(tmp_path: Path) -> None:
    run = load_run(write_run(tmp_path / "r", LOCKED, [{"step": 0, EVAL: 0.5}]))
    with pytest.raises(DataError, match=r"--eval-key tset: no run logged it \(eval columns logged: valid/accuracy\)"):
        draw({"r": [run]}, panels=("eval",), eval_key="tset")


def test_a_reward_part_no_run_logged_is_a_data_error(tmp_path: Path) -> None:
    run = load_run(write_run(tmp_path / "r", LOCKED, [{"step": 1, "reward_mean": 0.5, "reward/format": 1.0}]))
    with pytest.raises(DataError, match=r"no run logged reward/fromat \(reward parts logged: reward/format\)"):
        draw({"r": [run]}, panels=("reward/fromat",))


def test_a_k_1_arm_s_reward_std_panel_says_why_it_is_empty(tmp_path: Path) -> None:
    config = {**LOCKED, "grpo": {**LOCKED["grpo"], "group_size": 1}}
    write_run(tmp_path / "arm" / "seed0", config, [{"step": 1, "reward_mean": 0.5, "reward_std": None}])
    desc, lines, _ = _drawn(tmp_path, "reward_std")
    assert lines == [] and desc["notes"]["reward_std"] == ["arm: no within-group std (K = 1)"]


def test_a_label_over_runs_of_other_task_seeds_is_warned_of(tmp_path: Path) -> None:
    """Only the top-level ``seed`` (and threads, device, logging) may differ between seeds of one setting: a nested
    ``task.seed`` is the data's, another setting."""
    for i, task_seed in enumerate((1, 2)):
        write_run(tmp_path / f"r{i}", {**LOCKED, "seed": i, "task": {"seed": task_seed}}, [{"step": 0, EVAL: 0.5}])
    with pytest.warns(UserWarning, match=r"^--label mine: its 2 runs are 2 settings \(they differ in task.seed\)"):
        group_runs([], {"mine": [tmp_path / "r0", tmp_path / "r1"]})


def test_an_eval_key_naming_two_sources_sets_is_not_resolved_to_either(tmp_path: Path) -> None:
    """``valid`` names ``builtin:valid`` alone, but not when ``gsm8k:valid`` is logged too: no silent pick."""
    row = {"step": 0, "eval/builtin:valid/accuracy": 0.25, "eval/gsm8k:valid/accuracy": 0.75}
    run = load_run(write_run(tmp_path / "r", LOCKED, [row]))
    assert run_series(run, "eval", "valid") == {}
    assert run_series(run, "eval", "gsm8k:valid") == {0: 0.75}
    with pytest.raises(DataError, match="--eval-key valid: no run logged it"):
        draw({"r": [run]}, panels=("eval",), eval_key="valid")
