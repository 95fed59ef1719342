"""Mutation tests of dgrpo.eval.results: the merged shards' counts and the scores a merge reads (each test kills a
change of the source that the evaluation tests let live)."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

from dgrpo.eval.evaluate import EvalResult
from dgrpo.eval.results import merge_results, result_scores, write_results


def _result(scores: list[float | Fraction], unparseable: int = 0) -> EvalResult:
    """A shard of one row per score (correct where it is 1), ``unparseable`` of them unparsed."""
    rows = [{"question": f"q{i}", "score": s} for i, s in enumerate(scores)]
    correct = sum(s == 1 for s in scores)
    mean = sum(float(s) for s in scores) / len(scores)
    return EvalResult(
        "d",
        correct / len(scores),
        len(scores),
        correct,
        unparseable,
        0,
        0,
        "coconut",
        1.0,
        mean_score=mean,
        predictions=rows,
    )


def test_merged_shards_count_every_shard_s_unparseable_answers() -> None:
    """1 unparsed of 2 and 2 unparsed of 3 merge to 3 unparsed of 5."""
    merged = merge_results([_result([1, 0], unparseable=1), _result([0, 0, 1], unparseable=2)])
    assert (merged.n, merged.correct, merged.unparseable) == (5, 2, 3)


def test_scores_of_any_real_number_type_are_read() -> None:
    """A scorer's ``Fraction(1, 2)`` (a real number, not a float) is the score 0.5, merged bit for bit."""
    assert result_scores(_result([Fraction(1, 2), 1])) == [0.5, 1.0]


def test_results_are_written_into_a_new_nested_folder_whose_odd_leftovers_are_removed(tmp_path: Path) -> None:
    """The folder and its parents are made; a temporary file of a name without a process id (``.tmp-results.json-x``)
    is no running writer's: it is removed, not a crash."""
    out = tmp_path / "a" / "b"
    out.mkdir(parents=True)
    (out / ".tmp-results.json-x").write_text("{")
    write_results(_result([1, 0]), out)
    write_results(_result([1]), tmp_path / "c" / "d")
    assert sorted(p.name for p in out.iterdir()) == ["predictions.jsonl", "results.json"]
    assert json.loads((tmp_path / "c" / "d" / "results.json").read_text())["n"] == 1
