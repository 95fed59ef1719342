"""Metric sinks of :mod:`dgrpo.training.tracking`: TensorBoard event files and offline W&B runs, read back."""

import gc
import json
import math
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dgrpo.config import ConfigError
from dgrpo.run_layout import WANDB_ID_FILE
from dgrpo.training.tracking import (
    TensorBoardTracker,
    WandbTracker,
    describe_backends,
    open_trackers,
)

from conftest import child_pids

EVAL = "eval/valid/accuracy"


# -- TensorBoard ---------------------------------------------------------------------------------------------------


def _tb_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _next_second() -> None:
    """Event files sort by their creation second first: start the next writer in a later second."""
    time.sleep(1.01 - time.time() % 1)


def test_tensorboard_scalars(tmp_path):
    pytest.importorskip("tensorboard")
    t = TensorBoardTracker(tmp_path / "tb", "my-run")
    rows = [
        {"step": 0, EVAL: 0.25},
        {"step": 0, "reward_mean": 0.5, "skipped": True, "note": "hello", "reward_std": None},
        {"step": 1, "reward_mean": 0.75, "grad_norm": float("nan"), "loss": float("inf"), "n_rollouts_kept": 12},
        {"step": 2, "reward_mean": 1.0, EVAL: 0.5, "skipped": False},
    ]
    for r in rows:
        t.log(r, r["step"])
    t.close()
    t.close()  # idempotent
    assert t.where == str(tmp_path / "tb") and t.run_name == "my-run"
    got = _tb_scalars(tmp_path / "tb")
    assert got == {
        EVAL: [(0, 0.25), (2, 0.5)],
        "reward_mean": [(0, 0.5), (1, 0.75), (2, 1.0)],
        "skipped": [(0, 1.0), (2, 0.0)],
        "n_rollouts_kept": [(1, 12.0)],
    }  # no step, note (str), reward_std (None), grad_norm (NaN), loss (inf)


def test_tensorboard_writes_one_point_per_tag_and_step(tmp_path):
    """An SFT stage's end row repeats its last training row's step with ``stage``, ``n_latent`` and ``time_s``:
    TensorBoard showed two points at that step. The first row's value stays; the later row adds its new tags."""
    pytest.importorskip("tensorboard")
    t = TensorBoardTracker(tmp_path / "tb", "x")
    rows = [
        {"step": 64, "loss": 1.5, "stage": 0, "n_latent": 0, "time_s": 4.6},
        {"step": 64, "stage": 0, "n_latent": 0, "time_s": 4.7, EVAL: 0.25},
        {"step": 65, "loss": 1.25, "stage": 1, "n_latent": 1, "time_s": 4.8},
    ]
    for r in rows:
        t.log(r, r["step"])
    t.close()
    got = _tb_scalars(tmp_path / "tb")
    assert got["time_s"] == [(64, pytest.approx(4.6)), (65, pytest.approx(4.8))]
    assert got["stage"] == [(64, 0.0), (65, 1.0)] and got[EVAL] == [(64, 0.25)]
    assert got["loss"] == [(64, 1.5), (65, 1.25)]


def test_tensorboard_resume_supersedes_later_steps(tmp_path):
    pytest.importorskip("tensorboard")
    first = TensorBoardTracker(tmp_path / "tb", "x")
    for s in range(5):
        first.log({"step": s, "loss": float(s)}, s)
    first.close()
    _next_second()
    resumed = TensorBoardTracker(tmp_path / "tb", "x")  # resumed from a checkpoint at step 2
    for s in (2, 3):
        resumed.log({"step": s, "loss": 10.0 + s}, s)
    resumed.close()
    assert len(list((tmp_path / "tb").glob("events.out.tfevents.*"))) == 2
    assert _tb_scalars(tmp_path / "tb")["loss"] == [(0, 0.0), (1, 1.0), (2, 12.0), (3, 13.0)]


@pytest.mark.slow
def test_tensorboard_resume_keeps_the_checkpoints_rows_at_its_first_step(tmp_path):
    """The evaluation logged just before a checkpoint has the step of the next training row, where the resumed
    process's purge marker goes: the kept row is written again after it, so no point is lost."""
    pytest.importorskip("tensorboard")
    rows = [{"step": 0, EVAL: 0.25}, {"step": 0, "loss": 0.0}, {"step": 1, "loss": 1.0}, {"step": 2, EVAL: 0.5}]
    first = TensorBoardTracker(tmp_path / "tb", "x")
    for r in [*rows, {"step": 2, "loss": 2.0}]:  # then killed: the checkpoint at step 2 kept rows[:4]
        first.log(r, r["step"])
    first.close()
    _next_second()
    resumed = TensorBoardTracker(tmp_path / "tb", "x")
    resumed.resumed(rows)
    for s in (2, 3):
        resumed.log({"step": s, "loss": 10.0 + s}, s)
    resumed.close()
    got = _tb_scalars(tmp_path / "tb")
    assert got[EVAL] == [(0, 0.25), (2, 0.5)]
    assert got["loss"] == [(0, 0.0), (1, 1.0), (2, 12.0), (3, 13.0)]


def test_tensorboard_added_on_resume_gets_the_rows_before_it(tmp_path):
    """A run resumed with TensorBoard newly in logging.backends: the kept rows (steps before the resume) are written
    too; only the steps after the resume were."""
    pytest.importorskip("tensorboard")
    from dgrpo.training.run import MetricsLog

    rows = [{"step": 0, EVAL: 0.25}, {"step": 0, "loss": 0.0}, {"step": 1, "loss": 1.0}, {"step": 2, EVAL: 0.5}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    log = MetricsLog(tmp_path / "metrics.jsonl", enabled=True)
    log.open(len(rows), [TensorBoardTracker(tmp_path / "tb", "x")])
    for s in (2, 3):
        log.write({"step": s, "loss": 10.0 + s})
    log.close()
    got = _tb_scalars(tmp_path / "tb")
    assert got[EVAL] == [(0, 0.25), (2, 0.5)]
    assert got["loss"] == [(0, 0.0), (1, 1.0), (2, 12.0), (3, 13.0)]


# -- W&B (offline) -------------------------------------------------------------------------------------------------


def offline_wandb_variables(home: Path) -> dict[str, str]:
    """The variables of an offline, quiet W&B that keeps every file under ``home`` (no git, code or system stats)."""
    return {
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_CONSOLE": "off",
        "WANDB_DISABLE_GIT": "true",
        "WANDB_DISABLE_CODE": "true",
        "WANDB_X_DISABLE_STATS": "true",
        "WANDB_X_DISABLE_MACHINE_INFO": "true",
        "WANDB_DIR": str(home / "dir"),
        "WANDB_CONFIG_DIR": str(home / "config"),
        "WANDB_CACHE_DIR": str(home / "cache"),
        "WANDB_DATA_DIR": str(home / "data"),
        "WANDB_ARTIFACT_DIR": str(home / "artifacts"),
    }


@pytest.fixture
def wandb_env(tmp_path, monkeypatch):
    """Offline, quiet W&B with every file under tmp_path; after the test, no W&B process is left running."""
    wandb = pytest.importorskip("wandb")
    for key, value in offline_wandb_variables(tmp_path / "wandb-home").items():
        monkeypatch.setenv(key, value)
    for key in ("WANDB_API_KEY", "WANDB_ENTITY", "WANDB_PROJECT", "WANDB_RUN_ID", "WANDB_RESUME", "WANDB_NAME"):
        monkeypatch.delenv(key, raising=False)
    before = child_pids()
    try:
        yield wandb
    finally:
        wandb.teardown()  # stops the wandb-core service this process started
        deadline = time.time() + 10
        while child_pids() - before and time.time() < deadline:
            time.sleep(0.1)
        assert not child_pids() - before, "a W&B process outlived the test"


def _wandb_records(path: Path):
    """The records of a ``.wandb`` file: W&B's LevelDB-style log (a 7-byte ``:W&B`` header, then 32 KiB blocks of
    chunks, each with a 7-byte header: crc32, length, type 1 full / 2 first / 3 middle / 4 last) of ``Record``s."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    ident, magic, _version = struct.unpack("<4sHB", data[:7])
    assert (ident, magic) == (b":W&B", 0xBEE1)
    pos, pending, block = 7, b"", 32768
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # too little room left in the block for a chunk header: zero padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = pb.Record()  # type: ignore[attr-defined]  # (wandb picks its protobuf module at run time)
            record.ParseFromString(pending)
            pending = b""
            yield record


def _offline_run(run_dir: Path, run_id: str, index: int = -1) -> tuple[dict, dict[int, dict]]:
    """(config, {step: history row}) of the ``index``-th offline run directory of ``run_id`` in ``run_dir/wandb``."""
    dirs = sorted((run_dir / "wandb").glob(f"offline-run-*-{run_id}*"))
    files = list(dirs[index].glob(f"run-{run_id}.wandb"))
    assert len(files) == 1, dirs
    deadline = time.time() + 30
    records = list(_wandb_records(files[0]))
    while (not records or records[-1].WhichOneof("record_type") != "exit") and time.time() < deadline:
        # run.finish() can return before wandb-core has flushed the run's log to disk: wait for its exit record
        time.sleep(0.05)
        records = list(_wandb_records(files[0]))
    config: dict = {}
    history: dict[int, dict] = {}
    for r in records:
        kind = r.WhichOneof("record_type")
        if kind == "run":
            assert r.run.run_id == run_id
            config.update({u.key: json.loads(u.value_json) for u in r.run.config.update})
        elif kind == "config":
            config.update({u.key: json.loads(u.value_json) for u in r.config.update})
        elif kind == "history":
            items = {u.key or "/".join(u.nested_key): json.loads(u.value_json) for u in r.history.item}
            history[r.history.step.num] = {k: v for k, v in items.items() if not k.startswith("_")}
    return config, history


@pytest.mark.slow
def test_wandb_offline_logs_rows_and_config(tmp_path, wandb_env):
    run_dir = tmp_path / "runs" / "x"
    t = WandbTracker(run_dir, project="dgrpo", run_name="my-run", config={"seed": 3, "grpo": {"lr": 1e-5}})
    try:
        t.log({"step": 0, EVAL: 0.25}, 0)
        t.log({"step": 0, "reward_mean": 0.5, "skipped": True, "reward_std": None}, 0)  # same step: merged
        t.log({"step": 1, "reward_mean": 0.75, "grad_norm": float("nan"), "note": "hi"}, 1)
        t.log({"step": 2, "reward_mean": 1.0, EVAL: 0.5}, 2)
    finally:
        t.close()
    t.close()  # idempotent
    run_id = (run_dir / WANDB_ID_FILE).read_text().strip()
    assert t.run_id == run_id and t.offline and t.skipped == 0
    assert t.where.startswith(f"W&B offline run in {run_dir / 'wandb' / 'offline-run-'}")
    assert t.where.endswith(run_id)
    config, history = _offline_run(run_dir, run_id)
    assert config["seed"] == 3 and config["grpo"] == {"lr": 1e-5}
    assert sorted(history) == [0, 1, 2]
    assert history[0] == {EVAL: 0.25, "reward_mean": 0.5, "skipped": 1}
    assert history[1]["reward_mean"] == 0.75 and math.isnan(history[1]["grad_norm"]) and history[1]["note"] == "hi"
    assert history[2] == {"reward_mean": 1.0, EVAL: 0.5}


@pytest.mark.slow
def test_wandb_added_on_resume_gets_the_rows_before_it(tmp_path, wandb_env):
    """A run resumed with W&B newly in logging.backends starts a W&B run that holds the kept rows too."""
    from dgrpo.training.run import MetricsLog

    rows = [{"step": 0, EVAL: 0.25}, {"step": 0, "loss": 0.0}, {"step": 1, "loss": 1.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    log = MetricsLog(tmp_path / "metrics.jsonl", enabled=True)
    wb = WandbTracker(tmp_path, project="dgrpo", config={"seed": 0})  # (resume=True, but no run id stored yet)
    assert wb.fresh
    log.open(len(rows), [wb])
    log.write({"step": 2, "loss": 2.0})
    log.close()
    history = _offline_run(tmp_path, wb.run_id)[1]
    assert history == {0: {EVAL: 0.25, "loss": 0.0}, 1: {"loss": 1.0}, 2: {"loss": 2.0}}


@pytest.mark.slow
def test_wandb_resume_reuses_run_id(tmp_path, wandb_env):
    run_dir = tmp_path / "x"
    first = WandbTracker(run_dir, project="dgrpo", config={"seed": 0})
    try:
        for s in range(4):
            first.log({"step": s, "loss": float(s)}, s)
    finally:
        first.close()
    run_id = first.run_id
    resumed = WandbTracker(run_dir, project="dgrpo", config={"seed": 0})  # a resumed run: checkpoint at step 2
    try:
        assert resumed.run_id == run_id
        resumed.log({"step": 2, "loss": 20.0}, 2)  # a step the first process logged too
        resumed.log({"step": 2, EVAL: 0.5}, 2)  # same step again: merged
        resumed.log({"step": 1, "loss": 10.0}, 1)  # below the last logged step: skipped
        resumed.log({"step": 3, "loss": 30.0}, 3)
    finally:
        with pytest.warns(UserWarning, match=r"skipped 1 row\(s\), of step 1: it takes no step below 2"):
            resumed.close()
    assert resumed.skipped == 1
    assert len(list((run_dir / "wandb").glob(f"offline-run-*-{run_id}*"))) == 2
    assert _offline_run(run_dir, run_id, 0)[1] == {s: {"loss": float(s)} for s in range(4)}
    assert _offline_run(run_dir, run_id, 1)[1] == {2: {"loss": 20.0, EVAL: 0.5}, 3: {"loss": 30.0}}
    fresh = WandbTracker(run_dir, project="dgrpo", config={}, resume=False)  # starting afresh: a new run
    fresh.close()
    assert fresh.run_id != run_id and (run_dir / WANDB_ID_FILE).read_text().strip() == fresh.run_id


@pytest.mark.slow
def test_open_trackers_and_describe(tmp_path, wandb_env):
    pytest.importorskip("tensorboard")
    run_dir = tmp_path / "runs" / "x"
    assert open_trackers(["jsonl"], run_dir, config={}) == []
    trackers = open_trackers(["jsonl", "tensorboard", "wandb", "tensorboard"], run_dir, config={"seed": 1})
    try:
        assert [t.name for t in trackers] == ["tensorboard", "wandb"]
        for t in trackers:
            t.log({"step": 0, "loss": 1.0}, 0)
        line = describe_backends(["jsonl", "tensorboard", "wandb"], trackers, run_dir / "metrics.jsonl")
    finally:
        for t in trackers:
            t.close()
    wb = trackers[1]
    assert isinstance(wb, WandbTracker)
    assert line == (
        f"dgrpo: metrics -> {run_dir / 'metrics.jsonl'}, tensorboard ({run_dir / 'tb'}), wandb ({wb.where})"
    )
    assert _tb_scalars(run_dir / "tb") == {"loss": [(0, 1.0)]}
    assert _offline_run(run_dir, wb.run_id)[1] == {0: {"loss": 1.0}}


# -- errors and imports --------------------------------------------------------------------------------------------


def test_unknown_backend(tmp_path):
    with pytest.raises(ConfigError) as e:
        open_trackers(["jsonl", "mlflow"], tmp_path, config={})
    assert "mlflow" in str(e.value) and "\n" not in str(e.value)
    assert not list(tmp_path.iterdir())  # nothing opened


@pytest.mark.parametrize("backend", ["wandb", "tensorboard"])
def test_missing_package(tmp_path, monkeypatch, backend):
    for name in [m for m in sys.modules if m == backend or m.startswith(backend + ".")] + [backend]:
        monkeypatch.setitem(sys.modules, name, None)  # a None entry makes `import` fail as if not installed
    with pytest.raises(ConfigError) as e:
        open_trackers([backend], tmp_path, config={})
    msg = str(e.value)
    assert backend in msg and "pip install 'dgrpo[tracking]'" in msg and f"pip install {backend}" in msg
    assert "\n" not in msg


def test_missing_package_closes_trackers_already_open(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ConfigError, match="wandb"):
        open_trackers(["tensorboard", "wandb"], tmp_path, config={})
    assert _tb_scalars(tmp_path / "tb") == {}  # the event file was written and closed


def test_import_is_lazy():
    code = "import sys, dgrpo.training.tracking; print(sorted({'wandb', 'tensorboard', 'torch'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# -- the command line ------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_command_line_sft_and_grpo_log_to_wandb_offline(sft_checkpoint, tmp_path, wandb_env, run_cli):
    """``--set logging.backends=[jsonl,wandb]`` for SFT and GRPO: the start line names the backends, and the offline
    W&B run holds the config and the rows that metrics.jsonl holds."""
    from conftest import tiny_args

    wandb = {"logging.backends": "[jsonl,wandb]", "task.n_train": 256}
    runs = {
        "sft": ("sft", {**wandb, "sft.num_epochs": 2, "sft.epochs_per_stage": 1}),
        "grpo": ("grpo", {**wandb, "grpo.steps": 2, "grpo.prompts_per_step": 4, "--init": None}),
    }
    for name, (command, over) in runs.items():
        out = tmp_path / name
        init = ["--init", str(sft_checkpoint)] if "--init" in over else []
        over = {k: v for k, v in over.items() if k != "--init"}
        r = run_cli(command, *init, "--out", out, *tiny_args(**over))
        assert r.returncode == 0, r.stderr[-3000:]
        said = r.stdout + r.stderr
        assert f"dgrpo: metrics -> {out / 'metrics.jsonl'}, wandb (W&B offline run in" in said
        run_id = (out / WANDB_ID_FILE).read_text().strip()
        config, history = _offline_run(out, run_id)
        assert config[command]["lr"] > 0 and config["logging"]["backends"] == ["jsonl", "wandb"]
        logged = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        keys = {k for row in logged for k in row if k != "step" and isinstance(row[k], (int, float))}
        assert keys and keys <= {k for row in history.values() for k in row}, keys
        assert len(history) >= 2
        # the test set's accuracy is the run's last row, while W&B is open (it was evaluated after the run closed)
        tested = json.loads((out / "eval" / "builtin_test" / "results.json").read_text())["accuracy"]
        assert logged[-1] == {"step": logged[-2]["step"], "test/builtin_test/accuracy": tested}
        assert history[logged[-1]["step"]]["test/builtin_test/accuracy"] == tested


def test_the_final_evaluation_is_the_last_row_of_every_sink(sft_checkpoint, tmp_path):
    """``final_eval``'s metrics (the CLI's test-set accuracies) are logged at the last step while the trackers are
    open: metrics.jsonl's last row and a TensorBoard scalar; every rank calls it, rank 0's are logged."""
    from dgrpo.data.synthetic import generate_split
    from dgrpo.model.latent_lm import LatentLM
    from dgrpo.training.grpo import GRPOTrainer, train_grpo

    from conftest import tiny_config

    cfg = tiny_config(**{"grpo.steps": 1, "grpo.prompts_per_step": 2, "logging.backends": "[jsonl,tensorboard]"})
    lm, seen = LatentLM.from_pretrained(sft_checkpoint), []

    def final_eval(lm_, best):
        seen.append((lm_, best))
        # the trainer's optimizer moments and reference model are freed first (they held their memory through the
        # test sets and best/'s load)
        [trainer] = [o for o in gc.get_objects() if type(o) is GRPOTrainer]
        assert not trainer.opt.state and trainer.ref is None
        return {"test/x/accuracy": 0.25}

    out = tmp_path / "run"
    train_grpo(
        lm, cfg, generate_split(cfg.task, "train"), out, progress=False, log=lambda *a: None, final_eval=final_eval
    )
    assert seen == [(lm, None)]  # (one step, no validation set: no best/)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1] == {"step": 1, "test/x/accuracy": 0.25}
    assert _tb_scalars(out / "tb")["test/x/accuracy"] == [(1, 0.25)]


def test_wandb_disabled_says_so(tmp_path, wandb_env, monkeypatch):
    """WANDB_MODE=disabled: the start-of-run line said 'W&B project ..., run ...' for a run that records nothing."""
    monkeypatch.setenv("WANDB_MODE", "disabled")
    t = WandbTracker(tmp_path / "x", project="dgrpo", config={"seed": 3})
    try:
        t.log({"step": 0, "reward_mean": 0.5}, 0)
    finally:
        t.close()
    assert t.where == "W&B disabled (WANDB_MODE=disabled): nothing is recorded there"


@pytest.mark.parametrize(
    "project, env, said",
    [
        ("team/proj", None, "logging.project: W&B refuses the name (Invalid project name 'team/proj': "),
        ("a#b", None, "logging.project: W&B refuses the name (Invalid project name 'a#b': "),
        ("dgrpo", "team/proj", "WANDB_PROJECT: W&B refuses the name (Invalid project name 'team/proj': "),
    ],
)
def test_a_project_name_wandb_refuses_is_named_not_a_login(tmp_path, wandb_env, monkeypatch, project, env, said):
    """W&B's team/project written as logging.project (or WANDB_PROJECT) was 'wandb could not start a run (...); log
    in (wandb login, or set WANDB_API_KEY) or set WANDB_MODE=offline', under logging.backends, in offline mode too."""
    if env:
        monkeypatch.setenv("WANDB_PROJECT", env)
    with pytest.raises(ConfigError) as e:
        WandbTracker(tmp_path / "x", project=project)
    text = str(e.value)
    assert text.startswith(said) and "log in" not in text and "\n" not in text
    entity = "WANDB_ENTITY" if env else "logging.entity"
    assert text.endswith(f"choose another; a team or user goes in {entity}" if "/" in (env or project) else "another")


@pytest.mark.parametrize("project", ["team/proj", "a:b", "x" * 129])
def test_a_project_name_wandb_refuses_is_found_when_the_config_is_validated(tmp_path, wandb_env, run_cli, project):
    """logging.project=team/proj with wandb was refused only when the trackers opened, after the model and the data
    had loaded: now at validation, exit 2, one line, nothing written, in the words of the late check (and W&B's)."""
    from conftest import tiny_args

    out = tmp_path / "run"
    r = run_cli(
        "sft", *tiny_args(), "--out", out, "--set", "logging.backends=[wandb]", "--set", f"logging.project={project}"
    )
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and not out.exists(), r.stderr
    with pytest.raises(ConfigError) as late:
        WandbTracker(tmp_path / "x", project=project)
    assert r.stderr.strip() == f"dgrpo: error: invalid config value {late.value}"


def test_a_missing_tracking_package_is_found_before_the_run_starts(tmp_path, monkeypatch, run_cli):
    """The one-line error came after the model and data had loaded, with config.json written into OUT."""
    from conftest import tiny_args

    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed
    out = tmp_path / "run"
    r = run_cli("sft", *tiny_args(), "--out", out, "--set", "logging.backends=[jsonl,wandb]")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "pip install wandb" in r.stderr
    assert not out.exists()


@pytest.mark.slow
def test_wandb_takes_its_own_project_and_name_variables_where_the_options_are_defaults(
    tmp_path, wandb_env, monkeypatch
):
    """WANDB_PROJECT and WANDB_NAME were overridden by logging.project's default and the folder's name."""
    monkeypatch.setenv("WANDB_PROJECT", "envproj")
    monkeypatch.setenv("WANDB_NAME", "envname")
    t = WandbTracker(tmp_path / "a", project="dgrpo")
    try:
        assert (t._run.project, t._run.name) == ("envproj", "envname")
    finally:
        t.close()
    t = WandbTracker(tmp_path / "b", project="mine", run_name="given")  # (set options win)
    try:
        assert (t._run.project, t._run.name) == ("mine", "given")
    finally:
        t.close()
