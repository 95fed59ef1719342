"""Checkpointing and resuming at the level of their functions (checkpoint.py's save/read/apply, pruning and order;
RunDir's resume checks and config history; the GRPO and SFT trainers' saved state): what a mutation test of them found
untested in the fast tier (each test saves and loads a tiny state or a folder that reads as one, no training step)."""

import errno
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from dgrpo.model.verified import CheckpointError
from dgrpo.training import checkpoint
from dgrpo.training.checkpoint import (
    list_checkpoints,
    read_checkpoint,
    required_files,
    resume_candidates,
    save_checkpoint,
    truncate_metrics,
)

from conftest import make_lm


def _draws() -> list[float]:
    """One draw of every generator a checkpoint restores (Python's and NumPy's Gaussians use their cached values)."""
    return [random.random(), random.gauss(0, 1), float(np.random.random()), float(np.random.standard_normal())] + [
        float(x) for x in torch.rand(3)
    ]


def _trained(lm, optimizer: torch.optim.Optimizer) -> None:
    """One optimizer step, so that the weights and the optimizer state differ from a fresh model's."""
    optimizer.zero_grad()
    sum(p.float().pow(2).sum() for p in lm.model.parameters()).backward()
    optimizer.step()


def test_a_saved_and_applied_checkpoint_puts_back_weights_optimizer_reference_rngs_and_step(tokenizer, tmp_path):
    """Save a trained tiny model (an AdamW step taken, a reference model beside it, every generator advanced with a
    Gaussian cached), draw from every generator, then read and apply the checkpoint into a fresh model, optimizer and
    reference: the same weights, optimizer state, reference and step, and the same draws again (saving consumes
    no random number: the run that was not stopped draws what the resumed one draws)."""
    lm, ref = make_lm(tokenizer, seed=1), torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(lm.model.parameters(), lr=1e-2)
    _trained(lm, opt)
    random.seed(5), np.random.seed(5), torch.manual_seed(5)
    random.gauss(0, 1), np.random.standard_normal()  # (each caches its second Gaussian: saved with the state)
    ckpt = save_checkpoint(tmp_path, 7, lm=lm, optimizer=opt, state={"trainer": {"x": 1}}, extra_models={"ref": ref})
    after_save = _draws()
    lm2, ref2 = make_lm(tokenizer, seed=2), torch.nn.Linear(3, 2)
    opt2 = torch.optim.AdamW(lm2.model.parameters(), lr=1e-2)
    state = read_checkpoint(ckpt, lm=lm2, optimizer=opt2, extra_models={"ref": ref2}).apply(lm2, opt2, {"ref": ref2})
    assert _draws() == after_save
    assert state["step"] == 7 and state["trainer"] == {"x": 1}
    assert json.loads((ckpt / "state.json").read_text())["step"] == 7
    w, w2 = lm.model.state_dict(), lm2.model.state_dict()
    assert all(torch.equal(w[k], w2[k]) for k in w)
    assert all(torch.equal(a, b) for a, b in zip(ref.state_dict().values(), ref2.state_dict().values()))
    s, s2 = opt.state_dict()["state"], opt2.state_dict()["state"]
    assert s.keys() == s2.keys() and all(torch.equal(s[i]["exp_avg_sq"], s2[i]["exp_avg_sq"]) for i in s)


def _save_steps(lm, out: Path, steps, keep_last: int) -> None:
    opt = torch.optim.SGD(lm.model.parameters(), lr=0.1)
    for step in steps:
        save_checkpoint(out, step, lm=lm, optimizer=opt, state={}, keep_last=keep_last)


@pytest.mark.parametrize(("keep_last", "kept"), [(2, [3, 4]), (1, [4]), (0, [1, 2, 3, 4])])
def test_pruning_keeps_the_newest_keep_last_checkpoints(tokenizer, tmp_path, keep_last, kept):
    """keep_last=N keeps the N newest checkpoints (0: all of them)."""
    _save_steps(make_lm(tokenizer), tmp_path, [1, 2, 3, 4], keep_last)
    assert [p.name for p in list_checkpoints(tmp_path)] == [f"step-{s:08d}" for s in kept]


def test_checkpoints_are_listed_by_step_and_resumed_newest_first_ignoring_other_folders(tmp_path):
    """list_checkpoints: ``step-*`` folders oldest first (step 10 after step 9), nothing else (a half-written
    ``.tmp-``, a ``damaged-`` one moved aside, a file); resume_candidates: newest first."""
    root = tmp_path / "checkpoints"
    for name in ("step-00000010", "step-00000009", ".tmp-step-00000011-7", "damaged-step-00000012", "step-00000002"):
        (root / name).mkdir(parents=True)
    (root / "step-00000013").write_text("")
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-00000002", "step-00000009", "step-00000010"]
    assert [p.name for p in resume_candidates(tmp_path)] == ["step-00000010", "step-00000009", "step-00000002"]
    assert list_checkpoints(tmp_path / "none") == []


def test_a_checkpoints_manifest_must_list_its_rng_and_extra_models(tokenizer):
    """The files a resumable checkpoint's manifest must list include rng.pt and every extra model's weights."""
    need = required_files(make_lm(tokenizer), {"ref": None})
    assert {"optimizer.pt", "rng.pt", "state.json", "ref.safetensors"} <= set(need)


def test_cutting_the_metrics_keeps_exactly_the_rows_before_the_checkpoint(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(f'{{"step": {i}}}\n' for i in range(1, 6)))
    truncate_metrics(path, 3)
    assert path.read_text() == '{"step": 1}\n{"step": 2}\n{"step": 3}\n'


def test_cutting_the_metrics_on_a_full_disk_leaves_them_whole(tmp_path, monkeypatch):
    """A write that stops half way (a full disk) leaves metrics.jsonl as it was: the cut is written beside it and
    renamed over it."""
    path = tmp_path / "metrics.jsonl"
    rows = "".join(f'{{"step": {i}}}\n' for i in range(1, 6))
    path.write_text(rows)
    real = Path.write_text

    def half_then_full(self, data, *a, **k):
        real(self, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", half_then_full)
    with pytest.raises(CheckpointError, match="no space left"):
        truncate_metrics(path, 3)
    monkeypatch.undo()
    assert path.read_text() == rows and sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]


@pytest.mark.filterwarnings("ignore:the model's latent markers")
def test_a_grpo_trainers_state_taken_up_again_draws_the_same_prompts_with_the_same_baseline(tokenizer, task_records):
    """GRPOTrainer.state() through JSON (as state.json keeps it) into a fresh trainer: the same step, EMA baseline
    and non-finite counts, and the same prompts next (the rest of the epoch's order, then the shuffle of the next
    epoch's: the data order goes on, it does not start again)."""
    from dgrpo.training.grpo import GRPOTrainer

    from conftest import tiny_config

    cfg = tiny_config(**{"grpo.prompts_per_step": 3, "grpo.beta0": 0})
    train = task_records[:8]

    def trainer() -> GRPOTrainer:
        return GRPOTrainer(make_lm(tokenizer), cfg, train, reward_fn=lambda c, r: [1.0] * len(c))

    a, b = trainer(), trainer()
    for _ in range(2):  # 6 of the epoch's 8 prompts drawn
        a.next_prompts()
    a.step_idx, a.ema_baseline, a.guard.skips, a.guard.streak = 2, 0.3125, 1, 1
    b.load_state(json.loads(json.dumps(a.state())))
    assert (b.step_idx, b.ema_baseline, b.guard.skips, b.guard.streak) == (2, 0.3125, 1, 1)
    ids = [[[r.question for r in t.next_prompts()] for _ in range(4)] for t in (a, b)]
    assert ids[0] == ids[1]


def test_each_cuda_devices_rng_state_goes_back_to_its_own_device(monkeypatch):
    """A machine with more than 10 devices: ``torch_cuda_10`` is device 10's state, not the third (the states were put
    back in the order of their names, ``torch_cuda_10`` before ``torch_cuda_2``)."""
    states = [torch.tensor([i], dtype=torch.uint8) for i in range(12)]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 12)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: states)
    put: list[list[int]] = []
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", lambda s: put.append([int(t) for t in s]))
    js, tensors = checkpoint.capture_rng()
    checkpoint.restore_rng(js, tensors)
    assert put == [list(range(12))]


def test_a_resume_that_sees_fewer_cuda_devices_restores_theirs_and_warns(monkeypatch):
    """A checkpoint written with 4 visible GPUs, resumed where 2 are visible: devices 0 and 1 get their states back,
    and a warning names the two left out (torch's set_rng_state_all raised on device 2, after the weights loaded)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(
        torch.cuda, "get_rng_state_all", lambda: [torch.tensor([i], dtype=torch.uint8) for i in range(4)]
    )
    js, tensors = checkpoint.capture_rng()
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    put: list[list[int]] = []
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", lambda s: put.append([int(t) for t in s]))
    with pytest.warns(UserWarning, match=r"of 4 devices and this process sees 2: those of devices 2 to 3 are not"):
        checkpoint.restore_rng(js, tensors)
    assert put == [[0, 1]]


def _reward_one(completions, records) -> list[float]:
    return [1.0] * len(completions)


@pytest.mark.filterwarnings("ignore:the model's latent markers")
def test_a_grpo_checkpoint_resumes_the_loop_the_reference_and_the_rows_before_it(tokenizer, task_records, tmp_path):
    """train_grpo's own save and resume (``_save_resumable``, ``_resume``) in a run directory: the loop's record
    (skipped steps, last validation), the KL reference (renewed: not the initial weights a fresh trainer copies),
    and the metrics and rollout rows written before the checkpoint (a row written after it is dropped)."""
    from dgrpo.training import grpo
    from dgrpo.training.distributed import Dist
    from dgrpo.training.run import RunDir

    from conftest import tiny_config

    cfg = tiny_config(**{"grpo.prompts_per_step": 3, "grpo.beta0": 0.1, "data.test": "[]"})
    out = tmp_path / "out"

    def trainer() -> grpo.GRPOTrainer:
        return grpo.GRPOTrainer(make_lm(tokenizer), cfg, task_records[:8], reward_fn=_reward_one)

    a = trainer()
    with torch.no_grad():
        for p in a.ref.checkpoint_state.parameters():
            p.add_(0.5)
    with RunDir(out, cfg, Dist(), "grpo", log=lambda m: None) as run:
        run.start(None)
        run.metrics.write({"step": 1})
        run.write_rollouts([{"step": 1}])  # (a rollout row names its step from 0: the second step's)
        a.step_idx = 2
        grpo._save_resumable(run, a, grpo.LoopState(skipped=2, skip_streak=1, last_eval=0.25))
        run.metrics.write({"step": 3})
        run.write_rollouts([{"step": 2}])
    b = trainer()
    with RunDir(out, cfg, Dist(), "grpo", log=lambda m: None) as run:
        loop = grpo._resume(run, b)
        assert (loop.skipped, loop.skip_streak, loop.last_eval, b.step_idx) == (2, 1, 0.25, 2)
        assert [r["step"] for r in run.metrics.rows()] == [1]
        assert run.rollouts_path.read_text() == '{"step": 1}\n'
    wa, wb = a.ref.checkpoint_state.state_dict(), b.ref.checkpoint_state.state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def _saved_adamw(tokenizer, out: Path):
    """A tiny model, its AdamW after one step, and the checkpoint of both at step 1."""
    lm = make_lm(tokenizer)
    opt = torch.optim.AdamW(lm.model.parameters(), lr=1e-2)
    _trained(lm, opt)
    return lm, opt, save_checkpoint(out, 1, lm=lm, optimizer=opt, state={})


def test_a_checkpoint_changed_after_it_was_written_is_refused_by_its_manifest(tokenizer, tmp_path):
    """One weight's bytes changed (the file still loads): the manifest's checksum refuses it, naming the file."""
    lm, opt, ckpt = _saved_adamw(tokenizer, tmp_path)
    weights = next((ckpt / "model").glob("*.safetensors"))
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x40
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=f"checksum mismatch in model/{weights.name}"):
        read_checkpoint(ckpt, lm=lm, optimizer=opt)


def test_an_optimizer_state_that_does_not_fit_the_optimizer_is_refused(tokenizer, tmp_path):
    """The optimizer built on resume takes the parameters in another order (a state tensor of another shape), or in
    other groups: each refused in one line before anything is loaded."""
    lm, _, ckpt = _saved_adamw(tokenizer, tmp_path)
    params = list(lm.model.parameters())
    reordered = torch.optim.AdamW(params[::-1], lr=1e-2)
    with pytest.raises(CheckpointError, match=r"optimizer.pt: the exp_avg(_sq)? of a parameter has shape"):
        read_checkpoint(ckpt, lm=lm, optimizer=reordered)
    split = torch.optim.AdamW([{"params": params[:1]}, {"params": params[1:]}], lr=1e-2)
    with pytest.raises(CheckpointError, match="its parameter groups do not match this model's parameters"):
        read_checkpoint(ckpt, lm=lm, optimizer=split)


def test_optimizer_state_for_a_parameter_the_optimizer_does_not_have_is_refused():
    """A state entry numbered past the optimizer's parameters (hand-made: torch numbers them in its groups)."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    saved = {"param_groups": [{"params": [0]}], "state": {1: {"momentum_buffer": torch.zeros(2)}}}
    with pytest.raises(CheckpointError, match="state for a parameter the optimizer does not have"):
        checkpoint.check_optimizer_state(opt, saved)


def _run_dir(out: Path, cfg, **kw):
    from dgrpo.training.distributed import Dist
    from dgrpo.training.run import RunDir

    return RunDir(out, cfg, Dist(), "grpo", log=lambda m: None, **kw)


def _resumed_at(out: Path, cfg, step: int, **kw) -> Path:
    """A RunDir resuming the newest checkpoint (``step``'s, a folder that reads as one) under ``cfg``; returns the
    checkpoint it resumed."""
    from types import SimpleNamespace

    ckpt = out / "checkpoints" / f"step-{step:08d}"
    ckpt.mkdir(parents=True, exist_ok=True)
    (ckpt / "state.json").write_text(json.dumps({"trainer": {}}))
    with _run_dir(out, cfg, **kw) as run:
        run.resume(lambda c: SimpleNamespace(base=None))
        run.start({"step": step, "metrics_lines": 0})
        assert run.checkpoint == ckpt
    return ckpt


def test_each_config_a_resumed_run_changed_to_is_kept_with_the_step_it_started_at(tmp_path):
    """A run started under lr 1e-4, resumed at step 2 under lr 1e-3, then at step 4 under lr 1e-2 (each allowed):
    config.0.json (the first config, step 0), config.1.json (step 2), config.2.json (step 4); config.json the last."""
    from dgrpo.config import to_dict

    from conftest import tiny_config

    out = tmp_path / "run"
    lrs = (1e-4, 1e-3, 1e-2)
    out.mkdir()
    (out / "config.json").write_text(json.dumps(to_dict(tiny_config(**{"grpo.lr": lrs[0]}))))
    for step, lr in ((2, lrs[1]), (4, lrs[2])):
        _resumed_at(out, tiny_config(**{"grpo.lr": lr}), step, allow_config_change=True)
    history = [json.loads((out / f"config.{n}.json").read_text()) for n in range(3)]
    assert [(h["started_at_step"], h["config"]["grpo"]["lr"]) for h in history] == list(zip((0, 2, 4), lrs))
    assert json.loads((out / "config.json").read_text())["grpo"]["lr"] == lrs[2]
    assert not (out / "config.3.json").exists()


def test_a_newest_checkpoint_that_does_not_load_is_moved_aside_and_the_previous_one_resumed(tmp_path):
    """resume auto: step 4 fails its checks, step 2 is resumed (the run's checkpoint is step 2's) and step 4 is moved
    aside as damaged-step-4; none loading is an error, not a fresh start; a named checkpoint (--resume PATH) that
    does not load is an error naming it (no fall back)."""
    from types import SimpleNamespace

    from conftest import tiny_config

    out, cfg = tmp_path / "run", tiny_config()
    for step in (2, 4):
        (out / "checkpoints" / f"step-{step:08d}").mkdir(parents=True)
        (out / "checkpoints" / f"step-{step:08d}" / "state.json").write_text(json.dumps({"trainer": {}}))
    ckpt2, ckpt4 = list_checkpoints(out)

    def load_but(bad):
        def load(c):
            if c.name in bad:
                raise CheckpointError("checksum mismatch in rng.pt")
            return SimpleNamespace(path=c, base=None)

        return load

    with _run_dir(out, cfg) as run:
        assert run.resume(load_but({ckpt4.name})).path == ckpt2 and run.checkpoint == ckpt2
    assert list_checkpoints(out) == [ckpt2] and (out / "checkpoints" / f"damaged-{ckpt4.name}").is_dir()
    with _run_dir(out, cfg) as run, pytest.raises(CheckpointError, match=f"no checkpoint in {out} can be resumed"):
        run.resume(load_but({ckpt2.name}))
    with _run_dir(out, cfg, resume=str(ckpt2)) as run:
        with pytest.raises(CheckpointError, match=f"^resume='{ckpt2}': checksum mismatch in rng.pt$"):
            run.resume(load_but({ckpt2.name}))


def test_an_sft_checkpoint_resumes_where_it_stood_its_schedule_from_the_config(tokenizer, task_records, tmp_path):
    """SFTRun's save and resume: the epoch and batch to run next, the step counts, the optimizer, the non-finite
    skips and the training time go on; the schedule's length is this config's (a lengthened run's), not the saved."""
    import time

    from dgrpo.training.distributed import Dist
    from dgrpo.training.run import RunDir
    from dgrpo.training.sft import SFTRun

    from conftest import tiny_config

    cfg, out, train = tiny_config(**{"sft.num_epochs": 2}), tmp_path / "run", task_records[:16]
    with RunDir(out, cfg, Dist(), "sft", log=lambda m: None) as run:
        a = SFTRun(make_lm(tokenizer), cfg, Dist(), run, train)
        run.start(None)
        a.enter_stage(1)
        a.prog.global_step, a.prog.step_in_sched, a.prog.sched_total = 3, 3, 999
        a.guard.skips, a.t0 = 2, time.time() - 100.0
        a.save(1, 2)
    with RunDir(out, cfg, Dist(), "sft", log=lambda m: None) as run:
        b = SFTRun(make_lm(tokenizer), cfg, Dist(), run, train)
        now = time.time()
    assert (b.prog.epoch, b.prog.batch, b.prog.global_step, b.prog.step_in_sched, b.prog.stage_prev) == (1, 2, 3, 3, 1)
    assert b.prog.sched_total == b.plan.schedule_length(1) != 999
    assert b.opt is not None and b.guard.skips == 2 and 99.0 < now - b.t0 < 200.0


def test_a_resume_on_other_training_data_is_refused_unless_allowed(tmp_path):
    """RunDir.check_same_data: the checkpoint's data fingerprint against the data given now."""
    from dgrpo.config import ConfigError

    from conftest import tiny_config

    ckpt = _resumed_at(tmp_path / "run", tiny_config(), 2)
    with _run_dir(tmp_path / "run", tiny_config()) as run:
        run.checkpoint = ckpt
        run.check_same_data(None, "8:aa")  # (a checkpoint from before dgrpo recorded its data: not checked)
        run.check_same_data("8:aa", "8:aa")
        with pytest.raises(ConfigError, match=r"trained on other training data than given now \(8 records as now"):
            run.check_same_data("8:aa", "8:bb")
    with _run_dir(tmp_path / "run", tiny_config(), allow_config_change=True) as run:
        run.checkpoint = ckpt
        run.check_same_data("8:aa", "9:bb")


def test_a_best_written_after_the_resumed_checkpoint_is_removed(tmp_path):
    """RunDir.drop_stale_best: best/ whose manifest is not the one the checkpoint recorded goes (True); the same one,
    or a checkpoint that recorded none, keeps it (False)."""
    from conftest import tiny_config

    out = tmp_path / "run"
    ckpt = _resumed_at(out, tiny_config(), 2)
    (out / "best").mkdir()
    (out / "best" / "manifest.json").write_text("{}")
    with _run_dir(out, tiny_config()) as run:
        run.checkpoint = ckpt
        recorded = run.best_record()
        assert recorded is not None
        assert not run.drop_stale_best({"best": recorded}) and not run.drop_stale_best({})
        assert (out / "best").is_dir()
        assert run.drop_stale_best({"best": "0" * 64}) and not (out / "best").exists()


def test_a_stop_while_pruning_leaves_no_half_deleted_checkpoint_under_its_steps_name(tokenizer, tmp_path, monkeypatch):
    """keep_last prunes step 1 when step 3 is written; a stop in the middle of its deletion (here after its
    manifest went) left a ``step-00000001`` that still read as a checkpoint of the run (listed, resumed from, moved
    aside as damaged). It is renamed to a leftover name first, which a run's start removes."""
    lm = make_lm(tokenizer)
    _save_steps(lm, tmp_path, [1, 2], keep_last=2)
    real = checkpoint.shutil.rmtree

    class Stopped(BaseException):
        pass

    def stopped_half_way(path, *a, **k):
        if Path(path).is_dir() and "step-00000001" in Path(path).name:
            (Path(path) / "manifest.json").unlink()
            raise Stopped
        real(path, *a, **k)

    monkeypatch.setattr(checkpoint.shutil, "rmtree", stopped_half_way)
    with pytest.raises(Stopped):
        _save_steps(lm, tmp_path, [3], keep_last=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-00000002", "step-00000003"]
    assert [p.name.startswith(".tmp-step-00000001-") for p in (tmp_path / "checkpoints").iterdir()].count(True) == 1


def test_a_killed_runs_temporary_checkpoint_folders_are_removed_when_the_run_starts_again(tmp_path):
    """A checkpoint's temporary folder (``.tmp-step-N-PID``) and the shards' staging folder of a sharded run
    (``.tmp-step-N-shards``) left by a kill are removed; the checkpoints stay."""
    from conftest import tiny_config

    out = tmp_path / "run"
    ckpt = _resumed_at(out, tiny_config(), 2)
    for name in (".tmp-step-00000004-77", ".tmp-step-00000004-shards"):
        (out / "checkpoints" / name / "dcp").mkdir(parents=True)
    _run_dir(out, tiny_config()).close()
    assert list((out / "checkpoints").iterdir()) == [ckpt]


def test_a_finished_run_without_checkpoints_is_not_trained_again_unasked(tmp_path):
    """final/ and no checkpoint (deleted to save space): resume auto refuses; --resume never starts over."""
    from dgrpo.config import ConfigError

    from conftest import tiny_config

    out = tmp_path / "run"
    (out / "final").mkdir(parents=True)
    (out / "final" / "manifest.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"holds a finished run \(final/\) and no checkpoint to resume"):
        _run_dir(out, tiny_config())
    _run_dir(out, tiny_config(), resume="never").close()  # (asked: its results removed)
    assert not (out / "final").exists()


def test_resume_true_and_false_are_auto_and_never():
    """The Python API's ``resume=True`` / ``False``: the command line's ``--resume auto`` / ``never``."""
    from dgrpo.training.resume_check import ResumeCheck

    assert [ResumeCheck(Path("o"), {}, "grpo", r).resume_mode for r in (True, False)] == ["auto", "never"]


def test_a_failed_checkpoint_write_names_the_newest_checkpoint_the_run_resumes_from(tokenizer, tmp_path, monkeypatch):
    """Steps 1 and 2 kept, step 3's write fails (a full disk): the line names step 2, not step 1."""
    lm = make_lm(tokenizer)
    _save_steps(lm, tmp_path, [1, 2], keep_last=3)
    monkeypatch.setattr(checkpoint.torch, "save", lambda *a, **k: (_ for _ in ()).throw(OSError(errno.ENOSPC, "full")))
    with pytest.raises(CheckpointError, match=f"the run resumes from {tmp_path / 'checkpoints' / 'step-00000002'}$"):
        _save_steps(lm, tmp_path, [3], keep_last=3)


def test_an_out_whose_checkpoints_folder_holds_other_things_is_refused_before_anything_is_written(tmp_path):
    """OUT/checkpoints holding a file that is no checkpoint (a run replaces its folders there, --resume never deletes
    them): refused, nothing written (no lock file, no config.json)."""
    from dgrpo.config import ConfigError

    from conftest import tiny_config

    out = tmp_path / "run"
    (out / "checkpoints").mkdir(parents=True)
    (out / "checkpoints" / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match=r"checkpoints holds notes.txt, not dgrpo checkpoints: name a new --out"):
        _run_dir(out, tiny_config())
    assert sorted(p.name for p in out.iterdir()) == ["checkpoints"]
    for name in ("a.txt", "b.txt", "c.txt"):  # (more than three: the first three named, and how many more)
        (out / "checkpoints" / name).write_text("mine")
    with pytest.raises(ConfigError, match=r"checkpoints holds a.txt, b.txt, c.txt and 1 more, not dgrpo checkpoints"):
        _run_dir(out, tiny_config())


def test_resume_naming_a_missing_checkpoint_is_refused_before_anything_is_read(tmp_path):
    """--resume PATH that does not exist: refused at once in the run's words (it went on to read the data and the
    model, then failed to load PATH as a damaged checkpoint)."""
    from dgrpo.config import ConfigError

    from conftest import tiny_config

    missing = tmp_path / "other" / "checkpoints" / "step-00000004"
    with pytest.raises(ConfigError, match=f"^resume='{missing}': no such checkpoint directory$"):
        _run_dir(tmp_path / "run", tiny_config(), resume=str(missing))
