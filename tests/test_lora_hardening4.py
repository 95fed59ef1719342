"""Hub models and LoRA adapters, the last rough edges: the line that refuses a tokenizer without EOS, GRPO's replay on
a model whose config has its own dropout on (GPT-2's hub configs: 0.1), the card an adapter folder carries, and an
adapter named onto a base of another size."""

import json

import pytest
import torch

from dgrpo.model.latent_lm import LatentLM
from dgrpo.model.verified import CheckpointError

from conftest import make_lm, tiny_config


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


@pytest.fixture(scope="module")
def gpt2_with_dropout(tokenizer, tmp_path_factory):
    """A tiny GPT-2 saved with its config's dropout at the hub's 0.1 (resid, attn, embd), as GPT-2's own files have."""
    from transformers import AutoModelForCausalLM

    config = make_lm(tokenizer, "gpt2").model.config
    config.resid_pdrop = config.attn_pdrop = config.embd_pdrop = 0.1
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("gpt2-dropout") / "gpt2"
    LatentLM(AutoModelForCausalLM.from_config(config), make_lm(tokenizer, "gpt2").tokenizer).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("r", [0, 4])
def test_grpo_replays_exactly_on_a_model_whose_config_has_dropout_handed_in_train_mode(
    gpt2_with_dropout, task_records, r
):
    """GRPO's only noise is the seeded perturbation: the model's own dropout modules (GPT-2's at 0.1) stay off in the
    rollouts and in the update, even for a model handed over in train mode (after an SFT in this process), with
    adapters or without; else the update would score other networks than the rollouts sampled (ratios noise)."""
    if r:
        pytest.importorskip("peft")
    from dgrpo.model.factory import load_model
    from dgrpo.training.grpo import GRPOTrainer

    assert any(
        isinstance(m, torch.nn.Dropout) and m.p == 0.1 for m in LatentLM.from_pretrained(gpt2_with_dropout).modules()
    )
    sets = {"grpo.mini_epochs": 2, "grpo.filter": "false", "grpo.prompts_per_step": 4, "grpo.max_new_tokens": 12}
    cfg = tiny_config(**sets, **{"model.lora.r": r, "grpo.lr": 1e-3})
    torch.manual_seed(0)
    lm = load_model(cfg.model, cfg.task, init=str(gpt2_with_dropout)).train()
    metrics = GRPOTrainer(lm, cfg, task_records).step()
    assert metrics["logp_replay_maxdiff"] < 1e-5, metrics["logp_replay_maxdiff"]


def _card_python(card: str, folder) -> list[str]:
    """The card's Python blocks, ``THIS_FOLDER`` replaced by ``folder``."""
    import re

    return [b.replace("THIS_FOLDER", str(folder)) for b in re.findall(r"```python\n(.*?)```", card, flags=re.DOTALL)]


@pytest.mark.parametrize("train_latent_tokens", [True, False])
def test_an_adapter_folder_has_a_card_naming_its_base_whose_lines_load_it(
    lora_base_dirs, tmp_path, train_latent_tokens
):
    """An adapter folder held no README.md (PEFT's own save writes a model card): nothing in it said what it is or how
    to load it. Its card names the base, and its lines load the adapter, with dgrpo and with PEFT alone (the same
    logits on a plain input; with the markers' rows put back from latent_rows.safetensors when the adapter does not
    train them); the manifest lists it."""
    pytest.importorskip("peft")
    from safetensors.torch import load_file

    from dgrpo.config import LoraConfig
    from dgrpo.model import lora

    base = str((lora_base_dirs / "llama").resolve())
    lm = LatentLM.from_pretrained(base)
    lora.apply_lora(lm, LoraConfig(r=2, alpha=4.0, train_latent_tokens=train_latent_tokens))
    with torch.no_grad():
        for p in lm.model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.3)
    lm.save_pretrained(tmp_path / "adapter")
    card = (tmp_path / "adapter" / "README.md").read_text()
    assert f"# LoRA adapter on `{base}`" in card and "base_model:" not in card  # (a local base is no hub id)
    assert "README.md" in json.loads((tmp_path / "adapter" / "manifest.json").read_text())
    ids = torch.tensor([[5, 6, 7, lm.start_id, lm.latent_id, lm.end_id, 9]])
    with torch.no_grad():
        expected = lm.model.eval()(input_ids=ids).logits
    with_dgrpo, alone = _card_python(card, tmp_path / "adapter")
    for code in (with_dgrpo, alone):
        scope: dict = {}
        exec(compile(code, "README.md", "exec"), scope)
        model = scope["lm"].model if code is with_dgrpo else scope["lm"]
        if code is alone and not train_latent_tokens:  # (the card's last line: the markers' rows put back)
            rows = load_file(tmp_path / "adapter" / "latent_rows.safetensors")
            with torch.no_grad():
                model.get_input_embeddings().weight[[lm.start_id, lm.latent_id, lm.end_id]] = rows["input"]
                model.get_output_embeddings().weight[[lm.start_id, lm.latent_id, lm.end_id]] = rows["output"]
        with torch.no_grad():
            torch.testing.assert_close(model.eval()(input_ids=ids).logits, expected, rtol=0, atol=1e-5)
    assert ("latent_rows.safetensors" in card) is not train_latent_tokens


def test_a_hub_bases_card_names_it_for_the_hub_and_a_moved_bases_card_follows_it(lora_base_dirs, tmp_path):
    """A hub base is the card's ``base_model`` (the hub links an uploaded adapter to it) with its revision; an adapter
    pointed to its base's new place (lora.repoint) has its card say the new place, its manifest still consistent."""
    import shutil

    pytest.importorskip("peft")
    from dgrpo.config import LoraConfig
    from dgrpo.model import lora
    from dgrpo.model.verified import check_intact

    card = lora.adapter_card({"base_model_name_or_path": "Qwen/Qwen2.5-7B", "revision": "abc123", "r": 8})
    assert "\nbase_model: Qwen/Qwen2.5-7B\n" in card and "`Qwen/Qwen2.5-7B` at revision `abc123`" in card
    shutil.copytree(lora_base_dirs / "qwen2", tmp_path / "base")
    lm = LatentLM.from_pretrained(tmp_path / "base")
    lora.apply_lora(lm, LoraConfig(r=2, alpha=4.0))
    lm.save_pretrained(tmp_path / "adapter")
    (tmp_path / "base").rename(tmp_path / "moved")
    lora.repoint(tmp_path / "adapter", str(tmp_path / "moved"))
    check_intact(tmp_path / "adapter")
    card = (tmp_path / "adapter" / "README.md").read_text()
    assert f"`{tmp_path / 'moved'}`" in card and f"`{tmp_path / 'base'}`" not in card


def test_an_adapter_put_on_a_base_of_another_size_says_so(lora_base_dirs, tokenizer, tmp_path):
    """An adapter whose adapter_config.json names a base of another width (a hub base records no fingerprint; a
    folder of one's own neither): the line was its folder and 'wrong shapes: <PEFT tensor names>' alone. It says the
    adapter does not fit that base, and what to point base_model_name_or_path at."""
    pytest.importorskip("peft")
    from safetensors.torch import load_file, save_file

    from dgrpo.config import LoraConfig
    from dgrpo.model import lora

    lm = LatentLM.from_pretrained(lora_base_dirs / "llama")
    lora.apply_lora(lm, LoraConfig(r=2, alpha=4.0))
    lm.save_pretrained(tmp_path / "adapter")
    make_lm(tokenizer, "llama", hidden_size=64).save_pretrained(tmp_path / "wider")
    (tmp_path / "wider" / "manifest.json").unlink()  # (a folder of one's own: no fingerprint to compare)
    folder = tmp_path / "adapter"
    config = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(
        json.dumps({**config, "base_model_name_or_path": str(tmp_path / "wider")})
    )
    save_file(load_file(folder / "adapter_model.safetensors"), folder / "adapter_model.safetensors")  # (no fingerprint)
    (folder / "manifest.json").unlink()
    with pytest.raises(CheckpointError) as e:
        LatentLM.from_pretrained(folder)
    said = str(e.value)
    assert said.startswith(
        f"LoRA adapter {folder}: it does not fit the base model {tmp_path / 'wider'} (wrong shapes: "
    )
    assert f"point base_model_name_or_path in {folder / 'adapter_config.json'} to that base" in said


def test_the_moved_base_hint_asks_to_delete_the_manifest_only_while_it_is_there(tmp_path) -> None:
    """The hint said to delete FOLDER/manifest.json after the user had deleted it (the folder then still refused for
    its base): with no manifest, it says to point the adapter's config only."""
    from dgrpo.model.lora import repoint_hint

    folder = tmp_path / "adapter"
    folder.mkdir()
    assert repoint_hint(folder) == (
        f"point base_model_name_or_path in {folder / 'adapter_config.json'} to where the base is now"
    )
    (folder / "manifest.json").write_text("{}")
    assert f"and delete {folder / 'manifest.json'} (it holds that file's checksum" in repoint_hint(folder)
