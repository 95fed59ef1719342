"""The one timing helper: warm-up, then the candidates run alternately, each round in the reverse order of the one
before (A, B, C, C, B, A, A, B, C, ...), median.

Alternation matters on a shared machine: a background job that starts or stops halfway through
slows every candidate of the later repetitions alike, so the *ratio* of medians stays meaningful
even when the absolute times move. The order reverses each round so that no candidate always runs first, right
after the others (warm caches, a drifting clock speed, a garbage collection their garbage triggers): what running
second costs or gains falls on each candidate in half of the rounds.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class Timed:
    """Wall times (seconds) and return values of every repetition, per candidate."""

    times: dict[str, list[float]] = field(default_factory=dict)
    results: dict[str, list[Any]] = field(default_factory=dict)
    cpu_times: dict[str, list[float]] = field(default_factory=dict)  # process CPU time (all threads) of each call

    def median(self, name: str) -> float:
        return statistics.median(self.times[name])

    def ratio(self, a: str, b: str) -> float:
        """median(a) / median(b)."""
        return self.median(a) / self.median(b)

    def paired_ratios(self, a: str, b: str) -> list[float]:
        """a_i / b_i for each repetition i (the two were run back to back)."""
        return [x / y for x, y in zip(self.times[a], self.times[b])]

    def paired_spread(self, a: str, b: str) -> tuple[float, float]:
        """The smallest and largest of :meth:`paired_ratios`."""
        r = self.paired_ratios(a, b)
        return min(r), max(r)

    def to_json(self) -> dict:
        return {
            name: {
                "median_s": self.median(name),
                "times_s": [round(t, 6) for t in ts],
                "cpu_times_s": [round(t, 6) for t in self.cpu_times.get(name, [])],
            }
            for name, ts in self.times.items()
        }


def sync(device: torch.device | None) -> None:
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)


def alternate(
    fns: dict[str, Callable[[], Any]],
    *,
    reps: int,
    warmup: int = 1,
    device: torch.device | None = None,
    log: Callable[[str], None] | None = None,
) -> Timed:
    """Run every candidate ``warmup`` times, then ``reps`` rounds of one call each: the given order in the first round,
    the reverse in the second, and so on (A, B, B, A, A, B, ...)."""
    if reps < 1:
        raise ValueError("reps must be >= 1")
    for _ in range(warmup):
        for f in fns.values():
            f()
    out = Timed({k: [] for k in fns}, {k: [] for k in fns}, {k: [] for k in fns})
    for r in range(reps):
        for name, f in list(fns.items())[:: -1 if r % 2 else 1]:
            sync(device)
            c0, t0 = time.process_time(), time.perf_counter()
            res = f()
            sync(device)
            out.times[name].append(time.perf_counter() - t0)
            out.cpu_times[name].append(time.process_time() - c0)
            out.results[name].append(res)
        if log is not None:
            log(f"  rep {r + 1}/{reps}: " + ", ".join(f"{k} {out.times[k][-1]:.3f}s" for k in fns))
    return out
