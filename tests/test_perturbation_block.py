"""Inside a bound perturbation's ``with`` block, a forward given no ``perturbation=`` runs under it as one given it."""

import pytest
import torch

from dgrpo.model import latent_lm
from dgrpo.perturbation import GaussianNoise, LockedDropout, NativeDropout, seeds_for

from conftest import make_lm

T = 2

KINDS = [
    NativeDropout(p=0.5),
    NativeDropout(p=0.5, perturb_prompt=False),
    LockedDropout(p=0.5, perturb_prompt=False),
    GaussianNoise(sigma=0.5, perturb_answer=False),
]
IDS = ["native", "native-answer-only", "locked-answer-only", "gaussian-no-answer"]


@pytest.mark.parametrize("pert", KINDS, ids=IDS)
def test_a_forward_in_the_block_without_perturbation_given_is_the_one_given_it(tokenizer, task_records, pert):
    """Native dropout was reseeded and switched per phase only by forwards given ``perturbation=``: in its block a
    generate without it ran the unperturbed network before one given it and, after, the dropout that call left on,
    unseeded (two identical calls, two answers). The hooked kinds acted there on the phase the last forward given it
    left (the prompt's before any: ``perturb_prompt=false`` perturbed nothing; the answer's after one: the prompt
    perturbed). Now every forward in the block reads the bound perturbation, given or not."""
    lm = make_lm(tokenizer, "qwen2").eval()
    ids, mask = lm.encode_questions([task_records[0].question])
    targets = lm.encode_targets([task_records[0].answer])
    run = lambda **kw: lm.generate(ids, mask, T, max_new_tokens=4, **kw).logprobs  # noqa: E731
    score = lambda **kw: lm.target_logprobs(ids, mask, T, *targets, stepwise=True, **kw)[0]  # noqa: E731
    with torch.no_grad():
        plain = run()
        with pert.bind(lm, seeds_for(0, 0, 0, 1)) as pb:
            first, given, again = run(), run(perturbation=pb), run()
            scored, scored_given = score(), score(perturbation=pb)
        after = run()
    assert not torch.equal(given, plain)
    assert torch.equal(first, given) and torch.equal(again, given)
    assert torch.equal(scored, scored_given)
    assert torch.equal(after, plain) and latent_lm.open_perturbation(lm.model) is None  # (closed with its block)


def test_native_dropout_in_its_block_refuses_what_it_refuses_given(tokenizer, task_records):
    """Given no ``perturbation=`` in a native block, a batch of two rows (one seed bound) and a one-forward scoring
    of the answer (its masks are drawn per forward call) ran without a word; each is the error it is when given."""
    lm = make_lm(tokenizer, "qwen2").eval()
    ids, mask = lm.encode_questions([r.question for r in task_records[:2]])
    targets = lm.encode_targets([r.answer for r in task_records[:2]])
    with torch.no_grad(), NativeDropout(p=0.5).bind(lm, seeds_for(0, 0, 0, 1)):
        with pytest.raises(ValueError, match=r"^the perturbation is bound for 1 rows .*this batch has 2 "):
            lm.generate(ids, mask, T, max_new_tokens=2)
        with pytest.raises(ValueError, match="draws its noise per forward call; .* pass stepwise=True"):
            lm.target_logprobs(ids[:1], mask[:1], T, targets[0][:1], targets[1][:1])


def test_the_innermost_open_block_is_the_one_a_forward_runs_under(tokenizer, task_records):
    """Blocks of two bound perturbations over one model: a forward given none runs under the inner one, then, once it
    closes, under the outer one again."""
    lm = make_lm(tokenizer, "qwen2").eval()
    ids, mask = lm.encode_questions([task_records[0].question])
    run = lambda **kw: lm.generate(ids, mask, T, max_new_tokens=4, **kw).logprobs  # noqa: E731
    outer, inner = NativeDropout(p=0.5), NativeDropout(p=0.5)
    with torch.no_grad(), outer.bind(lm, seeds_for(0, 0, 0, 1)) as po:
        with inner.bind(lm, seeds_for(1, 0, 0, 1)) as pi:
            under_inner = run(perturbation=pi)
            assert torch.equal(run(), under_inner)
        assert torch.equal(run(), run(perturbation=po))
        assert not torch.equal(run(perturbation=po), under_inner)


def test_a_kind_of_ones_own_runs_under_its_block_given_no_perturbation(tokenizer, task_records):
    """A kind of one's own (a ``HookedPerturbation`` whose ``bind`` names no model) is opened over the model it binds
    as the built-in ones are: its hooks acted in the block on the phase the last forward given it left (here the
    prompt's: a noise that spares the prompt changed nothing)."""
    from dgrpo.model.anatomy import find_sites
    from dgrpo.perturbation import HookedPerturbation, Perturbation

    class Doubled(HookedPerturbation):
        def hook(self, k):
            return lambda module, args, output: 2 * output if self.active else output

    class Doubling(Perturbation):
        def bind(self, lm, seeds):
            return Doubled([s.module for s in find_sites(lm.model, ["mlp"], "all")], perturb_prompt=False)

    lm = make_lm(tokenizer, "qwen2").eval()
    ids, mask = lm.encode_questions([task_records[0].question])
    run = lambda **kw: lm.generate(ids, mask, T, max_new_tokens=4, **kw).logprobs  # noqa: E731
    with torch.no_grad():
        plain = run()
        with Doubling().bind(lm, torch.tensor([1])) as pb:
            inside, given = run(), run(perturbation=pb)
    assert not torch.equal(given, plain) and torch.equal(inside, given)


@pytest.mark.parametrize("pert", [LockedDropout(p=0.3), GaussianNoise(sigma=0.3)], ids=["locked", "gaussian"])
def test_a_flattened_output_is_checked_for_the_rows_bound(tokenizer, pert):
    """Llama 4's mixture of experts returns its tokens flattened, [B*T, H]: the rows check skipped it, and a forward in
    the block over other rows (the model's own, not LatentLM's, which checks them first) spread the bound rows' noise
    over the batch without a word (2 seeds over 4 rows: rows 0-1 under seed 5, rows 2-3 under seed 6; 1 seed: every
    row under it). Its batch is read off the [B, T, H] input it was flattened from; the rows bound still run."""
    from test_model_families import family_lm

    lm = family_lm(tokenizer, "llama4_text")
    q, qm = lm.encode_questions([f"Start with {n}. Add 1. Answer mod 10." for n in range(4)])
    with torch.no_grad():
        for seeds in ([5, 6], [5]):
            with pert.bind(lm, torch.tensor(seeds)):
                with pytest.raises(ValueError, match=rf"^the perturbation is bound for {len(seeds)} rows .* has 4 "):
                    lm.model(input_ids=q, attention_mask=qm)
        plain = lm.model(input_ids=q, attention_mask=qm).logits
        with pert.bind(lm, torch.tensor([5, 6, 7, 8])):
            bound = lm.model(input_ids=q, attention_mask=qm).logits
        with pert.bind(lm, torch.tensor([6])):
            alone = lm.model(input_ids=q[1:2], attention_mask=qm[1:2]).logits
    assert not torch.allclose(bound, plain) and torch.allclose(bound[1], alone[0], atol=1e-5)


def test_a_flattened_output_whose_rows_cannot_be_told_is_refused():
    """A per-row factor on an output flattened to [N, H] from an input that does not tell its batch (no [B, T, H]
    input of B*T = N rows) was spread over its rows by their count alone (N divisible by the rows bound); refused."""
    from dgrpo.model.compiled_layers import output_factor_hook

    hook = output_factor_hook(lambda: torch.full((2, 1, 3), 2.0))
    flat = torch.ones(12, 3)
    assert torch.equal(hook(None, (torch.ones(2, 6, 3),), flat), 2 * flat)  # (its batch read off the input)
    with pytest.raises(ValueError, match=r"^the perturbation is bound for 2 rows .*this batch has 4 "):
        hook(None, (torch.ones(4, 3, 3),), flat)
    with pytest.raises(ValueError, match=r"^a perturbed module's output is flattened to \(12, 3\) and no "):
        hook(None, (flat,), flat)


def test_a_block_entered_again_inside_itself_applies_its_noise_once(tokenizer, task_records):
    """Entering a bound perturbation inside its own block (it is re-entrant: a recomputation may) installs nothing
    more: the same noise, applied once; leaving the inner block leaves it on, leaving the outer one removes every
    hook (a hook left behind perturbed every later forward)."""
    lm = make_lm(tokenizer, "qwen2").eval()
    ids, mask = lm.encode_questions([task_records[0].question])
    run = lambda: lm.prefill(ids, mask, T, markers=False).last_hidden  # noqa: E731
    pb = LockedDropout(p=0.5, sites=["attn", "mlp"]).bind(lm, seeds_for(0, 0, 0, 1))
    with torch.no_grad():
        clean = run()
        with pb:
            once = run()
            with pb:
                assert torch.equal(run(), once)
            assert torch.equal(run(), once)
        assert torch.equal(run(), clean) and not torch.equal(once, clean)
    assert all(not m._forward_hooks for m in pb.modules) and lm.model not in latent_lm.OPEN_PERTURBATIONS


def test_blocks_closed_in_another_order_than_opened_leave_the_other_open(tokenizer, task_records):
    """Two bound perturbations opened over one model, the first closed first: a forward given none runs under the
    second (its latent steps perturbed, its prompt not), and nothing is open once both are closed."""
    lm = make_lm(tokenizer, "qwen2").eval()
    ids, mask = lm.encode_questions([task_records[0].question])
    run = lambda **kw: lm.prefill(ids, mask, T, markers=False, **kw).last_hidden  # noqa: E731
    first, second = (LockedDropout(p=0.5, perturb_prompt=False).bind(lm, seeds_for(s, 0, 0, 1)) for s in (0, 1))
    with torch.no_grad():
        clean = run()
        with second:
            want = run(perturbation=second)
        first.__enter__()
        second.__enter__()
        first.__exit__(None, None, None)
        assert latent_lm.OPEN_PERTURBATIONS[lm.model] == [second]
        assert torch.equal(run(), want) and not torch.equal(want, clean)
        second.__exit__(None, None, None)
        assert lm.model not in latent_lm.OPEN_PERTURBATIONS and torch.equal(run(), clean)


@pytest.mark.parametrize("granularity", ["call", "layer"])
def test_a_backward_inside_the_block_recomputes_under_the_noise_applied_once(tokenizer, task_records, granularity):
    """A recomputed call or layer whose backward runs while the block is still open (the trainer's runs after it)
    takes the hooks installed already: the noise applied once, the gradient full backprop's (hooks added again gave
    each recomputed site its mask twice)."""
    from conftest import scored_with_grad

    lm = make_lm(tokenizer, "qwen2").eval()
    ids, mask = lm.encode_questions([r.question for r in task_records[:2]])
    tg, tm = lm.encode_targets([r.answer for r in task_records[:2]])
    pert = LockedDropout(p=0.5, sites=["attn", "mlp"])
    scored = {}
    for recompute in (False, granularity):
        lm.recompute = recompute
        with pert.bind(lm, torch.tensor([3, 4])):
            scored[recompute] = scored_with_grad(lm, ids, mask, T, tg, tm)
    (lp, grad), (lp_again, grad_again) = scored.values()
    assert torch.allclose(lp, lp_again, atol=1e-6) and torch.allclose(grad, grad_again, atol=1e-6)
