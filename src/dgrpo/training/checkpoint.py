"""Atomic, verifiable training checkpoints and everything a resumed run needs to continue bit-exactly.

A checkpoint is a directory ``OUT/checkpoints/step-00000123/`` holding:
  ``model/``            the policy, ``save_pretrained`` (safetensors, tokenizer, latent_config.json; under LoRA the
                        adapter in PEFT's format)
  ``<name>.safetensors`` extra models' weights (the GRPO reference model, or under LoRA the reference adapter)
  ``optimizer.pt``      optimizer state (tensors and numbers only: loaded with ``weights_only=True``)
  ``dcp/``              under ``fsdp: sharded`` only: every rank's shards of the weights and of the optimizer's
                        tensors (torch.distributed.checkpoint; ``model/`` then has no weights, ``optimizer.pt`` only
                        the parameter groups)
  ``rng.pt``            torch CPU/CUDA generator states (tensors, ``weights_only=True``)
  ``state.json``        counters, Python/NumPy RNG states, EMA baseline, best record, data position ...
  ``manifest.json``     sha256 of every file above, written last
It is written to a hidden ``.tmp-step-...`` directory and renamed into place, so a kill mid-write leaves no
directory that looks complete. Resuming reads the newest checkpoint whole into memory and checks it (manifest,
every required file listed, exact tensor names and shapes, optimizer state shapes, the keys and values of the
``state.json`` sections the command reads, finite weights and optimizer moments, float32 masters that round to
their weights: not those of an FSDP ``sharded`` checkpoint, whose shards are read as they are applied) before
anything is applied; any problem is reported in one line and the previous checkpoint is tried. Nothing is ever
unpickled.
"""

from __future__ import annotations

import errno
import json
import math
import os
import pickle
import random
import re
import shutil
import types
import typing
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as tdist
from safetensors.torch import save_file, save_model

from ..config import ConfigError
from ..model.verified import (
    MANIFEST,
    RESUMABLE_STATE,
    SAFETENSORS,
    SHARDED_DIR,
    CheckpointError,
    atomic_dir,
    check_state_dict,
    one_line,
    remove_dir,
    verify,
    write_text_atomically,
)
from ..run_layout import BEST_DIR, CHECKPOINTS_DIR, FINAL_DIR, STEP_DIR, checkpoint_dirs, stage_dirs, step_dir_name
from .distributed import TrainingState
from .master_weights import LOW_PRECISION, MasterWeightAdamW
from .wording import in_command_line, init_named, setting_named

#: torch optimizers' per-parameter state tensors, shaped like their parameter (8-bit optimizers keep others), and
#: MasterWeightAdamW's float32 copy of the weight
PER_PARAMETER_STATE = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer", "master")


def capture_rng() -> tuple[dict, dict[str, torch.Tensor]]:
    """(JSON-able Python/NumPy states, tensor states of torch's generators)."""
    py = random.getstate()
    np_state: Any = np.random.get_state()
    js: dict[str, list] = {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
    }
    tensors = {"torch_cpu": torch.random.get_rng_state()}
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"torch_cuda_{i}"] = s
    return js, tensors


def restore_rng(js: dict, tensors: dict[str, torch.Tensor]) -> None:
    """Put back the states :func:`capture_rng` took: each CUDA device's its own (``torch_cuda_<i>`` by the number
    ``i``, not by the name: ``torch_cuda_10`` sorts before ``torch_cuda_2``). The states of devices this process does
    not see (a checkpoint written with more visible GPUs) are left out, with a warning (torch raised on them, after
    the weights had loaded)."""
    python, numpy_state, torch_cpu = _cpu_rng_states(js, tensors)
    random.setstate(python)
    np.random.set_state(numpy_state)
    torch.random.set_rng_state(torch_cpu)
    if torch.cuda.is_available():
        cuda = [k for k in tensors if k.startswith("torch_cuda_")]
        states = [tensors[k] for k in sorted(cuda, key=lambda k: int(k.removeprefix("torch_cuda_")))]
        seen = torch.cuda.device_count()
        if len(states) > seen:
            warnings.warn(
                f"the checkpoint holds the CUDA random states of {len(states)} devices and this process sees {seen}: "
                f"those of devices {seen} to {len(states) - 1} are not restored (draws on them differ from the run's)",
                stacklevel=3,
            )
        if states[:seen]:
            torch.cuda.set_rng_state_all(states[:seen])


def _cpu_rng_states(js: dict, tensors: dict[str, torch.Tensor]) -> tuple[tuple, tuple, torch.Tensor]:
    """The Python, NumPy and torch CPU random states :func:`capture_rng` took (``state.json``'s ``rng``, ``rng.pt``),
    as their setters take them."""
    return python_random_state(js["python"]), numpy_random_state(js["numpy"]), tensors["torch_cpu"]


def numpy_random_state(value: Any) -> tuple:
    """NumPy's global generator state (``np.random.get_state()``) from the JSON ``state.json``'s ``rng.numpy`` keeps
    it as (``["MT19937", [624 words], position, has_gauss, cached_gauss]``). ValueError saying what else it is:
    ``np.random.set_state`` takes a position past the 624 words without a word, and the generator then reads memory
    past them."""
    if not isinstance(value, list) or len(value) != 5:
        raise ValueError("is not [name, state, position, has_gauss, gauss] (a NumPy random state)")
    name, words, pos, has_gauss, cached = value
    if name != "MT19937":
        raise ValueError(f"names the generator {json.dumps(name)[:20]}, not MT19937 (a NumPy random state)")
    if not isinstance(words, list) or len(words) != 624 or any(type(w) is not int or not 0 <= w < 2**32 for w in words):
        raise ValueError("does not hold the 624 32-bit integers of a NumPy random state")
    if stuck_generator(words):
        raise ValueError(STUCK)
    if type(pos) is not int or not 0 <= pos <= 624 or has_gauss not in (0, 1) or type(has_gauss) is not int:
        raise ValueError(
            f"has the position {json.dumps(pos)[:20]} and has_gauss {json.dumps(has_gauss)[:20]}, not "
            "0 to 624 and 0 or 1 (a NumPy random state)"
        )
    if not isinstance(cached, (int, float)) or isinstance(cached, bool) or not math.isfinite(cached):
        raise ValueError(f"has the gauss {json.dumps(cached)[:20]}, not a finite number (a NumPy random state)")
    return name, np.array(words, dtype=np.uint32), pos, has_gauss, float(cached)


#: what :func:`python_random_state` and :func:`numpy_random_state` say of a state :func:`stuck_generator` finds
STUCK = "holds an all-zero Mersenne Twister state (a generator that draws 0 forever, which no seeding makes)"


def stuck_generator(words: list[int]) -> bool:
    """Whether the 624 words of a Mersenne Twister state are all zero, but for the lowest 31 bits of the first, which
    the generator never reads: it then draws 0 forever. Seeding never makes it (Python's and NumPy's set the first
    word's top bit); ``random.setstate`` and ``np.random.set_state`` take it without a word."""
    return not words[0] & 0x80000000 and not any(words[1:])


def python_random_state(value: Any) -> tuple:
    """A Python generator's state (``random.Random.getstate()``) from the JSON a checkpoint keeps it as
    (``[version, [624 words and the position], gauss]``: ``state.json``'s ``rng.python``, the GRPO trainer's
    ``data_rng``). ValueError saying what else it is: ``random.setstate`` takes some damaged states without a word
    (a word past 32 bits, a gauss that is no number: a generator that no run had) and refuses others with a
    traceback."""
    if not isinstance(value, list) or len(value) != 3:
        raise ValueError("is not [version, state, gauss] (a Python random state)")
    version, words, gauss = value
    if type(version) is not int or version != 3:
        raise ValueError(f"has version {json.dumps(version)[:20]}, not 3 (a Python random state)")
    if not isinstance(words, list) or len(words) != 625 or any(type(w) is not int for w in words):
        raise ValueError("does not hold the 625 integers of a Python random state")
    if any(not 0 <= w < 2**32 for w in words[:624]) or not 0 <= words[624] <= 624:
        raise ValueError("holds an integer out of a Python random state's range")
    if stuck_generator(words[:624]):
        raise ValueError(STUCK)
    if gauss is not None and not (isinstance(gauss, float) and math.isfinite(gauss)):
        raise ValueError(f"has the gauss {json.dumps(gauss)[:20]}, not a finite number or null")
    return version, tuple(words), gauss


def save_checkpoint(
    out_dir: Path,
    step: int,
    *,
    lm,
    optimizer: torch.optim.Optimizer,
    state: dict[str, Any],
    extra_models: dict[str, Any] | None = None,
    keep_last: int = 2,
    fsdp_state: TrainingState | None = None,
) -> Path:
    """Write ``checkpoints/step-<step>`` atomically (:func:`~dgrpo.model.verified.atomic_dir`: temporary directory,
    manifest, rename) and prune to the ``keep_last`` newest. ``fsdp_state``: what the ranks of a sharded (FSDP2)
    model prepared (:meth:`~dgrpo.training.distributed.Dist.training_state`), in place of the model's and the
    optimizer's own state: the whole state dicts, or the shards (moved in as ``dcp/``; ``model/`` then holds the
    config and the tokenizer, ``optimizer.pt`` the parameter groups)."""
    root = Path(out_dir) / CHECKPOINTS_DIR
    final = root / step_dir_name(step)
    try:
        _write_checkpoint(final, step, lm, optimizer, state, extra_models, fsdp_state or TrainingState())
    except (CheckpointError, ConfigError):
        raise
    except (OSError, RuntimeError) as e:
        if not isinstance(e, OSError) and not _a_failed_write(e):
            raise  # (an error of the model or the device, not of the disk: its traceback)
        earlier = list_checkpoints(out_dir)
        after = f"the run resumes from {earlier[-1]}" if earlier else "no earlier checkpoint: the run starts again"
        raise write_failed(f"checkpoint {final}", root, e, f"its temporary folder is removed; {after}") from None
    for old in list_checkpoints(out_dir)[:-keep_last] if keep_last > 0 else []:
        _prune(old)
    return final


def _prune(old: Path) -> None:
    """Remove a checkpoint past ``keep_last``, renamed first (:func:`~dgrpo.model.verified.remove_dir`), so that a stop
    during its deletion leaves a leftover that a run's start removes, not a half checkpoint under its step's name (still
    listed, and resumed from); one that cannot be renamed is left, as one that could not be deleted was."""
    try:
        remove_dir(old)
    except OSError:
        pass


def _write_checkpoint(
    final: Path,
    step: int,
    lm,
    optimizer: torch.optim.Optimizer,
    state: dict[str, Any],
    extra_models: dict[str, Any] | None,
    held: TrainingState,
) -> None:
    """The files of :func:`save_checkpoint`, written into a temporary folder published as ``final`` (removed when a
    write fails)."""
    with atomic_dir(final) as tmp:
        lm.save_pretrained(tmp / "model", state_dict=held.model, weights=held.shards is None)
        if held.shards is not None:
            os.replace(held.shards, tmp / SHARDED_DIR)
            shutil.rmtree(held.shards.parent, ignore_errors=True)
        for name, model in (extra_models or {}).items():
            if isinstance(model, torch.nn.Module):
                save_model(model, str(tmp / f"{name}.safetensors"))  # handles tied (shared) tensors
            else:  # a state holder (the LoRA reference adapter)
                save_file(model.state_dict(), str(tmp / f"{name}.safetensors"))
        torch.save(optimizer.state_dict() if held.optimizer is None else held.optimizer, tmp / "optimizer.pt")
        rng_js, rng_t = capture_rng()
        torch.save(rng_t, tmp / "rng.pt")
        if os.environ.get("DGRPO_TEST_CRASH_IN_CHECKPOINT") == str(step):  # test hook: die mid-write
            os.kill(os.getpid(), 9)
        world = tdist.get_world_size() if tdist.is_available() and tdist.is_initialized() else 1
        kind = optimizer_kind(optimizer)
        state = {**state, "step": step, "rng": rng_js, "world_size": world, "optimizer_kind": kind}
        (tmp / RESUMABLE_STATE).write_text(json.dumps(state))


def _a_failed_write(e: RuntimeError) -> bool:
    """torch.save's zip writer failing to write (a full disk: "[enforce fail at inline_container.cc:...] unexpected
    pos ..."; "PytorchStreamWriter failed writing file ...")."""
    text = str(e)
    return "inline_container" in text or "PytorchStreamWriter" in text or "unexpected pos" in text


def write_failed(what: str, where: Path, e: BaseException, after: str) -> CheckpointError:
    """One line for a write that failed (most often a full disk: ``errno`` ENOSPC, or torch.save's RuntimeError),
    naming ``what`` was being written, the space left on ``where``'s file system, and ``after`` (what happens now)."""
    place = where
    while not place.exists() and place != place.parent:
        place = place.parent
    try:
        free = f"{shutil.disk_usage(place).free / 2**20:.1f} MiB free on {place}"
    except OSError:
        free = f"the space left on {place} unknown"
    full = isinstance(e, OSError) and e.errno == errno.ENOSPC
    reason = "no space left on the device" if full else one_line(e)
    return CheckpointError(f"could not write {what} ({reason}; {free}): {after}")


def shard_staging(out_dir: Path, step: int) -> Path:
    """Where the ranks of an ``fsdp: sharded`` run write a resumable checkpoint's shards before rank 0 moves them into
    it (the same path on every rank; a hidden sibling of the checkpoint, not one by its name; a killed write's is
    removed when the run starts again, with the other ``.tmp-*`` folders: :class:`~dgrpo.training.run.RunDir`)."""
    return Path(out_dir) / CHECKPOINTS_DIR / f".tmp-{step_dir_name(step)}-shards"


def list_checkpoints(out_dir: Path) -> list[Path]:
    """The run's checkpoint directories, oldest first by step: those named as the trainers name them (``step-N``);
    temporary and half-written ones, and a folder of another name (a user's ``step-00000012-copy``, which rotation
    would otherwise delete and resume would take for the newest), are not checkpoints of the run."""
    return checkpoint_dirs(out_dir)


#: the names of the folders a run leaves in ``OUT/checkpoints``: its checkpoints (``step-N``), what a killed write,
#: replace or removal left (``.tmp-step-N-PID``, ``.tmp-step-N-shards``, ``.old-step-N-PID``), a skipped checkpoint
#: moved aside (``damaged-step-N``, ``damaged-step-N-2``), and a user's copy named after its step
#: (``step-00000012-copy``: ``--resume`` may rewind to it)
RUN_ENTRY = re.compile(rf"(?:damaged-|\.tmp-|\.old-)?{STEP_DIR.pattern}.*")


def foreign_entries(out_dir: Path) -> list[str]:
    """The names in ``OUT/checkpoints`` of what no run left there, which ``--resume never`` would delete with the
    run's checkpoints: a file, or a folder neither named as a run names its own (:data:`RUN_ENTRY`) nor holding a
    checkpoint's ``state.json`` (a user's copy of one, whatever its name, which ``--resume`` may name): ``notes/``,
    ``old-step-x/`` holding notes."""
    root = Path(out_dir) / CHECKPOINTS_DIR
    if not root.is_dir():
        return []
    return sorted(
        p.name
        for p in root.iterdir()
        if not (p.is_dir() and (RUN_ENTRY.fullmatch(p.name) or (p / RESUMABLE_STATE).is_file()))
    )


def required_files(lm, extra_models: dict[str, Any] | None, shards: bool = False) -> tuple[str, ...]:
    """What a resumable checkpoint must hold (its manifest must list each of these); ``shards``: one written under
    ``fsdp: sharded`` (the weights and the optimizer's tensors in ``dcp/``)."""
    model = tuple(f"model/{f}" for f in lm.checkpoint_files if not (shards and SAFETENSORS in f))
    state = (f"{SHARDED_DIR}/.metadata",) if shards else ()
    extra = tuple(f"{n}.safetensors" for n in extra_models or {})
    return (*model, *state, "optimizer.pt", "rng.pt", RESUMABLE_STATE, *extra)


@dataclass
class LoadedCheckpoint:
    """A checkpoint read and checked in memory (nothing applied yet): ``apply()`` puts it in place."""

    path: Path
    state: dict[str, Any]
    weights: dict[str, torch.Tensor]
    extra_weights: dict[str, dict[str, torch.Tensor]]
    optimizer_state: dict[str, Any]
    rng: dict[str, torch.Tensor]
    shards: Path | None = None  # written under fsdp: sharded: the weights and the optimizer's tensors (dcp/)
    base: str | None = None  # under LoRA, the local base the adapter is on now (its weights the checkpoint's base's)

    def apply(
        self, lm, optimizer: torch.optim.Optimizer, extra_models: dict[str, Any] | None = None, dist: Any = None
    ) -> dict:
        """Load everything into the model, the extra models and the optimizer; restore the RNGs; return the state
        (state.json's content). Under FSDP2 (``dist.fsdp``) every rank calls it, and keeps its shards. The
        optimizer keeps its own hyperparameters (its parameter groups' betas, weight decay, eps ...: the run's
        config), not the saved ones that torch's loading puts in their place: a resume allowed to change
        ``grpo.weight_decay`` or ``sft.adam_betas`` stepped with the checkpoint's values, the config saying others."""
        hyper = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
        if self.shards is not None:
            from torch.distributed.checkpoint.api import CheckpointException  # (a BaseException)

            try:
                dist.load_training_shards(lm.model, optimizer, self.shards, self.optimizer_state["param_groups"])
            except (Exception, CheckpointException) as e:  # noqa: BLE001 - one line naming the checkpoint
                cause: BaseException = e
                if isinstance(e, CheckpointException) and e.failures:  # (the first rank's failure)
                    cause = next(iter(e.failures.values()))[0]
                raise CheckpointError(f"{self.path}: its shards do not load ({one_line(cause)})") from None
        elif dist is not None and dist.fsdp:
            dist.load_training_state(lm.model, optimizer, self.weights, self.optimizer_state)
        else:
            lm.load_weights(self.weights)  # complete: checked by read_checkpoint
            optimizer.load_state_dict(self.optimizer_state)
        for group, own in zip(optimizer.param_groups, hyper):
            group.update(own)
        for name, model in (extra_models or {}).items():
            model.load_state_dict(self.extra_weights[name], strict=False)
        restore_rng(self.state["rng"], self.rng)
        return self.state


def read_checkpoint(
    ckpt: Path,
    *,
    lm,
    optimizer: torch.optim.Optimizer,
    extra_models: dict[str, Any] | None = None,
    sharded: bool = False,
    state_keys: tuple[str, ...] = (),
    sections: dict[str, StateSection] | None = None,
) -> LoadedCheckpoint:
    """Verify a checkpoint (manifest, every required file) and read all of it into memory, checking that it fits:
    the weights are exactly the model's tensors with their shapes, the optimizer state matches the optimizer's
    parameters (``sharded``: an FSDP2 model's, whose checkpoints name them), ``state.json`` is an object holding
    :data:`STATE_KEYS`, the command's ``state_keys`` and its ``sections`` (each an object of the keys and values its
    :class:`StateSection` allows). Raises CheckpointError (one line) on any problem; mutates nothing."""
    shards = ckpt / SHARDED_DIR if (ckpt / SHARDED_DIR).is_dir() else None  # (fsdp: sharded wrote it)
    problem = verify(ckpt, required_files(lm, extra_models, shards is not None))
    if problem is not None:
        raise CheckpointError(problem)
    check_same_hub_base(ckpt, lm)
    check_same_adapter(ckpt, lm)
    check_same_local_base(ckpt, lm)
    try:
        state = json.loads((ckpt / RESUMABLE_STATE).read_text())
        _check_state_keys(state, (*STATE_KEYS, *state_keys, *(sections or {})))
        for name, section in (sections or {}).items():
            section.check(name, state[name])
        check_same_optimizer(ckpt, state, optimizer)
        weights = lm.read_weights_dir(ckpt / "model") if shards is None else {}  # (shards: read as they load)
        if shards is not None:  # their names and shapes, from the metadata: a wrong model is refused here, whole
            check_state_dict(lm.model, shard_shapes(shards, "model"), "model")
        extra = {}
        for name, model in (extra_models or {}).items():
            extra[name] = read_weights_file(ckpt / f"{name}.safetensors")
            check_state_dict(model, extra[name], name)
        opt_state = torch.load(ckpt / "optimizer.pt", weights_only=True, map_location=lm.device)
        check_same_sharding(ckpt, opt_state, sharded)
        check_optimizer_state(optimizer, opt_state, dict(lm.model.named_parameters()) if sharded else None)
        if weights and lm.peft is None:  # (an adapter's weights are named as PEFT saves them, not as the model's)
            _check_masters(opt_state, _state_names(optimizer, lm.model, opt_state, sharded), weights)
        if isinstance(optimizer, MasterWeightAdamW) or any(
            isinstance(s, dict) and "master" in s for s in opt_state["state"].values()
        ):
            _masters_across_dtypes(opt_state, optimizer, lm.model, sharded, weights if lm.peft is None else {})
        rng = torch.load(ckpt / "rng.pt", weights_only=True)
        _check_rng(state["rng"], rng)
        _check_finite(_parameters(weights, lm.model if weights and lm.peft is None else None), "model/")
        for name, model in (extra_models or {}).items():
            _check_finite(_parameters(extra[name], model), f"{name}.safetensors")
        _check_finite(_optimizer_tensors(opt_state), "optimizer.pt")
    except (CheckpointError, ConfigError):
        raise
    except pickle.UnpicklingError:
        raise CheckpointError("a state file holds objects that cannot be loaded safely (weights_only=True)") from None
    except Exception as e:  # noqa: BLE001 - truncated files, bad JSON, ...: each one line
        raise CheckpointError(one_line(e)) from None
    return LoadedCheckpoint(ckpt, state, weights, extra, opt_state, rng, shards, _local_base(lm))


def _state_names(
    optimizer: torch.optim.Optimizer, model: torch.nn.Module, opt_state: dict[str, Any], sharded: bool
) -> dict[Any, str]:
    """The parameter name of each key of an optimizer state's ``state`` (a number, in the optimizer's parameter
    order; under FSDP2 the name itself)."""
    if sharded:
        return {k: k for k in opt_state["state"] if isinstance(k, str)}
    names = {id(p): n for n, p in model.named_parameters()}
    return {i: names.get(id(p), "") for i, p in _state_params(optimizer, model, opt_state, sharded).items()}


def _state_params(
    optimizer: torch.optim.Optimizer, model: torch.nn.Module, opt_state: dict[str, Any], sharded: bool
) -> dict[Any, torch.Tensor]:
    """The parameter each key of an optimizer state's ``state`` belongs to (a number, in the optimizer's parameter
    order; under FSDP2 its name)."""
    if sharded:
        params = dict(model.named_parameters())
        return {k: params[k] for k in opt_state["state"] if k in params}
    ids = [i for g in opt_state["param_groups"] for i in g.get("params", [])]
    return dict(zip(ids, (p for g in optimizer.param_groups for p in g["params"])))


def _masters_across_dtypes(
    opt_state: dict[str, Any],
    optimizer: torch.optim.Optimizer,
    model: torch.nn.Module,
    sharded: bool,
    weights: dict[str, torch.Tensor],
) -> None:
    """Fit ``opt_state``'s float32 masters (``model.master_weights``) and ``weights`` (both read, not applied; the
    masters checked against their weights) to the parameters' dtypes now, across a change of ``model.dtype``
    (allow_config_change):

    - a parameter float32 now whose weight was saved low-precision beside its master: the master is the weight
      loaded, exactly (the saved bf16 weight is only its rounding: the float32 run went on from the rounding, the
      precision the masters kept thrown away), and it is removed from the state (float32 weights step themselves);
    - any other master of a parameter not low-precision now is removed (one whose weight this checkpoint does not
      hold whole: FSDP ``sharded`` shards, a LoRA adapter);
    - a parameter low-precision now whose weight was saved in float32 (a float32 run, or a bf16 run resumed in
      float32): under :class:`~.master_weights.MasterWeightAdamW` its master is that float32 weight, exactly (none
      was made from the weight rounded at the first step; a master left stale beside it, kept by a float32 resume
      before masters were removed, stepped the weights back to where the bf16 run had left them).
    """
    params = _state_params(optimizer, model, opt_state, sharded)
    names = _state_names(optimizer, model, opt_state, sharded)
    makes_masters = isinstance(optimizer, MasterWeightAdamW)
    for i, p in params.items():
        per_param, name = opt_state["state"].get(i), names.get(i, "")
        saved = weights.get(name)
        if p.dtype not in LOW_PRECISION:
            if not isinstance(per_param, dict):
                continue
            master = per_param.pop("master", None)
            if isinstance(master, torch.Tensor) and saved is not None and saved.dtype in LOW_PRECISION:
                weights[name] = master.to(device=saved.device)
        elif saved is not None and saved.dtype not in LOW_PRECISION:
            if makes_masters and (isinstance(per_param, dict) or (per_param is None and not sharded)):
                per_param = opt_state["state"].setdefault(i, {})  # (none: a parameter the run never stepped)
                per_param["master"] = saved.to(torch.float32, copy=True)  # (put on its parameter's device as loaded)
            elif isinstance(per_param, dict):
                per_param.pop("master", None)


def _check_masters(opt_state: dict[str, Any], names: dict[Any, str], weights: dict[str, torch.Tensor]) -> None:
    """A CheckpointError when a float32 master (``model.master_weights``: :class:`~.master_weights.MasterWeightAdamW`)
    is not the saved low-precision weight it belongs to: each step rounds the master into the weight, so an honest
    master rounds, to the weight's dtype, to the weight exactly. A master that does not (all zeros, another
    checkpoint's, not float32) passed every check, and the first step of the resumed run put it in the weight's
    place (a model of zeros, without a word). Weights this checkpoint does not hold as a whole (FSDP2 shards, a LoRA
    adapter) are not compared."""
    for i, per_param in opt_state["state"].items():
        master, name = per_param.get("master"), names.get(i, "")
        weight = weights.get(name)
        if not isinstance(master, torch.Tensor) or weight is None or weight.dtype not in LOW_PRECISION:
            continue
        if master.dtype != torch.float32:
            raise CheckpointError(f"optimizer.pt: the master of {name} is {master.dtype}, not float32")
        differ = int((master.to(weight.dtype) != weight.to(master.device)).sum())
        if differ:
            raise CheckpointError(
                f"optimizer.pt: the float32 master of {name} is not that weight ({differ} of its {weight.numel()} "
                f"values round to other {weight.dtype} values than model/'s): the first step would put it in the "
                "weight's place"
            )


def _parameters(state: dict[str, torch.Tensor], model: Any) -> dict[str, torch.Tensor]:
    """``state``'s tensors that are ``model``'s parameters (not its buffers: a model may keep an infinite mask), or
    all of them when ``model`` is not a module (a LoRA adapter's state: its parameters alone)."""
    if not isinstance(model, torch.nn.Module) or not state:
        return state
    names = {n for n, _ in model.named_parameters(remove_duplicate=False)}
    return {k: t for k, t in state.items() if k in names}


def _optimizer_tensors(opt_state: dict[str, Any]) -> dict[str, torch.Tensor]:
    """An optimizer state's per-parameter tensors, each named as a line names it (``the exp_avg of parameter 3``)."""
    return {
        f"the {name} of parameter {i}": value
        for i, per_param in opt_state["state"].items()
        for name, value in per_param.items()
        if isinstance(value, torch.Tensor)
    }


def _check_finite(tensors: dict[str, torch.Tensor], where: str) -> None:
    """A CheckpointError naming the first floating tensor of ``tensors`` that holds a NaN or an infinity: a checkpoint
    whose manifest is consistent and whose weights or optimizer moments are not finite (written so by a tool, another
    version, edited; a run's own steps never save one: its guards stop first) resumed without a word, every step then
    non-finite, or the NaN went on into final/. One pass over the tensors: their norms, all at once (a NaN or an
    infinity makes a norm non-finite), and then, element by element, only a tensor whose norm is not finite (a norm
    past its dtype's range is no damage)."""
    floating = [(k, t) for k, t in tensors.items() if t.is_floating_point() and t.numel()]
    by_device: dict[torch.device, list[tuple[str, torch.Tensor]]] = {}
    for k, t in floating:
        by_device.setdefault(t.device, []).append((k, t))
    for named in by_device.values():
        norms = torch.stack(torch._foreach_norm([t for _, t in named], 2.0))  # (in their dtype: a float32 copy was 10x)
        if bool(torch.isfinite(norms).all()):
            continue
        for (k, t), norm in zip(named, norms.tolist()):
            if not math.isfinite(norm) and not bool(torch.isfinite(t).all()):
                raise CheckpointError(f"{where}: {k} holds NaN or infinite values")


#: what save_checkpoint adds to every checkpoint's ``state.json`` (a command's own keys: ``state_keys``)
STATE_KEYS = ("step", "rng")


#: the JSON types a section's value may take, by the Python type a field is annotated with (a JSON ``0`` reads as an
#: int: a float field takes it; ``true`` is no number)
_JSON_TYPES: dict[Any, tuple[type, ...]] = {int: (int,), float: (int, float), bool: (bool,), str: (str,)}


@dataclass(frozen=True)
class StateSection:
    """A section of ``state.json`` that a command's resume reads once the weights are applied (GRPO's ``trainer`` and
    ``loop``, SFT's ``progress``), checked when the checkpoint is read: an object holding ``required`` and no key
    outside ``required`` and ``optional`` (each a key's allowed types; ``type(None)`` among them: null allowed). A
    hand-edited section, or another dgrpo's (a key this one does not read), was a KeyError's or a TypeError's
    traceback after the weights were applied, or, a key missing with a default, a resume from the wrong place
    without a word; it is now a damaged checkpoint's line, and the previous checkpoint is tried. ``contents``: what
    is wrong with the values of a section whose keys and types pass (a negative count, an index of no training row, a
    random state that does not load), as a phrase starting with the key; None when nothing is."""

    required: dict[str, tuple[type, ...]]
    optional: dict[str, tuple[type, ...]] = field(default_factory=dict)
    contents: Callable[[dict[str, Any]], str | None] | None = None

    @classmethod
    def of(
        cls,
        record: type,
        required: tuple[str, ...],
        contents: Callable[[dict[str, Any]], str | None] | None = None,
    ) -> StateSection:
        """The section a dataclass is saved as (``asdict``) and built from (``record(**section)``): its fields, each
        with the JSON types of its annotation (``int | None``: a number or null); ``required``: the fields every
        dgrpo has written (the others take their defaults)."""
        hints = typing.get_type_hints(record)
        allowed = {f.name: _json_types(hints[f.name]) for f in fields(record)}
        return cls(
            {k: v for k, v in allowed.items() if k in required},
            {k: v for k, v in allowed.items() if k not in required},
            contents,
        )

    def check(self, name: str, section: Any) -> None:
        """A CheckpointError naming the section ``name`` of ``state.json`` when ``section`` is not what it allows."""
        where = f"{RESUMABLE_STATE}: its {name}"
        if not isinstance(section, dict):
            raise CheckpointError(f"{where} is not a JSON object")
        if missing := [k for k in self.required if k not in section]:
            raise CheckpointError(f"{where} lacks {', '.join(missing)}")
        allowed = {**self.required, **self.optional}
        if unknown := sorted(k for k in section if k not in allowed):
            raise CheckpointError(
                f"{where} holds {', '.join(map(str, unknown))}, which this dgrpo does not read (written by another "
                "version, or edited)"
            )
        self.check_values(where, section)

    def check_values(self, where: str, section: dict[str, Any]) -> None:
        """A CheckpointError when a value of ``section`` (each of its keys one this section allows) is not of a type
        it allows, or not what :attr:`contents` takes; ``where``: the section, as the line names it."""
        allowed = {**self.required, **self.optional}
        for key, value in section.items():
            kinds = allowed[key]
            if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
                want = " or ".join("null" if t is type(None) else t.__name__ for t in kinds)
                raise CheckpointError(f"{where}'s {key} is {json.dumps(value)[:40]}, not {want}")
            if isinstance(value, float) and not math.isfinite(value):  # (Python's json reads NaN and Infinity)
                raise CheckpointError(f"{where}'s {key} is {value}, not a finite number")
        if self.contents is not None and (problem := self.contents(section)) is not None:
            raise CheckpointError(f"{where}'s {problem}")


def counts(*keys: str) -> Callable[[dict[str, Any]], str | None]:
    """A section's :attr:`StateSection.contents` check that each of ``keys`` (an integer, or null) present is not
    negative: the counters, steps and positions a run saves (a negative one, edited, was taken as it was: an epoch
    trained twice, an extra step, a batch counted from the end)."""

    def problem(section: dict[str, Any]) -> str | None:
        for key in keys:
            value = section.get(key)
            if isinstance(value, int) and value < 0:
                return f"{key} is {value}, not a count (0 or more)"
        return None

    return problem


#: the keys a resume reads at the top of ``state.json`` beside the sections (save_checkpoint's, the run's, SFT's),
#: checked when present (a command requires its own: ``state_keys``): a string where a count was read was a
#: TypeError's traceback once the weights were applied (the metrics cut to ``metrics_lines`` rows, SFT's clock
#: from ``time_s``), or at the first skipped step (``nonfinite_skips``)
TOP_LEVEL = StateSection(
    {},
    {k: (int,) for k in ("step", "world_size", "metrics_lines", "nonfinite_skips")}
    | {"time_s": (int, float), "train_data": (str,), "optimizer_kind": (str,), "best": (str, type(None))},
    counts("step", "world_size", "metrics_lines", "nonfinite_skips"),
)


def _json_types(hint: Any) -> tuple[type, ...]:
    """The JSON types of a field annotated ``hint`` (``int``, ``float``, ``bool``, ``str``, ``list[...]``,
    ``dict[...]``, or one of them ``| None``): a parameterized container is checked as its container (isinstance
    takes no ``list[int]``: a TypeError that skipped every checkpoint as damaged)."""
    parts = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    return tuple(t for part in parts for t in (_JSON_TYPES.get(part) or (typing.get_origin(part) or part,)))


def _check_state_keys(state: Any, keys: tuple[str, ...]) -> None:
    """A CheckpointError when ``state`` (``state.json``'s content) is not an object holding ``keys``: a resume read
    them after the weights were applied, a traceback instead of the fall back to the previous checkpoint."""
    if not isinstance(state, dict):
        raise CheckpointError(f"{RESUMABLE_STATE} does not hold a JSON object")
    missing = [k for k in keys if k not in state]
    if missing:
        raise CheckpointError(f"{RESUMABLE_STATE} lacks {', '.join(missing)}")
    TOP_LEVEL.check_values(RESUMABLE_STATE, {k: v for k, v in state.items() if k in TOP_LEVEL.optional})


def _check_rng(js: Any, tensors: Any) -> None:
    """A CheckpointError when the random states (``state.json``'s ``rng``, ``rng.pt``) are not what
    :func:`restore_rng` puts back, tried on generators of their own (the global ones untouched; the CUDA states of
    the devices this process sees, each on a generator of its device): it ran after the weights were applied, a
    traceback instead of the fall back to the previous checkpoint."""
    if not isinstance(js, dict) or any(k not in js for k in ("python", "numpy")):
        raise CheckpointError(f"{RESUMABLE_STATE}: its rng lacks the Python or NumPy random state")
    if not isinstance(tensors, dict) or not isinstance(tensors.get("torch_cpu"), torch.Tensor):
        raise CheckpointError("rng.pt does not hold torch's CPU random state (torch_cpu)")
    states = {}
    for name, read in (("python", python_random_state), ("numpy", numpy_random_state)):
        try:
            states[name] = read(js[name])
        except ValueError as e:
            raise CheckpointError(f"{RESUMABLE_STATE}: its rng's {name} {e}") from None
    cuda = {k: t for k, t in tensors.items() if str(k).startswith("torch_cuda_")}
    for k, t in cuda.items():
        if not k.removeprefix("torch_cuda_").isdigit() or not isinstance(t, torch.Tensor) or t.dtype != torch.uint8:
            raise CheckpointError(f"rng.pt: its {k} is not a CUDA device's random state (bytes, torch_cuda_<number>)")
    try:
        random.Random().setstate(states["python"])
        np.random.RandomState().set_state(states["numpy"])
        torch.Generator().set_state(tensors["torch_cpu"])
        seen = torch.cuda.device_count() if torch.cuda.is_available() else 0
        for k, t in cuda.items():  # (those of the devices restore_rng puts back: a state of the wrong size, say)
            if (i := int(k.removeprefix("torch_cuda_"))) < seen:
                torch.Generator(device=f"cuda:{i}").set_state(t)
    except (TypeError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"a random state does not load ({one_line(e)})") from None


def optimizer_kind(optimizer: torch.optim.Optimizer) -> str:
    """How a checkpoint names the optimizer whose state it holds (its class, with its module)."""
    return f"{type(optimizer).__module__}.{type(optimizer).__qualname__}"


def check_same_optimizer(ckpt: Path, state: dict, optimizer: torch.optim.Optimizer) -> None:
    """A ConfigError (the run's setting, not a damaged checkpoint) when the checkpoint holds another optimizer's
    state than the one this run built: ``grpo.optimizer=adamw8bit`` runs torch AdamW without CUDA or bitsandbytes
    (warned), and the same config resumed on a GPU built bitsandbytes' AdamW8bit to load torch AdamW's state into.
    A checkpoint that does not say (written before dgrpo recorded it) is not checked. The new run's model is named
    as the caller names one (``--init``, from Python ``LatentLM.from_pretrained``: :func:`~.wording.init_named`)."""
    saved, now = state.get("optimizer_kind"), optimizer_kind(optimizer)
    if saved is None or saved == now:
        return
    why = (
        " (grpo.optimizer=adamw8bit runs torch AdamW without CUDA or bitsandbytes)"
        if "bitsandbytes" in saved + now
        else ""
    )
    init = init_named(ckpt / "model", in_command_line())
    if (ckpt / SHARDED_DIR).is_dir() and not any((ckpt / "model").glob("*.safetensors")):  # (weights in shards)
        init = f"{init} once `dgrpo consolidate {ckpt}` has written its weights there"
    raise ConfigError(
        f"{ckpt} holds the state of the optimizer {saved}, and this run builds {now}{why}: resume it where it ran, "
        f"or start a new run with {init}"
    )


def shard_shapes(shards: Path, part: str) -> dict[str, torch.Tensor]:
    """The tensors of entry ``part`` of a checkpoint's shards (``model``) as meta tensors of their shapes, read from
    the shards' metadata alone (without unpickling code)."""
    from .consolidate import SafeFileSystemReader

    entries = SafeFileSystemReader(shards).read_metadata().state_dict_metadata
    prefix = f"{part}."
    return {
        k[len(prefix) :]: torch.empty(tuple(v.size), device="meta")
        for k, v in entries.items()
        if k.startswith(prefix) and hasattr(v, "size")
    }


def check_same_sharding(ckpt: Path, opt_state: Any, sharded: bool) -> None:
    """A ConfigError (the run's setting, not a damaged checkpoint) when a checkpoint written under FSDP2 (its optimizer
    state names the parameters) is resumed without it, or the other way round."""
    groups = opt_state.get("param_groups", []) if isinstance(opt_state, dict) else []
    ids = [i for g in groups if isinstance(g, dict) for i in g.get("params", [])]
    by_name = bool(ids) and all(isinstance(i, str) for i in ids)
    if ids and by_name != sharded:
        written, now = ("with", "without") if by_name else ("without", "with")
        how = (
            "under torchrun with fsdp full or sharded (FSDP2 needs 2 processes or more: one process runs without it)"
            if by_name
            else "with fsdp none"
        )
        raise ConfigError(f"{ckpt}: written {written} FSDP2 and resumed {now} it: resume it {how}")


def check_same_hub_base(ckpt: Path, lm) -> None:
    """A ConfigError (the run's setting, not a damaged checkpoint: no fallback to an older one) when a LoRA
    checkpoint's adapter was trained on another hub commit of its base than the one loaded now: the hub's branch
    moved since the run started, and the adapter would continue on other weights. Worded for the caller: the command
    line's options, or the Python call (:func:`~.wording.in_command_line`)."""
    if lm.peft is None or not lm.revision:
        return
    from ..model.lora import adapter_base_revision

    saved = adapter_base_revision(ckpt / "model")
    if saved and saved != lm.revision:
        how = setting_named("model.revision", saved, repr(saved), in_command_line(), allow=True)
        raise ConfigError(
            f"{ckpt}: its LoRA adapter was trained on {lm.name_or_path} at commit {saved}, and that base was read "
            f"now at commit {lm.revision} (the hub's branch moved on): resume on the same weights with {how}"
        )


def _local_base(lm) -> str | None:
    """The local directory of the base ``lm``'s LoRA adapter is on (None: no adapter, or a hub base)."""
    from ..model.lora import base_directory

    base = base_directory(lm)
    return None if base is None else str(base)


def check_same_adapter(ckpt: Path, lm) -> None:
    """A ConfigError (the run's setting: no fallback to an older checkpoint, each would be skipped as damaged) when a
    LoRA checkpoint's adapter is not the one the run builds: another rank, other targets or other trainable latent rows
    fail to load, another alpha rescales the saved adapter (the resumed policy would not be the one saved). Compared on
    the adapters themselves, whatever the run's config recorded (an ``--init`` adapter's own settings win over
    ``model.lora``)."""
    from ..model.lora import is_adapter_dir, other_adapter

    if getattr(lm, "peft", None) is None or not is_adapter_dir(ckpt / "model"):
        return
    keep = other_adapter(ckpt / "model", lm, in_command_line())
    if keep is not None:
        raise other_adapter_error(ckpt, keep)


def check_planned_adapter(candidates: list[Path], model_cfg: dict) -> None:
    """:func:`check_same_adapter` and :func:`check_same_local_base` before the model is loaded (a 1.5B base took
    minutes to be told), from the files alone (:func:`~dgrpo.model.lora.planned_adapter` and
    :func:`~dgrpo.model.lora.planned_base`: the adapter ``model_cfg``, the run's ``model`` config as a dict, builds
    on the model it names, and its base), against the first of the checkpoints to resume (newest first) whose
    adapter config reads: a run's checkpoints hold one kind of adapter, on one base. What the files do not tell (a
    hub model, ``all-linear`` targets) is left to those checks, once the model is loaded."""
    from ..model.lora import adapter_changes, is_adapter_dir, planned_adapter, planned_base, trained_on

    source = str(model_cfg.get("name_or_path", ""))
    now = planned_adapter(model_cfg.get("lora", {}), source)
    if now is None:
        return
    for ckpt in candidates:
        if not is_adapter_dir(ckpt / "model"):
            continue
        try:
            keep = adapter_changes(ckpt / "model", now, in_command_line())
        except CheckpointError:  # (unreadable: the checkpoint's reader says so, and takes an older one)
            continue
        if keep is not None:
            raise other_adapter_error(ckpt, keep)
        base = planned_base(source)
        if base is not None and trained_on(ckpt / "model", base) is False:
            raise other_base_error(ckpt, base)
        return


def other_adapter_error(ckpt: Path, keep: str) -> ConfigError:
    """The refusal of a LoRA checkpoint whose adapter this run would not build; ``keep``: the settings that would. The
    new run's model is named as the caller names one (``--init``, from Python ``LatentLM.from_pretrained``)."""
    return ConfigError(
        f"{ckpt} holds a LoRA adapter that this run's model.lora would not build: resume with {keep} (to train "
        f"another adapter from it, merge it into its base, dgrpo export {ckpt} --merge --out MERGED, and start a new "
        f"run with {init_named(Path('MERGED'), in_command_line())})"
    )


def check_same_local_base(ckpt: Path, lm) -> None:
    """A ConfigError (the run's setting, not a damaged checkpoint: no fallback to an older one) when a LoRA
    checkpoint's adapter was trained on other weights than those of the local base loaded now (the fingerprint its
    weights record differs): the adapter would continue on another model. The same weights in another place (a
    moved base directory) resume, and the run's adapter folders are pointed there (:func:`repoint_run_adapters`)."""
    from ..model.lora import trained_on

    base = _local_base(lm)
    if base is not None and trained_on(ckpt / "model", base) is False:
        raise other_base_error(ckpt, base)


def other_base_error(ckpt: Path, base: str) -> ConfigError:
    """The refusal of a LoRA checkpoint whose adapter was trained on other weights than those of the local ``base``,
    worded for the caller (``--init``, ``--out``; from Python ``LatentLM.from_pretrained``, ``out_dir``)."""
    from ..model.lora import adapter_base

    cli = in_command_line()
    return ConfigError(
        f"{ckpt}: its LoRA adapter was trained on other weights than those of its base loaded now, {base} (it was "
        f"saved on the base at {adapter_base(ckpt / 'model')}): resume on the weights it was trained on "
        f"({init_named(None, cli)} naming where they are now), or train an adapter on this base in a new run "
        f"(another {'--out' if cli else 'out_dir'})"
    )


def run_adapter_folders(out_dir: Path) -> list[tuple[Path, Path]]:
    """A LoRA run's own adapter folders, each with the directory written as a whole that holds it: ``final/``,
    ``best/`` and ``stage-K/`` (themselves), and each resumable checkpoint's ``model/`` (its ``step-N``)."""
    from ..model.lora import is_adapter_dir

    out = Path(out_dir)
    models = [out / FINAL_DIR, out / BEST_DIR, *stage_dirs(out)]
    found = [(m, m) for m in models if m.is_dir() and is_adapter_dir(m)]
    return found + [(c / "model", c) for c in list_checkpoints(out) if is_adapter_dir(c / "model")]


def repoint_run_adapters(out_dir: Path, base: str, log: Callable[[str], None]) -> None:
    """A resumed LoRA run that loads its base from another place than its adapter folders name (the base directory
    moved, and the run was resumed with ``--init`` naming its new place): each of the run's folders
    (:func:`run_adapter_folders`) trained on the same weights (by the fingerprint it records; one that records none
    when the place it names is gone) is pointed to ``base``, its manifests kept consistent, so that it still loads
    (the test of best/ at the end of the run failed every time). A folder trained on other weights, or naming a
    base still there whose weights nothing compares, names its own and is left as it is; so is one whose manifest
    fails (damaged, or changed by hand: rewriting its manifest would make it pass). Rank 0 only."""
    from ..model.lora import adapter_base, current_fingerprint, repoint, saved_fingerprint

    now: list[str | None] = []  # (the base's fingerprint, computed once: without a manifest, its files are read)
    moved: dict[tuple[str, bool], list[str]] = {}  # (the place named, whether a fingerprint compared the weights)
    for folder, whole in run_adapter_folders(out_dir):
        try:
            named = adapter_base(folder)
        except CheckpointError:  # (unreadable: whoever loads it says so)
            continue
        if named == base or not Path(named).is_absolute():
            continue
        saved = saved_fingerprint(folder)
        if saved is not None and not now:
            now.append(current_fingerprint(base))
        if (saved is not None and saved != now[0]) or (saved is None and Path(named).exists()):
            continue
        problem = verify(whole) if (whole / MANIFEST).is_file() else None  # (none: a folder no manifest vouches for)
        if problem is not None:
            log(f"dgrpo: {whole} still names the base at {named}: not intact ({problem}), it is left as it is")
            continue
        try:
            repoint(folder, base, whole)
        except OSError as e:
            after = f"it still names {named}; resume again once it can be written"
            raise write_failed(f"the base's new place into {folder}", whole, e, after) from None
        moved.setdefault((named, saved is not None), []).append(f"{whole.relative_to(out_dir)}/")
    for (named, compared), names in moved.items():
        how = "the same weights" if compared else "not compared: the adapters record no fingerprint of its weights"
        log(f"dgrpo: the base model moved from {named} to {base} ({how}): {', '.join(names)} now name its new place")


def read_weights_file(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path))


def check_optimizer_state(
    optimizer: torch.optim.Optimizer, saved: Any, named: dict[str, torch.Tensor] | None = None
) -> None:
    """The saved optimizer state has this optimizer's parameter groups and, per parameter, tensors of its shape.
    Its parameters are numbered as the optimizer's, or named as ``named``'s (the whole state of a sharded model,
    :meth:`~dgrpo.training.distributed.Dist.training_state`)."""
    if not isinstance(saved, dict) or "param_groups" not in saved or "state" not in saved:
        raise CheckpointError("optimizer.pt does not hold an optimizer state")
    groups = [g["params"] for g in optimizer.param_groups]
    saved_groups = [g.get("params", []) for g in saved["param_groups"]]
    if [len(g) for g in groups] != [len(g) for g in saved_groups]:
        raise CheckpointError("optimizer.pt: its parameter groups do not match this model's parameters")
    ids = [i for g in saved_groups for i in g]
    if named is not None:
        params = {i: named.get(i) for i in ids}
    else:
        params = {i: p for i, p in zip(ids, (p for g in groups for p in g))}
    for i, per_param in saved["state"].items():
        p = params.get(i)
        if p is None:
            raise CheckpointError("optimizer.pt: state for a parameter the optimizer does not have")
        for name, value in per_param.items():
            if name in PER_PARAMETER_STATE and isinstance(value, torch.Tensor) and value.shape != p.shape:
                got, want = tuple(value.shape), tuple(p.shape)
                raise CheckpointError(f"optimizer.pt: the {name} of a parameter has shape {got}, not {want}")


def checkpoint_command(ckpt: Path) -> str | None:
    """Which command wrote a resumable checkpoint, ``sft`` or ``grpo``, read from the state each one saves (its
    ``state.json``); None when that cannot be read (the checkpoint's own verification then says why)."""
    try:
        state = json.loads((Path(ckpt) / RESUMABLE_STATE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(state, dict):
        return None
    return "grpo" if "trainer" in state else "sft" if "progress" in state else None


def resume_candidates(out_dir: Path) -> list[Path]:
    """Checkpoints to try when resuming, newest first."""
    return list(reversed(list_checkpoints(out_dir)))


def count_lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.is_file() else 0


def reset_metrics(path: Path, keep_lines: int | None) -> None:
    """Before a run appends to its metrics file: resuming, keep the ``keep_lines`` rows of the checkpoint
    (:func:`truncate_metrics`); a fresh run (``None``) removes the rows of an earlier run."""
    if keep_lines is None:
        path.unlink(missing_ok=True)
    else:
        truncate_metrics(path, keep_lines)


def truncate_metrics(path: Path, n_lines: int) -> None:
    """Keep the first ``n_lines`` rows (those written before the checkpoint being resumed): rows a dead
    run wrote after its last checkpoint are dropped, so the resumed file has no duplicate or missing step."""
    if not path.is_file():
        return
    lines = path.read_text().splitlines()[:n_lines]
    try:
        write_text_atomically(path, "".join(x + "\n" for x in lines))
    except OSError as e:
        after = f"{path} is left as it was; once there is space, the same command resumes again"
        raise write_failed(path.name, path.parent, e, after) from None
