"""The demo's pipeline read out on validation data only (docs/demo/valid_sweep.md): how the settings were chosen.

    OMP_WAIT_POLICY=PASSIVE python experiments/valid_demo.py --out runs/valid/default [--full] \
        [--sft-seeds N] [--seeds M] [--workers W] [--arms a,b] [--resume never] [--set key=value ...]

Exactly ``dgrpo demo`` (the same configs, SFT seeds, arms, RL seeds, periodic validation and best-checkpoint
selection on the first ``data.eval_limit`` validation problems), except that every model is read out on
validation-style data instead of the test splits: the validation problems the selection never saw
(``valid[eval_limit:]``), and the 3-operation chains drawn with another task seed (4321). The test splits are never
generated (a task seed draws anew from the same questions: 29 of the 1000 3-operation chains are also in the
demo's 3-operation split). Writes results.json / results.md / summary.txt / figures like the demo. ``--workers``:
the demo's process pool (default one per CPU). ``--resume``: the demo's (a run that finished in --out under the
same settings and read-out problems is read back, not trained again; ``never``: every run anew).
"""

import argparse
import time
from dataclasses import replace
from pathlib import Path

import torch

from dgrpo.cli.common import add_config_options
from dgrpo.config import Config, ConfigError
from dgrpo.data.records import Record
from dgrpo.data.synthetic import generate_split
from dgrpo.demo import ARMS, Demo, default_workers, demo_config, quiet_transformers, run_pipeline, write_results
from dgrpo.demo import command_line as demo_command_line

#: the RL arms --arms may name (the SFT baseline always runs)
RL_ARMS = [a for a in ARMS if ARMS[a][1] is not None]


def command_line(args: argparse.Namespace) -> str:
    """The command that reproduces this run (written to results.json / results.md): the demo's options (``--workers``
    among them), and this script's ``--arms``."""
    return demo_command_line(args, "python experiments/valid_demo.py", [f"--arms {args.arms}"])


def read_out_on(base: Config) -> tuple[list[Record], dict[str, list[Record]]]:
    """The validation problems the best-checkpoint selection reads (the first ``data.eval_limit``, half of them if
    it is 0), and the splits every model is read out on instead of the test splits: the validation problems the
    selection never saw, and 3-operation chains of another task seed. A split that would be empty is a
    :class:`ConfigError` now (its accuracy was 0 of 0, read out after the whole pipeline ran)."""
    valid = generate_split(base.task, "valid")
    limit = base.data.eval_limit or len(valid) // 2
    other = replace(base.task, seed=4321, n_steps=max(1, base.task.n_steps - 1))  # (as the demo's shifted split)
    shifted = f"{other.n_steps} operation{'s' * (other.n_steps != 1)} (task seed 4321)"
    readout = {  # (the progress lines name a split by its first word: "valid" is the selection's)
        f"held-out valid ({len(valid) - limit})": valid[limit:],
        shifted: generate_split(other, "test")[: base.task.n_test // 2],
    }
    if limit >= len(valid):
        raise ConfigError(
            f"data.eval_limit={limit} leaves none of the {len(valid)} validation problems (task.n_valid) held out "
            "to read the models out on: lower data.eval_limit or raise task.n_valid"
        )
    if not readout[shifted]:
        raise ConfigError(f"task.n_test={base.task.n_test}: the shifted read-out takes half of it; give at least 2")
    return valid[:limit], readout


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--full", action="store_true")
    p.add_argument("--sft-seeds", type=int, default=None)
    p.add_argument("--seeds", type=int, default=None)
    p.add_argument("--workers", type=int, default=None, help="as dgrpo demo's (default one per CPU, 1 on a GPU)")
    p.add_argument("--arms", default=",".join(RL_ARMS), help=f"comma-separated, of: {', '.join(RL_ARMS)}")
    p.add_argument("--resume", choices=("auto", "never"), default="auto", help="as dgrpo demo's (default auto)")
    add_config_options(p, "grpo.steps=200")
    args = p.parse_args()
    arms = args.arms.split(",")
    unknown = [a for a in arms if a not in RL_ARMS]
    if unknown:
        p.error(f"--arms: unknown arm(s) {', '.join(unknown)}; choose from {', '.join(RL_ARMS)} (SFT always runs)")
    args.quick = False
    t0 = time.time()
    try:
        base, n_sft, n_rl = demo_config(args)
        selection, readout = read_out_on(base)
    except ConfigError as e:  # (--seeds 0, an unknown --set key, an --out that is a file: one error, not a traceback)
        p.error(str(e))
    if base.threads:
        torch.set_num_threads(base.threads)
    quiet_transformers()
    demo = Demo(base, Path(args.out), generate_split(base.task, "train"), selection, readout)
    demo.resume = args.resume == "auto"
    workers = args.workers if args.workers is not None else default_workers(base)
    run_pipeline(demo, n_sft, n_rl, arms, workers=workers)
    demo.wall["total"] = round(time.time() - t0, 1)
    write_results(demo, command_line(args), n_sft, n_rl)
    print(Path(args.out, "summary.txt").read_text())


if __name__ == "__main__":
    main()
