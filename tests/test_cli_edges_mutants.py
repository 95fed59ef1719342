"""The command line's contracts that a second mutation pass over ``dgrpo.cli`` found unpinned (beside
test_cli_mutants.py): options parsed but not passed on, exit codes and one-line errors of the top level, and what a
stop line says. Each test in-process and fast: the command's heavy call replaced by a stand-in that records what it
was given."""

import argparse
import errno

import pytest

import dgrpo.cli as cli
from dgrpo.cli import tools

from conftest import raising_command


def test_a_full_disk_is_exit_2_and_one_line_with_what_the_same_command_does_next(monkeypatch, run_cli, tmp_path):
    """An OSError ENOSPC out of a command (a metrics line, a results file) is exit 2 and one line naming the file,
    with a training run's advice; without a file name it says 'a file'. (Not exit 1 or a traceback.)"""
    from dgrpo.cli import train

    full = OSError(errno.ENOSPC, "No space left on device", "/x/metrics.jsonl")
    monkeypatch.setattr(train, "run_sft", raising_command(full))
    r = run_cli("sft", "--out", tmp_path / "run")
    assert r.returncode == 2
    assert r.stderr == (
        "dgrpo: error: /x/metrics.jsonl: no space left on the device; no checkpoint was written yet: the same "
        "command starts the run again\n"
    )
    monkeypatch.setattr(tools, "run_config_show", raising_command(OSError(errno.ENOSPC, "No space left on device")))
    r = run_cli("config", "show")
    assert (r.returncode, r.stderr) == (2, "dgrpo: error: a file: no space left on the device\n")


def test_a_checkpoint_still_being_written_is_no_checkpoint_to_resume_from(tmp_path):
    """A stop while the first checkpoint is written leaves only its hidden ``.tmp-step-N`` folder: the stop line says
    that no checkpoint was written (the same command starts over), not that it resumes from one."""
    from dgrpo.cli import _resume_hint

    (tmp_path / "checkpoints" / ".tmp-step-00000005").mkdir(parents=True)
    args = argparse.Namespace(cmd="grpo", out=str(tmp_path), resume="auto")
    assert _resume_hint(args) == "; no checkpoint was written yet: the same command starts the run again"


def test_a_reward_part_named_in_the_config_keeps_that_name_over_the_runs_recorded_one(tmp_path):
    """``record_init``: a ``grpo.rewards`` part the config names keeps that name (its metric ``reward/<name>``); a
    part without one takes the name the run in OUT recorded for its function, else its default name."""
    import json

    from dgrpo.cli.train import record_init
    from dgrpo.config import Config, load_config

    (tmp_path / "config.json").write_text(
        json.dumps({"grpo": {"rewards": [{"fn": "numeric", "name": "old"}, {"fn": "exact", "name": "was"}]}})
    )
    rewards = "grpo.rewards=[{fn: numeric, name: mine}, {fn: exact}, {fn: choice}]"
    cfg = record_init(load_config(Config, None, [rewards, "grpo.filter=false"]), None, tmp_path)
    assert [(r["fn"], r["name"]) for r in cfg.grpo.rewards] == [
        ("numeric", "mine"),
        ("exact", "was"),
        ("choice", "choice"),
    ]


@pytest.fixture
def trainers(monkeypatch):
    """dgrpo sft / grpo with what ``set_up_run`` reads replaced (no data, a stand-in model; ``tests``: the test sets
    it gives) and each trainer replaced by one that records its keyword arguments and then, when ``best`` is set,
    makes OUT/best and calls the command's final evaluation as the trainer does, with best/ at that step or epoch.
    Returns (calls, evaluations): the trainers' keyword arguments, and which checkpoints the test sets were run on."""
    from dataclasses import dataclass
    from pathlib import Path
    from types import SimpleNamespace

    import torch

    from dgrpo.cli import train
    from dgrpo.eval.scoring import SCORERS
    from dgrpo.model import factory
    from dgrpo.training import grpo, sft
    from dgrpo.training.distributed import Dist

    @dataclass
    class Settings:
        n_latent: int = 2
        chat_template: bool = False
        markers: bool = False

    state = SimpleNamespace(calls=[], evaluated=[], tests={}, best=None, scorer=SCORERS["numeric"])

    def set_up(args):  # (what set_up_run returns, without data or a model: what reaches the trainer is under test)
        cfg = train.load(args)
        model = SimpleNamespace(settings=Settings(), model=torch.nn.Linear(1, 1))
        scorer = {"scorer": state.scorer}
        return train.Setting(cfg, scorer, [], None, dict(state.tests), Dist(), None, model, Path(args.out))

    def trainer(lm, *args, final_eval, **kwargs):
        state.calls.append(kwargs)
        if state.best is not None:
            out = Path(args[-1])  # (train_sft(lm, train, cfg, out), train_grpo(lm, cfg, train, out))
            (out / "best").mkdir(parents=True, exist_ok=True)
            final_eval(lm, state.best)

    def evaluated(lm, tests, cfg, out, dist, checkpoint="final"):
        state.evaluated.append(checkpoint)
        return {}

    monkeypatch.setattr(train, "set_up_run", set_up)
    monkeypatch.setattr(sft, "train_sft", trainer)
    monkeypatch.setattr(grpo, "train_grpo", trainer)
    monkeypatch.setattr(train, "check_test_sets_fit", lambda *a: None)
    monkeypatch.setattr(train, "evaluate_test_sets", evaluated)
    best = SimpleNamespace(settings=Settings(), model=torch.nn.Linear(1, 2))  # (best/'s: other weights than final's)
    monkeypatch.setattr(factory, "load_model", lambda *a, **k: best)
    return state


@pytest.mark.parametrize("cmd", ["sft", "grpo"])
def test_the_training_commands_pass_resume_and_allow_config_change_to_the_trainer(cmd, trainers, run_cli, tmp_path):
    """``--resume never`` / ``--resume PATH`` and ``--allow-config-change`` reach the trainer (a flag parsed and
    dropped would resume, or refuse, silently); without them the trainer gets ``auto`` and ``False``."""
    out = tmp_path / "run"
    for given, resume, allow in (([], "auto", False), (["--resume", "never", "--allow-config-change"], "never", True)):
        r = run_cli(cmd, "--init", "x", "--out", out, *given)
        assert r.returncode == 0, r.stderr
        assert (trainers.calls[-1]["resume"], trainers.calls[-1]["allow_config_change"]) == (resume, allow)
    run_cli(cmd, "--init", "x", "--out", out, "--resume", str(tmp_path / "step-00000002"))
    assert trainers.calls[-1]["resume"] == str(tmp_path / "step-00000002")


@pytest.mark.parametrize(
    ("cmd", "sets", "last", "earlier"),
    [
        ("sft", ["sft.num_epochs=3", "sft.eval_every_epoch=true"], 2, 1),
        ("grpo", ["grpo.steps=4"], 4, 3),
    ],
)
def test_best_is_tested_apart_only_when_it_is_not_the_final_model(
    cmd, sets, last, earlier, trainers, run_cli, tmp_path
):
    """After training the test sets run on final/, and on best/ too unless best/ is the final model: SFT's last epoch
    (num_epochs - 1, counted from 0), GRPO's last step (grpo.steps). An earlier best is tested."""
    trainers.tests = {"builtin:test": []}
    for best, evaluated in ((last, ["final"]), (earlier, ["final", "best"])):
        trainers.best, trainers.evaluated[:] = best, []
        r = run_cli(cmd, "--init", "x", "--out", tmp_path / f"{cmd}{best}", "--set", *sets)
        assert r.returncode == 0, r.stderr
        assert trainers.evaluated == evaluated, best


def _eval_namespace(tmp_path, *overrides, plain=False, shots=None, limit=None):
    """``dgrpo eval --model org/model --data builtin:test`` with these options, as argparse gives them."""
    return argparse.Namespace(
        cmd="eval", model="org/model", config=[], overrides=list(overrides), limit=limit, plain=plain, shots=shots,
        out=str(tmp_path / "e"), data=["builtin:test"], split=None,
    )  # fmt: skip


def test_eval_passes_plain_shots_and_limit_into_its_config(monkeypatch, tmp_path):
    """``--plain``, ``--shots`` and ``--limit`` become ``eval.plain``, ``eval.shots`` and ``eval.limit`` (a flag
    dropped would evaluate a plain LM as a latent one without a word); without them the defaults hold. Shots without
    a plain prompt, from ``--shots`` or from ``eval.shots`` in a config, are one line."""
    from dgrpo.cli import evaluate
    from dgrpo.config import ConfigError

    monkeypatch.setattr(evaluate, "checkpoint_settings", lambda model, revision="": ({}, ""))  # (a plain hub model)
    cfg = evaluate._eval_config(_eval_namespace(tmp_path, plain=True, shots=1, limit=3))[0]
    assert (cfg.eval.plain, cfg.eval.shots, cfg.eval.limit) == (True, 1, 3)
    cfg = evaluate._eval_config(_eval_namespace(tmp_path))[0]
    assert (cfg.eval.plain, cfg.eval.shots, cfg.eval.limit) == (False, 0, 0)
    for args in (_eval_namespace(tmp_path, shots=2), _eval_namespace(tmp_path, "eval.shots=2")):
        with pytest.raises(ConfigError, match="^--shots / eval.shots: a k-shot prompt is for a plain LM"):
            evaluate._eval_config(args)


def test_config_show_of_a_section_with_a_set_prints_that_sections_resolved_values(run_cli):
    """``config show grpo --set grpo.lr=3e-5``: the resolved ``grpo`` section as one JSON object of its own keys
    (``lr``, not ``grpo.lr``), the override applied, and no other section."""
    import json

    from dgrpo.config import Config, to_dict

    r = run_cli("config", "show", "grpo", "--set", "grpo.lr=3e-5")
    assert r.returncode == 0, r.stderr
    shown = json.loads(r.stdout)
    assert shown == {**to_dict(Config())["grpo"], "lr": 3e-5}


@pytest.mark.parametrize("variable", ["LOCAL_RANK", "TORCHELASTIC_RUN_ID"])
def test_a_torchrun_worker_ties_itself_to_its_launcher_and_one_process_does_not(variable, monkeypatch, run_cli):
    """Under torchrun (either of its variables set) a command first asks to end with its launcher (a killed torchrun
    left its workers running); a command in one process does not; a launcher gone before the call ends the worker
    with one line."""
    from dgrpo.training import distributed

    for name in ("LOCAL_RANK", "TORCHELASTIC_RUN_ID", "WORLD_SIZE", "RANK"):
        monkeypatch.delenv(name, raising=False)
    tied: list[bool] = []
    monkeypatch.setattr(distributed, "exit_with_parent", lambda: tied.append(True) or True)
    assert run_cli("config", "show", "seed").returncode == 0 and tied == []
    monkeypatch.setenv(variable, "0")
    assert run_cli("config", "show", "seed").returncode == 0 and tied == [True]
    monkeypatch.setattr(distributed, "exit_with_parent", lambda: False)
    with pytest.raises(SystemExit, match="^dgrpo: the torchrun launcher is gone; exiting$"):
        cli.main(["config", "show", "seed"])


def test_the_early_resume_check_is_given_the_command_line_s_resume_options(monkeypatch, run_cli, tmp_path):
    """The refusal of a resume under a changed config, made before the data and the model are read, is asked with
    ``--resume`` and ``--allow-config-change`` as given (dropped, ``--allow-config-change`` would be refused there
    before the trainer ever saw it)."""
    from dgrpo.config import ConfigError
    from dgrpo.training import resume_check

    asked: list[tuple] = []

    def check(out, cfg, command, resume, allow_config_change):
        asked.append((command, resume, allow_config_change))
        raise ConfigError("checked")  # (nothing after it is under test)

    monkeypatch.setattr(resume_check, "check_resume_config", check)
    out = tmp_path / "run"
    assert run_cli("sft", "--out", out, "--resume", "never", "--allow-config-change").returncode == 2
    assert run_cli("sft", "--out", out).returncode == 2
    assert asked == [("sft", "never", True), ("sft", "auto", False)]


def test_configs_apply_in_the_order_given_and_set_applies_after_them(tmp_path):
    """``--config a.yaml --config b.yaml --set k=v``: b's values over a's, and ``--set`` over both, whatever the
    order of the options (argparse keeps each list in its own order)."""
    from dgrpo.cli.common import load

    (tmp_path / "a.yaml").write_text("seed: 1\nthreads: 1\n")
    (tmp_path / "b.yaml").write_text("seed: 2\n")

    def loaded(*configs: str, overrides=()):
        args = argparse.Namespace(cmd="sft", config=[str(tmp_path / c) for c in configs], overrides=list(overrides))
        cfg = load(args)
        return cfg.seed, cfg.threads

    assert loaded("a.yaml", "b.yaml") == (2, 1)
    assert loaded("b.yaml", "a.yaml") == (1, 1)
    assert loaded("a.yaml", "b.yaml", overrides=["seed=5"]) == (5, 1)


def _subparser(name: str) -> argparse.ArgumentParser:
    """The parser of ``dgrpo NAME``."""
    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


@pytest.mark.parametrize(
    ("cmd", "option", "default", "said"),
    [
        ("demo", "out", "runs/demo", "(default runs/demo)"),
        ("demo", "resume", "auto", "auto (default):"),
        ("sft", "resume", "auto", "auto (default):"),
        ("grpo", "resume", "auto", "auto (default):"),
        ("export", "dtype", "auto", "auto: the run's model.dtype"),
    ],
)
def test_an_options_default_is_the_one_its_help_states(cmd, option, default, said):
    """The defaults a user does not type are the ones ``--help`` states: ``dgrpo demo`` writes to runs/demo and keeps
    the runs that finished there (``--resume auto``; never would start every run over), and a training command
    resumes its newest checkpoint (never would delete the run)."""
    parser = _subparser(cmd)
    action = next(a for a in parser._actions if a.dest == option)
    assert action.default == default and said in (action.help or "")


def test_data_inspect_reads_the_split_it_is_given(run_cli):
    """``dgrpo data inspect builtin --split valid`` counts the validation split (``task.n_valid``), not the test
    split the name alone gives (``task.n_test``): a ``--split`` parsed and dropped showed the wrong data."""
    sizes = ["--set", "task.n_valid=3", "task.n_test=5"]
    assert run_cli("data", "inspect", "builtin", "--split", "valid", *sizes).stdout.splitlines()[0] == "3 records"
    assert run_cli("data", "inspect", "builtin", *sizes).stdout.splitlines()[0] == "5 records"


def test_eval_evaluates_each_dataset_with_the_limit_plain_and_shots_it_was_given(monkeypatch, run_cli, tmp_path):
    """``dgrpo eval --limit 2 --plain --shots 1``: each dataset's evaluation gets those (a flag that reached the
    config but not the evaluation evaluated every record, or a latent prompt); its results are written to --out,
    named after the model evaluated; without the flags: every record, the latent prompt, no shots."""
    from types import SimpleNamespace

    from dgrpo.cli import evaluate
    from dgrpo.eval import results

    asked: list[dict] = []
    written: list[tuple] = []

    def evaluated(lm, recs, dist, **how):
        asked.append({k: how[k] for k in ("plain", "shots", "limit", "dataset")})
        return SimpleNamespace(accuracy=0.5, correct=1, n=2, summary=lambda: {"n": 2}, model="")

    monkeypatch.setattr(evaluate, "checkpoint_settings", lambda model, revision="": ({}, ""))  # (a plain hub model)
    monkeypatch.setattr(evaluate, "_load_eval_model", lambda model, cfg, device: SimpleNamespace(hub_commit="c0ffee"))
    monkeypatch.setattr(evaluate, "evaluate_shards", evaluated)
    monkeypatch.setattr(results, "write_results", lambda r, out: written.append((r.model, out)))
    sets = ["--set", "task.n_test=4", "threads=1"]
    r = run_cli("eval", "--model", "org/m", "--data", "builtin:test", *sets, "--out", tmp_path / "a", "--limit", "2")
    assert r.returncode == 0, r.stderr
    r = run_cli("eval", "--model", "org/m", "--data", "builtin:test", *sets, "--out", tmp_path / "b", "--plain")
    assert r.returncode == 0, r.stderr
    r = run_cli(
        "eval", "--model", "org/m", "--data", "builtin:test", *sets, "--out", tmp_path / "c", "--plain", "--shots", "1"
    )
    assert r.returncode == 0, r.stderr
    assert asked == [
        {"plain": False, "shots": 0, "limit": 2, "dataset": "builtin:test"},
        {"plain": True, "shots": 0, "limit": 0, "dataset": "builtin:test"},
        {"plain": True, "shots": 1, "limit": 0, "dataset": "builtin:test"},
    ]
    assert written == [("org/m@c0ffee", tmp_path / name) for name in "abc"]


@pytest.mark.parametrize("mode", ["full", "sharded"])
def test_eval_says_that_any_fsdp_mode_is_not_applied(mode):
    """dgrpo eval applies no FSDP: ``fsdp: full`` and ``fsdp: sharded`` alike are warned of; ``none`` is not."""
    import warnings

    from dgrpo.cli.evaluate import warn_fsdp_not_applied
    from dgrpo.config import Config

    cfg = Config()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_fsdp_not_applied(cfg)
    cfg.fsdp = mode
    with pytest.warns(UserWarning, match=f"^fsdp={mode} .* is not applied by dgrpo eval"):
        warn_fsdp_not_applied(cfg)


def test_grpo_warns_of_a_task_other_than_its_init_checkpoints_only_for_the_builtin_data_and_not_for_sizes():
    """GRPO from a checkpoint trained on another built-in task (``task.n_steps`` differs) is warned of; other split
    sizes are the same task (no warning), and so is any task when the training data is the user's own."""
    import warnings

    from dgrpo.cli.train import warn_if_init_differs
    from dgrpo.config import Config, to_dict

    cfg = Config()
    task = to_dict(cfg)["task"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_init_differs(None, cfg)
        warn_if_init_differs({"task": {**task, "n_train": 7, "n_valid": 8, "n_test": 9}}, cfg)
        cfg.data.train = "my.jsonl"
        warn_if_init_differs({"task": {**task, "n_steps": task["n_steps"] + 1}}, cfg)
    cfg.data.train = "builtin:train"
    with pytest.warns(
        UserWarning, match=r"the built-in task differs from the --init checkpoint's run \(task.n_steps is"
    ):
        warn_if_init_differs({"task": {**task, "n_steps": task["n_steps"] + 1}}, cfg)


def test_a_training_command_warns_of_held_out_sets_that_share_questions_before_the_model_loads(
    monkeypatch, run_cli, tmp_path
):
    """dgrpo sft reads its data and warns, before the processes join and the model loads, of a test set that asks
    the training data's questions and of one that asks the validation set's (each check a function of its own,
    which the command must call)."""
    import json

    from dgrpo.cli import train
    from dgrpo.config import ConfigError

    rows = [{"question": f"What is {i} plus 1?", "answer": str(i + 1)} for i in range(3)]
    for name in ("a.jsonl", "b.jsonl"):
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in rows))

    def joined(*a, **k):
        raise ConfigError("joined")  # (what follows is not under test)

    monkeypatch.setattr(train, "join_processes", joined)
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    sets = ["--config", "tiny.yaml", "--set", "threads=1", f"data.test=[{b}]"]
    with pytest.warns(UserWarning, match=f"3 of the 3 questions of {b} are in the training data {a} word for word"):
        r = run_cli("sft", *sets, f"data.train={a}", "data.valid=", "--out", tmp_path / "r1")
    assert r.stderr == "dgrpo: error: joined\n"
    with pytest.warns(UserWarning, match=f"3 of the 3 questions of the test set {b} are questions of the validation"):
        r = run_cli("sft", *sets, f"data.valid={a}", "--out", tmp_path / "r2")
    assert r.stderr == "dgrpo: error: joined\n"


def test_grpo_checks_its_scorer_on_the_first_test_set_when_it_has_no_validation_set():
    """``eval.scorer`` is checked on the gold answers before GRPO's model loads (set_up_run:
    ``check_scorer_on_gold``): on the validation set, else (``data.valid`` empty) on the first test set; a scorer
    out of [0, 1] there is a RewardError, nothing trained (it failed at the test sets, after the whole run). The
    command's exit 2 before the load: tests/test_start_checks3.py."""
    import pytest

    from dgrpo.cli import train
    from dgrpo.data.records import Record
    from dgrpo.eval.scoring import RewardError

    from conftest import tiny_config

    scored: list[str] = []

    def scorer(completions, records, **kw):
        scored.extend(r.answer for r in records)
        return [2.0] * len(completions)

    first, second = [Record("What is 1 plus 1?", [], "2"), Record("What is 2 plus 1?", [], "3")], [Record("q", [], "9")]
    with pytest.raises(RewardError, match="2.0"):
        train.check_scorer_on_gold(tiny_config(), scorer, "grpo", [], None, {"a": first, "b": second})
    assert set(scored) == {"2", "3"}, scored
    scored.clear()
    with pytest.raises(RewardError, match="2.0"):  # (the validation set, when there is one)
        train.check_scorer_on_gold(tiny_config(), scorer, "grpo", [], second, {"a": first})
    assert scored == ["9"], scored


def test_init_is_read_at_the_revision_set_for_it_not_at_the_configs_other_models(monkeypatch, run_cli, tmp_path):
    """``--init org/other`` with a config whose ``model.revision`` pins its own ``model.name_or_path`` (org/base):
    the init is read at its default revision ("", with a warning), not at org/base's commit; ``--set
    model.revision=...`` applies to the init."""
    from dgrpo.config import ConfigError
    from dgrpo.training import resume_check

    revisions: list[str] = []

    def check(out, cfg, *a):
        revisions.append(cfg.model.revision)
        raise ConfigError("checked")  # (nothing after it is under test)

    monkeypatch.setattr(resume_check, "check_resume_config", check)
    (tmp_path / "base.yaml").write_text("model:\n  name_or_path: org/base\n  revision: abc123\n")
    args = ["grpo", "--config", tmp_path / "base.yaml", "--init", "org/other", "--out", tmp_path / "run"]
    with pytest.warns(UserWarning, match="model.revision=abc123 is the revision of the config's model.name_or_path"):
        assert run_cli(*args).returncode == 2
    assert run_cli(*args, "--set", "model.revision=def456").returncode == 2
    assert revisions == ["", "def456"]


def test_eval_reads_a_hub_model_at_no_revision_of_the_configs_other_model(monkeypatch, tmp_path):
    """``dgrpo eval --model org/other`` under a config whose ``model.revision`` pins its own model (org/base): the
    weights are not read at org/base's revision (``model.revision`` is the commit the settings were read at, "" when
    none was named), with a warning; ``--set model.revision=...`` applies to --model."""
    from dgrpo.cli import evaluate

    read_at: list[str] = []

    def settings(model, revision=""):
        read_at.append(revision)
        return {}, ""

    monkeypatch.setattr(evaluate, "checkpoint_settings", settings)
    (tmp_path / "base.yaml").write_text("model:\n  name_or_path: org/base\n  revision: abc123\n")
    args = _eval_namespace(tmp_path)
    args.model, args.config = "org/other", [str(tmp_path / "base.yaml")]
    with pytest.warns(UserWarning, match="model.revision=abc123 is the revision of the config's model.name_or_path"):
        assert evaluate._eval_config(args)[0].model.revision == ""
    args.overrides = ["model.revision=def456"]
    assert evaluate._eval_config(args)[0].model.revision == "def456"
    assert read_at == ["", "def456"]


def test_a_runs_test_sets_are_evaluated_with_eval_limit_and_its_options(monkeypatch, tmp_path):
    """``evaluate_test_sets`` (a training run's test sets, after it) evaluates the first ``eval.limit`` records of each
    set, as dgrpo eval would with that config, and under the decoding options ``eval.*`` gives."""
    from types import SimpleNamespace

    from dgrpo.cli import common
    from dgrpo.config import Config
    from dgrpo.eval import results
    from dgrpo.training.distributed import Dist

    asked: list[dict] = []

    def evaluated(lm, recs, dist, **how):
        asked.append(how)
        return SimpleNamespace(accuracy=0.25, summary=lambda: {}, model="")

    monkeypatch.setattr(common, "evaluate_shards", evaluated)
    monkeypatch.setattr(results, "write_results", lambda r, out: None)
    cfg = Config()
    cfg.eval.limit, cfg.eval.max_new_tokens = 3, 17
    metrics = common.evaluate_test_sets(None, {"builtin:test": [], "builtin:ood_steps": []}, cfg, tmp_path, Dist())
    assert metrics == {"test/builtin_test/accuracy": 0.25, "test/builtin_ood_steps/accuracy": 0.25}
    assert [(a["dataset"], a["limit"], a["max_new_tokens"]) for a in asked] == [
        ("builtin:test", 3, 17),
        ("builtin:ood_steps", 3, 17),
    ]


def test_the_demos_seed_counts_in_its_help_are_its_presets():
    """``dgrpo demo --help`` states the SFT and RL seed counts of the default, ``--full`` and ``--quick`` runs: they
    are the presets the demo runs (a preset changed without its help would say 4 pairs where 2 are run)."""
    import re

    from dgrpo.demo.pipeline import PRESETS

    parser = _subparser("demo")
    for option, index in (("sft_seeds", 1), ("seeds", 2)):
        said = next(a.help or "" for a in parser._actions if a.dest == option)
        found = re.search(r"\(default (\d+); --full (\d+); --quick (\d+)\)", said)
        assert found is not None, said
        assert [int(n) for n in found.groups()] == [PRESETS[p][index] for p in ("default", "full", "quick")]


def test_two_datasets_a_split_makes_one_are_named_as_the_user_gave_them(tmp_path):
    """``--data builtin:test builtin:valid --split valid`` (both the valid split): one line naming the two ``--data``
    given, not the run's data.test (which the user did not give); the run's own test sets (``given=False``) are
    named as data.test's."""
    from dgrpo.cli.evaluate import output_dirs
    from dgrpo.config import ConfigError

    both = ["builtin:test", "builtin:valid"]
    folder = tmp_path / "builtin_valid"
    with pytest.raises(ConfigError, match=f"^--data builtin:test and builtin:valid: both would write {folder} "):
        output_dirs(both, "valid", tmp_path)
    with pytest.raises(ConfigError, match="^--split valid: data.test's builtin:test and builtin:valid both become"):
        output_dirs(both, "valid", tmp_path, given=False)


def test_import_coconut_passes_every_option_to_the_import(monkeypatch, run_cli, tmp_path):
    """``dgrpo import-coconut``: each option reaches :func:`~dgrpo.model.coconut_import.import_coconut` (a hub base's
    ``--revision`` and ``--trust-remote-code`` included: dropped, the base was read at main, or its code refused),
    and the command prints what it wrote."""
    import json

    from dgrpo.model import coconut_import

    given: list[tuple] = []

    def imported(ckpt, base, out, **kw):
        given.append((ckpt, base, out, kw))
        out.mkdir(parents=True)
        (out / "latent_config.json").write_text(json.dumps({"n_latent": 4}))
        return out

    monkeypatch.setattr(coconut_import, "import_coconut", imported)
    out = tmp_path / "imported"
    argv = ["import-coconut", tmp_path / "checkpoint_5", "--base", "org/base", "--out", out, "--c-thought", "2"]
    more = ["--max-latent-stage", "3", "--n-latent", "4", "--stage", "2", "--mode", "pause", "--revision", "v1"]
    r = run_cli(*argv, *more, "--trust-remote-code")
    assert r.returncode == 0, r.stderr
    assert r.stdout == f'wrote {out}\nlatent_config.json: {{"n_latent": 4}}\n'
    assert given == [
        (
            tmp_path / "checkpoint_5",
            "org/base",
            out,
            {
                "c_thought": 2,
                "n_latent": 4,
                "stage": 2,
                "max_latent_stage": 3,
                "trust_remote_code": True,
                "revision": "v1",
                "mode": "pause",
            },
        )
    ]


def test_export_reads_a_hub_adapter_at_the_revision_given(monkeypatch, run_cli, tmp_path):
    """``dgrpo export org/adapter --revision v2``: the adapter's files are read at v2 (dropped, main's were merged
    without a word); without ``--revision``, at the default branch."""
    from dgrpo.model import sources

    asked: list[tuple] = []

    def files(name, revision, local_files_only=False):
        asked.append((name, revision))
        (tmp_path / "full").mkdir(exist_ok=True)  # (no adapter_config.json: refused after the read, not under test)
        return tmp_path / "full", True

    monkeypatch.setattr(sources, "hub_files", files)
    for given in (["--revision", "v2"], []):
        r = run_cli("export", "org/adapter", *given, "--merge", "--out", tmp_path / "out")
        assert r.returncode == 2 and "nothing to merge" in r.stderr, r.stderr
    assert asked == [("org/adapter", "v2"), ("org/adapter", None)]


def test_entry_exits_with_mains_code_and_a_joined_worker_skips_the_teardown(monkeypatch):
    """The ``dgrpo`` script exits with :func:`main`'s code (SystemExit, the interpreter's teardown as usual); a
    torchrun worker still in the process group leaves at once through ``os._exit`` with the same code (its output
    flushed), not through the teardown that could abort it."""
    monkeypatch.setattr(cli, "main", lambda: 3)
    monkeypatch.setattr(cli, "_joined", lambda: False)
    monkeypatch.setattr(cli.os, "_exit", lambda code: pytest.fail(f"os._exit({code}) in one process"))
    with pytest.raises(SystemExit) as e:
        cli.entry()
    assert e.value.code == 3
    left: list[int] = []

    def exit_now(code: int) -> None:
        left.append(code)
        raise KeyboardInterrupt  # (os._exit does not return: stop here)

    monkeypatch.setattr(cli, "_joined", lambda: True)
    monkeypatch.setattr(cli.os, "_exit", exit_now)
    with pytest.raises(KeyboardInterrupt):
        cli.entry()
    assert left == [3]


def test_a_runs_missing_test_file_is_said_relative_only_when_its_path_is_relative(tmp_path, monkeypatch):
    """A checkpoint's run tested on ``gone.jsonl`` (relative, not found from here) is one line saying the path is
    relative to where the run started; an absolute path that is gone is not said to be relative (its read names it)."""
    from dgrpo.cli.evaluate import check_run_test_files
    from dgrpo.config import ConfigError

    monkeypatch.chdir(tmp_path)
    check_run_test_files([str(tmp_path / "gone.jsonl")])
    with pytest.raises(ConfigError, match="gone.jsonl \\(its data.test\\), a path relative to the folder that run"):
        check_run_test_files(["gone.jsonl"])


def test_a_dataset_folders_label_puts_split_in_place_of_the_one_it_names(tmp_path):
    """``--data FOLDER:test --split valid`` is labelled ``FOLDER:valid`` (the option wins), as a built-in name's is."""
    from dgrpo.cli.evaluate import dataset_label

    (tmp_path / "mydata").mkdir()
    assert dataset_label(f"{tmp_path}/mydata:test", "valid") == f"{tmp_path}/mydata:valid"
    assert dataset_label(f"{tmp_path}/mydata", "valid") == f"{tmp_path}/mydata:valid"


def test_the_start_line_of_a_lora_run_says_how_many_parameters_train(monkeypatch, capsys):
    """``report_model`` of a LoRA model: its rank, alpha and base, and the trainable parameters as a count and a
    percentage of all (25 of 1,000: 2.50%)."""
    from types import SimpleNamespace

    from dgrpo.cli.common import report_model
    from dgrpo.config import Config
    from dgrpo.model import lora

    monkeypatch.setattr(lora, "trainable_parameters", lambda lm: (25, 1000))
    peft = SimpleNamespace(peft_config={lora.POLICY: SimpleNamespace(r=4, lora_alpha=8)})
    report_model(SimpleNamespace(hub_commit="", peft=peft, name_or_path="org/base"), "org/base", Config())
    assert capsys.readouterr().out == "dgrpo: LoRA r=4 alpha=8 on org/base: 25 of 1,000 parameters train (2.50%)\n"


def test_eval_refuses_a_split_for_a_test_file_of_the_runs_own(tmp_path):
    """``--split`` with the run's own test sets (no ``--data``) where one is a file: one line (a file has no splits;
    the split was dropped without a word), one set or several."""
    from dgrpo.cli.evaluate import output_dirs
    from dgrpo.config import ConfigError

    (tmp_path / "t.jsonl").write_text("")
    for datas in ([str(tmp_path / "t.jsonl")], ["builtin:test", str(tmp_path / "t.jsonl")]):
        with pytest.raises(ConfigError, match="^--split valid: .*t.jsonl is a file, which has no splits"):
            output_dirs(datas, "valid", tmp_path / "out", given=False)


def test_held_out_sets_need_no_steps_column_where_training_data_does(monkeypatch, run_cli, tmp_path):
    """``data.steps_key`` names the reasoning steps the training data must have; a test set is only answered, and
    needs none (its records read as held out): dgrpo sft reads both and goes on to join the processes."""
    import json

    from dgrpo.cli import train
    from dgrpo.config import ConfigError

    row = {"question": "What is 2 plus 1?", "answer": "3"}
    (tmp_path / "train.jsonl").write_text(json.dumps({**row, "why": ["2 + 1 = 3"]}) + "\n")
    (tmp_path / "test.jsonl").write_text(json.dumps({**row, "question": "What is 5 plus 1?", "answer": "6"}) + "\n")

    def joined(*a, **k):
        raise ConfigError("joined")  # (what follows is not under test)

    monkeypatch.setattr(train, "join_processes", joined)
    sets = [f"data.train={tmp_path / 'train.jsonl'}", f"data.test=[{tmp_path / 'test.jsonl'}]", "data.valid="]
    r = run_cli(
        "sft",
        "--config",
        "tiny.yaml",
        "--set",
        "threads=1",
        "data.question_key=question",
        "data.answer_key=answer",
        "data.steps_key=why",
        *sets,
        "--out",
        tmp_path / "r",
    )
    assert r.stderr == "dgrpo: error: joined\n"


def test_eval_of_a_runs_checkpoint_with_test_sets_set_anew_reads_them_from_here(monkeypatch, tmp_path):
    """``--set data.test=[...]`` over a checkpoint that recorded its own: the sets given are evaluated, read from here
    (no run folders to read them from: None), not checked as the run's own."""
    from dgrpo.cli import evaluate

    start = {"data": {"test": ["theirs.jsonl"]}}
    monkeypatch.setattr(evaluate, "checkpoint_settings", lambda model, revision="": (start, ""))
    (tmp_path / "ckpt").mkdir()
    args = _eval_namespace(tmp_path, "data.test=[builtin:test]")
    args.model, args.data = str(tmp_path / "ckpt"), None
    cfg, datas, folders, _ = evaluate._eval_config(args)
    assert (datas, folders) == (["builtin:test"], None)


def test_eval_takes_the_answer_length_a_checkpoint_was_trained_with(tmp_path, monkeypatch):
    """``checkpoint_settings`` takes ``data.max_target_tokens`` and ``data.max_question_tokens`` (the prompt's and the
    answer's lengths the run trained with) with the other data keys that define a prompt."""
    import json
    from pathlib import Path

    from dgrpo.cli.evaluate import checkpoint_settings
    from dgrpo.model import sources
    from dgrpo.model.verified import RUN_CONFIG_FILE

    monkeypatch.setattr(sources, "resolve_checkpoint", Path)
    data = {"max_target_tokens": 40, "max_question_tokens": 90, "steps_key": "why", "lr": 1}
    (tmp_path / RUN_CONFIG_FILE).write_text(json.dumps({"data": data}))
    assert checkpoint_settings(str(tmp_path))[0]["data"] == {
        "max_target_tokens": 40,
        "max_question_tokens": 90,
        "steps_key": "why",
    }


def test_a_joined_rank_trains_on_its_own_gpu_and_a_cpu_run_stays_on_the_cpu(monkeypatch):
    """``join_processes`` under torchrun: a CUDA run's rank takes the GPU of its LOCAL_RANK (cuda:1 for local rank
    1); a CPU run stays on the CPU (there is no cuda:1); one process keeps the device it was given."""
    from types import SimpleNamespace

    import torch

    from dgrpo.cli.common import join_processes
    from dgrpo.config import Config
    from dgrpo.training import distributed

    joined = SimpleNamespace(active=True, local_rank=1)
    monkeypatch.setattr(distributed.Dist, "from_env", staticmethod(lambda *a, **k: joined))
    assert join_processes(Config(), torch.device("cuda"))[1] == torch.device("cuda", 1)
    assert join_processes(Config(), torch.device("cpu"))[1] == torch.device("cpu")
    joined.active = False
    assert join_processes(Config(), torch.device("cuda"))[1] == torch.device("cuda")
