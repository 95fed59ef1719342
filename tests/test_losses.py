"""The paper's math as pure functions, checked against hand-computed values."""

import math

import pytest
import torch

from dgrpo.training.losses import (
    GlobalCounts,
    ObjectiveSettings,
    aggregate,
    clipped_surrogate,
    ema_advantages,
    ema_update,
    group_advantages,
    group_filter,
    grpo_objective,
    huber_k3,
    k3,
    kl_log_ratio,
)
from dgrpo.training.schedules import beta_at, lr_at


def test_advantages_hand_computed():
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
    assert torch.allclose(
        group_advantages(r, "drgrpo"), torch.tensor([[0.5, -0.5, -0.5, 0.5], [0.25, 0.25, 0.25, -0.75]])
    )
    g = group_advantages(r, "grpo", eps=0.0)  # population std: 0.5 and sqrt(3)/4
    assert torch.allclose(g[0], torch.tensor([1.0, -1.0, -1.0, 1.0]))
    assert torch.allclose(g[1], torch.tensor([0.25, 0.25, 0.25, -0.75]) / (math.sqrt(3) / 4))
    # RLOO: r minus the mean of the other three
    assert torch.allclose(group_advantages(r, "rloo")[0], torch.tensor([1 - 1 / 3, 0 - 2 / 3, 0 - 2 / 3, 1 - 1 / 3]))
    assert torch.equal(group_advantages(torch.ones(2, 4), "drgrpo"), torch.zeros(2, 4))


@pytest.mark.parametrize("kind", ["drgrpo", "grpo", "rloo"])
def test_a_group_of_equal_rewards_has_advantages_of_exactly_zero(kind):
    """A group whose K rewards are all equal (deterministic rollouts, a partial-credit reward) carries no signal: its
    advantages are exactly 0, whatever the value and K. In float32 the mean of eight 0.1 is 0.1 + 7e-9: advantages of
    ~1e-8, a gradient Adam scaled up to a third of a full step."""
    for k in (3, 7, 8, 32):
        for v in (0.1, 0.3, 0.7, 1 / 3, 2.2):
            for groups in (1, 4):
                rewards = torch.full((groups, k), v)
                adv = group_advantages(rewards, kind)
                assert adv.dtype == rewards.dtype and torch.equal(adv, torch.zeros_like(rewards)), (k, v, groups)


def test_ema_baseline_update():
    assert ema_update(0.5, torch.tensor([[1.0], [0.0], [1.0], [1.0]]), 0.95) == pytest.approx(0.95 * 0.5 + 0.05 * 0.75)
    adv = ema_advantages(torch.tensor([[1.0], [0.0], [1.0]]), 0.25)  # A = r - b, the baseline before this step's update
    assert torch.equal(adv, torch.tensor([[0.75], [-0.25], [0.75]]))


def test_clipped_surrogate_asymmetric_clip():
    old = torch.zeros(1, 4)
    logp = torch.log(torch.tensor([[1.2, 0.8, 0.8, 1.2]]))
    for adv, expect, low, high in [
        (1.0, [1.12, 0.8, 0.8, 1.12], [False] * 4, [True, False, False, True]),
        (-1.0, [-1.2, -0.9, -0.9, -1.2], [False, True, True, False], [False] * 4),
    ]:
        obj, ratio, lo, hi = clipped_surrogate(logp, old, torch.tensor([adv]), 0.10, 0.12)
        assert torch.allclose(obj, torch.tensor([expect]), atol=1e-6)
        assert lo.tolist() == [low] and hi.tolist() == [high]
    # at theta = theta_old the ratio is exactly 1 and the gradient is A * grad log pi
    lp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    obj, ratio, _, _ = clipped_surrogate(lp, lp.detach(), torch.tensor([0.5]), 0.1, 0.12)
    assert torch.equal(ratio, torch.ones(1, 2))
    obj.sum().backward()
    assert torch.allclose(lp.grad, torch.tensor([[0.5, 0.5]]))


def test_aggregation_modes():
    x = torch.tensor([[1.0, 2.0, 5.0], [3.0, 7.0, 7.0]])
    m = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert aggregate(x, m, "seq_mean", 2, 3, 3).item() == pytest.approx((1.5 + 3.0) / 2)
    assert aggregate(x, m, "token_mean", 2, 3, 3).item() == pytest.approx(6.0 / 3)
    assert aggregate(x, m, "constant", 2, 3, 3).item() == pytest.approx(6.0 / 6)
    # global normalisers: two halves add up to the whole
    whole = aggregate(x, m, "seq_mean", 2, 3, 3)
    halves = aggregate(x[:1], m[:1], "seq_mean", 2, 3, 3) + aggregate(x[1:], m[1:], "seq_mean", 2, 3, 3)
    assert torch.allclose(whole, halves)


def test_huber_k3_properties():
    d = 5.0
    x = torch.linspace(-d, d, 101)
    assert torch.allclose(huber_k3(x, d), k3(x))  # equals k3 inside
    grid = torch.linspace(-40, 40, 4001)
    assert (huber_k3(grid, d) >= 0).all()
    for b in (d, -d):  # value and slope continuous at the bounds
        lo = torch.tensor(b - 1e-4, dtype=torch.float64, requires_grad=True)
        hi = torch.tensor(b + 1e-4, dtype=torch.float64, requires_grad=True)
        vl, vh = huber_k3(lo, d), huber_k3(hi, d)
        assert abs(vl.item() - vh.item()) < 0.05
        gl = torch.autograd.grad(vl, lo)[0].item()
        gh = torch.autograd.grad(vh, hi)[0].item()
        assert abs(gl - gh) < 0.05 * max(1.0, abs(gl))
    far = torch.tensor([10.0, -10.0], requires_grad=True)
    huber_k3(far, d).sum().backward()
    assert far.grad[0].item() == pytest.approx(math.exp(5) - 1, rel=1e-5)
    assert far.grad[1].item() == pytest.approx(math.exp(-5) - 1, rel=1e-5)
    assert huber_k3(torch.tensor(d), d).item() == pytest.approx(math.exp(d) - d - 1, rel=1e-6)
    # outside the bounds, by hand: (e^5 - 1) * 2 + (e^5 - 5 - 1) at x = 7; (e^-5 - 1) * -2 + (e^-5 + 5 - 1) at x = -7
    out = huber_k3(torch.tensor([7.0, -7.0], dtype=torch.float64), d)
    assert out.tolist() == pytest.approx([437.2394766, 5.9932621], rel=1e-8)


def test_kl_forms():
    lp, ref = torch.tensor([-1.0]), torch.tensor([-2.0])
    assert kl_log_ratio(lp, ref, "unbiased").item() == -1.0
    assert kl_log_ratio(lp, ref, "paper").item() == 1.0
    # the unbiased form estimates KL(pi || ref): exact check on a 2-outcome distribution
    p, q = torch.tensor([0.7, 0.3]), torch.tensor([0.4, 0.6])
    est = (p * k3(kl_log_ratio(p.log(), q.log(), "unbiased"))).sum()
    assert est.item() == pytest.approx((p * (p / q).log()).sum().item(), rel=1e-6)


def test_group_filter_inclusive_and_whole_groups():
    K = 20
    acc = [0, 3, 4, 10, 19, 20]  # mean 0, .15, .20, .50, .95, 1.0
    r = torch.stack([torch.tensor([1.0] * a + [0.0] * (K - a)) for a in acc])
    keep = group_filter(r, 0.20, 0.95)
    assert keep.tolist() == [False, False, True, True, True, False]
    rows = keep.repeat_interleave(K).nonzero().flatten()
    assert rows.numel() == 3 * K and set((rows // K).tolist()) == {2, 3, 4}


def test_group_filter_keeps_a_group_of_equal_rewards_at_either_bound():
    """The window is closed for rewards that are not 0 or 1 too (a weighted or partial-credit reward): a group of K
    rewards all equal to a bound is kept (the float32 mean of eight 0.2 was below 0.2: dropped by [0.2, 0.95]); a
    binary group at k / K still is, and a bound just past the accuracy still drops it."""
    for k in (3, 5, 8, 16, 32):
        for v in (0.1, 0.2, 0.3, 0.7, 0.95):
            for groups in (1, 3):
                rewards = torch.full((groups, k), v)
                assert bool(group_filter(rewards, v, 1.0).all()) and bool(group_filter(rewards, 0.0, v).all()), (k, v)
        for right in range(k + 1):
            binary = torch.tensor([[1.0] * right + [0.0] * (k - right)])
            assert bool(group_filter(binary, right / k, right / k).all())
            assert not bool(group_filter(binary, right / k + 1e-6, 1.0).any())
    assert not group_filter(torch.zeros(2, 8), 1e-9, 1.0).any()  # (a margin of 1e-9 kept these)
    assert not group_filter(torch.full((2, 8), 1e-9), 0.0, 5e-10).any()


def test_schedules_eq7():
    peak, total, warm = 1e-5, 110, 10
    assert lr_at(0, peak, total, warm) == pytest.approx(1e-6)
    assert lr_at(9, peak, total, warm) == pytest.approx(peak)
    assert lr_at(10, peak, total, warm) == pytest.approx(peak)
    assert lr_at(60, peak, total, warm) == pytest.approx(peak / 2)
    assert lr_at(110, peak, total, warm) == pytest.approx(0.0, abs=1e-15)
    with pytest.raises(ValueError, match="step counts optimizer steps from 0, got -5"):
        lr_at(-5, peak, total, warm)
    for s in (0, 5, 10, 60, 100):
        assert beta_at(s, 5e-3, peak, total, warm) == pytest.approx(5e-3 * lr_at(s, peak, total, warm) / peak)
    # a floor: the cosine decays to min_ratio * peak (half-way: 0.1 + 0.9 / 2 of peak)
    assert lr_at(60, peak, total, warm, min_ratio=0.1) == pytest.approx(0.55 * peak)
    assert lr_at(110, peak, total, warm, min_ratio=0.1) == pytest.approx(0.1 * peak)
    assert beta_at(110, 5e-3, peak, total, warm, min_ratio=0.1) == pytest.approx(5e-4)
    with pytest.raises(ValueError, match="peak_lr must be > 0"):
        beta_at(0, 5e-3, 0.0, total, warm)


def test_the_grpo_schedule_options_say_what_the_last_step_and_the_mini_epochs_get():
    """grpo.min_lr_ratio was documented as 'final lr as a fraction of the peak', but the floor is reached at step
    grpo.steps, one past the last (5 steps, warmup 2, ratio 0.1: the last lr is 0.325 of the peak); grpo.steps was
    'optimizer steps', but each GRPO step takes grpo.mini_epochs of them, all at that step's lr and beta."""
    import dataclasses

    from dgrpo.config import GRPOConfig

    doc = {f.name: f.metadata["doc"] for f in dataclasses.fields(GRPOConfig)}
    peak, steps, warm, r = 1e-4, 5, 2, 0.1
    last = lr_at(steps - 1, peak, steps, warm, r)
    assert last == pytest.approx(0.325 * peak)  # not r * peak
    assert last - r * peak == pytest.approx((1 - r) * peak * (1 - math.cos(math.pi / (steps - warm))) / 2)
    assert "final lr" not in doc["min_lr_ratio"] and "one past the last" in doc["min_lr_ratio"]
    assert not doc["steps"].startswith("optimizer steps") and "grpo.mini_epochs optimizer steps" in doc["steps"]
    assert "one optimizer step each at the step's lr" in doc["mini_epochs"]


def test_the_objective_with_its_kl_term_by_hand():
    """Algorithm 1, line 5 with a reference: -seq_mean(surrogate) + beta * seq_mean(Huberized k3), at theta_old
    (ratios 1). x = log pi_ref - log pi_theta = [-0.5, 1.0]; k3 = [e^-0.5 - 0.5, e - 2] = [0.1065307, 0.7182818]."""
    logp, ref = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -1.0]])
    mask, counts = torch.ones(1, 2), GlobalCounts(1, 2, 2)
    loss, stats = grpo_objective(
        logp, logp, torch.tensor([0.5]), mask, counts, ObjectiveSettings(), ref_logp=ref, beta=0.1
    )
    assert float(stats.policy_loss) == pytest.approx(-0.5) and float(stats.kl) == pytest.approx(0.4124063, rel=1e-6)
    assert loss.item() == pytest.approx(-0.5 + 0.1 * 0.4124063, rel=1e-6)
    # delta = 0.5: x = 1.0 lies outside, on the line (e^0.5 - 1)(x - 0.5) + (e^0.5 - 1.5) = 0.4730819
    narrow = ObjectiveSettings(huber_delta=0.5)
    loss, stats = grpo_objective(logp, logp, torch.tensor([0.5]), mask, counts, narrow, ref_logp=ref, beta=0.1)
    assert float(stats.kl) == pytest.approx((0.1065307 + 0.4730819) / 2, rel=1e-6)
    with pytest.raises(ValueError, match="unknown aggregation 'mean'; expected one of seq_mean"):
        ObjectiveSettings(aggregation="mean")
    with pytest.raises(ValueError, match="unknown KL form 'k3'"):
        ObjectiveSettings(kl_form="k3")


def test_shuffle_within_groups_keeps_each_groups_rewards_and_is_seeded():
    from dgrpo.training.losses import shuffle_within_groups

    r = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.5]])
    seeds = torch.tensor([3, 4])
    a, b = shuffle_within_groups(r, seeds), shuffle_within_groups(r, seeds)
    assert torch.equal(a, b)  # a pure function of the seeds
    for g in range(2):
        assert sorted(a[g].tolist()) == sorted(r[g].tolist())  # the same rewards, permuted
    assert torch.equal(a.mean(-1), r.mean(-1))  # so the filter decides the same
    moved = [not torch.equal(shuffle_within_groups(r, torch.tensor([s, s]))[0], r[0]) for s in range(20)]
    assert any(moved) and not all(moved)  # the permutation varies with the seed (the identity is one of them)


def test_the_objective_and_its_stats_need_no_host_synchronisation():
    """torch.compile(fullgraph=True) refuses a graph break (``.item()``, ``float()``, a data-dependent shape): the
    objective and all its diagnostics trace whole, so a micro-batch asks the host nothing; a step reads them once
    (``as_dict``). Traced and eager agree, and a row without valid tokens leaves the ratio extremes at 1."""
    from dgrpo.training.losses import GlobalCounts, ObjectiveSettings, ObjectiveStats, grpo_objective

    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(0)
    logp = -torch.rand(3, 5, generator=gen)
    old = logp + 0.2 * torch.randn(3, 5, generator=gen)
    ref = logp + 0.1 * torch.randn(3, 5, generator=gen)
    adv, mask = torch.tensor([1.0, -0.5, 0.25]), torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    counts, settings = GlobalCounts(3.0, 9.0, 5), ObjectiveSettings(kl_form="paper")

    def run(lp, m):
        return grpo_objective(lp, old, adv, m, counts, settings, ref_logp=ref, beta=0.01)

    traced = torch.compile(run, fullgraph=True, backend="eager")
    for m in (mask, torch.zeros_like(mask)):
        (loss_a, st_a), (loss_b, st_b) = run(logp, m), traced(logp, m)
        assert torch.allclose(loss_a, loss_b)
        assert st_a.as_dict() == pytest.approx(st_b.as_dict())
    torch._dynamo.reset()
    assert st_a.as_dict()["ratio_max"] == 1.0 and st_a.as_dict()["ratio_min"] == 1.0  # (the all-masked batch)
    total = ObjectiveStats()
    for m in (mask, mask):
        total.add(run(logp, m)[1])
    one = run(logp, mask)[1].as_dict()
    both = total.as_dict()
    assert both["policy_loss"] == pytest.approx(2 * one["policy_loss"]) and both["ratio_max"] == one["ratio_max"]
    ratio = (logp - old).exp()[mask.bool()]
    assert one["ratio_max"] == pytest.approx(float(ratio.max()))
    assert one["ratio_min"] == pytest.approx(float(ratio.min()))
    assert both["ratio_min"] == pytest.approx(min(1.0, float(ratio.min())))  # the running extremes start at 1


def test_the_objective_refuses_shapes_that_would_broadcast_into_a_wrong_loss():
    """Advantages per token or as a column, log-probs of one row, a mask of one column: each would broadcast and
    give another loss than the rollouts' (hand value here: -0.5 for advantages [2, -1] at ratio 1)."""
    z, ones, counts = torch.zeros(2, 3), torch.ones(2, 3), GlobalCounts(2.0, 6.0, 3)
    loss, _ = grpo_objective(z, z, torch.tensor([2.0, -1.0]), ones, counts, ObjectiveSettings())
    assert loss.item() == pytest.approx(-0.5)
    bad = {
        "adv": dict(adv=torch.tensor([[2.0] * 3, [-1.0] * 3])),
        "adv ": dict(adv=torch.tensor([[2.0], [-1.0]])),
        "adv  ": dict(adv=torch.tensor([2.0])),
        "old_logp": dict(old_logp=torch.zeros(1, 3)),
        "mask": dict(mask=torch.ones(2, 1)),
        "ref_logp": dict(ref_logp=torch.zeros(1, 3)),
    }
    for name, over in bad.items():
        args = {"logp": z, "old_logp": z, "adv": torch.tensor([2.0, -1.0]), "mask": ones, "ref_logp": z, **over}
        with pytest.raises(ValueError, match=f"grpo_objective: {name.strip()}"):
            grpo_objective(**args, counts=counts, settings=ObjectiveSettings(), beta=0.1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_largest_huber_delta_the_config_takes_gives_finite_gradients(dtype):
    """grpo.huber_delta 100 (meant: no Huberization) gave NaN gradients on every token: the continuation's slope
    e^delta - 1 is inf in float32 and 0 * inf is NaN in the backward of the branch not taken. The config now takes
    at most 50, where k3 is unchanged."""
    from dgrpo.config import MAX_HUBER_DELTA, Config, ConfigError, load_config

    x = torch.tensor([-3.0, -0.3, 0.0, 0.2, 4.0], dtype=dtype, requires_grad=True)
    huber_k3(x, MAX_HUBER_DELTA).sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    assert torch.allclose(huber_k3(x.detach().float(), MAX_HUBER_DELTA), k3(x.detach().float()))
    with pytest.raises(ConfigError, match="grpo.huber_delta: at most 50"):
        load_config(Config, None, ["grpo.huber_delta=89"])


def test_k3_near_zero_is_accurate_and_never_negative():
    """A policy close to its reference (the first steps, a step after a renewal) has per-token log-ratios ~1e-4:
    k3 is then ~x^2 / 2 ~ 5e-9, below float32's rounding of exp(x) (~6e-8); computed as exp(x) - x - 1 it was that
    rounding, negative for some x (a logged `kl` of -1.3e-9, where metrics.md promises >= 0)."""
    x64 = torch.tensor([1e-4, -1e-4, 3e-4, -7e-4, 2e-3, -5e-3], dtype=torch.float64)
    exact = x64.exp() - x64 - 1
    tiny = torch.linspace(-1e-3, 1e-3, 2001)
    for fn in (k3, huber_k3):
        assert torch.allclose(fn(x64.float()).double(), exact, rtol=1e-3, atol=0)
        assert (fn(tiny) >= 0).all()


def test_the_default_advantage_is_dr_grpo_and_the_grpo_eps_is_added_to_the_std():
    """Sec. 3.1 / Algorithm 1 line 3: the default advantage is A = r - mu_r (Dr. GRPO), not GRPO's; GRPO's is
    (r - mu_r) / (sigma_r + eps) with the population sigma_r: for [1, 0, 0, 1], sigma = 0.5, so A = +-0.5 / (0.5 + eps):
    +-0.5 / 0.5001 at the default eps = 1e-4, +-0.5 at eps = 0.5. RLOO is undefined for K = 1 (no other rollout)."""
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
    assert torch.equal(group_advantages(r), group_advantages(r, "drgrpo"))
    sign = torch.tensor([1.0, -1.0, -1.0, 1.0])
    assert torch.allclose(group_advantages(r, "grpo")[0], sign * (0.5 / 0.5001), rtol=1e-7, atol=0)
    assert torch.allclose(group_advantages(r, "grpo", eps=0.5)[0], sign * 0.5, rtol=1e-7, atol=0)
    with pytest.raises(ValueError, match="RLOO needs K >= 2"):
        group_advantages(torch.ones(3, 1), "rloo")


def test_shuffle_within_groups_draws_each_groups_permutation_from_its_own_seed():
    """The null control permutes group g by torch.randperm(K) under a generator seeded with seeds[g] (and no other):
    seed 3 gives [2, 3, 1, 0] and seed 4 gives [2, 1, 3, 0], so two groups with those seeds move differently."""
    from dgrpo.training.losses import shuffle_within_groups

    r = torch.tensor([[10.0, 11.0, 12.0, 13.0], [20.0, 21.0, 22.0, 23.0]])
    out = shuffle_within_groups(r, torch.tensor([3, 4]))
    assert out.tolist() == [[12.0, 13.0, 11.0, 10.0], [22.0, 21.0, 23.0, 20.0]]


def test_the_clip_at_its_exact_bounds_or_at_zero_advantage_clips_nothing():
    """Eq. 1 with eps_low = eps_high = 0.25 (bounds 0.75 and 1.25, exact in float32): a ratio *on* a bound is not
    clipped (the clip's value equals the ratio; the gradient A * rho flows), only one past it is (0.5 with A < 0,
    2.0 with A > 0: gradient 0). A token of A = 0 is never counted as clipped: neither branch of the min is active."""
    logp = torch.log(torch.tensor([[0.75, 1.25, 0.5, 2.0]])).requires_grad_(True)
    old = torch.zeros(1, 4)
    for adv, low, high, grad in [
        (-1.0, [False, False, True, False], [False] * 4, [-0.75, -1.25, 0.0, -2.0]),
        (1.0, [False] * 4, [False, False, False, True], [0.75, 1.25, 0.5, 0.0]),
        (0.0, [False] * 4, [False] * 4, [0.0] * 4),
    ]:
        obj, ratio, lo, hi = clipped_surrogate(logp, old, torch.tensor([adv]), 0.25, 0.25)
        assert ratio.tolist() == [[0.75, 1.25, 0.5, 2.0]]  # the bounds hit exactly
        assert lo.tolist() == [low] and hi.tolist() == [high], adv
        (g,) = torch.autograd.grad(obj.sum(), logp)
        assert torch.allclose(g, torch.tensor([grad])), adv


def test_the_objective_without_its_kl_term_and_masked_tokens_clipped_below():
    """Algorithm 1, line 5 with beta = 0: no KL term even with a reference (stats.kl stays 0; the loss is the
    surrogate's, -min(0.8 * -1, 0.9 * -1) = 0.9 for ratios [0.8, 0.5] with A = -1 and the second token masked); the
    masked token below 1 - eps_low (ratio 0.5, A < 0) is not counted in clip_frac_low (the first, 0.8, is: 1 of 1
    token), and the stats carry no autograd graph."""
    logp = torch.log(torch.tensor([[0.8, 0.5]])).requires_grad_(True)
    old, mask, counts = torch.zeros(1, 2), torch.tensor([[1.0, 0.0]]), GlobalCounts(1, 1, 2)
    loss, stats = grpo_objective(
        logp, old, torch.tensor([-1.0]), mask, counts, ObjectiveSettings(), ref_logp=old - 3.0, beta=0.0
    )
    assert loss.item() == pytest.approx(0.9) and float(stats.policy_loss) == pytest.approx(0.9)
    assert float(stats.kl) == 0.0
    assert float(stats.clip_frac_low) == 1.0 and float(stats.clip_frac_high) == 0.0
    assert isinstance(stats.policy_loss, torch.Tensor) and not stats.policy_loss.requires_grad


def test_the_schedules_refuse_step_minus_one_and_keep_the_floor_past_the_end():
    """Eq. 7's eta_t counts steps from 0 (step -1 is refused, not extrapolated); past total_steps the cosine stays at
    its floor min_ratio * peak (it does not come back up); Coconut's constant schedule reaches the peak at the step
    after its warmup: warmup 4 gives 0.25, 0.5, 0.75, 1, then 1."""
    from dgrpo.training.schedules import constant_lr_at

    with pytest.raises(ValueError, match="got -1"):
        lr_at(-1, 1.0, 10, 2)
    with pytest.raises(ValueError, match="got -1"):
        constant_lr_at(-1, 1.0, 2)
    assert lr_at(150, 1.0, 110, 10, min_ratio=0.1) == pytest.approx(0.1)
    assert [constant_lr_at(s, 1.0, 4) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


def test_objective_stats_add_up_over_micro_batches_and_take_the_later_mini_epochs_clipping():
    """A step's stats from its micro-batches (by hand): the loss, KL and clipped fractions are sums, the ratio extremes
    the max / min over all, starting from 1 (floats and device tensors alike); with E mini-epochs the clipped fractions
    are the mean of the E - 1 later ones (0.6 / 3 = 0.2) and the extremes theirs, with E = 1 nothing changes."""
    from dgrpo.training.losses import ObjectiveStats

    def parts(as_tensor: bool) -> list[ObjectiveStats]:
        rows = [(0.5, 0.25, 0.1, 0.2, 1.3, 0.9), (-0.25, 0.5, 0.05, 0.1, 1.1, 0.7)]
        wrap = (lambda v: torch.tensor(v, dtype=torch.float64)) if as_tensor else float
        return [ObjectiveStats(*(wrap(v) for v in row)) for row in rows]

    for as_tensor in (False, True):
        total = ObjectiveStats()
        for p in parts(as_tensor):
            total.add(p)
        expect = dict(policy_loss=0.25, kl=0.75, clip_frac_low=0.15, clip_frac_high=0.3, ratio_max=1.3, ratio_min=0.7)
        assert total.as_dict() == pytest.approx(expect), as_tensor
        inside = ObjectiveStats()
        inside.add(ObjectiveStats(ratio_max=torch.tensor(0.95), ratio_min=torch.tensor(1.05)))
        assert (inside.as_dict()["ratio_max"], inside.as_dict()["ratio_min"]) == (1.0, 1.0)  # the extremes start at 1
        later = ObjectiveStats(clip_frac_low=0.6, clip_frac_high=0.3, ratio_max=1.4, ratio_min=0.6)
        total.clipping_from(later, 0)
        assert total.as_dict() == pytest.approx(expect)
        total.clipping_from(later, 3)
        assert total.as_dict() == pytest.approx(
            {**expect, "clip_frac_low": 0.2, "clip_frac_high": 0.1, "ratio_max": 1.4, "ratio_min": 0.6}
        )


def test_the_objective_settings_take_each_grpo_option_by_name():
    """The trainer's loss knobs come from grpo.*: eps_low 0.05 and eps_high 0.2 (Eq. 1's lower and upper clip, not
    swapped), the aggregation, the KL form and delta (Eq. 6) each into its own field."""
    import dataclasses

    from dgrpo.config import GRPOConfig

    g = dataclasses.replace(
        GRPOConfig(), eps_low=0.05, eps_high=0.2, aggregation="token_mean", kl_form="paper", huber_delta=3.0
    )
    assert ObjectiveSettings.from_config(g) == ObjectiveSettings(0.05, 0.2, "token_mean", "paper", 3.0)
