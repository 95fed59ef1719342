"""SIGTERM's handler at its edges (a second pass of mutation testing of dgrpo.training.preemption): the caller's own
SIGTERM handler comes back after the block, a stop in one process never leaves SIGTERM ignored, the grace period is
read for torchrun workers only, a SIGTERM exactly REPEAT_S after the one that counted is a second stop, and outside
the main thread the handler is off."""

import signal
import threading
from types import SimpleNamespace

import pytest

from dgrpo.training import preemption
from dgrpo.training.preemption import Terminated, sigterm_stops, stop, stop_requested, within_step

pytestmark = pytest.mark.usefixtures("default_sigterm")  # (conftest: SIGTERM's default back after each test)


def test_the_callers_own_sigterm_handler_is_back_after_the_block():
    """An embedding application's SIGTERM handler: the block's end gives it back (not SIG_DFL), in one process and
    under torchrun alike when the run did not stop."""

    def callers(signum, frame):
        raise AssertionError("the caller's handler ran")

    for distributed in (False, True):
        signal.signal(signal.SIGTERM, callers)
        with sigterm_stops(True, distributed=distributed):
            assert signal.getsignal(signal.SIGTERM) is preemption._on_sigterm
        assert signal.getsignal(signal.SIGTERM) is callers


def test_a_stop_in_one_process_with_a_process_group_leaves_sigterm_as_it_was():
    """stop() with an active group, the handler installed for one process: the group is left, Terminated raised, and
    SIGTERM is restored afterwards (ignored only after a torchrun worker's stop)."""
    closed = []
    dist = SimpleNamespace(active=True, close=lambda: closed.append(True))
    with sigterm_stops(True), pytest.raises(Terminated):
        stop(dist)
    assert closed == [True]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_bad_grace_period_matters_to_torchrun_workers_only(monkeypatch):
    """DGRPO_SIGTERM_GRACE_S is the watchdog's, which only torchrun workers run: one process (or the handler off)
    starts whatever it says; a torchrun worker refuses it as a config line."""
    from dgrpo.config import ConfigError

    monkeypatch.setenv(preemption.GRACE_ENV, "soon")
    with sigterm_stops(True):
        pass
    with sigterm_stops(False, distributed=True):
        pass
    with pytest.raises(ConfigError), sigterm_stops(True, distributed=True):
        pass


def test_a_sigterm_exactly_repeat_s_after_the_one_that_counted_stops_at_once(monkeypatch):
    """REPEAT_S or more after the SIGTERM that asked is a second stop: at exactly 2.0 s, Terminated."""
    now = [50.0]
    monkeypatch.setattr(preemption, "time", SimpleNamespace(monotonic=lambda: now[0]))
    with sigterm_stops(True), within_step():
        preemption._on_sigterm(signal.SIGTERM, None)
        assert stop_requested()
        now[0] = 50.0 + preemption.REPEAT_S
        with pytest.raises(Terminated):
            preemption._on_sigterm(signal.SIGTERM, None)


def test_outside_the_main_thread_the_handler_is_off():
    """sigterm_stops in another thread (signal handlers are the main thread's): nothing installed, no step marked,
    SIGTERM's handler untouched, and the block ends without an error."""
    seen: dict = {}

    def body():
        try:
            with sigterm_stops(True), within_step():
                seen["installed"], seen["in_step"] = preemption._State.installed, preemption._State.in_step
        except BaseException as e:  # noqa: BLE001 - reported to the main thread
            seen["error"] = e

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert seen == {"installed": False, "in_step": False}
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert not preemption._State.installed


def test_stop_if_requested_leaves_the_process_group_and_says_what_the_stop_interrupted():
    """Under torchrun, after the ranks agree on a stop: the group is left (its barrier waits for rank 0's checkpoint)
    and Terminated carries ``what``; with nothing asked, nothing happens."""
    closed = []
    dist = SimpleNamespace(active=True, is_main=True, max_float=lambda v: v, close=lambda: closed.append(True))
    with sigterm_stops(True, distributed=True):
        preemption.stop_if_requested(dist, "step 3")
        assert closed == []
        preemption._State.requested = True
        with pytest.raises(Terminated) as e:
            preemption.stop_if_requested(dist, "step 3")
    assert closed == [True] and e.value.args == ("step 3",)
