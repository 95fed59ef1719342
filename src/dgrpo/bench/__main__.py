"""``python -m dgrpo.bench``: the benchmark suite (dgrpo.bench.suite)."""

from .suite import main

raise SystemExit(main())
