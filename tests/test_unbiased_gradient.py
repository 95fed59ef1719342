"""The paper's Theorem 3 (lemmas, theorems and remarks share one count) on a toy policy with an enumerable
perturbation and output space:
E[grad of the Dropout-GRPO surrogate at theta_old] = (1 - 1/K) grad J, J the mask-marginal expected reward."""

import itertools

import pytest
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


M2 = torch.tensor([[0.5, 0.4, -0.9], [-0.6, 0.7, 0.2], [0.3, -0.8, 0.6]], dtype=torch.float64)  # 2nd token's head
#: the answers (first token, second token or None): 0 and 1 are one token long, 2 is followed by a second token
ANSWERS = [(0, None), (1, None), (2, 0), (2, 1), (2, 2)]
R_ANSWERS = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0], dtype=torch.float64)


def answer_token_logprobs(theta):
    """[8 masks x 5 answers, 2] log-probs of each answer's tokens under each mask (0 past a one-token answer), the
    answer mask [40, 2], and p(xi) per row: both tokens under the mask of the rollout, each from its own head."""
    masks = torch.tensor(list(itertools.product([0.0, 1.0], repeat=3)), dtype=torch.float64)
    p_xi = (Q ** masks.sum(1)) * ((1 - Q) ** (3 - masks.sum(1)))
    h = (theta[None] * masks / Q).repeat_interleave(len(ANSWERS), 0)  # [40, 3]
    y1 = torch.tensor([a for a, _ in ANSWERS] * 8)
    y2 = torch.tensor([b or 0 for _, b in ANSWERS] * 8)
    first = torch.log_softmax(h @ M.T, -1).gather(1, y1[:, None])[:, 0]
    second = torch.log_softmax(h @ M2.T, -1).gather(1, y2[:, None])[:, 0]
    tmask = torch.tensor([[1.0, float(b is not None)] for _, b in ANSWERS] * 8, dtype=torch.float64)
    return torch.stack([first, second * tmask[:, 1]], 1), tmask, p_xi.repeat_interleave(len(ANSWERS))


def test_theorem_3_holds_for_a_length_free_normaliser_not_for_the_sequence_mean_over_answers_of_two_lengths():
    """Theorem 3's proof takes each rollout's whole score s = sum_l grad log pi(y_l | x, xi); Eq. 1's 1/|y| (the
    sequence mean, the paper's aggregation) weights it by the rollout's own length, which depends on y. With answers
    of 1 and 2 tokens, exactly over every group of K = 2 and 3: ``constant`` (Dr. GRPO's sum / (K max_len)) gives
    (1 - 1/K) / max_len grad J; ``seq_mean`` gives a vector that is no multiple of grad J (Dr. GRPO's length bias)."""
    theta = THETA.clone().requires_grad_(True)
    logp, tmask, p_xi = answer_token_logprobs(theta)
    p_row = p_xi * logp.sum(1).exp()  # P(mask, answer), [40]
    assert float(p_row.detach().sum()) == pytest.approx(1.0, abs=1e-12)
    (grad_j,) = torch.autograd.grad((p_row * R_ANSWERS.repeat(8)).sum(), theta)
    for K in (2, 3):
        groups = torch.tensor(list(itertools.product(range(len(p_row)), repeat=K)))  # [40^K, K]
        weight = p_row.detach()[groups].prod(-1, keepdim=True)
        adv = (group_advantages(R_ANSWERS.repeat(8)[groups], "drgrpo") * weight).flatten()
        theta = THETA.clone().requires_grad_(True)
        lp = answer_token_logprobs(theta)[0][groups.flatten()]
        obj, _, _, _ = clipped_surrogate(lp, lp.detach(), adv, 0.10, 0.12)
        m = tmask[groups.flatten()]
        grads = {
            kind: torch.autograd.grad(aggregate(obj, m, kind, K, float(m.sum()), 2), theta, retain_graph=True)[0]
            for kind in ("constant", "seq_mean")
        }
        assert torch.allclose(grads["constant"], (1 - 1 / K) / 2 * grad_j, rtol=1e-10, atol=0)
        ratio = grads["seq_mean"] / grad_j
        assert (ratio.max() - ratio.min()).item() > 0.3, (K, ratio)  # a direction of its own (0.15 to 0.53 at K = 2)
