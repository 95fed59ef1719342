"""Locked (variational) dropout: one Bernoulli mask per rollout per site, held over every position.

The mask of row ``i`` at site ``s`` is a [hidden] vector of 0 and 1/(1-p) drawn from row ``i``'s
own generator seeded with ``seeds[i]``: it does not depend on the batch it runs in, so the K
rollouts of a group (and all groups) share one batched forward, and replay in any micro-batch
regenerates it exactly. Applied with forward hooks, so it works on models whose configs have no
dropout modules (Qwen2, Llama).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..model.anatomy import Site, find_sites
from .base import BoundPerturbation, HookedPerturbation, Perturbation, map_first_output, register, row_uniforms

if TYPE_CHECKING:
    from ..config import PerturbationConfig
    from ..model.latent_lm import LatentLM


def locked_masks(seeds: Tensor, n_sites: int, width: int, p: float) -> Tensor:
    """[n_sites, B, width] masks with entries in {0, 1/(1-p)}; row i depends on seeds[i] only."""
    keep = torch.stack([row_uniforms(int(s), n_sites, width) >= p for s in seeds.tolist()], dim=1)
    return keep.float() / (1.0 - p)


class _BoundLocked(HookedPerturbation):
    def __init__(self, sites: list[Site], masks: Tensor, perturb_prompt: bool):
        super().__init__([s.module for s in sites], perturb_prompt)
        self.masks = masks  # [n_sites, B, H]
        self.site_masks = [
            masks[k][:, None, :] for k in range(masks.shape[0])
        ]  # [B, 1, H]: the same mask at every position

    def _hook(self, k: int) -> Callable:
        def hook(module, args, output):
            if not self.active:
                return None
            m = self.site_masks[k]  # already in the weights' dtype: one multiply per site and forward, no cast
            return map_first_output(output, lambda h: h * (m if m.dtype == h.dtype else m.to(h.dtype)))

        return hook


@register("locked")
class LockedDropout(Perturbation):
    """One shared Bernoulli mask per rollout and site (``p``), on the ``sites`` of the selected ``layers``."""

    def __init__(
        self, p: float = 0.1, sites: list[str] | None = None, layers: str = "all", perturb_prompt: bool = True
    ):
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout p must be in [0, 1), got {p}")
        self.p, self.sites, self.layers, self.perturb_prompt = p, sites or ["mlp"], layers, perturb_prompt

    @classmethod
    def from_config(cls, cfg: PerturbationConfig) -> LockedDropout:
        return cls(p=cfg.p, sites=list(cfg.sites), layers=cfg.layers, perturb_prompt=cfg.perturb_prompt)

    def bind(self, lm: LatentLM, seeds: Tensor) -> BoundPerturbation:
        sites = find_sites(lm.model, self.sites, self.layers)
        dtype = next(lm.model.parameters()).dtype
        masks = locked_masks(seeds, len(sites), sites[0].width, self.p).to(
            lm.device, dtype
        )  # 0 and 1/(1-p), rounded once
        return _BoundLocked(sites, masks, self.perturb_prompt)
