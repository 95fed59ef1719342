"""Loose ends of :mod:`dgrpo.eval.evaluate`: the context check and the cut-question warning of a list with copies
(a vote's), what a prediction row shows a scorer read, and the mode a result records."""

import pytest

import dgrpo.eval.evaluate as ev
from dgrpo.config import ConfigError
from dgrpo.data.records import Record
from dgrpo.eval.evaluate import check_fits_context, evaluate, generate_answers
from dgrpo.eval.scoring import SCORERS
from dgrpo.reward import numbers_agree

from conftest import make_lm, vote_pairs

FAST = {"max_new_tokens": 1, "progress": False}


@pytest.fixture
def lm(tokenizer):
    return make_lm(tokenizer)


def _encoded(lm, monkeypatch) -> list[list[str]]:
    """The question lists ``lm.encode_questions`` is called with, from now on."""
    seen: list[list[str]] = []
    encode = lm.encode_questions

    def encode_and_keep(qs, **kw):
        seen.append(list(qs))
        return encode(qs, **kw)

    monkeypatch.setattr(lm, "encode_questions", encode_and_keep)
    return seen


def test_copies_of_a_question_are_checked_and_counted_once(lm, monkeypatch):
    """generate_answers checks the context on, and warns of the cut questions among, each distinct question once: a
    vote's 8 copies of a cut question are one cut question (the answers still come one per copy)."""
    seen = _encoded(lm, monkeypatch)
    counted: list[list[str]] = []
    count = lm.count_cut_questions
    monkeypatch.setattr(lm, "count_cut_questions", lambda qs, m: counted.append(list(qs)) or count(qs, m))
    long = "what is 10 - 3 + 4 - 1?"
    qs = [long, "1?", long, long]
    with pytest.warns(UserWarning, match=r"^1 of 2 evaluated questions are longer than"):
        got = generate_answers(lm, qs, n_latent=0, batch_size=4, max_question_tokens=3, **FAST)
    assert len(got) == 4 and got[0] == got[2] == got[3]
    assert counted == [[long, "1?"]]
    assert seen[0] == [long, "1?"]  # (the context check; then the batch, every copy)
    assert sorted(seen[1]) == sorted(qs)


def test_check_fits_context_encodes_each_question_once_and_judges_the_longest(lm, monkeypatch):
    """Called directly (a trainer's check of its validation and test sets), duplicates are encoded once, and the
    longest question decides, however often the others repeat."""
    seen = _encoded(lm, monkeypatch)
    check_fits_context(lm, ["a?", "b?", "a?"], 0, 4)
    assert seen == [["a?", "b?"]]
    past = "%" * 520  # (each '%' a token: past the tiny model's context)
    with pytest.raises(ConfigError, match="does not fit the model's context"):
        check_fits_context(lm, ["a?", "a?", past, "a?"], 0, 4)


def test_a_coconut_rows_pred_is_what_coconut_compares(lm, monkeypatch):
    """Under the coconut scorer pred showed the whole completion when it had no ``#`` (``5``, gold 5: pred 5, not
    correct) and the commas it drops (``1,000``); it is the text after the last ``#`` without commas, None without a
    ``#``, as its vote (pred of evaluate_mc_vote) reads it."""
    monkeypatch.setattr(ev, "generate_answers", lambda *a, **kw: ["5", "#### 1,000", "x # C#"])
    recs = [Record("q", [], "5"), Record("q", [], "1000"), Record("q", [], "C#")]
    r = evaluate(lm, recs, scorer="coconut", **FAST)
    assert [(p["pred"], p["correct"]) for p in r.predictions] == [(None, False), ("1000", True), (None, False)]


@pytest.mark.parametrize("name", ["numeric", "exact", "choice", "coconut"])
def test_answers_that_share_a_vote_score_alike_and_correct_ones_share_it(name):
    """A vote groups what the scorer equates (:func:`vote_key`): two completions with one vote score the same, and
    two correct ones give one vote (under numeric, numbers the verifier takes as one: ``numbers_agree``)."""
    for gold, (a, ka, sa), (b, kb, sb) in vote_pairs(SCORERS[name]):
        if ka is not None and ka == kb:
            assert sa == sb, (name, gold, a, b)
        if sa == sb == 1:
            assert ka == kb or (name == "numeric" and numbers_agree(ka, kb)), (name, gold, a, b)


def test_an_exact_rows_pred_is_the_text_it_compared(lm, monkeypatch):
    """Under exact a gold holding a ``#`` is answered after the last standalone marker (``#### C#``: pred C#, not the
    empty text after its last ``#``), and an empty answer shows as null, as under numeric and in a vote."""
    monkeypatch.setattr(ev, "generate_answers", lambda *a, **kw: ["#### C#", "#### "])
    r = evaluate(lm, [Record("q", [], "C#"), Record("q", [], "Tom")], scorer="exact", **FAST)
    assert [(p["pred"], p["correct"]) for p in r.predictions] == [("C#", True), (None, False)]


def test_the_context_check_measures_questions_as_cut_and_names_the_answers_option(lm):
    """A question past the context fits once ``max_question_tokens`` cuts it (the check measured it uncut), and a
    trainer's check names the option of the answer's length it is given."""
    past = "%" * 520  # (each '%' a token: past the tiny model's context)
    with pytest.warns(UserWarning, match="longer than data.max_question_tokens"):
        assert len(generate_answers(lm, [past, "1?"], n_latent=0, max_question_tokens=8, **FAST)) == 2
    check_fits_context(lm, [past], 0, 4, max_question_tokens=8)
    with pytest.raises(ConfigError, match=r"^sft: .*answer \(eval.max_new_tokens = 4\)"):
        check_fits_context(lm, [past], 0, 4, key="sft.c_thought", answer_key="eval.max_new_tokens")
