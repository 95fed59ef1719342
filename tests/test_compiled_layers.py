"""``model.compile``: the decoder layers as one compiled step shared by every layer (dgrpo.model.compiled_layers).

The compiling tests are slow (dynamo traces every graph once per process; inductor also generates C++): the fast
tier checks what is decided before anything compiles."""

import copy
import re
import shutil

import pytest
import torch
from test_recompute import assert_same, batch, loss_and_grads
from torch._dynamo.utils import counters

from dgrpo.config import ConfigError, PerturbationConfig
from dgrpo.model.compiled_layers import FACTOR_ATTR, CompiledLayers, output_factor_hook
from dgrpo.perturbation import make_perturbation

from conftest import make_lm, tiny_config

LOCKED = PerturbationConfig(kind="locked", p=0.3, sites=["attn", "mlp", "residual"])
#: (the prompt call unperturbed: no factors there, factors in the others)
GAUSSIAN = PerturbationConfig(kind="gaussian", sigma=0.2, sites=["attn", "mlp"], perturb_prompt=False)


def counted(compiled: CompiledLayers) -> dict:
    """Count the calls of ``compiled``'s step (so a test knows the step ran, not the layers' own forward)."""
    calls = {"n": 0}
    step = compiled.step

    def counting(*args, **kwargs):
        calls["n"] += 1
        return step(*args, **kwargs)

    compiled.step = counting
    return calls


# ------------------------------------------------------------------ decided before anything compiles


def test_output_factor_hook_multiplies_and_says_by_what():
    mod = torch.nn.Linear(3, 3)
    x = torch.randn(2, 4, 3)
    f = torch.tensor([[[2.0, 0.0, 1.0]], [[1.0, 1.0, 0.5]]])
    hook = output_factor_hook(lambda: f)
    handle = mod.register_forward_hook(hook)
    assert torch.equal(mod(x), torch.nn.functional.linear(x, mod.weight, mod.bias) * f)
    assert getattr(hook, FACTOR_ATTR)() is f
    handle.remove()
    mod.register_forward_hook(output_factor_hook(lambda: None))  # inactive: the output as it is
    assert torch.equal(mod(x), torch.nn.functional.linear(x, mod.weight, mod.bias))


@pytest.mark.parametrize("arch", ["gpt2"])
def test_unsupported_architectures_are_a_config_error(tokenizer, arch):
    with pytest.raises(ConfigError, match="model.compile: the compiled layers run qwen2, llama decoders"):
        CompiledLayers(make_lm(tokenizer, arch).model)
    lm = make_lm(tokenizer, "qwen2")
    lm.model.config._attn_implementation = "eager"
    with pytest.raises(ConfigError, match="need SDPA attention"):
        CompiledLayers(lm.model)
    lm = make_lm(tokenizer, "llama")
    lm.model.config.attention_dropout = 0.1  # (in training mode the eager layers would drop attention weights)
    with pytest.raises(ConfigError, match="attention_dropout is 0.1"):
        CompiledLayers(lm.model)


@pytest.mark.parametrize(
    "over, why",
    [
        ({"model.kernels": "liger"}, "model.kernels=liger"),
        ({"model.lora.r": "4"}, "LoRA"),
        ({"fsdp": "full"}, "FSDP"),
        ({"perturbation.kind": "native"}, "perturbation.kind=native"),
        ({"perturbation.kind": "gaussian", "perturbation.gaussian_target": "weights"}, "gaussian_target=weights"),
    ],
)
def test_what_the_compiled_layers_cannot_run_with_is_a_config_error(over, why):
    with pytest.raises(ConfigError, match=f"invalid config value model.compile: .*{why}"):
        tiny_config(**{"model.compile": "true", **over})
    tiny_config(**over)  # fine without it


def test_a_model_with_lora_adapters_applied_in_python_is_a_config_error(tokenizer, task_records):
    """The config refuses model.lora.r > 0 with model.compile; adapters applied in Python (apply_lora, then a
    trainer) passed, and a GRPO step with a KL term (the reference: a second adapter the step's layer template lacks)
    failed with an AttributeError. Now a one-line ConfigError when the trainer is built."""
    pytest.importorskip("peft")
    from test_fixed_shape import code_parity

    from dgrpo.config import LoraConfig
    from dgrpo.model.lora import apply_lora
    from dgrpo.training.grpo import GRPOTrainer

    lm = make_lm(tokenizer)
    lm.name_or_path = "in-memory"
    apply_lora(lm, LoraConfig(r=4, alpha=8.0))
    cfg = tiny_config(**{"model.compile": "true", "model.compile_backend": "eager", "grpo.beta0": "0.1"})
    with pytest.raises(ConfigError, match="invalid config value model.compile: .*LoRA adapters"):
        GRPOTrainer(lm, cfg, task_records, reward_fn=code_parity)


@pytest.mark.slow
def test_a_hook_the_step_cannot_apply_is_an_error(tokenizer, task_records):
    lm = make_lm(tokenizer).eval()
    lm.compiled_layers = CompiledLayers(lm.model, backend="eager")
    ids, mask, tg, tm = batch(lm, task_records)
    handle = lm.model.model.layers[1].mlp.down_proj.register_forward_hook(lambda m, a, o: o * 2)
    with pytest.raises(RuntimeError, match="layer 1's mlp.down_proj has a hook the compiled layers cannot apply"):
        lm.target_logprobs(ids, mask, 2, tg, tm)
    handle.remove()
    handle = lm.model.model.layers[0].mlp.register_forward_hook(lambda m, a, o: o * 2)
    with pytest.raises(RuntimeError, match="layer 0's mlp has a forward hook the compiled layers cannot apply"):
        lm.target_logprobs(ids, mask, 2, tg, tm)
    handle.remove()
    assert "forward" not in lm.model.model.layers[0].__dict__  # the layers' own forward is back after the error


def test_the_step_is_shared_by_copies_and_serves_scoring_only(tokenizer, task_records):
    lm = make_lm(tokenizer).eval()
    compiled = lm.compiled_layers = CompiledLayers(lm.model, backend="eager")
    assert copy.deepcopy(compiled) is compiled  # the reference's copy runs the same step (weights are arguments)
    calls = counted(compiled)
    ids, mask = batch(lm, task_records)[:2]
    lm.generate(ids, mask, 2, max_new_tokens=4)  # generation (rollouts, evaluation): the layers' own forward
    lm.generate(ids, mask, 2, max_new_tokens=4, static_cache=True)
    assert calls["n"] == 0


def test_the_compiled_step_refuses_a_bound_perturbation_of_other_rows(tokenizer, task_records):
    """Scoring inside a ``with`` block bound for other rows, without ``perturbation=``: the compiled step took the
    hooks' masks into its graph and failed there on the shapes; the one line the eager hooks give."""
    from dgrpo.perturbation import LockedDropout, seeds_for

    lm = make_lm(tokenizer).eval()
    lm.compiled_layers = CompiledLayers(lm.model, backend="eager")
    ids, mask, tg, tm = batch(lm, task_records)
    with LockedDropout(p=0.3).bind(lm, seeds_for(0, 0, 0, ids.shape[0] + 1)):
        with pytest.raises(ValueError, match=rf"^the perturbation is bound for {ids.shape[0] + 1} rows"):
            lm.target_logprobs(ids, mask, 2, tg, tm)


# ------------------------------------------------------------------ compiled


@pytest.mark.slow
@pytest.mark.parametrize(
    "recompute, kind",
    [(False, LOCKED), ("call", LOCKED), ("layer", LOCKED), ("layer", GAUSSIAN)],
    ids=["locked", "locked-call", "locked-layer", "gaussian-layer-prompt-unperturbed"],
)
def test_compiled_layers_match_the_eager_layers(tokenizer, task_records, recompute, kind):
    """Log-probs and every gradient through prompt -> latent steps -> answer under locked dropout (attention, MLP
    and residual sites) or Gaussian activation noise (not on the prompt), with and without recomputation, two row
    counts: as the layers' own forward, to 1e-5."""
    lm = make_lm(tokenizer).eval()
    pert = make_perturbation(kind)
    cases = [(batch(lm, task_records, n), torch.arange(n) + 10 * n) for n in (4, 3)]
    eager = [loss_and_grads(lm, inputs, recompute=recompute, pert=pert, seeds=s) for inputs, s in cases]
    lm.compiled_layers = CompiledLayers(lm.model, backend="aot_eager")
    calls = counted(lm.compiled_layers)
    for (inputs, seeds), want in zip(cases, eager):
        assert_same(loss_and_grads(lm, inputs, recompute=recompute, pert=pert, seeds=seeds), want)
    n_layers, n_calls = 2, 1 + 3 + 2  # the prompt, T = 3 latent steps, <|end-latent|>, the answer
    assert calls["n"] == 2 * n_layers * n_calls * (2 if recompute else 1)  # (recomputation runs it again)


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("c++") is None and shutil.which("g++") is None, reason="inductor on CPU needs a C++ compiler"
)
def test_inductor_graphs_are_shared_by_layers_calls_and_row_counts(tokenizer, task_records):
    """Four layers, four binds (4, 4, 3 rows; longer questions and answers) with layer recomputation: three graphs
    per grad mode (the prompt; one position with past; many with past), not one per layer, call, row count or
    length. The recomputed regions' forward runs without grad (as theta_old and the reference do) and their
    recomputation in backward with it: six graphs in all."""
    from dgrpo.config import TaskConfig
    from dgrpo.data.synthetic import generate_split

    lm = make_lm(tokenizer, num_layers=4).eval()
    pert = make_perturbation(LOCKED)
    longer = generate_split(TaskConfig(n_test=8), "ood_steps")
    cases = [(batch(lm, task_records[k:], n), torch.arange(n) + 7 * k) for k, n in ((0, 4), (4, 4), (8, 3))]
    cases.append((batch(lm, longer, 4), torch.arange(4) + 99))
    assert len({inputs[0].shape[1] for inputs, _ in cases}) > 1 and len({inputs[2].shape[1] for inputs, _ in cases}) > 1
    eager = [loss_and_grads(lm, inputs, recompute="layer", pert=pert, seeds=s) for inputs, s in cases]
    counters.clear()
    lm.compiled_layers = CompiledLayers(lm.model)
    for (inputs, seeds), want in zip(cases, eager):
        assert_same(loss_and_grads(lm, inputs, recompute="layer", pert=pert, seeds=seeds), want)
    assert counters["stats"]["unique_graphs"] == 6, dict(counters["stats"])


@pytest.mark.slow
def test_grpo_steps_with_compiled_layers(sft_checkpoint):
    """A trainer step with model.compile (two mini-epochs, and the reference): the update's log-probs replay the
    rollout's and the first mini-epoch's ratios are exactly 1 (its own log-probs are theta_old's). Without grad the
    policy (theta_old, the recomputed regions' forward) runs the frozen reference's graphs: six in all, three per
    grad mode (the guards on the weights' requires_grad gave the reference three more, each a compile)."""
    from dgrpo.data.synthetic import generate_split
    from dgrpo.model.latent_lm import LatentLM
    from dgrpo.training.grpo import GRPOTrainer

    over = {"model.compile": "true", "model.compile_backend": "aot_eager", "grpo.mini_epochs": "2"}
    cfg = tiny_config(**over, **{"grpo.filter": "false", "grpo.prompts_per_step": "4", "grpo.recompute": "true"})
    lm = LatentLM.from_pretrained(sft_checkpoint)
    tr = GRPOTrainer(lm, cfg, generate_split(cfg.task, "train"))
    assert lm.compiled_layers is not None and tr.ref is not None and tr.ref.lm.compiled_layers is lm.compiled_layers
    calls = counted(lm.compiled_layers)
    counters.clear()
    m = tr.step()
    assert m["skipped"] == 0 and m["ratio_max"] == 1.0 and m["ratio_min"] == 1.0
    assert m["logp_replay_maxdiff"] < 1e-4 and calls["n"] > 0
    assert counters["stats"]["unique_graphs"] <= 6, dict(counters["stats"])  # (fewer: graphs an earlier test made)


def test_no_test_sets_dynamo_config_through_monkeypatch():
    """``monkeypatch.setattr`` on ``torch._dynamo.config`` deletes the setting on undo (its config module keeps no
    plain attribute to put back): every later compiled test of that worker then fails ("recompile_limit does not
    exist"), as it did twice. Dynamo's own ``config.patch`` restores it."""
    from pathlib import Path

    pattern = re.compile(r"monkeypatch\.setattr\(\s*torch\._dynamo\.config")
    offenders = [p.name for p in Path(__file__).parent.glob("*.py") if pattern.search(p.read_text())]
    assert not offenders, offenders


def test_dynamos_recompile_limit_is_raised_only_while_the_compiled_layers_run(tokenizer, task_records):
    """model.compile raised torch._dynamo's process-wide recompile_limit to 64 as the compiled layers were made, and
    never put it back: every later torch.compile of the process (a user's own, after the run) had that limit. It is
    raised while the step runs (dynamo reads it at each call that needs a graph): within the layers' block, and in
    a recomputed layer's call in backward, after it (past the default limit there, dynamo ran the step eagerly for
    the rest of the process); put back after."""
    from test_recompute import loss_and_grads

    from dgrpo.model.compiled_layers import RECOMPILE_LIMIT

    with torch._dynamo.config.patch(recompile_limit=8):  # (dynamo's default; a test before may have raised it)
        lm = make_lm(tokenizer).eval()
        compiled = lm.compiled_layers = CompiledLayers(lm.model, backend="eager")
        assert torch._dynamo.config.recompile_limit == 8
        seen = []

        def step(*args):  # (the step run eagerly: nothing compiles)
            seen.append((torch.is_grad_enabled(), torch._dynamo.config.recompile_limit))
            return compiled._step(*args)

        compiled.step = step
        loss_and_grads(lm, batch(lm, task_records), recompute="layer")
        assert {grad for grad, _ in seen} == {False, True}  # (the forward's calls, backward's recomputed ones)
        assert {limit for _, limit in seen} == {RECOMPILE_LIMIT} and torch._dynamo.config.recompile_limit == 8
