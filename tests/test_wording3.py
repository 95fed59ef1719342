"""Out-of-memory advice worded for its caller: ``--set KEY=VALUE`` while the command line runs a trainer
(:func:`dgrpo.training.wording.command_line_words`), the config's setting when a trainer is called from Python (it
told a Python caller of GRPOTrainer / train_sft to ``--set``, options it never types)."""

import pytest
import torch

from dgrpo.config import Config, load_config
from dgrpo.training.memory import MARK, oom_advice
from dgrpo.training.wording import command_line_words, setting_named, settings_named

from conftest import make_lm, tiny_config


def _said(advice) -> str:
    """The message of an out-of-memory error raised within ``advice`` (a context manager)."""
    with pytest.raises(torch.OutOfMemoryError) as info, advice:
        raise torch.OutOfMemoryError("CUDA out of memory.")
    return str(info.value)


def test_the_setting_to_lower_is_the_configs_for_a_python_caller():
    said = _said(oom_advice("update", "grpo.micro_batch_size", 512, "rows per forward/backward"))
    advice = "try the config's grpo.micro_batch_size = 256 (rows per forward/backward)"
    assert said.splitlines()[1] == f"{MARK} in the update at grpo.micro_batch_size=512: {advice}", said
    with command_line_words():
        said = _said(oom_advice("update", "grpo.micro_batch_size", 512, "rows per forward/backward"))
    assert said.endswith(": try --set grpo.micro_batch_size=256 (rows per forward/backward)"), said


def test_a_python_grpo_trainer_is_told_the_configs_settings_for_the_memory_held_and_the_micro_batch(
    tokenizer, task_records
):
    """GRPOTrainer from Python: the held memory (the chain's graphs, the kept decoders) and the micro-batch are both
    named as the config's settings, with Python's False; the command line still reads one --set of both."""
    from dgrpo.training.grpo import GRPOTrainer

    over = ["grpo.group_size=4", "grpo.filter=false", "grpo.beta0=0.0", "grpo.micro_batch_size=8", "grpo.engine=fast"]
    over += ["grpo.update_latent_graphs=true", "grpo.recompute_latent_steps=false"]
    trainer = GRPOTrainer(make_lm(tokenizer, "qwen2"), load_config(Config, "tiny.yaml", over), task_records)
    said = _said(trainer._update_oom_advice())
    assert "--set" not in said, said
    assert said.splitlines()[1].startswith(
        f"{MARK} in the update at grpo.micro_batch_size=8: try the config's grpo.update_latent_graphs = False and "
        "grpo.keep_graphs = False (memory held between steps; the same method, a slower step) first; then try the "
        "config's grpo.micro_batch_size = 4 (rows per forward/backward"
    ), said
    with command_line_words():
        said = _said(trainer._update_oom_advice())
    assert "try --set grpo.update_latent_graphs=false grpo.keep_graphs=false (memory held" in said, said


def test_a_python_sft_run_is_told_the_configs_grad_accum():
    from dgrpo.training.sft import SFTRun

    run = object.__new__(SFTRun)
    run.cfg = tiny_config(**{"sft.batch_size": 12, "sft.grad_accum": 4})
    said = _said(run._oom_advice())
    assert f"{MARK} in the SFT step at sft.grad_accum=4: try the config's sft.grad_accum = 6 (" in said, said
    assert "--set" not in said, said


def test_settings_are_named_together_as_each_caller_sets_them():
    pairs = [("grpo.keep_graphs", "false", "False"), ("grpo.lr", "1e-06", "1e-06")]
    assert settings_named(pairs, cli=True) == "--set grpo.keep_graphs=false grpo.lr=1e-06"
    assert settings_named(pairs, cli=False) == "the config's grpo.keep_graphs = False and grpo.lr = 1e-06"
    assert setting_named("sft.lr", "...", "...", cli=False, allow=True) == (
        "the config's sft.lr = ... and allow_config_change=True"
    )
    assert setting_named("sft.lr", "...", "...", cli=True, allow=True) == "--set sft.lr=... --allow-config-change"


def test_the_flag_lives_below_the_model_and_the_trainers_words_are_the_same():
    """The caller flag is at the bottom of the layers (dgrpo.wording, imported by nothing of dgrpo), so that the
    model's refusals can be worded by caller without an import up the layers: the command line's block, entered
    through the trainers' module, is what a model module reads, and the trainers' names are still there."""
    import dgrpo.training.wording as trainers
    import dgrpo.wording as lower

    for name in ("command_line_words", "in_command_line", "init_named", "setting_named", "settings_named"):
        assert getattr(trainers, name) is getattr(lower, name), name
    assert not lower.in_command_line()
    with trainers.command_line_words():
        assert lower.in_command_line()
    assert not lower.in_command_line()


def test_a_plain_lms_untrained_markers_warning_names_the_callers_way_to_train_them(tokenizer, task_records):
    """GRPO on a plain LM (its latent markers new): the warning told a Python caller to run ``dgrpo sft --init
    MODEL``; from Python it names train_sft and the model to load from its run, the command line its commands."""
    from dgrpo.training.grpo import GRPOTrainer

    cfg = tiny_config()
    with pytest.warns(UserWarning, match=r"train them first: train_sft on the model, then GRPO from LatentLM"):
        GRPOTrainer(make_lm(tokenizer), cfg, task_records)
    with command_line_words(), pytest.warns(UserWarning, match=r"train them first: dgrpo sft --init MODEL, then"):
        GRPOTrainer(make_lm(tokenizer), cfg, task_records)


def test_an_sft_epoch_kept_on_failure_names_the_call_that_resumes_it():
    """An SFT epoch's end that failed keeps its training: the line said "the same command resumes" to a Python caller
    of train_sft; from Python it is the same call with resume='auto'."""
    from pathlib import Path
    from types import SimpleNamespace

    from dgrpo.training.curriculum import Curriculum
    from dgrpo.training.distributed import Dist
    from dgrpo.training.sft import _epoch_kept_on_failure

    lines: list[str] = []
    sft = SimpleNamespace(
        dist=Dist.single(),
        plan=Curriculum(tiny_config(), steps_per_epoch=4),
        save=lambda epoch, batch: None,
        run=SimpleNamespace(metrics=SimpleNamespace(n_rows=lambda: 0), out_dir=Path("out"), log=lines.append),
    )
    with pytest.raises(RuntimeError), _epoch_kept_on_failure(sft, 2):
        raise RuntimeError("scorer failed")
    with command_line_words(), pytest.raises(RuntimeError), _epoch_kept_on_failure(sft, 2):
        raise RuntimeError("scorer failed")
    assert lines[0].endswith(": the same call (resume='auto') resumes at the epoch's end (its validation)"), lines
    assert lines[1].endswith(": the same command resumes at the epoch's end (its validation)"), lines
