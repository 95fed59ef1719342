"""Small hand-checked tests of the Coconut curriculum SFT (``dgrpo.training.sft``), each written to fail on a mutant
of sft.py that the rest of the fast tier let through: the optimizer's weight decay and betas, gradient clipping, a
non-finite step dropped, gradients cleared after a step, the constant schedule's warmup, the lr schedules' lengths,
the optimizer kept without resets, the checkpoints and metrics rows within an epoch, and the stage's settings given
to its validation and its checkpoints."""

import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from dgrpo.training import sft as sft_module
from dgrpo.training.curriculum import (
    Curriculum,
    Progress,
    final_settings,
    format_target,
    make_example,
    stage_settings,
)
from dgrpo.training.distributed import Dist
from dgrpo.training.sft import new_optimizer, sft_step

from conftest import faked_sft_run, make_lm, sft_run_between_steps, tiny_config


def fake_steps(monkeypatch) -> list[float]:
    """Replace sft_step by one that only records its lr (each step finite, loss 0); returns the lrs seen."""
    seen: list[float] = []
    monkeypatch.setattr(sft_module, "sft_step", lambda lm, opt, ps, local, cfg, dist, lr: seen.append(lr) or (0, 0, 1))  # type: ignore[func-returns-value]
    return seen


def test_the_optimizer_takes_the_configs_weight_decay_and_betas():
    """AdamW with sft.weight_decay and sft.adam_betas (non-default values here: a mutant that dropped either kept
    torch's or the default config's)."""
    cfg = tiny_config(**{"sft.weight_decay": 0.05, "sft.adam_betas": "[0.8, 0.95]"})
    group = new_optimizer([torch.nn.Parameter(torch.zeros(2))], cfg).param_groups[0]
    assert (group["weight_decay"], group["betas"]) == (0.05, (0.8, 0.95))


@pytest.fixture(scope="module")
def one_step(tokenizer, task_records):
    """``step(**sets)``: one sft_step at lr 1 (an SGD made at lr 0: the step sets it) on 4 examples from fresh
    weights (``dist``: a Dist, one process by default); returns (how far the weights moved: the update's norm, the
    gradient norm it returned, whether it was applied, the parameters' grads after it)."""
    examples = {}

    def step(dist=None, **sets):
        cfg = tiny_config(**{"sft.bf16": "false", **sets})
        lm = make_lm(tokenizer)
        lm.train()
        params = [p for p in lm.model.parameters() if p.requires_grad]
        before = [p.detach().clone() for p in params]
        if "batch" not in examples:
            rng = random.Random(0)
            examples["batch"] = [make_example(rec, 1, cfg, rng) for rec in task_records[:4]]
        opt, dist = torch.optim.SGD(params, lr=0.0), dist or Dist.single()
        _, gn, finite = sft_step(lm, opt, params, examples["batch"], cfg, dist, 1)
        moved = torch.cat([(p.detach() - b).flatten() for p, b in zip(params, before, strict=True)]).norm()
        return float(moved), gn, finite, [p.grad for p in params]

    return step


def test_a_step_clips_the_gradient_to_max_grad_norm_and_clears_it(one_step):
    """SGD at lr 1: the weights move by the gradient, clipped to sft.max_grad_norm (0.01, far below its norm), by
    the whole gradient with max_grad_norm 0 (no clipping); the logged norm is the norm before clipping; the step's
    gradients are cleared after it (kept, the next step would add its gradients to them)."""
    moved, gn, finite, grads = one_step(**{"sft.max_grad_norm": 0.01})
    assert finite and gn > 0.1 and moved == pytest.approx(0.01, rel=1e-3)
    assert all(g is None for g in grads)
    moved, gn_free, _, _ = one_step(**{"sft.max_grad_norm": 0})
    assert gn_free == pytest.approx(gn, rel=1e-5) and moved == pytest.approx(gn, rel=1e-3)


def test_two_ranks_with_the_same_share_step_as_one_process(one_step):
    """Two ranks given the same 4 examples (faked: the token count and the gradients summed over a twin rank) take
    one process's step, the same gradient norm and update: each rank's NLL is over both ranks' tokens, then the
    gradients are summed over the ranks (a duplicated batch's mean NLL is the batch's)."""
    twin = Dist.single()
    twin.sum_int = lambda n: 2 * n
    twin.all_reduce_grads = lambda model: [p.grad.mul_(2) for p in model.parameters() if p.grad is not None]
    moved_1, gn_1, _, _ = one_step(**{"sft.max_grad_norm": 0})
    moved_2, gn_2, _, _ = one_step(dist=twin, **{"sft.max_grad_norm": 0})
    assert (moved_2, gn_2) == pytest.approx((moved_1, gn_1), rel=1e-5)


def test_a_step_with_a_non_finite_gradient_norm_leaves_the_weights(one_step, monkeypatch):
    """A gradient whose norm is not finite is dropped (the weights stay, the step says it was not applied)."""
    monkeypatch.setattr(sft_module, "clip_gradients", lambda params, max_norm: torch.tensor(float("nan")))
    moved, _, finite, grads = one_step()
    assert (moved, finite) == (0.0, False) and all(g is None for g in grads)


def schedule_of(cfg, monkeypatch, steps_per_epoch: int = 2) -> tuple[list[float], list[int]]:
    """(each step's lr, each epoch's optimizer numbered in order of making) over the run of ``cfg``."""
    run, seen, ids = sft_run_between_steps(cfg, steps_per_epoch=steps_per_epoch), fake_steps(monkeypatch), []
    made: list[object] = []
    for epoch in range(cfg.sft.num_epochs):
        stage = run.plan.stage(epoch)
        run.enter_stage(stage)
        if not any(run.opt is o for o in made):
            made.append(run.opt)
        ids.append(next(i for i, o in enumerate(made) if o is run.opt))
        for _ in range(steps_per_epoch):
            run.step([], epoch, stage, 0.0)
    return seen, ids


STAGES = {"sft.stage_epochs": "[1]", "sft.epochs_per_stage": 3, "sft.num_epochs": 5, "sft.lr": 1.0}


def test_each_stage_has_its_own_schedule_its_epochs_long(monkeypatch):
    """Stages 0, 1, 1, 1, 2 (stage_epochs [1], then 3 epochs a stage, the run cut after one epoch of stage 2), 2
    steps an epoch: a new optimizer per stage, whose cosine schedule is the stage's own steps long: 2, 6 and 2
    (stage 2 trains one epoch of its three), without warmup."""
    from dgrpo.training.schedules import lr_at

    lrs, optimizers = schedule_of(tiny_config(**STAGES, **{"sft.warmup_steps": 0}), monkeypatch)
    assert optimizers == [0, 1, 1, 1, 2]
    assert lrs == [lr_at(k, 1.0, n, 0) for n in (2, 6, 2) for k in range(n)]
    assert lrs[:3] + lrs[-2:] == [1.0, 0.5, 1.0, 1.0, 0.5]  # (by hand: a 2-step cosine is at 1, then halfway)


def test_without_resets_one_optimizer_and_one_schedule_span_the_run(monkeypatch):
    """sft.reset_optimizer=false: the run's 5 epochs of 2 steps are one AdamW and one cosine of 10 steps."""
    from dgrpo.training.schedules import lr_at

    lrs, optimizers = schedule_of(tiny_config(**STAGES, **{"sft.reset_optimizer": "false"}), monkeypatch)
    assert optimizers == [0] * 5
    assert lrs == [lr_at(k, 1.0, 10, 5) for k in range(10)]


def test_reset_every_epoch_with_a_constant_lr_warms_up_each_epoch(monkeypatch):
    """sft.reset_every=epoch, lr_schedule=constant, 3 warmup steps over epochs of 4 steps: a new optimizer every
    epoch, each epoch's lr 1/3, 2/3, 1, 1 (the warmup again at each reset, then constant)."""
    cfg = tiny_config(**STAGES, **{"sft.reset_every": "epoch", "sft.lr_schedule": "constant", "sft.warmup_steps": 3})
    lrs, optimizers = schedule_of(cfg, monkeypatch, steps_per_epoch=4)
    assert optimizers == [0, 1, 2, 3, 4]
    assert lrs == pytest.approx([1 / 3, 2 / 3, 1.0, 1.0] * 5)


def test_an_epochs_checkpoints_and_rows_within_it(task_records, monkeypatch):
    """12 steps of one example, sft.save_every 4: checkpoints after steps 4 and 8 of the epoch (resuming there), not
    after its last (the epoch's end saves after its validation); metrics rows at global step 10 (every 10th), the
    epoch's last step and a skipped step (5)."""
    cfg = tiny_config(**{"sft.batch_size": 1, "sft.save_every": 4})
    run, rows, saves = sft_run_between_steps(cfg, steps_per_epoch=12), [], []
    run.run = SimpleNamespace(out_dir="unused", metrics=SimpleNamespace(write=rows.append))

    def step(local, epoch, stage, t0):
        run.prog.global_step += 1
        return {"step": run.prog.global_step, "loss": 0.0}, run.prog.global_step != 5

    monkeypatch.setattr(run, "step", step)
    monkeypatch.setattr(run, "save", lambda epoch, batch: saves.append((epoch, batch)))
    bar = SimpleNamespace(update=lambda n: None, set_postfix=lambda **kw: None)
    run.train_epoch(task_records[:12], 0, 0, 0, bar, 0.0)
    assert saves == [(0, 4), (0, 8)]
    assert [r["step"] for r in rows] == [5, 10, 12]


def stage_end(tmp_path, **sets):
    """What ``_finish_stage`` at stage 1 (c_thought 2, max_latent_stage 3) of a fake model does: (the settings and
    training mode its evaluate_fn saw, the settings its stage-1/ was saved with, its metrics rows, its scores, the
    model's training mode after it). The evaluate_fn counts 3 of 4 correct."""
    from dgrpo.training.sft import _finish_stage

    cfg = tiny_config(**{"sft.c_thought": 2, "sft.max_latent_stage": 3, **sets})
    lm = SimpleNamespace(settings=None, training=True)
    lm.eval, lm.train = (lambda: setattr(lm, "training", False)), (lambda: setattr(lm, "training", True))
    seen, saved, rows = [], [], []
    dist = Dist.single()
    dist.save_model = lambda model, path: saved.append((path.name, model.settings))
    run = SimpleNamespace(out_dir=tmp_path, metrics=SimpleNamespace(write=rows.append), log=lambda line: None)

    def evaluate_fn(model, records, settings):
        seen.append((settings, model.settings, model.training))
        return 3

    scores = _finish_stage(lm, 1, cfg, run, dist, [None] * 4, evaluate_fn, 7, 0.0)
    return seen, saved, rows, scores, lm.training


def test_a_stages_end_validates_and_saves_with_the_stages_thoughts(tmp_path):
    """Stage 1's end: validated (under sft.eval_every_epoch alone too) in eval mode with stage 1's 2 thoughts, the
    model back in training mode after; stage-1/ saved with those settings, validated or not."""
    want = stage_settings(1, tiny_config(**{"sft.c_thought": 2, "sft.max_latent_stage": 3}))
    assert (want.stage, want.n_latent) == (1, 2)
    seen, saved, rows, scores, training = stage_end(
        tmp_path, **{"sft.eval_each_stage": "false", "sft.eval_every_epoch": "true"}
    )
    assert seen == [(want, want, False)] and training and scores == {"accuracy": 0.75}
    assert saved == [("stage-1", want)] and rows[0]["eval/valid/accuracy"] == 0.75 and rows[0]["n_latent"] == 2
    seen, saved, rows, scores, _ = stage_end(tmp_path, **{"sft.eval_each_stage": "false"})
    assert (seen, scores, saved) == ([], None, [("stage-1", want)])


def test_an_epochs_validation_within_a_stage_uses_that_stages_thoughts():
    """sft.eval_every_epoch within stage 1 of a run that ends at stage 3 (c_thought 2): the validation answers with
    stage 1's 2 thoughts, not the final stage's 6."""
    from dgrpo.training.sft import _validate_epoch

    sets = {"sft.c_thought": 2, "sft.max_latent_stage": 3, "sft.epochs_per_stage": 2, "sft.num_epochs": 8}
    cfg = tiny_config(**sets, **{"sft.eval_every_epoch": "true"})
    assert final_settings(cfg).n_latent == 6
    lm = SimpleNamespace(settings=None, eval=lambda: None, train=lambda: None)
    seen, rows = [], []
    run = SimpleNamespace(metrics=SimpleNamespace(write=rows.append))
    evaluate_fn = lambda model, records, settings: seen.append(settings.n_latent) or 1  # noqa: E731
    assert _validate_epoch(lm, 1, 2, cfg, run, Dist.single(), [None] * 2, evaluate_fn, 9, 0.0) == {"accuracy": 0.5}
    assert seen == [2] and (rows[0]["stage"], rows[0]["epoch"], rows[0]["n_latent"]) == (1, 2, 2)


def test_best_is_kept_on_a_higher_value_only_with_its_stages_settings(tmp_path):
    """best/: an epoch whose validation ties the best so far is not kept (the earlier epoch stays); a higher one is,
    saved with its stage's settings (the model's settings before were another stage's)."""
    from dgrpo.training.sft import _keep_if_best

    cfg = tiny_config(**{"sft.c_thought": 2, "sft.max_latent_stage": 3, "sft.eval_every_epoch": "true"})
    lm, saved, rows = SimpleNamespace(settings=stage_settings(0, cfg)), [], []
    dist = Dist.single()
    dist.save_model = lambda model, path: saved.append((path.name, model.settings.stage))
    run = SimpleNamespace(out_dir=tmp_path, metrics=SimpleNamespace(write=rows.append), log=lambda line: None)
    assert _keep_if_best(lm, 4, 5, {"accuracy": 0.5}, 0.5, cfg, run, dist, 30) == 0.5
    assert saved == [] and rows == []
    assert _keep_if_best(lm, 4, 6, {"accuracy": 0.75}, 0.5, cfg, run, dist, 36) == 0.75
    assert saved == [("best", 4)] and rows == [{"step": 36, "best_epoch": 6, "best/valid/accuracy": 0.75}]


def test_a_stages_new_optimizer_goes_on_from_the_last_ones_float32_masters():
    """model.master_weights: the AdamW a stage boundary makes starts from the previous one's float32 master weights
    (made afresh, they would be the bf16 weights again: the stage's updates below bf16's spacing lost)."""
    cfg = tiny_config(**{"model.dtype": "bfloat16", "model.master_weights": "true", "sft.num_epochs": 4})
    run = sft_run_between_steps(cfg)
    run.params = [torch.nn.Parameter(torch.ones(2, dtype=torch.bfloat16))]
    run.enter_stage(0)
    first, master = run.opt, torch.tensor([1.0001, 0.9999])
    assert first is not None
    first.state[run.params[0]]["master"] = master
    run.enter_stage(1)
    assert run.opt is not first and run.opt.state[run.params[0]]["master"] is master


def test_a_steps_loss_is_the_mean_nll_of_its_target_tokens(tokenizer, task_records):
    """sft_step's loss is the batch's summed NLL over its target tokens' count: each target's tokens with its EOS,
    a target cut at data.max_target_tokens (20) counted as 20 (a count of more, or fewer, tokens scaled every step's
    gradient). Stages 0-3 of 4 problems: ragged targets, 0-3 latent thoughts."""
    from dgrpo.training.sft import sft_loss

    sets = {"sft.bf16": "false", "sft.max_latent_stage": 3, "sft.grad_accum": 2, "data.max_target_tokens": 20}
    cfg = tiny_config(**sets)
    lm = make_lm(tokenizer)
    batch = [make_example(rec, k, cfg, random.Random(0)) for k, rec in enumerate(task_records[:4])]
    lengths = [len(ids) + 1 for ids in lm.token_ids([ex.target for ex in batch])]
    assert max(lengths) > 20 > min(lengths)
    n_tokens = sum(min(n, 20) for n in lengths)
    with torch.no_grad():
        total, counted = sft_loss(lm, batch, cfg, normalizer=1.0)
    assert counted == n_tokens
    params = [p for p in lm.model.parameters() if p.requires_grad]
    loss, _, _ = sft_step(lm, torch.optim.SGD(params, lr=0.0), params, batch, cfg, Dist.single(), 0.0)
    assert loss == pytest.approx(float(total) / n_tokens, rel=1e-5)


def test_a_tiny_runs_stage_checkpoints_final_and_validations(tmp_path):
    """A whole run of stages 0, 0, 1, 2, 3 (one step an epoch; max_latent_stage 1, c_thought 2): stage-0/ ..
    stage-3/ each with its own stage and thoughts (0, 2, 2, 2: stages 2 and 3 are past max_latent_stage, their own
    folders), final/ stage 3's; one validation at each stage's end, with that stage's settings, and no best/ (that
    is sft.eval_every_epoch's, as is a validation of stage 0's first epoch); the last checkpoint resumes after the
    last epoch (epoch 5, batch 0). Its 8 examples are one batch of sft.batch_size 8: no warning of a batch larger
    than the data."""
    import json
    import warnings

    from dgrpo.data.synthetic import generate_split
    from dgrpo.model.factory import load_model
    from dgrpo.training.sft import train_sft

    sets = {
        "task.n_train": 8,
        "sft.batch_size": 8,
        "sft.num_epochs": 5,
        "sft.stage_epochs": "[2]",
        "sft.epochs_per_stage": 1,
    }
    cfg = tiny_config(**sets, **{"sft.max_latent_stage": 1, "sft.c_thought": 2, "sft.warmup_steps": 0})
    lm, train, seen = load_model(cfg.model, cfg.task, seed=0), generate_split(cfg.task, "train"), []
    evaluate_fn = lambda model, records, settings: seen.append((settings.stage, settings.n_latent)) or 1  # noqa: E731
    out = tmp_path / "sft"
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        train_sft(lm, train, cfg, out, valid=train[:2], evaluate_fn=evaluate_fn, log=lambda *a: None, progress=False)
    assert len(train) == 8 and not [w for w in said if "is more than the training data's" in str(w.message)]
    read = lambda path: json.loads(path.read_text())  # noqa: E731
    stages = [read(out / f"stage-{k}" / "latent_config.json") for k in range(4)]
    assert [(s["stage"], s["n_latent"]) for s in stages] == [(0, 0), (1, 2), (2, 2), (3, 2)] == seen
    folders = sorted(p.name for p in out.iterdir() if p.is_dir())
    assert folders == ["checkpoints", "final", "stage-0", "stage-1", "stage-2", "stage-3"]  # (no best/)
    assert read(out / "final" / "latent_config.json")["stage"] == 3
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [(r["stage"], r["eval/valid/accuracy"]) for r in rows if "eval/valid/accuracy" in r] == [
        (k, 0.5) for k in range(4)
    ]
    last = max((out / "checkpoints").iterdir())
    assert {k: read(last / "state.json")["progress"][k] for k in ("epoch", "batch")} == {"epoch": 5, "batch": 0}


def loop_calls(monkeypatch, cfg, progress: Progress) -> list[tuple]:
    """What train_sft's loop calls (with the run's files, the model and SFTRun faked, each step and stage's end
    recorded), the run resumed at ``progress``, 4 steps an epoch."""
    from contextlib import nullcontext

    calls: list[tuple] = []

    class Resumed:
        def __init__(self, lm, cfg, dist, run, train):
            self.plan, self.prog = Curriculum(cfg, steps_per_epoch=4), progress
            self.t0, self.best_rows_from = 0.0, 0
            self.run = SimpleNamespace(metrics=SimpleNamespace(n_rows=lambda: 0))

        def enter_stage(self, stage):
            calls.append(("enter", stage))

        def train_epoch(self, train, epoch, stage, first_batch, bar, t0):
            calls.append(("train", epoch, first_batch))

        def save(self, epoch, batch):
            calls.append(("save", epoch, batch))

        def finish(self, t0, final_eval=None):
            calls.append(("finish",))

    def keep_if_best(lm, stage, epoch, scores, best, *a):
        calls.append(("best?", epoch))
        return best

    monkeypatch.setattr(sft_module, "_prepare", lambda lm, train, cfg, *a: (cfg, Dist.single(), None))
    monkeypatch.setattr(sft_module, "RunDir", lambda *a, **kw: nullcontext(SimpleNamespace()))
    monkeypatch.setattr(sft_module, "SFTRun", Resumed)
    monkeypatch.setattr(sft_module, "_resumed_best", lambda *a: -1.0)
    monkeypatch.setattr(sft_module, "_finish_stage", lambda lm, stage, *a: calls.append(("stage end", stage)))
    monkeypatch.setattr(sft_module, "_validate_epoch", lambda lm, stage, epoch, *a: calls.append(("valid", epoch)))
    monkeypatch.setattr(sft_module, "_keep_if_best", keep_if_best)
    sft_module.train_sft(SimpleNamespace(train=lambda: None), [], cfg, Path("unused"), progress=False)  # type: ignore[arg-type]
    return calls


def test_a_run_resumed_mid_epoch_trains_that_epochs_rest_then_whole_epochs(monkeypatch):
    """Resumed at epoch 1, batch 3 of 4 epochs of 4 steps (2 epochs a stage): epoch 1 trains from batch 3, epochs 2
    and 3 from batch 0 (each from where the last left, they skipped their first 3 batches); each epoch's end saves a
    checkpoint that resumes at the next epoch's start."""
    cfg = tiny_config(**{"sft.num_epochs": 4, "sft.epochs_per_stage": 2})
    assert loop_calls(monkeypatch, cfg, Progress(epoch=1, batch=3)) == [
        *[("enter", 0), ("train", 1, 3), ("stage end", 0), ("save", 2, 0)],
        *[("enter", 1), ("train", 2, 0), ("save", 3, 0)],
        *[("enter", 1), ("train", 3, 0), ("stage end", 1), ("save", 4, 0)],
        ("finish",),
    ]


def test_every_epoch_of_the_final_layout_may_keep_best(monkeypatch):
    """sft.eval_every_epoch, epochs of stages 0, 0, 1, 2, 3, max_latent_stage 1: stages 2 and 3 both train the final
    layout (every step latent), so epochs 3 and 4 may keep best/ (not the last stage's epoch 4 alone); an epoch that
    ends no stage is validated on its own (epoch 0, the first of stage 0's 2)."""
    sets = {"sft.num_epochs": 5, "sft.stage_epochs": "[2]", "sft.epochs_per_stage": 1, "sft.max_latent_stage": 1}
    calls = loop_calls(monkeypatch, tiny_config(**sets, **{"sft.eval_every_epoch": "true"}), Progress())
    assert [c for c in calls if c[0] in ("best?", "valid", "stage end")] == [
        *[("valid", 0), ("stage end", 0), ("stage end", 1)],
        *[("stage end", 2), ("best?", 3), ("stage end", 3), ("best?", 4)],
    ]


def test_a_run_resumed_with_more_epochs_stretches_its_schedule_to_the_new_length(task_records, monkeypatch):
    """A run of 2 epochs of 2 steps without resets (one schedule of 4 steps) saved at its end, resumed with
    sft.num_epochs 4 (allow_config_change; the checkpoint and the run's files faked): the schedule is the resumed
    config's, 8 steps, 4 of them done (the saved length of 4 held every added step at its end: lr 0)."""
    from dataclasses import asdict

    cfg = tiny_config(**{"sft.reset_optimizer": "false", "sft.batch_size": 1, "sft.num_epochs": 4})
    saved = Progress(epoch=2, batch=0, global_step=4, step_in_sched=4, sched_total=4, stage_prev=0)
    state = {"progress": asdict(saved), "nonfinite_skips": 0, "metrics_lines": 0, "time_s": 1.0}
    loaded = SimpleNamespace(apply=lambda lm, opt, dist: state)
    resumed = faked_sft_run(monkeypatch, cfg, task_records[:2], resumed=loaded)
    assert resumed.plan.steps_per_epoch == 2 and resumed.opt is not None
    assert (resumed.prog.epoch, resumed.prog.step_in_sched, resumed.prog.sched_total) == (2, 4, 8)


def test_the_loss_sees_a_question_cut_to_max_question_tokens(tokenizer, task_records):
    """data.max_question_tokens cuts the questions SFT trains on to their last tokens, as elsewhere: a question and
    the same question after other words, cut to the first's length, give the same loss (uncut, they do not)."""
    from dgrpo.training.curriculum import SFTExample
    from dgrpo.training.sft import sft_loss

    lm = make_lm(tokenizer)
    lm.eval()
    rec = task_records[0]
    longer = "Twelve boxes were sold on Monday. " + rec.question
    ids = lm.token_ids([lm.format_question(rec.question), lm.format_question(longer)])
    kept = len(ids[0])
    assert len(ids[1]) > kept and ids[1][-kept:] == ids[0]
    target = format_target(rec.steps[1:], rec.answer)

    def loss(question, limit):
        cfg = tiny_config(**{"data.max_question_tokens": limit})
        with torch.no_grad():
            return float(sft_loss(lm, [SFTExample(question, 2, target)], cfg, normalizer=1.0)[0])

    assert loss(longer, kept) == pytest.approx(loss(rec.question, kept), rel=1e-6)
    assert abs(loss(longer, 0) - loss(rec.question, 0)) > 1e-4


def test_final_is_saved_with_the_last_stages_settings(tmp_path):
    """The run's end (stages 0, 1, 2 with max_latent_stage 1, c_thought 2; the model's settings were stage 0's):
    the test sets are answered and final/ saved with the last stage's settings (stage 2, 2 thoughts)."""
    cfg = tiny_config(**{"sft.num_epochs": 3, "sft.epochs_per_stage": 1, "sft.max_latent_stage": 1, "sft.c_thought": 2})
    run = sft_run_between_steps(cfg)
    run.lm = SimpleNamespace(settings=stage_settings(0, cfg), eval=lambda: None, stopped_run="x")
    seen, said = [], []
    run.run = SimpleNamespace(
        out_dir=tmp_path,
        metrics=SimpleNamespace(rows=lambda: []),
        final_eval=lambda final_eval, lm, step, best: seen.append(("test sets", lm.settings.stage)),
        resumed_step=None,
        log=said.append,
    )
    run.dist.save_model = lambda lm, path: seen.append((path.name, lm.settings.stage, lm.settings.n_latent))
    run.best_rows_from = 0
    run.finish(0.0)
    assert seen == [("test sets", 2), ("final", 2, 2)] and "final stage 2 (2 latent thoughts)" in said[-1]


def test_a_target_that_fills_max_target_tokens_without_its_eos_is_warned_of(tokenizer, task_records):
    """A stage-0 target of exactly data.max_target_tokens tokens is cut (its EOS does not fit: never trained to
    stop) and warned of; one token more of room, it fits and nothing is said."""
    import warnings

    from dgrpo.training.sft import _warn_if_targets_cut

    lm, rec = make_lm(tokenizer), task_records[0]
    n = len(lm.token_ids([format_target(rec.steps, rec.answer)])[0])
    with pytest.warns(UserWarning, match=rf"^1 of 1 training targets .* longer than data.max_target_tokens = {n} "):
        _warn_if_targets_cut(lm, [rec], tiny_config(**{"data.max_target_tokens": n}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _warn_if_targets_cut(lm, [rec], tiny_config(**{"data.max_target_tokens": n + 1}))
