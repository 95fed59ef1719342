"""The benchmark's measuring code on hand-made numbers (gaps found by mutation testing): the alternated timer's clocks,
medians and ratios, the claims' pass/fail at their thresholds, the units of the tables, the FLOP counts, and each
item's arithmetic from scripted timings (the candidates themselves are not run: ``alternate`` is replaced)."""

import json
import os
import signal
import subprocess
import sys
import types

import pytest
import torch

from dgrpo.bench import engine_item, items, launch, options, report, step_profile, suite, timeline, timing, workload
from dgrpo.bench.report import Goal, Row
from dgrpo.bench.timing import Timed
from dgrpo.bench.workload import Ctx, Dims, Shapes

from conftest import bench_ctx as _ctx
from conftest import bench_tiny_shapes, scripted_alternate

CPU = torch.device("cpu")
#: a model small enough to build in milliseconds (the bench's shapes are far larger)
TINY = bench_tiny_shapes()


class _Clock:
    """A fake ``time`` module: candidates advance its wall and CPU clocks by what they say they cost."""

    def __init__(self) -> None:
        self.wall = self.cpu = 0.0

    def perf_counter(self) -> float:
        return self.wall

    def process_time(self) -> float:
        return self.cpu

    def spend(self, wall: float, cpu: float) -> None:
        self.wall += wall
        self.cpu += cpu


# --------------------------------------------------------------------------- timing
def test_timed_median_ratio_and_paired_spread_by_hand():
    """median is the middle repetition (not the mean), ratio(a, b) = median(a) / median(b), the paired ratios are
    a_i / b_i repetition by repetition, their spread (smallest, largest); to_json reports the medians."""
    t = Timed({"a": [1.0, 3.0, 100.0], "b": [2.0, 2.0, 4.0]})
    assert t.median("a") == 3.0 and t.ratio("a", "b") == 1.5 and t.ratio("b", "a") == pytest.approx(2 / 3)
    assert t.paired_ratios("a", "b") == [0.5, 1.5, 25.0]
    assert t.paired_spread("a", "b") == (0.5, 25.0)
    assert t.to_json()["a"] == {"median_s": 3.0, "times_s": [1.0, 3.0, 100.0], "cpu_times_s": []}


def test_alternate_times_each_call_on_the_wall_and_cpu_clocks_after_waiting_for_the_device(monkeypatch):
    """Each repetition's time is the wall time from just before the call to after the device finished its queued
    work (a sync after the call, before the clock is read); the CPU time is the process clock's; warm-ups are not
    timed; reps < 1 is refused."""
    clock = _Clock()
    pending = [0.0]  # device work queued by the candidates, paid at the next sync

    def synchronize(device=None):
        clock.spend(pending[0], 0.0)
        pending[0] = 0.0

    monkeypatch.setattr(timing, "time", clock)
    monkeypatch.setattr(timing.torch.cuda, "synchronize", synchronize)

    def candidate(host: float, cpu: float, device: float):
        def f():
            clock.spend(host, cpu)
            pending[0] += device
            return host

        return f

    fns = {"a": candidate(0.5, 0.25, 2.0), "b": candidate(1.0, 0.75, 0.0)}
    t = timing.alternate(fns, reps=2, warmup=3, device=types.SimpleNamespace(type="cuda"))
    assert t.times == {"a": [2.5, 2.5], "b": [1.0, 1.0]}
    assert t.cpu_times == {"a": [0.25, 0.25], "b": [0.75, 0.75]}
    assert t.results == {"a": [0.5, 0.5], "b": [1.0, 1.0]}
    with pytest.raises(ValueError, match="reps"):
        timing.alternate(fns, reps=0)


# --------------------------------------------------------------------------- report
def test_goals_are_met_on_their_side_of_the_threshold_and_at_it():
    """``>= 8``: met at 8 and above, not below; ``<= 1.1``: met at 1.1 and below, not above; a row without a goal
    or without a ratio has no verdict, and its JSON says so."""
    assert Goal(">=", 8).met(8.0) and Goal(">=", 8).met(9.0) and not Goal(">=", 8).met(7.99)
    assert Goal("<=", 1.1).met(1.1) and Goal("<=", 1.1).met(0.5) and not Goal("<=", 1.1).met(1.11)
    assert (str(Goal(">=", 8)), str(Goal("<=", 1.1))) == (">= 8x", "<= 1.1x")
    row = Row("cpu", "4. x", "k", "conf", "vals", "a / b", 1.2, Goal("<=", 1.1))
    assert row.met is False and row.to_json()["met"] is False and row.to_json()["goal"] == "<= 1.1x"
    assert Row("cpu", "4. x", "k", "c", "v", "a / b", None, Goal("<=", 1.1)).met is None
    assert Row("cpu", "4. x", "k", "c", "v", "a / b", 0.5).to_json()["met"] is None
    with pytest.raises(ValueError, match="a goal's op is '>=' or '<=', not '>'"):
        Goal(">", 2)  # (it was judged as <=: met by 1.0)


def test_units_of_times_bytes_flops_and_ratios():
    """Seconds under one print as milliseconds, bytes in binary units (GiB = 2**30), FLOP/s in decimal ones,
    ratios to three significant digits under 100."""
    assert (report.fmt_s(0.0123), report.fmt_s(0.5), report.fmt_s(1.5)) == ("12.3 ms", "500.0 ms", "1.50 s")
    assert report.fmt_bytes(2**30) == "1.0 GiB" and report.fmt_bytes(10**9) == "953.7 MiB"
    assert (report.fmt_bytes(1024), report.fmt_bytes(1023), report.fmt_bytes(-3 * 2**20)) == (
        "1.0 KiB",
        "1023 B",
        "-3.0 MiB",
    )
    assert (report.fmt_flops(3.5e12), report.fmt_flops(1e9), report.fmt_flops(999.0)) == (
        "3.5 TFLOP/s",
        "1.0 GFLOP/s",
        "999 FLOP/s",
    )
    assert (report.fmt_ratio(1.234), report.fmt_ratio(123.4), report.fmt_ratio(None)) == ("1.23x", "123x", "-")


def test_markdown_table_puts_each_value_in_its_column():
    """One line per row: item, configuration, values, the ratio with its paired spread (low to high), the goal and
    the verdict; a ``|`` in a cell is escaped (it would split the cell)."""
    rows = [
        Row("cpu", "4. cost", "k", "p=0.1 | mlp", "1 s; 2 s", "locked / none", 1.2, Goal("<=", 1.1), (1.05, 1.3)),
        Row("cpu", "5. memory", "k", "conf", "vals", "a / b", 3.0),
    ]
    lines = report.markdown_table(rows).splitlines()
    assert lines[0] == "| item | configuration | measured values | ratio | goal | met |" and len(lines) == 4
    assert lines[2] == (
        "| 4. cost | p=0.1 \\| mlp | 1 s; 2 s | locked / none: **1.2x** (paired 1.05x to 1.3x) | <= 1.1x | "
        "**not met** |"
    )
    assert lines[3] == "| 5. memory | conf | vals | a / b: **3x** | - | - |"


# --------------------------------------------------------------------------- workload: FLOPs and shapes
def test_recurrence_flops_by_the_formula():
    """S = P + T + L positions: 2N per position, causal attention 4 * layers * d_attn * S(S+1)/2, the LM head at
    the L scored positions; forward + backward is 3 forwards."""
    d = Dims(params_nonembedding=1000, layers=2, d_model=16, d_attn=8, vocab=50)
    S = 4 + 2 + 3
    fwd = 2 * 1000 * S + 4 * 2 * 8 * S * (S + 1) / 2 + 2 * 16 * 50 * 3  # 18000 + 2880 + 4800
    assert workload.recurrence_flops(d, 3, 4, 2, 3, backward=False) == (3 * fwd, 27) == (77040, 27)
    assert workload.recurrence_flops(d, 3, 4, 2, 3, backward=True) == (9 * fwd, 27)


def test_dims_leave_out_the_embedding_and_count_the_query_heads():
    """dims_of: parameters without the (tied) embedding, counted by hand for one Qwen2 layer of width 16 (4 query
    heads, 2 key/value heads of 4); the attention width is the query heads'."""
    lm = workload.build_lm(TINY, CPU, torch.float32)
    # q 16x16+16, k and v 8x16+8 each, o 16x16, MLP 3 x 8x16, three norms of 16
    n = (256 + 16) + 2 * (128 + 8) + 256 + 3 * 128 + 3 * 16
    d = workload.dims_of(lm)
    assert (d.params_nonembedding, d.layers, d.d_model, d.d_attn) == (n, 1, 16, 16) and d.vocab == len(lm.tokenizer)


def test_prompt_widths_are_each_chunks_own_widest_prompt():
    """(rows, width) per chunk of the given size: a chunk's width is its own longest prompt, not the batch's."""
    lm = workload.tokenizing_lm()
    questions = ["Start with 5.", "Start with 5. Add 8.", "Start with 5.", "Start with 5. Add 8. Add 9. Times 7."]
    widths = [int(m.sum()) for m in lm.encode_questions(questions)[1]]
    assert widths[0] < widths[1] < widths[3]
    got = workload.prompt_widths(lm, questions, 2)
    assert got == [(2, widths[1]), (2, widths[3])]
    assert workload.prompt_widths(lm, questions, 3) == [(3, widths[1]), (1, widths[3])]


def test_grpo_config_for_timing_and_the_shapes_helpers():
    """The timed GRPO config: filter off, no lr warm-up, beta0 only where given; task_records(n) gives n records;
    Shapes survive JSON (tuples back); a CPU item's own shapes only in the full CPU section."""
    cfg = workload.grpo_config(TINY, 4, 3, "none")
    assert (cfg.grpo.group_size, cfg.grpo.n_latent, cfg.grpo.prompts_per_step) == (4, 3, 2)
    assert str(cfg.grpo.filter).lower() == "false" and cfg.grpo.warmup_steps == 0
    assert cfg.perturbation.kind == "none" and cfg.grpo.beta0 == workload.Config().grpo.beta0
    assert workload.grpo_config(TINY, 4, 3, beta0=0.0).grpo.beta0 == 0.0
    assert len(workload.task_records(3)) == 3 and len(workload.task_records(10)) == 10
    assert Shapes.from_json(json.loads(json.dumps(workload.QUICK.to_json()))) == workload.QUICK  # (lists back)
    own = Shapes(name="own")
    assert workload.cpu_item_shapes(Ctx(CPU, torch.float32, workload.FULL), own) is own
    assert workload.cpu_item_shapes(Ctx(CPU, torch.float32, workload.QUICK), own) is workload.QUICK
    cuda = Ctx(torch.device("cuda"), torch.bfloat16, workload.FULL)
    assert workload.cpu_item_shapes(cuda, own) is workload.FULL and cuda.section == "gpu"
    assert Ctx(CPU, torch.float32, TINY).section == "cpu"


def test_suppress_eos_keeps_every_answer_to_its_full_length():
    """build_lm's EOS hook: the EOS logit is -1e4 at every position, so answers never stop early; a build without
    it (fixed_length=False, item 2's) has its own EOS logit."""
    lm = workload.build_lm(TINY, CPU, torch.float32)
    logits = lm.model(torch.tensor([[1, 2, 3]])).logits
    assert torch.all(logits[..., lm.eos_id] == -1e4)
    assert torch.all(logits.max(-1).values > -1e4)
    free = workload.build_lm(TINY, CPU, torch.float32, fixed_length=False)  # (not the kept fixed-length build)
    assert not torch.any(free.model(torch.tensor([[1, 2, 3]])).logits[..., lm.eos_id] == -1e4)


# --------------------------------------------------------------------------- timeline
def test_timeline_edge_cases_nesting_at_one_start_cut_ranges_and_short_gaps():
    """Two ranges starting together nest the longer outside; a range outlasting its parent is cut at the parent's
    end (its host time too); a gap shorter than a microsecond is still a gap, and none opens inside a kernel that
    outlasts a later one; a gap no kernel ends goes to the path in force at its middle; a kernel's wait and time go
    to the path that launched it, not the one at its start."""
    tl = timeline.label_timeline([(0, 5, "inner"), (0, 10, "outer")])
    assert [timeline.path_at(tl, t) for t in (2, 7, 12)] == ["outer > inner", "outer", ""]
    host = {row[0]: row[1] for row in timeline.time_by_range((0, 20_000), [(0, 10_000, "a"), (5_000, 15_000, "b")])}
    assert host == {"a": 5.0, "a > b": 5.0, timeline.UNLABELLED: 10.0}
    assert timeline.idle_gaps([(0, 1), (1.5, 2)], (0, 2)) == [(1, 1.5, 1)]
    assert timeline.idle_gaps([(0, 10), (2, 5), (12, 14)], (0, 20)) == [(10, 12, 2), (14, 20, -1)]  # (2-5 within)
    rows = timeline.time_by_range((0, 100_000), [(0, 50_000, "a"), (50_000, 100_000, "b")], [(0, 10_000)], [None])
    assert {row[0]: row[2] for row in rows} == {"b": 90.0, "a": 0.0}
    # a kernel launched in a (at 5 ms) that the device ran in b's time (12-15 ms): its wait and its time are a's
    rows = timeline.time_by_range((0, 20_000), [(0, 10_000, "a"), (10_000, 20_000, "b")], [(12_000, 15_000)], [5_000])
    assert {row[0]: row[2:] for row in rows} == {"a": [12.0, 1, 3.0, 1], "b": [5.0, 1, 0.0, 0]}


# --------------------------------------------------------------------------- step profile
def _event(name, device, start, end, *, id=0, linked=0, device_time=0.0, own=0.0, annotation=False, thread=1):
    """A profiler event as device_activity reads it (times in microseconds)."""
    kind = torch.autograd.DeviceType.CUDA if device == "cuda" else torch.autograd.DeviceType.CPU
    return types.SimpleNamespace(
        name=name,
        device_type=kind,
        is_user_annotation=annotation,
        device_time=device_time,
        time_range=types.SimpleNamespace(start=start, end=end),
        id=id,
        linked_correlation_id=linked,
        thread=thread,
        self_cpu_time_total=own,
    )


def _profiled(monkeypatch, events: list) -> None:
    """device_activity's profiler gives ``events``, and its clock a step of 10 ms."""

    class Profile:
        def __init__(self, activities):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def events(self):
            return events

    clock = iter([0.0, 0.01])
    monkeypatch.setattr(step_profile, "profile", Profile)
    monkeypatch.setattr(step_profile, "time", types.SimpleNamespace(perf_counter=lambda: next(clock)))


def test_device_activity_busy_share_launches_and_phases_from_a_made_up_profile(monkeypatch):
    """The step's kernel-busy share is the kernels' summed device time (microseconds -> seconds) over the step's
    wall time, the ranges' device-side images left out; every kind of launch call counts; a phase gets the kernels
    its host launched and the union of their spans in its window; the share of kernels matched to their launch."""
    step = step_profile._STEP_RANGE
    events = [
        _event(step, "cpu", 0, 10_000, own=10.0),
        _event("phase", "cpu", 0, 5_000, own=5.0),
        _event("cudaLaunchKernel", "cpu", 100, 110, id=1, own=1.0),
        _event("cuLaunchKernel", "cpu", 200, 210, id=2, own=1.0),
        _event("cudaGraphLaunch", "cpu", 6_000, 6_010, id=3, own=1.0),
        _event("gemm", "cuda", 1_000, 3_000, id=1, device_time=2_000.0),
        _event("copy", "cuda", 5_500, 6_500, id=2, device_time=1_000.0),  # (launched in the phase, run after it)
        _event("replayed", "cuda", 7_000, 9_000, id=99, device_time=2_000.0),  # (its launch unknown)
        _event("phase", "cuda", 0, 5_000, device_time=5_000.0, annotation=True),  # (a range's image: no work)
    ]
    _profiled(monkeypatch, events)  # (a step of 10 ms)
    out = step_profile.device_activity(lambda: None, CPU, phases=("phase",), labels={"phase"})
    assert (out["kernels"], out["kernel_launches"], out["graph_launches"]) == (3, 2, 1)
    assert (out["profiled_wall_s"], out["gpu_busy_s"], out["gpu_busy_share"]) == (0.01, 0.005, 0.5)
    assert out["gpu_busy_union_share"] == 0.5  # (no two kernels overlap)
    # the phase (0-5 ms) launched gemm (1-3 ms) and copy (5.5-6.5 ms, after it): busy 2 of its 5 ms
    assert out["phases"]["phase"] == {
        "wall_s": 0.005,
        "busy_s": 0.002,
        "busy_share": 0.4,
        "kernels": 2,
        "device_top": [["gemm", 1, 2.0], ["copy", 1, 1.0]],
    }
    assert out["launch_matched_share"] == 0.667
    assert out["device_top"][0] == ["gemm", 1, 2.0] and [r[0] for r in out["host_top"]][0] == step
    assert "phase" not in [r[0] for r in out["host_top"]]  # (a phase's range is no host call of its own)


def test_kernels_overlapping_on_two_streams_count_once_in_the_union_share(monkeypatch):
    """Two kernels of 3 ms on two streams at once in a 10 ms step: the summed share (the issue's tool's) is 0.6, the
    share of the step some kernel ran 0.3."""
    events = [
        _event(step_profile._STEP_RANGE, "cpu", 0, 10_000, own=10.0),
        _event("gemm", "cuda", 1_000, 4_000, id=1, device_time=3_000.0),
        _event("copy", "cuda", 1_000, 4_000, id=2, device_time=3_000.0),
    ]
    _profiled(monkeypatch, events)  # (a step of 10 ms)
    out = step_profile.device_activity(lambda: None, CPU)
    assert (out["gpu_busy_share"], out["gpu_busy_union_share"]) == (0.6, 0.3)


def test_matmul_peak_counts_two_flops_per_multiply_add(monkeypatch):
    """n x n x n in ``reps`` products: reps * 2n^3 FLOPs over the timed seconds."""
    clock = iter([10.0, 12.0])
    monkeypatch.setattr(step_profile, "time", types.SimpleNamespace(perf_counter=lambda: next(clock)))
    assert step_profile.matmul_peak(CPU, torch.float32, n=8, reps=4) == 4 * 2 * 8**3 / 2.0


def test_a_phases_kernels_are_those_launched_from_its_start_to_before_its_end():
    """[start, end): a launch at a window's start is the phase's, one at its end is not."""
    k = ["at start", "inside", "at end"]
    assert step_profile.launched_within(k, [10.0, 15.0, 20.0], [(10.0, 20.0)]) == ["at start", "inside"]
    assert step_profile.phase_activity([(0.0, 10.0)], []) == {"wall_s": 0.0, "busy_s": 0.0, "busy_share": 0.0}


def test_counted_ops_leave_out_views_and_waiting_ops_integer_indexing():
    """An op that returns a view (view, transpose) launches no kernel and is not counted; indexing by integers
    needs no value read back (boolean indexing does)."""
    x = torch.ones(2, 3)
    out, n = step_profile.counted_ops(lambda: (x.view(3, 2).t() * 2).sum())
    assert float(out) == 12.0 and n == 2
    assert step_profile.waiting_ops(lambda: x[torch.tensor([0, 1])])["waiting_ops"] == 0
    assert step_profile.waiting_ops(lambda: x[x > 0])["waiting_ops"] >= 1


def test_op_time_breakdown_shares_and_op_time_within_the_wall():
    """Item 6's profile of one call: the shares of op time add up to one, the matmul's among them, and the ops'
    own times (microseconds) are within the call's wall time (seconds)."""
    a = torch.randn(64, 64)
    prof = items.op_time_breakdown(lambda: torch.mm(a, a).relu(), CPU)
    assert sum(prof["share"].values()) == pytest.approx(1.0) and prof["share"]["matmul"] > 0
    shares = [share for _, share, _ in prof["top_ops"]]
    assert 0 < prof["op_time_over_wall"] <= 1.0 and shares == sorted(shares, reverse=True) and len(set(shares)) > 1


# --------------------------------------------------------------------------- the items' arithmetic
def _no_rollouts(monkeypatch):
    """Item 1's arms make no rollouts (the alternated timer calls each once)."""
    mask = types.SimpleNamespace(sum=lambda dim: torch.ones(1))
    monkeypatch.setattr(items, "collect_rollouts", lambda *a, **k: types.SimpleNamespace(mask=mask))
    monkeypatch.setattr(items, "recompute_generate", lambda *a: [0])


def _widths(questions):
    return [int(m.sum()) for m in workload.tokenizing_lm().encode_questions(questions)[1]]


def test_rollouts_rows_scale_the_one_at_a_time_baselines_per_rollout(monkeypatch):
    """Item 1: time per rollout = median / rollouts timed (K x prompts batched, seq_per_prompt x prompts one at a
    time); the ratios baseline / batched, their paired spread scaled alike; the goals only at the largest K."""
    _no_rollouts(monkeypatch)
    s = Shapes(**{**TINY.to_json(), "rollout_K": (2, 4), "T": 2, "max_new_tokens": 3, "seq_per_prompt": 1})
    timed = {"batched_locked": [0.8, 1.0, 1.2], "sequential_native": [2.0, 3.0, 4.0], "recompute_batch1": [5, 6, 7]}
    scripted_alternate(monkeypatch, items, *[(timed, {k: [3.0] * 3 for k in timed})] * 2)
    ctx = _ctx(s)
    rows, raw = items.bench_rollouts(ctx)
    assert [(r.item, r.ratio_name.split(" /")[0], r.ratio) for r in rows] == [
        ("1. rollouts", "sequential replay", 6.0),  # K=2: 4 batched in 1 s, 2 one at a time in 3 s (6 s)
        ("1. rollouts", "batch-1 recompute", 12.0),
        ("1. rollouts", "sequential replay", 12.0),  # K=4: 8 batched in 1 s
        ("1. rollouts", "batch-1 recompute", 24.0),
    ]
    assert rows[0].goal is None and rows[1].goal is None and (rows[2].met, rows[3].met) == (True, False)
    assert rows[2].spread == pytest.approx((10.0, 4 / 1.2 * 4)) and rows[3].spread == pytest.approx((7 / 1.2 * 4, 25.0))
    r4 = raw["K=4"]
    assert r4["per_rollout_s"] == {"batched_locked": 0.125, "sequential_native": 1.5, "recompute_batch1": 3.0}
    assert r4["batched_tokens_per_s"] == 8 * 3.0 / 1.0
    lm = workload.tokenizing_lm()
    P = max(_widths([r.question for r in workload.task_records(2)]))
    d = workload.dims_of(workload.build_lm(s, CPU, torch.float32))
    assert r4["batched_flops_per_s"] == workload.recurrence_flops(d, 8, P, 2, 3, backward=False)[0] and lm
    assert "125.0 ms/rollout" in rows[2].values and "1.50 s/rollout" in rows[2].values


def test_rollouts_row_gives_the_share_of_the_measured_matmul_peak(monkeypatch):
    """With item 6's peak in the run's results, the batched FLOP/s is given as its percentage."""
    _no_rollouts(monkeypatch)
    timed = {"batched_locked": [1.0], "sequential_native": [1.0], "recompute_batch1": [1.0]}
    s = Shapes(**{**TINY.to_json(), "rollout_K": (2,), "T": 2, "max_new_tokens": 3, "seq_per_prompt": 1})
    scripted_alternate(monkeypatch, items, *[(timed, {k: [3.0] for k in timed})] * 2)
    ctx = _ctx(s)
    _, raw = items.bench_rollouts(ctx)
    ctx.results["peak_flops"] = 4 * raw["K=2"]["batched_flops_per_s"]
    rows, _ = items.bench_rollouts(ctx)
    assert "25.0% of the measured matmul peak" in rows[0].values


def test_rollout_candidates_run_each_arm_its_own_way(monkeypatch):
    """Item 1's arms: K rollouts per prompt batched under locked masks, seq_per_prompt per prompt under native
    dropout (their own seeds, as many as their rollouts), batch-1 recompute seq_per_prompt times per prompt; each
    returns the mean answer length per rollout."""
    made = []

    def collect(lm, records, *, group_size, n_latent, perturbation, seeds, max_new_tokens):
        made.append((group_size, type(perturbation).__name__, len(seeds), n_latent, max_new_tokens))
        mask = torch.zeros(len(records) * group_size, 5)
        mask[:, :3] = 1
        mask[0, 3] = 1  # (one row with a 4th answer token)
        return types.SimpleNamespace(mask=mask)

    questions = []
    monkeypatch.setattr(items, "collect_rollouts", collect)
    monkeypatch.setattr(items, "recompute_generate", lambda lm, q, T, n: questions.append(q) or [0] * (n - 1))
    s = Shapes(**{**TINY.to_json(), "T": 2, "max_new_tokens": 4, "seq_per_prompt": 3})
    records = workload.task_records(2)
    fns = items._rollout_candidates(None, records, s, 5)
    got = {name: f() for name, f in fns.items()}
    assert made == [(5, "LockedDropout", 10, 2, 4), (3, "NativeDropout", 6, 2, 4)]
    assert got == pytest.approx({"batched_locked": 3 + 1 / 10, "sequential_native": 3 + 1 / 6, "recompute_batch1": 3.0})
    assert questions == [r.question for r in records for _ in range(3)]


def test_sft_row_is_ours_over_naive_and_refuses_losses_that_differ(monkeypatch):
    """Item 2: ratio ours / naive against <= 0.7; the ratio is not reported when the two losses differ."""
    s = Shapes(**{**TINY.to_json(), "sft_batch": 2})
    same = {"ours": [0.5] * 3, "naive": [0.5 + 1e-6] * 3}
    scripted_alternate(monkeypatch, items, ({"ours": [0.6] * 3, "naive": [1.0, 1.0, 0.5]}, same))
    (row,), raw = items.bench_sft(_ctx(s))
    assert (row.ratio, row.met, row.spread) == (0.6, True, (0.6, 1.2)) and raw["max_abs_loss_diff"] < 1e-5
    scripted_alternate(
        monkeypatch, items, ({"ours": [0.6] * 3, "naive": [1.0] * 3}, {**same, "naive": [0.5 + 1e-3] * 3})
    )
    with pytest.raises(AssertionError, match="SFT losses differ"):
        items.bench_sft(_ctx(s))


def _no_trainers(monkeypatch):
    """The items build no trainers (the list says which they asked for) and their steps do nothing."""
    made = []
    monkeypatch.setattr(items, "_trainer", lambda ctx, K, T, kind, beta0=None: made.append((K, T, kind, beta0)))
    monkeypatch.setattr(items, "_step_fn", lambda tr, prompts: lambda: None)
    return made


def _split_results(times, rollout_share):
    return {
        k: [{"time_rollout_s": t * rollout_share, "time_update_s": t * (1 - rollout_share)} for t in v]
        for k, v in times.items()
    }


def test_grpo_scaling_rows_are_the_larger_over_the_smaller_setting(monkeypatch):
    """Item 3: each row is step(larger T or K) / step(smaller), the goal <= 2.1 on the second doubling of each."""
    _no_trainers(monkeypatch)
    s = Shapes(**{**TINY.to_json(), "grpo_T": (1, 2, 4), "grpo_K": (2, 4, 8), "grpo_K_at": 4, "grpo_T_at": 2})
    med = {"K=4,T=1": 1.0, "K=4,T=2": 1.5, "K=4,T=4": 3.3, "K=2,T=2": 0.9, "K=8,T=2": 2.7}
    times = {k: [v] * 3 for k, v in med.items()}
    scripted_alternate(monkeypatch, items, (times, _split_results(times, 0.25)))
    rows, raw = items.bench_grpo_scaling(_ctx(s))
    assert [r.ratio_name for r in rows] == [
        "step(K=4,T=2) / step(K=4,T=1)",
        "step(K=4,T=4) / step(K=4,T=2)",
        "step(K=4,T=2) / step(K=2,T=2)",
        "step(K=8,T=2) / step(K=4,T=2)",
    ]
    assert [r.ratio for r in rows] == pytest.approx([1.5, 2.2, 1.5 / 0.9, 1.8])
    assert [r.met for r in rows] == [None, False, None, True]
    assert raw["split"]["K=4,T=4"] == pytest.approx({"rollout_s": 0.825, "update_s": 2.475})


def test_perturbation_rows_are_locked_over_none_and_serial_over_split(monkeypatch):
    """Item 4: the step's ratio locked / none against <= 1.10, the phases' ratios alike; the mask draw's serial /
    split."""
    made = _no_trainers(monkeypatch)
    step = {"locked": [1.05, 1.2, 1.0], "none": [1.0, 1.0, 1.0]}
    results = {
        "locked": [{"time_rollout_s": 0.6, "time_update_s": 0.45}] * 3,
        "none": [{"time_rollout_s": 0.4, "time_update_s": 0.5}] * 3,
    }
    scripted_alternate(monkeypatch, items, (step, results), ({"serial": [2.0, 3.0, 2.0], "split": [1.0, 1.0, 1.0]}, {}))
    drawn = []
    monkeypatch.setattr(items, "draw_threads", lambda rows: 4)
    monkeypatch.setattr(items, "draw_keep_rows", lambda seeds, sites, width, p, threads=None: drawn.append(threads))
    (step_row, draw_row), raw = items.bench_perturbation(_ctx())
    assert made == [(TINY.grpo_K_at, TINY.grpo_T_at, "locked", None), (TINY.grpo_K_at, TINY.grpo_T_at, "none", None)]
    assert drawn == [1, 4] and raw["mask_draw"]["threads"] == 4  # serial, then split over the thread budget
    assert (step_row.ratio, step_row.met, step_row.spread) == (1.05, True, (1.0, 1.2))
    assert (raw["ratio_rollout"], raw["ratio_update"]) == pytest.approx((1.5, 0.9))
    assert (draw_row.ratio_name, draw_row.ratio, draw_row.spread) == ("serial / split mask draw", 2.0, (2.0, 3.0))


def test_memory_rows_are_locked_over_none_and_masks_over_the_seed(monkeypatch):
    """Item 5: the step increment's ratio locked / none (medians of the probes); the replay row's fp32 masks (sites
    x hidden x 4 bytes) over the 8-byte seed, and the native attention masks' bytes by their formula."""

    def probe(ctx, shapes, K, T, kind):
        mib = {("locked", shapes.grpo_K_at): 3, ("none", shapes.grpo_K_at): 2}.get((kind, K), 5)
        return {"delta_bytes": mib * 2**20, "peak_bytes": 10 * 2**20, "kind": "rss", "clean_peak": True}

    monkeypatch.setattr(items, "run_probe", probe)
    s = Shapes(**{**TINY.to_json(), "grpo_K": (2, 4, 8), "grpo_K_at": 4, "grpo_T_at": 2, "max_new_tokens": 3})
    (step_row, replay_row), raw = items.bench_memory(_ctx(s))
    assert step_row.ratio == 1.5 and "locked,K=8: +5.0 MiB" in step_row.values
    rb = raw["replay_bytes_per_rollout"]
    assert rb["seed"] == 8 and rb["locked_masks_fp32"] == rb["sites"] * 16 * 4 and replay_row.ratio == rb["sites"] * 8
    S = max(_widths([r.question for r in workload.task_records(2)])) + 2 + 3
    assert rb["sequence_positions"] == S and rb["native_attention_masks_bool"] == 1 * 4 * S * (S + 1) // 2
    (step_row, _), raw = items.bench_memory(_ctx(Shapes(**{**s.to_json(), "name": "quick"})))
    assert set(raw["delta_bytes"]) == {"locked", "none"} and step_row.ratio == 1.5  # (--quick: no larger K)
    # a step without perturbation that added nothing to the level before it (the allocator reused what the warm-up
    # step freed) has no ratio, not a ZeroDivisionError that failed the item
    monkeypatch.setattr(
        items,
        "run_probe",
        lambda ctx, shapes, K, T, kind: {
            **probe(ctx, shapes, K, T, kind),
            **({"delta_bytes": 0} if kind == "none" else {}),
        },
    )
    (step_row, _), raw = items.bench_memory(_ctx(s))
    assert step_row.ratio is None and "none: +0 B" in step_row.values


def test_flops_row_is_the_updates_flops_over_the_best_matmuls(monkeypatch):
    """Item 6: achieved = the update's FLOPs (forward + backward by the formula, per micro-batch) / the median
    update time; each matmul's rate = its FLOPs x the products per call / its median; the best is the peak."""
    lm = workload.build_lm(TINY, CPU, torch.float32)
    tr = types.SimpleNamespace(lm=lm, cfg=types.SimpleNamespace(grpo=types.SimpleNamespace(micro_batch_size=3)))
    betas = []
    monkeypatch.setattr(items, "_trainer", lambda ctx, K, T, kind, beta0=None: betas.append(beta0) or tr)
    monkeypatch.setattr(items, "_step_fn", lambda tr, prompts: lambda: None)
    monkeypatch.setattr(
        items,
        "op_time_breakdown",
        lambda fn, device: {"share": dict.fromkeys(("matmul", "attention", "other"), 1 / 3), "op_time_over_wall": 0.5},
    )
    mm = {"mm a": lambda: 10, "mm b": lambda: 1}
    asked = []
    monkeypatch.setattr(
        items, "_matmul_candidates", lambda ctx, sizes: asked.append(sizes) or (mm, {"mm a": 100.0, "mm b": 1000.0})
    )
    upd = [{"time_update_s": t, "time_rollout_s": 1.0} for t in (3.0, 1.0, 1.5)]  # (median 1.5, mean 1.83)
    scripted_alternate(
        monkeypatch,
        items,
        (
            {"grpo_step": [9] * 3, "mm a": [1.0] * 3, "mm b": [0.5, 0.5, 0.6]},
            {"grpo_step": upd, "mm a": [10] * 3, "mm b": [1] * 3},
        ),
    )
    s = Shapes(**{**TINY.to_json(), "grpo_K_at": 2, "grpo_T_at": 2, "max_new_tokens": 3})
    ctx = _ctx(s)
    (row,), raw = items.bench_flops(ctx)
    P = max(_widths([r.question for r in workload.task_records(2)]))  # 2 prompts x K=2: micro-batches of 3 and 1
    d = workload.dims_of(lm)
    flops = sum(workload.recurrence_flops(d, n, P, 2, 3, backward=True)[0] for n in (3, 1))
    assert raw["update_flops"] == flops and raw["achieved_flops_per_s"] == flops / 1.5
    # the reference sizes, then the update's own largest matmul: a micro-batch's prompt pass (3 rows x P) into the MLP
    assert asked == [[*s.mm_sizes, (3 * P, s.hidden, s.ffn)]]
    assert raw["mm_flops_per_s"] == {"mm a": 1000.0, "mm b": 2000.0} and raw["peak_name"] == "mm b"
    assert ctx.results["peak_flops"] == 2000.0 and row.ratio == raw["fraction_of_peak"] == flops / 1.5 / 2000.0
    assert betas == [0.0]  # (no reference model: the update is the policy's forward and backward the count counts)


def test_matmul_candidates_count_two_flops_per_multiply_add():
    """Item 6's reference matmuls: (m x k) @ (k x n) is 2mkn FLOPs, named by its shape."""
    fns, flop_of = items._matmul_candidates(_ctx(), [(2, 3, 4)])
    assert flop_of == {"mm 2x3@3x4": 48.0} and fns["mm 2x3@3x4"]() >= 1


def test_engine_rows_are_fast_over_eager_and_the_share_of_the_same_answers(monkeypatch):
    """Item 12: rollout and step time fast / eager (step against <= 1.05 on a CPU, no goal on CUDA), the share of
    rollouts with the same answer under both engines (all of them on a CPU, 99% on CUDA)."""
    texts = {"eager": ["a", "b", "c", "d"], "fast": ["a", "x", "c", "d"]}
    calls = []

    def trainer(n):
        def collect(prompts, seeds):
            calls.append(("collect", n))
            return types.SimpleNamespace(texts=texts[n])

        return types.SimpleNamespace(_collect=collect, step=lambda prompts: calls.append(("step", n)))

    trainers = {n: trainer(n) for n in texts}
    monkeypatch.setattr(engine_item, "build_trainers", lambda ctx: trainers)
    s = Shapes(**{**TINY.to_json(), "grpo_K_at": 2})
    for device in (CPU, torch.device("cuda")):
        scripted_alternate(
            monkeypatch,
            engine_item,
            ({"eager": [2.0] * 3, "fast": [1.0, 1.0, 0.5]}, {}),
            ({"eager": [4.0] * 3, "fast": [4.1] * 3}, {}),
        )
        calls.clear()
        (roll, step, agree), raw = engine_item.bench_engine(_ctx(s, device))
        assert [c for c, _ in calls] == ["collect"] * 4 + ["step"] * 2  # (agreement, the rollout run, the step run)
        assert (roll.ratio, roll.spread, step.ratio) == (0.5, (0.25, 0.5), pytest.approx(1.025))
        assert agree.ratio == raw["answers_agree"] == 0.75 and agree.met is False
        assert (str(step.goal), str(agree.goal)) == (("<= 1.05x", ">= 1x") if device == CPU else ("None", ">= 0.99x"))


def test_engine_trainers_start_from_equal_weights_each_their_own():
    """Item 12's two trainers, one per engine, start from the same weights in two copies (one model stepped by both
    would be trained twice a round, and the engines would not be in lockstep)."""
    s = Shapes(**{**TINY.to_json(), "grpo_K_at": 2, "grpo_T_at": 2, "max_new_tokens": 3})
    trainers = engine_item.build_trainers(_ctx(s))
    eager, fast = trainers["eager"], trainers["fast"]
    assert (eager.cfg.grpo.engine, fast.cfg.grpo.engine) == ("eager", "fast") and eager.lm is not fast.lm
    pairs = zip(eager.lm.model.parameters(), fast.lm.model.parameters(), strict=True)
    assert all(a.data_ptr() != b.data_ptr() and torch.equal(a, b) for a, b in pairs)


# --------------------------------------------------------------------------- suite
def test_run_child_gives_the_childs_code_or_128_plus_its_signal():
    """The parent's exit code is the child's, 128 + N for a child ended by signal N (as a shell says it)."""
    kill = "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"
    assert launch.run_child([sys.executable, "-c", kill], {}) == 128 + signal.SIGTERM
    assert launch.run_child([sys.executable, "-c", "raise SystemExit(3)"], {}) == 3


def test_the_suite_runs_in_place_in_its_child_or_under_the_users_omp_wait_policy(monkeypatch):
    """The child (DGRPO_BENCH_CHILD set) runs the suite itself, and so does a process whose OMP_WAIT_POLICY the user
    set (kept, not replaced by PASSIVE); only a first process without it (or with it empty, OpenMP's default policy)
    starts a child (mutants: the child started one more child of its own, and so on; the user's policy overridden;
    an empty policy taken as the user's)."""
    started = []
    monkeypatch.setattr(launch, "run_child", lambda cmd, env: started.append(env["OMP_WAIT_POLICY"]) or 7)
    monkeypatch.setattr(suite, "main", lambda argv: 0)
    for policy, child, code in (("ACTIVE", None, 0), (None, "1", 0), (None, None, 7), ("", None, 7)):
        for name, value in (("OMP_WAIT_POLICY", policy), (launch.CHILD_ENV, child)):
            if value is not None:
                monkeypatch.setenv(name, value)
            else:
                monkeypatch.delenv(name, raising=False)
        assert launch.main(["--quick", "--out", "unused"]) == code, (policy, child)
    assert started == ["PASSIVE", "PASSIVE"]


def test_a_sigterm_while_the_child_starts_is_passed_on_once_it_is_known(monkeypatch):
    """``timeout`` sending SIGTERM between the handler's setting and Popen's return (no child to pass it to yet):
    the child gets it once started, and the exit code is 143 (mutant: the signal kept, the child left running)."""
    sent: list[int] = []

    class Child:
        def __init__(self, cmd, env):
            os.kill(os.getpid(), signal.SIGTERM)  # (run by run_child's handler before Popen returns)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def send_signal(self, signum):
            sent.append(signum)

        def wait(self):
            return -signal.SIGTERM if sent else 0

    monkeypatch.setattr(launch.subprocess, "Popen", Child)
    mine = signal.signal(signal.SIGTERM, lambda signum, frame: None)  # (a handler missing: not pytest's end)
    try:
        assert launch.run_child(["suite"], {}) == 128 + signal.SIGTERM and sent == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, mine)


def test_the_parent_starts_the_suites_child_before_torch_loads():
    """``python -m dgrpo.bench`` without OMP_WAIT_POLICY starts its child (PASSIVE, the same arguments) having loaded
    neither torch, transformers nor the suite (seconds the child spends again); its exit code is the child's."""
    script = (
        "import runpy, sys\n"
        "from dgrpo.bench import launch\n"
        "def child(cmd, env):\n"
        "    print([m for m in ('torch', 'transformers', 'dgrpo.bench.suite') if m in sys.modules], cmd[1:],\n"
        "          env['OMP_WAIT_POLICY'], env[launch.CHILD_ENV])\n"
        "    return 7\n"
        "launch.run_child = child\n"
        "sys.argv = ['dgrpo.bench', '--quick', '--out', 'o']\n"
        "runpy.run_module('dgrpo.bench', run_name='__main__')\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", launch.CHILD_ENV)}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert proc.returncode == 7, proc.stderr[-2000:]
    assert proc.stdout == "[] ['-m', 'dgrpo.bench', '--quick', '--out', 'o'] PASSIVE 1\n"


def test_needs_cuda_only_when_no_item_runs_on_the_cpu():
    """What runs on CUDA alone is named only when no item of the selection runs on the CPU; the GPU section runs
    every item but the CPU-only ones, plus the CUDA-only ones."""
    assert set(suite.GPU_ORDER) == (set(suite.ORDER) - set(options.CPU_ONLY)) | set(options.CUDA_ONLY)
    assert suite.needs_cuda("all", ["optimizer"]) == "--only optimizer"
    assert suite.needs_cuda("all", ["optimizer", "sft"]) == "" and suite.needs_cuda("gpu", ["sft"]) == "--section gpu"
    assert suite.selected(types.SimpleNamespace(only=None)) == suite.ITEM_KEYS and "optimizer" in suite.ITEM_KEYS


def _row(item, section="cpu", ratio=2.0):
    return Row(section, item, "k", "conf", "vals", "a / b", ratio)


def test_run_suite_reports_each_sections_rows_its_failed_items_and_a_failing_exit(tmp_path, monkeypatch):
    """Each item's rows in item-number order in its own section's table (the GPU's from the GPU shapes in bf16), each
    section's count of repetitions, an item that raised named under its section, exit 1 then; 0 when every item
    ran."""
    seen = []

    ran = []

    def item(number):
        def run(ctx):
            ran.append(number)
            seen.append((ctx.section, ctx.shapes.name, ctx.dtype))
            return [_row(f"{number}. item", ctx.section, ratio=number)], {"n": number}

        return run

    def broken(ctx):
        raise RuntimeError("it broke")

    monkeypatch.setattr(suite, "ITEMS", {"flops": item(6), "rollouts": item(1), "sft": broken})
    monkeypatch.setattr(suite.torch, "set_num_threads", lambda n: None)
    monkeypatch.setattr(suite.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(suite.torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(
        suite,
        "machine_info",
        lambda: {
            "nproc": 2,
            "cpu_model": "x",
            "torch": "t",
            "transformers": "t",
            "torch_threads": 2,
            "omp_wait_policy": "PASSIVE",
            "loadavg_start": (0.0, 0.0, 0.0),
        },
    )
    monkeypatch.setattr(suite, "log", lambda msg: None)
    monkeypatch.setattr(suite, "gc", types.SimpleNamespace(collect=lambda: 0))  # (a full collection: ~1 s here)
    args = types.SimpleNamespace(out=str(tmp_path), quick=False, only="flops,rollouts,sft", section="all")
    assert suite.run_suite(args, []) == 1
    assert seen == [("cpu", "full", torch.float32)] * 2 + [("gpu", "gpu-0.5b", torch.bfloat16)] * 2
    assert ran == [6, 1, 6, 1]  # item 6 first in each section: its matmul peak annotates item 1's rows
    table = json.loads((tmp_path / "bench.json").read_text())["table"]
    assert [(r["section"], r["item"], r["ratio"]) for r in table] == [
        ("cpu", "1. item", 1),
        ("cpu", "6. item", 6),
        ("gpu", "1. item", 1),
        ("gpu", "6. item", 6),
    ]
    md = (tmp_path / "bench.md").read_text()
    cpu, gpu = md.split("## GPU")
    assert cpu.index("| 1. item |") < cpu.index("| 6. item |") and "- **sft failed**: RuntimeError: it broke" in cpu
    assert gpu.count("| 1. item |") == 1 and "**sft failed**" in gpu and "## Notes" in gpu
    # each section says how many repetitions its medians are of (the header said the CPU's 7 for the GPU's 5 too)
    assert workload.FULL.reps != workload.GPU.reps
    assert f"a median of {workload.FULL.reps} repetitions" in cpu.split("## CPU")[1]
    assert f"a median of {workload.GPU.reps} repetitions" in gpu and f"of {workload.FULL.reps} repetitions" not in gpu
    args.only = "flops,rollouts"
    assert suite.run_suite(args, []) == 0


# --------------------------------------------------------------------------- second pass (CI): what the first left
def test_alternate_runs_every_warmup_round_untimed_before_the_timed_ones():
    """``warmup`` untimed rounds in the given order, then the timed rounds: each candidate runs warmup + reps times,
    and only the timed calls are recorded."""
    calls: list[str] = []
    t = timing.alternate({n: lambda n=n: calls.append(n) or len(calls) for n in "AB"}, reps=1, warmup=3)
    assert "".join(calls) == "AB" * 3 + "AB" and t.results == {"A": [7], "B": [8]}


def test_the_median_of_an_even_count_of_repetitions_is_the_mean_of_the_middle_two():
    assert Timed({"a": [4.0, 1.0, 3.0, 2.0]}).median("a") == 2.5


def test_units_at_their_switch_points_and_a_spread_without_a_goal():
    """One second prints as seconds; ratios from 100 on as whole numbers (not 1e+03x); a row without a goal
    still shows its paired spread."""
    assert (report.fmt_s(1.0), report.fmt_ratio(99.94), report.fmt_ratio(999.6)) == ("1.00 s", "99.9x", "1000x")
    line = report.markdown_table([Row("cpu", "3. x", "k", "c", "v", "a / b", 1.3, None, (1.2, 1.4))]).splitlines()[2]
    assert line == "| 3. x | c | v | a / b: **1.3x** (paired 1.2x to 1.4x) | - | - |"


def _fake_suite(monkeypatch, items_by_key: dict, cuda: bool = True) -> None:
    """run_suite with stand-in items, machine facts and no CUDA calls."""
    monkeypatch.setattr(suite, "ITEMS", items_by_key)
    monkeypatch.setattr(suite.torch, "set_num_threads", lambda n: None)
    monkeypatch.setattr(suite.torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(suite.torch.cuda, "empty_cache", lambda: None)
    facts = dict(nproc=2, cpu_model="x", torch="t", transformers="t", torch_threads=2, omp_wait_policy="PASSIVE")
    monkeypatch.setattr(suite, "machine_info", lambda: {**facts, "loadavg_start": (0.0, 0.0, 0.0)})
    monkeypatch.setattr(suite, "log", lambda msg: None)
    monkeypatch.setattr(suite, "gc", types.SimpleNamespace(collect=lambda: 0))


def test_run_suite_runs_the_sections_asked_for_in_their_shapes(tmp_path, monkeypatch):
    """--section cpu / gpu runs that section alone; --quick gives both sections the quick shapes (the GPU's own
    ~0.5B shapes only in the full run)."""
    seen = []

    def item(ctx):
        seen.append((ctx.section, ctx.shapes.name))
        return [_row("1. item", ctx.section)], {}

    _fake_suite(monkeypatch, {"rollouts": item})
    runs = {("cpu", False): [("cpu", "full")], ("gpu", False): [("gpu", "gpu-0.5b")]}
    runs[("all", True)] = [("cpu", "quick"), ("gpu", "quick")]
    for (section, quick), expected in runs.items():
        seen.clear()
        args = types.SimpleNamespace(out=str(tmp_path), quick=quick, only="rollouts", section=section)
        assert suite.run_suite(args, []) == 0 and seen == expected, (section, quick)


def test_run_suite_writes_each_item_as_it_ends_and_says_a_section_was_skipped(tmp_path, monkeypatch):
    """Partial outputs survive a kill: before each item runs, bench.json holds every row so far (the CPU section's
    while the GPU's runs) and the failures so far; without CUDA the report says the GPU section was skipped."""
    written = []

    def item(number):
        def run(ctx):
            data = json.loads((tmp_path / "bench.json").read_text()) if (tmp_path / "bench.json").exists() else {}
            written.append(([(r["section"], r["item"]) for r in data.get("table", [])], data.get(ctx.section, {})))
            return [_row(f"{number}. item", ctx.section)], {}

        return run

    def broken(ctx):
        raise RuntimeError("it broke")

    _fake_suite(monkeypatch, {"flops": item(6), "rollouts": item(1), "sft": broken, "grpo_scaling": item(3)})
    args = types.SimpleNamespace(out=str(tmp_path), quick=False, only="flops,rollouts,sft,grpo_scaling", section="all")
    assert suite.run_suite(args, []) == 1
    cpu, gpu = ([(section, f"{n}. item") for n in (1, 3, 6)] for section in ("cpu", "gpu"))
    assert [rows for rows, _ in written] == [[], cpu[2:], [cpu[0], cpu[2]], cpu, cpu + gpu[2:], cpu + [gpu[0], gpu[2]]]
    assert "sft" not in written[1][1] and written[2][1]["sft"] == {"error": "RuntimeError: it broke"}
    (tmp_path / "bench.json").unlink()
    _fake_suite(monkeypatch, {"flops": item(6)}, cuda=False)
    args.only = "flops"
    assert suite.run_suite(args, []) == 0
    assert "## GPU (~0.5B Qwen2, bf16)\n\nskipped: no CUDA" in (tmp_path / "bench.md").read_text()


def test_rollout_figures_take_the_widest_prompt_and_the_mean_answer_length():
    """Item 1's FLOP count uses the widest prompt of the batch (narrower ones are padded to it) and its tokens/s the
    mean answer length over the repetitions."""
    pair = [types.SimpleNamespace(question=q) for q in ("Start with 5.", "Start with 5. Add 8. Add 9. Times 7.")]
    widths = _widths([r.question for r in pair])
    assert widths[0] < widths[1]
    s = Shapes(**{**TINY.to_json(), "T": 2, "max_new_tokens": 3, "seq_per_prompt": 1})
    lm = workload.build_lm(s, CPU, torch.float32)
    names = ("batched_locked", "sequential_native", "recompute_batch1")
    t = Timed({n: [1.0, 1.0] for n in names}, {n: [2.0, 3.0] for n in names})
    r = items._rollout_figures(lm, pair, s, 2, t)
    assert r["batched_tokens_per_s"] == 4 * 2.5 / 1.0
    fl, _ = workload.recurrence_flops(workload.dims_of(lm), 4, max(widths), 2, 3, backward=False)
    assert r["batched_flops_per_s"] == fl


def test_sft_losses_must_agree_to_1e5_in_float32(monkeypatch):
    """Item 2 reports no ratio when the two losses differ by more than 1e-5 (fp32), here by 2e-5."""
    s = Shapes(**{**TINY.to_json(), "sft_batch": 2})
    scripted_alternate(
        monkeypatch, items, ({"ours": [0.6] * 3, "naive": [1.0] * 3}, {"ours": [0.5] * 3, "naive": [0.50002] * 3})
    )
    with pytest.raises(AssertionError, match="SFT losses differ"):
        items.bench_sft(_ctx(s))


def test_a_steps_phases_are_the_medians_of_their_repetitions():
    t = Timed({"a": [1.0] * 3}, {"a": [{"time_rollout_s": r, "time_update_s": u} for r, u in ((1, 5), (2, 1), (9, 3))]})
    assert items._split(t, "a") == {"rollout_s": 2, "update_s": 3}


def test_memory_takes_the_median_of_its_fresh_process_probes(monkeypatch):
    """Item 5: mem_reps fresh processes per arm; the increment and the peak are their medians (not a mean, not the
    largest); the run's peak is clean only when every probe's was."""
    deltas = {"locked": iter([3, 1, 4]), "none": iter([2, 2, 9])}
    peaks = iter([10, 30, 11] * 2)

    def probe(ctx, shapes, K, T, kind):
        return {
            "delta_bytes": next(deltas[kind]) * 2**20,
            "peak_bytes": next(peaks) * 2**20,
            "kind": "rss",
            "clean_peak": kind == "locked",
        }

    monkeypatch.setattr(items, "run_probe", probe)
    s = Shapes(**{**TINY.to_json(), "name": "quick", "mem_reps": 3, "max_new_tokens": 3})
    (step_row, _), raw = items.bench_memory(_ctx(s))
    assert {k: len(v) for k, v in raw["probes"].items()} == {"locked": 3, "none": 3}
    assert raw["delta_bytes"] == {"locked": 3 * 2**20, "none": 2 * 2**20} and step_row.ratio == 1.5
    assert raw["peak_bytes"] == {"locked": 11 * 2**20, "none": 11 * 2**20} and raw["clean_peak"] is False


def test_op_time_breakdown_sorts_matmuls_attention_and_leaves_out_ranges():
    """Item 6's profile: addmm is a matmul, CPU flash attention is attention; a profiler range (a labelled stretch of
    the step, no op) is not op time."""
    a = torch.randn(64, 64)
    assert items.op_time_breakdown(lambda: torch.addmm(a, a, a), CPU)["share"]["matmul"] > 0.5
    q = torch.randn(1, 2, 64, 16)
    sdpa = items.op_time_breakdown(lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q), CPU)
    assert sdpa["share"]["attention"] > 0.5

    def ranged():
        with torch.profiler.record_function("a labelled stretch"):
            torch.mm(a, a)

    assert all(name.startswith("aten::") for name, _, _ in items.op_time_breakdown(ranged, CPU)["top_ops"])


def test_a_reference_matmul_repeats_its_product_to_fill_its_target_time():
    """A 2x2 product takes microseconds: one call of the candidate repeats it many times (and says how many)."""
    f, iters = items._mm_fn(2, 2, 2, CPU, torch.float32, target_s=0.01)
    assert iters > 10 and f() == iters


def test_timed_grpo_config_takes_the_shapes_prompts_and_two_threads():
    cfg = workload.grpo_config(Shapes(**{**TINY.to_json(), "prompts": 3}), 4, 3)
    assert (cfg.grpo.prompts_per_step, cfg.threads, cfg.perturbation.kind) == (3, 2, "locked")


def test_engine_rollouts_have_seeds_of_their_own_under_locked_masks(monkeypatch):
    """Item 12: both engines run under locked masks (what the recipe runs), every rollout on its own seed."""
    s = Shapes(**{**TINY.to_json(), "grpo_K_at": 2, "grpo_T_at": 2, "max_new_tokens": 3})
    assert {tr.cfg.perturbation.kind for tr in engine_item.build_trainers(_ctx(s)).values()} == {"locked"}
    seen = []

    def trainer():
        def collect(prompts, seeds):
            seen.append(seeds.tolist())
            return types.SimpleNamespace(texts=["a"] * len(seeds))

        return types.SimpleNamespace(_collect=collect, step=lambda prompts: None)

    monkeypatch.setattr(engine_item, "build_trainers", lambda ctx: {"eager": trainer(), "fast": trainer()})
    scripted_alternate(
        monkeypatch, engine_item, ({"eager": [1.0], "fast": [1.0]}, {}), ({"eager": [1.0], "fast": [1.0]}, {})
    )
    engine_item.bench_engine(_ctx(s))
    assert len(seen[0]) == s.prompts * 2 and len(set(seen[0])) == len(seen[0]) and seen[0] == seen[1]


def test_a_labelled_range_is_no_host_call_of_its_own_and_only_the_steps_thread_is_read(monkeypatch):
    """device_activity's host calls leave out the labelled ranges (their time is by_range's), and by_range reads the
    ranges of the thread that ran the step alone (another thread's range at the same time is not the step's)."""
    events = [
        _event(step_profile._STEP_RANGE, "cpu", 0, 10_000, own=10.0),
        _event("lab", "cpu", 0, 4_000, own=4_000.0),
        _event("other thread", "cpu", 0, 10_000, own=1.0, thread=2),
    ]
    _profiled(monkeypatch, events)  # (a step of 10 ms)
    out = step_profile.device_activity(lambda: None, CPU, labels={"lab", "other thread"})
    assert [r[0] for r in out["host_top"]] == [step_profile._STEP_RANGE]
    assert {r[0]: r[1] for r in out["by_range"]} == {"lab": 4.0, timeline.UNLABELLED: 6.0}


def test_counted_ops_count_an_in_place_op_it_writes_through_an_alias_but_runs_a_kernel():
    """add_ returns its (written) input: unlike a view, it launches a kernel, and counts."""
    x = torch.ones(2, 3)
    assert step_profile.counted_ops(lambda: x.clone().add_(1))[1] == 2


def test_the_profiler_leaves_out_kinetos_trace_marks_and_keeps_every_other_line(capfd):
    """A profiled step prints no ``USDT:... profiler_start`` line (torch's profiler writes one at every start and
    stop, whatever its log level); other writes to stderr in those moments, C++'s included, still come out."""
    from torch.profiler import ProfilerActivity

    from dgrpo.bench.step_profile import _kineto_marks_dropped, quiet_profile

    with quiet_profile([ProfilerActivity.CPU]) as prof:
        torch.ones(2).add_(1)
    assert any(e.name == "aten::add_" for e in prof.events())
    with _kineto_marks_dropped():
        os.write(2, b"USDT:2026-12-06 22:37:54 5869:5869 SyncActivityProfilerHandler.cpp:52] profiler_start\n")
        os.write(2, b"STAGE:2026-12-06 22:37:44 5863:5863 SyncActivityProfilerHandler.cpp:51] Completed Stage\n")
        os.write(2, b"W1206 a CUPTI warning\n")
        print("a Python line", file=sys.stderr)
    assert sorted(capfd.readouterr().err.splitlines()) == ["W1206 a CUPTI warning", "a Python line"]
