"""The math of Dropout-GRPO as small pure functions (paper Sec. 3-4, Algorithm 1; equation numbers are the paper's).

Shapes: rewards per group ``[G, K]``; per-token tensors ``[N, L]`` with a 0/1 ``mask``. The update's loss is
one call, :func:`grpo_objective`; its aggregations and KL estimators are the registries :data:`AGGREGATIONS`
and :data:`KL_ESTIMATORS` (a new one is one function there and one config value in ``dgrpo.config``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields

import torch
from torch import Tensor


# ---------------------------------------------------------------------------------- advantages
def group_advantages(rewards: Tensor, kind: str = "drgrpo", eps: float = 1e-4) -> Tensor:
    """Per-rollout advantage from a group's rewards ``[G, K]``.

    ``drgrpo`` (default, Liu et al. 2025; paper Sec. 3.1 and Remark 5): A = r - mean(r), which keeps
      the surrogate gradient unbiased up to the (1 - 1/K) factor of Theorem 3 (Eq. 5) under a length-free
      aggregation (``constant``); the paper's ``seq_mean`` divides each rollout's score by its own length, which
      biases it when answers differ in length (Dr. GRPO's length bias; tests/test_unbiased_gradient.py).
    ``grpo``: (r - mean(r)) / (std(r) + eps), the original GRPO normalisation (population std).
    ``rloo``: r - mean of the *other* K-1 rewards = K/(K-1) * (r - mean(r)).

    Computed in float64 and returned in the rewards' dtype: a group of K equal rewards has advantages of exactly 0
    (in float32 the mean of eight rewards of 0.1 is 0.1 + 7e-9, so that such a group, deterministic rollouts under a
    partial-credit reward, gave a gradient of ~1e-8 that Adam scaled up to a third of a full step).
    """
    r = rewards.double()
    mean = r.mean(dim=-1, keepdim=True)
    if kind == "drgrpo":
        return (r - mean).to(rewards.dtype)
    if kind == "grpo":
        return ((r - mean) / (r.std(dim=-1, unbiased=False, keepdim=True) + eps)).to(rewards.dtype)
    if kind == "rloo":
        k = rewards.shape[-1]
        if k < 2:
            raise ValueError("RLOO needs K >= 2")
        return ((r - mean) * k / (k - 1)).to(rewards.dtype)
    raise ValueError(f"unknown advantage kind {kind!r}; expected drgrpo, grpo or rloo")


def ema_advantages(rewards: Tensor, baseline: float) -> Tensor:
    """REINFORCE with a running baseline (the paper's K = 1 ablation): A = r - b."""
    return rewards - baseline


def ema_update(baseline: float, rewards: Tensor, alpha: float) -> float:
    """b <- alpha * b + (1 - alpha) * mean(r), updated after the advantages of the step are taken."""
    return alpha * baseline + (1 - alpha) * float(rewards.float().mean())


def shuffle_within_groups(rewards: Tensor, seeds: Tensor) -> Tensor:
    """The null control: each group's rewards ``[G, K]`` permuted by a permutation drawn from its own seed
    (``seeds`` [G]). Group statistics (mean, std, the filter's decision) are unchanged; which rollout gets
    which reward is noise, so an update on it can only measure the effect of updating at all."""
    out = torch.empty_like(rewards)
    for g in range(rewards.shape[0]):
        perm = torch.randperm(rewards.shape[1], generator=torch.Generator().manual_seed(int(seeds[g])))
        out[g] = rewards[g, perm]
    return out


# ---------------------------------------------------------------------------------- filter
def group_filter(rewards: Tensor, alpha_min: float, alpha_max: float) -> Tensor:
    """Keep-mask ``[G]`` of groups whose accuracy mu_r lies in the *closed* window [alpha_min, alpha_max]
    (paper Sec. 4.4; both bounds inclusive). Groups are kept or dropped whole. mu is summed in float64 and compared in
    float32, as the bounds are: a group of K equal rewards at a bound is kept (in float32 the mean of eight rewards of
    0.2 is below 0.2, and such a group fell out of a window that starts at 0.2). No tolerance beyond that rounding (a
    margin of 1e-9 kept a group of zeros in a window starting at 1e-9)."""
    mu = rewards.double().mean(dim=-1).float()
    return (mu >= alpha_min) & (mu <= alpha_max)


# ---------------------------------------------------------------------------------- surrogate
def clipped_surrogate(
    logp: Tensor, old_logp: Tensor, adv: Tensor, eps_low: float, eps_high: float
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-token PPO objective min(rho A, clip(rho, 1-eps_low, 1+eps_high) A) (Eq. 1, asymmetric clip).

    ``adv`` is per rollout ``[N]`` (broadcast over tokens). Returns (objective [N, L], ratio,
    clipped-low indicator, clipped-high indicator): a token counts as clipped where the clip is the
    active branch of the min (so its gradient is zero).
    """
    ratio = torch.exp(logp - old_logp)
    a = adv[:, None].to(ratio.dtype)
    unclipped = ratio * a
    clipped = ratio.clamp(1 - eps_low, 1 + eps_high) * a
    obj = torch.minimum(unclipped, clipped)
    low = (ratio < 1 - eps_low) & (a < 0)
    high = (ratio > 1 + eps_high) & (a > 0)
    return obj, ratio, low, high


# ---------------------------------------------------------------------------------- aggregation
@dataclass(frozen=True)
class GlobalCounts:
    """What a sum over tokens is normalised by: counts over the *whole* step (all micro-batches, all ranks)."""

    sequences: float  # kept rollouts
    tokens: float  # their answer tokens
    max_len: int  # grpo.max_new_tokens


def seq_mean(x: Tensor, m: Tensor, n: GlobalCounts) -> Tensor:
    """(1/N) sum_k (1/|y_k|) sum_l x_kl (Algorithm 1, the paper's choice; not Theorem 3's unbiased estimator when
    the answers' lengths differ: :func:`group_advantages`)."""
    lengths = m.sum(-1).clamp(min=1)
    return ((x * m).sum(-1) / lengths).sum() / max(n.sequences, 1e-12)


def token_mean(x: Tensor, m: Tensor, n: GlobalCounts) -> Tensor:
    """sum_kl x_kl / (total tokens)."""
    return (x * m).sum() / max(n.tokens, 1e-12)


def constant_norm(x: Tensor, m: Tensor, n: GlobalCounts) -> Tensor:
    """sum_kl x_kl / (N * max_len) (Dr. GRPO)."""
    return (x * m).sum() / max(n.sequences * n.max_len, 1e-12)


#: ``grpo.aggregation`` -> function(per-token values, mask, global counts) -> scalar
AGGREGATIONS: dict[str, Callable[[Tensor, Tensor, GlobalCounts], Tensor]] = {
    "seq_mean": seq_mean,
    "token_mean": token_mean,
    "constant": constant_norm,
}


def aggregate(per_token: Tensor, mask: Tensor, kind: str, n_sequences: float, n_tokens: float, max_len: int) -> Tensor:
    """Sum a per-token quantity into a scalar, normalised by *global* counts (so micro-batches add up)."""
    if kind not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {kind!r}; expected one of {', '.join(AGGREGATIONS)}")
    return AGGREGATIONS[kind](per_token, mask.to(per_token.dtype), GlobalCounts(n_sequences, n_tokens, max_len))


# ---------------------------------------------------------------------------------- KL
def k3(x: Tensor) -> Tensor:
    """Schulman's k3 estimator exp(x) - x - 1 (paper Sec. 4.2, the term Eq. 6 Huberizes), as expm1(x) - x: exp(x) - 1
    rounds exp(x) to float32 first, an error of ~6e-8 against a value of x^2 / 2, so that a per-token KL near 0 (the
    first steps, and after a renewal) came out as rounding noise, negative too; expm1 keeps it accurate and >= 0."""
    return torch.expm1(x) - x


def huber_k3(x: Tensor, delta: float = 5.0) -> Tensor:
    """Eq. 6: k3 inside [-delta, delta], continued linearly outside, value- and slope-matched at the
    bounds (C^1, >= 0, slope e^delta - 1 on the right and e^-delta - 1 on the left, never zero)."""
    ed, emd = math.exp(delta), math.exp(-delta)
    inner = k3(x.clamp(-delta, delta))
    right = (ed - 1) * (x - delta) + (ed - delta - 1)
    left = (emd - 1) * (x + delta) + (emd + delta - 1)
    return torch.where(x > delta, right, torch.where(x < -delta, left, inner))


def kl_unbiased(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """x = log pi_ref - log pi_theta: on tokens sampled from pi_theta, E[exp(x) - x - 1] = KL(pi_theta || pi_ref)
    (Schulman's unbiased, non-negative k3)."""
    return ref_logp - logp


def kl_paper(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """x = log pi_theta - log pi_ref, as the paper's Sec. 4.2 writes it; on samples from pi_theta,
    E[exp(x) - x - 1] = E[pi/pi_ref] - 1 - KL(pi_theta || pi_ref): a chi^2-like quantity, not the KL."""
    return logp - ref_logp


#: ``grpo.kl_form`` -> the per-token argument x fed to the Huberized k3
KL_ESTIMATORS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {"unbiased": kl_unbiased, "paper": kl_paper}


def kl_log_ratio(logp: Tensor, ref_logp: Tensor, form: str = "unbiased") -> Tensor:
    """The argument x fed to (Huberized) k3, per token, for ``grpo.kl_form`` = ``form``."""
    if form not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL form {form!r}; expected one of {', '.join(KL_ESTIMATORS)}")
    return KL_ESTIMATORS[form](logp, ref_logp)


# ---------------------------------------------------------------------------------- the objective
@dataclass(frozen=True)
class ObjectiveSettings:
    """The knobs of the update's loss (from ``GRPOConfig``)."""

    eps_low: float = 0.10
    eps_high: float = 0.12
    aggregation: str = "seq_mean"
    kl_form: str = "unbiased"
    huber_delta: float = 5.0

    def __post_init__(self) -> None:  # (the config checks these too; a hand-built one gets a named error, not KeyError)
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"unknown aggregation {self.aggregation!r}; expected one of {', '.join(AGGREGATIONS)}")
        if self.kl_form not in KL_ESTIMATORS:
            raise ValueError(f"unknown KL form {self.kl_form!r}; expected one of {', '.join(KL_ESTIMATORS)}")

    @classmethod
    def from_config(cls, g) -> ObjectiveSettings:  # g: dgrpo.config.GRPOConfig
        return cls(g.eps_low, g.eps_high, g.aggregation, g.kl_form, g.huber_delta)


@dataclass
class ObjectiveStats:
    """Diagnostics of the objective, named as they appear in metrics.jsonl. Each field adds up over
    micro-batches (and ranks) of one step, except the ratio extremes (max / min). The objective fills them with
    0-d tensors on the loss's device, so that a step asks the host for all of them once (:meth:`as_dict`), not after
    every micro-batch's forward."""

    policy_loss: float | Tensor = 0.0  # -(aggregated clipped surrogate)
    kl: float | Tensor = 0.0  # aggregated Huberized k3 (0 without a reference)
    clip_frac_low: float | Tensor = 0.0  # fraction of the step's tokens clipped below 1 - eps_low
    clip_frac_high: float | Tensor = 0.0  # ... above 1 + eps_high
    ratio_max: float | Tensor = 1.0
    ratio_min: float | Tensor = 1.0

    def add(self, other: ObjectiveStats) -> None:
        self.policy_loss = self.policy_loss + other.policy_loss
        self.kl = self.kl + other.kl
        self.clip_frac_low = self.clip_frac_low + other.clip_frac_low
        self.clip_frac_high = self.clip_frac_high + other.clip_frac_high
        self.ratio_max = _extreme(True, self.ratio_max, other.ratio_max)
        self.ratio_min = _extreme(False, self.ratio_min, other.ratio_min)

    def clipping_from(self, later: ObjectiveStats, n_later: int) -> None:
        """With several mini-epochs: the clipped fractions (their mean) and ratio extremes of the ``n_later`` ones
        after the first, whose ratios are 1 by construction (theta = theta_old); the loss and KL stay the first's
        (the objective at theta_old). With one mini-epoch (``n_later`` = 0) nothing changes: its ratios show that
        replay is exact."""
        if n_later > 0:
            self.clip_frac_low, self.clip_frac_high = later.clip_frac_low / n_later, later.clip_frac_high / n_later
            self.ratio_max, self.ratio_min = later.ratio_max, later.ratio_min

    def as_dict(self) -> dict[str, float]:
        """The values as floats (one device-to-host copy for all of them)."""
        values: list[float | Tensor] = [getattr(self, f.name) for f in fields(self)]
        on_device = [i for i, v in enumerate(values) if isinstance(v, Tensor)]
        if on_device:  # the tensors stacked on their device, copied once; the plain floats never leave the host
            host = torch.stack([values[i].detach().double() for i in on_device]).tolist()  # type: ignore[union-attr]
            for i, v in zip(on_device, host):
                values[i] = v
        return {f.name: float(v) for f, v in zip(fields(self), values)}


def _extreme(larger: bool, a: float | Tensor, b: float | Tensor) -> float | Tensor:
    """max (``larger``) or min of two stats; on the device when either is a tensor (a float joins as a clamp bound,
    so nothing is copied to the device)."""
    if isinstance(a, Tensor) and isinstance(b, Tensor):
        return torch.maximum(a, b) if larger else torch.minimum(a, b)
    if isinstance(a, Tensor) or isinstance(b, Tensor):
        t, x = (a, b) if isinstance(a, Tensor) else (b, a)
        return t.clamp(min=x) if larger else t.clamp(max=x)  # type: ignore[union-attr]
    return max(a, b) if larger else min(a, b)


def check_shapes(logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, ref_logp: Tensor | None) -> None:
    """``logp`` [N, L], ``old_logp``, ``mask`` and ``ref_logp`` of its shape, ``adv`` [N]: one advantage per rollout."""
    if logp.dim() != 2:
        raise ValueError(f"grpo_objective: logp must be [N, L] (rollouts x answer tokens), got {tuple(logp.shape)}")
    named = {"old_logp": old_logp, "mask": mask, **({"ref_logp": ref_logp} if ref_logp is not None else {})}
    for name, t in named.items():
        if t.shape != logp.shape:
            raise ValueError(f"grpo_objective: {name} has shape {tuple(t.shape)}, logp {tuple(logp.shape)}")
    if adv.shape != logp.shape[:1]:
        raise ValueError(f"grpo_objective: adv must be [N] = {tuple(logp.shape[:1])}, got {tuple(adv.shape)}")


def grpo_objective(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    mask: Tensor,
    counts: GlobalCounts,
    settings: ObjectiveSettings,
    *,
    ref_logp: Tensor | None = None,
    beta: float = 0.0,
) -> tuple[Tensor, ObjectiveStats]:
    """The loss of one micro-batch (Algorithm 1, line 5): -agg(clipped surrogate) + beta * agg(Huberized k3),
    normalised by the step's global ``counts`` so that micro-batches and ranks add up to the full-batch loss.

    ``logp`` [N, L] carries the gradient; ``old_logp`` the log-probs at theta_old (the ratio's denominator);
    ``adv`` [N] per rollout; ``ref_logp`` the reference model's log-probs under the same perturbation
    (no KL term when None or ``beta == 0``). Shapes are checked (broadcasting would give a wrong loss)."""
    check_shapes(logp, old_logp, adv, mask, ref_logp)
    s = settings
    m = mask.to(logp.dtype)
    agg = AGGREGATIONS[s.aggregation]
    obj, ratio, low, high = clipped_surrogate(logp, old_logp, adv, s.eps_low, s.eps_high)
    loss = -agg(obj, m, counts)
    stats = ObjectiveStats(policy_loss=loss.detach())
    if ref_logp is not None and beta > 0:
        kl = agg(huber_k3(KL_ESTIMATORS[s.kl_form](logp, ref_logp), s.huber_delta), m, counts)
        loss = loss + beta * kl
        stats.kl = kl.detach()
    # the rest stays on the device too (no host synchronisation here): counts as sums, extremes over valid tokens
    valid = mask.bool()
    n_tok = max(counts.tokens, 1)
    stats.clip_frac_low = (low & valid).sum() / n_tok
    stats.clip_frac_high = (high & valid).sum() / n_tok
    r, some = ratio.detach().double(), valid.any()
    stats.ratio_max = torch.where(some, torch.where(valid, r, -torch.inf).amax(), 1.0)
    stats.ratio_min = torch.where(some, torch.where(valid, r, torch.inf).amin(), 1.0)
    return loss, stats
