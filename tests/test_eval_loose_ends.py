"""Loose ends of :mod:`dgrpo.eval.evaluate`: the context check and the cut-question warning of a list with copies
(a vote's), what a prediction row shows a scorer read, and the mode a result records."""

import pytest

from dgrpo.config import ConfigError
from dgrpo.eval.evaluate import check_fits_context, generate_answers

from conftest import make_lm

FAST = {"max_new_tokens": 1, "progress": False}


@pytest.fixture
def lm(tokenizer):
    return make_lm(tokenizer)


def _encoded(lm, monkeypatch) -> list[list[str]]:
    """The question lists ``lm.encode_questions`` is called with, from now on."""
    seen: list[list[str]] = []
    encode = lm.encode_questions
    monkeypatch.setattr(lm, "encode_questions", lambda qs, **kw: seen.append(list(qs)) or encode(qs, **kw))
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
