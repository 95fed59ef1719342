"""How dgrpo's one-line messages show a list (its first items and how many more: ``a, b, c and 4 more``) and a count
(``1 seed``, ``3 seeds``)."""

from __future__ import annotations

from collections.abc import Sequence


def first_items(items: Sequence[object], n: int = 3) -> str:
    """The first ``n`` of ``items``, comma-separated, and how many more there are (``a, b and 3 more``)."""
    shown = ", ".join(str(item) for item in items[:n])
    return shown + (f" and {len(items) - n} more" if len(items) > n else "")


def counted(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless n is 1 (an ``s`` added): ``1 seed``, ``3 seeds``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
