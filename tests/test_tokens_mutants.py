"""The tokenizer side of a latent model (:mod:`dgrpo.model.tokens`): padded batches, the end-of-turn ids, the
latent markers' rows (gaps found by mutation testing)."""

from __future__ import annotations

import pytest
import torch

from dgrpo.model.tiny import build_tiny_model
from dgrpo.model.tokens import end_of_turn_ids, left_pad, right_pad


def test_left_pad_puts_the_pad_before_each_row_and_masks_it():
    """Rows of different lengths: pads on the left up to the longest row, mask 0 over the pads and 1 over the ids."""
    ids, mask = left_pad([[5, 6, 7], [8], []], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8], [0, 0, 0]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1], [0, 0, 0]]
    assert ids.dtype == mask.dtype == torch.long


def test_right_pad_puts_the_pad_after_each_row_and_is_at_least_one_wide():
    """Rows padded on the right (mask 1 over the ids, then 0); rows all empty still give one column of pad, mask 0
    (an answer batch of nothing generated stays a [B, 1] tensor)."""
    ids, mask = right_pad([[5, 6, 7], [8], []], pad_id=2)
    assert ids.tolist() == [[5, 6, 7], [8, 2, 2], [2, 2, 2]]
    assert mask.tolist() == [[1, 1, 1], [1, 0, 0], [0, 0, 0]]
    ids, mask = right_pad([[], []], pad_id=2)
    assert ids.tolist() == [[2], [2]] and mask.tolist() == [[0], [0]]


@pytest.mark.parametrize("container", [list, tuple])
def test_end_of_turn_ids_take_a_list_or_tuple_and_keep_ids_inside_the_vocabulary(container):
    """generation_config.eos_token_id as a list or a tuple: every id but the tokenizer's EOS that has an embedding
    row (0 <= id < rows; the row count itself is past the last row), sorted and once each."""
    model = build_tiny_model("llama", 50, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
    model.generation_config.eos_token_id = container([7, 3, 49, 50, -1, 3, 12])
    assert end_of_turn_ids(model, 12) == [3, 7, 49]
    assert end_of_turn_ids(model, None) == [3, 7, 12, 49]
