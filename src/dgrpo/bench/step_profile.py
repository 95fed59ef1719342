"""What one training step does with the device: kernels launched, how busy they keep it, FLOP/s by the counting rule,
host synchronisations by call site, allocator retries (``bench/paper_step.py --profile``, CUDA); and, on any device,
the ops that would make the host wait for a GPU, by call site (:func:`waiting_ops`), and the ops that reach a kernel
(:func:`counted_ops`: on a CPU, about the launches the same step would make on a GPU with the same eager layers).

The counting rule (bench/RESULTS.md): 2 x (non-embedding parameters + LM head) FLOPs per token per forward pass, and
a GRPO step makes five passes over every rollout token: the rollout, the policy's forward and its backward (counted
twice) in the update, and the reference's forward. The matmul peak it is set against is measured in the same process.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import re
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode

from ..model.latent_lm import LatentLM
from . import timeline

#: forward-pass equivalents per rollout token in one GRPO step: rollout + policy forward + backward (2) + reference
GRPO_PASSES = 5
#: host calls that start work on the GPU: a kernel, or a whole captured graph
LAUNCH_CALLS = ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchCooperativeKernel")
GRAPH_LAUNCH = "cudaGraphLaunch"
#: the trace marks Kineto (torch's profiler) writes to stderr at every start and stop, whatever its log level
_KINETO_MARK = re.compile(r"(USDT|STAGE):\S+ \S+ \S+ \S+\] ")


@contextlib.contextmanager
def _kineto_marks_dropped() -> Iterator[None]:
    """The block's writes to file descriptor 2 (C++'s too) held back, then written to stderr less Kineto's trace
    marks (``USDT:... profiler_start``): they ran into a bench's output at every profiled item."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            lines = held.read().decode(errors="replace").splitlines(keepends=True)
            sys.stderr.write("".join(line for line in lines if not _KINETO_MARK.match(line)))
            sys.stderr.flush()


@contextlib.contextmanager
def quiet_profile(activities: Sequence[ProfilerActivity]) -> Iterator[profile]:
    """``torch.profiler.profile(activities=...)`` without the trace marks its start and stop print; what else they
    print (a CUPTI warning) still reaches stderr. The profiled block's own output is not held back."""
    prof = profile(activities=list(activities))
    with _kineto_marks_dropped():
        prof.__enter__()
    try:
        yield prof
    finally:
        with _kineto_marks_dropped():
            prof.__exit__(None, None, None)


def matmul_params(lm: LatentLM) -> int:
    """Parameters that take part in a matmul per token: all but the input embedding, plus the LM head (tied or not)."""
    model: Any = lm.model
    n = sum(p.numel() for p in model.parameters())
    emb = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    tied = head is not None and head.weight.data_ptr() == emb.data_ptr()
    return n - emb.numel() + (emb.numel() if tied else 0)


def grpo_step_flops(lm: LatentLM, rows: int, tokens_per_row: int) -> float:
    """FLOPs of one GRPO step on ``rows`` rollouts of ``tokens_per_row`` tokens (prompt + latents + answer)."""
    return 2.0 * matmul_params(lm) * rows * tokens_per_row * GRPO_PASSES


def matmul_peak(device: torch.device, dtype: torch.dtype, n: int = 8192, reps: int = 10) -> float:
    """FLOP/s of an n x n x n matmul in ``dtype`` on ``device``, measured now (3 warm-ups, ``reps`` timed)."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn_like(a)
    for _ in range(3):
        a @ b
    _sync(device)
    t = time.perf_counter()
    for _ in range(reps):
        a @ b
    _sync(device)
    return reps * 2 * n**3 / (time.perf_counter() - t)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_activity(
    step: Callable[[], Any],
    device: torch.device,
    phases: Sequence[str] = (),
    labels: Collection[str] = (),
    trace: str = "",
    top: int = 12,
) -> dict:
    """One ``step()`` under the profiler: its wall time, the device kernels it ran and their summed time (the
    kernel-busy share of the wall, as the issue's profiling tool counts it; ``gpu_busy_union_share``: the share of
    the step some kernel ran, overlapping kernels counted once), and the host's launch calls (kernels and graph
    replays); per phase (a ``torch.profiler.record_function`` range the step opens, named in ``phases``) its wall
    time, kernel-busy share, how many kernels it launched (a replayed graph's included) and the costliest of them;
    per path of the labelled ranges the step opens (names in ``labels``, read after the step: e.g. the set
    :func:`~dgrpo.bench.timeline.labelled_calls` fills) its own host time, the device idle time it caused and its
    kernels' time (:func:`~dgrpo.bench.timeline.time_by_range`); the ``top`` host calls by their own time (CUDA
    runtime calls among them: mallocs, syncs, graph instantiation) and the ``top`` kernels by device time. On a CPU:
    no kernels, the host times only. ``trace``: write the step's Chrome trace there too (``.gz``: compressed)."""
    _sync(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with quiet_profile(activities) as prof:
        t = time.perf_counter()
        with torch.profiler.record_function(_STEP_RANGE):
            step()
        _sync(device)
        wall = time.perf_counter() - t
    if trace:
        prof.export_chrome_trace(trace)
    events = prof.events()
    kernels = device_kernels(events)
    host = [e for e in events if e.device_type == torch.autograd.DeviceType.CPU]
    busy = sum(e.device_time for e in kernels) / 1e6
    names = collections.Counter(e.name for e in host)
    spans = [(e.time_range.start, e.time_range.end) for e in kernels]
    out: dict[str, Any] = {
        "profiled_wall_s": round(wall, 3),
        "kernels": len(kernels),
        "kernel_launches": sum(names[n] for n in LAUNCH_CALLS),
        "graph_launches": names[GRAPH_LAUNCH],
        "gpu_busy_s": round(busy, 3),
        "gpu_busy_share": round(busy / wall, 3),
    }
    step_window = [(e.time_range.start, e.time_range.end) for e in host if e.name == _STEP_RANGE]
    if kernels and step_window:  # (kernels overlapping on several streams: the sum above counts them twice)
        out["gpu_busy_union_share"] = phase_activity(step_window, spans)["busy_share"]
    launches = launch_times(host, kernels)
    launched = [t if t is not None else e.time_range.start for t, e in zip(launches, kernels)]
    if phases:
        out["phases"] = {}
        for name in phases:
            windows = [(e.time_range.start, e.time_range.end) for e in host if e.name == name]
            ours = launched_within(kernels, launched, windows)
            top_ours = top_kernels(ours, top // 2)
            out["phases"][name] = {**phase_activity(windows, spans), "kernels": len(ours), "device_top": top_ours}
    if labels:
        out.update(_by_range(host, spans, launches, set(labels) | set(phases)))
    own = [(e.name, e.self_cpu_time_total) for e in host if e.name not in phases and e.name not in labels]
    out["host_top"] = top_host_calls(own, top)
    if kernels:
        out["device_top"] = top_kernels(kernels, top)
    return out


def launched_within(kernels: Sequence[Any], launched: Sequence[float], windows: Sequence[tuple[float, float]]) -> list:
    """The ``kernels`` whose launch (``launched[i]``, host microseconds) falls in one of ``windows`` ([start, end)):
    a phase's own kernels, wherever the device ran them."""
    return [k for k, t in zip(kernels, launched) if any(a <= t < b for a, b in windows)]


def top_kernels(kernels: Sequence[Any], top: int, width: int = 160) -> list[list]:
    """The ``top`` device kernels by summed device time, as [name (its first ``width`` characters), runs,
    milliseconds]: what the busy time is made of (matmuls, attention, element-wise ops, copies)."""
    return top_host_calls([(e.name[:width], e.device_time) for e in kernels], top)


#: the profiler range around the profiled step (its window, and the thread that ran it)
_STEP_RANGE = "dgrpo: profiled step"


def device_kernels(events: Sequence[Any]) -> list[Any]:
    """The events of work on a CUDA device: kernels, copies, fills; not the device-side images of the host's
    ``record_function`` ranges (user annotations), which span whole phases and are no work."""
    cuda = torch.autograd.DeviceType.CUDA
    return [e for e in events if e.device_type == cuda and not e.is_user_annotation]


def launch_times(host: Sequence[Any], kernels: Sequence[Any]) -> list[float | None]:
    """When the host launched each of ``kernels``: the start of the launch call (a kernel launch, or the graph launch
    a captured kernel replayed in) with the kernel's correlation id; else of the first launch call of the op that
    launched it (the profiler's linked id); None when neither is known."""
    calls = [e for e in host if e.name in LAUNCH_CALLS or e.name == GRAPH_LAUNCH]
    by_id = {e.id: e.time_range.start for e in calls}
    by_op: dict[int, float] = {}
    for e in sorted(calls, key=lambda e: e.time_range.start):
        if getattr(e, "linked_correlation_id", 0) > 0:
            by_op.setdefault(e.linked_correlation_id, e.time_range.start)
    return [by_id.get(e.id, by_op.get(getattr(e, "linked_correlation_id", 0))) for e in kernels]


def _by_range(
    host: Sequence[Any], spans: Sequence[tuple[float, float]], launches: Sequence[float | None], labels: set[str]
) -> dict:
    """:func:`~dgrpo.bench.timeline.time_by_range` of the profiled step: the labelled ranges of the thread that ran
    it, the kernels' ``spans`` and their ``launches`` (:func:`launch_times`)."""
    step = next(e for e in host if e.name == _STEP_RANGE)
    window = (step.time_range.start, step.time_range.end)
    ours = [e for e in host if e.thread == step.thread and e.name in labels]
    ranges = [(e.time_range.start, e.time_range.end, e.name) for e in ours]
    out: dict[str, Any] = {"by_range": timeline.time_by_range(window, ranges, spans, launches)}
    if launches:  # how many kernels were matched to their launch (the others count from their start)
        out["launch_matched_share"] = round(sum(t is not None for t in launches) / len(launches), 3)
    return out


def phase_activity(windows: Sequence[tuple[float, float]], kernels: Sequence[tuple[float, float]]) -> dict:
    """A phase's wall time (its ``windows``, [start, end) in microseconds) and the share of it some kernel ran: the
    union of the kernels' spans (also in microseconds) clipped to the windows, so overlapping kernels count once.
    Overlapping windows (a range opened inside one of its own name) count once too."""
    windows = merged_windows(windows)
    wall = sum(end - start for start, end in windows)
    idle = sum(b - a for window in windows for a, b, _ in timeline.idle_gaps(kernels, window))
    busy = wall - idle
    return {
        "wall_s": round(wall / 1e6, 3),
        "busy_s": round(busy / 1e6, 3),
        "busy_share": round(busy / wall, 3) if wall else 0.0,
    }


def merged_windows(windows: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """``windows`` ([start, end)) in order, those that overlap or touch merged into one."""
    out: list[tuple[float, float]] = []
    for start, end in sorted(windows):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def top_host_calls(own_times: Sequence[tuple[str, float]], top: int) -> list[list]:
    """The ``top`` names by summed own time (microseconds), as [name, calls, milliseconds], most first (host calls'
    own times, or kernels' device times)."""
    total: dict[str, float] = collections.defaultdict(float)
    calls: collections.Counter[str] = collections.Counter()
    for name, us in own_times:
        total[name] += us
        calls[name] += 1
    ranked = sorted(total.items(), key=lambda item: -item[1])[:top]
    return [[name, calls[name], round(us / 1e3, 1)] for name, us in ranked]


def host_syncs(step: Callable[[], Any], top: int = 8) -> dict:
    """One ``step()`` under ``torch.cuda`` sync-debug mode: how many calls made the host wait for the device, and the
    ``top`` call sites (innermost frames of this library, transformers, torch.nn / optim, Liger or bitsandbytes)."""
    sites: collections.Counter[str] = collections.Counter()

    def record(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        sites[_call_site() or f"{filename}:{lineno}"] += 1

    with warnings.catch_warnings():  # (restores warnings.showwarning on leaving)
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
            torch.cuda.synchronize()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return {"host_syncs": sum(sites.values()), "host_sync_sites": dict(sites.most_common(top))}


#: ops that make the host wait for a GPU: a value read back (``item``, ``bool``, ``int``), a result whose size depends
#: on the data (``nonzero``, boolean indexing, ``masked_select``, ``unique``, ``repeat_interleave`` without its size)
_WAITING_OPS = {
    torch.ops.aten._local_scalar_dense.default,
    torch.ops.aten.is_nonzero.default,
    torch.ops.aten.equal.default,
    torch.ops.aten.nonzero.default,
    torch.ops.aten.masked_select.default,
    torch.ops.aten.repeat_interleave.Tensor,
    torch.ops.aten._unique2.default,
    torch.ops.aten.unique_consecutive.default,
    torch.ops.aten.unique_dim.default,
}
_INDEXING_OPS = {torch.ops.aten.index.Tensor, torch.ops.aten.index_put.default, torch.ops.aten.index_put_.default}


class _WaitingOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.sites: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        waits = func in _WAITING_OPS
        if func in _INDEXING_OPS:  # indexing waits when an index is boolean (it runs nonzero first)
            waits = any(i is not None and i.dtype == torch.bool for i in args[1])
        if waits:
            self.sites[f"{func.__name__} at {_call_site()}"] += 1
        return func(*args, **(kwargs or {}))


def waiting_ops(fn: Callable[[], Any], top: int = 8) -> dict:
    """``fn()`` with every op recorded that would make the host wait for the device were its tensors on a GPU, by
    call site; runs on any device, CPU included (a dispatch mode sees each op; the copies to the host that reach no
    op there, ``.tolist()``, ``.numpy()``, ``.cpu()``, are counted at the methods). It cannot tell a host tensor from
    a device one on the CPU (there, ops on and copies of tensors that stay on the host on a GPU count too): scope it
    to work on device tensors."""
    mode = _WaitingOps()
    with mode, _host_copies_counted(mode.sites):
        fn()
    return {"waiting_ops": sum(mode.sites.values()), "waiting_op_sites": dict(mode.sites.most_common(top))}


#: tensor methods that copy to the host (on a GPU, after waiting for the device) without an op a dispatch mode sees
_HOST_COPIES = ("tolist", "numpy", "cpu")


def _host_copies_counted(sites: collections.Counter[str]) -> contextlib.AbstractContextManager[None]:
    """Within the block, every call of a :data:`_HOST_COPIES` method is counted in ``sites`` by its call site."""

    def counting(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def wrap(method: Callable[..., Any]) -> Callable[..., Any]:
            def call(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
                sites[f"{name} at {_call_site()}"] += 1
                return method(self, *args, **kwargs)

            return call

        return wrap

    return timeline.wrapped_calls([(torch.Tensor, name, counting(name)) for name in _HOST_COPIES])


class _KernelOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if not _aliases(func):
            self.n += 1
        return func(*args, **(kwargs or {}))


@functools.cache
def _aliases(func: Any) -> bool:
    """Whether ``func`` returns a view of an input (a view, reshape or transpose: metadata, no kernel)."""
    return any(r.alias_info is not None and not r.alias_info.is_write for r in func._schema.returns)


def counted_ops(fn: Callable[[], Any]) -> tuple[Any, int]:
    """(``fn()``, how many ops it dispatched that run a kernel: every op but those returning a view). On any device,
    the autograd engine's backward ops included. An eager op is about one kernel launch on a GPU (a value read back
    launches nothing; fused layers and compiled graphs launch fewer: count those on the GPU)."""
    mode = _KernelOps()
    with mode:
        out = fn()
    return out, mode.n


#: the frames a call site is told by: this library and the libraries it drives
_SITE_FILES = ("dgrpo", "transformers", "liger_kernel", "torch/nn", "torch/optim", "torch/utils", "bitsandbytes")


def _call_site(depth: int = 3) -> str:
    """The innermost ``depth`` frames of this library and the ones it drives, innermost first."""
    frames = [f for f in traceback.extract_stack()[:-2] if any(k in f.filename for k in _SITE_FILES)]
    frames = [f for f in frames if "step_profile" not in f.filename]
    return " < ".join(f"{_short(f.filename)}:{f.lineno}" for f in frames[-depth:][::-1])


def _short(path: str) -> str:
    for mark in ("site-packages/", "src/"):
        if mark in path:
            return path.split(mark)[-1]
    return path


def allocator_retries() -> int:
    """The CUDA caching allocator's retries so far (each frees cached blocks and synchronises): 0 without CUDA."""
    return int(torch.cuda.memory_stats().get("num_alloc_retries", 0)) if torch.cuda.is_available() else 0
