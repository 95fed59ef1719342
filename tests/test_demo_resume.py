"""A demo run again in the same --out reads back the tasks that finished (``dgrpo.demo.task_records``), and only
those: the SFT and RL stages are replaced by stand-ins that count their calls and write what the real ones write
(an SFT checkpoint with its manifest, a test row, a run row, a wall time)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dgrpo.config import Config
from dgrpo.demo import pipeline
from dgrpo.demo.task_records import RECORD, read_record
from dgrpo.model.verified import write_manifest


class Stages:
    """Stand-in SFT and RL stages: each call is counted and leaves the rows the real stage leaves in ``demo``."""

    def __init__(self, monkeypatch):
        self.calls: list[tuple] = []
        monkeypatch.setattr(pipeline, "run_sft", self.sft)
        monkeypatch.setattr(pipeline, "run_arm", self.arm)

    def sft(self, demo, seed):
        self.calls.append(("sft", seed))
        final = pipeline.sft_checkpoint(demo, seed)
        final.mkdir(parents=True, exist_ok=True)
        (final / "model.safetensors").write_bytes(b"weights of seed %d" % seed)
        write_manifest(final)
        demo.models.append({"arm": "sft", "sft_seed": seed, "splits": {"test": {"accuracy": 0.5, "items": "10"}}})
        demo.wall[f"sft/seed{seed}"] = 1.0
        return f"SFT seed {seed}: done"

    def arm(self, demo, arm, s, r, ckpt):
        self.calls.append((arm, s, r))
        assert ckpt == pipeline.sft_checkpoint(demo, s)
        demo.models.append({"arm": arm, "sft_seed": s, "checkpoint": "final"})
        run_dir = pipeline.task_dir(demo, pipeline.Task(s, arm, r))
        demo.runs.append({"arm": arm, "sft_seed": s, "rl_seed": r, "dir": str(run_dir), "updates": 3})
        demo.wall[f"{arm}/sft{s}_rl{r}"] = 2.0
        return f"  {arm}, SFT seed {s}: done"


def new_demo(out: Path, resume: bool = True, **grpo) -> pipeline.Demo:
    base = Config()
    for k, v in grpo.items():
        setattr(base.grpo, k, v)
    return pipeline.Demo(base, out, [], [], {}, resume=resume)


def run_all(demo: pipeline.Demo) -> None:
    for task in [pipeline.Task(0), *pipeline.arm_tasks(0, 1, ["grpo_null"])]:
        pipeline.run_task(demo, task)


def test_a_finished_task_is_read_back_with_its_rows_and_line_not_run_again(monkeypatch, tmp_path, capsys):
    """The second run calls no stage and ends with the same models, runs and wall times, in the same order; each
    task's line is said again, marked as read back from its record."""
    stages = Stages(monkeypatch)
    first = new_demo(tmp_path)
    run_all(first)
    assert stages.calls == [("sft", 0), ("grpo_null", 0, 0)]
    assert (tmp_path / "sft" / "seed0" / RECORD).is_file() and (tmp_path / "arms/grpo_null/sft0_rl0" / RECORD).is_file()
    capsys.readouterr()
    again = new_demo(tmp_path)
    run_all(again)
    assert stages.calls == [("sft", 0), ("grpo_null", 0, 0)]  # nothing ran
    assert (again.models, again.runs, again.wall) == (first.models, first.runs, first.wall)
    assert (first.read_back, again.read_back) == ([], ["sft/seed0", "grpo_null/sft0_rl0"])
    said = capsys.readouterr().out.splitlines()
    assert said[0].startswith(f"[demo] SFT seed 0: done (read back from {tmp_path / 'sft' / 'seed0' / RECORD}")
    assert said[1].startswith("[demo]   grpo_null, SFT seed 0: done (read back from")


def test_a_demo_folder_moved_elsewhere_is_read_back_with_its_runs_where_they_now_are(monkeypatch, tmp_path):
    """The same demo resumed in its --out moved (or a relative --out named from another directory): its tasks are
    read back, and each RL run's row names its run folder where it now is (the figures read its metrics there; the
    row read back named the old place, gone, and the demo's end failed on it)."""
    stages = Stages(monkeypatch)
    run_all(new_demo(tmp_path / "a"))
    shutil.move(tmp_path / "a", tmp_path / "b")
    demo = new_demo(tmp_path / "b")
    run_all(demo)
    assert stages.calls == [("sft", 0), ("grpo_null", 0, 0)]  # nothing ran again
    assert [r["dir"] for r in demo.runs] == [str(tmp_path / "b" / "arms" / "grpo_null" / "sft0_rl0")]


def test_without_resume_every_task_runs_again(monkeypatch, tmp_path):
    """``--resume never`` (Demo.resume False): the records are there and match, and every task still runs."""
    stages = Stages(monkeypatch)
    run_all(new_demo(tmp_path))
    run_all(new_demo(tmp_path, resume=False))
    assert stages.calls == [("sft", 0), ("grpo_null", 0, 0)] * 2


def test_other_rl_settings_run_the_rl_runs_again_and_keep_the_sft_checkpoint(monkeypatch, tmp_path):
    """A grpo setting is in an RL run's fingerprint, not in an SFT run's (SFT does not read it)."""
    stages = Stages(monkeypatch)
    run_all(new_demo(tmp_path))
    run_all(new_demo(tmp_path, lr=3e-6))
    assert stages.calls == [("sft", 0), ("grpo_null", 0, 0), ("grpo_null", 0, 0)]


def test_other_perturbation_settings_run_the_rl_runs_again_and_keep_the_sft_checkpoint(monkeypatch, tmp_path):
    """The perturbation section, like grpo's, is an RL run's alone: SFT (which does not read it) is read back."""
    stages = Stages(monkeypatch)
    run_all(new_demo(tmp_path))
    demo = new_demo(tmp_path)
    demo.base.perturbation.kind = "gaussian"
    run_all(demo)
    assert stages.calls == [("sft", 0), ("grpo_null", 0, 0), ("grpo_null", 0, 0)]


def test_other_sft_settings_run_everything_again(monkeypatch, tmp_path):
    """An SFT setting changes the SFT run's fingerprint; its new checkpoint changes the RL run's (here the stand-in
    writes the same bytes, so it is the SFT setting in the arm's config that differs: either reruns it)."""
    stages = Stages(monkeypatch)
    run_all(new_demo(tmp_path))
    demo = new_demo(tmp_path)
    demo.base.sft.lr = demo.base.sft.lr * 2
    run_all(demo)
    assert stages.calls == [("sft", 0), ("grpo_null", 0, 0)] * 2


def test_an_rl_run_is_run_again_when_its_sft_checkpoint_changed(monkeypatch, tmp_path):
    """The SFT checkpoint's manifest is in its RL runs' fingerprints: an SFT run again into other weights (here its
    record deleted and the stand-in's weights changed) runs them again."""
    stages = Stages(monkeypatch)
    run_all(new_demo(tmp_path))
    (tmp_path / "sft" / "seed0" / RECORD).unlink()
    original = stages.sft

    def other_weights(demo, seed):
        line = original(demo, seed)
        (pipeline.sft_checkpoint(demo, seed) / "model.safetensors").write_bytes(b"other weights")
        write_manifest(pipeline.sft_checkpoint(demo, seed))
        return line

    monkeypatch.setattr(pipeline, "run_sft", other_weights)
    run_all(new_demo(tmp_path))
    assert stages.calls == [("sft", 0), ("grpo_null", 0, 0)] * 2


def test_other_problems_run_the_task_again(monkeypatch, tmp_path):
    """The problems are in the fingerprint: a pipeline tested on other items (experiments/valid_demo.py reads out on
    a validation split) does not read back the demo's rows, nor the demo its."""
    from dgrpo.data.records import Record

    stages = Stages(monkeypatch)
    pipeline.run_task(new_demo(tmp_path), pipeline.Task(0))
    other = new_demo(tmp_path)
    other.tests = {"test": [Record("What is 1 + 1?", [], "2")]}
    pipeline.run_task(other, pipeline.Task(0))
    pipeline.run_task(other, pipeline.Task(0))
    assert stages.calls == [("sft", 0)] * 2


def test_another_thread_count_runs_the_task_again(monkeypatch, tmp_path):
    """The last float bits depend on torch's threads: a record made with other threads is not read back."""
    stages = Stages(monkeypatch)
    threads = iter([1, 2])
    monkeypatch.setattr(pipeline.torch, "get_num_threads", lambda: next(threads))
    pipeline.run_task(new_demo(tmp_path), pipeline.Task(0))
    pipeline.run_task(new_demo(tmp_path), pipeline.Task(0))
    assert stages.calls == [("sft", 0)] * 2


@pytest.mark.parametrize("damage", ["checkpoint_changed", "checkpoint_gone", "record_cut", "record_of_a_list"])
def test_an_sft_run_whose_checkpoint_or_record_is_damaged_runs_again(monkeypatch, tmp_path, damage):
    """Its RL runs read the SFT checkpoint: a record of an SFT run whose final/ no longer matches its manifest, or is
    gone, is not read back; neither is a cut-short record or one that is not an object."""
    stages = Stages(monkeypatch)
    pipeline.run_task(new_demo(tmp_path), pipeline.Task(0))
    final, record = tmp_path / "sft" / "seed0" / "final", tmp_path / "sft" / "seed0" / RECORD
    if damage == "checkpoint_changed":
        (final / "model.safetensors").write_bytes(b"edited")
    elif damage == "checkpoint_gone":
        for f in final.iterdir():
            f.unlink()
        final.rmdir()
    elif damage == "record_cut":
        record.write_text(record.read_text()[:40])
    else:
        record.write_text(json.dumps([1, 2]))
    pipeline.run_task(new_demo(tmp_path), pipeline.Task(0))
    assert stages.calls == [("sft", 0)] * 2


def test_a_task_stopped_midway_leaves_no_record_to_read_back(monkeypatch, tmp_path):
    """A task deletes its record before it runs: one that fails (or is stopped) after an earlier run finished it
    leaves none, so the next run does not read back results of weights it has since written over."""
    stages = Stages(monkeypatch)
    pipeline.run_task(new_demo(tmp_path), pipeline.Task(0))

    def fails(demo, seed):
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline, "run_sft", fails)
    with pytest.raises(KeyboardInterrupt):
        pipeline.run_task(new_demo(tmp_path, resume=False), pipeline.Task(0))
    assert not (tmp_path / "sft" / "seed0" / RECORD).exists()
    assert not list((tmp_path / "sft" / "seed0").glob(".*.tmp"))
    assert stages.calls == [("sft", 0)]


def test_a_record_whose_write_fails_leaves_no_temporary_file(monkeypatch, tmp_path):
    """A full disk while a record is written: the error is raised, and neither the record nor its hidden temporary
    file is left (the temporary file was left behind before)."""
    Stages(monkeypatch)
    write = Path.write_text

    def full(self, *a, **k):
        if self.suffix == ".tmp":
            open(self, "w").close()  # (created, then nothing fits)
            raise OSError(28, "No space left on device", str(self))
        return write(self, *a, **k)

    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(OSError, match="No space left"):
        pipeline.run_task(new_demo(tmp_path), pipeline.Task(0))
    assert sorted(p.name for p in (tmp_path / "sft" / "seed0").iterdir()) == ["final"]


def test_a_record_keeps_only_its_own_tasks_rows(monkeypatch, tmp_path):
    """In one process the demo's rows accumulate over tasks: each record holds the rows its task added, not the
    earlier tasks' (a read back would count them twice)."""
    Stages(monkeypatch)
    demo = new_demo(tmp_path)
    run_all(demo)
    fp_of = json.loads((tmp_path / "arms/grpo_null/sft0_rl0" / RECORD).read_text())["fingerprint"]
    arm = read_record(tmp_path / "arms/grpo_null/sft0_rl0", fp_of)
    assert arm is not None
    assert arm["models"] == [{"arm": "grpo_null", "sft_seed": 0, "checkpoint": "final"}]
    assert arm["runs"] == demo.runs and arm["wall"] == {"grpo_null/sft0_rl0": 2.0}


def test_the_tasks_read_back_are_merged_over_workers_and_said_in_the_wall_time(tmp_path):
    """A pool's parts carry the tasks they read back into the demo (in SFT-seed order), and the report's wall time
    says how many of the runs were read back rather than run."""
    from dgrpo.demo import report

    demo = new_demo(tmp_path)
    parts = {i: new_demo(tmp_path) for i in (-1, 0)}
    parts[-1].read_back, parts[-1].wall = ["sft/seed1"], {"sft/seed1": 5.0}
    parts[0].wall = {"grpo_null/sft1_rl0": 2.0}
    demo.read_back, demo.wall = ["grpo_null/sft0_rl0"], {"sft/seed0": 4.0, "grpo_null/sft0_rl0": 1.0}
    pipeline.merge_seed(demo, pipeline.join_parts(parts))
    assert demo.read_back == ["grpo_null/sft0_rl0", "sft/seed1"]
    demo.wall["total"] = 12.0
    res = {"read_back": demo.read_back, "wall_s": demo.wall}
    assert report._wall_text(res) == "12 s (2 of 4 runs read back from an earlier run)"
    assert report._wall_text({"wall_s": {"total": 3.0, "sft/seed0": 3.0}}) == "3 s"
