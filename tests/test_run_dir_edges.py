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
        "another --out"
    )
    assert (out / ".lock" / "notes.txt").read_text() == "mine"
