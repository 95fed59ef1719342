"""One training run's directory, shared by SFT and GRPO: :class:`RunDir` (an exclusive lock, ``config.json`` and its
history, start-or-resume with fallback, the end of a run: its final evaluation, ``applied.json``, the rollout rows)
and the metrics log. Beside it: where a run may write (:mod:`.out_dir`), a trainer's inputs checked
(:mod:`.run_inputs`), whether a run may be resumed under a config (:mod:`.resume_check`), the guards that stop a run
that stopped learning (:mod:`.guards`) and evaluation sharded over processes (:mod:`.sharded_eval`).

Every rank builds the same objects; the ones that write (``config.json``, ``metrics.jsonl``, trackers) are no-ops
off rank 0, so a trainer's loop calls them unconditionally.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import sys
import warnings
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import IO, Any, NoReturn

from ..config import Config, ConfigError, to_dict
from ..model.latent_lm import LatentLM
from ..model.verified import (
    MANIFEST,
    SHARDED_DIR,
    CheckpointError,
    manifest_bytes,
    remove_dir,
    write_text_atomically,
)
from ..progress import say
from ..run_layout import (
    APPLIED_FILE,
    BEST_DIR,
    CHECKPOINTS_DIR,
    CONFIG_FILE,
    FINAL_DIR,
    LOCK_FILE,
    METRICS_FILE,
    ROLLOUTS_FILE,
    STEP_DIR,
    SUMMARY_FILE,
    config_history,
    config_history_file,
    stage_dirs,
)
from ..text import first_items
from .applied import record_applied, warn_if_plugins_changed
from .checkpoint import (
    LoadedCheckpoint,
    count_lines,
    list_checkpoints,
    repoint_run_adapters,
    reset_metrics,
    write_failed,
)
from .consolidate import ADDED_BY_CONSOLIDATION, CONSOLIDATED
from .distributed import Dist
from .guards import TrainingStopped
from .out_dir import (
    RunLock,
    adopt_run_dir,
    check_config_writes,
    check_output_dir,
    release_leaving_nothing,
    topmost_missing,
)
from .preemption import exit_code_of, in_test_sets, stop, stop_if_requested, stopping, writing_the_end
from .resume_check import NEW_OUT, START_OVER, ResumeCheck, quiet_log, recorded_changes
from .tracking import Tracker, describe_backends, open_trackers
from .wording import in_command_line

#: ``final_eval(lm, best)`` of :func:`~dgrpo.training.grpo.train_grpo` / :func:`~dgrpo.training.sft.train_sft`: run
#: on the trained model (every rank) before ``final/`` is written (:meth:`RunDir.final_eval`), with the step (GRPO)
#: or epoch (SFT) that ``best/`` holds (None: none kept; rank 0's counts); returns metrics for the run's last row
#: (rank 0's count)
FinalEval = Callable[[LatentLM, "int | None"], dict[str, float]]
#: what :func:`~dgrpo.model.verified.atomic_dir` leaves in OUT when a run is killed during a final/, best/ or stage-K/
#: write: its temporary ``.tmp-NAME-PID`` and the ``.old-NAME-PID`` a replace moves aside (in OUT/checkpoints too, for
#: a step-N replaced: a rewound run's, or one whose LoRA base moved, :func:`~.checkpoint.repoint_run_adapters`)
LEFTOVER = re.compile(rf"\.(tmp|old)-({FINAL_DIR}|{BEST_DIR}|stage-\d+|step-\d+)-\d+")


#: a model folder's Hugging Face config (beside its weights; not the run's config.json)
MODEL_CONFIG = "config.json"


def _best_records(manifest: bytes, config: bytes | None = None) -> tuple[str, ...]:
    """The digest a checkpoint records of a ``best/`` manifest: a sharded one's without what consolidation writes
    (so ``dgrpo consolidate OUT/best``, which the run's end advises, leaves it the ``best/`` its checkpoints
    recorded), any other manifest's whole; then the others that name the same ``best/``: the whole manifest's,
    which a checkpoint recorded before, and a consolidated one's without the files consolidation added (the whole
    manifest before it, which an earlier dgrpo's checkpoint recorded), its model config as consolidation found it
    or, given ``config`` (best/'s config.json, as the manifest lists it), as an earlier dgrpo's sharded save wrote
    it: without the ``architectures`` and ``dtype`` that consolidation added (:func:`_earlier_config`)."""
    whole = hashlib.sha256(manifest).hexdigest()
    try:
        entries = json.loads(manifest)
    except ValueError:
        return (whole,)
    if not isinstance(entries, dict) or f"{SHARDED_DIR}/.metadata" not in entries:
        return (whole,)
    kept = {k: v for k, v in entries.items() if not CONSOLIDATED.fullmatch(k)}
    before = {k: v for k, v in entries.items() if not ADDED_BY_CONSOLIDATION.fullmatch(k)}
    records = (_digest(kept), whole, _digest(before))
    consolidated = len(before) < len(entries)
    if not consolidated or config is None or entries.get(MODEL_CONFIG) != hashlib.sha256(config).hexdigest():
        return records
    earlier = _earlier_config(config)
    if earlier is None:
        return records
    return (*records, _digest(before | {MODEL_CONFIG: hashlib.sha256(earlier).hexdigest()}))


def _earlier_config(config: bytes) -> bytes | None:
    """A consolidated model's ``config.json`` (``config``) as an earlier dgrpo's sharded save of a new model wrote it:
    without ``architectures`` and ``dtype``, which consolidation adds, in Hugging Face's layout (sorted keys, indent
    2); None when it holds neither, or is no JSON object."""
    try:
        fields = json.loads(config)
    except ValueError:
        return None
    if not isinstance(fields, dict) or not {"architectures", "dtype"} <= fields.keys():
        return None
    rest = {k: v for k, v in fields.items() if k not in ("architectures", "dtype")}
    return (json.dumps(rest, indent=2, sort_keys=True) + "\n").encode()


def _digest(entries: dict) -> str:
    """The sha256 of a manifest holding ``entries``."""
    return hashlib.sha256(manifest_bytes(entries)).hexdigest()


def rollout_rows_before(rows: list[str], step: int, path: Path) -> list[str]:
    """The lines of ``rollouts.jsonl`` (``path``) of the steps before ``step``, which a resumed run keeps. A last line
    that is no JSON was being written when the run was killed (its step is the one under way: dropped); another
    is a ConfigError naming it."""
    kept = []
    for n, row in enumerate(rows, 1):
        if not row.strip():
            continue
        try:
            at = json.loads(row)["step"]
        except (ValueError, TypeError, KeyError):
            if n == len(rows):
                break
            raise ConfigError(
                f"{path} line {n} is not a rollout row (JSON with a 'step'): mend or delete the file to resume"
            ) from None
        if at < step:
            kept.append(row)
    return kept


def _read_json(path: Path) -> object:
    """The JSON ``path`` holds, None when it cannot be read or parsed."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _write_whole(path: Path, text: str) -> None:
    """Write one of the run's files whole or not at all (``config.json`` written in place on a full disk was left cut,
    and the same command, which the error's line said resumes, was refused: not a dgrpo run's config); a failed write
    is one line naming the space left, and, when the disk was not full (another user's file in a folder with the
    sticky bit, which only its owner may replace), not saying to wait for space."""
    try:
        write_text_atomically(path, text)
    except OSError as e:
        when = "there is space" if e.errno in (errno.ENOSPC, errno.EDQUOT) else f"{path.name} can be replaced there"
        after = f"{path} is as it was: once {when}, run the same command again"
        raise write_failed(path.name, path.parent, e, after) from None


class MetricsLog:
    """``metrics.jsonl`` (one JSON row per write, flushed) and the run's other trackers (TensorBoard, W&B), written
    by rank 0 only: every method is a no-op on other ranks."""

    def __init__(self, path: Path, enabled: bool):
        self.path, self.enabled = path, enabled
        self._file: IO[str] | None = None
        self.trackers: list[Tracker] = []

    def open(self, keep_lines: int | None, trackers: list[Tracker]) -> None:
        """Resuming: keep the first ``keep_lines`` rows (those of the checkpoint); fresh (None): start empty."""
        if not self.enabled:
            return
        reset_metrics(self.path, keep_lines)
        if keep_lines and self.path.is_file():  # (a fork of another run's checkpoint starts without its rows)
            kept = self.rows()
            for t in trackers:
                t.resumed(kept)
        self._file = open(self.path, "a")
        self.trackers = trackers

    def write(self, row: dict[str, Any]) -> None:
        if self._file is None:
            return
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        for t in self.trackers:
            t.log(row, row["step"])

    def rows(self) -> list[dict]:
        """The rows written so far, a resumed run's earlier ones included ([] on other ranks than 0)."""
        if not (self.enabled and self.path.is_file()):
            return []
        if self._file is not None:
            self._file.flush()
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]

    def n_rows(self) -> int:
        """Rows written so far (stored in checkpoints, so a resumed run drops the rows after them)."""
        return count_lines(self.path) if self.enabled else 0

    def close(self, exit_code: int = 0) -> None:
        """Close the file and every tracker, each even when closing another raised (a full disk: the file's buffered
        row fails again, and the W&B run was left unfinished): the first error is raised after them all, or, closing
        a failed run (``exit_code`` != 0, its own error on its way), said in a warning instead of hiding that one."""
        file, self._file = self._file, None
        trackers, self.trackers = self.trackers, []
        closes = [(self.path.name, file.close)] if file is not None else []
        closes += [(getattr(t, "name", "a tracker"), partial(t.close, exit_code)) for t in trackers]
        failed: tuple[str, Exception] | None = None
        for what, close in closes:
            try:
                close()
            except Exception as e:  # noqa: BLE001 - raised (or said) once the others are closed
                failed = failed or (what, e)
        if failed is not None and not exit_code:
            raise failed[1]
        if failed is not None:
            warnings.warn(f"closing {failed[0]} of the failed run failed too: {failed[1]}", stacklevel=2)


class RunDir(ResumeCheck):
    """A run's output directory: locked for this run, ``config.json`` (with its history when a resumed run was
    allowed to change it), the metrics log, and the checkpoint to resume from.

    ``resume``: ``auto`` (the newest intact checkpoint in ``OUT/checkpoints``, falling back to older ones on any
    problem; a fresh start when there is none), ``never`` (start over: what an earlier run wrote is deleted) or the path
    of one checkpoint directory to resume from. Resuming with a config that differs from the one the run was
    started with (``config.json``, or the named checkpoint's for a new directory) is refused (one line listing the
    keys) unless ``allow_config_change``; so is resuming another command's checkpoints (``command``: sft, grpo)."""

    def __init__(
        self,
        out_dir: Path,
        cfg: Config,
        dist: Dist,
        command: str,
        *,
        resume: bool | str = "auto",
        allow_config_change: bool = False,
        log: Callable[[str], None] = say,
    ):
        quiet = log if dist.is_main else quiet_log
        super().__init__(out_dir, to_dict(cfg), command, resume, allow_config_change, quiet, in_command_line())
        self.dist, self.logging = dist, cfg.logging
        # the topmost folder this run makes for OUT (OUT, or one above it): removed if refused, while still empty
        self.made = topmost_missing(self.out_dir) if dist.is_main else None
        self.lock = self._lock()
        self.metrics = MetricsLog(self.out_dir / METRICS_FILE, dist.is_main)
        self.checkpoint: Path | None = None
        self.base_now: str | None = None  # a resumed LoRA run's local base, where it is now (:meth:`_adopt_base`)
        self.resumed_step: int | None = None  # the step this process resumed at (None: started fresh)
        self.applied_step = 0  # the step of this process's entry of applied.json (:meth:`start`)
        self.restarted = False  # an unfinished run without checkpoints, started over under another config
        try:
            self.candidates = self._candidates()
            if self.explicit:
                self._on_rank0(self._check_fork)
            if self.resume_mode == "never":
                self._on_rank0(self._check_start_over)
            if self.candidates:
                self._on_rank0(self._check_command)
                self._on_rank0(self._check_config)
            elif self.resume_mode == "auto":
                self._on_rank0(self._check_not_finished)
                self._on_rank0(self._warn_if_restarted_under_another_config)
        except BaseException:
            self.close(1)  # a refused run releases the directory at once
            raise
        if dist.is_main:  # half-written checkpoints of a killed run (it held the lock: nobody else writes them)
            for tmp in (self.out_dir / CHECKPOINTS_DIR).glob(".tmp-*"):
                shutil.rmtree(tmp, ignore_errors=True)
            self._clean_leftovers(restore=self.resume_mode != "never" and not self.restarted)  # (else removed next)
        if (self.resume_mode == "never" or self.restarted) and dist.is_main:
            self._start_over()

    def _clean_leftovers(self, restore: bool, checkpoints_only: bool = False) -> None:
        """What a killed run's atomic writes (:func:`~dgrpo.model.verified.atomic_dir`) of final/, best/ or stage-K/
        left in OUT, and of a checkpoint replaced in OUT/checkpoints (the lock is held: nobody else writes them):
        ``.tmp-NAME-PID`` (half written, or complete but never published) is removed; ``.old-NAME-PID`` (the copy a
        replace moved aside) is removed, or, with ``restore`` (not under ``--resume never`` nor in a run restarted
        under another config, which remove the earlier run's folders next), moved back to NAME when the kill came
        before the new one took its place. Only those names; nothing else is touched. ``checkpoints_only``: only the
        restoring, in OUT/checkpoints (once the lock is taken, before the run lists its checkpoints: a step-N moved
        aside is one to resume)."""
        places = (
            [self.out_dir / CHECKPOINTS_DIR] if checkpoints_only else [self.out_dir, self.out_dir / CHECKPOINTS_DIR]
        )
        for path in sorted(p for place in places if place.is_dir() for p in place.iterdir()):
            found = LEFTOVER.fullmatch(path.name)
            if found is None or not path.is_dir() or path.is_symlink():
                continue
            kind, name = found.groups()
            target = path.parent / name
            if restore and kind == "old" and not target.exists() and (path / MANIFEST).is_file():
                path.rename(target)
                self.log(f"dgrpo: {target} was being replaced when a run was killed: its earlier copy is restored")
            elif not checkpoints_only:
                shutil.rmtree(path, ignore_errors=True)

    def _start_over(self) -> None:
        """``--resume never`` (or a run restarted under another config): remove what an earlier run wrote here (its
        checkpoints, best/, final/, stage-K/, test results, config history, summary, logs), so that nothing left of
        it reads as this run's output."""
        found = self._earlier_writes()
        for path in found:
            if path.is_symlink() and path.is_dir():  # (checkpoints/ linked to a larger disk: the link stays)
                for entry in path.iterdir():
                    shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
            else:
                shutil.rmtree(path) if path.is_dir() else path.unlink()
        if found:
            names = ", ".join(p.name for p in found)
            why = self._option(*START_OVER) if self.resume_mode == "never" else "started over under another config"
            self.log(f"dgrpo: {why}: removed the earlier run's {names} in {self.out_dir}")

    def _lock(self) -> RunLock | None:
        """Rank 0 checks the directory and takes the lock (every rank learns whether it could)."""
        found: list[RunLock] = []

        def take() -> None:
            held = adopt_run_dir(self.out_dir)  # (the command line's, taken before the model loaded)
            if held is not None:
                lock, self.made = held.lock, held.made
            else:
                check_output_dir(self.out_dir)
                lock = RunLock(self.out_dir, self._option(*NEW_OUT))
            try:  # (under the lock: OUT as a run at work there left it, not mid-change, which was refused as foreign)
                self._check_owned()
                check_config_writes(self.out_dir, self.cfg, self.command, self.resume_mode, self._option(*NEW_OUT))
            except BaseException:
                lock.release(remove=True)  # (a refused directory is left without a lock file this run made)
                raise
            found.append(lock)
            if self.resume_mode != "never":
                self._clean_leftovers(restore=True, checkpoints_only=True)

        self._on_rank0(take)
        return found[0] if found else None

    def _on_rank0(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` on rank 0; if it raises ConfigError (or CheckpointError), every rank raises it (all fail
        together, none hangs)."""
        problem: Exception | None = None
        if self.dist.is_main:
            try:
                fn()
            except (ConfigError, CheckpointError) as e:
                problem = e
        if self.dist.sum_int(int(problem is not None)):
            raise problem or ConfigError(f"{self.out_dir}: the run directory cannot be used (see rank 0's error)")

    def _warn_if_restarted_under_another_config(self) -> None:
        """An unfinished run with no checkpoint (killed before its first, or its checkpoints/ deleted) starts over;
        under a changed config with a warning that names the keys, and what the earlier run wrote (its best/,
        stage-K/, ...) is removed as ``--resume never`` removes it (its config.json and metrics.jsonl were replaced
        without a word, and its best/ kept beside them). Not refused, as nothing that can be resumed is lost (a rerun
        after an out-of-memory error at the first step changes a batch setting, as that error's line advises);
        another command's run is, and so is what the removal may not delete (:meth:`_check_restart`)."""
        changed = self._check_restart()
        if changed:
            warnings.warn(
                f"{self.out_dir} holds a run started with a different config ({first_items(changed, 8)}) and no "
                "checkpoint to resume: it starts over under this one, "
                "removing what that run wrote",
                stacklevel=2,
            )
            self.restarted = True

    def resume(self, load: Callable[[Path], LoadedCheckpoint]) -> LoadedCheckpoint | None:
        """Read the newest checkpoint that loads (``load`` reads and checks one, mutating nothing); each one that
        does not is reported in one line. None for a fresh start; an error when checkpoints exist but none loads."""
        problems, skipped = [], []
        for i, ckpt in enumerate(self.candidates):
            try:
                loaded = load(ckpt)
            except CheckpointError as e:
                if self.explicit:  # the one checkpoint named: nothing to fall back to
                    raise CheckpointError(f"{self._resume_named(ckpt)}: {e}") from None
                problems.append(f"{ckpt.name}: {e}")
                skipped.append(ckpt)
                then = "falling back to the previous one" if i + 1 < len(self.candidates) else "no earlier one is left"
                self.log(f"dgrpo: skipping checkpoint {ckpt}: {e}; {then}")
                continue
            self.checkpoint = ckpt
            self._move_aside(skipped)
            self.base_now = loaded.base
            return loaded
        if problems:
            raise CheckpointError(
                f"no checkpoint in {self.out_dir} can be resumed ({'; '.join(problems[:3])}); "
                f"start over with {self._option(*START_OVER)}"
            )
        return None

    def _adopt_base(self, base: str | None) -> None:
        """A resumed LoRA run on its base's weights in another place (``base``: the local base loaded now, checked by
        :func:`~.checkpoint.check_same_local_base`): the run's adapter folders are pointed there
        (:func:`~.checkpoint.repoint_run_adapters`), once every rank has read the checkpoint and the resume passed its
        checks (:meth:`start`: a refused resume writes nothing)."""
        if base is None:
            return
        self.dist.sum_int(0)  # (rank 0 may replace the checkpoint's folder: every rank has read it)
        self._on_rank0(lambda: repoint_run_adapters(self.out_dir, base, self.log))

    def check_same_data(self, saved: str | None, given: str) -> None:
        """Refuse to resume on other training data than the checkpoint was trained on (``saved`` and ``given``:
        :func:`~dgrpo.data.records.fingerprint`), unless ``allow_config_change`` (:meth:`refuse_unrecorded_change`).
        A checkpoint written before dgrpo recorded its data (``saved`` None) is not checked. Compared as GRPO's
        resume compares them (:func:`~.resume_check.recorded_changes`)."""
        for what, keep in recorded_changes({"train_data": saved}, given):
            self.refuse_unrecorded_change(what, keep)

    def refuse_unrecorded_change(self, what: str, keep: str) -> None:
        """A resume of the loaded checkpoint on what the config does not hold but the checkpoint recorded (the
        training data, a reward given from Python), changed since (``what``: how): refused in one line naming
        ``keep`` (:meth:`~.resume_check.ResumeCheck.refuse_recorded`, as the command line's check before the model
        loads words it), unless ``allow_config_change``: then it goes on, and says so."""
        if not self.allow_config_change:
            self.refuse_recorded(self.checkpoint, what, keep)
        self.log(f"dgrpo: resuming {self.checkpoint}, {what}")

    def _move_aside(self, skipped: list[Path]) -> None:
        """Rename the newer checkpoints a resume skipped to ``damaged-step-N`` (kept to look at, no longer a
        checkpoint of the run): the run writes those steps again, and one without its manifest may not be replaced
        (:func:`~dgrpo.model.verified.check_replaceable`), which stopped every later try at that step."""
        if not self.dist.is_main:
            return
        for ckpt in skipped:
            aside, n = ckpt.with_name(f"damaged-{ckpt.name}"), 1
            while aside.exists():
                n += 1
                aside = ckpt.with_name(f"damaged-{ckpt.name}-{n}")
            try:
                ckpt.rename(aside)
            except OSError as e:  # (gone, or not ours to move: the save of that step says so in one line)
                self.log(f"dgrpo: could not move the skipped checkpoint {ckpt} aside: {e}")
                continue
            self.log(f"dgrpo: moved the skipped checkpoint {ckpt.name} aside to {aside}")

    def record_applied_at_end(self, applied: dict[str, Any]) -> None:
        """This process's entry of ``applied.json`` written again with ``applied`` as at the run's end (what changed
        since :meth:`start`: a compiler's fallback); rank 0 writes it."""
        if self.dist.is_main:
            record_applied(self.out_dir / APPLIED_FILE, self.applied_step, applied)

    def stop_after_step(self, applied: dict[str, Any], error: TrainingStopped | None = None) -> NoReturn:
        """Stop the run after a step (its checkpoint written, if it has one): this process's entry of ``applied.json``
        first written again with ``applied`` as at the run's end (:meth:`record_applied_at_end`: the resume and the
        record agree), then ``error`` raised (a tripped non-finite guard, weights made non-finite, a stall: every rank
        meets it at once), else a SIGTERM's stop; under torchrun every rank first waits for rank 0's writes
        (:func:`~.preemption.stop`)."""
        self.record_applied_at_end(applied)
        stop(self.dist, error)

    def start(self, resumed_state: dict | None, applied: dict[str, Any] | None = None) -> None:
        """A resumed LoRA run's adapter folders first pointed to its base's new place (:meth:`_adopt_base`); then
        write ``config.json`` (and its history) and ``applied`` (what the trainer applied, as resolved: an entry of
        ``applied.json``, :func:`~.applied.record_applied`), open the metrics log (keeping the resumed checkpoint's
        rows, or starting empty) and the trackers, say where metrics go and that we resumed."""
        trackers: list[Tracker] = []
        if resumed_state is not None:
            self._adopt_base(self.base_now)
        if self.dist.is_main:
            self._drop_abandoned_checkpoints(resumed_state["metrics_lines"] if resumed_state is not None else 0)
            step = resumed_state["step"] if resumed_state is not None else 0
            if resumed_state is not None and self.changed:
                self._keep_config_history(step)
            _write_whole(self.out_dir / CONFIG_FILE, json.dumps(self.cfg, indent=2))
            self.applied_step = step
            if applied is not None:
                if resumed_state is not None:
                    warn_if_plugins_changed(self.out_dir / APPLIED_FILE, step, applied)
                record_applied(self.out_dir / APPLIED_FILE, step, applied)
            lg = self.logging
            trackers = open_trackers(
                lg.backends,
                self.out_dir,
                config=self.cfg,
                project=lg.project,
                entity=lg.entity,
                run_name=lg.run_name,
                resume=resumed_state is not None,
            )
            self.metrics.trackers = trackers  # (closed by close(), whatever fails before the metrics log opens)
            self.log(describe_backends(lg.backends, trackers, self.out_dir / METRICS_FILE))
            if resumed_state is not None:
                self._warn_if_rows_lost(resumed_state["metrics_lines"])
        self.metrics.open(resumed_state["metrics_lines"] if resumed_state is not None else None, trackers)
        if self.dist.is_main:  # rollouts.jsonl: keep the rows of the steps before the resumed one
            keep_before = resumed_state["step"] if resumed_state is not None else 0
            rows = self.rollouts_path.read_text().splitlines() if self.rollouts_path.is_file() else []
            kept = rollout_rows_before(rows, keep_before, self.rollouts_path)
            logged = self.cfg.get("grpo", {}).get("log_rollouts", 0) > 0 and self.command == "grpo"
            read_only = logged and self.rollouts_path.is_file() and not os.access(self.rollouts_path, os.W_OK)
            if kept != rows or read_only:  # (a read-only one, in a folder of this user's, replaced: then appended to)
                self._cut_rollouts(kept)
        if self.checkpoint is not None and resumed_state is not None:
            self.resumed_step = resumed_state["step"]
            self.log(f"dgrpo: resumed from {self.checkpoint} (step {resumed_state['step']})")
            written_by = resumed_state.get("world_size")  # (None: a checkpoint from before dgrpo recorded it)
            if written_by is not None and written_by != self.dist.world_size:
                self.log(
                    f"dgrpo: the checkpoint was written by {written_by} process(es) and is resumed by "
                    f"{self.dist.world_size}: the run goes on a float rounding away from one that kept {written_by} "
                    "(the same data order and seeds; summation order differs)"
                )

    def _cut_rollouts(self, kept: list[str]) -> None:
        """``rollouts.jsonl`` rewritten to the rows ``kept``, whole or not at all (it was cut in place: a full disk or a
        stop during the write left the rows of the earlier steps cut short or gone, and the next resume kept what was
        left without a word)."""
        _write_whole(self.rollouts_path, "".join(r + "\n" for r in kept))

    def _drop_abandoned_checkpoints(self, keep_lines: int) -> None:
        """A rewind (``--resume OUT/checkpoints/step-N``, one of this run's own) removes this run's checkpoints newer
        than N: the resumed run writes those steps anew, and a stop before it did left them as the newest, which the
        same command without ``--resume`` (as the stop's line advised) resumed: the abandoned steps' weights, under
        the metrics rows and config of the rewound ones, the rows between them lost. Each is renamed to a temporary
        name first (removed at a run's start), so that a stop during its removal leaves no half checkpoint. A finished
        run's ``final/`` and ``summary.json`` are then the abandoned steps' end (its last checkpoint is among those
        removed): removed too (:meth:`_drop_earlier_finish`), else a stop of the rewound run left them, reading as its
        finished model and summary (``dgrpo eval --model OUT`` took that final/). So are an SFT run's
        ``stage-K/`` folders that the abandoned steps wrote (:meth:`_drop_abandoned_stages`)."""
        if not self.explicit or self.checkpoint is None:
            return
        root = self.out_dir / CHECKPOINTS_DIR
        if not root.is_dir() or not self.checkpoint.resolve().is_relative_to(root.resolve()):
            return
        rewound = STEP_DIR.match(self.checkpoint.name)  # (a user's step-00000012-copy is step 12's too)
        if rewound is None:
            return
        newer = [c for c in list_checkpoints(self.out_dir) if int(c.name.removeprefix("step-")) > int(rewound[1])]
        for ckpt in newer:
            remove_dir(ckpt)
        if newer:
            names = ", ".join(c.name for c in newer)
            self.log(
                f"dgrpo: rewound to {self.checkpoint.name}: removed this run's later checkpoints {names} (the run "
                "writes those steps anew)"
            )
            self._drop_earlier_finish()
            if self.command == "sft":
                self._drop_abandoned_stages(keep_lines)

    def _drop_abandoned_stages(self, keep_lines: int) -> None:
        """An SFT rewind's ``stage-K/`` folders written after the resumed checkpoint, by the abandoned steps: those
        named by a stage's end row (written right after its folder) past the checkpoint's ``keep_lines`` metrics rows.
        They are removed, else a stop of the rewound run before it wrote them anew (or its end, when it no longer
        reaches that stage) left them, reading as this run's stage-K model. Without those rows (metrics.jsonl cut or
        deleted) nothing is removed."""
        try:
            rows = self.metrics.path.read_text().splitlines()[keep_lines:]
        except OSError:
            return
        stages = set()
        for line in rows:
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and "stage" in row and "n_latent" in row and "epoch" not in row:
                stages.add(row["stage"])
        gone = [d for d in stage_dirs(self.out_dir) if d.is_dir() and int(d.name.removeprefix("stage-")) in stages]
        for folder in gone:
            remove_dir(folder)
        if gone:
            names = ", ".join(f"{d.name}/" for d in gone)
            self.log(
                f"dgrpo: rewound to {self.checkpoint}: removed {names} in {self.out_dir}, written by the steps this "
                "rewind abandons (the run writes them anew as it gets there)"
            )

    def best_record(self) -> str | None:
        """What identifies the run's ``best/`` now: the sha256 of its manifest (which lists its files' digests; a
        sharded one's without what ``dgrpo consolidate`` writes: :func:`_best_records`), or None without one. Each
        resumable checkpoint's state records it, so that a resume knows whether ``best/`` is still the one the
        checkpoint's run had (:meth:`drop_stale_best`)."""
        manifest = self._best_manifest()
        return _best_records(manifest)[0] if manifest is not None else None

    def _best_manifest(self) -> bytes | None:
        """The bytes of ``best/``'s manifest, None without one."""
        manifest = self.out_dir / BEST_DIR / MANIFEST
        return manifest.read_bytes() if manifest.is_file() else None

    def drop_stale_best(self, state: dict) -> bool:
        """On a resume from the checkpoint state ``state``: whether ``best/`` was written after that checkpoint, by
        steps the resumed run abandons (a rewind to an earlier checkpoint; a stop after ``best/`` was written, before
        the next checkpoint, resumed under another config). Then it is removed (rank 0), with a line: its weights
        were not the best the checkpoint recorded (that one was replaced on disk), so the resumed run's report and
        summary named another step or epoch than the model in ``best/``. The trainer then chooses ``best/`` anew
        among the evaluations from the resumed step on. Every rank gets rank 0's answer. A checkpoint written
        before dgrpo recorded its ``best/`` is not checked (False)."""
        stale = False
        if self.dist.is_main and "best" in state:
            manifest, config = self._best_manifest(), self.out_dir / BEST_DIR / MODEL_CONFIG
            earlier = config.read_bytes() if config.is_file() else None
            stale = manifest is not None and state["best"] not in _best_records(manifest, earlier)
            if stale:
                remove_dir(self.out_dir / BEST_DIR)
                self.log(
                    f"dgrpo: removed {self.out_dir / BEST_DIR}: it was written after {self.checkpoint} (by the "
                    "steps this resume abandons); best/ is chosen anew from the resumed step on"
                )
        return self.dist.sum_int(int(stale)) > 0

    def _warn_if_rows_lost(self, keep: int) -> None:
        """A warning when this run's own checkpoint is resumed and ``metrics.jsonl`` holds fewer rows than the
        ``keep`` written before it (deleted, or cut): those rows are lost, the run goes on. (A fork of another run's
        checkpoint starts its own file: the parent's rows are not expected there.)"""
        own = self.checkpoint is not None and self.checkpoint.resolve().is_relative_to(self.out_dir.resolve())
        have = count_lines(self.metrics.path)
        if own and have < keep:
            state = "is missing" if not self.metrics.path.is_file() else f"holds {have} rows"
            warnings.warn(
                f"{self.metrics.path} {state}, and {keep} were written before {self.checkpoint}: the rows before "
                "that checkpoint are lost (the run goes on, writing the rows from there)",
                stacklevel=2,
            )

    def _drop_earlier_finish(self) -> None:
        """The marks of an earlier end of this run (a finished run resumed to train more steps, or run again):
        summary.json and final/, removed before this end writes them anew, so that a stop in the test sets does not
        leave a final/ and a summary of fewer steps that read as this run's (``dgrpo eval --model OUT`` took that
        final/). final/ is first renamed to a leftover name (removed at a run's start, never restored), so that a
        stop during its removal leaves no final/ without its manifest. The test sets' results stay: each set's are
        replaced as it is evaluated again, and a set that is not (a failure's advice, a changed ``data.test``) keeps
        the only record of them."""
        summary, final = self.out_dir / SUMMARY_FILE, self.out_dir / FINAL_DIR
        found = [p.name for p in (summary, final) if p.exists()]
        summary.unlink(missing_ok=True)  # (first: the mark of a finished run)
        if final.is_dir():
            remove_dir(final)
        if found:
            names = " and ".join(found)
            them = "them" if len(found) > 1 else "it"
            self.log(f"dgrpo: removed the earlier end's {names} in {self.out_dir}: this run's end writes {them} anew")

    @property
    def same_command(self) -> str:
        """The command that goes on from the newest checkpoint, as the run's lines name it: under ``--resume never``
        or ``--resume PATH`` the same command would start over or go back to PATH (the command line's stop lines
        say so too: ``dgrpo.cli._resume_hint``); from Python, the same call (with ``resume='auto'``)."""
        if self.resume_mode == "auto":
            return "the same command" if self.cli else "the same call"
        return (
            f"the same command without --resume {self.resume_mode}" if self.cli else "the same call with resume='auto'"
        )

    @property
    def rollouts_path(self) -> Path:
        return self.out_dir / ROLLOUTS_FILE

    def final_eval(self, final_eval: FinalEval | None, lm: LatentLM, step: int, best: int | None) -> None:
        """The run's last metrics row, at ``step``: the metrics ``final_eval(lm, best)`` returns, called on every rank
        after the last step's resumable checkpoint and before ``final/`` (and GRPO's ``summary.json``), which the
        trainers write last: a run stopped in it (SIGTERM, Ctrl-C, SIGKILL) is not finished, and the same command
        resumes that checkpoint, trains no more, and calls it again. Rank 0's metrics are logged, to metrics.jsonl and
        the trackers (still open: a test set's accuracy reaches TensorBoard and W&B too). One that fails (a scorer's
        error, out of memory) is preceded by a line that says what that leaves and how to go on.

        Under torchrun the ranks agree before it and after it whether a SIGTERM asked to stop (GRPO's last step
        validated and wrote its checkpoint after their last agreement), and stop there; from then on, writing the
        run's end, a SIGTERM lets it finish (:func:`~dgrpo.training.preemption.writing_the_end`, until
        :meth:`close`)."""
        if self.dist.is_main:
            self._drop_earlier_finish()
        end = f"{FINAL_DIR}/ and {SUMMARY_FILE}" if self.command == "grpo" else f"{FINAL_DIR}/"
        last = f"{end} come" if self.command == "grpo" else f"{end} comes"
        at_the_end = f"at the run's end, before {end} (the training is done and checkpointed)"
        with in_test_sets(self.same_command):
            stop_if_requested(self.dist, at_the_end)
            row = self._tested(final_eval, lm, best, last) if final_eval is not None else None
            stop_if_requested(self.dist, at_the_end)
        writing_the_end(end)
        if row and self.dist.is_main:
            self.metrics.write({"step": step, **row})

    def _tested(self, final_eval: FinalEval, lm: LatentLM, best: int | None, last: str) -> dict | None:
        """``final_eval(lm, best)``, what a stop in it leaves said by its message, and a failure's by a line first."""
        try:
            with stopping(f"in the test sets' evaluation (the training is done and checkpointed; {last} after them)"):
                return final_eval(lm, best)
        except Exception:
            if self.dist.is_main:  # (on stderr, before the error's own line)
                print(
                    f"dgrpo: the test sets' evaluation failed (below): the training is done and checkpointed in "
                    f"{self.out_dir / CHECKPOINTS_DIR}; {last} after the test sets: once they can run, "
                    f"{self.same_command} evaluates them (it trains no step), or {self._no_test_sets} skips them",
                    file=sys.stderr,
                    flush=True,
                )
            raise

    @property
    def _no_test_sets(self) -> str:
        """How to resume a run without its test sets, as the caller sets it (the command line's quoted ``--set``)."""
        if self.cli:
            return "--set 'data.test=[]' --allow-config-change"
        return "the config's data.test = [] and allow_config_change=True"

    def write_rollouts(self, rows: list[dict]) -> None:
        """Append rows to ``rollouts.jsonl`` (rank 0)."""
        if rows and self.dist.is_main:
            with open(self.rollouts_path, "a") as f:
                f.writelines(json.dumps(r) + "\n" for r in rows)

    def _keep_config_history(self, step: int) -> None:
        """``config.N.json``: every config the run used, with the step it started at (0 = the run's first). The last
        entry already this one at ``step`` (a retry after a failure before config.json was written: it still holds the
        earlier config, so the change is seen again) is kept as it is, not written as a second entry."""
        history = config_history(self.out_dir)
        if not history:
            first = self.first_config
            history = [config_history_file(self.out_dir, 0)]
            _write_whole(history[0], json.dumps({"started_at_step": 0, "config": first}, indent=2))
        entry = json.dumps({"started_at_step": step, "config": self.cfg}, indent=2)
        if _read_json(history[-1]) == json.loads(entry):
            kept = history[-1]
        else:
            kept = config_history_file(self.out_dir, int(history[-1].name.split(".")[1]) + 1)
            _write_whole(kept, entry)
        self.log(f"dgrpo: config changed at step {step} ({', '.join(self.changed[:8])}); kept as {kept.name}")

    def close(self, exit_code: int = 0) -> None:
        """Close the metrics log and the trackers (marking a W&B run failed unless ``exit_code`` is 0); unlock. The run
        is over: a SIGTERM no longer waits for its end."""
        writing_the_end("")
        try:
            self.metrics.close(exit_code)
        finally:  # (unlocked even when closing the metrics log raised)
            # a run refused before it wrote anything leaves no folder it made (OUT, and those above it it made)
            if (
                exit_code
                and self.made is not None
                and self.lock is not None
                and os.listdir(self.out_dir) == [LOCK_FILE]
            ):
                release_leaving_nothing(self.lock, self.out_dir, self.made)
                self.made = self.lock = None
            if self.lock is not None:
                self.lock.release()
                self.lock = None

    def __enter__(self) -> RunDir:
        return self

    def __exit__(self, kind: type | None, error: BaseException | None, *tb: object) -> None:
        self.close(exit_code_of(error))  # (a SIGTERM's stop 143, W&B's preempted run; Ctrl-C 130; an error 1)
