"""dgrpo.training.consolidate at its edges (a second pass of mutation testing): what it is given is found (a path
that is not there, a run directory meaning its final/), and the metadata file is checked (listed in the manifest,
not empty) before anything is read from it."""

import shutil

import pytest
import torch

from dgrpo.model.verified import CheckpointError, write_manifest
from dgrpo.training.consolidate import SafeFileSystemReader, _sharded_checkpoint, consolidate_checkpoint

from conftest import save_shards, sharded_final

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # (shards saved in one process)


def test_a_missing_path_is_not_found_and_a_run_directory_means_its_final_checkpoint(tmp_path):
    """A path that is not there: 'not found' (not 'no sharded checkpoint'). A run directory whose final/ holds the
    shards: final/ is consolidated."""
    with pytest.raises(CheckpointError, match=r"missing: not found$"):
        consolidate_checkpoint(tmp_path / "missing")
    final = save_shards(tmp_path / "run" / "final", {"w": torch.ones(2)})
    write_manifest(final)
    assert _sharded_checkpoint(tmp_path / "run") == final


@pytest.mark.parametrize("weights", ["model.safetensors", "model.safetensors.index.json"])
def test_a_whole_model_is_nothing_to_consolidate_and_says_so(tmp_path, weights):
    """A folder holding the whole model (``fsdp: full`` or one process wrote it), or a run directory whose final/
    does: 'nothing to consolidate', naming the folder that holds it; it said there was no sharded checkpoint, as of
    an empty folder, which still says so."""
    final = tmp_path / "run" / "final"
    final.mkdir(parents=True)
    (final / weights).write_text("{}")
    for given in (final, tmp_path / "run"):
        with pytest.raises(CheckpointError, match=rf"^{given}: nothing to consolidate: {final} holds the whole model"):
            consolidate_checkpoint(given)
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match=r"empty: no sharded checkpoint \(dcp/.metadata\) to consolidate$"):
        consolidate_checkpoint(tmp_path / "empty")


def test_shards_the_manifest_does_not_vouch_for_are_refused(tmp_path):
    """A checkpoint whose manifest does not list dcp/.metadata (shards put there after dgrpo wrote it): refused
    before they are read, not written into a new, verified checkpoint."""
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "config.json").write_text("{}")
    write_manifest(d)
    save_shards(d, {"w": torch.ones(2)})
    with pytest.raises(CheckpointError, match=r"is damaged: the manifest does not list dcp/.metadata"):
        consolidate_checkpoint(d)


def test_an_empty_metadata_file_is_one_line(tmp_path):
    """A .metadata cut to nothing (a copy that stopped): a CheckpointError line, not an EOFError traceback."""
    (tmp_path / "dcp").mkdir()
    (tmp_path / "dcp" / ".metadata").write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"not a checkpoint metadata file dgrpo can read safely \(EOFError"):
        SafeFileSystemReader(tmp_path / "dcp").read_metadata()


def test_shards_of_another_shape_or_with_a_weight_the_model_lacks_are_refused(tmp_path, tokenizer):
    """Shards whose model.norm.weight is one longer than config.json says: a CheckpointError naming the weight and
    both shapes (not load_state_dict's size-mismatch traceback). Shards with a weight the config's model has not:
    refused (load_state_dict(strict=False) would drop it without a word). Nothing is written either way."""

    def longer(state):
        state["model.norm.weight"] = torch.ones(state["model.norm.weight"].shape[0] + 1)

    final, n = sharded_final(tmp_path / "a", tokenizer, longer)
    with pytest.raises(CheckpointError, match=rf"1 of other shapes: model.norm.weight is \({n + 1},\), the config's"):
        consolidate_checkpoint(final)
    assert not (final / "model.safetensors").exists()
    final, _ = sharded_final(tmp_path / "b", tokenizer, lambda state: state.update(extra=torch.ones(2)))
    with pytest.raises(CheckpointError, match="the sharded weights do not match the model config"):
        consolidate_checkpoint(final)
    assert not (final / "model.safetensors").exists()


def test_a_consolidated_best_is_still_the_best_the_checkpoints_recorded(tmp_path, tokenizer):
    """``dgrpo consolidate OUT/best`` (as a sharded run's end advises) rewrote best/'s manifest, by which each
    checkpoint records best/: a resume (the same command again, or training on) removed best/ as "written after"
    its checkpoint. The record leaves out what consolidation writes; best/ of other shards is still told apart, and
    the whole manifest's digest (what a checkpoint recorded before) still keeps an unconsolidated best/."""
    import hashlib

    from dgrpo.training.distributed import Dist
    from dgrpo.training.run import RunDir

    from conftest import tiny_config

    out = tmp_path / "run"
    out.mkdir()
    sharded_final(tmp_path / "other", tokenizer, lambda s: s["model.norm.weight"].mul_(2))[0].rename(out / "best")
    with RunDir(out, tiny_config(), Dist(), "grpo", log=lambda m: None) as run:
        other = run.best_record()
        shutil.rmtree(out / "best")
        sharded_final(tmp_path, tokenizer, lambda s: None)[0].rename(out / "best")
        recorded, whole = run.best_record(), hashlib.sha256((out / "best" / "manifest.json").read_bytes()).hexdigest()
        assert recorded != other and not run.drop_stale_best({"best": whole})  # (a record of an earlier dgrpo)
        consolidate_checkpoint(out / "best")
        assert not run.drop_stale_best({"best": recorded}) and (out / "best" / "model.safetensors").is_file()
        assert run.drop_stale_best({"best": other}) and not (out / "best").exists()


def test_a_sharded_save_writes_the_config_json_that_its_consolidation_writes(tmp_path, tokenizer):
    """A model saved without weights (a sharded checkpoint: the shards beside it) writes config.json as the save
    with weights does (``architectures``, ``dtype``), so consolidating it leaves config.json as it was: a best/
    whose manifest a resumable checkpoint recorded still matches it once consolidated (a new tiny model's config has
    neither field until Hugging Face's save sets them)."""
    from conftest import make_lm

    for weights in (False, True):
        make_lm(tokenizer).save_pretrained(tmp_path / str(weights), weights=weights)
    texts = [(tmp_path / str(w) / "config.json").read_text() for w in (False, True)]
    assert texts[0] == texts[1] and '"architectures"' in texts[0] and '"dtype": "float32"' in texts[0]


STRAY = ["model.bak.safetensors", "model-extra.safetensors", "model-00001-of-00002.safetensors"]


@pytest.mark.parametrize("name", [*STRAY, "model.safetensors"])
def test_a_sharded_folder_is_unconsolidated_until_it_holds_weights_that_load(tmp_path, tokenizer, name):
    """A sharded final/ beside a stray ``model*.safetensors`` (a copy, a Hugging Face shard without its index) was
    taken as consolidated: the run's end left its ``dgrpo consolidate`` line out, and loading it said to consolidate
    it. Whether it is unconsolidated is now what loading finds: model.safetensors (or the index) alone counts."""
    from dgrpo.cli.train import consolidation_lines
    from dgrpo.model.latent_lm import LatentLM
    from dgrpo.training.consolidate import unconsolidated

    final, _ = sharded_final(tmp_path, tokenizer, lambda state: None)
    (final / name).write_bytes(b"")
    loads = name == "model.safetensors"
    assert unconsolidated(final) is not loads
    assert (f"  dgrpo consolidate {final}" in consolidation_lines(tmp_path)) is not loads
    if not loads:
        with pytest.raises(CheckpointError, match=r"holds FSDP shards \(fsdp: sharded\): dgrpo consolidate"):
            LatentLM.from_pretrained(final)
    (final / name).unlink()
    (final / "model.safetensors.index.json").write_text("{}")  # (Hugging Face's shards: the index names them)
    assert not unconsolidated(final)
