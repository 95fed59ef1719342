"""Packed grouped-query attention's decisions and arithmetic, pinned one by one (gaps found by mutation testing of
dgrpo.model.gqa_attention): which calls it packs, the mask cache's key, the scale it is given, a mask wider than the
keys, and which models :func:`use_packed_gqa` switches."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from dgrpo.model.gqa_attention import PACKED_GQA, packed_gqa_sdpa_forward, packed_mask, packs, use_packed_gqa


class Attn(nn.Module):
    """The attributes of a Hugging Face attention module that SDPA attention reads."""

    def __init__(self, groups: int):
        super().__init__()
        self.num_key_value_groups, self.is_causal = groups, True


def causal(L: int, S: int, rows: int = 1) -> torch.Tensor:
    """A [rows, 1, L, S] boolean mask: the last L of S columns, causal, the first column of row 0 masked out too."""
    m = torch.ones(L, S, dtype=torch.bool).tril(S - L).expand(rows, 1, L, S).clone()
    m[0, 0, :, 0] = False
    return m


@pytest.mark.parametrize(
    "groups, L, mask, dropout, kwargs, want",
    [
        (3, 4, causal(4, 6), 0.0, {}, True),
        (1, 4, causal(4, 6), 0.0, {}, False),  # no grouped heads: nothing to save
        (3, 1, causal(1, 6), 0.0, {}, False),  # one position: SDPA packs it itself
        (3, 4, None, 0.0, {}, False),
        (3, 4, causal(4, 6)[:, 0], 0.0, {}, False),  # a 3-d mask
        (3, 4, causal(4, 6).expand(1, 3, 4, 6), 0.0, {}, False),  # a mask per head
        (3, 4, causal(4, 6), 0.1, {}, False),  # attention dropout draws in the heads' layout
        (3, 4, causal(4, 6), 0.0, {"sliding_window": 4}, False),
        (3, 4, causal(4, 6), 0.0, {"softcap": 30.0}, False),
        # a position bias is a tensor: its truth value was read (an error, or a zero bias dropped)
        (3, 4, causal(4, 6), 0.0, {"position_bias": torch.zeros(1, 6, 4, 6)}, False),
        (3, 4, causal(4, 6), 0.0, {"position_bias": torch.zeros(1)}, False),
        (3, 4, causal(4, 6), 0.0, {"output_attentions": True}, False),
        (3, 4, causal(4, 6), 0.0, {"sliding_window": None, "position_ids": torch.arange(4), "use_cache": True}, True),
    ],
)
def test_only_grouped_calls_of_several_positions_with_one_mask_row_per_head_group_are_packed(
    groups, L, mask, dropout, kwargs, want
):
    """``packs``: grouped heads, several positions, a [B, 1, L, S] mask, no dropout, no sliding window, soft cap,
    position bias or attention output asked for; keyword arguments SDPA does not read (or None) change nothing."""
    query = torch.zeros(1, 6, L, 8)
    assert packs(Attn(groups), query, mask, dropout, kwargs) is want


@pytest.mark.parametrize("scaling", [None, 0.3])
def test_packed_attention_is_sdpas_with_its_scale_head_groups_and_a_wider_mask(scaling):
    """The packed call against Hugging Face's SDPA attention on the same inputs: 6 query heads over 2 key/value heads
    (heads 0-2 share key/value head 0), a scale other than 1/sqrt(d), two rows with different masks, and a mask with
    more columns than the keys (its first S are the keys')."""
    torch.manual_seed(0)
    B, H, G, L, S, D = 2, 6, 2, 3, 5, 4
    q, k, v = torch.randn(B, H, L, D), torch.randn(B, G, S, D), torch.randn(B, G, S, D)
    mask = torch.cat([causal(L, S, B), torch.ones(B, 1, L, 2, dtype=torch.bool)], dim=3)
    assert packs(Attn(3), q, mask, 0.0, {})
    got, weights = packed_gqa_sdpa_forward(Attn(3), q, k, v, mask, scaling=scaling)
    want = sdpa_attention_forward(Attn(3), q, k, v, mask[:, :, :, :S], scaling=scaling)[0]
    assert weights is None and got.shape == (B, L, H, D) and got.is_contiguous()
    assert torch.allclose(got, want, atol=1e-6), (got - want).abs().max()
    # by hand for one row, position and head: head 4 reads key/value head 1
    scale = scaling if scaling is not None else D**-0.5
    scores = (q[1, 4, 2] @ k[1, 1].T) * scale
    scores = scores.masked_fill(~mask[1, 0, 2, :S], float("-inf"))
    assert torch.allclose(got[1, 2, 4], scores.softmax(-1) @ v[1, 1], atol=1e-6)


def test_the_packed_mask_is_reused_only_for_the_same_mask_object_and_group_size():
    """Another mask of the same shape and version (a new forward call's) is packed anew, as is the same mask for
    another group size; each packed row l * n_rep + r is the mask's row l."""
    a = causal(2, 2)
    b = torch.ones(1, 1, 2, 2, dtype=torch.bool)
    b[0, 0, 0, 0] = True  # (written once, as ``a`` was: the same version)
    first = packed_mask(a, 2)
    assert a._version == b._version
    other = packed_mask(b, 2)
    assert other is not first and bool(other.all())
    assert torch.equal(packed_mask(a, 2), a.repeat_interleave(2, dim=2))
    thrice = packed_mask(a, 3)
    assert thrice.shape == (1, 1, 6, 2) and torch.equal(thrice[0, 0, :, 1], torch.tensor([False] * 3 + [True] * 3))


def model(attn="sdpa", heads=4, kv_heads=2, routed=True):
    """A stand-in for a Hugging Face model: its config and whether its attention calls the registered functions."""
    m = nn.Module()
    m.config = SimpleNamespace(_attn_implementation=attn, num_attention_heads=heads, num_key_value_heads=kv_heads)
    m._supports_attention_backend = routed
    return m


def test_use_packed_gqa_switches_only_grouped_heads_on_routed_sdpa_and_only_back_from_itself():
    """On: a routed model on SDPA with fewer key/value heads than query heads. Not: equal heads, no key/value head
    count, eager attention, a model that tests ``== "sdpa"`` itself. Off: only a packed model goes back to SDPA
    (an eager one stays eager)."""
    m = model()
    assert use_packed_gqa(m, True) and m.config._attn_implementation == PACKED_GQA
    assert not use_packed_gqa(m, False) and m.config._attn_implementation == "sdpa"
    for kept in (model(kv_heads=4), model(kv_heads=None), model(attn="eager"), model(routed=False)):
        before = kept.config._attn_implementation
        assert not use_packed_gqa(kept, True) and kept.config._attn_implementation == before
    eager = model(attn="eager")
    assert not use_packed_gqa(eager, False) and eager.config._attn_implementation == "eager"
