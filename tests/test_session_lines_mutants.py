"""Tests for the survivors of mutation testing of the session's new code: the lines below a progress bar
(``dgrpo.progress``), a SIGTERM's stop line (``stopped_after``), GRPO's done line and the bench's re-run (the
plots' y floor: tests/test_plot_axes.py)."""

import os
import signal
import sys
import threading
import time
from types import SimpleNamespace

import pytest
from tqdm import tqdm

from dgrpo.bench import launch
from dgrpo.progress import bar_drawn, below_bar
from dgrpo.training import preemption
from dgrpo.training.preemption import Terminated, sigterm_stops, stop, stopped_after_a_step, within_step

from conftest import tiny_args

pytestmark = pytest.mark.usefixtures("default_sigterm")  # (conftest: SIGTERM's default back after each test)


def test_a_drawn_bar_beside_a_half_built_one_is_drawn():
    """Any drawn bar counts, whatever is listed beside it: a bar tqdm lists before its __init__ sets ``disable``
    (mutant: every listed bar must be drawn)."""
    half_built = object.__new__(tqdm)
    tqdm._instances.add(half_built)
    try:
        with tqdm(total=1, file=sys.stderr, disable=False, mininterval=0):
            assert bar_drawn()
        assert not bar_drawn()
    finally:
        tqdm._instances.discard(half_built)
        half_built.disable = True  # (its __del__ closes it: nothing to close)


@pytest.mark.parametrize("error", [AttributeError, RuntimeError])
def test_a_set_of_bars_that_cannot_be_read_is_no_bar(monkeypatch, error):
    """No set of bars yet (a tqdm that makes it with its first bar), or one changed by another thread as it is read:
    no bar drawn, and the line as it is, not an exception in a signal handler."""

    class Unreadable:
        def __iter__(self):
            raise error("Set changed size during iteration")

    if error is AttributeError:
        monkeypatch.delattr(tqdm, "_instances")
    else:
        monkeypatch.setattr(tqdm, "_instances", Unreadable())
    assert not bar_drawn() and below_bar("dgrpo: SIGTERM: x") == "dgrpo: SIGTERM: x"


def test_nothing_to_say_stays_nothing_below_a_bar():
    """An empty text is not turned into an empty line (mutant: below_bar("") gave "\\n" while a bar was drawn)."""
    with tqdm(total=1, file=sys.stderr, disable=False, mininterval=0):
        assert below_bar("") == "" and below_bar("x") == "\nx"


def test_the_watchdogs_line_starts_below_a_drawn_bar(monkeypatch, capsys):
    """The torchrun watchdog's 'no stop within' line, as the SIGTERM notices: on a line of its own (mutant: run on)."""
    ended = []
    monkeypatch.setattr(os, "_exit", ended.append)
    read_fd, write_fd = os.pipe()
    os.write(write_fd, bytes([signal.SIGTERM]))
    with tqdm(total=4, desc="grpo", file=sys.stderr, disable=False, mininterval=0) as bar:
        bar.update(1)
        preemption._watchdog(read_fd, 0.001, threading.Event())
    os.close(write_fd)
    lines = capsys.readouterr().err.split("\n")
    said = [i for i, line in enumerate(lines) if "no stop within" in line]
    assert ended == [128 + signal.SIGTERM] and len(said) == 1, lines
    assert lines[said[0]].startswith("dgrpo: ") and "grpo:  25%" in lines[said[0] - 1], lines


def test_only_a_training_commands_stop_after_a_step_is_one():
    """dgrpo eval's stop (stepped=False), a guard's error and a stop without the handler are no stop after a training
    step, even while they propagate; a stop after a step is, until its handler's block ends (mutants: each condition
    dropped, the reset at the block's end dropped)."""
    with sigterm_stops(True, stepped=False), pytest.raises(Terminated):
        try:
            with within_step():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.01)
            stop()
        finally:
            assert not stopped_after_a_step()
    with sigterm_stops(False), pytest.raises(Terminated):  # (no handler: no SIGTERM's stop)
        try:
            stop()
        finally:
            assert not stopped_after_a_step()
    with sigterm_stops(True), pytest.raises(ValueError):
        try:
            stop(error=ValueError("a guard"))
        finally:
            assert not stopped_after_a_step()
    with sigterm_stops(True), pytest.raises(Terminated):
        try:
            stop()
        finally:
            assert stopped_after_a_step()
    assert not stopped_after_a_step()


@pytest.mark.slow  # (an SFT run of two steps through the command line: ~3 s)
def test_an_sft_run_stopped_after_a_step_says_which_on_its_stop_line(tmp_path, run_cli, monkeypatch):
    """As GRPO's (test_preemption_lines): SFT's stop line names the step it stopped after and its checkpoint
    (mutant: SFT's command without the stopping block, its line naming the checkpoints' folder only)."""
    from dgrpo.training import sft

    original = sft.SFTRun.step

    def step(self, *args):
        if self.prog.global_step == 1:  # (the second step)
            os.kill(os.getpid(), signal.SIGTERM)
        return original(self, *args)

    monkeypatch.setattr(sft.SFTRun, "step", step)
    out = tmp_path / "run"
    sets = {
        "task.n_train": 64,
        "sft.batch_size": 16,
        "sft.num_epochs": 1,
        "sft.epochs_per_stage": 1,
        "sft.warmup_steps": 0,
    }
    r = run_cli("sft", "--out", out, *tiny_args(**sets))
    assert r.returncode == 143, r.stderr[-2000:]
    assert r.stderr.strip().splitlines()[-1] == (
        f"dgrpo: terminated (SIGTERM) after step 2, checkpointed in {out / 'checkpoints' / 'step-00000002'}; the "
        "same command resumes from it"
    )


def test_a_validated_run_without_a_best_says_it_was_validated(tmp_path):
    """grpo.save_best=false: validated, no best/ kept; the done line says so (mutant: 'not validated' for it)."""
    from dgrpo.training.grpo import LoopState, _summary

    lines: list[str] = []
    run = SimpleNamespace(out_dir=tmp_path, resumed_step=None, log=lines.append)
    _summary(run, LoopState(last_eval=0.25, started=time.time()), 3, {}, unkept="grpo.save_best=false")
    assert lines[0].endswith(
        "; validation: final 25.00% (no best/: grpo.save_best=false); 0 of 3 steps skipped (every group filtered out)"
    )


def test_an_empty_child_marker_is_no_child(monkeypatch):
    """DGRPO_BENCH_CHILD set empty (as an empty OMP_WAIT_POLICY is unset): the suite re-runs itself under PASSIVE
    (mutant: an empty marker taken for the child's, the suite run under OpenMP's spinning default)."""
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.setenv(launch.CHILD_ENV, "")
    assert launch.needs_child()
    monkeypatch.setenv(launch.CHILD_ENV, "1")
    assert not launch.needs_child()
