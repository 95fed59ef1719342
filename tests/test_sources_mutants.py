"""Where a model name points (:mod:`dgrpo.model.sources`): which directories are checkpoints, how a run or a step
name resolves, which names are hub ids, the device options, and what a missing hub model's lines say (gaps found
by mutation testing)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dgrpo.model import sources
from dgrpo.model.verified import CheckpointError

INDEX = "model.safetensors.index.json"


def _touch(folder: Path, *names: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_text("{}")
    return folder


@pytest.mark.parametrize(
    ("files", "is_model"),
    [
        (["adapter_config.json"], True),  # (a LoRA adapter: no config.json of its own)
        (["config.json", "model.safetensors"], True),
        (["config.json", "model.safetensors.index.json"], True),  # (sharded weights)
        (["config.json", "pytorch_model.bin"], True),
        (["config.json", "latent_config.json"], True),  # (dgrpo's latent settings: weights looked for later)
        (["config.json"], False),
        (["model.safetensors", "latent_config.json"], False),
        ([], False),
    ],
)
def test_a_model_directory_is_an_adapter_or_a_config_beside_weights(tmp_path, files, is_model):
    """is_model_dir: an adapter config alone, or config.json with weights in any of the three forms or with
    dgrpo's latent settings; config.json alone, or weights without it, is not a checkpoint."""
    assert sources.is_model_dir(_touch(tmp_path / "m", *files)) is is_model


def test_a_run_directory_resolves_to_final_and_a_checkpoint_to_its_model(tmp_path):
    """A run directory (itself no model) to its final/, a resumable checkpoint (state.json beside model/) to model/,
    a model/ folder without state.json is not taken for one, and a step named unpadded finds the padded folder."""
    run = _touch(tmp_path / "run", "metrics.jsonl")
    _touch(run / "final", "config.json", "model.safetensors")
    assert sources.resolve_checkpoint(run) == run / "final"
    step = _touch(run / "checkpoints" / "step-00000128", "state.json")
    _touch(step / "model", "config.json", "model.safetensors")
    assert sources.resolve_checkpoint(run / "checkpoints" / "step-128") == step / "model"
    assert sources.on_disk(run / "checkpoints" / "step-128") == step
    bare = _touch(tmp_path / "bare")
    _touch(bare / "model", "config.json", "model.safetensors")
    with pytest.raises(CheckpointError, match="holds no model checkpoint"):
        sources.resolve_checkpoint(bare)


def test_a_run_whose_final_is_no_model_is_not_said_to_lack_final(tmp_path):
    """final/ is written whole, then renamed into place: a final/ that is no model was changed since. Its manifest
    says what is missing; without one, final/ is named as holding no model (both were 'a run directory without
    final/ (the run did not finish: rerun its command to resume it ...)', which would retrain nothing)."""
    from dgrpo.model.verified import write_manifest

    run = _touch(tmp_path / "run", "metrics.jsonl")
    final = _touch(run / "final", "config.json", "model.safetensors")
    write_manifest(final)
    (final / "config.json").unlink()
    with pytest.raises(CheckpointError, match=r"final is damaged: missing file config\.json"):
        sources.resolve_checkpoint(run)
    (final / "manifest.json").unlink()
    with pytest.raises(CheckpointError, match=r"final holds no model checkpoint \(no config\.json with weights\)$"):
        sources.resolve_checkpoint(run)


def test_an_existing_unpadded_step_folder_is_itself(tmp_path):
    """on_disk maps ``step-N`` to the padded name only when the name given does not exist itself."""
    mine = _touch(tmp_path / "step-7")
    _touch(tmp_path / "step-00000007")
    assert sources.on_disk(mine) == mine
    assert sources.on_disk(tmp_path / "step-8") == tmp_path / "step-8"  # (neither exists: as given)


def test_a_checkpoint_dir_holding_a_model_and_a_final_is_its_final(tmp_path):
    """A folder that is a model and holds final/ (a run saved over a model folder) resolves to final/ first."""
    top = _touch(tmp_path / "both", "config.json", "model.safetensors")
    _touch(top / "final", "config.json", "model.safetensors")
    assert sources.resolve_checkpoint(top) == top / "final"


def test_coconut_files_are_named_for_what_they_are(tmp_path):
    """A ``checkpoint_N`` file, or a folder holding such files, is told to go through import-coconut; another file
    or a folder with only a ``checkpoint_N`` subfolder is not."""
    (tmp_path / "save").mkdir()
    (tmp_path / "save" / "checkpoint_3").write_bytes(b"x")
    assert "dgrpo import-coconut" in sources.coconut_hint(tmp_path / "save" / "checkpoint_3")
    assert "holds checkpoint_N files" in sources.coconut_hint(tmp_path / "save")
    (tmp_path / "other").write_bytes(b"x")
    (tmp_path / "checkpoint_").write_bytes(b"x")
    assert sources.coconut_hint(tmp_path / "other") == sources.coconut_hint(tmp_path / "checkpoint_") == ""
    _touch(tmp_path / "dirs" / "checkpoint_1")
    assert sources.coconut_hint(tmp_path / "dirs") == ""
    with pytest.raises(CheckpointError, match=r"is a file, not a checkpoint directory: checkpoint_N is the official"):
        sources.resolve_checkpoint(tmp_path / "save" / "checkpoint_3")


@pytest.mark.parametrize(
    ("name", "path_like"),
    [
        ("gpt2", False),
        ("Qwen/Qwen2.5-1.5B", False),
        ("runs/sft", False),  # (shaped like a hub id: looked up there when no such folder)
        ("./runs/sft", True),
        ("../sft", True),
        ("/abs/sft", True),
        ("~/sft", True),
        ("runs/sft/", True),
        ("runs/sft/final", True),
        ("-bad", True),
    ],
)
def test_which_names_look_like_paths(name, path_like):
    """A name starting with / . ~, ending in /, or not of a hub id's shape (more than one slash) is a path."""
    assert sources._looks_like_path(name) is path_like


def test_a_missing_path_is_not_looked_up_on_the_hub(tmp_path, monkeypatch):
    """A path-shaped name that does not exist is one line, without a hub lookup; an existing checkpoint is read
    from disk only (local_files_only)."""
    monkeypatch.setattr(sources, "resolve_hub_model", lambda *a: pytest.fail("looked up on the hub"))
    with pytest.raises(CheckpointError, match="checkpoint directory not found"):
        sources.resolve_model_source(str(tmp_path / "nope"))
    model = _touch(tmp_path / "m", "config.json", "model.safetensors")
    assert sources.resolve_model_source(str(model)) == (str(model), True)


def test_the_built_in_models_name_is_never_looked_up_on_the_hub(tmp_path, monkeypatch):
    """``--init builtin-tiny`` / ``--model builtin-tiny`` is one line saying what the name means (it was looked up as
    a hub id: "not in the Hugging Face cache", or a hub timeout); a checkpoint directory of that name in the working
    directory is still read from disk."""
    monkeypatch.setattr(sources, "hub_reachable", lambda: pytest.fail("looked up on the hub"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CheckpointError, match=r"^builtin-tiny is the untrained built-in model, .* not a model to load"):
        sources.resolve_model_source(sources.BUILTIN)
    _touch(tmp_path / sources.BUILTIN, "config.json", "model.safetensors")
    assert sources.resolve_model_source(sources.BUILTIN) == (sources.BUILTIN, True)  # (the relative path, read)


def test_device_options(monkeypatch):
    """``auto`` is CUDA when there is one; ``model.compile_head``-like options are on for true, and for auto on
    CUDA only; a CUDA index is refused from the device count on (cuda:1 on a one-GPU machine)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert sources.resolve_device("auto") == torch.device("cuda")
    assert sources.resolve_device("cuda:0") == torch.device("cuda:0")
    with pytest.raises(CheckpointError, match=r"this machine has 1 CUDA device\(s\)"):
        sources.resolve_device("cuda:1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert sources.resolve_device("auto") == torch.device("cpu")
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert [sources.on_for_device(s, cuda) for s in ("auto", "true", "false")] == [True, True, False]
    assert [sources.on_for_device(s, cpu) for s in ("auto", "true", "false")] == [False, True, False]


def test_revision_keywords_and_the_download_hint():
    """No revision keyword for the default branch; the download command names the revision when there is one."""
    assert sources.revision_kwargs(None) == sources.revision_kwargs("") == {}
    assert sources.revision_kwargs("v1") == {"revision": "v1"}
    assert "(hf download org/m --revision v1)" in sources.download_hint("org/m", "v1")
    assert "(hf download org/m)" in sources.download_hint("org/m", None)


def test_missing_shards_are_counted_and_at_most_three_named(tmp_path, monkeypatch):
    """The shards an index names that are missing beside it: counted, the first three named and how many more, 'is' for
    one; the shard transformers named when no index is at hand; a single model.safetensors missing is no weights."""
    shards = [f"model-0000{i}-of-00006.safetensors" for i in range(1, 7)]
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {str(i): s for i, s in enumerate(shards)}})
    )
    monkeypatch.setattr(sources, "_cached_file", lambda name, file, revision: tmp_path / file)
    error = OSError(f"org/m does not appear to have a file named {shards[0]}.")
    assert sources.missing_weights(error, "org/m", None) == (
        f"6 of the 6 safetensors shards its {INDEX} names are missing ({', '.join(shards[:3])} and 3 more)"
    )
    for s in shards[1:]:
        (tmp_path / s).write_text("")
    assert sources.missing_weights(error, "org/m", None).startswith("1 of the 6 safetensors shards its")
    assert sources.missing_weights(error, "org/m", None).endswith(f"names is missing ({shards[0]})")
    for s in shards[1:4]:
        (tmp_path / s).unlink()
    assert sources.missing_weights(error, "org/m", None) == (
        f"4 of the 6 safetensors shards its {INDEX} names are missing ({', '.join(shards[:3])} and 1 more)"
    )
    (tmp_path / "model.safetensors.index.json").unlink()
    assert sources.missing_weights(error, "org/m", None) == (
        f"its safetensors weights are in shards (model.safetensors.index.json), and {shards[0]} is missing"
    )
    single = OSError("org/m does not appear to have a file named model.safetensors.")
    assert sources.missing_weights(single, "org/m", None) == sources.NO_SAFETENSORS


@pytest.fixture
def hub_cache_of(monkeypatch, tmp_path):
    """A Hugging Face cache at ``tmp_path`` whose lookups answer from ``files`` (file name -> what
    try_to_load_from_cache returns); no offline variable set; the hub's reachability set by the test."""
    import huggingface_hub
    from huggingface_hub import constants

    files: dict[str, object] = {}
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda name, file, revision=None: files.get(file))
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    return files


@pytest.mark.parametrize("reachable", [True, False])
def test_a_cached_hub_id_is_read_from_the_hub_when_it_answers_and_from_the_cache_when_not(
    hub_cache_of, monkeypatch, reachable
):
    """A cached model (its config.json, or only an adapter_config.json) is looked up on a reachable hub (a newer
    commit may be there) and read from the cache when the hub cannot be reached; an uncached one on a reachable hub
    is the hub's; an uncached one without the hub is one line."""
    monkeypatch.setattr(sources, "hub_reachable", lambda: reachable)
    hub_cache_of["adapter_config.json"] = "/cache/adapter_config.json"
    assert sources.resolve_hub_model("org/m") == ("org/m", not reachable)
    hub_cache_of.clear()
    hub_cache_of["config.json"] = object()  # (huggingface_hub's "known not to exist" answer: not a cached file)
    if reachable:
        assert sources.resolve_hub_model("org/m") == ("org/m", False)
    else:
        with pytest.raises(CheckpointError, match=r"^model 'org/m': not a local directory, not in the Hugging Face"):
            sources.resolve_hub_model("org/m")


@pytest.mark.parametrize("variable", ["HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"])
def test_offline_mode_reads_the_cache_only_and_names_its_variable(hub_cache_of, monkeypatch, tmp_path, variable):
    """With either offline variable set the hub is not probed: a cached model is read locally; a missing one is a
    line naming the variable, and saying when other revisions of the repository are cached."""
    monkeypatch.setenv(variable, "1")
    monkeypatch.setattr(sources, "hub_reachable", lambda: pytest.fail("probed the hub in offline mode"))
    hub_cache_of["config.json"] = "/cache/config.json"
    assert sources.resolve_hub_model("org/m") == ("org/m", True)
    hub_cache_of.clear()
    with pytest.raises(CheckpointError, match=rf"{variable} is set but the model is not in the Hugging Face cache"):
        sources.resolve_hub_model("org/m")
    (tmp_path / "models--org--m").mkdir()
    with pytest.raises(CheckpointError, match=r"at revision 'v2': .* is not at revision 'v2' \(other revisions are\)"):
        sources.resolve_hub_model("org/m", "v2")


def test_a_shard_named_missing_but_present_beside_its_index_is_still_named(tmp_path, monkeypatch):
    """Every shard of the index beside it, yet transformers named one missing (it looked elsewhere): that shard is
    the one named, counted as 1."""
    shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    (tmp_path / INDEX).write_text(json.dumps({"weight_map": {"a": shards[0], "b": shards[1]}}))
    for s in shards:
        (tmp_path / s).write_text("")
    monkeypatch.setattr(sources, "_cached_file", lambda name, file, revision: tmp_path / file)
    error = OSError(f"org/m does not appear to have a file named {shards[1]}.")
    assert (
        sources.missing_weights(error, "org/m", None)
        == f"1 of the 2 safetensors shards its {INDEX} names is missing ({shards[1]})"
    )


def test_a_name_that_is_no_hub_id_has_no_cached_file():
    """_cached_file of a name huggingface_hub refuses as a repository id is FileNotFoundError, not its validation
    error."""
    with pytest.raises(FileNotFoundError):
        sources._cached_file("a/b/c", "config.json", None)


def test_hub_files_resolves_the_source_unless_the_cache_is_already_chosen(monkeypatch):
    """hub_files asks where to read a hub id from only when ``local_files_only`` is not already true, and a failed
    snapshot says where it was read: the cache or the hub."""
    import huggingface_hub

    asked: list[str] = []
    monkeypatch.setattr(sources, "resolve_model_source", lambda name, revision: asked.append(name) or (name, False))

    def snapshot_download(name, revision=None, allow_patterns=None, local_files_only=False):
        raise OSError("gone")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    with pytest.raises(
        CheckpointError, match=r"^model 'org/m' at revision 'v1': cannot be read in the Hugging Face cache"
    ):
        sources.hub_files("org/m", "v1", local_files_only=True)
    assert asked == []
    with pytest.raises(CheckpointError, match=r"^model 'org/m': cannot be read on the hub: "):
        sources.hub_files("org/m", None)
    assert asked == ["org/m"]
