"""The paper's equations and stated hyper-parameters, each against values worked out by hand from the paper's text
(dropout_grpo_paper.tex: Eq. 1 and Algorithm 1 line 5, Eq. 6, Eq. 7, Sec. 4.4, Sec. 5.3 and Table 2).

The hand values are written out as numbers (with the arithmetic in a comment), not recomputed by the library."""

import math

import pytest
import torch

from dgrpo.config import Config, load_config
from dgrpo.training.losses import GlobalCounts, ObjectiveSettings, group_filter, grpo_objective, huber_k3
from dgrpo.training.schedules import beta_at, lr_at

from conftest import tiny_config

E5 = math.exp(5.0)  # Huber threshold delta = 5 (Sec. 4.2): right-tail slope e^5 - 1 ~ 147.41


def test_paper_recipe_is_table_2_and_sec_5_3():
    """paper/grpo_dropout.yaml against Table 2 and Sec. 5.3: 3000 steps of 16 prompts x K = 32, p = 0.1, peak lr 1e-5
    with 200 warmup steps then cosine, beta0 = 5e-3 annealed with the lr, clip 0.10 / 0.12, filter [0.20, 0.95],
    Huber delta 5, reference renewed every 500 steps, bf16 weights and 8-bit optimizer states; Algorithm 1's Dr. GRPO
    advantage, sequence-mean loss, one gradient step per rollout batch (theta_old <- theta) and mask replay."""
    cfg = load_config(Config, "paper/grpo_dropout.yaml")
    g, p = cfg.grpo, cfg.perturbation
    assert (g.steps, g.prompts_per_step, g.group_size) == (3000, 16, 32)
    assert (p.p, g.lr, g.warmup_steps, g.min_lr_ratio) == (0.1, 1e-5, 200, 0.0)
    assert (g.beta0, g.anneal_beta, g.huber_delta, g.ref_renewal_every) == (5e-3, True, 5.0, 500)
    assert (g.eps_low, g.eps_high) == (0.10, 0.12)
    assert (g.filter, g.alpha_min, g.alpha_max) == (True, 0.20, 0.95)
    assert (g.advantage, g.aggregation, g.mini_epochs, g.replay) == ("drgrpo", "seq_mean", 1, "seed")
    assert (cfg.model.dtype, g.optimizer) == ("bfloat16", "adamw8bit")
    assert g.n_latent == -1  # T from the SFT checkpoint: 6 (test_paper_recipe.py::test_sft_recipe_ends_in_...)
    assert g.kl_form == "paper"  # Sec. 4.2's r := log pi_theta - log pi_ref, as written


def test_the_paper_schedules_eq7_at_the_papers_numbers():
    """Sec. 5.3: eta_max = 1e-5, 200 warmup steps, cosine decay over 3000 steps; Eq. 7: beta(t) = beta0 eta_t / eta_max
    with beta0 = 5e-3, so beta ramps up with the lr's warmup and decays with its cosine.
    Step 0: lr = 1e-5 * 1/200 = 5e-8, beta = 5e-3 / 200 = 2.5e-5. Step 199: the peak. Step 200: the cosine's start
    (the peak). Step 1600: half-way through the 2800 cosine steps, cos(pi/2) = 0: half the peak, beta 2.5e-3."""
    peak, steps, warm, beta0 = 1e-5, 3000, 200, 5e-3
    expect = {0: (5e-8, 2.5e-5), 99: (5e-6, 2.5e-3), 199: (1e-5, 5e-3), 200: (1e-5, 5e-3), 1600: (5e-6, 2.5e-3)}
    for step, (lr, beta) in expect.items():
        assert lr_at(step, peak, steps, warm) == pytest.approx(lr, rel=1e-12), step
        assert beta_at(step, beta0, peak, steps, warm) == pytest.approx(beta, rel=1e-12), step
    # the last step: 1e-5 * (1 + cos(pi * 2799 / 2800)) / 2 = 1e-5 * (1 - cos(pi / 2800)) / 2 ~ 3.147e-12
    assert lr_at(2999, peak, steps, warm) == pytest.approx(3.1471949e-12, rel=1e-6)
    assert max(beta_at(s, beta0, peak, steps, warm) for s in range(steps)) == pytest.approx(beta0, rel=1e-12)


def test_the_filter_window_at_k_32_keeps_7_to_30_right():
    """Sec. 4.4 / Algorithm 1 line 3: a group is dropped when mu_r is outside [0.20, 0.95]. With K = 32 binary rewards
    mu_r = m / 32: 0.20 * 32 = 6.4 and 0.95 * 32 = 30.4, so m = 7..30 are kept (6/32 = 0.1875 and 31/32 = 0.96875
    are not); a window hitting m / K exactly keeps it (closed)."""
    kept = [m for m in range(33) if bool(group_filter(torch.tensor([[1.0] * m + [0.0] * (32 - m)]), 0.20, 0.95))]
    assert kept == list(range(7, 31))
    k20 = [m for m in range(21) if bool(group_filter(torch.tensor([[1.0] * m + [0.0] * (20 - m)]), 0.20, 0.95))]
    assert k20 == list(range(4, 20))  # K = 20: 4/20 = 0.20 and 19/20 = 0.95 exactly, both kept


# Algorithm 1, line 5, on two rollouts of 2 and 3 answer tokens (a third, padded column carries garbage the mask must
# hide). theta_old's log-probs are 0, so the ratios are rho = exp(logp):
#   rollout 0, A = +0.5:  rho = 1.3 (> 1 + 0.12: clipped, 1.12 * 0.5 = 0.56, no gradient), rho = 0.8 (A > 0: the
#                         lower bound does not act: 0.8 * 0.5 = 0.4)                               mean 0.48
#   rollout 1, A = -0.25: rho = 0.8 (< 1 - 0.10: clipped, 0.9 * -0.25 = -0.225, no gradient), rho = 1.3 (A < 0: the
#                         upper bound does not act: -0.325), rho = 1 (-0.25)                      mean -0.8 / 3
#   surrogate = (0.48 - 0.8 / 3) / 2 = 0.32 / 3 = 0.10666...; policy_loss = -0.10666...
# The k3 argument x per token (kl_form unbiased: x = log pi_ref - log pi; paper: its negative), delta = 5:
#   rollout 0: x = [0, 6];  rollout 1: x = [-6, 0.5, -0.5]
#   Huberized k3: k(0) = 0; k(6) = (e^5 - 1)(6 - 5) + (e^5 - 5 - 1) = 2 e^5 - 7 = 289.8263182;
#   k(-6) = (e^-5 - 1)(-6 + 5) + (e^-5 + 5 - 1) = 5 exactly; k(0.5) = e^0.5 - 1.5 = 0.1487213;
#   k(-0.5) = e^-0.5 - 0.5 = 0.1065307
#   unbiased: KL = ((0 + 2 e^5 - 7) / 2 + (5 + 0.1487213 + 0.1065307) / 3) / 2 = (144.9131591 + 1.7517506) / 2
#   paper (x negated): KL = ((0 + 5) / 2 + (2 e^5 - 7 + 0.1065307 + 0.1487213) / 3) / 2 = (2.5 + 96.6938567) / 2
LOGP = [[math.log(1.3), math.log(0.8), 5.0], [math.log(0.8), math.log(1.3), 0.0]]
X_UNBIASED = [[0.0, 6.0, -30.0], [-6.0, 0.5, -0.5]]
MASK = [[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]
ADV = [0.5, -0.25]
SURROGATE = 0.32 / 3
KL_UNBIASED = (144.9131591026 + 1.7517506435) / 2  # 73.3324548730
KL_PAPER = (2.5 + 96.6938567119) / 2  # 49.5969283559


def _objective(kl_form: str, beta: float, counts: GlobalCounts, rows: slice = slice(None)):
    logp = torch.tensor(LOGP, dtype=torch.float64)[rows].requires_grad_(True)
    ref = logp.detach() + torch.tensor(X_UNBIASED, dtype=torch.float64)[rows]  # x = log pi_ref - log pi
    settings = ObjectiveSettings(kl_form=kl_form)
    old, adv, mask = torch.zeros_like(logp), torch.tensor(ADV, dtype=torch.float64)[rows], torch.tensor(MASK)[rows]
    loss, stats = grpo_objective(logp, old, adv, mask, counts, settings, ref_logp=ref, beta=beta)
    (grad,) = torch.autograd.grad(loss, logp)
    return loss, stats, grad


@pytest.mark.parametrize("kl_form, kl", [("unbiased", KL_UNBIASED), ("paper", KL_PAPER)])
def test_algorithm_1_loss_by_hand_clip_sides_sequence_mean_and_huber_kl(kl_form, kl):
    """-1/N sum_k 1/|y_k| sum_l min(rho A, clip(rho, 1 - 0.10, 1 + 0.12) A) + beta 1/N sum_k 1/|y_k| sum_l k3~(x)
    (the hand values above), its clipped tokens' zero gradient, and the KL term's restoring slopes."""
    counts = GlobalCounts(sequences=2, tokens=5, max_len=3)
    loss, stats, grad = _objective(kl_form, 0.0, counts)
    assert float(stats.policy_loss) == pytest.approx(-SURROGATE, rel=1e-12) and loss.item() == pytest.approx(-SURROGATE)
    # d(-surrogate)/d logp = -rho A / (|y_k| N) where unclipped, 0 where clipped or masked:
    # rollout 0: [0, -0.4 / 4]; rollout 1: [0, 0.325 / 6, 0.25 / 6]
    assert torch.allclose(grad, torch.tensor([[0.0, -0.1, 0.0], [0.0, 0.325 / 6, 0.25 / 6]], dtype=grad.dtype))
    assert stats.clip_frac_high == pytest.approx(1 / 5) and stats.clip_frac_low == pytest.approx(1 / 5)

    beta = 0.01
    loss, stats, grad_kl = _objective(kl_form, beta, counts)
    assert float(stats.kl) == pytest.approx(kl, rel=1e-9)
    assert loss.item() == pytest.approx(-SURROGATE + beta * kl, rel=1e-9)
    # the KL term's gradient: beta * dk3~/dx * dx/dlogp / (|y_k| N), dk3~/dx = e^x - 1 inside, e^5 - 1 right of 5,
    # e^-5 - 1 left of -5; dx/dlogp = -1 (unbiased) or +1 (paper, where x is negated)
    sign = -1.0 if kl_form == "unbiased" else 1.0

    def slope(x: float) -> float:
        x = -x if kl_form == "paper" else x
        return E5 - 1 if x > 5 else math.exp(-5) - 1 if x < -5 else math.expm1(x)

    n_tok = [2, 3]
    hand = [
        [sign * beta * slope(x) / (n_tok[k] * 2) if MASK[k][j] else 0.0 for j, x in enumerate(X_UNBIASED[k])]
        for k in range(2)
    ]
    assert torch.allclose(grad_kl - grad, torch.tensor(hand, dtype=grad.dtype), rtol=1e-9, atol=1e-15)


def test_the_loss_is_normalised_by_the_whole_steps_counts():
    """The paper's 1/K_kept and 1/|y_k| are the step's: the two rollouts scored in two micro-batches (or on two ranks)
    with the step's global counts give, summed, the loss and the gradient of the whole (the gradients of separate
    rows are separate entries, so each part's gradient is the whole's on its rows); with per-part counts the sum
    would be twice the surrogate (0.48 + -0.8 / 3 instead of half of it)."""
    counts = GlobalCounts(sequences=2, tokens=5, max_len=3)
    whole, _, g_whole = _objective("unbiased", 0.01, counts)
    parts = [_objective("unbiased", 0.01, counts, slice(k, k + 1)) for k in range(2)]
    assert (parts[0][0] + parts[1][0]).item() == pytest.approx(whole.item(), rel=1e-12)
    assert torch.allclose(torch.cat([parts[0][2], parts[1][2]]), g_whole, rtol=1e-12, atol=0)
    local = [_objective("unbiased", 0.0, GlobalCounts(1, MASK[k].count(1.0), 3), slice(k, k + 1)) for k in range(2)]
    assert (local[0][0] + local[1][0]).item() == pytest.approx(-2 * SURROGATE, rel=1e-12)


def test_huber_k3_eq6_values_at_and_past_the_threshold():
    """Eq. 6 with delta = 5: at +-5 the k3 values e^5 - 6 = 142.4131591 and e^-5 + 4 = 4.0067379; one past, the lines
    add their slopes e^5 - 1 = 147.4131591 and e^-5 - 1 = -0.9932621 (times -1 on the left): 289.8263182 and 5
    (Sec. 4.2: the largest slope e^5 - 1 ~ 147)."""
    x = torch.tensor([5.0, -5.0, 6.0, -6.0], dtype=torch.float64, requires_grad=True)
    k = huber_k3(x, 5.0)
    assert k.tolist() == pytest.approx([142.4131591026, 4.0067379470, 289.8263182052, 5.0], rel=1e-11)
    (g,) = torch.autograd.grad(k.sum(), x)
    assert g.tolist() == pytest.approx([147.4131591026, -0.9932620530, 147.4131591026, -0.9932620530], rel=1e-11)


def test_the_reference_is_renewed_after_every_n_steps(sft_checkpoint):
    """Table 2's reference renewal interval (500 steps, here 2): steps 0 and 1 score against the initial policy; after
    step 1 (two updates) the reference is a copy of the policy, which step 2 then moves away from."""
    from dgrpo.data.synthetic import generate_split
    from dgrpo.model.latent_lm import LatentLM
    from dgrpo.training.grpo import GRPOTrainer

    over = {
        "grpo.ref_renewal_every": 2,
        "grpo.advantage": "ema",  # never all-zero advantages: every step moves the weights
        "grpo.filter": "false",
        "grpo.prompts_per_step": 2,
        "grpo.group_size": 1,
        "grpo.max_new_tokens": 8,
        "grpo.warmup_steps": 0,
        "grpo.lr": 1e-2,
    }
    cfg = tiny_config(**over)
    lm = LatentLM.from_pretrained(sft_checkpoint)
    tr = GRPOTrainer(lm, cfg, generate_split(cfg.task, "train"))
    assert tr.ref is not None

    def flat(model: torch.nn.Module) -> torch.Tensor:
        return torch.cat([p.detach().flatten().float() for p in model.parameters()])

    start = flat(tr.lm.model)
    first = tr.step()
    assert first.get("ref_renewed", 0) == 0 and not torch.equal(flat(tr.lm.model), start)
    assert torch.equal(flat(tr.ref.lm.model), start)  # before the renewal: the initial policy
    assert tr.step().get("ref_renewed") == 1
    renewed = flat(tr.ref.lm.model)
    assert torch.equal(renewed, flat(tr.lm.model)) and not torch.equal(renewed, start)  # the policy after 2 updates
    assert tr.step().get("ref_renewed", 0) == 0
    assert torch.equal(flat(tr.ref.lm.model), renewed) and not torch.equal(flat(tr.lm.model), renewed)


def test_a_step_gives_algorithm_1_the_kept_groups_advantages_and_the_steps_counts(sft_checkpoint, monkeypatch):
    """Algorithm 1, lines 3-5, through the trainer: rewards by position (K = 4) [1, 0, 0, 0] (mu 0.25, kept),
    [1, 1, 1, 1] (mu 1, dropped), [0, 0, 0, 0] (mu 0, dropped), [1, 1, 1, 0] (mu 0.75, kept). The objective sees the
    8 kept rollouts only, in micro-batches of 3, 3 and 2, each with A = r - mu: [0.75, -0.25, -0.25, -0.25] and
    [0.25, 0.25, 0.25, -0.75], and each normalised by the step's counts (8 rollouts, their answer tokens), not its own;
    beta is beta0 * lr / lr_max (Eq. 7)."""
    from dgrpo.data.synthetic import generate_split
    from dgrpo.model.latent_lm import LatentLM
    from dgrpo.training import grpo as grpo_module
    from dgrpo.training.grpo import GRPOTrainer

    pattern = [1.0, 0.0, 0.0, 0.0] + [1.0] * 4 + [0.0] * 4 + [1.0, 1.0, 1.0, 0.0]

    def by_position(completions, records):
        return [pattern[i % 16] for i in range(len(completions))]

    over = {"grpo.prompts_per_step": 4, "grpo.group_size": 4, "grpo.micro_batch_size": 3, "grpo.max_new_tokens": 8}
    cfg = tiny_config(**over, **{"grpo.warmup_steps": 2})
    tr = GRPOTrainer(
        LatentLM.from_pretrained(sft_checkpoint), cfg, generate_split(cfg.task, "train"), reward_fn=by_position
    )
    seen = []
    objective = grpo_module.grpo_objective

    def recording(logp, old, adv, mask, counts, *args, **kwargs):
        seen.append((adv.tolist(), mask.sum().item(), counts, kwargs.get("ref_logp") is not None, kwargs["beta"]))
        return objective(logp, old, adv, mask, counts, *args, **kwargs)

    monkeypatch.setattr(grpo_module, "grpo_objective", recording)
    m = tr.step()
    assert m["frac_groups_kept"] == 0.5 and m["n_rollouts_kept"] == 8
    assert [len(s[0]) for s in seen] == [3, 3, 2]
    assert sum((s[0] for s in seen), []) == [0.75, -0.25, -0.25, -0.25, 0.25, 0.25, 0.25, -0.75]
    kept_rows = torch.tensor([0, 1, 2, 3, 12, 13, 14, 15])
    tokens = float(tr.last_rollouts.mask[kept_rows].sum())
    assert sum(s[1] for s in seen) == tokens
    assert {(s[2].sequences, s[2].tokens, s[2].max_len) for s in seen} == {(8, tokens, 8)}
    # step 0 of a 2-step warmup: lr = lr_max / 2, so beta = beta0 / 2, and the KL term is on (a reference)
    assert m["lr"] == pytest.approx(cfg.grpo.lr / 2) and m["beta"] == pytest.approx(cfg.grpo.beta0 / 2)
    assert all(s[3] and s[4] == pytest.approx(cfg.grpo.beta0 / 2) for s in seen)


def test_huber_k3_defaults_to_the_papers_delta_and_its_far_tails_keep_finite_slopes():
    """Eq. 6 with the paper's delta = 5 as the default (Sec. 4.2: 'We use delta = 5 throughout'): k(6) = 2 e^5 - 7 =
    289.8263182. Far out (x = +-100 in float32, where exp(x) overflows) the lines hold: (e^5 - 1) * 95 + e^5 - 6 =
    14146.6632738 and (e^-5 - 1) * -95 + e^-5 + 4 = 98.3666330, with the slopes e^5 - 1 and e^-5 - 1 (k3 is evaluated
    on the clamped x only, so the branch not taken adds no 0 * inf = NaN to the gradient)."""
    assert huber_k3(torch.tensor([6.0], dtype=torch.float64)).tolist() == pytest.approx([289.8263182052], rel=1e-11)
    x = torch.tensor([100.0, -100.0], requires_grad=True)
    k = huber_k3(x, 5.0)
    assert k.tolist() == pytest.approx([14146.6632738, 98.3666330], rel=1e-6)
    (g,) = torch.autograd.grad(k.sum(), x)
    assert g.tolist() == pytest.approx([E5 - 1, math.exp(-5.0) - 1], rel=1e-6)
