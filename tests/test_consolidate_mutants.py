"""dgrpo.training.consolidate's promises, one by one (gaps found by mutation testing): the metadata unpickler builds
dtypes and checkpoint classes only, refusing anything else before importing it; the metadata must be a Metadata of
tensors; a resumable checkpoint's model part is consolidated into its model/ and both manifests vouch for the result;
tied weights may be absent from the shards, other weights may not."""

import io
import os
import pickle
import shutil

import pytest
import torch

from dgrpo.model.verified import CheckpointError, atomic_dir, verify
from dgrpo.training.consolidate import SafeFileSystemReader, _MetadataUnpickler, consolidate_checkpoint, read_sharded

from conftest import make_lm, save_shards

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # (shards saved in one process)


def unpickled(data: bytes):
    return _MetadataUnpickler(io.BytesIO(data)).load()


def test_the_metadata_unpickler_builds_dtypes_and_refuses_torch_functions_and_other_modules():
    """``torch.float16`` is built; ``torch.load`` (an attribute of torch that is no dtype) is refused, and so is a
    dtype's name in any other module, before that module is imported (a missing one is refused, not imported)."""
    assert unpickled(b"ctorch\nfloat16\n.") is torch.float16
    assert unpickled(pickle.dumps(torch.Size([2, 3]))) == torch.Size([2, 3])
    for module, name in (("torch", "load"), ("torch", "save"), ("no_such_module_dgrpo", "float32")):
        with pytest.raises(pickle.UnpicklingError, match=f"references {module}.{name}, which a checkpoint never"):
            unpickled(f"c{module}\n{name}\n.".encode())


def test_the_metadata_must_be_a_checkpoints_and_hold_tensors_only(tmp_path):
    """A pickled dict where the metadata should be, or a checkpoint with a non-tensor entry (torch would unpickle its
    bytes with weights_only=False): one CheckpointError line each."""
    bad = tmp_path / "bad" / "dcp"
    bad.mkdir(parents=True)
    (bad / ".metadata").write_bytes(pickle.dumps({"a": 1}))
    with pytest.raises(CheckpointError, match=r"not a checkpoint metadata file \(found a dict\)"):
        SafeFileSystemReader(bad).read_metadata()
    with pytest.raises(CheckpointError) as e:  # (read before torch's loader, which would wrap the line)
        read_sharded(bad.parent)
    assert str(e.value) == f"{bad / '.metadata'}: not a checkpoint metadata file (found a dict)"
    d = save_shards(tmp_path / "bytes", {"w": torch.ones(2), "note": "text"})
    with pytest.raises(CheckpointError, match="entry 'note' is not a tensor"):
        read_sharded(d)


def test_read_sharded_returns_one_part_and_names_a_missing_one(tmp_path):
    d = save_shards(tmp_path, {"model": {"w": torch.arange(3.0)}, "optim": {"m": torch.ones(2)}})
    assert {k: v.tolist() for k, v in read_sharded(d, "model").items()} == {"w": [0.0, 1.0, 2.0]}
    with pytest.raises(CheckpointError, match=r"the shards hold no 'ema' entry"):
        read_sharded(d, "ema")


def test_shards_that_hold_no_weights_are_one_line(tmp_path):
    """An empty sharded checkpoint is a CheckpointError naming it (it was a StopIteration traceback)."""
    d = save_shards(tmp_path, {})
    with pytest.raises(CheckpointError, match=r"dcp: the shards hold no weights$"):
        consolidate_checkpoint(d)


def sharded_checkpoint(tmp_path, tokenizer, drop: str = "", final: bool = False):
    """A resumable checkpoint as fsdp=sharded writes it: state.json, model/ without weights, dcp/ holding the model
    (less ``drop``) beside an optimizer's state; its manifest over all of it. ``final``: a run's final/ instead (the
    model's files and its shards, nothing else)."""
    lm = make_lm(tokenizer)
    state = {k: v for k, v in lm.model.state_dict().items() if k != drop}
    staging = save_shards(tmp_path / "staging", state if final else {"model": state, "optim": {"m": torch.ones(2)}})
    with atomic_dir(tmp_path / "step-1") as d:
        lm.save_pretrained(d if final else d / "model", weights=False)
        shutil.move(staging / "dcp", d / "dcp")
        if not final:
            (d / "state.json").write_text("{}")
    return tmp_path / "step-1", lm.model


def test_a_resumable_checkpoint_is_consolidated_into_its_model_folder_and_both_manifests_vouch_for_it(
    tmp_path, tokenizer
):
    """The model part goes to step-1/model/model.safetensors (the shards stay: it still resumes); model/'s manifest
    and the checkpoint's own both verify. The tied LM head may be absent from the shards (its embedding is there)."""
    from safetensors.torch import load_file

    ckpt, model = sharded_checkpoint(tmp_path, tokenizer, drop="lm_head.weight")
    assert consolidate_checkpoint(ckpt) == ckpt / "model"
    assert verify(ckpt / "model") is None and verify(ckpt) is None and (ckpt / "dcp" / ".metadata").is_file()
    back = load_file(str(ckpt / "model" / "model.safetensors"))
    assert all(torch.equal(back[k], v) for k, v in model.state_dict().items() if k in back)
    assert torch.equal(back["model.embed_tokens.weight"], model.state_dict()["lm_head.weight"])


def test_shards_missing_a_weight_that_is_tied_to_nothing_are_refused(tmp_path, tokenizer):
    ckpt, _ = sharded_checkpoint(tmp_path, tokenizer, drop="model.norm.weight")
    with pytest.raises(CheckpointError, match="the sharded weights do not match the model config"):
        consolidate_checkpoint(ckpt)
    assert not (ckpt / "model" / "model.safetensors").exists()


def snapshot(folder):
    """Every file below ``folder`` (hidden ones too) -> its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_consolidation_that_fails_leaves_the_checkpoint_as_it_was(tmp_path, tokenizer, monkeypatch):
    """Consolidation writes into a copy that replaces the checkpoint only once the result loads: a failure at the
    last moment (here the check that the result loads) leaves every file as it was, still verified, with no weights
    file and no leftover copy beside it (it wrote into the checkpoint itself, so a stop mid-write left a cut-short,
    unlisted model.safetensors)."""
    from dgrpo.training import consolidate

    ckpt, _ = sharded_checkpoint(tmp_path, tokenizer)
    before = snapshot(ckpt)

    def fails(folder):
        assert (folder / "model.safetensors").is_file()  # (written, not yet in place)
        raise OSError("disk full")

    monkeypatch.setattr(consolidate.LatentLM, "from_pretrained", fails)
    with pytest.raises(OSError, match="disk full"):
        consolidate_checkpoint(ckpt)
    assert snapshot(ckpt) == before and verify(ckpt) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["staging", "step-1"]


@pytest.mark.parametrize("final", [False, True], ids=["resumable", "final"])
def test_consolidation_never_writes_through_into_the_files_it_replaces(tmp_path, tokenizer, final):
    """The copy that is changed is made of hard links to the checkpoint's files: the manifests and config.json are
    replaced there, not written into, so a link to the old files (a copy of the run made with ``cp -al``, a backup)
    keeps their old content. Nothing is left beside the checkpoint, or in it but the model's new files."""
    ckpt, _ = sharded_checkpoint(tmp_path, tokenizer, final=final)
    backup = tmp_path / "backup"
    shutil.copytree(ckpt, backup, copy_function=os.link)
    before = snapshot(backup)
    assert consolidate_checkpoint(ckpt) == (ckpt if final else ckpt / "model")
    assert snapshot(backup) == before and verify(backup) is None
    after = snapshot(ckpt)
    assert after["manifest.json"] != before["manifest.json"] and verify(ckpt) is None
    prefix = "" if final else "model/"
    assert set(after) - set(before) <= {f"{prefix}model.safetensors", f"{prefix}generation_config.json"}
    assert f"{prefix}model.safetensors" in after  # (and no .save/ folder left in it)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["backup", "staging", "step-1"]


@pytest.mark.parametrize("final", [False, True], ids=["resumable", "final"])
def test_a_consolidated_checkpoint_is_not_consolidated_again_unless_its_shards_changed(
    tmp_path, tokenizer, run_cli, final
):
    """``dgrpo consolidate`` of a checkpoint it consolidated read every shard and wrote the weights again (the
    end of a sharded run lists best/ and final/, and best/'s test lines name best/ too): it says so and writes
    nothing. Shards changed since (put there by hand, the manifest deleted to load them): consolidated again."""
    from safetensors.torch import load_file

    ckpt, model = sharded_checkpoint(tmp_path, tokenizer, final=final)
    folder = ckpt if final else ckpt / "model"
    r = run_cli("consolidate", ckpt)
    assert r.returncode == 0 and r.stdout == f"wrote {folder}/model.safetensors\n", r.stderr
    before = {p: p.stat().st_ino for p in ckpt.rglob("*")}
    r = run_cli("consolidate", ckpt)
    assert r.returncode == 0 and r.stdout.startswith(f"{folder} is already consolidated ("), r.stderr
    assert r.stdout.endswith("): nothing to do\n") and {p: p.stat().st_ino for p in ckpt.rglob("*")} == before
    state = {k: v * 2 for k, v in model.state_dict().items()}
    shutil.rmtree(ckpt / "dcp")
    shutil.move(save_shards(tmp_path / "new", state if final else {"model": state, "optim": {}}) / "dcp", ckpt / "dcp")
    (ckpt / "manifest.json").unlink()
    assert consolidate_checkpoint(ckpt) == folder and verify(ckpt) is None
    back = load_file(str(folder / "model.safetensors"))
    assert torch.equal(back["model.norm.weight"], state["model.norm.weight"])


@pytest.mark.parametrize("final", [False, True], ids=["resumable", "final"])
def test_only_the_model_folders_weights_mean_a_checkpoint_was_consolidated(tmp_path, tokenizer, final):
    """A manifest that lists, beside the shards, a file that is no weights loading reads (``model.safetensors.bak``)
    or, in a resumable checkpoint, weights outside its model/ (a stray top-level ``model.safetensors``): the shards
    are still consolidated, into the folder that loads (mutants: a prefix match of the weights' name; the model/
    prefix not required)."""
    from dgrpo.model.verified import write_manifest
    from dgrpo.training.consolidate import consolidated

    ckpt, _ = sharded_checkpoint(tmp_path, tokenizer, final=final)
    (ckpt / ("model.safetensors.bak" if final else "model.safetensors")).write_bytes(b"stray")
    write_manifest(ckpt)
    folder = ckpt if final else ckpt / "model"
    assert consolidated(ckpt) == (folder, True) and verify(folder) is None


def test_a_resumable_checkpoint_of_the_whole_model_is_nothing_to_consolidate(tmp_path):
    """A resumable checkpoint written under ``fsdp: full`` (or in one process) holds its model's weights in model/:
    'nothing to consolidate', naming model/ (not 'no sharded checkpoint', as of an empty folder)."""
    (tmp_path / "step-1" / "model").mkdir(parents=True)
    (tmp_path / "step-1" / "model" / "model.safetensors").write_bytes(b"weights")
    model = tmp_path / "step-1" / "model"
    with pytest.raises(CheckpointError, match=rf"^{tmp_path / 'step-1'}: nothing to consolidate: {model} holds the"):
        consolidate_checkpoint(tmp_path / "step-1")


def test_dgrpo_consolidate_says_its_line_without_transformers_progress_bars(tmp_path, tokenizer, run_cli):
    """``dgrpo consolidate`` printed transformers' "Writing model shards" and "Loading weights" bars (its save and the
    check that the result loads) around its one line, where every other command has them off; they are off while it
    writes and checks, and as they were afterwards (a Python caller's stay on)."""
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.enable_progress_bar()
    try:
        ckpt, _ = sharded_checkpoint(tmp_path, tokenizer, final=True)
        r = run_cli("consolidate", ckpt)
        assert r.returncode == 0 and r.stdout == f"wrote {ckpt}/model.safetensors\n", r.stderr
        assert "Loading weights" not in r.stderr and "Writing model shards" not in r.stderr, r.stderr
        assert hf_logging.is_progress_bar_enabled()
    finally:
        if not was_on:
            hf_logging.disable_progress_bar()
