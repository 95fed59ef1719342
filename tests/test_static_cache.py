"""Rollouts over a preallocated ``StaticCache`` (``grpo.rollout_cache: static``, fixed shapes for graph capture)
give the same answers and log-probs as over the growing ``DynamicCache``: ragged left-padded batches, every
architecture, under the perturbation."""

import pytest
import torch

from dgrpo.config import PerturbationConfig
from dgrpo.perturbation import make_perturbation

from conftest import make_lm

ARCHS = ["qwen2", "llama", "gpt2"]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_static_cache_recurrence_equals_dynamic(tokenizer, task_records, arch, temperature):
    lm = make_lm(tokenizer, arch).eval()
    questions = [r.question if i % 2 else r.question[: 25 + i] for i, r in enumerate(task_records[:6])]
    ids, mask = lm.encode_questions(questions)  # ragged: left padding differs per row
    pert = make_perturbation(PerturbationConfig(kind="locked", p=0.3, sites=["attn", "mlp"]))
    out = []
    for static in (False, True):
        gen = torch.Generator().manual_seed(7)
        with torch.no_grad(), pert.bind(lm, torch.arange(6)) as pb:
            out.append(
                lm.generate(
                    ids,
                    mask,
                    3,
                    max_new_tokens=20,
                    temperature=temperature,
                    generator=gen,
                    perturbation=pb,
                    static_cache=static,
                    with_entropy=True,
                )
            )
    dyn, stat = out
    assert torch.equal(dyn.tokens, stat.tokens) and torch.equal(dyn.mask, stat.mask)
    assert torch.allclose(dyn.logprobs, stat.logprobs, atol=1e-5, rtol=0)
    assert torch.allclose(dyn.entropy, stat.entropy, atol=1e-5, rtol=0)
    # and the hidden state the latent chain hands to the answer
    with torch.no_grad():
        a = lm.prefill(ids, mask, 3).last_hidden
        b = lm.prefill(ids, mask, 3, cache_len=ids.shape[1] + 4).last_hidden
    assert torch.allclose(a, b, atol=1e-5, rtol=0)
