"""`dgrpo demo`: the statistics against hand-computed values, and the `--quick` run end to end (its files, its
tables, and the paper's structural claim: deterministic rollouts never update and equal SFT on every item)."""

import functools
import json
import math
import os
import re
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from dgrpo.demo import (
    CLAIMS,
    Demo,
    claim_verdicts,
    compare,
    exact_verdict,
    flips,
    mean_ci,
    merge_seed,
    t_quantile,
    verdict,
)
from dgrpo.demo.pipeline import Task, arm_tasks, join_parts, task_threads
from dgrpo.demo.stats import CHECKPOINTS

from conftest import DEAF_KIND, child_pids, files_state, process_alive, run_script, wait_until


@pytest.mark.parametrize(
    ("df", "q"), [(1, 12.7062047), (2, 4.3026527), (3, 3.1824463), (5, 2.5705818), (10, 2.2281389), (30, 2.0422725)]
)
def test_t_quantile_matches_the_table(df, q):
    assert t_quantile(0.975, df) == pytest.approx(q, abs=1e-6)
    assert t_quantile(0.025, df) == pytest.approx(-q, abs=1e-6)


def test_t_quantile_approaches_the_normal_quantile():
    assert t_quantile(0.975, 100000) == pytest.approx(1.959964, abs=1e-4)
    assert t_quantile(0.5, 7) == pytest.approx(0.0, abs=1e-9)
    with pytest.raises(ValueError):
        t_quantile(1.0, 3)


def test_mean_ci_by_hand():
    # [1, 2, 3]: mean 2, sd 1, t(0.975, 2) = 4.302653 -> half-width 4.302653 / sqrt(3) = 2.484138
    ci = mean_ci([1.0, 2.0, 3.0])
    assert (ci.mean, ci.sd, ci.n) == (2.0, 1.0, 3)
    assert ci.lo == pytest.approx(2 - 2.484138, abs=1e-5) and ci.hi == pytest.approx(2 + 2.484138, abs=1e-5)
    # the notes' K = 8 Dropout-GRPO - token sampling test differences: mean 0.75, sd sqrt(0.0925) = 0.304138,
    # half-width 4.302653 * 0.304138 / sqrt(3) = 0.755522 -> the interval just reaches below 0
    ci = mean_ci([0.90, 0.40, 0.95])
    assert ci.mean == pytest.approx(0.75) and ci.sd == pytest.approx(math.sqrt(0.0925))
    assert ci.lo == pytest.approx(-0.005522, abs=1e-5) and ci.hi == pytest.approx(1.505522, abs=1e-5)
    # the notes' K = 16 validation differences: mean 3.5, var 10.7 / 5 = 2.14, t(0.975, 5) = 2.570582,
    # half-width 2.570582 * sqrt(2.14) / sqrt(6) = 1.535197
    ci = mean_ci([2.2, 3.6, 3.4, 3.4, 2.2, 6.2])
    assert ci.lo == pytest.approx(3.5 - 1.535197, abs=1e-5) and ci.hi == pytest.approx(3.5 + 1.535197, abs=1e-5)
    one = mean_ci([0.7])
    assert (one.mean, one.lo, one.hi, one.n) == (0.7, None, None, 1)
    with pytest.raises(ValueError):
        mean_ci([])


def test_flips_count_items_gained_and_lost():
    assert flips([True, False, True, False], [True, True, False, False]) == (1, 1)
    assert flips([False, False], [True, True]) == (2, 0)
    with pytest.raises(ValueError):
        flips([True], [True, False])


def test_compare_pairs_runs_with_their_own_sft_checkpoint():
    T, F = True, False
    sft = {0: [T, F, F, F], 1: [T, T, F, F]}  # keyed by SFT seed alone
    arm = {
        (0, 0): [T, T, F, F],  # +1 item of 4 over SFT seed 0: +25 points
        (0, 1): [T, T, T, F],  # +2: +50
        (1, 0): [F, T, F, F],  # -1 over SFT seed 1: -25
        (2, 0): [T, T, T, T],  # no SFT seed 2: left out
    }
    c = compare(arm, sft)
    assert c["n_pairs"] == 3 and c["n_sft_seeds"] == 2 and c["n_items"] == 4
    assert [p["diff"] for p in c["pairs"]] == [25.0, 50.0, -25.0]
    assert [(p["gained"], p["lost"]) for p in c["pairs"]] == [(1, 0), (2, 0), (0, 1)]
    assert c["gained"] == 1.0 and c["lost"] == pytest.approx(1 / 3)
    # the two pairs of SFT seed 0 share its checkpoint: averaged first (37.5), then the interval over SFT seeds:
    # mean (37.5 - 25) / 2 = 6.25, sd |37.5 + 25| / sqrt(2) = 44.194174, t(0.975, 1) = 12.706205
    assert c["mean"] == pytest.approx(6.25) and c["sd"] == pytest.approx(44.194174, abs=1e-5)
    half = 12.706205 * 44.194174 / math.sqrt(2)
    assert c["lo"] == pytest.approx(6.25 - half, abs=1e-3) and c["hi"] == pytest.approx(6.25 + half, abs=1e-3)
    # two arms: pairs by (SFT seed, RL seed); one SFT checkpoint's pairs give no interval, however many
    other = {(0, 0): [T, T, F, F], (0, 1): [T, F, F, F]}
    c = compare(arm, other)
    assert [p["diff"] for p in c["pairs"]] == [0.0, 50.0] and c["n_pairs"] == 2
    assert c["n_sft_seeds"] == 1 and c["mean"] == 25.0 and c["lo"] is None and c["hi"] is None
    assert compare({}, sft) == {"pairs": [], "n_pairs": 0}


def test_verdicts():
    assert verdict("greater", 0.1, 2.0) == "resolved"
    assert verdict("greater", -0.1, 2.0) == "not resolved"
    assert verdict("greater", -2.0, -0.1) == "contradicted"
    assert verdict("not_greater", -2.0, 0.0) == "resolved"
    assert verdict("not_greater", -1.0, 1.0) == "not resolved"
    assert verdict("not_greater", 0.5, 2.0) == "contradicted"
    assert verdict("greater", None, None) == "not resolved"  # one pair: no interval
    assert verdict("greater", 1.5625, 1.5625) == "not resolved"  # zero width: two seeds each +1 item of 64
    assert verdict("not_greater", 0.0, 0.0) == "not resolved"
    with pytest.raises(ValueError):
        verdict("bigger", 0.0, 1.0)
    same = {"pairs": [{"gained": 0, "lost": 0}, {"gained": 0, "lost": 0}]}
    assert exact_verdict(same, 0.0) == "resolved"
    assert exact_verdict(same, 0.01) == "not resolved"  # the rollouts differed at some step
    assert exact_verdict({"pairs": [{"gained": 1, "lost": 1}]}, 0.0) == "not resolved"  # same accuracy, items differ
    assert exact_verdict({"pairs": []}, 0.0) == "not resolved"


def test_claim_verdicts_judge_each_claim_on_the_headline_split():
    def comp(a, b, ckpt, lo, hi, split="test"):
        pairs = [{"gained": 0, "lost": 0}] if a == "grpo_deterministic" else [{"gained": 3, "lost": 1}] * 2
        return {
            "a": a,
            "b": b,
            "checkpoint": ckpt,
            "split": split,
            "pairs": pairs,
            "n_pairs": len(pairs),
            "mean": (lo + hi) / 2,
            "lo": lo,
            "hi": hi,
            "gained": pairs[0]["gained"],
            "lost": pairs[0]["lost"],
        }

    comparisons = []
    for ckpt in ("best", "final"):
        comparisons += [
            comp("grpo_deterministic", "sft", ckpt, 0.0, 0.0),
            comp("dropout_grpo", "grpo_sampling", ckpt, 0.5, 3.0),
            comp("dropout_grpo", "sft", ckpt, -1.0, 2.0),
            comp("grpo_null", "sft", ckpt, -3.0, -0.5),
            comp("dropout_grpo", "reinforce_ema", ckpt, -4.0, -1.0),
            comp("dropout_grpo", "sft", ckpt, 5.0, 6.0, split="shifted"),  # not the headline split
        ]
    rows = claim_verdicts(comparisons, {"grpo_deterministic": 0.0, "dropout_grpo": 0.3}, "test")
    assert len(rows) == 2 * len(CLAIMS)
    got = {(r["id"], r["checkpoint"]): r["verdict"] for r in rows}
    for ckpt in ("best", "final"):
        assert [got[(i, ckpt)] for i in (1, 2, 3, 4, 5)] == [
            "resolved",
            "resolved",
            "not resolved",
            "resolved",
            "contradicted",
        ]
    r3 = next(r for r in rows if r["id"] == 3 and r["checkpoint"] == "best")
    assert (r3["lo"], r3["hi"], r3["n_pairs"]) == (-1.0, 2.0, 2)
    # claim 1 needs the reward std to be exactly 0
    rows = claim_verdicts(comparisons, {"grpo_deterministic": 0.1}, "test")
    assert {r["verdict"] for r in rows if r["id"] == 1} == {"not resolved"}


def quick_demo(out, workers):
    cmd = [sys.executable, "-m", "dgrpo", "demo", "--quick", "--out", str(out), "--workers", str(workers)]
    r = subprocess.run([*cmd, "--set", "threads=1"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


@pytest.fixture(scope="module")
def pool_demo(tmp_path_factory):
    """One ``dgrpo demo --quick`` in a pool of two single-thread workers: its folder and its process result."""
    out = tmp_path_factory.mktemp("pool") / "demo"
    return out, quick_demo(out, 2)


def test_merge_seed_keeps_sft_seed_order_whatever_finishes_first():
    def part(seed):
        models = [{"arm": "sft", "sft_seed": seed}, {"arm": "dropout_grpo", "sft_seed": seed}]
        wall = {f"sft/seed{seed}": 1.0, f"dropout_grpo/sft{seed}_rl0": 2.0}
        return Demo(None, None, [], [], {}, models=models, runs=[{"sft_seed": seed}], wall=wall)

    demo = part(2)  # seed 2 finished first, then 0, then 1
    for seed in (0, 1):
        merge_seed(demo, part(seed))
    assert [(m["sft_seed"], m["arm"]) for m in demo.models] == [
        (0, "sft"),
        (0, "dropout_grpo"),
        (1, "sft"),
        (1, "dropout_grpo"),
        (2, "sft"),
        (2, "dropout_grpo"),
    ]
    assert [r["sft_seed"] for r in demo.runs] == [0, 1, 2]
    assert (
        list(demo.wall)[:2] == ["sft/seed0", "dropout_grpo/sft0_rl0"] and list(demo.wall)[-1] == "dropout_grpo/sft2_rl0"
    )


def test_arm_tasks_list_every_run_of_a_seed_in_table_order():
    """Every arm from SFT seed 1's checkpoint, n_rl RL seeds each; the deterministic arm once (it cannot update)."""
    tasks = arm_tasks(1, 2)
    assert tasks[0] == Task(1, "grpo_deterministic", 0) and len(tasks) == 1 + 4 * 2
    assert [t.arm for t in tasks[1:3]] == ["reinforce_ema"] * 2 and [t.r for t in tasks[1:3]] == [0, 1]
    assert arm_tasks(0, 1, ["dropout_grpo"]) == [Task(0, "dropout_grpo", 0)]


def test_a_lone_sft_run_gets_the_cpus_its_rl_runs_wait_with():
    """Threads per pool task: an SFT run takes the CPUs of the workers idle beside it (its RL runs wait for its
    checkpoint); RL runs and SFT runs side by side an equal share; a pinned ``threads`` wins."""
    sft, rl = Task(0), Task(0, "dropout_grpo", 0)
    assert task_threads(sft, n_sft=1, workers=2, cpus=2) == 2  # the default demo: one SFT seed
    assert task_threads(rl, n_sft=1, workers=2, cpus=2) == 1  # its five RL runs, two at a time
    assert task_threads(sft, n_sft=4, workers=2, cpus=2) == 1  # --full: two SFT runs side by side
    assert (task_threads(sft, n_sft=2, workers=4, cpus=8), task_threads(rl, n_sft=2, workers=4, cpus=8)) == (4, 2)
    assert task_threads(sft, n_sft=1, workers=3, cpus=2) == 2 and task_threads(rl, n_sft=1, workers=3, cpus=2) == 1
    assert task_threads(sft, n_sft=1, workers=2, cpus=2, pinned=1) == 1  # --set threads=1


def test_join_parts_keeps_task_order_whatever_finishes_first():
    """A seed's task results, finished in any order, join as the in-process pipeline lists them: SFT, then the arms."""

    def part(arm):
        return Demo(None, None, [], [], {}, models=[{"arm": arm}], runs=[{"arm": arm}], wall={arm: 1.0})

    finished = {2: part("grpo_null"), -1: part("sft"), 0: part("grpo_deterministic"), 1: part("reinforce_ema")}
    joined = join_parts(finished)
    order = ["sft", "grpo_deterministic", "reinforce_ema", "grpo_null"]
    assert [m["arm"] for m in joined.models] == order and list(joined.wall) == order
    assert [r["arm"] for r in joined.runs] == order and finished[-1].models == [{"arm": "sft"}]  # inputs untouched


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--workers", "0"], "--workers must be >= 1, got 0"),
        (["--sft-seeds", "0"], "--sft-seeds and --seeds must be >= 1"),
        (["--out", "{file}"], "exists and is not a directory"),
        (["--seeds", "101"], "--seeds must be <= 100"),  # (rl_seed(0, 100) would be rl_seed(1, 0))
        # an override that breaks one arm, found before any SFT (it was found after SFT, naming no arm)
        (["--set", "grpo.shuffle_rewards=true"], "arm reinforce_ema (builtin/reinforce_ema.yaml over the demo's"),
        # options the demo does not read (they were accepted and did nothing), and a reward found only after SFT
        (["--set", "data.train=my.jsonl"], "--set data.train: dgrpo demo does not read it"),
        (["--set", "eval.temperature=0.7"], "--set eval.temperature: dgrpo demo does not read it"),
        (["--set", "data={{train: my.jsonl}}"], "--set data.train: dgrpo demo does not read it"),  # ({{ }}: .format)
        (["--set", "seed=3"], "each run's seed its own: --sft-seeds, --seeds"),
        # (the config's own check came first: "question_key and answer_key go together", then, with both, this)
        (["--set", "data.question_key=q"], "--set data.question_key: dgrpo demo does not read it"),
        (["--set", "grpo.reward=nosuch.py:f"], "reward 'nosuch.py:f': file nosuch.py not found"),
        (["--set", "perturbation.kind=nosuch.py:K"], "nosuch.py"),
        (["--set", "perturbation.kind={deaf}:Deaf", "perturbation.perturb_answer=false"], "does not take it"),
        # no best/ kept: the report labelled the final model the best-validation checkpoint
        (["--set", "grpo.save_best=false"], "(best/) beside its final one, and grpo.save_best=false keeps none;"),
        (["--set", "grpo.warmup_steps=100"], "and grpo.warmup_steps=100 is past grpo.steps=4 (it is kept from"),
        # the report reads every step's row (one in N was read as every step: claim 1, the updating steps)
        (["--set", "grpo.log_every=3"], "grpo.log_every=3: dgrpo demo reads every RL step's metrics row"),
        # the same options in a --config file (refused by --set, a file's were ignored without a word)
        (["--config", "{yaml}"], "sets eval.limit to 5: dgrpo demo does not read it"),
    ],
)
def test_demo_bad_arguments_exit_2_in_one_line_before_any_work(tmp_path, run_cli, args, needle):
    (tmp_path / "file").write_text("")
    (tmp_path / "c.yaml").write_text("eval:\n  limit: 5\ngrpo:\n  lr: 1.0e-4\n")
    (tmp_path / "deaf.py").write_text(DEAF_KIND)
    argv = [a.format(file=tmp_path / "file", yaml=tmp_path / "c.yaml", deaf=tmp_path / "deaf.py") for a in args]
    r = run_cli("demo", "--quick", *(["--out", tmp_path / "o"] if "--out" not in argv else []), *argv)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and needle in r.stderr, r.stderr
    assert not (tmp_path / "o").exists() and r.stdout == ""


def test_more_workers_than_cpus_are_warned_about(tmp_path, monkeypatch):
    """``--workers 64`` on 2 CPUs started 64 processes, each with its own torch, without a word."""
    import dgrpo.demo.pipeline as pipeline

    monkeypatch.setattr(pipeline, "available_cpus", lambda: 2)
    demo = Demo(None, tmp_path / "demo", [], [], {})
    with pytest.warns(UserWarning, match=r"--workers 3 is more than the 2 CPU\(s\) this process may use"):
        pipeline.run_pipeline(demo, 0, 0, workers=3)  # (no seed: no task)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pipeline.run_pipeline(demo, 0, 0, workers=2)


@pytest.mark.slow
def test_demo_workers_give_the_in_process_results(tmp_path, pool_demo, run_cli):
    """A pool of two worker processes (SFT and RL runs as tasks) and one in-process pipeline, both single-threaded:
    the same models with the same answers on every item, in the same order. The same command run again reads every
    task back from its record (2 SFT seeds, 5 RL runs each) and writes the same results. (The in-process runs in
    this process, ``dgrpo.cli.main``: a fresh interpreter's imports twice less, the pool's workers are processes.)"""

    def in_process():
        r = run_cli("demo", "--quick", "--out", tmp_path / "w1", "--workers", "1", "--set", "threads=1")
        assert r.returncode == 0, r.stderr[-3000:]
        return r

    in_process()
    one, two = (json.loads((d / "results.json").read_text()) for d in (tmp_path / "w1", pool_demo[0]))
    assert one["models"] == two["models"] and one["analysis"]["claims"] == two["analysis"]["claims"]
    again = in_process()
    assert again.stdout.count("(read back from") == 2 * (1 + len(arm_tasks(0, 1)))
    res = json.loads((tmp_path / "w1" / "results.json").read_text())
    assert res["models"] == one["models"] and res["runs"] == one["runs"]


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
@pytest.mark.parametrize("sig,phase", [(signal.SIGINT, "sft"), (signal.SIGTERM, "rl")])
def test_a_stop_of_the_demo_ends_its_workers_mid_task_and_says_so(tmp_path, sig, phase):
    """``kill -INT`` or ``kill`` (SIGTERM, what a job scheduler sends) to the demo's process alone, mid-SFT or mid-RL
    (RL runs queued behind the running ones): its pool workers end with it instead of finishing their tasks (runs of
    over a minute here; after SIGINT the demo waited for them, its workers training), and its last line says so
    (SIGTERM ended it without a word)."""
    cmd = [sys.executable, "-m", "dgrpo", "demo", "--quick", "--out", str(tmp_path / "d"), "--workers", "2"]
    err = (tmp_path / "stderr").open("w")
    # mid-RL: the SFT runs before it half --quick's (one epoch per stage, both stages), its RL runs far longer
    over = ["sft.num_epochs=40"] if phase == "sft" else ["sft.epochs_per_stage=1", "sft.num_epochs=2", "grpo.steps=400"]
    # (SIGINT's default disposition, as under a terminal: a shell's `cmd &` starts its jobs with it ignored, and so
    # would the demo be, a Python process keeping the ignore it inherits)
    default_sigint = functools.partial(signal.signal, signal.SIGINT, signal.SIG_DFL)
    sets = [a for o in ["threads=1", *over] for a in ("--set", o)]
    demo = subprocess.Popen([*cmd, *sets], stderr=err, preexec_fn=default_sigint)
    started = "sft/seed1/metrics.jsonl" if phase == "sft" else "arms/*/*/metrics.jsonl"
    workers: set[int] = set()
    try:
        out = tmp_path / "d"  # (until both workers are training: 120 s without a new row or file is a hang)
        wait_until(
            lambda: any(out.glob(started)), demo, f"the demo did not start its {phase} runs", lambda: files_state(out)
        )
        workers = pool_workers(demo.pid)  # (not its resource tracker, which ends on its own once the demo has)
        assert len(workers) == 2
        os.kill(demo.pid, sig)
        assert demo.wait(timeout=30) == 128 + sig
        # (the demo joins its workers before it exits: none may be left running once it has, at any machine speed)
        assert not [w for w in workers if process_alive(w)], "pool workers outlived the demo"
        said = "terminated (SIGTERM)" if sig == signal.SIGTERM else "interrupted"
        lines = (tmp_path / "stderr").read_text().strip().splitlines()
        assert (
            lines[-1] == f"dgrpo: {said}; the same command keeps the runs that had finished and starts the others over"
        )
    finally:  # nothing left running if the test fails
        demo.kill()
        for w in workers | child_pids(demo.pid):
            if process_alive(w):
                os.kill(w, signal.SIGKILL)


def test_files_state_passes_over_a_folder_the_run_removes_while_it_walks(tmp_path, monkeypatch):
    """The demo removes its old checkpoints while a test watches its files: a folder listed and then gone (its
    ``scandir`` fails) is passed over. ``rglob`` raised FileNotFoundError out of the wait and failed the test."""
    for rel in ("run/metrics.jsonl", "run/checkpoints/step-1/model/weights", "run/checkpoints/step-2/model/weights"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x")
    gone, scandir = tmp_path / "run" / "checkpoints" / "step-1" / "model", os.scandir

    def removed_meanwhile(path="."):
        if Path(path) == gone:
            raise FileNotFoundError(2, "No such file or directory", str(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", removed_meanwhile)
    names = [Path(f).relative_to(tmp_path).as_posix() for f, _ in files_state(tmp_path)]
    assert names == ["run/checkpoints/step-2/model/weights", "run/metrics.jsonl"]


def wait_for_rows(out, pattern, key, demo):
    """Wait until a metrics file under ``out`` matching ``pattern`` has a row with ``key``: its run is in its steps.
    Fails when ``demo`` ends first, or writes nothing new under ``out`` for a while (:func:`wait_until`: a busy
    machine makes it slower, which a fixed deadline took for a hang)."""
    wait_until(
        lambda: any(key in f.read_text() for f in out.glob(pattern)),
        demo,
        f"no {pattern} row with {key}",
        lambda: files_state(out),
    )


def pool_workers(pid):
    """The pool workers among ``pid``'s children (not its resource tracker)."""
    return {p for p in child_pids(pid) if process_alive(p) and b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes()}


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
def test_a_worker_killed_from_outside_ends_the_demo_in_one_line(tmp_path):
    """SIGKILL (the OOM killer's) to one pool worker alone, mid-SFT: the demo ended with concurrent.futures'
    BrokenProcessPool traceback ("A process in the process pool was terminated abruptly"; SIGTERM to a worker too).
    Now one line that names the worker, its signal and the likely causes, its other worker ended, exit 1."""
    cmd = [sys.executable, "-m", "dgrpo", "demo", "--quick", "--out", str(tmp_path / "d"), "--workers", "2"]
    err = (tmp_path / "stderr").open("w")
    demo = subprocess.Popen([*cmd, "--set", "threads=1", "sft.num_epochs=40", "task.n_train=512"], stderr=err)
    workers: set[int] = set()
    try:
        wait_for_rows(tmp_path / "d", "sft/seed*/metrics.jsonl", '"loss"', demo)  # (a seed's first row: the pool is up)
        workers = pool_workers(demo.pid)
        assert len(workers) == 2  # (two seeds: both workers)
        victim = min(workers)
        os.kill(victim, signal.SIGKILL)
        assert demo.wait(timeout=30) == 1
        assert not [w for w in workers if process_alive(w)], "a pool worker outlived the demo"  # (joined: as above)
        text = (tmp_path / "stderr").read_text()
        assert "Traceback" not in text and "BrokenProcessPool" not in text, text
        assert text.strip().splitlines()[-1] == (
            f"dgrpo: error: a worker process of the demo ended abruptly (pid {victim}: SIGKILL): killed from outside "
            "(out of memory: the kernel's OOM killer sends SIGKILL; each worker holds its own models: fewer --workers "
            "need less; or kill) or crashed; the demo ended its other workers: the same command keeps the runs that "
            "had finished and starts the others over"
        )
    finally:  # nothing left running if the test fails
        demo.kill()
        for w in workers | child_pids(demo.pid):
            if process_alive(w):
                os.kill(w, signal.SIGKILL)


def test_the_line_of_a_dead_worker_names_how_it_ended():
    """The pool ends the workers left with SIGTERM once one has ended: any other exit is the first's own."""
    from dgrpo.demo.pipeline import worker_died

    assert "ended abruptly (pid 7: SIGKILL)" in worker_died({7: -9, 8: -15})
    assert "ended abruptly (pid 7: exit code 1; pid 8: SIGSEGV)" in worker_died({7: 1, 8: -11, 9: -15})
    assert "ended abruptly (SIGTERM)" in worker_died({7: -15, 8: -15})  # which one first: unknown
    assert "ended abruptly: killed from outside" in worker_died({})  # (a pool that keeps its processes otherwise)


@pytest.mark.slow
@pytest.mark.parametrize("phase", ["sft", "rl"])
def test_a_stop_of_the_demo_in_its_own_process_says_one_thing(tmp_path, phase):
    """``--workers 1`` (the default on a GPU): the runs in the demo's own process. A SIGTERM mid-step printed the
    trainer's line ("stopping at the end of this step, after writing a resumable checkpoint") above the demo's (the
    same command keeps the runs that had finished), and the step's checkpoint was written for nothing. Now it stops
    at once, as it does with workers, and says the demo's line alone."""
    cmd = [sys.executable, "-m", "dgrpo", "demo", "--quick", "--out", str(tmp_path / "d"), "--workers", "1"]
    err = (tmp_path / "stderr").open("w")
    # (a short SFT before RL; RL: steps alone, no evaluation between them, no checkpoint but the last)
    longer = ["sft.num_epochs=40"] if phase == "sft" else ["sft.num_epochs=1", "grpo.steps=400", "grpo.eval_every=0"]
    sets = ["threads=1", "task.n_train=512", "grpo.save_every=0", *longer]
    demo = subprocess.Popen([*cmd, "--set", *sets], stderr=err)
    try:
        if phase == "sft":
            wait_for_rows(tmp_path / "d", "sft/seed0/metrics.jsonl", '"loss"', demo)
        else:
            wait_for_rows(tmp_path / "d", "arms/*/*/metrics.jsonl", '"reward_mean"', demo)
        os.kill(demo.pid, signal.SIGTERM)
        assert demo.wait(timeout=30) == 128 + signal.SIGTERM
        said = re.findall(r"dgrpo: [^\r\n]*", (tmp_path / "stderr").read_text())  # (SFT's bar: no newline of its own)
        assert said == [
            "dgrpo: terminated (SIGTERM); the same command keeps the runs that had finished and starts the others over"
        ]
        if phase == "rl":  # (SFT writes one at each epoch's end)
            assert not list((tmp_path / "d").glob("arms/*/*/checkpoints/step-*")), "a checkpoint for nothing"
    finally:
        demo.kill()


@pytest.mark.slow
def test_demo_quick(pool_demo):
    out, r = pool_demo
    for f in ("results.json", "results.md", "summary.txt", "eval_accuracy.png", "reward_std.png"):
        assert (out / f).exists(), f
    res = json.loads((out / "results.json").read_text())
    assert (res["n_sft"], res["n_rl"]) == (2, 1)  # --quick: 2 SFT checkpoints, so the intervals are computed
    arms = {m["arm"] for m in res["models"]}
    assert arms == {"sft", "grpo_deterministic", "reinforce_ema", "grpo_sampling", "grpo_null", "dropout_grpo"}
    splits = list(res["splits"])
    assert splits[0] == "test" and len(splits) == 2
    for m in res["models"]:
        for s in splits:
            d = m["splits"][s]
            assert 0.0 <= d["accuracy"] <= 1.0 and len(d["items"]) == res["splits"][s]
    for arm in ("grpo_null", "dropout_grpo"):  # one run per SFT seed, each tested at two checkpoints
        assert sorted((m["sft_seed"], m["checkpoint"]) for m in res["models"] if m["arm"] == arm) == [
            (0, "best"),
            (0, "final"),
            (1, "best"),
            (1, "final"),
        ]
    # deterministic rollouts: identical within every group, no update, the SFT model on every item
    det = [run for run in res["runs"] if run["arm"] == "grpo_deterministic"]
    assert len(det) == 2 and all(run["reward_std_max"] == 0.0 and run["updates"] == 0 for run in det)
    assert all(run["reward_std_max"] > 0.0 for run in res["runs"] if run["arm"] == "dropout_grpo")
    for c in res["analysis"]["comparisons"]:
        if c["a"] == "grpo_deterministic":
            assert c["n_pairs"] == 2 and all(p["gained"] == p["lost"] == 0 for p in c["pairs"]), c
    claims = {(c["id"], c["checkpoint"]): c for c in res["analysis"]["claims"]}
    assert (
        len(claims) == 2 * len(CLAIMS)
        and claims[(1, "best")]["verdict"] == claims[(1, "final")]["verdict"] == "resolved"
    )
    assert all(c["lo"] is not None for c in claims.values() if c["id"] != 1)  # 2 pairs: every interval exists
    table = (out / "results.md").read_text()
    assert "Coconut + Dropout-GRPO (ours)" in table and "95% CI" in table
    assert "1. deterministic GRPO = SFT exactly: best-valid checkpoint: **resolved**" in table
    summary = (out / "summary.txt").read_text()
    assert "(3) Dropout-GRPO > SFT" in summary and summary.strip() in r.stdout


def test_a_second_demo_on_the_same_out_is_refused(tmp_path, run_cli):
    """One demo per --out: a second one started its SFT over under the first (--resume never deleted the
    checkpoint the first's RL runs were reading)."""
    from dgrpo.training.out_dir import RunLock

    lock = RunLock(tmp_path)  # (the first demo, still running)
    try:
        r = run_cli("demo", "--quick", "--out", tmp_path)
    finally:
        lock.release()
    assert r.returncode == 2 and "is in use by another dgrpo process" in r.stderr and r.stdout == ""
    assert [p.name for p in tmp_path.iterdir()] == [".lock"]


def test_the_demo_reads_a_section_mapping_and_the_scorer(tmp_path):
    """``data={eval_limit: 50}`` sets a key the demo reads (it was refused with the whole data section), and
    eval.scorer, the arms' default reward, scores the demo's evaluations too (it was refused as unread)."""
    from types import SimpleNamespace

    from dgrpo.config import override_keys
    from dgrpo.demo.pipeline import Demo, demo_config

    assert override_keys("data={eval_limit: 50, train: x}") == ["data.eval_limit", "data.train"]
    assert override_keys("grpo.lr=1e-5") == ["grpo.lr"] and override_keys("a=[") == ["a"]
    sets = ["data={eval_limit: 50}", "eval.scorer=exact"]
    args = SimpleNamespace(quick=True, config=[], overrides=sets, seeds=None, out=str(tmp_path / "o"))
    base = demo_config(args)[0]
    assert base.data.eval_limit == 50 and Demo(base, tmp_path, [], [], {}).eval_kw()["scorer"] == "exact"


def test_a_set_that_an_arm_overrides_is_named(tmp_path):
    """--set grpo.temperature=0.5 changed every arm but token sampling, whose file sets 1.0: silently."""
    import warnings
    from types import SimpleNamespace

    from dgrpo.demo.pipeline import demo_config

    sets = ["grpo.temperature=0.5", "grpo.lr=2e-4"]
    args = SimpleNamespace(quick=True, config=[], overrides=sets, seeds=None, out=str(tmp_path / "o"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        demo_config(args)
    assert [str(w.message) for w in caught] == [
        "--set grpo.temperature=0.5 does not reach the grpo_sampling arm, which sets grpo.temperature to 1.0 itself "
        "(builtin/grpo_sampling.yaml)"
    ]


def test_a_quick_demos_runs_do_not_stop_for_skipped_steps(tmp_path):
    """``--quick --set grpo.steps=400``: the null arm's groups all left the filter window, and its run stopped with
    the stall error (tiny.yaml keeps the stop, which builtin/demo.yaml turns off: a collapse is a result there)."""
    from types import SimpleNamespace

    from dgrpo.demo.pipeline import demo_config

    mine = tmp_path / "mine.yaml"
    mine.write_text("grpo: {max_skip_streak: 5}\n")
    for quick, config, sets, limit in (
        (True, [], [], 0),
        (False, [], [], 0),
        (True, [], ["grpo.max_skip_streak=7"], 7),
        (True, [str(mine)], [], 5),  # (a --config file of one's own wins too)
    ):
        args = SimpleNamespace(quick=quick, config=config, overrides=sets, seeds=None, out=str(tmp_path / "o"))
        assert demo_config(args)[0].grpo.max_skip_streak == limit


def test_the_command_it_writes_reads_back_as_given():
    """results.json's command is run by pasting it: a ``--set`` value with a space was split by the shell."""
    import shlex
    from types import SimpleNamespace

    from dgrpo.demo.report import command_line

    args = SimpleNamespace(quick=True, seeds=2, config=["my cfg.yaml"], overrides=["data.test=[a, b]"], out="o")
    assert shlex.split(command_line(args)) == [
        *("dgrpo", "demo", "--quick", "--seeds", "2", "--config", "my cfg.yaml", "--set", "data.test=[a, b]"),
        *("--out", "o"),
    ]


def test_one_sft_seeds_rl_seeds_are_said_to_give_no_interval_for_want_of_sft_seeds():
    """1 SFT seed x 3 RL seeds: results.md said "no interval (1 pair)" in the row that counts 3 pairs (the interval
    is over the SFT seeds)."""
    from dgrpo.demo.report import comparison_table

    T, F = True, False
    arm = {(0, r): [T, T, F, F] for r in range(3)}
    c = compare(arm, {0: [T, F, F, F]})
    res = {"analysis": {"comparisons": [{"a": "dropout_grpo", "b": "sft", "checkpoint": "best", "split": "t", **c}]}}
    row = comparison_table(res, "t")[-1]
    assert row.startswith("| Dropout-GRPO vs SFT | best-valid | +25.00 no interval (1 SFT seed) | 3 |"), row


def test_the_updating_steps_are_not_rounded_up_to_every_step():
    """Runs that updated at 50, 50, 49 and 50 of 50 steps: the diagnostics table said "50 of 50" (the mean, 49.75,
    rounded), as if no run had skipped a step."""
    from dgrpo.demo.report import diagnostics_table

    def run(updates):
        return {"arm": "dropout_grpo", "updates": updates, "best_step": 10, **dict.fromkeys(KEYS, [0.5, 0.5])}

    KEYS = ("reward_std", "frac_groups_kept", "distinct_answers")
    rows = diagnostics_table({"steps": 50, "runs": [run(u) for u in (50, 50, 49, 50)]})
    assert rows[-1].endswith("| 49.75 of 50 | 10, 10, 10, 10 |"), rows[-1]
    assert diagnostics_table({"steps": 50, "runs": [run(0), run(0)]})[-1].endswith("| 0 of 50 | 10, 10 |")


def test_a_diagnostic_known_at_one_end_of_the_runs_only_is_a_dash_at_the_other():
    """A diagnostic logged in the first 10 steps and in none of the last (or the reverse) is "-" on that side; the
    table raised StatisticsError (the mean of no values) and the demo ended without its results."""
    from dgrpo.demo.report import diagnostics_table

    run = {"arm": "dropout_grpo", "updates": 3, "best_step": 10, "reward_std": [0.25, None]}
    run |= {"frac_groups_kept": [None, 0.5], "distinct_answers": [None, None]}
    row = diagnostics_table({"steps": 50, "runs": [run]})[-1]
    assert row == "| Dropout-GRPO | 0.250 -> - | - -> 0.500 | - | 3 of 50 | 10 |"


def test_the_report_says_the_deterministic_arm_ran_once_per_sft_seed():
    """--seeds 3: summary.txt said "every RL arm ran 3 seed(s) from each" and results.md "3 RL seed(s) per arm", where
    the deterministic arm runs once per SFT checkpoint (arm_tasks)."""
    from dgrpo.demo.report import results_markdown, summary_paragraph

    def res(n_rl):
        acc = {"sft": {"best": [0.2], "final": [0.2]}}
        claims = claim_verdicts([], {}, "test")
        analysis = {"comparisons": [], "claims": claims, "accuracy": {"test": acc}, "reward_std_max": {}}
        return {"headline": "test", "n_sft": 1, "n_rl": n_rl, "splits": {"test": 10}, "analysis": analysis} | {
            "wall_s": {"total": 1.0},
            "command": "dgrpo demo",
            "models": [],
            "runs": [],
            "steps": 5,
        }

    once = "(the deterministic arm 1: it cannot update, whatever its seed)"
    assert f"every RL arm ran 3 seeds from each {once}." in summary_paragraph(res(3))
    assert results_markdown(res(3)).startswith(f"# dgrpo demo: 1 SFT seed x 3 RL seeds per arm {once}\n")
    assert "every RL arm ran 1 seed from each. Paired" in summary_paragraph(res(1))  # ("1 seed(s)")
    assert summary_paragraph(res(1)).startswith("1 Coconut SFT checkpoint scores 20.00% on average")  # ("checkpoints")
    two = res(1) | {"n_sft": 2}
    assert summary_paragraph(two).startswith("2 Coconut SFT checkpoints score 20.00% on average")


@pytest.mark.slow
@pytest.mark.parametrize(
    "argv, said",
    [
        (["--seeds", "0"], "--sft-seeds and --seeds must be >= 1, got 1 and 0"),
        (["--set", "grpo.nosuch=1"], "unknown config key 'grpo.nosuch'"),
        (["--set", "data.test=x"], "--set data.test: dgrpo demo does not read it"),
        # (a read-out split left empty: 0 of 0 after the whole pipeline ran)
        (["--set", "data.eval_limit=1000"], "data.eval_limit=1000 leaves none of the 1000 validation problems"),
        (["--set", "task.n_test=1"], "task.n_test=1: the shifted read-out takes half of it"),
    ],
)
def test_valid_demo_says_a_bad_setting_in_an_argument_error(tmp_path, monkeypatch, capsys, argv, said):
    """experiments/valid_demo.py: a setting the demo refuses (one line from ``dgrpo demo``) ended in a traceback."""
    script = Path(__file__).resolve().parents[1] / "experiments" / "valid_demo.py"
    code, _, err = run_script(script, ["--out", tmp_path / "o", *argv], monkeypatch, capsys)
    assert code == 2 and "Traceback" not in err, err[-2000:]
    assert err.strip().splitlines()[-1].startswith("valid_demo.py: error: ") and said in err, err
    assert not (tmp_path / "o").exists()


def test_valid_demo_names_a_one_operation_shifted_read_out_in_the_singular():
    """experiments/valid_demo.py named a 2-step task's shifted read-out "1 operations (task seed 4321)" (the demo's
    own shifted split says "1 operation"); the held-out validation problems are those the selection never reads."""
    import importlib.util

    from dgrpo.config import Config, load_config

    path = Path(__file__).resolve().parents[1] / "experiments" / "valid_demo.py"
    spec = importlib.util.spec_from_file_location("valid_demo", path)
    assert spec is not None and spec.loader is not None
    valid_demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(valid_demo)
    sets = ["task.n_steps=2", "task.n_train=64", "task.n_valid=16", "task.n_test=8", "data.eval_limit=10"]
    selection, readout = valid_demo.read_out_on(load_config(Config, None, sets))
    assert list(readout) == ["held-out valid (6)", "1 operation (task seed 4321)"]
    assert len(selection) == 10 and len(readout["1 operation (task seed 4321)"]) == 4
    assert not {r.question for r in selection} & {r.question for r in readout["held-out valid (6)"]}


def test_valid_demo_progress_lines_tell_its_two_validation_splits_apart():
    """experiments/valid_demo.py's progress lines read "SFT seed 0: valid 0.094, valid 0.062, ...": the selection's
    validation problems and the held-out ones were both "valid", the shifted split "3" (a line named a split by its
    first word)."""
    import importlib.util

    from dgrpo.config import Config, load_config
    from dgrpo.demo.pipeline import _accs

    path = Path(__file__).resolve().parents[1] / "experiments" / "valid_demo.py"
    spec = importlib.util.spec_from_file_location("valid_demo", path)
    assert spec is not None and spec.loader is not None
    valid_demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(valid_demo)
    sets = ["task.n_train=64", "task.n_valid=16", "task.n_test=8", "data.eval_limit=10"]
    _, readout = valid_demo.read_out_on(load_config(Config, None, sets))
    line = "valid 0.500, " + _accs({"splits": {name: {"accuracy": 0.25} for name in readout}})  # (as run_sft's)
    assert line == "valid 0.500, held-out valid 0.250, 3 operations 0.250"


@pytest.mark.slow
@pytest.mark.parametrize("argv, resume", [([], True), (["--resume", "never"], False)])
def test_valid_demo_reads_back_finished_runs_as_the_demo_does(tmp_path, monkeypatch, capsys, argv, resume):
    """experiments/valid_demo.py takes the demo's ``--resume`` (default auto): its pipeline is asked to read back the
    runs that finished, or (never) to run them all (the pipeline and the files stood in for)."""
    import dgrpo.demo as demo_pkg

    seen = []
    monkeypatch.setattr(demo_pkg, "run_pipeline", lambda demo, *a, **kw: seen.append(demo.resume))
    monkeypatch.setattr(demo_pkg, "write_results", lambda demo, *a: (demo.out / "summary.txt").write_text("done"))
    script = Path(__file__).resolve().parents[1] / "experiments" / "valid_demo.py"
    (tmp_path / "o").mkdir()
    code, out, err = run_script(script, ["--out", tmp_path / "o", *argv], monkeypatch, capsys)
    assert code == 0 and seen == [resume] and out.strip() == "done", err[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize(
    "script, argv, code, said",
    [
        ("ood_variants", ["--help"], 0, "usage: ood_variants.py [-h] SFT_CHECKPOINT [SFT_CHECKPOINT ...]"),
        ("ood_variants", [], 2, "error: the following arguments are required: SFT_CHECKPOINT"),
        ("ood_variants", ["{tmp}/missing"], 2, "ood_variants.py: error: checkpoint directory not found: "),
        ("valid_sweep", ["--help"], 0, "usage: valid_sweep.py [-h] SFT_CHECKPOINT NAME SEED [KEY=VALUE ...]"),
        ("valid_sweep", ["{tmp}", "base", "x"], 2, "argument SEED: invalid int value: 'x'"),
        ("valid_sweep", ["{tmp}", "base", "0", "grpo.nosuch=1"], 2, "error: unknown config key 'grpo.nosuch'"),
        # (exit 2 for a wrong checkpoint path: valid_sweep.sh stops its sweep on it)
        ("valid_sweep", ["{tmp}/missing", "base", "0"], 2, "valid_sweep.py: error: checkpoint directory not found: "),
    ],
)
def test_the_validation_experiments_answer_help_and_bad_arguments_as_argparse(
    tmp_path, monkeypatch, capsys, script, argv, code, said
):
    """experiments/ood_variants.py and valid_sweep.py printed their docstring for --help and exited 1, as for a bad
    argument ("error: ...", exit 1); the other scripts answer with argparse's help (exit 0) and errors (exit 2)."""
    path = Path(__file__).resolve().parents[1] / "experiments" / f"{script}.py"
    monkeypatch.chdir(tmp_path)
    got, out, err = run_script(path, [a.format(tmp=tmp_path) for a in argv], monkeypatch, capsys)
    assert got == code and said in out + err, (got, err[-2000:])
    assert "Traceback" not in err and not (tmp_path / "runs").exists()


def test_valid_sweep_reads_the_checkpoints_task_and_its_first_steps(sft_checkpoint, tmp_path, monkeypatch, capsys):
    """experiments/valid_sweep.py trained and read out on the default task whatever the checkpoint's (1000 validation
    problems of 4-operation chains for a model of another task), and its "first 10 steps" were rows 1-10 of
    metrics.jsonl, step 0 left out (a row that was once a step-0 evaluation). Now the checkpoint's task, as
    ood_variants.py, and the first window starts at step 0."""
    path = Path(__file__).resolve().parents[1] / "experiments" / "valid_sweep.py"
    monkeypatch.chdir(tmp_path)
    over = ["grpo.steps=2", "grpo.warmup_steps=0", "grpo.prompts_per_step=4", "grpo.group_size=4", "threads=1"]
    got, out, err = run_script(path, [sft_checkpoint, "base", "0", *over], monkeypatch, capsys)
    assert got == 0, err[-2000:]
    res = json.loads(out.splitlines()[-1])
    trained = json.loads((Path(sft_checkpoint) / "run_config.json").read_text())["task"]
    assert res["n_valid"] == trained["n_valid"] != 1000
    rows = [json.loads(line) for line in (tmp_path / "runs/sweep/base_s0/metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    mean = round(sum(r["distinct_answers"] for r in rows) / 2, 3)
    assert res["diag_first_last10"]["distinct_answers"] == [mean, mean]
    assert json.loads((tmp_path / "runs/sweep/results.jsonl").read_text()) == res


def test_valid_sweep_sh_without_a_checkpoint_says_its_usage_and_writes_nothing(tmp_path):
    """experiments/valid_sweep.sh without its argument made runs/sweep/ in the working folder, then told its usage."""
    script = Path(__file__).resolve().parents[1] / "experiments" / "valid_sweep.sh"
    r = subprocess.run(["bash", str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and "usage: experiments/valid_sweep.sh SFT_CHECKPOINT" in r.stderr, r.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("code", [2, 1])
def test_valid_sweep_sh_stops_at_a_refused_command_line_and_goes_on_past_a_failed_run(tmp_path, code):
    """experiments/valid_sweep.sh given a wrong checkpoint path ran all 16 rows, each refusing it the same way (exit 2,
    valid_sweep.py's argparse error), then listed them all as failed. Now it stops at the first with that error; a run
    that fails otherwise (exit 1: a traceback) is still named at the end, after the other rows (the interpreter is a
    stand-in that exits with ``code``)."""
    script = Path(__file__).resolve().parents[1] / "experiments" / "valid_sweep.sh"
    fake = tmp_path / "python"
    fake.write_text(f'#!/bin/sh\necho "$3" >> calls\necho "valid_sweep.py: error: not found: $2" >&2\nexit {code}\n')
    fake.chmod(0o755)
    env = {**os.environ, "PYTHON": str(fake)}
    r = subprocess.run(["bash", str(script), "runs/nope"], cwd=tmp_path, env=env, capture_output=True, text=True)
    rows = (tmp_path / "calls").read_text().split()
    if code == 2:
        assert r.returncode == 2 and rows == ["base"], (r.stdout, r.stderr)
        assert (
            r.stderr.strip()
            == "experiments/valid_sweep.sh: stopped at base/s0: valid_sweep.py: error: not found: runs/nope"
        )
    else:
        assert r.returncode == 1 and len(rows) == 16 and r.stdout.startswith("FAILED: base/s0 K16/s0 "), r.stdout


def test_ood_variants_draws_the_shifts_of_the_task_the_checkpoint_was_trained_on(sft_checkpoint, tmp_path):
    """experiments/ood_variants.py drew its splits from the default task (4 operations, operands 10..99 out of
    distribution) whatever the checkpoint's. Now the task of its run_config.json (as ``dgrpo eval`` reads it), with
    the experiment's own seed and sizes; the default task's variants are the ones published
    (docs/demo/valid_sweep.md)."""
    import importlib.util
    import shutil
    from dataclasses import replace

    from dgrpo.config import TaskConfig
    from dgrpo.model.verified import write_manifest

    path = Path(__file__).resolve().parents[1] / "experiments" / "ood_variants.py"
    spec = importlib.util.spec_from_file_location("ood_variants", path)
    assert spec is not None and spec.loader is not None
    ood = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ood)
    ckpt = tmp_path / "ckpt"
    shutil.copytree(sft_checkpoint, ckpt)
    run_config = json.loads((ckpt / "run_config.json").read_text())
    run_config["task"] |= {"n_steps": 3, "ood_extra_steps": 1, "ood_max_operand": 50}
    (ckpt / "run_config.json").write_text(json.dumps(run_config))
    write_manifest(ckpt)
    task = ood.checkpoint_task(str(ckpt))
    assert (task.n_steps, task.ood_extra_steps, task.ood_max_operand) == (3, 1, 50)
    assert (task.seed, task.n_test, task.n_valid) == (4321, 500, 500)
    names = list(ood.variants(task))
    assert names[:2] == ["in-distribution (3 operations)", "2 operations"]
    assert names[3:] == [
        "4 operations (ood_steps, the old split)",
        "operands 10..12 (ood_max_operand=12)",
        "operands 10..19 (ood_max_operand=19)",
        "operands 10..50 (ood_numbers, the old split)",
    ]
    published = ood.variants(replace(TaskConfig(), **ood.DRAW))
    assert list(published)[:4] == [
        "in-distribution (4 operations)",
        "3 operations",
        "5 operations (ood_extra_steps=1)",
        "6 operations (ood_steps, the old split)",
    ]
    assert published["3 operations"] == ({"n_steps": 3}, "test")


def test_claim_1_does_not_round_a_differing_item_away():
    """Claim 1 not resolved because 1 item of 1 pair in 4 differs: results.md and summary.txt said "0 items gained,
    0 lost per pair" (the mean per pair, 0.25, rounded to 0)."""
    from dgrpo.demo.report import claim_lines, summary_paragraph

    T, F = True, False
    sft = {s: [T, F, F] for s in range(4)}
    det = {(s, 0): [T, F, F] for s in range(4)} | {(3, 0): [T, T, F]}
    c = compare(det, sft)
    comparisons = [{"a": "grpo_deterministic", "b": "sft", "checkpoint": k, "split": "test", **c} for k in CHECKPOINTS]
    claims = claim_verdicts(comparisons, {"grpo_deterministic": 0.0}, "test")
    res = {"analysis": {"claims": claims, "accuracy": {"test": {"sft": {"final": [1 / 3] * 4}}}}}
    res["analysis"]["reward_std_max"] = {"grpo_deterministic": 0.0}
    res |= {"headline": "test", "n_sft": 4, "n_rl": 1, "splits": {"test": 3}, "wall_s": {"total": 1.0}}
    assert claim_lines(res)[0].startswith(
        "1. deterministic GRPO = SFT exactly: best-valid checkpoint: **not resolved** (0.25 items gained, 0 lost per "
        "pair; 4 pairs)"
    )
    assert "not resolved (0.25 items gained and 0 lost per pair;" in summary_paragraph(res)
