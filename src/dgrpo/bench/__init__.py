"""Performance suite of the Dropout-GRPO library: ``dgrpo bench [--quick] [--only ITEMS] --out DIR``.

``main(argv)`` is the entry point (``argv``: the arguments after ``bench``): :mod:`dgrpo.bench.launch` starts the
suite's child process, if it needs one, before torch loads; the suite itself is :mod:`dgrpo.bench.suite`.
"""

from __future__ import annotations

from .launch import main

__all__ = ["main"]
