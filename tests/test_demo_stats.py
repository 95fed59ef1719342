"""The demo's statistics and claim resolution pinned where a mutation test of demo/stats.py found gaps: Student's t
against its closed forms (df 1, 2 and 3), a paired comparison over 3 SFT seeds x 2 RL seeds of 5 items computed by
hand, the verdicts' ties at 0, and each claim resolved on its own pair of arms, checkpoint and split."""

import math

import pytest

from dgrpo.demo import claim_verdicts, compare, exact_verdict, flips, mean_ci, t_quantile, verdict
from dgrpo.demo.stats import betainc, t_cdf

T, F = True, False


def closed_cdf(t: float, df: int) -> float:
    """Student's t CDF in closed form for df 1 (Cauchy), 2 and 3."""
    if df == 1:
        return 0.5 + math.atan(t) / math.pi
    if df == 2:
        return 0.5 + t / (2.0 * math.sqrt(2.0 + t * t))
    u = t / math.sqrt(3.0)
    return 0.5 + (u / (1.0 + u * u) + math.atan(u)) / math.pi


@pytest.mark.parametrize("df", [1, 2, 3])
@pytest.mark.parametrize("t", [-25.0, -2.5, -0.3, 0.0, 0.05, 0.3, 1.7, 4.0, 60.0])
def test_t_cdf_matches_the_closed_forms(t, df):
    """Both branches of the incomplete beta function (small and large t) against the exact CDF."""
    assert t_cdf(t, df) == pytest.approx(closed_cdf(t, df), abs=1e-12)


@pytest.mark.parametrize("p", [0.6, 0.8, 0.9, 0.95, 0.975, 0.995, 0.9995, 0.2])
def test_t_quantile_matches_the_closed_forms(p):
    """df 1: tan(pi (p - 1/2)); df 2: (2p - 1) / sqrt(2 p (1 - p)) (t(0.9995, 1) = 636.6: a 99.9% interval of 2)."""
    assert t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-9)
    assert t_quantile(p, 2) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)), rel=1e-9)
    with pytest.raises(ValueError):
        t_quantile(p, 0)


@pytest.mark.parametrize("x", [0.01, 0.2, 0.5, 0.77, 0.99])
def test_betainc_matches_its_closed_forms(x):
    """I_x(a, 1) = x^a, I_x(1, b) = 1 - (1 - x)^b, I_x(1/2, 1/2) = 2 asin(sqrt x) / pi."""
    assert betainc(3.0, 1.0, x) == pytest.approx(x**3, abs=1e-12)
    assert betainc(1.0, 4.0, x) == pytest.approx(1 - (1 - x) ** 4, abs=1e-12)
    assert betainc(0.5, 0.5, x) == pytest.approx(2 * math.asin(math.sqrt(x)) / math.pi, abs=1e-12)


def test_mean_ci_takes_its_level():
    """[1, 2, 3] at 90%: t(0.95, 2) = 0.9 / sqrt(0.095) = 2.919986, half-width 2.919986 / sqrt(3) = 1.685854."""
    ci = mean_ci([1.0, 2.0, 3.0], level=0.90)
    half = 0.9 / math.sqrt(0.095) / math.sqrt(3)
    assert half == pytest.approx(1.685854, abs=1e-6)
    assert ci.lo == pytest.approx(2 - half, abs=1e-9) and ci.hi == pytest.approx(2 + half, abs=1e-9)
    two = mean_ci([1.0, 3.0])  # n = 2: mean 2, sd sqrt(2), t(0.975, 1) = 12.706205, half-width 12.706205
    assert two.lo == pytest.approx(2 - 12.706205, abs=1e-5) and two.hi == pytest.approx(2 + 12.706205, abs=1e-5)


def test_flips_count_each_kind_of_item_once_and_refuse_either_length():
    # right -> right, wrong -> right (gained), right -> wrong (lost), wrong -> wrong, wrong -> right (gained)
    assert flips([T, F, T, F, F], [T, T, F, F, T]) == (2, 1)
    for base, new in (([T, F], [T]), ([T], [T, F])):
        with pytest.raises(ValueError):
            flips(base, new)


#: 3 SFT checkpoints of 5 items (right on 2, 1 and 0 of them) and an arm's 2 RL seeds from each
SFT = {0: [T, T, F, F, F], 1: [T, F, F, F, F], 2: [F, F, F, F, F]}
ARM = {  # listed out of order: the pairs come sorted by (SFT seed, RL seed)
    (2, 1): [T, T, T, F, F],  # +3 over SFT seed 2: +60 points
    (0, 0): [T, T, T, F, F],  # +1: +20
    (1, 1): [T, T, T, F, F],  # +2: +40
    (0, 1): [F, T, T, T, F],  # +2 -1: +20
    (1, 0): [F, F, F, F, F],  # -1: -20
    (2, 0): [T, F, F, F, F],  # +1: +20
}


def test_compare_by_hand_over_three_sft_seeds_of_two_rl_seeds():
    """Per SFT seed the mean of its two pairs: 20, 10 and 40; mean 70/3, sd sqrt(700/3) = 15.275252 (deviations
    -10/3, -40/3, 50/3: squares 100/9 + 1600/9 + 2500/9 = 4200/9, over 2), t(0.975, 2) = 4.302653,
    half-width 4.302653 * 15.275252 / sqrt(3) = 37.945833. Items per pair: 9 gained and 2 lost in 6 pairs."""
    c = compare(ARM, SFT)
    assert [(p["sft_seed"], p["rl_seed"]) for p in c["pairs"]] == sorted(ARM)
    assert [p["diff"] for p in c["pairs"]] == [20.0, 20.0, -20.0, 40.0, 20.0, 60.0]
    assert [(p["gained"], p["lost"]) for p in c["pairs"]] == [(1, 0), (2, 1), (0, 1), (2, 0), (1, 0), (3, 0)]
    assert (c["n_pairs"], c["n_sft_seeds"], c["n_items"]) == (6, 3, 5)
    assert c["mean"] == pytest.approx(70 / 3) and c["sd"] == pytest.approx(math.sqrt(700 / 3))
    assert c["lo"] == pytest.approx(70 / 3 - 37.945833, abs=1e-5) and c["hi"] == pytest.approx(
        70 / 3 + 37.945833, abs=1e-5
    )
    assert c["gained"] == pytest.approx(1.5) and c["lost"] == pytest.approx(1 / 3)
    # the reverse comparison: every sign flips, the counts swap, the interval mirrors
    r = compare({k: SFT[k[0]] for k in ARM}, {k: v for k, v in ARM.items()})
    assert (
        r["mean"] == pytest.approx(-70 / 3)
        and r["lo"] == pytest.approx(-c["hi"])
        and r["hi"] == pytest.approx(-c["lo"])
    )
    assert (r["gained"], r["lost"]) == pytest.approx((1 / 3, 1.5))


def test_verdicts_at_an_interval_touching_0():
    """An interval that reaches 0 rules nothing out on that side: [0, 2] neither resolves A > B nor contradicts
    A <= B (A = B is in it)."""
    assert verdict("greater", 0.0, 2.0) == "not resolved"
    assert verdict("not_greater", 0.0, 2.0) == "not resolved"
    assert verdict("not_greater", -2.0, 0.0) == "resolved"
    assert verdict("greater", 1e-9, 2.0) == "resolved" and verdict("not_greater", 1e-9, 2.0) == "contradicted"


def test_exact_claim_needs_every_pair_equal_and_a_measured_std_of_0():
    same, differs = {"gained": 0, "lost": 0}, {"gained": 0, "lost": 1}
    assert exact_verdict({"pairs": [same, same]}, 0.0) == "resolved"
    assert exact_verdict({"pairs": [same, differs]}, 0.0) == "not resolved"  # one pair of two differs
    assert exact_verdict({"pairs": [differs, same]}, 0.0) == "not resolved"
    assert exact_verdict({"pairs": [same, same]}, None) == "not resolved"  # no std logged: not shown to be 0


#: each claim's own pair of arms (A - B) and kind, as the paper states them
PAPER = {
    1: ("grpo_deterministic", "sft", "exact"),
    2: ("dropout_grpo", "grpo_sampling", "greater"),
    3: ("dropout_grpo", "sft", "greater"),
    4: ("grpo_null", "sft", "not_greater"),
    5: ("dropout_grpo", "reinforce_ema", "greater"),
}
#: (A, B) -> the interval on the headline split at the best and at the final checkpoint
INTERVALS = {
    ("dropout_grpo", "grpo_sampling"): ((0.5, 3.0), (-1.0, 1.0)),
    ("dropout_grpo", "sft"): ((-3.0, -0.5), (0.2, 0.9)),
    ("grpo_null", "sft"): ((-2.0, -0.1), (0.1, 2.0)),
    ("dropout_grpo", "reinforce_ema"): ((-1.0, 1.0), (-3.0, -1.0)),
    # comparisons no claim is judged on (a claim read from one of them would change its verdict)
    ("dropout_grpo", "grpo_null"): ((4.0, 5.0), (4.0, 5.0)),
    ("grpo_sampling", "sft"): ((-5.0, -4.0), (-5.0, -4.0)),
    ("reinforce_ema", "sft"): ((4.0, 6.0), (-6.0, -4.0)),
}
#: claim -> verdict at (best, final) for those intervals (claim 1: every item equal at best, one differs at final)
EXPECTED = {
    1: ("resolved", "not resolved"),
    2: ("resolved", "not resolved"),
    3: ("contradicted", "resolved"),
    4: ("resolved", "contradicted"),
    5: ("not resolved", "contradicted"),
}


def claim_comparisons() -> list[dict]:
    """Every comparison on a shifted split (listed first, each with another interval) and on the headline split."""
    out = []
    for split in ("shifted", "test"):
        for i, ckpt in enumerate(("best", "final")):
            for (a, b), spans in INTERVALS.items():
                lo, hi = spans[i] if split == "test" else (-spans[i][1], -spans[i][0])
                out.append(
                    {"a": a, "b": b, "checkpoint": ckpt, "split": split, "pairs": [{"gained": 3, "lost": 1}] * 2}
                )
                out[-1] |= {"n_pairs": 2, "mean": (lo + hi) / 2, "lo": lo, "hi": hi, "gained": 3.0, "lost": 1.0}
            differs = split != "test" or ckpt == "final"
            pairs = [{"gained": 0, "lost": int(differs)}, {"gained": 0, "lost": 0}]
            det = {"a": "grpo_deterministic", "b": "sft", "checkpoint": ckpt, "split": split, "pairs": pairs}
            out.append(det | {"n_pairs": 2, "mean": 0.0, "lo": 0.0, "hi": 0.0, "gained": 0.0, "lost": differs / 2})
    return out


def test_each_claim_is_resolved_on_its_own_arms_checkpoint_and_split():
    """A claim read from another pair of arms, the other checkpoint or the other split says another verdict here, or
    carries another interval."""
    rows = claim_verdicts(claim_comparisons(), {"grpo_deterministic": 0.0, "dropout_grpo": 0.4}, "test")
    assert [(r["id"], r["checkpoint"]) for r in rows] == [(i, c) for i in PAPER for c in ("best", "final")]
    for r in rows:
        a, b, kind = PAPER[r["id"]]
        i = ("best", "final").index(r["checkpoint"])
        assert (r["kind"], r["verdict"]) == (kind, EXPECTED[r["id"]][i]), r
        if kind != "exact":
            lo, hi = INTERVALS[(a, b)][i]
            assert (r["lo"], r["hi"], r["mean"], r["n_pairs"]) == (lo, hi, (lo + hi) / 2, 2), r
    assert [r["lost"] for r in rows if r["id"] == 1] == [0.0, 0.5]
