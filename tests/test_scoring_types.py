"""What a reward or scorer may be: every form :func:`call_checked` takes is a ``ScoreFn`` to mypy (these bodies are
annotated, so ``mypy`` checks them: an ``async def`` or a TRL-style reward, a NumPy array's or a tensor's return,
were type errors where a train_grpo(reward_fn=...) or Rewards took them)."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
import torch

from dgrpo.data.records import Record
from dgrpo.eval.scoring import RewardError, RewardPart, Rewards, ScoreFn, call_checked, numeric


def _dgrpo(completions: list[str], records: list[Record]) -> list[float]:
    return numeric(completions, records)


async def _async_dgrpo(completions: list[str], records: list[Record]) -> list[float]:
    await asyncio.sleep(0)
    return numeric(completions, records)


def _trl(completions: list[str], answer: list[str], **kwargs: object) -> list[bool]:
    return [c == f"#### {a}" for c, a in zip(completions, answer)]


async def _async_trl(completions: list[str], **kwargs: list[str]) -> list[int]:
    return [int(c == f"#### {a}") for c, a in zip(completions, kwargs["answer"])]


def _array(completions: list[str], records: list[Record]) -> np.ndarray:
    return np.array(numeric(completions, records), dtype=np.float32)


def _tensor(completions: list[str], records: list[Record]) -> torch.Tensor:
    return torch.tensor(numeric(completions, records))


def test_every_form_a_checked_call_takes_is_a_score_fn() -> None:
    """Sync and async, dgrpo's form and TRL's, a list, an array or a tensor of values: each is a ScoreFn, called
    and checked alike, alone or as a weighted part of Rewards."""
    forms: list[ScoreFn] = [_dgrpo, _async_dgrpo, _trl, _async_trl, _array, _tensor]
    records = [Record("q1", [], "1"), Record("q2", [], "2")]
    for fn in forms:
        assert call_checked(fn, fn.__name__, ["#### 1", "#### 3"], records) == [1.0, 0.0], fn.__name__
    rewards = Rewards([RewardPart("a", _async_dgrpo), RewardPart("t", _async_trl, 0.5)])
    assert rewards(["#### 1", "#### 2"], records) == [1.5, 1.5]


def test_a_string_for_a_number_is_named_as_one() -> None:
    """A judge's reply returned as it came (``'1'``) read "returned '1' for row 0" and no more: it says it is a
    string."""

    def judge(completions: list[str], records: list[Record]) -> Any:  # (no ScoreFn to mypy: it returns strings)
        return ["1" for _ in completions]

    with pytest.raises(RewardError, match=r"returned '1' for row 0 \(completion '#### 1'.*\): a string, not a number"):
        call_checked(judge, "judge", ["#### 1"], [Record("q1", [], "1")])
