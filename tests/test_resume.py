"""Reliability: kill -9 and resume gives the uninterrupted run bit for bit; atomic, verified checkpoints; guards."""

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import warnings
import zlib
from unittest import mock

import pytest
import torch
from safetensors.torch import load_file

from conftest import child_pids, process_alive, tiny_args, tiny_config

TIMING = {"time_rollout_s", "time_update_s", "time_comm_s"}
SETS = {
    "task.n_valid": 32,
    "task.n_test": 32,
    "grpo.steps": 6,
    "grpo.prompts_per_step": 4,
    "grpo.eval_every": 3,
    "grpo.lr": 1e-3,
    "grpo.save_every": 1,
    "grpo.keep_last": 3,
    "grpo.filter": "false",
    "perturbation.p": 0.3,
    "grpo.temperature": 1.0,  # sampled answer tokens too: a resumed run draws them as the uninterrupted one
    "data.test": "[]",
    "grpo.max_new_tokens": 24,
    "threads": 1,
}


def cmd(ckpt, out):
    return [sys.executable, "-m", "dgrpo", "grpo", "--init", str(ckpt), "--out", str(out), *tiny_args(**SETS)]


def run(ckpt, out, env=None):
    r = subprocess.run(cmd(ckpt, out), capture_output=True, text=True, timeout=600, env={**os.environ, **(env or {})})
    return r


def rows(out):
    return [
        {k: v for k, v in json.loads(x).items() if k not in TIMING}
        for x in (out / "metrics.jsonl").read_text().splitlines()
    ]


def weights(out):
    return load_file(str(out / "final" / "model.safetensors"))


@pytest.fixture(scope="module")
def reference_run(sft_checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("ref")
    r = run(sft_checkpoint, out)
    assert r.returncode == 0, r.stderr[-2000:]
    return out


def assert_same_run(a, b):
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert rows(a) == rows(b)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["kill-9", "kill"])
def test_a_kill_mid_run_then_resume_is_bit_identical(sft_checkpoint, reference_run, tmp_path, sig):
    """SIGKILL, or SIGTERM (a job scheduler's stop, which ended the run without a word: it now closes the run and
    says how to resume, exit 143; within a step, after that step's checkpoint: tests/test_preemption.py), then the
    same command: bit-identical to the run that was never stopped."""
    out, err = tmp_path / "killed", tmp_path / "stderr.txt"
    with open(err, "w") as stderr:
        p = subprocess.Popen(cmd(sft_checkpoint, out), stdout=subprocess.DEVNULL, stderr=stderr)
    kill_after = int(torch.randint(1, 4, (1,)))  # a random step
    deadline = time.time() + 300
    while time.time() < deadline:
        m = out / "metrics.jsonl"
        if m.exists() and sum('"reward_mean"' in x for x in m.read_text().splitlines()) > kill_after:
            break
        time.sleep(0.05)
    p.send_signal(sig)
    assert p.wait() == (-signal.SIGKILL if sig == signal.SIGKILL else 128 + signal.SIGTERM)
    if sig == signal.SIGTERM:
        last = err.read_text().strip().splitlines()[-1]
        after = rf" after step \d+, checkpointed in {out}/checkpoints/step-\d+; the same command resumes from it"
        resumes = re.escape(f"; the same command resumes from the newest checkpoint in {out}/checkpoints")
        assert re.fullmatch(rf"dgrpo: terminated \(SIGTERM\)({after}|{resumes})", last), last  # (in a step: after it)
    assert not (out / "final").exists()
    r = run(sft_checkpoint, out)  # the output directory holds checkpoints: resumes automatically
    assert r.returncode == 0, r.stderr[-2000:]
    assert "resumed from" in r.stdout + r.stderr
    assert re.search(r"done in \d+ s \(this process, resumed at step \d+\)", r.stdout), r.stdout[-500:]
    assert_same_run(reference_run, out)


@pytest.mark.slow
def test_crash_while_writing_a_checkpoint_falls_back(sft_checkpoint, reference_run, tmp_path):
    out = tmp_path / "crash"
    r = run(sft_checkpoint, out, env={"DGRPO_TEST_CRASH_IN_CHECKPOINT": "3"})
    assert r.returncode == -signal.SIGKILL
    names = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert names[1:] == ["step-00000001", "step-00000002"]  # the half-written one is not a checkpoint
    assert names[0].startswith(".tmp-step-00000003-")
    r = run(sft_checkpoint, out)
    assert r.returncode == 0, r.stderr[-2000:]
    assert_same_run(reference_run, out)
    assert not list((out / "checkpoints").glob(".tmp-*"))  # (the half-written one is removed when the run resumes)


@pytest.mark.slow
def test_corrupted_checkpoint_is_skipped_with_a_message(sft_checkpoint, reference_run, tmp_path):
    out = tmp_path / "corrupt"
    p = subprocess.Popen(cmd(sft_checkpoint, out), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while not (out / "checkpoints" / "step-00000004").exists():
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.wait()
    latest = sorted((out / "checkpoints").glob("step-*"))[-1]
    opt = latest / "optimizer.pt"
    data = bytearray(opt.read_bytes())
    data[len(data) // 2] ^= 0xFF
    opt.write_bytes(bytes(data))
    r = run(sft_checkpoint, out)
    assert r.returncode == 0, r.stderr[-2000:]
    said = r.stdout + r.stderr
    assert f"skipping checkpoint {latest}" in said and "checksum mismatch" in said
    assert_same_run(reference_run, out)


def test_nonfinite_step_is_skipped_and_counted(sft_checkpoint, monkeypatch):
    import dgrpo.training.grpo as grpo
    from dgrpo.data.synthetic import generate_split
    from dgrpo.model.latent_lm import LatentLM

    cfg = tiny_config(**{"grpo.filter": "false", "perturbation.p": "0.3", "grpo.prompts_per_step": "4"})
    lm = LatentLM.from_pretrained(sft_checkpoint)
    tr = grpo.GRPOTrainer(lm, cfg, generate_split(cfg.task, "train"))
    before = [p.detach().clone() for p in lm.model.parameters()]
    real = grpo.grpo_objective

    def nan_objective(*a, **kw):
        loss, stats = real(*a, **kw)
        return loss * float("nan"), stats

    monkeypatch.setattr(grpo, "grpo_objective", nan_objective)
    m = tr.step()
    assert m["nonfinite_skips"] == 1 and tr.guard.streak == 1
    assert all(torch.equal(a, b) for a, b in zip(before, lm.model.parameters()))
    monkeypatch.setattr(grpo, "grpo_objective", real)
    m = tr.step()
    assert m["nonfinite_skips"] == 1 and tr.guard.streak == 0
    assert not all(torch.equal(a, b) for a, b in zip(before, lm.model.parameters()))


def test_a_grpo_step_whose_update_was_dropped_has_its_metrics_row_whatever_log_every(
    sft_checkpoint, tmp_path, monkeypatch
):
    """SFT writes a row for every dropped (non-finite) update; GRPO wrote one only at log_every: the step showed
    only through the nonfinite_skips counter of a later row."""
    import dgrpo.training.grpo as grpo
    from dgrpo.data.synthetic import generate_split
    from dgrpo.model.latent_lm import LatentLM

    sets = {"grpo.filter": "false", "perturbation.p": "0.3", "grpo.prompts_per_step": "2", "grpo.steps": "3"}
    cfg = tiny_config(**sets, **{"grpo.log_every": "5", "grpo.eval_every": "0", "data.test": "[]"})
    real, trainer_step, at = grpo.grpo_objective, grpo.GRPOTrainer.step, {"step": -1}

    def nan_at_step_1(*a, **kw):
        loss, stats = real(*a, **kw)
        return (loss * float("nan") if at["step"] == 1 else loss), stats

    def step(self):
        at["step"] = self.step_idx
        return trainer_step(self)

    monkeypatch.setattr(grpo, "grpo_objective", nan_at_step_1)
    monkeypatch.setattr(grpo.GRPOTrainer, "step", step)
    lm, train = LatentLM.from_pretrained(sft_checkpoint), generate_split(cfg.task, "train")[:8]
    grpo.train_grpo(lm, cfg, train, tmp_path / "run", progress=False, log=lambda *a: None)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    trained = [(r["step"], r["nonfinite_skips"]) for r in rows if "grad_norm" in r]
    assert trained == [(0, 0), (1, 1), (2, 1)]  # (step 0: log_every; 1: dropped; 2: the last)


SFT_SETS = {
    "model.hidden_size": 32,
    "model.intermediate_size": 64,
    "task.n_train": 256,
    "task.n_valid": 16,
    "task.n_test": 16,
    "sft.epochs_per_stage": 1,
    "sft.num_epochs": 2,
    "sft.batch_size": 32,
    "sft.save_every": 3,
    "sft.keep_last": 10,
    "data.test": "[]",
    "eval.max_new_tokens": 24,
    "threads": 1,
}


def sft_cmd(out):
    return [sys.executable, "-m", "dgrpo", "sft", "--out", str(out), *tiny_args(**SFT_SETS)]


@pytest.mark.slow
def test_sft_killed_across_a_stage_boundary_resumes_bit_identical(tmp_path, run_cli):
    """Killed writing the step-6 checkpoint, then resumed from step 3 across the stage boundary (8 steps per epoch =
    per stage) and killed again after stage 0's evaluation, writing the step-9 checkpoint; resumed from step 8: the
    same weights and metrics as the run never stopped, and the summary still names stage 0. (One chain of runs: a
    separate run killed at step 9 trained steps 1-8 a third time. The run never stopped runs in this process, the
    chain's in subprocesses: it need not be killed, and a fresh interpreter's imports are most of a run this size.)"""
    ref = tmp_path / "ref"
    r = run_cli(*sft_cmd(ref)[3:])
    assert r.returncode == 0, r.stderr[-2000:]
    out = tmp_path / "killed"

    def crashing_at(step):  # (unbuffered: what the process printed before its kill is read)
        env = {**os.environ, "DGRPO_TEST_CRASH_IN_CHECKPOINT": str(step), "PYTHONUNBUFFERED": "1"}
        return subprocess.run(sft_cmd(out), capture_output=True, text=True, timeout=600, env=env)

    assert crashing_at(6).returncode == -signal.SIGKILL
    assert not (out / "stage-0").exists() and not (out / "final").exists()
    r = crashing_at(9)  # resumed at 3, crosses 8
    assert r.returncode == -signal.SIGKILL
    assert "resumed from" in r.stdout and "(step 3)" in r.stdout, r.stdout[-2000:]
    newest = json.loads(sorted((out / "checkpoints").glob("step-*"))[-1].joinpath("state.json").read_text())
    r = subprocess.run(sft_cmd(out), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "resumed from" in r.stdout and "(step 8)" in r.stdout, r.stdout[-2000:]
    a, b = load_file(str(ref / "final" / "model.safetensors")), load_file(str(out / "final" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    strip = lambda p: [{k: v for k, v in json.loads(x).items() if k != "time_s"} for x in p.read_text().splitlines()]  # noqa: E731
    assert strip(ref / "metrics.jsonl") == strip(out / "metrics.jsonl")
    # killed after stage 0's evaluation: the resumed run's summary still names it
    summary = next(x for x in r.stdout.splitlines() if "validation accuracy by stage" in x)
    assert "validation accuracy by stage: 0: " in summary and ", 1: " in summary, summary
    times = [row["time_s"] for row in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())]
    assert times == sorted(times), times  # time_s goes on from the resumed rows (it restarted at 0)
    # from the checkpoint's own time (a checkpoint between two logged rows restarted near the earlier row's)
    assert newest["time_s"] > 0 and times[newest["metrics_lines"]] >= newest["time_s"], (newest, times)


def _damage_newest(out, how):
    """Damage the newest checkpoint and rewrite its manifest to match (as if dgrpo had written it that way)."""
    from dgrpo.model.verified import write_manifest

    newest = sorted((out / "checkpoints").glob("step-*"))[-1]
    how(newest)
    write_manifest(newest)
    return newest


def _kill_after_checkpoint(ckpt, out, step):
    p = subprocess.Popen(cmd(ckpt, out), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while not (out / "checkpoints" / f"step-{step:08d}").exists():
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.wait()


@pytest.mark.slow
@pytest.mark.parametrize(
    "damage", ["dropped-tensor", "truncated-weights", "pickled-optimizer", "wrong-shape", "state-without-trainer"]
)
def test_a_damaged_newest_checkpoint_is_reported_and_the_previous_one_resumed(
    sft_checkpoint, reference_run, tmp_path, damage
):
    """Strict loading: the newest checkpoint (its manifest matching the damage) fails to load in one reported line,
    the previous one is resumed, and the run ends bit-identical to the uninterrupted one."""
    from safetensors.torch import load_file, save_file

    out = tmp_path / damage
    _kill_after_checkpoint(sft_checkpoint, out, 4)

    def apply(ckpt):
        weights = ckpt / "model" / "model.safetensors"
        if damage in ("dropped-tensor", "wrong-shape"):
            state = load_file(str(weights))
            key = sorted(k for k in state if "mlp" in k)[0]
            if damage == "dropped-tensor":
                state.pop(key)
            else:
                state[key] = torch.zeros(2, 2)
            save_file(state, str(weights), metadata={"format": "pt"})
        elif damage == "truncated-weights":
            weights.write_bytes(weights.read_bytes()[:1000])
        elif damage == "state-without-trainer":  # (read after the weights were applied: a KeyError's traceback)
            state = json.loads((ckpt / "state.json").read_text())
            del state["trainer"]
            (ckpt / "state.json").write_text(json.dumps(state))
        else:  # an optimizer file that only unpickling code could read

            class Evil:
                def __reduce__(self):
                    return (os.system, ("true",))

            torch.save({"state": Evil(), "param_groups": []}, ckpt / "optimizer.pt")

    newest = _damage_newest(out, apply)
    r = run(sft_checkpoint, out)
    assert r.returncode == 0, r.stderr[-2000:]
    said = [line for line in (r.stdout + r.stderr).splitlines() if f"skipping checkpoint {newest}" in line]
    assert len(said) == 1 and "weights_only=False" not in said[0], r.stdout + r.stderr
    assert_same_run(reference_run, out)


@pytest.mark.slow
def test_a_newest_checkpoint_without_its_manifest_is_moved_aside_and_the_run_completes(
    sft_checkpoint, reference_run, tmp_path
):
    """A checkpoint whose manifest is gone is skipped, then moved aside to ``damaged-step-N`` so that the resumed
    run can write that step again (it refused to replace a directory without a manifest, at every try), and the run
    ends bit-identical to the uninterrupted one."""
    out = tmp_path / "no-manifest"
    _kill_after_checkpoint(sft_checkpoint, out, 4)
    newest = sorted((out / "checkpoints").glob("step-*"))[-1]
    (newest / "manifest.json").unlink()
    r = run(sft_checkpoint, out)
    assert r.returncode == 0, r.stderr[-2000:]
    said = r.stdout + r.stderr
    assert f"skipping checkpoint {newest}" in said and "no manifest" in said and "aside to" in said
    assert (newest.parent / f"damaged-{newest.name}").is_dir()
    assert_same_run(reference_run, out)


@pytest.mark.slow
def test_final_is_written_atomically_under_sigkill(sft_checkpoint, reference_run, tmp_path, run_cli):
    """Killed while final/ is published: no final/ (only a hidden temporary directory), eval says so in one line,
    and rerunning the command completes the run, bit-identical."""
    out = tmp_path / "killed"
    r = run(sft_checkpoint, out, env={"DGRPO_TEST_CRASH_BEFORE_PUBLISH": "final"})
    assert r.returncode == -signal.SIGKILL
    assert not (out / "final").exists() and any(p.name.startswith(".tmp-final-") for p in out.iterdir())
    r2 = run_cli("eval", "--model", out, "--data", "builtin:test", "--out", tmp_path / "ev")
    assert r2.returncode == 2 and "holds no model checkpoint" in r2.stderr
    r = run(sft_checkpoint, out)
    assert r.returncode == 0, r.stderr[-2000:]
    assert_same_run(reference_run, out)
    assert not list(out.glob(".tmp-*"))  # (the killed write's copy of the model was left there for good)
    from dgrpo.model.verified import verify

    assert verify(out / "final") is None
    data = bytearray((out / "final" / "model.safetensors").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (out / "final" / "model.safetensors").write_bytes(bytes(data))
    r2 = run_cli("eval", "--model", out, "--data", "builtin:test", "--out", tmp_path / "ev")
    assert r2.returncode == 2 and "checksum mismatch in model.safetensors" in r2.stderr


@pytest.mark.slow
def test_killing_the_torchrun_launcher_stops_the_workers(sft_checkpoint, tmp_path):
    """Workers ask the kernel for SIGTERM when their launcher dies (PR_SET_PDEATHSIG): kill -9 torchrun, and
    no worker is left running."""
    out = tmp_path / "run"
    launcher = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            "-m",
            "dgrpo",
            "grpo",
            "--init",
            str(sft_checkpoint),
            "--out",
            str(out),
            *tiny_args(**{"grpo.steps": 1000, "threads": 1}),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    deadline = time.time() + 180
    while not (out / "metrics.jsonl").exists() and time.time() < deadline:
        time.sleep(0.2)
    workers = child_pids(launcher.pid)
    assert len(workers) == 2
    launcher.kill()
    launcher.wait()
    deadline = time.time() + 60
    while any(process_alive(w) for w in workers):
        assert time.time() < deadline, "workers still running after their launcher died"
        time.sleep(0.2)


def test_only_options_that_change_no_result_may_change_on_resume():
    """Recomputation's switches, and how often checkpoints are saved and how many kept, are neutral (bit for bit on
    CPU), but keeping the latent steps' activations (recompute_latent_steps: false) moves gradients by 1e-7: a change
    to refuse, or to record in config history."""
    from dgrpo.config import Config, load_config, to_dict
    from dgrpo.training.resume_check import config_diff

    old = to_dict(load_config(Config, None, []))
    neutral = ["threads=1", "logging.backends=[jsonl, tensorboard]", "grpo.recompute=false", "sft.recompute=true"]
    neutral += ["grpo.recompute_granularity=call", "device=cpu"]
    neutral += ["sft.save_every=7", "sft.keep_last=5", "grpo.save_every=3", "grpo.keep_last=1"]  # (were refused)
    assert config_diff(old, to_dict(load_config(Config, None, neutral))) == []
    changed = ["grpo.recompute_latent_steps=false", "sft.recompute_latent_steps=false", "grpo.lr=1e-3"]
    assert config_diff(old, to_dict(load_config(Config, None, changed))) == [
        "grpo.lr",
        "grpo.recompute_latent_steps",
        "sft.recompute_latent_steps",
    ]
    # a run started before an option existed resumes when the option is at its default (it was refused as changed)
    older = to_dict(load_config(Config, None, []))
    del older["model"]["latent_token_init"]
    assert config_diff(older, old) == []
    assert config_diff(older, to_dict(load_config(Config, None, ["model.latent_token_init=coconut"]))) == [
        "model.latent_token_init"
    ]


@pytest.mark.slow
def test_a_lengthened_sft_run_trains_its_added_epochs(tmp_path, run_cli):
    """Resumed with more epochs (--allow-config-change, one schedule over the run): the schedule is the new config's
    (the saved length held every added step at lr 0, and final/ was the shorter run's, labelled a stage it never
    trained)."""
    sets = {**SFT_SETS, "sft.reset_optimizer": "false", "sft.warmup_steps": 0, "task.n_train": 64, "sft.save_every": 0}
    out = tmp_path / "run"
    r = run_cli("sft", "--out", out, *tiny_args(**sets))
    assert r.returncode == 0 and "dgrpo sft: done in " in r.stdout and "earlier processes" not in r.stdout
    more = tiny_args(**{**sets, "sft.num_epochs": 3})
    r = run_cli("sft", "--out", out, *more, "--allow-config-change")
    assert r.returncode == 0, r.stderr[-2000:]
    assert " s (the run's: its earlier processes' time too, as time_s); " in r.stdout  # (it read as this process's)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if '"lr"' in x]
    added = [row["lr"] for row in rows if row["step"] > 4]  # 2 steps per epoch: epoch 2 is steps 5-6
    assert added and all(lr > 0 for lr in added), rows


@pytest.mark.slow
def test_a_run_cannot_be_shortened_below_its_checkpoint_and_a_refused_out_is_not_left(
    sft_checkpoint, tmp_path, run_cli
):
    """grpo.steps below the step the run resumes at was accepted: final/ held more steps than summary.json said.
    A refused --resume PATH into a new --out left that directory behind, holding only its lock file."""
    out = tmp_path / "run"
    args = ["grpo", "--init", sft_checkpoint, *tiny_args(**{"grpo.steps": 2, "grpo.save_every": 1}), "--out", out]
    assert run_cli(*args).returncode == 0
    r = run_cli(*args, "--set", "grpo.steps=1", "--allow-config-change")
    assert r.returncode == 2 and "grpo.steps = 1 is below the step the run resumes at (2)" in r.stderr, r.stderr
    assert json.loads((out / "summary.json").read_text())["steps"] == 2
    new = tmp_path / "new"
    r = run_cli(*args[:-1], new, "--resume", tmp_path / "missing")
    assert r.returncode == 2 and "no such checkpoint directory" in r.stderr and not new.exists()
    (tmp_path / "a-file").write_text("")
    r = run_cli(*args[:-1], new, "--resume", tmp_path / "a-file")
    assert r.returncode == 2 and f"--resume {tmp_path / 'a-file'} is a file: name a checkpoint directory" in r.stderr
    assert not new.exists()
    r = run_cli(*args[:-1], new, "--resume", out / "checkpoints" / "step-1")  # (written step-00000001)
    assert r.returncode == 0 and "resumed from" in r.stdout and "step-00000001 (step 1)" in r.stdout, r.stderr


def test_sft_latents_beyond_the_context_fail_before_training_naming_sft_c_thought(tmp_path, run_cli):
    r = run_cli("sft", "--out", tmp_path / "x", *tiny_args(**{**SFT_SETS, "sft.c_thought": 600}))
    assert r.returncode == 2 and "sft.c_thought" in r.stderr and "eval.n_latent" not in r.stderr, r.stderr
    assert not (tmp_path / "x" / "metrics.jsonl").exists()
    # thoughts that fit training, but not the validation's answers of eval.max_new_tokens: a whole stage trained,
    # then the validation failed, telling to lower eval.n_latent (which SFT's validation does not read)
    sets = {**SFT_SETS, "sft.c_thought": 100, "eval.max_new_tokens": 400}
    r = run_cli("sft", "--out", tmp_path / "y", *tiny_args(**sets))
    assert r.returncode == 2 and "eval.n_latent" not in r.stderr, r.stderr
    assert re.search(
        r"question \(\d+ tokens\) \+ 100 latent thoughts \+ 2 markers \+ answer \(eval.max_new_tokens = 400\)", r.stderr
    )
    assert "lower sft.c_thought, eval.max_new_tokens or data.max_question_tokens" in r.stderr
    assert not (tmp_path / "y" / "metrics.jsonl").exists()


@pytest.mark.slow
def test_sft_eval_every_epoch_keeps_the_last_stages_best_epoch(tmp_path):
    """sft.eval_every_epoch: every epoch is validated and the last stage's best epoch is kept as best/ (Coconut picks
    its checkpoint so); a tie keeps the earlier epoch, earlier stages' epochs never count, and a resumed run reads
    the best so far back from its metrics rows."""
    from types import SimpleNamespace

    from dgrpo.data.synthetic import generate_split
    from dgrpo.model.factory import load_model
    from dgrpo.training.distributed import Dist
    from dgrpo.training.sft import _resumed_best, train_sft

    over = {"task.n_train": 64, "sft.num_epochs": 4, "sft.stage_epochs": [1], "sft.epochs_per_stage": 3}
    cfg = tiny_config(**over, **{"sft.eval_every_epoch": True, "sft.max_latent_stage": 1})
    counts = iter([4, 1, 2, 2])  # correct of 4 at epochs 0 (stage 0's end), 1, 2, 3 (the last stage: epochs 1-3)
    lm = load_model(cfg.model, cfg.task, seed=0)
    out = tmp_path / "sft"
    train = generate_split(cfg.task, "train")
    train_sft(lm, train, cfg, out, valid=train[:4], evaluate_fn=lambda *a: next(counts), log=lambda *a: None)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["eval/valid/accuracy"] for r in rows if "eval/valid/accuracy" in r] == [
        1.0,
        0.25,
        0.5,
        0.5,
    ]
    assert [(r["best_epoch"], r["best/valid/accuracy"]) for r in rows if "best_epoch" in r] == [(1, 0.25), (2, 0.5)]
    best, final = (
        load_file(str(out / "best" / "model.safetensors")),
        load_file(str(out / "final" / "model.safetensors")),
    )
    assert not all(torch.equal(best[k], final[k]) for k in best)  # epoch 2's weights, not epoch 3's
    assert json.loads((out / "best" / "latent_config.json").read_text())["stage"] == 1
    run = SimpleNamespace(out_dir=out, metrics=SimpleNamespace(rows=lambda: rows))
    assert _resumed_best(run, Dist.single(), 0) == 0.5  # what a resumed run compares its next epochs with
    assert _resumed_best(SimpleNamespace(out_dir=tmp_path, metrics=run.metrics), Dist.single(), 0) == -1.0  # no best/


def test_sft_eval_every_epoch_without_a_validation_set_is_warned_of(tmp_path):
    """It finished without best/ and without a word, though best/ is what the option is for."""
    from dgrpo.data.synthetic import generate_split
    from dgrpo.model.factory import load_model
    from dgrpo.training.sft import train_sft

    cfg = tiny_config(**{"task.n_train": 16, "sft.num_epochs": 1, "sft.eval_every_epoch": True})
    lm = load_model(cfg.model, cfg.task, seed=0)
    with pytest.warns(UserWarning, match=r"sft.eval_every_epoch is set but there is no validation set"):
        train_sft(lm, generate_split(cfg.task, "train"), cfg, tmp_path / "sft", log=lambda *a: None)
    assert not (tmp_path / "sft" / "best").exists()


@pytest.mark.parametrize("mode", ["cot", "no_cot"])
def test_sft_uniform_prob_without_stages_is_warned_of(tmp_path, mode):
    """sft.uniform_prob mixes a curriculum's stages; cot and no_cot have none: it was accepted and ignored."""
    from dgrpo.data.synthetic import generate_split
    from dgrpo.model.factory import load_model
    from dgrpo.training.sft import train_sft

    cfg = tiny_config(**{"task.n_train": 16, "sft.num_epochs": 1, "sft.mode": mode, "sft.uniform_prob": 0.3})
    lm = load_model(cfg.model, cfg.task, seed=0)
    with pytest.warns(UserWarning, match=rf"sft.uniform_prob = 0.3 is unused under sft.mode={mode}"):
        train_sft(lm, generate_split(cfg.task, "train"), cfg, tmp_path / "sft", log=lambda *a: None)


@pytest.mark.parametrize("mode", ["cot", "no_cot"])
def test_sft_latent_layout_without_latent_thoughts_is_warned_of(tmp_path, mode):
    """sft.c_thought and sft.pad_latent_to_max set the latent thoughts; cot and no_cot train none: they were
    accepted and ignored."""
    from dgrpo.data.synthetic import generate_split
    from dgrpo.model.factory import load_model
    from dgrpo.training.sft import train_sft

    over = {"task.n_train": 16, "sft.num_epochs": 1, "sft.mode": mode, "sft.c_thought": 2}
    cfg = tiny_config(**over, **{"sft.pad_latent_to_max": True})
    lm = load_model(cfg.model, cfg.task, seed=0)
    said = rf"sft.c_thought=2, sft.pad_latent_to_max=true change nothing with sft.mode={mode}"
    with pytest.warns(UserWarning, match=said):
        train_sft(lm, generate_split(cfg.task, "train"), cfg, tmp_path / "sft", log=lambda *a: None)


def test_sft_reset_every_without_resets_is_warned_of(tmp_path):
    """sft.reset_every says when the optimizer and the lr schedule start afresh; with sft.reset_optimizer=false there
    is no reset: it was accepted and ignored."""
    from dgrpo.data.synthetic import generate_split
    from dgrpo.model.factory import load_model
    from dgrpo.training.sft import train_sft

    cfg = tiny_config(
        **{"task.n_train": 16, "sft.num_epochs": 1, "sft.reset_optimizer": False, "sft.reset_every": "epoch"}
    )
    lm = load_model(cfg.model, cfg.task, seed=0)
    with pytest.warns(UserWarning, match=r"sft.reset_every=epoch changes nothing with sft.reset_optimizer=false"):
        train_sft(lm, generate_split(cfg.task, "train"), cfg, tmp_path / "sft", log=lambda *a: None)


def test_sft_recompute_settings_without_recompute_are_warned_of(tmp_path):
    """sft.recompute_granularity and sft.recompute_latent_steps say how activations are recomputed; without
    sft.recompute they were accepted and ignored (sft.recompute_kept_layers is refused)."""
    from dgrpo.data.synthetic import generate_split
    from dgrpo.model.factory import load_model
    from dgrpo.training.sft import train_sft

    cfg = tiny_config(**{"task.n_train": 16, "sft.num_epochs": 1, "sft.recompute_latent_steps": False})
    lm = load_model(cfg.model, cfg.task, seed=0)
    with pytest.warns(UserWarning, match=r"sft.recompute_latent_steps=false changes nothing with sft.recompute=false"):
        train_sft(lm, generate_split(cfg.task, "train"), cfg, tmp_path / "sft", log=lambda *a: None)


@pytest.mark.slow
def test_a_failing_validation_at_an_epochs_end_keeps_the_epochs_training(tmp_path):
    """A scorer of one's own that fails on the model's answers first runs at stage 0's end: the error came before the
    epoch's resumable checkpoint, and the resumed run trained the whole epoch again. The epoch is now kept: the same
    run resumes at its end and gives the uninterrupted run's weights and metrics rows."""
    from dgrpo.data.synthetic import generate_split
    from dgrpo.model.factory import load_model
    from dgrpo.training.sft import train_sft

    over = {"task.n_train": 32, "sft.batch_size": 8, "sft.num_epochs": 2, "sft.stage_epochs": [1]}
    cfg = tiny_config(**over, **{"sft.epochs_per_stage": 1})
    train = generate_split(cfg.task, "train")

    def run(out, evaluate_fn):
        lm = load_model(cfg.model, cfg.task, seed=0)
        train_sft(lm, train, cfg, out, valid=train[:4], evaluate_fn=evaluate_fn, log=lambda *a: None)

    def failing(*a):
        raise ValueError("my scorer failed")

    run(tmp_path / "ref", lambda *a: 2)
    with pytest.raises(ValueError, match="my scorer failed"):
        run(tmp_path / "cut", failing)
    (ckpt,) = (tmp_path / "cut" / "checkpoints").glob("step-*")
    progress = json.loads((ckpt / "state.json").read_text())["progress"]
    assert (progress["epoch"], progress["batch"], progress["global_step"]) == (0, 4, 4)  # epoch 0 trained, end to do
    run(tmp_path / "cut", lambda *a: 2)
    for name in ("final", "stage-0"):
        a, b = (load_file(str(tmp_path / d / name / "model.safetensors")) for d in ("ref", "cut"))
        assert all(torch.equal(a[k], b[k]) for k in a)
    strip = lambda p: [{k: v for k, v in json.loads(x).items() if k != "time_s"} for x in p.read_text().splitlines()]  # noqa: E731
    assert strip(tmp_path / "ref" / "metrics.jsonl") == strip(tmp_path / "cut" / "metrics.jsonl")
    said: list[str] = []  # a checkpoint that cannot be written (a full disk) does not hide the validation's error
    lm = load_model(cfg.model, cfg.task, seed=0)
    with mock.patch("dgrpo.training.sft.SFTRun.save", side_effect=OSError(28, "No space left on device")):
        with pytest.raises(ValueError, match="my scorer failed"):
            train_sft(lm, train, cfg, tmp_path / "full", valid=train[:4], evaluate_fn=failing, log=said.append)
    kept = "epoch 0's training could not be kept (OSError: [Errno 28] No space left on device)"
    assert any(kept in line for line in said), said


@pytest.mark.slow
def test_sft_best_epoch_counts_every_stage_of_the_final_layout(tmp_path):
    """Stages past max_latent_stage train one layout (all steps latent): best/ is chosen among all their epochs.
    It was chosen among the last stage number's only (under the paper recipe, one epoch of 16 all-latent ones)."""
    from dgrpo.data.synthetic import generate_split
    from dgrpo.model.factory import load_model
    from dgrpo.training.sft import train_sft

    over = {"task.n_train": 64, "sft.num_epochs": 4, "sft.stage_epochs": [1], "sft.epochs_per_stage": 1}
    cfg = tiny_config(**over, **{"sft.eval_every_epoch": True, "sft.max_latent_stage": 1})
    counts = iter([1, 1, 3, 2])  # epochs 0-3 are stages 0-3; stages 2 and 3 are the final layout
    lm = load_model(cfg.model, cfg.task, seed=0)
    out = tmp_path / "sft"
    train = generate_split(cfg.task, "train")
    train_sft(lm, train, cfg, out, valid=train[:4], evaluate_fn=lambda *a: next(counts), log=lambda *a: None)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [(r["best_epoch"], r["best/valid/accuracy"]) for r in rows if "best_epoch" in r] == [(2, 0.75)]
    assert json.loads((out / "best" / "latent_config.json").read_text())["stage"] == 2


def _same_weights(a, b):
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.slow
def test_a_rewound_sft_run_does_not_keep_the_abandoned_runs_best(tmp_path):
    """best/ written after the checkpoint a rewind resumes (here under a changed sft.lr) was kept: the run said
    "best/: epoch 1" (its metrics rows, cut at the checkpoint) while best/ held the abandoned run's epoch 2. It is
    removed now (said in a line), and best/ is chosen anew from the resumed epoch on."""
    from dgrpo.data.synthetic import generate_split
    from dgrpo.model.factory import load_model
    from dgrpo.training.checkpoint import list_checkpoints
    from dgrpo.training.sft import train_sft

    over = {"task.n_train": 32, "sft.batch_size": 8, "sft.num_epochs": 4, "sft.stage_epochs": [1], "sft.keep_last": 9}
    over |= {"sft.epochs_per_stage": 3, "sft.eval_every_epoch": True, "sft.max_latent_stage": 1}
    out, train = tmp_path / "sft", generate_split(tiny_config(**over).task, "train")

    def run(counts, **kw):
        said: list[str] = []
        cfg, it = tiny_config(**over, **({"sft.lr": 1e-2} if kw else {})), iter(counts)
        lm = load_model(cfg.model, cfg.task, seed=0)
        train_sft(lm, train, cfg, out, valid=train[:4], evaluate_fn=lambda *a: next(it), log=said.append, **kw)
        return said

    run([4, 1, 3, 2])  # best/: epoch 2 (0.75); a checkpoint at each epoch's end
    epoch_1 = list_checkpoints(out)[1]  # (stage 0's end, then epoch 1's)
    said = run([1, 1], resume=str(epoch_1), allow_config_change=True)  # under another sft.lr, 0.25 twice
    assert any("removed" in line and "best" in line and "written after" in line for line in said), said
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    best = [r for r in rows if "best_epoch" in r]
    assert [(r["best_epoch"], r["best/valid/accuracy"]) for r in best] == [(1, 0.25), (2, 0.25)]  # anew from epoch 2
    epoch_2 = list_checkpoints(out)[2]
    assert _same_weights(out / "best", epoch_2 / "model")  # the resumed run's epoch 2, as the last row says
    assert any("best/: epoch 2 (25.0%)" in line for line in said), said


@pytest.mark.slow
def test_a_rewound_grpo_run_does_not_keep_the_abandoned_runs_best(sft_checkpoint, tmp_path):
    """The same for GRPO: best/ held the abandoned run's step 4, summary.json said best_step 2."""
    from dgrpo.data.synthetic import generate_split
    from dgrpo.model.latent_lm import LatentLM
    from dgrpo.training.grpo import train_grpo

    base = {"grpo.steps": 6, "grpo.prompts_per_step": 2, "grpo.eval_every": 2, "grpo.save_every": 2}
    base |= {"grpo.warmup_steps": 0, "grpo.filter": "false", "grpo.max_new_tokens": 8, "grpo.keep_last": 9}
    out = tmp_path / "grpo"

    def run(counts, **kw):
        cfg, said, it = tiny_config(**base, **({"grpo.lr": 1e-3} if kw else {})), [], iter(counts)
        train = generate_split(cfg.task, "train")[:8]
        lm = LatentLM.from_pretrained(sft_checkpoint)
        evaluate_fn = lambda *a: next(it)  # noqa: E731
        valid = {"v": train[:4]}
        train_grpo(lm, cfg, train, out, valid=valid, evaluate_fn=evaluate_fn, progress=False, log=said.append, **kw)
        return said, json.loads((out / "summary.json").read_text())

    _, summary = run([0, 1, 3, 2])  # best/: step 4 (0.75)
    assert summary["best_step"] == 4
    rewind = {"resume": str(out / "checkpoints" / "step-00000002"), "allow_config_change": True}
    said, summary = run([1, 1], **rewind)  # rewound to step 2 (its best: step 2) under another lr, then 0.25 twice
    assert any("removed" in line and "written after" in line for line in said), said
    assert (summary["best_step"], summary["best_accuracy"]) == (4, 0.25)  # anew from step 2: step 4's first eval
    assert _same_weights(out / "best", out / "checkpoints" / "step-00000004" / "model")


@pytest.mark.slow
@pytest.mark.parametrize("command", ["grpo", "sft"])
def test_resuming_on_other_training_data_is_refused_unless_allowed(tmp_path, command):
    """A run resumed from Python with other training records than its checkpoint's is refused in one line naming
    the counts (a shorter list crashed GRPO's resume with an IndexError into the saved order; SFT went on silently),
    unless allow_config_change: then it trains on the new records."""
    from dgrpo.config import ConfigError
    from dgrpo.data.synthetic import generate_split
    from dgrpo.model.factory import load_model
    from dgrpo.training.grpo import train_grpo
    from dgrpo.training.sft import train_sft

    over = {"grpo.steps": 2, "grpo.save_every": 1, "grpo.filter": "false"} if command == "grpo" else SFT_SETS
    cfg = tiny_config(**{**over, "sft.num_epochs": 1, "sft.max_latent_stage": 0})
    train, out = generate_split(cfg.task, "train"), tmp_path / command

    def run(records, config=cfg, **kw):
        lm = load_model(config.model, config.task, seed=0)
        args = (lm, config, records, out) if command == "grpo" else (lm, records, config, out)
        return (train_grpo if command == "grpo" else train_sft)(*args, log=lambda *a: None, progress=False, **kw)

    run(train)
    with pytest.raises(ConfigError, match=rf"other training data than given now \({len(train)} records, now 8\)"):
        run(train[:8])
    longer = cfg if command == "sft" else tiny_config(**{**over, "grpo.steps": 3, "sft.num_epochs": 1})
    run(train[:8], longer, allow_config_change=True)  # (GRPO: one more step, drawn from the 8)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    if command == "grpo":
        assert [r["step"] for r in rows if "reward_mean" in r] == [0, 1, 2]


# ----------------------------------------------------------------------------------- a run directory's state
def _fake_checkpoint(path, command="grpo"):
    """A folder that reads as a resumable checkpoint of ``command`` (its state.json), without weights."""
    path.mkdir(parents=True)
    (path / "state.json").write_text(json.dumps({"trainer": {}} if command == "grpo" else {"progress": {}}))
    return path


def _run_dir(out, command="grpo", cfg=None, **kw):
    from dgrpo.training.distributed import Dist
    from dgrpo.training.run import RunDir

    return RunDir(out, cfg or tiny_config(), Dist(), command, log=lambda m: None, **kw)


def test_a_stopped_fork_is_told_to_drop_resume_and_refused_when_given_it_again(tmp_path):
    """A fork (--resume PATH of another run) stopped after writing checkpoints of its own: the stop line said the same
    command resumes from OUT's newest, but given again it went back to PATH (steps run again, metrics rows
    duplicated, best/ out of step with summary.json). The line now says to drop --resume, and the same command is
    refused in one line before anything is written; a rewind to one of OUT's own checkpoints stays allowed."""
    import argparse

    from dgrpo.cli import _resume_hint
    from dgrpo.config import ConfigError

    parent = _fake_checkpoint(tmp_path / "parent" / "checkpoints" / "step-00000004")
    out = tmp_path / "fork"
    own = _fake_checkpoint(out / "checkpoints" / "step-00000006")
    _fake_checkpoint(out / "checkpoints" / "step-00000008")
    hint = _resume_hint(argparse.Namespace(cmd="grpo", out=str(out), resume=str(parent)))
    assert hint == (
        f"; rerun it without --resume {parent} (--resume auto, the default) to resume from the newest checkpoint "
        f"in {out}/checkpoints"
    )
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    with pytest.raises(ConfigError, match="is another run's checkpoint") as e:
        _run_dir(out, resume=str(parent))
    assert "drop --resume (resume='auto') to continue from" in str(e.value) and "step-00000008" in str(e.value)
    assert "\n" not in str(e.value)
    assert sorted(p.relative_to(out) for p in out.rglob("*") if p.name != ".lock") == before
    with _run_dir(out, resume=str(own)) as run:  # a rewind inside OUT
        assert run.candidates == [own]


def test_a_fork_into_an_out_of_another_config_is_refused_as_a_fork_before_the_config_is_compared(tmp_path):
    """--resume PATH of another run into an --out that holds a run of its own (its checkpoints, its config.json of
    another config): the command line's check before loading compared the config with that run's config.json and
    said --resume PATH 'is from a run started with a different config' and to pass --allow-config-change, which was
    then refused as a fork; the fork's refusal comes first, in that check as in the run's."""
    from dgrpo.config import ConfigError, to_dict
    from dgrpo.training.resume_check import check_resume_config

    parent = _fake_checkpoint(tmp_path / "parent" / "checkpoints" / "step-00000004")
    out = tmp_path / "other"
    _fake_checkpoint(out / "checkpoints" / "step-00000008")
    (out / "config.json").write_text(json.dumps(to_dict(tiny_config(**{"grpo.steps": 200}))))
    with pytest.raises(ConfigError, match=f"^--resume {parent} is another run's checkpoint, and ") as e:
        check_resume_config(out, tiny_config(), "grpo", resume=str(parent))
    assert "drop --resume to continue from" in str(e.value) and "step-00000008" in str(e.value)


def test_a_rewind_removes_the_later_checkpoints_so_that_a_stop_resumes_the_rewound_run(tmp_path):
    """--resume OUT/checkpoints/step-N (a rewind, under a changed config too) left the later checkpoints of the run
    it abandoned: stopped before it rewrote them, the same command without --resume (as the stop's line advises)
    resumed the abandoned newest one, its weights under the rewound steps' metrics rows (the rows between them lost)
    and config history. They are removed once the rewind's checkpoint is resumed; an auto resume removes none."""
    from types import SimpleNamespace

    from dgrpo.training.checkpoint import list_checkpoints

    out = tmp_path / "run"
    ckpts = [_fake_checkpoint(out / "checkpoints" / f"step-0000000{n}") for n in (2, 4, 6, 8)]
    with _run_dir(out) as run:  # (auto: the newest resumed, nothing removed)
        run.resume(lambda c: SimpleNamespace(base=None))
        run.start({"step": 8, "metrics_lines": 0})
    assert list_checkpoints(out) == ckpts
    with _run_dir(out, resume=str(ckpts[1])) as run:
        run.resume(lambda c: SimpleNamespace(base=None))
        run.start({"step": 4, "metrics_lines": 0})
    assert list_checkpoints(out) == ckpts[:2]
    assert not any(p.name.startswith(".tmp-") for p in (out / "checkpoints").iterdir())


def test_a_rewind_orders_checkpoints_by_step_not_by_name(tmp_path):
    """A rewind to a hand-named step-2 compared names: every step-0000000N sorted before it, so the abandoned later
    steps were kept (and resumed by the next plain run); a user's step-00000004-copy sorted after step 4 and went."""
    from types import SimpleNamespace

    from dgrpo.training.checkpoint import list_checkpoints

    out = tmp_path / "run"
    two, copy = _fake_checkpoint(out / "checkpoints" / "step-2"), out / "checkpoints" / "step-00000004-copy"
    for n in (4, 6):
        _fake_checkpoint(out / "checkpoints" / f"step-0000000{n}")
    copy.mkdir()
    with _run_dir(out, resume=str(two)) as run:
        run.resume(lambda c: SimpleNamespace(base=None))
        run.start({"step": 2, "metrics_lines": 0})
    assert list_checkpoints(out) == [two] and copy.is_dir()


def test_a_run_stopped_under_resume_never_is_told_to_drop_it(tmp_path):
    """The stop line of a --resume never run said the same command resumes; given again, it deleted the checkpoint
    just written and started over."""
    import argparse

    from dgrpo.cli import _resume_hint

    out = tmp_path / "run"
    args = argparse.Namespace(cmd="sft", out=str(out), resume="never")
    assert _resume_hint(args) == "; no checkpoint was written yet: the same command starts the run again"
    _fake_checkpoint(out / "checkpoints" / "step-00000005", "sft")
    assert _resume_hint(args) == (
        "; rerun it without --resume never (--resume auto, the default) to resume from the newest checkpoint in "
        f"{out}/checkpoints"
    )


def test_a_run_without_its_config_json_is_held_to_its_checkpoints_config(tmp_path):
    """config.json deleted: the run resumed its newest checkpoint under a changed config (a new grpo.lr) without a
    word. The checkpoint's model/run_config.json (the config it was trained with) is the reference then."""
    from dgrpo.config import ConfigError, to_dict

    out = tmp_path / "run"
    ckpt = _fake_checkpoint(out / "checkpoints" / "step-00000004")
    (ckpt / "model").mkdir()
    (ckpt / "model" / "run_config.json").write_text(json.dumps(to_dict(tiny_config(**{"grpo.lr": 5e-3}))))
    with pytest.raises(ConfigError, match=r"started with a different config \(grpo\.lr\)"):
        _run_dir(out)
    with _run_dir(out, allow_config_change=True) as run:
        assert run.changed == ["grpo.lr"]


def test_a_run_whose_config_json_is_damaged_is_told_how_to_go_on(tmp_path):
    """A config.json cut short beside the run's checkpoints was "not a dgrpo run's config: name a new --out" (the run
    lost); deleting it, as the line now says, resumes under the checkpoint's run_config.json."""
    from dgrpo.config import ConfigError, to_dict

    out = tmp_path / "run"
    ckpt = _fake_checkpoint(out / "checkpoints" / "step-00000004")
    (ckpt / "model").mkdir()
    (ckpt / "model" / "run_config.json").write_text(json.dumps(to_dict(tiny_config())))
    (out / "config.json").write_text('{"grpo": {"lr": 1')
    with pytest.raises(ConfigError, match=r"config.json is not a dgrpo run's config, beside the run's checkpoints: if"):
        _run_dir(out)
    (ckpt.parent / "step-00000004").rename(ckpt.parent / "step-00000004-copy")  # (no checkpoint of the run's: foreign)
    with pytest.raises(ConfigError, match=r"config.json is not a dgrpo run's config: name a new --out \(out_dir\)$"):
        _run_dir(out)
    (ckpt.parent / "step-00000004-copy").rename(ckpt)
    (out / "config.json").unlink()
    with _run_dir(out) as run:
        assert run.changed == []


def test_metrics_rows_lost_before_the_resumed_checkpoint_are_warned_of_once(tmp_path):
    """metrics.jsonl deleted, or cut below the rows the checkpoint recorded: the run resumed without a word, its
    metrics short of every row before the checkpoint. One warning now; the run goes on."""
    out = tmp_path / "run"
    ckpt = _fake_checkpoint(out / "checkpoints" / "step-00000004")
    for rows_left in (None, 1):
        (out / "metrics.jsonl").unlink(missing_ok=True)
        if rows_left:
            (out / "metrics.jsonl").write_text('{"step": 1}\n')
        with _run_dir(out, allow_config_change=True) as run, pytest.warns(UserWarning) as said:
            run.checkpoint = ckpt
            run.start({"step": 4, "metrics_lines": 3})
        lost = [str(w.message) for w in said if "rows before that checkpoint are lost" in str(w.message)]
        assert len(lost) == 1, [str(w.message) for w in said]
        assert ("is missing" if rows_left is None else "holds 1 rows") in lost[0]
    with _run_dir(out) as run, warnings.catch_warnings():  # as many rows as recorded: nothing to say
        warnings.simplefilter("error")
        run.checkpoint = ckpt
        run.start({"step": 4, "metrics_lines": 1})


def test_a_half_written_last_rollout_row_is_dropped_on_resume_and_a_bad_row_before_it_is_one_line(tmp_path):
    """A kill mid-append of rollouts.jsonl (SIGKILL, out of memory) left a cut last line, and every resume then ended
    in json's traceback: the line is the step under way's, dropped. A bad line before the last is a ConfigError."""
    from dgrpo.config import ConfigError

    out = tmp_path / "run"
    ckpt = _fake_checkpoint(out / "checkpoints" / "step-00000002")
    rows = ['{"step": 0, "reward": 1}', '{"step": 1, "reward": 0}', '{"step": 2, "reward": 1}', '{"step": 3, "rew']
    (out / "rollouts.jsonl").write_text("\n".join(rows))
    with _run_dir(out, allow_config_change=True) as run, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run.checkpoint = ckpt
        run.start({"step": 2, "metrics_lines": 0})
    assert (out / "rollouts.jsonl").read_text().splitlines() == rows[:2]
    (out / "rollouts.jsonl").write_text("\n".join([rows[0], "{not json", rows[1]]) + "\n")
    with _run_dir(out, allow_config_change=True) as run, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run.checkpoint = ckpt
        with pytest.raises(ConfigError, match=r"rollouts\.jsonl line 2 is not a rollout row .*mend or delete"):
            run.start({"step": 2, "metrics_lines": 0})


def test_an_unfinished_run_without_checkpoints_restarted_under_another_config_is_warned_of(tmp_path):
    """checkpoints/ deleted (or a run killed before its first): a rerun with a changed config started over without a
    word, writing over config.json and metrics.jsonl. It still starts over (nothing is lost, and an out-of-memory
    error at the first step advises another batch setting), now with a warning naming the keys; the same config
    (up to neutral keys) starts over silently."""
    import warnings

    from dgrpo.config import ConfigError, to_dict

    out = tmp_path / "run"
    out.mkdir()
    config = json.dumps(to_dict(tiny_config(**{"grpo.lr": 5e-3})))
    (out / "config.json").write_text(config)
    (out / "metrics.jsonl").write_text('{"step": 1, "reward_mean": 0.5}\n')
    (out / "best").mkdir()  # (the earlier run's, under its config: removed, not left beside the new run's files)
    (out / "best" / "manifest.json").write_text("{}")
    with pytest.warns(UserWarning, match=r"different config \(grpo\.lr\) and no checkpoint to resume: it starts"):
        _run_dir(out).close(0)
    assert not (out / "best").exists()
    (out / "config.json").write_text(config)
    sft_row = '{"step": 1, "stage": 0, "loss": 1.0}\n'
    (out / "metrics.jsonl").write_text(sft_row)
    with pytest.raises(ConfigError, match="holds a `dgrpo sft` run, which `dgrpo grpo` cannot resume"):
        _run_dir(out)  # (another command's run: refused, not removed)
    (out / "metrics.jsonl").write_text('{"step": 1, "reward_mean": 0.5}\n')
    (out / "best").mkdir()
    (out / "best" / "manifest.json").write_text("{}")
    from_best = tiny_config(**{"grpo.lr": 1e-3, "model.name_or_path": str(out / "best")})
    with pytest.raises(ConfigError, match="would delete .*best, the model this run starts from"):
        _run_dir(out, cfg=from_best)  # (--init OUT/best: the removal would have deleted the model it starts from)
    assert (out / "best").is_dir()
    (out / "best" / "manifest.json").unlink()
    (out / "best").rmdir()
    (out / "metrics.jsonl").write_text('{"step": 1, "reward_mean": 0.5}\n')
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with _run_dir(out, cfg=tiny_config(**{"grpo.lr": 5e-3, "threads": 2, "fsdp": "full"})) as run:
            assert run.candidates == []
            run.start(None)
    assert not (out / "metrics.jsonl").read_text()


@pytest.mark.parametrize("command", ["sft", "grpo"])
def test_resume_never_refuses_another_commands_run_without_checkpoints(tmp_path, command):
    """An SFT run's copy with its checkpoints/ deleted, given to ``dgrpo grpo --resume never``: its final/, stage-K/
    and metrics were deleted (rc 0), though --resume never refuses another command's run. Whose run it is is read
    from what only one command writes, or from its metrics rows."""
    from dgrpo.config import ConfigError

    other = "grpo" if command == "sft" else "sft"
    for marker in ("layout", "metrics"):
        out = tmp_path / marker / other
        out.mkdir(parents=True)
        row = {"step": 5, "stage": 0, "loss": 1.0} if other == "sft" else {"step": 5, "reward_mean": 0.5}
        (out / "metrics.jsonl").write_text(json.dumps(row) + "\n")
        if marker == "layout":
            (out / "metrics.jsonl").write_text("")
            if other == "sft":
                (out / "stage-0").mkdir()
                (out / "stage-0" / "manifest.json").write_text("{}")
            else:
                (out / "summary.json").write_text("{}")
        before = sorted(p.relative_to(out) for p in out.rglob("*"))
        with pytest.raises(
            ConfigError, match=rf"holds a `dgrpo {other}` run, .*--resume never \(resume='never'\) would delete it"
        ):
            _run_dir(out, command=command, resume="never")
        assert sorted(p.relative_to(out) for p in out.rglob("*") if p.name != ".lock") == before
    mine = tmp_path / "mine"  # its own command's run: started over
    mine.mkdir()
    row = {"step": 5, "stage": 0} if command == "sft" else {"step": 5, "reward_mean": 0.5}
    (mine / "metrics.jsonl").write_text(json.dumps(row) + "\n")
    _run_dir(mine, command=command, resume="never").close()


@pytest.mark.parametrize("command", ["sft", "grpo"])
def test_another_commands_finished_run_without_checkpoints_is_refused_as_such(tmp_path, command):
    """Another command's finished run with its checkpoints/ deleted, given to the same --out: the line said 'to
    train it again, --resume never', which is then refused (another command's run); it now says whose run it is."""
    from dgrpo.config import ConfigError

    other = "grpo" if command == "sft" else "sft"
    out = tmp_path / other
    (out / "final").mkdir(parents=True)
    (out / "final" / "manifest.json").write_text("{}")
    row = {"step": 5, "stage": 0} if other == "sft" else {"step": 5, "reward_mean": 0.5}
    (out / "metrics.jsonl").write_text(json.dumps(row) + "\n")
    with pytest.raises(ConfigError, match=rf"holds a `dgrpo {other}` run, which `dgrpo {command}` cannot resume") as e:
        _run_dir(out, command=command)
    assert "--resume never" not in str(e.value)
    assert (out / "final").is_dir()


def test_leftovers_of_a_killed_final_best_or_stage_write_are_cleaned_at_start(tmp_path):
    """A kill during a final/, best/ or stage-K/ write left OUT/.tmp-final-PID (a whole model) forever: only
    checkpoints/.tmp-* was cleaned. dgrpo's own leftover names are now removed when the run starts (an earlier copy
    moved aside by a replace that never finished goes back to its place); nothing else is touched."""
    out = tmp_path / "run"
    ours = [".tmp-final-123", ".tmp-best-9", ".tmp-stage-2-77", ".old-best-5"]
    theirs = [".tmp-mine", ".tmp-final-x", ".old-final", "tmp-final-1", ".tmp-eval-3"]
    for name in ours + theirs + ["best", ".old-final-8"]:
        (out / name).mkdir(parents=True)
        (out / name / "manifest.json").write_text("{}")
    (out / ".tmp-stage-3-4").write_text("a file of the user's")
    _run_dir(out).close()
    left = sorted(p.name for p in out.iterdir())
    assert left == sorted([*theirs, ".lock", ".tmp-stage-3-4", "best", "final"])
    assert (out / "final" / "manifest.json").is_file()  # (.old-final-8: the kill came before the new final/)


def test_a_checkpoint_moved_aside_by_a_replace_that_never_finished_goes_back(tmp_path):
    """A kill between the two renames of a checkpoint's replacement (a rewound run writing a step again, or a LoRA
    run's checkpoint pointed to its moved base) left checkpoints/.old-step-N-PID and no step-N: that checkpoint was
    lost (listed before the clean-up, which then removed it). It goes back to its place before the run lists its
    checkpoints; one whose step-N is there is removed."""
    root = tmp_path / "run" / "checkpoints"
    for name in (".old-step-00000004-77", ".old-step-00000003-5", "step-00000003"):
        (root / name).mkdir(parents=True)
        (root / name / "manifest.json").write_text("{}")
        (root / name / "state.json").write_text(json.dumps({"trainer": {}}))
    with _run_dir(tmp_path / "run") as run:
        assert [p.name for p in run.candidates] == ["step-00000004", "step-00000003"]  # (the newest: resumed)
    assert sorted(p.name for p in root.iterdir()) == ["step-00000003", "step-00000004"]


def test_under_resume_never_an_earlier_copy_moved_aside_is_removed_not_restored(tmp_path):
    """--resume never removed stage-1/, then the leftovers' clean-up moved the earlier run's .old-stage-1-PID back to
    stage-1/: the old run's model inside the new run's directory."""
    out = tmp_path / "run"
    (out / ".old-stage-1-4242").mkdir(parents=True)
    (out / ".old-stage-1-4242" / "manifest.json").write_text("{}")
    (out / "metrics.jsonl").write_text('{"step": 1, "stage": 1, "loss": 1.0}\n')
    _run_dir(out, command="sft", resume=False).close()
    assert sorted(p.name for p in out.iterdir()) == [".lock", "metrics.jsonl"]  # (no stage-1/, no .old-stage-1-*)


def test_a_resume_compares_neither_fsdp_nor_a_loaded_models_builtin_sizes(tmp_path):
    """Runs begun before DGRPO_FSDP was recorded as the fsdp key (config.json: none) and before a run that loads a
    model recorded its shape (config.json: the built-in sizes) were refused as changed configs when resumed."""
    from dgrpo.config import ConfigError, to_dict

    out = tmp_path / "run"
    _fake_checkpoint(out / "checkpoints" / "step-00000004")
    started = tiny_config(**{"model.name_or_path": "/models/base", "fsdp": "none"})
    (out / "config.json").write_text(json.dumps(to_dict(started)))
    now = {"model.name_or_path": "/models/base", "fsdp": "full", "model.hidden_size": 1536, "model.num_layers": 28}
    with _run_dir(out, cfg=tiny_config(**now)) as run:
        assert run.changed == []
    with pytest.raises(ConfigError, match=r"config \(model.hidden_size, model.name_or_path\)"):  # (built-in: compared)
        _run_dir(out, cfg=tiny_config(**{**now, "model.name_or_path": "builtin-tiny", "model.num_layers": 2}))


def test_a_checkpoint_resumed_by_another_number_of_processes_says_so(tmp_path):
    """Allowed (the data order and the seeds do not depend on it) but not bit-identical: it went on without a word."""
    from dgrpo.training.distributed import Dist
    from dgrpo.training.run import RunDir

    out = tmp_path / "run"
    ckpt = _fake_checkpoint(out / "checkpoints" / "step-00000004")
    for written_by, says in ((2, True), (1, False), (None, False)):
        said: list[str] = []
        with RunDir(out, tiny_config(), Dist(), "grpo", log=said.append) as run:
            run.checkpoint = ckpt
            state = {"step": 4, "metrics_lines": 0, **({"world_size": written_by} if written_by else {})}
            run.start(state)
        notice = [m for m in said if "written by 2 process(es) and is resumed by 1" in m]
        assert bool(notice) == says, said


def test_a_resume_that_switches_between_lora_and_full_training_is_one_line(tmp_path):
    """model.lora.r=0 on a LoRA run's resume (with --allow-config-change): each checkpoint was skipped as damaged
    ("the manifest does not list model/config.json") and the line advised --resume never, which deletes the run."""
    from dgrpo.config import ConfigError, to_dict

    out = tmp_path / "run"
    _fake_checkpoint(out / "checkpoints" / "step-00000004")
    (out / "config.json").write_text(json.dumps(to_dict(tiny_config(**{"model.lora.r": 4}))))
    for r, says in (
        (0, "trains a LoRA adapter \\(model.lora.r=4\\).* resume it with model.lora.r=4"),
        (4, None),
    ):
        if says:
            with pytest.raises(ConfigError, match=says):
                _run_dir(out, cfg=tiny_config(**{"model.lora.r": r}), allow_config_change=True)
        else:  # (the same adapter, a changed config as any)
            _run_dir(out, cfg=tiny_config(**{"model.lora.r": r, "grpo.lr": 1e-3}), allow_config_change=True).close()


def test_a_resume_that_switches_master_weights_of_a_bf16_run_is_refused(tmp_path):
    """With --allow-config-change, switching model.master_weights on resume either failed to load the shards
    (fsdp: sharded) or stepped masters made before the checkpoint loaded (fsdp: full): the weights went back."""
    from dgrpo.config import ConfigError, to_dict

    out = tmp_path / "run"
    _fake_checkpoint(out / "checkpoints" / "step-00000004")
    bf16 = {"model.dtype": "bfloat16"}
    (out / "config.json").write_text(json.dumps(to_dict(tiny_config(**bf16))))
    with pytest.raises(ConfigError, match="holds no masters: resume it with model.master_weights=false"):
        _run_dir(out, cfg=tiny_config(**bf16, **{"model.master_weights": "true"}), allow_config_change=True)
    (out / "config.json").write_text(json.dumps(to_dict(tiny_config())))  # float32 weights: never a master
    _run_dir(out, cfg=tiny_config(**{"model.master_weights": "true"}), allow_config_change=True).close()


def test_a_sharded_runs_masters_are_not_resumed_at_another_dtype(tmp_path):
    """A whole checkpoint carries float32 masters across model.dtype (checkpoint.read_checkpoint); an fsdp: sharded
    run's masters live in its shards, which are not: resuming it at another model.dtype is refused, even with
    --allow-config-change; the same dtype, or a sharded run without masters, resumes."""
    from dgrpo.config import ConfigError, to_dict

    out = tmp_path / "run"
    _fake_checkpoint(out / "checkpoints" / "step-00000004")
    sharded = {"fsdp": "sharded", "model.master_weights": "true"}
    (out / "config.json").write_text(json.dumps(to_dict(tiny_config(**sharded, **{"model.dtype": "bfloat16"}))))
    with pytest.raises(ConfigError, match="fsdp: sharded with model.master_weights=true.* model.dtype=bfloat16"):
        _run_dir(out, cfg=tiny_config(**sharded), allow_config_change=True)
    _run_dir(out, cfg=tiny_config(**sharded, **{"model.dtype": "bfloat16"}, seed=3), allow_config_change=True).close()
    (out / "config.json").write_text(json.dumps(to_dict(tiny_config(fsdp="sharded", **{"model.dtype": "bfloat16"}))))
    _run_dir(out, cfg=tiny_config(fsdp="sharded"), allow_config_change=True).close()


def test_a_lora_runs_adapter_settings_are_left_to_the_adapters_comparison(tmp_path):
    """The config's model.lora.r / alpha / target_modules / train_latent_tokens of a LoRA run are compared on the
    adapters when the checkpoint loads (checkpoint.check_same_adapter): the config's comparison refused first,
    advising --allow-config-change, which the adapters' then refused (two refusals); and a run from an --init adapter
    recorded by older dgrpo with the values given was refused as changed, the same command given. Kept in the
    history; another key is refused as before."""
    from dgrpo.config import ConfigError, to_dict

    out = tmp_path / "run"
    _fake_checkpoint(out / "checkpoints" / "step-00000004")
    (out / "config.json").write_text(json.dumps(to_dict(tiny_config(**{"model.lora.r": 4}))))
    run = _run_dir(out, cfg=tiny_config(**{"model.lora.r": 8, "model.lora.train_latent_tokens": "false"}))
    assert run.changed == ["model.lora.r", "model.lora.train_latent_tokens"]
    run.close()
    with pytest.raises(ConfigError, match=r"a different config \(grpo.lr\)"):
        _run_dir(out, cfg=tiny_config(**{"model.lora.r": 8, "grpo.lr": 1e-3}))


def test_the_lora_dropout_a_run_recorded_is_no_config_change(tmp_path):
    """The adapter dropout is always 0, which a run now records; one that recorded the value given (0.1) resumes
    without --allow-config-change, and a resume given 0.1 is no change either."""
    from dgrpo.config import to_dict

    out = tmp_path / "run"
    _fake_checkpoint(out / "checkpoints" / "step-00000004")
    lora = {"model.lora.r": 4, "model.lora.alpha": 8.0}
    for recorded, given in ((0.1, 0.0), (0.0, 0.1)):
        (out / "config.json").write_text(json.dumps(to_dict(tiny_config(**lora, **{"model.lora.dropout": recorded}))))
        _run_dir(out, cfg=tiny_config(**lora, **{"model.lora.dropout": given})).close()


def test_a_checkpoint_of_another_optimizer_is_refused_as_the_runs_setting(tokenizer, tmp_path):
    """grpo.optimizer=adamw8bit runs torch AdamW on a CPU (warned) and the config records adamw8bit: the same
    command resumed on a GPU built bitsandbytes' AdamW8bit and loaded torch AdamW's state into it, unchecked."""
    from dgrpo.config import ConfigError
    from dgrpo.training.checkpoint import read_checkpoint, save_checkpoint

    from conftest import make_lm

    lm = make_lm(tokenizer)
    adamw = torch.optim.AdamW(lm.model.parameters(), lr=1e-3)
    save_checkpoint(tmp_path, 1, lm=lm, optimizer=adamw, keep_last=1, state={"trainer": {}})
    (ckpt,) = (tmp_path / "checkpoints").glob("step-*")
    assert json.loads((ckpt / "state.json").read_text())["optimizer_kind"] == "torch.optim.adamw.AdamW"
    read_checkpoint(ckpt, lm=lm, optimizer=torch.optim.AdamW(lm.model.parameters(), lr=1e-3))
    other = torch.optim.Adam(lm.model.parameters(), lr=1e-3)  # (its state has AdamW's shape: it loaded silently)
    with pytest.raises(
        ConfigError,
        match=r"holds the state of the optimizer torch.optim.adamw.AdamW, and this run "
        r"builds torch.optim.adam.Adam: resume it where it ran",
    ):
        read_checkpoint(ckpt, lm=lm, optimizer=other)


def test_the_optimizer_refusal_of_a_sharded_checkpoint_says_to_consolidate_its_weights_first(tmp_path):
    """An FSDP2-sharded checkpoint's model/ holds the config and tokenizer, its weights are in dcp/: --init of it
    alone has no weights to load, so the advice names `dgrpo consolidate` (and drops it once model/ has them)."""
    from dgrpo.config import ConfigError
    from dgrpo.training.checkpoint import check_same_optimizer
    from dgrpo.training.wording import command_line_words

    (tmp_path / "dcp").mkdir()
    (tmp_path / "model").mkdir()
    state = {"optimizer_kind": "bitsandbytes.optim.adamw.AdamW8bit"}
    adamw = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))])
    with command_line_words(), pytest.raises(ConfigError, match=rf"--init {tmp_path / 'model'} once `dgrpo conso"):
        check_same_optimizer(tmp_path, state, adamw)
    (tmp_path / "model" / "model.safetensors").write_bytes(b"")
    with command_line_words(), pytest.raises(ConfigError, match=rf"start a new run with --init {tmp_path / 'model'}$"):
        check_same_optimizer(tmp_path, state, adamw)


@pytest.mark.parametrize("mode", ["coconut", "pause"])
def test_an_epochs_validation_answers_with_its_stages_thoughts_before_any_stage_ended(tmp_path, monkeypatch, mode):
    """sft.eval_every_epoch within the first stage trained (here stage 1: a CoT checkpoint's curriculum, stage 0
    skipped) answers as that stage is trained: its mode, latent count and markers. The default validation read the
    model's settings, which only a stage's end set: it answered as the loaded model (a CoT import: no thoughts, no
    markers; a fresh model: continuous thoughts for a pause curriculum)."""
    from dgrpo.data.synthetic import generate_split
    from dgrpo.eval import evaluate as ev
    from dgrpo.model.factory import load_model
    from dgrpo.model.latent_lm import LatentSettings
    from dgrpo.training import run_inputs as run_mod
    from dgrpo.training.sft import train_sft

    over = {"task.n_train": 32, "sft.batch_size": 16, "sft.num_epochs": 2, "sft.stage_epochs": [0]}
    cfg = tiny_config(**over, **{"sft.mode": mode, "sft.eval_every_epoch": True, "sft.epochs_per_stage": 2})
    lm = load_model(cfg.model, cfg.task, seed=0)
    lm.settings = LatentSettings(mode="cot", markers=False)  # as dgrpo import-coconut writes a CoT-stage checkpoint
    layouts = []

    def recording(model, records, **kw):
        layouts.append(ev.answer_layout(model, kw.get("n_latent")))
        return ev.evaluate(model, records, **kw)

    monkeypatch.setattr(run_mod, "evaluate", recording)
    train = generate_split(cfg.task, "train")
    train_sft(lm, train, cfg, tmp_path / "sft", valid=train[:2], log=lambda *a: None, progress=False)
    assert layouts == [(1, mode, True)] * 2  # epoch 0 (within stage 1), epoch 1 (its end)


@pytest.mark.slow
def test_a_run_that_recorded_a_relative_data_path_resumes_with_it(sft_checkpoint, tmp_path, monkeypatch, run_cli):
    """A run records its data files by absolute path; one begun before that (``data.train`` recorded as typed,
    relative) resumes when given the same relative path again (it was refused as a changed config)."""
    from dgrpo.data.synthetic import generate_split

    monkeypatch.chdir(tmp_path)
    records = generate_split(tiny_config().task, "train")[:32]
    rows = [{"question": r.question, "steps": r.steps, "answer": r.answer} for r in records]
    for name in ("my_train.jsonl", "other.jsonl"):
        (tmp_path / name).write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "run"
    sets = {"grpo.steps": 1, "grpo.warmup_steps": 0, "data.train": "my_train.jsonl", "data.valid": ""}
    args = ["grpo", "--init", sft_checkpoint, *tiny_args(**sets)]
    assert run_cli(*args, "--out", out).returncode == 0
    config = json.loads((out / "config.json").read_text())
    assert config["data"]["train"] == str(tmp_path.resolve() / "my_train.jsonl")
    config["data"]["train"] = "my_train.jsonl"  # (as dgrpo up to 2026-12-04 recorded it)
    (out / "config.json").write_text(json.dumps(config))
    r = run_cli(*args, "--out", out)
    assert r.returncode == 0 and "resumed from" in r.stdout, r.stderr
    r = run_cli(*args, "--set", "data.train=other.jsonl", "--out", out)  # (another file is still a change)
    assert r.returncode == 2 and "a different config (data.train)" in r.stderr, r.stderr


@pytest.mark.filterwarnings("ignore:grpo.optimizer=adamw8bit runs on CUDA only")
@pytest.mark.filterwarnings("ignore:model.kernels=liger")
def test_a_grpo_run_records_what_it_applied_not_what_was_asked_and_each_resume_adds_its_own(tmp_path):
    """config.json says what was asked; on a CPU grpo.optimizer=adamw8bit ran torch AdamW and model.kernels=liger
    ran no kernels, said only by warnings that scrolled away. applied.json (written at the start: a stopped run has
    it) and summary.json's ``applied`` say what ran; a resume adds its own entry, a rewind drops the abandoned ones."""
    from dgrpo.data.synthetic import generate_split
    from dgrpo.model.factory import load_model
    from dgrpo.training.grpo import train_grpo

    asked = {"grpo.optimizer": "adamw8bit", "model.kernels": "liger", "grpo.engine": "auto", "fsdp": "sharded"}
    asked |= {"grpo.steps": 1}
    common = {"grpo.prompts_per_step": 2, "grpo.eval_every": 0, "grpo.warmup_steps": 0}
    cfg = tiny_config(**asked, **common, **{"data.test": "[]"})
    lm, out = load_model(cfg.model, cfg.task, seed=0), tmp_path / "run"
    train = generate_split(cfg.task, "train")[:8]
    summary = train_grpo(lm, cfg, train, out, progress=False, log=lambda *a: None)
    config = json.loads((out / "config.json").read_text())
    g, model = config["grpo"], config["model"]
    assert (g["optimizer"], model["kernels"], config["fsdp"]) == ("adamw8bit", "liger", "sharded")  # (as asked)
    [applied] = json.loads((out / "applied.json").read_text())
    assert applied == {"started_at_step": 0, **summary["applied"]}
    assert {k: applied[k] for k in ("device", "processes", "fsdp", "optimizer", "kernels", "master_weights")} == {
        "device": "cpu",
        "processes": 1,
        "fsdp": "none",
        "optimizer": "torch.optim.adamw.AdamW",
        "kernels": "none",
        "master_weights": False,
    }
    assert (applied["engine"], applied["keep_graphs"], applied["update_latent_graphs"]) == ("eager", False, False)
    assert (applied["dtype"], applied["compile"], applied["compile_head"], applied["pack_gqa"]) == (
        "float32",
        False,
        False,
        False,
    )
    assert applied["compile_fallbacks"] == 0  # (written again at the run's end: the same entry, as in summary.json)
    assert applied["versions"]["torch"] == torch.__version__ and "transformers" in applied["versions"]
    longer = tiny_config(**{**asked, "grpo.steps": 2}, **common, **{"data.test": "[]"})
    train_grpo(lm, longer, train, out, progress=False, log=lambda *a: None, allow_config_change=True)
    assert [e["started_at_step"] for e in json.loads((out / "applied.json").read_text())] == [0, 1]


def test_applied_json_keeps_an_entry_per_start_and_drops_those_a_rewind_abandons(tmp_path):
    """Each process that starts or resumes a run appends what it applied (another machine may resolve otherwise);
    one that starts at step N drops the entries of starts at N or later (their steps are trained anew)."""
    from dgrpo.training.applied import record_applied

    path = tmp_path / "applied.json"
    for step, device in ((0, "cpu"), (5, "cuda"), (9, "cuda")):
        record_applied(path, step, {"device": device})
    assert json.loads(path.read_text()) == [
        {"started_at_step": 0, "device": "cpu"},
        {"started_at_step": 5, "device": "cuda"},
        {"started_at_step": 9, "device": "cuda"},
    ]
    record_applied(path, 5, {"device": "cpu"})  # (a rewind to step 5)
    assert [(e["started_at_step"], e["device"]) for e in json.loads(path.read_text())] == [(0, "cpu"), (5, "cpu")]
    path.write_text("{}")
    with pytest.warns(UserWarning, match="applied.json is not a list of applied settings: written anew"):
        record_applied(path, 3, {"device": "cpu"})
    assert json.loads(path.read_text()) == [{"started_at_step": 3, "device": "cpu"}]


def test_applied_json_keeps_its_entries_when_a_stop_interrupts_its_rewrite(tmp_path, monkeypatch):
    """A stop rewrites this process's entry (a SIGTERM's, a non-finite stop's); a second SIGTERM or a kill within that
    write left a cut file, which the next process replaced with its own entry alone (with a warning): the earlier
    processes' entries were lost."""
    from pathlib import Path

    from dgrpo.training.applied import record_applied

    path = tmp_path / "applied.json"
    record_applied(path, 0, {"device": "cpu"})
    before = path.read_text()
    write_text = Path.write_text

    def cut(self, text, *a, **kw):  # (half the text written, then the stop)
        write_text(self, text[: len(text) // 2], *a, **kw)
        raise KeyboardInterrupt

    monkeypatch.setattr(Path, "write_text", cut)
    with pytest.raises(KeyboardInterrupt):
        record_applied(path, 0, {"device": "cuda"})
    monkeypatch.undo()
    assert path.read_text() == before and [p.name for p in tmp_path.iterdir()] == ["applied.json"]


def test_an_sft_run_records_what_it_applied(tmp_path):
    """SFT applies the fused kernels as GRPO does, here on a CPU none (it says so: model.kernels=liger was ignored
    without a word): its applied.json says none, and the optimizer its steps ran (torch AdamW; with bf16 weights and
    model.master_weights, float32 masters)."""
    from dgrpo.data.synthetic import generate_split
    from dgrpo.model.factory import load_model
    from dgrpo.training.sft import train_sft

    over = {"task.n_train": 16, "sft.num_epochs": 1, "model.kernels": "liger", "data.test": "[]"}
    cfg = tiny_config(**over, **{"model.dtype": "bfloat16", "model.master_weights": True})
    lm = load_model(cfg.model, cfg.task, seed=0)
    with pytest.warns(UserWarning, match="model.kernels=liger: Liger's Triton kernels need CUDA, the model is on cpu"):
        train_sft(lm, generate_split(cfg.task, "train"), cfg, tmp_path / "sft", log=lambda *a: None, progress=False)
    [applied] = json.loads((tmp_path / "sft" / "applied.json").read_text())
    assert applied["optimizer"] == "dgrpo.training.master_weights.MasterWeightAdamW" and applied["master_weights"]
    assert (applied["kernels"], applied["dtype"], applied["started_at_step"]) == ("none", "bfloat16", 0)
    assert "engine" not in applied  # (GRPO's rollouts)


@pytest.mark.slow
def test_compiled_layers_past_dynamo_recompile_limit_are_counted_in_applied_json(tmp_path, monkeypatch):
    """model.compile: a call that needs a graph past dynamo's recompile limit runs eagerly (dynamo's own fallback, said
    only in its log); applied.json, written at the start, said compile: true. Now a warning says so once, and the
    entry of the process that finished the run counts those calls (compile_fallbacks)."""
    from dgrpo.data.synthetic import generate_split
    from dgrpo.model import compiled_layers
    from dgrpo.model.factory import load_model
    from dgrpo.training.sft import train_sft

    monkeypatch.setattr(compiled_layers, "RECOMPILE_LIMIT", 1)
    torch._dynamo.reset()  # (graphs of the step another test compiled in this process would count)
    over = {"task.n_train": 16, "sft.num_epochs": 1, "data.test": "[]", "data.valid": "''"}
    cfg = tiny_config(**over, **{"model.compile": True, "model.compile_backend": "eager", "sft.max_latent_stage": 1})
    lm = load_model(cfg.model, cfg.task, seed=0)
    # (dynamo's own patch: monkeypatch.setattr on its config deletes the setting on undo, for every later test)
    with (
        torch._dynamo.config.patch(recompile_limit=1),  # (the prompt's call and a latent step's differ)
        pytest.warns(RuntimeWarning, match=r"model.compile: dynamo reached its recompile limit \(1 graphs\)"),
    ):
        train_sft(lm, generate_split(cfg.task, "train"), cfg, tmp_path / "sft", log=lambda *a: None, progress=False)
    [applied] = json.loads((tmp_path / "sft" / "applied.json").read_text())
    assert applied["compile"] and applied["compile_fallbacks"] == lm.compiled_layers.fallbacks > 0
    torch._dynamo.reset()


def test_an_sft_run_applies_the_fused_kernels_and_records_them(tmp_path, monkeypatch):
    """model.kernels=liger was the GRPO trainer's only: SFT trained with Hugging Face's layers, and its applied.json
    said none, without a word. SFT applies them to its model as GRPO does (Liger itself needs CUDA: stood in for)."""
    from dgrpo.data.synthetic import generate_split
    from dgrpo.model import factory
    from dgrpo.model.factory import load_model
    from dgrpo.training import sft

    calls = []
    monkeypatch.setattr(factory, "apply_kernels", lambda model, kind: calls.append((model, kind)) or kind == "liger")
    cfg = tiny_config(**{"task.n_train": 16, "sft.num_epochs": 1, "model.kernels": "liger", "data.test": "[]"})
    lm = load_model(cfg.model, cfg.task, seed=0)
    sft.train_sft(lm, generate_split(cfg.task, "train"), cfg, tmp_path / "sft", log=lambda *a: None, progress=False)
    assert calls == [(lm.model, "liger")]
    [applied] = json.loads((tmp_path / "sft" / "applied.json").read_text())
    assert applied["kernels"] == "liger"


def test_a_resume_under_a_changed_config_is_refused_before_the_data_and_the_model_are_read(
    tmp_path, run_cli, monkeypatch
):
    """``dgrpo sft`` resumed under a changed config was refused by the trainer's run directory, after every dataset
    was read and the model loaded (minutes at the paper's scale), and its line named the Python API's
    ``resume='never'`` / ``allow_config_change=True`` beside the flags. The run directory's config is enough: the
    refusal comes first, in the command line's words."""
    import dgrpo.cli.train as train
    import dgrpo.model.factory as factory

    sets = {"sft.num_epochs": 1, "task.n_train": 16, "sft.save_every": 0, "data.test": "[]", "data.valid": "''"}
    out = tmp_path / "run"
    assert run_cli("sft", "--out", out, *tiny_args(**sets)).returncode == 0

    def read(*a, **k):
        raise AssertionError("read before the refusal")

    monkeypatch.setattr(train, "read_setting", read)
    monkeypatch.setattr(factory, "load_model", read)
    r = run_cli("sft", "--out", out, *tiny_args(**{**sets, "sft.lr": 0.5}))
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1] == (
        f"dgrpo: error: {out} holds a run started with a different config (sft.lr); resume it unchanged, start over "
        "with --resume never, or pass --allow-config-change to continue with the new values (every config used is "
        "kept)"
    ), r.stderr


def test_a_resume_on_changed_training_data_from_the_command_line_names_its_flags_alone(tmp_path, run_cli):
    """The refusals the trainer's run directory makes (here: the training file's records changed, its path the same)
    named the Python API's ``resume='never'`` / ``allow_config_change=True`` beside the flags on the command line."""
    from dgrpo.data.synthetic import generate_split

    records = generate_split(tiny_config().task, "train")[:32]
    rows = [{"question": r.question, "steps": r.steps, "answer": r.answer} for r in records]
    data = tmp_path / "my_train.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows[:16]))
    sets = {"sft.num_epochs": 1, "sft.save_every": 0, "data.train": data, "data.test": "[]", "data.valid": "''"}
    out = tmp_path / "run"
    assert run_cli("sft", "--out", out, *tiny_args(**sets)).returncode == 0
    data.write_text("".join(json.dumps(row) + "\n" for row in rows[16:]))
    r = run_cli("sft", "--out", out, *tiny_args(**sets))
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1] == (
        f"dgrpo: error: {out / 'checkpoints' / 'step-00000001'} was trained on other training data than given now "
        "(16 records as now, other ones): resume with the same data, start over with --resume never, or pass "
        "--allow-config-change to go on"
    ), r.stderr


def test_a_reward_file_edited_during_a_run_is_told_at_the_resume(tmp_path):
    """The process runs the reward it imported at its start: a file edited during the run (here by the reward's calls
    on rollouts, 2 prompts x 4: the check of the golds at the start passes fewer) was hashed again in the end-of-run
    entry of applied.json, so the edit became the baseline and the resume said nothing. The entry keeps the imported
    file's hash, and the resume names the file."""
    from dgrpo.data.synthetic import generate_split
    from dgrpo.model.factory import load_model
    from dgrpo.plugins import source_hashes
    from dgrpo.training.grpo import train_grpo

    reward = tmp_path / "my_reward.py"
    reward.write_text(
        "from pathlib import Path\n\n\ndef reward(completions, records):\n"
        "    if len(completions) > 2:\n"
        "        Path(__file__).write_text(Path(__file__).read_text() + '# edited\\n')\n"
        "    return [0.0 for _ in completions]\n"
    )
    spec = f"{reward}:reward"
    before = source_hashes([spec])
    common = {"grpo.prompts_per_step": 2, "grpo.eval_every": 0, "grpo.warmup_steps": 0, "data.test": "[]"}
    lm, out = load_model(tiny_config().model, tiny_config().task, seed=0), tmp_path / "run"
    train = generate_split(tiny_config().task, "train")[:8]
    train_grpo(lm, tiny_config(**common, **{"grpo.steps": 1, "grpo.reward": spec}), train, out, progress=False)
    [entry] = json.loads((out / "applied.json").read_text())
    now = hashlib.sha256(reward.read_bytes()).hexdigest()
    assert entry["plugin_files"] == before != {str(reward.resolve()): now}  # (the start's hash; the file was edited)
    with pytest.warns(UserWarning, match="my_reward.py changed since this run's start at step 0"):
        cfg = tiny_config(**common, **{"grpo.steps": 2, "grpo.reward": spec})
        train_grpo(lm, cfg, train, out, progress=False, log=lambda *a: None, allow_config_change=True)


@pytest.mark.slow
def test_a_resume_after_the_reward_file_was_edited_warns_naming_it(tmp_path):
    """A config names a plug-in reward by its path: a resume after the file was edited trained on another reward
    without a word. applied.json records each plug-in file's hash; a resume whose file differs says so, naming it,
    and one on the same file says nothing."""
    from dgrpo.data.synthetic import generate_split
    from dgrpo.model.factory import load_model
    from dgrpo.training.grpo import train_grpo

    reward = tmp_path / "my_reward.py"
    reward.write_text("def reward(completions, records):\n    return [0.0 for _ in completions]\n")
    common = {"grpo.prompts_per_step": 2, "grpo.eval_every": 0, "grpo.warmup_steps": 0, "data.test": "[]"}
    common |= {"grpo.reward": f"{reward}:reward"}
    lm, out = load_model(tiny_config(**common).model, tiny_config().task, seed=0), tmp_path / "run"
    train = generate_split(tiny_config().task, "train")[:8]

    def run_to(steps: int) -> list[str]:
        cfg = tiny_config(**common, **{"grpo.steps": steps})
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            train_grpo(lm, cfg, train, out, progress=False, log=lambda *a: None, allow_config_change=True)
        return [str(w.message) for w in caught if "changed since this run's start" in str(w.message)]

    assert run_to(1) == []
    [first] = json.loads((out / "applied.json").read_text())
    assert list(first["plugin_files"]) == [str(reward.resolve())]
    assert run_to(2) == []  # (the same file: no word)
    reward.write_text("def reward(completions, records):\n    return [1.0 for _ in completions]\n")
    assert run_to(3) == [
        f"{reward.resolve()} changed since this run's start at step 1: the steps from 2 use the file as it is now; "
        "restore it to resume on the same code, or start a new run (resume='never')"
    ]


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:grpo.filter")
def test_a_resumed_grpo_run_keeps_best_by_its_mean_score(sft_checkpoint, tmp_path):
    """grpo.best_metric=mean_score across a resume: the checkpoint records best/'s mean score (LoopState's
    best_mean_score), so a resumed run's later validation of a higher accuracy but a lower mean score leaves best/
    at its step. A checkpoint without it (validated by a count, as by dgrpo before mean scores) still loads; its
    best/ is then replaced at the next validation that has a mean score."""
    from dgrpo.data.synthetic import generate_split
    from dgrpo.eval.evaluate import EvalResult
    from dgrpo.model.latent_lm import LatentLM
    from dgrpo.training.grpo import train_grpo

    base = {"grpo.steps": 4, "grpo.prompts_per_step": 2, "grpo.eval_every": 2, "grpo.save_every": 2}
    base |= {"grpo.warmup_steps": 0, "grpo.filter": "false", "grpo.max_new_tokens": 4, "grpo.keep_last": 9}
    base |= {"grpo.best_metric": "mean_score"}

    def run(out, results, **over):
        cfg, it = tiny_config(**{**base, **over}), iter(results)
        train = generate_split(cfg.task, "train")[:8]
        lm = LatentLM.from_pretrained(sft_checkpoint)
        change = {"allow_config_change": True} if over else {}
        evaluate_fn = lambda *a: next(it)  # noqa: E731
        train_grpo(lm, cfg, train, out, valid={"v": train[:4]}, evaluate_fn=evaluate_fn, progress=False, **change)
        return json.loads((out / "summary.json").read_text())

    def scored(correct, mean_score):
        return EvalResult("v", correct / 4, 4, correct, 0, 0, 0, "coconut", 0.0, mean_score=mean_score)

    out = tmp_path / "grpo"
    summary = run(out, [scored(1, 0.25), scored(1, 0.75), scored(2, 0.5)])  # best/: step 2 (0.75)
    assert (summary["best_step"], summary["best_mean_score"]) == (2, 0.75)
    summary = run(out, [scored(4, 0.7)], **{"grpo.steps": 6})  # step 6: all correct, a lower mean score
    assert (summary["best_step"], summary["best_accuracy"], summary["best_mean_score"]) == (2, 0.25, 0.75)
    assert _same_weights(out / "best", out / "checkpoints" / "step-00000002" / "model")
    old = tmp_path / "counted"
    run(old, [1, 3, 2], **{"grpo.best_metric": "accuracy"})  # best/: step 2, by a count (no mean score)
    state = json.loads((old / "checkpoints" / "step-00000004" / "state.json").read_text())
    assert "best_mean_score" not in state["loop"]  # (as dgrpo before it wrote the loop's state)
    summary = run(old, [scored(1, 0.3)], **{"grpo.steps": 6})  # under mean_score: best/ chosen anew, at step 6
    assert (summary["best_step"], summary["best_metric"], summary["best_mean_score"]) == (6, "mean_score", 0.3)


def test_a_resumed_sft_run_reads_its_best_by_the_best_metric(tmp_path):
    """SFT keeps best/'s record in its best_epoch metrics rows: a resume reads the value of sft.best_metric there
    (best/valid/mean_score), -1 (chosen anew) for a row without it (kept by a count, or by dgrpo before mean scores);
    accuracy as before."""
    from types import SimpleNamespace

    from dgrpo.training.distributed import Dist
    from dgrpo.training.sft import _resumed_best

    (tmp_path / "best").mkdir()

    def run(row):
        return SimpleNamespace(out_dir=tmp_path, metrics=SimpleNamespace(rows=lambda: [{"step": 1}, row]))

    row = {"step": 2, "best_epoch": 1, "best/valid/accuracy": 0.5, "best/valid/mean_score": 0.8}
    assert _resumed_best(run(row), Dist.single(), 0, "mean_score") == 0.8
    assert _resumed_best(run(row), Dist.single(), 0, "accuracy") == 0.5
    del row["best/valid/mean_score"]
    assert _resumed_best(run(row), Dist.single(), 0, "mean_score") == -1.0


@pytest.mark.slow
def test_a_grpo_run_carrying_every_kind_of_state_resumes_bit_identical_after_a_crash_and_a_sigterm(
    sft_checkpoint, tmp_path, monkeypatch
):
    """What a GRPO resume carries besides the weights and the optimizer, in one short run (a randomized fuzz of the
    GRPO options found no mismatch; this is its riskiest combination): the group filter skipping some steps (the skip
    counts), a dropped non-finite update (the guard's counts, its row whatever log_every), the KL reference renewed
    every 2 steps and beta annealed, 2 mini-epochs over micro-batches of 3, an epoch of 5 records wrapping (the data
    order), sampled rollouts and evaluations, best/. Stopped twice, by a crash in step 2 and by a SIGTERM
    in step 3, whose evaluation is due and left pending: the same final weights, metrics rows, best/, rollouts and
    summary as the run never stopped."""
    from dgrpo.data.synthetic import generate_split
    from dgrpo.model.factory import load_model
    from dgrpo.training import grpo
    from dgrpo.training.preemption import Terminated, sigterm_stops

    over = {"grpo.steps": 6, "grpo.prompts_per_step": 2, "grpo.filter": True, "grpo.alpha_min": 0.5}
    over |= {"grpo.alpha_max": 0.5, "grpo.beta0": 0.1, "grpo.ref_renewal_every": 2, "grpo.mini_epochs": 2}
    over |= {"grpo.micro_batch_size": 3, "grpo.lr": 5e-3, "grpo.warmup_steps": 2, "grpo.max_new_tokens": 8}
    over |= {"grpo.eval_every": 2, "grpo.save_every": 0, "grpo.log_every": 2, "grpo.log_rollouts": 2}
    over |= {"grpo.temperature": 1.0, "eval.temperature": 1.0, "eval.max_new_tokens": 8, "perturbation.p": 0.3}
    cfg = tiny_config(**over)
    train = generate_split(cfg.task, "train")[:5]
    valid = {"v": generate_split(cfg.task, "valid")[:6]}
    objective, stop = grpo.grpo_objective, {"crash": -1, "sigterm": -1}

    def coin(completions, records):  # (a reward of the text alone: mixed groups from this weak model)
        return [float(zlib.crc32(f"b{c}".encode()) % 2) for c in completions]

    def nan_in_step_1(*a, **kw):  # (a dropped update)
        loss, stats = objective(*a, **kw)
        return (loss * float("nan") if now["step"] == 1 else loss), stats

    step, now = grpo.GRPOTrainer.step, {"step": -1}

    def stepped(self, *a, **kw):
        now["step"] = self.step_idx
        if self.step_idx == stop["crash"]:
            raise RuntimeError("crash")
        m = step(self, *a, **kw)
        if self.step_idx - 1 == stop["sigterm"]:
            os.kill(os.getpid(), signal.SIGTERM)
        return m

    monkeypatch.setattr(grpo, "grpo_objective", nan_in_step_1)
    monkeypatch.setattr(grpo.GRPOTrainer, "step", stepped)

    def run(out):
        torch.manual_seed(0)
        lm = load_model(cfg.model, cfg.task, init=str(sft_checkpoint), seed=cfg.seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            grpo.train_grpo(lm, cfg, train, out, valid=valid, progress=False, log=lambda *a: None, reward_fn=coin)

    run(tmp_path / "a")
    stop["crash"] = 2  # (before any checkpoint: from the start again)
    with pytest.raises(RuntimeError, match="crash"):
        run(tmp_path / "b")
    stop.update(crash=-1, sigterm=3)
    with sigterm_stops(True), pytest.raises(Terminated):
        run(tmp_path / "b")
    stop["sigterm"] = -1
    run(tmp_path / "b")
    a, b = tmp_path / "a", tmp_path / "b"
    assert_same_run(a, b)
    steps = [r for r in rows(a) if "skipped" in r]  # (the runs do what they are meant to)
    assert any(r["skipped"] for r in steps if r["step"] < 3) and steps[-1]["nonfinite_skips"] == 2  # (2 mini-epochs)
    assert sum(r.get("ref_renewed", 0) for r in steps) > 0
    assert _same_weights(a / "best", b / "best")
    for name in ("summary.json", "rollouts.jsonl"):
        assert (a / name).read_text() == (b / name).read_text()


@pytest.mark.parametrize(
    "at, steps, refused",
    [((2,), 1, True), ((2,), 2, False), ((1, 2), 1, False)],
    ids=["shortened", "same_steps", "an_older_checkpoint_within"],
)
def test_a_shortened_grpo_resume_is_refused_before_the_model_loads(
    lora_base_dirs, tmp_path, monkeypatch, run_cli, at, steps, refused
):
    """dgrpo grpo resuming at a step past grpo.steps (a config change allowed, or a run without config.json): the
    refusal came once the data were read, the model loaded and the checkpoint read into it. It now comes from the
    checkpoints' state.json first; when an older checkpoint is within grpo.steps (the newest may be damaged, and the
    run resume there), it is left to the check made once the checkpoint is loaded."""
    from dgrpo.model.latent_lm import LatentLM
    from dgrpo.model.verified import CheckpointError

    for step in at:
        ckpt = tmp_path / "run" / "checkpoints" / f"step-{step:08d}"
        ckpt.mkdir(parents=True)
        (ckpt / "state.json").write_text(json.dumps({"trainer": {"step_idx": step}}))

    def loads(*args, **kwargs):
        raise CheckpointError("the model was loaded")

    monkeypatch.setattr(LatentLM, "from_pretrained", loads)
    sets = {"grpo.steps": steps, "task.n_train": 64, "task.n_valid": 8, "task.n_test": 8}
    r = run_cli("grpo", "--init", lora_base_dirs / "qwen2", "--out", tmp_path / "run", *tiny_args(**sets))
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    if not refused:
        assert "the model was loaded" in r.stderr
        return
    assert r.stderr == (
        f"dgrpo: error: grpo.steps = {steps} is below the step the run resumes at (2): a run cannot be shortened; "
        "resume with grpo.steps >= 2, or continue an earlier checkpoint in a new directory (--resume "
        "OUT/checkpoints/step-N --out NEW)\n"
    )


def test_an_sft_rewind_removes_the_stage_folders_the_abandoned_steps_wrote(tmp_path):
    """An SFT rewind (--resume OUT/checkpoints/step-N) removed the later checkpoints and final/, but kept the stage-K/
    folders the abandoned steps wrote: stopped before it wrote them anew (or ending short of that stage under a
    changed curriculum), the run left them as its own stage-K models (--init OUT/stage-K took them). Those named by a
    stage's end row past the checkpoint's metrics rows are removed, with a line; the earlier stages' stay, and an
    auto resume removes none."""
    from types import SimpleNamespace

    out = tmp_path / "run"
    ckpts = [_fake_checkpoint(out / "checkpoints" / f"step-0000000{n}", "sft") for n in (2, 4, 6, 8)]
    stages = []
    for k in range(4):
        stages.append(out / f"stage-{k}")
        stages[-1].mkdir()
        (stages[-1] / "manifest.json").write_text("{}")
    (out / "final").mkdir()
    (out / "final" / "manifest.json").write_text("{}")
    rows = []
    for k, step in enumerate((2, 4, 6, 8)):  # one epoch per stage: a training row, then the stage's end row
        rows += [{"step": step, "epoch": k, "stage": k, "n_latent": k}, {"step": step, "stage": k, "n_latent": k}]
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with _run_dir(out, "sft") as run:  # (auto: the newest resumed, nothing removed)
        run.resume(lambda c: SimpleNamespace(base=None))
        run.start({"step": 8, "metrics_lines": 8})
    assert all(s.is_dir() for s in stages) and (out / "final").is_dir()
    said: list[str] = []
    with _run_dir(out, "sft", resume=str(ckpts[1])) as run:  # step 4: after stage 1's end row (4 rows)
        run.log = said.append
        run.resume(lambda c: SimpleNamespace(base=None))
        run.start({"step": 4, "metrics_lines": 4})
    assert [s.is_dir() for s in stages] == [True, True, False, False] and not (out / "final").exists()
    assert any("removed stage-2/, stage-3/" in line and "abandons" in line for line in said), said
    assert not any(p.name.startswith(".tmp-") for p in out.iterdir())
