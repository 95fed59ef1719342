"""What counts as correct, at its edges: a space between a number and its symbol in a text answer (``#### 50 %``
for a ``50%`` gold), and an empty answer's ``pred`` in ``predictions.jsonl``, the same under every scorer."""

import pytest

import dgrpo.eval.evaluate as ev
from dgrpo.data.records import Record
from dgrpo.eval.evaluate import vote_key
from dgrpo.eval.scoring import SCORERS, exact, numeric
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
