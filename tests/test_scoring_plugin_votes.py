"""A scorer plug-in's answers in a Monte-Carlo vote (``evaluate_mc_vote``): each completion votes for its final
answer text (after the last ``#``, the whole text without one) normalised as ``exact`` normalises it, so a plug-in
that reads that text scores alike the completions that share a vote; the voted row is the plug-in's value of one."""

import pytest

import dgrpo.eval.evaluate as ev
from dgrpo.data.records import Record
from dgrpo.eval.evaluate import evaluate_mc_vote
from dgrpo.eval.scoring import SCORERS, build_scorer
from dgrpo.perturbation import LockedDropout

from conftest import make_lm, vote_pairs

FAST = {"max_new_tokens": 1, "progress": False}

PLUGIN = '''
import asyncio
from dgrpo.reward import final_answer_text, normalize_text

async def tom_or_half(completions, answer, **kwargs):
    """1 for the gold's text after the last '#', 0.5 for 'tom' against another gold, else 0 (a TRL-style async)."""
    await asyncio.sleep(0)
    read = [normalize_text(final_answer_text(c, a)) for c, a in zip(completions, answer)]
    return [1.0 if r == normalize_text(a) else 0.5 if r == "tom" else 0.0 for r, a in zip(read, answer)]
'''


@pytest.mark.parametrize("name", ["numeric", "exact", "choice"])
def test_a_plugin_that_reads_the_final_answer_scores_one_vote_alike(name):
    """A plug-in is no built-in to vote_key (it votes on the normalised final answer text): one wrapping a built-in
    scorer that reads the final answer gives the same score to completions that share a vote."""
    builtin = SCORERS[name]

    def plugin(completions, records):
        return builtin(completions, records)

    for gold, (a, ka, sa), (b, kb, sb) in vote_pairs(plugin):
        if ka is not None and ka == kb:
            assert sa == sb, (name, gold, a, b)


def test_a_plugins_vote_is_the_normalised_final_answer_and_its_row_the_plugins_value(tokenizer, tmp_path, monkeypatch):
    """Votes, pred, correct and score of a vote under a plug-in scorer named by a file spec: ``#### Tom``, ``# tom.``
    and ``tom`` (no ``#``: the whole text) are one vote and outvote ``#### Ann`` twice; a plug-in's partial credit
    is the row's score, not correct; a question without an answer votes None and scores 0."""
    (tmp_path / "judge.py").write_text(PLUGIN)
    scorer = build_scorer(f"{tmp_path / 'judge.py'}:tom_or_half")
    texts = ["#### Tom", "#### Ann", "# tom.", "#### Ann", "tom"] + ["#### Tom", "#### tom", "#### Ann"]
    texts += ["####", "#### ", " ####  ", "####", "####"]
    monkeypatch.setattr(ev, "generate_answers", lambda lm, qs, **kw: texts[: len(qs)])
    recs = [Record("q1", [], "Tom"), Record("q2", [], "Ann"), Record("q3", [], "Bo")]
    r = evaluate_mc_vote(make_lm(tokenizer), recs[:1], LockedDropout(p=0.1), n_masks=5, scorer=scorer, **FAST)
    assert r.predictions[0]["votes"] == ["tom", "ann", "tom", "ann", "tom"]
    assert (r.predictions[0]["pred"], r.predictions[0]["correct"], r.predictions[0]["score"]) == ("tom", True, 1.0)
    assert r.predictions[0]["completion"] == "#### Tom"  # (the first completion that gave the majority answer)
    texts[:5] = texts[5:8] + texts[5:7]  # (Tom, tom, Ann, Tom, tom for gold Ann: 'tom' wins, half credit)
    r = evaluate_mc_vote(make_lm(tokenizer), recs[1:2], LockedDropout(p=0.1), n_masks=5, scorer=scorer, **FAST)
    assert (r.predictions[0]["pred"], r.predictions[0]["correct"], r.predictions[0]["score"]) == ("tom", False, 0.5)
    assert (r.accuracy, r.mean_score, r.scorer) == (0.0, 0.5, f"{tmp_path / 'judge.py'}:tom_or_half")
    texts[:5] = texts[8:13]
    r = evaluate_mc_vote(make_lm(tokenizer), recs[2:], LockedDropout(p=0.1), n_masks=5, scorer=scorer, **FAST)
    assert r.predictions[0]["votes"] == [None] * 5
    assert (r.predictions[0]["pred"], r.predictions[0]["score"], r.unparseable) == (None, 0.0, 0)
