"""A walk through README's "Your own task" with a reward and scorer of one's own: what their errors say."""

import pytest

from dgrpo.data.records import Record
from dgrpo.eval.scoring import RewardError, RewardPart, Rewards, check_scorer


def _tagged(completions, records):
    """A reward of another answer format: it reads '<answer>N</answer>' and fails on anything else."""
    return [float(c.split("<answer>")[1].split("</answer>")[0] == r.answer) for c, r in zip(completions, records)]


def _own_gold_only(completions, records):
    """A scorer that raises on an answer not its question's own (as on the check's swapped golds)."""
    if any(c != f"#### {r.answer}" for c, r in zip(completions, records)):
        raise ValueError("not this question's answer")
    return [1.0] * len(completions)


RECS = [Record("Ann has 2 and 3 more: how many?", [], "5"), Record("Ben has 4 and 4 more: how many?", [], "8")]


def test_a_reward_failing_on_the_gold_check_says_the_completion_was_not_the_models():
    """The first call of a reward, on gold answers written as '#### <answer>' before anything is trained, named
    completion '#### 5' as if the model had written it: the line now says it came from that check."""
    with pytest.raises(RewardError) as raised:
        Rewards([RewardPart("tagged", _tagged)]).smoke_test(RECS, check_filter=True)
    line = str(raised.value)
    assert line.startswith("reward tagged raised IndexError: list index out of range on row 0 (completion '#### 5'")
    assert "found by the check made before training or evaluating, on gold answers written as '#### <answer>'" in line
    assert "\n" not in line


def test_a_scorer_failing_on_the_swapped_golds_says_so():
    """check_scorer's second call gives each record the other's gold: a failure there names a completion that is not
    even the question's own answer, and says so."""
    with pytest.raises(RewardError, match=r"'#### <answer>', each given to the other record \(no completion"):
        check_scorer(_own_gold_only, RECS)
    with pytest.raises(RewardError, match=r"on gold answers written as '#### <answer>' \(no completion"):
        check_scorer(_tagged, RECS)


def test_a_bad_value_names_the_completion_it_was_given():
    """A reward's NaN (or a string) on a batch of the model's rollouts named the row's question alone: which of its
    group's completions made the value was left to guess. The line names the completion too."""
    from dgrpo.eval.scoring import call_checked

    def parsed(completions, records):
        return [float(c.split("#")[-1]) for c in completions]

    with pytest.raises(RewardError) as raised:
        call_checked(parsed, "parsed", ["#### 5", "#### nan"], RECS)
    assert str(raised.value) == (
        "reward parsed returned nan for row 1 (completion '#### nan', question 'Ben has 4 and 4 more: how many?')"
    )
    with pytest.raises(RewardError, match=r"returned 2\.0 for row 0 \(completion '#### 2', question 'Ann has"):
        call_checked(parsed, "parsed", ["#### 2"], RECS[:1], "scorer")
