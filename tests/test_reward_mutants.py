"""Gaps found by mutation testing of dgrpo.reward: how a model writes a number (exponents, signs), checked against
values worked out by hand."""

from dgrpo.reward import extract_answer, normalize_number, score


def test_an_exponent_of_three_digits_is_read_and_one_of_four_is_no_number():
    """A power of ten of up to three digits is a float's range (``1e100``, ``2.5E-105``): read in full, not cut to
    ``1e10`` and dropped; one of four (``2e1234``) is no number at all, not its ``2``."""
    assert extract_answer("#### 1e100") == "1" + "0" * 100
    assert extract_answer("The answer is 2.5E-105.") == "0." + "0" * 104 + "25"
    assert score("#### 1e100", "1" + "0" * 100) == 1.0
    assert extract_answer("#### 2e1234") is None


def test_two_minus_signs_around_the_dollar_cancel_out():
    """The signs before and after a ``$`` multiply: ``-$-5`` is 5, ``-$5`` and ``$-5`` are -5 (one sign), and a minus
    standing apart before a signed number flips it again (``#### - -5``: 5)."""
    assert [normalize_number(t) for t in ("-$-5", "-$5", "$-5", "+$-5")] == ["5", "-5", "-5", "-5"]
    assert extract_answer("#### - -5") == "5"
    assert score("#### -$-5", 5) == 1.0 and score("#### -$-5", -5) == 0.0


def test_a_latex_thin_space_joins_thousands_groups_only():
    """``\\,`` between digit groups of three is a thousands separator (``1\\,234\\,567``: 1234567); before any other
    run of digits it joins nothing, as a plain space joins nothing (``#### 12 34`` answers 12): ``#### 12\\,34``
    answers 12 too, not 1234 and not None."""
    assert extract_answer("\\boxed{1\\,234\\,567}") == "1234567"
    assert extract_answer("#### 12\\,34") == extract_answer("#### 12 34") == "12"
    assert extract_answer("#### 1\\,2345") == "1"


def test_a_box_with_a_space_before_its_brace_is_still_the_answer_marker():
    """``\\boxed {18}`` (LaTeX allows the space) is the last answer marker: its 18 wins over an earlier "The answer
    is 3", and over the reasoning's last number after it."""
    assert extract_answer("The answer is 3. So \\boxed {18}") == "18"
    assert extract_answer("\\boxed {18}, as 9 * 2") == "18"


def test_a_box_may_open_with_a_dollar_before_a_wrapped_or_spaced_number():
    """A box opened by ``$`` or ``\\$`` then a ``\\mathbf{`` / ``\\text{`` wrapper or two spaces still holds its number
    (``\\boxed{$\\mathbf{18}$}``: 18, not no answer)."""
    assert extract_answer("\\boxed{$\\mathbf{18}$}") == "18"
    assert extract_answer("The answer is 3. \\boxed{\\$\\text{18}}") == "18"
    assert extract_answer("\\boxed{$  18$}") == "18"


def test_float_noise_is_relative_to_the_larger_of_prediction_and_gold():
    """The relative 1e-9 on a non-integer gold is taken of the larger magnitude: 0.4999999995 is off 0.5 by 5e-10,
    exactly 1e-9 of the gold, a hit; 0.4999999994 (6e-10 off) is a miss (both too fine for a half-unit rounding)."""
    assert score("#### 0.4999999995", "0.5") == 1.0
    assert score("#### 0.4999999994", "0.5") == 0.0


def test_a_decimal_with_an_overlong_exponent_is_no_number_not_its_whole_part():
    """``1.5e1234`` (an exponent past a float's range) is no number at all: not its ``1`` (the text's last number
    without a marker), nor its ``12`` in ``12.75e9999``."""
    assert extract_answer("x = 1.5e1234") is None
    assert extract_answer("12.75e9999") is None
