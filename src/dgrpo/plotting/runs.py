"""A run directory read for plotting: ``config.json`` and the rows of ``metrics.jsonl`` (training, evaluation,
best), and the run directories found under the paths given (:func:`load_run`, :func:`find_runs`)."""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..data.records import DataError
from ..paths import expand_home
from ..run_layout import CONFIG_FILE, METRICS_FILE

if TYPE_CHECKING:
    pass


#: the x axis of a GRPO run's panels (its ``step``: a GRPO step) and of an SFT run's validation curve (its ``step``:
#: the optimizer steps so far); one axis never holds both (1000 SFT steps beside 200 GRPO steps squash the latter)
GRPO_AXIS = "GRPO step"
SFT_AXIS = "SFT optimizer step"
#: the panel of the SFT groups' validation accuracy in a figure with GRPO groups too (their own x axis)
SFT_EVAL = "eval_sft"

#: a panel of one reward part a run logs (``reward/<name>``: each part of ``grpo.rewards``, unweighted)
REWARD_PART = "reward/"


@dataclass
class Run:
    """One run directory: its resolved config and its metrics rows (training steps and evaluations apart)."""

    path: Path
    name: str
    config: dict[str, Any] = field(default_factory=dict)
    steps: list[dict[str, Any]] = field(default_factory=list)
    evals: list[dict[str, Any]] = field(default_factory=list)

    @property
    def is_grpo(self) -> bool:
        """Whether this is a GRPO run: it logged GRPO steps (rows with a rollout reward), or none of its rows has
        SFT's curriculum ``stage`` (a GRPO run still in its first step has only its step-0 evaluation)."""
        rows = [*self.steps, *self.evals]
        return any("reward_mean" in r for r in self.steps) or not any("stage" in r for r in rows)


class _NoRows(DataError):
    """A run directory whose ``metrics.jsonl`` holds no row yet (a run that crashed at start)."""


# ------------------------------------------------------------------------ reading runs
def _is_eval_key(key: str) -> bool:
    return key.startswith("eval/") and key.endswith("/accuracy")


#: what an eval panel may draw of a validation set: ``eval/<name>/accuracy`` (each run's first, by default) or
#: ``eval/<name>/mean_score`` (a partial-credit scorer's mean, named by ``--eval-key``)
EVAL_METRICS = ("accuracy", "mean_score")


def _eval_parts(key: str) -> tuple[str, str]:
    """(the set's name, the metric) of an eval column ``eval/<name>/<metric>``."""
    name, _, metric = key.removeprefix("eval/").rpartition("/")
    return name, metric


def _is_test_key(key: str) -> bool:  # the test sets' accuracies of the run's last row (not plotted)
    return key.startswith(("test/", "test_best/")) and key.endswith("/accuracy")


def _is_best_key(key: str) -> bool:  # SFT's new-best-epoch row (best_epoch, best/valid/accuracy): no training row
    return key == "best_epoch" or (key.startswith("best/") and key.endswith("/accuracy"))


def _is_training_row(row: dict[str, Any]) -> bool:
    """A training row: none of the evaluation, test or best keys, and not SFT's stage-end row (``n_latent``), which has
    no accuracy without a validation set."""
    return "n_latent" not in row and not any(_is_eval_key(k) or _is_test_key(k) or _is_best_key(k) for k in row)


def _read_rows(metrics: Path) -> list[dict[str, Any]]:
    """The rows of ``metrics.jsonl``; an unreadable last line (a killed run) is skipped, one elsewhere is an error."""
    try:
        text = metrics.read_text(errors="replace")
    except OSError as e:  # (no permission: a traceback)
        raise DataError(f"{metrics}: cannot read it ({e.strerror or e})") from None
    lines = [(i, ln) for i, ln in enumerate(text.splitlines(), 1) if ln.strip()]
    rows = []
    for i, line in lines:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        if not isinstance(row, dict):
            if i == lines[-1][0]:
                continue
            raise DataError(f"{metrics}:{i}: not a JSON object row")
        if "step" in row:
            rows.append(row)
    return rows


def load_run(path: str | Path) -> Run:
    """Read one run directory; a :class:`DataError` naming it when it has no ``metrics.jsonl`` or no readable row."""
    p = Path(path)
    metrics = p / METRICS_FILE
    if not metrics.is_file():
        raise DataError(f"{p}: no {METRICS_FILE} (not a run directory)")
    rows = _read_rows(metrics)
    if not rows:
        raise _NoRows(f"{metrics}: no readable rows")
    config: dict[str, Any] = {}
    if (p / CONFIG_FILE).is_file():
        try:
            config = json.loads((p / CONFIG_FILE).read_text())
        except json.JSONDecodeError as e:
            raise DataError(f"{p / CONFIG_FILE}: not valid JSON ({e.msg}, line {e.lineno})") from None
        except UnicodeDecodeError as e:  # (a damaged file: a traceback)
            raise DataError(f"{p / CONFIG_FILE}: not UTF-8 text (byte {e.start})") from None
        except OSError as e:
            raise DataError(f"{p / CONFIG_FILE}: cannot read it ({e.strerror or e})") from None
    evals = [r for r in rows if any(_is_eval_key(k) for k in r)]
    steps = [r for r in rows if _is_training_row(r)]
    return Run(
        path=p, name=_shown_path(p).name, config=config if isinstance(config, dict) else {}, steps=steps, evals=evals
    )


def _shown_path(path: Path) -> Path:
    """The absolute path a run is named by: the name it was given or found under (a link's own name: ``cmp/p01_seed0``
    linked to ``store/run_17`` is ``p01_seed0``, not ``run_17``), in the real folder it sits in; ``..`` read as
    written."""
    given = Path(os.path.abspath(expand_home(path)))
    return given.parent.resolve() / given.name if given.name else given.resolve()


def _runs_below(root: Path) -> list[Path]:
    """The directories below ``root`` that hold ``metrics.jsonl``, sorted; links to directories are followed (a
    folder of links to the runs compared: ``Path.rglob`` skipped them, and the folder had 'no metrics.jsonl below
    it'), each real directory once (a link to a folder above ends there), under its own name where a link beside it
    names it too (``latest -> grpo_seed1``: found first, it named the run ``latest``, out of its arm ``grpo``)."""
    found: dict[Path, Path] = {}
    seen: set[Path] = set()
    for folder, subfolders, _ in os.walk(root, followlinks=True):
        path, real = Path(folder), Path(folder).resolve()
        if real in seen:
            subfolders[:] = []
            if real in found and found[real].is_symlink() and not path.is_symlink():
                found[real] = path
            continue
        seen.add(real)
        if (path / METRICS_FILE).is_file():
            found[real] = path
    return sorted(found.values())


def find_runs(paths: Sequence[str | Path]) -> list[Path]:
    """Run directories: each path that holds ``metrics.jsonl``, else every directory below it that does; a directory
    named twice (``runs/a`` and ``$PWD/runs/a``, ``runs/x/../a``, a link to it) once, as first named. A leading ``~``
    is the home folder (``--label "A=~/runs/a,~/runs/b"``: the shell expands no ``~`` after a comma)."""
    found: list[Path] = []
    seen: set[Path] = set()
    for path in paths:
        p = expand_home(path)
        if p.is_file():  # (metrics.jsonl itself, say: it was told 'no such directory', as a missing path is)
            raise DataError(f"{p}: a file, not a directory (name the run directory that holds {METRICS_FILE})")
        if not p.is_dir():
            raise DataError(f"{p}: no such directory")
        if (p / METRICS_FILE).is_file():
            below = [p]
        else:
            below = _runs_below(p)
        if not below:
            raise DataError(f"{p}: no {METRICS_FILE} in it or in any directory below it")
        for b in below:
            if b.resolve() not in seen:  # (twice, it was averaged with itself: "mean of 2 seeds" of one run)
                seen.add(b.resolve())
                found.append(b)
    return found


def _load_found(dirs: Sequence[Path], others: int = 0) -> list[Run]:
    """The runs of ``dirs`` (:func:`find_runs`'s); one with no row yet (a run that crashed at start) is skipped with
    a warning naming it, unless no run is left (none in ``dirs``, and no ``others`` already loaded): its error."""
    runs: list[Run] = []
    empty: list[DataError] = []
    for d in dirs:
        try:
            runs.append(load_run(d))
        except _NoRows as e:
            empty.append(e)
    if empty and not runs and not others:
        raise empty[0]
    for error in empty:
        warnings.warn(f"skipped {error} (a run that stopped before logging a step?)", stacklevel=3)
    return runs


# ------------------------------------------------------------------------ grouping
def _config_get(config: Mapping[str, Any], dotted: str, default: Any = None) -> Any:
    if dotted in config:
        return config[dotted]
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node
