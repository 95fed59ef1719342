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


class _Encoder:
    """A tokenizer's encoding of "1": ``with_bos`` the ids with special tokens, ``plain`` those without."""

    def __init__(self, bos: int | None, with_bos: list[int], plain: list[int]) -> None:
        self.bos_token_id, self.ids = bos, {True: with_bos, False: plain}

    def __call__(self, text: str, add_special_tokens: bool) -> dict[str, list[int]]:
        return {"input_ids": self.ids[add_special_tokens]}


@pytest.mark.parametrize(
    ("encoder", "expected"),
    [
        (_Encoder(1, [1, 20], [20]), [1]),  # (Llama: BOS added by the special tokens)
        (_Encoder(1, [20], [20]), []),  # (Qwen: a BOS id that its encoding never adds)
        (_Encoder(1, [1, 20], [1, 20]), []),  # (BOS in the plain encoding too: the text brings it, not added again)
        (_Encoder(None, [20], [20]), []),  # (no BOS)
    ],
)
def test_bos_prefix_is_the_bos_the_special_tokens_add_and_only_that(encoder, expected):
    """[bos] only when the encoding with special tokens starts with BOS and the plain one does not: a tokenizer whose
    plain encoding already starts with it would get two."""
    from dgrpo.model.tokens import bos_prefix

    assert bos_prefix(encoder) == expected


def test_load_tokenizer_passes_the_hub_options_on(monkeypatch):
    """A hub id's tokenizer is read with the options the model's resolution chose: ``local_files_only`` (without
    it, a cached model on a machine without network waited for the hub's retries), the revision and
    trust_remote_code; no revision keyword for the default branch."""
    from dgrpo.model import tokens

    calls: list[tuple[str, dict]] = []
    monkeypatch.setattr(tokens.AutoTokenizer, "from_pretrained", lambda path, **kw: calls.append((path, kw)))
    tokens.load_tokenizer("someorg/tiny", trust_remote_code=True, local_files_only=True, revision="v1")
    tokens.load_tokenizer("someorg/tiny")
    assert calls == [
        ("someorg/tiny", {"trust_remote_code": True, "local_files_only": True, "revision": "v1"}),
        ("someorg/tiny", {"trust_remote_code": False, "local_files_only": False}),
    ]


def test_a_plain_tokenizer_saved_as_pretrainedtokenizerfast_is_loaded_as_is(tokenizer, tmp_path):
    """A folder whose tokenizer_config.json names PreTrainedTokenizerFast (a plain ``tokenizers`` file, as
    transformers 4 saved the built-in one) beside a Qwen2 config loads as that class, not as the model type's
    tokenizer class (Qwen2Tokenizer: its own pre-tokenizer and decoder)."""
    import json

    from transformers import PreTrainedTokenizerFast

    from dgrpo.model.tokens import load_tokenizer

    tokenizer.save_pretrained(tmp_path)
    build_tiny_model("qwen2", len(tokenizer), hidden_size=16, num_layers=1, num_heads=2).config.save_pretrained(
        tmp_path
    )
    settings = json.loads((tmp_path / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({**settings, "tokenizer_class": "PreTrainedTokenizerFast"})
    )
    loaded = load_tokenizer(str(tmp_path))
    assert type(loaded) is PreTrainedTokenizerFast
    assert loaded("12 + 34 = 46")["input_ids"] == tokenizer("12 + 34 = 46")["input_ids"]


@pytest.mark.parametrize(
    ("files", "has"),
    [
        (["tokenizer.json"], True),
        (["vocab.json", "merges.txt"], True),
        (["vocab.txt"], True),
        (["tokenizer.model"], True),  # (sentencepiece: Llama 2, Mistral, Gemma)
        (["cl100k.tiktoken"], True),
        (["config.json", "tokenizer_config.json", "special_tokens_map.json"], False),
    ],
)
def test_a_folder_has_a_tokenizer_when_it_holds_a_vocabulary_in_any_format(tmp_path, files, has):
    """Any of transformers' vocabulary formats makes a tokenizer folder; its settings files alone do not, and
    loading such a folder is one CheckpointError line (transformers built an empty tokenizer from the model type)."""
    from dgrpo.model.tokens import has_tokenizer_files, load_tokenizer
    from dgrpo.model.verified import CheckpointError

    for name in files:
        (tmp_path / name).write_text("{}")
    assert has_tokenizer_files(tmp_path) is has
    if not has:
        with pytest.raises(CheckpointError, match=f"no tokenizer in {tmp_path} \\(none of tokenizer.json, vocab"):
            load_tokenizer(str(tmp_path))


def test_a_tokenizer_without_eos_is_one_line():
    """No EOS token: a ValueError saying so (and that a pad token does not stand in for it); with one, nothing."""
    from types import SimpleNamespace

    from dgrpo.model.tokens import check_special_tokens

    with pytest.raises(ValueError, match=r"^the tokenizer has no EOS token \(it has a pad token, but answers end"):
        check_special_tokens(SimpleNamespace(eos_token_id=None, pad_token_id=0))
    with pytest.raises(ValueError, match=r"^the tokenizer has no EOS token: set one"):
        check_special_tokens(SimpleNamespace(eos_token_id=None, pad_token_id=None))
    check_special_tokens(SimpleNamespace(eos_token_id=3, pad_token_id=None))


def test_markers_saved_beyond_the_models_rows_are_added_without_the_other_tokenizer_warning(tokenizer):
    """A tokenizer saved with the latent markers, its model without their rows: the markers get rows and are
    reported new, without the warning meant for another model's tokenizer (only the markers lie past the rows)."""
    import copy
    import warnings

    from dgrpo.model.tokens import LATENT_MARKERS, add_latent_tokens

    tok = copy.deepcopy(tokenizer)
    n_tok = len(tok)
    tok.add_tokens(list(LATENT_MARKERS), special_tokens=True)
    model = build_tiny_model("llama", n_tok, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert add_latent_tokens(model, tok) == list(LATENT_MARKERS)
    assert model.get_input_embeddings().weight.shape[0] == n_tok + 3


def test_the_coconut_row_is_a_real_tokens_row(tokenizer):
    """``<<``'s id is the row copied only when it is one of the ``n_real`` tokens the model had (not a token added
    past them, whose row is itself new)."""
    from dgrpo.model.tokens import COCONUT_INIT_TOKEN, coconut_init_row

    src = tokenizer.get_vocab()[COCONUT_INIT_TOKEN]
    assert coconut_init_row(tokenizer, src + 1) == src
    assert coconut_init_row(tokenizer, src) is None
    assert coconut_init_row(tokenizer, src - 1) is None


def test_the_markers_get_rows_when_the_model_has_fewer_spare_rows_than_markers(tokenizer):
    """A padded vocabulary two rows short of the three markers is resized to hold them all; a tokenizer without a
    pad token pads with EOS."""
    import copy

    from dgrpo.model.tokens import LATENT_MARKERS, add_latent_tokens

    tok = copy.deepcopy(tokenizer)
    tok.pad_token = None
    n_tok = len(tok)
    model = build_tiny_model("llama", n_tok + 2, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
    assert add_latent_tokens(model, tok) == list(LATENT_MARKERS)
    assert model.get_input_embeddings().weight.shape[0] == n_tok + 3 == len(tok)
    assert tok.pad_token == tok.eos_token is not None
