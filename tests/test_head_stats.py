"""The head statistics (dgrpo.model.head_stats): the compiled form gives eager's values and gradients (fp32, 1e-5;
on this CPU through inductor's C++ backend), its greedy tokens are eager's, it serves scoring through the head's
checkpointed chunks and the rollouts, and a compiler that fails leaves the eager form with one warning."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch._dynamo.exc import FailOnRecompileLimitHit, TorchDynamoException
from torch._dynamo.utils import counters

from dgrpo.config import ModelConfig
from dgrpo.model import head_stats
from dgrpo.model.factory import compile_head
from dgrpo.model.head_stats import HeadStats, eager_greedy, eager_target_logprobs

from conftest import make_lm, scored_with_grad


@pytest.fixture(scope="module")
def compiled() -> HeadStats:
    return HeadStats(compiled=True)


def weighted_grad(logp, x):
    """d/dx of a weighted sum of the log-probs (every position its own weight, so a wrong row or column shows)."""
    w = torch.linspace(-1.0, 2.0, logp.numel()).view(logp.shape)
    (grad,) = torch.autograd.grad((logp * w).sum(), x)
    return grad


@pytest.mark.slow  # (each compiled test compiles, seconds: the quick tier keeps the eager form's and the fall-back's)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_target_logprobs_and_gradients_are_eagers(compiled, dtype):
    """Row counts and chunk widths vary, one position wide included, as in scoring (the logits a view of the head's
    [rows, V] output, the targets a chunk's strided slice): the same log-probs and logits' gradients as eager's fp32
    log-softmax, to float rounding (1e-5; a bf16 gradient to its last bit), from one dynamic graph (the width of 1,
    the 2-d call and the strided targets each compiled one more, forward and backward: three times the compiling)."""
    torch.manual_seed(0)
    counters.clear()
    for shape in [(4, 3, 500), (7, 1, 500), (2, 5, 500), (9, 500)]:
        x = (torch.randn(math.prod(shape[:-1]), shape[-1]) * 4).to(dtype).requires_grad_()
        wide = torch.randint(0, shape[-1], (shape[0], shape[1] + 2) if len(shape) == 3 else shape[:1])
        t = wide[:, 1 : shape[1] + 1] if len(shape) == 3 else wide  # (a chunk of [B, L] targets: strided)
        logits = x.view(shape)
        got, want = compiled.target_logprobs(logits, t), eager_target_logprobs(logits, t)
        assert got.dtype == want.dtype == torch.float32
        assert torch.allclose(got, want, atol=1e-5), (shape, (got - want).abs().max())
        g_got, g_want = weighted_grad(got, x), weighted_grad(want, x)
        assert g_got.dtype == dtype
        tol = 1e-5 if dtype == torch.float32 else 2**-7 * g_want.abs().max().item()
        assert torch.allclose(g_got.float(), g_want.float(), atol=tol), (shape, (g_got - g_want).abs().max())
    assert compiled.compiled
    assert counters["stats"]["unique_graphs"] <= 1, dict(counters["stats"])  # (none: a test before made it)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_greedy_choice_books_eagers_tokens_logprobs_and_entropies(compiled, dtype):
    torch.manual_seed(1)
    logits = (torch.randn(6, 400) * 5).to(dtype)
    logits[3, 11] = logits[3, 40] = logits[3].max() + 1  # a tie: the first index, as eager's argmax
    with torch.no_grad():  # (as the rollouts run it: a call with grad would compile another graph)
        (tok, lp, ent), (tok0, lp0, ent0) = compiled.greedy(logits, True), eager_greedy(logits, True)
        assert compiled.greedy(logits, False)[2] is None
    assert torch.equal(tok, tok0) and int(tok[3]) == 11
    assert ent is not None and ent0 is not None
    assert torch.allclose(lp, lp0, atol=1e-5) and torch.allclose(ent, ent0, atol=1e-5)


@pytest.mark.slow
def test_scoring_and_rollouts_with_the_compiled_head_are_eagers(tokenizer, task_records, compiled):
    """A tiny model's teacher-forced log-probs and weight gradients, one chunk and in checkpointed position chunks
    (the compiled reduction runs again in backward), and its greedy rollouts: compiled as eager (fp32, 1e-5)."""
    lm = make_lm(tokenizer, "qwen2").eval()
    qs = [r.question for r in task_records[:4]]
    ids, mask = lm.encode_questions(qs)
    tg, tm = lm.encode_targets(["\n".join(r.steps[2:]) + "\n#### " + r.answer for r in task_records[:4]])
    results = {}
    for form, stats in (("eager", HeadStats()), ("compiled", compiled)):
        lm.head_stats = stats
        for chunk in (1 << 26, 3 * 4 * len(lm.tokenizer)):
            lm.logit_chunk_elems = chunk
            results[form, chunk] = scored_with_grad(lm, ids, mask, 2, tg, tm)
        gen = lm.generate(ids, mask, 2, max_new_tokens=8, with_entropy=True)
        results[form, "gen"] = (gen.tokens, gen.logprobs, gen.entropy)
    for key in (1 << 26, 3 * 4 * len(lm.tokenizer)):
        (lp0, g0), (lp1, g1) = results["eager", key], results["compiled", key]
        assert torch.allclose(lp0, lp1, atol=1e-5), (key, (lp0 - lp1).abs().max())
        assert torch.allclose(g0, g1, atol=1e-5, rtol=1e-5), (key, (g0 - g1).abs().max())
    (t0, l0, e0), (t1, l1, e1) = results["eager", "gen"], results["compiled", "gen"]
    assert torch.equal(t0, t1) and torch.allclose(l0, l1, atol=1e-5) and torch.allclose(e0, e1, atol=1e-5)


@pytest.mark.parametrize(
    "error",
    [
        TorchDynamoException("no compiler here\nmore detail"),
        # the recompile limit hit under fullgraph (a plain Exception; one shape, dtype or grad mode too many): it
        # escaped the fall-back and stopped the step (found by a review)
        FailOnRecompileLimitHit("Hard failure due to fullgraph=True"),
    ],
    ids=type,
)
def test_a_compiler_that_fails_leaves_the_eager_form_with_one_warning(monkeypatch, error):
    def broken(fn, **kw):
        def run(*a):
            raise error

        return run

    monkeypatch.setattr(head_stats.torch, "compile", broken)
    stats = HeadStats(compiled=True)
    x, t = torch.randn(3, 50), torch.tensor([1, 2, 3])
    with pytest.warns(
        RuntimeWarning, match=r"model.compile_head: the compiled head statistics failed.*eager form runs"
    ):
        got = stats.target_logprobs(x, t)
    assert torch.equal(got, eager_target_logprobs(x, t)) and not stats.compiled
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning: the eager form from now on
        tok, lp, ent = stats.greedy(x, True)
    assert torch.equal(lp, eager_greedy(x, True)[1])


def test_compile_head_auto_is_on_only_on_cuda(tokenizer):
    lm = make_lm(tokenizer)
    for setting, on in (("auto", False), ("true", True), ("false", False)):
        compile_head(lm, ModelConfig(compile_head=setting))
        assert lm.head_stats.compiled is on, setting
