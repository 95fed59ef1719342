"""Refusals worded for their caller: the command line's options while it runs a trainer
(:func:`dgrpo.training.wording.command_line_words`), else what a Python caller sets or passes."""

import re
from contextlib import nullcontext

import pytest
import torch

pytest.importorskip("peft")

from dgrpo.config import ConfigError, LoraConfig  # noqa: E402
from dgrpo.model import lora  # noqa: E402
from dgrpo.model.latent_lm import LatentLM  # noqa: E402
from dgrpo.training.wording import command_line_words  # noqa: E402


def _adapter_checkpoint(base, out, **kw):
    """A LoRA run's resumable checkpoint (r = 4, alpha = 8 on ``base``, ``kw``: more of its model.lora)."""
    from dgrpo.training.checkpoint import list_checkpoints, save_checkpoint

    lm = LatentLM.from_pretrained(base)
    lora.apply_lora(lm, LoraConfig(r=4, alpha=8.0, **kw))
    opt = torch.optim.AdamW([p for p in lm.model.parameters() if p.requires_grad])
    save_checkpoint(out, 1, lm=lm, optimizer=opt, state={"trainer": {}})
    return list_checkpoints(out)[-1]


@pytest.mark.parametrize(
    "saved, given, python, cli",
    [
        ({}, {"r": 8}, "the config's model.lora.r = 4", "--set model.lora.r=4"),
        ({}, {"alpha": 16.0}, "the config's model.lora.alpha = 8.0", "--set model.lora.alpha=8"),
        (
            {},
            {"r": 8, "alpha": 16.0},
            "the config's model.lora.r = 4 and model.lora.alpha = 8.0",
            "--set model.lora.r=4, --set model.lora.alpha=8",
        ),
        (
            {"target_modules": ["k_proj", "v_proj"]},
            {"target_modules": ["q_proj"]},
            "the config's model.lora.target_modules = ['k_proj', 'v_proj']",
            "--set 'model.lora.target_modules=[k_proj,v_proj]'",
        ),
        (
            {},
            {"train_latent_tokens": False},
            "the config's model.lora.train_latent_tokens = True",
            "--set model.lora.train_latent_tokens=true",
        ),
    ],
    ids=["r", "alpha", "r_and_alpha", "target_modules", "train_latent_tokens"],
)
def test_the_settings_that_resume_another_adapter_are_worded_for_the_caller(
    lora_base_dirs, tmp_path, saved, given, python, cli
):
    """A LoRA checkpoint whose adapter the run's model.lora would not build: a Python caller (train_sft/train_grpo
    with out_dir=, read_checkpoint) was told to resume with --set model.lora.r=4, an option it never types (the
    rest of the line named its Python call already). It is told the config's model.lora.r = 4; the command line
    still reads --set."""
    from dgrpo.training.checkpoint import read_checkpoint

    ckpt = _adapter_checkpoint(lora_base_dirs / "qwen2", tmp_path / "run", **saved)

    def refusal() -> str:
        lm = LatentLM.from_pretrained(lora_base_dirs / "qwen2")
        lora.apply_lora(lm, LoraConfig(**{"r": 4, "alpha": 8.0, **given}))
        opt = torch.optim.AdamW([p for p in lm.model.parameters() if p.requires_grad])
        with pytest.raises(ConfigError) as e:
            read_checkpoint(ckpt, lm=lm, optimizer=opt)
        return str(e.value)

    said = refusal()
    assert f"would not build: resume with {python} (to train another adapter" in said, said
    assert not re.search(r"--(set|init)\b", said.replace(f"dgrpo export {ckpt} --merge --out MERGED", "")), said
    with command_line_words():
        said = refusal()
    assert f"would not build: resume with {cli} (to train another adapter" in said, said


def test_many_saved_target_modules_are_named_by_their_file_for_either_caller(lora_base_dirs, tmp_path):
    """More than LISTED_TARGETS saved target modules are named by the adapter's adapter_config.json, from Python
    as from the command line (the config's setting, without --set)."""
    import json

    ckpt = _adapter_checkpoint(lora_base_dirs / "qwen2", tmp_path / "run")
    file = ckpt / "model" / lora.ADAPTER_CONFIG
    config = json.loads(file.read_text())
    file.write_text(json.dumps({**config, "target_modules": [f"m{i}" for i in range(lora.LISTED_TARGETS + 1)]}))
    now = {"target_modules": ["q_proj"]}
    named = f"model.lora.target_modules as {file} lists them"
    assert lora.adapter_changes(ckpt / "model", now, True) == named
    assert lora.adapter_changes(ckpt / "model", now, False) == f"the config's {named}"


@pytest.mark.parametrize("cli", [False, True], ids=["python", "command_line"])
def test_an_sft_resume_on_other_data_is_refused_in_its_callers_words(tokenizer, task_records, tmp_path, cli):
    """SFT's refusal of a resume on other training data once the checkpoint loaded (RunDir.check_same_data, now
    resume_check.recorded_changes as GRPO's): from Python it names the arguments beside the options, from the
    command line the options only; the same records resume, and allow_config_change goes on, saying so."""

    from dgrpo.training.distributed import Dist
    from dgrpo.training.run import RunDir
    from dgrpo.training.sft import SFTRun

    from conftest import make_lm, tiny_config

    cfg, out, said = tiny_config(), tmp_path / "run", []
    with RunDir(out, cfg, Dist(), "sft", log=said.append) as run:
        first = SFTRun(make_lm(tokenizer), cfg, Dist(), run, task_records[:16])
        run.start(None)
        first.enter_stage(1)
        first.save(1, 2)
    ckpt = out / "checkpoints" / "step-00000000"
    never, allow = (
        ("--resume never", "--allow-config-change")
        if cli
        else (
            "--resume never (resume='never')",
            "--allow-config-change (allow_config_change=True)",
        )
    )
    for train, what in (
        (task_records[16:32], "16 records as now, other ones"),
        (task_records[:8], "16 records, now 8"),
    ):
        with command_line_words() if cli else nullcontext(), pytest.raises(ConfigError) as e:
            with RunDir(out, cfg, Dist(), "sft", log=said.append) as run:
                SFTRun(make_lm(tokenizer), cfg, Dist(), run, train)
        assert str(e.value) == (
            f"{ckpt} was trained on other training data than given now ({what}): resume with the same data, start "
            f"over with {never}, or pass {allow} to go on"
        )
    with command_line_words() if cli else nullcontext():
        with RunDir(out, cfg, Dist(), "sft", log=said.append) as run:
            SFTRun(make_lm(tokenizer), cfg, Dist(), run, task_records[:16])
        with RunDir(out, cfg, Dist(), "sft", allow_config_change=True, log=said.append) as run:
            SFTRun(make_lm(tokenizer), cfg, Dist(), run, task_records[:8])
    assert f"dgrpo: resuming {ckpt}, trained on other training data than given now (16 records, now 8)" in said


def _stop_lines() -> list[str]:
    """The lines of a run stopped by non-finite SFT steps and by a GRPO run's skipped steps, as the caller reads
    them now."""
    from pathlib import Path
    from types import SimpleNamespace

    from dgrpo.training.grpo import LoopState, _check_stall
    from dgrpo.training.guards import NonFiniteGuard

    from conftest import tiny_config

    guard = NonFiniteGuard(3, "SFT", "sft.lr", streak=3)
    g = tiny_config(**{"grpo.max_skip_streak": 1}).grpo
    run = SimpleNamespace(out_dir=Path("out"), log=lambda line: None)
    stall = _check_stall(run, LoopState(), {"step": 4, "skipped": 1, "reward_mean": 0.0}, g)  # type: ignore[arg-type]
    assert stall is not None
    return [str(guard.error(7, Path("out/checkpoints/step-00000007"))), stall]


def test_a_stopped_runs_line_names_the_resume_as_its_caller_sets_it():
    """A run stopped by non-finite steps (train_sft / train_grpo) or by a GRPO run's skipped steps told a Python
    caller to resume with --set ... --allow-config-change, options it never types: it is told the config's setting
    and allow_config_change=True; the command line still reads the options."""
    nonfinite, stall = _stop_lines()
    assert nonfinite.endswith("resume with a lower sft.lr (the config's sft.lr = ... and allow_config_change=True)"), (
        nonfinite
    )
    assert stall.endswith(
        "resume with the config's grpo.max_skip_streak = 0 and allow_config_change=True to keep going"
    ), stall
    with command_line_words():
        nonfinite, stall = _stop_lines()
    assert nonfinite.endswith("resume with a lower sft.lr (--set sft.lr=... --allow-config-change)"), nonfinite
    assert stall.endswith("resume with --set grpo.max_skip_streak=0 --allow-config-change to keep going"), stall


@pytest.mark.parametrize("cli", [False, True], ids=["python", "command_line"])
def test_the_commit_to_pin_a_changed_revision_to_is_named_as_its_caller_sets_it(tmp_path, cli):
    """A resume under another model.revision than the run loaded its model at: the refusal names the commit to pin,
    --set model.revision=COMMIT on the command line, and from Python (RunDir of train_sft / train_grpo) the config's
    model.revision = 'COMMIT' (it said --set)."""
    import json

    from conftest import grpo_run_dir, state_only_checkpoint, tiny_config

    out = tmp_path / "run"
    with grpo_run_dir(out, tiny_config(**{"model.revision": "abc123"})) as run:
        run.start(None)
    state_only_checkpoint(out / "checkpoints" / "step-00000001")
    assert json.loads((out / "config.json").read_text())["model"]["revision"] == "abc123"
    with command_line_words() if cli else nullcontext(), pytest.raises(ConfigError) as e:
        with grpo_run_dir(out, tiny_config(**{"model.revision": "v1"})):
            pass
    pin = "--set model.revision=abc123" if cli else "the config's model.revision = 'abc123'"
    assert f"(the run loaded its model at commit abc123: {pin})" in str(e.value), str(e.value)


@pytest.mark.parametrize("resume", ["auto", "never"])
@pytest.mark.parametrize("cli", [False, True], ids=["python", "command_line"])
def test_a_failed_test_sets_line_says_how_to_finish_the_run_as_its_caller_does(tmp_path, capsys, cli, resume):
    """The line before a failed test sets' error (train_sft / train_grpo from Python too) told a Python caller to
    run 'the same command' (without --resume never), or to pass --set 'data.test=[]' --allow-config-change: it is
    told the same call (with resume='auto') and the config's data.test = [] with allow_config_change=True; the
    command line reads its options as before."""

    from conftest import grpo_run_dir

    def failing(lm, best):
        raise ValueError("boom on the test set")

    out = tmp_path / "run"
    with command_line_words() if cli else nullcontext(), grpo_run_dir(out, resume=resume) as run:
        run.start(None)
        with pytest.raises(ValueError, match="boom"):
            run.final_eval(failing, None, 1, None)
    if cli:
        again = "the same command" if resume == "auto" else "the same command without --resume never"
        skip = "--set 'data.test=[]' --allow-config-change"
    else:
        again = "the same call" if resume == "auto" else "the same call with resume='auto'"
        skip = "the config's data.test = [] and allow_config_change=True"
    assert capsys.readouterr().err.endswith(
        f"once they can run, {again} evaluates them (it trains no step), or {skip} skips them\n"
    )


def test_a_changed_plugin_files_warning_names_a_new_run_as_its_caller_starts_one(tmp_path):
    """A resume after a plug-in file changed (train_grpo from Python too) warned a Python caller to start a new run
    with --resume never: it is told resume='never'; the command line still reads --resume never."""
    import warnings

    from dgrpo.training.applied import record_applied, warn_if_plugins_changed

    path = tmp_path / "applied.json"
    record_applied(path, 0, {"plugin_files": {"r.py": "a"}})
    for cli, new_run in ((False, "resume='never'"), (True, "--resume never")):
        with warnings.catch_warnings(record=True) as caught, command_line_words() if cli else nullcontext():
            warnings.simplefilter("always")
            warn_if_plugins_changed(path, 4, {"plugin_files": {"r.py": "b"}})
        assert [str(w.message) for w in caught] == [
            "r.py changed since this run's start at step 0: the steps from 4 use the file as it is now; restore it "
            f"to resume on the same code, or start a new run ({new_run})"
        ]
