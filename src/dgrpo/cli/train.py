"""``dgrpo sft`` and ``dgrpo grpo``: the two training commands."""

from __future__ import annotations

import argparse
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial, wraps
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from ..run_layout import BEST_DIR, CONFIG_FILE, FINAL_DIR, SUMMARY_FILE, results_name, stage_dirs
from .common import (
    add_config_options,
    evaluate_test_sets,
    join_processes,
    load,
    model_without_weights,
    report_model,
    results_dir,
    revision_for,
    seed_everything,
    setup,
    subcommand,
    test_metric_key,
)

if TYPE_CHECKING:
    from ..config import Config

SFT_EXAMPLES = """  dgrpo sft --out runs/sft                                          # the built-in task, the defaults
  dgrpo sft --set sft.mode=cot --out runs/cot                      # a baseline: cot | no_cot | pause | no_curriculum
  dgrpo sft --set data.train=my_train.jsonl data.valid=my_valid.jsonl 'data.test=[my_test.jsonl]' \\
      --set model.name_or_path=Qwen/Qwen2.5-0.5B --out runs/mine/sft      # your data (README: Your own task)
  dgrpo sft --config paper/sft_coconut.yaml --out runs/paper/sft         # the paper's recipe (GPU)
  torchrun --nproc_per_node 8 -m dgrpo sft --config paper/sft_coconut.yaml --out runs/paper/sft
"""
GRPO_EXAMPLES = """  dgrpo grpo --init runs/sft --out runs/grpo                           # Dropout-GRPO, the defaults
  dgrpo grpo --config builtin/grpo_sampling.yaml --init runs/sft --out runs/sampling
  dgrpo grpo --init runs/sft --out runs/grpo --set grpo.lr=2e-5 --set perturbation.p=0.2
  dgrpo grpo --init runs/mine/sft --set data.train=my_train.jsonl data.valid=my_valid.jsonl \\
      'data.test=[my_test.jsonl]' --set grpo.reward=my_rewards.py:reward --out runs/mine/grpo   # your data, reward
  dgrpo grpo --config paper/grpo_dropout.yaml --init runs/paper/sft --out runs/paper/dropout_grpo   # GPU
"""

GRPO_ABOUT = """Dropout-GRPO (and its ablations) from an SFT checkpoint.

The defaults: K = 8 rollouts per prompt, 16 prompts a step; each rollout runs under a dropout mask of its own
(perturbation.kind=locked, p = 0.1 on every layer's MLP output), held over its latent thoughts and its greedy
answer, and the update replays that mask. The paper's other arms: builtin/grpo_*.yaml and paper/grpo_*.yaml
(--config); every option: dgrpo config show grpo (and perturbation)."""


def register(sub: Any) -> None:
    p = subcommand(sub, "sft", "Coconut curriculum SFT (or a CoT / no-CoT / pause baseline)", SFT_EXAMPLES)
    add_config_options(p, "sft.lr=1e-4")
    p.add_argument("--out", required=True, help="run directory (checkpoints stage-K/, final/, metrics.jsonl)")
    p.add_argument("--init", help="start from this checkpoint (directory or hub id) instead of model.name_or_path")
    add_resume_options(p)
    p.set_defaults(func=run_sft)

    p = subcommand(sub, "grpo", "Dropout-GRPO (and its ablations) from an SFT checkpoint", GRPO_EXAMPLES, GRPO_ABOUT)
    add_config_options(p, "grpo.lr=2e-5")
    p.add_argument(
        "--init",
        help="SFT checkpoint (run directory, checkpoint directory or hub id); default: the config's "
        "model.name_or_path unless it is builtin-tiny (a run's config.json records what the run started from, so "
        "--config RUN/config.json reruns it)",
    )
    p.add_argument(
        "--out",
        required=True,
        help="run directory (checkpoints/, best/, final/, eval/ of the test sets, metrics.jsonl, summary.json)",
    )
    add_resume_options(p)
    p.set_defaults(func=run_grpo)


def add_resume_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--resume",
        default="auto",
        metavar="auto|never|PATH",
        help="auto (default): continue from the newest intact checkpoint in OUT/checkpoints, if any; never: start "
        "over (what an earlier run wrote in OUT is deleted: checkpoints, best/, final/, stage-K/, eval/, config "
        "history); PATH: continue from that checkpoint directory",
    )
    p.add_argument(
        "--allow-config-change",
        action="store_true",
        help="resume even though the config differs from the run's (every config used is kept as config.N.json)",
    )


def record_init(cfg: Config, init: str | None, out: str | Path) -> Config:
    """``--init`` kept as the run's ``model.name_or_path`` (:func:`init_name`; a local ``model.name_or_path`` is
    named so too: :func:`model_name`, for the run in ``out``): the run's config then names the weights it started
    from, and resuming it from other weights is refused as any changed config is. Reward,
    scorer and perturbation kind files (``path/file.py:function``) are made absolute too, so the checkpoint's scorer
    is found by ``dgrpo eval`` wherever it runs, and so are the local files and folders of ``data.train`` and
    ``data.valid`` (:func:`~dgrpo.training.resume_check.absolute_data_spec`): a resume or a rerun of the config
    elsewhere trains and validates on the same data. ``data.test`` stays as typed: its specs name the results
    (``eval/NAME``, ``test/NAME/accuracy``), which an absolute path would make ``_home_me_my_test.jsonl``."""
    from ..config import ConfigError, reward_name
    from ..training.model_record import init_name, model_name
    from ..training.resume_check import absolute_data_spec

    if init is not None and not init.strip():
        raise ConfigError("--init is empty: name a checkpoint directory, a run directory or a hub id")
    cfg.model.name_or_path = init_name(init) if init else model_name(cfg.model.name_or_path, out)
    cfg.eval.scorer, cfg.grpo.reward = absolute_file(cfg.eval.scorer), absolute_file(cfg.grpo.reward)
    cfg.data.train = absolute_data_spec(cfg.data.train)
    cfg.data.valid = absolute_data_spec(cfg.data.valid) if cfg.data.valid else cfg.data.valid
    # (a plug-in kind's file, path/to/file.py:Class; the option's type lists the built-in kinds, which it also takes)
    cfg.perturbation.kind = cast(Any, absolute_file(cfg.perturbation.kind))
    recorded = recorded_reward_names(out)  # (a part's name is its metric's, and grpo.filter_reward's)
    cfg.grpo.rewards = [
        {**item, "name": item.get("name") or recorded.get(fn) or reward_name(item), "fn": fn}
        for item, fn in ((item, absolute_file(item["fn"])) for item in cfg.grpo.rewards)
    ]
    return cfg


def recorded_reward_names(out: str | Path) -> dict[str, str]:
    """The names the run in ``out`` gave its ``grpo.rewards`` parts, by function (``{}`` for a new run): a resumed
    run keeps a part's name, and so its metric ``reward/<name>``, whatever the default name of this dgrpo (a file's
    part was named by its path, ``/abs/path/file.py:function``, and is ``file:function`` now)."""
    import json

    from ..run_layout import CONFIG_FILE

    try:
        rewards = json.loads((Path(out) / CONFIG_FILE).read_text())["grpo"]["rewards"]
        return {str(r["fn"]): str(r["name"]) for r in rewards if r.get("name")}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def grpo_init(cfg: Config) -> str:
    """``dgrpo grpo``'s ``--init`` when none is given: the config's ``model.name_or_path`` (a run's ``config.json``
    records there what the run started from); a one-line error when that is the untrained built-in model."""
    from ..config import ConfigError
    from ..model.factory import BUILTIN

    if cfg.model.name_or_path == BUILTIN:
        raise ConfigError(
            "dgrpo grpo needs --init: the SFT checkpoint to start from (run directory, checkpoint directory or hub "
            "id), or a --config whose model.name_or_path names it (a run's config.json does)"
        )
    return cfg.model.name_or_path


def absolute_file(spec: str) -> str:
    """``path/file.py:function`` with an existing file's path made absolute; anything else as it is."""
    from ..plugins import plugin_file

    path = plugin_file(spec)
    return f"{path.resolve()}:{spec.rpartition(':')[2]}" if path is not None and path.is_file() else spec


def warn_if_init_differs(init_config: dict | None, cfg: Config) -> None:
    """GRPO takes its options from its own config, not from the --init checkpoint's: say so when the definition of
    a correct answer (``eval.scorer``, also the default reward) or, training on the built-in data, the task
    (``task.*`` but its split sizes) differs from the one the checkpoint was trained with."""
    from ..config import to_dict

    theirs = init_config or {}
    saved, scorer = theirs.get("eval", {}).get("scorer"), cfg.eval.scorer
    if saved is not None and saved != scorer:
        warnings.warn(
            f"eval.scorer is {scorer!r} here but {saved!r} in the --init checkpoint's run: validation, best/, the test "
            f"sets and the default reward use {scorer!r} (--set eval.scorer={saved} keeps the checkpoint's)",
            stacklevel=2,
        )
    task, saved_task = to_dict(cfg)["task"], theirs.get("task", {})
    sizes = ("n_train", "n_valid", "n_test")  # how many problems, not which kind: a change is no other task
    changed = [k for k in task if k in saved_task and saved_task[k] != task[k] and k not in sizes]
    if changed and cfg.data.train.startswith("builtin"):
        shown = ", ".join(f"task.{k} is {task[k]!r} here, {saved_task[k]!r} there" for k in changed)
        warnings.warn(
            f"the built-in task differs from the --init checkpoint's run ({shown}): GRPO trains and evaluates on this "
            "config's task (--set the checkpoint's values to keep its task)",
            stacklevel=2,
        )


def warn_if_prompt_options_are_set(cfg: Config) -> None:
    """A warning when eval.plain or eval.shots is set: they are dgrpo eval's prompt options; the training commands
    validate and test the model as they train it (their results said coconut, 0 shots, under a config that said
    otherwise)."""
    given = [f"eval.{k}={v}" for k, v in (("plain", cfg.eval.plain), ("shots", cfg.eval.shots)) if v]
    if given:
        warnings.warn(
            f"{' and '.join(given)} only apply to dgrpo eval: validation and the test sets here prompt the model as "
            "it trains (its latent steps, no shots)",
            stacklevel=2,
        )


def warn_if_held_out_is_builtin(cfg: Config) -> None:
    """A warning when the training data is not the built-in task but data.valid or data.test still name the built-in
    task's sets (their defaults): validation, best/ and the test results would measure a task never trained on."""
    d = cfg.data
    if d.train.startswith("builtin"):
        return
    tests = [t for t in d.test if t.startswith("builtin")]
    found = []  # (the option and its built-in sets, what they measure, how to set them)
    if d.valid.startswith("builtin"):
        found.append(
            (f"data.valid ({d.valid})", "validation (and best/)", "data.valid=MY_VALID.jsonl (or '' for none)")
        )
    if tests:
        found.append(
            (f"data.test ({', '.join(tests)})", "the test results", "data.test=[MY_TEST.jsonl] (or [] for none)")
        )
    if not found:
        return
    names, measured, fixes = (" and ".join(item[i] for item in found) for i in range(3))
    warnings.warn(
        f"data.train is {d.train}, but {names} {'are' if len(found) + len(tests) > 2 else 'is'} the built-in task's: "
        f"{measured} would measure that task, not your data; set {fixes}",
        stacklevel=2,
    )


def check_test_sets_distinct(cfg: Config) -> None:
    """A one-line ConfigError when two ``data.test`` specs read the same data (:func:`~dgrpo.data.dataset_key`: a
    path made absolute, a built-in name with its split made explicit): ``[a.jsonl, /abs/a.jsonl]`` tested one set
    twice, under two names (``eval/a.jsonl`` and ``eval/_abs_a.jsonl``), as ``dgrpo eval`` refuses two such
    ``--data``. (Two specs of one results folder the config itself refuses.)"""
    from ..config import ConfigError
    from ..data import dataset_key

    seen: dict[str, str] = {}
    for spec in cfg.data.test:
        key = dataset_key(spec)
        if key in seen:
            raise ConfigError(f"data.test: {seen[key]} and {spec} both name {key} (name each test set once)")
        seen[key] = spec


def warn_if_held_out_is_trained_on(cfg: Config, train: list, held_out: dict[str, list]) -> None:
    """A warning for each validation or test set that shares questions with the training data (GSM-Hard is GSM8K's
    test set with numbers changed: 329 of its questions are GSM8K test questions word for word)."""
    from ..data import shared_questions

    for name, records in held_out.items():
        shared, answered = shared_questions(train, records)
        if shared:
            warnings.warn(
                f"{shared} of the {len(records)} questions of {name} are in the training data {cfg.data.train} word "
                f"for word ({answered} with the same answer): that many of its items are trained on",
                stacklevel=2,
            )


def warn_if_tests_share_validation(cfg: Config, held_out: dict[str, list]) -> None:
    """A warning for each test set that asks questions of the validation set (``data.valid``): ``best/`` and every
    other choice made on validation accuracy is then made on items the test set reports (the same file under both
    keys, or an overlap such as a validation split cut from the test data)."""
    from ..data import shared_questions

    valid = held_out.get(cfg.data.valid, []) if cfg.data.valid else []
    for spec in cfg.data.test if valid else ():
        shared, _ = shared_questions(valid, held_out[spec])
        if shared:
            warnings.warn(
                f"{shared} of the {len(held_out[spec])} questions of the test set {spec} are questions of the "
                f"validation set {cfg.data.valid}: best/ (chosen on validation) is chosen on items this test reports; "
                "validate on data of its own",
                stacklevel=2,
            )


@dataclass
class Setting:
    """What both training commands set up before they train: the config, the data, the processes, the model."""

    cfg: Config
    options: dict  # the evaluation options (eval_options), the scorer among them
    train: list
    valid: list | None  # data.valid's records (the first data.eval_limit of them), or None
    tests: dict[str, list]  # data.test's records, by spec
    dist: Any
    device: Any
    lm: Any
    out: Path
    rewards: Any = None  # GRPO's reward, called on gold answers before the model loaded (grpo.checked_rewards)


def held_out_specs(cfg: Config) -> list[tuple[str, str]]:
    """(key, spec) of each dataset ``data.valid`` and ``data.test`` name, each spec once (under its first key)."""
    specs: dict[str, str] = {}
    for key, spec in [("data.valid", cfg.data.valid), *(("data.test", t) for t in cfg.data.test)]:
        if spec:
            specs.setdefault(spec, key)
    return [(key, spec) for spec, key in specs.items()]


def init_columns(init: str | None, cfg: Config) -> list[str]:
    """The column mapping (``data.question_key=prompt``, ...) the run of ``init``, a checkpoint on disk, read its
    data with (its ``run_config.json``) when ``cfg`` maps no column: a training command takes its data settings
    from its own config, not from ``--init``'s, so a file of the same columns is then read as a known format and
    fails; [] for a hub id (not read here), a checkpoint without a run's config, or a config that maps columns."""
    from ..model.sources import on_disk, resolve_checkpoint
    from ..model.verified import RUN_CONFIG_FILE, CheckpointError, read_json_object
    from .common import COLUMN_KEYS

    if not init or cfg.data.question_key or not on_disk(init).exists():
        return []
    try:
        data = read_json_object(resolve_checkpoint(init) / RUN_CONFIG_FILE).get("data") or {}
    except (CheckpointError, OSError, ValueError):
        return []
    if not isinstance(data, dict):
        return []
    return [f"data.{k}={data[k]}" for k in COLUMN_KEYS if isinstance(data.get(k), str) and data[k]]


def read_setting(key: str, spec: str, cfg: Config, init: str | None = None) -> list:
    """The records of ``spec``, which config key ``key`` names; a dataset that cannot be read is a DataError that
    names the key, which --set replaces it (a paper recipe's hub name failed offline without saying whether
    data.train or data.test held it). ``init``: the checkpoint the run starts from; a file whose records are of no
    known format, read without the column mapping that checkpoint's run read its data with (:func:`init_columns`),
    is said to be read without it (the line said only to name the columns)."""
    from ..data import load_spec
    from ..data.records import DataError

    try:
        if key == "data.train":
            return load_spec(spec, cfg.task, data=cfg.data)
        return load_spec(spec, cfg.task, data=cfg.data, held_out=True)
    except DataError as e:
        fix = "--set 'data.test=[...]'" if key == "data.test" else f"--set {key}=..."
        mapped = init_columns(init, cfg) if "unrecognised record keys" in str(e) else []
        said = (
            f"; the --init checkpoint's run read its data with {' '.join(mapped)} (its run_config.json), which this "
            f"config does not set (a run takes its data settings from its own config): --set {' '.join(mapped)} "
            "reads this file so"
            if mapped
            else ""
        )
        raise DataError(f"{key}: {e}{said}; {fix} names another") from None


def set_up_run(args: argparse.Namespace) -> Setting:
    """Validate the config, read every dataset, join the processes, load the model: each failure one line before
    anything is trained (a scorer that cannot be built fails before anything is read, and so do a resume under a
    changed config and a ``--resume never`` that would delete what it may not:
    :func:`~dgrpo.training.resume_check.check_resume_config`; OUT's lock is taken first, on rank 0, and held to the
    run's end: :func:`holding_out`; a test set, a GRPO training question or an SFT training example too long for the
    context is refused from the model's tokenizer and config.json before its weights load:
    :func:`check_fits_before_training`; GRPO's reward is called on gold answers then too:
    :func:`~dgrpo.training.grpo.checked_rewards`, and so is the scorer: :func:`check_scorer_on_gold`). The hub is
    probed once for the data and the model (a hub id's files are looked up before the weights load, and again by the
    load)."""
    from ..hub import one_probe

    with one_probe():
        return read_run(args)


def read_run(args: argparse.Namespace) -> Setting:
    """:func:`set_up_run`'s work."""
    from ..config import ConfigError, to_dict
    from ..data import training_split
    from ..eval.evaluate import eval_options
    from ..eval.scoring import check_reward
    from ..model.factory import check_builtin_compiles, load_model
    from ..model.sources import check_path_exists
    from ..progress import say
    from ..training.distributed import env_int
    from ..training.model_record import record_the_models_shape
    from ..training.out_dir import check_config_writes, take_run_dir
    from ..training.resume_check import check_owned, check_resume_config, check_resume_data
    from ..training.tracking import check_installed, check_sweep_parameters

    if not args.resume.strip():  # (an empty PATH was read as the working directory)
        raise ConfigError("--resume is empty: auto, never, or a checkpoint directory")
    cfg = load(args)
    if args.cmd == "grpo" and args.init is None:
        args.init = grpo_init(cfg)
    if args.init:  # (a run's config.json names its base's commit: not --init's, unless given for it)
        cfg.model.revision = revision_for(args.init, cfg, args.overrides, "--init")
    cfg = record_init(cfg, args.init, args.out)
    check_builtin_compiles(cfg.model, args.init)  # (model.compile of the built-in model: the config knows its arch)
    if env_int("WORLD_SIZE", 1) <= 1 or env_int("RANK", 0) == 0:  # (rank 0 holds it, as RunDir's lock)
        # OUT's lock, held from now to the run's end (RunDir takes it over): another run at work there, and an OUT
        # holding what no dgrpo run wrote, are refused now, not once the data and the model are read
        take_run_dir(args.out)
        check_owned(args.out)
    # (a resume under a changed config is refused now, from OUT alone: not after the data and the model are read)
    check_resume_config(args.out, cfg, args.cmd, args.resume, args.allow_config_change)
    # (its first write was minutes in, or hours: the test sets' results)
    check_config_writes(args.out, to_dict(cfg), args.cmd, args.resume)
    check_test_sets_distinct(cfg)
    check_installed(cfg.logging.backends)
    if "wandb" in cfg.logging.backends:  # (a W&B sweep's values not passed as --set: refused before the model loads)
        check_sweep_parameters(to_dict(cfg), warn=False)
    reward = None
    if args.cmd == "grpo":  # (a plug-in kind or reward that cannot be built fails here, before the data and the model)
        from ..perturbation import make_perturbation

        make_perturbation(cfg.perturbation)
        reward = check_reward(cfg.grpo, cfg.eval.scorer)
    check_path_exists(args.init or cfg.model.name_or_path)  # (a missing --init was said after the data's warnings)
    warn_if_held_out_is_builtin(cfg)
    warn_if_prompt_options_are_set(cfg)
    device = setup(cfg)
    options = eval_options(cfg)
    train = read_setting("data.train", training_split(cfg.data.train), cfg, args.init)
    # (a resume on other data, or another reward, is refused now: not after the model is read)
    check_resume_data(args.out, cfg, args.cmd, train, reward, args.resume, args.allow_config_change)
    held_out = {spec: read_setting(key, spec, cfg, args.init) for key, spec in held_out_specs(cfg)}
    warn_if_held_out_is_trained_on(cfg, train, held_out)
    warn_if_tests_share_validation(cfg, held_out)
    tests = {spec: held_out[spec] for spec in cfg.data.test}
    valid = held_out[cfg.data.valid] if cfg.data.valid else None
    if valid is not None and cfg.data.eval_limit:  # the limit applies to the global list, before it is sharded
        valid = valid[: cfg.data.eval_limit]
    rewards = None
    if args.cmd == "grpo":  # (the reward on gold answers: not once the model has loaded, minutes for a 1.5B model)
        from ..training.grpo import checked_rewards

        rewards = checked_rewards(None, cfg, train)
    check_scorer_on_gold(cfg, options["scorer"], args.cmd, train, valid, tests)  # (so the scorer: not after the load)
    # (what the tokenizer and config.json decide is refused now, not once the weights have loaded: minutes for 1.5B)
    if (unloaded := model_without_weights(args.init or cfg.model.name_or_path, cfg)) is not None:
        check_fits_before_training(unloaded, cfg, args.cmd, tests, valid, train)
    dist, device = join_processes(cfg, device)
    # (a line on rank 0 before a directory's or the hub's weights load: with transformers' bars off, a download of
    # a large model printed nothing for minutes)
    said = say if dist.is_main else None
    lm = load_model(cfg.model, cfg.task, init=args.init, seed=cfg.seed, device=device, announce=said)
    if unloaded is None:  # (the built-in model, or one whose files could not be read without its weights)
        check_fits_before_training(lm, cfg, args.cmd, tests, valid, train)
    record_the_models_shape(cfg, lm)
    if args.cmd == "grpo":
        warn_if_init_differs(lm.run_config, cfg)
    report_model(lm, args.init or cfg.model.name_or_path, cfg, dist)
    if dist.active:  # distinct, reproducible RNG streams per rank (weights are broadcast from rank 0; rollout seeds
        seed_everything(cfg.seed * 1000003 + dist.rank)  # come from the global row anyway)
    return Setting(cfg, options, train, valid, tests, dist, device, lm, Path(args.out), rewards)


def check_scorer_on_gold(
    cfg: Config, scorer: Any, command: str, train: list, valid: list | None, tests: dict[str, list]
) -> None:
    """``eval.scorer`` called on gold answers once the data is read, before the model loads (minutes for a 1.5B
    model): SFT's on the training data, warned of when it scores them 0
    (:func:`~dgrpo.eval.scoring.warn_if_scorer_misses_gold`); GRPO's on what it scores, the validation set, else the
    first test set (:func:`~dgrpo.eval.scoring.check_scorer`: a scorer that fails or returns what it may not is
    refused)."""
    from ..eval.scoring import check_scorer, warn_if_scorer_misses_gold

    if command == "sft":
        warn_if_scorer_misses_gold(scorer, train, f"eval.scorer {cfg.eval.scorer!r}")
        return
    held_out = valid if valid is not None else next(iter(tests.values()), None)
    if held_out:
        check_scorer(scorer, held_out)


def holding_out(command: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """``command`` (``dgrpo sft`` / ``dgrpo grpo``) within :func:`~dgrpo.training.out_dir.run_dir_scope`: the lock
    :func:`set_up_run` takes on OUT is handed to the run's RunDir, or given up (nothing of it left) when the command
    ends before it."""

    @wraps(command)
    def run(args: argparse.Namespace) -> int:
        from ..training.out_dir import run_dir_scope

        with run_dir_scope():
            return command(args)

    return run


@holding_out
def run_sft(args: argparse.Namespace) -> int:
    from ..training.run_inputs import checked_once

    with checked_once():  # (the training examples, checked against the context before the load: not again)
        return sft_command(args)


def sft_command(args: argparse.Namespace) -> int:
    """:func:`run_sft`'s work."""
    from ..training.preemption import stopping
    from ..training.sft import train_sft
    from ..training.wording import command_line_words

    s = set_up_run(args)
    cfg, train, tests, dist = s.cfg, s.train, s.tests, s.dist

    advice: list[Callable[[], list[str]]] = []  # (best/'s lines: said at the end, after the consolidation lines)

    def test(lm_: Any, best_epoch: int | None) -> dict[str, float]:  # final/, then best/ (rank 0's epoch)
        metrics = evaluate_test_sets(lm_, tests, cfg, s.out, dist)
        if tests and cfg.sft.eval_every_epoch:
            last, tested = cfg.sft.num_epochs - 1, (lm_, metrics)
            metrics |= evaluate_best(best_epoch, last, tests, cfg, s.out, dist, s.device, final=tested, advice=advice)
        return metrics

    # (the run directory's refusals in the command line's words; a SIGTERM's stop after a step names it)
    with command_line_words(), stopping(partial(stopped_after, s.out)):
        train_sft(
            s.lm,
            train,
            cfg,
            s.out,
            valid=s.valid,  # (validated as dgrpo eval answers, under eval.*: the trainer's default evaluate_fn)
            dist=dist,
            resume=args.resume,
            allow_config_change=args.allow_config_change,
            final_eval=test,
        )
    print_consolidation_lines(s.out, dist, advice)
    dist.close()
    return 0


@holding_out
def run_grpo(args: argparse.Namespace) -> int:
    from ..training.run_inputs import checked_once

    with checked_once():  # (the training questions and the reward, checked before the load: not again by the trainer)
        return grpo_command(args)


def grpo_command(args: argparse.Namespace) -> int:
    """:func:`run_grpo`'s work."""
    from ..training.grpo import train_grpo
    from ..training.preemption import stopping
    from ..training.wording import command_line_words

    s = set_up_run(args)
    cfg, tests, dist = s.cfg, s.tests, s.dist
    # logged as eval/valid/accuracy, as SFT logs it (one chart for both in TensorBoard / W&B); config.json says which
    valid = {"valid": s.valid} if s.valid is not None else {}

    advice: list[Callable[[], list[str]]] = []  # (best/'s lines: said at the end, after the consolidation lines)

    def test(lm_: Any, best_step: int | None) -> dict[str, float]:  # final/, then best/ (rank 0's step)
        metrics = evaluate_test_sets(lm_, tests, cfg, s.out, dist)
        if tests:
            tested = (lm_, metrics)
            metrics |= evaluate_best(
                best_step, cfg.grpo.steps, tests, cfg, s.out, dist, s.device, final=tested, advice=advice
            )
        return metrics

    # (the run directory's refusals in the command line's words; a SIGTERM's stop after a step names it)
    with command_line_words(), stopping(partial(stopped_after, s.out)):
        train_grpo(
            s.lm,
            cfg,
            s.train,
            s.out,
            valid=valid,  # (validated under eval.*: the trainer's default evaluate_fn)
            dist=dist,
            resume=args.resume,
            allow_config_change=args.allow_config_change,
            reward_fn=s.rewards,  # (called on gold answers before the model loaded: the trainer takes it as checked)
            final_eval=test,
        )
    if dist.is_main:  # (the headline numbers are the line above, the trainer's "done in"; the file has the rest)
        print(f"dgrpo grpo: summary -> {s.out / SUMMARY_FILE}")
    print_consolidation_lines(s.out, dist, advice)
    dist.close()
    return 0


def stopped_after(out: Path) -> str:
    """What the stop line of a run that a SIGTERM stopped after a step says: the step and its checkpoint's folder,
    where the same command resumes (the newest in ``out``); "" for any other stop (at once, in the test sets,
    Ctrl-C), whose line says what it says (:func:`~dgrpo.training.preemption.stopping`)."""
    from ..run_layout import STEP_DIR
    from ..training.checkpoint import list_checkpoints
    from ..training.preemption import stopped_after_a_step

    if not stopped_after_a_step():
        return ""
    steps = {int(m[1]): p for p in list_checkpoints(out) if (m := STEP_DIR.fullmatch(p.name))}
    if not steps:  # (under torchrun, a rank on a machine of its own: rank 0 alone says it)
        return ""
    step = max(steps)
    return f"after step {step}, checkpointed in {steps[step]}"


def check_fits_before_training(
    lm: Any, cfg: Config, command: str, tests: dict, valid: list | None, train: list | None = None
) -> None:
    """What ``dgrpo sft`` / ``dgrpo grpo`` refuse of ``lm``'s context before training, in the order they came once the
    model had loaded: the test sets answered by the trained model (:func:`check_test_sets_fit`: SFT's last stage's
    thoughts; GRPO's ``grpo.n_latent`` after the markers, as it trains and saves the model), the trainer's own start
    check (the last stage's thoughts, then the training examples of ``train`` as its batches hold them:
    :func:`~dgrpo.training.sft.check_examples_fit`; GRPO's thoughts and ``grpo.max_new_tokens`` after each question
    of ``train``, as its rollouts prompt them: :func:`~dgrpo.training.grpo.check_rollouts_fit`), and the validation set
    (``valid``: SFT's :func:`~dgrpo.training.sft.check_validation_fits`; GRPO's, answered as the test sets are, from
    step 0 on). ``lm``: the model loaded, or the same without its weights (:func:`~.common.model_without_weights`),
    which decides it all before the weights load."""
    from ..training.curriculum import final_settings
    from ..training.grpo import check_rollouts_fit
    from ..training.sft import check_examples_fit, check_last_stage_fits, check_validation_fits

    if command == "sft":
        last = final_settings(cfg)
        check_test_sets_fit(lm, tests, cfg, last, "sft.c_thought")
        check_last_stage_fits(lm, cfg)  # (train_sft's start checks: then every training example as a batch holds it)
        with prompted(lm, replace(lm.settings, chat_template=cfg.data.chat_template)):  # (as train_sft sets it)
            check_examples_fit(lm, cfg, train or [], f"data.train {cfg.data.train}")
            if valid and (cfg.sft.eval_each_stage or cfg.sft.eval_every_epoch):
                check_validation_fits(lm, valid, cfg)
        return
    trained = lm.settings  # (the model GRPO trains and saves: grpo.n_latent's thoughts after the markers)
    chat = trained.chat_template or cfg.data.chat_template
    n_latent = cfg.grpo.n_latent if cfg.grpo.n_latent >= 0 else trained.n_latent
    tested = replace(trained, n_latent=n_latent, chat_template=chat, markers=True)
    check_test_sets_fit(lm, tests, cfg, tested, "grpo.n_latent")
    with prompted(lm, tested):  # (GRPOTrainer's start check: its rollouts prompt as the trained model answers)
        check_rollouts_fit(lm, n_latent, cfg, train, f"data.train {cfg.data.train}")
    if valid:
        check_sets_fit(lm, {f"data.valid {cfg.data.valid}, validated from step 0": valid}, cfg, tested, "grpo.n_latent")


@contextmanager
def prompted(lm: Any, settings: Any) -> Iterator[None]:
    """``lm`` with ``settings`` within the block, its own again after it."""
    before, lm.settings = lm.settings, settings
    try:
        yield
    finally:
        lm.settings = before


def check_test_sets_fit(lm: Any, tests: dict, cfg: Config, settings: Any, key: str) -> None:
    """The test sets are answered after the whole run, by the trained model (``settings``: its latent thoughts, set
    by ``key``, unless ``eval.n_latent`` is set) with ``eval.max_new_tokens`` tokens: the longest question of each
    (of its first ``eval.limit``) must fit the model's context, checked before training (a set that did not fit
    failed after all of it): :func:`check_sets_fit`."""
    limited = {spec: recs[: cfg.eval.limit] if cfg.eval.limit else recs for spec, recs in tests.items()}
    check_sets_fit(
        lm, {f"data.test {spec}, answered after training": r for spec, r in limited.items()}, cfg, settings, key
    )


def check_sets_fit(lm: Any, sets: dict[str, list], cfg: Config, settings: Any, key: str) -> None:
    """A ConfigError, naming the set (``sets``: records by what the line calls them), when the longest question of a
    set that ``lm`` with ``settings`` answers under ``eval.*`` (as :func:`~dgrpo.eval.evaluate.evaluate` will) does
    not fit the model's context with its thoughts and ``eval.max_new_tokens`` tokens (``key``: the option of the
    thoughts, unless ``eval.n_latent`` is set)."""
    from ..config import ConfigError
    from ..eval.evaluate import answer_layout, check_fits_context

    key = "eval.n_latent" if cfg.eval.n_latent >= 0 else key
    with prompted(lm, settings):
        lm.format_question("")  # (data.chat_template on a tokenizer without one: its own line, not a test set's)
        n_latent, _, markers = answer_layout(lm, cfg.eval.n_latent)  # (as evaluate will answer with the trained model)
        for said, recs in sets.items():
            try:
                check_fits_context(
                    lm,
                    [r.question for r in recs],
                    n_latent,
                    cfg.eval.max_new_tokens,
                    markers=markers,
                    max_question_tokens=cfg.data.max_question_tokens,
                    key=key,
                    answer_key="eval.max_new_tokens",
                )
            except ConfigError as e:
                raise ConfigError(f"{said}: {e}") from None


#: where the ``dgrpo eval`` lines printed under FSDP put best/'s test results: a folder of the run's that the run does
#: not write (``dgrpo eval`` refuses OUT/eval_best, the run's own: a later run of it would replace them)
BEST_TESTS_DIR = "best_tests"


def best_tests_dir(out: Path, spec: str) -> Path:
    """The ``--out`` of the printed ``dgrpo eval`` line for best/ on test set ``spec``: ``OUT/best_tests/<name>``."""
    return Path(out) / BEST_TESTS_DIR / results_name(spec)


def evaluate_best(
    best_step: int | None,
    final_step: int,
    tests: dict,
    cfg: Config,
    out: Path,
    dist: Any,
    device: Any,
    *,
    final: tuple[Any, dict[str, float]] | None = None,
    advice: list[Callable[[], list[str]]] | None = None,
) -> dict[str, float]:
    """The test sets for ``best/`` too (the checkpoint the paper reports: the best validation accuracy after warmup;
    SFT's under ``sft.eval_every_epoch``), into ``OUT/eval_best/``; nothing when best/ is the final model
    (``best_step`` == ``final_step``: GRPO's steps, SFT's last epoch) or was not kept, or under FSDP (a second full
    copy of the model on every rank): then what to do goes to ``advice``, said once final/ is written
    (:func:`best_lines`; without it, the commands that test best/ are printed now). Every rank calls this (rank 0's
    ``best_step``: the others' summary is empty). ``final``: the trained model and its test metrics: a best/ of the
    same weights (no step updated the model after it) is not tested again, its metrics are the final model's, said
    in a line, through ``advice`` too (at the run's end, in one process as under FSDP: :func:`final_as_best`).
    Returns the accuracies as metrics (``test_best/...``; rank 0's)."""
    from ..model.factory import load_model
    from ..model.verified import same_weights
    from ..progress import say

    best_step = dist.all_gather_objects(best_step)[0]
    if best_step is None or best_step == final_step or not (out / BEST_DIR).is_dir():
        return {}
    if dist.fsdp:
        if dist.is_main and advice is not None:  # (final/ is written after the test sets)
            advice.append(partial(best_lines, best_step, tests, out))
        elif dist.is_main:
            print("\n".join(best_eval_lines(best_step, tests, out)))
        return {}
    said = say if dist.is_main else None  # (best/ of a large model loads for a while: a line, as the run's start has)
    best = load_model(cfg.model, cfg.task, init=str(out / BEST_DIR), device=device, training=False, announce=said)
    # (the same weights read with other latent settings, e.g. an earlier SFT stage's thoughts, answer otherwise)
    same = final is not None and best.settings == final[0].settings and same_weights(best.model, final[0].model)
    if final is not None and dist.all_gather_objects(same)[0]:  # (rank 0's answer: every rank tests, or none)
        return final_as_best(best_step, tests, out, dist, final[1], advice)
    return evaluate_test_sets(best, tests, cfg, out, dist, checkpoint=BEST_DIR)


def final_as_best(
    best_step: int,
    tests: dict,
    out: Path,
    dist: Any,
    metrics: dict[str, float],
    advice: list[Callable[[], list[str]]] | None = None,
) -> dict[str, float]:
    """best/'s test metrics when it holds the final model's weights: the final model's, said in a line (rank 0), at the
    run's end through ``advice`` when given, where a run under FSDP says it (:func:`best_lines`), else now."""
    if dist.is_main and advice is not None:
        advice.append(lambda: [final_best_line(best_step, tests, out)])
    elif dist.is_main:
        print(final_best_line(best_step, tests, out))
    keys = {test_metric_key(spec): test_metric_key(spec, BEST_DIR) for spec in tests}
    return {keys[k]: v for k, v in metrics.items() if k in keys}


def final_best_line(best_step: int, tests: dict, out: Path) -> str:
    """The line that says best/ holds the final model's weights, and where their test results are."""
    where = ", ".join(str(results_dir(out, spec, FINAL_DIR)) for spec in tests)
    return (
        f"dgrpo: best/ ({best_step}) holds the final model's weights (no update after it): not tested again; its "
        f"test results are the final model's ({where})"
    )


def best_lines(best_step: int, tests: dict, out: Path) -> list[str]:
    """best/'s lines at the end of a run under FSDP, once final/ is written: that it holds the final model's weights
    (the same saved files: :func:`~dgrpo.training.consolidate.same_saved_model`; no update after best/), or the
    ``dgrpo eval`` lines that test it (:func:`best_eval_lines`)."""
    from ..training.consolidate import same_saved_model

    if same_saved_model(out / BEST_DIR, out / FINAL_DIR):
        return [final_best_line(best_step, tests, out)]
    return best_eval_lines(best_step, tests, out)


def best_eval_lines(best_step: int, tests: dict, out: Path) -> list[str]:
    """What a run under FSDP prints instead of testing ``best/`` (step or epoch ``best_step``), after its
    ``dgrpo consolidate`` lines (:func:`consolidation_lines`, which name best/ while it holds its shards only): a
    ``dgrpo eval`` line per test set. The run's config.json, which the lines take for its eval.* options, sets
    ``fsdp``, which dgrpo eval does not apply and warns of: the lines set it to none (and ``DGRPO_FSDP`` too when it
    is set here)."""
    from ..config import FSDP_ENV, fsdp_from_env
    from ..training.consolidate import unconsolidated

    once = " and best/ is consolidated (above)" if unconsolidated(out / BEST_DIR) else ""
    lines = [f"dgrpo: best/ ({best_step}) is not tested under FSDP; after the run (torchrun too){once}, each test set:"]
    env = f"{FSDP_ENV}=none " if fsdp_from_env() else ""
    for spec in tests:  # the run's config.json: its eval.* options, as the final model's tests had them
        run = f"--config {out / CONFIG_FILE} --set fsdp=none --model {out / BEST_DIR}"
        lines.append(f"  {env}dgrpo eval {run} --data {spec} --out {best_tests_dir(out, spec)}")
    return lines


def consolidation_lines(out: Path) -> list[str]:
    """A training run's last lines when model folders of ``out`` (final/, best/, SFT's stage-K/) hold their shards
    only (``fsdp: sharded``): dgrpo eval, ``--init`` and export load one once ``dgrpo consolidate`` has written its
    weights (the load's error said so, later); nothing when none does."""
    from ..training.consolidate import unconsolidated

    folders = [d for d in (out / FINAL_DIR, out / BEST_DIR, *stage_dirs(out)) if unconsolidated(d)]
    if not folders:
        return []
    head = (
        "dgrpo: these models are FSDP shards (fsdp: sharded): dgrpo eval, --init and export load one once consolidated"
    )
    return [f"{head} (in one process):", *(f"  dgrpo consolidate {d}" for d in folders)]


def print_consolidation_lines(out: Path, dist: Any, advice: Sequence[Callable[[], list[str]]] = ()) -> None:
    """:func:`consolidation_lines`, then the lines of ``advice`` (best/'s, :func:`evaluate_best`'s: :func:`best_lines`
    under FSDP, :func:`final_best_line` in one process too), from rank 0."""
    if dist.is_main and (lines := [*consolidation_lines(out), *(line for said in advice for line in said())]):
        print("\n".join(lines))
