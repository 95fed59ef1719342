"""Native dropout (dgrpo.perturbation.native), pinned where mutation testing found the tests blind: GPT-2's own
dropout module (the path that calls it: eager attention, reordered and upcast), and a model whose attention keeps a
rate in some layers only."""

from __future__ import annotations

import torch

from dgrpo.model.anatomy import attention_modules
from dgrpo.perturbation import NativeDropout, seeds_for

from conftest import make_lm

T = 2


def test_gpt2s_attention_dropout_module_is_switched_on_where_it_is_called(tokenizer, task_records):
    """GPT-2 with eager attention, reordered and upcast, drops its attention weights through its ``attn_dropout``
    module itself (not the rate handed to an attention function): native dropout switches that module on too, and
    off again after."""
    lm = make_lm(tokenizer, "gpt2")
    lm.model.config._attn_implementation = "eager"
    for attn in attention_modules(lm.model):
        attn.reorder_and_upcast_attn = True
    lm.eval()
    ids, mask = lm.encode_questions([task_records[0].question])
    plain = lm.generate(ids, mask, T, max_new_tokens=4)
    with NativeDropout(p=0.5).bind(lm, seeds_for(0, 0, 0, 1)) as pb:
        assert not torch.equal(lm.generate(ids, mask, T, max_new_tokens=4, perturbation=pb).logprobs, plain.logprobs)
    assert all(not m.training for m in lm.model.modules())


def test_a_model_with_a_rate_in_some_attention_modules_binds(tokenizer):
    """Only a model with no rate anywhere is refused: one whose first layer lacks it binds, and its other layers'
    rates are set to p inside the block."""
    lm = make_lm(tokenizer, "qwen2")
    first, *rest = attention_modules(lm.model)
    del first.attention_dropout
    with NativeDropout(p=0.3).bind(lm, torch.tensor([1])):
        assert [m.attention_dropout for m in rest] == [0.3] * len(rest) and not hasattr(first, "attention_dropout")
