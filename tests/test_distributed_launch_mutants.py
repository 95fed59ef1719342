"""Gaps found by a second mutation pass over ``dgrpo.training.distributed``: how a process group is joined
(``Dist.from_env`` inside a group a Python caller started, ``fsdp`` given from Python as a bool, the rank and device
taken from the right variables), what a Python caller without ``dist=`` is told (``Dist.given_or_single``), and what
``release_fsdp_groups`` lets go of. All in one process, torch.distributed's calls stood in for (no group starts)."""

from __future__ import annotations

import inspect
import os
import types
import warnings

import pytest
import torch
import torch.distributed as tdist
from torch import nn

from dgrpo.config import ConfigError
from dgrpo.training import distributed
from dgrpo.training.distributed import Dist, env_int, release_fsdp_groups

VARIABLES = ("DGRPO_FSDP", "WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def launched(monkeypatch, initialized: bool = False, **env: str) -> list:
    """The environment ``env`` (nothing else of torchrun's) and a stand-in process group, already started when
    ``initialized`` (rank 3 of 4 by torch.distributed's count); returns what was started."""
    started: list = []
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(tdist, "is_initialized", lambda: initialized or "gloo" in started or "nccl" in started)
    monkeypatch.setattr(tdist, "init_process_group", lambda backend: started.append(backend))
    monkeypatch.setattr(tdist, "get_rank", lambda: int(os.environ.get("RANK", "3")))
    monkeypatch.setattr(tdist, "get_world_size", lambda: int(os.environ["WORLD_SIZE"]))
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: started.append(f"cuda:{i}"))
    return started


TORCHRUN = {"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "1", "MASTER_ADDR": "localhost", "MASTER_PORT": "1"}


def test_from_env_takes_the_rank_from_the_group_and_the_device_from_local_rank(monkeypatch):
    """Rank 3 of 4, the second process on its node (LOCAL_RANK 1): rank 3, GPU 1; no device given: CUDA where
    torch has it (nccl), else the CPU (gloo); LOCAL_RANK unset (a one-node launcher that sets RANK only): GPU 0."""
    started = launched(monkeypatch, **TORCHRUN)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    d = Dist.from_env()
    assert (d.rank, d.local_rank, d.device, started) == (3, 1, torch.device("cuda", 1), ["cuda:1", "nccl"])
    started = launched(monkeypatch, **TORCHRUN)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert (Dist.from_env().device, started) == (torch.device("cpu"), ["gloo"])
    started = launched(monkeypatch, **{**TORCHRUN, "RANK": "0"})
    monkeypatch.delenv("LOCAL_RANK")
    d = Dist.from_env(torch.device("cuda"))
    assert (d.rank, d.local_rank, d.device, started) == (0, 0, torch.device("cuda", 0), ["cuda:0", "nccl"])


def test_from_env_joins_a_group_a_python_caller_started_without_starting_another(monkeypatch):
    """A Python caller that started its own group (WORLD_SIZE set, no RANK / MASTER_* variables: init_method given
    in code) is joined as it is: no launch error, no second init_process_group."""
    started = launched(monkeypatch, initialized=True, WORLD_SIZE="4")
    d = Dist.from_env(torch.device("cpu"))
    assert (d.rank, d.world_size, started) == (3, 4, [])


def test_from_env_names_every_torchrun_variable_missing(monkeypatch):
    """A stray WORLD_SIZE with RANK and MASTER_ADDR set but not MASTER_PORT: the error names MASTER_PORT."""
    started = launched(monkeypatch, **{k: v for k, v in TORCHRUN.items() if k != "MASTER_PORT"})
    with pytest.raises(ConfigError, match=r"WORLD_SIZE=4 is set but MASTER_PORT not"):
        Dist.from_env(torch.device("cpu"))
    assert started == []


def test_fsdp_from_python_as_a_bool_is_full_fsdp_with_gathered_checkpoints(monkeypatch):
    """``fsdp=True`` (a Python caller's) is ``fsdp: full``: sharded training, whole (gathered) checkpoints; False
    and None are none. DGRPO_FSDP=0 turns a config's full off, unless told to ignore the variable."""
    launched(monkeypatch, **TORCHRUN)
    d = Dist.from_env(torch.device("cpu"), fsdp=True)
    assert (d.fsdp, d.checkpoint) == (True, "full")
    for off in (False, None):
        assert not Dist.from_env(torch.device("cpu"), fsdp=off).fsdp
    monkeypatch.setenv("DGRPO_FSDP", "0")
    assert not Dist.from_env(torch.device("cpu"), fsdp="full").fsdp
    assert Dist.from_env(torch.device("cpu"), fsdp="sharded", fsdp_env=False).checkpoint == "sharded"


def test_fsdp_on_a_torch_without_the_fsdp2_api_is_refused_before_any_group(monkeypatch):
    """fsdp=sharded where FSDPModule lacks what the sharded update sets: a config error naming it, no group."""
    started = launched(monkeypatch, **TORCHRUN)
    monkeypatch.setattr(distributed, "fsdp2_missing", lambda: ["set_reduce_scatter_unused_params"])
    with pytest.raises(ConfigError, match=r"no FSDPModule\.set_reduce_scatter_unused_params"):
        Dist.from_env(torch.device("cpu"), fsdp="sharded")
    assert started == []
    assert Dist.from_env(torch.device("cpu")).world_size == 4  # (no fsdp: no check)


def test_dgrpo_fsdp_in_one_process_is_said_to_be_ignored(monkeypatch):
    """DGRPO_FSDP=1 in one process (the config's fsdp none): the warning names full; a blank integer variable is
    its default."""
    launched(monkeypatch, DGRPO_FSDP="1")
    with pytest.warns(UserWarning, match=r"fsdp=full \(DGRPO_FSDP or the config key\) is ignored"):
        assert Dist.from_env(torch.device("cpu")) == Dist.single()
    monkeypatch.setenv("WORLD_SIZE", "  ")
    assert env_int("WORLD_SIZE", 1) == 1


def _trainer(dist=None, fsdp="none"):
    """Stands for GRPOTrainer / train_sft: calls given_or_single for its caller."""
    return Dist.given_or_single(dist, fsdp, "trainer")


def _warned(call) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    return [w for w in caught if "no dist=" in str(w.message)]


def test_a_python_caller_without_dist_is_warned_at_its_own_line(monkeypatch):
    """Given a dist: it, as it is, whatever the environment. Without: one process; under torchrun (WORLD_SIZE 2)
    the warning says each rank trains alone (that alone), else fsdp full / sharded is said not applied ('' and none
    are nothing to say); the warning points at the trainer's caller's line."""
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    given = Dist(rank=1, world_size=2)
    assert _trainer(given, "full") is given
    assert not _warned(lambda: (_trainer(fsdp=""), _trainer(fsdp="none")))
    [said] = _warned(lambda: _trainer(fsdp="sharded"))
    line = inspect.currentframe().f_lineno - 1
    assert "fsdp=sharded is not applied: trainer was given no dist= (one process)" in str(said.message)
    assert (said.filename, said.lineno) == (__file__, line)
    monkeypatch.setenv("WORLD_SIZE", "2")
    [said] = _warned(lambda: _trainer(fsdp="full"))  # (one warning: the torchrun one says the most)
    assert "trainer was given no dist= under torchrun (WORLD_SIZE=2): each rank trains alone" in str(said.message)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert _trainer() == Dist.single()


def test_a_sharding_dist_in_one_process_gives_the_optimizer_the_parameters_unsharded():
    """``Dist(fsdp=True)`` with one process (a Python caller's) shards nothing: the trainable parameters as they
    are, and nothing to gather."""
    model = nn.Linear(2, 2)
    d = Dist(fsdp=True)
    assert d.prepare_model(model) == list(model.parameters())


def test_collectives_count_their_time(monkeypatch):
    """Gathering objects and broadcasting weights count into comm_s (1 s each here), as the reductions do."""
    ticks = iter(range(100))
    monkeypatch.setattr(distributed.time, "perf_counter", lambda: float(next(ticks)))
    monkeypatch.setattr(tdist, "all_gather_object", lambda out, obj: out.__setitem__(slice(None), [obj, obj]))
    monkeypatch.setattr(tdist, "broadcast", lambda t, src=0: t)
    d = Dist(rank=0, world_size=2)
    assert d.all_gather_objects("x") == ["x", "x"]
    d.broadcast_weights(nn.Linear(2, 2))
    assert d.comm_s == 2.0


class FakeFSDPModule(nn.Module):
    """A module holding FSDP2's references to its process groups where recent torch keeps them."""

    def __init__(self):
        super().__init__()

        def info():
            return types.SimpleNamespace(
                shard_process_group=object(), replicate_process_group=object(), reduce_scatter_process_group=object()
            )

        param = types.SimpleNamespace(mesh_info=info(), post_forward_mesh_info=info())
        self.group = types.SimpleNamespace(mesh_info=info(), post_forward_mesh_info=info(), fsdp_params=[param])
        self.infos = [self.group.mesh_info, self.group.post_forward_mesh_info, param.mesh_info]
        self.infos.append(param.post_forward_mesh_info)

    def _get_fsdp_state(self):
        return types.SimpleNamespace(_fsdp_param_group=self.group)


def test_releasing_fsdp_groups_drops_every_reference_to_them(monkeypatch):
    """Every sharded module under the root (not the first only, past plain modules), in its parameter group's and
    each parameter's mesh infos (the post-forward ones too), lets go of its shard, replicate and reduce-scatter
    groups; the mesh's group registry is emptied. A module of an older torch without these internals is skipped."""
    import torch.distributed.fsdp

    monkeypatch.setattr(torch.distributed.fsdp, "FSDPModule", FakeFSDPModule)
    model = nn.Sequential(nn.Linear(1, 1), FakeFSDPModule(), nn.Sequential(nn.ReLU(), FakeFSDPModule()))
    old = FakeFSDPModule()
    old.group = None
    model.append(old)
    mesh = types.SimpleNamespace(_pg_registry={"group": object()})
    release_fsdp_groups(model, mesh)
    infos = [info for m in model.modules() if isinstance(m, FakeFSDPModule) and m is not old for info in m.infos]
    assert len(infos) == 8 and mesh._pg_registry == {}
    assert all(vars(info) == dict.fromkeys(vars(info)) for info in infos)


def test_closing_a_group_already_left_waits_for_nobody(monkeypatch):
    """close() after the group is gone (a second close on an error path, or the caller destroyed it): no barrier on
    a destroyed group (an error there hid the run's own)."""
    calls = []
    monkeypatch.setattr(tdist, "is_initialized", lambda: False)
    monkeypatch.setattr(tdist, "barrier", lambda *a, **k: calls.append("barrier"))
    monkeypatch.setattr(tdist, "destroy_process_group", lambda *a, **k: calls.append("destroy"))
    Dist(rank=0, world_size=2).close()
    assert calls == []
