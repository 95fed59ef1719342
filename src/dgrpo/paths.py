"""A leading ``~`` in the paths a user writes where no shell expands it (config files, data specs, ``--set``)."""

from __future__ import annotations

from pathlib import Path


def expand_home(path: str | Path) -> Path:
    """``path`` with a leading ``~`` (or ``~user``) as that home folder, as a shell expands it; as written when there
    is none to expand to (``~nosuchuser/x``, as a shell leaves it: 'not found' follows where it is read; pathlib's
    ``expanduser`` raised RuntimeError, a traceback from every command)."""
    try:
        return Path(path).expanduser()
    except RuntimeError:
        return Path(path)


def where_read(path: Path) -> str:
    """Where a relative ``path`` was looked for, as a message's clause: `` (a relative path is read from the working
    directory, CWD)``; '' for an absolute one."""
    return "" if path.is_absolute() else f" (a relative path is read from the working directory, {Path.cwd()})"
