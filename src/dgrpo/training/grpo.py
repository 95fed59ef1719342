"""Dropout-GRPO (Algorithm 1 of the paper): rollouts under replayable perturbations, update by mask replay.

One step, linearly (:meth:`GRPOTrainer.step`):
  1. rollouts   K perturbed rollouts per prompt (fresh seeds), T latent steps, answer, verifier reward;
  2. filter     drop groups with accuracy outside [alpha_min, alpha_max]; agree across ranks; maybe skip;
  3. advantage  A = r - mean(r) per group (Dr. GRPO) or an ablation;
  4. update     for E mini-epochs, per micro-batch: replay each rollout's perturbation from its seed,
                recompute log pi(y | x, xi) through the whole latent recurrence with gradient, and take
                :func:`~dgrpo.training.losses.grpo_objective` (clipped surrogate + beta(t) * Huberized k3),
                normalised by global counts; one optimizer step.
The ablations (deterministic GRPO, REINFORCE + EMA baseline, token sampling without dropout, new masks
at update time, the shuffled-reward null control) are the same loop with different config values.
:func:`train_grpo` is the run around it.
"""

from __future__ import annotations

import json
import math
import os
import random
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass, replace
from functools import cached_property, partial
from pathlib import Path
from typing import Any, cast

import torch
from torch import Tensor
from tqdm.auto import tqdm

from ..config import Config, ConfigError, GRPOConfig, to_dict
from ..data.records import Record, check_records, data_columns, fingerprint, fingerprint_count
from ..eval.evaluate import EvalResult
from ..eval.scoring import (
    RewardError,
    RewardPart,
    Rewards,
    RewardSetupError,
    ScoreFn,
    build_rewards,
    final_answer_text,
)
from ..model.factory import apply_speedups, lora_for_training
from ..model.latent_lm import LatentLM
from ..model.static_cache import static_cache_obstacle
from ..perturbation import Perturbation, make_perturbation, seeds_for
from ..perturbation.base import to_device
from ..progress import bar_disabled, say
from ..reward import extract_answer, normalize_text
from ..run_layout import BEST_DIR, CHECKPOINTS_DIR, FINAL_DIR, SUMMARY_FILE, step_dir_name
from .applied import applied_settings
from .checkpoint import StateSection, counts, python_random_state, read_checkpoint, save_checkpoint, shard_staging
from .distributed import Dist
from .guards import NonFiniteError, NonFiniteGuard, StalledError, clip_gradients, weights_finite
from .losses import (
    GlobalCounts,
    ObjectiveSettings,
    ObjectiveStats,
    ema_advantages,
    ema_update,
    group_advantages,
    group_filter,
    grpo_objective,
    shuffle_within_groups,
)
from .master_weights import adamw, warn_if_updates_round_away
from .memory import oom_advice
from .model_record import recorded_model
from .preemption import stop_requested, within_step
from .ref_policy import make_reference
from .resume_check import recorded_changes, shortened_error
from .rollouts import Rollouts, collect_rollouts, replay_logprobs, resolve_engine, resolve_latent_chain
from .run import FinalEval, RunDir
from .run_inputs import (
    check_restart,
    check_run_inputs,
    check_trainer_inputs,
    default_evaluate_fn,
    found_at_start,
    warn_if_training_questions_cut,
    widest_prompt,
)
from .schedules import beta_at, lr_at
from .sharded_eval import best_value, sharded_scores
from .wording import in_command_line, setting_named, settings_named


def _check_shares_and_thoughts(lm: LatentLM, g: GRPOConfig, dist: Dist) -> None:
    """ConfigError when the ranks cannot each hold a group, or latent thoughts are asked of a model without them."""
    if (n := g.prompts_per_step) < dist.world_size:
        raise ConfigError(
            f"grpo.prompts_per_step: {n} prompt{'s' * (n != 1)} cannot be shared by {dist.world_size} "
            "processes (every rank needs at least one group)"
        )
    if g.n_latent > 0 and lm.settings.mode in ("cot", "no_cot"):
        raise ConfigError(
            f"grpo.n_latent={g.n_latent}: the checkpoint was trained with sft.mode={lm.settings.mode}, which has "
            "no latent thoughts (use grpo.n_latent=-1 or 0, or a coconut / pause checkpoint)"
        )


def _perturbation(lm: LatentLM, cfg: Config) -> Perturbation:
    """The config's perturbation, checked against the model (its sites and layers exist: one line now, not a
    traceback at the first rollout) and the compiled layers (which need one held in tensors: native dropout is
    refused by name in the config, a kind of one's own of one rollout at a time here)."""
    perturbation = make_perturbation(cfg.perturbation)
    perturbation.check(lm)
    if cfg.model.compile and not perturbation.batched:
        raise ConfigError(
            f"model.compile: the compiled layers need a perturbation held in tensors for the batch; "
            f"perturbation.kind={cfg.perturbation.kind} runs one rollout at a time: set model.compile=false"
        )
    return perturbation


def _check_rollout_cache(perturbation: Perturbation, cfg: Config, engine: str) -> None:
    """ConfigError for eager rollouts over a static KV cache under a perturbation of one rollout at a time (native
    dropout): its noise is drawn in the shape of each forward's attention, which the static cache widens to its
    preallocated length, so that the update (over a growing cache) replayed other masks than the rollouts drew
    (their log-probs 5e-2 apart in fp32 on a tiny model: a ratio off 1 at theta_old, answers scored under noise that
    did not make them)."""
    if engine == "eager" and cfg.grpo.rollout_cache == "static" and not perturbation.batched:
        raise ConfigError(
            f"grpo.rollout_cache=static: perturbation.kind={cfg.perturbation.kind} runs one rollout at a time and "
            "draws its noise in the shape of each forward, which a static cache changes: the update could not replay "
            "the rollouts' noise; set grpo.rollout_cache=dynamic"
        )


def _sft_first() -> str:
    """How to train a plain LM's latent markers before GRPO, in the caller's words."""
    if in_command_line():
        return "dgrpo sft --init MODEL, then dgrpo grpo --init that run"
    return "train_sft on the model, then GRPO from LatentLM.from_pretrained(that run's final/)"


def _warn_at_start(lm: LatentLM, cfg: Config, train: list[Record]) -> None:
    """A GRPO run's warnings before any work: settings that do nothing (:meth:`Config.inert_settings`), training
    questions cut to ``data.max_question_tokens``, and fewer training records than prompts in a step."""
    for line in cfg.inert_settings():
        warnings.warn(line, stacklevel=3)
    warn_if_training_questions_cut(lm, cfg, train)
    if lm.new_latent_tokens:
        warnings.warn(
            f"the model's latent markers ({', '.join(lm.new_latent_tokens)}) are new and untrained (the model had no "
            "rows for them: a plain LM, not a Coconut SFT checkpoint); GRPO prompts with them and thinks with "
            f"untrained latent steps (train them first: {_sft_first()})",
            stacklevel=3,
        )
    if len(train) < cfg.grpo.prompts_per_step:
        warnings.warn(
            f"grpo.prompts_per_step is {cfg.grpo.prompts_per_step}, more than the {len(train)} training records: "
            "every step holds some prompts twice or more, each time as a group of its own",
            stacklevel=3,
        )


def agree_on_kept(n_kept_local: int, n_tokens_local: int, dist: Dist, failed: bool = False) -> tuple[int, int, bool]:
    """The DDP-coordinated skip (paper Sec. 4.4): every rank learns the global number of kept rollouts
    and tokens through one all-reduce *before any backward*, so all ranks skip together (global 0) or
    all take part in the same collectives (a rank with nothing kept contributes a zero loss). The same all-reduce
    says whether a rank's reward failed (``failed``), so that every rank stops there, not in a later collective."""
    n_kept, n_tokens, n_failed = dist.sum_ints([n_kept_local, n_tokens_local, int(failed)])
    return n_kept, n_tokens, n_failed > 0


def build_optimizer(params: list, cfg: Config, device: torch.device) -> torch.optim.Optimizer:
    """AdamW (over float32 masters with ``model.master_weights``), or bitsandbytes' 8-bit AdamW on CUDA
    (``grpo.optimizer: adamw8bit``; elsewhere torch AdamW, warned)."""
    g, key = cfg.grpo, "grpo.optimizer"  # (key: the option a rounded-away warning names, for masters' adamw)
    betas = (g.adam_betas[0], g.adam_betas[1])
    if g.optimizer == "adamw8bit":
        if device.type == "cuda":
            try:
                import bitsandbytes as bnb

                warn_if_updates_round_away(params, g.lr, stacklevel=3, optimizer_key=key)  # (it updates bf16 weights)
                return bnb.optim.AdamW8bit(params, lr=g.lr, weight_decay=g.weight_decay, betas=betas)
            except ImportError:
                warnings.warn(
                    "grpo.optimizer=adamw8bit needs bitsandbytes (pip install bitsandbytes); using torch AdamW",
                    stacklevel=2,
                )
        else:
            warnings.warn("grpo.optimizer=adamw8bit runs on CUDA only; using torch AdamW on this device", stacklevel=2)
    return adamw(params, cfg.model.master_weights, optimizer_key=key, lr=g.lr, weight_decay=g.weight_decay, betas=betas)


@contextmanager
def without_per_parameter_syncs(opt: torch.optim.Optimizer) -> Iterator[None]:
    """bitsandbytes' 8-bit optimizers synchronise the device after every parameter's update (``sync_gpu``, there for
    paged states): 338 waits in a step of Qwen2.5-1.5B, each leaving the GPU idle until the host launches the next
    update. Unpaged states need none (every update runs in order on one stream), so for such an optimizer the block
    runs with that synchronisation off; the same updates, bit for bit."""
    module = sys.modules.get("bitsandbytes.optim.optimizer")
    base = getattr(module, "Optimizer8bit", None)
    if module is None or base is None or not isinstance(opt, base) or getattr(opt, "is_paged", True):
        yield
        return
    synchronise = getattr(module, "sync_gpu")  # noqa: B009 (a module mypy does not know)
    setattr(module, "sync_gpu", lambda t: None)  # noqa: B010
    try:
        yield
    finally:
        setattr(module, "sync_gpu", synchronise)  # noqa: B010


def _replayed_logprobs(lm: LatentLM, **kw: Any) -> Tensor:
    """:func:`replay_logprobs`' log-probs alone (for the reference model)."""
    return replay_logprobs(lm, **kw)[0]


_TRAINER_COUNTS = counts("step_idx", "nonfinite_skips", "nonfinite_streak")


def trainer_state_problem(section: dict[str, Any]) -> str | None:
    """What is wrong with the values of a checkpoint's ``trainer`` section (:meth:`GRPOTrainer.state`), its keys and
    types checked: a negative count; an ``order`` (the rest of the epoch's training rows) holding other than distinct
    indices of the rows it was trained on (their count: its ``train_data``), which a resume took as it was (a row
    trained twice in the epoch, a negative index a row from the end, a string a TypeError's traceback once the
    weights were applied); a ``data_rng`` that is no Python random state (a traceback from ``random.setstate``
    then, or a generator no run had). None when nothing is."""
    if problem := _TRAINER_COUNTS(section):
        return problem
    order, rows = section["order"], fingerprint_count(section.get("train_data"))
    seen: set[int] = set()
    for i in order:
        if type(i) is not int or i < 0 or (rows is not None and i >= rows):
            within = f" of the {rows} it was trained on" if rows is not None else ""
            return f"order holds {json.dumps(i)[:20]}, not the index of a training row{within}"
        if i in seen:
            return f"order holds {i} twice (each training row comes once in an epoch)"
        seen.add(i)
    try:
        python_random_state(section["data_rng"])
    except ValueError as e:
        return f"data_rng {e}"
    return None


class GRPOTrainer:
    """State of a Dropout-GRPO run; :meth:`step` is one iteration of Algorithm 1."""

    def __init__(
        self,
        lm: LatentLM,
        cfg: Config,
        train: list[Record],
        *,
        dist: Dist | None = None,
        reward_fn: ScoreFn | Sequence[ScoreFn] | Rewards | None = None,
    ):
        """``reward_fn``: the reward (batched ``(completions, records) -> list[float]``, or one written for TRL), a
        list of them (summed, each logged under its ``__name__``, as TRL's ``reward_funcs``), or a :class:`Rewards`
        (parts with weights); default: what ``grpo.reward`` / ``grpo.rewards`` name, else ``eval.scorer``."""
        check_trainer_inputs(lm, cfg, train, "GRPOTrainer")
        self.lm, self.cfg, self.train_data = lm, cfg, train
        self.started_in = os.getcwd()  # (applied.json's started_in: a relative data.test names a file from here)
        self.dist = Dist.given_or_single(dist, cfg.fsdp, "GRPOTrainer")
        g = cfg.grpo
        lm.use_recompute(g, "grpo")
        _check_shares_and_thoughts(lm, g, self.dist)
        self.n_latent = lm.settings.n_latent if g.n_latent < 0 else g.n_latent
        # the policy as it is trained (T thoughts, after the markers) is how it is validated, tested and saved
        lm.settings.n_latent, lm.settings.markers = self.n_latent, True
        check_rollouts_fit(lm, self.n_latent, cfg, train)
        self.perturbation = _perturbation(lm, cfg)
        static_obstacle = static_cache_obstacle(lm.model.config)
        self.engine = resolve_engine(g.engine, lm.device, self.perturbation.batched, static_obstacle)
        if static_obstacle and (self.engine == "fast" or g.rollout_cache == "static"):
            raise ConfigError(f"grpo.engine=fast / grpo.rollout_cache=static need a static KV cache: {static_obstacle}")
        _check_rollout_cache(self.perturbation, cfg, self.engine)
        # the fast engine's decoders kept from step to step (not under FSDP: it gathers the weights for each forward)
        self.keep_graphs = g.keep_graphs and self.engine == "fast" and not self.dist.fsdp
        self.chain_latents = resolve_latent_chain(lm, cfg, self.engine, self.dist.active)
        self.kernels = apply_speedups(lm, cfg.model)  # (before the reference copy, which then has them too)
        self.objective = ObjectiveSettings.from_config(g)
        _warn_at_start(lm, cfg, train)
        self.rewards = checked_rewards(reward_fn, cfg, train)
        # rank 0's weights everywhere, before the reference copies them (it kept each rank's own initial weights)
        self.dist.broadcast_weights(lm.model)
        # the KL reference: a frozen copy of the model, or under LoRA a frozen adapter (before the optimizer)
        self.ref = make_reference(lm, self.dist) if g.beta0 > 0 else None
        self.opt_params = self.dist.prepare_model(lm.model)  # FSDP2 shards here
        self.opt = build_optimizer(self.opt_params, cfg, lm.device)
        self.ema_baseline = 0.5
        self.step_idx = 0
        self.row0 = 0  # global index of this rank's first rollout row in the current step
        # rank-independent: every rank draws the same global prompt list and keeps its shard
        self.data_rng = random.Random(cfg.seed * 1000003)
        self.order: list[int] = []
        self.guard = NonFiniteGuard(g.max_nonfinite, "GRPO", "grpo.lr")
        self._replay_warned = False  # (warned once: the replay did not give the rollouts' log-probs back)
        # what the model's checkpoints record (run_config.json: dgrpo eval reads its scorer, data keys and dtype), here
        # so that a loop of step() calls saves this config too, not the --init checkpoint's
        lm.run_config = to_dict(cfg)

    def applied(self) -> dict[str, Any]:
        """What this trainer runs with, as resolved (:func:`~dgrpo.training.applied.applied_settings`): besides the
        optimizer, kernels, dtype and compiled parts, ``grpo.engine``, ``grpo.keep_graphs`` and
        ``grpo.update_latent_graphs`` as resolved, and the folder the trainer was made in (``started_in``)."""
        return applied_settings(
            self.lm,
            self.dist,
            self.opt,
            kernels=self.kernels,
            started_in=self.started_in,
            engine=self.engine,
            keep_graphs=self.keep_graphs,
            update_latent_graphs=self.chain_latents,
            plugins=[
                self.cfg.grpo.reward,
                *(r["fn"] for r in self.cfg.grpo.rewards),
                self.cfg.eval.scorer,
                self.cfg.perturbation.kind,  # (a kind of one's own: path/to/file.py:Class)
            ],
        )

    # -------------------------------------------------------------------- resumable state
    def state(self) -> dict:
        """Everything besides weights and optimizer that determines the next steps (JSON-able). The rollouts'
        perturbations and sampled tokens come from seeds of (run seed, step, row): no generator state. Not the KL
        reference (a copy of the weights when the trainer was built, or at its last renewal): build the trainer on
        the run's initial weights, then load the policy's weights, the optimizer and this state (as train_grpo's
        checkpoints do, with ``ref.checkpoint_state``)."""
        v, st, gauss = self.data_rng.getstate()
        js = {
            "step_idx": self.step_idx,
            "ema_baseline": self.ema_baseline,
            "order": list(self.order),
            "data_rng": [v, list(st), gauss],
            "nonfinite_skips": self.guard.skips,
            "nonfinite_streak": self.guard.streak,
            "train_data": self.data_fingerprint,
            "reward": self.rewards.identity(),
        }
        return js

    #: what :meth:`state` writes, as a resume checks it before anything is applied: :meth:`load_state` reads the
    #: required keys (older checkpoints record neither the data's fingerprint nor the reward), and their values
    #: (:func:`trainer_state_problem`)
    STATE = StateSection(
        {k: (int,) for k in ("step_idx", "nonfinite_skips", "nonfinite_streak")}
        | {"ema_baseline": (int, float), "order": (list,), "data_rng": (list,)},
        {"train_data": (str,), "reward": (list,)},
        contents=trainer_state_problem,
    )

    @cached_property
    def data_fingerprint(self) -> str:
        """The training records' :func:`~dgrpo.data.records.fingerprint` (a resume checks it)."""
        return fingerprint(self.train_data)

    def load_state(
        self, js: dict, allow_config_change: bool = False, *, refuse: Callable[[str, str], None] | None = None
    ) -> None:
        """Take up where :meth:`state` was taken (after the weights and the optimizer are loaded). ``js`` is checked
        first as a resume checks a checkpoint's ``trainer`` section (:attr:`STATE`: CheckpointError in one line, the
        trainer left as it was): called from Python, a damaged or hand-made state (a negative index in ``order``, a
        count as a string, a ``data_rng`` no generator had) was taken without a word, or failed later in a step.
        Then, as the command line's resume: a state recorded on other training data or with another reward than
        this trainer's is refused (ConfigError) unless ``allow_config_change`` (called from Python, it was taken
        without a word); ``refuse``: how a run refuses it instead, in its words (``(what, keep)``:
        :meth:`~.run.RunDir.refuse_unrecorded_change`)."""
        self.STATE.check("trainer", js)
        for what, keep in recorded_changes(js, self.data_fingerprint, self.rewards.identity()):
            if refuse is not None:
                refuse(what, keep)
            elif not allow_config_change:
                raise ConfigError(
                    f"GRPOTrainer.load_state: the state was {what}: load it into a trainer given {keep}, or pass "
                    "allow_config_change=True to go on"
                )
        self.step_idx, self.ema_baseline = js["step_idx"], js["ema_baseline"]
        # (the rest of the epoch's order; on other data, allowed by allow_config_change, the indices it still has)
        self.order = [i for i in js["order"] if i < len(self.train_data)]
        v, st, gauss = js["data_rng"]
        self.data_rng.setstate((v, tuple(st), gauss))
        self.guard.skips, self.guard.streak = js["nonfinite_skips"], js["nonfinite_streak"]

    # -------------------------------------------------------------------- data
    def next_prompts(self) -> list[Record]:
        """This rank's share of the step's prompts: the global list (the same whatever the number of
        ranks) is drawn, then sharded by prompt, so the K rollouts of a group stay on one rank."""
        out: list[Record] = []
        while len(out) < self.cfg.grpo.prompts_per_step:
            if not self.order:
                self.order = list(range(len(self.train_data)))
                self.data_rng.shuffle(self.order)
            out.append(self.train_data[self.order.pop()])
        return self.dist.shard(out)

    # -------------------------------------------------------------------- one step
    def step(self, prompts: list[Record] | None = None) -> dict:
        """One iteration of Algorithm 1; returns the step's metrics row. ``prompts``: this rank's prompts (default:
        the next of the training data). ValueError past ``grpo.steps`` (the schedule's lr is 0 there)."""
        g, dist = self.cfg.grpo, self.dist
        step = self.step_idx
        if step >= g.steps:
            raise ValueError(
                f"GRPOTrainer.step: step {step} is past grpo.steps = {g.steps} (its learning rate is 0 there): "
                "set grpo.steps to the length of the run before building the trainer"
            )
        if isinstance(prompts, list) and not prompts:
            raise ValueError("GRPOTrainer.step: prompts is empty (give this rank's prompts, or None for the next)")
        if prompts is not None:  # (dict rows were an AttributeError inside the rollouts, the lr already set)
            check_records(prompts, "GRPOTrainer.step: prompts")
        lr = lr_at(step, g.lr, g.steps, g.warmup_steps, g.min_lr_ratio)
        beta = (
            (beta_at(step, g.beta0, g.lr, g.steps, g.warmup_steps, g.min_lr_ratio) if g.anneal_beta else g.beta0)
            if g.beta0 > 0
            else 0.0
        )
        for pg in self.opt.param_groups:
            pg["lr"] = lr
        prompts = prompts if prompts is not None else self.next_prompts()
        t0 = time.time()
        try:  # 1-3. rollouts and rewards, filter and advantages
            ro, keep, adv, rows = self._rollouts_kept(prompts, step)
        except RewardError:  # (this rank's reward failed: the others learn it at the agreement, and stop there too)
            agree_on_kept(0, 0, dist, failed=True)
            raise
        t_roll = time.time() - t0
        # the kept counts agreed over ranks before any backward
        n_kept, n_tok, failed = agree_on_kept(int(rows.numel()), int(ro.mask[rows].sum()) if rows.numel() else 0, dist)
        if failed:
            raise RewardError("a reward failed in another process (its own error line says which, and why)")
        metrics = self._rollout_metrics(ro, keep)
        metrics.update(step=step, lr=lr, beta=beta, time_rollout_s=round(t_roll, 4))
        # 4. update
        t1 = time.time()
        if n_kept == 0:
            metrics.update(skipped=1, **ObjectiveStats().as_dict(), grad_norm=0.0, n_rollouts_kept=0)
        else:
            with self._update_oom_advice():
                counts = GlobalCounts(n_kept, n_tok, g.max_new_tokens)
                metrics.update(self._update(ro, rows, adv.flatten(), counts, beta, step))
            metrics.update(skipped=0, n_rollouts_kept=n_kept)
            self._warn_if_replay_differs(metrics["logp_replay_maxdiff"])
        if g.advantage == "ema":
            metrics["ema_baseline"] = self._update_ema_baseline(ro.rewards)
        metrics["time_update_s"] = round(time.time() - t1, 4)
        metrics["nonfinite_skips"] = self.guard.skips
        self.step_idx += 1
        if self.ref is not None and g.ref_renewal_every and self.step_idx % g.ref_renewal_every == 0:
            self.ref.renew()
            metrics["ref_renewed"] = 1
        return metrics

    def _rollouts_kept(self, prompts: list[Record], step: int) -> tuple[Rollouts, Tensor, Tensor, Tensor]:
        """Steps 1-3 of Algorithm 1 on this rank: K rollouts of each prompt with their rewards, the groups the filter
        keeps and the advantages, and the kept rollouts' rows."""
        cfg, K = self.cfg, self.cfg.grpo.group_size
        # one seed per global rollout row, from (run seed, step, row): distinct across ranks, independent of their
        # number
        self.row0 = self.dist.offset(len(prompts) * K)
        seeds = seeds_for(cfg.seed, step, 0, self.row0 + len(prompts) * K)[self.row0 :]
        rows_at_a_time = self._rows_at_a_time(cfg.grpo.rollout_batch_size)
        why = "rows generated at a time"
        with oom_advice("rollouts", "grpo.rollout_batch_size", rows_at_a_time, why, first=self._held_memory()):
            ro = self._collect(prompts, seeds)
        if self.lm.device.type == "cuda":  # the next step's masks, drawn on a host thread while this update runs
            self.perturbation.prefetch(self.lm, seeds_for(cfg.seed, step + 1, 0, self.row0 + len(seeds))[self.row0 :])
        keep, adv = self._filter_and_advantages(ro.rewards, step)
        return ro, keep, adv, keep.repeat_interleave(K).nonzero().flatten()

    def _update_ema_baseline(self, rewards: Tensor) -> float:
        """The REINFORCE baseline after this step: from every rank's rewards in rank order (the global batch), so
        that every rank keeps the one baseline a single process would."""
        every_rank = torch.cat(self.dist.all_gather_objects(rewards.cpu()))
        self.ema_baseline = ema_update(self.ema_baseline, every_rank, self.cfg.grpo.ema_alpha)
        return self.ema_baseline

    def _collect(self, prompts: list[Record], seeds: Tensor) -> Rollouts:
        """K rollouts of each prompt under the perturbations of ``seeds``, with their rewards."""
        g = self.cfg.grpo
        ro = collect_rollouts(
            self.lm,
            prompts,
            group_size=g.group_size,
            n_latent=self.n_latent,
            perturbation=self.perturbation,
            seeds=seeds,
            temperature=g.temperature,
            top_p=g.top_p,
            max_new_tokens=g.max_new_tokens,
            batch_size=g.rollout_batch_size,
            max_question_tokens=self.cfg.data.max_question_tokens,
            reward_fn=self.rewards,
            static_cache=g.rollout_cache == "static",
            engine=self.engine,
            keep_graphs=self.keep_graphs,
        )
        self.last_rollouts, self.last_prompts = ro, prompts
        return ro

    def _filter_and_advantages(self, rewards: Tensor, step: int) -> tuple[Tensor, Tensor]:
        """(keep-mask over groups [G], advantages [G, K]): the accuracy filter and Dr. GRPO, or the EMA baseline."""
        g = self.cfg.grpo
        if g.shuffle_rewards:  # the null control: the same rewards, assigned to rollouts at random within groups
            group0 = self.row0 // g.group_size  # this rank's first global group: seeds independent of the rank count
            seeds = seeds_for(self.cfg.seed, step, 0, group0 + rewards.shape[0], stream="null")[group0:]
            rewards = shuffle_within_groups(rewards, seeds)
        every = torch.ones(rewards.shape[0], dtype=torch.bool)
        if g.advantage == "ema":
            return every, ema_advantages(rewards, self.ema_baseline)
        if g.filter:  # the accuracy window, on the total reward or on the reward grpo.filter_reward names
            accuracy = torch.tensor(self.rewards.filter_values(rewards.flatten().tolist())).view_as(rewards)
            return group_filter(accuracy, g.alpha_min, g.alpha_max), group_advantages(rewards, g.advantage)
        return every, group_advantages(rewards, g.advantage)

    def _update(
        self, ro: Rollouts, rows: Tensor, adv_rows: Tensor, counts: GlobalCounts, beta: float, step: int
    ) -> dict:
        """E mini-epochs over the kept rows in micro-batches; each micro-batch replays its rollouts' perturbations."""
        g, lm, dist = self.cfg.grpo, self.lm, self.dist
        mb = self._rows_at_a_time(g.micro_batch_size)
        # a rank that kept nothing (while others did) has no chunk: it runs no backward but still joins the
        # gradient reduction below with zeros, and every metric reduction (all ranks, same calls, same order)
        chunks = [rows[i : i + mb] for i in range(0, rows.numel(), mb)]
        # the model stays in eval mode: its own dropout modules (e.g. GPT-2's, p > 0 in hub configs) would add
        # un-replayed noise the rollout never saw; the only stochasticity is the seeded perturbation
        lm.eval()
        # theta_old: the optimizer steps once per mini-epoch, so the first mini-epoch's forward runs at theta_old
        # under the same seeds; its log-probs, kept per micro-batch, are the later mini-epochs' old log-probs (no
        # separate replay, and ratios exactly 1 in the first mini-epoch whatever the engine or compiled graph)
        old: dict[int, Tensor] = {}
        # the stats and the replay check stay on the device until the step's end (no host sync per micro-batch);
        # the later mini-epochs' stats apart: their clipping and ratios are the step's (see clipping_from)
        stats, later, replay_diff, gn = ObjectiveStats(), ObjectiveStats(), torch.zeros((), device=lm.device), 0.0
        ref: Tensor | None = None
        for epoch in range(g.mini_epochs):
            # pi_ref is frozen for the step: under mask replay every mini-epoch scores the same rows under the same
            # masks, so its log-probs are computed once; fresh masks (the ablation) change them every mini-epoch
            if self.ref is not None and beta > 0 and (ref is None or g.replay != "seed"):
                ref = self._reference_logprobs(ro, rows, step, epoch)
            for ci, rws in enumerate(chunks):
                seeds = self._update_seeds(ro, rws, step, epoch)
                logp, tm = replay_logprobs(lm, ro, rws, seeds=seeds, **self._replay_kw())
                ref_lp = ref[ci * mb : ci * mb + rws.numel(), : tm.shape[1]] if ref is not None else None
                if epoch == 0:
                    old[ci] = logp.detach()
                loss, st = grpo_objective(
                    logp,
                    old[ci],
                    to_device(adv_rows[rws], logp.device),
                    tm,
                    counts,
                    self.objective,
                    ref_logp=ref_lp,
                    beta=beta,
                )
                loss.backward()
                (stats if epoch == 0 else later).add(st)
                if epoch == 0:
                    recorded = ro.rollout_logp.index_select(0, to_device(rws, logp.device))[:, : tm.shape[1]]
                    diff = ((logp.detach() - recorded) * tm).abs()
                    replay_diff = torch.maximum(replay_diff, diff.max() if diff.numel() else replay_diff)
            gn = self._optimizer_step()
        stats.clipping_from(later, g.mini_epochs - 1)
        values = stats.as_dict()  # one device-to-host copy for the step's stats
        return {
            "policy_loss": dist.sum_float(values["policy_loss"]),
            "kl": dist.sum_float(values["kl"]),
            "clip_frac_low": dist.sum_float(values["clip_frac_low"]),
            "clip_frac_high": dist.sum_float(values["clip_frac_high"]),
            "ratio_max": dist.max_float(values["ratio_max"]),
            "ratio_min": dist.min_float(values["ratio_min"]),
            "grad_norm": gn,
            "logp_replay_maxdiff": dist.max_float(float(replay_diff)),
        }

    def _warn_if_replay_differs(self, maxdiff: float) -> None:
        """Warn once when the update's replay does not give the rollouts' log-probs back (measured: ~1e-6 in fp32,
        a few 1e-2 in bf16: 2.6e-2 seen on CPU): a perturbation whose noise is not a function of its seeds (a custom
        kind drawing from the global RNG) makes the ratios noise. Not under grpo.replay=fresh_mask, which draws other
        masks on purpose."""
        if self._replay_warned or self.cfg.grpo.replay != "seed":
            return
        limit = 1e-3 if next(self.lm.model.parameters()).dtype == torch.float32 else 0.1
        if maxdiff > limit:
            self._replay_warned = True
            warnings.warn(
                f"the update's replay gave log-probs up to {maxdiff:.3g} away from the rollouts' (expected below "
                f"{limit:g} for these weights): is the perturbation ({self.cfg.perturbation.kind}) a function of its "
                "seeds alone? (a kind drawing from the global RNG cannot be replayed)",
                stacklevel=3,
            )

    def _optimizer_step(self) -> float:
        """Sum gradients over ranks, clip, step unless non-finite (then skip and count); returns the grad norm."""
        g, lm = self.cfg.grpo, self.lm
        self.dist.all_reduce_grads(lm.model)
        params = [p for p in lm.model.parameters() if p.grad is not None]
        gn = clip_gradients(params, g.max_grad_norm if g.max_grad_norm > 0 else float("inf"))  # (bf16: in float32)
        finite = bool(torch.isfinite(gn))  # the summed gradient is the same on every rank, so is this decision
        if finite:
            with without_per_parameter_syncs(self.opt):
                self.opt.step()
        self.guard.record(finite)
        self.opt.zero_grad(set_to_none=True)
        self.dist.gather_params(lm.model)
        if finite and not weights_finite(self.opt_params, self.dist):
            raise NonFiniteError(
                f"the weights became non-finite in the optimizer step of step {self.step_idx} (lr "
                f"{self.opt.param_groups[0]['lr']:.3g}, finite gradient norm {float(gn):.3g}); nothing of this step "
                "was saved: the run directory's last checkpoint is intact; lower grpo.lr"
            )
        return float(gn)

    def _reference_logprobs(self, ro: Rollouts, rows: Tensor, step: int, epoch: int) -> Tensor:
        """The reference model's log-probs of ``rows``' answers under the same perturbations as the policy's replay
        (no grad), [rows, answer width]: in batches of ``grpo.rollout_batch_size`` rows (a no-grad forward keeps no
        activations, so it runs in the rollout's batches, not the update's micro-batches: fewer, wider kernels)."""
        assert self.ref is not None
        g = self.cfg.grpo
        step_rows = self._rows_at_a_time(g.rollout_batch_size)
        out = torch.zeros(rows.numel(), ro.tokens.shape[1], device=ro.tokens.device)
        why = "rows the reference scores at a time, without grad"
        # (its kept decoder runs over the largest such batch: one capture, whatever rows the filter kept)
        kw = self._replay_kw() | {"min_rows": min(step_rows, g.prompts_per_step * g.group_size)}
        with oom_advice("reference's scoring", "grpo.rollout_batch_size", step_rows, why, first=self._held_memory()):
            for i in range(0, rows.numel(), step_rows):
                rws = rows[i : i + step_rows]
                seeds = self._update_seeds(ro, rws, step, epoch)
                lp = self.ref.run(partial(_replayed_logprobs, ro=ro, rows=rws, seeds=seeds, **kw))
                out[i : i + rws.numel(), : lp.shape[1]] = lp
        return out

    def _update_oom_advice(self) -> AbstractContextManager[None]:
        """What to try when the update runs out of device memory, the cheapest lever that leaves the method as it is
        first (:meth:`_held_memory`), then smaller micro-batches (the loss does not depend on them), or
        recomputation."""
        g = self.cfg.grpo
        mb = self._rows_at_a_time(g.micro_batch_size)
        if not g.recompute:
            less = "grpo.recompute=true keeps less for backward"
        elif g.recompute_granularity == "call":
            less = "grpo.recompute_granularity=layer keeps less for backward"
        elif g.recompute_kept_layers:
            less = f"fewer grpo.recompute_kept_layers (now {g.recompute_kept_layers}) keep less for backward"
        else:
            less = "" if mb > 1 else "a smaller model or a larger device"
        rows = "rows per forward/backward; the loss does not depend on it" if mb > 1 else "one row per forward already"
        why = "; ".join(part for part in (rows, less) if part)
        return oom_advice("update", "grpo.micro_batch_size", mb, why, first=self._held_memory())

    def _held_memory(self) -> str:
        """The out-of-memory advice's first lever in every phase: the memory the fast engine holds between steps
        (the latent chain's graphs, the kept decoders), whose release leaves the method as it is, named as the caller
        sets them (:func:`~.wording.settings_named`); '' when off."""
        held = [("grpo.update_latent_graphs", self.chain_latents), ("grpo.keep_graphs", self.keep_graphs)]
        free = [(setting, "false", "False") for setting, on in held if on]
        if not free:
            return ""
        return f"{settings_named(free, in_command_line())} (memory held between steps; the same method, a slower step)"

    def _models(self) -> list[LatentLM]:
        """The policy and the reference model (one model under LoRA: the reference is its adapter)."""
        return [self.lm] + ([self.ref.lm] if self.ref is not None and self.ref.lm is not self.lm else [])

    def kept_decoder_bytes(self) -> int:
        """The device memory the fast engine's kept decoders hold (their caches and buffers) between steps, and the
        kept latent chain's static tensors (``grpo.update_latent_graphs``; not its graphs' pool)."""
        return sum(dec.nbytes for lm in self._models() for _, dec in lm.kept_decoders.values())

    def release_kept_decoders(self) -> None:
        """Free the fast engine's kept decoders (caches, buffers, graphs) and latent chain of the policy and the
        reference: at the end of training (the model goes on to evaluation or elsewhere). A later step would make
        them again."""
        for lm in self._models():
            lm.kept_decoders.clear()

    def release_training_state(self) -> None:
        """After the last step (its checkpoint written): free the kept decoders, the optimizer's moments and the
        reference model, so that what follows (the test sets, ``best/`` loaded beside the model) has their memory."""
        self.release_kept_decoders()
        self.opt.state.clear()
        self.ref = None

    def _rows_at_a_time(self, batch_size: int) -> int:
        """Rows per batched call: ``batch_size``, or one under a perturbation replayed one rollout at a time."""
        return batch_size if self.perturbation.batched else 1

    def _replay_kw(self) -> dict[str, Any]:
        """How the update, theta_old and the reference replay rollouts: the same latent steps, perturbation,
        temperature and calls (under the fast engine <|end-latent|> runs in the answer's forward call)."""
        g = self.cfg.grpo
        return dict(
            n_latent=self.n_latent,
            perturbation=self.perturbation,
            temperature=g.temperature,
            engine=self.engine,
            keep_graphs=self.keep_graphs,
            chain_latents=self.chain_latents,
            min_rows=min(g.micro_batch_size, g.prompts_per_step * g.group_size),  # (the largest micro-batch)
        )

    def _update_seeds(self, ro: Rollouts, rows: Tensor, step: int, epoch: int) -> Tensor:
        """The rollout's own seeds (mask replay), or new ones per mini-epoch (``replay: fresh_mask``, the ablation)."""
        if self.cfg.grpo.replay == "seed":
            return ro.seeds[rows]
        fresh = seeds_for(
            self.cfg.seed, step, 0, self.row0 + ro.seeds.numel(), stream=f"fresh/{epoch}"
        )  # per global row
        return fresh[self.row0 :][rows]

    def rollout_rows(self, n: int) -> list[dict]:
        """The first ``n`` rollouts of the last step's global batch, for ``rollouts.jsonl``: prompt, completion, gold
        answer, reward(s), the group's global index. Under torchrun every rank calls it (its rows are gathered in rank
        order, which is the global order; they were rank 0's alone, capped at its share)."""
        if n <= 0:
            return []
        ro, K = self.last_rollouts, self.cfg.grpo.group_size
        parts = self.rewards.last if len(self.rewards.parts) > 1 else {}
        rows = [
            {
                "step": self.step_idx - 1,
                "group": (self.row0 + i) // K,
                "seed": int(ro.seeds[i]),
                "question": self.last_prompts[i // K].question,
                "completion": ro.texts[i],
                "answer": self.last_prompts[i // K].answer,  # (the gold the reward was given: a reward's bugs show)
                "reward": float(ro.rewards.flatten()[i]),
                **{k: None if math.isnan(v[i]) else v[i] for k, v in parts.items()},  # (None: "does not apply")
            }
            for i in range(min(n, len(ro.texts)))
        ]
        return [row for rank_rows in self.dist.all_gather_objects(rows) for row in rank_rows][:n]

    def _rollout_metrics(self, ro: Rollouts, keep: Tensor) -> dict:
        """Reward and diversity diagnostics of the step's rollouts, reduced over ranks. The within-group std in float64:
        a group of K equal rewards has std exactly 0 (float32 gave one group of eight 0.1 a std of 7e-9, so that
        frac_zero_std missed it)."""
        R = ro.rewards
        K = R.shape[1]
        within_std = R.double().std(dim=1, unbiased=False) if K > 1 else torch.full((R.shape[0],), float("nan"))
        answers = [extract_answer(t) or normalize_text(final_answer_text(t)) for t in ro.texts]  # numbers or text
        distinct = [len(set(answers[i * K : (i + 1) * K])) for i in range(R.shape[0])]
        d = self.dist
        n_groups = d.sum_int(R.shape[0])
        n_tokens = float(ro.mask.sum())
        return {
            "reward_mean": d.sum_float(float(R.sum())) / max(1, n_groups * K),
            "reward_std": (d.sum_float(float(within_std.sum())) / n_groups) if K > 1 else None,
            "frac_zero_std": (d.sum_float(float((within_std == 0).sum())) / n_groups) if K > 1 else None,
            "frac_groups_kept": d.sum_float(float(keep.sum())) / n_groups,
            "distinct_answers": d.sum_float(float(sum(distinct))) / n_groups,
            "answer_entropy": d.sum_float(ro.entropy * n_tokens) / max(1.0, d.sum_float(n_tokens)),
            "answer_len": d.sum_float(n_tokens) / max(1, d.sum_int(ro.mask.shape[0])),
            **self._part_metrics(n_groups * K),
        }

    def _part_metrics(self, n_rows: int) -> dict:
        """Each reward part's ``reward/<name>``, its mean over the step's rows that gave a number (TRL's nanmean;
        None when none did; with two parts or more), and ``frac_none/<name>``, the fraction of rows it gave None or
        NaN for (each part that may: not a built-in scorer), reduced over ranks (``n_rows``: the global batch's)."""
        d, out = self.dist, {}
        abstains = {p.name for p in self.rewards.parts if p.may_abstain}
        for name, values in self.rewards.last.items():
            numbers = [v for v in values if not math.isnan(v)]
            if len(self.rewards.parts) > 1:
                given = d.sum_int(len(numbers))
                out[f"reward/{name}"] = d.sum_float(sum(numbers)) / given if given else None
            if name in abstains:
                out[f"frac_none/{name}"] = d.sum_int(len(values) - len(numbers)) / max(1, n_rows)
        return out


def check_rollouts_fit(
    lm: LatentLM, n_latent: int, cfg: Config, train: list[Record] | None = None, what: str = "the training data"
) -> None:
    """A rollout's ``n_latent`` thoughts and ``grpo.max_new_tokens`` answer tokens fit the context after a one-token
    prompt and, given ``train``, after every training question as the rollouts prompt it (``data.max_question_tokens``,
    and ``lm.settings``' chat template and markers; each batch checks its own prompts too, which failed the step that
    sampled a question past the context, hours in): at the trainer's start, and by ``dgrpo grpo`` before the weights
    load. The ConfigError names ``what`` ``train`` is (``dgrpo grpo``: data.train), the first record of the widest
    prompt, and the data.max_question_tokens that fits."""
    g, limit, max_tokens = cfg.grpo, lm.context_length, cfg.data.max_question_tokens
    lm.check_fits(1, n_latent, g.max_new_tokens, key="grpo.n_latent")
    # the widest question the rollouts may prompt: cut to max_tokens tokens after the BOS, before <|start-latent|>
    fits = len(lm.question_prefix) + n_latent + 2 + g.max_new_tokens  # (all but the question)
    if not train or limit is None or (max_tokens and not lm.settings.chat_template and fits + max_tokens <= limit):
        return
    at, width = widest_prompt(lm, train, max_tokens)
    try:
        lm.check_fits(width, n_latent, g.max_new_tokens, key="grpo.n_latent")
    except ConfigError as e:
        room = 0 if lm.settings.chat_template else limit - fits  # (a chat template's own tokens: not counted here)
        cut = f" (data.max_question_tokens={room} fits every question)" if room > 0 else ""
        if not max_tokens:
            most, last = (f" to at most {room}", f" {room}") if room > 0 else ("", "")
            cut = (
                f"; data.max_question_tokens is 0 (no limit): set it{most} (the rollouts then see each question's "
                f"last{last} tokens), or remove the record"
            )
        raise ConfigError(f"{what}: record {at} (counting from 0), its longest question: {e}{cut}") from None


def checked_rewards(
    reward_fn: ScoreFn | Sequence[ScoreFn] | Rewards | None, cfg: Config, train: list[Record]
) -> Rewards:
    """The trainer's reward (:func:`_rewards`: ``reward_fn``, else the config's), called on the gold answers of the
    first two training records (:meth:`Rewards.smoke_test`): a reward that cannot be built, raises or returns what it
    may not fails before anything is trained. Within :func:`~.run_inputs.checked_once`, a Rewards this returned is not
    called again for the same records (``dgrpo grpo`` checks it before the model loads, and gives it to the trainer)."""
    try:  # (the same files on every rank: not its calls, below, which may fail on one rank alone)
        rewards = _rewards(reward_fn, cfg, data_columns(train))
    except RewardError as e:
        raise RewardSetupError(str(e)) from None
    checked = (train[:2], cfg.grpo.filter and cfg.grpo.advantage != "ema")
    found, key = found_at_start(), ("gold", id(rewards))
    if found is not None and key in found and found[key][0] is rewards and found[key][1] == checked:
        return rewards
    rewards.smoke_test(checked[0], check_filter=checked[1])
    if found is not None:
        found[key] = (rewards, checked)
    return rewards


def _rewards(
    reward_fn: ScoreFn | Sequence[ScoreFn] | Rewards | None, cfg: Config, columns: tuple[str, ...] = ()
) -> Rewards:
    """:func:`_chosen_rewards`, told the training data's ``columns`` (:func:`data_columns`: a column of some records
    only reaches a TRL-style reward in every batch)."""
    rewards = _chosen_rewards(reward_fn, cfg)
    rewards.columns = columns
    return rewards


def _chosen_rewards(reward_fn: ScoreFn | Sequence[ScoreFn] | Rewards | None, cfg: Config) -> Rewards:
    """The trainer's reward: the one given in Python (a function, a list of them as TRL's ``reward_funcs``, each part
    named by its ``__name__``, or a Rewards), else the config's (``grpo.reward(s)``, else ``eval.scorer``)."""
    if isinstance(reward_fn, Rewards):
        return reward_fn
    if reward_fn is None:
        g = cfg.grpo
        return build_rewards(g.reward, g.rewards, cfg.eval.scorer, g.filter_reward)
    fns = cast(list[ScoreFn], list(reward_fn) if isinstance(reward_fn, (list, tuple)) else [reward_fn])
    if not fns or not all(callable(f) for f in fns):
        raise TypeError(
            f"reward_fn must be a function (completions, records) -> one score each, a list of them or a Rewards; got "
            f"{type(reward_fn).__name__} {reward_fn!r:.60}: a reward by name goes in the config (grpo.reward: numeric, "
            "or 'file.py:function')"
        )
    if cfg.grpo.reward or cfg.grpo.rewards:
        warnings.warn(
            "reward_fn replaces the config's grpo.reward / grpo.rewards, which the run's config.json and its "
            "checkpoints' run_config.json still name (its resumable checkpoints record the reward used)",
            stacklevel=3,
        )
    names = _part_names(fns)
    chosen = cfg.grpo.filter_reward
    if chosen and chosen not in names:  # it named a part of the config's rewards, which reward_fn replaces
        warnings.warn(
            f"grpo.filter_reward {chosen!r} is not used: reward_fn ({', '.join(names)}) replaces the config's rewards, "
            "and the filter applies to the total (pass a Rewards to filter on one part)",
            stacklevel=3,
        )
        chosen = ""
    return Rewards([RewardPart(n, f) for n, f in zip(names, fns)], chosen)


def _part_names(fns: list[ScoreFn]) -> list[str]:
    """Each function's ``__name__`` (``reward_fn`` without one), a repeated one numbered (two lambdas:
    ``<lambda>``, ``<lambda>_2``), as TRL takes them."""
    names: list[str] = []
    for fn in fns:
        base = getattr(fn, "__name__", "reward_fn")
        name, k = base, 1
        while name in names:
            k += 1
            name = f"{base}_{k}"
        names.append(name)
    return names


# ------------------------------------------------------------------------ the run
@dataclass
class LoopState:
    """What the loop around the trainer keeps between steps (saved in every checkpoint)."""

    best_step: int | None = None
    best_accuracy: float = -1.0
    best_mean_score: float | None = None  # best/'s mean score on the first validation set (None: not given)
    skipped: int = 0
    skip_streak: int = 0  # steps in a row with every group filtered out (no update)
    last_eval: float | None = None
    last_mean_score: float | None = None  # the last validation's mean score on the first set (None: not given)
    started: float = 0.0  # wall clock at the start of this process's part of the run
    # a stop's checkpoint, written before the evaluation due at its step: the resumed run evaluates first
    eval_pending: bool = False

    def forget_best(self) -> None:
        """No ``best/`` kept (yet): the next validation's writes one."""
        self.best_step, self.best_accuracy, self.best_mean_score = None, -1.0, None


#: a checkpoint's ``loop`` (:func:`_loop_record`): the fields of the first dgrpo's LoopState are always there
LOOP_STATE = StateSection.of(
    LoopState, ("best_step", "best_accuracy", "skipped", "last_eval"), counts("best_step", "skipped", "skip_streak")
)


def _loop_record(loop: LoopState) -> dict:
    """The loop's state as a checkpoint keeps it: ``eval_pending`` only when set, and the mean scores only when
    known, so that a checkpoint of an unstopped run (validated by a count) stays readable by dgrpo before it (whose
    LoopState has no such fields)."""
    record = asdict(loop)
    for key, unset in (("eval_pending", False), ("best_mean_score", None), ("last_mean_score", None)):
        if record[key] is unset:
            del record[key]
    return record


EVAL_ARGS = ("lm", "records")  # how train_grpo calls its evaluate_fn


def train_grpo(
    lm: LatentLM,
    cfg: Config,
    train: list[Record],
    out_dir: Path,
    *,
    valid: dict[str, list[Record]] | None = None,
    evaluate_fn: Callable[[LatentLM, list[Record]], int | EvalResult] | None = None,
    dist: Dist | None = None,
    progress: bool = True,
    log: Callable[[str], None] = say,
    resume: bool | str = "auto",
    allow_config_change: bool = False,
    reward_fn: ScoreFn | Sequence[ScoreFn] | Rewards | None = None,
    final_eval: FinalEval | None = None,
) -> dict:
    """The full loop: periodic eval, metrics.jsonl (and the trackers), best/ and final/ checkpoints.

    ``evaluate_fn(lm, records)`` returns how many of ``records`` the model gets right, or their :class:`EvalResult`
    (whose ``mean_score`` is logged too, and can keep ``best/``: ``grpo.best_metric``); score every record it is
    given (apply any limit beforehand); by default, greedy answers under ``eval.*`` (:func:`default_evaluate_fn`).
    Under torchrun every rank calls this; eval is sharded and only rank 0 writes files. ``resume``: ``auto``
    (True), ``never`` (False) or a checkpoint path (see :class:`RunDir`). ``reward_fn``: see :class:`GRPOTrainer`.
    ``final_eval``: see :meth:`RunDir.final_eval` (``dgrpo grpo``: the test sets)."""
    check_run_inputs(
        lm, cfg, train, "train_grpo", valid, dict, out_dir=out_dir, evaluate_fn=evaluate_fn, eval_args=EVAL_ARGS
    )
    cfg = recorded_model(cfg, lm, out_dir)  # (a model loaded in Python is named by the run's config, as --init is)
    every = [r for records in (valid or {}).values() for r in records]
    evaluate_fn = evaluate_fn or (default_evaluate_fn(cfg, every) if valid else None)  # (eval.scorer built now)
    lora_for_training(lm, cfg.model.lora)
    dist, g = Dist.given_or_single(dist, cfg.fsdp, "train_grpo"), cfg.grpo
    lm.settings.chat_template |= cfg.data.chat_template  # on for a model trained without it (a trained one keeps it)
    if lm.settings.chat_template and not cfg.data.chat_template:  # the run's config.json says how it prompts
        cfg = replace(cfg, data=replace(cfg.data, chat_template=True))
    trainer = GRPOTrainer(lm, cfg, train, dist=dist, reward_fn=reward_fn)
    lm.format_question(train[0].question)  # a chat template the tokenizer lacks fails here, before files are written
    with RunDir(out_dir, cfg, dist, "grpo", resume=resume, allow_config_change=allow_config_change, log=log) as run:
        loop = _resume(run, trainer)
        evaluate = _periodic_eval(run, trainer, loop, valid or {}, evaluate_fn)
        if trainer.step_idx == 0 or loop.eval_pending:  # (pending: the run stopped before this step's evaluation)
            loop.last_eval, loop.eval_pending = evaluate(trainer.step_idx), False
        steps, off = range(trainer.step_idx, g.steps), bar_disabled(dist.is_main and progress)
        bar = tqdm(steps, desc="grpo", disable=off, initial=trainer.step_idx, total=g.steps)
        with bar:  # (closed on an error too, before the error's line is printed: that line starts a line of its own)
            for _ in bar:
                m, stalled = _logged_step(run, trainer, loop)
                _end_step(run, trainer, loop, evaluate, stalled)
                shown = {"reward": f"{m['reward_mean']:.3f}", "kept": f"{m['frac_groups_kept']:.2f}"}
                bar.set_postfix({**shown, **({"eval": f"{loop.last_eval:.3f}"} if loop.last_eval is not None else {})})
        applied = trainer.applied()  # (before its optimizer's state is freed; a compiler's fallback in the run shown)
        run.record_applied_at_end(applied)
        trainer.release_training_state()
        return _finish(run, trainer, loop, final_eval, applied)


def _logged_step(run: RunDir, trainer: GRPOTrainer, loop: LoopState) -> tuple[dict, str | None]:
    """One step, its metrics row and rollouts written; (the row, why to stop for a stall or None). A SIGTERM within
    it waits for its end (:mod:`dgrpo.training.preemption`): the loop then writes this step's checkpoint and stops."""
    g, dist = trainer.cfg.grpo, trainer.dist
    trainer.lm.stopped_run = str(run.out_dir)  # (mid-run weights until the run ends: check_restart)
    with within_step():
        comm0 = dist.comm_s
        try:
            m = trainer.step()
        except NonFiniteError as e:  # (weights made non-finite: nothing of this step is saved)
            run.stop_after_step(trainer.applied(), e)
        m["time_comm_s"] = round(dist.comm_s - comm0, 4)  # collectives, waiting for the slowest rank included
        loop.skipped += m["skipped"]
        stalled = _check_stall(run, loop, m, g)
        dropped = not math.isfinite(m["grad_norm"])  # (an update dropped: its row is written whatever log_every)
        if m["step"] % g.log_every == 0 or m["step"] == g.steps - 1 or dropped:
            run.metrics.write(m)
        run.write_rollouts(trainer.rollout_rows(g.log_rollouts))
    return m, stalled


def _end_step(
    run: RunDir, trainer: GRPOTrainer, loop: LoopState, evaluate: Callable[[int], float | None], stalled: str | None
) -> None:
    """After a step: its evaluation and its checkpoint when due, then the stop of a tripped guard, a stall or a
    SIGTERM (the ranks agree on it: :func:`stop_requested`). At a SIGTERM the checkpoint comes first, with the step's
    due evaluation recorded as pending (``LoopState.eval_pending``), and the run stops without it: the grace period
    is the step's and the checkpoint's, not the evaluation's. The resumed run evaluates first, from the same RNG
    state as a run never stopped (whose checkpoint holds the state after its evaluation)."""
    g, done, preempted = trainer.cfg.grpo, trainer.step_idx, stop_requested(trainer.dist)
    eval_due = bool(g.eval_every and done % g.eval_every == 0) or done == g.steps
    loop.eval_pending = eval_due and preempted
    if eval_due and not preempted:
        loop.last_eval = evaluate(done)
    due = (g.save_every and done % g.save_every == 0) or done == g.steps
    tripped = trainer.guard.error(done, run.out_dir / CHECKPOINTS_DIR) if trainer.guard.tripped else None
    error = tripped or (StalledError(stalled) if stalled else None)
    if due or error is not None or preempted:  # (preempted: the same command goes on from here)
        _save_resumable(run, trainer, loop)
    if error is not None or preempted:  # (applied.json's entry as the process ends: its resume and the record agree)
        run.stop_after_step(trainer.applied(), error)


def _resume(run: RunDir, trainer: GRPOTrainer) -> LoopState:
    """Load the newest checkpoint that loads into the trainer (if any) and open the metrics log."""
    extra = _extra_models(trainer)
    sharded, lm, opt = trainer.dist.fsdp, trainer.lm, trainer.opt
    keys = ("metrics_lines",)  # (state.json's, beside every checkpoint's and the sections: what a GRPO resume reads)
    sections = {"trainer": GRPOTrainer.STATE, "loop": LOOP_STATE}
    loaded = run.resume(
        lambda ckpt: read_checkpoint(
            ckpt, lm=lm, optimizer=opt, extra_models=extra, sharded=sharded, state_keys=keys, sections=sections
        )
    )
    saved = loaded.apply(lm, opt, extra, trainer.dist) if loaded is not None else None
    loop = LoopState()
    check_restart(trainer.lm, saved is not None, "train_grpo")
    if saved is not None:
        trainer.load_state(saved["trainer"], refuse=run.refuse_unrecorded_change)
        if trainer.step_idx > trainer.cfg.grpo.steps:  # (final/ would hold more steps than the summary says)
            raise shortened_error(trainer.cfg.grpo.steps, trainer.step_idx)
        loop = LoopState(**saved["loop"])
        if loop.best_step is not None and not (run.out_dir / BEST_DIR).is_dir():  # a fork: its best/ is elsewhere
            run.log(f"dgrpo: the checkpoint's best (step {loop.best_step}) is not in {run.out_dir}: best/ starts anew")
            loop.forget_best()
        if run.drop_stale_best(saved):  # (best/ written after the checkpoint, by steps this resume abandons)
            loop.forget_best()
    loop.started = time.time()
    run.start(saved, trainer.applied())
    return loop


def _check_stall(run: RunDir, loop: LoopState, m: dict, g: GRPOConfig) -> str | None:
    """Count steps in a row with every group filtered out; warn from 10 on (naming the filter's accuracy window);
    past ``grpo.max_skip_streak`` return why to stop."""
    limit, window = g.max_skip_streak, f"[{g.alpha_min}, {g.alpha_max}]" if g.filter else "off"
    loop.skip_streak = loop.skip_streak + 1 if m["skipped"] else 0
    m["skip_streak"] = loop.skip_streak
    if loop.skip_streak and loop.skip_streak % 10 == 0:
        run.log(
            f"dgrpo: warning: every group was filtered out for {loop.skip_streak} steps in a row (step {m['step']}): "
            f"no update is happening (reward_mean {m['reward_mean']:.3f}, filter window {window})"
        )
    if limit and loop.skip_streak >= limit:
        saved = run.out_dir / CHECKPOINTS_DIR / step_dir_name(m["step"] + 1)  # (rows count from 0, checkpoints from 1)
        return (
            f"every group was filtered out for {loop.skip_streak} steps in a row (the last: metrics step {m['step']}): "
            f"training had stopped updating (reward_mean {m['reward_mean']:.3f}); state saved in {saved}; "
            "check the rewards and grpo.alpha_min / alpha_max, or resume with "
            f"{setting_named('grpo.max_skip_streak', '0', '0', in_command_line(), allow=True)} to keep going"
        )
    return None


def _finish(
    run: RunDir, trainer: GRPOTrainer, loop: LoopState, final_eval: FinalEval | None, applied: dict[str, Any]
) -> dict:
    """``final_eval``'s row (the test sets), then ``final/`` and, last, ``summary.json`` (returned; {} on ranks other
    than 0): a run with a summary.json, or a final/, is finished, its test sets' results written. One stopped before
    (in the test sets) is resumed by the same command from its last step's checkpoint, with no step left to train."""
    steps = trainer.cfg.grpo.steps
    run.final_eval(final_eval, trainer.lm, steps, loop.best_step)
    trainer.dist.save_model(trainer.lm, run.out_dir / FINAL_DIR)
    trainer.lm.stopped_run = None
    g = trainer.cfg.grpo
    unkept = "grpo.save_best=false" if not g.save_best else f"no validation from grpo.warmup_steps={g.warmup_steps} on"
    return _summary(run, loop, steps, applied, g.best_metric, unkept) if trainer.dist.is_main else {}


def _summary(
    run: RunDir, loop: LoopState, steps: int, applied: dict[str, Any], metric: str = "accuracy", unkept: str = ""
) -> dict:
    """``summary.json``: best (kept by ``metric``, ``grpo.best_metric``) and final validation accuracy, steps, skipped
    steps, and what the process that finished the run applied (``applied``, as at its last step). ``unkept``: why a
    validated run kept no best/, for the done line."""
    kept = loop.best_step is not None
    summary = {
        "best_step": loop.best_step,
        "best_metric": metric,
        "best_accuracy": loop.best_accuracy if kept else None,
        "best_mean_score": loop.best_mean_score if kept else None,
        "final_accuracy": loop.last_eval,
        "final_mean_score": loop.last_mean_score if loop.last_eval is not None else None,
        "steps": steps,
        "skipped_steps": loop.skipped,
        "applied": applied,
    }
    (run.out_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2))
    best = f"best {100 * loop.best_accuracy:.2f}% at step {loop.best_step}" if kept else ""
    if kept and metric != "accuracy" and loop.best_mean_score is not None:  # (the value best/ was kept by first; none
        # known: a best/ kept by a count, or by dgrpo before mean scores, that no later validation replaced)
        best = f"best by {metric} {loop.best_mean_score:.4f} ({100 * loop.best_accuracy:.2f}%) at step {loop.best_step}"
    validation = "not validated"
    if loop.last_eval is not None:
        final = f"final {100 * loop.last_eval:.2f}%"
        if metric != "accuracy" and loop.last_mean_score is not None:
            final = f"final {metric} {loop.last_mean_score:.4f} ({100 * loop.last_eval:.2f}%)"
        validation = (
            f"validation: {best}, {final}" if kept else f"validation: {final} (no best/: {unkept or 'none kept'})"
        )
    wall = f"{time.time() - loop.started:.0f} s" + (
        f" (this process, resumed at step {run.resumed_step})" if run.resumed_step is not None else ""
    )
    idle = (  # (a short run never reached the warning of 10 skipped steps in a row: '3 of 3 steps skipped' alone)
        ": no step updated the model (metrics.jsonl's reward_mean and frac_groups_kept say why: rewards all equal, "
        "or group accuracies outside grpo.alpha_min / alpha_max)"
        if steps and loop.skipped >= steps
        else ""
    )
    skipped = f"{loop.skipped} of {steps} steps skipped (every group filtered out){idle}"
    run.log(f"dgrpo grpo: done in {wall}; {validation}; {skipped}")
    return summary


def _extra_models(trainer: GRPOTrainer) -> dict[str, Any] | None:
    return {"ref": trainer.ref.checkpoint_state} if trainer.ref is not None else None


def _periodic_eval(
    run: RunDir,
    trainer: GRPOTrainer,
    loop: LoopState,
    valid: dict[str, list[Record]],
    evaluate_fn: Callable[[LatentLM, list[Record]], int | EvalResult] | None,
) -> Callable[[int], float | None]:
    """``evaluate(step)``: greedy accuracy (and mean score, when ``evaluate_fn`` gives it) on every validation set
    (one metrics row); keeps ``best/`` by the first, by ``grpo.best_metric``; returns the first's accuracy."""
    lm, g = trainer.lm, trainer.cfg.grpo

    def evaluate(step: int) -> float | None:
        if not valid or evaluate_fn is None:
            return None
        row: dict = {"step": step}
        by_set = {
            name: sharded_scores(trainer.dist, lambda local: evaluate_fn(lm, local), recs)
            for name, recs in valid.items()
        }
        first = next(iter(by_set.values()))
        value = best_value(first, g.best_metric, "grpo.best_metric") if g.save_best else None  # (refused before a row)
        row.update({f"eval/{name}/{k}": v for name, scores in by_set.items() for k, v in scores.items()})
        run.metrics.write(row)
        loop.last_mean_score = first.get("mean_score")
        if value is not None and step >= g.warmup_steps and value > _best_so_far(loop, g.best_metric):
            loop.best_step, loop.best_accuracy, loop.best_mean_score = step, first["accuracy"], first.get("mean_score")
            trainer.dist.save_model(lm, run.out_dir / BEST_DIR)  # every rank calls it (FSDP gathers); rank 0 writes
        return first["accuracy"]

    return evaluate


def _best_so_far(loop: LoopState, metric: str) -> float:
    """The ``metric`` value of the run's ``best/`` (-1: none, or not known: a checkpoint's best chosen by a count, or
    by dgrpo before mean scores, is replaced at the next validation)."""
    value = loop.best_accuracy if metric == "accuracy" else loop.best_mean_score
    return -1.0 if loop.best_step is None or value is None else value


def _save_resumable(run: RunDir, trainer: GRPOTrainer, loop: LoopState) -> None:
    """A resumable checkpoint: rank 0 writes it (under FSDP2 every rank first gathers the model's and the
    optimizer's state to it)."""
    staging = shard_staging(run.out_dir, trainer.step_idx)
    fsdp_state = trainer.dist.training_state(trainer.lm.model, trainer.opt, staging)
    if not trainer.dist.is_main:
        return
    save_checkpoint(
        run.out_dir,
        trainer.step_idx,
        lm=trainer.lm,
        optimizer=trainer.opt,
        keep_last=trainer.cfg.grpo.keep_last,
        extra_models=_extra_models(trainer),
        state={
            "trainer": trainer.state(),
            "loop": _loop_record(loop),
            "metrics_lines": run.metrics.n_rows(),
            "best": run.best_record(),
        },
        fsdp_state=fsdp_state,
    )
