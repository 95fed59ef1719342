"""The compiled layers' step over a layer's cache, and what it refuses or leaves out (a second mutation-testing pass
of dgrpo.model.compiled_layers): a layer called with its cache under the older keyword fills it as a DynamicCache
would (initialised, its length counted), a pre-hook on any sub-module is refused, and a hook present on the model
when the step was made is not copied into it."""

from __future__ import annotations

import pytest
import torch
from test_compiled_layers import counted
from test_recompute import batch
from transformers import DynamicCache

from dgrpo.model.compiled_layers import CompiledLayers, output_factor_hook

from conftest import make_lm


def eager_step(lm) -> CompiledLayers:
    """Compiled layers on ``lm`` whose step runs eagerly (no dynamo)."""
    compiled = lm.compiled_layers = CompiledLayers(lm.model, backend="eager")
    compiled.step = compiled._step
    return compiled


def layer_inputs(lm, B=2, L=3):
    hidden = torch.randn(B, L, lm.model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    rotary = lm.model.model.rotary_emb(hidden, torch.arange(L)[None].expand(B, L))
    return hidden, rotary, torch.ones(B, 1, L, L, dtype=torch.bool).tril()


@pytest.mark.filterwarnings("ignore:`past_key_values` is deprecated:FutureWarning")
def test_a_layer_called_with_past_key_values_runs_the_step_and_fills_the_cache(tokenizer):
    """``past_key_values=`` (transformers before 5.24's name of the cache) reaches the step: it runs, the empty
    DynamicCache layer it fills is initialised and counts the 3 positions (a layer left uninitialised counts 0, and
    the next call's mask would be built for no past), and the output is the layer's own over its own cache."""
    lm = make_lm(tokenizer).eval()
    hidden, rotary, mask = layer_inputs(lm)
    layer = lm.model.model.layers[0]
    with torch.no_grad():
        own_cache = DynamicCache(config=lm.model.config)
        want = layer(hidden, attention_mask=mask, position_embeddings=rotary, past_key_values=own_cache)
        want = want[0] if isinstance(want, tuple) else want
        compiled = eager_step(lm)
        calls = counted(compiled)
        cache = DynamicCache(config=lm.model.config)
        with compiled.installed(lm.model):
            got = layer(hidden, attention_mask=mask, position_embeddings=rotary, past_key_values=cache)
    got = got[0] if isinstance(got, tuple) else got
    assert calls["n"] == 1
    assert cache.layers[0].is_initialized and cache.get_seq_length(0) == 3
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    torch.testing.assert_close(cache.layers[0].keys, own_cache.layers[0].keys, rtol=0, atol=1e-6)


def test_a_pre_hook_on_any_sub_module_of_a_layer_is_refused(tokenizer, task_records):
    """A forward pre-hook on a layer's input norm (not one of the parts whose factors the step applies) would never
    run inside the step: a RuntimeError naming it."""
    lm = make_lm(tokenizer).eval()
    eager_step(lm)
    ids, mask, tg, tm = batch(lm, task_records, 2)
    handle = lm.model.model.layers[1].input_layernorm.register_forward_pre_hook(lambda m, a: None)
    try:
        with torch.no_grad(), pytest.raises(RuntimeError, match="layer 1's input_layernorm has a hook"):
            lm.target_logprobs(ids, mask, 2, tg, tm)
    finally:
        handle.remove()


def test_a_hook_on_the_model_when_the_step_is_made_is_not_copied_into_it(tokenizer, task_records):
    """The step's template is a copy of layer 0: a factor hook on its MLP at that moment (a perturbation's, doubling
    the output) is not carried into the template, where it would double every layer's MLP output for good; once
    the model's own hook is gone, the step gives the model's log-probs."""
    lm = make_lm(tokenizer).eval()
    ids, mask, tg, tm = batch(lm, task_records, 2)
    with torch.no_grad():
        want = lm.target_logprobs(ids, mask, 2, tg, tm)[0]
    handle = lm.model.model.layers[0].mlp.register_forward_hook(output_factor_hook(lambda: torch.tensor(2.0)))
    eager_step(lm)
    handle.remove()
    with torch.no_grad():
        got = lm.target_logprobs(ids, mask, 2, tg, tm)[0]
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
