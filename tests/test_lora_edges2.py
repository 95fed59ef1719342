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
