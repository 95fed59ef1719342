"""The GRPO step and its rollouts where mutation testing found them unpinned: the seeds of a later rank's rows (its
rollouts, its null control, its fresh masks), the replay at a sampling temperature, the step's diagnostics by hand,
and the rollout rows the run writes."""

import warnings
from dataclasses import replace

import pytest
import torch

from dgrpo.data.synthetic import generate_split
from dgrpo.model.latent_lm import LatentLM
from dgrpo.perturbation import seeds_for
from dgrpo.training import grpo as grpo_module
from dgrpo.training.grpo import GRPOTrainer
from dgrpo.training.losses import group_advantages, shuffle_within_groups
from dgrpo.training.rollouts import Rollouts

from conftest import tiny_config


def trainer(ckpt, **over) -> GRPOTrainer:
    cfg = tiny_config(**over)
    return GRPOTrainer(LatentLM.from_pretrained(ckpt), cfg, generate_split(cfg.task, "train"))


def rollouts(rewards: list[list[float]], texts: list[str], lengths: list[int], entropy: float = 0.25) -> Rollouts:
    """Rollouts of ``rewards`` [G][K] whose answers are ``texts`` of ``lengths`` tokens (the rest zeros)."""
    n, width = len(texts), max(lengths)
    mask = torch.tensor([[1] * k + [0] * (width - k) for k in lengths])
    zeros = torch.zeros(n, width, dtype=torch.long)
    return Rollouts(
        zeros,
        torch.ones_like(zeros),
        torch.arange(n),
        zeros,
        mask,
        zeros.float(),
        torch.tensor(rewards),
        texts,
        entropy,
    )


def test_a_later_ranks_rollouts_null_control_and_fresh_masks_take_its_global_rows_seeds(sft_checkpoint, monkeypatch):
    """On a rank whose rows start at global row row0 (the rows of the ranks before it; here 8, as rank 1 of two ranks
    of 2 groups of K = 4) the rollouts' masks are those of global rows 8..15 of (run seed, step), the null control
    permutes each group by its global group's seed (groups 2 and 3 of the step's null stream) and the fresh-mask
    ablation draws global rows 8..15 of mini-epoch e's stream: N ranks draw what one process draws (a rank that
    counted its rows from 0 drew rank 0's masks and permutations again)."""
    over = {"grpo.prompts_per_step": 2, "grpo.filter": "false", "grpo.beta0": 0, "grpo.max_new_tokens": 4}
    tr = trainer(sft_checkpoint, **over, **{"grpo.shuffle_rewards": "true", "grpo.replay": "fresh_mask"})
    seed = tr.cfg.seed
    monkeypatch.setattr(tr.dist, "offset", lambda n: 8)
    ro, _, _, _ = tr._rollouts_kept(tr.train_data[:2], step=1)
    assert tr.row0 == 8 and torch.equal(ro.seeds, seeds_for(seed, 1, 0, 16)[8:])
    rows = torch.tensor([0, 3, 6])
    assert torch.equal(tr._update_seeds(ro, rows, 1, 2), seeds_for(seed, 1, 0, 16, stream="fresh/2")[8:][rows])
    rewards = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    _, adv = tr._filter_and_advantages(rewards, step=1)
    null = seeds_for(seed, 1, 0, 4, stream="null")
    assert torch.equal(adv, group_advantages(shuffle_within_groups(rewards, null[2:]), "drgrpo"))
    assert not torch.equal(adv, group_advantages(shuffle_within_groups(rewards, null[:2]), "drgrpo"))  # (rank 0's)


def test_a_sampled_step_replays_its_rollouts_at_their_temperature(sft_checkpoint):
    """grpo.temperature > 0: the rollouts' tokens are drawn, and their log-probs recorded, under softmax(logits / T);
    the update scores them under the same T, so that its replay gives the recorded log-probs back and the ratio is 1
    at theta_old (a replay under greedy's T = 1 scored another policy: log-probs ~1e-1 apart)."""
    over = {"grpo.temperature": 0.5, "grpo.filter": "false", "grpo.prompts_per_step": 1, "grpo.beta0": 0}
    m = trainer(sft_checkpoint, **over, **{"grpo.max_new_tokens": 8}).step()
    assert m["skipped"] == 0 and m["logp_replay_maxdiff"] < 1e-4
    assert m["ratio_max"] == m["ratio_min"] == 1.0


def test_the_step_diagnostics_by_hand(sft_checkpoint, monkeypatch):
    """The step's reward and diversity diagnostics of two groups of K = 4, by hand: rewards [1, 0, 0, 0] and
    [1, 1, 1, 1] (mean 5/8; within-group population std sqrt(3)/4 and 0, mean sqrt(3)/8; one group of zero std);
    the answers 3, 3, 4 and none in the first group (3 distinct), 5 four times in the second (1): 2 per group;
    1 + 2 + ... + 8 = 36 answer tokens over 8 rollouts (4.5 each, not per group); one group of two kept. Two ranks
    holding these same rollouts (each sum over ranks doubled) log the same values: every one is a global sum over a
    global count (a fraction of kept groups summed over ranks logged 1)."""
    tr = trainer(sft_checkpoint, **{"grpo.beta0": 0})
    texts = ["#### 3", "#### 3", "#### 4", "no answer"] + ["#### 5"] * 4
    ro = rollouts([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]], texts, list(range(1, 9)), entropy=0.25)
    expected = {"reward_mean": 5 / 8, "reward_std": 3**0.5 / 8, "frac_zero_std": 0.5, "frac_groups_kept": 0.5}
    expected |= {"distinct_answers": 2.0, "answer_entropy": 0.25, "answer_len": 4.5}
    assert tr._rollout_metrics(ro, torch.tensor([True, False])) == pytest.approx(expected, rel=1e-12, abs=0)
    monkeypatch.setattr(tr.dist, "sum_float", lambda x: 2 * x)
    monkeypatch.setattr(tr.dist, "sum_int", lambda n: 2 * n)
    assert tr._rollout_metrics(ro, torch.tensor([True, False])) == pytest.approx(expected, rel=1e-12, abs=0)


def test_the_rollout_rows_name_their_step_global_group_seed_prompt_and_reward(sft_checkpoint):
    """rollouts.jsonl's rows of the last step (step_idx - 1), on a rank whose rows start at global row 8 (K = 4): row
    i is global group (8 + i) // 4, with its seed, its own prompt (i // 4), completion and reward; n caps them."""
    tr = trainer(sft_checkpoint, **{"grpo.beta0": 0})
    texts = [f"#### {i}" for i in range(8)]
    ro = rollouts([[0.0, 1.0, 0.0, 0.0], [1.0, 1.0, 0.0, 1.0]], texts, [2] * 8)
    ro.seeds = torch.arange(100, 108)
    prompts = tr.train_data[:2]
    assert prompts[0].question != prompts[1].question
    tr.last_rollouts, tr.last_prompts, tr.row0, tr.step_idx = ro, prompts, 8, 3
    rows = tr.rollout_rows(6)
    assert [(r["step"], r["group"], r["seed"], r["completion"], r["reward"]) for r in rows] == [
        (2, 2, 100, "#### 0", 0.0),
        (2, 2, 101, "#### 1", 1.0),
        (2, 2, 102, "#### 2", 0.0),
        (2, 2, 103, "#### 3", 0.0),
        (2, 3, 104, "#### 4", 1.0),
        (2, 3, 105, "#### 5", 1.0),
    ]
    assert [r["question"] for r in rows] == [prompts[0].question] * 4 + [prompts[1].question] * 2
    assert [r["answer"] for r in rows] == [prompts[0].answer] * 4 + [prompts[1].answer] * 2  # (the reward's gold)
    assert tr.rollout_rows(0) == []


def step_gradients(tr: GRPOTrainer, monkeypatch) -> tuple[dict, list[torch.Tensor]]:
    """One step of ``tr`` with its weights held at theta_old; (its metrics, the gradient at each optimizer step)."""
    seen: list[torch.Tensor] = []

    def held(*args, **kwargs):
        seen.append(torch.cat([p.grad.flatten() for p in tr.lm.model.parameters() if p.grad is not None]))

    monkeypatch.setattr(tr.opt, "step", held)
    return tr.step(), seen


def test_the_summed_micro_batch_gradients_are_the_full_batchs_in_every_mini_epoch(sft_checkpoint, monkeypatch):
    """The gradient an optimizer step takes is the sum of its micro-batches' backward passes: 8 rollouts in
    micro-batches of 7 and 1 give the gradient of one batch of 8 (up to float32 summation order), and with the
    weights held at theta_old the second mini-epoch's gradient is the first one's, not their sum (the gradients are
    zeroed after each optimizer step). (The micro-batch invariance test of test_grpo compares weights that one step at
    tiny.yaml's lr moves by ~1e-5, at a tolerance of ~1e-6: it passed with the last micro-batch dropped.)"""
    over = {"grpo.advantage": "ema", "grpo.filter": "false", "grpo.prompts_per_step": 4, "grpo.group_size": 2}
    over |= {"grpo.max_grad_norm": 0, "grpo.max_new_tokens": 8, "grpo.beta0": 0}
    grads = []
    for mb, epochs in ((7, 2), (8, 1)):
        tr = trainer(sft_checkpoint, **over, **{"grpo.micro_batch_size": mb, "grpo.mini_epochs": epochs})
        m, seen = step_gradients(tr, monkeypatch)
        assert m["skipped"] == 0 and m["n_rollouts_kept"] == 8 and len(seen) == epochs
        grads.append(seen)
    (first, second), (whole,) = grads
    assert float(whole.norm()) > 0 and torch.equal(second, first)
    assert float((first - whole).norm()) < 1e-5 * float(whole.norm())


def test_the_logged_replay_difference_is_the_largest_over_answer_tokens(sft_checkpoint, monkeypatch):
    """logp_replay_maxdiff is the largest |replayed - recorded| log-prob over the kept rows' answer tokens, padding
    left out: a replay off by 0.25 on one answer token and by 0.5 on a padding column (mask 0) logs 0.25 (the
    smallest difference logged 0, and the padding's 0.5 was counted), and warns that the replay did not give the
    rollouts' log-probs back."""
    over = {"grpo.filter": "false", "grpo.prompts_per_step": 1, "grpo.beta0": 0, "grpo.max_new_tokens": 8}
    tr = trainer(sft_checkpoint, **over)
    replay = grpo_module.replay_logprobs

    def off(lm, ro, rows, **kw):
        logp, tm = replay(lm, ro, rows, **kw)
        assert tm[0, 0] == 1 and tm.shape[0] > 1
        tm = tm.clone()
        tm[1, -1] = 0  # (the tiny model's answers all run to max_new_tokens: a padding column made here)
        shift = torch.zeros_like(logp)
        shift[0, 0], shift[1, -1] = 0.25, 0.5
        return logp + shift, tm

    monkeypatch.setattr(grpo_module, "replay_logprobs", off)
    with pytest.warns(UserWarning, match="the update's replay gave log-probs up to 0.25"):
        m = tr.step()
    assert m["skipped"] == 0 and abs(m["logp_replay_maxdiff"] - 0.25) < 1e-4


def test_the_replay_warning_is_given_once_past_its_float32_limit_and_not_for_fresh_masks(sft_checkpoint):
    """In float32 a replay more than 1e-3 off the recorded log-probs is warned about, once a run; under
    grpo.replay=fresh_mask, whose masks differ from the rollouts' on purpose, never."""
    tr = trainer(sft_checkpoint, **{"grpo.beta0": 0})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tr._warn_if_replay_differs(9e-4)
    with pytest.warns(UserWarning, match="up to 0.002 away"):
        tr._warn_if_replay_differs(2e-3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tr._warn_if_replay_differs(0.5)  # (warned already)
        tr._replay_warned = False
        tr.cfg = replace(tr.cfg, grpo=replace(tr.cfg.grpo, replay="fresh_mask"))
        tr._warn_if_replay_differs(0.5)


def test_the_step_logs_the_first_mini_epochs_loss_and_the_later_ones_mean_clipping(sft_checkpoint, monkeypatch):
    """With E = 3 mini-epochs (one micro-batch each) the logged policy loss and KL are the first mini-epoch's (the
    objective at theta_old), the clip fractions the mean of the two later ones', each under its own name, and the
    ratio extremes the later ones' max and min (the objective's stats replaced here by values of one's own)."""
    from dgrpo.training.losses import ObjectiveStats

    by_call = [
        ObjectiveStats(1.0, 2.0, 0.0, 0.0, 1.0, 1.0),
        ObjectiveStats(5.0, 6.0, 0.2, 0.4, 1.5, 0.7),
        ObjectiveStats(7.0, 8.0, 0.4, 0.0, 1.2, 0.5),
    ]
    objective = grpo_module.grpo_objective

    def told(*args, **kwargs):
        loss, _ = objective(*args, **kwargs)
        return loss, by_call.pop(0)

    monkeypatch.setattr(grpo_module, "grpo_objective", told)
    over = {"grpo.filter": "false", "grpo.prompts_per_step": 1, "grpo.beta0": 0, "grpo.max_new_tokens": 4}
    m = trainer(sft_checkpoint, **over, **{"grpo.mini_epochs": 3}).step()
    assert not by_call and (m["policy_loss"], m["kl"]) == (1.0, 2.0)
    assert m["clip_frac_low"] == pytest.approx(0.3) and m["clip_frac_high"] == pytest.approx(0.2)
    assert (m["ratio_max"], m["ratio_min"]) == (1.5, 0.5)


def test_every_rank_learns_the_kept_counts_and_whether_a_reward_failed_anywhere():
    """The one all-reduce before any backward sums the kept rollouts, their tokens and the failed rewards over ranks:
    a reward that failed on another rank (its count 1 in the sum) stops this one too."""
    from types import SimpleNamespace

    from dgrpo.training.distributed import Dist
    from dgrpo.training.grpo import agree_on_kept

    assert agree_on_kept(3, 10, Dist.single()) == (3, 10, False)
    assert agree_on_kept(3, 10, Dist.single(), failed=True) == (3, 10, True)
    other_failed = SimpleNamespace(sum_ints=lambda xs: [xs[0] + 5, xs[1] + 20, xs[2] + 1])
    assert agree_on_kept(3, 10, other_failed) == (8, 30, True)


def test_the_trainer_state_comes_back_whole(sft_checkpoint):
    """load_state restores what state took (through JSON, as a checkpoint keeps it): the step, the REINFORCE baseline,
    the rest of the epoch's order (less the indices the training data no longer has), the data RNG and the
    non-finite guard's counts."""
    import json

    tr = trainer(sft_checkpoint, **{"grpo.beta0": 0})
    n = len(tr.train_data)
    tr.step_idx, tr.ema_baseline, tr.order = 2, 0.3, [0, 5, n - 1, n, n + 3]
    tr.guard.skips, tr.guard.streak = 4, 1
    saved = json.loads(json.dumps(tr.state()))
    saved["train_data"] = f"{n + 4}:{saved['train_data'].partition(':')[2]}"  # (trained on 4 rows more than now)
    draws = [tr.data_rng.random() for _ in range(3)]
    tr.step_idx, tr.ema_baseline, tr.order, tr.guard.skips, tr.guard.streak = 0, 0.5, [], 0, 0
    tr.load_state(saved, allow_config_change=True)  # (on other data: refused unless allowed)
    assert (tr.step_idx, tr.ema_baseline, tr.order) == (2, 0.3, [0, 5, n - 1])
    assert (tr.guard.skips, tr.guard.streak) == (4, 1) and [tr.data_rng.random() for _ in range(3)] == draws


def test_a_run_stops_at_max_skip_streak_skipped_steps_in_a_row():
    """grpo.max_skip_streak = 3: a step with an update resets the count of skipped steps in a row; the third skipped
    step in a row (not the fourth) says why the run stops, naming the checkpoint of the step after it."""
    from pathlib import Path
    from types import SimpleNamespace

    from dgrpo.training.grpo import LoopState, _check_stall

    g = tiny_config(**{"grpo.max_skip_streak": 3}).grpo
    run, loop = SimpleNamespace(out_dir=Path("out"), log=lambda line: None), LoopState()
    steps = enumerate([1, 1, 0, 1, 1])
    why = [_check_stall(run, loop, {"step": s, "skipped": k, "reward_mean": 0.0}, g) for s, k in steps]
    assert why == [None] * 5 and loop.skip_streak == 2
    last = _check_stall(run, loop, {"step": 5, "skipped": 1, "reward_mean": 0.0}, g)
    assert last is not None and "for 3 steps in a row" in last and "step-00000006" in last


def test_the_optimizer_takes_the_weight_decay(sft_checkpoint):
    """grpo.weight_decay reaches AdamW (it was dropped without a test noticing)."""
    tr = trainer(sft_checkpoint, **{"grpo.beta0": 0, "grpo.weight_decay": 0.1})
    assert tr.opt.param_groups[0]["weight_decay"] == 0.1


def test_fewer_prompts_than_ranks_is_refused(sft_checkpoint):
    """Every rank holds whole groups: 1 prompt a step over 2 processes is a ConfigError, 2 over 2 are not."""
    from types import SimpleNamespace

    from dgrpo.config import ConfigError
    from dgrpo.training.grpo import _check_shares_and_thoughts

    lm = LatentLM.from_pretrained(sft_checkpoint)
    two = SimpleNamespace(world_size=2)
    _check_shares_and_thoughts(lm, tiny_config(**{"grpo.prompts_per_step": 2}).grpo, two)
    with pytest.raises(ConfigError, match="1 prompt cannot be shared by 2 processes"):
        _check_shares_and_thoughts(lm, tiny_config(**{"grpo.prompts_per_step": 1}).grpo, two)
    with pytest.raises(ConfigError, match="2 prompts cannot be shared by 3 processes"):
        _check_shares_and_thoughts(lm, tiny_config(**{"grpo.prompts_per_step": 2}).grpo, SimpleNamespace(world_size=3))


def test_the_auto_engine_is_fast_only_on_cuda_with_a_batched_perturbation_and_a_static_cache():
    """grpo.engine=auto: the fast engine on a CUDA device, for a perturbation held in tensors and a model that can
    decode over a static KV cache; else (an obstacle named, a CPU, native dropout) the eager one, not an error."""
    from dgrpo.training.rollouts import resolve_engine

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert resolve_engine("auto", cuda, True) == "fast"
    assert resolve_engine("auto", cuda, True, "ALiBi position biases") == "eager"
    assert resolve_engine("auto", cpu, True) == resolve_engine("auto", cuda, False) == "eager"
    assert resolve_engine("eager", cuda, True) == "eager" and resolve_engine("fast", cpu, True) == "fast"
