"""Hand-written cases that pin branches of the verifier (dgrpo.reward) and the built-in scorers (dgrpo.eval.scoring)
which no other test held: each was found by a mutation test, a small change of one branch that every test passed."""

from __future__ import annotations

import warnings
from decimal import Decimal

import pytest

from dgrpo.data.records import Record
from dgrpo.eval.scoring import call_checked, choice_letter, coconut, warn_if_gold_scores_zero
from dgrpo.reward import (
    answer_decimals,
    extract_answer,
    format_number,
    normalize_number,
    numbers_agree,
    numbers_match,
    score,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("#### 1234,567", None),  # four digits before a thousands comma: no grouping, not 1234567
        ("#### -$ 5", "-5"),  # a space after the dollar keeps the sign before it
        ("(2+3)-1", "1"),  # a number glued to a closing bracket is no negative one
        ("x[2]-1", "1"),
        ("The answer isn't 5; it is 7.", "7"),  # "answer isn't" is no marker
        ("#### \uff19\uff18\uff17\uff16\uff15\uff14\uff13\uff12\uff11\uff10", "9876543210"),  # every full-width digit
        ("9*2 = 18 #", None),  # a lone '#' at the end is a marker cut off: no answer
        ("##7 then 3", "7"),  # a glued run of two '#' is a marker
        ("#### x = 7 (in 3 steps)", "7"),  # GSM8K's marker before a word is no markdown heading
        ("### 18 (from 3 steps)", "18"),  # Coconut's marker before a number is no heading
    ],
)
def test_extraction_edge_cases(text: str, expected: str | None) -> None:
    assert extract_answer(text) == expected


def test_no_text_has_no_answer() -> None:
    assert extract_answer(None) is None  # type: ignore[arg-type]


def test_a_full_width_gold_is_its_number() -> None:
    assert normalize_number("\uff14\uff12") == "42"


def test_answer_decimals_are_those_of_the_plain_number_and_never_negative() -> None:
    assert answer_decimals("#### 1.5e3") == 0
    assert answer_decimals("no number here") == 0
    assert answer_decimals("#### 2.50") == 2


def test_format_number_refuses_what_it_cannot_read() -> None:
    import torch

    assert format_number(Decimal("1e5000")) is None  # (as the int 10**5000: past int->str's limit)
    assert format_number(torch.tensor(1.0, device="meta")) is None  # (.item() raises RuntimeError)


def test_a_narrow_float_is_its_shortest_decimal_even_of_one_digit() -> None:
    import numpy as np

    assert format_number(np.float16(1e-7)) == "0.0000001"  # (a float16 subnormal: 1.2e-07 reads back as it too)


@pytest.mark.parametrize(
    ("completion", "gold", "expected"),
    [
        ("#### 99999.9999", 100000, 1.0),  # off by exactly 1e-9 of the larger: float noise (as math.isclose)
        ("#### 99999.9995", 100000, 0.0),  # off by 5e-9 relative: no noise, though under 0.001
        ("#### 0.00000201075", "0.0000020107", 1.0),  # a gold rounded at its 10th decimal: half a unit is in
        ("#### 0.00000201065", "0.0000020107", 1.0),
        ("#### 0.000002010751", "0.0000020107", 0.0),
    ],
)
def test_tolerance_limits(completion: str, gold: str | int, expected: float) -> None:
    assert score(completion, gold) == expected


def test_a_number_that_is_no_number_matches_nothing() -> None:
    assert numbers_match("NaN", "2.5") is False
    assert numbers_match("Infinity", "2.5") is False


def test_numbers_agree_either_way() -> None:
    assert numbers_agree("2.333", "2.33")
    assert numbers_agree("2.33", "2.333")
    assert not numbers_agree("2.3", "2.33")


def test_a_hash_gold_is_read_after_the_last_standalone_marker() -> None:
    assert score("#### x\n#### C#", "C#") == 1.0


def test_an_empty_text_gold_is_never_answered() -> None:
    assert score("", "") == 0.0
    assert score("#### ", "  ") == 0.0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("#### DNA is C", "C"),  # a capital inside a word is no letter answer
        ("#### Because of this, C", "C"),
        ("#### c.", "C"),  # a lone lower-case letter with its period
        ("The answer is A? No: the answer is B", "B"),  # the last marker with a letter after it
        ("Answer:B, since C is wrong", "B"),  # a letter right after the marker is the first after it
    ],
)
def test_choice_letter_edge_cases(text: str, expected: str) -> None:
    assert choice_letter(text) == expected


def test_coconut_scores_an_answer_without_a_hash_zero() -> None:
    records = [Record("q", [], "18")] * 2
    assert coconut(["18", "#### 18"], records) == [0.0, 1.0]


def test_a_scorer_value_within_tolerance_of_0_is_0() -> None:
    def near_zero(completions: list[str], records: list[Record]) -> list[float]:
        return [1e-7, -1e-7, 0.5]

    records = [Record("q", [], "18")] * 3
    assert call_checked(near_zero, "near_zero", ["a", "b", "c"], records, "scorer") == [0.0, 0.0, 0.5]


def test_only_all_zero_gold_scores_are_warned_about() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_gold_scores_zero([1.0, 0.0], "the reward")
    with pytest.warns(UserWarning, match="gives 0 to the gold answer of every record"):
        warn_if_gold_scores_zero([0.0, 0.0], "the reward")
