"""A run directory's edges as a user meets them: a folder where the lock file goes, run files another user owns, a
user's copies in OUT/checkpoints under ``--resume never``, and the start's checks of OUT taken under the lock."""

from __future__ import annotations

import pytest

from dgrpo.config import ConfigError

from conftest import grpo_run_dir


def test_a_folder_named_like_the_lock_file_is_one_line(tmp_path):
    """OUT/.lock a folder (a user's): the run's start was an IsADirectoryError traceback; it is one line naming the
    folder and what to do, and the folder is left as it was."""
    out = tmp_path / "run"
    (out / ".lock").mkdir(parents=True)
    (out / ".lock" / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError) as e:
        grpo_run_dir(out)
    assert str(e.value) == (
        f"{out / '.lock'} is a folder, where a run keeps its lock file: move it out of {out} (or remove it), or use "
        "another --out (out_dir)"
    )
    assert (out / ".lock" / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("kind", ["fifo", "dangling link"])
def test_something_else_at_the_lock_files_path_is_one_line(tmp_path, kind):
    """OUT/.lock a FIFO was an OSError traceback (Invalid argument) as the run wrote its PID there; a link to a
    place that is not there said "OUT was removed as this run started: run it again", at every run. Each is one line
    naming what is there and what to do."""
    import os

    out = tmp_path / "run"
    out.mkdir()
    lock = out / ".lock"
    if kind == "fifo":
        os.mkfifo(lock)
        what = "not a regular file"
    else:
        lock.symlink_to(tmp_path / "gone" / "lock")
        what = f"a link to {tmp_path / 'gone' / 'lock'}, which is not there"
    with pytest.raises(ConfigError) as e:
        grpo_run_dir(out)
    assert str(e.value) == (
        f"{lock} is {what}, where a run keeps its lock file: move it out of {out} (or remove it), or use another --out "
        "(out_dir)"
    )


def _run_with_copies(out):
    """A GRPO run's OUT (its config.json, one checkpoint) and a user's copies kept in OUT/checkpoints."""
    import json

    from dgrpo.config import to_dict

    from conftest import state_only_checkpoint, tiny_config

    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps(to_dict(tiny_config())))
    root = out / "checkpoints"
    for name in ("step-00000004", "step-00000004-copy", "mine"):
        state_only_checkpoint(root / name)
    return root


def test_resume_never_refuses_to_delete_a_users_copies_in_checkpoints(tmp_path):
    """``--resume never`` removed OUT/checkpoints whole: a user's ``step-00000004-copy/`` and ``mine/`` (a
    checkpoint's state.json: a copy the start's checks let stay) went with the run's checkpoints without a word. It is
    refused in one line naming them, nothing removed; with them moved out it starts over, and what runs leave there
    (a skipped checkpoint moved aside, a killed write's leftovers) goes with the run's checkpoints."""
    out = tmp_path / "run"
    root = _run_with_copies(out)
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    with pytest.raises(ConfigError) as e:
        grpo_run_dir(out, resume="never")
    assert str(e.value) == (
        f"--resume never (resume='never') would delete mine, step-00000004-copy in {root}, kept beside the run's "
        f"checkpoints (no checkpoint a run wrote): move them out of {root} first, or name another --out (out_dir)"
    )
    assert sorted(p.relative_to(out) for p in out.rglob("*") if p.name != ".lock") == before
    for name in ("mine", "step-00000004-copy"):
        (root / name).rename(tmp_path / name)
    for name in ("damaged-step-00000006", "damaged-step-00000006-2", ".tmp-step-00000008-77", ".old-step-00000002-9"):
        (root / name).mkdir()
    (root / ".tmp-step-00000008-shards").mkdir()
    grpo_run_dir(out, resume="never").close()
    assert not root.exists()


def test_a_restart_under_another_config_refuses_to_delete_a_users_copies(tmp_path):
    """An unfinished run without a checkpoint of its own, restarted under another config, removes what it wrote as
    ``--resume never`` does: a user's copy of a checkpoint in OUT/checkpoints is refused the same way, kept."""
    import shutil

    from conftest import tiny_config

    out = tmp_path / "run"
    root = _run_with_copies(out)
    shutil.rmtree(root / "step-00000004")
    with pytest.raises(ConfigError, match=r"unfinished run over under another config would delete mine, "):
        grpo_run_dir(out, tiny_config(**{"grpo.lr": 0.5}))
    assert (root / "mine" / "state.json").is_file() and (root / "step-00000004-copy" / "state.json").is_file()


def test_a_run_at_work_in_out_is_refused_as_in_use_not_as_a_foreign_folder(tmp_path):
    """The start's checks of OUT ran before the lock was taken: a second run started while the first (holding the
    lock) was removing a stage-K/ folder under ``--resume never`` saw it without its manifest and was refused with
    "not a checkpoint dgrpo wrote: name a new --out", a wrong answer about a run's own directory. The checks run under
    the lock: that run is refused as the directory is in use."""
    import json
    import os

    from dgrpo.config import to_dict
    from dgrpo.training.out_dir import RunLock

    from conftest import tiny_config

    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_text(json.dumps(to_dict(tiny_config())))
    first = RunLock(out)  # (the first run, at work: its stage-1/ half removed, its manifest gone first)
    (out / "stage-1").mkdir()
    (out / "stage-1" / "model.safetensors").write_text("")
    try:
        with pytest.raises(ConfigError) as e:
            grpo_run_dir(out)
        assert str(e.value).startswith(f"{out} is in use by another dgrpo process (PID {os.getpid()})")
    finally:
        first.release()


def test_a_directory_refused_under_the_lock_keeps_no_lock_file_the_run_made(tmp_path):
    """Checked under the lock, a refused OUT (a config.json no run wrote) is left as it was: the lock file the run
    made is removed as it is refused; one that was there before (an earlier run's) stays."""
    out = tmp_path / "theirs"
    out.mkdir()
    (out / "config.json").write_text('{"not": "a run"}')
    with pytest.raises(ConfigError, match="its config.json is not a dgrpo run's config"):
        grpo_run_dir(out)
    assert [p.name for p in out.iterdir()] == ["config.json"]
    (out / ".lock").write_text("12\n")
    with pytest.raises(ConfigError, match="its config.json is not a dgrpo run's config"):
        grpo_run_dir(out)
    assert sorted(p.name for p in out.iterdir()) == [".lock", "config.json"]


def _unwritable(monkeypatch, path):
    """The system says ``path`` is not writable to this user (as another user's file is; as root too, where modes
    refuse nothing)."""
    from pathlib import Path

    from dgrpo.training import out_dir

    access = out_dir.os.access
    monkeypatch.setattr(out_dir.os, "access", lambda p, mode, **k: Path(p) != path and access(p, mode, **k))


def test_a_rollouts_file_the_run_cannot_append_to_is_refused_at_its_start(tmp_path, monkeypatch):
    """OUT/rollouts.jsonl not writable to the user (another user's in a shared folder, a run started as root): the
    run's first rollouts' write, minutes in, was a PermissionError traceback. The start refuses it in one line naming
    the file and its owner, and OUT is left as it was; a run that writes no rollouts (grpo.log_rollouts 0) or removes
    the file (--resume never) goes on."""
    import json
    import os
    import pwd

    from dgrpo.config import to_dict

    from conftest import tiny_config

    out = tmp_path / "run"
    out.mkdir()
    cfg = tiny_config(**{"grpo.log_rollouts": 4})
    (out / "config.json").write_text(json.dumps(to_dict(cfg)))
    rollouts = out / "rollouts.jsonl"
    rollouts.write_text("")
    _unwritable(monkeypatch, rollouts)
    _unwritable(monkeypatch, out)  # (else the run replaces it: a file of its own, then appended to)
    with pytest.raises(ConfigError) as e:
        grpo_run_dir(out, cfg)
    assert str(e.value) == (
        f"{rollouts} belongs to user {pwd.getpwuid(os.getuid()).pw_name} and is not writable to you: the run appends "
        f"its rollouts to it (grpo.log_rollouts); have its owner make it writable to you, move it out of {out}, or "
        "use another --out (out_dir)"
    )
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "rollouts.jsonl"]
    grpo_run_dir(out, cfg, resume="never").close()
    assert not rollouts.exists()
    (out / "config.json").write_text(json.dumps(to_dict(tiny_config())))  # (tiny.yaml: grpo.log_rollouts 0)
    rollouts.write_text("")
    grpo_run_dir(out).close()
    assert rollouts.is_file()


def test_the_command_refuses_an_unwritable_rollouts_file_before_the_model_loads(tmp_path, monkeypatch, run_cli):
    """dgrpo grpo's refusal of a rollouts.jsonl it cannot append to comes before the data are read and the model
    loaded (at the paper's scale those take minutes)."""
    from dgrpo.model import factory

    from conftest import tiny_args

    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text("")  # (a run's: else OUT is refused as holding no dgrpo run, first)
    (out / "rollouts.jsonl").write_text("")
    _unwritable(monkeypatch, out / "rollouts.jsonl")
    _unwritable(monkeypatch, out)  # (else the run replaces it: a file of its own, then appended to)
    monkeypatch.setattr(factory, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    (tmp_path / "sft").mkdir()  # (--init: never read, the refusal comes first)
    r = run_cli("grpo", "--init", tmp_path / "sft", "--out", out, *tiny_args(**{"grpo.log_rollouts": 2}))
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(f"dgrpo: error: {out / 'rollouts.jsonl'} belongs to user "), r.stderr


@pytest.mark.parametrize("code", ["EPERM", "ENOSPC"])
def test_a_run_file_that_cannot_be_replaced_is_not_said_to_wait_for_space(tmp_path, monkeypatch, code):
    """config.json another user's, in an OUT with the sticky bit (only its owner may replace it): the run's start
    failed in one line that ended "once there is space, run the same command again", beside the space it named free.
    A full disk's line still says so; another failure says what must change."""
    import errno

    from dgrpo.model.verified import CheckpointError
    from dgrpo.training import run as run_module

    out = tmp_path / "run"
    config = out / "config.json"

    def refused(path, text):
        if path == config:
            raise OSError(getattr(errno, code), os_error[code], str(path))
        path.write_text(text)

    os_error = {"EPERM": "Operation not permitted", "ENOSPC": "No space left on device"}
    monkeypatch.setattr(run_module, "write_text_atomically", refused)
    with pytest.raises(CheckpointError) as e, grpo_run_dir(out) as run:
        run.start(None)
    when = "there is space" if code == "ENOSPC" else "config.json can be replaced there"
    assert str(e.value).startswith("could not write config.json (")
    assert str(e.value).endswith(f"): {config} is as it was: once {when}, run the same command again")


def _grpo_run(out):
    """A GRPO run's OUT: its config.json, one checkpoint, its test results."""
    import json

    from dgrpo.config import to_dict

    from conftest import state_only_checkpoint, tiny_config

    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps(to_dict(tiny_config())))
    state_only_checkpoint(out / "checkpoints" / "step-00000004")
    (out / "eval" / "builtin_test").mkdir(parents=True)
    (out / "eval" / "builtin_test" / "results.json").write_text("{}")


def test_another_users_folders_are_refused_before_the_run_writes_or_removes_anything(tmp_path, monkeypatch):
    """A folder of the run's that the user may not write (another user's): ``--resume never`` removed the earlier
    run's files until it met it, in a PermissionError traceback (its checkpoints gone, its eval/ left); a resume
    found checkpoints/ unwritable at its first checkpoint, minutes in. Each is refused at the start, in one line
    naming the folder and its owner, nothing removed."""
    import os
    import pwd

    out = tmp_path / "run"
    _grpo_run(out)
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    user = pwd.getpwuid(os.getuid()).pw_name
    _unwritable(monkeypatch, out / "eval" / "builtin_test")
    with pytest.raises(ConfigError) as e:
        grpo_run_dir(out, resume="never")
    assert str(e.value) == (
        f"--resume never (resume='never') would delete {out / 'eval'}, and {out / 'eval' / 'builtin_test'} belongs to "
        f"user {user} and is not writable to you: have its owner remove it (or make it writable to you), or name "
        "another --out (out_dir)"
    )
    assert sorted(p.relative_to(out) for p in out.rglob("*") if p.name != ".lock") == before
    _unwritable(monkeypatch, out / "checkpoints")
    with pytest.raises(ConfigError) as e:
        grpo_run_dir(out)
    assert str(e.value) == (
        f"{out / 'checkpoints'} belongs to user {user} and is not writable to you: the run writes its checkpoints in "
        f"it; have its owner make it writable to you, move it out of {out}, or use another --out (out_dir)"
    )
    assert sorted(p.relative_to(out) for p in out.rglob("*") if p.name != ".lock") == before


def test_resume_never_empties_a_linked_checkpoints_folder_and_keeps_the_link(tmp_path):
    """OUT/checkpoints a link to a folder on a larger disk (a run resumes through it): ``--resume never`` was an
    OSError traceback (rmtree on a link). The earlier run's checkpoints there are removed and the link stays, so that
    the new run's checkpoints go to that disk too; a linked eval/ likewise."""
    import shutil

    out = tmp_path / "run"
    _grpo_run(out)
    big = tmp_path / "big"
    big.mkdir()
    for name in ("checkpoints", "eval"):
        shutil.move(out / name, big / name)
        (out / name).symlink_to(big / name)
    grpo_run_dir(out, resume="never").close()
    assert (out / "checkpoints").is_symlink() and list((big / "checkpoints").iterdir()) == []
    assert (out / "eval").is_symlink() and list((big / "eval").iterdir()) == []
