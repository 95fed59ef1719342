"""CUDA checks (skipped without a GPU): the recurrence, mask replay, a bf16 + 8-bit-optimizer GRPO step on the device.

CI has no GPU; these run wherever CUDA is present (``pytest tests/test_cuda.py``).
"""

import contextlib
import copy
from functools import partial

import pytest
import torch

from dgrpo.data.synthetic import generate_split
from dgrpo.model.reference import uncached_target_logprobs
from dgrpo.perturbation import LockedDropout, seeds_for
from dgrpo.training.grpo import GRPOTrainer
from dgrpo.training.rollouts import collect_rollouts, replay_logprobs

from conftest import kv_column_bytes, make_lm, scored_with_grad, tiny_config

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    # a decoder whose capture fails runs eagerly with a warning (the same results): here a capture must not fail
    pytest.mark.filterwarnings("error:the fast engine's .* decoder. capturing:RuntimeWarning"),
]
CUDA = torch.device("cuda")


def test_cached_recurrence_matches_uncached_on_cuda(tokenizer, task_records):
    lm = make_lm(tokenizer, hidden_size=64).eval()
    lm.model.to(CUDA)
    recs = task_records[:4]
    ids, mask = lm.encode_questions([r.question for r in recs])
    tg, tm = lm.encode_targets(["\n".join(r.steps[2:]) + "\n#### " + r.answer for r in recs])
    ids, mask, tg, tm = (x.to(CUDA) for x in (ids, mask, tg, tm))
    with torch.no_grad():
        cached, _ = lm.target_logprobs(ids, mask, 4, tg, tm)
        ref, _ = uncached_target_logprobs(lm, ids, mask, 4, tg, tm)
    assert cached.device.type == "cuda"
    assert torch.allclose(cached, ref, atol=1e-4), (cached - ref).abs().max()


def test_masks_are_device_independent_and_replay_is_exact_on_cuda(tokenizer, task_records):
    """Masks come from per-row CPU generators, so the CPU and CUDA runs of the same seeds perturb alike;
    on the device, two replays are bit-identical and match the rollout's own log-probs."""
    lm_cpu = make_lm(tokenizer, hidden_size=64).eval()
    lm_gpu = copy.deepcopy(lm_cpu)
    lm_gpu.model.to(CUDA)
    recs = task_records[:4]
    pert = LockedDropout(p=0.3)
    seeds = seeds_for(0, 0, 0, len(recs) * 4)
    kw = dict(group_size=4, n_latent=2, perturbation=pert, seeds=seeds, max_new_tokens=8)
    ro_cpu = collect_rollouts(lm_cpu, recs, **kw)
    ro_gpu = collect_rollouts(lm_gpu, recs, **kw)
    assert ro_cpu.texts == ro_gpu.texts
    assert torch.allclose(ro_cpu.rollout_logp.cpu(), ro_gpu.rollout_logp.cpu(), atol=1e-3)
    rows = torch.arange(seeds.numel())
    rkw = dict(n_latent=2, perturbation=pert, seeds=seeds, temperature=0.0)
    with torch.no_grad():
        a, m = replay_logprobs(lm_gpu, ro_gpu, rows, **rkw)
        b, _ = replay_logprobs(lm_gpu, ro_gpu, rows, **rkw)
    assert torch.equal(a, b)
    L = m.shape[1]
    assert torch.allclose(ro_gpu.rollout_logp[:, :L] * m, a, atol=1e-4)


@pytest.mark.parametrize("optimizer", ["adamw", "adamw8bit"])
def test_bf16_grpo_step_on_cuda(sft_checkpoint, optimizer):
    if optimizer == "adamw8bit":
        pytest.importorskip("bitsandbytes")
    from dgrpo.model.latent_lm import LatentLM

    cfg = tiny_config(
        **{
            "perturbation.p": "0.3",
            "grpo.filter": "false",
            "grpo.optimizer": optimizer,
            "grpo.prompts_per_step": "8",
            "grpo.warmup_steps": "0",
            "grpo.lr": "1e-3",
            "model.dtype": "bfloat16",
        }
    )
    lm = LatentLM.from_pretrained(sft_checkpoint, dtype=torch.bfloat16, device=CUDA)
    before = [p.detach().clone() for p in lm.model.parameters()]
    tr = GRPOTrainer(lm, cfg, generate_split(cfg.task, "train"))
    if optimizer == "adamw8bit":
        assert type(tr.opt).__module__.startswith("bitsandbytes")
    for _ in range(2):
        m = tr.step()
        assert m["skipped"] == 0 and torch.isfinite(torch.tensor(m["grad_norm"]))
        assert (
            m["logp_replay_maxdiff"] < 0.1
        )  # bf16: rollout and replay run the same kernels, up to batch-shape effects
    assert all(p.dtype == torch.bfloat16 and p.device.type == "cuda" for p in lm.model.parameters())
    assert any(not torch.equal(b, p) for b, p in zip(before, lm.model.parameters()))


def test_8bit_optimizer_steps_without_per_parameter_syncs_give_the_same_weights(monkeypatch):
    """bitsandbytes' AdamW8bit with its device synchronisation after each parameter turned off
    (``without_per_parameter_syncs``, the trainer's step): the same weights, bit for bit, and no wait."""
    bnb = pytest.importorskip("bitsandbytes")
    from dgrpo.training.grpo import without_per_parameter_syncs

    waits, synchronize = [], torch.cuda.synchronize
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: (waits.append(1), synchronize(*a))[1])
    torch.manual_seed(0)
    params = [torch.randn(n, 256, device=CUDA, dtype=torch.bfloat16) for n in (512, 1024, 64)]
    runs, counts = [], []
    for off in (False, True):
        ps = [torch.nn.Parameter(p.clone()) for p in params]
        opt = bnb.optim.AdamW8bit(ps, lr=1e-2)
        waits.clear()
        for k in range(3):
            for i, p in enumerate(ps):
                p.grad = torch.sin(params[i].float() * (k + 1)).to(p.dtype)
            with without_per_parameter_syncs(opt) if off else contextlib.nullcontext():
                opt.step()
        runs.append([p.detach().clone() for p in ps])
        counts.append(len(waits))
    assert all(torch.equal(a, b) for a, b in zip(*runs, strict=True))
    assert counts[0] >= 9 and counts[1] == 0, counts


def _rollouts(lm, ids, mask, seeds, fast, perturb_answer=True, **kw):
    from dgrpo.model.fixed_shape import fixed_shape_generate

    pert = LockedDropout(p=0.3, sites=["attn", "mlp"], perturb_answer=perturb_answer)
    with torch.no_grad(), pert.bind(lm, seeds) as pb:
        if fast:
            return fixed_shape_generate(lm, ids, mask, 3, perturbation=pb, capture=True, **kw)
        return lm.generate(ids, mask, 3, perturbation=pb, **kw)


def test_captured_rollouts_equal_eager_in_fp32_and_replay_bit_identically(tokenizer, task_records):
    """The fast engine's CUDA graphs (one per phase, replayed every step) give eager's answers and log-probs in fp32;
    two captured runs of the same seeds are bit-identical."""
    lm = make_lm(tokenizer, hidden_size=64).eval()
    lm.model.to(CUDA)
    ids, mask = (x.to(CUDA) for x in lm.encode_questions([r.question for r in task_records[:16]]))
    seeds = seeds_for(0, 0, 0, 16)
    eager = _rollouts(lm, ids, mask, seeds, False, max_new_tokens=16)
    fast = [_rollouts(lm, ids, mask, seeds, True, max_new_tokens=16) for _ in range(2)]
    assert torch.equal(fast[0].tokens, fast[1].tokens) and torch.equal(fast[0].logprobs, fast[1].logprobs)
    assert torch.equal(eager.tokens, fast[0].tokens) and torch.equal(eager.mask, fast[0].mask)
    assert torch.allclose(eager.logprobs, fast[0].logprobs, atol=1e-4, rtol=0)


def test_captured_answer_steps_honour_perturb_answer_and_are_not_replayed_for_the_other_setting(
    tokenizer, task_records
):
    """``perturb_answer=False``: the answer step's graph is captured with what the hooks do in that phase (nothing),
    so captured rollouts give the eager ones; a decoder kept for one setting is not replayed for the other (its
    answer graph would add the noise, or leave it out)."""
    lm = make_lm(tokenizer, hidden_size=64).eval()
    lm.model.to(CUDA)
    ids, mask = (x.to(CUDA) for x in lm.encode_questions([r.question for r in task_records[:16]]))
    seeds = seeds_for(0, 0, 0, 16)
    runs = {}
    for perturb_answer in (False, True, False):
        eager = _rollouts(lm, ids, mask, seeds, False, perturb_answer, max_new_tokens=16)
        fast = _rollouts(lm, ids, mask, seeds, True, perturb_answer, max_new_tokens=16, keep=True)
        assert torch.equal(eager.tokens, fast.tokens) and torch.equal(eager.mask, fast.mask)
        assert torch.allclose(eager.logprobs, fast.logprobs, atol=1e-4, rtol=0)
        runs[perturb_answer] = eager.logprobs
    quiet, noisy = runs[False], runs[True]
    assert quiet.shape != noisy.shape or not torch.allclose(quiet, noisy, atol=1e-3)  # (the answer's noise matters)


def test_captured_reference_scoring_equals_eager_in_fp32(tokenizer, task_records):
    """The fast engine's reference scoring (latent steps captured as a graph, then the answer's call over the static
    cache) gives ``target_logprobs``' log-probs in fp32, the first run (warm-up, capture) and the second (capture at
    once: the same step ran in this process) alike."""
    from dgrpo.model.fixed_shape import fixed_shape_target_logprobs

    lm = make_lm(tokenizer, hidden_size=64).eval()
    lm.model.to(CUDA)
    ids, mask = (x.to(CUDA) for x in lm.encode_questions([r.question for r in task_records[:16]]))
    gen = _rollouts(lm, ids, mask, seeds_for(0, 0, 0, 16), True, max_new_tokens=16)
    pert = LockedDropout(p=0.3, sites=["attn", "mlp"])
    with torch.no_grad(), pert.bind(lm, seeds_for(0, 0, 0, 16)) as pb:
        kw = dict(perturbation=pb, end_with_targets=True)
        eager, _ = lm.target_logprobs(ids, mask, 3, gen.tokens, gen.mask, **kw)
        fast = [
            fixed_shape_target_logprobs(lm, ids, mask, 3, gen.tokens, gen.mask, perturbation=pb, capture=True)
            for _ in range(2)
        ]
    assert torch.equal(fast[0], fast[1])
    assert torch.allclose(eager, fast[0], atol=1e-4, rtol=0)


def test_a_kept_captured_reference_decoder_scores_smaller_batches_padded(tokenizer, task_records):
    """Kept and captured, the reference's decoder runs a batch of fewer rows padded to its own (the group filter's
    case): one decoder for 16, 6 and 11 rows, each batch's log-probs those of eager scoring (fp32)."""
    from dgrpo.model.fixed_shape import fixed_shape_target_logprobs

    lm = make_lm(tokenizer, hidden_size=64).eval()
    lm.model.to(CUDA)
    ids, mask = (x.to(CUDA) for x in lm.encode_questions([r.question for r in task_records[:16]]))
    gen = _rollouts(lm, ids, mask, seeds_for(0, 0, 0, 16), True, max_new_tokens=16)
    pert = LockedDropout(p=0.3, sites=["attn", "mlp"])
    decoders = []
    for rows in (torch.arange(16), torch.tensor([3, 0, 9, 12, 5, 1]), torch.arange(11) + 5):
        r = rows.to(CUDA)
        with torch.no_grad(), pert.bind(lm, seeds_for(0, 0, 0, 16)[rows]) as pb:
            eager, _ = lm.target_logprobs(
                ids[r], mask[r], 3, gen.tokens[r], gen.mask[r], perturbation=pb, end_with_targets=True
            )
            kw = dict(perturbation=pb, capture=True, keep=True, min_rows=16)
            fast = fixed_shape_target_logprobs(lm, ids[r], mask[r], 3, gen.tokens[r], gen.mask[r], **kw)
        assert torch.allclose(eager, fast, atol=1e-4, rtol=0)
        decoders.append(lm.kept_decoders["score"][1])
    assert all(d is decoders[0] for d in decoders) and set(decoders[0].graphs) == {"latent"}


def test_a_kept_captured_rollout_decoder_decodes_a_smaller_last_batch_padded(tokenizer, task_records):
    """Kept and captured, the rollout decoder runs a batch of fewer rows padded to its own (a step's last batch):
    one decoder for 16 then 6 rows, eager's answers and log-probs for each (fp32)."""
    lm = make_lm(tokenizer, hidden_size=64).eval()
    lm.model.to(CUDA)
    ids, mask = (x.to(CUDA) for x in lm.encode_questions([r.question for r in task_records[:16]]))
    decoders = []
    for rows in (torch.arange(16), torch.arange(6) + 10):
        r, seeds = rows.to(CUDA), seeds_for(0, 0, 0, 16)[rows]
        eager = _rollouts(lm, ids[r], mask[r], seeds, False, max_new_tokens=16)
        fast = _rollouts(lm, ids[r], mask[r], seeds, True, max_new_tokens=16, keep=True)
        assert torch.equal(eager.tokens, fast.tokens) and torch.equal(eager.mask, fast.mask)
        assert torch.allclose(eager.logprobs, fast.logprobs, atol=1e-4, rtol=0)
        decoders.append(lm.kept_decoders["generate"][1])
    assert decoders[0] is decoders[1] and decoders[0].mask.shape[0] == 16


def test_rollout_batches_reuse_one_graph_pool(tokenizer, task_records):
    """Every rollout batch captures its graphs into the device's one pool (``fixed_shape.shared_pool``): after the
    first batches, more of them reserve no more memory, and their answers stay bit-identical."""
    lm = make_lm(tokenizer, hidden_size=64).eval()
    lm.model.to(CUDA)
    ids, mask = (x.to(CUDA) for x in lm.encode_questions([r.question for r in task_records[:16]]))
    seeds = seeds_for(0, 0, 0, 16)
    runs = [_rollouts(lm, ids, mask, seeds, True, max_new_tokens=16) for _ in range(3)]
    torch.cuda.synchronize()
    reserved = torch.cuda.memory_reserved()
    runs += [_rollouts(lm, ids, mask, seeds, True, max_new_tokens=16) for _ in range(5)]
    torch.cuda.synchronize()
    assert torch.cuda.memory_reserved() == reserved
    assert all(torch.equal(r.tokens, runs[0].tokens) and torch.equal(r.logprobs, runs[0].logprobs) for r in runs)


def test_a_kept_decoder_captures_once_and_later_batches_replay_its_graphs(tokenizer, task_records):
    """``keep`` (grpo.keep_graphs): batches of one shape (prompts of other widths within one column bucket, other
    seeds) replay the first batch's graphs, their masks copied into the tensors the graphs read: each batch gets the
    answers and log-probs (fp32) of a decoder captured for it alone, and the graphs are captured once."""
    lm = make_lm(tokenizer, hidden_size=64).eval()
    lm.model.to(CUDA)
    graphs, widths = [], set()
    for b in range(3):
        records = task_records[16 * b : 16 * b + 16]
        questions = [r.question[: 26 + 6 * (2, 0, 1)[b] + 3 * (i % 2)] for i, r in enumerate(records)]
        ids, mask = (x.to(CUDA) for x in lm.encode_questions(questions))
        widths.add(ids.shape[1])
        seeds = seeds_for(0, b, 0, 16)
        alone = _rollouts(lm, ids, mask, seeds, True, max_new_tokens=16)
        kept = _rollouts(lm, ids, mask, seeds, True, max_new_tokens=16, keep=True)
        assert torch.equal(alone.tokens, kept.tokens) and torch.equal(alone.mask, kept.mask)
        assert torch.allclose(alone.logprobs, kept.logprobs, atol=1e-4, rtol=0)
        graphs.append(dict(lm.kept_decoders["generate"][1].graphs))
    assert len(widths) == 3 and set(graphs[0]) == {"latent", "answer"}
    assert graphs[0] == graphs[1] == graphs[2]  # the same graph objects: captured once


def test_grpo_steps_with_kept_graphs_equal_those_capturing_each_batch(tokenizer, task_records):
    """Three fp32 trainer steps on the fast engine: the graphs kept from step to step read the weights each update
    left (in place) and the step's masks, so rewards, losses and gradients equal a run that captures every batch."""
    rows = [_fast_engine_steps(tokenizer, task_records, [f"grpo.keep_graphs={keep}"]) for keep in ("true", "false")]
    _assert_same_steps(*rows)


def _fast_engine_steps(tokenizer, task_records, overrides):
    """Three fp32 trainer steps on the fast engine on the GPU (sampled rollouts, the code-parity reward)."""
    from test_fixed_shape import code_parity

    from dgrpo.config import Config, load_config

    sets = ["grpo.group_size=4", "grpo.temperature=1", "grpo.engine=fast", *overrides]
    lm = make_lm(tokenizer, hidden_size=64)
    lm.model.to(CUDA)
    trainer = GRPOTrainer(lm, load_config(Config, "tiny.yaml", sets), task_records, reward_fn=code_parity)
    return [trainer.step() for _ in range(3)]


def _assert_same_steps(first, second):
    """The same rewards, and losses and gradient norms up to the rounding of other kernels; some step updated."""
    assert any(m["skipped"] == 0 for m in first)
    for a, b in zip(first, second):
        assert a["reward_mean"] == b["reward_mean"] and a["reward_std"] == b["reward_std"]
        assert a["policy_loss"] == pytest.approx(b["policy_loss"], abs=1e-5)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-3)


def test_the_captured_latent_chain_gives_the_recurrence_log_probs_and_gradients(tokenizer, task_records):
    """``grpo.update_latent_graphs``: the update's latent steps as one captured forward and one captured backward,
    over four batches (prompts of other widths within one column bucket, other seeds, in fp32): the first captures
    the chain (the first shape is kept at once), the other three replay it; each batch's log-probs and weight
    gradients equal the step-by-step recurrence's."""
    from test_fixed_shape import ragged_targets
    from test_latent_chain import assert_close, eager_logprobs, logp_and_grads

    from dgrpo.config import PerturbationConfig
    from dgrpo.model.latent_chain import chained_target_logprobs
    from dgrpo.perturbation import make_perturbation

    lm = make_lm(tokenizer, hidden_size=64)
    lm.model.to(CUDA)
    lm.recompute, lm.recompute_latent_steps = "layer", False
    pert = make_perturbation(PerturbationConfig(kind="locked", p=0.3, sites=["attn", "mlp"]))
    tg, tm = (x.to(CUDA) for x in ragged_targets(lm, 8))
    graphs = []
    for b in range(4):
        questions = [r.question[: 22 + 4 * (2, 0, 1, 2)[b] + i % 3] for i, r in enumerate(task_records[:8])]
        ids, mask = (x.to(CUDA) for x in lm.encode_questions(questions))
        with pert.bind(lm, seeds_for(0, b, 0, 8).to(CUDA)) as pb:
            eager = logp_and_grads(lm, partial(eager_logprobs, lm, ids, mask, 3, tg, tm, perturbation=pb))
            run = partial(chained_target_logprobs, lm, ids, mask, 3, tg, tm, perturbation=pb, capture=True, keep=True)
            chained = logp_and_grads(lm, run)
        assert_close(eager, chained, atol=1e-4)
        chain = lm.kept_decoders["update"][1]
        graphs.append((chain.forward_graph, chain.backward_graph))
    assert all(g == graphs[0] for g in graphs) and graphs[0][0] is not None and not chain.failed


def test_smaller_and_narrower_batches_replay_the_latent_chain_captured_for_a_larger_one(tokenizer, task_records):
    """A captured chain serves a batch of fewer rows and a narrower prompt padded to its shape (the same graphs); a
    wider prompt captures a chain of its width once, which then serves the narrower batches too; each batch's
    log-probs and weight gradients equal the step-by-step recurrence's (fp32)."""
    from test_fixed_shape import ragged_targets
    from test_latent_chain import assert_close, eager_logprobs, logp_and_grads

    from dgrpo.config import PerturbationConfig
    from dgrpo.model.latent_chain import chained_target_logprobs
    from dgrpo.perturbation import make_perturbation

    lm = make_lm(tokenizer, hidden_size=64)
    lm.model.to(CUDA)
    lm.recompute, lm.recompute_latent_steps = "layer", False
    pert = make_perturbation(PerturbationConfig(kind="locked", p=0.3, sites=["attn", "mlp"]))
    short = [r.question[:12] for r in task_records]
    wide = [r.question + " " + r.question for r in task_records]
    graphs = []
    for b, questions in enumerate([short[:8], short[8:13], wide[:6], short[:3]]):
        ids, mask = (x.to(CUDA) for x in lm.encode_questions(questions))
        tg, tm = (x.to(CUDA) for x in ragged_targets(lm, len(questions)))
        with pert.bind(lm, seeds_for(0, b, 0, len(questions)).to(CUDA)) as pb:
            eager = logp_and_grads(lm, partial(eager_logprobs, lm, ids, mask, 3, tg, tm, perturbation=pb))
            run = partial(chained_target_logprobs, lm, ids, mask, 3, tg, tm, perturbation=pb, capture=True, keep=True)
            chained = logp_and_grads(lm, run)
        assert_close(eager, chained, atol=1e-4)
        chain = lm.kept_decoders["update"][1]
        graphs.append(chain.forward_graph)
        assert chain.shape[0] == 8 and not chain.failed
    assert graphs[0] is graphs[1] is not graphs[2] and graphs[2] is graphs[3] and graphs[0] is not None


@pytest.mark.filterwarnings("error:grpo.update_latent_graphs. capturing:RuntimeWarning")  # (its capture must not fail)
def test_grpo_steps_with_the_captured_latent_chain_equal_those_without(tokenizer, task_records):
    """Three fp32 trainer steps on the fast engine, micro-batches of 6 rows and fewer (the filter keeps groups of 4
    rows; a smaller one runs padded to the captured chain's 6): with the update's latent steps as the kept, captured
    chain (reading the weights each update left) the rewards, losses and gradient norms are those of the
    step-by-step recurrence."""
    sets = ["grpo.micro_batch_size=6", "grpo.n_latent=3"]
    rows = [
        _fast_engine_steps(tokenizer, task_records, [*sets, f"grpo.update_latent_graphs={chain}"])
        for chain in ("true", "false")
    ]
    _assert_same_steps(*rows)


def test_pinning_prefetched_masks_leaves_a_graph_capture_under_way_intact(tokenizer):
    """The prefetch thread pins the next step's masks (``cudaHostAlloc`` for a new size) while the main thread may be
    capturing a graph: ``CAPTURE_LOCK`` keeps the two apart, so every capture ends whole and replays."""
    from dgrpo.bench.capture_probe import capture_repeatedly

    lm = make_lm(tokenizer, hidden_size=64)
    lm.model.to(CUDA)
    pert, x, graphs = LockedDropout(p=0.3, sites=["attn", "mlp"]), torch.randn(256, 256, device=CUDA), []
    for i in range(8):
        pert.prefetch(lm, torch.arange(10_000 * i, 10_000 * i + 64 * 2**i))  # rows doubling: new pinned sizes
        assert pert._prefetch is not None
        drawing = pert._prefetch[1]
        busy = lambda drawing=drawing: not drawing.done() and len(graphs) < 2000  # noqa: E731
        capture_repeatedly(x, busy, graphs)  # all the while the thread draws and pins
        pert._await_prefetch()
    for graph in graphs:
        graph.replay()
    torch.cuda.synchronize()
    assert graphs


def test_the_prompts_forward_over_a_static_cache_waits_for_no_write_offset(tokenizer, task_records):
    """The fast engine's prefill: transformers' static cache would copy each layer's write offset to the device at
    its first update (a host wait per layer); ``LatentLM.new_cache`` makes them on the device beforehand. And its
    mask builder would read the padding back; the call gets a prebuilt 4-d mask."""
    lm = make_lm(tokenizer, hidden_size=64).eval()
    lm.model.to(CUDA)
    ids, mask = (x.to(CUDA) for x in lm.encode_questions([r.question for r in task_records[:8]]))
    from dgrpo.bench.step_profile import host_syncs

    torch.cuda.synchronize()
    with torch.no_grad():
        waits = host_syncs(lambda: lm.prefill(ids, mask, 0, markers=False, cache_len=ids.shape[1] + 8))
    assert not any("cache_utils" in site or "masking_utils" in site for site in waits["host_sync_sites"]), waits


@pytest.mark.parametrize("q_len, columns", [(1, 96), (1, 70), (5, 96)])
def test_the_additive_mask_gives_sdpa_the_boolean_masks_results_on_cuda(q_len, columns):
    """In bf16 on the device, at Qwen2.5-1.5B's heads (12 query heads over 2 key/value heads, 128 wide), SDPA given
    the additive mask (built once per forward call) gives what it gives for the boolean one (which it converts in
    every layer): the forward bit for bit, the gradients up to the order of accumulation (the memory-efficient
    kernel's backward is not deterministic run to run); the one-position step (its query heads packed per key/value
    head, as Hugging Face packs them) and a several-position call, over aligned and unaligned columns."""
    import torch.nn.functional as F

    from dgrpo.model.attention_mask import additive_mask

    torch.manual_seed(0)
    B, kv, groups, D = 8, 2, 6, 128
    mask = torch.rand(B, 1, q_len, columns, device=CUDA) > 0.3
    mask[..., 0] = True
    if q_len == 1:  # Hugging Face's pack_gqa: [B, 12, 1, D] -> [B, 2, 6, D]; the mask broadcasts over the 6
        q = torch.randn(B, kv, groups, D, device=CUDA, dtype=torch.bfloat16)
        k, v = (torch.randn(B, kv, columns, D, device=CUDA, dtype=torch.bfloat16) for _ in range(2))
    else:  # repeat_kv
        q = torch.randn(B, kv * groups, q_len, D, device=CUDA, dtype=torch.bfloat16)
        k, v = (torch.randn(B, kv * groups, columns, D, device=CUDA, dtype=torch.bfloat16) for _ in range(2))
    out = []
    for m in (mask, additive_mask(mask, torch.bfloat16)):
        qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
        o = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=m)
        out.append((o.detach(), *torch.autograd.grad(o.float().square().sum(), (qq, kk, vv))))
    (o_bool, *g_bool), (o_add, *g_add) = out
    assert torch.equal(o_bool, o_add)
    assert all(torch.allclose(a.float(), b.float(), rtol=1e-2, atol=1e-2) for a, b in zip(g_bool, g_add))


def test_captured_greedy_rollouts_agree_with_eager_in_bf16(sft_checkpoint):
    """bf16 reorders no sum the same way twice across kernels: answers may differ where two tokens nearly tie.
    The issue's bar: >= 99% of rows agree."""
    from dgrpo.model.latent_lm import LatentLM

    lm = LatentLM.from_pretrained(sft_checkpoint, dtype=torch.bfloat16, device=CUDA).eval()
    recs = generate_split(tiny_config().task, "valid")[:64]
    ids, mask = (x.to(CUDA) for x in lm.encode_questions([r.question for r in recs]))
    seeds = seeds_for(0, 0, 0, len(recs))
    eager = _rollouts(lm, ids, mask, seeds, False, max_new_tokens=24)
    fast = _rollouts(lm, ids, mask, seeds, True, max_new_tokens=24)
    agree = [e == f for e, f in zip(lm.decode(eager.tokens, eager.mask), lm.decode(fast.tokens, fast.mask))]
    assert sum(agree) >= 0.99 * len(agree), f"{sum(agree)}/{len(agree)} rows agree"


def test_the_compiled_head_on_cuda_gives_eagers_logprobs_gradients_and_greedy_tokens(tokenizer, task_records):
    """model.compile_head's fused reductions (Triton) on a bf16 model: teacher-forced log-probs and weight gradients
    as eager's fp32 log-softmax of the same bf16 logits gives them (to float rounding), in one chunk and in the
    head's checkpointed chunks, and the captured rollouts' greedy tokens identical (the argmax is eager's)."""
    from dgrpo.model.head_stats import HeadStats

    lm = make_lm(tokenizer, hidden_size=64).to(CUDA, torch.bfloat16).eval()
    recs = task_records[:8]
    ids, mask = (x.to(CUDA) for x in lm.encode_questions([r.question for r in recs]))
    tg, tm = (x.to(CUDA) for x in lm.encode_targets(["\n".join(r.steps[2:]) + "\n#### " + r.answer for r in recs]))
    seeds = seeds_for(0, 0, 0, len(recs))
    out = {}
    for form, stats in (("eager", HeadStats()), ("compiled", HeadStats(compiled=True))):
        lm.head_stats = stats
        for chunk in (1 << 26, 3 * 8 * len(lm.tokenizer)):
            lm.logit_chunk_elems = chunk
            out[form, chunk] = scored_with_grad(lm, ids, mask, 3, tg, tm)
        out[form, "gen"] = _rollouts(lm, ids, mask, seeds, True, max_new_tokens=16, with_entropy=True)
        assert stats.compiled == (form == "compiled")  # (no fall-back to eager on the way)
    for chunk in (1 << 26, 3 * 8 * len(lm.tokenizer)):
        (lp0, g0), (lp1, g1) = out["eager", chunk], out["compiled", chunk]
        assert torch.allclose(lp0, lp1, atol=1e-4), (lp0 - lp1).abs().max()
        assert torch.allclose(g0, g1, atol=2e-2 * g0.abs().max().item()), (g0 - g1).abs().max()
    e, c = out["eager", "gen"], out["compiled", "gen"]
    assert torch.equal(e.tokens, c.tokens) and torch.allclose(e.logprobs, c.logprobs, atol=1e-4)
    assert torch.allclose(e.entropy, c.entropy, atol=1e-4)


def test_packed_gqa_attention_on_cuda_gives_sdpas_logprobs_gradients_and_captured_rollouts(tokenizer, task_records):
    """model.pack_gqa on CUDA (the additive masks, the masked SDPA kernels with 2 key/value heads and packed query
    rows): fp32 log-probs and gradients as Hugging Face's SDPA attention gives them (1e-4), and the captured
    rollouts' tokens identical; in bf16 the log-probs close (5e-2) and all rollout rows but at most one the same."""
    from dgrpo.model.gqa_attention import use_packed_gqa

    recs = task_records[:16]
    for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 5e-2)):
        lm = make_lm(tokenizer, hidden_size=64).to(CUDA, dtype).eval()
        ids, mask = (x.to(CUDA) for x in lm.encode_questions([r.question for r in recs]))
        targets = ["\n".join(r.steps[2:]) + "\n#### " + r.answer for r in recs]
        tg, tm = (x.to(CUDA) for x in lm.encode_targets(targets))
        seeds = seeds_for(0, 0, 0, len(recs))
        out = {}
        for on in (False, True):
            assert use_packed_gqa(lm.model, on) is on
            lp, grad = scored_with_grad(lm, ids, mask, 3, tg, tm)
            out[on] = (lp, grad, _rollouts(lm, ids, mask, seeds, True, max_new_tokens=16))
        (lp0, g0, r0), (lp1, g1, r1) = out[False], out[True]
        assert torch.allclose(lp0, lp1, atol=tol), (dtype, (lp0 - lp1).abs().max())
        assert torch.allclose(g0, g1, atol=tol * max(1.0, g0.abs().max().item())), (dtype, (g0 - g1).abs().max())
        texts = [lm.decode(r.tokens, r.mask) for r in (r0, r1)]
        same = sum(a == b for a, b in zip(*texts)) / len(recs)
        # (bf16: a near-tie of this random-weight model's logits may flip a row; >= 0.99 of 16 rows demanded all)
        assert same == 1.0 if dtype == torch.float32 else same >= 15 / 16, (dtype, same)


def test_layer_recomputation_on_cuda_matches_full_backprop_with_a_lower_peak(tokenizer, task_records):
    """``grpo.recompute_granularity``: per layer and per call, the gradients of full backprop under locked dropout
    (fp32); the peak allocated during the step is lowest per layer (it rebuilds one layer at a time in backward)."""
    lm = make_lm(tokenizer, hidden_size=256, num_layers=8, intermediate_size=1024).eval()
    lm.model.to(CUDA)
    recs = task_records[:48]
    ids, mask = (x.to(CUDA) for x in lm.encode_questions([r.question for r in recs]))
    targets = ["\n".join(r.steps) + "\n#### " + r.answer for r in recs]
    tg, tm = (x.to(CUDA) for x in lm.encode_targets(targets))
    pert, seeds = LockedDropout(p=0.2, sites=["attn", "mlp"]), seeds_for(0, 0, 0, len(recs))
    out = {}
    for recompute in (False, "call", "layer"):
        lm.recompute = recompute
        lm.model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        with pert.bind(lm, seeds) as pb:
            lp, _ = lm.target_logprobs(ids, mask, 4, tg, tm, perturbation=pb)
        (-(lp * tm).sum()).backward()
        torch.cuda.synchronize()
        grads = [p.grad.clone() for p in lm.model.parameters()]
        out[recompute] = (lp.detach(), grads, torch.cuda.max_memory_allocated() - base)
    lm.recompute = False
    for arm in ("call", "layer"):
        assert torch.allclose(out[False][0], out[arm][0], atol=1e-5, rtol=0)
        for a, b in zip(out[False][1], out[arm][1]):
            assert torch.allclose(a, b, atol=1e-5, rtol=1e-4), (arm, (a - b).abs().max())
    peaks = {k: v[2] for k, v in out.items()}
    assert peaks["layer"] < peaks["call"] < peaks[False], peaks


def test_the_latent_steps_keep_their_keys_and_values_once_on_cuda(tokenizer, task_records):
    """dgrpo.model.kv_prefixes on the device: the update's replay (bf16, per-layer recomputation with the latent steps
    keeping their activations, as the recipe runs it uncaptured) gives the same log-probs and gradients bit for bit,
    and what it holds between its forward and its backward is smaller by the prompt's columns kept per step."""
    lm = make_lm(tokenizer, hidden_size=256, num_layers=4, intermediate_size=512).eval()
    lm.model.to(CUDA, torch.bfloat16)
    lm.recompute, lm.recompute_latent_steps = "layer", False
    recs = task_records[:32]
    ids, mask = (x.to(CUDA) for x in lm.encode_questions([r.question for r in recs]))
    tg, tm = (x.to(CUDA) for x in lm.encode_targets(["\n".join(r.steps) + "\n#### " + r.answer for r in recs]))
    pert, seeds, T = LockedDropout(p=0.2, sites=["attn", "mlp"]), seeds_for(0, 0, 0, len(recs)), 6
    out = {}
    for once in (False, True):
        lm.save_kv_once = once
        lm.model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        with pert.bind(lm, seeds) as pb:
            lp, _ = lm.target_logprobs(ids, mask, T, tg, tm, perturbation=pb, end_with_targets=True)
        torch.cuda.synchronize()
        held = torch.cuda.memory_allocated() - base
        (-(lp.float() * tm).sum()).backward()
        out[once] = (lp.detach(), [p.grad.clone() for p in lm.model.parameters()], held)
    lm.save_kv_once = True
    assert torch.equal(out[False][0], out[True][0])
    assert all(torch.equal(a, b) for a, b in zip(out[False][1], out[True][1]))
    B, P = ids.shape
    fewer = sum(P + t for t in range(1, T)) * lm.model.config.num_hidden_layers * kv_column_bytes(lm, B)
    assert out[False][2] - out[True][2] >= 0.9 * fewer, (out[False][2], out[True][2], fewer)


def test_compiled_layers_on_cuda_match_eager_and_train_in_bf16(tokenizer, task_records, sft_checkpoint):
    """``model.compile``: inductor's layer step gives the eager layers' log-probs and gradients under locked dropout
    with layer recomputation (fp32), and two bf16 GRPO steps (fast-engine rollouts, compiled update) train."""
    from dgrpo.model.compiled_layers import CompiledLayers
    from dgrpo.model.latent_lm import LatentLM

    lm = make_lm(tokenizer, hidden_size=256, num_layers=4, intermediate_size=1024).eval()
    lm.model.to(CUDA)
    recs = task_records[:16]
    ids, mask = (x.to(CUDA) for x in lm.encode_questions([r.question for r in recs]))
    tg, tm = (x.to(CUDA) for x in lm.encode_targets(["\n".join(r.steps) + "\n#### " + r.answer for r in recs]))
    pert, seeds = LockedDropout(p=0.2, sites=["attn", "mlp"]), seeds_for(0, 0, 0, len(recs))
    lm.recompute = "layer"
    out = []
    for compiled in (None, CompiledLayers(lm.model)):
        lm.compiled_layers = compiled
        lm.model.zero_grad(set_to_none=True)
        with pert.bind(lm, seeds) as pb:
            lp, _ = lm.target_logprobs(ids, mask, 4, tg, tm, perturbation=pb)
        (-(lp * tm).sum()).backward()
        out.append((lp.detach(), [p.grad.clone() for p in lm.model.parameters()]))
    assert torch.allclose(out[0][0], out[1][0], atol=1e-4, rtol=0), (out[0][0] - out[1][0]).abs().max()
    for a, b in zip(out[0][1], out[1][1]):
        assert torch.allclose(a, b, atol=1e-4, rtol=1e-3), (a - b).abs().max()
    over = {"model.compile": "true", "model.dtype": "bfloat16", "grpo.filter": "false", "grpo.lr": "1e-3"}
    cfg = tiny_config(**over, **{"perturbation.p": "0.3", "grpo.prompts_per_step": "8", "grpo.warmup_steps": "0"})
    lm = LatentLM.from_pretrained(sft_checkpoint, dtype=torch.bfloat16, device=CUDA)
    tr = GRPOTrainer(lm, cfg, generate_split(cfg.task, "train"))
    for _ in range(2):
        m = tr.step()
        assert m["skipped"] == 0 and torch.isfinite(torch.tensor(m["grad_norm"])) and m["logp_replay_maxdiff"] < 0.1


def test_liger_kernels_keep_logprobs_gradients_and_captured_rollouts(tokenizer, task_records):
    """``model.kernels=liger`` (fused RMSNorm / SwiGLU / rotary): the same log-probs and gradients as Hugging Face's
    modules in fp32, and the fast engine captures the fused layers into its graphs (eager's answers, replay-exact).
    Last in this file: Liger's rotary function stays swapped for the process."""
    pytest.importorskip("liger_kernel")
    from dgrpo.model.kernels import apply_kernels

    hf = make_lm(tokenizer, hidden_size=64).eval()
    hf.model.to(CUDA)
    fused = copy.deepcopy(hf)
    assert apply_kernels(fused.model, "liger")
    assert fused.model.model.norm._get_name() == "LigerRMSNorm"
    recs = task_records[:8]
    ids, mask = (x.to(CUDA) for x in hf.encode_questions([r.question for r in recs]))
    tg, tm = (x.to(CUDA) for x in hf.encode_targets([r.answer for r in recs]))
    grads = []
    for lm in (hf, fused):
        lp, _ = lm.target_logprobs(ids, mask, 3, tg, tm)
        (-(lp * tm).sum()).backward()
        grads.append((lp.detach(), [p.grad.clone() for p in lm.model.parameters()]))
    assert torch.allclose(grads[0][0], grads[1][0], atol=1e-4), (grads[0][0] - grads[1][0]).abs().max()
    for a, b in zip(grads[0][1], grads[1][1]):
        assert torch.allclose(a, b, atol=1e-4, rtol=1e-3), (a - b).abs().max()
    seeds = seeds_for(0, 0, 0, len(recs))
    eager = _rollouts(fused, ids, mask, seeds, False, max_new_tokens=12)
    fast = [_rollouts(fused, ids, mask, seeds, True, max_new_tokens=12) for _ in range(2)]
    assert torch.equal(fast[0].tokens, fast[1].tokens) and torch.equal(fast[0].logprobs, fast[1].logprobs)
    assert torch.equal(eager.tokens, fast[0].tokens)
