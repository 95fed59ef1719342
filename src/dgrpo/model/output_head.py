"""The LM head as the model's own forward applies it: some causal LMs transform the head's logits before the softmax
(Gemma 2/3's ``final_logit_softcapping``, Cohere's ``logit_scale``, Granite's ``logits_scaling``). dgrpo calls the
head on its own hidden states (the recurrence, chunked scoring), so it applies the same transform here; without it
the log-probs, the entropy, sampling and the KL were not the model's (the greedy token was: the transforms are
monotone)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn


@dataclass(frozen=True)
class LogitTransform:
    """logits -> softcap * tanh(scale * logits / softcap) (no cap: scale * logits), as the model's forward does."""

    scale: float = 1.0
    softcap: float | None = None

    @property
    def identity(self) -> bool:
        return self.scale == 1.0 and self.softcap is None

    def __call__(self, logits: Tensor) -> Tensor:
        if self.scale != 1.0:
            logits = logits * self.scale
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits


def logit_transform(config: Any) -> LogitTransform:
    """The transform a Hugging Face causal LM's forward applies after its head, read from its config."""
    scale = 1.0
    model_type = str(getattr(config, "model_type", ""))
    if model_type.startswith("cohere") and getattr(config, "logit_scale", None) is not None:
        scale *= float(config.logit_scale)  # CohereForCausalLM: logits * logit_scale
    if getattr(config, "logits_scaling", None) is not None:
        if model_type.startswith("hyperclovax"):
            scale *= float(config.logits_scaling)  # HyperCLOVAXForCausalLM: logits * logits_scaling
        else:
            scale /= float(config.logits_scaling)  # Granite (MiniCPM3 divides its hidden states: the same)
    if model_type == "falcon_h1" and getattr(config, "lm_head_multiplier", None) is not None:
        scale *= float(config.lm_head_multiplier)  # FalconH1ForCausalLM: logits * lm_head_multiplier
    cap = getattr(config, "final_logit_softcapping", None)  # Gemma 2 / 3, VaultGemma, ...
    return LogitTransform(scale, float(cap) if cap else None)


class TransformedHead:
    """The head module followed by the transform: called as the head is, with its ``weight`` (the vocabulary)."""

    def __init__(self, head: nn.Module, transform: LogitTransform):
        self.head = head
        self.transform = transform
        self.weight = head.weight

    def __call__(self, hidden: Tensor) -> Tensor:
        return self.transform(self.head(hidden))


def output_head(model: Any, transform: LogitTransform) -> Any:
    """The model's head as its forward applies it (the module itself when the transform is the identity)."""
    head: Any = model.get_output_embeddings()  # (looked up per call: FSDP and PEFT wrap the module in place)
    return head if transform.identity else TransformedHead(head, transform)
