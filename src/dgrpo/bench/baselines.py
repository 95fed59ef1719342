"""Baselines written the straightforward way, for the benchmarks to measure the library against.

``naive_coconut_loss`` is the original Coconut training forward: one full-sequence pass of the HF
model per latent step (plus the final one), ``inputs_embeds`` rebuilt from per-position Python
lists on every pass, every layer's hidden states kept (``output_hidden_states=True``), logits over
the full vocabulary at every position, cross-entropy over the target positions. It computes the
same loss as :func:`dgrpo.training.sft.sft_loss` (same sequence layout and position ids as
:mod:`dgrpo.model.reference`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..config import Config
from ..model.latent_lm import LatentLM
from ..training.curriculum import SFTExample


def naive_coconut_loss(lm: LatentLM, examples: list[SFTExample], cfg: Config, normalizer: float) -> torch.Tensor:
    """Summed NLL of the written targets / ``normalizer``; all examples must share one latent count."""
    n_lat = examples[0].n_latent
    if any(e.n_latent != n_lat for e in examples):
        raise ValueError("naive_coconut_loss expects one latent count per batch")
    ids, pmask = lm.encode_questions([e.question for e in examples], max_tokens=cfg.data.max_question_tokens)
    tg, tm = lm.encode_targets([e.target for e in examples], max_tokens=cfg.data.max_target_tokens)
    B, P = ids.shape
    L = tg.shape[1]
    dev = ids.device
    seq = torch.cat(
        [ids, torch.full((B, n_lat), lm.latent_id, device=dev), torch.full((B, 1), lm.end_id, device=dev), tg[:, :-1]],
        1,
    )
    mask = torch.cat([pmask, torch.ones(B, n_lat + 1, dtype=pmask.dtype, device=dev), tm[:, :-1]], 1)
    S = seq.shape[1]
    pos = (pmask.cumsum(-1) - 1).clamp(min=0)
    pos = torch.cat([pos, pos[:, -1:] + torch.arange(1, S - P + 1, device=dev)[None]], 1)  # count on over right padding
    labels = torch.full((B, S), -100, dtype=torch.long, device=dev)
    labels[:, P + n_lat : P + n_lat + L] = tg.masked_fill(tm == 0, -100)  # <|end-latent|> predicts the first target

    embeds = lm.embed(seq)
    for t in range(n_lat + 1):
        out = lm.model(inputs_embeds=embeds, attention_mask=mask, position_ids=pos, output_hidden_states=True)
        if t == n_lat:
            break
        last = out.hidden_states[-1]
        # Coconut: rebuild the embeddings position by position, the latent column taking the hidden state before it
        cols = [[embeds[b, j] for j in range(S)] for b in range(B)]
        for b in range(B):
            cols[b][P + t] = last[b, P + t - 1]
        embeds = torch.stack([torch.stack(c) for c in cols])
    logits = out.logits.float()
    return (
        F.cross_entropy(logits.reshape(B * S, -1), labels.reshape(-1), ignore_index=-100, reduction="sum") / normalizer
    )
