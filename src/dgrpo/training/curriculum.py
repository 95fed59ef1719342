"""The Coconut curriculum: which stage an epoch trains (stage k replaces the first k reasoning steps by k*c continuous
thoughts; past ``max_latent_stage`` all steps are dropped: Coconut, Hao et al. 2024, Sec. 3), the example each record
makes at a stage, the settings a stage's checkpoint answers with, and the run's epochs, stages and lr schedules."""

from __future__ import annotations

import functools
import random
from collections import Counter
from dataclasses import dataclass

from ..config import Config
from ..data.records import Record
from ..model.latent_lm import LatentSettings


@dataclass
class SFTExample:
    question: str
    n_latent: int
    target: str  # remaining steps + answer (EOS is appended by the tokenizer step)


def format_target(steps: list[str], answer: str) -> str:
    """The written part after ``<|end-latent|>``: one step per line, then ``#### answer``."""
    return "".join(s + "\n" for s in steps) + f"#### {answer}"


def curriculum_stage(epoch: int, stage_epochs: list[int], epochs_per_stage: int) -> int:
    """The curriculum stage of ``epoch``: stage k takes ``stage_epochs[k]`` epochs, every stage past the list
    ``epochs_per_stage`` (an empty list is Coconut's rule, stage = epoch // epochs_per_stage)."""
    for stage, n in enumerate(stage_epochs):
        if epoch < n:
            return stage
        epoch -= n
    return len(stage_epochs) + epoch // epochs_per_stage


def stage_of_epoch(epoch: int, cfg: Config) -> int:
    s = cfg.sft
    if s.mode in ("cot", "no_cot"):
        return 0
    if s.mode == "no_curriculum":  # the final stage from the first epoch on
        epoch = s.num_epochs - 1
    return curriculum_stage(epoch, s.stage_epochs, s.epochs_per_stage)


def layout_stage(stage: int, cfg: Config) -> int:
    """The stage whose latent layout ``stage`` trains: past ``max_latent_stage`` every stage drops all steps, so
    they are one layout (``max_latent_stage + 1``)."""
    return min(stage, cfg.sft.max_latent_stage + 1)


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
    if (
        cfg.sft.uniform_prob > 0
        and cfg.sft.mode in ("coconut", "pause", "no_curriculum")
        and rng.random() < cfg.sft.uniform_prob
    ):
        stage = rng.randint(0, len(rec.steps))
    skip, n_lat = latent_layout(stage, len(rec.steps), cfg)
    return SFTExample(rec.question, n_lat, format_target(rec.steps[skip:], rec.answer))


def stage_settings(stage: int, cfg: Config) -> LatentSettings:
    """What a checkpoint of ``stage`` uses at inference (its latent count for a full-length chain)."""
    _, n_lat = latent_layout(stage, 10**6 if cfg.sft.pad_latent_to_max else cfg.sft.max_latent_stage, cfg)
    mode = {"no_curriculum": "coconut"}.get(cfg.sft.mode, cfg.sft.mode)
    return LatentSettings(
        mode=mode, c_thought=cfg.sft.c_thought, stage=stage, n_latent=n_lat, chat_template=cfg.data.chat_template
    )


def final_settings(cfg: Config) -> LatentSettings:
    return stage_settings(stage_of_epoch(cfg.sft.num_epochs - 1, cfg), cfg)


def epoch_steps(n_train: int, cfg: Config) -> int:
    """Optimizer steps of an epoch over ``n_train`` examples: whole batches of ``sft.batch_size`` (at least one)."""
    return max(1, n_train // cfg.sft.batch_size)


@dataclass
class Curriculum:
    """The run's epochs, stages and optimizer schedules."""

    cfg: Config
    steps_per_epoch: int

    def stage(self, epoch: int) -> int:
        return stage_of_epoch(epoch, self.cfg)

    def schedule_length(self, stage: int) -> int:
        """Optimizer steps of one lr schedule: a stage's or an epoch's (``reset_optimizer``), or the whole run's."""
        s = self.cfg.sft
        if not s.reset_optimizer:
            return s.num_epochs * self.steps_per_epoch
        if s.reset_every == "epoch":
            return self.steps_per_epoch
        return self.epochs_by_stage.get(stage, 0) * self.steps_per_epoch

    @functools.cached_property
    def epochs_by_stage(self) -> Counter[int]:
        """The epochs of each stage the run trains, counted once (a count per call made the start's warmup check
        quadratic in sft.num_epochs: 10,000 one-epoch stages took 28 s before the first step)."""
        return Counter(self.stage(e) for e in range(self.cfg.sft.num_epochs))

    def last_of_stage(self, epoch: int) -> bool:
        return epoch == self.cfg.sft.num_epochs - 1 or self.stage(epoch + 1) != self.stage(epoch)

    def epoch_order(self, epoch: int, n: int) -> list[int]:
        """The data order of an epoch: a pure function of (seed, epoch), so a resumed run sees the same batches."""
        order = list(range(n))
        random.Random(f"{self.cfg.seed}/order/{epoch}").shuffle(order)
        return order


@dataclass
class Progress:
    """Where the curriculum stands: run epoch ``epoch`` from batch ``batch`` next (saved in checkpoints)."""

    epoch: int = 0
    batch: int = 0
    global_step: int = 0
    step_in_sched: int = 0
    sched_total: int = 0
    stage_prev: int | None = None
