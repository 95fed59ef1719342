"""The long benchmark items' own arithmetic on hand-made numbers (gaps found by mutation testing): the 8-bit optimizer
and LoRA ratios, the memory probe's interval and units, the soak's sampling and fitted line, the recomputation and
parallelism rows, and the naive Coconut baseline against the library's loss. Nothing here runs an item: the timer, the
fresh processes and the trainers are replaced by stand-ins whose numbers the test chooses."""

import io
import json
import subprocess
import sys
import types

import pytest
import torch

from dgrpo.bench import baselines, items, long_items, lora_item, memprobe, parallel_item, recompute_item, workload
from dgrpo.bench.workload import Ctx, Shapes

from conftest import bench_ctx as _ctx
from conftest import bench_tiny_shapes, scripted_alternate

CPU = torch.device("cpu")
CUDA = torch.device("cuda")  # (a name only: nothing here touches a GPU)
TINY = bench_tiny_shapes()
MiB = 2**20


def _arm(**kw):
    """A stand-in trainer: its step does nothing."""
    return types.SimpleNamespace(step=lambda prompts: None, **kw)


# --------------------------------------------------------------------------- 7. the 8-bit optimizer
def _optimizer_arms(monkeypatch):
    monkeypatch.setitem(sys.modules, "bitsandbytes", types.ModuleType("bitsandbytes"))
    model = torch.nn.Linear(3, 2)  # 6 + 2 params, the bias frozen: 6 trainable
    model.bias.requires_grad_(False)
    arms = {n: _arm(opt=n, lm=types.SimpleNamespace(model=model)) for n in ("adamw", "adamw8bit")}
    monkeypatch.setattr(long_items, "_optimizer_trainers", lambda ctx, K, T, prompts: arms)
    monkeypatch.setattr(long_items, "optimizer_state_bytes", lambda opt: {"adamw": 400, "adamw8bit": 100}[opt])
    peaks = {"adamw": {"before": 10, "peak": 30}, "adamw8bit": {"before": 5, "peak": 20}}
    monkeypatch.setattr(long_items, "_step_peaks", lambda fns: peaks)
    scripted_alternate(monkeypatch, long_items, ({"adamw": [2.0, 2.0, 2.0], "adamw8bit": [3.0, 1.0, 3.0]}, {}))


def test_optimizer_rows_are_8bit_over_adamw_state_and_time(monkeypatch):
    """Item 7: the state row is adamw8bit / adamw bytes against <= 0.6, the time row adamw8bit / adamw medians with no
    goal; the parameters counted are the trainable ones."""
    _optimizer_arms(monkeypatch)
    (state_row, time_row), raw = long_items.bench_optimizer(_ctx(device=CUDA))
    assert (state_row.ratio_name, state_row.ratio, state_row.met) == ("state bytes adamw8bit / adamw", 0.25, True)
    assert (time_row.ratio_name, time_row.ratio, time_row.goal) == ("step time adamw8bit / adamw", 1.5, None)
    assert raw["params"] == 6 and raw["state_bytes"] == {"adamw": 400, "adamw8bit": 100}
    assert state_row.section == "gpu" and "adamw8bit: step 3.00 s, optimizer state 100 B" in state_row.values


def test_optimizer_item_is_skipped_off_cuda_and_without_bitsandbytes(monkeypatch):
    """Item 7 reports no row, and says why, on a CPU and where bitsandbytes cannot be imported."""
    _optimizer_arms(monkeypatch)
    assert long_items.bench_optimizer(_ctx()) == ([], {"skipped": "the 8-bit optimizer runs on CUDA only"})
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # (import raises ImportError)
    assert long_items.bench_optimizer(_ctx(device=CUDA)) == ([], {"skipped": "bitsandbytes is not installed"})


def test_optimizer_arms_differ_in_their_optimizer_alone(monkeypatch):
    """Item 7's two trainers: the same shapes, K, T and locked dropout, each its own model built alike; adamw, then
    adamw8bit."""
    built, made = [], []
    monkeypatch.setattr(long_items, "build_lm", lambda s, device, dtype: built.append((s, device, dtype)) or len(built))
    monkeypatch.setattr(long_items, "GRPOTrainer", lambda lm, cfg, prompts: made.append((lm, cfg, prompts)))
    s = Shapes(**{**TINY.to_json(), "grpo_K_at": 4, "grpo_T_at": 3})
    trainers = long_items._optimizer_trainers(_ctx(s), 4, 3, ["p"])
    assert list(trainers) == ["adamw", "adamw8bit"] and built == [(s, CPU, torch.float32)] * 2
    assert [lm for lm, _, _ in made] == [1, 2] and all(p == ["p"] for *_, p in made)
    assert [cfg.perturbation.kind for _, cfg, _ in made] == ["locked", "locked"]
    cfgs = [cfg.grpo for _, cfg, _ in made]
    assert [g.optimizer for g in cfgs] == ["adamw", "adamw8bit"]
    assert all((g.group_size, g.n_latent, g.prompts_per_step) == (4, 3, 2) for g in cfgs)


def test_step_peaks_are_each_steps_own_from_just_before_it(monkeypatch):
    """The peak is the allocator's high-water mark since a reset made just before the step, the 'before' the bytes
    allocated at that moment (not after the step, nor the peak of an earlier step)."""
    mem = {"now": 100, "peak": 100}

    def reset():
        mem["peak"] = mem["now"]

    def step(keep, transient):
        def f():
            mem["peak"] = max(mem["peak"], mem["now"] + transient)
            mem["now"] += keep

        return f

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a: reset())
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a: mem["now"])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: mem["peak"])
    peaks = long_items._step_peaks({"a": step(10, 500), "b": step(1, 50)})
    assert peaks == {"a": {"before": 100, "peak": 600}, "b": {"before": 110, "peak": 160}}


# --------------------------------------------------------------------------- 8. the memory soak
def test_soak_line_is_fitted_from_the_skip_step_and_its_ratio_is_last_over_first():
    """The line goes through the samples from step SOAK_SKIP on (the warm-up ones left out); the ratio is the line's
    value at the last fitted step over the first (growth > 1), not the last sample over the first; the slope is in MiB
    per 100 steps; the largest sample counts every sample, the smallest the fitted ones."""
    assert long_items.SOAK_SKIP == 20
    samples = [(0, 50 * MiB), (10, 300 * MiB), (20, 100 * MiB), (30, 104 * MiB), (40, 102 * MiB)]
    raw, vals, ratio = long_items.summarize_soak(samples, 40, 12.0)
    assert ratio == pytest.approx(103 / 101)  # (the line: 101 MiB at step 20, 103 MiB at step 40)
    assert raw["slope_mib_per_100_steps"] == pytest.approx(10.0)
    assert (raw["fitted_first_mib"], raw["fitted_last_mib"]) == pytest.approx((101.0, 103.0))
    assert (raw["rss_first"], raw["rss_last"]) == ((20, 100 * MiB), (40, 102 * MiB))
    assert (raw["rss_min_fitted"], raw["rss_max"]) == (100 * MiB, 300 * MiB)
    assert "RSS at step 0: 50.0 MiB; from step 20 to 40: between 100.0 MiB and 104.0 MiB" in vals
    assert "+10.00 MiB per 100 steps" in vals
    # a shrinking RSS is a ratio below 1; too short a run to skip the warm-up fits every sample
    _, _, down = long_items.summarize_soak([(0, 100 * MiB), (10, 90 * MiB)], 10, 1.0)
    assert down == pytest.approx(0.9)
    # one fitted sample (every x alike): a flat line, not a slope out of 0 / 0
    raw, _, one = long_items.summarize_soak([(20, 100 * MiB)], 20, 1.0)
    assert (one, raw["slope_mib_per_100_steps"]) == (1.0, 0.0) and long_items.fit_slope([5, 5], [1.0, 2.0]) == 0.0


class _Child:
    """A stand-in ``dgrpo grpo`` child: each ``sleep`` of the sampler finishes steps up to the next scripted count."""

    def __init__(self, metrics, done, returncode=0):
        self.metrics, self.done, self.returncode, self.pid = metrics, list(done), returncode, 4242
        self.stderr = None

    def poll(self):
        return None if self.done else self.returncode

    def sleep(self, s):
        n = self.done.pop(0)
        if n is not None:  # (a row per step, and an eval row among them: not a step)
            rows = [f'{{"step": {i}, "reward_mean": 0.5}}\n' for i in range(n)]
            self.metrics.write_text("".join(rows[:1] + ['{"step": 0, "eval/valid": 0.1}\n'] + rows[1:]))


def test_soak_samples_rss_as_the_metrics_pass_each_tenth_step(tmp_path, monkeypatch):
    """One (steps done, RSS) sample at step 0 and then at the first count at or past each multiple of 10; the steps
    done are the metrics' step rows; after a jump the next sample waits for the next multiple of 10 past it; a child
    that exited (no RSS) gives no sample."""
    metrics = tmp_path / "metrics.jsonl"
    child = _Child(metrics, [None, 0, 4, 9, 10, 13, 21, 25, 42, 45, 50])
    monkeypatch.setattr(long_items, "time", types.SimpleNamespace(sleep=child.sleep))
    monkeypatch.setattr(long_items, "_rss_bytes", lambda pid: None if child.done == [] else 1000 + pid)
    samples = long_items._sample_rss(child, metrics, lambda msg: None)
    assert samples == [(0, 5242), (10, 5242), (21, 5242), (42, 5242)]  # (50: the child had exited)


def test_rss_bytes_reads_vmrss_in_kib_and_none_once_the_child_is_gone(monkeypatch):
    """VmRSS is in kB: x 1024 bytes; a process that has gone (no /proc entry, no field) is None."""
    asked = []
    monkeypatch.setattr(long_items, "status_kb", lambda field, pid: asked.append((field, pid)) or 7)
    assert long_items._rss_bytes(99) == 7 * 1024 and asked == [("VmRSS", 99)]
    for err in (FileNotFoundError, KeyError):
        monkeypatch.setattr(long_items, "status_kb", lambda field, pid, err=err: (_ for _ in ()).throw(err("x")))
        assert long_items._rss_bytes(99) is None


def test_status_kb_reads_the_fields_number_and_the_reset_writes_5(monkeypatch):
    """status_kb gives the number of /proc/PID/status's field as written (kB, not converted) and refuses an absent
    field; reset_peak_rss writes 5 (reset the high-water mark) to /proc/self/clear_refs, False where refused."""
    opened, written = [], []

    def fake_open(path):
        opened.append(path)
        return io.StringIO("Name:\tpython\nVmHWM:\t    2048 kB\nVmRSS:\t    1024 kB\n")

    class Refs(io.StringIO):
        def close(self):
            if not self.closed:
                written.append(self.getvalue())
            super().close()

    monkeypatch.setattr(
        memprobe, "open", lambda path, mode="r": Refs() if mode == "w" else fake_open(path), raising=False
    )
    assert (memprobe.status_kb("VmRSS"), memprobe.status_kb("VmHWM", 77)) == (1024, 2048)
    with pytest.raises(KeyError):
        memprobe.status_kb("VmSwap")
    assert opened[:2] == ["/proc/self/status", "/proc/77/status"]
    assert memprobe.reset_peak_rss() is True and written == ["5"]
    monkeypatch.setattr(
        memprobe, "open", lambda path, mode="r": (_ for _ in ()).throw(PermissionError(path)), raising=False
    )
    assert memprobe.reset_peak_rss() is False


def test_soak_child_runs_the_settings_its_row_states(tmp_path):
    """The soak's command is ``dgrpo grpo`` from the init model into the run folder with the settings the row names:
    16 prompts x K=8, T=2, filter off, eval and checkpoint every 50 steps, a metrics row per step."""
    cmd = long_items._soak_command(tmp_path / "init", tmp_path / "run", 123, 3)
    assert cmd[:8] == [sys.executable, "-m", "dgrpo", "grpo", "--init", str(tmp_path / "init"), "--out"] + [
        str(tmp_path / "run")
    ]
    sets = dict(cmd[i + 1].split("=", 1) for i in range(8, len(cmd), 2) if cmd[i] == "--set")
    assert len(sets) == (len(cmd) - 8) // 2
    want = {"grpo.steps": "123", "grpo.prompts_per_step": "16", "grpo.group_size": "8", "grpo.n_latent": "2"}
    want |= {"grpo.filter": "false", "grpo.eval_every": "50", "grpo.save_every": "50", "grpo.log_every": "1"}
    assert want.items() <= sets.items() and sets["threads"] == "3"


def _soak_stubs(monkeypatch, returncode=0):
    ran = []
    lm = types.SimpleNamespace(save_pretrained=lambda path: None)
    monkeypatch.setattr(long_items, "build_lm", lambda *a, **k: lm)

    def popen(cmd, **kw):
        ran.append(cmd)
        return types.SimpleNamespace(returncode=returncode, stderr=None, pid=1)

    monkeypatch.setattr(long_items.subprocess, "Popen", popen)
    samples = [(0, 50 * MiB), (20, 100 * MiB), (30, 102 * MiB), (40, 104 * MiB)]
    monkeypatch.setattr(long_items, "_sample_rss", lambda proc, metrics, log: samples)
    return ran


@pytest.mark.timeout(30)  # (blocked, it waited forever)
def test_a_soak_child_that_writes_more_than_a_pipe_holds_is_not_blocked(monkeypatch):
    """The soak read the child's stderr pipe only once it had ended: a child writing more than the pipe holds (64 KiB
    on Linux: warnings, a progress bar's updates over 300 steps) blocked on it, and the bench waited forever. A
    real child writes 256 KiB and fails: the item raises with its last lines."""
    monkeypatch.setattr(long_items, "build_lm", lambda *a, **k: types.SimpleNamespace(save_pretrained=lambda p: None))
    code = "import sys; sys.stderr.write('x' * 2**18 + 'the end'); sys.exit(3)"
    monkeypatch.setattr(long_items, "_soak_command", lambda *a: [sys.executable, "-c", code])
    with pytest.raises(RuntimeError, match=r"soak run failed \(exit 3\):\nx+the end$"):
        long_items.bench_soak(_ctx())


def test_soak_row_is_the_fitted_growth_and_a_failed_run_is_no_row(monkeypatch):
    """Item 8 (child process and sampler replaced): --quick runs 30 steps; the row's ratio is the fitted line's last /
    first against <= 1.02; a child that failed raises instead of giving a row; the soak runs in the CPU section only."""
    ran = _soak_stubs(monkeypatch)
    (row,), raw = long_items.bench_soak(_ctx(Shapes(**{**TINY.to_json(), "name": "quick"})), steps=300)
    assert "grpo.steps=30" in ran[0] and raw["steps"] == 30
    assert row.ratio == pytest.approx(1.04) and row.met is False and row.ratio_name.startswith("fitted RSS")
    (row,), raw = long_items.bench_soak(_ctx(), steps=300)
    assert "grpo.steps=300" in ran[1] and raw["steps"] == 300
    _soak_stubs(monkeypatch, returncode=1)
    with pytest.raises(RuntimeError, match="soak run failed"):
        long_items.bench_soak(_ctx())
    assert long_items.bench_soak(_ctx(device=CUDA)) == ([], {"skipped": "the soak runs in the CPU section"})


# --------------------------------------------------------------------------- the memory probe
class _ProbeTrainer:
    """A stand-in GRPOTrainer: each step runs the test's hook (which moves the fake memory counters)."""

    made: list = []
    on_step = staticmethod(lambda: None)

    def __init__(self, lm, cfg, records):
        self.cfg, self.steps = cfg, 0
        _ProbeTrainer.made.append(self)

    def step(self, prompts):
        self.steps += 1
        _ProbeTrainer.on_step()


def _probe_stubs(monkeypatch, clean=True):
    """memprobe.probe with a stand-in model and trainer: the warm-up step adds 1 GiB of RSS for good, the measured step
    30 MiB for good with a transient 70 MiB above that; the lifetime peak (ru_maxrss) is 5 GiB."""
    import resource

    import dgrpo.training.grpo

    mem = {"rss": 100 * MiB, "hwm": 4 * 2**30, "steps": 0}

    def on_step():
        mem["steps"] += 1
        grow = 2**30 if mem["steps"] == 1 else 30 * MiB
        mem["hwm"] = max(mem["hwm"], mem["rss"] + grow + (70 * MiB if mem["steps"] > 1 else 0))
        mem["rss"] += grow

    def reset():
        mem["hwm"] = mem["rss"]
        return clean

    _ProbeTrainer.made, _ProbeTrainer.on_step, loras = [], staticmethod(on_step), []
    monkeypatch.setattr(dgrpo.training.grpo, "GRPOTrainer", _ProbeTrainer)
    monkeypatch.setattr(workload, "build_lm", lambda shapes, device, dtype: "lm")
    monkeypatch.setattr(workload, "add_lora", lambda lm, r: loras.append(r))
    monkeypatch.setattr(memprobe, "reset_peak_rss", reset)
    monkeypatch.setattr(memprobe, "gc", types.SimpleNamespace(collect=lambda: 0))  # (a full collection takes ~0.5 s)
    monkeypatch.setattr(memprobe, "malloc_trim", lambda: None)
    monkeypatch.setattr(memprobe, "status_kb", lambda field: mem[{"VmRSS": "rss", "VmHWM": "hwm"}[field]] // 1024)
    usage = types.SimpleNamespace(ru_maxrss=5 * 2**30 // 1024)
    monkeypatch.setattr(resource, "getrusage", lambda who: usage)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    return loras


def _spec(**extra):
    return {"shapes": TINY.to_json(), "device": "cpu", "dtype": "float32", "K": 4, "T": 2, "kind": "locked", **extra}


def test_probe_measures_the_step_after_the_warmup_from_a_reset_peak(monkeypatch):
    """CPU: the peak is the RSS high-water mark of the measured step alone (reset after the warm-up), 'before' the RSS
    just before it, in bytes (the kB fields x 1024); delta = peak - before."""
    _probe_stubs(monkeypatch)
    out = memprobe.probe(_spec(warmup=1))
    before = 100 * MiB + 2**30
    assert (out["before_bytes"], out["peak_bytes"], out["delta_bytes"]) == (before, before + 100 * MiB, 100 * MiB)
    assert out["kind"] == "rss" and out["clean_peak"] is True and _ProbeTrainer.made[0].steps == 2
    assert out["spec"] == {k: v for k, v in _spec(warmup=1).items() if k != "shapes"}


def test_probe_falls_back_to_the_lifetime_peak_and_says_so(monkeypatch):
    """Where the high-water mark cannot be reset the peak is ru_maxrss (kB x 1024), flagged clean_peak false."""
    _probe_stubs(monkeypatch, clean=False)
    out = memprobe.probe(_spec())
    assert out["peak_bytes"] == 5 * 2**30 and out["clean_peak"] is False


def test_probe_sets_up_the_arm_its_spec_names(monkeypatch):
    """The spec's LoRA rank, recomputation (off, call, layer; True is call), latent-step recomputation, micro-batch
    and warm-up count reach the trainer; absent keys keep the timing config's defaults (LoRA off)."""
    loras = _probe_stubs(monkeypatch)
    for extra in ({}, {"recompute": "layer", "recompute_latent_steps": False, "micro_batch_size": 3, "lora_r": 8}):
        memprobe.probe(_spec(**extra))
    memprobe.probe(_spec(recompute=True, warmup=2))
    (plain, layer, true) = [tr.cfg.grpo for tr in _ProbeTrainer.made]
    default_mb = workload.grpo_config(TINY, 4, 2, "locked").grpo.micro_batch_size
    assert (plain.recompute, plain.recompute_latent_steps, plain.micro_batch_size) == (False, True, default_mb)
    assert (layer.recompute, layer.recompute_granularity, layer.recompute_latent_steps) == (True, "layer", False)
    assert layer.micro_batch_size == 3 and (true.recompute, true.recompute_granularity) == (True, "call")
    assert (plain.group_size, plain.n_latent) == (4, 2) and loras == [8]
    assert [tr.steps for tr in _ProbeTrainer.made] == [2, 2, 3]


def test_probe_on_cuda_takes_the_allocators_peak_since_the_reset(monkeypatch):
    """CUDA: before = bytes allocated after the warm-up and the reset, peak = max_memory_allocated over the step."""
    _probe_stubs(monkeypatch)
    mem = {"now": 0, "peak": 0}

    def step():  # (the warm-up step's transient is the larger: a peak not reset would be its)
        mem["peak"] = max(mem["peak"], mem["now"] + (500 if mem["now"] == 0 else 50))
        mem["now"] += 10

    _ProbeTrainer.on_step = staticmethod(step)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a: mem.update(peak=mem["now"]))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a: mem["now"])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: mem["peak"])
    out = memprobe.probe(_spec(device="cuda"))
    assert (out["kind"], out["before_bytes"], out["peak_bytes"], out["delta_bytes"]) == ("cuda_allocated", 10, 60, 50)


def test_run_probe_sends_the_spec_and_reads_the_last_line(monkeypatch):
    """run_probe runs ``python -m dgrpo.bench.memprobe SPEC`` with ctx's device, dtype and threads, one warm-up step
    and the extra keys; the result is the JSON of the last stdout line; a failed child raises with its stderr."""
    calls = []

    def run(cmd, **kw):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, 'noise\n{"peak_bytes": 7}\n', "")

    monkeypatch.setattr(memprobe.subprocess, "run", run)
    ctx = Ctx(CPU, torch.bfloat16, TINY, threads=3)
    assert memprobe.run_probe(ctx, TINY, 4, 2, "none", lora_r=16) == {"peak_bytes": 7}
    assert calls[0][:3] == [sys.executable, "-m", "dgrpo.bench.memprobe"]
    spec = json.loads(calls[0][3])
    assert spec == {
        "shapes": json.loads(json.dumps(TINY.to_json())),
        "device": "cpu",
        "dtype": "bfloat16",
        "K": 4,
        "T": 2,
        "kind": "none",
    } | {
        "threads": 3,
        "warmup": 1,
        "lora_r": 16,
    }
    monkeypatch.setattr(memprobe.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(cmd, 1, "", "boom"))
    with pytest.raises(RuntimeError, match="(?s)memory probe failed.*boom"):
        memprobe.run_probe(ctx, TINY, 4, 2)


def _counting_probes(monkeypatch) -> list:
    """memprobe's child processes faked: each call is recorded (its spec) and measures a new peak."""
    specs: list = []

    def run(cmd, **kw):
        specs.append(json.loads(cmd[3]))
        n = len(specs)
        out = {"kind": "rss", "peak_bytes": n, "before_bytes": 0, "delta_bytes": n, "clean_peak": True}
        return subprocess.CompletedProcess(cmd, 0, json.dumps(out), "")

    monkeypatch.setattr(memprobe.subprocess, "run", run)
    return specs


def test_run_probe_reuses_a_probe_of_the_same_spec_only_when_asked(monkeypatch):
    """A probe's first result per spec is kept in the suite's ctx; reuse returns it for the same spec (lora_r 0 is no
    LoRA) and runs a fresh process for any other spec, without reuse (item 5's repetitions) or in another run."""
    specs = _counting_probes(monkeypatch)
    ctx = _ctx()
    first = memprobe.run_probe(ctx, TINY, 4, 2, "locked")
    assert memprobe.run_probe(ctx, TINY, 4, 2, "locked")["peak_bytes"] == 2  # (a repetition measures again)
    assert memprobe.run_probe(ctx, TINY, 4, 2, lora_r=0, reuse=True) == first and first["peak_bytes"] == 1
    assert len(specs) == 2
    for kind, K, extra in (("none", 4, {}), ("locked", 2, {}), ("locked", 4, {"lora_r": 16})):
        assert memprobe.run_probe(ctx, TINY, K, 2, kind, reuse=True, **extra)["peak_bytes"] == len(specs)
    assert len(specs) == 5 and specs[-1]["lora_r"] == 16
    assert memprobe.run_probe(_ctx(), TINY, 4, 2, reuse=True)["peak_bytes"] == 6


@pytest.mark.parametrize("section", ["quick", "gpu"])
def test_lora_full_arm_reuses_item_5s_locked_probe_where_it_is_the_same(monkeypatch, section):
    """In --quick (and on the GPU) item 9's full arm is item 5's locked probe: the suite runs it once; the LoRA arm,
    and the full arm at the full CPU section's own shapes, run their own fresh processes."""
    specs = _counting_probes(monkeypatch)
    shapes, device = {"quick": (workload.QUICK, "cpu"), "gpu": (workload.GPU, "cuda")}[section]
    monkeypatch.setattr(items, "_replay_bytes_row", lambda ctx, K, T: (None, {}))
    ctx = _ctx(shapes, device)
    mem = items.bench_memory(ctx)[1]
    s = lora_item.item_shapes(ctx)
    assert lora_item._probe(ctx, s, 0) is mem["probes"]["locked"][0] and len(specs) == len(mem["probes"])
    assert lora_item._probe(ctx, s, lora_item.LORA_R)["peak_bytes"] == len(specs) == len(mem["probes"]) + 1
    full = _ctx(workload.FULL)
    items.bench_memory(full)
    lora_item._probe(full, lora_item.item_shapes(full), 0)
    assert specs[-1]["shapes"]["name"] == "lora-cpu" and specs[-1]["lora_r"] == 0


# --------------------------------------------------------------------------- 9. LoRA
def test_lora_rows_are_lora_over_full(monkeypatch):
    """Item 9: each arm's memory from its own fresh process (full r=0, LoRA r=16); the rows are lora / full for the
    trainable parameters, the optimizer state, the step's peak (not its growth) and the median step time."""
    probes = []

    def probe(ctx, s, K, T, lora_r, reuse):
        probes.append(lora_r)
        peak, before = {0: (400, 300), 16: (100, 90)}[lora_r]
        return {"peak_bytes": peak * MiB, "before_bytes": before * MiB}

    monkeypatch.setattr(lora_item, "run_probe", probe)
    arms = {0: _arm(lm=types.SimpleNamespace(peft=False), opt=0), 16: _arm(lm=types.SimpleNamespace(peft=True), opt=16)}
    monkeypatch.setattr(lora_item, "build_trainer", lambda s, device, dtype, r: arms[r])
    monkeypatch.setattr(lora_item, "_counts", lambda lm: (1000, 1200))  # (trainable, total)
    monkeypatch.setattr(lora_item.lora, "trainable_parameters", lambda lm: (50, 1050))
    monkeypatch.setattr(lora_item, "optimizer_state_bytes", lambda opt: {0: 8000, 16: 400}[opt])
    scripted_alternate(monkeypatch, lora_item, ({"full": [2.0, 2.0, 2.0], "lora": [1.0, 1.5, 3.0]}, {}))
    monkeypatch.setattr(lora_item.importlib.util, "find_spec", lambda name: object())  # (as if peft were installed)
    rows, raw = lora_item.bench_lora(_ctx())
    assert probes == [0, 16]
    assert [r.ratio for r in rows] == pytest.approx([0.05, 0.05, 0.25, 0.75])
    assert [r.ratio_name for r in rows] == [
        "trainable params lora / full",
        "optimizer state lora / full",
        "peak RSS of the step lora / full",
        "step time lora / full",
    ]
    assert rows[3].spread == (0.5, 1.5) and raw["params"] == {"full": (1000, 1200), "lora": (50, 1050)}
    monkeypatch.setattr(lora_item.importlib.util, "find_spec", lambda name: None)
    assert lora_item.bench_lora(_ctx())[0] == []


def test_lora_arms_are_the_same_model_with_and_without_adapters(monkeypatch):
    """build_trainer adds LoRA of rank r only when r > 0, on the model the same shapes build; _counts is (trainable,
    total)."""
    added = []
    monkeypatch.setattr(lora_item, "build_lm", lambda s, device, dtype: ("lm", s))
    monkeypatch.setattr(lora_item, "add_lora", lambda lm, r: added.append(r))
    monkeypatch.setattr(lora_item, "GRPOTrainer", lambda lm, cfg, records: (lm, cfg.grpo.group_size, len(records)))
    assert lora_item.build_trainer(TINY, CPU, torch.float32, 0) == (("lm", TINY), TINY.grpo_K_at, TINY.prompts)
    lora_item.build_trainer(TINY, CPU, torch.float32, 16)
    assert added == [16]
    model = torch.nn.Linear(3, 2)
    model.bias.requires_grad_(False)
    assert lora_item._counts(types.SimpleNamespace(model=model)) == (6, 8)


# --------------------------------------------------------------------------- 10. recomputation
def test_recompute_rows_are_each_arm_over_full_backprop(monkeypatch):
    """Item 10: per arm, kept-for-backward bytes / full's, the peak's growth during the step (peak - before) / full's,
    and the median step time / full's; --quick measures no memory (no probe, no growth row)."""
    probes = []
    growth = {None: 100, "call": 20, "layer": 40}

    def probe(ctx, s, recompute, latent_steps=True):
        probes.append((recompute, latent_steps))
        g = growth[recompute] + (0 if latent_steps else 10)
        return {"peak_bytes": (1000 + g) * MiB, "before_bytes": 1000 * MiB}

    monkeypatch.setattr(recompute_item, "_probe", probe)
    monkeypatch.setattr(
        recompute_item, "build_trainer", lambda s, device, dtype, rec, latent=True: _arm(arm=(rec, latent))
    )
    kept = {(None, True): 800, ("call", True): 100, ("layer", True): 200, ("layer", False): 400}
    monkeypatch.setattr(recompute_item, "saved_bytes", lambda tr: kept[tr.arm])
    times = {"full": [1.0] * 3, "call": [1.5] * 3, "layer": [1.2] * 3, "layer, latent steps kept": [1.1] * 3}
    scripted_alternate(monkeypatch, recompute_item, (times, {}), (times, {}))  # (the full run, then --quick)
    rows, raw = recompute_item.bench_recompute(_ctx())
    assert probes == list(recompute_item.ARMS.values())
    got = {r.ratio_name: r.ratio for r in rows}
    assert got == pytest.approx(
        {
            "activations kept for backward call / full": 0.125,
            "peak RSS growth during the step call / full": 0.2,
            "step time call / full": 1.5,
            "activations kept for backward layer / full": 0.25,
            "peak RSS growth during the step layer / full": 0.4,
            "step time layer / full": 1.2,
            "activations kept for backward layer, latent steps kept / full": 0.5,
            "peak RSS growth during the step layer, latent steps kept / full": 0.5,
            "step time layer, latent steps kept / full": 1.1,
        }
    )
    probes.clear()
    rows, raw = recompute_item.bench_recompute(_ctx(Shapes(**{**TINY.to_json(), "name": "quick"})))
    assert probes == [] and raw["memory"] == {} and len(rows) == 6 and not any("growth" in r.ratio_name for r in rows)


def test_the_recompute_items_arms_build_without_a_warning(recwarn):
    """Each arm of the recompute item builds its trainer without a word: the full-backprop arm set
    grpo.recompute_granularity=call without recompute, and its trainer warned that the key changes nothing (in the
    bench's output)."""
    for arm in recompute_item.ARMS.values():
        recompute_item.build_trainer(TINY, CPU, torch.float32, *arm)
    assert [str(w.message) for w in recwarn] == []


def test_recompute_arms_run_one_micro_batch_with_their_own_setting(monkeypatch):
    """build_trainer and the memory probe: recomputation off for None, else on at the named granularity, the latent
    steps' flag passed on, the whole step (prompts x K) in one micro-batch."""
    monkeypatch.setattr(recompute_item, "build_lm", lambda s, device, dtype: "lm")
    monkeypatch.setattr(recompute_item, "GRPOTrainer", lambda lm, cfg, records: cfg.grpo)
    s = Shapes(**{**TINY.to_json(), "prompts": 3, "grpo_K_at": 5})
    got = [recompute_item.build_trainer(s, CPU, torch.float32, *arm) for arm in recompute_item.ARMS.values()]
    assert [(g.recompute, g.recompute_granularity, g.recompute_latent_steps) for g in got] == [
        (False, "layer", True),  # (the default: "call" set without recompute warned that it changes nothing)
        (True, "call", True),
        (True, "layer", True),
        (True, "layer", False),
    ]
    assert {g.micro_batch_size for g in got} == {15}
    calls = []
    monkeypatch.setattr(recompute_item, "run_probe", lambda *a, **kw: calls.append((a[2:], kw)))
    recompute_item._probe(_ctx(), s, "layer", False)
    assert calls == [
        ((5, TINY.grpo_T_at), {"recompute": "layer", "recompute_latent_steps": False, "micro_batch_size": 15})
    ]


def test_kept_for_backward_counts_saved_activations_once_and_no_weights():
    """kept_for_backward counts the storages autograd saves in the forward (each once), leaves out the parameters' own,
    counts a non-reentrant checkpointed region's inputs (the region holds them; its inside saves through its own
    hooks), and not what a reentrant region saves while it is recomputed inside backward."""
    import torch.utils.checkpoint as ckpt

    w = torch.nn.Parameter(torch.ones(4, 4))
    x = torch.ones(3, 4, requires_grad=True)  # 48 bytes
    f = lambda t: (t * t).exp()  # noqa: E731  (saves t, and exp's 48-byte output)
    assert recompute_item.kept_for_backward(lambda: (x @ w).sum().backward(), [w]) == 48  # (x; w is a weight)
    assert recompute_item.kept_for_backward(lambda: f(x).sum().backward(), [w]) == 96
    region = lambda reentrant: ckpt.checkpoint(f, x, use_reentrant=reentrant).sum().backward()  # noqa: E731
    assert recompute_item.kept_for_backward(lambda: region(False), [w]) == 48  # (the region's input)
    assert recompute_item.kept_for_backward(lambda: region(True), [w]) == 48  # (its saved input; not the replay's)


# --------------------------------------------------------------------------- 11. CPU parallelism
def test_parallel_rows_are_each_arms_throughput_over_one_thread(monkeypatch):
    """Item 11: an arm's throughput is the sum of its processes' steps per second; each row is the arm's median over
    one process with one thread, with the per-repetition ratios' spread; --quick runs two arms, one repetition."""
    monkeypatch.setattr(parallel_item, "available_cpus", lambda: 4)
    rate = {(1, 1, None): [1.0, 2.0, 1.0], (1, 4, None): [2.0, 3.0, 2.5], (4, 1, None): [3.0, 3.0, 5.0]}
    rate[(1, 4, "PASSIVE")] = [2.0, 2.0, 2.0]
    ran = []

    def run_arm(procs, threads, omp, steps, warmup):
        ran.append((procs, threads, omp, steps, warmup))
        r = rate[(procs, threads, omp)][sum(a[:3] == (procs, threads, omp) for a in ran) - 1]
        return [{"steps": steps, "seconds": steps / r * procs}] * procs  # (procs processes summing to r)

    monkeypatch.setattr(parallel_item, "run_arm", run_arm)
    rows, raw = parallel_item.bench_parallel(_ctx(Shapes(**{**TINY.to_json(), "name": "full"})))
    assert ran[:4] == [(1, 1, None, 40, 3), (1, 4, None, 40, 3), (4, 1, None, 40, 3), (1, 4, "PASSIVE", 40, 3)]
    assert len(ran) == 12 and raw["steps_per_s"]["4 x 1 thread"] == pytest.approx([3.0, 3.0, 5.0])
    assert [r.ratio_name for r in rows] == [
        "SFT steps/s, 1 x 4 threads / 1 x 1 thread",
        "SFT steps/s, 4 x 1 thread / 1 x 1 thread",
        "SFT steps/s, 1 x 4 threads, PASSIVE / 1 x 1 thread",
    ]
    assert [r.ratio for r in rows] == pytest.approx([2.5, 3.0, 2.0])
    assert rows[0].spread == pytest.approx((1.5, 2.5)) and rows[1].spread == pytest.approx((1.5, 5.0))
    ran.clear()
    rows, raw = parallel_item.bench_parallel(_ctx(Shapes(**{**TINY.to_json(), "name": "quick"})))
    assert ran == [(1, 1, None, 2, 1), (4, 1, None, 2, 1)] and len(rows) == 1


class _Proc:
    """A stand-in probe process: says ready (or not), takes its go, prints its result."""

    started: list = []

    def __init__(self, cmd, stdin, stdout, stderr, text, env, ready="ready", code=0):
        self.spec, self.env, self.returncode, self.killed = json.loads(cmd[3]), env, code, False
        self.stdout = types.SimpleNamespace(readline=lambda: ready + "\n")
        self.got = []
        self.stdin = types.SimpleNamespace(write=self.got.append, flush=lambda: None)
        _Proc.started.append(self)

    def communicate(self, timeout):
        assert self.got == ["go\n"]
        return "warming\n" + json.dumps({"seed": self.spec["seed"]}) + "\n", None

    def kill(self):
        self.killed = True


def test_run_arm_starts_its_processes_together_under_the_named_wait_policy(monkeypatch):
    """run_arm starts ``procs`` probes (seeds 0..procs-1, the threads, steps and warm-up given), lets them go only once
    all are ready, and returns their last lines; OMP_WAIT_POLICY is the one named, or left out for the default; a
    probe that is not ready kills them all and raises."""
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    _Proc.started = []
    monkeypatch.setattr(parallel_item.subprocess, "Popen", _Proc)
    assert parallel_item.run_arm(3, 2, None, 7, 1) == [{"seed": 0}, {"seed": 1}, {"seed": 2}]
    assert [p.spec for p in _Proc.started] == [{"threads": 2, "seed": i, "steps": 7, "warmup": 1} for i in range(3)]
    assert all("OMP_WAIT_POLICY" not in p.env for p in _Proc.started)
    parallel_item.run_arm(1, 4, "PASSIVE", 7, 1)
    assert _Proc.started[-1].env["OMP_WAIT_POLICY"] == "PASSIVE"
    _Proc.started = []
    monkeypatch.setattr(parallel_item.subprocess, "Popen", lambda *a, **k: _Proc(*a, **k, ready="Traceback"))
    with pytest.raises(RuntimeError, match="parallel probe failed"):
        parallel_item.run_arm(2, 1, None, 7, 1)
    assert [p.killed for p in _Proc.started] == [True, True]
    _Proc.started = []  # (the second of two exits with 1: one failed process fails the arm)
    monkeypatch.setattr(parallel_item.subprocess, "Popen", lambda *a, **k: _Proc(*a, **k, code=len(_Proc.started)))
    with pytest.raises(RuntimeError, match=r"exited with \[0, 1\]"):
        parallel_item.run_arm(2, 1, None, 7, 1)


# --------------------------------------------------------------------------- the naive Coconut baseline
def test_naive_coconut_loss_and_gradients_equal_the_librarys():
    """The naive multi-pass forward is the same computation as sft_loss: the same loss and the same gradients (a
    baseline that did less work, e.g. cut the latent chain's gradient, would time something else); mixed latent counts
    are refused."""
    import dataclasses
    import random

    from dgrpo.config import Config
    from dgrpo.training.curriculum import make_example
    from dgrpo.training.sft import count_target_tokens, sft_loss

    lm = workload.build_lm(TINY, CPU, torch.float32, fixed_length=False).train()
    cfg = Config()
    examples = [make_example(r, 2, cfg, random.Random(0)) for r in workload.task_records(2)]
    q = examples[1].question  # (the built-in questions are of one length: a shorter one pads)
    examples[1] = dataclasses.replace(examples[1], question=q[: q.rindex(" ", 0, len(q) // 2)])
    t = examples[0].target  # (and a shorter target: its padding takes no loss)
    examples[0] = dataclasses.replace(examples[0], target=t.split("\n", 1)[1])  # (a step fewer)
    norm = 3.0 * count_target_tokens(lm, examples, cfg)  # (any normalizer: not the mean over the targets)
    grads = []
    for f in (
        lambda: sft_loss(lm, examples, cfg, norm)[0],
        lambda: baselines.naive_coconut_loss(lm, examples, cfg, norm),
    ):
        lm.zero_grad(set_to_none=True)
        loss = f()
        loss.backward()
        grads.append((loss.detach(), [p.grad.clone() for p in lm.parameters() if p.grad is not None]))
    (ours, g_ours), (naive, g_naive) = grads
    assert examples[0].n_latent == 2 and float(naive) == pytest.approx(float(ours), abs=1e-5)
    assert len(g_ours) == len(g_naive) and all(torch.allclose(a, b, atol=1e-5) for a, b in zip(g_ours, g_naive))
    with pytest.raises(ValueError, match="one latent count"):
        baselines.naive_coconut_loss(
            lm, [examples[0], make_example(workload.task_records(1)[0], 1, cfg, random.Random(0))], cfg, norm
        )
