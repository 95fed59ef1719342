"""The KL reference policy pi_ref (the KL anchor of paper Eq. 1, estimated by Eq. 6's Huberized k3): the initial
policy, frozen, renewed every ``grpo.ref_renewal_every`` steps (paper Table 2: 500).

Full fine-tuning keeps a frozen copy of the model (:class:`CopiedReference`). Under LoRA the backbone is already
frozen, so the reference is a second, frozen adapter on the same backbone (:class:`AdapterReference`): no second
copy of the weights; renewal copies the policy adapter into it (see :mod:`dgrpo.model.lora`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from ..model import lora
from ..model.latent_lm import LatentLM
from .distributed import Dist

T = TypeVar("T")


class CopiedReference:
    """A frozen copy of the whole model (a plain copy on every rank, also under FSDP: it only runs no-grad forwards)."""

    def __init__(self, lm: LatentLM, dist: Dist):
        self.policy, self.dist = lm, dist
        self.lm = LatentLM(copy.deepcopy(lm.model).eval().requires_grad_(False), lm.tokenizer, lm.settings)
        self.lm.compiled_layers = lm.compiled_layers  # model.compile: one step serves both (weights are arguments)
        self.lm.head_stats = lm.head_stats  # model.compile_head: so do the compiled head statistics

    def run(self, fn: Callable[[LatentLM], T]) -> T:
        """``fn(reference model)`` without gradient."""
        with torch.no_grad():
            return fn(self.lm)

    def renew(self) -> None:
        """pi_ref <- pi_theta (a collective under FSDP: every rank calls it)."""
        self.lm.model.load_state_dict(self.dist.full_state_dict(self.policy.model))

    @property
    def checkpoint_state(self) -> Any:
        """What a resumable checkpoint saves of the reference (``state_dict`` / ``load_state_dict``)."""
        return self.lm.model


class AdapterReference:
    """Under LoRA: the frozen ``reference`` adapter on the policy's own backbone."""

    def __init__(self, lm: LatentLM):
        self.lm = lm
        lora.add_reference(lm)

    def run(self, fn: Callable[[LatentLM], T]) -> T:
        with torch.no_grad(), lora.reference_active(self.lm) as ref:
            return fn(ref)

    def renew(self) -> None:
        lora.renew_reference(self.lm)

    @property
    def checkpoint_state(self) -> Any:
        return lora.ReferenceAdapterState(self.lm)


def make_reference(lm: LatentLM, dist: Dist) -> CopiedReference | AdapterReference:
    """The reference for ``lm``: the adapter kind under LoRA, else a copy. Build it before the optimizer."""
    return AdapterReference(lm) if lm.peft is not None else CopiedReference(lm, dist)
