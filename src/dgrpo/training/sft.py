"""Coconut curriculum SFT (and its baselines: CoT, no-CoT, pause-as-thought, no curriculum).

Stage k (epochs [k*E, (k+1)*E)) replaces the first k reasoning steps by k*c continuous thoughts;
past ``max_latent_stage`` all steps are dropped (Coconut, Hao et al. 2024, Sec. 3). The loss covers
only what is still written: the remaining steps, the answer and EOS (never the question, the
markers or the latents). At each stage boundary the AdamW state and the warmup+cosine schedule
start afresh when ``reset_optimizer`` (Coconut resets the optimizer per stage: the moments learned
for predicting step k's tokens are stale once step k became latent).
"""
from __future__ import annotations

import json
import math
import random
import time
from collections import defaultdict
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..config import Config, to_dict
from ..data.records import Record
from ..model.latent_lm import LatentLM, LatentSettings
from .checkpoint import count_lines, latest_checkpoint, load_checkpoint, reset_metrics, save_checkpoint
from .schedules import lr_at


@dataclass
class SFTExample:
    question: str
    n_latent: int
    target: str  # remaining steps + answer (EOS is appended by the tokenizer step)


def format_target(steps: list[str], answer: str) -> str:
    """The written part after ``<|end-latent|>``: one step per line, then ``#### answer``."""
    return "".join(s + "\n" for s in steps) + f"#### {answer}"


def stage_of_epoch(epoch: int, cfg: Config) -> int:
    s = cfg.sft
    if s.mode in ("cot", "no_cot"):
        return 0
    if s.mode == "no_curriculum":
        return (s.num_epochs - 1) // s.epochs_per_stage
    return epoch // s.epochs_per_stage


def latent_layout(stage: int, n_steps: int, cfg: Config) -> tuple[int, int]:
    """(steps replaced, latent thoughts) at ``stage`` for a chain of ``n_steps`` (Coconut's rule)."""
    s = cfg.sft
    if s.mode == "cot":
        return 0, 0
    if s.mode == "no_cot":
        return n_steps, 0
    if stage > s.max_latent_stage:
        n_lat = s.max_latent_stage if s.pad_latent_to_max else min(n_steps, s.max_latent_stage)
        return n_steps, n_lat * s.c_thought
    return min(stage, n_steps), stage * s.c_thought


def make_example(rec: Record, stage: int, cfg: Config, rng: random.Random) -> SFTExample:
    if cfg.sft.uniform_prob > 0 and cfg.sft.mode in ("coconut", "pause", "no_curriculum") and rng.random() < cfg.sft.uniform_prob:
        stage = rng.randint(0, len(rec.steps))
    skip, n_lat = latent_layout(stage, len(rec.steps), cfg)
    return SFTExample(rec.question, n_lat, format_target(rec.steps[skip:], rec.answer))


def stage_settings(stage: int, cfg: Config) -> LatentSettings:
    """What a checkpoint of ``stage`` uses at inference (its latent count for a full-length chain)."""
    _, n_lat = latent_layout(stage, 10**6 if cfg.sft.pad_latent_to_max else cfg.sft.max_latent_stage, cfg)
    mode = {"no_curriculum": "coconut"}.get(cfg.sft.mode, cfg.sft.mode)
    return LatentSettings(mode=mode, c_thought=cfg.sft.c_thought, stage=stage, n_latent=n_lat)


def final_settings(cfg: Config) -> LatentSettings:
    return stage_settings(stage_of_epoch(cfg.sft.num_epochs - 1, cfg), cfg)


def sft_loss(lm: LatentLM, examples: list[SFTExample], cfg: Config, normalizer: float) -> tuple[torch.Tensor, int]:
    """Summed NLL of the written targets / ``normalizer``; rows are grouped by latent count."""
    mode = "pause" if cfg.sft.mode == "pause" else "coconut"
    groups: dict[int, list[SFTExample]] = defaultdict(list)
    for ex in examples:
        groups[ex.n_latent].append(ex)
    total, n_tok = None, 0
    for n_lat, exs in sorted(groups.items()):
        ids, mask = lm.encode_questions([e.question for e in exs], max_tokens=cfg.data.max_question_tokens)
        tg, tm = lm.encode_targets([e.target for e in exs], max_tokens=cfg.data.max_target_tokens)
        logp, _ = lm.target_logprobs(ids, mask, n_lat, tg, tm, mode=mode)
        part = -(logp * tm).sum() / normalizer
        total = part if total is None else total + part
        n_tok += int(tm.sum())
    assert total is not None
    return total, n_tok


def count_target_tokens(lm: LatentLM, examples: list[SFTExample], cfg: Config) -> int:
    _, tm = lm.encode_targets([e.target for e in examples], max_tokens=cfg.data.max_target_tokens)
    return int(tm.sum())


def autocast_ctx(cfg: Config, device: torch.device):
    on = cfg.sft.bf16 == "true" or (cfg.sft.bf16 == "auto" and device.type == "cuda")
    return torch.autocast(device.type, dtype=torch.bfloat16) if on else nullcontext()


def train_sft(lm: LatentLM, train: list[Record], cfg: Config, out_dir: Path, *, valid: list[Record] | None = None,
              evaluate_fn=None, log=print, dist=None, resume: bool = True) -> LatentLM:
    """Run the curriculum; write ``metrics.jsonl``, ``stage-K/`` checkpoints and ``final/`` under ``out_dir``.

    ``evaluate_fn(lm, records, settings) -> accuracy`` is called at the end of each stage when given.
    ``dist`` (a :class:`dgrpo.training.distributed.Dist`) shards batches and the eval across processes;
    every rank calls this, only rank 0 writes files.
    """
    from ..config import ConfigError
    from .distributed import Dist

    dist = dist or Dist.single()
    s = cfg.sft
    if s.batch_size < dist.world_size:
        raise ConfigError(f"sft.batch_size: {s.batch_size} examples cannot be shared by {dist.world_size} processes")
    params = dist.prepare_model(lm.model)  # rank 0's weights everywhere; FSDP2 shards here
    device = lm.device
    out_dir.mkdir(parents=True, exist_ok=True)
    if dist.is_main:
        (out_dir / "config.json").write_text(json.dumps(to_dict(cfg), indent=2))
    metrics_path = out_dir / "metrics.jsonl"
    global_batch = s.batch_size
    steps_per_epoch = max(1, len(train) // global_batch)
    epochs_by_stage: dict[int, list[int]] = defaultdict(list)
    for e in range(s.num_epochs):
        epochs_by_stage[stage_of_epoch(e, cfg)].append(e)

    def new_optimizer(stage: int):
        n_ep = len(epochs_by_stage[stage]) if s.reset_optimizer else s.num_epochs
        return torch.optim.AdamW(params, lr=s.lr, weight_decay=s.weight_decay, betas=(0.9, 0.95)), n_ep * steps_per_epoch

    opt, sched_total, step_in_sched, global_step, stage_prev = None, 0, 0, 0, None
    start_epoch, start_b = 0, 0
    # ---- resume from the newest intact checkpoint in OUT/checkpoints, if any (automatic)
    ckpt = latest_checkpoint(out_dir, log=log if dist.is_main else (lambda m: None)) if resume else None
    if ckpt is not None:
        saved = json.loads((ckpt / "state.json").read_text())
        opt, _ = new_optimizer(saved["stage_prev"])
        st = load_checkpoint(ckpt, lm=lm, optimizer=opt)
        start_epoch, start_b, global_step = st["epoch"], st["batch"], st["global_step"]
        step_in_sched, sched_total, stage_prev = st["step_in_sched"], st["sched_total"], st["stage_prev"]
    metrics = None
    if dist.is_main:
        reset_metrics(metrics_path, st["metrics_lines"] if ckpt is not None else None)
        metrics = open(metrics_path, "a")
        if ckpt is not None:
            log(f"dgrpo: resumed from {ckpt} (step {global_step})")

    def save_state(epoch: int, batch: int) -> None:
        """Resumable state: run epoch ``epoch`` from batch ``batch`` next."""
        if dist.fsdp or not dist.is_main:
            return
        metrics.flush()  # type: ignore[union-attr]
        save_checkpoint(out_dir, global_step, lm=lm, optimizer=opt, keep_last=s.keep_last,
                        state={"epoch": epoch, "batch": batch, "global_step": global_step, "step_in_sched": step_in_sched,
                               "sched_total": sched_total, "stage_prev": stage_prev, "nonfinite_skips": nonfinite_skips,
                               "metrics_lines": count_lines(metrics_path)})

    t0 = time.time()
    nonfinite_streak = 0
    nonfinite_skips = st["nonfinite_skips"] if ckpt is not None else 0
    bar = tqdm(total=s.num_epochs * steps_per_epoch, initial=global_step, desc="sft", disable=not dist.is_main, dynamic_ncols=True)
    for epoch in range(start_epoch, s.num_epochs):
        stage = stage_of_epoch(epoch, cfg)
        if opt is None or (stage != stage_prev and s.reset_optimizer):
            opt, sched_total = new_optimizer(stage)
            step_in_sched = 0
        stage_prev = stage
        order = list(range(len(train)))
        random.Random(f"{cfg.seed}/order/{epoch}").shuffle(order)  # a pure function of (seed, epoch): resumable
        lm.train()
        for b in range(start_b if epoch == start_epoch else 0, steps_per_epoch):
            idx = order[b * global_batch:(b + 1) * global_batch]
            ex_rng = random.Random(f"{cfg.seed}/examples/{global_step}")
            examples = [make_example(train[i], stage, cfg, ex_rng) for i in idx]
            local = dist.shard(examples)
            n_tokens_global = dist.sum_int(count_target_tokens(lm, local, cfg))
            lr = lr_at(step_in_sched, s.lr, sched_total, s.warmup_steps)
            for g in opt.param_groups:
                g["lr"] = lr
            micro = max(1, math.ceil(len(local) / s.grad_accum))
            loss_sum = 0.0
            for m0 in range(0, len(local), micro):
                with autocast_ctx(cfg, device):
                    # summed NLL / global token count: the per-rank gradients add up to the global one
                    loss, _ = sft_loss(lm, local[m0:m0 + micro], cfg, n_tokens_global)
                loss.backward()
                loss_sum += loss.item()
            dist.all_reduce_grads(lm.model)
            gn = torch.nn.utils.clip_grad_norm_(params, s.max_grad_norm if s.max_grad_norm > 0 else float("inf"))
            finite = bool(torch.isfinite(gn))  # the same on every rank: the gradient was all-reduced
            if finite:
                opt.step()
            else:  # a non-finite loss or gradient: drop this update, keep training (counted in metrics)
                nonfinite_skips += 1
            nonfinite_streak = 0 if finite else nonfinite_streak + 1
            opt.zero_grad(set_to_none=True)
            dist.gather_params(lm.model)
            step_in_sched += 1
            global_step += 1
            loss_val = dist.sum_float(loss_sum)
            bar.update(1)
            bar.set_postfix(stage=stage, loss=f"{loss_val:.3f}")
            if metrics is not None and (global_step % 10 == 0 or b == steps_per_epoch - 1 or not finite):
                metrics.write(json.dumps({"step": global_step, "epoch": epoch, "stage": stage, "loss": loss_val, "lr": lr,
                                          "grad_norm": float(gn), "nonfinite_skips": nonfinite_skips, "time_s": round(time.time() - t0, 2)}) + "\n")
                metrics.flush()
            if nonfinite_streak >= s.max_nonfinite:
                save_state(epoch, b + 1)
                from .grpo import NonFiniteError

                raise NonFiniteError(f"{nonfinite_streak} SFT steps in a row had a non-finite loss or gradient (step {global_step}); "
                                     f"state saved in {out_dir / 'checkpoints'}; lower sft.lr or check the data")
            if s.save_every and global_step % s.save_every == 0 and b + 1 < steps_per_epoch:
                save_state(epoch, b + 1)
        last_of_stage = epoch == s.num_epochs - 1 or stage_of_epoch(epoch + 1, cfg) != stage
        if last_of_stage:
            settings = stage_settings(stage, cfg)
            lm.settings = settings
            row = {"step": global_step, "stage": stage, "n_latent": settings.n_latent, "time_s": round(time.time() - t0, 2)}
            if s.eval_each_stage and valid and evaluate_fn is not None:
                lm.eval()
                local = dist.shard(valid)
                acc = evaluate_fn(lm, local, settings) if local else 0.0
                if dist.active:  # sharded eval: the correct counts add up over ranks
                    acc = dist.sum_int(round(acc * len(local))) / len(valid)
                row["eval/valid/accuracy"] = acc
                lm.train()
            dist.save_checkpoint(lm, out_dir / f"stage-{stage}")  # every rank calls it (FSDP gathers); rank 0 writes
            if dist.is_main:
                metrics.write(json.dumps(row) + "\n")  # type: ignore[union-attr]
                metrics.flush()  # type: ignore[union-attr]
                log(f"stage {stage} done: " + ", ".join(f"{k}={v}" for k, v in row.items()))
        save_state(epoch + 1, 0)
    bar.close()
    lm.settings = final_settings(cfg)
    lm.eval()
    dist.save_checkpoint(lm, out_dir / "final")
    if dist.is_main:
        metrics.close()  # type: ignore[union-attr]
    return lm

