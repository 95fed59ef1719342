"""A second pass of mutation testing over the built-in scorers and the checked call of a scorer or reward
(:mod:`dgrpo.eval.scoring`): each test kills a change of the source that the suite passed."""

import pytest

from dgrpo.data.records import Record
from dgrpo.eval.scoring import RewardError, call_checked, choice_letter, coconut


def test_coconut_compares_the_gold_without_its_commas_too():
    """Coconut's check strips commas from both sides: ``#### 1000`` and ``#### 1,000`` answer a gold ``1,000``."""
    gold = [Record("q", [], "1,000")] * 3
    assert coconut(["#### 1000", "#### 1,000", "#### 100"], gold) == [1.0, 1.0, 0.0]


def test_a_text_without_a_hash_ends_with_its_last_marked_letter_not_its_last_capital():
    """A gold such as ``C. A tree`` answers C, its marked letter, not the article A after it."""
    assert choice_letter("C. A tree") == "C"
    assert choice_letter("(B) is right, not A") == "B"


def test_a_scorer_returning_more_values_than_completions_is_refused():
    """Three values for two completions are an error naming the counts (the extra value was dropped unseen)."""

    def three(completions, records):
        return [1.0, 0.0, 1.0]

    with pytest.raises(RewardError, match=r"^scorer three returned 3 values for 2 completions$"):
        call_checked(three, "three", ["a", "b"], [Record("q", [], "1")] * 2, "scorer")
    with pytest.raises(RewardError, match=r"^scorer three returned 3 values for 1 completion$"):  # (not "completions")
        call_checked(three, "three", ["a"], [Record("q", [], "1")], "scorer")
    with pytest.raises(RewardError, match=r"^scorer one returned 1 value for 2 completions$"):  # (not "1 values")
        call_checked(lambda c, r: [1.0], "one", ["a", "b"], [Record("q", [], "1")] * 2, "scorer")


def test_an_infinite_value_is_no_reward():
    """``inf`` and ``-inf`` are refused as NaN is (as a reward, it left no finite advantage)."""
    from dgrpo.eval.scoring import reward_value

    assert reward_value(float("inf")) is None and reward_value(float("-inf")) is None

    def infinite(completions, records):
        return [1.0, float("-inf")]

    with pytest.raises(
        RewardError, match=r"^reward infinite returned -inf for row 1 \(completion 'b', question 'q2'\)$"
    ):
        call_checked(infinite, "infinite", ["a", "b"], [Record("q1", [], "1"), Record("q2", [], "1")])


def test_a_plug_in_scorer_is_named_by_its_spec_and_its_calls_are_checked(tmp_path):
    """``eval.scorer=path/to/file.py:mine``: results name the scorer by that spec (they named it ``checked``, the
    wrapper), and a value outside [0, 1] is an error naming it."""
    from dgrpo.eval.evaluate import scorer_name
    from dgrpo.eval.scoring import build_scorer

    file = tmp_path / "mine.py"
    file.write_text("def mine(completions, records):\n    return [2.0 if c == 'x' else 1.0 for c in completions]\n")
    spec = f"{file}:mine"
    scorer = build_scorer(spec)
    assert scorer_name(scorer) == spec
    assert scorer(["a"], [Record("q", [], "1")]) == [1.0]
    with pytest.raises(RewardError, match=r"returned 2.0 for row 0 .*a scorer's value is in \[0, 1\]"):
        scorer(["x"], [Record("q", [], "1")])


def test_a_value_past_1_beyond_the_tolerance_is_refused_within_it_is_1():
    """A float sum's 1.0000005 is 1; a scorer's 1.01 is no value in [0, 1] and is an error, not a correct answer."""

    def past(completions, records):
        return [1.0000005, 1.01][: len(completions)]

    records = [Record("q1", [], "1"), Record("q2", [], "1")]
    with pytest.raises(RewardError, match=r"^scorer past returned 1.01 for row 1 \(completion 'b', question 'q2'\)"):
        call_checked(past, "past", ["a", "b"], records, "scorer")
    assert call_checked(past, "past", ["a"], records[:1], "scorer") == [1.0]


def test_no_gold_tried_is_no_warning_that_every_gold_scores_zero():
    """With no record to try (an empty list), nothing is said: "0 to the gold answer of every record (0)" was
    warned."""
    import warnings

    from dgrpo.eval.scoring import warn_if_gold_scores_zero

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_gold_scores_zero([], "the reward")


def test_gold_answers_are_tried_as_completions_that_state_them_after_the_marker():
    """The scorer check tries each gold as ``#### <answer>``, which Coconut's check (it needs the ``#``) credits: a
    gold written bare scored 0 under it, and a run of a correct scorer was warned of zeros."""
    from dgrpo.eval.scoring import check_scorer

    assert check_scorer(coconut, [Record("q1", [], "1,000"), Record("q2", [], "7")]) == [1.0, 1.0]


def test_a_weighted_reward_item_without_a_weight_weighs_1():
    """``grpo.rewards: [{fn: numeric}, {fn: exact, weight: 0.5}]``: the first weighs 1 (0 was taken as its default:
    a reward part that counted nothing), the total of a correct gold 1.5."""
    from dgrpo.eval.scoring import build_rewards, gold_completions

    rewards = build_rewards("", [{"fn": "numeric"}, {"fn": "exact", "weight": 0.5}], "numeric")
    assert [p.weight for p in rewards.parts] == [1.0, 0.5]
    records = [Record("q", [], "3")]
    assert rewards(gold_completions(records), records) == [1.5]
