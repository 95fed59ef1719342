"""Tests for the survivors of mutation testing of the session's new code: the lines below a progress bar
(``dgrpo.progress``), a SIGTERM's stop line (``stopped_after``), GRPO's done line, the plots' y floor, and the
bench's re-run."""

from pathlib import Path

from dgrpo.plotting import draw, group_runs, load_run

from conftest import write_run


def _y_range(tmp_path: Path, panel: str, rewards: dict[int, float]) -> tuple[float, float]:
    """The y range of ``panel`` for seeds (seed -> reward_mean and eval accuracy at steps 1 and 2) of one arm."""
    runs = []
    for seed, value in rewards.items():
        rows = [{"step": t, "reward_std": 0.1, "reward_mean": value} for t in (1, 2)]
        rows += [{"step": t, "eval/v/accuracy": value} for t in (1, 2)]  # (a row of its own: an evaluation's)
        runs.append(load_run(write_run(tmp_path / f"grpo_seed{seed}", {"seed": seed, "grpo": {}}, rows)))
    fig, _ = draw(group_runs(runs), panels=(panel,))
    fig.canvas.draw()
    low, high = fig.axes[0].get_ylim()
    return float(low), float(high)


def test_a_seeds_band_below_zero_keeps_its_range(tmp_path):
    """Two seeds' mean rewards of -0.5 and 1.5: their mean, 0.5, is not negative, but the min-max band is drawn
    down to -0.5; the axis keeps it (it was cut at 0: only the curves were read)."""
    assert _y_range(tmp_path, "reward_mean", {0: -0.5, 1: 1.5})[0] < -0.5
