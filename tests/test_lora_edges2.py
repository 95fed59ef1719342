"""LoRA on a model folder of one's own: what a refusal suggests, and the adapter folder loaded by plain PEFT."""

import re

import pytest

pytest.importorskip("peft")

from dgrpo.config import ConfigError, LoraConfig  # noqa: E402
from dgrpo.model import lora  # noqa: E402
from dgrpo.model.latent_lm import LatentLM  # noqa: E402


def _suggested(message: str) -> list[str]:
    """The layer names a refusal lists (``its linear layers: a, b; or all-linear`` / ``linear layers (a, b), or``)."""
    found = re.search(r"linear layers:? \(?([^;)]*)[;)]", message)
    assert found, message
    return found.group(1).split(", ")


@pytest.mark.parametrize("target", ["c_attn", "norm"])
def test_an_untied_head_is_not_suggested_when_its_latent_rows_train(lora_base_dirs, target) -> None:
    """Llama (untied head) with ``train_latent_tokens`` (the default): a misspelt target, or a norm, listed ``lm_head``
    among the layers to name, and the next run refused it (the head holds latent rows PEFT trains). Every layer it
    lists now takes an adapter beside the trained rows."""
    lm = LatentLM.from_pretrained(lora_base_dirs / "llama")
    with pytest.raises(ConfigError) as e:
        lora.apply_lora(lm, LoraConfig(r=2, target_modules=[target]))
    suggested = _suggested(str(e.value))
    assert "lm_head" not in suggested and len(suggested) >= 7, str(e.value)
    lora.apply_lora(lm, LoraConfig(r=2, target_modules=suggested))  # (each of them takes an adapter)


def _readme_plain_peft_block() -> str:
    """The README's Python lines that load a dgrpo adapter folder with PEFT alone (``**Without dgrpo**``)."""
    import textwrap
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    found = re.search(r"\* \*\*Without dgrpo\*\*.*?```python\n(.*?)```", text, flags=re.DOTALL)
    assert found, "README.md: the LoRA section's **Without dgrpo** lines are gone"
    return textwrap.dedent(found.group(1))


@pytest.mark.parametrize(("arch", "train_latent_tokens"), [("llama", True), ("llama", False), ("qwen2", False)])
def test_the_readmes_plain_peft_lines_load_an_adapter_on_a_base_dgrpo_enlarged(
    tokenizer, tmp_path, arch, train_latent_tokens
) -> None:
    """A base as the hub gives it (its tokenizer without the latent markers) trained with LoRA: PEFT alone
    (``PeftModel.from_pretrained`` on the base) failed in an IndexError (the markers' rows were past its embedding),
    and with ``train_latent_tokens: false`` the markers' rows are only in ``latent_rows.safetensors``. The README's
    lines give the logits dgrpo's own loading computes, on a plain input that holds the markers."""
    import torch

    from dgrpo.model.anatomy import input_embedding_weight
    from dgrpo.model.tiny import build_tiny_model

    base = tmp_path / "base"
    build_tiny_model(
        arch, len(tokenizer), hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64
    ).save_pretrained(base)
    tokenizer.save_pretrained(base)
    lm = LatentLM.from_pretrained(str(base))
    assert lm.new_latent_tokens and input_embedding_weight(lm.model).shape[0] > len(tokenizer)
    lora.apply_lora(lm, LoraConfig(r=2, train_latent_tokens=train_latent_tokens))
    torch.manual_seed(1)
    with torch.no_grad():  # (a trained adapter, and trained markers' rows: neither is what a fresh one holds)
        for p in lm.model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.5)
        if not train_latent_tokens:
            input_embedding_weight(lm.model)[[lm.start_id, lm.latent_id, lm.end_id]] += 1.0
    (tmp_path / "runs/7b/grpo").mkdir(parents=True)
    lm.save_pretrained(tmp_path / "runs/7b/grpo/final")
    ids = torch.tensor([[5, 6, 7, lm.start_id, lm.latent_id, lm.latent_id, lm.end_id, 9]])
    loaded = LatentLM.from_pretrained(tmp_path / "runs/7b/grpo/final")
    loaded.model.eval()
    with torch.no_grad():
        expected = loaded.model(input_ids=ids).logits

    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    with pytest.raises(IndexError):  # (the README: PEFT alone on the base as its files hold it)
        alone = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), tmp_path / "runs/7b/grpo/final")
        alone(input_ids=ids)

    code = _readme_plain_peft_block().replace('Path("runs/', f'Path("{tmp_path}/runs/')
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)
    with torch.no_grad():
        got = scope["lm"](input_ids=ids).logits
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    if train_latent_tokens:  # (the README: AutoPeftModel resizes by itself; the rows are then PEFT's trainable tokens)
        from peft import AutoPeftModelForCausalLM

        auto = AutoPeftModelForCausalLM.from_pretrained(tmp_path / "runs/7b/grpo/final").eval()
        with torch.no_grad():
            torch.testing.assert_close(auto(input_ids=ids).logits, expected, rtol=0, atol=1e-5)
