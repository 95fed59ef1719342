"""Gaps that mutation testing of the fast engine's CPU-checkable parts found (dgrpo.model.attention_mask,
static_cache, kv_prefixes, recompute, fixed_shape): small hand-computed cases pinning what each promises."""

from types import SimpleNamespace

import pytest
import torch
from test_fixed_shape import ragged_batch

from dgrpo.model.attention_mask import prebuilt_mask_applies, static_causal_padding_mask
from dgrpo.model.gqa_attention import PACKED_GQA

from conftest import distinct_markers, make_lm, windowed_qwen2_config


@pytest.mark.parametrize(
    ("config", "applies"),
    [
        ({}, True),
        ({"_attn_implementation": PACKED_GQA}, True),
        ({"model_type": "llama", "layer_types": ["full_attention", "full_attention"]}, True),
        ({"_attn_implementation": "eager"}, False),
        ({"_attn_implementation": "flash_attention_2"}, False),
        ({"model_type": "mistral"}, False),
        ({"layer_types": ["full_attention", "sliding_attention"]}, False),
        ({"sliding_window": 4}, False),
    ],
    ids=["sdpa", "packed-gqa", "full-layers", "eager", "flash", "unchecked-type", "a-sliding-layer", "sliding"],
)
def test_the_prebuilt_mask_applies_to_sdpa_full_attention_of_checked_types_only(config, applies):
    """SDPA or packed-GQA attention, every layer full attention (by ``layer_types``, else no ``sliding_window``) and
    an architecture whose mask the tests compare with Hugging Face's: only then is the device-built mask used."""
    base = {"_attn_implementation": "sdpa", "model_type": "qwen2", "sliding_window": None}
    assert prebuilt_mask_applies(SimpleNamespace(**{**base, **config})) is applies


def test_the_static_mask_is_causal_over_real_columns_and_masks_the_unwritten_ones():
    """Over a static cache of 5 columns, a 2-query call on a left-padded row of 3 columns: each query sees the real
    columns up to its own, none of the 2 columns not written yet; a mask wider than the cache is refused."""
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    got = static_causal_padding_mask(mask, 2, 5)
    expected = torch.tensor(
        [
            [[0, 1, 0, 0, 0], [0, 1, 1, 0, 0]],
            [[1, 1, 0, 0, 0], [1, 1, 1, 0, 0]],
        ],
        dtype=torch.bool,
    )[:, None]
    assert got.dtype == torch.bool and torch.equal(got, expected)
    assert torch.equal(static_causal_padding_mask(mask, 1, 3), mask.bool()[:, None, None, :])
    with pytest.raises(ValueError, match="a mask of 3 columns for a static cache of 2"):
        static_causal_padding_mask(mask, 1, 2)


def test_alibi_is_an_obstacle_to_a_static_cache_in_any_family():
    """Falcon with ``alibi`` builds its position bias from the 2-d mask as Bloom does: no static cache for it; the
    same family without ALiBi (rotary positions) decodes over one."""
    from dgrpo.model.static_cache import static_cache_obstacle

    why = static_cache_obstacle(SimpleNamespace(model_type="falcon", alibi=True))
    assert why is not None and why.startswith("falcon builds its ALiBi position bias")
    assert static_cache_obstacle(SimpleNamespace(model_type="falcon", alibi=False)) is None


def kv(columns: int, fill: float) -> torch.Tensor:
    """[1 row, 1 head, columns, 2] filled with ``fill`` (a key or value block of a one-head cache)."""
    return torch.full((1, 1, columns, 2), fill)


def test_the_cache_tensors_go_out_and_back_in_layer_order():
    """``interleaved_kv`` lists [k_0, v_0, k_1, v_1] (none before the first call); ``load_cache`` puts each back in
    its layer and slot, empty layers filled through ``update``; a count that is not two per layer is refused."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    from dgrpo.model.recompute import interleaved_kv, load_cache

    cache = DynamicCache()
    cache.layers = [DynamicLayer(), DynamicLayer()]
    assert interleaved_kv(cache) == []
    tensors = [kv(3, 1.0), kv(3, 2.0), kv(3, 3.0), kv(3, 4.0)]
    load_cache(cache, tensors)
    assert [float(t[0, 0, 0, 0]) for t in interleaved_kv(cache)] == [1.0, 2.0, 3.0, 4.0]
    again = [kv(4, 5.0), kv(4, 6.0), kv(4, 7.0), kv(4, 8.0)]
    load_cache(cache, again)  # (initialized layers: stored as they are)
    assert all(a is b for a, b in zip(interleaved_kv(cache), again, strict=True))
    with pytest.raises(ValueError, match="3 cache tensors for 2 layers"):
        load_cache(cache, again[:3])


def test_a_one_layer_cache_appends_after_its_past_and_answers_only_its_layer():
    """The stand-in cache of a recomputed layer: the new positions go after the past ones (their order is the
    columns' order, which the causal padding mask reads), and another layer's update is an error."""
    from dgrpo.model.recompute import OneLayerCache

    cache = OneLayerCache(1, kv(2, 1.0), kv(2, -1.0))
    keys, values = cache.update(kv(1, 2.0), kv(1, -2.0), 1)
    assert keys[0, 0, :, 0].tolist() == [1.0, 1.0, 2.0] and values[0, 0, :, 0].tolist() == [-1.0, -1.0, -2.0]
    assert cache.keys is keys and cache.values is values
    empty = OneLayerCache(0)
    assert empty.update(kv(1, 3.0), kv(1, 4.0), 0)[0].shape[-2] == 1
    with pytest.raises(RuntimeError, match="layer 1's cache was asked for layer 0"):
        cache.update(kv(1, 2.0), kv(1, -2.0), 0)


def test_the_layers_kept_out_of_recomputation_are_the_last_ones_and_at_most_all():
    """``grpo.recompute_kept_layers``: the last ``count`` layers (backward reaches them first), 0 to all of them."""
    from dgrpo.model.recompute import last_layers

    assert last_layers(4, 0) == frozenset() and last_layers(4, 2) == {2, 3} and last_layers(4, 4) == {0, 1, 2, 3}
    for count in (5, -1):
        with pytest.raises(ValueError, match=f"{count} layers kept out of recomputation, but the model has 4"):
            last_layers(4, count)


def test_only_full_attention_dynamic_layers_are_recomputable():
    """A sliding-window layer (a DynamicLayer subclass that drops columns) is neither handed to the layer regions
    (``dynamic_layer``: None) nor recomputable per call (``unrecomputable_cache_layers`` names it)."""
    from transformers import DynamicCache, Qwen2Config
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    from dgrpo.model.recompute import dynamic_layer, unrecomputable_cache_layers

    cache = DynamicCache()
    cache.layers = [DynamicLayer(), DynamicSlidingWindowLayer(sliding_window=4)]
    assert dynamic_layer(cache, 0) is cache.layers[0] and dynamic_layer(cache, 1) is None
    assert dynamic_layer(SimpleNamespace(layers=[DynamicLayer()]), 0) is None  # (not a DynamicCache)
    full = Qwen2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    windowed = windowed_qwen2_config()
    assert unrecomputable_cache_layers(full) == []
    assert unrecomputable_cache_layers(windowed) == ["DynamicSlidingWindowLayer"]


def test_a_tensor_saved_beside_the_cache_holds_no_cycle_through_its_own_node():
    """Inside :func:`saved_as_prefixes`, an op that saves its own output (``exp``) gets it back detached, as PyTorch
    saves it without hooks: a graph dropped without a backward is then freed by reference counting alone."""
    import gc
    import weakref

    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    from dgrpo.model.kv_prefixes import saved_as_prefixes

    cache = DynamicCache()
    cache.layers = [DynamicLayer()]
    cache.update(kv(3, 1.0), kv(3, 1.0), 0)
    w = torch.ones(2, 3, requires_grad=True)
    gc.collect()
    gc.disable()  # (only a cycle would keep it alive; Python's collector cannot see into autograd's either way)
    try:
        with saved_as_prefixes(cache):
            out = (w * 2.0).exp()
        alive = weakref.ref(out)
        del out
        assert alive() is None
    finally:
        gc.enable()


def test_every_layer_of_a_deep_cache_saves_its_keys_and_values_once():
    """Over 4 layers (the search for the saving layer starts at the last one found), 3 appended steps leave an
    observer only each layer's last keys and values: 8 tensors of 3 + 3 columns, none of the steps' own."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    from dgrpo.model.kv_prefixes import OBSERVER, saved_as_prefixes

    seen = []

    def pack(t):
        if t.dim() == 4:
            seen.append(t.shape[-2])
        return t

    setattr(pack, OBSERVER, True)
    cache = DynamicCache()
    cache.layers = [DynamicLayer() for _ in range(4)]
    for i in range(4):
        cache.update(kv(3, 1.0), kv(3, 1.0), i)
    w = torch.ones(1, 1, 1, 2, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), saved_as_prefixes(cache):
        total = torch.zeros(())
        for _ in range(3):
            for i in range(4):
                k, v = cache.update(w * 2.0, w * 3.0, i)
                total = total + (k * k).sum() + (v * v).sum()
    total.backward()
    assert seen == [6] * 8
    assert w.grad is not None and float(w.grad.sum()) == 2 * 4 * (3 + 2 + 1) * (2 * 2 * 2 + 2 * 3 * 3)


def test_a_decoder_refuses_a_batch_that_does_not_fit_it(tokenizer, task_records):
    """A batch of other rows, or a prompt wider than the decoder's columns, is refused in one line (a kept decoder's
    buffers would otherwise mix rows or overflow)."""
    from dgrpo.model.fixed_shape import FixedShapeDecoder

    lm = make_lm(tokenizer, "qwen2").eval()
    ids, mask = ragged_batch(lm, task_records, 2)
    P = ids.shape[1]
    with torch.no_grad():
        with pytest.raises(ValueError, match=rf"a batch of 2 x {P} prompt tokens does not fit a decoder of \(3, 40\)"):
            FixedShapeDecoder(lm, 3, 40, capture=False).start(ids, mask, None)
        with pytest.raises(
            ValueError, match=rf"a batch of 2 x {P} prompt tokens does not fit a decoder of \(2, {P - 1}\)"
        ):
            FixedShapeDecoder(lm, 2, P - 1, capture=False).start(ids, mask, None)


def test_the_fast_engine_refuses_latent_steps_in_a_mode_without_thoughts(tokenizer, task_records):
    """As the growing cache does: ``n_latent`` thoughts in a mode that has none (cot, plain) is an error, not a run of
    thoughts in some other mode; no thought in such a mode is fine."""
    from dgrpo.model.fixed_shape import fixed_shape_generate, fixed_shape_target_logprobs

    lm = make_lm(tokenizer, "qwen2").eval()
    ids, mask = ragged_batch(lm, task_records, 2)
    with torch.no_grad():
        with pytest.raises(ValueError, match="mode 'cot' has no latent thoughts; got n_latent=2"):
            fixed_shape_generate(lm, ids, mask, 2, max_new_tokens=2, mode="cot")
        with pytest.raises(ValueError, match="mode 'plain' has no latent thoughts; got n_latent=1"):
            fixed_shape_target_logprobs(lm, ids, mask, 1, ids[:, :2], mask[:, :2], mode="plain")
        assert fixed_shape_generate(lm, ids, mask, 0, max_new_tokens=2, mode="cot").tokens.shape == (2, 2)


def test_a_padded_reference_decoder_has_at_least_min_rows(tokenizer, task_records):
    """``min_rows``: under ``pad`` (off by default without capture) the first batch's decoder is made for at least that
    many rows (so that every later batch the group filter leaves fits it), at the log-probs the batch gets alone."""
    from dgrpo.model.fixed_shape import fixed_shape_target_logprobs

    lm = make_lm(tokenizer, "qwen2").eval()
    ids, mask = ragged_batch(lm, task_records, 2)
    tg, tm = ids[:, -4:], torch.ones_like(ids[:, -4:])
    with torch.no_grad():
        alone = fixed_shape_target_logprobs(lm, ids, mask, 2, tg, tm, keep=True, min_rows=5)
        assert lm.kept_decoders["score"][1].mask.shape[0] == 2  # (``pad`` defaults to ``keep and capture``)
        padded = fixed_shape_target_logprobs(lm, ids, mask, 2, tg, tm, keep=True, pad=True, min_rows=5)
    assert lm.kept_decoders["score"][1].mask.shape[0] == 5
    assert padded.shape == (2, 4) and torch.allclose(alone, padded, atol=1e-5, rtol=0)


def test_a_kept_decoder_attends_a_new_batch_thoughts_whatever_rows_ended_the_last(tokenizer, task_records):
    """A batch whose rows ended early (their last tokens fed unattended: ``sync_every=0`` decodes every position)
    leaves a kept decoder whose next batch still attends every row's prompt, thoughts and answer: the next batch's
    rollouts equal a new decoder's."""
    from dgrpo.model.fixed_shape import fixed_shape_generate

    lm = make_lm(tokenizer, "qwen2").eval()
    ids, mask = ragged_batch(lm, task_records, 4)
    eos_bias = torch.zeros(len(lm.tokenizer))
    eos_bias[lm.eos_id] = 8.0
    hook = lm.model.get_output_embeddings().register_forward_hook(lambda m, i, o: o + eos_bias)
    with torch.no_grad():
        first = fixed_shape_generate(lm, ids, mask, 2, max_new_tokens=6, keep=True, sync_every=0)
        hook.remove()
        assert (first.mask.sum(1) < 6).all()  # every row ended before the last position
        kept = fixed_shape_generate(lm, ids, mask, 2, max_new_tokens=6, keep=True, with_entropy=True)
        new = fixed_shape_generate(lm, ids, mask, 2, max_new_tokens=6, with_entropy=True)
    assert torch.equal(kept.tokens, new.tokens) and torch.equal(kept.mask, new.mask)
    assert torch.allclose(kept.logprobs, new.logprobs, atol=1e-5, rtol=0)
    assert torch.allclose(kept.entropy, new.entropy, atol=1e-5, rtol=0)


def test_a_rollout_feeds_every_answer_token_but_the_last(tokenizer, task_records):
    """A rollout of N answer tokens runs the prompt, the T thoughts, the marker and N - 1 answer steps: the last
    token chosen is booked, not fed (a forward whose result nobody reads)."""
    from dgrpo.model.fixed_shape import fixed_shape_generate

    lm = make_lm(tokenizer, "qwen2").eval()
    ids, mask = ragged_batch(lm, task_records, 2)
    calls, call_base = [], lm._call_base

    def recorded(cache, phase, *args):
        calls.append(phase)
        return call_base(cache, phase, *args)

    lm._call_base = recorded
    with torch.no_grad():
        out = fixed_shape_generate(lm, ids, mask, 2, max_new_tokens=5, sync_every=0)
    assert out.tokens.shape[1] <= 5
    assert calls == ["prompt", "latent", "latent", "answer"] + ["answer"] * 4


def test_a_model_with_linear_attention_layers_runs_its_batch_unpadded():
    """Padding to a kept decoder's rows needs a cache whose layers :func:`first_rows` can narrow: a model with
    linear-attention layers (Qwen3-Next) runs each batch as it is, whatever ``min_rows`` asks; a full-attention one
    is padded with copies of its first row."""
    from transformers import Qwen2Config, Qwen3NextConfig

    from dgrpo.model.fixed_shape import _padded_batch

    ids, mask = torch.tensor([[0, 5, 6], [7, 8, 9]]), torch.tensor([[0, 1, 1], [1, 1, 1]])
    for config, rows in ((Qwen3NextConfig(), 2), (Qwen2Config(), 4)):
        lm = SimpleNamespace(model=SimpleNamespace(config=config), kept_decoders={})
        got_ids, got_mask, n_after, _ = _padded_batch(lm, "score", None, ids, mask, 2, 5, True, min_rows=4)
        assert got_ids.shape == got_mask.shape == (rows, 3) and n_after == 5
        assert torch.equal(got_ids[2:], ids[:1].expand(rows - 2, 3)) and torch.equal(got_mask[:2], mask)


def test_a_phase_hook_that_does_not_say_where_it_acts_counts_as_acting_everywhere():
    """A step's graph records what its hooks did: a phase hook without ``acts_in`` is taken to act in every phase
    (so a kept decoder never serves it with graphs captured without its noise); no perturbation acts nowhere."""
    from dgrpo.model.fixed_shape import PHASES, noisy_phases

    assert noisy_phases(SimpleNamespace()) == PHASES == ("prompt", "latent", "answer")
    assert noisy_phases(SimpleNamespace(acts_in=lambda phase: phase == "latent")) == ("latent",)
    assert noisy_phases(None) == ()


def test_a_kept_decoder_that_does_not_fit_is_let_go_before_its_successor_is_made():
    """``kept_for``: the decoder kept for another key is dropped before the new one is made, so that its cache's
    memory can serve the new one (the peak holds one decoder, not two); one that fits is handed back as it is."""
    import weakref

    from dgrpo.model.fixed_shape import kept_for
    from dgrpo.model.latent_lm import KeptDecoders

    class Decoder:
        pass

    lm = SimpleNamespace(kept_decoders=KeptDecoders())
    first = kept_for(lm, "score", ("a",), Decoder)
    assert kept_for(lm, "score", ("a",), Decoder) is first
    gone = weakref.ref(first)
    del first

    def make():
        assert gone() is None and "score" not in lm.kept_decoders
        return Decoder()

    second = kept_for(lm, "score", ("b",), make)
    assert lm.kept_decoders["score"] == (("b",), second)


@pytest.mark.parametrize("mode", ["coconut", "pause"])
def test_the_fast_engine_feeds_each_special_token_where_the_eager_one_does(tokenizer, task_records, mode):
    """The tiny models start the special tokens from one embedding (as Coconut does), so a marker fed as the wrong
    one could not show: with distinct embeddings for the markers (``distinct_markers``), the fast engine's
    rollouts and its reference scores still equal the eager ones (fp32, 1e-5)."""
    from dgrpo.model.fixed_shape import fixed_shape_generate, fixed_shape_target_logprobs

    lm = make_lm(tokenizer, "qwen2").eval()
    distinct_markers(lm)
    ids, mask = ragged_batch(lm, task_records, 3)
    tg, tm = ids[:, -5:], torch.ones_like(ids[:, -5:])
    tm[0, 3:] = 0
    with torch.no_grad():
        eager = lm.generate(ids, mask, 2, max_new_tokens=6, mode=mode)
        fast = fixed_shape_generate(lm, ids, mask, 2, max_new_tokens=6, mode=mode)
        grown, _ = lm.target_logprobs(ids, mask, 2, tg, tm, mode=mode, end_with_targets=True)
        scored = fixed_shape_target_logprobs(lm, ids, mask, 2, tg, tm, mode=mode)
    assert torch.equal(eager.tokens, fast.tokens) and torch.allclose(eager.logprobs, fast.logprobs, atol=1e-5, rtol=0)
    assert torch.allclose(grown, scored, atol=1e-5, rtol=0)


def test_the_fast_engine_samples_with_top_p_and_stops_at_stop_ids_as_the_eager_one(tokenizer, task_records):
    """Nucleus sampling (``top_p`` < 1) and ``stop_ids`` reach the fast engine's token choice: the same answers and
    log-probs as ``generate`` from the same generator, and a stop token ends its row there."""
    from dgrpo.model.fixed_shape import fixed_shape_generate

    lm = make_lm(tokenizer, "qwen2").eval()
    ids, mask = ragged_batch(lm, task_records, 4)
    kw = {"max_new_tokens": 8, "temperature": 1.5, "top_p": 0.3}
    with torch.no_grad():
        free = lm.generate(ids, mask, 2, generator=torch.Generator().manual_seed(3), **kw)
        stop = int(free.tokens[0, 1])
        kw["stop_ids"] = [stop]
        eager = lm.generate(ids, mask, 2, generator=torch.Generator().manual_seed(3), **kw)
        fast = fixed_shape_generate(lm, ids, mask, 2, generator=torch.Generator().manual_seed(3), **kw)
    assert int(eager.mask[0].sum()) == 2 and int(free.mask[0].sum()) > 2  # the stop token ends row 0 there
    assert torch.equal(eager.tokens, fast.tokens) and torch.equal(eager.mask, fast.mask)
    assert torch.allclose(eager.logprobs, fast.logprobs, atol=1e-5, rtol=0)


def test_a_perturbation_that_cannot_pad_its_rows_scores_its_batch_as_it_is(tokenizer, task_records):
    """``pad`` with a perturbation that does not say how to act on padded rows (``row_padding`` None): the batch
    runs over its own rows, at the log-probs it gets without padding."""
    from dgrpo.model.fixed_shape import fixed_shape_target_logprobs
    from dgrpo.perturbation.base import BoundPerturbation

    lm = make_lm(tokenizer, "qwen2").eval()
    ids, mask = ragged_batch(lm, task_records, 2)
    tg, tm = ids[:, -4:], torch.ones_like(ids[:, -4:])
    opaque = BoundPerturbation()
    assert opaque.row_padding(4) is None
    with torch.no_grad(), opaque:
        alone = fixed_shape_target_logprobs(lm, ids, mask, 2, tg, tm, perturbation=opaque)
        padded = fixed_shape_target_logprobs(
            lm, ids, mask, 2, tg, tm, perturbation=opaque, keep=True, pad=True, min_rows=4
        )
    assert torch.equal(alone, padded)
