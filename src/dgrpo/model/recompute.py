"""Activation recomputation through the latent recurrence: per forward call, or per decoder layer of each call.

Backprop through the recurrence keeps every activation of every forward call (the prompt, each latent step, the
answer) until the backward pass. With recomputation on (``LatentLM.recompute``; ``grpo.recompute`` /
``sft.recompute``, granularity ``grpo.recompute_granularity`` / ``sft.recompute_granularity``), activations are
dropped and computed again in backward. Hugging Face's layer checkpointing cannot be used here because it turns the
KV cache off, so the regions are our own :func:`torch.utils.checkpoint.checkpoint`:

* ``call`` (:func:`recomputed_call`): one region around each whole cached call, with the cache's tensors as explicit
  inputs and outputs (inside the region a ``DynamicCache`` is rebuilt from the past tensors). Each call keeps only its
  inputs; its whole decoder stack runs again in backward, so the backward of the widest call (the answer) holds
  every layer's activations of that call at once.
* ``layer`` (:func:`checkpointed_layers`): one region around each decoder layer of each call, the layer's past keys
  and values held by a one-layer stand-in cache (:class:`OneLayerCache`). Each call keeps its layers' inputs; in
  backward one layer's activations are rebuilt at a time: a lower peak (about one layer's activations instead of all
  of them), the same recomputed compute (one more forward). The last layers can be left out
  (``grpo.recompute_kept_layers``): each keeps its activations, saving its share of the second forward.

The perturbation must act in the recomputation exactly as in the forward. The forward runs inside the perturbation's
``with`` block; the backward (and so the recomputation) runs after it, so each region enters the perturbation again
for its second run: the seeded masks, noise and RNG states come back identical (replay is what the method rests on).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import torch
import torch.utils.checkpoint
from torch import Tensor, nn
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from .anatomy import decoder_layers


def unrecomputable_cache_layers(config: Any) -> list[str]:
    """The kinds of cache layer a model's DynamicCache holds other than full attention (sliding-window layers keep
    only the last window of keys and a position counter, which a recomputed call cannot restore: its log-probs and
    gradients came out wrong, not an error); empty when every layer can be recomputed."""
    return sorted(
        {type(layer).__name__ for layer in DynamicCache(config=config).layers if type(layer) is not DynamicLayer}
    )


def interleaved_kv(cache: DynamicCache) -> list[Tensor]:
    """The cache's keys and values, layer by layer: [k_0, v_0, k_1, v_1, ...] (empty before the first call)."""
    out: list[Tensor] = []
    layers: list[Any] = list(cache.layers)
    for layer in layers:
        if type(layer) is not DynamicLayer:  # (LatentLM.use_recompute refuses such a model first)
            raise NotImplementedError(f"recompute: cache layers of type {type(layer).__name__} cannot be restored")
        if not getattr(layer, "is_initialized", False):
            return []
        kv: Any = layer
        out += [kv.keys, kv.values]
    return out


def load_cache(cache: DynamicCache, tensors: Sequence[Tensor]) -> None:
    """Make ``cache`` hold ``tensors`` (as :func:`interleaved_kv` lists them): stored as they are in initialized
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


def checkpoint(region: Callable[..., tuple], *inputs: Tensor) -> tuple:
    """``region(*inputs)`` as a recomputed region: run without grad in the forward, run again with grad in backward.

    PyTorch's reentrant checkpoint: the forward keeps no autograd graph and saves nothing per op, where the
    non-reentrant one packs and unpacks every saved tensor through Python hooks (~18,000 per GRPO step of a
    28-layer model; a third of the update's time on a CPU proxy of host time, bench/RESULTS.md). The reentrant
    form has two rules, both kept
    here: gradients reach the region's parameters only if an input requires grad, so when none does (frozen
    embeddings under LoRA, say) an empty leaf that requires grad enters beside the inputs (the region does not see
    it); and it works with ``backward()``, not ``torch.autograd.grad`` (this library only calls ``backward``). The
    RNG states are saved and restored around the recomputation (native dropout draws from them).
    """
    if torch.is_grad_enabled() and not any(t.requires_grad for t in inputs):
        leaf = torch.empty(0, device=inputs[0].device, requires_grad=True)
        return torch.utils.checkpoint.checkpoint(
            lambda _leaf, *tensors: region(*tensors), leaf, *inputs, use_reentrant=True
        )
    return torch.utils.checkpoint.checkpoint(region, *inputs, use_reentrant=True)


def _reentered(perturbation: Any, layer: nn.Module | None = None) -> AbstractContextManager[Any]:
    """The perturbation entered again for a region's recomputation in backward, which runs after the forward's
    ``with`` block has left: only ``layer``'s sites when given and the perturbation can do that; nothing without one."""
    if perturbation is None or not hasattr(perturbation, "__enter__"):
        return nullcontext()
    if layer is not None and hasattr(perturbation, "within"):
        return perturbation.within(layer)
    return perturbation


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
    past = interleaved_kv(cache)
    n_inputs = len(inputs)
    calls = 0

    def region(*tensors: Tensor) -> tuple[Tensor, ...]:
        nonlocal calls
        again, calls = calls > 0, calls + 1  # the second run is the recomputation, outside the perturbation's block
        inner = new_cache()
        if len(tensors) > n_inputs:
            load_cache(inner, tensors[n_inputs:])
        with _reentered(perturbation) if again else nullcontext():
            hidden = run(inner, *tensors[:n_inputs])
        return (hidden, *interleaved_kv(inner))

    hidden, *kv = checkpoint(region, *inputs, *past)
    load_cache(cache, kv)
    return hidden


class OneLayerCache:
    """One decoder layer's past keys and values, standing in for the model's cache inside a checkpointed layer:
    ``update`` appends the new positions along the sequence, as ``DynamicCache`` does, and keeps the result."""

    def __init__(self, layer_idx: int, keys: Tensor | None = None, values: Tensor | None = None):
        self.layer_idx, self.keys, self.values = layer_idx, keys, values

    def update(self, keys: Tensor, values: Tensor, layer_idx: int, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
        if layer_idx != self.layer_idx:
            raise RuntimeError(f"layer {self.layer_idx}'s cache was asked for layer {layer_idx}")
        if self.keys is not None and self.values is not None:
            keys, values = torch.cat([self.keys, keys], dim=-2), torch.cat([self.values, values], dim=-2)
        self.keys, self.values = keys, values
        return keys, values


def dynamic_layer(cache: Any, i: int) -> DynamicLayer | None:
    """Layer ``i`` of a ``DynamicCache`` of full-attention layers, or None (another cache, or another kind of layer:
    sliding-window, quantized or static layers keep their own bookkeeping)."""
    layer = cache.layers[i] if isinstance(cache, DynamicCache) else None
    return layer if type(layer) is DynamicLayer else None


def _cache_layer(cache: Any, i: int) -> DynamicLayer:
    layer = dynamic_layer(cache, i)
    if layer is None:
        found = type(cache.layers[i]).__name__ if isinstance(cache, DynamicCache) else type(cache).__name__
        raise NotImplementedError(
            f"layer recomputation runs over a DynamicCache of full-attention layers; got {found} (set "
            "grpo.recompute_granularity=call / sft.recompute_granularity=call, or, for sliding-window layers, "
            "recompute=false)"
        )
    return layer


@functools.lru_cache(maxsize=64)
def _method_signature(func: Callable) -> inspect.Signature:
    """A forward method's signature without ``self``, read once per class (every layer of every call asks)."""
    sig = inspect.signature(func)
    return sig.replace(parameters=list(sig.parameters.values())[1:])


def _checkpointed_forward(layer: nn.Module, i: int, perturbation: Any, phase: str) -> Callable:
    """Decoder layer ``i``'s ``forward`` as a checkpointed region over its past keys and values."""
    forward = layer.forward
    func = getattr(forward, "__func__", None)  # the class's function, or None for an instance-level callable
    sig = _method_signature(func) if func is not None else inspect.signature(forward)
    names = list(sig.parameters)
    hidden_name, cache_name = names[0], ("cache" if "cache" in names else "past_key_values")

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        bound = sig.bind(*args, **kwargs)
        cache = bound.arguments.get(cache_name)
        if cache is None:
            return forward(*args, **kwargs)
        stored = _cache_layer(cache, i)
        past = (stored.keys, stored.values) if stored.is_initialized else ()
        hidden = bound.arguments[hidden_name]
        # The region's closure lives as long as its autograd node, so it must not hold the model's cache (nor
        # ``args``/``kwargs``, which do): the cache holds the region's outputs, whose node holds the region, a cycle
        # through C++ that Python's gc cannot see into; every step's graph and cache would stay alive.
        rest = {**bound.arguments, hidden_name: None, cache_name: None}
        calls = 0

        def region(hidden: Tensor, *kv: Tensor) -> tuple[Any, Tensor | None, Tensor | None]:
            nonlocal calls
            again, calls = calls > 0, calls + 1  # the second run is the recomputation, in backward
            inner = OneLayerCache(i, *kv)
            run = inspect.BoundArguments(sig, {**rest, hidden_name: hidden, cache_name: inner})
            with _reentered(perturbation, layer) if again else nullcontext():
                if again and perturbation is not None and hasattr(perturbation, "resume"):
                    perturbation.resume(phase)
                out = forward(*run.args, **run.kwargs)
            return out, inner.keys, inner.values

        out, keys, values = checkpoint(region, hidden, *past)
        if not stored.is_initialized:
            stored.lazy_initialization(keys, values)
        stored.keys, stored.values = keys, values
        return out

    return wrapped


@contextmanager
def checkpointed_layers(
    model: nn.Module, perturbation: Any = None, phase: str = "prompt", kept: Collection[int] = ()
) -> Iterator[None]:
    """Within the block, every decoder layer of ``model`` runs as its own checkpointed region (under grad): it keeps
    its inputs for backward, and its activations are rebuilt there, under ``perturbation`` (a bound perturbation,
    or None) resumed at ``phase``; the layers whose index is in ``kept`` run as they are (they keep their
    activations: no second forward). The layers' own ``forward`` is restored on leaving."""

    def make(layer: nn.Module, i: int) -> Callable:
        return layer.forward if i in kept else _checkpointed_forward(layer, i, perturbation, phase)

    with layer_forwards(model, make):
        yield


def last_layers(n_layers: int, count: int) -> frozenset[int]:
    """The indices of the last ``count`` of ``n_layers`` decoder layers (``grpo.recompute_kept_layers``: the layers
    left out of recomputation; the last ones are the first that backward reaches)."""
    if not 0 <= count <= n_layers:
        raise ValueError(f"{count} layers kept out of recomputation, but the model has {n_layers}")
    return frozenset(range(n_layers - count, n_layers))


@contextmanager
def layer_forwards(model: nn.Module, make: Callable[[nn.Module, int], Callable]) -> Iterator[None]:
    """Within the block, decoder layer i of ``model`` runs ``make(layer, i)`` as its ``forward`` (made from the
    ``forward`` it has on entering); on leaving, each layer gets back the ``forward`` it had."""
    layers = list(decoder_layers(model))
    own = [layer.__dict__.get("forward") for layer in layers]  # an instance-level forward (patched), or None
    try:
        for i, layer in enumerate(layers):
            layer.forward = make(layer, i)
        yield
    finally:
        for layer, forward in zip(layers, own):
            if forward is None:
                del layer.forward
            else:
                layer.forward = forward
