"""What every command shares: the ``--config`` / ``--set`` options, seeding, the device, the test-set evaluation."""

from __future__ import annotations

import argparse
import json
import random
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..paths import expand_home
from ..run_layout import FINAL_DIR, results_dir, results_name

if TYPE_CHECKING:
    import torch

    from ..config import Config
    from ..eval.evaluate import EvalResult
    from ..training.distributed import Dist

#: the commands whose runs resume from their checkpoints: a SIGTERM stops them after the step under way, with a
#: checkpoint (dgrpo.training.preemption), their stop line says how to go on, and DGRPO_FSDP is their fsdp key
TRAINING_COMMANDS = ("sft", "grpo")
#: the commands a SIGTERM stops with one line (what it interrupted, what is on disk) and exit code 143, as Ctrl-C
#: does with 130; dgrpo eval has no step to finish: it stops at once, without the results of the set under way (under
#: torchrun the ranks agree after each set, and stop together); the demo's process stops at once (its runs, in worker
#: processes, end with it), or after the step under way of a run in its own process
STOPPABLE_COMMANDS = (*TRAINING_COMMANDS, "eval", "demo")
#: the column mapping's options (data.*): a row's error names the one that named a column it lacks, and eval and the
#: training commands say when a checkpoint's run mapped them
COLUMN_KEYS = ("question_key", "answer_key", "steps_key")


def positive_int(text: str) -> int:
    """An argparse type for a size or count option (the bench and experiment scripts'): an integer >= 1 (0 or less
    ended in a traceback deep in the measurement, or a division by zero)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def add_config_options(p: argparse.ArgumentParser, example: str) -> None:
    p.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="FILE",
        help="YAML config: a path or a packaged name (builtin/..., paper/..., tiny.yaml); repeatable, applied in order",
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="extend",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help=f"override options, e.g. --set {example} (one or more per --set, and --set repeatable; `dgrpo config "
        "show` lists them)",
    )


def subcommand(
    sub: Any, name: str, help: str, examples: str, description: str | None = None
) -> argparse.ArgumentParser:
    """A subcommand parser whose --help starts with ``description`` (default: ``help``, its line in the command list)
    and ends with usage examples (``help`` as written: the command list's formatter would read a '%' in it as a format
    directive)."""
    return sub.add_parser(
        name,
        help=help.replace("%", "%%"),
        description=description or help,
        epilog="examples:\n" + examples,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def load(args: argparse.Namespace) -> Config:
    """The command's config; then, when it writes to ``--out``, a one-line error early if it cannot. For dgrpo sft
    and grpo, ``DGRPO_FSDP`` overrides the ``fsdp`` key here, so that validation sees it and the run records it."""
    from ..config import FSDP_ENV, Config, ConfigError, fsdp_from_env, load_config
    from ..training.out_dir import check_output_path

    fsdp = fsdp_from_env() if getattr(args, "cmd", None) in TRAINING_COMMANDS else None
    overrides = [*args.overrides, *([f"fsdp={fsdp}"] if fsdp else [])]
    try:
        cfg = load_config(Config, list(args.config), overrides)
    except ConfigError as e:
        if fsdp and "fsdp" in str(e).lower():
            raise ConfigError(f"{e} (fsdp={fsdp} comes from {FSDP_ENV})") from None
        raise
    if getattr(args, "out", None) is not None:  # (an empty --out is one line: it would write into .)
        check_output_path(args.out)
    return cfg


def revision_for(model: str, cfg: Config, overrides: list[str], option: str) -> str:
    """The revision the hub id ``option`` names (``--init``, ``--model``) is read at: ``model.revision`` when ``--set``
    gives it, or when the config that holds it names this model. Else "", with a warning when one was set: a run's
    config.json records the commit of the model that run loaded (its base), which another model (an upload of the
    run's own) does not have."""

    from ..config import override_keys
    from ..model.sources import on_disk

    if any("model.revision" in override_keys(o) for o in overrides):  # (model.revision=X, or model={revision: X})
        return cfg.model.revision
    if not cfg.model.revision or cfg.model.name_or_path == model or on_disk(model).exists():  # (a directory: unused)
        return cfg.model.revision
    warnings.warn(
        f"model.revision={cfg.model.revision} is the revision of the config's model.name_or_path "
        f"({cfg.model.name_or_path}), not applied to {option} {model}: --set model.revision=... picks its revision",
        stacklevel=2,
    )
    return ""


def refuse_torchrun(command: str, why: str) -> None:
    """A ConfigError when a one-process command is launched under torchrun (``why``: what every rank would do)."""
    from ..config import ConfigError
    from ..training.distributed import env_int

    if env_int("WORLD_SIZE", 1) > 1:
        raise ConfigError(f"dgrpo {command} runs in one process: launch it without torchrun ({why})")


def seed_everything(seed: int) -> None:
    """Python's, NumPy's and torch's global RNGs from one integer of any size (a rank's seed under torchrun,
    ``seed * 1000003 + rank``, passes torch's 64 bits from a run seed of about 1.8e13 on; torch reads a negative
    seed modulo 2**64 too)."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed % 2**64)


def setup(cfg: Config) -> torch.device:
    """Threads, seeds and the training device of a command; transformers' per-file progress bars off (a command
    has its own progress bars, and its errors must stay one line)."""
    import torch
    from transformers.utils import logging as hf_logging

    from ..model.factory import resolve_device

    hf_logging.disable_progress_bar()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    seed_everything(cfg.seed)
    return resolve_device(cfg.device)


def join_processes(cfg: Config, device: torch.device, fsdp: bool = True) -> tuple[Dist, torch.device]:
    """The process group under torchrun (a single process otherwise), and this rank's device; ``fsdp``: whether FSDP
    applies as ``cfg.fsdp`` or ``DGRPO_FSDP`` sets it (dgrpo eval: never)."""
    import torch

    from ..training.distributed import Dist

    dist = Dist.from_env(device, fsdp=cfg.fsdp if fsdp else "none", fsdp_env=fsdp)
    if dist.active and device.type == "cuda":
        device = torch.device("cuda", dist.local_rank)
    return dist, device


def report_model(lm: Any, name: str, cfg: Config, dist: Dist | None = None) -> None:
    """At the start (rank 0): the commit of the hub repository ``name`` (``--init`` or ``model.name_or_path``) that
    was loaded, unless ``model.revision`` pinned it (so the log says which files a run used), and for LoRA its
    rank, base and how many parameters train."""
    if dist is not None and not dist.is_main:
        return
    if lm.hub_commit and lm.hub_commit != cfg.model.revision:
        print(f"dgrpo: {name}: hub commit {lm.hub_commit} (--set model.revision={lm.hub_commit} pins it)")
    if lm.peft is None:
        return
    from ..model.lora import POLICY, trainable_parameters

    n, total = trainable_parameters(lm)
    c = lm.peft.peft_config[POLICY]
    print(
        f"dgrpo: LoRA r={c.r} alpha={c.lora_alpha} on {lm.name_or_path}: {n:,} of {total:,} parameters train "
        f"({100 * n / total:.2f}%)"
    )


def prompt_settings(lm: Any, cfg: Config) -> None:
    """``data.chat_template: true`` on the command line turns the chat template on for a checkpoint or hub model
    that was not trained with it (a checkpoint trained with it keeps it)."""
    if cfg.data.chat_template:
        lm.settings.chat_template = True


def check_split(data: str, split: str | None) -> None:
    """``--split`` names a split of a dataset; a file has none (it would be ignored without a word), and joined
    datasets name each part's own (it replaced every part's: ``builtin:test+builtin:ood_steps --split valid`` was
    the valid split twice, labelled ``builtin:test+builtin:valid``)."""
    from ..config import ConfigError
    from ..data import local_path

    at_a_path = local_path(data)
    if split and at_a_path is not None and expand_home(at_a_path[0]).is_file():
        raise ConfigError(f"--split {split}: {data} is a file, which has no splits (give the split's file)")
    if split and at_a_path is None and "+" in data:
        raise ConfigError(f"--split {split}: {data} joins datasets; name each part's split in --data (a:{split}+b:...)")


def evaluate_test_sets(
    lm: Any, tests: dict, cfg: Config, out: Path, dist: Dist, checkpoint: str = FINAL_DIR
) -> dict[str, float]:
    """Eval of a trained model (``checkpoint``: final, or best) on every ``data.test`` set (``eval.*``; ``eval.limit``
    records of each), sharded over ranks; rank 0 writes :func:`results_dir`. Returns the accuracies as metrics
    (:func:`test_metric_key`; rank 0's, {} on the others). Under torchrun, where a SIGTERM only asks, the ranks
    agree after each set whether to stop (:func:`~dgrpo.training.preemption.stop_requested`), and stop together."""
    from ..eval.evaluate import eval_options
    from ..eval.results import write_results
    from ..training.preemption import stop, stop_requested

    options = eval_options(cfg)  # (the scorer built once: a plug-in file is imported once)
    metrics: dict[str, float] = {}
    for spec, recs in tests.items():
        r = evaluate_shards(lm, recs, dist, dataset=spec, limit=cfg.eval.limit, **options)
        if dist.is_main:
            r.model = str((out / checkpoint).resolve())
            write_results(r, results_dir(out, spec, checkpoint))
            print(json.dumps({"checkpoint": checkpoint, **r.summary()}))
            metrics[test_metric_key(spec, checkpoint)] = r.accuracy
        if stop_requested(dist):  # (one process: a SIGTERM has stopped it at once)
            stop(dist)
    return metrics


def evaluate_shards(
    lm: Any, records: list, dist: Dist, *, limit: int = 0, plain: bool = False, shots: int = 0, **options: Any
) -> EvalResult:
    """:func:`~dgrpo.eval.evaluate.evaluate` of ``records`` (a plain prompt's first ``shots`` its examples, then the
    first ``limit`` of the rest: the same records on any world size) with each rank answering its contiguous shard
    (one process: all); every rank returns the merged result. The scorer gets every column of the whole data on each
    shard. A failure on one rank's shard stops every rank at the gather, each with one line."""
    from ..data.records import data_columns
    from ..eval.evaluate import evaluate
    from ..eval.results import merge_results
    from ..eval.scoring import RewardError
    from ..training.sharded_eval import EVALUATION_FAILED_ELSEWHERE

    examples, rest = (records[:shots], records[shots:]) if plain and shots else ([], records)
    rest = rest[:limit] if limit else rest
    shard = dist.shard(rest)
    kwargs = {"plain": plain, "shots": shots, "columns": data_columns(rest), "progress": dist.is_main, **options}
    try:  # (a rank with no record (fewer than ranks) answers none: plain shots would leave it none to evaluate)
        r = evaluate(lm, examples + shard, **kwargs) if shard or not dist.active else None
    except Exception:  # (it failed on this rank's shard: the others learn of it at the gather, and stop)
        if dist.active:
            dist.all_gather_objects(FAILED)
        raise
    if dist.active:
        parts = dist.all_gather_objects(r)
        if FAILED in parts:
            raise RewardError(EVALUATION_FAILED_ELSEWHERE)
        r = merge_results([part for part in parts if part is not None])
    assert r is not None
    r.limit = limit
    return r


#: what a rank whose evaluation failed gives the gather (:func:`evaluate_shards`)
FAILED = "failed"


def test_metric_key(spec: str, checkpoint: str = FINAL_DIR) -> str:
    """The metrics key of a test set's accuracy: ``test/<name>/accuracy`` for final/, ``test_best/<name>/accuracy``
    for best/ (``<name>``: the folder name of its results, :func:`~dgrpo.run_layout.results_name`)."""
    prefix = "test" if checkpoint == FINAL_DIR else f"test_{checkpoint}"
    return f"{prefix}/{results_name(spec)}/accuracy"


def model_without_weights(name: str, cfg: Config) -> Any:
    """The :class:`~dgrpo.model.latent_lm.LatentLM` the training commands load from ``name`` (``--init`` or
    ``model.name_or_path``: a checkpoint, run or LoRA adapter directory, or a hub id at ``model.revision``) as far as
    its small files make it, on the meta device: its tokenizer with the latent markers, its latent settings
    (``latent_config.json``) and the context its config.json gives (``max_position_embeddings``, GPT-2's
    ``n_positions``, ...), no weights read. What needs only these (a test set that does not fit the context) is
    refused with it before the weights load (minutes for a 1.5B model). None for the built-in model (built in
    seconds), a model that runs its repository's own code, and whatever cannot be read so: the loaded model is
    checked then, and the load says what is wrong with its files."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from ..model.latent_lm import LatentLM, read_latent_files
    from ..model.lora import adapter_base, adapter_base_revision, is_adapter_dir
    from ..model.sources import BUILTIN, hub_files, on_disk, resolve_checkpoint, resolve_model_source
    from ..model.tokens import load_tokenizer

    if name == BUILTIN or cfg.model.trust_remote_code:
        return None
    try:
        local = on_disk(name)
        folder = resolve_checkpoint(local) if local.exists() else hub_files(name, cfg.model.revision or None)[0]
        config_from, revision = str(folder), None
        if is_adapter_dir(folder):  # (the context is its base's)
            revision = adapter_base_revision(folder)
            config_from, local_only = resolve_model_source(adapter_base(folder), revision)
        else:
            local_only = True
        config = AutoConfig.from_pretrained(config_from, local_files_only=local_only, revision=revision)
        with torch.device("meta"):  # (no memory, nothing drawn: the shapes alone)
            model = AutoModelForCausalLM.from_config(config)
        settings, _ = read_latent_files(folder)
        with warnings.catch_warnings():  # (what it warns of, the load warns of: once)
            warnings.simplefilter("ignore")
            return LatentLM(model, load_tokenizer(str(folder)), settings)
    except Exception:  # noqa: BLE001 - the load reads these files again, and says what is wrong with them
        return None
