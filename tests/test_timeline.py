"""dgrpo.bench.timeline: label paths over time, the device's idle gaps and whom they go to, on hand-made timelines;
labelled calls under the profiler; and the profile's device events without the host ranges' device-side images."""

import types

import pytest
import torch

from dgrpo.bench import step_profile, timeline
from dgrpo.bench.timeline import UNLABELLED, idle_gaps, label_timeline, labelled_calls, path_at, time_by_range


def test_label_timeline_gives_the_innermost_path_at_every_moment():
    # update [0, 100) holds replay [10, 60) which holds latent [20, 30) and answer [30, 50); then backward [60, 90)
    ranges = [(60, 90, "backward"), (0, 100, "update"), (20, 30, "latent"), (10, 60, "replay"), (30, 50, "answer")]
    tl = label_timeline(ranges)
    expect = {
        5: "update",
        10: "update > replay",
        25: "update > replay > latent",
        30: "update > replay > answer",  # (latent ends where answer starts)
        55: "update > replay",
        60: "update > backward",
        95: "update",
        100: "",
        -1: "",
    }
    assert {t: path_at(tl, t) for t in expect} == expect


def test_label_timeline_cuts_a_range_that_outlasts_its_parent():
    ranges = [(0, 10, "a"), (5, 15, "b"), (20, 30, "c")]
    tl = label_timeline(ranges)
    assert [path_at(tl, t) for t in (7, 12, 25)] == ["a > b", "", "c"]
    # every moment goes to one path: b's 10-15 to none (uncut, b had 10 and the unlabelled time 5 of 30 ms)
    in_ms = [(start * 1e3, end * 1e3, label) for start, end, label in ranges]
    host = {row[0]: row[1] for row in time_by_range((0, 30e3), in_ms)}
    assert host == {"a": 5.0, "a > b": 5.0, UNLABELLED: 10.0, "c": 10.0}


def test_idle_gaps_name_the_kernel_that_ends_each_gap():
    # (unsorted, overlapping, one before the window and one across its end)
    kernels = [(30, 40), (10, 20), (15, 25), (-5, 2), (90, 120)]
    assert idle_gaps(kernels, (0, 100)) == [(2, 10, 1), (25, 30, 0), (40, 90, 4)]
    assert idle_gaps(kernels[:3], (0, 50)) == [(0, 10, 1), (25, 30, 0), (40, 50, -1)]
    assert idle_gaps([], (0, 5)) == [(0, 5, -1)]
    # a kernel inside a longer one leaves no gap; one that starts at the window's end ends none of its gaps
    assert idle_gaps([(0, 10), (2, 3), (5, 20), (30, 40)], (0, 30)) == [(20, 30, -1)]


def test_time_by_range_gives_each_path_its_host_time_and_the_idle_time_its_launches_ended():
    ms = 1000.0  # microseconds, as the profiler's
    ranges = [(0, 100 * ms, "update"), (10 * ms, 40 * ms, "latent"), (60 * ms, 90 * ms, "backward")]
    # kernels: 0-5 ms, 20-30 ms (launched at 15 ms, inside latent), 50-70 ms (launched at 45 ms, in update alone),
    # 80-95 ms (its launch unknown: counted from its start, inside backward); the window is the step, 0-110 ms
    kernels = [(0, 5 * ms), (20 * ms, 30 * ms), (50 * ms, 70 * ms), (80 * ms, 95 * ms)]
    launches = [None, 15 * ms, 45 * ms, None]
    rows = time_by_range((0, 110 * ms), ranges, kernels, launches)
    # gaps: 5-20 (15 ms, to latent), 30-50 (20 ms, to update), 70-80 (10 ms, to backward), 95-110 (15 ms, no kernel
    # ends it: the path at its middle, 102.5 ms, is outside every range); kernel time: 0-5 ms to update (from its
    # start, 0 ms), 20-30 to latent, 50-70 to update, 80-95 to backward
    assert rows == [
        ["update", 40.0, 20.0, 1, 25.0, 2],
        ["update > latent", 30.0, 15.0, 1, 10.0, 1],
        [UNLABELLED, 10.0, 15.0, 1, 0.0, 0],
        ["update > backward", 30.0, 10.0, 1, 15.0, 1],
    ]  # (latent before the unlabelled time: the same idle time, more host time)
    # a kernel that runs past the window's end counts only inside it
    clipped = time_by_range((0, 90 * ms), ranges, kernels, launches)
    assert [row[0::4] for row in clipped if row[0] == "update > backward"] == [["update > backward", 10.0]]


def test_time_by_range_ranks_by_idle_then_host_time_and_without_kernels_gives_host_times():
    ms = 1000.0
    ranges = [(0, 10 * ms, "a"), (10 * ms, 40 * ms, "b"), (40 * ms, 45 * ms, "c")]
    # the device waits from 10 ms to 42 ms for a kernel launched at 41 ms, inside c
    rows = time_by_range((0, 50 * ms), ranges, [(0, 10 * ms), (42 * ms, 50 * ms)], [None, 41 * ms])
    assert rows == [
        ["c", 5.0, 32.0, 1, 8.0, 1],
        ["b", 30.0, 0.0, 0, 0.0, 0],
        ["a", 10.0, 0.0, 0, 10.0, 1],
        [UNLABELLED, 5.0, 0.0, 0, 0.0, 0],
    ]
    assert time_by_range((0, 50 * ms), ranges, top=2) == [["b", 30.0, 0.0, 0, 0.0, 0], ["a", 10.0, 0.0, 0, 0.0, 0]]


def test_time_by_range_counts_the_kernels_inside_the_window_by_their_launch_the_last_one_too():
    ms = 1000.0
    ranges = [(0, 30 * ms, "a"), (12 * ms, 18 * ms, "b")]
    # window 10-20 ms: one kernel ends at its start and one starts at its end (neither ran in it: no launch counted);
    # the last kernel, 11-19 ms, was launched at 13 ms, inside b (from its start it would be a's)
    kernels = [(5 * ms, 10 * ms), (20 * ms, 25 * ms), (11 * ms, 19 * ms)]
    rows = time_by_range((10 * ms, 20 * ms), ranges, kernels, [None, None, 13 * ms])
    # gaps: 10-11 ms (ended by the last kernel: b's), 19-20 ms (none ends it: a's, the path at 19.5 ms)
    assert rows == [["a > b", 6.0, 1.0, 1, 8.0, 1], ["a", 4.0, 1.0, 1, 0.0, 0]]


class _Thing:
    def double(self, x):
        return 2 * x

    @staticmethod
    def fixed():
        return 1


def test_labelled_calls_range_each_call_and_give_every_attribute_back():
    module = types.ModuleType("m")
    module.square = lambda x: x * x
    thing, other = _Thing(), _Thing()
    own_square, own_double = module.square, _Thing.__dict__["double"]
    targets = [
        (module, "square", "square"),
        (_Thing, "double", lambda self, x: f"double {x}"),
        (thing, "double", "this thing's double"),
    ]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with labelled_calls(targets) as names:
            assert (module.square(3), thing.double(2), other.double(5)) == (9, 4, 10)
    assert names == {"square", "double 2", "double 5", "this thing's double"}
    ranges = [e.name for e in prof.events() if e.name in names]
    assert sorted(ranges) == ["double 2", "double 5", "square", "this thing's double"]
    assert module.square is own_square and _Thing.__dict__["double"] is own_double and "double" not in vars(thing)
    with pytest.raises(TypeError, match="staticmethod"), labelled_calls([(_Thing, "fixed", "fixed")]):
        pass
    assert _Thing.fixed() == 1


def test_device_events_leave_out_the_ranges_device_side_images():
    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU
    events = [
        types.SimpleNamespace(name="gemm", device_type=cuda, is_user_annotation=False),
        types.SimpleNamespace(name="update", device_type=cuda, is_user_annotation=True),  # a whole phase, no work
        types.SimpleNamespace(name="aten::mm", device_type=cpu, is_user_annotation=False),
    ]
    assert [e.name for e in step_profile.device_kernels(events)] == ["gemm"]


def test_a_phases_kernels_are_those_it_launched_ranked_by_device_time():
    k = [types.SimpleNamespace(name=n, device_time=us) for n, us in [("gemm", 50.0), ("mul", 5.0), ("gemm", 30.0)]]
    # launched at 10, 25 and 41 us: the phase ran 0-20 and 40-60 on the host, whenever the device ran them
    mine = step_profile.launched_within(k, [10.0, 25.0, 41.0], [(0.0, 20.0), (40.0, 60.0)])
    assert [e.device_time for e in mine] == [50.0, 30.0]
    assert step_profile.top_kernels(k, 5) == [["gemm", 2, 0.1], ["mul", 1, 0.0]]
    assert step_profile.top_kernels([types.SimpleNamespace(name="x" * 200, device_time=1e3)], 1, width=8) == [
        ["x" * 8, 1, 1.0]
    ]


@pytest.mark.slow
def test_device_activity_on_a_cpu_gives_each_labelled_path_its_host_time():
    module = types.ModuleType("m")
    module.work = lambda n: torch.randn(n, n) @ torch.randn(n, n)
    module.step = lambda: [module.work(256) for _ in range(20)]
    with labelled_calls([(module, "step", "step"), (module, "work", "work")]) as labels:
        out = step_profile.device_activity(lambda: module.step(), torch.device("cpu"), labels=labels)
    rows = {path: (host, idle, gaps) for path, host, idle, gaps, _, _ in out["by_range"]}
    assert {"step", "step > work"} <= set(rows) and all(idle == 0 and gaps == 0 for _, idle, gaps in rows.values())
    # every moment of the step's window goes to one path: the paths' host times add up to about the step's wall
    wall_ms = out["profiled_wall_s"] * 1e3
    assert 0.5 * wall_ms <= sum(host for host, _, _ in rows.values()) <= wall_ms + 0.5
    assert out["kernels"] == 0 and "launch_matched_share" not in out


def test_device_activity_on_a_cpu_gives_each_phase_its_wall_time_and_no_kernels():
    def step():
        with torch.profiler.record_function("phase"):
            torch.randn(256, 256) @ torch.randn(256, 256)

    out = step_profile.device_activity(step, torch.device("cpu"), phases=("phase", "absent"))
    phase, absent = out["phases"]["phase"], out["phases"]["absent"]
    assert 0 < phase["wall_s"] <= out["profiled_wall_s"] and phase["busy_share"] == 0
    assert phase["kernels"] == 0 and phase["device_top"] == []  # (a CPU runs no kernels)
    assert absent["wall_s"] == 0 and absent["kernels"] == 0


def test_the_paper_step_labels_name_methods_that_exist():
    """bench/paper_step.step_labels: every (owner, attribute) it wraps is there (a rename would fail the profile)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "bench/paper_step.py"
    spec = importlib.util.spec_from_file_location("paper_step", path)
    paper_step = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(paper_step)
    tr = types.SimpleNamespace(perturbation=types.SimpleNamespace(bind=None), opt=types.SimpleNamespace(step=None))
    for name in paper_step.PHASES.values():
        setattr(tr, name, None)
    for owner, attr, _ in paper_step.step_labels(tr):
        assert hasattr(owner, attr), (owner, attr)
    assert timeline.UNLABELLED


def test_kernels_launch_times_come_from_their_launch_call_or_their_op():
    def ev(name, id, start, linked=0):
        return types.SimpleNamespace(
            name=name, id=id, linked_correlation_id=linked, time_range=types.SimpleNamespace(start=start)
        )

    host = [
        ev("cudaLaunchKernel", 7, 100.0, linked=3),
        ev("cudaGraphLaunch", 8, 200.0),
        ev("cudaLaunchKernel", 9, 150.0, linked=4),
        ev("cudaLaunchKernel", 10, 140.0, linked=4),
        ev("aten::mm", 7, 90.0),  # (a host op: not a launch call, whatever its id)
    ]
    kernels = [
        ev("gemm", 7, 120.0, linked=3),  # its own launch call
        ev("graph kernel a", 8, 210.0),  # replayed from a graph: the graph's launch
        ev("graph kernel b", 8, 230.0),
        ev("copy", 99, 160.0, linked=4),  # no launch call with its id: its op's first launch, at 140
        ev("lost", 98, 300.0),
    ]
    assert step_profile.launch_times(host, kernels) == [100.0, 200.0, 200.0, 140.0, None]
