"""Gaps that mutation testing of the fast engine's CPU-checkable parts found (dgrpo.model.attention_mask,
static_cache, kv_prefixes, recompute, fixed_shape): small hand-computed cases pinning what each promises."""

from types import SimpleNamespace

import pytest
import torch

from dgrpo.model.attention_mask import prebuilt_mask_applies, static_causal_padding_mask
from dgrpo.model.gqa_attention import PACKED_GQA


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


def test_transformers_own_static_layers_get_their_write_offsets_on_the_cache_device():
    """A cache with sliding-window layers keeps transformers' layers, each write offset made on the cache's device
    (its first update would otherwise copy it from the host): checked with the meta device, which a CPU has."""
    from transformers import Qwen2Config

    from dgrpo.model.static_cache import static_cache

    cfg = Qwen2Config(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        use_sliding_window=True,
        sliding_window=4,
        max_window_layers=1,
    )
    cache = static_cache(cfg, 12, torch.device("meta"))
    offsets = [layer.cumulative_length for layer in cache.layers]
    assert len(offsets) == 2 and all(t.device.type == "meta" and t.shape == () for t in offsets)


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
    windowed = Qwen2Config(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        use_sliding_window=True,
        sliding_window=4,
        max_window_layers=1,
    )
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
