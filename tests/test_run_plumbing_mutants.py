"""A training run's plumbing (dgrpo.training.run, .out_dir, .resume_check, .guards, .sharded_eval, .run_inputs),
pinned where a second pass of mutation testing found it unchecked: the metrics log off rank 0, a refused run's
directory, a killed replace's leftovers beside a published copy, the lock, resumes refused or allowed under a config
change, the non-finite guard and validation merged over ranks."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from dgrpo.config import ConfigError, to_dict

from conftest import grpo_run_dir, loads_no_base, state_only_checkpoint, tiny_config


def test_the_metrics_log_off_rank_0_reads_and_writes_nothing(tmp_path):
    """Off rank 0 (``enabled`` False) the metrics log neither reads rank 0's file (no rows, a count of 0) nor opens,
    writes or cuts it."""
    from dgrpo.training.run import MetricsLog

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n')
    log = MetricsLog(path, False)
    log.open(1, [])
    log.write({"step": 3})
    assert log.rows() == [] and log.n_rows() == 0
    log.close()
    assert path.read_text() == '{"step": 1}\n{"step": 2}\n'


def test_a_refused_run_removes_only_a_directory_it_made(tmp_path):
    """A run refused at its start (here: ``--resume`` of a checkpoint that does not exist) removes the directory it
    created, and leaves one that existed before it (the user's, empty) in place."""
    missing = str(tmp_path / "nowhere" / "step-00000002")
    made = tmp_path / "made"
    with pytest.raises(ConfigError, match="no such checkpoint directory"):
        grpo_run_dir(made, resume=missing)
    assert not made.exists()
    mine = tmp_path / "mine"
    mine.mkdir()
    with pytest.raises(ConfigError, match="no such checkpoint directory"):
        grpo_run_dir(mine, resume=missing)
    assert mine.is_dir()


def test_a_moved_aside_copy_beside_its_published_replacement_is_removed(tmp_path):
    """A kill after a replace published the new best/ but before it removed ``.old-best-PID``: the new best/ stays
    (it is not overwritten by the older copy, and the run starts), the older copy is removed."""
    out = tmp_path / "run"
    for name, text in ((".old-best-6", "old"), ("best", "new")):
        (out / name).mkdir(parents=True)
        (out / name / "manifest.json").write_text(text)
    grpo_run_dir(out).close()
    assert sorted(p.name for p in out.iterdir()) == [".lock", "best"]
    assert (out / "best" / "manifest.json").read_text() == "new"


def test_resume_never_in_the_working_directory_keeps_a_model_named_not_by_a_path(tmp_path, monkeypatch):
    """``--out . --resume never`` with the model named by a hub id or a built-in name (a relative name, not a path
    inside OUT) starts over; a model given by its absolute path inside OUT is refused (it would be deleted)."""
    out = tmp_path / "run"
    state_only_checkpoint(out / "checkpoints" / "step-00000002")
    monkeypatch.chdir(out)
    cfg = tiny_config(**{"model.name_or_path": "org/model"})
    grpo_run_dir(out, cfg, resume="never").close()
    assert not (out / "checkpoints").exists()
    inside = tiny_config(**{"model.name_or_path": str(out / "init")})
    with pytest.raises(ConfigError, match="would delete .*init, the model this run starts from"):
        grpo_run_dir(out, inside, resume="never")


def test_a_folder_of_another_kind_in_checkpoints_is_refused(tmp_path):
    """OUT/checkpoints holding a folder that is not a checkpoint's (``notes/``) is refused before anything is written;
    a ``damaged-step-N`` a resume moved aside is the run's own."""
    out = tmp_path / "run"
    (out / "checkpoints" / "damaged-step-00000004").mkdir(parents=True)
    grpo_run_dir(out).close()
    (out / "checkpoints" / "notes").mkdir()
    with pytest.raises(ConfigError, match="holds notes, not dgrpo checkpoints"):
        grpo_run_dir(out)


def test_a_resume_under_the_same_config_keeps_no_config_history(tmp_path):
    """A resume under the config the run started with writes no ``config.N.json`` (a history is the record of a
    change); under a changed one, allowed, the first config is kept as config.0.json (step 0) and the new one as
    config.1.json at the resumed step."""
    out = tmp_path / "run"
    state_only_checkpoint(out / "checkpoints" / "step-00000004")
    (out / "config.json").write_text(json.dumps(to_dict(tiny_config())))
    with grpo_run_dir(out) as run:
        run.resume(loads_no_base)
        run.start({"step": 4, "metrics_lines": 0})
    assert sorted(p.name for p in out.glob("config*.json")) == ["config.json"]
    with grpo_run_dir(out, tiny_config(**{"grpo.lr": 0.5}), allow_config_change=True) as run:
        run.resume(loads_no_base)
        run.start({"step": 4, "metrics_lines": 0})
    history = [json.loads((out / f"config.{n}.json").read_text()) for n in (0, 1)]
    assert [h["started_at_step"] for h in history] == [0, 4]
    assert [h["config"]["grpo"]["lr"] for h in history] == [tiny_config().grpo.lr, 0.5]


def test_a_run_that_fails_after_writing_keeps_its_new_directory(tmp_path):
    """A run in a directory it created that fails after it wrote there (an error at a step) keeps the directory and
    what it wrote: only a run refused before it wrote anything removes the directory it made."""
    out = tmp_path / "new"
    with pytest.raises(RuntimeError, match="a step failed"):
        with grpo_run_dir(out) as run:
            run.start(None)
            run.metrics.write({"step": 1, "loss": 0.5})
            raise RuntimeError("a step failed")
    assert (out / "config.json").is_file()
    assert (out / "metrics.jsonl").read_text() == '{"step": 1, "loss": 0.5}\n'


def test_a_skipped_checkpoint_is_moved_aside_past_every_name_taken(tmp_path):
    """The newest checkpoint fails to load, and ``damaged-step-N`` and ``damaged-step-N-2`` are taken (earlier
    skips): it goes to ``damaged-step-N-3``; the earlier copies keep what they held."""
    from dgrpo.model.verified import CheckpointError

    root = tmp_path / "run" / "checkpoints"
    older = state_only_checkpoint(root / "step-00000002")
    newest = state_only_checkpoint(root / "step-00000004")
    for name in ("damaged-step-00000004", "damaged-step-00000004-2"):
        (root / name).mkdir()
        (root / name / "note").write_text(name)

    def fails_newest(ckpt: Path) -> SimpleNamespace:
        if ckpt == newest:
            raise CheckpointError("checksum mismatch")
        return SimpleNamespace(base=None)

    with grpo_run_dir(tmp_path / "run") as run:
        assert run.resume(fails_newest) is not None and run.checkpoint == older
    assert (root / "damaged-step-00000004-3" / "state.json").is_file() and not newest.exists()
    for name in ("damaged-step-00000004", "damaged-step-00000004-2"):
        assert (root / name / "note").read_text() == name


def test_a_run_config_has_every_section_a_run_records(tmp_path):
    """A config.json is a run's only with its model, task and data sections all there (a JSON object): another
    tool's config that shares one section name (``model``) is not, and an --out holding it is refused."""
    from dgrpo.training.out_dir import is_run_config

    path = tmp_path / "config.json"
    for found, expected in (
        ({"model": {}, "task": {}, "data": {}, "grpo": {}}, True),
        ({"model": {"name": "x"}, "data": {}}, False),
        ([["model"], ["task"], ["data"]], False),
    ):
        path.write_text(json.dumps(found))
        assert is_run_config(path) is expected, found
    with pytest.raises(ConfigError, match="its config.json is not a dgrpo run's config"):
        grpo_run_dir(tmp_path)


def test_a_folder_with_a_runs_metrics_alone_is_a_training_runs(tmp_path):
    """dgrpo eval's ``--out`` is refused in a folder that holds a run's metrics.jsonl and nothing else of it (a run
    killed before its first checkpoint), as in one with its checkpoints/ alone; a folder with neither is not a run's,
    nor is one whose config.json is another tool's."""
    from dgrpo.training.out_dir import check_not_a_training_run

    for name in ("metrics.jsonl", "checkpoints"):
        run = tmp_path / name.split(".")[0]
        run.mkdir()
        (run / name).mkdir() if name == "checkpoints" else (run / name).write_text('{"step": 1}\n')
        with pytest.raises(ConfigError, match="is a training run's directory"):
            check_not_a_training_run(run)
        with pytest.raises(ConfigError, match="keeps its own files"):
            check_not_a_training_run(run / "eval" / "x")
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text('{"model_type": "gpt2"}')
    check_not_a_training_run(other)
    check_not_a_training_run(other / "eval")


def test_the_lock_names_its_holder_and_is_free_once_released(tmp_path):
    """The lock file holds this process's PID alone (a longer PID a killed holder left there is cut); a second
    taker is refused naming it; once released, the directory can be locked again."""
    import os

    from dgrpo.training.out_dir import RunLock

    (tmp_path / ".lock").write_text("123456789012\n")
    lock = RunLock(tmp_path)
    assert (tmp_path / ".lock").read_text() == f"{os.getpid()}\n"
    with pytest.raises(ConfigError, match=rf"is in use by another dgrpo process \(PID {os.getpid()}\)"):
        RunLock(tmp_path)
    lock.release()
    lock.release()  # (a second release is nothing)
    RunLock(tmp_path).release()


def test_a_checkpoint_is_no_output_folder_but_may_be_replaced_as_a_model(tmp_path):
    """``check_output_path`` refuses a checkpoint dgrpo wrote as a command's output folder (its files would change
    under its manifest); a model output (``model_dir``: dgrpo may replace such a directory) may name it; a folder
    inside one is refused either way; an existing file is no directory."""
    from dgrpo.training.out_dir import check_output_path

    ckpt = tmp_path / "final"
    ckpt.mkdir()
    (ckpt / "manifest.json").write_text("{}")
    with pytest.raises(ConfigError, match="--out .*final is a checkpoint dgrpo wrote"):
        check_output_path(ckpt)
    check_output_path(ckpt, model_dir=True)
    for model_dir in (False, True):
        with pytest.raises(ConfigError, match="lies inside .*final, a checkpoint dgrpo wrote"):
            check_output_path(ckpt / "sub", model_dir=model_dir)
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="exists and is not a directory"):
        check_output_path(tmp_path / "file")


def test_a_norm_over_bf16_and_float32_gradients_is_summed_in_float32():
    """Gradients of mixed precision (a bf16 one beside a float32 one) take the float32 path too: the norm of a bf16
    (1, 1, 1) and a float32 (0,) is sqrt(3) to float32's precision (bf16's sum gave 1.734375)."""
    import torch

    from dgrpo.training.guards import clip_gradients

    low, full = torch.nn.Parameter(torch.zeros(3, dtype=torch.bfloat16)), torch.nn.Parameter(torch.zeros(1))
    low.grad, full.grad = torch.ones(3, dtype=torch.bfloat16), torch.zeros(1)
    norm = clip_gradients([low, full], float("inf"))
    assert norm.dtype == torch.float32 and float(norm) == pytest.approx(3**0.5, abs=1e-6)


def test_no_validation_records_score_an_accuracy_of_zero_and_no_mean():
    """No records at all: the evaluate_fn is not called, the accuracy is 0 (no division by zero) and there is no
    mean score (none was scored)."""
    from dgrpo.training.distributed import Dist
    from dgrpo.training.sharded_eval import sharded_scores

    def never(local: list) -> int:
        raise AssertionError("called on no records")

    assert sharded_scores(Dist.single(), never, []) == {"accuracy": 0.0}


def _result(n: int, correct: int, mean: float | None):
    """An EvalResult of ``n`` records, ``correct`` of them right, with mean score ``mean`` (no prediction rows)."""
    from dgrpo.eval.evaluate import EvalResult

    return EvalResult("v", correct / n, n, correct, 0, 0, 0, "coconut", 0.0, mean_score=mean)


def test_an_evaluate_fns_count_and_mean_score_are_bounded():
    """A count above the shard's size (3 of 2 records) and a mean score above 1 or NaN are refused in one line each
    (an accuracy over 1 would be kept as the best); their bounds themselves (2 of 2, a mean of 1) are not."""
    from dgrpo.training.distributed import Dist
    from dgrpo.training.sharded_eval import sharded_scores

    single, two = Dist.single(), [0, 1]
    with pytest.raises(TypeError, match="an int from 0 to 2\\), got 3"):
        sharded_scores(single, lambda local: 3, two)
    for mean in (1.5, float("nan")):
        with pytest.raises(TypeError, match="whose mean_score is .*, not in \\[0, 1\\]"):
            sharded_scores(single, lambda local, m=mean: _result(2, 1, m), two)
    assert sharded_scores(single, lambda local: _result(2, 2, 1.0), two) == {"accuracy": 1.0, "mean_score": 1.0}


def test_a_joined_data_spec_is_made_absolute_where_its_paths_read_back_as_its_parts(tmp_path, monkeypatch):
    """``a.jsonl+b.jsonl`` from a folder is recorded as the two absolute paths joined, from a folder whose path holds
    a ``+`` too (each absolute path names a file: read back as one part, :func:`dgrpo.data.join_parts`); a built-in
    name is kept."""
    from dgrpo.training.resume_check import absolute_data_spec

    for name in ("plain", "x+y"):
        folder = tmp_path / name
        folder.mkdir()
        for f in ("a.jsonl", "b.jsonl"):
            (folder / f).write_text('{"question": "q", "answer": "1"}\n')
        monkeypatch.chdir(folder)
        assert absolute_data_spec("a.jsonl+b.jsonl") == f"{folder / 'a.jsonl'}+{folder / 'b.jsonl'}"
    assert absolute_data_spec("builtin:train") == "builtin:train"


def test_a_runs_train_and_valid_specs_are_recorded_absolute_and_its_test_sets_as_typed(tmp_path, monkeypatch):
    """``data.train`` and ``data.valid`` naming local files are recorded as absolute paths (a resume from another
    folder reads the same data); ``data.test`` names results: kept as typed; an empty valid stays empty."""
    from dgrpo.training.resume_check import absolute_data_specs

    monkeypatch.chdir(tmp_path)
    for f in ("t.jsonl", "v.jsonl"):
        (tmp_path / f).write_text('{"question": "q", "answer": "1"}\n')
    data = {"train": "t.jsonl", "valid": "v.jsonl", "test": ["v.jsonl"]}
    assert absolute_data_specs(data) == {
        "train": str(tmp_path / "t.jsonl"),
        "valid": str(tmp_path / "v.jsonl"),
        "test": ["v.jsonl"],
    }
    assert absolute_data_specs({"train": "t.jsonl", "valid": ""})["valid"] == ""


def test_another_commands_run_is_refused_with_the_init_hint_for_sft_into_grpo_only(tmp_path):
    """A GRPO run's checkpoints given to ``dgrpo sft`` are refused without the ``--init`` hint (an SFT run does not
    start from a GRPO run's model that way); an SFT run's given to ``dgrpo grpo`` name ``--init`` on it."""
    from dgrpo.training.resume_check import check_resume_config

    grpo, sft = tmp_path / "grpo", tmp_path / "sft"
    state_only_checkpoint(grpo / "checkpoints" / "step-00000002")
    (sft / "checkpoints" / "step-00000002").mkdir(parents=True)
    (sft / "checkpoints" / "step-00000002" / "state.json").write_text('{"progress": {}}')
    with pytest.raises(ConfigError, match="which `dgrpo sft` cannot resume: name a new --out$"):
        check_resume_config(grpo, tiny_config(), "sft")
    with pytest.raises(ConfigError, match=f"which `dgrpo grpo` cannot resume: name a new --out; .*--init {sft}$"):
        check_resume_config(sft, tiny_config(), "grpo")


def test_another_commands_checkpoint_named_by_resume_is_refused_saying_to_drop_resume(tmp_path):
    """A checkpoint of the other command named by ``--resume PATH`` (with a new ``--out``) is refused saying to drop
    ``--resume`` (an SFT checkpoint: with ``--init`` on it), not to name a new ``--out``: the ``--out`` is new already,
    and another one is refused the same way."""
    from dgrpo.training.resume_check import check_resume_config

    grpo = state_only_checkpoint(tmp_path / "grpo" / "checkpoints" / "step-00000002")
    sft = tmp_path / "sft" / "checkpoints" / "step-00000002"
    sft.mkdir(parents=True)
    (sft / "state.json").write_text('{"progress": {}}')
    with pytest.raises(ConfigError, match=f"^--resume {grpo} is .*which `dgrpo sft` cannot resume: drop --resume$"):
        check_resume_config(tmp_path / "new-sft", tiny_config(), "sft", resume=str(grpo))
    said = f"^--resume {sft} is .*`dgrpo grpo` cannot resume: drop --resume; to start from its model: --init {sft}$"
    with pytest.raises(ConfigError, match=said):
        check_resume_config(tmp_path / "new-grpo", tiny_config(), "grpo", resume=str(sft))


def test_a_run_with_rollouts_alone_is_grpos_and_not_started_over_by_sft(tmp_path):
    """``--resume never`` of ``dgrpo sft`` on a folder holding a GRPO run without checkpoints, known by its
    rollouts.jsonl alone (no summary, no metrics rows yet), is refused: it would delete that run."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_text(json.dumps(to_dict(tiny_config())))
    (out / "rollouts.jsonl").write_text('{"step": 0}\n')
    from dgrpo.training.distributed import Dist
    from dgrpo.training.run import RunDir

    with pytest.raises(ConfigError, match="holds a `dgrpo grpo` run, which `dgrpo sft` cannot resume"):
        RunDir(out, tiny_config(), Dist.single(), "sft", resume="never", log=lambda m: None)
    assert (out / "rollouts.jsonl").is_file()


def test_resume_of_a_file_says_it_is_a_file(tmp_path):
    """``--resume`` naming a file (a checkpoint's state.json, say) is refused as a file, not as a checkpoint that
    does not exist."""
    from dgrpo.training.resume_check import check_resume_config

    state = state_only_checkpoint(tmp_path / "run" / "checkpoints" / "step-00000002") / "state.json"
    with pytest.raises(ConfigError, match="state.json is a file: name a checkpoint directory"):
        check_resume_config(tmp_path / "fork", tiny_config(), "grpo", resume=str(state))


def test_resume_never_restores_no_checkpoint_it_removes_next(tmp_path):
    """``--resume never`` over a run killed while replacing a checkpoint (its ``.old-step-N-PID``, a checkpoint):
    nothing is restored (no line saying so, for a folder removed the next moment), and checkpoints/ is removed."""
    from dgrpo.training.distributed import Dist
    from dgrpo.training.run import RunDir

    aside = tmp_path / "run" / "checkpoints" / ".old-step-00000002-7"
    aside.mkdir(parents=True)
    (aside / "manifest.json").write_text("{}")
    said: list[str] = []
    RunDir(tmp_path / "run", tiny_config(), Dist.single(), "grpo", resume="never", log=said.append).close()
    assert not (tmp_path / "run" / "checkpoints").exists()
    assert not [m for m in said if "restored" in m], said


def test_a_retry_after_config_json_failed_to_write_adds_no_second_history_entry(tmp_path, monkeypatch):
    """A resume under a changed config writes config.1.json, then config.json; a failure in between (a full disk)
    left config.json the earlier config, so the same command, once there was space, saw the change again and added
    config.2.json for the same step and config. The retry keeps config.1.json as the entry of that step."""
    import errno as errno_module

    from dgrpo.training import run as run_module

    out = tmp_path / "run"
    state_only_checkpoint(out / "checkpoints" / "step-00000004")
    (out / "config.json").write_text(json.dumps(to_dict(tiny_config())))
    write_whole = run_module._write_whole

    def full_at_config_json(path, text):
        if path.name == "config.json":
            raise OSError(errno_module.ENOSPC, "No space left on device", str(path))
        write_whole(path, text)

    changed = tiny_config(**{"grpo.lr": 0.5})
    monkeypatch.setattr(run_module, "_write_whole", full_at_config_json)
    with pytest.raises(OSError), grpo_run_dir(out, changed, allow_config_change=True) as run:
        run.resume(loads_no_base)
        run.start({"step": 4, "metrics_lines": 0})
    monkeypatch.setattr(run_module, "_write_whole", write_whole)
    with grpo_run_dir(out, changed, allow_config_change=True) as run:
        run.resume(loads_no_base)
        run.start({"step": 4, "metrics_lines": 0})
    assert sorted(p.name for p in out.glob("config*.json")) == ["config.0.json", "config.1.json", "config.json"]
    assert json.loads((out / "config.1.json").read_text())["started_at_step"] == 4
    assert json.loads((out / "config.json").read_text())["grpo"]["lr"] == 0.5
