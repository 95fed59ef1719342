"""Gaps found by mutation testing of ``dgrpo.training.master_weights``: the rounded-away share's edges (frozen weights,
a weight exactly at the rounding floor, no step), the warning's threshold and where it points, and the masters' own
state between steps (no float32 gradient kept; carried only where there is one)."""

import types
import warnings

import pytest
import torch

from dgrpo.training.master_weights import (
    ROUNDED_AWAY_WARN_SHARE,
    MasterWeightAdamW,
    adamw,
    carry_masters,
    rounded_away_share,
    rounding_floor,
)

KW = {"lr": 1e-3, "weight_decay": 0.0}


def _bf16(values: list[float], requires_grad: bool = True) -> torch.nn.Parameter:
    return torch.nn.Parameter(torch.tensor(values, dtype=torch.bfloat16), requires_grad=requires_grad)


def test_the_rounding_floor_is_the_smallest_power_of_two_whose_half_spacing_exceeds_the_step():
    """bf16 keeps 8 significant bits (eps 2**-7): a weight in [2**k, 2**(k+1)) has half spacing 2**(k-8). A step of
    1e-3 (between 2**-10 and 2**-9) is lost from 2**-9 * 2**8 = 0.5 up; a step of exactly 2**-10 (a tie at 2**-2,
    which moves half the weights) from 2**-1 up."""
    assert rounding_floor(torch.bfloat16, 1e-3) == 0.5
    assert rounding_floor(torch.bfloat16, 2.0**-10) == 0.5
    assert rounding_floor(torch.float16, 1e-3) == 4.0  # (fp16: eps 2**-10, half spacing 2**(k-11))


def test_the_share_counts_a_weight_at_the_floor_as_lost_and_frozen_or_no_step_weights_not_at_all():
    """With a step of 1e-3 (floor 0.5): 0.5 and -0.75 do not move (0.5 + 1e-3 rounds back to 0.5), 0.498 (the bf16
    below 0.5) and 0.25 do; frozen weights are not trained, so not counted; no step (lr 0) loses nothing."""
    w = _bf16([0.5, -0.75, 0.498046875, 0.25])
    frozen = _bf16([1.0, 2.0, 4.0, 8.0], requires_grad=False)
    assert rounded_away_share([w, frozen], 1e-3) == 0.5
    moved = (w.detach().float() + 1e-3).bfloat16()
    assert moved.tolist() == [0.5, -0.75, 0.5, 0.251953125]  # (what the share predicts: the first two unchanged)
    assert rounded_away_share([w], 0.0) == 0.0
    assert rounded_away_share([frozen], 1e-3) == 0.0


def _rounding_warnings(params, lr: float) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        adamw(params, False, lr=lr)
    return [w for w in caught if "without model.master_weights" in str(w.message)]


def test_the_warning_is_said_above_a_tenth_of_the_weights_and_points_at_the_optimizers_maker():
    """10 weights, one (0.5) at or above the floor of lr 1e-3: exactly the 10% threshold, no warning; two: 20%, a
    warning, attributed to the code that asked for the optimizer (a trainer's builder: here this file), not to
    master_weights.py."""
    assert ROUNDED_AWAY_WARN_SHARE == 0.10
    small = [0.125] * 8

    def build_optimizer(params, lr):  # (the trainers' builder, which calls adamw)
        return adamw(params, False, lr=lr)

    assert not _rounding_warnings([_bf16([0.5, *small, 0.25])], 1e-3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        build_optimizer([_bf16([0.5, 0.5, *small])], 1e-3)
    [said] = [w for w in caught if "without model.master_weights" in str(w.message)]
    assert "is under half the spacing of 20.0% of the trained weights" in str(said.message)
    assert said.filename == __file__


def test_a_step_leaves_no_float32_gradient_on_the_masters():
    """The master's float32 gradient is a copy of the parameter's made for the step: it is dropped after it (kept, it
    would hold a second float32 copy of every gradient until the next step)."""
    p = _bf16([0.1, 0.2, 0.3])
    opt = MasterWeightAdamW([p], **KW)
    p.grad = torch.ones_like(p)
    opt.step()
    master = opt.state[p]["master"]
    assert master.grad is None and master.dtype == torch.float32
    assert torch.equal(p.detach(), master.bfloat16())


def test_carrying_masters_gives_a_new_optimizer_only_the_masters_there_are():
    """No old optimizer: nothing is carried. A float32 parameter (no master) and a bf16 one never stepped (no master
    yet) get no state: both then step as a fresh optimizer's would (the float32 one as torch's AdamW)."""
    full = torch.nn.Parameter(torch.tensor([0.1, 0.2]))
    low = _bf16([0.3, 0.4])
    never = _bf16([0.5, 0.6])
    old = MasterWeightAdamW([full, low, never], **KW)
    full.grad, low.grad = torch.ones_like(full), torch.ones_like(low)
    old.step()
    new = MasterWeightAdamW([full, low, never], **KW)
    carry_masters(None, new)
    assert len(new.state) == 0
    carry_masters(old, new)
    assert set(new.state) == {low} and new.state[low]["master"] is old.state[low]["master"]
    twin = torch.nn.Parameter(full.detach().clone())
    plain = torch.optim.AdamW([twin], **KW)
    for q in (full, low, never, twin):
        q.grad = torch.ones_like(q)
    new.step()
    plain.step()
    assert torch.equal(full.detach(), twin.detach())


def test_a_closure_is_evaluated_with_gradients_and_its_loss_returned():
    """``step(closure)``: the closure runs with autograd on (the step itself runs without), its backward fills the
    gradient the step uses, and its loss is what step returns (torch's optimizer contract)."""
    p = _bf16([0.25, -0.5])
    opt = MasterWeightAdamW([p], **KW)

    def closure():
        opt.zero_grad()
        loss = (p.float() * torch.tensor([1.0, -1.0])).sum()
        loss.backward()
        return loss

    assert opt.step(closure).item() == 0.75
    assert p.grad is not None and p.grad.tolist() == [1.0, -1.0]
    assert opt.state[p]["master"].tolist() == pytest.approx([0.25 - 1e-3, -0.5 + 1e-3], abs=1e-6)


def test_the_share_of_sharded_weights_is_counted_over_every_ranks_shard(monkeypatch):
    """A sharded parameter (FSDP2's DTensor: its local shard and its mesh) counts its own shard, then the counts are
    summed over the mesh's group (in float64): here this rank's shard [0.5, 0.25] loses one entry of 2 at lr 1e-3,
    the peer's six entries none, so the model's share is 1/8 (not this shard's 1/2, nor the full tensor's)."""
    import torch.distributed as tdist

    reduced = []

    def all_reduce(t, group=None, **kw):
        reduced.append((t.dtype, group))
        t.add_(torch.tensor([0.0, 6.0], dtype=t.dtype))

    monkeypatch.setattr(tdist, "all_reduce", all_reduce)
    p = _bf16([8.0, 8.0, 8.0, 8.0])
    group = object()
    p.to_local = lambda: torch.tensor([0.5, 0.25], dtype=torch.bfloat16)
    p.device_mesh = types.SimpleNamespace(get_group=lambda: group)
    assert rounded_away_share([p], 1e-3) == 1 / 8
    assert reduced == [(torch.float64, group)]


def test_a_saved_state_loads_onto_the_parameters_device_with_the_step_left_where_torch_keeps_it():
    """A checkpoint read onto the CPU, loaded into an optimizer over parameters elsewhere (here the meta device, as
    a GPU would be): the master and moments go to the parameter's device in float32, the step count stays a CPU
    float32 tensor (torch's AdamW refuses a step on the GPU unless capturable)."""
    p = _bf16([0.25, 0.5])
    opt = MasterWeightAdamW([p], **KW)
    p.grad = torch.ones_like(p)
    opt.step()
    there = torch.nn.Parameter(torch.empty(2, dtype=torch.bfloat16, device="meta"))
    loaded = MasterWeightAdamW([there], **KW)
    loaded.load_state_dict(opt.state_dict())
    placed = {name: (value.device.type, value.dtype) for name, value in loaded.state[there].items()}
    meta = ("meta", torch.float32)
    assert placed == {"master": meta, "exp_avg": meta, "exp_avg_sq": meta, "step": ("cpu", torch.float32)}


def test_the_share_counts_every_trained_entry_also_of_tensors_that_lose_nothing():
    """A tensor whose entries all move (0.125s at lr 1e-3) still counts in the total: with a second one losing one
    entry of two (0.5 and 0.25), the share is 1/4, not 1/2."""
    assert rounded_away_share([_bf16([0.125, 0.125]), _bf16([0.5, 0.25])], 1e-3) == 0.25
