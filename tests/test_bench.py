"""The performance suite runs end to end (``--quick``) and writes its outputs; no speed assertions."""

import gzip
import json
import os
import subprocess
import sys

import pytest
import torch

from dgrpo.bench.timeline import UNLABELLED

from conftest import wait_until

ITEM_KEYS = (
    "rollouts",
    "sft",
    "grpo_scaling",
    "perturbation",
    "memory",
    "flops",
    "lora",
    "recompute",
    "parallel",
    "soak",
)
CPU_ONLY = ("parallel", "soak")


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """The quick suite's output folder. It runs while its log grows, up to 570 s: ~100 s on an idle 2-core machine,
    and a busy one took it past a 300 s limit in all (465 s)."""
    out = tmp_path_factory.mktemp("bench")
    log = out.parent / f"{out.name}.log"
    with log.open("w") as err:
        cmd = [sys.executable, "-m", "dgrpo.bench", "--quick", "--out", str(out)]
        proc = subprocess.Popen(cmd, stdout=err, stderr=subprocess.STDOUT)
        try:
            wait_until(
                lambda: proc.poll() is not None,
                proc,
                "the quick suite hangs",
                lambda: log.stat().st_size,
                idle_s=300,
            )
        finally:
            proc.kill()
    assert proc.wait() == 0, log.read_text()[-4000:]
    return out


@pytest.mark.slow
def test_quick_suite_writes_json_and_markdown(quick_run):
    out = quick_run
    data = json.loads((out / "bench.json").read_text())
    assert {"meta", "cpu", "gpu", "table"} <= set(data)
    assert data["meta"]["quick"] is True
    assert data["meta"]["machine"]["omp_wait_policy"]  # the suite pins the OpenMP wait policy
    for key in ITEM_KEYS:
        assert key in data["cpu"], key
        assert "error" not in data["cpu"][key], data["cpu"][key]
    assert "skipped" in data["gpu"] or all(k in data["gpu"] for k in ITEM_KEYS if k not in CPU_ONLY)
    per_k = [v for v in data["cpu"]["rollouts"].values() if isinstance(v, dict) and "per_rollout_s" in v]
    assert len(per_k) == 2  # the two group sizes
    for v in per_k:
        assert set(v["per_rollout_s"]) == {"batched_locked", "sequential_native", "recompute_batch1"}
    assert data["cpu"]["sft"]["max_abs_loss_diff"] <= data["cpu"]["sft"]["tolerance"]
    assert data["cpu"]["memory"]["replay_bytes_per_rollout"]["seed"] == 8
    draw = data["cpu"]["perturbation"]["mask_draw"]  # serial vs split host draw, alternated
    assert draw["shape"] == [128, 28, 1536] and draw["threads"] >= 1 and draw["ratio"] > 0
    assert data["cpu"]["flops"]["achieved_flops_per_s"] > 0
    lora = data["cpu"]["lora"]
    assert 0 < lora["params"]["lora"][0] < lora["params"]["full"][0]  # (trainable, total) per arm
    assert 0 < lora["state_bytes"]["lora"] < lora["state_bytes"]["full"]
    rec = data["cpu"]["recompute"]
    kept = rec["saved_bytes"]  # activations kept for backward: the layers' inputs are more than the calls' inputs
    assert 0 < kept["call"] < kept["layer"] < kept["layer, latent steps kept"] < kept["full"]
    par = data["cpu"]["parallel"]  # --quick's two arms ran and timed their steps: one process, one per CPU
    assert len(par["steps_per_s"]) == 2 and all(r and min(r) > 0 for r in par["steps_per_s"].values())
    soak = data["cpu"]["soak"]
    assert [st for st, _ in soak["samples"]][:3] == [0, 10, 20] and len(soak["samples"]) >= 4  # RSS every 10 steps
    assert soak["rss_last"][0] == soak["steps"] and abs(soak["slope_mib_per_100_steps"]) < 1e4
    items = {row["item"] for row in data["table"]}
    assert {
        "1. rollouts",
        "2. Coconut SFT step",
        "3. GRPO step scaling",
        "4. cost of the perturbation",
        "5. memory",
        "6. distance to the machine's limit",
        "8. memory soak",
    } <= items
    for row in data["table"]:
        assert {"item", "configuration", "values", "ratio", "goal", "met"} <= set(row)
        assert row["ratio"] is not None and row["ratio"] > 0

    md = (out / "bench.md").read_text()
    assert "| item | configuration | measured values | ratio | goal | met |" in md
    assert "## GPU" in md


def test_main_rejects_unknown_items(tmp_path):
    from dgrpo.bench import main

    assert main(["--only", "nonsense", "--out", str(tmp_path)]) == 2


def test_fit_slope_recovers_a_line():
    from dgrpo.bench.long_items import fit_slope

    assert fit_slope([0, 10, 20, 30], [5.0, 6.0, 7.0, 8.0]) == pytest.approx(0.1)
    assert fit_slope([0, 10, 20], [3.0, 3.0, 3.0]) == 0.0


@pytest.mark.slow
def test_paper_step_script_alternates_two_arms(tmp_path, monkeypatch, capsys):
    """bench/paper_step.py (the paper-scale step; here --tiny on the CPU, few rollouts): both arms step alternately
    and the summary gives the recipe / versus ratio from their medians; --profile adds the ops that would wait."""
    small = ["grpo.prompts_per_step=2", "grpo.group_size=4", "grpo.max_new_tokens=6"]
    argv = ["--tiny", "--steps", "2", "--out", tmp_path / "s"] + [a for kv in small for a in ("--set", kv)]
    argv += ["--versus", "grpo.recompute_granularity=call", "--profile", "--trace", tmp_path / "trace.json.gz"]
    code, _, err = _run_script("paper_step", argv, monkeypatch, capsys)
    assert code == 0, err[-4000:]
    out = json.loads((tmp_path / "s").read_text())
    s = out["summary"]
    assert [r["arm"] for r in out["steps"]["recipe"]] == ["recipe"] * 3 and len(out["steps"]["versus"]) == 3
    assert s["recompute"] == "layer" and s["versus"]["recompute"] == "call" and s["K"] == 4
    # the recipe's model.kernels=liger, as applied: not on a CPU (it said liger)
    assert s["kernels"] == s["versus"]["kernels"] == "none (liger not applied on cpu)"
    assert s["step_ratio"] == pytest.approx(s["median_step_s"] / s["versus"]["median_step_s"], rel=1e-3)
    assert len(s["step_ratio_per_round"]) == 2
    # --profile on the CPU: what would make the host wait on a GPU is the step's bookkeeping, the eager engine's
    # per-token check and the optimizer, never the model's forward calls (Hugging Face's mask builder read them)
    sites = s["profile"]["waiting_op_sites"]
    assert s["profile"]["waiting_ops"] >= sum(sites.values()) > 0
    assert not any(k in site for site in sites for k in ("masking_utils", "modeling_", "recompute.py")), sites
    ops = s["profile"]  # and the ops that reach a kernel: the update's forward and backward, the rollout's
    assert 0 < ops["ops_rollout"] and 0 < ops["ops_update"] and ops["ops_rollout"] + ops["ops_update"] < ops["ops_step"]
    # and the phases' wall times (the reference and the optimizer inside the update), the costliest host calls
    phases = s["profile"]["phases"]
    assert set(phases) == {"rollout", "update", "reference", "optimizer"}
    assert 0 < phases["reference"]["wall_s"] + phases["optimizer"]["wall_s"] <= phases["update"]["wall_s"]
    assert all(p["busy_s"] == 0 for p in phases.values())  # no kernels on a CPU
    assert s["profile"]["host_top"] and all(calls > 0 for _, calls, _ in s["profile"]["host_top"])
    # and the host time per path of labelled calls: the rollout's steps and the update's replays among them
    paths = {path for path, *_ in s["profile"]["by_range"]}
    assert any(p.startswith("rollout > ") for p in paths) and any(p.startswith("update > replay") for p in paths)
    # and --trace: the profiled step's Chrome trace, with the labelled ranges in it
    trace = json.loads(gzip.decompress((tmp_path / "trace.json.gz").read_bytes()))
    labels = {label for path in paths - {UNLABELLED} for label in path.split(" > ")}
    assert labels and labels <= {e.get("name") for e in trace["traceEvents"]}


def test_paper_step_without_a_gpu_refuses_the_papers_shape_unless_asked(monkeypatch, capsys):
    """Without CUDA, the README's GPU command (Qwen2.5-1.5B's shape, no --device) is one line pointing to --device cpu
    and the CPU's shapes (it ran on the CPU, hours a step); --device cpu asks for it and gets it."""
    paper_step = _paper_step_module()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(paper_step, "build_lm", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("built")))
    monkeypatch.setattr(sys, "argv", ["paper_step.py", "--steps", "2", "--versus", "grpo.engine=eager"])
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        paper_step.main()
    assert e.value.code == 2 and capsys.readouterr().err.strip() == (
        "paper_step.py: error: no CUDA device, and --shape qwen2.5-1.5b (the default) on a CPU takes hours a step: "
        "give --device cpu to run it all the same, or --tiny / --shape full|host|quick for a CPU's sizes"
    )
    assert [paper_step.default_device(s) for s in ("quick", "full", "host")] == ["cpu"] * 3
    monkeypatch.setattr(sys, "argv", ["paper_step.py", "--device", "cpu", "--steps", "1"])
    with pytest.raises(RuntimeError, match="built"):  # (asked: no refusal, the model built next)
        paper_step.main()


@pytest.mark.parametrize(
    "flag, kv",
    [("--set", "model.name_or_path=Qwen/Qwen2.5-0.5B"), ("--versus", "data.train=x.jsonl"), ("--set", "fsdp=full")],
)
def test_paper_step_refuses_a_key_it_does_not_read(flag, kv, monkeypatch, capsys):
    """A model, data, process or device key given to bench/paper_step.py changed nothing (its model is built from
    --shape, on built-in problems, in one process): the step measured was the recipe's. It is refused in one line
    before anything is built."""
    code, _, err = _run_script("paper_step", ["--tiny", "--steps", "1", flag, kv], monkeypatch, capsys)
    key = kv.partition("=")[0]
    assert code == 2 and err.strip() == (
        f"paper_step.py: error: {flag} {kv}: this script does not read {key} (it builds a random model of --shape's "
        "size in the recipe's model.dtype, on the built-in problems, in one process, on --device)"
    )


def test_paper_step_takes_the_data_and_eval_keys_the_trainer_reads(monkeypatch):
    """eval.scorer (the reward when grpo.reward is unset) and data.max_question_tokens / data.chat_template (how the
    rollouts' prompts are cut and written) are read by the GRPO trainer: they were refused with their sections."""
    paper_step = _paper_step_module()
    refused: list[str] = []
    monkeypatch.setattr(paper_step, "fail", refused.append)
    sets = ["eval.scorer=exact", "data.max_question_tokens=8", "data.chat_template=false", "eval.max_new_tokens=9"]
    paper_step.check_read(sets, "--set")
    assert [r.split(":")[0] for r in refused] == ["--set eval.max_new_tokens=9"]


def _paper_step_module():
    return _bench_module("paper_step")


def _bench_module(name):
    """bench/``name``.py, imported."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / f"bench/{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run_script(name, argv, monkeypatch, capsys):
    """``python bench/NAME.py ARGV`` in this process (conftest.run_script): (exit code, stdout, stderr)."""
    from pathlib import Path

    from conftest import run_script

    return run_script(Path(__file__).resolve().parents[1] / f"bench/{name}.py", argv, monkeypatch, capsys)


def _gpu_checks(tmp_path, **env):
    """bench/gpu_checks.sh run here with ``env`` and a stand-in Python that records each command: (the process, the
    commands' arguments)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    log = tmp_path / "argv.jsonl"
    python = tmp_path / "python"
    python.write_text(
        f"#!{sys.executable}\nimport json, sys\nif sys.argv[1:] == ['-']: sys.stdin.read()\n"
        f"open({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
    )
    python.chmod(0o755)
    inherited = {k: v for k, v in os.environ.items() if k not in ("ONLY", "WHEELS", "EXTRA_PROFILE")}
    proc = subprocess.run(
        ["bash", str(root / "bench/gpu_checks.sh"), str(tmp_path / "out"), "600"],
        env={**inherited, "PYTHON": str(python), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    return proc, [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


@pytest.mark.slow
def test_every_arm_the_gpu_checks_run_is_a_config_the_recipe_accepts(tmp_path):
    """bench/gpu_checks.sh runs only on a GPU node, where a mistyped key would cost the call: run the script here
    with a stand-in Python that records each command, and validate every paper_step arm it would start (the recipe
    with its --set, and with its --versus on top) against the packaged recipe."""
    from dgrpo.config import Config, load_config

    proc, calls = _gpu_checks(tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    steps = [c for c in calls if c and c[0] == "bench/paper_step.py"]
    assert len(steps) >= 15 and any(c[:3] == ["-m", "pytest", "-q"] for c in calls)

    def values(argv, flag):
        out = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag]
        return out + [a.split("=", 1)[1] for a in argv if a.startswith(flag + "=")]

    measured = _paper_step_module().MEASURED
    for argv in steps:
        sets, versus = values(argv, "--set"), values(argv, "--versus")
        assert all("=" in kv and "$" not in kv for kv in sets + versus), argv
        load_config(Config, "paper/grpo_dropout.yaml", [*measured, *sets])
        if versus:
            load_config(Config, "paper/grpo_dropout.yaml", [*measured, *sets, *versus])
    earlier = next(values(c, "--versus") for c in steps if "grpo.engine=eager" in values(c, "--versus"))
    # the earlier GPU path switches off every lever whose key defaults on for CUDA
    assert {"model.compile_head=false", "model.pack_gqa=false", "model.kernels=none"} <= set(earlier)


@pytest.mark.slow
def test_gpu_checks_refuse_an_unknown_only_name_before_running_anything(tmp_path):
    """ONLY's names are the items' (a mistyped one skipped its item without a word, on a rare GPU call): an unknown
    name is refused before the wheels are installed or anything runs, with the items listed; known ones run alone."""
    (tmp_path / "wheels").mkdir()
    proc, calls = _gpu_checks(tmp_path, ONLY="capture_smok recipe_profile", WHEELS=str(tmp_path / "wheels"))
    assert proc.returncode == 2 and not calls and not (tmp_path / "out").exists()
    assert "ONLY: unknown item(s) capture_smok; the items: capture_smoke recipe_profile extra_profile" in proc.stderr
    items = proc.stderr.split("the items: ")[1].split()
    proc, calls = _gpu_checks(tmp_path, ONLY="extra_profile")  # (without EXTRA_PROFILE it ran nothing, silently)
    assert proc.returncode == 2 and not calls and "set EXTRA_PROFILE" in proc.stderr

    def ran(**env):
        proc, _ = _gpu_checks(tmp_path, **env)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        summary = (tmp_path / "out/summary.txt").read_text().splitlines()
        (tmp_path / "out/summary.txt").unlink()
        return [line.split()[1] for line in summary if line.startswith("== ")]

    assert ran(EXTRA_PROFILE="profile.py") == items  # (the list is the items run, in their order)
    assert ran(ONLY="cuda_tests  recipe_profile") == ["recipe_profile", "cuda_tests"]


@pytest.mark.filterwarnings("ignore:model.kernels=liger")
def test_paper_step_reports_the_kernels_the_trainers_applied():
    """model.kernels as applied, not as configured: Liger's layers are not applied on a CPU (the report said liger)."""
    from dgrpo.bench.workload import QUICK, build_lm, task_records
    from dgrpo.config import Config, load_config

    paper_step = _paper_step_module()
    prompts = task_records(2)
    sets = ["grpo.prompts_per_step=2", "grpo.group_size=2", "grpo.max_new_tokens=2", "grpo.n_latent=1"]
    arms = {
        kind: (build_lm(QUICK, torch.device("cpu"), torch.float32), load_config(Config, "tiny.yaml", [*sets, kind]))
        for kind in ("model.kernels=liger", "model.kernels=none")
    }
    trainers, kernels = paper_step.make_trainers(arms, prompts, None)
    assert kernels == {"model.kernels=liger": "none (liger not applied on cpu)", "model.kernels=none": "none"}
    assert set(trainers) == set(arms)


def test_paper_step_drops_an_arm_that_runs_out_of_memory_and_keeps_the_other(capsys):
    """bench/paper_step.alternate: the arms take turns going first; an arm too large for the card ends with an error
    row, and the other arm's steps go on."""
    paper_step = _paper_step_module()

    class Arm:
        def __init__(self, fail_at=None):
            self.fail_at, self.n = fail_at, 0

        def step(self, prompts):
            self.n += 1
            if self.n - 1 == self.fail_at:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB\nmore")
            return {"time_rollout_s": 0.1, "time_update_s": 0.2, "n_rollouts_kept": 8}

    trainers = {"recipe": Arm(), "versus": Arm(fail_at=1)}
    rows, failed = paper_step.alternate(trainers, [], torch.device("cpu"), steps=2)
    assert list(trainers) == ["recipe"] and list(rows) == ["recipe"] and len(rows["recipe"]) == 3
    assert failed == {"versus": "out of memory in step 1: CUDA out of memory. Tried to allocate 9.00 GiB"}
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["arm"], r["step"], "error" in r) for r in printed] == [
        ("recipe", 0, False),
        ("versus", 0, False),
        ("versus", 1, True),
        ("recipe", 1, False),
        ("recipe", 2, False),
    ]


@pytest.mark.filterwarnings("ignore:the reward gives 0 to the gold answer")  # a scheduled reward grades no answer
@pytest.mark.slow
def test_paper_step_schedule_varies_the_prompts_width_and_the_groups_the_filter_keeps(capsys):
    """bench/paper_step --prompt-widths / --kept-groups: step i's prompts are exactly W tokens wide (their problems
    unchanged after the filler), and the filter keeps exactly N groups of the real trainer's step, every arm alike."""
    from dgrpo.bench.workload import QUICK, build_lm, task_records
    from dgrpo.config import Config, load_config
    from dgrpo.training.grpo import GRPOTrainer

    paper_step = _paper_step_module()
    lm = build_lm(QUICK, torch.device("cpu"), torch.float32)
    prompts = task_records(3)
    schedule = paper_step.Schedule(lm, prompts, widths=[40, 57], kept=[3, 1, 0])
    sets = ["grpo.prompts_per_step=3", "grpo.group_size=4", "grpo.max_new_tokens=4", "grpo.filter=true"]
    cfg = load_config(Config, "tiny.yaml", [*sets, "grpo.n_latent=2", "perturbation.kind=locked"])
    trainers = {
        arm: GRPOTrainer(build_lm(QUICK, torch.device("cpu"), torch.float32), cfg, prompts, reward_fn=schedule.reward)
        for arm in ("recipe", "versus")
    }
    rows, failed = paper_step.alternate(trainers, prompts, torch.device("cpu"), steps=2, schedule=schedule)
    assert not failed
    for arm in trainers:
        assert [(r["prompt_width"], r["kept_groups"]) for r in rows[arm]] == [(40, 3), (57, 1), (40, 0)]
        assert [r["n_rollouts_kept"] for r in rows[arm]] == [12, 4, 0]
        assert all(r["captures"] == 0 for r in rows[arm])  # (no graphs on a CPU)
    for width in (40, 57):
        widened = schedule.begin(0 if width == 40 else 1)[0]
        assert lm.encode_questions([r.question for r in widened])[0].shape[1] == width
        assert [r.question.lstrip(paper_step.FILLER) for r in widened] == [r.question for r in prompts]
    with pytest.raises(ValueError, match="take"):
        paper_step.widened(lm, prompts, 5)


def test_waiting_ops_counts_values_read_back_and_copies_to_the_host_and_restores_the_methods():
    """What would make a GPU's host wait: a value read back (an op), and copies to the host that reach no op on a
    CPU (counted at the methods, which are themselves again afterwards)."""
    from dgrpo.bench.step_profile import waiting_ops

    before = {name: getattr(torch.Tensor, name) for name in ("tolist", "numpy", "cpu")}
    t = torch.arange(4.0)

    def work():
        t.tolist(), t.cpu(), t.numpy(), t.sum().item(), (t * 2 + 1).exp()

    found = waiting_ops(work)
    names = sorted(site.split(" at ")[0] for site in found["waiting_op_sites"])
    assert names == ["_local_scalar_dense.default", "cpu", "numpy", "tolist"] and found["waiting_ops"] == 4
    assert {name: getattr(torch.Tensor, name) for name in before} == before
    assert waiting_ops(lambda: (t * 2).exp())["waiting_ops"] == 0


def test_phase_activity_counts_overlapping_kernels_once_inside_the_windows():
    from dgrpo.bench.step_profile import phase_activity

    ms = 1000.0  # the profiler's times are microseconds
    # two windows (10 ms and 20 ms); kernels: one straddling the first window's start, two overlapping ones inside
    # it, one outside both, one straddling the second window's end
    windows = [(100 * ms, 110 * ms), (200 * ms, 220 * ms)]
    kernels = [
        (95 * ms, 102 * ms),
        (104 * ms, 107 * ms),
        (105 * ms, 108 * ms),
        (150 * ms, 160 * ms),
        (215 * ms, 230 * ms),
    ]
    # busy: 100-102 (2 ms) + 104-108 (4 ms, the overlap once) + 215-220 (5 ms) = 11 ms of 30 ms
    assert phase_activity(windows, kernels) == {"wall_s": 0.03, "busy_s": 0.011, "busy_share": 0.367}
    assert phase_activity([], kernels) == {"wall_s": 0.0, "busy_s": 0.0, "busy_share": 0.0}
    # a range opened inside one of its own name (a window within a window) is the same wall time, counted once (its
    # wall and busy time were counted twice)
    nested = [*windows, (103 * ms, 106 * ms)]
    assert phase_activity(nested, kernels) == {"wall_s": 0.03, "busy_s": 0.011, "busy_share": 0.367}


def test_top_host_calls_sum_own_time_by_name():
    from dgrpo.bench.step_profile import top_host_calls

    own = [("cudaMalloc", 3000.0), ("aten::mm", 500.0), ("cudaMalloc", 1500.0), ("aten::mm", 600.0), ("x", 1.0)]
    assert top_host_calls(own, 2) == [["cudaMalloc", 2, 4.5], ["aten::mm", 2, 1.1]]


def test_step_flops_by_the_counting_rule(tokenizer):
    """2 x (non-embedding parameters + LM head) per token per pass, 5 passes per GRPO step; the head counted once
    whether tied (Qwen2 here) or not (Llama)."""
    from dgrpo.bench.step_profile import grpo_step_flops, matmul_params

    from conftest import make_lm

    for arch in ("qwen2", "llama"):
        lm = make_lm(tokenizer, arch)
        emb = lm.model.get_input_embeddings().weight.numel()
        total = sum(p.numel() for p in lm.model.parameters())
        head = lm.model.get_output_embeddings().weight
        tied = head.data_ptr() == lm.model.get_input_embeddings().weight.data_ptr()
        assert tied == (arch == "qwen2")
        assert matmul_params(lm) == total - emb + (head.numel() if tied else 0)
        assert grpo_step_flops(lm, rows=4, tokens_per_row=10) == 2 * matmul_params(lm) * 4 * 10 * 5


@pytest.mark.slow
def test_kept_layer_bytes_script_counts_one_layers_activations(monkeypatch, capsys):
    """bench/kept_layer_bytes.py: what a layer kept out of recomputation holds, per row, at Qwen2.5-1.5B's width; a
    layer's activations of ~43 positions: several bf16 vectors of the hidden (1536) and FFN (8960) widths each."""
    argv = ["--rows", "1", "--answer", "8", "--scale-rows", "2", "--vocab", "1024"]
    code, stdout, err = _run_script("kept_layer_bytes", argv, monkeypatch, capsys)
    assert code == 0, err[-4000:]
    out = json.loads(stdout.strip().splitlines()[-1])
    per_position = out["kept_per_layer_per_row_mib"] * 2**20 / out["positions_per_row"]
    assert 2 * (1536 + 8960) < per_position / 2 < 20 * (1536 + 8960), out  # (bf16: 2 bytes an element)
    assert out["kept_per_layer_at_2_rows_gib"] == pytest.approx(2 * out["kept_per_layer_per_row_mib"] / 1024, abs=0.01)


@pytest.mark.slow
def test_latent_kv_bytes_script_counts_the_prompts_columns_kept_once_instead_of_per_step(monkeypatch, capsys):
    """bench/latent_kv_bytes.py: at Qwen2.5-1.5B's width (2 key/value heads of 128, bf16: 1 KiB a column of keys and
    values per layer and row), saving them once keeps sum_{t<T} (P + t) columns fewer per layer and row."""
    argv = ["--widths", "32", "--rows", "1", "--answer", "4", "--scale-rows", "2", "--vocab", "1024"]
    code, stdout, err = _run_script("latent_kv_bytes", argv, monkeypatch, capsys)
    assert code == 0, err[-4000:]
    out = json.loads(stdout.strip().splitlines()[-1])
    columns = sum(32 + t for t in range(1, 6))  # T = 6
    assert out["fewer_per_layer_per_row_mib"] == pytest.approx(columns * 1024 / 2**20, abs=1e-3), out
    assert out["fewer_at_28_layers_2_rows_gib"] == pytest.approx(columns * 1024 * 28 * 2 / 2**30, abs=0.01), out


@pytest.mark.slow  # (compiles the head statistics)
def test_kernel_levers_script_times_each_pair_and_they_agree():
    """bench/kernel_levers.py at toy sizes on the CPU (the GPU's timings are what it is for): the four pairs run,
    alternated, and each candidate gives its baseline's values (fp32)."""
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "bench/kernel_levers.py"
    args = ["--device", "cpu", "--dtype", "float32", "--rows", "4", "--vocab", "500", "--reps", "2", "--columns", "40"]
    proc = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    *rows, summary = [json.loads(line) for line in proc.stdout.strip().splitlines()]
    pairs = ["head_greedy", "head_scoring", "attention_call", "attention_decode"]
    assert [r["pair"] for r in rows] == pairs and list(summary["ratios"]) == pairs
    for r in rows:
        assert r["candidate_ms"] > 0 and r["baseline_ms"] > 0 and r["max_abs_diff"] < 1e-5, r
        assert r["max_rel_diff_with_grads"] < 1e-5, r  # (the gradients too, where a pair takes them)
    assert rows[2]["mask_packing_ms_per_call"] > 0


@pytest.mark.parametrize(
    "script, argv, option",
    [
        ("kept_layer_bytes", ["--rows", "0"], "--rows"),
        ("kept_layer_bytes", ["--answer", "-1"], "--answer"),
        ("latent_kv_bytes", ["--widths", "32", "0"], "--widths"),
        ("latent_kv_bytes", ["--time", "--reps", "0"], "--reps"),
        ("kernel_levers", ["--reps", "0"], "--reps"),
        ("kernel_levers", ["--chunk", "0"], "--chunk"),
        ("paper_step", ["--steps", "0"], "--steps"),
    ],
)
def test_bench_scripts_refuse_sizes_below_one_in_one_line(monkeypatch, capsys, script, argv, option):
    """A size or count of 0 or less is an argument error (exit 2, one line naming the option), before any work: it
    ended in a traceback deep in the measurement (an empty batch, a negative dimension, the median of no rounds)."""
    module = _bench_module(script)
    monkeypatch.setattr(sys, "argv", [f"{script}.py", *argv])
    with pytest.raises(SystemExit) as e:
        module.main()
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert e.value.code == 2 and f"argument {option}: expected a positive integer" in err


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--device", "cuda"], "--device cuda, but this machine has no CUDA device"),
        (["--device", "gpu"], "--device 'gpu'"),
        (["--device", "meta"], "--device 'meta': cpu or cuda"),
        (["--device", "cpu", "--heads", "12", "--kv-heads", "5"], "--heads 12 is no multiple of --kv-heads 5"),
    ],
)
def test_kernel_levers_refuses_a_device_it_cannot_time_on_in_one_line(monkeypatch, capsys, argv, says):
    """bench/kernel_levers.py: --device cuda on a machine without CUDA, a device torch cannot parse or this script
    does not time on, and query heads the key/value heads do not divide are argparse errors (exit 2, one line):
    they were tracebacks (torch's 'not compiled with CUDA', a device parse, a reshape in the attention pair)."""
    module = _bench_module("kernel_levers")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(sys, "argv", ["kernel_levers.py", "--rows", "2", "--vocab", "100", "--reps", "1", *argv])
    with pytest.raises(SystemExit) as e:
        module.main()
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert e.value.code == 2 and err.startswith("kernel_levers.py: error: ") and says in err, err


def test_capture_beside_threads_says_it_needs_cuda_here(monkeypatch, capsys):
    """bench/capture_beside_threads.py (a CUDA diagnostic): on a machine without CUDA it says so and exits 2."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "bench/capture_beside_threads.py"
    spec = importlib.util.spec_from_file_location("capture_beside_threads", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(sys, "argv", ["capture_beside_threads.py", "pin_locked"])
    assert script.main() == 2 and "needs a CUDA device" in capsys.readouterr().err


def test_ctrl_c_is_one_line_exit_130(tmp_path, monkeypatch, capsys):
    """Ctrl-C during the suite (its child process, DGRPO_BENCH_CHILD set) is one line and exit 130, not a
    traceback; the parent that started the child ignores the Ctrl-C the terminal sends it too and returns the
    child's code (it raised KeyboardInterrupt out of its wait: a second traceback)."""
    import signal

    from dgrpo.bench import launch, main, suite

    def interrupted(args, argv):
        raise KeyboardInterrupt

    def bench() -> int:  # (a KeyboardInterrupt out of main would stop pytest itself)
        try:
            return main(["--out", str(tmp_path / "b"), "--only", "flops"])
        except KeyboardInterrupt:
            return -1

    before = signal.getsignal(signal.SIGINT)  # (SIG_IGN where pytest runs as a shell's background job)
    monkeypatch.setattr(suite, "run_suite", interrupted)
    monkeypatch.setenv(launch.CHILD_ENV, "1")
    assert bench() == 130
    err = capsys.readouterr().err
    assert err == "dgrpo: interrupted (bench: nothing was written)\n"

    child = tmp_path / "child.sh"  # (a stand-in for the suite's child: Ctrl-C reaches its parent, it ends with 130)
    child.write_text("#!/bin/sh\nkill -INT $PPID\nsleep 0.5\nexit 130\n")
    child.chmod(0o755)
    monkeypatch.delenv(launch.CHILD_ENV)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.setattr(launch.sys, "executable", str(child))
    assert bench() == 130
    assert signal.getsignal(signal.SIGINT) is before


LEFT_RUNNING_S = 60  # how long the stand-in suite runs when no signal ends it


def test_sigterm_to_the_parent_reaches_the_suite(tmp_path, monkeypatch):
    """``timeout N dgrpo bench`` (a SIGTERM to the process started, which re-executes the suite in a child) stops
    the suite: the parent passes the signal on and exits 143 (it ended alone and left the suite running)."""
    import signal
    import time

    from dgrpo.bench import launch, main

    child = tmp_path / "child.sh"  # (a stand-in for the suite: SIGTERM reaches its parent; left running, it ends 0
    # after LEFT_RUNNING_S: a parent that waits for it takes that long, however busy the machine; a 2.5 s bound on
    # a 3 s child left a busy one 2.5 s to start the child)
    child.write_text(f"#!/bin/sh\nkill -TERM $PPID\nexec sleep {LEFT_RUNNING_S}\n")
    child.chmod(0o755)
    monkeypatch.delenv(launch.CHILD_ENV, raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.setattr(launch.sys, "executable", str(child))
    got: list[int] = []
    mine = signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))  # (this test's, not pytest's end)
    try:
        start = time.perf_counter()
        code = main(["--out", str(tmp_path / "b"), "--only", "flops"])
    finally:
        signal.signal(signal.SIGTERM, mine)
    assert code == 128 + signal.SIGTERM and time.perf_counter() - start < LEFT_RUNNING_S and not got


def test_only_help_names_every_item_of_one_section_alone():
    """``--only``'s help says where the items run that one section alone has (it named soak, not parallel, which
    ``--section gpu`` does not run either)."""
    from dgrpo.bench.suite import GPU_ORDER, ORDER, build_parser

    text = " ".join(build_parser().format_help().split())
    for item in {*ORDER} ^ {*GPU_ORDER}:
        assert f"{item} run" in text or f"{item} on CUDA" in text or f"{item} and" in text, item


def test_a_selection_that_runs_nothing_is_an_error(tmp_path, capsys):
    """An unknown item, or items of the other section (optimizer is CUDA-only), are one error line, exit 2 (the
    latter wrote an empty report and exited 0); nothing is written."""
    from dgrpo.bench.suite import main as bench_main

    assert bench_main(["--out", str(tmp_path / "b"), "--only", "nosuch"]) == 2
    assert "unknown --only item(s) nosuch" in capsys.readouterr().err
    assert bench_main(["--out", str(tmp_path / "b"), "--only", "optimizer", "--section", "cpu"]) == 2
    assert "runs nothing in --section cpu: soak and parallel run on the CPU only, optimizer on CUDA only" in (
        capsys.readouterr().err
    )
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--section", "gpu"], "--section gpu runs on CUDA only"),
        (["--section", "gpu", "--only", "flops"], "--section gpu runs on CUDA only"),
        (["--only", "optimizer"], "--only optimizer runs on CUDA only"),
    ],
)
def test_a_gpu_section_without_cuda_is_an_error(tmp_path, capsys, monkeypatch, argv, says):
    """Without CUDA, a selection whose every item runs on the GPU section is one error line, exit 2, and writes
    nothing (it wrote a report whose GPU section said "skipped: no CUDA", exit 0); ``--section all`` runs the CPU
    section alone."""
    from dgrpo.bench import suite

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert suite.main(["--out", str(tmp_path / "b"), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"dgrpo: error: bench: {says}") and err.count("\n") == 1 and "--section cpu" in err
    assert not (tmp_path / "b").exists()
    assert suite.needs_cuda("all", ["flops", "optimizer"]) == suite.needs_cuda("cpu", ["flops"]) == ""


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--device", "gpu"], "--device 'gpu'"),  # (--steps 0: an argument error, test_bench_scripts_refuse_sizes...)
        (["--set", "nonsense=1"], "unknown config key 'nonsense'"),
        (["--versus", "grpo.lr=-1"], "grpo.lr"),
        (["--device", "cuda"], "--device cuda, but this machine has no CUDA device"),
        (["--device", "meta"], "--device 'meta': cpu or cuda"),
        (["--device", "cpu", "--kept-groups", "99"], "--kept-groups: a step has 16 groups"),
        (["--device", "cpu", "--versus", "model.lora.r=4"], "model.lora: LoRA needs a model saved on disk"),
        (["--device", "cpu", "--set", "model.lora.r=4"], "model.lora: LoRA needs a model saved on disk"),
    ],
)
def test_paper_step_refuses_bad_options_in_one_line(monkeypatch, capsys, argv, says):
    """They were tracebacks (a median of no steps after a 12 s warm-up step, a ConfigError, a device parse); then
    one line but exit 1, without argparse's prefix; now as argparse's own errors: one line, exit 2."""
    module = _paper_step_module()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(sys, "argv", ["paper_step.py", "--tiny", *argv])
    with pytest.raises(SystemExit) as e:
        module.main()
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and err[0].startswith("paper_step.py: error: ") and says in err[0], err


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--trace", ""], "--trace writes the profiled step's trace: add --profile"),
        (["--trace", "t.json"], "--trace writes the profiled step's trace: add --profile"),
        (["--profile", "--trace", " "], "--trace: an empty path"),
    ],
)
def test_paper_step_refuses_a_trace_it_would_not_write(monkeypatch, capsys, argv, says):
    """``--trace ""`` without --profile passed (an empty path read as no trace), and wrote nothing."""
    monkeypatch.setattr(sys, "argv", ["paper_step.py", "--tiny", *argv])
    with pytest.raises(SystemExit) as e:
        _paper_step_module().parse_args()
    assert e.value.code == 2 and says in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, shape",
    [
        ([], "qwen2.5-1.5b"),
        (["--tiny"], "quick"),
        (["--tiny", "--shape", "quick"], "quick"),
        (["--shape", "host"], "host"),
    ],
)
def test_paper_step_shape_is_the_given_one_or_tinys_or_the_default(monkeypatch, argv, shape):
    monkeypatch.setattr(sys, "argv", ["paper_step.py", *argv])
    assert _paper_step_module().parse_args().shape == shape


@pytest.mark.parametrize("shape", ["qwen2.5-1.5b", "full"])
def test_paper_step_refuses_a_shape_beside_tiny_even_the_default(monkeypatch, capsys, shape):
    """--tiny --shape qwen2.5-1.5b (the default, given) passed without a word, and --tiny won."""
    monkeypatch.setattr(sys, "argv", ["paper_step.py", "--tiny", "--shape", shape])
    with pytest.raises(SystemExit) as e:
        _paper_step_module().parse_args()
    assert e.value.code == 2 and f"give --shape {shape} or --tiny, not both" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--time", "--rows", "4"], "--time measures at fixed shapes: --rows would do nothing"),  # (4: the default)
        (["--time", "--dtype", "float32", "--widths", "32"], "--time measures at fixed shapes: --dtype, --widths"),
        (["--reps", "12"], "only --time reads it: --reps would do nothing"),  # (12: the default)
        (["--time", "--vocab", "151936"], "--time measures at fixed shapes: --vocab would do nothing"),  # (default)
    ],
)
def test_latent_kv_bytes_refuses_an_option_its_mode_ignores_even_at_its_default(monkeypatch, capsys, argv, says):
    """An option given at its default value passed without a word (the check compared the values)."""
    module = _bench_module("latent_kv_bytes")

    def measure(*args):
        raise AssertionError(f"{argv} measured")

    for name in ("time_replay", "time_host", "layer_shaped_lm"):
        monkeypatch.setattr(module, name, measure)
    monkeypatch.setattr(sys, "argv", ["latent_kv_bytes.py", *argv])
    with pytest.raises(SystemExit) as e:
        module.main()
    assert e.value.code == 2 and says in capsys.readouterr().err


def test_latent_kv_bytes_time_gets_the_default_reps(monkeypatch):
    """(The options' defaults are filled in after the check of which were given.)"""
    module = _bench_module("latent_kv_bytes")
    timed = []
    monkeypatch.setattr(module, "time_replay", lambda reps: timed.append(("replay", reps)))
    monkeypatch.setattr(module, "time_host", lambda reps: timed.append(("host", reps)))
    monkeypatch.setattr(sys, "argv", ["latent_kv_bytes.py", "--time"])
    assert module.main() == 0 and timed == [("replay", 12), ("host", 36)]


def test_bench_rows_are_in_item_number_order():
    from dgrpo.bench.report import Row
    from dgrpo.bench.suite import item_order

    rows = [Row("cpu", i, "k", "", "", "", None) for i in ("10. b", "4. a", "x")]
    assert [r.item for r in sorted(rows, key=item_order)] == ["4. a", "10. b", "x"]


def test_paper_step_versus_arm_runs_in_its_own_model_dtype(tmp_path, monkeypatch, capsys):
    """bench/paper_step.py --versus model.dtype=float32: the versus arm's weights are float32 (a copy of the recipe's
    bf16 ones, cast); it stepped in the recipe's bf16 without a word, its ratio labelled float32's. Each arm's
    summary says its dtype."""
    small = ["grpo.prompts_per_step=2", "grpo.group_size=2", "grpo.max_new_tokens=4", "threads=1"]
    argv = ["--tiny", "--device", "cpu", "--steps", "1"] + [a for kv in small for a in ("--set", kv)]
    argv += ["--versus", "model.dtype=float32", "--out", tmp_path / "s"]
    code, _, err = _run_script("paper_step", argv, monkeypatch, capsys)
    assert code == 0, err[-4000:]
    s = json.loads((tmp_path / "s").read_text())["summary"]
    assert s["dtype"] == "torch.bfloat16" and s["versus"]["dtype"] == "torch.float32", s


def test_paper_step_makes_the_out_folder_and_refuses_an_unwritable_out_before_the_steps(tmp_path, monkeypatch, capsys):
    """bench/paper_step.py --out runs/paper-step.json (its docstring's, from a fresh clone without runs/): the folder
    is made when the options are read; an --out that is a directory, or under a file, is one line and exit 2 then.
    Each ended the run in a traceback after all its steps, their summary lost."""
    module = _paper_step_module()
    monkeypatch.setattr(sys, "argv", ["paper_step.py", "--tiny", "--out", str(tmp_path / "runs" / "s.json")])
    module.parse_args()
    assert (tmp_path / "runs").is_dir() and not (tmp_path / "runs" / "s.json").exists()
    (tmp_path / "file").write_text("")
    for out, says in ((tmp_path, "is a directory"), (tmp_path / "file" / "s.json", "its folder cannot be made")):
        monkeypatch.setattr(sys, "argv", ["paper_step.py", "--tiny", "--out", str(out)])
        with pytest.raises(SystemExit) as e:
            module.parse_args()
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert e.value.code == 2 and err.startswith("paper_step.py: error: --out ") and says in err, err


def test_alternate_reverses_the_candidates_order_every_round():
    """No candidate always runs first (right after the others' work: warm caches, their garbage collected on its
    time): each round runs in the reverse order of the one before, after warm-ups in the given order."""
    from dgrpo.bench.timing import alternate

    calls: list[str] = []
    t = alternate({n: lambda n=n: calls.append(n) or n for n in "ABC"}, reps=3, warmup=1)
    assert "".join(calls) == "ABC" + "ABC" + "CBA" + "ABC"
    assert all(t.results[n] == [n] * 3 for n in "ABC") and all(len(t.times[n]) == 3 for n in "ABC")
