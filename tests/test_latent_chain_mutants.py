"""The update's latent chain (dgrpo.model.latent_chain), where mutation testing found its behaviour unpinned: the
sampling temperature reaches the chain's scoring, a kept chain is not reused for another number of latent steps or
for inputs of other gradient needs, a spent chain lets its graph go, and the cache helpers refuse layers they cannot
hold."""

import pytest
import torch
from test_fixed_shape import ragged_targets

from dgrpo.model.latent_chain import chain_for, chained_target_logprobs, filled_cache, keys_then_values

from conftest import make_lm, windowed_qwen2_config


@pytest.fixture(scope="module")
def lm_batch(tokenizer, task_records):
    lm = make_lm(tokenizer, "qwen2")
    ids, mask = lm.encode_questions([r.question[: 20 + 9 * i] for i, r in enumerate(task_records[:2])])
    return lm, ids, mask, *ragged_targets(lm, 2)


def test_the_chain_scores_at_the_temperature_it_is_given(lm_batch):
    """The update scores its answers at the rollouts' temperature: ``temperature=0.7`` gives the step-by-step
    recurrence's log-probs at 0.7 (1e-5), not those at 1 (the chain dropped it and the update's ratio compared
    log-probs at two temperatures). After the backward the chain holds nothing of the spent graph."""
    lm, ids, mask, tg, tm = lm_batch
    lm.kept_decoders.clear()
    with torch.no_grad():
        eager = lm.target_logprobs(ids, mask, 2, tg, tm, temperature=0.7, end_with_targets=True)[0]
        at_one = lm.target_logprobs(ids, mask, 2, tg, tm, end_with_targets=True)[0]
    chained = chained_target_logprobs(lm, ids, mask, 2, tg, tm, temperature=0.7, keep=True)
    torch.testing.assert_close(chained.detach(), eager, rtol=0, atol=1e-5)
    assert (chained.detach() - at_one).abs().max() > 1e-2
    chained.sum().backward()
    chain = lm.kept_decoders["update"][1]
    assert chain.outputs == [] and chain.views == []  # (the forward's activations are not kept to the next batch)
    lm.model.zero_grad(set_to_none=True)


def test_a_kept_chain_runs_the_latent_steps_it_was_asked_for(lm_batch):
    """A chain kept for T = 2 is not replayed for T = 3 of the same prompts (one latent step short, silently): each
    gets the step-by-step recurrence's log-probs for its own T."""
    lm, ids, mask, tg, tm = lm_batch
    lm.kept_decoders.clear()
    for n_latent in (2, 3):
        with torch.no_grad():
            eager = lm.target_logprobs(ids, mask, n_latent, tg, tm, end_with_targets=True)[0]
            chained = chained_target_logprobs(lm, ids, mask, n_latent, tg, tm, keep=True)
        torch.testing.assert_close(chained, eager, rtol=0, atol=1e-5)
        assert lm.kept_decoders["update"][1].n_latent == n_latent


def test_a_kept_chain_is_not_reused_for_inputs_of_other_gradient_needs(lm_batch):
    """The chain's gradients go to the inputs that required them when it was made (on CUDA its captured backward
    computes those only): the same shapes, detached, get another chain, and the first one back after them."""
    lm, ids, mask, _, _ = lm_batch
    lm.kept_decoders.clear()
    state = lm.prefill(ids, mask, 0, markers=False)
    assert state.last_hidden.requires_grad
    first = chain_for(lm, state, 2, None, capture=False, keep=True)
    assert chain_for(lm, state, 2, None, capture=False, keep=True) is first
    state.last_hidden = state.last_hidden.detach()
    assert chain_for(lm, state, 2, None, capture=False, keep=True) is not first


def test_the_cache_helpers_refuse_sliding_window_layers():
    """The chain holds full-attention keys and values as they are: a sliding-window layer (which trims its own) is a
    NotImplementedError naming it, both ways, not a cache that silently keeps every column."""
    from transformers import DynamicCache

    cfg = windowed_qwen2_config()
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    keys = [torch.zeros(1, cfg.num_key_value_heads, 3, head_dim) for _ in range(2)]
    with pytest.raises(NotImplementedError, match="layer 1 is DynamicSlidingWindowLayer"):
        filled_cache(cfg, keys, keys)
    cache = DynamicCache(config=cfg)
    for i, k in enumerate(keys):
        cache.update(k, k, i)
    with pytest.raises(NotImplementedError, match="layer 1 of the cache holds no full-attention keys"):
        keys_then_values(cache)


def test_a_narrower_prompt_of_the_kept_rows_is_padded_to_the_kept_chain_and_cut_back(tokenizer, task_records):
    """``pad``: a batch of the kept chain's rows but a narrower prompt bucket runs inside the kept chain's columns
    (padding columns on the left; the kept chain serves it) and gets the unpadded recurrence's log-probs (1e-5); the
    state it hands on is its own: its prompt columns and the T latent ones, the padding cut off."""
    from dgrpo.model.latent_chain import bucketed_prompt, run_latent_chain

    lm = make_lm(tokenizer, "qwen2")
    wide = [r.question + " " + r.question for r in task_records[:2]]
    short = [r.question[:12] for r in task_records[2:4]]
    tg, tm = ragged_targets(lm, 2)
    chained_target_logprobs(lm, *lm.encode_questions(wide), 2, tg, tm, keep=True, pad=True)
    kept = lm.kept_decoders["update"][1]
    ids, mask = bucketed_prompt(lm, *lm.encode_questions(short))
    assert kept.shape[0] == 2 and kept.shape[1] > ids.shape[1]
    with torch.no_grad():
        eager = lm.target_logprobs(ids, mask, 2, tg, tm, end_with_targets=True)[0]
    padded = chained_target_logprobs(lm, ids, mask, 2, tg, tm, keep=True, pad=True)  # (with grad, as the first)
    torch.testing.assert_close(padded.detach(), eager, rtol=0, atol=1e-5)
    assert lm.kept_decoders["update"][1] is kept
    state = lm.prefill(ids, mask, 0, markers=False)
    out = run_latent_chain(lm, state, 2, None, capture=False, keep=True, pad=True)
    assert torch.equal(out.attention_mask, torch.cat([mask, torch.ones_like(mask[:, :2])], 1))
    assert keys_then_values(out.cache)[0].shape[2] == ids.shape[1] + 2
    assert torch.equal(out.next_position, state.next_position + 2)


def test_the_chain_scores_within_the_scoring_block(lm_batch, monkeypatch):
    """The update's replay is teacher-forced scoring: its prompt, latent steps and answer run within the model's
    scoring block (where ``model.compile``'s compiled layers serve it), and the block is closed after."""
    lm, ids, mask, tg, tm = lm_batch
    seen = []
    prefill, score = lm.prefill, lm.score_targets
    monkeypatch.setattr(lm, "prefill", lambda *a, **kw: seen.append(lm._scoring) or prefill(*a, **kw))
    monkeypatch.setattr(lm, "score_targets", lambda *a, **kw: seen.append(lm._scoring) or score(*a, **kw))
    with torch.no_grad():
        chained_target_logprobs(lm, ids, mask, 2, tg, tm)
    assert seen == [True, True] and lm._scoring is False


def test_a_padded_batch_that_outgrows_the_kept_chain_replaces_it_at_once(lm_batch, task_records, capture_requests):
    """``wait_for_repeat=False`` (a batch padded to the kept chain's shape meets a new one only when it outgrows
    it): the new shape is captured and kept at its first batch, not run uncaptured until it comes twice (the
    capture is CUDA's: here each chain records whether it was asked to capture)."""
    lm = lm_batch[0]
    lm.kept_decoders.clear()
    asked = capture_requests
    states = [lm.prefill(*lm.encode_questions([r.question for r in task_records[:rows]]), 0) for rows in (2, 3)]
    first = chain_for(lm, states[0], 2, None, capture=True, keep=True, wait_for_repeat=False)
    grown = chain_for(lm, states[1], 2, None, capture=True, keep=True, wait_for_repeat=False)
    assert asked == [True, True] and grown is not first and lm.kept_decoders["update"][1] is grown
    lm.kept_decoders.clear()
