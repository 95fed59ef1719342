"""When dgrpo draws a progress bar: shown where asked, unless the user turned tqdm off with ``TQDM_DISABLE``."""

from __future__ import annotations

import os

#: the values of ``TQDM_DISABLE`` that turn every bar off (tqdm reads the variable only for bars whose ``disable``
#: is left at its default; dgrpo passes ``disable`` explicitly, so it reads the variable itself)
TRUE_VALUES = frozenset({"1", "true", "yes", "on"})


def bar_disabled(shown: bool) -> bool:
    """The ``disable=`` for a tqdm bar that dgrpo would show when ``shown``: off as well under ``TQDM_DISABLE=1``."""
    return not shown or os.environ.get("TQDM_DISABLE", "").strip().lower() in TRUE_VALUES
