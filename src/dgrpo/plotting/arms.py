"""Runs grouped into arms: a run's label from its config (:func:`config_label`), seeds of one setting together
(:func:`group_runs`), and the checks that a group's runs can share a curve (one dataset, one kind, one scorer)."""

from __future__ import annotations

import json
import math
import re
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from ..data.records import DataError
from ..text import first_items

if TYPE_CHECKING:
    pass
from .runs import (
    EVAL_METRICS,
    GRPO_AXIS,
    REWARD_PART,
    SFT_AXIS,
    SFT_EVAL,
    Run,
    _config_get,
    _eval_parts,
    _is_eval_key,
    _load_found,
    _shown_path,
    find_runs,
)

_SEED_NAME = re.compile(r"(?:seed|s)[-_=]?\d+|sft\d+[-_]rl\d+", re.IGNORECASE)  # (the demo's: sftK_rlJ)
_SEED_SUFFIX = re.compile(r"(?:[-_. ]+(?:seed|s)|seed)[-_=]?\d+$", re.IGNORECASE)


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
    _warn_if_a_run_is_in_several_labels(out)
    automatic = _automatic_groups([run for run in runs if run.path.resolve() not in taken])
    _refuse_labels_named_as_automatic_groups(groups or {}, automatic)
    for name, members in out.items():
        _warn_if_a_label_mixes_settings(name, members)
    return {**out, **automatic}


def _warn_if_a_run_is_in_several_labels(labelled: Mapping[str, Sequence[Run]]) -> None:
    """A warning naming the runs that two or more ``--label`` groups hold (``--label A=runs/sweep --label
    B=runs/sweep/p02``: B's runs are in A's mean too): each is drawn in every group that holds it, as asked, but
    those groups' lines then share runs."""
    holders: dict[Path, tuple[Run, list[str]]] = {}
    for name, members in labelled.items():
        for run in members:
            holders.setdefault(run.path.resolve(), (run, []))[1].append(name)
    shared = [f"{_shown_path(run.path)} ({', '.join(names)})" for run, names in holders.values() if len(names) > 1]
    if shared:
        warnings.warn(
            f"runs in several --label groups are drawn in each: {first_items(shared)}; their lines share those runs",
            stacklevel=3,
        )


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
    that validated on different data); ``--eval-key`` picks one for all (a run without it is left out). A dataset
    name given to ``--eval-key`` is one set with or without a source prefix, as :func:`_eval_key` reads it (``valid``
    takes a run's ``builtin:valid``): runs that logged either are one set then, not refused (the refusal's advice,
    to pass ``--eval-key`` with one of them, matched both again)."""
    alike = eval_key is not None and not eval_key.startswith("eval/")
    for name, runs in groups.items():
        by_key: dict[str, list[str]] = {}
        for r in runs:
            if (key := _eval_key(r, eval_key)) is not None and any(key in row for row in r.evals):
                column = key.removeprefix("eval/").removesuffix("/accuracy")
                by_key.setdefault(column.rsplit(":", 1)[-1] if alike else column, []).append(r.name)
        if len(by_key) > 1:
            raise DataError(
                f"{name}: its runs validated on different data ({_listed(by_key)}); their mean would mix them: pass "
                f"--eval-key with one of {', '.join(by_key)}"
            )


def _warn_if_a_group_validated_on_other_data(groups: Mapping[str, Sequence[Run]], eval_key: str | None) -> None:
    """A warning when a group's runs plot ``eval/valid/...`` (the commands' name for the run's ``data.valid``, so one
    column name for any data) while their configs name different ``data.valid``: seeds of one folder are one arm
    however their configs differ (:func:`_other_experiments`), so their mean would mix those sets unsaid. Not refused:
    one file named by two paths (relative and absolute, moved) is the same data."""
    for name, runs in groups.items():
        on_valid = [r for r in runs if (key := _eval_key(r, eval_key)) is not None and _eval_parts(key)[0] == "valid"]
        if len(sets := _names_by_setting(on_valid, "data.valid")) > 1:
            warnings.warn(
                f"{name}: its runs' eval/valid is their data.valid, which differs between them ({_listed(sets)}); "
                "their mean mixes those sets",
                stacklevel=3,
            )


def _names_by_setting(runs: Sequence[Run], dotted: str, default: Any = None) -> dict[str, list[str]]:
    """The names of the runs by their config's value of ``dotted`` (``default`` where it is not set); runs without
    a config are not counted."""
    by_value: dict[str, list[str]] = {}
    for r in runs:
        if r.config:
            by_value.setdefault(str(_config_get(r.config, dotted, default)), []).append(r.name)
    return by_value


def _listed(by_value: Mapping[str, Sequence[str]]) -> str:
    """``value (run, run); value (run)``: :func:`_names_by_setting`'s groups in a few words."""
    return "; ".join(f"{value} ({first_items(names)})" for value, names in by_value.items())


def _check_one_kind_per_group(groups: Mapping[str, Sequence[Run]]) -> None:
    """DataError when a group holds SFT and GRPO runs: its mean would average accuracies at SFT optimizer steps with
    ones at GRPO steps, which count different things."""
    for name, runs in groups.items():
        sft, grpo = [r.name for r in runs if not r.is_grpo], [r.name for r in runs if r.is_grpo]
        if sft and grpo:
            raise DataError(
                f"{name}: holds SFT runs ({first_items(sft)}) and GRPO runs ({first_items(grpo)}); their steps "
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
    from ..config import EvalConfig

    if len(by_scorer := _names_by_setting(runs, "eval.scorer", EvalConfig().scorer)) > 1:
        warnings.warn(
            f"the eval panel sets side by side accuracies scored by different eval.scorer rules: {_listed(by_scorer)}; "
            "they are not comparable",
            stacklevel=3,
        )
