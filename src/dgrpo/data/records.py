"""The one record type every dataset is read into: a question, its reasoning steps, its answer."""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..reward import format_number

#: the latent markers' text (:mod:`dgrpo.model.tokens` adds them to a latent model's tokenizer as special tokens): in a
#: record's text, the tokenizer reads each as the marker token, not as text (:func:`warn_if_marker_text`)
LATENT_MARKERS = ("<|start-latent|>", "<|latent|>", "<|end-latent|>")


class DataError(ValueError):
    """A data file or dataset name that cannot be read; the message names the file and record."""


@dataclass
class Record:
    """One problem.

    ``steps`` are the intermediate reasoning steps (GSM8K-Aug style ``<<3*4=12>>`` strings, or
    sentences for ProsQA); empty when the source has none (SVAMP, MultiArith, GSM-Hard, ...).
    ``answer`` is the gold final answer as text (``"18"``, ``"-3.5"``, ``"Tom is a lempus."``); a number given
    here (``18``, ``18.0``, ``np.int64(18)``, ``Decimal("18")``, a 0-d tensor) is stored as its normalised text
    (``"18"``), as the loaders store a numeric column.
    ``meta`` keeps source-specific extra fields (ProsQA's graph, the source file, ...): a mapping of column names
    (None: none).

    Raises :class:`DataError` for a ``question`` that is not text, ``steps`` that are not a list (or tuple) of
    strings (one ``str`` holding all steps included) and an ``answer`` that is neither text nor a finite number (a
    boolean included).
    """

    question: str
    steps: list[str]
    answer: str
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.question, str):
            raise DataError(f"question must be text, got {type(self.question).__name__}: {self.question!r:.60}")
        self.steps = _checked_steps(self.steps)
        self.answer = _answer_text(self.answer)
        if self.meta is None:  # (no extra fields: a TypeError deep in training followed)
            self.meta = {}
        elif not isinstance(self.meta, Mapping) or not all(isinstance(k, str) for k in self.meta):
            raise DataError(f"meta must be a mapping of column names to values, got {type(self.meta).__name__}")

    def to_dict(self) -> dict[str, Any]:
        """The record as a JSON-able dict (``meta`` only when it holds something)."""
        d: dict[str, Any] = {"question": self.question, "steps": list(self.steps), "answer": self.answer}
        if self.meta:
            d["meta"] = self.meta
        return d


def _checked_steps(steps: Any) -> list[str]:
    """``steps`` as a list of strings (a tuple becomes a list); DataError for anything else."""
    if isinstance(steps, str):
        raise DataError(
            "steps must be a list of strings, one per reasoning step; got one str: split it, e.g. text.splitlines()"
        )
    if not isinstance(steps, (list, tuple)):
        raise DataError(f"steps must be a list of strings, one per reasoning step; got {type(steps).__name__}")
    for i, step in enumerate(steps):
        if not isinstance(step, str):
            raise DataError(f"steps must be a list of strings; steps[{i}] is {type(step).__name__}: convert it to text")
    return steps if isinstance(steps, list) else list(steps)


def _answer_text(answer: Any) -> str:
    """``answer`` as text: a string as is, a number as its normalised number string; DataError for anything else."""
    if isinstance(answer, str):
        return answer
    text = format_number(answer)
    if text is not None:
        return text
    what = "a boolean" if type(answer).__name__ in ("bool", "bool_") else " ".join(repr(answer).split())[:60]
    raise DataError(
        f"answer must be text or a finite number, got {what}: give the gold answer as text (e.g. '18', 'True')"
    )


def shared_questions(train: list[Record], held_out: list[Record]) -> tuple[int, int]:
    """How many of ``held_out``'s records ask a question of ``train`` word for word (spacing aside), and how many of
    those also have its answer: held-out items a run trains on."""
    answers: dict[str, set[str]] = {}
    for r in train:
        answers.setdefault(" ".join(r.question.split()), set()).add(r.answer)
    trained = [answers.get(" ".join(r.question.split())) for r in held_out]  # (None: not in the training data)
    shared = [(r, kept) for r, kept in zip(held_out, trained) if kept is not None]
    return len(shared), sum(r.answer in kept for r, kept in shared)


def data_columns(records: Iterable[Record]) -> tuple[str, ...]:
    """The columns of the data beyond question, answer and steps: every key of the records' ``meta``, in order of
    first appearance (a column that only some records have among them)."""
    return tuple(dict.fromkeys(k for r in records for k in r.meta))


def with_columns(records: list[Record], columns: Iterable[str] = ()) -> list[Record]:
    """``records`` as the loaders return them and a scorer is given them: each with every column of ``columns`` and of
    ``records`` (:func:`data_columns`) in its ``meta``, None where it has none (a copy of a record that lacks one; the
    records given are not changed). A scorer in TRL's form then gets the same keywords whichever of them a call holds (a
    vote's chosen completions, a rank's shard: pass the whole data's columns)."""
    keys = tuple(dict.fromkeys([*columns, *data_columns(records)]))
    out = []
    for r in records:
        missing = [k for k in keys if k not in r.meta]
        out.append(replace(r, meta={**r.meta, **dict.fromkeys(missing)}) if missing else r)
    return out


def warn_if_marker_text(records: list[Record], where: str, stacklevel: int = 3) -> None:
    """Warn once (one line) when the questions, steps or answers of ``records`` (read from ``where``) hold a latent
    marker's text (:data:`LATENT_MARKERS`): a latent model's tokenizer reads it as the marker token itself, so the
    model would see a thought marker in a question, or learn to write one in an answer."""
    hits = [(i, found) for i, r in enumerate(records) if (found := _marker_text(r)) is not None]
    if not hits:
        return
    n, (i, (part, text, marker)) = len(hits), hits[0]
    warnings.warn(
        f"{where}: {n} record{'s' * (n != 1)} hold{'s' * (n == 1)} the latent marker text {marker!r} (record {i}'s "
        f"{part}: {text[:60]!r}), which a latent model's tokenizer reads as the marker token, not as text: remove or "
        "respell it in the data",
        stacklevel=stacklevel,
    )


def _marker_text(r: Record) -> tuple[str, str, str] | None:
    """(the part, its text, the marker) of the first part of ``r`` that holds a latent marker's text; None if none."""
    for part, text in (("question", r.question), *(("steps", s) for s in r.steps), ("answer", r.answer)):
        for marker in LATENT_MARKERS:
            if marker in text:
                return part, text, marker
    return None


def fingerprint(records: list[Record]) -> str:
    """``"<count>:<digest>"`` of the records' questions, steps and answers, in order: what a resumed run checks to
    train on the data its checkpoint was trained on (``meta`` aside)."""
    h = hashlib.sha256()
    for r in records:
        for part in (r.question, *r.steps, r.answer):
            h.update(part.encode("utf-8", "surrogatepass"))
            h.update(b"\x00")
        h.update(b"\x01")
    return f"{len(records)}:{h.hexdigest()[:16]}"


def fingerprint_count(value: object) -> int | None:
    """The count of records a :func:`fingerprint` (``"<count>:<digest>"``) names; None when ``value`` is none (a
    checkpoint written before dgrpo recorded it)."""
    count = value.partition(":")[0] if isinstance(value, str) else ""
    return int(count) if count.isdigit() else None


def check_records(records: object, where: str, empty: bool = False) -> None:
    """ValueError (one line) unless ``records`` is a non-empty (``empty``: or empty) list of :class:`Record`, naming
    what it holds instead (a list of dicts is the usual slip: ``Record(question=..., steps=[], answer=...)`` or a
    loader makes them)."""
    if isinstance(records, list) and (records or empty) and all(isinstance(r, Record) for r in records):
        return
    if not isinstance(records, list):
        got = type(records).__name__
    elif not records:
        got = "a list of 0"
    else:
        bad = next(r for r in records if not isinstance(r, Record))
        got = f"a list of {len(records)} holding {type(bad).__name__} items ({bad!r:.60})"
    raise ValueError(
        f"{where} must be a {'' if empty else 'non-empty '}list of dgrpo Records, got {got}; make them with "
        "dgrpo.data.Record(question=..., steps=[], answer=...) or a loader (dgrpo.load_dataset, which also reads a "
        "Hugging Face Dataset or a list of dicts in memory)"
    )
