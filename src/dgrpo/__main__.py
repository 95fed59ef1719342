"""``python -m dgrpo``: the command line (dgrpo.cli)."""

from .cli import main

raise SystemExit(main())
