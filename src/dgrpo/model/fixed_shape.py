"""Fixed-shape rollouts: the latent and decode steps as one-position forwards over preallocated buffers.

The eager rollout (:meth:`LatentLM.generate`) grows its attention mask by concatenation and asks the host after every
answer token whether a row is still alive: every step has a new shape and a host synchronisation, so it cannot be
captured as a CUDA graph and the GPU idles between its launches. Here one batch's rollout owns fixed buffers:

* a ``StaticCache`` of prompt + latents + marker + answer columns (transformers keeps its write offset on the device);
* a full-width attention mask [B, columns], written one column per step at a device-side column counter;
* the next position ids [B], the step's input (an embedding [B, 1, H] or a token [B, 1]) and its new mask column;
* the last-layer hidden state [B, 1, H] the step leaves behind.

So every latent step is the same computation on the same tensors, and so is every answer step:
:meth:`FixedShapeDecoder.step` runs it eagerly, or (``capture``, CUDA only) records it once per phase as a
``torch.cuda.CUDAGraph`` and replays it: one launch per forward instead of hundreds. A phase's first step runs eagerly
first (the warm-up capture needs) unless a decoder of this process already ran that same step (same shapes, model
and perturbation kind). The perturbation's hooks act inside the step: a batch-bound one (locked dropout, Gaussian
noise: fixed tensors per batch) is captured with it; the RNG-replayed native dropout cannot be.

The reference model's scoring (:func:`fixed_shape_target_logprobs`, no grad) runs its latent steps the same way, then
the marker and the teacher-forced answer in one call over the static cache.

Every decoder's graphs record into one memory pool per device (:func:`shared_pool`), as torch's docs describe for
graphs replayed in the order they were captured: a rollout batch's graphs are never replayed once the next batch's
are captured, so the next capture reuses their memory instead of reserving a new pool each batch (a finished pool
would go back to the driver only when the allocator runs short).

Token choice and EOS bookkeeping stay on the device; the host asks whether any row is alive only every
``sync_every`` tokens. The answers, log-probs and entropies equal :meth:`LatentLM.generate`'s over a static cache
(tests/test_fixed_shape.py): the perturbation, the positions and the attended columns are the same.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor

from .latent_lm import AnswerBook, Generation, LatentLM, PhaseHook, cache_keyword

_side_streams: dict[int, torch.cuda.Stream] = {}


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


@contextmanager
def captured(graph: torch.cuda.CUDAGraph, pool: torch.cuda.graphs._POOL_HANDLE | None) -> Iterator[None]:
    """Record the block's CUDA work into ``graph`` (memory from ``pool``) on the side stream, which first waits for
    the current one. ``torch.cuda.graph`` does the same after a device-wide synchronisation, emptying the allocator's
    cache and the pinned host cache: two captures per rollout batch would drain the GPU twice a step and hand every
    block the update had cached back to the driver, to be allocated from it again in the next update."""
    with on_side_stream():
        graph.capture_begin(pool=pool)
        try:
            yield
        finally:
            graph.capture_end()


class _SharedPool:
    """A device's pool token and the graphs captured into it last: a pool lives while a graph captured into it does,
    so the newest graphs are kept (never replayed again) until newer ones replace them."""

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
    """One batch's rollout over fixed buffers; :func:`fixed_shape_generate` drives it."""

    def __init__(
        self,
        lm: LatentLM,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        n_columns: int,
        perturbation: PhaseHook | None,
        capture: bool,
    ):
        if capture and (prompt_ids.device.type != "cuda" or cache_keyword(type(lm.base)) != "cache"):
            raise ValueError(
                "graph capture needs a CUDA device and transformers >= 5.24 (a static cache whose write offset "
                f"lives on the device); got device {prompt_ids.device.type}"
            )
        B, P = prompt_ids.shape
        dev = prompt_ids.device
        self.lm, self.perturbation, self.capture = lm, perturbation, capture
        self.mask = torch.zeros(B, n_columns, dtype=prompt_mask.dtype, device=dev)
        self.mask[:, :P] = prompt_mask
        self.column = torch.full((B, 1), P, dtype=torch.long, device=dev)  # where the next step writes
        prompt = lm.prefill(prompt_ids, prompt_mask, 0, perturbation=perturbation, markers=False, cache_len=n_columns)
        self.cache, self.next_position = prompt.cache, prompt.next_position
        self.hidden = prompt.last_hidden.clone()  # [B, 1, H]: the static output every step overwrites
        self.embeds = torch.zeros_like(self.hidden)  # the latent step's input
        self.ids = torch.zeros(B, 1, dtype=torch.long, device=dev)  # the answer step's input
        self.new_column = torch.ones(B, 1, dtype=self.mask.dtype, device=dev)  # 1: the step's token is attended
        self.graphs: dict[str, torch.cuda.CUDAGraph] = {}
        self._warm_keys: dict[str, tuple] = {}
        self.pool = shared_pool(dev) if capture else None

    def _forward(self, phase: str) -> None:
        """The step itself: in-place on the buffers, no host synchronisation, the same shapes every time."""
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
        device, the model's configuration and module classes (e.g. Liger's layers) and the perturbation's kind (made
        once per phase: the buffers and the model stay the same for the decoder's life)."""
        key = self._warm_keys.get(phase)
        if key is None:
            key = self._warm_keys[phase] = self._describe_step(phase)
        return key

    def _describe_step(self, phase: str) -> tuple:
        model = self.lm.model
        return (
            phase,
            tuple(self.mask.shape),
            tuple(self.hidden.shape),
            next(model.parameters()).dtype,
            self.mask.device,
            model.config.to_json_string(use_diff=False),
            frozenset(type(m).__qualname__ for m in model.modules()),
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
        if how == "eager":
            self._forward(phase)
        elif how == "warm-up":
            with on_side_stream():
                self._forward(phase)
            _warmed.add(self.warm_key(phase))
        else:
            if how == "capture":
                assert self.pool is not None
                graph = torch.cuda.CUDAGraph()
                with captured(graph, self.pool.handle):
                    self._forward(phase)
                self.graphs[phase] = graph  # (only once captured whole)
                self.pool.newest = list(self.graphs.values())  # (the previous batch's graphs may go now)
            self.graphs[phase].replay()

    def latent(self, n_latent: int, mode: str, latent_embedding: Tensor) -> None:
        """The ``n_latent`` thoughts: the last hidden state fed back (coconut), or the ``<|latent|>`` embedding
        (pause)."""
        for _ in range(n_latent):
            self.embeds.copy_(self.hidden if mode == "coconut" else latent_embedding)
            self.step("latent")

    def score(self, target_ids: Tensor, target_mask: Tensor, temperature: float) -> Tensor:
        """Teacher-forced log-probs [B, L] of ``target_ids`` (0 at padding) after the latent steps: ``<|end-latent|>``
        and the targets but the last in one eager forward call over the last L columns, as
        :meth:`LatentLM.target_logprobs` with ``end_with_targets`` does over a growing cache."""
        B, L = target_ids.shape
        start = self.mask.shape[1] - L  # (every row's next column: the latent steps wrote the same columns)
        lead = torch.full((B, 1), self.lm.end_id, dtype=target_ids.dtype, device=target_ids.device)
        ids = torch.cat([lead, target_ids[:, :-1]], 1)
        self.mask[:, start:] = torch.cat([torch.ones_like(target_mask[:, :1]), target_mask[:, :-1]], 1)
        positions = self.next_position[:, None] + torch.arange(L, device=ids.device)[None]
        hidden = self.lm._call_base(self.cache, "answer", self.perturbation, ids, self.mask, positions, True)
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
    mode: str | None = None,
    perturbation: PhaseHook | None = None,
    markers: bool = True,
    stop_ids: list[int] | None = None,
    with_entropy: bool = False,
    capture: bool = False,
    sync_every: int = 8,
) -> Generation:
    """:meth:`LatentLM.generate` over fixed shapes (same arguments, same result); ``capture``: CUDA graphs of the
    latent and answer steps; ``sync_every``: how many tokens pass between the host's checks that a row is alive
    (0: never, all ``max_new_tokens`` are decoded)."""
    B, dev = prompt_ids.shape[0], prompt_ids.device
    dec = _after_latents(
        lm, prompt_ids, prompt_mask, n_latent, int(markers) + max_new_tokens, mode, perturbation, capture
    )
    if markers:
        dec.feed(torch.full((B, 1), lm.end_id, device=dev), torch.ones(B, 1, dtype=dec.mask.dtype, device=dev))
    return _decode(dec, lm, max_new_tokens, temperature, top_p, generator, stop_ids, with_entropy, sync_every)


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
) -> Tensor:
    """:meth:`LatentLM.target_logprobs` with ``end_with_targets`` (the same log-probs [B, L], 0 at padding, up to
    the rounding of other kernels), without grad, over fixed buffers: the latent steps run as the rollout's do
    (``capture``: one CUDA graph replayed T times instead of T eager forwards, each of hundreds of small launches at
    one position per row), then the marker and the targets in one forward call. The reference model's scoring."""
    dec = _after_latents(lm, prompt_ids, prompt_mask, n_latent, target_ids.shape[1], mode, perturbation, capture)
    return dec.score(target_ids, target_mask, temperature)


def _after_latents(
    lm: LatentLM,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    n_latent: int,
    n_after: int,
    mode: str | None,
    perturbation: PhaseHook | None,
    capture: bool,
) -> FixedShapeDecoder:
    """A decoder over the prompt, ``n_latent`` thoughts and ``n_after`` more columns, having run the prompt and the
    thoughts (``mode``: coconut or pause; None: the model's own)."""
    mode = mode or lm.settings.mode
    if n_latent > 0 and mode not in ("coconut", "pause"):
        raise ValueError(f"mode {mode!r} has no latent thoughts; got n_latent={n_latent}")
    B, P = prompt_ids.shape
    dec = FixedShapeDecoder(lm, prompt_ids, prompt_mask, P + n_latent + n_after, perturbation, capture)
    dev = prompt_ids.device
    pause = lm.embed(torch.full((B, 1), lm.latent_id, device=dev)) if mode == "pause" and n_latent else dec.hidden
    dec.latent(n_latent, mode, pause)
    return dec


def _decode(
    dec: FixedShapeDecoder,
    lm: LatentLM,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    generator: torch.Generator | None,
    stop_ids: list[int] | None,
    with_entropy: bool,
    sync_every: int,
) -> Generation:
    """The answer tokens, chosen and booked on the device as :meth:`LatentLM.generate` does, without its host check
    per token: a finished row keeps feeding masked-out pad tokens until the host's next check."""
    book = AnswerBook(lm, dec.hidden.shape[0], max_new_tokens, stop_ids, with_entropy)
    for i in range(max_new_tokens):
        book.choose(i, lm.logits(dec.hidden[:, -1]), temperature, top_p, generator)
        if i == max_new_tokens - 1 or (sync_every and (i + 1) % sync_every == 0 and not book.alive.any()):
            break
        dec.feed(book.tokens[:, i : i + 1], book.alive[:, None].to(dec.mask.dtype))
    return book.result()
