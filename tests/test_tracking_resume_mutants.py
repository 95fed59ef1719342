"""A second mutation pass over :mod:`dgrpo.training.tracking`: what the first (test_tracking_mutants.py) left to the
slow offline-W&B tests or untested: what ``wandb.init`` is given (the run's folder, name, project, entity, config),
a run started afresh through open_trackers, another active W&B run refused, trackers closed when opening is
interrupted, a TensorBoard row after close. Against a stand-in ``wandb`` module."""

import sys
import types
from pathlib import Path
from typing import Any

import pytest

from dgrpo.training import tracking
from dgrpo.training.tracking import TensorBoardTracker, WandbTracker, open_trackers


class FakeRun:
    """A ``wandb.init`` run: its id is the one asked for unless ``other_id``; ``disabled`` as W&B's disabled mode."""

    def __init__(self, run_id: str, disabled: bool = False) -> None:
        self.id, self.disabled, self.offline, self.starting_step = run_id, disabled, True, 0
        self.dir = "/nowhere/wandb/offline-run-x/files"
        self.finished: list[int] = []

    def log(self, values: dict[str, Any], step: int) -> None:
        pass

    def finish(self, exit_code: int = 0) -> None:
        self.finished.append(exit_code)


@pytest.fixture
def fake_wandb(monkeypatch: pytest.MonkeyPatch) -> types.SimpleNamespace:
    """A ``wandb`` module: ``.kwargs`` lists each ``init``'s arguments; ``.run_id`` set makes ``init`` return a run
    of that id (another active run), ``.disabled`` a disabled run, ``.interrupt`` makes it raise KeyboardInterrupt."""
    state = types.SimpleNamespace(kwargs=[], runs=[], run_id=None, disabled=False, interrupt=False)

    def init(**kwargs: Any) -> FakeRun:
        state.kwargs.append(kwargs)
        if state.interrupt:
            raise KeyboardInterrupt
        run = FakeRun(state.run_id or kwargs["id"], state.disabled)
        state.runs.append(run)
        return run

    module = types.ModuleType("wandb")
    module.init = init  # type: ignore[attr-defined]
    module.errors = types.SimpleNamespace(Error=RuntimeError)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "wandb", module)
    for name in ("WANDB_PROJECT", "WANDB_NAME", "WANDB_ENTITY"):
        monkeypatch.delenv(name, raising=False)
    return state


def test_wandb_init_gets_the_runs_folder_name_project_and_config(tmp_path: Path, fake_wandb, monkeypatch) -> None:
    """The W&B files go under the run's folder, the W&B run is named after it, the project and config are passed
    on, an unset entity is None (W&B's default entity); WANDB_PROJECT wins over the default project only."""
    WandbTracker(tmp_path / "runs" / "x", config={"seed": 3})
    monkeypatch.setenv("WANDB_PROJECT", "envproj")
    WandbTracker(tmp_path / "y", project="dgrpo", entity="team")
    WandbTracker(tmp_path / "z", project="mine")
    first = fake_wandb.kwargs[0]
    assert (first["dir"], first["name"], first["project"]) == (str(tmp_path / "runs" / "x"), "x", "dgrpo")
    assert first["entity"] is None and first["config"] == {"seed": 3}
    assert [k["project"] for k in fake_wandb.kwargs[1:]] == [None, "mine"] and fake_wandb.kwargs[1]["entity"] == "team"


def test_open_trackers_started_afresh_begins_a_new_wandb_run(tmp_path: Path, fake_wandb) -> None:
    """open_trackers(resume=False) (``--resume never``) gives W&B a new run id, even with one stored."""
    (first,) = open_trackers(["wandb"], tmp_path, config={})
    (again,) = open_trackers(["wandb"], tmp_path, config={})
    (anew,) = open_trackers(["wandb"], tmp_path, config={}, resume=False)
    assert isinstance(anew, WandbTracker) and isinstance(first, WandbTracker) and isinstance(again, WandbTracker)
    assert again.run_id == first.run_id != anew.run_id and anew.fresh and not again.fresh


def test_another_active_wandb_run_is_refused_and_a_disabled_one_accepted(tmp_path: Path, fake_wandb) -> None:
    """wandb.init handing back a run of another id (one left active in the process) would log this run's rows into
    it: refused; W&B's disabled mode (a run of its own id, recording nothing) is accepted."""
    fake_wandb.run_id = "otherrun"
    with pytest.raises(RuntimeError, match="returned another active W&B run \\(otherrun\\)"):
        WandbTracker(tmp_path)
    fake_wandb.disabled = True
    assert WandbTracker(tmp_path).disabled


def test_trackers_already_open_are_closed_when_opening_is_interrupted(tmp_path: Path, fake_wandb, monkeypatch) -> None:
    """A Ctrl-C while W&B starts (after TensorBoard opened): the TensorBoard tracker is closed, marked failed."""
    pytest.importorskip("tensorboard")
    closed: list[int] = []
    monkeypatch.setattr(TensorBoardTracker, "close", lambda self, exit_code=0: closed.append(exit_code))
    fake_wandb.interrupt = True
    with pytest.raises(KeyboardInterrupt):
        open_trackers(["tensorboard", "wandb"], tmp_path, config={})
    assert closed == [1]


def test_tensorboard_log_after_close_is_an_error_and_close_is_idempotent(tmp_path: Path) -> None:
    """A row logged after close would be lost: it raises; a second close does nothing."""
    pytest.importorskip("tensorboard")
    t = tracking.TensorBoardTracker(tmp_path / "tb")
    t.close()
    t.close()
    with pytest.raises(RuntimeError, match="after close"):
        t.log({"step": 0, "loss": 1.0}, 0)


def test_tensorboard_added_on_resume_keeps_the_earlier_rows_even_if_no_row_follows(tmp_path: Path) -> None:
    """TensorBoard added when a run resumes, and the process stopped before its first new row (a crash in the first
    step): the kept rows were held back until that row and lost, and the next resume found tb/ there (no longer
    fresh) and never wrote them: TensorBoard's curves began at the resume. They are written when the tracker gets
    them; a second resumed process writes only its own rows and the curves run from step 0."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    def scalars() -> dict[str, list[tuple[int, float]]]:
        acc = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0})
        acc.Reload()
        return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}

    kept = [{"step": 0, "loss": 1.0}, {"step": 1, "loss": 0.5}]
    first = TensorBoardTracker(tmp_path / "tb")
    assert first.fresh
    first.resumed(kept)
    first.close()  # (stopped before any new row)
    assert scalars() == {"loss": [(0, 1.0), (1, 0.5)]}
    again = TensorBoardTracker(tmp_path / "tb")
    again.resumed(kept)
    again.log({"step": 2, "loss": 0.25}, 2)
    again.close()
    assert scalars() == {"loss": [(0, 1.0), (1, 0.5), (2, 0.25)]}
