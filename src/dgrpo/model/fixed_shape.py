"""Fixed-shape rollouts: the latent and decode steps as one-position forwards over preallocated buffers.

The eager rollout (:meth:`LatentLM.generate`) grows its attention mask by concatenation and asks the host after every
answer token whether a row is still alive: every step has a new shape and a host synchronisation, so it cannot be
captured as a CUDA graph and the GPU idles between its launches. Here one batch's rollout owns fixed buffers:

* a ``StaticCache`` of prompt + latents + marker + answer columns, its write offset on the device, one for all layers
  (:mod:`dgrpo.model.static_cache`);
* a full-width attention mask [B, columns], written one column per step at a device-side column counter;
* the next position ids [B], the step's input (an embedding [B, 1, H] or a token [B, 1]) and its new mask column;
* the last-layer hidden state [B, 1, H] the step leaves behind.

So every latent step is the same computation on the same tensors, and so is every answer step:
:meth:`FixedShapeDecoder.step` runs it eagerly, or (``capture``, CUDA only) records it once per phase as a
``torch.cuda.CUDAGraph`` and replays it: one launch per forward instead of hundreds. A phase's first step runs eagerly
first (the warm-up capture needs) unless a decoder of this process already ran that same step (same shapes, model
and perturbation kind). The perturbation's hooks act inside the step: a batch-bound one (locked dropout, Gaussian
noise: fixed tensors per batch) is captured with it, in the phases it acts in (the answer step of one that leaves the
answer alone, ``perturbation.perturb_answer: false``, is captured without it); the RNG-replayed native dropout cannot
be.

The reference model's scoring (:func:`fixed_shape_target_logprobs`, no grad) runs its latent steps the same way, then
the marker and the teacher-forced answer in one call over the static cache.

A decoder can be kept for every later batch of its shape (:func:`decoder_for`, ``grpo.keep_graphs``): its cache is
refilled in place, and its graphs, captured once, read the weights where they are (an optimizer step updates them in
place) and the perturbation tensors they were captured with, into which each batch's own are copied
(:meth:`BoundPerturbation.graph_inputs`). Under capture a batch of fewer rows or columns runs padded to the kept
decoder's (``pad``: copies of its first row, cut off the result): a step's last rollout batch, the rows the group
filter left the reference (whose answer call then runs over the batch's own rows).

Every decoder's graphs record into one memory pool per device (:func:`shared_pool`): a capture then reuses the memory
of the graphs before it instead of reserving a new pool each batch (a finished pool would go back to the driver only
when the allocator runs short). Graphs sharing a pool may be replayed in any order here: each writes its results
into buffers allocated outside the pool (the pool holds only temporaries, dead between replays), and all replays and
captures are ordered on the device (a capture's side stream waits for the current one).

Token choice and EOS bookkeeping stay on the device; the host asks whether any row is alive only every
``sync_every`` tokens. The answers, log-probs and entropies equal :meth:`LatentLM.generate`'s over a static cache
(tests/test_fixed_shape.py): the perturbation, the positions and the attended columns are the same.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, TypeVar

import torch
from torch import Tensor
from transformers import StaticCache

from .decoding import AnswerBook, Generation, check_decoding, check_uniforms
from .latent_lm import LatentLM, PhaseHook, cache_keyword
from .verified import one_line

_side_streams: dict[int, torch.cuda.Stream] = {}
_Kept = TypeVar("_Kept")

#: held while a CUDA graph is captured (:func:`captured`). A capture in CUDA's default (global) mode is ended by a
#: call such as ``cudaHostAlloc`` from any thread while it runs ("operation failed due to a previous error during
#: capture", raised by whichever op comes next): a host thread of this library that calls the CUDA runtime (drawing and
#: pinning prefetched dropout masks, :meth:`dgrpo.perturbation.locked.LockedDropout.prefetch`) does its work under it.
CAPTURE_LOCK = threading.Lock()


def side_stream() -> torch.cuda.Stream:
    """The current device's one stream for warm-ups and captures (made on first use), as ``torch.cuda.graph`` keeps
    one: what a library first makes per stream (cuBLAS' workspace) is then made once, by the first warm-up, not by
    each capture into its graph's pool, where it would stay reserved (a new stream per capture grew the reserved
    memory by a few MB a rollout batch on an H200)."""
    device = torch.cuda.current_device()
    stream = _side_streams.get(device)
    if stream is None:
        stream = _side_streams[device] = torch.cuda.Stream()
    return stream


@contextmanager
def on_side_stream() -> Iterator[torch.cuda.Stream]:
    """Run the block on :func:`side_stream`, ordered after the current stream's work and before its later work."""
    stream, current = side_stream(), torch.cuda.current_stream()
    stream.wait_stream(current)
    with torch.cuda.stream(stream):
        yield stream
    current.wait_stream(stream)


def give_up_capture(lm: LatentLM, purpose: str, error: Exception, message: str, stacklevel: int) -> None:
    """After a failed capture for ``purpose`` (``generate``, ``score``, ``update``): no later one of ``lm`` for it
    tries again (a failed capture may keep the memory of its pool), and a warning says so: ``message`` with the
    error as one line (:func:`~dgrpo.model.verified.one_line`) as ``{error}``; ``stacklevel`` as the caller's own
    ``warnings.warn`` would take it."""
    lm.kept_decoders.failed_captures.add(purpose)
    warnings.warn(message.format(error=one_line(error)), RuntimeWarning, stacklevel=stacklevel + 1)


@contextmanager
def captured(graph: torch.cuda.CUDAGraph, pool: torch.cuda.graphs._POOL_HANDLE | None) -> Iterator[None]:
    """Record the block's CUDA work into ``graph`` (memory from ``pool``) on the side stream, which first waits for
    the current one. ``torch.cuda.graph`` does the same after a device-wide synchronisation, emptying the allocator's
    cache and the pinned host cache: two captures per rollout batch would drain the GPU twice a step and hand every
    block the update had cached back to the driver, to be allocated from it again in the next update. Holds
    :data:`CAPTURE_LOCK` meanwhile."""
    with CAPTURE_LOCK, on_side_stream():
        graph.capture_begin(pool=pool)
        try:
            yield
        finally:
            graph.capture_end()


class _SharedPool:
    """A device's pool token and the graphs captured into it last: a pool lives while a graph captured into it does,
    so the newest graphs are held here (by a decoder not kept: never to be replayed again) until newer ones replace
    them."""

    def __init__(self) -> None:
        self.handle = torch.cuda.graph_pool_handle()
        self.newest: list[torch.cuda.CUDAGraph] = []


_pools: dict[torch.device, _SharedPool] = {}


def shared_pool(device: torch.device) -> _SharedPool:
    """The one graph memory pool of ``device``'s fixed-shape decoders (made on first use)."""
    pool = _pools.get(device)
    if pool is None:
        pool = _pools[device] = _SharedPool()
    return pool


#: the steps run eagerly in this process, by :meth:`FixedShapeDecoder.warm_key`: a later decoder of the same kind
#: captures its first step of that phase at once instead of running it eagerly first
_warmed: set[tuple] = set()


class FixedShapeDecoder:
    """A rollout's fixed buffers for batches of ``batch_size`` rows and ``n_columns`` columns, and (``capture``) the
    CUDA graphs of its steps; :meth:`start` begins a batch over them, :func:`fixed_shape_generate` drives it. A
    decoder kept for later batches of the same shape (:func:`decoder_for`) replays the graphs it captured."""

    def __init__(self, lm: LatentLM, batch_size: int, n_columns: int, capture: bool, purpose: str = "generate"):
        dev = lm.device
        if capture and (dev.type != "cuda" or cache_keyword(type(lm.base)) != "cache"):
            raise ValueError(
                "graph capture needs a CUDA device and transformers >= 5.24 (a static cache whose write offset "
                f"lives on the device); got device {dev.type}"
            )
        self.lm, self.capture, self.n_columns, self.purpose = lm, capture, n_columns, purpose
        self.perturbation: PhaseHook | None = None
        self.mask = torch.zeros(batch_size, n_columns, dtype=torch.long, device=dev)
        self.column = torch.zeros(batch_size, 1, dtype=torch.long, device=dev)  # where the next step writes
        self.ids = torch.zeros(batch_size, 1, dtype=torch.long, device=dev)  # the answer step's input
        self.new_column = torch.ones_like(self.column)  # 1: the step's token is attended
        # made by the first batch's prompt: the static cache, the next positions [B] and the last-layer hidden state
        # [B, 1, H] every step overwrites (``hidden``), with the latent step's input (``embeds``) of its shape
        self.cache: StaticCache | None = None
        self.next_position = self.hidden = self.embeds = torch.empty(0)
        self.written = 0  # columns written in this batch (the host's count: every row writes the same columns)
        self.graphs: dict[str, torch.cuda.CUDAGraph] = {}
        self.graph_inputs: dict[str, list[Tensor]] = {}  # per graph, the perturbation tensors it was captured with
        self._warm_keys: dict[str, tuple] = {}
        self.pool = shared_pool(dev) if capture else None

    def start(self, prompt_ids: Tensor, prompt_mask: Tensor, perturbation: PhaseHook | None) -> None:
        """Begin a batch: its prompt's forward fills the cache from column 0 (the buffers keep their addresses, so
        the graphs of an earlier batch stay valid), and ``perturbation``'s tensors are copied into the ones the
        graphs were captured with (see :meth:`BoundPerturbation.graph_inputs`)."""
        B, P = prompt_ids.shape
        if B != self.mask.shape[0] or P > self.n_columns:
            raise ValueError(f"a batch of {B} x {P} prompt tokens does not fit a decoder of {tuple(self.mask.shape)}")
        self._adopt(perturbation)
        self.mask.zero_()
        self.mask[:, :P] = prompt_mask
        self.column.fill_(P)
        self.new_column.fill_(1)
        prompt = self.lm.prefill(
            prompt_ids,
            prompt_mask,
            0,
            perturbation=perturbation,
            markers=False,
            cache_len=self.n_columns,
            cache=self.cache,
        )
        if self.cache is None:
            self.cache, self.next_position = prompt.cache, prompt.next_position  # type: ignore[assignment]
            self.hidden = prompt.last_hidden.clone()
            self.embeds = torch.zeros_like(self.hidden)
        else:
            self.next_position.copy_(prompt.next_position)
            self.hidden.copy_(prompt.last_hidden)
        self.written = P

    @property
    def nbytes(self) -> int:
        """The device memory its cache and buffers hold (not its graphs' pool, shared by every decoder)."""
        layers = getattr(self.cache, "layers", ())  # (none before the first batch)
        kv = [t for layer in layers for t in (getattr(layer, "keys", None), getattr(layer, "values", None))]
        buffers = [self.mask, self.column, self.ids, self.new_column, self.next_position, self.hidden, self.embeds]
        return sum(t.numel() * t.element_size() for t in [*kv, *buffers] if isinstance(t, Tensor))

    def _adopt(self, perturbation: PhaseHook | None) -> None:
        """``perturbation`` acts in this batch: in the eager calls through its hooks, in the graphs' replays through
        its tensors' values, copied into the tensors each graph was captured with."""
        self.perturbation = perturbation
        for captured_with in self.graph_inputs.values():
            adopt_tensors(captured_with, perturbation)

    def _forward(self, phase: str) -> None:
        """The step itself: in-place on the buffers, no host synchronisation, the same shapes every time."""
        assert self.cache is not None, "start a batch first"
        self.mask.scatter_(1, self.column, self.new_column)
        as_ids = phase == "answer"
        x = self.ids if as_ids else self.embeds
        hidden = self.lm._call_base(
            self.cache, phase, self.perturbation, x, self.mask, self.next_position[:, None], as_ids
        )
        self.hidden.copy_(hidden)
        self.next_position.add_(1)
        self.column.add_(1)

    def warm_key(self, phase: str) -> tuple:
        """What a step of ``phase`` runs, for the warm-up rule: the shapes of the buffers, the weights' dtype and
        device, the model's configuration, its module classes and their forwards (Liger's layers), the perturbation's
        kind and whether it acts in that phase (made once per phase: the buffers and the model stay the same for the
        decoder's life)."""
        key = self._warm_keys.get(phase)
        if key is None:
            key = self._warm_keys[phase] = self._describe_step(phase)
        return key

    def _describe_step(self, phase: str) -> tuple:
        model = self.lm.model
        return (
            phase,
            phase in noisy_phases(self.perturbation),  # (a step without the noise runs fewer kernels)
            tuple(self.mask.shape),
            tuple(self.hidden.shape),
            next(model.parameters()).dtype,
            self.mask.device,
            model.config.to_json_string(use_diff=False),
            # (Liger patches an instance's forward and leaves its class: the forward's name tells its layers apart)
            frozenset((type(m).__qualname__, getattr(m.forward, "__qualname__", "")) for m in model.modules()),
            type(self.perturbation).__qualname__,
        )

    def next_step(self, phase: str) -> str:
        """How the next step of ``phase`` runs: ``eager`` (no capture), ``warm-up`` (eagerly, on a side stream, as
        torch.cuda.graph's docs ask: first-use work such as compiling a kernel or planning an attention call for a
        new shape cannot be captured; skipped when a decoder of this process ran that same step, :meth:`warm_key`),
        ``capture`` (recorded as the phase's graph, then replayed) or ``replay``."""
        if not self.capture:
            return "eager"
        if phase in self.graphs:
            return "replay"
        return "capture" if self.warm_key(phase) in _warmed else "warm-up"

    def step(self, phase: str) -> None:
        """One position of ``phase`` (``latent``: input ``embeds``; ``answer``: input ``ids``), as
        :meth:`next_step` says."""
        how = self.next_step(phase)
        if how == "capture" and not self._captured(phase):
            how = "eager"  # (the capture failed: a warning said so)
        if how == "eager":
            self._forward(phase)
        elif how == "warm-up":
            with on_side_stream():
                self._forward(phase)
            _warmed.add(self.warm_key(phase))
        else:
            self.graphs[phase].replay()
        self.written += 1

    def _captured(self, phase: str) -> bool:
        """Record a step of ``phase`` as its graph (run by nothing yet: the caller replays it). Should the capture
        fail (an op that cannot be captured), say so once and return False: this decoder, and every later one of its
        model for its purpose, then runs its steps eagerly (the same results; a failed capture may keep memory of its
        pool, so none tries again). The failed step ran no work on the device: its work was being recorded."""
        assert self.pool is not None
        graph = torch.cuda.CUDAGraph()
        try:
            with captured(graph, self.pool.handle):
                self._forward(phase)
        except RuntimeError as e:  # (what CUDA graph capture raises: an op that cannot be captured, ...)
            self.capture, self.graphs, self.graph_inputs = False, {}, {}
            give_up_capture(
                self.lm,
                self.purpose,
                e,
                f"the fast engine's {self.purpose} decoder: capturing its {phase} step failed ({{error}}); this "
                "model's decoders for it run their steps eagerly from now on (the same results, more host time)",
                stacklevel=3,
            )
            return False
        self.graphs[phase] = graph  # (only once captured whole)
        self.graph_inputs[phase] = list(graph_inputs_of(self.perturbation) or [])
        self.pool.newest = list(self.graphs.values())  # (the previous batch's graphs may go now)
        return True

    def latent(self, n_latent: int, mode: str, latent_embedding: Tensor) -> None:
        """The ``n_latent`` thoughts: the last hidden state fed back (coconut), or the ``<|latent|>`` embedding
        (pause)."""
        for _ in range(n_latent):
            self.embeds.copy_(self.hidden if mode == "coconut" else latent_embedding)
            self.step("latent")

    def score(self, target_ids: Tensor, target_mask: Tensor, temperature: float) -> Tensor:
        """Teacher-forced log-probs [B, L] of ``target_ids`` (0 at padding) after the latent steps: ``<|end-latent|>``
        and the targets but the last in one eager forward call over the next L columns, as
        :meth:`LatentLM.target_logprobs` with ``end_with_targets`` does over a growing cache. ``B`` may be fewer than
        the decoder's rows (a batch padded for the latent steps): the call runs over the first B rows only."""
        assert self.cache is not None, "start a batch first"
        B, L = target_ids.shape
        start = self.written  # (every row's next column: the latent steps wrote the same columns)
        lead = torch.full((B, 1), self.lm.end_id, dtype=target_ids.dtype, device=target_ids.device)
        ids = torch.cat([lead, target_ids[:, :-1]], 1)
        self.mask[:B, start : start + L] = torch.cat([torch.ones_like(target_mask[:, :1]), target_mask[:, :-1]], 1)
        positions = self.next_position[:B, None] + torch.arange(L, device=ids.device)[None]
        # the mask up to the targets' columns, the last L its queries (the columns after them: not written)
        mask = self.mask[:B, : start + L]
        with first_rows(self.cache, B) as cache:
            hidden = self.lm._call_base(cache, "answer", self.perturbation, ids, mask, positions, True)
        return self.lm._scored(hidden, target_ids, target_mask, temperature, False)[0]

    def feed(self, ids: Tensor, new_column: Tensor) -> None:
        """One answer-phase token per row (``new_column`` 0: a finished row's token, not attended)."""
        self.ids.copy_(ids)
        self.new_column.copy_(new_column)
        self.step("answer")


@torch.no_grad()
def fixed_shape_generate(
    lm: LatentLM,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    n_latent: int,
    *,
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
    uniforms: Tensor | None = None,
    mode: str | None = None,
    perturbation: PhaseHook | None = None,
    markers: bool = True,
    stop_ids: list[int] | None = None,
    with_entropy: bool = False,
    capture: bool = False,
    sync_every: int = 8,
    keep: bool = False,
    pad: bool | None = None,
) -> Generation:
    """:meth:`LatentLM.generate` over fixed shapes (same arguments, same result); ``capture``: CUDA graphs of the
    latent and answer steps; ``sync_every``: how many tokens pass between the host's checks that a row is alive
    (0: never, all ``max_new_tokens`` are decoded); ``keep``: the buffers and graphs serve the next batch of the same
    shape too (:func:`decoder_for`). Its arguments are checked as ``generate`` checks them (host values only: a
    negative or NaN temperature, a ``top_p`` outside (0, 1] or no answer token decoded without a word).

    ``pad`` (default: ``keep and capture``): a batch of fewer rows or columns than the kept decoder's (the last
    batch of a step whose rows ``grpo.rollout_batch_size`` does not divide) runs padded to them (copies of its first
    row, cut off the result), greedy or sampled from per-row ``uniforms`` (a shared ``generator`` would draw other
    numbers for more rows): as :func:`fixed_shape_target_logprobs`."""
    check_decoding(n_latent, max_new_tokens, temperature, top_p)
    B = prompt_ids.shape[0]
    check_uniforms(uniforms, B, max_new_tokens)
    pads = keep and (capture if pad is None else pad) and (temperature == 0 or uniforms is not None)
    batch = _padded_batch(
        lm, "generate", perturbation, prompt_ids, prompt_mask, n_latent, int(markers) + max_new_tokens - 1, pads
    )  # (the marker and every answer token but the last: the last is chosen, never fed back)
    prompt_ids, prompt_mask, n_after, within = batch
    rows = prompt_ids.shape[0]
    uniforms = with_rows(uniforms, rows) if uniforms is not None else None
    with within:
        dec = _after_latents(
            lm, "generate", prompt_ids, prompt_mask, n_latent, n_after, mode, perturbation, capture, keep
        )
        if markers:
            dev, dtype = prompt_ids.device, dec.mask.dtype
            dec.feed(torch.full((rows, 1), lm.end_id, device=dev), torch.ones(rows, 1, dtype=dtype, device=dev))
        sampling = (generator, uniforms)
        return _decode(dec, lm, max_new_tokens, temperature, top_p, sampling, stop_ids, with_entropy, sync_every, B)


@torch.no_grad()
def fixed_shape_target_logprobs(
    lm: LatentLM,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    n_latent: int,
    target_ids: Tensor,
    target_mask: Tensor,
    *,
    mode: str | None = None,
    perturbation: PhaseHook | None = None,
    temperature: float = 1.0,
    capture: bool = False,
    keep: bool = False,
    min_rows: int = 0,
    pad: bool | None = None,
) -> Tensor:
    """:meth:`LatentLM.target_logprobs` with ``end_with_targets`` (the same log-probs [B, L], 0 at padding, up to
    the rounding of other kernels), without grad, over fixed buffers: the latent steps run as the rollout's do
    (``capture``: one CUDA graph replayed T times instead of T eager forwards, each of hundreds of small launches at
    one position per row), then the marker and the targets in one forward call (``keep``: as in
    :func:`fixed_shape_generate`). The reference model's scoring.

    ``pad`` (default: ``keep and capture``): the latent steps run over at least ``min_rows`` rows and the kept
    decoder's rows and columns (copies of the first row), so that one decoder and its graph serve every batch,
    whatever rows the group filter kept (a batch of other rows would build and capture a new one); the answer's call
    then runs over the batch's own rows. Not for a perturbation that cannot pad its rows
    (:meth:`BoundPerturbation.row_padding`) nor a model with linear-attention layers (:func:`attention_cache_only`)."""
    pads = keep and (capture if pad is None else pad)
    batch = _padded_batch(
        lm, "score", perturbation, prompt_ids, prompt_mask, n_latent, target_ids.shape[1], pads, min_rows
    )
    ids, mask, n_after, within = batch
    with within:
        dec = _after_latents(lm, "score", ids, mask, n_latent, n_after, mode, perturbation, capture, keep)
    # the answer's call over the batch's own rows (its matmuls, unlike the latent steps', cost by the row)
    return dec.score(target_ids, target_mask, temperature)


def _padded_batch(
    lm: LatentLM,
    purpose: str,
    perturbation: PhaseHook | None,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    n_latent: int,
    n_after: int,
    pads: bool,
    min_rows: int = 0,
) -> tuple[Tensor, Tensor, int, AbstractContextManager[object]]:
    """The prompt a batch runs its decoder over, the columns after its latents and the block it runs in: with
    ``pads``, at least ``min_rows`` rows and ``lm``'s kept decoder for ``purpose``'s rows and columns where they are
    more (copies of the first row; the columns the kept decoder's key was made with), within
    :func:`padding_rows`' block; else (or for a perturbation that cannot pad its rows, a model with linear-attention
    layers: :func:`attention_cache_only`) the batch as it is."""
    as_it_is = (prompt_ids, prompt_mask, n_after, nullcontext())
    if not pads or not attention_cache_only(lm):
        return as_it_is
    (B, P), kept = prompt_ids.shape, lm.kept_decoders.get(purpose)
    rows, columns = max(B, min_rows), P + n_latent + n_after
    if kept is not None:
        rows, columns = max(rows, kept[1].mask.shape[0]), max(columns, kept[1].n_columns)
    within = padding_rows(perturbation, rows)
    if within is None:
        return as_it_is
    return with_rows(prompt_ids, rows), with_rows(prompt_mask, rows), columns - P - n_latent, within


def attention_cache_only(lm: LatentLM) -> bool:
    """Whether ``lm``'s cache layers hold keys and values alone (full or sliding-window attention), which
    :func:`first_rows` can narrow to a batch's rows; a linear-attention layer's states it cannot."""
    layer_types = getattr(lm.model.config.get_text_config(), "layer_types", None) or ()
    return set(layer_types) <= {"full_attention", "sliding_attention"}


@contextmanager
def first_rows(cache: StaticCache, rows: int) -> Iterator[StaticCache]:
    """``cache`` as a cache of its first ``rows`` rows within the block: each layer's keys and values are views of
    them (what a call writes lands in the cache's own memory); the whole tensors back on leaving."""
    layers: list[Any] = [layer for layer in cache.layers if getattr(layer, "keys", None) is not None]
    whole = [(layer.keys, layer.values) for layer in layers]
    if all(k.shape[0] == rows for k, _ in whole):
        yield cache
        return
    try:
        for layer, (k, v) in zip(layers, whole, strict=True):
            layer.keys, layer.values = k[:rows], v[:rows]
        yield cache
    finally:
        for layer, (k, v) in zip(layers, whole, strict=True):
            layer.keys, layer.values = k, v


def padding_rows(perturbation: PhaseHook | None, rows: int) -> AbstractContextManager[object] | None:
    """The block within which ``perturbation`` acts on ``rows`` rows, its batch's and then copies of its first
    (:meth:`BoundPerturbation.row_padding`); None for a perturbation that cannot pad its rows."""
    if perturbation is None:
        return nullcontext()
    return getattr(perturbation, "row_padding", lambda _: None)(rows)


def with_rows(t: Tensor, rows: int, dim: int = 0) -> Tensor:
    """``t`` with copies of its first row (along ``dim``) appended up to ``rows`` rows (differentiable)."""
    extra = rows - t.shape[dim]
    if extra < 0:
        raise ValueError(f"cannot pad {t.shape[dim]} rows to {rows}")
    if extra == 0:
        return t
    first = t.narrow(dim, 0, 1)
    return torch.cat([t, first.expand(*(extra if d == dim else -1 for d in range(t.dim())))], dim)


def _after_latents(
    lm: LatentLM,
    purpose: str,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    n_latent: int,
    n_after: int,
    mode: str | None,
    perturbation: PhaseHook | None,
    capture: bool,
    keep: bool,
) -> FixedShapeDecoder:
    """A decoder over the prompt, ``n_latent`` thoughts and ``n_after`` more columns, having run the prompt and the
    thoughts (``mode``: coconut or pause; None: the model's own)."""
    mode = mode or lm.settings.mode
    if n_latent > 0 and mode not in ("coconut", "pause"):
        raise ValueError(f"mode {mode!r} has no latent thoughts; got n_latent={n_latent}")
    B, P = prompt_ids.shape
    dec = decoder_for(lm, purpose, B, P + n_latent + n_after, perturbation, capture, keep)
    dec.start(prompt_ids, prompt_mask, perturbation)
    dev = prompt_ids.device
    pause = lm.embed(torch.full((B, 1), lm.latent_id, device=dev)) if mode == "pause" and n_latent else dec.hidden
    dec.latent(n_latent, mode, pause)
    return dec


#: under ``keep`` a decoder's columns are rounded up to a multiple of this: a batch whose prompt is a few tokens longer
#: or shorter than the last one's still fits its buffers (the columns past the answer are never attended)
COLUMN_BUCKET = 32


def decoder_for(
    lm: LatentLM,
    purpose: str,
    batch_size: int,
    n_columns: int,
    perturbation: PhaseHook | None,
    capture: bool,
    keep: bool,
) -> FixedShapeDecoder:
    """A decoder for a batch of ``batch_size`` rows and ``n_columns`` columns. ``keep``: the one ``lm`` kept for
    ``purpose`` (``generate``, ``score``) when it fits (the same rows, columns rounded up to :data:`COLUMN_BUCKET`,
    the same kind and shapes of perturbation tensors, acting in the same phases, the weights where they were and,
    under LoRA, the same active adapter); else a new one, kept in its place. Its graphs are then captured once and
    replayed by every later batch: the weights are read where they are (an optimizer step updates them in place),
    the perturbation's tensors are copied in by :meth:`FixedShapeDecoder.start`. Not kept: a perturbation whose
    tensors are unknown (``graph_inputs`` None)."""
    capture = capture and purpose not in lm.kept_decoders.failed_captures
    replay = replay_key(lm, perturbation)
    if not keep or replay is None:
        return FixedShapeDecoder(lm, batch_size, n_columns, capture, purpose)
    n_columns = -(-n_columns // COLUMN_BUCKET) * COLUMN_BUCKET
    key = (replay, batch_size, n_columns, capture)
    return kept_for(lm, purpose, key, lambda: FixedShapeDecoder(lm, batch_size, n_columns, capture, purpose))


def replay_key(lm: LatentLM, perturbation: PhaseHook | None) -> tuple | None:
    """What a graph kept from one batch to the next reads besides its own buffers: the weights where they are, the
    kind and tensor shapes of the perturbation (whose values each batch copies in) and the phases it acts in (a
    phase's graph records its noise or not: :func:`noisy_phases`) and, under LoRA, the active adapter. None for a
    perturbation whose tensors are unknown: nothing is kept for it."""
    inputs = graph_inputs_of(perturbation)
    if inputs is None:
        return None
    adapters = getattr(lm.peft, "active_adapters", None) if lm.peft is not None else None
    return (
        _storage(lm),
        type(perturbation).__qualname__,
        tuple((tuple(t.shape), t.dtype) for t in inputs),
        noisy_phases(perturbation),
        tuple(adapters) if adapters is not None else None,
    )


def kept_for(lm: LatentLM, purpose: str, key: tuple, make: Callable[[], _Kept]) -> _Kept:
    """What ``lm`` keeps for ``purpose`` when it was made for ``key``; else ``make()``'s, kept in its place."""
    lm.kept_decoders.seen.pop(purpose, None)  # (a key waiting to repeat: this call decided for or against it)
    kept = lm.kept_decoders.get(purpose)
    if kept is not None and kept[0] == key:
        return kept[1]
    del kept  # (nor may this frame hold the one replaced: its memory may serve the new one)
    lm.kept_decoders.pop(purpose, None)
    new = make()
    lm.kept_decoders[purpose] = (key, new)
    return new


def _storage(lm: LatentLM) -> tuple[int, ...]:
    """Where ``lm``'s weights and buffers are: a graph reads them by address, so a model moved or cast (or a module
    replaced) after a capture must not replay it (a walk of 340 tensors at Qwen2.5-1.5B's depth: 0.75 ms a batch on
    a 2-core CPU)."""
    return tuple(t.data_ptr() for t in (*lm.model.parameters(), *lm.model.buffers()))


#: the phases of a rollout's forwards, in their order (:meth:`BoundPerturbation.before_forward`)
PHASES = ("prompt", "latent", "answer")


def noisy_phases(perturbation: PhaseHook | None) -> tuple[str, ...]:
    """The phases whose forwards ``perturbation``'s noise acts on (:meth:`BoundPerturbation.acts_in`; all of them for
    a phase hook that does not say). A step's graph is captured with what its hooks did in its phase: the noise
    recorded or not, whatever a later batch's perturbation wants."""
    if perturbation is None:
        return ()
    acts = getattr(perturbation, "acts_in", None)
    return tuple(phase for phase in PHASES if acts is None or acts(phase))


def graph_inputs_of(perturbation: PhaseHook | None) -> list[Tensor] | None:
    """The tensors ``perturbation`` reads (:meth:`BoundPerturbation.graph_inputs`; none without one)."""
    if perturbation is None:
        return []
    inputs = getattr(perturbation, "graph_inputs", None)
    return inputs() if inputs is not None else None


def adopt_tensors(captured_with: list[Tensor], perturbation: PhaseHook | None) -> None:
    """Copy ``perturbation``'s tensors into those a graph was captured with (where they are those: nothing)."""
    if not captured_with:
        return
    new = graph_inputs_of(perturbation)
    assert new is not None, "graphs that read perturbation tensors are kept only for perturbations that state them"
    for was, now in zip(captured_with, new, strict=True):
        if was is not now:
            was.copy_(now)


def _decode(
    dec: FixedShapeDecoder,
    lm: LatentLM,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    sampling: tuple[torch.Generator | None, Tensor | None],
    stop_ids: list[int] | None,
    with_entropy: bool,
    sync_every: int,
    rows: int,
) -> Generation:
    """The answers of the first ``rows`` rows (the others: padding), chosen and booked on the device as
    :meth:`LatentLM.generate` does (``sampling``: its generator and uniforms), without its host check per token: a
    finished row keeps feeding masked-out pad tokens until the host's next check."""
    book = AnswerBook(lm, dec.hidden.shape[0], max_new_tokens, stop_ids, with_entropy)
    for i in range(max_new_tokens):
        book.choose(i, lm.logits(dec.hidden[:, -1]), temperature, top_p, *sampling)
        if i == max_new_tokens - 1 or (sync_every and (i + 1) % sync_every == 0 and not book.alive[:rows].any()):
            break
        dec.feed(book.tokens[:, i : i + 1], book.alive[:, None].to(dec.mask.dtype))
    return book.result(rows)
