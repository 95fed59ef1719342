"""A preallocated KV cache whose layers share one write offset (:func:`static_cache`, the fast engine's cache).

transformers' ``StaticLayer`` keeps a write offset per layer and, in every layer of every forward call, computes the
columns it writes (an ``arange`` plus the offset) and advances its offset: three small kernels per layer besides the
two writes. Every full-attention layer of a call writes the same columns, so here the first layer computes them and
advances the one offset all layers share; the others only write. Over 28 layers that is 81 kernels fewer per forward
call: in the fast engine's one-position steps, 70 calls a paper-scale rollout, whose CUDA graphs still execute every
kernel they captured. The keys and values written, and so every result, are the same bit for bit
(tests/test_static_cache.py). A model with other kinds of cache layers (sliding-window, linear attention) gets
transformers' own ``StaticCache`` as it is.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from transformers import PretrainedConfig, StaticCache
from transformers.cache_utils import StaticLayer

from ..config import ConfigError


class SharedColumns:
    """The write offset the layers of one cache share, and the columns the current forward call writes (set by the
    first layer, read by the others)."""

    def __init__(self, device: torch.device):
        self.offset = torch.zeros((), dtype=torch.long, device=device)
        self.columns = torch.zeros(0, dtype=torch.long, device=device)


class SharedOffsetLayer(StaticLayer):
    """A ``StaticLayer`` that writes at the columns its cache's first layer computed for the call."""

    def __init__(self, max_cache_len: int, shared: SharedColumns, first: bool):
        super().__init__(max_cache_len)
        self.shared, self.first = shared, first
        # what transformers reads as the cached length (get_seq_length) and zeroes in reset(): the shared offset
        self.cumulative_length = shared.offset

    def update(self, key_states: Tensor, value_states: Tensor, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
        shared = self.shared
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
            self.cumulative_length = shared.offset  # (lazy_initialization rebinds it to a .to(device) of itself)
        if self.first:  # the decoder's layers run in order: the first one's columns serve the whole call
            shared.columns = torch.arange(key_states.shape[-2], device=shared.offset.device) + shared.offset
            shared.offset.add_(key_states.shape[-2])
        keys, values = self.keys, self.values
        assert keys is not None and values is not None  # (allocated by lazy_initialization)
        keys.index_copy_(2, shared.columns, key_states)
        values.index_copy_(2, shared.columns, value_states)
        return keys, values

    def crop(self, tokens_to_remove: int) -> None:
        """transformers' crop (a negative count: the last positions are written over next), with the shared offset
        moved back once, by the first layer (each layer moved it: back by the count times the number of layers)."""
        if self.first:
            super().crop(tokens_to_remove)


def static_cache_obstacle(config: PretrainedConfig) -> str | None:
    """Why a model of ``config`` cannot decode over a preallocated cache (None: it can). An ALiBi model (Bloom; Falcon
    with ``alibi``) builds its position bias from the 2-d attention mask, which is shorter than the cache: a tensor
    shape error inside transformers. GPT-Neo's local attention is given full-attention layers (wrong tokens past its
    window)."""
    if getattr(config, "model_type", None) == "bloom" or getattr(config, "alibi", False):
        return f"{config.model_type} builds its ALiBi position bias from the attention mask, not over a static cache"
    if getattr(config, "model_type", None) == "gpt_neo" and "local" in getattr(config, "attention_layers", []):
        # (transformers' StaticCache gives its local layers full-attention ones: other tokens once past the window)
        return "gpt_neo's local-attention layers need a sliding-window cache that a static cache does not give them"
    return None


def static_cache(config: PretrainedConfig, max_cache_len: int, device: torch.device) -> StaticCache:
    """An empty ``StaticCache`` of ``max_cache_len`` positions for a model of ``config`` on ``device``: its layers
    sharing one write offset when they are all full-attention ``StaticLayer``\\ s, transformers' own layers else."""
    if (why := static_cache_obstacle(config)) is not None:
        raise ConfigError(f"a static KV cache (grpo.rollout_cache=static, grpo.engine=fast) cannot be used: {why}")
    cache = StaticCache(config=config, max_cache_len=max_cache_len)
    layers = getattr(cache, "layers", [])
    if layers and all(type(layer) is StaticLayer for layer in layers):
        shared = SharedColumns(device)
        cache.layers = [SharedOffsetLayer(max_cache_len, shared, first=i == 0) for i in range(len(layers))]
        return cache
    # transformers keeps each layer's write offset in a host tensor that the layer's first update copies to the
    # device: a host wait per layer in the middle of the prompt's forward. Made on the device here (a fill, no copy),
    # the first update finds it there.
    for layer in layers:
        offset = getattr(layer, "cumulative_length", None)
        if isinstance(offset, Tensor) and offset.device != device:
            layer.cumulative_length = torch.full((), int(offset), dtype=offset.dtype, device=device)
    return cache
