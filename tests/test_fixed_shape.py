"""Fixed-shape rollouts (``grpo.engine: fast``, dgrpo.model.fixed_shape) give the eager rollouts' answers, log-probs
and entropies; their step is one computation on fixed buffers with no host synchronisation (what CUDA graph capture
needs: checked here by tracing it whole with torch.compile's ``fullgraph``)."""

import copy

import pytest
import torch

from dgrpo.config import Config, ConfigError, PerturbationConfig, load_config
from dgrpo.model.fixed_shape import FixedShapeDecoder, fixed_shape_generate, fixed_shape_target_logprobs
from dgrpo.perturbation import make_perturbation

from conftest import make_lm

ARCHS = ["qwen2", "llama", "gpt2"]


def ragged_batch(lm, records, n=6):
    questions = [r.question if i % 2 else r.question[: 25 + i] for i, r in enumerate(records[:n])]
    return lm.encode_questions(questions)  # left padding differs per row


def both(lm, ids, mask, pert, *, sync_every=8, **kw):
    out = []
    for fixed in (False, True):
        gen = torch.Generator().manual_seed(7)
        with torch.no_grad(), pert.bind(lm, torch.arange(ids.shape[0])) as pb:
            run = (lambda **a: fixed_shape_generate(lm, ids, mask, sync_every=sync_every, **a)) if fixed else None
            args = {"generator": gen, "perturbation": pb, "with_entropy": True, **kw}
            out.append(run(**args) if run else lm.generate(ids, mask, **args))
    return out


def ragged_targets(lm, n):
    """``n`` right-padded target rows of 3, 5, 7, ... tokens, and their mask."""
    targets = [[5 + (3 * i + j) % 40 for j in range(3 + 2 * i)] for i in range(n)]
    tg = torch.full((n, max(map(len, targets))), lm.pad_id)
    tm = torch.zeros_like(tg)
    for i, t in enumerate(targets):
        tg[i, : len(t)], tm[i, : len(t)] = torch.tensor(t), 1
    return tg, tm


def assert_same(eager, fixed):
    assert torch.equal(eager.tokens, fixed.tokens) and torch.equal(eager.mask, fixed.mask)
    assert torch.allclose(eager.logprobs, fixed.logprobs, atol=1e-5, rtol=0)
    assert torch.allclose(eager.entropy, fixed.entropy, atol=1e-5, rtol=0)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_fixed_shape_rollouts_equal_eager(tokenizer, task_records, arch, temperature):
    lm = make_lm(tokenizer, arch).eval()
    ids, mask = ragged_batch(lm, task_records)
    pert = make_perturbation(PerturbationConfig(kind="locked", p=0.3, sites=["attn", "mlp"]))
    eager, fixed = both(lm, ids, mask, pert, n_latent=3, max_new_tokens=20, temperature=temperature)
    assert_same(eager, fixed)


@pytest.mark.parametrize("sync_every", [0, 1, 3])
def test_rows_stop_at_eos_whatever_the_host_check_interval(tokenizer, task_records, sync_every):
    """Rows that finish early keep decoding masked-out pad until the host looks: the result does not change."""
    lm = make_lm(tokenizer, "qwen2").eval()
    ids, mask = ragged_batch(lm, task_records)
    eos_bias = torch.zeros(len(lm.tokenizer))
    eos_bias[lm.eos_id] = 5.5  # most rows end within a few tokens, at different steps
    lm.model.get_output_embeddings().register_forward_hook(lambda m, i, o: o + eos_bias)
    pert = make_perturbation(PerturbationConfig(kind="locked", p=0.5, sites=["mlp"]))
    eager, fixed = both(lm, ids, mask, pert, sync_every=sync_every, n_latent=2, max_new_tokens=12, temperature=1.0)
    lengths = eager.mask.sum(1)
    assert lengths.min() < lengths.max() < 12  # ragged, and all rows stopped
    assert_same(eager, fixed)


@pytest.mark.parametrize(
    "kind, mode", [("gaussian", "coconut"), ("none", "coconut"), ("locked", "pause")], ids=["gaussian", "none", "pause"]
)
def test_other_perturbations_and_pause_tokens(tokenizer, task_records, kind, mode):
    lm = make_lm(tokenizer, "llama").eval()
    ids, mask = ragged_batch(lm, task_records, n=4)
    pert = make_perturbation(PerturbationConfig(kind=kind, p=0.3, sigma=0.3, sites=["attn", "mlp"]))
    eager, fixed = both(lm, ids, mask, pert, n_latent=3, max_new_tokens=10, mode=mode)
    assert_same(eager, fixed)


@pytest.mark.parametrize(
    "arch, mode, kind",
    [
        ("qwen2", "coconut", "locked"),
        ("llama", "pause", "locked"),
        ("gpt2", "coconut", "locked"),
        ("qwen2", "coconut", "gaussian"),
    ],
)
def test_fixed_shape_scoring_equals_the_growing_cache_one(tokenizer, task_records, arch, mode, kind):
    """The fast engine's reference scoring (no grad): the latent steps over fixed buffers, then the marker and the
    right-padded targets in one call over the static cache, give ``target_logprobs``'s log-probs (fp32, 1e-5) for
    ragged prompts and targets, under a batched perturbation."""
    lm = make_lm(tokenizer, arch).eval()
    ids, mask = ragged_batch(lm, task_records)
    tg, tm = ragged_targets(lm, ids.shape[0])
    pert = make_perturbation(PerturbationConfig(kind=kind, p=0.3, sigma=0.3, sites=["attn", "mlp"]))
    with torch.no_grad(), pert.bind(lm, torch.arange(ids.shape[0])) as pb:
        grown, _ = lm.target_logprobs(ids, mask, 3, tg, tm, mode=mode, perturbation=pb, end_with_targets=True)
        fixed = fixed_shape_target_logprobs(lm, ids, mask, 3, tg, tm, mode=mode, perturbation=pb)
    assert (fixed[tm == 0] == 0).all() and (grown[tm == 1] < 0).all()
    assert torch.allclose(fixed, grown, atol=1e-5, rtol=0)


@pytest.mark.slow
def test_the_step_is_one_graph_without_host_synchronisation(tokenizer, task_records):
    """torch.compile(fullgraph=True) refuses a graph break: a ``.item()``, a data-dependent branch, a shape that
    depends on the step. The latent step (under locked dropout, over the static cache) traces whole, and running the
    traced step twice moves the buffers exactly as two eager steps do."""
    torch._dynamo.reset()
    lm = make_lm(tokenizer, "qwen2").eval()
    ids, mask = ragged_batch(lm, task_records, n=3)
    pert = make_perturbation(PerturbationConfig(kind="locked", p=0.3, sites=["attn", "mlp"]))
    hidden = []
    for traced in (False, True):
        with torch.no_grad(), pert.bind(lm, torch.arange(3)) as pb:
            dec = FixedShapeDecoder(lm, 3, ids.shape[1] + 4, capture=False)
            dec.start(ids, mask, pb)
            step = torch.compile(dec._forward, fullgraph=True, backend="eager") if traced else dec._forward
            for _ in range(2):
                dec.embeds.copy_(dec.hidden)
                step("latent")
            hidden.append((dec.hidden.clone(), dec.column.clone(), dec.next_position.clone(), dec.mask.clone()))
    torch._dynamo.reset()
    for a, b in zip(*hidden):
        assert torch.allclose(a.float(), b.float(), atol=1e-6, rtol=0)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_the_prompt_and_the_scored_answer_over_the_static_cache_read_nothing_back(tokenizer, task_records, arch):
    """The calls of several positions over the static cache (the prompt; the reference's teacher-forced answer) get
    a prebuilt 4-d mask, so Hugging Face's mask builder reads no value back from the padding (on a GPU, a host sync
    in every rollout and reference batch); the results are those of the growing cache (the tests above)."""
    from dgrpo.bench.step_profile import waiting_ops

    lm = make_lm(tokenizer, arch).eval()
    ids, mask = ragged_batch(lm, task_records, n=3)
    tg, tm = ragged_targets(lm, 3)
    pert = make_perturbation(PerturbationConfig(kind="locked", p=0.3, sites=["attn", "mlp"]))
    with torch.no_grad(), pert.bind(lm, torch.arange(3)) as pb:
        dec = FixedShapeDecoder(lm, 3, ids.shape[1] + 2 + tg.shape[1], capture=False)
        prompt = waiting_ops(lambda: dec.start(ids, mask, pb))
        dec.latent(2, "coconut", dec.hidden)
        answer = waiting_ops(lambda: dec.score(tg, tm, 1.0))
    assert prompt["waiting_ops"] == 0, prompt["waiting_op_sites"]
    assert answer["waiting_ops"] == 0, answer["waiting_op_sites"]


@pytest.mark.parametrize(
    "kw",
    [
        dict(temperature=-1.0),
        dict(temperature=float("nan")),
        dict(temperature=1.0, top_p=1.5),
        dict(temperature=1.0, top_p=0.0),
        dict(max_new_tokens=0),
        dict(n_latent=-1),
    ],
    ids=["negative-temperature", "nan-temperature", "top_p-above-1", "top_p-0", "no-token", "negative-n_latent"],
)
def test_arguments_generate_refuses_are_refused_too(tokenizer, task_records, kw):
    """The same arguments as ``generate``: what it refuses in one line, the fast engine refused not (a negative or NaN
    temperature decoded greedily, a top_p above 1 sampled, n_latent=-1 ran no thought, max_new_tokens=0 returned
    nothing; top_p=0 failed inside multinomial)."""
    lm = make_lm(tokenizer, "qwen2").eval()
    ids, mask = ragged_batch(lm, task_records, n=2)
    args = {"n_latent": 2, "max_new_tokens": 4, **kw}
    with pytest.raises(ValueError, match="generate: "):
        lm.generate(ids, mask, **args)
    with pytest.raises(ValueError, match="generate: "):
        fixed_shape_generate(lm, ids, mask, **args)


def test_capture_is_refused_off_cuda(tokenizer, task_records):
    lm = make_lm(tokenizer, "qwen2").eval()
    ids, mask = ragged_batch(lm, task_records, n=2)
    with pytest.raises(ValueError, match="CUDA"):
        fixed_shape_generate(lm, ids, mask, 2, capture=True)


def batches_of_one_shape(lm, records, n=6):
    """Three batches of ``n`` rows: prompts of different lengths (and paddings), within one column bucket."""
    out = []
    for k, cut in enumerate((0, 3, 1)):
        questions = [r.question[: 22 + (6, 0, 12)[k] + 3 * (i % 2)] for i, r in enumerate(records[cut : cut + n])]
        out.append(lm.encode_questions(questions))
    return out


@pytest.mark.parametrize("kind", ["locked", "gaussian", "none"])
def test_a_kept_decoder_serves_later_batches_as_a_new_one_would(tokenizer, task_records, kind):
    """``keep``: one decoder (its cache, buffers and graphs) serves every batch of its shape: the second and third
    batches, with other prompts and other seeds, get the rollouts and the reference scores a new decoder gives them
    (fp32: its columns are rounded up, never attended); a batch of another shape gets a decoder of its own."""
    lm = make_lm(tokenizer, "qwen2").eval()
    pert = make_perturbation(PerturbationConfig(kind=kind, p=0.3, sigma=0.3, sites=["attn", "mlp"]))
    batches = batches_of_one_shape(lm, task_records)
    assert len({ids.shape[1] for ids, _ in batches}) > 1  # the prompts' widths differ
    kept = []
    for b, (ids, mask) in enumerate(batches):
        seeds = torch.arange(ids.shape[0]) + 100 * b
        gens, scores = [], []
        for keep in (False, True):
            with torch.no_grad(), pert.bind(lm, seeds) as pb:
                g = fixed_shape_generate(
                    lm, ids, mask, 3, max_new_tokens=8, perturbation=pb, with_entropy=True, keep=keep
                )
                gens.append(g)
                scores.append(
                    fixed_shape_target_logprobs(lm, ids, mask, 3, g.tokens, g.mask, perturbation=pb, keep=keep)
                )
        assert_same(*gens)
        assert torch.allclose(scores[0], scores[1], atol=1e-5, rtol=0)
        kept.append({p: (dec, dec.cache.layers[0].keys.data_ptr()) for p, (_, dec) in lm.kept_decoders.items()})
    assert set(kept[0]) == {"generate", "score"}
    assert kept[0] == kept[1] == kept[2]  # the same decoders over the same cache memory
    ids, mask = batches[0]
    with torch.no_grad(), pert.bind(lm, torch.arange(3)) as pb:
        fixed_shape_generate(lm, ids[:3], mask[:3], 3, max_new_tokens=8, perturbation=pb, keep=True)
    assert lm.kept_decoders["generate"][1] is not kept[0]["generate"][0]


@pytest.mark.parametrize("kind", ["locked", "gaussian", "none"])
def test_a_padded_reference_decoder_serves_every_batch_the_group_filter_leaves(tokenizer, task_records, kind):
    """``pad`` (on by default where graphs are captured and kept): the reference's scoring runs each batch over the
    kept decoder's rows and columns (copies of its first row, cut off), so batches of 5, 2 and 4 rows (what the filter
    kept) and of other prompt widths share one decoder and its cache, at the log-probs each batch gets alone; the
    latent steps run over the padded rows, the answer's call over the batch's own."""
    lm = make_lm(tokenizer, "qwen2").eval()
    calls, call_base = [], lm._call_base

    def recorded(cache, phase, perturbation, x, *args):
        calls.append((phase, x.shape[0]))
        return call_base(cache, phase, perturbation, x, *args)

    lm._call_base = recorded
    pert = make_perturbation(PerturbationConfig(kind=kind, p=0.3, sigma=0.3, sites=["attn", "mlp"]))
    ids, mask = ragged_batch(lm, task_records, n=6)
    decoders, widths = [], set()
    for b, rows in enumerate(([0, 1, 2, 3, 4], [2, 0], [1, 3, 4, 5])):
        first = int(mask[rows].any(0).nonzero()[0])  # (this batch's own prompt width: no all-padding column)
        sub_ids, sub_mask = ids[rows, first:], mask[rows, first:]
        tg, tm = ragged_targets(lm, len(rows))
        seeds = torch.tensor(rows) + 10 * b
        scores = []
        for keep in (False, True):
            calls.clear()
            with torch.no_grad(), pert.bind(lm, seeds) as pb:
                kw = {"perturbation": pb, "keep": keep, "pad": keep, "min_rows": 5 if keep else 0}
                scores.append(fixed_shape_target_logprobs(lm, sub_ids, sub_mask, 3, tg, tm, **kw))
        assert calls == [("prompt", 5)] + [("latent", 5)] * 3 + [("answer", len(rows))]
        assert scores[1].shape == (len(rows), tg.shape[1])
        assert torch.allclose(scores[0], scores[1], atol=1e-5, rtol=0), (scores[0] - scores[1]).abs().max()
        _, dec = lm.kept_decoders["score"]
        widths.add(sub_ids.shape[1])
        decoders.append((dec, dec.cache.layers[0].keys.data_ptr(), tuple(dec.mask.shape)))
    assert len(widths) > 1  # the prompts' widths differ
    assert decoders[0] == decoders[1] == decoders[2]  # one decoder over the same cache memory
    assert decoders[0][2][0] == 5


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_padded_rollout_decoder_serves_a_step_last_smaller_batch(tokenizer, task_records, temperature):
    """``pad`` for rollouts: a step's last batch of fewer rows (``grpo.rollout_batch_size`` not dividing its rows)
    runs in the kept decoder padded to its rows, greedy or sampled from per-row uniforms, with the answers, log-probs
    and entropies it gets alone; a shared generator's draws would change with the rows: no padding then."""
    from dgrpo.perturbation.base import row_sampling_uniforms

    lm = make_lm(tokenizer, "qwen2").eval()
    pert = make_perturbation(PerturbationConfig(kind="locked", p=0.3, sites=["attn", "mlp"]))
    ids, mask = ragged_batch(lm, task_records, n=6)
    decoders = []
    for rows in ([0, 1, 2, 3, 4], [5, 2], [1, 0, 3, 4, 2]):
        seeds = torch.tensor(rows) + 40
        uniforms = row_sampling_uniforms(seeds, 12) if temperature > 0 else None
        gens = []
        for keep in (False, True):
            with torch.no_grad(), pert.bind(lm, seeds) as pb:
                kw = {"perturbation": pb, "keep": keep, "pad": keep, "with_entropy": True, "uniforms": uniforms}
                gens.append(
                    fixed_shape_generate(lm, ids[rows], mask[rows], 3, max_new_tokens=12, temperature=temperature, **kw)
                )
        assert_same(*gens)
        decoders.append(lm.kept_decoders["generate"][1])
    assert all(d is decoders[0] for d in decoders) and decoders[0].mask.shape[0] == 5
    with torch.no_grad(), pert.bind(lm, torch.arange(2)) as pb:
        kw = {"perturbation": pb, "keep": True, "pad": True, "generator": torch.Generator().manual_seed(0)}
        fixed_shape_generate(lm, ids[:2], mask[:2], 3, max_new_tokens=4, temperature=1.0, **kw)
    assert lm.kept_decoders["generate"][1].mask.shape[0] == 2


def test_first_rows_narrows_every_layer_to_views_and_puts_the_whole_back():
    """A call over a padded cache's first rows writes into the cache's own memory; linear-attention layers' states
    cannot be narrowed so: no padding for such a model."""
    from types import SimpleNamespace

    from transformers import Qwen2Config, Qwen3NextConfig

    from dgrpo.model.fixed_shape import attention_cache_only, first_rows

    layers = [SimpleNamespace(keys=torch.zeros(5, 2, 8, 4), values=torch.zeros(5, 2, 8, 4)) for _ in range(2)]
    whole = [(layer.keys, layer.values) for layer in layers]
    cache = SimpleNamespace(layers=layers)
    with first_rows(cache, 3) as c:
        assert all(layer.keys.shape[0] == 3 and layer.values.shape[0] == 3 for layer in c.layers)
        c.layers[1].values.fill_(1.0)
    assert all(layer.keys is k and layer.values is v for layer, (k, v) in zip(layers, whole, strict=True))
    assert layers[1].values[:3].eq(1).all() and layers[1].values[3:].eq(0).all()
    assert attention_cache_only(SimpleNamespace(model=SimpleNamespace(config=Qwen2Config())))
    assert not attention_cache_only(SimpleNamespace(model=SimpleNamespace(config=Qwen3NextConfig())))


def test_a_kept_decoder_copies_each_batch_perturbation_into_what_its_graphs_read(tokenizer, task_records):
    """A replayed graph reads the tensors it was captured with: a later batch's masks are copied into them."""
    from dgrpo.model.fixed_shape import decoder_for

    lm = make_lm(tokenizer, "qwen2").eval()
    ids, mask = ragged_batch(lm, task_records, n=4)
    pert = make_perturbation(PerturbationConfig(kind="locked", p=0.3, sites=["attn", "mlp"]))
    with torch.no_grad(), pert.bind(lm, torch.arange(4)) as first:
        dec = decoder_for(lm, "generate", 4, ids.shape[1] + 10, first, capture=False, keep=True)
        dec.start(ids, mask, first)
        dec.graph_inputs["latent"] = captured = [t.clone() for t in first.graph_inputs()]  # (what capture records)
    with torch.no_grad(), pert.bind(lm, torch.arange(4) + 50) as second:
        assert decoder_for(lm, "generate", 4, ids.shape[1] + 10, second, capture=False, keep=True) is dec
        assert not all(torch.equal(a, b) for a, b in zip(captured, second.graph_inputs()))
        dec.start(ids, mask, second)
    assert all(torch.equal(a, b) for a, b in zip(captured, second.graph_inputs(), strict=True))


def test_decoders_are_kept_only_for_perturbations_that_state_their_tensors_and_per_adapter(tokenizer, task_records):
    """A hooked perturbation that does not say which tensors it reads cannot have them copied in: a new decoder per
    batch. Under LoRA the reference adapter's graphs are not the policy's: one decoder per active adapter."""
    from types import SimpleNamespace

    from dgrpo.model.fixed_shape import decoder_for
    from dgrpo.perturbation.base import BoundPerturbation, HookedPerturbation

    lm = make_lm(tokenizer, "qwen2").eval()
    opaque = HookedPerturbation([], perturb_prompt=True)
    assert opaque.graph_inputs() is None and BoundPerturbation().graph_inputs() is None  # (a kind that does not say)
    a = decoder_for(lm, "generate", 2, 40, opaque, capture=False, keep=True)
    assert decoder_for(lm, "generate", 2, 40, opaque, capture=False, keep=True) is not a and not lm.kept_decoders
    lm.peft = SimpleNamespace(active_adapters=["policy"])
    policy = decoder_for(lm, "score", 2, 40, None, capture=False, keep=True)
    assert decoder_for(lm, "score", 2, 33, None, capture=False, keep=True) is policy  # (the same column bucket)
    lm.peft.active_adapters = ["reference"]
    reference = decoder_for(lm, "score", 2, 40, None, capture=False, keep=True)
    assert reference is not policy
    lm.model.to(torch.float64)  # the weights moved: a graph would read where they were
    assert decoder_for(lm, "score", 2, 40, None, capture=False, keep=True) is not reference


def test_a_trainer_keeps_one_decoder_per_model_and_purpose_and_frees_them(tokenizer, task_records):
    """Under the fast engine a step leaves the policy's rollout decoder and the reference's scoring decoder kept
    (their caches stay allocated: the update's out-of-memory advice names grpo.keep_graphs); releasing frees them."""
    from dgrpo.training.grpo import GRPOTrainer

    cfg = load_config(Config, "tiny.yaml", ["grpo.group_size=4", "grpo.engine=fast", "grpo.filter=false"])
    trainer = GRPOTrainer(make_lm(tokenizer, "qwen2"), cfg, task_records, reward_fn=code_parity)
    trainer.step()
    assert set(trainer.lm.kept_decoders) == {"generate"} and set(trainer.ref.lm.kept_decoders) == {"score"}
    with pytest.raises(torch.OutOfMemoryError, match="grpo.keep_graphs = False"), trainer._update_oom_advice():
        raise torch.OutOfMemoryError("CUDA out of memory.")
    dec = trainer.lm.kept_decoders["generate"][1]
    cfg_m = trainer.lm.model.config
    kv_width = cfg_m.num_key_value_heads * (cfg_m.hidden_size // cfg_m.num_attention_heads)
    cache = 2 * cfg_m.num_hidden_layers * dec.mask.numel() * kv_width * 4  # keys and values, fp32
    assert cache < dec.nbytes < cache * 1.2 and trainer.kept_decoder_bytes() > dec.nbytes
    assert not copy.deepcopy(trainer.lm).kept_decoders  # (a copy's weights are elsewhere; graphs are not copied)
    trainer.release_kept_decoders()
    assert not trainer.lm.kept_decoders and not trainer.ref.lm.kept_decoders


def test_the_reference_scores_every_step_over_one_padded_decoder(tokenizer, task_records, monkeypatch):
    """With the group filter on, the reference scores a different number of rows each step; where its decoder is
    padded (``pad``, the default under capture: forced here on the CPU) it runs over the largest batch it can get,
    ``min(grpo.rollout_batch_size, prompts x K)`` rows, from the first step on: one decoder for the whole run."""
    from dgrpo.model import fixed_shape
    from dgrpo.training import rollouts
    from dgrpo.training.grpo import GRPOTrainer

    calls = []

    def padded(*args, **kw):
        calls.append((args[1].shape[0], kw["min_rows"]))
        return fixed_shape.fixed_shape_target_logprobs(*args, **kw | {"pad": True})

    monkeypatch.setattr(rollouts, "fixed_shape_target_logprobs", padded)
    over = ["grpo.group_size=4", "grpo.prompts_per_step=4", "grpo.engine=fast", "grpo.rollout_batch_size=12"]
    cfg = load_config(Config, "tiny.yaml", [*over, "grpo.temperature=1", "grpo.alpha_min=0.25", "grpo.alpha_max=0.75"])
    trainer = GRPOTrainer(make_lm(tokenizer, "qwen2"), cfg, task_records, reward_fn=code_parity)
    decoders = []
    for _ in range(4):
        trainer.step()
        if "score" in trainer.ref.lm.kept_decoders:
            decoders.append(trainer.ref.lm.kept_decoders["score"][1])
    assert len({rows for rows, _ in calls}) > 1  # the filter left other rows on other steps
    assert {m for _, m in calls} == {12}
    assert len(decoders) >= 2 and all(d is decoders[0] for d in decoders) and decoders[0].mask.shape[0] == 12


def code_parity(completions, records):
    """A reward a random tiny model's sampled answers earn about half the time: the parity of their code points."""
    return [float(sum(map(ord, c)) % 2) for c in completions]


@pytest.mark.parametrize("variant", ["grpo.engine=fast", "grpo.rollout_cache=static"])
def test_grpo_steps_match_the_eager_dynamic_cache_ones(tokenizer, task_records, variant):
    """Two trainer steps (sampled rollouts, locked dropout): the same rewards and update with the fast engine (whose
    update and reference also run <|end-latent|> in the answer's forward call), or with eager rollouts over the
    static cache, as with the defaults."""
    from dgrpo.training.grpo import GRPOTrainer

    rows = []
    for over in ([], [variant]):
        cfg = load_config(Config, "tiny.yaml", ["grpo.group_size=4", "grpo.temperature=1", *over])
        trainer = GRPOTrainer(make_lm(tokenizer, "qwen2"), cfg, task_records, reward_fn=code_parity)
        rows.append([trainer.step() for _ in range(2)])
    assert all(m["skipped"] == 0 for m in rows[0])  # the rewards differ within groups: every step updates
    for a, b in zip(*rows):
        assert a["reward_mean"] == b["reward_mean"] and a["reward_std"] == b["reward_std"]
        assert a["policy_loss"] == pytest.approx(b["policy_loss"], abs=1e-6)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)
        assert a["logp_replay_maxdiff"] < 1e-5 and b["logp_replay_maxdiff"] < 1e-5


def test_the_fast_engine_refuses_native_dropout():
    with pytest.raises(ConfigError, match="grpo.engine"):
        load_config(Config, "tiny.yaml", ["grpo.engine=fast", "perturbation.kind=native"])


def test_auto_engine_is_fast_on_cuda_with_a_batched_perturbation_only():
    from dgrpo.training.rollouts import resolve_engine

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert resolve_engine("auto", cuda, True) == "fast"
    assert resolve_engine("auto", cuda, False) == "eager"  # native dropout: one rollout at a time
    assert resolve_engine("auto", cpu, True) == "eager"
    assert resolve_engine("eager", cuda, True) == "eager" and resolve_engine("fast", cpu, True) == "fast"


def test_fused_kernels_leave_a_cpu_model_as_it_is(tokenizer):
    from dgrpo.model.kernels import apply_kernels

    lm = make_lm(tokenizer)
    before = {n: type(m) for n, m in lm.model.named_modules()}
    assert not apply_kernels(lm.model, "none")
    with pytest.warns(UserWarning, match="need CUDA"):
        assert not apply_kernels(lm.model, "liger")
    assert {n: type(m) for n, m in lm.model.named_modules()} == before
    with pytest.raises(ValueError, match="none or liger"):
        apply_kernels(lm.model, "fused")


def test_a_failed_capture_warns_and_the_purpose_runs_eagerly_from_then_on(tokenizer, task_records, monkeypatch):
    """An op that cannot be captured (or a capture ended from outside): the decoder says so once and runs that step
    and every later one eagerly, with the same answers, and no later decoder of the model for that purpose tries to
    capture again (a failed capture may keep its pool's memory); another purpose still captures."""
    from contextlib import contextmanager
    from types import SimpleNamespace

    from dgrpo.model import fixed_shape

    lm = make_lm(tokenizer, "qwen2").eval()
    ids, mask = ragged_batch(lm, task_records, n=3)
    pert = make_perturbation(PerturbationConfig(kind="locked", p=0.3, sites=["attn", "mlp"]))
    tries = []

    @contextmanager
    def failing_capture(graph, pool):
        tries.append(1)
        raise RuntimeError("operation failed due to a previous error during capture\nmore")
        yield

    class Warmed:  # (every step counts as warmed up: a capturing decoder's next step is its capture)
        def __contains__(self, key):
            return True

    def generate(decoder=None):
        real = fixed_shape.decoder_for
        if decoder is not None:
            monkeypatch.setattr(fixed_shape, "decoder_for", lambda *a: decoder)
        with torch.no_grad(), pert.bind(lm, torch.arange(3)) as pb:
            out = fixed_shape_generate(lm, ids, mask, 2, max_new_tokens=6, perturbation=pb, capture=decoder is not None)
        monkeypatch.setattr(fixed_shape, "decoder_for", real)
        return out

    eager = generate()
    # (the width fixed_shape_generate gives its own decoder: prompt + thoughts + marker + max_new_tokens - 1; another
    # width pads the attention differently, which need not give the same last bits on every CPU)
    dec = FixedShapeDecoder(lm, 3, ids.shape[1] + 2 + 1 + 6 - 1, capture=False)
    dec.capture, dec.pool = True, SimpleNamespace(handle=None, newest=[])  # (as on CUDA)
    monkeypatch.setattr(fixed_shape, "captured", failing_capture)
    monkeypatch.setattr(fixed_shape, "_warmed", Warmed())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: None)
    with pytest.warns(RuntimeWarning, match="generate decoder: capturing its latent step failed .*during capture\\)"):
        failed = generate(dec)
    assert len(tries) == 1 and dec.capture is False and dec.graphs == {}
    assert torch.equal(failed.tokens, eager.tokens) and torch.equal(failed.logprobs, eager.logprobs)
    assert lm.kept_decoders.failed_captures == {"generate"}
    later = fixed_shape.decoder_for(lm, "generate", 3, 16, None, capture=True, keep=True)  # (True would raise here)
    assert later.capture is False
    with pytest.raises(ValueError, match="CUDA"):
        fixed_shape.decoder_for(lm, "score", 3, 16, None, capture=True, keep=True)


def test_the_warm_up_key_tells_a_patched_forward_from_its_class(tokenizer):
    """Liger patches each layer's forward and keeps its class: a Liger decoder skipped its warm-up (first-use kernel
    work, which cannot be captured) because a Hugging Face decoder of the same shapes had run that step."""
    lm = make_lm(tokenizer, "qwen2")
    before = FixedShapeDecoder(lm, 3, 16, capture=False).warm_key("latent")
    norm = lm.model.model.norm
    norm.forward = lambda hidden_states: hidden_states  # (as Liger's RMSNorm patch: an instance's own forward)
    after = FixedShapeDecoder(lm, 3, 16, capture=False).warm_key("latent")
    assert before != after and before[:-2] == after[:-2]


def test_a_kept_decoder_serves_only_a_perturbation_acting_in_the_same_phases(tokenizer):
    """A kept decoder's answer graph is captured with what the hooks did in the answer phase: one captured for a
    perturbation that leaves the answer alone (``perturb_answer=False``) must not serve one that perturbs it, nor the
    reverse, whatever their tensors' shapes."""
    from dgrpo.model.fixed_shape import decoder_for, noisy_phases, replay_key
    from dgrpo.perturbation import LockedDropout

    lm = make_lm(tokenizer, "qwen2")
    seeds = torch.arange(2)
    noisy, quiet = (LockedDropout(p=0.3, perturb_answer=a).bind(lm, seeds) for a in (True, False))
    assert noisy_phases(noisy) == ("prompt", "latent", "answer") and noisy_phases(quiet) == ("prompt", "latent")
    assert replay_key(lm, noisy) != replay_key(lm, quiet)
    kept = decoder_for(lm, "generate", 2, 40, noisy, False, True)
    assert decoder_for(lm, "generate", 2, 40, noisy, False, True) is kept
    assert decoder_for(lm, "generate", 2, 40, quiet, False, True) is not kept
