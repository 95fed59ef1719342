"""Small hand-checked tests of the SFT curriculum (``dgrpo.training.sft`` and ``dgrpo.training.curriculum``), a third
pass after test_sft_mutants.py and test_sft_curriculum_mutants.py: each fails on a mutant that the rest of the fast
tier let through."""

import warnings
from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from dgrpo.config import ConfigError
from dgrpo.data.records import Record
from dgrpo.training import sft as sft_module
from dgrpo.training.curriculum import Curriculum, Progress, SFTExample, stage_settings
from dgrpo.training.distributed import Dist
from dgrpo.training.sft import _finish_stage, _keep_if_best, _warn_at_start, _warn_if_targets_cut, sft_loss

from conftest import make_lm, sft_run_between_steps, tiny_config

#: one token a character: what the target checks count
CHARS = SimpleNamespace(token_ids=lambda texts: [list(t) for t in texts])


def test_no_curriculum_mixed_by_uniform_prob_checks_its_targets_cut_at_stage_0():
    """sft.mode=no_curriculum trains the last stage from its first epoch: its targets are the answer line alone
    ("#### 5", 7 tokens with EOS), within a limit of 13, nothing said. Under sft.uniform_prob some examples are drawn
    at stage 0, which writes every step ("a\\nb\\nc\\nd\\n#### 5", 15 with EOS): that cut is warned of, at stage 0."""
    rec = Record("q", ["a", "b", "c", "d"], "5")
    sets = {"sft.mode": "no_curriculum", "data.max_target_tokens": 13}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _warn_if_targets_cut(CHARS, [rec], tiny_config(**sets))
    with pytest.warns(UserWarning, match="^1 of 1 training targets .* at stage 0"):
        _warn_if_targets_cut(CHARS, [rec], tiny_config(**sets, **{"sft.uniform_prob": 0.5}))


def test_a_batch_whose_latent_thoughts_overflow_the_context_is_refused_naming_c_thought(tokenizer):
    """sft_loss checks each latent-count group's whole sequence against the model's context: question (with
    <|start-latent|>), the group's 8 thoughts, <|end-latent|> and the target. A context one position short of that
    is refused with a config error naming sft.c_thought (a check without the thoughts let it run past the model's
    positions, silently); a context of exactly that length trains."""
    cfg = tiny_config(**{"sft.bf16": "false"})
    lm = make_lm(tokenizer)
    ex = SFTExample("A box holds 6 eggs. How many eggs are in 7 boxes?", 8, "<<6*7=42>>\n#### 42")
    width = lm.encode_questions([ex.question], max_tokens=cfg.data.max_question_tokens)[0].shape[1]
    target = lm.encode_targets([ex.target], max_tokens=cfg.data.max_target_tokens)[0].shape[1]
    total = width + 8 + 1 + target
    lm.model.config.max_position_embeddings = total - 1
    with torch.no_grad(), pytest.raises(ConfigError, match=r"^sft: .* 8 latent thoughts .*lower sft.c_thought"):
        sft_loss(lm, [ex], cfg, normalizer=1.0)
    lm.model.config.max_position_embeddings = total
    with torch.no_grad():
        loss, n_tokens = sft_loss(lm, [ex], cfg, normalizer=1.0)
    assert n_tokens == target and torch.isfinite(loss)


@pytest.mark.parametrize(("bf16", "autocast"), [("true", True), ("false", False)])
def test_a_steps_forward_runs_under_bf16_autocast_as_sft_bf16_says(bf16, autocast, monkeypatch):
    """sft.bf16=true runs each micro-batch's loss under bfloat16 autocast (on this CPU too: ``true`` is not
    ``auto``); false runs it in the weights' precision. The step's loss and update are the loss function's."""
    seen = []
    w = torch.nn.Parameter(torch.ones(2))

    def fake_loss(lm, examples, cfg, normalizer):
        seen.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))
        return (w * 3.0).sum() / normalizer, 1

    monkeypatch.setattr(sft_module, "sft_loss", fake_loss)
    monkeypatch.setattr(sft_module, "count_target_tokens", lambda lm, examples, cfg: 2)
    cfg = tiny_config(**{"sft.bf16": bf16, "sft.max_grad_norm": 0})
    lm = SimpleNamespace(device=torch.device("cpu"), model=torch.nn.Module())
    opt = torch.optim.SGD([w], lr=0.5)
    loss, _, finite = sft_module.sft_step(lm, opt, [w], ["one example"], cfg, Dist.single(), 0.5)
    assert [on for on, _ in seen] == [autocast]
    assert not autocast or seen[0][1] == torch.bfloat16
    assert finite and loss == pytest.approx(3.0) and w.tolist() == pytest.approx([0.25, 0.25])


def test_best_is_kept_by_sft_best_metric_not_by_accuracy(tmp_path):
    """sft.best_metric=mean_score: an epoch of lower accuracy (0.25) but a higher mean score (0.9) than the best so
    far (0.7) is kept, and 0.9 is the new best; one of higher accuracy (0.95) and a lower mean score (0.6) is not."""
    sets = {"sft.max_latent_stage": 1, "sft.eval_every_epoch": "true", "sft.best_metric": "mean_score"}
    cfg = tiny_config(**sets)
    lm, saved, rows = SimpleNamespace(settings=stage_settings(0, cfg)), [], []
    dist = Dist.single()
    dist.save_model = lambda model, path: saved.append(path.name)
    run = SimpleNamespace(out_dir=tmp_path, metrics=SimpleNamespace(write=rows.append), log=lambda line: None)
    assert _keep_if_best(lm, 2, 3, {"accuracy": 0.95, "mean_score": 0.6}, 0.7, cfg, run, dist, 30) == 0.7
    assert saved == [] and rows == []
    assert _keep_if_best(lm, 2, 4, {"accuracy": 0.25, "mean_score": 0.9}, 0.7, cfg, run, dist, 40) == 0.9
    assert saved == ["best"] and [r["best_epoch"] for r in rows] == [4]


class _ResumedBest(Exception):
    """train_sft's call of _resumed_best (faked: the run stops there)."""


def test_a_resumed_run_reads_its_best_value_by_sft_best_metric(monkeypatch):
    """train_sft under sft.eval_every_epoch starts best/'s comparison from the resumed run's value of
    sft.best_metric (mean_score here: a best/ kept by mean score is compared by mean score, not by its accuracy)."""

    class Run:
        def __init__(self, lm, cfg, dist, run, train):
            self.plan, self.prog, self.t0, self.best_rows_from = Curriculum(cfg, 1), Progress(), 0.0, 3

    def resumed_best(run, dist, rows_from, metric="accuracy"):
        raise _ResumedBest(rows_from, metric)

    monkeypatch.setattr(sft_module, "_prepare", lambda lm, train, cfg, out, valid, fn, dist: (cfg, Dist.single(), fn))
    monkeypatch.setattr(sft_module, "RunDir", lambda *a, **kw: nullcontext(SimpleNamespace()))
    monkeypatch.setattr(sft_module, "SFTRun", Run)
    monkeypatch.setattr(sft_module, "_resumed_best", resumed_best)
    cfg = tiny_config(**{"sft.eval_every_epoch": "true", "sft.best_metric": "mean_score"})
    rec = Record("q", ["a"], "1")
    with pytest.raises(_ResumedBest) as e:
        sft_module.train_sft(SimpleNamespace(), [rec], cfg, "unused", valid=[rec], evaluate_fn=lambda *a: 1)
    assert e.value.args == (3, "mean_score")


@pytest.mark.parametrize("valid", [None, []])
def test_a_stages_end_without_a_validation_set_saves_its_stage_unvalidated(valid, tmp_path):
    """_finish_stage with an evaluate_fn but no validation records (None or []): nothing is evaluated, the row has
    no validation keys and no scores are returned; stage-1/ is still saved with stage 1's settings (2 thoughts)."""
    cfg = tiny_config(**{"sft.c_thought": 2, "sft.max_latent_stage": 3, "sft.eval_every_epoch": "true"})
    lm, saved, rows, seen = SimpleNamespace(settings=None), [], [], []
    dist = Dist.single()
    dist.save_model = lambda model, path: saved.append((path.name, model.settings.n_latent))
    run = SimpleNamespace(out_dir=tmp_path, metrics=SimpleNamespace(write=rows.append), log=lambda line: None)
    scores = _finish_stage(lm, 1, cfg, run, dist, valid, lambda *a: seen.append(a) or 1, 7, 0.0)
    assert (scores, seen, saved) == (None, [], [("stage-1", 2)])
    assert [sorted(r) for r in rows] == [["n_latent", "stage", "step", "time_s"]]


def test_a_stages_end_row_times_its_validation_as_an_epochs_row_does(monkeypatch, tmp_path):
    """The stage-end row's time_s is read after its validation, as an epoch row's is (docs/metrics.md: evaluations
    included): it was read before, so that a 3 s validation was missing from the row that reports it."""
    clock = [10.0]
    monkeypatch.setattr(sft_module, "time", SimpleNamespace(time=lambda: clock[0]))

    def evaluate(*args):  # a validation of 3 s, 1 of the 2 records right
        clock[0] += 3.0
        return 1

    cfg = tiny_config(**{"sft.eval_each_stage": "true"})
    lm = SimpleNamespace(settings=None, eval=lambda: None, train=lambda: None)
    dist, rows = Dist.single(), []
    dist.save_model = lambda model, path: None
    run = SimpleNamespace(out_dir=tmp_path, metrics=SimpleNamespace(write=rows.append), log=lambda line: None)
    rec = Record("q", ["a"], "1")
    _finish_stage(lm, 0, cfg, run, dist, [rec, rec], evaluate, 7, 4.0)
    assert rows == [{"step": 7, "stage": 0, "n_latent": 0, "time_s": 9.0, "eval/valid/accuracy": 0.5}]


def test_a_mid_epoch_checkpoint_resumes_at_its_next_batch(monkeypatch):
    """SFTRun.save(2, 3) (written after batch 2 of epoch 2, by sft.save_every or a stop): the state resumes at epoch
    2, batch 3, not at the epoch's start (which trained its first batches twice)."""
    saved = {}
    monkeypatch.setattr(sft_module, "save_checkpoint", lambda out, step, **kw: saved.update(kw["state"]))
    monkeypatch.setattr(sft_module, "shard_staging", lambda out, step: None)
    run = sft_run_between_steps(tiny_config(), opt=torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))]))
    run.prog = Progress(epoch=2, batch=0, global_step=11, step_in_sched=3, sched_total=8, stage_prev=1)
    run.dist.training_state = lambda model, opt, staging: None
    run.lm, run.t0, run.data_fingerprint = SimpleNamespace(model=None), 0.0, "data"
    run.run = SimpleNamespace(out_dir=Path("out"), metrics=SimpleNamespace(n_rows=lambda: 0), best_record=lambda: None)
    run.save(2, 3)
    assert (saved["progress"]["epoch"], saved["progress"]["batch"], saved["progress"]["global_step"]) == (2, 3, 11)


@pytest.mark.parametrize(("mode", "warned"), [("coconut", False), ("pause", False), ("no_cot", True), ("cot", True)])
def test_uniform_prob_is_said_unused_only_where_no_curriculum_mixes_stages(mode, warned):
    """sft.uniform_prob > 0 is warned of as unused under cot and no_cot (no stages to mix), not under coconut or
    pause, whose examples it draws at random stages."""
    rec = Record("q", ["a"], "1")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _warn_at_start([rec] * 64, None, tiny_config(**{"sft.mode": mode, "sft.uniform_prob": 0.3}))
    assert any("sft.uniform_prob = 0.3 is unused" in str(w.message) for w in caught) == warned
