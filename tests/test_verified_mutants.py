"""dgrpo.model.verified's promises, one by one (gaps found by mutation testing): what a manifest vouches for, the
hints of a damaged directory, what may be replaced, the atomic writes and rewrites (a hard-linked original is never
written through), strict weight loading and its one-line errors."""

import json
import os

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from dgrpo.model.verified import (
    MANIFEST,
    CheckpointError,
    atomic_dir,
    check_intact,
    check_replaceable,
    check_state_dict,
    check_tensors,
    enclosing_checkpoint,
    is_written_checkpoint,
    one_line,
    read_json_object,
    read_weights,
    remove_dir,
    replace_dir,
    rewrite_files,
    unlisted_files,
    verify,
    write_manifest,
)

from conftest import written_with_manifest


def test_a_manifest_never_lists_itself_so_a_rewritten_one_still_verifies(tmp_path):
    """write_manifest over a directory that has one already (consolidate does so) lists the other files only."""
    d = written_with_manifest(tmp_path / "d", {"a.txt": "a"})
    write_manifest(d)
    assert json.loads((d / MANIFEST).read_text()).keys() == {"a.txt"} and verify(d) is None


def test_a_required_entry_is_met_by_either_alternative_and_an_unlisted_one_is_named(tmp_path):
    """``a|b`` is met by a manifest that lists one of them; one that lists neither is named with 'or'."""
    d = written_with_manifest(tmp_path / "d", {"model.safetensors": "w", "config.json": "{}"})
    assert verify(d, ("model.safetensors|model.safetensors.index.json", "config.json")) is None
    assert verify(d, ("adapter_model.safetensors|dcp/.metadata",)) == (
        "the manifest does not list adapter_model.safetensors or dcp/.metadata"
    )


def test_a_manifest_that_is_no_object_or_lists_a_folder_is_a_problem_not_a_traceback(tmp_path):
    """A JSON list for a manifest is unreadable; a listed name that is now a folder is a missing file; a folder named
    manifest.json is no manifest."""
    d = written_with_manifest(tmp_path / "d", {"a.txt": "a"})
    (d / "a.txt").unlink()
    (d / "a.txt").mkdir()
    assert verify(d) == "missing file a.txt"
    (d / MANIFEST).write_text("[]")
    assert verify(d) == "unreadable manifest"
    (d / MANIFEST).unlink()
    (d / MANIFEST).mkdir()  # (no manifest file: an incomplete write, not an IsADirectoryError)
    assert verify(d) == "no manifest (incomplete write)"


def test_check_intact_passes_a_directory_without_manifest_and_hints_by_what_is_wrong(tmp_path):
    """No manifest: nothing to check. A changed file, or a missing one loading does not need: 'changed since dgrpo
    wrote it' (delete the manifest to load it). A missing file loading needs (weights, config.json, a required one):
    'put it back'. A required file the manifest does not list: the problem alone, no hint."""
    (tmp_path / "bare").mkdir()
    check_intact(tmp_path / "bare", ("config.json",))
    files = {"model.safetensors": "w", "config.json": "{}", "notes.txt": "n", "state.json": "{}"}
    for gone, put_back in [
        ("notes.txt", False),
        ("model.safetensors", True),
        ("config.json", True),
        ("state.json", True),
    ]:
        d = written_with_manifest(tmp_path / gone, files)
        (d / gone).unlink()
        with pytest.raises(CheckpointError) as e:
            check_intact(d, ("state.json|other.json",))
        assert f"is damaged: missing file {gone} (" in str(e.value)
        assert ("put it back" in str(e.value)) is put_back and ("delete manifest.json" in str(e.value)) is not put_back
    d = written_with_manifest(tmp_path / "changed", files)
    (d / "notes.txt").write_text("edited")
    with pytest.raises(CheckpointError, match=r"checksum mismatch in notes.txt \(changed since dgrpo wrote it; if"):
        check_intact(d)
    with pytest.raises(CheckpointError) as e:
        check_intact(d, ("rng.pt",))
    assert str(e.value).endswith("is damaged: the manifest does not list rng.pt")


def test_unlisted_files_are_those_the_manifest_does_not_name(tmp_path):
    d = written_with_manifest(tmp_path / "d", {"a.txt": "a", "sub/b.txt": "b"})
    (d / "sub" / "c.txt").write_text("c")
    assert unlisted_files(d) == ["sub/c.txt"]


def test_a_resumable_checkpoint_is_a_written_one_and_encloses_folders_three_levels_down(tmp_path):
    """state.json alone marks a resumable checkpoint; enclosing_checkpoint looks at ``levels`` parents, no more."""
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "state.json").write_text("{}")
    assert is_written_checkpoint(tmp_path / "ckpt")
    assert enclosing_checkpoint(tmp_path / "ckpt" / "a" / "b" / "new") == tmp_path / "ckpt"
    assert enclosing_checkpoint(tmp_path / "ckpt" / "a" / "b" / "c" / "new") is None
    assert enclosing_checkpoint(tmp_path / "ckpt" / "a" / "new", levels=1) is None


def test_what_may_be_replaced(tmp_path):
    """Missing or empty: yes. Ours with only listed files: yes. No manifest, or a file the manifest does not list: a
    refusal, and atomic_dir writes nothing then."""
    check_replaceable(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    check_replaceable(tmp_path / "empty")
    ours = written_with_manifest(tmp_path / "ours", {"a.txt": "a"})
    check_replaceable(ours)
    (tmp_path / "user").mkdir()
    (tmp_path / "user" / "x").write_text("x")
    with pytest.raises(CheckpointError, match="is not a model directory dgrpo wrote"):
        check_replaceable(tmp_path / "user")
    (ours / "mine.txt").write_text("m")
    with pytest.raises(CheckpointError, match=r"holds files dgrpo did not write \(mine.txt;"), atomic_dir(ours) as tmp:
        (tmp / "new.txt").write_text("n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "ours", "user"]
    assert sorted(p.name for p in ours.iterdir()) == ["a.txt", "manifest.json", "mine.txt"]


def test_atomic_dir_publishes_a_verified_directory_and_leaves_nothing_on_failure(tmp_path):
    """A leftover temporary directory of this process is cleared first; the result has its manifest; an exception
    leaves neither the directory nor its temporary sibling."""
    stale = tmp_path / f".tmp-out-{os.getpid()}"
    stale.mkdir()
    (stale / "junk").write_text("j")
    with atomic_dir(tmp_path / "out") as tmp:
        (tmp / "a.txt").write_text("a")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["a.txt", MANIFEST]
    assert verify(tmp_path / "out", ("a.txt",)) is None
    with pytest.raises(RuntimeError), atomic_dir(tmp_path / "other") as tmp:
        (tmp / "a.txt").write_text("a")
        raise RuntimeError
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_replace_dir_leaves_only_the_new_directory_even_over_a_leftover_old_one(tmp_path):
    """An ``.old-NAME-PID`` left by a killed replace is cleared first; the old directory is deleted after the move."""
    old = written_with_manifest(tmp_path / "d", {"a.txt": "old"})
    leftover = tmp_path / f".old-d-{os.getpid()}"
    leftover.mkdir()
    (leftover / "x").write_text("x")
    new = written_with_manifest(tmp_path / "new", {"a.txt": "new"})
    replace_dir(new, old)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"] and (old / "a.txt").read_text() == "new"


def test_remove_dir_removes_the_directory_and_its_leftover_name(tmp_path):
    d = written_with_manifest(tmp_path / "d", {"a.txt": "a"})
    (tmp_path / f".tmp-d-{os.getpid()}").mkdir()
    remove_dir(d)
    assert list(tmp_path.iterdir()) == []


def test_rewrite_files_never_writes_through_a_hard_link_and_relists_every_manifest_above(tmp_path):
    """A file rewritten in a directory whose files are hard-linked elsewhere (a copy made with ``cp -l``): the other
    link keeps the old bytes. The nested manifest that lists it gets its new checksum, and the top manifest that lists
    both the file and the nested manifest gets theirs; a changed file no manifest listed stays unlisted."""
    d = written_with_manifest(tmp_path / "d" / "sub", {"w.txt": "old", "other.txt": "o"}).parent
    write_manifest(d)
    (tmp_path / "elsewhere").mkdir()
    os.link(d / "sub" / "w.txt", tmp_path / "elsewhere" / "w.txt")
    rewrite_files(d, {"sub/w.txt": b"new", "extra.txt": b"e"})
    assert (tmp_path / "elsewhere" / "w.txt").read_text() == "old"
    assert (d / "sub" / "w.txt").read_text() == "new" and verify(d / "sub") is None and verify(d) is None
    assert json.loads((d / MANIFEST).read_text()).keys() == {"sub/w.txt", "sub/other.txt", "sub/manifest.json"}
    assert unlisted_files(d) == ["extra.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "elsewhere"]


def test_read_weights_reads_every_shard_and_a_bad_index_is_one_line(tmp_path):
    """An index naming two shards: the tensors of both. An index that is not JSON, or has no weight_map: a
    CheckpointError line. A single file is read when present."""
    d = tmp_path / "m"
    d.mkdir()
    save_file({"a": torch.zeros(2)}, str(d / "s1.safetensors"))
    save_file({"b": torch.ones(3)}, str(d / "s2.safetensors"))
    (d / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}})
    )
    assert {k: v.tolist() for k, v in read_weights(d).items()} == {"a": [0.0, 0.0], "b": [1.0, 1.0, 1.0]}
    for bad in ("{", json.dumps({"weights": {}})):
        (d / "model.safetensors.index.json").write_text(bad)
        with pytest.raises(CheckpointError, match="unreadable weights .*: cut short or damaged"):
            read_weights(d)
    save_file({"c": torch.ones(1)}, str(d / "model.safetensors"))
    assert list(read_weights(d)) == ["c"]


def test_check_tensors_names_missing_unexpected_and_misshaped_tensors():
    own = {"a": torch.zeros(2), "b": torch.zeros(3)}
    check_tensors(own, {"a": torch.ones(2), "b": torch.ones(3)}, "here")
    check_tensors(own, {"a": torch.ones(2)}, "here", may_miss=lambda k: k == "b")
    with pytest.raises(CheckpointError, match=r"^here: missing tensors: b$"):
        check_tensors(own, {"a": torch.ones(2)}, "here")
    with pytest.raises(CheckpointError, match=r"^here: unexpected tensors: c$"):
        check_tensors(own, {**own, "c": torch.ones(1)}, "here")
    with pytest.raises(CheckpointError, match=r"^here: wrong shapes: b \(4,\) vs \(3,\)$"):
        check_tensors(own, {"a": torch.ones(2), "b": torch.ones(4)}, "here")


def test_a_tied_weight_may_be_missing_only_when_its_twin_is_present():
    """A tied LM head may be absent beside its embedding; an untied weight, or both twins, may not."""
    model = nn.Sequential(nn.Embedding(4, 2), nn.Linear(2, 4, bias=False), nn.Linear(2, 2, bias=False))
    model[1].weight = model[0].weight
    state = {k: v.clone() for k, v in model.state_dict().items()}
    check_state_dict(model, {k: v for k, v in state.items() if k != "1.weight"}, "m")
    with pytest.raises(CheckpointError, match="missing tensors: 2.weight"):
        check_state_dict(model, {k: v for k, v in state.items() if k != "2.weight"}, "m")
    with pytest.raises(CheckpointError, match="missing tensors: 0.weight, 1.weight"):
        check_state_dict(model, {"2.weight": state["2.weight"]}, "m")


def test_one_line_keeps_the_first_line_cut_at_300_characters_and_a_config_must_be_an_object(tmp_path):
    assert one_line(ValueError("x" * 400 + "\nadvice")) == "ValueError: " + "x" * 300
    assert one_line(KeyError()) == "KeyError"
    (tmp_path / "c.json").write_text("[1]")
    with pytest.raises(CheckpointError, match="holds a JSON list, not an object"):
        read_json_object(tmp_path / "c.json")
