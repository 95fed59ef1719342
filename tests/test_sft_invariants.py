"""Invariants of one SFT optimizer step (``dgrpo.training.sft.sft_step``): how a batch is split into
``sft.grad_accum`` micro-batches changes neither its loss nor its gradients (summed NLL over the step's global token
count, whatever the micro-batches' own counts), with rows of several latent counts in one batch and with
recomputation."""

import random

import pytest
import torch

from dgrpo.training import sft as sft_module
from dgrpo.training.distributed import Dist
from dgrpo.training.sft import make_example, sft_step

from conftest import make_lm, tiny_config

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
