"""Activation recomputation through the latent recurrence, one cached forward call at a time.

Backprop through the recurrence keeps every activation of every forward call (the prompt, each latent step, the
answer) until the backward pass. With recomputation on (``LatentLM.recompute``; ``grpo.recompute`` /
``sft.recompute``), each call keeps only its inputs: the input ids or embeddings, the attention mask, the positions
and the past keys and values; the decoder stack is run again in backward. Hugging Face's layer checkpointing cannot
be used here because it turns the KV cache off, so the region is our own :func:`torch.utils.checkpoint.checkpoint`
around the whole cached call, with the cache's tensors as explicit inputs and outputs: inside the region a
``DynamicCache`` is rebuilt from the past tensors, and the call's updated keys and values leave it as outputs.

The perturbation must act in the recomputation exactly as in the forward. The forward runs inside the perturbation's
``with`` block; the backward (and so the recomputation) runs after it, so the region re-enters the perturbation for
its second run: the seeded masks, noise and RNG states come back identical (replay is what the method rests on).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
import torch.utils.checkpoint
from torch import Tensor
from transformers import DynamicCache


def cache_tensors(cache: DynamicCache) -> list[Tensor]:
    """The cache's keys and values, layer by layer: [k_0, v_0, k_1, v_1, ...] (empty before the first call)."""
    out: list[Tensor] = []
    layers: list[Any] = list(cache.layers)
    for layer in layers:
        if not hasattr(layer, "keys"):
            raise NotImplementedError(f"recompute: cache layers of type {type(layer).__name__} hold no keys/values")
        if not getattr(layer, "is_initialized", False):
            return []
        out += [layer.keys, layer.values]
    return out


def load_cache(cache: DynamicCache, tensors: Sequence[Tensor]) -> None:
    """Make ``cache`` hold ``tensors`` (as :func:`cache_tensors` lists them): stored as they are in initialized
    layers, through ``update`` (the public way to fill an empty layer) otherwise."""
    if len(tensors) != 2 * len(cache.layers):
        raise ValueError(f"{len(tensors)} cache tensors for {len(cache.layers)} layers")
    layers: list[Any] = list(cache.layers)
    for i, layer in enumerate(layers):
        k, v = tensors[2 * i], tensors[2 * i + 1]
        if getattr(layer, "is_initialized", False):
            layer.keys, layer.values = k, v
        else:
            cache.update(k, v, i)


def recomputed_call(
    run: Callable[..., Tensor],
    cache: DynamicCache,
    new_cache: Callable[[], DynamicCache],
    inputs: Sequence[Tensor],
    perturbation: Any = None,
) -> Tensor:
    """``run(cache_in_region, *inputs)`` (one cached forward of the decoder, returning its last hidden states) as a
    checkpointed region: only ``inputs`` and the past cache tensors are kept for backward. ``cache`` is updated with
    the call's keys and values, as an uncheckpointed call would leave it; ``new_cache()`` builds the empty cache the
    region fills from the past tensors; ``perturbation`` (a context manager, or None) is re-entered for the
    recomputation in backward."""
    past = cache_tensors(cache)
    n_inputs = len(inputs)
    calls = 0

    def region(*tensors: Tensor) -> tuple[Tensor, ...]:
        nonlocal calls
        again, calls = calls > 0, calls + 1  # the second run is the recomputation, outside the perturbation's block
        inner = new_cache()
        if len(tensors) > n_inputs:
            load_cache(inner, tensors[n_inputs:])
        ctx: AbstractContextManager[Any] = nullcontext()
        if again and perturbation is not None and hasattr(perturbation, "__enter__"):
            ctx = perturbation
        with ctx:
            hidden = run(inner, *tensors[:n_inputs])
        return (hidden, *cache_tensors(inner))

    hidden, *kv = torch.utils.checkpoint.checkpoint(region, *inputs, *past, use_reentrant=False)
    load_cache(cache, kv)
    return hidden
