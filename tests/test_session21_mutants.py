"""Tests that kill mutants of session 21's code which its own tests let survive: OUT's early lock
(``take_run_dir`` / ``adopt_run_dir`` / ``run_dir_scope``), ``check_run_writes``' file and folder checks, and the
checks of a checkpoint's ``state.json`` values. Each test's docstring names the behaviour and the mutant it kills."""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_run_dir_early import _denied

from conftest import grpo_run_dir


def test_keep_last_1_checks_the_step_folders_it_removes(tmp_path, monkeypatch):
    """keep_last=1 removes every step-N folder but the newest: one the user cannot empty is refused at the start, as
    for keep_last=2; keep_last=0 (keep them all) removes none and refuses nothing. Kills ``keep_last > 0`` ->
    ``keep_last > 1`` in check_run_writes."""
    from dgrpo.config import ConfigError
    from dgrpo.training.out_dir import check_run_writes

    step = tmp_path / "checkpoints" / "step-00000002"
    step.mkdir(parents=True)
    _denied(monkeypatch, step)
    with pytest.raises(ConfigError, match=r"the run removes its checkpoints past the newest 1 \(keep_last\)"):
        check_run_writes(tmp_path, "grpo", "auto", 0, keep_last=1)
    check_run_writes(tmp_path, "grpo", "auto", 0, keep_last=0)


@pytest.mark.parametrize("name", ["applied.json", "summary.json"])
def test_resume_never_lets_a_folder_named_as_a_file_it_removes_through(tmp_path, name):
    """Under ``--resume never`` a folder named applied.json (or a GRPO run's summary.json) is among the earlier run's
    writes that the run removes before it writes its own: not refused, and gone once the run starts. Kills
    ``if resume != "never"`` -> ``if True`` in _check_run_files."""
    from dgrpo.config import to_dict

    from conftest import tiny_config

    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_text(json.dumps(to_dict(tiny_config())))
    (out / "metrics.jsonl").write_text("")
    (out / name).mkdir()
    with grpo_run_dir(out, tiny_config(), resume="never") as run:
        run.start(None)
    assert not (out / name).is_dir()


def test_an_unwritable_wandb_folder_is_refused_at_the_start(tmp_path, monkeypatch):
    """OUT/wandb not writable to the user, the run logging to W&B: refused at the start, naming it; without the
    wandb backend it is not. Kills dropping the ``"wandb" in backends`` place in _check_run_folders."""
    from dgrpo.config import ConfigError
    from dgrpo.training.out_dir import check_run_writes

    (tmp_path / "wandb").mkdir()
    _denied(monkeypatch, tmp_path / "wandb")
    with pytest.raises(ConfigError, match=r"wandb belongs to .* the run keeps its W&B files in it"):
        check_run_writes(tmp_path, "grpo", "auto", 0, backends=["wandb"])
    check_run_writes(tmp_path, "grpo", "auto", 0, backends=["tensorboard"])


def test_a_results_folder_the_user_cannot_enter_is_refused(tmp_path, monkeypatch):
    """OUT/eval/<test set> writable but not searchable (no x bit: nothing in it can be made): refused at the start.
    Kills ``os.W_OK | os.X_OK`` -> ``os.W_OK`` in _check_run_folders."""
    from dgrpo.config import ConfigError
    from dgrpo.training.out_dir import check_run_writes

    folder = tmp_path / "eval" / "builtin_test"
    folder.mkdir(parents=True)
    _denied(monkeypatch, folder, os.X_OK)
    with pytest.raises(ConfigError, match=r"the run writes its test results in it"):
        check_run_writes(tmp_path, "grpo", "auto", 0, tests=["builtin:test"], best=False)


def test_tests_best_defaults_are_the_configs():
    """A config dict without the grpo / sft section's setting (an older run's config) tests best/ as the config's
    default says: GRPO keeps best/ (grpo.save_best true), SFT does not (sft.eval_every_epoch false). Kills the
    defaults ``save_best`` True -> False and ``eval_every_epoch`` False -> True in tests_best."""
    from dgrpo.config import Config
    from dgrpo.training.out_dir import tests_best

    cfg = Config()
    valid = {"data": {"valid": "builtin:valid"}}
    assert tests_best(valid, "grpo") is cfg.grpo.save_best is True
    assert tests_best(valid, "sft") is cfg.sft.eval_every_epoch is False


def _stats(monkeypatch, folder: Path, file: Path, *, sticky: bool, folder_uid: int, file_uid: int):
    """``folder`` and ``file`` as the system describes them: the folder's sticky bit and both owners."""
    from dgrpo.training import out_dir

    real = Path.stat
    faked = {
        folder: SimpleNamespace(st_mode=stat.S_IFDIR | (stat.S_ISVTX if sticky else 0) | 0o777, st_uid=folder_uid),
        file: SimpleNamespace(st_mode=stat.S_IFREG | 0o444, st_uid=file_uid),
    }
    monkeypatch.setattr(out_dir.Path, "stat", lambda p, **k: faked.get(p) or real(p, **k))
    monkeypatch.setattr(out_dir.os, "geteuid", lambda: 1000)


@pytest.mark.parametrize(
    ("sticky", "folder_uid", "file_uid", "replaceable"),
    [
        (False, 2000, 2000, True),  # (a writable folder without the sticky bit: anyone writing it may rename over)
        (True, 1000, 2000, True),  # (the sticky folder is the user's)
        (True, 2000, 1000, True),  # (the file is the user's)
        (True, 2000, 2000, False),  # (/tmp: another user's file in another user's sticky folder)
    ],
)
def test_replaceable_follows_the_sticky_bits_owners(tmp_path, monkeypatch, sticky, folder_uid, file_uid, replaceable):
    """Whether the user may rename a new rollouts.jsonl over a read-only one: in a sticky folder only where the
    folder or the file is the user's. Kills, in _replaceable, dropping the owner test (``return not ... S_ISVTX``),
    dropping the file's owner (``(there.st_uid,)``) and ``return True``."""
    from dgrpo.training.out_dir import _replaceable

    file = tmp_path / "rollouts.jsonl"
    file.write_text("")
    _stats(monkeypatch, tmp_path, file, sticky=sticky, folder_uid=folder_uid, file_uid=file_uid)
    assert _replaceable(file) is replaceable


def test_a_lock_that_cannot_be_made_leaves_no_folder_the_command_line_made(tmp_path, monkeypatch):
    """take_run_dir made OUT (and its parent), then its lock file could not be made (a full disk): the refusal is
    one line and the folders it made are removed. Kills dropping ``remove_made(out, made)`` in take_run_dir's
    failure path."""
    from dgrpo.config import ConfigError
    from dgrpo.training import out_dir
    from dgrpo.training.out_dir import run_dir_scope, take_run_dir

    real = out_dir.os.open

    def full(path, *a, **k):
        if Path(path).name == ".lock":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(path, *a, **k)

    monkeypatch.setattr(out_dir.os, "open", full)
    out = tmp_path / "new" / "run"
    with run_dir_scope(), pytest.raises(ConfigError, match="cannot be opened"):
        take_run_dir(out)
    assert not (tmp_path / "new").exists()


def test_a_run_dir_on_another_directory_leaves_the_command_lines_lock(tmp_path):
    """A RunDir made on another directory than the one whose lock the command line holds takes a lock of its own,
    and the command line's lock is still there for the RunDir on its directory to take over. Kills dropping the
    ``held.out.resolve() != Path(out).resolve()`` test in adopt_run_dir."""
    from dgrpo.training.out_dir import run_dir_scope, take_run_dir

    out, other = tmp_path / "run", tmp_path / "other"
    with run_dir_scope():
        take_run_dir(out)
        with grpo_run_dir(other) as elsewhere:
            assert elsewhere.lock is not None and elsewhere.lock.path == other / ".lock"
        with grpo_run_dir(out) as run:  # (another lock on out, from this process, would be refused as in use)
            assert run.lock is not None and run.lock.path == out / ".lock"


def test_an_inner_scope_leaves_the_outer_scopes_lock(tmp_path):
    """run_dir_scope within another (a command run from one): leaving the inner one gives up no lock the outer one
    holds; the outer one's RunDir still takes it over. Kills ``_HELD.set(None)`` -> ``_HELD.set(_HELD.get())`` at the
    scope's start."""
    from dgrpo.training.out_dir import run_dir_scope, take_run_dir

    out = tmp_path / "run"
    with run_dir_scope():
        take_run_dir(out)
        with run_dir_scope():
            pass
        assert (out / ".lock").is_file()
        with grpo_run_dir(out) as run:
            assert run.lock is not None and run.made == out


def _state_changed(ckpt: Path, change) -> None:
    """``ckpt``'s state.json with ``change(state)`` applied, its manifest rewritten to match."""
    from dgrpo.model.verified import write_manifest

    state = json.loads((ckpt / "state.json").read_text())
    change(state)
    (ckpt / "state.json").write_text(json.dumps(state))
    (ckpt / "manifest.json").unlink()
    write_manifest(ckpt)


def _rng_checkpoint(tmp_path: Path, state: dict | None = None):
    """A checkpoint of a stub model (``state``: its state.json's own keys) and a function reading it."""
    import torch
    from test_resume_state_checks import StubReadLM

    from dgrpo.training.checkpoint import read_checkpoint, save_checkpoint

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    ckpt = save_checkpoint(tmp_path, 1, lm=StubReadLM(), optimizer=opt, state=state or {})
    return ckpt, lambda **kw: read_checkpoint(ckpt, lm=StubReadLM(), optimizer=opt, **kw)


@pytest.mark.parametrize(
    ("numpy", "said"),
    [
        (lambda s: s.pop(), "is not [name, state, position, has_gauss, gauss] (a NumPy random state)"),
        (lambda s: s.__setitem__(1, 5), "does not hold the 624 32-bit integers of a NumPy random state"),
        (lambda s: s[1].__setitem__(7, 2**32), "does not hold the 624 32-bit integers of a NumPy random state"),
        (lambda s: s[1].__setitem__(7, 1.5), "does not hold the 624 32-bit integers of a NumPy random state"),
        (
            lambda s: s.__setitem__(2, 3.0),
            "has the position 3.0 and has_gauss 0, not 0 to 624 and 0 or 1 (a NumPy random state)",
        ),
        (
            lambda s: s.__setitem__(2, 625),
            "has the position 625 and has_gauss 0, not 0 to 624 and 0 or 1 (a NumPy random state)",
        ),
        (
            lambda s: s.__setitem__(3, 1.0),
            "has the position 624 and has_gauss 1.0, not 0 to 624 and 0 or 1 (a NumPy random state)",
        ),
        (lambda s: s.__setitem__(4, True), "has the gauss true, not a finite number (a NumPy random state)"),
        (lambda s: s.__setitem__(4, float("nan")), "has the gauss NaN, not a finite number (a NumPy random state)"),
    ],
)
def test_each_part_of_a_numpy_random_state_is_checked(tmp_path, numpy, said):
    """``rng.numpy`` of 4 fields, its words not a list, a word past 32 bits or a float (np.array casts 1.5 to 1: a
    generator no run had), a float position, a position of 625 (past the words), a has_gauss of 1.0, a gauss of
    true or NaN: each one line naming it when the checkpoint is read. Kills, in numpy_random_state, dropping
    ``len(value) != 5``, the words' ``isinstance(words, list)``, their ``type(w) is not int`` and their range (or
    ``2**32`` -> ``2**33``), the position's ``type(pos) is not int`` and its bound (``pos <= 624`` ->
    ``pos <= 625``), has_gauss's ``type(has_gauss) is not int``, the gauss's bool and ``math.isfinite`` tests."""
    from dgrpo.model.verified import CheckpointError

    ckpt, read = _rng_checkpoint(tmp_path)
    _state_changed(
        ckpt, lambda state: (state["rng"]["numpy"].__setitem__(slice(2, 4), [624, 0]), numpy(state["rng"]["numpy"]))
    )
    with pytest.raises(CheckpointError) as e:
        read()
    assert str(e.value) == f"state.json: its rng's numpy {said}"


def _python_state(change) -> list:
    """A data generator's state as GRPOTrainer.state writes it, with ``change(state)`` applied."""
    import random

    v, words, gauss = random.Random(7).getstate()
    state = [v, list(words), gauss]
    change(state)
    return state


@pytest.mark.parametrize(
    ("over", "said"),
    [
        (
            {"data_rng": _python_state(lambda s: s.__setitem__(0, 3.0))},
            "data_rng has version 3.0, not 3 (a Python random state)",
        ),
        (
            {"data_rng": _python_state(lambda s: s[1].__setitem__(5, "5"))},
            "data_rng does not hold the 625 integers of a Python random state",
        ),
        (
            {"data_rng": _python_state(lambda s: s.__setitem__(2, float("nan")))},
            "data_rng has the gauss NaN, not a finite number or null",
        ),
        ({"nonfinite_skips": -1}, "nonfinite_skips is -1, not a count (0 or more)"),
    ],
)
def test_a_trainer_section_s_python_state_and_counts_are_checked(tmp_path, over, said):
    """GRPO's ``data_rng`` of version 3.0, a word that is a string (a TypeError's traceback from the range check
    otherwise), a NaN gauss, and a negative ``nonfinite_skips``: each one line when the checkpoint is read. Kills, in
    python_random_state, dropping ``type(version) is not int``, the words' ``type(w) is not int`` and the gauss's
    ``math.isfinite``; and dropping ``nonfinite_skips`` from the trainer's counts."""
    from test_resume_contents import _grpo_checkpoint, _trainer

    from dgrpo.model.verified import CheckpointError

    with pytest.raises(CheckpointError) as e:
        _grpo_checkpoint(tmp_path, _trainer(**over))()
    assert str(e.value) == f"state.json: its trainer's {said}"


def test_a_python_state_with_a_zero_word_reads(tmp_path):
    """A Python random state holding a word 0 (a valid 32-bit word) reads. Kills ``0 <= w`` -> ``0 < w`` in
    python_random_state."""
    from test_resume_contents import _grpo_checkpoint, _trainer

    _grpo_checkpoint(tmp_path, _trainer(data_rng=_python_state(lambda s: s[1].__setitem__(5, 0))))()


def test_an_order_without_a_row_count_names_no_count(tmp_path):
    """A trainer section written before dgrpo recorded its data (no ``train_data``) with a negative index in its
    ``order``: the line says it is not a row's index, naming no count. Kills dropping ``if rows is not None`` in
    trainer_state_problem's line ("of the None it was trained on")."""
    from test_resume_contents import _grpo_checkpoint, _trainer

    from dgrpo.model.verified import CheckpointError

    trainer = _trainer(order=[-1])
    del trainer["train_data"]
    with pytest.raises(CheckpointError) as e:
        _grpo_checkpoint(tmp_path, trainer)()
    assert str(e.value) == "state.json: its trainer's order holds -1, not the index of a training row"


@pytest.mark.parametrize(
    ("key", "value", "said"),
    [
        ("step", -1, "step is -1, not a count (0 or more)"),
        ("nonfinite_skips", -1, "nonfinite_skips is -1, not a count (0 or more)"),
        ("optimizer_kind", 3, "optimizer_kind is 3, not str"),
    ],
)
def test_the_top_level_step_skips_and_optimizer_kind_are_checked(tmp_path, key, value, said):
    """state.json's ``step`` or ``nonfinite_skips`` negative, or its ``optimizer_kind`` no string: one line when the
    checkpoint is read. Kills dropping ``step`` and ``nonfinite_skips`` from TOP_LEVEL's counts, and
    ``optimizer_kind`` from its keys."""
    from dgrpo.model.verified import CheckpointError

    ckpt, read = _rng_checkpoint(tmp_path, {"nonfinite_skips": 0, "metrics_lines": 1})
    read()
    _state_changed(ckpt, lambda state: state.__setitem__(key, value))
    with pytest.raises(CheckpointError) as e:
        read()
    assert str(e.value) == f"state.json's {said}"


def test_the_cuda_state_of_a_device_this_process_does_not_see_is_not_tried(tmp_path):
    """A checkpoint written on more GPUs than this process sees (on a CPU machine: any GPU) holds CUDA states of
    devices restore_rng does not put back: they are not tried, and the checkpoint reads. Kills ``i < seen`` ->
    ``i <= seen`` in _check_rng."""
    import torch

    ckpt, read = _rng_checkpoint(tmp_path)
    unseen = torch.cuda.device_count() if torch.cuda.is_available() else 0
    states = torch.load(ckpt / "rng.pt", weights_only=True)
    states[f"torch_cuda_{unseen}"] = torch.zeros(16, dtype=torch.uint8)
    torch.save(states, ckpt / "rng.pt")
    _state_changed(ckpt, lambda state: None)
    read()


def test_init_columns_adds_nothing_to_a_config_that_maps_its_own(tokenizer, tmp_path):
    """init_columns: the --init checkpoint's run mapped prompt/target; a config that maps no column is told that
    mapping, one that maps its own (data.question_key set) is told nothing (its own mapping is what it reads with).
    Kills dropping ``cfg.data.question_key`` from init_columns' first test."""
    from test_train_cli_early import _mapped_init

    from dgrpo.cli.train import init_columns
    from dgrpo.config import Config

    init = _mapped_init(tokenizer, tmp_path / "sft", question_key="prompt", answer_key="target")
    cfg = Config()
    assert init_columns(init, cfg) == ["data.question_key=prompt", "data.answer_key=target"]
    cfg.data.question_key = "q"
    assert init_columns(init, cfg) == []


@pytest.mark.parametrize(
    "data",
    [["question_key", "prompt"], {"question_key": 5, "answer_key": ""}, {"question_key": "", "steps_key": ["s"]}],
)
def test_init_columns_names_only_a_mapping_of_column_names(tokenizer, tmp_path, data):
    """A --init checkpoint's run_config.json whose ``data`` is no mapping (a list), or whose column keys hold no
    column name (a number, an empty string, a list): nothing is said of it (no ``data.question_key=5``, no
    AttributeError's traceback). Kills, in init_columns, dropping ``isinstance(data, dict)``, and the key's
    ``isinstance(..., str)`` or ``and data[k]``."""
    from test_train_cli_early import _mapped_init

    from dgrpo.cli.train import init_columns
    from dgrpo.config import Config

    init = _mapped_init(tokenizer, tmp_path / "sft")
    (tmp_path / "sft" / "run_config.json").write_text(json.dumps({"data": data}))
    assert init_columns(init, Config()) == []


def test_a_missing_file_is_not_said_to_lack_the_init_runs_mapping(tokenizer, tmp_path, monkeypatch):
    """data.train naming no file, the --init run having mapped columns: the line is the missing file's, nothing said
    of the mapping (which would not read a file that is not there). Kills dropping ``"unrecognised record keys" in
    str(e)`` in read_setting."""
    from test_train_cli_early import _mapped_init

    from dgrpo.cli.train import read_setting
    from dgrpo.config import Config
    from dgrpo.data.records import DataError

    monkeypatch.chdir(tmp_path)
    init = _mapped_init(tokenizer, tmp_path / "sft", question_key="prompt", answer_key="target")
    with pytest.raises(DataError) as e:
        read_setting("data.train", "nowhere.jsonl", Config(), init)
    assert str(e.value).startswith("data.train: ") and "--init checkpoint" not in str(e.value)
    assert str(e.value).endswith("; --set data.train=... names another")


def test_init_columns_of_a_model_without_a_run_config_is_nothing(tokenizer, tmp_path):
    """--init a model folder no dgrpo run wrote (a hub model saved locally: no run_config.json): nothing to say,
    not a FileNotFoundError's traceback in place of the reader's line. Kills narrowing init_columns' ``except
    (CheckpointError, OSError, ValueError)`` to CheckpointError."""
    from test_train_cli_early import _mapped_init

    from dgrpo.cli.train import init_columns
    from dgrpo.config import Config

    init = _mapped_init(tokenizer, tmp_path / "sft", question_key="prompt")
    (tmp_path / "sft" / "run_config.json").unlink()
    assert init_columns(init, Config()) == []


@pytest.mark.parametrize(("log_rollouts", "replaced"), [(2, True), (0, False)])
def test_a_read_only_rollouts_file_is_replaced_only_by_a_run_that_logs_rollouts(
    tmp_path, monkeypatch, log_rollouts, replaced
):
    """A read-only rollouts.jsonl (not writable to the user) in a folder the user may write: a run logging rollouts
    replaces it with a file of its own (a new file: as root the append would pass on the old one, and the test with
    it), a run logging none leaves it as it is. Kills, in RunDir.start, dropping ``or read_only`` and making
    ``logged`` always true."""
    from dgrpo.config import to_dict

    from conftest import tiny_config

    out = tmp_path / "run"
    out.mkdir()
    cfg = tiny_config(**{"grpo.log_rollouts": log_rollouts})
    (out / "config.json").write_text(json.dumps(to_dict(cfg)))
    (out / "metrics.jsonl").write_text("")
    rollouts = out / "rollouts.jsonl"
    rollouts.write_text("")
    rollouts.chmod(0o444)
    before = rollouts.stat().st_ino
    _denied(monkeypatch, rollouts)
    with grpo_run_dir(out, cfg) as run:
        run.start(None)
    assert (rollouts.stat().st_ino != before) is replaced


def test_only_rank_0_warns_of_an_earlier_evaluations_results(tmp_path, monkeypatch):
    """Under torchrun every rank of ``dgrpo eval`` finds OUT's earlier results: rank 0 alone warns (one warning, not
    one per rank). Kills dropping ``is_rank0()`` in warn_of_earlier_results."""
    import warnings

    from test_eval_outputs import _results

    from dgrpo.cli.evaluate import warn_of_earlier_results

    _results(tmp_path / "gsm8k", "gsm8k")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    with pytest.warns(UserWarning, match="earlier dgrpo eval's results"):
        warn_of_earlier_results(tmp_path, [tmp_path / "builtin_test"])
    monkeypatch.setenv("RANK", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_of_earlier_results(tmp_path, [tmp_path / "builtin_test"])


def test_a_results_file_naming_no_dataset_by_a_string_is_not_stale(tmp_path):
    """OUT/5/results.json whose ``dataset`` is the number 5 (no evaluation writes that): not an evaluation's results
    for the folder 5, so not named as stale. Kills dropping ``isinstance(summary["dataset"], str)`` in
    is_results_file (``results_name(str(5)) == "5"``)."""
    from test_eval_outputs import _results

    _results(tmp_path / "5", "builtin:test")
    summary = json.loads((tmp_path / "5" / "results.json").read_text())
    (tmp_path / "5" / "results.json").write_text(json.dumps({**summary, "dataset": 5}))
    assert stale_results_of(tmp_path) == []


def stale_results_of(out: Path) -> list:
    """What an evaluation of two datasets into ``out`` finds there of an earlier one's."""
    from dgrpo.eval.results import stale_results

    return stale_results(out, [out / "builtin_test", out / "builtin_valid"])


def test_a_linked_folder_s_results_are_not_named_as_stale(tmp_path):
    """OUT/gsm8k a link to a folder elsewhere holding an evaluation of gsm8k (a user's shortcut to other results):
    not OUT's own earlier results, not named. Kills dropping ``not d.is_symlink()`` in stale_results."""
    from test_eval_outputs import _results

    _results(tmp_path / "elsewhere", "gsm8k")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "gsm8k").symlink_to(tmp_path / "elsewhere")
    assert stale_results_of(tmp_path / "out") == []
