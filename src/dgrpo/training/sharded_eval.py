"""Validation sharded over processes: each rank scores its share of the records, the scores are gathered into one
mean (a rank's failure is every rank's), and the best-checkpoint value is read from them."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

from ..config import ConfigError
from ..data.records import Record
from ..eval.evaluate import EvalResult, ordered_mean
from ..eval.results import result_scores
from ..eval.scoring import RewardError
from .distributed import Dist

#: what the other ranks say when an evaluation failed on one rank's shard (that rank's own line says why)
EVALUATION_FAILED_ELSEWHERE = "the evaluation failed in another process (its own error line says why)"


def sharded_scores(
    dist: Dist, evaluate: Callable[[list[Record]], int | EvalResult], records: list[Record]
) -> dict[str, float]:
    """The validation metrics of ``records`` with each rank scoring its shard: ``accuracy``, and ``mean_score`` when
    ``evaluate(shard)`` returns an :class:`EvalResult` with one (a trainer's ``evaluate_fn``: how many of the shard's
    records are correct, an int, or their EvalResult). The counts and the scores' sums are summed over ranks (every
    rank calls this); ``mean_score`` is left out when a shard's result has none (a count). An evaluation that fails on
    one rank's shard (a scorer's error, a count that is none) stops every rank at that sum, each with one line."""
    local = dist.shard(records)
    try:
        count, scored = _checked_result(evaluate(local), len(local)) if local else (0, [])
    except Exception:
        dist.sum_ints([0, 1, 0])  # (the others learn of it at the sum below, and stop there too)
        raise
    count, failed, unscored = dist.sum_ints([count, 0, int(scored is None)])
    if failed:
        raise RewardError(EVALUATION_FAILED_ELSEWHERE)
    n = max(1, len(records))
    if unscored or not records:
        return {"accuracy": count / n}
    return {"accuracy": count / n, "mean_score": _gathered_mean(dist, scored, len(records))}


def _gathered_mean(dist: Dist, scored: list[float] | float | None, n: int) -> float:
    """The mean score of ``n`` records over every rank's shard (``scored``: its records' scores, or their sum where
    its result has no per-record scores). With every shard's scores, they are summed in the records' order, as one
    process sums them (:func:`~dgrpo.eval.evaluate.evaluate`'s ``mean_score``): N processes then keep the same
    best/ as one, bit for bit (a float all-reduce of the sums differed in the last bit). Otherwise the sums, in rank
    order."""
    parts = dist.all_gather_objects(scored)
    if all(isinstance(part, list) for part in parts):
        return ordered_mean([score for part in parts for score in part])
    return sum(sum(part) if isinstance(part, list) else float(part or 0.0) for part in parts) / n


def _checked_result(returned: Any, n: int) -> tuple[int, list[float] | float | None]:
    """(how many are correct, their scores) of what an ``evaluate_fn`` returned for a shard of ``n`` records: a count
    (:func:`_checked_count`; scores None), or the :class:`EvalResult` of those ``n`` records: each prediction row's
    ``score`` (:func:`evaluate`'s) where their mean is its ``mean_score``, else the sum ``mean_score`` * ``n`` (a
    result without rows), or None when its ``mean_score`` is None (no scores). TypeError otherwise."""
    if not isinstance(returned, EvalResult):
        return _checked_count(returned, n), None
    if returned.n != n:
        raise TypeError(
            f"evaluate_fn returned the EvalResult of {returned.n} records for the {n} it is given: evaluate every "
            "record (apply any limit beforehand)"
        )
    mean = returned.mean_score
    if mean is not None and not 0 <= mean <= 1:  # (NaN too)
        raise TypeError(f"evaluate_fn returned an EvalResult whose mean_score is {mean!r}, not in [0, 1]")
    if mean is None:
        return _checked_count(returned.correct, n), None
    scores = result_scores(returned)
    return _checked_count(returned.correct, n), float(mean) * n if scores is None else scores


def best_value(scores: dict[str, float], metric: str, key: str) -> float:
    """The value of one validation's ``scores`` (:func:`sharded_scores`) that ``best/`` is kept by: its ``metric``
    (``key``: ``grpo.best_metric`` or ``sft.best_metric``). ConfigError when it is ``mean_score`` and the
    ``evaluate_fn`` gave none (it returns a count)."""
    if metric not in scores:
        raise no_best_metric(metric, key)
    return float(scores[metric])


def no_best_metric(metric: str, key: str) -> ConfigError:
    """The refusal of ``key`` = ``metric`` (mean_score) for an ``evaluate_fn`` that gives none: it returns a count, or
    an EvalResult whose ``mean_score`` is None (one made by hand)."""
    return ConfigError(
        f"{key}={metric}: the evaluate_fn returns a count of correct records, which has no {metric}, or an EvalResult "
        f"whose {metric} is None; return evaluate(...)'s EvalResult (dgrpo.eval.evaluate), or set {key}=accuracy"
    )


def _checked_count(correct: Any, n: int) -> int:
    """``correct`` as the count of correct records of a shard of ``n`` (TypeError otherwise)."""
    try:
        count = operator.index(correct)  # an int (numpy's, or a 0-d integer tensor, too)
    except TypeError:
        count = -1
    if not 0 <= count <= n:
        raise TypeError(
            f"evaluate_fn returns how many of the {n} records it is given are correct (an int from 0 to "
            f"{n}), got {correct!r}" + (": an accuracy? return the count" if isinstance(correct, float) else "")
        )
    return count
