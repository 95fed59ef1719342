"""W&B failing in the middle of a run: its ``run.log`` or ``finish`` raising (the ``wandb-core`` service process
killed) is a warning, and training goes on (metrics.jsonl is the record; W&B a copy). ``WANDB_RUN_ID`` names the W&B
run a run logs to."""

import json
import os
import subprocess
import sys
import textwrap
import types
import warnings
from pathlib import Path
from typing import Any

import pytest
from test_tracking import offline_wandb_variables, wandb_env  # noqa: F401 - (wandb_env: the offline W&B fixture)

from dgrpo.training.tracking import WandbTracker


class BrokenRun:
    """A W&B run whose ``log`` raises from step ``fail_at`` on (its service gone), and whose ``finish`` raises when
    ``finish_fails``."""

    def __init__(self, run_id: str, fail_at: int, finish_fails: bool) -> None:
        self.id, self.starting_step, self.offline, self.disabled = run_id, 0, True, False
        self.dir = "/nonexistent/wandb/offline-run-x/files"
        self.fail_at, self.finish_fails = fail_at, finish_fails
        self.logged: list[int] = []
        self.finished: list[int] = []

    def log(self, values: dict[str, Any], step: int) -> None:
        if step >= self.fail_at:
            raise ConnectionResetError("Connection lost")
        self.logged.append(step)

    def finish(self, exit_code: int = 0) -> None:
        self.finished.append(exit_code)
        if self.finish_fails:
            raise ConnectionResetError("Connection lost")


def _stand_in_wandb(monkeypatch: pytest.MonkeyPatch, fail_at: int, finish_fails: bool) -> list[BrokenRun]:
    runs: list[BrokenRun] = []
    teardowns: list[bool] = []

    def init(**kwargs: Any) -> BrokenRun:
        runs.append(BrokenRun(kwargs["id"], fail_at, finish_fails))
        return runs[-1]

    module = types.ModuleType("wandb")
    module.init = init  # type: ignore[attr-defined]
    module.errors = types.SimpleNamespace(Error=RuntimeError)  # type: ignore[attr-defined]
    module.teardown = lambda: teardowns.append(True)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "wandb", module)
    return runs


def test_wandb_failing_mid_run_is_one_warning_and_the_run_goes_on(tmp_path: Path, monkeypatch) -> None:
    """``run.log`` raised at step 2 (W&B's service gone): the training run died in that traceback. Now one warning
    names the step and the error, and the later rows are counted as lost, not sent; finishing does not raise."""
    runs = _stand_in_wandb(monkeypatch, fail_at=2, finish_fails=True)
    t = WandbTracker(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(5):
            t.log({"step": step, "loss": 1.0 / (step + 1)}, step)
        t.close()
    said = [str(w.message) for w in caught]
    assert len(said) == 1, said
    assert said[0].startswith("W&B stopped taking rows at step 2 (ConnectionResetError: Connection lost)")
    assert "training goes on" in said[0] and "metrics.jsonl" in said[0]
    assert runs[0].logged == [0, 1] and runs[0].finished == [0]
    assert t.failed == "at step 2 (ConnectionResetError: Connection lost)" and t.lost == 3 and t.skipped == 0
    t.close()  # idempotent


def test_wandb_failing_to_finish_a_healthy_run_is_a_warning(tmp_path: Path, monkeypatch) -> None:
    """Every row logged, then ``finish`` raised: the run's results are written, so a warning, not a failed command."""
    runs = _stand_in_wandb(monkeypatch, fail_at=99, finish_fails=True)
    t = WandbTracker(tmp_path)
    t.log({"step": 0, "loss": 1.0}, 0)
    with pytest.warns(UserWarning, match=r"^W&B could not finish its run \(ConnectionResetError: Connection lost\)"):
        t.close(exit_code=0)
    assert runs[0].logged == [0] and runs[0].finished == [0] and t.failed is None and t.lost == 0


_KILLED_SERVICE = """
import json, os, signal, sys, time, warnings
from pathlib import Path
from dgrpo.training.tracking import WandbTracker

t = WandbTracker(Path(sys.argv[1]), config={"seed": 1})
t.log({"step": 0, "loss": 1.0}, 0)
for child in Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read_text().split():
    os.kill(int(child), signal.SIGKILL)  # wandb-core, W&B's service process
time.sleep(1)
for step in range(1, 4):
    t.log({"step": step, "loss": 1.0 / (step + 1)}, step)
t.close()
print(json.dumps({"failed": t.failed, "lost": t.lost}))
"""


@pytest.mark.slow
def test_a_killed_wandb_service_leaves_a_warning_and_a_clean_exit(tmp_path: Path) -> None:
    """A real offline W&B run whose ``wandb-core`` process is killed after the first row: the next ``log`` raised
    ConnectionResetError out of training, and W&B's exit hook printed a second traceback at exit. Now: one warning,
    the later rows are counted as lost, and the process exits 0 without a traceback."""
    pytest.importorskip("wandb")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("WANDB_")},
        **offline_wandb_variables(tmp_path / "wandb-home"),
    }
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_KILLED_SERVICE), str(run_dir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    warned = [line for line in done.stderr.splitlines() if "W&B stopped taking rows" in line]
    assert len(warned) == 1 and "at step 1 (" in warned[0], done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["failed"].startswith("at step 1 (") and result["lost"] == 3


# -- WANDB_RUN_ID --------------------------------------------------------------------------------------------------


class IdRun:
    """What WandbTracker reads of a ``wandb.init`` run, recording the rows logged."""

    def __init__(self, run_id: str) -> None:
        self.id, self.starting_step, self.offline, self.disabled = run_id, 0, True, False
        self.dir = "/nonexistent/wandb/offline-run-x/files"
        self.logged: list[int] = []

    def log(self, values: dict[str, Any], step: int) -> None:
        self.logged.append(step)

    def finish(self, exit_code: int = 0) -> None:
        pass


@pytest.fixture
def id_wandb(monkeypatch: pytest.MonkeyPatch) -> list[IdRun]:
    """A stand-in ``wandb`` module whose ``init`` takes the id it is given; the list holds the runs made."""
    runs: list[IdRun] = []

    def init(**kwargs: Any) -> IdRun:
        runs.append(IdRun(kwargs["id"]))
        return runs[-1]

    module = types.ModuleType("wandb")
    module.init = init  # type: ignore[attr-defined]
    module.errors = types.SimpleNamespace(Error=RuntimeError)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "wandb", module)
    monkeypatch.delenv("WANDB_RUN_ID", raising=False)
    return runs


def test_wandb_run_id_names_the_wandb_run_and_a_resume_continues_it(tmp_path: Path, monkeypatch, id_wandb) -> None:
    """``WANDB_RUN_ID`` (how W&B users, and sweep agents, name the run to log to) was ignored: dgrpo drew an id of
    its own, and the rows went to another W&B run than the one named. Now it is the run's id, stored, so that a
    resume without the variable continues that W&B run."""
    from dgrpo.run_layout import WANDB_ID_FILE

    monkeypatch.setenv("WANDB_RUN_ID", "chosen42")
    t = WandbTracker(tmp_path, resume=False)
    t.close()
    assert t.run_id == id_wandb[0].id == "chosen42" and t.fresh
    assert (tmp_path / WANDB_ID_FILE).read_text() == "chosen42\n"
    monkeypatch.delenv("WANDB_RUN_ID")
    resumed = WandbTracker(tmp_path)
    resumed.resumed([{"step": 0, "loss": 1.0}])
    resumed.close()
    assert resumed.run_id == id_wandb[1].id == "chosen42" and not resumed.fresh and id_wandb[1].logged == []


def test_a_resume_told_another_wandb_run_gives_it_the_kept_rows(tmp_path: Path, monkeypatch, id_wandb) -> None:
    """A resumed run whose WANDB_RUN_ID names another W&B run than the stored one: that run has none of the rows, so it
    gets the checkpoint's kept rows first, and it is the one a later resume continues."""
    from dgrpo.run_layout import WANDB_ID_FILE

    (tmp_path / WANDB_ID_FILE).write_text("oldrun00\n")
    monkeypatch.setenv("WANDB_RUN_ID", "newrun11")
    t = WandbTracker(tmp_path)
    t.resumed([{"step": 0, "loss": 1.0}, {"step": 1, "loss": 0.5}])
    t.close()
    assert t.run_id == "newrun11" and t.fresh and id_wandb[0].logged == [0, 1]
    assert (tmp_path / WANDB_ID_FILE).read_text() == "newrun11\n"


@pytest.mark.slow
@pytest.mark.usefixtures("wandb_env")
def test_a_wandb_run_id_that_wandb_refuses_names_the_variable(tmp_path: Path, monkeypatch) -> None:
    """W&B refuses an id with ``/`` in it: the line named a login as the fix. Now it names WANDB_RUN_ID, and the
    run's stored id is left as it was."""
    from dgrpo.config import ConfigError
    from dgrpo.run_layout import WANDB_ID_FILE

    (tmp_path / WANDB_ID_FILE).write_text("oldrun00\n")
    monkeypatch.setenv("WANDB_RUN_ID", "team/run")
    with pytest.raises(ConfigError, match=r"^WANDB_RUN_ID: W&B refuses the run id 'team/run' \(Run ID cannot") as e:
        WandbTracker(tmp_path)
    assert "log in" not in str(e.value)
    assert (tmp_path / WANDB_ID_FILE).read_text() == "oldrun00\n"
