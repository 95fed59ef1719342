"""Edges of a reward's identity, form and checks: a partial's bound arguments and a plug-in file's folder in what a
checkpoint records, positional-only parameters, a plain function's None in rollouts collected from Python, the
check on gold answers no reward applies to, and the filter's range error naming a completion."""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest

from dgrpo.data.records import Record
from dgrpo.eval.scoring import RewardError, RewardPart, Rewards, call_checked, load_function

RECORDS = [Record("q0", [], "3"), Record("q1", [], "4")]
COMPLETIONS = ["#### 3", "#### 5"]


def scaled(completions: list[str], records: list[Record], scale: float = 1.0) -> list[float]:
    return [scale * float(c == f"#### {r.answer}") for c, r in zip(completions, records)]


def given(*bound: Any, **keywords: Any) -> list[float]:
    return [1.0] * len(RECORDS)


@dataclass
class Judge:
    threshold: float

    def __call__(self, completions: list[str], records: list[Record]) -> list[float]:
        return [float(len(c) > self.threshold) for c in completions]


def test_a_partial_is_identified_with_the_arguments_it_binds() -> None:
    # a resume with scale=0.1 in place of scale=2.0 compared equal ("partial(...scaled)") and went on without a word
    two, tenth = (RewardPart("r", functools.partial(scaled, scale=s)).identity() for s in (2.0, 0.1))
    assert two != tenth
    assert two == f"r = partial({__name__}.scaled, scale=2.0) * 1"
    assert RewardPart("r", functools.partial(scaled, scale=2.0)).identity() == two  # (the same in every process)
    assert RewardPart("r", Judge(0.5)).identity() == f"r = {__name__}.Judge(threshold=0.5) * 1"
    assert RewardPart("r", Judge(0.5)).identity() != RewardPart("r", Judge(0.7)).identity()


def test_a_partials_bound_object_is_identified_without_its_address() -> None:
    class Table:  # (its repr: '<...Table object at 0x7f...>', another in every process)
        pass

    first, second = (RewardPart("r", functools.partial(given, Table())).identity() for _ in range(2))
    assert first == second and "0x" not in first
    long = RewardPart("r", functools.partial(given, scale=list(range(1000)))).identity()
    assert len(long) < 200 and "sha256:" in long


def test_a_plugin_files_reward_is_the_same_reward_from_another_folder(tmp_path: Path) -> None:
    # a project moved (or a run resumed on another machine's checkout) read as another reward: the module's name
    # held a hash of the file's absolute path
    source = "def reward(completions, records):\n    return [1.0] * len(completions)\n"
    identities = []
    for folder in ("old_place", "new_place"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "my_rewards.py").write_text(source)
        fn = load_function(f"{tmp_path / folder / 'my_rewards.py'}:reward")
        identities.append(RewardPart("r", fn).identity())
    assert identities[0] == identities[1] == "r = my_rewards.py:reward * 1"


@dataclass
class CachingJudge:
    threshold: float
    seen: dict[str, float] = field(default_factory=dict)

    def __call__(self, completions: list[str], records: list[Record]) -> list[float]:
        self.seen.update({c: 1.0 for c in completions})
        return [float(len(c) > self.threshold) for c in completions]


def test_an_object_reward_is_identified_as_it_was_made_not_by_the_state_it_fills() -> None:
    # a checkpoint records the identity as training left the object, a resume its fresh one: a cache in its repr
    # would read as another reward
    part = RewardPart("r", CachingJudge(0.5))
    made = part.identity()
    Rewards([part])(COMPLETIONS, RECORDS)
    assert part.identity() == made == RewardPart("r", CachingJudge(0.5)).identity()
    assert made != RewardPart("r", CachingJudge(0.7)).identity()


def keywords_refused(completions: list[str], /, **kwargs: Any) -> list[float]:
    return [1.0] * len(completions)


def prompts_before_slash(prompts: list[str], completions: list[str], /, **kwargs: Any) -> list[float]:
    return [1.0] * len(completions)


def test_a_reward_whose_parameters_are_positional_only_is_refused_saying_to_remove_the_slash() -> None:
    # called neither by keyword (TRL's form) nor with dgrpo's two arguments: "takes 1 positional argument but 2"
    with pytest.raises(RewardError) as caught:
        call_checked(keywords_refused, "keywords_refused", COMPLETIONS, RECORDS)
    said = str(caught.value)
    assert said.startswith("reward keywords_refused: completions is positional-only (before '/'), but a function")
    assert "remove the '/'" in said and "\n" not in said and "takes 1 positional" not in said


def test_a_reward_with_prompts_before_a_slash_is_warned_of_truly() -> None:
    # it has **kwargs: the warning said "it takes no **kwargs" and "Add **kwargs", which changed nothing
    with pytest.warns(UserWarning) as caught:
        call_checked(prompts_before_slash, "prompts_before_slash", COMPLETIONS, RECORDS)
    said = str(caught[0].message)
    assert "no **kwargs" not in said
    assert "prompts, completions are positional-only (before '/')" in said and "Remove the '/'" in said


def none_everywhere(completions: list[str], records: list[Record]) -> list[None]:
    return [None] * len(completions)


def test_gold_answers_no_reward_applies_to_give_one_warning_saying_so() -> None:
    # two warnings came: the row's "returned None", and "gives 0 to the gold answer of every record", which read as
    # the reward scoring the golds wrong
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Rewards([RewardPart("judge", none_everywhere)]).smoke_test(RECORDS, check_filter=False)
    said = [str(w.message) for w in caught]
    assert len(said) == 1, said
    assert said[0].startswith("every reward (judge) returned None or NaN ('does not apply') for the gold answer of")
    assert "every record it was tried on (2, each as '#### <answer>')" in said[0]


def test_the_filters_range_error_names_the_completion() -> None:
    rewards = Rewards([RewardPart("r", functools.partial(scaled, scale=2.0))])
    total = rewards(COMPLETIONS, RECORDS)
    with pytest.raises(RewardError) as caught:
        rewards.filter_values(total)
    assert "it is 2 for the row with completion '#### 3', question 'q0': set grpo.filter_reward" in str(caught.value)


def test_the_filters_range_error_names_the_completion_of_rewards_shuffled_and_in_float32() -> None:
    # grpo.shuffle_rewards hands the filter the totals shuffled within groups, as float32 values: the index of the
    # value is not its completion's
    rewards = Rewards([RewardPart("r", lambda c, r: [0.5, 1.1])])
    total = rewards(COMPLETIONS, RECORDS)
    with pytest.raises(RewardError, match=r"it is 1\.1 for the row with completion '#### 5', question 'q1'"):
        rewards.filter_values([1.100000023841858, total[0]])


def test_rollouts_collected_from_python_with_a_function_that_returns_none(tokenizer) -> None:
    # the trainer passes a Rewards, which turns a None into 0; a plain function's None gave torch's TypeError
    from dgrpo.perturbation import LockedDropout, seeds_for
    from dgrpo.training.rollouts import collect_rollouts

    from conftest import make_lm

    lm = make_lm(tokenizer).eval()
    kw: dict[str, Any] = dict(group_size=2, n_latent=1, perturbation=LockedDropout(p=0.1), seeds=seeds_for(0, 0, 0, 4))
    with pytest.warns(UserWarning, match=r"every reward \(none_everywhere\) returned None or NaN"):
        ro = collect_rollouts(lm, RECORDS, max_new_tokens=2, reward_fn=none_everywhere, **kw)
    assert ro.rewards.tolist() == [[0.0, 0.0], [0.0, 0.0]]
    with pytest.raises(RewardError, match=r"^reward <lambda> returned 'x' for row 0 .*: a string, not a number"):
        collect_rollouts(lm, RECORDS, max_new_tokens=2, reward_fn=lambda c, r: cast(Any, ["x"] * len(c)), **kw)


def test_a_plugin_reward_recorded_by_an_earlier_dgrpo_is_the_same_reward_on_resume() -> None:
    # earlier versions recorded a plug-in file's function under its module's name (a digest of the file's path): a
    # run started then would be refused on resume as trained with another reward
    from dgrpo.training.resume_check import recorded_changes, same_reward

    earlier = ["r = dgrpo_plugin_my_rewards_0123456789ab.reward * 1", "n = dgrpo.eval.scoring.numeric * 0.5"]
    now = ["r = my_rewards.py:reward * 1", "n = dgrpo.eval.scoring.numeric * 0.5"]
    assert same_reward(earlier, now)
    assert recorded_changes({"reward": earlier}, "", now) == []
    assert not same_reward(earlier, ["r = other_rewards.py:reward * 1", now[1]])
    assert not same_reward(["r = partial(m.f) * 1"], ["r = partial(m.f, scale=2.0) * 1"])
