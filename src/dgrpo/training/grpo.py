"""Dropout-GRPO (Algorithm 1 of the paper): rollouts under replayable perturbations, update by mask replay.

One step, linearly:
  1. rollouts   K perturbed rollouts per prompt (fresh seeds), T latent steps, answer, verifier reward;
  2. filter     drop groups with accuracy outside [alpha_min, alpha_max]; agree across ranks; maybe skip;
  3. advantage  A = r - mean(r) per group (Dr. GRPO) or an ablation;
  4. update     for E mini-epochs, per micro-batch: replay each rollout's perturbation from its seed,
                recompute log pi(y | x, xi) through the whole latent recurrence with gradient, clipped
                surrogate + beta(t) * Huberized k3 KL, normalised by global counts; one optimizer step.
The ablations (deterministic GRPO, REINFORCE + EMA baseline, token sampling without dropout, fresh
masks at update) are the same loop with different config values.
"""
from __future__ import annotations

import copy
import json
import math
import random
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from torch import Tensor
from tqdm.auto import tqdm

from ..config import Config, ConfigError, to_dict
from ..data.records import Record
from ..model.latent_lm import LatentLM, right_pad
from ..perturbation import Perturbation, make_perturbation, seeds_for
from ..reward import extract_answer, score
from .checkpoint import count_lines, latest_checkpoint, load_checkpoint, reset_metrics, save_checkpoint
from .distributed import Dist
from .losses import aggregate, clipped_surrogate, ema_advantages, ema_update, group_advantages, group_filter, huber_k3, kl_log_ratio
from .schedules import beta_at, lr_at


class NonFiniteError(RuntimeError):
    """Too many consecutive steps with a non-finite loss or gradient (the state was saved first)."""


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


def _trim(ids: Tensor, mask: Tensor, left: bool) -> tuple[Tensor, Tensor]:
    """Drop all-padding columns (left or right) of a slice of a padded batch."""
    cols = mask.any(0).nonzero()
    if cols.numel() == 0:
        return ids[:, :0], mask[:, :0]
    lo, hi = int(cols.min()), int(cols.max()) + 1
    return (ids[:, lo:], mask[:, lo:]) if left else (ids[:, :hi], mask[:, :hi])


@torch.no_grad()
def collect_rollouts(lm: LatentLM, records: list[Record], *, group_size: int, n_latent: int, perturbation: Perturbation,
                     seeds: Tensor, temperature: float = 0.0, top_p: float = 1.0, max_new_tokens: int = 48,
                     batch_size: int = 512, max_question_tokens: int | None = None, generator: torch.Generator | None = None) -> Rollouts:
    """Generate ``group_size`` rollouts for every record; row i is perturbed by ``seeds[i]``."""
    questions = [r.question for r in records for _ in range(group_size)]
    golds = [r.answer for r in records for _ in range(group_size)]
    prompt_ids, prompt_mask = lm.encode_questions(questions, max_tokens=max_question_tokens)
    bs = batch_size if perturbation.batched else 1
    toks, masks, logps, ents = [], [], [], []
    was_training = lm.training
    lm.eval()
    for b0 in range(0, len(questions), bs):
        sl = slice(b0, b0 + bs)
        ids, mask = _trim(prompt_ids[sl], prompt_mask[sl], left=True)
        with perturbation.bind(lm, seeds[sl]) as pb:
            g = lm.generate(ids, mask, n_latent, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                            generator=generator, perturbation=pb, with_entropy=True)
        toks += list(g.tokens)
        masks += list(g.mask)
        logps += list(g.logprobs)
        ents.append((g.entropy.sum(), g.mask.sum()))
    lm.train(was_training)
    tokens, mask = right_pad([t[m.bool()].tolist() for t, m in zip(toks, masks)], lm.pad_id, lm.device)
    rollout_logp = torch.zeros(tokens.shape, dtype=torch.float32, device=lm.device)
    for i, (lp, m) in enumerate(zip(logps, masks)):
        n = int(m.sum())
        rollout_logp[i, :n] = lp[:n]
    texts = lm.decode(tokens, mask)
    rewards = torch.tensor([score(t, g) for t, g in zip(texts, golds)], dtype=torch.float32).view(len(records), group_size)
    ent = float(sum(e for e, _ in ents) / max(1, sum(int(n) for _, n in ents)))
    return Rollouts(prompt_ids, prompt_mask, seeds, tokens, mask, rollout_logp, rewards, texts, ent)


def replay_logprobs(lm: LatentLM, ro: Rollouts, rows: Tensor, *, n_latent: int, perturbation: Perturbation, seeds: Tensor,
                    temperature: float) -> tuple[Tensor, Tensor]:
    """Teacher-forced log pi(y | x, xi) of ``rows`` under the perturbation regenerated from ``seeds``,
    through the whole latent recurrence (differentiable when grad is enabled). Returns (logp, mask)."""
    ids, mask = _trim(ro.prompt_ids[rows], ro.prompt_mask[rows], left=True)
    tg, tm = _trim(ro.tokens[rows], ro.mask[rows], left=False)
    t = temperature if temperature > 0 else 1.0
    with perturbation.bind(lm, seeds) as pb:
        logp, _ = lm.target_logprobs(ids, mask, n_latent, tg, tm, perturbation=pb, temperature=t, stepwise=not perturbation.batched)
    return logp, tm


def agree_on_kept(n_kept_local: int, n_tokens_local: int, dist: Dist) -> tuple[int, int]:
    """The DDP-coordinated skip (paper Sec. 4.4): every rank learns the global number of kept rollouts
    and tokens through one all-reduce *before any backward*, so all ranks skip together (global 0) or
    all take part in the same collectives (a rank with nothing kept contributes a zero loss)."""
    if not dist.active:
        return n_kept_local, n_tokens_local
    t = torch.tensor([n_kept_local, n_tokens_local], dtype=torch.long)
    dist._reduce(t)
    return int(t[0]), int(t[1])


def build_optimizer(params, cfg: Config, device: torch.device) -> torch.optim.Optimizer:
    g = cfg.grpo
    if g.optimizer == "adamw8bit":
        if device.type == "cuda":
            try:
                import bitsandbytes as bnb  # type: ignore[import-not-found]

                return bnb.optim.AdamW8bit(params, lr=g.lr, weight_decay=g.weight_decay)
            except ImportError:
                warnings.warn("grpo.optimizer=adamw8bit needs bitsandbytes (pip install bitsandbytes); using torch AdamW", stacklevel=2)
        else:
            warnings.warn("grpo.optimizer=adamw8bit runs on CUDA only; using torch AdamW on this device", stacklevel=2)
    return torch.optim.AdamW(params, lr=g.lr, weight_decay=g.weight_decay)


class GRPOTrainer:
    """State of a Dropout-GRPO run; :meth:`step` is one iteration of Algorithm 1."""

    def __init__(self, lm: LatentLM, cfg: Config, train: list[Record], *, dist: Dist | None = None):
        self.lm, self.cfg, self.train_data = lm, cfg, train
        self.dist = dist or Dist.single()
        g = cfg.grpo
        if g.prompts_per_step < self.dist.world_size:
            raise ConfigError(f"grpo.prompts_per_step: {g.prompts_per_step} prompts cannot be shared by {self.dist.world_size} "
                              "processes (every rank needs at least one group)")
        self.n_latent = lm.settings.n_latent if g.n_latent < 0 else g.n_latent
        self.perturbation = make_perturbation(cfg.perturbation)
        self.ref: LatentLM | None = None
        if g.beta0 > 0:  # a plain copy on every rank, also under FSDP (it only runs no-grad forwards)
            self.ref = LatentLM(copy.deepcopy(lm.model).eval().requires_grad_(False), lm.tokenizer, lm.settings)
        params = self.dist.prepare_model(lm.model)  # rank 0's weights everywhere; FSDP2 shards here
        self.opt = build_optimizer(params, cfg, lm.device)
        self.ema_baseline = 0.5
        self.step_idx = 0
        self.row0 = 0  # global index of this rank's first rollout row in the current step
        # rank-independent: every rank draws the same global prompt list and keeps its shard
        self.data_rng = random.Random(cfg.seed * 1000003)
        self.order: list[int] = []
        self.sample_gen = torch.Generator().manual_seed(cfg.seed * 7 + 11 + self.dist.rank)
        self.nonfinite_skips = 0
        self.nonfinite_streak = 0

    # -------------------------------------------------------------------- resumable state
    def state(self) -> tuple[dict, dict[str, Tensor]]:
        """Everything besides weights and optimizer that determines the next steps: (JSON part, tensors)."""
        js = {"step_idx": self.step_idx, "ema_baseline": self.ema_baseline, "order": list(self.order),
              "data_rng": [self.data_rng.getstate()[0], list(self.data_rng.getstate()[1]), self.data_rng.getstate()[2]],
              "nonfinite_skips": self.nonfinite_skips, "nonfinite_streak": self.nonfinite_streak}
        return js, {f"sample_gen_rank{self.dist.rank}": self.sample_gen.get_state()}

    def load_state(self, js: dict, tensors: dict[str, Tensor]) -> None:
        self.step_idx, self.ema_baseline, self.order = js["step_idx"], js["ema_baseline"], list(js["order"])
        v, st, gauss = js["data_rng"]
        self.data_rng.setstate((v, tuple(st), gauss))
        self.nonfinite_skips, self.nonfinite_streak = js["nonfinite_skips"], js["nonfinite_streak"]
        key = f"sample_gen_rank{self.dist.rank}"
        if key in tensors:
            self.sample_gen.set_state(tensors[key])

    # -------------------------------------------------------------------- data
    def next_prompts(self) -> list[Record]:
        """This rank's share of the step's prompts: the global list (the same whatever the number of
        ranks) is drawn, then sharded by prompt, so the K rollouts of a group stay on one rank."""
        g = self.cfg.grpo
        out = []
        while len(out) < g.prompts_per_step:
            if not self.order:
                self.order = list(range(len(self.train_data)))
                self.data_rng.shuffle(self.order)
            out.append(self.train_data[self.order.pop()])
        return self.dist.shard(out)

    # -------------------------------------------------------------------- one step
    def step(self, prompts: list[Record] | None = None) -> dict:
        cfg, g, lm, dist = self.cfg, self.cfg.grpo, self.lm, self.dist
        step = self.step_idx
        lr = lr_at(step, g.lr, g.steps, g.warmup_steps, g.min_lr_ratio)
        beta = (beta_at(step, g.beta0, g.lr, g.steps, g.warmup_steps, g.min_lr_ratio) if g.anneal_beta else g.beta0) if g.beta0 > 0 else 0.0
        for pg in self.opt.param_groups:
            pg["lr"] = lr
        prompts = prompts if prompts is not None else self.next_prompts()
        K = g.group_size
        t0 = time.time()
        # one seed per global rollout row, from (run seed, step, row): distinct across ranks, independent of their number
        self.row0 = dist.offset(len(prompts) * K)
        seeds = seeds_for(cfg.seed, step, 0, self.row0 + len(prompts) * K)[self.row0:]
        ro = collect_rollouts(lm, prompts, group_size=K, n_latent=self.n_latent, perturbation=self.perturbation, seeds=seeds,
                              temperature=g.temperature, top_p=g.top_p, max_new_tokens=g.max_new_tokens, batch_size=g.rollout_batch_size,
                              max_question_tokens=cfg.data.max_question_tokens, generator=self.sample_gen)
        t_roll = time.time() - t0

        # ---- filter and advantages
        R = ro.rewards
        if g.advantage == "ema":
            keep = torch.ones(R.shape[0], dtype=torch.bool)
            adv = ema_advantages(R, self.ema_baseline)
        else:
            keep = group_filter(R, g.alpha_min, g.alpha_max) if g.filter else torch.ones(R.shape[0], dtype=torch.bool)
            adv = group_advantages(R, g.advantage)
        rows = keep.repeat_interleave(K).nonzero().flatten()
        n_tok_local = int(ro.mask[rows].sum()) if rows.numel() else 0
        n_kept, n_tok = agree_on_kept(int(rows.numel()), n_tok_local, dist)
        adv_rows = adv.flatten()

        metrics = self._rollout_metrics(ro, keep, prompts)
        metrics.update(step=step, lr=lr, beta=beta, time_rollout_s=round(t_roll, 4))
        t1 = time.time()
        if n_kept == 0:
            metrics.update(skipped=1, policy_loss=0.0, kl=0.0, clip_frac_low=0.0, clip_frac_high=0.0, ratio_max=1.0, ratio_min=1.0,
                           grad_norm=0.0, n_rollouts_kept=0)
        else:
            metrics.update(self._update(ro, rows, adv_rows, n_kept, n_tok, beta, step))
            metrics.update(skipped=0, n_rollouts_kept=n_kept)
        if g.advantage == "ema":
            self.ema_baseline = ema_update(self.ema_baseline, R, g.ema_alpha)
            metrics["ema_baseline"] = self.ema_baseline
        metrics["time_update_s"] = round(time.time() - t1, 4)
        metrics["nonfinite_skips"] = self.nonfinite_skips
        self.step_idx += 1
        if self.ref is not None and g.ref_renewal_every and self.step_idx % g.ref_renewal_every == 0:
            self.ref.model.load_state_dict(dist.full_state_dict(lm.model))
            metrics["ref_renewed"] = 1
        return metrics

    def _update(self, ro: Rollouts, rows: Tensor, adv_rows: Tensor, n_kept: int, n_tok: int, beta: float, step: int) -> dict:
        cfg, g, lm, dist = self.cfg, self.cfg.grpo, self.lm, self.dist
        mb = g.micro_batch_size if self.perturbation.batched else 1
        # a rank that kept nothing (while others did) has no chunk: it runs no backward but still joins the
        # gradient reduction below with zeros, and every metric reduction (all ranks, same calls, same order)
        chunks = [rows[i:i + mb] for i in range(0, rows.numel(), mb)]
        stats = {"policy_loss": 0.0, "kl": 0.0, "n_low": 0, "n_high": 0, "rmax": 1.0, "rmin": 1.0, "replay_diff": 0.0}
        old: dict[int, Tensor] = {}
        # the model stays in eval mode: its own dropout modules (e.g. GPT-2's, p > 0 in hub configs) would add
        # un-replayed noise the rollout never saw; the only stochasticity is the seeded perturbation
        lm.eval()
        if g.mini_epochs > 1:  # theta_old log-probs from a separate no-grad replay, same micro-batches
            with torch.no_grad():
                for ci, rws in enumerate(chunks):
                    old[ci], _ = replay_logprobs(lm, ro, rws, n_latent=self.n_latent, perturbation=self.perturbation,
                                                 seeds=self._update_seeds(ro, rws, step, 0), temperature=g.temperature)
        gn = torch.tensor(0.0)
        for epoch in range(g.mini_epochs):
            for ci, rws in enumerate(chunks):
                seeds = self._update_seeds(ro, rws, step, epoch)
                logp, tm = replay_logprobs(lm, ro, rws, n_latent=self.n_latent, perturbation=self.perturbation, seeds=seeds,
                                           temperature=g.temperature)
                old_lp = old[ci] if ci in old else logp.detach()
                if epoch == 0:
                    L = tm.shape[1]
                    stats["replay_diff"] = max(stats["replay_diff"], float(((logp.detach() - ro.rollout_logp[rws, :L]) * tm).abs().max()))
                obj, ratio, low, high = clipped_surrogate(logp, old_lp, adv_rows[rws].to(logp.device), g.eps_low, g.eps_high)
                agg = lambda x: aggregate(x, tm, g.aggregation, n_kept, n_tok, g.max_new_tokens)  # noqa: E731
                loss = -agg(obj)
                if self.ref is not None and beta > 0:
                    with torch.no_grad():
                        ref_lp, _ = replay_logprobs(self.ref, ro, rws, n_latent=self.n_latent, perturbation=self.perturbation,
                                                    seeds=seeds, temperature=g.temperature)
                    kl = agg(huber_k3(kl_log_ratio(logp, ref_lp, g.kl_form), g.huber_delta))
                    loss = loss + beta * kl
                    stats["kl"] += float(kl.detach()) if epoch == 0 else 0.0
                loss.backward()
                if epoch == 0:
                    stats["policy_loss"] += float(-agg(obj.detach()))
                    valid = tm.bool()
                    stats["n_low"] += int((low & valid).sum())
                    stats["n_high"] += int((high & valid).sum())
                    r = ratio.detach()[valid]
                    if r.numel():
                        stats["rmax"] = max(stats["rmax"], float(r.max()))
                        stats["rmin"] = min(stats["rmin"], float(r.min()))
            dist.all_reduce_grads(lm.model)
            params = [p for p in lm.model.parameters() if p.grad is not None]
            gn = torch.nn.utils.clip_grad_norm_(params, g.max_grad_norm if g.max_grad_norm > 0 else float("inf"))
            if torch.isfinite(gn):  # the summed gradient is the same on every rank, so is this decision
                self.opt.step()
            else:  # a non-finite loss or gradient: drop this update, keep training (counted in metrics)
                self.nonfinite_skips += 1
                stats["nonfinite"] = True
            self.opt.zero_grad(set_to_none=True)
            dist.gather_params(lm.model)
        self.nonfinite_streak = self.nonfinite_streak + 1 if stats.get("nonfinite") else 0
        return {"policy_loss": dist.sum_float(stats["policy_loss"]), "kl": dist.sum_float(stats["kl"]),
                "clip_frac_low": dist.sum_float(stats["n_low"]) / max(n_tok, 1), "clip_frac_high": dist.sum_float(stats["n_high"]) / max(n_tok, 1),
                "ratio_max": dist.max_float(stats["rmax"]), "ratio_min": dist.min_float(stats["rmin"]), "grad_norm": float(gn),
                "logp_replay_maxdiff": dist.max_float(stats["replay_diff"])}

    def _update_seeds(self, ro: Rollouts, rows: Tensor, step: int, epoch: int) -> Tensor:
        """The rollout's own seeds (mask replay), or fresh ones per mini-epoch (the CRN ablation)."""
        if self.cfg.grpo.replay == "seed":
            return ro.seeds[rows]
        fresh = seeds_for(self.cfg.seed, step, 0, self.row0 + ro.seeds.numel(), stream=f"fresh/{epoch}")  # per global row
        return fresh[self.row0:][rows]

    def _rollout_metrics(self, ro: Rollouts, keep: Tensor, prompts: list[Record]) -> dict:
        R = ro.rewards
        K = R.shape[1]
        within_std = R.std(dim=1, unbiased=False) if K > 1 else torch.full((R.shape[0],), float("nan"))
        answers = [extract_answer(t) for t in ro.texts]
        distinct = [len(set(answers[i * K:(i + 1) * K])) for i in range(R.shape[0])]
        d = self.dist
        n_groups = d.sum_int(R.shape[0])
        out = {
            "reward_mean": d.sum_float(float(R.sum())) / max(1, n_groups * K),
            "reward_std": (d.sum_float(float(within_std.sum())) / n_groups) if K > 1 else None,
            "frac_zero_std": (d.sum_float(float((within_std == 0).sum())) / n_groups) if K > 1 else None,
            "frac_groups_kept": d.sum_float(float(keep.sum())) / n_groups,
            "distinct_answers": d.sum_float(float(sum(distinct))) / n_groups,
            "answer_entropy": d.sum_float(ro.entropy * float(ro.mask.sum())) / max(1.0, d.sum_float(float(ro.mask.sum()))),
            "answer_len": d.sum_float(float(ro.mask.sum())) / max(1, d.sum_int(ro.mask.shape[0])),
        }
        return out


def train_grpo(lm: LatentLM, cfg: Config, train: list[Record], out_dir: Path, *, valid: dict[str, list[Record]] | None = None,
               evaluate_fn: Callable[[LatentLM, list[Record]], float] | None = None, dist: Dist | None = None,
               progress: bool = True, log=print, resume: bool = True) -> dict:
    """The full loop: periodic eval, metrics.jsonl (+ TensorBoard when installed), best/ and final/ checkpoints.

    Under torchrun every rank calls this; eval is sharded (``evaluate_fn`` must score every record it is
    given: apply any limit beforehand), and only rank 0 writes files."""
    dist = dist or Dist.single()
    g = cfg.grpo
    trainer = GRPOTrainer(lm, cfg, train, dist=dist)
    out_dir.mkdir(parents=True, exist_ok=True)
    writer = None
    metrics_f = None
    if dist.is_main:
        (out_dir / "config.json").write_text(json.dumps(to_dict(cfg), indent=2))
        try:
            from torch.utils.tensorboard import SummaryWriter  # type: ignore[attr-defined]

            writer = SummaryWriter(str(out_dir / "tb"))
        except Exception:  # tensorboard not installed
            writer = None
    best = {"step": None, "accuracy": -1.0}
    valid = valid or {}

    def write(row: dict) -> None:
        if metrics_f is None:
            return
        metrics_f.write(json.dumps(row) + "\n")
        metrics_f.flush()
        if writer is not None:
            for k, v in row.items():
                if isinstance(v, (int, float)) and k != "step" and v is not None and math.isfinite(v):
                    writer.add_scalar(k, v, row["step"])

    def run_eval(step: int) -> float | None:
        if not valid or evaluate_fn is None:
            return None
        row = {"step": step}
        first = None
        for name, recs in valid.items():
            local = dist.shard(recs)
            acc = evaluate_fn(lm, local) if local else 0.0
            if dist.active:  # sharded eval: the correct counts add up over ranks
                acc = dist.sum_int(round(acc * len(local))) / len(recs)
            row[f"eval/{name}/accuracy"] = acc
            first = acc if first is None else first
        write(row)
        if first is not None and step >= g.warmup_steps and first > best["accuracy"] and g.save_best:
            best.update(step=step, accuracy=first)
            dist.save_checkpoint(lm, out_dir / "best")  # every rank calls it (FSDP gathers); rank 0 writes
        return first

    # ---- resume: the newest intact checkpoint in OUT/checkpoints, if any (automatic)
    metrics_path = out_dir / "metrics.jsonl"
    skipped, last_eval = 0, None
    ckpt = latest_checkpoint(out_dir, log=log if dist.is_main else (lambda m: None)) if resume else None
    if ckpt is not None:
        extra = {"ref": trainer.ref.model} if trainer.ref is not None else None
        st = load_checkpoint(ckpt, lm=lm, optimizer=trainer.opt, extra_models=extra)
        trainer.load_state(st["trainer"], st["tensors"])
        best.update(st["best"])
        skipped, last_eval = st["skipped"], st["last_eval"]
    if dist.is_main:
        reset_metrics(metrics_path, st["metrics_lines"] if ckpt is not None else None)
        metrics_f = open(metrics_path, "a")
        if ckpt is not None:
            log(f"dgrpo: resumed from {ckpt} (step {trainer.step_idx})")
    if trainer.step_idx == 0:
        last_eval = run_eval(0)

    def save_state() -> None:
        if dist.fsdp or not dist.is_main:  # resumable checkpoints: replicated weights, rank 0 writes
            return
        js, tensors = trainer.state()
        save_checkpoint(out_dir, trainer.step_idx, lm=lm, optimizer=trainer.opt, keep_last=g.keep_last, tensors=tensors,
                        extra_models={"ref": trainer.ref.model} if trainer.ref is not None else None,
                        state={"trainer": js, "best": best, "skipped": skipped, "last_eval": last_eval,
                               "metrics_lines": count_lines(metrics_path)})

    bar = tqdm(range(trainer.step_idx, g.steps), desc="grpo", disable=not (progress and dist.is_main), dynamic_ncols=True,
               initial=trainer.step_idx, total=g.steps)
    for _ in bar:
        comm0 = dist.comm_s
        m = trainer.step()
        m["time_comm_s"] = round(dist.comm_s - comm0, 4)  # collectives, waiting for the slowest rank included
        skipped += m["skipped"]
        if m["step"] % g.log_every == 0 or m["step"] == g.steps - 1:
            write(m)
        done = trainer.step_idx
        if (g.eval_every and done % g.eval_every == 0) or done == g.steps:
            last_eval = run_eval(done)
        if (g.save_every and done % g.save_every == 0) or done == g.steps:
            save_state()
        if trainer.nonfinite_streak >= g.max_nonfinite:
            save_state()
            raise NonFiniteError(f"{trainer.nonfinite_streak} steps in a row had a non-finite loss or gradient (step {done}); "
                                 f"state saved in {out_dir / 'checkpoints'}; lower grpo.lr or check the data")
        post = {"reward": f"{m['reward_mean']:.3f}", "kept": f"{m['frac_groups_kept']:.2f}"}
        if last_eval is not None:
            post["eval"] = f"{last_eval:.3f}"
        bar.set_postfix(post)
    dist.save_checkpoint(lm, out_dir / "final")
    if dist.is_main:
        summary = {"best_step": best["step"], "best_accuracy": best["accuracy"] if best["step"] is not None else None,
                   "final_accuracy": last_eval, "steps": g.steps, "skipped_steps": skipped}
        (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        metrics_f.close()  # type: ignore[union-attr]
        if writer is not None:
            writer.close()
        return summary
    return {}
