"""Performance suite of the Dropout-GRPO library: ``dgrpo bench [--quick] [--only ITEMS] --out DIR``.

``main(argv)`` is the entry point (``argv``: the arguments after ``bench``); see :mod:`dgrpo.bench.suite`.
"""

from __future__ import annotations

from .suite import main

__all__ = ["main"]
