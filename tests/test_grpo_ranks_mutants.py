"""The GRPO step as one rank of several, where a second pass of mutation testing found it unpinned: the step's counts,
its skip and its logged statistics are the ranks' together (stand-in collectives here, no process group), the rows it
asks the others for, the REINFORCE baseline from every rank's rewards; and the rollouts' entropy and nucleus."""

import math
import warnings
from types import SimpleNamespace

import pytest
import torch

from dgrpo.data.synthetic import generate_split
from dgrpo.model.latent_lm import LatentLM
from dgrpo.perturbation import LockedDropout, seeds_for
from dgrpo.training import grpo as grpo_module
from dgrpo.training.grpo import GRPOTrainer
from dgrpo.training.losses import ObjectiveStats
from dgrpo.training.rollouts import collect_rollouts, latent_chain_obstacle

from conftest import make_lm, tiny_config

# by position (K = 2): group 0 kept (mu 0.5), group 1 dropped (mu 1)
PATTERN = [1.0, 0.0, 1.0, 1.0]
TWO_GROUPS = {"grpo.prompts_per_step": 2, "grpo.group_size": 2}
MINE = (1.0, 2.0, 0.1, 0.2, 1.5, 0.7)  # this rank's objective stats: loss, KL, clip fractions, ratio extremes


def trainer(ckpt, reward_fn=None, **over) -> GRPOTrainer:
    cfg = tiny_config(**{"grpo.beta0": 0, "grpo.max_new_tokens": 4, **over})
    return GRPOTrainer(LatentLM.from_pretrained(ckpt), cfg, generate_split(cfg.task, "train"), reward_fn=reward_fn)


def by_position(completions, records):
    return [PATTERN[i % 4] for i in range(len(completions))]


def test_the_objective_is_normalised_by_every_ranks_kept_rows_and_tokens(sft_checkpoint, monkeypatch):
    """Another rank keeping 5 rollouts of 40 answer tokens: this rank's 2 kept rollouts are normalised by 7 rollouts
    and their tokens + 40 (the step's global counts, from the one all-reduce before any backward), and the step logs
    7 kept rollouts (one process's counts, 2, gave every rank another loss scale than the global batch's). The
    constant norm's length is grpo.max_new_tokens (4), not the step's longest answer (3 here: the rollouts cut)."""
    tr = trainer(sft_checkpoint, by_position, **TWO_GROUPS)
    monkeypatch.setattr(tr.dist, "sum_ints", lambda xs: [xs[0] + 5, xs[1] + 40, xs[2]])
    collect = grpo_module.collect_rollouts

    def cut(*args, **kwargs):  # (the tiny model's answers all run to max_new_tokens)
        ro = collect(*args, **kwargs)
        ro.tokens, ro.mask, ro.rollout_logp = ro.tokens[:, :3], ro.mask[:, :3], ro.rollout_logp[:, :3]
        return ro

    monkeypatch.setattr(grpo_module, "collect_rollouts", cut)
    seen = []
    objective = grpo_module.grpo_objective

    def recording(logp, old, adv, mask, counts, *args, **kwargs):
        seen.append((counts.sequences, counts.tokens, counts.max_len))
        return objective(logp, old, adv, mask, counts, *args, **kwargs)

    monkeypatch.setattr(grpo_module, "grpo_objective", recording)
    m = tr.step()
    tokens = int(tr.last_rollouts.mask[[0, 1]].sum())
    assert m["skipped"] == 0 and m["n_rollouts_kept"] == 7
    assert seen == [(7, tokens + 40, 4)]


@pytest.mark.filterwarnings("ignore:the reward gives 0 to the gold answer")
def test_a_rank_that_kept_nothing_joins_the_others_update(sft_checkpoint, monkeypatch):
    """The DDP-coordinated skip: a rank whose every group is filtered out, while another rank kept rollouts, does not
    skip the step; it runs no backward but joins the gradient reduction and the optimizer step (a rank that skipped on
    its own count left the others waiting in their all-reduce: a hang)."""
    tr = trainer(sft_checkpoint, lambda c, r: [0.0] * len(c), **TWO_GROUPS)
    alone = tr.dist.sum_ints
    monkeypatch.setattr(tr.dist, "sum_ints", lambda xs: [xs[0] + 4, xs[1] + 16, xs[2]])
    reduced, objective_calls = [], []
    monkeypatch.setattr(tr.dist, "all_reduce_grads", lambda model: reduced.append(model))
    monkeypatch.setattr(grpo_module, "grpo_objective", lambda *a, **k: objective_calls.append(a))
    m = tr.step()
    assert m["skipped"] == 0 and m["n_rollouts_kept"] == 4 and m["frac_groups_kept"] == 0.0
    assert reduced == [tr.lm.model] and objective_calls == []
    monkeypatch.setattr(tr.dist, "sum_ints", alone)  # (no rank kept anything: every rank skips)
    assert tr.step()["skipped"] == 1 and reduced == [tr.lm.model]


def test_the_update_statistics_are_reduced_over_ranks_each_by_its_own_reduction(sft_checkpoint, monkeypatch):
    """The logged loss, KL and clip fractions are sums over ranks, the ratio extremes the max and the min, and the
    replay difference the max: with stand-in collectives for another rank (sums add 10, the max is at least 3, the
    min at most 0.25) and this rank's objective stats (1, 2, 0.1, 0.2, 1.5, 0.7) the step logs 11, 12, 10.1, 10.2,
    3, 0.25 and 3 (a ratio summed over ranks, or a KL taken as the max, logged another number than the global one);
    the fraction of kept groups is the sum over ranks of the kept groups over the global number of groups."""
    monkeypatch.setattr(grpo_module, "grpo_objective", lambda *a, **k: (a[0].sum() * 0, ObjectiveStats(*MINE)))
    tr = trainer(sft_checkpoint, by_position, **TWO_GROUPS)
    monkeypatch.setattr(tr.dist, "sum_float", lambda x: x + 10)
    monkeypatch.setattr(tr.dist, "max_float", lambda x: max(x, 3.0))
    monkeypatch.setattr(tr.dist, "min_float", lambda x: min(x, 0.25))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (a replay 3 away is warned about)
        m = tr.step()
    logged = [m[k] for k in ("policy_loss", "kl", "clip_frac_low", "clip_frac_high", "ratio_max", "ratio_min")]
    assert logged == pytest.approx([11.0, 12.0, 10.1, 10.2, 3.0, 0.25], abs=1e-6)
    assert m["logp_replay_maxdiff"] == 3.0
    assert m["frac_groups_kept"] == (1 + 10) / 2  # (1 of this rank's 2 groups kept, the sum over ranks + 10)


def test_a_rank_draws_the_seeds_of_the_rows_after_those_of_the_ranks_before_it(sft_checkpoint, monkeypatch):
    """The rank asks for its row offset with its number of rollout rows (prompts x K), not of prompts: as rank 1 of
    two ranks of 2 prompts each (K = 4) its rows start at global row 8, and its masks are rows 8..15 of the step's."""
    tr = trainer(sft_checkpoint, **{"grpo.prompts_per_step": 2, "grpo.filter": "false"})
    asked = []
    monkeypatch.setattr(tr.dist, "offset", lambda n: asked.append(n) or n)  # (every rank before it has n rows)
    ro, _, _, _ = tr._rollouts_kept(tr.train_data[:2], step=2)
    assert asked == [8] and tr.row0 == 8
    assert torch.equal(ro.seeds, seeds_for(tr.cfg.seed, 2, 0, 16)[8:])


def test_the_reinforce_baseline_moves_by_every_ranks_rewards(sft_checkpoint, monkeypatch):
    """The EMA baseline is updated from the rewards of every rank (gathered in rank order), so that each rank keeps
    the baseline one process would: rewards [1, 1] here and [0, 0, 0, 0, 0, 0] on another rank move it by their mean
    1/4, not by this rank's 1."""
    tr = trainer(sft_checkpoint, **{"grpo.advantage": "ema", "grpo.group_size": 1, "grpo.filter": "false"})
    mine, other = torch.tensor([[1.0], [1.0]]), torch.zeros(6, 1)
    monkeypatch.setattr(tr.dist, "all_gather_objects", lambda obj: [other, obj])
    alpha = tr.cfg.grpo.ema_alpha
    assert tr._update_ema_baseline(mine) == pytest.approx(alpha * 0.5 + (1 - alpha) * 0.25)


def test_a_rank_takes_its_share_of_the_global_prompt_list_drawn_once_per_epoch(sft_checkpoint, monkeypatch):
    """next_prompts draws the step's global prompt list (the same on every rank) and keeps this rank's shard of it
    (a stand-in here: the second half): the prompts an unsharded trainer draws at positions 2 and 3. An epoch of
    draws takes every training record once, shuffled (not in the data's order)."""
    over = {"grpo.prompts_per_step": 4}
    whole, sharded = trainer(sft_checkpoint, **over), trainer(sft_checkpoint, **over)
    monkeypatch.setattr(sharded.dist, "shard", lambda items: items[2:])
    assert [sharded.next_prompts() for _ in range(2)] == [whole.next_prompts()[2:] for _ in range(2)]
    n = len(whole.train_data)
    whole.order = []  # (a new epoch)
    epoch = [r for _ in range(n // 4) for r in whole.next_prompts()]
    index = {id(r): i for i, r in enumerate(whole.train_data)}
    drawn = [index[id(r)] for r in epoch]
    assert sorted(drawn) == list(range(n)) and drawn != list(range(n)) and drawn != list(range(n))[::-1]


def rollouts_of(lm: LatentLM, temperature: float, top_p: float = 1.0):
    recs = generate_split(tiny_config().task, "train")[:2]
    return collect_rollouts(
        lm,
        recs,
        group_size=2,
        n_latent=lm.settings.n_latent,
        perturbation=LockedDropout(p=0.1),
        seeds=seeds_for(0, 0, 0, 4),
        temperature=temperature,
        top_p=top_p,
        max_new_tokens=6,
        reward_fn=lambda c, r: [0.0] * len(c),
    )


def test_sampled_rollouts_keep_the_nucleus_and_record_their_entropy(sft_checkpoint):
    """collect_rollouts samples from grpo.top_p's nucleus: a nucleus of one token (top_p 1e-6) at temperature 1 is the
    greedy answer (the same tokens and masks), the full distribution is not; and the rollouts record the answers'
    mean per-token entropy (positive for the tiny model: it was 0 when the decoder was not asked for it)."""
    lm = LatentLM.from_pretrained(sft_checkpoint)
    greedy, narrow = rollouts_of(lm, 0.0), rollouts_of(lm, 1.0, top_p=1e-6)
    assert torch.equal(narrow.tokens, greedy.tokens) and torch.equal(narrow.mask, greedy.mask)
    assert not torch.equal(rollouts_of(lm, 1.0).tokens, greedy.tokens)
    assert 0.0 < greedy.entropy < math.log(len(lm.tokenizer))


def loop_parts(**over):
    """A stand-in trainer of ``tiny_config(**over)`` (no model: the loop's bookkeeping alone) and a run that records
    its metrics rows, checkpoints and evaluations."""
    from pathlib import Path

    from dgrpo.training.distributed import Dist

    run = SimpleNamespace(out_dir=Path("out"), rows=[], log=lambda line: None, write_rollouts=lambda rows: None)
    run.metrics = SimpleNamespace(write=run.rows.append)
    tr = SimpleNamespace(cfg=tiny_config(**over), dist=Dist.single(), lm=SimpleNamespace(), rollout_rows=lambda n: [])
    return run, tr


def test_the_loop_writes_the_last_and_dropped_steps_rows_counts_skips_and_its_own_collectives(monkeypatch):
    """With grpo.log_every = 5 of 3 steps, step 1's row is not written, the last step's (2) is, and so is a row whose
    update was dropped (a non-finite gradient norm) whatever log_every; each step's skip is counted, and its
    time_comm_s is the time its own collectives took (here none: 0, not the process's 100 s so far)."""
    from dgrpo.training.grpo import LoopState, _logged_step

    run, tr = loop_parts(**{"grpo.steps": 3, "grpo.log_every": 5, "grpo.max_skip_streak": 0})
    tr.dist.comm_s = 100.0
    steps = iter([(1, 1, 0.0), (2, 0, 0.5), (1, 0, float("nan"))])
    tr.step = lambda: dict(zip(("step", "skipped", "grad_norm"), next(steps)), reward_mean=0.0)
    loop = LoopState()
    written = [bool(_logged_step(run, tr, loop)[0] in run.rows) for _ in range(3)]
    assert written == [False, True, True] and loop.skipped == 1
    assert [row["step"] for row in run.rows] == [2, 1] and all(row["time_comm_s"] == 0.0 for row in run.rows)


def test_the_last_step_is_evaluated_and_saved_whatever_the_intervals(monkeypatch):
    """grpo.eval_every = save_every = 2 of 3 steps: after step 1 (1 done) neither is due, after step 2 both, and after
    the last step (3 done, not a multiple of 2) both again: the run's end is validated and checkpointed."""
    from dgrpo.training.grpo import LoopState, _end_step

    run, tr = loop_parts(**{"grpo.steps": 3, "grpo.eval_every": 2, "grpo.save_every": 2})
    tr.guard = SimpleNamespace(tripped=False)
    saved, evaluated = [], []
    monkeypatch.setattr(grpo_module, "_save_resumable", lambda run, trainer, loop: saved.append(trainer.step_idx))
    for done in (1, 2, 3):
        tr.step_idx = done
        _end_step(run, tr, LoopState(), lambda step: evaluated.append(step) or 0.5, None)
    assert evaluated == [2, 3] and saved == [2, 3]


def test_best_is_kept_from_the_end_of_warmup_by_the_first_strictly_better_validation(monkeypatch):
    """best/ is kept by validations at steps >= grpo.warmup_steps (2) only, and replaced only by a strictly better
    one: accuracies 1.0 at step 1 (in warmup), 0.5 at step 2 and 0.5 again at step 3 keep step 2's."""
    from dgrpo.data.records import Record
    from dgrpo.training.grpo import LoopState, _periodic_eval

    run, tr = loop_parts(**{"grpo.warmup_steps": 2})
    kept = []
    monkeypatch.setattr(tr.dist, "save_model", lambda lm, path: kept.append(path))
    recs = [Record("q0", [], "1"), Record("q1", [], "1")]
    right = iter([2, 1, 1])
    loop = LoopState()
    evaluate = _periodic_eval(run, tr, loop, {"v": recs}, lambda lm, local: next(right))
    assert [evaluate(step) for step in (1, 2, 3)] == [1.0, 0.5, 0.5]
    assert loop.best_step == 2 and loop.best_accuracy == 0.5 and len(kept) == 1


def test_a_non_finite_gradient_skips_the_optimizer_step_and_is_counted(sft_checkpoint, monkeypatch):
    """An optimizer step whose summed gradient is not finite is dropped (the optimizer not stepped, the gradients
    zeroed) and counted by the non-finite guard; a finite one after it steps and ends the streak."""
    tr = trainer(sft_checkpoint)
    stepped = []
    monkeypatch.setattr(tr.opt, "step", lambda *a, **k: stepped.append(True))
    params = [p for p in tr.lm.model.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.full_like(p, float("nan"))
    assert math.isnan(tr._optimizer_step()) and stepped == [] and (tr.guard.skips, tr.guard.streak) == (1, 1)
    assert all(p.grad is None for p in params)
    for p in params:
        p.grad = torch.ones_like(p)
    assert tr._optimizer_step() > 0 and stepped == [True] and (tr.guard.skips, tr.guard.streak) == (1, 0)


def test_the_latent_chain_is_refused_for_a_pause_model_by_its_mode(tokenizer):
    """grpo.update_latent_graphs runs the coconut recurrence: a pause-token model (whose latent positions are
    ``<|latent|>`` embeddings) is an obstacle named by its mode, as a coconut one on the same engine is not."""
    lm, cfg = make_lm(tokenizer, "qwen2"), tiny_config(**{"grpo.engine": "fast"})
    assert latent_chain_obstacle(lm, cfg, "fast", distributed=False) is None
    lm.settings.mode = "pause"
    assert latent_chain_obstacle(lm, cfg, "fast", False) == "it runs coconut thoughts; this model's mode is 'pause'"


def test_the_reinforce_arm_keeps_every_rollout_whatever_the_filter_says(sft_checkpoint):
    """REINFORCE + EMA baseline (K = 1: no group accuracy to filter by) ignores grpo.filter, left on here: every
    rollout is kept, with A = r - b (the filter's window applied to groups of one dropped every rollout, or failed)."""
    tr = trainer(sft_checkpoint, **{"grpo.advantage": "ema", "grpo.group_size": 1, "grpo.filter": "true"})
    rewards = torch.tensor([[1.0], [0.0], [1.0]])
    keep, adv = tr._filter_and_advantages(rewards, step=0)
    assert keep.tolist() == [True, True, True] and torch.equal(adv, rewards - 0.5)
