"""The update's latent steps as one unit (``grpo.update_latent_graphs``, dgrpo.model.latent_chain): the same
log-probs and gradients as the step-by-step recurrence, through the autograd Function that carries them across the
captured graphs on CUDA (run here uncaptured; tests/test_cuda.py captures them)."""

from functools import partial

import pytest
import torch
from test_fixed_shape import code_parity, ragged_targets

from dgrpo.config import Config, ConfigError, PerturbationConfig, load_config
from dgrpo.model import latent_chain
from dgrpo.model.latent_chain import LatentChain, bucketed_prompt, chain_for, chained_target_logprobs, filled_cache
from dgrpo.model.recompute import dynamic_layer
from dgrpo.perturbation import make_perturbation

from conftest import make_lm


def eager_logprobs(lm, *args, **kw):
    """``target_logprobs``' log-probs with ``end_with_targets`` (the fast engine's replay, step by step)."""
    return lm.target_logprobs(*args, end_with_targets=True, **kw)[0]


def logp_and_grads(lm, run):
    """The masked log-probs ``run()`` gives and the gradients of their weighted sum, per trainable parameter."""
    lm.model.zero_grad(set_to_none=True)
    logp = run()
    weights = torch.linspace(0.5, 1.5, logp.numel(), device=logp.device).view_as(logp)
    (logp * weights).sum().backward()
    grads = {n: p.grad.clone() for n, p in lm.model.named_parameters() if p.grad is not None}
    return logp.detach(), grads


def assert_close(a, b, atol=1e-5):
    (la, ga), (lb, gb) = a, b
    assert torch.allclose(la, lb, atol=atol, rtol=0)
    assert ga.keys() == gb.keys()
    for name in ga:
        scale = max(1.0, ga[name].abs().max().item())
        assert torch.allclose(ga[name], gb[name], atol=atol * scale, rtol=0), name


@pytest.mark.parametrize(
    "arch, kind, recompute",
    [("qwen2", "locked", "layer"), ("llama", "gaussian", False), ("qwen2", "none", "call")],
)
def test_the_chain_gives_the_recurrence_log_probs_and_gradients(tokenizer, task_records, arch, kind, recompute):
    """fp32: log-probs and every weight's gradient equal ``target_logprobs``' (end_with_targets) within 1e-5, for
    ragged prompts (padded to the column bucket on the chain's side) and targets, whatever the prompt's
    recomputation."""
    lm = make_lm(tokenizer, arch)
    lm.recompute, lm.recompute_latent_steps = recompute, False
    ids, mask = lm.encode_questions([r.question[: 20 + 7 * i] for i, r in enumerate(task_records[:5])])
    tg, tm = ragged_targets(lm, 5)
    pert = make_perturbation(PerturbationConfig(kind=kind, p=0.3, sigma=0.3, sites=["attn", "mlp"]))
    with pert.bind(lm, torch.arange(5)) as pb:
        eager = logp_and_grads(lm, partial(eager_logprobs, lm, ids, mask, 3, tg, tm, perturbation=pb))
        chained = logp_and_grads(lm, lambda: chained_target_logprobs(lm, ids, mask, 3, tg, tm, perturbation=pb))
    assert (chained[0][tm == 1] < 0).all() and (chained[0][tm == 0] == 0).all()
    assert any("layers.0." in n for n in chained[1])  # the chain's weights got their gradients
    assert_close(eager, chained)


def test_a_kept_chain_serves_later_batches_of_its_shape(tokenizer, task_records):
    """Three batches whose prompts differ in width within one column bucket and whose perturbation seeds differ:
    one kept chain serves them all, with the log-probs and gradients of a new chain each time."""
    lm = make_lm(tokenizer, "qwen2")
    pert = make_perturbation(PerturbationConfig(kind="locked", p=0.3, sites=["mlp"]))
    tg, tm = ragged_targets(lm, 4)
    chains = set()
    for b in range(3):
        ids, mask = lm.encode_questions([r.question[: 18 + 3 * b + i] for i, r in enumerate(task_records[:4])])
        seeds = torch.arange(4) + 10 * b
        results = []
        for keep in (False, True):
            with pert.bind(lm, seeds) as pb:
                run = partial(chained_target_logprobs, lm, ids, mask, 2, tg, tm, perturbation=pb, keep=keep)
                results.append(logp_and_grads(lm, run))
        assert_close(*results, atol=0)
        chains.add(id(lm.kept_decoders["update"][1]))
    assert len(chains) == 1


def test_the_first_shape_is_captured_and_another_replaces_it_once_it_repeats(tokenizer, task_records, capture_requests):
    """Capturing costs a few eager runs: the first shape is captured and kept at once (a step's first micro-batch
    is a full one); after that a shape seen once runs uncaptured, one seen twice in a row is captured and replaces
    the kept one, and shapes taking turns never do (the capture itself is CUDA's: here each chain is made
    uncaptured and records whether it was asked to capture)."""
    lm = make_lm(tokenizer, "qwen2")
    asked = capture_requests
    states = {}
    for rows in (2, 3):
        ids, mask = lm.encode_questions([r.question for r in task_records[:rows]])
        states[rows] = lm.prefill(ids, mask, 0, markers=False)

    def chain(rows):
        return chain_for(lm, states[rows], 2, None, capture=True, keep=True)

    kept = chain(2)
    assert asked == [True] and lm.kept_decoders["update"][1] is kept
    assert chain(2) is kept and len(asked) == 1
    for _ in range(3):  # 3 rows, then 2, then 3 ...: the 3-row batches run uncaptured, the kept chain stays
        assert chain(3) is not kept and chain(2) is kept
    assert asked == [True, False, False, False]
    new = [chain(3), chain(3)]  # 3 rows twice in a row: now captured and kept
    assert asked[-2:] == [False, True] and lm.kept_decoders["update"][1] is new[1] is not kept
    lm.kept_decoders.clear()
    assert not lm.kept_decoders and not lm.kept_decoders.seen


@pytest.mark.parametrize(
    "kind, target", [("locked", ""), ("gaussian", "activations"), ("gaussian", "weights"), ("none", "")]
)
def test_batches_padded_to_the_kept_chain_give_their_own_log_probs_and_gradients(tokenizer, task_records, kind, target):
    """``pad`` (the default with capture): every batch runs inside one shape, at least ``min_rows`` rows and the kept
    chain's rows and prompt columns. A batch of fewer rows and a narrower prompt replays the kept chain; one with a
    wider prompt replaces it at once by one of its width (and the kept rows). Each gets the unpadded recurrence's
    log-probs and every weight's gradient (fp32, 1e-5: the padding rows and columns are cut off and add nothing), and
    its perturbation acts on its own rows again after the chain."""
    lm = make_lm(tokenizer, "qwen2")
    config = PerturbationConfig(
        kind=kind, p=0.3, sigma=0.3, sites=["attn", "mlp"], gaussian_target=target or "activations"
    )
    pert = make_perturbation(config)
    short = [r.question[:12] for r in task_records]  # prompts within one 32-column bucket, then of two buckets
    wide = [r.question + " " + r.question for r in task_records]
    batches = [(short[:5], 7), (short[5:8], 7), (wide[:4], 0), (short[:2], 0)]
    shapes, chains = [], []
    for b, (questions, min_rows) in enumerate(batches):
        ids, mask = lm.encode_questions(questions)
        tg, tm = ragged_targets(lm, len(questions))
        with pert.bind(lm, torch.arange(len(questions)) + 10 * b) as pb:
            before = [t.shape for t in pb.graph_inputs()]
            eager = logp_and_grads(lm, partial(eager_logprobs, lm, ids, mask, 3, tg, tm, perturbation=pb))
            run = partial(
                chained_target_logprobs,
                lm,
                ids,
                mask,
                3,
                tg,
                tm,
                perturbation=pb,
                keep=True,
                min_rows=min_rows,
                pad=True,
            )
            padded = logp_and_grads(lm, run)
            assert [t.shape for t in pb.graph_inputs()] == before
        assert_close(eager, padded)
        chain = lm.kept_decoders["update"][1]
        shapes.append(chain.shape)
        chains.append(chain)
    narrow, wider = shapes[0][1], shapes[2][1]
    assert narrow % 32 == 0 and wider > narrow
    assert shapes == [(7, narrow), (7, narrow), (7, wider), (7, wider)]
    assert chains[0] is chains[1] and chains[1] is not chains[2] and chains[2] is chains[3]


@pytest.mark.parametrize("padded", [False, True])
def test_a_kept_chain_replaced_is_let_go_before_its_successor_is_made(tokenizer, task_records, monkeypatch, padded):
    """A batch of another shape replaces the kept chain: the old chain (its cache, a captured graph's memory pool) is
    no longer held by any frame when the new one is made, so the peak holds one chain, not two (``chain_for`` and
    ``run_latent_chain`` each kept a local of it)."""
    import weakref

    lm = make_lm(tokenizer, "qwen2")
    states = {}
    for rows in (2, 3):
        ids, mask = lm.encode_questions([r.question for r in task_records[:rows]])
        states[rows] = lm.prefill(ids, mask, 0, markers=False)
    old: list[weakref.ref] = []
    alive_at_make = []
    init = LatentChain.__init__

    def recording_init(self, *args):
        alive_at_make.extend(ref() is not None for ref in old)
        init(self, *args)

    monkeypatch.setattr(LatentChain, "__init__", recording_init)

    def run(rows):
        if padded:
            latent_chain.run_latent_chain(lm, states[rows], 2, None, capture=False, keep=True, pad=True)
        else:
            chain_for(lm, states[rows], 2, None, capture=False, keep=True)

    run(2)
    old.append(weakref.ref(lm.kept_decoders["update"][1]))
    run(3)
    assert alive_at_make == [False] and lm.kept_decoders["update"][1] is not old[0]()


def test_with_rows_appends_copies_of_the_first_row():
    t = torch.arange(6.0).view(2, 3)
    assert torch.equal(latent_chain.with_rows(t, 4), torch.tensor([[0.0, 1, 2], [3, 4, 5], [0, 1, 2], [0, 1, 2]]))
    assert latent_chain.with_rows(t, 2) is t
    assert torch.equal(latent_chain.with_rows(t, 3, dim=1), torch.tensor([[0.0, 1, 2], [3, 4, 5]]))
    assert torch.equal(latent_chain.with_rows(t.T, 3, dim=1), torch.tensor([[0.0, 3, 0], [1, 4, 1], [2, 5, 2]]))
    with pytest.raises(ValueError, match="cannot pad"):
        latent_chain.with_rows(t, 1)


@pytest.mark.parametrize("arch, kind", [("qwen2", "locked"), ("llama", "gaussian")])
def test_what_the_graphs_record_makes_the_host_wait_for_nothing(tokenizer, task_records, arch, kind):
    """What a CUDA graph captures (the warm-ups run the same): the chain's forward and its backward to the inputs
    and weights, as ``_capture`` runs them, dispatch no op that would make the host wait for the device (a value
    read back, a data-dependent size), which capture refuses."""
    from dgrpo.bench.step_profile import waiting_ops
    from dgrpo.model.latent_chain import chain_inputs

    lm = make_lm(tokenizer, arch)
    ids, mask = bucketed_prompt(
        lm, *lm.encode_questions([r.question[: 20 + 7 * i] for i, r in enumerate(task_records[:4])])
    )
    pert = make_perturbation(PerturbationConfig(kind=kind, p=0.3, sigma=0.3, sites=["attn", "mlp"]))
    chain = LatentChain(lm, 3, capture=False)
    reached = []  # weights whose own gradient the backward computed (their AccumulateGrad nodes' input)
    for name, p in lm.model.named_parameters():
        p.register_hook(lambda g, name=name: reached.append(name))
    with pert.bind(lm, torch.arange(4)) as pb:
        state = lm.prefill(ids, mask, 0, perturbation=pb, markers=False)
        chain.inputs = [t.detach().clone().requires_grad_(t.requires_grad) for t in chain_inputs(state)]

        def record() -> None:
            outs, views = chain.steps(chain.inputs, pb)
            wrt = chain._differentiable(views)
            grads = torch.autograd.grad(outs, wrt, [torch.ones_like(o) for o in outs], allow_unused=True)
            assert any(g is not None for g in grads[len(chain.differentiable_positions()) :])

        found = waiting_ops(record)
    assert len(chain.differentiable_positions()) > 1  # the prompt's state and its keys and values
    assert found["waiting_ops"] == 0, found["waiting_op_sites"]
    # nor does its backward reach a weight itself (whose AccumulateGrad node, made on the stream of the prompt's
    # forward, would make that stream wait for the capturing one: latent_chain.weight_views)
    assert reached == []


def test_the_prompt_bucket_pads_masked_columns_only(tokenizer, task_records):
    lm = make_lm(tokenizer, "qwen2")
    ids, mask = lm.encode_questions([r.question[:30] for r in task_records[:3]])
    b_ids, b_mask = bucketed_prompt(lm, ids, mask)
    assert b_ids.shape[1] % 32 == 0 and b_ids.shape[1] >= ids.shape[1]
    extra = b_ids.shape[1] - ids.shape[1]
    assert torch.equal(b_ids[:, extra:], ids) and torch.equal(b_mask[:, extra:], mask)
    assert (b_mask[:, :extra] == 0).all()
    assert bucketed_prompt(lm, b_ids, b_mask)[0] is b_ids


def test_a_filled_cache_holds_the_tensors_and_grows_as_a_dynamic_cache(tokenizer):
    lm = make_lm(tokenizer, "qwen2")
    cfg = lm.model.config
    n = cfg.num_hidden_layers
    keys = [torch.randn(2, cfg.num_key_value_heads, 5, cfg.hidden_size // cfg.num_attention_heads) for _ in range(n)]
    values = [torch.randn_like(k) for k in keys]
    cache = filled_cache(cfg, keys, values)
    assert cache.get_seq_length() == 5
    assert all(dynamic_layer(cache, i).keys is keys[i] for i in range(n))
    new = torch.randn(2, cfg.num_key_value_heads, 1, keys[0].shape[-1])
    k, _ = cache.update(new, new, 0)
    assert k.shape[2] == 6 and torch.equal(k[:, :, :5], keys[0])


def test_a_backward_after_a_later_forward_is_refused(tokenizer, task_records):
    """One chain holds one call's tensors (on CUDA: its graphs' static buffers): a second forward before the first's
    backward would give the first the second's gradients, so that backward raises."""
    lm = make_lm(tokenizer, "qwen2")
    ids, mask = lm.encode_questions([r.question for r in task_records[:2]])
    tg, tm = ragged_targets(lm, 2)
    first = chained_target_logprobs(lm, ids, mask, 2, tg, tm, keep=True)
    second = chained_target_logprobs(lm, ids, mask, 2, tg, tm, keep=True)
    second.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="next forward"):
        first.sum().backward()


def test_a_failed_capture_warns_and_runs_the_steps_one_by_one(tokenizer, task_records, monkeypatch):
    """An op that cannot be captured: the chain says so once and runs the recurrence step by step (the same
    log-probs and gradients), without trying to capture again, nor does any later chain of the model."""
    lm = make_lm(tokenizer, "qwen2")
    ids, mask = lm.encode_questions([r.question for r in task_records[:3]])
    tg, tm = ragged_targets(lm, 3)
    eager = logp_and_grads(lm, partial(eager_logprobs, lm, ids, mask, 2, tg, tm))
    tries = []

    def failing_capture(self, inputs, perturbation):
        tries.append(1)
        raise RuntimeError("operation not permitted when stream is capturing")

    chain = LatentChain(lm, 2, capture=False)
    chain.capture = True  # (as on CUDA; the capture fails before any device work)
    chain_for = latent_chain.chain_for
    monkeypatch.setattr(LatentChain, "_capture", failing_capture)
    monkeypatch.setattr(latent_chain, "chain_for", lambda *args: chain)
    with pytest.warns(RuntimeWarning, match="capturing the latent steps failed"):
        chained = [logp_and_grads(lm, partial(chained_target_logprobs, lm, ids, mask, 2, tg, tm)) for _ in range(2)]
    assert len(tries) == 1 and chain.failed and chain.forward_graph is None
    for result in chained:
        assert_close(eager, result)
    # nor does a later chain of this model (another shape): a failed capture may keep its pool's memory
    assert lm.kept_decoders.failed_captures == {"update"}
    assert chain_for(lm, None, 2, None, capture=True, keep=False).capture is False  # (True would raise off CUDA)


def test_capture_is_refused_off_cuda(tokenizer):
    with pytest.raises(ValueError, match="CUDA"):
        LatentChain(make_lm(tokenizer, "qwen2"), 2, capture=True)


@pytest.mark.parametrize(
    "epochs, lora, over",
    [
        (1, False, []),
        # (two mini-epochs, and LoRA: the slow tier, with the ablations)
        pytest.param(2, False, [], marks=pytest.mark.slow),
        pytest.param(1, True, [], marks=pytest.mark.slow),
        # the paper's ablations: the update's masks drawn anew, or no perturbation (sampled answers)
        pytest.param(1, False, ["grpo.replay=fresh_mask"], marks=pytest.mark.slow),
        pytest.param(1, False, ["perturbation.kind=none"], marks=pytest.mark.slow),
    ],
)
def test_grpo_steps_with_the_chain_equal_those_without(tokenizer, task_records, epochs, lora, over):
    """Two trainer steps (fast engine on CPU, fp32, two micro-batches, locked dropout; one or two mini-epochs; full
    fine-tuning or LoRA adapters, whose weights the chain's views stand in for; the update's masks drawn anew, or
    none): the same rewards, losses and gradient norms with the update's latent steps as one chain as without."""
    from dgrpo.training.grpo import GRPOTrainer

    if lora:
        pytest.importorskip("peft")
    from dgrpo.config import LoraConfig
    from dgrpo.model.lora import apply_lora

    rows = []
    base = [
        f"grpo.mini_epochs={epochs}",
        "grpo.group_size=4",
        "grpo.temperature=1",
        "grpo.engine=fast",
        "grpo.micro_batch_size=4",
        "grpo.n_latent=2",
        *over,
    ]
    for chain in ("false", "true"):
        cfg = load_config(Config, "tiny.yaml", [*base, f"grpo.update_latent_graphs={chain}"])
        lm = make_lm(tokenizer, "qwen2")
        if lora:  # (a run gets them from the config, over a saved model: apply_lora records its base's name)
            lm.name_or_path = "in-memory"
            torch.manual_seed(0)  # (the adapters' initial weights: the same in both arms)
            apply_lora(lm, LoraConfig(r=4, alpha=8.0))
        trainer = GRPOTrainer(lm, cfg, task_records, reward_fn=code_parity)
        rows.append([trainer.step() for _ in range(2)])
        assert ("update" in trainer.lm.kept_decoders) == (chain == "true")
    assert all(m["skipped"] == 0 for m in rows[0])
    for a, b in zip(*rows):
        assert a["reward_mean"] == b["reward_mean"]
        assert a["policy_loss"] == pytest.approx(b["policy_loss"], abs=1e-6)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)


def test_a_perturbation_that_does_not_state_its_tensors_runs_a_chain_it_does_not_keep(
    tokenizer, task_records, monkeypatch
):
    """A kind of one's own need not say which tensors it reads (``graph_inputs`` None): the fast engine's decoders are
    then not kept, and the chain under grpo.keep_graphs was a ValueError traceback in the first update; now it runs
    a chain per micro-batch, not kept, with the same steps as without the chain."""
    from dgrpo.perturbation.locked import _BoundLocked
    from dgrpo.training.grpo import GRPOTrainer

    monkeypatch.setattr(_BoundLocked, "graph_inputs", lambda self: None)  # (locked dropout as such a kind)
    rows = []
    for chain in ("false", "true"):
        over = ["grpo.group_size=4", "grpo.temperature=1", "grpo.engine=fast", "grpo.micro_batch_size=12"]
        cfg = load_config(Config, "tiny.yaml", [*over, "grpo.n_latent=2", f"grpo.update_latent_graphs={chain}"])
        trainer = GRPOTrainer(make_lm(tokenizer, "qwen2"), cfg, task_records, reward_fn=code_parity)
        assert trainer.keep_graphs and trainer.chain_latents == (chain == "true")
        rows.append([trainer.step() for _ in range(2)])
        assert not trainer.lm.kept_decoders
    for a, b in zip(*rows):
        assert a["reward_mean"] == b["reward_mean"]
        assert a["policy_loss"] == pytest.approx(b["policy_loss"], abs=1e-6)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)


def test_grpo_steps_with_a_padded_chain_equal_those_without(tokenizer, task_records, monkeypatch):
    """Two trainer steps whose micro-batches have 3, 3 and 2 rows (the last padded to 3, as on CUDA where the chain
    pads every micro-batch to the largest): the same rewards, losses and gradient norms as without the chain."""
    from dgrpo.training import rollouts
    from dgrpo.training.grpo import GRPOTrainer

    monkeypatch.setattr(rollouts, "chained_target_logprobs", partial(chained_target_logprobs, pad=True))
    base = ["grpo.prompts_per_step=2", "grpo.group_size=4", "grpo.temperature=1", "grpo.engine=fast"]
    base += ["grpo.micro_batch_size=3", "grpo.n_latent=2"]
    rows = []
    for over in ([], ["grpo.update_latent_graphs=true"]):
        cfg = load_config(Config, "tiny.yaml", [*base, *over])
        trainer = GRPOTrainer(make_lm(tokenizer, "qwen2"), cfg, task_records, reward_fn=code_parity)
        rows.append([trainer.step() for _ in range(2)])
    assert trainer.lm.kept_decoders["update"][1].shape[0] == 3
    assert all(m["skipped"] == 0 for m in rows[0])
    for a, b in zip(*rows):
        assert a["reward_mean"] == b["reward_mean"]
        assert a["policy_loss"] == pytest.approx(b["policy_loss"], abs=1e-6)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)


@pytest.mark.parametrize(
    "over, match",
    [
        (["grpo.engine=eager"], "grpo.engine=fast"),
        (["grpo.engine=auto"], "resolved to eager"),  # (auto is the eager engine on this CPU)
        (["grpo.engine=fast", "grpo.recompute=true", "grpo.recompute_latent_steps=true"], "recompute_latent_steps"),
        # (it said "set grpo.engine=fast", which native dropout refuses in turn)
        (["perturbation.kind=native"], r"^invalid config value grpo.update_latent_graphs: .*perturbation.kind=native"),
    ],
)
def test_the_chain_refuses_what_it_cannot_run(tokenizer, task_records, over, match):
    from dgrpo.training.grpo import GRPOTrainer

    with pytest.raises(ConfigError, match=match):
        cfg = load_config(Config, "tiny.yaml", ["grpo.update_latent_graphs=true", *over])
        GRPOTrainer(make_lm(tokenizer, "qwen2"), cfg, task_records, reward_fn=code_parity)


@pytest.mark.parametrize("family", ["mistral", "gemma2"])
def test_the_chain_refuses_sliding_window_layers_before_the_first_step(tokenizer, task_records, family):
    """A model whose cache has sliding-window layers (Mistral with a window, Gemma 2) was accepted on a CPU and its
    first update failed with a NotImplementedError traceback; now a one-line ConfigError when the trainer is built."""
    from test_model_families import family_lm

    from dgrpo.training.grpo import GRPOTrainer

    cfg = load_config(Config, "tiny.yaml", ["grpo.update_latent_graphs=true", "grpo.engine=fast", "grpo.n_latent=2"])
    with pytest.raises(ConfigError, match=r"grpo.update_latent_graphs: .*SlidingWindowLayer.*or set it to false"):
        GRPOTrainer(family_lm(tokenizer, family), cfg, task_records, reward_fn=code_parity)


def test_auto_turns_the_chain_on_only_where_it_runs_captured(tokenizer, task_records):
    """``grpo.update_latent_graphs=auto`` (the paper recipe's): on for one CUDA process on the fast engine, with the
    latent steps' activations kept and the layers uncompiled; off elsewhere without an error (on this CPU, under
    torchrun, the eager engine, recomputed latent steps), where ``true`` names the obstacle."""
    from types import SimpleNamespace

    from dgrpo.training.grpo import GRPOTrainer
    from dgrpo.training.rollouts import resolve_latent_chain

    lm = make_lm(tokenizer, "qwen2")
    lm.model.config._attn_implementation = "sdpa"
    on_cuda = SimpleNamespace(device=torch.device("cuda"), settings=lm.settings, model=lm.model)

    def resolved(setting, over=(), engine="fast", distributed=False, target=on_cuda):
        cfg = load_config(Config, "tiny.yaml", [f"grpo.update_latent_graphs={setting}", *over])
        return resolve_latent_chain(target, cfg, engine, distributed)

    assert resolved("auto") is True and resolved("true") is True
    assert resolved("false") is False
    recomputed = ["grpo.recompute=true", "grpo.recompute_latent_steps=true"]
    for kw in ({"target": lm}, {"distributed": True}, {"engine": "eager"}, {"over": recomputed}):
        assert resolved("auto", **kw) is False
    with pytest.raises(ConfigError, match="one process.*or set it to false or auto"):
        resolved("true", distributed=True)
    assert resolved("true", target=lm) is True  # (asked for: the chain runs uncaptured on a CPU, for tests)

    cfg = load_config(Config, "tiny.yaml", ["grpo.update_latent_graphs=auto", "grpo.engine=fast"])
    trainer = GRPOTrainer(make_lm(tokenizer, "qwen2"), cfg, task_records, reward_fn=code_parity)
    trainer.step()
    assert trainer.chain_latents is False and "update" not in trainer.lm.kept_decoders


def test_the_paper_recipe_asks_for_the_chain_where_it_can_run():
    cfg = load_config(Config, "paper/grpo_dropout.yaml", [])
    assert cfg.grpo.update_latent_graphs == "auto"
    with pytest.raises(ConfigError, match="grpo.update_latent_graphs"):
        load_config(Config, "paper/grpo_dropout.yaml", ["grpo.update_latent_graphs=always"])


def test_the_chain_of_one_latent_step_gives_the_recurrence_log_probs_and_gradients(tokenizer, task_records):
    """T = 1 (a stage-1 model's one thought): the chain runs its one step too (fp32, 1e-5: the log-probs and every
    weight's gradient of ``target_logprobs`` with ``end_with_targets``), and T = 1 is not T = 0."""
    lm = make_lm(tokenizer, "qwen2")
    ids, mask = lm.encode_questions([r.question[: 20 + 7 * i] for i, r in enumerate(task_records[:3])])
    tg, tm = ragged_targets(lm, 3)
    eager = logp_and_grads(lm, partial(eager_logprobs, lm, ids, mask, 1, tg, tm))
    chained = logp_and_grads(lm, lambda: chained_target_logprobs(lm, ids, mask, 1, tg, tm))
    assert_close(eager, chained)
    none = logp_and_grads(lm, partial(eager_logprobs, lm, ids, mask, 0, tg, tm))
    assert not torch.allclose(none[0], chained[0], atol=1e-3)


def test_the_chain_refuses_a_model_without_coconut_thoughts(tokenizer, task_records):
    """A pause-token model's latent positions are ``<|latent|>`` embeddings, not fed-back states: the chain, which
    runs the coconut recurrence, refuses it in one line (T = 0, with no latent step to run, is scored)."""
    lm = make_lm(tokenizer, "qwen2")
    lm.settings.mode = "pause"
    ids, mask = lm.encode_questions([r.question for r in task_records[:2]])
    tg, tm = ragged_targets(lm, 2)
    with pytest.raises(ValueError, match="the latent chain runs coconut thoughts; this model's mode is 'pause'"):
        chained_target_logprobs(lm, ids, mask, 2, tg, tm)
    assert chained_target_logprobs(lm, ids, mask, 0, tg, tm).shape == tg.shape


def test_a_kept_chain_is_not_reused_once_other_weights_train(tokenizer, task_records):
    """A chain takes gradients for the weights that were trainable when it was made: after layer 1 is unfrozen, a
    batch of the same shape gets a new chain, and layer 1 its gradient through the latent steps (fp32, 1e-5)."""
    lm = make_lm(tokenizer, "qwen2")
    ids, mask = lm.encode_questions([r.question for r in task_records[:3]])
    tg, tm = ragged_targets(lm, 3)
    layer1 = [p for n, p in lm.model.named_parameters() if "layers.1." in n]
    for p in layer1:
        p.requires_grad_(False)
    chained_target_logprobs(lm, ids, mask, 2, tg, tm, keep=True).sum().backward()
    first = lm.kept_decoders["update"][1]
    for p in layer1:
        p.requires_grad_(True)
    eager = logp_and_grads(lm, partial(eager_logprobs, lm, ids, mask, 2, tg, tm))
    kept = logp_and_grads(lm, partial(chained_target_logprobs, lm, ids, mask, 2, tg, tm, keep=True))
    assert lm.kept_decoders["update"][1] is not first and any("layers.1." in n for n in kept[1])
    assert_close(eager, kept)
