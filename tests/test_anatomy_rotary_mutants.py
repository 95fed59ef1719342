"""Rotary frequencies per layer type, and float32 ones left where they are (a second mutation-testing pass of
dgrpo.model.anatomy): a module with frequencies per layer type (Gemma 3's ``sliding_attention_inv_freq``) gets each
type's recomputed by its own rope function, and a float32 buffer set after the listing is not put back."""

from __future__ import annotations

import torch
from torch import nn

from dgrpo.model.anatomy import float32_frequencies, float32_rotary_init, restore_float32_frequencies

from conftest import make_lm


class PerTypeRotary(nn.Module):
    """A stand-in for a rotary module with frequencies per layer type: its rope function gives 1, 2 (sliding) or 3,
    4 (full attention); a layer type it does not know is an error."""

    def __init__(self, plain: bool = False):
        super().__init__()
        self.config = object()
        self.rope_type = {"sliding_attention": "default", "full_attention": "default"}
        for prefix in ("sliding_attention_", "full_attention_"):
            self.register_buffer(f"{prefix}inv_freq", torch.zeros(2, dtype=torch.bfloat16), persistent=False)
            self.register_buffer(f"{prefix}original_inv_freq", torch.zeros(2, dtype=torch.bfloat16), persistent=False)
        if plain:
            self.register_buffer("inv_freq", torch.zeros(2, dtype=torch.bfloat16), persistent=False)

    @staticmethod
    def compute_default_rope_parameters(config, layer_type=None):
        table = {"sliding_attention": [1.0, 2.0], "full_attention": [3.0, 4.0]}
        return torch.tensor(table[layer_type], dtype=torch.float64), 1.0


def test_frequencies_per_layer_type_are_each_types_own_in_float32():
    """Each ``<type>_inv_freq`` and ``<type>_original_inv_freq`` gets its type's float32 frequencies (the rope
    function asked for that type, not one table for both)."""
    rotary = PerTypeRotary()
    float32_rotary_init(rotary)
    for prefix, want in (("sliding_attention_", [1.0, 2.0]), ("full_attention_", [3.0, 4.0])):
        for name in (f"{prefix}inv_freq", f"{prefix}original_inv_freq"):
            got = getattr(rotary, name)
            assert got.dtype == torch.float32 and got.tolist() == want, name


def test_a_plain_inv_freq_beside_per_type_rope_types_is_not_guessed():
    """A plain ``inv_freq`` on a module whose rope types are per layer type names no type: left as it is (bf16)
    while the per-type buffers are recomputed."""
    rotary = PerTypeRotary(plain=True)
    plain = rotary.inv_freq
    float32_rotary_init(rotary)
    assert rotary.inv_freq is plain and rotary.full_attention_inv_freq.tolist() == [3.0, 4.0]


def test_a_float32_buffer_set_after_the_listing_is_not_put_back(tokenizer):
    """``restore_float32_frequencies`` puts back only what a cast made low-precision: a float32 ``original_inv_freq``
    replaced after the listing (its owner's choice) stays the new tensor."""
    lm = make_lm(tokenizer, "qwen2")
    rotary = lm.model.model.rotary_emb
    kept = float32_frequencies(lm.model)
    doubled = rotary.original_inv_freq * 2
    rotary.original_inv_freq = doubled
    rotary.inv_freq = rotary.inv_freq.to(torch.bfloat16)
    restore_float32_frequencies(lm.model, kept)
    assert rotary.original_inv_freq is doubled and rotary.inv_freq.dtype == torch.float32
