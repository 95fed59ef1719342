"""The one record type every dataset is read into: a question, its reasoning steps, its answer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class DataError(ValueError):
    """A data file or dataset name that cannot be read; the message names the file and record."""


@dataclass
class Record:
    """One problem.

    ``steps`` are the intermediate reasoning steps (GSM8K-Aug style ``<<3*4=12>>`` strings, or
    sentences for ProsQA); empty when the source has none (SVAMP, MultiArith, GSM-Hard, ...).
    ``answer`` is the gold final answer as text (``"18"``, ``"-3.5"``, ``"Tom is a lempus."``).
    ``meta`` keeps source-specific extra fields (ProsQA's graph, the source file, ...).
    """

    question: str
    steps: list[str]
    answer: str
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"question": self.question, "steps": list(self.steps), "answer": self.answer}
        if self.meta:
            d["meta"] = self.meta
        return d
