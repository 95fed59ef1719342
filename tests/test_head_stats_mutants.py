"""The head statistics' formulas, pinned without compiling (gaps found by mutation testing of
dgrpo.model.head_stats): the fused forms against the eager ones and against hand-computed values, fp32 from bf16
logits, and what ``HeadStats`` returns with and without the entropy."""

from __future__ import annotations

import math

import pytest
import torch

from dgrpo.model import head_stats
from dgrpo.model.head_stats import (
    HeadStats,
    eager_greedy,
    eager_target_logprobs,
    fused_greedy_stats,
    fused_target_logprobs,
)

#: two rows whose softmax is known: [0, 0, ln 2] -> (1/4, 1/4, 1/2); [10, 0, 0, 0]-like with a large offset
LOGITS = torch.tensor([[0.0, 0.0, math.log(2.0), -math.inf], [100.0, 100.0, 100.0, 100.0]])


def test_target_logprobs_by_hand_eager_and_fused():
    """log p of the targets: ln(1/4), ln(1/2) in row 0's distribution, ln(1/4) in the uniform row (large logits:
    the max is taken out, not exp(100))."""
    targets = torch.tensor([[0, 2], [3, 1]])
    logits = LOGITS[:, None, :].expand(2, 2, 4)
    want = torch.tensor([[math.log(0.25), math.log(0.5)], [math.log(0.25), math.log(0.25)]])
    for fn in (eager_target_logprobs, fused_target_logprobs):
        got = fn(logits, targets)
        assert got.shape == (2, 2) and torch.allclose(got, want, atol=1e-6), (fn.__name__, got)


def test_greedy_stats_by_hand_eager_and_fused():
    """Row 0: the greedy token 2, log p = ln(1/2), entropy = -(2 * 1/4 ln 1/4 + 1/2 ln 1/2) = 1.5 ln 2; the uniform
    row over 4: log p = -ln 4, entropy = ln 4 (its greedy token: the first of the ties)."""
    lp_want = torch.tensor([math.log(0.5), -math.log(4.0)])
    ent_want = torch.tensor([1.5 * math.log(2.0), math.log(4.0)])
    logits = torch.nan_to_num(LOGITS, neginf=-1e4)  # (a finite floor: 0 * -inf would be nan in the eager entropy)
    tokens, lp, ent = eager_greedy(logits, True)
    assert tokens.tolist() == [2, 0] and torch.allclose(lp, lp_want, atol=1e-6) and torch.allclose(ent, ent_want)
    assert eager_greedy(logits, False)[2] is None and torch.equal(eager_greedy(logits, False)[1], lp)
    flp, fent = fused_greedy_stats(logits)
    assert torch.allclose(flp, lp_want, atol=1e-6) and torch.allclose(fent, ent_want, atol=1e-6)


def test_the_statistics_of_bf16_logits_are_fp32_and_the_fused_forms_agree_on_random_rows():
    """bf16 logits: fp32 results, eager and fused within float rounding of each other."""
    torch.manual_seed(0)
    logits = (torch.randn(5, 300) * 4).to(torch.bfloat16)
    targets = torch.randint(0, 300, (5,))
    lp = eager_target_logprobs(logits, targets)
    assert lp.dtype == torch.float32 and torch.allclose(fused_target_logprobs(logits, targets), lp, atol=1e-5)
    _, glp, ent = eager_greedy(logits, True)
    flp, fent = fused_greedy_stats(logits)
    assert glp.dtype == ent.dtype == flp.dtype == fent.dtype == torch.float32
    assert torch.allclose(flp, glp, atol=1e-5) and torch.allclose(fent, ent, atol=1e-5)


@pytest.mark.parametrize("with_entropy", [True, False])
def test_head_stats_with_its_fused_forms_returns_eagers_tokens_and_the_entropy_only_when_asked(
    monkeypatch, with_entropy
):
    """``HeadStats(compiled=True)`` with ``torch.compile`` as the identity (the fused forms run eagerly): eager's
    argmax tokens, the fused log-prob, and the entropy only with ``with_entropy``."""
    monkeypatch.setattr(head_stats.torch, "compile", lambda fn, **kw: fn)
    stats = HeadStats(compiled=True)
    assert stats.compiled
    torch.manual_seed(1)
    logits = torch.randn(3, 40)
    tokens, lp, ent = stats.greedy(logits, with_entropy)
    want = eager_greedy(logits, with_entropy)
    assert torch.equal(tokens, want[0]) and torch.allclose(lp, want[1], atol=1e-6)
    assert (ent is None) is (not with_entropy)
    if with_entropy:
        assert torch.allclose(ent, want[2], atol=1e-6)
    targets = torch.tensor([0, 5, 39])
    assert torch.allclose(stats.target_logprobs(logits, targets), eager_target_logprobs(logits, targets), atol=1e-6)
