"""Packed grouped-query attention (dgrpo.model.gqa_attention, ``model.pack_gqa``): the same log-probs, gradients and
rollouts as Hugging Face's SDPA attention (fp32, 1e-5), the mask's rows packed once per forward call, the calls it
does not serve left to SDPA as they are, and a model switched only where it has grouped heads on SDPA."""

from __future__ import annotations

import json

import pytest
import torch
from test_latent_model import batch

from dgrpo.config import PerturbationConfig
from dgrpo.model import gqa_attention
from dgrpo.model.factory import pack_gqa
from dgrpo.model.fixed_shape import fixed_shape_generate
from dgrpo.model.gqa_attention import PACKED_GQA, packed_mask, use_packed_gqa
from dgrpo.perturbation import make_perturbation, seeds_for

from conftest import make_lm, tiny_config


@pytest.fixture
def packed_calls(monkeypatch):
    """How many attention calls ran packed, and how many were left to SDPA."""
    calls = {"packed": 0, "sdpa": 0}
    inner = gqa_attention.packs

    def counted(*a):
        ran = inner(*a)
        calls["packed" if ran else "sdpa"] += 1
        return ran

    monkeypatch.setattr(gqa_attention, "packs", counted)
    return calls


@pytest.mark.parametrize("recompute", [False, "layer"])
@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_packed_attention_gives_sdpas_logprobs_gradients_and_rollouts(
    tokenizer, task_records, packed_calls, arch, recompute
):
    """Under locked dropout at the attention and MLP outputs: teacher-forced log-probs and every weight's gradient
    (the update), and greedy rollouts on both engines (tokens, log-probs), packed as SDPA gives them."""
    lm = make_lm(tokenizer, arch).eval()
    lm.recompute = recompute
    ids, mask, tg, tm = batch(lm, task_records)
    pert = make_perturbation(PerturbationConfig(kind="locked", p=0.3, sites=["attn", "mlp"]))
    seeds = seeds_for(0, 0, 0, ids.shape[0])
    out = {}
    for on in (False, True):
        assert use_packed_gqa(lm.model, on) is on
        lm.model.zero_grad(set_to_none=True)
        with pert.bind(lm, seeds) as pb:
            lp, _ = lm.target_logprobs(ids, mask, 3, tg, tm, perturbation=pb)
            (-(lp * tm).sum()).backward()
            with torch.no_grad():
                eager = lm.generate(ids, mask, 3, max_new_tokens=8, perturbation=pb)
                fast = fixed_shape_generate(lm, ids, mask, 3, max_new_tokens=8, perturbation=pb, capture=False)
        out[on] = (lp.detach(), [p.grad.clone() for p in lm.model.parameters()], eager, fast)
    assert packed_calls["packed"] > 0  # (the prompt's and the answer's calls; one-position steps go to SDPA)
    (lp0, g0, e0, f0), (lp1, g1, e1, f1) = out[False], out[True]
    assert torch.allclose(lp0, lp1, atol=1e-5), (lp0 - lp1).abs().max()
    for a, b in zip(g0, g1, strict=True):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-5), (a - b).abs().max()
    for x, y in ((e0, e1), (f0, f1)):
        assert torch.equal(x.tokens, y.tokens) and torch.allclose(x.logprobs, y.logprobs, atol=1e-5)


def test_the_masks_rows_are_packed_once_per_forward_call(tokenizer, task_records, monkeypatch):
    lm = make_lm(tokenizer, "qwen2", num_layers=3).eval()
    use_packed_gqa(lm.model, True)
    ids, mask, tg, tm = batch(lm, task_records)
    made = []
    inner = torch.Tensor.repeat_interleave
    monkeypatch.setattr(torch.Tensor, "repeat_interleave", lambda t, *a, **k: made.append(1) or inner(t, *a, **k))
    with torch.no_grad():
        lm.target_logprobs(ids, mask, 0, tg, tm, markers=False)  # two calls of several positions, 3 layers each
    assert len(made) == 2, made


def test_a_mask_changed_in_place_is_packed_again():
    mask = torch.tensor([[[[True, False], [True, True]]]])
    first = packed_mask(mask, 3)
    assert packed_mask(mask, 3) is first and first.shape == (1, 1, 6, 2)
    mask[0, 0, 0, 1] = True
    again = packed_mask(mask, 3)
    assert again is not first and bool(again[0, 0, :3, 1].all())
    wide = torch.ones(1, 1, 2, 5, dtype=torch.bool)  # wider than the keys: cut to them, and still packed once
    narrow = packed_mask(wide, 2, 3)
    assert narrow.shape == (1, 1, 4, 3) and packed_mask(wide, 2, 3) is narrow and packed_mask(wide, 2, 4) is not narrow
    with torch.inference_mode():  # (no version counter: packed every time)
        frozen = torch.ones(1, 1, 2, 2, dtype=torch.bool)
        assert torch.equal(packed_mask(frozen, 2), torch.ones(1, 1, 4, 2, dtype=torch.bool))


def test_calls_it_does_not_serve_go_to_sdpa_as_they_are(tokenizer, task_records, packed_calls):
    """Native dropout (SDPA's own attention dropout, whose draws follow the heads' layout) runs exactly as under
    SDPA attention, bit for bit, and never packed."""
    lm = make_lm(tokenizer, "qwen2").eval()
    ids, mask, tg, tm = batch(lm, task_records)
    pert = make_perturbation(PerturbationConfig(kind="native", p=0.3))
    seeds = seeds_for(0, 0, 0, 1)
    out = []
    for on in (False, True):
        use_packed_gqa(lm.model, on)
        with torch.no_grad(), pert.bind(lm, seeds) as pb:
            out.append(lm.target_logprobs(ids[:1], mask[:1], 3, tg[:1], tm[:1], perturbation=pb, stepwise=True)[0])
    assert torch.equal(out[0], out[1]) and packed_calls["packed"] == 0 and packed_calls["sdpa"] > 0


def test_only_a_model_with_grouped_heads_on_sdpa_is_switched_and_checkpoints_do_not_record_it(tokenizer, tmp_path):
    gpt2 = make_lm(tokenizer, "gpt2")
    assert not use_packed_gqa(gpt2.model, True) and gpt2.model.config._attn_implementation == "sdpa"
    lm = make_lm(tokenizer, "qwen2")
    assert use_packed_gqa(lm.model, True) and lm.model.config._attn_implementation == PACKED_GQA
    lm.save_pretrained(tmp_path / "ckpt")
    assert PACKED_GQA not in json.dumps(json.loads((tmp_path / "ckpt" / "config.json").read_text()))
    assert not use_packed_gqa(lm.model, False) and lm.model.config._attn_implementation == "sdpa"
    for setting, on in (("auto", False), ("true", True), ("false", False)):  # auto: CUDA only
        pack_gqa(lm, tiny_config(**{"model.pack_gqa": setting}).model)
        assert (lm.model.config._attn_implementation == PACKED_GQA) is on, setting


@pytest.mark.slow  # (trains the shared SFT checkpoint when no quick test has)
def test_a_grpo_step_with_packed_attention_is_the_sdpa_step(sft_checkpoint, packed_calls):
    """``model.pack_gqa=true`` on this CPU: the trainer switches the policy and its reference copy, and a step's
    rewards, loss and KL are those of the step on SDPA attention (float rounding)."""
    from dgrpo.data.synthetic import generate_split
    from dgrpo.model.latent_lm import LatentLM
    from dgrpo.training.grpo import GRPOTrainer

    metrics = {}
    for setting in ("false", "true"):
        cfg = tiny_config(**{"model.pack_gqa": setting, "grpo.filter": "false", "grpo.prompts_per_step": "4"})
        lm = LatentLM.from_pretrained(sft_checkpoint)
        tr = GRPOTrainer(lm, cfg, generate_split(cfg.task, "train"))
        assert tr.ref is not None
        impls = {lm.model.config._attn_implementation, tr.ref.lm.model.config._attn_implementation}
        assert impls == {PACKED_GQA if setting == "true" else "sdpa"}
        metrics[setting] = tr.step()
    assert packed_calls["packed"] > 0
    a, b = metrics["false"], metrics["true"]
    assert a["reward_mean"] == b["reward_mean"] and a["skipped"] == b["skipped"] == 0
    for key in ("policy_loss", "kl", "grad_norm"):
        assert abs(a[key] - b[key]) <= 1e-5 * max(1.0, abs(a[key])), (key, a[key], b[key])
