"""SIGTERM (``kill``, a job scheduler's stop or preemption) during a training command: the run writes a resumable
checkpoint at the end of the step under way and stops (:class:`Terminated`), so the same command goes on from there.

- One process: a SIGTERM within a step lets it finish; then the checkpoint, then the stop. Anywhere else (loading,
  evaluation, writing checkpoints; not the run's end, below), or at a second SIGTERM (:data:`REPEAT_S` or more
  after the first: srun and wrapper scripts deliver one stop twice), the run stops at once, closing its files,
  trackers and lock.
- Before the process's first training step (:func:`within_step`: loading, joining torchrun's process group, a resumed
  run's pending evaluation; not a resumed run's end, its test sets or end's writes) nothing a checkpoint could hold
  is lost: a SIGTERM stops it at once (:data:`BEFORE_TRAINING`), under torchrun too, where every rank gets it (a job
  whose rank 0 refused at the start: torchrun sends SIGTERM to the others, which ran on to its SIGKILL 30 s later). A
  rank whose handler cannot run there (blocked in C) is ended by the watchdog (below) :data:`PROMPT_S` after it.
- From then on, under torchrun every rank gets the signal (from the scheduler, and again from torchrun, which
  forwards it): each SIGTERM only asks, and after every step the ranks agree (one all-reduce) whether any was asked,
  so all of them stop at the same step; rank 0 writes the checkpoint while the others wait, then every rank leaves
  the process group and exits, SIGTERM ignored from then on (torchrun's own exit code is 1 all the same:
  docs/distributed.md).
  A rank blocked in a collective (a peer died) never runs Python's handler, so a watchdog thread, woken by the
  signal's byte on Python's wakeup file descriptor (written by the C-level handler whatever the main thread is
  doing), ends the process :data:`GRACE_ENV` seconds (default :data:`GRACE_S`) after the first SIGTERM unless the
  run stopped by then (torchrun itself kills its workers 30 s after it forwarded the signal: its
  ``--shutdown-timeout``).

The command line installs the handler (:func:`sigterm_stops`); the loops mark their steps (:func:`within_step`),
ask :func:`stop_requested` after each and, when it is True, write the checkpoint and call :func:`stop`. The
checkpoint comes before the work due at that step's end (GRPO's evaluation; SFT's epoch end: its evaluation,
``stage-K/``, ``best/``), which it records as still to do: the resumed run does it first, from the same RNG state, so
the grace period holds only the step and the checkpoint's write. At a run's end (:func:`in_test_sets`), after its
last checkpoint, the ranks agree before the test sets, after each and after the last, and stop with no checkpoint to
write. Then the run writes its end (``final/``, GRPO's ``summary.json``: :func:`writing_the_end`), with no agreement
left to stop the ranks together: a SIGTERM lets it finish (exit 0), in one process too, as a step is let finish.
``dgrpo eval`` installs the handler too: a SIGTERM stops it at once (exit 143); under torchrun, once its ranks have
agreed before its first dataset, at the end of the dataset under way (the ranks agree after each), and before that at
once, as a training command before its first step (a rank blocked in C ended :data:`PROMPT_S` after it). From
Python, without the handler, none of this does anything: SIGTERM keeps its default.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NoReturn

from ..progress import below_bar

if TYPE_CHECKING:
    from .distributed import Dist

#: the environment variable that sets the seconds a torchrun worker has, after its first SIGTERM, to reach the end
#: of its step and write the checkpoint
GRACE_ENV = "DGRPO_SIGTERM_GRACE_S"
GRACE_S = 60.0
#: (one process) a SIGTERM this soon after the one that asked for the stop is the same stop delivered again, not a
#: second one
REPEAT_S = 2.0
#: (torchrun) before the first training step, the seconds a worker whose handler has not run (blocked in C: joining
#: the process group, a setup collective whose peer is gone) has after a SIGTERM: nothing to checkpoint, so it ends
#: well within torchrun's 30 s before its SIGKILL (at most the grace period)
PROMPT_S = 5.0
#: what a stop before the first training step says (the stop line's "dgrpo: terminated (SIGTERM) ...")
BEFORE_TRAINING = "before the first training step (no training was lost)"
#: what the watchdog says of a stop of ``dgrpo eval`` before its first dataset (its stop line says its own:
#: ``dgrpo.cli.evaluate.NOTHING_YET``)
BEFORE_EVALUATING = "before the first dataset (nothing was evaluated)"


class Terminated(KeyboardInterrupt):
    """SIGTERM during a training command or ``dgrpo eval``: raised in the main thread, so that the run closes its
    metrics, trackers and lock, and says how to go on, as Ctrl-C does."""


#: the exit code of a process a SIGTERM stopped (128 + SIGTERM), what a run stopped so records
TERMINATED_EXIT = 128 + signal.SIGTERM


def exit_code_of(error: BaseException | None) -> int:
    """The exit code a run that ends with ``error`` records (its trackers', W&B's): 0 without one, a SIGTERM's stop
    (:class:`Terminated`) the process's 143 (128 + SIGTERM), a Ctrl-C's 130 (128 + SIGINT), any other error 1."""
    if error is None:
        return 0
    if isinstance(error, Terminated):
        return TERMINATED_EXIT
    return 128 + signal.SIGINT if isinstance(error, KeyboardInterrupt) else 1


#: what a stop in the test sets (:func:`in_test_sets`) leaves, as the ranks' lines say it ({again}: the command that
#: goes on, :meth:`~dgrpo.training.run.RunDir.same_command`)
TESTS_LEFT = "the training is checkpointed: {again} evaluates the test sets"
#: what a stop while the run writes its end ({what}: :func:`writing_the_end`) leaves, as the watchdog's line says it
END_LEFT = "the training is checkpointed: {again} evaluates the test sets and writes {what}"


class _State:
    installed = False  # the handler is on (a training command)
    stepped = True  # the command trains in steps, checkpointed at a stop (not dgrpo eval's datasets)
    distributed = False  # under torchrun: a SIGTERM only asks; the ranks agree after each step
    in_step = False  # a training step is under way: a SIGTERM waits for its end
    requested = False  # a SIGTERM asked for a checkpoint and a stop at a step's end
    stopping = False  # (under torchrun) the checkpoint is written and the process group left: the process is ending
    testing = False  # the run's end: its test sets are evaluated, its last checkpoint written (:func:`in_test_sets`)
    tested = "test set"  # (testing) what is evaluated, one at a time: the ranks agree after each
    left = ""  # (testing) what a stop there leaves, as the lines say it
    ending = ""  # what the run writes after its last agreement (:func:`writing_the_end`; "" before): a SIGTERM waits
    again = "the same command"  # (testing) the command that evaluates them after a stop
    last_at = -float("inf")  # time.monotonic() of the last SIGTERM that counted (one process)
    checkpointed = False  # the stop (:func:`stop`) came after a training step, its resumable checkpoint written
    begun = False  # this process's work has begun (its first training step: :func:`within_step`; dgrpo eval's first
    # dataset, or a run's test sets: :func:`in_test_sets`): a stop can lose some
    leaving = False  # the handler raised Terminated before the work began: the run is closing, not blocked


def is_rank0() -> bool:
    """Whether this process speaks for every rank: one process, or torchrun's global rank 0. It alone prints the lines
    of what every rank does together (a SIGTERM's stop, Ctrl-C, which torchrun sends to every worker, a guard's stop
    decided on values the ranks share); a rank's own failure is that rank's line (``dgrpo.cli._error``). A process
    of a job of one (``WORLD_SIZE`` unset, 0 or 1) is, whatever ``RANK`` a shell left set: as ``Dist.from_env``
    decides rank 0 for the trainers (a stray ``RANK=3`` silenced a run's errors and stop lines, not its others)."""
    several = os.environ.get("WORLD_SIZE", "").strip() not in ("", "0", "1")
    return not several or os.environ.get("RANK", "").strip() in ("", "0")


def grace_s() -> float:
    """:data:`GRACE_ENV`'s seconds (:data:`GRACE_S` when unset); a ConfigError line for a value that is not a
    positive number (read at the start, not in the signal handler)."""
    from ..config import ConfigError

    raw = os.environ.get(GRACE_ENV, "").strip()
    try:
        value = float(raw) if raw else GRACE_S
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise ConfigError(f"{GRACE_ENV}={raw!r}: must be a positive number of seconds")
    return value


def _watchdog(read_fd: int, grace: float, done: threading.Event) -> None:
    """(A daemon thread under torchrun.) Reads the signal numbers Python's C-level handler writes to the wakeup file
    descriptor; ``grace`` seconds after the first SIGTERM, unless the run ended (``done``), ends the process."""
    try:
        while True:
            data = os.read(read_fd, 64)
            if not data:  # the write end closed: the run is over
                return
            if signal.SIGTERM in data:
                if _before_training() and not done.wait(min(grace, PROMPT_S)) and not _State.leaving:
                    rank = f"rank {os.environ['RANK']}: " if "RANK" in os.environ else ""
                    before = BEFORE_TRAINING if _State.stepped else BEFORE_EVALUATING
                    line = f"dgrpo: {rank}SIGTERM {before}, its handler blocked: exiting"
                    print(below_bar(line), file=sys.stderr, flush=True)
                    os._exit(TERMINATED_EXIT)
                if not done.wait(grace):
                    rank = f"rank {os.environ['RANK']}: " if "RANK" in os.environ else ""
                    print(
                        below_bar(f"dgrpo: {rank}no stop within {GRACE_ENV} = {grace:g} s of SIGTERM {_left()}"),
                        file=sys.stderr,
                        flush=True,
                    )
                    os._exit(TERMINATED_EXIT)
                return
    except OSError:
        return
    finally:
        os.close(read_fd)


def _before_training() -> bool:
    """Whether a training command (the handler on) has not begun its first training step in this process, nor reached
    its end (a resumed run with no step left: its test sets, its end's writes), so that a stop loses nothing: no
    checkpoint could hold what the last one (or none) does not. For ``dgrpo eval`` (not ``stepped``): whether it
    has not begun its first dataset (nothing evaluated yet)."""
    return _State.installed and not (_State.begun or _State.testing or _State.ending)


def _left() -> str:
    """Where the watchdog ends the process, and what that leaves, as its line says it."""
    if _State.ending:
        return f"as the run wrote its end: exiting ({END_LEFT.format(what=_State.ending, again=_State.again)})"
    if _State.testing:
        return f"in a {_State.tested}: exiting ({_State.left})"
    return "(a rank blocked, or a long step or evaluation): exiting before it ended (nothing of it written)"


@contextmanager
def _watched(grace: float) -> Iterator[None]:
    """Python's wakeup file descriptor and its :func:`_watchdog` while the block runs (main thread only)."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    previous = signal.set_wakeup_fd(write_fd)
    done = threading.Event()
    threading.Thread(target=_watchdog, args=(read_fd, grace, done), daemon=True, name="dgrpo-sigterm").start()
    try:
        yield
    finally:
        done.set()
        signal.set_wakeup_fd(previous)
        os.close(write_fd)  # (the watchdog reads the end of the pipe, returns and closes its end)


def _on_sigterm(signum: int, frame: object) -> None:
    if _State.leaving and _State.distributed:
        return  # (the stop before the first step is under way, torchrun's forward of it too: the watchdog's grace)
    if _before_training() and not _State.leaving:
        _State.leaving, _State.last_at = True, time.monotonic()  # (a repeat in one process: below)
        # (nothing to checkpoint: every rank stops at once, as one process does; dgrpo eval's stop line says its own)
        raise Terminated(BEFORE_TRAINING) if _State.stepped else Terminated
    if _State.distributed:
        if not _State.requested:
            _State.requested = True
            if is_rank0():
                print(below_bar(f"dgrpo: SIGTERM: {_where()}"), file=sys.stderr, flush=True)
        return
    now = time.monotonic()
    if now - _State.last_at < REPEAT_S:
        return  # the same stop delivered twice (srun or a wrapper script forwards what the scheduler sent it)
    _State.last_at = now
    if (_State.in_step or _State.ending) and not _State.requested:
        _State.requested = True
        print(
            below_bar(f"dgrpo: SIGTERM: {_where()} (another SIGTERM {REPEAT_S:g} s or more later stops at once)"),
            file=sys.stderr,
            flush=True,
        )
        return
    raise Terminated


@contextmanager
def sigterm_stops(on: bool, distributed: bool = False, stepped: bool = True) -> Iterator[None]:
    """While a training command or ``dgrpo eval`` runs (``on``; ``distributed``: a torchrun worker; ``stepped``: a
    training command, whose stop comes after a step, with a checkpoint): SIGTERM as the module says (it ended the
    process without a word). After a torchrun worker's stop (:func:`stop`) SIGTERM stays
    ignored, not restored: the process is ending, and torchrun, seeing a rank exit, sends SIGTERM to the others, one of
    which, still ending, died of it (reported as "Signal 15 (SIGTERM) received", the checkpoint written)."""
    grace = grace_s() if on and distributed else 0.0
    previous = signal.getsignal(signal.SIGTERM) if on else None
    previous_int = signal.getsignal(signal.SIGINT)
    try:
        if on:
            signal.signal(signal.SIGTERM, _on_sigterm)
            if distributed:
                signal.signal(signal.SIGINT, _interrupt_once)
    except ValueError:  # not the main thread (an embedding application): keep the default
        on = False
    _State.installed, _State.distributed, _State.requested = on, on and distributed, False
    _State.stepped, _State.checkpointed = stepped, False
    _State.begun = _State.leaving = False
    _State.last_at = -float("inf")
    try:
        if _State.distributed:
            with _watched(grace):
                yield
        else:
            yield
    finally:
        if on:
            after = signal.SIG_IGN if _State.stopping else previous if previous is not None else signal.SIG_DFL
            signal.signal(signal.SIGTERM, after)
            if signal.getsignal(signal.SIGINT) is _interrupt_once:  # (after a Ctrl-C it stays ignored: the end)
                signal.signal(signal.SIGINT, previous_int)
        _State.installed = _State.distributed = _State.in_step = _State.requested = _State.stopping = False
        _State.checkpointed = _State.begun = _State.leaving = False
        _State.stepped = True
        _State.testing, _State.ending = False, ""


def _interrupt_once(signum: int, frame: Any) -> None:
    """Ctrl-C in a torchrun worker: torchrun sends SIGINT to every worker, and again while they end; a second one,
    landing as the worker wrote its stop or as the interpreter exited, printed a traceback on some ranks. The first
    raises KeyboardInterrupt, as Python's own handler does; the later ones are ignored."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


@contextmanager
def stops_at_once() -> Iterator[None]:
    """Runs that nobody resumes (the demo's, in its own process): a SIGTERM stops them at once, in a step or while a
    run writes its end too, as the command line's handler does elsewhere (no step is let finish, no checkpoint
    written for it). The handler's state is as before after the block."""
    installed, _State.installed = _State.installed, False
    try:
        yield
    finally:
        _State.installed = installed


@contextmanager
def within_step() -> Iterator[None]:
    """A training step: a SIGTERM inside it waits for its end (see :func:`stop_requested`)."""
    _State.in_step = _State.installed
    _State.begun = _State.begun or _State.installed
    try:
        yield
    finally:
        _State.in_step = False


def _where() -> str:
    """What a SIGTERM that waits does, as its notice says it (under torchrun rank 0's)."""
    if _State.ending:
        return f"the run is writing its end ({_State.ending}): it finishes"
    if not _State.distributed:
        return "stopping at the end of this step, after writing a resumable checkpoint"
    if _State.testing:
        return f"every rank stops at the end of the {_State.tested} under way ({_State.left})"
    if not _State.stepped:  # (dgrpo eval after its datasets: before them a SIGTERM stopped it at once)
        return "every dataset is evaluated and its results written: it finishes"
    if not _State.in_step:  # (an evaluation, a checkpoint's write: the ranks agree after the next step, or at the end)
        return (
            "every rank stops where the ranks next agree: after the next step, with its resumable checkpoint, or at "
            "the run's end"
        )
    return "every rank stops at the end of this step, after writing a resumable checkpoint"


@contextmanager
def in_test_sets(again: str = "the same command", *, tested: str = "test set", left: str = "") -> Iterator[None]:
    """The run's end, its test sets evaluated after its last checkpoint: under torchrun a SIGTERM's notice says the
    ranks stop after the test set under way (they agree after each one), with no checkpoint to write, and that
    ``again`` (the command that goes on from the checkpoint) evaluates them. ``dgrpo eval``'s datasets: ``tested``
    names what is evaluated one at a time, ``left`` what a stop leaves (default: the training's :data:`TESTS_LEFT`).
    The command's work has begun: a SIGTERM no longer stops it at once as one before it does."""
    _State.testing, _State.again, _State.tested = True, again, tested
    _State.begun = _State.begun or _State.installed
    _State.left = left or TESTS_LEFT.format(again=again)
    try:
        yield
    finally:
        _State.testing = False


def writing_the_end(what: str) -> None:
    """From the run's last agreement (after its test sets) until it is over: it writes ``what`` (``final/``, and
    ``summary.json``); a SIGTERM lets it finish, and its notice says so. "" when the run is over (its directory
    closed: a process that runs several, as the demo does, stops at once between them again)."""
    _State.ending = what if _State.installed else ""


@contextmanager
def letting_finish(what: str) -> Iterator[None]:
    """The block ends a run that completed, once its directory is closing (:func:`writing_the_end` is over): in one
    process a SIGTERM lets it finish, as it lets the run's end be written (its notice names ``what``; a second one
    :data:`REPEAT_S` or more later stops at once), where it stopped the block at once (W&B's finish of the run's W&B
    run, its upload: interrupted, the run's data left unsynced, and the completed run exiting 143). Under torchrun a
    SIGTERM only asks there already; with the handler off, or within the run's end, nothing changes."""
    shield = _State.installed and not _State.distributed and not _State.ending
    if shield:
        _State.ending = what
    try:
        yield
    finally:
        if shield:
            _State.ending = ""


def stop_requested(dist: Dist | None = None) -> bool:
    """Whether a SIGTERM asked to stop: then write a resumable checkpoint (none in the test sets) and :func:`stop`.
    Under torchrun (with the handler on) a collective: every rank calls it after every step and after each test set,
    and all get the same answer."""
    if _State.distributed and dist is not None and dist.active:
        agreed = dist.max_float(1.0 if _State.requested else 0.0) > 0
        if agreed and not _State.requested:  # (the SIGTERM reached other ranks only: rank 0 had said nothing)
            _State.requested = True
            if dist.is_main:
                now = (
                    f"({_State.left})"
                    if _State.testing
                    else "after writing a resumable checkpoint of this step"
                    if _State.stepped
                    else BEFORE_EVALUATING  # (dgrpo eval, before its datasets)
                )
                line = f"dgrpo: SIGTERM (to another rank): every rank stops now {now}"
                print(below_bar(line), file=sys.stderr, flush=True)
        return agreed
    return _State.requested


def stop_if_requested(dist: Dist | None, what: str) -> None:
    """:func:`stop`, its :class:`Terminated` saying ``what``, when a SIGTERM asked to (:func:`stop_requested`: under
    torchrun a collective)."""
    with stopping(what):
        if stop_requested(dist):
            stop(dist)


def stop(dist: Dist | None = None, error: Exception | None = None) -> NoReturn:
    """Raise :class:`Terminated` (or ``error``: a run's guard that stopped every rank at once) once the checkpoint (in
    the test sets: the set's results) is written: under torchrun every rank first waits for rank 0's write (a rank
    that left early would have torchrun end the others, rank 0 mid-write, after its ``--shutdown-timeout``), then
    leaves the process group as a finished run does (:meth:`~dgrpo.training.distributed.Dist.close`: its threads
    joined here, not in the interpreter's teardown, where NCCL warns of a group "NOT destroyed")."""
    if dist is not None and dist.active:
        _State.stopping = _State.distributed
        dist.close()  # (a barrier, then the group destroyed)
    _State.checkpointed = error is None and _State.installed and _State.stepped and not _State.testing
    raise Terminated if error is None else error


def stopped_after_a_step() -> bool:
    """Whether the stop under way is a SIGTERM's after a training step, that step's resumable checkpoint written
    (:func:`stop`, not in the test sets); not one at once (one process: outside a step, a second SIGTERM), nor
    Ctrl-C. Its stop line names the step (:func:`stopping`, in ``dgrpo.cli.train``)."""
    return _State.checkpointed


@contextmanager
def stopping(what: str | Callable[[], str]) -> Iterator[None]:
    """A stop within the block (SIGTERM's :class:`Terminated`, Ctrl-C's KeyboardInterrupt) is raised again with
    ``what`` (or what it returns at the stop) as its message: what the stop interrupted, and what that leaves on disk
    (the command's stop line says it). The innermost block says it: a stop that carries a message goes on as it is,
    and so does one for which ``what`` returns ""."""
    try:
        yield
    except KeyboardInterrupt as e:
        said = "" if e.args else what if isinstance(what, str) else what()
        if not said:
            raise
        raise type(e)(said) from e
