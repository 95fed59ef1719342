"""The folder a run started in (``applied.json``'s ``started_in``), and ``dgrpo eval RUN`` reading the run's own
relative test sets (``data.test``, recorded as typed) from there when they name nothing from the working directory."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import make_lm, tiny_args, tiny_config

Q1 = '{"question": "Start with 1. Add 2.", "answer": "3"}\n'
Q2 = '{"question": "Start with 2. Add 2.", "answer": "4"}\n'


def _run_tested_on(sft_checkpoint: Path, run: Path, test: list[str], applied: list[dict] | None) -> Path:
    """A run directory ``run`` whose ``final/`` is a copy of ``sft_checkpoint`` tested on ``test`` (its
    run_config.json's data.test), with ``applied`` as its applied.json (None: none)."""
    from dgrpo.model.verified import write_manifest

    final = run / "final"
    shutil.copytree(sft_checkpoint, final)
    run_config = json.loads((final / "run_config.json").read_text())
    run_config["data"]["test"] = test
    (final / "run_config.json").write_text(json.dumps(run_config))
    write_manifest(final)
    if applied is not None:
        (run / "applied.json").write_text(json.dumps(applied))
    return run


def _folders(tmp_path: Path, *names: str) -> list[Path]:
    for name in names:
        (tmp_path / name / "data").mkdir(parents=True)
    return [tmp_path / name for name in names]


@pytest.mark.filterwarnings("ignore:the model's latent markers")
def test_a_grpo_trainer_records_the_folder_it_started_in(tokenizer, tmp_path, monkeypatch):
    """applied.json's entry (and summary.json's ``applied``, the same dict) names the folder the process started in:
    a run's data.test is recorded as typed, relative to it."""
    from dgrpo.data.synthetic import generate_split
    from dgrpo.training.grpo import GRPOTrainer

    monkeypatch.chdir(tmp_path)
    cfg = tiny_config()
    trainer = GRPOTrainer(make_lm(tokenizer), cfg, generate_split(cfg.task, "train")[:8])
    monkeypatch.chdir("/")  # (made in tmp_path: a later change of folder does not change it)
    assert trainer.applied()["started_in"] == str(tmp_path)


def test_eval_of_a_run_reads_its_relative_test_file_from_the_folder_it_started_in(
    tmp_path, sft_checkpoint, run_cli, monkeypatch
):
    """``dgrpo eval RUN`` from another folder than the run's refused a relative data.test ('a path relative to the
    folder that run started from, not found from ...'): the run did not record that folder. applied.json does now;
    eval reads the file from there, and names the results by the spec as typed."""
    project, elsewhere = _folders(tmp_path, "project", "elsewhere")
    (project / "data" / "t.jsonl").write_text(Q1)
    run = _run_tested_on(sft_checkpoint, tmp_path / "run", ["data/t.jsonl"], [{"started_in": str(project)}])
    monkeypatch.chdir(elsewhere)
    r = run_cli("eval", "--model", run, "--out", tmp_path / "e")
    assert r.returncode == 0, r.stderr[-2000:]
    result = json.loads((tmp_path / "e" / "results.json").read_text())
    assert (result["dataset"], result["n"]) == ("data/t.jsonl", 1)


def test_eval_of_a_run_reads_its_test_sets_from_the_working_directory_first(
    tmp_path, sft_checkpoint, run_cli, monkeypatch
):
    """The folder recorded is a hint: a relative test set found from the working directory is read from there (a run
    directory copied with its data); joined parts are looked for each on its own (t.jsonl here, u.jsonl where the run
    started); two test sets keep their results folders' names as typed."""
    project, here = _folders(tmp_path, "project", "here")
    (project / "data" / "t.jsonl").write_text(Q1)
    (project / "data" / "u.jsonl").write_text(Q2)
    (here / "data" / "t.jsonl").write_text(Q1 + Q2 + Q1)
    test = ["data/t.jsonl", "data/t.jsonl+data/u.jsonl"]
    run = _run_tested_on(sft_checkpoint, tmp_path / "run", test, [{"started_in": str(project)}])
    monkeypatch.chdir(here)
    r = run_cli("eval", "--model", run, "--out", tmp_path / "e")
    assert r.returncode == 0, r.stderr[-2000:]
    results = {p.name: json.loads((p / "results.json").read_text()) for p in (tmp_path / "e").iterdir()}
    assert {name: (r["dataset"], r["n"]) for name, r in results.items()} == {
        "data_t.jsonl": ("data/t.jsonl", 3),
        "data_t.jsonl+data_u.jsonl": ("data/t.jsonl+data/u.jsonl", 4),
    }


def test_eval_of_a_run_without_its_start_folder_or_with_its_data_gone_says_where_it_looked(
    tmp_path, sft_checkpoint, run_cli, monkeypatch
):
    """A run recorded before started_in (or a checkpoint copied out of its run directory) keeps the line that says to
    run eval from the run's folder; one whose folder lacks the file too says it looked there, and to name it."""
    project, elsewhere = _folders(tmp_path, "project", "elsewhere")
    old = _run_tested_on(sft_checkpoint, tmp_path / "old", ["data/t.jsonl"], [{"started_at_step": 0}])
    gone = _run_tested_on(sft_checkpoint, tmp_path / "gone", ["data/t.jsonl"], [{"started_in": str(project)}])
    monkeypatch.chdir(elsewhere)
    said = "dgrpo: error: --data: the checkpoint's run was tested on data/t.jsonl (its data.test), a path relative to"
    r = run_cli("eval", "--model", old, "--out", tmp_path / "e")
    assert r.returncode == 2 and said in r.stderr and f"not found from {elsewhere}: run dgrpo eval from" in r.stderr
    r = run_cli("eval", "--model", gone, "--out", tmp_path / "e")
    where = f"not found from {elsewhere} nor from {project} (where its run started): name the file with --data"
    assert r.returncode == 2 and said in r.stderr and where in r.stderr, r.stderr
    assert not (tmp_path / "e").exists()


def test_eval_of_a_run_reads_its_relative_dataset_folder_from_where_it_started(
    tmp_path, sft_checkpoint, run_cli, monkeypatch
):
    """A save_to_disk folder named relative to the run's folder (data.test=mine:test) was looked up on the hub from
    elsewhere ('no folder or file from ..., nor read from the hub'); it is read from the folder the run started in,
    without the hub. One that folder lacks too says so, with the folder."""
    datasets = pytest.importorskip("datasets")
    from dgrpo.data import loaders

    monkeypatch.setattr(loaders, "hub_reachable", lambda: False)  # (no network in tests: at once, as offline)
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    project, elsewhere = _folders(tmp_path, "project", "elsewhere")
    rows = datasets.Dataset.from_list([json.loads(Q1), json.loads(Q2)])
    datasets.DatasetDict({"test": rows}).save_to_disk(str(project / "mine"))
    run = _run_tested_on(sft_checkpoint, tmp_path / "run", ["mine:test"], [{"started_in": str(project)}])
    monkeypatch.chdir(elsewhere)
    r = run_cli("eval", "--model", run, "--out", tmp_path / "e")
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads((tmp_path / "e" / "results.json").read_text())["dataset"] == "mine:test"
    shutil.rmtree(project / "mine")
    r = run_cli("eval", "--model", run, "--out", tmp_path / "e2")
    said = f"no folder or file from {elsewhere} nor from {project} (where its run started), nor read from the hub"
    assert r.returncode == 2 and said in r.stderr and r.stderr.rstrip().endswith("name the data with --data")


def test_the_folders_a_checkpoint_s_run_started_in(tmp_path):
    """The latest start first, each once; entries without started_in (written before it) skipped; a resumable
    checkpoint's: the processes that started before its step only (a later one resumed from it); a checkpoint outside
    a run directory's layout, or a run without applied.json: none."""
    from dgrpo.training.resume_check import start_folders

    a, b, c = (str(tmp_path / x) for x in "abc")
    entries = [{"started_at_step": 0, "started_in": a}, {"started_at_step": 4}, {"started_at_step": 6, "started_in": b}]
    entries += [{"started_at_step": 8, "started_in": a}, {"started_at_step": 9, "started_in": c}]
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "applied.json").write_text(json.dumps(entries))
    run = tmp_path / "run"
    for name in ("final", "best", "stage-2"):
        assert start_folders(run / name) == [Path(c), Path(a), Path(b)]
    assert start_folders(run / "checkpoints" / "step-00000008" / "model") == [Path(b), Path(a)]
    assert start_folders(run / "checkpoints" / "step-00000006" / "model") == [Path(a)]
    assert start_folders(run / "elsewhere") == [] and start_folders(tmp_path / "final") == []


def test_a_spec_read_from_where_the_run_started_keeps_names_and_what_is_found_here(tmp_path, monkeypatch):
    """Only a relative part naming nothing from here and a local file or folder there is read from there: built-in
    names, a built-in dataset's name over a plain folder of that name (GSM8K there too), absolute paths and hub names
    found nowhere as they are."""
    from dgrpo.training.resume_check import data_spec_from

    there, here = _folders(tmp_path, "there", "here")
    (there / "data" / "t.jsonl").write_text(Q1)
    (there / "gsm8k").mkdir()
    (here / "h.jsonl").write_text(Q1)
    monkeypatch.chdir(here)
    folders = [tmp_path / "none", there]
    assert data_spec_from("data/t.jsonl", folders) == str(there / "data" / "t.jsonl")
    assert data_spec_from("data/t.jsonl:test", folders) == f"{there / 'data' / 't.jsonl'}:test"
    assert data_spec_from("h.jsonl+data/t.jsonl", folders) == f"h.jsonl+{there / 'data' / 't.jsonl'}"
    for same in ("builtin:test", "gsm8k:test", "org/name:test", "h.jsonl", str(here / "h.jsonl"), "data/u.jsonl"):
        assert data_spec_from(same, folders) == same
    assert data_spec_from("data/t.jsonl", []) == "data/t.jsonl"


def test_an_sft_run_records_its_folder_and_eval_reads_its_test_file_from_elsewhere(tmp_path, run_cli, monkeypatch):
    """End to end: ``dgrpo sft`` tested on a relative file, started in its project folder; ``dgrpo eval RUN`` from
    another folder evaluates that file, its results named as the run's own."""
    project, elsewhere = _folders(tmp_path, "project", "elsewhere")
    (project / "data" / "t.jsonl").write_text(Q1 + Q2)
    monkeypatch.chdir(project)
    small = {"task.n_train": 8, "task.n_valid": 4, "sft.num_epochs": 1, "sft.batch_size": 8, "sft.warmup_steps": 0}
    small["data.test"] = "[data/t.jsonl]"
    r = run_cli("sft", "--out", tmp_path / "run", *tiny_args(**small))
    assert r.returncode == 0, r.stderr[-2000:]
    [entry] = json.loads((tmp_path / "run" / "applied.json").read_text())
    assert entry["started_in"] == str(project)
    monkeypatch.chdir(elsewhere)
    r = run_cli("eval", "--model", tmp_path / "run", "--out", tmp_path / "e")
    assert r.returncode == 0, r.stderr[-2000:]
    ours = json.loads((tmp_path / "e" / "results.json").read_text())
    theirs = json.loads((tmp_path / "run" / "eval" / "data_t.jsonl" / "results.json").read_text())
    assert (ours["dataset"], ours["n"], ours["correct"]) == (theirs["dataset"], 2, theirs["correct"])


def test_starting_over_removes_the_stage_folders_and_keeps_a_copy_of_one(tmp_path):
    """``--resume never`` removes SFT's stage-K/ folders and nothing else named like them: a glob ``stage-[0-9]*``
    also took in a user's copy ``stage-1.bak`` (a checkpoint copied with its manifest) and deleted it."""
    from dgrpo.config import to_dict
    from dgrpo.model.verified import MANIFEST
    from dgrpo.run_layout import stage_dirs
    from dgrpo.training.distributed import Dist
    from dgrpo.training.run import RunDir

    cfg, out = tiny_config(), tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_text(json.dumps(to_dict(cfg)))
    for name in ("stage-1", "stage-10", "stage-2", "stage-1.bak", "stage-x"):
        (out / name).mkdir()
        (out / name / MANIFEST).write_text("{}")
    for name in ("config.0.json", "config.1.json", "config.2.orig.json", "config.old.json"):
        (out / name).write_text("{}")
    assert [p.name for p in stage_dirs(out)] == ["stage-1", "stage-2", "stage-10"]  # (by stage, not by name)
    with RunDir(out, cfg, Dist.single(), "sft", resume="never", log=lambda line: None):
        pass
    assert sorted(p.name for p in out.glob("stage-*")) == ["stage-1.bak", "stage-x"]
    assert sorted(p.name for p in out.glob("config.*.json")) == ["config.2.orig.json", "config.old.json"]


def test_a_changed_config_is_kept_after_the_last_of_the_history_beside_a_users_copy(tmp_path):
    """``config.N.json`` numbers the configs a resumed run changed to: the next is after the highest N (10 after 9,
    not by name), and a user's copy beside them (``config.old.json``) is neither counted nor a crash (it was
    ``int('old')``: a ValueError when the resumed run wrote its config)."""
    from types import SimpleNamespace

    from dgrpo.training.run import RunDir

    for name in ("config.0.json", "config.9.json", "config.old.json", "config.12.orig.json"):
        (tmp_path / name).write_text("{}")
    lines: list[str] = []
    run = SimpleNamespace(out_dir=tmp_path, first_config={}, cfg={"a": 1}, changed=["grpo.lr"], log=lines.append)
    RunDir._keep_config_history(run, 7)
    assert json.loads((tmp_path / "config.10.json").read_text()) == {"started_at_step": 7, "config": {"a": 1}}
    assert lines == ["dgrpo: config changed at step 7 (grpo.lr); kept as config.10.json"]
