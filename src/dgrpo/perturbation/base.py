"""The perturbation interface, site discovery on any HF decoder, per-row seeded noise, and the factory."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

if TYPE_CHECKING:
    from ...config import PerturbationConfig
    from ..model.latent_lm import LatentLM

SITES = ("attn", "mlp", "residual")


class BoundPerturbation:
    """Active perturbation for one batch (a context manager); LatentLM calls ``before_forward``."""

    perturb_prompt: bool = True

    def __init__(self) -> None:
        self.phase = "prompt"

    def before_forward(self, phase: str) -> None:
        self.phase = phase

    @property
    def active(self) -> bool:
        return self.perturb_prompt or self.phase != "prompt"

    def __enter__(self) -> "BoundPerturbation":
        return self

    def __exit__(self, *exc) -> None:
        return None


class HookedPerturbation(BoundPerturbation):
    """A bound perturbation applied by forward hooks on ``modules``: ``_hook(k)`` builds module k's hook;
    the hooks are installed on ``__enter__`` and removed on ``__exit__``."""

    def __init__(self, modules: list[nn.Module], perturb_prompt: bool):
        super().__init__()
        self.modules, self.perturb_prompt = modules, perturb_prompt
        self.handles: list = []

    def _hook(self, k: int):
        raise NotImplementedError

    def __enter__(self):
        self.handles = [m.register_forward_hook(self._hook(k)) for k, m in enumerate(self.modules)]
        return self

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()
        self.handles = []


class Perturbation:
    """A stochasticity source; ``bind(lm, seeds)`` gives the context for one batch of rollouts."""

    kind = "base"
    batched = True  # False: rows must be run one at a time (native dropout)
    deterministic = False

    def bind(self, lm: "LatentLM", seeds: Tensor) -> BoundPerturbation:
        raise NotImplementedError


class NoPerturbation(Perturbation):
    kind = "none"
    deterministic = True

    def bind(self, lm: "LatentLM", seeds: Tensor) -> BoundPerturbation:
        return BoundPerturbation()


def seeds_for(run_seed: int, step: int, rank: int, n: int, stream: str = "rollout") -> Tensor:
    """``n`` distinct int63 seeds, a pure function of (run seed, step, rank, stream): reproducible,
    and different across ranks and steps."""
    h = hashlib.blake2b(f"{run_seed}/{step}/{rank}/{stream}".encode(), digest_size=8).digest()
    g = torch.Generator().manual_seed(int.from_bytes(h, "little") & (2**63 - 1))
    return torch.randint(0, 2**62, (n,), generator=g, dtype=torch.int64)


def row_uniforms(seed: int, n_sites: int, width: int) -> Tensor:
    """U(0,1) noise of one row, [n_sites, width], from its own generator: independent of the batch."""
    g = torch.Generator().manual_seed(int(seed))
    return torch.rand(n_sites, width, generator=g)


def row_normals(seed: int, n_sites: int, width: int) -> Tensor:
    g = torch.Generator().manual_seed(int(seed))
    return torch.randn(n_sites, width, generator=g)


@dataclass
class Site:
    name: str  # e.g. "layers.3.mlp"
    module: nn.Module
    width: int


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The list of transformer blocks of any HF causal LM (``model.layers``, ``transformer.h``, ...)."""
    base = model.base_model if hasattr(model, "base_model") else model
    for attr in ("layers", "h", "blocks", "decoder.layers"):
        obj = base
        for part in attr.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                break
        if isinstance(obj, nn.ModuleList) and len(obj) > 0:
            return obj
    lists = [m for m in base.modules() if isinstance(m, nn.ModuleList)]
    if not lists:
        raise ValueError(f"cannot find the decoder layers of {type(model).__name__}")
    return max(lists, key=len)


def parse_layers(spec: str, n_layers: int) -> list[int]:
    """``all``, ``3``, ``0:4`` (python slice, negatives allowed) or ``1,3,5``."""
    spec = str(spec).strip()
    if spec == "all":
        return list(range(n_layers))
    if ":" in spec:
        a, b = spec.split(":", 1)
        return list(range(n_layers))[slice(int(a) if a else None, int(b) if b else None)]
    out = [int(x) for x in spec.split(",") if x.strip()]
    for i in out:
        if not -n_layers <= i < n_layers:
            raise ValueError(f"layer {i} out of range for a {n_layers}-layer model")
    return [i % n_layers for i in out]


def find_sites(model: nn.Module, sites: list[str], layers: str) -> list[Site]:
    """Modules whose outputs are perturbed: attention output, MLP output, block output (residual stream)."""
    blocks = decoder_layers(model)
    width = model.config.hidden_size if hasattr(model.config, "hidden_size") else model.config.n_embd
    found = []
    for i in parse_layers(layers, len(blocks)):
        block = blocks[i]
        for s in sites:
            if s == "residual":
                mod = block
            elif s == "attn":
                mod = getattr(block, "self_attn", None) or getattr(block, "attn", None) or getattr(block, "attention", None)
            elif s == "mlp":
                mod = getattr(block, "mlp", None) or getattr(block, "feed_forward", None)
            else:
                raise ValueError(f"unknown perturbation site {s!r}; expected one of {SITES}")
            if mod is None:
                raise ValueError(f"layer {i} of {type(model).__name__} has no {s} module")
            found.append(Site(f"layers.{i}.{s}", mod, width))
    return found


def map_first_output(output, fn):
    """Apply ``fn`` to a module's main output (a tensor, or the first item of a tuple)."""
    if isinstance(output, tuple):
        return (fn(output[0]),) + tuple(output[1:])
    return fn(output)


def make_perturbation(cfg: "PerturbationConfig") -> Perturbation:
    from .gaussian import GaussianNoise
    from .locked import LockedDropout
    from .native import NativeDropout

    if cfg.kind == "none":
        return NoPerturbation()
    if cfg.kind == "locked":
        return LockedDropout(p=cfg.p, sites=list(cfg.sites), layers=cfg.layers, perturb_prompt=cfg.perturb_prompt)
    if cfg.kind == "native":
        return NativeDropout(p=cfg.p, perturb_prompt=cfg.perturb_prompt)
    if cfg.kind == "gaussian":
        return GaussianNoise(sigma=cfg.sigma, sites=list(cfg.sites), layers=cfg.layers, target=cfg.gaussian_target,
                             perturb_prompt=cfg.perturb_prompt)
    raise ValueError(f"unknown perturbation kind {cfg.kind!r}")
