"""Objects a config names by a plug-in spec, ``package.module:name`` or ``path/to/file.py:name``: reward and scorer
functions (:func:`dgrpo.eval.scoring.load_function`) and perturbation kinds (:func:`dgrpo.perturbation.kind_class`)."""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

from .paths import expand_home, where_read


class PluginError(ValueError):
    """A plug-in spec that names nothing importable (one line; its callers raise it as their own error type)."""


def plugin_file(spec: str) -> Path | None:
    """The file a ``path/to/file.py:name`` spec names (None for a built-in name or ``package.module:name``)."""
    target, sep, _ = spec.rpartition(":")
    return expand_home(target) if sep and (target.endswith(".py") or "/" in target) else None


def name_hint(spec: str, kind: str = "function") -> str:
    """The end of a refusal of ``spec`` that names a ``.py`` file without the ``kind`` in it (``my_rewards.py``,
    ``my_rewards.py:``): how to name it, with the names of that kind the file defines (read with :mod:`ast`, not
    imported): ``; name the function in it: 'my_rewards.py:FUNCTION' (it defines correct, fmt)``; '' otherwise."""
    target = spec.removesuffix(":")
    if ":" in target or not target.endswith(".py"):
        return ""
    path = expand_home(target)
    if not path.is_file():
        return f"; name the {kind.lower()} in the file, '{target}:{kind.upper()}' (file {path} not found)"
    names = _defined(path, kind)
    defines = f" (it defines {', '.join(names[:8])}{', ...' if len(names) > 8 else ''})" if names else ""
    return f"; name the {kind.lower()} in it: '{target}:{kind.upper()}'{defines}"


def _defined(path: Path, kind: str) -> list[str]:
    """The top-level functions (``kind`` ``function``) or classes (``Class``) the file ``path`` defines, in order;
    [] when it cannot be read or parsed."""
    types: tuple[type, ...] = (ast.ClassDef,) if kind == "Class" else (ast.FunctionDef, ast.AsyncFunctionDef)
    try:
        tree = ast.parse(path.read_bytes())
    except (OSError, SyntaxError, ValueError):
        return []
    named = [node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    return [node.name for node in named if isinstance(node, types) and not node.name.startswith("_")]


def plugin_source(spec: str) -> Path | None:
    """The source file of what ``spec`` names: a ``path/to/file.py:name`` spec's file, or an imported package
    module's (not dgrpo's own); None for a built-in name, a missing file, or a module not imported from a file."""
    path = plugin_file(spec)
    if path is not None:
        return path.resolve() if path.is_file() else None
    target, sep, _ = spec.rpartition(":")
    file = getattr(sys.modules.get(target), "__file__", None) if sep else None
    own = target == "dgrpo" or target.startswith("dgrpo.")
    return Path(file).resolve() if file and not own else None


#: the attribute of a plug-in module's spec that holds the SHA-256 of its file as this process imported it (on the
#: spec: ``importlib.reload`` and a plug-in file's new version each make a new one)
SOURCE_HASH = "__dgrpo_sha256__"


def source_hashes(specs: Iterable[str]) -> dict[str, str]:
    """The SHA-256 of the contents of each plug-in file ``specs`` name (:func:`plugin_source`), by absolute path, as
    this process imported it: a run records what its reward and scorer were, not only their names. (The file as it
    is now was hashed: one edited while the run went on, rewritten into applied.json at its stop with the edit's
    hash, let the resume that imports the edit go on without a word.)"""
    out = {}
    for spec in specs:
        path = plugin_source(spec)
        if path is not None:
            out[str(path)] = _imported_hash(_loaded_module(spec, path), path)
    return out


def _loaded_module(spec: str, source: Path) -> ModuleType | None:
    """The module this process imported for ``spec`` (whose file is ``source``), None when it imported none."""
    if plugin_file(spec) is not None:
        return sys.modules.get(_file_module_name(source))
    return sys.modules.get(spec.rpartition(":")[0])


def _imported_hash(module: ModuleType | None, source: Path) -> str:
    """The SHA-256 of ``module``'s file ``source`` as imported (a plug-in file's: as executed; a package module's: as
    first hashed, at the run's start, kept on its spec, which ``importlib.reload`` makes anew: kept in the module, a
    reloaded edit was recorded with the hash of the file before it), that of the file now without a module."""
    if module is None:
        return _sha256(source)
    held = module.__spec__ if module.__spec__ is not None else module
    digest = getattr(held, SOURCE_HASH, None)
    if not isinstance(digest, str):
        digest = _sha256(source)
        setattr(held, SOURCE_HASH, digest)
    return digest


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def import_object(spec: str, what: str, kind: str = "function") -> Any:
    """What ``spec`` names, its module imported: a package module as Python imports it; a file as a module of its
    own (:func:`_file_module`). ``what`` (the option) and ``kind`` (``function``, ``Class``) word the errors, one of
    them that the module has no such name."""
    target, sep, name = spec.rpartition(":")
    if not sep or not target or not name:
        raise PluginError(
            f"{what} {spec!r}: expected 'package.module:{kind}' or 'path/to/file.py:{kind}'{name_hint(spec, kind)}"
        )
    try:
        module = _module_of(spec, target, what, kind)
    except PluginError:
        raise
    except SystemExit as e:  # (an argparse at its top level read dgrpo's command line: 'unrecognized arguments')
        raise PluginError(
            f"{what} {spec!r}: importing {target} exited (SystemExit: {e.code}): its top level runs as a script (an "
            "argparse there reads dgrpo's command line: the usage and error above are its own); put that part under "
            "if __name__ == '__main__':"
        ) from None
    except Exception as e:  # noqa: BLE001 - the user's module failed to import: one line
        raise PluginError(f"{what} {spec!r}: cannot import {target} ({type(e).__name__}: {e})") from None
    if not hasattr(module, name):
        raise PluginError(f"{what} {spec!r}: {target} has no {kind.lower()} {name!r}")
    return getattr(module, name)


def _module_of(spec: str, target: str, what: str, kind: str) -> ModuleType:
    """The module ``spec`` names: a file's (:func:`_file_module`) or a package module (:func:`_import_module`)."""
    path = plugin_file(spec)
    if path is None:
        return _import_module(target)
    if not path.is_file():  # (a relative one from the working directory, not a config file's: only base: is)
        raise PluginError(f"{what} {spec!r}: file {path} not found{where_read(path)}")
    return _file_module(path, f"{what} {spec!r}", kind)


def _import_module(target: str) -> ModuleType:
    """``package.module`` imported as Python imports it, or, when its top-level package is not on ``sys.path`` but
    lies in the working directory, from there (the directory appended to ``sys.path``): ``python -m dgrpo`` has the
    working directory on the path and the ``dgrpo`` command does not, so ``mypkg.rewards:fn`` run under one and was
    'No module named mypkg' under the other."""
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as e:
        top, cwd = target.partition(".")[0], str(Path.cwd())
        here = Path(cwd, top).is_dir() or Path(cwd, f"{top}.py").is_file()
        if e.name != top or cwd in sys.path or "" in sys.path or not here:
            raise
    sys.path.append(cwd)
    return importlib.import_module(target)


def _importable_beside(path: Path) -> None:
    """Make the modules beside a plug-in file importable from it, at its top level or later in a function, as they
    are when the file runs as a script (``from helpers import parse``): its folder goes at the end of ``sys.path``,
    so that a file there named as an installed package (``datasets.py``) does not replace that package. Without it
    such an import worked under ``python -m dgrpo`` from the file's folder (the working directory is on the path)
    and failed under the ``dgrpo`` command (its ``bin/`` is)."""
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.append(folder)


def _file_module(path: Path, where: str, kind: str) -> ModuleType:
    """The module of a plug-in file, executed once per process and version of the file (a reward, a scorer and a
    kind in one file, or one named by several options, run its top level once), registered in ``sys.modules`` under
    a name of its path, as an imported module is (a dataclass with postponed annotations reads its module there;
    instances of its classes pickle)."""
    resolved = path.resolve()
    name = _file_module_name(resolved)
    stat = resolved.stat()
    version = (stat.st_mtime_ns, stat.st_size)
    loaded = sys.modules.get(name)
    if loaded is not None and getattr(loaded, "__dgrpo_version__", None) == version:
        return loaded
    module_spec = importlib.util.spec_from_file_location(name, resolved)
    if module_spec is None or module_spec.loader is None:  # not a .py file (a .yaml, a data file)
        raise PluginError(f"{where}: {path} is not a Python file (path/to/file.py:{kind})")
    module = importlib.util.module_from_spec(module_spec)
    module.__dict__["__dgrpo_version__"] = version
    setattr(module_spec, SOURCE_HASH, _sha256(resolved))  # (what applied.json records: the file as executed)
    sys.modules[name] = module
    _importable_beside(resolved)
    try:
        module_spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _file_module_name(resolved: Path) -> str:
    """The ``sys.modules`` name of the plug-in file at ``resolved`` (an absolute path)."""
    return f"dgrpo_plugin_{resolved.stem}_{hashlib.sha1(str(resolved).encode()).hexdigest()[:12]}"
