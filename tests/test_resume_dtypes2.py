"""A run with model.master_weights resumed under another model.dtype (allow_config_change): the float32 precision the
run kept is carried over exactly, both ways. A bf16 run's float32 masters are the weights of its float32 resume (not
their bf16 rounding); a float32 run's weights are the masters of its bf16 resume (not made from the rounded weight at
the first step)."""

import torch

from dgrpo.training.checkpoint import read_checkpoint, save_checkpoint
from dgrpo.training.master_weights import MasterWeightAdamW

from conftest import make_lm


def _step(lm, optimizer) -> None:
    """One optimizer step on a loss that moves every weight."""
    optimizer.zero_grad()
    sum(p.float().pow(2).sum() for p in lm.model.parameters()).backward()
    optimizer.step()


def _masters(optimizer) -> dict[int, torch.Tensor]:
    """Each parameter's master, by the parameter's position in the optimizer."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    return {i: optimizer.state[p]["master"] for i, p in enumerate(params) if "master" in optimizer.state.get(p, {})}


def test_a_bf16_runs_float32_masters_are_the_weights_of_its_float32_resume(tokenizer, tmp_path):
    """The float32 resume loaded the saved bf16 weights and dropped the masters: every weight rounded to bf16,
    what the masters held beyond it (steps under half a bf16 spacing, the reason for model.master_weights) lost."""
    lm = make_lm(tokenizer, seed=1).to(torch.bfloat16)
    opt = MasterWeightAdamW(lm.model.parameters(), lr=1e-4)  # (steps under half a bf16 spacing of most weights)
    for _ in range(3):
        _step(lm, opt)
    masters = _masters(opt)
    params = [p for g in opt.param_groups for p in g["params"]]
    assert len(masters) == len(params)
    assert any(not torch.equal(masters[i], p.float()) for i, p in enumerate(params))  # (the precision at stake)
    ckpt = save_checkpoint(tmp_path, 3, lm=lm, optimizer=opt, state={})
    lm32 = make_lm(tokenizer, seed=2)
    opt32 = MasterWeightAdamW(lm32.model.parameters(), lr=1e-4)
    read_checkpoint(ckpt, lm=lm32, optimizer=opt32).apply(lm32, opt32)
    for i, p in enumerate(p for g in opt32.param_groups for p in g["params"]):
        assert p.dtype == torch.float32 and torch.equal(p.detach(), masters[i]), i
    assert not _masters(opt32) and all("exp_avg" in s for s in opt32.state.values())  # (the moments kept)


def test_a_float32_runs_weights_are_the_masters_of_its_bf16_resume(tokenizer, tmp_path):
    """A float32 run (model.master_weights on, idle) resumed in bf16: its masters were made at the first step from
    the bf16 weights, the float32 weights' rounding; they are the saved float32 weights, exactly, and the bf16
    weights their rounding."""
    lm = make_lm(tokenizer, seed=1)
    opt = MasterWeightAdamW(lm.model.parameters(), lr=1e-3)
    _step(lm, opt)
    saved = [p.detach().clone() for g in opt.param_groups for p in g["params"]]
    assert any(not torch.equal(w, w.bfloat16().float()) for w in saved)
    ckpt = save_checkpoint(tmp_path, 1, lm=lm, optimizer=opt, state={})
    back = make_lm(tokenizer, seed=2).to(torch.bfloat16)
    opt_back = MasterWeightAdamW(back.model.parameters(), lr=1e-3)
    read_checkpoint(ckpt, lm=back, optimizer=opt_back).apply(back, opt_back)
    masters = _masters(opt_back)
    params = [p for g in opt_back.param_groups for p in g["params"]]
    assert len(masters) == len(params)
    for i, p in enumerate(params):
        assert masters[i].dtype == torch.float32 and torch.equal(masters[i], saved[i]), i
        assert torch.equal(p.detach(), saved[i].bfloat16()), i
    _step(back, opt_back)  # (the resumed run steps from them: the same step as the float32 weights', rounded)
    _step(lm, opt)
    for i, q in enumerate(p for g in opt.param_groups for p in g["params"]):
        assert torch.allclose(_masters(opt_back)[i], q.detach(), atol=1e-3), i


def test_a_float32_resume_under_plain_adamw_gets_no_masters(tokenizer, tmp_path):
    """Without MasterWeightAdamW (model.master_weights off) a bf16 resume of float32 weights makes no master."""
    lm = make_lm(tokenizer, seed=1)
    opt = torch.optim.AdamW(lm.model.parameters(), lr=1e-3)
    _step(lm, opt)
    ckpt = save_checkpoint(tmp_path, 1, lm=lm, optimizer=opt, state={})
    back = make_lm(tokenizer, seed=2).to(torch.bfloat16)
    opt_back = torch.optim.AdamW(back.model.parameters(), lr=1e-3)
    read_checkpoint(ckpt, lm=back, optimizer=opt_back).apply(back, opt_back)
    assert opt_back.state and not _masters(opt_back)
