"""The demo's pipeline read out on validation data only (docs/demo/valid_sweep.md): how the settings were chosen.

    OMP_WAIT_POLICY=PASSIVE python experiments/valid_demo.py --out runs/valid/default [--full] \
        [--sft-seeds N] [--seeds M] [--arms a,b] [--set key=value ...]

Exactly ``dgrpo demo`` (the same configs, SFT seeds, arms, RL seeds, periodic validation and best-checkpoint
selection on the first ``data.eval_limit`` validation problems), except that every model is read out on
validation-style data instead of the test splits: the validation problems the selection never saw
(``valid[eval_limit:]``), and the 3-operation chains drawn with another task seed (4321). The test splits are never
generated. Writes results.json / results.md / summary.txt / figures like the demo.
"""

import argparse
import time
from dataclasses import replace
from pathlib import Path

import torch

from dgrpo.data.synthetic import generate_split
from dgrpo.demo import ARMS, Demo, demo_config, run_pipeline, write_results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--full", action="store_true")
    p.add_argument("--sft-seeds", type=int, default=None)
    p.add_argument("--seeds", type=int, default=None)
    p.add_argument("--arms", default=",".join(a for a in ARMS if ARMS[a][1] is not None))
    p.add_argument("--config", action="append", default=[])
    p.add_argument("--set", dest="overrides", action="append", default=[])
    args = p.parse_args()
    args.quick = False
    t0 = time.time()
    base, n_sft, n_rl = demo_config(args)
    if base.threads:
        torch.set_num_threads(base.threads)
    valid = generate_split(base.task, "valid")
    limit = base.data.eval_limit or len(valid) // 2
    other = replace(base.task, seed=4321, n_steps=base.task.n_steps - 1)
    readout = {
        f"valid (held out, {len(valid) - limit})": valid[limit:],
        "3 operations (task seed 4321)": generate_split(other, "test")[: base.task.n_test // 2],
    }
    demo = Demo(base, Path(args.out), generate_split(base.task, "train"), valid[:limit], readout)
    run_pipeline(demo, n_sft, n_rl, args.arms.split(","))
    demo.wall["total"] = round(time.time() - t0, 1)
    cmd = " ".join(
        [
            "python experiments/valid_demo.py",
            *(
                f"--{k.replace('_', '-')} {v}"
                for k, v in vars(args).items()
                if v not in (None, False, []) and k != "quick"
            ),
        ]
    )
    res = write_results(demo, cmd, n_sft, n_rl)
    print(Path(args.out, "summary.txt").read_text())
    del res


if __name__ == "__main__":
    main()
