"""The keys and values that steps appending to a growing cache save for backward, saved once per layer.

Each one-position forward over a ``DynamicCache`` (a coconut latent step with grad) concatenates its new column to
every layer's keys and values, and attention saves that concatenation for its backward. Over T steps autograd then
holds T copies of the prompt's columns in every layer: at the paper's scale (Qwen2.5-1.5B's 28 layers of 2 key/value
heads of 128, bf16, 512 rows, a 136-token prompt, T = 6) 11.4 GiB, against 1.9 GiB for the last step's tensors
alone (``python bench/latent_kv_bytes.py``). A ``DynamicLayer`` only ever appends columns, so every tensor it held
is the first n columns of the one it holds last: :func:`saved_as_prefixes` saves each as that (the layer's last
tensor and n), and backward reads a view of it. The values, and so the gradients, are the same bit for bit
(``tests/test_kv_prefixes.py``).

It works through PyTorch's saved-tensor hooks, of which only the innermost apply. So it stands aside (changes
nothing) under anyone else's: activation offloading (``torch.autograd.graph.save_on_cpu``), a checkpoint region;
except a pack hook marked :data:`OBSERVER`, which only looks (a bench's byte count): that one is still shown every
tensor saved, the last keys and values once each.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

#: set (to True) on a saved-tensor pack hook that returns every tensor as it is and only looks at it
OBSERVER = "dgrpo_observes_saved_tensors"


class _Prefix:
    """A saved tensor as the first ``columns`` columns of layer ``layer``'s keys (``kind`` 0) or values (1)."""

    __slots__ = ("owner", "layer", "kind", "columns")

    def __init__(self, owner: _SavedOnce, layer: int, kind: int, columns: int):
        self.owner, self.layer, self.kind, self.columns = owner, layer, kind, columns


class _SavedOnce:
    """The pack and unpack hooks over a cache's layers (their current tensors while the block runs, their last ones
    after it), and the observer the hooks show what they save."""

    def __init__(self, layers: list[DynamicLayer], observe: Callable[[Tensor], Any] | None):
        self.layers, self.observe = layers, observe
        self.current = 0  # the layer whose keys or values were saved last (the search for the next starts there)
        self.last: list[tuple[Tensor, Tensor]] | None = None  # (set when the block ends)

    def pack(self, t: Tensor) -> Tensor | _Prefix:
        if self.last is None and t.dim() == 4:
            # the layer running now: the one whose tensors were saved last, the next one, or the first (a new step)
            layers, i = self.layers, self.current
            for j in (i, i + 1, 0) if i + 1 < len(layers) else (i, 0):
                layer = layers[j]
                kind = 0 if layer.keys is t else 1 if layer.values is t else -1
                if kind >= 0:
                    self.current = j
                    return _Prefix(self, j, kind, t.shape[-2])
        if self.observe is not None:
            self.observe(t)
        # detached, as PyTorch itself saves a node's own output: the tensor would hold the node that holds it
        return t.detach()

    @staticmethod
    def unpack(saved: Tensor | _Prefix) -> Tensor:
        if not isinstance(saved, _Prefix):
            return saved
        last = saved.owner.tensors()[saved.layer][saved.kind]
        return last if last.shape[-2] == saved.columns else last.narrow(-2, 0, saved.columns)

    def tensors(self) -> list[tuple[Tensor, Tensor]]:
        """Every layer's (keys, values): the last ones once the block has ended, the current ones before."""
        if self.last is not None:
            return self.last
        return [(layer.keys, layer.values) for layer in self.layers]  # type: ignore[misc]

    def freeze(self) -> None:
        # detached (the same storage, no autograd history): the graph holds the saved prefixes, which hold these; the
        # tensors themselves would hold the graph, a cycle through C++ that Python's gc cannot see into, so a graph
        # dropped without a backward (a skipped step) would stay alive
        self.last = [(k.detach(), v.detach()) for k, v in self.tensors()]
        self.layers = []
        if self.observe is not None:
            for pair in self.last:
                for t in pair:
                    self.observe(t)


def _enclosing_pack_hook() -> Callable | None | bool:
    """The pack hook of the saved-tensor hooks in force (None: none; False: hooks cannot be added here, or this
    PyTorch does not say)."""
    autograd = torch._C._autograd
    top = getattr(autograd, "_top_saved_tensors_default_hooks", None)
    enabled = getattr(autograd, "_saved_tensors_hooks_is_enabled", None)
    if top is None or enabled is None or not enabled():
        return False
    hooks = top(True)
    return None if hooks is None else hooks[0]


@contextmanager
def saved_as_prefixes(cache: DynamicCache) -> Iterator[None]:
    """While the block runs (steps appending columns to ``cache``, with grad), a layer's keys or values saved for
    backward are saved as a number of columns of the layer's tensor when the block ends. A no-op without grad, over
    a cache with a layer that is not a ``DynamicLayer`` (a sliding window drops columns; a static cache writes in
    place), or under saved-tensor hooks other than an :data:`OBSERVER`."""
    layers = list(getattr(cache, "layers", ()))
    outer = _enclosing_pack_hook()
    applies = torch.is_grad_enabled() and layers and all(type(layer) is DynamicLayer for layer in layers)
    if not applies or outer is False or (outer is not None and not getattr(outer, OBSERVER, False)):
        yield
        return
    once = _SavedOnce(layers, outer)  # type: ignore[arg-type]
    with torch.autograd.graph.saved_tensors_hooks(once.pack, once.unpack):
        try:
            yield
        finally:
            once.freeze()
