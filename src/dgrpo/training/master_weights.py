"""AdamW with a float32 master copy of low-precision weights (``model.master_weights``).

The paper loads and trains bf16 weights without one, so an AdamW step under half a bf16 spacing of a weight is
rounded away (``experiments/bf16_updates.py``). :class:`MasterWeightAdamW` keeps, in the optimizer state of each
bf16 (or fp16) parameter, ``master``: the weight in float32, next to float32 moments. A step is torch's AdamW on
the masters (their gradients the parameters' in float32); each weight is then its master rounded to nearest.
The state is keyed by the model's parameters like any torch optimizer's, so whole and sharded (FSDP2) checkpoints
save and restore the masters with the moments, and a resumed run goes on bit for bit.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor

#: the parameter dtypes that get a float32 master copy
LOW_PRECISION = (torch.bfloat16, torch.float16)


def is_low_precision(p: Tensor) -> bool:
    return p.dtype in LOW_PRECISION


class MasterWeightAdamW(torch.optim.AdamW):
    """torch's AdamW, stepping a float32 master of each low-precision parameter (float32 ones step as they are)."""

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        swapped = [(group, group["params"]) for group in self.param_groups]
        stepped: list[tuple[Tensor, Tensor]] = []
        try:
            for group, params in swapped:
                group["params"] = [self._stand_in(p, stepped) for p in params]
            adamw_step = torch.optim.AdamW.step
            if getattr(adamw_step, "hooked", False):  # torch's wrapper with the step hooks, which ran around this step
                adamw_step = adamw_step.__wrapped__  # type: ignore[attr-defined]
            adamw_step(self)
        finally:
            for group, params in swapped:
                group["params"] = params
            for p, master in stepped:
                self.state[p].update(self.state.pop(master))  # the moments created or updated on the master
                master.grad = None
                p.copy_(master)
        return loss

    def _stand_in(self, p: Tensor, stepped: list[tuple[Tensor, Tensor]]) -> Tensor:
        """What AdamW steps for ``p``: its float32 master (made from the weight at its first step), holding the
        gradient in float32 and AdamW's own state (the parameter's state less ``master``); ``p`` itself otherwise."""
        if p.grad is None or not is_low_precision(p):
            return p
        state = self.state[p]
        master = state.get("master")
        if master is None:
            master = state["master"] = p.detach().to(torch.float32)
        master.grad = p.grad.to(torch.float32)
        self.state[master] = {k: v for k, v in state.items() if k != "master"}
        stepped.append((p, master))
        return master

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch's loading casts a parameter's floating state to its dtype: a bf16 parameter's master and moments
        are put back in float32 (torch's copies are replaced by the saved tensors, on the parameter's device)."""
        saved_ids = [i for g in state_dict["param_groups"] for i in g["params"]]
        super().load_state_dict(state_dict)
        params = [p for g in self.param_groups for p in g["params"]]
        for i, p in zip(saved_ids, params):
            if not is_low_precision(p):
                continue
            for name, value in state_dict["state"].get(i, {}).items():
                if name != "step" and isinstance(value, Tensor) and value.is_floating_point():
                    self.state[p][name] = value.to(device=p.device, dtype=torch.float32)


def adamw(
    params: Iterable[Tensor],
    master_weights: bool,
    *,
    warn_rounding: bool = True,
    optimizer_key: str = "",
    **kwargs: Any,
) -> torch.optim.AdamW:
    """torch's AdamW, or with ``master_weights`` :class:`MasterWeightAdamW`; without masters, a warning when the
    (peak) lr's step is rounded away on much of the low-precision weights (:func:`warn_if_updates_round_away`, its
    ``optimizer_key``), unless ``warn_rounding`` is False (an optimizer made anew over weights already warned of)."""
    params = list(params)
    if warn_rounding and not master_weights and "lr" in kwargs:
        warn_if_updates_round_away(params, float(kwargs["lr"]), stacklevel=4, optimizer_key=optimizer_key)
    return (MasterWeightAdamW if master_weights else torch.optim.AdamW)(params, **kwargs)


#: the share of the trained low-precision weights whose update an optimizer step may round away before it is warned
ROUNDED_AWAY_WARN_SHARE = 0.10


def rounding_floor(dtype: torch.dtype, step: float) -> float:
    """The smallest magnitude |w| at which a weight of ``dtype`` no longer moves by a step of ``step`` (rounded to
    nearest): where half its spacing, 2**floor(log2 |w|) * eps / 2, exceeds ``step``."""
    k = math.floor(math.log2(2 * step / torch.finfo(dtype).eps)) + 1
    return 2.0**k


def rounded_away_share(params: Iterable[Any], step: float) -> float:
    """The share of the entries of the trained (``requires_grad``) low-precision tensors among ``params`` (tensors,
    or torch param groups) that a step of ``step`` leaves unchanged: an AdamW step moves a weight by about lr, so
    with lr as ``step`` these weights do not train without a float32 master. 0 when there are none, or ``step`` is
    not positive. Sharded parameters (FSDP2's DTensors) are counted over every rank's shard: a collective, which every
    rank of their mesh calls (each rank's own shard gave each its own share: under fsdp=full on 3 processes, 12% on
    rank 0 for the model's 13%)."""
    if step <= 0:
        return 0.0
    lost = total = 0
    mesh, device = None, None
    for item in params:
        for p in item["params"] if isinstance(item, dict) else [item]:
            if not (isinstance(p, Tensor) and p.requires_grad and is_low_precision(p)):
                continue
            if hasattr(p, "to_local"):  # (FSDP2's DTensor: this rank's shard, summed over the mesh below)
                local, mesh = p.to_local(), getattr(p, "device_mesh")  # noqa: B009  (a DTensor's)
                device = local.device
            else:
                local = p
            floor = rounding_floor(p.dtype, step)
            flat = local.detach().reshape(-1)
            lost += sum(int((chunk.abs() >= floor).sum()) for chunk in flat.split(1 << 24))
            total += flat.numel()
    if mesh is not None:
        lost, total = _summed_over(mesh, device, [lost, total])
    return lost / total if total else 0.0


def _summed_over(mesh: Any, device: torch.device | None, counts: list[int]) -> list[int]:
    """``counts`` summed over the ranks of a (1-D) device mesh (in a tensor on ``device``, its shards')."""
    import torch.distributed as tdist

    t = torch.tensor(counts, dtype=torch.float64, device=device)
    tdist.all_reduce(t, group=mesh.get_group())
    return [int(x) for x in t.tolist()]


def warn_if_updates_round_away(
    params: Iterable[Any], lr: float, stacklevel: int = 2, *, optimizer_key: str = ""
) -> None:
    """Warn when an optimizer step at ``lr`` writes into low-precision weights without a float32 master and is under
    half their spacing for more than :data:`ROUNDED_AWAY_WARN_SHARE` of them: those weights never change, silently.
    ``optimizer_key``: the trainer's optimizer option, which masters need to be ``adamw`` (GRPO's; SFT has none)."""
    share = rounded_away_share(params, lr)
    if share > ROUNDED_AWAY_WARN_SHARE:
        also = f" (with {optimizer_key}=adamw)" if optimizer_key else ""
        warnings.warn(
            f"low-precision weights without model.master_weights: a step of lr {lr:g} is under half the spacing of "
            f"{share:.1%} of the trained weights, which it leaves unchanged (README, 'bf16 weights'); set "
            f"model.master_weights=true{also} to step float32 masters",
            stacklevel=stacklevel,
        )


def carry_masters(old: torch.optim.Optimizer | None, new: torch.optim.Optimizer) -> None:
    """A new optimizer over the same parameters (SFT's reset) starts from the old one's masters: the weights'
    float32 values, not optimizer history, which a reset would otherwise round to bf16."""
    if old is None:
        return
    for group in new.param_groups:
        for p in group["params"]:
            master = old.state.get(p, {}).get("master")
            if master is not None:
                new.state[p]["master"] = master
