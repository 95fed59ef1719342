"""Tiny from-scratch causal LMs (Qwen2, Llama or GPT-2 architecture) built from configs, no hub needed."""

from __future__ import annotations

from typing import Any

import torch
from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig, PreTrainedModel, Qwen2Config


def _kv_heads(num_heads: int) -> int:
    """Key/value heads of a tiny Qwen2 / Llama model: the largest divisor of ``num_heads`` up to half of it (half for
    an even count, as before; 5 heads took 2, which does not divide 5, and the first forward failed in attention)."""
    return max(d for d in range(1, max(1, num_heads // 2) + 1) if num_heads % d == 0)


def tiny_config(
    arch: str,
    vocab_size: int,
    *,
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    intermediate_size: int = 512,
    max_positions: int = 512,
    pad_token_id: int = 0,
    eos_token_id: int = 1,
):
    common: dict[str, Any] = dict(
        vocab_size=vocab_size, pad_token_id=pad_token_id, eos_token_id=eos_token_id, bos_token_id=eos_token_id
    )
    if arch in ("qwen2", "llama"):  # (Qwen2 ties its head to the embeddings, as Qwen2.5-1.5B does; Llama does not)
        config_class = Qwen2Config if arch == "qwen2" else LlamaConfig
        return config_class(
            hidden_size=hidden_size,
            intermediate_size=intermediate_size,
            num_hidden_layers=num_layers,
            num_attention_heads=num_heads,
            num_key_value_heads=_kv_heads(num_heads),
            max_position_embeddings=max_positions,
            tie_word_embeddings=arch == "qwen2",
            **common,
        )
    if arch == "gpt2":
        return GPT2Config(
            n_embd=hidden_size,
            n_layer=num_layers,
            n_head=num_heads,
            n_inner=intermediate_size,
            n_positions=max_positions,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            **common,
        )
    raise ValueError(f"unknown tiny architecture {arch!r}; expected qwen2, llama or gpt2")


def build_tiny_model(arch: str, vocab_size: int, *, seed: int = 0, **kw) -> PreTrainedModel:
    """A randomly initialised model (deterministic given ``seed``), in fp32."""
    cfg = tiny_config(arch, vocab_size, **kw)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(cfg)
    return model
