"""The demo's statistics, pure functions checked by hand in tests/test_demo.py: Student's t quantiles, the mean
with its t-interval, items gained and lost between two models on the same items, paired comparisons over (SFT seed,
RL seed) runs, and the verdict on each of the paper's claims."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

CHECKPOINTS = ("best", "final")  # best = the best post-warmup validation checkpoint (the paper's protocol)
LEVEL = 0.95


@dataclass(frozen=True)
class Claim:
    """One claim of the paper as a paired comparison: ``a`` vs ``b`` on the headline split.

    ``kind``: ``exact`` (a equals b on every item of every pair, and a's within-group reward std is identically 0),
    ``greater`` (a > b: resolved when the CI lies above 0), ``less`` (a < b: resolved when it lies below 0) or
    ``not_greater`` (a <= b: resolved when the CI lies at or below 0, i.e. the data rule out any gain of a over
    b)."""

    id: int
    text: str
    kind: str
    a: str
    b: str


CLAIMS = (
    Claim(1, "deterministic GRPO = SFT exactly", "exact", "grpo_deterministic", "sft"),
    Claim(2, "Dropout-GRPO > token-sampling GRPO", "greater", "dropout_grpo", "grpo_sampling"),
    Claim(3, "Dropout-GRPO > SFT", "greater", "dropout_grpo", "sft"),
    Claim(4, "null control <= SFT", "not_greater", "grpo_null", "sft"),
    Claim(5, "REINFORCE + EMA below Dropout-GRPO", "greater", "dropout_grpo", "reinforce_ema"),
    # the paper's "REINFORCE+dropout fails ... destabilizing the SFT initialization" (25.09% against SFT's 27.29%)
    Claim(6, "REINFORCE + EMA below SFT", "less", "reinforce_ema", "sft"),
)


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        even = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        odd = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
        for num in (even, odd):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_fraction(b, a, 1.0 - x) / b


def t_cdf(t: float, df: int) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom."""
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t (``t_quantile(0.975, 2)`` = 4.3027), by bisection on :func:`t_cdf`."""
    if not 0.0 < p < 1.0 or df < 1:
        raise ValueError(f"t_quantile needs 0 < p < 1 and df >= 1, got p={p}, df={df}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1e7
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
    return 0.5 * (lo + hi)


@dataclass
class CI:
    """A mean with its two-sided t-interval (``lo``/``hi`` are None with fewer than 2 values)."""

    mean: float
    lo: float | None
    hi: float | None
    n: int
    sd: float


def mean_ci(xs: Sequence[float | Fraction], level: float = LEVEL) -> CI:
    """Mean of ``xs`` and its ``level`` t-interval: mean +- t_{(1+level)/2, n-1} * sd / sqrt(n). The mean is exact,
    rounded once (of fractions: differences of -0.1, -0.4, +0.5 and 0 points average 0, where their floats' mean was
    -7e-18, published as -0.00)."""
    if not xs:
        raise ValueError("mean_ci needs at least one value")
    exact = [Fraction(x) for x in xs]  # (a float's own value: exact too)
    n, mean = len(xs), float(statistics.mean(exact))
    if n < 2:
        return CI(mean, None, None, n, 0.0)
    sd = float(statistics.stdev(exact))
    half = t_quantile((1.0 + level) / 2.0, n - 1) * sd / math.sqrt(n)
    return CI(mean, mean - half, mean + half, n, sd)


def flips(base: Sequence[bool], new: Sequence[bool]) -> tuple[int, int]:
    """(gained, lost): items the new model gets right that the baseline got wrong, and the reverse."""
    if len(base) != len(new):
        raise ValueError(f"paired comparison needs the same items ({len(base)} vs {len(new)})")
    return sum(n and not b for b, n in zip(base, new)), sum(b and not n for b, n in zip(base, new))


PairKey = tuple[int, int]  # (SFT seed, RL seed)


def compare(a: Mapping[PairKey, Sequence[bool]], b: Mapping[Any, Sequence[bool]]) -> dict[str, Any]:
    """A vs B, paired: per (SFT seed, RL seed) key of ``a``, B's model with the same key, or B keyed by the SFT seed
    alone (the SFT checkpoint: ``b``'s keys are ints); the accuracy difference in points on the same items, items
    gained and lost. The pairs of one SFT checkpoint are not independent (the checkpoint moves accuracy most): each
    SFT seed's pairs are averaged first, and the mean difference and its 95% t-interval are over the SFT seeds (with
    one RL seed per SFT seed, over the pairs). Keys without a partner are left out.

    Each SFT seed's mean is taken exactly (in items, as a fraction) and rounded once: SFT seeds whose pairs gain the
    same on average then have the same mean to the bit, and the interval its zero width (float means of the pairs'
    points, -10 and +8 items against -1 and -1 of 2000, differed in the last bit: an interval [-0.05, -0.05] that
    resolved "null control <= SFT")."""
    pairs = []
    by_sft: dict[int, list[Fraction]] = {}  # per SFT seed, each pair's difference in points, exactly
    for key in sorted(a):
        other = b.get(key, b.get(key[0]))
        if other is None:
            continue
        gained, lost = flips(other, a[key])
        diff = Fraction(100 * (gained - lost), len(a[key]))  # (its float: the quotient rounded once, as before)
        pairs.append({"sft_seed": key[0], "rl_seed": key[1], "diff": float(diff), "gained": gained, "lost": lost})
        by_sft.setdefault(int(key[0]), []).append(diff)
    if not pairs:
        return {"pairs": [], "n_pairs": 0}
    ci = mean_ci([sum(d) / len(d) for d in by_sft.values()])
    return {
        "pairs": pairs,
        "n_pairs": len(pairs),
        "n_sft_seeds": len(by_sft),
        "n_items": len(next(iter(a.values()))),
        "mean": ci.mean,
        "lo": ci.lo,
        "hi": ci.hi,
        "sd": ci.sd,
        "gained": statistics.fmean(p["gained"] for p in pairs),
        "lost": statistics.fmean(p["lost"] for p in pairs),
    }


def verdict(kind: str, lo: float | None, hi: float | None) -> str:
    """``resolved`` / ``not resolved`` / ``contradicted`` for a ``greater`` (A > B), ``less`` (A < B) or
    ``not_greater`` (A <= B) claim from the interval [lo, hi] of A - B (None: fewer than 2 pairs, nothing is
    resolved). An interval of zero width (every SFT seed's difference the same, easy on a few test items) has no
    spread to estimate one from: it resolves nothing either (a t-interval of sd 0 claimed certainty from, e.g., two
    seeds each +1 item)."""
    if lo is None or hi is None or lo == hi:
        return "not resolved"
    if kind == "greater":
        return "resolved" if lo > 0 else "contradicted" if hi < 0 else "not resolved"
    if kind == "less":
        return "resolved" if hi < 0 else "contradicted" if lo > 0 else "not resolved"
    if kind == "not_greater":
        return "resolved" if hi <= 0 else "contradicted" if lo > 0 else "not resolved"
    raise ValueError(f"unknown claim kind {kind!r}")


def exact_verdict(comparison: Mapping[str, Any], reward_std_max: float | None) -> str:
    """Claim (1): resolved when not one item differs in any pair and the within-group reward std was 0 throughout."""
    pairs = comparison.get("pairs", [])
    same = bool(pairs) and all(p["gained"] == 0 and p["lost"] == 0 for p in pairs)
    return "resolved" if same and reward_std_max == 0 else "not resolved"


def claim_verdicts(
    comparisons: Sequence[Mapping[str, Any]], reward_std_max: Mapping[str, float | None], split: str
) -> list[dict[str, Any]]:
    """Every claim's verdict for each checkpoint, from the comparisons on ``split`` (``reward_std_max``: the largest
    within-group reward std each arm logged, over all its runs and steps; None when one of its runs logged none)."""
    out = []
    for claim in CLAIMS:
        for ckpt in CHECKPOINTS:
            key = (claim.a, claim.b, ckpt, split)
            found = [c for c in comparisons if (c["a"], c["b"], c["checkpoint"], c["split"]) == key]
            c: Mapping[str, Any] = found[0] if found else {"pairs": [], "n_pairs": 0}
            if claim.kind == "exact":
                v = exact_verdict(c, reward_std_max.get(claim.a))
            else:
                v = verdict(claim.kind, c.get("lo"), c.get("hi"))
            row = {"id": claim.id, "text": claim.text, "kind": claim.kind, "checkpoint": ckpt, "verdict": v}
            out.append({**row, **{k: c.get(k) for k in ("mean", "lo", "hi", "n_pairs", "gained", "lost")}})
    return out
