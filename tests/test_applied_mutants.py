"""dgrpo.training.applied's rules, one by one on stand-ins (gaps found by mutation testing): what applied_settings
reads from what the trainer built, which entries a start at a step keeps in applied.json, and when a plug-in file's
change is told."""

import hashlib
import json
import os
import warnings
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from dgrpo.model.gqa_attention import PACKED_GQA
from dgrpo.training.applied import (
    applied_settings,
    fsdp_applied,
    record_applied,
    versions,
    warn_if_plugins_changed,
    weight_dtype,
)
from dgrpo.training.master_weights import MasterWeightAdamW


def stand_in_lm(model: nn.Module, fallbacks: int | None, attn: str = "sdpa"):
    model.config = SimpleNamespace(_attn_implementation=attn)  # type: ignore[assignment]
    compiled = None if fallbacks is None else SimpleNamespace(fallbacks=fallbacks)
    return SimpleNamespace(
        device=torch.device("cpu"), model=model, compiled_layers=compiled, head_stats=SimpleNamespace(compiled=False)
    )


def test_applied_settings_reads_what_the_trainer_built(tmp_path):
    """Two processes under FSDP with sharded checkpoints, float32 masters over bf16 weights, compiled layers with 3
    eager fallbacks, packed GQA attention, and a reward file's hash; then one process, torch AdamW, nothing compiled."""
    reward = tmp_path / "reward.py"
    reward.write_text("def reward(c, a):\n    return 1.0\n")
    model = nn.Linear(2, 2).to(torch.bfloat16)
    dist = SimpleNamespace(world_size=2, fsdp=True, checkpoint="sharded")
    out = applied_settings(
        stand_in_lm(model, 3, PACKED_GQA),
        dist,
        MasterWeightAdamW(model.parameters()),
        kernels="liger",
        plugins=[f"{reward}:reward"],
        engine="fast",
    )
    assert {k: out[k] for k in ("device", "processes", "fsdp", "master_weights", "dtype", "kernels")} == {
        "device": "cpu",
        "processes": 2,
        "fsdp": "sharded",
        "master_weights": True,
        "dtype": "bfloat16",
        "kernels": "liger",
    }
    assert (out["compile"], out["compile_fallbacks"], out["pack_gqa"], out["engine"]) == (True, 3, True, "fast")
    assert out["plugin_files"] == {str(reward.resolve()): hashlib.sha256(reward.read_bytes()).hexdigest()}
    one = applied_settings(
        stand_in_lm(nn.Linear(2, 2), None), SimpleNamespace(world_size=1, fsdp=False, checkpoint="full"),
        torch.optim.AdamW(nn.Linear(2, 2).parameters()), kernels="none",
    )  # fmt: skip
    assert (one["fsdp"], one["optimizer"], one["master_weights"]) == ("none", "torch.optim.adamw.AdamW", False)
    assert (one["compile"], one["compile_fallbacks"], one["pack_gqa"], one["plugin_files"]) == (False, 0, False, {})


def test_fsdp_applied_and_the_dtype_of_the_first_trained_weight():
    """fsdp in one process: none. The dtype is the first trained weight's (a frozen bf16 embedding before it does not
    count), the first weight's when none trains, none without weights."""
    assert fsdp_applied(SimpleNamespace(fsdp=False, checkpoint="sharded")) == "none"
    model = nn.Sequential(nn.Embedding(3, 2).to(torch.bfloat16), nn.Linear(2, 2))
    model[0].weight.requires_grad_(False)
    assert weight_dtype(model) == "float32"
    model.requires_grad_(False)
    assert weight_dtype(model) == "bfloat16"
    assert weight_dtype(nn.ReLU()) == "none"


def test_versions_name_cuda_only_for_a_cuda_build(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)
    assert "cuda" not in versions() and versions()["torch"] == torch.__version__


def entries(path):
    return [(e["started_at_step"], e.get("n")) for e in json.loads(path.read_text())]


def test_a_start_at_a_step_keeps_only_the_entries_of_earlier_starts(tmp_path):
    """Starts at 0, 4 and 8, then a rewind to 4: the entries of 0 are kept, those of 4 and 8 dropped (the same step
    too), as are entries that name no step or are no object."""
    path = tmp_path / "applied.json"
    for step, n in ((0, "a"), (4, "b"), (8, "c")):
        record_applied(path, step, {"n": n})
    record_applied(path, 4, {"n": "d"})
    assert entries(path) == [(0, "a"), (4, "d")]
    path.write_text(json.dumps([{"n": "old"}, 5, {"started_at_step": 1, "n": "e"}]))
    record_applied(path, 3, {"n": "f"})
    assert entries(path) == [(1, "e"), (3, "f")]


def test_a_failed_write_of_applied_json_leaves_it_and_no_temporary_file(tmp_path, monkeypatch):
    """Not JSON, or a rename that fails after the temporary file was written: applied.json as it was, nothing else."""
    path = tmp_path / "applied.json"
    record_applied(path, 0, {"n": "a"})
    with pytest.raises(TypeError):
        record_applied(path, 2, {"n": object()})  # (not JSON)

    def full(*a):
        raise OSError("no space left on device")

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(OSError, match="no space left"):
        record_applied(path, 2, {"n": "b"})
    monkeypatch.undo()
    assert entries(path) == [(0, "a")] and sorted(p.name for p in tmp_path.iterdir()) == ["applied.json"]


def test_an_applied_json_that_is_no_list_is_written_anew_with_one_warning(tmp_path):
    """Its check of plug-in files says nothing of it (record_applied, right after, warns once)."""
    path = tmp_path / "applied.json"
    path.write_text(json.dumps({"started_at_step": 0}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_plugins_changed(path, 2, {"plugin_files": {"r.py": "x"}})
    with pytest.warns(UserWarning, match="is not a list of applied settings: written anew"):
        record_applied(path, 2, {})
    assert entries(path) == [(2, None)]


def test_a_plugin_file_changed_since_the_last_start_is_told_and_a_new_one_is_not(tmp_path):
    """Compared with the latest earlier start (0: hash a, 4: hash b), a resume at 8 with hash b is silent, with hash c
    warned of, naming the start at 4; a plug-in file no earlier start recorded is not warned of."""
    path = tmp_path / "applied.json"
    record_applied(path, 0, {"plugin_files": {"r.py": "a"}})
    record_applied(path, 4, {"plugin_files": {"r.py": "b"}})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_plugins_changed(path, 8, {"plugin_files": {"r.py": "b", "new.py": "n"}})
    with pytest.warns(UserWarning, match=r"^r.py changed since this run's start at step 4: the steps from 8 use"):
        warn_if_plugins_changed(path, 8, {"plugin_files": {"r.py": "c"}})
