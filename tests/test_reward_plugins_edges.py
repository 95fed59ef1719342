"""Rewards as a researcher writes them: edges of what a reward function returns, and of how its parts combine."""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Any, cast

import numpy as np
import pytest
import torch

from dgrpo.data.records import Record
from dgrpo.eval.scoring import RewardError, RewardPart, Rewards, call_checked, exact, numeric

RECORDS = [Record(question=f"q{i}", answer=str(i), steps=[], meta={"n": str(i)}) for i in range(3)]
COMPLETIONS = ["#### 0", "#### 1", "#### x"]


def _lazy_float(completions: list[str], **kwargs: Any) -> Any:
    return (float(c.split("####")[-1]) for c in completions)  # (a generator: float(' x') fails as it is read)


def _lazy_map(completions: list[str], records: list[Record]) -> Any:
    return map(lambda c, r: {"0": 1.0}[r.answer], completions, records)  # (KeyError on row 1, when read)


def _lazy_type(completions: list[str], records: list[Record]) -> Any:
    return (len(c) + r.meta["n"] for c, r in zip(completions, records))  # (a TypeError, when read)


@pytest.mark.parametrize(
    ("fn", "error", "row"),
    [
        (_lazy_float, "ValueError", "row 2 (completion '#### x'"),
        (_lazy_map, "KeyError", "row 1 (completion"),
        (_lazy_type, "TypeError", "row 0 (completion"),
    ],
)
def test_a_lazy_return_that_fails_as_it_is_read_names_the_function_and_the_row(fn, error, row) -> None:
    # a generator or map() computes its values as they are read: its error escaped bare (a ValueError with no word of
    # the reward) or, a TypeError, was told as "returned <generator ...>, not one value per completion"
    with pytest.raises(RewardError, match=rf"^reward {fn.__name__} raised {error}: .* on {re.escape(row)}") as e:
        call_checked(fn, fn.__name__, COMPLETIONS, RECORDS)
    assert "\n" not in str(e.value)


def test_a_lazy_return_that_reads_well_is_taken() -> None:
    def lazy(completions: list[str], records: list[Record]) -> Any:
        return (float(c == f"#### {r.answer}") for c, r in zip(completions, records))

    assert call_checked(lazy, "lazy", COMPLETIONS, RECORDS) == [1.0, 1.0, 0.0]


class _Judge:
    def __call__(self, completions: list[str], records: list[Record]) -> list[float]:
        return numeric(completions, records)


@pytest.mark.parametrize(
    ("weight", "said"),
    [
        (float("nan"), "got nan"),
        (float("inf"), "got inf"),
        ("0.5", "got '0.5'"),
        (True, "got True"),
        (None, "got None"),
    ],
)
def test_a_reward_parts_weight_that_is_no_finite_number_is_refused_where_it_is_given(weight, said) -> None:
    # (a NaN weight made every total NaN, refused as the filter window's "it is nan for row 0"; with the filter off
    # it trained on NaN rewards; a weight of text failed in the first call: "can't multiply sequence by non-int")
    with pytest.raises(RewardError, match=rf"^RewardPart 'a': weight must be a finite number, {re.escape(said)}$"):
        RewardPart("a", numeric, weight)


def test_a_reward_parts_weight_is_kept_as_a_float() -> None:
    rewards = Rewards([RewardPart("a", numeric, cast(float, Decimal("0.5"))), RewardPart("b", numeric, np.float32(2))])
    assert [type(p.weight) for p in rewards.parts] == [float, float]
    assert rewards(["#### 0", "#### 5"], RECORDS[:2]) == [2.5, 0.0]


def test_a_reward_part_that_is_no_function_is_refused_where_it_is_given() -> None:
    with pytest.raises(RewardError, match=r"^RewardPart 'a': fn must be a reward function, got str 'numeric' "):
        RewardPart("a", cast(Any, "numeric"))
    with pytest.raises(RewardError, match=r"^RewardPart 'j': fn is the class _Judge; pass a function, or an instance"):
        RewardPart("j", cast(Any, _Judge))
    assert RewardPart("j", _Judge()).fn(["#### 0"], RECORDS[:1]) == [1.0]


def test_rewards_whose_every_weight_is_zero_are_refused_as_the_config_refuses_them() -> None:
    with pytest.raises(RewardError, match=r"^Rewards: every part has weight 0: the total reward would be 0 for every"):
        Rewards([RewardPart("a", numeric, 0), RewardPart("b", exact, 0.0)])
    assert Rewards([RewardPart("a", numeric, 0), RewardPart("b", exact, -0.5)]).identity()[1].endswith("* -0.5")


def test_a_reward_without_kwargs_whose_second_parameter_names_a_column_is_warned_of() -> None:
    # TRL's `accuracy(completions, solution)`, **kwargs forgotten: called as dgrpo's form, its `solution` got the
    # records, compared with text as 0 every time, without a word of why
    records = [Record(question="q", answer="4", steps=[], meta={"solution": "#### 4"})]

    def accuracy_no_kwargs(completions: list[str], solution: list[Any]) -> list[float]:
        return [float(c == s) for c, s in zip(completions, solution)]

    with pytest.warns(UserWarning, match=r"^accuracy_no_kwargs's second parameter 'solution' is named as a column of "):
        assert call_checked(accuracy_no_kwargs, "accuracy_no_kwargs", ["#### 4"], records) == [0.0]


def test_a_dgrpo_reward_whose_second_parameter_is_no_column_is_not_warned_of(recwarn: pytest.WarningsRecorder) -> None:
    def batch_reward(completions: list[str], batch: list[Record]) -> list[float]:
        return [float(c == f"#### {r.answer}") for c, r in zip(completions, batch)]

    assert call_checked(batch_reward, "batch_reward", ["#### 0"], RECORDS[:1]) == [1.0]
    assert not [w for w in recwarn if "batch_reward" in str(w.message)]


def test_a_row_of_values_wrapped_in_one_more_dimension_is_named_by_its_shape() -> None:
    # torch.tensor([values]) is of shape [1, n]: it was "returned 1 value for 3 completions", no word of the shape
    def wrapped(completions: list[str], records: list[Record]) -> torch.Tensor:
        return torch.tensor([numeric(completions, records)])

    shape = re.escape("(an array of shape (1, 3): one number per completion is 1-D)")
    with pytest.raises(RewardError, match=rf"^reward wrapped returned 1 value for 3 completions {shape}$"):
        call_checked(wrapped, "wrapped", COMPLETIONS, RECORDS)
    with pytest.raises(RewardError, match=r"^reward short returned 2 values for 3 completions$"):
        call_checked(lambda c, r: np.ones(2), "short", COMPLETIONS, RECORDS)


def test_a_python_reward_named_as_a_rollout_field_is_refused_saying_how_to_rename_it() -> None:
    # reward_fn=[reward, fmt] names its parts by __name__: "give the part another name" did not say how
    from dgrpo.config import Config
    from dgrpo.training.grpo import _chosen_rewards

    def reward(completions: list[str], **kwargs: Any) -> list[float]:
        return [1.0] * len(completions)

    def fmt(completions: list[str], **kwargs: Any) -> list[float]:
        return [0.0] * len(completions)

    how = re.escape(
        "reward_fn=[...], where a function's __name__ names it: rename it, or pass a Rewards of RewardParts"
    )
    with pytest.raises(RewardError, match=rf"^Rewards: reward part name\(s\) reward are fields .*{how}\)$"):
        _chosen_rewards([reward, fmt], Config())


def test_trls_none_is_taken_as_nan_and_a_scorers_refused_saying_what_to_return() -> None:
    # (TRL sums the weighted rewards with nansum: a None adds nothing; it was refused, stopping a run at the first
    # one. A reward's None is NaN now, Rewards' total leaves it out (tests/test_reward_none.py); a scorer's is refused)
    def math_only(completions: list[str], **kwargs: Any) -> Any:
        return [None if c.endswith("x") else 1.0 for c in completions]

    values = call_checked(math_only, "math_only", COMPLETIONS, RECORDS)
    assert values[:2] == [1.0, 1.0] and math.isnan(values[2])
    said = re.escape(": every completion needs a number in [0, 1]: return 0.0 for one not correct")
    with pytest.raises(RewardError, match=rf"^scorer math_only returned None for row 2 \(completion '#### x'.*{said}$"):
        call_checked(math_only, "math_only", COMPLETIONS, RECORDS, "scorer")


def test_a_trl_reward_looking_up_a_column_the_data_lacks_is_told_the_keywords_it_gets() -> None:
    # kwargs["solution"] on data without that column said "raised KeyError: 'solution'", no word of what it gets
    records = [Record(question="q", answer="4", steps=[], meta={"source": "mine.jsonl"})]

    def accuracy(completions: list[str], **kwargs: Any) -> list[float]:
        return [float(c == s) for c, s in zip(completions, kwargs["solution"])]

    said = re.escape(
        "raised KeyError: 'solution' (if looked up in its **kwargs: no such keyword; it is called with prompts, "
        "completions, answer, steps, source: the data's columns by their names, data.answer_key's too) on row 0"
    )
    with pytest.raises(RewardError, match=rf"^reward accuracy {said}"):
        call_checked(accuracy, "accuracy", ["#### 4"], records, columns=("source",))

    def by_letter(completions: list[str], **kwargs: Any) -> list[float]:  # (its own dict's key: the hint says "if")
        return [{"A": 1.0}[kwargs["answer"][0]]]

    with pytest.raises(RewardError, match=r"^reward by_letter raised KeyError: '4' \(if looked up in its \*\*kwargs"):
        call_checked(by_letter, "by_letter", ["#### 4"], records)

    def answer_twice(completions: list[str], **kwargs: Any) -> list[float]:  # (a keyword it gets: nothing added)
        raise KeyError("answer")

    with pytest.raises(RewardError, match=r"^reward answer_twice raised KeyError: 'answer' on row 0"):
        call_checked(answer_twice, "answer_twice", ["#### 4"], records)


def test_a_scorers_nan_is_refused_saying_what_to_return_instead_and_a_rewards_taken() -> None:
    # (TRL's nansum leaves a NaN out as it does a None: a reward written for it returns NaN for "cannot score", taken
    # as a None is; a scorer's line said only "returned nan for row 1")
    def parsed(completions: list[str], records: list[Record]) -> Any:
        return np.array([1.0, np.nan, 0.0], dtype=np.float32)

    values = call_checked(parsed, "parsed", COMPLETIONS, RECORDS)
    assert values[0] == 1.0 and math.isnan(values[1]) and values[2] == 0.0
    with pytest.raises(
        RewardError, match=r"^scorer parsed returned .* finite number: return 0\.0 for one it cannot score$"
    ):
        call_checked(parsed, "parsed", COMPLETIONS, RECORDS, "scorer")
    with pytest.raises(
        RewardError, match=r"^reward inf returned inf for row 0 \(completion '#### 0', question 'q0'\)$"
    ):
        call_checked(lambda c, r: [float("inf")] * 3, "inf", COMPLETIONS, RECORDS)


def test_a_reward_past_float32s_range_is_refused_naming_the_row() -> None:
    # (the rewards are kept in a float32 tensor: 1e39 was inf there, and its group's advantages (r - mean) NaN)
    def huge(completions: list[str], records: list[Record]) -> list[float]:
        return [1.0, -1e39, 0.0]

    said = re.escape("reward huge returned -1e+39 for row 1 (completion '#### 1', question 'q1'): past float32's range")
    with pytest.raises(RewardError, match=rf"^{said}, \+-3\.403e\+38, in which the rewards are kept"):
        call_checked(huge, "huge", COMPLETIONS, RECORDS)

    def big(completions: list[str], records: list[Record]) -> list[float]:
        return [3e38, 0.0, 1.0]

    assert call_checked(big, "big", COMPLETIONS, RECORDS) == [3e38, 0.0, 1.0]
    total = re.escape("the weighted total of the rewards is 6e+38 for row 0 (completion '#### 0', question 'q0')")
    with pytest.raises(RewardError, match=rf"^{total}: past float32's range"):
        Rewards([RewardPart("a", big), RewardPart("b", big)])(COMPLETIONS, RECORDS)
