"""A second mutation pass over :mod:`dgrpo.training.checkpoint`: what would silently break a bit-exact resume and
that the first pass (test_checkpoint_mutants.py) left untested: the random states put back device by device, the
rotation's default, a checkpoint that cannot be pruned, the counters state.json records, and the optimizer state
matched to the right parameters. Each test writes a checkpoint of a stand-in model (no weights) or calls one check."""

import json
import warnings
from pathlib import Path

import pytest
import torch

from dgrpo.config import ConfigError
from dgrpo.model.verified import CheckpointError, write_manifest
from dgrpo.training import checkpoint
from dgrpo.training.checkpoint import (
    check_optimizer_state,
    list_checkpoints,
    read_checkpoint,
    required_files,
    save_checkpoint,
)


class StubLM:
    """What save_checkpoint and required_files use of a LatentLM: ``save_pretrained`` writes a config only."""

    checkpoint_files: tuple[str, ...] = ("model.safetensors", "config.json")

    def __init__(self) -> None:
        self.weights: list[bool] = []  # (each save_pretrained's ``weights``)

    def save_pretrained(self, path: Path, state_dict=None, weights: bool = True) -> None:
        self.weights.append(weights)
        path.mkdir()
        (path / "config.json").write_text("{}")


class StubReadLM(StubLM):
    """What read_checkpoint uses of a LatentLM without weights (no adapter, no hub revision, on the CPU)."""

    checkpoint_files = ("config.json",)
    peft, revision, device = None, None, "cpu"

    def read_weights_dir(self, path: Path) -> dict:
        return {}


def _save(out: Path, step: int, **kw) -> Path:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    return save_checkpoint(out, step, lm=StubLM(), optimizer=opt, state={"trainer": {}}, **kw)


def _steps(out: Path) -> list[int]:
    return [int(p.name.removeprefix("step-")) for p in list_checkpoints(out)]


def test_the_rotation_keeps_the_two_newest_checkpoints_by_default(tmp_path):
    """save_checkpoint's default keep_last is 2: after steps 1, 2, 3 the checkpoints of steps 2 and 3 are left."""
    for step in (1, 2, 3):
        _save(tmp_path, step)
    assert _steps(tmp_path) == [2, 3]


def test_a_users_copy_of_a_checkpoint_is_neither_rotated_away_nor_resumed(tmp_path):
    """``cp -r step-00000002 step-00000002-copy`` in checkpoints/: the copy sorted after step 2 by name, so rotation
    deleted it as an old checkpoint, and a resume took it for the newest; an unpadded name sorted by its digits."""
    from dgrpo.training.checkpoint import resume_candidates

    _save(tmp_path, 2)
    root = tmp_path / "checkpoints"
    for name in ("step-00000002-copy", "step-10"):
        (root / name).mkdir()
    _save(tmp_path, 3, keep_last=3)
    assert (root / "step-00000002-copy").is_dir()
    assert [p.name for p in resume_candidates(tmp_path)] == ["step-10", "step-00000003", "step-00000002"]
    _save(tmp_path, 11, keep_last=1)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-00000011"]
    assert (root / "step-00000002-copy").is_dir()


def test_a_checkpoint_that_cannot_be_pruned_is_left_and_the_new_one_is_kept(tmp_path, monkeypatch):
    """Pruning that fails (a permission error renaming the old folder) does not fail the save: the new checkpoint is
    written and returned, and the old one is left in place."""

    def refused(path):
        raise PermissionError(13, "Permission denied", str(path))

    _save(tmp_path, 1)
    monkeypatch.setattr(checkpoint, "remove_dir", refused)
    assert _save(tmp_path, 2, keep_last=1) == tmp_path / "checkpoints" / "step-00000002"
    assert _steps(tmp_path) == [1, 2]


def test_state_json_records_the_step_one_process_and_the_optimizers_full_name(tmp_path):
    """The step saved is the one given (a resumed run starts after it: not one later, not one earlier), a single
    process is world size 1 (RunDir compares it with the resuming world: 0 logged a spurious line), and the
    optimizer's class is named with its module."""
    state = json.loads((_save(tmp_path, 7) / "state.json").read_text())
    assert (state["step"], state["world_size"], state["optimizer_kind"]) == (7, 1, "torch.optim.sgd.SGD")
    assert state["trainer"] == {} and set(state["rng"]) == {"python", "numpy"}


class AdamW(torch.optim.AdamW):
    """Another package's ``AdamW`` (bitsandbytes has one): the same class name in another module."""


def test_an_optimizer_of_the_same_class_name_from_another_module_is_refused(tmp_path):
    """A checkpoint of torch's AdamW resumed by an AdamW of another module is refused as another optimizer (a class
    name alone would let bitsandbytes' AdamW load torch's AdamW state)."""
    p = [torch.nn.Parameter(torch.zeros(2))]
    saved = {"optimizer_kind": checkpoint.optimizer_kind(torch.optim.AdamW(p))}
    checkpoint.check_same_optimizer(tmp_path, saved, torch.optim.AdamW(p))
    with pytest.raises(ConfigError, match=r"holds the state of the optimizer torch\.optim\.adamw\.AdamW"):
        checkpoint.check_same_optimizer(tmp_path, saved, AdamW(p))


def _cuda(monkeypatch, n: int) -> list[list[int]]:
    """A machine that shows ``n`` CUDA devices whose states are [0], [1], ...; returns the list each
    ``set_rng_state_all`` call's states are appended to."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
    monkeypatch.setattr(
        torch.cuda, "get_rng_state_all", lambda: [torch.tensor([i], dtype=torch.uint8) for i in range(n)]
    )
    put: list[list[int]] = []
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", lambda s: put.append([int(t) for t in s]))
    return put


def test_every_cuda_state_is_restored_without_a_warning_when_the_devices_are_the_same(monkeypatch):
    """Two devices saved, two seen: both states go back, and nothing is warned (the warning is for fewer devices)."""
    put = _cuda(monkeypatch, 2)
    js, tensors = checkpoint.capture_rng()
    assert sorted(tensors) == ["torch_cpu", "torch_cuda_0", "torch_cuda_1"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        checkpoint.restore_rng(js, tensors)
    assert put == [[0, 1]]


def _adam_state(*shapes: tuple[int, ...], ids=None) -> dict:
    """An Adam-like saved state: one group, parameter i (or ``ids[i]``) with moments of ``shapes[i]``."""
    ids = list(range(len(shapes))) if ids is None else ids
    state = {
        i: {"step": torch.tensor(1.0), "exp_avg": torch.zeros(s), "exp_avg_sq": torch.zeros(s)}
        for i, s in zip(ids, shapes)
    }
    return {"param_groups": [{"params": ids}], "state": state}


def test_optimizer_state_of_a_transposed_parameter_is_refused():
    """A moment shaped (3, 2) for a (2, 3) weight (as many numbers, another shape) does not fit."""
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2, 3))])
    check_optimizer_state(opt, _adam_state((2, 3)))
    with pytest.raises(CheckpointError, match=r"the exp_avg of a parameter has shape \(3, 2\), not \(2, 3\)"):
        check_optimizer_state(opt, _adam_state((3, 2)))


def test_sgd_momentum_of_another_shape_is_refused():
    """SGD's momentum_buffer is a per-parameter state: one of another shape is refused."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(4))], lr=0.1, momentum=0.9)
    saved = {"param_groups": [{"params": [0]}], "state": {0: {"momentum_buffer": torch.zeros(5)}}}
    with pytest.raises(CheckpointError, match=r"the momentum_buffer of a parameter has shape \(5,\), not \(4,\)"):
        check_optimizer_state(opt, saved)


def test_groups_of_the_same_count_but_other_sizes_are_refused():
    """Two groups of 1 and 2 parameters saved, two of 2 and 1 built now: the groups do not match."""
    a, b, c = (torch.nn.Parameter(torch.zeros(2)) for _ in range(3))
    opt = torch.optim.SGD([{"params": [a, b]}, {"params": [c]}], lr=0.1)
    saved = {"param_groups": [{"params": [0]}, {"params": [1, 2]}], "state": {}}
    with pytest.raises(CheckpointError, match="its parameter groups do not match"):
        check_optimizer_state(opt, saved)


def test_a_file_without_an_optimizer_state_is_refused_in_one_line():
    """A dict without ``state`` (or ``param_groups``) is not an optimizer state: a CheckpointError, not a KeyError."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    for saved in ({"param_groups": [{"params": [0]}]}, {"state": {}}, [1]):
        with pytest.raises(CheckpointError, match="does not hold an optimizer state"):
            check_optimizer_state(opt, saved)


def test_a_sharded_models_state_is_matched_to_its_parameters_by_name():
    """Under FSDP2 the state names its parameters: each is checked against the parameter of that name, whatever the
    optimizer's order (here the reverse of the names')."""
    named = {"a.weight": torch.zeros(2, 3), "b.weight": torch.zeros(5)}
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(5)), torch.nn.Parameter(torch.zeros(2, 3))])
    check_optimizer_state(opt, _adam_state((2, 3), (5,), ids=["a.weight", "b.weight"]), named)
    with pytest.raises(CheckpointError, match=r"has shape \(5,\), not \(2, 3\)"):
        check_optimizer_state(opt, _adam_state((5,), (2, 3), ids=["a.weight", "b.weight"]), named)


def test_a_sharded_checkpoint_requires_its_shards_metadata_and_not_the_models_weights():
    """fsdp: sharded keeps the weights in dcp/: its manifest must list dcp/.metadata, and model/*.safetensors is not
    required; a whole checkpoint requires the weights and no shards."""
    whole, sharded = required_files(StubLM(), None), required_files(StubLM(), None, shards=True)
    assert "model/model.safetensors" in whole and "dcp/.metadata" not in whole
    assert "model/model.safetensors" not in sharded and {"model/config.json", "dcp/.metadata"} <= set(sharded)


def test_a_reference_model_of_another_shape_is_refused_before_anything_loads(tmp_path):
    """An extra model (the GRPO reference) whose saved weights have other shapes than the one built now is refused
    when the checkpoint is read (one line naming it), not when apply() has already loaded the policy."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    ckpt = save_checkpoint(
        tmp_path, 1, lm=StubReadLM(), optimizer=opt, state={}, extra_models={"ref": torch.nn.Linear(3, 2)}
    )
    read_checkpoint(ckpt, lm=StubReadLM(), optimizer=opt, extra_models={"ref": torch.nn.Linear(3, 2)})
    with pytest.raises(CheckpointError, match=r"^ref: wrong shapes: weight \(2, 3\) vs \(2, 4\)"):
        read_checkpoint(ckpt, lm=StubReadLM(), optimizer=opt, extra_models={"ref": torch.nn.Linear(4, 2)})


def test_a_state_file_holding_python_objects_is_refused_not_unpickled(tmp_path):
    """rng.pt holding a Python object other than tensors (its manifest rewritten to match, as a planted file's
    would be): refused in one line, without unpickling it (weights_only=True)."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    ckpt = save_checkpoint(tmp_path, 1, lm=StubReadLM(), optimizer=opt, state={})
    torch.save({"torch_cpu": Path("planted")}, ckpt / "rng.pt")
    (ckpt / "manifest.json").unlink()
    write_manifest(ckpt)
    with pytest.raises(CheckpointError, match=r"^a state file holds objects that cannot be loaded safely"):
        read_checkpoint(ckpt, lm=StubReadLM(), optimizer=opt)


@pytest.mark.parametrize(
    ("state", "said"),
    [
        ({"loop": {}, "step": 1, "rng": {}}, "state.json lacks trainer"),
        ({"trainer": {}, "loop": {}}, "state.json lacks step, rng"),
        ([1, 2], "state.json does not hold a JSON object"),
    ],
)
def test_a_state_file_without_what_the_resume_reads_is_refused_before_anything_loads(tmp_path, state, said):
    """state.json (its manifest rewritten to match) without a key the command's resume reads, or not an object: one
    line when the checkpoint is read, so that the previous one is tried (it was a KeyError's traceback once the
    weights were applied, or an AttributeError's line)."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    ckpt = save_checkpoint(tmp_path, 1, lm=StubReadLM(), optimizer=opt, state={"trainer": {}, "loop": {}})
    read_checkpoint(ckpt, lm=StubReadLM(), optimizer=opt, state_keys=("trainer", "loop"))
    (ckpt / "state.json").write_text(json.dumps(state))
    (ckpt / "manifest.json").unlink()
    write_manifest(ckpt)
    with pytest.raises(CheckpointError, match=f"^{said}$"):
        read_checkpoint(ckpt, lm=StubReadLM(), optimizer=opt, state_keys=("trainer", "loop"))


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        ("no-torch-state", r"rng.pt does not hold torch's CPU random state \(torch_cpu\)"),
        ("short-torch-state", r"a random state does not load \(RuntimeError: .*\)"),
        ("no-numpy-state", r"state.json: its rng lacks the Python or NumPy random state"),
        ("short-python-state", r"state.json: its rng's python does not hold the 625 integers of a Python random state"),
    ],
)
def test_random_states_that_do_not_load_are_refused_before_anything_loads(tmp_path, damage, said):
    """Random states (rng.pt, state.json's rng; the manifest rewritten to match) that restore_rng cannot put back: one
    line when the checkpoint is read, so that the previous one is tried (restore_rng raised a traceback after the
    weights were applied); the process's own random states are untouched by the check."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    ckpt = save_checkpoint(tmp_path, 1, lm=StubReadLM(), optimizer=opt, state={})
    state = json.loads((ckpt / "state.json").read_text())
    if damage == "no-torch-state":
        torch.save({"torch_cuda_0": torch.zeros(3, dtype=torch.uint8)}, ckpt / "rng.pt")
    elif damage == "short-torch-state":
        torch.save({"torch_cpu": torch.zeros(3, dtype=torch.uint8)}, ckpt / "rng.pt")
    elif damage == "no-numpy-state":
        del state["rng"]["numpy"]
    else:
        state["rng"]["python"] = [3, [1, 2], None]
    (ckpt / "state.json").write_text(json.dumps(state))
    (ckpt / "manifest.json").unlink()
    write_manifest(ckpt)
    before = torch.random.get_rng_state()
    with pytest.raises(CheckpointError, match=f"^{said}$"):
        read_checkpoint(ckpt, lm=StubReadLM(), optimizer=opt)
    assert torch.equal(torch.random.get_rng_state(), before)


def test_a_sharded_checkpoint_takes_the_staged_shards_and_the_optimizers_groups_and_no_weights(tmp_path):
    """fsdp: sharded: model/ is written without weights, the ranks' staged shards are moved in as dcp/ (their staging
    folder removed), optimizer.pt holds the groups the ranks prepared (not the local optimizer's), and the manifest
    lists what a sharded checkpoint requires."""
    from dgrpo.model.verified import verify
    from dgrpo.training.distributed import TrainingState

    staging = checkpoint.shard_staging(tmp_path, 3)
    (staging / "dcp").mkdir(parents=True)
    (staging / "dcp" / ".metadata").write_bytes(b"meta")
    lm, groups = StubLM(), {"param_groups": [{"params": ["w"], "lr": 0.5}]}
    held = TrainingState(optimizer=groups, shards=staging / "dcp")
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    ckpt = save_checkpoint(tmp_path, 3, lm=lm, optimizer=opt, state={}, fsdp_state=held)
    assert lm.weights == [False] and (ckpt / "dcp" / ".metadata").read_bytes() == b"meta" and not staging.exists()
    assert torch.load(ckpt / "optimizer.pt", weights_only=True) == groups
    assert verify(ckpt, required_files(lm, None, shards=True)) is None


@pytest.mark.parametrize(
    ("failure", "reason"),
    [
        (RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed"), "RuntimeError: Pytorch"),
        (PermissionError(13, "Permission denied"), "PermissionError: [Errno 13] Permission denied"),
    ],
    ids=["stream-writer", "permission"],
)
def test_a_failed_checkpoint_write_is_one_line_giving_its_own_reason(tmp_path, monkeypatch, failure, reason):
    """torch.save's "PytorchStreamWriter failed writing file" is a failed write (a one-line CheckpointError, not a
    traceback); an OSError other than ENOSPC is named as itself, not as a full disk."""
    monkeypatch.setattr(checkpoint.torch, "save", lambda *a, **k: (_ for _ in ()).throw(failure))
    with pytest.raises(CheckpointError, match="^could not write checkpoint ") as e:
        _save(tmp_path, 1)
    assert f"({reason}" in str(e.value) and "no space left" not in str(e.value)
