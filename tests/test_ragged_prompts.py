"""Prompts of different lengths (left padding). Every question of the built-in task encodes to the same number of
tokens, so the tests built on ``task_records`` run without left padding, while real data (GSM8K, one's own) has
prompts of many lengths. Here the paths that must agree are compared over prompts of four lengths: each question
with 0-3 more ``Add 0.`` steps (the same answer), so that each row has its own left padding."""

from dataclasses import replace

import pytest
import torch

from dgrpo.config import PerturbationConfig
from dgrpo.perturbation import make_perturbation

from conftest import make_lm, tiny_config

T = 3  # latent thoughts
#: a rotary model (whose attention sees relative positions only, so position ids that miscount the padding still give
#: its results up to rounding) and one with absolute position embeddings (where they do not)
ARCHS = ["qwen2", "gpt2"]


def ragged(records, n):
    """The first ``n`` records, record i with ``i % 4`` more ``Add 0.`` steps (its answer unchanged)."""
    out = []
    for i, r in enumerate(records[:n]):
        k = i % 4
        question = r.question.replace(" Answer mod", " Add 0." * k + " Answer mod")
        out.append(replace(r, question=question, steps=r.steps + [f"<<{r.answer}+0={r.answer}>>"] * k))
    return out


def ragged_batch(lm, records, n=4):
    """The left-padded prompts of ``ragged(records, n)`` (of min(n, 4) lengths: asserted) and its right-padded
    targets."""
    recs = ragged(records, n)
    ids, mask = lm.encode_questions([r.question for r in recs])
    assert len(set(mask.sum(1).tolist())) == min(n, 4)
    tg, tm = lm.encode_targets(["\n".join(r.steps[2:]) + "\n#### " + r.answer for r in recs])
    return ids, mask, tg, tm


def locked():
    return make_perturbation(PerturbationConfig(kind="locked", p=0.3, sites=["attn", "mlp"]))


@pytest.mark.parametrize("granularity", ["call", "layer"])
@pytest.mark.parametrize("arch", ARCHS)
def test_recomputed_backprop_equals_full_backprop_over_ragged_prompts(tokenizer, task_records, arch, granularity):
    """Checkpointed regions recompute each call (or layer) with its own rows' padding masks and positions: the
    log-probs and every gradient equal full backprop's, under a per-row locked dropout mask."""
    from test_recompute import assert_same, loss_and_grads

    lm = make_lm(tokenizer, arch).eval()
    inputs = ragged_batch(lm, task_records)
    kw = {"pert": locked(), "seeds": torch.arange(4), "n_latent": T}
    assert_same(
        loss_and_grads(lm, inputs, recompute=False, **kw), loss_and_grads(lm, inputs, recompute=granularity, **kw)
    )


@pytest.mark.parametrize("recompute", [False, "layer"])
def test_latent_steps_that_save_keys_and_values_once_give_the_same_gradients_over_ragged_prompts(
    tokenizer, task_records, recompute
):
    """``save_kv_once`` keeps each layer's keys and values (the prompt's padded columns too) once for backward: the
    same log-probs and gradients, bit for bit, as keeping them per latent step."""
    lm = make_lm(tokenizer, "qwen2").eval()
    ids, mask, tg, tm = ragged_batch(lm, task_records)
    out = []
    for once in (False, True):
        lm.save_kv_once, lm.recompute = once, recompute
        lm.model.zero_grad(set_to_none=True)
        with locked().bind(lm, torch.arange(4)) as pb:
            lp, _ = lm.target_logprobs(ids, mask, T, tg, tm, perturbation=pb, end_with_targets=True)
        (-(lp * tm).sum()).backward()
        out.append((lp.detach(), {n: p.grad.clone() for n, p in lm.model.named_parameters() if p.grad is not None}))
    (lp_each, g_each), (lp_once, g_once) = out
    assert torch.equal(lp_each, lp_once) and g_each.keys() == g_once.keys() and g_once
    assert all(torch.equal(g_each[k], g_once[k]) for k in g_each)


@pytest.mark.parametrize(("arch", "mode"), [("qwen2", "coconut"), ("gpt2", "coconut"), ("qwen2", "pause")])
def test_sft_loss_of_a_ragged_batch_is_the_sum_of_each_rows_alone(tokenizer, task_records, arch, mode):
    """Coconut SFT's summed NLL over rows of four prompt lengths (and several latent counts, each its own forward)
    equals the sum of each row's loss computed alone, and so does its gradient."""
    import random

    from dgrpo.training.curriculum import make_example
    from dgrpo.training.sft import sft_loss

    over = {"sft.uniform_prob": 1.0, "sft.max_latent_stage": 2, "sft.pad_latent_to_max": "false", "sft.mode": mode}
    cfg = tiny_config(**over)
    lm = make_lm(tokenizer, arch).eval()
    rng = random.Random(1)
    examples = [make_example(r, 0, cfg, rng) for r in ragged(task_records, 8)]
    assert len({e.n_latent for e in examples}) > 1

    def loss_grad(exs):
        lm.model.zero_grad(set_to_none=True)
        loss, n_tok = sft_loss(lm, exs, cfg, 1.0)
        loss.backward()
        return float(loss.detach()), n_tok, lm.model.get_input_embeddings().weight.grad.clone()

    loss, n_tok, grad = loss_grad(examples)
    alone = [loss_grad([e]) for e in examples]
    assert n_tok == sum(a[1] for a in alone)
    assert loss == pytest.approx(sum(a[0] for a in alone), rel=1e-5)
    torch.testing.assert_close(grad, sum(a[2] for a in alone), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("arch", ARCHS)
def test_evaluation_answers_each_ragged_question_as_it_does_alone(tokenizer, task_records, arch):
    """Greedy evaluation in one batch of eight prompts of four lengths predicts, word for word, what each question
    gets alone (batch size 1), under each question's own dropout mask too."""
    from dgrpo.eval.evaluate import evaluate

    lm = make_lm(tokenizer, arch, seed=3).eval()
    recs = ragged(task_records, 8)
    for pert in (None, locked()):
        kw = {"n_latent": T, "max_new_tokens": 12, "progress": False, "perturbation": pert}
        together = evaluate(lm, recs, batch_size=8, **kw)
        alone = evaluate(lm, recs, batch_size=1, **kw)
        assert [p["completion"] for p in together.predictions] == [p["completion"] for p in alone.predictions]
        assert len({p["completion"] for p in together.predictions}) > 1 and together.correct == alone.correct


@pytest.mark.parametrize("arch", ARCHS)
def test_rollouts_in_batches_of_ragged_prompts_are_the_rows_alone_and_replay_in_any_rows(tokenizer, task_records, arch):
    """GRPO rollouts of prompts of four lengths (K = 2, sampled at 0.7 under locked dropout) in batches of 8 rows
    (two widths of padding) and of 1 row give the same answers and log-probs; the replay of any subset of rows (its
    own padding trimmed) gives them back, in the eager engine and in the fast one (``<|end-latent|>`` in the answer's
    call, the latent steps over fixed buffers without grad)."""
    from dgrpo.perturbation import LockedDropout, seeds_for
    from dgrpo.training.rollouts import collect_rollouts, replay_logprobs

    lm = make_lm(tokenizer, arch, seed=1).eval()
    recs, K = ragged(task_records, 8), 2
    pert, seeds = LockedDropout(p=0.3), seeds_for(0, 0, 0, 16)
    kw = dict(group_size=K, n_latent=T, perturbation=pert, seeds=seeds, temperature=0.7, max_new_tokens=8)
    wide = collect_rollouts(lm, recs, batch_size=8, reward_fn=lambda c, r: [0.0] * len(c), **kw)
    one = collect_rollouts(lm, recs, batch_size=1, reward_fn=lambda c, r: [0.0] * len(c), **kw)
    assert wide.texts == one.texts and len(set(wide.texts)) > 1
    assert torch.equal(wide.mask, one.mask)
    torch.testing.assert_close(wide.rollout_logp, one.rollout_logp, rtol=0, atol=1e-5)
    for rows in (torch.tensor([0, 1]), torch.tensor([5, 2, 15]), torch.arange(16)):
        for engine in ("eager", "fast"):
            with torch.no_grad():
                logp, mask = replay_logprobs(
                    lm, wide, rows, n_latent=T, perturbation=pert, seeds=seeds[rows], temperature=0.7, engine=engine
                )
            width = mask.shape[1]
            assert torch.equal(mask, wide.mask[rows, :width]) and not wide.mask[rows, width:].any()
            torch.testing.assert_close(logp, wide.rollout_logp[rows, :width], rtol=0, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_grpo_steps_over_ragged_prompts_are_the_same_in_the_eager_and_the_fast_engine(tokenizer, task_records, arch):
    """Two trainer steps over prompts of four lengths (sampled rollouts, locked dropout, a KL term, micro-batches of
    5 rows across groups): the same rewards, losses and gradient norms with the eager engine, the fast one (its
    rollouts over fixed buffers, its update and reference with ``<|end-latent|>`` in the answer's call) and the fast
    one with the update's latent steps as one chain; each replays its rollouts' log-probs."""
    from test_fixed_shape import code_parity

    from dgrpo.config import Config, load_config
    from dgrpo.training.grpo import GRPOTrainer

    base = ["grpo.prompts_per_step=4", "grpo.group_size=4", "grpo.temperature=1", "grpo.micro_batch_size=5"]
    base += ["grpo.n_latent=2", "grpo.beta0=0.05", "grpo.anneal_beta=false", "grpo.max_new_tokens=12"]
    engines = (["grpo.engine=eager"], ["grpo.engine=fast"], ["grpo.engine=fast", "grpo.update_latent_graphs=true"])
    rows = []
    for over in engines:
        cfg = load_config(Config, "tiny.yaml", [*base, *over])
        trainer = GRPOTrainer(make_lm(tokenizer, arch), cfg, ragged(task_records, 4), reward_fn=code_parity)
        rows.append([trainer.step() for _ in range(2)])
    assert all(m["skipped"] == 0 for m in rows[0])
    for eager, *fast in zip(*rows):
        for m in fast:
            assert m["reward_mean"] == eager["reward_mean"] and m["reward_std"] == eager["reward_std"]
            assert m["policy_loss"] == pytest.approx(eager["policy_loss"], abs=1e-6)
            assert m["kl"] == pytest.approx(eager["kl"], abs=1e-6)
            assert m["grad_norm"] == pytest.approx(eager["grad_norm"], rel=1e-4)
        assert all(m["logp_replay_maxdiff"] < 1e-5 for m in (eager, *fast))
