"""``python -m dgrpo.config [--markdown]``: print every option (as docs/config.md with --markdown)."""

from .docs import main

raise SystemExit(main())
