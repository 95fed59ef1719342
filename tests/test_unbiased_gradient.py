"""The paper's Theorem 3 (lemmas, theorems and remarks share one count) on a toy policy with an enumerable
perturbation and output space:
E[grad of the Dropout-GRPO surrogate at theta_old] = (1 - 1/K) grad J, J the mask-marginal expected reward."""

import itertools

import torch

from dgrpo.training.losses import aggregate, clipped_surrogate, group_advantages

Q = 0.6  # keep probability of each of the 3 mask units
M = torch.tensor([[1.0, -0.5, 0.3], [0.2, 0.8, -0.7], [-0.4, 0.1, 0.9]], dtype=torch.float64)
R = torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64)  # reward of each output y
THETA = torch.tensor([0.3, -0.2, 0.5], dtype=torch.float64)


def log_policy(theta, masks):
    """log pi_theta(. | xi) for masks [N, 3]: logits = M (theta * xi / q) (inverted dropout on theta)."""
    return torch.log_softmax((theta[None] * masks / Q) @ M.T, dim=-1)


def exact_grad_J():
    masks = torch.tensor(list(itertools.product([0.0, 1.0], repeat=3)), dtype=torch.float64)
    p_xi = (Q ** masks.sum(1)) * ((1 - Q) ** (3 - masks.sum(1)))
    theta = THETA.clone().requires_grad_(True)
    J = (p_xi[:, None] * log_policy(theta, masks).exp() * R[None]).sum()
    return torch.autograd.grad(J, theta)[0]


def surrogate_grads(K, groups, seed):
    """Per-group gradient of our surrogate (advantage, clipped ratio, sequence-mean) at theta = theta_old."""
    g = torch.Generator().manual_seed(seed)
    n = groups * K
    masks = (torch.rand(n, 3, generator=g, dtype=torch.float64) < Q).to(torch.float64)
    with torch.no_grad():
        probs = log_policy(THETA, masks).exp()
    y = torch.multinomial(probs, 1, generator=g).squeeze(-1)
    rewards = R[y].view(groups, K)
    adv = group_advantages(rewards, "drgrpo").flatten()
    # closed-form score: d/dtheta log pi(y | xi) = (e_y - pi)^T M diag(xi / q)
    onehot = torch.nn.functional.one_hot(y, 3).to(torch.float64)
    score = ((onehot - probs) @ M) * masks / Q
    per_group = (adv[:, None] * score).view(groups, K, 3).mean(1)
    # the library's loss functions give the same gradient (checked on the first 64 groups)
    theta = THETA.clone().requires_grad_(True)
    sub = slice(0, 64 * K)
    logp = log_policy(theta, masks[sub]).gather(-1, y[sub, None])  # [N, 1]: one answer token
    obj, ratio, _, _ = clipped_surrogate(logp, logp.detach(), adv[sub], 0.10, 0.12)
    loss = aggregate(obj, torch.ones_like(logp), "seq_mean", 64 * K, 64 * K, 1)  # = mean over groups of (1/K) sum_k
    grad = torch.autograd.grad(loss, theta)[0]
    assert torch.equal(ratio, torch.ones_like(ratio))  # theta = theta_old: the clip is inactive
    assert torch.allclose(grad, per_group[:64].mean(0), atol=1e-12)
    return per_group


def test_surrogate_gradient_is_one_minus_one_over_k_times_grad_J():
    gJ = exact_grad_J()
    for K in (2, 4):
        pg = surrogate_grads(K, groups=200_000, seed=K)
        mean, se = pg.mean(0), pg.std(0) / pg.shape[0] ** 0.5
        target = (1 - 1 / K) * gJ
        assert ((mean - target).abs() < 4.5 * se + 1e-12).all(), (K, mean, target, se)
        if K == 2:  # and it is not the unscaled gradient: the factor is real
            assert ((mean - gJ).abs() > 4.5 * se).any()


def expected_surrogate_grad(K, kind, rewards=R):
    """The exact expectation of the surrogate's gradient at theta_old over every group of K rollouts: each rollout is
    one of the 8 masks x 3 outputs, drawn with p(xi) pi(y | xi); a group's gradient, weighted by its probability,
    summed over all 24^K groups. The library computes each group's advantages, clipped surrogate and sequence-mean."""
    masks = torch.tensor(list(itertools.product([0.0, 1.0], repeat=3)), dtype=torch.float64)
    p_xi = (Q ** masks.sum(1)) * ((1 - Q) ** (3 - masks.sum(1)))
    with torch.no_grad():
        p_outcome = (p_xi[:, None] * log_policy(THETA, masks).exp()).flatten()  # [24]: (mask, y)
    groups = torch.tensor(list(itertools.product(range(24), repeat=K)))  # [24^K, K]
    mask_idx, y = groups // 3, groups % 3
    weighted = group_advantages(rewards[y], kind) * p_outcome[groups].prod(-1, keepdim=True)
    theta = THETA.clone().requires_grad_(True)
    logp = log_policy(theta, masks)[mask_idx.flatten(), y.flatten()][:, None]
    obj, _, _, _ = clipped_surrogate(logp, logp.detach(), weighted.flatten(), 0.10, 0.12)
    loss = aggregate(obj, torch.ones_like(logp), "seq_mean", K, K, 1)  # sum over groups of P(group) (1/K) sum_k
    return torch.autograd.grad(loss, theta)[0]


def grad_J(rewards):
    """grad J for another reward vector (J = sum over masks and outputs of p(xi) pi(y | xi) r(y))."""
    masks = torch.tensor(list(itertools.product([0.0, 1.0], repeat=3)), dtype=torch.float64)
    p_xi = (Q ** masks.sum(1)) * ((1 - Q) ** (3 - masks.sum(1)))
    theta = THETA.clone().requires_grad_(True)
    J = (p_xi[:, None] * log_policy(theta, masks).exp() * rewards[None]).sum()
    return torch.autograd.grad(J, theta)[0]


def test_theorem_3_holds_exactly_over_every_group_and_remark_5s_std_breaks_it():
    """Theorem 3 as an exact expectation (no sampling error): E[grad surrogate] = (1 - 1/K) grad J for K = 2 and 3;
    RLOO's K / (K - 1) (r - mean) removes the factor (= grad J). Remark 5: the std-normalised advantage
    (r - mean) / (std + eps) is not proportional to grad J (with a reward of three values its expected gradient
    points elsewhere; with 0/1 rewards and K <= 3 the std is a function of the group's size alone, a mere scale)."""
    gJ = exact_grad_J()
    for K in (2, 3):
        assert torch.allclose(expected_surrogate_grad(K, "drgrpo"), (1 - 1 / K) * gJ, rtol=1e-10, atol=0)
        assert torch.allclose(expected_surrogate_grad(K, "rloo"), gJ, rtol=1e-10, atol=0)
    graded = torch.tensor([1.0, 0.0, 0.3], dtype=torch.float64)
    g = grad_J(graded)
    assert torch.allclose(expected_surrogate_grad(3, "drgrpo", graded), (2 / 3) * g, rtol=1e-10, atol=0)
    ratio = expected_surrogate_grad(3, "grpo", graded) / g
    assert (ratio.max() - ratio.min()).item() > 1.0  # not one scale: a biased direction
