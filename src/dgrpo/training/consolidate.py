"""Consolidate a sharded FSDP checkpoint (``DIR/dcp``, torch.distributed.checkpoint) into ``DIR/model.safetensors``,
in one process, without running code from the checkpoint.

torch's own reader unpickles the checkpoint's ``.metadata`` file with :func:`pickle.load`, which runs whatever a
planted file asks for. Here the metadata is read with an unpickler that only builds the checkpoint-metadata
classes of ``torch.distributed.checkpoint`` (plus ``torch.Size``, dtypes and paths); the checkpoint must hold
tensors only (no pickled "bytes" entries, which torch would load with ``weights_only=False``), and tensor data is
read with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import os
import pickle
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

from ..model.hf_loading import hf_progress_bars_off
from ..model.latent_lm import LatentLM
from ..model.sources import on_disk
from ..model.verified import (
    MANIFEST,
    RESUMABLE_STATE,
    SAFETENSORS,
    SHARDED_DIR,
    CheckpointError,
    check_intact,
    holds_weights,
    one_line,
    read_json_object,
    rewritten,
    write_manifest,
)
from ..run_layout import FINAL_DIR

#: the weights ``save_pretrained`` writes: one file, or Hugging Face's shards
_WEIGHTS = r"model(-\d+-of-\d+)?\.safetensors"
#: what ``dgrpo consolidate`` adds to a sharded checkpoint (``dcp/``) beside its shards, with ``save_pretrained``: the
#: weights (and the index of Hugging Face's shards) and the generation config
_ADDED = rf"{_WEIGHTS}|model\.safetensors\.index\.json|generation_config\.json"
ADDED_BY_CONSOLIDATION = re.compile(rf"({_ADDED})")
#: what it writes: those, and the model config again (which an earlier dgrpo's sharded save left without ``dtype``
#: and ``architectures``)
CONSOLIDATED = re.compile(rf"({_ADDED}|config\.json)")

if TYPE_CHECKING:
    from transformers import PreTrainedModel

#: (module, name) pairs the metadata may reference; everything else is refused before it is imported
_ALLOWED = {
    ("torch.distributed.checkpoint.metadata", n)
    for n in (
        "Metadata",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "TensorProperties",
        "ChunkStorageMetadata",
        "MetadataIndex",
        "StorageMeta",
        "_MEM_FORMAT_ENCODING",
    )
} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"),
    ("collections", "OrderedDict"),
}


class _MetadataUnpickler(pickle.Unpickler):
    """Builds checkpoint metadata and nothing else."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"the metadata references {module}.{name}, which a checkpoint never needs")


class SafeFileSystemReader(FileSystemReader):
    """torch's FileSystemReader with the metadata read by :class:`_MetadataUnpickler`, tensors only."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = Path(self.path) / ".metadata"
        try:
            with open(path, "rb") as f:
                metadata = _MetadataUnpickler(f).load()
        except (pickle.UnpicklingError, EOFError, AttributeError, ValueError, TypeError, OSError) as e:
            raise CheckpointError(
                f"{path}: not a checkpoint metadata file dgrpo can read safely ({one_line(e)})"
            ) from None
        if not isinstance(metadata, Metadata):
            raise CheckpointError(f"{path}: not a checkpoint metadata file (found a {type(metadata).__name__})")
        for key, entry in metadata.state_dict_metadata.items():
            if not isinstance(entry, TensorStorageMetadata):
                raise CheckpointError(f"{path}: entry {key!r} is not a tensor (model checkpoints hold tensors only)")
        storage_meta = getattr(metadata, "storage_meta", None) or StorageMeta()
        storage_meta.load_id = self.load_id
        metadata.storage_meta = storage_meta
        return metadata


def read_sharded(directory: Path, part: str | None = None) -> dict[str, torch.Tensor]:
    """The full state dict of a sharded checkpoint directory (``directory/dcp``), read safely in one process; a
    missing or truncated shard is one :class:`CheckpointError` line. ``part``: one entry of shards that hold
    several (a resumable checkpoint's ``model``, beside its optimizer's state), read alone."""
    state: dict[str, Any] = {}
    reader = SafeFileSystemReader(directory / SHARDED_DIR)
    reader.read_metadata()  # checked here, where its error is one line (torch wraps the reader's errors)
    try:
        _load_state_dict(
            state,
            storage_reader=reader,
            planner=_EmptyStateDictLoadPlanner(keys=None if part is None else {part}),
            no_dist=True,
        )
    except (Exception, CheckpointException) as e:  # noqa: BLE001 - a missing or bad file, which torch wraps
        cause: BaseException = e
        if isinstance(e, CheckpointException) and e.failures:  # (a BaseException: the cause is the first failure's)
            cause = next(iter(e.failures.values()))[0]
        raise CheckpointError(f"cannot read the shards in {directory / SHARDED_DIR}: {one_line(cause)}") from None
    if part is not None:
        if not isinstance(state.get(part), dict):
            raise CheckpointError(f"{directory / SHARDED_DIR}: the shards hold no {part!r} entry")
        return state[part]
    return state


def _sharded_checkpoint(path: Path) -> Path:
    """``path`` when it holds shards (``dcp/.metadata``), a run directory's ``final/`` when that does, checked
    against its manifest (a changed shard would otherwise be written into a new, verified checkpoint)."""
    if not path.exists():
        raise CheckpointError(f"{path}: not found")
    if not (path / SHARDED_DIR / ".metadata").is_file() and (path / FINAL_DIR / SHARDED_DIR / ".metadata").is_file():
        path = path / FINAL_DIR
    if not (path / SHARDED_DIR / ".metadata").is_file():
        whole = next((d for d in (path, path / FINAL_DIR, path / "model") if holds_weights(d)), None)
        if whole is not None:  # (fsdp: full, or one process: the run wrote the weights themselves)
            raise CheckpointError(
                f"{path}: nothing to consolidate: {whole} holds the whole model ({SAFETENSORS} or its index), not "
                f"FSDP shards ({SHARDED_DIR}/): it loads as it is"
            )
        raise CheckpointError(f"{path}: no sharded checkpoint ({SHARDED_DIR}/.metadata) to consolidate")
    check_intact(path, (f"{SHARDED_DIR}/.metadata",))
    return path


def unconsolidated(path: Path) -> bool:
    """Whether the model folder ``path`` (``final/``, ``best/``, ``stage-K/``) holds shards (``fsdp: sharded`` wrote
    it) and no weights yet (:func:`~dgrpo.model.verified.holds_weights`, as loading reads them): ``dgrpo consolidate
    path`` writes them, which loading it needs."""
    return (path / SHARDED_DIR).is_dir() and not holds_weights(path)


def same_saved_model(a: Path, b: Path) -> bool:
    """Whether two model folders dgrpo wrote (a run's best/ and final/) hold the same model, by their manifests: the
    same files with the same digests, but the shards' metadata (``dcp/.metadata``), which torch.distributed.checkpoint
    writes with the save's own path and id: compared as read (safely), where each tensor lies in the shard files. A
    folder without a readable manifest: False (nothing vouches for its files)."""
    metadata = f"{SHARDED_DIR}/.metadata"
    try:
        listed = [read_json_object(folder / MANIFEST) for folder in (a, b)]
    except (OSError, CheckpointError):
        return False
    others = [{name: digest for name, digest in m.items() if name != metadata} for m in listed]
    if others[0] != others[1] or (metadata in listed[0]) != (metadata in listed[1]):
        return False
    if metadata not in listed[0]:
        return True
    try:
        x, y = (SafeFileSystemReader(folder / SHARDED_DIR).read_metadata() for folder in (a, b))
    except CheckpointError:
        return False
    return x.state_dict_metadata == y.state_dict_metadata and x.storage_data == y.storage_data


def consolidate_checkpoint(path: str | Path) -> Path:
    """Turn a sharded FSDP checkpoint (``path/dcp``; a run directory means its ``final/``) into
    ``path/model.safetensors`` (and a new manifest), so that ``LatentLM.from_pretrained(path)`` and plain
    transformers load it. A resumable checkpoint (``checkpoints/step-N``) gets its model's weights in
    ``path/model/`` (its shards stay: it still resumes). Returns the model directory; one already consolidated
    from its shards as they are is left as it is (:func:`consolidated`)."""
    return consolidated(path)[0]


def consolidated(path: str | Path) -> tuple[Path, bool]:
    """:func:`consolidate_checkpoint`: (the model directory, whether its weights were written now). Not when its
    manifest, checked, already lists weights beside the shards (only consolidation writes both): they were
    consolidated from these shards, which have not changed since (a changed shard fails the check; one whose
    manifest was deleted, to load a change, is consolidated again)."""
    path = _sharded_checkpoint(on_disk(path))
    resumable = (path / RESUMABLE_STATE).is_file()
    target = path / "model" if resumable else path
    if _manifest_lists_weights(path, "model/" if resumable else ""):
        return target, False
    state = read_sharded(path, "model" if resumable else None)
    if not state:  # (was a StopIteration traceback)
        raise CheckpointError(f"{path / SHARDED_DIR}: the shards hold no weights")
    from transformers import AutoConfig, AutoModelForCausalLM

    dtype = next(iter(state.values())).dtype
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(target), dtype=dtype)
    lm_state = model.state_dict()
    if set(state) - set(lm_state) or set(lm_state) - set(state) - _tied(model):
        raise CheckpointError(f"{path}: the sharded weights do not match the model config")
    if shaped := sorted(k for k, t in state.items() if t.shape != lm_state[k].shape):
        raise CheckpointError(
            f"{path}: the sharded weights do not fit {target / 'config.json'} ({len(shaped)} of other shapes: "
            f"{shaped[0]} is {tuple(state[shaped[0]].shape)}, the config's {tuple(lm_state[shaped[0]].shape)}); put "
            "back the run's own config.json"
        )
    model.load_state_dict(state, strict=False)
    # (a stop mid-write leaves ``path`` as it was, not a cut-short weights file; transformers' "Writing model shards"
    # and "Loading weights" bars, one per step, printed after dgrpo consolidate's line was decided: off)
    with rewritten(path) as tmp, hf_progress_bars_off():
        out = tmp / target.relative_to(path)
        _save_into(model, out)
        write_manifest(out)
        if resumable:  # (the checkpoint's manifest vouches for model/'s files too)
            write_manifest(tmp)
        LatentLM.from_pretrained(out)  # verifies the result loads before it replaces ``path``
    return target, True


def _manifest_lists_weights(path: Path, prefix: str) -> bool:
    """Whether ``path``'s manifest (checked by :func:`_sharded_checkpoint`) lists weights under ``prefix`` beside
    the shards' metadata: what consolidation writes."""
    if not (path / MANIFEST).is_file():
        return False
    listed = read_json_object(path / MANIFEST)
    if f"{SHARDED_DIR}/.metadata" not in listed:
        return False
    return any(re.fullmatch(_WEIGHTS, name.removeprefix(prefix)) for name in listed if name.startswith(prefix))


def _save_into(model: PreTrainedModel, folder: Path) -> None:
    """``model.save_pretrained`` into ``folder``, a copy of hard links (:func:`~dgrpo.model.verified.rewritten`):
    saved into a fresh folder inside it first, its files then renamed over the links (writing into a link would
    change the original checkpoint's file)."""
    fresh = folder / ".save"
    model.save_pretrained(fresh, safe_serialization=True)
    for file in fresh.iterdir():
        os.replace(file, folder / file.name)
    fresh.rmdir()


def _tied(model: torch.nn.Module) -> set[str]:
    """State-dict keys that share storage with an earlier key (tied weights)."""
    seen: dict[int, str] = {}
    tied = set()
    for k, t in model.state_dict(keep_vars=True).items():
        if t.data_ptr() in seen:
            tied.add(k)
        seen.setdefault(t.data_ptr(), k)
    return tied
