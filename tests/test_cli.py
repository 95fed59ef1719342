"""The command line: SFT then eval end to end (subprocess, slow), and every error path in-process: a bad config,
a bad data file or a missing checkpoint exits with code 2 and one line, writing nothing."""

import json
import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

from conftest import DEAF_KIND, SHARED_DATA, dgrpo, tiny_args

#: a shorter SFT than the session fixture's: one epoch per stage, 1024 problems
SHORT_SFT = {
    "task.n_train": 1024,
    "task.n_valid": 32,
    "task.n_test": 32,
    "sft.epochs_per_stage": 1,
    "sft.num_epochs": 2,
    "sft.warmup_steps": 2,
}


@pytest.mark.slow
def test_sft_then_eval_end_to_end(tmp_path):
    run = tmp_path / "sft"
    r = dgrpo("sft", "--out", run, *tiny_args(**SHORT_SFT))
    assert r.returncode == 0, r.stderr[-2000:]
    for sub in ("stage-0", "stage-1", "final"):
        assert (run / sub / "model.safetensors").exists() and (run / sub / "tokenizer.json").exists()
    latent = json.loads((run / "final" / "latent_config.json").read_text())
    assert latent == {
        "mode": "coconut",
        "c_thought": 1,
        "stage": 1,
        "n_latent": 1,
        "chat_template": False,
        "markers": True,
    }
    stage_rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if "eval/valid/accuracy" in x]
    assert [row["stage"] for row in stage_rows] == [0, 1]
    ev = tmp_path / "ev"
    r = dgrpo("eval", "--model", run, "--data", "builtin:test", "--limit", 16, "--out", ev, "--set", "task.n_test=32")
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads((ev / "results.json").read_text())
    assert {"accuracy", "n", "correct", "unparseable", "dataset", "seed"} <= set(res) and res["n"] == 16
    preds = (ev / "predictions.jsonl").read_text().splitlines()
    assert len(preds) == 16 and {"question", "gold", "completion", "correct"} <= set(json.loads(preds[0]))
    # the saved weights load in plain transformers too
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(run / "final")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["cot", "no_cot", "pause", "no_curriculum"])
def test_sft_baselines_run(tmp_path, mode, run_cli):
    over = {**SHORT_SFT, "sft.mode": mode, "task.n_train": 256, "data.valid": "''", "sft.eval_each_stage": "false"}
    r = run_cli("sft", "--out", tmp_path / mode, *tiny_args(**over))
    assert r.returncode == 0, r.stderr[-2000:]
    latent = json.loads((tmp_path / mode / "final" / "latent_config.json").read_text())
    expect = {"cot": ("cot", 0), "no_cot": ("no_cot", 0), "pause": ("pause", 1), "no_curriculum": ("coconut", 1)}[mode]
    assert (latent["mode"], latent["n_latent"]) == expect
    # eval.n_latent for a model trained without latent thoughts does not apply, and says so (it was dropped silently)
    argv = ["--data", "builtin:test", "--limit", 2, "--set", "eval.n_latent=2", "--out", tmp_path / "e"]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        r = run_cli("eval", "--model", tmp_path / mode / "final", *argv)
    res = json.loads((tmp_path / "e" / "results.json").read_text())
    assert r.returncode == 0 and res["n_latent"] == (0 if mode in ("cot", "no_cot") else 2), r.stderr[-2000:]
    said = any("eval.n_latent=2 does not apply" in str(w.message) for w in seen)
    assert said is (mode in ("cot", "no_cot")), [str(w.message) for w in seen]


@pytest.mark.slow
def test_eval_without_data_evaluates_the_runs_own_test_sets(tmp_path, sft_checkpoint, run_cli):
    """``--data`` was required: evaluating a run as it tested itself meant copying its data.test. It defaults to the
    test sets the checkpoint's run recorded (or data.test as --set gives it); a model that names none is one line."""
    r = run_cli("eval", "--model", sft_checkpoint, "--limit", 2, "--out", tmp_path / "own")
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads((tmp_path / "own" / "results.json").read_text())["dataset"] == "builtin:test"
    argv = ["--limit", 2, "--set", "data.test=[builtin:test,builtin:ood_steps]", "--out", tmp_path / "two"]
    assert run_cli("eval", "--model", sft_checkpoint, *argv).returncode == 0
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == ["builtin_ood_steps", "builtin_test"]
    bare = tmp_path / "bare"
    shutil.copytree(sft_checkpoint, bare)
    (bare / "run_config.json").unlink()
    for argv, said in (
        ([], f"--data: name the datasets to evaluate ({bare} names none)"),
        (["--set", "data.test=[]"], f"--data: name the datasets to evaluate ({bare} names none)"),
    ):
        r = run_cli("eval", "--model", bare, *argv, "--out", tmp_path / "none")
        assert r.returncode == 2 and f"dgrpo: error: {said}" in r.stderr, r.stderr
    r = run_cli("eval", "--model", sft_checkpoint, "--set", "data.test=[]", "--out", tmp_path / "none")
    assert r.returncode == 2 and "(its data.test is [])" in r.stderr, r.stderr
    assert not (tmp_path / "none").exists()


def _with_run_config(checkpoint: Path, copy: Path, section: str, key: str, value: Any) -> Path:
    """A copy of ``checkpoint`` whose run_config.json sets ``section.key`` to ``value`` (its manifest rewritten)."""
    from dgrpo.model.verified import write_manifest

    shutil.copytree(checkpoint, copy)
    run_config = json.loads((copy / "run_config.json").read_text())
    run_config[section][key] = value
    (copy / "run_config.json").write_text(json.dumps(run_config))
    write_manifest(copy)
    return copy


def test_eval_of_a_run_tested_on_a_relative_file_says_where_it_is_read_from(
    tmp_path, sft_checkpoint, run_cli, monkeypatch
):
    """A run keeps its data.test as typed: eval without --data from another folder than the run's read 'data/t.jsonl:
    file not found (a relative path is read from the working directory, ...)', naming no run. The line now says the
    path is the checkpoint's run's, relative to the folder it started from; from that folder it evaluates."""
    ckpt = _with_run_config(sft_checkpoint, tmp_path / "ckpt", "data", "test", ["data/t.jsonl"])
    (tmp_path / "project" / "data").mkdir(parents=True)
    (tmp_path / "project" / "data" / "t.jsonl").write_text('{"question": "Start with 1. Add 2.", "answer": "3"}\n')
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    r = run_cli("eval", "--model", ckpt, "--out", tmp_path / "e")
    said = "dgrpo: error: --data: the checkpoint's run was tested on data/t.jsonl (its data.test), a path relative to"
    assert r.returncode == 2 and said in r.stderr and str(tmp_path / "elsewhere") in r.stderr, r.stderr
    monkeypatch.chdir(tmp_path / "project")
    assert run_cli("eval", "--model", ckpt, "--out", tmp_path / "e").returncode == 0
    assert json.loads((tmp_path / "e" / "results.json").read_text())["dataset"] == "data/t.jsonl"


def test_eval_of_a_run_tested_on_relative_files_joined_checks_each_file(tmp_path, sft_checkpoint, run_cli, monkeypatch):
    """A run tested on relative files joined by '+' (data/t.jsonl+data/u.jsonl, which --data reads as the two files
    in turn): eval without --data took the whole spec for one path, not found, and refused from the very folder the
    run started in. Each file is checked; a missing one is named."""
    ckpt = _with_run_config(sft_checkpoint, tmp_path / "ckpt", "data", "test", ["data/t.jsonl+data/u.jsonl"])
    (tmp_path / "project" / "data").mkdir(parents=True)
    (tmp_path / "project" / "data" / "t.jsonl").write_text('{"question": "Start with 1. Add 2.", "answer": "3"}\n')
    (tmp_path / "project" / "data" / "u.jsonl").write_text('{"question": "Start with 2. Add 2.", "answer": "4"}\n')
    monkeypatch.chdir(tmp_path / "project")
    r = run_cli("eval", "--model", ckpt, "--out", tmp_path / "e")
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads((tmp_path / "e" / "results.json").read_text())["n"] == 2
    (tmp_path / "project" / "data" / "u.jsonl").unlink()
    r = run_cli("eval", "--model", ckpt, "--out", tmp_path / "e2")
    said = "tested on data/u.jsonl (of data/t.jsonl+data/u.jsonl) (its data.test), a path relative to the folder"
    assert r.returncode == 2 and said in r.stderr, r.stderr


def test_eval_of_a_checkpoint_whose_task_has_an_option_unknown_here_names_the_checkpoint(
    tmp_path, sft_checkpoint, run_cli
):
    """A checkpoint written by another dgrpo, whose run_config.json defines the task with an option this one does not
    know: eval said 'unknown config key 'task.old_key'', as if the command line had given it. It names the file."""
    ckpt = _with_run_config(sft_checkpoint, tmp_path / "ckpt", "task", "old_key", 1)
    r = run_cli("eval", "--model", ckpt, "--data", "builtin:test", "--out", tmp_path / "e")
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].startswith(
        f"dgrpo: error: {ckpt / 'run_config.json'} defines the task with task.old_key, not an option of this dgrpo ("
    ), r.stderr


def test_eval_split_over_the_runs_test_sets_that_it_makes_one_is_one_line_naming_them(
    tmp_path, sft_checkpoint, run_cli
):
    """``--split valid`` without --data over a run tested on builtin:test and builtin:ood_steps (both builtin:valid
    then) said '--data builtin:test and builtin:ood_steps: both would write ... (name each dataset once)': no --data
    was given, and each was named once. The line names data.test and the split."""
    argv = ["--set", "data.test=[builtin:test,builtin:ood_steps]", "--split", "valid", "--out", tmp_path / "e"]
    r = run_cli("eval", "--model", sft_checkpoint, *argv)
    said = "dgrpo: error: --split valid: data.test's builtin:test and builtin:ood_steps both become builtin:valid: name"
    assert r.returncode == 2 and said in r.stderr, r.stderr
    assert not (tmp_path / "e").exists()


def test_eval_refuses_a_file_where_a_datasets_results_folder_goes_before_evaluating(tmp_path, sft_checkpoint, run_cli):
    """``--out`` holding a file named as one dataset's results folder: FileExistsError's traceback once that dataset
    was evaluated (under torchrun rank 0's, the others ending without a word). One line at the start now."""
    out = tmp_path / "e"
    out.mkdir()
    (out / "builtin_valid").write_text("")
    r = run_cli("eval", "--model", sft_checkpoint, "--data", "builtin:test", "builtin:valid", "--out", out)
    said = f"dgrpo: error: --out: builtin:valid's results folder {out / 'builtin_valid'} exists and is not a directory"
    assert r.returncode == 2 and said in r.stderr, r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["builtin_valid"]


def test_eval_says_that_fsdp_is_not_applied(tmp_path, sft_checkpoint, run_cli, monkeypatch):
    """``fsdp`` (from ``--config RUN/config.json`` of an FSDP run) in dgrpo eval: one process said to launch with
    torchrun, under which it was ignored without a word (every rank loads the whole model). One line says so; from
    DGRPO_FSDP too (a second line, the training commands', said to launch with torchrun)."""
    for how in ("config", "env"):
        monkeypatch.setenv("DGRPO_FSDP", "full" if how == "env" else "")
        argv = ["--data", "builtin:test", "--limit", 2, "--out", tmp_path / how]
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            r = run_cli("eval", "--model", sft_checkpoint, *argv, *(["--set", "fsdp=full"] if how == "config" else []))
        assert r.returncode == 0, r.stderr[-2000:]
        lines = [str(w.message) for w in seen if "fsdp" in str(w.message)]
        assert lines == [
            "fsdp=full (DGRPO_FSDP or the config key) is not applied by dgrpo eval: every rank loads the "
            "whole model (under torchrun each answers its shard of every dataset)"
        ], (how, lines)


def test_eval_says_that_top_p_does_nothing_under_greedy_decoding(tmp_path, sft_checkpoint, run_cli):
    """``eval.top_p`` with ``eval.temperature=0`` was accepted and changed nothing, without a word; with sampling it
    is read, and nothing is said."""
    for temperature, said in ((0, True), (0.7, False)):
        argv = ["--data", "builtin:test", "--limit", 2, "--out", tmp_path / f"e{temperature}"]
        argv += ["--set", "eval.top_p=0.9", "--set", f"eval.temperature={temperature}"]
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            r = run_cli("eval", "--model", sft_checkpoint, *argv)
        assert r.returncode == 0, r.stderr[-2000:]
        lines = [str(w.message) for w in seen]
        assert any("eval.top_p=0.9 changes nothing with eval.temperature=0" in m for m in lines) is said, lines


def test_plain_causal_lm_eval(tmp_path, sft_checkpoint, run_cli):
    r = run_cli(
        "eval",
        "--model",
        sft_checkpoint,
        "--data",
        "builtin:test",
        "--plain",
        "--shots",
        2,
        "--limit",
        8,
        "--out",
        tmp_path,
        "--set",
        "task.n_test=16",
        "--set",
        "eval.max_new_tokens=16",
    )
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["mode"] == "plain" and res["n"] == 8


@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="data folder not present (set DGRPO_DATA_DIR)")
def test_data_inspect_last_line_is_json(run_cli):
    r = run_cli("data", "inspect", SHARED_DATA / "svamp" / "SVAMP.json")
    assert r.returncode == 0, r.stderr
    last = json.loads(r.stdout.strip().splitlines()[-1])
    assert last["n"] == 1000 and {"question", "steps", "answer"} <= set(last["example"])
    r = run_cli("data", "inspect", "gsm8k", "--split", "train")
    assert json.loads(r.stdout.strip().splitlines()[-1])["n"] == 7473


def test_data_inspect_of_a_damaged_parquet_file_is_one_line(tmp_path, capfd):
    """A file named .parquet that is not one: dgrpo's one line, without the datasets library's logged 'Failed to read
    schema from ...' line above it."""
    pytest.importorskip("datasets")
    from dgrpo.cli import main

    bad = tmp_path / "bad.parquet"
    bad.write_text("not parquet")
    capfd.readouterr()
    assert main(["data", "inspect", str(bad)]) == 2
    err = capfd.readouterr().err.strip()
    assert err.startswith(f"dgrpo: error: {bad}: not a readable parquet file") and "\n" not in err, err


def test_builtin_splits_share_no_question_with_the_test_split():
    """valid, which picks GRPO's best/ checkpoint, shares no question with test (3 of the demo's first 500 validation
    problems were test problems: the choice read the test split), nor does train; the other splits hold problems
    of another length or other numbers."""
    from dgrpo.config import TaskConfig
    from dgrpo.data.synthetic import generate_split

    for task in (TaskConfig(), TaskConfig(n_train=2000, n_valid=200, n_test=200, n_steps=3)):
        test = {r.question for r in generate_split(task, "test")}
        for split in ("valid", "train"):
            assert not test & {r.question for r in generate_split(task, split)}, (task, split)


def test_builtin_inspect(run_cli, tmp_path):
    r = run_cli("data", "inspect", "builtin:ood_steps?n_test=10")
    last = json.loads(r.stdout.strip().splitlines()[-1])
    assert last["n"] == 10 and len(last["example"]["steps"]) == 6
    r = run_cli("data", "inspect", "builtin:test", "--set", "task.n_test=7")  # the task's options, as training's
    assert json.loads(r.stdout.strip().splitlines()[-1])["n"] == 7
    own = tmp_path / "own.csv"  # a file of the user's columns, previewed with the mapping training will use
    own.write_text("prompt,target\nWhat is 2 plus 2?,4\n")
    r = run_cli("data", "inspect", own, "--set", "data.question_key=prompt", "data.answer_key=target")
    example = json.loads(r.stdout.strip().splitlines()[-1])["example"]
    assert (example["question"], example["answer"]) == ("What is 2 plus 2?", "4"), r.stderr
    r = run_cli("data", "inspect", own, "--split", "nonsense")  # a file has no splits (was ignored, exit 0)
    assert r.returncode == 2 and "--split nonsense: " in r.stderr and "is a file, which has no splits" in r.stderr
    # joined datasets name each part's split (--split replaced every part's: the valid split twice)
    r = run_cli("data", "inspect", "builtin:test+builtin:ood_steps", "--split", "valid")
    assert r.returncode == 2 and "joins datasets; name each part's split in --data" in r.stderr, r.stderr


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--set", "sft.c_thought=0"], "sft.c_thought"),
        (["--set", "sft.lr=fast"], "sft.lr"),
        (["--set", "sft.nope=1"], "unknown config key 'sft.nope'"),
        (["--set", "perturbation.p=1.5"], "perturbation.p"),
        (["--set", "grpo.alpha_min=0.9", "--set", "grpo.alpha_max=0.5"], "alpha_min"),
        (["--set", "grpo.group_size=1"], "K >= 2"),
        (["--set", "grpo.n_latent=-3"], "grpo.n_latent"),
        (["--config", "/nonexistent.yaml"], "config file not found"),
    ],
)
def test_invalid_config_exits_2_with_one_line(tmp_path, args, needle, run_cli):
    r = run_cli("sft", "--out", tmp_path / "x", *args)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], r.stderr
    assert not (tmp_path / "x").exists()  # nothing partial written


@pytest.mark.slow  # a fresh interpreter: a few seconds
def test_output_into_a_closed_pipe_ends_quietly():
    """``dgrpo config show | head -1``: the reader stops early; the command ends with 141 (128 + SIGPIPE) and no
    traceback, as Unix tools do."""
    p = subprocess.Popen(
        [sys.executable, "-m", "dgrpo", "config", "show"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert p.stdout is not None and p.stderr is not None
    p.stdout.close()  # closed before the child has imported anything, let alone written
    err = p.stderr.read().decode()
    assert p.wait(timeout=60) == 141 and err == ""


def test_one_process_commands_under_torchrun_are_refused(tmp_path, run_cli, monkeypatch):
    """consolidate under torchrun: each rank wrote the same model.safetensors and manifest at once. A missing folder
    to consolidate says so (it said there was no sharded checkpoint in it). (dgrpo eval shards its datasets over the
    ranks: tests/test_distributed.py.)"""
    r = run_cli("consolidate", tmp_path / "nope")
    assert r.returncode == 2 and f"{tmp_path / 'nope'}: not found" in r.stderr, r.stderr
    monkeypatch.setenv("WORLD_SIZE", "2")
    r = run_cli("consolidate", tmp_path / "nope")
    assert r.returncode == 2 and "dgrpo consolidate runs in one process: launch it without torchrun" in r.stderr
    for argv in (
        ["export", tmp_path / "nope", "--out", tmp_path / "e"],
        ["import-coconut", tmp_path / "nope", "--base", tmp_path / "b", "--out", tmp_path / "i", "--c-thought", 1],
        ["plot", tmp_path / "nope", "--out", tmp_path / "p.png"],
        ["demo", "--quick", "--out", tmp_path / "d"],  # (the ranks raced for its folder: one lost, torchrun killed all)
        ["bench", "--quick", "--only", "flops", "--out", tmp_path / "b"],  # (each rank ran it, writing the same files)
    ):  # (the review: every rank wrote the same files too)
        r = run_cli(*argv)
        assert r.returncode == 2 and f"dgrpo {argv[0]} runs in one process: launch it without torchrun" in r.stderr
    assert not (tmp_path / "d").exists() and not (tmp_path / "b").exists()


def test_under_torchrun_a_usage_error_is_printed_by_each_machines_first_worker(tmp_path, run_cli, monkeypatch):
    """Every rank parses the same arguments: the usage and the error were printed once per rank. A LOCAL_RANK alone
    (another launcher's, in one process) prints it."""
    for world, local_rank, printed in (("2", "0", True), ("2", "1", False), ("1", "1", True)):
        monkeypatch.setenv("WORLD_SIZE", world)
        monkeypatch.setenv("LOCAL_RANK", local_rank)
        r = run_cli("grpo", "--bogus-flag", "--out", tmp_path / "x")
        assert r.returncode == 2 and ("error: unrecognized arguments: --bogus-flag" in r.stderr) == printed, r.stderr
        assert (r.stderr == "") != printed


def test_under_torchrun_a_worker_ending_on_a_usage_error_ignores_torchruns_sigterm(monkeypatch, capsys):
    """``torchrun ... -m dgrpo grpo --bogus``: the first worker to exit 2 made torchrun SIGTERM the other, which died of
    it in its teardown (reported ``-15 (SIGTERM)``, 3 of 3 jobs) instead of exiting 2, as a refused config does. A
    usage error ignores SIGTERM from then on under torchrun; ``--help`` (exit 0), or one process, keeps the handler."""
    import signal

    from dgrpo import cli

    cases = (("2", ["grpo", "--bogus"], 2, signal.SIG_IGN), ("2", ["--help"], 0, signal.SIG_DFL))
    for world, argv, code, handler in (*cases, ("", ["grpo", "--bogus"], 2, signal.SIG_DFL)):
        monkeypatch.setattr(sys, "argv", ["dgrpo", *argv])
        for var, value in (("WORLD_SIZE", world), ("LOCAL_RANK", "1")):
            monkeypatch.setenv(var, value) if world else monkeypatch.delenv(var, raising=False)
        previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
        try:
            with pytest.raises(SystemExit) as e:
                cli.entry()
            assert (e.value.code or 0, signal.getsignal(signal.SIGTERM)) == (code, handler), argv
        finally:
            signal.signal(signal.SIGTERM, previous)
    capsys.readouterr()


@pytest.mark.slow
def test_missing_checkpoint_and_unknown_dataset_exit_2(tmp_path, run_cli, monkeypatch):
    r = run_cli("eval", "--model", tmp_path / "nope", "--data", "builtin:test", "--out", tmp_path / "o")
    assert r.returncode == 2 and "checkpoint directory not found" in r.stderr
    own = tmp_path / "own.jsonl"  # (a file read with a checkpoint's column mapping: its error came first, misleading)
    own.write_text('{"prompt": "2+2?", "target": 4}\n')
    for model in (tmp_path / "nope", "runs/mistyped"):
        with monkeypatch.context() as m:
            m.setattr("dgrpo.model.sources.hub_reachable", lambda: False)  # (runs/mistyped may be a hub id)
            r = run_cli("eval", "--model", model, "--data", own, "--out", tmp_path / "o")
        assert r.returncode == 2 and "unrecognised record keys" not in r.stderr, r.stderr
        assert "checkpoint directory not found" in r.stderr or "'runs/mistyped': not a local directory" in r.stderr
    r = run_cli("data", "inspect", "definitely_not_a_dataset_xyz")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1


def test_model_paths_resolve_to_their_checkpoint(tmp_path):
    """A run directory names its final/, a resumable checkpoint (checkpoints/step-N) the model it holds, a checkpoint
    directory itself; a run without final/ is told which of its checkpoints it can name."""
    from dgrpo.model.factory import resolve_checkpoint
    from dgrpo.model.verified import CheckpointError

    run = tmp_path / "run"
    step = run / "checkpoints" / "step-00000002"
    for d in (step / "model", run / "best"):
        d.mkdir(parents=True)
        (d / "config.json").write_text("{}")
        (d / "model.safetensors").write_bytes(b"")
    (step / "state.json").write_text("{}")
    (run / "metrics.jsonl").write_text("")
    assert resolve_checkpoint(step) == step / "model"
    assert resolve_checkpoint(run / "best") == run / "best"
    with pytest.raises(CheckpointError, match=r"without final/.*checkpoints/step-N\)"):
        resolve_checkpoint(run)
    (run / "final").mkdir()
    (run / "final" / "config.json").write_text("{}")
    (run / "final" / "model.safetensors").write_bytes(b"")
    assert resolve_checkpoint(run) == run / "final"


def test_yaml_booleans_in_string_options():
    """YAML reads true/false/on/off as booleans: a string option documented as 'true' must accept them."""
    from dgrpo.config import Config, ConfigError, load_config

    assert load_config(Config, None, ["sft.bf16=true"]).sft.bf16 == "true"
    assert load_config(Config, None, ["sft.bf16=false"]).sft.bf16 == "false"
    assert load_config(Config, None, ["fsdp=sharded"]).fsdp == "sharded"
    assert load_config(Config, None, ["fsdp=off"]).fsdp == "none"  # (as DGRPO_FSDP=off)
    with pytest.raises(ConfigError, match="expected none, full or sharded"):
        load_config(Config, None, ["fsdp=maybe"])


def test_yaml_configs_in_repo_are_valid():
    from dgrpo.config import Config, load_config, packaged_configs

    names = packaged_configs()
    assert names
    for name in names:
        load_config(Config, name)


@pytest.mark.parametrize(
    "content,needle",
    [
        ('{"question": "q", "answer": "#### 3"}\n{"question": "q2"\n', "line 2"),
        ('{"question": "q", "answer": "#### 3"}\n{"question": "q2", "nothing": 1}\n', "line 2"),
        ("", "the file is empty"),
    ],
)
def test_bad_data_file_exits_2_naming_file_and_line(tmp_path, content, needle, run_cli):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(content)
    out = tmp_path / "run"
    r = run_cli("sft", "--out", out, "--set", f"data.train={bad}")
    assert r.returncode == 2, r.stderr
    line = r.stderr.strip().splitlines()
    assert len(line) == 1 and str(bad) in line[0] and needle in line[0], r.stderr
    assert not out.exists()


def test_unknown_yaml_key_and_unknown_dataset_exit_2(tmp_path, run_cli):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("grpo:\n  stepz: 3\n")
    r = run_cli("grpo", "--config", cfg, "--init", tmp_path, "--out", tmp_path / "o")
    assert r.returncode == 2 and "grpo.stepz" in r.stderr and str(cfg) in r.stderr
    r = run_cli("sft", "--out", tmp_path / "o", "--set", "data.train=not_a_dataset_qq")
    assert r.returncode == 2 and "not_a_dataset_qq" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_grpo_missing_init_exits_2(tmp_path, run_cli):
    r = run_cli("grpo", "--init", tmp_path / "missing", "--out", tmp_path / "o", "--set", "task.n_train=64")
    assert r.returncode == 2 and "checkpoint directory not found" in r.stderr
    assert not (tmp_path / "o").exists()


def test_grpo_reruns_a_runs_config_without_init(sft_checkpoint, tmp_path, run_cli):
    """--config RUN/config.json names what the run started from (model.name_or_path): --init defaults to it (it
    stopped on argparse's "--init is required"); without either, one line that says what to give."""
    sets = {"grpo.steps": 1, "grpo.warmup_steps": 0, "data.valid": "", "data.test": "[]"}
    r = run_cli("grpo", "--init", sft_checkpoint, *tiny_args(**sets), "--out", tmp_path / "a")
    assert r.returncode == 0, r.stderr
    r = run_cli("grpo", "--config", tmp_path / "a" / "config.json", "--out", tmp_path / "b")
    assert r.returncode == 0, r.stderr
    recorded = [json.loads((tmp_path / run / "config.json").read_text())["model"] for run in ("a", "b")]
    assert recorded[0] == recorded[1] and recorded[1]["name_or_path"] == str(Path(sft_checkpoint).resolve())
    assert (tmp_path / "b" / "final" / "model.safetensors").is_file()
    r = run_cli("grpo", *tiny_args(**sets), "--out", tmp_path / "c")
    assert r.returncode == 2 and not (tmp_path / "c").exists(), r.stderr
    assert r.stderr.strip().splitlines() == [
        "dgrpo: error: dgrpo grpo needs --init: the SFT checkpoint to start from (run directory, checkpoint directory "
        "or hub id), or a --config whose model.name_or_path names it (a run's config.json does)"
    ]


def test_grpo_ends_with_its_headline_line_and_the_path_of_summary_json(sft_checkpoint, tmp_path, run_cli):
    """The run's last console lines: the trainer's "done in" (best, final, skipped steps) and where summary.json is;
    the summary itself was printed as one long JSON line after them (applied's device, versions, ... on one line)."""
    out = tmp_path / "run"
    sets = {"grpo.steps": 1, "grpo.warmup_steps": 0, "data.valid": "", "data.test": "[]"}
    r = run_cli("grpo", "--init", sft_checkpoint, *tiny_args(**sets), "--out", out)
    assert r.returncode == 0, r.stderr[-2000:]
    *_, done, last = r.stdout.strip().splitlines()
    assert done.startswith("dgrpo grpo: done in ") and "of 1 steps skipped" in done, r.stdout[-2000:]
    assert last == f"dgrpo grpo: summary -> {out / 'summary.json'}"
    assert json.loads((out / "summary.json").read_text())["steps"] == 1


@pytest.mark.filterwarnings("ignore:grpo.warmup_steps")
def test_only_best_s_line_follows_the_path_of_summary_json(sft_checkpoint, tmp_path, run_cli):
    """A best/ of the final model's weights (no group of K = 4 has an accuracy in [0.3, 0.4]: every step skipped)
    is said after the summary's path, so that path is not the last line; docs/metrics.md said it was printed last."""
    out = tmp_path / "run"
    sets = {"grpo.steps": 1, "grpo.warmup_steps": 0, "grpo.eval_every": 1, "grpo.prompts_per_step": 2}
    sets |= {"grpo.alpha_min": 0.3, "grpo.alpha_max": 0.4, "data.eval_limit": 4, "eval.limit": 4}
    r = run_cli("grpo", "--init", sft_checkpoint, *tiny_args(**sets), "--out", out)
    assert r.returncode == 0, r.stderr[-2000:]
    *_, done, summary, best = r.stdout.strip().splitlines()
    assert done.startswith("dgrpo grpo: done in ") and summary == f"dgrpo grpo: summary -> {out / 'summary.json'}"
    assert best.startswith("dgrpo: best/ (0) holds the final model's weights"), r.stdout[-2000:]
    metrics_md = " ".join((Path(__file__).parents[1] / "docs" / "metrics.md").read_text().split())
    assert "its path printed last" not in metrics_md and "best/'s line: that it holds the final model's" in metrics_md


def test_help_is_fast_and_lists_examples():
    """`dgrpo --help` must not import torch (it answered in 3 s when it did) nor numpy (a third of its import time);
    every command's help has examples."""
    import subprocess
    import sys

    code = "import sys; from dgrpo.cli import build_parser; build_parser()"
    code += "; print({'torch', 'numpy'} & set(sys.modules))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "set()"
    from dgrpo.cli import build_parser

    ap = build_parser()
    sub = next(a for a in ap._actions if a.dest == "cmd")
    for name in ("sft", "grpo", "eval", "demo", "data", "config"):
        assert "examples:" in sub.choices[name].format_help(), name
    # and the command list itself (a '%' in a command's one-line help once broke `dgrpo --help`)
    assert "95% intervals" in ap.format_help() and all(name in ap.format_help() for name in sub.choices)


def test_no_help_text_shows_docstring_markup():
    """Every help text (``dgrpo --help`` and each command's and sub-command's) is plain text for a user: the top one
    was the module's docstring, with reST backticks and a private function's name (``_error``)."""
    import argparse

    from dgrpo.cli import build_parser

    def helps(parser: argparse.ArgumentParser):
        yield parser.prog, parser.format_help()
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in dict.fromkeys(action.choices.values()):
                    yield from helps(sub)

    texts = dict(helps(build_parser()))
    assert len(texts) > 12 and "dgrpo data inspect" in texts
    for prog, text in texts.items():
        assert not re.search(r"``|:(func|class|data|meth|mod):|\b_[a-z]+\w*\(", text), prog


def test_eval_help_says_what_limit_0_and_no_split_do():
    """``--limit 0`` evaluates every record (it is eval.limit's 0), and without ``--split`` a name's own split is read
    (``builtin:valid``): the help said "the first N records" and "default: test"."""
    from dgrpo.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "cmd")
    text = " ".join(sub.choices["eval"].format_help().split())
    assert "(0: all" in text and "the one it gives, else test" in text


def test_eval_data_given_twice_is_both():
    """``--data a --data b`` evaluates both, as ``--data a b`` does (the second replaced the first: one dataset
    evaluated, the other dropped without a word)."""
    from dgrpo.cli import build_parser

    argv = ["eval", "--model", "m", "--data", "gsm8k", "--data", "svamp", "builtin:test", "--out", "o"]
    assert build_parser().parse_args(argv).data == ["gsm8k", "svamp", "builtin:test"]


def test_version_and_config_show_filter(run_cli):
    r = run_cli("--version")
    assert r.returncode == 0 and r.stdout.startswith("dgrpo ")
    r = run_cli("config", "show", "grpo")
    keys = [line.split(" = ")[0] for line in r.stdout.splitlines() if " = " in line]
    assert keys and all(k.startswith("grpo.") for k in keys)
    r = run_cli("config", "show", "nope")
    assert r.returncode == 2 and "no option is named by 'nope'" in r.stderr
    # or the options whose key starts with a dotted prefix, and their resolved values
    r = run_cli("config", "show", "grpo.recompute")
    keys = [line.split(" = ")[0] for line in r.stdout.splitlines() if " = " in line]
    assert keys[0] == "grpo.recompute" and "grpo.recompute_kept_layers" in keys and len(keys) == 4
    r = run_cli("config", "show", "grpo.lr", "--set", "grpo.lr=2e-5")
    assert r.returncode == 0 and json.loads(r.stdout) == {"grpo.lr": 2e-5}
    assert run_cli("config", "show", "seed").stdout.startswith("seed = ")
    # docs/config.md from the command line (python -m dgrpo.config warned that dgrpo.config was imported already)
    from dgrpo.config import config_markdown

    assert run_cli("config", "show", "--markdown").stdout == config_markdown()
    r = run_cli("config", "show", "grpo", "--markdown")
    assert r.returncode == 2 and "--markdown prints every option's default" in r.stderr


def test_one_set_takes_several_overrides(run_cli):
    """``--set a=1 b=2`` (as Hydra and OmegaConf users write it) is two overrides, like ``--set a=1 --set b=2``; a
    positional argument after them is named in the one-line error."""
    r = run_cli("config", "show", "--set", "grpo.lr=2e-5", "grpo.log_every=3", "--set", "grpo.lr=3e-5")
    assert r.returncode == 0 and json.loads(r.stdout)["grpo"]["lr"] == 3e-5
    assert json.loads(r.stdout)["grpo"]["log_every"] == 3
    r = run_cli("config", "show", "--set", "grpo.lr=2e-5", "grpo")
    assert r.returncode == 2 and "got 'grpo' (a positional argument goes before --set)" in r.stderr


def test_check_fits_counts_what_generate_builds_and_names_what_to_lower(tokenizer):
    """The prompt as encoded already holds <|start-latent|>: one more marker (<|end-latent|>) follows the latents, none
    without markers (a plain LM's k-shot prompt). The message states each part and the options that shorten it."""
    from dgrpo.config import ConfigError

    from conftest import make_lm

    lm = make_lm(tokenizer)  # 512 positions
    lm.check_fits(510, 0, 1, key="eval.n_latent")  # 510 + 0 + 1 + 1 = 512 fits
    lm.check_fits(500, 0, 12, key="eval.n_latent", markers=False)  # 500 + 12 = 512 fits
    with pytest.raises(ConfigError) as e:
        lm.check_fits(212, 1, 600, key="eval.n_latent")
    assert str(e.value) == (
        "eval: the sequence does not fit the model's context of 512 positions: question (211 tokens) + 1 latent "
        "thought + 2 markers + answer (eval.max_new_tokens = 600) = 814; lower eval.n_latent, eval.max_new_tokens or "
        "data.max_question_tokens"
    )
    with pytest.raises(ConfigError) as e:
        lm.check_fits(500, 0, 13, key="eval.n_latent", markers=False, prompt_key="eval.shots")
    assert str(e.value) == (
        "eval: the sequence does not fit the model's context of 512 positions: prompt (500 tokens) + answer "
        "(eval.max_new_tokens = 13) = 513; lower eval.max_new_tokens or eval.shots"
    )
    with pytest.raises(ConfigError, match=r"grpo: .* = 513; lower grpo.max_new_tokens or data.max_question_tokens$"):
        lm.check_fits(511, 0, 1, key="grpo.n_latent")
    # the start's check (no question yet) with no latent thoughts: one option to lower (it read "lower  or ...")
    with pytest.raises(ConfigError) as e:
        lm.check_fits(1, 0, 600, key="grpo.n_latent")
    assert str(e.value).endswith(
        "0 latent thoughts + 2 markers + answer (grpo.max_new_tokens = 600) = 602; lower grpo.max_new_tokens"
    )


def test_sft_names_the_builtin_tasks_length_among_what_to_lower(tokenizer):
    """The built-in task's problems at task.n_steps=100 pass the default caps (256 + 256 tokens + 2 markers = 514 >
    512 positions): the line names task.n_steps, the cause, beside the two caps (a user's own data: only the caps)."""
    from dgrpo.config import Config, ConfigError
    from dgrpo.training.curriculum import SFTExample
    from dgrpo.training.sft import sft_loss

    from conftest import make_lm

    lm, cfg = make_lm(tokenizer), Config()
    long = [SFTExample(question="Add 1. " * 300, n_latent=0, target="<<1+1=2>>\n" * 300)]
    with pytest.raises(ConfigError, match=r"= 514; lower data.max_target_tokens, data.max_question_tokens or task.n"):
        sft_loss(lm, long, cfg, 1.0)
    cfg.data.train = "mine.jsonl"
    with pytest.raises(ConfigError, match=r"= 514; lower data.max_target_tokens or data.max_question_tokens$"):
        sft_loss(lm, long, cfg, 1.0)


@pytest.mark.slow
def test_an_error_in_training_starts_its_own_line_after_the_progress_bar(run_cli, tmp_path, monkeypatch):
    """The bar is closed before the error is printed (it was closed later, when the error's traceback was freed:
    ``sft:   0%| | 0/1 [...]dgrpo: error: ...`` on one line). The error: the first batch's loss refused (a record
    past the context is refused before training now, so the batch's own refusal is stood in for)."""
    from dgrpo.config import ConfigError
    from dgrpo.training import sft

    def refused(*args, **kwargs):
        raise ConfigError("sft: the sequence does not fit the model's context (a stand-in)")

    monkeypatch.setattr(sft, "sft_loss", refused)
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    small = ["task.n_train=8", "task.n_valid=4", "task.n_test=4", "sft.num_epochs=1", "threads=1"]
    r = run_cli("sft", "--set", *small, "--out", tmp_path / "s")
    assert r.returncode == 2 and "sft:   0%" in r.stderr, r.stderr
    assert re.search(r"(?m)^dgrpo: error: sft: the sequence does not fit", r.stderr), r.stderr


def _canned(texts):
    """A stand-in for the perturbed generation of evaluate_mc_vote: ``texts``, whatever the model."""
    return lambda lm, questions, perturbation, **kw: list(texts)


def test_mc_vote_votes_on_the_answers_the_scorer_reads(tokenizer, monkeypatch):
    """Text golds vote on the final text (they all voted None, accuracy 0), numeric golds on the number; the majority's
    first completion is scored by the scorer, whose name the result carries; n_masks < 1 and a sequence longer than
    the context are refused as evaluate refuses them."""
    import dgrpo.eval.evaluate as ev
    from dgrpo.config import ConfigError
    from dgrpo.data.records import Record
    from dgrpo.eval.scoring import exact
    from dgrpo.perturbation import LockedDropout

    from conftest import make_lm

    lm, drop = make_lm(tokenizer), LockedDropout(p=0.1)
    recs = [Record("Is Tom a lempus?", [], "Tom is a lempus."), Record("q", [], "2.5"), Record("q3", [], "7")]
    with pytest.raises(ConfigError, match=r"answer \(eval.max_new_tokens = 600\)"):
        ev.evaluate_mc_vote(lm, recs, drop, max_new_tokens=600, progress=False)
    for n_masks in (0, -1):
        with pytest.raises(ValueError, match=f"n_masks must be an int >= 1 .*got {n_masks}"):
            ev.evaluate_mc_vote(lm, recs, drop, n_masks=n_masks, progress=False)
    real = ev.evaluate_mc_vote(lm, recs[1:], drop, n_masks=2, max_new_tokens=3, progress=False)
    assert real.n == 2 and real.mode == "coconut+mc2" and all(len(p["votes"]) == 2 for p in real.predictions)
    texts = ["#### Tom is a lempus.", "#### Tom is a terpus.", "tom is a LEMPUS"]
    texts += ["#### 2.50", "The answer is 3", "#### 2.5", "no idea", "", "hmm"]
    monkeypatch.setattr(ev, "_perturbed_texts", _canned(texts))
    r = ev.evaluate_mc_vote(lm, recs, drop, n_masks=3, progress=False)
    assert [p["votes"] for p in r.predictions] == [
        ["tom is a lempus", "tom is a terpus", "tom is a lempus"],
        ["2.5", "3", "2.5"],
        [None, None, None],
    ]
    assert [p["correct"] for p in r.predictions] == [True, True, False] and r.predictions[1][
        "completion"
    ] == "#### 2.50"
    assert (r.correct, r.accuracy, r.unparseable, r.scorer) == (2, 2 / 3, 1, "numeric")
    # exact: "2.50" and "2.5" are one number to it (the gold a number), against "the answer is 3"; "no idea" wins q3
    r = ev.evaluate_mc_vote(lm, recs, drop, n_masks=3, progress=False, scorer=exact)
    assert [p["pred"] for p in r.predictions] == ["tom is a lempus", "2.5", "no idea"]
    assert (r.correct, r.unparseable, r.scorer) == (2, 0, "exact")
    # coconut: "1,000" and "1000" are one answer to it (they split the vote, and "#### 7" won), one without '#' none
    from dgrpo.eval.scoring import coconut

    monkeypatch.setattr(ev, "_perturbed_texts", _canned(["#### 1,000", "#### 7", "#### 1000", "1000"]))
    r = ev.evaluate_mc_vote(lm, [Record("q", [], "1000")], drop, n_masks=4, progress=False, scorer=coconut)
    assert r.predictions[0]["votes"] == ["1000", "7", "1000", None] and r.correct == 1

    def mine(completions, records):  # a plug-in: votes on its final text, the chosen completion scored by it
        return [float(c.endswith("2.50")) for c in completions]

    monkeypatch.setattr(ev, "_perturbed_texts", _canned(texts[3:6]))
    r = ev.evaluate_mc_vote(lm, recs[1:2], drop, n_masks=3, progress=False, scorer=mine)
    assert (r.correct, r.scorer, r.predictions[0]["completion"]) == (1, "mine", "#### 2.50")
    # a text gold whose completions give no answer is not an unparseable number (evaluate counts it so), and its row
    # shows what the model wrote (it showed "")
    monkeypatch.setattr(ev, "_perturbed_texts", _canned(["<<1+7=8>>\n####"] * 3))
    r = ev.evaluate_mc_vote(lm, recs[:1], drop, n_masks=3, progress=False)
    assert (r.correct, r.unparseable, r.predictions[0]["completion"]) == (0, 0, "<<1+7=8>>\n####")


def test_merged_results_keep_what_was_evaluated():
    from dgrpo.eval.evaluate import EvalResult
    from dgrpo.eval.results import merge_results

    parts = [
        EvalResult("d", 1.0, 1, 1, 0, 3, 1, "coconut", 2.0, model="/m", temperature=0.7, top_p=0.9, limit=2),
        EvalResult("d", 0.0, 1, 0, 1, 3, 1, "coconut", 1.0, model="/m", temperature=0.7, top_p=0.9, limit=2),
    ]
    got = merge_results(parts).summary()
    assert got["accuracy"] == 0.5 and got["unparseable"] == 1 and got["wall_s"] == 2.0
    assert (got["model"], got["temperature"], got["top_p"], got["limit"]) == ("/m", 0.7, 0.9, 2)


def test_eval_results_name_the_checkpoint_and_the_decoding(tmp_path, sft_checkpoint, run_cli):
    """results.json says what was evaluated and how (a sampled eval is not mistaken for greedy); an answer longer
    than the context is one line naming the parts and what to lower, in plain mode without markers or n_latent."""
    import re

    run_dir = sft_checkpoint.parent  # a run directory names its final/
    args = ["eval", "--model", run_dir, "--data", "builtin:test", "--limit", 4, "--set", "task.n_test=8"]
    sampled = ["eval.max_new_tokens=4", "eval.temperature=0.7", "eval.top_p=0.9"]
    r = run_cli(*args, "--out", tmp_path / "ev", "--set", *sampled)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads((tmp_path / "ev" / "results.json").read_text())
    assert res["model"] == str(sft_checkpoint.resolve()) and res["n_latent"] == 1 and res["n"] == 4
    assert (res["temperature"], res["top_p"], res["max_new_tokens"], res["limit"], res["shots"]) == (0.7, 0.9, 4, 4, 0)
    assert {"accuracy", "correct", "unparseable", "dataset", "seed", "mode", "scorer", "wall_s"} <= set(res)
    r = run_cli(*args, "--out", tmp_path / "long", "--set", "eval.max_new_tokens=600")
    line = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(line) == 1 and "1 latent thought + 2 markers + answer" in line[0], r.stderr
    assert "lower eval.n_latent, eval.max_new_tokens or data.max_question_tokens" in line[0]
    r = run_cli(*args, "--plain", "--shots", 2, "--out", tmp_path / "plain", "--set", "eval.max_new_tokens=600")
    line = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(line) == 1 and "markers" not in line[0] and "latent" not in line[0], r.stderr
    tail = (
        r"prompt \(\d+ tokens\) \+ answer \(eval.max_new_tokens = 600\) = \d+; lower eval.max_new_tokens or eval.shots"
    )
    assert re.search(tail + "$", line[0]), line[0]


@pytest.mark.slow
def test_user_mistakes_that_were_tracebacks_or_wrote_into_a_checkpoint(sft_checkpoint, tmp_path, run_cli, monkeypatch):
    """Each is one line and exit 2, before anything is written: --out inside a checkpoint (a run wrote its
    config.json over the --init model's own), bench --out a file, a stray WORLD_SIZE, non-text data.test items or
    LoRA targets, an empty part of a data spec, a name longer than the file system allows (all were tracebacks,
    or exit 0 and a damaged checkpoint)."""
    from dgrpo.bench.suite import main as bench_main

    before = sorted(p.name for p in Path(sft_checkpoint).iterdir())
    run = Path(sft_checkpoint).parent
    deaf = tmp_path / "deaf.py"
    deaf.write_text(DEAF_KIND)
    cases = [
        (["sft", "--out", Path(sft_checkpoint) / "sub"], "lies inside .* a checkpoint dgrpo wrote"),
        (["grpo", "--init", sft_checkpoint, "--out", sft_checkpoint], "is a checkpoint dgrpo wrote"),
        # (the line named "the --init model's" files for eval, which has no --init)
        (
            ["eval", "--model", sft_checkpoint, "--data", "builtin:test", "--out", Path(sft_checkpoint) / "e"],
            "holds; name a",
        ),
        # a run's own folders (its test-set results were replaced without a word)
        (["eval", "--model", sft_checkpoint, "--data", "builtin:test", "--out", run / "eval"], "keeps its own files"),
        (["eval", "--model", sft_checkpoint, "--data", "builtin:test", "--out", run / "eval" / "x"], "keeps its own"),
        (["config", "show", "--set", "data.test=[builtin:test, 5]"], "data.test: expected a list of dataset names"),
        (["config", "show", "--set", "model.lora.target_modules=[1]"], "target_modules: expected module names"),
        (["data", "inspect", "builtin:test+"], "an empty part between '\\+' signs"),
        (["config", "show", "--set", "grpo.rewards=[{fn: numeric, name: 5}]"], "item 0: name must be text"),
        (["eval", "--model", sft_checkpoint, "--data", "builtin:test", "--out", ""], "--out is empty"),
        (["eval", "--model", tmp_path / ("a" * 300), "--data", "builtin:test", "--out", tmp_path / "e"], "a name "),
        # a scorer that cannot be built fails before the data and the model are read (sft read them first)
        (["sft", "--set", "eval.scorer=no.py:f", "data.train=no.jsonl", "--out", tmp_path / "s"], "scorer 'no.py:f'"),
        (["sft", "--resume", "", "--out", tmp_path / "s"], "--resume is empty"),  # (it was read as '.')
        # and a reward (the model was loaded first: minutes for a hub model)
        (["grpo", "--init", tmp_path / "no", "--set", "grpo.reward=no.py:f", "--out", tmp_path / "g"], "'no.py:f'"),
        (["grpo", "--init", tmp_path / "no", "--set", "grpo.filter_reward=x", "--out", tmp_path / "g"], "not one of"),
        # and a kind of one's own that cannot take perturbation.perturb_answer=false (it was found once training began)
        (
            [
                "grpo",
                "--init",
                tmp_path / "no",
                "--set",
                f"perturbation.kind={deaf}:Deaf",
                "perturbation.perturb_answer=0",
            ]
            + ["--out", tmp_path / "g"],
            "does not take it",
        ),
    ]
    for argv, message in cases:
        r = run_cli(*argv)
        assert r.returncode == 2 and re.search(message, r.stderr) and "Traceback" not in r.stderr, (argv, r.stderr)
    assert sorted(p.name for p in Path(sft_checkpoint).iterdir()) == before
    monkeypatch.setenv("WORLD_SIZE", "2")
    r = run_cli("sft", "--out", tmp_path / "w")
    assert r.returncode == 2 and "WORLD_SIZE=2 is set but RANK" in r.stderr
    monkeypatch.delenv("WORLD_SIZE")
    (tmp_path / "afile").write_text("")
    assert bench_main(["--quick", "--only", "flops", "--out", str(tmp_path / "afile")]) == 2
    assert bench_main(["--quick", "--only", ",", "--out", str(tmp_path / "b")]) == 2 and not (tmp_path / "b").exists()


def test_export_and_import_never_write_inside_a_checkpoint(sft_checkpoint, tmp_path, run_cli):
    """export --out and import-coconut --out inside a checkpoint dgrpo wrote are refused in one line, as every other
    command's --out is (export wrote its model into the adapter's or the base's folder, beside the files its
    manifest vouches for)."""
    before = sorted(p.name for p in Path(sft_checkpoint).iterdir())
    for argv in (
        ["export", sft_checkpoint, "--merge", "--out", Path(sft_checkpoint) / "merged"],
        [
            "import-coconut",
            tmp_path / "ckpt",
            "--base",
            sft_checkpoint,
            "--c-thought",
            1,
            "--n-latent",
            1,
            "--out",
            Path(sft_checkpoint) / "imported",
        ],
    ):
        r = run_cli(*argv)
        assert r.returncode == 2 and re.search("lies inside .* a checkpoint dgrpo wrote", r.stderr), (argv, r.stderr)
    assert sorted(p.name for p in Path(sft_checkpoint).iterdir()) == before


def test_the_help_examples_of_export_are_accepted():
    """Its eval example's --out is not inside the export (a checkpoint dgrpo wrote, where eval refuses to write)."""
    import argparse

    from dgrpo.cli.convert import _add_export_parser

    sub = argparse.ArgumentParser().add_subparsers()
    _add_export_parser(sub)
    epilog = sub.choices["export"].epilog
    for line in epilog.splitlines():
        words = line.split("#")[0].split()
        if "eval" in words:
            model, out = Path(words[words.index("--model") + 1]), Path(words[words.index("--out") + 1])
            assert model not in out.parents, line


def test_eval_uses_the_dtype_the_checkpoint_was_trained_in(tmp_path, sft_checkpoint, run_cli, monkeypatch):
    """A bf16 run's checkpoint is evaluated in bf16, as the run's own test was (it ran in fp32, the default, and
    its accuracy differed from the run's); --set model.dtype still wins."""

    import dgrpo.model.factory as factory

    ckpt = _with_run_config(sft_checkpoint, tmp_path / "bf16", "model", "dtype", "bfloat16")
    dtypes = []
    load_model = factory.load_model

    def recorded(*a, **k):
        lm = load_model(*a, **k)
        dtypes.append(next(lm.model.parameters()).dtype)
        return lm

    monkeypatch.setattr(factory, "load_model", recorded)
    args = ["eval", "--model", ckpt, "--data", "builtin:test", "--limit", 2, "--set", "task.n_test=8"]
    r = run_cli(*args, "--out", tmp_path / "a")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "task, data, dtype and scorer settings from the checkpoint" in r.stdout
    assert "decoding (eval.*) from this command: --config RUN/config.json for the run's own" in r.stdout
    r = run_cli(*args, "--out", tmp_path / "b", "--set", "model.dtype=float32", "--config", "tiny.yaml")
    assert r.returncode == 0 and "overridden: model.dtype" in r.stdout, r.stderr[-2000:]
    assert "decoding (eval.*) from this command and its --config tiny.yaml" in r.stdout  # (it named the option given)
    assert [str(d) for d in dtypes] == ["torch.bfloat16", "torch.float32"]


def test_eval_of_a_plain_lm_without_plain_says_so(tmp_path, tokenizer, run_cli):
    """A plain causal LM (no latent markers in its tokenizer) evaluated as a latent model runs on new, untrained
    marker embeddings: a warning names --plain (it ran silently)."""
    import copy
    import warnings

    from dgrpo.model.tiny import build_tiny_model

    tok = copy.deepcopy(tokenizer)
    tok.eos_token = tok.eos_token or "<eos>"
    build_tiny_model(
        "qwen2", len(tok), hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64
    ).save_pretrained(tmp_path / "plain")
    tok.save_pretrained(tmp_path / "plain")
    args = ["eval", "--model", tmp_path / "plain", "--data", "builtin:test", "--limit", 2, "--set", "task.n_test=8"]
    with pytest.warns(UserWarning, match="is a plain LM .*pass --plain"):
        assert run_cli(*args, "--out", tmp_path / "a").returncode == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        assert run_cli(*args, "--plain", "--out", tmp_path / "b").returncode == 0


def test_warnings_are_dgrpo_lines_and_the_libraries_keep_theirs():
    """Within a command, a warning from dgrpo's code is formatted as one 'dgrpo: warning:' line; another library's
    keeps Python's form, which names where it comes from; after the command Python's format is back (the slow tier
    runs a real command: test_plot)."""
    import warnings

    import dgrpo.cli as cli

    python_format = warnings.formatwarning
    with cli._warnings_as_lines():
        assert warnings.formatwarning("ours", UserWarning, str(cli.PACKAGE_DIR / "plotting" / "draw.py"), 1) == (
            "dgrpo: warning: ours\n"
        )
        theirs = warnings.formatwarning("theirs", FutureWarning, "/elsewhere/lib.py", 7, "")
        assert theirs.startswith("/elsewhere/lib.py:7: FutureWarning: theirs")
    assert warnings.formatwarning is python_format


def test_a_warning_while_a_bar_is_drawn_starts_a_line_of_its_own():
    """A bar leaves the cursor at its line's end: a warning written during a run's bar ran on from it
    ('...it/s]dgrpo: warning: ...'); it starts on a new line now (a closed or disabled bar: as before)."""
    import io
    import warnings

    from tqdm.auto import tqdm

    import dgrpo.cli as cli

    ours = str(cli.PACKAGE_DIR / "training" / "grpo.py")
    with cli._warnings_as_lines():
        assert warnings.formatwarning("ours", UserWarning, ours, 1) == "dgrpo: warning: ours\n"
        with tqdm(total=3, disable=True):
            assert warnings.formatwarning("ours", UserWarning, ours, 1) == "dgrpo: warning: ours\n"
        with tqdm(total=3, file=io.StringIO()):
            assert warnings.formatwarning("ours", UserWarning, ours, 1) == "\ndgrpo: warning: ours\n"
            assert warnings.formatwarning("theirs", FutureWarning, "/elsewhere/lib.py", 7, "").startswith("\n/else")
        assert warnings.formatwarning("ours", UserWarning, ours, 1) == "dgrpo: warning: ours\n"


def test_under_torchrun_only_rank_0_prints_dgrpos_warnings(monkeypatch):
    """Every rank printed each warning about the config and data (8 copies on 8 GPUs; info lines were rank 0's)."""
    import warnings

    import dgrpo.cli as cli

    ours = str(cli.PACKAGE_DIR / "plotting" / "draw.py")
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank, shown in (("0", "dgrpo: warning: ours\n"), ("1", "")):
        monkeypatch.setenv("RANK", rank)
        with cli._warnings_as_lines():
            assert warnings.formatwarning("ours", UserWarning, ours, 1) == shown
            assert warnings.formatwarning("theirs", FutureWarning, "/elsewhere/lib.py", 7, "").startswith("/elsewhere")
            # what befell one rank (a capture given up, a compiler fallen back) is that rank's to say (review)
            fell_back = warnings.formatwarning("eager now", RuntimeWarning, ours, 1)
            assert fell_back == f"dgrpo: warning: rank {rank}: eager now\n"  # (rank 0's too: it may be its alone)


def test_eval_of_several_datasets_loads_the_model_once_and_writes_a_folder_each(
    sft_checkpoint, tmp_path, run_cli, monkeypatch
):
    """--data takes several datasets (the paper's four: one command), each in OUT/<name>/ as the training commands
    name their test sets' folders; the same results as one call each."""
    import dgrpo.model.factory as factory

    loads = []
    load_model = factory.load_model
    monkeypatch.setattr(factory, "load_model", lambda *a, **k: loads.append(1) or load_model(*a, **k))
    common = ["eval", "--model", sft_checkpoint, "--limit", 4, "--set", "task.n_test=8"]
    r = run_cli(*common, "--data", "builtin:test", "builtin:ood_steps", "--out", tmp_path / "both")
    assert r.returncode == 0, r.stderr[-2000:]
    assert len(loads) == 1 and sorted(p.name for p in (tmp_path / "both").iterdir()) == [
        "builtin_ood_steps",
        "builtin_test",
    ]
    assert re.search(r"dgrpo eval: builtin:test [\d.]+% \(\d/4\); builtin:ood_steps [\d.]+% \(\d/4\)", r.stdout)
    for name, spec in (("builtin_test", "builtin:test"), ("builtin_ood_steps", "builtin:ood_steps")):
        assert run_cli(*common, "--data", spec, "--out", tmp_path / name).returncode == 0
        one = json.loads((tmp_path / name / "results.json").read_text())
        both = json.loads((tmp_path / "both" / name / "results.json").read_text())
        assert {k: v for k, v in one.items() if k != "wall_s"} == {k: v for k, v in both.items() if k != "wall_s"}
    r = run_cli(*common, "--data", "builtin:test", "builtin_test", "--out", tmp_path / "twice")
    assert r.returncode == 2 and "both would write" in r.stderr, r.stderr
    r = run_cli(*common, "--data", "builtin", "builtin:test", "--out", tmp_path / "same")  # one set, two names
    assert r.returncode == 2 and "both name builtin:test" in r.stderr and not (tmp_path / "same").exists(), r.stderr
    r = run_cli(*common, "--data", "builtin:test", "no-such-set", "--out", tmp_path / "bad")
    assert r.returncode == 2 and not (tmp_path / "bad").exists() and len(loads) == 3  # (before the model loads)


@pytest.mark.slow
def test_a_run_refuses_an_out_holding_what_no_dgrpo_run_wrote(sft_checkpoint, tmp_path, run_cli):
    """--resume never deleted a user's final/, best/ and checkpoints/ (rc 0), a run wrote its config.json over a
    Hugging Face model's (its --init itself), a foreign final/ was found only after training, and a finished run
    whose checkpoints were deleted trained again from step 0 over its results. Each is one line, nothing touched."""
    import shutil

    mine = tmp_path / "mine"
    for name in ("final/weights.bin", "best/y", "checkpoints/z"):
        (mine / name).parent.mkdir(parents=True, exist_ok=True)
        (mine / name).write_text("mine")
    (mine / "config.json").write_text('{"mine": 1}')
    grpo = ["grpo", "--init", sft_checkpoint, *tiny_args()]
    r = run_cli(*grpo, "--out", mine, "--resume", "never")
    assert r.returncode == 2 and "config.json is not a dgrpo run's config: name a new --out" in r.stderr, r.stderr
    (mine / "config.json").unlink()
    for resume in ("never", "auto"):
        r = run_cli(*grpo, "--out", mine, "--resume", resume)
        assert r.returncode == 2 and "final is not a checkpoint dgrpo wrote (no manifest.json)" in r.stderr, r.stderr
    assert sorted(p.name for p in mine.iterdir()) == ["best", "checkpoints", "final"]
    theirs = tmp_path / "theirs"  # files of a run's names, no run: --resume never deleted them, a run wrote over them
    for name in ("eval/x.txt", "tb/y.txt", "rollouts.jsonl", "metrics.jsonl"):
        (theirs / name).parent.mkdir(parents=True, exist_ok=True)
        (theirs / name).write_text("theirs")
    for resume in ("never", "auto"):
        r = run_cli(*grpo, "--out", theirs, "--resume", resume)
        assert r.returncode == 2, r.stderr
        assert "holds eval, tb, rollouts.jsonl, metrics.jsonl but no dgrpo run (no config.json" in r.stderr, r.stderr
    assert sorted(p.name for p in theirs.rglob("*")) == [*"eval metrics.jsonl rollouts.jsonl tb x.txt y.txt".split()]
    assert {p.read_text() for p in theirs.rglob("*") if p.is_file()} == {"theirs"}
    hf = tmp_path / "hf"
    shutil.copytree(sft_checkpoint, hf)
    (hf / "manifest.json").unlink()  # (a model from elsewhere: transformers' files only)
    r = run_cli("grpo", "--init", hf, *tiny_args(), "--out", hf)
    assert r.returncode == 2 and "is a model directory (config.json beside its weights)" in r.stderr, r.stderr
    finished = tmp_path / "finished"
    shutil.copytree(sft_checkpoint.parent, finished, ignore=shutil.ignore_patterns(".lock"))
    shutil.rmtree(finished / "checkpoints", ignore_errors=True)
    r = run_cli("sft", *tiny_args(), "--out", finished)
    assert r.returncode == 2 and "holds a finished run (final/) and no checkpoint to resume" in r.stderr, r.stderr


def test_an_empty_out_or_init_is_one_line_and_a_checkpoint_is_named_as_written(sft_checkpoint, tmp_path, run_cli):
    """--out "" wrote a whole run into the current directory; --init "" trained a random built-in model; --init
    run/checkpoints/step-3 was recorded as given (the guards compare absolute paths of the model directory)."""
    import shutil

    from dgrpo.training.model_record import init_name

    r = run_cli("sft", *tiny_args(), "--out", "")
    assert r.returncode == 2 and "--out is empty" in r.stderr, r.stderr
    r = run_cli("grpo", "--init", "", *tiny_args(), "--out", tmp_path / "g")
    assert r.returncode == 2 and "--init is empty" in r.stderr and not (tmp_path / "g").exists(), r.stderr
    r = run_cli("eval", "--model", "", "--data", "builtin:test", "--out", tmp_path / "e")
    assert r.returncode == 2 and "--model is empty" in r.stderr, r.stderr
    ckpt = tmp_path / "run" / "checkpoints" / "step-00000003"
    shutil.copytree(sft_checkpoint, ckpt / "model")
    (ckpt / "state.json").write_text("{}")
    assert init_name(str(tmp_path / "run" / "checkpoints" / "step-3")) == str((ckpt / "model").resolve())


def test_eval_warns_when_its_scorer_gives_every_gold_answer_zero(sft_checkpoint, tmp_path, run_cli):
    """A scorer that never says correct (another answer format, a wrong plug-in) reported 0% without a word; sft and
    grpo warned already."""
    (tmp_path / "strict.py").write_text("def never(completions, records):\n    return [0.0] * len(completions)\n")
    scorer = f"eval.scorer={tmp_path / 'strict.py'}:never"
    args = ["eval", "--model", sft_checkpoint, "--data", "builtin:test", "--limit", 2, "--set", scorer]
    with pytest.warns(UserWarning, match="on builtin:test gives 0 to the gold answer of every record it was tried on"):
        r = run_cli(*args, "--out", tmp_path / "e")
    assert r.returncode == 0, r.stderr


def test_eval_and_the_demo_do_not_write_into_a_training_runs_directory(sft_checkpoint, run_cli):
    """Their results.json, predictions and arms landed beside the run's checkpoints (rc 0)."""
    run_dir = sft_checkpoint.parent
    r = run_cli("eval", "--model", sft_checkpoint, "--data", "builtin:test", "--out", run_dir)
    assert r.returncode == 2 and "is a training run's directory: name a folder of its own" in r.stderr, r.stderr
    r = run_cli("demo", "--quick", "--out", run_dir)
    assert r.returncode == 2 and "is a training run's directory" in r.stderr, r.stderr
    assert not (run_dir / "results.json").exists() and not (run_dir / "arms").exists()


def test_the_stop_line_says_whether_a_checkpoint_exists(tmp_path):
    """Ctrl-C before the first checkpoint said the same command resumes from one."""
    import argparse

    from dgrpo.cli import _resume_hint

    args = argparse.Namespace(cmd="grpo", out=str(tmp_path / "run"))
    assert _resume_hint(args) == "; no checkpoint was written yet: the same command starts the run again"
    (tmp_path / "run" / "checkpoints" / "step-00000005").mkdir(parents=True)
    assert _resume_hint(args) == f"; the same command resumes from the newest checkpoint in {tmp_path}/run/checkpoints"
    assert _resume_hint(argparse.Namespace(cmd="eval", out="x")) == ""


def test_a_stop_line_naming_the_newest_checkpoint_does_not_name_it_again(tmp_path):
    """The line of a run stopped after a step named its checkpoint, then "resumes from the newest checkpoint in
    OUT/checkpoints": the same folder twice. It says "from it" where the stop named the newest; not where it named
    an older one (a later checkpoint was written since) or none."""
    import argparse

    from dgrpo.cli import _resume_hint

    root = tmp_path / "run" / "checkpoints"
    for step in (4, 12):
        (root / f"step-{step:08d}").mkdir(parents=True)
    args = argparse.Namespace(cmd="grpo", out=str(tmp_path / "run"))
    assert _resume_hint(args, f" after step 12, checkpointed in {root}/step-00000012") == (
        "; the same command resumes from it"
    )
    older = f"; the same command resumes from the newest checkpoint in {root}"
    assert _resume_hint(args, f" after step 4, checkpointed in {root}/step-00000004") == older
    assert _resume_hint(args, " in the test sets' evaluation") == older
    args.resume = "never"
    assert _resume_hint(args, f" after step 12, checkpointed in {root}/step-00000012") == (
        "; rerun it without --resume never (--resume auto, the default) to resume from it"
    )


@pytest.mark.parametrize("cmd", ["sft", "grpo"])
def test_training_on_own_data_warns_of_the_builtin_validation_and_test_sets(cmd, tmp_path, run_cli):
    """--set data.train=my.jsonl validated on builtin:valid and tested on the three built-in sets (all 0%), without a
    word: data.valid and data.test are still the built-in task's by default. dgrpo eval does not say it."""
    (tmp_path / "sft").mkdir()  # (an --init that is not there is said first, before any warning)
    init = ["--init", tmp_path / "sft"] if cmd == "grpo" else []
    args = [cmd, *init, *tiny_args(**{"data.train": tmp_path / "my.jsonl"}), "--out", tmp_path / "o"]
    says = (
        rf"^data.train is {tmp_path}/my.jsonl, but data.valid \(builtin:valid\) and data.test \(builtin:test\) are the "
        r"built-in task's: validation \(and best/\) and the test results would measure that task, not your data; set "
        r"data.valid=MY_VALID.jsonl \(or '' for none\) and data.test=\[MY_TEST.jsonl\] \(or \[\] for none\)$"
    )
    with pytest.warns(UserWarning, match=says):
        r = run_cli(*args)
    assert r.returncode == 2 and "my.jsonl" in r.stderr, r.stderr  # (the file is not there: nothing trains)


def test_which_builtin_held_out_sets_are_named():
    import warnings

    from dgrpo.cli.train import warn_if_held_out_is_builtin
    from dgrpo.config import Config, load_config

    def said(*overrides: str) -> str:
        with pytest.warns(UserWarning) as seen:
            warn_if_held_out_is_builtin(load_config(Config, None, ["data.train=my.jsonl", *overrides]))
        return str(seen[0].message)

    assert "data.valid (builtin:valid) is the built-in task's: validation (and best/) would" in said("data.test=[]")
    assert said("data.valid=", "data.test=[builtin:test, t.jsonl]").startswith(
        "data.train is my.jsonl, but data.test (builtin:test) is the built-in task's: the test results would measure"
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_held_out_is_builtin(load_config(Config, None, []))  # the built-in task, its own sets
        warn_if_held_out_is_builtin(load_config(Config, None, ["data.train=my.jsonl", "data.valid=", "data.test=[]"]))
        own = ["data.train=my.jsonl", "data.valid=v.jsonl", "data.test=[t.jsonl]"]
        warn_if_held_out_is_builtin(load_config(Config, None, own))


def test_dgrpo_evals_prompt_options_given_to_a_training_command_are_warned_of():
    """sft and grpo evaluate as they train: eval.plain and eval.shots were ignored, their config.json saying them."""
    import warnings

    from dgrpo.cli.train import warn_if_prompt_options_are_set
    from dgrpo.config import Config, load_config

    with pytest.warns(UserWarning, match=r"eval.plain=True and eval.shots=2 only apply to dgrpo eval: validation"):
        warn_if_prompt_options_are_set(load_config(Config, None, ["eval.plain=true", "eval.shots=2"]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_prompt_options_are_set(load_config(Config, None, []))


def test_a_device_this_machine_lacks_is_one_line(monkeypatch):
    """A CUDA index past the GPUs and MPS off a Mac failed in torch after the model loaded, in a traceback."""
    import torch

    from dgrpo.model.sources import resolve_device
    from dgrpo.model.verified import CheckpointError

    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    with pytest.raises(CheckpointError, match="MPS .* is not available"):
        resolve_device("mps")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(CheckpointError, match="'cuda:2' requested but this machine has 2 CUDA device"):
        resolve_device("cuda:2")
    assert resolve_device("cuda:1") == torch.device("cuda", 1)


def test_a_loaded_models_shape_is_recorded_and_a_builtin_size_given_for_it_warned_of(tokenizer):
    """model.arch and the sizes build the built-in tiny model: with --init they were ignored without a word, and the
    run's config.json recorded them."""
    import warnings

    from dgrpo.training.model_record import record_the_models_shape

    from conftest import make_lm, tiny_config

    lm = make_lm(tokenizer, "gpt2")
    cfg = tiny_config(**{"model.name_or_path": "/some/checkpoint", "model.num_layers": 8})
    said = r"model.hidden_size=64 \(the model's: 32\), model.num_layers=8 \(the model's: 2\)"
    with pytest.warns(UserWarning, match=said):
        record_the_models_shape(cfg, lm)
    hf = lm.model.config
    assert (cfg.model.arch, cfg.model.hidden_size, cfg.model.num_layers) == ("gpt2", hf.n_embd, hf.n_layer)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        record_the_models_shape(cfg, lm)  # (now the model's own: nothing to say)
        built = tiny_config()
        record_the_models_shape(built, lm)  # (builtin-tiny: the options built it)
    assert built.model.arch == "qwen2"


def test_export_of_an_unconsolidated_sharded_checkpoint_says_consolidate(tmp_path, capsys):
    """It said "already a full checkpoint (no adapter_config.json): nothing to merge" of FSDP shards."""
    from dgrpo.cli import main
    from dgrpo.model.verified import SHARDED_DIR

    ckpt = tmp_path / "run" / "final"
    (ckpt / SHARDED_DIR).mkdir(parents=True)
    (ckpt / "config.json").write_text("{}")
    (ckpt / "latent_config.json").write_text("{}")  # (a sharded final/ holds its configs, its weights in dcp/)
    assert main(["export", str(ckpt), "--merge", "--out", str(tmp_path / "x")]) == 2
    assert f"{ckpt} holds FSDP shards (fsdp: sharded): dgrpo consolidate {ckpt} first" in capsys.readouterr().err


def sigterm_not_handled(signum, frame):
    """Stands for SIGTERM's default in this process (which would end pytest): a command that left it on fails."""
    raise AssertionError("SIGTERM was left to its default: the process would have ended without a word (exit 143)")


def test_sigterm_or_ctrl_c_stops_dgrpo_eval_with_a_line_saying_what_was_written(sft_checkpoint, tmp_path, run_cli):
    """dgrpo eval ended at a SIGTERM without a word (exit 143 from the signal's default). It now says which dataset
    was under way and that its results were not written, and which were (exit 143); Ctrl-C alike (exit 130)."""
    import signal

    import dgrpo.eval.evaluate as ev

    evaluate, calls = ev.evaluate, []

    def stopped_at(n, stop):
        def evaluate_or_stop(*a, **k):
            calls.append(1)
            if len(calls) == n:
                stop()
            return evaluate(*a, **k)

        return evaluate_or_stop

    common = ["eval", "--model", sft_checkpoint, "--limit", 2, "--set", "task.n_test=8", "--data", "builtin:test"]
    previous = signal.signal(signal.SIGTERM, sigterm_not_handled)
    try:
        with pytest.MonkeyPatch.context() as m:
            m.setattr(ev, "evaluate", stopped_at(2, lambda: os.kill(os.getpid(), signal.SIGTERM)))
            r = run_cli(*common, "builtin:ood_steps", "--out", tmp_path / "e")
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert r.returncode == 143, r.stderr[-2000:]
    assert r.stderr.strip().splitlines()[-1] == (
        "dgrpo: terminated (SIGTERM) while evaluating builtin:ood_steps (2 of 2): its results were not written; "
        f"written: {tmp_path / 'e' / 'builtin_test'}"
    )
    assert sorted(p.name for p in (tmp_path / "e").iterdir()) == ["builtin_test"]
    calls.clear()
    with pytest.MonkeyPatch.context() as m:
        m.setattr(ev, "evaluate", stopped_at(1, lambda: (_ for _ in ()).throw(KeyboardInterrupt)))
        r = run_cli(*common, "--out", tmp_path / "c")
    assert r.returncode == 130 and not (tmp_path / "c").exists()
    assert r.stderr.strip().splitlines()[-1] == "dgrpo: interrupted while evaluating builtin:test: nothing was written"
    from dgrpo.cli.evaluate import Done  # (before and between the datasets too)

    done = Done()
    assert done.line() == "before the evaluation: nothing was written"
    done.start("a", 2)
    done.wrote(Path("o/a"))
    assert done.line() == "after 1 of 2 datasets: written: o/a"


def test_sigterm_in_a_runs_test_sets_says_so_and_leaves_it_unfinished(sft_checkpoint, tmp_path, run_cli, monkeypatch):
    """final/ and summary.json were written before the test sets, so a run stopped in them looked finished, and its
    stop line said nothing of them. They come after them now; the line says where the run stopped."""
    import signal

    import dgrpo.cli.train as train

    def stopped(*a, **k):
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(train, "evaluate_test_sets", stopped)
    out, sets = tmp_path / "run", {"grpo.steps": 1, "grpo.warmup_steps": 0, "data.valid": "''"}
    r = run_cli("grpo", "--init", sft_checkpoint, "--out", out, *tiny_args(**sets))
    assert r.returncode == 143, r.stderr[-2000:]
    assert r.stderr.strip().splitlines()[-1] == (
        "dgrpo: terminated (SIGTERM) in the test sets' evaluation (the training is done and checkpointed; final/ and "
        f"summary.json come after them); the same command resumes from the newest checkpoint in {out}/checkpoints"
    )
    assert sorted(p.name for p in out.iterdir()) == [
        ".lock",
        "applied.json",
        "checkpoints",
        "config.json",
        "metrics.jsonl",
    ]


@pytest.mark.slow
def test_a_finished_run_extended_and_stopped_in_its_test_sets_keeps_no_earlier_final(
    sft_checkpoint, tmp_path, run_cli, monkeypatch
):
    """A finished run resumed to train more steps, stopped in its test sets, kept the earlier end's final/ and
    summary.json (of fewer steps): it read as finished, and ``dgrpo eval --model OUT`` took that final/. They are
    removed as the new end begins (not the test results: a set not tested again keeps its only record); the same
    command then writes them, of the new length."""
    import signal

    import dgrpo.cli.train as train

    out, sets = tmp_path / "run", {"grpo.steps": 1, "grpo.warmup_steps": 0, "data.valid": "''"}
    r = run_cli("grpo", "--init", sft_checkpoint, "--out", out, *tiny_args(**sets))
    assert r.returncode == 0 and (out / "final").is_dir() and (out / "eval").is_dir(), r.stderr[-2000:]
    longer = [*tiny_args(**{**sets, "grpo.steps": 2}), "--allow-config-change"]
    with monkeypatch.context() as m:
        m.setattr(train, "evaluate_test_sets", lambda *a, **k: os.kill(os.getpid(), signal.SIGTERM))
        r = run_cli("grpo", "--init", sft_checkpoint, "--out", out, *longer)
    assert r.returncode == 143, r.stderr[-2000:]
    assert f"dgrpo: removed the earlier end's summary.json and final in {out}" in r.stdout
    assert not any((out / name).exists() for name in ("final", "summary.json"))
    assert (out / "eval").is_dir() and not list(out.glob(".tmp-*"))  # (each set's results replaced as it is tested)
    r = run_cli("grpo", "--init", sft_checkpoint, "--out", out, *longer)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads((out / "summary.json").read_text())["steps"] == 2 and (out / "eval").is_dir()


@pytest.mark.parametrize("resume", ["auto", "never"])
@pytest.mark.slow
def test_a_test_set_that_fails_says_what_the_run_left_and_its_advice_finishes_it(
    sft_checkpoint, tmp_path, run_cli, monkeypatch, resume
):
    """A run whose test sets fail (here a scorer's error on them alone) has no final/ now: a line before the error's
    says that the training is checkpointed and how to go on, and its advice works. Under ``--resume never`` it said
    "the same command", which deleted the checkpoint and trained again."""
    import dgrpo.cli.train as train
    from dgrpo.eval.scoring import RewardError

    def failing(*a, **k):
        raise RewardError("scorer s raised ValueError: boom on the test set")

    with monkeypatch.context() as m:
        m.setattr(train, "evaluate_test_sets", failing)
        out, sets = tmp_path / "run", {"grpo.steps": 1, "grpo.warmup_steps": 0, "data.valid": "''"}
        r = run_cli("grpo", "--init", sft_checkpoint, "--out", out, "--resume", resume, *tiny_args(**sets))
    assert r.returncode == 2, r.stderr[-2000:]
    again = "the same command" if resume == "auto" else "the same command without --resume never"
    assert r.stderr.strip().splitlines()[-2:] == [
        f"dgrpo: the test sets' evaluation failed (below): the training is done and checkpointed in {out}/checkpoints; "
        f"final/ and summary.json come after the test sets: once they can run, {again} evaluates them (it "
        "trains no step), or --set 'data.test=[]' --allow-config-change skips them",
        "dgrpo: error: scorer s raised ValueError: boom on the test set",
    ]
    assert not (out / "final").exists()
    trained = {p: p.stat().st_mtime_ns for p in (out / "checkpoints").rglob("*")}
    skipped = [*tiny_args(**sets), "--set", "data.test=[]", "--allow-config-change"]  # (the line's advice)
    r = run_cli("grpo", "--init", sft_checkpoint, "--out", out, *skipped)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (out / "final").is_dir() and (out / "summary.json").is_file()
    assert {p: p.stat().st_mtime_ns for p in (out / "checkpoints").rglob("*")} == trained  # (no step trained again)


def test_a_sigterm_while_torch_loads_is_one_line_too(tmp_path):
    """The handler went on after the imports of torch and transformers (seconds): a SIGTERM then ended the process
    without a word. Here the SIGTERM comes as torch starts to load."""
    code = f"""
import os, signal, sys
from dgrpo.cli import main

class SigtermAtImport:
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            os.kill(os.getpid(), signal.SIGTERM)
        return None

sys.meta_path.insert(0, SigtermAtImport())
sys.exit(main(["eval", "--model", "m", "--data", "builtin:test", "--out", {str(tmp_path / "e")!r}]))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 143, (r.returncode, r.stderr[-2000:])
    assert r.stderr.strip().splitlines()[-1] == "dgrpo: terminated (SIGTERM) before the evaluation: nothing was written"


@pytest.mark.parametrize(
    ("world", "rank", "says"), [("2", "0", True), ("2", "1", False), ("", "3", True), ("1", "3", True)]
)
def test_under_torchrun_a_stop_every_rank_makes_is_one_line_from_rank_0(
    tmp_path, monkeypatch, capsys, world, rank, says
):
    """Ctrl-C under torchrun printed "dgrpo: interrupted" once per rank (torchrun sends SIGINT to every worker),
    and a run stopped by its guards (TrainingStopped, decided alike on every rank) its error once per rank. Rank 0
    says it (a rank's own failure is that rank's line:
    test_under_torchrun_an_error_of_one_ranks_own_is_that_ranks_line_named). A ``RANK`` a shell left set in one
    process (no ``WORLD_SIZE`` over 1: not torchrun's) silenced both lines (exit 1 and no word), while the trainers
    (``Dist.from_env``) spoke as the one process they are."""
    from dgrpo import cli
    from dgrpo.cli import train
    from dgrpo.training.guards import NonFiniteError

    monkeypatch.setenv("WORLD_SIZE", world) if world else monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setenv("RANK", rank)
    argv = ["grpo", "--init", str(tmp_path / "sft"), "--out", str(tmp_path / "run")]
    for stopped, code, line in (
        (KeyboardInterrupt(), 130, "dgrpo: interrupted; no checkpoint was written yet"),
        (NonFiniteError("3 GRPO optimizer steps in a row"), 1, "dgrpo: error: 3 GRPO optimizer steps in a row"),
    ):
        monkeypatch.setattr(train, "run_grpo", lambda args, e=stopped: (_ for _ in ()).throw(e))
        assert cli.main(argv) == code
        err = capsys.readouterr().err
        assert err.count(line) == (1 if says else 0) and len(err.splitlines()) <= 1, err


def as_torchrun_worker(monkeypatch, rank: str, local_rank: str) -> None:
    """This process as worker ``rank`` of a torchrun job of 4 on 2 machines (its environment, without the tie to a
    launcher that dies: exit_with_launcher)."""
    from dgrpo import cli

    monkeypatch.setattr(cli, "exit_with_launcher", lambda: None)
    for name, value in {"WORLD_SIZE": "4", "RANK": rank, "LOCAL_RANK": local_rank}.items():
        monkeypatch.setenv(name, value)


#: (rank, local rank): rank 0; another worker on its machine; the first worker of the other machine
WORKERS = [("0", "0"), ("1", "1"), ("2", "0")]


@pytest.mark.parametrize("rank,local_rank", WORKERS, ids=["rank0", "rank0s-machine", "other-machine"])
def test_under_torchrun_an_error_every_rank_meets_is_one_line_per_machine(
    tmp_path, run_cli, monkeypatch, rank, local_rank
):
    """A config error, a data file that is missing, a scorer that cannot be imported (before the ranks join and split
    the work): every rank printed it, 8 copies on 8 GPUs. Each machine's first worker (LOCAL_RANK 0) prints it now,
    naming its rank but on rank 0: one line on one machine, and a machine whose files differ still says so."""
    out = tmp_path / "run"
    for argv in (
        ["sft", "--config", "tiny.yaml", "--set", "sft.lr=abc", "--out", out],
        ["sft", "--config", "tiny.yaml", "--set", f"data.train={tmp_path / 'no.jsonl'}", "data.valid=", "data.test=[]"],
        ["sft", "--config", "tiny.yaml", "--set", "eval.scorer=no.py:f", "--out", out],
    ):
        argv += ["--out", out] if "--out" not in argv else []
        alone = run_cli(*argv)  # (one process: its line)
        assert alone.returncode == 2 and alone.stderr.startswith("dgrpo: error: ") and alone.stderr.count("\n") == 1
        with monkeypatch.context() as m:
            as_torchrun_worker(m, rank, local_rank)
            r = run_cli(*argv)
        said = {"0": alone.stderr, "1": "", "2": alone.stderr.replace("error: ", "error: rank 2: ", 1)}[rank]
        assert r.returncode == 2 and r.stderr == said, (argv, r.stderr)


def grpo_joined_failing_with(failed, tmp_path, run_cli, monkeypatch, rank):
    """``dgrpo grpo`` as torchrun's worker ``rank``, joined (a process group of one), failing with ``failed``."""
    import torch.distributed as tdist

    from dgrpo.cli import train

    monkeypatch.setattr(train, "run_grpo", lambda args: (_ for _ in ()).throw(failed))
    as_torchrun_worker(monkeypatch, rank, rank)
    tdist.init_process_group("gloo", store=tdist.HashStore(), rank=0, world_size=1)  # (joined)
    try:
        return run_cli("grpo", "--init", tmp_path / "sft", "--out", tmp_path / "run")
    finally:
        tdist.destroy_process_group()


@pytest.mark.parametrize("rank", ["0", "1"])
def test_under_torchrun_an_error_of_one_ranks_own_is_that_ranks_line_named(tmp_path, run_cli, monkeypatch, rank):
    """Once the ranks have joined, an error can be one rank's (a reward that fails on its batch; the others stop with
    "... in another process"): each rank that meets it prints it, named (it did not say which rank it came from)."""
    from dgrpo.eval.scoring import RewardError

    failed = RewardError("reward r raised ValueError: cannot score this row")
    r = grpo_joined_failing_with(failed, tmp_path, run_cli, monkeypatch, rank)
    assert r.returncode == 2 and r.stderr == f"dgrpo: error: rank {rank}: {failed}\n"


@pytest.mark.parametrize("rank", ["0", "1"])
def test_under_torchrun_a_reward_that_cannot_be_built_is_one_line_per_machine(tmp_path, run_cli, monkeypatch, rank):
    """The trainer builds its reward after the ranks have joined, alike on every rank (a mistyped grpo.reward file):
    every rank printed it. Its machine's first worker does now."""
    from dgrpo.eval.scoring import RewardSetupError

    failed = RewardSetupError("reward 'no.py:f': file no.py not found")
    r = grpo_joined_failing_with(failed, tmp_path, run_cli, monkeypatch, rank)
    assert r.returncode == 2 and r.stderr == ("" if rank == "1" else f"dgrpo: error: {failed}\n")


def test_the_trainers_reward_errors_before_training_are_setup_errors(sft_checkpoint, tmp_path):
    """What GRPOTrainer meets building its reward (a file not found, not a function) is a RewardSetupError: the
    command line prints it once per machine under torchrun. A reward's own failure on the gold answers is not (it
    may be one rank's alone: a judge model out of memory on its GPU), and that rank prints it."""
    from dgrpo.data.synthetic import generate_split
    from dgrpo.eval.scoring import RewardError, RewardSetupError
    from dgrpo.model.latent_lm import LatentLM
    from dgrpo.training.grpo import GRPOTrainer

    from conftest import tiny_config

    (tmp_path / "r.py").write_text(
        "x = 3\n\ndef inf(completions, records):\n    return [float('inf')] * len(records)\n"
    )
    lm = LatentLM.from_pretrained(sft_checkpoint)
    train = generate_split(tiny_config().task, "train")[:4]
    for spec, says in (("no.py:f", "not found"), (f"{tmp_path / 'r.py'}:x", "not a function")):
        with pytest.raises(RewardSetupError, match=says):
            GRPOTrainer(lm, tiny_config(**{"grpo.reward": spec}), train)
    with pytest.raises(RewardError, match="returned inf") as own:
        GRPOTrainer(lm, tiny_config(**{"grpo.reward": f"{tmp_path / 'r.py'}:inf"}), train)
    assert not isinstance(own.value, RewardSetupError)


#: what gloo raises in a collective whose peer's process ended (here: rank 1's, interrupted alone)
PEER_GONE = (
    "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:41152. This is "
    "typically caused by a remote worker crashing. Check the logs of the remote worker before reporting an error."
)


@pytest.mark.parametrize("rank", ["0", "1"])
def test_under_torchrun_a_rank_that_ended_is_one_line_from_rank_0(tmp_path, run_cli, monkeypatch, rank):
    """A worker given SIGINT alone (Ctrl-C reaches torchrun, which sends it to every worker: rank 0 says it for all)
    ended without a line, and rank 0's next collective failed with a 35-line gloo traceback. Rank 0 says in one line
    that another rank ended; another error of a collective keeps its traceback."""
    import torch.distributed as tdist

    from dgrpo.cli import train

    failure = [RuntimeError(PEER_GONE)]
    monkeypatch.setattr(train, "run_grpo", lambda args: (_ for _ in ()).throw(failure[0]))
    as_torchrun_worker(monkeypatch, rank, rank)
    tdist.init_process_group("gloo", store=tdist.HashStore(), rank=0, world_size=1)  # (joined)
    try:
        r = run_cli("grpo", "--init", tmp_path / "sft", "--out", tmp_path / "run")
        failure[0] = RuntimeError("Tensors must have the same size")  # (a bug: its traceback)
        with pytest.raises(RuntimeError, match="same size"):
            run_cli("grpo", "--init", tmp_path / "sft", "--out", tmp_path / "run")
    finally:
        tdist.destroy_process_group()
    assert r.returncode == 1
    assert r.stderr == (
        "dgrpo: error: another rank ended mid-run (interrupted, killed or failed: torchrun's report names it, with its "
        "exit code): every rank stops without a checkpoint of the step under way; no checkpoint was written yet: the "
        "same command starts the run again\n"
        if rank == "0"
        else ""
    )


def test_any_run_seed_seeds_every_rank():
    """Under torchrun a rank seeds with ``seed * 1000003 + rank``: a run seed of 1.7e18 (date +%s%N) overflowed
    torch's 64 bits and every rank failed with a traceback. A seed torch took before seeds as it did."""
    import torch

    from dgrpo.cli.common import seed_everything

    for seed in (2**63 - 1, -(2**63)):
        seed_everything(seed * 1000003 + 1)
    seed_everything(-1)
    a = torch.rand(3)
    torch.manual_seed(-1)
    assert torch.equal(a, torch.rand(3))


def test_test_sets_that_do_not_fit_the_context_are_refused_before_training(sft_checkpoint, tmp_path, run_cli):
    """data.test is answered after the whole run: a set too long for the context (eval.n_latent, long questions
    under data.max_question_tokens=0) failed there, after all of the training, for SFT and for GRPO alike."""
    long = tmp_path / "long.jsonl"
    long.write_text(json.dumps({"question": "1 + " * 300 + "1 ?", "answer": "301"}) + "\n")
    cases = {
        "sft": (["sft", *tiny_args()], "sft.c_thought"),
        "grpo": (["grpo", "--init", sft_checkpoint, *tiny_args()], "grpo.n_latent"),
    }
    for name, (args, key) in cases.items():
        out = tmp_path / name
        r = run_cli(*args, "--set", "eval.n_latent=600", "--out", out)
        assert r.returncode == 2 and "data.test builtin:test, answered after training: eval: the sequence" in r.stderr
        assert "lower eval.n_latent" in r.stderr and not out.exists(), r.stderr[-2000:]
        r = run_cli(*args, "--set", f"data.test=[{long}]", "--set", "data.max_question_tokens=0", "--out", out)
        assert r.returncode == 2 and f"data.test {long}, answered after training: " in r.stderr, r.stderr[-2000:]
        assert f"lower {key}, eval.max_new_tokens or data.max_question_tokens" in r.stderr and not out.exists()


def test_a_chat_template_the_tokenizer_lacks_is_its_own_line_not_a_test_sets(sft_checkpoint, tmp_path, run_cli):
    """data.chat_template=true on a tokenizer without one was refused as 'data.test builtin:test, answered after
    training: ...', the test sets' context check being the first to format a question."""
    for args in (["sft", *tiny_args()], ["grpo", "--init", sft_checkpoint, *tiny_args()]):
        r = run_cli(*args, "--set", "data.chat_template=true", "--out", tmp_path / args[0])
        said = "dgrpo: error: invalid config value data.chat_template: this tokenizer has no chat template"
        assert r.returncode == 2 and r.stderr.strip().splitlines()[-1] == said, r.stderr[-2000:]


def test_a_grpo_runs_test_sets_are_counted_with_the_markers_grpo_adds(tmp_path, run_cli):
    """GRPO turns the latent markers on for a checkpoint trained without them (a converted CoT run): the start-of-run
    check counted its test sets without them (2 positions short), passed, and the run failed after training."""
    from dgrpo.config import Config, load_config
    from dgrpo.data.synthetic import generate_split
    from dgrpo.model.factory import load_model
    from dgrpo.model.latent_lm import LatentSettings

    cfg = load_config(Config, "tiny.yaml", ["threads=1"])
    lm = load_model(cfg.model, cfg.task, seed=0, training=False)
    lm.model.config.max_position_embeddings = 64
    lm.settings = LatentSettings(mode="cot", markers=False)
    lm.save_pretrained(tmp_path / "markerless")
    ids, _ = lm.encode_questions([r.question for r in generate_split(cfg.task, "test")], markers=False)
    fills = 64 - ids.shape[1]  # (eval.max_new_tokens that fills the context without markers)
    args = [
        "grpo",
        "--config",
        "tiny.yaml",
        "--init",
        tmp_path / "markerless",
        "--set",
        "data.valid=",
        "--set",
        "data.test=[builtin:test]",
        "--set",
        f"eval.max_new_tokens={fills}",
        "--out",
        tmp_path / "g",
    ]
    r = run_cli(*args)
    assert r.returncode == 2 and "data.test builtin:test, answered after training: grpo: the sequence" in r.stderr
    assert "2 markers" in r.stderr and not (tmp_path / "g").exists(), r.stderr[-2000:]


def test_one_test_set_named_twice_by_relative_and_absolute_path_is_refused(tmp_path, run_cli, monkeypatch):
    """data.test=[a.jsonl, /abs/a.jsonl] tested the same file twice, as two sets (eval/a.jsonl and
    eval/_abs_a.jsonl); so did a built-in set named with and without its split. Refused before anything is read,
    as dgrpo eval refuses two such --data."""
    (tmp_path / "a.jsonl").write_text(json.dumps({"question": "1 + 2 ?", "answer": "3"}) + "\n")
    monkeypatch.chdir(tmp_path)
    cases = {
        f"[a.jsonl, {tmp_path / 'a.jsonl'}]": f"data.test: a.jsonl and {tmp_path / 'a.jsonl'} both name",
        "[builtin, builtin:test]": "data.test: builtin and builtin:test both name builtin:test",
    }
    for i, (tests, said) in enumerate(cases.items()):
        out = tmp_path / f"run{i}"
        r = run_cli("sft", *tiny_args(**{"data.test": tests}), "--out", out)
        assert r.returncode == 2 and said in r.stderr and "(name each test set once)" in r.stderr, r.stderr[-2000:]
        assert len(r.stderr.strip().splitlines()) == 1 and not out.exists()


def test_a_test_set_sharing_questions_with_the_validation_set_is_warned_of():
    """best/ is chosen on data.valid: a test set that asks its questions (the same file under both keys, or a
    validation split cut from the test data) reports items the choice was made on. Warned per such test set; sets
    of their own say nothing."""
    from dgrpo.cli.train import warn_if_tests_share_validation
    from dgrpo.config import Config, load_config
    from dgrpo.data.records import Record

    recs = [Record(f"What is {i} + 1?", [], str(i + 1)) for i in range(6)]
    cfg = load_config(Config, None, ["data.valid=v.jsonl", "data.test=[t.jsonl, u.jsonl]"])
    held_out = {"v.jsonl": recs[:4], "t.jsonl": recs[2:], "u.jsonl": recs[4:]}
    said = r"2 of the 4 questions of the test set t.jsonl are questions of the validation set v.jsonl"
    with pytest.warns(UserWarning, match=said) as w:
        warn_if_tests_share_validation(cfg, held_out)
    assert len(w) == 1 and "best/ (chosen on validation)" in str(w[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_tests_share_validation(load_config(Config, None, ["data.valid=''"]), held_out)


def test_eval_of_a_run_tested_on_a_relative_dataset_folder_says_where_it_is_read_from(
    tmp_path, sft_checkpoint, run_cli, monkeypatch
):
    """A run tested on a save_to_disk folder named relative to the folder it started from (data.test=mine, mine:test):
    eval without --data from another folder read it as a hub dataset, 'unknown dataset 'mine': not a local file, not a
    built-in name (gsm8k, ...), and the Hugging Face hub could not be reached: ...', naming no run (a file's path was
    already checked: it has an extension). The line names the run's test set, the folder and --data, with the hub's
    reason; from the run's folder, or with --data, it evaluates."""
    datasets = pytest.importorskip("datasets")
    from dgrpo.data import loaders

    monkeypatch.setattr(loaders, "hub_reachable", lambda: False)  # (no network in tests: at once, as offline)
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    project = tmp_path / "project"
    rows = datasets.Dataset.from_list([{"question": "Start with 1. Add 2.", "answer": "3"}])
    datasets.DatasetDict({"test": rows}).save_to_disk(str(project / "mine"))
    (tmp_path / "elsewhere").mkdir()
    for spec in ("mine", "mine:test"):
        ckpt = _with_run_config(sft_checkpoint, tmp_path / f"ckpt-{spec[-4:]}", "data", "test", [spec])
        monkeypatch.chdir(tmp_path / "elsewhere")
        r = run_cli("eval", "--model", ckpt, "--out", tmp_path / "e")
        said = (
            f"dgrpo: error: --data: the checkpoint's run was tested on {spec} (its data.test), no folder or file from "
            f"{tmp_path / 'elsewhere'}, nor read from the hub (no connection to it"
        )
        assert r.returncode == 2 and said in r.stderr and r.stderr.rstrip().endswith("name the data with --data")
        assert not (tmp_path / "e").exists()
        run = run_cli("eval", "--model", ckpt, "--data", project / "mine", "--out", tmp_path / f"e-{spec[-4:]}")
        assert run.returncode == 0, run.stderr[-2000:]
    monkeypatch.chdir(project)
    assert run_cli("eval", "--model", ckpt, "--out", tmp_path / "e").returncode == 0
    assert json.loads((tmp_path / "e" / "results.json").read_text())["dataset"] == "mine:test"


def test_a_run_s_hub_test_set_read_from_the_hub_is_not_said_to_be_a_missing_folder(monkeypatch):
    """A run's hub test set (``org/name:test``) that the hub answered but that failed (no split 'test' any more, a row
    that does not parse) was told as "no folder or file from <here>, nor read from the hub (hub dataset 'org/name' has
    no split 'test': ...): ... run dgrpo eval from that folder": the name was in the error, as it is in the hub's own
    words. Only a name that nothing read (a folder relative to where the run started, a hub unreached) is."""
    datasets = pytest.importorskip("datasets")
    from dgrpo.cli.evaluate import run_test_set_unread
    from dgrpo.data import load_spec, loaders
    from dgrpo.data.records import DataError

    def no_test_split(*args: Any, **kwargs: Any) -> Any:
        raise ValueError("Unknown split \"test\". Should be one of ['train'].")

    monkeypatch.setattr(loaders, "hub_reachable", lambda: True)
    monkeypatch.setattr(datasets, "load_dataset", no_test_split)
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(DataError, match="hub dataset 'org/name' has no split 'test'") as said:
        load_spec("org/name:test")
    assert run_test_set_unread("org/name:test", said.value) is None
    monkeypatch.setattr(loaders, "hub_reachable", lambda: False)
    with pytest.raises(DataError, match="unknown dataset 'org/name'") as unread:
        load_spec("org/name:test")
    assert "nor read from the hub (no connection to it" in (run_test_set_unread("org/name:test", unread.value) or "")
