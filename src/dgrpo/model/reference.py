"""Straightforward, uncached reference implementations (what the original Coconut code does).

Used by the tests (our cached recurrence must match these to 1e-5) and by the benchmarks (as the
baseline our speed is measured against). Never used for training.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .latent_lm import LatentLM


def full_sequence_embeds(
    lm: LatentLM, prompt_ids: Tensor, prompt_mask: Tensor, n_latent: int, target_ids: Tensor, target_mask: Tensor
) -> tuple[Tensor, Tensor, Tensor, int]:
    """Coconut-style multi-pass forward: latent position t gets the hidden state of position t-1,
    recomputing the whole sequence from scratch for every latent step (no KV cache).

    Returns (inputs_embeds, attention mask, position ids, index of the first latent column)."""
    B, P = prompt_ids.shape
    end = torch.full((B, 1), lm.end_id, dtype=torch.long, device=prompt_ids.device)
    lat = torch.full((B, n_latent), lm.latent_id, dtype=torch.long, device=prompt_ids.device)
    ids = torch.cat([prompt_ids, lat, end, target_ids[:, :-1]], 1)
    mask = torch.cat([prompt_mask, torch.ones_like(lat), torch.ones_like(end), target_mask[:, :-1]], 1)
    pos = (mask.long().cumsum(-1) - 1).clamp(min=0)
    # positions after the prompt continue counting even over right padding (as the cached path does)
    start = P
    pos[:, start:] = pos[:, start - 1 : start] + torch.arange(1, ids.shape[1] - start + 1, device=ids.device)[None]
    embeds = lm.embed(ids)
    for t in range(n_latent):
        out = lm.base(inputs_embeds=embeds, attention_mask=mask, position_ids=pos)
        h = out.last_hidden_state[:, start + t - 1]
        embeds = torch.cat([embeds[:, : start + t], h[:, None], embeds[:, start + t + 1 :]], 1)
    return embeds, mask, pos, start


def uncached_target_logprobs(
    lm: LatentLM, prompt_ids: Tensor, prompt_mask: Tensor, n_latent: int, target_ids: Tensor, target_mask: Tensor
) -> tuple[Tensor, Tensor]:
    """Teacher-forced log-probs [B, L] and all last-layer hidden states by full recomputation."""
    embeds, mask, pos, start = full_sequence_embeds(lm, prompt_ids, prompt_mask, n_latent, target_ids, target_mask)
    out = lm.base(inputs_embeds=embeds, attention_mask=mask, position_ids=pos)
    hidden = out.last_hidden_state
    first = start + n_latent  # the <|end-latent|> column predicts target 0
    logits = lm.logits(hidden[:, first:]).float()
    logp = logits.log_softmax(-1).gather(-1, target_ids[..., None]).squeeze(-1) * target_mask
    return logp, hidden


@torch.no_grad()
def recompute_generate(lm: LatentLM, question: str, n_latent: int, max_new_tokens: int) -> list[int]:
    """Batch-1 greedy generation that re-runs the whole sequence for every latent step and every
    answer token, building embeddings from per-position lists (the original Coconut ``generate``)."""
    prompt_ids, prompt_mask = lm.encode_questions([question])
    ids = prompt_ids[0].tolist() + [lm.latent_id] * n_latent + [lm.end_id]
    hidden_for: dict[int, Tensor] = {}
    P = prompt_ids.shape[1]
    for t in range(n_latent):
        embeds = [
            lm.embed(torch.tensor([i], device=lm.device))[0] if j not in hidden_for else hidden_for[j]
            for j, i in enumerate(ids[: P + t])
        ]
        out = lm.model(inputs_embeds=torch.stack(embeds)[None], output_hidden_states=True)
        hidden_for[P + t] = out.hidden_states[-1][0, -1]
    new: list[int] = []
    for _ in range(max_new_tokens):
        seq = ids + new
        embeds = [
            lm.embed(torch.tensor([i], device=lm.device))[0] if j not in hidden_for else hidden_for[j]
            for j, i in enumerate(seq)
        ]
        out = lm.model(inputs_embeds=torch.stack(embeds)[None], output_hidden_states=True)
        nxt = int(out.logits[0, -1].argmax())
        new.append(nxt)
        if nxt == lm.eos_id or nxt in lm.stop_ids:
            break
    return new
