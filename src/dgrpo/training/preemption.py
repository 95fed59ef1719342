"""SIGTERM (``kill``, a job scheduler's stop or preemption) during a training command: the run writes a resumable
checkpoint at the end of the step under way and stops (:class:`Terminated`), so the same command goes on from there.

- One process: a SIGTERM within a step lets it finish; then the checkpoint, then the stop. Anywhere else (loading,
  evaluation, writing files), or at a second SIGTERM, the run stops at once, closing its files, trackers and lock.
- Under torchrun every rank gets the signal (from the scheduler, and again from torchrun, which forwards it): each
  SIGTERM only asks, and after every step the ranks agree (one all-reduce) whether any was asked, so all of them
  stop at the same step; rank 0 writes the checkpoint while the others wait. A rank blocked in a collective never
  runs Python's handler, so the first SIGTERM also arms an alarm: :data:`GRACE_ENV` seconds later (default
  :data:`GRACE_S`) the kernel ends the process however it is blocked (torchrun itself kills its workers 30 s after
  it forwarded the signal).

The command line installs the handler (:func:`sigterm_stops`); the loops mark their steps (:func:`within_step`),
ask :func:`stop_requested` after each and, when it is True, write the checkpoint and call :func:`stop`. From Python,
without the handler, none of this does anything: SIGTERM keeps its default.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    from .distributed import Dist

#: the environment variable that sets the seconds a torchrun worker has, after its first SIGTERM, to reach the end
#: of its step and write the checkpoint
GRACE_ENV = "DGRPO_SIGTERM_GRACE_S"
GRACE_S = 120


class Terminated(KeyboardInterrupt):
    """SIGTERM during a training command: raised in the main thread, so that the run closes its metrics, trackers
    and lock, and says how to go on, as Ctrl-C does."""


class _State:
    installed = False  # the handler is on (a training command)
    distributed = False  # under torchrun: a SIGTERM only asks; the ranks agree after each step
    in_step = False  # a training step is under way: a SIGTERM waits for its end
    requested = False  # a SIGTERM asked for a checkpoint and a stop at a step's end


def _is_rank0() -> bool:
    return os.environ.get("RANK", "0") == "0"


def _on_sigterm(signum: int, frame: object) -> None:
    if _State.distributed:
        if not _State.requested:
            _State.requested = True
            signal.alarm(max(1, int(os.environ.get(GRACE_ENV, GRACE_S))))  # SIGALRM's default ends the process
            if _is_rank0():
                print(
                    "dgrpo: SIGTERM: every rank stops at the end of this step, after writing a resumable checkpoint",
                    file=sys.stderr,
                    flush=True,
                )
        return
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
def sigterm_stops(on: bool, distributed: bool = False) -> Iterator[None]:
    """While a training command runs (``on``; ``distributed``: a torchrun worker): SIGTERM as the module says (it
    ended the process without a word)."""
    previous = signal.getsignal(signal.SIGTERM) if on else None
    try:
        if on:
            signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:  # not the main thread (an embedding application): keep the default
        on = False
    _State.installed, _State.distributed, _State.requested = on, on and distributed, False
    try:
        yield
    finally:
        if on:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
            signal.alarm(0)
        _State.installed = _State.distributed = _State.in_step = _State.requested = False


@contextmanager
def within_step() -> Iterator[None]:
    """A training step: a SIGTERM inside it waits for its end (see :func:`stop_requested`)."""
    _State.in_step = _State.installed
    try:
        yield
    finally:
        _State.in_step = False


def stop_requested(dist: Dist | None = None) -> bool:
    """Whether a SIGTERM asked to stop: then write a resumable checkpoint and :func:`stop`. Under torchrun (with the
    handler on) a collective: every rank calls it after every step, and all get the same answer."""
    if _State.distributed and dist is not None and dist.active:
        return dist.max_float(1.0 if _State.requested else 0.0) > 0
    return _State.requested


def stop(dist: Dist | None = None) -> NoReturn:
    """Raise :class:`Terminated` once the checkpoint is written: under torchrun every rank first waits for rank 0's
    write (a rank that left early would have torchrun end the others, rank 0 mid-write)."""
    if dist is not None and dist.active:
        dist.sum_int(0)
    raise Terminated
