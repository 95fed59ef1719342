"""The command line's contracts that mutation testing of ``dgrpo.cli`` found unpinned (each test in-process and
fast: the commands' functions called directly, with the built-in data and no training): exit codes, one-line
errors, defaults, and where outputs go."""

import argparse
import errno
import os
import re

import pytest

import dgrpo.cli as cli
from dgrpo.cli import tools

from conftest import raising_command


def test_output_into_a_closed_pipe_is_exit_141_with_stdout_sent_to_devnull(monkeypatch, run_cli):
    """A reader that stops (``| head``) is exit 141 (128 + SIGPIPE) and no line, with stdout pointed at /dev/null so
    that Python's flush at exit does not raise again (the subprocess test of it is slow)."""
    dup2: list[tuple[int, int]] = []
    monkeypatch.setattr(os, "dup2", lambda a, b: dup2.append((a, b)))
    monkeypatch.setattr(os, "open", lambda path, flags: -7 if path == os.devnull else pytest.fail(path))
    monkeypatch.setattr(tools, "run_config_show", raising_command(BrokenPipeError()))
    monkeypatch.setattr(cli.sys.stdout, "fileno", lambda: 1, raising=False)
    r = run_cli("config", "show")
    assert (r.returncode, r.stderr) == (141, "")
    assert dup2 == [(-7, 1)]


def test_a_name_too_long_is_one_line_and_another_os_error_is_not_hidden(monkeypatch, run_cli):
    """An OSError ENAMETOOLONG is exit 2 and one line naming the path; any other OSError (not one dgrpo explains) is
    raised as it is, not reported as a name too long."""
    too_long = OSError(errno.ENAMETOOLONG, "File name too long", "/x/" + "a" * 300)
    monkeypatch.setattr(tools, "run_config_show", raising_command(too_long))
    r = run_cli("config", "show")
    assert r.returncode == 2
    assert r.stderr == f"dgrpo: error: /x/{'a' * 300}: a name longer than the file system allows\n"
    denied = PermissionError(errno.EACCES, "Permission denied", "/root/x")
    monkeypatch.setattr(tools, "run_config_show", raising_command(denied))
    with pytest.raises(PermissionError):
        run_cli("config", "show")


@pytest.mark.parametrize(("text", "ok"), [("1", True), ("12", True), ("0", False), ("-3", False), ("x", False)])
def test_positive_int_takes_one_and_up_and_refuses_zero_negatives_and_words(text, ok):
    """The bench and experiment scripts' size options: 1 and more pass through as ints; 0, a negative or a word is
    argparse's one-line error (0 was a division by zero deep in a measurement)."""
    from dgrpo.cli.common import positive_int

    if ok:
        assert positive_int(text) == int(text)
    else:
        with pytest.raises(argparse.ArgumentTypeError, match=f"expected a positive integer, got .*{text}"):
            positive_int(text)


def test_seed_everything_seeds_pythons_numpys_and_torchs_generators():
    """One seed gives the same draws from each of Python's ``random``, NumPy's and torch's global generators (a
    seed past 2**32 too, reduced for NumPy)."""
    import random

    import numpy as np
    import torch

    from dgrpo.cli.common import seed_everything

    def draws(seed: int) -> tuple:
        seed_everything(seed)
        return random.random(), float(np.random.rand()), float(torch.rand(()))

    for seed in (3, 2**40 + 5):
        first = draws(seed)
        random.random(), np.random.rand(), torch.rand(())  # (the generators move on)
        assert draws(seed) == first


def test_metric_keys_of_the_final_and_the_best_checkpoints_differ():
    """A test set's accuracy is ``test/<name>/accuracy`` for final/ and ``test_best/<name>/accuracy`` for best/ (the
    two in one metrics row must not overwrite each other)."""
    from dgrpo.cli.common import test_metric_key

    assert test_metric_key("builtin:test") == "test/builtin_test/accuracy"
    assert test_metric_key("builtin:test", "final") == "test/builtin_test/accuracy"
    assert test_metric_key("builtin:test", "best") == "test_best/builtin_test/accuracy"


@pytest.mark.parametrize(
    ("data", "split", "label"),
    [
        ("builtin:test", None, "builtin:test"),
        ("builtin:test", "valid", "builtin:valid"),
        ("builtin:test?n_test=5", "valid", "builtin:valid?n_test=5"),
        ("gsm8k", "train", "gsm8k:train"),
        ("gsm8k", "", "gsm8k"),
    ],
)
def test_a_datasets_label_puts_split_in_place_of_the_one_it_names(data, split, label):
    """Results name the data as given, with ``--split`` replacing the split a name gives (and kept before its
    ``?options``); without ``--split`` the name is unchanged."""
    from dgrpo.cli.evaluate import dataset_label

    assert dataset_label(data, split) == label


def test_a_hub_models_label_names_the_commit_it_was_read_at(tmp_path):
    """A hub id is named ``id@commit`` when read at a commit, as given without one; a local checkpoint by its
    absolute directory."""
    from dgrpo.cli.evaluate import model_label

    assert model_label("org/some-model", "0123abcd") == "org/some-model@0123abcd"
    assert model_label("org/some-model") == "org/some-model"
    assert model_label("org/some-model", "") == "org/some-model"


def test_the_stop_line_of_eval_counts_the_datasets():
    """What a stop of ``dgrpo eval`` says: nothing yet; the dataset under way and its place among several (1 of 2,
    then 2 of 2 with the first's folder written); after one of several; one dataset alone without a count."""
    from dgrpo.cli.evaluate import NOTHING_YET, Done

    done = Done()
    assert done.line() == NOTHING_YET
    done.start("a", 2)
    assert done.line() == "while evaluating a (1 of 2): nothing was written"
    done.wrote("/o/a")
    assert done.line() == "after 1 of 2 datasets: written: /o/a"
    assert done.start("b", 2) == "b"
    assert done.line() == "while evaluating b (2 of 2): its results were not written; written: /o/a"
    alone = Done()
    alone.start("a", 1)
    assert alone.line() == "while evaluating a: nothing was written"


@pytest.mark.parametrize("world", [None, "1"])
def test_in_one_process_a_runtime_warning_of_dgrpos_names_no_rank(monkeypatch, world):
    """Without torchrun (or with one rank) dgrpo's RuntimeWarning (a capture given up, a compiler fallen back) is a
    plain ``dgrpo: warning:`` line: a rank is named only when the job has several."""
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    if world is not None:
        monkeypatch.setenv("WORLD_SIZE", world)
        monkeypatch.setenv("RANK", "0")
    import warnings

    with cli._warnings_as_lines():
        line = warnings.formatwarning("eager now", RuntimeWarning, str(cli.PACKAGE_DIR / "plotting" / "draw.py"), 1)
    assert line == "dgrpo: warning: eager now\n"


def test_the_demos_stop_line_says_what_the_same_command_keeps(tmp_path):
    """A stopped ``dgrpo demo`` is told that the same command keeps its finished runs (the demo resumes tasks, not
    steps), whatever its folder holds, or under ``--resume never`` to drop the option to keep them; a ``--resume
    PATH`` training run is told to drop the option to resume the newest."""
    from dgrpo.cli import _resume_hint

    (tmp_path / "checkpoints" / "step-00000005").mkdir(parents=True)
    demo = argparse.Namespace(cmd="demo", out=str(tmp_path))
    assert _resume_hint(demo) == "; the same command keeps the runs that had finished and starts the others over"
    demo.resume = "never"
    assert _resume_hint(demo) == (
        "; rerun it without --resume never to keep the runs that had finished (it starts every run over)"
    )
    given = argparse.Namespace(cmd="sft", out=str(tmp_path), resume="/some/step-00000003")
    assert _resume_hint(given) == (
        "; rerun it without --resume /some/step-00000003 (--resume auto, the default) to resume from the newest "
        f"checkpoint in {tmp_path}/checkpoints"
    )


def test_a_split_may_be_given_for_a_dataset_folder_not_for_a_file(tmp_path):
    """``--split`` picks a split file of a dataset folder (accepted), while a file has no splits (one line)."""
    from dgrpo.cli.common import check_split
    from dgrpo.config import ConfigError

    folder = tmp_path / "mydata"
    folder.mkdir()
    (folder / "test.jsonl").write_text("")
    check_split(str(folder), "test")
    check_split(str(folder / "test.jsonl"), None)
    with pytest.raises(ConfigError, match="is a file, which has no splits"):
        check_split(str(folder / "test.jsonl"), "test")


def test_data_inspect_counts_one_record_in_the_singular(run_cli, tmp_path):
    """``dgrpo data inspect``'s first line: ``1 record`` for one, ``N records`` otherwise."""
    import json

    one = tmp_path / "one.jsonl"
    one.write_text(json.dumps({"question": "What is 2 plus 2?", "answer": "4"}) + "\n")
    r = run_cli("data", "inspect", one)
    assert r.returncode == 0 and r.stdout.splitlines()[0] == "1 record", r.stderr
    r = run_cli("data", "inspect", "builtin:test", "--set", "task.n_test=3")
    assert r.stdout.splitlines()[0] == "3 records"


def test_a_runs_recorded_reward_names_are_kept_by_function(tmp_path):
    """A resumed run keeps the name its config.json gave each ``grpo.rewards`` part (its metric's); a part recorded
    without a name is not mapped, and a new run (no config.json) or an unreadable one maps nothing."""
    import json

    from dgrpo.cli.train import recorded_reward_names

    assert recorded_reward_names(tmp_path) == {}
    (tmp_path / "config.json").write_text("{not json")
    assert recorded_reward_names(tmp_path) == {}
    rewards = [{"fn": "/abs/r.py:f", "name": "r:f"}, {"fn": "/abs/s.py:g", "name": ""}, {"fn": "/abs/t.py:h"}]
    (tmp_path / "config.json").write_text(json.dumps({"grpo": {"rewards": rewards}}))
    assert recorded_reward_names(tmp_path) == {"/abs/r.py:f": "r:f"}


def test_a_dataset_named_by_valid_and_test_is_read_once_under_data_valid():
    """``data.valid`` and ``data.test`` naming one dataset: it is read once, under its first key (data.valid), and
    each other test set once under data.test; an empty data.valid is no dataset."""
    from dgrpo.cli.train import held_out_specs
    from dgrpo.config import Config

    cfg = Config()
    cfg.data.valid, cfg.data.test = "builtin:valid", ["builtin:test", "builtin:valid", "builtin:test"]
    assert held_out_specs(cfg) == [("data.valid", "builtin:valid"), ("data.test", "builtin:test")]
    cfg.data.valid = ""
    assert held_out_specs(cfg) == [("data.test", "builtin:test"), ("data.test", "builtin:valid")]


def test_load_applies_set_and_checks_out_when_given(tmp_path):
    """``load``: ``--set`` applies; ``--out`` is checked when the command has one (an empty one is a one-line error)
    and not when it has none."""
    from dgrpo.cli.common import load
    from dgrpo.config import ConfigError

    def args(out):
        return argparse.Namespace(cmd="config", config=[], overrides=["seed=3"], out=out)

    assert load(args(None)).seed == 3
    assert load(args(str(tmp_path / "run"))).seed == 3
    with pytest.raises(ConfigError, match="--out is empty"):
        load(args(""))


def test_the_revision_an_init_or_model_is_read_at(tmp_path):
    """``model.revision`` applies to ``--init`` / ``--model`` when ``--set`` gives it, or when the config's model is
    that model; a revision of the config's other model is dropped (""), with a warning; a local directory is read as
    it is (no warning: the revision is unused)."""
    import warnings

    from dgrpo.cli.common import revision_for
    from dgrpo.config import Config

    cfg = Config()
    cfg.model.name_or_path, cfg.model.revision = "org/base", "abc123"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert revision_for("org/base", cfg, [], "--init") == "abc123"
        assert revision_for("org/other", cfg, ["model.revision=abc123"], "--init") == "abc123"
        assert revision_for(str(tmp_path), cfg, [], "--init") == "abc123"
    with pytest.warns(UserWarning, match=r"model.revision=abc123 is the revision of .*org/base.*--init org/other"):
        assert revision_for("org/other", cfg, [], "--init") == ""
    cfg.model.revision = ""
    assert revision_for("org/other", cfg, [], "--model") == ""


def test_setup_sets_torchs_threads_only_when_threads_is_given(monkeypatch):
    """``threads: 0`` (the default) leaves torch's thread count as it is; ``threads: N`` sets it."""
    import torch

    from dgrpo.cli.common import setup
    from dgrpo.config import Config

    calls: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    cfg = Config()
    cfg.device = "cpu"
    assert setup(cfg).type == "cpu" and calls == []
    cfg.threads = 3
    setup(cfg)
    assert calls == [3]


def test_eval_joins_the_processes_without_fsdp_whatever_the_config_says(monkeypatch):
    """``join_processes(..., fsdp=False)`` (dgrpo eval) applies no FSDP: a config's ``fsdp: full`` is not even the
    single process's warning that FSDP is ignored; the training commands' (fsdp=True) is."""
    import warnings

    import torch

    from dgrpo.cli.common import join_processes
    from dgrpo.config import Config

    for name in ("WORLD_SIZE", "DGRPO_FSDP"):
        monkeypatch.delenv(name, raising=False)
    cfg = Config()
    cfg.fsdp = "full"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dist, device = join_processes(cfg, torch.device("cpu"), fsdp=False)
    assert not dist.active and device == torch.device("cpu")
    with pytest.warns(UserWarning, match="fsdp=full .* is ignored in a single process"):
        join_processes(cfg, torch.device("cpu"))


def test_the_start_line_names_a_hub_commit_unless_the_revision_pinned_it(capsys):
    """``report_model`` prints the hub commit a model was read at, with the --set that pins it, unless
    ``model.revision`` is that commit already, or the model came from no hub (a directory); a rank other than 0
    prints nothing."""
    from types import SimpleNamespace

    from dgrpo.cli.common import report_model
    from dgrpo.config import Config

    cfg = Config()
    lm = SimpleNamespace(hub_commit="c0ffee", peft=None)
    report_model(lm, "org/m", cfg)
    assert capsys.readouterr().out == "dgrpo: org/m: hub commit c0ffee (--set model.revision=c0ffee pins it)\n"
    report_model(lm, "org/m", cfg, SimpleNamespace(is_main=False))
    cfg.model.revision = "c0ffee"
    report_model(lm, "org/m", cfg)
    report_model(SimpleNamespace(hub_commit="", peft=None), "./dir", Config())
    assert capsys.readouterr().out == ""


def test_a_chat_template_on_the_command_line_turns_it_on_and_never_off():
    """``data.chat_template: true`` turns the chat template on for a model trained without it; false leaves a
    model trained with it as it is."""
    from types import SimpleNamespace

    from dgrpo.cli.common import prompt_settings
    from dgrpo.config import Config

    cfg = Config()
    for trained in (False, True):
        lm = SimpleNamespace(settings=SimpleNamespace(chat_template=trained))
        prompt_settings(lm, cfg)
        assert lm.settings.chat_template is trained
    cfg.data.chat_template = True
    lm = SimpleNamespace(settings=SimpleNamespace(chat_template=False))
    prompt_settings(lm, cfg)
    assert lm.settings.chat_template is True


@pytest.fixture(scope="module")
def untrained():
    """The tiny config (4 new tokens) and its untrained built-in model, with six built-in test records."""
    from dgrpo.data.synthetic import generate_split
    from dgrpo.model.factory import load_model

    from conftest import tiny_config

    cfg = tiny_config(**{"eval.max_new_tokens": 4})
    return cfg, load_model(cfg.model, cfg.task, seed=0, training=False), generate_split(cfg.task, "test")[:6]


def test_evaluate_shards_evaluates_the_first_limit_records_after_a_plain_prompts_shots(untrained):
    """One process: ``limit`` records are evaluated (the first ones), and the result records the limit; a plain
    prompt's ``shots`` examples come first and are not among them."""
    from dgrpo.cli.common import evaluate_shards
    from dgrpo.training.distributed import Dist

    cfg, lm, recs = untrained
    r = evaluate_shards(lm, recs, Dist(), limit=3)
    assert (r.n, r.limit) == (3, 3)
    assert [p["question"] for p in r.predictions] == [x.question for x in recs[:3]]
    r = evaluate_shards(lm, recs, Dist())
    assert (r.n, r.limit) == (6, 0)
    r = evaluate_shards(lm, recs, Dist(), plain=True, shots=2, limit=3)
    assert [p["question"] for p in r.predictions] == [x.question for x in recs[2:5]]


def test_a_runs_test_sets_of_best_are_written_apart_from_finals_under_their_own_keys(untrained, tmp_path, monkeypatch):
    """``evaluate_test_sets(..., checkpoint="best")``: each set's results in ``OUT/eval_best/<name>/``, naming the
    checkpoint by its absolute path (``--out`` given relative), and the accuracies as ``test_best/<name>/accuracy``
    (final/'s: ``OUT/eval/<name>/``, ``test/<name>/accuracy``)."""
    import json
    from pathlib import Path

    from dgrpo.cli.common import evaluate_test_sets
    from dgrpo.training.distributed import Dist

    cfg, lm, recs = untrained
    monkeypatch.chdir(tmp_path)
    out = Path("run")
    metrics = evaluate_test_sets(lm, {"builtin:test": recs[:2]}, cfg, out, Dist(), checkpoint="best")
    assert list(metrics) == ["test_best/builtin_test/accuracy"]
    written = json.loads((tmp_path / "run" / "eval_best" / "builtin_test" / "results.json").read_text())
    assert written["model"] == str(tmp_path / "run" / "best") and written["n"] == 2
    assert written["accuracy"] == metrics["test_best/builtin_test/accuracy"]
    assert list(evaluate_test_sets(lm, {"builtin:test": recs[:2]}, cfg, out, Dist())) == ["test/builtin_test/accuracy"]
    assert (tmp_path / "run" / "eval" / "builtin_test" / "results.json").is_file()


def test_the_test_sets_fit_check_reads_the_first_limit_records_names_the_key_and_restores_the_model(untrained):
    """``check_test_sets_fit``: only the first ``eval.limit`` records of a set are answered, so only they must fit;
    a set that does not names ``eval.n_latent`` when that is set, else the command's own key; the
    model's prompt settings are its own again afterwards, whether the check passed or failed."""
    from dataclasses import replace

    from dgrpo.cli.train import check_test_sets_fit
    from dgrpo.config import ConfigError
    from dgrpo.data.records import Record

    from conftest import tiny_config

    _, lm, recs = untrained
    long = Record("1 + " * 300 + "1 ?", [], "301")
    tests = {"builtin:test": [recs[0], long]}
    before = lm.settings
    trained = replace(before, n_latent=2)
    cfg = tiny_config(**{"data.max_question_tokens": 0, "eval.limit": 1})
    check_test_sets_fit(lm, tests, cfg, trained, "sft.c_thought")
    assert lm.settings is before
    for n_latent, key in ((-1, "sft.c_thought"), (1, "eval.n_latent")):
        cfg = tiny_config(**{"data.max_question_tokens": 0, "eval.n_latent": n_latent})
        with pytest.raises(ConfigError, match=f"data.test builtin:test, answered after training: .*lower {key}, "):
            check_test_sets_fit(lm, tests, cfg, trained, "sft.c_thought")
        assert lm.settings is before


@pytest.mark.parametrize("option", ["--init", "--resume"])
def test_a_blank_init_or_resume_is_one_line(option, tmp_path, run_cli):
    """``--init '  '`` or ``--resume '  '`` (a blank shell variable) is one line naming the option, not a path read
    as the working directory; nothing is written."""
    out = tmp_path / "run"
    r = run_cli("sft", option, "  ", "--out", out)
    assert r.returncode == 2 and r.stderr.startswith(f"dgrpo: error: {option} is empty: "), r.stderr
    assert len(r.stderr.splitlines()) == 1 and not out.exists()


@pytest.mark.parametrize(
    ("valid", "test", "said"),
    [
        ("builtin:valid", [], "data.valid (builtin:valid) is the built-in task's"),
        ("", ["builtin:test"], "data.test (builtin:test) is the built-in task's"),
        ("", ["builtin:test", "builtin:ood_steps"], "data.test (builtin:test, builtin:ood_steps) are the built-in"),
        ("builtin:valid", ["builtin:test"], "data.valid (builtin:valid) and data.test (builtin:test) are the built-in"),
    ],
)
def test_the_builtin_held_out_warning_agrees_in_number(valid, test, said):
    """Training on one's own data with built-in held-out sets: the warning says ``is`` for one set and ``are`` for
    several (two test sets of data.test alone included)."""
    from dgrpo.cli.train import warn_if_held_out_is_builtin
    from dgrpo.config import Config

    cfg = Config()
    cfg.data.train, cfg.data.valid, cfg.data.test = "my.jsonl", valid, test
    with pytest.warns(UserWarning, match=re.escape(f"data.train is my.jsonl, but {said}")):
        warn_if_held_out_is_builtin(cfg)


def test_eval_explains_which_checkpoint_settings_it_kept_and_where_decoding_comes_from():
    """``explain``: how many of the checkpoint's settings were kept, which the command line overrode, and where the
    decoding options come from (the --config given; a hub model's: this command; a local run's: the hint to pass
    its config.json); nothing for a model with no recorded settings."""
    from dgrpo.cli.evaluate import explain
    from dgrpo.config import Config

    cfg = Config()
    start = {"model": {"dtype": cfg.model.dtype}, "eval": {"scorer": "exact"}, "task": {"n_test": cfg.task.n_test}}
    head = (
        "dgrpo eval: task, data, dtype and scorer settings from the checkpoint's run_config.json (2 kept; overridden:"
    )
    assert explain({}, cfg) is None
    assert explain(
        start, cfg
    ) == f"{head} eval.scorer); decoding (eval.*) from this command: --config RUN/config.json " + ("for the run's own")
    assert explain(start, cfg, local=False) == f"{head} eval.scorer); decoding (eval.*) from this command"
    assert explain(start, cfg, ["a.yaml", "b.yaml"]) == (
        f"{head} eval.scorer); decoding (eval.*) from this command and its --config a.yaml b.yaml"
    )
    cfg.eval.scorer = "exact"
    assert explain(start, cfg, local=False) == (
        "dgrpo eval: task, data, dtype and scorer settings from the checkpoint's run_config.json (3 kept); decoding "
        "(eval.*) from this command"
    )


@pytest.mark.parametrize(
    ("name", "epochs", "stage"), [("checkpoint_1", 1, 0), ("checkpoint_3", 3, 0), ("checkpoint_4", 3, 1)]
)
def test_the_stage_of_run_pys_checkpoint_n_is_n_minus_1_over_epochs_per_stage(name, epochs, stage, tmp_path):
    """``checkpoint_N`` (saved after epoch N) is of stage ``(N - 1) // E``: the last epoch of a stage is still that
    stage's; ``checkpoint_0``, ``--epochs-per-stage 0`` or both options at once are one line each."""
    from pathlib import Path

    from dgrpo.cli.convert import checkpoint_stage
    from dgrpo.config import ConfigError

    assert checkpoint_stage(Path(name), None, epochs) == stage
    assert checkpoint_stage(Path(name), 7, None) == 7
    with pytest.raises(ConfigError, match="give one"):
        checkpoint_stage(Path(name), 1, epochs)
    with pytest.raises(ConfigError, match="--epochs-per-stage must be >= 1, got 0"):
        checkpoint_stage(Path(name), None, 0)
    with pytest.raises(ConfigError, match="'checkpoint_0' is not one"):
        checkpoint_stage(Path("checkpoint_0"), None, epochs)


def test_export_dtype_names_and_a_runs_recorded_dtype():
    """``dtype_named``: float32, bfloat16 and float16 by name; anything else (auto, none, a non-string,
    even a list) None; ``recorded_dtype``: the run's ``model.dtype``, None without a record."""
    import torch

    from dgrpo.cli.convert import dtype_named, recorded_dtype

    assert [dtype_named(n) for n in ("float32", "bfloat16", "float16")] == [
        torch.float32,
        torch.bfloat16,
        torch.float16,
    ]
    assert [dtype_named(n) for n in ("auto", None, 16, "", ["bfloat16"])] == [None] * 5  # (a hand-edited record)
    assert recorded_dtype({"model": {"dtype": "bfloat16"}}) == torch.bfloat16
    assert recorded_dtype({"model": None}) is None and recorded_dtype(None) is None and recorded_dtype({}) is None


def test_grpo_tests_with_its_own_latent_count_and_validates_on_the_first_eval_limit_records(
    untrained, tmp_path, monkeypatch, run_cli
):
    """dgrpo grpo (its trainer stubbed): the test sets are checked with the thoughts GRPO trains with,
    ``grpo.n_latent`` when set (0 included: no thoughts) else the checkpoint's, with the markers on; validation gets
    the first ``data.eval_limit`` records of ``data.valid``; a scorer other than the --init checkpoint's run's is
    warned of."""
    from dataclasses import replace

    from dgrpo.cli import train
    from dgrpo.training import grpo

    cfg, lm, _ = untrained
    init = tmp_path / "init"
    before = lm.settings
    lm.settings, lm.run_config = replace(before, n_latent=3, markers=False), {"eval": {"scorer": "exact"}}
    try:
        lm.save_pretrained(init)
    finally:
        lm.settings, lm.run_config = before, None
    checked, validated = [], []
    monkeypatch.setattr(train, "check_test_sets_fit", lambda lm_, tests, cfg_, settings, key: checked.append(settings))
    monkeypatch.setattr(grpo, "train_grpo", lambda *a, valid, **k: validated.append(valid))
    sets = ["--set", "data.valid=builtin:valid", "data.eval_limit=5", "data.test=[builtin:test]", "threads=1"]
    for n_latent, tested in ((0, 0), (2, 2), (-1, 3)):
        out = tmp_path / f"g{n_latent}"
        with pytest.warns(UserWarning, match="eval.scorer is 'numeric' here but 'exact' in the --init checkpoint's"):
            r = run_cli(
                "grpo", "--config", "tiny.yaml", "--init", init, *sets, f"grpo.n_latent={n_latent}", "--out", out
            )
        assert r.returncode == 0, r.stderr[-2000:]
        assert (checked[-1].n_latent, checked[-1].markers) == (tested, True)
        assert [len(v) for v in validated[-1].values()] == [5]


@pytest.mark.parametrize("every_epoch", [True, False])
def test_sft_tests_best_only_when_it_validates_every_epoch(every_epoch, tmp_path, monkeypatch, run_cli):
    """dgrpo sft (its trainer stubbed, its final evaluation called as the trainer calls it): best/ is tested beside
    final/ only under ``sft.eval_every_epoch`` (without it no epoch is chosen on validation)."""
    from dgrpo.cli import train
    from dgrpo.training import sft

    calls: list[str] = []
    monkeypatch.setattr(train, "evaluate_test_sets", lambda *a, **k: calls.append("final") or {})
    monkeypatch.setattr(train, "evaluate_best", lambda *a, **k: calls.append("best") or {})
    monkeypatch.setattr(sft, "train_sft", lambda lm, *a, final_eval, **k: final_eval(lm, 0))
    sets = ["--set", "data.valid=", "data.test=[builtin:test]", "threads=1", f"sft.eval_every_epoch={every_epoch}"]
    r = run_cli("sft", "--config", "tiny.yaml", *sets, "--out", tmp_path / "s")
    assert r.returncode == 0, r.stderr[-2000:]
    assert calls == (["final", "best"] if every_epoch else ["final"])


def test_eval_takes_the_task_data_dtype_and_scorer_a_checkpoint_recorded_and_refuses_a_bad_section(
    tmp_path, monkeypatch
):
    """``checkpoint_settings`` of a local checkpoint: every ``task`` option, the prompt's ``data`` keys and its
    ``data.test`` (the run's own test sets), ``model.dtype`` and ``eval.scorer`` (not the decoding, not the training
    data); a section that is not an object is one line naming the file; a null section is empty."""
    import json
    from pathlib import Path

    from dgrpo.cli.evaluate import checkpoint_settings
    from dgrpo.model import sources
    from dgrpo.model.verified import RUN_CONFIG_FILE, CheckpointError

    monkeypatch.setattr(sources, "resolve_checkpoint", Path)
    run = {
        "model": {"dtype": "bfloat16", "name_or_path": "org/base"},
        "task": {"n_steps": 3},
        "data": {"test": ["mine.jsonl"], "train": "t.jsonl", "answer_key": "target"},
        "eval": {"scorer": "exact", "temperature": 0.5},
        "grpo": {"lr": 1.0},
    }
    (tmp_path / RUN_CONFIG_FILE).write_text(json.dumps(run))
    assert checkpoint_settings(str(tmp_path)) == (
        {
            "model": {"dtype": "bfloat16"},
            "task": {"n_steps": 3},
            "data": {"test": ["mine.jsonl"], "answer_key": "target"},
            "eval": {"scorer": "exact"},
        },
        "",
    )
    (tmp_path / RUN_CONFIG_FILE).write_text(json.dumps({"model": None, "data": [1]}))
    with pytest.raises(CheckpointError, match=f"{RUN_CONFIG_FILE} is not valid: its 'data' is not an object"):
        checkpoint_settings(str(tmp_path))
    (tmp_path / RUN_CONFIG_FILE).write_text(json.dumps({"model": None}))
    assert checkpoint_settings(str(tmp_path))[0] == {"model": {}, "task": {}, "data": {}, "eval": {}}


@pytest.fixture
def saved(untrained, tmp_path):
    """The untrained built-in model saved as a checkpoint directory (what ``--model`` and ``--init`` name)."""
    _, lm, _ = untrained
    lm.save_pretrained(tmp_path / "ckpt")
    return tmp_path / "ckpt"


def _eval_args(model, out, *overrides, limit=None, plain=False, shots=None, data=("builtin:test",)):
    return argparse.Namespace(
        cmd="eval", model=str(model), config=["tiny.yaml"], overrides=list(overrides), limit=limit, plain=plain,
        shots=shots, out=str(out), data=list(data), split=None,
    )  # fmt: skip


def test_eval_limit_0_on_the_command_line_overrides_a_configs_limit(saved, tmp_path):
    """``--limit 0`` is ``eval.limit=0`` (every record) over a config's ``eval.limit``; no ``--limit`` keeps the
    config's."""
    from dgrpo.cli.evaluate import _eval_config

    cfg, datas, _, _ = _eval_config(_eval_args(saved, tmp_path / "e", "eval.limit=5", limit=0))
    assert (cfg.eval.limit, datas) == (0, ["builtin:test"])
    assert _eval_config(_eval_args(saved, tmp_path / "e", "eval.limit=5"))[0].eval.limit == 5
    assert _eval_config(_eval_args(saved, tmp_path / "e", limit=7))[0].eval.limit == 7


def test_eval_records_its_scorer_file_by_absolute_path(saved, tmp_path, monkeypatch):
    """A scorer given as ``file.py:function`` relative to the working directory is recorded absolute (results.json
    names it: reproducible from any folder)."""
    from dgrpo.cli.evaluate import _eval_config

    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_scorer.py").write_text(
        "def score(completions, answers, **kw):\n    return [1.0] * len(completions)\n"
    )
    cfg = _eval_config(_eval_args(saved, tmp_path / "e", "eval.scorer=my_scorer.py:score"))[0]
    assert cfg.eval.scorer == f"{(tmp_path / 'my_scorer.py').resolve()}:score"


def test_a_plain_prompts_shots_leave_the_records_after_them_to_evaluate(tmp_path):
    """``_read_sets``: a plain prompt's shots come out of the dataset; a set whose records are all shots is one line
    (``nothing to evaluate``), one with a record past them is read whole."""
    from pathlib import Path

    from dgrpo.cli.evaluate import _read_sets
    from dgrpo.data.records import DataError
    from dgrpo.eval.evaluate import eval_options

    from conftest import tiny_config

    scorer = eval_options(tiny_config())["scorer"]
    cfg = tiny_config(**{"eval.plain": True, "eval.shots": 2, "task.n_test": 3})
    assert [len(r) for r in _read_sets({"builtin:test": Path("o")}, None, cfg, scorer).values()] == [3]
    cfg = tiny_config(**{"eval.plain": True, "eval.shots": 3, "task.n_test": 3})
    with pytest.raises(DataError, match=r"builtin:test: nothing to evaluate \(3 records, 3 of them used as shots\)"):
        _read_sets({"builtin:test": Path("o")}, None, cfg, scorer)


@pytest.mark.parametrize("extra", [["grpo"], ["--config", "tiny.yaml"], ["--set", "seed=1"]])
def test_config_show_markdown_refuses_a_section_a_config_or_a_set(extra, run_cli):
    """``config show --markdown`` prints every option's default: a SECTION, ``--config`` or ``--set`` with it (which
    it would ignore) is exit 2 and one line."""
    r = run_cli("config", "show", "--markdown", *extra)
    assert r.returncode == 2 and r.stdout == ""
    assert (
        r.stderr
        == "dgrpo: error: config show --markdown prints every option's default: no SECTION, --config or --set\n"
    )


def test_demo_full_and_quick_together_are_a_usage_error(run_cli, tmp_path):
    """``dgrpo demo --full --quick`` (more seeds and a smoke test at once) is argparse's usage error, exit 2, before
    anything runs."""
    r = run_cli("demo", "--full", "--quick", "--out", tmp_path / "d")
    assert r.returncode == 2 and "argument --quick: not allowed with argument --full" in r.stderr
    assert not (tmp_path / "d").exists()


def test_eval_loads_a_model_with_the_command_lines_chat_template_and_warns_of_thoughts_it_cannot_use(
    untrained, tmp_path
):
    """``_load_eval_model``: ``data.chat_template: true`` applies to the model evaluated; ``eval.n_latent`` > 0 for
    a model trained without thoughts (cot) is warned of, 0 (no thoughts, what it does anyway) is not."""
    import warnings
    from dataclasses import replace

    import torch

    from dgrpo.cli.evaluate import _load_eval_model

    from conftest import tiny_config

    _, lm, _ = untrained
    before = lm.settings
    lm.settings = replace(before, mode="cot", n_latent=0)
    try:
        lm.save_pretrained(tmp_path / "cot")
    finally:
        lm.settings = before
    cpu = torch.device("cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = _load_eval_model(str(tmp_path / "cot"), tiny_config(**{"eval.n_latent": 0}), cpu)
        assert loaded.settings.chat_template is False
        chat = _load_eval_model(str(tmp_path / "cot"), tiny_config(**{"data.chat_template": True}), cpu)
        assert chat.settings.chat_template is True
    with pytest.warns(UserWarning, match="eval.n_latent=2 does not apply: .* trained without latent thoughts"):
        _load_eval_model(str(tmp_path / "cot"), tiny_config(**{"eval.n_latent": 2}), cpu)


def test_eval_sums_up_several_datasets_in_one_line_and_one_dataset_in_none(saved, tmp_path, run_cli):
    """``dgrpo eval`` prints each dataset's results as JSON, and after several one line of every accuracy; one
    dataset has its JSON line alone."""
    sets = ["--set", "task.n_test=2", "eval.max_new_tokens=2", "threads=1"]
    r = run_cli(
        "eval", "--model", saved, "--data", "builtin:test", "--config", "tiny.yaml", *sets, "--out", tmp_path / "a"
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert not [line for line in r.stdout.splitlines() if line.startswith("dgrpo eval: builtin")]
    both = ["builtin:test", "builtin:ood_steps"]
    r = run_cli("eval", "--model", saved, "--data", *both, "--config", "tiny.yaml", *sets, "--out", tmp_path / "b")
    assert r.returncode == 0, r.stderr[-2000:]
    summary = r.stdout.splitlines()[-1]
    assert re.fullmatch(r"dgrpo eval: builtin:test [\d.]+% \(\d/2\); builtin:ood_steps [\d.]+% \(\d/2\)", summary)


def test_a_blank_model_for_eval_is_one_line(run_cli, tmp_path):
    """``dgrpo eval --model '  '`` is one line naming the option (not a path read as the working directory)."""
    r = run_cli("eval", "--model", "  ", "--data", "builtin:test", "--out", tmp_path / "e")
    assert r.returncode == 2
    assert r.stderr == "dgrpo: error: --model is empty: name a checkpoint directory, a run directory or a hub id\n"


def test_export_refuses_an_out_that_holds_files_before_reading_anything(run_cli, tmp_path):
    """``dgrpo export --out DIR``: a DIR that holds files (a run, anything) is refused in one line before the adapter
    is even looked for (save_pretrained would write into it); the files are left as they were."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    r = run_cli("export", tmp_path / "no-such-adapter", "--merge", "--out", out)
    assert (
        r.returncode == 2 and r.stderr == f"dgrpo: error: --out {out} exists and is not empty: name a new directory\n"
    )
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


def test_a_revision_is_warned_of_only_with_a_local_directory(tmp_path):
    """``--revision`` names a hub id's branch, tag or commit: with a local directory it is warned of (ignored), with a
    hub id or without a revision nothing is said."""
    import warnings

    from dgrpo.cli.convert import warn_if_revision_is_ignored

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_revision_is_ignored("v1", "org/not-local-here", "--base")
        warn_if_revision_is_ignored(None, str(tmp_path), "--base")
        warn_if_revision_is_ignored("", str(tmp_path), "SRC")
    with pytest.warns(
        UserWarning, match=f"--revision v1 applies only to a hub id: SRC {tmp_path} is a local directory"
    ):
        warn_if_revision_is_ignored("v1", str(tmp_path), "SRC")


def test_a_base_models_stated_dtype_is_read_from_its_config(saved):
    """``base_dtype``: the dtype a base model's config.json states (bfloat16 here), float32 when it states none."""
    import json

    import torch

    from dgrpo.cli.convert import base_dtype

    config = json.loads((saved / "config.json").read_text())
    for key in ("torch_dtype", "dtype"):
        config.pop(key, None)
    (saved / "config.json").write_text(json.dumps(config))
    assert base_dtype(str(saved), False) == torch.float32
    (saved / "config.json").write_text(json.dumps({**config, "torch_dtype": "bfloat16"}))
    assert base_dtype(str(saved), False) == torch.bfloat16


def test_eval_refuses_a_split_its_data_cannot_take_before_reading_the_model(run_cli, monkeypatch, tmp_path):
    """``--split`` with joined datasets is one line before the model's settings are read (a hub id's from the hub:
    offline, the user was told of the hub first, and on fixing that, of the split)."""
    from dgrpo.cli import evaluate

    def read(*a, **kw):
        raise AssertionError("the model's settings were read before the split was checked")

    monkeypatch.setattr(evaluate, "checkpoint_settings", read)
    r = run_cli(
        "eval",
        "--model",
        "org/model",
        "--data",
        "builtin:test+builtin:valid",
        "--split",
        "valid",
        "--out",
        tmp_path / "e",
    )
    assert r.returncode == 2 and "joins datasets; name each part's split in --data" in r.stderr, r.stderr
