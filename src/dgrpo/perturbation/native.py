"""The model's own attention dropout, replayed by restoring the RNG state before every forward.

This is the mechanism the paper describes (Algorithm 1: "restoring the chain seed at every latent
step"). PyTorch's dropout draws from the global generator, so a row's mask depends on everything
else in the batch and on the call sequence: it is exact only one rollout at a time, with the update
re-running the same sequence of forwards (the trainer scores answers token by token in this mode).
The global RNG state is saved on entry and restored on exit.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from .base import BoundPerturbation, Perturbation, decoder_layers


def attention_modules(model: nn.Module) -> list[nn.Module]:
    mods = []
    for block in decoder_layers(model):
        m = getattr(block, "self_attn", None) or getattr(block, "attn", None) or getattr(block, "attention", None)
        if m is None:
            raise ValueError(f"{type(block).__name__} has no attention module")
        mods.append(m)
    return mods


class _BoundNative(BoundPerturbation):
    def __init__(self, attn: list[nn.Module], seed: int, p: float, perturb_prompt: bool):
        super().__init__()
        self.attn, self.seed, self.p, self.perturb_prompt = attn, seed, p, perturb_prompt
        self.saved: list = []

    def _set(self, on: bool) -> None:
        for m in self.attn:
            m.train(on)

    def before_forward(self, phase: str) -> None:
        super().before_forward(phase)
        self._set(self.active)
        torch.manual_seed(self.seed)  # the same stream at every forward of this rollout (CPU and all CUDA devices)

    def __enter__(self):
        self.cpu_state = torch.random.get_rng_state()
        self.cuda_state = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        for m in self.attn:
            self.saved.append((m.training, getattr(m, "attention_dropout", None),
                               getattr(getattr(m, "attn_dropout", None), "p", None)))
            if hasattr(m, "attention_dropout"):
                m.attention_dropout = self.p
            if isinstance(getattr(m, "attn_dropout", None), nn.Dropout):
                m.attn_dropout.p = self.p
        return self

    def __exit__(self, *exc):
        for m, (training, ad, adp) in zip(self.attn, self.saved):
            m.train(training)
            if ad is not None:
                m.attention_dropout = ad
            if adp is not None:
                m.attn_dropout.p = adp
        torch.random.set_rng_state(self.cpu_state)
        if self.cuda_state is not None:
            torch.cuda.set_rng_state_all(self.cuda_state)


class NativeDropout(Perturbation):
    kind = "native"
    batched = False

    def __init__(self, p: float = 0.1, perturb_prompt: bool = True):
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout p must be in [0, 1), got {p}")
        self.p, self.perturb_prompt = p, perturb_prompt
        self.deterministic = p == 0.0

    def bind(self, lm, seeds: Tensor) -> BoundPerturbation:
        if seeds.numel() != 1:
            raise ValueError("native dropout replays the global RNG stream: bind one rollout at a time")
        return _BoundNative(attention_modules(lm.model), int(seeds.item()), self.p, self.perturb_prompt)
