"""What a sharded (``fsdp: sharded``) run says about its checkpoints: which of its model folders still need
``dgrpo consolidate``, the ``dgrpo eval`` lines it prints for best/, and best/ kept on a resume once consolidated."""

import hashlib

import pytest

from dgrpo.training.consolidate import consolidate_checkpoint

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # (shards saved in one process)


def double_norm(state: dict) -> None:
    """Another model's state: the final norm's weight doubled (a new tensor: the model's own stays)."""
    state["model.norm.weight"] = state["model.norm.weight"] * 2


def test_a_best_recorded_by_an_earlier_dgrpo_is_kept_once_consolidated(tmp_path, tokenizer):
    """A checkpoint of an earlier dgrpo recorded best/ by its whole manifest: once ``dgrpo consolidate OUT/best``
    (as that run's end advised) added the weights to it, a resume removed best/ as written after the checkpoint.
    (A model loaded from a checkpoint, as GRPO's is: its config.json is written again as it was.) best/ of other
    shards is still told apart."""
    from dgrpo.model.latent_lm import LatentLM
    from dgrpo.training.distributed import Dist
    from dgrpo.training.run import RunDir

    from conftest import make_lm, sharded_final, tiny_config

    make_lm(tokenizer).save_pretrained(tmp_path / "init")
    lm = LatentLM.from_pretrained(tmp_path / "init")

    out = tmp_path / "run"
    out.mkdir()
    other = sharded_final(tmp_path / "other", tokenizer, double_norm, lm)[0]
    sharded_final(tmp_path, tokenizer, lambda s: None, lm)[0].rename(out / "best")
    earlier = hashlib.sha256((out / "best" / "manifest.json").read_bytes()).hexdigest()  # (an earlier dgrpo's record)
    with RunDir(out, tiny_config(), Dist(), "grpo", log=lambda m: None) as run:
        consolidate_checkpoint(out / "best")
        assert not run.drop_stale_best({"best": earlier}) and (out / "best" / "model.safetensors").is_file()
        assert run.drop_stale_best({"best": hashlib.sha256((other / "manifest.json").read_bytes()).hexdigest()})
        assert not (out / "best").exists()


def model_folder(path, *, consolidated: bool):
    """A model folder as ``fsdp: sharded`` leaves it (``dcp/``), with the weights ``dgrpo consolidate`` writes or
    without; only the names matter here."""
    (path / "dcp").mkdir(parents=True)
    if consolidated:
        (path / "model.safetensors").write_bytes(b"")
    return path


def test_best_s_eval_lines_follow_the_consolidation_lines_which_name_best_once(tmp_path, monkeypatch, capsys):
    """A sharded run with test sets printed ``dgrpo consolidate OUT/best`` twice: in best/'s block of ``dgrpo eval``
    lines (during the test sets) and in the end's list. The end now lists the consolidations, then best/'s eval
    lines, whose head says to consolidate it first (the command above): each line runs as printed, in order. On a
    rerun whose best/ was consolidated the head says nothing of it."""
    from dataclasses import replace

    from dgrpo.cli.train import evaluate_best, print_consolidation_lines
    from dgrpo.training.distributed import Dist

    from conftest import tiny_config

    monkeypatch.delenv("DGRPO_FSDP", raising=False)
    best = model_folder(tmp_path / "best", consolidated=False)
    model_folder(tmp_path / "final", consolidated=False)
    dist, advice = replace(Dist.single(), fsdp=True), []
    assert evaluate_best(1, 3, {"builtin:test": []}, tiny_config(), tmp_path, dist, "cpu", advice=advice) == {}
    assert capsys.readouterr().out == ""  # (kept for the end)
    print_consolidation_lines(tmp_path, dist, advice)
    lines = capsys.readouterr().out.splitlines()
    assert lines[1:3] == [f"  dgrpo consolidate {tmp_path / 'final'}", f"  dgrpo consolidate {best}"]
    assert lines[3] == "dgrpo: best/ (1) is not tested under FSDP; after the run (torchrun too) and best/ is " + (
        "consolidated (above), each test set:"
    )
    assert lines[4].startswith("  dgrpo eval --config ") and len(lines) == 5
    assert sum(" dgrpo consolidate " in line for line in lines) == 2
    (best / "model.safetensors").write_bytes(b"")
    evaluate_best(1, 3, {"builtin:test": []}, tiny_config(), tmp_path, dist, "cpu")  # (no list: printed at once)
    head = "dgrpo: best/ (1) is not tested under FSDP; after the run (torchrun too), each test set:"
    assert capsys.readouterr().out.splitlines() == [head, lines[4]]


def test_the_end_of_a_run_names_each_model_that_needs_consolidating(tmp_path, capsys):
    """A sharded run's end (SFT's had nothing to say; the error came when final/ was loaded, by dgrpo eval or a
    GRPO --init) names final/, best/ and the stages that hold their shards only, one command each, from rank 0."""
    from types import SimpleNamespace

    from dgrpo.cli.train import consolidation_lines, print_consolidation_lines

    assert consolidation_lines(tmp_path) == []  # (nothing there)
    (tmp_path / "final").mkdir()
    (tmp_path / "final" / "model.safetensors").write_bytes(b"")  # (fsdp none or full)
    assert consolidation_lines(tmp_path) == []
    for name, done in [("best", False), ("stage-0", False), ("stage-1", True), ("stage-2", False)]:
        model_folder(tmp_path / name, consolidated=done)
    (tmp_path / "final" / "model.safetensors").unlink()
    (tmp_path / "final" / "dcp").mkdir()
    head, *commands = consolidation_lines(tmp_path)
    assert "FSDP shards" in head and "dgrpo eval, --init and export" in head
    assert commands == [f"  dgrpo consolidate {tmp_path / d}" for d in ("final", "best", "stage-0", "stage-2")]
    print_consolidation_lines(tmp_path, SimpleNamespace(is_main=False))
    assert capsys.readouterr().out == ""
    print_consolidation_lines(tmp_path, SimpleNamespace(is_main=True))
    assert capsys.readouterr().out.splitlines() == [head, *commands]


@pytest.mark.parametrize("cmd", ["sft", "grpo"])
def test_dgrpo_sft_and_grpo_end_with_those_lines(cmd, tmp_path, run_cli, monkeypatch, request):
    """Both commands print the lines after their run (here a stand-in trainer that leaves a sharded final/)."""
    import dgrpo.training.grpo
    import dgrpo.training.sft

    from conftest import tiny_args

    init = ["--init", request.getfixturevalue("sft_checkpoint")] if cmd == "grpo" else []  # (trained first)

    def trained(*args, **kwargs):
        (tmp_path / "run" / "final" / "dcp").mkdir(parents=True)

    monkeypatch.setattr(dgrpo.training.sft, "train_sft", trained)
    monkeypatch.setattr(dgrpo.training.grpo, "train_grpo", trained)
    r = run_cli(cmd, *init, *tiny_args(), "--out", tmp_path / "run")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines()[-1] == f"  dgrpo consolidate {tmp_path / 'run' / 'final'}"


def test_a_best_of_an_earlier_sharded_save_without_architectures_and_dtype_is_kept_once_consolidated(
    tmp_path, tokenizer
):
    """An earlier dgrpo's sharded save of a new (scratch) model wrote config.json without ``architectures`` and
    ``dtype``, and its checkpoints recorded best/ by the whole manifest: ``dgrpo consolidate OUT/best`` writes both
    fields into config.json, and a resume removed best/ as written after the checkpoint. A best/ whose config
    changed otherwise is still told apart."""
    import json

    from dgrpo.model.verified import write_manifest

    from conftest import grpo_run_dir, make_lm, sharded_final

    def earlier(folder):
        """``folder`` as the earlier dgrpo wrote it (its config.json saved from a new model's config)."""
        make_lm(tokenizer).model.config.save_pretrained(folder)
        assert '"architectures"' not in (folder / "config.json").read_text()
        (folder / "manifest.json").unlink()
        write_manifest(folder)
        return hashlib.sha256((folder / "manifest.json").read_bytes()).hexdigest()

    out = tmp_path / "run"
    out.mkdir()
    best = sharded_final(tmp_path, tokenizer, lambda s: None)[0].rename(out / "best")
    recorded = earlier(best)
    with grpo_run_dir(out) as run:
        consolidate_checkpoint(out / "best")
        assert '"architectures"' in (best / "config.json").read_text()
        assert not run.drop_stale_best({"best": recorded}) and (best / "model.safetensors").is_file()
        config = json.loads((best / "config.json").read_text())
        (best / "config.json").write_text(json.dumps({**config, "rms_norm_eps": 0.5}, indent=2, sort_keys=True) + "\n")
        (best / "manifest.json").unlink()
        write_manifest(best)
        assert run.drop_stale_best({"best": recorded}) and not best.exists()
