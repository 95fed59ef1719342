"""Causal-LM families beyond Qwen2 / Llama / GPT-2, where they differ in a way dgrpo must follow or refuse: a transform
of the head's logits (Gemma 2's softcapping, Cohere's and Granite's scaling), sliding-window caches, attention that
tests its own implementation name (Falcon), attention dropout kept elsewhere (OPT), ALiBi (Bloom)."""

from __future__ import annotations

import copy
import warnings
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from dgrpo.config import ConfigError, PerturbationConfig
from dgrpo.model.latent_lm import LatentLM

SIZES = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=64,
    max_position_embeddings=512,
)
FAMILIES: dict[str, dict[str, Any]] = {
    # a softcap of 0.1 bites at the tiny model's logits (~0.2; a trained Gemma 2's are large: its cap is 30)
    "gemma2": dict(head_dim=8, sliding_window=8, final_logit_softcapping=0.1, attn_logit_softcapping=50.0),
    "cohere": dict(logit_scale=0.0625),
    "granite": dict(logits_scaling=8.0, embedding_multiplier=12.0, residual_multiplier=0.22),
    "mistral": dict(sliding_window=8),
    "falcon": dict(new_decoder_architecture=True, num_kv_heads=2, ffn_hidden_size=64),
    "opt": dict(ffn_dim=64, word_embed_proj_dim=32, enable_bias=True),
    "bloom": dict(n_layer=2, n_head=4),
    "gpt_neox": dict(rotary_pct=0.25),
    "phi": {},
    "qwen2": {},
    "gpt_neo": dict(num_layers=2, num_heads=4, attention_types=[[["global", "local"], 1]], window_size=4),
    "llama4_text": dict(  # (its base_model_prefix, language_model, is not where it keeps its stack, .model)
        head_dim=8,
        num_local_experts=2,
        num_experts_per_tok=1,
        intermediate_size_mlp=64,
        attention_chunk_size=4,
        no_rope_layers=[1, 0],
        interleave_moe_layer_step=1,
    ),
    "hyperclovax": dict(head_dim=8, logits_scaling=0.125),  # (multiplies its logits by logits_scaling)
    "falcon_h1": dict(  # (a hybrid of attention and Mamba 2 layers; multiplies its logits by lm_head_multiplier)
        head_dim=8,
        mamba_d_ssm=32,
        mamba_n_heads=4,
        mamba_d_head=8,
        mamba_d_state=4,
        mamba_n_groups=1,
        lm_head_multiplier=0.05,
    ),
}


def family_lm(tokenizer, family: str) -> LatentLM:
    tok = copy.deepcopy(tokenizer)
    ids = dict(pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id)
    config = AutoConfig.for_model(family, vocab_size=len(tok), **SIZES, **ids, **FAMILIES[family])
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return LatentLM(AutoModelForCausalLM.from_config(config), tok).eval()


@pytest.mark.parametrize("family", ["gemma2", "cohere", "granite", "hyperclovax", "falcon_h1", "llama4_text", "qwen2"])
def test_log_probs_are_the_models_own_with_its_logit_transform(tokenizer, family):
    """dgrpo runs the head on its own hidden states; the model's forward transforms the head's logits after it. The
    transform was skipped: per-token log-probs 0.2-2 apart from the model's on these families. Llama 4's text model
    (no transform) keeps its decoder stack elsewhere than its base_model_prefix says: every forward failed."""
    lm = family_lm(tokenizer, family)
    q, qm = lm.encode_questions(["Start with 3. Add 4. Answer mod 10."], markers=False)
    t, tm = lm.encode_targets(["<<3+4=7>> #### 7"])
    with torch.no_grad():
        ours, _ = lm.target_logprobs(q, qm, 0, t, tm, markers=False)
        logits = lm.model(input_ids=torch.cat([q, t], 1)).logits.float()
        theirs = logits[:, q.shape[1] - 1 : -1].log_softmax(-1).gather(-1, t[..., None]).squeeze(-1)
        hidden = lm.base(input_ids=torch.cat([q, t], 1)).last_hidden_state
        raw = lm.model.get_output_embeddings()(hidden)[:, q.shape[1] - 1 : -1].float().log_softmax(-1)
        untransformed = raw.gather(-1, t[..., None]).squeeze(-1)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)
    transformed = not lm.logit_transform.identity
    assert transformed == (family not in ("qwen2", "llama4_text"))
    if transformed:  # (the test would pass without the transform if it changed nothing here)
        assert float((untransformed - theirs).abs().max()) > 1e-2


def test_recomputation_is_refused_over_sliding_window_caches(tokenizer):
    """A recomputed call refilled a sliding-window cache layer with a wrong position counter: log-probs 0.3 and
    gradients 40 apart from the plain run's, without an error."""
    section = SimpleNamespace(recompute=True, recompute_latent_steps=True, recompute_kept_layers=0)
    for granularity in ("call", "layer"):
        with pytest.raises(ConfigError, match="grpo.recompute: this model's KV cache has DynamicSlidingWindowLayer"):
            family_lm(tokenizer, "mistral").use_recompute(
                SimpleNamespace(**vars(section), recompute_granularity=granularity), "grpo"
            )
    lm = family_lm(tokenizer, "qwen2")  # full attention: recomputed as asked
    lm.use_recompute(SimpleNamespace(**vars(section), recompute_granularity="call"), "grpo")
    assert lm.recompute == "call"


def test_packed_gqa_leaves_a_model_whose_attention_tests_its_own_name(tokenizer):
    """Falcon compares _attn_implementation with "sdpa" itself: renamed, it fell to its eager branch and added the
    boolean mask as numbers (later tokens moved earlier log-probs)."""
    from dgrpo.model.gqa_attention import use_packed_gqa

    falcon = family_lm(tokenizer, "falcon")
    falcon.model.config._attn_implementation = "sdpa"
    assert not use_packed_gqa(falcon.model, True) and falcon.model.config._attn_implementation == "sdpa"
    qwen = family_lm(tokenizer, "qwen2")
    qwen.model.config._attn_implementation = "sdpa"
    assert use_packed_gqa(qwen.model, True)


def test_native_dropout_without_a_rate_to_set_is_refused(tokenizer):
    """OPT keeps its attention dropout rate in `dropout`: native dropout set nothing and every rollout was the
    deterministic network's (every group identical, every step skipped)."""
    from dgrpo.perturbation import make_perturbation

    native = make_perturbation(PerturbationConfig(kind="native", p=0.5))
    with pytest.raises(ConfigError, match="perturbation.kind=native: OPTAttention has no attention dropout rate"):
        native.check(family_lm(tokenizer, "opt"))
    native.check(family_lm(tokenizer, "qwen2"))


def test_gaussian_weight_noise_on_a_mixture_of_experts_is_a_config_error(tokenizer):
    """A mixture of experts has no single output projection per MLP: weights noise on its mlp sites raised a
    ValueError (a traceback) when the trainer started. It is a one-line ConfigError naming what to set instead;
    activation noise on the same sites, and weights noise on attn, apply."""
    import copy

    from dgrpo.perturbation import make_perturbation

    tok = copy.deepcopy(tokenizer)
    ids = dict(pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id)
    experts = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32)
    config = AutoConfig.for_model("qwen2_moe", vocab_size=len(tok), **SIZES, **ids, **experts)
    torch.manual_seed(0)
    lm = LatentLM(AutoModelForCausalLM.from_config(config), tok).eval()
    weights = PerturbationConfig(kind="gaussian", sigma=0.1, gaussian_target="weights", sites=["mlp"])
    with pytest.raises(
        ConfigError, match=r"the mlp site \(Qwen2MoeSparseMoeBlock\) has none .*: use perturbation.gaussian_target="
    ):
        make_perturbation(weights).check(lm)
    make_perturbation(
        PerturbationConfig(kind="gaussian", sigma=0.1, gaussian_target="activations", sites=["mlp"])
    ).check(lm)
    make_perturbation(PerturbationConfig(kind="gaussian", sigma=0.1, gaussian_target="weights", sites=["attn"])).check(
        lm
    )


def test_alibi_models_decode_without_a_static_cache(tokenizer):
    """Bloom's position bias comes from the 2-d mask, shorter than a static cache: a raw shape error inside
    transformers. A static cache is refused in one line and the fast engine's auto choice passes it by."""
    from dgrpo.model.static_cache import static_cache_obstacle
    from dgrpo.training.rollouts import resolve_engine

    lm = family_lm(tokenizer, "bloom")
    ids, mask = lm.encode_questions(["Start with 3. Add 4. Answer mod 10."])
    with pytest.raises(ConfigError, match="a static KV cache .* cannot be used: bloom builds its ALiBi position bias"):
        lm.generate(ids, mask, 2, max_new_tokens=4, static_cache=True)
    assert lm.generate(ids, mask, 2, max_new_tokens=4).tokens.shape == (1, 4)  # the dynamic cache serves it
    why = static_cache_obstacle(lm.model.config)
    assert why and resolve_engine("auto", torch.device("cuda"), True, why) == "eager"
    assert static_cache_obstacle(family_lm(tokenizer, "qwen2").model.config) is None


def test_llama4_text_reasons_in_latent_steps(tokenizer):
    """Llama4ForCausalLM's base_model is itself (its prefix, language_model, is not an attribute): the latent step
    read last_hidden_state off the causal LM's output and failed with an AttributeError."""
    lm = family_lm(tokenizer, "llama4_text")
    assert lm.base is lm.model.model
    ids, mask = lm.encode_questions(["Start with 3. Add 4. Answer mod 10."])
    first, again = (lm.generate(ids, mask, 2, max_new_tokens=4) for _ in range(2))
    assert torch.equal(first.tokens, again.tokens) and first.tokens.shape == (1, 4)
    # its mixture of experts returns [B*T, H]: the default dropout's [B, 1, H] mask broadcast to [B, B*T, H] (an error)
    from dgrpo.perturbation import make_perturbation

    dropout = make_perturbation(PerturbationConfig(p=0.3))
    q, qm = lm.encode_questions(["Start with 3. Add 4. Answer mod 10.", "Start with 5. Add 1. Answer mod 10."])
    t, tm = lm.encode_targets(["#### 7", "#### 6"])
    with torch.no_grad():
        plain, _ = lm.target_logprobs(q, qm, 2, t, tm)
        with dropout.bind(lm, torch.tensor([5, 6])) as bound:
            masked, _ = lm.target_logprobs(q, qm, 2, t, tm, perturbation=bound)
        with dropout.bind(lm, torch.tensor([7, 6])) as bound:
            other, _ = lm.target_logprobs(q, qm, 2, t, tm, perturbation=bound)
    assert float((masked - plain).abs().max()) > 1e-4
    assert not torch.allclose(masked[0], other[0]) and torch.allclose(masked[1], other[1], rtol=0, atol=1e-6)


def test_gpt_neo_local_attention_decodes_without_a_static_cache(tokenizer):
    """transformers' StaticCache gives GPT-Neo's local layers full-attention ones: past the window (4 here; 256 in
    GPT-Neo's checkpoints) the static cache's tokens and log-probs silently left the dynamic cache's."""
    from dgrpo.model.static_cache import static_cache_obstacle

    lm = family_lm(tokenizer, "gpt_neo")
    ids, mask = lm.encode_questions(["Start with 3. Add 4. Answer mod 10."])
    with pytest.raises(ConfigError, match="cannot be used: gpt_neo's local-attention layers need a sliding-window"):
        lm.generate(ids, mask, 2, max_new_tokens=4, static_cache=True)
    assert lm.generate(ids, mask, 2, max_new_tokens=4).tokens.shape == (1, 4)
    lm.model.config.attention_layers = ["global", "global"]  # (all global: the static cache serves it)
    assert static_cache_obstacle(lm.model.config) is None


@pytest.mark.parametrize("family", ["gpt_neox", "phi"])
def test_weight_noise_finds_the_mlp_output_projection_by_its_family_name(tokenizer, family):
    """GPT-NeoX's dense_4h_to_h and Phi's fc2 are their MLPs' output projections (weight noise was refused)."""
    from dgrpo.perturbation import make_perturbation

    lm = family_lm(tokenizer, family)
    noise = make_perturbation(PerturbationConfig(kind="gaussian", gaussian_target="weights", sigma=0.5))
    q, qm = lm.encode_questions(["Start with 3. Add 4. Answer mod 10."])
    t, tm = lm.encode_targets(["#### 7"])
    with torch.no_grad():
        plain, _ = lm.target_logprobs(q, qm, 2, t, tm)
        with noise.bind(lm, torch.tensor([5])) as bound:
            first, _ = lm.target_logprobs(q, qm, 2, t, tm, perturbation=bound)
        with noise.bind(lm, torch.tensor([5])) as bound:
            again, _ = lm.target_logprobs(q, qm, 2, t, tm, perturbation=bound)
    assert float((first - plain).abs().max()) > 1e-4 and torch.equal(first, again)


def test_an_explicit_pack_gqa_that_cannot_apply_is_warned_about(tokenizer):
    """model.pack_gqa=true on a model packing does not serve ran Hugging Face's attention without a word."""
    from dgrpo.config import ModelConfig
    from dgrpo.model.factory import pack_gqa

    falcon = family_lm(tokenizer, "falcon")
    falcon.model.config._attn_implementation = "sdpa"
    with pytest.warns(UserWarning, match="model.pack_gqa=true: FalconForCausalLM runs Hugging Face's attention"):
        pack_gqa(falcon, ModelConfig(pack_gqa="true"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pack_gqa(falcon, ModelConfig(pack_gqa="auto"))  # (auto: off on a CPU, and quiet where it cannot apply)


def test_a_tokenizer_that_starts_texts_with_bos_gets_it_before_every_question(tokenizer):
    """Llama, Mistral and Gemma tokenizers put BOS before a text (Coconut's dataset.py encodes its questions so, and a
    pretrained Llama expects it); dgrpo encoded questions without it. A tokenizer that adds nothing gets nothing."""
    from tokenizers.processors import TemplateProcessing

    from conftest import make_lm

    tok = copy.deepcopy(tokenizer)
    tok.add_special_tokens({"bos_token": "<s>"})
    tok._tokenizer.post_processor = TemplateProcessing(single="<s> $A", special_tokens=[("<s>", tok.bos_token_id)])
    assert tok("1", add_special_tokens=True)["input_ids"][0] == tok.bos_token_id  # (a Llama-style tokenizer)
    lm = make_lm(tok)
    ids, mask = lm.encode_questions(["Start with 3.", "Start with 3. Add 4."], max_tokens=4)
    plain = make_lm(tokenizer).encode_questions(["Start with 3.", "Start with 3. Add 4."], max_tokens=4)[0]
    assert lm.question_prefix == [tok.bos_token_id] and make_lm(tokenizer).question_prefix == []
    for row, m, without in zip(ids, mask, plain):  # BOS, the question's last 4 tokens as before, <|start-latent|>
        kept = row[m.bool()].tolist()
        assert kept[0] == tok.bos_token_id and kept[-1] == lm.start_id and len(kept) == 6
        assert kept[1:-1] == without[without != tokenizer.pad_token_id].tolist()[:-1]


def test_families_dgrpo_cannot_run_are_refused_when_the_model_is_wrapped(tokenizer):
    """Mamba's cached forward multiplies a one-token step by the whole 2-d mask: greedy tokens other than the model's
    own argmax, scoring a shape error. Gemma 4's per-layer inputs are looked up from token ids: an error 15 frames
    inside transformers at the first latent step."""
    from dgrpo.model.support import unsupported

    tok = copy.deepcopy(tokenizer)
    config = AutoConfig.for_model(
        "mamba", vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, state_size=4, expand=2, conv_kernel=4
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_config(config)
    with pytest.raises(ConfigError, match="LatentLM: mamba models are not supported: their cached forward applies"):
        LatentLM(model, tok)
    assert "per-layer inputs" in unsupported(SimpleNamespace(model_type="gemma4_text", hidden_size_per_layer_input=256))
    assert unsupported(SimpleNamespace(model_type="gemma4_text", hidden_size_per_layer_input=0)) is None
    assert unsupported(SimpleNamespace(model_type="mamba2")) is None  # (decodes: trained it cannot be, below)


def test_families_with_recurrent_state_are_refused_by_the_trainers(tokenizer, task_records):
    """The cache of a state-space or linear-attention layer updates its state in place: the first backward failed
    ("modified by an inplace operation") after the step's rollouts. Evaluation works, and stays allowed."""
    from dgrpo.model.support import untrainable
    from dgrpo.training.grpo import GRPOTrainer

    from conftest import tiny_config

    lm = family_lm(tokenizer, "falcon_h1")
    with pytest.raises(ConfigError, match="GRPOTrainer: falcon_h1 cannot be trained by dgrpo: its state-space layers"):
        GRPOTrainer(lm, tiny_config(), task_records[:8])
    hybrid = SimpleNamespace(model_type="qwen3_next", layer_types=["linear_attention", "full_attention"])
    assert "its linear_attention layers keep a recurrent state" in untrainable(hybrid)
    assert untrainable(SimpleNamespace(model_type="lfm2", layer_types=["conv", "full_attention"])) is None
    assert untrainable(family_lm(tokenizer, "qwen2").model.config) is None
