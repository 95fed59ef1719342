"""Build the LatentLM a config names: the built-in tiny model, a local checkpoint or a hub id."""

from __future__ import annotations

from pathlib import Path

import torch

from ..config import ModelConfig, TaskConfig
from ..data.synthetic import tokenizer_corpus
from ..data.tokenizer import train_word_tokenizer
from .latent_lm import LatentLM, LatentSettings
from .tiny import build_tiny_model

BUILTIN = "builtin-tiny"


class CheckpointError(FileNotFoundError):
    """A checkpoint directory that does not exist or does not hold a model."""


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise CheckpointError(f"device {name!r} requested but CUDA is not available on this machine")
    return torch.device(name)


def resolve_checkpoint(path: str | Path) -> Path:
    """A run directory resolves to its ``final/`` checkpoint; a checkpoint directory to itself."""
    p = Path(path)
    if (p / "final" / "config.json").is_file():
        return p / "final"
    if (p / "config.json").is_file():
        return p
    if p.exists():
        raise CheckpointError(f"{p} holds no model checkpoint (no config.json, no final/config.json)")
    raise CheckpointError(f"checkpoint directory not found: {p}")


def build_builtin(model_cfg: ModelConfig, task_cfg: TaskConfig, seed: int = 0) -> LatentLM:
    tok = train_word_tokenizer(tokenizer_corpus(task_cfg))
    model = build_tiny_model(
        model_cfg.arch,
        len(tok),
        seed=seed,
        hidden_size=model_cfg.hidden_size,
        num_layers=model_cfg.num_layers,
        num_heads=model_cfg.num_heads,
        intermediate_size=model_cfg.intermediate_size,
    )
    return LatentLM(model, tok, LatentSettings())


def load_model(
    model_cfg: ModelConfig,
    task_cfg: TaskConfig,
    *,
    init: str | None = None,
    seed: int = 0,
    device: torch.device | str = "cpu",
) -> LatentLM:
    """``init`` (a checkpoint) wins over ``model.name_or_path``; the built-in name builds a fresh tiny model."""
    dtype = torch.bfloat16 if model_cfg.dtype == "bfloat16" else torch.float32
    if init:
        lm = LatentLM.from_pretrained(
            resolve_checkpoint(init), dtype=dtype, trust_remote_code=model_cfg.trust_remote_code
        )
    elif model_cfg.name_or_path == BUILTIN:
        lm = build_builtin(model_cfg, task_cfg, seed)
        lm.to(dtype)
    else:
        src = model_cfg.name_or_path
        if Path(src).exists():
            src = str(resolve_checkpoint(src))
        lm = LatentLM.from_pretrained(src, dtype=dtype, trust_remote_code=model_cfg.trust_remote_code)
    return lm.to(device)
