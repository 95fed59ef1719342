"""What a training run writes in its output directory (``OUT``): the one place that names its files and folders.

The trainers write them, ``--resume never`` removes them, and the CLI, the demo, the plots and the model loader
read them; each imports the names from here (this module imports nothing of dgrpo's)."""

from __future__ import annotations

import re
from pathlib import Path

CHECKPOINTS_DIR = "checkpoints"  # resumable training states: checkpoints/step-N
STEP_DIR = re.compile(r"step-(\d+)")  # a resumable checkpoint's name (written zero-padded: step_dir_name)
STAGE_DIR = re.compile(r"stage-(\d+)")  # SFT: the model at the end of curriculum stage K (written: stage_dir)
FINAL_DIR = "final"  # the model at the end of training
BEST_DIR = "best"  # GRPO: the model at the best post-warmup validation accuracy
EVAL_DIR = "eval"  # the test sets' results for final/ (eval_best/ for best/)
TB_DIR = "tb"  # TensorBoard event files
METRICS_FILE = "metrics.jsonl"
CONFIG_FILE = "config.json"  # the config the run was started with (config.N.json: each changed one)
CONFIG_HISTORY = re.compile(r"config\.(\d+)\.json")  # config.N.json: each config a resumed run changed to
ROLLOUTS_FILE = "rollouts.jsonl"  # GRPO: sampled rollouts, when logged
SUMMARY_FILE = "summary.json"  # GRPO: the run's summary (best step, accuracies, steps, skipped steps, applied)
APPLIED_FILE = "applied.json"  # what each process that started or resumed the run applied, as resolved at run time
LOCK_FILE = ".lock"
WANDB_ID_FILE = "wandb_run_id"
WANDB_DIR = "wandb"  # W&B's local files of the run (wandb.init(dir=OUT))


def step_dir_name(step: int) -> str:
    """The name of step ``step``'s resumable checkpoint in ``checkpoints/`` (``step-00000123``: names sort as steps)."""
    return f"step-{step:08d}"


def stage_dir(out: Path, stage: int) -> Path:
    """SFT: the model at the end of curriculum stage ``stage``."""
    return Path(out) / f"stage-{stage}"


def stage_dirs(out: Path) -> list[Path]:
    """SFT's ``stage-K/`` entries in ``out``, by stage: the names :data:`STAGE_DIR` matches whole (not a copy such as
    ``stage-1.bak``, which a ``stage-[0-9]*`` glob took in: ``--resume never`` deleted it)."""
    return _by_number(out, "stage-*", STAGE_DIR)


def checkpoint_dirs(out: Path) -> list[Path]:
    """The run's resumable checkpoints in ``out/checkpoints``, by step: the folders whose whole name :data:`STEP_DIR`
    matches (not a file of that name, nor a user's copy such as ``step-00000012-copy``)."""
    return [p for p in _by_number(Path(out) / CHECKPOINTS_DIR, "step-*", STEP_DIR) if p.is_dir()]


#: what runs themselves leave in ``checkpoints/``: their checkpoints (``step-N``), those a resume skipped, moved aside
#: (``damaged-step-N``, ``damaged-step-N-2``), and what a killed write, replace or removal left (``.tmp-step-N-PID``,
#: ``.tmp-step-N-shards``, ``.old-step-N-PID``); not a user's copy of a checkpoint (``step-00000012-copy``, ``mine/``)
RUN_CHECKPOINT_ENTRY = re.compile(r"step-\d+|damaged-step-\d+(?:-\d+)?|\.(?:tmp|old)-step-\d+-(?:\d+|shards)")


def checkpoint_copies(out: Path) -> list[str]:
    """The names, sorted, of what a user keeps in ``out/checkpoints`` beside the run's own entries
    (:data:`RUN_CHECKPOINT_ENTRY`): a copy of a checkpoint (``step-00000012-copy/``, a folder of any name holding a
    checkpoint's ``state.json``), which ``--resume`` may name, and which removing the run's checkpoints would take
    with them."""
    root = Path(out) / CHECKPOINTS_DIR
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if not RUN_CHECKPOINT_ENTRY.fullmatch(p.name))


def run_of_checkpoint(folder: Path) -> tuple[Path, int | None] | None:
    """The run directory whose ``final/``, ``best/``, ``stage-K/`` (step None) or resumable ``checkpoints/step-N/model``
    (step N) ``folder`` is, with that step; None for another folder."""
    folder = Path(folder)
    step = STEP_DIR.fullmatch(folder.parent.name)
    if folder.name == "model" and step and folder.parent.parent.name == CHECKPOINTS_DIR:
        return folder.parents[2], int(step.group(1))
    if folder.name in (FINAL_DIR, BEST_DIR) or STAGE_DIR.fullmatch(folder.name):
        return folder.parent, None
    return None


def config_history_file(out: Path, n: int) -> Path:
    """``config.N.json``: the N-th config of a resumed run that changed its config (0: the one it started with)."""
    return Path(out) / f"config.{n}.json"


def config_history(out: Path) -> list[Path]:
    """The run's ``config.N.json`` files in ``out``, by N: the names :data:`CONFIG_HISTORY` matches whole (not a copy
    such as ``config.old.json``, which a resumed run changing its config failed on, nor ``config.2.orig.json``, which
    ``--resume never`` deleted)."""
    return _by_number(out, "config.*.json", CONFIG_HISTORY)


def _by_number(out: Path, glob: str, name: re.Pattern[str]) -> list[Path]:
    """The entries of ``out`` that ``glob`` finds and whose whole name ``name`` matches, by the number it captures."""
    found = [(int(m.group(1)), p) for p in Path(out).glob(glob) if (m := name.fullmatch(p.name))]
    return [p for _, p in sorted(found)]


def results_dir(out: Path, spec: str, checkpoint: str = FINAL_DIR) -> Path:
    """Where a run's results on test set ``spec`` go: ``out/eval/<spec>`` for final/, ``out/eval_best/<spec>`` for
    best/ (the name as :func:`results_name` writes it)."""
    return Path(out) / results_folder(checkpoint) / results_name(spec)


def results_name(spec: str) -> str:
    """A test set's name in paths and metric keys: its spec with each character other than letters, digits, and
    ``. _ + -`` as ``_`` (``builtin:test`` -> ``builtin_test``, ``builtin:test?n_steps=6`` ->
    ``builtin_test_n_steps_6``: no ``?``, ``=`` or ``&`` for a shell or another file system to trip on)."""
    return re.sub(r"[^\w.+-]", "_", spec)


def results_folder(checkpoint: str = FINAL_DIR) -> str:
    """The folder of a checkpoint's test-set results: ``eval`` for final/, ``eval_<name>`` for another (best/)."""
    return EVAL_DIR if checkpoint == FINAL_DIR else f"{EVAL_DIR}_{checkpoint}"


#: what a run writes in OUT besides config.json and metrics.jsonl, which ``--resume never`` (or a restart under another
#: config) removes: its checkpoints, models, test results, logs, summary and applied settings
RUN_WRITES = (
    *(CHECKPOINTS_DIR, BEST_DIR, FINAL_DIR, results_folder(FINAL_DIR), results_folder(BEST_DIR), TB_DIR),
    *(SUMMARY_FILE, ROLLOUTS_FILE, WANDB_ID_FILE, WANDB_DIR, APPLIED_FILE),
)
