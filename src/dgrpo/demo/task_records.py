"""The record a finished demo task (one SFT run, one RL run) leaves in its run folder, so that the same command run
again reads its results back instead of training it again (``dgrpo demo --resume auto``, the default).

A record holds the task's rows (its models' test answers, its run's diagnostics, its wall time) and a fingerprint of
everything they depend on: the task's own config (seed included; an SFT run's without the RL runs' sections ``grpo``
and ``perturbation``, which it does not read), the problems it trains, validates and tests on, the torch threads it
ran with (the last float bits depend on them), the versions of Python, dgrpo, torch and transformers, and for an RL
run the manifest of the SFT checkpoint it started from. A record whose fingerprint differs is ignored and the task
runs again; so is an SFT record whose checkpoint is gone or damaged (its RL runs read it). A task deletes its record
before it starts, and writes it (atomically) only once all its rows are in: a task stopped midway has none.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..data.records import Record
from ..model.verified import MANIFEST, verify, write_text_atomically
from ..training.applied import versions

#: the record's file name, in the task's run folder
RECORD = "demo_task.json"


def fingerprint(
    settings: dict[str, Any],
    splits: Mapping[str, Sequence[Record]],
    threads: int,
    sft_checkpoint: Path | None = None,
) -> str:
    """sha256 of what a task's results depend on: its settings (the config, as a dict), its problems (``splits``:
    name -> records), its torch threads, the versions, and (an RL run) the manifest of its SFT checkpoint (empty when
    there is none to read: the run would fail, and a record cannot match a checkpoint that is not there)."""
    problems = {name: [[r.question, r.steps, r.answer] for r in recs] for name, recs in splits.items()}
    what: dict[str, Any] = {
        "config": settings,
        "problems": hashlib.sha256(json.dumps(problems).encode()).hexdigest(),
        "threads": threads,
        "versions": versions(),
    }
    if sft_checkpoint is not None:
        manifest = sft_checkpoint / MANIFEST
        what["sft_manifest"] = hashlib.sha256(manifest.read_bytes()).hexdigest() if manifest.is_file() else ""
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()


def read_record(run_dir: Path, fp: str, checkpoint: Path | None = None) -> dict[str, Any] | None:
    """The task's record in ``run_dir`` when it is there, readable and of fingerprint ``fp`` (and ``checkpoint``, the
    one the task leaves for others to read, intact); else None (the task runs)."""
    try:
        record = json.loads((run_dir / RECORD).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("fingerprint") != fp:
        return None
    if not all(isinstance(record.get(k), t) for k, t in (("models", list), ("runs", list), ("wall", dict))):
        return None
    if checkpoint is not None and verify(checkpoint) is not None:
        return None
    return record


def forget_record(run_dir: Path) -> None:
    """Delete the task's record (it is about to run: until it has finished, nothing of it is to be read back)."""
    (run_dir / RECORD).unlink(missing_ok=True)


def write_record(
    run_dir: Path, fp: str, models: list[dict], runs: list[dict], wall: dict[str, float], line: str
) -> None:
    """Write the finished task's rows (and ``line``, what it said when it ended) under fingerprint ``fp``: to a
    temporary file renamed over the record, so that a stop midway leaves no record, or a whole one."""
    run_dir.mkdir(parents=True, exist_ok=True)
    body = {"fingerprint": fp, "line": line, "models": models, "runs": runs, "wall": wall}
    write_text_atomically(run_dir / RECORD, json.dumps(body, indent=1))
