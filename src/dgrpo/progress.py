"""When dgrpo draws a progress bar (shown where asked, unless the user turned tqdm off with ``TQDM_DISABLE``), and
its lines while a bar is drawn."""

from __future__ import annotations

import os
import sys

#: the values of ``TQDM_DISABLE`` that turn every bar off (tqdm reads the variable only for bars whose ``disable``
#: is left at its default; dgrpo passes ``disable`` explicitly, so it reads the variable itself)
TRUE_VALUES = frozenset({"1", "true", "yes", "on"})


def bar_disabled(shown: bool) -> bool:
    """The ``disable=`` for a tqdm bar that dgrpo would show when ``shown``: off as well under ``TQDM_DISABLE=1``."""
    return not shown or os.environ.get("TQDM_DISABLE", "").strip().lower() in TRUE_VALUES


def bar_drawn() -> bool:
    """Whether a tqdm bar is drawn now: its line, with no newline yet, is where the next text on the terminal goes.
    (tqdm not imported: none.)"""
    std = sys.modules.get("tqdm.std")
    try:  # (a bar is listed before its __init__ sets ``disable``: a signal may land in between)
        return std is not None and any(not getattr(bar, "disable", True) for bar in list(std.tqdm._instances))
    except (RuntimeError, AttributeError):  # (the set of bars changed in another thread as it was read; no set yet)
        return False


def below_bar(text: str) -> str:
    """``text`` (a line for stderr) on a line of its own while a bar is drawn, not run on from the bar's text
    (``...1.24it/s]dgrpo: SIGTERM: ...``): the bar is drawn again below it at its next update. No lock is taken (a
    signal handler calls this; ``tqdm.write`` takes the bars' lock, which the interrupted main thread may hold)."""
    return "\n" + text if text and bar_drawn() else text


def say(text: str) -> None:
    """``print(text)`` on a line of its own while a bar is drawn: the trainers' lines mid-run (``stage 0 done: ...``)
    ran on from the bar's text on a terminal. Through ``tqdm.write`` when a bar is drawn (it clears the bars, writes
    the line and draws them again below), which takes the bars' lock: not for a signal handler (:func:`below_bar`)."""
    if not bar_drawn():
        print(text, flush=True)
        return
    from tqdm import tqdm

    tqdm.write(text, file=sys.stdout)
    sys.stdout.flush()
