"""Hub models and LoRA adapters, the last rough edges: the line that refuses a tokenizer without EOS."""

import json

import pytest

from dgrpo.model.latent_lm import LatentLM
from dgrpo.model.verified import CheckpointError

from conftest import make_lm


def _without_eos(folder) -> None:
    """``folder``'s tokenizer without its EOS token (a model folder of one's own: no manifest)."""
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**settings, "eos_token": None}))
    (folder / "manifest.json").unlink()


def test_a_folder_whose_tokenizer_has_no_eos_is_told_the_file_to_set_it_in(tokenizer, tmp_path):
    """The line was 'cannot load the model DIR: ValueError: the tokenizer has no EOS token ...: set one before building
    the LatentLM (tokenizer.eos_token = ...)': the exception's class name as noise, and a Python call the command
    line cannot make. It names the file to set it in, and setting it there loads the model."""
    make_lm(tokenizer).save_pretrained(tmp_path / "no-eos")
    _without_eos(tmp_path / "no-eos")
    config = tmp_path / "no-eos" / "tokenizer_config.json"
    with pytest.raises(CheckpointError) as e:
        LatentLM.from_pretrained(tmp_path / "no-eos")
    said = str(e.value)
    assert said.startswith(f"cannot load the model {tmp_path / 'no-eos'}: the tokenizer has no EOS token"), said
    assert "ValueError" not in said and "LatentLM" not in said
    assert f'set "eos_token" in {config} to the token its texts end with' in said
    config.write_text(json.dumps({**json.loads(config.read_text()), "eos_token": "<eos>"}))
    assert LatentLM.from_pretrained(tmp_path / "no-eos").tokenizer.eos_token == "<eos>"


def test_a_hub_tokenizer_without_eos_is_told_to_download_it_and_the_python_one_its_attribute():
    from types import SimpleNamespace

    from dgrpo.model.tokens import check_special_tokens

    none = SimpleNamespace(eos_token_id=None, pad_token_id=None)
    with pytest.raises(ValueError, match=r"^the tokenizer has no EOS token: download the model \(hf download org/m "):
        check_special_tokens(none, "org/m")
    with pytest.raises(ValueError, match=r"^the tokenizer has no EOS token: set one before building the LatentLM: "):
        check_special_tokens(none)
