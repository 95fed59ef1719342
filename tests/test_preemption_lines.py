"""What a SIGTERM's lines look like to the user: the notice on a line of its own below a drawn progress bar (it ran on
from the bar's text: ``...1.24it/s]dgrpo: SIGTERM: ...``), and the stop line of a run stopped after a step, which
names that step and its checkpoint (it named the checkpoints' folder only, while the bar showed the step before)."""

import os
import signal
import sys
import time
from functools import partial
from types import SimpleNamespace
from typing import Any

import pytest
from tqdm import tqdm

from dgrpo.cli.train import stopped_after
from dgrpo.training import preemption
from dgrpo.training.preemption import Terminated, sigterm_stops, stop, stop_requested, stopping, within_step

from conftest import tiny_args

pytestmark = pytest.mark.usefixtures("default_sigterm")  # (conftest: SIGTERM's default back after each test)


def sigterm() -> None:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.01)  # (Python runs the handler at its next instruction in the main thread)


def ranks(asked_elsewhere: bool = False) -> Any:
    """Rank 0 of two (max_float: the agreement's all-reduce; close: leaving the process group)."""
    return SimpleNamespace(
        active=True, is_main=True, max_float=lambda v: max(v, float(asked_elsewhere)), close=lambda: None
    )


def asked(where: str) -> None:
    """A SIGTERM's stop asked in a step: to this process (one, or torchrun's rank 0) or to another rank alone."""
    with within_step():
        if where == "another rank":
            assert stop_requested(ranks(asked_elsewhere=True))
        else:
            sigterm()
            assert stop_requested(ranks() if where == "torchrun" else None)


@pytest.mark.parametrize("where", ["one process", "torchrun", "another rank"])
def test_a_sigterm_notice_starts_a_line_of_its_own_below_a_drawn_bar(where, capsys):
    with sigterm_stops(True, distributed=where != "one process"):
        with tqdm(total=4, desc="grpo", file=sys.stderr, disable=False, mininterval=0) as bar:
            bar.update(1)
            asked(where)
    lines = capsys.readouterr().err.split("\n")
    said = [line for line in lines if "dgrpo: SIGTERM" in line]
    assert len(said) == 1 and said[0].startswith("dgrpo: SIGTERM"), lines
    assert "grpo:  25%" in lines[lines.index(said[0]) - 1]  # (the bar's line, above it)
    with sigterm_stops(True, distributed=where != "one process"):
        with tqdm(total=4, file=sys.stderr, disable=True):  # (a bar turned off: nothing above the notice)
            asked(where)
    assert capsys.readouterr().err.startswith("dgrpo: SIGTERM")


def checkpointed(out, *steps):
    for step in steps:
        (out / "checkpoints" / f"step-{step:08d}").mkdir(parents=True)
    (out / "checkpoints" / "damaged-step-00000099").mkdir()  # (set aside: not resumed)
    (out / "checkpoints" / ".tmp-step-00000098").mkdir()  # (half-written)
    return out


@pytest.mark.parametrize("distributed", [False, True], ids=["one-process", "torchrun"])
def test_a_stop_after_a_step_names_the_step_and_its_checkpoint(tmp_path, distributed):
    """The newest checkpoint by its step (9 < 10), the one the stop wrote and the same command resumes."""
    out = checkpointed(tmp_path, 9, 10)
    with sigterm_stops(True, distributed=distributed), pytest.raises(Terminated) as e:
        with stopping(partial(stopped_after, out)):
            asked("torchrun" if distributed else "one process")
            stop(ranks() if distributed else None)
    assert str(e.value) == f"after step 10, checkpointed in {out / 'checkpoints' / 'step-00000010'}"


def test_other_stops_say_no_step(tmp_path):
    """A stop at once (outside a step: no checkpoint written for it), Ctrl-C, one in the test sets (its own line),
    one before any checkpoint, and a guard's error keep what they say."""
    out = checkpointed(tmp_path, 3)
    said = partial(stopped_after, out)
    with sigterm_stops(True), pytest.raises(Terminated) as e, stopping(said):
        with within_step():  # (a step began: a stop now can lose one)
            pass
        sigterm()
    assert e.value.args == ()
    with sigterm_stops(True), pytest.raises(KeyboardInterrupt) as e, stopping(said):
        raise KeyboardInterrupt
    assert e.value.args == ()
    with sigterm_stops(True), pytest.raises(Terminated) as e, stopping(said):
        with preemption.in_test_sets():
            asked("one process")
            stop()
    assert e.value.args == ()
    with sigterm_stops(True), pytest.raises(Terminated) as e, stopping(partial(stopped_after, tmp_path / "none")):
        asked("one process")
        stop()
    assert e.value.args == ()
    with sigterm_stops(True), pytest.raises(ValueError), stopping(said):
        try:
            stop(error=ValueError("a guard"))
        finally:  # (read within the block: its end resets the flag, so an assert after it could not fail)
            assert not preemption.stopped_after_a_step()


@pytest.mark.slow
def test_a_grpo_run_stopped_after_a_step_says_which_on_its_stop_line(sft_checkpoint, tmp_path, run_cli, monkeypatch):
    """The command line end to end (one process): the last line names step 2 and its checkpoint."""
    from dgrpo.training import grpo

    original = grpo.GRPOTrainer.step

    def step(self):
        if self.step_idx == 1:  # (the second step)
            os.kill(os.getpid(), signal.SIGTERM)
        return original(self)

    monkeypatch.setattr(grpo.GRPOTrainer, "step", step)
    out = tmp_path / "run"
    r = run_cli("grpo", "--init", sft_checkpoint, "--out", out, *tiny_args(**{"grpo.steps": 4}))
    assert r.returncode == 143, r.stderr[-2000:]
    assert r.stderr.strip().splitlines()[-1] == (
        f"dgrpo: terminated (SIGTERM) after step 2, checkpointed in {out / 'checkpoints' / 'step-00000002'}; the "
        "same command resumes from it"
    )


def test_a_bar_being_built_is_not_drawn_and_does_not_fail_the_handler():
    """tqdm lists a bar before its __init__ sets ``disable``: a SIGTERM landing in between (an evaluation's bar is
    built at every evaluation) raised AttributeError in the handler, a traceback and exit 1 instead of the stop."""
    from dgrpo.progress import below_bar

    half_built = object.__new__(tqdm)
    tqdm._instances.add(half_built)
    try:
        assert below_bar("dgrpo: SIGTERM: x") == "dgrpo: SIGTERM: x"
    finally:
        tqdm._instances.discard(half_built)
        half_built.disable = True  # (its __del__ closes it: nothing to close)
