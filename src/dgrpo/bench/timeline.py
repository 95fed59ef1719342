"""Where a profiled step's time goes, by labelled host code: what the host was running, and what the device waited for.

* :func:`labelled_calls` runs chosen functions (a module's, a class's or an object's) inside profiler ranges named
  by a label, for the length of a ``with`` block (:func:`wrapped_calls`: any wrapper, e.g. an op counter);
* :func:`label_timeline` turns one thread's nested ranges into the label path in force at every moment
  (``"update > reference > latent forward"``);
* :func:`idle_gaps` finds the intervals in which no kernel ran;
* :func:`time_by_range` gives each label path its own host time (the moments it was the innermost range), the
  device idle time it caused (each gap goes to the path in force when the host launched the kernel that ended it)
  and the device time of the kernels it launched. A gap before a kernel is the device waiting for the host to get
  to that launch, so a path with much idle time is a host-bound stretch (small kernels, Python, a capture) or comes
  right after a synchronisation; a path with much kernel time is where fewer or faster kernels would pay.

Times are the profiler's microseconds throughout. Pure functions, tested on hand-made timelines
(tests/test_timeline.py).
"""

from __future__ import annotations

import bisect
import collections
import functools
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

#: a label: a fixed name, or a function of the call's arguments that returns one
Label = str | Callable[..., str]
#: the path of time outside every labelled range
UNLABELLED = "(outside the labelled calls)"
_MISSING = object()


@contextmanager
def wrapped_calls(
    targets: Sequence[tuple[Any, str, Callable[[Callable[..., Any]], Callable[..., Any]]]],
) -> Iterator[None]:
    """Within the block, each ``(owner, attribute, wrap)``: ``owner.attribute`` (a module's function, a class's method
    or an object's) is ``wrap(original)``; on leaving, the owners have their own attributes back (an object's
    class method shows through again)."""
    saved: list[tuple[Any, str, Any]] = []
    try:
        for owner, attr, wrap in targets:
            own = vars(owner).get(attr, _MISSING)
            if isinstance(own, (staticmethod, classmethod)):
                raise TypeError(f"{owner!r}.{attr}: wrap a plain function or method, not a {type(own).__name__}")
            saved.append((owner, attr, own))
            setattr(owner, attr, wrap(getattr(owner, attr)))
        yield
    finally:
        for owner, attr, own in reversed(saved):
            if own is _MISSING:
                delattr(owner, attr)
            else:
                setattr(owner, attr, own)


@contextmanager
def labelled_calls(targets: Sequence[tuple[Any, str, Label]]) -> Iterator[set[str]]:
    """Within the block, each ``(owner, attribute, label)``: ``owner.attribute(...)`` runs inside a
    ``torch.profiler.record_function`` range named by ``label`` (:func:`wrapped_calls`). Yields the set of names the
    block's calls used (filled as they run)."""
    names: set[str] = set()
    with wrapped_calls(
        [(owner, attr, functools.partial(_ranged, label=label, names=names)) for owner, attr, label in targets]
    ):
        yield names


def _ranged(fn: Callable[..., Any], *, label: Label, names: set[str]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        name = label if isinstance(label, str) else label(*args, **kwargs)
        names.add(name)
        with torch.profiler.record_function(name):
            return fn(*args, **kwargs)

    return run


def label_timeline(ranges: Sequence[tuple[float, float, str]]) -> tuple[list[float], list[str]]:
    """One thread's ranges ``(start, end, label)`` -> change points ``(times, paths)``: from ``times[i]`` on (until
    the next point) the innermost ranges in force are ``paths[i]``, their labels joined by ``" > "`` ("" outside
    all). A range that outlasts its enclosing one (not one thread's nesting) is cut at its end."""
    times: list[float] = []
    paths: list[str] = []
    stack: list[tuple[float, str]] = []  # (end, label), innermost last

    def mark(t: float) -> None:
        times.append(t)
        paths.append(" > ".join(label for _, label in stack))

    for start, end, label in sorted(ranges, key=lambda r: (r[0], -r[1])):
        while stack and stack[-1][0] <= start:
            mark(stack.pop()[0])
        stack.append((min(end, stack[-1][0]) if stack else end, label))
        mark(start)
    while stack:
        mark(stack.pop()[0])
    return times, paths


def path_at(timeline: tuple[list[float], list[str]], t: float) -> str:
    """The path :func:`label_timeline` gives for moment ``t`` ("" before its first point)."""
    times, paths = timeline
    i = bisect.bisect_right(times, t) - 1
    return paths[i] if i >= 0 else ""


def idle_gaps(kernels: Sequence[tuple[float, float]], window: tuple[float, float]) -> list[tuple[float, float, int]]:
    """The intervals of ``window`` in which none of ``kernels`` (``(start, end)``, any order, overlaps allowed) ran:
    ``(start, end, i)``, ``i`` the index in ``kernels`` of the kernel that ended the gap, -1 for a gap that lasts to
    the window's end."""
    lo, hi = window
    order = sorted(range(len(kernels)), key=lambda i: kernels[i][0])
    gaps: list[tuple[float, float, int]] = []
    reach = lo  # how far into the window the kernels so far have covered
    for i in order:
        start, end = kernels[i]
        if end <= lo or start >= hi:
            continue
        if start > reach:
            gaps.append((reach, start, i))
        reach = max(reach, end)
    if reach < hi:
        gaps.append((reach, hi, -1))
    return gaps


def time_by_range(
    window: tuple[float, float],
    ranges: Sequence[tuple[float, float, str]],
    kernels: Sequence[tuple[float, float]] = (),
    launches: Sequence[float | None] = (),
    top: int = 20,
) -> list[list]:
    """Per label path (``ranges`` of the host thread that ran the window's work):
    ``[path, host_ms, idle_ms, gaps, kernel_ms, kernels]``, the ``top`` paths by idle time, then host time.
    ``host_ms``: the moments of ``window`` the path was innermost; ``idle_ms`` (over ``gaps`` gaps): the device's idle
    gaps in ``window`` whose ending kernel was launched (``launches[i]``: the host time of kernel ``i``'s launch, None
    where unknown: then its start) while the path was innermost; a gap no kernel ends goes to the path in force at its
    middle; ``kernel_ms``: the summed device time of the ``kernels`` in ``window`` the path launched, by the same
    rule. Without kernels (a CPU), the host times alone."""
    timeline = label_timeline(ranges)
    host: dict[str, float] = collections.defaultdict(float)
    lo, hi = window
    bounds = [lo, *(t for t in timeline[0] if lo < t < hi), hi]
    for a, b in zip(bounds, bounds[1:]):
        host[path_at(timeline, a) or UNLABELLED] += b - a

    def launcher(i: int) -> str:
        launched = launches[i] if i < len(launches) else None
        return path_at(timeline, launched if launched is not None else kernels[i][0]) or UNLABELLED

    idle: dict[str, float] = collections.defaultdict(float)
    gaps: collections.Counter[str] = collections.Counter()
    for start, end, i in idle_gaps(kernels, window) if kernels else ():
        path = launcher(i) if i >= 0 else path_at(timeline, (start + end) / 2) or UNLABELLED
        idle[path] += end - start
        gaps[path] += 1
    busy: dict[str, float] = collections.defaultdict(float)
    launched: collections.Counter[str] = collections.Counter()
    for i, (start, end) in enumerate(kernels):
        if start < hi and end > lo:
            path = launcher(i)
            busy[path] += min(end, hi) - max(start, lo)
            launched[path] += 1
    ranked = sorted(set(host) | set(idle) | set(busy), key=lambda p: (-idle[p], -host[p], p))[:top]
    return [
        [p, round(host[p] / 1e3, 1), round(idle[p] / 1e3, 1), gaps[p], round(busy[p] / 1e3, 1), launched[p]]
        for p in ranked
    ]
