"""The state the update's latent chain hands on (dgrpo.model.latent_chain, a second mutation-testing pass): the
hidden state after the T steps (not the prompt's), the mask and positions advanced by T, the cache's keys and values
the step-by-step recurrence's; padding only where it is asked for (the default: a captured chain's); and no static
memory counted for a chain that runs uncaptured."""

import pytest
import torch

from dgrpo.model.latent_chain import LatentChain, chain_for, run_latent_chain
from dgrpo.model.recompute import dynamic_layer

from conftest import make_lm


@pytest.fixture(scope="module")
def lm_prompts(tokenizer, task_records):
    lm = make_lm(tokenizer, "qwen2")
    ids, mask = lm.encode_questions([r.question[: 14 + 7 * i] for i, r in enumerate(task_records[:3])])
    return lm, ids, mask


def test_the_chains_state_is_the_recurrences_after_its_latent_steps(lm_prompts):
    """After T = 2 steps: the last hidden state (the second thought's, not the prompt's), the mask grown by two real
    columns, the positions advanced by two, and every layer's keys and values, as ``coconut_steps`` leaves them
    (1e-6); the gradient of the hidden state reaches the prompt's (through the chain's backward)."""
    lm, ids, mask = lm_prompts
    lm.kept_decoders.clear()
    with torch.no_grad():
        eager = lm.prefill(ids, mask, 0, markers=False)
        prompt_hidden = eager.last_hidden.clone()
        lm.coconut_steps(eager, 2, None)
    state = lm.prefill(ids, mask, 0, markers=False)
    start = state.last_hidden
    chained = run_latent_chain(lm, state, 2, None, capture=False, keep=False)
    torch.testing.assert_close(chained.last_hidden.detach(), eager.last_hidden, rtol=0, atol=1e-6)
    assert (chained.last_hidden.detach() - prompt_hidden).abs().max() > 1e-3
    assert torch.equal(chained.attention_mask, torch.cat([mask, torch.ones_like(mask[:, :2])], 1))
    assert torch.equal(chained.attention_mask, eager.attention_mask)
    assert torch.equal(chained.next_position, eager.next_position)
    assert torch.equal(chained.next_position, mask.sum(1) + 2)
    for i in range(len(eager.cache.layers)):
        ours, theirs = dynamic_layer(chained.cache, i), dynamic_layer(eager.cache, i)
        torch.testing.assert_close(ours.keys.detach(), theirs.keys, rtol=0, atol=1e-6)
        torch.testing.assert_close(ours.values.detach(), theirs.values, rtol=0, atol=1e-6)
    (grad,) = torch.autograd.grad(chained.last_hidden.sum(), start)
    assert grad.abs().sum() > 0
    lm.model.zero_grad(set_to_none=True)


def test_a_kept_uncaptured_chain_runs_its_batch_unpadded_by_default(lm_prompts, capture_requests):
    """``pad`` defaults to ``keep and capture``: kept but uncaptured, the batch of 3 rows runs as it is
    (``min_rows`` = 8 unused: padding costs a CPU, which has no graph to repay it), while a chain asked to capture
    (run uncaptured here) is of the 8 padded rows."""
    lm, ids, mask = lm_prompts
    for capture, rows in ((False, 3), (True, 8)):
        lm.kept_decoders.clear()
        with torch.no_grad():
            state = lm.prefill(ids, mask, 0, markers=False)
            out = run_latent_chain(lm, state, 2, None, capture=capture, keep=True, min_rows=8)
        assert lm.kept_decoders["update"][1].shape == (rows, mask.shape[1])
        assert out.attention_mask.shape == (3, mask.shape[1] + 2)
    assert capture_requests == [False, True]


def test_an_uncaptured_chain_counts_no_static_memory(lm_prompts):
    """``nbytes`` counts a captured chain's static tensors; an uncaptured one holds the batch's own tensors (no
    copies), so it reports 0 while its forward's outputs are held."""
    lm, ids, mask = lm_prompts
    lm.kept_decoders.clear()
    state = lm.prefill(ids, mask, 0, markers=False)
    chain = chain_for(lm, state, 2, None, capture=False, keep=False)
    assert isinstance(chain, LatentChain)
    out = chain.run(state, None)
    assert chain.outputs and chain.nbytes == 0
    out.last_hidden.sum().backward()
    lm.model.zero_grad(set_to_none=True)


def test_a_chain_kept_uncaptured_is_not_reused_where_capture_is_asked(lm_prompts, capture_requests):
    """Whether a chain captures is part of what it is kept for: after an uncaptured chain was kept, a batch of the
    same shape that asks for capture does not replay it (it would never capture); as for any new key, the first such
    batch runs uncaptured and the repeat makes the captured chain that replaces it."""
    lm, ids, mask = lm_prompts
    lm.kept_decoders.clear()
    with torch.no_grad():
        state = lm.prefill(ids, mask, 0, markers=False)
    first = chain_for(lm, state, 2, None, capture=False, keep=True)
    assert chain_for(lm, state, 2, None, capture=False, keep=True) is first
    assert chain_for(lm, state, 2, None, capture=True, keep=True) is not first
    captured = chain_for(lm, state, 2, None, capture=True, keep=True)
    assert capture_requests == [False, False, True] and lm.kept_decoders["update"][1] is captured
