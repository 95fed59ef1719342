"""dgrpo.model.verified at its edges (a second pass of mutation testing): the hint for a missing adapter config, a
directory named ``.``, a deletion's and a rewrite's leftovers and failures, manifests that vouch for nothing."""

import os
from pathlib import Path

import pytest

from dgrpo.model.verified import (
    MANIFEST,
    CheckpointError,
    atomic_dir,
    check_intact,
    rewrite_files,
    rewritten,
    verify,
    write_manifest,
)

from conftest import written_with_manifest


def test_a_missing_adapter_config_is_one_to_put_back(tmp_path):
    """A LoRA adapter's adapter_config.json (in a nested folder too) is needed to load: 'put it back', not 'delete
    the manifest'."""
    d = written_with_manifest(
        tmp_path / "a", {"adapter/adapter_config.json": "{}", "adapter/adapter_model.safetensors": "w"}
    )
    (d / "adapter" / "adapter_config.json").unlink()
    with pytest.raises(
        CheckpointError, match=r"missing file adapter/adapter_config.json \(removed since .*put it back"
    ):
        check_intact(d)


def test_atomic_dir_writes_the_current_directory_named_dot(tmp_path, monkeypatch):
    """``atomic_dir('.')`` in an empty folder: its temporary sibling is named after the folder, and the folder gets
    the files and a manifest (no ``.tmp--PID`` inside it)."""
    (tmp_path / "out").mkdir()
    monkeypatch.chdir(tmp_path / "out")
    with atomic_dir(Path(".")) as tmp:
        assert tmp == tmp_path / f".tmp-out-{os.getpid()}"
        (tmp / "a.txt").write_text("a")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["a.txt", MANIFEST]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_leftover_of_a_killed_deletion_or_rewrite_is_cleared_first(tmp_path):
    """A ``.tmp-NAME-PID`` that still holds files (a stop mid-deletion, mid-rewrite) does not stop the next
    remove_dir or rewrite: it is deleted first, and only the rewritten directory is left."""
    from dgrpo.model.verified import remove_dir

    for name in ("gone", "kept"):
        written_with_manifest(tmp_path / name, {"a.txt": name})
        stale = tmp_path / f".tmp-{name}-{os.getpid()}"
        stale.mkdir()
        (stale / "junk.txt").write_text("j")
    remove_dir(tmp_path / "gone")
    rewrite_files(tmp_path / "kept", {"a.txt": b"new"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept"]
    assert (tmp_path / "kept" / "a.txt").read_text() == "new" and verify(tmp_path / "kept") is None


def test_a_rewrite_that_fails_leaves_the_directory_as_it_was_and_no_copy(tmp_path):
    """An exception within ``rewritten``: the directory keeps its files and verifies; its hard-linked copy is gone."""
    d = written_with_manifest(tmp_path / "d", {"a.txt": "a"})
    with pytest.raises(RuntimeError), rewritten(d) as tmp:
        (tmp / "a.txt").unlink()
        (tmp / "a.txt").write_text("half")
        raise RuntimeError
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]
    assert (d / "a.txt").read_text() == "a" and verify(d) is None


def test_a_rewrite_leaves_a_manifest_that_is_no_object_as_it_is(tmp_path):
    """A nested manifest.json that holds a JSON list naming the changed file vouches for nothing: the rewrite goes
    through and leaves it byte for byte (no traceback), while the top manifest gets the new checksum."""
    d = written_with_manifest(tmp_path / "d", {"sub/a.txt": "a"})
    (d / "sub" / MANIFEST).write_text('["a.txt"]')
    write_manifest(d)
    rewrite_files(d, {"sub/a.txt": b"new"})
    assert (d / "sub" / MANIFEST).read_text() == '["a.txt"]' and verify(d) is None


def test_a_folder_whose_manifest_cannot_be_read_is_not_replaced(tmp_path):
    """A folder holding the user's file beside a manifest.json that is cut short or a JSON list: it vouches for
    nothing, so the folder is refused (it was replaced, the user's file deleted) and atomic_dir writes nothing."""
    for i, text in enumerate(("{", '["x.txt"]', "[]")):
        d = tmp_path / str(i)
        d.mkdir()
        (d / "x.txt").write_text("mine")
        (d / MANIFEST).write_text(text)
        with pytest.raises(CheckpointError, match=r"has a manifest.json that cannot be read: not replacing it"):
            with atomic_dir(d) as tmp:
                (tmp / "a.txt").write_text("a")
        assert (d / "x.txt").read_text() == "mine" and sorted(p.name for p in d.iterdir()) == [MANIFEST, "x.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0", "1", "2"]


@pytest.mark.parametrize("name", ["model.safetensors", "model.safetensors.index.json"])
def test_a_folder_named_as_weights_is_no_weights(tmp_path, name):
    """holds_weights reads files, as loading does: a directory of that name (a copy gone wrong) holds no weights, and
    the file itself does (mutant: exists() for is_file())."""
    from dgrpo.model.verified import holds_weights

    (tmp_path / name).mkdir()
    assert not holds_weights(tmp_path)
    (tmp_path / name).rmdir()
    (tmp_path / name).write_text("{}")
    assert holds_weights(tmp_path)
