"""dgrpo: Dropout-GRPO, reinforcement-learning post-training for Coconut-style latent-reasoning LMs."""

from __future__ import annotations

__version__ = "0.1.0"

from .config import ConfigError
from .data.records import DataError, Record


def load_dataset(name_or_path: str, split: str | None = None) -> list[Record]:
    """Records of a dataset given by name (``gsm8k``, ``svamp``, ``builtin``, ...) or file path."""
    from .data.loaders import load_dataset as _load

    return _load(name_or_path, split)


def score(completion_text: str, gold_answer) -> float:
    """1.0 if the completion's final number equals the gold answer, else 0.0."""
    from .reward import score as _score

    return _score(completion_text, gold_answer)


def __getattr__(name: str):
    if name == "LatentLM":
        from .model.latent_lm import LatentLM

        return LatentLM
    raise AttributeError(name)


__all__ = ["ConfigError", "DataError", "LatentLM", "Record", "load_dataset", "score"]
