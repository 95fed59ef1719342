"""SIGTERM (``kill``, a job scheduler's stop or preemption) during a training command: a SIGTERM that arrives within
a training step lets the step finish; the loop then writes a resumable checkpoint and stops (:class:`Terminated`),
so the same command goes on from that step. Anywhere else (loading, evaluation, writing files), or at a second
SIGTERM, the run stops at once, closing its files, trackers and lock.

The command line installs the handler (:func:`sigterm_stops`) for one-process runs; the loops mark their steps
(:func:`within_step`) and ask :func:`stop_requested` after each. From Python, without the handler, neither does
anything: SIGTERM keeps its default.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager


class Terminated(KeyboardInterrupt):
    """SIGTERM during a training command: raised in the main thread, so that the run closes its metrics, trackers
    and lock, and says how to go on, as Ctrl-C does."""


class _State:
    installed = False  # the handler is on (a one-process training command)
    in_step = False  # a training step is under way: a SIGTERM waits for its end
    requested = False  # a SIGTERM came within a step: checkpoint at its end, then stop


def _on_sigterm(signum: int, frame: object) -> None:
    if _State.in_step and not _State.requested:
        _State.requested = True
        print(
            "dgrpo: SIGTERM: stopping at the end of this step, after writing a resumable checkpoint (a second SIGTERM "
            "stops at once)",
            file=sys.stderr,
            flush=True,
        )
        return
    raise Terminated


@contextmanager
def sigterm_stops(on: bool) -> Iterator[None]:
    """While a training command runs in one process (``on``): SIGTERM as the module says (it ended the process
    without a word). Not under torchrun, whose workers must die at once when their launcher does: one blocked in a
    collective would never reach Python's handler."""
    previous = signal.getsignal(signal.SIGTERM) if on else None
    try:
        if on:
            signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:  # not the main thread (an embedding application): keep the default
        on = False
    _State.installed, _State.requested = on, False
    try:
        yield
    finally:
        if on:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
        _State.installed = _State.in_step = _State.requested = False


@contextmanager
def within_step() -> Iterator[None]:
    """A training step: a SIGTERM inside it waits for its end (see :func:`stop_requested`)."""
    _State.in_step = _State.installed
    try:
        yield
    finally:
        _State.in_step = False


def stop_requested() -> bool:
    """A SIGTERM came during the step just finished: write a resumable checkpoint, then raise :class:`Terminated`."""
    return _State.requested
