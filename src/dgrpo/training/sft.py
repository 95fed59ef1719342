"""Coconut curriculum SFT (and its baselines: CoT, no-CoT, pause-as-thought, no curriculum).

Stage k (epochs [k*E, (k+1)*E)) replaces the first k reasoning steps by k*c continuous thoughts;
past ``max_latent_stage`` all steps are dropped (Coconut, Hao et al. 2024, Sec. 3). The loss covers
only what is still written: the remaining steps, the answer and EOS (never the question, the
markers or the latents). With ``reset_optimizer`` the AdamW state and the lr schedule start afresh at
each stage boundary (``reset_every: stage``: the moments learned for predicting step k's tokens are
stale once step k became latent) or at every epoch (``epoch``: what Coconut's run.py does, with a
constant lr and torch's default betas: ``lr_schedule: constant``, ``adam_betas: [0.9, 0.999]``).
The curriculum itself (an epoch's stage, a record's example at a stage, the schedules' lengths) is
:mod:`dgrpo.training.curriculum`; this module is the run: the loss, the steps, validation, checkpoints and resume.
"""

from __future__ import annotations

import math
import os
import random
import time
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any, NoReturn

import torch
from tqdm.auto import tqdm

from ..config import (
    Config,
    ConfigError,
    to_dict,
    unused_model_settings,
    unused_recompute_settings,
    unused_sft_settings,
)
from ..data.records import Record, fingerprint
from ..eval.evaluate import EvalResult, check_fits_context
from ..model.factory import apply_speedups, lora_for_training
from ..model.latent_lm import LatentLM, LatentSettings
from ..model.sources import on_for_device
from ..model.verified import one_line
from ..progress import bar_disabled, say
from ..run_layout import BEST_DIR, CHECKPOINTS_DIR, FINAL_DIR, stage_dir
from .applied import applied_settings
from .checkpoint import StateSection, counts, read_checkpoint, save_checkpoint, shard_staging
from .curriculum import (
    Curriculum,
    Progress,
    SFTExample,
    epoch_steps,
    final_settings,
    format_target,
    latent_layout,
    layout_stage,
    make_example,
    stage_of_epoch,
    stage_settings,
)
from .distributed import Dist
from .guards import NonFiniteError, NonFiniteGuard, clip_gradients, weights_finite
from .master_weights import adamw, carry_masters
from .memory import oom_advice
from .model_record import recorded_model
from .preemption import stop_requested, within_step
from .run import FinalEval, RunDir
from .run_inputs import (
    check_restart,
    check_run_inputs,
    default_evaluate_fn,
    found_once,
    warn_if_training_questions_cut,
    widest_prompt,
)
from .schedules import constant_lr_at, lr_at
from .sharded_eval import best_value, sharded_scores
from .wording import in_command_line


def sft_loss(lm: LatentLM, examples: list[SFTExample], cfg: Config, normalizer: float) -> tuple[torch.Tensor, int]:
    """Summed NLL of the written targets / ``normalizer``; rows are grouped by latent count."""
    mode = "pause" if cfg.sft.mode == "pause" else "coconut"
    data_key = "task.n_steps" if cfg.data.train.startswith("builtin") else ""  # (its problems' length)
    groups: dict[int, list[SFTExample]] = defaultdict(list)
    for ex in examples:
        groups[ex.n_latent].append(ex)
    total, n_tok = None, 0
    for n_lat, exs in sorted(groups.items()):
        ids, mask = lm.encode_questions([e.question for e in exs], max_tokens=cfg.data.max_question_tokens)
        tg, tm = lm.encode_targets([e.target for e in exs], max_tokens=cfg.data.max_target_tokens)
        lm.check_fits(
            ids.shape[1],
            n_lat,
            tg.shape[1],
            key="sft.c_thought",
            target_key="data.max_target_tokens",
            data_key=data_key,
        )
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
    on = on_for_device(cfg.sft.bf16, device)
    return torch.autocast(device.type, dtype=torch.bfloat16) if on else nullcontext()


def new_optimizer(
    params: list, cfg: Config, previous: torch.optim.Optimizer | None = None, warn: bool = True
) -> torch.optim.Optimizer:
    """AdamW (with ``model.master_weights``, over float32 masters: a ``previous`` optimizer's are carried over);
    ``warn``: of a step rounded away on bf16 weights without masters (once a run: its first optimizer's)."""
    s = cfg.sft
    beta1, beta2 = s.adam_betas
    opt = adamw(
        params, cfg.model.master_weights, warn_rounding=warn, lr=s.lr, weight_decay=s.weight_decay, betas=(beta1, beta2)
    )
    carry_masters(previous, opt)
    return opt


def sft_step(
    lm: LatentLM, opt: torch.optim.Optimizer, params: list, local: list[SFTExample], cfg: Config, dist: Dist, lr: float
) -> tuple[float, float, bool]:
    """One optimizer step on this rank's share of a batch, in ``grad_accum`` micro-batches.
    Returns (this rank's summed loss, gradient norm, whether it was finite and so applied)."""
    # summed NLL / global token count: the per-rank gradients add up to the global one
    n_tokens_global = dist.sum_int(count_target_tokens(lm, local, cfg))
    for g in opt.param_groups:
        g["lr"] = lr
    micro = max(1, math.ceil(len(local) / cfg.sft.grad_accum))
    loss_sum = 0.0
    for m0 in range(0, len(local), micro):
        with autocast_ctx(cfg, lm.device):
            loss, _ = sft_loss(lm, local[m0 : m0 + micro], cfg, n_tokens_global)
        loss.backward()
        loss_sum += loss.item()
    dist.all_reduce_grads(lm.model)
    max_norm = cfg.sft.max_grad_norm if cfg.sft.max_grad_norm > 0 else float("inf")
    gn = clip_gradients(params, max_norm)  # (in float32: a bf16 norm had three significant digits)
    finite = bool(torch.isfinite(gn))  # the same on every rank: the gradient was all-reduced
    if finite:  # else a non-finite loss or gradient: drop this update, keep training (counted)
        opt.step()
    opt.zero_grad(set_to_none=True)
    dist.gather_params(lm.model)
    if finite and not weights_finite(params, dist):
        raise NonFiniteError(
            f"the weights became non-finite in an SFT optimizer step (lr {lr:.3g}, finite gradient norm "
            f"{float(gn):.3g}); nothing of this step was saved: the last checkpoint is intact; lower sft.lr"
        )
    return loss_sum, float(gn), finite


#: a checkpoint's ``progress`` (every dgrpo has written all of Progress's fields, each a count or a position)
PROGRESS_STATE = StateSection.of(
    Progress, tuple(f.name for f in fields(Progress)), counts(*(f.name for f in fields(Progress)))
)


class SFTRun:
    """One SFT run between steps: the curriculum, where it stands, the optimizer and the non-finite guard,
    started fresh or resumed from the run directory's newest intact checkpoint."""

    def __init__(self, lm: LatentLM, cfg: Config, dist: Dist, run: RunDir, train: list[Record]):
        self.lm, self.cfg, self.dist, self.run = lm, cfg, dist, run
        self.started_in = os.getcwd()  # (applied.json's started_in: a relative data.test names a file from here)
        self.data_fingerprint, n_train = fingerprint(train), len(train)
        lm.use_recompute(cfg.sft, "sft")
        self.kernels = apply_speedups(lm, cfg.model)  # (as the GRPO trainer applies them)
        dist.broadcast_weights(lm.model)  # rank 0's weights everywhere
        self.params = dist.prepare_model(lm.model)  # FSDP2 shards here
        self.plan = Curriculum(cfg, epoch_steps(n_train, cfg))
        self.prog, saved = Progress(), None
        opt = new_optimizer(self.params, cfg)  # the state a checkpoint loads into
        loaded = run.resume(
            lambda ckpt: read_checkpoint(
                ckpt,
                lm=lm,
                optimizer=opt,
                sharded=dist.fsdp,
                state_keys=("nonfinite_skips", "metrics_lines"),
                sections={"progress": PROGRESS_STATE},
            )
        )
        self.opt: torch.optim.Optimizer | None = None  # a fresh run makes it at its first stage
        check_restart(lm, loaded is not None, "train_sft")
        if loaded is not None:
            saved = loaded.apply(lm, opt, dist=dist)
            run.check_same_data(saved.get("train_data"), self.data_fingerprint)
            self.prog, self.opt = Progress(**saved["progress"]), opt
            if self.prog.stage_prev is not None:  # the schedule of the config resumed with (allow_config_change may
                # have lengthened the run: the saved length would hold the added steps at lr 0); unchanged, the same
                self.prog.sched_total = self.plan.schedule_length(self.prog.stage_prev)
        #: the metrics rows from which a ``best_epoch`` row names ``best/`` (past the resumed checkpoint's rows when
        #: its best/ was written after it and removed: :meth:`RunDir.drop_stale_best`)
        self.best_rows_from = saved["metrics_lines"] if saved and run.drop_stale_best(saved) else 0
        skips = saved["nonfinite_skips"] if saved else 0
        self.guard = NonFiniteGuard(cfg.sft.max_nonfinite, "SFT", "sft.lr", skips=skips)
        run.start(saved, self.applied(opt))  # (the optimizer's class: every stage's is new_optimizer's)
        # the metrics' time_s goes on from the checkpoint's (one between two logged rows: its own time, not the row's)
        trained = (saved["time_s"] if "time_s" in saved else _time_trained(run)) if saved else 0.0  # (older: the rows)
        self.t0 = time.time() - trained

    def enter_stage(self, stage: int) -> None:
        """At the start of an epoch: a new AdamW and lr schedule at a reset boundary (``reset_optimizer``: a new
        stage, or, ``reset_every: epoch``, the end of the last epoch's schedule), or at the start of the run."""
        s, prog = self.cfg.sft, self.prog
        boundary = stage != prog.stage_prev if s.reset_every == "stage" else prog.step_in_sched >= prog.sched_total
        if self.opt is None or (boundary and s.reset_optimizer):
            # (not warned of again: __init__'s optimizer was, each stage's warning one more line alike)
            self.opt = new_optimizer(self.params, self.cfg, previous=self.opt, warn=False)
            self.prog.sched_total, self.prog.step_in_sched = self.plan.schedule_length(stage), 0
        self.prog.stage_prev = stage

    def step(self, local: list[SFTExample], epoch: int, stage: int, t0: float) -> tuple[dict, bool]:
        """One optimizer step; returns (its metrics row, whether it was applied)."""
        s, prog = self.cfg.sft, self.prog
        assert self.opt is not None
        if s.lr_schedule == "constant":
            lr = constant_lr_at(prog.step_in_sched, s.lr, s.warmup_steps)
        else:
            lr = lr_at(prog.step_in_sched, s.lr, prog.sched_total, s.warmup_steps)
        with self._oom_advice():
            loss_local, gn, finite = sft_step(self.lm, self.opt, self.params, local, self.cfg, self.dist, lr)
        self.guard.record(finite)
        prog.step_in_sched += 1
        prog.global_step += 1
        row = {
            "step": prog.global_step,
            "epoch": epoch,
            "stage": stage,
            "loss": self.dist.sum_float(loss_local),
            "lr": lr,
            "grad_norm": gn,
            "nonfinite_skips": self.guard.skips,
            "time_s": round(time.time() - t0, 2),
        }
        return row, finite

    def train_epoch(self, train: list[Record], epoch: int, stage: int, first_batch: int, bar: tqdm, t0: float) -> None:
        """Epoch ``epoch``'s steps from batch ``first_batch``: metrics rows (every 10th step, the epoch's last, a
        skipped one) and the checkpoints within the epoch: every ``sft.save_every`` steps, at a non-finite stop, and
        at a SIGTERM (after the step under way; :mod:`dgrpo.training.preemption`). A stop, with its checkpoint or with
        none (weights made non-finite), writes ``applied.json``'s entry again, as at a run's end: a compiler's
        fallback in the run shown (:meth:`stop_after_step`). The epoch's end saves after its evaluation, ``stage-K/``
        and ``best/``; a SIGTERM in its last step saves before them (``batch`` = the epoch's steps: the resumed run
        does the epoch's end first), so that the grace period need not hold them."""
        s, prog, steps = self.cfg.sft, self.prog, self.plan.steps_per_epoch
        order = self.plan.epoch_order(epoch, len(train))
        self.lm.stopped_run = str(self.run.out_dir)  # (mid-run weights until the run ends: check_restart)
        for b in range(first_batch, steps):
            with within_step():
                ex_rng = random.Random(f"{self.cfg.seed}/examples/{prog.global_step}")
                picked = order[b * s.batch_size : (b + 1) * s.batch_size]
                batch = [make_example(train[i], stage, self.cfg, ex_rng) for i in picked]
                try:
                    row, applied = self.step(self.dist.shard(batch), epoch, stage, t0)
                except NonFiniteError as e:  # (weights made non-finite: nothing of this step is saved)
                    self.stop_after_step(e)
                bar.update(1)
                bar.set_postfix(stage=stage, loss=f"{row['loss']:.3f}")
                if prog.global_step % 10 == 0 or b == steps - 1 or not applied:
                    self.run.metrics.write(row)
            tripped = self.guard.tripped  # (alike on every rank: then no SIGTERM is asked about)
            mid_epoch, preempted = b + 1 < steps, not tripped and stop_requested(self.dist)
            if tripped or preempted or (mid_epoch and s.save_every and prog.global_step % s.save_every == 0):
                self.save(epoch, b + 1)
            if tripped or preempted:
                saved_in = self.run.out_dir / CHECKPOINTS_DIR
                self.stop_after_step(self.guard.error(prog.global_step, saved_in) if tripped else None)

    def stop_after_step(self, error: NonFiniteError | None) -> NoReturn:
        """Stop the run after a step, its checkpoint written if it has one (:meth:`RunDir.stop_after_step`:
        ``applied.json``'s entry written again first): ``error`` raised, else a SIGTERM's stop."""
        assert self.opt is not None  # (a step was trained)
        self.run.stop_after_step(self.applied(self.opt), error)

    def _oom_advice(self) -> AbstractContextManager[None]:
        """What to try when an SFT step runs out of device memory: the next ``sft.grad_accum`` that divides
        ``sft.batch_size`` (smaller micro-batches), or recomputation."""
        s = self.cfg.sft
        more = next((d for d in range(s.grad_accum + 1, s.batch_size + 1) if s.batch_size % d == 0), s.grad_accum)
        why = "micro-batches per optimizer step, batch_size / grad_accum examples each; the loss does not depend on it"
        if not s.recompute:
            why += "; sft.recompute=true keeps less for backward"
        elif s.recompute_kept_layers:
            why += f"; fewer sft.recompute_kept_layers (now {s.recompute_kept_layers}) keep less for backward"
        return oom_advice("SFT step", "sft.grad_accum", s.grad_accum, why, to_try=more)

    def finish(self, t0: float, final_eval: FinalEval | None = None) -> None:
        """With the final stage's settings: ``final_eval``'s row (the test sets), then ``final/``, written last (a run
        with a final/ is finished, its test sets' results written; one stopped before is resumed by the same command
        from its last epoch's checkpoint, with nothing left to train), and one summary line. The optimizer's moments
        are freed first: the test sets and ``best/`` loaded beside the model have their memory. ``applied.json``'s
        entry is written again as at the end (a compiler's fallback in the run shown)."""
        if self.opt is not None:  # (None: resumed with nothing left to train; the start's entry stands)
            self.run.record_applied_at_end(self.applied(self.opt))
        self.opt = None
        self.lm.settings = final_settings(self.cfg)
        self.lm.eval()
        best = last_best_row(self.run.metrics.rows()[self.best_rows_from :])
        self.run.final_eval(final_eval, self.lm, self.prog.global_step, best["best_epoch"] if best else None)
        self.dist.save_model(self.lm, self.run.out_dir / FINAL_DIR)
        self.lm.stopped_run = None
        rows = self.run.metrics.rows()
        by_stage = {  # (the stage-end rows: sft.eval_every_epoch's rows name their epoch)
            r["stage"]: r["eval/valid/accuracy"] for r in rows if "eval/valid/accuracy" in r and "epoch" not in r
        }
        accs = ", ".join(f"{k}: {100 * v:.1f}%" for k, v in by_stage.items())  # (a resumed run's earlier stages too)
        s = self.lm.settings
        kept = f"; best/: epoch {best['best_epoch']} ({100 * best['best/valid/accuracy']:.1f}%)" if best else ""
        metric = self.cfg.sft.best_metric
        if best and metric != "accuracy" and f"best/valid/{metric}" in best:  # (the value best/ was kept by first;
            # none: a best/ kept by a count, or by dgrpo before mean scores, that no later epoch replaced, said 'nan')
            value, accuracy = best[f"best/valid/{metric}"], best["best/valid/accuracy"]
            kept = f"; best/: epoch {best['best_epoch']} by {metric} {value:.4f} ({100 * accuracy:.1f}%)"
        resumed = (
            " (the run's: its earlier processes' time too, as time_s)" if self.run.resumed_step is not None else ""
        )
        thoughts = f"{s.n_latent} latent thought{'' if s.n_latent == 1 else 's'}"
        self.run.log(
            f"dgrpo sft: done in {time.time() - t0:.0f} s{resumed}; validation accuracy by stage: "
            f"{accs or 'not evaluated'}; "
            f"final stage {s.stage} ({thoughts}){kept}; {self.guard.skips} non-finite steps skipped"
        )

    def applied(self, opt: torch.optim.Optimizer) -> dict[str, Any]:
        """What this run trains with, as resolved (:func:`~dgrpo.training.applied.applied_settings`), ``opt``'s class
        and the kernels applied among it, and the folder the run started in (``started_in``)."""
        plugins = [self.cfg.eval.scorer]
        return applied_settings(
            self.lm, self.dist, opt, kernels=self.kernels, plugins=plugins, started_in=self.started_in
        )

    def save(self, epoch: int, batch: int) -> None:
        """Resumable state: run epoch ``epoch`` from batch ``batch`` next (rank 0 writes it; under FSDP2 every rank
        first gathers the model's and the optimizer's state to it)."""
        assert self.opt is not None
        staging = shard_staging(self.run.out_dir, self.prog.global_step)
        fsdp_state = self.dist.training_state(self.lm.model, self.opt, staging)
        if not self.dist.is_main:
            return
        state = {
            "progress": {**asdict(self.prog), "epoch": epoch, "batch": batch},
            "nonfinite_skips": self.guard.skips,
            "metrics_lines": self.run.metrics.n_rows(),
            "train_data": self.data_fingerprint,
            "time_s": round(time.time() - self.t0, 2),
            "best": self.run.best_record(),
        }
        save_checkpoint(
            self.run.out_dir,
            self.prog.global_step,
            lm=self.lm,
            optimizer=self.opt,
            keep_last=self.cfg.sft.keep_last,
            state=state,
            fsdp_state=fsdp_state,
        )


EVAL_ARGS = ("lm", "records", "settings")  # how train_sft calls its evaluate_fn


def train_sft(
    lm: LatentLM,
    train: list[Record],
    cfg: Config,
    out_dir: Path,
    *,
    valid: list[Record] | None = None,
    evaluate_fn: Callable[[LatentLM, list[Record], LatentSettings], int | EvalResult] | None = None,
    log: Callable[[str], None] = say,
    dist: Dist | None = None,
    resume: bool | str = "auto",
    allow_config_change: bool = False,
    progress: bool = True,
    final_eval: FinalEval | None = None,
) -> LatentLM:
    """Run the curriculum; write ``metrics.jsonl``, ``stage-K/`` checkpoints and ``final/`` under ``out_dir``.

    ``evaluate_fn(lm, records, settings)`` returns how many of ``records`` are correct, or their :class:`EvalResult`
    (whose ``mean_score`` is logged too, and can keep ``best/``: ``sft.best_metric``); it is called on ``valid`` at the
    end of each stage (by default greedy answers under ``eval.*``, with the stage's latent steps:
    :func:`default_evaluate_fn`). ``dist`` shards batches and the eval across processes; every rank calls this,
    only rank 0 writes files. ``resume``: ``auto`` (True), ``never`` (False) or a checkpoint path (see
    :class:`RunDir`). ``final_eval``: see :meth:`RunDir.final_eval` (``dgrpo sft``: the test sets)."""
    cfg, dist, evaluate_fn = _prepare(lm, train, cfg, out_dir, valid, evaluate_fn, dist)
    s = cfg.sft
    with RunDir(out_dir, cfg, dist, "sft", resume=resume, allow_config_change=allow_config_change, log=log) as run:
        sft = SFTRun(lm, cfg, dist, run, train)
        plan, prog = sft.plan, sft.prog
        t0 = sft.t0  # (time_s goes on from a resumed run's)
        start_epoch, start_batch = prog.epoch, prog.batch
        best = _resumed_best(run, dist, sft.best_rows_from, s.best_metric) if s.eval_every_epoch else -1.0
        n_steps, shown = s.num_epochs * plan.steps_per_epoch, dist.is_main and progress
        bar = tqdm(total=n_steps, initial=prog.global_step, desc="sft", disable=bar_disabled(shown))
        with bar:  # (closed on an error too, before the error's line is printed: that line starts a line of its own)
            for epoch in range(start_epoch, s.num_epochs):
                stage, first_batch = plan.stage(epoch), start_batch if epoch == start_epoch else 0
                if first_batch < plan.steps_per_epoch:  # (else resumed at the epoch's end, which is still to do)
                    sft.enter_stage(stage)
                lm.train()
                sft.train_epoch(train, epoch, stage, first_batch, bar, t0)
                with _epoch_kept_on_failure(sft, epoch):
                    step, scores = prog.global_step, None
                    if plan.last_of_stage(epoch):
                        scores = _finish_stage(lm, stage, cfg, run, dist, valid, evaluate_fn, step, t0)
                    elif s.eval_every_epoch:
                        scores = _validate_epoch(lm, stage, epoch, cfg, run, dist, valid, evaluate_fn, step, t0)
                if s.eval_every_epoch and layout_stage(stage, cfg) == layout_stage(plan.stage(s.num_epochs - 1), cfg):
                    best = _keep_if_best(lm, stage, epoch, scores, best, cfg, run, dist, prog.global_step)
                sft.save(epoch + 1, 0)
                if stop_requested(dist):  # (asked during the epoch's end)
                    sft.stop_after_step(None)
        sft.finish(t0, final_eval)
    if cfg.model.lora.r == 0 or cfg.model.lora.train_latent_tokens:  # (the markers' rows trained: GRPO need not warn)
        lm.new_latent_tokens = []
    return lm


@contextmanager
def _epoch_kept_on_failure(sft: SFTRun, epoch: int) -> Iterator[None]:
    """An error in an epoch's end before it wrote anything (a scorer of one's own failing on the model's answers in
    the validation) keeps the epoch's training: a checkpoint that resumes at the epoch's end, written before the
    error is raised (the epoch's resumable checkpoint came after its end: the epoch was trained again). Rank 0 writes
    it (in one process, or under DDP, where it needs no other rank); not under FSDP, whose checkpoint needs every
    rank. A checkpoint that cannot be written is said in a line; the error raised is the epoch end's own."""
    rows = sft.run.metrics.n_rows()
    try:
        yield
    except Exception:
        if not sft.dist.fsdp and sft.dist.is_main and sft.run.metrics.n_rows() == rows:
            try:
                sft.save(epoch, sft.plan.steps_per_epoch)
            except Exception as e:  # noqa: BLE001 - the epoch end's error is the one to raise
                sft.run.log(f"dgrpo sft: epoch {epoch}'s training could not be kept ({one_line(e)})")
            else:
                again = "command" if in_command_line() else "call (resume='auto')"
                sft.run.log(
                    f"dgrpo sft: epoch {epoch}'s training is kept in {sft.run.out_dir / CHECKPOINTS_DIR}: the same "
                    f"{again} resumes at the epoch's end (its validation)"
                )
        raise


def _prepare(
    lm: LatentLM,
    train: list[Record],
    cfg: Config,
    out_dir: Path,
    valid: list[Record] | None,
    evaluate_fn: Callable | None,
    dist: Dist | None,
) -> tuple[Config, Dist, Callable | None]:
    """Check what train_sft was given (before the run directory is touched) and set the model up for it; the config
    as the run records it (:func:`recorded_model`), the processes and the validation's evaluate_fn (the default with
    valid records and none given)."""
    check_run_inputs(
        lm,
        cfg,
        train,
        "train_sft",
        valid,
        list,
        out_dir=out_dir,
        evaluate_fn=evaluate_fn,
        eval_args=EVAL_ARGS,
        stacklevel=4,  # (_prepare's caller's caller)
    )
    cfg = recorded_model(cfg, lm, out_dir, stacklevel=4)  # (a model loaded in Python: named as --init is)
    default_validation = evaluate_fn is None
    evaluate_fn = evaluate_fn or (default_evaluate_fn(cfg, valid, per_stage=True) if valid else None)  # (scorer now)
    lora_for_training(lm, cfg.model.lora)
    dist = Dist.given_or_single(dist, cfg.fsdp, "train_sft", stacklevel=4)  # (_prepare's caller's caller)
    if (b := cfg.sft.batch_size) < dist.world_size:
        raise ConfigError(
            f"sft.batch_size: {b} example{'s' * (b != 1)} cannot be shared by {dist.world_size} processes"
        )
    if len(train) < dist.world_size:  # (a rank without an example would have no targets to train on)
        n = len(train)
        raise ConfigError(
            f"the training data's {n} example{'s' * (n != 1)} cannot be shared by {dist.world_size} processes"
        )
    if len(train) < cfg.sft.batch_size:
        warnings.warn(
            f"sft.batch_size {cfg.sft.batch_size} is more than the training data's {len(train)} examples: each epoch "
            f"is one optimizer step on all {len(train)}",
            stacklevel=3,
        )
    _warn_at_start(train, valid, cfg)
    lm.run_config = to_dict(cfg)  # stage-K/ and final/ carry the config (and the task) that produced them
    lm.settings.chat_template = cfg.data.chat_template  # how questions are prompted, from the first step on
    lm.format_question(train[0].question)  # a chat template the tokenizer lacks fails here, before files are written
    warn_if_training_questions_cut(lm, cfg, train)
    _warn_if_targets_cut(lm, train, cfg)
    check_last_stage_fits(lm, cfg)
    check_examples_fit(lm, cfg, train)
    if valid and default_validation and (cfg.sft.eval_each_stage or cfg.sft.eval_every_epoch):
        check_validation_fits(lm, valid, cfg)
    return cfg, dist, evaluate_fn


def check_last_stage_fits(lm: LatentLM, cfg: Config) -> None:
    """The last stage's latent thoughts alone must fit the context (each batch checks its own questions and targets
    too): at the run's start, and by ``dgrpo sft`` before the weights load."""
    lm.check_fits(2, final_settings(cfg).n_latent, 1, key="sft.c_thought", target_key="data.max_target_tokens")


def check_examples_fit(lm: LatentLM, cfg: Config, train: list[Record], what: str = "the training data") -> None:
    """The widest question of ``train`` (cut to ``data.max_question_tokens``) with the most latent thoughts and the
    longest target a record has at a stage the run trains (:func:`trained_layouts`; its steps still written, the
    answer line and EOS, cut to ``data.max_target_tokens``) must fit the context: a batch may hold both. Each batch
    checked only its own (:func:`sft_loss`), which failed at the batch that held a record too long, hours in: checked
    at the trainer's start, and by ``dgrpo sft`` before the weights load (once, within
    :func:`~.run_inputs.checked_once`). The ConfigError names ``what`` ``train`` is, the records and the stage."""
    limit, max_q, max_t = lm.context_length, cfg.data.max_question_tokens, cfg.data.max_target_tokens
    stages = trained_layouts(cfg)
    most = max(latent_layout(stage, 10**6, cfg)[1] for stage in stages) + 1 + max_t  # (thoughts, marker, target)
    if not train or limit is None or (max_q and not lm.settings.chat_template and max_q + 2 + most <= limit):
        return  # (BOS, the question, <|start-latent|>; then the rest: it all fits whatever the data)
    q_at, width = widest_prompt(lm, train, max_q)
    if width + most <= limit:  # (every target cut to data.max_target_tokens still fits: not tokenized)
        return
    stage, t_at, n_latent, target = _longest_example(lm, cfg, train, list(stages))
    try:
        data_key = "task.n_steps" if cfg.data.train.startswith("builtin") else ""
        lm.check_fits(width, n_latent, target, "sft.c_thought", target_key="data.max_target_tokens", data_key=data_key)
    except ConfigError as e:
        which = f"record {q_at}" if q_at == t_at else f"record {q_at}'s question with record {t_at}'s target"
        unlimited = (
            "; data.max_question_tokens is 0 (no limit): set it to cut each question to its last tokens"
            if not max_q
            else ""
        )
        raise ConfigError(f"{what}: {which} (counting from 0) at stage {stages[stage]}: {e}{unlimited}") from None


def trained_layouts(cfg: Config) -> dict[int, int]:
    """The latent layouts (:func:`~.curriculum.layout_stage`) the run trains examples at, each with the first stage
    that trains it (the stage a refusal names: a no_curriculum run of 8 epochs trains stage 3 alone, at the layout of
    stage 2, a stage it never trains), in layout order: each epoch's stage's, and under ``sft.uniform_prob`` (a record
    drawn at a random stage) every one."""
    s = cfg.sft
    named: dict[int, int] = {}
    for epoch in range(s.num_epochs):
        stage = stage_of_epoch(epoch, cfg)
        named.setdefault(layout_stage(stage, cfg), stage)
    if s.uniform_prob > 0 and s.mode in ("coconut", "pause", "no_curriculum"):
        for stage in range(s.max_latent_stage + 2):  # (layout k is stage k's here)
            named[stage] = min(named.get(stage, stage), stage)
    return dict(sorted(named.items()))


def _longest_example(lm: LatentLM, cfg: Config, train: list[Record], stages: list[int]) -> tuple[int, int, int, int]:
    """(stage, record, latent thoughts, target tokens) of the first example of ``train`` whose latent thoughts and
    target (:func:`~.curriculum.make_example`, cut to ``data.max_target_tokens`` as :func:`sft_loss` encodes it) are
    the longest, at ``stages``. Within :func:`~.run_inputs.checked_once`, found once for the same data."""
    s = cfg.sft
    tokenizer = (getattr(lm.tokenizer, "name_or_path", ""), len(lm.tokenizer))
    layout = (s.mode, s.c_thought, s.max_latent_stage, s.pad_latent_to_max)
    key = ("sft longest", id(train), len(train), tuple(stages), layout, cfg.data.max_target_tokens, tokenizer)
    return found_once(key, train, lambda: _find_longest_example(lm, cfg, train, stages))


def _find_longest_example(
    lm: LatentLM, cfg: Config, train: list[Record], stages: list[int]
) -> tuple[int, int, int, int]:
    """:func:`_longest_example`'s search: each stage's distinct targets tokenized once."""
    max_t, longest = cfg.data.max_target_tokens, (-1, 0, 0, 0, 0)  # (length, stage, record, thoughts, target)
    for stage in stages:
        layouts = [latent_layout(stage, len(r.steps), cfg) for r in train]
        targets = [format_target(r.steps[skip:], r.answer) for r, (skip, _) in zip(train, layouts)]
        distinct = list(dict.fromkeys(targets))
        widths = {t: min(len(ids) + 1, max_t) for t, ids in zip(distinct, lm.token_ids(distinct))}  # (EOS)
        for i, (target, (_, n_latent)) in enumerate(zip(targets, layouts)):
            if n_latent + widths[target] > longest[0]:
                longest = (n_latent + widths[target], stage, i, n_latent, widths[target])
    return longest[1:]


def check_validation_fits(lm: LatentLM, valid: list[Record], cfg: Config) -> None:
    """The default validation answers with each stage's latent thoughts (not eval.n_latent) and eval.max_new_tokens
    tokens: its longest question with the last stage's thoughts must fit the context, checked before training (a
    whole stage trained, then its validation failed, naming eval.n_latent, which SFT's validation does not read)."""
    check_fits_context(
        lm,
        [r.question for r in valid],
        final_settings(cfg).n_latent,
        cfg.eval.max_new_tokens,
        max_question_tokens=cfg.data.max_question_tokens,
        key="sft.c_thought",
        answer_key="eval.max_new_tokens",
    )


def _warn_at_start(train: list[Record], valid: list[Record] | None, cfg: Config) -> None:
    """An SFT run's warnings about its data and schedule, before any work (train_sft -> _prepare -> here)."""
    no_best = (
        "sft.eval_every_epoch is set but there is no validation set (data.valid): no epoch is validated and no "
        "best/ is kept (final/ is the run's model)"
        if cfg.sft.eval_every_epoch and not valid
        else ""
    )
    unmixed = (
        f"sft.uniform_prob = {cfg.sft.uniform_prob} is unused under sft.mode={cfg.sft.mode} (it trains examples at a "
        "random stage of a curriculum: coconut, pause or no_curriculum)"
        if cfg.sft.uniform_prob > 0 and cfg.sft.mode in ("cot", "no_cot")
        else ""
    )
    unreset = (
        f"sft.reset_every={cfg.sft.reset_every} changes nothing with sft.reset_optimizer=false (it says when the "
        "optimizer and the lr schedule start afresh; without resets there is one of each for the run)"
        if not cfg.sft.reset_optimizer and cfg.sft.reset_every == "epoch"
        else ""
    )
    for line in (
        _no_steps_line(train, cfg),
        _warmup_line(len(train), cfg),
        no_best,
        unmixed,
        unreset,
        *unused_recompute_settings(cfg.sft, "sft"),
        *unused_sft_settings(cfg.sft),
        *unused_model_settings(cfg.model),
        *cfg.inert_eval_settings(),
    ):
        if line:
            warnings.warn(line, stacklevel=4)


def _warn_if_targets_cut(lm: LatentLM, train: list[Record], cfg: Config, check_at_most: int = 1000) -> None:
    """Warn when written targets of the run's first stage (the longest it trains: later stages replace steps) are
    longer than ``data.max_target_tokens`` with their EOS: each is cut to its first tokens, its answer line and EOS
    never trained (the questions' cut was warned of, the targets' was silent). ``check_at_most`` of them, evenly
    spaced (a training set of 385,000 takes a minute to tokenize)."""
    limit, stage = cfg.data.max_target_tokens, (0 if cfg.sft.uniform_prob > 0 else stage_of_epoch(0, cfg))
    checked = train[:: -(-len(train) // check_at_most)] if len(train) > check_at_most else train
    targets = [format_target(r.steps[latent_layout(stage, len(r.steps), cfg)[0] :], r.answer) for r in checked]
    cut = sum(len(ids) + 1 > limit for ids in lm.token_ids(targets))
    if cut:
        sample = f" (checked: {len(checked)}, evenly spaced over {len(train)})" if checked is not train else ""
        warnings.warn(
            f"{cut} of {len(checked)} training targets{sample} (the steps still written at stage {stage}, the answer "
            f"line and EOS) are longer than data.max_target_tokens = {limit} tokens: each is trained on its first "
            f"{limit} only, without its end (its answer line, or at least its EOS); raise data.max_target_tokens",
            stacklevel=4,
        )


def _no_steps_line(train: list[Record], cfg: Config) -> str:
    """Training data without reasoning steps (a column mapping without ``data.steps_key``) under a mode that trains
    them, written (cot) or replaced (coconut, no_curriculum, pause): what that mode then does; '' otherwise."""
    mode, key = cfg.sft.mode, cfg.data.steps_key
    if mode == "no_cot" or any(rec.steps for rec in train):
        return ""
    if mode == "cot":
        does = "has no written steps to train, so it trains the answer alone, as sft.mode=no_cot does"
    else:
        n_latent = final_settings(cfg).n_latent
        does = (
            f"has no steps to replace by {'pause tokens' if mode == 'pause' else 'latent thoughts'}, so its curriculum "
            f"teaches no reasoning (the checkpoint still records n_latent={n_latent})"
        )
    fix = f"data.steps_key={key} gives none" if key else "map the column that holds them with data.steps_key"
    column = cfg.data.answer_key
    if not key and column and any(_reasoned(rec, column) for rec in train):  # (its lines were no steps: <<...>> are)
        fix = f"data.steps_key={column} takes the lines before '####' of its GSM8K-style solutions as steps"
    alone = "" if mode == "cot" else ", or train the answer alone with sft.mode=no_cot"
    return (
        f"none of the {len(train)} training records has reasoning steps: sft.mode={mode} {does}; {fix} (a list of "
        f"strings, or one string split on newlines){alone}"
    )


def _reasoned(rec: Record, column: str) -> bool:
    """Whether a record's answer column (``data.answer_key``; ``solution`` for a column the record keeps as its own
    field) is a GSM8K-style solution with text before its ``####``."""
    text = rec.meta.get(column, rec.meta.get("solution"))
    return isinstance(text, str) and "####" in text and bool(text.rpartition("####")[0].strip())


def _warmup_line(n_train: int, cfg: Config) -> str:
    """``sft.warmup_steps`` not below the optimizer steps of an lr schedule (the run's, or with ``reset_optimizer``
    the shortest stage's or an epoch's): its learning rate never passes the warmup; '' otherwise."""
    s = cfg.sft
    plan = Curriculum(cfg, epoch_steps(n_train, cfg))
    stages = plan.epochs_by_stage
    shortest = min(plan.schedule_length(stage) for stage in stages)
    if s.warmup_steps < shortest:
        return ""
    which = "the run's lr schedule"
    if s.reset_optimizer and s.reset_every == "epoch":  # (a schedule restarts at each reset)
        which = "an epoch's lr schedule"
    elif s.reset_optimizer and len(stages) > 1:
        which = "the shortest stage's lr schedule"
    how = (
        f"never reaches sft.lr={s.lr:g} there (it peaks at {s.lr * shortest / s.warmup_steps:.3g})"
        if s.warmup_steps > shortest
        else f"reaches sft.lr={s.lr:g} at its last step only"
    )
    return (
        f"sft.warmup_steps={s.warmup_steps} is not below the {shortest} optimizer step{'s' * (shortest != 1)} of "
        f"{which} ({n_train} examples: {plan.steps_per_epoch} batch{'es' * (plan.steps_per_epoch != 1)} of "
        f"sft.batch_size={s.batch_size} per epoch): the learning rate {how}; lower sft.warmup_steps"
    )


def _time_trained(run: RunDir) -> float:
    """The training time the run's metrics rows record so far (the last row's ``time_s``; 0 for a fresh run)."""
    return next((float(r["time_s"]) for r in reversed(run.metrics.rows()) if "time_s" in r), 0.0)


def _finish_stage(
    lm: LatentLM,
    stage: int,
    cfg: Config,
    run: RunDir,
    dist: Dist,
    valid: list[Record] | None,
    evaluate_fn: Callable[[LatentLM, list[Record], LatentSettings], int | EvalResult] | None,
    step: int,
    t0: float,
) -> dict[str, float] | None:
    """The end of a curriculum stage: the stage's latent settings, its validation accuracy and mean score (a metrics
    row; returned, None when not measured: :func:`_valid_scores`), ``stage-K/``. The row's ``time_s`` is taken after
    the validation, as an epoch's row's is (it was the last training row's, the validation's time left out)."""
    settings = stage_settings(stage, cfg)
    lm.settings = settings
    row: dict = {"step": step, "stage": stage, "n_latent": settings.n_latent}
    scores = None
    if (cfg.sft.eval_each_stage or cfg.sft.eval_every_epoch) and valid and evaluate_fn is not None:
        scores = _valid_scores(lm, settings, cfg, dist, valid, evaluate_fn)
    row["time_s"] = round(time.time() - t0, 2)
    row.update({f"eval/valid/{k}": v for k, v in (scores or {}).items()})
    dist.save_model(lm, stage_dir(run.out_dir, stage))  # every rank calls it (FSDP gathers); rank 0 writes
    run.metrics.write(row)
    run.log(f"stage {stage} done: " + ", ".join(f"{k}={v}" for k, v in row.items()))
    return scores


def _valid_scores(
    lm: LatentLM, settings: LatentSettings, cfg: Config, dist: Dist, valid: list[Record], evaluate_fn: Callable
) -> dict[str, float]:
    """Greedy accuracy on ``valid`` (and mean score, when ``evaluate_fn`` gives it: :func:`sharded_scores`) with a
    stage's latent ``settings`` (sharded over the ranks), given to the model first: the default validation answers
    in ``lm.settings``' mode and markers (before a stage's end set them, an epoch of ``sft.eval_every_epoch`` was
    answered as the loaded model had been trained: a pause curriculum with continuous thoughts, one from a CoT
    checkpoint with no latent thoughts). An ``sft.best_metric`` the scores lack is refused here, at the first
    validation of a run that keeps ``best/`` (:func:`best_value`), before its row is written."""
    lm.settings = settings
    lm.eval()
    scores = sharded_scores(dist, lambda local: evaluate_fn(lm, local, settings), valid)
    if cfg.sft.eval_every_epoch:
        best_value(scores, cfg.sft.best_metric, "sft.best_metric")
    lm.train()
    return scores


def _validate_epoch(
    lm: LatentLM,
    stage: int,
    epoch: int,
    cfg: Config,
    run: RunDir,
    dist: Dist,
    valid: list[Record] | None,
    evaluate_fn: Callable | None,
    step: int,
    t0: float,
) -> dict[str, float] | None:
    """``sft.eval_every_epoch`` within a stage: the epoch's validation accuracy and mean score at its stage's latent
    settings (a metrics row; returned, None without a validation set)."""
    if not valid or evaluate_fn is None:
        return None
    settings = stage_settings(stage, cfg)
    scores = _valid_scores(lm, settings, cfg, dist, valid, evaluate_fn)
    row = {"step": step, "stage": stage, "epoch": epoch, "n_latent": settings.n_latent}
    run.metrics.write(
        {**row, "time_s": round(time.time() - t0, 2), **{f"eval/valid/{k}": v for k, v in scores.items()}}
    )
    return scores


def last_best_row(rows: Iterable[dict]) -> dict | None:
    """The last ``best_epoch`` metrics row of an SFT run under ``sft.eval_every_epoch`` (the epoch ``best/`` holds
    and its validation accuracy and mean score); None when the run kept none."""
    kept = [r for r in rows if "best_epoch" in r]
    return kept[-1] if kept else None


def _resumed_best(run: RunDir, dist: Dist, rows_from: int, metric: str = "accuracy") -> float:
    """The validation ``metric`` (``sft.best_metric``) of the run's ``best/`` so far (its ``best_epoch`` metrics rows
    from ``rows_from`` on; -1 for none, when ``best/`` is not in this run directory, or when its row lacks the metric:
    a best/ kept by a count, or by dgrpo before mean scores, is replaced at the next epoch that may keep one), the
    same on every rank (rank 0 reads the rows)."""
    kept = last_best_row(run.metrics.rows()[rows_from:]) if (run.out_dir / BEST_DIR).is_dir() else None
    return dist.max_float(float(kept.get(f"best/valid/{metric}", -1.0)) if kept else -1.0)


def _keep_if_best(
    lm: LatentLM,
    stage: int,
    epoch: int,
    scores: dict[str, float] | None,
    best: float,
    cfg: Config,
    run: RunDir,
    dist: Dist,
    step: int,
) -> float:
    """``best/``: of the epochs that train the final latent layout (the last stage, and every stage past
    ``max_latent_stage`` with it), the one of the highest validation ``sft.best_metric`` so far (accuracy by default;
    the earlier one on a tie), as Coconut's checkpoint is chosen; returns the best value so far. Every rank decides
    alike (the scores are reduced over the ranks) and calls the save (FSDP gathers); rank 0 writes."""
    if scores is None:
        return best
    metric = cfg.sft.best_metric
    value = best_value(scores, metric, "sft.best_metric")
    if value <= best:
        return best
    lm.settings = stage_settings(stage, cfg)
    dist.save_model(lm, run.out_dir / BEST_DIR)
    run.metrics.write({"step": step, "best_epoch": epoch, **{f"best/valid/{k}": v for k, v in scores.items()}})
    how = f"validation {metric} {value:.4f}" + (f", accuracy {scores['accuracy']:.4f}" if metric != "accuracy" else "")
    run.log(f"sft: best/ is epoch {epoch} ({how})")
    return value
