"""One training run's plumbing, shared by SFT and GRPO: the run directory (an exclusive lock, ``config.json`` and
its history, start-or-resume with fallback), the metrics log, the guards that stop a run that stopped learning,
and evaluation sharded over processes.

Every rank builds the same objects; the ones that write (``config.json``, ``metrics.jsonl``, trackers) are no-ops
off rank 0, so a trainer's loop calls them unconditionally.
"""

from __future__ import annotations

import fcntl
import hashlib
import inspect
import json
import operator
import os
import re
import shutil
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import IO, Any, NoReturn

from ..config import BUILTIN_SHAPE, Config, ConfigError, to_dict
from ..data.records import Record, check_records, data_columns
from ..eval.evaluate import (
    EvalResult,
    eval_options,
    evaluate,
    ordered_mean,
    result_scores,
    warn_if_questions_cut,
)
from ..eval.scoring import RewardError
from ..model.factory import BUILTIN
from ..model.latent_lm import LatentLM
from ..model.sources import is_model_dir, on_disk, resolve_device
from ..model.support import untrainable
from ..model.verified import (
    MANIFEST,
    RESUMABLE_STATE,
    RUN_CONFIG_FILE,
    CheckpointError,
    enclosing_checkpoint,
    is_written_checkpoint,
    remove_dir,
)
from ..paths import expand_home
from ..run_layout import (
    APPLIED_FILE,
    BEST_DIR,
    CHECKPOINTS_DIR,
    CONFIG_FILE,
    FINAL_DIR,
    LOCK_FILE,
    METRICS_FILE,
    ROLLOUTS_FILE,
    STAGE_DIR,
    STEP_DIR,
    SUMMARY_FILE,
    TB_DIR,
    WANDB_DIR,
    WANDB_ID_FILE,
    config_history,
    config_history_file,
    results_folder,
    stage_dirs,
)
from .applied import record_applied, warn_if_plugins_changed
from .checkpoint import (
    LoadedCheckpoint,
    checkpoint_command,
    count_lines,
    list_checkpoints,
    repoint_run_adapters,
    reset_metrics,
    resume_candidates,
)
from .distributed import Dist
from .preemption import in_test_sets, stop, stop_if_requested, stopping, writing_the_end
from .tracking import Tracker, describe_backends, open_trackers

#: ``final_eval(lm, best)`` of :func:`~dgrpo.training.grpo.train_grpo` / :func:`~dgrpo.training.sft.train_sft`: run
#: on the trained model (every rank) before ``final/`` is written (:meth:`RunDir.final_eval`), with the step (GRPO)
#: or epoch (SFT) that ``best/`` holds (None: none kept; rank 0's counts); returns metrics for the run's last row
#: (rank 0's count)
FinalEval = Callable[[LatentLM, "int | None"], dict[str, float]]

#: options that change neither the computation nor its results: a resumed run may change them freely. Recomputing
#: the decoder layers or calls gives the same gradients, bit for bit on CPU (tests/test_recompute.py); keeping the
#: latent steps' activations (recompute_latent_steps: false) does not (1e-7 apart), so that key is not neutral
NEUTRAL_KEYS = frozenset(
    ["threads", "device"]
    # LoRA's adapter dropout is always 0 (dgrpo.model.lora): a run records 0 (dgrpo up to 2026-12-02: the value given)
    + ["model.lora.dropout"]
    # how the ranks hold the model: like another number of processes, which a resume may change too, it changes
    # results at float level; the checkpoint's loader says what a sharded checkpoint needs (torchrun, FSDP2)
    + ["fsdp"]
    + [f"{t}.{k}" for t in ("sft", "grpo") for k in ("recompute", "recompute_granularity", "recompute_kept_layers")]
    # how often a resumable checkpoint is written and how many are kept: a resumed run is the run not stopped (to
    # the bit), so they change where a stop can resume, not what it computes
    + [f"{t}.{k}" for t in ("sft", "grpo") for k in ("save_every", "keep_last")]
)
NEUTRAL_SECTIONS = ("logging.",)  # every key below these
#: what a command's run never reads (the other command's section; dgrpo eval's prompt options): a resume ignores them
UNREAD_BY = {"sft": ("grpo.", "eval.plain", "eval.shots"), "grpo": ("sft.", "eval.plain", "eval.shots")}
#: model.arch and the built-in tiny model's sizes: they build that model (model.name_or_path builtin-tiny); a run
#: that loads one records the loaded model's there (dgrpo before 2026-12-02 recorded the options given), which a
#: resume does not compare
BUILTIN_SHAPE_KEYS = frozenset(f"model.{k}" for k in BUILTIN_SHAPE)
#: what makes a LoRA run's adapter: a LoRA run's resume compares them on the checkpoint's and the model's adapters
#: (:func:`~.checkpoint.check_same_adapter`), not in the config (a run from an --init adapter records the adapter's,
#: dgrpo before 2026-12-02 the values given); a change is kept in the config history
ADAPTER_KEYS = frozenset(f"model.lora.{k}" for k in ("r", "alpha", "target_modules", "train_latent_tokens"))
#: what :func:`~dgrpo.model.verified.atomic_dir` leaves in OUT when a run is killed during a final/, best/ or stage-K/
#: write: its temporary ``.tmp-NAME-PID`` and the ``.old-NAME-PID`` a replace moves aside (in OUT/checkpoints too, for
#: a step-N replaced: a rewound run's, or one whose LoRA base moved, :func:`~.checkpoint.repoint_run_adapters`)
LEFTOVER = re.compile(rf"\.(tmp|old)-({FINAL_DIR}|{BEST_DIR}|stage-\d+|step-\d+)-\d+")


class TrainingStopped(RuntimeError):
    """A run stopped on purpose because it stopped learning (its state was saved first); exit code 1. Under torchrun
    every rank raises it at the same step (its guards decide on values the ranks share): rank 0 prints it."""


class NonFiniteError(TrainingStopped):
    """Too many consecutive steps with a non-finite loss or gradient, or non-finite weights after a step."""


class StalledError(TrainingStopped):
    """Every group was filtered out for too many steps in a row: no update happened for that long."""


def check_output_path(path: Path | str, what: str = "--out", *, model_dir: bool = False) -> None:
    """Fail early, in one line, when ``path`` cannot hold a command's output: an existing file, a place that cannot
    be written (a probe file is written and removed in ``path`` or its nearest existing parent; nothing is created),
    or a folder inside a checkpoint dgrpo wrote (a run, results or a model written there would change the files its
    manifest vouches for), or, unless ``model_dir`` (the output is itself a model directory, which dgrpo may
    replace), such a checkpoint itself."""
    if not str(path).strip():
        raise ConfigError(f"{what} is empty: name a directory")
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{what} {path} exists and is not a directory")
    _refuse_inside_checkpoint(path, what, itself=not model_dir)
    parent = path
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(f"{what} {path}: {parent} is not a directory")
    try:
        probe = parent / f".dgrpo-write-probe-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise ConfigError(f"{what} {path}: cannot write there ({e.strerror or e})") from None


def _refuse_inside_checkpoint(path: Path, what: str, itself: bool = True) -> None:
    """ConfigError when ``path`` is (``itself``), or lies inside, a model checkpoint or resumable checkpoint dgrpo
    wrote."""
    folder = path if itself and is_written_checkpoint(path) else enclosing_checkpoint(path)
    if folder is not None:
        where = "is" if folder == path else f"lies inside {folder},"
        raise ConfigError(
            f"{what} {path} {where} a checkpoint dgrpo wrote: writing there would change the files it holds; "
            "name a new directory"
        )


def is_run_config(path: Path) -> bool:
    """Whether ``path`` holds a dgrpo run's config (a JSON object with the config's sections)."""
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(found, dict) and {"model", "task", "data"} <= set(found)


def check_not_a_training_run(path: Path | str, what: str = "--out") -> None:
    """ConfigError when ``path`` is a training run's directory (its config.json, metrics or checkpoints): dgrpo eval's
    and the demo's files would mix with the run's (results.json beside its checkpoints); or a folder the run writes
    itself, or one inside it (``RUN/eval``: the run's own test-set results, replaced without a word, and removed
    with the run's files by ``--resume never``)."""
    path = Path(path)
    if _is_training_run(path):
        raise ConfigError(
            f"{what} {path} is a training run's directory: name a folder of its own (e.g. {path / 'mine'})"
        )
    for run, own in ((path.parent, path.name), (path.parent.parent, path.parent.name)):
        if own in RUN_WRITES and _is_training_run(run):
            raise ConfigError(
                f"{what} {path}: {run / own} is where the training run {run} keeps its own files: name a folder of "
                f"its own (e.g. {run / 'mine'})"
            )


def _is_training_run(path: Path) -> bool:
    """Whether ``path`` is a training run's directory: its config.json, metrics or checkpoints."""
    config = path / CONFIG_FILE
    return (
        (config.is_file() and is_run_config(config))
        or (path / METRICS_FILE).is_file()
        or (path / CHECKPOINTS_DIR).is_dir()
    )


#: what a run writes in OUT besides config.json and metrics.jsonl, which ``--resume never`` (or a restart under another
#: config) removes: its checkpoints, models, test results, logs, summary and applied settings
RUN_WRITES = (
    *(CHECKPOINTS_DIR, BEST_DIR, FINAL_DIR, results_folder(FINAL_DIR), results_folder(BEST_DIR), TB_DIR),
    *(SUMMARY_FILE, ROLLOUTS_FILE, WANDB_ID_FILE, WANDB_DIR, APPLIED_FILE),
)


def _metrics_of_a_run(path: Path) -> bool:
    """Whether ``path`` is a run's ``metrics.jsonl``: empty (as a run opens it), or its first line a row with a step."""
    try:
        with open(path) as f:
            first = f.readline()
    except OSError:
        return False
    try:
        row = json.loads(first) if first.strip() else {"step": None}
    except ValueError:
        return False
    return isinstance(row, dict) and "step" in row


def rollout_rows_before(rows: list[str], step: int, path: Path) -> list[str]:
    """The lines of ``rollouts.jsonl`` (``path``) of the steps before ``step``, which a resumed run keeps. A last line
    that is no JSON was being written when the run was killed (its step is the one under way: dropped); another
    is a ConfigError naming it."""
    kept = []
    for n, row in enumerate(rows, 1):
        if not row.strip():
            continue
        try:
            at = json.loads(row)["step"]
        except (ValueError, TypeError, KeyError):
            if n == len(rows):
                break
            raise ConfigError(
                f"{path} line {n} is not a rollout row (JSON with a 'step'): mend or delete the file to resume"
            ) from None
        if at < step:
            kept.append(row)
    return kept


def check_output_dir(path: Path, what: str = "--out") -> Path:
    """``path`` can hold a run: checked (:func:`check_output_path`), then created."""
    check_output_path(path, what)
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"{what} {path}: cannot create it ({e.strerror or e})") from None
    return Path(path)


class RunLock:
    """An exclusive lock on a run directory for this process's lifetime (``flock``: the OS releases it when the
    process dies, however it dies). A second process on the same directory gets a one-line ConfigError naming
    the holder's PID."""

    def __init__(self, directory: Path):
        self.path = Path(directory) / LOCK_FILE
        self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = self.path.read_text().strip() or "unknown"
            os.close(self._fd)
            self._fd = None
            raise ConfigError(
                f"{directory} is in use by another dgrpo process (PID {holder}); wait for it to finish or use "
                "another --out"
            ) from None
        os.ftruncate(self._fd, 0)
        os.write(self._fd, f"{os.getpid()}\n".encode())

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def check_run_inputs(
    lm: object,
    cfg: Config,
    train: list[Record],
    what: str,
    valid: object,
    valid_type: type,
    *,
    out_dir: object,
    evaluate_fn: Callable | None,
    eval_args: tuple[str, ...],
    stacklevel: int = 3,
) -> None:
    """What a Python caller hands a trainer, checked before a run directory is touched: :func:`check_trainer_inputs`,
    :func:`check_dtype`, ``valid`` None or of ``valid_type`` (SFT: a list of records; GRPO: a dict of them by name),
    ``out_dir`` a path, and an ``evaluate_fn`` that takes ``eval_args`` (None: the trainer's default,
    :func:`default_evaluate_fn`), warned about when there is no ``valid`` to call it on. ``stacklevel``: the warnings',
    to name the trainer's caller (3: the trainer calls this; 4: through a helper of the trainer's)."""
    check_trainer_inputs(lm, cfg, train, what)
    assert isinstance(lm, LatentLM)  # (checked above, in one line)
    check_dtype(lm, cfg, what)
    warn_if_off_device(lm, cfg, what, stacklevel + 1)
    if valid is not None and not isinstance(valid, valid_type):
        raise TypeError(f"{what}: valid must be a {valid_type.__name__} of records, got {type(valid).__name__}")
    _check_valid_records(what, valid)
    _check_evaluate_fn(what, evaluate_fn, eval_args)
    _check_best_metric(what, cfg, evaluate_fn)
    if evaluate_fn is not None and not valid:
        form = "{'valid': records}" if valid_type is dict else "records"
        warnings.warn(
            f"{what}: evaluate_fn is given but no valid records: it is never called (no validation, no best/); pass "
            f"valid={form} too",
            stacklevel=stacklevel,
        )
    if not isinstance(out_dir, (str, os.PathLike)) or not str(out_dir):
        raise TypeError(f"{what}: out_dir must be the run directory's path, got {out_dir!r}")


def _check_valid_records(what: str, valid: object) -> None:
    """The records of a trainer's ``valid``, each list checked as ``train`` is (:func:`check_records`): SFT's list
    (empty: no validation), each set of GRPO's dict non-empty (an empty one would log an accuracy of 0 at every
    evaluation and keep ``best/`` by it); a list of dicts failed at the first evaluation, after training, deep
    inside."""
    if isinstance(valid, dict):
        for name, records in valid.items():
            check_records(records, f"{what}: valid[{name!r}]")
    elif valid is not None:
        check_records(valid, f"{what}: valid", empty=True)


#: how each trainer takes its first arguments (SFT's records come before the config, GRPO's after it)
CALL_ORDER = {
    "train_sft": "lm, train, cfg, out_dir",
    "train_grpo": "lm, cfg, train, out_dir",
    "GRPOTrainer": "lm, cfg, train",
}


def check_trainer_inputs(lm: object, cfg: Config, train: list[Record], what: str) -> None:
    """A :class:`LatentLM`, a :class:`Config` valid as a whole (a value set on the object skips ``load_config``'s
    checks) and a non-empty list of Records, each a one-line error naming ``what`` (the trainer's own misuse would
    fail deep inside, or train on nothing: a group of one rollout has no advantage)."""
    if not isinstance(lm, LatentLM):
        raise TypeError(
            f"{what}: lm must be a dgrpo LatentLM (LatentLM.from_pretrained(path_or_hub_id), or LatentLM(model, "
            f"tokenizer) around a Hugging Face model), got {type(lm).__name__}"
        )
    if (why := untrainable(getattr(lm.model, "config", None))) is not None:
        raise ConfigError(f"{what}: {why}")
    if not isinstance(cfg, Config):
        order = CALL_ORDER.get(what)
        raise TypeError(
            f"{what}: cfg must be a dgrpo.config.Config, got {type(cfg).__name__}"
            + (f" (the arguments' order: {what}({order}))" if order else "")
        )
    cfg.validate()
    check_records(train, f"{what}: train")


def warn_if_training_questions_cut(lm: LatentLM, cfg: Config, train: list[Record]) -> None:
    """:func:`~dgrpo.eval.evaluate.warn_if_questions_cut` for a training set: 1000 of its distinct questions, evenly
    spaced (SFT's and GRPO's start)."""
    questions = list(dict.fromkeys(r.question for r in train))
    warn_if_questions_cut(lm, questions, cfg.data.max_question_tokens, "training", check_at_most=1000)


def check_restart(lm: LatentLM, resumed: bool, what: str) -> None:
    """A ConfigError when a run would start afresh from the weights of a run that stopped mid-way in this process
    (Ctrl-C in a notebook, an error; ``lm.stopped_run``, set by every training step and cleared when a run ends):
    nothing restores its start (no checkpoint to resume). A resumed checkpoint replaces the weights and clears it."""
    if resumed:
        lm.stopped_run = None
    elif lm.stopped_run is not None:
        raise ConfigError(
            f"{what}: this model object holds the weights of a run that stopped mid-way ({lm.stopped_run}), and no "
            "checkpoint of this run restores a start: load the model again (load_model / LatentLM.from_pretrained) "
            "and pass that, or go on with the stopped run by giving its directory"
        )


def check_dtype(lm: LatentLM, cfg: Config, what: str) -> None:
    """The model's weights in ``model.dtype``, which the run records (config.json, and each checkpoint's
    run_config.json, from which ``dgrpo eval`` takes it): ``load_model`` casts to it, a model built in Python keeps
    its own (an fp32-trained run recorded bf16, and was evaluated in bf16)."""
    weights = str(lm.model.get_input_embeddings().weight.dtype).removeprefix("torch.")
    if weights != cfg.model.dtype:
        raise ConfigError(
            f"{what}: model.dtype is {cfg.model.dtype}, but the model's weights are {weights}: set model.dtype to "
            f"the dtype to train in and cast the model to it (lm.to(torch.{cfg.model.dtype}); load_model casts)"
        )


def warn_if_off_device(lm: LatentLM, cfg: Config, what: str, stacklevel: int = 4) -> None:
    """A warning when the model is not on the kind of device ``cfg.device`` names (``auto``: CUDA when there is one):
    the trainers train the model where it is, and ``load_model`` puts it on the CPU unless told (the ``dgrpo``
    commands move it; a Python run on a GPU machine trained on the CPU without a word)."""
    import torch

    name = cfg.device
    want = resolve_device(name).type if name == "auto" else torch.device(name).type  # (no CUDA here: still warned)
    if lm.device.type != want:
        warnings.warn(
            f"{what}: the model is on {lm.device.type}, but device is {name!r} ({want}), so it trains on "
            f"{lm.device.type}: move it first (lm.to({want!r}), or load_model(..., device={want!r})), or set "
            f"device: {lm.device.type}",
            stacklevel=stacklevel,  # (the trainer's caller)
        )


def default_evaluate_fn(cfg: Config, valid: Iterable[Record], per_stage: bool = False) -> Callable[..., EvalResult]:
    """What a trainer validates with when it is given no ``evaluate_fn``, as the ``dgrpo`` commands do: the
    :class:`EvalResult` of the records (how many the model answers right, and the mean of the scorer's values), greedy
    (unless ``eval.temperature``) under ``eval.*`` (the scorer, the answer's tokens, ...). ``per_stage`` (SFT):
    ``(lm, records, settings)``, with the stage's latent steps. The scorer gets every column of ``valid`` (the whole
    validation data) on each rank's shard, None where a record has none: a scorer in TRL's form is called alike
    whichever records a shard holds."""
    options = {**eval_options(cfg), "columns": data_columns(valid)}  # (a scorer that cannot be built fails here)
    options["dataset"] = "the validation set"  # (named in evaluate's warnings, as a test set is by its name)

    def evaluated(lm: LatentLM, records: list[Record]) -> EvalResult:
        return evaluate(lm, records, progress=False, **options)

    def evaluated_at(lm: LatentLM, records: list[Record], settings: Any) -> EvalResult:
        return evaluate(lm, records, progress=False, **{**options, "n_latent": settings.n_latent})

    return evaluated_at if per_stage else evaluated


def _check_evaluate_fn(what: str, evaluate_fn: Callable | None, eval_args: tuple[str, ...]) -> None:
    """``evaluate_fn`` callable with ``eval_args`` (checked on its signature, not called: a wrong one would fail only
    at the first validation, after training); None: the trainer's default (:func:`default_evaluate_fn`)."""
    if evaluate_fn is None:
        return
    if not callable(evaluate_fn):
        raise TypeError(f"{what}: evaluate_fn must be a function, got {type(evaluate_fn).__name__}")
    try:
        signature = inspect.signature(evaluate_fn)
    except (TypeError, ValueError):  # a builtin or C function: nothing to read
        return
    try:
        signature.bind(*eval_args)
    except TypeError:
        raise TypeError(
            f"{what}: evaluate_fn is called as evaluate_fn({', '.join(eval_args)}) and returns how many records are "
            f"correct (or their EvalResult); its signature is {getattr(evaluate_fn, '__name__', '')}{signature}"
        ) from None


def _check_best_metric(what: str, cfg: Config, evaluate_fn: Callable | None) -> None:
    """``grpo.best_metric`` / ``sft.best_metric`` other than accuracy, where ``best/`` is kept, with an ``evaluate_fn``
    annotated to return an int (a count, with no mean score): refused before training. One not annotated so is refused
    at its first validation (:func:`best_value`)."""
    section = {"train_grpo": "grpo", "train_sft": "sft"}.get(what)
    if section is None or evaluate_fn is None:
        return
    s = getattr(cfg, section)
    keeps_best = s.save_best if section == "grpo" else s.eval_every_epoch
    try:
        returns = inspect.signature(evaluate_fn).return_annotation
    except (TypeError, ValueError):  # a builtin or C function: nothing to read
        return
    if keeps_best and s.best_metric != "accuracy" and returns in (int, "int"):
        raise _no_best_metric(s.best_metric, f"{section}.best_metric")


class MetricsLog:
    """``metrics.jsonl`` (one JSON row per write, flushed) and the run's other trackers (TensorBoard, W&B), written
    by rank 0 only: every method is a no-op on other ranks."""

    def __init__(self, path: Path, enabled: bool):
        self.path, self.enabled = path, enabled
        self._file: IO[str] | None = None
        self.trackers: list[Tracker] = []

    def open(self, keep_lines: int | None, trackers: list[Tracker]) -> None:
        """Resuming: keep the first ``keep_lines`` rows (those of the checkpoint); fresh (None): start empty."""
        if not self.enabled:
            return
        reset_metrics(self.path, keep_lines)
        if keep_lines and self.path.is_file():  # (a fork of another run's checkpoint starts without its rows)
            kept = self.rows()
            for t in trackers:
                t.resumed(kept)
        self._file = open(self.path, "a")
        self.trackers = trackers

    def write(self, row: dict[str, Any]) -> None:
        if self._file is None:
            return
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        for t in self.trackers:
            t.log(row, row["step"])

    def rows(self) -> list[dict]:
        """The rows written so far, a resumed run's earlier ones included ([] on other ranks than 0)."""
        if not (self.enabled and self.path.is_file()):
            return []
        if self._file is not None:
            self._file.flush()
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]

    def n_rows(self) -> int:
        """Rows written so far (stored in checkpoints, so a resumed run drops the rows after them)."""
        return count_lines(self.path) if self.enabled else 0

    def close(self, exit_code: int = 0) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        for t in self.trackers:
            t.close(exit_code)
        self.trackers = []


def config_diff(old: dict, new: dict, prefix: str = "", defaults: dict | None = None) -> list[str]:
    """Dotted keys whose values differ between two config dicts (options that cannot change results excluded). A key
    the old config lacks counts as its default: an option a later dgrpo added does not stop a run from resuming."""
    defaults = to_dict(Config()) if defaults is None else defaults
    keys = []
    for k in sorted(set(old) | set(new)):
        key = f"{prefix}{k}"
        a, b = old[k] if k in old else defaults.get(k), new.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            sub = defaults.get(k)
            keys += config_diff(a, b, key + ".", sub if isinstance(sub, dict) else {})
        elif a != b and not key.startswith(NEUTRAL_SECTIONS) and key not in NEUTRAL_KEYS:
            keys.append(key)
    return keys


def absolute_data_spec(spec: str) -> str:
    """A data spec with each part that names an existing local file or folder made absolute (``my.jsonl`` ->
    ``/abs/my.jsonl``, ``data/dir:test`` -> ``/abs/data/dir:test``, each part of ``a.jsonl+b.csv``), so that a run's
    config names the data wherever it is run or resumed from; built-in and hub names, and parts that name no local
    file, as they are (:func:`_each_dataset`)."""
    from ..data import local_path

    def absolute(part: str) -> str | None:
        at_a_path = local_path(part)
        if at_a_path is None:
            return None
        path, split = at_a_path
        absolute = str(expand_home(path).resolve())
        return f"{absolute}:{split}" if split is not None else absolute

    return _each_dataset(spec, absolute)


def _each_dataset(spec: str, one: Callable[[str], str | None]) -> str:
    """``spec`` as ``one`` gives the one dataset it names (None: it names none of ``one``'s kind), else each part of a
    ``+``-joined spec as ``one`` gives it (as it is where None): what :func:`dgrpo.data.load_spec` reads, in its
    order, a path, else parts joined by ``+``. Built-in specs, and a joined spec whose new parts would hold a ``+``
    (read as another join), as typed."""
    whole = one(spec)
    if whole is not None:
        return whole
    if "+" not in spec or spec.startswith("builtin"):
        return spec
    parts = [(one(part.strip()) or part.strip()) if part.strip() else part for part in spec.split("+")]
    joined = "+".join(parts)
    return joined if len(parts) == len(joined.split("+")) else spec


def absolute_data_specs(data: dict) -> dict:
    """A config dict's ``data`` section with its ``train`` and ``valid`` specs made absolute, as a run records them
    (:func:`absolute_data_spec`; ``''`` and non-text values as they are; ``test`` as typed: its specs name results)."""
    keep = dict(data)
    for key in ("train", "valid"):
        if isinstance(keep.get(key), str) and keep[key]:
            keep[key] = absolute_data_spec(keep[key])
    return keep


def start_folders(checkpoint: Path) -> list[Path]:
    """The folders the processes of the run that wrote ``checkpoint`` (its ``final/``, ``best/``, ``stage-K/``, or a
    resumable ``checkpoints/step-N/model``) started in, as the run's ``applied.json`` records them (``started_in``),
    the latest first; for ``step-N``, only those of the processes that started before step N (the one that wrote it
    first). None (``[]``) for a checkpoint outside a run directory (one copied elsewhere), or a run recorded before
    ``started_in`` was."""
    step = STEP_DIR.fullmatch(checkpoint.parent.name)
    if checkpoint.name == "model" and step and checkpoint.parent.parent.name == CHECKPOINTS_DIR:
        run, before = checkpoint.parents[2], int(step.group(1))
    elif checkpoint.name in (FINAL_DIR, BEST_DIR) or STAGE_DIR.fullmatch(checkpoint.name):
        run, before = checkpoint.parent, None
    else:
        return []
    try:
        entries = json.loads((run / APPLIED_FILE).read_text())
    except (OSError, ValueError):  # (none: a hint only, the working directory comes first anyway)
        return []
    folders: list[Path] = []
    for entry in reversed(entries if isinstance(entries, list) else []):
        if not isinstance(entry, dict) or not isinstance(entry.get("started_in"), str):
            continue
        at = entry.get("started_at_step")
        if before is not None and isinstance(at, int) and at >= before:  # (started after that checkpoint was written)
            continue
        folder = Path(entry["started_in"])
        if folder.is_absolute() and folder not in folders:
            folders.append(folder)
    return folders


def data_spec_from(spec: str, folders: list[Path]) -> str:
    """``spec`` with each relative path that names nothing from the working directory made absolute in the first of
    ``folders`` where it names a local file or folder (each part of ``a.jsonl+b.csv`` on its own:
    :func:`_each_dataset`); built-in and hub names, absolute paths and parts found from here as they are (the working
    directory first)."""
    from ..data import local_path

    if not folders or spec.startswith("builtin") or local_path(spec) is not None:
        return spec
    return _each_dataset(spec, lambda part: _part_from(part, folders))


def _part_from(part: str, folders: list[Path]) -> str | None:
    """One dataset of a spec (a path, ``PATH:SPLIT``): as it is when it names a local file or folder from here, else
    made absolute in the first of ``folders`` where it names one as :func:`dgrpo.data.load_spec` would read it from
    there (not a built-in dataset's name, which a plain folder of that name does not make local); else None."""
    from ..data import local_path
    from ..data.loaders import is_dataset_name
    from ..data.tables import is_hf_folder

    if local_path(part) is not None:
        return part
    if part.startswith("builtin") or expand_home(part).is_absolute():
        return None
    for folder in folders:
        there = local_path(str(folder / part))
        if there is None:
            continue
        path = Path(there[0])
        named = is_dataset_name(str(path.relative_to(folder)))  # (from that folder, read as the dataset it names)
        if named and not (path.is_file() or is_hf_folder(path)):
            continue
        return f"{path}:{there[1]}" if there[1] is not None else str(path)
    return None


#: keys a run's config takes from the model it loads (a hub commit, a chat template the model was trained with):
#: :func:`check_resume_config`, made before the model loads, leaves them to :class:`RunDir`'s check
LOAD_RESOLVED_KEYS = ("model.revision", "data.chat_template")


#: True while the command line runs a trainer (:func:`command_line_words`): a run directory's refusals then name the
#: command line's options only, not the Python API's arguments beside them
_COMMAND_LINE: ContextVar[bool] = ContextVar("dgrpo_command_line", default=False)


@contextmanager
def command_line_words() -> Iterator[None]:
    """Within the block (``dgrpo sft`` / ``dgrpo grpo`` calling its trainer), :class:`RunDir`'s refusals say
    ``--resume never`` and ``--allow-config-change``, without ``resume='never'`` / ``allow_config_change=True``."""
    token = _COMMAND_LINE.set(True)
    try:
        yield
    finally:
        _COMMAND_LINE.reset(token)


#: how to start a run over, and to resume it under a changed config: (the command line's option, the Python API's)
START_OVER = ("--resume never", "resume='never'")
ALLOW_CHANGE = ("--allow-config-change", "allow_config_change=True")


def _quiet(message: str) -> None:
    """A log that says nothing (a rank other than 0's)."""


def check_resume_config(
    out_dir: Path | str, cfg: Config, command: str, resume: str = "auto", allow_config_change: bool = False
) -> None:
    """``dgrpo sft`` / ``dgrpo grpo``'s refusal of a resume under a changed config (or of another command's
    checkpoints), made from the run directory alone before any dataset is read or the model loaded (at the paper's
    scale those take minutes, and the refusal came after them), in the command line's words. The keys a run takes from
    its model (:data:`LOAD_RESOLVED_KEYS`) are left to :class:`RunDir`'s check, after the model loads."""
    ResumeCheck(out_dir, to_dict(cfg), command, resume, allow_config_change, log=_quiet, cli=True).before_loading()


class ResumeCheck:
    """What a resume is checked against from the run directory alone (its ``config.json``, its checkpoints' state
    and recorded configs): the command that wrote the checkpoints and the config the run was started with.
    :class:`RunDir` makes these checks with the lock held; :func:`check_resume_config` makes them before the data and
    the model are read. ``cli``: the refusals name the command line's options only (``--resume never``,
    ``--allow-config-change``), not the Python API's arguments beside them."""

    def __init__(
        self,
        out_dir: Path | str,
        cfg: dict,
        command: str,
        resume: bool | str = "auto",
        allow_config_change: bool = False,
        log: Callable[[str], None] = print,
        cli: bool = False,
    ):
        self.out_dir, self.cfg, self.command, self.log, self.cli = Path(out_dir), cfg, command, log, cli
        self.resume_mode = {True: "auto", False: "never"}[resume] if isinstance(resume, bool) else resume
        self.allow_config_change = allow_config_change
        self.changed: list[str] = []
        self.first_config: dict = self.cfg  # the config the run was started with (differs: allow_config_change)
        self.candidates: list[Path] = []
        self.ignored: tuple[str, ...] = ()  # keys the config check leaves to a later one

    def before_loading(self) -> None:
        """The checks a resume needs no data and no model for: the command that wrote the checkpoints, and the
        config (but :data:`LOAD_RESOLVED_KEYS`, which the model may set); nothing when there is nothing to resume."""
        self.candidates = self._candidates()
        if not self.candidates:
            return
        self._check_command()
        self.ignored = LOAD_RESOLVED_KEYS
        self._check_config()

    def _option(self, cli: str, api: str) -> str:
        """How to ask for something: the command line's option ``cli``, and for a Python caller its argument ``api``
        too (``--resume never (resume='never')``)."""
        return cli if self.cli else f"{cli} ({api})"

    def _candidates(self) -> list[Path]:
        if self.resume_mode == "never":
            return []
        if self.resume_mode == "auto":
            return resume_candidates(self.out_dir)
        path = on_disk(self.resume_mode)  # (checkpoints/step-N as written: step-0000000N)
        if path.exists() and not path.is_dir():  # (it was told "no such checkpoint directory", as a missing one is)
            raise ConfigError(f"--resume {path} is a file: name a checkpoint directory (OUT/checkpoints/step-N)")
        if not path.is_dir():
            raise ConfigError(f"--resume {path}: no such checkpoint directory")
        if not (path / RESUMABLE_STATE).exists() and (path / CHECKPOINTS_DIR).is_dir():
            newest = resume_candidates(path)
            raise ConfigError(
                f"--resume {path} is a run directory: name one of its checkpoints"
                + (f" (the newest: {newest[0]})" if newest else f" (it has none in {path / CHECKPOINTS_DIR})")
            )
        if not (path / RESUMABLE_STATE).exists() and is_model_dir(path):
            raise ConfigError(
                f"--resume {path} is a model (weights without the optimizer and data state): --init {path} starts "
                "a new run from it; --resume takes a run's checkpoints/step-N"
            )
        return [path]

    @property
    def explicit(self) -> bool:
        """Resuming from one named checkpoint (``--resume PATH``), not the newest of this directory's."""
        return self.resume_mode not in ("auto", "never")

    def _changed_keys(self, old: dict) -> list[str]:
        """The keys a resume compares that differ between ``old`` and this run's config: not those this command never
        reads, nor the built-in model's shape when the run loads a model."""
        unread = UNREAD_BY.get(self.command, ())
        loads = self.cfg.get("model", {}).get("name_or_path") != BUILTIN
        if isinstance(old.get("data"), dict):  # (dgrpo up to 2026-12-04 recorded data paths as typed: relative ones
            old = {**old, "data": absolute_data_specs(old["data"])}  # name, from here, what this run reads)
        return [
            k
            for k in config_diff(old, self.cfg)
            if not k.startswith(unread) and not (loads and k in BUILTIN_SHAPE_KEYS) and k not in self.ignored
        ]

    def _check_command(self) -> None:
        """Refuse another command's checkpoints (an SFT run's directory given to ``dgrpo grpo``, or the reverse):
        they are not damaged, and starting over there would delete them."""
        self._refuse_command(next((c for c in map(checkpoint_command, self.candidates) if c is not None), None))

    def _written_by(self) -> str | None:
        """Which command (``sft``, ``grpo``) wrote the run in OUT: its checkpoints say, else (none left) what only
        one command writes (SFT's stage-K/, GRPO's summary and rollouts), else its metrics rows (SFT's name their
        curriculum stage, GRPO's their reward); None when nothing says."""
        out = self.out_dir
        found = next((c for c in map(checkpoint_command, resume_candidates(out)) if c is not None), None)
        if found is None and any(p.is_dir() for p in stage_dirs(out)):
            found = "sft"
        if found is None and ((out / SUMMARY_FILE).is_file() or (out / ROLLOUTS_FILE).is_file()):
            found = "grpo"
        try:
            lines = (out / METRICS_FILE).read_text().splitlines() if found is None else []
        except OSError:
            lines = []
        for line in lines:
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and ("reward_mean" in row or "stage" in row):
                return "grpo" if "reward_mean" in row else "sft"
        return found

    def _refuse_command(self, found: str | None) -> None:
        """ConfigError when ``found`` (the command that wrote the checkpoints or run here) is not this one."""
        if found is None or found == self.command:
            return
        where = f"--resume {self.candidates[0]} is" if self.explicit else f"{self.out_dir} holds"
        source = self.candidates[0] if self.explicit else self.out_dir  # (a named checkpoint, or this run's)
        start = f"; to start from its model: --init {source}" if (found, self.command) == ("sft", "grpo") else ""
        what = "run's checkpoint" if self.explicit or resume_candidates(self.out_dir) else "run"
        deletes = " (--resume never would delete it)" if self.resume_mode == "never" else ""
        raise ConfigError(
            f"{where} a `dgrpo {found}` {what}, which `dgrpo {self.command}` cannot resume{deletes}: name a new "
            f"--out{start}"
        )

    def _started_with(self) -> dict | None:
        """The config the resumed run was started with: this directory's, else (a new directory resuming a named
        checkpoint, or a run whose config.json was deleted) the one the checkpoint to resume (the newest) was trained
        with."""
        path = self.out_dir / CONFIG_FILE
        if not path.is_file():
            path = self.candidates[0] / "model" / RUN_CONFIG_FILE
            if not path.is_file():
                return None
            if not self.explicit:
                self.log(f"dgrpo: {self.out_dir / CONFIG_FILE} is missing: checking the config against {path}")
        return self._read_config(path)

    @staticmethod
    def _read_config(path: Path) -> dict:
        """A config file's JSON (ConfigError when it cannot be read)."""
        try:
            found = json.loads(path.read_text())
        except (OSError, ValueError):
            raise ConfigError(f"{path}: unreadable (not the JSON of a config)") from None
        if not isinstance(found, dict):
            raise ConfigError(f"{path}: unreadable (not the JSON of a config)")
        return found

    def _check_config(self) -> None:
        """Refuse to resume under a changed config (unless allowed: then keep every config with its start step). A
        LoRA run's :data:`ADAPTER_KEYS` are left to :func:`~.checkpoint.check_same_adapter`, their change kept in the
        config history."""
        old = self._started_with()
        if old is None:
            return
        changed = self._changed_keys(old)
        what = f"--resume {self.candidates[0]} is from" if self.explicit else f"{self.out_dir} holds"
        self._check_same_kind_of_training(old, what)
        self._check_same_master_weights(old, what)
        refused = [k for k in changed if not (self.cfg["model"]["lora"]["r"] and k in ADAPTER_KEYS)]
        if refused and not self.allow_config_change:
            then = old.get("model", {}).get("revision") if "model.revision" in refused else None
            pin = f" (the run loaded its model at commit {then}: --set model.revision={then})" if then else ""
            never, allow = self._option(*START_OVER), self._option(*ALLOW_CHANGE)
            raise ConfigError(
                f"{what} a run started with a different config ({', '.join(refused[:8])}"
                f"{', ...' if len(refused) > 8 else ''}); resume it unchanged{pin}, start over with {never}, or pass "
                f"{allow} to continue with the new values (every config used is kept)"
            )
        self.changed = changed
        self.first_config = old

    def _check_same_kind_of_training(self, old: dict, what: str) -> None:
        """A LoRA run's checkpoints hold its adapter, a full run's the whole model: a resume that switches
        ``model.lora.r`` between 0 and more is refused in one line, even with allow_config_change (its checkpoints
        were skipped one by one as damaged, and the line advised --resume never)."""
        then = int(old.get("model", {}).get("lora", {}).get("r", 0) or 0)
        now = int(self.cfg.get("model", {}).get("lora", {}).get("r", 0) or 0)
        if (then > 0) == (now > 0):
            return
        trained = f"a LoRA adapter (model.lora.r={then})" if then else "every weight (model.lora.r=0)"
        held = "the adapter" if then else "the whole model"
        raise ConfigError(
            f"{what} a run that trains {trained}, and its checkpoints hold {held}: resume it with model.lora.r={then} "
            f"(to train {'every weight' if then else 'an adapter'} from it, start a new run with --init on its final/ "
            "or a checkpoint)"
        )

    def _check_same_master_weights(self, old: dict, what: str) -> None:
        """A bf16 run's checkpoints hold float32 masters in their optimizer state, or none: switching
        ``model.master_weights`` on resume is refused, even with allow_config_change (masters made before the
        checkpoint loaded, or left from it, would put the weights back where they stood)."""
        then, now = (bool(c.get("model", {}).get("master_weights", False)) for c in (old, self.cfg))
        dtypes = {c.get("model", {}).get("dtype", "float32") for c in (old, self.cfg)}
        if then == now or dtypes == {"float32"}:
            return
        raise ConfigError(
            f"{what} a run with model.master_weights={str(then).lower()}, and its checkpoints' optimizer state holds "
            f"{'float32 masters' if then else 'no masters'}: resume it with model.master_weights={str(then).lower()} "
            "(to train on with the other setting, start a new run with --init on its final/ or a checkpoint)"
        )


class RunDir(ResumeCheck):
    """A run's output directory: locked for this run, ``config.json`` (with its history when a resumed run was
    allowed to change it), the metrics log, and the checkpoint to resume from.

    ``resume``: ``auto`` (the newest intact checkpoint in ``OUT/checkpoints``, falling back to older ones on any
    problem; a fresh start when there is none), ``never`` (start over: what an earlier run wrote is deleted) or the path
    of one checkpoint directory to resume from. Resuming with a config that differs from the one the run was
    started with (``config.json``, or the named checkpoint's for a new directory) is refused (one line listing the
    keys) unless ``allow_config_change``; so is resuming another command's checkpoints (``command``: sft, grpo)."""

    def __init__(
        self,
        out_dir: Path,
        cfg: Config,
        dist: Dist,
        command: str,
        *,
        resume: bool | str = "auto",
        allow_config_change: bool = False,
        log: Callable[[str], None] = print,
    ):
        quiet = log if dist.is_main else _quiet
        super().__init__(out_dir, to_dict(cfg), command, resume, allow_config_change, quiet, _COMMAND_LINE.get())
        self.dist, self.logging = dist, cfg.logging
        self.created = dist.is_main and not self.out_dir.exists()  # (by this run: removed if refused, still empty)
        self.lock = self._lock()
        self.metrics = MetricsLog(self.out_dir / METRICS_FILE, dist.is_main)
        self.checkpoint: Path | None = None
        self.base_now: str | None = None  # a resumed LoRA run's local base, where it is now (:meth:`_adopt_base`)
        self.resumed_step: int | None = None  # the step this process resumed at (None: started fresh)
        self.applied_step = 0  # the step of this process's entry of applied.json (:meth:`start`)
        self.restarted = False  # an unfinished run without checkpoints, started over under another config
        try:
            self.candidates = self._candidates()
            if self.explicit:
                self._on_rank0(self._check_fork)
            if self.resume_mode == "never":
                self._on_rank0(self._check_start_over)
            if self.candidates:
                self._on_rank0(self._check_command)
                self._on_rank0(self._check_config)
            elif self.resume_mode == "auto":
                self._on_rank0(self._check_not_finished)
                self._on_rank0(self._warn_if_restarted_under_another_config)
        except BaseException:
            self.close(1)  # a refused run releases the directory at once
            raise
        if dist.is_main:  # half-written checkpoints of a killed run (it held the lock: nobody else writes them)
            for tmp in (self.out_dir / CHECKPOINTS_DIR).glob(".tmp-*"):
                shutil.rmtree(tmp, ignore_errors=True)
            self._clean_leftovers(restore=self.resume_mode != "never")
        if (self.resume_mode == "never" or self.restarted) and dist.is_main:
            self._start_over()

    def _clean_leftovers(self, restore: bool, checkpoints_only: bool = False) -> None:
        """What a killed run's atomic writes (:func:`~dgrpo.model.verified.atomic_dir`) of final/, best/ or stage-K/
        left in OUT, and of a checkpoint replaced in OUT/checkpoints (the lock is held: nobody else writes them):
        ``.tmp-NAME-PID`` (half written, or complete but never published) is removed; ``.old-NAME-PID`` (the copy a
        replace moved aside) is removed, or, with ``restore`` (not under ``--resume never``, which removes the
        earlier run's folders next), moved back to NAME when the kill came before the new one took its place. Only
        those names; nothing else is touched. ``checkpoints_only``: only the restoring, in OUT/checkpoints (once the
        lock is taken, before the run lists its checkpoints: a step-N moved aside is one to resume)."""
        places = (
            [self.out_dir / CHECKPOINTS_DIR] if checkpoints_only else [self.out_dir, self.out_dir / CHECKPOINTS_DIR]
        )
        for path in sorted(p for place in places if place.is_dir() for p in place.iterdir()):
            found = LEFTOVER.fullmatch(path.name)
            if found is None or not path.is_dir() or path.is_symlink():
                continue
            kind, name = found.groups()
            target = path.parent / name
            if restore and kind == "old" and not target.exists() and (path / MANIFEST).is_file():
                path.rename(target)
                self.log(f"dgrpo: {target} was being replaced when a run was killed: its earlier copy is restored")
            elif not checkpoints_only:
                shutil.rmtree(path, ignore_errors=True)

    def _start_over(self) -> None:
        """``--resume never`` (or a run restarted under another config): remove what an earlier run wrote here (its
        checkpoints, best/, final/, stage-K/, test results, config history, summary, logs), so that nothing left of
        it reads as this run's output."""
        found = [self.out_dir / name for name in RUN_WRITES if (self.out_dir / name).exists()]
        found += stage_dirs(self.out_dir) + config_history(self.out_dir)
        for path in found:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        if found:
            names = ", ".join(p.name for p in found)
            why = "--resume never" if self.resume_mode == "never" else "started over under another config"
            self.log(f"dgrpo: {why}: removed the earlier run's {names} in {self.out_dir}")

    def _lock(self) -> RunLock | None:
        """Rank 0 checks the directory and takes the lock (every rank learns whether it could)."""
        found: list[RunLock] = []

        def take() -> None:
            check_output_dir(self.out_dir)
            self._check_owned()  # (before the lock file: nothing is written into a directory that is refused)
            found.append(RunLock(self.out_dir))
            if self.resume_mode != "never":
                self._clean_leftovers(restore=True, checkpoints_only=True)

        self._on_rank0(take)
        return found[0] if found else None

    def _on_rank0(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` on rank 0; if it raises ConfigError (or CheckpointError), every rank raises it (all fail
        together, none hangs)."""
        problem: Exception | None = None
        if self.dist.is_main:
            try:
                fn()
            except (ConfigError, CheckpointError) as e:
                problem = e
        if self.dist.sum_int(int(problem is not None)):
            raise problem or ConfigError(f"{self.out_dir}: the run directory cannot be used (see rank 0's error)")

    def _check_fork(self) -> None:
        """``--resume PATH`` with PATH outside ``OUT/checkpoints`` (a fork of another run's checkpoint) into an OUT
        that already holds checkpoints of its own (the fork was stopped, and the same command given again) is refused:
        it would go back to PATH, run the fork's steps again over its own metrics rows and best/. A rewind to one of
        OUT's own checkpoints stays allowed."""
        own = resume_candidates(self.out_dir)
        named = self.candidates[0].resolve()
        if not own or named.is_relative_to((self.out_dir / CHECKPOINTS_DIR).resolve()):
            return
        raise ConfigError(
            f"--resume {self.candidates[0]} is another run's checkpoint, and {self.out_dir / CHECKPOINTS_DIR} holds "
            f"this run's own (the newest: {own[0].name}): drop --resume to continue from {own[0]}, or name a new "
            f"--out (or remove {self.out_dir / CHECKPOINTS_DIR}) to start from {self.candidates[0]}"
        )

    def _check_start_over(self) -> None:
        """``--resume never`` deletes what an earlier run wrote here: never another command's run (its checkpoints
        say whose it is), nor the model this run starts from (``--init`` inside OUT)."""
        self._refuse_command(self._written_by())
        self._refuse_deleting_init("--resume never")

    def _refuse_deleting_init(self, what: str) -> None:
        """ConfigError when the model this run starts from (``--init``) is inside OUT, which ``what`` would empty."""
        init = Path(str(self.cfg.get("model", {}).get("name_or_path", "")))
        if init.is_absolute() and init.resolve().is_relative_to(self.out_dir.resolve()):
            raise ConfigError(
                f"{what} would delete {init}, the model this run starts from (--init): name another --out"
            )

    def _check_owned(self) -> None:
        """Refuse an ``--out`` holding what no dgrpo run wrote, before anything is written there: a model directory
        (config.json beside its weights: a run would write its config.json over the model's, and a later
        ``--model`` would mean its final/), a config.json that is not a dgrpo run's, final/, best/ or stage-K/
        folders that are not dgrpo checkpoints, or other things in checkpoints/ (a run replaces those folders, and
        ``--resume never`` deletes them)."""
        out = self.out_dir
        if not out.is_dir():
            return
        new = "name a new --out"
        if is_model_dir(out):
            raise ConfigError(f"--out {out} is a model directory (config.json beside its weights): {new}")
        config = out / CONFIG_FILE
        if config.is_file() and not is_run_config(config):
            raise ConfigError(f"--out {out}: its {CONFIG_FILE} is not a dgrpo run's config: {new}")
        stages = stage_dirs(out)
        for folder in [out / FINAL_DIR, out / BEST_DIR, *stages]:
            if folder.exists() and not (folder / MANIFEST).is_file():
                raise ConfigError(f"--out {out}: {folder} is not a checkpoint dgrpo wrote (no {MANIFEST}): {new}")
        root = out / CHECKPOINTS_DIR
        stray = [p.name for p in root.iterdir() if not (p.is_dir() and "step-" in p.name)] if root.is_dir() else []
        if stray:
            raise ConfigError(f"--out {out}: {root} holds {', '.join(sorted(stray)[:3])}, not dgrpo checkpoints: {new}")
        signs = [config, out / FINAL_DIR, out / BEST_DIR, root, *stages]
        if not any(p.exists() for p in signs) and not _metrics_of_a_run(out / METRICS_FILE):
            names = [name for name in (*RUN_WRITES, METRICS_FILE) if (out / name).exists()]
            if names:
                raise ConfigError(
                    f"--out {out} holds {', '.join(names)} but no dgrpo run (no {CONFIG_FILE}, no checkpoint, no "
                    f"metrics rows of one): a run writes over files of those names and --resume never deletes them: "
                    f"{new}"
                )

    def _check_not_finished(self) -> None:
        """A finished run (final/) whose checkpoints are gone (deleted to save space) is not trained again from step 0
        over its results, under the same config or a changed one, without being asked."""
        if (self.out_dir / FINAL_DIR).is_dir():
            raise ConfigError(
                f"{self.out_dir} holds a finished run ({FINAL_DIR}/) and no checkpoint to resume: its model is "
                f"{self.out_dir / FINAL_DIR}; to train it again, --resume never (removes its results) or a new --out"
            )

    def _warn_if_restarted_under_another_config(self) -> None:
        """An unfinished run with no checkpoint (killed before its first, or its checkpoints/ deleted) starts over;
        under a changed config with a warning that names the keys, and what the earlier run wrote (its best/,
        stage-K/, ...) is removed as ``--resume never`` removes it (its config.json and metrics.jsonl were replaced
        without a word, and its best/ kept beside them). Not refused, as nothing that can be resumed is lost (a rerun
        after an out-of-memory error at the first step changes a batch setting, as that error's line advises);
        another command's run is."""
        path = self.out_dir / CONFIG_FILE
        if not path.is_file():
            return
        changed = self._changed_keys(self._read_config(path))
        if changed:
            self._refuse_command(self._written_by())
            self._refuse_deleting_init(f"starting {self.out_dir}'s unfinished run over under another config")
            warnings.warn(
                f"{self.out_dir} holds a run started with a different config ({', '.join(changed[:8])}"
                f"{', ...' if len(changed) > 8 else ''}) and no checkpoint to resume: it starts over under this one, "
                "removing what that run wrote",
                stacklevel=2,
            )
            self.restarted = True

    def resume(self, load: Callable[[Path], LoadedCheckpoint]) -> LoadedCheckpoint | None:
        """Read the newest checkpoint that loads (``load`` reads and checks one, mutating nothing); each one that
        does not is reported in one line. None for a fresh start; an error when checkpoints exist but none loads."""
        problems, skipped = [], []
        for ckpt in self.candidates:
            try:
                loaded = load(ckpt)
            except CheckpointError as e:
                if self.explicit:  # the one checkpoint named: nothing to fall back to
                    raise CheckpointError(f"--resume {ckpt}: {e}") from None
                problems.append(f"{ckpt.name}: {e}")
                skipped.append(ckpt)
                self.log(f"dgrpo: skipping checkpoint {ckpt}: {e}; falling back to the previous one")
                continue
            self.checkpoint = ckpt
            self._move_aside(skipped)
            self.base_now = loaded.base
            return loaded
        if problems:
            raise CheckpointError(
                f"no checkpoint in {self.out_dir} can be resumed ({'; '.join(problems[:3])}); "
                f"start over with {self._option(*START_OVER)}"
            )
        return None

    def _adopt_base(self, base: str | None) -> None:
        """A resumed LoRA run on its base's weights in another place (``base``: the local base loaded now, checked by
        :func:`~.checkpoint.check_same_local_base`): the run's adapter folders are pointed there
        (:func:`~.checkpoint.repoint_run_adapters`), once every rank has read the checkpoint and the resume passed its
        checks (:meth:`start`: a refused resume writes nothing)."""
        if base is None:
            return
        self.dist.sum_int(0)  # (rank 0 may replace the checkpoint's folder: every rank has read it)
        self._on_rank0(lambda: repoint_run_adapters(self.out_dir, base, self.log))

    def check_same_data(self, saved: str | None, given: str) -> None:
        """Refuse to resume on other training data than the checkpoint was trained on (``saved`` and ``given``:
        :func:`~dgrpo.data.records.fingerprint`), unless ``allow_config_change`` (:meth:`refuse_unrecorded_change`).
        A checkpoint written before dgrpo recorded its data (``saved`` None) is not checked."""
        if saved is None or saved == given:
            return
        (n_saved, _, _), (n_given, _, _) = saved.partition(":"), given.partition(":")
        what = f"{n_saved} records, now {n_given}" if n_saved != n_given else f"{n_given} records as now, other ones"
        self.refuse_unrecorded_change(f"trained on other training data than given now ({what})", "the same data")

    def refuse_unrecorded_change(self, what: str, keep: str) -> None:
        """A resume on what the config does not hold but the checkpoint recorded (the training data, a reward given
        from Python), changed since (``what``: how): refused in one line naming ``keep``, unless
        ``allow_config_change``: then it goes on, and says so."""
        if not self.allow_config_change:
            never, allow = self._option(*START_OVER), self._option(*ALLOW_CHANGE)
            raise ConfigError(
                f"{self.checkpoint} was {what}: resume with {keep}, start over with {never}, or pass {allow} to go on"
            )
        self.log(f"dgrpo: resuming {self.checkpoint}, {what}")

    def _move_aside(self, skipped: list[Path]) -> None:
        """Rename the newer checkpoints a resume skipped to ``damaged-step-N`` (kept to look at, no longer a
        checkpoint of the run): the run writes those steps again, and one without its manifest may not be replaced
        (:func:`~dgrpo.model.verified.check_replaceable`), which stopped every later try at that step."""
        if not self.dist.is_main:
            return
        for ckpt in skipped:
            aside, n = ckpt.with_name(f"damaged-{ckpt.name}"), 1
            while aside.exists():
                n += 1
                aside = ckpt.with_name(f"damaged-{ckpt.name}-{n}")
            try:
                ckpt.rename(aside)
            except OSError as e:  # (gone, or not ours to move: the save of that step says so in one line)
                self.log(f"dgrpo: could not move the skipped checkpoint {ckpt} aside: {e}")
                continue
            self.log(f"dgrpo: moved the skipped checkpoint {ckpt.name} aside to {aside}")

    def record_applied_at_end(self, applied: dict[str, Any]) -> None:
        """This process's entry of ``applied.json`` written again with ``applied`` as at the run's end (what changed
        since :meth:`start`: a compiler's fallback); rank 0 writes it."""
        if self.dist.is_main:
            record_applied(self.out_dir / APPLIED_FILE, self.applied_step, applied)

    def stop_after_step(self, applied: dict[str, Any], error: TrainingStopped | None = None) -> NoReturn:
        """Stop the run after a step (its checkpoint written, if it has one): this process's entry of ``applied.json``
        first written again with ``applied`` as at the run's end (:meth:`record_applied_at_end`: the resume and the
        record agree), then ``error`` raised (a tripped non-finite guard, weights made non-finite, a stall: every rank
        meets it at once), else a SIGTERM's stop; under torchrun every rank first waits for rank 0's writes
        (:func:`~.preemption.stop`)."""
        self.record_applied_at_end(applied)
        stop(self.dist, error)

    def start(self, resumed_state: dict | None, applied: dict[str, Any] | None = None) -> None:
        """A resumed LoRA run's adapter folders first pointed to its base's new place (:meth:`_adopt_base`); then
        write ``config.json`` (and its history) and ``applied`` (what the trainer applied, as resolved: an entry of
        ``applied.json``, :func:`~.applied.record_applied`), open the metrics log (keeping the resumed checkpoint's
        rows, or starting empty) and the trackers, say where metrics go and that we resumed."""
        trackers: list[Tracker] = []
        if resumed_state is not None:
            self._adopt_base(self.base_now)
        if self.dist.is_main:
            self._drop_abandoned_checkpoints()
            step = resumed_state["step"] if resumed_state is not None else 0
            if resumed_state is not None and self.changed:
                self._keep_config_history(step)
            (self.out_dir / CONFIG_FILE).write_text(json.dumps(self.cfg, indent=2))
            self.applied_step = step
            if applied is not None:
                if resumed_state is not None:
                    warn_if_plugins_changed(self.out_dir / APPLIED_FILE, step, applied)
                record_applied(self.out_dir / APPLIED_FILE, step, applied)
            lg = self.logging
            trackers = open_trackers(
                lg.backends,
                self.out_dir,
                config=self.cfg,
                project=lg.project,
                entity=lg.entity,
                run_name=lg.run_name,
                resume=resumed_state is not None,
            )
            self.log(describe_backends(lg.backends, trackers, self.out_dir / METRICS_FILE))
            if resumed_state is not None:
                self._warn_if_rows_lost(resumed_state["metrics_lines"])
        self.metrics.open(resumed_state["metrics_lines"] if resumed_state is not None else None, trackers)
        if self.dist.is_main:  # rollouts.jsonl: keep the rows of the steps before the resumed one
            keep_before = resumed_state["step"] if resumed_state is not None else 0
            rows = self.rollouts_path.read_text().splitlines() if self.rollouts_path.is_file() else []
            kept = rollout_rows_before(rows, keep_before, self.rollouts_path)
            if rows or kept:
                self.rollouts_path.write_text("".join(r + "\n" for r in kept))
        if self.checkpoint is not None and resumed_state is not None:
            self.resumed_step = resumed_state["step"]
            self.log(f"dgrpo: resumed from {self.checkpoint} (step {resumed_state['step']})")
            written_by = resumed_state.get("world_size")  # (None: a checkpoint from before dgrpo recorded it)
            if written_by is not None and written_by != self.dist.world_size:
                self.log(
                    f"dgrpo: the checkpoint was written by {written_by} process(es) and is resumed by "
                    f"{self.dist.world_size}: the run goes on a float rounding away from one that kept {written_by} "
                    "(the same data order and seeds; summation order differs)"
                )

    def _drop_abandoned_checkpoints(self) -> None:
        """A rewind (``--resume OUT/checkpoints/step-N``, one of this run's own) removes this run's checkpoints newer
        than N: the resumed run writes those steps anew, and a stop before it did left them as the newest, which the
        same command without ``--resume`` (as the stop's line advised) resumed: the abandoned steps' weights, under
        the metrics rows and config of the rewound ones, the rows between them lost. Each is renamed to a temporary
        name first (removed at a run's start), so that a stop during its removal leaves no half checkpoint."""
        if not self.explicit or self.checkpoint is None:
            return
        root = self.out_dir / CHECKPOINTS_DIR
        if not root.is_dir() or not self.checkpoint.resolve().is_relative_to(root.resolve()):
            return
        newer = [c for c in list_checkpoints(self.out_dir) if c.name > self.checkpoint.name]
        for ckpt in newer:
            remove_dir(ckpt)
        if newer:
            names = ", ".join(c.name for c in newer)
            self.log(
                f"dgrpo: rewound to {self.checkpoint.name}: removed this run's later checkpoints {names} (the run "
                "writes those steps anew)"
            )

    def best_record(self) -> str | None:
        """What identifies the run's ``best/`` now: the sha256 of its manifest (which lists its files' digests), or
        None without one. Each resumable checkpoint's state records it, so that a resume knows whether ``best/`` is
        still the one the checkpoint's run had (:meth:`drop_stale_best`)."""
        manifest = self.out_dir / BEST_DIR / MANIFEST
        return hashlib.sha256(manifest.read_bytes()).hexdigest() if manifest.is_file() else None

    def drop_stale_best(self, state: dict) -> bool:
        """On a resume from the checkpoint state ``state``: whether ``best/`` was written after that checkpoint, by
        steps the resumed run abandons (a rewind to an earlier checkpoint; a stop after ``best/`` was written, before
        the next checkpoint, resumed under another config). Then it is removed (rank 0), with a line: its weights
        were not the best the checkpoint recorded (that one was replaced on disk), so the resumed run's report and
        summary named another step or epoch than the model in ``best/``. The trainer then chooses ``best/`` anew
        among the evaluations from the resumed step on. Every rank gets rank 0's answer. A checkpoint written
        before dgrpo recorded its ``best/`` is not checked (False)."""
        stale = False
        if self.dist.is_main and "best" in state:
            now = self.best_record()
            stale = now is not None and now != state["best"]
            if stale:
                remove_dir(self.out_dir / BEST_DIR)
                self.log(
                    f"dgrpo: removed {self.out_dir / BEST_DIR}: it was written after {self.checkpoint} (by the "
                    "steps this resume abandons); best/ is chosen anew from the resumed step on"
                )
        return self.dist.sum_int(int(stale)) > 0

    def _warn_if_rows_lost(self, keep: int) -> None:
        """A warning when this run's own checkpoint is resumed and ``metrics.jsonl`` holds fewer rows than the
        ``keep`` written before it (deleted, or cut): those rows are lost, the run goes on. (A fork of another run's
        checkpoint starts its own file: the parent's rows are not expected there.)"""
        own = self.checkpoint is not None and self.checkpoint.resolve().is_relative_to(self.out_dir.resolve())
        have = count_lines(self.metrics.path)
        if own and have < keep:
            state = "is missing" if not self.metrics.path.is_file() else f"holds {have} rows"
            warnings.warn(
                f"{self.metrics.path} {state}, and {keep} were written before {self.checkpoint}: the rows before "
                "that checkpoint are lost (the run goes on, writing the rows from there)",
                stacklevel=2,
            )

    def _drop_earlier_finish(self) -> None:
        """The marks of an earlier end of this run (a finished run resumed to train more steps, or run again):
        summary.json and final/, removed before this end writes them anew, so that a stop in the test sets does not
        leave a final/ and a summary of fewer steps that read as this run's (``dgrpo eval --model OUT`` took that
        final/). final/ is first renamed to a leftover name (removed at a run's start, never restored), so that a
        stop during its removal leaves no final/ without its manifest. The test sets' results stay: each set's are
        replaced as it is evaluated again, and a set that is not (a failure's advice, a changed ``data.test``) keeps
        the only record of them."""
        summary, final = self.out_dir / SUMMARY_FILE, self.out_dir / FINAL_DIR
        found = [p.name for p in (summary, final) if p.exists()]
        summary.unlink(missing_ok=True)  # (first: the mark of a finished run)
        if final.is_dir():
            remove_dir(final)
        if found:
            names = " and ".join(found)
            them = "them" if len(found) > 1 else "it"
            self.log(f"dgrpo: removed the earlier end's {names} in {self.out_dir}: this run's end writes {them} anew")

    @property
    def same_command(self) -> str:
        """The command that goes on from the newest checkpoint, as the run's lines name it: under ``--resume never``
        or ``--resume PATH`` the same command would start over or go back to PATH (the command line's stop lines
        say so too: ``dgrpo.cli._resume_hint``)."""
        if self.resume_mode == "auto":
            return "the same command"
        return f"the same command without --resume {self.resume_mode}"

    @property
    def rollouts_path(self) -> Path:
        return self.out_dir / ROLLOUTS_FILE

    def final_eval(self, final_eval: FinalEval | None, lm: LatentLM, step: int, best: int | None) -> None:
        """The run's last metrics row, at ``step``: the metrics ``final_eval(lm, best)`` returns, called on every rank
        after the last step's resumable checkpoint and before ``final/`` (and GRPO's ``summary.json``), which the
        trainers write last: a run stopped in it (SIGTERM, Ctrl-C, SIGKILL) is not finished, and the same command
        resumes that checkpoint, trains no more, and calls it again. Rank 0's metrics are logged, to metrics.jsonl and
        the trackers (still open: a test set's accuracy reaches TensorBoard and W&B too). One that fails (a scorer's
        error, out of memory) is preceded by a line that says what that leaves and how to go on.

        Under torchrun the ranks agree before it and after it whether a SIGTERM asked to stop (GRPO's last step
        validated and wrote its checkpoint after their last agreement), and stop there; from then on, writing the
        run's end, a SIGTERM lets it finish (:func:`~dgrpo.training.preemption.writing_the_end`, until
        :meth:`close`)."""
        if self.dist.is_main:
            self._drop_earlier_finish()
        end = f"{FINAL_DIR}/ and {SUMMARY_FILE}" if self.command == "grpo" else f"{FINAL_DIR}/"
        last = f"{end} come" if self.command == "grpo" else f"{end} comes"
        at_the_end = f"at the run's end, before {end} (the training is done and checkpointed)"
        with in_test_sets(self.same_command):
            stop_if_requested(self.dist, at_the_end)
            row = self._tested(final_eval, lm, best, last) if final_eval is not None else None
            stop_if_requested(self.dist, at_the_end)
        writing_the_end(end)
        if row and self.dist.is_main:
            self.metrics.write({"step": step, **row})

    def _tested(self, final_eval: FinalEval, lm: LatentLM, best: int | None, last: str) -> dict | None:
        """``final_eval(lm, best)``, what a stop in it leaves said by its message, and a failure's by a line first."""
        try:
            with stopping(f"in the test sets' evaluation (the training is done and checkpointed; {last} after them)"):
                return final_eval(lm, best)
        except Exception:
            if self.dist.is_main:  # (on stderr, before the error's own line)
                print(
                    f"dgrpo: the test sets' evaluation failed (below): the training is done and checkpointed in "
                    f"{self.out_dir / CHECKPOINTS_DIR}; {last} after the test sets: once they can run, "
                    f"{self.same_command} evaluates them (it trains no step), or --set 'data.test=[]' "
                    "--allow-config-change skips them",
                    file=sys.stderr,
                    flush=True,
                )
            raise

    def write_rollouts(self, rows: list[dict]) -> None:
        """Append rows to ``rollouts.jsonl`` (rank 0)."""
        if rows and self.dist.is_main:
            with open(self.rollouts_path, "a") as f:
                f.writelines(json.dumps(r) + "\n" for r in rows)

    def _keep_config_history(self, step: int) -> None:
        """``config.N.json``: every config the run used, with the step it started at (0 = the run's first)."""
        history = config_history(self.out_dir)
        if not history:
            first = self.first_config
            history = [config_history_file(self.out_dir, 0)]
            history[0].write_text(json.dumps({"started_at_step": 0, "config": first}, indent=2))
        kept = config_history_file(self.out_dir, int(history[-1].name.split(".")[1]) + 1)
        kept.write_text(json.dumps({"started_at_step": step, "config": self.cfg}, indent=2))
        self.log(f"dgrpo: config changed at step {step} ({', '.join(self.changed[:8])}); kept as {kept.name}")

    def close(self, exit_code: int = 0) -> None:
        """Close the metrics log and the trackers (marking a W&B run failed unless ``exit_code`` is 0); unlock. The run
        is over: a SIGTERM no longer waits for its end."""
        writing_the_end("")
        self.metrics.close(exit_code)
        if self.lock is not None:
            self.lock.release()
            self.lock = None
        if exit_code and self.created and [p.name for p in self.out_dir.iterdir()] == [LOCK_FILE]:
            shutil.rmtree(self.out_dir)  # a run refused before it wrote anything leaves no directory it made

    def __enter__(self) -> RunDir:
        return self

    def __exit__(self, kind: type | None, *exc: object) -> None:
        self.close(0 if kind is None else 1)


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
            f"{self.streak} {self.what} optimizer steps in a row had a non-finite loss or gradient (step {step}); "
            f"state saved in {saved_in}; check the data, or resume with a lower {self.lr_key} (--set "
            f"{self.lr_key}=... --allow-config-change)"
        )


def clip_gradients(params: list, max_norm: float) -> Any:
    """:func:`torch.nn.utils.clip_grad_norm_` (the 2-norm of the gradients of ``params`` together, scaled down to
    ``max_norm``; ``inf``: not clipped), with the norm summed in float32 when a gradient is of lower precision: a bf16
    run's norm was bf16 (3.9375, 2.859375: three significant digits, logged as ``grad_norm`` and clipped by).
    float32 and float64 gradients take torch's own path, unchanged. Returns the norm (a 0-dim tensor)."""
    import torch

    grads = [p.grad for p in params if p.grad is not None]
    if all(g.dtype in (torch.float32, torch.float64) for g in grads):
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    total = torch.linalg.vector_norm(torch.stack(list(torch._foreach_norm(grads, 2.0, dtype=torch.float32))), 2.0)
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return total


def weights_finite(params: list, dist: Dist) -> bool:
    """Whether every weight is finite (all ranks agree: under FSDP each holds a shard). One fused norm per call."""
    import torch

    local = (
        bool(torch.isfinite(torch.stack(torch._foreach_norm([p.detach() for p in params]))).all()) if params else True
    )
    return dist.sum_int(int(not local)) == 0


#: what the other ranks say when an evaluation failed on one rank's shard (that rank's own line says why)
EVALUATION_FAILED_ELSEWHERE = "the evaluation failed in another process (its own error line says why)"


def sharded_scores(
    dist: Dist, evaluate: Callable[[list[Record]], int | EvalResult], records: list[Record]
) -> dict[str, float]:
    """The validation metrics of ``records`` with each rank scoring its shard: ``accuracy``, and ``mean_score`` when
    ``evaluate(shard)`` returns an :class:`EvalResult` with one (a trainer's ``evaluate_fn``: how many of the shard's
    records are correct, an int, or their EvalResult). The counts and the scores' sums are summed over ranks (every
    rank calls this); ``mean_score`` is left out when a shard's result has none (a count). An evaluation that fails on
    one rank's shard (a scorer's error, a count that is none) stops every rank at that sum, each with one line."""
    local = dist.shard(records)
    try:
        count, scored = _checked_result(evaluate(local), len(local)) if local else (0, [])
    except Exception:
        dist.sum_ints([0, 1, 0])  # (the others learn of it at the sum below, and stop there too)
        raise
    count, failed, unscored = dist.sum_ints([count, 0, int(scored is None)])
    if failed:
        raise RewardError(EVALUATION_FAILED_ELSEWHERE)
    n = max(1, len(records))
    if unscored or not records:
        return {"accuracy": count / n}
    return {"accuracy": count / n, "mean_score": _gathered_mean(dist, scored, len(records))}


def _gathered_mean(dist: Dist, scored: list[float] | float | None, n: int) -> float:
    """The mean score of ``n`` records over every rank's shard (``scored``: its records' scores, or their sum where
    its result has no per-record scores). With every shard's scores, they are summed in the records' order, as one
    process sums them (:func:`~dgrpo.eval.evaluate.evaluate`'s ``mean_score``): N processes then keep the same
    best/ as one, bit for bit (a float all-reduce of the sums differed in the last bit). Otherwise the sums, in rank
    order."""
    parts = dist.all_gather_objects(scored)
    if all(isinstance(part, list) for part in parts):
        return ordered_mean([score for part in parts for score in part])
    return sum(sum(part) if isinstance(part, list) else float(part or 0.0) for part in parts) / n


def _checked_result(returned: Any, n: int) -> tuple[int, list[float] | float | None]:
    """(how many are correct, their scores) of what an ``evaluate_fn`` returned for a shard of ``n`` records: a count
    (:func:`_checked_count`; scores None), or the :class:`EvalResult` of those ``n`` records: each prediction row's
    ``score`` (:func:`evaluate`'s) where their mean is its ``mean_score``, else the sum ``mean_score`` * ``n`` (a
    result without rows), or None when its ``mean_score`` is None (no scores). TypeError otherwise."""
    if not isinstance(returned, EvalResult):
        return _checked_count(returned, n), None
    if returned.n != n:
        raise TypeError(
            f"evaluate_fn returned the EvalResult of {returned.n} records for the {n} it is given: evaluate every "
            "record (apply any limit beforehand)"
        )
    mean = returned.mean_score
    if mean is not None and not 0 <= mean <= 1:  # (NaN too)
        raise TypeError(f"evaluate_fn returned an EvalResult whose mean_score is {mean!r}, not in [0, 1]")
    if mean is None:
        return _checked_count(returned.correct, n), None
    scores = result_scores(returned)
    return _checked_count(returned.correct, n), float(mean) * n if scores is None else scores


def best_value(scores: dict[str, float], metric: str, key: str) -> float:
    """The value of one validation's ``scores`` (:func:`sharded_scores`) that ``best/`` is kept by: its ``metric``
    (``key``: ``grpo.best_metric`` or ``sft.best_metric``). ConfigError when it is ``mean_score`` and the
    ``evaluate_fn`` gave none (it returns a count)."""
    if metric not in scores:
        raise _no_best_metric(metric, key)
    return float(scores[metric])


def _no_best_metric(metric: str, key: str) -> ConfigError:
    """The refusal of ``key`` = ``metric`` (mean_score) for an ``evaluate_fn`` that returns a count."""
    return ConfigError(
        f"{key}={metric}: the evaluate_fn returns a count of correct records, which has no {metric}; return "
        f"evaluate(...)'s EvalResult (dgrpo.eval.evaluate), or set {key}=accuracy"
    )


def _checked_count(correct: Any, n: int) -> int:
    """``correct`` as the count of correct records of a shard of ``n`` (TypeError otherwise)."""
    try:
        count = operator.index(correct)  # an int (numpy's, or a 0-d integer tensor, too)
    except TypeError:
        count = -1
    if not 0 <= count <= n:
        raise TypeError(
            f"evaluate_fn returns how many of the {n} records it is given are correct (an int from 0 to "
            f"{n}), got {correct!r}" + (": an accuracy? return the count" if isinstance(correct, float) else "")
        )
    return count
