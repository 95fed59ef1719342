"""Process-group plumbing: one small object that is a no-op in a single process and speaks
torch.distributed under ``torchrun`` (gloo on CPU, nccl on CUDA, picked automatically).

Data parallelism. Gradients are summed with one flat all-reduce per optimizer step (no DDP wrapper:
the latent recurrence runs several forwards per backward, which DDP's per-forward hooks do not
expect). The losses are already divided by *global* counts, so the sum is the single-process
gradient of the same global batch.

The one rule that keeps every rank in step: every collective is called by every rank, in the same
order, whatever its data. The callers make sure of it (see ``docs/distributed.md``): the group filter's
outcome is all-reduced before any backward; a rank that kept nothing runs no backward but joins the one
gradient reduction per optimizer step; eval shards are reduced even when empty; checkpoint saving is
called by every rank.

FSDP2 (config ``fsdp: full``, or ``sharded`` for sharded checkpoints; or ``DGRPO_FSDP=1|sharded``) shards gradients
and optimizer states with ``torch.distributed.fsdp.fully_shard``. Ranks run different numbers of forwards
(generation stops when a batch is done), so no forward or backward may issue a collective: layers use
``reshard_after_forward=False`` and no gradient sync, :meth:`Dist.gather_params` all-gathers the
weights once after each optimizer step, and :meth:`Dist.all_reduce_grads` reduce-scatters the
accumulated gradients once per step.
"""

from __future__ import annotations

import functools
import os
import shutil
import time
import warnings
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as tdist
from torch import nn

from ..config import FSDP_ENV, ConfigError, fsdp_mode, fsdp_setting
from ..model.anatomy import decoder_layers
from ..model.verified import SHARDED_DIR

#: the FSDP2 settings the sharded update needs (torch >= 2.13): without a parameter's reduce-scatter on a rank where
#: it got no gradient (``set_reduce_scatter_unused_params``) the ranks' collectives would not match
FSDP2_API = ("set_reduce_scatter_unused_params", "set_force_sum_reduction_for_comms", "set_gradient_divide_factor")


def fsdp2_missing() -> list[str]:
    """What of :data:`FSDP2_API` this torch's ``FSDPModule`` lacks (empty: FSDP2 training runs here)."""
    from torch.distributed.fsdp import FSDPModule

    return [name for name in FSDP2_API if not hasattr(FSDPModule, name)]


def env_int(name: str, default: int) -> int:
    """An integer environment variable (torchrun's WORLD_SIZE, LOCAL_RANK), or ConfigError naming it."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"environment variable {name}={text!r}: expected an integer (torchrun sets it)") from None


def check_fsdp2_api() -> None:
    """A config error, before any process group, where this torch's FSDP2 lacks what :meth:`Dist._fully_shard` sets."""
    missing = fsdp2_missing()
    if missing:
        raise ConfigError(
            f"fsdp: this torch ({torch.__version__}) has no FSDPModule.{missing[0]}, which the sharded update needs "
            "(torch >= 2.13); upgrade torch, or set fsdp=none (DGRPO_FSDP=0): plain data parallelism"
        )


@dataclass
class TrainingState:
    """What every rank of a sharded (FSDP2) run prepares for the resumable checkpoint rank 0 writes
    (:meth:`Dist.training_state`; all None without FSDP2). ``fsdp: full``: ``model`` and ``optimizer``, the whole
    state dicts on rank 0's CPU. ``fsdp: sharded``: ``shards``, the torch.distributed.checkpoint folder every rank
    wrote its part of the weights and the optimizer's tensors to, and ``optimizer``, the parameter groups alone."""

    model: dict | None = None
    optimizer: dict | None = None
    shards: Path | None = None


@dataclass
class Dist:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))  # where collective buffers live
    fsdp: bool = False
    checkpoint: str = "full"  # under FSDP: full (gathered safetensors, rank 0) | sharded (torch.distributed.checkpoint)
    comm_s: float = 0.0  # seconds spent in collectives, waiting for the slowest rank included
    sharded: list = field(default_factory=list, repr=False)  # (weakref to a model, its mesh) under FSDP2, for close()

    @classmethod
    def single(cls) -> Dist:
        return cls()

    @classmethod
    def given_or_single(cls, dist: Dist | None, fsdp: str, what: str, stacklevel: int = 3) -> Dist:
        """``dist``, else one process (``what``, a Python caller's ``train_grpo`` / ``train_sft`` / ``GRPOTrainer``,
        was given no ``dist=``), with a warning for what that leaves out, as :meth:`from_env` warns on the command
        line: the config's ``fsdp`` is not applied, and under torchrun (WORLD_SIZE > 1) every rank would train alone
        on all the data (both were silent)."""
        if dist is not None:
            return dist
        how = "pass dist=Dist.from_env(lm.device, cfg.fsdp) (dgrpo.training.distributed.Dist)"
        world = env_int("WORLD_SIZE", 1)
        if world > 1:
            warnings.warn(
                f"{what} was given no dist= under torchrun (WORLD_SIZE={world}): each rank trains alone on all the "
                f"data, writing the same run directory; {how}",
                stacklevel=stacklevel,
            )
        elif fsdp not in ("", "none"):
            warnings.warn(
                f"fsdp={fsdp} is not applied: {what} was given no dist= (one process); {how}", stacklevel=stacklevel
            )
        return cls()

    @classmethod
    def from_env(cls, device: torch.device | None = None, fsdp: str = "none", fsdp_env: bool = True) -> Dist:
        """Join the process group torchrun set up (WORLD_SIZE > 1), else a single process.

        The backend follows the training device: nccl for CUDA, gloo for CPU (``device`` None: CUDA
        when available). ``fsdp`` (the config key: none | full | sharded) turns FSDP2 on; the
        ``DGRPO_FSDP`` environment variable, when set, overrides it (unless ``fsdp_env`` is False: dgrpo eval, which
        applies no FSDP and says so itself)."""
        given = fsdp if isinstance(fsdp, str) else ("full" if fsdp is True else "none")  # (None / a bool: Python's)
        mode = fsdp_setting(given) if fsdp_env else fsdp_mode(given)
        sharding = mode in ("full", "sharded")
        world = env_int("WORLD_SIZE", 1)
        if world > 1 and not tdist.is_initialized():
            missing = [v for v in ("RANK", "MASTER_ADDR", "MASTER_PORT") if v not in os.environ]
            if missing:  # a WORLD_SIZE left in the environment, not a torchrun launch
                raise ConfigError(
                    f"WORLD_SIZE={world} is set but {', '.join(missing)} not: launch with torchrun (--nproc_per_node "
                    f"{world}), or unset WORLD_SIZE to run in one process"
                )
        if world <= 1:
            if sharding:
                warnings.warn(
                    f"fsdp={mode} ({FSDP_ENV} or the config key) is ignored in a single process (launch with torchrun)",
                    stacklevel=2,
                )
            return cls()
        cuda = device.type == "cuda" if device is not None else torch.cuda.is_available()
        local = env_int("LOCAL_RANK", 0)
        if cuda:
            torch.cuda.set_device(local)
        if sharding:
            check_fsdp2_api()
        if not tdist.is_initialized():
            tdist.init_process_group(backend="nccl" if cuda else "gloo")
        return cls(
            rank=tdist.get_rank(),
            world_size=tdist.get_world_size(),
            local_rank=local,
            device=torch.device("cuda", local) if cuda else torch.device("cpu"),
            fsdp=sharding,
            checkpoint="sharded" if mode == "sharded" else "full",
        )

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world_size > 1

    # ------------------------------------------------------------------ data
    def shard(self, items: list) -> list:
        """This rank's contiguous slice of a global batch (rank order = global order)."""
        if not self.active:
            return items
        n = len(items)
        lo = n * self.rank // self.world_size
        hi = n * (self.rank + 1) // self.world_size
        return items[lo:hi]

    # ------------------------------------------------------------------ small collectives
    def _reduce(self, t: torch.Tensor, op=None) -> torch.Tensor:
        """All-reduce ``t`` in place (through the backend's device when ``t`` lives elsewhere)."""
        if not self.active:
            return t
        t0 = time.perf_counter()
        buf = t if t.device == self.device else t.to(self.device)
        tdist.all_reduce(buf, op=op or tdist.ReduceOp.SUM)
        if buf is not t:
            t.copy_(buf)
        self.comm_s += time.perf_counter() - t0
        return t

    def sum_int(self, x: int) -> int:
        return int(self._reduce(torch.tensor([x], dtype=torch.long)).item()) if self.active else x

    def sum_ints(self, xs: list[int]) -> list[int]:
        """Element-wise sums over ranks, in one all-reduce."""
        if not self.active:
            return list(xs)
        return [int(v) for v in self._reduce(torch.tensor(xs, dtype=torch.long)).tolist()]

    def sum_float(self, x: float) -> float:
        return float(self._reduce(torch.tensor([x], dtype=torch.float64)).item()) if self.active else x

    def max_float(self, x: float) -> float:
        return (
            float(self._reduce(torch.tensor([x], dtype=torch.float64), tdist.ReduceOp.MAX).item()) if self.active else x
        )

    def min_float(self, x: float) -> float:
        return (
            float(self._reduce(torch.tensor([x], dtype=torch.float64), tdist.ReduceOp.MIN).item()) if self.active else x
        )

    def offset(self, n: int) -> int:
        """Global index of this rank's first item when every rank holds ``n`` items, in rank order."""
        if not self.active:
            return 0
        counts = torch.zeros(self.world_size, dtype=torch.long)
        counts[self.rank] = n
        self._reduce(counts)
        return int(counts[: self.rank].sum())

    def all_gather_objects(self, obj) -> list:
        """``[obj of rank 0, obj of rank 1, ...]`` on every rank (picklable objects)."""
        if not self.active:
            return [obj]
        t0 = time.perf_counter()
        out: list = [None] * self.world_size
        tdist.all_gather_object(out, obj)
        self.comm_s += time.perf_counter() - t0
        return out

    # ------------------------------------------------------------------ the model
    def broadcast_weights(self, model: nn.Module) -> None:
        """Rank 0's weights (every parameter, frozen ones too) on every rank; nothing in one process."""
        if not self.active:
            return
        t0 = time.perf_counter()
        with torch.no_grad():
            for p in model.parameters():
                tdist.broadcast(p.data, src=0)
        self.comm_s += time.perf_counter() - t0

    def prepare_model(self, model: nn.Module) -> list[nn.Parameter]:
        """With FSDP2, shard the model (its weights already rank 0's: :meth:`broadcast_weights`, which a trainer
        calls first, GRPO before its KL reference copies them). Returns the parameters to give the optimizer: under
        FSDP2 the sharded ones (``model.parameters()`` lists the gathered copies while they are held between an
        optimizer step and the next backward)."""
        trainable = [p for p in model.parameters() if p.requires_grad]  # under LoRA: the adapters only
        if self.fsdp and len(trainable) < len(list(model.parameters())):
            raise ConfigError(
                "invalid config value fsdp: FSDP with frozen weights (LoRA) is not supported; LoRA runs with "
                "fsdp=none (DGRPO_FSDP=0): the backbone is replicated and only the adapters train"
            )
        if not (self.active and self.fsdp):
            return trainable
        self._fully_shard(model)
        params = list(model.parameters())  # sharded (DTensor) here
        self.gather_params(model)
        return params

    def _fully_shard(self, model: nn.Module) -> None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import FSDPModule, fully_shard

        mesh = init_device_mesh(self.device.type, (self.world_size,))
        self.sharded.append((weakref.ref(model), mesh))
        for layer in decoder_layers(model):
            fully_shard(layer, mesh=mesh, reshard_after_forward=False)
        fully_shard(
            model, mesh=mesh, reshard_after_forward=False
        )  # the root: embeddings (tied or not), final norm, head
        for m in model.modules():
            if isinstance(m, FSDPModule):
                m.set_gradient_divide_factor(1.0)  # the losses carry the global normaliser: sum, never average
                m.set_force_sum_reduction_for_comms(True)  # a plain SUM reduce-scatter (gloo has no PREMUL_SUM)
                # no implicit backward prefetch: it follows the recorded forward order, which differs between
                # ranks (they run different numbers of forwards) and would all-gather on one rank only
                m.set_modules_to_backward_prefetch([m])
        model.set_reduce_scatter_unused_params(True)  # type: ignore[operator]  # a parameter without gradient sends zeros
        # backward only accumulates: one latent forward runs every layer several times (prompt, each thought,
        # the answer), and FSDP2 would reduce and free a layer's weights after the first of them
        model.set_requires_gradient_sync(False)  # type: ignore[operator]
        model.set_reshard_after_backward(False)  # type: ignore[operator]
        # FSDP takes the first module to run forward as its root: run the real root once (LatentLM calls
        # the base model and the head directly), then put the sharded parameters back in place
        with torch.no_grad():
            model(input_ids=torch.zeros(1, 1, dtype=torch.long, device=self.device))
        for m in model.modules():
            if isinstance(m, FSDPModule):
                m.reshard()

    def gather_params(self, model: nn.Module) -> None:
        """FSDP2: all-gather the weights after an optimizer step; they stay gathered until the next backward."""
        if not self.fsdp:
            return
        from torch.distributed.fsdp import FSDPModule

        t0 = time.perf_counter()
        for m in model.modules():  # the same order on every rank
            if isinstance(m, FSDPModule):
                m.unshard()
        self.comm_s += time.perf_counter() - t0

    def all_reduce_grads(self, model: nn.Module) -> None:
        """Sum gradients over ranks, once per optimizer step, whatever number of backward passes (possibly
        none) this rank ran. The losses are already scaled by the global normaliser.

        One flat all-reduce, in the widest dtype of the trainable parameters (an fp32 gradient beside bf16 ones is
        not summed in bf16): a parameter that got no gradient on a rank contributes zeros; one that got none on any
        rank keeps ``grad = None``, as in a single process. Under FSDP2: the reduce-scatter."""
        if not self.active:
            return
        if self.fsdp:
            self._reduce_scatter_grads(model)
            return
        params = [p for p in model.parameters() if p.requires_grad]
        if not params:
            return
        dtype = functools.reduce(torch.promote_types, [p.dtype for p in params])  # (bf16 and fp32: fp32)
        parts = [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).to(dtype) for p in params]
        parts.append(torch.tensor([p.grad is not None for p in params], dtype=dtype, device=params[0].device))
        full = torch.cat(parts)
        self._reduce(full)
        has_grad = full[-len(params) :] > 0
        off = 0
        for p, has in zip(params, has_grad.tolist()):
            n = p.numel()
            p.grad = full[off : off + n].view_as(p).to(p.dtype) if has else None
            off += n

    def _reduce_scatter_grads(self, model: nn.Module) -> None:
        """FSDP2: the backward passes only accumulated full-size gradients. One single-token forward and
        zero-weight backward with gradient sync on then reduce-scatters all of it (one collective per layer,
        the same on every rank) and reshards the weights, leaving sharded gradients for the optimizer."""
        t0 = time.perf_counter()
        model.set_requires_gradient_sync(True)  # type: ignore[operator]
        model.set_reshard_after_backward(True)  # type: ignore[operator]
        out = model(input_ids=torch.zeros(1, 1, dtype=torch.long, device=self.device))
        (out.logits.float().sum() * 0.0).backward()
        model.set_requires_gradient_sync(False)  # type: ignore[operator]
        model.set_reshard_after_backward(False)  # type: ignore[operator]
        self.comm_s += time.perf_counter() - t0

    def full_state_dict(self, model: nn.Module) -> dict:
        """The whole model's state dict on every rank (a collective under FSDP2)."""
        if not self.fsdp:
            return model.state_dict()
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
        self.gather_params(model)  # reading the state dict put the shards back in place
        return state

    def training_state(self, model: nn.Module, optimizer: torch.optim.Optimizer, staging: Path) -> TrainingState:
        """What a resumable checkpoint holds of a sharded (FSDP2) model and its optimizer, prepared by every rank (a
        collective) for rank 0 to write; nothing otherwise (the model and the optimizer are saved as they are).
        ``fsdp: full``: the whole state dicts, gathered to rank 0's CPU (the others get empty dicts), named by
        parameter. ``fsdp: sharded``: each rank writes its shards of the weights and of the optimizer's tensors to
        ``staging/dcp`` (torch.distributed.checkpoint; nothing is gathered), and rank 0 gets the optimizer's
        parameter groups (their settings, named by parameter)."""
        if not self.fsdp:
            return TrainingState()
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        t0 = time.perf_counter()
        if self.checkpoint == "sharded":
            import torch.distributed.checkpoint as dcp

            model_state, optimizer_state = get_state_dict(model, optimizer)
            shards = {"model": model_state, "optimizer_state": optimizer_state["state"]}
            dcp.save(shards, checkpoint_id=str(staging / SHARDED_DIR))  # returns when every rank wrote
            groups = {"state": {}, "param_groups": optimizer_state["param_groups"]}
            state = TrainingState(optimizer=groups, shards=staging / SHARDED_DIR)
        else:
            options = StateDictOptions(full_state_dict=True, cpu_offload=True)
            state = TrainingState(*get_state_dict(model, optimizer, options=options))
        self.gather_params(model)  # reading the state dicts put the shards back in place
        self.comm_s += time.perf_counter() - t0
        return state

    def load_training_shards(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, shards: Path, param_groups: list
    ) -> None:
        """Put a resumable checkpoint's shards (:meth:`training_state` under ``fsdp: sharded``) into the sharded
        model and optimizer (a collective; any number of ranks: torch.distributed.checkpoint reshards), with the
        optimizer's saved ``param_groups``. The shards' metadata is read without unpickling code
        (:class:`~dgrpo.training.consolidate.SafeFileSystemReader`)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        from .consolidate import SafeFileSystemReader

        model_state, optimizer_state = get_state_dict(model, optimizer)  # (the layout to load into)
        state: dict[str, Any] = {"model": model_state, "optimizer_state": optimizer_state["state"]}
        dcp.load(state, storage_reader=SafeFileSystemReader(shards))
        saved = {"state": state["optimizer_state"], "param_groups": param_groups}
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=saved)
        self.gather_params(model)

    def load_training_state(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, model_state: dict, optimizer_state: dict
    ) -> None:
        """Under FSDP2, put a resumable checkpoint's whole state dicts (:meth:`training_state`'s, read on every
        rank) into the sharded model and optimizer: each rank keeps its shards (a collective)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        set_state_dict(
            model,
            optimizer,
            model_state_dict=model_state,
            optim_state_dict=optimizer_state,
            options=StateDictOptions(full_state_dict=True),
        )
        self.gather_params(model)

    def save_model(self, lm, path: str | Path) -> None:
        """Save a LatentLM checkpoint directory through :meth:`LatentLM.save_pretrained`. Every rank calls this
        (a collective under FSDP2); only rank 0 writes, except the shards of an FSDP ``sharded`` checkpoint
        (``path/dcp``, one file per rank; see :func:`consolidate_checkpoint`)."""
        path = Path(path)
        if not self.fsdp:
            if self.is_main:
                lm.save_pretrained(path)
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        t0 = time.perf_counter()
        state = None
        staging = path.parent / f".tmp-{path.name}-shards"  # the same name on every rank
        if self.checkpoint == "sharded":
            import torch.distributed.checkpoint as dcp

            dcp.save(get_model_state_dict(lm.model), checkpoint_id=str(staging / SHARDED_DIR))  # returns when all wrote
        else:
            state = get_model_state_dict(lm.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        self.comm_s += time.perf_counter() - t0
        self.gather_params(lm.model)  # reading the state dict put the shards back in place
        if self.is_main:
            if state is not None:
                lm.save_pretrained(path, state_dict=state)
            else:  # the shards go into the directory before its manifest is written and it is renamed into place
                lm.save_pretrained(
                    path, weights=False, extra=lambda tmp: os.replace(staging / SHARDED_DIR, tmp / SHARDED_DIR)
                )
                shutil.rmtree(staging, ignore_errors=True)

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Leave the process group: a barrier, then the group is destroyed and its threads joined here, not at
        interpreter exit."""
        if self.active and tdist.is_initialized():
            tdist.barrier()  # nobody tears the group down while another rank still talks to it
            tdist.destroy_process_group()
        for model_ref, mesh in self.sharded:
            release_fsdp_groups(model_ref(), mesh)
        self.sharded.clear()


def release_fsdp_groups(model: nn.Module | None, mesh: object) -> None:
    """Drop FSDP2's own references to the process group of ``model`` (after ``destroy_process_group``).

    FSDP2's mesh infos and the device mesh (which DTensor's sharding caches keep alive after the model is gone) hold
    the group, so ``destroy_process_group`` leaves it, and gloo's worker and socket threads, alive until interpreter
    teardown, where destroying it can abort a run that succeeded ("terminate called without an active exception",
    exit code -6). Without references the group is destroyed at once. Reads FSDP2 internals of recent torch;
    what a version lacks is skipped (the group then lives on as before)."""
    from torch.distributed.fsdp import FSDPModule

    groups = ("shard_process_group", "replicate_process_group", "reduce_scatter_process_group")
    for module in model.modules() if model is not None else ():
        if not isinstance(module, FSDPModule):
            continue
        get_state = getattr(module, "_get_fsdp_state", None)
        param_group = getattr(get_state(), "_fsdp_param_group", None) if get_state else None
        holders = [getattr(param_group, "mesh_info", None), getattr(param_group, "post_forward_mesh_info", None)]
        for param in getattr(param_group, "fsdp_params", []):
            holders += [getattr(param, "mesh_info", None), getattr(param, "post_forward_mesh_info", None)]
        for info in holders:
            for name in groups:
                if getattr(info, name, None) is not None:
                    setattr(info, name, None)
    registry = getattr(mesh, "_pg_registry", None)
    if isinstance(registry, dict):
        registry.clear()


def exit_with_parent(parent: int | None = None) -> bool:
    """Ask Linux to send this process SIGTERM when its parent dies, however it dies (SIGKILL included): prctl
    PR_SET_PDEATHSIG. Used by torchrun workers (the parent is the launcher) and the demo's pool workers (which pass
    the demo's pid as ``parent``). False when the parent died before the call (no signal will come: the caller should
    exit): this process was adopted, so its parent is now another process than ``parent`` (default: the parent read
    just before the call) or init. An orphan is adopted by the nearest subreaper (systemd's user manager, some
    containers' init), not always by PID 1, hence the comparison. True otherwise, and where prctl is not available
    (not Linux: kill the process group instead)."""
    import ctypes
    import signal

    expected = os.getppid() if parent is None else parent
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return True
    now = os.getppid()  # (after the call: a parent dying from here on sends the signal)
    return now == expected and now != 1


def available_cpus() -> int:
    """The CPUs this process may run on (the affinity mask where the OS has one)."""
    sched = getattr(os, "sched_getaffinity", None)
    return len(sched(0)) if sched is not None else os.cpu_count() or 1
