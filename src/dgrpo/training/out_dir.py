"""Where a command may write: an output path is checked not to be inside a checkpoint or another kind of folder, what
marks a folder as a training run's, and the run directory's exclusive lock."""

from __future__ import annotations

import fcntl
import json
import os
import pwd
import stat
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

from ..config import ConfigError
from ..model.verified import enclosing_checkpoint, is_written_checkpoint
from ..run_layout import (
    APPLIED_FILE,
    BEST_DIR,
    CHECKPOINTS_DIR,
    CONFIG_FILE,
    FINAL_DIR,
    LOCK_FILE,
    METRICS_FILE,
    ROLLOUTS_FILE,
    RUN_WRITES,
    SUMMARY_FILE,
    TB_DIR,
    WANDB_DIR,
    checkpoint_dirs,
    results_dir,
)


def check_output_path(path: Path | str, what: str = "--out", *, model_dir: bool = False) -> None:
    """Fail early, in one line, when ``path`` cannot hold a command's output: an existing file, a place that cannot
    be written (a probe file is written and removed in ``path`` or its nearest existing parent; nothing is created),
    or a folder inside a checkpoint dgrpo wrote (a run, results or a model written there would change the files its
    manifest vouches for), or, unless ``model_dir`` (the output is itself a model directory, which dgrpo may
    replace), such a checkpoint itself."""
    if not str(path).strip():
        raise ConfigError(f"{what} is empty: name a directory")
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{what} {path} exists and is not a directory")
    _refuse_inside_checkpoint(path, what, itself=not model_dir)
    parent = path
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(f"{what} {path}: {parent} is not a directory")
    try:
        probe = parent / f".dgrpo-write-probe-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise ConfigError(f"{what} {path}: cannot write there ({e.strerror or e})") from None


def _refuse_inside_checkpoint(path: Path, what: str, itself: bool = True) -> None:
    """ConfigError when ``path`` is (``itself``), or lies inside, a model checkpoint or resumable checkpoint dgrpo
    wrote."""
    folder = path if itself and is_written_checkpoint(path) else enclosing_checkpoint(path)
    if folder is not None:
        where = "is" if folder == path else f"lies inside {folder},"
        raise ConfigError(
            f"{what} {path} {where} a checkpoint dgrpo wrote: writing there would change the files it holds; "
            "name a new directory"
        )


def is_run_config(path: Path) -> bool:
    """Whether ``path`` holds a dgrpo run's config (a JSON object with the config's sections)."""
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(found, dict) and {"model", "task", "data"} <= set(found)


def check_not_a_training_run(path: Path | str, what: str = "--out") -> None:
    """ConfigError when ``path`` is a training run's directory (its config.json, metrics or checkpoints): dgrpo eval's
    and the demo's files would mix with the run's (results.json beside its checkpoints); or a folder the run writes
    itself, or one inside it (``RUN/eval``: the run's own test-set results, replaced without a word, and removed
    with the run's files by ``--resume never``)."""
    path = Path(path)
    if _is_training_run(path):
        raise ConfigError(
            f"{what} {path} is a training run's directory: name a folder of its own (e.g. {path / 'mine'})"
        )
    for run, own in ((path.parent, path.name), (path.parent.parent, path.parent.name)):
        if own in RUN_WRITES and _is_training_run(run):
            raise ConfigError(
                f"{what} {path}: {run / own} is where the training run {run} keeps its own files: name a folder of "
                f"its own (e.g. {run / 'mine'})"
            )


def _is_training_run(path: Path) -> bool:
    """Whether ``path`` is a training run's directory: its config.json, metrics or checkpoints."""
    config = path / CONFIG_FILE
    return (
        (config.is_file() and is_run_config(config))
        or (path / METRICS_FILE).is_file()
        or (path / CHECKPOINTS_DIR).is_dir()
    )


def is_run_metrics(path: Path) -> bool:
    """Whether ``path`` is a run's ``metrics.jsonl``: empty (as a run opens it), or its first line a row with a step."""
    try:
        with open(path) as f:
            first = f.readline()
    except OSError:
        return False
    try:
        row = json.loads(first) if first.strip() else {"step": None}
    except ValueError:
        return False
    return isinstance(row, dict) and "step" in row


def check_output_dir(path: Path, what: str = "--out") -> Path:
    """``path`` can hold a run: checked (:func:`check_output_path`), then created."""
    check_output_path(path, what)
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"{what} {path}: cannot create it ({e.strerror or e})") from None
    return Path(path)


def check_run_writes(
    out: Path | str,
    command: str,
    resume: str,
    log_rollouts: int,
    option: str = "--out",
    *,
    keep_last: int = 0,
    tests: Sequence[str] = (),
    backends: Sequence[str] = (),
    best: bool = True,
) -> None:
    """ConfigError, at a run's start, when what the run writes into in place in ``out`` (the files it replaces whole, or
    removes, aside) is there and not writable to this user (another user's: a shared folder, a run started as root; or
    made read-only), or is a folder where the run writes a file: ``metrics.jsonl`` (a folder of that name: a traceback
    as the run opened it), ``config.json``, ``applied.json`` and a GRPO run's ``summary.json`` (their writes failed once
    the model loaded; summary.json's at the run's end, hours in), ``checkpoints/``, where a resumed run writes its
    checkpoints (a full one's write, at the first checkpoint, was refused there), its ``step-N`` folders, which it
    removes past ``keep_last`` (a traceback at the first rotation, minutes in), a GRPO run's ``rollouts.jsonl``
    (``grpo.log_rollouts`` above 0), whose first rollouts' append, minutes into the run, was a PermissionError
    traceback, the folders of the test sets' results (``tests``: ``data.test``, written at the run's end) and of the
    trackers (``backends``: TensorBoard's ``tb/``, W&B's ``wandb/``): ``eval_best/``'s only when the run tests best/ too
    (``best``: :func:`tests_best`; an SFT run without ``sft.eval_every_epoch`` was refused for an ``eval_best/`` it
    never writes). But for ``metrics.jsonl`` and ``config.json``, not under ``--resume never``, which removes them first
    (:func:`check_removable`). ``option``: how the refusal names another run directory (from Python: ``--out
    (out_dir)``)."""
    out = Path(out)
    _check_run_files(out, command, resume, option)
    if resume == "never":
        return
    folder = out / CHECKPOINTS_DIR
    if folder.is_dir() and not os.access(folder, os.W_OK | os.X_OK):
        raise _not_writable(folder, "the run writes its checkpoints in it", option)
    for step in checkpoint_dirs(out) if keep_last > 0 else []:
        if (stuck := _not_removable(step)) is not None:
            why = f"the run removes its checkpoints past the newest {keep_last} (keep_last), {step.name} among them"
            raise _not_writable(stuck, why, option)
    if command == "grpo" and log_rollouts > 0:
        rollouts, why = out / ROLLOUTS_FILE, "the run appends its rollouts to it (grpo.log_rollouts)"
        if rollouts.exists() and not rollouts.is_file():
            raise _not_a_file(rollouts, why, option)
        if rollouts.is_file() and not os.access(rollouts, os.W_OK) and not _replaceable(rollouts):
            raise _not_writable(rollouts, why, option)  # (one it may replace, RunDir.start replaces first)
    _check_run_folders(out, tests, backends, best, option)


def check_config_writes(out: Path | str, cfg: dict, command: str, resume: str, option: str = "--out") -> None:
    """:func:`check_run_writes` for a run of ``command`` under ``cfg`` (its config as a dict): what it writes, as its
    options say (``grpo.log_rollouts``, ``keep_last``, ``data.test``, ``logging.backends``, :func:`tests_best`), for
    the command line before the model loads and RunDir under its lock alike."""
    section, data = cfg.get(command) or {}, cfg.get("data") or {}
    check_run_writes(
        out,
        command,
        resume,
        (cfg.get("grpo") or {}).get("log_rollouts", 0),
        option,
        keep_last=section.get("keep_last", 0),
        tests=data.get("test", []),
        backends=(cfg.get("logging") or {}).get("backends", []),
        best=tests_best(cfg, command),
    )


def _check_run_files(out: Path, command: str, resume: str, option: str) -> None:
    """:func:`check_run_writes`' refusal of a folder where the run writes a file of its own: ``metrics.jsonl`` and
    ``config.json`` (under ``--resume never`` too: it keeps them, and the run then writes them), ``applied.json`` and
    a GRPO run's ``summary.json``."""
    files = [
        (out / METRICS_FILE, "the run writes its metrics rows to it"),
        (out / CONFIG_FILE, "the run writes its config to it"),
    ]
    if resume != "never":
        files += [(out / APPLIED_FILE, "the run records the settings it applied in it")]
        files += [(out / SUMMARY_FILE, "the run writes its summary to it at its end")] if command == "grpo" else []
    for path, why in files:  # (a traceback once the model loaded; summary.json's, hours in, at the run's end)
        if path.exists() and not path.is_file():
            raise _not_a_file(path, why, option)


def _check_run_folders(out: Path, tests: Sequence[str], backends: Sequence[str], best: bool, option: str) -> None:
    """:func:`check_run_writes`' refusal of the folders the run writes in at its end, or as it goes, not writable to
    this user: the test sets' results (``eval/``, and ``eval_best/`` where ``best``) and the trackers' (``tb/``,
    ``wandb/``); a missing one's parent, where it is made."""
    why = "the run writes its test results in it"
    tested = (FINAL_DIR, BEST_DIR) if best else (FINAL_DIR,)
    places = [(results_dir(out, spec, name), why) for spec in tests for name in tested]
    places += [(out / TB_DIR, "the run writes its TensorBoard events in it")] if "tensorboard" in backends else []
    places += [(out / WANDB_DIR, "the run keeps its W&B files in it")] if "wandb" in backends else []
    for place, why in places:
        target = place if place.exists() else place.parent  # (made there when missing)
        if target.is_dir() and target != out and not os.access(target, os.W_OK | os.X_OK):
            raise _not_writable(target, why, option)


def tests_best(cfg: dict, command: str) -> bool:
    """Whether a run of ``command`` under ``cfg`` (a config as a dict) tests ``best/`` too, into ``eval_best/``: it
    keeps one (``grpo.save_best``; ``sft.eval_every_epoch``), chosen on validation (``data.valid``)."""
    section = cfg.get(command) or {}
    keeps = section.get("save_best", True) if command == "grpo" else section.get("eval_every_epoch", False)
    return bool(keeps) and bool((cfg.get("data") or {}).get("valid"))


def _replaceable(path: Path) -> bool:
    """Whether this user may replace the file ``path`` with a new one (a rename over it): its folder writable to it,
    and, in a folder with the sticky bit (``/tmp``, a shared folder), the file or the folder its own."""
    folder = path.parent
    if not os.access(folder, os.W_OK | os.X_OK):
        return False
    try:
        there, held = folder.stat(), path.stat()
    except OSError:
        return False
    return not there.st_mode & stat.S_ISVTX or os.geteuid() in (there.st_uid, held.st_uid)


def _not_removable(folder: Path) -> Path | None:
    """The first folder in ``folder`` (itself included; not through links) that this user may not empty: one it
    cannot list or write in; None when it may remove them all."""
    folders = [folder] + [
        Path(root) / d for root, dirs, _ in os.walk(folder) for d in dirs if not (Path(root) / d).is_symlink()
    ]
    return next((f for f in folders if not os.access(f, os.R_OK | os.W_OK | os.X_OK)), None)


def _not_a_file(path: Path, why: str, option: str) -> ConfigError:
    return ConfigError(f"{path} is a folder, not a file: {why}; move it out of {path.parent}, or use another {option}")


def _not_writable(path: Path, why: str, option: str = "--out") -> ConfigError:
    return ConfigError(
        f"{path} belongs to {_owner(path)} and is not {_lacking(path)} to you: {why}; have its owner make it "
        f"{_lacking(path)} to you, move it out of {path.parent}, or use another {option}"
    )


def _lacking(path: Path) -> str:
    """What this user may not do with ``path``, as a refusal says it: ``writable``, or a folder it may write in but
    not list (to empty it), ``readable``."""
    return "readable" if path.is_dir() and os.access(path, os.W_OK | os.X_OK) else "writable"


def check_removable(path: Path, what: str, option: str = "--out") -> None:
    """ConfigError when ``what`` (``--resume never``, a run restarted under another config) would delete ``path``
    (a folder: its files and folders, a linked one's through the link) and a folder in it is not writable to this
    user (another user's): its removal was a PermissionError traceback, partway (what was removed before it gone)."""
    if not path.is_dir():
        return
    folder = _not_removable(path)
    if folder is not None:  # (one that cannot be listed cannot be emptied either)
        raise ConfigError(
            f"{what} would delete {path}, and {folder} belongs to {_owner(folder)} and is not {_lacking(folder)} to "
            f"you: have its owner remove it (or make it {_lacking(folder)} to you), or name another {option}"
        )


def _owner(path: Path) -> str:
    """The user who owns ``path``, by name where the system knows it (else ``uid N``)."""
    try:
        uid = path.stat().st_uid
    except OSError:
        return "another user"
    try:
        return f"user {pwd.getpwuid(uid).pw_name}"
    except KeyError:
        return f"uid {uid}"


class RunLock:
    """An exclusive lock on a run directory for this process's lifetime (``flock``: the OS releases it when the
    process dies, however it dies). A second process on the same directory gets a one-line ConfigError naming
    the holder's PID. The lock is on the file at ``DIR/.lock`` once locked (checked: one removed in between is
    opened again), and that file is written in place, never replaced (a new file would be a new lock). ``created``:
    whether this lock made the file (:meth:`release` may then remove it). ``option``: how a refusal names another run
    directory (from Python: ``--out (out_dir)``)."""

    def __init__(self, directory: Path, option: str = "--out"):
        self.path, self.option = Path(directory) / LOCK_FILE, option
        self._fd: int | None = None
        self.created = False
        for _ in range(10):
            fd = self._open(directory)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                holder = self._holder()
                os.close(fd)
                raise ConfigError(
                    f"{directory} is in use by another dgrpo process (PID {holder}); wait for it to finish or use "
                    f"another {self.option}"
                ) from None
            if self._still_there(fd):
                break
            os.close(fd)  # (removed or replaced since it was opened: a lock on it locks out no other run)
        else:
            raise ConfigError(f"{self.path} is removed or replaced as fast as it is locked: use another {self.option}")
        self._fd = fd
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())

    def _open(self, directory: Path) -> int:
        """The lock file, opened (created if missing: then :attr:`created`); something else at its path (a user's
        folder, a FIFO, a link to nowhere) is one line (:meth:`_not_a_file`)."""
        fd = self._open_file(directory)
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # (a FIFO: an OSError traceback as its PID was written)
            os.close(fd)
            raise self._not_a_file(directory, "not a regular file")
        return fd

    def _open_file(self, directory: Path) -> int:
        try:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
                self.created = True
                return fd
            except FileExistsError:
                self.created = False
                return os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:
            if self.path.is_symlink():  # (it was "removed as this run started: run it again", at every run)
                raise self._not_a_file(directory, f"a link to {os.readlink(self.path)}, which is not there") from None
            # (a run refused as this one started removed the directory it had made)
            raise ConfigError(f"{directory} was removed as this run started: run it again") from None
        except IsADirectoryError:  # (a user's folder named .lock: an IsADirectoryError traceback)
            raise self._not_a_file(directory, "a folder") from None
        except PermissionError as e:  # (a shared folder: the directory writable, the lock file another user's)
            raise ConfigError(
                f"{self.path}, the run directory's lock file, cannot be opened for writing ({e.strerror}; it belongs "
                f"to {_owner(self.path)}): that user's run may be in {directory}; use another {self.option}, or have "
                "its owner make the file writable to you or remove it"
            ) from None
        except OSError as e:  # (a socket at its path, a full disk: a traceback)
            raise ConfigError(
                f"{self.path}, the run directory's lock file, cannot be opened ({e.strerror}): use another "
                f"{self.option}"
            ) from None

    def _not_a_file(self, directory: Path, what: str) -> ConfigError:
        """The refusal of ``what`` at the lock file's path."""
        return ConfigError(
            f"{self.path} is {what}, where a run keeps its lock file: move it out of {directory} (or remove it), or "
            f"use another {self.option}"
        )

    def _still_there(self, fd: int) -> bool:
        """Whether the file ``fd`` locks is still the lock file (another process may have removed it, its run directory
        with it, between the open and the lock: a lock on that file then held out no one, and two runs went on)."""
        try:
            now = os.stat(self.path)
        except FileNotFoundError:
            return False
        held = os.fstat(fd)
        return (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino)

    def _holder(self, wait_s: float = 0.5) -> str:
        """The PID the holder wrote in the lock file. A holder that has just taken the lock empties the file before it
        writes its PID: an empty file is read again for up to ``wait_s`` seconds (the line said ``PID unknown`` to a
        second run started at the same moment)."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                holder = self.path.read_text().strip()
            except OSError:
                holder = ""
            if holder or time.monotonic() >= deadline:
                return holder or "unknown"
            time.sleep(0.01)

    def release(self, remove: bool = False) -> None:
        """Unlock; ``remove``: the lock file first removed if this lock made it (a run refused once it held the lock
        leaves no file in the directory it was refused)."""
        if self._fd is not None:
            if remove and self.created:
                self.path.unlink(missing_ok=True)  # (while locked: a run that opened it meanwhile opens it again)
            os.close(self._fd)
            self._fd = None


@dataclass
class HeldRunDir:
    """The lock the command line took on a run directory before reading the data and loading the model
    (:func:`take_run_dir`), with the topmost folder it made for it (None: the directory was there)."""

    out: Path
    lock: RunLock
    made: Path | None

    def give_up(self) -> None:
        """Release the lock (no RunDir took it: the run was refused, or failed, before it trained), leaving nothing
        it made (:func:`release_leaving_nothing`)."""
        release_leaving_nothing(self.lock, self.out, self.made)


def release_leaving_nothing(lock: RunLock, out: Path, made: Path | None) -> None:
    """Release ``lock`` on ``out`` (a run refused, or failed, before it wrote anything): its lock file removed if it
    made it, then the folders it made (``made``: the topmost, :func:`topmost_missing`) while they hold nothing else,
    the lock still held (removed once unlocked, the directory was another run's when that run had taken the lock in
    between: deleted under it)."""
    if lock.created:
        lock.path.unlink(missing_ok=True)
    remove_made(out, made)
    lock.release()


def topmost_missing(out: Path) -> Path | None:
    """The topmost folder of ``out``'s path that is not there (``out`` itself, or one above it: what a run that makes
    ``out`` makes), None when ``out`` is there."""
    made = None
    while not out.exists():
        made, out = out, out.parent
    return made


def remove_made(out: Path, made: Path | None) -> None:
    """``out`` and the folders above it up to ``made`` (the topmost one a run made for it), while they are empty."""
    folder = out
    while made is not None and folder.is_relative_to(made):
        try:
            folder.rmdir()
        except OSError:  # (not empty: another run's now, or the user's)
            break
        folder = folder.parent


#: the run directory the command line holds the lock of, until the RunDir made on it takes the lock over
_HELD: ContextVar[HeldRunDir | None] = ContextVar("dgrpo_held_run_dir", default=None)


@contextmanager
def run_dir_scope() -> Iterator[None]:
    """Within the block (``dgrpo sft`` / ``dgrpo grpo``), the lock :func:`take_run_dir` takes is handed to the
    :class:`~.run.RunDir` made on its directory (:func:`adopt_run_dir`); one that no RunDir took when the block is left
    (a refusal before the model loads, a dataset or a model that failed to load) is given up
    (:meth:`HeldRunDir.give_up`: nothing of it is left)."""
    token = _HELD.set(None)
    try:
        yield
    finally:
        held = _HELD.get()
        _HELD.reset(token)
        if held is not None:
            held.give_up()


def take_run_dir(out: Path | str) -> None:
    """The command line's lock on the run directory ``out`` (made if missing), taken before the data is read and the
    model loaded (at the paper's scale those take minutes, after which another run holding ``out`` was refused) and
    held on to the run's end (:func:`run_dir_scope`): a run refused here makes nothing in ``out``."""
    out = Path(out)
    made = topmost_missing(out)
    check_output_dir(out)
    try:
        lock = RunLock(out)
    except BaseException:
        remove_made(out, made)
        raise
    _HELD.set(HeldRunDir(out, lock, made))


def adopt_run_dir(out: Path) -> HeldRunDir | None:
    """The lock the command line holds on ``out`` (:func:`take_run_dir`), handed over (it is no longer the command
    line's to give up); None when it holds none on that directory."""
    held = _HELD.get()
    if held is None or held.out.resolve() != Path(out).resolve():
        return None
    _HELD.set(None)
    return held
