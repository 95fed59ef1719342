"""Rows of the results table, and bench.md."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class Goal:
    """``op`` is ``>=`` or ``<=``; a ratio meets the goal when ``ratio op target``."""

    op: str
    target: float

    def __post_init__(self) -> None:
        if self.op not in (">=", "<="):  # (any other op was judged as <=: a Goal(">", 2) met by 1.0)
            raise ValueError(f"a goal's op is '>=' or '<=', not {self.op!r}")

    def met(self, ratio: float) -> bool:
        return ratio >= self.target if self.op == ">=" else ratio <= self.target

    def __str__(self) -> str:
        return f"{self.op} {self.target:g}x"


@dataclass
class Row:
    section: str  # cpu | gpu
    item: str  # e.g. "1. rollouts"
    key: str  # --only name that reproduces the row
    configuration: str
    values: str  # the measured values, human readable
    ratio_name: str  # what the ratio is, e.g. "sequential / batched (per rollout)"
    ratio: float | None
    goal: Goal | None = None
    spread: tuple[float, float] | None = None  # min and max of the per-repetition (paired) ratios

    @property
    def met(self) -> bool | None:
        if self.goal is None or self.ratio is None:
            return None
        return self.goal.met(self.ratio)

    def to_json(self) -> dict:
        d = asdict(self)
        d["goal"] = str(self.goal) if self.goal else None
        d["met"] = self.met
        return d


def fmt_ratio(r: float | None) -> str:
    if r is None:
        return "-"
    return f"{r:.3g}x" if r < 100 else f"{r:.0f}x"


def met_str(m: bool | None) -> str:
    return {True: "met", False: "**not met**", None: "-"}[m]


def markdown_table(rows: list[Row]) -> str:
    """One markdown table of measured rows."""
    head = ["item", "configuration", "measured values", "ratio", "goal", "met"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        ratio = f"{r.ratio_name}: **{fmt_ratio(r.ratio)}**"
        if r.spread:
            ratio += f" (paired {fmt_ratio(r.spread[0])} to {fmt_ratio(r.spread[1])})"
        cells = [r.item, r.configuration, r.values, ratio, str(r.goal) if r.goal else "-", met_str(r.met)]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


def fmt_s(t: float) -> str:
    return f"{t * 1e3:.1f} ms" if t < 1 else f"{t:.2f} s"


def fmt_bytes(n: float) -> str:
    for unit, f in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= f:
            return f"{n / f:.1f} {unit}"
    return f"{n:.0f} B"


def fmt_flops(f: float) -> str:
    for unit, s in (("TFLOP/s", 1e12), ("GFLOP/s", 1e9), ("MFLOP/s", 1e6)):
        if f >= s:
            return f"{f / s:.1f} {unit}"
    return f"{f:.0f} FLOP/s"
