"""Metric sinks besides ``OUT/metrics.jsonl``: TensorBoard and Weights & Biases.

``metrics.jsonl`` stays the record of a run (resuming and ``dgrpo plot`` read it); the trackers here copy each of
its rows, under the same metric names, to the other backends of ``logging.backends``. :func:`open_trackers`
opens one :class:`Tracker` per backend; the caller (rank 0 only) passes every row to each tracker's ``log`` and
calls ``close`` at the end. The optional packages are imported lazily, so importing this module needs neither.

Values: ints and floats are logged as scalars, bools as 0/1 (so that they can be charted); ``None`` is skipped
everywhere; strings go to W&B only; non-finite floats go to W&B only (TensorBoard would draw them as spikes).

Resuming a run in the same output directory, which re-logs the steps after its checkpoint:

* TensorBoard: a new event file per process; before its first row the tracker writes a session ``START``
  marker at that row's step (as ``torch.utils.tensorboard.SummaryWriter(purge_step=...)`` does), so TensorBoard's
  reader drops the older files' points at that step and later: the curves show the resumed values only.
* W&B: the run's id is created once (or taken from ``WANDB_RUN_ID`` where that is set: the W&B run it names) and
  kept in ``OUT/wandb_run_id``; a resumed process calls ``wandb.init`` with that id and ``resume="allow"`` (the
  user's ``WANDB_RESUME`` where that is set: ``must`` or ``never`` W&B enforces online), so it continues the same
  W&B run (offline, each process writes its own ``OUT/wandb/offline-run-*`` directory with that id; ``wandb sync``
  uploads them to that one run). W&B steps must not decrease: rows whose step is below the last
  logged one (or, online, below the resumed run's next step) are skipped, counted in ``WandbTracker.skipped`` and
  said in one warning (how many, which steps) when the run ends; rows at the same step are merged into one W&B
  history row (an eval row and a training row often share a step). So, unlike metrics.jsonl and TensorBoard, W&B
  keeps the values the interrupted process logged after its checkpoint (W&B history cannot be rewritten).
* W&B failing during the run (its ``wandb-core`` process killed, a socket lost: ``run.log`` raises) does not stop
  training: one warning names the step and the error, and the later rows go to metrics.jsonl (and TensorBoard) only,
  counted in ``WandbTracker.lost`` (the W&B run holds what its service had sent or written before it failed: a killed
  offline service may leave none); a ``finish`` that fails is a warning too.
* A run stopped by SIGTERM (a scheduler's stop or preemption: :mod:`.preemption`, resumable from its checkpoint) ends
  its W&B run marked preempting (``run.mark_preempting()``), with the process's exit code 143: W&B shows it preempted,
  not failed (and a sweep requeues a preempted run, W&B's docs say); a Ctrl-C's stop records 130, the process's exit
  code too. A SIGTERM while a completed run finishes its W&B run (the upload) lets it finish (one process; under
  torchrun a SIGTERM only asks there already), as it lets the run's end be written.
* A backend added when the run resumes (``logging.backends`` may change then) starts with every row the
  checkpoint kept, so its curves begin at step 0, not at the resume.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import os
import secrets
import string
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from ..config import Config, ConfigError, LoggingConfig, load_config, to_dict, wandb_name_advice
from ..run_layout import TB_DIR, WANDB_ID_FILE
from .preemption import TERMINATED_EXIT, letting_finish

#: ``logging.project``'s default: left at it, W&B's own WANDB_PROJECT names the project
DEFAULT_PROJECT: str = LoggingConfig.project

#: the backends this module opens (``jsonl`` is the caller's metrics.jsonl)
TRACKER_BACKENDS = ("tensorboard", "wandb")
_INSTALL = "pip install 'dgrpo[tracking]'"


class Tracker(Protocol):
    """A metric sink: gets every metrics row, with its step; closed once at the end of the run."""

    #: the backend, as named in ``logging.backends``
    name: str
    #: where the metrics go, in a few words (for the run's first log line)
    where: str

    def resumed(self, kept_rows: list[dict[str, Any]]) -> None:
        """A resumed run keeps these rows of metrics.jsonl (its checkpoint's), before any :meth:`log`."""
        ...

    def log(self, row: dict[str, Any], step: int) -> None:
        """Log one metrics row (the ``"step"`` key, if present, is not logged as a metric)."""
        ...

    def close(self, exit_code: int = 0) -> None:
        """Flush and release the sink; ``exit_code`` != 0 marks a failed run where the backend records it."""
        ...


def _require(backend: str, module: str, package: str) -> Any:
    """Import ``module`` for ``backend``, or raise a one-line :class:`ConfigError` saying what to install."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ConfigError(
            f"logging.backends: {backend} needs the {package} package, which could not be imported ({e}); "
            f"install it: {_INSTALL} (or pip install {package})"
        ) from e


#: the module each backend imports first (found, not imported, by :func:`check_installed`)
_BACKEND_MODULES = {"tensorboard": "tensorboard", "wandb": "wandb"}


def check_installed(backends: list[str]) -> None:
    """The one-line error of a missing tracking package at a command's start, before any model or data is loaded
    (opening the trackers finds it too, but after that work, with config.json written)."""
    for backend in backends:
        module = _BACKEND_MODULES.get(backend)
        if module is None:
            continue
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError, AttributeError):  # (a module entry set to None: found as missing)
            found = False
        if not found:
            _require(backend, module, module)


def _number(v: Any) -> float | int | None:
    """``v`` as a number for a scalar chart (bools as 0/1), or None for anything else."""
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, (int, float)):
        return v
    return None


def _one_line(e: BaseException) -> str:
    """An exception as one short line: its type and the first line of its message."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:300]}" if text else type(e).__name__


def _shown(path: Path, base: Path) -> str:
    """``path`` under ``base`` as ``base/...`` (``base`` as the caller spelled it); otherwise ``path`` itself."""
    try:
        return str(base / Path(path).resolve().relative_to(base.resolve()))
    except ValueError:
        return str(path)


class TensorBoardTracker:
    """Scalars in a TensorBoard event file under ``log_dir`` (``OUT/tb``).

    Every int, float or bool (as 0/1) value except ``"step"`` is written as a scalar at ``step``; ``None``, strings
    and non-finite floats are skipped, and so is a tag already written at that step by an earlier row (an SFT stage's
    end row repeats its last step's ``stage``, ``n_latent`` and ``time_s``: two points at one step). TensorBoard
    names a run by its directory (``tensorboard --logdir runs`` shows ``x/tb``), so ``run_name`` is only kept as an
    attribute. Events are flushed after every row."""

    name = "tensorboard"

    def __init__(self, log_dir: Path, run_name: str = "") -> None:
        writer_mod = _require("tensorboard", "tensorboard.summary.writer.event_file_writer", "tensorboard")
        self._event_pb2 = _require("tensorboard", "tensorboard.compat.proto.event_pb2", "tensorboard")
        self._summary_pb2 = _require("tensorboard", "tensorboard.compat.proto.summary_pb2", "tensorboard")
        self.log_dir, self.run_name = Path(log_dir), run_name
        #: no event file of this run yet (a run that adds TensorBoard when it resumes): it gets every kept row
        self.fresh = not self.log_dir.is_dir()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._writer: Any = writer_mod.EventFileWriter(str(self.log_dir))
        self._started = False
        self._kept: list[dict[str, Any]] = []
        self._written_at: tuple[int, set[str]] = (-1, set())  # the last step written, and its tags
        self.where = str(self.log_dir)

    def resumed(self, kept_rows: list[dict[str, Any]]) -> None:
        """A resumed run keeps these rows (its checkpoint's): those at the step where this process starts logging
        are written again after the purge marker, which drops every older point at that step (an evaluation
        logged just before the checkpoint shares its step with the next training row); all of them when this
        tracker is :attr:`fresh` (TensorBoard added on resume), written now: no older event file to purge, and a
        process stopped before its first row (the next one finds ``tb/``, no longer fresh) lost them."""
        self._kept = list(kept_rows)
        if self.fresh and self._kept and not self._started:
            self._started = True  # (no purge marker: nothing older)
            for kept in self._kept:
                self.log(kept, kept["step"])

    def log(self, row: dict[str, Any], step: int) -> None:
        """Write the row's finite numbers as scalars at ``step``; the first row also purges older points."""
        if self._writer is None:
            raise RuntimeError("TensorBoardTracker.log after close()")
        if not self._started:
            # a resumed run: points a previous process wrote at this step or later are superseded
            ev = self._event_pb2
            status = ev.SessionLog(status=ev.SessionLog.START)
            self._writer.add_event(ev.Event(wall_time=time.time(), step=step, session_log=status))
            self._started = True
            for kept in self._kept:
                if kept.get("step", -1) >= step:  # (a fresh tracker wrote them all in resumed())
                    self.log(kept, kept["step"])
        ev, sm = self._event_pb2, self._summary_pb2
        now = time.time()
        if self._written_at[0] != step:
            self._written_at = (step, set())
        written, values = self._written_at[1], []
        for k, v in row.items():
            x = _number(v)
            if k != "step" and k not in written and x is not None and math.isfinite(x):
                values.append(sm.Summary.Value(tag=k, simple_value=float(x)))
                written.add(k)
        if values:
            self._writer.add_event(ev.Event(wall_time=now, step=step, summary=sm.Summary(value=values)))
        self._writer.flush()

    def close(self, exit_code: int = 0) -> None:
        """Flush and close the event file (idempotent)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def _new_run_id() -> str:
    """A W&B-style run id: 8 random lowercase letters and digits."""
    alphabet = string.ascii_lowercase + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(8))


def _stored_run_id(run_dir: Path) -> str:
    """The W&B run id ``run_dir/wandb_run_id`` holds ('' when none)."""
    path = Path(run_dir) / WANDB_ID_FILE
    return path.read_text().strip() if path.is_file() else ""


def wandb_run_id(run_dir: Path, resume: bool = True, given: str | None = None, store: bool = True) -> str:
    """The W&B run id of ``run_dir``: ``given`` when set (``WANDB_RUN_ID``: a W&B run the user, or a sweep agent,
    names); else the one stored in ``run_dir/wandb_run_id`` when ``resume`` and present; otherwise a new one. With
    ``store``, the id returned is stored there (overwriting any old one), so that a resume continues that W&B run."""
    stored = _stored_run_id(run_dir) if resume else ""
    run_id = given or stored or _new_run_id()
    if store and (run_id != stored or not resume):
        (Path(run_dir) / WANDB_ID_FILE).write_text(run_id + "\n")
    return run_id


def _sweep_parameters() -> dict[str, Any]:
    """The parameters a W&B sweep agent chose for this run (``WANDB_SWEEP_PARAM_PATH``: ``{name: {value: v}}``, the
    file ``wandb agent`` writes for each run; {} outside a sweep or when it cannot be read)."""
    path = os.environ.get("WANDB_SWEEP_PARAM_PATH", "")
    if not os.environ.get("WANDB_SWEEP_ID") or not path:
        return {}
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(k): v["value"] for k, v in data.items() if isinstance(v, dict) and "value" in v}


def _at(config: dict, dotted: str) -> Any:
    """The value of the option ``dotted`` (``grpo.lr``) in a nested config dict."""
    for part in dotted.split("."):
        config = config[part]
    return config


def _holds(recorded: Any, swept: Any) -> bool:
    """Whether a run's recorded option value can be the sweep's: equal, or a text the run made absolute (a path,
    ``file.py:function``, a data spec's local part, a checkpoint: the recorded form of ``runs/sft``, ``my.py:f``) where
    the sweep gave another text; a mapping holds each key the sweep gives (a reward part's name is added)."""
    if recorded == swept:
        return True
    if isinstance(recorded, str) and isinstance(swept, str):
        return any(os.path.isabs(part) for part in recorded.split("+"))
    if isinstance(recorded, dict) and isinstance(swept, dict):
        return all(k in recorded and _holds(recorded[k], v) for k, v in swept.items())
    if isinstance(recorded, list) and isinstance(swept, list):
        return len(recorded) == len(swept) and all(_holds(r, v) for r, v in zip(recorded, swept))
    return False


def check_sweep_parameters(config: dict, warn: bool = True) -> None:
    """Under a W&B sweep agent (``WANDB_SWEEP_ID``), each sweep parameter that names a dgrpo option must hold the
    sweep's value in ``config`` (the run's, as resolved): dgrpo takes options from ``--config`` and ``--set`` only,
    not from ``wandb.config``, so a sweep whose command does not pass its parameters (``--set
    ${args_no_hyphens}``) trained the same config in every run, each recorded in W&B under the sweep's values.
    Such a run is refused in one line; a parameter that names no dgrpo option is a warning (dgrpo does not use it).
    The value is read as ``--set NAME=VALUE`` reads what ``${args_no_hyphens}`` writes; a text option the run made
    absolute (a path, a reward's file) is taken as holding it (:func:`_holds`). ``warn=False``: the refusal alone
    (``dgrpo sft/grpo`` check before the model loads; the tracker's own check warns)."""
    params = _sweep_parameters()
    if not params:
        return
    try:
        base = to_dict(load_config(Config, start=config, validate=False))
    except (ConfigError, TypeError, ValueError):  # (not a dgrpo config: nothing to compare with)
        return
    unknown = []
    for name, value in params.items():
        try:
            swept = to_dict(load_config(Config, start=config, overrides=[f"{name}={value}"], validate=False))
        except ConfigError as e:
            if "unknown config key" in str(e):
                unknown.append(name)
                continue
            held, got = False, f"which dgrpo refuses ({e})"
        else:
            held, got = _holds(_at(base, name), _at(swept, name)), f"but this run's {name} is {_at(base, name)!r}"
        if not held:
            raise ConfigError(
                f"W&B sweep {os.environ['WANDB_SWEEP_ID']} sets {name}={value}, {got}: dgrpo does not read "
                "wandb.config; end the sweep's command with --set ${args_no_hyphens} (README: W&B sweeps)"
            )
    if unknown and warn:
        warnings.warn(
            f"W&B sweep parameter(s) {', '.join(unknown)} name no dgrpo option: dgrpo does not use them (name a "
            "parameter by its dgrpo key, grpo.lr, and end the sweep's command with --set ${args_no_hyphens})",
            stacklevel=2,
        )


def _settings_refused(e: ValueError) -> ConfigError | None:
    """The one line of a W&B setting ``wandb.init`` cannot read (pydantic's ValidationError: ``WANDB_MODE=ofline``,
    ``WANDB_RESUME=true``), naming the variable it came from; None for another ValueError."""
    errors = getattr(e, "errors", None)
    try:
        first: dict[str, Any] = dict(errors()[0]) if callable(errors) else {}
        field = str(first["loc"][0]) if first else ""
    except (LookupError, TypeError, ValueError):
        return None
    if not field:
        return None
    var = f"WANDB_{field.upper()}"
    source = f"{var}={os.environ[var]!r}" if var in os.environ else f"W&B's setting {field}={first.get('input')!r}"
    return ConfigError(f"{source}: W&B refuses it ({' '.join(str(first.get('msg', '')).split())})")


def _start_refused(e: Exception, project: str, env_project: str | None) -> ConfigError:
    """The one line of a ``wandb.init`` that failed: a project name W&B refuses (``team/project``: its characters,
    not a login, are wrong, online or offline) names the option or variable it came from; a run ``WANDB_RESUME``
    forbids (``must``: none yet; ``never``: one already) names it; else how to log in."""
    reason = " ".join(str(e).split())
    resume = os.environ.get("WANDB_RESUME")
    if resume and "`resume`" in reason:
        return ConfigError(
            f"WANDB_RESUME={resume}: W&B refuses to start the run ({reason}); unset WANDB_RESUME to let dgrpo "
            "continue its run's W&B run, or start it when there is none"
        )
    if "Invalid project name" not in reason:
        return ConfigError(
            f"logging.backends: wandb could not start a run ({reason}); "
            "log in (wandb login, or set WANDB_API_KEY) or set WANDB_MODE=offline"
        )
    if project == DEFAULT_PROJECT and env_project:  # (WANDB_PROJECT names it where the option is left at its default)
        source, name, entity = "WANDB_PROJECT", env_project, "WANDB_ENTITY"
    else:
        source, name, entity = "logging.project", project, "logging.entity"
    return ConfigError(f"{source}: {wandb_name_advice(reason, name, entity)}")


class WandbTracker:
    """A Weights & Biases run, under ``run_dir/wandb``; ``WANDB_MODE`` (e.g. ``offline``) is honoured, and so are
    ``WANDB_PROJECT``, ``WANDB_ENTITY`` and ``WANDB_NAME`` where ``logging.*`` is left at its default, and
    ``WANDB_RUN_ID`` (the W&B run to log to, a sweep agent's included; not ``WANDB_DIR``: the run's W&B files stay in
    its output directory).

    The run id is kept in ``run_dir/wandb_run_id`` (:func:`wandb_run_id`) and the run started with
    ``resume="allow"``: a resumed ``dgrpo`` run continues the same W&B run (``resume=False``: a new id, a new run);
    ``WANDB_RESUME``, where set, is W&B's instead (``must``: refused online when the W&B run does not exist yet,
    ``never``: when it does; one line naming the variable). Under a W&B sweep agent, a run whose ``config`` lacks a
    sweep parameter's value is refused before ``wandb.init`` (:func:`check_sweep_parameters`).
    Rows are logged with ``run.log(values, step=step)`` under their metrics.jsonl names; ``None`` values are
    dropped, bools become 0/1, strings and non-finite floats are kept. A row whose step is below the last logged
    step (or below the resumed online run's next step) would be dropped by W&B with a warning: it is skipped here,
    counted in :attr:`skipped`, and the count said in one warning at :meth:`close`. Rows at the same step are
    merged into one history row. W&B raising while it logs or finishes (its service process gone) is a warning, not
    the end of the training run: the rows from then on are counted in :attr:`lost` (metrics.jsonl has them all)."""

    name = "wandb"

    def __init__(
        self,
        run_dir: Path,
        *,
        project: str = DEFAULT_PROJECT,
        entity: str = "",
        run_name: str = "",
        config: dict | None = None,
        resume: bool = True,
    ) -> None:
        wandb = _require("wandb", "wandb", "wandb")
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        stored = _stored_run_id(self.run_dir) if resume else ""
        self.run_id = wandb_run_id(self.run_dir, resume, given=os.environ.get("WANDB_RUN_ID") or None, store=False)
        #: another W&B run than the one this run logged to (W&B added on resume, or WANDB_RUN_ID naming another):
        #: a resumed run gives it every kept row first
        self.fresh = self.run_id != stored
        if config is not None:
            check_sweep_parameters(config)
        self._run: Any = self._start(wandb, project, entity, run_name, config)
        #: WANDB_MODE=disabled: a run that records nothing (older wandb gives it an id of its own)
        self.disabled = bool(getattr(self._run, "disabled", False))
        if self._run is None or (self._run.id != self.run_id and not self.disabled):
            raise RuntimeError(
                f"wandb.init returned another active W&B run ({getattr(self._run, 'id', None)}), not {self.run_id}: "
                "finish it (run.finish()) before training"
            )
        if self.fresh:  # (stored once W&B took it: a resume continues this W&B run)
            wandb_run_id(self.run_dir, resume=False, given=self.run_id)
        #: the smallest step W&B still accepts (a resumed online run continues after its last logged step)
        self._floor = int(getattr(self._run, "starting_step", 0) or 0)
        #: rows skipped because their step was below the last one logged (said in one warning at :meth:`close`)
        self.skipped = 0
        #: the lowest and highest step skipped, and the step W&B was at when the first was ((-1, -1, -1): none)
        self._skipped_steps = (-1, -1, -1)
        #: why W&B stopped taking rows (``run.log`` raised), with the step; None while it takes them
        self.failed: str | None = None
        #: rows not logged because W&B had failed (the one it failed on included)
        self.lost = 0
        self.offline = bool(getattr(self._run, "offline", False))
        if self.disabled:
            self.where = "W&B disabled (WANDB_MODE=disabled): nothing is recorded there"
        elif self.offline:
            self.where = f"W&B offline run in {_shown(Path(self._run.dir).parent, self.run_dir)}"
        else:
            where = (
                f"W&B project {'/'.join(p for p in (self._run.entity, self._run.project) if p)}, run {self._run.name}"
            )
            url = getattr(self._run, "url", None)
            self.where = where + (f" ({url})" if url else "")

    def _start(self, wandb: Any, project: str, entity: str, run_name: str, config: dict | None) -> Any:
        """``wandb.init`` of the run :attr:`run_id` names, under ``run_dir`` (W&B's own variables honoured where the
        options are left at their defaults); its refusal as one line."""
        env = os.environ.get  # (W&B's own variables, where the options are left at their defaults)
        try:
            return wandb.init(
                dir=str(self.run_dir),  # (OUT/wandb, whatever WANDB_DIR says: the run folder holds its run)
                project=None if project == DEFAULT_PROJECT and env("WANDB_PROJECT") else project,
                entity=entity or None,
                name=run_name or (None if env("WANDB_NAME") else self.run_dir.resolve().name),
                config=config,
                id=self.run_id,
                resume=None if env("WANDB_RESUME") else "allow",  # (None: W&B takes the user's WANDB_RESUME)
            )
        except wandb.errors.Error as e:
            if "Run ID" in str(e):  # (W&B's own check of an id's characters)
                source = "WANDB_RUN_ID" if env("WANDB_RUN_ID") else str(self.run_dir / WANDB_ID_FILE)
                raise ConfigError(
                    f"{source}: W&B refuses the run id {self.run_id!r} ({' '.join(str(e).split())})"
                ) from e
            raise _start_refused(e, project, env("WANDB_PROJECT")) from e
        except ValueError as e:  # (not a wandb.errors.Error: pydantic's check of W&B's settings)
            refused = _settings_refused(e)
            if refused is None:
                raise
            raise refused from e

    def resumed(self, kept_rows: list[dict[str, Any]]) -> None:
        """A resumed run keeps these rows: a :attr:`fresh` W&B run (W&B added on resume) gets them now; a continued
        one has them already (W&B history is not rewritten)."""
        if self.fresh:
            for row in kept_rows:
                self.log(row, row["step"])

    def log(self, row: dict[str, Any], step: int) -> None:
        """Log the row at ``step`` (skipped, and counted, when ``step`` is below the last logged step)."""
        if self._run is None:
            raise RuntimeError("WandbTracker.log after close()")
        if self.failed is not None:
            self.lost += 1
            return
        if step < self._floor:
            low, high, at = self._skipped_steps if self.skipped else (step, step, self._floor)
            self._skipped_steps = (min(low, step), max(high, step), at)
            self.skipped += 1
            return
        values = {}
        for k, v in row.items():
            if k == "step" or v is None:
                continue
            values[k] = int(v) if isinstance(v, bool) else v
        if values:
            try:
                self._run.log(values, step=step)
            except Exception as e:  # noqa: BLE001 - a copy of metrics.jsonl: training goes on without it
                self.failed, self.lost = f"at step {step} ({_one_line(e)})", 1
                warnings.warn(
                    f"W&B stopped taking rows {self.failed}: training goes on without it; metrics.jsonl keeps "
                    "every row",
                    stacklevel=2,
                )
                return
        self._floor = step

    def close(self, exit_code: int = 0) -> None:
        """Finish the W&B run (``exit_code`` != 0 marks it failed; 143, a SIGTERM's stop as
        :func:`~.preemption.exit_code_of` gives it, marks it preempting first), after one warning when rows were
        skipped; idempotent. A completed run's finish (``exit_code`` 0: W&B's upload) is let finish by a SIGTERM
        (:func:`~.preemption.letting_finish`)."""
        if self._run is not None:
            run, self._run = self._run, None
            preempted = exit_code == TERMINATED_EXIT  # (a SIGTERM's stop: RunDir closes with 143)
            if self.skipped:
                low, high, at = self._skipped_steps
                steps = f"step {low}" if low == high else f"steps {low}-{high}"
                warnings.warn(
                    f"W&B run {self.run_id} skipped {self.skipped} row(s), of {steps}: it takes no step below {at}, "
                    "where its history already was (a resume re-logs the steps after its checkpoint, and W&B history "
                    "cannot be rewritten: it keeps the earlier process's values there); metrics.jsonl holds every row",
                    stacklevel=2,
                )
            try:
                if preempted and self.failed is None:
                    run.mark_preempting()  # (W&B: preempted, not failed; a sweep agent requeues the run)
                if exit_code:  # (a stop or a failure under way: a SIGTERM now stops it at once)
                    run.finish(exit_code=exit_code)
                else:  # (a completed run: a SIGTERM during the upload lets it end)
                    with letting_finish("finishing its W&B run"):
                        run.finish(exit_code=0)
            except Exception as e:  # noqa: BLE001 - the run's own results are written: a warning, not a failure
                if self.failed is None:  # (failed earlier: already said, and finishing could not work)
                    warnings.warn(
                        f"W&B could not finish its run ({_one_line(e)}): metrics.jsonl holds every row", stacklevel=2
                    )
                self._teardown()

    @staticmethod
    def _teardown() -> None:
        """Release W&B's connection to its service once finishing failed (the service is gone): otherwise its exit
        hook fails the same way as the process ends, in a traceback after the warning."""
        try:
            importlib.import_module("wandb").teardown()
        except Exception:  # noqa: BLE001 - the service is gone: nothing left to release
            pass


def open_trackers(
    backends: Sequence[str],
    run_dir: Path,
    *,
    config: dict,
    project: str = DEFAULT_PROJECT,
    entity: str = "",
    run_name: str = "",
    resume: bool = True,
) -> list[Tracker]:
    """One tracker per backend of ``backends`` besides ``jsonl`` (the caller's), in order, duplicates once:
    ``tensorboard`` writes ``run_dir/tb``, ``wandb`` a W&B run (``config`` recorded as its config).
    ``run_name`` '' means ``run_dir``'s name. ``resume``: continue the W&B run whose id ``run_dir`` stores (pass
    False when the run starts afresh). Raises :class:`ConfigError` for an unknown backend or a missing package;
    a tracker already opened is closed first."""
    known = ("jsonl", *TRACKER_BACKENDS)
    wanted = list(dict.fromkeys(b for b in backends if b != "jsonl"))
    bad = [b for b in wanted if b not in known]
    if bad:
        raise ConfigError(
            f"logging.backends: unknown backend(s) {', '.join(map(str, bad))}; expected any of {', '.join(known)}"
        )
    run_dir = Path(run_dir)
    name = run_name or run_dir.name
    trackers: list[Tracker] = []
    try:
        for b in wanted:
            if b == "tensorboard":
                trackers.append(TensorBoardTracker(run_dir / TB_DIR, name))
            else:
                trackers.append(  # (its run_name as given: '' lets WANDB_NAME name it)
                    WandbTracker(
                        run_dir, project=project, entity=entity, run_name=run_name, config=config, resume=resume
                    )
                )
    except BaseException:
        for t in trackers:
            t.close(exit_code=1)
        raise
    return trackers


def describe_backends(backends: Sequence[str], trackers: Sequence[Tracker], metrics_path: Path | str) -> str:
    """The run's first log line about its metrics, e.g.
    ``dgrpo: metrics -> runs/x/metrics.jsonl, tensorboard (runs/x/tb), wandb (W&B offline run in runs/x/wandb/...)``;
    a backend of ``backends`` without a tracker is shown as ``(not open)``."""
    parts = [str(metrics_path)]
    by_name = {t.name: t for t in trackers}
    for b in dict.fromkeys([*(b for b in backends if b != "jsonl"), *by_name]):
        t = by_name.get(b)
        parts.append(f"{b} ({t.where if t is not None else 'not open'})")
    return "dgrpo: metrics -> " + ", ".join(parts)
