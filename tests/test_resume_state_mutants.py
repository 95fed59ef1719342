"""A resume's refusals made from the run directory and the data alone, before the model loads: a fork (``--resume``
of another run's checkpoint) into an OUT that holds a finished run, and a resume on other training data or with
another reward than its checkpoints recorded."""

import json
import shutil
from pathlib import Path

import pytest

from dgrpo.config import ConfigError, to_dict
from dgrpo.model.verified import write_manifest
from dgrpo.training.resume_check import check_resume_config

from conftest import tiny_args, tiny_config


def _finished_run(out: Path, command: str) -> Path:
    """An OUT holding a finished run of ``command`` whose checkpoints were deleted: its final/ (with its manifest),
    config.json, and GRPO's summary.json or SFT's stage-K/."""
    for folder in ("final", "stage-1") if command == "sft" else ("final",):
        (out / folder).mkdir(parents=True)
        (out / folder / "model.safetensors").write_text("weights")
        write_manifest(out / folder)
    (out / "config.json").write_text(json.dumps(to_dict(tiny_config())))
    if command == "grpo":
        (out / "summary.json").write_text("{}")
    return out


def _checkpoint(path: Path, command: str) -> Path:
    """A folder that reads as a resumable checkpoint of ``command`` (its state.json), without weights."""
    path.mkdir(parents=True)
    (path / "state.json").write_text(json.dumps({"trainer": {}} if command == "grpo" else {"progress": {}}))
    return path


def _run_dir(out: Path, command: str, **kw):
    from dgrpo.training.distributed import Dist
    from dgrpo.training.run import RunDir

    return RunDir(out, tiny_config(), Dist.single(), command, log=lambda m: None, **kw)


def _files(out: Path) -> list[tuple[str, bytes]]:
    return sorted(
        (str(p.relative_to(out)), p.read_bytes()) for p in out.rglob("*") if p.is_file() and p.name != ".lock"
    )


@pytest.mark.parametrize("command", ["grpo", "sft"])
def test_a_fork_into_an_out_holding_a_finished_run_is_refused_as_a_resume_there_is(tmp_path, command):
    """--resume PATH (another run's checkpoint) into an OUT that holds a finished run without checkpoints was
    accepted: it removed and rewrote that run's final/ and summary, kept its stage-K/ beside them, where a resume
    without --resume refuses such an OUT. It is refused in one line naming a new --out, by the command line's check
    before anything is read and by the run directory, nothing in OUT changed; a fork into a new OUT, or into an
    unfinished run's (the same fork stopped before its first checkpoint, given again), goes on."""
    parent = _checkpoint(tmp_path / "parent" / "checkpoints" / "step-00000004", command)
    out = _finished_run(tmp_path / "done", command)
    before = _files(out)
    said = (
        f"--resume {parent} is another run's checkpoint, and {out} holds a finished run (final/, its model) and no "
        f"checkpoint: name a new --out to start from {parent} (the fork would write over that run's results)"
    )
    with pytest.raises(ConfigError) as e:
        check_resume_config(out, tiny_config(), command, resume=str(parent))
    assert str(e.value) == said
    with pytest.raises(ConfigError) as e:
        _run_dir(out, command, resume=str(parent))
    assert str(e.value) == said.replace(f"--resume {parent}", f"resume='{parent}'").replace("--out", "--out (out_dir)")
    assert _files(out) == before
    with pytest.raises(ConfigError, match=r"holds a finished run \(final/\) and no checkpoint to resume"):
        _run_dir(out, command)  # (the refusal the fork now matches)
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    (unfinished / "config.json").write_text(json.dumps(to_dict(tiny_config())))
    for fork in (tmp_path / "new", unfinished):
        check_resume_config(fork, tiny_config(), command, resume=str(parent))
        with _run_dir(fork, command, resume=str(parent)) as run:
            assert run.candidates == [parent]


class ModelLoaded(Exception):
    """Raised by the model loader a test puts in place: the command got as far as loading the model."""


@pytest.fixture
def no_model_load(monkeypatch):
    """dgrpo sft / grpo's model loader raising ModelLoaded: a refusal that comes before it is made from the run
    directory and the data alone."""

    def load_model(*args, **kwargs):
        raise ModelLoaded

    monkeypatch.setattr("dgrpo.model.factory.load_model", load_model)


def _train_fingerprint(**sets) -> str:
    """The fingerprint of the training records dgrpo sft / grpo read under tiny_config(**sets)."""
    from dgrpo.cli.train import read_setting
    from dgrpo.data import training_split
    from dgrpo.data.records import fingerprint

    cfg = tiny_config(**sets)
    return fingerprint(read_setting("data.train", training_split(cfg.data.train), cfg))


def _recording(path: Path, command: str, train_data: str | None, reward: list[str] | None = None) -> Path:
    """A checkpoint of ``command`` (its state.json alone) recording the training data's fingerprint and (GRPO) the
    reward, where not None."""
    recorded: dict[str, object] = {k: v for k, v in (("train_data", train_data), ("reward", reward)) if v is not None}
    path.mkdir(parents=True)
    state = {"trainer": recorded} if command == "grpo" else {"progress": {}, **recorded}
    (path / "state.json").write_text(json.dumps(state))
    return path


def test_a_resume_on_other_training_data_is_refused_before_the_model_loads(tmp_path, run_cli, no_model_load):
    """dgrpo sft resumed on other training data (the same config: its data file changed) was refused once the model
    had loaded (minutes for a 1.5B base): the refusal now comes from the checkpoints' record and the data read,
    before the model loads, in the command line's words. Refused only when every checkpoint to resume recorded other
    data (one recording none, or the same data, goes on to the model, whose checkpoint's own check decides);
    --allow-config-change goes on."""
    out = tmp_path / "run"
    older = _recording(out / "checkpoints" / "step-00000002", "sft", _train_fingerprint())
    newest = _recording(out / "checkpoints" / "step-00000004", "sft", "3:0123456789abcdef")
    args = ("sft", *tiny_args(), "--out", out)
    n_train = _train_fingerprint().partition(":")[0]
    with pytest.raises(ModelLoaded):
        run_cli(*args)  # (the older checkpoint recorded this data: the newest may not load)
    (older / "state.json").write_text((newest / "state.json").read_text())
    r = run_cli(*args)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip() == (
        f"dgrpo: error: {newest} was trained on other training data than given now (3 records, now {n_train}): resume "
        "with the same data, start over with --resume never, or pass --allow-config-change to go on"
    )
    with pytest.raises(ModelLoaded):
        run_cli(*args, "--allow-config-change")
    (older / "state.json").write_text(json.dumps({"progress": {}}))  # (written before dgrpo recorded its data)
    with pytest.raises(ModelLoaded):
        run_cli(*args)


def test_a_grpo_resume_with_another_reward_is_refused_before_the_model_loads(
    tmp_path, run_cli, no_model_load, sft_checkpoint
):
    """dgrpo grpo resumed from a checkpoint that recorded another reward than the config's builds now (its config
    unchanged: a plug-in function moved, dgrpo's scorer renamed), or, named by --resume, other training data: refused
    before the model loads; the same data and reward go on to the model."""
    from dgrpo.eval.scoring import check_reward

    cfg = tiny_config()
    reward = check_reward(cfg.grpo, cfg.eval.scorer)
    data = _train_fingerprint()
    out = tmp_path / "run"
    ckpt = _recording(out / "checkpoints" / "step-00000004", "grpo", data, ["correct = plugin.old_name * 1"])
    args = ("grpo", "--init", sft_checkpoint, *tiny_args(), "--out", out)
    r = run_cli(*args)
    assert r.returncode == 2
    assert r.stderr.strip() == (
        f"dgrpo: error: {ckpt} was trained with the reward correct = plugin.old_name * 1, now {'; '.join(reward)}: "
        "resume with the same reward (grpo.reward / grpo.rewards, or from Python the same reward_fn), start over "
        "with --resume never, or pass --allow-config-change to go on"
    )
    fork = _recording(tmp_path / "parent" / "checkpoints" / "step-00000002", "grpo", "5:0123456789abcdef", reward)
    r = run_cli("grpo", "--init", sft_checkpoint, *tiny_args(), "--out", tmp_path / "fork", "--resume", fork)
    assert r.returncode == 2 and f"{fork} was trained on other training data than given now (5 records" in r.stderr
    _recording(out / "checkpoints" / "step-00000006", "grpo", data, reward)
    shutil.rmtree(ckpt)
    with pytest.raises(ModelLoaded):
        run_cli(*args)
