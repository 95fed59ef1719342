"""The model's small parts, where mutation testing found their behaviour unpinned: the logit transform's formula and
the configs it reads (dgrpo.model.output_head), the fused kernels' application over a stand-in for Liger Kernel
(dgrpo.model.kernels: it needs CUDA), and the tiny test models (dgrpo.model.tiny)."""

import math
import sys
import types
import warnings
from types import SimpleNamespace

import pytest
import torch

from dgrpo.model.output_head import LogitTransform, logit_transform, output_head
from dgrpo.model.tiny import build_tiny_model, tiny_config


def test_the_logit_transform_scales_then_softcaps():
    """softcap * tanh(scale * logits / softcap), as a model's forward applies a scale and a cap (hand values); the
    identity only without either."""
    x = torch.tensor([0.0, 1.0, -3.0])
    out = LogitTransform(scale=2.0, softcap=3.0)(x)
    expected = [3 * math.tanh(2 * v / 3) for v in (0.0, 1.0, -3.0)]
    torch.testing.assert_close(out, torch.tensor(expected), rtol=0, atol=1e-6)
    torch.testing.assert_close(LogitTransform(scale=0.5)(x), x * 0.5)
    assert LogitTransform().identity
    assert not LogitTransform(scale=0.5).identity and not LogitTransform(softcap=30.0).identity


@pytest.mark.parametrize(
    "config, scale, softcap",
    [
        (dict(model_type="cohere2", logit_scale=0.25), 0.25, None),  # (Cohere 2 multiplies by it, as Cohere does)
        (dict(model_type="llama", logit_scale=0.25), 1.0, None),  # (another family's field of that name: not read)
        (dict(model_type="granite", logits_scaling=8.0), 0.125, None),
        (dict(model_type="hyperclovax", logits_scaling=0.5), 0.5, None),  # (multiplies)
        (dict(model_type="falcon_h1", lm_head_multiplier=0.05), 0.05, None),
        (dict(model_type="llama", lm_head_multiplier=0.05), 1.0, None),
        (dict(model_type="gemma2", final_logit_softcapping=30), 1.0, 30.0),
        (dict(model_type="gemma2", final_logit_softcapping=None), 1.0, None),
    ],
)
def test_the_logit_transform_is_read_from_the_config(config, scale, softcap):
    transform = logit_transform(SimpleNamespace(**config))
    assert transform.scale == pytest.approx(scale) and transform.softcap == softcap


def test_the_transformed_head_keeps_the_heads_vocabulary():
    """The transformed head is called as the head is and shows its ``weight`` (chunked scoring reads the vocabulary
    from it; without it the whole vocabulary's logits were made in one chunk)."""
    model = build_tiny_model("llama", 11, hidden_size=8, num_layers=1, num_heads=2, intermediate_size=16)
    head = model.get_output_embeddings()
    assert output_head(model, LogitTransform()) is head
    transformed = output_head(model, LogitTransform(scale=0.5, softcap=2.0))
    assert transformed.weight is head.weight
    h = torch.randn(2, 8)
    torch.testing.assert_close(transformed(h), 2.0 * torch.tanh(0.5 * head(h) / 2.0))


# ---------------------------------------------------------------------------------------------- fused kernels
@pytest.fixture
def fake_liger(monkeypatch):
    """A stand-in for Liger Kernel (CUDA only, not installed here): it records its calls and, as Liger does, swaps
    the architecture module's RMSNorm class and its rotary function."""
    from transformers.models.llama import modeling_llama

    calls = []

    def apply(model, **kw):
        calls.append((model, kw))
        modeling_llama.LlamaRMSNorm = type("LigerRMSNorm", (torch.nn.Module,), {})
        modeling_llama.apply_rotary_pos_emb = lambda *a, **k: None

    package = types.ModuleType("liger_kernel")
    transformers_module = types.ModuleType("liger_kernel.transformers")
    transformers_module._apply_liger_kernel_to_instance = apply
    monkey_patch = types.ModuleType("liger_kernel.transformers.monkey_patch")
    monkey_patch.MODEL_TYPE_TO_APPLY_LIGER_FN = {"llama": None, "qwen2": None}
    for name, module in [
        ("", package),
        (".transformers", transformers_module),
        (".transformers.monkey_patch", monkey_patch),
    ]:
        monkeypatch.setitem(sys.modules, "liger_kernel" + name, module)
    for name in ("LlamaRMSNorm", "apply_rotary_pos_emb"):  # (put back after the test)
        monkeypatch.setattr(modeling_llama, name, getattr(modeling_llama, name))
    return calls, modeling_llama


def on_cuda(monkeypatch, model):
    """``model`` as apply_kernels sees a model on a CUDA device."""
    monkeypatch.setattr(model, "parameters", lambda: iter([SimpleNamespace(device=torch.device("cuda"))]))
    return model


def test_liger_is_applied_to_the_causal_lm_with_its_fused_layers_only(fake_liger, monkeypatch):
    """Liger's rotary, RMSNorm and SwiGLU layers on the causal LM under a PEFT-like wrapper, never its loss patches
    (they replace the forward, which dgrpo does not call for its log-probs); its swap of the architecture's module
    classes is undone (models built later keep Hugging Face's), its rotary function stays (looked up as a global)."""
    from dgrpo.model.kernels import apply_kernels

    calls, modeling = fake_liger
    norm = modeling.LlamaRMSNorm
    base = build_tiny_model("llama", 11, hidden_size=8, num_layers=1, num_heads=2, intermediate_size=16)
    wrapper = SimpleNamespace(get_base_model=lambda: base, parameters=lambda: iter(base.parameters()))
    on_cuda(monkeypatch, wrapper)
    assert apply_kernels(wrapper, "liger") is True
    assert len(calls) == 1 and calls[0][0] is base
    assert calls[0][1] == {
        "rope": True,
        "rms_norm": True,
        "swiglu": True,
        "cross_entropy": False,
        "fused_linear_cross_entropy": False,
    }
    assert modeling.LlamaRMSNorm is norm and modeling.apply_rotary_pos_emb.__name__ == "<lambda>"


def test_liger_refuses_a_model_type_it_has_no_kernels_for(fake_liger, monkeypatch):
    from dgrpo.model.kernels import apply_kernels

    calls, _ = fake_liger
    model = on_cuda(monkeypatch, build_tiny_model("gpt2", 11, hidden_size=8, num_layers=1, num_heads=2))
    with pytest.raises(ValueError, match="Liger has no kernels for model type 'gpt2' \\(it has: llama, qwen2\\)"):
        apply_kernels(model, "liger")
    assert calls == []


def test_liger_missing_is_an_import_error_saying_what_to_install(monkeypatch):
    from dgrpo.model.kernels import apply_kernels

    monkeypatch.setitem(sys.modules, "liger_kernel", None)
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers", None)
    model = on_cuda(monkeypatch, build_tiny_model("llama", 11, hidden_size=8, num_layers=1, num_heads=2))
    with pytest.raises(ImportError, match="pip install liger-kernel"):
        apply_kernels(model, "liger")


# ---------------------------------------------------------------------------------------------- tiny models
def test_a_tiny_model_is_its_seeds_and_leaves_the_global_generator_alone():
    """The same seed, the same weights; another seed, others; and building one draws nothing from the global
    generator (a test's later draws do not depend on which models it built)."""
    kw = dict(hidden_size=8, num_layers=1, num_heads=2, intermediate_size=16)
    torch.manual_seed(5)
    before = torch.random.get_rng_state()
    a, b, c = (build_tiny_model("qwen2", 11, seed=s, **kw) for s in (1, 1, 2))
    assert torch.equal(torch.random.get_rng_state(), before)
    wa, wb, wc = (m.get_input_embeddings().weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)


@pytest.mark.parametrize("arch", ["qwen2", "llama", "gpt2"])
def test_a_tiny_config_has_the_sizes_asked_for(arch):
    cfg = tiny_config(arch, 50, hidden_size=16, num_layers=3, num_heads=4, intermediate_size=24, max_positions=64)
    sizes = (
        cfg.vocab_size,
        cfg.hidden_size,
        cfg.num_hidden_layers,
        cfg.num_attention_heads,
        cfg.max_position_embeddings,
    )
    assert sizes == (50, 16, 3, 4, 64)
    inner = cfg.n_inner if arch == "gpt2" else cfg.intermediate_size
    assert inner == 24 and (cfg.pad_token_id, cfg.eos_token_id, cfg.bos_token_id) == (0, 1, 1)
    assert (cfg.tie_word_embeddings if arch != "gpt2" else True) == (arch != "llama")


def test_a_tiny_gpt2_has_no_dropout_of_its_own():
    """GPT-2's config defaults to 0.1 dropout in its residuals, embeddings and attention: a tiny GPT-2 has none, so
    that a training-mode forward is the network's (dgrpo's perturbation is the only noise) and repeats exactly."""
    model = build_tiny_model("gpt2", 11, hidden_size=8, num_layers=1, num_heads=2, intermediate_size=16).train()
    ids = torch.tensor([[2, 3, 4, 5]])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert torch.equal(model(ids).logits, model(ids).logits)


# ---------------------------------------------------------------------------------------------- the uncached reference
def test_the_uncached_reference_scores_ragged_targets_as_the_cache_does(tokenizer, task_records):
    """The full recompute's log-probs of right-padded targets of different lengths: the cached recurrence's at every
    real position (1e-5) and 0 at the padding (it gave the padding tokens' log-probs there), and the input
    embeddings' gradient of their sum through the fed-back thoughts is the cached path's too."""
    from test_fixed_shape import ragged_targets

    from dgrpo.model.reference import uncached_target_logprobs

    from conftest import make_lm

    lm = make_lm(tokenizer, "qwen2").eval()
    ids, mask = lm.encode_questions([r.question[: 20 + 9 * i] for i, r in enumerate(task_records[:3])])
    tg, tm = ragged_targets(lm, 3)
    weight = lm.model.get_input_embeddings().weight
    results = []
    for run in (lm.target_logprobs, uncached_target_logprobs):
        lm.model.zero_grad(set_to_none=True)
        logp = run(lm, ids, mask, 2, tg, tm)[0] if run is uncached_target_logprobs else run(ids, mask, 2, tg, tm)[0]
        logp.sum().backward()
        results.append((logp.detach(), weight.grad.clone()))
    (cached, g_cached), (ref, g_ref) = results
    assert (tm == 0).any() and (ref[tm == 0] == 0).all()
    torch.testing.assert_close(ref, cached, rtol=0, atol=1e-5)
    torch.testing.assert_close(g_ref, g_cached, rtol=0, atol=1e-5)


def test_the_uncached_reference_applies_the_models_logit_transform(tokenizer, task_records):
    """The full recompute scores with the head as the model's forward applies it (Cohere's logit scale here): the
    cached recurrence's log-probs (1e-5) through two thoughts, not the untransformed head's."""
    from test_model_families import family_lm

    from dgrpo.model.reference import uncached_target_logprobs

    lm = family_lm(tokenizer, "cohere")
    ids, mask = lm.encode_questions([r.question for r in task_records[:2]])
    tg, tm = lm.encode_targets(["<<3+4=7>> #### 7", "#### 2"])
    with torch.no_grad():
        cached, _ = lm.target_logprobs(ids, mask, 2, tg, tm)
        ref, _ = uncached_target_logprobs(lm, ids, mask, 2, tg, tm)
    torch.testing.assert_close(ref, cached, rtol=0, atol=1e-5)


# ---------------------------------------------------------------------------------------------- supported families
@pytest.mark.parametrize(
    "config, refused",
    [
        (dict(model_type="mamba"), "mamba models are not supported"),
        (dict(model_type="falcon_mamba"), "falcon_mamba models are not supported"),
        (dict(model_type="gemma4", hidden_size_per_layer_input=256), "gemma4 with per-layer inputs"),
        (dict(model_type="gemma4_text", hidden_size_per_layer_input=None), None),
        (dict(model_type="mamba2"), None),
        (dict(model_type="qwen2"), None),
    ],
)
def test_the_families_dgrpo_cannot_run(config, refused):
    from dgrpo.model.support import unsupported

    why = unsupported(SimpleNamespace(**config))
    assert why is None if refused is None else refused in why


@pytest.mark.parametrize(
    "config, refused",
    [
        (dict(model_type="mamba2"), "mamba2 cannot be trained by dgrpo: its state-space layers keep"),
        (dict(model_type="falcon_h1"), "falcon_h1 cannot be trained by dgrpo: its state-space layers keep"),
        (dict(model_type="granitemoehybrid", layer_types=["mamba", "attention"]), "its mamba layers keep"),
        (dict(model_type="x", layer_types=["mamba", "linear_attention"]), "its linear_attention and mamba layers"),
        (dict(model_type="qwen2", layer_types=["full_attention", "sliding_attention"]), None),
        (dict(model_type="mamba"), None),  # (refused before: it cannot run at all)
    ],
)
def test_the_families_dgrpo_cannot_train(config, refused):
    from dgrpo.model.support import untrainable

    why = untrainable(SimpleNamespace(**config))
    assert why is None if refused is None else refused in why


def test_an_unknown_tiny_architecture_is_refused():
    with pytest.raises(ValueError, match="unknown tiny architecture 'bert'; expected qwen2, llama or gpt2"):
        tiny_config("bert", 50)
