"""Fast checks of :mod:`dgrpo.training.tracking` found by mutation testing: the W&B tracker's own logic (steps that
may not decrease, same-step rows, value conversion, resume) against a stand-in ``wandb`` module, so that the fast
tier covers what the offline-W&B tests (slow) alone did; and TensorBoard's resume at the purge step."""

import sys
import types
from pathlib import Path
from typing import Any

import pytest

from dgrpo.config import ConfigError
from dgrpo.run_layout import WANDB_ID_FILE
from dgrpo.training.tracking import TensorBoardTracker, WandbTracker, open_trackers

EVAL = "eval/valid/accuracy"


class FakeRun:
    """What WandbTracker reads of a ``wandb.init`` run, recording each ``log`` call."""

    def __init__(self, run_id: str, starting_step: int = 0) -> None:
        self.id, self.starting_step = run_id, starting_step
        self.offline, self.disabled = True, False
        self.entity, self.project, self.name = "", "dgrpo", "x"
        self.dir = "/nonexistent/wandb/offline-run-x/files"
        self.logged: list[tuple[int, dict[str, Any]]] = []
        self.finished: list[int] = []

    def log(self, values: dict[str, Any], step: int) -> None:
        self.logged.append((step, dict(values)))

    def finish(self, exit_code: int = 0) -> None:
        self.finished.append(exit_code)


@pytest.fixture
def fake_wandb(monkeypatch: pytest.MonkeyPatch) -> types.SimpleNamespace:
    """A ``wandb`` module whose ``init`` returns a :class:`FakeRun`; ``.runs`` lists them, ``.kwargs`` their init
    arguments; ``.starting_step`` is the next run's (a resumed online run's next step)."""
    state = types.SimpleNamespace(runs=[], kwargs=[], starting_step=0)

    def init(**kwargs: Any) -> FakeRun:
        run = FakeRun(kwargs["id"], state.starting_step)
        state.runs.append(run)
        state.kwargs.append(kwargs)
        return run

    module = types.ModuleType("wandb")
    module.init = init  # type: ignore[attr-defined]
    module.errors = types.SimpleNamespace(Error=RuntimeError)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "wandb", module)
    return state


def test_wandb_same_step_rows_are_logged_and_lower_steps_skipped(tmp_path: Path, fake_wandb) -> None:
    """An eval row and a training row share step 2: both logged (W&B merges them); a row at step 1 after step 2 is
    skipped and counted; ``step`` itself is no metric."""
    t = WandbTracker(tmp_path)
    rows: list[dict[str, Any]] = [
        {"step": 0, EVAL: 0.25},
        {"step": 2, EVAL: 0.5},
        {"step": 2, "loss": 1.0},
        {"step": 1, "loss": 9.0},
    ]
    for row in rows:
        t.log(row, row["step"])
    t.log({"step": 3, "loss": 0.5}, 3)
    assert fake_wandb.runs[0].logged == [(0, {EVAL: 0.25}), (2, {EVAL: 0.5}), (2, {"loss": 1.0}), (3, {"loss": 0.5})]
    assert t.skipped == 1


def test_wandb_resumed_online_run_skips_steps_below_its_next_step(tmp_path: Path, fake_wandb) -> None:
    fake_wandb.starting_step = 5
    t = WandbTracker(tmp_path)
    for s in (3, 4, 5, 6):
        t.log({"step": s, "loss": float(s)}, s)
    assert fake_wandb.runs[0].logged == [(5, {"loss": 5.0}), (6, {"loss": 6.0})] and t.skipped == 2


def test_wandb_values_none_dropped_bools_as_ints_strings_and_nan_kept(tmp_path: Path, fake_wandb) -> None:
    t = WandbTracker(tmp_path)
    t.log({"step": 0, "skipped": True, "kept": False, "reward_std": None, "note": "hi", "grad_norm": float("inf")}, 0)
    t.log({"step": 1, "reward_std": None}, 1)  # nothing left: no W&B call
    ((step, values),) = fake_wandb.runs[0].logged
    assert step == 0 and values == {"skipped": 1, "kept": 0, "note": "hi", "grad_norm": float("inf")}
    assert type(values["skipped"]) is int and type(values["kept"]) is int


def test_wandb_resume_continues_the_stored_run_and_a_fresh_one_gets_the_kept_rows(tmp_path: Path, fake_wandb) -> None:
    kept = [{"step": 0, EVAL: 0.25}, {"step": 1, "loss": 1.0}]
    first = WandbTracker(tmp_path)  # a new run: W&B added on resume gets the kept rows
    assert first.fresh
    first.resumed(kept)
    first.close()
    run_id = (tmp_path / WANDB_ID_FILE).read_text().strip()
    assert fake_wandb.runs[0].logged == [(0, {EVAL: 0.25}), (1, {"loss": 1.0})] and fake_wandb.runs[0].id == run_id
    again = WandbTracker(tmp_path)  # resumed: the same W&B run, which has those rows already
    again.resumed(kept)
    assert not again.fresh and again.run_id == run_id and fake_wandb.runs[1].logged == []
    assert fake_wandb.kwargs[1]["id"] == run_id and fake_wandb.kwargs[1]["resume"] == "allow"
    anew = WandbTracker(tmp_path, resume=False)  # a run started afresh: a new id, and a fresh W&B run
    anew.resumed(kept)
    assert anew.fresh and anew.run_id != run_id and len(fake_wandb.runs[2].logged) == 2


def test_open_trackers_opens_a_repeated_backend_once_and_closes_with_the_exit_code(tmp_path: Path, fake_wandb) -> None:
    (t,) = open_trackers(["jsonl", "wandb", "wandb"], tmp_path / "run", config={"seed": 0})
    assert len(fake_wandb.runs) == 1 and fake_wandb.kwargs[0]["config"] == {"seed": 0}
    t.close(exit_code=1)
    t.close()
    assert fake_wandb.runs[0].finished == [1]


def _tb_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_tensorboard_resume_rewrites_only_kept_rows_at_or_after_its_first_step(tmp_path: Path) -> None:
    """The kept eval row at the resume step (2) is written again after the purge marker; earlier kept rows are
    not (they are in the older event file, before the marker). The tb folder exists (an earlier process's; its
    file left out here), so this tracker is no fresh one: read back, steps 0 and 1 are absent."""
    pytest.importorskip("tensorboard")
    (tmp_path / "tb").mkdir()
    t = TensorBoardTracker(tmp_path / "tb", "x")
    assert not t.fresh
    t.resumed([{"step": 0, EVAL: 0.25}, {"step": 1, "loss": 1.0}, {"step": 2, EVAL: 0.5}])
    t.log({"step": 2, "loss": 12.0}, 2)
    t.close()
    assert _tb_scalars(tmp_path / "tb") == {EVAL: [(2, 0.5)], "loss": [(2, 12.0)]}


def test_tensorboard_points_are_on_disk_after_each_row_before_close(tmp_path: Path) -> None:
    """A running run's curves are readable (``tensorboard --logdir`` on a live run): each row is flushed."""
    pytest.importorskip("tensorboard")
    t = TensorBoardTracker(tmp_path / "tb", "x")
    t.log({"step": 0, "loss": 1.0}, 0)
    try:
        assert _tb_scalars(tmp_path / "tb") == {"loss": [(0, 1.0)]}
    finally:
        t.close()


def test_open_trackers_leaves_wandb_s_name_to_wandb_name_when_run_name_is_unset(
    tmp_path: Path, fake_wandb, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANDB_NAME", "from-env")
    open_trackers(["wandb"], tmp_path / "run", config={})
    open_trackers(["wandb"], tmp_path / "run", config={}, run_name="given")
    assert [k["name"] for k in fake_wandb.kwargs] == [None, "given"]


def test_open_trackers_closes_an_opened_wandb_run_as_failed_when_a_later_backend_is_missing(
    tmp_path: Path, fake_wandb, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [m for m in sys.modules if m == "tensorboard" or m.startswith("tensorboard.")] + ["tensorboard"]:
        monkeypatch.setitem(sys.modules, name, None)  # (a None entry: imported as if not installed)
    with pytest.raises(ConfigError, match="tensorboard"):
        open_trackers(["wandb", "tensorboard"], tmp_path, config={})
    assert fake_wandb.runs[0].finished == [1]


class RecordingTracker:
    """A tracker that records what it is given."""

    name, where = "recording", "memory"

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def resumed(self, kept_rows: list[dict[str, Any]]) -> None:
        self.calls.append(("resumed", kept_rows))

    def log(self, row: dict[str, Any], step: int) -> None:
        self.calls.append(("log", step))

    def close(self, exit_code: int = 0) -> None:
        self.calls.append(("close", exit_code))


def test_metrics_log_off_rank_0_writes_nothing_and_feeds_no_tracker(tmp_path: Path) -> None:
    """Ranks other than 0 (``enabled=False``): no metrics.jsonl rewritten or appended, no tracker row."""
    from dgrpo.training.run import MetricsLog

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0, "loss": 1.0}\n{"step": 1, "loss": 0.5}\n')  # (rank 0's, on a shared disk)
    tracker = RecordingTracker()
    log = MetricsLog(path, enabled=False)
    log.open(1, [tracker])
    log.write({"step": 1, "loss": 9.0})
    assert log.rows() == [] and log.n_rows() == 0
    log.close()
    assert path.read_text() == '{"step": 0, "loss": 1.0}\n{"step": 1, "loss": 0.5}\n' and tracker.calls == []


def test_metrics_log_on_rank_0_cuts_back_and_feeds_trackers_at_each_row_s_step(tmp_path: Path) -> None:
    from dgrpo.training.run import MetricsLog

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0, "loss": 1.0}\n{"step": 1, "loss": 0.5}\n')  # the checkpoint kept the first row
    tracker = RecordingTracker()
    log = MetricsLog(path, enabled=True)
    log.open(1, [tracker])
    log.write({"step": 1, "loss": 9.0})
    log.close(exit_code=3)
    assert path.read_text() == '{"step": 0, "loss": 1.0}\n{"step": 1, "loss": 9.0}\n'
    assert tracker.calls == [("resumed", [{"step": 0, "loss": 1.0}]), ("log", 1), ("close", 3)]


def test_an_empty_stored_wandb_run_id_is_replaced_by_a_new_one(tmp_path: Path) -> None:
    from dgrpo.training.tracking import wandb_run_id

    (tmp_path / WANDB_ID_FILE).write_text("\n")  # (a run killed while writing it)
    run_id = wandb_run_id(tmp_path)
    assert len(run_id) == 8 and (tmp_path / WANDB_ID_FILE).read_text() == run_id + "\n"
    assert wandb_run_id(tmp_path) == run_id
