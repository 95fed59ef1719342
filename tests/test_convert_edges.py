"""Edges of the checkpoint tools met as a user: ``dgrpo import-coconut`` given a folder instead of run.py's file."""

import pytest
import torch


def _import(run_cli, ckpt, out):
    return run_cli("import-coconut", ckpt, "--base", "unused-base", "--c-thought", 2, "--n-latent", 6, "--out", out)


def test_a_coconut_save_dir_given_for_its_file_names_the_checkpoint_files_in_it(tmp_path, run_cli):
    """run.py's save_dir holds checkpoint_1 ... checkpoint_N: the line names the first and the latest (by number, not
    by name: checkpoint_10 after checkpoint_9), and nothing is written."""
    save_dir = tmp_path / "gsm-coconut"
    save_dir.mkdir()
    for n in (4, 9, 10):
        torch.save({"w": torch.zeros(1)}, save_dir / f"checkpoint_{n}")
    r = _import(run_cli, save_dir, tmp_path / "out")
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stderr
    assert "gsm-coconut is a directory: give one of the checkpoint files run.py saved in it" in r.stderr
    assert "(checkpoint_4 to checkpoint_10)" in r.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("holds", ["config.json", "adapter_config.json"])
def test_a_model_directory_given_to_import_says_it_loads_as_it_is(tmp_path, run_cli, holds):
    """A TRL / transformers SFT output (or a dgrpo checkpoint, a PEFT adapter) is no run.py file: it was told to give
    "the checkpoint file Coconut's run.py saved", which such a folder has none of; --init takes it as it is."""
    model_dir = tmp_path / "sft-out"
    model_dir.mkdir()
    (model_dir / holds).write_text("{}")
    r = _import(run_cli, model_dir, tmp_path / "out")
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stderr
    assert "sft-out is a directory: a model directory" in r.stderr
    assert "needs no import: dgrpo sft --init, grpo --init and eval --model load it as it is" in r.stderr
    assert not (tmp_path / "out").exists()


def test_another_directory_is_still_asked_for_run_pys_file(tmp_path, run_cli):
    (tmp_path / "empty").mkdir()
    r = _import(run_cli, tmp_path / "empty", tmp_path / "out")
    assert r.returncode == 2
    assert "empty is a directory: give the checkpoint file Coconut's run.py saved (save_dir/checkpoint_N)" in r.stderr


@pytest.mark.parametrize("key", ["model", "state_dict"])
def test_a_state_dict_nested_in_a_training_checkpoint_is_named_with_how_to_take_it_out(tmp_path, run_cli, key):
    """``{"model": state_dict, "epoch": 3}`` was "found non-tensor entries 'model': dict, 'epoch': int", which says
    neither that the weights are there nor how to import them."""
    ckpt = tmp_path / "train.pt"
    torch.save({key: {"transformer.wte.weight": torch.zeros(2, 2)}, "epoch": 3}, ckpt)
    r = _import(run_cli, ckpt, tmp_path / "out")
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stderr
    assert f"train.pt: not a state dict but a dict holding one under {key!r}" in r.stderr
    assert f"torch.save(torch.load(FILE)[{key!r}], NEW_FILE)" in r.stderr
    assert not (tmp_path / "out").exists()
    torch.save({"epoch": 3, "note": {"a": 1}}, ckpt)  # no state dict inside: the plain refusal
    r = _import(run_cli, ckpt, tmp_path / "out")
    assert r.returncode == 2 and "expected a state dict (name -> tensor), found non-tensor entries" in r.stderr


def test_export_of_a_full_checkpoint_says_it_loads_in_transformers_as_it_is(tmp_path, tokenizer, run_cli):
    """A researcher exporting a full fine-tuned run for others was told "nothing to merge", not that the folder is
    already what they want; and it is: plain transformers loads it and computes the dgrpo model's logits."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dgrpo.model.latent_lm import LatentLM

    from conftest import make_lm

    for arch in ("gpt2", "qwen2"):
        ckpt = tmp_path / arch
        make_lm(tokenizer, arch).save_pretrained(ckpt)
        r = run_cli("export", ckpt, "--merge", "--out", tmp_path / f"{arch}-out")
        assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stderr
        assert "nothing to merge; it loads as it is, in dgrpo and in transformers" in r.stderr
        lm = LatentLM.from_pretrained(ckpt).eval()
        plain, plain_tok = AutoModelForCausalLM.from_pretrained(ckpt).eval(), AutoTokenizer.from_pretrained(ckpt)
        ids = plain_tok(["12 + 7 = 19\n"], return_tensors="pt")
        assert plain_tok.convert_tokens_to_ids(["<|start-latent|>", "<|latent|>", "<|end-latent|>"]) == [
            lm.start_id,
            lm.latent_id,
            lm.end_id,
        ]
        with torch.no_grad():
            assert torch.equal(plain(**ids).logits, lm.model(**ids).logits)


def test_a_runs_checkpoints_folder_given_as_a_model_names_its_step_folders(tmp_path):
    """``--init RUN/checkpoints`` (or ``dgrpo export`` / ``eval --model`` of it) said only "holds no model checkpoint":
    the line now names its step-N folders, newest first, and the run directory for its final/."""
    from dgrpo.model.sources import resolve_checkpoint
    from dgrpo.model.verified import CheckpointError

    run = tmp_path / "run"
    for step in (2, 4, 6, 8):
        (run / "checkpoints" / f"step-{step:08d}").mkdir(parents=True)
    with pytest.raises(CheckpointError) as e:
        resolve_checkpoint(run / "checkpoints")
    assert "step-00000008, step-00000006, step-00000004 and 1 more: newest first" in str(e.value)
    assert f"the run directory {run} for its final/" in str(e.value)
