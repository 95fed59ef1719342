"""The W&B tracker and the user's W&B world: rows a resumed online run's W&B history already holds (skipped, and
said), ``WANDB_RESUME`` (the user's, honoured), a sweep agent's parameters (refused unless dgrpo's config has them)
and trackers closed on every way out of a run. Against a stand-in ``wandb`` module (the offline one cannot resume
or refuse a run: it has no server)."""

import importlib.machinery
import os
import subprocess
import sys
import traceback
import types
import warnings
from pathlib import Path
from typing import Any

import pytest
from test_tracking import offline_wandb_variables, wandb_env  # noqa: F401 - (wandb_env: the offline W&B fixture)
from test_tracking_mutants import FakeRun  # (what WandbTracker reads of a wandb.init run)

from dgrpo.config import ConfigError
from dgrpo.training.tracking import WandbTracker


@pytest.fixture
def fake_wandb(monkeypatch: pytest.MonkeyPatch) -> types.SimpleNamespace:
    """A ``wandb`` module whose ``init`` returns a :class:`FakeRun` (``.runs``), its arguments in ``.kwargs``;
    ``.starting_step``: the next run's (a resumed online run's next step); ``.refuse``: an error ``init`` raises."""
    return wandb_of(monkeypatch, FakeRun)


def wandb_of(monkeypatch: pytest.MonkeyPatch, run_class: type[FakeRun]) -> types.SimpleNamespace:
    """:func:`fake_wandb`'s module, its ``init`` returning a ``run_class`` (a :class:`FakeRun` of one's own)."""
    state = types.SimpleNamespace(runs=[], kwargs=[], starting_step=0, refuse=None)

    def init(**kwargs: Any) -> FakeRun:
        state.kwargs.append(kwargs)
        if state.refuse is not None:
            raise state.refuse
        state.runs.append(run_class(kwargs["id"], state.starting_step))
        return state.runs[-1]

    module = types.ModuleType("wandb")
    module.__spec__ = importlib.machinery.ModuleSpec("wandb", None)  # (found where a run checks it is installed)
    module.init = init  # type: ignore[attr-defined]
    module.errors = types.SimpleNamespace(Error=RuntimeError)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "wandb", module)
    for key in ("WANDB_RESUME", "WANDB_RUN_ID", "WANDB_SWEEP_ID", "WANDB_SWEEP_PARAM_PATH", "WANDB_PROJECT"):
        monkeypatch.delenv(key, raising=False)
    return state


def test_rows_a_resumed_wandb_run_skips_are_said_once_with_their_count(tmp_path: Path, fake_wandb) -> None:
    """A run resumed from its step-3 checkpoint after its W&B run had reached step 6: W&B takes no row below 6, and
    the rows of steps 3-5 were skipped without a word (only ``WandbTracker.skipped`` counted them)."""
    fake_wandb.starting_step = 6
    t = WandbTracker(tmp_path)
    for s in (3, 4, 4, 5, 6, 7):
        t.log({"step": s, "loss": float(s)}, s)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t.close()
        t.close()
    said = [str(w.message) for w in caught]
    assert len(said) == 1, said
    assert f"W&B run {t.run_id} skipped 4 row(s), of steps 3-5: it takes no step below 6" in said[0]
    assert "metrics.jsonl holds every row" in said[0]
    assert [s for s, _ in fake_wandb.runs[0].logged] == [6, 7] and fake_wandb.runs[0].finished == [0]


def test_a_run_that_skipped_no_row_says_nothing(tmp_path: Path, fake_wandb) -> None:
    t = WandbTracker(tmp_path)
    for s in (0, 1, 1, 2):
        t.log({"step": s, "loss": float(s)}, s)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t.close()
    assert t.skipped == 0


# -- WANDB_RESUME --------------------------------------------------------------------------------------------------


def test_wandb_resume_set_by_the_user_is_left_to_wandb(tmp_path: Path, fake_wandb, monkeypatch) -> None:
    """dgrpo passed ``resume="allow"``, which wins over W&B's own variable: a user's ``WANDB_RESUME=must`` (log to
    the run WANDB_RUN_ID names, or fail) or ``never`` was silently dropped. Unset, dgrpo's ``allow`` stays."""
    WandbTracker(tmp_path / "a").close()
    monkeypatch.setenv("WANDB_RESUME", "must")
    WandbTracker(tmp_path / "b").close()
    assert [kw["resume"] for kw in fake_wandb.kwargs] == ["allow", None]  # (None: W&B reads WANDB_RESUME)


@pytest.mark.parametrize(
    "value, reason",
    [
        (
            "must",
            "Run (x) does not exist or has not been initialized, but your `resume` setting requires an existing run",
        ),
        ("never", "Run (x) already exists, but your `resume` setting does not allow resuming an existing run."),
    ],
)
def test_a_run_wandb_resume_forbids_is_refused_naming_the_variable(
    tmp_path: Path, fake_wandb, monkeypatch, value: str, reason: str
) -> None:
    """W&B's refusal (online) was told as a failed login ("log in (wandb login ...)")."""
    monkeypatch.setenv("WANDB_RESUME", value)
    fake_wandb.refuse = RuntimeError(reason)
    with pytest.raises(ConfigError) as e:
        WandbTracker(tmp_path)
    said = str(e.value)
    assert said.startswith(f"WANDB_RESUME={value}: W&B refuses to start the run ({reason}")
    assert "unset WANDB_RESUME" in said and "log in" not in said


@pytest.mark.slow
@pytest.mark.usefixtures("wandb_env")
def test_wandb_resume_reaches_wandb_offline(tmp_path: Path, monkeypatch) -> None:
    """The real W&B: the run's settings hold the user's ``WANDB_RESUME`` (was ``allow``, whatever it said)."""
    monkeypatch.setenv("WANDB_RESUME", "never")
    t = WandbTracker(tmp_path / "x")
    try:
        assert t._run.settings.resume == "never"
    finally:
        t.close()


@pytest.mark.parametrize("variable, value", [("WANDB_RESUME", "true"), ("WANDB_MODE", "ofline")])
def test_a_wandb_variable_wandb_cannot_read_is_one_line(tmp_path: Path, variable: str, value: str) -> None:
    """W&B's check of its settings raises pydantic's ValidationError (a ValueError, no wandb error): it came out as
    a multi-line traceback, after the model had loaded."""
    pytest.importorskip("wandb")
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from dgrpo.config import ConfigError\n"
        "from dgrpo.training.tracking import WandbTracker\n"
        "try:\n"
        "    WandbTracker(Path(sys.argv[1]))\n"
        "except ConfigError as e:\n"
        "    print('refused:', e)\n"
    )
    env = {**os.environ, **offline_wandb_variables(tmp_path / "home"), variable: value}
    env.pop("WANDB_RUN_ID", None)
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "x")], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.stdout.startswith(f"refused: {variable}='{value}': W&B refuses it (Input should be "), out
    assert len(out.stdout.strip().splitlines()) == 1


# -- trackers closed on every way out --------------------------------------------------------------------------------


def test_a_run_failing_before_its_metrics_log_opens_still_finishes_its_wandb_run(
    tmp_path: Path, fake_wandb, monkeypatch
) -> None:
    """RunDir.start opened the trackers, then cleared metrics.jsonl: that failing (a full disk) left the W&B run
    open (the metrics log, which closes them, had not taken them yet): unfinished, and not marked failed."""
    import dgrpo.training.run as run_module
    from dgrpo.training.distributed import Dist
    from dgrpo.training.run import RunDir

    from conftest import tiny_config

    def full(path: Path, keep_lines: int | None) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(run_module, "reset_metrics", full)
    cfg = tiny_config(**{"logging.backends": "[jsonl,wandb]"})
    with pytest.raises(OSError, match="No space left"):
        with RunDir(tmp_path / "run", cfg, Dist.single(), "grpo", resume="never", log=lambda line: None) as run:
            run.start(None)
    assert [r.finished for r in fake_wandb.runs] == [[1]]


def test_a_full_disk_at_the_metrics_file_still_closes_every_tracker_and_unlocks(tmp_path: Path, fake_wandb) -> None:
    """A row metrics.jsonl could not take (a full disk) fails again when the file closes: that error stopped
    RunDir.close before the trackers (the W&B run left unfinished) and before the lock's release, and it replaced
    the run's own error. Now each is closed, the lock released, and the run's error is the one raised."""
    from dgrpo.training.distributed import Dist
    from dgrpo.training.run import RunDir

    from conftest import tiny_config

    cfg = tiny_config(**{"logging.backends": "[jsonl,wandb]"})
    out = tmp_path / "run"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(OSError, match="No space left") as e:
            with RunDir(out, cfg, Dist.single(), "grpo", resume="never", log=lambda line: None) as run:
                run.start(None)
                assert run.metrics._file is not None
                run.metrics._file.close()
                run.metrics._file = open("/dev/full", "a")  # (every flush: ENOSPC)
                run.metrics.write({"step": 0, "loss": 1.0})
    assert "metrics.write" in "".join(traceback.format_tb(e.tb))  # (the run's error, not close's)
    assert [r.finished for r in fake_wandb.runs] == [[1]]
    assert run.lock is None
    said = [str(w.message) for w in caught]
    assert any(m.startswith("closing metrics.jsonl of the failed run failed too: [Errno 28]") for m in said), said
    # the lock is free: another RunDir takes OUT at once
    RunDir(out, cfg, Dist.single(), "grpo", resume="never", log=lambda line: None).close()


def test_a_tracker_failing_to_close_does_not_keep_the_others_open(tmp_path: Path) -> None:
    """Closing a successful run: TensorBoard's writer raising (its disk full) left the W&B run after it unfinished.
    Every tracker is closed, then the error raised."""
    from dgrpo.training.run import MetricsLog

    class Tracker:
        def __init__(self, name: str, fails: bool) -> None:
            self.name, self.fails = name, fails
            self.closed: list[int] = []

        def close(self, exit_code: int = 0) -> None:
            self.closed.append(exit_code)
            if self.fails:
                raise OSError(28, "No space left on device")

    log = MetricsLog(tmp_path / "metrics.jsonl", enabled=True)
    trackers = [Tracker("tensorboard", True), Tracker("wandb", False)]
    log.open(None, trackers)  # type: ignore[arg-type]
    with pytest.raises(OSError, match="No space left"):
        log.close(0)
    assert [t.closed for t in trackers] == [[0], [0]] and log.trackers == []


# -- W&B sweeps ------------------------------------------------------------------------------------------------------


def _sweep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, params: dict[str, Any]) -> None:
    """A sweep agent's run: ``WANDB_SWEEP_ID`` and the parameters file ``wandb agent`` writes for it (W&B's config
    file format, as its ``config_util.save_config_file_from_dict`` writes it)."""
    import yaml

    path = tmp_path / "sweep" / "config-abc.yaml"
    path.parent.mkdir()
    body = yaml.dump({k: {"value": v} for k, v in params.items()}, Dumper=yaml.SafeDumper, sort_keys=False)
    path.write_text("wandb_version: 1\n\n" + body)
    monkeypatch.setenv("WANDB_SWEEP_ID", "sw33p")
    monkeypatch.setenv("WANDB_SWEEP_PARAM_PATH", str(path))


def test_a_sweep_run_whose_config_lacks_the_sweeps_values_is_refused(tmp_path: Path, fake_wandb, monkeypatch) -> None:
    """Under ``wandb agent`` the parameters reach ``wandb.config`` only: a sweep command without ``--set
    ${args_no_hyphens}`` trained dgrpo's config unchanged in every run, each recorded in W&B under the sweep's
    values. Refused before the W&B run starts, in one line naming the parameter and the way to pass it."""
    from dgrpo.config import to_dict

    from conftest import tiny_config

    _sweep(tmp_path, monkeypatch, {"grpo.lr": 3e-6, "perturbation.p": 0.2})
    with pytest.raises(ConfigError) as e:
        WandbTracker(tmp_path / "run", config=to_dict(tiny_config(**{"perturbation.p": 0.2})))
    said = str(e.value)
    assert said.startswith("W&B sweep sw33p sets grpo.lr=3e-06, but this run's grpo.lr is ")
    assert said.endswith("end the sweep's command with --set ${args_no_hyphens} (README: W&B sweeps)")
    assert fake_wandb.kwargs == []


def test_a_sweep_run_given_the_sweeps_values_by_set_starts(tmp_path: Path, fake_wandb, monkeypatch) -> None:
    """``--set grpo.lr=3e-06 perturbation.p=0.2 'data.test=[...]'``, as ``${args_no_hyphens}`` writes the values,
    gives the config the sweep's: the run starts; a parameter naming no dgrpo option is a warning."""
    from dgrpo.config import to_dict

    from conftest import tiny_config

    params = {"grpo.lr": 3e-6, "perturbation.p": 0.2, "data.test": ["builtin:test?n_steps=3"], "my_note": 1}
    _sweep(tmp_path, monkeypatch, params)
    cfg = tiny_config(**{k: v for k, v in params.items() if k != "my_note"})
    with pytest.warns(UserWarning, match=r"W&B sweep parameter\(s\) my_note name no dgrpo option"):
        t = WandbTracker(tmp_path / "run", config=to_dict(cfg))
    t.close()
    assert len(fake_wandb.runs) == 1


def test_a_sweep_value_dgrpo_refuses_is_refused_as_not_passed(tmp_path: Path, fake_wandb, monkeypatch) -> None:
    from dgrpo.config import to_dict

    from conftest import tiny_config

    _sweep(tmp_path, monkeypatch, {"grpo.lr": None})
    with pytest.raises(ConfigError, match=r"sets grpo\.lr=None, which dgrpo refuses \(invalid config value grpo\.lr"):
        WandbTracker(tmp_path / "run", config=to_dict(tiny_config()))


def test_outside_a_sweep_no_parameter_file_is_read(tmp_path: Path, fake_wandb, monkeypatch) -> None:
    from dgrpo.config import to_dict

    from conftest import tiny_config

    _sweep(tmp_path, monkeypatch, {"grpo.lr": 3e-6})
    monkeypatch.delenv("WANDB_SWEEP_ID")
    WandbTracker(tmp_path / "run", config=to_dict(tiny_config())).close()
    assert len(fake_wandb.runs) == 1


def test_sweep_values_the_run_makes_absolute_are_taken_as_given(tmp_path: Path, fake_wandb, monkeypatch) -> None:
    """A run records its reward file, its data files and its --init absolute (``rew.py:reward`` ->
    ``/abs/rew.py:reward``): a sweep over them, passed by --set, was refused as not applied."""
    from dgrpo.cli.train import record_init
    from dgrpo.config import to_dict

    from conftest import tiny_config

    monkeypatch.chdir(tmp_path)
    Path("rew.py").write_text("def reward(completions, records):\n    return [0.0 for _ in completions]\n")
    Path("train.jsonl").write_text('{"question": "1+1", "steps": [], "answer": "2"}\n')
    params = {"grpo.reward": "rew.py:reward", "data.train": "train.jsonl", "grpo.rewards": [{"fn": "rew.py:reward"}]}
    _sweep(tmp_path, monkeypatch, params)
    cfg = record_init(tiny_config(**params), None, tmp_path / "run")
    assert cfg.grpo.reward == f"{tmp_path.resolve()}/rew.py:reward"  # (the recorded form differs from the sweep's)
    WandbTracker(tmp_path / "run", config=to_dict(cfg)).close()
    assert len(fake_wandb.runs) == 1


def test_a_sweep_run_without_the_sweeps_values_is_refused_before_the_model_loads(
    tmp_path: Path, fake_wandb, monkeypatch, run_cli, sft_checkpoint
) -> None:
    """The tracker's refusal came once the model had loaded (minutes for a 1.5B model, in every run of the sweep):
    ``dgrpo grpo`` makes the same check with its config, before the weights load and before anything is written."""
    from dgrpo.model import latent_lm

    from conftest import tiny_args

    loaded: list[str] = []
    load = latent_lm.load_hf_model

    def counted(*args: Any, **kwargs: Any) -> Any:
        loaded.append("load")
        return load(*args, **kwargs)

    monkeypatch.setattr(latent_lm, "load_hf_model", counted)
    _sweep(tmp_path, monkeypatch, {"grpo.lr": 3e-6})
    out = tmp_path / "run"
    r = run_cli("grpo", "--init", sft_checkpoint, *tiny_args(), "--set", "logging.backends=[wandb]", "--out", out)
    assert r.returncode == 2 and "W&B sweep sw33p sets grpo.lr=3e-06, but this run's grpo.lr is " in r.stderr
    assert loaded == [] and fake_wandb.kwargs == [] and not out.exists()
