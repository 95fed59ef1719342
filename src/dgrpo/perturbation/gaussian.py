"""Gaussian perturbations seeded per rollout (paper Sec. A.5: any exogenous, replayable noise works).

``activations``: multiplicative noise (1 + sigma * eps) on the site outputs, eps ~ N(0, 1) of shape
[hidden], one draw per rollout held over all positions (Gaussian dropout, locked like the masks).
``weights``: additive noise sigma * std(W) * E on the weight of the site's output projection
(``o_proj``/``c_proj`` for attention, ``down_proj``/``c_proj`` for the MLP), one E per rollout and site, from a
generator seeded by a hash of (the rollout's seed, the site's index): independent across sites and rows; computed
as an extra batched matmul: memory B x out x in per site, so keep it to small models.
std(W) is measured once, on the first model the perturbation binds (a trainer's starting weights, before a
resumed run loads its checkpoint), and held: the noise is exogenous, not a function of the weights being trained,
so the reference model and later mini-epochs replay the rollout's noise exactly.
"""

from __future__ import annotations

import math
import typing
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from ..config import GaussianTarget
from ..model.anatomy import find_sites, output_projection
from ..model.compiled_layers import check_rows, output_factor_hook
from ..model.latent_chain import with_rows
from .base import (
    BoundPerturbation,
    HookedPerturbation,
    Perturbation,
    as_seeds,
    register,
    row_normals,
    site_names,
    site_seed,
    swapped,
)

if TYPE_CHECKING:
    from ..config import PerturbationConfig
    from ..model.latent_lm import LatentLM


#: what the noise perturbs (``perturbation.gaussian_target``)
GAUSSIAN_TARGETS = typing.get_args(GaussianTarget)


class _BoundGaussian(HookedPerturbation):
    def __init__(
        self,
        targets: list[nn.Module],
        noises: list[Tensor] | Tensor,
        perturb_prompt: bool,
        weights: bool,
        sigma: float,
        perturb_answer: bool = True,
    ):
        super().__init__(targets, perturb_prompt, perturb_answer)
        self.noises, self.weights, self.sigma = noises, weights, sigma

    @property
    def rows(self) -> int | None:
        if isinstance(self.noises, Tensor):  # activations: [sites, B, width]
            return self.noises.shape[1]
        return self.noises[0].shape[0] if self.noises else None  # weights: per site [B, out, in]

    def graph_inputs(self) -> list[Tensor]:
        return [self.noises] if isinstance(self.noises, Tensor) else list(self.noises)

    def row_padding(self, rows: int) -> AbstractContextManager[object]:
        # activations: [sites, B, width]; weights: per site [B, out, in]
        if isinstance(self.noises, Tensor):
            return swapped(self, "noises", with_rows(self.noises, rows, dim=1))
        return swapped(self, "noises", [with_rows(n, rows) for n in self.noises])

    def hook(self, k: int) -> Callable:
        act_hook = output_factor_hook(lambda: 1.0 + self.sigma * self.noises[k][:, None, :] if self.active else None)

        def weight_hook(module, args, output):
            if not self.active:
                return None
            x = args[0]  # [B, L, in]
            e = self.noises[k]  # [B, out, in], already scaled
            check_rows(e, x)
            return output + torch.einsum("bli,boi->blo", x, e.to(x.dtype))

        return weight_hook if self.weights else act_hook


@register("gaussian")
class GaussianNoise(Perturbation):
    """Per-rollout Gaussian noise of scale ``sigma`` on site activations or on their output projections' weights.

    Weight noise is scaled by each weight's std on the first model this object binds, held after (the module
    docstring): build a new object to perturb another model at its own scale."""

    def __init__(
        self,
        sigma: float = 0.1,
        sites: list[str] | None = None,
        layers: str = "all",
        target: str = "activations",
        perturb_prompt: bool = True,
        perturb_answer: bool = True,
    ):
        if not (math.isfinite(sigma) and sigma >= 0):  # (NaN noise would make every log-prob NaN)
            raise ValueError(f"sigma must be a finite number >= 0, got {sigma}")
        if target not in GAUSSIAN_TARGETS:  # (any other word took the weights' branch)
            raise ValueError(f"target must be one of {', '.join(GAUSSIAN_TARGETS)}, got {target!r}")
        self.sigma, self.sites, self.layers, self.target, self.perturb_prompt = (
            sigma,
            site_names(sites),
            layers,
            target,
            perturb_prompt,
        )
        self.perturb_answer = perturb_answer
        #: per weight site (its index and shape), std(W) of the first model bound (see the module docstring); the noise
        #: is ``sigma`` times it, the sigma of each bind (one set on the object after a bind was ignored)
        self.weight_stds: dict[tuple[int, int, int], float] = {}

    @classmethod
    def from_config(cls, cfg: PerturbationConfig) -> GaussianNoise:
        return cls(
            sigma=cfg.sigma,
            sites=list(cfg.sites),
            layers=cfg.layers,
            target=cfg.gaussian_target,
            perturb_prompt=cfg.perturb_prompt,
            perturb_answer=cfg.perturb_answer,
        )

    def bind(self, lm: LatentLM, seeds: Tensor) -> BoundPerturbation:
        seeds = as_seeds(seeds)
        sites = find_sites(lm.model, self.sites, self.layers)
        if self.target == "activations":
            z = torch.stack([row_normals(int(s), len(sites), sites[0].width) for s in seeds.tolist()], dim=1)
            modules = [s.module for s in sites]
            return _BoundGaussian(modules, z.to(lm.device), self.perturb_prompt, False, self.sigma, self.perturb_answer)
        linears = [output_projection(s.module, s.part) for s in sites]
        noises = []
        for k, lin in enumerate(linears):
            w = lin.weight
            assert isinstance(w, Tensor)
            out_f, in_f = (
                (w.shape[0], w.shape[1]) if isinstance(lin, nn.Linear) else (w.shape[1], w.shape[0])
            )  # GPT-2 Conv1D is [in, out]
            scale = self.sigma * self.weight_stds.setdefault((k, out_f, in_f), float(w.detach().float().std()))
            rows = [torch.Generator().manual_seed(site_seed(s, k, "gaussian-weights")) for s in seeds.tolist()]
            noises.append(torch.stack([torch.randn(out_f, in_f, generator=g) for g in rows]).mul_(scale).to(lm.device))
        return _BoundGaussian(linears, noises, self.perturb_prompt, True, self.sigma, self.perturb_answer)
