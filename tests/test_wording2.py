"""Refusals worded for their caller: the command line's options while it runs a trainer
(:func:`dgrpo.training.wording.command_line_words`), else what a Python caller sets or passes."""

import re

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
