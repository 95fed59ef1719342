"""Rollouts of Dropout-GRPO: K perturbed generations per prompt (only the perturbation seeds are kept), and the
teacher-forced replay of their log-probabilities under the same perturbation at update time (mask replay)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import Tensor

from ..config import Config, ConfigError
from ..data.records import Record
from ..eval.scoring import RewardPart, Rewards, ScoreFn, numeric
from ..model.attention_mask import prebuilt_mask_applies
from ..model.fixed_shape import fixed_shape_generate, fixed_shape_target_logprobs
from ..model.latent_chain import chained_target_logprobs
from ..model.latent_lm import LatentLM
from ..model.recompute import unrecomputable_cache_layers
from ..perturbation import Perturbation
from ..perturbation.base import row_sampling_uniforms, to_device


@dataclass
class Rollouts:
    """K rollouts of G prompts, row = g * K + k. Only the seeds of the perturbations are kept."""

    prompt_ids: Tensor  # [N, P] left-padded
    prompt_mask: Tensor
    seeds: Tensor  # [N] int64
    tokens: Tensor  # [N, L] right-padded answers
    mask: Tensor  # [N, L]
    rollout_logp: Tensor  # [N, L] log-probs recorded while decoding
    rewards: Tensor  # [G, K]
    texts: list[str]
    entropy: float  # mean per-token entropy of the answer distribution while decoding
    host_masks: tuple[Tensor, Tensor] | None = None  # (prompt_mask, mask) on the CPU, copied once (see host())

    def host(self) -> tuple[Tensor, Tensor]:
        """The prompt and answer masks on the CPU (one copy per step): a micro-batch finds its padding columns there
        instead of asking the device."""
        if self.host_masks is None:
            self.host_masks = (self.prompt_mask.cpu(), self.mask.cpu())
        return self.host_masks


def _trim(ids: Tensor, mask: Tensor, left: bool) -> tuple[Tensor, Tensor]:
    """Drop all-padding columns (left or right) of a slice of a padded batch."""
    lo, hi = _span(mask)
    return (ids[:, lo:], mask[:, lo:]) if left else (ids[:, :hi], mask[:, :hi])


def _span(mask: Tensor) -> tuple[int, int]:
    """The first and one-past-the-last column of ``mask`` [rows, columns] that any row uses; if none, (columns, 0),
    so that both ``[:, lo:]`` and ``[:, :hi]`` are empty."""
    cols = mask.any(0).nonzero()
    if cols.numel() == 0:
        return mask.shape[1], 0
    return int(cols.min()), int(cols.max()) + 1


def resolve_engine(engine: str, device: torch.device, batched: bool, static_obstacle: str | None = None) -> str:
    """``grpo.engine``: ``auto`` is the fast engine on CUDA with a batched perturbation (graph capture pays off
    there) for a model that can decode over a static cache (``static_obstacle`` None), else the eager one; ``eager``
    and ``fast`` are taken as given."""
    if engine == "fast" and not batched:  # (native dropout is refused by name in the config; a kind of one's own here)
        raise ConfigError(
            "grpo.engine=fast needs a perturbation held in tensors for the batch; this perturbation.kind runs one "
            "rollout at a time (its class's batched is False): set grpo.engine=eager"
        )
    if engine != "auto":
        return engine
    return "fast" if device.type == "cuda" and batched and static_obstacle is None else "eager"


def latent_chain_obstacle(lm: LatentLM, cfg: Config, engine: str, distributed: bool) -> str | None:
    """Why ``grpo.update_latent_graphs`` cannot run in this trainer (None: it can): what the config says
    (:meth:`Config.latent_chain_obstacle`), then: it is the fast engine's, for one process and a coconut model, and
    its capture (CUDA) needs the prebuilt attention mask (no host read of the padding inside the graph); on any device
    it carries full-attention keys and values (a sliding-window or chunked layer's cache failed at the first update)."""
    why = cfg.latent_chain_obstacle()
    if why is not None:
        return why
    windowed = unrecomputable_cache_layers(lm.model.config)
    for ok, why in (
        (engine == "fast", f"the engine resolved to {engine} (on {lm.device.type}): set grpo.engine=fast"),
        (not distributed, "it runs in one process (not under torchrun yet)"),
        (lm.settings.mode == "coconut", f"it runs coconut thoughts; this model's mode is {lm.settings.mode!r}"),
        (
            not windowed,
            "it carries full-attention keys and values; this model's KV cache has "
            f"{', '.join(windowed)} layers (sliding-window or chunked attention)",
        ),
        (
            lm.device.type != "cuda" or prebuilt_mask_applies(lm.model.config),
            "its CUDA graphs need SDPA attention over full-attention layers "
            f"(attn_implementation={getattr(lm.model.config, '_attn_implementation', None)!r})",
        ),
    ):
        if not ok:
            return why
    return None


def resolve_latent_chain(lm: LatentLM, cfg: Config, engine: str, distributed: bool) -> bool:
    """``grpo.update_latent_graphs`` as a trainer runs it: false: off; true: on, or a one-line ConfigError where it
    cannot run; auto: on a CUDA device where it can run, else off (on a CPU the chain runs uncaptured, which saves
    nothing: it is there for tests)."""
    setting = cfg.grpo.update_latent_graphs
    if setting == "false":
        return False
    why = latent_chain_obstacle(lm, cfg, engine, distributed)
    if setting == "auto":
        return why is None and lm.device.type == "cuda"
    if why is not None:
        raise ConfigError(f"invalid config value grpo.update_latent_graphs: {why}; or set it to false or auto")
    return True


@torch.no_grad()
def collect_rollouts(
    lm: LatentLM,
    records: list[Record],
    *,
    group_size: int,
    n_latent: int,
    perturbation: Perturbation,
    seeds: Tensor,
    temperature: float = 0.0,
    top_p: float = 1.0,
    max_new_tokens: int = 48,
    batch_size: int = 512,
    max_question_tokens: int | None = None,
    reward_fn: ScoreFn | None = None,
    static_cache: bool = False,
    engine: str = "eager",
    keep_graphs: bool = False,
) -> Rollouts:
    """Generate ``group_size`` rollouts for every record; row i is perturbed by ``seeds[i]`` and, when sampling
    (``temperature`` > 0), draws its tokens from that seed too (:func:`row_sampling_uniforms`): a row's rollout is the
    same whatever batch or rank makes it. ``reward_fn`` (batched,
    see :mod:`dgrpo.eval.scoring`, a function or a :class:`~dgrpo.eval.scoring.Rewards`, each call checked: a
    function's None adds 0; default: the numeric verifier) gives each completion its reward;
    ``static_cache``: decode over a preallocated KV cache (``grpo.rollout_cache: static``); ``engine``: ``fast`` runs
    each batch over fixed shapes (:mod:`dgrpo.model.fixed_shape`, graph-captured on CUDA), ``keep_graphs``: with one
    decoder kept for every batch of its shape (``grpo.keep_graphs``)."""
    expanded = [r for r in records for _ in range(group_size)]
    prompt_ids, prompt_mask = lm.encode_questions([r.question for r in expanded], max_tokens=max_question_tokens)
    lm.check_fits(prompt_ids.shape[1], n_latent, max_new_tokens, key="grpo.n_latent")
    bs = batch_size if perturbation.batched else 1
    if engine == "fast":
        generate = partial(fixed_shape_generate, lm, capture=lm.device.type == "cuda", keep=keep_graphs)
    else:
        generate = partial(lm.generate, static_cache=static_cache)
    uniforms = row_sampling_uniforms(seeds, max_new_tokens) if temperature > 0 else None
    gens = []
    with lm.eval_mode():
        for b0 in range(0, len(expanded), bs):
            sl = slice(b0, b0 + bs)
            ids, mask = _trim(prompt_ids[sl], prompt_mask[sl], left=True)
            with perturbation.bind(lm, seeds[sl]) as pb:
                gen = generate(
                    ids,
                    mask,
                    n_latent,
                    max_new_tokens=max_new_tokens,
                    temperature=temperature,
                    top_p=top_p,
                    uniforms=None if uniforms is None else to_device(uniforms[sl], lm.device),
                    perturbation=pb,
                    with_entropy=True,
                )
                gens.append(gen)
    tokens, mask, rollout_logp, ent = _concat(gens, lm)
    texts = lm.decode(tokens, mask)
    values = _reward(reward_fn)(texts, expanded)
    rewards = torch.tensor(values, dtype=torch.float32).view(len(records), group_size)
    return Rollouts(prompt_ids, prompt_mask, seeds, tokens, mask, rollout_logp, rewards, texts, ent)


def _reward(reward_fn: ScoreFn | None) -> Rewards:
    """The reward :func:`collect_rollouts` gives: a :class:`Rewards` as it is (the trainer's); a function, called from
    Python, checked as the trainer checks one (its None, "does not apply", a total of 0; it gave torch's TypeError
    on building the tensor of rewards); none, the numeric verifier."""
    if isinstance(reward_fn, Rewards):
        return reward_fn
    fn = numeric if reward_fn is None else reward_fn
    return Rewards([RewardPart(getattr(fn, "__name__", None) or type(fn).__name__, fn)])


def _concat(gens: list, lm: LatentLM) -> tuple[Tensor, Tensor, Tensor, float]:
    """One right-padded batch (tokens, mask, recorded log-probs) from the generation batches, and the mean
    per-token entropy of the answer distribution. Each batch is already right-padded (pad after EOS, mask 0,
    log-prob 0): widened to the longest and stacked on the device, with one host read for the entropy."""
    width = max([1, *(g.tokens.shape[1] for g in gens)])

    def widened(t: Tensor, value: float) -> Tensor:
        return torch.nn.functional.pad(t, (0, width - t.shape[1]), value=value)

    tokens = torch.cat([widened(g.tokens, lm.pad_id) for g in gens])
    mask = torch.cat([widened(g.mask, 0) for g in gens])
    rollout_logp = torch.cat([widened(g.logprobs.float(), 0.0) for g in gens])
    ent = [g.entropy.sum() for g in gens if g.entropy is not None]
    ent_sum = torch.stack(ent).sum() if ent else torch.zeros((), device=mask.device)
    ent_sum, n_tokens = torch.stack([ent_sum.float(), mask.sum().float()]).tolist()
    return tokens, mask, rollout_logp, ent_sum / max(1.0, n_tokens)


def replay_logprobs(
    lm: LatentLM,
    ro: Rollouts,
    rows: Tensor,
    *,
    n_latent: int,
    perturbation: Perturbation,
    seeds: Tensor,
    temperature: float,
    engine: str = "eager",
    keep_graphs: bool = False,
    chain_latents: bool = False,
    min_rows: int = 0,
) -> tuple[Tensor, Tensor]:
    """Teacher-forced log pi(y | x, xi) of ``rows`` under the perturbation regenerated from ``seeds``,
    through the whole latent recurrence (differentiable when grad is enabled). Returns (logp, mask).
    ``engine``: ``fast`` runs ``<|end-latent|>`` in the answer's forward call (one call fewer) and, without grad (the
    reference model), the latent steps over fixed buffers as the rollout does (graph-captured on CUDA; ``keep_graphs``
    as in :func:`collect_rollouts`); with grad and ``chain_latents`` (``grpo.update_latent_graphs``), as one
    :class:`dgrpo.model.latent_chain.LatentChain` (graph-captured on CUDA). A graph kept under ``keep_graphs`` (the
    chain's, the reference's decoder) runs over at least ``min_rows`` rows: the largest batch of its kind, so that
    one capture serves all."""
    # the padding columns from the host's copy of the masks, the rows gathered on the device: no synchronisation
    prompt_host, answer_host = ro.host()
    rows_host = rows.cpu()
    lo, _ = _span(prompt_host[rows_host])
    _, hi = _span(answer_host[rows_host])
    idx = to_device(rows_host, ro.tokens.device)
    ids, mask = ro.prompt_ids.index_select(0, idx)[:, lo:], ro.prompt_mask.index_select(0, idx)[:, lo:]
    tg, tm = ro.tokens.index_select(0, idx)[:, :hi], ro.mask.index_select(0, idx)[:, :hi]
    t = temperature if temperature > 0 else 1.0
    fast = engine == "fast"
    with perturbation.bind(lm, seeds) as pb:
        graphs: dict[str, Any] = dict(
            perturbation=pb, temperature=t, capture=lm.device.type == "cuda", keep=keep_graphs
        )
        if fast and perturbation.batched and not torch.is_grad_enabled() and tg.shape[1] > 0:
            return fixed_shape_target_logprobs(lm, ids, mask, n_latent, tg, tm, **graphs, min_rows=min_rows), tm
        if fast and chain_latents and perturbation.batched and torch.is_grad_enabled():
            return chained_target_logprobs(lm, ids, mask, n_latent, tg, tm, **graphs, min_rows=min_rows), tm
        logp, _ = lm.target_logprobs(
            ids,
            mask,
            n_latent,
            tg,
            tm,
            perturbation=pb,
            temperature=t,
            stepwise=not perturbation.batched,
            end_with_targets=fast,
        )
    return logp, tm
