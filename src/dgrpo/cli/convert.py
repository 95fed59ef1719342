"""``dgrpo import-coconut``: a checkpoint of the official Coconut code as a dgrpo checkpoint directory."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from .common import subcommand

IMPORT_EXAMPLES = """  # the official GSM8K run (its args/gsm_coconut.yaml: c_thought 2, max_latent_stage 3: 6 thoughts)
  dgrpo import-coconut YOUR_SAVE_PATH/gsm-coconut/checkpoint_N --base openai-community/gpt2 \\
      --c-thought 2 --max-latent-stage 3 --out runs/coconut-gsm8k
  dgrpo grpo --init runs/coconut-gsm8k --config paper/grpo_dropout.yaml --out runs/coconut-gsm8k-dgrpo
  dgrpo import-coconut ckpt --base ./llama-dir --c-thought 1 --n-latent 6 --out runs/imported   # the count directly
  dgrpo import-coconut gsm-cot/checkpoint_N --base openai-community/gpt2 --c-thought 2 --out runs/cot  # CoT stage
"""


def register(sub: Any) -> None:
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
        "--n-latent", type=int, metavar="T", help="latent thoughts at inference, directly (wins over the product)"
    )
    p.add_argument(
        "--stage", type=int, metavar="K", help="curriculum stage recorded in latent_config.json (default: inferred)"
    )
    p.add_argument("--trust-remote-code", action="store_true", help="allow the base model's own code (hub models)")
    p.set_defaults(func=run_import)

    p = subcommand(
        sub,
        "consolidate",
        "turn a sharded FSDP checkpoint (DIR/dcp, written with fsdp=sharded) into DIR/model.safetensors",
        "  dgrpo consolidate runs/paper/dropout_grpo/final      # then dgrpo eval --model runs/paper/dropout_grpo\n",
    )
    p.add_argument("dir", metavar="DIR", help="a checkpoint directory holding dcp/ (reads no pickled code: see docs)")
    p.set_defaults(func=run_consolidate)


def run_consolidate(args: argparse.Namespace) -> int:
    from ..training.consolidate import consolidate_checkpoint

    print(f"wrote {consolidate_checkpoint(args.dir)}/model.safetensors")
    return 0


def run_import(args: argparse.Namespace) -> int:
    from ..model.coconut_import import import_coconut
    from ..model.latent_lm import LATENT_CONFIG_FILE

    out = import_coconut(
        Path(args.ckpt),
        args.base,
        Path(args.out),
        c_thought=args.c_thought,
        n_latent=args.n_latent,
        stage=args.stage,
        max_latent_stage=args.max_latent_stage,
        trust_remote_code=args.trust_remote_code,
    )
    settings = json.loads((out / LATENT_CONFIG_FILE).read_text())
    print(f"wrote {out}")
    print(f"{LATENT_CONFIG_FILE}: {json.dumps(settings)}")
    return 0
