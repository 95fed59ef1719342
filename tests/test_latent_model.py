"""The latent recurrence: cached == uncached, padding-invariant, differentiable through every step."""

import inspect
import warnings

import pytest
import torch

from dgrpo.model.latent_lm import cache_keyword
from dgrpo.model.reference import recompute_generate, uncached_target_logprobs

from conftest import make_lm, tiny_config

ARCHS = ["qwen2", "llama", "gpt2"]


def batch(lm, records, n=4, ragged=True):
    qs = [r.question if (i % 2 or not ragged) else r.question[: 25 + i] for i, r in enumerate(records[:n])]
    targets = ["\n".join(r.steps[2:]) + "\n#### " + r.answer for r in records[:n]]
    return lm.encode_questions(qs) + lm.encode_targets(targets)


@pytest.mark.parametrize("arch", ARCHS)
def test_cached_recurrence_equals_uncached_recompute(tokenizer, task_records, arch):
    lm = make_lm(tokenizer, arch).eval()
    ids, mask, tg, tm = batch(lm, task_records)
    with torch.no_grad():
        state = lm.prefill(ids, mask, 3)
        cached_lp, _ = lm.score_targets(state, tg, tm)
        ref_lp, ref_hidden = uncached_target_logprobs(lm, ids, mask, 3, tg, tm)
    assert torch.allclose(cached_lp, ref_lp, atol=1e-5), (cached_lp - ref_lp).abs().max()
    # the hidden state fed back at the last latent step equals the full recompute's
    with torch.no_grad():
        st = lm.prefill(ids, mask, 3, markers=False)
    P = ids.shape[1]
    assert torch.allclose(st.last_hidden[:, 0], ref_hidden[:, P + 2], atol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_left_padded_batch_equals_rows_alone(tokenizer, task_records, arch):
    lm = make_lm(tokenizer, arch).eval()
    ids, mask, tg, tm = batch(lm, task_records)
    with torch.no_grad():
        lp, _ = lm.target_logprobs(ids, mask, 3, tg, tm)
        gen = lm.generate(ids, mask, 3, max_new_tokens=8)
        for i in range(ids.shape[0]):
            keep = mask[i].bool()
            lp1, _ = lm.target_logprobs(
                ids[i : i + 1, keep],
                mask[i : i + 1, keep],
                3,
                tg[i : i + 1, : int(tm[i].sum())],
                tm[i : i + 1, : int(tm[i].sum())],
            )
            assert torch.allclose(lp1[0], lp[i, : lp1.shape[1]], atol=1e-5)
            g1 = lm.generate(ids[i : i + 1, keep], mask[i : i + 1, keep], 3, max_new_tokens=8)
            n = int(g1.mask.sum())
            assert g1.tokens[0, :n].tolist() == gen.tokens[i, :n].tolist()
            assert torch.allclose(g1.logprobs[0, :n], gen.logprobs[i, :n], atol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_answer_gradient_reaches_prompt_embeddings_through_all_latent_steps(tokenizer, task_records, arch):
    lm = make_lm(tokenizer, arch)
    ids, mask, tg, tm = batch(lm, task_records)
    captured = []
    emb = lm.model.get_input_embeddings()
    hook = emb.register_forward_hook(lambda m, i, o: captured.append(o) and None)
    try:
        lp, _ = lm.target_logprobs(ids, mask, 4, tg, tm)  # T = 4 latent steps between prompt and answer
    finally:
        hook.remove()
    prompt_emb = captured[0]
    assert prompt_emb.shape[:2] == ids.shape
    loss = -(lp * tm).sum() / tm.sum()
    g = torch.autograd.grad(loss, prompt_emb)[0]
    assert torch.isfinite(g).all() and g[mask.bool()].abs().sum() > 0


def test_gradient_flows_through_the_chain_not_only_the_cache(tokenizer, task_records):
    """Cutting the fed-back hidden state (detach) must change the prompt gradient: the chain carries gradient."""
    lm = make_lm(tokenizer, "qwen2")
    ids, mask, tg, tm = batch(lm, task_records)
    grads = []
    for detach in (False, True):
        lm.zero_grad()
        orig = lm._forward

        def fwd(state, phase, perturbation, detach=detach, orig=orig, **kw):
            if detach and kw.get("embeds") is not None and phase == "latent":
                kw["embeds"] = kw["embeds"].detach()
            return orig(state, phase, perturbation, **kw)

        lm._forward = fwd
        lp, _ = lm.target_logprobs(ids, mask, 4, tg, tm)
        (-(lp * tm).sum()).backward()
        lm._forward = orig
        grads.append(lm.model.get_input_embeddings().weight.grad.clone())
    assert all(torch.isfinite(g).all() for g in grads)
    assert not torch.allclose(grads[0], grads[1])


@pytest.mark.parametrize("arch", ARCHS)
def test_batched_cached_generation_matches_batch1_recompute(tokenizer, task_records, arch):
    lm = make_lm(tokenizer, arch).eval()
    qs = [r.question for r in task_records[:3]]
    ids, mask = lm.encode_questions(qs)
    gen = lm.generate(ids, mask, 2, max_new_tokens=6)
    for i, q in enumerate(qs):
        ref = recompute_generate(lm, q, 2, 6)
        n = int(gen.mask[i].sum())
        assert gen.tokens[i, :n].tolist() == ref[:n]


def test_an_answer_ends_at_the_models_end_of_turn_ids_too(tokenizer, task_records):
    """generation_config.eos_token_id's other ids end an answer, as Hugging Face's generate ends it (an instruction
    model's end of turn beside the tokenizer's EOS: only the EOS stopped it, and the answer ran on), over either
    cache and in the unbatched reference; the token is booked, as EOS is."""
    from dgrpo.model.tokens import end_of_turn_ids

    lm = make_lm(tokenizer, "llama", seed=1).eval()  # (an answer of different tokens: tiny Qwen2s repeat one)
    q = [task_records[0].question]
    ids, mask = lm.encode_questions(q)
    free = lm.generate(ids, mask, 2, max_new_tokens=6)
    assert int(free.mask[0].sum()) == 6 and lm.stop_ids == []  # (runs on: no EOS in 6 tokens)
    answer = free.tokens[0].tolist()
    j = next(j for j in range(1, 6) if answer[j] not in answer[:j])  # (a token the answer has not written before)
    turn_end = answer[j]
    lm.model.generation_config.eos_token_id = [lm.eos_id, turn_end, 10**9]  # (an id past the vocabulary: left out)
    lm.stop_ids = end_of_turn_ids(lm.model, lm.eos_id)
    assert lm.stop_ids == [turn_end]
    for static in (False, True):
        gen = lm.generate(ids, mask, 2, max_new_tokens=6, static_cache=static)
        assert gen.tokens[0].tolist() == answer[: j + 1] and gen.mask[0].tolist() == [1] * (j + 1)
    assert recompute_generate(lm, q[0], 2, 6) == answer[: j + 1]
    lm.model.generation_config.eos_token_id = turn_end  # (an id alone)
    assert end_of_turn_ids(lm.model, lm.eos_id) == [turn_end]
    lm.model.generation_config.eos_token_id = None
    assert end_of_turn_ids(lm.model, lm.eos_id) == []


@pytest.mark.parametrize("arch", ARCHS)
def test_the_cache_goes_by_the_keyword_the_installed_transformers_takes(tokenizer, task_records, arch):
    """transformers 5.24 renamed ``past_key_values`` to ``cache`` (the old name warns, and goes in 5.40): no
    forward of ours (prefill, latents, decoding, over either cache) may warn about it."""
    lm = make_lm(tokenizer, arch).eval()
    ids, mask = lm.encode_questions([r.question for r in task_records[:2]])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for static in (False, True):
            lm.generate(ids, mask, 2, max_new_tokens=3, static_cache=static)
    assert not [w for w in caught if "past_key_values" in str(w.message)], [str(w.message) for w in caught]
    params = inspect.signature(type(lm.base).forward).parameters
    assert cache_keyword(type(lm.base)) in params


def test_generation_stops_at_eos_per_row(tokenizer, task_records):
    lm = make_lm(tokenizer, "qwen2").eval()
    with torch.no_grad():
        lm.model.lm_head.weight.zero_()  # tied: all logits 0 ...
    # ... except EOS gets a bias via the embedding of the last hidden state: make EOS always argmax
    lm.model.get_output_embeddings().register_forward_hook(
        lambda m, i, o: o.index_fill(-1, torch.tensor([lm.eos_id]), 1.0)
    )
    ids, mask = lm.encode_questions([r.question for r in task_records[:3]])
    gen = lm.generate(ids, mask, 2, max_new_tokens=5)
    assert gen.tokens.shape[1] == 1 and (gen.tokens[:, 0] == lm.eos_id).all() and gen.mask.sum() == 3


def test_sampling_is_seeded_and_top_p_restricts(tokenizer, task_records):
    lm = make_lm(tokenizer, "qwen2").eval()
    ids, mask = lm.encode_questions([r.question for r in task_records[:4]])
    a = lm.generate(ids, mask, 2, max_new_tokens=6, temperature=1.0, generator=torch.Generator().manual_seed(1))
    b = lm.generate(ids, mask, 2, max_new_tokens=6, temperature=1.0, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a.tokens, b.tokens)
    g = lm.generate(ids, mask, 2, max_new_tokens=6)
    n = lm.generate(
        ids, mask, 2, max_new_tokens=6, temperature=1.0, top_p=1e-6, generator=torch.Generator().manual_seed(3)
    )
    assert torch.equal(g.tokens, n.tokens)  # nucleus of mass ~0 keeps only the argmax


def test_inverse_cdf_sampling_by_hand():
    """Cumulative masses 0.2 | 0.7 | 1.0: u picks the token whose share holds it; a token without mass is never
    picked, at u = 0 or where rounding puts u x total at the total; nucleus sampling with given draws."""
    from dgrpo.model.decoding import inverse_cdf, sample_next

    w = torch.tensor([[0.2, 0.5, 0.3]]).expand(6, 3)
    u = torch.tensor([0.0, 0.1999, 0.2, 0.69, 0.7, 0.99999994])
    assert inverse_cdf(w, u).tolist() == [0, 0, 1, 1, 2, 2]
    holes = torch.tensor([[0.0, 0.4, 0.0, 0.6, 0.0]]).expand(4, 5)
    assert inverse_cdf(holes, torch.tensor([0.0, 0.39, 0.4, 1.0])).tolist() == [1, 1, 3, 3]
    # top_p 0.6 keeps the two most likely tokens (0.5 and 0.3; mass before each < 0.6): shares 0.625 | 0.375
    logits = torch.tensor([[0.2, 0.5, 0.3]]).log().expand(3, 3)
    picked = sample_next(logits, 1.0, 0.6, None, torch.tensor([0.0, 0.62, 0.63]))
    assert picked.tolist() == [1, 1, 2]


def test_a_row_samples_the_same_answer_in_any_batch(tokenizer, task_records):
    """With each row's own draws (``uniforms``), a row's sampled answer does not depend on the rows beside it."""
    from dgrpo.perturbation.base import row_sampling_uniforms

    lm = make_lm(tokenizer, "qwen2").eval()
    ids, mask = lm.encode_questions([r.question for r in task_records[:6]])
    u = row_sampling_uniforms(torch.arange(6) + 100, 10)
    assert torch.equal(u[2:4], row_sampling_uniforms(torch.tensor([102, 103]), 10))
    both = lm.generate(ids, mask, 2, max_new_tokens=10, temperature=1.0, uniforms=u)
    for part in ([0, 1, 2], [3, 4, 5], [4]):
        alone = lm.generate(ids[part], mask[part], 2, max_new_tokens=10, temperature=1.0, uniforms=u[part])
        n = alone.tokens.shape[1]
        assert torch.equal(alone.tokens, both.tokens[part, :n]) and not both.mask[part, n:].any()
    other = lm.generate(
        ids, mask, 2, max_new_tokens=10, temperature=1.0, uniforms=row_sampling_uniforms(torch.arange(6), 10)
    )
    assert lm.decode(other.tokens, other.mask) != lm.decode(both.tokens, both.mask)  # other seeds, other answers


def test_sampled_evaluation_does_not_depend_on_the_batch_size(tokenizer, task_records):
    """``eval.temperature`` > 0: each question draws from its own seed (from the eval seed and its text), so the
    answers are the same in batches of 64 or of 3 (sorted by length, so the batches group other questions) and
    in another order."""
    from dgrpo.eval.evaluate import generate_answers

    lm = make_lm(tokenizer, "qwen2").eval()
    qs = [r.question for r in task_records[:10]]
    kw = dict(n_latent=2, max_new_tokens=10, temperature=1.0, progress=False)
    wide = generate_answers(lm, qs, batch_size=64, **kw)
    assert generate_answers(lm, qs, batch_size=3, **kw) == wide
    assert generate_answers(lm, qs[::-1], batch_size=4, **kw) == wide[::-1]
    assert generate_answers(lm, qs, batch_size=64, seed=1, **kw) != wide


@pytest.mark.parametrize("kind", ["locked", "native"])
def test_perturbed_evaluation_applies_each_questions_own_mask(tokenizer, task_records, kind):
    """``generate_answers(perturbation=, perturbation_seeds=)``: the perturbation is applied (the answers differ
    from the deterministic network's), each question under its own seed's mask whatever the batch (one at a time,
    in batches of 3, reversed); a wrong contract is refused in one line."""
    from dgrpo.eval.evaluate import generate_answers
    from dgrpo.perturbation import LockedDropout, NativeDropout, seeds_for

    lm = make_lm(tokenizer, "qwen2").eval()
    qs = [r.question for r in task_records[: 12 if kind == "locked" else 6]]  # (native: one row at a time)
    pert = LockedDropout(p=0.5) if kind == "locked" else NativeDropout(p=0.5)
    seeds = seeds_for(0, 0, 0, len(qs))
    kw = dict(n_latent=2, max_new_tokens=8, progress=False)
    plain = generate_answers(lm, qs, **kw)
    wide = generate_answers(lm, qs, perturbation=pert, perturbation_seeds=seeds, **kw)
    assert sum(a != b for a, b in zip(plain, wide)) >= 2
    assert generate_answers(lm, qs, batch_size=3, perturbation=pert, perturbation_seeds=seeds, **kw) == wide
    assert generate_answers(lm, qs[::-1], perturbation=pert, perturbation_seeds=seeds.flip(0), **kw) == wide[::-1]
    one = [
        generate_answers(lm, [q], perturbation=pert, perturbation_seeds=seeds[i : i + 1], **kw)[0]
        for i, q in enumerate(qs[:4])
    ]
    assert one == wide[:4]
    with pytest.raises(ValueError, match="needs perturbation_seeds"):
        generate_answers(lm, qs, perturbation=pert, **kw)
    with pytest.raises(ValueError, match=f"{len(qs) - 1} perturbation_seeds for {len(qs)} questions"):
        generate_answers(lm, qs, perturbation=pert, perturbation_seeds=seeds[:-1], **kw)
    with pytest.raises(TypeError, match="perturbation seeds must be integers"):  # (cast silently, other masks)
        generate_answers(lm, qs, perturbation=pert, perturbation_seeds=seeds.double(), **kw)
    with pytest.raises(TypeError, match="unbound"):
        generate_answers(lm, qs, perturbation=pert.bind(lm, seeds[:1]), perturbation_seeds=seeds, **kw)


def test_special_tokens_added_and_initialised_to_mean(tokenizer):
    from conftest import make_lm as mk

    lm = mk(tokenizer, "llama")
    w = lm.model.get_input_embeddings().weight
    n_old = w.shape[0] - 3
    for t in (lm.start_id, lm.latent_id, lm.end_id):
        assert t >= n_old
        assert torch.allclose(w[t], w[:n_old].mean(0), atol=1e-6)
    # a padded vocabulary (Qwen2.5: more rows than tokens): the markers take unused rows, set to the tokens' mean
    import copy

    from dgrpo.model.latent_lm import LatentLM
    from dgrpo.model.tiny import build_tiny_model

    tok = copy.deepcopy(tokenizer)
    n_tok = len(tok)
    model = build_tiny_model("qwen2", n_tok + 40, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64)
    with torch.no_grad():
        model.get_input_embeddings().weight[n_tok:] = 0.0  # the unused rows, as a padded checkpoint may hold them
    lm = LatentLM(model, tok)
    w = lm.model.get_input_embeddings().weight
    assert w.shape[0] == n_tok + 40 and sorted((lm.start_id, lm.latent_id, lm.end_id)) == [n_tok, n_tok + 1, n_tok + 2]
    assert torch.allclose(w[[lm.start_id, lm.latent_id, lm.end_id]], w[:n_tok].mean(0).expand(3, -1), atol=1e-6)
    assert float(w[:n_tok].detach().mean(0).norm()) > 0 and bool((w[n_tok + 3 :] == 0).all())  # (they were all zero)
    # a tokenizer saved with the markers, its model without their rows: the rows added are set to the mean too, and
    # the markers reported untrained (they kept the resize's random rows, as ordinary tokens' in norm)
    tok = copy.deepcopy(tokenizer)
    model = build_tiny_model("qwen2", n_tok, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64)
    tok.add_tokens(["<|start-latent|>", "<|latent|>", "<|end-latent|>"], special_tokens=True)
    lm = LatentLM(model, tok)
    w = lm.model.get_input_embeddings().weight
    assert w.shape[0] == n_tok + 3 and lm.new_latent_tokens == ["<|start-latent|>", "<|latent|>", "<|end-latent|>"]
    assert torch.allclose(w[[lm.start_id, lm.latent_id, lm.end_id]], w[:n_tok].mean(0).expand(3, -1), atol=1e-6)


def test_a_tokenizer_with_more_tokens_than_the_model_has_rows_is_warned_about(tokenizer):
    """Another model's tokenizer (300 tokens for a model of 200 rows) was resized over without a word: the ids past
    the model's rows got random rows, and text using them reached the model as noise."""
    import copy
    import warnings

    from dgrpo.model.latent_lm import LatentLM
    from dgrpo.model.tiny import build_tiny_model

    tok, n_tok = copy.deepcopy(tokenizer), len(tokenizer)
    model = build_tiny_model("llama", n_tok - 7, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64)
    with pytest.warns(
        UserWarning, match=f"the tokenizer has 7 token\\(s\\) beyond the model's {n_tok - 7} embedding rows"
    ):
        LatentLM(model, tok)
    with warnings.catch_warnings():  # (a padded vocabulary, and the model's own markers: no warning)
        warnings.simplefilter("error")
        lm = LatentLM(build_tiny_model("llama", n_tok + 8, hidden_size=32, num_layers=2, num_heads=4), tok)
        LatentLM(lm.model, lm.tokenizer)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])  # an untied head, a tied one
def test_model_latent_token_init_coconut_copies_the_rows_of_double_angle(tokenizer, arch, monkeypatch):
    """Coconut's run.py starts each new latent marker at the row of ``<<``, in the embedding and the head
    (``model.latent_token_init: coconut``); the default is the mean of the existing rows."""
    import copy

    from dgrpo.config import Config, load_config
    from dgrpo.model import tokens
    from dgrpo.model.factory import load_model
    from dgrpo.model.latent_lm import LatentLM
    from dgrpo.model.tiny import build_tiny_model

    tok = copy.deepcopy(tokenizer)
    src = tok.get_vocab()["<<"]
    model = build_tiny_model(arch, len(tok), hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64)
    lm = LatentLM(model, tok, latent_token_init="coconut")
    markers = [lm.start_id, lm.latent_id, lm.end_id]
    for w in (lm.model.get_input_embeddings().weight, lm.model.get_output_embeddings().weight):
        assert torch.equal(w[markers], w[src].expand(3, -1)) and not torch.equal(w[src], w[: src + 1].mean(0))
    cfg = load_config(Config, "tiny.yaml", ["model.latent_token_init=coconut"])
    built = load_model(cfg.model, cfg.task, seed=0)  # the built-in model, through the config
    w = built.model.get_input_embeddings().weight
    assert torch.equal(w[built.latent_id], w[built.tokenizer.get_vocab()["<<"]])
    monkeypatch.setattr(tokens, "COCONUT_INIT_TOKEN", "@@ no such token @@")
    model = build_tiny_model(arch, len(tok), hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64)
    with pytest.warns(UserWarning, match="latent_token_init=coconut: the tokenizer has no '@@ no such token @@'"):
        lm = LatentLM(model, copy.deepcopy(tokenizer), latent_token_init="coconut")
    w = lm.model.get_input_embeddings().weight
    assert torch.allclose(w[lm.latent_id], w[: lm.start_id].mean(0), atol=1e-6)
    with pytest.raises(ValueError, match="latent_token_init must be mean or coconut, got 'copy'"):
        LatentLM(model, copy.deepcopy(tokenizer), latent_token_init="copy")


def test_a_save_prints_no_per_file_progress_bar_and_leaves_the_setting_as_it_was(tokenizer, tmp_path, capfd):
    """A Python training run printed Hugging Face's "Writing model shards" bar at every checkpoint."""
    from huggingface_hub import utils as hub_utils
    from transformers.utils import logging as hf_logging

    lm, was_on = make_lm(tokenizer), hf_logging.is_progress_bar_enabled()  # (a CLI test in this process: off)
    hub_was_off = hub_utils.are_progress_bars_disabled()
    try:
        hf_logging.enable_progress_bar()
        lm.save_pretrained(tmp_path / "m")
        assert "Writing model shards" not in capfd.readouterr().err and hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()
        lm.save_pretrained(tmp_path / "m2")
        assert not hf_logging.is_progress_bar_enabled()  # (off before: still off)
        hf_logging.enable_progress_bar()
        hub_utils.disable_progress_bars()  # only huggingface_hub's off: still off after (review: it was switched on)
        lm.save_pretrained(tmp_path / "m3")
        assert hub_utils.are_progress_bars_disabled() and hf_logging.is_progress_bar_enabled()
        hub_utils.enable_progress_bars()
        hub_utils.disable_progress_bars("huggingface_hub.http_get")  # one group off: still off after (review 2)
        lm.save_pretrained(tmp_path / "m4")
        assert hub_utils.are_progress_bars_disabled("huggingface_hub.http_get")
        assert not hub_utils.are_progress_bars_disabled()
    finally:
        (hf_logging.enable_progress_bar if was_on else hf_logging.disable_progress_bar)()
        (hub_utils.disable_progress_bars if hub_was_off else hub_utils.enable_progress_bars)()


def test_save_and_reload_roundtrip(tokenizer, task_records, tmp_path):
    from transformers import AutoModelForCausalLM

    from dgrpo.model.latent_lm import LatentLM, LatentSettings

    lm = make_lm(tokenizer, "gpt2").eval()
    lm.settings = LatentSettings(mode="coconut", c_thought=2, stage=3, n_latent=6)
    lm.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    lm2 = LatentLM.from_pretrained(tmp_path).eval()
    assert lm2.settings == lm.settings
    ids, mask = lm.encode_questions([task_records[0].question])
    assert torch.equal(lm.generate(ids, mask, 3).tokens, lm2.generate(ids, mask, 3).tokens)
    plain = AutoModelForCausalLM.from_pretrained(tmp_path)  # loadable by plain transformers
    assert plain.config.vocab_size == lm.model.config.vocab_size


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_a_model_cast_to_bf16_computes_what_its_checkpoint_reloads(tokenizer, task_records, tmp_path, arch):
    """A model cast with ``.to(torch.bfloat16)`` (the built-in model of a bf16 run) rounded its rotary frequencies to
    bf16, while ``from_pretrained`` keeps them float32: its saved checkpoint, reloaded, scored other log-probs
    (1e-3 apart) and decoded other greedy answers than the model that was saved."""
    from dgrpo.model.latent_lm import LatentLM

    lm = make_lm(tokenizer, arch, seed=1).to(torch.bfloat16).eval()
    lm.save_pretrained(tmp_path)
    again = LatentLM.from_pretrained(tmp_path)
    assert next(again.parameters()).dtype == torch.bfloat16
    ids, mask, tg, tm = batch(lm, task_records)
    with torch.no_grad():
        scored = [m.target_logprobs(ids, mask, 3, tg, tm)[0] for m in (lm, again)]
        greedy = [m.generate(ids, mask, 3, max_new_tokens=12).tokens for m in (lm, again)]
    assert torch.equal(*scored) and torch.equal(*greedy)
    # a cast back and forth keeps the float32 frequencies, exactly
    fresh = make_lm(tokenizer, arch, seed=1).model.model.rotary_emb.inv_freq
    assert torch.equal(lm.to(torch.float32).to(torch.bfloat16).model.model.rotary_emb.inv_freq, fresh)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_a_model_cast_before_it_is_wrapped_computes_what_its_checkpoint_reloads(tokenizer, task_records, arch):
    """``LatentLM(model.to(torch.bfloat16), tokenizer)``: the model came cast, its rotary frequencies rounded to bf16
    (what ``LatentLM.to`` now keeps float32), and scored other log-probs (1e-3 apart) than the same weights wrapped
    first and cast after, or reloaded from its checkpoint. The wrapper recomputes them in float32: the same
    frequencies as a fresh model's, the same log-probs and greedy answers, bit for bit."""
    import copy

    from dgrpo.model.latent_lm import LatentLM

    first = make_lm(tokenizer, arch, seed=1).eval()
    cast_after = copy.deepcopy(first).to(torch.bfloat16)
    cast_before = LatentLM(copy.deepcopy(first.model).to(torch.bfloat16), copy.deepcopy(first.tokenizer))
    fresh = first.model.model.rotary_emb
    for name in ("inv_freq", "original_inv_freq"):
        assert torch.equal(getattr(cast_before.model.model.rotary_emb, name), getattr(fresh, name))
    ids, mask, tg, tm = batch(first, task_records)
    with torch.no_grad():
        scored = [m.target_logprobs(ids, mask, 3, tg, tm)[0] for m in (cast_after, cast_before)]
        greedy = [m.generate(ids, mask, 3, max_new_tokens=12).tokens for m in (cast_after, cast_before)]
    assert torch.equal(*scored) and torch.equal(*greedy)


def test_a_model_with_frequencies_per_layer_type_cast_before_it_is_wrapped_computes_what_its_checkpoint_reloads(
    tokenizer, task_records, tmp_path
):
    """Gemma 3 (OLMo 3, Gemma 4, ...) keeps its rotary frequencies per layer type (``sliding_attention_inv_freq``,
    ``full_attention_inv_freq``): a model cast to bf16 before LatentLM wrapped it kept them rounded to bf16 (only
    ``inv_freq`` was recomputed), and scored log-probs 3e-3 apart from its saved checkpoint, reloaded. Each layer
    type's frequencies are recomputed in float32, as a fresh model's."""
    import copy

    from transformers import AutoModelForCausalLM, Gemma3TextConfig

    from dgrpo.model.latent_lm import LatentLM

    types = ["sliding_attention", "full_attention"]
    cfg = Gemma3TextConfig(
        **{"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4},
        **{"num_key_value_heads": 2, "head_dim": 8, "vocab_size": len(tokenizer) + 3, "layer_types": types},
        **{"max_position_embeddings": 256, "sliding_window": 16, "pad_token_id": 0, "eos_token_id": 1},
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(cfg)
    fresh = {name: buf.clone() for name, buf in model.named_buffers() if name.endswith("inv_freq")}
    assert sorted(fresh) == [f"model.rotary_emb.{t}_{o}inv_freq" for t in sorted(types) for o in ("", "original_")]
    lm = LatentLM(model.to(torch.bfloat16), copy.deepcopy(tokenizer)).eval()
    for name, buf in lm.model.named_buffers():
        if name.endswith("inv_freq"):
            assert buf.dtype == torch.float32 and torch.equal(buf, fresh[name]), name
    lm.save_pretrained(tmp_path)
    again = LatentLM.from_pretrained(tmp_path).eval()
    assert next(again.parameters()).dtype == torch.bfloat16
    ids, mask, tg, tm = batch(lm, task_records)
    with torch.no_grad():
        scored = [m.target_logprobs(ids, mask, 3, tg, tm)[0] for m in (lm, again)]
    assert torch.equal(*scored)


def test_chunked_logprob_scoring_matches_one_shot(tokenizer, task_records, monkeypatch):
    """Scoring in checkpointed position chunks (for large vocabularies) gives the same values and gradients."""
    import dgrpo.model.decoding as decoding

    lm = make_lm(tokenizer, "qwen2")
    ids, mask, tg, tm = batch(lm, task_records)
    calls = []
    inner = decoding._chunk_logprobs
    counted = lambda head, h, *a: calls.append(h.shape[1]) or inner(head, h, *a)  # noqa: E731
    monkeypatch.setattr(decoding, "_chunk_logprobs", counted)
    res, n_calls = [], []
    for chunk in (1 << 26, 4 * len(lm.tokenizer)):  # one shot; then ~1 position per chunk
        lm.zero_grad()
        calls.clear()
        lm.logit_chunk_elems = chunk
        lp, ent = lm.target_logprobs(ids, mask, 2, tg, tm, with_entropy=True)
        (-(lp * tm).sum()).backward()
        n_calls.append(len(calls))
        res.append((lp.detach(), ent.detach(), lm.model.get_input_embeddings().weight.grad.clone()))
    # one shot: one call; chunked: one call per chunk of positions, and again for each in backward
    assert n_calls[0] == 1 and n_calls[1] >= tg.shape[1], n_calls
    assert torch.allclose(res[0][0], res[1][0], atol=1e-6) and torch.allclose(res[0][1], res[1][1], atol=1e-6)
    assert torch.allclose(res[0][2], res[1][2], atol=1e-5, rtol=1e-5), (res[0][2] - res[1][2]).abs().max()


@pytest.mark.parametrize("recompute", [False, "layer"])
@pytest.mark.parametrize("arch", ARCHS)
def test_end_marker_in_the_answer_call_gives_the_same_logprobs_and_gradients(tokenizer, task_records, arch, recompute):
    """``end_with_targets`` (the fast engine's update and reference): <|end-latent|> runs in the answer's forward call,
    one call fewer, with the same log-probs and gradients (fp32, 1e-5) under locked dropout, with and without
    recomputation."""
    from dgrpo.config import PerturbationConfig
    from dgrpo.perturbation import make_perturbation

    lm = make_lm(tokenizer, arch).eval()
    lm.recompute = recompute
    ids, mask, tg, tm = batch(lm, task_records)
    pert = make_perturbation(PerturbationConfig(kind="locked", p=0.3, sites=["attn", "mlp"]))
    out = []
    for merged in (False, True):
        lm.model.zero_grad(set_to_none=True)
        calls: list[int] = []
        handle = lm.base.register_forward_pre_hook(lambda *a, seen=calls: seen.append(1))
        with pert.bind(lm, torch.arange(4)) as pb:
            lp, _ = lm.target_logprobs(ids, mask, 3, tg, tm, perturbation=pb, end_with_targets=merged)
        handle.remove()
        (-(lp * tm).sum()).backward()
        out.append((lp.detach(), {n: p.grad.clone() for n, p in lm.model.named_parameters()}, len(calls)))
    (lp_a, g_a, n_a), (lp_b, g_b, n_b) = out
    assert n_b == n_a - 1 == 1 + 3 + 1  # the prompt, 3 latent steps, then one call for the marker and the answer
    assert torch.allclose(lp_a, lp_b, atol=1e-5, rtol=0), (lp_a - lp_b).abs().max()
    # (gradients within 1e-5 of their size too: one call fewer sums them in another order, and on one thread the
    # largest, ~56 in Llama's case, moved by 1.5e-5, four of its last bits)
    bad = [k for k in g_a if not torch.allclose(g_a[k], g_b[k], atol=1e-5, rtol=1e-5)]
    assert not bad, {k: float((g_a[k] - g_b[k]).abs().max()) for k in bad}


@pytest.mark.parametrize("arch", ARCHS)
def test_the_prebuilt_mask_is_hugging_faces_mask(tokenizer, task_records, arch):
    """For a padded batch the 4-d mask built on the device is the one Hugging Face builds from the 2-d padding mask,
    for a prompt call, a one-position latent step and a several-position call on a cache."""
    from transformers import DynamicCache
    from transformers.masking_utils import create_causal_mask

    from dgrpo.model.attention_mask import causal_padding_mask, prebuilt_mask_applies

    lm = make_lm(tokenizer, arch)
    assert prebuilt_mask_applies(lm.model.config)
    ids, mask, _, _ = batch(lm, task_records)
    assert not bool(mask.all())  # padded: Hugging Face builds a mask rather than using is_causal
    for past, q_len in ((0, ids.shape[1]), (ids.shape[1], 1), (ids.shape[1], 5)):
        cache = DynamicCache(config=lm.model.config)
        if past:  # a cache that holds ``past`` positions
            with torch.no_grad():
                lm.base(input_ids=ids, attention_mask=mask, use_cache=True, **{cache_keyword(type(lm.base)): cache})
        full = torch.cat([mask, torch.ones(mask.shape[0], past + q_len - mask.shape[1], dtype=mask.dtype)], 1)
        emb = torch.zeros(mask.shape[0], q_len, lm.model.config.hidden_size)
        theirs = create_causal_mask(lm.model.config, emb, full, cache, position_ids=None)
        assert torch.equal(causal_padding_mask(full, q_len), theirs), (arch, past, q_len)


@pytest.mark.parametrize("ragged", [True, False])
@pytest.mark.parametrize("arch", ARCHS)
def test_the_prebuilt_mask_gives_hugging_faces_logprobs_and_gradients(
    tokenizer, task_records, arch, ragged, monkeypatch
):
    """The recurrence with the device-built mask and with Hugging Face's mask builder: the same log-probs and
    gradients (bit for bit with padding, where both pass SDPA the same mask; 1e-5 without, where Hugging Face passes
    is_causal instead)."""
    import dgrpo.model.latent_lm as latent_lm

    lm = make_lm(tokenizer, arch)
    ids, mask, tg, tm = batch(lm, task_records, ragged=ragged)
    out = []
    for prebuilt in (True, False):
        monkeypatch.setattr(latent_lm, "prebuilt_mask_applies", lambda config, on=prebuilt: on)
        lm.model.zero_grad(set_to_none=True)
        lp, _ = lm.target_logprobs(ids, mask, 3, tg, tm)
        (-(lp * tm).sum()).backward()
        out.append((lp.detach(), [p.grad.clone() for p in lm.model.parameters() if p.grad is not None]))
    (lp_a, g_a), (lp_b, g_b) = out
    if ragged:
        assert torch.equal(lp_a, lp_b) and all(torch.equal(a, b) for a, b in zip(g_a, g_b))
    else:
        assert torch.allclose(lp_a, lp_b, atol=1e-5, rtol=0)
        assert max(float((a - b).abs().max()) for a, b in zip(g_a, g_b)) <= 1e-5


def test_the_additive_mask_gives_sdpa_the_boolean_masks_results_bit_for_bit():
    """SDPA turns a boolean mask into 0 / -inf in the queries' dtype; the additive mask built once is that, so the
    attention is the same bit for bit, a row with nothing to attend included (SDPA gives it zeros either way)."""
    import torch.nn.functional as F

    from dgrpo.model.attention_mask import additive_mask

    torch.manual_seed(0)
    mask = torch.rand(3, 1, 4, 5) > 0.4
    mask[0, 0, 1] = False
    for dtype in (torch.float32, torch.bfloat16):
        add = additive_mask(mask, dtype)
        assert add.dtype == dtype and torch.equal(add == 0, mask) and bool((add[~mask] == float("-inf")).all())
        q, k, v = (torch.randn(3, 2, n, 8, dtype=dtype, requires_grad=True) for n in (4, 5, 5))
        out = []
        for m in (mask, add):
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
            out.append((o.detach(), *torch.autograd.grad(o.square().sum(), (q, k, v))))
        assert all(torch.equal(a, b) for a, b in zip(*out)), dtype
        assert not out[0][0][0, 0, 1].any()


@pytest.mark.parametrize("engine", ["eager", "fixed-shape", "eager-autocast"])
def test_sdpa_gets_a_mask_it_need_not_convert_in_every_layer(tokenizer, task_records, engine):
    """A cached forward call hands every layer's SDPA one additive mask, built once in the queries' dtype: no layer
    converts a boolean mask (a select and two fills per layer, each a kernel on a GPU) or casts the mask (what autocast
    does to a mask of the weights' dtype in a bf16 block), in the update's replay over a growing cache, in the fast
    engine's one-position step over a static cache and under autocast alike."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from dgrpo.model.fixed_shape import FixedShapeDecoder

    class Ops(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.names: list[str] = []
            self.mask_dtypes: list[torch.dtype] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if name == "_to_copy" and args[0].dim() == 4 and args[0].shape[1] == 1:
                name = "a cast of a mask"
            if "scaled_dot_product" in name:
                self.mask_dtypes.append((kwargs or {}).get("attn_mask", args[3] if len(args) > 3 else None).dtype)
            self.names.append(name)
            return func(*args, **(kwargs or {}))

    lm = make_lm(tokenizer, "qwen2")
    ids, mask, tg, tm = batch(lm, task_records)
    dtype = torch.bfloat16 if engine == "eager-autocast" else torch.float32
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=engine == "eager-autocast")
    with torch.no_grad(), autocast:
        if engine == "fixed-shape":
            dec = FixedShapeDecoder(lm, ids.shape[0], ids.shape[1] + 8, capture=False)
            dec.start(ids, mask, None)
            run = lambda: dec._forward("latent")  # noqa: E731
        else:
            run = lambda: lm.target_logprobs(ids, mask, 2, tg, tm)  # noqa: E731
        with Ops() as ops:
            run()
    assert len(ops.mask_dtypes) >= lm.model.config.num_hidden_layers and set(ops.mask_dtypes) == {dtype}
    unwanted = {"where", "scalar_tensor", "a cast of a mask"} & set(ops.names)
    assert not unwanted, unwanted


@pytest.mark.parametrize("recompute", [False, "call", "layer"])
def test_the_replay_forward_and_backward_make_the_host_wait_for_nothing(tokenizer, task_records, recompute):
    """Scoring answers through the latent chain under locked dropout, forward and backward, on a padded batch, runs
    no op that would make the host wait for a GPU (a value read back, a data-dependent size): the update's forward
    calls can run ahead of the device, and could be captured as graphs."""
    from dgrpo.bench.step_profile import waiting_ops
    from dgrpo.config import PerturbationConfig
    from dgrpo.perturbation import make_perturbation

    lm = make_lm(tokenizer, "qwen2")
    lm.recompute = recompute
    ids, mask, tg, tm = batch(lm, task_records)
    pert = make_perturbation(PerturbationConfig(kind="locked", p=0.3, sites=["attn", "mlp"]))
    with pert.bind(lm, torch.arange(4)) as pb:

        def replay() -> None:
            lp, _ = lm.target_logprobs(ids, mask, 3, tg, tm, perturbation=pb, end_with_targets=True)
            (-(lp * tm).sum()).backward()

        found = waiting_ops(replay)
    assert found["waiting_ops"] == 0, found["waiting_op_sites"]
    # the audit does see such ops: the same call through Hugging Face's mask builder reads the padding back
    import dgrpo.model.latent_lm as latent_lm

    with pert.bind(lm, torch.arange(4)) as pb, pytest.MonkeyPatch.context() as mp:
        mp.setattr(latent_lm, "prebuilt_mask_applies", lambda config: False)
        found = waiting_ops(lambda: lm.target_logprobs(ids, mask, 3, tg, tm, perturbation=pb, end_with_targets=True))
    assert found["waiting_ops"] >= 5 and all("masking_utils" in s for s in found["waiting_op_sites"]), found


def test_questions_encode_left_padded_and_each_distinct_one_is_tokenized_once(tokenizer, task_records):
    """A GRPO step encodes K copies of each prompt: one tokenizer call over the distinct questions, the same rows as
    encoding them one by one (left padding, the marker last, questions cut from the left at ``max_tokens``)."""
    lm = make_lm(tokenizer, "qwen2")
    qs = [task_records[0].question, task_records[1].question[:20]]
    alone = [lm.encode_questions([q], max_tokens=12) for q in qs]
    calls = []
    real = type(lm.tokenizer).__call__
    type(lm.tokenizer).__call__ = lambda self, *a, **k: calls.append(a[0]) or real(self, *a, **k)
    try:
        ids, mask = lm.encode_questions([qs[0], qs[1], qs[0], qs[1], qs[0]], max_tokens=12)
    finally:
        type(lm.tokenizer).__call__ = real
    assert len(calls) == 1 and len(calls[0]) == 2  # (each distinct question once)
    for row, q in enumerate([0, 1, 0, 1, 0]):
        a_ids, a_mask = alone[q]
        n = int(a_mask.sum())
        assert ids[row, -n:].tolist() == a_ids[0, -n:].tolist() and ids[row, -1] == lm.start_id
        assert mask[row].tolist() == [0] * (ids.shape[1] - n) + [1] * n
        assert (ids[row, : ids.shape[1] - n] == lm.pad_id).all()


def test_a_question_cut_under_a_chat_template_keeps_the_template_whole(tokenizer, task_records):
    """``max_tokens`` cuts the question, not the chat template around it: the cut kept the templated text's last
    tokens, so a long question lost the template's opening (its BOS, system prompt and user turn's header) and the
    model saw a malformed chat. A question within the limit is encoded as before."""
    lm = make_lm(tokenizer, "qwen2")
    lm.tokenizer.chat_template = "<s>{% for m in messages %}USER: {{ m['content'] }}\n{% endfor %}ASSISTANT:"
    lm.settings.chat_template = True
    long_q, short_q = task_records[0].question, task_records[1].question[:8]
    cut = lm.token_ids([long_q])[0][-6:]
    ids, mask = lm.encode_questions([long_q, short_q], max_tokens=6)
    rows = [row[m.bool()].tolist() for row, m in zip(ids, mask)]
    text = lm.tokenizer.decode(rows[0][:-1])
    assert text.startswith("<s>USER:") and text.endswith("\nASSISTANT:") and rows[0][-1] == lm.start_id
    assert text == lm.format_question(lm.tokenizer.decode(cut))  # (the question's last 6 tokens, in the template)
    assert rows[1] == lm.token_ids([lm.format_question(short_q)])[0] + [lm.start_id]  # (within the limit: as before)
    assert lm.count_cut_questions([long_q, short_q], 6) == 1


def test_head_logprobs_of_bf16_hidden_states_equal_those_from_fp32_logits():
    """The head's log-probs take log-softmax in fp32 straight from bf16 logits (one kernel on CUDA): the same
    values and gradients as casting the logits to fp32 first, with and without a temperature (in one chunk: chunks
    sum the head's weight gradient in another order)."""
    from dgrpo.model.decoding import head_logprobs

    torch.manual_seed(0)
    head = torch.nn.Linear(16, 50, bias=False).to(torch.bfloat16)
    hidden = torch.randn(3, 5, 16, dtype=torch.bfloat16, requires_grad=True)
    targets = torch.randint(0, 50, (3, 5))
    for temperature in (1.0, 0.7):
        lp, ent = head_logprobs(head, hidden, targets, temperature, True)
        g, gw = torch.autograd.grad(lp.sum(), (hidden, head.weight))
        logits = head(hidden).float() / temperature
        ref = logits.log_softmax(-1)
        ref_lp = ref.gather(-1, targets[..., None]).squeeze(-1)
        rg, rgw = torch.autograd.grad(ref_lp.sum(), (hidden, head.weight))
        assert lp.dtype == torch.float32 and torch.equal(lp, ref_lp)
        assert torch.allclose(ent, -(ref.exp() * ref).sum(-1), atol=1e-6)
        assert torch.equal(g, rg) and torch.equal(gw, rgw)


def test_greedy_token_choice_from_bf16_logits_books_what_their_fp32_copy_would():
    """``AnswerBook.choose`` at temperature 0 takes the argmax and the fp32 log-softmax of the logits as they come
    (bf16 on a GPU), not of a temperature-scaled fp32 copy: the same tokens (ties included), log-probs and
    entropies, bit for bit."""
    from types import SimpleNamespace

    from dgrpo.model.decoding import AnswerBook
    from dgrpo.model.head_stats import HeadStats

    torch.manual_seed(0)
    logits = (torch.randn(6, 300) * 4).to(torch.bfloat16)
    logits[2, 7] = logits[2, 9] = logits[2].max() + 1  # a tie: the first index wins either way
    lm = SimpleNamespace(device=torch.device("cpu"), pad_id=0, eos_id=5, stop_ids=[], head_stats=HeadStats())
    books = [AnswerBook(lm, 6, 2, None, with_entropy=True) for _ in range(2)]
    for book, x in zip(books, (logits, logits.float())):
        book.choose(0, x, 0.0, 1.0, None)
    (a, b), ties = books, books[0].tokens[2, 0]
    assert int(ties) == 7
    for name in ("tokens", "mask", "logprobs", "entropy", "alive"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name


def test_a_target_cut_at_max_tokens_keeps_no_eos(tokenizer):
    """A chain longer than data.max_target_tokens was cut and given an EOS: SFT taught the model to stop before its
    answer. Cut targets now end where they are cut; a target that fits ends in EOS."""
    lm = make_lm(tokenizer)
    full = lm.tokenizer("<<3+4=7>> <<7*2=4>> #### 4", add_special_tokens=False)["input_ids"]
    ids, mask = lm.encode_targets(["<<3+4=7>> <<7*2=4>> #### 4", "#### 4"], max_tokens=5)
    assert ids[0].tolist() == full[:5] and lm.eos_id not in ids[0].tolist()
    short = ids[1][mask[1].bool()].tolist()
    assert short[-1] == lm.eos_id and len(short) <= 5
    assert lm.encode_targets(["#### 4"], max_tokens=len(short))[0][0].tolist()[-1] == lm.eos_id  # (just fits)


def test_sft_warns_of_training_targets_cut_at_max_target_tokens(tokenizer, task_records):
    """The cut above was silent in SFT (only the questions' was warned of): a chain longer than data.max_target_tokens
    trained without its answer line. The run's start counts the targets of its first stage (the longest) that are cut
    (with uniform_prob, stage 0's), evenly spaced ones of a large set, and says nothing when all fit."""
    from dgrpo.training.curriculum import format_target
    from dgrpo.training.sft import _warn_if_targets_cut

    lm = make_lm(tokenizer)
    recs = [r for r in task_records if len(r.steps) >= 2][:8]

    def lengths(skip):
        return [len(ids) + 1 for ids in lm.token_ids([format_target(r.steps[skip:], r.answer) for r in recs])]

    limit = max(lengths(2))  # every target fits once two steps are latent, some do not before
    cut = sum(n > limit for n in lengths(0))
    assert cut > 0
    sets = {"data.max_target_tokens": limit, "sft.max_latent_stage": 9}
    with pytest.warns(UserWarning, match=rf"^{cut} of 8 training targets \(the steps still written at stage 0,"):
        _warn_if_targets_cut(lm, recs, tiny_config(**sets))
    long = next(r for r, n in zip(recs, lengths(0)) if n > limit)
    spaced = [long, recs[lengths(0).index(min(lengths(0)))]] * 4  # every other one checked: the long ones
    with pytest.warns(UserWarning, match=r"^4 of 4 training targets \(checked: 4, evenly spaced over 8\)"):
        _warn_if_targets_cut(lm, spaced, tiny_config(**sets), check_at_most=4)
    later = tiny_config(**sets, **{"sft.stage_epochs": "[0, 0]"})  # the run starts at stage 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _warn_if_targets_cut(lm, recs, later)
    with pytest.warns(UserWarning, match=rf"^{cut} of 8 .* stage 0,"):  # uniform_prob trains stage 0's targets too
        _warn_if_targets_cut(lm, recs, tiny_config(**sets, **{"sft.stage_epochs": "[0, 0]", "sft.uniform_prob": 0.5}))


def test_a_gathered_state_dict_saves_a_tied_weight_once(tokenizer, tmp_path):
    """save_pretrained(state_dict=...) with a copy under each name of a tied weight (what FSDP's gathered state is):
    the head is written once, as from the model itself, and the loaded model ties it again (the same logits)."""
    from safetensors import safe_open

    from dgrpo.model.latent_lm import LatentLM

    lm = make_lm(tokenizer, "qwen2")
    assert lm.model.config.tie_word_embeddings
    lm.save_pretrained(tmp_path / "copies", state_dict={k: v.clone() for k, v in lm.model.state_dict().items()})
    with safe_open(str(tmp_path / "copies" / "model.safetensors"), "pt") as f:
        assert "lm_head.weight" not in f.keys() and "model.embed_tokens.weight" in f.keys()
    back = LatentLM.from_pretrained(tmp_path / "copies")
    assert back.model.lm_head.weight is back.model.model.embed_tokens.weight
    ids = torch.tensor([[1, 2, 3]])
    assert torch.equal(back.model(ids).logits, lm.model(ids).logits)


def test_generate_refuses_prompts_not_encoded_as_encode_questions_writes_them(tokenizer, task_records):
    """A tokenizer's own output (no <|start-latent|>, or right-padded) decoded other answers without a word: the
    latents started from a pad position's hidden state, or without their opening marker."""
    lm = make_lm(tokenizer).eval()
    qs = [task_records[0].question[:20], task_records[1].question]
    ids, mask = lm.encode_questions(qs)
    lm.generate(ids, mask, 1, max_new_tokens=2)  # as encoded: fine
    lm.generate(*lm.encode_questions(qs, markers=False), 1, max_new_tokens=2, markers=False)
    tok = lm.tokenizer([q + "\n" for q in qs], return_tensors="pt", padding=True)
    with pytest.raises(ValueError, match="prompt row 0 does not end in <|start-latent|>.*lm.encode_questions"):
        lm.generate(tok["input_ids"], tok["attention_mask"], 1, max_new_tokens=2)
    right = torch.stack([torch.roll(r, int((m == 0).sum())) for r, m in zip(ids, mask)]), mask.flip(-1)
    with pytest.raises(ValueError, match=r"prompt row 0 has padding at its end \(right padding\)"):
        lm.generate(*right, 1, max_new_tokens=2)
    empty = mask.clone()
    empty[1] = 0
    with pytest.raises(ValueError, match=r"prompt row 1 has no token \(its mask is all zeros\)"):
        lm.generate(ids, empty, 1, max_new_tokens=2)


def test_misuses_of_the_constructor_and_generate_are_one_typed_line(tokenizer):
    """A path or no tokenizer given to LatentLM, lists given to generate: AttributeErrors from inside before."""
    from dgrpo.model.latent_lm import LatentLM

    lm = make_lm(tokenizer)
    with pytest.raises(TypeError, match=r"got str; load a checkpoint with LatentLM.from_pretrained\(path\)"):
        LatentLM("runs/sft/final", lm.tokenizer)
    with pytest.raises(TypeError, match="tokenizer must be the model's Hugging Face tokenizer, got NoneType"):
        LatentLM(lm.model, None)
    for path in (123, None):  # (Python's "expected str, bytes or os.PathLike object, not int", naming no call)
        with pytest.raises(
            TypeError, match=r"LatentLM.from_pretrained: path is a checkpoint directory or a hub id, got"
        ):
            LatentLM.from_pretrained(path)
    ids, mask = lm.encode_questions(["1 + 1 = ?"])
    with pytest.raises(TypeError, match=r"prompt ids must be a torch tensor, got list \(encode the questions with"):
        lm.generate(ids.tolist(), mask.tolist(), 1, max_new_tokens=2)


def test_generate_thinks_the_checkpoints_own_number_of_latents_unless_told(tokenizer, task_records):
    lm = make_lm(tokenizer, "qwen2").eval()
    ids, mask = lm.encode_questions([r.question for r in task_records[:3]])
    lm.settings.n_latent = 3
    with torch.no_grad():
        own = lm.generate(ids, mask, max_new_tokens=6)
        told = [lm.generate(ids, mask, n, max_new_tokens=6) for n in (3, 0)]
    assert torch.equal(own.tokens, told[0].tokens) and torch.equal(own.logprobs, told[0].logprobs)
    assert not torch.equal(own.logprobs, told[1].logprobs)  # 0 thoughts: another forward, other log-probs


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("num_heads", [1, 3, 4, 5, 9])
def test_a_tiny_model_of_any_head_count_runs_a_forward(arch, num_heads):
    """model.num_heads=5 (hidden_size=10: an even head size, as the config's check asks) took num_heads // 2 = 2
    key/value heads, which do not divide 5: the first SFT forward failed in attention with a traceback."""
    from dgrpo.model.tiny import build_tiny_model

    model = build_tiny_model(
        arch, 50, hidden_size=2 * num_heads, num_layers=1, num_heads=num_heads, intermediate_size=8
    )
    assert num_heads % model.config.num_key_value_heads == 0
    assert model.config.num_key_value_heads == {1: 1, 3: 1, 4: 2, 5: 1, 9: 3}[num_heads]
    assert model(torch.tensor([[1, 2, 3]])).logits.shape == (1, 3, 50)


def test_answer_book_samples_each_step_from_its_own_draw_at_the_temperature_and_pads_finished_rows():
    """``AnswerBook.choose`` by hand: probabilities 0.1 | 0.2 | 0.3 | 0.4 at temperature 0.5 are 1 | 4 | 9 | 16 over 30
    (cumulative 1/30 | 5/30 | 14/30 | 1); step i draws with column i of the rows' draws and books log pi(token) at
    that temperature and the entropy (a sum over the vocabulary). A row stops at EOS (0) or at an id of ``stop_ids``
    (2), booked, and from then on books pad, mask 0, log-prob 0 and entropy 0, whatever its later draws pick."""
    from types import SimpleNamespace

    from dgrpo.model.decoding import AnswerBook
    from dgrpo.model.head_stats import HeadStats

    lm = SimpleNamespace(device=torch.device("cpu"), pad_id=9, eos_id=0, stop_ids=[], head_stats=HeadStats())
    logits = torch.tensor([0.1, 0.2, 0.3, 0.4]).log().expand(2, 4)
    u = torch.tensor([[0.5, 0.01, 0.9], [0.2, 0.5, 0.01]])
    book = AnswerBook(lm, 2, 3, [2], with_entropy=True)
    for i in range(3):
        book.choose(i, logits, 0.5, 1.0, None, u)
    q = torch.tensor([1.0, 4.0, 9.0, 16.0]) / 30
    h = float(-(q * q.log()).sum())
    assert book.tokens.tolist() == [[3, 0, 9], [2, 9, 9]]  # (row 0: 0.5 -> 3, 0.01 -> EOS; row 1: 0.2 -> 2, a stop)
    assert book.mask.tolist() == [[1, 1, 0], [1, 0, 0]]
    expected = torch.tensor([[q[3].log(), q[0].log(), 0.0], [q[2].log(), 0.0, 0.0]])
    assert torch.allclose(book.logprobs, expected, atol=1e-6)
    assert book.entropy is not None
    assert torch.allclose(book.entropy, torch.tensor([[h, h, 0.0], [h, 0.0, 0.0]]), atol=1e-6)


@pytest.mark.parametrize(("top_p", "kept"), [(0.25, 1), (0.5, 2), (0.75, 3), (1.0, 4)])
def test_a_nucleus_keeps_the_tokens_whose_mass_before_them_is_below_top_p(top_p, kept):
    """Four equally likely tokens (0.25 each, exact in floating point): the nucleus keeps each token whose mass before
    it is strictly below top_p, so top_p = 0.5 keeps two, not three; draws over [0, 1) reach every kept token and no
    other. Temperature 0 is the argmax, whatever the draw."""
    from dgrpo.model.decoding import sample_next

    picked = sample_next(torch.zeros(20, 4), 1.0, top_p, None, torch.arange(20) / 20)
    assert len(set(picked.tolist())) == kept
    logits = torch.tensor([[0.0, 2.0, 1.0], [3.0, 2.0, 1.0]])
    assert sample_next(logits, 0.0, top_p, None, torch.tensor([0.99, 0.99])).tolist() == [1, 0]


def test_each_rollout_row_is_its_prompts_own_seeded_generation_and_gets_its_own_reward(tokenizer, task_records):
    """``collect_rollouts`` at temperature 0.5 under locked dropout, 3 prompts of 3 lengths x K = 2: row g * K + k
    holds prompt g and, decoded alone (under its own seed's mask and sampling draws), gives the same answer; its
    reward lands at rewards[g, k]. The replay scores every answer token (the longest answer's last one too) and gives
    the recorded log-probs at that temperature; the logged entropy is the mean over answer tokens of the replay's."""
    from dataclasses import replace

    from dgrpo.perturbation import LockedDropout, seeds_for
    from dgrpo.perturbation.base import row_sampling_uniforms
    from dgrpo.training.rollouts import collect_rollouts, replay_logprobs

    lm = make_lm(tokenizer, "qwen2").eval()
    records = [replace(r, question=r.question[: 16 + 9 * i]) for i, r in enumerate(task_records[:3])]
    K, T, L = 2, 2, 6
    pert, seeds = LockedDropout(p=0.3), seeds_for(0, 0, 0, 6)
    questions = [r.question for r in records]

    def reward(texts, recs):  # the prompt's index x 100 + the answer's length: says which row a reward is for
        return [100.0 * questions.index(rec.question) + len(t) for t, rec in zip(texts, recs)]

    kw = dict(n_latent=T, perturbation=pert, temperature=0.5)
    ro = collect_rollouts(lm, records, group_size=K, seeds=seeds, max_new_tokens=L, reward_fn=reward, **kw)
    assert ro.rewards.shape == (3, K)
    assert ro.rewards.flatten().tolist() == [100.0 * (i // K) + len(t) for i, t in enumerate(ro.texts)]
    assert len(set(ro.texts)) > 1  # (rows that differ: a seed given to another row would show)
    for i in range(6):
        ids, mask = lm.encode_questions([questions[i // K]])
        with pert.bind(lm, seeds[i : i + 1]) as pb:
            u = row_sampling_uniforms(seeds[i : i + 1], L)
            alone = lm.generate(ids, mask, T, max_new_tokens=L, temperature=0.5, uniforms=u, perturbation=pb)
        n = alone.tokens.shape[1]
        assert ro.tokens[i, :n].tolist() == alone.tokens[0].tolist() and not ro.mask[i, n:].any()
    logp, mask = replay_logprobs(lm, ro, torch.arange(6), seeds=seeds, **kw)
    assert torch.equal(mask, ro.mask)
    assert torch.allclose(ro.rollout_logp, logp, atol=1e-5)
    with pert.bind(lm, seeds) as pb, torch.no_grad():
        _, entropy = lm.target_logprobs(
            ro.prompt_ids, ro.prompt_mask, T, ro.tokens, ro.mask, perturbation=pb, temperature=0.5, with_entropy=True
        )
    assert entropy is not None
    assert ro.entropy == pytest.approx(float(entropy.sum() / ro.mask.sum()), abs=1e-5)


def test_pause_thoughts_without_markers_end_on_the_last_pause_tokens_state(tokenizer, task_records):
    """``prefill`` of a pause-token model without the end marker: T ``<|latent|>`` tokens in one call; the state that
    predicts the answer is the last one's (a full forward over prompt and pause tokens), not the first one's."""
    lm = make_lm(tokenizer, "qwen2").eval()
    ids, mask = lm.encode_questions([r.question for r in task_records[:2]])
    with torch.no_grad():
        state = lm.prefill(ids, mask, 3, mode="pause", markers=False)
        full_ids = torch.cat([ids, torch.full((2, 3), lm.latent_id)], 1)
        full_mask = torch.cat([mask, torch.ones(2, 3, dtype=mask.dtype)], 1)
        positions = (full_mask.long().cumsum(-1) - 1).clamp(min=0)
        full = lm.base(input_ids=full_ids, attention_mask=full_mask, position_ids=positions).last_hidden_state
    assert torch.allclose(state.last_hidden, full[:, -1:], atol=1e-5)
    assert not torch.allclose(state.last_hidden, full[:, -3:-2], atol=1e-3)
