"""How dgrpo's one-line messages show a list: its first items and how many more (``a, b, c and 4 more``)."""

from __future__ import annotations

from collections.abc import Sequence


def first_items(items: Sequence[object], n: int = 3) -> str:
    """The first ``n`` of ``items``, comma-separated, and how many more there are (``a, b and 3 more``)."""
    shown = ", ".join(str(item) for item in items[:n])
    return shown + (f" and {len(items) - n} more" if len(items) > n else "")
