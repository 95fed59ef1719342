"""dgrpo: Dropout-GRPO, reinforcement-learning post-training for Coconut-style latent-reasoning LMs."""

from __future__ import annotations

__version__ = "0.1.0"

import os
from typing import TYPE_CHECKING

from .config import ConfigError
from .data.records import DataError, Record

if TYPE_CHECKING:
    from .config import DataConfig


def load_dataset(
    name_or_path: str | os.PathLike | list[dict], split: str | None = None, *, data: DataConfig | None = None
) -> list[Record]:
    """Records of a dataset given by name (``gsm8k``, ``svamp``, ``builtin``, ...) or file path, or of several
    joined by ``+`` (``gsm_hard+svamp``, ``a.jsonl+b.csv``): the names ``--data`` and ``data.*`` take.

    A Hugging Face ``datasets.Dataset`` (or ``DatasetDict``) already in memory is read as a file of its rows is, and
    so is a list of dicts (rows: ``load_dataset([{"question": ..., "answer": ...}, ...])``).

    ``split`` picks a split of a named dataset (or ``name:split``) or of a DatasetDict; a file has none (giving one
    with a file path is a DataError). ``data`` (a :class:`dgrpo.config.DataConfig`) maps the columns of a file
    whose keys are not a known format:
    ``load_dataset("my.csv", data=DataConfig(question_key="prompt", answer_key="target"))``.
    """
    from .data import load_hf_dataset, load_rows, load_spec

    if isinstance(name_or_path, list) and name_or_path and isinstance(name_or_path[0], dict):  # rows
        if split is not None:
            raise DataError(f"load_dataset: rows in memory have no splits; got split={split!r} (give no split)")
        return load_rows(name_or_path, data=data)
    if type(name_or_path).__name__ in ("Dataset", "DatasetDict") and type(name_or_path).__module__.startswith(
        "datasets."
    ):  # (by name: datasets is not imported here)
        return load_hf_dataset(name_or_path, split, data=data)
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise DataError(
            f"load_dataset takes a dataset name or a file / folder path, got {type(name_or_path).__name__}; records "
            "already in memory need no loading: a list of dgrpo.Record(question, steps, answer, meta); a list of dicts "
            "is read as rows"
        )
    return load_spec(os.fspath(name_or_path), split=split, data=data)


def score(completion_text: str, gold_answer) -> float:
    """1.0 if the completion's answer number equals the gold answer, else 0.0 (:func:`dgrpo.reward.score`)."""
    from .reward import score as _score

    return _score(completion_text, gold_answer)


def __getattr__(name: str):
    if name == "LatentLM":
        from .model.latent_lm import LatentLM

        return LatentLM
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), "LatentLM"})


__all__ = ["ConfigError", "DataError", "LatentLM", "Record", "load_dataset", "score"]
