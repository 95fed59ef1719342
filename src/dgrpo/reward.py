"""The verifier: extract a model's final answer from its text and score it 1.0/0.0 against the gold answer."""

from __future__ import annotations

import bisect
import math
import numbers
import re
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import Any, NamedTuple

__all__ = [
    "REL_TOL",
    "GOLD_ROUNDED_AT",
    "ROUNDED_GOLD_DECIMALS",
    "answer_decimals",
    "extract_answer",
    "final_answer_text",
    "format_number",
    "is_parseable",
    "normalize_number",
    "normalize_text",
    "numbers_agree",
    "numbers_match",
    "parse_number",
    "score",
]

#: Float noise accepted on a non-integer gold (GSM-Hard's ``3244047.0999999996`` for 3244047.1): relative, and never
#: as much as ABS_NOISE_LIMIT (a relative 1e-6 accepted 3244048.1: an off-by-one on 170 of GSM-Hard's 303 such golds).
REL_TOL = 1e-9
ABS_NOISE_LIMIT = 1e-3
#: A non-integer gold written with this many decimals or more is a float rounded at the GOLD_ROUNDED_AT-th (GSM-Hard's
#: file rounds to 10: ``0.0000020107``; its trailing zeros dropped, ``0.00009193``): a prediction that rounds to it
#: there is its value (the exact ``2.010666990518096e-06`` scored 0 on 35 of GSM-Hard's golds, under 0.05, where
#: REL_TOL is finer than the rounding). A gold of more decimals is taken as rounded at its last.
ROUNDED_GOLD_DECIMALS = 8
GOLD_ROUNDED_AT = 10

# ASCII hyphen-minus, the Unicode minus sign, the en dash and the small and full-width hyphen-minus (``–5``: a model's
# minus; the sign was dropped, so ``#### –5`` scored 1 against 5); not the em dash, a sentence's (``— 5 of them``)
_MINUS_SIGNS = "-\u2212\ufe63\uff0d"
_EN_DASH = "\u2013"
_MINUS = _MINUS_SIGNS + _EN_DASH
_SIGN = rf"[{_MINUS}+]"  # (the hyphen first: no range)
# The digits of one number: ``40,000`` (groups of exactly three after a comma), ``1234``, ``3.50``, ``.5``.
_DIGITS = r"(?:[0-9]{1,3}(?:,[0-9]{3}(?![0-9]))+|[0-9]+)(?:\.[0-9]+)?|\.[0-9]+"
# A power of ten written right after the digits (GSM-Hard's ``2.0107e-06``, ``1E3``): e/E, a sign, 1-3 digits (a
# float's range). ``3 eggs``, ``e.g.`` or ``5e`` hold no exponent; a number with a longer one (``2e1234``) is no
# number at all (not 2): nothing may follow a number's end that would continue it.
_EXPONENT = rf"[eE]{_SIGN}?[0-9]{{1,3}}"
_END = rf"(?![0-9]|\.?[0-9]*[eE]{_SIGN}?[0-9]|/[0-9])"
# An optional sign and ``$`` either side of each other: ``-3``, ``+3``, ``$5``, ``-$5``, ``$-5``, ``$ 5``; the ``$`` may
# be LaTeX's ``\$`` (``-\$5``, as markdown and LaTeX answers write money: the sign before it was dropped, -5 read as 5).
_NUMBER = rf"(?P<s1>{_SIGN})?(?:\\?\$\s?)?(?P<s2>{_SIGN})?(?P<num>(?:{_DIGITS})(?:{_EXPONENT})?){_END}"
# In running text a number must not be glued to a preceding word, digit, '.', closing bracket or '/', so
# ``16-3-4=9`` reads as 16, 3, 4, 9 (not -3, -4) and ``abc123`` holds no number; nor is either side of a fraction
# (``1/2``, ``48/2``) a number: ``#### 1/2`` was read as 1.
_NUMBER_IN_TEXT = re.compile(rf"(?<![0-9A-Za-z_.)\]/]){_NUMBER}")
# A gold answer string is exactly one number, with optional whitespace and trailing period; a sign may stand apart
# from it (``- 5``: -5, as after an answer marker).
_NUMBER_ALONE = re.compile(rf"\s*(?:(?P<s0>{_SIGN})[ \t]+)?{_NUMBER}\.?\s*")
# A minus sign standing apart between an answer marker and its number (``#### - 5``, ``The answer is - 5``,
# ``\boxed{- 5}``, ``The answer is: - 5``, ``**Answer:** - 5``, ``$ - 5$``): the answer is negative. On the
# marker's line only: a list's dash on the next line is no sign. A minus before a parenthesis is the number's too
# (``#### -(5)``, ``\boxed{-(5)}``: they read 5 and no answer).
# (after ``is:``, ``**Answer:**``, a math ``$``; a minus or hyphen-minus sign; an en dash only after ``####`` or in a
# box: after "The answer is", ``– 42`` is a sentence's dash)
_APART = r"(?:[ \t]+|[ \t]*\([ \t]*)"
_LONE_MINUS = re.compile(rf"[ \t:*$]*[{_MINUS_SIGNS}]{_APART}")
_LONE_MINUS_OR_DASH = re.compile(rf"[ \t:*$]*[{_MINUS}]{_APART}")
_NOISE_LIMIT = Decimal(str(ABS_NOISE_LIMIT))  # (exactly 0.001: Decimal(1e-3) is 0.0010000000000000000208...)
_REL_TOL = Decimal(str(REL_TOL))
#: a comma or a period and a digit right after a number: the number's digits go on in groups not of three (``2,5``,
#: ``12,34``, ``1,000,00``) or it is a section's or a version's number (``1.2.3``), so the number read is a part of
#: what was written
_BAD_GROUP = re.compile(r"[,.][0-9]")
#: "The answer is" / "answer:", an answer marker (the choice scorer reads its letter after it too)
ANSWER_IS = re.compile(r"answer\s*(?:is\b|:)", re.IGNORECASE)
#: LaTeX's thousands separators, read as a comma: ``1{,}000``, MATH's ``10,\!000`` and a thin space between digit
#: groups, ``1\,234`` (a math-tuned model's ``\boxed{10,\!000}`` was read as 10, ``\boxed{1\,234}`` as 1)
_LATEX_COMMA = re.compile(r"\{,\}|,\\!|(?<=[0-9])\\,(?=[0-9]{3}(?![0-9]))")
#: full-width digits as ASCII ones (``#### ４`` was no answer, as a model writing Chinese or Japanese may answer);
#: not the full-width comma or period, a sentence's there
_FULL_WIDTH_DIGITS = str.maketrans({chr(0xFF10 + d): str(d) for d in range(10)})
#: what may open a box before its number: spaces, ``$`` or ``\$``, braces and a text or bold wrapper
#: (``\boxed{\text{18}}``, ``\boxed{\mathbf{18}}``, ``\boxed{{18}}``: they held no answer)
_BOX_OPENING = re.compile(r"(?:\s|\\?\$|\{|\\(?:textbf|text|mathbf|mathrm|bf|displaystyle)(?![A-Za-z]))*")


def _canonical(match: re.Match[str], negated: bool = False) -> str:
    """The normalised string of a matched number: no commas/``$``/``+``/exponent, no padding zeros ("-3.5", "40000",
    "0.0000020107" for ``2.0107e-06``); ``negated``: a minus sign stood apart before it (:class:`_Answer`)."""
    signs = "".join(match.groupdict().get(g) or "" for g in ("s0", "s1", "s2"))
    negative = (sum(ch in _MINUS for ch in signs) + negated) % 2 == 1
    mantissa, exponent = _split_exponent(match.group("num"))
    digits = format(Decimal(f"{mantissa}e{exponent}"), "f") if exponent else mantissa
    whole, _, frac = digits.partition(".")
    whole = whole.lstrip("0") or "0"
    frac = frac.rstrip("0")
    out = whole + ("." + frac if frac else "")
    if out == "0":
        negative = False
    return ("-" if negative else "") + out


def _split_exponent(num: str) -> tuple[str, int]:
    """(digits without commas, power of ten) of a matched number: ``"2.0107e-06"`` -> ``("2.0107", -6)``,
    ``"40,000"`` -> ``("40000", 0)``."""
    mantissa, _, exponent = num.replace(",", "").replace("E", "e").partition("e")
    return mantissa, int(_ascii_minus(exponent)) if exponent else 0


def _ascii_minus(text: str) -> str:
    return "".join("-" if ch in _MINUS else ch for ch in text)


def _written_decimals(num: str) -> int:
    """The decimals a matched number is written to, in plain notation: ``"2.30"`` 2, ``"2.0107e-06"`` 10, ``"1.5e3"``
    0 (the precision :func:`numbers_match` credits)."""
    mantissa, exponent = _split_exponent(num)
    return max(len(mantissa.partition(".")[2]) - exponent, 0)


#: a run of '#' standing alone (``#### 42``, Coconut's ``### 42``; not the ``#`` of ``horse #12`` or ``C#``)
_MARKER = re.compile(r"(?:^|(?<=\s))#+(?=\s|$)")
#: LaTeX's box around a final answer (``\boxed{18}``, as math-tuned models such as Qwen2.5-Math write it)
_BOXED = re.compile(r"\\boxed\s*\{")
#: the answer markers: a standalone run of '#', any run of two or more (``####42``, ``8####<<``), "The answer is",
#: ``\boxed{``
_ANSWER_MARKER = re.compile(rf"{_MARKER.pattern}|#{{2,}}|{ANSWER_IS.pattern}|{_BOXED.pattern}", re.IGNORECASE)
#: a markdown heading (``### Step 2: ...``, ``## Explanation``): one to three '#' opening a line, then a word; no
#: answer marker (the number after it is a step's, not the answer)
_HEADING = re.compile(r"(?:^|(?<=\n))[ \t]*(#{1,3})[ \t]+[^\W\d_]")
#: GSM8K's answer marker, a run of four or more '#' (``#### 18``, ``####18``): with its number right after it, the
#: rest of its line, it is the answer whatever "The answer is" / "answer:" comes later (a comment on it: ``#### 18\nThe
#: answer is reasonable since 3 x 6 = 18.`` was read as 3)
_GSM8K_MARKER = re.compile(r"#{4,}")
_LINE_SPACE = re.compile(r"[ \t]*")
#: what may follow a settling ``#### N`` on its line: a period and spaces (``#### 1. Compute the eggs`` is a heading)
_LINE_END = re.compile(r"[ \t.]*(?:\r?\n|$)")


class _Answer(NamedTuple):
    """The final-answer number of a completion: its match, and whether a minus sign stood apart between the answer
    marker and it (``#### - 5``: -5; it was read as 5)."""

    match: re.Match[str]
    negated: bool = False

    def canonical(self) -> str:
        """The answer's normalised number string."""
        return _canonical(self.match, self.negated)


def _find_answer(text: str) -> _Answer | None:
    """The final-answer number (see :func:`extract_answer`), or None. One pass over the text (a completion of 20,000
    ``#`` took 13 s searching after each marker in turn)."""
    if not isinstance(text, str):
        return None
    text = _LATEX_COMMA.sub(",", text.translate(_FULL_WIDTH_DIGITS))
    numbers = list(_NUMBER_IN_TEXT.finditer(text))
    headings = {m.start(1) for m in _HEADING.finditer(text)}
    markers = [m for m in _ANSWER_MARKER.finditer(text) if m.start() not in headings]
    if not markers:
        return _Answer(numbers[-1]) if numbers else None
    starts = [m.start() for m in numbers]
    settled = _first_settled_answer(text, markers, numbers, starts)
    before = len(text)  # an answer starts before this: a box with no number opening it (\frac{3}{4}, x + 1) holds none
    for marker in reversed(markers):  # the last marker with a number after it ("... this answer is right" has none)
        if settled is not None and marker.start() > settled and ANSWER_IS.match(marker.group()):
            continue  # (prose after GSM8K's ``#### 18``: a comment on its answer)
        i = bisect.bisect_left(starts, marker.end())
        boxed = marker.group().startswith("\\")
        if i < len(numbers) and starts[i] < before:
            gap = text[marker.end() : starts[i]]
            lone = _LONE_MINUS if ANSWER_IS.match(marker.group()) else _LONE_MINUS_OR_DASH
            negated = lone.fullmatch(gap) is not None
            if negated or not boxed or _BOX_OPENING.fullmatch(gap):  # (a box: its number first)
                if _BAD_GROUP.match(text, numbers[i].end()):
                    return None  # (``#### 2,5``: 2.5 or 25, not 2; ``#### 1.2.3``: not 1.2)
                return _Answer(numbers[i], negated)
        if boxed:
            before = marker.start()
    return None  # markers, none followed by a number: no answer (not a number of the reasoning before them)


def _first_settled_answer(
    text: str, markers: list[re.Match[str]], numbers: list[re.Match[str]], starts: list[int]
) -> int | None:
    """Where the first GSM8K marker (:data:`_GSM8K_MARKER`) followed on its line by a number, with nothing but spaces
    or a sign standing apart between them and nothing but a period after it (``#### 18``, ``#### - 5``, ``#### 18.``;
    not ``#### Step 1`` nor the numbered heading ``#### 1. Compute``), starts; None if none."""
    for marker in markers:
        if not _GSM8K_MARKER.fullmatch(marker.group()):
            continue
        i = bisect.bisect_left(starts, marker.end())
        if i < len(numbers):
            span = (marker.end(), starts[i])  # (matched in place: no copy of a long gap per marker)
            apart = _LINE_SPACE.fullmatch(text, *span) or _LONE_MINUS_OR_DASH.fullmatch(text, *span)
            if apart and _LINE_END.match(text, numbers[i].end()):
                return marker.start()
    return None


def extract_answer(text: str) -> str | None:
    """The predicted final answer of a completion, as a normalised number string, or None.

    The answer is the first number after the completion's last answer marker that has a number after it: a run of
    ``#`` standing alone or of two or more (GSM8K's ``#### 42``, Coconut's ``### 42``, ``####42``; not the ``#`` of
    ``horse #12``, nor a markdown heading such as ``### Step 2: ...``), "The answer is" / "answer:"
    (case-insensitive) or ``\\boxed{`` (the number that opens the box, inside a ``\\text{``, ``\\mathbf{`` or brace
    if any; ``\\boxed{\\frac{1}{2}}`` has none); None
    when no marker has a number after it (``#### 1/2``, ``#### eighteen``, an answer cut off after ``####``: a number
    of the reasoning before the marker is not the answer; ``#### 2,5``, ``#### 12,34``: digits grouped otherwise than
    in thousands, which were read as 2 and 12; ``#### 1.2.3``, which was read as 1.2). A minus sign standing apart
    between the marker and the number, on its line, or before a parenthesis that opens it, is the answer's
    (``#### - 5`` and ``#### -(5)`` -> ``"-5"``; between numbers, ``20 - 5``, it is a subtraction's).
    GSM8K's ``####`` (four or more ``#``) with its number right after it, the rest of its line, settles the answer:
    an "The answer is" / "answer:" after it is a comment and is passed over (``"#### 18\nThe answer is reasonable
    since 3 x 6 = 18."`` -> ``"18"``, not 3); a later ``####`` or ``\\boxed{`` with a number still wins, and so does a
    later "The answer is" after a ``####`` with no number of its own (``#### Step 1: ...``, ``####`` cut off) or with
    more than a number on its line (``#### 1. Compute the eggs``, a numbered heading).
    Nothing after the marker is evaluated, and a space joins no digits: the answer is the number right after the
    marker, so ``"#### 9*2 = 18"`` and ``"The answer is 9*2 = 18."`` answer ``"9"`` (an expression then its value),
    and ``"#### 12 000"`` (a space or no-break space between thousands) answers ``"12"``; without a marker, the value
    is the text's last number (``"9*2 = 18"`` answers ``"18"``).
    Without any marker, the last number of the text. Thousands commas, ``$``, signs, decimals
    (``3.50``, ``.5``), an exponent written right after the digits (``2.0107e-06``, ``1E3``; not the ``e`` of
    ``3 eggs``) and a trailing period are handled; a fraction (``1/2``) is not read as a number (nor as its
    numerator):
    ``"#### $40,000."`` -> ``"40000"``, ``"The answer is -3.50"`` -> ``"-3.5"``, ``"#### 1e3"`` -> ``"1000"``,
    ``"### Step 1: 9*2=18.\nThe answer is 18."`` -> ``"18"``. Never raises for a ``str``; never evaluates the text.
    """
    found = _find_answer(text)
    return found.canonical() if found is not None else None


def answer_decimals(text: str) -> int:
    """The decimals a completion's final answer (:func:`extract_answer`) is written to, in plain notation
    (``#### 36.00``: 2, which its normalised ``"36"`` drops; ``#### 2.01e-06``: 8; 0 without an answer): the precision
    :func:`numbers_match` credits it with."""
    found = _find_answer(text)
    return _written_decimals(found.match.group("num")) if found is not None else 0


def is_parseable(completion_text: str) -> bool:
    """Whether :func:`extract_answer` finds a number in the completion (eval counts the ones it doesn't)."""
    return extract_answer(completion_text) is not None


def normalize_number(text: str) -> str | None:
    """The normalised number string of a text that is exactly one number (``" $40,000. "`` -> ``"40000"``, ``"- 5"``
    -> ``"-5"``), or None."""
    if not isinstance(text, str):
        return None
    m = _NUMBER_ALONE.fullmatch(text.translate(_FULL_WIDTH_DIGITS))
    return _canonical(m) if m else None


def parse_number(text: str) -> float | None:
    """A gold answer string as a float (``"40,000"`` -> 40000.0, ``"-3.5"``, ``"1.0"``, ``"$5."``, ``"1e3"``), or None.

    The whole string must be one number (sentences such as ProsQA's ``"Tom is a lempus."`` give None);
    None too when the value overflows a float.
    """
    canon = normalize_number(text)
    if canon is None:
        return None
    value = float(canon)
    return value if math.isfinite(value) else None


def _plain_number(value: Any) -> int | float | Decimal | None:
    """A number as a Python ``int``, ``float`` or ``Decimal``: NumPy scalars (``np.int64``, ``np.float32``) and 0-d
    arrays or tensors (through ``.item()``) too; None for anything else, booleans included. A float narrower than
    float64 (a float32 column of a Parquet file) is the shortest decimal that reads back as the same value in its own
    type (:func:`narrow_number`: ``np.float32(2.3)`` -> 2.3, not float64's 2.299999952316284)."""
    if isinstance(value, (str, bool)):
        return None
    narrow = _narrow_float_type(value)
    if not isinstance(value, numbers.Number) and callable(getattr(value, "item", None)):
        if tuple(getattr(value, "shape", (None,))) != ():  # an array or tensor of more than one value
            return None
        try:
            value = value.item()
        except (TypeError, ValueError, RuntimeError):
            return None
    if narrow is not None and isinstance(value, numbers.Real) and math.isfinite(float(value)):
        return narrow_number(float(value), narrow)
    if isinstance(value, bool) or not isinstance(value, numbers.Number):
        return None
    if isinstance(value, Decimal):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    return None  # a complex number


def _narrow_float_type(value: Any) -> Callable[[float], float] | None:
    """For a NumPy or torch float of fewer than 64 bits (float32, float16, bfloat16), a function that rounds a Python
    float to that type and back; None for anything else."""
    dtype = getattr(value, "dtype", None)
    if dtype is None or getattr(dtype, "itemsize", 8) >= 8:
        return None
    if callable(getattr(value, "new_tensor", None)) and getattr(dtype, "is_floating_point", False):  # torch
        return lambda x: float(value.new_tensor(x).item())
    if getattr(dtype, "kind", "") == "f" and callable(getattr(dtype, "type", None)):  # NumPy
        return numpy_rounder(dtype.type)
    return None


def numpy_rounder(to_type: Callable[[float], Any]) -> Callable[[float], float]:
    """A function that rounds a Python float to the NumPy float type ``to_type`` (``np.float32``) and back."""
    import numpy as np

    def rounded(x: float) -> float:
        with np.errstate(over="ignore"):  # (a decimal past the type's range: inf, not that one)
            return float(to_type(x))

    return rounded


def narrow_number(value: float, narrow: Callable[[float], float]) -> int | Decimal:
    """A value of a float type narrower than float64 (``narrow`` rounds a Python float to that type and back) as the
    number it was most likely written as: an integer where the type holds every integer (float32 up to 2^24), else
    the shortest decimal that reads back as the same value in that type, as NumPy prints it (float32's 2.3, not
    2.299999952316284; float32's 7e10, not the 70000001024 it holds; float16's 50000, not 49984)."""
    if value.is_integer() and narrow(value + 1) != value and narrow(value - 1) != value:
        return int(value)
    return _shortest_decimal(value, narrow)


def _shortest_decimal(value: float, narrow: Callable[[float], float]) -> Decimal:
    """The decimal of fewest significant digits that ``narrow`` rounds to ``value`` (a value of that type)."""
    for digits in range(1, 18):
        text = f"{value:.{digits}g}"
        if narrow(float(text)) == value:
            return Decimal(text)
    return Decimal(repr(value))


def format_number(value: Any) -> str | None:
    """A number's normalised number string (``12``, ``np.int64(12)``, ``12.0`` and ``Decimal("12.00")`` -> ``"12"``;
    ``2.0107e-06`` -> ``"0.0000020107"``), or None for a non-finite number, a boolean or no number at all."""
    number = _plain_number(value)
    if isinstance(number, int):
        try:
            return str(number)
        except ValueError:  # more digits than int->str conversion allows
            return None
    if isinstance(number, float):
        if not math.isfinite(number):
            return None
        return normalize_number(format(Decimal(repr(number)), "f"))
    if isinstance(number, Decimal) and number.is_finite() and abs(number.adjusted()) < 4300:  # (as int->str allows)
        return normalize_number(format(number, "f"))
    return None


def _gold_canonical(gold: Any) -> str | None:
    """A numeric gold's normalised number string; None for a non-numeric or non-finite gold."""
    if isinstance(gold, str):
        return normalize_number(gold)
    return format_number(gold)


def numbers_match(pred: str, gold: str, decimals: int | None = None) -> bool:
    """Whether a predicted number matches the gold, both normalised number strings (rule: :func:`score`).

    ``decimals`` is how many decimals the prediction was written with (``"2.30"``: 2); by default
    those of ``pred``.
    """
    try:
        p, g = Decimal(pred), Decimal(gold)
    except (InvalidOperation, ValueError):
        return False
    if p == g:
        return True
    if "." not in gold:  # whole-number gold: the integer, or a decimal off it by float noise alone (exactly: no
        # float rounding at any size), as a program prints it (3431579.9999999995 for 3431580)
        off = abs(p - g)
        return "." in pred and off <= _REL_TOL * max(abs(p), abs(g)) and off < _NOISE_LIMIT
    if not (p.is_finite() and g.is_finite()):
        return False
    off = abs(p - g)  # (exactly, as decimals: no float rounding decides a limit)
    if off <= _REL_TOL * max(abs(p), abs(g)) and off < _NOISE_LIMIT:
        return True
    gold_decimals = len(gold.partition(".")[2])
    if gold_decimals >= ROUNDED_GOLD_DECIMALS and off <= _half_unit(max(gold_decimals, GOLD_ROUNDED_AT)):
        return True  # (the gold is the prediction rounded where the file rounded it)
    if decimals is None:
        decimals = len(pred.partition(".")[2])
    return decimals >= 2 and p != 0 and off <= _half_unit(decimals)


def _half_unit(decimals: int) -> Decimal:
    """Half a unit of the ``decimals``-th decimal: ``0.005`` for 2."""
    return Decimal(5).scaleb(-decimals - 1)


def numbers_agree(a: str, b: str) -> bool:
    """Whether two answers, normalised number strings, are one answer as the verifier compares them: either matches
    the other taken as the gold (:func:`numbers_match`: ``"2.33"`` and ``"2.333"`` agree, ``"2.3"`` and ``"2.33"``
    do not, nor ``"18"`` and ``"18.5"``). A majority vote groups answers by it (``evaluate_mc_vote``)."""
    return a == b or numbers_match(a, b) or numbers_match(b, a)


def final_answer_text(completion: str, gold: Any = None) -> str:
    """The answer part of a completion: after its last ``#`` (dgrpo's ``#### x``, Coconut's ``### x``, as Coconut's
    ``split("#")[-1]`` reads it), the whole text when it has none. For a text ``gold`` that itself holds a ``#``
    (``C#``, ``#1``) the answer is what follows the last marker, a run of ``#`` standing alone between spaces
    (``#### C#`` answers ``C#``), else the whole text."""
    if isinstance(gold, str) and "#" in gold:
        ends = [m.end() for m in _MARKER.finditer(completion)]
        return completion[ends[-1] :] if ends else completion
    return completion.rpartition("#")[2]


#: spaces between a digit and a symbol (a character neither a letter, a digit nor a space: ``%``, ``€``, ``°``,
#: ``,``, ``(``): ``50 %`` is ``50%``, ``€ 5`` is ``€5``, ``(3, 4)`` is ``(3,4)``; a space between two digits
#: (``1 000``) or a digit and a letter (``12 kg``) stays
_SPACE_AT_DIGIT = re.compile(r"(?<=[0-9])\s+(?=[^\w\s])|(?<=[^\w\s])\s+(?=[0-9])")


def normalize_text(text: str) -> str:
    """Text answers compared case- and spacing-blind: stripped, lower-cased, spaces collapsed, no trailing period,
    and no space between a digit and a symbol (:data:`_SPACE_AT_DIGIT`: ``"#### 50 %"`` answers a ``50%`` gold; it
    was ``"50 %"``, not the gold's text)."""
    return _SPACE_AT_DIGIT.sub("", " ".join(text.split())).lower().rstrip(".").strip()


def score(completion_text: str, gold_answer: Any) -> float:
    """1.0 when the completion's final answer equals the gold answer, else 0.0 (unparseable output scores 0.0).

    Numeric gold (a number: ``int``, ``float``, ``Decimal``, a NumPy scalar, a 0-d array or tensor; or a string that
    is one number such as ``"40,000"``; a boolean is neither and scores 0.0): the number from
    :func:`extract_answer` is compared exactly as decimals, and

    * a whole-number gold (all of GSM8K, SVAMP, MultiArith; most of GSM-Hard) needs that integer, or a decimal off
      it by float noise alone (a relative ``1e-9``, under ``0.001``: a program's ``3431579.9999999995`` for
      ``3431580``): a tolerance never turns an off-by-one on ``109200000`` or a ``5.5`` for ``5`` into a hit;
    * a non-integer gold (GSM-Hard, e.g. ``2.3333333333333335``, ``3244047.0999999996``) also accepts
      a prediction within float noise (a relative ``1e-9``, and under ``0.001``), or a nonzero
      prediction written with ``d >= 2`` decimals that equals the gold rounded to ``d`` decimals
      (``|pred - gold| <= 0.5 * 10**-d``): ``"2.33"``, ``"2.3333"`` and (for ``2.30001``) ``"2.30"``
      score 1.0; ``"2.3"``, ``"2"``, ``"2.34"`` score 0.0, and so do ``"3244048.1"`` and ``"3244047"`` for
      ``3244047.1``. There is no absolute tolerance, so neither ``"0"`` nor ``"0.00"`` matches ``5.158e-07``.
      A gold written with ``d >= 8`` decimals (:data:`ROUNDED_GOLD_DECIMALS`) is a float rounded at its 10th
      (GSM-Hard's file rounds there) or its last, matched by any prediction that rounds to it there: the exact
      ``2.010666990518096e-06`` for ``0.0000020107``.
    * an exponent is read on either side (GSM-Hard writes golds such as ``"2.0107e-06"``): ``"0.0000020107"``
      and ``"2.0107e-06"`` are the same number, and a prediction in scientific notation is written to the decimals
      of its plain form (``"2.01e-06"``: 8).

    Non-numeric gold (ProsQA's ``"Tom is a lempus."``, and a number with other text: ``"50%"``, ``"12 kg"``,
    ``"€5"``, for which ``"#### 50"`` scores 0.0): the completion's final segment (after the last
    ``#`` if any, else the whole text; after the last standalone ``####`` when the gold holds a ``#`` itself, as
    :func:`final_answer_text` reads it) must equal the gold after :func:`normalize_text`.

    TypeError for a ``completion_text`` that is not text (a list of completions scored 0.0 without a word: score one
    at a time, ``[score(c, gold) for c in completions]``).
    """
    if not isinstance(completion_text, str):
        many = " (a batch: [score(c, gold) for c in completions])" if isinstance(completion_text, (list, tuple)) else ""
        raise TypeError(
            f"score: completion_text must be one completion's text, got {type(completion_text).__name__}{many}"
        )
    gold = _gold_canonical(gold_answer)
    if gold is None:
        if not isinstance(gold_answer, str):
            return 0.0
        wanted = normalize_text(gold_answer)
        return 1.0 if wanted and normalize_text(final_answer_text(completion_text, gold_answer)) == wanted else 0.0
    found = _find_answer(completion_text)
    if found is None:
        return 0.0
    return 1.0 if numbers_match(found.canonical(), gold, _written_decimals(found.match.group("num"))) else 0.0
