"""A run folder's hygiene: which entries of OUT/checkpoints are the run's (its checkpoints, what a killed or skipped
write left, a user's copy of a checkpoint) as the stop line, the start's checks and the resume read them, and the
run directory's lock."""

from __future__ import annotations

import argparse

from conftest import state_only_checkpoint


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
