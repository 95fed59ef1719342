"""Decoding a batch's answers: the state a batch carries mid-sequence, the LM head's log-probs of given targets (in
position chunks), the choice of each next token (greedy, temperature and nucleus sampling, inverse-CDF sampling from
given draws) and the booking of the tokens chosen.

:class:`~dgrpo.model.latent_lm.LatentLM` and the fast engine (:mod:`dgrpo.model.fixed_shape`) decode with these.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.utils.checkpoint
from torch import Tensor
from transformers import DynamicCache

from .head_stats import HeadStats

if TYPE_CHECKING:
    from .latent_lm import LatentLM


@dataclass
class DecodeState:
    """A batch mid-sequence: its KV cache, attention mask so far, next position ids, last hidden state."""

    cache: DynamicCache
    attention_mask: Tensor  # [B, S] 1 = real token
    next_position: Tensor  # [B] position id of the next token
    last_hidden: Tensor  # [B, 1, H] last-layer hidden state at the last position fed


@dataclass
class Generation:
    """What :meth:`LatentLM.generate` returns: the answer tokens of each row, their mask and log-probs (and entropies);
    ``lm.decode(g.tokens, g.mask)`` gives the texts."""

    tokens: Tensor  # [B, L] generated ids, pad after EOS
    mask: Tensor  # [B, L] 1 for generated tokens up to and including EOS
    logprobs: Tensor  # [B, L] log pi(token) under the (temperature-scaled) policy, 0 where mask is 0
    entropy: Tensor | None = None  # [B, L] entropy of that distribution (with_entropy=True), 0 where mask is 0


class AnswerBook:
    """The answer tokens of one batch as they are decoded: which token each row chose at each step, its log-prob
    (and entropy), which rows are still going. Everything stays on the device; finished rows record pad, mask 0."""

    def __init__(self, lm: LatentLM, B: int, max_new_tokens: int, stop_ids: list[int] | None, with_entropy: bool):
        dev, self.pad_id, self.stats = lm.device, lm.pad_id, lm.head_stats
        self.stops = torch.tensor([lm.eos_id, *lm.stop_ids, *(stop_ids or [])], device=dev)
        self.tokens = torch.full((B, max_new_tokens), lm.pad_id, dtype=torch.long, device=dev)
        self.mask = torch.zeros(B, max_new_tokens, dtype=torch.long, device=dev)
        self.logprobs = torch.zeros(B, max_new_tokens, dtype=torch.float32, device=dev)
        self.entropy = torch.zeros(B, max_new_tokens, dtype=torch.float32, device=dev) if with_entropy else None
        self.alive = torch.ones(B, dtype=torch.bool, device=dev)

    def choose(
        self,
        i: int,
        logits: Tensor,
        temperature: float,
        top_p: float,
        generator: torch.Generator | None,
        uniforms: Tensor | None = None,
    ) -> None:
        """Step ``i``: pick each row's token from ``logits`` [B, V] and book it. ``logprobs`` are log pi(token) under
        softmax(logits / t), t = temperature when sampling and 1 when greedy: the policy the GRPO ratio is taken
        against. ``uniforms`` [B, max_new_tokens]: each row's own sampling draws
        (:func:`dgrpo.perturbation.base.row_sampling_uniforms`), column ``i`` for this step."""
        if temperature > 0:
            logits = logits.float()
            nxt = sample_next(logits, temperature, top_p, generator, None if uniforms is None else uniforms[:, i])
            logp_all = (logits / temperature).log_softmax(-1)
            logp = logp_all.gather(-1, nxt[:, None]).squeeze(-1)
            entropy = -(logp_all.exp() * logp_all).sum(-1) if self.entropy is not None else None
        else:  # greedy: argmax of the logits as they are, log-prob and entropy in fp32 (dgrpo.model.head_stats)
            nxt, logp, entropy = self.stats.greedy(logits, self.entropy is not None)
        if self.entropy is not None and entropy is not None:
            self.entropy[:, i] = torch.where(self.alive, entropy, 0.0)
        self.tokens[:, i] = torch.where(self.alive, nxt, self.pad_id)
        self.mask[:, i] = self.alive.long()
        self.logprobs[:, i] = torch.where(self.alive, logp, 0.0)
        self.alive = self.alive & ~torch.isin(nxt, self.stops)

    def result(self, rows: int | None = None) -> Generation:
        """The booked answers of the first ``rows`` rows (all: None), cut to the longest (one host
        synchronisation)."""
        tokens, mask, logprobs = self.tokens[:rows], self.mask[:rows], self.logprobs[:rows]
        n = int(mask.sum(1).max().item()) if mask.numel() else 0
        ent = self.entropy[:rows, :n] if self.entropy is not None else None
        return Generation(tokens[:, :n], mask[:, :n], logprobs[:, :n], ent)


def check_decoding(n_latent: int, max_new_tokens: int, temperature: float, top_p: float) -> None:
    """``generate``'s arguments, checked at once (a negative count or temperature would otherwise decode nonsense
    or fail deep inside a forward)."""
    if n_latent < 0 or max_new_tokens < 1:
        raise ValueError(f"generate: n_latent >= 0 and max_new_tokens >= 1, got {n_latent} and {max_new_tokens}")
    if not (temperature >= 0 and 0 < top_p <= 1):
        raise ValueError(f"generate: temperature >= 0 and 0 < top_p <= 1, got {temperature} and {top_p}")


def check_uniforms(uniforms: Tensor | None, rows: int, max_new_tokens: int) -> None:
    """``generate``'s per-row sampling draws: [rows, at least max_new_tokens] (fewer columns was an IndexError deep
    in the decoding loop, at the first step past them)."""
    if uniforms is None:
        return
    if uniforms.dim() != 2 or uniforms.shape[0] != rows or uniforms.shape[1] < max_new_tokens:
        raise ValueError(
            f"generate: uniforms must be [rows, max_new_tokens] = [{rows}, {max_new_tokens}] (or more columns), got "
            f"{list(uniforms.shape)}"
        )


def _chunk_logprobs(
    head, h: Tensor, tgt: Tensor, temperature: float, with_entropy: bool, stats: HeadStats
) -> tuple[Tensor, Tensor]:
    # one [rows x positions, H] matrix product: a position slice of [B, L, H] is not contiguous, and a 3-d
    # non-contiguous input would go to a batched product with a broadcast weight (~50x slower on an H100)
    logits = head(h.reshape(-1, h.shape[-1])).view(*h.shape[:-1], -1)
    if temperature == 1.0 and not with_entropy:  # (scoring) in fp32 from the logits as they are: head_stats
        logp = stats.target_logprobs(logits, tgt)
        return logp, torch.zeros_like(logp)
    if temperature != 1.0:
        logits = logits.float() / temperature
    logp_all = logits.log_softmax(-1, dtype=torch.float32)
    logp = logp_all.gather(-1, tgt[..., None]).squeeze(-1)
    ent = -(logp_all.exp() * logp_all).sum(-1) if with_entropy else torch.zeros_like(logp)
    return logp, ent


def head_logprobs(
    head,
    hidden: Tensor,
    targets: Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk_elems: int = 1 << 26,
    stats: HeadStats | None = None,
) -> tuple[Tensor, Tensor | None]:
    """log softmax(head(hidden) / t)[targets] per position, [B, L] (and the entropy), in position chunks.

    One chunk when the logits are small (the tiny models); otherwise chunks of ``chunk_elems`` logits,
    each checkpointed under grad so that only ``hidden`` is kept for backward. ``head``: the LM head module (its
    ``weight`` gives the vocabulary; a head without one is run in one chunk); ``stats``: eager or compiled
    (:mod:`dgrpo.model.head_stats`; default eager).
    """
    stats = stats or HeadStats()
    B, L = targets.shape
    vocab = head.weight.shape[0] if hasattr(head, "weight") else None
    per_pos = B * (vocab or 1)
    step = max(1, chunk_elems // per_pos) if vocab else L
    if step >= L:
        logp, ent = _chunk_logprobs(head, hidden, targets, temperature, with_entropy, stats)
        return logp, (ent if with_entropy else None)
    parts = []
    for i in range(0, L, step):
        h, t = hidden[:, i : i + step], targets[:, i : i + step]
        if torch.is_grad_enabled() and h.requires_grad:
            parts.append(
                torch.utils.checkpoint.checkpoint(
                    _chunk_logprobs, head, h, t, temperature, with_entropy, stats, use_reentrant=False
                )
            )
        else:
            parts.append(_chunk_logprobs(head, h, t, temperature, with_entropy, stats))
    logp = torch.cat([p[0] for p in parts], 1)
    return logp, (torch.cat([p[1] for p in parts], 1) if with_entropy else None)


def sample_next(
    logits: Tensor, temperature: float, top_p: float, generator: torch.Generator | None, u: Tensor | None = None
) -> Tensor:
    """Greedy (temperature 0) or temperature / nucleus sampling of one token per row, [B]. ``u`` [B]: the rows' own
    U(0, 1) draws (inverse-CDF sampling); without it, ``generator`` draws."""
    if temperature <= 0:
        return logits.argmax(-1)
    probs = (logits / temperature).softmax(-1)
    if top_p < 1.0:
        sorted_p, idx = probs.sort(-1, descending=True)
        keep = sorted_p.cumsum(-1) - sorted_p < top_p
        sorted_p = sorted_p * keep
        probs = torch.zeros_like(probs).scatter(-1, idx, sorted_p)
    if u is None and generator is not None and generator.device != probs.device:
        u = torch.rand(probs.shape[0], generator=generator).to(probs.device)
    if u is None:
        return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return inverse_cdf(probs, u)


def inverse_cdf(weights: Tensor, u: Tensor) -> Tensor:
    """Per row of ``weights`` [B, V] (>= 0, unnormalised), the token whose share of the cumulative mass holds
    ``u`` [B] in [0, 1): the first token whose cumulative mass exceeds u x total, so a token without mass is never
    chosen (nor at u = 0); where rounding puts u x total at the total itself, the last token with mass."""
    cdf = weights.cumsum(-1)
    idx = torch.searchsorted(cdf, (u.to(cdf.dtype) * cdf[:, -1])[:, None], right=True).squeeze(-1)
    last = weights.shape[-1] - 1 - (weights.flip(-1) > 0).int().argmax(-1)
    return torch.minimum(idx, last)
