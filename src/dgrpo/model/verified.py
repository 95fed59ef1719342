"""Directories written atomically and verified when read: a sha256 manifest, a temporary directory renamed into
place, strict loading of safetensors weights, and one error type with a one-line message.

Every directory dgrpo writes (a model checkpoint: ``final/``, ``best/``, ``stage-K/``; a resumable training
checkpoint) is first written to a hidden temporary sibling, then ``manifest.json`` (the sha256 of every file) is
written last and the directory is renamed into place, so a kill mid-write never leaves a directory that looks
complete. A reader verifies the manifest and that every file it needs is listed in it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from ..paths import expand_home
from ..text import first_items

MANIFEST = "manifest.json"
SHARDED_DIR = "dcp"  # where a sharded (FSDP) checkpoint keeps its torch.distributed.checkpoint files
SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
LATENT_CONFIG_FILE = "latent_config.json"  # a latent model's LatentSettings
RUN_CONFIG_FILE = "run_config.json"  # the training config that produced a checkpoint
ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE = "adapter_config.json", "adapter_model.safetensors"  # a LoRA adapter's
RESUMABLE_STATE = "state.json"  # what marks a resumable training checkpoint (dgrpo.training.checkpoint writes it)


#: what to do about a weights file that cannot be read (a header cut short, a damaged file)
UNREADABLE_WEIGHTS = "cut short or damaged: copy it again from where it came from"


class CheckpointError(FileNotFoundError):
    """A checkpoint that does not exist, does not hold a model, or is damaged (the message is one line)."""


def read_json_object(path: Path) -> dict:
    """The JSON object a checkpoint's config file holds (``latent_config.json``, ``run_config.json``); a
    CheckpointError naming the file when it is not valid JSON or not an object (hand-edited: a traceback before)."""
    try:
        value = json.loads(path.read_text())
    except ValueError as e:  # (JSONDecodeError is a ValueError; UnicodeDecodeError too)
        raise CheckpointError(f"{path} is not valid: {e}") from None
    if not isinstance(value, dict):
        raise CheckpointError(f"{path} is not valid: it holds a JSON {type(value).__name__}, not an object")
    return value


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fsync_dir(path: Path) -> None:
    """Flush a directory's entries to disk (best effort: not every filesystem supports it)."""
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def manifest_bytes(entries: dict[str, str]) -> bytes:
    """A ``manifest.json``'s content: ``entries`` (a file's path below its directory -> its sha256)."""
    return json.dumps(entries, indent=1).encode()


def write_manifest(directory: Path) -> None:
    """``manifest.json``: the sha256 of every file below ``directory`` (nested manifests included); the files first
    given the mode a new file gets here (:func:`open_as_usual`)."""
    open_as_usual(directory)
    files = sorted(p for p in directory.rglob("*") if p.is_file() and p != directory / MANIFEST)
    manifest = {str(p.relative_to(directory)): sha256(p) for p in files}
    _new_file(directory / MANIFEST, manifest_bytes(manifest))  # (never through a hard link)


def open_as_usual(directory: Path) -> None:
    """Files below ``directory`` that their writer made owner-only (mode 0600) get the mode an ordinary new file gets
    here (the umask's, e.g. 0644, as config.json has): safetensors 0.8 writes through a temporary file of mode 0600
    whatever the umask (safetensors#782), so a group on a shared machine could read every file of a checkpoint but
    its weights. Nothing changes where new files are 0600 anyway (a umask of 077)."""
    probe = directory / ".mode-probe"
    os.close(os.open(probe, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o666))
    try:
        usual = probe.stat().st_mode & 0o777
    finally:
        probe.unlink()
    if usual == 0o600:
        return
    for p in directory.rglob("*"):
        if p.is_file() and not p.is_symlink() and p.stat().st_mode & 0o777 == 0o600:
            p.chmod(usual)


def verify(directory: Path, required: tuple[str, ...] = ()) -> str | None:
    """None when ``directory`` is complete and intact, else what is wrong (one line): the manifest must exist,
    every file it lists must match its checksum, and every ``required`` file must be listed (so a planted or
    truncated manifest cannot vouch for a directory that lacks a file). A required entry ``a|b`` is met by either."""
    man = directory / MANIFEST
    if not man.is_file():
        return "no manifest (incomplete write)"
    manifest = _entries(man)
    if manifest is None:
        return "unreadable manifest"
    for alternatives in required:
        if not any(name in manifest for name in alternatives.split("|")):
            return f"the manifest does not list {alternatives.replace('|', ' or ')}"
    for rel, digest in manifest.items():
        p = directory / rel
        if not p.is_file():
            return f"missing file {rel}"
        if sha256(p) != digest:
            return f"checksum mismatch in {rel}"
    return None


def check_intact(directory: Path, required: tuple[str, ...] = ()) -> None:
    """A directory dgrpo wrote with a manifest, checked against it before it is read (none: nothing to check): a
    :class:`CheckpointError` line saying what is wrong (:func:`verify`) and, for a changed or missing file, how to
    use the directory anyway."""
    if not (directory / MANIFEST).is_file():
        return
    problem = verify(directory, required)
    if problem is not None:
        edited = problem.startswith(("checksum mismatch", "missing file"))
        hint = f" (changed since dgrpo wrote it; if the change is yours, delete {MANIFEST} to load it)"
        # (no manifest: the next line said the model, or its tokenizer, was not there)
        if _needed_file_missing(problem, required, directory):
            hint = " (removed since dgrpo wrote it, and the model does not load without it: put it back, or copy the "
            hint += "whole directory again)"
        raise CheckpointError(f"checkpoint {directory} is damaged: {problem}{hint if edited else ''}")


def _needed_file_missing(problem: str, required: tuple[str, ...], directory: Path) -> bool:
    """Whether :func:`verify`'s ``problem`` is a missing file that loading needs: weights, the tokenizer's config, its
    ``tokenizer.json`` (the only file of the tokens added to its vocabulary, dgrpo's latent markers among them: the
    other vocabulary files, converted, lack them), a file without which no whole vocabulary is left
    (:func:`has_tokenizer_files`: its last one, or a ``vocab.json``'s ``merges.txt``), or one of ``required``."""
    if not problem.startswith("missing file "):
        return False
    name = problem.removeprefix("missing file ")
    loaded = ("config.json", ADAPTER_CONFIG_FILE, TOKENIZER_CONFIG, TOKENIZER_JSON)
    needed = name.endswith(".safetensors") or Path(name).name in loaded
    vocabulary = any(Path(name).match(pattern) for pattern in (*TOKENIZER_FILES, *VOCABULARY_PAIRS.values()))
    needed = needed or (vocabulary and not has_tokenizer_files((directory / name).parent))
    return needed or any(name in alternatives.split("|") for alternatives in required)


#: the files one of which a tokenizer directory holds (its vocabulary, in one of transformers' formats)
TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "vocab.txt", "*.model", "*.tiktoken")
#: a fast tokenizer's one file (its vocabulary, settings and added tokens), the file transformers 5 saves
TOKENIZER_JSON = TOKENIZER_FILES[0]
#: a vocabulary file of :data:`TOKENIZER_FILES` that loads only with another beside it: a BPE vocabulary's merges
#: (GPT-2's and Qwen's files; transformers: "`vocab` and `merges` must be both be from memory or both filenames")
VOCABULARY_PAIRS = {"vocab.json": "merges.txt"}
#: :data:`TOKENIZER_FILES` as a message lists them, each with the file it needs beside it
TOKENIZER_FILES_SAID = ", ".join(
    f"{f} with {VOCABULARY_PAIRS[f]}" if f in VOCABULARY_PAIRS else f for f in TOKENIZER_FILES
)
#: the tokenizer's settings (its special and added tokens: dgrpo's latent markers), saved beside its vocabulary
TOKENIZER_CONFIG = "tokenizer_config.json"


def has_tokenizer_files(folder: Path) -> bool:
    """Whether a directory holds a tokenizer's vocabulary whole: one of :data:`TOKENIZER_FILES`, with the file
    :data:`VOCABULARY_PAIRS` names beside it (a ``vocab.json`` alone does not load: its ``merges.txt`` is needed)."""
    return any(
        any(folder.glob(pattern))
        and (pattern not in VOCABULARY_PAIRS or (folder / VOCABULARY_PAIRS[pattern]).is_file())
        for pattern in TOKENIZER_FILES
    )


def no_tokenizer_files(folder: Path) -> str:
    """What a directory without a whole vocabulary (:func:`has_tokenizer_files`) lacks, for a message: none of
    :data:`TOKENIZER_FILES`, or the file a vocabulary file there needs beside it (and none of the others)."""
    half = [f for f in VOCABULARY_PAIRS if (folder / f).is_file()]
    if not half:
        return f"none of {TOKENIZER_FILES_SAID}"
    others = ", ".join(f for f in TOKENIZER_FILES if f not in VOCABULARY_PAIRS)
    return f"{half[0]} without the {VOCABULARY_PAIRS[half[0]]} it needs beside it, and none of {others}"


def _entries(manifest: Path) -> dict | None:
    """A manifest file's entries (path -> sha256); None when it is not JSON text or not an object (it vouches for
    nothing). An OSError reading it is the caller's."""
    try:
        return read_json_object(manifest)
    except CheckpointError:
        return None


def _listed(directory: Path) -> dict | None:
    """The files ``directory``'s manifest lists (path -> sha256); None when it cannot be read or is no object."""
    try:
        return _entries(directory / MANIFEST)
    except OSError:
        return None


def unlisted_files(directory: Path) -> list[str]:
    """The files below ``directory`` that its manifest does not list (none when the manifest cannot be read)."""
    manifest = _listed(directory)
    return [] if manifest is None else _not_in(directory, manifest)


def _not_in(directory: Path, manifest: dict) -> list[str]:
    """The files below ``directory`` (its manifest aside) that ``manifest`` does not list, sorted."""
    files = (str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file() and p != directory / MANIFEST)
    return sorted(f for f in files if f not in manifest)


def is_written_checkpoint(folder: Path) -> bool:
    """Whether ``folder`` is a checkpoint dgrpo wrote: a model directory (it holds a manifest) or a resumable
    training checkpoint."""
    return (folder / MANIFEST).is_file() or (folder / RESUMABLE_STATE).is_file()


def enclosing_checkpoint(path: Path, levels: int = 3) -> Path | None:
    """The nearest of ``path``'s parents (up to ``levels`` up) that is a checkpoint dgrpo wrote
    (:func:`is_written_checkpoint`); None when there is none. A folder written there would sit outside the
    checkpoint's manifest (and a run's ``--resume never`` would delete it)."""
    return next((f for f in list(path.absolute().parents)[:levels] if is_written_checkpoint(f)), None)


def check_replaceable(final: Path) -> None:
    """CheckpointError (one line, nothing written) unless ``final`` may be replaced by a directory dgrpo writes: it
    does not exist, is empty, or is a directory written here (it holds a readable manifest) with no file the manifest
    does not list. A run directory, a folder of the user's files (one with a manifest.json that is not ours, or that
    cannot be read), or one of ours with the user's files added is refused."""
    if not final.exists() or (final.is_dir() and not any(final.iterdir())):
        return
    if not (final / MANIFEST).is_file():
        raise CheckpointError(
            f"{final} exists and is not a model directory dgrpo wrote (it has no {MANIFEST}): not replacing it; "
            "name a new or empty directory"
        )
    manifest = _listed(final)
    if manifest is None:  # (it vouches for nothing: the folder's files may be anyone's)
        raise CheckpointError(
            f"{final} has a {MANIFEST} that cannot be read: not replacing it, which would delete its files; move them "
            "out or name a new directory"
        )
    extra = _not_in(final, manifest)
    if extra:
        raise CheckpointError(
            f"{final} holds files dgrpo did not write ({first_items(extra)}; not in its {MANIFEST}): not "
            "replacing it, which would delete them; move them out or name a new directory"
        )


@contextmanager
def atomic_dir(final: Path) -> Iterator[Path]:
    """Write a directory atomically: yields a fresh temporary sibling to fill; on success writes its manifest and
    renames it to ``final`` (``~`` expanded; replacing an existing one); on an exception removes it and re-raises.
    An existing ``final`` is replaced only when it is empty or a directory written here that holds nothing its
    manifest does not list (:func:`check_replaceable`): anything else is refused before anything is written."""
    final = expand_home(final).resolve()  # ('.' has no name to build the temporary sibling from)
    check_replaceable(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".tmp-{final.name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        yield tmp
        write_manifest(tmp)
        fsync_dir(tmp)
        if os.environ.get("DGRPO_TEST_CRASH_BEFORE_PUBLISH") == final.name:  # test hook: die before the rename
            os.kill(os.getpid(), 9)
        replace_dir(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_text_atomically(path: Path, text: str) -> None:
    """Write ``text`` to the file ``path`` whole or not at all: to a hidden temporary sibling (``.NAME.tmp``), renamed
    over ``path``; on any failure (a full disk, a stop) the temporary file is removed, ``path`` is as it was, and the
    error is raised again."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def replace_dir(src: Path, dst: Path) -> None:
    """Move the complete directory ``src`` to ``dst``; an existing ``dst`` is moved aside first and deleted after,
    so at every moment either the old or the new directory is complete on disk."""
    old = dst.parent / f".old-{dst.name}-{os.getpid()}"
    if dst.exists():
        if old.exists():
            shutil.rmtree(old)
        os.replace(dst, old)
    os.replace(src, dst)
    fsync_dir(dst.parent)
    shutil.rmtree(old, ignore_errors=True)


def remove_dir(path: Path) -> None:
    """Delete the directory ``path``, renamed first to the leftover name of :func:`atomic_dir` (``.tmp-NAME-PID``,
    which a run's start removes), so that a stop during the deletion leaves no half directory under its own name."""
    doomed = path.parent / f".tmp-{path.name}-{os.getpid()}"
    shutil.rmtree(doomed, ignore_errors=True)
    os.replace(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


@contextmanager
def rewritten(directory: Path) -> Iterator[Path]:
    """Change a directory dgrpo wrote as one: yields a copy of it made of hard links (no data copied; a plain copy
    where links fail), to change by replacing files, never by writing into one (that would write through the link
    into ``directory``); on success it is renamed into place by :func:`replace_dir`, so at every moment
    ``directory`` is complete and intact; on an exception the copy is removed and ``directory`` is as it was."""
    directory = Path(directory)
    tmp = directory.parent / f".tmp-{directory.name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        shutil.copytree(directory, tmp, copy_function=_link_or_copy)
        yield tmp
        fsync_dir(tmp)
        replace_dir(tmp, directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def rewrite_files(directory: Path, changes: dict[str, bytes]) -> None:
    """Give files of a directory dgrpo wrote new content (``changes``: path relative to ``directory`` -> bytes), with
    every manifest below ``directory`` that lists a changed file (or a changed manifest) given its new checksum.
    Atomic (:func:`rewritten`)."""
    with rewritten(directory) as tmp:
        for rel, content in changes.items():
            _new_file(tmp / rel, content)
        _relist(tmp, {tmp / rel for rel in changes})


def _link_or_copy(src: str, dst: str) -> None:
    """A hard link to ``src`` at ``dst`` (a copy where the file system has none)."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _new_file(path: Path, content: bytes) -> None:
    """``content`` at ``path`` as a new file: a hard link there is unlinked first (its original is left as it was)."""
    path.unlink(missing_ok=True)
    path.write_bytes(content)


def _relist(directory: Path, changed: set[Path]) -> None:
    """The manifests below ``directory``, deepest first, with the checksums of the ``changed`` files they list (a
    manifest so rewritten counts as changed for the manifests above it)."""
    manifests = sorted(directory.rglob(MANIFEST), key=lambda p: len(p.parts), reverse=True)
    for manifest in manifests:
        listed = _entries(manifest)
        if listed is None:
            continue  # (not one to keep consistent: it vouches for nothing now)
        here = manifest.parent
        stale = [p for p in changed if here in p.parents and str(p.relative_to(here)) in listed]
        if stale:
            listed.update({str(p.relative_to(here)): sha256(p) for p in stale})
            _new_file(manifest, manifest_bytes(listed))
            changed.add(manifest)


def holds_weights(folder: Path) -> bool:
    """Whether the model folder ``folder`` holds weights as loading reads them: ``model.safetensors``, or the index of
    Hugging Face's safetensors shards (another ``model*.safetensors``, a copy or a shard left alone, does not load)."""
    return (folder / SAFETENSORS).is_file() or (folder / SAFETENSORS_INDEX).is_file()


def read_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The state dict of a safetensors model directory (one file, or shards listed in the index)."""
    try:
        if (folder / SAFETENSORS).is_file():
            return load_file(str(folder / SAFETENSORS))
        index = folder / SAFETENSORS_INDEX
        if index.is_file():
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            state: dict[str, torch.Tensor] = {}
            for shard in shards:
                state.update(load_file(str(folder / shard)))
            return state
    except (SafetensorError, OSError, ValueError, KeyError) as e:
        raise CheckpointError(f"{folder}: unreadable weights ({one_line(e)}): {UNREADABLE_WEIGHTS}") from None
    raise CheckpointError(f"{folder}: no {SAFETENSORS} (dgrpo reads safetensors weights only, never pickles)")


def same_weights(a: nn.Module, b: nn.Module) -> bool:
    """Whether two models hold the same tensors to the bit (names, dtypes, shapes, values; on any devices): then
    they give the same answers (a best/ saved at the final step, or with no update after it)."""
    x, y = a.state_dict(), b.state_dict()
    return x.keys() == y.keys() and all(x[k].dtype == y[k].dtype and torch.equal(x[k], y[k].to(x[k].device)) for k in x)


def check_state_dict(model: nn.Module, state: dict[str, torch.Tensor], where: str) -> None:
    """Raise CheckpointError unless ``state`` holds exactly ``model``'s tensors with their shapes. A parameter tied
    to another (shared storage, e.g. a tied LM head) may be absent when one of its twins is present."""
    check_tensors(model.state_dict(), state, where, may_miss=lambda k: _tied_twin_present(model, k, state))


def check_tensors(
    own: dict[str, torch.Tensor],
    state: dict[str, torch.Tensor],
    where: str,
    may_miss: Callable[[str], bool] = lambda key: False,
) -> None:
    """Raise CheckpointError (one line, the first three names) unless ``state`` has exactly ``own``'s names (those
    ``may_miss`` allows may be absent) with ``own``'s shapes."""
    missing = [k for k in own if k not in state and not may_miss(k)]
    unexpected = [k for k in state if k not in own]
    shapes = [
        f"{k} {tuple(t.shape)} vs {tuple(own[k].shape)}"
        for k, t in state.items()
        if k in own and t.shape != own[k].shape
    ]
    for what, names in (("missing tensors", missing), ("unexpected tensors", unexpected), ("wrong shapes", shapes)):
        if names:
            raise CheckpointError(f"{where}: {what}: {first_items(names)}")


def _tied_twin_present(model: nn.Module, key: str, state: dict[str, torch.Tensor]) -> bool:
    own = model.state_dict(keep_vars=True)
    ptr = own[key].data_ptr()
    return any(k in state for k, t in own.items() if k != key and t.data_ptr() == ptr)


def one_line(e: BaseException) -> str:
    """An exception as one short line (its first line; torch adds paragraphs of advice below it)."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:300]}" if text else type(e).__name__
