"""The latent steps save each layer's keys and values once for backward (dgrpo.model.kv_prefixes), not once per step:
the same log-probs and gradients bit for bit, and exactly the bytes of T - 1 concatenations fewer per layer."""

import gc
import weakref

import pytest
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from dgrpo.bench.recompute_item import ARMS, kept_for_backward
from dgrpo.config import PerturbationConfig
from dgrpo.model.kv_prefixes import OBSERVER, _enclosing_pack_hook, saved_as_prefixes
from dgrpo.model.latent_chain import LatentChain
from dgrpo.perturbation import make_perturbation

from conftest import kv_column_bytes, make_lm

T = 4


def batch(lm, records, n=4):
    qs = [r.question for r in records[:n]]
    targets = ["\n".join(r.steps[2:]) + "\n#### " + r.answer for r in records[:n]]
    return lm.encode_questions(qs) + lm.encode_targets(targets)


def replay(lm, inputs, *, once, recompute=False, latent_steps=False):
    """The update's replay (prompt -> T latent steps -> marker and answer) under locked dropout, backward included:
    its log-probs, every parameter's gradient and the bytes kept for backward."""
    ids, mask, tg, tm = inputs
    lm.save_kv_once, lm.recompute, lm.recompute_latent_steps = once, recompute, latent_steps
    lm.model.zero_grad(set_to_none=True)
    pert = make_perturbation(PerturbationConfig(kind="locked", p=0.3, sites=["attn", "mlp"]))
    out = {}

    def run():
        with pert.bind(lm, torch.arange(ids.shape[0])) as pb:
            lp, _ = lm.target_logprobs(ids, mask, T, tg, tm, perturbation=pb, end_with_targets=True)
        out["lp"] = lp
        (-(lp * tm).sum()).backward()

    kept = kept_for_backward(run, lm.model.parameters())
    grads = {n: p.grad.clone() for n, p in lm.model.named_parameters() if p.grad is not None}
    return out["lp"].detach(), grads, kept


@pytest.mark.parametrize("mode", ARMS)  # bench item 10's recomputation modes: (granularity or None, latent recomputed)
@pytest.mark.parametrize(
    "arch", ["qwen2", pytest.param("llama", marks=pytest.mark.slow), pytest.param("gpt2", marks=pytest.mark.slow)]
)
def test_the_latent_steps_keep_each_layers_keys_and_values_once(tokenizer, task_records, arch, mode):
    granularity, latent_steps = ARMS[mode]
    recompute = granularity or False
    lm = make_lm(tokenizer, arch).eval()
    inputs = batch(lm, task_records)
    lp_each, g_each, kept_each = replay(lm, inputs, once=False, recompute=recompute, latent_steps=latent_steps)
    lp_once, g_once, kept_once = replay(lm, inputs, once=True, recompute=recompute, latent_steps=latent_steps)
    assert torch.equal(lp_each, lp_once)
    assert g_each.keys() == g_once.keys() and g_once
    assert all(torch.equal(g_each[k], g_once[k]) for k in g_each)
    # Kept per step: attention's input, the prompt's P columns and the step's t (t = 1..T); or, for a recomputed
    # step, the region's input, the columns before it (P + t - 1). Once: only the last step's P + T (which the
    # answer's call keeps anyway), as views for every step.
    B, P = inputs[0].shape
    recomputed = recompute and latent_steps
    columns = sum(P + t - 1 for t in range(1, T + 1)) if recomputed else sum(P + t for t in range(1, T))
    if recompute == "layer" and latent_steps and arch == "gpt2":
        columns += P / 2  # (the prompt's keys and values there: views of one tensor that holds the queries too)
    layers = lm.model.config.num_hidden_layers
    assert kept_each - kept_once == columns * layers * kv_column_bytes(lm, B)


@pytest.mark.parametrize("recompute", [False, "layer"])
def test_a_graph_dropped_without_backward_is_freed(tokenizer, task_records, recompute):
    """A step whose loss is dropped unused (a skipped, non-finite step) leaves nothing alive: the saved prefixes hold
    the last keys and values detached, not the tensors whose history holds the prefixes."""
    lm = make_lm(tokenizer, "qwen2").eval()
    lm.recompute, lm.recompute_latent_steps = recompute, False
    ids, mask, _, _ = batch(lm, task_records)
    state = lm.prefill(ids, mask, T, markers=False)
    alive = [weakref.ref(t) for layer in state.cache.layers for t in (layer.keys, layer.values)]
    alive.append(weakref.ref(state.last_hidden))
    del state
    gc.collect()
    assert all(ref() is None for ref in alive), sum(ref() is not None for ref in alive)


def test_the_latent_chain_gives_the_same_gradients(tokenizer, task_records):
    """The update's chain (uncaptured on a CPU) runs the same latent steps inside its Function."""
    lm = make_lm(tokenizer, "qwen2").eval()
    ids, mask, _, _ = batch(lm, task_records)
    grads = []
    for once in (False, True):
        lm.save_kv_once = once
        lm.model.zero_grad(set_to_none=True)
        state = lm.prefill(ids, mask, 0, markers=False)
        out = LatentChain(lm, T, capture=False).run(state, None)
        keys = out.cache.layers[0].keys
        (out.last_hidden.square().sum() + keys.square().sum()).backward()
        grads.append({n: p.grad.clone() for n, p in lm.model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and all(torch.equal(grads[0][k], grads[1][k]) for k in grads[0])


def appended(cache, steps, rows=2, heads=2, dim=4):
    """``steps`` columns appended to every layer of ``cache`` with grad, each step's keys and values saved by a
    product, as attention saves them; the sum to differentiate."""
    total = torch.zeros(())
    w = torch.ones(rows, heads, 1, dim, requires_grad=True)
    for _ in range(steps):
        for i in range(len(cache.layers)):
            k, v = cache.update(w * 2.0, w * 3.0, i)
            total = total + (k * k).sum() + (v * v).sum()
    return total


def filled(layers):
    cache = DynamicCache()
    cache.layers = layers
    cache.update(torch.ones(2, 2, 3, 4), torch.ones(2, 2, 3, 4), 0)  # a prompt of 3 columns
    for i in range(1, len(layers)):
        cache.update(torch.ones(2, 2, 3, 4), torch.ones(2, 2, 3, 4), i)
    return cache


def seen_columns(hook_kind):
    """The columns of the 4-d tensors an enclosing pack hook sees while 3 steps append to a 2-layer cache."""
    seen = []

    def pack(t):
        if t.dim() == 4:
            seen.append(t.shape[-2])
        return t

    if hook_kind == "observer":
        setattr(pack, OBSERVER, True)
    cache = filled([DynamicLayer(), DynamicLayer()])
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), saved_as_prefixes(cache):
        appended(cache, 3).backward()
    return sorted(seen)


def test_an_observer_sees_the_last_keys_and_values_once_and_other_hooks_see_all():
    assert seen_columns("observer") == [6] * 4  # 2 layers x (keys, values), as they are after the 3 steps
    # anyone else's hooks (offloading, a checkpoint region) keep every saved tensor: this stands aside
    assert seen_columns("other") == sorted([4, 4, 5, 5, 6, 6] * 4)


def test_a_cache_that_drops_or_overwrites_columns_is_left_as_it_is():
    sliding = filled([DynamicLayer(), DynamicSlidingWindowLayer(sliding_window=4)])
    with saved_as_prefixes(sliding):
        assert _enclosing_pack_hook() is None
    plain = filled([DynamicLayer(), DynamicLayer()])
    with torch.no_grad(), saved_as_prefixes(plain):
        assert _enclosing_pack_hook() is None
    with saved_as_prefixes(plain):
        assert _enclosing_pack_hook() is not None
