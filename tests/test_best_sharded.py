"""best/ of a run under FSDP (``dgrpo.cli.train.best_lines``): a best/ saved with the final model's weights (no
update after it: every step filtered) is said to be the final model at the run's end, by the saved files
(``dgrpo.training.consolidate.same_saved_model``), instead of ``dgrpo eval`` lines that test it again."""

import shutil
from collections.abc import Callable
from dataclasses import replace

import pytest

from conftest import make_lm, sharded_final, tiny_config

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # (shards saved in one process)

TESTS: dict[str, list] = {"builtin:test": []}


def sharded_run(tmp_path, tokenizer, change_best):
    """``tmp_path/run`` with best/ and final/ as ``fsdp: sharded`` saves them, of one model (best/'s shards as
    ``change_best`` leaves its state)."""
    lm, out = make_lm(tokenizer), tmp_path / "run"
    out.mkdir(parents=True)
    for name, change in (("best", change_best), ("final", lambda state: None)):
        shutil.move(sharded_final(tmp_path / f"save-{name}", tokenizer, change, lm=lm)[0], out / name)
    return out


def end_lines(out, monkeypatch, capsys) -> list[str]:
    """What a sharded run's end prints of best/ (step 1 of 3), after its consolidation lines."""
    from dgrpo.cli.train import evaluate_best, print_consolidation_lines
    from dgrpo.training.distributed import Dist

    monkeypatch.delenv("DGRPO_FSDP", raising=False)
    dist, advice = replace(Dist.single(), fsdp=True), list[Callable[[], list[str]]]()
    assert evaluate_best(1, 3, TESTS, tiny_config(), out, dist, "cpu", advice=advice) == {}
    print_consolidation_lines(out, dist, advice)
    return capsys.readouterr().out.splitlines()[3:]  # (after the head and the two dgrpo consolidate lines)


def test_a_sharded_best_of_the_final_weights_is_said_to_be_the_final_model(tmp_path, tokenizer, monkeypatch, capsys):
    """The shards' metadata differ between two saves of one model (torch writes the save's path and id into it), the
    shard files do not: best/ is the final model, said as the unsharded run says it; a best/ of other weights still
    gets its dgrpo eval lines."""
    out = sharded_run(tmp_path, tokenizer, lambda state: None)
    assert (out / "best/dcp/.metadata").read_bytes() != (out / "final/dcp/.metadata").read_bytes()
    assert end_lines(out, monkeypatch, capsys) == [
        "dgrpo: best/ (1) holds the final model's weights (no update after it): not tested again; its test results "
        f"are the final model's ({out / 'eval' / 'builtin_test'})"
    ]
    moved = lambda s: s.update({"model.norm.weight": s["model.norm.weight"] + 1e-3})  # noqa: E731 - (a new tensor)
    other = sharded_run(tmp_path / "other", tokenizer, moved)
    lines = end_lines(other, monkeypatch, capsys)
    assert lines[0].startswith("dgrpo: best/ (1) is not tested under FSDP") and "dgrpo eval" in lines[1]


def test_same_saved_model_compares_the_files_the_manifests_vouch_for(tmp_path, tokenizer):
    """Two unsharded saves (fsdp: full) of one model are the same; another weight, another file, a folder without a
    manifest or shards whose metadata maps the tensors elsewhere are not."""
    import pickle

    from dgrpo.model.verified import write_manifest
    from dgrpo.training.consolidate import same_saved_model

    lm = make_lm(tokenizer)
    for name in ("a", "b"):
        lm.save_pretrained(tmp_path / name)
    assert same_saved_model(tmp_path / "a", tmp_path / "b")
    (tmp_path / "b" / "extra.txt").write_text("x")
    write_manifest(tmp_path / "b")
    assert not same_saved_model(tmp_path / "a", tmp_path / "b")
    (tmp_path / "b" / "manifest.json").unlink()
    assert not same_saved_model(tmp_path / "a", tmp_path / "b")
    out = sharded_run(tmp_path, tokenizer, lambda state: None)
    metadata = out / "best" / "dcp" / ".metadata"
    read = pickle.loads(metadata.read_bytes())
    info = next(iter(read.storage_data.values()))
    info.offset += 1  # (the same shard files, read as other tensors)
    metadata.write_bytes(pickle.dumps(read))
    write_manifest(out / "best")
    assert not same_saved_model(out / "best", out / "final")


def test_a_best_whose_shards_metadata_reads_otherwise_or_is_not_vouched_for_is_not_the_final_model(tmp_path, tokenizer):
    """The same shard files are not the same model when best/'s metadata reads them as other tensors (a dtype),
    cannot be read, or is not in best/'s manifest (nothing vouches for it), in either order (mutants: the tensors'
    entries not compared, an unreadable metadata taken as the same, one manifest without the metadata passed)."""
    import pickle

    import torch

    from dgrpo.model.verified import write_manifest
    from dgrpo.training.consolidate import same_saved_model

    out = sharded_run(tmp_path, tokenizer, lambda state: None)
    best, final = out / "best", out / "final"
    metadata = best / "dcp" / ".metadata"
    kept = metadata.read_bytes()
    read = pickle.loads(kept)
    read.state_dict_metadata["model.norm.weight"].properties.dtype = torch.float16
    metadata.write_bytes(pickle.dumps(read))
    assert not same_saved_model(best, final)
    metadata.write_bytes(b"not a checkpoint's metadata")
    assert not same_saved_model(best, final)
    metadata.write_bytes(kept)
    assert same_saved_model(best, final)
    metadata.rename(tmp_path / "aside")
    write_manifest(best)
    (tmp_path / "aside").rename(metadata)
    assert not same_saved_model(best, final) and not same_saved_model(final, best)
