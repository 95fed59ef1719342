"""Hand-worked cases that pin branches of the latent model (dgrpo.model.latent_lm) and its decoding helpers
(dgrpo.model.decoding) which no other test held: each was found by a mutation test, a small change of one branch
that every test passed."""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch

from dgrpo.model.latent_lm import LatentLM, LatentSettings

from conftest import distinct_markers, make_lm


def _batch(lm, records, n=3):
    """Ragged questions (left padding) and right-padded targets of three lengths."""
    qs = [r.question if i % 2 else r.question[: 20 + 7 * i] for i, r in enumerate(records[:n])]
    targets = [
        f"#### {r.answer}" if i else "\n".join(r.steps) + f"\n#### {r.answer}" for i, r in enumerate(records[:n])
    ]
    return lm.encode_questions(qs) + lm.encode_targets(targets)


def test_the_end_marker_in_the_answer_call_keeps_the_temperature_and_the_entropy(tokenizer, task_records):
    """``end_with_targets`` scores at the temperature asked for (the update's ratio at t = 0.5), with the entropy:
    the same log-probs and entropies as the marker's own call, which differ from those at t = 1."""
    lm = make_lm(tokenizer, "qwen2").eval()
    ids, mask, tg, tm = _batch(lm, task_records)
    with torch.no_grad():
        own = lm.target_logprobs(ids, mask, 2, tg, tm, temperature=0.5, with_entropy=True)
        merged = lm.target_logprobs(ids, mask, 2, tg, tm, temperature=0.5, with_entropy=True, end_with_targets=True)
        at_one = lm.target_logprobs(ids, mask, 2, tg, tm, with_entropy=True, end_with_targets=True)
    assert own[1] is not None and merged[1] is not None and at_one[1] is not None
    torch.testing.assert_close(merged[0], own[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(merged[1], own[1], atol=1e-5, rtol=0)
    assert (merged[0] - at_one[0]).abs().max() > 1e-2
    # 0 at padding: log-probs and entropies alike
    assert bool((merged[0][tm == 0] == 0).all()) and bool((merged[1][tm == 0] == 0).all())
    assert bool((merged[1][tm == 1] > 0).all())


def test_settings_from_a_newer_versions_file_drop_unknown_keys_and_refuse_zero_thoughts_per_step():
    """``latent_config.json`` of a newer dgrpo (a key this one does not know) loads without it; ``c_thought`` is a
    positive integer (0 thoughts per step would give every stage no latents), the counts non-negative."""
    assert LatentSettings.from_dict({"mode": "pause", "n_latent": 4, "added_later": 1}) == LatentSettings(
        mode="pause", n_latent=4
    )
    with pytest.raises(ValueError, match="c_thought must be a positive integer"):
        LatentSettings(c_thought=0)
    assert LatentSettings(stage=0, n_latent=0).stage == 0
    with pytest.raises(ValueError, match="n_latent must be a non-negative integer"):
        LatentSettings(n_latent=-1)


def test_a_reloaded_checkpoint_has_its_run_config_and_is_in_eval_mode(tokenizer, tmp_path):
    """``save_pretrained`` writes the run config beside the weights and ``from_pretrained`` reads it back; the loaded
    model is in eval mode, as transformers loads one (the wrapper's flag and every module's)."""
    lm = make_lm(tokenizer, "gpt2").train()
    lm.run_config = {"grpo": {"steps": 3}, "seed": 7}
    lm.save_pretrained(tmp_path / "m")
    back = LatentLM.from_pretrained(tmp_path / "m")
    assert back.run_config == {"grpo": {"steps": 3}, "seed": 7}
    assert not back.training and not any(m.training for m in back.modules())


def test_the_wrapper_takes_the_mode_of_the_model_it_wraps(tokenizer):
    """``LatentLM(model, tok)`` is in the mode the model is in (a loaded model: eval), not nn.Module's default."""
    lm = make_lm(tokenizer, "gpt2")
    assert LatentLM(lm.model.eval(), lm.tokenizer).training is False
    assert LatentLM(lm.model.train(), lm.tokenizer).training is True


def test_end_with_targets_adds_no_marker_to_a_model_prompted_without_markers(tokenizer, task_records):
    """``end_with_targets`` moves ``<|end-latent|>`` into the answer's call only where there is one (``markers``):
    a prompt without the markers is scored as it is without the option."""
    lm = make_lm(tokenizer, "llama").eval()
    qs = [r.question for r in task_records[:2]]
    ids, mask = lm.encode_questions(qs, markers=False)
    tg, tm = lm.encode_targets([f"#### {r.answer}" for r in task_records[:2]])
    with torch.no_grad():
        plain, _ = lm.target_logprobs(ids, mask, 0, tg, tm, markers=False)
        merged, _ = lm.target_logprobs(ids, mask, 0, tg, tm, markers=False, end_with_targets=True)
        marked, _ = lm.target_logprobs(*lm.encode_questions(qs), 0, tg, tm, end_with_targets=True)
    torch.testing.assert_close(merged, plain, atol=1e-6, rtol=0)
    assert (marked - plain).abs().max() > 1e-3


@pytest.mark.parametrize("n_tokens", [1, 2])
def test_targets_of_one_and_two_tokens_are_scored_as_the_full_recompute_scores_them(tokenizer, task_records, n_tokens):
    """The shortest targets: one token (scored from the marker's state alone, no answer call) and two (one answer
    call of one position), equal to the uncached recompute's log-probs."""
    from dgrpo.model.reference import uncached_target_logprobs

    lm = make_lm(tokenizer, "qwen2").eval()
    ids, mask = lm.encode_questions([r.question for r in task_records[:3]])
    tg = torch.tensor([[lm.eos_id, 5], [7, lm.eos_id], [9, 11]])[:, :n_tokens]
    tm = torch.ones_like(tg)
    with torch.no_grad():
        lp, _ = lm.target_logprobs(ids, mask, 2, tg, tm)
        ref, _ = uncached_target_logprobs(lm, ids, mask, 2, tg, tm)
    assert lp.shape == (3, n_tokens)
    torch.testing.assert_close(lp, ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("grad", [False, True])
def test_head_logprobs_in_chunks_are_those_of_one_softmax_at_the_temperature(grad):
    """``head_logprobs`` by position chunks (a chunk of 2 positions here), with and without grad: log softmax(head(h)
    / t)[target] and its entropy at t = 0.5 for every position, as one softmax over the whole batch gives them."""
    from dgrpo.model.decoding import head_logprobs

    torch.manual_seed(0)
    head = torch.nn.Linear(4, 6, bias=False)
    h = torch.randn(2, 5, 4, requires_grad=grad)
    tgt = torch.randint(0, 6, (2, 5))
    with torch.set_grad_enabled(grad):
        logp, ent = head_logprobs(head, h, tgt, 0.5, True, chunk_elems=2 * 2 * 6)
    full = (head(h) / 0.5).log_softmax(-1)
    torch.testing.assert_close(logp, full.gather(-1, tgt[..., None]).squeeze(-1), atol=1e-6, rtol=0)
    assert ent is not None
    torch.testing.assert_close(ent, -(full.exp() * full).sum(-1), atol=1e-6, rtol=0)


def test_a_nucleus_just_below_one_drops_the_unlikely_tail():
    """top_p = 0.995 is a nucleus too: a token whose mass before it is 0.996 is never sampled, even by the last
    draw; at top_p = 1 that draw picks it."""
    from dgrpo.model.decoding import sample_next

    logits = torch.tensor([[0.6, 0.396, 0.004]]).log()
    assert sample_next(logits, 1.0, 0.995, None, torch.tensor([0.9999])).tolist() == [1]
    assert sample_next(logits, 1.0, 1.0, None, torch.tensor([0.9999])).tolist() == [2]


def test_pause_thoughts_and_the_end_marker_are_their_own_tokens_at_their_own_positions(tokenizer, task_records):
    """``prefill`` in pause mode with the markers: T ``<|latent|>`` tokens then ``<|end-latent|>``, each its own
    embedding at the next positions, as one full forward over the token sequence computes it (markers of distinct
    embeddings)."""
    lm = make_lm(tokenizer, "gpt2").eval()
    distinct_markers(lm)
    ids, mask = lm.encode_questions([r.question[: 15 + 20 * i] for i, r in enumerate(task_records[:2])])
    T = 3
    with torch.no_grad():
        state = lm.prefill(ids, mask, T, mode="pause")
        tail = torch.tensor([[lm.latent_id] * T + [lm.end_id]] * 2)
        full_ids, full_mask = torch.cat([ids, tail], 1), torch.cat([mask, torch.ones_like(tail)], 1)
        positions = (full_mask.long().cumsum(-1) - 1).clamp(min=0)
        full = lm.base(input_ids=full_ids, attention_mask=full_mask, position_ids=positions).last_hidden_state
    torch.testing.assert_close(state.last_hidden, full[:, -1:], atol=1e-5, rtol=0)
    assert state.next_position.tolist() == (positions[:, -1] + 1).tolist()


class _Phases:
    """A phase hook that records the phase of every forward call (``rows``: the batch size it is bound for)."""

    def __init__(self, rows: int | None = None) -> None:
        self.seen: list[str] = []
        self.rows = rows

    def before_forward(self, phase: str) -> None:
        self.seen.append(phase)


@pytest.mark.parametrize(
    ("mode", "kw", "calls"),
    [
        ("coconut", {}, ["prompt", "latent", "latent", "answer", "answer"]),
        ("coconut", {"end_with_targets": True}, ["prompt", "latent", "latent", "answer"]),
        ("coconut", {"stepwise": True}, ["prompt", "latent", "latent", "answer", "answer", "answer"]),
        ("pause", {}, ["prompt", "latent", "answer", "answer"]),
    ],
)
def test_each_forward_tells_the_perturbation_its_phase(tokenizer, task_records, mode, kw, calls):
    """The phase each forward call announces (what ``perturb_prompt`` / ``perturb_answer`` act on): the question is
    ``prompt``, each continuous thought (or the pause tokens' one call) ``latent``, ``<|end-latent|>`` and the
    targets ``answer`` (3 targets: 2 fed, in one call or one call each)."""
    lm = make_lm(tokenizer, "qwen2").eval()
    ids, mask = lm.encode_questions([r.question for r in task_records[:2]])
    tg = torch.tensor([[5, 6, lm.eos_id], [7, 8, 9]])
    hook = _Phases()
    with torch.no_grad():
        lm.target_logprobs(ids, mask, 2, tg, torch.ones_like(tg), mode=mode, perturbation=hook, **kw)
    assert hook.seen == calls


def test_generation_tells_the_perturbation_each_calls_phase(tokenizer, task_records):
    """``generate``: the question (``prompt``), T thoughts (``latent``), the marker and each answer token fed back
    (``answer``); the last token chosen is not fed."""
    lm = make_lm(tokenizer, "qwen2").eval()
    ids, mask = lm.encode_questions([task_records[0].question])
    hook = _Phases()
    lm.generate(ids, mask, 3, max_new_tokens=3, perturbation=hook, stop_ids=list(range(len(lm.tokenizer))))
    assert hook.seen == ["prompt", "latent", "latent", "latent", "answer"]  # (every id stops: one token)
    hook.seen.clear()
    lm.generate(ids, mask, 1, max_new_tokens=3, perturbation=hook, stop_ids=[])
    n_fed = len(hook.seen) - 3
    assert hook.seen == ["prompt", "latent", "answer"] + ["answer"] * n_fed and n_fed <= 2


def test_a_static_cache_given_again_is_emptied_first(tokenizer, task_records):
    """``prefill(cache=...)`` reuses a static cache: what it held from another batch is dropped, so the state is the
    one a fresh growing cache gives."""
    lm = make_lm(tokenizer, "llama").eval()
    ids, mask = lm.encode_questions([r.question for r in task_records[:2]])
    other, other_mask = lm.encode_questions([r.question for r in task_records[2:4]])
    cache = lm.new_cache(max(ids.shape[1], other.shape[1]) + 8)
    with torch.no_grad():
        fresh = lm.prefill(ids, mask, 2).last_hidden
        lm.prefill(other, other_mask, 2, cache=cache)
        again = lm.prefill(ids, mask, 2, cache=cache).last_hidden
    torch.testing.assert_close(again, fresh, atol=1e-5, rtol=0)


class _Vocab:
    """A tokenizer as ``check_saved_tokenizer`` reads one: its vocabulary and its length."""

    def __init__(self, n: int, markers_at: int) -> None:
        from dgrpo.data.records import LATENT_MARKERS

        self.vocab = {f"t{i}": i for i in range(n - len(LATENT_MARKERS))}
        self.vocab.update({m: markers_at + j for j, m in enumerate(LATENT_MARKERS)})
        self.n = n

    def get_vocab(self) -> dict[str, int]:
        return self.vocab

    def __len__(self) -> int:
        return self.n


@pytest.mark.parametrize(
    ("n", "markers_at", "says"),
    [
        (10, 7, None),  # the markers in the last three of 10 rows: the tokenizer saved with them
        (11, 7, "it has 1 tokens past the model's 10 embedding rows"),
        (11, 8, "it lacks the latent markers <|end-latent|>"),  # the last marker's id is 10: no row of its own
    ],
)
def test_a_saved_tokenizer_fits_the_rows_of_its_model_exactly(n, markers_at, says):
    """``check_saved_tokenizer`` at its edges, 10 embedding rows: every marker id below 10 and no more than 10
    tokens, else one CheckpointError naming what is wrong."""
    from dgrpo.model.hf_loading import check_saved_tokenizer
    from dgrpo.model.verified import CheckpointError

    tok: Any = _Vocab(n, markers_at)
    if says is None:
        check_saved_tokenizer("here", tok, 10)
        return
    with pytest.raises(CheckpointError, match=re.escape(says)):
        check_saved_tokenizer("here", tok, 10)


def test_a_generator_on_the_logits_device_draws_as_multinomial_does():
    """Without per-row draws, a generator on the logits' device samples through ``torch.multinomial`` with it (the
    seeded stream of Hugging Face's sampling): the same tokens as multinomial from the same seed."""
    from dgrpo.model.decoding import sample_next

    logits = torch.randn(64, 7, generator=torch.Generator().manual_seed(1))
    picked = sample_next(logits, 0.8, 1.0, torch.Generator().manual_seed(5))
    expected = torch.multinomial((logits / 0.8).softmax(-1), 1, generator=torch.Generator().manual_seed(5))
    assert picked.tolist() == expected.squeeze(-1).tolist()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_cpu_generator_samples_cuda_logits_from_its_own_draws():
    """A CPU generator with CUDA logits (which ``torch.multinomial`` refuses): one U(0, 1) draw per row from the
    generator, then inverse-CDF sampling on the device."""
    from dgrpo.model.decoding import inverse_cdf, sample_next

    logits = torch.randn(8, 7, generator=torch.Generator().manual_seed(1)).cuda()
    picked = sample_next(logits, 1.0, 1.0, torch.Generator().manual_seed(5))
    u = torch.rand(8, generator=torch.Generator().manual_seed(5)).cuda()
    assert picked.tolist() == inverse_cdf(logits.softmax(-1), u).tolist()


def test_a_perturbation_bound_for_other_rows_is_refused_before_any_forward(tokenizer, task_records):
    """A hook bound for 3 rows (one seed each) met by a batch of 2 is one ValueError, before any forward runs (one
    seed's noise would otherwise broadcast over every row)."""
    lm = make_lm(tokenizer, "qwen2").eval()
    ids, mask = lm.encode_questions([r.question for r in task_records[:2]])
    hook = _Phases(rows=3)
    with pytest.raises(ValueError, match="bound for 3 rows .*this batch has 2"):
        lm.generate(ids, mask, 1, max_new_tokens=2, perturbation=hook)
    assert hook.seen == []
    hook.rows = 2
    lm.generate(ids, mask, 1, max_new_tokens=2, perturbation=hook)
    assert hook.seen[:2] == ["prompt", "latent"]


def test_eval_mode_puts_every_module_back_in_its_own_mode_after_an_exception_too(tokenizer):
    """``eval_mode``: every module in eval mode within the block; afterwards each in the mode it had (a mixed model:
    the wrapper and its decoder training, the head not), an exception in the block too."""
    lm = make_lm(tokenizer, "gpt2").train()
    lm.model.lm_head.eval()
    before = [(m, m.training) for m in lm.modules()]
    with pytest.raises(RuntimeError, match="inside"), lm.eval_mode() as inside:
        assert inside is lm and not any(m.training for m in lm.modules())
        raise RuntimeError("inside")
    assert [m.training for m, _ in before] == [t for _, t in before]
    assert lm.training and not lm.model.lm_head.training


def test_a_target_of_exactly_max_tokens_has_no_room_for_its_eos(tokenizer):
    """``encode_targets``: a target of n tokens under ``max_tokens = n`` is cut (it keeps its n tokens and no EOS: n + 1
    would pass the limit); under n + 1 it ends in EOS; with ``eos=False`` n tokens fit n."""
    lm = make_lm(tokenizer)
    own = lm.token_ids(["#### 42"])[0]
    n = len(own)
    ids, mask = lm.encode_targets(["#### 42"], max_tokens=n)
    assert ids[0].tolist() == own and mask[0].tolist() == [1] * n
    assert lm.encode_targets(["#### 42"], max_tokens=n + 1)[0][0].tolist() == [*own, lm.eos_id]
    assert lm.encode_targets(["#### 42"], max_tokens=n, eos=False)[0][0].tolist() == own


def test_decode_drops_the_special_tokens_and_the_masked_ones(tokenizer):
    """``decode``: the text of each row's tokens under its mask, without EOS or the latent markers."""
    lm = make_lm(tokenizer)
    own = lm.token_ids(["#### 42"])[0]
    row = [lm.start_id, *own, lm.end_id, lm.eos_id, 7]
    tokens = torch.tensor([row, row])
    mask = torch.tensor([[1] * (len(row) - 1) + [0], [1] * len(row)])
    texts = lm.decode(tokens, mask)
    assert texts[0] == lm.tokenizer.decode(own) and texts[1] == lm.tokenizer.decode([*own, 7])


def test_under_a_chat_template_the_bos_is_the_templates_own_and_a_question_of_max_tokens_is_not_cut(tokenizer):
    """With ``chat_template`` the template writes the question's BOS (none is put before it again, though the
    tokenizer starts its texts with one); a question of exactly ``max_tokens`` tokens is not counted as cut."""
    lm = make_lm(tokenizer, "qwen2")
    lm.tokenizer.chat_template = "<s>{% for m in messages %}USER: {{ m['content'] }}\n{% endfor %}ASSISTANT:"
    lm.settings.chat_template = True
    lm.question_prefix = [lm.eos_id]  # (a BOS the tokenizer would put before a text of its own)
    q = "what is 3 + 4"
    ids, mask = lm.encode_questions([q])
    assert ids[0].tolist() == lm.token_ids([lm.format_question(q)])[0] + [lm.start_id]
    n = len(lm.token_ids([q])[0])
    assert lm.count_cut_questions([q], n) == 0 and lm.count_cut_questions([q], n - 1) == 1


@pytest.mark.parametrize("family", ["gemma2", "granite"])
def test_greedy_answers_book_the_log_probs_their_scoring_gives_under_a_logit_transform(tokenizer, family):
    """``generate`` books each greedy token's log-prob from the head's logits as the model's forward transforms them
    (Gemma 2's softcap, Granite's scaling: the argmax stays, the log-probs do not), so that they are the ones
    ``target_logprobs`` replays for the same tokens."""
    from test_model_families import family_lm

    lm = family_lm(tokenizer, family)
    ids, mask = lm.encode_questions(["Start with 3. Add 4. Answer mod 10."])
    with torch.no_grad():
        gen = lm.generate(ids, mask, 2, max_new_tokens=4)
        replay, _ = lm.target_logprobs(ids, mask, 2, gen.tokens, gen.mask)
    torch.testing.assert_close(gen.logprobs, replay, atol=1e-5, rtol=0)


def test_misshapen_inputs_are_one_typed_line_each(tokenizer):
    """The entry points refuse what would fail later, unclearly: one string for a list of texts, an empty list, a
    negative ``max_tokens`` (-1 too), a prompt mask of another shape, tokens and mask of other shapes to decode."""
    lm = make_lm(tokenizer)
    with pytest.raises(TypeError, match="got one string"):
        lm.encode_questions("what is 3 + 4")
    with pytest.raises(ValueError, match="no targets"):
        lm.encode_targets([])
    with pytest.raises(ValueError, match="max_tokens must be >= 0"):
        lm.encode_questions(["q"], max_tokens=-1)
    ids, mask = lm.encode_questions(["q", "a longer question"])
    with pytest.raises(ValueError, match="differ in shape"):
        lm.generate(ids, mask[:, 1:], 1)
    with pytest.raises(ValueError, match="decode: tokens"):
        lm.decode(ids, mask[:1])


@pytest.mark.parametrize(
    ("n_latent", "max_new_tokens", "temperature", "top_p"),
    [(-1, 4, 0.0, 1.0), (2, 0, 0.0, 1.0), (2, 4, -0.1, 1.0), (2, 4, 1.0, 0.0), (2, 4, 1.0, 1.01)],
)
def test_decoding_arguments_out_of_range_are_refused(n_latent, max_new_tokens, temperature, top_p):
    """``check_decoding`` at its edges: n_latent >= 0, max_new_tokens >= 1, temperature >= 0, 0 < top_p <= 1 (the
    smallest values allowed pass)."""
    from dgrpo.model.decoding import check_decoding

    check_decoding(0, 1, 0.0, 1.0)
    check_decoding(0, 1, 0.0, 1e-6)
    with pytest.raises(ValueError, match="generate: "):
        check_decoding(n_latent, max_new_tokens, temperature, top_p)


def test_sampling_draws_of_another_shape_are_one_line_before_decoding(tokenizer):
    """``uniforms`` must be [rows, max_new_tokens] or wider, in both engines: fewer columns was an IndexError in the
    decoding loop at the first step past them, another row count a shape error in the sampler. Extra columns are
    left unread."""
    lm = make_lm(tokenizer)
    ids, mask = lm.encode_questions(["q", "a longer question"])
    from dgrpo.model.fixed_shape import fixed_shape_generate

    for shape in ((2, 3), (1, 4), (8,)):
        said = re.escape(f"uniforms must be [rows, max_new_tokens] = [2, 4] (or more columns), got {list(shape)}")
        for generate in (lm.generate, lambda *a, **kw: fixed_shape_generate(lm, *a, **kw)):  # (eager, fast engine)
            with pytest.raises(ValueError, match=said):
                generate(ids, mask, 1, max_new_tokens=4, temperature=1.0, uniforms=torch.rand(*shape))
    with torch.no_grad():
        wide = lm.generate(ids, mask, 1, max_new_tokens=4, temperature=1.0, uniforms=torch.full((2, 6), 0.5))
        exact = lm.generate(ids, mask, 1, max_new_tokens=4, temperature=1.0, uniforms=torch.full((2, 4), 0.5))
    assert torch.equal(wide.tokens, exact.tokens)
