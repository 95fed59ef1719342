"""What a SIGTERM's lines look like to the user: the notice on a line of its own below a drawn progress bar (it ran on
from the bar's text: ``...1.24it/s]dgrpo: SIGTERM: ...``)."""

import os
import signal
import sys
import time
from types import SimpleNamespace
from typing import Any

import pytest
from tqdm import tqdm

from dgrpo.training.preemption import sigterm_stops, stop_requested, within_step


@pytest.fixture(autouse=True)
def default_sigterm():
    yield
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


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
