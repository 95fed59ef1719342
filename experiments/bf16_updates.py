"""How much of AdamW's update bf16 weights keep, with and without an fp32 master copy (README, "bf16 weights"):

    python experiments/bf16_updates.py

A N(0, 0.02) tensor of a million entries (the scale of a trained LM's weights), stepped 50 times by AdamW on
random N(0, 1) gradients (bf16 values, the same for every row), at the recipe's peak lr and half of it (its
warmup), three ways: float32 weights (the reference), bf16 weights (the paper's recipe: torch's AdamW writes each
update into the bf16 weight), and bf16 weights with ``model.master_weights`` (dgrpo's MasterWeightAdamW: the
update accumulates in a float32 copy, the weight is its rounding). Printed: the share of entries that changed at
all, and the error of the whole update against float32's, ||(w - w0) - (w32 - w0)|| / ||w32 - w0||. An Adam step
moves a weight by about lr; a bf16 weight near 0.02 is spaced 2**-13 (1.2e-4) from its neighbours, so a step
under half of that rounds back to the weight it started from.
"""

import argparse

import torch

from dgrpo.training.master_weights import MasterWeightAdamW


def run(dtype: torch.dtype, master: bool, lr: float, steps: int = 50, n: int = 1_000_000) -> torch.Tensor:
    torch.manual_seed(0)
    w = torch.nn.Parameter((torch.randn(n) * 0.02).to(torch.bfloat16).to(dtype))
    opt = (MasterWeightAdamW if master else torch.optim.AdamW)([w], lr=lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        w.grad = torch.randn(n, generator=gen).to(torch.bfloat16).to(dtype)
        opt.step()
    return w.detach().float()


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    start = run(torch.float32, False, 0.0, steps=0)
    for lr in (1e-5, 5e-6):
        ref = run(torch.float32, False, lr)
        for name, dtype, master in (
            ("float32", torch.float32, False),
            ("bfloat16", torch.bfloat16, False),
            ("bfloat16 + master", torch.bfloat16, True),
        ):
            w = run(dtype, master, lr)
            changed = 100 * (w != start).float().mean().item()
            error = ((w - ref).norm() / (ref - start).norm()).item()
            print(f"lr {lr:g}  {name:18}: {changed:5.1f}% of the entries changed in 50 steps; update error {error:.3f}")
