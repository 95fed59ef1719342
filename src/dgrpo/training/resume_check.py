"""Whether a run directory may be resumed under this config: the keys a resume may change, the config diff, the data
specs made absolute, and :class:`ResumeCheck` (the command that wrote the checkpoints, the config the run was started
with, what starting over would delete), made by :class:`~dgrpo.training.run.RunDir` with its lock held and by the
command line before the data and the model are read."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from ..config import BUILTIN_SHAPE, Config, ConfigError, to_dict
from ..model.factory import BUILTIN
from ..model.sources import is_model_dir, on_disk
from ..model.verified import MANIFEST, RESUMABLE_STATE, RUN_CONFIG_FILE
from ..paths import expand_home
from ..progress import say
from ..run_layout import (
    APPLIED_FILE,
    BEST_DIR,
    CHECKPOINTS_DIR,
    CONFIG_FILE,
    FINAL_DIR,
    METRICS_FILE,
    ROLLOUTS_FILE,
    RUN_WRITES,
    SUMMARY_FILE,
    checkpoint_copies,
    config_history,
    run_of_checkpoint,
    stage_dirs,
)
from ..text import first_items
from .checkpoint import check_planned_adapter, checkpoint_command, foreign_entries, list_checkpoints, resume_candidates
from .out_dir import check_removable, is_run_config, is_run_metrics
from .wording import command_line_words, in_command_line, init_named, setting_named

#: options that change neither the computation nor its results: a resumed run may change them freely. Recomputing
#: the decoder layers or calls gives the same gradients, bit for bit on CPU (tests/test_recompute.py); keeping the
#: latent steps' activations (recompute_latent_steps: false) does not (1e-7 apart), so that key is not neutral
NEUTRAL_KEYS = frozenset(
    ["threads", "device"]
    # LoRA's adapter dropout is always 0 (dgrpo.model.lora): a run records 0 (dgrpo up to 2026-12-02: the value given)
    + ["model.lora.dropout"]
    # how the ranks hold the model: like another number of processes, which a resume may change too, it changes
    # results at float level; the checkpoint's loader says what a sharded checkpoint needs (torchrun, FSDP2)
    + ["fsdp"]
    + [f"{t}.{k}" for t in ("sft", "grpo") for k in ("recompute", "recompute_granularity", "recompute_kept_layers")]
    # how often a resumable checkpoint is written and how many are kept: a resumed run is the run not stopped (to
    # the bit), so they change where a stop can resume, not what it computes
    + [f"{t}.{k}" for t in ("sft", "grpo") for k in ("save_every", "keep_last")]
)
NEUTRAL_SECTIONS = ("logging.",)  # every key below these
#: what a command's run never reads (the other command's section; dgrpo eval's prompt options): a resume ignores them
UNREAD_BY = {"sft": ("grpo.", "eval.plain", "eval.shots"), "grpo": ("sft.", "eval.plain", "eval.shots")}
#: model.arch and the built-in tiny model's sizes: they build that model (model.name_or_path builtin-tiny); a run
#: that loads one records the loaded model's there (dgrpo before 2026-12-02 recorded the options given), which a
#: resume does not compare
BUILTIN_SHAPE_KEYS = frozenset(f"model.{k}" for k in BUILTIN_SHAPE)
#: what makes a LoRA run's adapter: a LoRA run's resume compares them on the checkpoint's and the model's adapters
#: (:func:`~.checkpoint.check_same_adapter`), not in the config (a run from an --init adapter records the adapter's,
#: dgrpo before 2026-12-02 the values given); a change is kept in the config history
ADAPTER_KEYS = frozenset(f"model.lora.{k}" for k in ("r", "alpha", "target_modules", "train_latent_tokens"))


def config_diff(old: dict, new: dict, prefix: str = "", defaults: dict | None = None) -> list[str]:
    """Dotted keys whose values differ between two config dicts (options that cannot change results excluded). A key
    the old config lacks counts as its default: an option a later dgrpo added does not stop a run from resuming."""
    defaults = to_dict(Config()) if defaults is None else defaults
    keys = []
    for k in sorted(set(old) | set(new)):
        key = f"{prefix}{k}"
        a, b = old[k] if k in old else defaults.get(k), new.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            sub = defaults.get(k)
            keys += config_diff(a, b, key + ".", sub if isinstance(sub, dict) else {})
        elif a != b and not key.startswith(NEUTRAL_SECTIONS) and key not in NEUTRAL_KEYS:
            keys.append(key)
    return keys


def absolute_data_spec(spec: str) -> str:
    """A data spec with each part that names an existing local file or folder made absolute (``my.jsonl`` ->
    ``/abs/my.jsonl``, ``data/dir:test`` -> ``/abs/data/dir:test``, each part of ``a.jsonl+b.csv``), so that a run's
    config names the data wherever it is run or resumed from; built-in and hub names, and parts that name no local
    file, as they are (:func:`_each_dataset`)."""
    from ..data import local_path

    def absolute(part: str) -> str | None:
        at_a_path = local_path(part)
        if at_a_path is None:
            return None
        path, split = at_a_path
        absolute = str(expand_home(path).resolve())
        return f"{absolute}:{split}" if split is not None else absolute

    return _each_dataset(spec, absolute)


def _each_dataset(spec: str, one: Callable[[str], str | None]) -> str:
    """``spec`` as ``one`` gives the one dataset it names (None: it names none of ``one``'s kind), else each part of a
    ``+``-joined spec as ``one`` gives it (as it is where None): what :func:`dgrpo.data.load_spec` reads, in its
    order, a path, else the parts of :func:`dgrpo.data.join_parts` (a file whose own name holds a ``+`` one part).
    Built-in specs, and a joined spec whose new parts would be read as other parts, as typed."""
    from ..data import join_parts

    whole = one(spec)
    if whole is not None:
        return whole
    if "+" not in spec or spec.startswith("builtin"):
        return spec
    parts = [(one(part) or part) if part else part for part in join_parts(spec)]
    joined = "+".join(parts)
    return joined if join_parts(joined) == parts else spec


def absolute_data_specs(data: dict) -> dict:
    """A config dict's ``data`` section with its ``train`` and ``valid`` specs made absolute, as a run records them
    (:func:`absolute_data_spec`; ``''`` and non-text values as they are; ``test`` as typed: its specs name results)."""
    keep = dict(data)
    for key in ("train", "valid"):
        if isinstance(keep.get(key), str) and keep[key]:
            keep[key] = absolute_data_spec(keep[key])
    return keep


def start_folders(checkpoint: Path) -> list[Path]:
    """The folders the processes of the run that wrote ``checkpoint`` (its ``final/``, ``best/``, ``stage-K/``, or a
    resumable ``checkpoints/step-N/model``) started in, as the run's ``applied.json`` records them (``started_in``),
    the latest first; for ``step-N``, only those of the processes that started before step N (the one that wrote it
    first). None (``[]``) for a checkpoint outside a run directory (one copied elsewhere), or a run recorded before
    ``started_in`` was."""
    found = run_of_checkpoint(checkpoint)
    if found is None:
        return []
    run, before = found
    try:
        entries = json.loads((run / APPLIED_FILE).read_text())
    except (OSError, ValueError):  # (none: a hint only, the working directory comes first anyway)
        return []
    folders: list[Path] = []
    for entry in reversed(entries if isinstance(entries, list) else []):
        if not isinstance(entry, dict) or not isinstance(entry.get("started_in"), str):
            continue
        at = entry.get("started_at_step")
        if before is not None and isinstance(at, int) and at >= before:  # (started after that checkpoint was written)
            continue
        folder = Path(entry["started_in"])
        if folder.is_absolute() and folder not in folders:
            folders.append(folder)
    return folders


def data_spec_from(spec: str, folders: list[Path]) -> str:
    """``spec`` with each relative path that names nothing from the working directory made absolute in the first of
    ``folders`` where it names a local file or folder (each part of ``a.jsonl+b.csv`` on its own:
    :func:`_each_dataset`); built-in and hub names, absolute paths and parts found from here as they are (the working
    directory first)."""
    from ..data import local_path

    if not folders or spec.startswith("builtin") or local_path(spec) is not None:
        return spec
    return _each_dataset(spec, lambda part: _part_from(part, folders))


def _part_from(part: str, folders: list[Path]) -> str | None:
    """One dataset of a spec (a path, ``PATH:SPLIT``): as it is when it names a local file or folder from here, else
    made absolute in the first of ``folders`` where it names one as :func:`dgrpo.data.load_spec` would read it from
    there (not a built-in dataset's name, which a plain folder of that name does not make local); else None."""
    from ..data import local_path
    from ..data.loaders import is_dataset_name
    from ..data.tables import is_hf_folder

    if local_path(part) is not None:
        return part
    if part.startswith("builtin") or expand_home(part).is_absolute():
        return None
    for folder in folders:
        there = local_path(str(folder / part))
        if there is None:
            continue
        path = Path(there[0])
        named = is_dataset_name(str(path.relative_to(folder)))  # (from that folder, read as the dataset it names)
        if named and not (path.is_file() or is_hf_folder(path)):
            continue
        return f"{path}:{there[1]}" if there[1] is not None else str(path)
    return None


#: keys a run's config takes from the model it loads (a hub commit, a chat template the model was trained with):
#: :func:`check_resume_config`, made before the model loads, leaves them to :class:`~.run.RunDir`'s check
LOAD_RESOLVED_KEYS = ("model.revision", "data.chat_template")


#: how to start a run over, and to resume it under a changed config: (the command line's option, the Python API's)
START_OVER = ("--resume never", "resume='never'")
ALLOW_CHANGE = ("--allow-config-change", "allow_config_change=True")
#: where to run instead, and how to go on from the run's own newest checkpoint
NEW_OUT = ("--out", "out_dir")
DROP_RESUME = ("drop --resume", "resume='auto'")


def quiet_log(message: str) -> None:
    """A log that says nothing (a rank other than 0's)."""


def check_resume_config(
    out_dir: Path | str, cfg: Config, command: str, resume: str = "auto", allow_config_change: bool = False
) -> None:
    """``dgrpo sft`` / ``dgrpo grpo``'s refusal of a resume under a changed config (or of another command's
    checkpoints), made from the run directory alone before any dataset is read or the model loaded (at the paper's
    scale those take minutes, and the refusal came after them), in the command line's words; so are a finished run
    without a checkpoint given again, and what ``--resume never`` or a restart under another config would delete
    that it may not (:meth:`ResumeCheck.before_loading`), and a LoRA checkpoint whose adapter this run would not
    build or whose local base holds other weights (:func:`~.checkpoint.check_planned_adapter`), and a GRPO run
    shortened below its checkpoints' step (:func:`check_not_shortened`). The keys a run takes from its model
    (:data:`LOAD_RESOLVED_KEYS`) are left to :class:`~.run.RunDir`'s check, after the model loads."""
    check = ResumeCheck(out_dir, to_dict(cfg), command, resume, allow_config_change, log=quiet_log, cli=True)
    check.before_loading()
    with command_line_words():  # (their refusals are worded as the trainers' are, for the caller)
        check_planned_adapter(check.candidates, check.cfg.get("model", {}))
        if command == "grpo":
            check_not_shortened(check.candidates, cfg.grpo.steps)


def check_owned(out_dir: Path | str) -> None:
    """``dgrpo sft`` / ``dgrpo grpo``'s refusal of an ``--out`` holding what no dgrpo run wrote
    (:meth:`ResumeCheck._check_owned`), made with the lock taken before the data and the model are read (it came once
    they were: minutes at the paper's scale)."""
    ResumeCheck(out_dir, {}, "", cli=True)._check_owned()


def check_resume_data(
    out_dir: Path | str,
    cfg: Config,
    command: str,
    train: list,
    reward: list[str] | None = None,
    resume: str = "auto",
    allow_config_change: bool = False,
) -> None:
    """``dgrpo sft`` / ``dgrpo grpo``'s refusal of a resume on other training data than its checkpoints were trained
    on (``train``: the records read), or, GRPO, with another reward (``reward``: the config's reward's
    :meth:`~dgrpo.eval.scoring.Rewards.identity`), made once the data is read and before the model loads (at the
    paper's scale that takes minutes, and the refusal came after it), in the command line's words: when every
    checkpoint to resume (newest first) recorded other data, or another reward. One that records none (written
    before dgrpo did) or whose state.json does not read leaves it to the trainers' checks once the checkpoint is
    loaded (:meth:`~.run.RunDir.check_same_data`), which allow_config_change turns into a line."""
    from ..data.records import fingerprint

    if allow_config_change:
        return
    check = ResumeCheck(out_dir, to_dict(cfg), command, resume, log=quiet_log, cli=True)
    candidates = check._candidates()
    records = [_recorded(ckpt, command) for ckpt in candidates]
    found = [r for r in records if r is not None]
    if not records or len(found) < len(records):
        return
    data = fingerprint(train)
    saved: list[Any] = [r.get("train_data") for r in found]
    if all(isinstance(s, str) and s != data for s in saved):
        check.refuse_recorded(candidates[0], data_change(saved[0], data), SAME_DATA)
    rewards: list[Any] = [r.get("reward") for r in found]
    if reward is not None and all(isinstance(r, list) and not same_reward(r, reward) for r in rewards):
        check.refuse_recorded(candidates[0], reward_change(rewards[0], reward), SAME_REWARD)


def _recorded(ckpt: Path, command: str) -> dict | None:
    """The part of a checkpoint's state.json that records the training data's fingerprint (``train_data``) and, for
    GRPO, the reward (``reward``): GRPO's ``trainer``, SFT's whole state; None when it cannot be read."""
    try:
        state = json.loads((ckpt / RESUMABLE_STATE).read_text())
    except (OSError, ValueError):
        return None
    section = state.get("trainer") if command == "grpo" and isinstance(state, dict) else state
    return section if isinstance(section, dict) else None


def data_change(saved: str, given: str) -> str:
    """How the training data given now (``given``: its :func:`~dgrpo.data.records.fingerprint`) differs from the data
    a checkpoint recorded (``saved``), as a refusal says it."""
    (n_saved, _, _), (n_given, _, _) = saved.partition(":"), given.partition(":")
    what = f"{n_saved} records, now {n_given}" if n_saved != n_given else f"{n_given} records as now, other ones"
    return f"trained on other training data than given now ({what})"


#: a plug-in file's function as earlier dgrpo recorded it in a reward's identity: its module's name, which holds
#: a digest of the file's absolute path (``dgrpo_plugin_my_rewards_0123456789ab.fn``); now ``my_rewards.py:fn``
_EARLIER_PLUGIN_NAME = re.compile(r"\bdgrpo_plugin_(\w+?)_[0-9a-f]{12}\.")


def same_reward(saved: list[str], given: list[str]) -> bool:
    """Whether a checkpoint's recorded reward (``saved``: its parts' identities) is the one given now: equal, a
    plug-in file's function recorded by an earlier dgrpo under its module's name read as its file's name (so a run
    started before a plug-in was named by its file resumes; a partial recorded then without its bound arguments
    reads as another reward: such a run resumes with allow_config_change)."""
    return [_EARLIER_PLUGIN_NAME.sub(r"\1.py:", part) for part in saved] == given


def reward_change(saved: list[str], given: list[str]) -> str:
    """How the reward given now differs from the one a checkpoint recorded (each its parts' identities)."""
    return f"trained with the reward {'; '.join(saved)}, now {'; '.join(given)}"


#: how to keep a run's training data, as a refusal of other data says it
SAME_DATA = "the same data"
#: how to keep a GRPO run's reward, as a refusal of another one says it
SAME_REWARD = "the same reward (grpo.reward / grpo.rewards, or from Python the same reward_fn)"


def recorded_changes(saved: dict, data: str, reward: list[str] | None = None) -> list[tuple[str, str]]:
    """How the training data (``data``: its :func:`~dgrpo.data.records.fingerprint`) and the reward (``reward``: its
    parts' identities; None: not compared) given now differ from those a checkpoint's state recorded (``saved``: its
    ``train_data`` and ``reward``; one it does not record, written before dgrpo did, is not compared): for each, how
    (:func:`data_change`, :func:`reward_change`) and what to resume with (:data:`SAME_DATA`, :data:`SAME_REWARD`)."""
    found = []
    then_data, then_reward = saved.get("train_data"), saved.get("reward")
    if then_data is not None and then_data != data:
        found.append((data_change(then_data, data), SAME_DATA))
    if reward is not None and then_reward is not None and not same_reward(then_reward, reward):
        found.append((reward_change(then_reward, reward), SAME_REWARD))
    return found


def check_not_shortened(candidates: list[Path], steps: int) -> None:
    """The refusal of a GRPO resume under ``grpo.steps`` below the step its checkpoint is at (allowed to change the
    config), from the checkpoints' ``state.json`` before the data and the model are read (it came once the checkpoint
    was loaded): when every checkpoint to resume (newest first) is past ``steps``; one that cannot be read leaves it
    to the check made once the checkpoint is loaded."""
    at = []
    for ckpt in candidates:
        try:
            state = json.loads((ckpt / RESUMABLE_STATE).read_text())
            at.append(int(state["trainer"]["step_idx"]))
        except (OSError, ValueError, TypeError, KeyError):
            return
    if at and min(at) > steps:
        raise shortened_error(steps, at[0])


def shortened_error(steps: int, at: int) -> ConfigError:
    """The refusal of a GRPO run resumed at step ``at`` under ``grpo.steps`` = ``steps`` below it (its final/ would
    hold more steps than its summary says), worded for the caller (:func:`~.wording.in_command_line`)."""
    fork = (
        "--resume OUT/checkpoints/step-N --out NEW"
        if in_command_line()
        else "resume='OUT/checkpoints/step-N' with a new out_dir"
    )
    return ConfigError(
        f"grpo.steps = {steps} is below the step the run resumes at ({at}): a run cannot be shortened; resume with "
        f"grpo.steps >= {at}, or continue an earlier checkpoint in a new directory ({fork})"
    )


class ResumeCheck:
    """What a resume is checked against from the run directory alone (its ``config.json``, its checkpoints' state
    and recorded configs): the command that wrote the checkpoints and the config the run was started with.
    :class:`~.run.RunDir` makes these checks with the lock held; :func:`check_resume_config` makes them before the
    data and the model are read. ``cli``: the refusals name the command line's options only (``--resume never``,
    ``--allow-config-change``), not the Python API's arguments beside them."""

    def __init__(
        self,
        out_dir: Path | str,
        cfg: dict,
        command: str,
        resume: bool | str = "auto",
        allow_config_change: bool = False,
        log: Callable[[str], None] = say,
        cli: bool = False,
    ):
        self.out_dir, self.cfg, self.command, self.log, self.cli = Path(out_dir), cfg, command, log, cli
        self.resume_mode = {True: "auto", False: "never"}[resume] if isinstance(resume, bool) else resume
        self.allow_config_change = allow_config_change
        self.changed: list[str] = []
        self.first_config: dict = self.cfg  # the config the run was started with (differs: allow_config_change)
        self.candidates: list[Path] = []
        self.ignored: tuple[str, ...] = ()  # keys the config check leaves to a later one

    def before_loading(self) -> None:
        """The checks a resume needs no data and no model for: the command that wrote the checkpoints, and the
        config (but :data:`LOAD_RESOLVED_KEYS`, which the model may set); with nothing to resume, a finished run
        given again, and what ``--resume never`` or a restart under another config would delete that it may not
        (another command's run, the ``--init`` model, a user's copies, another user's folders), these last ones
        only when OUT holds nothing but a run's files (:meth:`_owned`). RunDir makes them again with its lock held
        (the Python API's trainers, which are given a loaded model, there only)."""
        self.candidates = self._candidates()
        self.ignored = LOAD_RESOLVED_KEYS
        if self.explicit:  # (first: a config compared with another run's config.json said to allow the change)
            self._check_fork()
        if self.resume_mode == "never" and self._owned():
            self._check_start_over()
        if self.candidates:
            self._check_command()
            self._check_config()
        elif self.resume_mode == "auto" and self._owned():
            self._check_not_finished()
            self._check_restart()

    def _option(self, cli: str, api: str) -> str:
        """How to ask for something: the command line's option ``cli``, and for a Python caller its argument ``api``
        too (``--resume never (resume='never')``)."""
        return cli if self.cli else f"{cli} ({api})"

    def _set(self, key: str, value: str) -> str:
        """The config's ``key`` set to the text ``value``, as the caller sets it (:func:`~.wording.setting_named`)."""
        return setting_named(key, value, repr(value), self.cli)

    def _init_named(self, path: Path | None = None) -> str:
        """How to start a new run from the model in ``path``, as the caller names it (:func:`~.wording.init_named`)."""
        return init_named(path, self.cli)

    def _resume_named(self, path: Path) -> str:
        """The checkpoint ``path`` as the caller named it: ``--resume PATH``, or from Python ``resume='PATH'``."""
        return f"--resume {path}" if self.cli else f"resume={str(path)!r}"

    def _candidates(self) -> list[Path]:
        if self.resume_mode == "never":
            return []
        if self.resume_mode == "auto":
            return resume_candidates(self.out_dir)
        path = on_disk(self.resume_mode)  # (checkpoints/step-N as written: step-0000000N)
        named = self._resume_named(path)
        if path.exists() and not path.is_dir():  # (it was told "no such checkpoint directory", as a missing one is)
            raise ConfigError(f"{named} is a file: name a checkpoint directory (OUT/checkpoints/step-N)")
        if not path.is_dir():
            raise ConfigError(f"{named}: no such checkpoint directory")
        if not (path / RESUMABLE_STATE).exists() and (path / CHECKPOINTS_DIR).is_dir():
            newest = resume_candidates(path)
            raise ConfigError(
                f"{named} is a run directory: name one of its checkpoints"
                + (f" (the newest: {newest[0]})" if newest else f" (it has none in {path / CHECKPOINTS_DIR})")
            )
        if not (path / RESUMABLE_STATE).exists() and is_model_dir(path):
            start = f"--init {path} starts a new run from it" if self.cli else "a new run starts from it as its model"
            raise ConfigError(
                f"{named} is a model (weights without the optimizer and data state): {start}; "
                f"{'--resume' if self.cli else 'resume'} takes a run's checkpoints/step-N"
            )
        return [path]

    @property
    def explicit(self) -> bool:
        """Resuming from one named checkpoint (``--resume PATH``), not the newest of this directory's."""
        return self.resume_mode not in ("auto", "never")

    def _check_fork(self) -> None:
        """``--resume PATH`` with PATH outside ``OUT/checkpoints`` (a fork of another run's checkpoint) into an OUT
        that already holds checkpoints of its own (the fork was stopped, and the same command given again) is refused:
        it would go back to PATH, run the fork's steps again over its own metrics rows and best/. So is a fork into an
        OUT that holds a finished run (``final/``) and no checkpoint, as a resume without ``--resume`` refuses it: the
        fork replaced its final/ and summary, and kept the rest of its results beside them (SFT's stage-K/). A rewind
        to one of OUT's own checkpoints stays allowed."""
        own = resume_candidates(self.out_dir)
        if self.candidates[0].resolve().is_relative_to((self.out_dir / CHECKPOINTS_DIR).resolve()):
            return
        named = self._resume_named(self.candidates[0])
        if own:
            raise ConfigError(
                f"{named} is another run's checkpoint, and {self.out_dir / CHECKPOINTS_DIR} holds this run's own (the "
                f"newest: {own[0].name}): {self._option(*DROP_RESUME)} to continue from {own[0]}, or name a new "
                f"{self._option(*NEW_OUT)} (or remove {self.out_dir / CHECKPOINTS_DIR}) to start from "
                f"{self.candidates[0]}"
            )
        if (self.out_dir / FINAL_DIR).is_dir():
            raise ConfigError(
                f"{named} is another run's checkpoint, and {self.out_dir} holds a finished run ({FINAL_DIR}/, its "
                f"model) and no checkpoint: name a new {self._option(*NEW_OUT)} to start from {self.candidates[0]} "
                "(the fork would write over that run's results)"
            )

    def refuse_recorded(self, ckpt: Path | None, what: str, keep: str) -> NoReturn:
        """The refusal of a resume from ``ckpt`` on what the config does not hold but the checkpoint recorded (the
        training data, a reward given from Python), changed since (``what``: how; ``keep``: what to resume with)."""
        never, allow = self._option(*START_OVER), self._option(*ALLOW_CHANGE)
        raise ConfigError(f"{ckpt} was {what}: resume with {keep}, start over with {never}, or pass {allow} to go on")

    def _changed_keys(self, old: dict) -> list[str]:
        """The keys a resume compares that differ between ``old`` and this run's config: not those this command never
        reads, nor the built-in model's shape when the run loads a model."""
        unread = UNREAD_BY.get(self.command, ())
        loads = self.cfg.get("model", {}).get("name_or_path") != BUILTIN
        if isinstance(old.get("data"), dict):  # (dgrpo up to 2026-12-04 recorded data paths as typed: relative ones
            old = {**old, "data": absolute_data_specs(old["data"])}  # name, from here, what this run reads)
        return [
            k
            for k in config_diff(old, self.cfg)
            if not k.startswith(unread) and not (loads and k in BUILTIN_SHAPE_KEYS) and k not in self.ignored
        ]

    def _check_command(self) -> None:
        """Refuse another command's checkpoints (an SFT run's directory given to ``dgrpo grpo``, or the reverse):
        they are not damaged, and starting over there would delete them."""
        self._refuse_command(next((c for c in map(checkpoint_command, self.candidates) if c is not None), None))

    def _check_owned(self) -> None:
        """Refuse an ``--out`` holding what no dgrpo run wrote, under the lock (its file removed on a refusal, when
        this run made it: nothing is left there) and before anything else is written there: a model directory
        (config.json beside its weights: a run would write its config.json over the model's, and a later
        ``--model`` would mean its final/), a config.json that is not a dgrpo run's, final/, best/ or stage-K/
        folders that are not dgrpo checkpoints, or other things in checkpoints/ than a run leaves there
        (:func:`~.checkpoint.foreign_entries`: a run replaces those folders, and ``--resume never`` deletes them)."""
        out = self.out_dir
        if not out.is_dir():
            return
        new, named = f"name a new {self._option(*NEW_OUT)}", f"--out {out}" if self.cli else f"out_dir {out}"
        if is_model_dir(out):
            raise ConfigError(f"{named} is a model directory (config.json beside its weights): {new}")
        config = out / CONFIG_FILE
        if config.is_file() and not is_run_config(config):
            if list_checkpoints(out):  # (a run's, its config.json damaged: a new --out would lose the run)
                raise ConfigError(
                    f"{named}: its {CONFIG_FILE} is not a dgrpo run's config, beside the run's checkpoints: if it "
                    f"was damaged, delete it to resume (the newest checkpoint's model/{RUN_CONFIG_FILE}, the config "
                    f"it was trained with, is then the run's); else {new}"
                )
            raise ConfigError(f"{named}: its {CONFIG_FILE} is not a dgrpo run's config: {new}")
        stages = stage_dirs(out)
        for folder in [out / FINAL_DIR, out / BEST_DIR, *stages]:
            if folder.exists() and not (folder / MANIFEST).is_file():
                raise ConfigError(f"{named}: {folder} is not a checkpoint dgrpo wrote (no {MANIFEST}): {new}")
        root = out / CHECKPOINTS_DIR
        stray = foreign_entries(out)
        if stray:
            raise ConfigError(f"{named}: {root} holds {first_items(stray)}, not dgrpo checkpoints: {new}")
        signs = [config, out / FINAL_DIR, out / BEST_DIR, root, *stages]
        if not any(p.exists() for p in signs) and not is_run_metrics(out / METRICS_FILE):
            names = [name for name in (*RUN_WRITES, METRICS_FILE) if (out / name).exists()]
            if names:
                raise ConfigError(
                    f"{named} holds {', '.join(names)} but no dgrpo run (no {CONFIG_FILE}, no checkpoint, no metrics "
                    f"rows of one): a run writes over files of those names and {self._option(*START_OVER)} deletes "
                    f"them: {new}"
                )

    def _owned(self) -> bool:
        """Whether OUT holds nothing but a run's files (:meth:`_check_owned` passes): the checks made before the lock
        is taken of what starting over would delete are made only then, so that a folder no dgrpo run wrote (or a run
        at work there, mid-change) is answered as RunDir answers it under the lock."""
        try:
            self._check_owned()
        except ConfigError:
            return False
        return True

    def _check_not_finished(self) -> None:
        """A finished run (final/) whose checkpoints are gone (deleted to save space) is not trained again from step 0
        over its results, under the same config or a changed one, without being asked; another command's finished run
        is refused as such (``--resume never`` would be refused too)."""
        if (self.out_dir / FINAL_DIR).is_dir():
            self._refuse_command(self._written_by())
            raise ConfigError(
                f"{self.out_dir} holds a finished run ({FINAL_DIR}/) and no checkpoint to resume: its model is "
                f"{self.out_dir / FINAL_DIR}; to train it again, {self._option(*START_OVER)} (removes its results) or "
                f"a new {self._option(*NEW_OUT)}"
            )

    def _check_restart(self) -> list[str]:
        """The keys an unfinished run without a checkpoint (``config.json``, no checkpoint to resume) was started
        with differently ([] when none, or no config.json): it starts over under this config, removing what it wrote
        (:meth:`~.run.RunDir._warn_if_restarted_under_another_config`), which is refused for another command's run,
        the model this run starts from, a user's copies in OUT/checkpoints and another user's folders."""
        path = self.out_dir / CONFIG_FILE
        if not path.is_file():
            return []
        changed = self._changed_keys(self._read_config(path))
        if changed:
            self._refuse_starting_over(f"starting {self.out_dir}'s unfinished run over under another config")
        return changed

    def _check_start_over(self) -> None:
        """``--resume never`` deletes what an earlier run wrote here: refused as :meth:`_refuse_starting_over` says."""
        self._refuse_starting_over(self._option(*START_OVER))

    def _refuse_starting_over(self, what: str) -> None:
        """ConfigError when ``what`` (``--resume never``, a restart under another config) would delete what it may
        not: another command's run (its checkpoints say whose it is), the model this run starts from (``--init``
        inside OUT), a user's copies in OUT/checkpoints, or a folder another user owns."""
        self._refuse_command(self._written_by())
        self._refuse_deleting_init(what)
        self._refuse_deleting_copies(what)
        self._refuse_undeletable(what)

    def _refuse_deleting_init(self, what: str) -> None:
        """ConfigError when the model this run starts from (``--init``) is inside OUT, which ``what`` would empty."""
        init = Path(str(self.cfg.get("model", {}).get("name_or_path", "")))
        if init.is_absolute() and init.resolve().is_relative_to(self.out_dir.resolve()):
            raise ConfigError(
                f"{what} would delete {init}, the model this run starts from{' (--init)' if self.cli else ''}: name "
                f"another {self._option(*NEW_OUT)}"
            )

    def _refuse_deleting_copies(self, what: str) -> None:
        """ConfigError when ``what`` would delete a user's copies kept in OUT/checkpoints
        (:func:`~dgrpo.run_layout.checkpoint_copies`: ``step-00000012-copy/``, a folder holding a checkpoint's
        state.json), which the start's checks let stay there (``--resume`` may name one): they went with the earlier
        run's checkpoints without a word."""
        copies = checkpoint_copies(self.out_dir)
        if copies:
            root = self.out_dir / CHECKPOINTS_DIR
            raise ConfigError(
                f"{what} would delete {first_items(copies)} in {root}, kept beside the run's checkpoints (no "
                f"checkpoint a run wrote): move them out of {root} first, or name another {self._option(*NEW_OUT)}"
            )

    def _earlier_writes(self) -> list[Path]:
        """What an earlier run wrote here that :meth:`_start_over` removes."""
        found = [self.out_dir / name for name in RUN_WRITES if (self.out_dir / name).exists()]
        return found + stage_dirs(self.out_dir) + config_history(self.out_dir)

    def _refuse_undeletable(self, what: str) -> None:
        """ConfigError when ``what`` would fail partway through removing the earlier run's files (a folder of them
        another user's: :func:`~.out_dir.check_removable`), before anything is removed."""
        for path in self._earlier_writes():
            check_removable(path, what, self._option(*NEW_OUT))

    def _written_by(self) -> str | None:
        """Which command (``sft``, ``grpo``) wrote the run in OUT: its checkpoints say, else (none left) what only
        one command writes (SFT's stage-K/, GRPO's summary and rollouts), else its metrics rows (SFT's name their
        curriculum stage, GRPO's their reward); None when nothing says."""
        out = self.out_dir
        found = next((c for c in map(checkpoint_command, resume_candidates(out)) if c is not None), None)
        if found is None and any(p.is_dir() for p in stage_dirs(out)):
            found = "sft"
        if found is None and ((out / SUMMARY_FILE).is_file() or (out / ROLLOUTS_FILE).is_file()):
            found = "grpo"
        try:
            lines = (out / METRICS_FILE).read_text().splitlines() if found is None else []
        except OSError:
            lines = []
        for line in lines:
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and ("reward_mean" in row or "stage" in row):
                return "grpo" if "reward_mean" in row else "sft"
        return found

    def _refuse_command(self, found: str | None) -> None:
        """ConfigError when ``found`` (the command that wrote the checkpoints or run here) is not this one."""
        if found is None or found == self.command:
            return
        where = f"{self._resume_named(self.candidates[0])} is" if self.explicit else f"{self.out_dir} holds"
        source = self.candidates[0] if self.explicit else self.out_dir  # (a named checkpoint, or this run's)
        start = (
            f"; to start from its model: {self._init_named(source)}" if (found, self.command) == ("sft", "grpo") else ""
        )
        what = "run's checkpoint" if self.explicit or resume_candidates(self.out_dir) else "run"
        deletes = f" ({self._option(*START_OVER)} would delete it)" if self.resume_mode == "never" else ""
        # (a checkpoint named by --resume is another run's, not this --out's: the --out is not what to change)
        advice = self._option(*DROP_RESUME) if self.explicit else f"name a new {self._option(*NEW_OUT)}"
        raise ConfigError(
            f"{where} a `dgrpo {found}` {what}, which `dgrpo {self.command}` cannot resume{deletes}: {advice}{start}"
        )

    def _started_with(self) -> dict | None:
        """The config the resumed run was started with: this directory's, else (a new directory resuming a named
        checkpoint, or a run whose config.json was deleted) the one the checkpoint to resume (the newest) was trained
        with."""
        path = self.out_dir / CONFIG_FILE
        if not path.is_file():
            path = self.candidates[0] / "model" / RUN_CONFIG_FILE
            if not path.is_file():
                return None
            if not self.explicit:
                self.log(f"dgrpo: {self.out_dir / CONFIG_FILE} is missing: checking the config against {path}")
        return self._read_config(path)

    @staticmethod
    def _read_config(path: Path) -> dict:
        """A config file's JSON (ConfigError when it cannot be read)."""
        try:
            found = json.loads(path.read_text())
        except (OSError, ValueError):
            raise ConfigError(f"{path}: unreadable (not the JSON of a config)") from None
        if not isinstance(found, dict):
            raise ConfigError(f"{path}: unreadable (not the JSON of a config)")
        return found

    def _check_config(self) -> None:
        """Refuse to resume under a changed config (unless allowed: then keep every config with its start step). A
        LoRA run's :data:`ADAPTER_KEYS` are left to :func:`~.checkpoint.check_same_adapter`, their change kept in the
        config history."""
        old = self._started_with()
        if old is None:
            return
        changed = self._changed_keys(old)
        what = f"{self._resume_named(self.candidates[0])} is from" if self.explicit else f"{self.out_dir} holds"
        self._check_same_kind_of_training(old, what)
        self._check_same_master_weights(old, what)
        self._check_sharded_masters_keep_dtype(old, what)
        refused = [k for k in changed if not (self.cfg["model"]["lora"]["r"] and k in ADAPTER_KEYS)]
        if refused and not self.allow_config_change:
            then = old.get("model", {}).get("revision") if "model.revision" in refused else None
            pin = f" (the run loaded its model at commit {then}: {self._set('model.revision', then)})" if then else ""
            never, allow = self._option(*START_OVER), self._option(*ALLOW_CHANGE)
            raise ConfigError(
                f"{what} a run started with a different config ({first_items(refused, 8)}); resume it "
                f"unchanged{pin}, start over with {never}, or pass "
                f"{allow} to continue with the new values (every config used is kept)"
            )
        self.changed = changed
        self.first_config = old

    def _check_same_kind_of_training(self, old: dict, what: str) -> None:
        """A LoRA run's checkpoints hold its adapter, a full run's the whole model: a resume that switches
        ``model.lora.r`` between 0 and more is refused in one line, even with allow_config_change (its checkpoints
        were skipped one by one as damaged, and the line advised --resume never)."""
        then = int(old.get("model", {}).get("lora", {}).get("r", 0) or 0)
        now = int(self.cfg.get("model", {}).get("lora", {}).get("r", 0) or 0)
        if (then > 0) == (now > 0):
            return
        trained = f"a LoRA adapter (model.lora.r={then})" if then else "every weight (model.lora.r=0)"
        held = "the adapter" if then else "the whole model"
        raise ConfigError(
            f"{what} a run that trains {trained}, and its checkpoints hold {held}: resume it with model.lora.r={then} "
            f"(to train {'every weight' if then else 'an adapter'} from it, start a new run with {self._init_named()} "
            "on its final/ or a checkpoint)"
        )

    def _check_sharded_masters_keep_dtype(self, old: dict, what: str) -> None:
        """A run under ``fsdp: sharded`` with ``model.master_weights`` keeps its float32 masters in its checkpoints'
        shards (``dcp/``), which a resume at another ``model.dtype`` does not carry over as a whole checkpoint's are
        (:func:`~.checkpoint.read_checkpoint`: the bf16 weights' rounding, or masters the shards lack): refused, even
        with allow_config_change."""
        model = old.get("model", {})
        then, now = (c.get("model", {}).get("dtype", "float32") for c in (old, self.cfg))
        if old.get("fsdp") != "sharded" or not model.get("master_weights", False) or then == now:
            return
        raise ConfigError(
            f"{what} a run under fsdp: sharded with model.master_weights=true, whose checkpoints keep the float32 "
            f"masters in their shards, which are not carried to another model.dtype: resume it with "
            f"model.dtype={then} (to train on in {now}, start a new run with {self._init_named()} on its final/ or a "
            "checkpoint)"
        )

    def _check_same_master_weights(self, old: dict, what: str) -> None:
        """A bf16 run's checkpoints hold float32 masters in their optimizer state, or none: switching
        ``model.master_weights`` on resume is refused, even with allow_config_change (masters made before the
        checkpoint loaded, or left from it, would put the weights back where they stood)."""
        then, now = (bool(c.get("model", {}).get("master_weights", False)) for c in (old, self.cfg))
        dtypes = {c.get("model", {}).get("dtype", "float32") for c in (old, self.cfg)}
        if then == now or dtypes == {"float32"}:
            return
        raise ConfigError(
            f"{what} a run with model.master_weights={str(then).lower()}, and its checkpoints' optimizer state holds "
            f"{'float32 masters' if then else 'no masters'}: resume it with model.master_weights={str(then).lower()} "
            f"(to train on with the other setting, start a new run with {self._init_named()} on its final/ or a "
            "checkpoint)"
        )
