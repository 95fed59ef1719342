"""One training run's plumbing, shared by SFT and GRPO: the run directory, the metrics log, start-or-resume,
the non-finite guard, and evaluation sharded over processes.

Every rank builds the same objects; the ones that write (``config.json``, ``metrics.jsonl``, TensorBoard)
are no-ops off rank 0, so a trainer's loop calls them unconditionally.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from ..config import Config, to_dict
from ..data.records import Record
from .checkpoint import count_lines, latest_checkpoint, reset_metrics
from .distributed import Dist

METRICS_FILE = "metrics.jsonl"
CONFIG_FILE = "config.json"


class NonFiniteError(RuntimeError):
    """Too many consecutive steps with a non-finite loss or gradient (the state was saved first)."""


class MetricsLog:
    """``metrics.jsonl`` (one JSON row per write, flushed) and optionally TensorBoard, written by rank 0 only."""

    def __init__(self, path: Path, enabled: bool, tensorboard_dir: Path | None = None):
        self.path, self.enabled = path, enabled
        self._file: IO[str] | None = None
        self._tb: Any = None
        if enabled and tensorboard_dir is not None:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(tensorboard_dir))
            except Exception:  # tensorboard not installed
                self._tb = None

    def open(self, keep_lines: int | None) -> None:
        """Resuming: keep the first ``keep_lines`` rows (those of the checkpoint); fresh (None): start empty."""
        if not self.enabled:
            return
        reset_metrics(self.path, keep_lines)
        self._file = open(self.path, "a")

    def write(self, row: dict[str, Any]) -> None:
        if self._file is None:
            return
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        if self._tb is not None:
            for k, v in row.items():
                if isinstance(v, (int, float)) and k != "step" and v is not None and math.isfinite(v):
                    self._tb.add_scalar(k, v, row["step"])

    def n_rows(self) -> int:
        """Rows written so far (stored in checkpoints, so a resumed run drops the rows after them)."""
        return count_lines(self.path) if self.enabled else 0

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tb is not None:
            self._tb.close()


class RunDir:
    """A run's output directory: ``config.json``, the metrics log, and the checkpoint to resume from (if any)."""

    def __init__(
        self,
        out_dir: Path,
        cfg: Config,
        dist: Dist,
        *,
        resume: bool = True,
        tensorboard: bool = False,
        log: Callable[[str], None] = print,
    ):
        self.out_dir, self.dist = Path(out_dir), dist
        self.log = log if dist.is_main else (lambda m: None)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        if dist.is_main:
            (self.out_dir / CONFIG_FILE).write_text(json.dumps(to_dict(cfg), indent=2))
        self.metrics = MetricsLog(
            self.out_dir / METRICS_FILE, dist.is_main, self.out_dir / "tb" if tensorboard else None
        )
        self.checkpoint = latest_checkpoint(self.out_dir, log=self.log) if resume else None

    def start(self, resumed_state: dict | None) -> None:
        """Open the metrics log: keep the resumed checkpoint's rows, or start empty; say that we resumed."""
        self.metrics.open(resumed_state["metrics_lines"] if resumed_state is not None else None)
        if self.checkpoint is not None and resumed_state is not None:
            self.log(f"dgrpo: resumed from {self.checkpoint} (step {resumed_state['step']})")


class NonFiniteGuard:
    """Counts optimizer steps dropped for a non-finite loss or gradient; trips after ``limit`` in a row."""

    def __init__(self, limit: int, what: str, lr_key: str, skips: int = 0, streak: int = 0):
        self.limit, self.what, self.lr_key = limit, what, lr_key
        self.skips, self.streak = skips, streak

    def record(self, finite: bool) -> None:
        self.skips += int(not finite)
        self.streak = 0 if finite else self.streak + 1

    @property
    def tripped(self) -> bool:
        return self.streak >= self.limit

    def error(self, step: int, saved_in: Path) -> NonFiniteError:
        return NonFiniteError(
            f"{self.streak} {self.what} steps in a row had a non-finite loss or gradient (step {step}); "
            f"state saved in {saved_in}; lower {self.lr_key} or check the data"
        )


def sharded_accuracy(dist: Dist, count_correct: Callable[[list[Record]], int], records: list[Record]) -> float:
    """Accuracy on ``records`` with each rank scoring its shard: ``count_correct(shard)`` returns how many
    of the shard's records are correct; the counts are summed over ranks (every rank calls this)."""
    local = dist.shard(records)
    correct = count_correct(local) if local else 0
    return dist.sum_int(correct) / max(1, len(records))


def stderr_log(msg: str) -> None:
    print(msg, file=sys.stderr)
