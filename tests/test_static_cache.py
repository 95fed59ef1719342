"""Rollouts over a preallocated ``StaticCache`` (``grpo.rollout_cache: static``, fixed shapes for graph capture)
give the same answers and log-probs as over the growing ``DynamicCache``: ragged left-padded batches, every
architecture, under the perturbation."""

from functools import partial

import pytest
import torch

from dgrpo.config import PerturbationConfig
from dgrpo.model.latent_lm import static_length
from dgrpo.perturbation import make_perturbation

from conftest import make_lm, windowed_qwen2_config

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


def transformers_static_cache(config, max_cache_len, device):
    """transformers' own ``StaticCache`` (a write offset per layer), to compare the shared-offset one with."""
    from transformers import StaticCache

    return StaticCache(config=config, max_cache_len=max_cache_len)


def test_the_shared_offset_layers_write_what_transformers_layers_write():
    """Keys and values written over two batches (a prompt, one-position steps, a crop of the last two, a reset,
    again) sit in the same columns as in transformers' ``StaticCache``, and the cached length reads the same."""
    from transformers import Qwen2Config

    from dgrpo.model.static_cache import SharedOffsetLayer, static_cache

    cfg = Qwen2Config(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2)
    ours, theirs = static_cache(cfg, 12, torch.device("cpu")), transformers_static_cache(cfg, 12, "cpu")
    assert all(isinstance(layer, SharedOffsetLayer) for layer in ours.layers)
    gen = torch.Generator().manual_seed(0)
    for lengths in ([5, 1, 1, 1], [7, 2, -2, 1]):  # (-2: a crop, the last two positions written over next)
        ours.reset(), theirs.reset()
        for n in lengths:
            if n < 0:
                ours.crop(n), theirs.crop(n)  # (the shared offset moves back once, not once per layer)
            for i in range(3 if n > 0 else 0):
                k, v = (torch.randn(2, 2, n, 8, generator=gen) for _ in range(2))
                a, b = ours.update(k, v, i), theirs.update(k, v, i)
                assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
            assert int(ours.get_seq_length()) == int(theirs.get_seq_length())
    assert int(ours.get_seq_length()) == 8


@pytest.mark.parametrize("arch", ARCHS)
def test_the_shared_offset_gives_transformers_caches_rollouts_with_fewer_ops_per_layer(
    tokenizer, task_records, arch, monkeypatch
):
    """Rollouts over the shared-offset cache equal those over transformers' ``StaticCache`` bit for bit (ragged
    prompts, locked dropout, sampled answers), and a one-position step of the fast engine runs three ops fewer in
    every layer but the first (the columns and the offset's advance, once per call)."""
    from dgrpo.bench.step_profile import counted_ops
    from dgrpo.model import latent_lm as latent_lm_module
    from dgrpo.model.fixed_shape import FixedShapeDecoder

    lm = make_lm(tokenizer, arch, num_layers=3).eval()
    questions = [r.question if i % 2 else r.question[: 25 + i] for i, r in enumerate(task_records[:6])]
    ids, mask = lm.encode_questions(questions)
    pert = make_perturbation(PerturbationConfig(kind="locked", p=0.3, sites=["attn", "mlp"]))
    out, ops = [], []
    for make in (latent_lm_module.static_cache, transformers_static_cache):
        monkeypatch.setattr(latent_lm_module, "static_cache", make)
        gen = torch.Generator().manual_seed(7)
        with torch.no_grad(), pert.bind(lm, torch.arange(6)) as pb:
            g = lm.generate(
                ids, mask, 3, max_new_tokens=12, temperature=1.0, generator=gen, perturbation=pb, static_cache=True
            )
            out.append((g.tokens, g.mask, g.logprobs))
            dec = FixedShapeDecoder(lm, ids.shape[0], ids.shape[1] + 8, capture=False)
            dec.start(ids, mask, pb)
            ops.append(counted_ops(partial(dec._forward, "latent"))[1])
    assert all(torch.equal(a, b) for a, b in zip(*out))
    assert ops[1] - ops[0] == 3 * (lm.model.config.num_hidden_layers - 1)


def test_caches_with_other_layers_keep_transformers_own():
    """A model with sliding-window layers gets transformers' ``StaticCache`` as it is, each layer's write offset made
    on the cache's device (its first update would otherwise copy it from the host): built on the meta device, which
    a CPU has."""
    from dgrpo.model.static_cache import SharedOffsetLayer, static_cache

    cfg = windowed_qwen2_config()
    cache = static_cache(cfg, 12, torch.device("meta"))
    assert not any(isinstance(layer, SharedOffsetLayer) for layer in cache.layers)
    assert {type(layer).__name__ for layer in cache.layers} == {"StaticLayer", "StaticSlidingWindowLayer"}
    offsets = [layer.cumulative_length for layer in cache.layers]
    assert len(offsets) == 2 and all(t.device.type == "meta" and t.shape == () for t in offsets)


def test_a_trainer_refuses_static_cache_rollouts_under_native_dropout(tokenizer, task_records):
    """Native dropout draws its masks in the shape of each forward's attention, which the static cache widens to its
    preallocated length: one rollout's log-probs over it were 4e-2 from the same rollout's over the growing cache the
    update replays (a trainer's logp_replay_maxdiff 5e-2 in fp32), so the trainer refuses the combination at once."""
    from dgrpo.config import Config, ConfigError, load_config
    from dgrpo.training.grpo import GRPOTrainer

    lm = make_lm(tokenizer, "qwen2").eval()
    ids, mask = lm.encode_questions([task_records[0].question])
    pert = make_perturbation(PerturbationConfig(kind="native", p=0.3))
    logp = []
    for static in (False, True):
        with torch.no_grad(), pert.bind(lm, torch.tensor([5])) as pb:
            gen = lm.generate(ids, mask, 2, max_new_tokens=6, perturbation=pb, static_cache=static)
            logp.append(gen.logprobs)
    assert not torch.allclose(logp[0], logp[1], atol=1e-3)  # the masks differ with the cache's shape
    with pytest.raises(ConfigError, match=r"grpo.rollout_cache: native dropout .* \(set grpo.rollout_cache=dynamic\)"):
        load_config(Config, "tiny.yaml", ["perturbation.kind=native", "grpo.rollout_cache=static"])
    # the config names the built-in kind; the trainer refuses any kind of one rollout at a time (a plug-in's too)
    kind = "dgrpo.perturbation.native:NativeDropout"
    cfg = load_config(Config, "tiny.yaml", [f"perturbation.kind={kind}", "grpo.rollout_cache=static"])
    with pytest.raises(ConfigError, match=f"grpo.rollout_cache=static: perturbation.kind={kind} runs one rollout"):
        GRPOTrainer(make_lm(tokenizer, "qwen2"), cfg, task_records)


def test_generates_static_cache_holds_exactly_the_positions_it_writes(tokenizer, task_records, monkeypatch):
    """``generate(static_cache=True)`` preallocates the prompt, the latents, the end marker and every answer token
    but the last (the last is chosen, never fed back): a full-length answer fills the cache to its last column (it
    held one column more, never written)."""
    from dgrpo.model import latent_lm as latent_lm_module

    made, original = [], latent_lm_module.static_cache
    monkeypatch.setattr(latent_lm_module, "static_cache", lambda *a: made.append(original(*a)) or made[-1])
    lm = make_lm(tokenizer).eval()
    ids, mask = lm.encode_questions([r.question for r in task_records[:2]])
    with torch.no_grad():
        g = lm.generate(ids, mask, 3, max_new_tokens=6, static_cache=True, stop_ids=[])
    assert bool(g.mask[:, -1].all()), "a row stopped early: the cache is not full"
    (cache,) = made
    assert int(cache.get_seq_length()) == static_length(cache) == ids.shape[1] + 3 + 1 + 6 - 1
