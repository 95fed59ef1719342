"""What counts as correct, at its edges: a space between a number and its symbol in a text answer (``#### 50 %``
for a ``50%`` gold), an empty answer's ``pred`` in ``predictions.jsonl``, the same under every scorer, and a gold
that is a MATH-style solution (``\\boxed{3}``), warned of."""

import warnings

import pytest

import dgrpo.eval.evaluate as ev
from dgrpo.data.records import Record
from dgrpo.eval.evaluate import vote_key
from dgrpo.eval.scoring import SCORERS, exact, numeric, warn_if_scorer_misses_gold
from dgrpo.reward import normalize_text, score

from conftest import make_lm

FAST = {"max_new_tokens": 1, "progress": False}


@pytest.mark.parametrize(
    ("completion", "gold"),
    [("#### 50 %", "50%"), ("#### 50%", "50 %"), ("#### € 5", "€5"), ("#### (3, 4)", "(3,4)"), ("#### - 5 m", "-5 m")],
)
def test_a_space_between_a_digit_and_a_symbol_is_no_other_answer(completion, gold):
    """A text gold holding a number (``50%``, ``€5``) and the completion's answer lose the spaces between a digit and
    a symbol alike, under numeric and exact and in a vote (``#### 50 %`` scored 0 for ``50%``: ``"50 %"`` was
    compared with ``"50%"``)."""
    record = Record("q", [], gold)
    assert score(completion, gold) == 1.0
    assert numeric([completion], [record]) == [1.0] and exact([completion], [record]) == [1.0]
    assert vote_key(numeric, completion, gold) == vote_key(numeric, f"#### {gold}", gold)


@pytest.mark.parametrize(("completion", "gold"), [("#### 1000 m", "1 000 m"), ("#### 12kg", "12 kg")])
def test_a_space_between_digits_or_a_digit_and_a_letter_stays(completion, gold):
    """Only a digit and a symbol are joined: ``1 000`` is not ``1000`` (two numbers, or one in thousands, as
    ``#### 12 000`` answers 12), nor is ``12 kg`` ``12kg``; ProsQA's sentences keep their words apart."""
    assert score(completion, gold) == 0.0
    assert normalize_text(" Tom  is a lempus. ") == "tom is a lempus"


def _predictions(tokenizer, monkeypatch, scorer, texts, golds):
    monkeypatch.setattr(ev, "generate_answers", lambda lm, qs, **kw: texts[: len(qs)])
    records = [Record(f"q{i}", [], g) for i, g in enumerate(golds)]
    return ev.evaluate(make_lm(tokenizer), records, scorer=scorer, **FAST).predictions


def _plugin(completions, records):
    return [0.0 for _ in completions]


@pytest.mark.parametrize("scorer", ["numeric", "exact", "coconut", "plugin"])
def test_an_empty_answer_is_a_null_pred_under_every_scorer(tokenizer, monkeypatch, scorer):
    """``####`` and nothing after it: ``pred`` is null in predictions.jsonl under every scorer, for a text gold and a
    number gold, as a vote's is (it was ``""`` under exact and a plug-in, null under numeric)."""
    fn = _plugin if scorer == "plugin" else SCORERS[scorer]
    preds = _predictions(tokenizer, monkeypatch, fn, ["####", "#### ", "#### Tom"], ["Tom", "5", "Tom"])
    assert [p["pred"] for p in preds] == [None, None, "Tom"]


SOLUTION = "We have $x + 1 = 4$, so $x = \\boxed{3}$."


@pytest.mark.parametrize("scorer", ["numeric", "exact", "coconut"])
def test_a_boxed_solution_as_the_gold_is_warned_of_under_a_builtin_scorer(scorer):
    """A MATH-style solution mapped as the answer column is the gold as a whole text, which no completion's answer
    equals, and its own ``#### <solution>`` scores 1 under exact and coconut, so nothing was said under them (under
    numeric, that the gold was a number with text, to be written alone: a solution is not); the warning names the
    mapping to use."""
    records = [Record("q1", [], SOLUTION), Record("q2", [], SOLUTION.replace("4", "5").replace("{3}", "{4}"))]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn_if_scorer_misses_gold(SCORERS[scorer], records, f"eval.scorer {scorer!r}")
    said = [str(w.message) for w in caught]
    assert len(said) == 1 and "2 of the first 2 gold answers hold a \\boxed{...}" in said[0], said
    assert "data.answer_key=answer" in said[0] and "plug-in scorer that reads the gold's box" in said[0]


def test_a_plugin_scorer_or_a_gold_without_a_box_is_not_warned_of():
    """A plug-in may read the gold's box itself; ProsQA's sentences and GSM8K's numbers hold none."""

    def boxed(completions, records):
        return [1.0 for _ in completions]

    for scorer, gold in [(boxed, SOLUTION), (exact, "Tom is a lempus."), (numeric, "18")]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            warn_if_scorer_misses_gold(scorer, [Record("q", [], gold)], "eval.scorer")
        assert not caught, [str(w.message) for w in caught]
