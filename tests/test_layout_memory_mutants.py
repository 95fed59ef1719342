"""Small hand-checked tests of the out-of-memory advice (``dgrpo.training.memory``), the run layout
(``dgrpo.run_layout``), the paths (``dgrpo.paths``) and the progress bars (``dgrpo.progress``), each written to fail
on a mutant that the rest of the fast tier let through."""

import pytest
import torch

from dgrpo.training.memory import MARK, oom_advice


def test_a_runtime_error_that_is_not_out_of_memory_passes_unchanged():
    """A RuntimeError of another kind (a shape mismatch: torch.OutOfMemoryError is a RuntimeError too) raised in the
    block is the same error, neither retyped as out of memory nor given advice."""
    error = RuntimeError("mat1 and mat2 shapes cannot be multiplied")
    with pytest.raises(RuntimeError) as info:
        with oom_advice("update", "grpo.micro_batch_size", 8, "rows"):
            raise error
    assert info.value is error and MARK not in str(info.value)
    assert not isinstance(info.value, torch.OutOfMemoryError)


def test_best_results_go_beside_final_results_not_over_them(tmp_path):
    """A test set's results: ``eval/<name>`` for final/, ``eval_best/<name>`` for best/ (one folder for both wrote
    best/'s results over final/'s), the spec's name as results_name writes it."""
    from dgrpo.run_layout import BEST_DIR, results_dir, results_folder

    assert (results_folder(), results_folder(BEST_DIR)) == ("eval", "eval_best")
    assert results_dir(tmp_path, "builtin:test") == tmp_path / "eval" / "builtin_test"
    assert results_dir(tmp_path, "builtin:test", BEST_DIR) == tmp_path / "eval_best" / "builtin_test"


def test_a_checkpoint_named_unpadded_is_the_padded_folder_of_its_whole_step_number(tmp_path):
    """``checkpoints/step-128`` names the folder the trainers write, ``step-00000128`` (STEP_DIR captures the whole
    number: a capture of its last digit named step-00000008)."""
    from dgrpo.model.sources import on_disk
    from dgrpo.run_layout import STEP_DIR, step_dir_name

    folder = tmp_path / "checkpoints" / step_dir_name(128)
    folder.mkdir(parents=True)
    assert folder.name == "step-00000128" and STEP_DIR.fullmatch(folder.name)[1] == "00000128"
    assert on_disk(tmp_path / "checkpoints" / "step-128") == folder


def test_a_leading_tilde_is_the_home_folder(tmp_path, monkeypatch):
    """``~/data.jsonl`` (in a config file or a spec, where no shell expands it) is the file in the home folder."""
    from pathlib import Path

    from dgrpo.paths import expand_home

    monkeypatch.setenv("HOME", str(tmp_path))
    assert expand_home("~/data.jsonl") == tmp_path / "data.jsonl"
    assert expand_home("data/~x.jsonl") == Path("data/~x.jsonl")


@pytest.mark.parametrize(
    ("shown", "value", "disabled"),
    [(False, None, True), (True, None, False), (True, " True ", True), (True, "YES", True), (True, "0", False)],
)
def test_a_bar_is_drawn_where_asked_unless_tqdm_disable_says_otherwise(monkeypatch, shown, value, disabled):
    """A bar not asked for is never drawn; one asked for is, unless TQDM_DISABLE is a true value (any case, spaces
    around it as an env file may leave them: 1, true, yes, on)."""
    from dgrpo.progress import bar_disabled

    if value is None:
        monkeypatch.delenv("TQDM_DISABLE", raising=False)
    else:
        monkeypatch.setenv("TQDM_DISABLE", value)
    assert bar_disabled(shown) is disabled
