"""Checkpoint conversions: ``import-coconut`` (the official Coconut code's checkpoints), ``consolidate`` (FSDP
shards), ``export --merge`` (a LoRA adapter checkpoint as one full model)."""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

from .common import refuse_torchrun, subcommand

IMPORT_EXAMPLES = """  # the official GSM8K run (args/gsm_coconut.yaml: c_thought 2, max_latent_stage 3,
  # epochs_per_stage 3): checkpoint_10 on have all 6 thoughts, earlier ones their stage's (read from N)
  dgrpo import-coconut YOUR_SAVE_PATH/gsm-coconut/checkpoint_N --base openai-community/gpt2 \\
      --c-thought 2 --max-latent-stage 3 --epochs-per-stage 3 --out runs/coconut-gsm8k
  dgrpo grpo --init runs/coconut-gsm8k --config paper/grpo_dropout.yaml --out runs/coconut-gsm8k-dgrpo
  dgrpo import-coconut ckpt --base ./llama-dir --c-thought 1 --n-latent 6 --out runs/imported   # the count directly
  dgrpo import-coconut gsm-cot/checkpoint_N --base openai-community/gpt2 --c-thought 2 --out runs/cot  # CoT stage
  # a pause-as-thought run (coconut: False, cot: False, no_thoughts: False, no_cot: False): <|latent|> pause tokens
  dgrpo import-coconut gsm-pause/checkpoint_N --base openai-community/gpt2 --mode pause \\
      --c-thought 2 --max-latent-stage 3 --epochs-per-stage 3 --out runs/pause-gsm8k
"""


def register(sub: Any) -> None:
    """The checkpoint tools' subcommands: ``import-coconut``, ``consolidate`` and ``export``."""
    _add_import_parser(sub)
    _add_consolidate_parser(sub)
    _add_export_parser(sub)


def _add_import_parser(sub: Any) -> None:
    """The ``import-coconut`` subcommand: an official Coconut checkpoint to a dgrpo checkpoint directory."""
    p = subcommand(
        sub,
        "import-coconut",
        "convert a checkpoint of the official Coconut code (facebookresearch/coconut) to a dgrpo checkpoint directory",
        IMPORT_EXAMPLES,
    )
    p.add_argument("ckpt", metavar="CKPT", help="the file run.py saved (torch.save of a state dict; read weights-only)")
    p.add_argument(
        "--base", required=True, help="the run's model_id: a hub id or a local directory (config and tokenizer only)"
    )
    p.add_argument("--out", required=True, help="the dgrpo checkpoint directory to write (must not exist or be empty)")
    p.add_argument(
        "--c-thought", type=int, required=True, metavar="C", help="the run's c_thought: latent thoughts per step"
    )
    p.add_argument(
        "--max-latent-stage",
        type=int,
        metavar="S",
        help="the run's max_latent_stage: n_latent = c_thought * max_latent_stage, stage = max_latent_stage + 1",
    )
    p.add_argument(
        "--n-latent",
        type=int,
        metavar="T",
        help="latent thoughts at inference; with the others it must follow Coconut's rule "
        "n_latent = c_thought * min(stage, max_latent_stage) (what is left out is inferred)",
    )
    p.add_argument(
        "--stage",
        type=int,
        metavar="K",
        help="the checkpoint's curriculum stage (default: the stage --n-latent names, else max_latent_stage + 1, the "
        "last; --epochs-per-stage reads it from the file's name)",
    )
    p.add_argument(
        "--epochs-per-stage",
        type=int,
        metavar="E",
        help="the run's epochs_per_stage: CKPT named checkpoint_N (run.py's name after epoch N) is of stage "
        "(N - 1) // E, whose c_thought * min(stage, max_latent_stage) thoughts it was trained and evaluated with",
    )
    p.add_argument(
        "--mode",
        choices=("coconut", "pause"),
        default=None,
        help="how the latent positions are read: coconut (continuous thought, each one's input the last hidden "
        "state; the default) or pause (the <|latent|> token's embedding, as a pause-as-thought run, coconut: False, "
        "trained and evaluated it). run.py saves such a run as a plain state dict with the latent-token rows, which "
        "nothing else in the file tells apart: without --mode it is read as coconut, with a warning. The Coconut "
        "wrapper's layout (coconut: True) and a CoT-stage checkpoint refuse pause",
    )
    p.add_argument(
        "--revision", default=None, help="the hub revision (branch, tag or commit) of a hub id --base (default: main)"
    )
    p.add_argument("--trust-remote-code", action="store_true", help="allow the base model's own code (hub models)")
    p.set_defaults(func=run_import)


def _add_consolidate_parser(sub: Any) -> None:
    """The ``consolidate`` subcommand: a sharded FSDP checkpoint to one model.safetensors."""
    p = subcommand(
        sub,
        "consolidate",
        "turn a sharded FSDP checkpoint (DIR/dcp, written with fsdp=sharded) into DIR/model.safetensors",
        "  dgrpo consolidate runs/paper/dropout_grpo/final      # then dgrpo eval --model runs/paper/dropout_grpo\n",
    )
    p.add_argument(
        "dir",
        metavar="DIR",
        help="a checkpoint directory holding dcp/, a resumable checkpoint (RUN/checkpoints/step-N: its model/ gets "
        "the weights, and it still resumes), or a run directory (its final/); reads no pickled code",
    )
    p.set_defaults(func=run_consolidate)


def _add_export_parser(sub: Any) -> None:
    """The ``export`` subcommand: a LoRA adapter checkpoint merged into its base model, as one checkpoint."""
    p = subcommand(
        sub,
        "export",
        "write base model + LoRA adapter as one full checkpoint (Hugging Face format, plus dgrpo's latent_config.json)",
        "  dgrpo export runs/grpo-lora --merge --out runs/grpo-merged        # the run's final/ adapter\n"
        "  dgrpo export runs/grpo-lora/best --merge --dtype bfloat16 --out runs/best-bf16\n"
        "  dgrpo eval --model runs/grpo-merged --data gsm8k --out runs/grpo-merged-eval\n",
    )
    p.add_argument(
        "src", metavar="SRC", help="an adapter checkpoint directory (or a run directory: its final/), or its hub id"
    )
    p.add_argument("--revision", default="", help="with a hub id: its branch, tag or commit (default: main)")
    p.add_argument("--merge", action="store_true", help="fold the adapter into the base weights (required for now)")
    p.add_argument("--out", required=True, help="the checkpoint directory to write (must not exist or be empty)")
    p.add_argument(
        "--dtype",
        choices=("auto", "float32", "bfloat16", "float16"),
        default="auto",
        help="weights dtype of the export (merging is done in float32); auto: the run's model.dtype as its "
        "run_config.json records it (bfloat16 for a bf16 run), else the base model's own dtype. A bf16 export is not "
        "bit-exact with the adapter: the run computed base + adapter in bf16, the export rounds the float32 merge",
    )
    p.add_argument("--trust-remote-code", action="store_true", help="allow the base model's own code (hub models)")
    p.set_defaults(func=run_export)


def run_export(args: argparse.Namespace) -> int:
    refuse_torchrun("export", "each rank would write the same files at once")
    import torch
    from transformers.utils import logging as hf_logging

    from ..model import lora
    from ..model.latent_lm import LatentLM
    from ..model.sources import hub_files, on_disk, resolve_checkpoint
    from ..model.verified import SHARDED_DIR, CheckpointError
    from ..training.out_dir import check_output_path

    hf_logging.disable_progress_bar()
    warn_if_revision_is_ignored(args.revision, args.src, "SRC")
    out = Path(args.out)
    check_output_path(out, model_dir=True)
    if out.is_dir() and any(out.iterdir()):  # save_pretrained replaces the directory: never a run or other files
        raise CheckpointError(f"--out {out} exists and is not empty: name a new directory")
    # a directory, or an adapter uploaded to the hub: its files (configs, tokenizer, adapter weights) from the cache
    src = resolve_checkpoint(args.src) if on_disk(args.src).exists() else hub_files(args.src, args.revision or None)[0]
    if not lora.is_adapter_dir(src):
        for shards in (src, src.parent) if src.name == "model" else (src,):  # (a resumable checkpoint's: beside)
            if (shards / SHARDED_DIR).is_dir():
                raise CheckpointError(f"{shards} holds FSDP shards (fsdp: sharded): dgrpo consolidate {shards} first")
        raise CheckpointError(
            f"{src} is already a full checkpoint (no adapter_config.json): nothing to merge; it loads as it is, in "
            "dgrpo and in transformers (AutoModelForCausalLM / AutoTokenizer.from_pretrained): copy the folder"
        )
    if not args.merge:
        raise CheckpointError(f"{src} is a LoRA adapter checkpoint: pass --merge to write base + adapter as one model")
    dtype = dtype_named(args.dtype)
    lm = LatentLM.from_pretrained(src, dtype=torch.float32, trust_remote_code=args.trust_remote_code)
    lora.merge_into_base(lm)
    refuse_non_finite(lm.model)  # (in float32: what is not finite here, no export dtype holds)
    lm.to(
        dtype
        or recorded_dtype(lm.run_config)
        or base_dtype(lora.adapter_base(src), args.trust_remote_code, lora.adapter_base_revision(src))
    )
    refuse_non_finite(lm.model)  # (float16's range ends at 65504: a merged weight past it is inf)
    # dgrpo eval loads it in model.dtype: the dtype written (float16, which model.dtype does not take, as float32:
    # its exact upcast)
    written = "bfloat16" if next(lm.parameters()).dtype == torch.bfloat16 else "float32"
    if lm.run_config is not None:
        lm.run_config = {**lm.run_config, "model": {**lm.run_config.get("model", {}), "dtype": written}}
    lm.save_pretrained(args.out)
    adapter = src if on_disk(args.src).exists() else f"{args.src}@{src.name}"  # (a hub id at its commit)
    print(
        f"wrote {args.out} (base {lora.adapter_base(src)} + adapter {adapter}, merged; {next(lm.parameters()).dtype})"
    )
    return 0


def refuse_non_finite(model: torch.nn.Module) -> None:
    """Refuse merged weights that are not all finite, naming what was found, since the way out differs: NaN, or inf
    already in float32 (where the merge is done), is the base model's or the adapter's own, and no --dtype helps;
    inf only in a narrower dtype is a value past its range, and a wider dtype holds it."""
    import torch

    from ..model.verified import CheckpointError

    for name, p in model.named_parameters():
        if bool(torch.isfinite(p).all()):
            continue
        nan = bool(torch.isnan(p).any())
        if p.dtype == torch.float32 or nan:
            found = "NaN" if nan else "inf in float32"
            raise CheckpointError(
                f"{name} holds {found} once merged: nothing written; the base model or the adapter is broken "
                "(no --dtype helps)"
            )
        wider = "float32" if p.dtype == torch.bfloat16 else "bfloat16 or float32"
        raise CheckpointError(
            f"{name} holds values past {p.dtype}'s range once merged (inf): nothing written; "
            f"export with --dtype {wider}"
        )


def run_consolidate(args: argparse.Namespace) -> int:
    from ..training.consolidate import consolidated

    refuse_torchrun("consolidate", "each rank would write the same files at once")
    model, written = consolidated(args.dir)
    if written:
        print(f"wrote {model}/model.safetensors")
    else:
        print(f"{model} is already consolidated (its manifest lists its weights beside the shards): nothing to do")
    return 0


def run_import(args: argparse.Namespace) -> int:
    refuse_torchrun("import-coconut", "each rank would write the same files at once")
    from ..model.coconut_import import import_coconut
    from ..model.verified import LATENT_CONFIG_FILE
    from ..training.out_dir import check_output_path

    warn_if_revision_is_ignored(args.revision, args.base, "--base")
    check_output_path(args.out, model_dir=True)
    out = import_coconut(
        Path(args.ckpt),
        args.base,
        Path(args.out),
        c_thought=args.c_thought,
        n_latent=args.n_latent,
        stage=checkpoint_stage(Path(args.ckpt), args.stage, args.epochs_per_stage),
        max_latent_stage=args.max_latent_stage,
        trust_remote_code=args.trust_remote_code,
        revision=args.revision,
        mode=args.mode,
    )
    settings = json.loads((out / LATENT_CONFIG_FILE).read_text())
    print(f"wrote {out}")
    print(f"{LATENT_CONFIG_FILE}: {json.dumps(settings)}")
    return 0


def warn_if_revision_is_ignored(revision: str | None, name: str, option: str) -> None:
    """A warning when ``--revision`` is given with a local directory: it names a hub id's branch, tag or commit,
    and a directory has none (it was dropped without a word)."""
    from ..model.sources import on_disk

    if revision and on_disk(name).exists():
        warnings.warn(
            f"--revision {revision} applies only to a hub id: {option} {name} is a local directory, and it is ignored",
            stacklevel=2,
        )


def checkpoint_stage(ckpt: Path, stage: int | None, epochs_per_stage: int | None) -> int | None:
    """``--stage``, or, with ``--epochs-per-stage E``, the stage of run.py's ``checkpoint_N`` (saved after epoch N, of
    stage ``(N - 1) // E``: its ``checkpoint_5`` of args/gsm_coconut.yaml is stage 1, two thoughts, not six)."""
    import re

    from ..config import ConfigError

    if epochs_per_stage is None:
        return stage
    if stage is not None:
        raise ConfigError("--stage and --epochs-per-stage: give one (the second reads the stage from the file's name)")
    if epochs_per_stage < 1:
        raise ConfigError(f"--epochs-per-stage must be >= 1, got {epochs_per_stage}")
    named = re.fullmatch(r"checkpoint_(\d+)", ckpt.name)
    if named is None or int(named.group(1)) < 1:
        raise ConfigError(
            f"--epochs-per-stage reads the stage from run.py's file name, checkpoint_N; {ckpt.name!r} is not one "
            "(give --stage)"
        )
    return (int(named.group(1)) - 1) // epochs_per_stage


def recorded_dtype(run_config: dict | None) -> torch.dtype | None:
    """The ``model.dtype`` the run that trained an adapter recorded (its ``run_config.json``), the dtype it scored in:
    None when there is no record (an adapter saved outside a run), and ``export --dtype auto`` takes the base's."""
    return dtype_named(((run_config or {}).get("model") or {}).get("dtype"))


def dtype_named(name: object) -> torch.dtype | None:
    """The export dtype a name gives (``float32``, ``bfloat16``, ``float16``); None for another (``auto``, none)."""
    import torch

    named = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    return named.get(name) if isinstance(name, str) else None


def base_dtype(name: str, trust_remote_code: bool, revision: str | None = None) -> torch.dtype:
    """The dtype a base model's config.json states (float32 when it states none); a hub id's at ``revision``."""
    import torch
    from transformers import AutoConfig

    from ..model.sources import resolve_model_source, revision_kwargs

    source, local_only = resolve_model_source(name, revision)
    config = AutoConfig.from_pretrained(
        source, local_files_only=local_only, trust_remote_code=trust_remote_code, **revision_kwargs(revision)
    )
    stated = getattr(config, "dtype", None)
    if isinstance(stated, str):
        stated = getattr(torch, stated, None)
    return stated if isinstance(stated, torch.dtype) else torch.float32
