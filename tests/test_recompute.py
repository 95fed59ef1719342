"""Activation recomputation through the recurrence (``grpo.recompute``, per call or per layer): the same log-probs and
gradients as full backprop under every perturbation, with less kept for backward."""

import gc
import warnings
import weakref
from unittest import mock

import pytest
import torch
import torch.utils.checkpoint

from dgrpo.config import Config, PerturbationConfig
from dgrpo.perturbation import make_perturbation

from conftest import make_lm

ARCHS = ["qwen2", "llama", "gpt2"]
KINDS = [
    {"kind": "none"},
    {"kind": "locked", "p": 0.3, "sites": ["attn", "mlp", "residual"]},
    {"kind": "native", "p": 0.3},
    {"kind": "gaussian", "sigma": 0.2},
    {"kind": "gaussian", "sigma": 0.05, "gaussian_target": "weights"},
]


def batch(lm, records, n=4):
    qs = [r.question for r in records[:n]]
    targets = ["\n".join(r.steps[2:]) + "\n#### " + r.answer for r in records[:n]]
    return lm.encode_questions(qs) + lm.encode_targets(targets)


def loss_and_grads(lm, inputs, *, recompute, pert=None, seeds=None, n_latent=3, stepwise=False, latent_steps=True):
    """Answer NLL through prompt -> T latent steps -> answer (under the perturbation bound to ``seeds``), and the
    gradient of every parameter; backward runs after the perturbation's block, as in the trainer. ``latent_steps``:
    whether the latent steps' calls are recomputed too."""
    ids, mask, tg, tm = inputs
    lm.recompute, lm.recompute_latent_steps = recompute, latent_steps
    lm.model.zero_grad(set_to_none=True)
    if pert is None:
        lp, _ = lm.target_logprobs(ids, mask, n_latent, tg, tm, stepwise=stepwise)
    else:
        with pert.bind(lm, seeds) as pb:
            lp, _ = lm.target_logprobs(ids, mask, n_latent, tg, tm, perturbation=pb, stepwise=stepwise)
    loss = -(lp * tm).sum() / tm.sum()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in lm.model.named_parameters() if p.grad is not None}
    return lp.detach(), grads


def assert_same(a, b, tol=1e-5):
    lp_a, g_a = a
    lp_b, g_b = b
    assert torch.allclose(lp_a, lp_b, atol=tol, rtol=0), (lp_a - lp_b).abs().max()
    assert g_a.keys() == g_b.keys() and g_a
    worst = max(float((g_a[k] - g_b[k]).abs().max()) for k in g_a)
    assert worst <= tol, worst


GRANULARITIES = ["call", "layer"]


@pytest.mark.parametrize("granularity", GRANULARITIES)
@pytest.mark.parametrize("arch", ARCHS)
def test_recomputed_backprop_equals_full_backprop(tokenizer, task_records, arch, granularity):
    from dgrpo.model.anatomy import decoder_layers

    lm = make_lm(tokenizer, arch).eval()
    inputs = batch(lm, task_records)
    full = loss_and_grads(lm, inputs, recompute=False)
    with mock.patch.object(torch.utils.checkpoint, "checkpoint", wraps=torch.utils.checkpoint.checkpoint) as regions:
        lean = loss_and_grads(lm, inputs, recompute=granularity)
    assert_same(full, lean)
    calls = 1 + 3 + 2  # the prompt, T = 3 latent steps, <|end-latent|> and the answer: one region each (call) ...
    per_call = len(decoder_layers(lm.model)) if granularity == "layer" else 1  # ... or one per layer of each
    assert regions.call_count >= calls * per_call  # (+ the LM head's logit chunks, when they are chunked)


@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_latent_steps_that_keep_their_activations_give_the_same_gradients(tokenizer, task_records, granularity):
    """``recompute_latent_steps=false``: the T latent calls keep their activations and are not run again in backward
    (no region, one decoder forward fewer each), the prompt and the answer are recomputed; full backprop's log-probs
    and gradients, under locked dropout."""
    from dgrpo.model.anatomy import block_part, decoder_layers

    lm = make_lm(tokenizer, "qwen2").eval()
    pert = make_perturbation(PerturbationConfig(kind="locked", p=0.3, sites=["attn", "mlp"]))
    inputs, seeds, T = batch(lm, task_records), torch.arange(5, 9), 3
    full = loss_and_grads(lm, inputs, recompute=False, pert=pert, seeds=seeds, n_latent=T)
    first_mlp = block_part(decoder_layers(lm.model)[0], "mlp")  # (a layer region reruns the layer's forward itself)
    counts = {}
    for latent_steps in (True, False):
        forwards = []
        hook = first_mlp.register_forward_pre_hook(lambda *a, out=forwards: out.append(1))
        wrap = mock.patch.object(torch.utils.checkpoint, "checkpoint", wraps=torch.utils.checkpoint.checkpoint)
        with wrap as regions:
            got = loss_and_grads(
                lm, inputs, recompute=granularity, pert=pert, seeds=seeds, n_latent=T, latent_steps=latent_steps
            )
        hook.remove()
        assert_same(full, got)
        counts[latent_steps] = (regions.call_count, len(forwards))
    per_call = len(decoder_layers(lm.model)) if granularity == "layer" else 1
    calls = 1 + T + 2  # the prompt, the latent steps, <|end-latent|> and the answer: each runs layer 0 once forward
    assert counts[True][0] - counts[False][0] == T * per_call  # no region around a latent step's call or layers
    assert counts[True][1] == 2 * calls and counts[False][1] == 2 * calls - T  # ... and no second forward of them


@pytest.mark.parametrize("granularity", GRANULARITIES)
@pytest.mark.parametrize("spec", KINDS, ids=lambda s: "-".join(str(v) for v in s.values()))
def test_recomputation_replays_every_perturbation(tokenizer, task_records, spec, granularity):
    """The recomputation in backward runs outside the perturbation's block: it must re-enter it, or the gradient
    would be taken through the unperturbed network."""
    lm = make_lm(tokenizer, "qwen2").eval()
    pert = make_perturbation(PerturbationConfig(**spec))
    rows = 1 if spec["kind"] == "native" else 4  # native dropout: one rollout at a time, scored token by token
    inputs = batch(lm, task_records, n=rows)
    seeds = torch.arange(11, 11 + rows)
    kw = {"pert": pert, "seeds": seeds, "stepwise": spec["kind"] == "native"}
    full = loss_and_grads(lm, inputs, recompute=False, **kw)
    assert_same(full, loss_and_grads(lm, inputs, recompute=granularity, **kw))
    if spec["kind"] != "none":  # and the perturbation did act: without it the gradient differs
        plain = loss_and_grads(lm, inputs, recompute=granularity)
        assert max(float((full[1][k] - plain[1][k]).abs().max()) for k in full[1]) > 1e-4


@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_recomputation_reaches_the_layers_when_no_input_requires_grad(tokenizer, task_records, granularity):
    """Frozen embeddings (and a frozen tied head): the prompt call's inputs need no grad, so a reentrant region
    would leave its layers without gradients; every layer still gets full backprop's gradients."""
    lm = make_lm(tokenizer, "qwen2").eval()
    lm.model.get_input_embeddings().weight.requires_grad_(False)
    inputs = batch(lm, task_records)
    full = loss_and_grads(lm, inputs, recompute=False)
    layers = [n for n in full[1] if ".layers.0." in n]
    assert layers and "model.embed_tokens.weight" not in full[1]
    assert_same(full, loss_and_grads(lm, inputs, recompute=granularity), tol=0.0)


def saved_bytes(lm, inputs, recompute, latent_steps=True):
    """Bytes autograd keeps for backward (distinct storages, weights left out): one micro-batch's activations."""
    from dgrpo.bench.recompute_item import kept_for_backward

    run = lambda: loss_and_grads(lm, inputs, recompute=recompute, n_latent=6, latent_steps=latent_steps)  # noqa: E731
    return kept_for_backward(run, lm.model.parameters())


def test_recomputation_keeps_less_for_backward(tokenizer, task_records):
    lm = make_lm(tokenizer, "qwen2", hidden_size=64, intermediate_size=256).eval()
    inputs = batch(lm, task_records, n=8)
    full, call, layer = (saved_bytes(lm, inputs, r) for r in (False, "call", "layer"))
    # the call regions keep their inputs and the K/V they hand on; the layer regions keep each layer's input too
    assert call < layer < 0.5 * full, (call, layer, full)
    # latent steps that keep their activations: one position per row each, of the ~40 a row runs through
    call_kept, layer_kept = (saved_bytes(lm, inputs, r, latent_steps=False) for r in ("call", "layer"))
    assert call < call_kept < 0.5 * full and layer < layer_kept < 0.5 * full, (call_kept, layer_kept, full)


@pytest.mark.slow
def test_layers_kept_out_of_recomputation_give_the_same_gradients_and_keep_their_activations(tokenizer, task_records):
    """``recompute_kept_layers``: the last layers run as they are (no region, no second forward), the others are
    recomputed; full backprop's log-probs and gradients under locked dropout, and what is kept for backward grows
    by about one layer's activations per layer kept."""
    from dgrpo.model.anatomy import block_part, decoder_layers

    lm = make_lm(tokenizer, "qwen2", num_layers=4, hidden_size=64, intermediate_size=256).eval()
    pert = make_perturbation(PerturbationConfig(kind="locked", p=0.3, sites=["attn", "mlp"]))
    inputs, seeds, T = batch(lm, task_records, n=8), torch.arange(5, 13), 3
    full = loss_and_grads(lm, inputs, recompute=False, pert=pert, seeds=seeds, n_latent=T)
    layers = decoder_layers(lm.model)
    calls = 1 + T + 2  # the prompt, the latent steps, <|end-latent|> and the answer
    kept_bytes, region_counts = [], []
    for kept in (0, 1, 4):
        lm.recompute_kept_layers = kept
        forwards = {0: [], 3: []}  # the first layer's MLP and the last one's
        hooks = [
            block_part(layers[i], "mlp").register_forward_pre_hook(lambda *a, n=forwards[i]: n.append(1))
            for i in forwards
        ]
        wrap = mock.patch.object(torch.utils.checkpoint, "checkpoint", wraps=torch.utils.checkpoint.checkpoint)
        with wrap as regions:
            got = loss_and_grads(lm, inputs, recompute="layer", pert=pert, seeds=seeds, n_latent=T)
        for h in hooks:
            h.remove()
        assert_same(full, got)
        region_counts.append(regions.call_count)
        if kept == 1:  # one region fewer per call, and the last layer runs once per call, not twice
            assert len(forwards[3]) == calls and len(forwards[0]) == 2 * calls
        if kept == 4:
            assert len(forwards[0]) == calls
        kept_bytes.append(saved_bytes(lm, inputs, "layer"))
    lm.recompute_kept_layers = 0
    all_recomputed, one_kept, none_recomputed = kept_bytes
    assert region_counts[0] - region_counts[1] == calls and region_counts[0] - region_counts[2] == 4 * calls
    assert all_recomputed < one_kept < none_recomputed <= saved_bytes(lm, inputs, False) * 1.01
    # (one kept layer: about a quarter of the way from every layer recomputed to none, with 4 layers)
    assert 0.1 < (one_kept - all_recomputed) / (none_recomputed - all_recomputed) < 0.4


def test_the_trainers_check_the_kept_layers_against_the_model(tokenizer):
    from dgrpo.config import ConfigError, GRPOConfig

    lm = make_lm(tokenizer, "qwen2")  # 2 layers
    with pytest.raises(
        ConfigError, match="recompute_kept_layers: 3 layers kept out of recomputation, but the model has 2"
    ):
        lm.use_recompute(GRPOConfig(recompute=True, recompute_kept_layers=3), "grpo")
    lm.use_recompute(GRPOConfig(recompute=True, recompute_kept_layers=2, recompute_latent_steps=False), "grpo")
    assert (lm.recompute, lm.recompute_latent_steps, lm.recompute_kept_layers) == ("layer", False, 2)
    with pytest.raises(ConfigError, match="grpo.recompute_kept_layers.*recompute_granularity=layer"):
        GRPOConfig(recompute=True, recompute_granularity="call", recompute_kept_layers=1).validate()
    with pytest.raises(ConfigError, match="grpo.recompute_kept_layers.*recompute=true"):
        GRPOConfig(recompute_kept_layers=1).validate()


@pytest.mark.parametrize("granularity", GRANULARITIES)
@pytest.mark.slow
def test_recomputed_regions_free_their_graph_after_backward(tokenizer, task_records, granularity):
    """Once backward has run and the forward's results are dropped, nothing the regions made stays alive. A region
    that held the model's KV cache made a cycle through its own autograd node (the cache holds the region's
    outputs, whose node holds the region), which Python's gc cannot see into: every step's graph and cache leaked
    (at paper scale ~5 GiB a step on the GPU)."""
    made: list[weakref.ref] = []
    real = torch.utils.checkpoint.checkpoint

    def tracked(*args, **kwargs):
        out = real(*args, **kwargs)
        made.extend(weakref.ref(t) for t in (out if isinstance(out, tuple) else (out,)) if torch.is_tensor(t))
        return out

    lm = make_lm(tokenizer, "qwen2").eval()
    pert = make_perturbation(PerturbationConfig(kind="locked", p=0.3))
    with mock.patch.object(torch.utils.checkpoint, "checkpoint", tracked):
        loss_and_grads(lm, batch(lm, task_records), recompute=granularity, pert=pert, seeds=torch.arange(4))
    gc.collect()
    assert made and all(ref() is None for ref in made), sum(ref() is not None for ref in made)


def test_layer_recomputation_restores_the_layers(tokenizer, task_records):
    """The layer regions are installed for one forward call only: afterwards the layers run their own forward."""
    from dgrpo.model.anatomy import decoder_layers

    lm = make_lm(tokenizer, "llama").eval()
    loss_and_grads(lm, batch(lm, task_records, n=2), recompute="layer")
    assert all("forward" not in vars(layer) for layer in decoder_layers(lm.model))


#: the update's recomputation settings the trainer-level tests run: off, per call, per layer, per layer with the
#: latent steps keeping their activations
RECOMPUTE_SETTINGS = ["false", "call", "layer", "layer-latent-kept", "layer-last-kept"]


def recompute_overrides(setting: str) -> list[str]:
    """The ``--set`` overrides of one of RECOMPUTE_SETTINGS."""
    if setting == "false":
        return ["grpo.recompute=false"]
    over = ["grpo.recompute=true", f"grpo.recompute_granularity={setting.split('-')[0]}"]
    if setting.endswith("last-kept"):  # the last layer left out of recomputation
        return over + ["grpo.recompute_kept_layers=1"]
    return over + (["grpo.recompute_latent_steps=false"] if setting.endswith("kept") else [])


def test_grpo_step_with_recompute_matches(tokenizer, task_records, tmp_path):
    """Two trainer steps: the same rewards, losses and weights with and without recomputation."""
    from dgrpo.config import load_config
    from dgrpo.training.grpo import GRPOTrainer

    results = []
    for recompute in RECOMPUTE_SETTINGS:
        cfg = load_config(Config, "tiny.yaml", [*recompute_overrides(recompute), "grpo.group_size=4"])
        lm = make_lm(tokenizer, "qwen2")
        trainer = GRPOTrainer(lm, cfg, task_records)
        rows = [trainer.step() for _ in range(2)]
        results.append((rows, {k: v.detach().clone() for k, v in lm.model.state_dict().items()}))
    rows_a, w_a = results[0]
    for rows_b, w_b in results[1:]:
        for a, b in zip(rows_a, rows_b):
            for key in ("reward_mean", "policy_loss", "kl", "grad_norm"):
                if a.get(key) is not None:
                    assert a[key] == pytest.approx(b[key], abs=1e-6), key
        assert max(float((w_a[k] - w_b[k]).abs().max()) for k in w_a) <= 1e-6


def live_tensor_bytes() -> int:
    """Bytes of the storages that Python-visible tensors hold, after a collection."""
    gc.collect()
    storages = {}
    with warnings.catch_warnings():  # (torch.distributed's deprecated reduce_op warns when asked its type)
        warnings.simplefilter("ignore", FutureWarning)
        tensors = [obj for obj in gc.get_objects() if torch.is_tensor(obj)]
    for obj in tensors:
        if obj.device.type == "cpu":
            try:
                st = obj.untyped_storage()
                storages[st.data_ptr()] = st.nbytes()
            except RuntimeError:  # no data: a fake tensor another test's compilation left for gc
                continue
    return sum(storages.values())


@pytest.mark.parametrize(
    "recompute",
    [
        s if s == "layer" else pytest.param(s, marks=pytest.mark.slow)  # (layer: where a step's graph once stayed)
        for s in RECOMPUTE_SETTINGS
    ],
)
def test_grpo_steps_leave_nothing_behind(tokenizer, task_records, recompute):
    """What stays alive after a trainer step does not grow from one step to the next, under every recomputation
    setting: a step's graph, cache and activations must all go (under layer recomputation they once stayed, a few GiB
    a step at paper scale)."""
    from dgrpo.config import load_config
    from dgrpo.training.grpo import GRPOTrainer

    over = [*recompute_overrides(recompute), "grpo.group_size=4", "grpo.filter=false"]
    trainer = GRPOTrainer(make_lm(tokenizer, "qwen2"), load_config(Config, "tiny.yaml", over), task_records)
    rows = [trainer.step(), trainer.step()]  # (the first makes the optimizer's state)
    before = live_tensor_bytes()
    rows.append(trainer.step())
    grown = live_tensor_bytes() - before
    assert grown < 64 * 1024, grown  # (what a step adds to the run's history: a few KiB)
    assert not any(row.get("skipped") for row in rows)  # every step updated


@pytest.mark.slow
def test_recomputation_lowers_the_peak_rss_of_a_grpo_step():
    """Peak resident memory of one GRPO step at the same micro-batch (64 rollouts, T = 6), each arm in a fresh
    process after a warm-up step (dgrpo.bench.memprobe): the growth during the step is smaller with recomputation,
    and smaller again when one layer at a time is rebuilt."""
    import dataclasses

    from dgrpo.bench.recompute_item import RECOMPUTE_CPU, _probe
    from dgrpo.bench.workload import Ctx

    shapes = dataclasses.replace(RECOMPUTE_CPU, hidden=128, ffn=512, layers=8)
    ctx = Ctx(device=torch.device("cpu"), dtype=torch.float32, shapes=shapes, threads=2)
    growth = {}
    for arm in (None, "call", "layer"):
        probe = _probe(ctx, shapes, arm)
        growth[arm] = probe["peak_bytes"] - probe["before_bytes"]
    # measured (8 layers x 256, 2026-11-25): call / full 0.70-0.72 (the step's growth also holds gradients, optimizer
    # state and rollouts, which recomputation does not shrink; allocator reuse moves the peak by a few percent), layer
    # / call 0.60-0.63; with 4 layers layer / call was 0.73-0.82, too close to a bound (a call's rebuilt stack holds
    # every layer's activations, a layer region one layer's: the gap grows with depth): bounds with room for noise.
    # 8 layers x 128 (2026-12-04, 5 runs; the activations' share of the growth is larger at the narrower width, the
    # weights' gradients and state smaller): full ~420-447 MiB, call / full 0.67-0.73, layer / call 0.46-0.52 (x 256
    # the same day: 0.70-0.71, 0.51-0.54), the same room under the bounds in less than half the steps' time
    assert growth["call"] < 0.88 * growth[None], growth
    assert growth["layer"] < 0.85 * growth["call"], growth


@pytest.mark.slow
def test_sft_with_recompute_trains_the_same_weights(tmp_path, run_cli):
    """``dgrpo sft`` through a curriculum stage boundary: with recomputation per call and per layer, the same losses
    and the same final weights as full backprop."""
    from dgrpo.model.latent_lm import LatentLM

    from conftest import tiny_args

    small = {"model.hidden_size": 32, "model.intermediate_size": 64, "task.n_train": 64, "task.n_valid": 8}
    small |= {"task.n_test": 8, "sft.epochs_per_stage": 1, "sft.num_epochs": 2, "sft.batch_size": 32}
    small |= {"data.test": "[]", "sft.eval_each_stage": "false"}
    weights = {}
    for arm, extra in {"full": {}, "call": {"sft.recompute_granularity": "call"}, "layer": {}}.items():
        recompute = {"sft.recompute": "false" if arm == "full" else "true", **extra}
        res = run_cli("sft", "--out", tmp_path / arm, *tiny_args(**small, **recompute))
        assert res.returncode == 0, res.stderr[-2000:]
        lm = LatentLM.from_pretrained(tmp_path / arm / "final")
        weights[arm] = {k: v.clone() for k, v in lm.model.state_dict().items()}
    for arm in ("call", "layer"):
        assert max(float((weights["full"][k] - weights[arm][k]).abs().max()) for k in weights["full"]) <= 1e-6


def test_a_recomputed_layer_enters_only_its_own_sites(tokenizer, task_records):
    """In backward each layer region re-enters the perturbation for its own sites only: over the whole backward,
    every site's hook is installed once per forward call, not once per layer of every call."""
    from dgrpo.model.anatomy import decoder_layers

    lm = make_lm(tokenizer, "qwen2", num_layers=3).eval()
    lm.recompute = "layer"
    inputs = batch(lm, task_records, n=2)
    pert = make_perturbation(PerturbationConfig(kind="locked", p=0.3, sites=["attn", "mlp"]))
    ids, mask, tg, tm = inputs
    with pert.bind(lm, torch.arange(2)) as pb:
        lp, _ = lm.target_logprobs(ids, mask, 3, tg, tm, perturbation=pb)
    built = []
    real = type(pb).hook
    with mock.patch.object(type(pb), "hook", lambda self, k: built.append(k) or real(self, k)):
        (-(lp * tm).sum()).backward()
    n_calls, n_sites = 1 + 3 + 2, 2 * len(decoder_layers(lm.model))
    assert len(built) == n_calls * n_sites and sorted(set(built)) == list(range(n_sites))
