"""``python -m dgrpo``: the command line (dgrpo.cli)."""

from .cli import entry

entry()
