"""Perturbations: per-row seeded noise, exact mask replay, identity across micro-batches."""

import os
import time

import pytest
import torch

from dgrpo.perturbation import GaussianNoise, LockedDropout, NativeDropout, NoPerturbation, as_seeds, seeds_for
from dgrpo.perturbation.locked import locked_masks
from dgrpo.training.rollouts import collect_rollouts, replay_logprobs

from conftest import make_lm

T = 2


def rollouts(lm, records, pert, K=4, n=3, seed=0, **kw):
    seeds = seeds_for(seed, 0, 0, n * K)
    return collect_rollouts(
        lm, records[:n], group_size=K, n_latent=T, perturbation=pert, seeds=seeds, max_new_tokens=10, **kw
    )


def test_locked_mask_rows_depend_only_on_their_seed():
    s = torch.tensor([11, 22, 33, 44])
    m = locked_masks(s, 3, 64, 0.3)
    m2 = locked_masks(s[[3, 1]], 3, 64, 0.3)
    assert torch.equal(m[:, [3, 1]], m2)
    assert not torch.equal(m[:, 0], m[:, 1])
    vals = m.unique()
    assert vals.numel() == 2 and vals[0].item() == 0.0 and vals[1].item() == pytest.approx(1 / 0.7)
    big = locked_masks(torch.arange(200), 1, 512, 0.3)
    assert abs((big == 0).float().mean().item() - 0.3) < 0.01


def test_seeds_distinct_across_steps_and_ranks_and_reproducible():
    a, b, c = seeds_for(0, 5, 0, 64), seeds_for(0, 5, 1, 64), seeds_for(0, 6, 0, 64)
    assert torch.equal(a, seeds_for(0, 5, 0, 64))
    assert len(set(a.tolist()) | set(b.tolist()) | set(c.tolist())) == 192
    assert a.dtype == torch.int64 and a.element_size() == 8  # 8 bytes stored per rollout


def test_seeds_of_one_call_never_share_a_mask():
    """PyTorch's CPU generator reads a seed's low 32 bits: two of the 62-bit seeds that agreed there drew one mask
    (rows 21192 and 26565 of these 100000; a 3000-step run of 512 rows a step had such a pair with probability 0.09).
    Such a seed is drawn again; seeds i < n are the same whatever n (a rank's share of the rows)."""
    seeds = seeds_for(0, 5, 0, 100_000)
    assert len(set((seeds & 0xFFFFFFFF).tolist())) == seeds.numel()
    assert torch.equal(seeds_for(0, 5, 0, 60_000), seeds[:60_000])
    assert 0 <= int(seeds.min()) and int(seeds.max()) < 2**62
    masks = locked_masks(seeds[[21192, 26565]], 1, 64, 0.5)
    assert not torch.equal(masks[:, 0], masks[:, 1])


@pytest.mark.parametrize(
    "pert",
    [
        LockedDropout(p=0.3, sites=["attn", "mlp"]),
        LockedDropout(p=0.3, sites=["residual"], layers="-1:"),
        GaussianNoise(sigma=0.3),
        GaussianNoise(sigma=0.05, target="weights"),
    ],
    ids=["locked-attn-mlp", "locked-residual-last", "gaussian-act", "gaussian-weights"],
)
def test_replay_identity_batched(tokenizer, task_records, pert):
    lm = make_lm(tokenizer, "qwen2").eval()
    ro = rollouts(lm, task_records, pert)
    rows = torch.arange(ro.seeds.numel())
    kw = dict(n_latent=T, perturbation=pert, temperature=0.0)
    with torch.no_grad():
        a, m = replay_logprobs(lm, ro, rows, seeds=ro.seeds, **kw)
        b, _ = replay_logprobs(lm, ro, rows, seeds=ro.seeds, **kw)
    assert torch.equal(a, b)  # two replays of the same seeds in the same micro-batch: bit-identical
    g, _ = replay_logprobs(lm, ro, rows, seeds=ro.seeds, **kw)  # with grad, as in the update at theta = theta_old
    assert torch.equal(g.detach(), a)
    assert torch.equal(torch.exp(g.detach() - a), torch.ones_like(a))  # every ratio exactly 1
    # the log-probs recorded while decoding match the teacher-forced replay
    L = m.shape[1]
    assert torch.allclose(ro.rollout_logp[:, :L] * m, a, atol=1e-5)
    # regrouped into other micro-batches: same masks, same log-probs within 1e-6
    with torch.no_grad():
        for part in (rows[::2], rows[1::2], rows[[5, 0, 7]]):
            p, pm = replay_logprobs(lm, ro, part, seeds=ro.seeds[part], **kw)
            n = pm.shape[1]
            assert torch.allclose(p, a[part, :n], atol=1e-6)
        other, _ = replay_logprobs(lm, ro, rows, seeds=ro.seeds + 1, **kw)
    assert not torch.allclose(other, a)  # a different seed gives different log-probs


@pytest.mark.parametrize("engine", ["eager", "fast"])
def test_sampled_rollouts_do_not_depend_on_the_batch_size(tokenizer, task_records, engine):
    """Token sampling draws from each row's own seed: the same rollouts (answers, log-probs) in batches of 512 or
    of 5 rows (``grpo.rollout_batch_size``), and from both engines; other seeds give other answers."""
    lm = make_lm(tokenizer, "qwen2").eval()
    kw = dict(temperature=1.0, engine=engine)
    for pert in (LockedDropout(p=0.1), NoPerturbation()):
        wide = rollouts(lm, task_records, pert, n=4, **kw)
        narrow = rollouts(lm, task_records, pert, n=4, batch_size=5, **kw)
        assert wide.texts == narrow.texts
        n = narrow.tokens.shape[1]
        assert torch.allclose(wide.rollout_logp[:, :n], narrow.rollout_logp, atol=1e-5)
        assert wide.texts == rollouts(lm, task_records, pert, n=4, temperature=1.0).texts  # = the eager engine's
        assert wide.texts != rollouts(lm, task_records, pert, n=4, seed=1, **kw).texts


def test_locked_masks_identical_when_regrouped(tokenizer):
    lm = make_lm(tokenizer, "qwen2")
    pert = LockedDropout(p=0.2, sites=["mlp"])
    s = seeds_for(3, 1, 0, 8)
    whole = pert.bind(lm, s).masks
    part = pert.bind(lm, s[[6, 2]]).masks
    assert torch.equal(whole[:, [6, 2]], part)


def test_native_dropout_replays_one_rollout_at_a_time(tokenizer, task_records):
    lm = make_lm(tokenizer, "qwen2").eval()
    pert = NativeDropout(p=0.3)
    before = torch.random.get_rng_state()
    ro = rollouts(lm, task_records, pert, K=3, n=2)
    assert torch.equal(before, torch.random.get_rng_state())  # the global RNG stream is left as it was
    rows = torch.arange(ro.seeds.numel())
    with torch.no_grad():
        for r in rows.tolist():
            a, m = replay_logprobs(
                lm, ro, torch.tensor([r]), seeds=ro.seeds[[r]], n_latent=T, perturbation=pert, temperature=0.0
            )
            b, _ = replay_logprobs(
                lm, ro, torch.tensor([r]), seeds=ro.seeds[[r]], n_latent=T, perturbation=pert, temperature=0.0
            )
            assert torch.equal(a, b)
            assert torch.allclose(ro.rollout_logp[r, : m.shape[1]] * m[0], a[0], atol=1e-5)
        c, _ = replay_logprobs(lm, ro, rows[:1], seeds=ro.seeds[:1] + 1, n_latent=T, perturbation=pert, temperature=0.0)
        assert not torch.allclose(c, a[:1, : c.shape[1]]) if r == 0 else True
    with pytest.raises(ValueError):
        pert.bind(lm, ro.seeds[:2])
    assert all(not m.training for m in lm.model.modules())  # dropout switched off again afterwards


def test_native_dropout_scoring_needs_stepwise_or_is_refused(tokenizer, task_records):
    """Native dropout draws the answer's masks per forward call: ``target_logprobs`` without ``stepwise=True`` scored
    the answer in one forward, under other masks than its decoding (~0.3 away), without a word. It is refused in one
    line; stepwise scoring replays the decoded log-probs, and an answer left without dropout needs no stepwise."""
    lm = make_lm(tokenizer, "qwen2").eval()
    ids, mask = lm.encode_questions([task_records[0].question])
    seeds = seeds_for(0, 0, 0, 1)
    with torch.no_grad():
        with NativeDropout(p=0.5).bind(lm, seeds) as pb:
            gen = lm.generate(ids, mask, T, max_new_tokens=6, perturbation=pb)
        with NativeDropout(p=0.5).bind(lm, seeds) as pb:
            for kw in ({}, {"end_with_targets": True}):
                with pytest.raises(ValueError, match="draws its noise per forward call.*pass stepwise=True"):
                    lm.target_logprobs(ids, mask, T, gen.tokens, gen.mask, perturbation=pb, **kw)
            logp, _ = lm.target_logprobs(ids, mask, T, gen.tokens, gen.mask, perturbation=pb, stepwise=True)
        assert torch.allclose(logp, gen.logprobs * gen.mask, atol=1e-5)
        with NativeDropout(p=0.5, perturb_answer=False).bind(lm, seeds) as pb:
            assert not pb.needs_stepwise
            lm.target_logprobs(ids, mask, T, gen.tokens, gen.mask, perturbation=pb)
        with LockedDropout(p=0.5).bind(lm, seeds) as pb:
            assert not pb.needs_stepwise


def test_native_dropout_bound_for_one_rollout_refuses_a_batch_of_several(tokenizer, task_records):
    """Native dropout binds one seed, but generate ran it over any batch: two copies of one question decoded under
    two different masks, neither the one its replay alone draws. A batch of more rows than one is refused."""
    lm = make_lm(tokenizer, "qwen2").eval()
    ids, mask = lm.encode_questions([task_records[0].question] * 2)
    with NativeDropout(p=0.5).bind(lm, seeds_for(0, 0, 0, 1)) as pb:
        assert pb.rows == 1
        with pytest.raises(ValueError, match="bound for 1 rows"):
            lm.generate(ids, mask, T, max_new_tokens=2, perturbation=pb)
        lm.generate(ids[:1], mask[:1], T, max_new_tokens=2, perturbation=pb)


def test_native_dropout_actually_perturbs(tokenizer, task_records):
    lm = make_lm(tokenizer, "qwen2").eval()
    ro = rollouts(lm, task_records, NativeDropout(p=0.5), K=4, n=1)
    det = rollouts(lm, task_records, NoPerturbation(), K=4, n=1)
    assert not torch.allclose(ro.rollout_logp, det.rollout_logp)


def test_native_dropout_switches_on_the_attention_dropout_alone(tokenizer, task_records):
    """Native dropout put the whole attention module in train mode, so GPT-2's resid_dropout (its config's
    resid_pdrop, 0.1 in the hub's configs) dropped the attention output too, at a rate no option set: at p = 0 the
    rollouts were still perturbed. Only the attention's own dropout follows p; every mode is restored after."""
    lm = make_lm(tokenizer, "gpt2")
    for block in lm.model.transformer.h:
        block.attn.resid_dropout.p = 0.1  # (as GPT-2's hub configs have it)
    lm.eval()
    ids, mask = lm.encode_questions([task_records[0].question])
    plain = lm.generate(ids, mask, T, max_new_tokens=6)
    with NativeDropout(p=0.0).bind(lm, seeds_for(0, 0, 0, 1)) as pb:
        assert torch.equal(lm.generate(ids, mask, T, max_new_tokens=6, perturbation=pb).logprobs, plain.logprobs)
    with NativeDropout(p=0.5).bind(lm, seeds_for(0, 0, 0, 1)) as pb:
        assert not torch.equal(lm.generate(ids, mask, T, max_new_tokens=6, perturbation=pb).logprobs, plain.logprobs)
    assert all(not m.training for m in lm.model.modules())


def test_none_is_deterministic_and_locked_is_not(tokenizer, task_records):
    lm = make_lm(tokenizer, "qwen2").eval()
    det = rollouts(lm, task_records, NoPerturbation(), K=4)
    for g in range(3):  # the K rollouts of a group are identical (same answer; log-probs up to GEMM row order)
        toks, lps = det.tokens[g * 4 : (g + 1) * 4], det.rollout_logp[g * 4 : (g + 1) * 4]
        assert all(torch.equal(toks[0], toks[k]) for k in range(4))
        assert torch.allclose(lps, lps[:1].expand_as(lps), atol=1e-6)
    loc = rollouts(lm, task_records, LockedDropout(p=0.3), K=4)
    lps = loc.rollout_logp[:4]
    assert not torch.allclose(lps, lps[:1].expand_as(lps), atol=1e-3)


def test_gaussian_weight_noise_does_not_move_with_the_weights(tokenizer):
    """sigma * std(W) was read from the weights of each bind: after an update (a later mini-epoch's replay) and on the
    reference model (its own weights) the same seed gave other noise (6% apart in a probe). The scale is now the
    first bound model's (a trainer's starting weights), held: the noise is the seed's alone from then on."""
    import copy

    lm = make_lm(tokenizer, "qwen2").eval()
    pert, seeds = GaussianNoise(sigma=0.1, sites=["attn", "mlp"], target="weights"), torch.tensor([123, 456])
    first = [n.clone() for n in pert.bind(lm, seeds).noises]
    reference = copy.deepcopy(lm)
    with torch.no_grad():  # the policy moves away from the reference, as in training
        for w in lm.model.parameters():
            w.mul_(1.05).add_(0.002 * torch.randn_like(w))
    for model in (lm, reference):
        assert all(torch.equal(a, b) for a, b in zip(pert.bind(model, seeds).noises, first))
    fresh = GaussianNoise(sigma=0.1, sites=["attn", "mlp"], target="weights").bind(lm, seeds).noises  # another scale
    assert all(not torch.equal(a, b) for a, b in zip(fresh, first))


def test_gaussian_weight_noise_takes_the_sigma_of_each_bind(tokenizer):
    """The held scale was sigma * std(W) at the first bind: a sigma set on the object afterwards (a sweep in a notebook:
    ``pert.sigma = s; evaluate(..., perturbation=pert)``) was ignored for weight noise, while activation noise took it.
    std(W) is held; sigma is the object's at each bind."""
    lm = make_lm(tokenizer, "qwen2").eval()
    pert, seeds = GaussianNoise(sigma=0.1, sites=["mlp"], target="weights"), torch.tensor([123, 456])
    first = [n.clone() for n in pert.bind(lm, seeds).noises]
    pert.sigma = 0.2
    assert all(torch.allclose(n, 2 * a) for a, n in zip(first, pert.bind(lm, seeds).noises))
    pert.sigma = 0.1
    assert all(torch.equal(n, a) for a, n in zip(first, pert.bind(lm, seeds).noises))


def test_gaussian_weight_noise_of_one_site_is_not_another_rows_at_another_site(tokenizer):
    """Site k's generator was seeded with ``seed + 7919 * (k + 1)``: the row of seed s at site 1 drew exactly the
    noise of the row of seed s + 7919 at site 0 (two rollouts sharing noise). A site's seed is now a hash of both."""
    lm = make_lm(tokenizer, "qwen2").eval()
    pert = GaussianNoise(sigma=0.1, sites=["mlp"], layers="0:2", target="weights")  # two sites of one shape
    noises = pert.bind(lm, torch.tensor([1000, 1000 + 7919])).noises
    site1_row0 = noises[1][0] / noises[1][0].std()
    site0_row1 = noises[0][1] / noises[0][1].std()
    corr = (site1_row0 * site0_row1).mean().item()
    assert abs(corr) < 0.1, corr  # independent draws (the shared noise had correlation 1)
    again = pert.bind(lm, torch.tensor([1000 + 7919])).noises  # replay: the same noise in another batch
    assert all(torch.equal(a[0], n[1]) for a, n in zip(again, noises))


@pytest.mark.parametrize("pert", [LockedDropout(p=0.3), GaussianNoise(sigma=0.1)], ids=["locked", "gaussian"])
def test_a_perturbation_bound_for_other_rows_than_the_batch_is_refused(tokenizer, task_records, pert):
    """One seed for four rows would give every row that seed's masks (broadcast), two or six a shape error deep in
    a layer: the batch is checked against the rows the perturbation was bound for."""
    lm = make_lm(tokenizer, "qwen2").eval()
    ids, mask = lm.encode_questions([r.question for r in task_records[:4]])
    for n in (1, 2, 6):
        with pert.bind(lm, seeds_for(0, 0, 0, n)) as pb, pytest.raises(ValueError, match=f"bound for {n} rows"):
            lm.generate(ids, mask, T, max_new_tokens=2, perturbation=pb)
    with pert.bind(lm, seeds_for(0, 0, 0, 4)) as pb:
        assert lm.generate(ids, mask, T, max_new_tokens=2, perturbation=pb).tokens.shape[0] == 4
    with pytest.raises(TypeError, match="takes a list of questions; got one string"):
        lm.encode_questions(task_records[0].question)
    # a None among the questions, no targets, one row's 1-d ids: each failed later, unclearly
    with pytest.raises(TypeError, match="encode_questions: questions must be strings, got NoneType"):
        lm.encode_questions([None, "1+1"])
    with pytest.raises(ValueError, match="encode_targets: no targets"):
        lm.encode_targets([])
    with pytest.raises(ValueError, match=r"prompt ids must be \[batch, length\] .*got shape \(\d+,\)"):
        lm.generate(ids[0], mask[0], T, max_new_tokens=2)


@pytest.mark.parametrize(
    "pert",
    [LockedDropout(p=0.3), GaussianNoise(sigma=0.1), GaussianNoise(sigma=0.1, target="weights")],
    ids=["locked", "gaussian", "gaussian-weights"],
)
def test_a_forward_inside_the_with_block_over_other_rows_is_refused_without_perturbation_given(
    tokenizer, task_records, pert
):
    """Every forward inside a bound perturbation's ``with`` block is perturbed, ``perturbation=`` given or not; a batch
    of another size there was a RuntimeError deep in the hook (size of tensor a (4) must match (2); einsum for weight
    noise), and one seed bound over four rows gave every row its masks silently. Now the one line that the explicit
    ``perturbation=`` gets; the batch bound for still runs, perturbed."""
    lm = make_lm(tokenizer, "qwen2").eval()
    ids, mask = lm.encode_questions([r.question for r in task_records[:4]])
    for n in (1, 2):
        with (
            pert.bind(lm, seeds_for(0, 0, 0, n)),
            pytest.raises(ValueError, match=rf"^the perturbation is bound for {n} rows .*this batch has 4 "),
        ):
            lm.generate(ids, mask, T, max_new_tokens=2)
    with pert.bind(lm, seeds_for(0, 0, 0, 4)) as pb:
        inside = lm.generate(ids, mask, T, max_new_tokens=2).logprobs
        given = lm.generate(ids, mask, T, max_new_tokens=2, perturbation=pb).logprobs
    assert not torch.equal(inside, lm.generate(ids, mask, T, max_new_tokens=2).logprobs)  # (perturbed inside)
    assert given.shape == inside.shape


@pytest.mark.parametrize("pert", [LockedDropout(p=0.9), NativeDropout(p=0.9)], ids=["locked", "native"])
def test_a_perturbation_must_be_bound_and_entered(tokenizer, task_records, pert):
    """``perturbation=pert.bind(lm, seeds)`` written inline (never entered), or a bound one used after its ``with``
    block, ran the unperturbed network at p=0.9 without a word; an unbound one failed deep inside (AttributeError:
    no before_forward). Each is refused at the forward's start, for generate and the update's target_logprobs."""
    lm = make_lm(tokenizer, "qwen2").eval()
    ids, mask = lm.encode_questions([task_records[0].question])
    seeds = seeds_for(0, 0, 0, 1)
    targets = lm.encode_targets(["1"])
    with pytest.raises(TypeError, match=rf"perturbation: {type(pert).__name__} is not bound to a batch \(with pert"):
        lm.generate(ids, mask, T, max_new_tokens=2, perturbation=pert)
    idle = pert.bind(lm, seeds)
    with pytest.raises(RuntimeError, match="the bound perturbation is not active, so it would change nothing"):
        lm.generate(ids, mask, T, max_new_tokens=2, perturbation=idle)
    with pytest.raises(RuntimeError, match="not active"):
        lm.target_logprobs(ids, mask, T, *targets, perturbation=idle)
    with idle as pb:
        lm.generate(ids, mask, T, max_new_tokens=2, perturbation=pb)
    with pytest.raises(RuntimeError, match="not active"):  # after its block
        lm.generate(ids, mask, T, max_new_tokens=2, perturbation=pb)


def test_arguments_that_would_perturb_or_decode_nonsense_are_refused(tokenizer, task_records):
    """A site list given as one string (read letter by letter) or empty (silently the default), a Gaussian sigma that is
    not a finite number >= 0 or a target of another name, a negative latent count or temperature, a mask of another
    shape than its tokens: each is an error where it is passed."""
    for kind in (LockedDropout, GaussianNoise):
        for sites in ("mlp", [], ["mlp", "mlp"]):
            with pytest.raises(ValueError, match="sites must be a non-empty list of distinct site names"):
                kind(sites=sites)
        assert kind().sites == ["mlp"] and kind(sites=("attn",)).sites == ["attn"]
        said = r"^sites: unknown site name\(s\) 'bogus'; the sites are attn, mlp, residual$"
        with pytest.raises(ValueError, match=said):
            kind(sites=["mlp", "bogus"])  # (built without a word, it failed at the first bind)
    for sigma in (float("nan"), float("inf"), -0.1):  # NaN noise: every log-prob NaN
        with pytest.raises(ValueError, match="sigma must be a finite number >= 0"):
            GaussianNoise(sigma=sigma)
    with pytest.raises(ValueError, match="target must be one of activations, weights"):
        GaussianNoise(target="weight")  # (was weight noise: any word but "activations" took that branch)
    lm = make_lm(tokenizer, "qwen2").eval()
    ids, mask = lm.encode_questions([r.question for r in task_records[:2]])
    for bad, match in [
        ({"n_latent": -1}, "n_latent >= 0"),
        ({"max_new_tokens": 0}, "max_new_tokens >= 1"),
        ({"temperature": -1.0}, "temperature >= 0"),
        ({"top_p": 0.0}, "0 < top_p <= 1"),
    ]:
        with pytest.raises(ValueError, match=match):
            lm.generate(ids, mask, **{"n_latent": T, "max_new_tokens": 2, **bad})
    out = lm.generate(ids, mask, T, max_new_tokens=2)
    with pytest.raises(ValueError, match=r"decode: tokens \(2, 2\) and mask \(2, 1\) differ in shape"):
        lm.decode(out.tokens, out.mask[:, :1])


def test_perturb_prompt_false_leaves_prompt_pass_untouched(tokenizer, task_records):
    lm = make_lm(tokenizer, "qwen2").eval()
    ids, mask = lm.encode_questions([r.question for r in task_records[:2]])
    pert = LockedDropout(p=0.5, perturb_prompt=False)
    with torch.no_grad():
        clean = lm.prefill(ids, mask, 0, markers=False).last_hidden
        with pert.bind(lm, torch.tensor([1, 2])) as pb:
            st = lm.prefill(ids, mask, 0, markers=False, perturbation=pb)
            assert torch.equal(st.last_hidden, clean)
            lat = lm.prefill(ids, mask, 2, markers=False, perturbation=pb).last_hidden
        lat_clean = lm.prefill(ids, mask, 2, markers=False).last_hidden
    assert not torch.allclose(lat, lat_clean)  # latent steps are perturbed


#: every built-in kind with its noise left off the answer (``perturbation.perturb_answer: false``)
QUIET_ANSWER = {
    "locked": lambda: LockedDropout(p=0.5, sites=["attn", "mlp"], perturb_answer=False),
    "gaussian-act": lambda: GaussianNoise(sigma=0.5, sites=["attn", "mlp"], perturb_answer=False),
    "gaussian-weights": lambda: GaussianNoise(sigma=0.5, target="weights", perturb_answer=False),
    "native": lambda: NativeDropout(p=0.5, perturb_answer=False),
}


def _answer_after_latents(lm, pert, seeds, ids, mask, tg, tm, answer_perturbed):
    """The latent state (last hidden state after the T latent steps) under ``pert`` of ``seeds``, and the answer's
    log-probs (``<|end-latent|>`` then ``tg``) scored after it: under ``pert`` too (``answer_perturbed``), or by the
    network with its perturbation removed (the block left: no hooks, native dropout off), over the perturbed
    latents' keys and values."""
    lead = torch.full((ids.shape[0], 1), lm.end_id)
    with pert.bind(lm, seeds) as pb:
        state = lm.prefill(ids, mask, T, markers=False, perturbation=pb)
        latent = state.last_hidden.clone()
        if answer_perturbed and pb.needs_stepwise:  # (native dropout on the answer: scored as decoded, token by token)
            return latent, lm.target_logprobs(ids, mask, T, tg, tm, perturbation=pb, stepwise=True)[0]
        if answer_perturbed:
            return latent, lm.score_targets(state, tg, tm, perturbation=pb, lead_ids=lead)[0]
    return latent, lm.score_targets(state, tg, tm, lead_ids=lead)[0]


@pytest.mark.parametrize("kind", list(QUIET_ANSWER))
def test_perturb_answer_false_decodes_the_answer_with_the_unperturbed_network(tokenizer, task_records, kind):
    """``perturb_answer=False``: the marker and the answer are scored by the unperturbed network (bit for bit the
    log-probs of the network with its perturbation removed after the latent steps), while the latent steps stay
    perturbed (their states differ across seeds, and the answer's log-probs with them)."""
    lm = make_lm(tokenizer, "qwen2").eval()
    rows = 1 if kind == "native" else 2  # (native dropout binds one rollout at a time)
    ids, mask = lm.encode_questions([r.question for r in task_records[:rows]])
    tg = torch.tensor([[5, 9, 13, 7]] * rows)
    tm = torch.ones_like(tg)
    pert, seeds = QUIET_ANSWER[kind](), [torch.arange(1, rows + 1), torch.arange(7, rows + 7)]
    with torch.no_grad():
        runs = [_answer_after_latents(lm, pert, s, ids, mask, tg, tm, True) for s in seeds]
        for (latent, logp), s in zip(runs, seeds):
            clean_latent, clean_answer = _answer_after_latents(lm, pert, s, ids, mask, tg, tm, False)
            assert torch.equal(latent, clean_latent) and torch.equal(logp, clean_answer)
        assert not torch.allclose(runs[0][0], runs[1][0]) and not torch.allclose(runs[0][1], runs[1][1])
        pert.perturb_answer = True  # (the paper's: the answer under the same noise, which changes its log-probs)
        latent, noisy = _answer_after_latents(lm, pert, seeds[0], ids, mask, tg, tm, True)
        assert torch.equal(latent, runs[0][0]) and not torch.allclose(noisy, runs[0][1])


@pytest.mark.parametrize(
    "kind, engine",
    [(k, "eager") for k in QUIET_ANSWER] + [(k, "fast") for k in QUIET_ANSWER if k != "native"],
)
def test_perturb_answer_false_replays_the_rollouts_exactly(tokenizer, task_records, kind, engine):
    """The rollout and every replay leave the answer to the unperturbed network alike: the update's log-probs (with
    grad, the fast engine's through its latent chain too) are those of a replay without grad (bit for bit on one
    path, every ratio exactly 1; the fast engine's no-grad replay, the reference's, runs over a static cache: up to
    rounding) and the rollout's recorded ones (up to the rounding of decoding token by token: an answer decoded under
    the noise and replayed without it, or the reverse, is ~1e-2 away); gradients reach the weights."""
    lm = make_lm(tokenizer, "qwen2").eval()
    pert = QUIET_ANSWER[kind]()
    ro = rollouts(lm, task_records, pert, K=2, n=2, engine=engine)
    batches = [torch.tensor([r]) for r in range(4)] if kind == "native" else [torch.arange(4)]
    chains = [False, True] if engine == "fast" else [False]
    for rows, chain_latents in [(r, c) for r in batches for c in chains]:
        kw = dict(n_latent=T, perturbation=pert, temperature=0.0, engine=engine, chain_latents=chain_latents)
        with torch.no_grad():
            old, m = replay_logprobs(lm, ro, rows, seeds=ro.seeds[rows], **kw)
        lm.model.zero_grad(set_to_none=True)
        new, _ = replay_logprobs(lm, ro, rows, seeds=ro.seeds[rows], **kw)
        if engine == "eager":
            assert torch.equal(torch.exp(new.detach() - old), torch.ones_like(old))
        assert torch.allclose(new.detach(), old, atol=1e-5)
        assert torch.allclose(ro.rollout_logp[rows, : m.shape[1]] * m, old, atol=1e-5)
        (new * m).sum().backward()
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in lm.model.parameters())
        assert any(p.grad.abs().sum() > 0 for p in lm.model.model.layers[0].mlp.parameters())


@pytest.mark.parametrize("kind", list(QUIET_ANSWER))
def test_perturb_answer_false_still_takes_the_gradient_through_the_perturbed_latent_chain(
    tokenizer, task_records, kind
):
    """With the answer left to the unperturbed network, the answer's log-probs still depend on the perturbed latent
    steps, and the gradient flows back through them: the prompt's last hidden state reaches the answer only as the
    first latent step's input, and its gradient is not zero (nor the one of a weight through the chain)."""
    lm = make_lm(tokenizer, "qwen2").eval()
    ids, mask = lm.encode_questions([task_records[0].question])
    tg, tm = torch.tensor([[5, 9, 13]]), torch.ones(1, 3, dtype=torch.long)
    lead = torch.full((1, 1), lm.end_id)
    grads = []
    for seed in (1, 2):
        with QUIET_ANSWER[kind]().bind(lm, torch.tensor([seed])) as pb:
            state = lm.prefill(ids, mask, 0, markers=False, perturbation=pb)
            first = state.last_hidden
            lm.coconut_steps(state, T, pb)
            logp, _ = lm.score_targets(state, tg, tm, perturbation=pb, lead_ids=lead)
            grads.append(torch.autograd.grad(logp.sum(), first)[0])
    assert all(torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads)
    assert not torch.allclose(grads[0], grads[1])  # (the chain's noise is in the backward too: each seed its own)


@pytest.mark.parametrize("over", [["perturbation.kind=locked"], ["grpo.engine=fast"], ["perturbation.kind=native"]])
def test_perturb_answer_false_reaches_a_trainers_rollouts_and_replays(tokenizer, task_records, over):
    """``perturbation.perturb_answer=false`` from the config: the trainer's rollout, update and reference all leave the
    answer to the unperturbed network (the update's replay gives the rollouts' log-probs back, every ratio 1)."""
    from dgrpo.config import Config, load_config
    from dgrpo.training.grpo import GRPOTrainer

    parity = lambda completions, records: [float(sum(map(ord, c)) % 2) for c in completions]  # noqa: E731
    sets = ["grpo.group_size=2", "grpo.prompts_per_step=2", "grpo.max_new_tokens=6", "grpo.filter=false"]
    cfg = load_config(Config, "tiny.yaml", [*sets, "perturbation.perturb_answer=false", *over])
    trainer = GRPOTrainer(make_lm(tokenizer, "qwen2"), cfg, task_records, reward_fn=parity)
    assert trainer.perturbation.perturb_answer is False
    m = trainer.step()
    assert m["logp_replay_maxdiff"] < 1e-5 and m["ratio_max"] == m["ratio_min"] == 1.0


def test_a_kind_of_ones_own_must_take_perturb_answer_or_is_refused(tmp_path, tokenizer, task_records):
    """A kind of one's own whose from_config leaves ``perturb_answer`` true would perturb the answer under
    ``perturbation.perturb_answer=false`` without a word: it is refused (one line); one that takes it, and hands it to
    its ``HookedPerturbation``, leaves the answer alone; ``none`` perturbs nothing anyway."""
    from dgrpo.config import Config, ConfigError, load_config
    from dgrpo.perturbation import make_perturbation

    (tmp_path / "mine.py").write_text(
        "from dgrpo.model.anatomy import find_sites\n"
        "from dgrpo.perturbation import HookedPerturbation, Perturbation\n\n\n"
        "class Deaf(Perturbation):\n    @classmethod\n    def from_config(cls, cfg):\n        return cls()\n\n\n"
        "class Doubled(HookedPerturbation):\n    def hook(self, k):\n"
        "        return lambda module, args, output: 2 * output if self.active else output\n\n\n"
        "class Hearing(Perturbation):\n    @classmethod\n    def from_config(cls, cfg):\n"
        "        kind = cls()\n        kind.perturb_answer = cfg.perturb_answer\n        return kind\n\n"
        "    def bind(self, lm, seeds):\n"
        "        mlps = [s.module for s in find_sites(lm.model, ['mlp'], 'all')]\n"
        "        return Doubled(mlps, perturb_prompt=True, perturb_answer=self.perturb_answer)\n"
    )
    load = lambda kind, *more: load_config(Config, None, [f"perturbation.kind={kind}", *more]).perturbation  # noqa: E731
    with pytest.raises(ConfigError, match=r"perturb_answer=false: perturbation.kind=.*mine.py:Deaf \(Deaf\) does not"):
        make_perturbation(load(f"{tmp_path / 'mine.py'}:Deaf", "perturbation.perturb_answer=false"))
    assert make_perturbation(load(f"{tmp_path / 'mine.py'}:Deaf")).perturb_answer  # (the default: nothing to take)
    assert make_perturbation(load("none", "perturbation.perturb_answer=false")).perturb_answer is False
    hearing = make_perturbation(load(f"{tmp_path / 'mine.py'}:Hearing", "perturbation.perturb_answer=false"))
    lm = make_lm(tokenizer, "qwen2").eval()
    ids, mask = lm.encode_questions([task_records[0].question])
    tg, tm = torch.tensor([[5, 9, 13]]), torch.ones(1, 3, dtype=torch.long)
    with torch.no_grad():
        latent, logp = _answer_after_latents(lm, hearing, torch.tensor([1]), ids, mask, tg, tm, True)
        _, clean_answer = _answer_after_latents(lm, hearing, torch.tensor([1]), ids, mask, tg, tm, False)
        assert torch.equal(logp, clean_answer)
        assert not torch.allclose(latent, lm.prefill(ids, mask, T, markers=False).last_hidden)  # (latents perturbed)


def test_memoized_locked_masks_are_the_drawn_ones():
    """A step binds the same seeds three times (rollout, update, reference): the memo returns the rows drawn first,
    bit for bit, and forgets the oldest beyond its capacity."""
    from dgrpo.perturbation.locked import RowMemo, locked_masks

    seeds = torch.tensor([5, 9, 11, 5])
    memo = RowMemo(capacity=3)
    fresh = locked_masks(seeds, 3, 16, 0.3)
    assert torch.equal(locked_masks(seeds, 3, 16, 0.3, memo), fresh)
    assert torch.equal(locked_masks(seeds.flip(0), 3, 16, 0.3, memo), fresh.flip(1))
    assert len(memo.rows) == 3
    assert not torch.equal(locked_masks(seeds, 3, 16, 0.5, memo), fresh)  # p is part of the key
    assert len(memo.rows) == 3


def test_prefetched_masks_are_the_ones_a_bind_would_draw_and_are_not_drawn_again(tokenizer, monkeypatch):
    """``LockedDropout.prefetch``: a later step's masks drawn on a host thread; the bind of those seeds waits for
    that draw and draws nothing itself, and binds the same masks, bit for bit, as a bind without the prefetch."""
    import threading

    from dgrpo.perturbation import locked

    lm = make_lm(tokenizer, "qwen2")
    seeds, now = torch.arange(100, 108), torch.arange(8)
    plain = LockedDropout(p=0.3, sites=["attn", "mlp"]).bind(lm, seeds).masks
    draws = []
    real = locked.draw_keep_rows

    def counted(s, *a, **kw):
        draws.append((threading.current_thread().name, len(s)))
        return real(s, *a, **kw)

    monkeypatch.setattr(locked, "draw_keep_rows", counted)
    pert = LockedDropout(p=0.3, sites=["attn", "mlp"])
    pert.bind(lm, now)  # this step's rows
    pert.prefetch(lm, seeds)  # the next step's, in the background
    pert.bind(lm, now)  # (this step's update: nothing to draw, no wait for the prefetch)
    assert torch.equal(pert.bind(lm, seeds).masks, plain)
    main = threading.current_thread().name
    assert draws[0] == (main, 8) and [n for t, n in draws[1:] if t == main] == []
    assert [n for t, n in draws if t.startswith("dgrpo-mask-prefetch")] == [8]


def test_a_prefetch_draws_and_pins_its_masks_only_while_no_graph_is_captured(tokenizer, monkeypatch):
    """On CUDA the prefetch thread draws and pins its masks (``cudaHostAlloc``) while the main thread may capture a
    graph (the first step's captures run while the next step's masks are drawn); a capture in CUDA's global mode
    ends at such a call from any thread, so the thread does all its work under ``CAPTURE_LOCK``, which every capture
    holds."""
    import threading
    from types import SimpleNamespace

    from dgrpo.model.fixed_shape import CAPTURE_LOCK
    from dgrpo.perturbation import locked

    lm = make_lm(tokenizer, "qwen2")
    on_cuda = SimpleNamespace(model=lm.model, device=torch.device("cuda"))  # (only its device type is read)
    drawn, pinned = threading.Event(), []
    real = locked.keep_rows

    def keep_rows(*a, **kw):
        out = real(*a, **kw)
        drawn.set()
        return out

    monkeypatch.setattr(locked, "keep_rows", keep_rows)
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda t: pinned.append(t) or t)
    pert, seeds = LockedDropout(p=0.3, sites=["attn", "mlp"]), torch.arange(100, 108)
    with CAPTURE_LOCK:  # (as a capture on this thread holds it)
        pert.prefetch(on_cuda, seeds)
        assert not drawn.wait(0.3)  # neither drawn nor pinned: waiting for the capture to end
        assert pinned == []
    keep = pert._await_prefetch(tuple(seeds.tolist()))
    assert len(pinned) == 1 and pinned[0] is keep
    assert torch.equal(keep, real(seeds, 2 * lm.model.config.num_hidden_layers, lm.model.config.hidden_size, 0.3))


def test_binding_the_same_seeds_again_reuses_the_bound_masks(tokenizer):
    """A step binds its seeds three times (rollout, update, reference model): the second bind of the same seeds, on
    the same kind of model, takes the device masks the first made (the same tensors, nothing drawn or copied); other
    seeds or another dtype get their own masks, equal to a fresh bind's."""
    lm, ref = make_lm(tokenizer, "qwen2"), make_lm(tokenizer, "qwen2")
    pert = LockedDropout(p=0.3, sites=["attn", "mlp"])
    seeds, other = torch.arange(8), torch.arange(8) + 50
    first = pert.bind(lm, seeds)
    again, on_ref = pert.bind(lm, seeds.clone()), pert.bind(ref, seeds)
    assert all(a is b for a, b in zip(first.site_masks, again.site_masks, strict=True))
    assert all(a is b for a, b in zip(first.site_masks, on_ref.site_masks, strict=True))
    assert on_ref.modules[0] is not first.modules[0]  # each bind hooks its own model's sites
    moved = pert.bind(lm, other)
    assert torch.equal(moved.masks, LockedDropout(p=0.3, sites=["attn", "mlp"]).bind(lm, other).masks)
    assert not torch.equal(moved.masks, first.masks)
    lm.model.to(torch.float64)
    assert pert.bind(lm, other).masks.dtype == torch.float64


def test_the_row_memo_can_be_shared_with_a_drawing_thread():
    """Two threads reading and filling one memo past its capacity (the prefetch and the step's binds): every row
    read is the row of its seed, and the memo keeps its capacity."""
    import threading

    from dgrpo.perturbation.locked import RowMemo, keep_rows

    memo, errors = RowMemo(capacity=40), []
    want = keep_rows(torch.arange(120), 2, 8, 0.3)

    def work(lo):
        try:
            for _ in range(20):
                seeds = torch.arange(lo, lo + 60)
                assert torch.equal(keep_rows(seeds, 2, 8, 0.3, memo), want[lo : lo + 60])
        except Exception as e:  # noqa: BLE001 (reported below, from the main thread)
            errors.append(e)

    threads = [threading.Thread(target=work, args=(lo,)) for lo in (0, 60)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(memo.rows) == 40


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_bound_masks_are_the_scaled_keep_rows_bit_for_bit(tokenizer, dtype):
    """The bound masks (booleans moved to the device, scaled there) are exactly the masks of the fp32 formula
    keep / (1 - p) rounded once to the weights' dtype, for values of p whose reciprocal rounds differently."""
    from dgrpo.model.anatomy import decoder_layers
    from dgrpo.perturbation.locked import keep_rows, scale_kept

    seeds = torch.tensor([3, 1, 4, 1, 5])
    for p in (0.1, 0.3, 1 / 3, 0.7):
        keep = keep_rows(seeds, 4, 32, p)
        formula = (keep.transpose(0, 1).float() / (1.0 - p)).to(dtype)
        assert torch.equal(scale_kept(keep.transpose(0, 1).contiguous(), p, dtype), formula)
    pert = LockedDropout(p=0.3, sites=["attn", "mlp"])
    lm = make_lm(tokenizer, "qwen2")
    lm.model.to(dtype)
    bound = pert.bind(lm, seeds)
    n_sites = 2 * len(decoder_layers(lm.model))
    want = (keep_rows(seeds, n_sites, lm.model.config.hidden_size, 0.3).transpose(0, 1).float() / 0.7).to(dtype)
    assert bound.masks.dtype == dtype and torch.equal(bound.masks, want)


def test_parallel_mask_draw_is_the_serial_draw(monkeypatch):
    """A large draw is split over torch's thread budget (PARALLEL_DRAW_MIN lowered here so a small one is): every row
    still comes from its own generator, so the masks equal the serial draw bit for bit, in the seeds' order, with
    and without the memo (repeated seeds included), and the chunks ran on the pool's threads."""
    import threading

    from dgrpo.perturbation import base, locked

    seeds = seeds_for(3, 1, 0, 37)
    seeds = torch.cat([seeds, seeds[[4, 0]]])  # a row bound twice in one call
    serial = locked.keep_rows(seeds, 3, 40, 0.2)
    names: set[str] = set()
    drawn = base.row_uniforms

    def recording(*a, **kw):
        names.add(threading.current_thread().name)
        return drawn(*a, **kw)

    monkeypatch.setattr(locked, "row_uniforms", recording)
    monkeypatch.setattr(locked, "PARALLEL_DRAW_MIN", 1)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)
    assert torch.equal(locked.keep_rows(seeds, 3, 40, 0.2), serial)
    # every row was drawn on the pool's threads, a pool of 4 (which of its threads take the 4 chunks is the
    # scheduler's choice: one idle thread may take them all, so how many ran is not asserted)
    assert names and all(n.startswith("dgrpo-masks") for n in names)
    assert locked._pools[(os.getpid(), 4)]._max_workers == 4
    memo = locked.RowMemo()
    assert torch.equal(locked.keep_rows(seeds, 3, 40, 0.2, memo), serial)
    assert len(memo.rows) == 37
    assert torch.equal(locked.keep_rows(seeds.flip(0), 3, 40, 0.2, memo), serial.flip(0))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_parallel_mask_draw_after_fork(monkeypatch):
    """A process forked after a parallel draw (the demo's worker pool) draws with a pool of its own: the parent's
    pool threads do not exist in the child, and waiting on them would hang."""
    from dgrpo.perturbation import locked

    monkeypatch.setattr(locked, "PARALLEL_DRAW_MIN", 1)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    seeds = torch.arange(6)
    want = locked.keep_rows(seeds, 2, 8, 0.3)
    pid = os.fork()
    if pid == 0:  # the child: exit code 0 when the draw finishes and matches, 1 otherwise
        ok = torch.equal(locked.keep_rows(seeds, 2, 8, 0.3), want)
        os._exit(0 if ok else 1)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail("the forked child's mask draw hung")


def test_seeds_are_integers_one_per_row(tokenizer):
    """A float seed tensor lost the int63 seeds' low bits and gave other masks (log-probs off by 0.6 in a probe);
    a list or a NumPy array of ints is taken; a 2-d tensor or floats are one line, for every kind."""
    import numpy as np

    seeds = seeds_for(0, 0, 0, 3)
    assert torch.equal(as_seeds(seeds.tolist()), seeds) and torch.equal(as_seeds(seeds.numpy()), seeds)
    assert as_seeds(torch.tensor([1, 2], dtype=torch.int32)).dtype == torch.int64
    lm = make_lm(tokenizer)
    kinds = [LockedDropout(p=0.1), GaussianNoise(sigma=0.1), NoPerturbation()]
    for pert in kinds:
        for bad in (seeds.double(), seeds.float(), np.array([0.5, 1.5])):
            with pytest.raises(TypeError, match="perturbation seeds must be integers"):
                pert.bind(lm, bad)
        with pytest.raises(ValueError, match=r"must be 1-d \(one seed per row\), got shape \(3, 1\)"):
            pert.bind(lm, seeds[:, None])
    with pytest.raises(TypeError, match="must be integers"):
        NativeDropout(p=0.1).bind(lm, seeds[:1].double())
    with LockedDropout(p=0.1).bind(lm, seeds.tolist()) as pb:  # a list binds as its tensor does
        assert pb is not None


def test_a_kind_of_ones_own_built_on_hooked_perturbation_as_the_readme_says(tokenizer, task_records):
    """The README's recipe for a kind of one's own (``HookedPerturbation`` holds the forward hooks) could not be
    followed: it was not in ``dgrpo.perturbation``, and the hook a subclass defines was the private ``_hook``."""
    from dgrpo.model.anatomy import find_sites
    from dgrpo.perturbation import HookedPerturbation, Perturbation

    class Scaled(HookedPerturbation):  # each row's MLP outputs times a factor drawn from its seed
        def __init__(self, modules, seeds):
            super().__init__(modules, perturb_prompt=True)
            self.factors = torch.stack([torch.rand(1, generator=torch.Generator().manual_seed(int(s))) for s in seeds])

        def hook(self, k):
            return lambda module, args, output: output * (1 + self.factors[:, :, None]) if self.active else output

    class ScaleKind(Perturbation):
        @classmethod
        def from_config(cls, cfg):
            return cls()

        def bind(self, lm, seeds):
            return Scaled([site.module for site in find_sites(lm.model, ["mlp"], "all")], seeds)

    lm = make_lm(tokenizer, "qwen2").eval()
    ids, mask = lm.encode_questions([r.question for r in task_records[:2]])
    with torch.no_grad():
        clean = lm.prefill(ids, mask, 2, markers=False).last_hidden
        runs = []
        for _ in range(2):
            with ScaleKind().bind(lm, torch.tensor([1, 2])) as pb:
                runs.append(lm.prefill(ids, mask, 2, markers=False, perturbation=pb).last_hidden)
        after = lm.prefill(ids, mask, 2, markers=False).last_hidden
    assert torch.equal(runs[0], runs[1]) and not torch.allclose(runs[0], clean)  # (replayed from the seeds alone)
    assert torch.equal(after, clean)  # (the hooks removed on leaving)
    with pytest.raises(NotImplementedError, match="HookedPerturbation must define hook"):
        HookedPerturbation([], perturb_prompt=True).hook(0)


def test_a_kind_of_ones_own_registered_in_python_or_named_by_its_class(tmp_path, monkeypatch):
    """register checked nothing (a built-in kind replaced for the process, a class of no Perturbation); a kind's
    missing method was a bare NotImplementedError; and the command line had no way to use a kind of one's own,
    which it now names by its class, path/to/file.py:Class."""
    from dgrpo.config import REGISTERED_CHOICES, Config, ConfigError, load_config
    from dgrpo.perturbation import PERTURBATIONS, Perturbation, kind_class, make_perturbation, register

    with pytest.raises(ValueError, match="locked is a built-in kind"):
        register("locked")
    with pytest.raises(ValueError, match="a kind is a name"):
        register("x y!")
    with pytest.raises(TypeError, match="is not a subclass of dgrpo.perturbation.Perturbation"):
        register("not-one")(int)
    monkeypatch.setitem(PERTURBATIONS, "half", PERTURBATIONS["locked"])  # (the registry as it was, after the test)
    monkeypatch.setitem(REGISTERED_CHOICES, "perturbation.kind", list(REGISTERED_CHOICES["perturbation.kind"]))

    @register("half")
    class Half(Perturbation):
        pass

    cfg = load_config(Config, None, ["perturbation.kind=half"]).perturbation
    with pytest.raises(NotImplementedError, match="Half must define from_config"):
        make_perturbation(cfg)
    with pytest.raises(NotImplementedError, match="Half must define bind"):
        Half().bind(None, torch.zeros(1, dtype=torch.long))
    (tmp_path / "mine.py").write_text(
        "from dgrpo.perturbation.locked import LockedDropout\n\n\nclass Halved(LockedDropout):\n"
        "    @classmethod\n    def from_config(cls, cfg):\n        return cls(p=cfg.p / 2)\n"
    )
    spec = f"{tmp_path / 'mine.py'}:Halved"
    built = make_perturbation(
        load_config(Config, None, [f"perturbation.kind={spec}", "perturbation.p=0.4"]).perturbation
    )
    assert type(built).__name__ == "Halved" and built.p == 0.2
    for bad, says in [
        (f"{tmp_path / 'mine.py'}:Nope", "has no class 'Nope'"),
        (f"{tmp_path / 'gone.py'}:Halved", "gone.py not found"),
        ("dgrpo.config:Config", "is not a subclass of dgrpo.perturbation.Perturbation"),
        ("uniform", "is not registered .*import the module that registers it first, or name its class"),
    ]:
        with pytest.raises(ConfigError, match=says):
            kind_class(bad)
    with pytest.raises(ConfigError, match="or a kind of your own as its class, path/to/file.py:Class"):
        load_config(Config, None, ["perturbation.kind=uniform"])


def test_a_grpo_run_records_the_file_of_its_own_perturbation_kind(tmp_path, tokenizer, task_records):
    """applied.json's plug-in hashes held the reward's and the scorer's files, not a perturbation kind's
    (``perturbation.kind=path/to/file.py:Class``): a resume after an edit of the kind went on without a word."""
    import hashlib

    from dgrpo.config import Config, load_config
    from dgrpo.training.grpo import GRPOTrainer

    mine = tmp_path / "mine.py"
    mine.write_text(
        "from dgrpo.perturbation.locked import LockedDropout\n\n\nclass Halved(LockedDropout):\n"
        "    @classmethod\n    def from_config(cls, cfg):\n        return cls(p=cfg.p / 2)\n"
    )
    cfg = load_config(Config, "tiny.yaml", [f"perturbation.kind={mine}:Halved"])
    trainer = GRPOTrainer(make_lm(tokenizer, "qwen2"), cfg, task_records, reward_fn=lambda c, r: [0.0] * len(c))
    assert trainer.applied()["plugin_files"] == {str(mine.resolve()): hashlib.sha256(mine.read_bytes()).hexdigest()}


def test_a_plugin_file_runs_once_and_may_hold_dataclasses(tmp_path):
    """A file of postponed annotations with a dataclass could not be imported (dataclasses reads the module in
    sys.modules, where it was not); and each option naming the file ran its top level again."""
    from dgrpo.eval.scoring import load_function
    from dgrpo.perturbation import kind_class

    (tmp_path / "both.py").write_text(
        "from __future__ import annotations\n\nimport dataclasses\n\n"
        "from dgrpo.perturbation.locked import LockedDropout\n"
        "RUNS = []\nRUNS.append(1)\n\n\n@dataclasses.dataclass\nclass Knobs:\n    scale: float = 0.5\n\n\n"
        "class Scaled(LockedDropout):\n    @classmethod\n    def from_config(cls, cfg):\n"
        "        return cls(p=cfg.p * Knobs().scale)\n\n\ndef reward(completions, records):\n"
        "    return [float(len(RUNS))] * len(completions)\n"
    )
    cls = kind_class(f"{tmp_path / 'both.py'}:Scaled")
    fn = load_function(f"{tmp_path / 'both.py'}:reward")
    assert cls.__name__ == "Scaled" and fn(["a"], [None]) == [1.0]  # (the file's top level ran once)


def test_a_rows_noise_is_its_seeds_own_generator_draws():
    """Row b's noise is drawn from a generator seeded with seeds[b]: its locked keep-mask is the generator's first
    n_sites * width uniforms >= p, scaled by the fp32 quotient 1 / (1 - p) (1.0416667 at p = 0.04, where the correctly
    rounded 1 / 0.96 is 1.0416666), its Gaussian noise the generator's normals; the token-sampling draws of the row
    are another generator's (not the mask's uniforms again)."""
    from dgrpo.perturbation.base import row_normals, row_sampling_uniforms, row_uniforms
    from dgrpo.perturbation.locked import scale_kept

    seed = 987654321
    u = torch.rand(3 * 16, generator=torch.Generator().manual_seed(seed)).view(3, 16)
    for p in (0.25, 0.04):
        scale = float(torch.ones(()) / (1.0 - p))
        assert torch.equal(locked_masks(torch.tensor([seed]), 3, 16, p)[:, 0], torch.where(u >= p, scale, 0.0))
    assert float(scale_kept(torch.tensor(True), 0.04)) == pytest.approx(1.0416667461395264, rel=0, abs=0)
    z = torch.randn(3, 16, generator=torch.Generator().manual_seed(seed))
    assert torch.equal(row_normals(seed, 3, 16), z)
    assert torch.equal(row_uniforms(seed, 3, 16), u)
    assert not torch.equal(row_sampling_uniforms(torch.tensor([seed]), 48)[0], u.flatten())


def test_p_zero_keeps_a_unit_whose_uniform_is_exactly_zero():
    """keep = u >= p: seed 146's generator draws exactly 0.0 at index 18555 of its first 2^16 uniforms (one unit in
    2^24: at a paper-scale step, 512 rows x 28 sites x 1536 units, about one a bind); p = 0 keeps it (u > p dropped
    it: p = 0 not the identity)."""
    from dgrpo.perturbation.base import row_uniforms

    assert row_uniforms(146, 2, 1 << 15).flatten()[18555].item() == 0.0
    assert torch.equal(locked_masks(torch.tensor([146]), 2, 1 << 15, 0.0), torch.ones(2, 1, 1 << 15))


def test_locked_masks_follow_p_set_on_the_object_and_the_model_bound(tokenizer):
    """A bind of the seeds bound before reuses its masks only for the same p and the same sites: a p set on the object
    afterwards (a sweep in a notebook), or a model of the same width with more layers, gets the masks a new object
    would bind (the memo of drawn rows is keyed by p and the number of sites too)."""
    lm, deeper = make_lm(tokenizer, "qwen2"), make_lm(tokenizer, "qwen2", num_layers=3)
    seeds = torch.tensor([4, 2])
    pert = LockedDropout(p=0.3, sites=["attn", "mlp"])
    pert.bind(lm, seeds)
    pert.p = 0.6
    for model in (lm, deeper):
        want = LockedDropout(p=0.6, sites=["attn", "mlp"]).bind(model, seeds).masks
        assert torch.equal(pert.bind(model, seeds).masks, want)


def test_a_bind_of_some_of_the_prefetched_seeds_gets_its_own_rows(tokenizer):
    """A prefetch's stacked batch is taken only by a bind of exactly its seeds: a bind of some of them (in another
    order) gets its own rows (from the memo the prefetch filled)."""
    lm = make_lm(tokenizer, "qwen2")
    pert = LockedDropout(p=0.3)
    pert.prefetch(lm, torch.tensor([1, 2, 3]))
    want = LockedDropout(p=0.3).bind(lm, torch.tensor([3, 1])).masks
    assert torch.equal(pert.bind(lm, torch.tensor([3, 1])).masks, want)


def test_seeds_of_other_streams_differ_and_span_62_bits():
    """The seeds of another stream are not the rollouts' (``replay: fresh_mask`` draws its update masks from stream
    ``fresh/<epoch>``: the rollout's own seeds again would make the ablation mask replay), and seeds span [0, 2^62):
    the generator reads their low 32 bits, all of which vary (a range of 2^31 left bit 31 always 0)."""
    streams = ["rollout", "fresh/0", "fresh/1", "null"]
    drawn = [set(seeds_for(0, 5, 0, 1000, stream=s).tolist()) for s in streams]
    assert len(set.union(*drawn)) == 4000
    rollout = seeds_for(0, 5, 0, 1000)
    assert int(rollout.max()) >= 2**61 and bool(((rollout >> 31) & 1).any())


#: what each kind's hooked modules are seen to do to their outputs (the formula of the kind's docstring)
SITE_NOISE = {
    "locked": lambda: LockedDropout(p=0.5, sites=["attn", "mlp"]),
    "gaussian-act": lambda: GaussianNoise(sigma=0.5, sites=["attn", "mlp"]),
    "gaussian-weights": lambda: GaussianNoise(sigma=0.5, sites=["attn", "mlp"], target="weights"),
}


def _hooked_outputs(lm, pert, seeds, ids, mask):
    """Each hooked module's input and output before its perturbation's hook and after it, in one prompt forward."""
    before, after = {}, {}

    def keeping(store, k):
        def hook(module, args, output):
            store[k] = (
                args[0].detach().clone() if args else None,
                (output[0] if isinstance(output, tuple) else output).detach().clone(),
            )

        return hook

    pb = pert.bind(lm, seeds)
    handles = [m.register_forward_hook(keeping(before, k)) for k, m in enumerate(pb.modules)]  # (run first)
    try:
        with torch.no_grad(), pb:
            handles += [m.register_forward_hook(keeping(after, k)) for k, m in enumerate(pb.modules)]
            lm.prefill(ids, mask, 0, markers=False, perturbation=pb)
    finally:
        for h in handles:
            h.remove()
    return pb, before, after


@pytest.mark.parametrize("arch", ["qwen2", "gpt2"])
@pytest.mark.parametrize("kind", list(SITE_NOISE))
def test_each_site_takes_its_own_rows_noise_by_the_kinds_formula(tokenizer, task_records, kind, arch):
    """Site k's output, for row b: times mask k of row b (locked), times 1 + sigma * eps_k (gaussian activations),
    plus x E_k^T (gaussian weights, E_k [out, in] also for GPT-2's Conv1D, whose weight is [in, out]); each site's
    noise its own (site 0's at every site, or the factor without its 1 or its sigma, went unseen)."""
    lm = make_lm(tokenizer, arch).eval()
    ids, mask = lm.encode_questions([r.question for r in task_records[:2]])
    pert = SITE_NOISE[kind]()
    pb, before, after = _hooked_outputs(lm, pert, torch.tensor([3, 8]), ids, mask)
    assert sorted(before) == sorted(after) == list(range(len(pb.modules)))
    for k, ((x, raw), (_, out)) in enumerate(zip(before.values(), after.values())):
        if kind == "locked":
            want = raw * pb.site_masks[k]
        elif kind == "gaussian-act":
            want = raw * (1.0 + 0.5 * pb.noises[k][:, None, :])
        else:
            out_f, in_f = raw.shape[-1], x.shape[-1]
            assert pb.noises[k].shape == (2, out_f, in_f)
            want = raw + torch.einsum("bli,boi->blo", x, pb.noises[k])
        assert torch.allclose(out, want, rtol=1e-6, atol=1e-6), (kind, k)
    noise = pb.site_masks if kind == "locked" else pb.noises
    assert not torch.equal(noise[0], noise[1])  # (attn and mlp of layer 0: two draws)


def test_gaussian_weight_noise_is_sigma_std_w_times_each_sites_own_normals(tokenizer):
    """Row b's weight noise at site k is sigma * std(W_k) * E, E the normals of a generator seeded by a hash of
    (seeds[b], k): each (row, site) its own draw, also for seeds one apart (seed + site gave row s at site 1 the noise
    of row s + 1 at site 0)."""
    from dgrpo.model.anatomy import find_sites, output_projection
    from dgrpo.perturbation.base import site_seed

    lm = make_lm(tokenizer, "qwen2").eval()
    pert = GaussianNoise(sigma=0.2, sites=["mlp"], layers="0:2", target="weights")
    seeds = [1000, 1001]
    noises = pert.bind(lm, torch.tensor(seeds)).noises
    for k, site in enumerate(find_sites(lm.model, ["mlp"], "0:2")):
        w = output_projection(site.module, site.part).weight.detach()
        for b, s in enumerate(seeds):
            e = torch.randn(w.shape, generator=torch.Generator().manual_seed(site_seed(s, k, "gaussian-weights")))
            assert torch.allclose(noises[k][b], 0.2 * float(w.std()) * e, rtol=1e-6, atol=0)
    draws = [noises[k][b].flatten() for k in range(2) for b in range(2)]
    for i in range(4):
        for j in range(i):
            assert abs(torch.corrcoef(torch.stack([draws[i], draws[j]]))[0, 1].item()) < 0.2, (i, j)


def test_the_sites_are_the_attention_mlp_and_block_of_the_selected_layers(tokenizer):
    """A bind hooks, per selected layer in order, the attention (``attn``), the MLP (``mlp``) and the whole decoder
    layer (``residual``: its output is the residual stream); ``perturbation.layers`` picks the layers as its grammar
    says, and a layer named twice (-1 and the last index) is refused (two masks on one layer)."""
    from dgrpo.config import ConfigError

    lm = make_lm(tokenizer, "qwen2", num_layers=3)
    layers, one = lm.model.model.layers, torch.tensor([1])
    pb = LockedDropout(sites=["attn", "mlp", "residual"], layers="-2:").bind(lm, one)
    assert pb.modules == [m for i in (1, 2) for m in (layers[i].self_attn, layers[i].mlp, layers[i])]
    for spec, chosen in (("all", [0, 1, 2]), ("0", [0]), ("-1", [2]), ("2,0", [2, 0]), (":2", [0, 1])):
        assert LockedDropout(layers=spec).bind(lm, one).modules == [layers[i].mlp for i in chosen], spec
    with pytest.raises(ConfigError, match="names a layer twice"):
        LockedDropout(layers="-1,2").bind(lm, one)


@pytest.mark.parametrize("target", ["activations", "weights"])
def test_gaussian_perturb_prompt_false_leaves_the_prompt_pass_untouched(tokenizer, task_records, target):
    """As for locked dropout: ``perturb_prompt=False`` leaves the prompt's forward unperturbed, the latent steps not."""
    lm = make_lm(tokenizer, "qwen2").eval()
    ids, mask = lm.encode_questions([r.question for r in task_records[:2]])
    pert = GaussianNoise(sigma=0.5, sites=["attn", "mlp"], target=target, perturb_prompt=False)
    with torch.no_grad():
        clean, lat_clean = (lm.prefill(ids, mask, n, markers=False).last_hidden for n in (0, 2))
        with pert.bind(lm, torch.tensor([1, 2])) as pb:
            assert torch.equal(lm.prefill(ids, mask, 0, markers=False, perturbation=pb).last_hidden, clean)
            assert not torch.allclose(lm.prefill(ids, mask, 2, markers=False, perturbation=pb).last_hidden, lat_clean)


def test_a_rate_of_one_is_refused_and_sigma_zero_is_the_identity(tokenizer, task_records):
    """p = 1 would drop every unit and scale by 1 / 0 (NaN log-probs): refused for both dropouts. sigma = 0 is
    Gaussian noise of scale zero: accepted, and every forward is the unperturbed one."""
    for kind in (LockedDropout, NativeDropout):
        with pytest.raises(ValueError, match=r"dropout p must be in \[0, 1\)"):
            kind(p=1.0)
    lm = make_lm(tokenizer, "qwen2").eval()
    ids, mask = lm.encode_questions([r.question for r in task_records[:2]])
    with torch.no_grad():
        clean = lm.prefill(ids, mask, T, markers=False).last_hidden
        for target in ("activations", "weights"):
            with GaussianNoise(sigma=0.0, target=target).bind(lm, torch.tensor([1, 2])) as pb:
                assert torch.equal(lm.prefill(ids, mask, T, markers=False, perturbation=pb).last_hidden, clean)


def test_each_kind_is_built_from_every_option_of_its_config():
    """``make_perturbation`` hands each kind every ``perturbation.*`` option it takes."""
    from dgrpo.config import PerturbationConfig
    from dgrpo.perturbation import make_perturbation

    opts = dict(p=0.3, sites=["attn", "mlp"], layers="0:1", perturb_prompt=False, perturb_answer=False)
    locked = make_perturbation(PerturbationConfig(kind="locked", **opts))
    assert (locked.p, locked.sites, locked.layers, locked.perturb_prompt, locked.perturb_answer) == tuple(opts.values())
    gauss = make_perturbation(PerturbationConfig(kind="gaussian", sigma=0.7, gaussian_target="weights", **opts))
    assert (gauss.sigma, gauss.target, gauss.sites, gauss.layers) == (0.7, "weights", ["attn", "mlp"], "0:1")
    assert (gauss.perturb_prompt, gauss.perturb_answer) == (False, False)
    native = make_perturbation(PerturbationConfig(kind="native", **opts))
    assert (native.p, native.perturb_prompt, native.perturb_answer) == (0.3, False, False)


@pytest.mark.parametrize("arch", ["qwen2", "gpt2"])
def test_native_dropout_sets_the_attention_rate_in_its_block_and_restores_it(tokenizer, arch):
    """Inside the block every attention's dropout rate is p (Qwen2's ``attention_dropout``, GPT-2's ``attn_dropout.p``);
    after it, the model's own rate again (a model trained afterwards, or in train mode, dropped at p)."""
    from dgrpo.model.anatomy import attention_modules

    lm = make_lm(tokenizer, arch).eval()
    attn = attention_modules(lm.model)

    def rates():
        return [m.attn_dropout.p if arch == "gpt2" else m.attention_dropout for m in attn]

    for m in attn:
        if arch == "gpt2":
            m.attn_dropout.p = 0.05
        else:
            m.attention_dropout = 0.05
    with NativeDropout(p=0.4).bind(lm, torch.tensor([7])):
        assert rates() == [0.4] * len(attn)
    assert rates() == [0.05] * len(attn)


def test_native_dropout_binds_one_seed_on_a_model_whose_rate_it_sets(tokenizer):
    """Native dropout binds exactly one seed (none is refused, as two are), and refuses a model whose attention keeps
    no rate it can set (it would run the deterministic network: every rollout of a group the same)."""
    from dgrpo.config import ConfigError
    from dgrpo.model.anatomy import attention_modules

    lm = make_lm(tokenizer, "qwen2")
    for seeds in (torch.tensor([], dtype=torch.long), torch.tensor([1, 2])):
        with pytest.raises(ValueError, match="bind one rollout at a time"):
            NativeDropout(p=0.3).bind(lm, seeds)
    for m in attention_modules(lm.model):
        del m.attention_dropout
    with pytest.raises(ConfigError, match="has no attention dropout rate dgrpo can set"):
        NativeDropout(p=0.3).bind(lm, torch.tensor([1]))


def test_a_prefetch_is_taken_only_by_a_bind_of_its_seeds_sites_and_p(tokenizer):
    """A prefetch's stacked batch was taken by any bind of exactly its seeds: one over a deeper model of the same width
    bound 4 masks for its 6 sites (an IndexError at its first forward there), one after p was set on the object bound
    the old p's rows at the new p's scale. Only a bind of the draw's seeds, site count, width and p takes it."""
    lm, deeper = make_lm(tokenizer, "qwen2"), make_lm(tokenizer, "qwen2", num_layers=3)
    seeds = torch.tensor([1, 2])
    pert = LockedDropout(p=0.3, sites=["attn", "mlp"])
    pert.prefetch(lm, seeds)
    want = LockedDropout(p=0.3, sites=["attn", "mlp"]).bind(deeper, seeds).masks
    assert torch.equal(pert.bind(deeper, seeds).masks, want)
    pert = LockedDropout(p=0.3, sites=["attn", "mlp"])
    pert.prefetch(lm, seeds)
    pert._prefetch[1].result()  # (drawn at p = 0.3)
    pert.p = 0.6
    assert torch.equal(pert.bind(lm, seeds).masks, LockedDropout(p=0.6, sites=["attn", "mlp"]).bind(lm, seeds).masks)
