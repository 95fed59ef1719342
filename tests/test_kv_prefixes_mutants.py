"""Saving a growing cache's keys and values once (dgrpo.model.kv_prefixes), pinned where mutation testing found the
tests blind: the values read back in backward, a tensor saved as its own node's output, disabled hooks (a cache
deeper than two layers: tests/test_fast_engine_mutants.py)."""

from __future__ import annotations

import gc
import weakref

import torch
from test_kv_prefixes import appended, filled
from transformers.cache_utils import DynamicLayer

from dgrpo.model.kv_prefixes import saved_as_prefixes


def test_the_gradient_through_saved_prefixes_is_the_plain_one():
    """The keys and values read back in backward are the first columns of the last tensors, keys as keys: with
    keys 2w and values 3w appended and sum k^2 + v^2 over every step's concatenation, d/dw is the plain run's."""

    def grad(once: bool) -> torch.Tensor:
        cache = filled([DynamicLayer() for _ in range(3)])
        w = torch.linspace(0.5, 1.5, 16).reshape(2, 2, 1, 4).requires_grad_(True)
        with saved_as_prefixes(cache) if once else torch.enable_grad():
            total = torch.zeros(())
            for step in range(3):
                for i in range(3):
                    k, v = cache.update(w * 2.0 * (step + 1), w * 3.0 * (i + 1), i)
                    total = total + (k * k * (i + 1)).sum() + (v * k).sum()
        (g,) = torch.autograd.grad(total, w)
        return g

    assert torch.equal(grad(True), grad(False))


def test_a_tensor_saved_as_its_own_nodes_output_is_freed_with_the_graph():
    """Inside the block, a node that saves its own output (``exp``) saves it detached: a graph dropped without a
    backward frees it (saved with its history, the tensor would hold the node that holds it: a cycle gc cannot see)."""
    cache = filled([DynamicLayer(), DynamicLayer()])
    x = torch.ones(3, requires_grad=True)
    with saved_as_prefixes(cache):
        y = x.exp()
    ref = weakref.ref(y)
    del y
    gc.collect()
    assert ref() is None


def test_where_saved_tensor_hooks_are_disabled_it_stands_aside():
    """Under ``disable_saved_tensors_hooks`` (no hooks can be added there) the block changes nothing, and does not
    fail."""
    cache = filled([DynamicLayer(), DynamicLayer()])
    with torch.autograd.graph.disable_saved_tensors_hooks("none here"), saved_as_prefixes(cache):
        total = appended(cache, 2)
    total.backward()
