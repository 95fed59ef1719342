"""SIGTERM during a training command (a job scheduler's stop): within a step, the step finishes, a resumable
checkpoint of it is written and the run stops; the same command then ends bit-identical to a run never stopped.
Elsewhere, or a second time, it stops at once. In process, with the command line's handler installed."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from dgrpo.data.synthetic import generate_split
from dgrpo.model.factory import load_model
from dgrpo.training import grpo, sft
from dgrpo.training.distributed import fsdp2_missing
from dgrpo.training.guards import NonFiniteError, StalledError
from dgrpo.training.preemption import Terminated, sigterm_stops, within_step

from conftest import tiny_config

TIMING = {"time_s", "time_rollout_s", "time_update_s", "time_comm_s"}
GRPO_SETS = {"grpo.steps": 4, "grpo.save_every": 0, "grpo.eval_every": 0, "grpo.filter": False, "perturbation.p": 0.3}
#: FSDP2 training needs torch >= 2.13 (tests/test_distributed.py)
NEEDS_FSDP2 = pytest.mark.skipif(bool(fsdp2_missing()), reason="this torch's FSDP2 lacks what the sharded update sets")
SFT_SETS = {"task.n_train": 96, "sft.batch_size": 16, "sft.num_epochs": 2, "sft.save_every": 0, "data.valid": ""}


def quiet(*a):
    pass


def rows(out):
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(x).items() if k not in TIMING} for x in lines]


def same_run(a, b):
    wa, wb = load_file(str(a / "final" / "model.safetensors")), load_file(str(b / "final" / "model.safetensors"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert rows(a) == rows(b)


def checkpoints(out):
    return sorted(p.name for p in (out / "checkpoints").iterdir())


def sigterm_after(monkeypatch, cls, name, when, times=1):
    """``cls.name`` sends this process SIGTERM ``times`` times after the call for which ``when(self)`` holds."""
    original = getattr(cls, name)

    def patched(self, *a, **kw):
        out = original(self, *a, **kw)
        if when(self):
            for _ in range(times):
                os.kill(os.getpid(), signal.SIGTERM)
        return out

    monkeypatch.setattr(cls, name, patched)


def run_grpo(sft_checkpoint, out, sets=(), **kw):
    cfg = tiny_config(**GRPO_SETS, **dict(sets))
    lm = load_model(cfg.model, cfg.task, init=str(sft_checkpoint), seed=cfg.seed)
    grpo.train_grpo(lm, cfg, generate_split(cfg.task, "train")[:64], out, progress=False, log=quiet, **kw)


@pytest.fixture(scope="module")
def grpo_reference(sft_checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("grpo-ref")
    run_grpo(sft_checkpoint, out)
    return out


@pytest.mark.slow
def test_sigterm_within_a_grpo_step_checkpoints_it_and_the_run_resumes_bit_identical(
    sft_checkpoint, grpo_reference, tmp_path, monkeypatch, capsys
):
    out = tmp_path / "run"
    sigterm_after(monkeypatch, grpo.GRPOTrainer, "step", lambda t: t.step_idx == 2)
    with sigterm_stops(True), pytest.raises(Terminated):
        run_grpo(sft_checkpoint, out)
    assert "dgrpo: SIGTERM: stopping at the end of this step" in capsys.readouterr().err
    assert checkpoints(out) == ["step-00000002"] and not (out / "final").exists()  # (grpo.save_every = 0)
    monkeypatch.undo()
    run_grpo(sft_checkpoint, out)  # the same call resumes from it
    same_run(grpo_reference, out)


@pytest.mark.slow
def test_a_second_sigterm_or_one_outside_a_step_stops_at_once(sft_checkpoint, tmp_path, monkeypatch):
    """One stop delivered twice at once (srun, a wrapper script) is one SIGTERM: the step's checkpoint is written. A
    second one REPEAT_S later (here 0), or one outside a step, stops at once, with none."""
    from dgrpo.training import preemption

    sigterm_after(monkeypatch, grpo.GRPOTrainer, "step", lambda t: t.step_idx == 1, times=2)
    with sigterm_stops(True), pytest.raises(Terminated):
        run_grpo(sft_checkpoint, tmp_path / "forwarded")
    assert checkpoints(tmp_path / "forwarded") == ["step-00000001"]
    monkeypatch.setattr(preemption, "REPEAT_S", 0.0)
    with sigterm_stops(True), pytest.raises(Terminated):
        run_grpo(sft_checkpoint, tmp_path / "twice")
    assert not (tmp_path / "twice" / "checkpoints").exists()
    monkeypatch.undo()
    sigterm_after(monkeypatch, grpo.RunDir, "start", lambda run: True)  # before the first step
    with sigterm_stops(True), pytest.raises(Terminated):
        run_grpo(sft_checkpoint, tmp_path / "early")
    assert not (tmp_path / "early" / "checkpoints").exists()
    assert signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None)  # no handler left behind


def stopped_test_sets(calls):
    """A ``final_eval`` (the command line's test sets) that records its calls in ``calls`` and, at the first, gets a
    SIGTERM."""

    def final_eval(lm_, best):
        calls.append(best)
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return {"test/x/accuracy": 0.5}

    return final_eval


def trained_steps(monkeypatch, cls, name):
    """The calls of ``cls.name`` (a training step) from now on, counted in the returned list."""
    calls, original = [], getattr(cls, name)
    monkeypatch.setattr(cls, name, lambda self, *a, **kw: calls.append(1) or original(self, *a, **kw))
    return calls


@pytest.mark.slow
def test_sigterm_in_the_test_sets_leaves_a_grpo_run_unfinished_and_the_same_call_tests_it_without_training(
    sft_checkpoint, grpo_reference, tmp_path, monkeypatch
):
    """final/ and summary.json were written before the test sets (final_eval), so a run stopped there looked
    finished. They come last now: the stopped run has neither (its last step's checkpoint is there), and the same call
    trains no step, evaluates the test sets, and ends as the run never stopped."""
    out, calls = tmp_path / "run", []
    with sigterm_stops(True), pytest.raises(Terminated, match="in the test sets' evaluation .* final/ and summary"):
        run_grpo(sft_checkpoint, out, final_eval=stopped_test_sets(calls))
    assert not (out / "final").exists() and not (out / "summary.json").exists()
    assert checkpoints(out) == ["step-00000004"] and rows(out) == rows(grpo_reference)  # (no test row)
    steps = trained_steps(monkeypatch, grpo.GRPOTrainer, "step")
    run_grpo(sft_checkpoint, out, final_eval=stopped_test_sets(calls))
    assert steps == [] and calls == [None, None]
    assert rows(out) == [*rows(grpo_reference), {"step": 4, "test/x/accuracy": 0.5}]
    wa, wb = (load_file(str(run / "final" / "model.safetensors")) for run in (grpo_reference, out))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert (out / "summary.json").read_text() == (grpo_reference / "summary.json").read_text()


def run_grpo_evaluated(sft_checkpoint, out, evaluated=None):
    """GRPO_SETS with a validation every 2 steps (0, 2, 4), whose result draws on the torch RNG (as a sampled one
    would): a resumed run must evaluate from the RNG state of a run never stopped. ``evaluated``: a list each
    evaluation appends to."""
    from dgrpo.eval.evaluate import evaluate

    cfg = tiny_config(**{**GRPO_SETS, "grpo.eval_every": 2})
    lm = load_model(cfg.model, cfg.task, init=str(sft_checkpoint), seed=cfg.seed)

    def count_correct(lm_, recs):
        (evaluated if evaluated is not None else []).append(len(recs))
        correct = evaluate(lm_, recs, progress=False, max_new_tokens=cfg.eval.max_new_tokens).correct
        return min(len(recs), correct + int(torch.randint(0, 3, (1,))))

    valid = {"valid": generate_split(cfg.task, "valid")[:8]}
    train = generate_split(cfg.task, "train")[:64]
    torch.manual_seed(0)  # (step 0's draw: the same in every run)
    grpo.train_grpo(lm, cfg, train, out, valid=valid, evaluate_fn=count_correct, progress=False, log=quiet)


@pytest.fixture(scope="module")
def grpo_evaluated_reference(sft_checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("grpo-eval-ref")
    run_grpo_evaluated(sft_checkpoint, out)
    return out


@pytest.mark.parametrize("at", [2, 4], ids=["eval-step", "last-step"])
@pytest.mark.slow
def test_sigterm_in_a_step_due_an_evaluation_checkpoints_first_and_the_resumed_run_evaluates_it(
    sft_checkpoint, grpo_evaluated_reference, tmp_path, monkeypatch, at
):
    """A SIGTERM in a step whose evaluation is due (grpo.eval_every; the last step's) writes the step's checkpoint
    before that evaluation and stops without it (an evaluation of minutes spent the grace period: the watchdog, or
    Slurm's SIGKILL, then lost the step); the resumed run evaluates first, and the run ends bit-identical to one never
    stopped: metrics rows, best/, summary.json, final/."""
    out, evaluated = tmp_path / "run", []
    sigterm_after(monkeypatch, grpo.GRPOTrainer, "step", lambda t: t.step_idx == at)
    with sigterm_stops(True), pytest.raises(Terminated):
        run_grpo_evaluated(sft_checkpoint, out, evaluated)
    assert len(evaluated) == at // 2  # the evaluations before the step's (0, and at step 4, 2)
    assert checkpoints(out) == [f"step-{at:08d}"] and not (out / "final").exists()
    assert [r["step"] for r in rows(out) if "eval/valid/accuracy" in r] == list(range(0, at, 2))
    monkeypatch.undo()
    evaluated.clear()
    run_grpo_evaluated(sft_checkpoint, out, evaluated)
    assert len(evaluated) == 1 + (4 - at) // 2  # the pending evaluation first, then those after it
    same_run(grpo_evaluated_reference, out)
    assert [r["step"] for r in rows(out) if "eval/valid/accuracy" in r] == [0, 2, 4]
    a, b = (load_file(str(run / "best" / "model.safetensors")) for run in (grpo_evaluated_reference, out))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert (out / "summary.json").read_text() == (grpo_evaluated_reference / "summary.json").read_text()


def run_sft(out, sets=(), **kw):
    cfg = tiny_config(**SFT_SETS, **dict(sets))
    torch.manual_seed(0)
    lm = load_model(cfg.model, cfg.task, seed=0)
    sft.train_sft(lm, generate_split(cfg.task, "train"), cfg, out, progress=False, log=quiet, **kw)


@pytest.mark.slow
def test_sigterm_in_the_test_sets_leaves_an_sft_run_unfinished_and_the_same_call_tests_it_without_training(
    tmp_path, monkeypatch
):
    """As for GRPO: final/ comes after the test sets; a run stopped in them has none, and the same call trains no
    step, evaluates them, and writes the final/ of a run never stopped."""
    reference, out, calls = tmp_path / "ref", tmp_path / "run", []
    run_sft(reference)
    with sigterm_stops(True), pytest.raises(Terminated, match=r"in the test sets' evaluation .* final/ comes"):
        run_sft(out, final_eval=stopped_test_sets(calls))
    assert not (out / "final").exists() and checkpoints(out) == ["step-00000006", "step-00000012"]
    steps = trained_steps(monkeypatch, sft.SFTRun, "step")
    run_sft(out, final_eval=stopped_test_sets(calls))
    assert steps == [] and calls == [None, None]
    assert rows(out) == [*rows(reference), {"step": 12, "test/x/accuracy": 0.5}]
    wa, wb = (load_file(str(run / "final" / "model.safetensors")) for run in (reference, out))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.slow  # (three SFT runs each)
@pytest.mark.parametrize("at", [2, 6], ids=["mid-epoch", "epoch-end"])
def test_sigterm_within_an_sft_step_checkpoints_and_the_run_resumes_bit_identical(tmp_path, monkeypatch, at):
    """6 steps per epoch: a SIGTERM in step 2 writes step 2's checkpoint; in the epoch's last step, step 6's too,
    before the epoch's end (its evaluation, stage-K/, best/), which the resumed run does first."""
    reference = tmp_path / "ref"
    run_sft(reference)
    out = tmp_path / "run"
    sigterm_after(monkeypatch, sft.SFTRun, "step", lambda r: r.prog.global_step == at)
    with sigterm_stops(True), pytest.raises(Terminated):
        run_sft(out)
    assert checkpoints(out) == [f"step-{at:08d}"]
    monkeypatch.undo()
    run_sft(out)
    same_run(reference, out)


def run_sft_evaluated(out, evaluated=None):
    """SFT_SETS in two stages of one epoch (6 steps each), each epoch validated (its stage's end: stage-K/; the last
    one's best/), the result drawing on the torch RNG; ``evaluated``: a list each evaluation appends to."""
    from dgrpo.eval.evaluate import evaluate

    cfg = tiny_config(**{**SFT_SETS, "sft.epochs_per_stage": 1, "sft.eval_every_epoch": True})

    def count_correct(lm_, recs, settings):
        (evaluated if evaluated is not None else []).append(len(recs))
        correct = evaluate(lm_, recs, progress=False, max_new_tokens=8, n_latent=settings.n_latent).correct
        return min(len(recs), correct + int(torch.randint(0, 3, (1,))))

    torch.manual_seed(0)
    lm = load_model(cfg.model, cfg.task, seed=0)
    train, valid = generate_split(cfg.task, "train"), generate_split(cfg.task, "valid")[:8]
    sft.train_sft(lm, train, cfg, out, valid=valid, evaluate_fn=count_correct, progress=False, log=quiet)


@pytest.mark.slow  # (three SFT runs each)
@pytest.mark.parametrize("at", [6, 12], ids=["stage-end", "last-step"])
def test_sigterm_in_an_sft_epochs_last_step_checkpoints_before_its_evaluation(tmp_path, monkeypatch, at):
    """A SIGTERM in an epoch's last step writes the checkpoint before the epoch's evaluation, stage-K/ and best/;
    the resumed run does them first and ends bit-identical to a run never stopped."""
    reference, out, evaluated = tmp_path / "ref", tmp_path / "run", []
    run_sft_evaluated(reference)
    sigterm_after(monkeypatch, sft.SFTRun, "step", lambda r: r.prog.global_step == at)
    with sigterm_stops(True), pytest.raises(Terminated):
        run_sft_evaluated(out, evaluated)
    assert len(evaluated) == at // 6 - 1 and checkpoints(out)[-1] == f"step-{at:08d}"
    assert not any(r["step"] == at and "eval/valid/accuracy" in r for r in rows(out))
    monkeypatch.undo()
    run_sft_evaluated(out)
    same_run(reference, out)
    assert checkpoints(out) == checkpoints(reference)
    for kept in ("best", "stage-0", "stage-1"):
        a, b = (load_file(str(run / kept / "model.safetensors")) for run in (reference, out))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), kept


@pytest.mark.slow  # (three GRPO runs each)
@pytest.mark.parametrize("lora_r", [0, 4], ids=["full", "lora"])
def test_a_run_interrupted_in_process_goes_on_with_the_same_model_object(sft_checkpoint, tmp_path, monkeypatch, lora_r):
    """Ctrl-C in a notebook, then the same cell again: train_grpo with the model object it had been training goes on
    from the newest checkpoint and ends as a run never stopped (under LoRA the second call failed: "Adapter with
    name 'reference' already exists")."""
    if lora_r:
        pytest.importorskip("peft")
    cfg = tiny_config(**{**GRPO_SETS, "grpo.save_every": 1, "model.lora.r": lora_r})
    train = generate_split(cfg.task, "train")[:64]

    def model():
        return load_model(cfg.model, cfg.task, init=str(sft_checkpoint), seed=cfg.seed)

    grpo.train_grpo(model(), cfg, train, tmp_path / "ref", progress=False, log=quiet)
    lm = model()
    sigterm_after(monkeypatch, grpo.GRPOTrainer, "step", lambda t: t.step_idx == 2)
    monkeypatch.setattr(os, "kill", lambda pid, sig: (_ for _ in ()).throw(KeyboardInterrupt))  # Ctrl-C there
    with pytest.raises(KeyboardInterrupt):
        grpo.train_grpo(lm, cfg, train, tmp_path / "run", progress=False, log=quiet)
    monkeypatch.undo()
    grpo.train_grpo(lm, cfg, train, tmp_path / "run", progress=False, log=quiet)
    weights = "adapter_model.safetensors" if lora_r else "model.safetensors"
    a, b = (load_file(str(tmp_path / r / "final" / weights)) for r in ("ref", "run"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert rows(tmp_path / "ref") == rows(tmp_path / "run")


def torchrun_sets(fsdp="none"):
    """The settings of ``torchrun_grpo``'s run (over conftest.tiny_args)."""
    sets = {**GRPO_SETS, "grpo.steps": 5, "grpo.prompts_per_step": 4, "threads": 1, "data.test": "[]", "fsdp": fsdp}
    sets["data.valid"] = "''"  # (no evaluation: three launches of torchrun are this test's time)
    return sets


def torchrun_grpo(sft_checkpoint, out, fsdp="none", entry=("-m", "dgrpo"), **popen):
    """``torchrun ... -m dgrpo grpo`` of 5 steps on 2 ranks (``entry``: what the workers run, ``-m dgrpo``)."""
    from conftest import tiny_args

    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *entry, "grpo"]
    cmd += ["--init", str(sft_checkpoint), "--out", str(out), *tiny_args(**torchrun_sets(fsdp))]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, **popen)


def wait_for_two_steps(out, timeout=240):
    """Until the run in ``out`` has logged two steps."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        m = out / "metrics.jsonl"
        if m.exists() and sum('"reward_mean"' in x for x in m.read_text().splitlines()) >= 2:
            return
        time.sleep(0.05)


@pytest.fixture(scope="module")
def torchrun_references(sft_checkpoint, tmp_path_factory) -> dict:
    """``torchrun_grpo``'s runs never stopped, without FSDP2 and, where this torch has it, with (fsdp full): one launch
    (test_distributed's scenario ``runs``, through ``dgrpo.cli.main``; a launch's time is mostly its workers' start-up
    and teardown), a folder per mode."""
    from test_distributed import runs, torchrun

    tmp, modes = tmp_path_factory.mktemp("torchrun-ref"), ["none"] + ([] if fsdp2_missing() else ["full"])
    argv = ["grpo", "--init", str(sft_checkpoint), "--out"]
    torchrun(
        "runs", tmp, runs([("cli", tmp, {"argv": [*argv, str(tmp / m)], "sets": torchrun_sets(m)}, {}) for m in modes])
    )
    return {m: tmp / m for m in modes}


@pytest.mark.slow
@pytest.mark.parametrize("fsdp", ["none", pytest.param("full", marks=NEEDS_FSDP2)], ids=["allreduce", "fsdp2"])
def test_sigterm_to_every_process_of_a_torchrun_job_checkpoints_one_step_and_resumes_bit_identical(
    sft_checkpoint, torchrun_references, tmp_path, fsdp
):
    """As a scheduler stops a job (SIGTERM to the launcher and each worker; torchrun forwards a second one to each):
    the ranks agree on one step, rank 0 writes its checkpoint (under FSDP2 every rank first gathers the state to it),
    the same torchrun command goes on from it and ends as a run never stopped. (The workers died at once: the steps
    since the last checkpoint were lost.)"""
    out = tmp_path / "run"
    job = torchrun_grpo(sft_checkpoint, out, fsdp, start_new_session=True)
    wait_for_two_steps(out)
    os.killpg(job.pid, signal.SIGTERM)
    _, err = job.communicate(timeout=120)
    assert job.returncode != 0
    assert err.count("dgrpo: terminated (SIGTERM) after step ") == 1, err[-3000:]
    # rank 0's one notice: "at the end of this step" inside a step, "where the ranks next agree" when the signal
    # lands between two (the one wording was asserted, and a signal between steps failed the test)
    assert err.count("dgrpo: SIGTERM: every rank stops") == 1, err[-3000:]
    names = checkpoints(out)  # (grpo.save_every = 0: only the stop's)
    assert len(names) == 1 and int(names[0][len("step-") :]) >= 2 and not (out / "final").exists(), names
    said = f"after step {int(names[0][len('step-') :])}, checkpointed in {out / 'checkpoints' / names[0]}; the same"
    assert said in err, err[-3000:]  # (the stop line names the step and its checkpoint)
    again = torchrun_grpo(sft_checkpoint, out, fsdp)
    _, err = again.communicate(timeout=300)
    assert again.returncode == 0, err[-3000:]
    same_run(torchrun_references[fsdp], out)


@pytest.mark.slow
def test_ctrl_c_under_torchrun_is_one_line(sft_checkpoint, tmp_path):
    """Ctrl-C (SIGINT to the terminal's process group: torchrun and every worker, then torchrun forwards it to each)
    printed "dgrpo: interrupted" once per rank."""
    job = torchrun_grpo(sft_checkpoint, tmp_path / "run", start_new_session=True)
    wait_for_two_steps(tmp_path / "run")
    os.killpg(job.pid, signal.SIGINT)
    _, err = job.communicate(timeout=120)
    assert err.count("dgrpo: interrupted") == 1, err[-3000:]


def worker_pids(launcher: int) -> dict[int, int]:
    """torchrun's workers by their global rank (their RANK, read from /proc)."""
    from conftest import child_pids

    found = {}
    for pid in child_pids(launcher):
        env = dict(v.split("=", 1) for v in open(f"/proc/{pid}/environ").read().split("\0") if "=" in v)
        found[int(env["RANK"])] = pid
    return found


@pytest.mark.slow
def test_sigint_to_one_worker_alone_is_one_line_from_rank_0(sft_checkpoint, tmp_path):
    """SIGINT to rank 1 alone (not Ctrl-C, which torchrun sends to every worker and rank 0 says for all): rank 1 ended
    without a word and rank 0 printed gloo's 35-line traceback. Rank 0 says in one line that another rank ended."""
    job = torchrun_grpo(sft_checkpoint, tmp_path / "run", start_new_session=True)
    wait_for_two_steps(tmp_path / "run")
    os.kill(worker_pids(job.pid)[1], signal.SIGINT)
    _, err = job.communicate(timeout=120)
    assert job.returncode == 1 and "exitcode  : 130" in err, err[-3000:]
    assert err.count("dgrpo: error: another rank ended mid-run (interrupted, killed or failed") == 1, err[-3000:]
    assert "[rank0]: Traceback" not in err and "dgrpo: interrupted" not in err, err[-3000:]


SLOW_RANK_1 = """
import os, sys, time

from dgrpo.cli import main

code = main(sys.argv[1:])
if os.environ["RANK"] == "1":
    time.sleep(3)  # rank 1 ends after rank 0 (a tracker's upload, a large model's memory given back)
sys.exit(code)
"""


@pytest.mark.slow
@pytest.mark.parametrize("to", ["workers", "launcher"])
def test_a_preempted_torchrun_job_checkpoints_every_rank_exits_on_its_own_and_it_resumes(sft_checkpoint, tmp_path, to):
    """SIGTERM to the workers alone (rank 0 exits first, then torchrun sends SIGTERM to the others: rank 1, still
    ending, died of it, reported as "Signal 15 (SIGTERM) received") or to torchrun alone (a container's first
    process: torchrun forwards it): the checkpoint is written, the ranks exit with 143 on their own, and the same
    command resumes it to the end. torchrun exits 1 either way: a worker's 143 is a failure to it, and a SIGTERM to
    torchrun itself is re-raised as its SignalException (docs/distributed.md says how to tell a clean stop)."""
    from conftest import child_pids

    (tmp_path / "worker.py").write_text(SLOW_RANK_1)
    out = tmp_path / "run"
    job = torchrun_grpo(sft_checkpoint, out, entry=[str(tmp_path / "worker.py")], start_new_session=True)
    wait_for_two_steps(out)
    for pid in child_pids(job.pid) if to == "workers" else [job.pid]:
        os.kill(pid, signal.SIGTERM)
    _, err = job.communicate(timeout=120)
    assert job.returncode == 1, err[-3000:]
    assert err.count("; the same command resumes from it") == 1, err
    (stopped_at,) = checkpoints(out)
    assert f"dgrpo: terminated (SIGTERM) after step {int(stopped_at[5:])}, checkpointed in " in err, err[-3000:]
    if to == "workers":  # (torchrun's report of its failed workers)
        assert err.count("exitcode  : 143") == 2 and "Signal 15" not in err, err[-3000:]
    else:
        assert "SignalException: Process" in err and "forcefully exiting" not in err, err[-3000:]
    assert len(checkpoints(out)) == 1 and not (out / "final").exists()
    again = torchrun_grpo(sft_checkpoint, out)
    _, err = again.communicate(timeout=300)
    assert again.returncode == 0, err[-3000:]
    assert [r["step"] for r in rows(out) if "reward_mean" in r] == list(range(5)) and (out / "final").is_dir()


LATE_SIGTERM = """
import os, signal, sys, time
from pathlib import Path

from dgrpo.cli import main
from dgrpo.training import grpo
from dgrpo.training.distributed import Dist


def stop_the_workers():  # (rank 0: SIGTERM to every worker, as a scheduler's stop of the job's tasks)
    if os.environ["RANK"] == "0":
        for f in Path(f"/proc/{os.getppid()}/task").glob("*/children"):
            for pid in f.read_text().split():
                os.kill(int(pid), signal.SIGTERM)
        time.sleep(0.5)  # (the signals land)


if LATE == "checkpoint":  # the last step's, written after the ranks' last agreement in the loop
    save = grpo._save_resumable

    def _save_resumable(run, trainer, loop):
        if trainer.step_idx == trainer.cfg.grpo.steps:
            stop_the_workers()
        return save(run, trainer, loop)

    grpo._save_resumable = _save_resumable
else:  # final/, written after the run's last agreement
    save_model = Dist.save_model

    def _save_model(self, lm, path):
        if Path(path).name == "final":
            stop_the_workers()
        return save_model(self, lm, path)

    Dist.save_model = _save_model
sys.exit(main(sys.argv[1:]))
"""


#: rank 0's notice of a SIGTERM outside a step (an evaluation, a checkpoint's write)
NOT_IN_A_STEP = (
    "every rank stops where the ranks next agree: after the next step, with its resumable checkpoint, or at the run's "
    "end"
)


@pytest.mark.slow
@pytest.mark.parametrize("late", ["checkpoint", "final"])
def test_a_sigterm_to_a_torchrun_job_after_its_last_agreement_does_what_rank_0_says(sft_checkpoint, tmp_path, late):
    """A SIGTERM to every worker as the last step's checkpoint was written (after the ranks' last agreement in the
    loop), or as final/ was: rank 0 said "every rank stops at the end of this step", and the run finished, exit 0.
    Now the ranks stop once the checkpoint is written (the same command ends the run, training no step), or, final/
    under way, rank 0 says that the run finishes, and it does."""
    (tmp_path / "worker.py").write_text(f"LATE = {late!r}\n{LATE_SIGTERM}")
    out = tmp_path / "run"
    job = torchrun_grpo(sft_checkpoint, out, entry=[str(tmp_path / "worker.py")])
    _, err = job.communicate(timeout=300)
    if late == "final":
        assert job.returncode == 0, err[-3000:]
        assert err.count("dgrpo: SIGTERM: the run is writing its end (final/ and summary.json): it finishes") == 1, err
        assert "dgrpo: terminated" not in err and (out / "final").is_dir() and (out / "summary.json").is_file()
        return
    assert job.returncode == 1, err[-3000:]  # (each worker's 143)
    assert err.count(f"dgrpo: SIGTERM: {NOT_IN_A_STEP}") == 1, err  # (the last step's checkpoint under way)
    stopped = (
        "dgrpo: terminated (SIGTERM) at the run's end, before final/ and summary.json (the training is done and "
        f"checkpointed); the same command resumes from the newest checkpoint in {out}/checkpoints"
    )
    assert err.count(stopped) == 1, err[-3000:]
    assert checkpoints(out) == ["step-00000005"] and not (out / "final").exists()
    again = torchrun_grpo(sft_checkpoint, out)
    _, err = again.communicate(timeout=300)
    assert again.returncode == 0, err[-3000:]
    assert [r["step"] for r in rows(out) if "reward_mean" in r] == list(range(5)) and (out / "final").is_dir()


BLOCKED_RANK = """
import os, sys, time, torch, torch.distributed as dist
from dgrpo.training.preemption import sigterm_stops, within_step
dist.init_process_group("gloo")
with sigterm_stops(True, distributed=True), within_step():  # (a step: before the first, the watchdog waits 5 s)
    print("ready", flush=True)
    if dist.get_rank() == 1:
        time.sleep(60)  # a peer that does not come (hung, or dead without its process group noticing)
    dist.all_reduce(torch.zeros(1))  # rank 0 waits here, in C++: Python's SIGTERM handler cannot run
print("returned", flush=True)
"""


@pytest.mark.slow
def test_a_rank_blocked_in_a_collective_still_ends_after_the_grace_period(tmp_path):
    """Under torchrun a SIGTERM only asks; a rank waiting in a collective for a peer never runs Python's handler, so
    the watchdog thread (woken through the wakeup file descriptor) ends it DGRPO_SIGTERM_GRACE_S after the signal.
    (An alarm armed by the handler was never armed there.)"""
    import socket

    (tmp_path / "blocked.py").write_text(BLOCKED_RANK)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2"}
    env["DGRPO_SIGTERM_GRACE_S"] = "1.5"
    ranks = [
        subprocess.Popen(
            [sys.executable, str(tmp_path / "blocked.py")],
            env={**env, "RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    try:
        lines = iter(ranks[0].stdout.readline, "")  # (some torch versions' gloo prints its connections first)
        assert any(line.strip() == "ready" for line in lines)
        time.sleep(1.0)  # (in the all-reduce by now)
        t0 = time.time()
        ranks[0].send_signal(signal.SIGTERM)
        assert ranks[0].wait(timeout=30) == 128 + signal.SIGTERM
        assert time.time() - t0 < 10
        err = ranks[0].stderr.read()
        assert "no stop within DGRPO_SIGTERM_GRACE_S = 1.5 s of SIGTERM" in err, err
        assert "(a rank blocked, or a long step or evaluation): exiting before it ended (nothing of it written)" in err
    finally:
        for p in ranks:
            p.kill()
            p.wait()


def test_a_bad_grace_period_is_one_config_line(monkeypatch):
    from dgrpo.config import ConfigError

    for bad in ("", "90s", "0", "-1", "nan", "inf"):
        monkeypatch.setenv("DGRPO_SIGTERM_GRACE_S", bad)
        if bad == "":
            with sigterm_stops(True, distributed=True):  # unset or empty: the default
                pass
            continue
        with pytest.raises(ConfigError, match="DGRPO_SIGTERM_GRACE_S"), sigterm_stops(True, distributed=True):
            pass
    assert signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None)


@pytest.mark.slow
def test_a_model_stopped_mid_run_without_a_checkpoint_is_not_started_afresh(sft_checkpoint, tmp_path, monkeypatch):
    """Ctrl-C before the first checkpoint, then the same call again: it started at step 0 from weights already
    trained two steps (and, under LoRA, took its KL reference from them), silently. Now one line says to load the
    model again; a model that finished a run goes on to the next one (SFT then GRPO on one object)."""
    from dgrpo.config import ConfigError

    cfg = tiny_config(**GRPO_SETS)  # (grpo.save_every = 0)
    train = generate_split(cfg.task, "train")[:64]
    lm = load_model(cfg.model, cfg.task, init=str(sft_checkpoint), seed=cfg.seed)
    sigterm_after(monkeypatch, grpo.GRPOTrainer, "step", lambda t: t.step_idx == 2)
    monkeypatch.setattr(os, "kill", lambda pid, sig: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        grpo.train_grpo(lm, cfg, train, tmp_path / "run", progress=False, log=quiet)
    monkeypatch.undo()
    for out in (tmp_path / "run", tmp_path / "elsewhere"):
        with pytest.raises(ConfigError, match=r"holds the weights of a run that stopped mid-way \(.*run\)"):
            grpo.train_grpo(lm, cfg, train, out, progress=False, log=quiet)
    fresh = load_model(cfg.model, cfg.task, init=str(sft_checkpoint), seed=cfg.seed)
    grpo.train_grpo(fresh, cfg, train, tmp_path / "again", progress=False, log=quiet)
    grpo.train_grpo(fresh, cfg, train, tmp_path / "next", progress=False, log=quiet)  # a finished run's model: fine


def test_a_stop_agreed_from_another_ranks_sigterm_is_announced_by_rank_0(capsys):
    """A SIGTERM that reached rank 1 alone stopped every rank with no word from rank 0 until the exit line."""
    from types import SimpleNamespace

    from dgrpo.training.preemption import stop_requested

    def ranks(asked_elsewhere: bool, is_main: bool) -> SimpleNamespace:  # (max_float: the agreement's all-reduce)
        return SimpleNamespace(active=True, is_main=is_main, max_float=lambda v: max(v, float(asked_elsewhere)))

    with sigterm_stops(True, distributed=True):
        assert not stop_requested(ranks(False, True)) and capsys.readouterr().err == ""
        assert stop_requested(ranks(True, True)) and stop_requested(ranks(True, True))
        assert capsys.readouterr().err.count("dgrpo: SIGTERM (to another rank): every rank stops now") == 1
    with sigterm_stops(True, distributed=True):
        assert stop_requested(ranks(True, False)) and capsys.readouterr().err == ""  # (rank 1: rank 0 says it)


def test_a_torchrun_worker_stops_at_its_first_sigint_and_ignores_the_next():
    """torchrun sends SIGINT to every worker at a Ctrl-C, and again as they end: a second KeyboardInterrupt, raised
    while a worker wrote its stop or exited, printed a traceback (3 runs in 7). One process keeps Python's handler."""
    before = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(KeyboardInterrupt), sigterm_stops(True, distributed=True):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
        os.kill(os.getpid(), signal.SIGINT)  # (ignored: the process is ending)
        time.sleep(0.1)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        signal.signal(signal.SIGINT, before)
        with sigterm_stops(True, distributed=True):  # no Ctrl-C: the handler as it was after the block
            pass
        assert signal.getsignal(signal.SIGINT) is before
        with sigterm_stops(True):
            assert signal.getsignal(signal.SIGINT) is before
    finally:
        signal.signal(signal.SIGINT, before)


class OneRankOfTwo:
    """What evaluate_test_sets asks of a Dist, as rank 0 of two whose peer agrees with it in every collective."""

    active, is_main, fsdp = True, True, False

    def shard(self, records):
        return records

    def all_gather_objects(self, obj):
        return [obj]

    def max_float(self, value):
        return value

    def sum_int(self, value):
        return value

    def close(self):
        pass


def test_under_torchrun_a_sigterm_in_the_test_sets_stops_every_rank_after_the_set_under_way(tmp_path, capsys):
    """Under torchrun a SIGTERM only asks, and the ranks agreed on it after training steps alone: in the test sets
    nothing asked, and the watchdog ended each rank DGRPO_SIGTERM_GRACE_S later. They agree after each set now, and
    rank 0's notice says so (it said "at the end of this step, after writing a resumable checkpoint")."""
    from dgrpo.cli.common import evaluate_test_sets
    from dgrpo.training.preemption import in_test_sets

    cfg = tiny_config(**{"eval.max_new_tokens": 4})
    lm = load_model(cfg.model, cfg.task, seed=0)
    tests = {spec: generate_split(cfg.task, spec.split(":")[1])[:2] for spec in ("builtin:test", "builtin:ood_steps")}
    try:
        with sigterm_stops(True, distributed=True), in_test_sets():
            os.kill(os.getpid(), signal.SIGTERM)  # (asks; the C-level handler's flag is read at the next instruction)
            with pytest.raises(Terminated):
                evaluate_test_sets(lm, tests, cfg, tmp_path, OneRankOfTwo())
    finally:  # (a torchrun worker's stop leaves SIGTERM ignored for the rest of the process: not pytest's)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    assert sorted(p.name for p in (tmp_path / "eval").iterdir()) == ["builtin_test"]
    assert "every rank stops at the end of the test set under way (the training is checkpointed" in (
        capsys.readouterr().err
    )


def test_under_torchrun_a_sigterm_to_dgrpo_eval_before_its_datasets_stops_it_at_once_saying_no_step(capsys):
    """A SIGTERM to a torchrun job of dgrpo eval while its modules load (before eval's own words are set): rank 0's
    notice said the ranks stop "after the next step, with its resumable checkpoint", a training run's words. Nothing
    is evaluated yet: it stops at once, its stop carrying no training run's words (the command line's says nothing
    was written), and no notice."""
    try:
        with sigterm_stops(True, distributed=True, stepped=False), pytest.raises(Terminated) as stopped:
            os.kill(os.getpid(), signal.SIGTERM)  # (the C-level handler's flag is read at the next instruction)
            time.sleep(0.01)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    assert not stopped.value.args and not capsys.readouterr().err


@pytest.mark.slow
def test_the_command_line_tells_the_handler_which_commands_train_in_steps(tmp_path, monkeypatch):
    """(The notice above needs the command line to say that dgrpo eval has no steps; sft and grpo do.)"""
    from contextlib import contextmanager

    import dgrpo.cli as cli

    seen = {}

    @contextmanager
    def recorded(on, distributed=False, stepped=True):
        seen[command] = (on, stepped)
        yield

    monkeypatch.setattr(cli, "sigterm_stops", recorded)
    for command in ("eval", "grpo", "sft"):
        cli.main(
            [
                command,
                "--model" if command == "eval" else "--init",
                str(tmp_path / "nope"),
                "--out",
                str(tmp_path / "o"),
            ]
        )
    assert seen == {"eval": (True, False), "grpo": (True, True), "sft": (True, True)}


def eval_stopped_as_rank_0(model, out, data: list[str], monkeypatch) -> pytest.ExceptionInfo:
    """``dgrpo eval --model model --data data --limit 2`` as rank 0 of two (:class:`OneRankOfTwo`) under torchrun's
    SIGTERM handling, stopped by a SIGTERM the caller's patch sends: its Terminated."""
    from dgrpo.cli import build_parser
    from dgrpo.cli import evaluate as eval_cli

    monkeypatch.setattr(eval_cli, "join_processes", lambda cfg, device, **kw: (OneRankOfTwo(), device))
    argv = ["eval", "--model", str(model), "--data", *data, "--limit", "2", "--out", str(out)]
    args = build_parser().parse_args([*argv, "--set", "eval.max_new_tokens=4"])
    try:  # (as the command line installs it for dgrpo eval: no steps)
        with sigterm_stops(True, distributed=True, stepped=False), pytest.raises(Terminated) as stopped:
            args.func(args)
    finally:  # (a torchrun worker's stop leaves SIGTERM ignored for the rest of the process: not pytest's)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return stopped


def test_under_torchrun_a_sigterm_stops_dgrpo_eval_after_the_dataset_under_way(
    sft_checkpoint, tmp_path, monkeypatch, capsys
):
    """dgrpo eval under torchrun: a SIGTERM only asks (a rank stopped alone would leave the others in a collective);
    the ranks agree after each dataset, rank 0's notice says so, and the stop line says what was written."""
    from dgrpo.cli import evaluate as eval_cli

    def asked_in_the_first(*args, **kwargs):
        if not (tmp_path / "e").exists():
            os.kill(os.getpid(), signal.SIGTERM)
        return evaluate_shards(*args, **kwargs)

    evaluate_shards = eval_cli.evaluate_shards
    monkeypatch.setattr(eval_cli, "evaluate_shards", asked_in_the_first)
    stopped = eval_stopped_as_rank_0(sft_checkpoint, tmp_path / "e", ["builtin:test", "builtin:valid"], monkeypatch)
    assert sorted(p.name for p in (tmp_path / "e").iterdir()) == ["builtin_test"]
    assert str(stopped.value) == f"after 1 of 2 datasets: written: {tmp_path / 'e' / 'builtin_test'}"
    err = capsys.readouterr().err
    assert "every rank stops at the end of the dataset under way (the results of every dataset evaluated" in err, err


def test_under_torchrun_a_guards_stop_waits_for_rank_0s_checkpoint_before_the_ranks_raise(tmp_path):
    """A non-finite or stalled stop is met by every rank at once; the others raised and exited while rank 0 wrote the
    step's checkpoint, and torchrun, seeing a rank fail, ended rank 0 after its shutdown timeout (30 s: short of a
    1.5B model's optimizer state). Every rank now leaves the process group (a barrier: rank 0's writes done) first,
    as a SIGTERM's stop does."""
    from dgrpo.training.guards import NonFiniteError

    run = at_the_runs_end(tmp_path)
    left = []
    run.dist.close = lambda: left.append(True)
    try:
        with pytest.raises(NonFiniteError, match="2 steps in a row"):
            run.stop_after_step({}, NonFiniteError("2 steps in a row"))
    finally:
        run.close()
    assert left == [True]


def at_the_runs_end(tmp_path):
    """A grpo run's directory on rank 0 of two (:class:`OneRankOfTwo`), its training done."""
    from dgrpo.training.run import RunDir

    return RunDir(tmp_path / "run", tiny_config(), OneRankOfTwo(), "grpo", log=quiet)


def test_a_runs_test_sets_are_evaluated_in_the_test_set_phase(tmp_path):
    """RunDir.final_eval marks the phase its notices and the watchdog's line are worded for."""
    from dgrpo.training import preemption

    seen, run = [], at_the_runs_end(tmp_path)
    run.final_eval(lambda lm, best: seen.append(preemption._State.testing) or {}, None, 1, None)
    run.close()
    assert seen == [True] and not preemption._State.testing


def test_under_torchrun_a_sigterm_after_the_last_steps_agreement_stops_every_rank_before_the_runs_end(tmp_path, capsys):
    """GRPO's last step validates and writes its checkpoint after the ranks last agreed (at the step's end): a SIGTERM
    there got rank 0's notice that every rank stops at the end of this step, and the run then went on to its test
    sets and final/ and exited 0. The ranks agree again at the run's end, before the test sets, and stop there."""
    run, tested = at_the_runs_end(tmp_path), []
    try:
        with sigterm_stops(True, distributed=True):
            with within_step():  # (the last step; before the first, a SIGTERM stops at once)
                pass
            os.kill(os.getpid(), signal.SIGTERM)  # (in the last step's validation, or its checkpoint's write)
            with pytest.raises(Terminated) as stopped:
                run.final_eval(lambda lm, best: tested.append(best) or {}, None, 4, None)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        run.close()
    said = "at the run's end, before final/ and summary.json (the training is done and checkpointed)"
    assert str(stopped.value) == said
    assert tested == []
    err = capsys.readouterr().err
    assert err == f"dgrpo: SIGTERM: {NOT_IN_A_STEP}\n"  # (it said: at the end of this step, none under way)


def test_under_torchrun_a_sigterm_as_the_runs_end_is_written_says_that_the_run_finishes(tmp_path, capsys):
    """After the ranks' last agreement (the run's test sets done), final/ and summary.json are written and the run
    ends with exit 0: a SIGTERM then got rank 0's notice that every rank stops at the end of this step. It says that
    the run finishes now; once the run is over, a SIGTERM's notice is the step's again."""
    run = at_the_runs_end(tmp_path)
    with sigterm_stops(True, distributed=True):
        run.final_eval(None, None, 4, None)
        os.kill(os.getpid(), signal.SIGTERM)  # (as rank 0 writes final/)
        run.close()
    err = capsys.readouterr().err
    assert err == "dgrpo: SIGTERM: the run is writing its end (final/ and summary.json): it finishes\n"
    with sigterm_stops(True, distributed=True):
        with within_step():  # (a step; before the first, a SIGTERM stops at once)
            pass
        os.kill(os.getpid(), signal.SIGTERM)
    assert NOT_IN_A_STEP in capsys.readouterr().err


@pytest.mark.slow
def test_in_one_process_a_sigterm_as_the_runs_end_is_written_lets_it_finish_too(
    sft_checkpoint, grpo_reference, tmp_path, monkeypatch, capsys
):
    """One process stopped at once, final/ unwritten (exit 143), where torchrun's ranks, past their last agreement,
    finish: a SIGTERM as a run's end is written lets it finish, as one within a step lets the step finish."""
    out = tmp_path / "run"
    sigterm_after(monkeypatch, grpo.RunDir, "final_eval", lambda run: True)  # (final/ and summary.json come next)
    try:
        with sigterm_stops(True):
            run_grpo(sft_checkpoint, out)
    except Terminated as e:  # (a KeyboardInterrupt: pytest would stop the session)
        pytest.fail(f"the run stopped as its end was written: {e}")
    assert capsys.readouterr().err.endswith(
        "dgrpo: SIGTERM: the run is writing its end (final/ and summary.json): it finishes (another SIGTERM 2 s or "
        "more later stops at once)\n"
    )
    same_run(grpo_reference, out)
    assert (out / "summary.json").read_text() == (grpo_reference / "summary.json").read_text()


WATCHDOG_LINES = {
    "tests": "in a test set: exiting (the training is checkpointed: the same command without --resume never evaluates "
    "the test sets)",
    "end": "as the run wrote its end: exiting (the training is checkpointed: the same command without --resume never "
    "evaluates the test sets and writes final/ and summary.json)",
}


@pytest.mark.parametrize("phase", ["tests", "end"])
def test_the_watchdogs_line_at_a_runs_end_says_the_training_is_checkpointed(tmp_path, phase):
    """A torchrun worker whose test set (or the writing of final/) outlasts the grace period is ended by the watchdog,
    which said "exiting without a checkpoint" where the last step's checkpoint was written before the test sets."""
    end = "    preemption.writing_the_end('final/ and summary.json')\n" if phase == "end" else ""
    (tmp_path / "testing.py").write_text(
        "import os, signal, time\n"
        "from dgrpo.training import preemption\n"
        "from dgrpo.training.preemption import in_test_sets, sigterm_stops\n"
        "with sigterm_stops(True, distributed=True), in_test_sets('the same command without --resume never'):\n"
        f"{end}"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    time.sleep(30)\n"
    )
    env = {**os.environ, "RANK": "1", "DGRPO_SIGTERM_GRACE_S": "0.2"}
    r = subprocess.run([sys.executable, str(tmp_path / "testing.py")], env=env, capture_output=True, text=True)
    assert r.returncode == 128 + signal.SIGTERM, r.stderr
    assert r.stderr.strip().splitlines()[-1] == (
        f"dgrpo: rank 1: no stop within DGRPO_SIGTERM_GRACE_S = 0.2 s of SIGTERM {WATCHDOG_LINES[phase]}"
    )


def test_after_a_stop_under_torchrun_the_group_is_left_and_sigterm_ignored():
    """torchrun, seeing the first rank exit after a stop, sends SIGTERM to the others: one still ending died of it
    ("Signal 15 (SIGTERM) received", the checkpoint written), and the ranks left their process group to the
    interpreter's exit. Now the stop leaves the group, and SIGTERM stays ignored until the process ends."""
    from types import SimpleNamespace

    from dgrpo.training.preemption import stop

    calls = []
    dist = SimpleNamespace(active=True, sum_int=lambda x: calls.append("barrier"), close=lambda: calls.append("close"))
    try:
        with sigterm_stops(True, distributed=True), pytest.raises(Terminated):
            stop(dist)
        assert calls == ["close"]
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        with sigterm_stops(True, distributed=True):  # (a run that did not stop restores what was there)
            pass
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    with sigterm_stops(True), pytest.raises(Terminated):  # one process: stop() has no group, SIGTERM is restored
        stop(None)
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_runs_nobody_resumes_stop_at_once_within_a_step_and_the_rule_is_back_after(capsys):
    """The demo's in-process runs: a SIGTERM in a step stopped at the step's end and wrote a checkpoint nobody
    resumes (the demo's line then contradicted the trainer's). Inside stops_at_once it stops at once; after it, a
    step holds a SIGTERM back again."""
    from dgrpo.training import preemption

    try:
        with sigterm_stops(True):
            with preemption.stops_at_once(), preemption.within_step(), pytest.raises(Terminated):
                os.kill(os.getpid(), signal.SIGTERM)
            preemption._State.last_at = -float("inf")  # (not the same stop delivered twice)
            with preemption.within_step():
                os.kill(os.getpid(), signal.SIGTERM)
            assert preemption.stop_requested()
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    assert capsys.readouterr().err.count("stopping at the end of this step") == 1


LEFT_IN_GROUP = """
import atexit, os, sys
import torch.distributed as tdist
from dgrpo import cli
from dgrpo.cli import train

def interrupted(args):
    tdist.init_process_group("gloo", store=tdist.HashStore(), rank=0, world_size=1)  # (joined)
    raise {failure}

cli.exit_with_launcher = lambda: None  # (no launcher here)
train.run_grpo = interrupted
atexit.register(lambda: print("the interpreter's teardown", flush=True))
sys.argv = ["dgrpo", "grpo", "--init", "sft", "--out", "run"]
print("said before", end="", flush=False)  # (flushed at the exit)
cli.entry()
"""


@pytest.mark.slow
@pytest.mark.parametrize("failure,code", [("KeyboardInterrupt", 130), ("RuntimeError('Connection closed by peer')", 1)])
def test_a_worker_ending_in_its_process_group_exits_without_the_interpreters_teardown(tmp_path, failure, code):
    """A torchrun worker interrupted alone, or whose peer is gone, ends still in the process group; destroying it in
    the interpreter's teardown could abort the process ("terminate called without an active exception", exit -6
    instead of 130 / 1: 2 of 10 two-rank jobs with a collective in flight). The script and ``python -m dgrpo`` exit
    at once with the command's code, their output flushed."""
    (tmp_path / "worker.py").write_text(LEFT_IN_GROUP.format(failure=failure))
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}
    r = subprocess.run([sys.executable, "worker.py"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert r.returncode == code, r.stderr[-2000:]
    assert r.stdout == "said before", r.stdout
    assert ("dgrpo: interrupted" if code == 130 else "another rank ended mid-run") in r.stderr, r.stderr


FAILED_WORKER = """
import atexit, os, signal
from dgrpo import cli

cli.main = lambda: 2  # (a command that failed: a config every rank refused; its real check imports torch, seconds)
# torchrun's SIGTERM to the workers still running once one has exited, landing in this one's teardown
atexit.register(lambda: (os.kill(os.getpid(), signal.SIGTERM), __import__("time").sleep(0.2)))
cli.entry()
"""


def test_a_torchrun_worker_that_failed_exits_with_its_code_through_torchruns_sigterm(tmp_path):
    """Every rank refuses a bad config with exit 2; torchrun, seeing the first exit, sends SIGTERM to the others, and a
    worker still in the interpreter's teardown died of it (torchrun's report said ``-15 (SIGTERM)``, as if the job had
    been stopped: 3 of 4 such jobs). It ignores SIGTERM once its command has failed, and exits 2; one process does
    not (nothing sends it that SIGTERM)."""
    (tmp_path / "worker.py").write_text(FAILED_WORKER)
    for torchrun, code in ((True, 2), (False, -signal.SIGTERM)):
        env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "TORCHELASTIC_RUN_ID")}
        if torchrun:
            env.update(RANK="1", LOCAL_RANK="1", WORLD_SIZE="2", TORCHELASTIC_RUN_ID="none")
        r = subprocess.run([sys.executable, "worker.py"], cwd=tmp_path, env=env, capture_output=True, text=True)
        assert r.returncode == code, (torchrun, r.stderr[-2000:])


def test_a_preempted_sft_run_rewrites_its_applied_entry_as_its_checkpoint_has_it(tmp_path, monkeypatch):
    """applied.json's entry is written at the start and again at the run's end (a compiler's fallback in the run
    shown); a SIGTERM's checkpoint kept the start's entry, which a resume then took as the record of what ran. Here
    ``compile_fallbacks`` counts the steps, as a fallback would grow in them."""
    original = sft.SFTRun.applied
    monkeypatch.setattr(
        sft.SFTRun, "applied", lambda self, opt: {**original(self, opt), "compile_fallbacks": self.prog.global_step}
    )
    out = tmp_path / "run"
    sigterm_after(monkeypatch, sft.SFTRun, "step", lambda r: r.prog.global_step == 2)
    with sigterm_stops(True), pytest.raises(Terminated):
        run_sft(out)
    assert checkpoints(out) == ["step-00000002"]
    entries = json.loads((out / "applied.json").read_text())
    assert [(e["started_at_step"], e["compile_fallbacks"]) for e in entries] == [(0, 2)]


@pytest.mark.slow
def test_a_preempted_grpo_run_rewrites_its_applied_entry_as_its_checkpoint_has_it(
    sft_checkpoint, tmp_path, monkeypatch
):
    """GRPO's counterpart of the SFT test above."""
    original = grpo.GRPOTrainer.applied
    monkeypatch.setattr(
        grpo.GRPOTrainer, "applied", lambda self: {**original(self), "compile_fallbacks": self.step_idx}
    )
    out = tmp_path / "run"
    sigterm_after(monkeypatch, grpo.GRPOTrainer, "step", lambda t: t.step_idx == 2)
    with sigterm_stops(True), pytest.raises(Terminated):
        run_grpo(sft_checkpoint, out)
    assert checkpoints(out) == ["step-00000002"]
    entries = json.loads((out / "applied.json").read_text())
    assert [(e["started_at_step"], e["compile_fallbacks"]) for e in entries] == [(0, 2)]


def nonfinite_from(monkeypatch, module, name, calls):
    """``module.name`` (a loss) NaN from its call ``calls`` on (0: every call)."""
    original, n = getattr(module, name), []

    def patched(*a, **kw):
        loss, rest = original(*a, **kw)
        n.append(1)
        return (loss * float("nan") if len(n) > calls else loss), rest

    monkeypatch.setattr(module, name, patched)


def weights_nonfinite_at(monkeypatch, module, step):
    """``module.weights_finite`` says the weights became non-finite in the optimizer step ``step`` (from 1)."""
    n = []
    monkeypatch.setattr(module, "weights_finite", lambda params, dist: n.append(1) or len(n) != step)


@pytest.mark.parametrize("cause", ["guard", "weights"])
def test_a_nonfinite_stop_of_an_sft_run_rewrites_its_applied_entry_as_a_sigterm_does(tmp_path, monkeypatch, cause):
    """A non-finite stop (sft.max_nonfinite steps in a row, with its checkpoint; weights made non-finite, with none)
    kept the start's entry of applied.json, where a SIGTERM's stop writes it again as the process ends."""
    original = sft.SFTRun.applied
    monkeypatch.setattr(
        sft.SFTRun, "applied", lambda self, opt: {**original(self, opt), "compile_fallbacks": self.prog.global_step}
    )
    if cause == "guard":
        nonfinite_from(monkeypatch, sft, "sft_loss", 0)  # (steps 1 and 2 dropped: the guard trips)
    else:
        weights_nonfinite_at(monkeypatch, sft, 3)  # (in step 3: steps 1 and 2 trained)
    out = tmp_path / "run"
    with pytest.raises(NonFiniteError):
        run_sft(out, {"sft.max_nonfinite": 2})
    saved = checkpoints(out) if (out / "checkpoints").is_dir() else []
    assert saved == (["step-00000002"] if cause == "guard" else [])  # (weights made non-finite: none saved)
    entries = json.loads((out / "applied.json").read_text())
    assert [(e["started_at_step"], e["compile_fallbacks"]) for e in entries] == [(0, 2)]


@pytest.mark.slow
@pytest.mark.parametrize("cause", ["guard", "weights", "stall"])
def test_a_guards_stop_of_a_grpo_run_rewrites_its_applied_entry_as_a_sigterm_does(
    sft_checkpoint, tmp_path, monkeypatch, cause
):
    """GRPO's counterpart of the SFT test above; a stall's stop (grpo.max_skip_streak) as well."""
    original = grpo.GRPOTrainer.applied
    monkeypatch.setattr(
        grpo.GRPOTrainer, "applied", lambda self: {**original(self), "compile_fallbacks": self.step_idx}
    )
    if cause == "guard":
        nonfinite_from(monkeypatch, grpo, "grpo_objective", 0)
    elif cause == "weights":
        weights_nonfinite_at(monkeypatch, grpo, 3)
    else:  # (a stall said after step 2)
        monkeypatch.setattr(grpo, "_check_stall", lambda run, loop, m, g: "stalled" if m["step"] == 1 else None)
    out = tmp_path / "run"
    with pytest.raises(StalledError if cause == "stall" else NonFiniteError):
        run_grpo(sft_checkpoint, out, {"grpo.max_nonfinite": 2})
    saved = checkpoints(out) if (out / "checkpoints").is_dir() else []
    assert saved == ([] if cause == "weights" else ["step-00000002"])  # (weights made non-finite: none saved)
    entries = json.loads((out / "applied.json").read_text())
    assert [(e["started_at_step"], e["compile_fallbacks"]) for e in entries] == [(0, 2)]


def test_under_torchrun_a_sigterm_while_dgrpo_eval_loads_stops_every_rank_before_the_first_dataset(
    sft_checkpoint, tmp_path, monkeypatch, capsys
):
    """A SIGTERM to a torchrun job of dgrpo eval while its model loaded: rank 0's notice said the ranks stop "after the
    next step, with its resumable checkpoint" (a training run's words), and they evaluated the whole first dataset
    before they agreed to stop. Before the first dataset a rank now stops at once (as a training command's before
    its first step: a rank whose peer refused at the start ran on to torchrun's SIGKILL): nothing evaluated, nothing
    written, the stop line says so, and no notice of a stop to come."""
    from dgrpo.cli import evaluate as eval_cli

    def asked_while_loading(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # (asks; the C-level handler's flag is read at the next instruction)
        return load(*args, **kwargs)

    load = eval_cli._load_eval_model
    monkeypatch.setattr(eval_cli, "_load_eval_model", asked_while_loading)
    stopped = eval_stopped_as_rank_0(sft_checkpoint, tmp_path / "e", ["builtin:test"], monkeypatch)
    assert not (tmp_path / "e").exists()
    assert str(stopped.value) == "before the evaluation: nothing was written"
    assert "dgrpo: SIGTERM" not in capsys.readouterr().err


def test_a_resume_over_an_unreadable_applied_json_warns_of_it_once(tmp_path):
    """A resume reads applied.json twice, for the plug-in files' check and to record its entry: a damaged file was said
    to be 'written anew' twice, two identical warning lines."""
    import warnings

    from dgrpo.training.applied import record_applied, warn_if_plugins_changed

    path = tmp_path / "applied.json"
    path.write_text("{cut")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn_if_plugins_changed(path, 5, {"plugin_files": {}})
        record_applied(path, 5, {"plugin_files": {}})
    assert [str(w.message) for w in caught] == [f"{path} is not a list of applied settings: written anew"]
    assert json.loads(path.read_text()) == [{"started_at_step": 5, "plugin_files": {}}]


def test_under_torchrun_a_sigterm_to_another_rank_while_dgrpo_eval_loads_is_said_without_a_checkpoint(
    sft_checkpoint, tmp_path, monkeypatch, capsys
):
    """The ranks' agreement before dgrpo eval's first dataset answering that a rank was asked to stop: rank 0's line
    said they stop 'after writing a resumable checkpoint of this step' (a training run's words). (With the handler
    on, a rank that gets a SIGTERM before that agreement now stops at once instead: tests/test_eval_torchrun_stop.py;
    the line stays true to eval should a request reach it.)"""
    from dgrpo.cli import build_parser
    from dgrpo.cli import evaluate as eval_cli

    class PeerAsked(OneRankOfTwo):
        def max_float(self, value):  # (the other rank got the SIGTERM)
            return 1.0

    monkeypatch.setattr(eval_cli, "join_processes", lambda cfg, device, **kw: (PeerAsked(), device))
    argv = ["eval", "--model", str(sft_checkpoint), "--data", "builtin:test", "--limit", "2"]
    args = build_parser().parse_args([*argv, "--out", str(tmp_path / "e"), "--set", "eval.max_new_tokens=4"])
    try:
        with sigterm_stops(True, distributed=True, stepped=False), pytest.raises(Terminated) as stopped:
            args.func(args)
    finally:  # (a torchrun worker's stop leaves SIGTERM ignored for the rest of the process: not pytest's)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    assert str(stopped.value) == "before the evaluation: nothing was written" and not (tmp_path / "e").exists()
    err = capsys.readouterr().err
    said = "dgrpo: SIGTERM (to another rank): every rank stops now before the first dataset (nothing was evaluated)"
    assert said in err and "checkpoint" not in err, err
