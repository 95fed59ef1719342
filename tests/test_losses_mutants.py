"""Gaps found by mutation testing of dgrpo.training.losses and dgrpo.training.schedules: the guards of the public
functions (empty or all-masked batches, unknown names, a logp of the wrong rank); the step's global counts, masked
tokens in the stats, a single later mini-epoch, the EMA baseline; with values worked out by hand."""

import math

import pytest
import torch

from dgrpo.training.losses import GlobalCounts, ObjectiveSettings, aggregate, grpo_objective, kl_log_ratio


@pytest.mark.parametrize("kind", ["seq_mean", "token_mean", "constant"])
def test_an_aggregate_over_no_rollouts_and_no_tokens_is_zero_not_nan(kind):
    """Zero global counts (no rollout kept, no answer token) divide nothing: each aggregation of an empty batch is 0.0,
    never 0 / 0 = NaN (a NaN would reach the loss and the logged metrics)."""
    empty = torch.zeros(0, 3)
    out = aggregate(empty, empty, kind, 0, 0, 3)
    assert out.item() == 0.0


def test_an_all_masked_micro_batch_with_no_tokens_in_the_step_gives_zero_loss_and_clip_fractions():
    """A micro-batch whose tokens are all masked, in a step of 0 answer tokens: loss 0, KL 0, clipped fractions 0
    (not 0 / 0 = NaN), and the ratio extremes stay at 1 (no valid token to take them from), although the masked
    ratios are far outside the clip window (e^2 and e^-2, advantages +1 and -1)."""
    logp = torch.tensor([[2.0, 2.0, 2.0], [-2.0, -2.0, -2.0]])
    old, mask = torch.zeros(2, 3), torch.zeros(2, 3)
    loss, stats = grpo_objective(
        logp, old, torch.tensor([1.0, -1.0]), mask, GlobalCounts(2, 0, 3), ObjectiveSettings(), ref_logp=old, beta=0.1
    )
    assert loss.item() == 0.0
    got = stats.as_dict()
    assert got == {
        "policy_loss": 0.0,
        "kl": 0.0,
        "clip_frac_low": 0.0,
        "clip_frac_high": 0.0,
        "ratio_max": 1.0,
        "ratio_min": 1.0,
    }


def test_the_objective_refuses_log_probs_that_are_not_rollouts_by_tokens():
    """logp [N] (one log-prob per rollout, the sequence's sum) with old_logp, mask [N] and adv [N] would pass the
    shape comparisons and broadcast adv[:, None] into an [N, N] objective: refused by name."""
    lp = torch.zeros(2)
    with pytest.raises(ValueError, match=r"logp must be \[N, L\] \(rollouts x answer tokens\), got \(2,\)"):
        grpo_objective(lp, lp, torch.tensor([1.0, -1.0]), torch.ones(2), GlobalCounts(2, 2, 1), ObjectiveSettings())


def test_an_unknown_aggregation_or_kl_form_is_a_named_error_not_a_key_error():
    """The public helpers name the wrong value and the known ones (a KeyError 'mean' says neither)."""
    x = torch.ones(1, 2)
    with pytest.raises(ValueError, match="unknown aggregation 'mean'; expected one of seq_mean, token_mean, constant"):
        aggregate(x, x, "mean", 1, 2, 2)
    with pytest.raises(ValueError, match="unknown KL form 'k3'; expected one of unbiased, paper"):
        kl_log_ratio(x, x, "k3")


def test_the_loss_takes_the_log_probs_dtype_whatever_the_advantages_dtype():
    """Float64 advantages (a float64 reward) are cast to the log-probs' dtype before the surrogate: the loss of
    float32 log-probs is float32 (hand value at ratio 1: -(0.5 - 0.25) / 2 = -0.125)."""
    z = torch.zeros(2, 3)
    adv = torch.tensor([0.5, -0.25], dtype=torch.float64)
    loss, _ = grpo_objective(z, z, adv, torch.ones(2, 3), GlobalCounts(2, 6, 3), ObjectiveSettings())
    assert loss.dtype == torch.float32 and loss.item() == -0.125


def test_a_schedule_whose_warmup_is_the_whole_run_is_at_its_floor_from_total_steps_on():
    """lr_at's promise, cosine decay to min_ratio * peak at total_steps, holds when no step is left for the cosine
    (grpo.warmup_steps >= grpo.steps, which the config allows with a warning): warmup 4 of 4 steps, floor 0.1, gives
    0.25, 0.5, 0.75, 1, then 0.1 from step 4 on (it gave the peak again at step 4, a 0 / 0 span taken as 1); the
    same past the end of a run shorter than its warmup (2 steps, warmup 4: the ramp, then the floor 0). beta follows."""
    from dgrpo.training.schedules import beta_at, lr_at

    assert [lr_at(s, 1.0, 4, 4, min_ratio=0.1) for s in range(7)] == pytest.approx(
        [0.25, 0.5, 0.75, 1.0, 0.1, 0.1, 0.1]
    )
    assert [lr_at(s, 1.0, 2, 4) for s in range(6)] == pytest.approx([0.25, 0.5, 0.75, 1.0, 0.0, 0.0])
    assert [beta_at(s, 0.02, 2.0, 4, 4, min_ratio=0.1) for s in (3, 4)] == pytest.approx([0.02, 0.002])


def test_an_unknown_advantage_kind_is_a_named_error():
    """group_advantages takes drgrpo, grpo or rloo ('ema' is the trainer's K = 1 baseline, not a group advantage): any
    other name is refused, not returned as the raw rewards."""
    from dgrpo.training.losses import group_advantages

    with pytest.raises(ValueError, match="unknown advantage kind 'ema'; expected drgrpo, grpo or rloo"):
        group_advantages(torch.ones(2, 4), "ema")


def test_each_aggregation_divides_by_the_steps_global_counts_not_the_micro_batchs():
    """A micro-batch of one rollout (values 1, 3; a masked 100) in a step of 2 rollouts, 4 tokens, max_len 5:
    seq_mean (1 + 3) / 2 / 2 = 1, token_mean (1 + 3) / 4 = 1, constant (1 + 3) / (2 * 5) = 0.4; the micro-batch's
    own counts (1 rollout, 2 tokens) would give 2, 2 and 0.8, and the micro-batches of a step would not add up."""
    x, m = torch.tensor([[1.0, 3.0, 100.0]]), torch.tensor([[1.0, 1.0, 0.0]])
    got = [aggregate(x, m, kind, 2, 4, 5).item() for kind in ("seq_mean", "token_mean", "constant")]
    assert got == pytest.approx([1.0, 1.0, 0.4])


def test_clip_fractions_count_the_steps_tokens_and_ratio_extremes_skip_masked_tokens():
    """Two rollouts of 2 tokens, the second token of each masked (ratios e^-1 and e^1 there), in a step of 8 answer
    tokens: the valid ratios are e^0.5 (advantage +1, clipped high) and e^-0.5 (advantage -1, clipped low), so each
    clipped fraction is 1 / 8 (not 1 / 2, the micro-batch's own tokens) and the extremes are e^0.5 and e^-0.5, not the
    masked tokens' e^1 and e^-1."""
    logp = torch.tensor([[0.5, -1.0], [-0.5, 1.0]], dtype=torch.float64)
    old, mask = torch.zeros(2, 2, dtype=torch.float64), torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    _, stats = grpo_objective(logp, old, adv, mask, GlobalCounts(4, 8, 2), ObjectiveSettings())
    got = stats.as_dict()
    assert (got["clip_frac_low"], got["clip_frac_high"]) == (0.125, 0.125)
    assert (got["ratio_max"], got["ratio_min"]) == pytest.approx((math.exp(0.5), math.exp(-0.5)))


def test_one_later_mini_epoch_supplies_the_clipping_stats():
    """With two mini-epochs (one after the first, ``n_later`` = 1), the clipped fractions and ratio extremes are the
    later one's as they are (divided by 1), the loss and KL stay the first's."""
    from dgrpo.training.losses import ObjectiveStats

    first = ObjectiveStats(policy_loss=0.5, kl=0.25)
    first.clipping_from(ObjectiveStats(clip_frac_low=0.3, clip_frac_high=0.2, ratio_max=1.5, ratio_min=0.5), 1)
    assert first.as_dict() == {
        "policy_loss": 0.5,
        "kl": 0.25,
        "clip_frac_low": 0.3,
        "clip_frac_high": 0.2,
        "ratio_max": 1.5,
        "ratio_min": 0.5,
    }


def test_the_ema_baseline_moves_towards_the_mean_of_all_rewards():
    """b <- alpha b + (1 - alpha) mean(r) over every reward of the step, whatever the shape: rewards [[1, 0], [0, 0]]
    (mean 0.25) move a baseline of 0 with alpha 0.5 to 0.125 (not the first column's 0.5 / 2 = 0.25)."""
    from dgrpo.training.losses import ema_update

    assert ema_update(0.0, torch.tensor([[1.0, 0.0], [0.0, 0.0]]), 0.5) == 0.125


def test_the_kl_stat_is_detached_from_the_graph():
    """The logged KL (like the logged loss) holds no autograd graph: a step keeps its stats over micro-batches, and a
    stat with a graph would keep every micro-batch's activations alive until the step's end."""
    logp = torch.zeros(1, 2, requires_grad=True)
    _, stats = grpo_objective(
        logp,
        torch.zeros(1, 2),
        torch.tensor([1.0]),
        torch.ones(1, 2),
        GlobalCounts(1, 2, 2),
        ObjectiveSettings(),
        ref_logp=torch.full((1, 2), 0.5),
        beta=0.1,
    )
    assert isinstance(stats.kl, torch.Tensor) and not stats.kl.requires_grad
    assert isinstance(stats.policy_loss, torch.Tensor) and not stats.policy_loss.requires_grad
