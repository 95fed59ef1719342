"""Gaps found by walking the README's library tour, command line, LoRA and tracking sections as a user would."""

from __future__ import annotations


def test_plot_help_names_every_panel_draw_accepts():
    """``dgrpo plot --help`` lists every panel name that ``--panels`` accepts: each of the plotting module's
    ``PANELS`` and a reward part (``reward/<part>``), which the help once left out though an unknown panel's error
    offered it."""
    from dgrpo.cli import build_parser
    from dgrpo.plotting.draw import PANELS

    sub = next(a for a in build_parser()._actions if a.dest == "cmd")
    text = " ".join(sub.choices["plot"].format_help().split())
    assert all(name in text for name in PANELS)
    assert "reward/<part>" in text


def test_data_and_config_without_a_subcommand_name_none_of_the_parsers_internals(capsys):
    """``dgrpo data`` and ``dgrpo config`` without their sub-command exit 2 with a usage line that asks for a COMMAND,
    as ``dgrpo`` alone does: the error named the parser's internal destination (``data_cmd``, ``config_cmd``)."""
    import pytest

    from dgrpo.cli import build_parser

    for cmd in ("data", "config"):
        with pytest.raises(SystemExit) as stop:
            build_parser().parse_args([cmd])
        assert stop.value.code == 2
        err = capsys.readouterr().err
        assert "required: COMMAND" in err and "_cmd" not in err, err


def test_an_adapter_refuses_a_base_whose_weights_changed_under_its_manifest(lora_base_dirs, tokenizer, tmp_path):
    """A local base whose weight file was overwritten in place (its manifest.json left as dgrpo wrote it) is refused
    in one line when an adapter on it loads, as the base loaded alone is: the adapter's base fingerprint is read from
    the base's manifest, so the changed weights loaded silently under the adapter."""
    import shutil

    import pytest
    import torch

    from conftest import make_lm

    pytest.importorskip("peft")
    from dgrpo.config import LoraConfig
    from dgrpo.model import lora
    from dgrpo.model.latent_lm import LatentLM
    from dgrpo.model.verified import CheckpointError

    shutil.copytree(lora_base_dirs / "qwen2", tmp_path / "base")  # (the session's tiny base, shared with test_lora)
    lm = LatentLM.from_pretrained(tmp_path / "base")
    with torch.random.fork_rng():
        torch.manual_seed(0)
        lora.apply_lora(lm, LoraConfig(r=4, alpha=8.0))
    lm.save_pretrained(tmp_path / "adapter")
    make_lm(tokenizer, "qwen2", seed=1).save_pretrained(tmp_path / "other")
    shutil.copyfile(tmp_path / "other" / "model.safetensors", tmp_path / "base" / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"base.* is damaged: checksum mismatch in model\.safetensors"):
        LatentLM.from_pretrained(tmp_path / "base")
    with pytest.raises(CheckpointError, match=r"base.* is damaged: checksum mismatch in model\.safetensors"):
        LatentLM.from_pretrained(tmp_path / "adapter")
