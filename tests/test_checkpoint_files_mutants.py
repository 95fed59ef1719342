"""Tests for the survivors of mutation testing of checkpoint files: which folders are a run's checkpoints, a rewind's
removal by step, a manifest's mode fix (no probe file left, links untouched) and the advice for a missing tokenizer
file."""

import json
from types import SimpleNamespace

import pytest
from test_resume import _fake_checkpoint, _run_dir

from dgrpo.training.checkpoint import list_checkpoints, resume_candidates

from conftest import written_with_manifest


def test_a_file_named_as_a_step_is_not_a_checkpoint(tmp_path):
    """Only folders are checkpoints: a file ``step-00000009`` (a user's note, a copy gone wrong) is neither the
    newest to resume nor one to rotate (mutant: every entry named step-N)."""
    root = tmp_path / "checkpoints"
    two = _fake_checkpoint(root / "step-00000002")
    (root / "step-00000009").write_text("not a checkpoint")
    assert resume_candidates(tmp_path) == [two] and list_checkpoints(tmp_path) == [two]


def test_a_rewind_to_a_users_copy_removes_the_steps_after_its_step(tmp_path):
    """``--resume OUT/checkpoints/step-00000004-copy`` rewinds to step 4: the run's later steps go, the earlier ones
    and the copy stay (mutant: the copy's name not read as a step, nothing removed)."""
    root = tmp_path / "run" / "checkpoints"
    two, four, six = (_fake_checkpoint(root / f"step-0000000{n}") for n in (2, 4, 6))
    copy = _fake_checkpoint(root / "step-00000004-copy")
    with _run_dir(tmp_path / "run", resume=str(copy)) as run:
        run.resume(lambda c: SimpleNamespace(base=None))
        run.start({"step": 4, "metrics_lines": 0})
    assert list_checkpoints(tmp_path / "run") == [two, four] and copy.is_dir() and not six.exists()


def test_a_rewind_to_a_folder_named_without_a_step_removes_nothing(tmp_path):
    """A resumed folder of checkpoints/ whose name holds no step (``old-step-x``) says nothing of which steps are
    later: none is removed, and the run starts (mutant: a TypeError reading its step)."""
    root = tmp_path / "run" / "checkpoints"
    two, six = (_fake_checkpoint(root / f"step-0000000{n}") for n in (2, 6))
    odd = _fake_checkpoint(root / "old-step-x")
    with _run_dir(tmp_path / "run", resume=str(odd)) as run:
        run.resume(lambda c: SimpleNamespace(base=None))
        run.start({"step": 4, "metrics_lines": 0})
    assert list_checkpoints(tmp_path / "run") == [two, six] and odd.is_dir()


def test_a_manifest_leaves_no_probe_file_and_no_linked_files_mode_changed(tmp_path, set_umask):
    """Giving a checkpoint's owner-only files the usual mode probes it with a file of its own, which it removes
    (mutant: left in the checkpoint and in its manifest), and a symlink's target outside the directory, a user's
    private file, keeps its mode (mutant: chmod through the link)."""
    set_umask(0o022)  # (the usual one: new files 0644)
    private = tmp_path / "private.txt"
    private.write_text("mine")
    private.chmod(0o600)
    model = tmp_path / "model"
    model.mkdir()
    (model / "linked.txt").symlink_to(private)
    written_with_manifest(model, {"weights.bin": "w"})
    assert sorted(p.name for p in model.iterdir()) == ["linked.txt", "manifest.json", "weights.bin"]
    assert set(json.loads((model / "manifest.json").read_text())) == {"linked.txt", "weights.bin"}
    assert private.stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize(
    ("files", "gone", "needed"),
    [
        (("tokenizer_config.json", "tokenizer.json"), "tokenizer_config.json", True),  # (mutant: not named needed)
        (("tokenizer_config.json", "spiece.model"), "spiece.model", True),  # (mutant: patterns matched as names)
        (("model/spiece.model", "model/vocab.txt"), "model/spiece.model", False),  # (mutant: looked for at the top)
        (("model/spiece.model", "vocab.txt"), "model/spiece.model", True),
        (("model/tokenizer.json", "model/vocab.txt"), "model/tokenizer.json", True),  # (it alone holds added tokens)
    ],
)
def test_a_missing_tokenizer_file_is_needed_unless_another_vocabulary_is_beside_it(tmp_path, files, gone, needed):
    """Without the tokenizer's config, or its last vocabulary file in any of transformers' formats (a
    sentencepiece ``*.model``), the model does not load: deleting manifest.json is no way on; a vocabulary file with
    another beside it, in its own folder, is one the tokenizer loads without; not ``tokenizer.json``, the only file of
    the tokens added to the vocabulary (dgrpo's latent markers)."""
    from dgrpo.model.verified import CheckpointError, check_intact

    folder = written_with_manifest(tmp_path, dict.fromkeys(files, "x"))
    (folder / gone).unlink()
    with pytest.raises(CheckpointError, match=f"missing file {gone} ") as e:
        check_intact(folder)
    assert ("the model does not load without it" in str(e.value)) == needed, str(e.value)
    assert ("delete manifest.json to load it" in str(e.value)) != needed, str(e.value)
