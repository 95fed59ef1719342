"""Invariants of one SFT optimizer step (``dgrpo.training.sft.sft_step``): how a batch is split into
``sft.grad_accum`` micro-batches changes neither its loss nor its gradients (summed NLL over the step's global token
count, whatever the micro-batches' own counts), with rows of several latent counts in one batch and with
recomputation."""

import random

import pytest
import torch

from dgrpo.training import sft as sft_module
from dgrpo.training.curriculum import make_example
from dgrpo.training.distributed import Dist
from dgrpo.training.sft import sft_step

from conftest import make_lm, sft_run_between_steps, tiny_config

#: a batch of rows at random stages (uniform_prob 1) with short chains kept short past max_latent_stage: 0 to 4
#: thoughts per row, so each micro-batch holds other latent counts and other token counts
MIXED = {"sft.uniform_prob": 1.0, "sft.max_latent_stage": 2, "sft.pad_latent_to_max": "false", "sft.c_thought": 2}


def step_grads(tokenizer, records, arch, monkeypatch, **over):
    """(loss, gradients) of one ``sft_step`` on the first 6 records, from the same weights and the same examples."""
    cfg = tiny_config(**{**MIXED, "sft.batch_size": 6, "sft.max_grad_norm": 0, "sft.bf16": "false", **over})
    lm = make_lm(tokenizer, arch)
    lm.use_recompute(cfg.sft, "sft")
    lm.train()
    params = [p for p in lm.model.parameters() if p.requires_grad]
    rng = random.Random(0)
    batch = [make_example(rec, 0, cfg, rng) for rec in records[:6]]
    assert len({ex.n_latent for ex in batch}) > 1  # (the micro-batches group rows of several latent counts)
    seen = {}
    clip = sft_module.clip_gradients

    def capture(ps, max_norm):  # the accumulated gradients, before the optimizer step zeroes them
        seen["grads"] = [p.grad.detach().clone() for p in ps]
        return clip(ps, max_norm)

    monkeypatch.setattr(sft_module, "clip_gradients", capture)
    loss, _, finite = sft_step(lm, torch.optim.SGD(params, lr=0.0), params, batch, cfg, Dist.single(), 0.0)
    assert finite
    return loss, seen["grads"]


@pytest.mark.parametrize("arch", ["qwen2", "gpt2"])
@pytest.mark.parametrize(
    "over",
    [{"sft.grad_accum": 2}, {"sft.grad_accum": 3}, {"sft.grad_accum": 6, "sft.recompute": "true"}],
    ids=["accum2", "accum3", "accum6-recompute"],
)
def test_micro_batches_give_the_whole_batchs_loss_and_gradients(tokenizer, task_records, arch, over, monkeypatch):
    """Gradient accumulation equals one big batch to float rounding (the README's and sft.grad_accum's promise:
    the loss does not depend on it)."""
    loss_1, grads_1 = step_grads(tokenizer, task_records, arch, monkeypatch)
    loss_k, grads_k = step_grads(tokenizer, task_records, arch, monkeypatch, **over)
    assert loss_k == pytest.approx(loss_1, rel=1e-6)
    for g1, gk in zip(grads_1, grads_k, strict=True):
        torch.testing.assert_close(gk, g1, rtol=1e-5, atol=1e-5 * float(g1.abs().max()) + 1e-9)


def test_each_epoch_has_its_own_order_and_an_epoch_its_whole_batches():
    """An epoch's data order is a permutation of its own (seed, epoch): another epoch sees the examples in another
    order (every epoch in one order trained the same batches again and again); an epoch is its whole batches
    (100 examples at batch 32: 3 steps, the 4 left over not a step of their own; fewer than a batch: one step)."""
    from dgrpo.training.curriculum import Curriculum, epoch_steps

    cfg = tiny_config(**{"sft.batch_size": 32})
    plan = Curriculum(cfg, steps_per_epoch=3)
    orders = [plan.epoch_order(e, 100) for e in range(3)]
    assert all(sorted(order) == list(range(100)) for order in orders)
    assert orders[0] != orders[1] != orders[2] and orders[0] == plan.epoch_order(0, 100)
    assert [epoch_steps(n, cfg) for n in (100, 96, 10)] == [3, 3, 1]


def test_a_new_stage_starts_a_new_optimizer_and_lr_schedule_from_its_warmup(monkeypatch):
    """sft.reset_optimizer (reset_every: stage): a stage's epochs share one AdamW and one lr schedule (the stage's
    epochs' steps long); the next stage starts a new AdamW and its schedule at step 0, so its lr warms up again
    (Coconut's optimizer reset at each stage), whatever the run's global step."""
    from dgrpo.training.schedules import lr_at

    cfg = tiny_config(**{"sft.epochs_per_stage": 2, "sft.num_epochs": 4, "sft.warmup_steps": 2, "sft.lr": 1e-3})
    run = sft_run_between_steps(cfg)
    seen = []
    monkeypatch.setattr(
        sft_module, "sft_step", lambda lm, opt, params, local, cfg, dist, lr: seen.append(lr) or (0.0, 0.0, True)
    )
    lrs, optimizers = [], []
    for epoch in range(4):
        run.enter_stage(run.plan.stage(epoch))
        optimizers.append(run.opt)
        for _ in range(4):
            row, applied = run.step([], epoch, run.plan.stage(epoch), 0.0)
            lrs.append(row["lr"])
    assert optimizers[0] is optimizers[1] is not optimizers[2] is optimizers[3]
    assert run.prog.sched_total == 8 and run.prog.global_step == 16 and seen == lrs
    stage = [lr_at(k, 1e-3, 8, 2) for k in range(8)]  # (each stage: 2 epochs of 4 steps)
    assert lrs == stage + stage and lrs[8] == 5e-4  # the second stage warms up again


def test_an_epochs_batches_are_its_orders_slices_laid_out_by_each_steps_own_draws(task_records, monkeypatch):
    """Batch b of an epoch is the examples order[b * batch_size : (b + 1) * batch_size] of the epoch's order, each
    laid out (uniform_prob's stage) by the draws of its global step's own generator, so that a resumed run sees the
    same batches (one generator for every step laid every batch's examples out alike)."""
    from types import SimpleNamespace

    from dgrpo.training.curriculum import Curriculum, epoch_steps, make_example

    cfg = tiny_config(**{"sft.batch_size": 4, "sft.save_every": 0, **MIXED})
    run = sft_run_between_steps(cfg)
    run.lm, run.run = (
        SimpleNamespace(),
        SimpleNamespace(out_dir="unused", metrics=SimpleNamespace(write=lambda row: None)),
    )
    train, batches = task_records[:10], []
    run.plan = Curriculum(cfg, steps_per_epoch=epoch_steps(len(train), cfg))

    def step(local, epoch, stage, t0):
        batches.append(local)
        run.prog.global_step += 1
        return {"loss": 0.0}, True

    monkeypatch.setattr(run, "step", step)
    run.prog.global_step = 7
    bar = SimpleNamespace(update=lambda n: None, set_postfix=lambda **kw: None)
    run.train_epoch(train, 1, 0, 0, bar, 0.0)
    order = run.plan.epoch_order(1, 10)
    assert len(batches) == 2  # (10 examples: 2 whole batches of 4)
    for b, batch in enumerate(batches):
        rng = random.Random(f"{cfg.seed}/examples/{7 + b}")
        assert batch == [make_example(train[i], 0, cfg, rng) for i in order[4 * b : 4 * b + 4]]
