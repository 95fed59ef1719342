"""Under torchrun, a SIGTERM before the run's first training step (loading, joining the process group, the setup's
collectives) stops the worker at once, as in one process: there is nothing a checkpoint could hold that the last one
(or none) does not. From the first step on, the ranks agree on the stop (tests/test_preemption.py)."""

import fcntl
import os
import re
import signal
import threading
import time
from datetime import datetime

import pytest
from test_preemption import torchrun_grpo

from dgrpo.training import preemption
from dgrpo.training.preemption import (
    BEFORE_TRAINING,
    Terminated,
    in_test_sets,
    sigterm_stops,
    stops_at_once,
    within_step,
    writing_the_end,
)

#: a rank and when it ended, in torchrun's report of its failed workers
REPORTED = re.compile(r"time\s*:\s*(\S+)\s+host\s*:\s*\S+\s+rank\s*:\s*(\d+)")


@pytest.mark.slow
def test_a_torchrun_job_whose_rank_0_refuses_at_the_start_ends_without_a_sigkill(sft_checkpoint, tmp_path):
    """Rank 0 alone takes OUT's lock: held by another process, it refuses in one line and exits 2, and torchrun sends
    SIGTERM to rank 1, which (its handler only asking, or blocked where Python's handler cannot run) went on until
    torchrun's SIGKILL 30 s later."""
    out = tmp_path / "run"
    out.mkdir()
    with open(out / ".lock", "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        t0 = time.monotonic()
        job = torchrun_grpo(sft_checkpoint, out, start_new_session=True)
        _, err = job.communicate(timeout=120)
        took = time.monotonic() - t0
    # torchrun's report: when it saw each rank end (rank 1 was killed 30 s after rank 0's exit 2)
    ended = {int(r): datetime.strptime(t, "%Y-%m-%d_%H:%M:%S") for t, r in REPORTED.findall(err)}
    gap = (ended[1] - ended[0]).total_seconds()
    print(
        f"torchrun took {took:.1f} s; rank 1 ended {gap:.0f} s after rank 0",
        *(x for x in err.splitlines() if "dgrpo" in x),
    )
    assert "is in use by another dgrpo process" in err, err[-3000:]
    assert "SIGKILL" not in err and "Signal 9" not in err, err[-3000:]
    assert "exitcode  : 143" in err and gap < 10, err[-3000:]


def handler_call():
    """What the installed handler does with one SIGTERM: "raised: MESSAGE", or "asked" (a request, no stop yet)."""
    try:
        signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)
    except Terminated as e:
        return f"raised: {e}"
    return "asked" if preemption._State.requested else "nothing"


@pytest.mark.parametrize("distributed", [False, True], ids=["one-process", "torchrun"])
def test_a_sigterm_before_the_first_step_stops_at_once_and_from_it_on_is_agreed(distributed, monkeypatch):
    """Before the process's first training step (loading, joining, a resumed run's pending evaluation) there is
    nothing to checkpoint: the stop is at once, its line says so, and the same stop delivered again (torchrun forwards
    it) is ignored while the run closes (in one process a second stop, REPEAT_S later, is one: at once again). Once a
    step has begun, under torchrun a SIGTERM only asks (the ranks agree after the step); in one process, outside a
    step, it stops at once without that line."""
    with sigterm_stops(True, distributed=distributed):
        assert handler_call() == f"raised: {BEFORE_TRAINING}"
        assert handler_call() == "nothing"  # (the same stop again: the run is closing)
        monkeypatch.setattr(preemption, "REPEAT_S", 0.0)
        assert handler_call() == ("nothing" if distributed else "raised: ")  # (torchrun: the watchdog's grace)
    with sigterm_stops(True, distributed=distributed):
        with within_step():
            pass
        assert handler_call() == ("asked" if distributed else "raised: ")


@pytest.mark.parametrize("where", ["test sets", "end", "eval", "demo"])
def test_a_sigterm_at_a_resumed_runs_end_or_outside_training_keeps_its_stop(where):
    """A resumed run with no step left (its test sets, its end's writes), dgrpo eval in its datasets (no steps) and
    the demo's runs (stopped at once, not resumed) keep what they did: the agreed stop under torchrun, none of the
    line."""
    with sigterm_stops(True, distributed=where != "demo", stepped=where != "eval"):
        if where == "test sets":
            with in_test_sets():
                assert handler_call() == "asked"
        elif where == "end":
            writing_the_end("final/")
            assert handler_call() == "asked"
        elif where == "eval":
            with in_test_sets(tested="dataset"):
                assert handler_call() == "asked"
        else:
            with stops_at_once():
                assert handler_call() == "raised: "


def test_dgrpo_eval_before_its_first_dataset_stops_at_once_under_torchrun_and_is_watched_so():
    """dgrpo eval (no steps) before its first dataset (loading, joining): nothing is evaluated, so under torchrun a
    SIGTERM stops it at once too (a job whose rank 0 refused at the start ran on to torchrun's SIGKILL 30 s later:
    tests/test_eval_torchrun_stop.py), with no training run's words (its stop line says its own), the stop
    delivered again ignored; after its datasets, what it said (every dataset written: it finishes)."""
    with sigterm_stops(True, distributed=True, stepped=False):
        assert preemption._before_training()  # (the watchdog's PROMPT_S)
        assert handler_call() == "raised: "
        assert handler_call() == "nothing"
    with sigterm_stops(True, distributed=True, stepped=False):
        with in_test_sets(tested="dataset"):
            pass
        assert not preemption._before_training() and handler_call() == "asked"
        assert preemption._where() == "every dataset is evaluated and its results written: it finishes"


def watched(monkeypatch, before_step: bool, leaving: bool = False) -> bool:
    """Whether the watchdog (grace 30 s) ends the process within a second of a SIGTERM whose handler did not run
    (``leaving``: it did, and the run is closing)."""
    exits, done = [], threading.Event()

    def exit_(code):
        exits.append(code)
        done.set()  # (the watchdog's thread then returns)

    monkeypatch.setattr(os, "_exit", exit_)
    preemption._State.begun, preemption._State.leaving = not before_step, leaving
    read_fd, write_fd = os.pipe()
    thread = threading.Thread(target=preemption._watchdog, args=(read_fd, 30.0, done), daemon=True)
    thread.start()
    os.write(write_fd, bytes([signal.SIGTERM]))
    time.sleep(1.0)
    done.set()
    thread.join(5)
    os.close(write_fd)
    return exits == [128 + signal.SIGTERM]


def test_before_the_first_step_the_watchdog_ends_a_blocked_rank_in_seconds(monkeypatch):
    """A rank whose handler cannot run (blocked in C: joining the process group, a setup collective whose peer is
    gone) had the whole grace period (60 s, past torchrun's SIGKILL at 30 s) though it had nothing to checkpoint."""
    monkeypatch.setattr(preemption, "PROMPT_S", 0.2)
    with sigterm_stops(True, distributed=True):  # (the handler on: a training command)
        assert watched(monkeypatch, before_step=True)
        assert not watched(monkeypatch, before_step=True, leaving=True)  # (closing: its grace period)
        assert not watched(monkeypatch, before_step=False)  # (a step: its grace period)
