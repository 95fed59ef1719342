"""The W&B tracker and the user's W&B world: rows a resumed online run's W&B history already holds (skipped, and
said), ``WANDB_RESUME`` (the user's, honoured), a sweep agent's parameters (refused unless dgrpo's config has them)
and trackers closed on every way out of a run. Against a stand-in ``wandb`` module (the offline one cannot resume
or refuse a run: it has no server)."""

import sys
import types
import warnings
from pathlib import Path
from typing import Any

import pytest

from dgrpo.training.tracking import WandbTracker


class FakeRun:
    """What WandbTracker reads of a ``wandb.init`` run, recording each ``log`` and ``finish``."""

    def __init__(self, run_id: str, starting_step: int = 0) -> None:
        self.id, self.starting_step = run_id, starting_step
        self.offline, self.disabled = True, False
        self.dir = "/nonexistent/wandb/offline-run-x/files"
        self.logged: list[tuple[int, dict[str, Any]]] = []
        self.finished: list[int] = []

    def log(self, values: dict[str, Any], step: int) -> None:
        self.logged.append((step, dict(values)))

    def finish(self, exit_code: int = 0) -> None:
        self.finished.append(exit_code)


@pytest.fixture
def fake_wandb(monkeypatch: pytest.MonkeyPatch) -> types.SimpleNamespace:
    """A ``wandb`` module whose ``init`` returns a :class:`FakeRun` (``.runs``), its arguments in ``.kwargs``;
    ``.starting_step``: the next run's (a resumed online run's next step); ``.refuse``: an error ``init`` raises."""
    state = types.SimpleNamespace(runs=[], kwargs=[], starting_step=0, refuse=None)

    def init(**kwargs: Any) -> FakeRun:
        state.kwargs.append(kwargs)
        if state.refuse is not None:
            raise state.refuse
        state.runs.append(FakeRun(kwargs["id"], state.starting_step))
        return state.runs[-1]

    module = types.ModuleType("wandb")
    module.init = init  # type: ignore[attr-defined]
    module.errors = types.SimpleNamespace(Error=RuntimeError)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "wandb", module)
    for key in ("WANDB_RESUME", "WANDB_RUN_ID", "WANDB_SWEEP_ID", "WANDB_SWEEP_PARAM_PATH", "WANDB_PROJECT"):
        monkeypatch.delenv(key, raising=False)
    return state


def test_rows_a_resumed_wandb_run_skips_are_said_once_with_their_count(tmp_path: Path, fake_wandb) -> None:
    """A run resumed from its step-3 checkpoint after its W&B run had reached step 6: W&B takes no row below 6, and
    the rows of steps 3-5 were skipped without a word (only ``WandbTracker.skipped`` counted them)."""
    fake_wandb.starting_step = 6
    t = WandbTracker(tmp_path)
    for s in (3, 4, 4, 5, 6, 7):
        t.log({"step": s, "loss": float(s)}, s)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t.close()
        t.close()
    said = [str(w.message) for w in caught]
    assert len(said) == 1, said
    assert f"W&B run {t.run_id} skipped 4 row(s), of steps 3-5: it takes no step below 6" in said[0]
    assert "metrics.jsonl holds every row" in said[0]
    assert [s for s, _ in fake_wandb.runs[0].logged] == [6, 7] and fake_wandb.runs[0].finished == [0]


def test_a_run_that_skipped_no_row_says_nothing(tmp_path: Path, fake_wandb) -> None:
    t = WandbTracker(tmp_path)
    for s in (0, 1, 1, 2):
        t.log({"step": s, "loss": float(s)}, s)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t.close()
    assert t.skipped == 0
