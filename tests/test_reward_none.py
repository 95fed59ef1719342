"""TRL's None ("this reward does not apply to this completion") in rewards, taken as TRL's GRPOTrainer takes it: a
None or NaN adds nothing to the row's weighted total (its ``nansum``), a row where every reward gave one has total 0
and is warned of, the logged per-reward mean leaves it out (its ``nanmean``). It stopped a run at the first such row
(open-r1's accuracy_reward returns None for a gold it cannot parse)."""

from __future__ import annotations

import json
import math
import warnings
from typing import Any

import numpy as np
import pytest

from dgrpo.data.records import Record
from dgrpo.eval.scoring import RewardError, RewardPart, Rewards, call_checked

RECORDS = [Record(question=f"q{i}", steps=[], answer=str(i)) for i in range(4)]
COMPLETIONS = ["#### 0", "#### x", "#### 2", "####"]


def accuracy(completions: list[str], answer: list[str], **kwargs: Any) -> list[float | None]:
    """TRL's form: None where the completion has no answer to check ('x', or nothing)."""
    said = [c.removeprefix("####").strip() for c in completions]
    return [None if not s.isdigit() else float(s == a) for s, a in zip(said, answer)]


def fmt(completions: list[str], records: list[Record]) -> Any:
    """dgrpo's form, NumPy's NaN for "does not apply" (the last row)."""
    return np.array([1.0, 0.5, 0.0, np.nan])


def test_a_parts_none_or_nan_adds_nothing_to_the_weighted_total() -> None:
    rewards = Rewards([RewardPart("accuracy", accuracy, 2.0), RewardPart("fmt", fmt, 0.5)])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        total = rewards(COMPLETIONS, RECORDS)
    # TRL: (rewards_per_func * weights).nansum(dim=1); row 3 had None and NaN: 0
    assert total == [2.0 * 1 + 0.5 * 1.0, 0.5 * 0.5, 2.0 * 1 + 0.0, 0.0]
    assert rewards.last["accuracy"][:1] + rewards.last["accuracy"][2:3] == [1.0, 1.0]
    assert math.isnan(rewards.last["accuracy"][1]) and math.isnan(rewards.last["fmt"][3])
    assert len(caught) == 1  # the all-None row, once


def test_a_row_every_reward_gave_none_is_warned_of_once_naming_them_and_the_row() -> None:
    rewards = Rewards([RewardPart("accuracy", accuracy), RewardPart("fmt", fmt)])
    said = r"^every reward \(accuracy, fmt\) returned None or NaN \('does not apply'\) for row 3 \(completion '####'"
    with pytest.warns(UserWarning, match=said + r".*and 0 other row\(s\) .* total reward is 0, as TRL's nansum"):
        rewards(COMPLETIONS, RECORDS)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per run: the next batch's are not warned of again
        assert repr(rewards(COMPLETIONS, RECORDS)[3]) == "0.0"  # (a float, as every total)


def test_inf_and_a_scorers_none_stay_refused() -> None:
    with pytest.raises(RewardError, match=r"^reward inf returned inf for row 0"):
        call_checked(lambda c, r: [float("inf")] * 4, "inf", COMPLETIONS, RECORDS)
    said = r"returned None for row 1 \(completion '#### x', question 'q1'\): every completion needs a number in "
    with pytest.raises(RewardError, match=rf"^scorer accuracy {said}\[0, 1\]: return 0\.0 for one not correct$"):
        call_checked(accuracy, "accuracy", COMPLETIONS, RECORDS, "scorer")
    with pytest.raises(RewardError, match=r"^scorer fmt returned np.float64\(nan\) for row 3 .* finite number"):
        call_checked(fmt, "fmt", COMPLETIONS, RECORDS, "scorer")


def test_the_filters_reward_refuses_none_and_the_total_gives_it_0() -> None:
    rewards = Rewards([RewardPart("accuracy", accuracy, 0.5), RewardPart("fmt", fmt, 0.5)], filter_on="accuracy")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        total = rewards(COMPLETIONS, RECORDS)
    said = r"^grpo\.filter: the accuracy window applies to reward accuracy, which returned None or NaN .* for the "
    said += r"row with completion '#### x', question 'q1': "
    with pytest.raises(RewardError, match=said + r".*have accuracy return 0 or 1 for every completion, or set"):
        rewards.filter_values(total)
    rewards.filter_on = ""
    assert rewards.filter_values(total) == [1.0, 0.25, 0.5, 0.0]


@pytest.mark.slow
def test_a_run_trains_on_none_rewards_logging_their_means_and_counts(sft_checkpoint, tmp_path) -> None:
    """A two-part reward, one part None for some rollouts: the run trains (it stopped at the first None), each logged
    ``rollouts.jsonl`` row's reward is TRL's total of its parts (None: null there), and the step's
    ``reward/<name>`` is the mean over the rows that gave a number, ``frac_none/<name>`` their share."""
    from dgrpo.data.synthetic import generate_split
    from dgrpo.model.latent_lm import LatentLM
    from dgrpo.training.grpo import train_grpo

    from conftest import tiny_config

    def judge(completions: list[str], records: list[Record]) -> list[float | None]:
        return [None if sum(map(ord, r.answer)) % 2 else float(r.answer in c) for c, r in zip(completions, records)]

    def short(completions: list[str], records: list[Record]) -> list[float | None]:
        return [None if sum(map(ord, c)) % 3 == 0 else 1.0 / (1 + len(c)) for c in completions]

    over = {"grpo.steps": 2, "grpo.prompts_per_step": 4, "grpo.group_size": 4, "grpo.log_rollouts": 16}
    cfg = tiny_config(**over, **{"grpo.warmup_steps": 0, "grpo.eval_every": 0})
    from dgrpo.eval.scoring import SCORERS

    reward_parts = [
        RewardPart("judge", judge, 0.75),
        RewardPart("short", short, 0.25),
        RewardPart("numeric", SCORERS["numeric"], 0),
    ]
    rewards = Rewards(reward_parts)
    lm = LatentLM.from_pretrained(sft_checkpoint)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="every reward")
        train_grpo(lm, cfg, generate_split(cfg.task, "train"), tmp_path, reward_fn=rewards, progress=False, log=print)
    rows = [json.loads(line) for line in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "reward_mean" in m]
    assert len(steps) == 2 and len(rows) == 32
    for row in rows:
        assert row["judge"] == judge([row["completion"]], [Record("q", [], row["answer"])])[0]
        assert row["short"] == short([row["completion"]], [])[0]
        parts = [(0.75, row["judge"]), (0.25, row["short"])]
        assert row["reward"] == pytest.approx(sum(w * v for w, v in parts if v is not None), abs=1e-6)
    nones = [sum(row[name] is None for row in rows) for name in ("judge", "short")]
    assert all(0 < n < len(rows) for n in nones)  # (the test shows something: some rows of each kind)
    for i, m in enumerate(steps):
        step_rows = [r for r in rows if r["step"] == i]
        for name in ("judge", "short"):
            given = [r[name] for r in step_rows if r[name] is not None]
            assert m[f"frac_none/{name}"] == pytest.approx(1 - len(given) / 16)
            assert m[f"reward/{name}"] == (pytest.approx(sum(given) / len(given)) if given else None)
        assert m["reward_mean"] == pytest.approx(sum(r["reward"] for r in step_rows) / 16, abs=1e-6)
        assert "frac_none/numeric" not in m and "reward/numeric" in m  # (a built-in scorer scores every completion)
