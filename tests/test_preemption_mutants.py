"""SIGTERM's rules in one process and the torchrun watchdog, pinned one by one (gaps found by mutation testing of
dgrpo.training.preemption): a step holds a SIGTERM back, the same stop delivered again within REPEAT_S of the one that
counted is ignored, a later one stops at once; the watchdog ends the process for SIGTERM's byte only."""

import os
import signal
import time
from types import SimpleNamespace

import pytest

from dgrpo.training import preemption
from dgrpo.training.preemption import Terminated, sigterm_stops, stop_requested, within_step


@pytest.fixture
def clock(monkeypatch):
    """preemption's time.monotonic, set by the test (a list of one float): no real time passes between signals."""
    now = [100.0]
    monkeypatch.setattr(preemption, "time", SimpleNamespace(monotonic=lambda: now[0]))
    yield now
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def sigterm() -> None:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.01)  # (Python runs the handler at its next instruction in the main thread)


def test_in_one_process_a_repeat_counts_from_the_sigterm_that_counted(clock, capsys):
    """In a step the first SIGTERM asks (no raise); one 1 s later is the same stop (ignored); one 2.5 s after the first
    (1.5 s after the ignored one) is a second stop: Terminated at once."""
    with sigterm_stops(True), within_step():
        sigterm()
        assert stop_requested()
        clock[0] = 101.0
        sigterm()  # (within REPEAT_S = 2 s of the first: srun's copy of it)
        clock[0] = 102.5
        with pytest.raises(Terminated):
            sigterm()
    err = capsys.readouterr().err
    assert err.count("dgrpo: SIGTERM: stopping at the end of this step, after writing a resumable checkpoint") == 1


def test_in_one_process_a_sigterm_outside_a_step_stops_at_once_and_the_next_command_starts_clean(clock, capsys):
    """Outside a step: Terminated at once, nothing asked. The handler's next installation forgets the last SIGTERM's
    time and the request: a SIGTERM at the same clock time within a step of the next command asks again."""
    with sigterm_stops(True), pytest.raises(Terminated):
        sigterm()
    with sigterm_stops(True), within_step():
        assert not stop_requested()
        sigterm()
        assert stop_requested()
    assert not stop_requested()  # (the block's end: no request left behind)
    assert capsys.readouterr().err.count("stopping at the end of this step") == 1


def test_in_one_process_a_sigterm_while_the_run_writes_its_end_lets_it_finish(clock, capsys):
    """writing_the_end: a SIGTERM is held back as in a step (the notice says the run finishes); without the handler
    (a Python caller) writing_the_end records nothing, and after the block the end is forgotten."""
    with sigterm_stops(True):
        preemption.writing_the_end("final/ and summary.json")
        sigterm()
        assert stop_requested()
    assert (
        "dgrpo: SIGTERM: the run is writing its end (final/ and summary.json): it finishes" in capsys.readouterr().err
    )
    assert preemption._State.ending == ""
    with sigterm_stops(False):
        preemption.writing_the_end("final/")
        assert preemption._State.ending == ""


def test_a_step_outside_the_handler_or_after_it_holds_nothing_back():
    """within_step marks a step only where the handler is on, and a step's end unmarks it (an exception too)."""
    with within_step():
        assert not preemption._State.in_step
    with sigterm_stops(True):
        with pytest.raises(RuntimeError), within_step():
            assert preemption._State.in_step
            raise RuntimeError
        assert not preemption._State.in_step


def test_the_default_grace_period_is_sixty_seconds(monkeypatch):
    """DGRPO_SIGTERM_GRACE_S unset or blank: 60 s (torchrun's --shutdown-timeout is 30 s after its own forward)."""
    for unset in (None, "", "  "):
        if unset is None:
            monkeypatch.delenv(preemption.GRACE_ENV, raising=False)
        else:
            monkeypatch.setenv(preemption.GRACE_ENV, unset)
        assert preemption.grace_s() == 60.0
    monkeypatch.setenv(preemption.GRACE_ENV, " 2.5 ")
    assert preemption.grace_s() == 2.5


class Exited(BaseException):
    pass


@pytest.fixture
def exits(monkeypatch):
    """os._exit recorded (and raised as Exited) instead of ending pytest."""
    codes: list[int] = []

    def fake_exit(code: int) -> None:
        codes.append(code)
        raise Exited

    monkeypatch.setattr(os, "_exit", fake_exit)
    return codes


def watchdog(signals: bytes, grace: float = 0.01, done: bool = False) -> None:
    """_watchdog in this thread over a pipe that holds ``signals`` and is then closed."""
    read_fd, write_fd = os.pipe()
    os.write(write_fd, signals)
    os.close(write_fd)
    event = preemption.threading.Event()
    if done:
        event.set()
    preemption._watchdog(read_fd, grace, event)


def test_the_watchdog_wakes_for_sigterm_only_and_ends_the_process_with_143(exits, capsys, monkeypatch):
    """Other signals' bytes on the wakeup descriptor (SIGINT, SIGCHLD) start no countdown; SIGTERM's does, and with no
    stop within the grace period the process ends with 128 + 15, its line naming the rank and the grace."""
    watchdog(bytes([signal.SIGINT, signal.SIGCHLD]))
    assert exits == []
    watchdog(bytes([signal.SIGTERM]), done=True)  # (the run stopped in time)
    assert exits == []
    monkeypatch.setenv("RANK", "3")
    with pytest.raises(Exited):
        watchdog(bytes([signal.SIGINT, signal.SIGTERM]), grace=0.01)
    assert exits == [143]
    assert capsys.readouterr().err.startswith("dgrpo: rank 3: no stop within DGRPO_SIGTERM_GRACE_S = 0.01 s of SIGTERM")


def test_a_torchrun_workers_watchdog_stands_down_when_the_run_ends_in_time(exits, monkeypatch, capsys):
    """A SIGTERM asks (under torchrun nothing is raised, rank 0's notice says it once however often it comes); the
    block then ends within the grace period: the watchdog ends nothing after it, and Python's wakeup file descriptor
    is the one from before the block."""
    monkeypatch.setenv(preemption.GRACE_ENV, "0.2")
    monkeypatch.delenv("RANK", raising=False)
    try:
        with sigterm_stops(True, distributed=True):
            with within_step():  # (the first step began: from then on a SIGTERM asks)
                pass
            sigterm()
            sigterm()
            assert preemption._State.requested
        time.sleep(0.5)  # (past the grace period)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    assert exits == []
    assert signal.set_wakeup_fd(-1) == -1  # (none was set before the block)
    assert capsys.readouterr().err.count("dgrpo: SIGTERM: ") == 1


def test_a_handler_that_is_off_neither_asks_the_ranks_nor_keeps_the_test_set_phase():
    """sigterm_stops(False, distributed=True) (a Python caller): stop_requested asks no collective. After
    in_test_sets the run is out of its test sets again (a stop there is a step's again)."""
    asked = []
    dist = SimpleNamespace(active=True, is_main=True, max_float=lambda v: asked.append(v) or v)
    with sigterm_stops(False, distributed=True):
        assert not stop_requested(dist)
    assert asked == []
    with sigterm_stops(True, distributed=True):
        with preemption.in_test_sets("again"):
            assert preemption._where().startswith("every rank stops at the end of the test set under way")
        assert not preemption._State.testing
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def test_a_torchrun_workers_sigint_handler_is_the_callers_again_after_the_block_and_ignored_after_a_ctrl_c():
    """With a handler of the caller's own on SIGINT (not whatever an earlier block left): a block without Ctrl-C gives
    it back; the first Ctrl-C in a block raises KeyboardInterrupt and leaves SIGINT ignored (torchrun's second one)."""
    before = signal.getsignal(signal.SIGINT)

    def callers(signum, frame):
        raise AssertionError("the caller's handler ran")

    try:
        signal.signal(signal.SIGINT, callers)
        with sigterm_stops(True, distributed=True):
            assert signal.getsignal(signal.SIGINT) is preemption._interrupt_once
        assert signal.getsignal(signal.SIGINT) is callers
        with pytest.raises(KeyboardInterrupt), sigterm_stops(True, distributed=True):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def test_the_innermost_stopping_block_says_what_a_stop_interrupted():
    """A stop raised again by an inner ``stopping`` carries its message, which an outer block keeps; a message given
    as a callable is asked at the stop."""
    with pytest.raises(Terminated) as e, preemption.stopping("the outer"), preemption.stopping(lambda: "the inner"):
        raise Terminated
    assert e.value.args == ("the inner",) and isinstance(e.value.__cause__, Terminated)
    with pytest.raises(KeyboardInterrupt) as k, preemption.stopping("the run"):
        raise KeyboardInterrupt
    assert type(k.value) is KeyboardInterrupt and k.value.args == ("the run",)
