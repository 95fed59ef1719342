"""Objects a config names by a plug-in spec, ``package.module:name`` or ``path/to/file.py:name``: reward and scorer
functions (:func:`dgrpo.eval.scoring.load_function`) and perturbation kinds (:func:`dgrpo.perturbation.kind_class`)."""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from typing import Any


class PluginError(ValueError):
    """A plug-in spec that names nothing importable (one line; its callers raise it as their own error type)."""


def plugin_file(spec: str) -> Path | None:
    """The file a ``path/to/file.py:name`` spec names (None for a built-in name or ``package.module:name``)."""
    target, sep, _ = spec.rpartition(":")
    return Path(target).expanduser() if sep and (target.endswith(".py") or "/" in target) else None


def import_object(spec: str, what: str, kind: str = "function") -> Any:
    """What ``spec`` names (None when its module has no such attribute), the module imported (a file executed as a
    module of its own, each call). ``what`` (the option) and ``kind`` (``function``, ``class``) word the errors."""
    target, sep, name = spec.rpartition(":")
    if not sep or not target or not name:
        raise PluginError(f"{what} {spec!r}: expected 'package.module:{kind}' or 'path/to/file.py:{kind}'")
    try:
        path = plugin_file(spec)
        if path is not None:
            if not path.is_file():
                raise PluginError(f"{what} {spec!r}: file {path} not found")
            module_spec = importlib.util.spec_from_file_location(f"dgrpo_plugin_{path.stem}", path)
            if module_spec is None or module_spec.loader is None:  # not a .py file (a .yaml, a data file)
                raise PluginError(f"{what} {spec!r}: {path} is not a Python file (path/to/file.py:{kind})")
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(target)
    except PluginError:
        raise
    except Exception as e:  # noqa: BLE001 - the user's module failed to import: one line
        raise PluginError(f"{what} {spec!r}: cannot import {target} ({type(e).__name__}: {e})") from None
    return getattr(module, name, None)
