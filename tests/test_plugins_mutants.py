"""Plug-in specs (:mod:`dgrpo.plugins`): which specs name a file, which sources a run records, the errors of a spec
that names nothing, and a plug-in file executed once per version (gaps found by mutation testing)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from dgrpo.plugins import PluginError, import_object, plugin_file, plugin_source, source_hashes


def test_plugin_file_is_a_py_file_or_a_path_and_never_a_module():
    """A target ending in .py or holding a slash is a file (~ expanded); a dotted module, a built-in name or a spec
    without a colon is not."""
    assert plugin_file("mine.py:f") == Path("mine.py")
    assert plugin_file("rewards/mine:f") == Path("rewards/mine")
    assert plugin_file("~/mine.py:f") == Path.home() / "mine.py"
    assert plugin_file("pkg.rewards:f") is None
    assert plugin_file("numeric") is None
    assert plugin_file("dir/mine.py") is None  # (no ':name': not a plug-in spec)


def test_dgrpos_own_modules_are_not_plugin_sources_but_a_package_named_like_it_is(tmp_path, monkeypatch):
    """dgrpo's top-level package and its submodules record nothing; a user's package whose name merely starts with
    'dgrpo' (dgrpo_rewards) is the user's own and is recorded."""
    import dgrpo

    assert plugin_source("dgrpo:__name__") is None and plugin_source("dgrpo.plugins:import_object") is None
    assert dgrpo.__file__  # (imported from a file: None above is for being dgrpo's)
    package = f"dgrpo_rewards_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{package}.py").write_text("def g(completions, records):\n    return []\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        import_object(f"{package}:g", "grpo.reward")
        assert plugin_source(f"{package}:g") == (tmp_path / f"{package}.py").resolve()
        assert list(source_hashes([f"{package}:g"])) == [str((tmp_path / f"{package}.py").resolve())]
    finally:
        sys.modules.pop(package, None)


@pytest.mark.parametrize("spec", ["nocolon", ":fn", "pkg.rewards:", "mine.py:"])
def test_a_spec_without_a_target_or_a_name_is_one_line(spec):
    """A spec lacking the colon, the module or file before it, or the name after it says what shape is expected."""
    with pytest.raises(PluginError, match=r"'package\.module:function' or 'path/to/file\.py:function'"):
        import_object(spec, "grpo.reward")


def test_a_name_the_module_lacks_is_one_line(tmp_path):
    """An importable module without the name: the error names the module and the missing name in ``kind``'s word."""
    (tmp_path / "mine.py").write_text("def f():\n    return 1\n")
    with pytest.raises(PluginError, match=r"mine\.py has no class 'Nope'"):
        import_object(f"{tmp_path / 'mine.py'}:Nope", "perturbation.kind", kind="Class")


def test_a_plugin_file_runs_once_per_version_and_again_when_it_changes(tmp_path):
    """Named twice, a file's top level runs once (one module in sys.modules, the same object); edited (here: a
    longer file, its size changed), it runs again; a file whose top level fails leaves no module behind, so that
    the fixed file is imported afresh."""
    path = tmp_path / "counted.py"
    path.write_text("import builtins\nbuiltins.__dict__.setdefault('_dgrpo_runs', []).append(1)\nX = 1\n")
    import builtins

    builtins.__dict__.pop("_dgrpo_runs", None)
    try:
        first = import_object(f"{path}:X", "o")
        again = import_object(f"{path}:X", "o")
        assert (first, again, builtins.__dict__["_dgrpo_runs"]) == (1, 1, [1])
        path.write_text(path.read_text().replace("X = 1", "X = 22"))
        assert import_object(f"{path}:X", "o") == 22 and builtins.__dict__["_dgrpo_runs"] == [1, 1]
        module_names = {n for n, m in sys.modules.items() if getattr(m, "__file__", None) == str(path.resolve())}
        assert len(module_names) == 1
        broken = tmp_path / "broken.py"
        broken.write_text("raise RuntimeError('boom')\n")
        with pytest.raises(PluginError, match=r"cannot import .*broken\.py \(RuntimeError: boom\)"):
            import_object(f"{broken}:X", "o")
        assert not any(getattr(m, "__file__", None) == str(broken.resolve()) for m in list(sys.modules.values()))
    finally:
        builtins.__dict__.pop("_dgrpo_runs", None)
