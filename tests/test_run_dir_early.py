"""The run directory's lock and ownership refusals come before the model loads (``dgrpo sft`` / ``dgrpo grpo`` take
OUT's lock first and hand it to the run's RunDir), and a run refused or failed before it trained leaves nothing in
OUT it made: no lock file, no folder."""

from __future__ import annotations

import json
import os

import pytest

from conftest import grpo_run_dir, tiny_args


@pytest.fixture
def no_model(monkeypatch):
    """The model never loads: a refusal that came after it fails the test."""
    from dgrpo.model import factory

    monkeypatch.setattr(factory, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))


@pytest.fixture
def model_fails(monkeypatch):
    """Loading the model fails (in one line): what the command made before it must be gone."""
    from dgrpo.config import ConfigError
    from dgrpo.model import factory

    def load(*a, **k):
        raise ConfigError("the model loads")

    monkeypatch.setattr(factory, "load_model", load)


def _grpo(run_cli, tmp_path, out, *args):
    (tmp_path / "sft").mkdir(exist_ok=True)  # (--init: never read before the model loads)
    return run_cli("grpo", "--init", tmp_path / "sft", "--out", out, *args, *tiny_args())


def test_an_out_another_run_holds_is_refused_before_the_model_loads(tmp_path, run_cli, no_model):
    """``dgrpo grpo`` on an OUT another live run holds (its lock taken): refused only once the model had loaded
    (minutes for a 1.5B base). It is refused first, in RunDir's words, and the holder's lock file is left as it is."""
    from dgrpo.training.out_dir import RunLock

    out = tmp_path / "run"
    out.mkdir()
    holder = RunLock(out)  # (another open file: flock refuses this process's second lock as another process's)
    try:
        for command in ("grpo", "sft"):
            args = ("--init", tmp_path / "sft") if command == "grpo" else ()
            (tmp_path / "sft").mkdir(exist_ok=True)
            r = run_cli(command, *args, "--out", out, *tiny_args())
            assert r.returncode == 2, r.stderr
            assert r.stderr == (
                f"dgrpo: error: {out} is in use by another dgrpo process (PID {os.getpid()}); wait for it to finish "
                "or use another --out\n"
            )
            assert (out / ".lock").read_text() == f"{os.getpid()}\n"
    finally:
        holder.release()


def test_an_out_no_run_wrote_is_refused_before_the_model_loads_and_left_as_it_was(tmp_path, run_cli, no_model):
    """An OUT holding what no dgrpo run wrote (a config.json of another kind, a file in checkpoints/): refused under
    the lock before the model loads, in RunDir's words, with no lock file left behind."""
    from dgrpo.config import ConfigError
    from dgrpo.training.wording import command_line_words

    out = tmp_path / "mine"
    (out / "checkpoints").mkdir(parents=True)
    (out / "checkpoints" / "z").write_text("mine")
    (out / "config.json").write_text('{"mine": 1}')
    for resume in ("never", "auto"):
        r = _grpo(run_cli, tmp_path, out, "--resume", resume)
        said = f"--out {out}: its config.json is not a dgrpo run's config: name a new --out"
        assert r.returncode == 2 and r.stderr == f"dgrpo: error: {said}\n", r.stderr
        assert sorted(p.name for p in out.iterdir()) == ["checkpoints", "config.json"]
        with pytest.raises(ConfigError) as e, command_line_words():
            grpo_run_dir(out, resume=resume)
        assert str(e.value) == said


def test_a_run_that_fails_before_training_leaves_no_folder_nor_lock_file(tmp_path, run_cli, model_fails):
    """The lock taken before the model loads makes OUT (and its missing parents): a run that fails before it trains
    (the model does not load) removes them, and in an OUT that was there leaves no lock file it made."""
    new = tmp_path / "runs" / "a" / "run"
    r = _grpo(run_cli, tmp_path, new)
    assert r.stderr == "dgrpo: error: the model loads\n", r.stderr
    assert not (tmp_path / "runs").exists()
    there = tmp_path / "there"
    there.mkdir()
    (there / "notes.txt").write_text("mine")
    r = _grpo(run_cli, tmp_path, there)
    assert r.stderr == "dgrpo: error: the model loads\n", r.stderr
    assert [p.name for p in there.iterdir()] == ["notes.txt"]
    # (a lock file an earlier run left stays: it is no more this run's to remove than the run's other files)
    (there / ".lock").write_text("")
    r = _grpo(run_cli, tmp_path, there)
    assert sorted(p.name for p in there.iterdir()) == [".lock", "notes.txt"]


def test_a_refusal_after_the_lock_before_the_model_leaves_nothing(tmp_path, run_cli, no_model):
    """A refusal after the lock is taken and before the model loads (a resume under another command's checkpoints,
    a training set that cannot be read) leaves no folder it made and no lock file."""
    out = tmp_path / "new" / "run"
    r = _grpo(run_cli, tmp_path, out, "--set", "data.train=nowhere.jsonl")
    assert r.returncode == 2 and r.stderr.startswith("dgrpo: error: data.train: "), r.stderr
    assert not (tmp_path / "new").exists()
    out = tmp_path / "sft_run"
    out.mkdir()
    (out / "metrics.jsonl").write_text(json.dumps({"step": 5, "stage": 0, "loss": 1.0}) + "\n")
    r = _grpo(run_cli, tmp_path, out, "--resume", "never")
    assert r.returncode == 2 and "a `dgrpo sft` run" in r.stderr, r.stderr
    assert [p.name for p in out.iterdir()] == ["metrics.jsonl"]


def test_the_run_dir_takes_over_the_command_lines_lock(tmp_path):
    """Within the command line's scope, the RunDir made on the directory whose lock the command line took takes that
    lock over (it would refuse its own process's lock as another run's), gives it up at its end, and the scope then
    leaves the directory as the RunDir did; another directory's RunDir takes a lock of its own."""
    from dgrpo.training.out_dir import RunLock, run_dir_scope, take_run_dir

    out = tmp_path / "run"
    with run_dir_scope():
        take_run_dir(out)
        with grpo_run_dir(out) as run:
            assert run.lock is not None and run.made == out
            with grpo_run_dir(tmp_path / "other") as other:
                assert other.lock is not None and other.lock is not run.lock
        RunLock(out).release()  # (released: another run may take it)
        assert (out / ".lock").is_file()
    assert (out / ".lock").is_file()  # (the RunDir's, left as a run leaves it)


def test_a_refused_run_dir_removes_the_directory_the_command_line_made(tmp_path):
    """A RunDir refused once it took over the command line's lock on a directory the command line made removes it,
    as one that made it does."""
    from dgrpo.config import ConfigError
    from dgrpo.training.out_dir import run_dir_scope, take_run_dir

    out = tmp_path / "run"
    with run_dir_scope():
        take_run_dir(out)
        with pytest.raises(ConfigError, match="no such checkpoint directory"):
            grpo_run_dir(out, resume=str(tmp_path / "nowhere"))
        assert not out.exists()


@pytest.mark.parametrize("command_line", [False, True], ids=["python", "command_line"])
def test_a_refused_run_dir_removes_the_folders_above_it_that_it_made(tmp_path, command_line):
    """``--out runs/new/exp1`` where only ``runs/`` exists, refused once the RunDir holds the lock: the RunDir (or the
    command line, whose lock it took over) made ``new/`` and ``new/exp1/``; both are removed, not just ``exp1/``
    (``new/`` was left behind, empty), and ``runs/`` is kept."""
    from contextlib import nullcontext

    from dgrpo.config import ConfigError
    from dgrpo.training.out_dir import run_dir_scope, take_run_dir

    runs = tmp_path / "runs"
    runs.mkdir()
    out = runs / "new" / "exp1"
    with run_dir_scope() if command_line else nullcontext():
        if command_line:
            take_run_dir(out)
        with pytest.raises(ConfigError, match="no such checkpoint directory"):
            grpo_run_dir(out, resume=str(tmp_path / "nowhere"))
        assert runs.is_dir() and list(runs.iterdir()) == []


def _python_refusal(out, **kw) -> str:
    """What RunDir says of ``out`` to a Python caller (no command line around it)."""
    from dgrpo.config import ConfigError

    with pytest.raises(ConfigError) as e:
        grpo_run_dir(out, **kw)
    return str(e.value)


def test_a_python_callers_refusals_name_its_arguments(tmp_path):
    """A RunDir used from Python (a trainer called with out_dir=, resume=) was told to use "another --out", "drop
    --resume", "--resume never": options it never typed. Each refusal names the Python argument beside the command
    line's option, as the config-change refusals did already; the command line's words are unchanged."""
    from dgrpo.config import ConfigError
    from dgrpo.training.out_dir import RunLock
    from dgrpo.training.wording import command_line_words

    from conftest import state_only_checkpoint

    held = tmp_path / "held"
    held.mkdir()
    holder = RunLock(held)
    try:
        said = _python_refusal(held)
    finally:
        holder.release()
    assert said.endswith("wait for it to finish or use another --out (out_dir)")

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "config.json").write_text('{"mine": 1}')
    said = _python_refusal(mine)
    assert said == f"out_dir {mine}: its config.json is not a dgrpo run's config: name a new --out (out_dir)"

    finished = tmp_path / "finished"
    (finished / "final").mkdir(parents=True)
    (finished / "final" / "manifest.json").write_text("{}")
    said = _python_refusal(finished)
    assert said.endswith(
        "to train it again, --resume never (resume='never') (removes its results) or a new --out (out_dir)"
    )

    sft = tmp_path / "sft"
    sft.mkdir()
    (sft / "metrics.jsonl").write_text(json.dumps({"step": 5, "stage": 0, "loss": 1.0}) + "\n")
    said = _python_refusal(sft, resume="never")
    assert "(--resume never (resume='never') would delete it): name a new --out (out_dir)" in said

    nowhere = tmp_path / "nowhere"
    assert _python_refusal(tmp_path / "run", resume=str(nowhere)) == f"resume='{nowhere}': no such checkpoint directory"

    fork = tmp_path / "fork"
    state_only_checkpoint(fork / "checkpoints" / "step-00000002")
    other = state_only_checkpoint(tmp_path / "other" / "checkpoints" / "step-00000004")
    said = _python_refusal(fork, resume=str(other))
    assert said.startswith(f"resume='{other}' is another run's checkpoint")
    assert "drop --resume (resume='auto') to continue" in said and "name a new --out (out_dir)" in said
    with pytest.raises(ConfigError) as e, command_line_words():
        grpo_run_dir(fork, resume=str(other))
    assert str(e.value).startswith(f"--resume {other} is another run's checkpoint")
    assert "drop --resume to continue" in str(e.value) and "(out_dir)" not in str(e.value)


def _denied(monkeypatch, path, mode=None):
    """The system says this user may not write (``mode`` None) or may not do ``mode`` in ``path`` (another user's
    folder; as root too, where modes refuse nothing)."""
    from pathlib import Path

    from dgrpo.training import out_dir

    access = out_dir.os.access

    def checked(p, asked, **k):
        if Path(p) == path and (mode is None or asked & mode):
            return False
        return access(p, asked, **k)

    monkeypatch.setattr(out_dir.os, "access", checked)


def _a_run(out, **over):
    """A GRPO run's OUT: its config.json (tiny_config(**over)) and an empty metrics.jsonl."""
    from dgrpo.config import to_dict

    from conftest import tiny_config

    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps(to_dict(tiny_config(**over))))
    (out / "metrics.jsonl").write_text("")
    return tiny_config(**over)


@pytest.mark.parametrize("name", ["metrics.jsonl", "rollouts.jsonl"])
def test_a_folder_where_the_run_writes_a_file_is_refused_at_its_start(tmp_path, name):
    """A folder named metrics.jsonl (or, logging rollouts, rollouts.jsonl) in a run's OUT: the run went on, and its
    first write there was an IsADirectoryError traceback (after the model loaded, or minutes in). Refused in one line
    at the start, the folder left as it was."""
    from dgrpo.config import ConfigError

    out = tmp_path / "run"
    cfg = _a_run(out, **{"grpo.log_rollouts": 2})
    (out / name).unlink(missing_ok=True)
    (out / name).mkdir()
    (out / name / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError) as e:
        grpo_run_dir(out, cfg)
    assert str(e.value).startswith(f"{out / name} is a folder, not a file: the run ")
    assert str(e.value).endswith(f"move it out of {out}, or use another --out (out_dir)")
    assert (out / name / "notes.txt").read_text() == "mine"


def test_the_run_s_checkpoints_another_user_owns_are_refused_when_it_would_remove_them(tmp_path, monkeypatch):
    """A step-N folder in OUT/checkpoints another user owns (or one the user cannot list): the run resumed, and its
    first rotation (keep_last) failed minutes in with a PermissionError traceback. Refused at the start in one
    line."""
    from dgrpo.config import ConfigError

    from conftest import state_only_checkpoint

    out = tmp_path / "run"
    cfg = _a_run(out)
    step = state_only_checkpoint(out / "checkpoints" / "step-00000002")
    (step / "model").mkdir()
    for folder, mode, lacking in ((step / "model", None, "writable"), (step, os.R_OK, "readable")):
        with monkeypatch.context() as m:
            _denied(m, folder, mode)
            with pytest.raises(ConfigError) as e:
                grpo_run_dir(out, cfg)
            assert str(e.value).startswith(f"{folder} belongs to user ")
            assert f"is not {lacking} to you: the run removes its checkpoints past the newest 2 (keep_last)" in str(
                e.value
            )


def test_the_folders_of_the_test_results_and_the_trackers_are_checked_at_the_start(tmp_path, monkeypatch):
    """OUT/eval/<test set> (written at the run's end, hours in) or OUT/tb (TensorBoard, once the model loaded) not
    writable to the user: refused at the start, naming the folder; a folder the run does not write (no such test set,
    no such backend) is not."""
    from dgrpo.config import ConfigError

    out = tmp_path / "run"
    cfg = _a_run(out, **{"logging.backends": "[tensorboard]"})
    for folder in (out / "eval" / "builtin_test", out / "eval_best", out / "tb"):
        folder.mkdir(parents=True)
        with monkeypatch.context() as m:
            _denied(m, folder)
            with pytest.raises(ConfigError, match=f"^{folder} belongs to user .* not writable to you: the run "):
                grpo_run_dir(out, cfg)
    (out / "eval" / "mine").mkdir()
    _denied(monkeypatch, out / "eval" / "mine")
    grpo_run_dir(out, cfg).close()


def test_a_read_only_rollouts_file_the_run_may_replace_is_replaced(tmp_path, monkeypatch):
    """A read-only rollouts.jsonl in a folder the user may write (made read-only, or another user's without the
    sticky bit): refused, though the run may replace it, as it does when it cuts it to a resumed step. The run now
    replaces it (the same rows) and appends to its own copy; one it may not replace is still refused."""
    from dgrpo.config import ConfigError

    out = tmp_path / "run"
    cfg = _a_run(out, **{"grpo.log_rollouts": 2})
    rollouts = out / "rollouts.jsonl"
    rollouts.write_text("")
    rollouts.chmod(0o444)
    _denied(monkeypatch, rollouts)
    with grpo_run_dir(out, cfg) as run:
        run.start(None)
        monkeypatch.undo()
        run.write_rollouts([{"step": 0, "text": "a"}])
    assert [json.loads(line)["step"] for line in rollouts.read_text().splitlines()] == [0]
    rollouts.chmod(0o444)
    _denied(monkeypatch, rollouts)
    _denied(monkeypatch, out)
    with pytest.raises(ConfigError, match=f"^{rollouts} belongs to user "):
        grpo_run_dir(out, cfg)


def test_resume_never_refuses_a_folder_it_cannot_list(tmp_path, monkeypatch):
    """``--resume never`` removing the earlier run's folders: one the user may write in but not list (read
    permission off) was let through, and its removal failed partway with a PermissionError traceback (a folder is
    emptied by listing it). Refused first, in one line, nothing removed."""
    from dgrpo.config import ConfigError

    out = tmp_path / "run"
    cfg = _a_run(out)
    (out / "eval" / "builtin_test").mkdir(parents=True)
    (out / "eval" / "builtin_test" / "results.json").write_text("{}")
    _denied(monkeypatch, out / "eval" / "builtin_test", os.R_OK)
    with pytest.raises(ConfigError) as e:
        grpo_run_dir(out, cfg, resume="never")
    assert str(e.value).startswith(
        f"--resume never (resume='never') would delete {out / 'eval'}, and {out / 'eval' / 'builtin_test'} belongs to "
        "user "
    )
    assert "is not readable to you: have its owner remove it (or make it readable to you)" in str(e.value)
    assert (out / "eval" / "builtin_test" / "results.json").is_file()
