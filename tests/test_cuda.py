"""CUDA checks (skipped without a GPU): the recurrence, mask replay, a bf16 + 8-bit-optimizer GRPO step on the device.

CI has no GPU; these run wherever CUDA is present (``pytest tests/test_cuda.py``).
"""

import copy

import pytest
import torch

from dgrpo.data.synthetic import generate_split
from dgrpo.model.reference import uncached_target_logprobs
from dgrpo.perturbation import LockedDropout, seeds_for
from dgrpo.training.grpo import GRPOTrainer
from dgrpo.training.rollouts import collect_rollouts, replay_logprobs

from conftest import make_lm, tiny_config

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
CUDA = torch.device("cuda")


def test_cached_recurrence_matches_uncached_on_cuda(tokenizer, task_records):
    lm = make_lm(tokenizer, hidden_size=64).eval()
    lm.model.to(CUDA)
    recs = task_records[:4]
    ids, mask = lm.encode_questions([r.question for r in recs])
    tg, tm = lm.encode_targets(["\n".join(r.steps[2:]) + "\n#### " + r.answer for r in recs])
    ids, mask, tg, tm = (x.to(CUDA) for x in (ids, mask, tg, tm))
    with torch.no_grad():
        cached, _ = lm.target_logprobs(ids, mask, 4, tg, tm)
        ref, _ = uncached_target_logprobs(lm, ids, mask, 4, tg, tm)
    assert cached.device.type == "cuda"
    assert torch.allclose(cached, ref, atol=1e-4), (cached - ref).abs().max()


def test_masks_are_device_independent_and_replay_is_exact_on_cuda(tokenizer, task_records):
    """Masks come from per-row CPU generators, so the CPU and CUDA runs of the same seeds perturb alike;
    on the device, two replays are bit-identical and match the rollout's own log-probs."""
    lm_cpu = make_lm(tokenizer, hidden_size=64).eval()
    lm_gpu = copy.deepcopy(lm_cpu)
    lm_gpu.model.to(CUDA)
    recs = task_records[:4]
    pert = LockedDropout(p=0.3)
    seeds = seeds_for(0, 0, 0, len(recs) * 4)
    kw = dict(group_size=4, n_latent=2, perturbation=pert, seeds=seeds, max_new_tokens=8)
    ro_cpu = collect_rollouts(lm_cpu, recs, **kw)
    ro_gpu = collect_rollouts(lm_gpu, recs, **kw)
    assert ro_cpu.texts == ro_gpu.texts
    assert torch.allclose(ro_cpu.rollout_logp.cpu(), ro_gpu.rollout_logp.cpu(), atol=1e-3)
    rows = torch.arange(seeds.numel())
    rkw = dict(n_latent=2, perturbation=pert, seeds=seeds, temperature=0.0)
    with torch.no_grad():
        a, m = replay_logprobs(lm_gpu, ro_gpu, rows, **rkw)
        b, _ = replay_logprobs(lm_gpu, ro_gpu, rows, **rkw)
    assert torch.equal(a, b)
    L = m.shape[1]
    assert torch.allclose(ro_gpu.rollout_logp[:, :L] * m, a, atol=1e-4)


@pytest.mark.parametrize("optimizer", ["adamw", "adamw8bit"])
def test_bf16_grpo_step_on_cuda(sft_checkpoint, optimizer):
    if optimizer == "adamw8bit":
        pytest.importorskip("bitsandbytes")
    from dgrpo.model.latent_lm import LatentLM

    cfg = tiny_config(
        **{
            "perturbation.p": "0.3",
            "grpo.filter": "false",
            "grpo.optimizer": optimizer,
            "grpo.prompts_per_step": "8",
            "grpo.warmup_steps": "0",
            "grpo.lr": "1e-3",
            "model.dtype": "bfloat16",
        }
    )
    lm = LatentLM.from_pretrained(sft_checkpoint, dtype=torch.bfloat16, device=CUDA)
    before = [p.detach().clone() for p in lm.model.parameters()]
    tr = GRPOTrainer(lm, cfg, generate_split(cfg.task, "train"))
    if optimizer == "adamw8bit":
        assert type(tr.opt).__module__.startswith("bitsandbytes")
    for _ in range(2):
        m = tr.step()
        assert m["skipped"] == 0 and torch.isfinite(torch.tensor(m["grad_norm"]))
        assert (
            m["logp_replay_maxdiff"] < 0.1
        )  # bf16: rollout and replay run the same kernels, up to batch-shape effects
    assert all(p.dtype == torch.bfloat16 and p.device.type == "cuda" for p in lm.model.parameters())
    assert any(not torch.equal(b, p) for b, p in zip(before, lm.model.parameters()))
