"""A run folder's hygiene: which entries of OUT/checkpoints are the run's (its checkpoints, what a killed or skipped
write left, a user's copy of a checkpoint) as the stop line, the start's checks and the resume read them, and the
run directory's lock."""

from __future__ import annotations

import argparse
import errno
import json
import os
from pathlib import Path

import pytest

from dgrpo.config import ConfigError, to_dict

from conftest import grpo_run_dir, loads_no_base, state_only_checkpoint, tiny_config


def test_the_stop_line_promises_a_resume_only_when_a_checkpoint_is_there(tmp_path):
    """The stop line's hint reads checkpoints as the resume lists them (``step-N`` folders): a user's copy
    ``step-00000003.bak`` or a file ``step-00000003`` is no checkpoint the same command resumes (it starts over), so
    the line says none was written; a ``step-N`` folder beside them is one."""
    from dgrpo.cli import _resume_hint
    from dgrpo.training.checkpoint import list_checkpoints

    out = tmp_path / "run"
    root = out / "checkpoints"
    (root / "step-00000003.bak").mkdir(parents=True)
    (root / "step-00000002").write_text("a note")
    args = argparse.Namespace(cmd="grpo", out=str(out), resume="auto")
    assert list_checkpoints(out) == []
    assert _resume_hint(args) == "; no checkpoint was written yet: the same command starts the run again"
    state_only_checkpoint(root / "step-00000004")
    assert _resume_hint(args) == f"; the same command resumes from the newest checkpoint in {root}"


def test_a_folder_in_checkpoints_that_no_run_left_is_refused_whatever_its_name_holds(tmp_path):
    """A folder in OUT/checkpoints whose name merely holds ``step-`` (``old-step-x`` holding a user's notes) is not the
    run's: refused before anything is written (``--resume never`` deleted it without a word); what a run leaves there
    (its checkpoints, a killed write's leftovers, a skipped checkpoint moved aside), a user's copy named after its step
    and a folder holding a checkpoint (a copy, whatever its name, which --resume may name) are not."""
    from dgrpo.training.checkpoint import foreign_entries

    out = tmp_path / "run"
    root = out / "checkpoints"
    state_only_checkpoint(root / "step-00000002")
    state_only_checkpoint(root / "kept")
    run_made = [".tmp-step-00000004-77", ".tmp-step-00000004-shards", ".old-step-00000002-77", "damaged-step-00000003"]
    for name in [*run_made, "damaged-step-00000003-2", "step-00000002-copy"]:
        (root / name).mkdir()
    assert foreign_entries(out) == []
    grpo_run_dir(out).close()
    (root / "old-step-x").mkdir()
    (root / "old-step-x" / "notes.txt").write_text("mine")
    (root / "step-notes").mkdir()
    assert foreign_entries(out) == ["old-step-x", "step-notes"]
    with pytest.raises(ConfigError, match=r"holds old-step-x, step-notes, not dgrpo checkpoints: name a new"):
        grpo_run_dir(out, resume="never")
    assert (root / "old-step-x" / "notes.txt").read_text() == "mine"


def _resume_on_a_full_disk(out: Path, name: str, monkeypatch) -> None:
    """Resume the GRPO run in ``out`` at step 1 on a disk full for ``name``: its start is one line naming the file and
    the space left; the disk has room again after it."""
    from dgrpo.model.verified import CheckpointError

    write = Path.write_text
    with grpo_run_dir(out) as run:
        run.resume(loads_no_base)
        monkeypatch.setattr(Path, "write_text", _full_disk_for(name.split(".")[0]))
        with pytest.raises(CheckpointError, match=rf"could not write {name} \(no space left on the device; "):
            run.start({"step": 1, "metrics_lines": 0})
    monkeypatch.setattr(Path, "write_text", write)


def _resume(out: Path):
    """The GRPO run in ``out`` resumed and started at step 1."""
    with grpo_run_dir(out) as run:
        run.resume(loads_no_base)
        run.start({"step": 1, "metrics_lines": 0})
    return run


def _full_disk_for(part: str):
    """``Path.write_text`` on a disk that is full for a file whose name holds ``part``: the file is opened (cut to
    nothing), then nothing fits; other files are written as usual."""
    write = Path.write_text

    def full(self, *a, **k):
        if part in self.name:
            open(self, "w").close()
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return write(self, *a, **k)

    return full


def test_a_full_disk_while_a_resume_cuts_the_rollouts_leaves_them_as_they_were(tmp_path, monkeypatch):
    """A resume keeps the rollout rows of the steps before its checkpoint: rewritten in place, a full disk left
    rollouts.jsonl cut (here empty: every earlier row lost, and the next resume kept what was left without a word).
    Now one line naming the file and the space left, the file as it was, no temporary file beside it."""

    out = tmp_path / "run"
    state_only_checkpoint(out / "checkpoints" / "step-00000001")
    rows = '{"step": 0}\n{"step": 1}\n'
    (out / "rollouts.jsonl").write_text(rows)
    _resume_on_a_full_disk(out, "rollouts.jsonl", monkeypatch)
    assert (out / "rollouts.jsonl").read_text() == rows
    assert not list(out.glob(".rollouts*"))
    _resume(out)
    assert (out / "rollouts.jsonl").read_text() == '{"step": 0}\n'


def test_a_full_disk_while_a_resume_writes_the_config_leaves_it_as_it_was(tmp_path, monkeypatch):
    """config.json written in place on a full disk was left empty: the error's line said the same command resumes,
    and the same command was refused (its config.json not a dgrpo run's). Now one line, config.json as it was, and
    the same command resumes."""

    out = tmp_path / "run"
    state_only_checkpoint(out / "checkpoints" / "step-00000001")
    config = json.dumps(to_dict(tiny_config()))
    (out / "config.json").write_text(config)
    _resume_on_a_full_disk(out, "config.json", monkeypatch)
    assert (out / "config.json").read_text() == config and not list(out.glob(".config*"))
    run = _resume(out)
    assert run.checkpoint == out / "checkpoints" / "step-00000001"


def test_a_second_run_started_as_the_first_takes_the_lock_names_the_first_not_an_unknown_pid(tmp_path):
    """The holder takes the lock, empties the lock file, then writes its PID: a second run reading the file in
    between read nothing and said ``PID unknown``. It now reads again while the file is empty (here the holder
    writes its PID 50 ms after taking the lock), and names it; still refused."""
    import fcntl
    import threading

    from dgrpo.training.out_dir import RunLock

    path = tmp_path / ".lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # (the first run, between its lock and its PID's write)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    writes = threading.Timer(0.05, lambda: os.write(fd, b"4242\n"))
    writes.start()
    try:
        with pytest.raises(ConfigError, match=r"is in use by another dgrpo process \(PID 4242\)"):
            RunLock(tmp_path)
    finally:
        writes.join()
        os.close(fd)
    RunLock(tmp_path).release()


def test_a_refused_run_removes_the_directory_it_made_while_it_still_holds_the_lock(tmp_path, monkeypatch):
    """A run refused at its start removes the directory it made, still empty; it did so after releasing the lock, so
    a second run on the same --out that took the lock in between had its directory deleted under it. The removal now
    comes first, the lock still held (its file unlinked, the folders removed while empty): a second run that takes
    the lock then (in a lock file of its own) keeps its directory, and the refused run's is removed otherwise."""
    from dgrpo.training import out_dir
    from dgrpo.training.out_dir import RunLock

    out = tmp_path / "made"
    held: list[RunLock] = []
    remove_made = out_dir.remove_made

    def second_run_first(path, made):
        assert not (out / ".lock").exists()  # (unlinked, the lock still held)
        held.append(RunLock(out))
        return remove_made(path, made)

    monkeypatch.setattr(out_dir, "remove_made", second_run_first)
    with pytest.raises(ConfigError, match="no such checkpoint directory"):
        grpo_run_dir(out, resume=str(tmp_path / "nowhere" / "step-00000002"))
    assert len(held) == 1 and (out / ".lock").is_file()  # (the second run's directory kept, with its lock)
    held[0].release()
    monkeypatch.setattr(out_dir, "remove_made", remove_made)
    other = tmp_path / "other"
    with pytest.raises(ConfigError, match="no such checkpoint directory"):
        grpo_run_dir(other, resume=str(tmp_path / "nowhere" / "step-00000002"))
    assert not other.exists()


def test_a_lock_file_removed_between_its_open_and_its_lock_is_not_the_one_held(tmp_path, monkeypatch):
    """Another process removes the lock file (a refused run removing the directory it made, ``rm``) after this run
    opened it and before it locked it: the lock was held on a file no other run opens, and a second run created
    a new lock file and went on beside it. The lock is now taken on the file at the path, checked after locking;
    a directory removed meanwhile is one line."""
    from dgrpo.training import out_dir
    from dgrpo.training.out_dir import RunLock

    flock = out_dir.fcntl.flock
    removed: list[int] = []

    def removed_first(fd, how):
        if not removed and how & out_dir.fcntl.LOCK_EX:
            removed.append(fd)
            (tmp_path / ".lock").unlink()
        return flock(fd, how)

    monkeypatch.setattr(out_dir.fcntl, "flock", removed_first)
    lock = RunLock(tmp_path)
    assert removed
    with pytest.raises(ConfigError, match="is in use by another dgrpo process"):
        RunLock(tmp_path)
    lock.release()
    gone = tmp_path / "gone"
    gone.mkdir()

    def directory_removed_first(fd, how):
        (gone / ".lock").unlink()
        gone.rmdir()
        return flock(fd, how)

    monkeypatch.setattr(out_dir.fcntl, "flock", directory_removed_first)
    with pytest.raises(ConfigError, match=r"gone was removed as this run started: run it again"):
        RunLock(gone)


def test_a_rewind_of_a_finished_run_removes_the_abandoned_end(tmp_path):
    """A rewind of a finished run to one of its earlier checkpoints abandons the steps after it, its end included:
    final/ and summary.json (written after the last checkpoint) were kept until the rewound run's own end, so a stop
    before it left them, reading as the rewound run's finished model and summary. They go with the later checkpoints;
    a resume of the newest checkpoint (nothing abandoned) keeps them."""
    out = tmp_path / "run"
    root = out / "checkpoints"
    two, four = state_only_checkpoint(root / "step-00000002"), state_only_checkpoint(root / "step-00000004")
    (out / "final").mkdir()
    (out / "final" / "manifest.json").write_text("{}")
    (out / "summary.json").write_text("{}")
    with grpo_run_dir(out, resume=str(four)) as run:
        run.resume(loads_no_base)
        run.start({"step": 4, "metrics_lines": 0})
    assert (out / "final").is_dir() and (out / "summary.json").is_file()
    with grpo_run_dir(out, resume=str(two)) as run:
        run.resume(loads_no_base)
        run.start({"step": 2, "metrics_lines": 0})
    assert not (out / "final").exists() and not (out / "summary.json").exists() and not four.exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root opens and writes whatever its mode bits say")
def test_a_lock_file_or_out_dir_this_user_cannot_write_is_one_line(tmp_path):
    """A run directory in a shared folder whose lock file another user's run made (here: made read-only) was a
    PermissionError traceback at ``dgrpo grpo --out OUT``; it is one line naming the file and its owner. An --out
    inside a directory this user cannot write into is one line too."""
    out = tmp_path / "run"
    out.mkdir()
    (out / ".lock").write_text("4242\n")
    (out / ".lock").chmod(0o444)
    with pytest.raises(ConfigError, match=r"\.lock, the run directory's lock file, cannot be opened for writing"):
        grpo_run_dir(out)
    shut = tmp_path / "shut"
    shut.mkdir()
    shut.chmod(0o555)
    try:
        with pytest.raises(ConfigError, match=r"--out .*shut/run: cannot write there \(Permission denied\)"):
            grpo_run_dir(shut / "run")
    finally:
        shut.chmod(0o755)


def test_a_lock_file_refused_by_the_system_is_one_line_naming_its_owner(tmp_path, monkeypatch):
    """The same refusal, as the system gives it to a user who may not open another's lock file (as root too, where
    modes refuse nothing): a ConfigError naming the file, its owner and what to do, not a PermissionError."""
    import pwd

    from dgrpo.training import out_dir

    lock = tmp_path / ".lock"
    lock.write_text("4242\n")
    opened = out_dir.os.open

    def refused(path, *a, **k):
        if Path(path) == lock:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return opened(path, *a, **k)

    monkeypatch.setattr(out_dir.os, "open", refused)
    owner = pwd.getpwuid(os.getuid()).pw_name
    with pytest.raises(ConfigError) as e:
        out_dir.RunLock(tmp_path)
    assert str(e.value).startswith(f"{lock}, the run directory's lock file, cannot be opened for writing")
    assert f"belongs to user {owner}" in str(e.value) and "use another --out" in str(e.value)
