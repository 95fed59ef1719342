"""The compiled layers' step and helpers, pinned without compiling (gaps found by mutation testing of
dgrpo.model.compiled_layers): the step run eagerly gives the layers' own log-probs and gradients, the per-row
checks and factors, the install bookkeeping and the recompile-limit fall-back."""

from __future__ import annotations

import warnings

import pytest
import torch
from test_compiled_layers import GAUSSIAN, LOCKED, counted
from test_recompute import assert_same, batch, loss_and_grads
from torch import nn

from dgrpo.model import compiled_layers as cl
from dgrpo.model.compiled_layers import CompiledLayers, _factor_of, _times, check_rows, output_factor_hook
from dgrpo.perturbation import make_perturbation

from conftest import make_lm


def eager_step(lm) -> CompiledLayers:
    """Compiled layers on ``lm`` whose step runs eagerly (no dynamo: the step's own Python, seconds less)."""
    compiled = lm.compiled_layers = CompiledLayers(lm.model, backend="eager")
    compiled.step = compiled._step
    return compiled


@pytest.mark.parametrize("kind", [LOCKED, GAUSSIAN], ids=["locked", "gaussian-prompt-unperturbed"])
@pytest.mark.parametrize("recompute", [False, "layer"])
def test_the_step_run_eagerly_gives_the_layers_own_logprobs_and_gradients(tokenizer, task_records, recompute, kind):
    """Prompt -> latent steps -> answer under locked dropout (attention, MLP, residual: each part its own factor)
    or Gaussian activation noise: the step gives the eager layers' log-probs and gradients (every layer, every
    call; the cache it fills is read by the next call)."""
    lm = make_lm(tokenizer).eval()
    pert = make_perturbation(kind)
    inputs, seeds = batch(lm, task_records, 3), torch.arange(3) + 5
    want = loss_and_grads(lm, inputs, recompute=recompute, pert=pert, seeds=seeds)
    calls = counted(eager_step(lm))
    assert_same(loss_and_grads(lm, inputs, recompute=recompute, pert=pert, seeds=seeds), want)
    assert calls["n"] == 2 * (1 + 3 + 2) * (2 if recompute else 1)  # 2 layers x the 6 calls (again in backward)


def test_a_call_over_no_cache_runs_the_layers_own_forward(tokenizer, task_records):
    """Inside the installed block, a forward without a DynamicCache (no cache at all) runs the layers' own forward,
    with the same output."""
    lm = make_lm(tokenizer).eval()
    ids, mask = batch(lm, task_records)[:2]
    with torch.no_grad():
        want = lm.model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        compiled = eager_step(lm)
        calls = counted(compiled)
        with compiled.installed(lm.model):
            got = lm.model(input_ids=ids, attention_mask=mask, use_cache=False).logits
    assert calls["n"] == 0 and torch.equal(got, want)


def test_a_hook_inside_a_layer_is_refused_before_the_step_runs(tokenizer, task_records):
    """A plain forward hook on a layer's sub-module (one the step cannot apply) is a RuntimeError naming it; a
    forward pre-hook on the MLP too."""
    lm = make_lm(tokenizer).eval()
    eager_step(lm)
    ids, mask, tg, tm = batch(lm, task_records)
    layer = lm.model.model.layers[1]
    handle = layer.self_attn.q_proj.register_forward_hook(lambda m, a, o: o)
    with torch.no_grad(), pytest.raises(RuntimeError, match="layer 1's self_attn.q_proj has a hook"):
        lm.target_logprobs(ids, mask, 2, tg, tm)
    handle.remove()
    handle = layer.mlp.register_forward_pre_hook(lambda m, a: None)
    with torch.no_grad(), pytest.raises(RuntimeError, match="layer 1's mlp has a forward pre-hook"):
        lm.target_logprobs(ids, mask, 2, tg, tm)
    handle.remove()


def test_installing_twice_at_once_is_an_error_and_leaving_uninstalls(tokenizer):
    lm = make_lm(tokenizer).eval()
    compiled = CompiledLayers(lm.model, backend="eager")
    for _ in range(2):  # (the second install: the first left)
        with compiled.installed(lm.model):
            assert compiled.is_installed(lm.model)
            with pytest.raises(RuntimeError, match="installed on this model already"):
                with compiled.installed(lm.model):
                    pass
        assert not compiled.is_installed(lm.model)


def test_a_higher_recompile_limit_of_the_users_is_kept(tokenizer, task_records):
    """The block raises dynamo's limit to at least RECOMPILE_LIMIT: a user's higher limit stays in force."""
    lm = make_lm(tokenizer).eval()
    compiled = eager_step(lm)
    with torch._dynamo.config.patch(recompile_limit=cl.RECOMPILE_LIMIT + 36):
        with compiled.installed(lm.model):
            assert torch._dynamo.config.recompile_limit == cl.RECOMPILE_LIMIT + 36


def test_calls_past_the_recompile_limit_run_eagerly_counted_with_one_warning(tokenizer, task_records):
    """A step that raises dynamo's recompile-limit error: each such call runs the step eagerly (the same values),
    counted in ``fallbacks``, with one warning in all."""
    if not cl.RECOMPILE_LIMIT_HIT:
        pytest.skip("this dynamo has no FailOnRecompileLimitHit")
    lm = make_lm(tokenizer).eval()
    inputs = batch(lm, task_records, 2)
    want = loss_and_grads(lm, inputs, recompute=False)
    compiled = CompiledLayers(lm.model, backend="eager")
    lm.compiled_layers = compiled

    def over_the_limit(*args):
        raise cl.RECOMPILE_LIMIT_HIT[0]("past the limit")

    compiled.step = over_the_limit
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert_same(loss_and_grads(lm, inputs, recompute=False), want)
    said = [w for w in caught if "recompile limit" in str(w.message)]
    assert len(said) == 1 and compiled.fallbacks == 2 * (1 + 3 + 2)


def test_check_rows_reads_a_flattened_outputs_batch_from_its_inputs():
    """A per-row factor of 2 rows against a [B*T, H] output: its batch is that of the first [B, T, H] input with
    B*T rows (not the rows themselves, not another input's); no such input is an error."""
    f2, f4 = torch.ones(2, 1, 5), torch.ones(4, 1, 5)
    h = torch.zeros(12, 5)
    other, source = torch.zeros(2, 5, 5), torch.zeros(4, 3, 5)
    check_rows(f4, h, (other, source))
    with pytest.raises(ValueError, match=r"^the perturbation is bound for 2 rows .*this batch has 4 "):
        check_rows(f2, h, (other, source))
    with pytest.raises(ValueError, match=r"flattened to \(12, 5\)"):
        check_rows(f2, h, (other,))
    with pytest.raises(ValueError, match=r"^the perturbation is bound for 2 rows .*this batch has 3 "):
        check_rows(f2, torch.zeros(3, 4, 5))
    check_rows(torch.ones(2, 5), torch.zeros(3, 4, 5))  # (not a per-row [rows, ., .] tensor: nothing to check)


def test_a_factor_on_a_flattened_output_is_applied_per_batch_row_in_the_outputs_dtype():
    """[2, 1, H] fp32 factors on a bf16 [2*3, H] output: rows 0-2 by the first, rows 3-5 by the second, bf16."""
    h = torch.ones(6, 2, dtype=torch.bfloat16)
    f = torch.tensor([[[2.0, 3.0]], [[5.0, 7.0]]])
    got = _times(h, f)
    want = torch.tensor([[2.0, 3.0]] * 3 + [[5.0, 7.0]] * 3, dtype=torch.bfloat16)
    assert got.dtype == torch.bfloat16 and torch.equal(got, want)


def test_the_factor_of_a_module_is_the_product_of_its_active_hooks():
    """Two factor hooks multiply; an inactive one (None) leaves the other's; no hook: None; a view into a larger
    tensor comes back as its own tensor (the graph would specialise on the offset)."""
    mod = nn.Linear(2, 2)
    a, b = torch.full((1, 1, 2), 2.0), torch.full((1, 1, 2), 3.0)
    assert _factor_of(mod, "m") is None
    mod.register_forward_hook(output_factor_hook(lambda: a))
    inactive = mod.register_forward_hook(output_factor_hook(lambda: None))
    assert torch.equal(_factor_of(mod, "m"), a)
    inactive.remove()
    mod.register_forward_hook(output_factor_hook(lambda: b))
    assert torch.equal(_factor_of(mod, "m"), torch.full((1, 1, 2), 6.0))
    view = torch.arange(6.0).reshape(3, 1, 2)[1:2]
    alone = nn.Linear(2, 2)
    alone.register_forward_hook(output_factor_hook(lambda: view))
    got = _factor_of(alone, "m")
    assert got.storage_offset() == 0 and torch.equal(got, view)


def test_the_step_itself_refuses_factors_bound_for_other_rows(tokenizer):
    """A decoder layer called directly (past LatentLM's own check) over a DynamicCache with the step installed, under
    locked dropout at the attention and MLP (factors the step applies) bound for one row more than the batch: the
    one line the eager hooks give, not a shape error inside the step."""
    from transformers import DynamicCache

    from dgrpo.config import PerturbationConfig

    lm = make_lm(tokenizer).eval()
    compiled = eager_step(lm)
    B, L = 2, 3
    hidden = torch.randn(B, L, lm.model.config.hidden_size)
    rotary = lm.model.model.rotary_emb(hidden, torch.arange(L)[None].expand(B, L))
    mask = torch.ones(B, 1, L, L, dtype=torch.bool).tril()
    cache = DynamicCache(config=lm.model.config)
    pert = make_perturbation(PerturbationConfig(kind="locked", p=0.3, sites=["attn", "mlp"]))
    with torch.no_grad(), pert.bind(lm, torch.arange(B + 1)), compiled.installed(lm.model):
        with pytest.raises(ValueError, match=rf"^the perturbation is bound for {B + 1} rows .*this batch has {B} "):
            lm.model.model.layers[0](hidden, attention_mask=mask, position_embeddings=rotary, past_key_values=cache)
