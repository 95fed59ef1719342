"""Locked (variational) dropout: one Bernoulli mask per rollout per site, held over every position.

The mask of row ``i`` at site ``s`` is a [hidden] vector of 0 and 1/(1-p) drawn from row ``i``'s
own generator seeded with ``seeds[i]``: it does not depend on the batch it runs in, so the K
rollouts of a group (and all groups) share one batched forward, and replay in any micro-batch
regenerates it exactly. Applied with forward hooks, so it works on models whose configs have no
dropout modules (Qwen2, Llama).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..model.anatomy import Site, find_sites
from ..model.compiled_layers import output_factor_hook
from ..model.fixed_shape import CAPTURE_LOCK
from ..model.latent_chain import with_rows
from .base import (
    BoundPerturbation,
    HookedPerturbation,
    Perturbation,
    as_seeds,
    register,
    row_uniforms,
    site_names,
    swapped,
    to_device,
)

if TYPE_CHECKING:
    from ..config import PerturbationConfig
    from ..model.latent_lm import LatentLM


def keep_rows(seeds: Tensor, n_sites: int, width: int, p: float, memo: RowMemo | None = None) -> Tensor:
    """[B, n_sites, width] booleans, True where a unit is kept; row i depends on seeds[i] only (drawn on the CPU from
    its own generator, so the same on every device). ``memo``: rows drawn before are taken from it (a step binds the
    same seeds for its rollout, its update and its reference)."""
    if memo is None:
        return torch.stack(draw_keep_rows(seeds.tolist(), n_sites, width, p))
    keys = [(s, n_sites, width, p) for s in seeds.tolist()]
    rows = memo.lookup(keys)
    missing = list(dict.fromkeys(k for k in keys if k not in rows))
    if missing:
        drawn = dict(zip(missing, draw_keep_rows([k[0] for k in missing], n_sites, width, p), strict=True))
        memo.put_many(drawn)
        rows.update(drawn)
    return torch.stack([rows[k] for k in keys])


#: below this many uniforms a draw stays on the calling thread (a thread pool's overhead is ~0.1 ms per chunk)
PARALLEL_DRAW_MIN = 1 << 22
_pools: dict[tuple[int, int], ThreadPoolExecutor] = {}


def draw_threads(rows: int, threads: int | None = None) -> int:
    """The host threads a draw of ``rows`` rows is split over: ``threads`` (default: torch's intra-op thread budget
    ``torch.get_num_threads()``, idle while the host draws), at most 8 and at most one per row."""
    return max(1, min(threads or torch.get_num_threads(), 8, rows))


def draw_keep_rows(seeds: list[int], n_sites: int, width: int, p: float, threads: int | None = None) -> list[Tensor]:
    """Each seed's [n_sites, width] keep-mask, from its own generator. A large draw (a paper-scale step: 512 rows x
    28 sites x 1536 units, ~0.1-0.2 s on one host thread) is split in contiguous chunks over :func:`draw_threads`
    threads; each row still comes from its own generator, so the masks are bit-identical to a serial draw (bench
    item 4 times both)."""
    draw = lambda chunk: [row_uniforms(s, n_sites, width) >= p for s in chunk]  # noqa: E731
    threads = draw_threads(len(seeds), threads)
    if threads < 2 or len(seeds) * n_sites * width < PARALLEL_DRAW_MIN:
        return draw(seeds)
    key = (os.getpid(), threads)  # a pool's threads do not survive a fork: a forked worker would wait on it forever
    pool = _pools.get(key) or _pools.setdefault(key, ThreadPoolExecutor(threads, "dgrpo-masks"))
    step = -(-len(seeds) // threads)
    chunks = [seeds[i : i + step] for i in range(0, len(seeds), step)]
    return [row for rows in pool.map(draw, chunks) for row in rows]  # torch's RNG and compare release the GIL


_prefetch_pools: dict[int, ThreadPoolExecutor] = {}


def _prefetcher() -> ThreadPoolExecutor:
    """The one host thread that draws prefetched masks (per process: a forked worker gets its own)."""
    pid = os.getpid()
    pool = _prefetch_pools.get(pid)
    if pool is None:
        pool = _prefetch_pools[pid] = ThreadPoolExecutor(1, "dgrpo-mask-prefetch")
    return pool


def scale_kept(keep: Tensor, p: float, dtype: torch.dtype = torch.float32) -> Tensor:
    """Masks from keep-booleans: 1/(1-p) where kept, 0 elsewhere, computed in fp32 and rounded once to ``dtype``;
    on whatever device ``keep`` is (moving booleans is a quarter of the bytes of fp32 masks)."""
    scale = float(torch.ones((), dtype=torch.float32) / (1.0 - p))  # the fp32 quotient, exact as a Python float
    return torch.where(keep, scale, 0.0).to(dtype)  # (a scalar: nothing copied to the device)


def locked_masks(seeds: Tensor, n_sites: int, width: int, p: float, memo: RowMemo | None = None) -> Tensor:
    """[n_sites, B, width] masks with entries in {0, 1/(1-p)} (fp32, on the CPU); row i depends on seeds[i] only."""
    return scale_kept(keep_rows(seeds, n_sites, width, p, memo).transpose(0, 1).contiguous(), p)


class RowMemo:
    """The last ``capacity`` rows' keep-masks, by (seed, sites, width, p): drawing a row's mask from its own CPU
    generator costs ~0.2 ms of host time at Qwen2.5-1.5B's width, and one GRPO step binds every seed three times.
    Safe to share with a prefetching thread (:meth:`LockedDropout.prefetch`)."""

    def __init__(self, capacity: int = 4096):
        self.capacity, self.rows = capacity, OrderedDict[tuple, Tensor]()
        self._lock = threading.Lock()

    def lookup(self, keys: list[tuple]) -> dict[tuple, Tensor]:
        """The rows of ``keys`` it holds (now the most recently used)."""
        with self._lock:
            found = {k: self.rows[k] for k in keys if k in self.rows}
            for k in found:
                self.rows.move_to_end(k)
        return found

    def put_many(self, rows: dict[tuple, Tensor]) -> None:
        """Hold ``rows``, forgetting the least recently used beyond the capacity."""
        with self._lock:
            for key, row in rows.items():
                self.rows[key] = row
                self.rows.move_to_end(key)
            while len(self.rows) > self.capacity:
                self.rows.popitem(last=False)


class _BoundLocked(HookedPerturbation):
    def __init__(self, sites: list[Site], site_masks: list[Tensor], perturb_prompt: bool, perturb_answer: bool = True):
        """``site_masks``: per site, every row's mask [B, 1, H] in the weights' dtype (see :func:`site_masks`)."""
        super().__init__([s.module for s in sites], perturb_prompt, perturb_answer)
        self.site_masks = site_masks

    @property
    def rows(self) -> int | None:
        return self.site_masks[0].shape[0] if self.site_masks else None

    @property
    def masks(self) -> Tensor:
        """[n_sites, B, H]: every site's masks."""
        return torch.stack([m[:, 0] for m in self.site_masks])

    def graph_inputs(self) -> list[Tensor]:
        return self.site_masks

    def row_padding(self, rows: int) -> AbstractContextManager[object]:
        return swapped(self, "site_masks", [with_rows(m, rows) for m in self.site_masks])

    def hook(self, k: int) -> Callable:
        # the mask is already in the weights' dtype: one multiply per site and forward, no cast
        return output_factor_hook(lambda: self.site_masks[k] if self.active else None)


def site_masks(masks: Tensor) -> list[Tensor]:
    """[B, sites, H] masks as one [B, 1, H] tensor per site (the same mask at every position), each its own contiguous
    copy: a compiled layer step would be specialised on a view's offset into one tensor (dgrpo.model.compiled_layers).
    """
    return [masks[:, k, None, :].contiguous() for k in range(masks.shape[1])]


@register("locked")
class LockedDropout(Perturbation):
    """One shared Bernoulli mask per rollout and site (``p``), on the ``sites`` of the selected ``layers``."""

    def __init__(
        self,
        p: float = 0.1,
        sites: list[str] | None = None,
        layers: str = "all",
        perturb_prompt: bool = True,
        perturb_answer: bool = True,
    ):
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout p must be in [0, 1), got {p}")
        self.p, self.sites, self.layers, self.perturb_prompt = p, site_names(sites), layers, perturb_prompt
        self.perturb_answer = perturb_answer
        self.memo = RowMemo()
        #: the draw under way: ((seeds, sites, width, p) it draws for, the draw)
        self._prefetch: tuple[tuple[tuple[int, ...], int, int, float], Future] | None = None
        # the device masks of the last bind: a step binds the same seeds for its rollout, its update and its
        # reference (one batch each at the recipe's sizes), and the masks are read-only
        self._bound: tuple[tuple, list[Tensor]] | None = None

    @classmethod
    def from_config(cls, cfg: PerturbationConfig) -> LockedDropout:
        return cls(
            p=cfg.p,
            sites=list(cfg.sites),
            layers=cfg.layers,
            perturb_prompt=cfg.perturb_prompt,
            perturb_answer=cfg.perturb_answer,
        )

    def bind(self, lm: LatentLM, seeds: Tensor) -> BoundPerturbation:
        seeds = as_seeds(seeds)
        sites = find_sites(lm.model, self.sites, self.layers)
        dtype = next(lm.model.parameters()).dtype
        seed_list = tuple(seeds.tolist())
        key = (seed_list, len(sites), sites[0].width, self.p, dtype, lm.device)
        if self._bound is None or self._bound[0] != key:
            self._bound = None  # (its device memory may go before the new masks are made)
            keep = self._await_prefetch(seed_list, (len(sites), sites[0].width, self.p))
            if keep is None:
                keep = keep_rows(seeds, len(sites), sites[0].width, self.p, self.memo)
            # booleans cross to the device (not fp32 masks: a quarter of the bytes and of the host's work) and become
            # 0 and 1/(1-p) there, rounded once to the weights' dtype
            self._bound = (key, site_masks(scale_kept(to_device(keep, lm.device), self.p, dtype)))
        return _BoundLocked(sites, self._bound[1], self.perturb_prompt, self.perturb_answer)

    def prefetch(self, lm: LatentLM, seeds: Tensor) -> None:
        """Draw the keep-masks of ``seeds`` (a later step's) into the memo on a host thread, while the caller goes on
        (e.g. launching this step's update on a GPU); a later :meth:`bind` of any of them waits for the draw, and one
        of exactly ``seeds`` takes the stacked batch the thread made (in pinned memory when ``lm`` is on CUDA, ready
        for a copy that does not wait). The same masks as drawing them at bind time: each row comes from its own
        generator."""
        seeds = as_seeds(seeds)
        sites = find_sites(lm.model, self.sites, self.layers)
        seeds = seeds.cpu()
        self._await_prefetch()  # one draw under way at a time
        pin = lm.device.type == "cuda"
        n_sites, width, p = len(sites), sites[0].width, self.p

        def draw() -> Tensor:
            with CAPTURE_LOCK if pin else nullcontext():  # (on CUDA apart from any capture: pinning calls the runtime)
                keep = keep_rows(seeds, n_sites, width, p, self.memo)
                return keep.pin_memory() if pin else keep

        self._prefetch = ((tuple(seeds.tolist()), n_sites, width, p), _prefetcher().submit(draw))

    def _await_prefetch(
        self, seeds: tuple[int, ...] | None = None, rows: tuple[int, int, float] | None = None
    ) -> Tensor | None:
        """Wait for the draw under way (with ``seeds``: only if it holds any of them), and raise what it raised; its
        stacked keep-masks when it drew exactly ``seeds`` (and, given ``rows``, their (sites, width, p): a bind over
        another model, or after p was set on the object, draws its own), else None (it filled the memo either way)."""
        if self._prefetch is None or (seeds is not None and set(self._prefetch[0][0]).isdisjoint(seeds)):
            return None
        ((drawn_for, *drawn_rows), draw), self._prefetch = self._prefetch, None
        keep = draw.result()
        return keep if drawn_for == seeds and (rows is None or tuple(drawn_rows) == rows) else None
