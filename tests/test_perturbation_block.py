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
