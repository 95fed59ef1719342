"""The Monte-Carlo vote (:func:`dgrpo.eval.evaluate.evaluate_mc_vote`), by hand: which answers vote together, which
completion a row shows, the seeds of the masks and samples, and what is handed on (mutation-found gaps: each test
kills a change of the source that the suite passed)."""

import pytest

import dgrpo.eval.evaluate as ev
from dgrpo.data.records import Record
from dgrpo.eval.evaluate import evaluate_mc_vote, mask_seeds
from dgrpo.perturbation import LockedDropout

from conftest import make_lm

FAST = {"max_new_tokens": 2, "progress": False}


@pytest.fixture
def lm(tokenizer):
    return make_lm(tokenizer)


def voted(lm, monkeypatch, records, texts, **kw):
    """evaluate_mc_vote of ``records`` whose perturbed completions are ``texts`` (question-major)."""
    monkeypatch.setattr(ev, "_perturbed_texts", lambda *a, **k: list(texts))
    return evaluate_mc_vote(lm, records, LockedDropout(p=0.1), progress=False, **kw)


def test_numbers_vote_together_only_where_the_scorer_compares_numbers(lm, monkeypatch):
    """``2.33`` and ``2.333`` are one answer to the numeric verifier for a numeric gold only: for a text gold it
    compares texts, and ``exact`` compares numbers by equality, so there they are two votes (grouped, they outvote the
    right answer written once); ``exact`` reads ``2.50`` as ``2.5`` for a number gold only."""
    texts = ["#### Tom is a lempus.", "#### 2.33", "#### 2.333"]
    r = voted(lm, monkeypatch, [Record("Is Tom a lempus?", [], "Tom is a lempus.")], texts, n_masks=3)
    assert (r.predictions[0]["pred"], r.correct) == ("tom is a lempus", 1)
    r = voted(lm, monkeypatch, [Record("q", [], "5")], ["#### 5", "#### 2.33", "#### 2.333"], n_masks=3, scorer="exact")
    assert (r.predictions[0]["pred"], r.correct) == ("5", 1)
    r = voted(
        lm, monkeypatch, [Record("Who?", [], "Tom")], ["#### Tom", "#### 2.50", "#### 2.5"], n_masks=3, scorer="exact"
    )
    assert (r.predictions[0]["votes"], r.predictions[0]["pred"], r.correct) == (["tom", "2.50", "2.5"], "tom", 1)


def test_a_row_shows_the_first_completion_of_its_vote_or_of_its_question(lm, monkeypatch):
    """A text vote shows (and scores) the first completion that gave it; a question without a vote shows its first
    completion; of a number's completions under 2 decimals, which score alike, the one with the most decimals."""
    recs = [Record("Is Tom a lempus?", [], "Tom is a lempus."), Record("q", [], "7"), Record("r", [], "36")]
    texts = [
        "#### Ann",
        "#### Tom is a lempus.",
        "#### tom is a LEMPUS",
        "no idea",
        "hmm",
        "",
        "#### 36",
        "#### 36.0",
        "x",
    ]
    r = voted(lm, monkeypatch, recs, texts, n_masks=3)
    shown = ["#### Tom is a lempus.", "no idea", "#### 36.0"]
    assert [(p["completion"], p["correct"]) for p in r.predictions] == list(zip(shown, [True, False, True]))


def test_the_masks_and_samples_are_drawn_from_the_seed_each_from_a_stream_of_its_own(lm, monkeypatch):
    """Copy k of a question is answered under the mask of ``mask_seeds(seed, .., "mc-vote")`` and sampled from a seed
    of stream ``mc-vote-sampling`` (one stream for both drew a mask and a sample from one seed; another seed changes
    both; results record the seed they were drawn from)."""
    seen: list[dict] = []

    def spy(lm, questions, **kw):
        seen.append({"questions": questions, **kw})
        return ["#### 1"] * len(questions)

    monkeypatch.setattr(ev, "generate_answers", spy)
    recs, qs = [Record("a?", [], "1"), Record("b?", [], "2")], ["a?", "b?"]
    r = evaluate_mc_vote(lm, recs, LockedDropout(p=0.1), n_masks=2, seed=3, temperature=0.7, **FAST)
    masks, samples = seen[-1]["perturbation_seeds"], seen[-1]["sampling_seeds"]
    assert seen[-1]["questions"] == ["a?", "a?", "b?", "b?"] and r.seed == 3
    assert masks.tolist() == mask_seeds(3, qs, "mc-vote", copies=2).tolist() != mask_seeds(4, qs, "mc-vote", 2).tolist()
    assert samples.tolist() == mask_seeds(3, qs, "mc-vote-sampling", copies=2).tolist()
    assert not set(masks.tolist()) & set(samples.tolist())
    assert mask_seeds(4, qs, "mc-vote-sampling", copies=2).tolist() != samples.tolist()
    evaluate_mc_vote(lm, recs, LockedDropout(p=0.1), n_masks=2, seed=3, **FAST)
    assert seen[-1]["sampling_seeds"] is None  # (greedy)


def test_the_vote_hands_the_scorer_the_columns_it_is_told_of(lm, monkeypatch):
    """A shard's vote is told the whole data's columns, as evaluate is: a scorer in TRL's form gets ``unit`` (None
    where a record has none) though no record of the shard has it (it was called in dgrpo's form)."""
    seen = []

    def per_unit(completions, unit, **kw):
        seen.append(list(unit))
        return [1.0] * len(completions)

    r = voted(
        lm, monkeypatch, [Record("q2", [], "7")], ["#### 7", "#### 7"], n_masks=2, scorer=per_unit, columns=("unit",)
    )
    assert (seen, r.correct) == ([[None, None]], 1)  # (every mask's completion scored: pass@k)


def test_the_vote_shows_its_bar_only_when_asked(lm, capsys, monkeypatch):
    """``progress=False`` keeps the vote's generation bar off (a test's or a script's stderr), ``True`` shows it."""
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    recs = [Record("1+1?", [], "2")]
    evaluate_mc_vote(lm, recs, LockedDropout(p=0.1), n_masks=2, max_new_tokens=2, progress=False)
    assert capsys.readouterr().err == ""
    evaluate_mc_vote(lm, recs, LockedDropout(p=0.1), n_masks=2, max_new_tokens=2, progress=True)
    assert "mc-vote" in capsys.readouterr().err
