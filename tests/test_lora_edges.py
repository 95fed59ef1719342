"""``model.lora.target_modules`` refused in one line: the linear layers it suggests are ones an adapter can go on."""

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


@pytest.mark.parametrize(
    ("arch", "wrong", "unsuited"),
    [("gpt2", "q_proj", "ln_f"), ("qwen2", "c_attn", "norm")],
)
def test_a_tied_head_is_not_suggested_as_a_target(lora_base_dirs, arch, wrong, unsuited) -> None:
    """A misspelt target (or a norm) on a model whose head shares its weight with the input embeddings: the line
    listed ``lm_head`` among the layers to name, which the next run then refused (tie_word_embeddings). Every layer
    it lists now takes an adapter."""
    for target in (wrong, unsuited):
        lm = LatentLM.from_pretrained(lora_base_dirs / arch)
        with pytest.raises(ConfigError) as e:
            lora.apply_lora(lm, LoraConfig(r=2, target_modules=[target]))
        suggested = _suggested(str(e.value))
        assert "lm_head" not in suggested and len(suggested) >= 3, str(e.value)
        lora.apply_lora(lm, LoraConfig(r=2, target_modules=suggested))  # (each of them takes an adapter)


def test_an_untied_head_is_still_suggested(lora_base_dirs) -> None:
    """Llama's head has a weight of its own: an adapter can go there without trainable latent rows on it
    (``train_latent_tokens=false``; with them, tests/test_lora_edges2.py)."""
    lm = LatentLM.from_pretrained(lora_base_dirs / "llama")
    with pytest.raises(ConfigError) as e:
        lora.apply_lora(lm, LoraConfig(r=2, target_modules=["c_attn"], train_latent_tokens=False))
    assert "lm_head" in _suggested(str(e.value))
