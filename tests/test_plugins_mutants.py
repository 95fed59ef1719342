"""Plug-in specs (:mod:`dgrpo.plugins`): which specs name a file, which sources a run records, the errors of a spec
that names nothing, and a plug-in file executed once per version (gaps found by mutation testing)."""

from __future__ import annotations

import os
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


def test_a_file_in_a_folder_whose_name_holds_a_colon_is_split_at_the_last_colon(tmp_path):
    """The name is what follows the last colon: a folder named ``a:b`` is part of the file's path."""
    folder = tmp_path / "a:b"
    folder.mkdir()
    (folder / "mine.py").write_text("def f():\n    return 7\n")
    assert import_object(f"{folder / 'mine.py'}:f", "grpo.reward")() == 7


def test_a_missing_or_non_python_file_is_its_own_line_not_an_import_failure(tmp_path):
    """The spec's own errors (file not found, not a Python file) are raised as they are, not wrapped as a failed
    import ('cannot import ... (PluginError: ...)')."""
    spec = f"{tmp_path / 'gone.py'}:f"
    with pytest.raises(PluginError) as caught:
        import_object(spec, "grpo.reward")
    assert str(caught.value).startswith(f"grpo.reward {spec!r}: file {tmp_path / 'gone.py'} not found")
    (tmp_path / "a.yaml").write_text("x: 1\n")
    spec = f"{tmp_path / 'a.yaml'}:f"
    with pytest.raises(PluginError) as caught:
        import_object(spec, "grpo.reward")
    assert (
        str(caught.value)
        == f"grpo.reward {spec!r}: {tmp_path / 'a.yaml'} is not a Python file (path/to/file.py:function)"
    )


def test_a_module_that_is_not_in_the_working_directory_leaves_sys_path_alone(tmp_path, monkeypatch):
    """The working directory is added to sys.path only for a package that lies there and is not importable
    otherwise: a package missing everywhere, or one found but missing a submodule or a dependency of its own,
    fails with Python's error and sys.path unchanged."""
    package = f"pkg_{tmp_path.name.replace('-', '_')}"
    (tmp_path / "elsewhere" / package).mkdir(parents=True)
    (tmp_path / "elsewhere" / package / "__init__.py").write_text("")
    (tmp_path / "elsewhere" / package / "needs.py").write_text("import no_such_dependency_here\n")
    (tmp_path / "work" / package).mkdir(parents=True)  # (the same name in the working directory: not used)
    monkeypatch.setattr(
        sys, "path", [p for p in sys.path if p not in ("", os.getcwd())] + [str(tmp_path / "elsewhere")]
    )
    monkeypatch.chdir(tmp_path / "work")
    before = list(sys.path)
    try:
        for target in (f"{package}.missing", f"{package}.needs"):
            with pytest.raises(PluginError, match=r"cannot import .* \(ModuleNotFoundError: No module named"):
                import_object(f"{target}:f", "grpo.reward")
            assert sys.path == before
        monkeypatch.chdir(tmp_path)  # (nothing of that name here)
        with pytest.raises(PluginError, match=r"No module named 'nopkg_anywhere'"):
            import_object("nopkg_anywhere.rewards:f", "grpo.reward")
        assert sys.path == before
    finally:
        for name in [n for n in sys.modules if n == package or n.startswith(f"{package}.")]:
            sys.modules.pop(name)


def test_a_single_file_module_in_the_working_directory_imports_under_the_dgrpo_command(tmp_path, monkeypatch):
    """``myrewards:fn`` for a ``myrewards.py`` in the working directory (not a package folder) imports when the
    working directory is not on sys.path (the ``dgrpo`` command), as it does under ``python -m dgrpo``; the directory
    goes at the end of sys.path, so that a file there named as an installed package does not replace that package
    afterwards."""
    module = f"myrewards_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text("def fn():\n    return 3\n")
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", os.getcwd(), str(tmp_path))])
    monkeypatch.chdir(tmp_path)
    try:
        assert import_object(f"{module}:fn", "grpo.reward")() == 3
        assert sys.path[-1] == str(tmp_path)
    finally:
        sys.modules.pop(module, None)


def test_an_edit_within_the_same_timestamp_is_a_new_version(tmp_path):
    """A file rewritten within its timestamp's resolution (mtime unchanged, size changed) is imported again."""
    path = tmp_path / "stamp.py"
    path.write_text("X = 1\n")
    assert import_object(f"{path}:X", "o") == 1
    stamp = path.stat().st_mtime_ns
    path.write_text("X = 222\n")
    os.utime(path, ns=(stamp, stamp))
    assert import_object(f"{path}:X", "o") == 222


def test_a_plugin_files_hash_is_the_file_as_executed_even_when_first_asked_after_an_edit(tmp_path):
    """source_hashes, first called after the file was edited (the run's stop, no entry written at its start),
    records the file as the process executed it, not as it is now."""
    import hashlib

    path = tmp_path / "late.py"
    path.write_text("X = 1\n")
    import_object(f"{path}:X", "o")
    path.write_text("X = 2\n")
    assert source_hashes([f"{path}:X"]) == {str(path.resolve()): hashlib.sha256(b"X = 1\n").hexdigest()}
