"""The 4-d attention mask of a cached forward call, built on the device without asking the host anything.

Given a 2-d padding mask, Hugging Face's mask builder (``transformers.masking_utils``) first reads whether it has any
zero (``padding_mask.sum() == numel``, once or twice per forward call), to hand SDPA ``is_causal`` instead of a mask
when there is no padding. On a GPU that read makes the host wait until every kernel queued before it has run. Given a
4-d mask, the model uses it as it is. :func:`causal_padding_mask` builds the boolean mask Hugging Face builds for a
padded batch (:func:`static_causal_padding_mask`: over a static cache's columns); :func:`prebuilt_mask_applies` says
for which models that mask is the whole story (SDPA attention, every layer full causal attention, an architecture
whose mask the tests compare with Hugging Face's; SDPA attention with packed grouped queries, too:
:mod:`dgrpo.model.gqa_attention`).

SDPA turns a boolean mask into an additive one (0 where attended, -inf elsewhere, in the queries' dtype) inside
every layer's call: two fills and a select, each a kernel on a GPU, 28 layers a call for Qwen2.5-1.5B.
:func:`additive_mask` makes that mask once per forward call; the layers then use it as it is (the same values, so
the same results bit for bit).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .gqa_attention import PACKED_GQA

#: model types whose decoders read a 4-d boolean mask as Hugging Face's own (tests/test_latent_model.py compares them)
CHECKED_MODEL_TYPES = ("qwen2", "llama", "gpt2")


def prebuilt_mask_applies(config: Any) -> bool:
    """Whether ``causal_padding_mask`` is the mask this model would build: SDPA attention (eager attention wants an
    additive float mask, FlashAttention a 2-d one), no sliding-window or chunked layers, a checked architecture."""
    if getattr(config, "_attn_implementation", None) not in ("sdpa", PACKED_GQA):
        return False
    if getattr(config, "model_type", None) not in CHECKED_MODEL_TYPES:
        return False
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        return all(t == "full_attention" for t in layer_types)
    return getattr(config, "sliding_window", None) is None


def causal_padding_mask(attention_mask: Tensor, q_len: int) -> Tensor:
    """[B, 1, q_len, S] bool from a [B, S] padding mask (1 = a real column) whose last ``q_len`` columns are this
    call's queries: query i sees column j when j <= S - q_len + i and column j is real."""
    if q_len == 1:  # one query at the last column: it sees every real column
        return attention_mask.bool()[:, None, None, :]
    S = attention_mask.shape[1]
    dev = attention_mask.device
    q_pos = torch.arange(S - q_len, S, device=dev)[:, None]
    causal = torch.arange(S, device=dev)[None, :] <= q_pos  # [q_len, S]
    return causal[None, None] & attention_mask.bool()[:, None, None, :]


def static_causal_padding_mask(attention_mask: Tensor, q_len: int, cache_len: int) -> Tensor:
    """:func:`causal_padding_mask` over a static cache of ``cache_len`` columns, of which the [B, S] mask gives the
    first S (its last ``q_len`` this call's queries): [B, 1, q_len, cache_len], the columns after S (not written yet)
    masked."""
    mask = causal_padding_mask(attention_mask, q_len)
    extra = cache_len - attention_mask.shape[1]
    if extra < 0:
        raise ValueError(f"a mask of {attention_mask.shape[1]} columns for a static cache of {cache_len}")
    return mask if extra == 0 else torch.cat([mask, mask.new_zeros(*mask.shape[:3], extra)], dim=3)


def additive_mask(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """The boolean ``mask`` as SDPA's additive mask in ``dtype`` (the queries'): 0 where it is True, -inf elsewhere,
    the values SDPA would make of it in each layer (two kernels here, once per call, instead of three per layer)."""
    return torch.full(mask.shape, float("-inf"), dtype=dtype, device=mask.device).masked_fill_(mask, 0.0)
