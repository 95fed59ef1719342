"""The Dropout-GRPO trainer: the determinism failure, loss invariance to micro-batching, the CLI run."""

import copy
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from dgrpo.config import ConfigError
from dgrpo.data.synthetic import generate_split
from dgrpo.model.latent_lm import LatentLM
from dgrpo.training import grpo as grpo_module
from dgrpo.training.grpo import GRPOTrainer, train_grpo

from conftest import dgrpo, tiny_args, tiny_config

METRIC_KEYS = {
    "step",
    "reward_mean",
    "reward_std",
    "frac_zero_std",
    "frac_groups_kept",
    "policy_loss",
    "kl",
    "clip_frac_low",
    "clip_frac_high",
    "ratio_max",
    "ratio_min",
    "grad_norm",
    "lr",
    "beta",
    "answer_entropy",
    "skipped",
    "time_rollout_s",
    "time_update_s",
}


def trainer(ckpt, **over):
    cfg = tiny_config(**over)
    lm = LatentLM.from_pretrained(ckpt)
    train = generate_split(cfg.task, "train")
    return GRPOTrainer(lm, cfg, train)


def test_grpo_adam_betas_reach_the_optimizer(sft_checkpoint):
    """GRPO's AdamW betas were torch's, fixed (SFT's were an option): with bf16 weights and no masters a beta2 of
    0.999 never decays the second moment, and nothing could be done about it."""
    from dgrpo.config import ConfigError

    assert trainer(sft_checkpoint).opt.param_groups[0]["betas"] == (0.9, 0.999)  # the default: torch's
    assert trainer(sft_checkpoint, **{"grpo.adam_betas": "[0.9,0.99]"}).opt.param_groups[0]["betas"] == (0.9, 0.99)
    masters = {"model.dtype": "bfloat16", "model.master_weights": "true", "grpo.adam_betas": "[0.8,0.95]"}
    lm = LatentLM.from_pretrained(sft_checkpoint).to(torch.bfloat16)
    cfg = tiny_config(**masters)
    assert GRPOTrainer(lm, cfg, generate_split(cfg.task, "train")).opt.param_groups[0]["betas"] == (0.8, 0.95)
    with pytest.raises(ConfigError, match=r"grpo.adam_betas: expected two numbers in \[0, 1\)"):
        tiny_config(**{"grpo.adam_betas": "[0.9,1.0]"})


def test_deterministic_grpo_has_zero_std_and_exactly_zero_gradient(sft_checkpoint):
    tr = trainer(
        sft_checkpoint,
        **{"perturbation.kind": "none", "grpo.filter": "false", "grpo.beta0": "0", "grpo.prompts_per_step": "16"},
    )
    before = copy.deepcopy(tr.lm.model.state_dict())
    tr.opt = torch.optim.SGD(tr.lm.model.parameters(), lr=1.0)
    m = tr.step()
    assert m["reward_std"] == 0.0 and m["frac_zero_std"] == 1.0
    assert m["grad_norm"] == 0.0
    after = tr.lm.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # the policy gradient is exactly zero
    # with the filter on (the default), every group is dropped and the step is skipped
    tr2 = trainer(sft_checkpoint, **{"perturbation.kind": "none"})
    m2 = tr2.step()
    assert m2["skipped"] == 1 and m2["frac_groups_kept"] == 0.0


@pytest.mark.parametrize("prompts", ["1", "4"])
def test_deterministic_grpo_under_a_partial_credit_reward_has_zero_std_and_no_update(sft_checkpoint, prompts):
    """Equal rewards that are not 0 or 1 (a partial-credit reward, here 0.1 for every rollout): each group's std is
    exactly 0 (in float32 one group of eight 0.1 had a std of 7e-9: reward_std > 0 and frac_zero_std 0) and its
    advantages are exactly 0, so that Adam moves no weight (a ~1e-8 gradient moved them by a third of its step)."""
    cfg = tiny_config(
        **{
            "perturbation.kind": "none",
            "grpo.filter": "false",
            "grpo.beta0": "0",
            "grpo.group_size": "8",
            "grpo.prompts_per_step": prompts,
        }
    )
    lm = LatentLM.from_pretrained(sft_checkpoint)
    tr = GRPOTrainer(lm, cfg, generate_split(cfg.task, "train"), reward_fn=lambda c, r: [0.1] * len(c))
    before = copy.deepcopy(tr.lm.model.state_dict())
    m = tr.step()
    assert m["reward_std"] == 0.0 and m["frac_zero_std"] == 1.0
    assert m["grad_norm"] == 0.0 and m["policy_loss"] == 0.0
    after = tr.lm.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_locked_dropout_gives_reward_variance(sft_checkpoint):
    tr = trainer(
        sft_checkpoint,
        **{
            "perturbation.kind": "locked",
            "perturbation.p": "0.3",
            "grpo.prompts_per_step": "16",
            "grpo.group_size": "8",
        },
    )
    m = tr.step()
    assert 0.0 < m["reward_mean"] < 1.0  # neither always right nor always wrong
    assert m["reward_std"] > 0 and m["frac_zero_std"] < 1.0


@pytest.mark.parametrize("agg", ["seq_mean", "token_mean", "constant"])
def test_update_is_invariant_to_micro_batch_size(sft_checkpoint, agg, monkeypatch):
    """Micro-batches of 3 and of 64 (the whole batch) give the optimizer the same gradient under each aggregation,
    up to float32 summation order. (It compared the weights after one step, which moved them by ~1e-5 at a 1e-6
    tolerance: it passed with a micro-batch dropped.)"""
    grads = []
    for mb in (3, 64):
        # EMA-baseline advantages are never all zero, so the step has a gradient whatever the rewards
        over = {"perturbation.p": "0.3", "grpo.micro_batch_size": mb, "grpo.filter": "false", "grpo.advantage": "ema"}
        tr = trainer(
            sft_checkpoint, **over, **{"grpo.aggregation": agg, "grpo.beta0": "0.01", "grpo.prompts_per_step": 4}
        )
        seen = []
        held = lambda *a, **k: seen.append(torch.cat([p.grad.flatten() for p in tr.lm.model.parameters()]))  # noqa: B023, E731
        monkeypatch.setattr(tr.opt, "step", held)
        torch.manual_seed(0)
        assert tr.step()["skipped"] == 0 and len(seen) == 1
        grads.append(seen[0])
    assert float(grads[1].norm()) > 0
    assert float((grads[0] - grads[1]).norm()) < 1e-5 * float(grads[1].norm())


def test_mini_epochs_replay_matches_theta_old(sft_checkpoint, monkeypatch):
    tr = trainer(
        sft_checkpoint,
        **{
            "perturbation.p": "0.3",
            "grpo.mini_epochs": "2",
            "grpo.filter": "false",
            "grpo.prompts_per_step": "4",
            "grpo.micro_batch_size": "8",
        },
    )
    seen = []  # (log-probs, old log-probs) of each micro-batch's objective, in call order
    objective = grpo_module.grpo_objective

    def recording(logp, old, *args, **kwargs):
        seen.append((logp.detach().clone(), old.clone()))
        return objective(logp, old, *args, **kwargs)

    monkeypatch.setattr(grpo_module, "grpo_objective", recording)
    monkeypatch.setattr(tr.opt, "step", lambda *a, **k: None)  # the weights stay at theta_old in both mini-epochs
    m = tr.step()
    assert m["skipped"] == 0
    # the first mini-epoch runs at theta_old: its own detached log-probs are the old ones, ratio exactly 1
    assert m["ratio_max"] == 1.0 and m["ratio_min"] == 1.0 and m["clip_frac_high"] == 0.0
    half = len(seen) // 2
    assert len(seen) == 2 * half and half > 1  # two mini-epochs of several micro-batches
    for (logp0, old0), (logp1, old1) in zip(seen[:half], seen[half:]):
        assert torch.equal(old0, logp0)  # epoch 0: against itself
        assert torch.equal(old1, logp0)  # epoch 1: against epoch 0's log-probs, kept per micro-batch
        assert torch.equal(logp1, logp0)  # at the same weights, the second gradient pass replays bit-for-bit


def test_fresh_masks_over_several_mini_epochs_move_the_ratios_at_theta_old_as_the_docs_say(sft_checkpoint, monkeypatch):
    """Under grpo.replay=fresh_mask each mini-epoch draws new masks while the old log-probs are the first one's: the
    later ratios are not 1 even with the weights held at theta_old. docs/metrics.md said the ratios describe the
    weights' move alone; it now says so (and the option's help)."""
    over = {"perturbation.p": "0.3", "grpo.filter": "false", "grpo.prompts_per_step": "4", "grpo.mini_epochs": "2"}
    tr = trainer(sft_checkpoint, **over, **{"grpo.replay": "fresh_mask"})
    monkeypatch.setattr(tr.opt, "step", lambda *a, **k: None)  # theta_old in both mini-epochs
    m = tr.step()
    assert m["skipped"] == 0 and m["ratio_max"] > 1.0 > m["ratio_min"]
    metrics_md = " ".join((Path(__file__).parents[1] / "docs" / "metrics.md").read_text().split())
    assert "each pass draws new masks" in metrics_md and "are not 1 even at theta_old" in metrics_md


def test_with_several_mini_epochs_the_logged_clipping_is_the_later_ones(sft_checkpoint):
    """Mini-epoch 1 runs at theta_old (ratios 1, nothing clipped); the step's clip fractions and ratio extremes
    come from the later ones, where the weights have moved (they were always 1 and 0 before)."""
    over = {"perturbation.p": "0.3", "grpo.filter": "false", "grpo.prompts_per_step": "4", "grpo.lr": "0.05"}
    m = trainer(
        sft_checkpoint, **over, **{"grpo.mini_epochs": "3", "grpo.eps_low": "0.01", "grpo.eps_high": "0.01"}
    ).step()
    assert m["skipped"] == 0 and m["ratio_max"] > 1.0 > m["ratio_min"]
    assert m["clip_frac_low"] + m["clip_frac_high"] > 0
    one = trainer(sft_checkpoint, **over).step()
    assert one["ratio_max"] == one["ratio_min"] == 1.0  # one mini-epoch: the replay is exact


@pytest.mark.parametrize("replay", ["seed", "fresh_mask"])
def test_the_reference_scores_a_step_once_when_its_masks_repeat(sft_checkpoint, monkeypatch, replay):
    """pi_ref is frozen within a step: under mask replay the later mini-epochs reuse the first one's reference
    log-probs (a no-grad pass over every kept row saved per extra mini-epoch), which equal a fresh scoring of those
    rows bit for bit; fresh masks per mini-epoch are scored anew."""
    tr = trainer(
        sft_checkpoint,
        **{
            "perturbation.p": "0.3",
            "grpo.replay": replay,
            "grpo.mini_epochs": "3",
            "grpo.beta0": "0.05",
            "grpo.anneal_beta": "false",
            "grpo.filter": "false",
            "grpo.prompts_per_step": "4",
            "grpo.micro_batch_size": "8",
        },
    )
    scored, passed = [], []  # (epoch, log-probs) of each reference scoring; each objective call's ref_logp
    score, objective = tr._reference_logprobs, grpo_module.grpo_objective

    def scoring(ro, rows, step, epoch):
        out = score(ro, rows, step, epoch)
        scored.append((epoch, rows.clone(), out.clone()))
        return out

    def recording(*args, ref_logp=None, **kwargs):
        passed.append(ref_logp.clone())
        return objective(*args, ref_logp=ref_logp, **kwargs)

    monkeypatch.setattr(tr, "_reference_logprobs", scoring)
    monkeypatch.setattr(grpo_module, "grpo_objective", recording)
    monkeypatch.setattr(tr.opt, "step", lambda *a, **k: None)  # theta_old throughout: the epochs compare
    assert tr.step()["skipped"] == 0
    assert [epoch for epoch, _, _ in scored] == ([0] if replay == "seed" else [0, 1, 2])
    per_epoch = len(passed) // 3
    assert per_epoch > 1 and len(passed) == 3 * per_epoch  # several micro-batches in each of the 3 mini-epochs
    if replay == "seed":
        _, rows, first = scored[0]
        again = score(tr.last_rollouts, rows, tr.step_idx - 1, 2)  # what the third mini-epoch would have scored
        assert torch.equal(again, first)
        for later in (passed[per_epoch : 2 * per_epoch], passed[2 * per_epoch :]):
            assert all(torch.equal(a, b) for a, b in zip(later, passed[:per_epoch]))
    else:  # new masks, new reference log-probs
        assert not torch.equal(scored[0][2], scored[1][2])


@pytest.mark.slow
@pytest.mark.parametrize(
    "over",
    [
        {"grpo.advantage": "ema", "grpo.group_size": "1", "grpo.filter": "false"},  # REINFORCE + dropout, EMA baseline
        {"perturbation.kind": "none", "grpo.temperature": "1.0"},  # token sampling, no dropout
        {"grpo.replay": "fresh_mask", "grpo.filter": "false"},  # new masks at update time (ablation)
        {"grpo.shuffle_rewards": "true", "grpo.filter": "false"},  # the null control
        {"perturbation.kind": "gaussian", "perturbation.sigma": "0.3"},
        {
            "perturbation.kind": "native",
            "perturbation.p": "0.3",
            "grpo.prompts_per_step": "2",
            "grpo.group_size": "2",
            "grpo.filter": "false",
        },
    ],
    ids=["reinforce-ema", "sampling", "fresh-masks", "null-control", "gaussian", "native"],
)
def test_ablations_run(sft_checkpoint, over):
    tr = trainer(sft_checkpoint, **over)
    m = tr.step()
    assert METRIC_KEYS <= set(m)
    for k in ("reward_mean", "lr", "beta", "grad_norm", "time_rollout_s"):
        assert m[k] is not None


@pytest.mark.slow
def test_grpo_cli_end_to_end(sft_checkpoint, tmp_path):
    out = tmp_path / "grpo"
    r = dgrpo("grpo", "--init", sft_checkpoint, "--out", out, *tiny_args(**{"perturbation.p": 0.3}))
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [row for row in rows if "reward_mean" in row]
    assert [row["step"] for row in steps] == [0, 1, 2]
    for row in steps:
        assert METRIC_KEYS <= set(row), METRIC_KEYS - set(row)
    evals = [row for row in rows if "eval/valid/accuracy" in row]
    assert [row["step"] for row in evals] == [0, 2, 3]
    assert (out / "final" / "model.safetensors").exists() and (out / "best" / "latent_config.json").exists()
    res = json.loads((out / "eval" / "builtin_test" / "results.json").read_text())
    assert res["n"] == 64 and 0.0 <= res["accuracy"] <= 1.0


def test_generation_batches_are_stacked_right_padded_to_the_longest():
    """Rollouts gathered from several generation batches (native dropout runs one row per batch): each batch is
    widened to the longest answer with pad / mask 0 / log-prob 0, the rows stacked in order, and the entropy is the
    mean over answer tokens of every batch."""
    from types import SimpleNamespace

    from dgrpo.model.decoding import Generation
    from dgrpo.training.rollouts import _concat

    def gen(tokens, mask, ent):
        t, m = torch.tensor(tokens), torch.tensor(mask)
        return Generation(t, m, m * -0.5, torch.tensor(ent) * m)

    gens = [
        gen([[5, 6, 9], [7, 9, 0]], [[1, 1, 1], [1, 1, 0]], [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]),
        gen([[8]], [[1]], [[10.0]]),
        gen([[4, 4, 4, 9]], [[1, 1, 1, 1]], [[1.0, 1.0, 1.0, 1.0]]),
    ]
    tokens, mask, logp, entropy = _concat(gens, SimpleNamespace(pad_id=0))
    assert tokens.tolist() == [[5, 6, 9, 0], [7, 9, 0, 0], [8, 0, 0, 0], [4, 4, 4, 9]]
    assert mask.tolist() == [[1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1]]
    assert torch.equal(logp, mask * -0.5) and logp.dtype == torch.float32
    assert entropy == pytest.approx((1 + 2 + 3 + 4 + 5 + 10 + 4) / 10)


def test_an_unpaged_8bit_optimizer_steps_without_its_per_parameter_syncs(monkeypatch):
    """``without_per_parameter_syncs``: inside the block a bitsandbytes 8-bit optimizer that is not paged finds its
    ``sync_gpu`` a no-op, restored afterwards; a paged one, or any other optimizer, keeps it."""
    import sys
    import types

    from dgrpo.training.grpo import without_per_parameter_syncs

    calls = []
    module = types.ModuleType("bitsandbytes.optim.optimizer")
    module.sync_gpu = lambda t: calls.append(t)

    class Optimizer8bit:
        def __init__(self, is_paged):
            self.is_paged = is_paged

        def step(self):
            module.sync_gpu("p")

    module.Optimizer8bit = Optimizer8bit
    monkeypatch.setitem(sys.modules, "bitsandbytes.optim.optimizer", module)
    for opt, synced in ((Optimizer8bit(False), 0), (Optimizer8bit(True), 1)):
        calls.clear()
        with without_per_parameter_syncs(opt):
            opt.step()
        assert len(calls) == synced
        opt.step()  # restored after the block
        assert len(calls) == synced + 1
    adamw = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))])
    with without_per_parameter_syncs(adamw):
        module.sync_gpu("q")
    assert calls[-1] == "q"


def test_python_callers_misuse_is_refused_before_a_run_directory_is_touched(sft_checkpoint, tmp_path):
    """A Config changed on the object (skipping load_config's checks), ``valid`` of the other trainer's form, an
    empty training list, swapped arguments, a chat template the tokenizer lacks: each is an error at once, and
    ``out`` is not created."""
    from dgrpo.config import ConfigError
    from dgrpo.training.grpo import train_grpo
    from dgrpo.training.sft import train_sft

    lm = LatentLM.from_pretrained(sft_checkpoint)
    cfg = tiny_config()
    train = generate_split(cfg.task, "train")[:8]
    bad = copy.deepcopy(cfg)
    bad.grpo.eps_low = -5.0
    out = tmp_path / "never"
    with pytest.raises(ConfigError, match="grpo.eps_low"):
        train_grpo(lm, bad, train, out)
    with pytest.raises(TypeError, match="train_grpo: valid must be a dict of records, got list"):
        train_grpo(lm, cfg, train, out, valid=train)
    with pytest.raises(TypeError, match="train_sft: valid must be a list of records, got dict"):
        train_sft(lm, train, cfg, out, valid={"v": train})
    with pytest.raises(ValueError, match="train must be a non-empty list of dgrpo Records, got a list of 0"):
        train_grpo(lm, cfg, [], out)
    with pytest.raises(TypeError, match="cfg must be a dgrpo.config.Config, got list"):
        train_grpo(lm, train, cfg, out)
    with pytest.raises(TypeError, match="cfg must be a dgrpo.config.Config, got dict"):  # (valid given: checked first)
        train_sft(lm, train, {"a": 1}, out, valid=train)
    typo = copy.deepcopy(cfg)
    typo.grpo.group_size = "8x"  # a wrong type on the object: the one-line error a file's value gets
    with pytest.raises(ConfigError, match="grpo.group_size: expected an integer, got '8x'"):
        train_grpo(lm, typo, train, out)
    from dgrpo.training.distributed import Dist
    from dgrpo.training.sharded_eval import sharded_scores

    assert sharded_scores(Dist.single(), lambda local: np.int64(3), train) == {"accuracy": 3 / 8}  # numpy's count too
    with pytest.raises(TypeError, match=r"evaluate_fn returns how many .*got 0.5: an accuracy\? return the count"):
        sharded_scores(Dist.single(), lambda local: 0.5, train)  # the trainers' evaluate_fn, on each rank's shard
    # a scorer failing on one rank's shard: that rank joins the sum with its failure and stops, the others stop at
    # the sum (a review: they died in it with a gloo traceback); a stand-in for two ranks' all-reduce
    from types import SimpleNamespace

    from dgrpo.eval.scoring import RewardError

    sums: list[list[int]] = []
    other_failed = SimpleNamespace(shard=lambda recs: recs, sum_ints=lambda xs: sums.append(xs) or [xs[0], 1, 0])

    def raises(local):
        raise RewardError("scorer mine.py:f raised ValueError")

    with pytest.raises(RewardError, match="mine.py:f raised"):
        sharded_scores(other_failed, raises, train)
    with pytest.raises(RewardError, match="the evaluation failed in another process"):
        sharded_scores(other_failed, lambda local: 3, train)
    with pytest.raises(TypeError, match="evaluate_fn returns how many"):  # (any failure joins the sum: review 3)
        sharded_scores(other_failed, lambda local: 0.5, train)
    assert sums == [[0, 1, 0], [3, 0, 1], [0, 1, 0]]
    chat = tiny_config(**{"data.chat_template": True})  # this tokenizer has no chat template
    with pytest.raises(ConfigError, match="data.chat_template: this tokenizer has no chat template"):
        train_sft(lm, train, chat, out)
    lm.settings.chat_template = False  # (train_sft set it) train_grpo turns it on from the config, as the CLI does
    with pytest.raises(ConfigError, match="data.chat_template: this tokenizer has no chat template"):
        train_grpo(lm, chat, train, out)
    lm.settings.chat_template = False
    with pytest.raises(TypeError, match="train_grpo: lm must be a dgrpo LatentLM .*got Qwen2ForCausalLM"):
        train_grpo(lm.model, cfg, train, out)  # (a TRL habit: the HF model itself)
    # an evaluate_fn of the other trainer's form failed only at the first validation, after a stage had trained
    with pytest.raises(TypeError, match=r"train_sft: evaluate_fn is called as evaluate_fn\(lm, records, settings\)"):
        train_sft(lm, train, cfg, out, valid=train, evaluate_fn=lambda lm_, recs: 0)
    with pytest.raises(TypeError, match=r"train_grpo: evaluate_fn is called as evaluate_fn\(lm, records\)"):
        train_grpo(lm, cfg, train, out, valid={"v": train}, evaluate_fn=lambda lm_, recs, settings: 0)
    with pytest.raises(TypeError, match="train_sft: out_dir must be the run directory's path, got None"):
        train_sft(lm, train, cfg, None)
    with pytest.raises(TypeError, match="out_dir"):
        train_grpo(lm, cfg, train, 3, valid={"v": train})
    with pytest.raises(TypeError, match="train_sft: out_dir must be the run directory's path, got ''"):
        train_sft(lm, train, cfg, "")  # (Path('') is the working directory: the run wrote there)
    # the validation records are checked as the training ones: dict rows failed deep inside ('dict' object has no
    # attribute 'meta'), and an empty set of GRPO's logged an accuracy of 0 at every evaluation and kept best/ by it
    rows = [{"question": r.question, "answer": r.answer} for r in train]
    with pytest.raises(
        ValueError,
        match=r"train_grpo: valid\['v'\] must be a non-empty list of dgrpo Records, got a list of 8 holding dict",
    ):
        train_grpo(lm, cfg, train, out, valid={"v": rows})
    with pytest.raises(
        ValueError, match=r"train_grpo: valid\['v'\] must be a non-empty list of dgrpo Records, got a list of 0"
    ):
        train_grpo(lm, cfg, train, out, valid={"v": []})
    with pytest.raises(
        ValueError, match="train_sft: valid must be a list of dgrpo Records, got a list of 8 holding dict"
    ):
        train_sft(lm, train, cfg, out, valid=rows)
    assert not out.exists()
    # an evaluate_fn without valid records was never called, without a word (no validation, no best/)
    with pytest.warns(
        UserWarning, match=r"train_grpo: evaluate_fn is given but no valid records.*valid=\{'valid': "
    ) as w:
        with pytest.raises(TypeError, match="out_dir"):  # (warned before any run directory: stopped here)
            train_grpo(lm, cfg, train, None, evaluate_fn=lambda lm_, recs: 0)
    assert w[0].filename == __file__  # (the caller's line)
    with pytest.warns(UserWarning, match=r"train_sft: evaluate_fn is given but no valid records.*valid=records") as w:
        with pytest.raises(TypeError, match="out_dir"):
            train_sft(lm, train, cfg, None, valid=[], evaluate_fn=lambda lm_, recs, s: 0)
    assert w[0].filename == __file__  # (the caller's line)


def test_the_trainer_class_checks_what_it_is_given_as_train_grpo_does(sft_checkpoint):
    """GRPOTrainer is public (its ``step()`` is the loop's unit): a group of one rollout set on the config object
    trained on nothing (grad_norm 0, not skipped), and an empty list, dict rows or the HF model itself crashed deep
    inside; each is train_grpo's one-line error, naming GRPOTrainer."""
    from dgrpo.config import ConfigError
    from dgrpo.training.grpo import GRPOTrainer

    lm = LatentLM.from_pretrained(sft_checkpoint)
    cfg = tiny_config()
    one = copy.deepcopy(cfg)
    one.grpo.group_size = 1
    train = generate_split(cfg.task, "train")[:8]
    with pytest.raises(ConfigError, match="group_size"):
        GRPOTrainer(lm, one, train)
    with pytest.raises(
        ValueError, match="GRPOTrainer: train must be a non-empty list of dgrpo Records, got a list of 0"
    ):
        GRPOTrainer(lm, cfg, [])
    with pytest.raises(ValueError, match="GRPOTrainer: train must be a non-empty list of dgrpo Records"):
        GRPOTrainer(lm, cfg, [{"question": "1+1", "answer": "2"}])
    with pytest.raises(TypeError, match="GRPOTrainer: lm must be a dgrpo LatentLM .*got Qwen2ForCausalLM"):
        GRPOTrainer(lm.model, cfg, train)
    with pytest.raises(TypeError, match="GRPOTrainer: cfg must be a dgrpo.config.Config, got dict"):
        GRPOTrainer(lm, {"grpo": {}}, train)
    from dgrpo.training.grpo import train_grpo

    with pytest.raises(TypeError, match=r"got list \(the arguments' order: train_grpo\(lm, cfg, train, out_dir\)\)"):
        train_grpo(lm, train, cfg, "out")  # (train_sft's order: a probe's slip)
    from dgrpo.training.sft import train_sft

    with pytest.raises(TypeError, match=r"got list \(the arguments' order: train_sft\(lm, train, cfg, out_dir\)\)"):
        train_sft(lm, cfg, train, "out")  # (train_grpo's order)
    with pytest.warns(UserWarning, match="grpo.prompts_per_step is 4, more than the 2 training records: every step"):
        trainer = GRPOTrainer(lm, tiny_config(**{"grpo.prompts_per_step": 4}), train[:2])
    assert trainer.rewards.columns == ("source", "split")  # (the training data's: every batch gets each)
    # step(prompts) takes what the trainer takes: dict rows were an AttributeError inside the rollouts
    with pytest.raises(ValueError, match="GRPOTrainer.step: prompts must be a non-empty list of dgrpo Records, got a"):
        trainer.step([{"question": "1+1", "answer": "2"}])
    with pytest.raises(ValueError, match="GRPOTrainer.step: prompts must be a non-empty list of dgrpo Records, got tu"):
        trainer.step(tuple(train[:2]))
    assert trainer.step_idx == 0


def test_a_run_from_a_model_trained_with_the_chat_template_records_that_it_prompts_with_it(sft_checkpoint, tmp_path):
    """The model keeps the template it was trained with; the run's config.json said data.chat_template: false."""
    cfg = tiny_config(**{"grpo.steps": 1, "grpo.prompts_per_step": 2, "data.test": "[]"})
    lm = LatentLM.from_pretrained(sft_checkpoint)
    lm.tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    lm.settings.chat_template = True
    train_grpo(lm, cfg, generate_split(cfg.task, "train"), tmp_path, progress=False, log=lambda m: None)
    assert json.loads((tmp_path / "config.json").read_text())["data"]["chat_template"] is True
    assert cfg.data.chat_template is False and lm.settings.chat_template  # (the caller's config is not changed)


def test_a_trainer_whose_thoughts_and_answer_alone_overflow_the_context_says_so(sft_checkpoint):
    """The start's check, before any question is read, said "question (0 tokens) + ...", and named
    data.max_question_tokens, which cannot help."""
    lm = LatentLM.from_pretrained(sft_checkpoint)
    cfg = tiny_config(**{"grpo.max_new_tokens": 600})
    with pytest.raises(ConfigError) as e:
        GRPOTrainer(lm, cfg, generate_split(cfg.task, "train"))
    t = lm.settings.n_latent
    assert str(e.value) == (
        f"grpo: the sequence does not fit the model's context of 512 positions even without a question: "
        f"{t} latent thought{'s' * (t != 1)} + 2 markers + answer (grpo.max_new_tokens = 600) = {t + 602}; lower "
        "grpo.n_latent or grpo.max_new_tokens"
    )


def test_grpo_on_a_plain_lm_warns_that_its_latent_markers_are_untrained(tokenizer, sft_checkpoint):
    """dgrpo eval said so of a plain LM; GRPO ran on one without a word (untrained markers, untrained thoughts)."""
    import warnings

    from conftest import make_lm

    cfg = tiny_config()
    train = generate_split(cfg.task, "train")
    with pytest.warns(UserWarning, match=r"latent markers \(<\|start-latent\|>, .* are new and untrained"):
        GRPOTrainer(make_lm(tokenizer), cfg, train)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        GRPOTrainer(LatentLM.from_pretrained(sft_checkpoint), cfg, train)
    assert not [w for w in caught if "untrained" in str(w.message)]


def test_the_trainer_gives_the_model_its_config_to_record(sft_checkpoint, tmp_path):
    """A loop of step() calls (docs/from_trl.md) then save_pretrained wrote the --init checkpoint's run_config.json:
    dgrpo eval would read that run's scorer and data keys. Only train_grpo set it."""
    from dgrpo.config import to_dict

    tr = trainer(sft_checkpoint, **{"eval.scorer": "exact"})
    assert tr.lm.run_config == to_dict(tr.cfg)
    tr.lm.save_pretrained(tmp_path / "m")
    assert json.loads((tmp_path / "m" / "run_config.json").read_text())["eval"]["scorer"] == "exact"


def test_a_model_off_the_configs_device_is_warned_about(sft_checkpoint, monkeypatch):
    """load_model puts a model on the CPU unless told; the dgrpo commands move it to cfg.device, a Python caller
    must: on a GPU machine a run of the docs' example trained on the CPU without a word."""
    import warnings

    from dgrpo.training.run_inputs import warn_if_off_device

    lm, cfg = LatentLM.from_pretrained(sft_checkpoint), tiny_config()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # (cfg.device auto: this machine has CUDA)
    with pytest.warns(UserWarning, match=r"train_grpo: the model is on cpu, but device is 'auto' \(cuda\), so it "):
        warn_if_off_device(lm, cfg, "train_grpo")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_off_device(lm, tiny_config(device="cpu"), "train_grpo")
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        warn_if_off_device(lm, cfg, "train_grpo")


def test_the_trainers_off_device_warning_names_their_callers_line(sft_checkpoint, task_records, tmp_path, monkeypatch):
    """train_sft checks what it is given in a helper, one call deeper than train_grpo: its off-device warning named
    train_sft's own line, not its caller's, as train_grpo's does."""
    from dgrpo.training import run_inputs as run
    from dgrpo.training.sft import train_sft

    class Stop(Exception):
        pass

    def stop(*args: object) -> None:  # (the check after the warning: nothing of the run is needed)
        raise Stop

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # (cfg.device auto: this machine has CUDA)
    monkeypatch.setattr(run, "_check_evaluate_fn", stop)
    lm, cfg = LatentLM.from_pretrained(sft_checkpoint), tiny_config()
    for trainer, args in ((train_sft, (lm, task_records[:4], cfg)), (train_grpo, (lm, cfg, task_records[:4]))):
        with pytest.warns(UserWarning, match="the model is on cpu, but device is 'auto'") as said, pytest.raises(Stop):
            trainer(*args, tmp_path / trainer.__name__)
        assert [w.filename for w in said if "is on cpu" in str(w.message)] == [__file__], trainer.__name__


def test_a_model_not_in_model_dtype_is_refused_before_the_run_starts(sft_checkpoint, tmp_path):
    """model.dtype is applied by load_model; a model built in Python keeps its own dtype, and the run recorded
    model.dtype (config.json, final/'s run_config.json, which dgrpo eval takes it from): an fp32-trained run was
    evaluated in bf16. The two must agree."""
    from dgrpo.config import ConfigError
    from dgrpo.training.grpo import train_grpo
    from dgrpo.training.sft import train_sft

    lm = LatentLM.from_pretrained(sft_checkpoint)  # float32
    cfg = tiny_config(**{"model.dtype": "bfloat16", "grpo.steps": 1, "grpo.prompts_per_step": 2})
    train, out = generate_split(cfg.task, "train")[:8], tmp_path / "run"
    match = r"train_grpo: model.dtype is bfloat16, but the model's weights are float32: set model.dtype to the dtype"
    with pytest.raises(ConfigError, match=match):
        train_grpo(lm, cfg, train, out)
    with pytest.raises(ConfigError, match="train_sft: model.dtype is bfloat16, but the model's weights are float32"):
        train_sft(lm, train, cfg, out)
    assert not out.exists()
    lm.to(torch.bfloat16)  # cast: it trains, and records what it trained in
    train_grpo(lm, cfg, train, out, progress=False, log=lambda *a: None)
    assert json.loads((out / "final" / "run_config.json").read_text())["model"]["dtype"] == "bfloat16"


def test_a_null_perturbation_is_warned_when_the_trainer_starts(sft_checkpoint):
    with pytest.warns(UserWarning, match="perturbation.p=0 makes perturbation.kind=locked perturb nothing"):
        trainer(sft_checkpoint, **{"perturbation.p": "0"})


@pytest.mark.parametrize("mode", ["cot", "no_cot"])
def test_latent_thoughts_asked_of_a_checkpoint_without_them_is_one_line_at_start(sft_checkpoint, mode):
    """grpo.n_latent > 0 on a cot / no_cot checkpoint: a traceback at the first rollout, after the step-0 eval."""
    from dgrpo.config import ConfigError

    cfg = tiny_config(**{"grpo.n_latent": "3"})
    lm = LatentLM.from_pretrained(sft_checkpoint)
    lm.settings.mode, lm.settings.n_latent = mode, 0
    with pytest.raises(ConfigError, match=f"grpo.n_latent=3: the checkpoint was trained with sft.mode={mode}"):
        GRPOTrainer(lm, cfg, generate_split(cfg.task, "train"))


@pytest.mark.slow
def test_a_resume_with_another_reward_is_refused(sft_checkpoint, tmp_path):
    """A reward_fn given in Python is not in the config: a run stopped with one and resumed without it (or with
    another) went on with the config's reward, without a word. Checkpoints record the reward; both given is warned."""
    from dgrpo.config import ConfigError
    from dgrpo.training.grpo import train_grpo

    def parity(completions, records):
        return [1.0 + len(c) % 2 for c in completions]

    cfg = tiny_config(**{"grpo.steps": 1, "grpo.prompts_per_step": 2, "grpo.group_size": 2, "grpo.filter": False})
    train, out, quiet = generate_split(cfg.task, "train")[:8], tmp_path / "run", {"progress": False, "log": print}
    train_grpo(LatentLM.from_pretrained(sft_checkpoint), cfg, train, out, reward_fn=parity, **quiet)
    with pytest.raises(ConfigError, match=r"trained with the reward parity = .*test_grpo.*parity \* 1, now numeric ="):
        train_grpo(LatentLM.from_pretrained(sft_checkpoint), cfg, train, out, **quiet)
    lm = LatentLM.from_pretrained(sft_checkpoint)
    train_grpo(lm, cfg, train, out, reward_fn=parity, **quiet)  # the same reward: it resumes
    cfg.sft.lr, cfg.eval.plain = 1.0, True  # what a GRPO run never reads does not stop its resume (it was refused)
    train_grpo(LatentLM.from_pretrained(sft_checkpoint), cfg, train, out, reward_fn=parity, **quiet)
    cfg.grpo.lr *= 2
    changed = (  # (from Python the arguments, not only the command's flags)
        r"a run started with a different config \(grpo.lr\).*--resume never \(resume='never'\), or pass "
        r"--allow-config-change \(allow_config_change=True\)"
    )
    with pytest.raises(ConfigError, match=changed):  # (from Python the argument, not only the command's flag)
        train_grpo(LatentLM.from_pretrained(sft_checkpoint), cfg, train, out, reward_fn=parity, **quiet)
    cfg.grpo.reward = "numeric"
    with pytest.warns(UserWarning, match="reward_fn replaces the config's grpo.reward / grpo.rewards"):
        GRPOTrainer(LatentLM.from_pretrained(sft_checkpoint), cfg, train, reward_fn=parity)


@pytest.mark.slow
def test_valid_without_an_evaluate_fn_is_answered_under_eval_options(sft_checkpoint, tmp_path, monkeypatch):
    """train_grpo and train_sft given valid but no evaluate_fn skipped validation (a warning said so, no best/):
    they now count the records answered right as the commands do, greedy under eval.* (the scorer among them)."""
    from dgrpo.eval import evaluate as evaluate_module
    from dgrpo.training.grpo import train_grpo
    from dgrpo.training.sft import train_sft

    seen = []
    real = evaluate_module.evaluate

    def spy(lm, records, **kw):
        seen.append((len(records), kw["scorer"], kw.get("n_latent")))
        return real(lm, records, **kw)

    monkeypatch.setattr("dgrpo.training.run_inputs.evaluate", spy)
    cfg = tiny_config(**{"grpo.steps": 1, "grpo.prompts_per_step": 2, "grpo.group_size": 2, "eval.scorer": "exact"})
    recs = generate_split(cfg.task, "valid")[:8]
    train_grpo(
        LatentLM.from_pretrained(sft_checkpoint),
        cfg,
        generate_split(cfg.task, "train"),
        tmp_path / "g",
        valid={"valid": recs},
        progress=False,
        log=lambda *a: None,
    )
    rows = [json.loads(line) for line in (tmp_path / "g" / "metrics.jsonl").read_text().splitlines()]
    assert [r["eval/valid/accuracy"] for r in rows if "eval/valid/accuracy" in r] and seen[0][0] == 8
    assert getattr(seen[0][1], "__name__", None) == "exact"  # (eval.scorer)
    assert (tmp_path / "g" / "best").is_dir()
    seen.clear()
    sft = tiny_config(**{"sft.num_epochs": 1, "sft.stage_epochs": "[1]", "sft.eval_each_stage": "true"})
    train_sft(
        LatentLM.from_pretrained(sft_checkpoint),
        generate_split(sft.task, "train")[:16],
        sft,
        tmp_path / "s",
        valid=recs,
        progress=False,
        log=lambda *a: None,
    )
    assert seen and seen[0][0] == 8 and seen[0][2] is not None  # (with the stage's latent steps)


def test_a_kind_of_one_rollout_at_a_time_is_refused_by_the_fast_engine_and_the_compiled_layers(
    sft_checkpoint, tmp_path
):
    """kind=native is refused with engine=fast by name; a NativeDropout of one's own was taken, and its replay
    missed the rollouts' log-probs by 0.65 with one warning."""
    from dgrpo.config import ConfigError

    (tmp_path / "mine.py").write_text(
        "from dgrpo.perturbation import NativeDropout\n\n\nclass Mine(NativeDropout):\n    pass\n"
    )
    kind = {"perturbation.kind": f"{tmp_path / 'mine.py'}:Mine"}
    with pytest.raises(ConfigError, match="grpo.engine=fast needs a perturbation held in tensors .* grpo.engine=eager"):
        trainer(sft_checkpoint, **kind, **{"grpo.engine": "fast"})
    with pytest.raises(ConfigError, match="model.compile: the compiled layers need a perturbation held in tensors"):
        trainer(sft_checkpoint, **kind, **{"grpo.engine": "eager", "model.compile": "true"})
    assert trainer(sft_checkpoint, **kind, **{"grpo.engine": "auto"}).engine == "eager"


def _logged_and_true_grad_norms(run, out: Path) -> tuple[list[float], list[float]]:
    """(``grad_norm`` of each row of ``out``'s metrics.jsonl but a skipped step's, the float32 2-norm of the
    gradients each optimizer step was given) for a run ``run()`` trained without clipping (its gradients reach the
    step as summed)."""
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    true: list[float] = []

    def norm(opt, args, kwargs):
        grads = [p.grad.float() for group in opt.param_groups for p in group["params"] if p.grad is not None]
        true.append(float(torch.linalg.vector_norm(torch.cat([g.flatten() for g in grads]))))

    handle = register_optimizer_step_pre_hook(norm)
    try:
        run()
    finally:
        handle.remove()
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [row["grad_norm"] for row in rows if "grad_norm" in row and not row.get("skipped")], true


def test_a_bf16_sft_run_logs_its_gradient_norm_summed_in_float32(tmp_path):
    """Under model.dtype=bfloat16 clip_grad_norm_ summed the norm in bf16: grad_norm in metrics.jsonl had three
    significant digits (3.9375, 2.859375), and the clipping used it. It is the float32 norm of the bf16 gradients."""
    from dgrpo.model.factory import load_model
    from dgrpo.training.sft import train_sft

    sets = {"model.dtype": "bfloat16", "sft.num_epochs": 2, "task.n_train": 32, "sft.save_every": 0}
    cfg = tiny_config(**sets, **{"sft.max_grad_norm": 0, "sft.warmup_steps": 0})
    lm, out = load_model(cfg.model, cfg.task, seed=0), tmp_path / "sft"
    assert next(lm.model.parameters()).dtype == torch.bfloat16
    train = generate_split(cfg.task, "train")
    logged, true = _logged_and_true_grad_norms(
        lambda: train_sft(lm, train, cfg, out, log=lambda *a: None, progress=False), out
    )
    assert len(logged) == len(true) == 2 and logged == pytest.approx(true, rel=1e-5), (logged, true)


def test_a_bf16_grpo_run_logs_its_gradient_norm_summed_in_float32(sft_checkpoint, tmp_path):
    """GRPO's grad_norm under model.dtype=bfloat16 was bf16 too (see the SFT test above)."""
    cfg = tiny_config(**{"model.dtype": "bfloat16", "grpo.steps": 1, "grpo.max_grad_norm": 0, "grpo.warmup_steps": 0})
    lm, out = LatentLM.from_pretrained(sft_checkpoint).to(torch.bfloat16), tmp_path / "grpo"
    train = generate_split(cfg.task, "train")[:16]
    logged, true = _logged_and_true_grad_norms(
        lambda: train_grpo(lm, cfg, train, out, progress=False, log=lambda *a: None), out
    )
    assert len(logged) == len(true) >= 1 and logged == pytest.approx(true, rel=1e-5), (logged, true)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sets", "why"),
    [
        ({"grpo.save_best": False}, "grpo.save_best=false"),
        ({"grpo.warmup_steps": 3}, "no validation from grpo.warmup_steps=3 on"),  # (a warmup past the run: warned)
    ],
)
def test_a_validated_run_without_best_says_why_it_kept_none(sft_checkpoint, tmp_path, sets, why):
    """The done line said "validation: no best, final 25.00%": no best of what, and why."""
    cfg = tiny_config(**{"grpo.steps": 2, "grpo.prompts_per_step": 2, "grpo.eval_every": 2, "data.test": "[]", **sets})
    train, lines = generate_split(cfg.task, "train")[:8], []
    train_grpo(
        LatentLM.from_pretrained(sft_checkpoint),
        cfg,
        train,
        tmp_path,
        valid={"v": train[:2]},
        progress=False,
        log=lines.append,
    )
    done = next(line for line in lines if "dgrpo grpo: done in" in line)
    assert re.search(rf"; validation: final \d+\.\d\d% \(no best/: {re.escape(why)}\); ", done), done
    assert not (tmp_path / "best").exists()


def test_a_run_whose_every_step_was_skipped_says_that_nothing_was_updated(tmp_path):
    """'3 of 3 steps skipped' was the whole word on a run that trained nothing (the warning comes after 10 skipped
    steps in a row, which a short run never reaches); its final/ is the --init model."""
    import time
    from types import SimpleNamespace

    from dgrpo.training.grpo import LoopState, _summary

    lines: list[str] = []
    run = SimpleNamespace(out_dir=tmp_path, resumed_step=None, log=lines.append)
    _summary(run, LoopState(skipped=3, started=time.time()), 3, {})
    _summary(run, LoopState(skipped=2, started=time.time(), last_eval=0.25, best_step=2, best_accuracy=0.5), 3, {})
    assert lines[0].endswith(
        "; not validated; 3 of 3 steps skipped (every group filtered out): no step updated the model "
        "(metrics.jsonl's reward_mean and frac_groups_kept say why: rewards all equal, or group "
        "accuracies outside grpo.alpha_min / alpha_max)"
    )
    # what the percentages are, and why steps were skipped, said on the line (it was "best 50.00% at step 2; final
    # 25.00%; 2 of 3 steps skipped")
    assert lines[1].endswith(
        "; validation: best 50.00% at step 2, final 25.00%; 2 of 3 steps skipped (every group filtered out)"
    )


def test_the_null_control_trains_on_each_groups_rewards_permuted_by_its_own_null_stream(sft_checkpoint):
    """grpo.shuffle_rewards (the null control, paper Table 1): the advantages are Dr. GRPO's of each group's rewards
    permuted by the seed of the step's ``null`` stream, not the rollout stream, so the same rewards land on other
    rollouts (a step whose shuffle was dropped trained as Dropout-GRPO, and only ran in the ablation test)."""
    from dgrpo.perturbation.base import seeds_for
    from dgrpo.training.losses import group_advantages, shuffle_within_groups

    tr = trainer(sft_checkpoint, **{"grpo.shuffle_rewards": "true", "grpo.filter": "false"})
    tr.row0 = 0
    rewards = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]])
    keep, adv = tr._filter_and_advantages(rewards, step=3)
    null = shuffle_within_groups(rewards, seeds_for(tr.cfg.seed, 3, 0, 3, stream="null"))
    assert keep.all() and torch.equal(adv, group_advantages(null, tr.cfg.grpo.advantage))
    assert not torch.equal(adv, group_advantages(rewards, tr.cfg.grpo.advantage))  # (the same rewards, moved)
    rollout_stream = shuffle_within_groups(rewards, seeds_for(tr.cfg.seed, 3, 0, 3))
    assert not torch.equal(adv, group_advantages(rollout_stream, tr.cfg.grpo.advantage))
    assert torch.equal(adv.sort(dim=1).values, group_advantages(rewards, tr.cfg.grpo.advantage).sort(dim=1).values)


def test_the_filter_keeps_groups_by_its_values_and_the_advantages_are_the_rewards(sft_checkpoint, monkeypatch):
    """The accuracy window (grpo.filter, on the reward grpo.filter_reward names) decides which groups stay; the
    advantages are Dr. GRPO's of the total reward, whatever the filter read (Algorithm 1, lines 5-6)."""
    from dgrpo.training.losses import group_advantages

    tr = trainer(sft_checkpoint, **{"grpo.filter": "true"})
    rewards = torch.tensor([[1.0, 0.5, 0.0, 0.0], [1.0, 1.0, 0.5, 0.0]])
    # the filter's values: every rollout of group 0 correct (outside the window), half of group 1's
    monkeypatch.setattr(tr.rewards, "filter_values", lambda values: [1.0] * 4 + [1.0, 1.0, 0.0, 0.0])
    keep, adv = tr._filter_and_advantages(rewards, step=0)
    assert keep.tolist() == [False, True]
    assert torch.equal(adv, group_advantages(rewards, tr.cfg.grpo.advantage))


def test_the_reinforce_baseline_moves_by_its_alpha_after_a_step(sft_checkpoint):
    """REINFORCE + EMA baseline (the paper's baseline arm): A = r - b with b the baseline before the step, then
    b <- alpha * b + (1 - alpha) * mean(r), from b = 0.5 (by hand at the default alpha)."""
    tr = trainer(sft_checkpoint, **{"grpo.advantage": "ema", "grpo.group_size": "1", "grpo.filter": "false"})
    alpha = tr.cfg.grpo.ema_alpha
    assert alpha != 0.5  # (else alpha and 1 - alpha are one value)
    rewards = torch.tensor([[1.0], [0.0], [1.0], [1.0]])
    _, adv = tr._filter_and_advantages(rewards, step=0)
    assert torch.allclose(adv, rewards - 0.5)
    assert tr._update_ema_baseline(rewards) == pytest.approx(alpha * 0.5 + (1 - alpha) * 0.75)
    _, adv = tr._filter_and_advantages(rewards, step=1)
    assert torch.allclose(adv, rewards - (alpha * 0.5 + (1 - alpha) * 0.75))


def test_each_micro_batch_is_scored_against_the_references_log_probs_of_its_own_rows(sft_checkpoint, monkeypatch):
    """The reference's log-probs are computed once for the step's kept rows (in rollout batches), then sliced per
    micro-batch: at step 0 the reference is a copy of the policy under the same replayed masks, so each micro-batch's
    reference log-probs equal its own replayed log-probs on its answer tokens (every micro-batch scored against the
    first one's rows, the reference's batches written over one another, or other masks, gave a KL > 0 at theta_ref)."""
    over = {"grpo.beta0": "0.05", "grpo.filter": "false", "grpo.prompts_per_step": "2", "grpo.micro_batch_size": "3"}
    tr = trainer(sft_checkpoint, **over, **{"grpo.rollout_batch_size": "5"})  # (the reference scores 5, then 3)
    seen = []
    objective = grpo_module.grpo_objective

    def recording(logp, old, adv, mask, *args, ref_logp=None, **kwargs):
        seen.append((logp.detach().clone(), ref_logp.clone(), mask.clone()))
        return objective(logp, old, adv, mask, *args, ref_logp=ref_logp, **kwargs)

    monkeypatch.setattr(grpo_module, "grpo_objective", recording)
    m = tr.step()
    assert m["skipped"] == 0 and len(seen) == 3  # 8 rows in micro-batches of 3, 3 and 2
    for logp, ref, mask in seen:
        assert ref.shape == logp.shape
        torch.testing.assert_close(ref * mask, logp * mask, rtol=0, atol=1e-5)
    assert m["kl"] == pytest.approx(0.0, abs=1e-6)


def test_the_update_replays_each_kept_rollouts_own_seed(sft_checkpoint, monkeypatch):
    """Mask replay (Algorithm 1, line 7): each micro-batch is scored under the seeds its rollouts were drawn with, the
    step's rollout seeds being (run seed, step, row)'s, new every step; the replayed log-probs are then the rollouts'
    (the logged maxdiff, taken against the kept rows' recorded log-probs: here rows 0-3 and 12-15 of 16)."""
    from dgrpo.perturbation.base import seeds_for

    pattern = [1.0, 0.0, 0.0, 0.0] + [1.0] * 4 + [0.0] * 4 + [1.0, 1.0, 1.0, 0.0]
    cfg = tiny_config(**{"grpo.prompts_per_step": 4, "grpo.micro_batch_size": 3, "grpo.beta0": 0})  # (no reference)
    lm = LatentLM.from_pretrained(sft_checkpoint)
    tr = GRPOTrainer(lm, cfg, generate_split(cfg.task, "train"), reward_fn=lambda c, r: pattern[: len(c)])
    replayed = []
    replay = grpo_module.replay_logprobs

    def recording(lm, ro, rows, *, seeds, **kw):
        replayed.append(seeds.clone())
        return replay(lm, ro, rows, seeds=seeds, **kw)

    monkeypatch.setattr(grpo_module, "replay_logprobs", recording)
    for step in range(2):
        replayed.clear()
        m = tr.step()
        assert m["skipped"] == 0 and m["n_rollouts_kept"] == 8
        seeds = seeds_for(cfg.seed, step, 0, 16)
        assert torch.equal(tr.last_rollouts.seeds, seeds)
        assert torch.equal(torch.cat(replayed), seeds[[0, 1, 2, 3, 12, 13, 14, 15]])
        assert m["logp_replay_maxdiff"] < 1e-4


def test_a_reinforce_step_moves_the_baseline_by_its_rewards(sft_checkpoint):
    """The REINFORCE arm's step updates its EMA baseline from the step's rewards (after the advantages, which used the
    baseline before it): b = alpha * 0.5 + (1 - alpha) * mean(r), logged as ema_baseline. Its one rollout (one prompt,
    K = 1) is an update, not a skip."""
    over = {"grpo.advantage": "ema", "grpo.group_size": "1", "grpo.filter": "false", "grpo.prompts_per_step": "1"}
    tr = trainer(sft_checkpoint, **over)
    alpha = tr.cfg.grpo.ema_alpha
    m = tr.step()
    assert m["skipped"] == 0 and m["n_rollouts_kept"] == 1
    expected = alpha * 0.5 + (1 - alpha) * float(tr.last_rollouts.rewards.mean())
    assert tr.ema_baseline == pytest.approx(expected) and m["ema_baseline"] == pytest.approx(expected)


def test_a_step_clips_the_gradient_to_max_grad_norm_at_the_schedules_lr(sft_checkpoint, monkeypatch):
    """One optimizer step a mini-epoch, after every micro-batch's backward (here 3 of them), at the schedule's lr, on
    the gradient clipped to grpo.max_grad_norm (the logged grad_norm is the norm before clipping)."""
    over = {"grpo.advantage": "ema", "grpo.filter": "false", "grpo.prompts_per_step": "2", "grpo.max_grad_norm": "1e-3"}
    tr = trainer(sft_checkpoint, **over, **{"grpo.warmup_steps": 2, "grpo.micro_batch_size": 3})
    stepped = []  # (lr, gradient norm) at each optimizer step

    def step(*args, **kwargs):
        grads = [p.grad.flatten() for g in tr.opt.param_groups for p in g["params"] if p.grad is not None]
        stepped.append((tr.opt.param_groups[0]["lr"], float(torch.cat(grads).double().norm())))  # (float32's: 1e-5 off)

    tr.opt.param_groups[0]["lr"] = 1.0  # (the step sets its own)
    monkeypatch.setattr(tr.opt, "step", step)
    m = tr.step()
    assert m["grad_norm"] > 1e-2 and m["lr"] == pytest.approx(tr.cfg.grpo.lr / 2)  # step 0 of a 2-step warmup
    clipped = 1e-3 * m["grad_norm"] / (m["grad_norm"] + 1e-6)  # (clip_grad_norm_ divides by the norm + 1e-6)
    assert len(stepped) == 1 and stepped[0] == pytest.approx((m["lr"], clipped), rel=5e-6)


def test_no_kl_term_builds_no_reference_and_zero_thoughts_are_none(sft_checkpoint):
    """grpo.beta0 = 0 (no KL term): no reference copy of the model; grpo.n_latent = 0 rolls out with no latent
    thought (-1 alone means the checkpoint's T)."""
    assert trainer(sft_checkpoint, **{"grpo.beta0": "0"}).ref is None
    assert trainer(sft_checkpoint).ref is not None
    tr = trainer(sft_checkpoint, **{"grpo.n_latent": "0", "grpo.beta0": "0"})
    assert tr.n_latent == 0 and tr.lm.settings.n_latent == 0
    assert trainer(sft_checkpoint, **{"grpo.n_latent": "-1", "grpo.beta0": "0"}).n_latent > 0


def test_the_update_runs_without_the_models_own_dropout(sft_checkpoint):
    """The policy's own dropout modules (hub configs with p > 0, e.g. GPT-2's) stay off in the update: the only noise
    is the replayed perturbation, so the replay gives the rollouts' log-probs back (here with the attention's dropout
    set to 0.5: in train mode the update drew noise the rollouts never saw)."""
    tr = trainer(sft_checkpoint, **{"grpo.filter": "false", "grpo.prompts_per_step": "2", "grpo.beta0": "0"})
    layers = [m for m in tr.lm.model.modules() if hasattr(m, "attention_dropout")]
    assert layers
    for m in layers:
        m.attention_dropout = 0.5
    m = tr.step()
    assert m["skipped"] == 0 and m["logp_replay_maxdiff"] < 1e-4


def test_prompts_of_different_lengths_replay_exactly_at_theta_old(sft_checkpoint, monkeypatch):
    """The built-in task's questions all encode to one length, so no other test of a step left-pads a prompt: here
    the step's four prompts have four lengths, in micro-batches of mixed widths. With the weights held at theta_old,
    mini-epoch 1 runs against itself (ratios exactly 1), mini-epoch 2 replays it bit for bit, and the replay gives
    the rollouts' log-probs back."""
    from dataclasses import replace

    over = {"perturbation.p": "0.3", "grpo.mini_epochs": "2", "grpo.filter": "false", "grpo.micro_batch_size": "6"}
    cfg = tiny_config(**over, **{"grpo.prompts_per_step": "4", "grpo.group_size": "4"})
    train = [replace(r, question=r.question[: 10 + 7 * i]) for i, r in enumerate(generate_split(cfg.task, "train")[:4])]
    tr = GRPOTrainer(LatentLM.from_pretrained(sft_checkpoint), cfg, train)
    widths = tr.lm.encode_questions([r.question for r in train])[1].sum(1).tolist()
    assert len(set(widths)) == 4, widths
    seen = []
    objective = grpo_module.grpo_objective

    def recording(logp, old, *args, **kwargs):
        seen.append((logp.detach().clone(), old.clone()))
        return objective(logp, old, *args, **kwargs)

    monkeypatch.setattr(grpo_module, "grpo_objective", recording)
    monkeypatch.setattr(tr.opt, "step", lambda *a, **k: None)
    m = tr.step()
    assert m["skipped"] == 0 and m["ratio_max"] == m["ratio_min"] == 1.0 and m["logp_replay_maxdiff"] < 1e-5
    half = len(seen) // 2
    assert len(seen) == 2 * half and half == 3  # 16 rows in micro-batches of 6, 6 and 4
    for (logp0, old0), (logp1, old1) in zip(seen[:half], seen[half:]):
        assert torch.equal(old0, logp0) and torch.equal(old1, logp0) and torch.equal(logp1, logp0)
