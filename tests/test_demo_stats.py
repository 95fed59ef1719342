"""The demo's statistics and claim resolution pinned where a mutation test of demo/stats.py and demo/report.py found
gaps: Student's t against its closed forms (df 1, 2 and 3), a paired comparison over 3 SFT seeds x 2 RL seeds of 5
items computed by hand, the verdicts' ties at 0, each claim resolved on its own pair of arms, checkpoint and split,
the analysis of a demo's models (which checkpoint, which key, which split) and the report's tables read from it, and
the published docs/demo report rewritten, to the character, from its own results.json."""

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from dgrpo.demo import claim_verdicts, compare, exact_verdict, flips, mean_ci, t_quantile, verdict
from dgrpo.demo.report import (
    accuracy_table,
    analyse,
    claim_lines,
    comparison_table,
    results_markdown,
    sft_table,
    summary_paragraph,
)
from dgrpo.demo.stats import betainc, t_cdf

T, F = True, False
DOCS = Path(__file__).resolve().parents[1] / "docs" / "demo"


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
    assert verdict("less", -2.0, 0.0) == verdict("less", 0.0, 2.0) == "not resolved"  # (A < B: the mirror of A > B)
    assert verdict("less", -2.0, -1e-9) == "resolved" and verdict("less", 1e-9, 2.0) == "contradicted"


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
    6: ("reinforce_ema", "sft", "less"),
}
#: (A, B) -> the interval on the headline split at the best and at the final checkpoint
INTERVALS = {
    ("dropout_grpo", "grpo_sampling"): ((0.5, 3.0), (-1.0, 1.0)),
    ("dropout_grpo", "sft"): ((-3.0, -0.5), (0.2, 0.9)),
    ("grpo_null", "sft"): ((-2.0, -0.1), (0.1, 2.0)),
    ("dropout_grpo", "reinforce_ema"): ((-1.0, 1.0), (-3.0, -1.0)),
    ("reinforce_ema", "sft"): ((4.0, 6.0), (-6.0, -4.0)),
    # comparisons no claim is judged on (a claim read from one of them would change its verdict)
    ("dropout_grpo", "grpo_null"): ((4.0, 5.0), (4.0, 5.0)),
    ("grpo_sampling", "sft"): ((-5.0, -4.0), (-5.0, -4.0)),
    ("sft", "reinforce_ema"): ((-6.0, -4.0), (4.0, 6.0)),
}
#: claim -> verdict at (best, final) for those intervals (claim 1: every item equal at best, one differs at final)
EXPECTED = {
    1: ("resolved", "not resolved"),
    2: ("resolved", "not resolved"),
    3: ("contradicted", "resolved"),
    4: ("resolved", "contradicted"),
    5: ("not resolved", "contradicted"),
    6: ("contradicted", "resolved"),
}


def claim_comparisons() -> list[dict]:
    """Every comparison on a shifted split (listed first, each with another interval) and on the headline split."""
    out: list[dict] = []
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


#: a demo of 2 SFT seeds (the deterministic, sampling and null arms equal to their SFT checkpoint; Dropout-GRPO
#: with 2 RL seeds from SFT seed 0): arm -> (SFT seed, RL seed) -> (best, final) test items; the shifted split's items
#: are each model's complement (every difference there the reverse of the headline's)
SFT_ITEMS = {0: "1000", 1: "1100"}
RL_ITEMS = {
    "dropout_grpo": {(0, 0): ("1100", "0000"), (0, 1): ("1010", "1000"), (1, 0): ("1110", "1111")},
    "grpo_deterministic": {(s, 0): (v, v) for s, v in SFT_ITEMS.items()},
    "grpo_sampling": {(s, 0): (v, v) for s, v in SFT_ITEMS.items()},
    "grpo_null": {(s, 0): (v, v) for s, v in SFT_ITEMS.items()},
    "reinforce_ema": {(0, 0): ("0000", "0000"), (1, 0): ("0000", "0000")},
}


#: the other arms' largest within-group reward std per run (Dropout-GRPO's largest is not its last run's)
STD = {(0, 0): 0.1, (0, 1): 0.4, (1, 0): 0.2}


def model_row(items: str, **ident) -> dict:
    """One tested model as the pipeline records it: accuracy and 0/1 items on the headline and the shifted split."""
    flipped = "".join("1" if c == "0" else "0" for c in items)
    splits = {
        name: {"accuracy": s.count("1") / len(s), "items": s} for name, s in (("test", items), ("shifted", flipped))
    }
    return {**ident, "splits": splits}


def small_demo() -> SimpleNamespace:
    models = [model_row(v, arm="sft", sft_seed=s, valid_accuracy=0.3 + 0.1 * s) for s, v in SFT_ITEMS.items()]
    runs = []
    for arm, per in RL_ITEMS.items():
        for (s, r), (best, final) in per.items():
            models += [model_row(best, arm=arm, sft_seed=s, rl_seed=r, checkpoint="best")]
            models += [model_row(final, arm=arm, sft_seed=s, rl_seed=r, checkpoint="final")]
            std = {"grpo_deterministic": 0.0, "reinforce_ema": None}.get(arm, STD[(s, r)])
            runs.append({"arm": arm, "sft_seed": s, "rl_seed": r, "reward_std_max": std})
    return SimpleNamespace(models=models, runs=runs, tests={"test": [None] * 4, "shifted": [None] * 4})


def test_analyse_pairs_each_checkpoint_and_seed_with_its_own_and_judges_the_headline_split():
    """Dropout-GRPO - SFT on test, by hand. best: +25 in each of the 3 pairs (zero width: not resolved). final:
    (0, 0) -1 item = -25, (0, 1) 0, (1, 0) +2 = +50; SFT seed 0's pairs averaged: -12.5, then 50: mean 18.75, sd
    62.5 / sqrt(2) = 44.194174, half-width 12.706205 * 44.194174 / sqrt(2) = 397.068906."""
    an = analyse(small_demo())
    assert len(an["comparisons"]) == 2 * 2 * 8
    by = {(c["a"], c["b"], c["checkpoint"], c["split"]): c for c in an["comparisons"]}
    best, final = by[("dropout_grpo", "sft", "best", "test")], by[("dropout_grpo", "sft", "final", "test")]
    assert [p["diff"] for p in best["pairs"]] == [25.0, 25.0, 25.0] and best["lo"] == best["hi"] == 25.0
    assert [(p["sft_seed"], p["rl_seed"], p["diff"]) for p in final["pairs"]] == [
        (0, 0, -25.0),
        (0, 1, 0.0),
        (1, 0, 50.0),
    ]
    assert final["mean"] == pytest.approx(18.75)
    assert final["lo"] == pytest.approx(18.75 - 397.068906, abs=1e-4) and final["hi"] == pytest.approx(
        18.75 + 397.068906, abs=1e-4
    )
    assert by[("dropout_grpo", "sft", "final", "shifted")]["mean"] == pytest.approx(-18.75)  # the shifted split's own
    # each comparison A - B (not B - A): Dropout-GRPO vs REINFORCE + EMA, whose models are wrong on every item
    assert [p["diff"] for p in by[("dropout_grpo", "reinforce_ema", "best", "test")]["pairs"]] == [50.0, 75.0]
    assert by[("grpo_null", "sft", "best", "test")]["n_pairs"] == 2
    claims = {(r["id"], r["checkpoint"]): r for r in an["claims"]}
    assert claims[(3, "final")]["mean"] == pytest.approx(18.75) and claims[(3, "best")]["mean"] == 25.0  # on test
    assert claims[(1, "best")]["verdict"] == "resolved" and claims[(5, "best")]["mean"] == 62.5
    assert all(claims[(i, c)]["n_pairs"] == 2 for i in (1, 2, 4) for c in ("best", "final"))
    # the largest within-group reward std of each arm's runs (STD)
    assert an["reward_std_max"] == {
        "grpo_deterministic": 0.0,
        "grpo_sampling": 0.2,
        "grpo_null": 0.2,
        "reinforce_ema": None,
        "dropout_grpo": 0.4,
    }
    acc = an["accuracy"]["test"]
    assert acc["sft"] == {"best": [0.25, 0.5], "final": [0.25, 0.5]}  # the SFT checkpoint is both
    assert acc["dropout_grpo"] == {"best": [0.5, 0.5, 0.75], "final": [0.0, 0.25, 1.0]}


def small_results() -> dict:
    demo = small_demo()
    res = {"command": "dgrpo demo", "headline": "test", "n_sft": 2, "n_rl": 1, "steps": 8, "models": demo.models}
    res |= {"runs": [], "splits": {"test": 4, "shifted": 4}, "wall_s": {"total": 3.0}, "analysis": analyse(demo)}  # type: ignore[arg-type]
    return res


def test_the_report_prints_each_checkpoints_own_numbers():
    """The tables, the claims' lines and summary.txt of the small demo, by hand (best-valid checkpoint then final)."""
    res = small_results()
    rows = [r for r in comparison_table(res, "test") if r.startswith("| Dropout-GRPO vs SFT |")]
    assert rows == [
        "| Dropout-GRPO vs SFT | best-valid | +25.00 [+25.00, +25.00] | 3 | +1 / -0 (n=4) |",
        "| Dropout-GRPO vs SFT | final | +18.75 [-378.32, +415.82] | 3 | +0.67 / -0.33 (n=4) |",
    ]
    shifted = [r for r in comparison_table(res, "shifted") if r.startswith("| Dropout-GRPO vs SFT |")]
    assert shifted[1] == "| Dropout-GRPO vs SFT | final | -18.75 [-415.82, +378.32] | 3 | +0.33 / -0.67 (n=4) |"
    assert claim_lines(res)[2] == (
        "3. Dropout-GRPO > SFT: best-valid checkpoint: **not resolved** (+25.00 [+25.00, +25.00] points, 3 pairs); "
        "final checkpoint: **not resolved** (+18.75 [-378.32, +415.82] points, 3 pairs)"
    )
    # Dropout-GRPO's accuracies: best 50, 50, 75 (mean 58.33, sd 14.43); final 0, 25, 100 (mean 41.67, sd 52.04)
    table = accuracy_table(res)
    row = next(r for r in table if r.startswith("| Coconut + Dropout-GRPO (ours) |"))
    assert (
        row
        == "| Coconut + Dropout-GRPO (ours) | 3 | 58.33% ± 14.43 | 41.67% ± 52.04 | 41.67% ± 14.43 | 58.33% ± 52.04 |"
    )
    # SFT: 25 and 50 (sd 17.68 of 2 models), the shifted split 75 and 50; every SFT checkpoint is its own best
    assert (
        table[2] == "| Coconut SFT (baseline) | 2 | 37.50% ± 17.68 | 37.50% ± 17.68 | 62.50% ± 17.68 | 62.50% ± 17.68 |"
    )
    # per SFT seed: Dropout-GRPO - SFT per RL seed (best / final), then - token sampling (its one RL seed)
    assert sft_table(res)[2:] == [
        "| 0 | 30.0% | 25.00% | 75.00% | +25.00, +25.00 / -25.00, +0.00 | +25.00 / -25.00 |",
        "| 1 | 40.0% | 50.00% | 50.00% | +25.00 / +50.00 | +25.00 / +50.00 |",
    ]
    summary = summary_paragraph(res)
    assert (
        "(3) Dropout-GRPO > SFT: best-valid checkpoint +25.00 [+25.00, +25.00] not resolved; final +18.75 " in summary
    )
    assert (
        "(1) deterministic GRPO = SFT exactly: resolved (0 items gained and 0 lost per pair; reward std identically 0)"
        in summary
    )
    assert (
        "(5) REINFORCE + EMA below Dropout-GRPO: best-valid checkpoint +62.50 [-96.33, +221.33] not resolved" in summary
    )


def test_the_published_report_is_what_this_code_writes_from_its_items():
    """docs/demo (README quotes it): the comparisons and claims recomputed from results.json's per-item correctness,
    and results.md and summary.txt rewritten from it, to the character. A deliberate change to the statistics or the
    report's wording is published by rewriting these files from results.json with the new code."""
    res = json.loads((DOCS / "results.json").read_text())
    stored = res["analysis"]
    res["analysis"] = analyse(SimpleNamespace(models=res["models"], runs=res["runs"], tests=res["splits"]))
    assert res["analysis"] == stored
    assert results_markdown(res) == (DOCS / "results.md").read_text()
    assert summary_paragraph(res) + "\n" == (DOCS / "summary.txt").read_text()


def test_a_published_interval_by_hand():
    """Claim 3 at the best-valid checkpoint as README quotes it (+0.23 [-0.20, +0.65]), recomputed from the published
    items and checked against the per-SFT-seed differences of docs/demo/results.md (+0.20, +0.25, +0.55, -0.10
    points): mean 0.225, deviations -0.025, 0.025, 0.325, -0.325, variance 0.2125 / 3, t(0.975, 3) = 3.182446,
    half-width 3.182446 * sqrt(0.2125 / 3) / 2 = 0.423497."""
    res = json.loads((DOCS / "results.json").read_text())
    claims = analyse(SimpleNamespace(models=res["models"], runs=res["runs"], tests=res["splits"]))["claims"]
    row = next(r for r in claims if (r["id"], r["checkpoint"]) == (3, "best"))
    half = 3.182446 * math.sqrt(0.2125 / 3) / 2
    assert (row["mean"], row["n_pairs"], row["verdict"]) == (pytest.approx(0.225), 4, "not resolved")
    assert row["lo"] == pytest.approx(0.225 - half, abs=1e-5) and row["hi"] == pytest.approx(0.225 + half, abs=1e-5)


def test_a_claim_line_of_one_sft_seed_gives_its_mean_without_an_interval():
    """1 SFT seed x 3 RL seeds: the claim's line keeps the mean difference and its pairs, and says why there is no
    interval (the comparison table says the same)."""
    arm = {(0, r): [T, T, F, F] for r in range(3)}
    c = compare(arm, {0: [T, F, F, F]})
    comparisons = [{"a": "dropout_grpo", "b": "sft", "checkpoint": k, "split": "test", **c} for k in ("best", "final")]
    res = {"analysis": {"claims": claim_verdicts(comparisons, {}, "test")}}
    assert claim_lines(res)[2] == (
        "3. Dropout-GRPO > SFT: best-valid checkpoint: **not resolved** (+25.00 no interval (1 SFT seed) points, 3 "
        "pairs); final checkpoint: **not resolved** (+25.00 no interval (1 SFT seed) points, 3 pairs)"
    )


def test_sft_seeds_with_the_same_mean_difference_give_a_zero_width_interval_whatever_the_rounding():
    """2 SFT seeds x 2 RL seeds on 2000 items: seed 0's pairs -10 and +8 items, seed 1's -1 and -1, each seed -1 item
    per pair (-0.05 points). The per-seed means were float means of the pairs' points, -0.04999999999999999 and -0.05:
    an interval of width 2e-16 around -0.05, so "null control <= SFT" was resolved ([-0.05, -0.05] in results.md),
    where every SFT seed's difference is the same and the zero-width rule resolves nothing."""
    n = 2000

    def right(k):
        return [i < k for i in range(n)]

    c = compare(
        {(0, 0): right(10), (0, 1): right(28), (1, 0): right(19), (1, 1): right(19)}, {0: right(20), 1: right(20)}
    )
    assert [p["diff"] for p in c["pairs"]] == [-0.5, 0.4, -0.05, -0.05]
    assert (c["mean"], c["lo"], c["hi"], c["sd"]) == (-0.05, -0.05, -0.05, 0.0)
    assert verdict("not_greater", c["lo"], c["hi"]) == verdict("greater", c["lo"], c["hi"]) == "not resolved"
    # 3 RL seeds: +1 +1 +1 items against -4 +2 +5 (float means 0.05000000000000001 and 0.049999999999999996)
    arm = {(s, r): right(10 + k) for s, ks in ((0, (1, 1, 1)), (1, (-4, 2, 5))) for r, k in enumerate(ks)}
    c = compare(arm, {0: right(10), 1: right(10)})
    assert (c["mean"], c["lo"], c["hi"], c["sd"]) == (0.05, 0.05, 0.05, 0.0)


def test_differences_that_average_exactly_zero_give_a_mean_of_zero():
    """docs/demo's claim 4 (best-valid): per-SFT-seed differences of -0.1, -0.4, +0.5 and 0 points (+24.5 / -24.5
    items on average) averaged -7e-18 in floats, published as "-0.00"; the mean is exact, rounded once."""
    assert mean_ci([-0.1, -0.4, 0.5, 0.0]).mean != 0.0  # (the floats' own values do not sum to 0)
    n = 2000
    arm = {(s, 0): [True] * k + [False] * (n - k) for s, k in enumerate((2, 0, 10, 5))}  # -0.1, -0.4, +0.5, 0 points
    sft = {s: [True] * k + [False] * (n - k) for s, k in enumerate((4, 8, 0, 5))}
    c = compare(arm, sft)
    assert [p["diff"] for p in c["pairs"]] == [-0.1, -0.4, 0.5, 0.0] and c["mean"] == 0.0
    assert f"{c['mean']:+.2f}" == "+0.00"


def test_claim_1_s_summary_says_how_the_deterministic_arm_s_reward_std_was_measured():
    """summary.txt's claim 1 names the deterministic arm's largest within-group reward std: "not logged" when no
    step logged one (it printed "up to None"), else the value in 4 significant digits."""
    res = small_results()
    for std, says in ((None, "reward std not logged)"), (0.0, "reward std identically 0)"), (1 / 3, "up to 0.3333)")):
        res["analysis"]["reward_std_max"]["grpo_deterministic"] = std
        assert says in summary_paragraph(res), std


def test_the_reports_interval_level_follows_the_one_constant(monkeypatch):
    """The level was written as 95% (and "1 time in 20", 0.95 in the by-chance shares) beside ``stats.LEVEL``: at
    another level the text would have said 95% over intervals of that level."""
    from dgrpo.demo import report

    res = json.loads((DOCS / "results.json").read_text())
    monkeypatch.setattr(report, "LEVEL", 0.9)
    text = results_markdown(res) + summary_paragraph(res)
    assert "95%" not in text and "1 time in 20" not in text
    assert "(90% CI)" in text and "a 90% t-interval" in text and "judged at 90% on its own" in text
    assert "1 time in 10, and 41% to 65% of runs" in text and "90% t-intervals, points" in text
