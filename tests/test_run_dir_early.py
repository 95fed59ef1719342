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
    from dgrpo.training.resume_check import command_line_words

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
            assert run.lock is not None and run.created
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
    from dgrpo.training.resume_check import command_line_words

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
