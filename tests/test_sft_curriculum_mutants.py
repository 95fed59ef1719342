"""Small hand-checked tests of the SFT curriculum's run (``dgrpo.training.sft``), a second pass after
test_sft_mutants.py: each fails on a mutant of sft.py that the rest of the fast tier let through (pause under
uniform_prob, a fresh run's first schedule without resets, the micro-batches of grad_accum, the loss and stage a
step's row logs, the split each epoch is validated on, the best value a resumed run starts from)."""

import random
from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from dgrpo.data.records import Record
from dgrpo.training import sft as sft_module
from dgrpo.training.curriculum import Curriculum, Progress, make_example
from dgrpo.training.distributed import Dist
from dgrpo.training.sft import SFTRun

from conftest import faked_sft_run, sft_run_between_steps, tiny_config

#: a made-up problem of 4 steps (no dataset row)
FOUR_STEPS = Record("Ann has 3 bags of 4 apples, eats 2 and gives half away. How many?", ["a", "b", "c", "d"], "5")


def test_pause_mixes_stages_under_uniform_prob():
    """sft.uniform_prob applies to pause as to coconut (its warning and help name coconut, pause, no_curriculum):
    a 4-step chain at stage 0 with uniform_prob 1 (c 2, max_latent_stage 3) is laid out at a stage drawn from 0 to 4:
    0, 2, 4 or 6 pause tokens, not always stage 0's none."""
    cfg = tiny_config(**{"sft.mode": "pause", "sft.uniform_prob": 1.0, "sft.c_thought": 2, "sft.max_latent_stage": 3})
    rng = random.Random(0)
    assert {make_example(FOUR_STEPS, 0, cfg, rng).n_latent for _ in range(100)} == {0, 2, 4, 6}


def fresh_run(monkeypatch, cfg, n_train: int = 8) -> SFTRun:
    """An SFTRun started fresh (no checkpoint), with the run directory, the model and the kernels faked."""
    return faked_sft_run(monkeypatch, cfg, [FOUR_STEPS] * n_train)


def test_a_fresh_run_without_resets_makes_its_one_schedule_at_its_first_epoch(monkeypatch):
    """sft.reset_optimizer=false, 4 epochs of 2 steps (8 examples, batch 4): the first epoch's start makes the
    run's optimizer and its one lr schedule, 8 steps long (kept from the start, the schedule was 0 steps long: every
    step past the warmup at lr 0); the next stage's start keeps both."""
    cfg = tiny_config(**{"sft.reset_optimizer": "false", "sft.batch_size": 4, "sft.num_epochs": 4})
    run = fresh_run(monkeypatch, cfg)
    assert run.opt is None and run.plan.steps_per_epoch == 2
    run.enter_stage(0)
    first = run.opt
    assert first is not None and (run.prog.sched_total, run.prog.step_in_sched) == (8, 0)
    run.prog.step_in_sched = 4
    run.enter_stage(1)
    assert run.opt is first and (run.prog.sched_total, run.prog.step_in_sched) == (8, 4)


def between_steps(cfg, dist: Dist | None = None) -> SFTRun:
    """conftest's SFTRun between steps, its schedule 8 steps long and an optimizer made."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))])
    return sft_run_between_steps(cfg, dist=dist, prog=Progress(sched_total=8), opt=opt)


def test_a_steps_row_logs_its_epoch_stage_and_the_loss_summed_over_the_ranks(monkeypatch):
    """A step's metrics row: its epoch and stage as given (epoch 3 of stage 1), and the loss summed over the ranks
    (each rank's share is its NLL over the global token count: the sum is the batch's mean NLL; faked here by a
    second rank with the same loss, 0.25 + 0.25)."""
    monkeypatch.setattr(sft_module, "sft_step", lambda *a: (0.25, 1.0, True))
    twin = Dist.single()
    twin.sum_float = lambda x: 2 * x
    row, applied = between_steps(tiny_config(), twin).step([], 3, 1, 0.0)
    assert applied and (row["epoch"], row["stage"], row["loss"], row["step"]) == (3, 1, 0.5, 1)


def test_a_step_splits_its_batch_into_grad_accum_micro_batches(monkeypatch):
    """sft.grad_accum 4 over a batch of 6: micro-batches of ceil(6 / 4) = 2 examples, 3 of them (never more than
    grad_accum: 6 micro-batches of 1 ran each example's forward alone), each normalised by the batch's 60 tokens."""
    from dgrpo.training.curriculum import SFTExample
    from dgrpo.training.sft import sft_step

    seen = []
    weight = torch.nn.Parameter(torch.ones(1))

    def loss(lm, examples, cfg, normalizer):
        seen.append((len(examples), normalizer))
        return weight.sum() * len(examples), 10 * len(examples)

    monkeypatch.setattr(sft_module, "sft_loss", loss)
    monkeypatch.setattr(sft_module, "count_target_tokens", lambda lm, examples, cfg: 10 * len(examples))
    cfg = tiny_config(**{"sft.grad_accum": 4, "sft.bf16": "false"})
    lm = SimpleNamespace(device=torch.device("cpu"), model=torch.nn.Linear(1, 1))
    batch = [SFTExample("q", 0, "t")] * 6
    opt = torch.optim.SGD([weight], lr=0.0)
    total, _, finite = sft_step(lm, opt, [weight], batch, cfg, Dist.single(), 0.0)
    assert finite and seen == [(2, 60)] * 3 and total == 6.0


class Stopped(Exception):
    """A run's stop after a step (SFTRun.stop_after_step, faked)."""


def epoch_ends(monkeypatch, cfg, best_so_far: float = -1.0, sigterm: bool = False, lm=None) -> list[tuple]:
    """What train_sft's epoch ends are given (the run's files, SFTRun and the validations faked): each validation's
    records and each best/ decision's best value so far; the run's records are ``TRAIN`` and its validation set
    ``VALID`` (other lists), the resumed best value ``best_so_far``. ``sigterm``: a SIGTERM is asked about from the
    start (each save and the stop recorded too). ``lm``: the model given (a fake by default)."""
    calls: list[tuple] = []

    class Run:
        def __init__(self, lm, cfg, dist, run, train):
            self.plan, self.prog = Curriculum(cfg, steps_per_epoch=2), Progress()
            self.t0, self.best_rows_from = 0.0, 0
            self.run = SimpleNamespace(metrics=SimpleNamespace(n_rows=lambda: 0))

        def enter_stage(self, stage):
            pass

        def train_epoch(self, *a):
            pass

        def save(self, epoch, batch):
            if sigterm:
                calls.append(("save", epoch, batch))

        def stop_after_step(self, error):
            calls.append(("stop", error))
            raise Stopped

        def finish(self, t0, final_eval=None):
            pass

    def finish_stage(lm, stage, cfg, run, dist, valid, *a):
        calls.append(("stage end", stage, valid))
        return {"accuracy": 0.5}

    def validate_epoch(lm, stage, epoch, cfg, run, dist, valid, *a):
        calls.append(("valid", epoch, valid))
        return {"accuracy": 0.5}

    def keep_if_best(lm, stage, epoch, scores, best, *a):
        calls.append(("best?", epoch, best))
        return best

    monkeypatch.setattr(sft_module, "_prepare", lambda lm, train, cfg, out, valid, fn, dist: (cfg, Dist.single(), fn))
    monkeypatch.setattr(sft_module, "RunDir", lambda *a, **kw: nullcontext(SimpleNamespace()))
    monkeypatch.setattr(sft_module, "SFTRun", Run)
    monkeypatch.setattr(sft_module, "_resumed_best", lambda *a: best_so_far)
    monkeypatch.setattr(sft_module, "_finish_stage", finish_stage)
    monkeypatch.setattr(sft_module, "_validate_epoch", validate_epoch)
    monkeypatch.setattr(sft_module, "_keep_if_best", keep_if_best)
    monkeypatch.setattr(sft_module, "stop_requested", lambda dist: sigterm)
    lm = lm or SimpleNamespace(train=lambda: None)
    try:
        sft_module.train_sft(lm, TRAIN, cfg, Path("unused"), valid=VALID, evaluate_fn=lambda *a: 1, progress=False)
    except Stopped:
        calls.append(("stopped",))
    return calls


TRAIN, VALID = [FOUR_STEPS] * 3, [FOUR_STEPS] * 2


def test_every_epoch_is_validated_on_the_validation_set_and_best_goes_on_from_the_resumed_value(monkeypatch):
    """sft.eval_every_epoch, 3 epochs of stages 0, 0, 1 (max_latent_stage 0: stage 1 is the all-latent layout): epoch
    0 within stage 0 and each stage's end are validated on data.valid, never on the training records; best/ is
    decided at epoch 2 only, from the resumed run's best value (0.75: started from -1, a worse epoch replaced the
    resumed best/)."""
    sets = {"sft.num_epochs": 3, "sft.epochs_per_stage": 2, "sft.max_latent_stage": 0, "sft.eval_every_epoch": "true"}
    calls = epoch_ends(monkeypatch, tiny_config(**sets), best_so_far=0.75)
    assert [c[:2] for c in calls] == [("valid", 0), ("stage end", 0), ("stage end", 1), ("best?", 2)]
    assert all(c[2] is VALID for c in calls[:3]) and calls[3][2] == 0.75


def test_a_resumed_run_starts_from_its_last_best_rows_value(tmp_path):
    """The best value a resumed run goes on from: the last ``best_epoch`` row's (0.75, not the first's 0.5) by
    sft.best_metric (mean_score: 0.6), among the rows from ``rows_from`` on; -1 (any epoch may keep best/) when
    those rows hold none or when best/ is not in the run directory."""
    from dgrpo.training.sft import _resumed_best

    rows = [
        {"step": 4, "loss": 1.0},
        {"step": 4, "best_epoch": 1, "best/valid/accuracy": 0.5},
        {"step": 8, "best_epoch": 3, "best/valid/accuracy": 0.75, "best/valid/mean_score": 0.6},
    ]
    run = SimpleNamespace(out_dir=tmp_path, metrics=SimpleNamespace(rows=lambda: rows))
    dist = Dist.single()
    assert _resumed_best(run, dist, 0) == -1.0  # (no best/ folder)
    (tmp_path / "best").mkdir()
    assert [_resumed_best(run, dist, k) for k in range(4)] == [0.75, 0.75, 0.75, -1.0]
    assert _resumed_best(run, dist, 0, "mean_score") == 0.6


def test_the_runs_end_names_only_a_best_row_from_the_resumed_rows_on(tmp_path):
    """finish() names best/'s epoch from the rows past ``best_rows_from`` (a rewound run's best/ was removed: the
    abandoned run's best_epoch row before that is not best/): with best_rows_from past it, no best epoch."""
    cfg = tiny_config(**{"sft.num_epochs": 2, "sft.epochs_per_stage": 1})
    run = between_steps(cfg)
    run.lm = SimpleNamespace(settings=None, eval=lambda: None, stopped_run="x")
    rows = [{"step": 2, "best_epoch": 1, "best/valid/accuracy": 0.5}, {"step": 4, "stage": 1}]
    named = []
    run.run = SimpleNamespace(
        out_dir=tmp_path,
        metrics=SimpleNamespace(rows=lambda: rows),
        final_eval=lambda final_eval, lm, step, best: named.append(best),
        resumed_step=4,
        log=lambda line: None,
    )
    run.dist.save_model = lambda lm, path: None
    run.opt, run.applied = None, lambda opt: {}
    for rows_from, best in ((0, 1), (1, None)):
        run.best_rows_from = rows_from
        run.lm.stopped_run = "out"
        run.finish(0.0)
        assert named.pop() == best and run.lm.stopped_run is None  # (a finished run's weights may start another)


def test_a_resume_that_drops_a_stale_best_reads_best_rows_from_its_checkpoints_rows_on(monkeypatch):
    """A resumed run whose best/ was written after its checkpoint (removed: drop_stale_best) chooses best/ anew from
    the checkpoint's metrics rows on (its metrics_lines, 5); a best/ still the checkpoint's keeps every row (0).
    Its clock goes on from the checkpoint's 100 s trained (the rows' time_s count the run's time, not the process's)."""
    import time
    from dataclasses import asdict

    cfg = tiny_config(**{"sft.batch_size": 1, "sft.num_epochs": 4})
    saved = Progress(epoch=2, batch=0, global_step=4, step_in_sched=4, sched_total=4, stage_prev=1)
    state = {"progress": asdict(saved), "nonfinite_skips": 0, "metrics_lines": 5, "time_s": 100.0}
    froms, loaded = [], SimpleNamespace(apply=lambda lm, opt, dist: state)
    for stale in (True, False):
        run = fresh_run(monkeypatch, cfg, n_train=2)  # (its run directory replaced below, before __init__ again)
        run.run.resume, run.run.drop_stale_best = (lambda read: loaded), (lambda state, stale=stale: stale)
        SFTRun.__init__(run, run.lm, cfg, run.dist, run.run, [FOUR_STEPS] * 2)
        froms.append(run.best_rows_from)
        assert 100.0 <= time.time() - run.t0 < 150.0
    assert froms == [5, 0]


def test_a_best_metric_the_validation_lacks_is_refused_at_the_first_validation():
    """sft.best_metric=mean_score with an evaluate_fn that returns a count: refused at the run's first validation
    (epoch 0 of stage 0, long before an epoch of the final layout could keep best/), before its row is written."""
    from dgrpo.config import ConfigError
    from dgrpo.training.sft import _validate_epoch

    cfg = tiny_config(**{"sft.eval_every_epoch": "true", "sft.best_metric": "mean_score"})
    lm, rows = SimpleNamespace(settings=None, eval=lambda: None, train=lambda: None), []
    run = SimpleNamespace(metrics=SimpleNamespace(write=rows.append))
    with pytest.raises(ConfigError, match="sft.best_metric=mean_score"):
        _validate_epoch(lm, 0, 0, cfg, run, Dist.single(), VALID, lambda *a: 1, 2, 0.0)
    assert rows == []


def test_an_epoch_ends_failure_keeps_its_training_to_resume_at_that_epochs_end():
    """An error in epoch 2's end before it wrote a row (a failing scorer): a checkpoint that resumes at epoch 2's
    end (batch = the epoch's 4 steps: its validation, stage-K/ and best/ done on the resume, not skipped as a resume
    at epoch 3's start would), then the error itself; an error after the end wrote a row saves nothing (the row would
    be written twice)."""
    from dgrpo.training.sft import _epoch_kept_on_failure

    saves, rows = [], [1, 2]
    sft = SimpleNamespace(
        dist=Dist.single(),
        plan=Curriculum(tiny_config(), steps_per_epoch=4),
        save=lambda epoch, batch: saves.append((epoch, batch)),
        run=SimpleNamespace(
            metrics=SimpleNamespace(n_rows=lambda: len(rows)), out_dir=Path("out"), log=lambda line: None
        ),
    )
    with pytest.raises(RuntimeError, match="scorer"), _epoch_kept_on_failure(sft, 2):
        raise RuntimeError("scorer failed")
    assert saves == [(2, 4)]
    with pytest.raises(ValueError, match="scorer"), _epoch_kept_on_failure(sft, 3):
        rows.append(3)
        raise ValueError("scorer failed")
    assert saves == [(2, 4)]


def test_targets_are_checked_for_their_cut_at_the_runs_first_stage():
    """The targets' cut is checked as the run's first epoch writes them: a run that starts at stage 1
    (sft.stage_epochs=[0], as from a CoT checkpoint) writes 3 of the 4 steps, 12 characters here (one token a
    character), within a limit of 13 (with EOS): nothing is said; from stage 0 (15 with EOS) it is warned of."""
    import warnings

    from dgrpo.training.sft import _warn_if_targets_cut

    rec = Record("q", ["a", "b", "c", "d"], "5")  # stage 0 writes "a\nb\nc\nd\n#### 5" (14), stage 1 "b\nc\nd\n#### 5"
    lm = SimpleNamespace(token_ids=lambda texts: [list(t) for t in texts])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _warn_if_targets_cut(lm, [rec], tiny_config(**{"sft.stage_epochs": "[0]", "data.max_target_tokens": 13}))
    with pytest.warns(UserWarning, match="^1 of 1 training targets .* at stage 0"):
        _warn_if_targets_cut(lm, [rec], tiny_config(**{"data.max_target_tokens": 13}))


def test_a_warmup_as_long_as_the_schedule_is_warned_of():
    """sft.warmup_steps equal to a schedule's steps (8 examples, batch 4: 2 steps an epoch; reset_every epoch: a
    schedule of 2 steps): the lr reaches sft.lr at the schedule's last step only, warned of; one step shorter, not."""
    from dgrpo.training.sft import _warmup_line

    sets = {"sft.batch_size": 4, "sft.reset_every": "epoch", "sft.lr": 0.5}
    line = _warmup_line(8, tiny_config(**sets, **{"sft.warmup_steps": 2}))
    assert line.startswith("sft.warmup_steps=2 is not below the 2 optimizer steps of an epoch's lr schedule")
    assert "reaches sft.lr=0.5 at its last step only" in line
    assert _warmup_line(8, tiny_config(**sets, **{"sft.warmup_steps": 1})) == ""


def test_the_targets_checked_are_evenly_spaced_over_a_large_training_set():
    """At most ``check_at_most`` targets are tokenized, evenly spaced over the training set (every second of 4 at
    2: the third is too long and found), not its first ones (which missed it)."""
    from dgrpo.training.sft import _warn_if_targets_cut

    short, long = Record("q", [], "5"), Record("q", ["a long step"], "5")
    lm = SimpleNamespace(token_ids=lambda texts: [list(t) for t in texts])
    with pytest.warns(UserWarning, match=r"^1 of 2 training targets \(checked: 2, evenly spaced over 4\)"):
        _warn_if_targets_cut(lm, [short, short, long, short], tiny_config(**{"data.max_target_tokens": 8}), 2)


def test_a_warmup_past_the_shortest_stage_names_that_stage_or_the_runs_schedule():
    """stage_epochs [3, 1] (2 steps an epoch): the shortest stage's schedule is stage 1's 2 steps, not stage 0's 6
    (a warmup of 4 never reaches sft.lr there, peaking at 0.5 * 2 / 4 = 0.25); without resets the one schedule is
    the run's 8 steps (4 epochs), named as the run's."""
    from dgrpo.training.sft import _warmup_line

    sets = {"sft.batch_size": 4, "sft.stage_epochs": "[3, 1]", "sft.num_epochs": 4, "sft.lr": 0.5}
    line = _warmup_line(8, tiny_config(**sets, **{"sft.warmup_steps": 4}))
    assert line.startswith("sft.warmup_steps=4 is not below the 2 optimizer steps of the shortest stage's lr schedule")
    assert "never reaches sft.lr=0.5 there (it peaks at 0.25)" in line
    line = _warmup_line(8, tiny_config(**sets, **{"sft.warmup_steps": 8, "sft.reset_optimizer": "false"}))
    assert line.startswith("sft.warmup_steps=8 is not below the 8 optimizer steps of the run's lr schedule")


def test_without_resets_reset_every_epoch_still_has_one_schedule_for_the_run():
    """sft.reset_optimizer=false with reset_every=epoch (warned of: it changes nothing): the lr schedule is still
    the run's 4 epochs of 3 steps, 12, not an epoch's 3."""
    cfg = tiny_config(**{"sft.reset_optimizer": "false", "sft.reset_every": "epoch", "sft.num_epochs": 4})
    assert [Curriculum(cfg, steps_per_epoch=3).schedule_length(k) for k in (0, 1)] == [12, 12]


def test_data_with_steps_in_some_records_is_not_said_to_have_none():
    """The line about training data without reasoning steps is said only when no record has steps: one record with
    steps among records without them is data with steps (the others are written as no_cot would)."""
    from dgrpo.training.sft import _no_steps_line

    cfg = tiny_config()
    assert _no_steps_line([Record("q", [], "1"), FOUR_STEPS], cfg) == ""
    assert _no_steps_line([Record("q", [], "1")], cfg).startswith("none of the 1 training records has reasoning steps")


def test_an_out_of_memory_step_suggests_the_next_grad_accum_dividing_the_batch():
    """An SFT step out of memory at batch_size 4, grad_accum 2: the next grad_accum that divides the batch is 4
    itself (micro-batches of one example), suggested (not the bare why, as when nothing is left to try)."""
    from dgrpo.training.memory import MARK
    from dgrpo.training.wording import command_line_words

    run = object.__new__(SFTRun)
    run.cfg = tiny_config(**{"sft.batch_size": 4, "sft.grad_accum": 2})
    try:
        with command_line_words(), run._oom_advice():
            raise torch.OutOfMemoryError("CUDA out of memory.")
    except torch.OutOfMemoryError as e:
        said = str(e)
    assert f"{MARK} in the SFT step at sft.grad_accum=2: try --set sft.grad_accum=4 (" in said


def test_a_checkpoint_records_where_to_resume_and_the_rows_written_before_it(monkeypatch):
    """SFTRun.save(3, 0): the state resumes at epoch 3, batch 0 with the run's progress otherwise (its global step
    and schedule), and records the metrics rows written so far (7: a rewound resume chooses best/ from there on)."""
    saved = {}
    monkeypatch.setattr(sft_module, "save_checkpoint", lambda out, step, **kw: saved.update(step=step, **kw["state"]))
    monkeypatch.setattr(sft_module, "shard_staging", lambda out, step: None)
    run = between_steps(tiny_config())
    run.prog = Progress(epoch=1, batch=2, global_step=12, step_in_sched=4, sched_total=8, stage_prev=1)
    run.dist.training_state = lambda model, opt, staging: None
    run.lm, run.t0, run.data_fingerprint = SimpleNamespace(model=None), 0.0, "data"
    run.run = SimpleNamespace(out_dir=Path("out"), metrics=SimpleNamespace(n_rows=lambda: 7), best_record=lambda: None)
    run.save(3, 0)
    assert saved["step"] == 12 and saved["metrics_lines"] == 7 and saved["train_data"] == "data"
    assert saved["progress"] == {
        **{"epoch": 3, "batch": 0, "global_step": 12},
        **{"step_in_sched": 4, "sched_total": 8, "stage_prev": 1},
    }


@pytest.mark.filterwarnings("ignore:sft.(batch_size|warmup_steps)")
def test_what_cannot_train_is_refused_before_the_run_directory_is_made(tmp_path):
    """Refused before anything is written: a batch of 1 shared by 2 processes (a rank without an example), and a last
    stage whose latent thoughts alone overflow the model's context (c_thought 10,000: found at the start, not when
    stage 1's first batch overflowed, a whole stage 0 trained and saved before)."""
    from dgrpo.config import ConfigError
    from dgrpo.data.synthetic import generate_split
    from dgrpo.model.factory import load_model
    from dgrpo.training.sft import train_sft

    cfg = tiny_config(**{"sft.num_epochs": 2, "sft.epochs_per_stage": 1, "sft.batch_size": 1})
    lm, out = load_model(cfg.model, cfg.task, seed=0), tmp_path / "sft"
    train = generate_split(cfg.task, "train")[:4]
    with pytest.raises(ConfigError, match="sft.batch_size: 1 example cannot be shared by 2 processes"):
        train_sft(lm, train, cfg, out, dist=Dist(world_size=2), log=lambda *a: None, progress=False)
    cfg = tiny_config(**{"sft.num_epochs": 2, "sft.epochs_per_stage": 1, "sft.c_thought": 10_000})
    with pytest.raises(ConfigError, match="sft.c_thought"):
        train_sft(lm, train, cfg, out, log=lambda *a: None, progress=False)
    assert not out.exists()


def test_a_sigterm_during_an_epochs_end_stops_after_its_checkpoint(monkeypatch):
    """A SIGTERM asked about at epoch 0's end (after its training; 2 epochs of one stage): the run stops right after
    the checkpoint that resumes at epoch 1 (not after training and ending epoch 1 too, past the grace period)."""
    cfg = tiny_config(**{"sft.num_epochs": 2, "sft.epochs_per_stage": 2})
    assert epoch_ends(monkeypatch, cfg, sigterm=True) == [("save", 1, 0), ("stop", None), ("stopped",)]


def test_a_run_that_trained_the_markers_rows_leaves_no_untrained_markers_to_warn_of(monkeypatch):
    """After SFT the latent markers are trained (full fine-tuning, or LoRA with model.lora.train_latent_tokens): the
    model no longer lists them as new (GRPO would warn of untrained markers); under LoRA without their rows they stay
    listed."""
    for sets, left in (
        ({"model.lora.r": 4}, []),
        ({"model.lora.r": 4, "model.lora.train_latent_tokens": "false"}, ["L"]),
    ):
        lm = SimpleNamespace(train=lambda: None, new_latent_tokens=["L"])
        epoch_ends(monkeypatch, tiny_config(**{"sft.num_epochs": 1, **sets}), lm=lm)
        assert lm.new_latent_tokens == left


def test_an_epochs_training_marks_the_model_as_a_run_under_way(monkeypatch):
    """From an epoch's training on, the model holds a run's mid-way weights (``lm.stopped_run``: a new run started
    afresh from it is refused until this one's end clears it), even for an epoch resumed at its end."""
    run = between_steps(tiny_config())
    run.lm = SimpleNamespace(stopped_run=None)
    run.run = SimpleNamespace(out_dir=Path("out"))
    monkeypatch.setattr(sft_module, "stop_requested", lambda dist: False)
    run.train_epoch([FOUR_STEPS] * 4, 0, 0, 4, SimpleNamespace(), 0.0)
    assert run.lm.stopped_run == "out"
