"""The verifier: answer extraction, numeric/text scoring, GSM-Hard tolerance, and property tests."""

from __future__ import annotations

import time
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dgrpo.data.records import DataError, Record
from dgrpo.eval.scoring import exact
from dgrpo.reward import (
    GOLD_ROUNDED_AT,
    ROUNDED_GOLD_DECIMALS,
    extract_answer,
    format_number,
    is_parseable,
    normalize_number,
    numbers_match,
    parse_number,
    score,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 eggs.\n#### 18", "18"),
        ("#### 40,000", "40000"),
        ("#### 1,450,000", "1450000"),
        ("#### $40,000.", "40000"),
        ("#### -3", "-3"),
        ("####-3", "-3"),
        ("#### +7", "7"),
        ("#### -$5", "-5"),
        ("#### $-5", "-5"),
        ("#### \u22124", "-4"),
        # a minus sign standing apart after the marker is the answer's (it was read as 5); not a list's dash on the
        # next line, nor a subtraction's between numbers
        ("#### - 5", "-5"),
        ("####- 5", "-5"),
        ("#### \u2212 5", "-5"),
        ("#### - $5", "-5"),
        ("The answer is - 12.5", "-12.5"),
        ("\\boxed{- 5}", "-5"),
        ("The answer is: - 5", "-5"),  # (the marker's colon, markdown's stars, a math dollar before the sign)
        ("**Answer:** - 5", "-5"),
        ("Final answer: $ - 5$", "-5"),
        ("The answer is:\n- 5 apples", "5"),
        ("#### 20 - 5", "20"),
        # a minus before a parenthesis that opens the number is its sign (it read 5, and no answer in a box)
        ("#### -(5)", "-5"),
        ("#### - ( 5 )", "-5"),
        ("The answer is -(12.5).", "-12.5"),
        ("\\boxed{-(5)}", "-5"),
        ("#### (5)", "5"),
        ("The answer is 20 -(5)", "20"),
        ("#### 3.50", "3.5"),
        ("#### .5", "0.5"),
        ("#### 0.50 dollars", "0.5"),
        ("#### 007", "7"),
        ("#### -0", "0"),
        ("#### 42.", "42"),
        ("####   42  \n", "42"),
        ("#### 18 eggs, 20 hens", "18"),  # first number after the marker
        # (documented conventions) nothing is evaluated and a space joins no digits: the number right after the marker
        ("#### 9*2 = 18", "9"),
        ("The answer is 9*2 = 18.", "9"),
        ("9*2 = 18", "18"),  # (no marker: the last number)
        ("#### 12 000", "12"),
        ("The answer is 12\u00a0000.", "12"),
        ("The answer is 7.", "7"),
        ("First 3 + 4 = 7, so the answer is $1,234.50.", "1234.5"),
        ("THE ANSWER IS -12", "-12"),
        ("the answer is 5. Then 6 more.", "5"),
        ("Final answer: 12", "12"),
        ("She has 3 apples and then 5 pears, 8 fruits in total.", "8"),  # last-number fallback
        ("16-3-4=9", "9"),  # hyphens between numbers are not signs
        ("x = -2", "-2"),
        ("It grows .5 inches", "0.5"),
        ("#### nothing here, but the answer is 4", "4"),  # marker span without a number falls through
        ("####", None),
        ("", None),
        ("no numbers at all", None),
        ("abc123", None),  # digits glued to a word are not a number
        ("1,2,3", "3"),  # not thousands groups
        ("12,5", "5"),
        # after a marker, digits grouped otherwise than in thousands are no answer (they were read as the first group:
        # "#### 2,5" scored 1 against 2)
        ("#### 2,5", None),
        ("#### 12,34", None),
        ("#### 1,000,00", None),
        ("#### 1.2.3", None),  # (a section's or version's number: it was read as 1.2)
        ("#### 1.2.", "1.2"),
        ("The answer is 1,23,456", None),
        ("#### 1,234, I think", "1234"),
        # the en dash and the small and full-width hyphen-minus are a minus sign (the sign was dropped); a range's dash
        # between numbers and the em dash are not
        ("#### \u20135", "-5"),
        ("The answer is \u2013 3.5", "3.5"),  # (an en dash standing apart after words: a sentence's)
        ("#### \u2013 5", "-5"),  # (after #### or in a box: the answer's sign, as a gold "\u2013 5" reads)
        ("\\boxed{\u2013 5}", "-5"),
        ("#### \uff0d 7", "-7"),
        ("The answer is \ufe63 7", "-7"),
        ("#### \ufe637", "-7"),
        ("#### \uff0d7", "-7"),
        ("3\u20135 apples", "5"),
        ("#### \u2014 5", "5"),
        # an exponent right after the digits (GSM-Hard); not the e of a word, nor one without digits
        ("#### 2.0107e-06", "0.0000020107"),
        ("#### 1e3", "1000"),
        ("#### 1E3", "1000"),
        ("#### -1.5e+2", "-150"),
        ("#### 2.5e\u22122", "0.025"),
        ("#### 4.0e0", "4"),
        ("#### 1,000e3", "1000000"),
        ("#### 2.0107e-06.", "0.0000020107"),
        ("The answer is 1e3.", "1000"),
        ("#### 3 eggs", "3"),
        ("#### 3eggs", "3"),
        ("#### 5e", "5"),
        ("#### 5e-", "5"),
        ("#### 5 e3", "5"),
        ("e.g. 12 apples", "12"),
        ("#### 2e1234", None),  # an exponent longer than a float's is no number (not 2)
        ("3.14.15", "3.14"),
        # the last marker decides: a '#' that is no marker (horse #12, #1) or a heading before "The answer is" was
        # read as the answer; and a marker without a number after it gave the reasoning's last number
        ("That leaves 40-24 = 16 people that think horse #12 will win\nThe answer is 16.", "16"),  # GSM8K test 760
        ("### Step 1: 16-3-4=9 eggs.\n### Step 2: 9*2=18.\nThe answer is 18.", "18"),
        ("The answer is 18. #1 fan", "18"),
        ("<<9*2=18>> #### 17/1", None),
        ("<<16-3-4=9>> <<9*2=18>> #### eighteen dollars", None),
        ("<<16-3-4=9>> <<9*2=18>> ####", None),  # cut off at max_new_tokens
        ("<<9*2=18>> ### 18", "18"),  # Coconut's marker
        ("The answer is 17.\n#### 18", "18"),
        # GSM8K's #### with its number settles the answer: a later "The answer is" comments on it (it was read as 3);
        # not a #### without a number of its own (a level-4 heading, one cut off), nor over a later box or ####
        ("#### 18\nThe answer is reasonable since 3 x 6 = 18.", "18"),
        ("#### 18.\r\nAnswer: 3 x 6", "18"),
        ("#### 1. Compute the eggs\n9*2=18\nThe answer is 18", "18"),  # (a numbered level-4 heading settles nothing)
        ("#### 18 dollars\nThe answer is 20", "20"),  # (more than the number on its line: the last marker, as before)
        ("#### - 5\nthe answer is 5 below zero", "-5"),
        ("#### Step 1: 9*2=18\nThe answer is 18", "18"),
        ("#### Step 1: 9*2=18\nThe answer is 20", "20"),
        ("####\n18\nThe answer is 20", "20"),
        ("#### 18\nThe answer is \\boxed{20}", "20"),
        ("#### 18\nThe answer is 3.\n#### 20", "20"),
        ("### 18\nThe answer is 20", "20"),  # (Coconut's ###, as a numbered markdown heading "### 1. Setup")
        # a later marker with no number after it leaves the answer to the one before it
        ("The answer is 18. I hope this answer is helpful.", "18"),
        ("The answer is 18.\n\n### Explanation\nWe subtract the eggs", "18"),
        ("#### 18\n#### 18\n####", "18"),  # a repeated answer line cut off
        ("The answer is: $\\boxed{18}$\n\n#", "18"),
        # a run of two or more '#' glued to what follows is a marker too (a sampled answer without its space)
        ("####5+37", "5"),
        ("<<2=0-8####<<3*9*4>>", "3"),
        # a markdown heading is no marker: its number is a step's (an answer cut off after the steps has none)
        ("### Step 1: 9*2=18\n### Step 2: 18+2=20\nThe answer is", None),
        ("## Step 1\n...\n## Step 2\n18+2=20\n\n#### ", None),
        ("#### 18\n\n### Explanation\nWe add 9 and 9.", "18"),
        ("### Step 1: 9*2=18\n### Step 2: 18+2=20\n**Final Answer**\n20", "20"),
        # LaTeX's box is a marker (math-tuned models): the number opening it, not a check written after it
        ("9*2 = 18, so \\boxed{18}. Check: 18 - 3 = 15.", "18"),
        ("\\boxed { -1,234.50 }", "-1234.5"),
        ("\\boxed{\\$40}", "40"),
        ("#### 5\nwait, \\boxed{7}", "7"),
        ("\\boxed{\\frac{1}{2}} is 0.5", None),  # not the numerator (nor a number after the box)
        ("The answer is 3. Or \\boxed{x = 4}", "3"),  # a box without a number leaves it to the marker before
        ("The final answer is $\\boxed{\\frac{3}{4}}$.", None),  # ... but not to a number inside that box
        ("#### \\boxed{\\frac{1}{2}}", None),
        ("the final answer is \\boxed{x+1}", None),
        ("\\boxed{1{,}000}", "1000"),  # LaTeX's thousands separator
        ("\\boxed{10,\\!000}", "10000"),  # MATH's (read as 10: a false 1 for a gold of 10)
        ("#### \uff14\uff12", "42"),  # full-width digits (no answer)
        ("#### \uff13\uff0c\uff15", "3"),  # (a full-width comma is a sentence's: not 3,5)
        ("\\boxed{1\\,234}", "1234"),  # a thin space between digit groups (read as 1)
        ("\\boxed{5\\,\\text{cm}}", "5"),  # (a thin space before a unit: no group)
        ("\\boxed{\\text{18}}", "18"),  # a text or bold wrapper, extra braces (they held no answer)
        ("\\boxed{\\textbf{ 18 }}", "18"),
        ("\\boxed{\\mathbf{-18}}", "-18"),
        ("\\boxed{{18}}", "18"),
        ("\\boxed{\\text{x} = 18}", None),  # (a box opening with a word holds no answer: as \\boxed{x = 4})
        # LaTeX's escaped dollar after a minus sign: the sign was dropped (-5 read as 5, a box's answer as none)
        ("The answer is -\\$5.", "-5"),
        ("\\boxed{-\\$1,234}", "-1234"),
        ("9 * \\$2 = \\$18. Answer: - \\$18", "-18"),
        ("The answer is $1,\\!234,\\!567$.", "1234567"),
    ],
)
def test_extract_answer(text: str, expected: str | None) -> None:
    assert extract_answer(text) == expected
    assert is_parseable(text) is (expected is not None)


def test_extract_answer_takes_linear_time() -> None:
    """A completion of many markers (a collapsed policy repeating '#') was searched after each marker in turn:
    20,000 characters took 13 s. (About 0.01 s each now; the bound leaves room for a loaded machine.)"""
    boxes = ("\\boxed{" + "\\text " * 5_000 + "x 5", "\\boxed{" + "\\text{ " * 5_000 + "x 5")  # (what may open a box)
    for text in ("# " * 10_000, "the answer is unknown. " * 1_000, "#### 1 " * 5_000, *boxes):
        t0 = time.perf_counter()
        extract_answer(text)
        assert time.perf_counter() - t0 < 2.0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("40,000", 40000.0),
        ("18", 18.0),
        (" -3.5 ", -3.5),
        ("1.0", 1.0),
        ("$5.", 5.0),
        (".25", 0.25),
        ("+2", 2.0),
        ("Tom is a lempus.", None),
        ("", None),
        ("12 apples", None),
        ("1e3", 1000.0),
        ("2.0107e-06", 2.0107e-06),
        ("-1.5E+2", -150.0),
        ("1e", None),
        ("e3", None),
        ("1e400", None),  # overflows a float
        ("3/4", None),
        ("- 5", -5.0),  # a gold's sign standing apart is its sign (it was no number: kept as text)
        ("\u2212 2.5", -2.5),
        ("-\n5", None),
    ],
)
def test_parse_number(text: str, expected: float | None) -> None:
    assert parse_number(text) == expected


def test_parse_number_overflow_is_none() -> None:
    assert parse_number("9" * 400) is None
    assert normalize_number("9" * 400) == "9" * 400


@pytest.mark.parametrize(
    ("completion", "gold", "expected"),
    [
        ("#### 18", "18", 1.0),
        ("#### 18", 18, 1.0),
        ("#### 18", 18.0, 1.0),
        ("#### 18.00", "18", 1.0),
        ("#### 40000", "40,000", 1.0),
        ("The answer is $40,000.", "40000", 1.0),
        ("#### -3", "-3", 1.0),
        ("#### 3", "-3", 0.0),
        ("#### - 3", "3", 0.0),  # a minus sign standing apart: -3 (it scored 1 for 3)
        ("#### - 3", "-3", 1.0),
        ("#### -3", "- 3", 1.0),
        ("#### 17", "18", 0.0),
        ("#### 18\nThe answer is reasonable since 3 x 6 = 18.", 18, 1.0),  # (GSM8K's #### settles it: it scored 0)
        ("#### 18.5", "18", 0.0),
        ("I don't know", "18", 0.0),
        ("", "18", 0.0),
        # whole-number golds need the exact integer, however large
        ("#### 109199999", "109200000", 0.0),
        ("#### 3431580.5", 3431580.0, 0.0),
        # ProsQA: sentence answers compared as normalised text
        ("#### Tom is a lempus.", "Tom is a lempus.", 1.0),
        ("Tom is a lempus.", "Tom is a lempus.", 1.0),
        ("  tom IS a   lempus ", "Tom is a lempus.", 1.0),
        ("Tom is a terpus.\n#### Tom is a lempus", "Tom is a lempus.", 1.0),
        ("#### Tom is a scrompus.", "Tom is a lempus.", 0.0),
        ("Tom is a terpus. Tom is a lempus.", "Tom is a lempus.", 0.0),
        ("#### 3", "Tom is a lempus.", 0.0),
        # scientific notation in the completion and in the gold (GSM-Hard golds are written "2.0107e-06")
        ("#### 2.0107e-06", "0.0000020107", 1.0),
        ("#### 2.0107e-06", "2.0107", 0.0),
        ("#### 2.0107", "2.0107e-06", 0.0),
        ("#### 0.0000020107", "2.0107e-06", 1.0),
        ("#### 2.0107e-06", "2.0107e-06", 1.0),
        ("#### 1e3", "1000", 1.0),
        ("#### 1000", "1e3", 1.0),
        ("#### 1e3", "100", 0.0),
        ("#### 3 eggs", "3", 1.0),
        # a prediction is written to the decimals of its plain form: "2.01e-06" to 8 (2.0107e-06 rounds to 2.01e-06),
        # "2.011e-06" to 9 (|diff| 3e-10 <= 5e-10); "2.02e-06" and "2.012e-06" are off by more than half a unit
        ("#### 2.01e-06", "2.0107e-06", 1.0),
        ("#### 2.02e-06", "2.0107e-06", 0.0),
        ("#### 2.011e-06", "2.0107e-06", 1.0),
        ("#### 2.012e-06", "2.0107e-06", 0.0),
        # a fraction is not its numerator (nor its denominator); the numbers around it still count
        ("#### 1/2", "1", 0.0),
        ("#### 1/2", "2", 0.0),
        ("#### 1/2", "0.5", 0.0),
        ("<<48/2=24>> #### 24", "24", 1.0),
        ("$5/hour for 8 hours is 40", "40", 1.0),
        # non-finite golds never match
        ("#### 1", float("nan"), 0.0),
        ("#### 1", float("inf"), 0.0),
    ],
)
def test_score(completion: str, gold: str | float | int, expected: float) -> None:
    assert score(completion, gold) == expected


@pytest.mark.parametrize(
    ("completion", "gold", "expected"),
    [
        # GSM-Hard float noise and full-precision answers
        ("#### 3244047.1", 3244047.0999999996, 1.0),
        ("#### 3244047.0999999996", 3244047.0999999996, 1.0),
        ("#### 14053029.67", 14053029.666666666, 1.0),
        ("#### 14053030", 14053029.666666666, 0.0),  # rounded to a whole number: as "2" for 2.33
        ("#### 153957440", 153957439.99999997, 1.0),  # float noise on a whole answer
        # an off-by-one is never float noise (a relative 1e-6 accepted these)
        ("#### 3244048.1", 3244047.0999999996, 0.0),
        ("#### 3244047", 3244047.0999999996, 0.0),
        ("#### 14053030.67", 14053029.666666666, 0.0),
        ("#### 9284017268535.4", 9284017268534.4, 0.0),
        ("#### 9284017268534.4", 9284017268534.4, 1.0),
        ("#### 3", 3.0000000000000004, 1.0),
        # rounded to the written decimals (>= 2) counts; coarser or wrong roundings do not
        ("#### 2.33", 2.3333333333333335, 1.0),
        ("#### 2.3333", 2.3333333333333335, 1.0),
        ("#### 2.333333333", 2.3333333333333335, 1.0),
        ("#### 2.3", 2.3333333333333335, 0.0),
        ("#### 2", 2.3333333333333335, 0.0),
        ("#### 2.34", 2.3333333333333335, 0.0),
        ("#### 2.32", 2.3333333333333335, 0.0),
        ("#### -8.83", -8.8333333333, 1.0),
        ("#### 8.83", -8.8333333333, 0.0),
        ("#### 0.0017", 0.0016791648, 1.0),
        ("#### 2.30", 2.30001, 1.0),  # decimals as written, not after trailing-zero stripping
        ("#### 36.00", 36.0000102016, 1.0),
        ("#### 36", 36.0000102016, 0.0),  # a whole number for a non-integer gold, as "2" for 2.33
        ("#### 0.0000020107", 2.0107e-06, 1.0),
        # no absolute tolerance: zero is not an answer to a tiny nonzero gold
        ("#### 0", 5.158e-07, 0.0),
        ("#### 0.00", 5.158e-07, 0.0),
        ("#### 0.000002", 2.0107e-06, 1.0),  # 2.0107e-06 rounded to 6 decimals
        ("#### 0.000003", 2.0107e-06, 0.0),
        # a gold written with 8 or more decimals is a rounded float (GSM-Hard's file rounds to 10): its exact value, to
        # any precision, matches it (it scored 0 on 35 golds under 0.05); a value that rounds otherwise does not
        ("#### 2.010666990518096e-06", 2.0107e-06, 1.0),
        ("#### 0.00000201067", 2.0107e-06, 1.0),
        ("#### 0.0016791647834367186", 0.0016791648, 1.0),
        ("#### 0.0000020108", 2.0107e-06, 0.0),
        ("#### 0.00000201076", 2.0107e-06, 0.0),  # (0.0000020108 at 10 decimals)
        # a whole-number gold takes a decimal off it by float noise alone (a program's print), exactly at any size
        ("#### 3431579.9999999995", 3431580, 1.0),
        ("#### 3431580.0000000005", 3431580, 1.0),
        ("#### 5.5", 5, 0.0),
        ("#### 4.999", 5, 0.0),
        ("#### 3431579.999", 3431580, 0.0),  # (off by 0.001: not under it, as Decimal(1e-3) slightly over it had it)
        ("#### 109200001", 109200000, 0.0),
        ("#### 12345678901234567890.5", 12345678901234567890, 0.0),  # (equal as floats)
    ],
)
def test_score_gsm_hard_tolerance(completion: str, gold: float, expected: float) -> None:
    assert score(completion, gold) == expected
    assert score(completion, repr(gold)) == expected  # "2.0107e-06" as a string reads as the float does


def test_a_short_gold_is_not_taken_as_rounded() -> None:
    """Only a gold of ROUNDED_GOLD_DECIMALS or more decimals absorbs its own rounding, at the GOLD_ROUNDED_AT-th
    decimal (where GSM-Hard's file rounds; its trailing zeros dropped, 2.392e-06 is 0.0000023920): 2.5 is not 2.54,
    and 0.0000023924 is not 2.392e-06 (it was, at the gold's 9 written decimals)."""
    assert (ROUNDED_GOLD_DECIMALS, GOLD_ROUNDED_AT) == (8, 10)
    assert score("#### 2.54", "2.5") == 0.0 and score("#### 0.00000054", "0.0000005") == 0.0
    assert score("#### 0.0000023924", "2.392e-06") == score("#### 0.0000000545", "5e-08") == 0.0
    assert score("#### 0.00000239200004", "2.392e-06") == score("#### 0.00000005000004", "5e-08") == 1.0
    assert score("#### 0.00000000000001236", "0.0000000000000123") == 0.0  # (16 decimals: rounded at its last)
    assert score("#### 0.00000000000001234", "0.0000000000000123") == 1.0


def test_a_gold_and_its_own_completion_read_a_sign_standing_apart_alike() -> None:
    for sign in "-\u2212\u2013\ufe63\uff0d":
        assert score(f"#### {sign} 5", f"{sign} 5") == 1.0 and score(f"#### {sign} 5", "5") == 0.0


def test_limits_are_compared_exactly_as_decimals() -> None:
    """An error of exactly 0.001 is not under 0.001 (the float difference of 3244047.101 and 3244047.1 is
    0.00099999969..., which passed, as a whole-number gold's Decimal(1e-3) did)."""
    assert not numbers_match("3244047.101", "3244047.1") and not numbers_match("3244047.099", "3244047.1")
    assert not numbers_match("2000000.501", "2000000.5") and not numbers_match("3431579.999", "3431580")
    assert numbers_match("3244047.0999999996", "3244047.1") and numbers_match("2.305", "2.30") is False
    assert numbers_match("2.30", "2.305") and numbers_match("2.31", "2.305")  # (half a unit, either way, inclusive)


# ------------------------------------------------------------------ properties


@given(st.text())
@settings(max_examples=300, deadline=None)
def test_extract_answer_never_raises(text: str) -> None:
    result = extract_answer(text)
    assert result is None or parse_number(result) is not None or len(result) > 300
    assert is_parseable(text) is (result is not None)


def test_a_completion_that_is_not_text_is_a_type_error_not_a_zero() -> None:
    """dgrpo.score(completions, gold) with a list (TRL's batched habit) or None scored 0.0 without a word."""
    import dgrpo

    with pytest.raises(TypeError, match=r"^score: completion_text must be one completion's text, got list \(a batch"):
        dgrpo.score(["#### 42"], "42")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"got NoneType$"):
        score(None, "42")  # type: ignore[arg-type]
    assert dgrpo.score("#### 42", 42) == 1.0


_numberish = st.text(alphabet="0123456789,.$-+#\u2212 eE\n:answerTheis", max_size=40)


@given(
    st.one_of(st.text(), _numberish),
    st.one_of(st.text(max_size=20), _numberish, st.integers(), st.floats(allow_nan=True, allow_infinity=True)),
)
@settings(max_examples=300, deadline=None)
def test_score_never_raises(completion: str, gold: str | float | int) -> None:
    assert score(completion, gold) in (0.0, 1.0)


@st.composite
def written_numbers(draw: st.DrawFn) -> tuple[str, Decimal]:
    """A number written the usual ways: sign, $, thousands commas, decimals, trailing period."""
    whole = draw(st.integers(0, 10**11))
    decimals = draw(st.sampled_from([0, 0, 0, 1, 2, 3]))
    frac = f"{draw(st.integers(0, 10**decimals - 1)):0{decimals}d}" if decimals else ""
    negative = draw(st.booleans())
    text = f"{whole:,}" if draw(st.booleans()) else str(whole)
    if frac:
        text += "." + frac
    if draw(st.booleans()):
        text = "$" + text
    if negative:
        text = "-" + text
    value = Decimal(("-" if negative else "") + str(whole) + ("." + frac if frac else ""))
    return text, value


_TEMPLATES = [
    "#### {}",
    "####{}",
    "#### {}.",
    "#### {} dollars",
    "She buys 3 apples for $2 each, 3 * 2 = <<3*2=6>>6.\n#### {}",
    "The answer is {}",
    "The answer is {}.",
    "First 12 + 30 = 42 and 7 more. The answer is {} in total.",
    "After 12 days, 3 of them pay {}",
    "{}",
]


@given(written_numbers(), st.sampled_from(_TEMPLATES), st.sampled_from(["str", "canonical", "float", "as_written"]))
@settings(max_examples=400, deadline=None)
def test_written_numbers_round_trip(number: tuple[str, Decimal], template: str, gold_kind: str) -> None:
    text, value = number
    gold: str | float
    if gold_kind == "str":
        gold = str(value)
    elif gold_kind == "canonical":
        gold = normalize_number(str(value)) or ""
    elif gold_kind == "float":
        gold = float(value)
    else:
        gold = text
    completion = template.format(text)
    assert score(completion, gold) == 1.0, (completion, gold)
    assert Decimal(extract_answer(completion) or "nan") == value


@given(
    st.floats(min_value=-1e9, max_value=1e9, allow_nan=False).filter(lambda x: not x.is_integer() and abs(x) >= 0.01)
)
@settings(max_examples=300, deadline=None)
def test_float_golds_match_their_two_decimal_rounding(gold: float) -> None:
    assert score(f"#### {gold:.2f}", gold) == 1.0
    assert score(f"#### {gold:.4f}", gold) == 1.0
    assert score(f"#### {gold!r}", gold) == 1.0
    # one unit off in the last written decimal is wrong, and so is one unit off in the integer part
    assert score(f"#### {gold + 0.02:.2f}", gold) == 0.0
    assert score(f"#### {gold + 1:.2f}", gold) == 0.0


def _numeric_golds() -> list[object]:
    """12 as NumPy scalars, a 0-d array, a Decimal and a 0-d tensor (a pandas column, a tensor of labels)."""
    import numpy as np
    import torch

    return [np.int64(12), np.int32(12), np.float32(12), np.float64(12.0), np.array(12), Decimal("12"), torch.tensor(12)]


@pytest.mark.parametrize("gold", _numeric_golds(), ids=repr)
def test_numeric_golds_of_any_number_type_are_read_as_their_value(gold: object) -> None:
    assert score("#### 12", gold) == 1.0
    assert score("#### 12.5", gold) == 0.0  # a whole-number gold, as int 12 and float 12.0 are
    assert Record("q", [], gold).answer == "12"  # type: ignore[arg-type]  # stored as the loaders store a numeric column


def test_narrow_float_golds_are_the_shortest_decimal_of_their_type() -> None:
    """A float32 2.3 is 2.299999952316284 as a float64: the gold was that, and '#### 2.3' scored 0."""
    import numpy as np
    import torch

    for gold in (np.float32(2.3), np.array(2.3, dtype=np.float32), torch.tensor(2.3), np.float16(2.3)):
        assert Record("q", [], gold).answer == "2.3"  # type: ignore[arg-type]
        assert score("#### 2.3", gold) == 1.0
    assert Record("q", [], torch.tensor(2.3, dtype=torch.bfloat16)).answer == "2.3"  # type: ignore[arg-type]  # (stored: 2.296875)
    assert Record("q", [], np.float32(1e-7)).answer == "0.0000001"
    assert format_number(np.float32(float("nan"))) is None  # no number, as a float64 NaN
    # a whole number is that integer where the type holds every integer; past that, the round number it was
    # written as, as NumPy prints it (reviews: 7e10 became 70000001024, float16's 50000 49984; 123456 must stay)
    for gold, text in (
        (np.float32(123456), "123456"),
        (np.float32(16777215), "16777215"),
        (np.float32(7e10), "70000000000"),
        (np.float16(50000), "50000"),
        (np.float16(2000), "2000"),
        (torch.tensor(1e6, dtype=torch.bfloat16), "1000000"),
    ):
        assert Record("q", [], gold).answer == text and score(f"#### {text}", gold) == 1.0, gold  # type: ignore[arg-type]
    assert Record("q", [], torch.tensor(2.3, dtype=torch.float64)).answer == "2.3"  # type: ignore[arg-type]  # float64: its own repr


def test_non_integer_number_golds_keep_the_float_rule() -> None:
    import numpy as np
    import torch

    for gold in (np.float64(2.3333333333333335), Decimal("2.3333333333333335"), torch.tensor(2.5, dtype=torch.float64)):
        assert score(f"#### {float(gold):.2f}", gold) == 1.0
        assert score("#### 2", gold) == 0.0
    assert Record("q", [], np.float64(2.5)).answer == Record("q", [], 2.5).answer == "2.5"  # type: ignore[arg-type]


def test_booleans_and_arrays_are_no_numeric_gold() -> None:
    import numpy as np
    import torch

    for gold in (True, np.bool_(True), torch.tensor(True), np.array([12]), torch.tensor([12]), Decimal("NaN")):
        assert score("#### 1", gold) == 0.0 and score("#### 12", gold) == 0.0
    for answer in (True, np.bool_(False), float("nan"), None):
        with pytest.raises(DataError, match=r"^answer must be text or a finite number, got"):
            Record("q", [], answer)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "completion, gold, want",
    [
        ("#### C#", "C#", 1.0),
        ("... so ### C# .", "C#", 1.0),  # Coconut's marker, a trailing period
        ("#### #1", "#1", 1.0),
        ("#### C##", "C##", 1.0),
        ("#### C", "C#", 0.0),
        ("#### F# minor", "C#", 0.0),
        ("C#", "C#", 1.0),  # no marker: the whole text, as for any text gold
        ("#### C", "C", 1.0),  # a gold without '#' reads after the last '#' as before
        ("#### C # B", "B", 1.0),
    ],
)
def test_a_text_gold_holding_a_hash_is_read_after_the_standalone_marker(completion, gold, want):
    rec = [Record(question="q", steps=[], answer=gold)]
    assert exact([completion], rec) == [want]
    assert score(completion, gold) == want  # numeric's text branch reads the same


def test_the_early_reward_check_leaves_a_plugins_own_warnings_to_the_user(tmp_path):
    """dgrpo grpo builds the reward before the data and the model (check_reward): a plug-in file runs once per
    process, so its warnings at import were lost when the check silenced every warning."""
    import warnings
    from types import SimpleNamespace

    from dgrpo.eval.scoring import check_reward

    (tmp_path / "noisy.py").write_text(
        "import warnings\nwarnings.warn('noisy: deprecated reward')\n"
        "def f(completions, records):\n    return [0.0 for _ in completions]\n"
    )
    grpo = SimpleNamespace(reward=f"{tmp_path / 'noisy.py'}:f", rewards=[{"fn": "numeric"}], filter_reward="")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_reward(grpo, "numeric")
    said = [str(w.message) for w in caught]
    assert said == [], said  # (grpo.rewards replaces grpo.reward: the file is not read, its warning is the trainer's)
    grpo.rewards = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_reward(grpo, "numeric")
    assert [str(w.message) for w in caught] == ["noisy: deprecated reward"]
