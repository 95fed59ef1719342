"""Multi-process training on torch.distributed: 2 ranks on CPU (gloo) under torchrun.

Each test launches ``torchrun --standalone --nproc_per_node 2`` on this file, which then runs as the
worker (``python test_distributed.py SCENARIO OUT ARGS_JSON``, see the bottom); a test's parametrizations, or its
cases, share one launch where they are runs one after the other (scenario ``runs``: a launch's time is mostly its
workers' start-up and teardown); a run resumed, as after a stop, is a launch of its own. A hung worker dumps its
stacks and exits (faulthandler watchdog), and a wall-clock timeout ends the launch, so a hang fails the test
instead of blocking CI.

The forced-filter hook is test-only: the worker monkeypatches ``dgrpo.training.grpo.group_filter``
(rank r keeps all or none of its groups at step s) and the rewards; nothing in the public config.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dgrpo.training.distributed import FSDP_ENV, fsdp2_missing

pytestmark = pytest.mark.slow  # torchrun runs (and one in-process run of both trainers, 2-4 s)
#: FSDP2 training needs torch >= 2.13 (an older one gets a config error: tests/test_reliability.py)
NEEDS_FSDP2 = pytest.mark.skipif(bool(fsdp2_missing()), reason="this torch's FSDP2 lacks what the sharded update sets")
HERE = Path(__file__).resolve()
TIMEOUT_S = 180  # per launch; a healthy one takes about 10 s on 2 cores

# one GRPO setting for the CLI runs (over conftest.tiny_args: the tiny model and task)
GRPO_SETS: dict[str, object] = {"perturbation.p": 0.3, "data.eval_limit": 32, "threads": 1}
# a gradient that is never zero: the tiny SFT model is at chance level, so whole batches of groups can
# have no reward variance (a zero GRPO gradient); the EMA baseline (0.5 at the start) gives every
# rollout a non-zero advantage through the same update code (global counts, chunks, reduction)
NONZERO = {"grpo.advantage": "ema", "grpo.filter": "false"}
# the 1-vs-2-process comparison: plain SGD at lr 1 (the update is the clipped gradient itself), KL on,
# micro-batches of 3 so that chunk boundaries differ between the runs, answer tokens sampled (each row from its seed)
PARITY = {
    **NONZERO,
    "perturbation.p": "0.3",
    "grpo.temperature": "1",
    "grpo.beta0": "0.01",
    "grpo.micro_batch_size": "3",
    "grpo.prompts_per_step": "8",
    "grpo.group_size": "4",
    "grpo.lr": "1.0",
    "grpo.max_grad_norm": "1.0",
}


def torchrun(scenario: str, out: Path, args: dict | None = None, *, nproc: int = 2, env: dict | None = None) -> str:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        str(HERE),
        scenario,
        str(out),
        json.dumps(args or {}),
    ]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", **(env or {})},
    )
    try:
        log, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:  # (the workers' own watchdog should have fired first)
        os.killpg(proc.pid, signal.SIGTERM)  # torchrun terminates its workers on SIGTERM
        try:
            log, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            log, _ = proc.communicate()
        pytest.fail(f"{scenario}: no result within {TIMEOUT_S}s (a collective hang?)\n{log[-4000:]}")
    assert proc.returncode == 0, log[-6000:]
    return log


def rank_records(out: Path) -> list[list[dict]]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def flat_params(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).float() for p in model.parameters()])


# ----------------------------------------------------------------------------------------------- tests
def test_grpo_two_ranks_stay_bit_identical(sft_checkpoint, tmp_path):
    out = tmp_path / "run"
    torchrun("grpo", out, {"init": str(sft_checkpoint), "sets": {**GRPO_SETS, **NONZERO}})
    recs = rank_records(out)
    assert [len(r) for r in recs] == [3, 3]
    assert len({r["checksum"] for r in recs[0]}) == 3  # the weights moved at every step
    for r0, r1 in zip(*recs):
        assert r0["identical"] and r1["identical"], (r0, r1)  # all ranks hold the same bits after every step
        assert r0["skipped"] == r1["skipped"] == 0 and r0["n_rollouts_kept"] == r1["n_rollouts_kept"] == 32
        assert r0["reward_mean"] == r1["reward_mean"]  # reduced metrics agree
        # one EMA baseline over the global batch (each rank kept its own, from its own rewards)
        assert r0["ema_baseline"] == r1["ema_baseline"] is not None
    assert len({r["ema_baseline"] for r in recs[0]}) == 3  # it moved at every step
    # rank 0 alone wrote: one row per step, one final checkpoint, the gathered test eval over all 64 records
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows if "reward_mean" in row] == [0, 1, 2]
    assert all(row["time_comm_s"] >= 0 for row in rows if "reward_mean" in row)
    assert [row["step"] for row in rows if "eval/valid/accuracy" in row] == [0, 2, 3]
    assert (out / "final" / "model.safetensors").exists() and json.loads((out / "summary.json").read_text())[
        "skipped_steps"
    ] == 0
    res = json.loads((out / "eval" / "builtin_test" / "results.json").read_text())
    assert res["n"] == 64 and len((out / "eval" / "builtin_test" / "predictions.jsonl").read_text().splitlines()) == 64
    # the test row, once: the gathered accuracies of final/ and (not the final model here) best/
    best = json.loads((out / "eval_best" / "builtin_test" / "results.json").read_text())
    tested = {"test/builtin_test/accuracy": res["accuracy"], "test_best/builtin_test/accuracy": best["accuracy"]}
    assert rows[-1] == {"step": 3, **tested} and sum("test/builtin_test/accuracy" in row for row in rows) == 1


@pytest.fixture(scope="module")
def asymmetric_runs(sft_checkpoint, tmp_path_factory) -> dict[str, Path]:
    """test_asymmetric_filter_does_not_hang's runs, without FSDP2 and, where this torch has it, with (fsdp full), in
    one launch: the run of each mode."""
    tmp, modes = tmp_path_factory.mktemp("asymmetric"), ["none"] + ([] if fsdp2_missing() else ["full"])
    keep = [[1, 0], [0, 1], [0, 0]]
    launch: list[tuple[str, Path, dict, dict]] = [
        ("grpo", tmp / m, {"init": str(sft_checkpoint), "sets": {**GRPO_SETS, "fsdp": m}, "keep": keep}, {})
        for m in modes
    ]
    torchrun("runs", tmp, runs(launch))
    return {m: tmp / m for m in modes}


@pytest.mark.parametrize("fsdp", ["none", pytest.param("full", marks=NEEDS_FSDP2)], ids=["allreduce", "fsdp2"])
def test_asymmetric_filter_does_not_hang(asymmetric_runs, fsdp):
    """Step 0: rank 0 keeps all its groups, rank 1 none; step 1: the reverse; step 2: nobody keeps any.
    (The worker also sets the rewards to 0, 1, 0, 1 in every group, so that kept groups move the weights.)
    FSDP2 is switched on by the config key here (``--set fsdp=full``), by the environment variable below."""
    out = asymmetric_runs[fsdp]
    recs = rank_records(out)
    assert [len(r) for r in recs] == [3, 3]  # the same number of steps on both ranks
    for steps in recs:
        assert [s["skipped"] for s in steps] == [0, 0, 1]
        assert [s["n_rollouts_kept"] for s in steps] == [16, 16, 0]  # global counts: 4 groups of 4 on one rank
        assert [s["frac_groups_kept"] for s in steps] == [0.5, 0.5, 0.0]
        assert all(s["identical"] for s in steps)
        assert [s["filter_calls"] for s in steps] == [1, 2, 3]
        sums = [s["checksum"] for s in steps]
        assert (
            sums[0] != sums[1] and sums[1] == sums[2]
        )  # the weights moved at steps 0 and 1; the skipped step left them
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if "reward_mean" in x]
    assert [row["skipped"] for row in rows] == [0, 0, 1]
    assert json.loads((out / "summary.json").read_text())["skipped_steps"] == 1
    from dgrpo.model.latent_lm import LatentLM

    LatentLM.from_pretrained(out / "final")  # a gathered checkpoint under FSDP2 too
    from safetensors import safe_open

    with safe_open(str(out / "final" / "model.safetensors"), "pt") as f:  # the tied head saved once (was twice)
        assert "lm_head.weight" not in f.keys() and "model.embed_tokens.weight" in f.keys()
    # the CLI's Dist.close() destroyed the group and joined gloo's threads on both ranks, under FSDP2 too
    assert [json.loads((out / f"gloo{r}.json").read_text()) for r in range(2)] == [[], []]


@pytest.fixture(scope="module")
def parity_runs(sft_checkpoint, tmp_path_factory) -> dict[str, Path]:
    """test_two_ranks_match_one_process's runs, without FSDP2 and, where this torch has it, with (DGRPO_FSDP sharded),
    in one launch: the run of each mode. Under FSDP2 the ranks also recompute each layer in backward (the same
    gradients): the regions sit inside the sharded layers' gather and reshard."""
    tmp, modes = tmp_path_factory.mktemp("parity"), ["0"] + ([] if fsdp2_missing() else ["sharded"])
    recompute = {"grpo.recompute": "true", "grpo.recompute_granularity": "layer"}
    launch = [
        ("parity", tmp / m, {"init": str(sft_checkpoint), "sets": recompute if m == "sharded" else {}}, {FSDP_ENV: m})
        for m in modes
    ]
    torchrun("runs", tmp, runs(launch))
    return {m: tmp / m for m in modes}


@pytest.mark.parametrize("fsdp", ["0", pytest.param("sharded", marks=NEEDS_FSDP2)], ids=["allreduce", "fsdp2"])
def test_two_ranks_match_one_process(sft_checkpoint, parity_runs, fsdp):
    """The same global batch of prompts and rollout seeds (masks and sampled tokens): one step on 2 ranks = one step
    in 1 process (under FSDP2 with layer recomputation)."""
    from dgrpo.data.synthetic import generate_split
    from dgrpo.model.latent_lm import LatentLM
    from dgrpo.training.grpo import GRPOTrainer

    from conftest import tiny_config

    out = parity_runs[fsdp]
    cfg = tiny_config(**PARITY)
    start = flat_params(LatentLM.from_pretrained(sft_checkpoint).model)
    tr = GRPOTrainer(LatentLM.from_pretrained(sft_checkpoint), cfg, generate_split(cfg.task, "train"))
    tr.opt = torch.optim.SGD(tr.lm.model.parameters(), lr=1.0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # like each worker (and 2 threads on a busy 2-core machine can be 100x slower)
    try:
        m = tr.step()
    finally:
        torch.set_num_threads(threads)
    one = flat_params(tr.lm.model)
    two = torch.load(out / "params.pt")
    m2 = json.loads((out / "metrics.json").read_text())
    assert m["skipped"] == m2["skipped"] == 0 and m["n_rollouts_kept"] == m2["n_rollouts_kept"] == 32
    assert m["reward_mean"] == m2["reward_mean"]  # the same rollouts
    assert m["ema_baseline"] == m2["ema_baseline"]  # the baseline of the global batch, to the bit
    # rollouts.jsonl's first rows come from the global batch (they were rank 0's 16 alone, its groups numbered locally)
    rows = tr.rollout_rows(20)
    assert len(rows) == 20 and [r["group"] for r in rows] == [i // 4 for i in range(20)]
    assert json.loads((out / "rollouts.json").read_text()) == rows
    step_norm = float((one - start).norm())
    assert step_norm > 1e-3  # the step moved the weights (SGD at lr 1: the update is the gradient)
    assert torch.allclose(one, two, rtol=0, atol=1e-6), float((one - two).abs().max())
    assert float((one - two).norm()) < 1e-4 * step_norm
    assert m2["grad_norm"] == pytest.approx(m["grad_norm"], rel=1e-5)
    if fsdp == "sharded":  # the sharded checkpoint, consolidated, is the same model
        assert torch.equal(torch.load(out / "consolidated.pt"), two)
    # Dist.close() destroyed the process group here, not at interpreter exit: gloo's threads are gone (FSDP2's
    # mesh held the group past destroy_process_group, and its teardown at exit could abort the finished run)
    threads_open, threads_closed = json.loads((out / "threads.json").read_text())
    assert not threads_closed, threads_closed
    assert threads_open or torch.__version__ < "2.11", "gloo's threads are not seen: the check above checks nothing"


def test_sft_two_ranks_cli(tmp_path):
    out = tmp_path / "sft"
    sets = {
        "task.n_train": 256,
        "task.n_valid": 32,
        "task.n_test": 32,
        "sft.epochs_per_stage": 1,
        "sft.num_epochs": 2,
        "sft.batch_size": 32,
        "sft.warmup_steps": 2,
        "threads": 1,
    }
    torchrun("cli", out, {"argv": ["sft", "--out", str(out)], "sets": sets})
    assert {"eval", "final", "stage-0", "stage-1"} <= {p.name for p in out.iterdir() if p.is_dir()}
    assert (out / "final" / "model.safetensors").exists()
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["stage"] for row in rows if "eval/valid/accuracy" in row] == [0, 1]  # written once, by rank 0
    assert len(rows) == len({json.dumps(r, sort_keys=True) for r in rows})
    assert (
        json.loads((out / "eval" / "builtin_test" / "results.json").read_text())["n"] == 32
    )  # gathered from both shards
    from dgrpo.model.latent_lm import LatentLM

    LatentLM.from_pretrained(out / "final")


def test_eval_shards_its_datasets_over_ranks_and_matches_one_process(sft_checkpoint, tmp_path, run_cli):
    """``dgrpo eval`` under torchrun was refused: a researcher evaluated GSM8K on one GPU of eight. Each rank now
    answers a contiguous shard of every dataset and rank 0 writes the gathered results, the same predictions as one
    process (greedy), ``eval.limit`` and a plain prompt's shots applied before the split: a rank whose shard is
    empty (fewer records than ranks) answers none, and the shots stay every rank's examples."""

    def results(out: Path) -> tuple[dict, list[dict]]:
        summary = json.loads((out / "results.json").read_text())
        rows = [json.loads(x) for x in (out / "predictions.jsonl").read_text().splitlines()]
        return {k: summary[k] for k in ("n", "correct", "accuracy", "limit", "shots", "mode", "model")}, rows

    cases = {
        "latent": ["--data", "builtin:test", "builtin:valid", "--limit", "21"],  # (an odd count: shards of 10 and 11)
        "plain": ["--data", "builtin:test", "--plain", "--shots", "2", "--limit", "1"],  # (rank 1's shard: empty)
    }
    argvs = {name: ["eval", "--model", str(sft_checkpoint), *data] for name, data in cases.items()}
    launch = [
        ("cli", tmp_path, {"argv": [*argv, "--out", str(tmp_path / f"{n}-2")], "sets": {"threads": 1}}, {})
        for n, argv in argvs.items()
    ]
    logs = runs_of(torchrun("runs", tmp_path, runs(launch)), len(cases))  # (both in one launch)
    for (name, argv), log in zip(argvs.items(), logs):
        one, two = tmp_path / f"{name}-1", tmp_path / f"{name}-2"
        assert run_cli(*argv, "--out", one, *_args({"threads": 1})).returncode == 0  # (the worker's config)
        folders = {"latent": ["builtin_test", "builtin_valid"], "plain": [""]}[name]  # (one --data: --out itself)
        for folder in folders:
            assert results(two / folder) == results(one / folder), (name, folder)
            assert results(two / folder)[0]["n"] == (21 if name == "latent" else 1)
        assert log.count('"dataset": "builtin:test"') == 1, log[-3000:]  # (rank 0 prints each set's line)
        assert log.count(f"dgrpo: loading {sft_checkpoint} (from ") == 1, log[-3000:]  # (and the loading line)


FSDP2_RUNS = [("full", False), ("sharded", False), ("sharded", True)]


def fsdp2_sets(fsdp: str, master: bool) -> dict:
    """The settings of test_fsdp2_runs_write_resumable_checkpoints_and_resume_bit_identical's runs."""
    sets = {**NONZERO, "fsdp": fsdp, "data.valid": "''", "data.test": "[]", "grpo.save_every": 1}
    sets |= {"grpo.keep_last": 3, "perturbation.p": 0.3, "threads": 1}
    if master:
        sets |= {"model.dtype": "bfloat16", "model.master_weights": "true"}
    return sets


@pytest.fixture(scope="module")
def fsdp2_references(sft_checkpoint, tmp_path_factory) -> dict:
    """The runs never stopped of test_fsdp2_runs_write_resumable_checkpoints_and_resume_bit_identical, one per
    parametrization, in one launch (their resumes: a launch each, as a stopped run's)."""
    tmp, argv = tmp_path_factory.mktemp("fsdp2-ref"), ["grpo", "--init", str(sft_checkpoint), "--out"]
    outs = {(fsdp, master): tmp / f"{fsdp}-{master}" for fsdp, master in FSDP2_RUNS}
    launch: list[tuple[str, Path, dict, dict]] = [
        ("cli", out, {"argv": [*argv, str(out)], "sets": fsdp2_sets(*key)}, {}) for key, out in outs.items()
    ]
    torchrun("runs", tmp, runs(launch))
    return outs


@NEEDS_FSDP2
@pytest.mark.parametrize(("fsdp", "master"), FSDP2_RUNS, ids=["full", "sharded", "sharded-master"])
def test_fsdp2_runs_write_resumable_checkpoints_and_resume_bit_identical(
    sft_checkpoint, fsdp2_references, tmp_path, run_cli, fsdp, master
):
    """Under FSDP2 no resumable checkpoint was written: a stopped run (preempted, killed, SIGTERM) lost every step.
    ``fsdp: full``: every rank gathers the model's and the optimizer's state to rank 0, which writes it; a resume
    shards it again. ``fsdp: sharded``: every rank writes its own shards of both (nothing is gathered) and a resume
    reads each rank's back. Resumed from step 1 of 3, the run ends bit-identical to the one never stopped; with bf16
    weights and ``model.master_weights`` too (each rank's shards of the float32 masters are saved and read back)."""
    from safetensors.torch import load_file

    from dgrpo.training.consolidate import read_sharded

    sets, ref, resumed = fsdp2_sets(fsdp, master), fsdp2_references[fsdp, master], tmp_path / "resumed"
    [applied] = json.loads((ref / "applied.json").read_text())  # (what ran: two processes under this FSDP mode)
    assert (applied["processes"], applied["fsdp"], applied["master_weights"]) == (2, fsdp, master), applied
    step1 = ref / "checkpoints" / "step-00000001"
    shards = sorted(p.name for p in (step1 / "dcp").iterdir()) if fsdp == "sharded" else []
    assert shards == ([".metadata", "__0_0.distcp", "__1_0.distcp"] if fsdp == "sharded" else []), shards
    assert (step1 / "model" / "model.safetensors").is_file() == (fsdp == "full")
    argv = ["grpo", "--init", str(sft_checkpoint), "--out", str(resumed), "--resume", str(step1)]
    log = torchrun("cli", resumed, {"argv": argv, "sets": sets})
    assert "resumed at step 1" in log, log[-3000:]
    assert log.count(f"dgrpo: loading {sft_checkpoint} (from ") == 1, log[-3000:]  # (rank 0's line alone)
    assert [e["started_at_step"] for e in json.loads((resumed / "applied.json").read_text())] == [1]

    def final_weights(run: Path) -> dict:
        return load_file(str(run / "final" / "model.safetensors")) if fsdp == "full" else read_sharded(run / "final")

    a, b = final_weights(ref), final_weights(resumed)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not list((ref / "checkpoints").glob(".tmp-*"))  # (the shards' staging folders are gone)
    if fsdp == "sharded":  # the model of a resumable checkpoint: consolidated into its model/, which then loads
        from dgrpo.model.latent_lm import LatentLM
        from dgrpo.model.verified import CheckpointError, verify
        from dgrpo.training.consolidate import consolidate_checkpoint

        with pytest.raises(CheckpointError, match=f"{step1} holds FSDP shards .*: dgrpo consolidate {step1} first"):
            LatentLM.from_pretrained(step1)
        assert consolidate_checkpoint(ref / "checkpoints" / "step-1") == step1 / "model"
        shards = read_sharded(step1, "model")
        loaded = LatentLM.from_pretrained(step1).model.state_dict()
        assert all(torch.equal(loaded[k], v) for k, v in shards.items()) and verify(step1) is None
    # resumed without FSDP2: one line naming the setting (its optimizer state is named by parameter)
    r = run_cli(
        *argv[:3],
        "--out",
        tmp_path / "plain",
        "--resume",
        step1,
        "--allow-config-change",
        *_args({**sets, "fsdp": "none"}),
    )
    expected = "written with FSDP2 and resumed without it: resume it under torchrun with fsdp full or sharded (FSDP2"
    assert r.returncode == 2 and expected in r.stderr, r.stderr[-2000:]  # (it said: with the setting it started with,
    # which a single process, with fsdp set, had been given)


@NEEDS_FSDP2
def test_the_rounded_away_share_of_sharded_weights_is_the_models(sft_checkpoint, tmp_path):
    """The bf16 warning's share of weights an lr step leaves unchanged, under FSDP2 on 3 processes: each rank counted
    its own shards (rank 0, whose share the command line prints, 12% for the model's 13% at lr 3e-4; a share near the
    warning's 10% could go unwarned). Every rank now gets the one-process share of the same weights."""
    from dgrpo.model.latent_lm import LatentLM
    from dgrpo.training.master_weights import rounded_away_share

    torchrun("share", tmp_path, {"init": str(sft_checkpoint), "lr": 3e-4}, nproc=3)
    model = LatentLM.from_pretrained(sft_checkpoint).model.to(torch.bfloat16)
    one = rounded_away_share(list(model.parameters()), 3e-4)
    assert 0.10 < one < 0.20  # (a share the uneven shards tell apart)
    assert json.loads((tmp_path / "shares.json").read_text()) == [one] * 3


# ----------------------------------------------------------------------------------------------- worker
def _args(d: dict) -> list[str]:
    from conftest import tiny_args

    return tiny_args(**d)


def _worker_grpo(out: Path, args: dict) -> None:
    """``dgrpo grpo`` through the CLI, with a check after every step that all ranks hold the same weights,
    and optionally a forced filter outcome per (step, rank)."""
    import torch.distributed as tdist

    from dgrpo import cli
    from dgrpo.training import grpo

    records: list[dict] = []
    calls = {"filter": 0}
    originals = {name: getattr(grpo, name) for name in ("group_filter", "collect_rollouts")}
    keep = args.get("keep")
    if keep:

        def forced_filter(R, lo, hi):
            step = calls["filter"]
            calls["filter"] += 1
            return torch.full((R.shape[0],), bool(keep[step][tdist.get_rank()]), dtype=torch.bool)

        grpo.group_filter = forced_filter
        collect = grpo.collect_rollouts

        def alternating_rewards(*a, **kw):  # rewards 0, 1, 0, 1 in every group: kept groups do move the weights
            ro = collect(*a, **kw)
            ro.rewards = (torch.arange(ro.rewards.numel()) % 2).float().view_as(ro.rewards)
            return ro

        grpo.collect_rollouts = alternating_rewards
    step = grpo.GRPOTrainer.step

    def checked_step(self, prompts=None):
        m = step(self, prompts)
        flat = flat_params(self.lm.model)
        everyone = [torch.empty_like(flat) for _ in range(self.dist.world_size)]
        tdist.all_gather(everyone, flat)
        records.append(
            {
                **{k: m[k] for k in ("step", "skipped", "n_rollouts_kept", "frac_groups_kept", "reward_mean")},
                "ema_baseline": m.get("ema_baseline"),
                "identical": all(torch.equal(everyone[0], x) for x in everyone),
                "filter_calls": calls["filter"],
                "checksum": float(flat.double().sum()),
            }
        )
        return m

    grpo.GRPOTrainer.step = checked_step  # type: ignore[method-assign]
    try:
        assert cli.main(["grpo", "--init", args["init"], "--out", str(out), *_args(args["sets"])]) == 0
    finally:  # (the next run of a ``runs`` launch runs the trainer as it is)
        grpo.GRPOTrainer.step = step  # type: ignore[method-assign]
        for name, original in originals.items():
            setattr(grpo, name, original)
    (out / f"rank{os.environ['RANK']}.json").write_text(json.dumps(records))  # (the CLI closed the process group)
    (out / f"gloo{os.environ['RANK']}.json").write_text(json.dumps(gloo_threads()))  # none left: see Dist.close()


def _worker_parity(out: Path, args: dict) -> None:
    """One GRPO step with SGD on 2 ranks; rank 0 saves the full weights (gathered under FSDP2)."""
    from dgrpo.data.synthetic import generate_split
    from dgrpo.model.latent_lm import LatentLM
    from dgrpo.training.consolidate import consolidate_checkpoint
    from dgrpo.training.distributed import Dist
    from dgrpo.training.grpo import GRPOTrainer

    from conftest import tiny_config

    dist = Dist.from_env(torch.device("cpu"))
    cfg = tiny_config(**PARITY, **args.get("sets", {}))
    tr = GRPOTrainer(LatentLM.from_pretrained(args["init"]), cfg, generate_split(cfg.task, "train"), dist=dist)
    tr.opt = torch.optim.SGD(tr.opt.param_groups[0]["params"], lr=1.0)  # the sharded parameters under FSDP2
    m = tr.step()
    rollouts = tr.rollout_rows(20)  # (a collective: more than rank 0's 16 rows)
    state = dist.full_state_dict(tr.lm.model)
    names = [n for n, _ in tr.lm.model.named_parameters()]  # the model's parameter order (tied weights once)
    flat = torch.cat([state[n].detach().reshape(-1).float() for n in names])
    dist.save_model(tr.lm, out / "ckpt")
    if dist.is_main:
        out.mkdir(parents=True, exist_ok=True)
        torch.save(flat, out / "params.pt")
        (out / "metrics.json").write_text(json.dumps(m))
        (out / "rollouts.json").write_text(json.dumps(rollouts))
        if dist.fsdp and dist.checkpoint == "sharded":
            model = LatentLM.from_pretrained(consolidate_checkpoint(out / "ckpt")).model
            torch.save(torch.cat([p.detach().reshape(-1).float() for p in model.parameters()]), out / "consolidated.pt")
    threads_open = gloo_threads()
    dist.close()
    if dist.is_main:
        (out / "threads.json").write_text(json.dumps([threads_open, gloo_threads()]))


def gloo_threads() -> list[str]:
    """gloo's native threads in this process (its workers, pt_gloo_runloop, and its socket loop, gloo_tcp_loop).

    A thread can exit between the directory listing and the read of its name: such a thread is gone, not counted.
    """
    names = []
    for t in os.listdir("/proc/self/task"):
        try:
            names.append(Path(f"/proc/self/task/{t}/comm").read_text().strip())
        except (FileNotFoundError, ProcessLookupError):
            continue
    return sorted(n for n in names if "gloo" in n)


def _worker_cli(out: Path, args: dict) -> None:
    from dgrpo import cli

    assert cli.main([*args["argv"], *_args(args.get("sets", {}))]) == 0


#: the line ``_worker_runs`` prints between two runs (rank 0's, after every rank ended the one before)
NEXT_RUN = "---- next run ----"


def _worker_runs(out: Path, args: dict) -> None:
    """The scenarios ``runs`` (each ``[scenario, out, args, env]``) one after the other in the same workers: one launch
    (a launch's time is mostly its workers' start-up of torch and transformers, and their teardown). ``env``: the
    variables set for the run (None: unset). Each run joins its own process group and leaves it; torch reuses a
    store's keys for a new group, so from the second run on the group's store is a new one, rank 0's (as without
    torchrun), on a port rank 0 names through torchrun's. The launch's output is split at NEXT_RUN (``runs_of``)."""
    import socket

    import torch.distributed as tdist

    agent = tdist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    for i, (scenario, run_out, run_args, env) in enumerate(args["runs"]):
        if i:  # (every rank ended the run before, its output written out)
            sys.stdout.flush()
            sys.stderr.flush()
            agent.set(f"runs/{i}/ended/{rank}", "1")
            if rank == 0:
                agent.wait([f"runs/{i}/ended/{r}" for r in range(world)])
                print(NEXT_RUN, flush=True)
                with socket.socket() as s:
                    s.bind(("127.0.0.1", 0))
                    agent.set(f"runs/{i}/port", str(s.getsockname()[1]))
            os.environ["MASTER_PORT"] = agent.get(f"runs/{i}/port").decode()
            os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "False"
        for k, v in env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        globals()[f"_worker_{scenario}"](Path(run_out), run_args)


def runs(runs: list[tuple[str, Path, dict, dict]]) -> dict:
    """``torchrun``'s args of a launch of ``runs`` (``_worker_runs``)."""
    return {"runs": [[scenario, str(out), args, env] for scenario, out, args, env in runs]}


def runs_of(log: str, n: int) -> list[str]:
    """The output of each of the ``n`` runs of a ``runs`` launch."""
    parts = log.split(NEXT_RUN)
    assert len(parts) == n, log[-3000:]
    return parts


def _worker_share(out: Path, args: dict) -> None:
    """The bf16 weights sharded by FSDP2 (fsdp=full); rank 0 writes every rank's rounded-away share at ``lr``."""
    from dgrpo.model.latent_lm import LatentLM
    from dgrpo.training.distributed import Dist
    from dgrpo.training.master_weights import rounded_away_share

    dist = Dist.from_env(torch.device("cpu"), fsdp="full", fsdp_env=False)
    lm = LatentLM.from_pretrained(args["init"])
    lm.model.to(torch.bfloat16)  # type: ignore[arg-type]  # (transformers' typing of .to)
    shares = dist.all_gather_objects(rounded_away_share(dist.prepare_model(lm.model), args["lr"]))
    if dist.is_main:
        (out / "shares.json").write_text(json.dumps(shares))
    dist.close()


def scored_shard(local: list, scores: list, rows: str):
    """A user's ``evaluate_fn`` result for the records ``local`` (``q<i>``: score ``scores[i]``): ``rows`` "with"
    (a prediction row per record, each with its score) or "none" (only the mean)."""
    from dgrpo.eval.evaluate import EvalResult

    values = [scores[int(r.question[1:])] for r in local]
    preds = [{"question": r.question, "score": v} for r, v in zip(local, values)] if rows == "with" else []
    mean = sum(values) / len(values) if values else 0.0
    return EvalResult("v", 0.0, len(local), 0, 0, 0, 0, "coconut", 0.0, mean_score=mean, predictions=preds)


def _worker_scores(out: Path, args: dict) -> None:
    """``sharded_scores`` of each case (scores, rows) over the ranks; each rank writes its results."""
    from dgrpo.data import Record
    from dgrpo.training.distributed import Dist
    from dgrpo.training.sharded_eval import sharded_scores

    dist = Dist.from_env(torch.device("cpu"))
    got = []
    for scores, rows in args["cases"]:
        recs = [Record(f"q{i}", [], "1") for i in range(len(scores))]
        got.append(sharded_scores(dist, lambda local, s=scores, k=rows: scored_shard(local, s, k), recs))  # type: ignore[misc]
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{dist.rank}.json").write_text(json.dumps(got))
    dist.close()


if __name__ == "__main__":
    import faulthandler

    faulthandler.dump_traceback_later(
        float(os.environ.get("DGRPO_TEST_WATCHDOG_S", TIMEOUT_S - 30)), exit=True
    )  # a hang: stacks, exit
    torch.set_num_threads(1)
    scenario, out_dir, arg_json = sys.argv[1], Path(sys.argv[2]), json.loads(sys.argv[3])
    workers = {
        "grpo": _worker_grpo,
        "parity": _worker_parity,
        "cli": _worker_cli,
        "runs": _worker_runs,
        "share": _worker_share,
        "scores": _worker_scores,
    }
    workers[scenario](out_dir, arg_json)


def test_a_reward_failing_on_one_rank_stops_every_rank_with_one_line(sft_checkpoint, tmp_path):
    """A reward raises on rank 1 only (its batch of the first step): rank 1 printed its one line and rank 0 a 35-line
    gloo traceback ('Connection closed by peer'), from the next collective (NCCL: a wait for torchrun's timeout).
    Now the ranks agree on the failure in the filter's all-reduce, and each stops with one line, which names it."""
    from conftest import tiny_args

    reward = tmp_path / "flaky.py"
    reward.write_text(  # (not on the start's check, on gold answers)
        "import os\n\n\ndef flaky(completions, records):\n"
        "    if os.environ.get('RANK') == '1' and not all(c.startswith('#### ') for c in completions):\n"
        "        raise ValueError('cannot score this row')\n    return [0.0] * len(completions)\n"
    )
    sets = {**GRPO_SETS, "grpo.steps": 2, "grpo.prompts_per_step": 4, "data.test": "[]", "data.valid": "''"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "dgrpo", "grpo"]
    cmd += ["--init", str(sft_checkpoint), "--out", str(tmp_path / "run")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # the reward (on the first step's batch), and as the scorer of the test set at the end (its shard)
    for what, extra in (
        ("reward", {"grpo.reward": f"{reward}:flaky"}),
        ("scorer", {"eval.scorer": f"{reward}:flaky", "grpo.reward": "numeric", "grpo.steps": 1}),
    ):
        if what == "scorer":
            extra["data.test"] = "[builtin:test]"
        argv = [*cmd[:-1], str(tmp_path / what), *tiny_args(**{**sets, **extra})]
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=TIMEOUT_S)
        log = proc.stdout + proc.stderr
        assert proc.returncode != 0
        own = f"dgrpo: error: rank 1: {what} {reward}:flaky raised ValueError: cannot score this row"
        assert log.count(own) == 1, log[-4000:]
        others = "a reward failed" if what == "reward" else "the evaluation failed"
        assert log.count(f"dgrpo: error: rank 0: {others} in another process") == 1, log[-4000:]
        assert "raised RewardError" not in log, log[-4000:]  # (a scorer's error was wrapped twice: review 3)
        assert "gloo" not in log and "[rank0]: Traceback" not in log, log[-4000:]


@pytest.mark.filterwarnings("ignore:the model was built in Python")
def test_a_python_caller_without_dist_is_told_what_one_process_leaves_out(
    tokenizer, task_records, monkeypatch, tmp_path
):
    """``train_grpo`` / ``train_sft`` / ``GRPOTrainer`` given no ``dist=`` run in one process: the config's ``fsdp``
    was not applied and, under torchrun, every rank trained alone on all the data, without a word (the command line
    warns through ``Dist.from_env``). A warning says so, at the caller's line; with ``dist=`` given, none."""
    import warnings

    from dgrpo.training.distributed import Dist
    from dgrpo.training.grpo import GRPOTrainer
    from dgrpo.training.sft import train_sft

    from conftest import make_lm, tiny_config

    lm, cfg = make_lm(tokenizer), tiny_config(fsdp="full")
    with pytest.warns(
        UserWarning, match=r"fsdp=full is not applied: GRPOTrainer was given no dist= \(one process\)"
    ) as w:
        GRPOTrainer(lm, cfg, task_records[:4])
    assert w[0].filename == __file__
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*was given no dist=")
        GRPOTrainer(lm, cfg, task_records[:4], dist=Dist.single())
        GRPOTrainer(lm, tiny_config(), task_records[:4])  # (fsdp none, one process: nothing left out)
    monkeypatch.setenv("WORLD_SIZE", "2")
    sft = tiny_config(**{"sft.num_epochs": 1, "data.test": "[]", "data.valid": "''"})
    with pytest.warns(UserWarning, match=r"train_sft was given no dist= under torchrun \(WORLD_SIZE=2\)") as w:
        train_sft(lm, task_records[:8], sft, tmp_path / "sft", progress=False, log=lambda *a: None)
    assert any(x.filename == __file__ for x in w if "no dist=" in str(x.message))


@pytest.mark.parametrize("nproc", [2, 3])
def test_validation_mean_score_of_n_processes_is_one_processs_exactly(tmp_path, nproc):
    """A validation's mean score under torchrun (gloo) is one process's, bit for bit, when the evaluate_fn's result
    has a prediction row per record: floats (3 ranks' sums all-reduced gave 0.46428571428571436 for one process's
    0.4642857142857143), a scorer's ints beside its floats (1 and 0.5: 2 ranks gave 0.4666666666666666 for
    0.46666666666666673), a rank with no record; a result with its mean alone (no rows) is as near as its means."""
    from dgrpo.data import Record
    from dgrpo.training.distributed import Dist
    from dgrpo.training.sharded_eval import sharded_scores

    floats = [0.25, 0.3, 0.7, 0.9, 0.1, 0.3, 0.7]
    mixed = [0, 0.3, 0, 0.7, 0.25, 1, 0.25, 0.7, 0.5, 0.7, 0.5, 0.7]
    cases = [(floats, "with"), (mixed, "with"), ([0.5, 0.25], "with"), ([1, 0], "with"), (floats, "none")]
    torchrun("scores", tmp_path, {"cases": cases}, nproc=nproc)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(nproc)]
    for i, (scores, rows) in enumerate(cases):
        recs = [Record(f"q{j}", [], "1") for j in range(len(scores))]
        one = sharded_scores(Dist.single(), lambda local, s=scores, k=rows: scored_shard(local, s, k), recs)
        assert one["mean_score"] == sum(scores) / len(scores)
        for got in (rank[i] for rank in ranks):
            if rows == "with":
                assert got == one, (scores, nproc)
            else:
                assert got == {"accuracy": 0.0, "mean_score": pytest.approx(one["mean_score"], abs=1e-15)}
