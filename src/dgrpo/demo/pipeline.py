"""Running the demo: the data, SFT per seed, every RL arm from each SFT checkpoint, each model's test answers;
in this process or, with several workers, as tasks (one SFT run, one RL run) of a process pool."""

from __future__ import annotations

import copy
import functools
import multiprocessing
import os
import re
import signal
import statistics
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from .. import plotting
from ..config import Config, ConfigError, TaskConfig, load_config, merge_file, override_keys, to_dict
from ..data.records import Record
from ..data.synthetic import generate_split
from ..eval.evaluate import evaluate
from ..eval.scoring import check_reward
from ..model.factory import load_model
from ..model.latent_lm import LatentLM
from ..model.verified import same_weights
from ..perturbation import make_perturbation
from ..run_layout import BEST_DIR, FINAL_DIR
from ..text import counted
from ..training.distributed import available_cpus, exit_with_parent
from ..training.grpo import train_grpo
from ..training.out_dir import check_not_a_training_run, check_output_path
from ..training.preemption import stops_at_once
from ..training.sft import train_sft
from .task_records import RECORD, fingerprint, forget_record, read_record, write_record

#: arm -> (label in the tables, packaged config merged over the demo's base config; None = the SFT checkpoint)
ARMS: dict[str, tuple[str, str | None]] = {
    "sft": ("Coconut SFT (baseline)", None),
    "grpo_deterministic": ("Coconut + GRPO (deterministic rollout)", "builtin/grpo_deterministic.yaml"),
    "reinforce_ema": ("Coconut + REINFORCE + dropout (EMA)", "builtin/reinforce_ema.yaml"),
    "grpo_sampling": ("Coconut + GRPO (token sampling, no dropout)", "builtin/grpo_sampling.yaml"),
    "grpo_null": ("Null control: Dropout-GRPO, rewards shuffled in each group", "builtin/grpo_null.yaml"),
    "dropout_grpo": ("Coconut + Dropout-GRPO (ours)", "builtin/dropout_grpo.yaml"),
}
#: the arms' names in the figures (the well-known ones get dgrpo.plotting's fixed colours)
SHORT = {
    "grpo_deterministic": "deterministic",
    "reinforce_ema": "REINFORCE + EMA",
    "grpo_sampling": "token sampling",
    "grpo_null": "null control",
    "dropout_grpo": "Dropout-GRPO",
}
#: preset -> (config files applied before --config, SFT seeds, RL seeds per SFT seed). The default is one SFT seed
#: (every arm from one checkpoint: one pair per comparison, so no interval; 8 minutes on 2 cores); the SFT seed
#: moves accuracy more than the RL seed, so --full adds SFT seeds (4 pairs, 95% intervals). --full's SFT seed 0 is the
#: default's run to the last digit at the same torch threads (--set threads=1: the default's lone SFT run otherwise
#: takes every CPU, and the last float bits depend on the count)
PRESETS: dict[str, tuple[tuple[str, ...], int, int]] = {
    "quick": (("tiny.yaml", "builtin/demo_quick.yaml"), 2, 1),
    "default": (("builtin/demo.yaml",), 1, 1),
    "full": (("builtin/demo.yaml",), 4, 1),
}


def shifted_split(task: TaskConfig) -> tuple[str, list[Record]]:
    """The shifted test split: chains one operation shorter than in training (``n_steps - 1``; 3 for the built-in
    task), ``task.n_test // 2`` problems. Reported, not judged: of the demo's 4 SFT seeds only one is above chance on
    it (docs/builtin_task.md), as on every other shift tried. With a 1-step task it is the 1-step chain itself."""
    n = max(1, task.n_steps - 1)
    name = f"{n} operation{'s' * (n != 1)}"
    return name, generate_split(replace(task, n_steps=n), "test")[: max(1, task.n_test // 2)]


def demo_splits(task: TaskConfig) -> dict[str, list[Record]]:
    """The demo's test splits: the built-in ``test`` split (the claims are judged on it) and the shifted split."""
    name, recs = shifted_split(task)
    return {"test": generate_split(task, "test"), name: recs}


def items_str(correct: Iterable[bool]) -> str:
    """Per-item correctness as a string of 0/1 (compact in results.json)."""
    return "".join("1" if c else "0" for c in correct)


def items_of(s: str) -> list[bool]:
    """The inverse of :func:`items_str`."""
    return [c == "1" for c in s]


def valid_split(base: Config) -> list[Record]:
    """The validation problems every periodic evaluation reads (the first ``data.eval_limit``, if set)."""
    valid = generate_split(base.task, "valid")
    return valid[: base.data.eval_limit] if base.data.eval_limit else valid


@dataclass
class Demo:
    """What every stage of a demo run shares: the base config, the data, the output folder, the evaluations."""

    base: Config
    out: Path
    train: list[Record]
    valid: list[Record]
    tests: dict[str, list[Record]]
    models: list[dict[str, Any]] = field(default_factory=list)  # every model evaluated on test
    runs: list[dict[str, Any]] = field(default_factory=list)  # every RL run's diagnostics
    wall: dict[str, float] = field(default_factory=dict)
    read_back: list[str] = field(default_factory=list)  # the wall keys of the tasks read back from their records
    progress: bool = True  # SFT's progress bar (off in worker processes: their stage lines are printed instead)
    resume: bool = False  # read back the tasks that finished in ``out`` under the same settings (.task_records)

    def count_correct(self, lm: LatentLM, recs: list[Record], settings: Any = None) -> int:
        """Greedy, no dropout: how many of ``recs`` are right (the periodic validation evaluation)."""
        n_lat = settings.n_latent if settings is not None else None
        return evaluate(lm, recs, n_latent=n_lat, seed=self.base.seed, progress=False, **self.eval_kw()).correct

    def eval_kw(self) -> dict[str, Any]:
        e = self.base.eval  # (the scorer is the arms' default reward too: grpo.reward's default)
        return {"batch_size": e.batch_size, "max_new_tokens": e.max_new_tokens, "scorer": e.scorer}

    def test_model(self, lm: LatentLM, **ident: Any) -> dict[str, Any]:
        """Read every test split once for this model; record accuracy and per-item correctness."""
        row: dict[str, Any] = {**ident, "splits": {}}
        for name, recs in self.tests.items():
            r = evaluate(lm, recs, dataset=name, seed=self.base.seed, progress=False, **self.eval_kw())
            row["splits"][name] = {"accuracy": r.accuracy, "items": items_str(p["correct"] for p in r.predictions)}
        self.models.append(row)
        return row


#: RL seeds per SFT seed at most: rl_seed keeps them distinct up to this
MAX_RL_SEEDS = 100


def rl_seed(sft_seed: int, r: int) -> int:
    """The RL run's seed: distinct over (SFT seed, RL seed index) pairs, the same for every arm of a pair."""
    return 100 * sft_seed + r


def arm_config(base: Config, arm: str, seed: int) -> Config:
    """The arm's config: its file merged over the demo's base config, with the arm's seed."""
    cfg = copy.deepcopy(base)
    cfg.seed = seed
    file = ARMS[arm][1]
    if file is not None:
        merge_file(cfg, file)
    if cfg.grpo.advantage == "ema" and cfg.grpo.group_size == 1:  # REINFORCE: the rollout budget of the grouped arms
        cfg.grpo.prompts_per_step = base.grpo.prompts_per_step * base.grpo.group_size
    return cfg.validate()


def run_sft(demo: Demo, seed: int) -> str:
    """Coconut curriculum SFT with this seed (into :func:`sft_checkpoint`); test its final checkpoint. Returns the
    line it says."""
    cfg = task_config(demo, Task(seed))
    out = sft_checkpoint(demo, seed).parent
    t0 = time.time()
    torch.manual_seed(seed)
    lm = load_model(cfg.model, cfg.task, seed=seed)
    stage_log = (lambda m: None) if demo.progress else (lambda m: say(f"SFT seed {seed}: {m}"))
    train_sft(
        lm,
        demo.train,
        cfg,
        out,
        valid=demo.valid,
        evaluate_fn=demo.count_correct,
        log=stage_log,
        resume="never",
        progress=demo.progress,
    )
    lm = LatentLM.from_pretrained(out / FINAL_DIR)
    valid = _last_eval(out) if demo.base.sft.eval_each_stage else None
    valid = demo.count_correct(lm, demo.valid) / len(demo.valid) if valid is None else valid
    row = demo.test_model(lm, arm="sft", sft_seed=seed, rl_seed=None, checkpoint="sft", valid_accuracy=valid)
    demo.wall[f"sft/seed{seed}"] = round(time.time() - t0, 1)
    line = f"SFT seed {seed}: valid {valid:.3f}, " + _accs(row) + f" ({demo.wall[f'sft/seed{seed}']:.0f} s)"
    say(line)
    return line


def _last_eval(run_dir: Path) -> float | None:
    """The validation accuracy of a run's last evaluation row (SFT: the end of its final stage)."""
    evals = [r["eval/valid/accuracy"] for r in plotting.load_run(run_dir).evals if "eval/valid/accuracy" in r]
    return evals[-1] if evals else None


def run_arm(demo: Demo, arm: str, sft_seed: int, r: int, sft_ckpt: Path) -> str:
    """One RL run from an SFT checkpoint; test its final and its best-validation checkpoints. Returns the line it
    says."""
    seed, task = rl_seed(sft_seed, r), Task(sft_seed, arm, r)
    cfg, run_dir = task_config(demo, task), task_dir(demo, task)
    t0 = time.time()
    torch.manual_seed(seed)
    policy = LatentLM.from_pretrained(sft_ckpt)
    summary = train_grpo(
        policy,
        cfg,
        demo.train,
        run_dir,
        valid={"valid": demo.valid},
        evaluate_fn=demo.count_correct,
        progress=False,
        log=lambda m: None,
        resume="never",
    )
    t_train = time.time() - t0
    ident = {"arm": arm, "sft_seed": sft_seed, "rl_seed": r}
    final = demo.test_model(policy, **ident, checkpoint="final", step=cfg.grpo.steps)
    best_step = summary.get("best_step")
    best_lm = None
    if best_step is not None and best_step != cfg.grpo.steps and (run_dir / BEST_DIR).is_dir():
        best_lm = LatentLM.from_pretrained(run_dir / BEST_DIR)
    if best_lm is not None and not same_weights(best_lm, policy):
        best = demo.test_model(best_lm, **ident, checkpoint="best", step=best_step)
    else:  # the best checkpoint is the final model, or equal to it (no update since), or none was kept: same answers
        best = {**final, "checkpoint": "best", "step": cfg.grpo.steps if best_step is None else best_step}
        demo.models.append(best)
    demo.runs.append({**ident, "dir": str(run_dir), **run_diagnostics(run_dir), "best_step": best["step"]})
    demo.wall[f"{arm}/sft{sft_seed}_rl{r}"] = round(time.time() - t0, 1)
    line = (
        f"  {SHORT[arm]}, SFT seed {sft_seed}, RL seed {seed}: final {_accs(final)}; best (step {best['step']}) "
        f"{_accs(best)} (train {t_train:.0f} s, total {demo.wall[f'{arm}/sft{sft_seed}_rl{r}']:.0f} s)"
    )
    say(line)
    return line


def run_diagnostics(run_dir: Path) -> dict[str, Any]:
    """From a run's metrics: the within-group reward std, kept fraction and distinct answers (mean over the first and
    the last 10 steps; the std's maximum), and how many steps updated the model."""
    steps = [r for r in plotting.load_run(run_dir).steps if "reward_mean" in r]

    def mean(key: str, part: list[dict]) -> float | None:
        vals = [r[key] for r in part if r.get(key) is not None]
        return statistics.fmean(vals) if vals else None

    std = [r["reward_std"] for r in steps if r.get("reward_std") is not None]
    out: dict[str, Any] = {"reward_std_max": max(std) if std else None, "updates": sum(1 - r["skipped"] for r in steps)}
    for key in ("reward_std", "frac_groups_kept", "distinct_answers", "reward_mean"):
        out[key] = [mean(key, steps[:10]), mean(key, steps[-10:])]
    return out


def _accs(row: Mapping[str, Any]) -> str:
    """A progress line's accuracies, each split named less its parenthesis (``3 operations 0.130``)."""
    return ", ".join(f"{name.split(' (')[0]} {d['accuracy']:.3f}" for name, d in row["splits"].items())


def say(msg: str) -> None:
    print(f"[demo] {msg}", flush=True)


def demo_config(args: Any) -> tuple[Config, int, int]:
    """The base config (the preset's files, then --config, then --set) and the numbers of SFT and RL seeds."""
    preset = "quick" if args.quick else "full" if getattr(args, "full", False) else "default"
    files, n_sft, n_rl = PRESETS[preset]
    _refuse_what_the_demo_does_not_read(args.overrides)  # (first: the config's own checks of such a key came first)
    base = load_config(Config, [*files, *args.config], args.overrides)
    n_sft = args.sft_seeds if getattr(args, "sft_seeds", None) is not None else n_sft
    n_rl = args.seeds if args.seeds is not None else n_rl
    if n_sft < 1 or n_rl < 1:
        raise ConfigError(f"--sft-seeds and --seeds must be >= 1, got {n_sft} and {n_rl}")
    if n_rl > MAX_RL_SEEDS:  # (rl_seed(s, 100) would be rl_seed(s + 1, 0))
        raise ConfigError(f"--seeds must be <= {MAX_RL_SEEDS} (RL seeds are 100 x SFT seed + r), got {n_rl}")
    if getattr(args, "workers", None) is not None and args.workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {args.workers}")
    _refuse_files_setting_what_the_demo_does_not_read(files, args.config)
    _check_best_is_kept(base)
    if base.grpo.log_every != 1:  # (the report read one step in N as if it were every step)
        raise ConfigError(
            f"grpo.log_every={base.grpo.log_every}: dgrpo demo reads every RL step's metrics row (claim 1's reward "
            "std of 0 at every step, the steps that updated); leave it at 1"
        )
    check_output_path(args.out)  # an existing file, or a place that cannot be written: one line, now
    check_not_a_training_run(args.out)  # (the demo's own runs live in its sft/ and arms/)
    for arm, (_, file) in ARMS.items():  # every arm's config, now: a --set that breaks one fails before any SFT
        if file is not None:
            try:
                cfg = arm_config(base, arm, 0)
            except ConfigError as e:
                raise ConfigError(f"arm {arm} ({file} over the demo's config): {e}") from None
            _warn_if_arm_overrides(arm, file, base, cfg, args.overrides)
            make_perturbation(cfg.perturbation)  # (a plug-in kind or reward that cannot be built: before any SFT)
            check_reward(cfg.grpo, cfg.eval.scorer)
    return base, n_sft, n_rl


#: options the demo does not read: its data is the built-in task's splits, its evaluations greedy, and every run's
#: seed its own (--sft-seeds, --seeds)
NOT_READ_BY_THE_DEMO = (
    "seed",
    "data.train",
    "data.valid",
    "data.test",
    "data.question_key",
    "data.answer_key",
    "data.steps_key",
    "eval.n_latent",
    "eval.temperature",
    "eval.top_p",
    "eval.limit",
    "eval.shots",
    "eval.plain",
)


def _refuse_what_the_demo_does_not_read(overrides: Sequence[str]) -> None:
    """A ``--set`` the demo would ignore is refused in one line (it was accepted and did nothing)."""
    for key in dict.fromkeys(k for ov in overrides for k in override_keys(ov)):
        if key in NOT_READ_BY_THE_DEMO:
            raise ConfigError(
                f"--set {key}: dgrpo demo does not read it (the built-in task's splits, greedy evaluation, each run's "
                "seed its own: --sft-seeds, --seeds); train on your data, or with your evaluation settings, with "
                "dgrpo sft and dgrpo grpo"
            )


def _refuse_files_setting_what_the_demo_does_not_read(preset: Sequence[str], configs: Sequence[str]) -> None:
    """The same for ``--config`` files: one that gives a :data:`NOT_READ_BY_THE_DEMO` option another value than the
    demo's preset is refused in one line (``--set`` was, a file's value was ignored without a word)."""
    if not configs:
        return
    ours, given = load_config(Config, list(preset), []), load_config(Config, [*preset, *configs], [])
    for key in NOT_READ_BY_THE_DEMO:
        theirs, mine = (functools.reduce(getattr, key.split("."), c) for c in (given, ours))
        if theirs != mine:
            raise ConfigError(
                f"--config {' '.join(configs)} sets {key} to {theirs!r}: dgrpo demo does not read it (the built-in "
                "task's splits, greedy evaluation, each run's seed its own: --sft-seeds, --seeds); train on your "
                "data, or with your evaluation settings, with dgrpo sft and dgrpo grpo"
            )


def _check_best_is_kept(base: Config) -> None:
    """The demo reports each RL run's best post-warmup validation checkpoint (``best/``, the paper's protocol) beside
    its final one: a config that keeps none (``grpo.save_best: false``, or ``grpo.warmup_steps`` past
    ``grpo.steps``) is refused in one line (the report labelled the final model the best-validation one)."""
    g = base.grpo
    why = (
        "grpo.save_best=false keeps none"
        if not g.save_best
        else f"grpo.warmup_steps={g.warmup_steps} is past grpo.steps={g.steps} (it is kept from the warmup's end on)"
        if g.warmup_steps > g.steps
        else ""
    )
    if why:
        raise ConfigError(
            f"dgrpo demo reports each RL run's best post-warmup validation checkpoint (best/) beside its final one, "
            f"and {why}; to train without it, use dgrpo grpo"
        )


def _warn_if_arm_overrides(arm: str, file: str, base: Config, cfg: Config, overrides: Sequence[str]) -> None:
    """A ``--set`` whose key the arm sets itself does not reach that arm: say so (it was overridden silently)."""
    for key in dict.fromkeys(ov.split("=", 1)[0].strip() for ov in overrides):
        theirs, ours = (functools.reduce(getattr, key.split("."), c) for c in (cfg, base))
        if theirs != ours:
            warnings.warn(
                f"--set {key}={ours} does not reach the {arm} arm, which sets {key} to {theirs} itself ({file})",
                stacklevel=3,
            )


@dataclass(frozen=True)
class Task:
    """One unit of the demo's work: SFT for an SFT seed (``arm`` None), or one RL run from that seed's checkpoint."""

    sft_seed: int
    arm: str | None = None
    r: int = 0


def arm_tasks(s: int, n_rl: int, arms: Sequence[str] | None = None) -> list[Task]:
    """The RL runs from SFT seed ``s``'s checkpoint, in the order the tables list them: every arm (or ``arms``),
    ``n_rl`` RL seeds each (the deterministic arm once: it cannot update, whatever its seed)."""
    names = [a for a in ARMS if ARMS[a][1] is not None and (arms is None or a in arms)]
    return [Task(s, a, r) for a in names for r in range(1 if a == "grpo_deterministic" else n_rl)]


def sft_checkpoint(demo: Demo, s: int) -> Path:
    """Where SFT seed ``s``'s final checkpoint is written (run_sft) and read (its RL runs)."""
    return task_dir(demo, Task(s)) / FINAL_DIR


def task_dir(demo: Demo, task: Task) -> Path:
    """The task's run folder: ``sft/seed<s>``, or ``arms/<arm>/sft<s>_rl<r>``."""
    if task.arm is None:
        return demo.out / "sft" / f"seed{task.sft_seed}"
    return demo.out / "arms" / task.arm / f"sft{task.sft_seed}_rl{task.r}"


def task_config(demo: Demo, task: Task) -> Config:
    """The config the task trains with: the demo's base config with the SFT seed, or the arm's with its RL seed."""
    if task.arm is not None:
        return arm_config(demo.base, task.arm, rl_seed(task.sft_seed, task.r))
    cfg = copy.deepcopy(demo.base)
    cfg.seed = task.sft_seed
    return cfg


#: the config's sections that an SFT run does not read (the RL runs'): left out of its record's fingerprint
RL_SECTIONS = ("grpo", "perturbation")


def task_settings(demo: Demo, task: Task) -> dict[str, Any]:
    """What the task's results depend on of its config (:func:`task_config`, as a dict): all of an RL run's; an SFT
    run's without :data:`RL_SECTIONS` (a demo rerun with other RL settings keeps its SFT checkpoints)."""
    settings = to_dict(task_config(demo, task))
    return settings if task.arm is not None else {k: v for k, v in settings.items() if k not in RL_SECTIONS}


def run_task(demo: Demo, task: Task) -> None:
    """SFT (then its test) or one RL run (then its tests); the models, runs and wall times land in ``demo``, and in
    the task's record (:mod:`.task_records`). With ``demo.resume``, a task whose record matches is read back."""
    run_dir, sft = task_dir(demo, task), sft_checkpoint(demo, task.sft_seed)
    splits = {"train": demo.train, "valid": demo.valid, **{f"test/{k}": v for k, v in demo.tests.items()}}
    fp = fingerprint(task_settings(demo, task), splits, torch.get_num_threads(), sft if task.arm is not None else None)
    record = read_record(run_dir, fp, sft if task.arm is None else None) if demo.resume else None
    if record is not None:
        demo.models += record["models"]
        demo.runs += [{**r, "dir": str(run_dir)} for r in record["runs"]]  # (where it is now: --out moved)
        demo.wall.update(record["wall"])
        demo.read_back += list(record["wall"])
        say(f"{record.get('line', task)} (read back from {run_dir / RECORD}: finished by an earlier run)")
        return
    forget_record(run_dir)
    n_models, n_runs, walls = len(demo.models), len(demo.runs), set(demo.wall)
    if task.arm is None:
        line = run_sft(demo, task.sft_seed)
    else:
        line = run_arm(demo, task.arm, task.sft_seed, task.r, sft)
    wall = {k: v for k, v in demo.wall.items() if k not in walls}
    write_record(run_dir, fp, demo.models[n_models:], demo.runs[n_runs:], wall, line)


def run_seed(demo: Demo, s: int, n_rl: int, arms: Sequence[str] | None = None) -> None:
    """One SFT seed's pipeline in this process: SFT, then every RL run from its checkpoint."""
    for task in [Task(s), *arm_tasks(s, n_rl, arms)]:
        run_task(demo, task)


def _start_worker(demo_pid: int) -> None:
    """A pool worker's start: it dies with the demo's process (``demo_pid``), however that ends (a SIGTERM from a job
    scheduler or ``kill``, SIGKILL included; Ctrl-C reaches the workers by itself), and the library's bars stay
    quiet."""
    if not exit_with_parent(demo_pid):
        os._exit(1)  # the demo's process is already gone
    quiet_transformers()
    # tqdm's lock in a thread lock, not its default multiprocessing one: a worker ended by SIGTERM (the demo's stop)
    # cannot release a semaphore, and the resource tracker warned of it as leaked at the demo's end
    from tqdm import tqdm

    tqdm.set_lock(threading.RLock())


def _task_worker(demo: Demo, task: Task, threads: int) -> Demo:
    """:func:`run_task` in a worker process, with ``threads`` torch threads and no progress bars."""
    torch.set_num_threads(threads)
    run_task(demo, task)
    return demo


def quiet_transformers() -> None:
    """No "Loading weights" / "Writing model shards" bars for every checkpoint the demo reads and writes."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def task_threads(task: Task, n_sft: int, workers: int, cpus: int, pinned: int = 0) -> int:
    """Torch threads for one pool task: ``pinned`` (the config's ``threads``) when set. Otherwise an equal share of
    the CPUs per worker, except that SFT runs take the CPUs of the workers that would sit idle beside them (every RL
    run waits for a checkpoint): a single SFT seed gets every CPU. On 2 cores one SFT run does 1.5x the steps
    per second with two threads as with one, two single-thread runs side by side 1.9x (bench item 11)."""
    if pinned:
        return pinned
    share = max(1, cpus // workers)
    if task.arm is None:
        return max(share, cpus // max(1, min(n_sft, workers)))
    return share


def default_workers(base: Config) -> int:
    """One worker per CPU; 1 on a GPU (the processes would share it). On 2 cores two single-thread workers do 1.9x
    the SFT steps of one, one two-thread process 1.5x (bench item 11)."""
    if base.device.startswith(("cuda", "mps")) or (base.device == "auto" and torch.cuda.is_available()):
        return 1
    return max(1, available_cpus())


def run_pipeline(
    demo: Demo,
    n_sft: int,
    n_rl: int,
    arms: Sequence[str] | None = None,
    after_seed: Callable[[list[int]], None] | None = None,
    workers: int = 1,
) -> None:
    """SFT for seeds 0 .. n_sft-1 and every RL run from each checkpoint: in this process (``workers`` = 1), or as
    tasks of ``workers`` spawned processes (threads per task: :func:`task_threads`): every SFT seed first, each
    seed's RL runs as soon as its checkpoint exists, so one SFT seed's arms also run side by side. The results are
    merged in the in-process order whatever order the tasks finish in; ``after_seed(done)`` runs when all of a
    seed's tasks are done (the demo writes its results so far)."""
    demo.out.mkdir(parents=True, exist_ok=True)
    workers = max(1, workers)
    if workers > available_cpus():
        warnings.warn(
            f"--workers {workers} is more than the {available_cpus()} CPU(s) this process may use: the runs share "
            "them, one thread each, and every worker holds its own torch and models in memory",
            stacklevel=2,
        )
    say(
        f"built-in task: {len(demo.train)} train, {len(demo.valid)} valid (per eval), "
        + ", ".join(f"{len(r)} {s}" for s, r in demo.tests.items())
        + f"; {counted(n_sft, 'SFT seed')} x {counted(n_rl, 'RL seed')}; {counted(workers, 'worker')}; "
        f"output in {demo.out}"
    )
    done: list[int] = []

    def seed_done(s: int) -> None:
        done.append(s)
        if after_seed is not None:
            after_seed(sorted(done))

    if workers == 1:
        # A SIGTERM stops these runs at once, as with workers. The trainers' rule (end the step under way, write a
        # resumable checkpoint, say so) wrote a checkpoint the demo never resumes, in a line that its stop line then
        # contradicted (the command line's handler still ignores one SIGTERM delivered twice).
        with stops_at_once():
            for s in range(n_sft):
                run_seed(demo, s, n_rl, arms)
                seed_done(s)
    else:
        _run_pool(demo, n_sft, n_rl, arms, workers, seed_done)


def _run_pool(
    demo: Demo, n_sft: int, n_rl: int, arms: Sequence[str] | None, workers: int, seed_done: Callable[[int], None]
) -> None:
    """:func:`run_pipeline`'s tasks in ``workers`` spawned processes; each seed's results merged into ``demo`` (then
    ``seed_done(seed)``) once its SFT and every RL run are in."""
    cpus = available_cpus()
    blank = replace(demo, models=[], runs=[], wall={}, read_back=[], progress=False)
    parts: dict[int, dict[int, Demo]] = {s: {} for s in range(n_sft)}  # seed -> task index (SFT: -1) -> results
    n_tasks = len(arm_tasks(0, n_rl, arms)) + 1  # per seed, the same for every seed
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=spawn, initializer=_start_worker, initargs=(os.getpid(),)) as pool:

        def submit(task: Task) -> Future:
            threads = task_threads(task, n_sft, workers, cpus, demo.base.threads)
            return pool.submit(_task_worker, blank, task, threads)

        futures = {submit(Task(s)): (s, -1) for s in range(n_sft)}
        try:
            while futures:
                for fut in wait(futures, return_when=FIRST_COMPLETED).done:
                    s, i = futures.pop(fut)
                    parts[s][i] = fut.result()
                    if i == -1:  # the checkpoint exists: its RL runs
                        for j, task in enumerate(arm_tasks(s, n_rl, arms)):
                            futures[submit(task)] = (s, j)
                    if len(parts[s]) == n_tasks:  # SFT and every RL run of this seed
                        merge_seed(demo, join_parts(parts[s]))
                        seed_done(s)
        except BrokenProcessPool:  # a worker ended abruptly (the OOM killer, kill): the pool ends the others
            raise WorkerDied(worker_died(end_workers(pool))) from None
        except BaseException:  # (Ctrl-C, SIGTERM, a task's error): the tasks under way end now too
            end_workers(pool)
            raise


class WorkerDied(RuntimeError):
    """A worker process of the demo's pool ended abruptly, killed from outside or crashed (its task raised
    nothing: concurrent.futures' BrokenProcessPool); the demo's other workers are ended. ``dgrpo demo`` says it in
    one line, exit code 1."""


def worker_died(exits: Mapping[int, int | None]) -> str:
    """What :class:`WorkerDied` says, from the ended pool's exit codes (pid -> code; -N: signal N). Once a worker has
    ended the pool ends the others with SIGTERM, and so does :func:`end_workers`: any other exit is a worker's own;
    when all are SIGTERM, the first was too (which one is not known)."""

    def ended(code: int) -> str:
        try:
            return signal.Signals(-code).name if code < 0 else f"exit code {code}"
        except ValueError:
            return f"signal {-code}"

    own = {pid: code for pid, code in exits.items() if code is not None and code != -signal.SIGTERM}
    how = "; ".join(f"pid {pid}: {ended(code)}" for pid, code in own.items()) or ("SIGTERM" if exits else "")
    return (
        f"a worker process of the demo ended abruptly{f' ({how})' if how else ''}: killed from outside (out of memory: "
        "the kernel's OOM killer sends SIGKILL; each worker holds its own models: fewer --workers need less; or kill) "
        "or crashed; the demo ended its other workers: the same command keeps the runs that had finished and starts "
        "the others over"
    )


def end_workers(pool: ProcessPoolExecutor) -> dict[int, int | None]:
    """Cancel the pool's waiting tasks and end its workers (SIGTERM: a worker dies at once, whatever it runs): the
    pool's own shutdown waits for the tasks under way (minutes of a run), and a stop that reached the demo's process
    alone (``kill -INT``, ``kill -TERM``) left it waiting on them, its workers training. (The pool keeps its
    processes private; a pool without them is left as it is. A worker must not catch SIGTERM: the pool's worker loop
    takes any exception of a task, SystemExit too, as that task's result and runs the next.) Returns the workers'
    exit codes (pid -> code: :func:`worker_died` reads them)."""
    processes = list(dict(getattr(pool, "_processes", None) or {}).values())  # (its shutdown forgets them)
    for process in processes:
        if process.is_alive():
            process.terminate()
    pool.shutdown(wait=True, cancel_futures=True)  # (quick now: it closes the pool's queues)
    return {process.pid: process.exitcode for process in processes if process.pid is not None}


def join_parts(parts: Mapping[int, Demo]) -> Demo:
    """One seed's task results (task index -> results; SFT -1) as one part, in task order."""
    first = parts[min(parts)]
    out = replace(first, models=[], runs=[], wall={}, read_back=[])
    for i in sorted(parts):
        out.models += parts[i].models
        out.runs += parts[i].runs
        out.wall.update(parts[i].wall)
        out.read_back += parts[i].read_back
    return out


def merge_seed(demo: Demo, part: Demo) -> None:
    """Add one seed's models, runs, wall times and tasks read back to ``demo``, keeping everything in SFT-seed
    order."""
    demo.models = sorted(demo.models + part.models, key=lambda m: m["sft_seed"])
    demo.runs = sorted(demo.runs + part.runs, key=lambda r: r["sft_seed"])
    demo.read_back = sorted(demo.read_back + part.read_back, key=_seed_of)
    wall = {**demo.wall, **part.wall}
    demo.wall = dict(sorted(wall.items(), key=lambda kv: _seed_of(kv[0])))


def _seed_of(key: str) -> int:
    """``sft/seed3`` or ``arm/sft3_rl0`` -> 3 (other keys, e.g. ``total``, last)."""
    m = re.search(r"(?:seed|sft)(\d+)", key)
    return int(m.group(1)) if m else 1 << 30
