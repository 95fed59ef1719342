"""Validation-only sweep of Dropout-GRPO settings from one SFT checkpoint (docs/demo/valid_sweep.md).

    python experiments/valid_sweep.py SFT_CHECKPOINT NAME SEED [KEY=VALUE ...]

Trains GRPO with the sweep's settings (the defaults but ``grpo.steps=100`` and ``grpo.max_skip_streak=0``) plus the
overrides (which win over those two) on the built-in task the checkpoint was trained on (its run_config.json's task
settings, as ``dgrpo eval`` reads them; the defaults, the demo's task, for a checkpoint without one), greedy-evaluates
that task's whole validation split (1000 problems for the default task) before and after, appends one JSON line to
runs/sweep/results.jsonl (with the diagnostics' means over the first and the last 10 GRPO steps). The test splits are
never touched.
"""

import argparse
import json
import shutil
import time
from pathlib import Path

import torch

from dgrpo.cli.evaluate import checkpoint_settings
from dgrpo.config import Config, ConfigError, load_config
from dgrpo.data.synthetic import generate_split
from dgrpo.eval.evaluate import evaluate
from dgrpo.model.latent_lm import LatentLM
from dgrpo.model.verified import CheckpointError
from dgrpo.training.grpo import train_grpo


def parse_args() -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """The parser (for its errors) and the command line: argparse's --help (exit 0) and errors (exit 2), as the
    other experiment scripts (--help printed this docstring and exited 1, as did a seed that is no integer)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sft", metavar="SFT_CHECKPOINT", help="the SFT checkpoint (a checkpoint or run directory)")
    p.add_argument("name", metavar="NAME", help="the row's name (its run goes to runs/sweep/NAME_sSEED)")
    p.add_argument("seed", metavar="SEED", type=int, help="the run's seed")
    p.add_argument("overrides", metavar="KEY=VALUE", nargs="*", default=[], help="config overrides (as dgrpo's --set)")
    return p, p.parse_args()


def setup(args: argparse.Namespace) -> tuple[str, int, list[str], Config, LatentLM]:
    """(name, seed, overrides, config, SFT model) of the command line."""
    sft, name, seed, overrides = Path(args.sft), args.name, args.seed, args.overrides
    # the demo's GRPO settings of the sweep's time (100 steps; the library's default is 50 now; no stop after a
    # streak of steps with every group filtered out, which came later: the demo keeps going too), then the row's change
    settings = [
        "grpo.steps=100",
        "grpo.max_skip_streak=0",
        *overrides,
        f"seed={seed}",
        "grpo.eval_every=0",
        "grpo.save_every=0",
        "grpo.save_best=false",
    ]
    load_config(Config, None, settings)  # (a bad override is said before the checkpoint is read)
    trained, _ = checkpoint_settings(str(sft))  # (the task it was trained on: its validation split is the one read)
    base = load_config(Config, None, settings, start={"task": trained.get("task", {})})
    torch.manual_seed(seed)  # (before the model loads, as the sweep's rows were measured)
    return name, seed, overrides, base, LatentLM.from_pretrained(sft)


parser, cli = parse_args()
try:
    name, seed, overrides, base, lm = setup(cli)
except (CheckpointError, ConfigError) as e:  # a wrong path or override: one line
    parser.error(str(e))
if base.threads:
    torch.set_num_threads(base.threads)
valid = generate_split(base.task, "valid")
train = generate_split(base.task, "train")


def ev(m):
    r = evaluate(m, valid, batch_size=256, max_new_tokens=base.eval.max_new_tokens, progress=False, seed=0)
    return r


r0 = ev(lm)
t0 = time.time()
out = Path("runs/sweep") / f"{name}_s{seed}"
shutil.rmtree(out, ignore_errors=True)
train_grpo(lm, base, train, out, progress=False, log=lambda *a, **k: None, resume=False)
dt = time.time() - t0
r1 = ev(lm)
rows = [json.loads(line) for line in open(out / "metrics.jsonl")]


def avg(key, rs):
    v = [r[key] for r in rs if key in r and r[key] is not None]
    return sum(v) / max(1, len(v))


steps = [r for r in rows if "step" in r and "reward_std" in r]  # (the GRPO steps' rows: step 0 first)
keys = [k for k in steps[-1] if "std" in k or "distinct" in k or "kept" in k]
first, last = steps[:10], steps[-10:]
summ = {k: (round(avg(k, first), 3), round(avg(k, last), 3)) for k in keys}
res = {
    "name": name,
    "seed": seed,
    "overrides": overrides,
    "n_valid": r0.n,
    "valid0": r0.accuracy,
    "valid1": r1.accuracy,
    "gain": round(r1.accuracy - r0.accuracy, 4),
    "wall": round(dt, 1),
    "diag_first_last10": summ,
}
print(json.dumps(res))
open("runs/sweep/results.jsonl", "a").write(json.dumps(res) + "\n")
