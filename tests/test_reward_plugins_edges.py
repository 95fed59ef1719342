"""Rewards as a researcher writes them: edges of what a reward function returns, and of how its parts combine."""

from __future__ import annotations

import re
from typing import Any

import pytest

from dgrpo.data.records import Record
from dgrpo.eval.scoring import RewardError, call_checked

RECORDS = [Record(question=f"q{i}", answer=str(i), steps=[], meta={"n": str(i)}) for i in range(3)]
COMPLETIONS = ["#### 0", "#### 1", "#### x"]


def _lazy_float(completions: list[str], **kwargs: Any) -> Any:
    return (float(c.split("####")[-1]) for c in completions)  # (a generator: float(' x') fails as it is read)


def _lazy_map(completions: list[str], records: list[Record]) -> Any:
    return map(lambda c, r: {"0": 1.0}[r.answer], completions, records)  # (KeyError on row 1, when read)


def _lazy_type(completions: list[str], records: list[Record]) -> Any:
    return (len(c) + r.meta["n"] for c, r in zip(completions, records))  # (a TypeError, when read)


@pytest.mark.parametrize(
    ("fn", "error", "row"),
    [
        (_lazy_float, "ValueError", "row 2 (completion '#### x'"),
        (_lazy_map, "KeyError", "row 1 (completion"),
        (_lazy_type, "TypeError", "row 0 (completion"),
    ],
)
def test_a_lazy_return_that_fails_as_it_is_read_names_the_function_and_the_row(fn, error, row) -> None:
    # a generator or map() computes its values as they are read: its error escaped bare (a ValueError with no word of
    # the reward) or, a TypeError, was told as "returned <generator ...>, not one value per completion"
    with pytest.raises(RewardError, match=rf"^reward {fn.__name__} raised {error}: .* on {re.escape(row)}") as e:
        call_checked(fn, fn.__name__, COMPLETIONS, RECORDS)
    assert "\n" not in str(e.value)


def test_a_lazy_return_that_reads_well_is_taken() -> None:
    def lazy(completions: list[str], records: list[Record]) -> Any:
        return (float(c == f"#### {r.answer}") for c, r in zip(completions, records))

    assert call_checked(lazy, "lazy", COMPLETIONS, RECORDS) == [1.0, 1.0, 0.0]
