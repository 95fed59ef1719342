"""``python -m dgrpo.bench``: the benchmark suite (dgrpo.bench.launch, then dgrpo.bench.suite)."""

from .launch import main

raise SystemExit(main())
