"""Which Hugging Face model families dgrpo cannot run, or cannot train, and why: checked from the model's config
when a :class:`~dgrpo.model.latent_lm.LatentLM` is built and when a trainer starts, so that they are one line
instead of an error deep inside transformers or, worse, wrong numbers."""

from __future__ import annotations

from typing import Any

#: families whose cached forward applies the whole 2-d attention mask to a one-token step's hidden states
#: (``hidden * mask[:, :, None]``): wrong tokens when decoding, a shape error when scoring
_MASK_ON_STEPS = ("mamba", "falcon_mamba")
#: families whose layers keep a recurrent (state-space) state updated in place in the cache; with those
#: whose ``layer_types`` name such layers (``linear_attention``, ``mamba``)
_IN_PLACE_STATE = ("mamba2", "falcon_h1")
_RECURRENT_LAYER_TYPES = ("linear_attention", "mamba")


def unsupported(config: Any) -> str | None:
    """Why dgrpo cannot run a model of ``config`` at all (None: it can)."""
    model_type = str(getattr(config, "model_type", ""))
    if model_type in _MASK_ON_STEPS:
        return (
            f"{model_type} models are not supported: their cached forward applies the whole attention mask to each "
            "new step's hidden states, so answers decoded over a cache would be wrong (Mamba 2 models decode)"
        )
    if model_type.startswith("gemma4") and (getattr(config, "hidden_size_per_layer_input", 0) or 0) > 0:
        return (
            f"{model_type} with per-layer inputs (hidden_size_per_layer_input="
            f"{config.hidden_size_per_layer_input}) is not supported: they are looked up from the input token ids, "
            "which a latent thought (a hidden state fed back as the next input) does not have"
        )
    return None


def untrainable(config: Any) -> str | None:
    """Why dgrpo cannot train a model of ``config`` (None: it can): evaluation and generation may still work."""
    model_type = str(getattr(config, "model_type", ""))
    layer_types = [str(t) for t in (getattr(config, "layer_types", None) or [])]
    recurrent = sorted({t for t in layer_types if t in _RECURRENT_LAYER_TYPES})
    if model_type in _IN_PLACE_STATE or recurrent:
        which = f"its {' and '.join(recurrent)} layers keep" if recurrent else "its state-space layers keep"
        return (
            f"{model_type} cannot be trained by dgrpo: {which} a recurrent state that the cache updates in place, "
            "which backpropagation through the latent thoughts and the answer cannot go through (evaluation works)"
        )
    return None
