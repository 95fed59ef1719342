"""Process-group plumbing: one small object that is a no-op in a single process and speaks
torch.distributed under ``torchrun`` (gloo on CPU, nccl on CUDA, picked automatically).

Gradients are averaged with one flat all-reduce per step (no DDP wrapper: the latent recurrence runs
several forwards per backward, which DDP's per-forward hooks do not expect).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as tdist


@dataclass
class Dist:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @classmethod
    def single(cls) -> "Dist":
        return cls()

    @classmethod
    def from_env(cls) -> "Dist":
        """Join the process group torchrun set up (WORLD_SIZE > 1), else a single process."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return cls()
        if not tdist.is_initialized():
            backend = "nccl" if torch.cuda.is_available() else "gloo"
            tdist.init_process_group(backend=backend)
        local = int(os.environ.get("LOCAL_RANK", "0"))
        if torch.cuda.is_available():
            torch.cuda.set_device(local)
        return cls(rank=tdist.get_rank(), world_size=tdist.get_world_size(), local_rank=local)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world_size > 1

    def shard(self, items: list) -> list:
        """This rank's contiguous slice of a global batch."""
        if not self.active:
            return items
        n = len(items)
        lo = n * self.rank // self.world_size
        hi = n * (self.rank + 1) // self.world_size
        return items[lo:hi]

    def _reduce(self, t: torch.Tensor, op=None) -> torch.Tensor:
        if self.active:
            tdist.all_reduce(t, op=op or tdist.ReduceOp.SUM)
        return t

    def sum_int(self, x: int) -> int:
        return int(self._reduce(torch.tensor([x], dtype=torch.long)).item()) if self.active else x

    def sum_float(self, x: float) -> float:
        return float(self._reduce(torch.tensor([x], dtype=torch.float64)).item()) if self.active else x

    def all_reduce_grads(self, model: torch.nn.Module) -> None:
        """Sum gradients over ranks (the losses are already scaled by the global normaliser)."""
        if not self.active:
            return
        params = [p for p in model.parameters() if p.requires_grad]
        # one flat buffer; a parameter that got no gradient on this rank contributes zeros
        full = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
        self._reduce(full)
        off = 0
        for p in params:
            n = p.numel()
            p.grad = full[off:off + n].view_as(p).clone()
            off += n

    def barrier(self) -> None:
        if self.active:
            tdist.barrier()

    def close(self) -> None:
        if self.active and tdist.is_initialized():
            tdist.destroy_process_group()
