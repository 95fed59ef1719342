"""Which distribution shifts is Coconut SFT above chance on? (docs/demo/valid_sweep.md, "The shifted test split")

    python experiments/ood_variants.py SFT_CHECKPOINT [SFT_CHECKPOINT ...]

Greedy accuracy (no dropout) of each checkpoint on candidate shifted splits of the built-in task it was trained on
(its run_config.json's task settings, as ``dgrpo eval`` reads them; the defaults, the demo's task, for a checkpoint
without one), generated with a different task seed (4321) than the demo's (1234): validation-style data, a new draw
from the same questions, so nearly no demo test item is read (1 of the 500 in-distribution problems is in the demo's
test split, 18 of the 500 3-operation ones in its 3-operation split).
Prints one JSON line per (checkpoint, variant).
"""

import argparse
import json
from collections import Counter
from dataclasses import replace

from dgrpo.cli.evaluate import checkpoint_settings
from dgrpo.config import Config, ConfigError, TaskConfig, load_config
from dgrpo.data.synthetic import generate_split
from dgrpo.eval.evaluate import evaluate
from dgrpo.model.latent_lm import LatentLM
from dgrpo.model.sources import resolve_model_source
from dgrpo.model.verified import CheckpointError

#: this experiment's draw: another seed than the demo's, 500 problems per split (no train split is drawn)
DRAW = {"seed": 4321, "n_test": 500, "n_valid": 500, "n_train": 1}


def checkpoint_task(ckpt: str) -> TaskConfig:
    """The task ``ckpt`` was trained on (as ``dgrpo eval`` reads it from its run_config.json; the defaults without
    one), with this experiment's seed and split sizes (:data:`DRAW`; each variant is checked before it is drawn)."""
    settings, _ = checkpoint_settings(ckpt)
    return replace(load_config(Config, None, [], start={"task": settings.get("task", {})}).task, **DRAW)


def variants(task: TaskConfig) -> dict[str, tuple[dict, str]]:
    """name -> (task options, split): the shifts tried on ``task`` (the default task's 4 operations: 3, 5 and 6)."""
    n, fewer = task.n_steps, max(1, task.n_steps - 1)
    return {
        f"in-distribution ({n} operations)": ({}, "valid"),
        f"{fewer} operation{'s' * (fewer != 1)}": ({"n_steps": fewer}, "test"),
        f"{n + 1} operations (ood_extra_steps=1)": ({"ood_extra_steps": 1}, "ood_steps"),
        f"{n + task.ood_extra_steps} operations (ood_steps, the old split)": ({}, "ood_steps"),
        "operands 10..12 (ood_max_operand=12)": ({"ood_max_operand": 12}, "ood_numbers"),
        "operands 10..19 (ood_max_operand=19)": ({"ood_max_operand": 19}, "ood_numbers"),
        f"operands 10..{task.ood_max_operand} (ood_numbers, the old split)": ({}, "ood_numbers"),
    }


def main(checkpoints: list[str]) -> None:
    for ckpt in checkpoints:
        task = checkpoint_task(ckpt)
        lm = LatentLM.from_pretrained(ckpt)
        for name, (opts, split) in variants(task).items():
            try:
                replace(task, **opts).validate()
            except ConfigError as e:  # (a small task: fewer distinct problems than the draw asks)
                print(json.dumps({"checkpoint": ckpt, "variant": name, "skipped": str(e)}), flush=True)
                continue
            recs = generate_split(replace(task, **opts), split)
            r = evaluate(lm, recs, batch_size=256, max_new_tokens=64, progress=False, seed=0)
            top = Counter(x.answer for x in recs).most_common(1)[0][1] / len(recs)  # always answering the commonest
            row = {"checkpoint": ckpt, "variant": name, "n": r.n, "accuracy": r.accuracy, "most_frequent_answer": top}
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    # (--help printed this docstring and exited 1, as did a wrong path: argparse's help, exit 0, and errors, exit 2)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoints", nargs="+", metavar="SFT_CHECKPOINT", help="a checkpoint or run directory, or hub id")
    args = p.parse_args()
    try:
        for ckpt in args.checkpoints:  # (a mistyped second path: said at once, not after the first one's evaluation)
            resolve_model_source(ckpt)
            checkpoint_task(ckpt)
        main(args.checkpoints)
    except (CheckpointError, ConfigError) as e:  # a wrong path or a model that cannot be read: one line
        p.error(str(e))
