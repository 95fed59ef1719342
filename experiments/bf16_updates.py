"""How many weights move when bf16 weights are trained without an fp32 master copy (README, "The paper's
full-scale recipe"):

    python experiments/bf16_updates.py

A N(0, 0.02) tensor of a million entries (the scale of a trained LM's weights), stepped 50 times by torch's AdamW
on random N(0, 1) gradients, in bfloat16 and in float32, at the recipe's peak lr and half of it (its warmup):
the share of entries that changed at all. An Adam step moves a weight by about lr; a bf16 weight near 0.02 is
spaced 2**-13 (1.2e-4) from its neighbours, so a step under half of that rounds back to the weight it started from.
"""

import torch


def changed_share(dtype: torch.dtype, lr: float, steps: int = 50, n: int = 1_000_000) -> float:
    torch.manual_seed(0)
    w = torch.nn.Parameter((torch.randn(n) * 0.02).to(dtype))
    start = w.detach().clone()
    opt = torch.optim.AdamW([w], lr=lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        w.grad = torch.randn(n, generator=gen).to(dtype)
        opt.step()
    return (w.detach() != start).float().mean().item()


if __name__ == "__main__":
    for dtype in (torch.bfloat16, torch.float32):
        for lr in (1e-5, 5e-6):
            share = changed_share(dtype, lr)
            print(f"{str(dtype):15} lr {lr:g}: {100 * share:5.1f}% of the entries changed in 50 steps")
