"""Gaps that a second pass of mutation testing found in the fast engine's pieces (dgrpo.model.fixed_shape,
recompute) and in the strict loading of Hugging Face weights (dgrpo.model.hf_loading): small hand-built cases."""

from types import SimpleNamespace
from unittest import mock

import pytest
import torch
from test_fixed_shape import ragged_batch

from conftest import make_lm, windowed_qwen2_config


def tiny_qwen2():
    """A 2-layer Qwen2 causal LM of 50 tokens, seeded (the layer regions' tests need a decoder, not a tokenizer)."""
    from dgrpo.model.tiny import build_tiny_model

    return build_tiny_model("qwen2", 50, hidden_size=32, num_layers=2, intermediate_size=64).eval()


def test_a_decoder_takes_a_prompt_as_wide_as_its_columns(tokenizer, task_records):
    """A prompt of exactly the decoder's columns fits it (one column more is refused: the earlier probe's test)."""
    from dgrpo.model.fixed_shape import FixedShapeDecoder

    lm = make_lm(tokenizer, "qwen2").eval()
    ids, mask = ragged_batch(lm, task_records, 2)
    dec = FixedShapeDecoder(lm, 2, ids.shape[1], capture=False)
    with torch.no_grad():
        dec.start(ids, mask, None)
    assert dec.written == ids.shape[1] and torch.equal(dec.mask, mask.to(dec.mask.dtype))


def test_a_model_with_sliding_window_layers_is_padded_to_the_kept_rows():
    """Sliding-window layers hold keys and values as full-attention ones do (:func:`first_rows` narrows them): a
    batch of such a model is padded to ``min_rows`` with copies of its first row, as a full-attention one is."""
    from dgrpo.model.fixed_shape import _padded_batch

    ids, mask = torch.tensor([[0, 5, 6], [7, 8, 9]]), torch.tensor([[0, 1, 1], [1, 1, 1]])
    lm = SimpleNamespace(model=SimpleNamespace(config=windowed_qwen2_config()), kept_decoders={})
    got_ids, got_mask, n_after, _ = _padded_batch(lm, "score", None, ids, mask, 2, 5, True, min_rows=4)
    assert got_ids.shape == (4, 3) and torch.equal(got_ids[2:], ids[:1].expand(2, 3)) and n_after == 5
    assert torch.equal(got_mask[:2], mask) and torch.equal(got_mask[2:], mask[:1].expand(2, 3))


def test_a_target_token_left_out_mid_answer_is_scored_as_the_eager_engine_scores_it(tokenizer, task_records):
    """Each target token's column is attended as its own mask entry says (the marker's always): a target mask with a
    hole gives the fast engine's reference scores the growing cache's (fp32, 1e-5), 0 at the hole."""
    from dgrpo.model.fixed_shape import fixed_shape_target_logprobs

    lm = make_lm(tokenizer, "qwen2").eval()
    ids, mask = ragged_batch(lm, task_records, 2)
    tg, tm = ids[:, -5:], torch.ones_like(ids[:, -5:])
    tm[:, 1] = 0
    with torch.no_grad():
        grown, _ = lm.target_logprobs(ids, mask, 2, tg, tm, end_with_targets=True)
        scored = fixed_shape_target_logprobs(lm, ids, mask, 2, tg, tm)
    assert torch.allclose(grown, scored, atol=1e-5, rtol=0) and bool((scored[:, 1] == 0).all())


def test_a_rollouts_decoder_holds_exactly_the_columns_it_writes(tokenizer, task_records, monkeypatch):
    """The fast engine's decoder holds the prompt, the thoughts, the marker and every answer token but the last (the
    last is chosen, never fed back): a full-length rollout writes its last column, as ``generate``'s static cache."""
    from dgrpo.model import fixed_shape

    made, original = [], fixed_shape.decoder_for
    monkeypatch.setattr(fixed_shape, "decoder_for", lambda *a: made.append(original(*a)) or made[-1])
    lm = make_lm(tokenizer, "qwen2").eval()
    ids, mask = ragged_batch(lm, task_records, 2)
    with torch.no_grad():
        g = fixed_shape.fixed_shape_generate(lm, ids, mask, 3, max_new_tokens=6, stop_ids=[], sync_every=0)
        plain = fixed_shape.fixed_shape_generate(lm, ids, mask, 0, max_new_tokens=1, markers=False)
    assert bool(g.mask[:, -1].all()) and plain.tokens.shape == (2, 1)
    assert made[0].n_columns == made[0].written == ids.shape[1] + 3 + 1 + 6 - 1
    assert made[1].n_columns == made[1].written == ids.shape[1]  # (no marker, one token: the prompt alone)


class Entries:
    """A perturbation that counts how often it is entered."""

    def __init__(self):
        self.count = 0

    def __enter__(self):
        self.count += 1
        return self

    def __exit__(self, *exc):
        return None


def one_layer_cache():
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    cache = DynamicCache()
    cache.layers = [DynamicLayer()]
    return cache


def test_a_recomputed_call_enters_its_perturbation_again_only_for_the_backward_run():
    """The forward runs inside the caller's ``with`` block and does not enter the perturbation itself; the
    recomputation in backward (after the block) enters it once: a plug-in whose entry is not idempotent sees one
    entry per run. The call's keys and values reach the cache, and the gradient is full backprop's."""
    from dgrpo.model.recompute import interleaved_kv, recomputed_call

    w, x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True), torch.tensor([4.0, 5.0, 6.0])

    def run(cache, x):
        k = (x * w).reshape(1, 1, 3, 1)
        cache.update(k, 2 * k, 0)
        return (x * w).square().sum()

    pert, cache = Entries(), one_layer_cache()
    with pert:
        out = recomputed_call(run, cache, one_layer_cache, (x,), pert)
    assert pert.count == 1
    keys, values = interleaved_kv(cache)
    assert keys.flatten().tolist() == [4.0, 10.0, 18.0] and values.flatten().tolist() == [8.0, 20.0, 36.0]
    out.backward()
    assert pert.count == 2 and w.grad.tolist() == [2 * 16.0, 2 * 2 * 25.0, 2 * 3 * 36.0]


def test_layer_regions_skip_the_kept_layers_and_a_call_without_a_cache():
    """``checkpointed_layers``: one region per layer not in ``kept`` for each cached call, at the logits of the model
    as it is; a call without a cache (no keys to carry) runs its layers as they are, no region."""
    from transformers import DynamicCache

    from dgrpo.model.recompute import checkpointed_layers

    model, ids = tiny_qwen2(), torch.tensor([[3, 7, 9, 1]])
    plain = model(ids, use_cache=False).logits
    wrap = mock.patch.object(torch.utils.checkpoint, "checkpoint", wraps=torch.utils.checkpoint.checkpoint)
    for kept, regions in (((), 2), ({1}, 1), ({0, 1}, 0)):
        with wrap as made, checkpointed_layers(model, kept=kept):
            got = model(ids, cache=DynamicCache(config=model.config), use_cache=True).logits
        assert made.call_count == regions and torch.allclose(got, plain, atol=1e-6, rtol=0)
    with wrap as made, checkpointed_layers(model):
        got = model(ids, use_cache=False).logits
    assert made.call_count == 0 and torch.allclose(got, plain, atol=1e-6, rtol=0)


def test_a_sliding_window_layers_cache_is_not_handed_to_a_recomputed_call():
    """``interleaved_kv`` refuses a sliding-window layer (its keys are only the last window: the recomputed call
    could not rebuild its cache), naming the layer's type."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    from dgrpo.model.recompute import interleaved_kv

    cache = DynamicCache()
    cache.layers = [DynamicLayer(), DynamicSlidingWindowLayer(sliding_window=4)]
    for i in range(2):
        cache.update(torch.ones(1, 1, 3, 2), torch.ones(1, 1, 3, 2), i)
    with pytest.raises(NotImplementedError, match="cache layers of type DynamicSlidingWindowLayer cannot be restored"):
        interleaved_kv(cache)


def test_the_remote_code_hint_is_added_only_to_an_error_about_remote_code():
    """The option that allows a repository's own code is named only when transformers' error is about it."""
    from dgrpo.model.hf_loading import remote_code_hint

    assert remote_code_hint(ValueError("no file named config.json")) == ""
    assert remote_code_hint(OSError("the remote host closed the connection")) == ""
    assert remote_code_hint(ValueError("please pass trust_remote_code=True")).startswith(
        " (the repository runs its own code: allow it with --set model.trust_remote_code=true"
    )


def failing_load(monkeypatch, error):
    """``from_pretrained`` raises ``error`` (what transformers raised for a folder or a hub id)."""
    from dgrpo.model import hf_loading

    def from_pretrained(*args, **kwargs):
        raise error

    monkeypatch.setattr(hf_loading, "AutoModelForCausalLM", SimpleNamespace(from_pretrained=from_pretrained))


@pytest.mark.parametrize(
    ("files", "error", "says"),
    [
        (("model.safetensors", "pytorch_model.bin"), OSError("disk on fire"), "OSError: disk on fire"),
        ((), OSError("x does not appear to have a file named model.safetensors"), "no safetensors weights"),
        (
            ("model.safetensors",),
            ValueError("Unrecognized configuration class <class 'T5Config'> for this kind of AutoModel"),
            "it is no causal LM (its config.json is of a kind AutoModelForCausalLM does not load); give a "
            "decoder-only LM (GPT-2, Llama, Qwen2, ...)",
        ),
    ],
    ids=["bin-beside-safetensors", "local-folder-without-weights", "not-a-causal-lm"],
)
def test_a_failed_load_of_a_local_folder_says_what_failed(files, error, says, tmp_path, monkeypatch):
    """A folder with safetensors weights beside .bin ones failed for its own reason, not its .bin files; a local
    folder without weights is not sent to fill the Hugging Face cache (even with ``local_files_only``); a config of a
    kind that is no causal LM (T5's) is said to be one. One line each, ``cannot load the model <path>: ...``."""
    from dgrpo.model.hf_loading import load_hf_model
    from dgrpo.model.verified import CheckpointError

    for name in files:
        (tmp_path / name).write_bytes(b"")
    failing_load(monkeypatch, error)
    only = " (dgrpo loads safetensors only)" if says == "no safetensors weights" else ""
    with pytest.raises(CheckpointError) as e:
        load_hf_model(str(tmp_path), None, local_files_only=True)
    assert str(e.value) == f"cannot load the model {tmp_path}: {says}{only}"


def test_the_config_of_another_kind_of_model_is_said_to_be_no_causal_lm():
    """Weights that do not fit the causal LM transformers built for a config naming another architecture (a BERT
    encoder's: BertLMHeadModel, its head missing) are no causal LM, not a config that is not the weights' own."""
    from dgrpo.model.hf_loading import check_loading_info
    from dgrpo.model.verified import CheckpointError

    class BertLMHeadModel:
        config = SimpleNamespace(architectures=["BertModel"])

    info = {"missing_keys": ["cls.predictions.decoder.weight", "cls.predictions.bias"], "mismatched_keys": []}
    with pytest.raises(CheckpointError) as e:
        check_loading_info("here", BertLMHeadModel(), info)
    assert str(e.value) == (
        "the model here is no causal LM: its config.json names BertModel, and BertLMHeadModel, the causal LM of its "
        "kind, lacks cls.predictions.bias, cls.predictions.decoder.weight in its weights; give a decoder-only LM "
        "(GPT-2, Llama, Qwen2, ...)"
    )


def test_an_error_line_lists_three_tensors_and_counts_them_only_when_there_are_more():
    """``few_names``: up to ``n`` names as they are; past ``n``, the first ``n`` and how many in all."""
    from dgrpo.model.hf_loading import few_names

    assert few_names(["a", "b", "c"]) == "a, b, c" and few_names([]) == ""
    assert few_names(["a", "b", "c", "d"]) == "a, b, c, ... (4 in all)"
    assert few_names(["a", "b", "c", "d"], 4) == "a, b, c, d"


def test_an_offline_load_keeps_transformers_adapter_lookup_offline_too(monkeypatch):
    """``local_files_only`` reaches the PEFT adapter lookup transformers makes first (it does not pass the option on:
    a cached hub id waited ~25 s for that lookup's retries without network); an online load leaves it alone. The
    weights are asked for as safetensors either way."""
    from dgrpo.model import hf_loading

    asked = []

    def from_pretrained(path, **kwargs):
        asked.append(kwargs)
        return SimpleNamespace(config=SimpleNamespace()), {"missing_keys": [], "mismatched_keys": []}

    monkeypatch.setattr(hf_loading, "AutoModelForCausalLM", SimpleNamespace(from_pretrained=from_pretrained))
    for offline in (True, False):
        hf_loading.load_hf_model("org/model", None, local_files_only=offline)
    assert [a["adapter_kwargs"] for a in asked] == [{"local_files_only": True}, None]
    assert [a["local_files_only"] for a in asked] == [True, False] and all(a["use_safetensors"] for a in asked)
