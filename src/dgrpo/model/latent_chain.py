"""The GRPO update's latent steps as one unit whose forward and backward are each one CUDA graph
(``grpo.update_latent_graphs``).

In the update, after the prompt's forward with grad, the T coconut steps are one-position forwards of the whole
decoder stack at a few hundred rows: ~20 small kernels per layer and step in forward, more in backward, issued one by
one from Python while the GPU waits (bench/RESULTS.md: on an H200, 0.29 s of idle in forward and most of the
backward's 0.43 s, in the profiled paper step). Here the T steps are one function of tensors, wrapped in an autograd
``Function``:

* in: the prompt's last hidden state, its padding mask and next positions, and every layer's keys and values;
* out: the hidden state after the T steps and every layer's keys and values with the T new columns;
* gradients: of the hidden state, the keys and values, and the trainable weights.

:class:`LatentChain` runs it eagerly over detached inputs (CPU; the tests), or (``capture``, CUDA) records the
function's forward and its backward once each as a CUDA graph and replays them: two launches instead of thousands.
Both go through the same ``Function``, so the way gradients cross it is the same code in both.

A captured chain reads static inputs (each call's tensors are copied in), the weights where they are (an optimizer
step updates them in place) and the perturbation's tensors it was captured with (each batch's copied in, as the fast
engine's kept decoders do). Its memory comes from a pool of its own: the forward's saved activations must outlive
every graph replayed before the backward's (the reference's, another chain's). The gradients leave the backward as
copies, since the graph's next replay overwrites its outputs. A chain is kept for later batches of the same shape
(:func:`chain_for`); the prompt's columns are rounded up to :data:`COLUMN_BUCKET` for that (padding columns, masked),
and a captured chain runs every later batch that fits it padded to its rows and columns (:func:`run_latent_chain`).
Should a capture fail (an op that cannot be captured), a warning says so and the model's update runs the steps one by
one from then on (no later chain of it tries to capture).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from .decoding import DecodeState
from .fixed_shape import (
    COLUMN_BUCKET,
    adopt_tensors,
    captured,
    give_up_capture,
    graph_inputs_of,
    kept_for,
    on_side_stream,
    padding_rows,
    replay_key,
    with_rows,
)
from .latent_lm import LatentLM, PhaseHook
from .recompute import dynamic_layer

#: eager forward-and-backward runs before a capture (first-use work such as autotuning a kernel for a new shape
#: or planning an attention call cannot be captured)
WARMUP_ITERS = 2


def filled_cache(config: Any, keys: list[Tensor], values: list[Tensor]) -> DynamicCache:
    """A ``DynamicCache`` whose layers hold ``keys`` and ``values`` as they are (no copy, no host work: it is made
    inside a captured region too)."""
    cache = DynamicCache(config=config)
    for i, (layer, k, v) in enumerate(zip(cache.layers, keys, values, strict=True)):
        if type(layer) is not DynamicLayer:
            raise NotImplementedError(
                f"grpo.update_latent_graphs runs over full-attention cache layers; layer {i} is {type(layer).__name__}"
            )
        layer.device, layer.keys, layer.values, layer.is_initialized = k.device, k, v, True
    return cache


def keys_then_values(cache: DynamicCache) -> list[Tensor]:
    """Every layer's keys, then every layer's values, of a cache of full-attention layers."""
    layers = [dynamic_layer(cache, i) for i in range(len(cache.layers))]
    keys, values = [], []
    for i, layer in enumerate(layers):
        if layer is None or layer.keys is None or layer.values is None:
            raise NotImplementedError(f"grpo.update_latent_graphs: layer {i} of the cache holds no full-attention keys")
        keys.append(layer.keys)
        values.append(layer.values)
    return keys + values


@contextmanager
def weight_views(model: torch.nn.Module, params: Sequence[Tensor]) -> Iterator[list[Tensor]]:
    """While the block runs, each of ``params`` (trainable weights of ``model``) is, in every module that holds it, a
    view of itself (yielded, in ``params``' order), so that gradients can be taken with respect to the views.

    Why: a weight's gradient ends in its ``AccumulateGrad`` node, which keeps the stream it was made on, and the node
    lives while any graph holds it, here the prompt's forward on the default stream. A captured backward that took
    gradients with respect to the weights themselves would make that stream wait for the capturing one, which ends
    the capture. A view made inside the captured forward is on the capturing stream; its gradient is the weight's."""
    views = {id(p): p.view_as(p) for p in params}
    held = [
        (module, name, p)
        for module in model.modules()
        for name, p in module._parameters.items()
        if p is not None and id(p) in views
    ]
    try:
        for module, name, p in held:
            module._parameters[name] = views[id(p)]  # type: ignore[assignment]  # (setattr takes only Parameters)
        yield [views[id(p)] for p in params]
    finally:
        for module, name, p in held:
            module._parameters[name] = p


def chain_inputs(state: DecodeState) -> list[Tensor]:
    """What the chain takes in after ``state`` (a prompt's): its last hidden state, padding mask and next positions,
    then every layer's keys, then every layer's values (the order :meth:`LatentChain.steps` unpacks)."""
    return [state.last_hidden, state.attention_mask, state.next_position, *keys_then_values(state.cache)]


def chain_state(lm: LatentLM, tensors: list[Tensor]) -> DecodeState:
    """The state whose :func:`chain_inputs` are ``tensors`` (over a cache that holds its keys and values as they
    are)."""
    x, mask, next_position, *kv = tensors
    n = len(kv) // 2
    return DecodeState(filled_cache(lm.model.config, kv[:n], kv[n:]), mask, next_position, x)


def column_dims(tensors: list[Tensor]) -> list[int | None]:
    """Per :func:`chain_inputs` tensor, the dim of its prompt columns (None: it has none): the mask's 1, the keys'
    and values' 2 ([rows, kv heads, columns, head dim])."""
    return [None, 1, None, *[2] * (len(tensors) - 3)]


class LatentChain:
    """The ``n_latent`` coconut steps after a prompt, for batches of one shape: the static inputs, outputs and
    gradients, and (``capture``) the CUDA graphs of the forward and of the backward."""

    def __init__(self, lm: LatentLM, n_latent: int, capture: bool):
        if capture and lm.device.type != "cuda":
            raise ValueError(f"capturing the latent steps needs a CUDA device; got {lm.device.type}")
        self.lm, self.n_latent, self.capture = lm, n_latent, capture
        self.params = [p for p in lm.model.parameters() if p.requires_grad]
        self.inputs: list[Tensor] = []  # (static copies of) chain_inputs: last hidden, mask, positions, keys, values
        self.outputs: list[Tensor] = []  # last hidden, keys..., values... (n_latent more columns)
        self.grad_outputs: list[Tensor] = []  # (captured) what the backward graph reads
        self.grads: list[Tensor | None] = []  # (captured) what it writes: the differentiable inputs', the params'
        self.views: list[Tensor] = []  # the views of the params the last forward ran with (:func:`weight_views`)
        self.graph_inputs: list[Tensor] = []  # the perturbation tensors the graphs were captured with
        self.forward_graph: torch.cuda.CUDAGraph | None = None
        self.backward_graph: torch.cuda.CUDAGraph | None = None
        self.pool = torch.cuda.graph_pool_handle() if capture else None
        self.shape: tuple[int, int] | None = None  # (rows, prompt columns) of the batches it runs: the first's
        self.calls = 0  # forwards run: a backward must belong to the last one (one set of static tensors)
        self.failed = False  # its capture failed: the steps run one by one (a warning said so)

    def run(self, state: DecodeState, perturbation: PhaseHook | None) -> DecodeState:
        """The latent steps after ``state`` (a prompt's, over a ``DynamicCache``): the state after them, differentiable
        with respect to the prompt's state and the trainable weights."""
        tensors = chain_inputs(state)
        if self.shape is None:
            self.shape = (state.attention_mask.shape[0], state.attention_mask.shape[1])
        if self.capture and self.forward_graph is None and not self.failed:
            try:
                self._capture(tensors, perturbation)
            except RuntimeError as e:  # (what CUDA graph capture raises: an op that cannot be captured, ...)
                self.failed = True
                self.forward_graph = self.backward_graph = None
                self.inputs, self.outputs, self.grad_outputs, self.grads = [], [], [], []
                give_up_capture(
                    self.lm,
                    "update",
                    e,
                    "grpo.update_latent_graphs: capturing the latent steps failed ({error}); this model's update "
                    "runs them step by step from now on",
                    stacklevel=2,
                )
        if self.failed:
            self.lm.coconut_steps(state, self.n_latent, perturbation)
            return state
        out = _ChainFunction.apply(self, perturbation, len(tensors), *tensors, *self.params)
        n = len(state.cache.layers)
        cache = filled_cache(self.lm.model.config, list(out[1 : 1 + n]), list(out[1 + n :]))
        mask = state.attention_mask
        mask = torch.cat([mask, mask.new_ones(mask.shape[0], self.n_latent)], dim=1)
        return DecodeState(cache, mask, state.next_position + self.n_latent, out[0])

    @property
    def nbytes(self) -> int:
        """The device memory of its static tensors (not its graphs' pool: the forward's saved activations)."""
        tensors = [*self.inputs, *self.outputs, *self.grad_outputs, *self.grads] if self.capture else []
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)

    # ------------------------------------------------------------------ what the Function calls
    def steps(self, inputs: list[Tensor], perturbation: PhaseHook | None) -> tuple[list[Tensor], list[Tensor]]:
        """The function itself, with grad: the latent steps from ``inputs`` (see :meth:`run`), and the views of the
        trainable weights they ran with (gradients are taken with respect to those: :func:`weight_views`)."""
        with weight_views(self.lm.model, self.params) as views:
            state = chain_state(self.lm, inputs)
            self.lm.coconut_steps(state, self.n_latent, perturbation)
        return [state.last_hidden, *keys_then_values(state.cache)], views

    def forward(self, inputs: list[Tensor], perturbation: PhaseHook | None) -> list[Tensor]:
        """The outputs for ``inputs`` (detached; their gradients come from :meth:`backward`)."""
        self.calls += 1
        if not self.capture:
            self.inputs = [t.detach().requires_grad_(t.requires_grad) for t in inputs]
            with torch.enable_grad():
                self.outputs, self.views = self.steps(self.inputs, perturbation)
            return [o.detach() for o in self.outputs]
        adopt_tensors(self.graph_inputs, perturbation)  # (captured by :meth:`run` before the first call)
        for static, t in zip(self.inputs, inputs, strict=True):
            static.copy_(t)
        assert self.forward_graph is not None
        self.forward_graph.replay()
        return [o.detach() for o in self.outputs]

    def backward(self, grad_outputs: list[Tensor]) -> list[Tensor | None]:
        """Gradients of the differentiable inputs, then of the params, for the outputs' ``grad_outputs``."""
        if not self.capture:
            grads = torch.autograd.grad(
                self.outputs, self._differentiable(self.views), grad_outputs, allow_unused=True, materialize_grads=False
            )
            self.outputs, self.views = [], []  # (the graph is spent)
            return list(grads)
        for static, g in zip(self.grad_outputs, grad_outputs, strict=True):
            static.copy_(g)
        assert self.backward_graph is not None
        self.backward_graph.replay()
        return [None if g is None else g.clone() for g in self.grads]

    def differentiable_positions(self) -> list[int]:
        """Which of the inputs get gradients (those that require them)."""
        return [i for i, t in enumerate(self.inputs) if t.requires_grad]

    def _differentiable(self, views: list[Tensor]) -> list[Tensor]:
        """What gradients are taken with respect to: the inputs that require them, then ``views`` (the params')."""
        return [self.inputs[i] for i in self.differentiable_positions()] + views

    def _capture(self, inputs: list[Tensor], perturbation: PhaseHook | None) -> None:
        """Warm up, then record the forward and the backward (their scratch memory from this chain's own pool)."""
        self.inputs = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
        with torch.enable_grad():
            with on_side_stream():
                for _ in range(WARMUP_ITERS):
                    outs, views = self.steps(self.inputs, perturbation)
                    wrt = self._differentiable(views)
                    torch.autograd.grad(outs, wrt, [torch.ones_like(o) for o in outs], allow_unused=True)
                del outs, views, wrt
            self.forward_graph = torch.cuda.CUDAGraph()
            with captured(self.forward_graph, self.pool):
                self.outputs, self.views = self.steps(self.inputs, perturbation)
            self.grad_outputs = [torch.empty_like(o) for o in self.outputs]  # (outside the pool: an input)
            self.backward_graph = torch.cuda.CUDAGraph()
            wrt = self._differentiable(self.views)
            with captured(self.backward_graph, self.pool):
                grads = torch.autograd.grad(self.outputs, wrt, self.grad_outputs, allow_unused=True)
        self.grads = list(grads)
        self.graph_inputs = list(graph_inputs_of(perturbation) or [])


class _ChainFunction(torch.autograd.Function):
    """The autograd node of a :class:`LatentChain` call: its inputs, then the trainable weights, in; its outputs
    out."""

    @staticmethod
    def forward(ctx: Any, chain: LatentChain, perturbation: PhaseHook | None, n_inputs: int, *tensors: Tensor) -> Any:
        outputs = chain.forward(list(tensors[:n_inputs]), perturbation)
        ctx.chain, ctx.n_inputs, ctx.call = chain, n_inputs, chain.calls
        return tuple(outputs)

    @staticmethod
    def backward(ctx: Any, *grad_outputs: Tensor) -> Any:
        chain: LatentChain = ctx.chain
        if ctx.call != chain.calls:
            raise RuntimeError(
                "grpo.update_latent_graphs: a latent chain's backward ran after a later forward of the same chain "
                "(its static tensors hold the later one's): run each micro-batch's backward before the next forward"
            )
        grads = chain.backward(list(grad_outputs))
        positions = chain.differentiable_positions()
        out: list[Tensor | None] = [None] * ctx.n_inputs
        for i, g in zip(positions, grads[: len(positions)], strict=True):
            out[i] = g
        return (None, None, None, *out, *grads[len(positions) :])


def chain_for(
    lm: LatentLM,
    state: DecodeState,
    n_latent: int,
    perturbation: PhaseHook | None,
    capture: bool,
    keep: bool,
    wait_for_repeat: bool = True,
) -> LatentChain:
    """A chain for the latent steps after ``state``. ``keep``: the one ``lm`` kept (``update``) when it fits (the
    weights where they were, the same input shapes, dtypes and grad needs, perturbation tensors and active
    adapter), else a new one kept in its place. With none kept, the first batch's chain is captured and kept (a
    step's first micro-batch is a full one; so the first step pays for the capture, not the second). Later, a batch
    of another shape runs uncaptured until its key comes twice in a row (``wait_for_repeat``; else at once), and
    only then replaces the kept chain: a capture costs a few eager runs (warm-ups, recording), which a shape that
    comes once (a step's last, smaller micro-batch; a row count the group filter left) would not repay, and two
    shapes taking turns would capture at every micro-batch. (A batch padded to the kept chain's shape,
    :func:`run_latent_chain`, meets a new shape only when it outgrows it: no wait then.) Not kept, as the fast
    engine's decoders are not (:func:`~dgrpo.model.fixed_shape.decoder_for`): a perturbation whose tensors are unknown
    (``graph_inputs`` None: a kind of one's own that does not say; a kept chain's replay could not copy them in)."""
    capture = capture and "update" not in lm.kept_decoders.failed_captures
    replay = replay_key(lm, perturbation) if keep else None
    if replay is None:
        return LatentChain(lm, n_latent, capture)
    tensors = chain_inputs(state)
    key = (
        replay,
        n_latent,
        capture,
        tuple((tuple(t.shape), t.dtype, t.requires_grad) for t in tensors),
        tuple(p.requires_grad for p in lm.model.parameters()),
    )
    current = lm.kept_decoders.get("update")
    waits = wait_for_repeat and lm.kept_decoders.seen.get("update") != key
    if capture and current is not None and current[0] != key and waits:
        lm.kept_decoders.seen["update"] = key
        return LatentChain(lm, n_latent, capture=False)
    del current  # (a chain replaced must be let go before the new one is made: its memory may serve it)
    return kept_for(lm, "update", key, lambda: LatentChain(lm, n_latent, capture))


def run_latent_chain(
    lm: LatentLM,
    state: DecodeState,
    n_latent: int,
    perturbation: PhaseHook | None,
    capture: bool,
    keep: bool,
    min_rows: int = 0,
    pad: bool | None = None,
) -> DecodeState:
    """The state after the latent steps that follow ``state`` (a prompt's), run by :func:`chain_for`'s chain.

    ``pad`` (default: ``keep and capture``): the batch runs inside one shape, so that a chain captured once serves
    every batch, whatever rows the group filter left and however wide the prompt: at least ``min_rows`` rows and the
    kept chain's rows and columns, or more where this batch has more (then a new chain of the larger shape replaces
    it at once). The padding rows copy the first row (its state and perturbation), the padding columns are masked
    prompt columns on the left; both are cut off the result, so their outputs get no gradient and add exactly zero
    to every other gradient. On a GPU the one-position steps should cost about the same at a few more rows (at a
    few hundred rows their matmuls are bound by reading the weights, not by the rows); on a CPU they would not, hence
    the default. Not for a perturbation that cannot pad its rows (:meth:`BoundPerturbation.row_padding`)."""
    capture = capture and "update" not in lm.kept_decoders.failed_captures
    B, P = state.attention_mask.shape
    rows, columns = max(B, min_rows), P
    kept = lm.kept_decoders.get("update")
    if kept is not None and kept[1].shape is not None:
        rows, columns = max(rows, kept[1].shape[0]), max(columns, kept[1].shape[1])
    del kept  # (nor may this frame hold the kept chain while a larger one replaces it)
    within = None  # the perturbation over the padded rows (None: not padded)
    if keep and (capture if pad is None else pad):
        within = padding_rows(perturbation, rows)
    if within is None:
        return chain_for(lm, state, n_latent, perturbation, capture, keep).run(state, perturbation)
    padded = padded_state(lm, state, rows, columns)
    with within:
        chain = chain_for(lm, padded, n_latent, perturbation, capture, keep, wait_for_repeat=False)
        out = chain.run(padded, perturbation)
    return cropped_state(lm, out, B, columns - P)


def padded_state(lm: LatentLM, state: DecodeState, rows: int, columns: int) -> DecodeState:
    """``state`` over ``rows`` rows (copies of its first after its own) and ``columns`` prompt columns (masked columns
    of zero keys and values on the left; positions count real tokens only, so nothing else changes)."""
    B, P = state.attention_mask.shape
    if (rows, columns) == (B, P):
        return state

    def grown(t: Tensor, column_dim: int | None) -> Tensor:
        if column_dim is not None and columns > P:
            shape = list(t.shape)
            shape[column_dim] = columns - P
            t = torch.cat([t.new_zeros(shape), t], column_dim)
        return with_rows(t, rows)

    tensors = chain_inputs(state)
    return chain_state(lm, [grown(t, d) for t, d in zip(tensors, column_dims(tensors), strict=True)])


def cropped_state(lm: LatentLM, state: DecodeState, rows: int, cut: int) -> DecodeState:
    """``state``'s first ``rows`` rows without its first ``cut`` columns (what :func:`padded_state` added)."""
    if rows == state.attention_mask.shape[0] and cut == 0:
        return state
    tensors = chain_inputs(state)
    cropped = [
        t[:rows] if d is None else t[:rows].narrow(d, cut, t.shape[d] - cut)
        for t, d in zip(tensors, column_dims(tensors), strict=True)
    ]
    return chain_state(lm, cropped)


def bucketed_prompt(lm: LatentLM, prompt_ids: Tensor, prompt_mask: Tensor) -> tuple[Tensor, Tensor]:
    """The prompt left-padded (masked-out padding tokens) to a multiple of :data:`COLUMN_BUCKET` columns: batches
    whose prompts differ by a few tokens then share one chain. Positions count real tokens only, so the log-probs
    do not change."""
    B, P = prompt_ids.shape
    extra = -P % COLUMN_BUCKET
    if extra == 0:
        return prompt_ids, prompt_mask
    pad_ids = prompt_ids.new_full((B, extra), lm.pad_id)
    return torch.cat([pad_ids, prompt_ids], 1), torch.cat([prompt_mask.new_zeros(B, extra), prompt_mask], 1)


def chained_target_logprobs(
    lm: LatentLM,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    n_latent: int,
    target_ids: Tensor,
    target_mask: Tensor,
    *,
    perturbation: PhaseHook | None = None,
    temperature: float = 1.0,
    capture: bool = False,
    keep: bool = False,
    min_rows: int = 0,
    pad: bool | None = None,
) -> Tensor:
    """:meth:`LatentLM.target_logprobs` of a coconut model with ``end_with_targets`` (the same log-probs [B, L], 0
    at padding, differentiable end to end), its latent steps run by a :class:`LatentChain` (``capture``: as CUDA
    graphs; ``keep``: the chain kept for later batches of its shape; ``min_rows``, ``pad``: see
    :func:`run_latent_chain`): the GRPO update's replay."""
    if n_latent > 0 and lm.settings.mode != "coconut":
        raise ValueError(f"the latent chain runs coconut thoughts; this model's mode is {lm.settings.mode!r}")
    ids, mask = bucketed_prompt(lm, prompt_ids, prompt_mask)
    with lm._scoring_block():
        state = lm.prefill(ids, mask, 0, perturbation=perturbation, markers=False)
        if n_latent > 0:
            state = run_latent_chain(lm, state, n_latent, perturbation, capture, keep, min_rows, pad)
        lead = torch.full((ids.shape[0], 1), lm.end_id, dtype=target_ids.dtype, device=target_ids.device)
        logp, _ = lm.score_targets(
            state, target_ids, target_mask, perturbation=perturbation, temperature=temperature, lead_ids=lead
        )
    return logp
