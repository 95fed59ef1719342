"""Gaps found by mutation testing of ``dgrpo.training.distributed`` and ``dgrpo.training.ref_policy``, in one process:
torch.distributed's calls are stood in for by what a peer rank would bring (no process group is started), so the
arithmetic of each collective, the launch checks of ``Dist.from_env`` and the rank-0-only writes are pinned fast
(tests/test_distributed.py runs the real thing under torchrun, slow)."""

from __future__ import annotations

import os
import sys
import time
import types

import pytest
import torch
import torch.distributed as tdist

from dgrpo.config import ConfigError
from dgrpo.training import distributed
from dgrpo.training.distributed import Dist, TrainingState, available_cpus, env_int, exit_with_parent, fsdp2_missing

from conftest import make_lm

SUM, MAX, MIN = tdist.ReduceOp.SUM, tdist.ReduceOp.MAX, tdist.ReduceOp.MIN


def with_peer(monkeypatch, peer) -> list:
    """All-reduces as over this rank and one peer, whose tensor is ``peer(t)``; returns the ops seen."""
    ops: list = []

    def all_reduce(t, op=SUM, **kw):
        ops.append(op)
        other = peer(t).to(t.dtype)
        t.copy_({SUM: t + other, MAX: torch.maximum(t, other), MIN: torch.minimum(t, other)}[op])

    monkeypatch.setattr(tdist, "all_reduce", all_reduce)
    return ops


def test_shards_split_any_batch_into_contiguous_slices_in_rank_order():
    """Every item lands on exactly one rank, in global order, the slices' sizes differing by at most one (11 over 3
    ranks: 3, 4, 4)."""
    assert [Dist(rank=r, world_size=3).shard(list(range(11))) for r in range(3)] == [
        [0, 1, 2],
        [3, 4, 5, 6],
        [7, 8, 9, 10],
    ]
    for n in range(9):
        for world in (2, 3, 4):
            parts = [Dist(rank=r, world_size=world).shard(list(range(n))) for r in range(world)]
            assert sum(parts, []) == list(range(n)) and max(map(len, parts)) - min(map(len, parts)) <= 1
    assert Dist.single().shard([5, 6]) == [5, 6]


def test_small_collectives_sum_max_and_min_over_ranks_exactly(monkeypatch):
    """Rank 0 of two, the peer bringing 2**40 + 1 more to the ints and 1/3 to the floats: sums are exact (no float32
    on the way), max and min take the right side, and comm_s counts every collective's time (1 s each here)."""
    ops = with_peer(monkeypatch, lambda t: t.clone() if t.dtype == torch.long else torch.full_like(t, 1 / 3))
    ticks = iter(range(100))
    monkeypatch.setattr(distributed.time, "perf_counter", lambda: float(next(ticks)))
    d = Dist(rank=0, world_size=2)
    assert d.sum_int(2**40 + 1) == 2**41 + 2
    assert d.sum_ints([2**40 + 1, 3]) == [2**41 + 2, 6]
    assert d.sum_float(1 / 3) == 2 / 3
    assert d.max_float(0.25) == 1 / 3 and d.min_float(0.25) == 0.25
    assert ops == [SUM, SUM, SUM, MAX, MIN]
    assert d.comm_s == 5.0


def test_offset_counts_the_items_of_the_ranks_before_this_one(monkeypatch):
    """Rank 1 of three holding 4 items, rank 0 holding 5 and rank 2 holding 7: its first item is global index 5."""
    with_peer(monkeypatch, lambda t: torch.tensor([5, 0, 7]))
    assert Dist(rank=1, world_size=3).offset(4) == 5
    assert Dist.single().offset(4) == 0 and Dist.single().all_gather_objects("x") == ["x"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the copy back needs a device other than the CPU")
def test_a_reduction_through_the_backends_device_comes_back_into_the_callers_tensor(monkeypatch):
    """nccl reduces on CUDA: a CPU tensor goes there and its sum comes back into the caller's tensor."""
    with_peer(monkeypatch, lambda t: torch.ones_like(t))
    t = torch.tensor([1.0, 2.0])
    assert Dist(rank=0, world_size=2, device=torch.device("cuda")).sum_float(1.0) == 2.0
    Dist(rank=0, world_size=2, device=torch.device("cuda"))._reduce(t)
    assert t.device.type == "cpu" and t.tolist() == [2.0, 3.0]


def test_gradients_sum_over_ranks_and_only_a_parameter_no_rank_reached_keeps_none(monkeypatch):
    """Rank 0 has a gradient for ``a`` (bf16) only, its peer for ``b`` (float32) only and for ``a`` (10 each): after
    the reduction ``a`` holds the sum in bf16, ``b`` the peer's to float32's last bit (1 + 2**-10 is no bf16: the
    buffer is float32 although the first parameter is bf16), ``c`` (no gradient anywhere) None, ``frozen`` untouched;
    every gradient keeps its parameter's shape and dtype."""
    fine = 2.0**-10

    def peer(t):  # the peer's flat buffer: a = 10 (4 entries), b = 1..6 + 2**-10, c = 0 (1 entry), flags 1, 1, 0
        return torch.tensor([10.0] * 4 + [v + fine for v in range(1, 7)] + [0] + [1, 1, 0], dtype=torch.float64)

    with_peer(monkeypatch, peer)
    model = torch.nn.Module()
    model.a = torch.nn.Parameter(torch.zeros(2, 2, dtype=torch.bfloat16))
    model.b = torch.nn.Parameter(torch.zeros(2, 3))
    model.c = torch.nn.Parameter(torch.zeros(1))
    model.frozen = torch.nn.Parameter(torch.zeros(5), requires_grad=False)
    model.a.grad = torch.ones(2, 2, dtype=torch.bfloat16)
    Dist(rank=0, world_size=2).all_reduce_grads(model)
    assert torch.equal(model.a.grad, torch.full((2, 2), 11.0, dtype=torch.bfloat16))
    assert torch.equal(model.b.grad, torch.arange(1.0, 7.0).view(2, 3) + fine)
    assert model.c.grad is None and model.frozen.grad is None


def test_gradient_reduction_is_nothing_in_one_process_or_without_trainable_parameters(monkeypatch):
    """One process: the gradients are left as they are (the same tensors, no copy). Under torchrun a model with
    nothing to train sends nothing (no empty reduction, no error)."""
    monkeypatch.setattr(tdist, "all_reduce", lambda *a, **k: pytest.fail("a collective"))
    model = torch.nn.Linear(2, 2)
    model.weight.grad = g = torch.ones(2, 2)
    Dist.single().all_reduce_grads(model)
    assert model.weight.grad is g and model.bias.grad is None
    Dist(rank=0, world_size=2).all_reduce_grads(torch.nn.Linear(2, 2).requires_grad_(False))


def test_rank_0s_weights_frozen_ones_too_are_broadcast_from_rank_0(monkeypatch):
    """Rank 1 of two: every parameter, trainable or frozen (a LoRA backbone), is broadcast from rank 0."""
    sources = []

    def broadcast(t, src=None, **kw):
        sources.append(src)
        t.fill_(0.5)

    monkeypatch.setattr(tdist, "broadcast", broadcast)
    model = torch.nn.Linear(2, 2)
    model.bias.requires_grad_(False)
    Dist(rank=1, world_size=2).broadcast_weights(model)
    assert sources == [0, 0] and all(bool((p == 0.5).all()) for p in model.parameters())


def test_prepare_model_gives_the_optimizer_the_trainable_parameters_and_refuses_fsdp_with_frozen_ones():
    """Without FSDP (one process or plain data parallelism) the trainable parameters as they are; FSDP with a
    frozen weight (LoRA) is a config error, before any sharding."""
    model = torch.nn.Linear(2, 2)
    model.bias.requires_grad_(False)
    for d in (Dist.single(), Dist(rank=0, world_size=2)):
        assert d.prepare_model(model) == [model.weight]
    with pytest.raises(ConfigError, match="FSDP with frozen weights"):
        Dist(rank=0, world_size=2, fsdp=True).prepare_model(model)


def test_without_fsdp_the_state_to_save_is_the_models_own_and_nothing_is_prepared(tmp_path):
    """Plain data parallelism: the checkpoint saves the model and optimizer as they are (no gathered state), and the
    full state dict is the model's."""
    model = torch.nn.Linear(2, 2)
    d = Dist(rank=0, world_size=2)
    assert d.training_state(model, torch.optim.SGD(model.parameters(), lr=1.0), tmp_path) == TrainingState()
    state = d.full_state_dict(model)
    assert state.keys() == model.state_dict().keys() and all(torch.equal(state[k], v) for k, v in state.items())


def test_only_rank_0_writes_the_model(tmp_path):
    """Without FSDP every rank calls save_model; rank 0 alone writes (two writers of one directory raced)."""
    written = []
    lm = types.SimpleNamespace(save_pretrained=lambda path, **kw: written.append(path))
    Dist(rank=1, world_size=2).save_model(lm, tmp_path / "m")
    assert written == []
    Dist(rank=0, world_size=2).save_model(lm, tmp_path / "m")
    assert written == [tmp_path / "m"]


def test_close_waits_for_every_rank_then_leaves_the_group_and_drops_fsdps_references(monkeypatch):
    """Under torchrun: a barrier, then the group destroyed, then each sharded model's mesh emptied, once. In one
    process inside someone else's group (a Python caller's): the group is theirs, left alone."""
    calls = []
    monkeypatch.setattr(tdist, "is_initialized", lambda: True)
    monkeypatch.setattr(tdist, "barrier", lambda *a, **k: calls.append("barrier"))
    monkeypatch.setattr(tdist, "destroy_process_group", lambda *a, **k: calls.append("destroy"))
    Dist.single().close()
    assert calls == []
    mesh = types.SimpleNamespace(_pg_registry={"group": object()})
    d = Dist(rank=0, world_size=2, sharded=[(lambda: None, mesh)])
    d.close()
    assert calls == ["barrier", "destroy"] and mesh._pg_registry == {} and d.sharded == []


# ----------------------------------------------------------------------------------------------- from_env
def torchrun_env(monkeypatch, **env: str) -> list:
    """The variables torchrun sets (rank 1 of 2 unless overridden) and a stand-in process group; returns the
    backends it was started with."""
    started: list = []
    for name in ("DGRPO_FSDP", "WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    defaults = {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1", "MASTER_ADDR": "localhost", "MASTER_PORT": "1"}
    for name, value in {**defaults, **env}.items():
        if value is not None:
            monkeypatch.setenv(name, value)
    monkeypatch.setattr(tdist, "is_initialized", lambda: "gloo" in started or "nccl" in started)
    monkeypatch.setattr(tdist, "init_process_group", lambda backend: started.append(backend))
    monkeypatch.setattr(tdist, "get_rank", lambda: int(os.environ["RANK"]))
    monkeypatch.setattr(tdist, "get_world_size", lambda: int(os.environ["WORLD_SIZE"]))
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: started.append(f"cuda:{i}"))
    return started


def test_from_env_joins_torchruns_group_with_the_devices_backend(monkeypatch):
    """Rank 1 of 2 (LOCAL_RANK 1): gloo on the CPU, nccl and its own GPU on CUDA; fsdp sharded: FSDP2 with sharded
    checkpoints, full: gathered ones."""
    started = torchrun_env(monkeypatch)
    cpu = Dist.from_env(torch.device("cpu"), fsdp="sharded")
    assert (cpu.rank, cpu.world_size, cpu.local_rank, cpu.device) == (1, 2, 1, torch.device("cpu"))
    assert (cpu.fsdp, cpu.checkpoint, started) == (True, "sharded", ["gloo"])
    started.clear()
    gpu = Dist.from_env(torch.device("cuda"), fsdp="full")
    assert (gpu.device, gpu.fsdp, gpu.checkpoint) == (torch.device("cuda", 1), True, "full")
    assert started == ["cuda:1", "nccl"]


def test_from_env_reads_dgrpo_fsdp_unless_told_not_to(monkeypatch):
    """DGRPO_FSDP overrides the config's fsdp; dgrpo eval (fsdp_env=False) applies none whatever it says."""
    torchrun_env(monkeypatch, DGRPO_FSDP="full")
    assert Dist.from_env(torch.device("cpu"), fsdp="none").fsdp
    assert not Dist.from_env(torch.device("cpu"), fsdp="none", fsdp_env=False).fsdp


def test_from_env_refuses_a_stray_world_size_and_a_non_integer_one(monkeypatch):
    """WORLD_SIZE=2 left in the environment without torchrun's RANK: a config error naming what is missing, no
    process group; WORLD_SIZE=two: a config error naming the variable."""
    started = torchrun_env(monkeypatch, RANK=None)
    with pytest.raises(ConfigError, match=r"WORLD_SIZE=2 is set but RANK not: launch with torchrun"):
        Dist.from_env(torch.device("cpu"))
    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(ConfigError, match=r"environment variable WORLD_SIZE='two': expected an integer"):
        Dist.from_env(torch.device("cpu"))
    assert started == [] and env_int("DGRPO_TEST_UNSET_VARIABLE", 7) == 7


def test_from_env_in_one_process_starts_no_group_and_warns_of_fsdp_it_ignores(monkeypatch, recwarn):
    """WORLD_SIZE 1 (or unset): one process, no group; fsdp (the key, or True from Python) is said to be ignored."""
    started = torchrun_env(monkeypatch, WORLD_SIZE="1", RANK="0", LOCAL_RANK="0")
    assert Dist.from_env(torch.device("cpu")) == Dist.single()
    assert not [w for w in recwarn if "fsdp" in str(w.message)]
    for fsdp in ("full", "sharded", True):
        with pytest.warns(UserWarning, match=r"fsdp=(full|sharded) .* is ignored in a single process"):
            assert Dist.from_env(torch.device("cpu"), fsdp=fsdp) == Dist.single()
    assert started == []


def test_fsdp2_missing_names_what_this_torchs_fsdp_lacks(monkeypatch):
    from torch.distributed.fsdp import FSDPModule

    monkeypatch.delattr(FSDPModule, "set_gradient_divide_factor", raising=False)
    assert fsdp2_missing() == ["set_gradient_divide_factor"]


def test_available_cpus_is_the_affinity_mask_where_there_is_one(monkeypatch):
    """3 CPUs allowed of the machine's 8: 3; no affinity mask: the machine's count (1 when it is unknown)."""
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 3, 5}, raising=False)
    assert available_cpus() == 3
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    assert available_cpus() == 8
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert available_cpus() == 1


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_exit_with_parent_is_true_while_the_parent_lives():
    """In a child of this process (alive, not init): True (its exit status 0)."""
    pid = os.fork()
    if pid == 0:  # (the child: no pytest teardown, no exception past here)
        try:
            os._exit(0 if exit_with_parent() else 1)
        finally:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def _adopted_worker(parent: int) -> int:
    """In a worker whose ``parent`` has exited: wait to be adopted, then 0 when :func:`exit_with_parent` says False
    (the parent is gone), 1 when it says True."""
    while os.getppid() == parent:
        time.sleep(0.001)
    return 1 if exit_with_parent(parent) else 0


def _subreaper_family() -> int:
    """A subreaper (not init) whose child forks a worker and exits at once: the worker is adopted by the subreaper.
    The worker's verdict, or 3 when something else went wrong."""
    import ctypes

    ctypes.CDLL("libc.so.6").prctl(36, 1)  # PR_SET_CHILD_SUBREAPER
    parent = os.fork()
    if parent == 0:
        if os.fork() == 0:
            os._exit(_adopted_worker(os.getppid()))
        os._exit(0)
    os.waitpid(parent, 0)
    _, status = os.wait()  # the adopted worker
    return os.waitstatus_to_exitcode(status)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")
def test_exit_with_parent_sees_a_worker_adopted_by_a_subreaper_that_is_not_init():
    """A worker whose parent (the demo's process) died before the call is adopted by the nearest subreaper (systemd's
    user manager, a container's init), not always PID 1: False, so it exits instead of running on unsignalled."""
    pid = os.fork()
    if pid == 0:
        try:
            os._exit(_subreaper_family())
        finally:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


# ----------------------------------------------------------------------------------------------- ref_policy
def test_the_copied_reference_is_a_frozen_independent_eval_copy_sharing_the_compiled_pieces(tokenizer):
    """The reference is a copy (the policy's weights moving leave it) in eval mode with no trainable weight, run
    without gradient, sharing the policy's compiled layers and head statistics; its checkpoint state is its own
    model; renewal copies the policy's current weights."""
    from dgrpo.training.ref_policy import CopiedReference, make_reference

    lm = make_lm(tokenizer)
    lm.model.train()
    lm.compiled_layers, lm.head_stats = object(), object()
    ref = make_reference(lm, Dist.single())
    assert isinstance(ref, CopiedReference)
    assert ref.lm.compiled_layers is lm.compiled_layers and ref.lm.head_stats is lm.head_stats
    assert not any(m.training for m in ref.lm.model.modules())
    assert not any(p.requires_grad for p in ref.lm.model.parameters())
    assert ref.run(lambda m: (m is ref.lm, torch.is_grad_enabled())) == (True, False)
    assert ref.checkpoint_state is ref.lm.model
    first = next(lm.model.parameters())
    with torch.no_grad():
        first.add_(1.0)
    assert not torch.equal(first, next(ref.lm.model.parameters()))
    ref.renew()
    assert all(torch.equal(a, b) for a, b in zip(lm.model.parameters(), ref.lm.model.parameters()))


def test_the_adapter_reference_runs_without_gradient_and_is_renewed_from_the_policy_adapter(tokenizer, tmp_path):
    """Under LoRA the reference adapter's forwards build no graph (the policy's adapters require gradients); its
    checkpoint state is the reference adapter's weights, which stay when the policy adapter moves and become the
    policy adapter's at renewal."""
    from dgrpo.config import LoraConfig
    from dgrpo.model import lora
    from dgrpo.model.latent_lm import LatentLM
    from dgrpo.training.ref_policy import AdapterReference, make_reference

    make_lm(tokenizer).save_pretrained(tmp_path / "base")
    lm = LatentLM.from_pretrained(tmp_path / "base")
    lora.apply_lora(lm, LoraConfig(r=4, alpha=8.0))
    ref = make_reference(lm, Dist.single())
    assert isinstance(ref, AdapterReference)
    assert ref.run(lambda m: torch.is_grad_enabled()) is False
    start = lora.adapter_state(lm)
    with torch.no_grad():
        for name, p in lm.model.named_parameters():
            if p.requires_grad and "lora_B" in name:
                p.add_(0.5)
    moved = lora.adapter_state(lm)
    saved = ref.checkpoint_state.state_dict()
    assert saved.keys() == start.keys() and all(torch.equal(saved[k], start[k]) for k in start)
    assert any(not torch.equal(moved[k], start[k]) for k in start)
    ref.renew()
    saved = ref.checkpoint_state.state_dict()
    assert all(torch.equal(saved[k], moved[k]) for k in moved)


def test_the_kl_reference_starts_from_rank_0s_weights(tokenizer, task_records, monkeypatch):
    """The ranks' weights are rank 0's from the start (broadcast), and so is the KL reference: it copied each rank's
    own weights before the broadcast, so that a rank whose model was built otherwise (a Python caller's per-rank
    initialisation: measured on 2 processes, rank 1's reference 0.12 away from its policy) scored its KL against
    another model than the one trained. Here as rank 1 of 2 in one process, the broadcast bringing rank 0's
    weights (every entry 0.25)."""
    from dgrpo.training.grpo import GRPOTrainer

    from conftest import tiny_config

    def rank_0s(t, src=0, **kw):  # (what the broadcast from rank 0 leaves on this rank)
        assert src == 0
        return t.fill_(0.25)

    monkeypatch.setattr(tdist, "broadcast", rank_0s)
    lm = make_lm(tokenizer)
    tr = GRPOTrainer(lm, tiny_config(**{"grpo.beta0": "0.01"}), task_records[:4], dist=Dist(rank=1, world_size=2))
    assert all(bool((p == 0.25).all()) for p in tr.lm.model.parameters())  # (this rank holds rank 0's weights)
    assert tr.ref is not None
    assert all(bool((p == 0.25).all()) for p in tr.ref.lm.model.parameters()), "the reference kept this rank's own"


def test_gradients_of_mixed_dtypes_are_summed_in_the_widest(monkeypatch):
    """The flat all-reduce buffer took the first trainable parameter's dtype: an fp32 gradient after a bf16
    parameter was summed in bf16 (three significant digits) and given back rounded. Here as rank 0 of 2 in one
    process, the all-reduce doubling the buffer (two ranks of equal gradients)."""

    def doubled(t, op=None, **kw):  # (what a sum over two ranks of the same gradients leaves)
        return t.mul_(2)

    monkeypatch.setattr(tdist, "all_reduce", doubled)
    model = torch.nn.Module()
    model.low = torch.nn.Parameter(torch.zeros(3, dtype=torch.bfloat16))
    model.full = torch.nn.Parameter(torch.zeros(3))
    model.unused = torch.nn.Parameter(torch.zeros(2))
    model.low.grad = torch.ones(3, dtype=torch.bfloat16)
    model.full.grad = torch.tensor([1.0001, 2.0002, 3.0003])
    Dist(rank=0, world_size=2).all_reduce_grads(model)
    assert model.full.grad.dtype == torch.float32 and model.low.grad.dtype == torch.bfloat16
    torch.testing.assert_close(model.full.grad, torch.tensor([2.0002, 4.0004, 6.0006]), rtol=0, atol=1e-6)
    assert torch.equal(model.low.grad, torch.full((3,), 2.0, dtype=torch.bfloat16)) and model.unused.grad is None


def test_the_copied_reference_is_renewed_through_the_dists_whole_state_dict(tokenizer):
    """Renewal reads the policy through ``dist.full_state_dict`` (under FSDP2 a collective gathering the shards; the
    policy's own state_dict there holds this rank's shards only): the reference takes what the dist gathered."""
    from dgrpo.training.ref_policy import CopiedReference

    lm = make_lm(tokenizer)
    gathered = {k: torch.full_like(v, 0.5) for k, v in lm.model.state_dict().items()}
    asked = []
    dist = types.SimpleNamespace(full_state_dict=lambda model: asked.append(model) or gathered)
    ref = CopiedReference(lm, dist)
    ref.renew()
    assert asked == [lm.model] and all(bool((p == 0.5).all()) for p in ref.lm.model.parameters())


def test_a_parameter_no_rank_reached_before_others_leaves_their_gradients_in_place(monkeypatch):
    """An untrained parameter (no gradient on any rank) between trained ones still takes its room in the flat
    buffer: the parameters after it get their own sums, not their neighbours' (two ranks of equal gradients)."""
    monkeypatch.setattr(tdist, "all_reduce", lambda t, op=None, **kw: t.mul_(2))
    model = torch.nn.Module()
    model.first = torch.nn.Parameter(torch.zeros(2))
    model.unused = torch.nn.Parameter(torch.zeros(3))
    model.last = torch.nn.Parameter(torch.zeros(2))
    model.first.grad, model.last.grad = torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0])
    Dist(rank=0, world_size=2).all_reduce_grads(model)
    assert model.unused.grad is None
    assert model.first.grad.tolist() == [2.0, 4.0] and model.last.grad.tolist() == [6.0, 8.0]
