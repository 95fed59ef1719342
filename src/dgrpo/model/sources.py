"""Where a model name points: a checkpoint directory (a run directory means its ``final/``) or a Hugging Face hub id.

A name that is an existing path is a checkpoint directory; a name shaped like a path that does not exist is an
error; anything else is a hub id, looked up in the local cache first and on the hub only when it is reachable: an
unreachable hub fails at once with one line (no 50 s of retries).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from ..hub import EndpointError, hub_reachable, offline_variable
from ..paths import expand_home
from ..run_layout import CHECKPOINTS_DIR, FINAL_DIR, METRICS_FILE, STEP_DIR, checkpoint_dirs, step_dir_name
from ..text import first_items
from .verified import (
    ADAPTER_CONFIG_FILE,
    LATENT_CONFIG_FILE,
    RESUMABLE_STATE,
    SAFETENSORS,
    SAFETENSORS_INDEX,
    CheckpointError,
    check_intact,
    one_line,
)

#: the name of a file the official Coconut code's run.py saves (``save_dir/checkpoint_N``, after epoch N)
COCONUT_FILE = re.compile(r"checkpoint_\d+")
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")  # "gpt2", "Qwen/Qwen2.5-1.5B"
#: model.name_or_path of the tiny model built from the config (model.arch, ...), untrained: never a model to load
BUILTIN = "builtin-tiny"


def is_model_dir(p: Path) -> bool:
    """A model checkpoint directory: a LoRA adapter's, or a config.json beside weights (or dgrpo's latent settings)."""
    if (p / ADAPTER_CONFIG_FILE).is_file():
        return True
    weights = (p / SAFETENSORS).is_file() or (p / SAFETENSORS_INDEX).is_file() or (p / "pytorch_model.bin").is_file()
    return (p / "config.json").is_file() and (weights or (p / LATENT_CONFIG_FILE).is_file())


def on_disk(path: str | Path) -> Path:
    """``path`` as it is on disk: ``~`` expanded, and a resumable checkpoint named unpadded (``checkpoints/step-128``)
    as the directory the trainers write (``step-00000128``) when only that exists. The one place that maps the
    name; every loader (``from_pretrained``, the command line's model sources) goes through it."""
    p = expand_home(path)
    step = STEP_DIR.fullmatch(p.name)
    padded = p.with_name(step_dir_name(int(step[1]))) if step else p
    return padded if not p.exists() and padded.is_dir() else p


def resolve_checkpoint(path: str | Path) -> Path:
    """A run directory resolves to its ``final/`` checkpoint, a resumable checkpoint (``checkpoints/step-N``) to the
    model it holds (``model/``), a checkpoint directory to itself."""
    p = on_disk(path)
    if is_model_dir(p / FINAL_DIR):
        return p / FINAL_DIR
    if is_model_dir(p):
        return p
    if (p / RESUMABLE_STATE).is_file() and is_model_dir(p / "model"):
        return p / "model"
    if p.is_file():
        raise CheckpointError(f"{p} is a file, not a checkpoint directory{coconut_hint(p)}")
    if (p / FINAL_DIR).is_dir():  # (written whole and renamed into place: one that is no model was changed since)
        check_intact(p / FINAL_DIR)
        raise CheckpointError(f"{p / FINAL_DIR} holds no model checkpoint (no config.json with weights)")
    if (p / METRICS_FILE).is_file():
        raise CheckpointError(
            f"{p} holds no model checkpoint: a run directory without final/ (the run did not finish: rerun its command "
            "to resume it, or name one of its checkpoints: best/, stage-K/, checkpoints/step-N)"
        )
    if p.is_dir():  # (a directory dgrpo wrote, its config.json gone: the manifest says so)
        check_intact(p)
    if p.name == CHECKPOINTS_DIR and (steps := checkpoint_dirs(p.parent)):  # (RUN/checkpoints: name one of them)
        newest = first_items([s.name for s in reversed(steps)])
        raise CheckpointError(
            f"{p} holds resumable checkpoints, not one model: name one of them ({newest}: newest first), or the run "
            f"directory {p.parent} for its final/"
        )
    if p.exists():
        raise CheckpointError(
            f"{p} holds no model checkpoint (no config.json with weights, no final/){coconut_hint(p)}"
        )
    raise CheckpointError(f"checkpoint directory not found: {p}")


def coconut_hint(p: Path) -> str:
    """What to add when a model is named by a file of the official Coconut code (``checkpoint_N``, a ``torch.save``
    of a state dict) or by the ``save_dir`` holding them: dgrpo loads them once converted."""
    if p.is_file() and COCONUT_FILE.fullmatch(p.name):
        return ": checkpoint_N is the official Coconut code's file name; convert it with dgrpo import-coconut"
    if p.is_dir() and any(COCONUT_FILE.fullmatch(f.name) and f.is_file() for f in p.iterdir()):
        return (
            ": it holds checkpoint_N files, as the official Coconut code's save_dir; convert one with dgrpo "
            "import-coconut"
        )
    return ""


def revision_kwargs(revision: str | None) -> dict[str, str]:
    """``from_pretrained``'s ``revision`` keyword for a hub id's branch, tag or commit; none for None (the default
    branch, or a local directory, which has no revision)."""
    return {"revision": revision} if revision else {}


def resolve_device(name: str) -> torch.device:
    """The ``device`` option as a torch device (``auto``: CUDA when there is one, else the CPU); one line when the
    machine has no such device (a CUDA index past its GPUs, MPS off a Mac: torch failed later, after the model
    loaded, with a traceback)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise CheckpointError(f"device {name!r} requested but CUDA is not available on this machine")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise CheckpointError(
                f"device {name!r} requested but this machine has {torch.cuda.device_count()} CUDA device(s) "
                "(cuda:0 is the first)"
            )
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise CheckpointError(f"device {name!r} requested but MPS (Apple's GPU) is not available on this machine")
    return device


def on_for_device(setting: str, device: torch.device) -> bool:
    """An ``auto | true | false`` option whose auto means on a CUDA device (bf16 autocast, the compiled head, the
    packed attention)."""
    return setting == "true" or (setting == "auto" and device.type == "cuda")


def _looks_like_path(name: str) -> bool:
    return name.startswith(("/", ".", "~")) or name.endswith("/") or not HUB_ID.match(name)


def resolve_hub_model(name: str, revision: str | None = None) -> tuple[str, bool]:
    """(name, local_files_only) for a hub id (at ``revision``: a branch, tag or commit; None: the default branch):
    the cached copy when the hub cannot be reached or offline mode is asked for (``HF_HUB_OFFLINE`` /
    ``TRANSFORMERS_OFFLINE``, read now, as the dataset loaders read theirs), else the hub. One CheckpointError line
    when neither works."""
    from huggingface_hub import constants, try_to_load_from_cache

    if name == BUILTIN:  # (it was looked up on the hub)
        raise CheckpointError(
            f"{BUILTIN} is the untrained built-in model, which training builds from the config (model.name_or_path "
            f"{BUILTIN}, the default, and no --init), not a model to load: name a checkpoint directory, a run "
            "directory or a hub id"
        )
    cached = any(  # a model, or a LoRA adapter
        isinstance(try_to_load_from_cache(name, file, revision=revision), str)
        for file in ("config.json", "adapter_config.json")
    )
    what = f"model {name!r}" + (f" at revision {revision!r}" if revision else "")
    repo_cached = (Path(constants.HF_HUB_CACHE) / f"models--{name.replace('/', '--')}").is_dir()
    # (no revision: main, as from_pretrained reads it, the cache's refs/main; a copy downloaded at a commit has none)
    at = f"at revision {revision!r}" if revision else "at main, the revision read when none is named"
    missing = f"not {at} (other revisions are)" if repo_cached else "not"
    offline = offline_variable("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")  # (the hub libraries' local cache only)
    if offline is not None:
        if cached:
            return name, True
        raise CheckpointError(
            f"{what}: not a local directory, and {offline} is set but the model is {missing} in the "
            f"Hugging Face cache ({constants.HF_HUB_CACHE}): {download_hint(name, revision)}, or unset {offline}"
        )
    try:
        reachable = hub_reachable()
    except EndpointError as e:
        raise CheckpointError(f"{what}: {e}") from None
    if reachable:
        return name, False
    if cached:
        return name, True
    raise CheckpointError(
        f"{what}: not a local directory, {missing} in the Hugging Face cache, and the hub ({constants.ENDPOINT}) "
        f"cannot be reached (no network?): {download_hint(name, revision)}, or point to a local copy "
        f"(HF_HUB_ETAG_TIMEOUT / HF_HUB_DOWNLOAD_TIMEOUT set the hub's timeouts in seconds)"
    )


def download_hint(name: str, revision: str | None) -> str:
    """How to put a hub id's files (at ``revision``) into the Hugging Face cache: the command to run where there is
    network (into this cache, or copied to it)."""
    at = f" --revision {revision}" if revision else ""
    return f"download it where there is network (hf download {name}{at}) into this cache"


NO_SAFETENSORS = "no safetensors weights"  # what :func:`missing_weights` says of a model without any
#: how transformers says that a model lacks one file, or several (the shards of one index missing from the cache)
MISSING_FILES = re.compile(r"does not appear to have (?:a file|files) named (.*)")


def missing_weights(error: BaseException, name: str, revision: str | None) -> str:
    """What a model's weights lack, from the error ``from_pretrained`` raised for a file it did not find: the shards
    of its safetensors index that are missing (transformers names the first; the cached snapshot at ``revision``
    shows every one), or else any safetensors weights (a model with ``.bin`` weights only, or none)."""
    named = MISSING_FILES.search(str(error))
    shards = [f for f in re.findall(r"[\w.-]+?\.safetensors", named[1] if named else "") if f != SAFETENSORS]
    if not shards:  # (model.safetensors, or its index: no weights at all)
        return NO_SAFETENSORS
    shard = shards[0]
    try:
        index = _cached_file(name, SAFETENSORS_INDEX, revision)
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    except (OSError, ValueError, KeyError, AttributeError, TypeError):  # (no index at hand: the shard named)
        return f"its safetensors weights are in shards ({SAFETENSORS_INDEX}), and {shard} is missing"
    gone = [f for f in shards if not (index.parent / f).is_file()] or [shard]
    are = "is" if len(gone) == 1 else "are"
    return (
        f"{len(gone)} of the {len(shards)} safetensors shards its {SAFETENSORS_INDEX} names {are} missing "
        f"({first_items(gone)})"
    )


def _cached_file(name: str, file: str, revision: str | None) -> Path:
    """A hub id's file at ``revision`` in the Hugging Face cache; FileNotFoundError when it is not there."""
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(name, file, revision=revision)
    except ValueError:  # (not a hub id: huggingface_hub's validation error)
        found = None
    if not isinstance(found, str):
        raise FileNotFoundError(file)
    return Path(found)


#: what :func:`hub_snapshot` fetches of a hub repository before the weights: configs (dgrpo's latent_config.json,
#: run_config.json and manifest.json among them), tokenizer files, and a LoRA adapter's own weights
SMALL_FILES = (
    "*.json",
    "*.txt",
    "*.model",
    "*.tiktoken",
    "*.jinja",  # a chat template (chat_template.jinja, additional_chat_templates/*.jinja)
    "tokenizer*",
    "adapter_model.safetensors",
    "latent_rows.safetensors",
)


def hub_snapshot(name: str, revision: str | None, local_files_only: bool) -> Path:
    """The local folder (in the Hugging Face cache) of a hub id's files at ``revision``, holding
    :data:`SMALL_FILES` (not the model's weights, which ``from_pretrained`` fetches into the same folder). Its name
    is the commit the revision points to. A dgrpo checkpoint uploaded to the hub is read as its directory would be:
    its latent settings, run config and LoRA adapter files come from here. One CheckpointError line when the
    repository or revision is not there."""
    from huggingface_hub import snapshot_download

    what = f"model {name!r}" + (f" at revision {revision!r}" if revision else "")
    try:
        folder = snapshot_download(
            name, revision=revision, allow_patterns=list(SMALL_FILES), local_files_only=local_files_only
        )
    except Exception as e:  # noqa: BLE001 - the hub's errors (not found, gated, revision, cache) are one line each
        where = "in the Hugging Face cache" if local_files_only else "on the hub"
        raise CheckpointError(f"{what}: cannot be read {where}: {one_line(e)}") from None
    return Path(folder)


def hub_files(name: str, revision: str | None, local_files_only: bool = False) -> tuple[Path, bool]:
    """(:func:`hub_snapshot`'s folder, local_files_only) for a hub id: where it is read from first
    (:func:`resolve_model_source`: the hub, or the cached copy), unless ``local_files_only`` already says the cache."""
    if not local_files_only:
        name, local_files_only = resolve_model_source(name, revision)
    return hub_snapshot(name, revision, local_files_only), local_files_only


def resolve_model_source(name: str, revision: str | None = None) -> tuple[str, bool]:
    """(what to pass to ``from_pretrained``, local_files_only) for a model name: a checkpoint path, or a hub id (at
    ``revision``; a path has none, and ignores it)."""
    p = on_disk(name)
    if p.exists():
        return str(resolve_checkpoint(p)), True
    check_path_exists(name)
    return resolve_hub_model(name, revision)


def check_path_exists(name: str) -> None:
    """A CheckpointError for a model name written as a path (``/``, ``.`` or ``~`` first, not a hub id's form) with
    nothing there: what loading it says, for a command to say before it reads its data."""
    if _looks_like_path(name) and not (p := on_disk(name)).exists():
        raise CheckpointError(f"checkpoint directory not found: {p}")
