"""Packed grouped-query attention under inference mode (a second mutation-testing pass of
dgrpo.model.gqa_attention): an inference tensor's mask has no version counter, so it is packed afresh at each call,
with the same row layout as any other (row l * n_rep + r: position l), and the packed call is SDPA's."""

from __future__ import annotations

import torch
from test_gqa_attention_mutants import Attn, causal
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from dgrpo.model.gqa_attention import packed_gqa_sdpa_forward, packed_mask


def test_an_inference_masks_packed_rows_are_its_rows_each_repeated_in_place():
    """A [1, 1, 3, 4] inference mask, 2 heads per group, its first 3 columns: packed row 2l and 2l+1 are row l
    (not the rows tiled: row 1 of the packed mask is position 0's, not position 1's)."""
    with torch.inference_mode():
        m = causal(3, 4)
        m[0, 0, 1, 3] = True  # (position 1 sees its own future column: rows 0 and 1 differ at column 3 too)
        got = packed_mask(m, 2, 3)
    want = torch.stack([m[0, 0, 0, :3], m[0, 0, 0, :3], m[0, 0, 1, :3], m[0, 0, 1, :3], m[0, 0, 2, :3], m[0, 0, 2, :3]])
    assert got.shape == (1, 1, 6, 3) and torch.equal(got[0, 0], want)


def test_the_packed_call_under_inference_mode_is_sdpas():
    """6 query heads over 2 key/value heads, 4 positions against 6 columns, inside ``torch.inference_mode``: the
    packed output is Hugging Face's SDPA attention's (1e-6)."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (
        torch.randn(2, 6, 4, 8, generator=g),
        torch.randn(2, 2, 6, 8, generator=g),
        torch.randn(2, 2, 6, 8, generator=g),
    )
    with torch.inference_mode():
        mask = causal(4, 6, rows=2)
        got, _ = packed_gqa_sdpa_forward(Attn(3), q, k, v, mask)
        want, _ = sdpa_attention_forward(Attn(3), q, k, v, mask)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
