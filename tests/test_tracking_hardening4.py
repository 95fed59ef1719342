"""Trackers on a run's unhappy ways out: a SIGTERM's stop (a scheduler's preemption, resumable from its checkpoint)
ends the W&B run preempted with the process's exit code, not failed with 1; a Ctrl-C's records 130; a SIGTERM while a
completed run finishes its W&B run lets that finish end."""

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from test_tracking import _wandb_records, wandb_env  # noqa: F401 - (wandb_env: the offline W&B fixture)
from test_tracking_mutants import FakeRun  # (what WandbTracker reads of a wandb.init run)
from test_tracking_wandb_env import wandb_of

from dgrpo.training.preemption import Terminated, exit_code_of
from dgrpo.training.tracking import WandbTracker


class PreemptibleRun(FakeRun):
    """A :class:`FakeRun` that records ``mark_preempting`` and ``finish`` in one list, in their order."""

    def __init__(self, run_id: str, starting_step: int = 0) -> None:
        super().__init__(run_id, starting_step)
        self.calls: list[tuple[str, int]] = []

    def mark_preempting(self) -> None:
        self.calls.append(("mark_preempting", 0))

    def finish(self, exit_code: int = 0) -> None:
        super().finish(exit_code)
        self.calls.append(("finish", exit_code))


@pytest.fixture
def preemptible_wandb(monkeypatch: pytest.MonkeyPatch) -> list[PreemptibleRun]:
    """A ``wandb`` module whose ``init`` returns a :class:`PreemptibleRun` (listed in the fixture's value)."""
    return wandb_of(monkeypatch, PreemptibleRun).runs


@pytest.mark.parametrize(
    "stop, calls",
    [
        (Terminated("after step 3"), [("mark_preempting", 0), ("finish", 143)]),
        (KeyboardInterrupt(), [("finish", 130)]),
        (RuntimeError("CUDA out of memory"), [("finish", 1)]),
    ],
    ids=["sigterm", "ctrl-c", "error"],
)
def test_a_run_stopped_by_sigterm_ends_its_wandb_run_preempted(
    tmp_path: Path, preemptible_wandb: list[PreemptibleRun], stop: BaseException, calls: list[tuple[str, int]]
) -> None:
    """A SIGTERM's stop (Terminated through the run's ``with`` block: its checkpoint written, the process exiting
    143) finished the W&B run with exit code 1: shown failed, and a sweep agent did not requeue it. Now it is marked
    preempting, then finished with 143; Ctrl-C records the process's 130; an error stays 1, not preempted."""
    from dgrpo.training.distributed import Dist
    from dgrpo.training.run import RunDir

    from conftest import tiny_config

    cfg = tiny_config(**{"logging.backends": "[jsonl,wandb]"})
    with pytest.raises(type(stop)):
        with RunDir(tmp_path / "run", cfg, Dist.single(), "grpo", resume="never", log=lambda line: None) as run:
            run.start(None)
            run.metrics.write({"step": 0, "loss": 1.0})
            raise stop
    assert [r.calls for r in preemptible_wandb] == [calls]


def test_a_run_closed_outside_a_stop_keeps_its_exit_code(tmp_path: Path, preemptible_wandb) -> None:
    """A close with exit code 0 is a finished run whatever is under way; one with 1 outside any exception is failed."""
    for code in (0, 1):
        t = WandbTracker(tmp_path / str(code))
        t.close(code)
    assert [r.calls for r in preemptible_wandb] == [[("finish", 0)], [("finish", 1)]]


@pytest.mark.slow
def test_a_sigterm_stop_reaches_the_offline_wandb_run_as_preempted(tmp_path: Path, wandb_env) -> None:  # noqa: F811
    """The real wandb (offline): the run's ``.wandb`` file holds a preempting record, and its exit record 143."""
    run_dir = tmp_path / "x"
    t = WandbTracker(run_dir, project="dgrpo", config={"seed": 0})
    t.log({"step": 0, "loss": 1.0}, 0)
    t.close(exit_code_of(Terminated("after step 0")))  # (as RunDir closes on a SIGTERM's stop)
    files = list((run_dir / "wandb").glob(f"offline-run-*-{t.run_id}/run-{t.run_id}.wandb"))
    assert len(files) == 1, files
    deadline = time.time() + 30
    records = list(_wandb_records(files[0]))
    while (not records or records[-1].WhichOneof("record_type") != "exit") and time.time() < deadline:
        time.sleep(0.05)  # (run.finish() can return before wandb-core has written its exit record)
        records = list(_wandb_records(files[0]))
    kinds, exit_code = [], None
    for record in records:
        kinds.append(record.WhichOneof("record_type"))
        if kinds[-1] == "exit":
            exit_code = record.exit.exit_code
    assert "preempting" in kinds and kinds.index("preempting") < kinds.index("exit"), kinds
    assert exit_code == 143


@pytest.mark.slow
def test_a_real_sigterm_in_a_grpo_step_ends_the_wandb_run_preempted(
    sft_checkpoint, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, preemptible_wandb: list[PreemptibleRun]
) -> None:
    """End to end: a SIGTERM in GRPO's third step (its checkpoint, step-00000002, written; the stop raised through
    the trainer's run directory) leaves the W&B run, which got the rows of steps 0 and 1, marked preempting and
    finished with 143."""
    from test_preemption import run_grpo, sigterm_after

    from dgrpo.training import grpo
    from dgrpo.training.preemption import sigterm_stops

    sigterm_after(monkeypatch, grpo.GRPOTrainer, "step", lambda t: t.step_idx == 2)
    with sigterm_stops(True), pytest.raises(Terminated):
        run_grpo(sft_checkpoint, tmp_path / "run", sets={"logging.backends": "[jsonl,wandb]"})
    (run,) = preemptible_wandb
    assert run.calls == [("mark_preempting", 0), ("finish", 143)]
    assert sorted({step for step, _ in run.logged}) == [0, 1]


class UploadingRun(PreemptibleRun):
    """A run whose ``finish`` (W&B's upload) gets a SIGTERM, a scheduler's stop, while it runs."""

    def finish(self, exit_code: int = 0) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)  # (the handler runs here, in the main thread)
        super().finish(exit_code)


def test_a_sigterm_while_a_completed_run_finishes_its_wandb_run_lets_it_finish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, preemptible_wandb: list[PreemptibleRun], capsys
) -> None:
    """The run completed and its directory closing: a SIGTERM during W&B's finish (its upload, seconds online) raised
    Terminated inside it (W&B: "Run data was not synced"), out of the run's close, and the completed run exited 143.
    Now, as while the run writes its end, it lets the finish end (one notice) and the run closes cleanly."""
    from dgrpo.training.distributed import Dist
    from dgrpo.training.preemption import sigterm_stops, within_step
    from dgrpo.training.run import RunDir

    from conftest import tiny_config

    def init(**kwargs: Any) -> UploadingRun:
        run = UploadingRun(kwargs["id"])
        preemptible_wandb.append(run)
        return run

    monkeypatch.setattr(sys.modules["wandb"], "init", init)
    cfg = tiny_config(**{"logging.backends": "[jsonl,wandb]"})
    try:
        with sigterm_stops(True):
            with RunDir(tmp_path / "run", cfg, Dist.single(), "grpo", resume="never", log=lambda line: None) as run:
                run.start(None)
                with within_step():  # (the training has begun: a SIGTERM no longer stops the run at once before it)
                    run.metrics.write({"step": 0, "loss": 1.0})
    except Terminated:  # (a KeyboardInterrupt: uncaught, it would end the pytest session)
        pytest.fail("the SIGTERM stopped the completed run's W&B finish at once")
    assert run.lock is None
    assert [r.calls for r in preemptible_wandb] == [[("finish", 0)]]
    err = capsys.readouterr().err
    assert "dgrpo: SIGTERM: the run is writing its end (finishing its W&B run): it finishes" in err, err
