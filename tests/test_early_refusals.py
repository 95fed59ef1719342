"""The refusals of a run directory that read OUT alone come before the model loads (at the paper's scale that takes
minutes): ``--resume never`` (and a run restarted under another config) that would delete another command's run, the
model it starts from, a user's copies in OUT/checkpoints or another user's folders, and a finished run without a
checkpoint; in the same words as :class:`~dgrpo.training.run.RunDir`'s, which still makes them (the Python API)."""

from __future__ import annotations

import json

import pytest

from dgrpo.config import to_dict

from conftest import grpo_run_dir, state_only_checkpoint, tiny_args, tiny_config


@pytest.fixture
def no_model(monkeypatch):
    """The model never loads: a refusal that came after it fails the test."""
    from dgrpo.model import factory

    monkeypatch.setattr(factory, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))


def _unwritable(monkeypatch, path):
    """The system says ``path`` is not writable to this user (another user's folder)."""
    from pathlib import Path

    from dgrpo.training import out_dir

    access = out_dir.os.access
    monkeypatch.setattr(out_dir.os, "access", lambda p, mode, **k: Path(p) != path and access(p, mode, **k))


def _grpo_run(out, **over):
    """A GRPO run's OUT (its config.json under tiny_config(**over)) with one checkpoint."""
    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps(to_dict(tiny_config(**over))))
    state_only_checkpoint(out / "checkpoints" / "step-00000004")


def _api_refusal(out, **kw) -> str:
    """What RunDir (the Python API's path) says of ``out``, in the command line's words."""
    from dgrpo.config import ConfigError
    from dgrpo.training.wording import command_line_words

    with pytest.raises(ConfigError) as e, command_line_words():
        grpo_run_dir(out, **kw)
    return str(e.value)


def _refused_early(run_cli, tmp_path, out, *args, **over) -> str:
    """``dgrpo grpo ARGS --out out``: refused in one line before the model loads; that line's message."""
    (tmp_path / "sft").mkdir(exist_ok=True)  # (--init: never read, the refusal comes first)
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    r = run_cli("grpo", "--init", tmp_path / "sft", "--out", out, *args, *tiny_args(**over))
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("dgrpo: error: "), r.stderr
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before  # (nothing written, nothing removed)
    return r.stderr.removeprefix("dgrpo: error: ").rstrip("\n")


def test_resume_never_refuses_a_users_copies_before_the_model_loads(tmp_path, run_cli, no_model):
    """``--resume never`` with a user's copy of a checkpoint in OUT/checkpoints: refused only once the model had
    loaded (minutes for a 1.5B base), though OUT alone says it. It is refused first, in RunDir's words."""
    out = tmp_path / "run"
    _grpo_run(out)
    state_only_checkpoint(out / "checkpoints" / "step-00000004-copy")
    said = _refused_early(run_cli, tmp_path, out, "--resume", "never")
    root = out / "checkpoints"
    assert said == (
        f"--resume never would delete step-00000004-copy in {root}, kept beside the run's checkpoints (no "
        f"checkpoint a run wrote): move them out of {root} first, or name another --out"
    )
    assert said == _api_refusal(out, resume="never")


def test_resume_never_refuses_another_users_folder_before_the_model_loads(tmp_path, run_cli, no_model, monkeypatch):
    """``--resume never`` that would delete a folder another user owns: refused first, in RunDir's words."""
    out = tmp_path / "run"
    _grpo_run(out)
    (out / "eval" / "builtin_test").mkdir(parents=True)
    _unwritable(monkeypatch, out / "eval" / "builtin_test")
    said = _refused_early(run_cli, tmp_path, out, "--resume", "never")
    assert said.startswith(f"--resume never would delete {out / 'eval'}, and {out / 'eval' / 'builtin_test'} belongs")
    assert said == _api_refusal(out, resume="never")


def test_resume_never_refuses_another_commands_run_before_the_model_loads(tmp_path, run_cli, no_model):
    """``dgrpo grpo --resume never`` on an SFT run's directory: refused first, in RunDir's words."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text(json.dumps({"step": 5, "stage": 0, "loss": 1.0}) + "\n")
    said = _refused_early(run_cli, tmp_path, out, "--resume", "never")
    assert said.startswith(f"{out} holds a `dgrpo sft` run, which `dgrpo grpo` cannot resume (--resume never would")
    assert said == _api_refusal(out, resume="never")


def test_resume_never_refuses_to_delete_its_init_before_the_model_loads(tmp_path, run_cli, no_model):
    """``--resume never --init OUT/best``: the removal would delete the model the run starts from; refused before
    that model loads."""
    out = tmp_path / "run"
    _grpo_run(out)
    (out / "best").mkdir()
    (out / "best" / "manifest.json").write_text("{}")
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    r = run_cli("grpo", "--init", out / "best", "--out", out, "--resume", "never", *tiny_args())
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr == (
        f"dgrpo: error: --resume never would delete {out / 'best'}, the model this run starts from (--init): name "
        "another --out\n"
    )
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before


def test_a_restart_under_another_config_refuses_a_users_copies_before_the_model_loads(tmp_path, run_cli, no_model):
    """An unfinished run without a checkpoint, given again under another config, starts over removing what it
    wrote: a user's copy in OUT/checkpoints is refused first, in RunDir's words."""
    out = tmp_path / "run"
    _grpo_run(out, **{"grpo.lr": 0.5})
    (out / "checkpoints" / "step-00000004").rename(out / "checkpoints" / "mine")
    said = _refused_early(run_cli, tmp_path, out)
    assert said.startswith(f"starting {out}'s unfinished run over under another config would delete mine in ")
    assert said == _api_refusal(out)


def test_a_restart_under_another_config_refuses_another_users_folder_before_the_model_loads(
    tmp_path, run_cli, no_model, monkeypatch
):
    """The same restart with a folder another user owns among what it would remove: refused first."""
    out = tmp_path / "run"
    _grpo_run(out, **{"grpo.lr": 0.5})
    (out / "checkpoints" / "step-00000004" / "state.json").unlink()
    (out / "checkpoints" / "step-00000004").rmdir()
    (out / "best").mkdir()
    (out / "best" / "manifest.json").write_text("{}")
    _unwritable(monkeypatch, out / "best")
    said = _refused_early(run_cli, tmp_path, out)
    assert said.startswith(f"starting {out}'s unfinished run over under another config would delete {out / 'best'}")
    assert said == _api_refusal(out)


def test_a_finished_run_without_checkpoints_is_refused_before_the_model_loads(tmp_path, run_cli, no_model):
    """A finished run (final/) whose checkpoints were deleted, given again without --resume never: refused first."""
    out = tmp_path / "run"
    _grpo_run(out)
    (out / "checkpoints" / "step-00000004" / "state.json").unlink()
    (out / "checkpoints" / "step-00000004").rmdir()
    (out / "final").mkdir()
    (out / "final" / "manifest.json").write_text("{}")
    said = _refused_early(run_cli, tmp_path, out)
    assert said.startswith(f"{out} holds a finished run (final/) and no checkpoint to resume")
    assert said == _api_refusal(out)


def test_a_restart_under_the_same_config_and_a_resume_never_that_may_go_on_reach_the_model(
    tmp_path, run_cli, monkeypatch
):
    """What the early checks let go on still reaches the model: ``--resume never`` on this command's own run, and a
    restart with nothing of the user's to delete (the earlier run's files are removed by RunDir, after the model)."""
    import shutil

    from dgrpo.config import ConfigError
    from dgrpo.model import factory

    def load(*a, **k):
        raise ConfigError("the model loads")

    monkeypatch.setattr(factory, "load_model", load)
    (tmp_path / "sft").mkdir()
    for args in (["--resume", "never"], []):
        out = tmp_path / f"run{len(args)}"
        _grpo_run(out, **({"grpo.lr": 0.5} if not args else {}))
        if not args:  # (no checkpoint: an unfinished run, restarted)
            shutil.rmtree(out / "checkpoints")
        r = run_cli("grpo", "--init", tmp_path / "sft", "--out", out, *args, *tiny_args())
        assert r.stderr == "dgrpo: error: the model loads\n", r.stderr
        assert (out / "config.json").is_file()  # (nothing removed before the model loaded)


def test_the_data_and_reward_refusals_are_worded_alike_before_and_after_the_model_loads(tmp_path):
    """A resume on other training data, or with another reward, is refused by the command line before the model
    loads (check_resume_data) and by RunDir once the checkpoint loaded (the Python API's trainers): one wording (each
    spelled its own before), the command line's options named in both."""
    from dgrpo.cli.train import read_setting
    from dgrpo.config import ConfigError
    from dgrpo.data import training_split
    from dgrpo.data.records import fingerprint
    from dgrpo.training.resume_check import check_resume_data, recorded_changes
    from dgrpo.training.wording import command_line_words

    cfg = tiny_config()
    train = read_setting("data.train", training_split(cfg.data.train), cfg)
    out, saved, reward = tmp_path / "run", "3:0123456789abcdef", ["correct = plugin.old_name * 1"]
    ckpt = out / "checkpoints" / "step-00000004"
    ckpt.mkdir(parents=True)
    (ckpt / "state.json").write_text(json.dumps({"trainer": {"train_data": saved, "reward": reward}}))
    with pytest.raises(ConfigError) as early:
        check_resume_data(out, cfg, "grpo", train, ["correct = eval.scorer * 1"])
    with pytest.raises(ConfigError) as later, command_line_words(), grpo_run_dir(out) as run:
        run.checkpoint = ckpt
        run.check_same_data(saved, fingerprint(train))
    assert str(early.value) == str(later.value)
    assert str(early.value).startswith(f"{ckpt} was trained on other training data than given now (3 records, now ")
    (ckpt / "state.json").write_text(json.dumps({"trainer": {"train_data": fingerprint(train), "reward": reward}}))
    with pytest.raises(ConfigError) as early:
        check_resume_data(out, cfg, "grpo", train, ["correct = eval.scorer * 1"])
    with pytest.raises(ConfigError) as later, command_line_words(), grpo_run_dir(out) as run:
        run.checkpoint = ckpt
        changed = recorded_changes({"reward": reward}, fingerprint(train), ["correct = eval.scorer * 1"])
        run.refuse_unrecorded_change(*changed[0])
    assert (
        str(early.value)
        == str(later.value)
        == (
            f"{ckpt} was trained with the reward correct = plugin.old_name * 1, now correct = eval.scorer * 1: resume "
            "with the same reward (grpo.reward / grpo.rewards, or from Python the same reward_fn), start over with "
            "--resume never, or pass --allow-config-change to go on"
        )
    )
