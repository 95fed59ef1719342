"""The axes of ``dgrpo plot``'s panels: whole-step x ticks and no negative y range for quantities that cannot be
negative, even for a run of one evaluation or of flat zero curves (an untrained model's first runs)."""

from pathlib import Path

from dgrpo.plotting import draw, group_runs, load_run

from conftest import write_run


def _figure(tmp_path: Path, *rows_by_seed: list[dict], panels=("eval", "reward_std", "reward_mean")):
    """One arm's figure, drawn: a run of each seed's rows."""
    runs = [
        load_run(write_run(tmp_path / f"grpo_seed{seed}", {"seed": seed, "grpo": {"group_size": 4}}, rows))
        for seed, rows in enumerate(rows_by_seed)
    ]
    fig, _ = draw(group_runs(runs), panels=panels)
    fig.canvas.draw()
    return fig


def test_a_single_evaluation_gets_whole_step_ticks(tmp_path: Path) -> None:
    fig = _figure(tmp_path, [{"step": 1, "reward_std": 0.2, "reward_mean": 0.5}, {"step": 4, "eval/v/accuracy": 0.3}])
    eval_ax = fig.axes[0]
    assert eval_ax.get_lines()[0].get_xdata().tolist() == [4]
    ticks = [t for t in eval_ax.get_xticks() if eval_ax.get_xlim()[0] <= t <= eval_ax.get_xlim()[1]]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks  # (was 3.80, 3.85, ..., 4.20)


def test_flat_zero_curves_start_their_y_axis_at_zero(tmp_path: Path) -> None:
    rows = [{"step": 0, "eval/v/accuracy": 0.0}]
    rows += [{"step": t, "reward_std": 0.0, "reward_mean": 0.0} for t in (1, 2)] + [{"step": 2, "eval/v/accuracy": 0.0}]
    fig = _figure(tmp_path, rows)
    for ax in fig.axes:  # an accuracy, a std, a mean reward of 0/1 rewards: none below 0 (was -0.05 to 0.05)
        low, high = ax.get_ylim()
        assert low == 0.0 and high > 0.0, (ax.get_title(), low, high)


def test_a_curve_below_zero_keeps_its_range(tmp_path: Path) -> None:
    rows = [{"step": 0, "eval/v/accuracy": 0.5}] + [
        {"step": t, "reward_std": 0.1, "reward_mean": -1.5 + t} for t in (1, 2)
    ]
    fig = _figure(tmp_path, rows)
    mean_ax = fig.axes[2]
    assert mean_ax.get_ylim()[0] < -0.5  # (a penalty-shaped reward may be negative: not cut off)
    assert fig.axes[0].get_ylim()[0] < 0.5 < fig.axes[0].get_ylim()[1]  # (nonzero data: autoscaled as before)


def _y_range(tmp_path: Path, panel: str, rewards: dict[int, float]) -> tuple[float, float]:
    """The y range of ``panel`` for seeds (seed -> reward_mean and eval accuracy at steps 1 and 2) of one arm."""

    def rows(value: float) -> list[dict]:
        rows = [{"step": t, "reward_std": 0.1, "reward_mean": value} for t in (1, 2)]
        return rows + [{"step": t, "eval/v/accuracy": value} for t in (1, 2)]  # (a row of its own: an evaluation's)

    low, high = (
        _figure(tmp_path, *(rows(rewards[seed]) for seed in sorted(rewards)), panels=(panel,)).axes[0].get_ylim()
    )
    return float(low), float(high)


def test_a_seeds_band_below_zero_keeps_its_range(tmp_path):
    """Two seeds' mean rewards of -0.5 and 1.5: their mean, 0.5, is not negative, but the min-max band is drawn
    down to -0.5; the axis keeps it (it was cut at 0: only the curves were read)."""
    assert _y_range(tmp_path, "reward_mean", {0: -0.5, 1: 1.5})[0] < -0.5


def test_a_curve_from_zero_is_floored_at_zero_and_keeps_its_top(tmp_path):
    """Mean rewards from 0 to 2 (a weighted sum of rewards): from 0, up to autoscaling's top over 2 (mutant: the
    axis set to 0 to 1, cutting the curve)."""
    low, high = _y_range(tmp_path, "reward_mean", {0: 0.0, 1: 2.0})
    assert low == 0.0 and high > 2.0


def test_curves_well_above_zero_keep_their_autoscaled_bottom(tmp_path):
    """Nothing negative is floored at 0 only where autoscaling went below 0 (mutant: accuracies of 0.6 and 0.8 drawn
    from 0)."""
    assert 0.5 < _y_range(tmp_path, "eval", {0: 0.6, 1: 0.8})[0] < 0.6
