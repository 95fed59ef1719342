"""Where things live inside a model (dgrpo.model.anatomy), pinned on small stand-ins (gaps found by mutation
testing): the token tables of tied and untied heads, the decoder stack and its blocks' parts, the layer selection
against a model's depth, and the rotary frequencies kept or recomputed in float32."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dgrpo.config import ConfigError
from dgrpo.model.anatomy import (
    base_model,
    block_part,
    decoder_layers,
    find_sites,
    float32_frequencies,
    float32_rotary_init,
    hidden_size,
    output_projection,
    restore_float32_frequencies,
    select_layers,
    token_tables,
)

from conftest import make_lm


class LM(nn.Module):
    """A causal LM's token tables: an input embedding and a head (tied: the same weight; with a bias or not)."""

    def __init__(self, tied: bool, bias: bool = False):
        super().__init__()
        self.emb = nn.Embedding(5, 3)
        self.head = nn.Linear(3, 5, bias=bias)
        if tied:
            self.head.weight = self.emb.weight

    def get_input_embeddings(self):
        return self.emb

    def get_output_embeddings(self):
        return self.head


def test_token_tables_list_an_untied_heads_weight_and_bias_and_a_tied_one_not():
    lm = LM(tied=True)
    assert token_tables(lm).keys() == {"input"} and token_tables(lm)["input"] is lm.emb.weight
    lm = LM(tied=False)
    assert token_tables(lm).keys() == {"input", "output"} and token_tables(lm)["output"] is lm.head.weight
    lm = LM(tied=False, bias=True)
    assert token_tables(lm)["output_bias"] is lm.head.bias


def blocks(n: int) -> nn.ModuleList:
    return nn.ModuleList(nn.Linear(2, 2) for _ in range(n))


def test_the_decoder_stack_is_the_named_non_empty_list_or_else_the_longest():
    """``layers`` (``h``, ...) when it holds blocks; an empty ``layers`` is passed over; without a named list, the
    longest ModuleList of the model; a model that is its own base model keeps its stack at ``.model``."""
    m = nn.Module()
    m.layers, m.h = nn.ModuleList(), blocks(3)
    assert decoder_layers(m) is m.h
    m = nn.Module()
    m.short, m.long, m.mid = blocks(2), blocks(5), blocks(3)
    assert decoder_layers(m) is m.long
    outer = nn.Module()
    outer.model = nn.Module()
    outer.model.layers = blocks(2)
    assert base_model(outer) is outer.model and decoder_layers(outer) is outer.model.layers
    with pytest.raises(ValueError, match="cannot find the decoder layers"):
        decoder_layers(nn.Linear(2, 2))


def test_a_blocks_parts_are_modules_found_in_the_tables_order():
    """The first name of the part's list that holds a module: a non-module attribute of that name is passed over;
    the output projection under LoRA is the wrapped layer; a residual site has none."""
    block = nn.Module()
    block.self_attn = "not a module"
    block.attn = nn.Module()
    block.attn.o_proj = nn.Module()
    block.attn.o_proj.base_layer = nn.Linear(2, 2)  # (PEFT's LoRA layer around the backbone's)
    assert block_part(block, "attn") is block.attn and block_part(block, "mlp") is None
    assert output_projection(block.attn, "attn") is block.attn.o_proj.base_layer
    with pytest.raises(ValueError, match="a residual site has no single output projection"):
        output_projection(block, "residual")


@pytest.mark.parametrize(
    "spec, want",
    [("all", [0, 1, 2, 3]), ("1:3", [1, 2]), ("-2:", [2, 3]), (":1", [0]), ("-1", [3]), ("3,-4", [3, 0])],
)
def test_a_layer_selection_names_the_blocks_python_would(spec, want):
    assert select_layers(spec, 4) == want


@pytest.mark.parametrize(
    "spec, why",
    [
        ("4", "layer 4 out of range"),
        ("-5", "layer -5 out of range"),
        ("5:", "selects no layer"),
        ("1,-3", "names a layer twice"),
    ],
)
def test_a_layer_selection_outside_the_model_is_a_config_error(spec, why):
    with pytest.raises(ConfigError, match=f"perturbation.layers: .*{why}"):
        select_layers(spec, 4)


def test_sites_are_found_per_selected_layer_and_an_unknown_site_is_refused(tokenizer):
    lm = make_lm(tokenizer, "gpt2")
    sites = find_sites(lm.model, ["attn", "residual"], "-1")
    assert [(s.name, s.part, s.width) for s in sites] == [("layers.1.attn", "attn", hidden_size(lm.model))] + [
        ("layers.1.residual", "residual", hidden_size(lm.model))
    ]
    assert sites[1].module is decoder_layers(lm.model)[1] and hidden_size(lm.model) == lm.model.config.n_embd
    with pytest.raises(ConfigError, match="unknown site 'ffn'"):
        find_sites(lm.model, ["ffn"], "all")


def test_float32_frequencies_are_listed_kept_and_put_back_only_where_a_cast_changed_them(tokenizer):
    """Only float32 ``inv_freq`` buffers are listed; after a cast to bf16 they are put back (each its own tensor),
    and a buffer still float32 is left as the object it is."""
    lm = make_lm(tokenizer, "qwen2")
    rotary = lm.model.model.rotary_emb
    kept = float32_frequencies(lm.model)
    assert set(kept) >= {"model.rotary_emb.inv_freq", "model.rotary_emb.original_inv_freq"}
    want = {k: v.clone() for k, v in kept.items()}
    rotary.inv_freq = rotary.inv_freq.to(torch.bfloat16)
    assert "model.rotary_emb.inv_freq" not in float32_frequencies(lm.model)
    untouched = rotary.original_inv_freq
    restore_float32_frequencies(lm.model, kept)
    assert rotary.inv_freq.dtype == torch.float32 and torch.equal(rotary.inv_freq, want["model.rotary_emb.inv_freq"])
    assert rotary.original_inv_freq is untouched


def test_rotary_frequencies_recomputed_are_each_their_own_and_of_the_buffers_shape(tokenizer):
    """A bf16 rotary module gets float32 ``inv_freq`` and ``original_inv_freq`` recomputed, two tensors (a shared
    one: a write to one would change the other); a buffer of another shape than the recomputed one is left."""
    lm = make_lm(tokenizer, "qwen2")
    rotary = lm.model.model.rotary_emb
    fresh = rotary.inv_freq.clone()
    rotary.inv_freq, rotary.original_inv_freq = fresh.to(torch.bfloat16), fresh.to(torch.bfloat16)
    float32_rotary_init(lm.model)
    assert rotary.inv_freq.dtype == rotary.original_inv_freq.dtype == torch.float32
    assert torch.equal(rotary.inv_freq, fresh) and rotary.inv_freq.data_ptr() != rotary.original_inv_freq.data_ptr()
    short = fresh[:-1].to(torch.bfloat16)
    rotary.original_inv_freq = short
    rotary.inv_freq = fresh.to(torch.bfloat16)
    float32_rotary_init(lm.model)
    assert torch.equal(rotary.inv_freq, fresh) and rotary.original_inv_freq is short
    rotary.inv_freq = short
    float32_rotary_init(lm.model)
    assert rotary.inv_freq is short


def test_float32_frequencies_already_there_are_left_as_they_are(tokenizer):
    """A rotary module whose frequencies are float32 (set by their owner, here doubled) is not recomputed."""
    from dgrpo.model.anatomy import _frequency_prefixes, _rope_frequencies

    lm = make_lm(tokenizer, "qwen2")
    rotary = lm.model.model.rotary_emb
    doubled = rotary.inv_freq * 2
    rotary.inv_freq = doubled
    float32_rotary_init(lm.model)
    assert rotary.inv_freq is doubled
    # the frequency buffers' prefixes: "" for inv_freq (original_inv_freq is its pair, not a layer type's), and a
    # module with one rope type has no frequencies per layer type
    assert _frequency_prefixes(rotary) == [""]
    assert _rope_frequencies(rotary) is not None and _rope_frequencies(rotary, "sliding_attention") is None
