"""SDPA attention for grouped-query models without repeating the keys and values (``model.pack_gqa``).

Qwen2.5-1.5B has 12 query heads and 2 key/value heads. Hugging Face's SDPA attention hands a call of several
positions to PyTorch's masked kernels with the keys and values repeated to 12 heads (``repeat_kv``, a materialised
copy of each, and in backward a sum over the copies), since CUDA's masked kernels take no grouped heads (one-position
calls it already packs, below). On the paper step that copying took ~70 ms of kernel time on an H200 (bench/RESULTS.md,
2026-11-27): the rollouts' prompt forward over a 128-column static cache, the update's and the reference's calls,
and the recomputation of each layer.

Here the queries move instead: the ``n_rep`` query heads that share a key/value head become ``n_rep`` times as many
query rows of that head (row ``l * n_rep + r``: position l, head r of the group), and the 4-d mask's rows are repeated
to match, once per forward call (every layer gets the same mask object). Attention of a row depends only on its
query, the keys, the values and its mask row, so the output, unpacked, is the same arithmetic; the copies are one of
the queries (one call's positions, against the keys' and values' cache columns) and one of the mask per call.
Calls this does not serve (one position, no 4-d mask, attention dropout, a sliding window, a position bias) go to
Hugging Face's SDPA attention as they are. The models' ``_attn_implementation`` becomes :data:`PACKED_GQA` (the mask
builder of SDPA serves it); checkpoints do not record it.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import Tensor, nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

#: the attention implementation's name (registered with transformers beside "sdpa")
PACKED_GQA = "dgrpo_packed_gqa_sdpa"

#: (weakref to the 4-d mask, its version, n_rep, columns, packed rows)
_last_mask: tuple[Any, int, int, int, Tensor] | None = None


def packed_mask(mask: Tensor, n_rep: int, columns: int | None = None) -> Tensor:
    """The rows of a [B, 1, L, S] mask (its first ``columns`` columns: the keys') repeated for the packed queries,
    [B, 1, L * n_rep, columns]; the last mask's reused while it is the same object, unchanged (every layer of a
    forward call gets the same one)."""
    global _last_mask
    columns = mask.shape[3] if columns is None else columns
    if torch.compiler.is_compiling() or mask.is_inference():  # (no state kept inside a compiled graph; an inference
        return mask[:, :, :, :columns].repeat_interleave(n_rep, dim=2)  # tensor has no version counter to tell by)
    last = _last_mask
    if last is not None and last[0]() is mask and last[1:4] == (mask._version, n_rep, columns):
        return last[4]
    rows = mask[:, :, :, :columns].repeat_interleave(n_rep, dim=2)
    _last_mask = (weakref.ref(mask), mask._version, n_rep, columns, rows)
    return rows


#: the keyword arguments of Hugging Face's SDPA attention that change what it computes (the others, such as
#: ``position_ids`` or ``use_cache``, pass through it unread); given (not None, not False: a position bias is a
#: tensor, whose truth value is an error or its one element's), the call goes to SDPA
_SDPA_EXTRAS = ("position_bias", "softcap", "output_attentions", "sliding_window")


def packs(module: nn.Module, query: Tensor, mask: Tensor | None, dropout: float, kwargs: dict) -> bool:
    """Whether this call runs packed: grouped heads, several positions, a [B, 1, L, S] mask, no dropout, no sliding
    window, no position bias or soft cap."""
    n_rep = getattr(module, "num_key_value_groups", 1)
    return (
        n_rep > 1
        and query.shape[2] > 1
        and mask is not None
        and mask.dim() == 4
        and mask.shape[1] == 1
        and dropout == 0.0
        and all(kwargs.get(k) is None or kwargs.get(k) is False for k in _SDPA_EXTRAS)
    )


def packed_gqa_sdpa_forward(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """Hugging Face's attention-function signature: query [B, H, L, D], key and value [B, G, S, D]; returns the
    output [B, L, H, D] (contiguous) and no weights."""
    if not packs(module, query, attention_mask, dropout, kwargs):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    assert attention_mask is not None
    B, H, L, D = query.shape
    G, S = key.shape[1], key.shape[2]
    n_rep = H // G
    q = query.transpose(1, 2).reshape(B, L, G, n_rep, D).transpose(1, 2).reshape(B, G, L * n_rep, D)
    mask = packed_mask(attention_mask, n_rep, S)  # (a mask wider than the keys: its first S columns, as HF's SDPA)
    out = torch.nn.functional.scaled_dot_product_attention(q, key, value, attn_mask=mask, scale=scaling)
    return out.view(B, G, L, n_rep, D).transpose(1, 2).reshape(B, L, H, D), None


AttentionInterface.register(PACKED_GQA, packed_gqa_sdpa_forward)
AttentionMaskInterface.register(PACKED_GQA, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])


def use_packed_gqa(model: nn.Module, on: bool) -> bool:
    """Switch a Hugging Face model (or a PEFT model around one) between SDPA attention and :data:`PACKED_GQA`; only a
    model on SDPA attention through the attention-function registry, with grouped heads, is switched on. Returns
    whether it now runs packed."""
    base = getattr(model, "get_base_model", lambda: model)()
    config: Any = base.config
    current = getattr(config, "_attn_implementation", None)
    heads, kv_heads = getattr(config, "num_attention_heads", 0), getattr(config, "num_key_value_heads", None)
    # only a model whose attention calls the registered attention functions (``_supports_attention_backend``): one
    # that tests ``_attn_implementation == "sdpa"`` itself (Falcon) would fall to its eager branch under another
    # name and lose its causal mask
    routed = bool(getattr(base, "_supports_attention_backend", False))
    if on and routed and current == "sdpa" and kv_heads is not None and kv_heads < heads:
        config._attn_implementation = PACKED_GQA
    elif not on and current == PACKED_GQA:
        config._attn_implementation = "sdpa"
    return config._attn_implementation == PACKED_GQA
