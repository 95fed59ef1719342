"""The run's plumbing (dgrpo.training.run), pinned where mutation testing found it unchecked: validation metrics
merged over ranks (accuracy and mean score over every record, not one rank's), the value ``best/`` is kept by, the
non-finite guard's streak, the bf16 gradient norm, and a resume that keeps exactly the rows before its step."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from dgrpo.config import ConfigError
from dgrpo.eval.evaluate import EvalResult

from conftest import grpo_run_dir, loads_no_base, state_only_checkpoint


class _RankOfTwo:
    """Rank ``rank`` of two processes for :func:`sharded_scores`: the other rank's count of correct records, its
    scores (a list, or their sum) and whether it had none are summed or gathered in as the collectives would."""

    def __init__(self, rank: int, count: int, scored: list[float] | float | None):
        self.rank, self.count, self.scored = rank, count, scored

    def shard(self, items: list) -> list:
        n = len(items)
        return items[n * self.rank // 2 : n * (self.rank + 1) // 2]

    def sum_ints(self, xs: list[int]) -> list[int]:
        return [xs[0] + self.count, xs[1], xs[2] + int(self.scored is None)]

    def all_gather_objects(self, obj: object) -> list:
        return [self.scored, obj] if self.rank else [obj, self.scored]


def _result(n: int, correct: int, mean: float | None, scores: list[float] | None = None) -> EvalResult:
    """An EvalResult of ``n`` records (prediction rows with ``scores`` when given)."""
    rows = [{"score": s} for s in scores] if scores is not None else []
    return EvalResult("v", correct / n, n, correct, 0, 0, 0, "coconut", 0.0, mean_score=mean, predictions=rows)


def test_validation_over_two_ranks_averages_over_every_record():
    """Five records on two ranks (rank 1 holds the last three): the accuracy is the correct records of both over
    five, and a mean score kept as each rank's sum (no rows) is those sums over five, not over a shard's three
    records, nor the number of ranks."""
    from dgrpo.training.sharded_eval import sharded_scores

    records = list(range(5))
    seen: list[list] = []

    def count_two(local: list) -> int:
        seen.append(local)
        return 2

    assert sharded_scores(_RankOfTwo(1, 1, None), count_two, records) == {"accuracy": 3 / 5}
    assert seen == [[2, 3, 4]]
    means = sharded_scores(_RankOfTwo(1, 1, 0.25), lambda local: _result(3, 2, 0.5), records)
    assert means == {"accuracy": 3 / 5, "mean_score": pytest.approx((0.25 + 1.5) / 5)}


def test_validation_over_two_ranks_merges_rows_scores_and_sums_alike():
    """Rank 1's rows (three scores of 0.5) with rank 0's two scores (1.0, 1.0): the mean of all five (0.7), not of
    one rank's; with rank 0's sum (0.25) instead of its rows, the sums over five (0.35)."""
    from dgrpo.training.sharded_eval import sharded_scores

    mine = _result(3, 1, 0.5, [0.5, 0.5, 0.5])
    rows = sharded_scores(_RankOfTwo(1, 2, [1.0, 1.0]), lambda local: mine, list(range(5)))
    assert rows == {"accuracy": 3 / 5, "mean_score": pytest.approx(0.7)}
    mixed = sharded_scores(_RankOfTwo(1, 0, 0.25), lambda local: mine, list(range(5)))
    assert mixed == {"accuracy": 1 / 5, "mean_score": pytest.approx(0.35)}


def test_an_evaluate_fns_result_is_checked_against_its_shard():
    """An EvalResult of fewer records than the shard given is refused (a limit applied inside); every record right
    (a count of n, a mean score of 1.0) is a valid result; a result without a mean score validates the accuracy
    alone."""
    from dgrpo.training.distributed import Dist
    from dgrpo.training.sharded_eval import sharded_scores

    single, three = Dist.single(), [0, 1, 2]
    with pytest.raises(TypeError, match="returned the EvalResult of 2 records for the 3 it is given"):
        sharded_scores(single, lambda local: _result(2, 1, 0.5), three)
    assert sharded_scores(single, lambda local: 3, three) == {"accuracy": 1.0}
    assert sharded_scores(single, lambda local: _result(3, 3, 1.0), three) == {"accuracy": 1.0, "mean_score": 1.0}
    assert sharded_scores(single, lambda local: _result(3, 1, None), three) == {"accuracy": 1 / 3}


def test_best_is_kept_by_the_metric_asked():
    """``best_value`` takes the metric named (mean_score, not the accuracy beside it), and refuses one a count
    cannot give."""
    from dgrpo.training.sharded_eval import best_value

    assert best_value({"accuracy": 0.25, "mean_score": 0.75}, "mean_score", "grpo.best_metric") == 0.75
    assert best_value({"accuracy": 0.25, "mean_score": 0.75}, "accuracy", "grpo.best_metric") == 0.25
    with pytest.raises(ConfigError, match="grpo.best_metric=mean_score: the evaluate_fn returns a count"):
        best_value({"accuracy": 0.25}, "mean_score", "grpo.best_metric")


def test_best_by_mean_score_refused_for_an_eval_result_without_one_says_so():
    """An evaluate_fn's EvalResult whose mean_score is None (made by hand) gives no mean score either: the refusal
    names it (it said only "returns a count", and told its caller to return the EvalResult it had returned)."""
    from dgrpo.training.distributed import Dist
    from dgrpo.training.sharded_eval import best_value, sharded_scores

    scores = sharded_scores(Dist.single(), lambda local: _result(3, 1, None), [0, 1, 2])
    with pytest.raises(ConfigError, match="or an EvalResult whose mean_score is None; return evaluate"):
        best_value(scores, "mean_score", "sft.best_metric")


def test_the_non_finite_guard_trips_on_limit_steps_in_a_row_only():
    """Limit 2: one bad step, a good one, a bad one does not trip (the streak restarts); two bad in a row do. Every
    bad step is counted in ``skips``."""
    from dgrpo.training.guards import NonFiniteGuard

    guard = NonFiniteGuard(2, "GRPO", "grpo.lr")
    for finite in (False, True, False):
        guard.record(finite)
    assert (guard.tripped, guard.streak, guard.skips) == (False, 1, 2)
    guard.record(False)
    assert (guard.tripped, guard.streak, guard.skips) == (True, 2, 3)


def test_a_bf16_gradients_norm_is_float32_and_clips():
    """A bf16 gradient (3, 4) of norm 5, clipped to 1: the norm returned in float32, the gradient scaled to (0.6,
    0.8) (bf16's rounding)."""
    from dgrpo.training.guards import clip_gradients

    p = torch.nn.Parameter(torch.zeros(2, dtype=torch.bfloat16))
    p.grad = torch.tensor([3.0, 4.0], dtype=torch.bfloat16)
    norm = clip_gradients([p], 1.0)
    assert norm.dtype == torch.float32 and float(norm) == 5.0
    assert torch.allclose(p.grad.float(), torch.tensor([0.6, 0.8]), atol=4e-3)


def test_weights_finite_reads_every_parameter():
    """A NaN in the second parameter is found; finite weights (and none) are finite; under two processes, weights
    not finite on the other rank are not finite here either."""
    from dgrpo.training.distributed import Dist
    from dgrpo.training.guards import weights_finite

    good, bad = torch.ones(2), torch.tensor([1.0, float("nan")])
    assert weights_finite([good, good], Dist.single()) and weights_finite([], Dist.single())
    assert not weights_finite([good, bad], Dist.single())
    # rank 0 of two, finite, the other not (its 1 in the sum): no rank goes on
    other_not_finite = SimpleNamespace(sum_int=lambda x: x + 1)
    assert not weights_finite([good], other_not_finite)


def test_config_diff_counts_a_missing_key_as_its_default_and_ignores_logging():
    """A key an older run's config lacks, at its default now, is no change; one set otherwise is; logging.* and the
    neutral keys never are."""
    from dgrpo.config import Config, to_dict
    from dgrpo.training.resume_check import config_diff

    old = to_dict(Config())
    new = json.loads(json.dumps(old))
    del old["grpo"]["lr"]
    assert config_diff(old, new) == []
    new["grpo"]["lr"] = 0.5
    new["logging"]["project"] = "elsewhere"
    new["threads"] = 3
    assert config_diff(old, new) == ["grpo.lr"]


def test_an_empty_metrics_file_is_a_runs(tmp_path):
    """An empty metrics.jsonl is what a run opens first (a run killed before its first row): a run's; one whose first
    row has a step is too; one whose first row has none, or no file, is not."""
    from dgrpo.training.out_dir import is_run_metrics

    path = tmp_path / "metrics.jsonl"
    assert not is_run_metrics(path)
    for text, expected in (("", True), ('{"step": 1}\n', True), ('{"loss": 1}\n', False), ("[1]\n", False)):
        path.write_text(text)
        assert is_run_metrics(path) is expected, text


def test_a_resumed_run_clears_the_models_stopped_mark():
    """``check_restart`` on a resume clears ``lm.stopped_run`` (the checkpoint's weights replace the stopped ones);
    a fresh start from a stopped model is refused."""
    from dgrpo.training.run_inputs import check_restart

    lm = SimpleNamespace(stopped_run="step 3 of run X")
    with pytest.raises(ConfigError, match="holds the weights of a run that stopped mid-way"):
        check_restart(lm, False, "train_grpo")
    check_restart(lm, True, "train_grpo")
    assert lm.stopped_run is None
    check_restart(lm, False, "train_grpo")


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_run_started_afresh_over_a_killed_ones_rows_starts_their_files_empty(tmp_path):
    """A run killed before its first checkpoint, run again under the same config: it starts at step 0, so the
    earlier rows of metrics.jsonl and rollouts.jsonl go (kept, they read as this run's steps 0 and 1, twice)."""
    from dgrpo.config import to_dict

    from conftest import tiny_config

    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_text(json.dumps(to_dict(tiny_config())))
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    (out / "rollouts.jsonl").write_text('{"step": 0}\n{"step": 1}\n')
    with grpo_run_dir(out) as run:
        assert run.resume(loads_no_base) is None
        run.start(None)
        assert run.resumed_step is None
    assert (out / "rollouts.jsonl").read_text() == "" and (out / "metrics.jsonl").read_text() == ""


def test_a_resume_keeps_the_checkpoints_rows_and_hands_them_to_the_trackers(tmp_path):
    """Resumed at step 4 whose checkpoint recorded 2 metrics rows: the file keeps rows 1 and 2 (the third was
    written after it), each tracker is given those two, and new rows follow them at their own step."""
    from dgrpo.training.run import MetricsLog

    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s}) + "\n" for s in (1, 2, 3)))
    seen: list = []
    tracker = SimpleNamespace(
        resumed=lambda rows: seen.append(rows), log=lambda row, step: seen.append(step), close=lambda code: None
    )
    log = MetricsLog(path, True)
    log.open(2, [tracker])
    log.write({"step": 4, "loss": 0.5})
    assert seen == [[{"step": 1}, {"step": 2}], 4]
    assert [r["step"] for r in log.rows()] == [1, 2, 4] and log.n_rows() == 3
    log.close()


def test_a_resumed_run_keeps_its_checkpoints_rows_and_says_when_some_are_lost(tmp_path):
    """Its own checkpoint of step 4 recorded 2 rows: with 3 in the file, 2 are kept, no warning, and the run knows
    its resumed step; resumed again with those 2, no warning either; with 1 in the file, a warning says the rows
    before it are lost."""
    out = tmp_path / "run"
    state_only_checkpoint(out / "checkpoints" / "step-00000004")
    (out / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n{"step": 3}\n')
    for _ in range(2):  # (then resumed again with the 2 rows it recorded)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with grpo_run_dir(out) as run:
                run.resume(loads_no_base)
                run.start({"step": 4, "metrics_lines": 2})
                assert run.resumed_step == 4
        assert [r["step"] for r in _rows(out / "metrics.jsonl")] == [1, 2]
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    with pytest.warns(UserWarning, match="holds 1 rows, and 2 were written before"):
        with grpo_run_dir(out) as run:
            run.resume(loads_no_base)
            run.start({"step": 4, "metrics_lines": 2})


def test_a_fork_of_another_runs_checkpoint_starts_its_own_rows_without_a_warning(tmp_path):
    """``--resume PATH`` of another run's checkpoint into a new directory: no rows of that run are expected here
    (no warning that they are lost)."""
    parent = state_only_checkpoint(tmp_path / "parent" / "checkpoints" / "step-00000004")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with grpo_run_dir(tmp_path / "fork", resume=str(parent)) as run:
            run.resume(loads_no_base)
            run.start({"step": 4, "metrics_lines": 2})
    assert (tmp_path / "fork" / "metrics.jsonl").read_text() == ""


def test_the_final_evaluation_logs_its_row_at_the_last_step_with_the_best_step(tmp_path):
    """``final_eval`` is called with the step best/ holds, its metrics logged as a row at the run's last step; an
    earlier end's summary.json and final/ are removed first."""
    out = tmp_path / "run"
    asked: list = []
    with grpo_run_dir(out) as run:
        run.start(None)
        (out / "summary.json").write_text("{}")
        (out / "final").mkdir()
        run.final_eval(lambda lm, best: asked.append(best) or {"test_accuracy": 0.5}, None, 6, 3)
        assert not (out / "summary.json").exists() and not (out / "final").exists()
    assert asked == [3] and _rows(out / "metrics.jsonl") == [{"step": 6, "test_accuracy": 0.5}]


def test_a_stop_after_a_step_records_what_was_applied_at_the_runs_start_step(tmp_path):
    """A run resumed at step 4 that stops (a stall): its applied.json entry (started at step 4) is written again
    with what was applied at the stop, and the stop's error is raised."""
    from dgrpo.training.guards import StalledError

    out = tmp_path / "run"
    state_only_checkpoint(out / "checkpoints" / "step-00000004")
    with grpo_run_dir(out) as run:
        run.resume(loads_no_base)
        run.start({"step": 4, "metrics_lines": 0}, {"compile": "on"})
        with pytest.raises(StalledError, match="stalled"):
            run.stop_after_step({"compile": "fell back"}, StalledError("stalled"))
    assert json.loads((out / "applied.json").read_text()) == [{"started_at_step": 4, "compile": "fell back"}]


def test_a_checkpoint_that_fails_to_load_is_moved_aside_and_the_previous_one_resumed(tmp_path):
    """The newest checkpoint fails its checks: the previous one is resumed, the failed one renamed damaged-step-N
    (damaged-step-N-2 when that name is taken); when none loads, one error names them; a checkpoint named with
    --resume has nothing to fall back to."""
    from dgrpo.model.verified import CheckpointError

    out = tmp_path / "run"
    root = out / "checkpoints"
    older = state_only_checkpoint(root / "step-00000002")
    newest = state_only_checkpoint(root / "step-00000004")
    (root / "damaged-step-00000004").mkdir()

    def fails_newest(ckpt: Path) -> SimpleNamespace:
        if ckpt.name == newest.name:
            raise CheckpointError("model.safetensors: checksum mismatch")
        return SimpleNamespace(base=None)

    with grpo_run_dir(out) as run:
        assert run.resume(fails_newest) is not None and run.checkpoint == older
    assert (root / "damaged-step-00000004-2").is_dir() and not newest.exists()

    def fails(ckpt: Path) -> SimpleNamespace:
        raise CheckpointError("unreadable")

    with pytest.raises(CheckpointError, match="no checkpoint in .* can be resumed .*step-00000002: unreadable"):
        with grpo_run_dir(out) as run:
            run.resume(fails)
    assert older.is_dir()  # (the last one is not moved aside: the error names it)
    with pytest.raises(CheckpointError, match=f"resume='{older}': unreadable"):
        with grpo_run_dir(out, resume=str(older)) as run:
            run.resume(fails)


def test_each_skipped_checkpoint_says_whether_an_earlier_one_is_left(tmp_path):
    """A skipped checkpoint's line says it falls back to the previous one only when there is one: the oldest's says
    none is left (the error that follows names them all)."""
    from dgrpo.model.verified import CheckpointError
    from dgrpo.training.distributed import Dist
    from dgrpo.training.run import RunDir

    from conftest import tiny_config

    out = tmp_path / "run"
    for step in (2, 4):
        state_only_checkpoint(out / "checkpoints" / f"step-0000000{step}")

    def fails(ckpt: Path) -> SimpleNamespace:
        raise CheckpointError("unreadable")

    said: list[str] = []
    with pytest.raises(CheckpointError, match="no checkpoint in .* can be resumed"):
        with RunDir(out, tiny_config(), Dist.single(), "grpo", log=said.append) as run:
            run.resume(fails)
    assert [line.rpartition("; ")[2] for line in said] == ["falling back to the previous one", "no earlier one is left"]


def test_sfts_validation_decodes_with_the_stages_latent_steps(monkeypatch):
    """The default per-stage validation (SFT) evaluates with the stage's ``n_latent``, not ``eval.n_latent``; the
    plain one with ``eval.n_latent``; both greedy under ``eval.*`` and naming the validation set."""
    import dgrpo.training.run_inputs as run
    from dgrpo.data.records import Record

    from conftest import tiny_config

    calls: list[dict] = []
    monkeypatch.setattr(run, "evaluate", lambda lm, records, **kw: calls.append(kw))
    cfg = tiny_config(**{"eval.n_latent": 3})
    valid = [Record("q", [], "1")]
    run.default_evaluate_fn(cfg, valid, per_stage=True)(None, valid, SimpleNamespace(n_latent=1))
    run.default_evaluate_fn(cfg, valid)(None, valid)
    assert [(c["n_latent"], c["dataset"], c["progress"]) for c in calls] == [
        (1, "the validation set", False),
        (3, "the validation set", False),
    ]


def test_best_by_mean_score_is_refused_before_training_for_an_evaluate_fn_annotated_to_count():
    """``grpo.best_metric: mean_score`` with an evaluate_fn annotated ``-> int`` (a class, or the text 'int' under
    ``from __future__ import annotations``, as here) is refused before the run; accuracy, or no best/ kept, is not."""
    from dgrpo.training.run_inputs import _check_best_metric

    from conftest import tiny_config

    def counts(lm, records) -> int:
        return 0

    def counts_typed(lm, records):
        return 0

    counts_typed.__annotations__["return"] = int
    cfg = tiny_config(**{"grpo.best_metric": "mean_score"})
    assert counts.__annotations__["return"] == "int"
    for fn in (counts, counts_typed):
        with pytest.raises(ConfigError, match="grpo.best_metric=mean_score: the evaluate_fn returns a count"):
            _check_best_metric("train_grpo", cfg, fn)
    _check_best_metric("train_grpo", tiny_config(), counts)
    _check_best_metric("train_grpo", tiny_config(**{"grpo.best_metric": "mean_score", "grpo.save_best": False}), counts)


def test_a_best_deleted_since_the_checkpoint_is_no_stale_best(tmp_path):
    """The checkpoint recorded a best/ that is gone now (deleted by hand): nothing to remove, the resume goes on (a
    best/ recorded as None with none now too)."""
    out = tmp_path / "run"
    with grpo_run_dir(out) as run:
        assert run.best_record() is None
        assert run.drop_stale_best({"best": "ab" * 32}) is False
        assert run.drop_stale_best({"best": None}) is False


def test_a_resume_compares_the_options_its_command_reads(tmp_path):
    """A GRPO run resumed with another sft.* value (a section it never reads) goes on; another model.lora.alpha of a
    full run is refused (only a LoRA run leaves it to the adapters' comparison); model.revision, which the model may
    set, is left by the check made before loading to the run directory's, which refuses it."""
    from dgrpo.config import to_dict
    from dgrpo.training.resume_check import check_resume_config

    from conftest import tiny_config

    out = tmp_path / "run"
    state_only_checkpoint(out / "checkpoints" / "step-00000002")
    (out / "config.json").write_text(json.dumps(to_dict(tiny_config())))
    check_resume_config(out, tiny_config(**{"sft.c_thought": 3}), "grpo")
    with pytest.raises(ConfigError, match=r"a run started with a different config \(model.lora.alpha\)"):
        check_resume_config(out, tiny_config(**{"model.lora.alpha": 7}), "grpo")
    revised = tiny_config(**{"model.revision": "abc123"})
    check_resume_config(out, revised, "grpo")
    with pytest.raises(ConfigError, match=r"a run started with a different config \(model.revision\)"):
        grpo_run_dir(out, revised)


def test_a_moved_aside_copy_without_its_manifest_is_not_restored(tmp_path):
    """A kill during a best/ replace left ``.old-best-PID`` and no best/: it is moved back only when it is a
    checkpoint (its manifest); one without (not a copy dgrpo can vouch for) is removed instead."""
    out = tmp_path / "run"
    (out / ".old-best-5").mkdir(parents=True)
    (out / ".old-best-5" / "model.safetensors").write_text("")
    (out / ".old-final-6").mkdir()
    (out / ".old-final-6" / "manifest.json").write_text("{}")
    grpo_run_dir(out).close()
    assert sorted(p.name for p in out.iterdir()) == [".lock", "final"]


def test_a_run_restarted_under_another_config_restores_no_copy_it_removes_next(tmp_path):
    """An unfinished run with no checkpoint, restarted under another config, removes what the earlier run wrote (as
    ``--resume never`` does): a moved-aside final/ of that run is removed with the rest, not first restored with a
    line saying so ("its earlier copy is restored", for a folder deleted the next moment)."""
    from dgrpo.config import to_dict
    from dgrpo.training.distributed import Dist
    from dgrpo.training.run import RunDir

    from conftest import tiny_config

    out = tmp_path / "run"
    (out / ".old-final-6").mkdir(parents=True)
    (out / ".old-final-6" / "manifest.json").write_text("{}")
    (out / "config.json").write_text(json.dumps(to_dict(tiny_config(**{"grpo.lr": 0.5}))))
    said: list[str] = []
    with pytest.warns(UserWarning, match="it starts over under this one"):
        RunDir(out, tiny_config(), Dist.single(), "grpo", log=said.append).close()
    assert sorted(p.name for p in out.iterdir()) == [".lock", "config.json"]
    assert not [m for m in said if "restored" in m], said


def test_resume_never_starts_over_under_any_config_and_resumes_nothing(tmp_path):
    """``--resume never`` on a run with a checkpoint, under another config: not refused (nothing is resumed, so no
    config is compared), the checkpoint removed, and the run starts fresh."""
    from dgrpo.config import to_dict

    from conftest import tiny_config

    out = tmp_path / "run"
    state_only_checkpoint(out / "checkpoints" / "step-00000002")
    (out / "config.json").write_text(json.dumps(to_dict(tiny_config(**{"grpo.lr": 0.5}))))
    with grpo_run_dir(out, resume="never") as run:
        assert run.candidates == [] and run.resume(loads_no_base) is None
    assert not (out / "checkpoints").exists()
