"""How much of a GRPO run's update bf16 weights keep, with and without ``model.master_weights`` (README, "bf16
weights"), in the trainer itself rather than on random gradients:

    python experiments/bf16_grpo_updates.py [--threads N] [STEPS]

The built-in tiny model (tiny.yaml: 2 layers of width 64, Qwen2 blocks, weights initialised N(0, 0.02)) after a short
Coconut SFT in float32, then STEPS (default 20) Dropout-GRPO steps at the paper's lr 1e-5 (constant: no warmup,
no decay) from the same weights and seeds, three ways: float32 weights (the reference), bf16 weights (the paper's
recipe) and bf16 weights with float32 masters. Printed per run: the error of the whole update against float32's,
||(w - w0) - (w32 - w0)|| / ||w32 - w0|| over all trained weights (w0 the SFT weights, rounded to bf16 for the bf16
runs' start, which the float32 run starts from too), and the share of weight entries that changed at all. The
runs' rollouts differ once their weights do (bf16 forward passes), so the error includes that divergence as well as
the rounding of updates. The runs use 2 torch threads (``--threads``, the config's ``threads``: the figures
published were taken so, and a float sum's order, so the numbers, depends on it).
"""

import argparse
import tempfile
from pathlib import Path

import torch

from dgrpo.cli.common import positive_int
from dgrpo.config import Config, load_config
from dgrpo.data.synthetic import generate_split
from dgrpo.model.factory import load_model
from dgrpo.model.latent_lm import LatentLM
from dgrpo.training.grpo import GRPOTrainer
from dgrpo.training.sft import train_sft

#: torch threads of every run by default (``--threads``): the published figures were taken so
THREADS = 2


def config(threads: int, **over: object) -> Config:
    base = {"task.n_train": 1024, "sft.lr": 6e-3, "data.test": "[]", "data.valid": "''", "threads": threads}
    return load_config(Config, "tiny.yaml", [f"{k}={v}" for k, v in {**base, **over}.items()])


def grpo_weights(sft: Path, dtype: str, master: bool, steps: int, threads: int) -> tuple[dict, dict]:
    """The trained weights after ``steps`` GRPO steps, and their float32 masters (none without)."""
    over = {"model.dtype": dtype, "model.master_weights": str(master).lower(), "grpo.steps": steps}
    over |= {"grpo.lr": 1e-5, "grpo.warmup_steps": 0, "grpo.min_lr_ratio": 1.0, "grpo.filter": "false"}
    cfg = config(threads, **over)
    lm = LatentLM.from_pretrained(sft).to(torch.bfloat16).to(getattr(torch, dtype))  # (the same start: bf16 values)
    torch.manual_seed(0)
    trainer = GRPOTrainer(lm, cfg, generate_split(cfg.task, "train"))
    for _ in range(steps):
        trainer.step()
    named = [(n, p) for n, p in lm.model.named_parameters() if p.requires_grad]
    weights = {n: p.detach().float().clone() for n, p in named}
    masters = {n: trainer.opt.state[p]["master"].clone() for n, p in named if "master" in trainer.opt.state[p]}
    return weights, masters


def main(steps: int, threads: int = THREADS) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = config(threads)
        torch.manual_seed(0)
        lm = load_model(cfg.model, cfg.task, seed=0)
        train_sft(lm, generate_split(cfg.task, "train"), cfg, Path(tmp), log=lambda *a: None, progress=False)
        sft = Path(tmp) / "final"
        start = {n: p.detach().bfloat16().float() for n, p in LatentLM.from_pretrained(sft).model.named_parameters()}
        ref, _ = grpo_weights(sft, "float32", False, steps, threads)
        moved = torch.cat([(ref[n] - start[n]).flatten() for n in ref]).norm()

        def error(w: dict[str, torch.Tensor]) -> float:
            return (torch.cat([(w[n] - ref[n]).flatten() for n in ref]).norm() / moved).item()

        for name, dtype, master in (("bfloat16", "bfloat16", False), ("bfloat16 + master", "bfloat16", True)):
            w, masters = grpo_weights(sft, dtype, master, steps, threads)
            changed = 100 * torch.cat([(w[n] != start[n]).flatten() for n in ref]).float().mean().item()
            line = f"{name:18}: update error {error(w):.3f}, {changed:5.1f}% of the entries changed in {steps} steps"
            print(line + (f"; the masters' update error {error(masters):.3f}" if masters else ""))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("steps", nargs="?", type=positive_int, default=20, metavar="STEPS", help="GRPO steps (default 20)")
    ap.add_argument(
        "--threads",
        type=positive_int,
        default=THREADS,
        metavar="N",
        help=f"torch threads (default {THREADS}, as the published figures were taken: the numbers depend on it)",
    )
    args = ap.parse_args()
    main(args.steps, args.threads)
