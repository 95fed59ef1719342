"""``dgrpo eval``: pass@1 of a checkpoint (or of a plain causal LM with a chain-of-thought prompt) on one or more
datasets (the model loaded once; with several, each dataset's results in a folder of its own under ``--out``).

A checkpoint written by ``dgrpo sft`` / ``dgrpo grpo`` carries the config it was trained with (``run_config.json``);
eval starts from its task and data settings and its ``model.dtype``, so ``--data builtin:test`` is the run's own test
set, evaluated as the run evaluated it. ``--config`` and ``--set`` still win, and the command says which settings
it took from the checkpoint and which were overridden. Under torchrun each rank answers a contiguous shard of every
dataset, and rank 0 writes the gathered results.
"""

from __future__ import annotations

import argparse
import json
import re
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..paths import expand_home
from .common import (
    COLUMN_KEYS,
    add_config_options,
    check_split,
    evaluate_shards,
    join_processes,
    model_without_weights,
    prompt_settings,
    revision_for,
    setup,
    subcommand,
)

if TYPE_CHECKING:
    import torch

    from ..config import Config
    from ..data.records import Record
    from ..model.latent_lm import LatentLM

EXAMPLES = """  dgrpo eval --model runs/grpo --data builtin:test --out runs/eval    # a run directory means its final/
  dgrpo eval --model runs/grpo --out runs/eval-own                    # no --data: the run's own test sets
  dgrpo eval --model runs/grpo/best --data gsm8k --limit 200 --out runs/eval-gsm8k
  dgrpo eval --model runs/grpo --data gsm8k svamp multiarith gsm-hard --out runs/eval   # runs/eval/gsm8k/, ...
  dgrpo eval --model Qwen/Qwen2.5-1.5B --data gsm8k --plain --shots 1 --out runs/base   # a plain LM, 1-shot prompt
  torchrun --nproc_per_node 8 -m dgrpo eval --model runs/grpo --data gsm8k --out runs/eval8   # each rank a shard
"""
#: what eval takes from the checkpoint's run_config.json (the definition of the task and of a prompt, and the
#: weights' dtype, so that a bf16 run's checkpoint is evaluated as its run evaluated it)
CHECKPOINT_SECTIONS = {
    "model": ("dtype",),
    "task": None,
    "data": ("max_question_tokens", "max_target_tokens", "question_key", "answer_key", "steps_key", "test"),
    "eval": ("scorer",),
}


def register(sub: Any) -> None:
    p = subcommand(sub, "eval", "pass@1 of a checkpoint on one or more datasets", EXAMPLES)
    add_config_options(p, "eval.max_new_tokens=128")
    p.add_argument("--model", required=True, help="checkpoint directory, run directory or hub id")
    p.add_argument(
        "--data",
        action="extend",  # (--data a --data b is both, as --set is; the second replaced the first without a word)
        nargs="+",
        metavar="DATA",
        help="dataset name (gsm8k, svamp, builtin:test, ...) or file path; several (--data a b, or --data "
        "repeated): each evaluated in turn, its results in OUT/<name>/ (default: the test sets the checkpoint's run "
        "was tested on, its data.test: a relative path found from here, else from the folder the run started in)",
    )
    p.add_argument(
        "--split", help="dataset split, in place of one a --data name gives (default: the one it gives, else test)"
    )
    p.add_argument("--limit", type=int, help="evaluate the first N records (0: all, as eval.limit)")
    p.add_argument(
        "--out",
        required=True,
        help="writes results.json and predictions.jsonl here (one folder per --data of several); an earlier dgrpo "
        "eval's results there that this one does not rewrite are kept, and named in a warning; those it would "
        "replace are refused when another model or dataset wrote them (--overwrite replaces them)",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the results another model (or another dataset) left in the folders --out writes into (by "
        "default refused: a second checkpoint evaluated into the first's --out replaced its results without a word)",
    )
    p.add_argument(
        "--plain",
        action="store_true",
        help="plain causal LM with a chain-of-thought prompt (no latents); its answer is what it writes before a next "
        "'Question' turn",
    )
    p.add_argument(
        "--shots", type=int, help="with --plain: worked examples in the prompt (taken from the start of the data)"
    )
    p.set_defaults(func=run)


def checkpoint_settings(model: str, revision: str = "") -> tuple[dict, str]:
    """(settings, commit): the task, data, dtype and scorer settings a checkpoint was trained with, a local one or one
    uploaded to the hub (at ``revision``) ({} for a plain model or an older checkpoint), and for a hub id the commit
    they were read at ("" for a directory), at which the weights are then read too: a branch that moves in between
    does not mix two commits. A model that cannot be found (a mistyped path, a hub id neither cached nor reachable)
    is a CheckpointError here, before the data are read with settings that are not the checkpoint's."""
    from ..model.sources import hub_files, on_disk, resolve_checkpoint
    from ..model.verified import RUN_CONFIG_FILE

    commit = ""
    if on_disk(model).exists():  # (checkpoints/step-N names step-0000000N: the model loads from it too)
        trained = resolve_checkpoint(model) / RUN_CONFIG_FILE
    else:
        folder = hub_files(model, revision or None)[0]
        trained = folder / RUN_CONFIG_FILE
        commit = folder.name if re.fullmatch(r"[0-9a-f]{40}", folder.name) else ""  # (a snapshot's folder: its commit)
    if not trained.is_file():
        return {}, commit
    from ..model.verified import CheckpointError, read_json_object

    run = read_json_object(trained)
    if bad := [s for s in CHECKPOINT_SECTIONS if not isinstance(run.get(s) or {}, dict)]:
        raise CheckpointError(f"{trained} is not valid: its {bad[0]!r} is not an object")
    out: dict = {}
    for section, keys in CHECKPOINT_SECTIONS.items():
        values = run.get(section) or {}
        out[section] = dict(values) if keys is None else {k: values[k] for k in keys if k in values}
    _check_known_task_keys(out["task"], trained)
    return out, commit


def _check_known_task_keys(task: dict, trained: Path) -> None:
    """A checkpoint's task option this dgrpo does not know (written by another version) is one line naming the
    file: it was 'unknown config key task.X', as if the command line had given it."""
    from dataclasses import fields
    from importlib.metadata import version

    from ..config import TaskConfig
    from ..model.verified import CheckpointError

    if unknown := sorted(set(task) - {f.name for f in fields(TaskConfig)}):
        raise CheckpointError(
            f"{trained} defines the task with task.{unknown[0]}, not an option of this dgrpo ({version('dgrpo')}): "
            "the checkpoint was trained by another version; evaluate it with that one (its run's applied.json names "
            "it)"
        )


def explain(start: dict, cfg: Any, configs: list[str] | None = None, local: bool = True) -> str | None:
    """One line: which settings came from the checkpoint and which the command line changed."""
    if not start:
        return None
    taken: list[str] = []
    changed: list[str] = []
    for section, values in start.items():
        for k, v in values.items():
            (taken if getattr(getattr(cfg, section), k) == v else changed).append(f"{section}.{k}")
    line = f"dgrpo eval: task, data, dtype and scorer settings from the checkpoint's run_config.json ({len(taken)} kept"
    line += f"; overridden: {', '.join(changed)})" if changed else ")"
    # decoding is the command's own: the run's test sets used the run's eval.* (its config.json has them)
    if configs:
        return line + f"; decoding (eval.*) from this command and its --config {' '.join(configs)}"
    if not local:  # (a checkpoint from the hub: its run directory is not at hand)
        return line + "; decoding (eval.*) from this command"
    return line + "; decoding (eval.*) from this command: --config RUN/config.json for the run's own"


def model_label(model: str, revision: str | None = None) -> str:
    """How results name the model evaluated: a local checkpoint's absolute directory (a run directory's final/, a
    resumable checkpoint's model/), else ``--model`` as given (a hub id), with ``@commit`` when it was read from the
    hub at that ``revision``."""
    from ..model.sources import resolve_checkpoint
    from ..model.verified import CheckpointError

    try:
        return str(resolve_checkpoint(model).resolve())
    except CheckpointError:  # not a local checkpoint
        return f"{model}@{revision}" if revision else model


def dataset_label(data: str, split: str | None) -> str:
    """How results name what was evaluated: ``--data``, with ``--split`` in place of a split it names (the option
    wins: ``builtin:test --split valid`` is ``builtin:valid``)."""
    from ..data import local_path

    if not split:
        return data
    at_a_path = local_path(data)
    if at_a_path is not None:  # (a path may hold ':' and '?')
        return f"{at_a_path[0]}:{split}"
    head, q, query = data.partition("?")
    return f"{head.rsplit(':', 1)[0]}:{split}{q}{query}"


def run(args: argparse.Namespace) -> int:
    from ..eval.evaluate import eval_options
    from ..eval.results import write_results
    from ..eval.scoring import RewardError
    from ..hub import one_probe
    from ..training.preemption import in_test_sets, stop, stop_requested, stopping

    done = Done()
    # (SIGTERM, Ctrl-C: the stop line says what was written; under torchrun a SIGTERM stops a rank at once until the
    # ranks agree before the first dataset (nothing evaluated: a rank whose peer refused at the start, which torchrun
    # then sends SIGTERM, ended at its SIGKILL 30 s later), from then on it only asks, and they agree after each
    # dataset: rank 0's notice says so; the hub probed once for the model's settings, weights and data)
    with stopping(done.line), one_probe():
        cfg, datas, started_in, from_checkpoint = _eval_config(args)
        e = cfg.eval
        outs = output_dirs(datas, args.split, Path(args.out), given=bool(args.data))
        device = setup(cfg)
        options = eval_options(cfg)  # (a scorer that cannot be built fails here, before the data and the model load)
        sets = _read_sets(outs, args.split, cfg, options["scorer"], started_in, from_checkpoint)
        warn_fsdp_not_applied(cfg)
        warn_of_earlier_results(Path(args.out), outs.values())
        check_replaced_results(outs, args.split, model_label(args.model, cfg.model.revision or None), args.overwrite)
        check_datasets_fit(args.model, cfg, sets, args.split)  # (before the weights load and any set answered)
        # (under torchrun: each rank answers a shard of every set, with the whole model)
        dist, device = join_processes(cfg, device, fsdp=False)
        lm = _load_eval_model(args.model, cfg, device)
        accuracies = []
        if stop_requested(dist):  # (under torchrun: every rank loaded, none stopped; from here a SIGTERM only asks)
            stop(dist)
        with in_test_sets(tested="dataset", left=EVALUATED_LEFT):  # (a notice: 'at the end of the dataset under way')
            for data, recs in sets.items():
                name = done.start(dataset_label(data, args.split), len(sets))
                how: dict[str, Any] = {"plain": e.plain, "shots": e.shots, "limit": e.limit, **options}
                try:
                    r = evaluate_shards(lm, recs, dist, dataset=name, **how)
                except RewardError as err:  # (a scorer failing on one set of several: which, and what is written)
                    raise type(err)(f"{err}; {done.line()}") from None
                if dist.is_main:
                    r.model = model_label(args.model, lm.hub_commit)
                    write_results(r, outs[data])  # (whole or not at all)
                    print(json.dumps(r.summary()))
                done.wrote(outs[data])
                accuracies.append(f"{name} {100 * r.accuracy:.2f}% ({r.correct}/{r.n})")
                if stop_requested(dist):  # (one process: a SIGTERM has stopped it at once)
                    stop(dist)
        if len(sets) > 1 and dist.is_main:
            print(f"dgrpo eval: {'; '.join(accuracies)}")
    dist.close()
    return 0


def check_datasets_fit(model: str, cfg: Config, sets: dict[str, list], split: str | None) -> None:
    """Each dataset's longest prompt checked against the context of ``model`` as it will be answered
    (:func:`~dgrpo.eval.evaluate.check_evaluation_fits`, :func:`~dgrpo.eval.evaluate.evaluate`'s own check) with the
    model built from its tokenizer and config.json alone (:func:`~.common.model_without_weights`): a set too long is
    refused, named, before the weights load and before any set is answered; nothing when that model cannot be built
    (evaluate checks each set then, once loaded)."""
    from ..config import ConfigError
    from ..eval.evaluate import check_evaluation_fits, eval_options

    if (lm := model_without_weights(model, cfg)) is None:
        return
    prompt_settings(lm, cfg)
    e = cfg.eval
    for data, recs in sets.items():
        try:
            check_evaluation_fits(lm, recs, plain=e.plain, shots=e.shots, limit=e.limit, **eval_options(cfg))
        except ConfigError as err:
            raise ConfigError(f"{dataset_label(data, split)}: {err}") from None


def warn_fsdp_not_applied(cfg: Config) -> None:
    """``fsdp`` (the config key, as ``--config RUN/config.json`` of an FSDP run gives it, or ``DGRPO_FSDP``) is not
    applied by dgrpo eval: a warning says so (under torchrun it was ignored without a word; in one process the line
    said to launch with torchrun, which applies it no more)."""
    from ..config import FSDP_ENV, fsdp_setting

    mode = fsdp_setting(cfg.fsdp)
    if mode != "none":  # (under torchrun rank 0 says it: the command line prints rank 0's UserWarnings alone)
        warnings.warn(
            f"fsdp={mode} ({FSDP_ENV} or the config key) is not applied by dgrpo eval: every rank loads the whole "
            "model (under torchrun each answers its shard of every dataset)",
            stacklevel=1,
        )


#: what a SIGTERM to a torchrun job of dgrpo eval leaves (the ranks stop after the dataset under way)
EVALUATED_LEFT = "the results of every dataset evaluated by then are written"


#: what a stop (SIGTERM, Ctrl-C) before the first dataset leaves; the command line's stop line for a stop while
#: dgrpo's modules load, before this command runs
NOTHING_YET = "before the evaluation: nothing was written"


@dataclass
class Done:
    """How far dgrpo eval got, for the line a stop (SIGTERM, Ctrl-C) ends it with: the dataset under way, and the
    results folders written (each whole: :func:`~dgrpo.eval.results.write_results`)."""

    n: int = 0  # datasets to evaluate
    under_way: str = ""  # the dataset being evaluated ("" between two)
    written: list[str] = field(default_factory=list)

    def start(self, name: str, n: int) -> str:
        """Dataset ``name`` (one of ``n``) is under way; returns ``name``."""
        self.n, self.under_way = n, name
        return name

    def wrote(self, folder: Path) -> None:
        self.written.append(str(folder))
        self.under_way = ""

    def line(self) -> str:
        """What was interrupted, and what is on disk."""
        written = f"written: {', '.join(self.written)}"
        if self.under_way:
            which = f"{self.under_way} ({len(self.written) + 1} of {self.n})" if self.n > 1 else self.under_way
            lost = f"its results were not written; {written}" if self.written else "nothing was written"
            return f"while evaluating {which}: {lost}"
        if self.written:
            return f"after {len(self.written)} of {self.n} datasets: {written}"
        return NOTHING_YET


def _eval_config(args: argparse.Namespace) -> tuple[Config, list[str], list[Path] | None, list[str]]:
    """The evaluation's config: the options given, over the checkpoint's own settings (a hub id's read at one
    commit, whose weights then load); ``--out`` checked first, before anything is read from the checkpoint. And the
    datasets to evaluate: ``--data``, else ``data.test`` as ``--config`` / ``--set`` or the checkpoint's run set it
    (the run's own test sets); a model with none named (a plain hub model, a run with none) is one line. And, when
    they are the checkpoint's run's test sets as it recorded them, the folders its processes started in
    (:func:`~dgrpo.training.resume_check.start_folders`: [] when none is recorded), else None. And the column
    mapping's settings taken from the checkpoint, neither ``--config`` nor ``--set`` giving them
    (``data.question_key=prompt``, ...: a file of other columns does not have them)."""
    from ..config import Config, ConfigError, DataConfig, TaskConfig, load_config
    from ..model.sources import on_disk, resolve_checkpoint
    from ..training.out_dir import check_not_a_training_run, check_output_path
    from ..training.preemption import is_rank0
    from ..training.resume_check import start_folders
    from .train import absolute_file

    extra = []
    if args.limit is not None:
        extra.append(f"eval.limit={args.limit}")
    if args.plain:
        extra.append("eval.plain=true")
    if args.shots is not None:
        extra.append(f"eval.shots={args.shots}")
    # the options alone, and --out, before the checkpoint is read; task.* and data.* only over the checkpoint's own
    # (data.answer_key alone completes the column mapping it records; task.n_steps=2 fits its task's sizes, not the
    # defaults': each was refused)
    given = load_config(Config, list(args.config), [*args.overrides, *extra], validate=False)
    replace(given, data=DataConfig(), task=TaskConfig()).validate()
    check_output_path(args.out)
    check_not_a_training_run(args.out)
    if not args.model.strip():
        raise ConfigError("--model is empty: name a checkpoint directory, a run directory or a hub id")
    for data in args.data or []:  # (a --split these cannot take: one line before a hub model's settings are read)
        check_split(data, args.split)
    revision = revision_for(args.model, given, args.overrides, "--model")
    start, commit = checkpoint_settings(args.model, revision)
    cfg = load_config(Config, list(args.config), [*args.overrides, *extra], start=start)
    cfg.eval.scorer = absolute_file(cfg.eval.scorer)  # (results.json names it: reproducible from any folder)
    if commit or not revision:  # the weights from the commit the settings came from (not another model's revision)
        cfg.model.revision = commit
    taken = [
        f"data.{k}={getattr(cfg.data, k)}" for k in COLUMN_KEYS if getattr(cfg.data, k) and not getattr(given.data, k)
    ]
    note = explain(start, cfg, list(args.config), local=on_disk(args.model).exists())
    if note and is_rank0():  # (under torchrun: once)
        print(note)
    if cfg.eval.shots and not cfg.eval.plain:  # (--shots, or eval.shots in a config)
        raise ConfigError(
            "--shots / eval.shots: a k-shot prompt is for a plain LM (--plain); a latent model is prompted as trained"
        )
    for line in cfg.inert_eval_settings():
        warnings.warn(line, stacklevel=1)
    if args.data:
        return cfg, list(args.data), None, taken
    if not cfg.data.test or ("test" not in start.get("data", {}) and given.data.test == DataConfig().test):
        whose = "names no test sets (its data.test is [])" if start and not cfg.data.test else "names none"
        raise ConfigError(f"--data: name the datasets to evaluate ({args.model} {whose})")
    if cfg.data.test != start.get("data", {}).get("test"):
        return cfg, list(cfg.data.test), None, taken
    folders = start_folders(resolve_checkpoint(args.model)) if on_disk(args.model).exists() else []
    check_run_test_files(cfg.data.test, folders)
    return cfg, list(cfg.data.test), folders, taken


def check_run_test_files(specs: list[str], folders: list[Path] | None = None) -> None:
    """The test sets a checkpoint's run recorded keep their paths as typed (relative to the folder the run started
    from): one found neither from here nor from ``folders`` (those the run's processes started in, as its
    ``applied.json`` records them: :func:`~dgrpo.training.resume_check.data_spec_from`) is one line saying so, before
    the model loads (it read 'file not found (a relative path is read from the working directory, ...)', naming no
    run)."""
    from ..config import ConfigError
    from ..data.loaders import names_a_file
    from ..training.resume_check import data_spec_from

    for spec in specs:
        for part in spec_parts(data_spec_from(spec, folders or [])):  # (a part found there: absolute)
            path = expand_home(part)
            if names_a_file(part) and not path.is_absolute() and not path.exists():
                named = part if part == spec else f"{part} (of {spec})"
                fix = "" if folders else "run dgrpo eval from that folder, or "
                raise ConfigError(
                    f"--data: the checkpoint's run was tested on {named} (its data.test), a path relative to the "
                    f"folder that run started from, not found from {Path.cwd()}{_nor_from(folders)}: {fix}name the "
                    "file with --data"
                )


def _nor_from(folders: list[Path] | None) -> str:
    """Where else a run's test set was looked for: `` nor from F (where its run started)`` ('' with no folder)."""
    return f" nor from {' or '.join(map(str, folders))} (where its run started)" if folders else ""


def spec_parts(spec: str) -> list[str]:
    """The datasets a spec reads (:func:`~dgrpo.data.join_parts`): itself when it names a local path, else each part
    joined by ``+`` (a+b.jsonl is read as a.jsonl then b.jsonl; 'a.jsonl+b.jsonl' as one path was not found, and a
    run tested on them refused from the very folder it ran in)."""
    from ..data import join_parts

    return join_parts(spec)


def run_test_set_unread(spec: str, exc: Exception, folders: list[Path] | None = None) -> str | None:
    """The line for a run's test set ``spec`` that failed to read (``exc``) as a hub dataset, a part of it naming no
    local folder or file from here (a dataset folder the run read from the folder it started in, ``mydata`` or
    ``mydata:test``, was 'unknown dataset 'mydata': ... the Hugging Face hub could not be reached', naming no run),
    nor from ``folders``, those the run started in (then the line names them); None when the failure is no such
    part's, or one the hub answered (a split or a row of a hub dataset)."""
    from ..data.loaders import HubUnreached, reads_from_the_hub

    if not (isinstance(exc, HubUnreached) and exc.unknown):  # (not a hub dataset the hub answered: a split, a row)
        return None
    for part in spec_parts(spec):
        if reads_from_the_hub(part) and part.partition("?")[0].partition(":")[0] == exc.name:
            named = part if part == spec else f"{part} (of {spec})"
            relative = "a path is relative to the folder that run started from; run dgrpo eval from that folder, or "
            return (
                f"--data: the checkpoint's run was tested on {named} (its data.test), no folder or file from "
                f"{Path.cwd()}{_nor_from(folders)}, nor read from the hub ({exc.reason}): "
                f"{'' if folders else relative}name the data with --data"
            )
    return None


def _read_sets(
    outs: dict[str, Path],
    split: str | None,
    cfg: Config,
    scorer: Any,
    started_in: list[Path] | None = None,
    from_checkpoint: list[str] | None = None,
) -> dict[str, list[Record]]:
    """Every ``--data``'s records, read before the model loads (a wrong name fails at once); a set with nothing to
    evaluate is one line, a scorer that gives its gold answers 0 is warned about. ``started_in``: the sets are the
    checkpoint's run's test sets, and these the folders its processes started in: a part naming nothing from here
    is read from them (:func:`~dgrpo.training.resume_check.data_spec_from`; still named as typed), and
    :func:`run_test_set_unread` says what a failed read may mean. ``from_checkpoint``: the column mapping's settings
    taken from the checkpoint (:func:`_eval_config`), which a file's missing column is then said to come from
    (the line named an option the command line never gave)."""
    from ..config import ConfigError
    from ..data import load_spec
    from ..data.records import DataError
    from ..eval.scoring import warn_if_scorer_misses_gold
    from ..training.resume_check import data_spec_from

    e, sets = cfg.eval, {}
    for data in outs:
        read = data_spec_from(data, started_in or [])
        if read != data:  # (read from the folder the run started in: a file found there has no split either)
            check_split(read, split)
        try:
            recs = sets[data] = load_spec(read, cfg.task, split=split, data=cfg.data, held_out=True)
        except DataError as exc:
            if started_in is not None and (line := run_test_set_unread(data, exc, started_in)) is not None:
                raise ConfigError(line) from None
            named = [c for c in from_checkpoint or [] if f"({c.partition('=')[0]})" in str(exc)]
            if named:  # (the option the line names is one the command line never gave)
                raise DataError(
                    f"{exc}; {named[0]} is the checkpoint's run's column mapping (its run_config.json): --set "
                    "data.question_key=... data.answer_key=... names this file's columns"
                ) from None
            raise
        n = len(recs) - (e.shots if e.plain else 0)
        if n <= 0 or (e.limit and min(n, e.limit) <= 0):
            raise DataError(f"{data}: nothing to evaluate ({len(recs)} records, {e.shots} of them used as shots)")
        warn_if_scorer_misses_gold(scorer, recs, f"eval.scorer {e.scorer!r} on {data}")  # (0% by design)
    return sets


def _load_eval_model(model: str, cfg: Config, device: torch.device) -> LatentLM:
    """The model evaluated, prompted as ``cfg`` says, after a line on rank 0 (one process whatever ``RANK`` says:
    :func:`~dgrpo.training.preemption.is_rank0`) saying what loads from where (with transformers' bars off, a
    download of a large model printed nothing for minutes); a plain LM evaluated as a latent model, and
    ``eval.n_latent`` set for a model trained without latent thoughts (it answers with none: the option was dropped
    silently), are warned about."""
    from ..model.factory import load_model
    from ..progress import say
    from ..training.preemption import is_rank0

    said = say if is_rank0() else None
    lm = load_model(cfg.model, cfg.task, init=model, device=device, training=False, announce=said)
    if lm.new_latent_tokens and not cfg.eval.plain:
        warnings.warn(
            f"{model} is a plain LM (it had no trained {', '.join(lm.new_latent_tokens)}): it is evaluated "
            "as a latent model whose markers' embeddings are new and untrained; pass --plain for a plain LM's "
            "chain-of-thought prompt",
            stacklevel=1,
        )
    if cfg.eval.n_latent > 0 and not cfg.eval.plain and lm.settings.mode in ("cot", "no_cot"):
        warnings.warn(
            f"eval.n_latent={cfg.eval.n_latent} does not apply: {model} was trained without latent thoughts "
            f"(sft.mode={lm.settings.mode}) and answers with none",
            stacklevel=1,
        )
    prompt_settings(lm, cfg)
    return lm


def warn_of_earlier_results(out: Path, written: Iterable[Path]) -> None:
    """Warn (rank 0, before the model loads) when ``out`` holds an earlier ``dgrpo eval``'s results that this one,
    writing into the folders ``written``, does not rewrite (``OUT/results.json`` beside new ``OUT/<name>/`` folders,
    or the reverse, or a dataset not named now): a script reading them would read another evaluation's numbers.
    They are kept (results of other datasets, gathered in one folder, are a user's to keep)."""
    from ..eval.results import stale_results
    from ..training.preemption import is_rank0

    summaries = stale_results(out, written)
    if summaries and is_rank0():
        warnings.warn(
            f"{out} also holds an earlier dgrpo eval's results that this one does not rewrite (kept): "
            f"{', '.join(str(p) for p in summaries)}; they are not this evaluation's",
            stacklevel=1,
        )


def check_replaced_results(outs: dict[str, Path], split: str | None, model: str, overwrite: bool = False) -> None:
    """ConfigError (before the model loads) when a folder this evaluation writes into holds an earlier ``dgrpo
    eval``'s ``results.json`` of another model (``model``: :func:`model_label`; a hub id at another commit is the same
    model) or of another dataset, unless ``overwrite``: comparing two checkpoints, a second evaluated into the first's
    ``--out`` replaced its results without a word. The same model on the same dataset (again, with another
    ``--limit`` or decoding) replaces its own results, as before."""
    from ..config import ConfigError
    from ..eval.results import is_results_file

    if overwrite:
        return
    for data, folder in outs.items():
        path = folder / "results.json"
        if not is_results_file(path):
            continue
        earlier = json.loads(path.read_text())
        dataset, wrote = dataset_label(data, split), earlier.get("model")
        other = []
        if not (isinstance(wrote, str) and _same_model(wrote, model)):
            other.append(f"model {wrote}" if isinstance(wrote, str) else "a model it does not name")
        if earlier["dataset"] != dataset:
            other.append(f"dataset {earlier['dataset']}")
        if other:
            raise ConfigError(
                f"--out: {path} holds the results of {' on '.join(other)}, not of {model} on {dataset}: name "
                "another --out to keep them, or pass --overwrite to replace them"
            )


def _same_model(earlier: str, now: str) -> bool:
    """Whether results naming ``earlier`` (:func:`model_label`) are of the model ``now`` names: the same directory,
    or the same hub id (at any commit: ``ID@COMMIT``)."""
    if earlier == now:
        return True
    if Path(earlier).is_absolute() or Path(now).is_absolute():  # (a local checkpoint: its directory alone)
        return False
    return (earlier.rpartition("@")[0] or earlier) == (now.rpartition("@")[0] or now)


def output_dirs(datas: list[str], split: str | None, out: Path, given: bool = True) -> dict[str, Path]:
    """Where each ``--data``'s results go: ``--out`` for one, ``--out/<name>`` for several (the name as the training
    commands name their test sets' folders). A dataset named twice, or two whose folders would coincide, is one
    line; so is a ``--split`` a dataset cannot take. ``given``: ``datas`` is ``--data`` (else ``data.test``, the
    default, which ``--split`` can make two of the same)."""
    from ..config import ConfigError
    from ..data import dataset_key
    from ..run_layout import results_name
    from ..training.out_dir import check_output_path

    for data in datas:
        check_split(data, split)
    if len(datas) == 1:
        return {datas[0]: out}
    dirs: dict[str, Path] = {}
    keys: dict[str, str] = {}
    for data in datas:
        folder, key = out / results_name(dataset_label(data, split)), dataset_key(data, split)
        twin = next((d for d, f in dirs.items() if f == folder), None)
        if split and not given and (twin or keys.get(key)):  # (the run's test sets, distinct as it recorded them)
            raise ConfigError(
                f"--split {split}: data.test's {twin or keys[key]} and {data} both become "
                f"{dataset_label(data, split)}: name the datasets to evaluate with --data"
            )
        if twin is not None:
            raise ConfigError(f"--data {twin} and {data}: both would write {folder} (name each dataset once)")
        if key in keys:
            raise ConfigError(f"--data {keys[key]} and {data}: both name {key} (name each dataset once)")
        # (a file in its place: FileExistsError's traceback once the dataset was evaluated, under torchrun from rank 0
        # while the others ended without a word)
        check_output_path(folder, f"--out: {data}'s results folder")
        dirs[data], keys[key] = folder, data
    return dirs
