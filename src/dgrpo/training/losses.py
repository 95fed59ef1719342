"""The math of Dropout-GRPO as small pure functions (paper Sec. 3-4, Algorithm 1, Eq. 1, 7, 8).

Shapes: rewards per group ``[G, K]``; per-token tensors ``[N, L]`` with a 0/1 ``mask``.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor


# ---------------------------------------------------------------------------------- advantages
def group_advantages(rewards: Tensor, kind: str = "drgrpo", eps: float = 1e-4) -> Tensor:
    """Per-rollout advantage from a group's rewards ``[G, K]``.

    ``drgrpo`` (default, Liu et al. 2025; paper Sec. 3.1 and Remark 3): A = r - mean(r), which keeps
      the surrogate gradient unbiased up to the (1 - 1/K) factor of Theorem 1.
    ``grpo``: (r - mean(r)) / (std(r) + eps), the original GRPO normalisation (population std).
    ``rloo``: r - mean of the *other* K-1 rewards = K/(K-1) * (r - mean(r)).
    """
    mean = rewards.mean(dim=-1, keepdim=True)
    if kind == "drgrpo":
        return rewards - mean
    if kind == "grpo":
        return (rewards - mean) / (rewards.std(dim=-1, unbiased=False, keepdim=True) + eps)
    if kind == "rloo":
        k = rewards.shape[-1]
        if k < 2:
            raise ValueError("RLOO needs K >= 2")
        return (rewards - mean) * k / (k - 1)
    raise ValueError(f"unknown advantage kind {kind!r}; expected drgrpo, grpo or rloo")


def ema_advantages(rewards: Tensor, baseline: float) -> Tensor:
    """REINFORCE with a running baseline (the paper's K = 1 ablation): A = r - b."""
    return rewards - baseline


def ema_update(baseline: float, rewards: Tensor, alpha: float) -> float:
    """b <- alpha * b + (1 - alpha) * mean(r), updated after the advantages of the step are taken."""
    return alpha * baseline + (1 - alpha) * float(rewards.float().mean())


# ---------------------------------------------------------------------------------- filter
def group_filter(rewards: Tensor, alpha_min: float, alpha_max: float) -> Tensor:
    """Keep-mask ``[G]`` of groups whose accuracy mu_r lies in the *closed* window [alpha_min, alpha_max]
    (paper Sec. 4.4; both bounds inclusive). Groups are kept or dropped whole."""
    mu = rewards.float().mean(dim=-1)
    return (mu >= alpha_min - 1e-9) & (mu <= alpha_max + 1e-9)


# ---------------------------------------------------------------------------------- surrogate
def clipped_surrogate(logp: Tensor, old_logp: Tensor, adv: Tensor, eps_low: float, eps_high: float) -> tuple[Tensor, Tensor, Tensor, Tensor]:
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


def aggregate(per_token: Tensor, mask: Tensor, kind: str, n_sequences: float, n_tokens: float, max_len: int) -> Tensor:
    """Sum a per-token quantity into a scalar, normalised by *global* counts (so micro-batches add up).

    ``seq_mean`` (default, Algorithm 1): (1/N) sum_k (1/|y_k|) sum_l x_kl.
    ``token_mean``: sum_kl x_kl / (total tokens).
    ``constant`` (Dr. GRPO): sum_kl x_kl / (N * max_len).
    """
    m = mask.to(per_token.dtype)
    if kind == "seq_mean":
        lengths = m.sum(-1).clamp(min=1)
        return ((per_token * m).sum(-1) / lengths).sum() / max(n_sequences, 1e-12)
    if kind == "token_mean":
        return (per_token * m).sum() / max(n_tokens, 1e-12)
    if kind == "constant":
        return (per_token * m).sum() / max(n_sequences * max_len, 1e-12)
    raise ValueError(f"unknown aggregation {kind!r}; expected seq_mean, token_mean or constant")


# ---------------------------------------------------------------------------------- KL
def k3(x: Tensor) -> Tensor:
    """Schulman's k3 estimator exp(x) - x - 1."""
    return torch.exp(x) - x - 1


def huber_k3(x: Tensor, delta: float = 5.0) -> Tensor:
    """Eq. 7: k3 inside [-delta, delta], continued linearly outside, value- and slope-matched at the
    bounds (C^1, >= 0, slope e^delta - 1 on the right and e^-delta - 1 on the left, never zero)."""
    ed, emd = math.exp(delta), math.exp(-delta)
    inner = k3(x.clamp(-delta, delta))
    right = (ed - 1) * (x - delta) + (ed - delta - 1)
    left = (emd - 1) * (x + delta) + (emd + delta - 1)
    return torch.where(x > delta, right, torch.where(x < -delta, left, inner))


def kl_log_ratio(logp: Tensor, ref_logp: Tensor, form: str = "unbiased") -> Tensor:
    """The argument x fed to (Huberized) k3, per token.

    ``unbiased`` (default): x = log pi_ref - log pi_theta. On tokens sampled from pi_theta,
      E[exp(x) - x - 1] = KL(pi_theta || pi_ref): Schulman's unbiased, non-negative k3.
    ``paper``: x = log pi_theta - log pi_ref, as the paper's Sec. 4.2 writes it; E[exp(x) - x - 1]
      is then chi^2-like (E[pi/pi_ref] - 1 + KL), not KL: biased, kept for faithful reproduction.
    """
    if form == "unbiased":
        return ref_logp - logp
    if form == "paper":
        return logp - ref_logp
    raise ValueError(f"unknown KL form {form!r}; expected unbiased or paper")
