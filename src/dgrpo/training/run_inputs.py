"""A trainer's inputs checked before it starts: the model, the config, the training and validation records, the
evaluation function and the best-checkpoint metric; and the warnings of a start (questions cut, a model off its
device)."""

from __future__ import annotations

import inspect
import os
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

from ..config import Config, ConfigError
from ..data.records import Record, check_records, data_columns
from ..eval.evaluate import EvalResult, eval_options, evaluate, warn_if_questions_cut
from ..model.latent_lm import LatentLM
from ..model.sources import resolve_device
from ..model.support import untrainable
from .sharded_eval import no_best_metric


def check_run_inputs(
    lm: object,
    cfg: Config,
    train: list[Record],
    what: str,
    valid: object,
    valid_type: type,
    *,
    out_dir: object,
    evaluate_fn: Callable | None,
    eval_args: tuple[str, ...],
    stacklevel: int = 3,
) -> None:
    """What a Python caller hands a trainer, checked before a run directory is touched: :func:`check_trainer_inputs`,
    :func:`check_dtype`, ``valid`` None or of ``valid_type`` (SFT: a list of records; GRPO: a dict of them by name),
    ``out_dir`` a path, and an ``evaluate_fn`` that takes ``eval_args`` (None: the trainer's default,
    :func:`default_evaluate_fn`), warned about when there is no ``valid`` to call it on. ``stacklevel``: the warnings',
    to name the trainer's caller (3: the trainer calls this; 4: through a helper of the trainer's)."""
    check_trainer_inputs(lm, cfg, train, what)
    assert isinstance(lm, LatentLM)  # (checked above, in one line)
    check_dtype(lm, cfg, what)
    warn_if_off_device(lm, cfg, what, stacklevel + 1)
    if valid is not None and not isinstance(valid, valid_type):
        raise TypeError(f"{what}: valid must be a {valid_type.__name__} of records, got {type(valid).__name__}")
    _check_valid_records(what, valid)
    _check_evaluate_fn(what, evaluate_fn, eval_args)
    _check_best_metric(what, cfg, evaluate_fn)
    if evaluate_fn is not None and not valid:
        form = "{'valid': records}" if valid_type is dict else "records"
        warnings.warn(
            f"{what}: evaluate_fn is given but no valid records: it is never called (no validation, no best/); pass "
            f"valid={form} too",
            stacklevel=stacklevel,
        )
    if not isinstance(out_dir, (str, os.PathLike)) or not str(out_dir):
        raise TypeError(f"{what}: out_dir must be the run directory's path, got {out_dir!r}")


def _check_valid_records(what: str, valid: object) -> None:
    """The records of a trainer's ``valid``, each list checked as ``train`` is (:func:`check_records`): SFT's list
    (empty: no validation), each set of GRPO's dict non-empty (an empty one would log an accuracy of 0 at every
    evaluation and keep ``best/`` by it); a list of dicts failed at the first evaluation, after training, deep
    inside."""
    if isinstance(valid, dict):
        for name, records in valid.items():
            check_records(records, f"{what}: valid[{name!r}]")
    elif valid is not None:
        check_records(valid, f"{what}: valid", empty=True)


#: how each trainer takes its first arguments (SFT's records come before the config, GRPO's after it)
CALL_ORDER = {
    "train_sft": "lm, train, cfg, out_dir",
    "train_grpo": "lm, cfg, train, out_dir",
    "GRPOTrainer": "lm, cfg, train",
}


def check_trainer_inputs(lm: object, cfg: Config, train: list[Record], what: str) -> None:
    """A :class:`LatentLM`, a :class:`Config` valid as a whole (a value set on the object skips ``load_config``'s
    checks) and a non-empty list of Records, each a one-line error naming ``what`` (the trainer's own misuse would
    fail deep inside, or train on nothing: a group of one rollout has no advantage)."""
    if not isinstance(lm, LatentLM):
        raise TypeError(
            f"{what}: lm must be a dgrpo LatentLM (LatentLM.from_pretrained(path_or_hub_id), or LatentLM(model, "
            f"tokenizer) around a Hugging Face model), got {type(lm).__name__}"
        )
    if (why := untrainable(getattr(lm.model, "config", None))) is not None:
        raise ConfigError(f"{what}: {why}")
    if not isinstance(cfg, Config):
        order = CALL_ORDER.get(what)
        raise TypeError(
            f"{what}: cfg must be a dgrpo.config.Config, got {type(cfg).__name__}"
            + (f" (the arguments' order: {what}({order}))" if order else "")
        )
    cfg.validate()
    check_records(train, f"{what}: train")


T = TypeVar("T")

#: within :func:`checked_once`, what the start checks found, by what they checked (None: outside it)
_FOUND: ContextVar[dict[tuple, tuple] | None] = ContextVar("start_checks", default=None)


@contextmanager
def checked_once() -> Iterator[None]:
    """Within it, the start checks that read every training record or call the reward do so once for the same data
    (GRPO's :func:`~.grpo.check_rollouts_fit` and :func:`~.grpo.checked_rewards`, SFT's
    :func:`~.sft.check_examples_fit`): ``dgrpo grpo`` and ``dgrpo sft`` make them once their data is read, before the
    model's weights load, and the trainer's start then takes what they found."""
    token = _FOUND.set({})
    try:
        yield
    finally:
        _FOUND.reset(token)


def found_at_start() -> dict[tuple, tuple] | None:
    """Within :func:`checked_once`, what the start checks found so far (a check adds its own), by what they checked;
    None outside it."""
    return _FOUND.get()


def found_once(key: tuple, train: list[Record], find: Callable[[], T]) -> T:
    """What ``find()`` finds of the records ``train`` (``key``: what it depends on, ``id(train)`` among it): within
    :func:`checked_once`, found once and kept (for this very list); outside it, found each call."""
    found = _FOUND.get()
    if found is not None and key in found and found[key][0] is train:
        return found[key][1]
    result = find()
    if found is not None:
        found[key] = (train, result)
    return result


#: how many distinct training questions :func:`widest_prompt` encodes at a time
QUESTIONS_AT_ONCE = 1024


def widest_prompt(lm: LatentLM, train: list[Record], max_tokens: int) -> tuple[int, int]:
    """(record, width): the first record of ``train`` whose question's prompt (:meth:`LatentLM.encode_questions`,
    cut to ``max_tokens``) is the widest, and that width. Its distinct questions are encoded :data:`QUESTIONS_AT_ONCE`
    at a time, then halves of the widest batch. Within :func:`checked_once`, found once for ``train`` under the same
    prompt settings."""
    tokenizer = (getattr(lm.tokenizer, "name_or_path", ""), len(lm.tokenizer))
    key = ("widest", id(train), len(train), max_tokens, lm.settings.chat_template, tuple(lm.question_prefix), tokenizer)
    return found_once(key, train, lambda: _widest_prompt(lm, train, max_tokens))


def _widest_prompt(lm: LatentLM, train: list[Record], max_tokens: int) -> tuple[int, int]:
    """:func:`widest_prompt`'s search."""
    first: dict[str, int] = {}  # (each distinct question's first record)
    for i, r in enumerate(train):
        first.setdefault(r.question, i)
    questions = list(first)

    def width(lo: int, hi: int) -> int:
        return int(lm.encode_questions(questions[lo:hi], max_tokens=max_tokens)[0].shape[1])

    n = QUESTIONS_AT_ONCE
    widths = [width(lo, lo + n) for lo in range(0, len(questions), n)]
    widest = max(widths)
    lo = widths.index(widest) * n
    hi = min(lo + n, len(questions))
    while hi - lo > 1:  # (the widest question lies in [lo, hi))
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if width(lo, mid) == widest else (mid, hi)
    return first[questions[lo]], widest


def warn_if_training_questions_cut(lm: LatentLM, cfg: Config, train: list[Record]) -> None:
    """:func:`~dgrpo.eval.evaluate.warn_if_questions_cut` for a training set: 1000 of its distinct questions, evenly
    spaced (SFT's and GRPO's start)."""
    questions = list(dict.fromkeys(r.question for r in train))
    warn_if_questions_cut(lm, questions, cfg.data.max_question_tokens, "training", check_at_most=1000)


def check_restart(lm: LatentLM, resumed: bool, what: str) -> None:
    """A ConfigError when a run would start afresh from the weights of a run that stopped mid-way in this process
    (Ctrl-C in a notebook, an error; ``lm.stopped_run``, set by every training step and cleared when a run ends):
    nothing restores its start (no checkpoint to resume). A resumed checkpoint replaces the weights and clears it."""
    if resumed:
        lm.stopped_run = None
    elif lm.stopped_run is not None:
        raise ConfigError(
            f"{what}: this model object holds the weights of a run that stopped mid-way ({lm.stopped_run}), and no "
            "checkpoint of this run restores a start: load the model again (load_model / LatentLM.from_pretrained) "
            "and pass that, or go on with the stopped run by giving its directory"
        )


def check_dtype(lm: LatentLM, cfg: Config, what: str) -> None:
    """The model's weights in ``model.dtype``, which the run records (config.json, and each checkpoint's
    run_config.json, from which ``dgrpo eval`` takes it): ``load_model`` casts to it, a model built in Python keeps
    its own (an fp32-trained run recorded bf16, and was evaluated in bf16)."""
    weights = str(lm.model.get_input_embeddings().weight.dtype).removeprefix("torch.")
    if weights != cfg.model.dtype:
        raise ConfigError(
            f"{what}: model.dtype is {cfg.model.dtype}, but the model's weights are {weights}: set model.dtype to "
            f"the dtype to train in and cast the model to it (lm.to(torch.{cfg.model.dtype}); load_model casts)"
        )


def warn_if_off_device(lm: LatentLM, cfg: Config, what: str, stacklevel: int = 4) -> None:
    """A warning when the model is not on the kind of device ``cfg.device`` names (``auto``: CUDA when there is one):
    the trainers train the model where it is, and ``load_model`` puts it on the CPU unless told (the ``dgrpo``
    commands move it; a Python run on a GPU machine trained on the CPU without a word)."""
    import torch

    name = cfg.device
    want = resolve_device(name).type if name == "auto" else torch.device(name).type  # (no CUDA here: still warned)
    if lm.device.type != want:
        warnings.warn(
            f"{what}: the model is on {lm.device.type}, but device is {name!r} ({want}), so it trains on "
            f"{lm.device.type}: move it first (lm.to({want!r}), or load_model(..., device={want!r})), or set "
            f"device: {lm.device.type}",
            stacklevel=stacklevel,  # (the trainer's caller)
        )


def default_evaluate_fn(cfg: Config, valid: Iterable[Record], per_stage: bool = False) -> Callable[..., EvalResult]:
    """What a trainer validates with when it is given no ``evaluate_fn``, as the ``dgrpo`` commands do: the
    :class:`EvalResult` of the records (how many the model answers right, and the mean of the scorer's values), greedy
    (unless ``eval.temperature``) under ``eval.*`` (the scorer, the answer's tokens, ...). ``per_stage`` (SFT):
    ``(lm, records, settings)``, with the stage's latent steps. The scorer gets every column of ``valid`` (the whole
    validation data) on each rank's shard, None where a record has none: a scorer in TRL's form is called alike
    whichever records a shard holds."""
    options = {**eval_options(cfg), "columns": data_columns(valid)}  # (a scorer that cannot be built fails here)
    options["dataset"] = "the validation set"  # (named in evaluate's warnings, as a test set is by its name)

    def evaluated(lm: LatentLM, records: list[Record]) -> EvalResult:
        return evaluate(lm, records, progress=False, **options)

    def evaluated_at(lm: LatentLM, records: list[Record], settings: Any) -> EvalResult:
        return evaluate(lm, records, progress=False, **{**options, "n_latent": settings.n_latent})

    return evaluated_at if per_stage else evaluated


def _check_evaluate_fn(what: str, evaluate_fn: Callable | None, eval_args: tuple[str, ...]) -> None:
    """``evaluate_fn`` callable with ``eval_args`` (checked on its signature, not called: a wrong one would fail only
    at the first validation, after training); None: the trainer's default (:func:`default_evaluate_fn`)."""
    if evaluate_fn is None:
        return
    if not callable(evaluate_fn):
        raise TypeError(f"{what}: evaluate_fn must be a function, got {type(evaluate_fn).__name__}")
    try:
        signature = inspect.signature(evaluate_fn)
    except (TypeError, ValueError):  # a builtin or C function: nothing to read
        return
    try:
        signature.bind(*eval_args)
    except TypeError:
        raise TypeError(
            f"{what}: evaluate_fn is called as evaluate_fn({', '.join(eval_args)}) and returns how many records are "
            f"correct (or their EvalResult); its signature is {getattr(evaluate_fn, '__name__', '')}{signature}"
        ) from None


def _check_best_metric(what: str, cfg: Config, evaluate_fn: Callable | None) -> None:
    """``grpo.best_metric`` / ``sft.best_metric`` other than accuracy, where ``best/`` is kept, with an ``evaluate_fn``
    annotated to return an int (a count, with no mean score): refused before training. One not annotated so is refused
    at its first validation (:func:`~.sharded_eval.best_value`)."""
    section = {"train_grpo": "grpo", "train_sft": "sft"}.get(what)
    if section is None or evaluate_fn is None:
        return
    s = getattr(cfg, section)
    keeps_best = s.save_best if section == "grpo" else s.eval_every_epoch
    try:
        returns = inspect.signature(evaluate_fn).return_annotation
    except (TypeError, ValueError):  # a builtin or C function: nothing to read
        return
    if keeps_best and s.best_metric != "accuracy" and returns in (int, "int"):
        raise no_best_metric(s.best_metric, f"{section}.best_metric")
