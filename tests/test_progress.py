"""A line a trainer prints mid-run starts a line of its own below a drawn progress bar, on a terminal where the bar
(stderr) and the line (stdout) meet."""

import io
import sys

from tqdm import tqdm

from dgrpo.progress import say


def test_a_trainers_line_mid_run_is_not_run_on_from_the_bars_text(monkeypatch):
    """SFT's ``stage 0 done: ...`` (printed while its bar was drawn) read ``...1.25it/s, loss=1.401]stage 0 done``;
    through :func:`say` the bar's text is cleared first and drawn again below. No bar: the line as print writes it."""
    terminal = io.StringIO()  # (one stream for both: what a terminal shows)
    monkeypatch.setattr(sys, "stdout", terminal)
    say("before any bar")
    with tqdm(range(3), desc="sft", file=terminal, mininterval=0) as bar:
        for i in bar:
            bar.set_postfix(loss=1.0)
            if i == 1:
                say("stage 0 done: step=2")
    shown = terminal.getvalue()
    assert shown.startswith("before any bar\n")
    assert "stage 0 done: step=2\n" in shown and "]stage 0 done" not in shown, repr(shown)
    assert shown.rindex("sft:") > shown.index("stage 0 done")  # the bar drawn again below the line
    off = io.StringIO()
    monkeypatch.setattr(sys, "stdout", off)
    with tqdm(range(2), file=off, disable=True):
        say("a disabled bar: as print")
    assert off.getvalue() == "a disabled bar: as print\n"
