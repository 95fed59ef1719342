"""Plots of finished (or running, or killed) run directories: read ``config.json`` + ``metrics.jsonl``, group the
runs into arms, draw the per-arm mean over seeds with a min-max band, one panel per metric.

matplotlib (Agg canvas, no pyplot state) is imported inside the drawing functions, so importing this module is cheap.
"""

from __future__ import annotations

import json
import math
import os
import re
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from .data.records import DataError
from .paths import expand_home
from .run_layout import CONFIG_FILE, METRICS_FILE
from .text import first_items

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

FORMATS = (".png", ".pdf", ".svg")

#: panel name -> (metrics key, y-axis label, panel title); the eval key is resolved per run
PANELS: dict[str, tuple[str, str, str]] = {
    "eval": ("eval", "validation accuracy (greedy, no dropout)", "accuracy during training"),
    "reward_std": ("reward_std", "within-group reward std", "rollout diversity within groups"),
    "reward_mean": ("reward_mean", "mean rollout reward", "rollout reward"),
    "kept": ("frac_groups_kept", "fraction of groups kept", "groups with a learning signal"),
    "distinct": ("distinct_answers", "distinct answers per group", "answer diversity within groups"),
}

#: the x axis of a GRPO run's panels (its ``step``: a GRPO step) and of an SFT run's validation curve (its ``step``:
#: the optimizer steps so far); one axis never holds both (1000 SFT steps beside 200 GRPO steps squash the latter)
GRPO_AXIS = "GRPO step"
SFT_AXIS = "SFT optimizer step"
#: the panel of the SFT groups' validation accuracy in a figure with GRPO groups too (their own x axis)
SFT_EVAL = "eval_sft"

#: a panel of one reward part a run logs (``reward/<name>``: each part of ``grpo.rewards``, unweighted)
REWARD_PART = "reward/"

#: the fixed colours of the well-known arms (keys: the label lower-cased, letters and digits only)
ARM_COLORS = {
    "deterministic": "#7f7f7f",
    "reinforceema": "#d62728",
    "reinforce": "#d62728",
    "tokensampling": "#ff7f0e",
    "dropoutgrpo": "#1f77b4",
    "sft": "#000000",
}
#: colours for every other group, in order (tab10 without the fixed ones)
OTHER_COLORS = ("#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf")
REFERENCE_STYLES = (("#000000", "--"), ("#555555", (0, (6, 3))), ("#555555", (0, (2, 2))), ("#555555", "-."))

_SEED_NAME = re.compile(r"(?:seed|s)[-_=]?\d+|sft\d+[-_]rl\d+", re.IGNORECASE)  # (the demo's: sftK_rlJ)
_SEED_SUFFIX = re.compile(r"(?:[-_. ]+(?:seed|s)|seed)[-_=]?\d+$", re.IGNORECASE)


@dataclass
class Run:
    """One run directory: its resolved config and its metrics rows (training steps and evaluations apart)."""

    path: Path
    name: str
    config: dict[str, Any] = field(default_factory=dict)
    steps: list[dict[str, Any]] = field(default_factory=list)
    evals: list[dict[str, Any]] = field(default_factory=list)

    @property
    def is_grpo(self) -> bool:
        """Whether this is a GRPO run: it logged GRPO steps (rows with a rollout reward), or none of its rows has
        SFT's curriculum ``stage`` (a GRPO run still in its first step has only its step-0 evaluation)."""
        rows = [*self.steps, *self.evals]
        return any("reward_mean" in r for r in self.steps) or not any("stage" in r for r in rows)


class _NoRows(DataError):
    """A run directory whose ``metrics.jsonl`` holds no row yet (a run that crashed at start)."""


# ------------------------------------------------------------------------ reading runs
def _is_eval_key(key: str) -> bool:
    return key.startswith("eval/") and key.endswith("/accuracy")


#: what an eval panel may draw of a validation set: ``eval/<name>/accuracy`` (each run's first, by default) or
#: ``eval/<name>/mean_score`` (a partial-credit scorer's mean, named by ``--eval-key``)
EVAL_METRICS = ("accuracy", "mean_score")


def _eval_parts(key: str) -> tuple[str, str]:
    """(the set's name, the metric) of an eval column ``eval/<name>/<metric>``."""
    name, _, metric = key.removeprefix("eval/").rpartition("/")
    return name, metric


def _is_test_key(key: str) -> bool:  # the test sets' accuracies of the run's last row (not plotted)
    return key.startswith(("test/", "test_best/")) and key.endswith("/accuracy")


def _is_best_key(key: str) -> bool:  # SFT's new-best-epoch row (best_epoch, best/valid/accuracy): no training row
    return key == "best_epoch" or (key.startswith("best/") and key.endswith("/accuracy"))


def _is_training_row(row: dict[str, Any]) -> bool:
    """A training row: none of the evaluation, test or best keys, and not SFT's stage-end row (``n_latent``), which has
    no accuracy without a validation set."""
    return "n_latent" not in row and not any(_is_eval_key(k) or _is_test_key(k) or _is_best_key(k) for k in row)


def _read_rows(metrics: Path) -> list[dict[str, Any]]:
    """The rows of ``metrics.jsonl``; an unreadable last line (a killed run) is skipped, one elsewhere is an error."""
    try:
        text = metrics.read_text(errors="replace")
    except OSError as e:  # (no permission: a traceback)
        raise DataError(f"{metrics}: cannot read it ({e.strerror or e})") from None
    lines = [(i, ln) for i, ln in enumerate(text.splitlines(), 1) if ln.strip()]
    rows = []
    for i, line in lines:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        if not isinstance(row, dict):
            if i == lines[-1][0]:
                continue
            raise DataError(f"{metrics}:{i}: not a JSON object row")
        if "step" in row:
            rows.append(row)
    return rows


def load_run(path: str | Path) -> Run:
    """Read one run directory; a :class:`DataError` naming it when it has no ``metrics.jsonl`` or no readable row."""
    p = Path(path)
    metrics = p / METRICS_FILE
    if not metrics.is_file():
        raise DataError(f"{p}: no {METRICS_FILE} (not a run directory)")
    rows = _read_rows(metrics)
    if not rows:
        raise _NoRows(f"{metrics}: no readable rows")
    config: dict[str, Any] = {}
    if (p / CONFIG_FILE).is_file():
        try:
            config = json.loads((p / CONFIG_FILE).read_text())
        except json.JSONDecodeError as e:
            raise DataError(f"{p / CONFIG_FILE}: not valid JSON ({e.msg}, line {e.lineno})") from None
        except UnicodeDecodeError as e:  # (a damaged file: a traceback)
            raise DataError(f"{p / CONFIG_FILE}: not UTF-8 text (byte {e.start})") from None
        except OSError as e:
            raise DataError(f"{p / CONFIG_FILE}: cannot read it ({e.strerror or e})") from None
    evals = [r for r in rows if any(_is_eval_key(k) for k in r)]
    steps = [r for r in rows if _is_training_row(r)]
    return Run(
        path=p, name=_shown_path(p).name, config=config if isinstance(config, dict) else {}, steps=steps, evals=evals
    )


def _shown_path(path: Path) -> Path:
    """The absolute path a run is named by: the name it was given or found under (a link's own name: ``cmp/p01_seed0``
    linked to ``store/run_17`` is ``p01_seed0``, not ``run_17``), in the real folder it sits in; ``..`` read as
    written."""
    given = Path(os.path.abspath(expand_home(path)))
    return given.parent.resolve() / given.name if given.name else given.resolve()


def _runs_below(root: Path) -> list[Path]:
    """The directories below ``root`` that hold ``metrics.jsonl``, sorted; links to directories are followed (a
    folder of links to the runs compared: ``Path.rglob`` skipped them, and the folder had 'no metrics.jsonl below
    it'), each real directory once (a link to a folder above ends there), under its own name where a link beside it
    names it too (``latest -> grpo_seed1``: found first, it named the run ``latest``, out of its arm ``grpo``)."""
    found: dict[Path, Path] = {}
    seen: set[Path] = set()
    for folder, subfolders, _ in os.walk(root, followlinks=True):
        path, real = Path(folder), Path(folder).resolve()
        if real in seen:
            subfolders[:] = []
            if real in found and found[real].is_symlink() and not path.is_symlink():
                found[real] = path
            continue
        seen.add(real)
        if (path / METRICS_FILE).is_file():
            found[real] = path
    return sorted(found.values())


def find_runs(paths: Sequence[str | Path]) -> list[Path]:
    """Run directories: each path that holds ``metrics.jsonl``, else every directory below it that does; a directory
    named twice (``runs/a`` and ``$PWD/runs/a``, ``runs/x/../a``, a link to it) once, as first named. A leading ``~``
    is the home folder (``--label "A=~/runs/a,~/runs/b"``: the shell expands no ``~`` after a comma)."""
    found: list[Path] = []
    seen: set[Path] = set()
    for path in paths:
        p = expand_home(path)
        if p.is_file():  # (metrics.jsonl itself, say: it was told 'no such directory', as a missing path is)
            raise DataError(f"{p}: a file, not a directory (name the run directory that holds {METRICS_FILE})")
        if not p.is_dir():
            raise DataError(f"{p}: no such directory")
        if (p / METRICS_FILE).is_file():
            below = [p]
        else:
            below = _runs_below(p)
        if not below:
            raise DataError(f"{p}: no {METRICS_FILE} in it or in any directory below it")
        for b in below:
            if b.resolve() not in seen:  # (twice, it was averaged with itself: "mean of 2 seeds" of one run)
                seen.add(b.resolve())
                found.append(b)
    return found


def _load_found(dirs: Sequence[Path], others: int = 0) -> list[Run]:
    """The runs of ``dirs`` (:func:`find_runs`'s); one with no row yet (a run that crashed at start) is skipped with
    a warning naming it, unless no run is left (none in ``dirs``, and no ``others`` already loaded): its error."""
    runs: list[Run] = []
    empty: list[DataError] = []
    for d in dirs:
        try:
            runs.append(load_run(d))
        except _NoRows as e:
            empty.append(e)
    if empty and not runs and not others:
        raise empty[0]
    for error in empty:
        warnings.warn(f"skipped {error} (a run that stopped before logging a step?)", stacklevel=3)
    return runs


# ------------------------------------------------------------------------ grouping
def _config_get(config: Mapping[str, Any], dotted: str, default: Any = None) -> Any:
    if dotted in config:
        return config[dotted]
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node


def strip_seed(name: str) -> str | None:
    """``name`` without a trailing seed (``x_seed0``, ``x-s1``, ``x-seed-2`` -> ``x``); None when it has none."""
    m = _SEED_SUFFIX.search(name)
    stem = name[: m.start()].rstrip("-_. ") if m else ""
    return stem or None


def config_label(run: Run) -> str:
    """The arm a run's config describes: SFT, null control, REINFORCE + EMA, Dropout-GRPO, token sampling or
    deterministic."""
    if not run.is_grpo:
        return "SFT"
    kind = _config_get(run.config, "perturbation.kind")
    if _config_get(run.config, "grpo.shuffle_rewards"):
        return "null control"
    if _config_get(run.config, "grpo.advantage") == "ema":
        return "REINFORCE + EMA"
    if kind in ("locked", "native", "gaussian"):
        return "Dropout-GRPO"
    if kind == "none":
        temperature = _number(_config_get(run.config, "grpo.temperature")) or 0.0
        return "token sampling" if temperature > 0 else "deterministic"
    return run.name


class _Named(NamedTuple):
    """What a run's directory names say: its arm, its seed's numbers, and its place (its path without the seed); or,
    for a run whose names say none (:func:`_automatic_groups`), the arm its config gives, no seed, and its path."""

    arm: str
    seed: tuple[int, ...] | None
    place: Path


def _seed_numbers(name: str) -> tuple[int, ...]:
    """The numbers in a seed's name (``seed0``, ``s0``, ``_seed-0``: (0,); the demo's ``sft1_rl0``: (1, 0))."""
    return tuple(int(d) for d in re.findall(r"\d+", name))


def _named(run: Run) -> _Named | None:
    """Steps 1-3 of :func:`arm_of`, and where the arm sits: the run's path with its seed left out
    (``a/grpo`` of ``a/grpo_seed0``, ``a/arm`` of ``a/arm/seed0``, ``a/dropout`` of ``a/seed0/dropout``); None when
    the run's names say nothing."""
    path = _shown_path(run.path)
    parent = path.parent
    if _SEED_NAME.fullmatch(run.name) and parent.name:
        return _Named(strip_seed(parent.name) or parent.name, _seed_numbers(run.name), parent)
    if _SEED_NAME.fullmatch(parent.name):
        arm = strip_seed(run.name) or run.name
        return _Named(arm, _seed_numbers(parent.name), parent.parent / arm)
    stem, m = strip_seed(run.name), _SEED_SUFFIX.search(run.name)
    return None if stem is None or m is None else _Named(stem, _seed_numbers(m.group()), parent / stem)


def named_arm(run: Run) -> str | None:
    """The group a run's directory names (steps 1-3 of :func:`arm_of`), or None when its name says nothing."""
    named = _named(run)
    return None if named is None else named.arm


def arm_of(run: Run) -> str:
    """The group a run belongs to, alone (:func:`group_runs` refines it by the other runs: :func:`_automatic_groups`).

    1. A run directory named like a seed (``seed0``, ``s1``, ``seed-2``, the demo's ``sft0_rl1``; case-insensitive)
       is grouped by its parent's name (``runs/demo/arms/dropout_grpo/sft0_rl0`` -> ``dropout_grpo``).
    2. A run whose parent is named like a seed (``runs/seed0/dropout``) is grouped by its own name.
    3. A name ending in a seed suffix (``seed0``, ``s0`` after a separator, ``-seed-2``, ...) is grouped by the name
       without it, so ``dropout_seed0`` and ``dropout_seed1`` form the group ``dropout``.
    4. Otherwise the config decides (:func:`config_label`): ``deterministic`` (perturbation.kind none, temperature
       0), ``token sampling`` (kind none, temperature > 0), ``null control`` (grpo.shuffle_rewards),
       ``REINFORCE + EMA`` (grpo.advantage ema), ``Dropout-GRPO`` (kind locked / native / gaussian), ``SFT`` (no GRPO
       rows).

    In steps 1-3 a remaining seed suffix is stripped too. Explicit groups (:func:`group_runs`) override all this.
    """
    return named_arm(run) or config_label(run)


#: config keys that do not make two runs different arms (the seed, and where and how a run was executed)
_NOT_ARM_KEYS = ("seed", "threads", "device", "logging")


def _setting(run: Run) -> str:
    """The run's config without the keys that may differ between seeds of one arm."""
    return json.dumps({k: v for k, v in run.config.items() if k not in _NOT_ARM_KEYS}, sort_keys=True, default=str)


def _own_names(paths: Sequence[Path]) -> dict[Path, str]:
    """Each path's shortest tail that no other path ends in: its name, with its parent's where two share a name, and
    so on (``sweep/lr1e-4/out/grpo`` and ``sweep/lr1e-5/out/grpo``: ``lr1e-4/out/grpo``, ``lr1e-5/out/grpo``; with
    the parent's only, both were ``out/grpo``: one group, two settings averaged)."""
    names: dict[Path, str] = {}
    for p in paths:
        depth = 1
        while depth < len(p.parts) and any(q != p and q.parts[-depth:] == p.parts[-depth:] for q in paths):
            depth += 1
        names[p] = "/".join(p.parts[-depth:]).removeprefix("/")
    return names


def _other_experiments(members: Sequence[tuple[Run, _Named]]) -> bool:
    """Whether the runs one automatic name groups are other experiments, not seeds of one: they sit at two or more
    places (``a/grpo_seed0`` and ``b/grpo_seed0``: places ``a/grpo``, ``b/grpo``), and two places hold the same seed
    (a run twice: another experiment, or a copy) or other settings (config keys that tell them apart:
    :func:`_keys_apart`). Seeds at one place are one arm's even where their configs differ (the demo's: each started
    from its SFT seed's checkpoint), and so are seeds at two places that differ only so."""
    if len({named.place for _, named in members}) < 2:
        return False
    where: dict[tuple[int, ...], Path] = {}
    if any(n.seed is not None and where.setdefault(n.seed, n.place) != n.place for _, n in members):
        return True
    return bool(_keys_apart([(named.place, run) for run, named in members]))


def _automatic_groups(runs: Sequence[Run]) -> dict[str, list[Run]]:
    """The runs by :func:`arm_of`, refined: a config label of several settings (a run without a config is one of its
    own) names each run by its path (:func:`_own_names`), and a name whose runs are other experiments
    (:func:`_other_experiments`) is split by their places, each group named by the shortest tail of its place that
    tells it apart (``a/grpo``, ``b/grpo``)."""
    found = [(run, _named(run), _shown_path(run.path)) for run in runs]
    settings: dict[str, set[str]] = {}
    for run, named, _ in found:  # (a run without a config: a setting of its own, not known to be another's seed)
        if named is None:
            settings.setdefault(config_label(run), set()).add(_setting(run) if run.config else str(run.path.resolve()))
    own = _own_names([shown for _, _, shown in found])
    members: dict[str, list[tuple[Run, _Named]]] = {}
    for run, named, shown in found:
        if named is None:
            label = config_label(run)
            named = _Named(label if len(settings[label]) == 1 else own[shown], None, shown)
        members.setdefault(named.arm, []).append((run, named))
    split = {arm for arm, group in members.items() if _other_experiments(group)}
    places = [named.place for arm in split for _, named in members[arm]]
    place_names = _own_names(list(dict.fromkeys([*places, *own])))
    out: dict[str, list[Run]] = {}
    for arm, group in members.items():
        for run, named in group:
            out.setdefault(place_names[named.place] if arm in split else arm, []).append(run)
    return out


def group_runs(runs: Sequence[Run], groups: Mapping[str, Sequence[str | Path]] | None = None) -> dict[str, list[Run]]:
    """Runs by arm (:func:`arm_of`); ``groups`` (name -> run directories, or directories holding runs) overrides it.

    Runs grouped by their config (step 4 of :func:`arm_of`) stay one group only when their configs agree but for
    the seed (and threads, device, logging): runs of one label that differ in anything else (a learning-rate sweep
    of Dropout-GRPO, say) are shown one by one, each under its directory's name (with its parents' where others share
    it: :func:`_own_names`), not averaged into one line. Runs that one name groups but that sit in other folders
    (``a/grpo_seed0`` and ``b/grpo_seed0``) stay one group where they are seeds of one setting, and are split by
    folder (``a/grpo``, ``b/grpo``) where they are other experiments: a seed twice, or other settings
    (:func:`_other_experiments`). A name of ``groups`` that the other runs' grouping gives too is a DataError (the
    two groups were drawn as one). A name of ``groups`` is one group, drawn as one mean over all its runs, with a
    warning where they are of other settings (:func:`_warn_if_a_label_mixes_settings`).
    The named groups come first, in the given order, then the other runs' arms in order of first appearance."""
    by_path = {r.path.resolve(): r for r in runs}
    out: dict[str, list[Run]] = {}
    taken: set[Path] = set()
    for name, paths in (groups or {}).items():
        found = find_runs(paths)
        fresh = [p for p in found if p.resolve() not in by_path]
        loaded = {r.path.resolve(): r for r in _load_found(fresh, others=len(found) - len(fresh))}
        for p in found:
            key = p.resolve()
            run = by_path.get(key) or loaded.get(key)
            if run is not None:
                out.setdefault(name, []).append(run)
                taken.add(key)
    automatic = _automatic_groups([run for run in runs if run.path.resolve() not in taken])
    _refuse_labels_named_as_automatic_groups(groups or {}, automatic)
    for name, members in out.items():
        _warn_if_a_label_mixes_settings(name, members)
    return {**out, **automatic}


def _flat_setting(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """A config's values (as JSON) by dotted key, without the keys that may differ between seeds (:func:`_setting`)."""
    flat: dict[str, str] = {}
    for key, value in config.items():
        if prefix or key not in _NOT_ARM_KEYS:
            if isinstance(value, Mapping) and value:
                flat.update(_flat_setting(value, f"{prefix}{key}."))
            else:
                flat[f"{prefix}{key}"] = json.dumps(value, sort_keys=True, default=str)
    return flat


def _warn_if_a_label_mixes_settings(name: str, runs: Sequence[Run]) -> None:
    """A warning when an explicit group's runs are of other settings (config keys tell them apart: :func:`_keys_apart`,
    as :func:`_other_experiments` reads them), naming those keys: the group is drawn as one mean over all its runs,
    as asked, but its band is then no seed spread."""
    if differ := _keys_apart([(_place(r), r) for r in runs]):
        settings = len({tuple(_flat_setting(r.config).get(k) for k in differ) for r in runs if r.config})
        shown = first_items(differ)
        warnings.warn(
            f"--label {name}: its {len(runs)} runs are {settings} settings (they differ in {shown}); drawn as one mean "
            "over them all: give each setting a --label of its own to draw them apart",
            stacklevel=3,
        )


def _keys_apart(placed: Sequence[tuple[Path, Run]]) -> list[str]:
    """The config keys (dotted: :func:`_flat_setting`) that tell runs (``(place, run)``: :func:`_place`) apart: those
    whose values differ between them, less those that differ between the seeds of one place (a seed's: the demo's
    ``model.name_or_path``, each seed started from its SFT seed's checkpoint); runs without a config not counted."""
    configs = [(place, _flat_setting(run.config)) for place, run in placed if run.config]
    seeds = _differing_keys((c, d) for p, c in configs for q, d in configs if p == q)
    return sorted(_differing_keys((c, d) for _, c in configs for _, d in configs) - seeds)


def _differing_keys(pairs: Iterable[tuple[Mapping[str, str], Mapping[str, str]]]) -> set[str]:
    """The keys whose values differ within any pair of flat configs (:func:`_flat_setting`)."""
    return {k for c, d in pairs for k in c.keys() | d.keys() if c.get(k) != d.get(k)}


def _place(run: Run) -> Path:
    """Where a run's arm sits (:func:`_named`): its path without the seed, or its own path when its names say none."""
    named = _named(run)
    return _shown_path(run.path) if named is None else named.place


def _refuse_labels_named_as_automatic_groups(
    groups: Mapping[str, Sequence[str | Path]], automatic: Mapping[str, Sequence[Run]]
) -> None:
    """DataError when an explicit group has the name :func:`group_runs` gives to other runs (``--label
    dropout=runs/x`` beside ``runs/dropout_seed0``): the two were drawn as one line, a mean over both, unsaid."""
    for name in groups:
        if name in automatic:
            others = automatic[name]
            shown = first_items([r.path for r in others], 2)
            how = "their folders' names" if any(_named(r) for r in others) else "their config"
            raise DataError(
                f"--label {name}: the other runs {shown} are grouped under that name too (by {how}); add them to the "
                "label to draw them as one group, or choose another name"
            )


# ------------------------------------------------------------------------ series
def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def _eval_key(run: Run, eval_key: str | None) -> str | None:
    """The eval column plotted for a run: the requested one, else the first the run logged. A requested dataset
    name matches the run's column of that name with or without a source prefix (``valid`` and ``builtin:valid``:
    the commands and the demo log ``eval/valid/accuracy``; a Python-API run, or one of an earlier dgrpo, may log
    ``eval/builtin:valid/accuracy``)."""
    logged = list(dict.fromkeys(k for r in run.evals for k in r if _is_eval_key(k)))
    if not eval_key:
        return logged[0] if logged else None
    wanted = eval_key if eval_key.startswith("eval/") else f"eval/{eval_key}/accuracy"
    if wanted in logged or eval_key.startswith("eval/"):
        return wanted
    short = eval_key.rsplit(":", 1)[-1]
    alike = [k for k in logged if k[len("eval/") : -len("/accuracy")].rsplit(":", 1)[-1] == short]
    return alike[0] if len(alike) == 1 else wanted


def _check_eval_key(runs: Sequence[Run], eval_key: str) -> None:
    """DataError when no run logged the requested eval column (a typo would draw an empty panel), naming those
    that were logged."""
    logged = {k for r in runs for row in r.evals for k in row if k.startswith("eval/")}
    names = ", ".join(sorted(k.removeprefix("eval/") for k in logged)) or "none"
    if eval_key.startswith("eval/") and _eval_parts(eval_key)[1] not in EVAL_METRICS:
        raise DataError(
            f"--eval-key {eval_key}: the eval panel draws eval/<name>/accuracy (or <name>) or eval/<name>/mean_score "
            f"(eval columns logged: {names})"
        )
    if not any(_eval_key(r, eval_key) in logged for r in runs):
        raise DataError(f"--eval-key {eval_key}: no run logged it (eval columns logged: {names})")


def _check_reward_parts(runs: Sequence[Run], panels: Sequence[str]) -> None:
    """DataError when no run logged a requested ``reward/<name>`` panel (a misspelt part would draw an empty panel),
    naming the parts that were logged."""
    logged = {k for r in runs for row in r.steps for k in row if k.startswith(REWARD_PART)}
    missing = [p for p in panels if p.startswith(REWARD_PART) and p not in logged]
    if missing:
        names = ", ".join(sorted(logged)) or "none (a run logs reward/<name> for each part of grpo.rewards)"
        raise DataError(f"no run logged {', '.join(missing)} (reward parts logged: {names})")


def _check_one_dataset_per_group(groups: Mapping[str, Sequence[Run]], eval_key: str | None) -> None:
    """DataError when the runs of one group would be averaged over different eval columns (each run's first: runs
    that validated on different data); ``--eval-key`` picks one for all (a run without it is left out)."""
    for name, runs in groups.items():
        by_key: dict[str, list[str]] = {}
        for r in runs:
            if (key := _eval_key(r, eval_key)) is not None and any(key in row for row in r.evals):
                by_key.setdefault(key.removeprefix("eval/").removesuffix("/accuracy"), []).append(r.name)
        if len(by_key) > 1:
            shown = "; ".join(f"{k} ({', '.join(v[:3])}{' ...' if len(v) > 3 else ''})" for k, v in by_key.items())
            raise DataError(
                f"{name}: its runs validated on different data ({shown}); their mean would mix them: pass "
                f"--eval-key with one of {', '.join(by_key)}"
            )


def _check_one_kind_per_group(groups: Mapping[str, Sequence[Run]]) -> None:
    """DataError when a group holds SFT and GRPO runs: its mean would average accuracies at SFT optimizer steps with
    ones at GRPO steps, which count different things."""
    for name, runs in groups.items():
        sft, grpo = [r.name for r in runs if not r.is_grpo], [r.name for r in runs if r.is_grpo]
        if sft and grpo:
            raise DataError(
                f"{name}: holds SFT runs ({', '.join(sft[:3])}) and GRPO runs ({', '.join(grpo[:3])}); their steps "
                "count different things (SFT optimizer steps, GRPO steps): give each its own group"
            )


def _is_sft_group(runs: Sequence[Run]) -> bool:
    return bool(runs) and not any(r.is_grpo for r in runs)


def axes_of(
    panels: Sequence[str], groups: Mapping[str, Sequence[Run]]
) -> list[tuple[str, str, dict[str, Sequence[Run]], str]]:
    """The figure's axes, in order: (key in the description, panel, the groups drawn, x-axis label). An SFT group's
    validation curve is over its optimizer steps, a GRPO group's over GRPO steps: with both kinds, ``eval`` draws
    the GRPO groups and :data:`SFT_EVAL`, next to it, the SFT groups; with SFT groups alone ``eval`` is over
    :data:`SFT_AXIS`. The other panels are GRPO's (rollout diagnostics), over :data:`GRPO_AXIS`."""
    axes: list[tuple[str, str, dict[str, Sequence[Run]], str]] = []
    for panel in panels:
        if panel != "eval":
            axes.append((panel, panel, dict(groups), GRPO_AXIS))
            continue
        sft = {n: runs for n, runs in groups.items() if _is_sft_group(runs)}
        grpo = {n: runs for n, runs in groups.items() if n not in sft}
        if grpo:
            axes.append(("eval", "eval", grpo, GRPO_AXIS))
        if sft:
            axes.append((SFT_EVAL if grpo else "eval", "eval", sft, SFT_AXIS))
    return axes


def _warn_if_scorers_differ(runs: Sequence[Run]) -> None:
    """A warning when the runs' accuracies were scored by different rules (``eval.scorer``): one panel would set
    numbers side by side that do not measure the same thing. Runs without a config are not counted."""
    from .config import EvalConfig

    by_scorer: dict[str, list[str]] = {}
    for r in runs:
        if r.config:
            by_scorer.setdefault(str(_config_get(r.config, "eval.scorer", EvalConfig().scorer)), []).append(r.name)
    if len(by_scorer) > 1:
        shown = "; ".join(f"{scorer} ({first_items(names)})" for scorer, names in by_scorer.items())
        warnings.warn(
            f"the eval panel sets side by side accuracies scored by different eval.scorer rules: {shown}; they are "
            "not comparable",
            stacklevel=3,
        )


def _eval_keys(groups: Mapping[str, Sequence[Run]], eval_key: str | None) -> list[str]:
    """The eval columns a figure shows, sorted."""
    return sorted({key for runs in groups.values() for r in runs if (key := _eval_key(r, eval_key))})


def panel_spec(panel: str) -> tuple[str, str, str] | None:
    """(metrics key, y-axis label, title) of a panel: one of :data:`PANELS`, or ``reward/<name>`` (a reward part's
    mean a run logs); None for an unknown name."""
    if panel.startswith(REWARD_PART) and len(panel) > len(REWARD_PART):
        part = panel[len(REWARD_PART) :]
        return panel, f"mean of reward part {part}", f"reward part {part}"
    return PANELS.get(panel)


def _panel(panel: str) -> tuple[str, str, str]:
    spec = panel_spec(panel)
    assert spec is not None, panel  # (draw checks the names first)
    return spec


def run_series(run: Run, panel: str, eval_key: str | None = None) -> dict[int, float]:
    """step -> value of one panel's metric in one run (missing, null and non-finite values left out)."""
    key = _eval_key(run, eval_key) if panel == "eval" else _panel(panel)[0]
    rows = run.evals if panel == "eval" else run.steps
    series: dict[int, float] = {}
    for r in rows:
        v = _number(r.get(key)) if key else None
        if v is not None and _number(r.get("step")) is not None:
            series[int(r["step"])] = v
    return series


def _missing_note(group: str, runs: Sequence[Run], panel: str, eval_key: str | None) -> str:
    """Why a group has nothing to show in a panel, in a few words."""
    if panel != "eval" and not any(r.is_grpo for r in runs):
        return f"{group}: no GRPO steps"
    if panel == "reward_std" and all(_config_get(r.config, "grpo.group_size") == 1 for r in runs):
        return f"{group}: no within-group std (K = 1)"
    if panel == "eval":
        return f"{group}: no {_eval_key(runs[0], eval_key) or 'eval'} rows"
    return f"{group}: no {_panel(panel)[0]} values"


def aggregate(series: Sequence[dict[int, float]]) -> tuple[list[int], list[float], list[float], list[float]]:
    """Steps shared by all series, and the mean, min and max over the series at each."""
    shared = sorted(set.intersection(*(set(s) for s in series))) if series else []
    cols = [[s[t] for s in series] for t in shared]
    return shared, [sum(c) / len(c) for c in cols], [min(c) for c in cols], [max(c) for c in cols]


# ------------------------------------------------------------------------ drawing
def _norm(label: str) -> str:
    return re.sub(r"[^a-z0-9]", "", label.lower())


def group_colors(groups: Mapping[str, Sequence[Run]]) -> dict[str, str]:
    """A colour per group: the fixed one of a well-known arm (by name, else by its runs' config), else the cycle."""
    colors: dict[str, str] = {}
    for name in groups:
        c = ARM_COLORS.get(_norm(name))
        if c is not None and c not in colors.values():
            colors[name] = c
    for name, runs in groups.items():
        labels = {_norm(config_label(r)) for r in runs}
        c = ARM_COLORS.get(labels.pop()) if len(labels) == 1 else None
        if name not in colors and c is not None and c not in colors.values():
            colors[name] = c
    cycle = [c for c in OTHER_COLORS if c not in colors.values()] or list(OTHER_COLORS)
    for i, name in enumerate(n for n in groups if n not in colors):
        colors[name] = cycle[i % len(cycle)]
    return colors


def _draw_panel(
    ax: Axes,
    panel: str,
    groups: Mapping[str, Sequence[Run]],
    colors: Mapping[str, str],
    eval_key: str | None,
    reference: Mapping[str, float],
    xlabel: str = GRPO_AXIS,
    sft_apart: bool = False,
) -> dict[str, Any]:
    """One panel: per group the mean line (+ min-max band), the reference lines, the legend below the axes; the x
    axis labelled ``xlabel``, and the title marked SFT's when ``sft_apart`` (the SFT groups' own eval panel)."""
    from matplotlib.lines import Line2D

    handles: list[tuple[Any, str]] = []
    drawn: dict[str, int] = {}
    bands: list[str] = []
    notes: list[str] = []
    for name, runs in groups.items():
        series = [s for s in (run_series(r, panel, eval_key) for r in runs) if s]
        steps, mean, lo, hi = aggregate(series)
        if not steps:
            notes.append(_missing_note(name, runs, panel, eval_key) if not series else f"{name}: runs share no step")
            continue
        last = [max(s) for s in series]
        if steps[-1] < max(last):  # the mean is over the steps every seed logged: say where it stops, and why
            why = (
                f"where its shortest run stops (the longest: {max(last)})"
                if steps[-1] == min(last)
                else f"the last step all its runs logged (they stop at {min(last)} to {max(last)})"
            )
            notes.append(f"{name}: mean to step {steps[-1]}, {why}")
        marker = "o" if len(steps) <= 30 else None
        (line,) = ax.plot(steps, mean, color=colors[name], lw=2, marker=marker, ms=3.5)
        drawn[name] = len(steps)
        if len(series) >= 2:
            band = ax.fill_between(steps, lo, hi, color=colors[name], alpha=0.18, lw=0)
            bands.append(name)
            handles.append(((line, band), f"{name}: mean of {len(series)} seeds (band: min-max)"))
        else:
            handles.append((line, name))
    if panel == "eval":  # reference values are accuracies
        for i, (ref_name, value) in enumerate(reference.items()):
            color, ls = REFERENCE_STYLES[i % len(REFERENCE_STYLES)]
            handles.append((ax.axhline(value, color=color, ls=ls, lw=1.2), f"{ref_name} ({value:.3g})"))
    if not handles and not notes:
        notes.append("no data")
    handles += [(Line2D([], [], ls="none"), note) for note in notes]
    _finish_axes(ax, panel, groups, eval_key, handles, len(notes), xlabel, sft_apart)
    return {"groups": drawn, "lines": len(ax.get_lines()), "bands": bands, "notes": notes}


def _finish_axes(
    ax: Axes,
    panel: str,
    groups: Mapping[str, Sequence[Run]],
    eval_key: str | None,
    handles: list,
    n_notes: int,
    xlabel: str = GRPO_AXIS,
    sft_apart: bool = False,
) -> None:
    """Labels, title, grid, and the legend below the axes (outside them; notes last, in grey italics)."""
    from matplotlib.legend_handler import HandlerTuple
    from matplotlib.ticker import MaxNLocator
    from matplotlib.transforms import ScaledTranslation

    _, ylabel, title = _panel(panel)
    if panel == "eval":
        parts = [_eval_parts(k) for k in _eval_keys(groups, eval_key)]
        names, what = [n for n, _ in parts], "accuracy"
        if parts and all(m == "mean_score" for _, m in parts):
            what = ylabel = "mean score"
        if names and (what != "accuracy" or not all("valid" in n for n in names)):
            ylabel = f"{what} (greedy, no dropout)"
        title = f"{what} on {', '.join(names)}" if names else title
    ax.set_xlabel(xlabel)
    title = f"SFT: {title}" if sft_apart else title
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # (steps are whole: no 0.2 ticks on a short run)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=11)
    ax.grid(alpha=0.3)
    fig = ax.get_figure()
    assert fig is not None
    below = ax.transAxes + ScaledTranslation(0, -0.6, fig.dpi_scale_trans)  # clear of tick labels and x label
    legend = ax.legend(
        [h for h, _ in handles],
        [label for _, label in handles],
        loc="upper center",
        bbox_to_anchor=(0.5, 0.0),
        bbox_transform=below,
        fontsize=9,
        frameon=False,
        handler_map={tuple: HandlerTuple(ndivide=1)},
    )
    for text in legend.get_texts()[len(handles) - n_notes :]:
        text.set_color("#555555")
        text.set_fontstyle("italic")


def _check_math_text(texts: Sequence[tuple[str, str]]) -> None:
    """DataError naming a text of the figure (``(what, text)``: the title, a group's or a reference's name) that
    matplotlib cannot draw: one with a pair of unescaped ``$`` is math text to it (``$p_0$``), and math text it cannot
    parse (``$\\badcmd$``) raised a ValueError traceback once the figure was laid out."""
    from matplotlib import cbook
    from matplotlib.mathtext import MathTextParser

    parser = MathTextParser("path")
    for what, text in texts:
        if not cbook.is_math_text(text):
            continue
        try:
            parser.parse(text)
        except ValueError as e:
            reason = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
            raise DataError(
                f"{what} '{text}': matplotlib reads the text between two $ as math text and cannot draw it "
                f"({reason}); write a literal dollar as \\$"
            ) from None


def check_format(out: str | Path) -> str:
    """The figure format from the file suffix (png, pdf or svg); a :class:`DataError` otherwise."""
    suffix = Path(out).suffix.lower()
    if suffix not in FORMATS:
        raise DataError(f"{out}: unknown figure format {suffix or '(no suffix)'!r}; use .png, .pdf or .svg")
    return suffix[1:]


def draw(
    groups: Mapping[str, Sequence[Run]],
    *,
    panels: Sequence[str] = ("eval", "reward_std"),
    eval_key: str | None = None,
    reference: Mapping[str, float] | None = None,
    title: str | None = None,
) -> tuple[Figure, dict[str, Any]]:
    """The figure (panels side by side) and the description :func:`plot_runs` returns; nothing is written.
    ``panels`` may be one panel's name."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    panels = (panels,) if isinstance(panels, str) else tuple(panels)
    unknown = [p for p in panels if panel_spec(p) is None]
    if unknown or not panels:
        raise DataError(
            f"unknown panel(s) {', '.join(unknown) or '(none)'}; choose from {', '.join(PANELS)} or "
            f"{REWARD_PART}<part> (a reward part the runs log)"
        )
    if not any(groups.values()):
        raise DataError("no runs to plot")
    everyone = [r for runs in groups.values() for r in runs]
    if "eval" not in panels and (reference or eval_key):  # (both drawn in the eval panel only: dropped unsaid)
        given = " and ".join(n for n, v in (("the reference lines", reference), ("the eval key", eval_key)) if v)
        warnings.warn(f"{given} go to the eval panel, which the panels ({', '.join(panels)}) leave out", stacklevel=2)
    if eval_key and "eval" in panels:
        _check_eval_key(everyone, eval_key)
    _check_reward_parts(everyone, panels)
    if "eval" in panels:
        _check_one_kind_per_group(groups)
        _check_one_dataset_per_group(groups, eval_key)
        _warn_if_scorers_differ(everyone)
    texts = [("the title", title or ""), *(("the group", n) for n in groups)]
    _check_math_text([*texts, *(("the reference", n) for n in reference or {})])
    axes = axes_of(panels, groups)
    rows = len(groups) + len(reference or {}) + 1
    fig = Figure(figsize=(6 * len(axes), 4 + 0.6 + 0.22 * rows))
    FigureCanvasAgg(fig)
    colors = group_colors(groups)
    desc: dict[str, Any] = {"panels": {}, "lines": {}, "bands": {}, "notes": {}}
    for ax, (key, panel, drawn, xlabel) in zip(fig.subplots(1, len(axes), squeeze=False)[0], axes):
        d = _draw_panel(ax, panel, drawn, colors, eval_key, reference or {}, xlabel, sft_apart=key == SFT_EVAL)
        for k in ("groups", "lines", "bands", "notes"):
            desc["panels" if k == "groups" else k][key] = d[k]
    desc["eval_keys"] = _eval_keys(groups, eval_key)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig, desc


def plot_runs(
    groups: Mapping[str, Sequence[Run]],
    out: str | Path,
    *,
    panels: Sequence[str] = ("eval", "reward_std"),
    eval_key: str | None = None,
    reference: Mapping[str, float] | None = None,
    title: str | None = None,
) -> dict[str, Any]:
    """Draw the groups' runs into ``out`` (.png, .pdf or .svg, by the suffix): one panel per metric.

    Panels (a list, or one name): ``eval`` (``eval/<name>/accuracy``, ``eval_key`` or each run's first),
    ``reward_std``, ``reward_mean``, ``kept`` (frac_groups_kept), ``distinct`` (distinct_answers), ``reward/<part>``
    (one part of ``grpo.rewards``, as logged). Per group the mean over its runs on the steps they
    share, with a min-max band when it has >= 2 runs; ``reference`` values are dashed lines in the eval panel.
    The x axis is GRPO steps; an SFT group's validation curve is over its optimizer steps, in a panel of its own
    (:data:`SFT_EVAL`, after ``eval``) when GRPO groups are drawn too (:func:`axes_of`); a group holding runs of
    both is a :class:`DataError`.
    Returns ``{"panels": {panel: {group: n_points}}, "lines": {panel: n_Line2D}, "bands": {panel: [group]},
    "notes": {panel: [note]}, "eval_keys": [...], "out": path}`` (``panel``: :data:`SFT_EVAL` for that one).
    """
    fmt = check_format(out)
    fig, desc = draw(groups, panels=panels, eval_key=eval_key, reference=reference, title=title)
    out = Path(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, format=fmt, dpi=120, bbox_inches="tight")
    except OSError as e:  # a file where a folder should be, a folder named like the figure, no permission
        raise DataError(f"{out}: cannot write the figure there ({e.strerror or e})") from None
    desc["out"] = str(out)
    return desc


def plot(
    paths: Sequence[str | Path],
    out: str | Path,
    *,
    groups: Mapping[str, Sequence[str | Path]] | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """Find, load and group the runs under ``paths`` (``groups`` overrides the grouping), then :func:`plot_runs`.
    A run that logged no step yet (one that crashed at start) is skipped with a warning, unless it is the only one."""
    check_format(out)
    runs = _load_found(find_runs(paths))
    return plot_runs(group_runs(runs, groups), out, **kwargs)


def describe(desc: Mapping[str, Any]) -> str:
    """One line: the output path and what each panel shows."""
    parts = []
    for panel, drawn in desc["panels"].items():
        notes = f", {len(desc['notes'][panel])} note(s)" if desc["notes"][panel] else ""
        parts.append(f"{panel}: {len(drawn)} group(s), {desc['lines'][panel]} line(s){notes}")
    return f"{desc.get('out', '')}: " + "; ".join(parts)


__all__ = [
    "Run",
    "arm_of",
    "axes_of",
    "config_label",
    "describe",
    "draw",
    "find_runs",
    "group_runs",
    "load_run",
    "panel_spec",
    "plot",
    "plot_runs",
    "run_series",
]
