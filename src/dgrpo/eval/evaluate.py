"""Batched pass@1 evaluation of a LatentLM (or of a plain causal LM with a chain-of-thought prompt), majority voting
over dropout masks (evaluate_mc_vote); the results' files and the merge of shards are :mod:`dgrpo.eval.results`."""

from __future__ import annotations

import math
import re
import time
import warnings
from collections.abc import Callable, Iterable
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from tqdm.auto import tqdm

from ..data.records import Record, check_records, with_columns
from ..model.latent_lm import LatentLM
from ..perturbation import Perturbation
from ..perturbation.base import as_seeds, row_sampling_uniforms, text_seed, to_device
from ..progress import bar_disabled
from ..reward import answer_decimals, extract_answer, is_parseable, normalize_number, normalize_text, numbers_agree
from .scoring import (
    RewardError,
    ScoreFn,
    build_scorer,
    call_checked,
    choice,
    choice_letter,
    coconut,
    exact,
    final_answer_text,
    numeric,
)

if TYPE_CHECKING:
    from ..config import Config


@dataclass
class EvalResult:
    """What :func:`evaluate` and :func:`evaluate_mc_vote` return: ``accuracy`` = ``correct`` / ``n``, how it was
    evaluated, and one row per record in ``predictions`` (its question, gold answer and prediction ``pred``, ...);
    :func:`write_results` writes it as ``results.json`` and ``predictions.jsonl``."""

    dataset: str
    accuracy: float
    n: int
    correct: int
    unparseable: int
    seed: int
    n_latent: int
    mode: str
    wall_s: float
    scorer: str = "numeric"  # what counted as correct (eval.scorer: a built-in name or a plug-in's module:function)
    # the mean of the scorer's values (its partial credit too: a 0.5 is not correct; = accuracy for a 0/1 scorer);
    # None when not recorded (a result made by hand)
    mean_score: float | None = None
    # evaluate_mc_vote's pass@k over its masks ({"1": ..., "8": ...}: the k of pass_ks; each question's masks
    # scoring 1 counted, the unbiased estimator of pass_at_k averaged); None for evaluate (one completion each)
    pass_at_k: dict[str, float] | None = None
    # what was evaluated, and how: the checkpoint (``dgrpo eval`` names it: an absolute path, or the hub id; None
    # when not recorded) and the decoding (temperature 0: greedy), limit (0: all records), k-shot examples (plain)
    model: str | None = None
    temperature: float = 0.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    max_question_tokens: int | None = None
    limit: int = 0
    shots: int = 0
    predictions: list[dict] = field(default_factory=list, repr=False)

    def summary(self) -> dict:
        """Every field but ``predictions`` (``results.json``)."""
        d = dict(self.__dict__)
        d.pop("predictions")
        return d


def plain_prompt(question: str, shots: list[Record]) -> str:
    """k-shot prompt for a plain causal LM (the paper's base-model rows): each worked example is written out as its
    dataset gives it, the natural-language solution where there is one (GSM8K's, without its ``<<...>>``
    calculator annotations and ``####`` line), else its steps, else the answer alone (SVAMP, MultiArith)."""
    parts = []
    for r in shots:
        work = worked_solution(r) or " ".join(r.steps)
        parts.append(f"Question: {r.question}\nAnswer: {work + ' ' if work else ''}The answer is {r.answer}.\n\n")
    return "".join(parts) + f"Question: {question}\nAnswer:"


def worked_solution(record: Record) -> str:
    """A record's natural-language solution on one line ('' when its dataset has none): GSM8K's ``answer`` text
    before ``####``, its calculator annotations removed (``16 - 3 - 4 = <<16-3-4=9>>9`` -> ``16 - 3 - 4 = 9``)."""
    solution = record.meta.get("solution")
    if not isinstance(solution, str):
        return ""
    text = re.sub(r"<<[^<>]*>>", "", solution.partition("####")[0])
    return " ".join(text.split())


def _cut_plain(text: str) -> str:
    """A plain LM keeps writing after its answer, as its k-shot prompt goes on: a new ``Question`` turn; the answer
    is what comes before it (paragraphs of reasoning included: a cut at the first blank line lost their answer)."""
    for stop in ("\n\nQuestion", "\nQuestion:"):
        if stop in text:
            text = text.split(stop, 1)[0]
    return text


def _as_answers(texts: list[str], plain: bool) -> list[str]:
    """Completions as they are scored: a plain LM's cut before the next question it goes on to write
    (:func:`_cut_plain`), the others as written."""
    return [_cut_plain(t) for t in texts] if plain else texts


@torch.no_grad()
def generate_answers(
    lm: LatentLM,
    questions: list[str],
    *,
    n_latent: int | None = None,
    batch_size: int = 256,
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int = 0,
    mode: str | None = None,
    markers: bool = True,
    max_question_tokens: int | None = None,
    perturbation: Perturbation | None = None,
    perturbation_seeds: torch.Tensor | None = None,
    sampling_seeds: torch.Tensor | None = None,
    progress: bool = True,
    desc: str = "eval",
    dataset: str = "",
    prompt_key: str | None = None,
) -> list[str]:
    """Completions for ``questions`` in batches sorted by length (less padding), returned in input order.

    Sampling (``temperature`` > 0) draws each question's tokens from its own seed (from ``seed`` and the question's
    text), so a question gets the same answer whatever the batch size, the order or the process that evaluates it;
    ``sampling_seeds`` (one int seed per question) gives each its own instead (copies of one question sampled apart).
    ``perturbation`` with ``perturbation_seeds`` (one int seed per question) answers each question under the
    perturbation its own seed draws (Monte-Carlo dropout evaluation), likewise whatever its batch; ``None``
    evaluates the deterministic network. ``dataset`` names the questions in the warning about those cut to
    ``max_question_tokens`` (each dataset's warning its own: two with the same count were one warning).
    ``n_latent``: the continuous thoughts before each answer (None: the model's own, ``lm.settings.n_latent``, as
    :meth:`LatentLM.generate` takes it). ``prompt_key``: the option that shortens the prompts, named in the error
    when one does not fit the context (None: ``data.max_question_tokens``, which ``max_question_tokens`` sets; ""
    for none: :func:`evaluate`'s plain prompts, which it does not cut, name ``eval.shots`` or nothing).
    """
    _check_counts("generate_answers", batch_size=batch_size, max_question_tokens=max_question_tokens)
    check_lm(lm, "generate_answers")
    n_latent = lm.settings.n_latent if n_latent is None else n_latent
    _check_n_latent("generate_answers", n_latent, "an int >= 0 (None: the model's own)")
    _check_questions(lm, questions, n_latent, max_new_tokens, markers, max_question_tokens, dataset, prompt_key)
    if temperature > 0 and sampling_seeds is None:
        _warn_if_copies_sampled_alike(questions, dataset)
    seeds = _question_perturbation_seeds(questions, perturbation, perturbation_seeds)
    if perturbation is not None and not perturbation.batched:
        batch_size = 1  # native dropout replays the global RNG stream: one row at a time
    sampling = _sampling_seeds(seed, questions, sampling_seeds) if temperature > 0 else None
    how = _Decoding(n_latent, max_new_tokens, temperature, top_p, mode, markers, max_question_tokens)
    out: list[str] = [""] * len(questions)
    batches = _length_batches(questions, batch_size)
    with lm.eval_mode():
        for idx in tqdm(batches, desc=desc, disable=bar_disabled(progress), leave=False, dynamic_ncols=True):
            texts = _answered_batch(lm, questions, idx, how, sampling, perturbation, seeds)
            for i, text in zip(idx, texts):
                out[i] = text
    return out


def _warn_if_copies_sampled_alike(questions: list[str], dataset: str) -> None:
    """Warn when sampled questions repeat: each is drawn from its own seed (of the seed and its text), so a copy gets
    the first's completion, and records repeated for several samples (pass@k, a vote) were one sample k times."""
    copies = len(questions) - len(set(questions))
    if copies:
        of = f" of {dataset}" if dataset else ""
        warnings.warn(
            f"{copies} of {len(questions)} sampled questions{of} repeat an earlier one: each question is drawn from "
            "its own seed (of the seed and its text), so a copy gets the same completion; for several samples of a "
            "question evaluate it again with other seeds (seed=N, --set seed=N)",
            stacklevel=3,
        )


def _length_batches(questions: list[str], batch_size: int) -> list[list[int]]:
    """The indices of ``questions`` sorted by length (less padding in a batch), in batches of ``batch_size``."""
    order = sorted(range(len(questions)), key=lambda i: len(questions[i]))
    return [order[b0 : b0 + batch_size] for b0 in range(0, len(order), batch_size)]


class _Decoding(NamedTuple):
    """How :func:`generate_answers` answers each of its batches (its arguments of the same names)."""

    n_latent: int
    max_new_tokens: int
    temperature: float
    top_p: float
    mode: str | None
    markers: bool
    max_question_tokens: int | None


def _answered_batch(
    lm: LatentLM,
    questions: list[str],
    idx: list[int],
    how: _Decoding,
    sampling: torch.Tensor | None,
    perturbation: Perturbation | None,
    seeds: torch.Tensor,
) -> list[str]:
    """The completions of the questions ``idx`` as ``how`` answers them, each row drawing its tokens from its own
    ``sampling`` seed (None: greedy) and answered under the mask its own perturbation seed (``seeds``) binds."""
    ids, mask = lm.encode_questions(
        [questions[i] for i in idx], markers=how.markers, max_tokens=how.max_question_tokens
    )
    draws = None if sampling is None else row_sampling_uniforms(sampling[idx], how.max_new_tokens)
    bound = nullcontext() if perturbation is None else perturbation.bind(lm, seeds[idx])
    with bound as pert:
        g = lm.generate(
            ids,
            mask,
            how.n_latent,
            max_new_tokens=how.max_new_tokens,
            temperature=how.temperature,
            top_p=how.top_p,
            uniforms=None if draws is None else to_device(draws, lm.device),
            mode=how.mode,
            markers=how.markers,
            perturbation=pert,
        )
    return lm.decode(g.tokens, g.mask)


def _check_questions(
    lm: LatentLM,
    questions: object,
    n_latent: int,
    max_new_tokens: int,
    markers: bool,
    max_question_tokens: int | None,
    dataset: str,
    prompt_key: str | None,
) -> None:
    """TypeError unless ``questions`` is a list of strings; a warning for those cut to ``max_question_tokens``
    (naming ``dataset``), ConfigError for one that does not fit the context with its thoughts and answer (naming
    ``prompt_key``: :func:`check_fits_context`)."""
    if not (isinstance(questions, list) and all(isinstance(q, str) for q in questions)):
        raise TypeError(
            f"generate_answers: questions must be a list of strings, got {type(questions).__name__}"
            + (" (one string: wrap it, [question])" if isinstance(questions, str) else "")
        )
    if questions:
        distinct = list(dict.fromkeys(questions))  # (a vote's copies: counted, encoded and checked once)
        warn_if_questions_cut(lm, distinct, max_question_tokens, "evaluated", of=dataset)
        _check_distinct_fit(lm, distinct, n_latent, max_new_tokens, markers, max_question_tokens, prompt_key=prompt_key)


def _sampling_seeds(seed: int, questions: list[str], given: torch.Tensor | None) -> torch.Tensor:
    """The sampling seed of each question: ``given`` (checked: one int seed per question), else
    :func:`question_seeds` of ``seed``."""
    return question_seeds(seed, questions) if given is None else _one_per_question(given, questions, "sampling_seeds")


def _one_per_question(seeds: torch.Tensor, questions: list[str], name: str) -> torch.Tensor:
    """``seeds`` as :func:`~dgrpo.perturbation.base.as_seeds` reads them; ValueError (naming ``name``) unless there
    is one per question."""
    seeds = as_seeds(seeds)
    if len(seeds) != len(questions):
        raise ValueError(f"generate_answers: {len(seeds)} {name} for {len(questions)} questions")
    return seeds


def _question_perturbation_seeds(
    questions: list[str], perturbation: Perturbation | None, seeds: torch.Tensor | None
) -> torch.Tensor:
    """``seeds`` as :func:`~dgrpo.perturbation.base.as_seeds` reads them, one per question, checked against
    ``perturbation``."""
    if perturbation is None:
        if seeds is not None:
            raise ValueError("generate_answers: perturbation_seeds without a perturbation")
        return torch.zeros(0, dtype=torch.int64)
    if not isinstance(perturbation, Perturbation):
        raise TypeError(
            f"generate_answers: perturbation must be a dgrpo Perturbation (unbound), got {type(perturbation).__name__}"
        )
    if seeds is None:
        raise ValueError("generate_answers: a perturbation needs perturbation_seeds (one int seed per question)")
    return _one_per_question(seeds, questions, "perturbation_seeds")


def _check_counts(
    what: str, *, batch_size: int, limit: int = 0, shots: int = 0, max_question_tokens: int | None = None
) -> None:
    """ValueError (one line) for a batch size below 1 or a negative limit / shot count (``records[:-1]`` would
    silently drop the last record) / question length (``ids[-max_tokens:]`` of -1 drops a question's first
    token)."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"{what}: batch_size must be an int >= 1, got {batch_size!r}")
    for name, value in (("limit", limit), ("shots", shots)):
        if not isinstance(value, int) or value < 0:
            raise ValueError(f"{what}: {name} must be an int >= 0 (0: all), got {value!r}")
    if max_question_tokens is not None and (not isinstance(max_question_tokens, int) or max_question_tokens < 0):
        raise ValueError(
            f"{what}: max_question_tokens must be an int >= 0 or None (0 or None: no truncation), "
            f"got {max_question_tokens!r}"
        )


def _check_n_latent(what: str, n_latent: object, expected: str, least: int | None = 0) -> None:
    """ValueError (one line) unless ``n_latent`` is an int (>= ``least`` unless None): 2.0 was a TypeError of range()
    deep in the latent steps."""
    if isinstance(n_latent, bool) or not isinstance(n_latent, int) or (least is not None and n_latent < least):
        raise ValueError(f"{what}: n_latent must be {expected}, got {n_latent!r}")


def check_lm(lm: object, what: str) -> None:
    """TypeError (one line) unless ``lm`` is a :class:`LatentLM`: the Hugging Face model itself or a checkpoint's path
    (a TRL habit) was an AttributeError deep inside (no attribute 'settings')."""
    if not isinstance(lm, LatentLM):
        raise TypeError(
            f"{what}: lm must be a dgrpo LatentLM (LatentLM.from_pretrained(path_or_hub_id), or LatentLM(model, "
            f"tokenizer) around a Hugging Face model), got {type(lm).__name__}"
        )


def _scorer(scorer: ScoreFn | str | None) -> ScoreFn:
    """The scorer to use: a function as given, a name as ``eval.scorer`` reads it, None the numeric verifier."""
    if scorer is None:
        return numeric
    return build_scorer(scorer) if isinstance(scorer, str) else scorer


def check_fits_context(
    lm: LatentLM,
    questions: list[str],
    n_latent: int,
    max_new_tokens: int,
    *,
    markers: bool = True,
    max_question_tokens: int | None = None,
    key: str = "eval.n_latent",
    answer_key: str = "",
    prompt_key: str | None = None,
) -> None:
    """ConfigError (:meth:`LatentLM.check_fits`, naming ``key``, ``answer_key`` and ``prompt_key``) when the
    longest of ``questions`` in tokens (the longest in characters need not be; a question past the context was
    answered when a longer-worded one sat beside it), its ``n_latent`` thoughts and ``max_new_tokens`` answer tokens
    do not fit the model's context: what an evaluation checks, and what a trainer checks beforehand of the validation
    and test sets it answers later."""
    distinct = list(dict.fromkeys(questions))
    _check_distinct_fit(
        lm, distinct, n_latent, max_new_tokens, markers, max_question_tokens, key, answer_key, prompt_key
    )


def check_evaluation_fits(
    lm: LatentLM,
    records: list[Record],
    *,
    n_latent: int | None = None,
    max_new_tokens: int = 64,
    plain: bool = False,
    shots: int = 0,
    limit: int = 0,
    max_question_tokens: int | None = None,
    **_: Any,
) -> None:
    """The ConfigError :func:`evaluate` of ``records`` with these options (the rest, ``eval_options``'s, ignored)
    raises when its longest prompt does not fit the context, without answering any: ``dgrpo eval`` checks every set
    so before the weights load (with the model :func:`~dgrpo.cli.common.model_without_weights` builds), and a set
    after another is not refused once the first is answered."""
    p = _prompted(
        "evaluate",
        lm,
        records,
        scorer=None,
        plain=plain,
        shots=shots,
        limit=limit,
        n_latent=n_latent,
        batch_size=1,
        max_question_tokens=max_question_tokens,
    )
    if p.questions:
        distinct = list(dict.fromkeys(p.questions))
        _check_distinct_fit(
            lm, distinct, p.n_latent, max_new_tokens, p.markers, p.max_question_tokens, prompt_key=p.prompt_key
        )


def _check_distinct_fit(
    lm: LatentLM,
    distinct: list[str],
    n_latent: int,
    max_new_tokens: int,
    markers: bool,
    max_question_tokens: int | None,
    key: str = "eval.n_latent",
    answer_key: str = "",
    prompt_key: str | None = None,
) -> None:
    """:func:`check_fits_context` of questions without duplicates (their longest encoded, one row each)."""
    ids, _ = lm.encode_questions(distinct, markers=markers, max_tokens=max_question_tokens)
    lm.check_fits(
        ids.shape[1],
        n_latent,
        max_new_tokens,
        key=key,
        markers=markers,
        answer_key=answer_key,
        prompt_key=prompt_key,
    )


def warn_if_questions_cut(
    lm: LatentLM, questions: list[str], max_tokens: int | None, what: str, check_at_most: int = 0, of: str = ""
) -> int:
    """Warn when questions are longer than ``max_tokens`` (``data.max_question_tokens``), which cuts each to its last
    ``max_tokens`` tokens: the model never sees its beginning, where a word problem states its facts. Checks every
    question, or ``check_at_most`` > 0 of them evenly spaced (a training set of 385,000 questions takes a minute to
    tokenize). ``of``: the dataset the questions are of, named in the warning. Returns the count found."""
    checked = questions
    if check_at_most and len(questions) > check_at_most:
        checked = questions[:: -(-len(questions) // check_at_most)]
    cut = lm.count_cut_questions(checked, max_tokens)
    if cut:
        sample = f" (checked: {len(checked)}, evenly spaced over {len(questions)})" if checked is not questions else ""
        dataset = f" of {of}" if of else ""
        warnings.warn(
            f"{cut} of {len(checked)} {what} questions{dataset}{sample} are longer than data.max_question_tokens = "
            f"{max_tokens} tokens and lose their beginning (the model sees the last {max_tokens} tokens of each): "
            "raise data.max_question_tokens, or set it to 0 for no limit",
            stacklevel=2,
        )
    return cut


def question_seeds(seed: int, questions: list[str]) -> torch.Tensor:
    """One int63 seed per question, a pure function of (``seed``, the question's text)."""
    return torch.tensor([text_seed(f"{seed}/{q}") for q in questions], dtype=torch.int64)


def mask_seeds(seed: int, questions: list[str], stream: str, copies: int = 1) -> torch.Tensor:
    """``copies`` perturbation seeds per question (question-major), each a pure function of (``seed``, ``stream``,
    the copy, the question's text): a question gets the same masks wherever it sits in the list or the subset."""
    keys = [f"{seed}/{stream}/{k}/{q}" for q in questions for k in range(copies)]
    return torch.tensor([text_seed(key) for key in keys], dtype=torch.int64)


def eval_options(cfg: Config) -> dict[str, Any]:
    """The keyword arguments of :func:`evaluate` that ``eval.*``, ``seed`` and ``data.max_question_tokens`` set: one
    source for ``dgrpo eval``, the validation during training and the test sets after it, and a Python caller's
    ``evaluate(lm, records, **eval_options(cfg))`` (``eval.limit``, ``plain`` and ``shots`` are the callers' to
    apply)."""
    e = cfg.eval
    return {
        "n_latent": e.n_latent,
        "batch_size": e.batch_size,
        "max_new_tokens": e.max_new_tokens,
        "temperature": e.temperature,
        "top_p": e.top_p,
        "seed": cfg.seed,
        "max_question_tokens": cfg.data.max_question_tokens,
        "scorer": build_scorer(e.scorer),
    }


def evaluate(
    lm: LatentLM,
    records: list[Record],
    *,
    dataset: str = "",
    n_latent: int | None = None,
    batch_size: int = 256,
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int = 0,
    plain: bool = False,
    shots: int = 0,
    limit: int = 0,
    max_question_tokens: int | None = None,
    progress: bool = True,
    perturbation: Perturbation | None = None,
    scorer: ScoreFn | str | None = None,
    columns: Iterable[str] = (),
) -> EvalResult:
    """Greedy (by default) pass@1, with no perturbation unless ``perturbation`` (then question i is answered under the
    mask its own seed draws: :func:`mask_seeds` of ``seed`` and its text). ``scorer`` decides what is correct (a
    value of 1; 0 is wrong, and a value between, partial credit, is not correct; a function or an ``eval.scorer``
    name; default: the numeric verifier, which also counts unparseable outputs). ``limit`` > 0 evaluates the first
    ``limit`` records (after the ``shots`` of a plain prompt). ``n_latent``: the continuous thoughts (None or < 0: the
    model's own; none for a model trained without them). ValueError for negative counts, ``shots`` without
    ``plain`` and ``shots`` that leave no record to evaluate.

    The scorer gets each record with every column (``meta`` key) of ``records`` and of ``columns``, None where it has
    none (:func:`~dgrpo.data.records.with_columns`): a caller evaluating a shard of the data passes the whole data's
    :func:`~dgrpo.data.records.data_columns`, so that a scorer in TRL's form is called alike on every shard."""
    p = _prompted(
        "evaluate",
        lm,
        records,
        scorer=scorer,
        plain=plain,
        shots=shots,
        limit=limit,
        n_latent=n_latent,
        batch_size=batch_size,
        max_question_tokens=max_question_tokens,
    )
    texts = generate_answers(
        lm,
        p.questions,
        n_latent=p.n_latent,
        batch_size=batch_size,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        seed=seed,
        mode=p.mode,
        markers=p.markers,
        max_question_tokens=p.max_question_tokens,
        perturbation=perturbation,
        perturbation_seeds=None if perturbation is None else mask_seeds(seed, p.questions, "eval"),
        progress=progress,
        dataset=dataset,
        prompt_key=p.prompt_key,
    )
    preds, correct, unparseable = _graded(with_columns(p.records, columns), _as_answers(texts, plain), p.scorer)
    return p.result(lm, dataset, correct, unparseable, preds, _decoding(seed, temperature, top_p, max_new_tokens))


def _decoding(seed: int, temperature: float, top_p: float, max_new_tokens: int) -> dict[str, Any]:
    """The decoding an evaluation's answers were drawn with, as its :class:`EvalResult` records it (the fields of
    :meth:`_Prompted.result`'s ``decoding``)."""
    return {"seed": seed, "temperature": temperature, "top_p": top_p, "max_new_tokens": max_new_tokens}


class _Prompted(NamedTuple):
    """What :func:`evaluate` and :func:`evaluate_mc_vote` answer (the records, their prompts, the latent thoughts,
    generation mode and markers), the scorer, and what their result records of how (``shots`` and
    ``max_question_tokens`` as applied: no shots but a plain prompt's, no cut of a plain prompt)."""

    records: list[Record]
    questions: list[str]
    n_latent: int
    mode: str
    markers: bool
    scorer: ScoreFn
    plain: bool
    shots: int
    limit: int
    max_question_tokens: int | None
    started: float

    @property
    def prompt_key(self) -> str | None:
        """The option that shortens these prompts (:func:`generate_answers`): a plain prompt's shots, if any."""
        return ("eval.shots" if self.shots else "") if self.plain else None

    def result(
        self, lm: LatentLM, dataset: str, correct: int, unparseable: int, preds: list[dict], decoding: dict[str, Any]
    ) -> EvalResult:
        """The :class:`EvalResult` of these records: ``correct`` of them, graded in ``preds``; ``decoding`` holds
        the seed, temperature, top_p and max_new_tokens they were answered with. Its ``mode`` is the checkpoint's
        (or plain), not the generation mode: a cot or no_cot model answers in coconut mode with no thought, and is
        reported as what it is (``n_latent`` 0)."""
        n = len(self.records)
        return EvalResult(
            dataset=dataset,
            accuracy=correct / n if n else 0.0,
            n=n,
            correct=correct,
            unparseable=unparseable,
            n_latent=self.n_latent,
            mode="plain" if self.plain else lm.settings.mode,
            wall_s=round(time.time() - self.started, 3),
            scorer=scorer_name(self.scorer),
            mean_score=_mean_score(preds),
            max_question_tokens=self.max_question_tokens,
            limit=self.limit,
            shots=self.shots,
            predictions=preds,
            **decoding,
        )


def _prompted(
    what: str,
    lm: LatentLM,
    records: list[Record],
    *,
    scorer: ScoreFn | str | None,
    plain: bool,
    shots: int,
    limit: int,
    n_latent: int | None,
    batch_size: int,
    max_question_tokens: int | None,
) -> _Prompted:
    """The records :func:`evaluate` and :func:`evaluate_mc_vote` answer and how, after the checks both make of what
    they are given (one line each, naming ``what``): counts, the model, ``n_latent`` (an int; None or < 0: the
    model's own) and the records (an empty list is fine: a rank's shard of fewer records than ranks). The records
    evaluated are those after a plain prompt's ``shots`` (:func:`_split_shots`), the first ``limit`` of them (0:
    all), prompted as :func:`_prompts` says."""
    _check_counts(what, batch_size=batch_size, limit=limit, shots=shots, max_question_tokens=max_question_tokens)
    check_lm(lm, what)
    if n_latent is not None:
        _check_n_latent(what, n_latent, "an int (None or < 0: the model's own)", least=None)
    check_records(records, f"{what}: records", empty=True)
    started, score = time.time(), _scorer(scorer)
    shot_recs, records = _split_shots(records, plain, shots, what)
    if limit:
        records = records[:limit]
    questions, n_lat, mode, markers = _prompts(lm, records, plain, shot_recs, n_latent)
    return _Prompted(
        records,
        questions,
        n_lat,
        mode,
        markers,
        score,
        plain,
        shots,
        limit,
        None if plain else max_question_tokens,
        started,
    )


def _split_shots(
    records: list[Record], plain: bool, shots: int, what: str = "evaluate"
) -> tuple[list[Record], list[Record]]:
    """(the k-shot examples, the records to evaluate): the first ``shots`` records of a plain prompt; ValueError when
    ``shots`` come without ``plain`` (a latent model is prompted as trained) or leave no record to evaluate."""
    if not shots:
        return [], records
    if not plain:
        raise ValueError(f"{what}: shots={shots} apply to plain=True prompts only; pass plain=True or shots=0")
    if shots >= len(records):
        raise ValueError(
            f"{what}: shots={shots} leave no record to evaluate ({len(records)} records); "
            "give more records or fewer shots"
        )
    return records[:shots], records[shots:]


def _prompts(
    lm: LatentLM, records: list[Record], plain: bool, shots: list[Record], n_latent: int | None
) -> tuple[list[str], int, str, bool]:
    """(prompts, latent thoughts, generation mode, markers): a k-shot prompt without thoughts for a plain LM, else
    the question with ``n_latent`` thoughts (None or < 0: the model's own; none for a model trained without them)."""
    if plain:
        return [plain_prompt(r.question, shots) for r in records], 0, "plain", False
    return [r.question for r in records], *answer_layout(lm, n_latent)


def answer_layout(lm: LatentLM, n_latent: int | None) -> tuple[int, str, bool]:
    """(latent thoughts, generation mode, markers) with which :func:`evaluate` answers with ``lm`` (but a plain
    LM's k-shot prompt): ``n_latent`` thoughts (None or < 0: the model's own; none for a model trained without them)."""
    n_lat = lm.settings.n_latent if n_latent is None or n_latent < 0 else n_latent
    mode = lm.settings.mode
    if mode in ("cot", "no_cot", "plain"):
        n_lat, mode = 0, "coconut"
    return n_lat, mode, lm.settings.markers


def scorer_name(scorer: ScoreFn) -> str:
    """How results name a scorer: a built-in's name, a plug-in's ``module:function`` (``build_scorer`` names it)."""
    return getattr(scorer, "__name__", "scorer")


def _numeric_gold(gold: str) -> bool:
    """Whether the numeric verifier compares ``gold`` as a number (else, a text gold, as the text after the last
    ``#``)."""
    return normalize_number(str(gold)) is not None


def _graded(records: list[Record], texts: list[str], scorer: ScoreFn) -> tuple[list[dict], int, int]:
    """(one prediction row per record, how many are correct, how many have no parseable number): ``scorer``'s
    value (1: correct; in [0, 1]) is checked as a reward is, and kept as the row's ``score``. ``pred`` is the answer
    as the scorer reads it; only the numeric verifier's outputs for numeric golds count as unparseable (for a text
    gold it compares the text after the last ``#``)."""
    scores = call_checked(scorer, scorer_name(scorer), texts, records, "scorer")
    preds, correct, unparseable = [], 0, 0
    for r, text, value in zip(records, texts, scores):
        ok = value == 1
        correct += int(ok)
        unparseable += int(scorer is numeric and _numeric_gold(r.answer) and not is_parseable(text))
        pred = _shown_answer(scorer, text, r.answer)
        row = {"question": r.question, "gold": r.answer, "completion": text, "pred": pred, "correct": ok}
        preds.append({**row, "score": float(value)})  # (a partial-credit scorer's 0.5 was nowhere: only correct)
    return preds, correct, unparseable


def _shown_answer(scorer: ScoreFn, text: str, gold: str) -> str | None:
    """A prediction row's ``pred``: the answer ``scorer`` compares, as :func:`vote_key` reads it (the numeric
    verifier's number, choice's letter, coconut's text after the last ``#`` without commas, None without a ``#``:
    it reads none, and showed the whole completion), but a text answer as written, only stripped, where
    :func:`vote_key` normalises it so that answers the scorer takes as one (``Tom`` and ``tom.``) are one vote; None
    for an empty answer under every scorer, as a vote's (``####`` was ``""`` under exact and a plug-in, None under
    numeric and in a vote)."""
    if scorer is choice or scorer is coconut or (scorer is numeric and _numeric_gold(gold)):
        return vote_key(scorer, text, gold)
    return final_answer_text(text, gold).strip() or None


def _mean_score(preds: list[dict]) -> float:
    """The mean of prediction rows' ``score`` (:func:`ordered_mean`)."""
    return ordered_mean([p["score"] for p in preds])


def ordered_mean(scores: list[float]) -> float:
    """The mean of ``scores`` summed in their order (0 for none): the one expression of a result's mean score, of
    the merge of its shards' and of validation's over ranks, which agree bit for bit by being it."""
    return sum(scores) / len(scores) if scores else 0.0


def majority_vote(answers: list[str | None], same: Callable[[str, str], bool] | None = None) -> str | None:
    """The answer the most votes are ``same`` as (default: equal strings, so the most common), then the one written most
    often, then the one seen first; None when nothing parsed. ``same`` says which answers are one
    (:func:`dgrpo.reward.numbers_agree`: ``2.33`` and ``2.333``, as the verifier scores them alike). (Agreement is not
    transitive: ``0.13`` agrees with ``0.125``, ``2.335`` with ``2.33`` and ``2.34``; so no vote order decides, and of
    ``0.13, 0.125, 0.125`` the answer twice written wins. An answer between two others can win by agreeing with both:
    ``0.665`` of ``0.67, 0.67, 0.665, 0.66, 0.66``.)"""
    votes = [a for a in answers if a is not None]
    if not votes:
        return None

    def support(a: str) -> int:
        return sum(b == a or (same is not None and same(a, b)) for b in votes)

    return max(dict.fromkeys(votes), key=lambda a: (support(a), votes.count(a)))  # (max: the first of equals)


def vote_key(scorer: ScoreFn, text: str, gold: str) -> str | None:
    """The answer a completion votes for, as ``scorer`` reads it; None when it holds none.

    ``numeric``: the normalised final number (:func:`extract_answer`) for a numeric gold, and for a text gold (ProsQA)
    the normalised text after the last ``#``, which is what :func:`dgrpo.reward.score` compares; ``choice``: the
    letter A-E; ``coconut``: the text after the last ``#`` without commas, as it compares it (``1,000`` and ``1000``
    split the vote), none without a ``#``; ``exact`` and any plug-in: the normalised final answer text (after the last
    ``#``: :func:`dgrpo.reward.final_answer_text`), for ``exact`` and a numeric gold its number if it is one.
    Normalised, unlike a prediction row's ``pred`` (:func:`_shown_answer`): two answers that score alike must be
    one vote (split, ``Tom`` and ``tom.`` would lose to a wrong answer written twice)."""
    if scorer is choice:
        return choice_letter(text)
    if scorer is coconut:
        return (final_answer_text(text).replace(",", "").strip() or None) if "#" in text else None
    if scorer is numeric and _numeric_gold(gold):
        return extract_answer(text)
    answer = normalize_text(final_answer_text(text, gold))
    if scorer is exact and _numeric_gold(gold):  # (exact reads a number gold's answer as a number: 2.50 is 2.5)
        return normalize_number(answer) or answer or None
    return answer or None


@torch.no_grad()
def _perturbed_texts(
    lm: LatentLM,
    p: _Prompted,
    perturbation: Perturbation,
    *,
    n_masks: int,
    batch_size: int,
    max_new_tokens: int,
    seed: int,
    progress: bool,
    dataset: str = "",
    temperature: float = 0.0,
    top_p: float = 1.0,
) -> list[str]:
    """``n_masks`` completions of each of ``p``'s questions (question-major), the k-th under the mask of
    :func:`mask_seeds` (stream mc-vote), greedy, or sampled (``temperature`` > 0) from its own seed (stream
    mc-vote-sampling: one per copy, as each has its own mask; one seed per question drew the same tokens in every
    copy): a question's votes do not depend on the others in the list."""
    sampled = temperature > 0
    return generate_answers(
        lm,
        [q for q in p.questions for _ in range(n_masks)],
        n_latent=p.n_latent,
        batch_size=batch_size,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        sampling_seeds=mask_seeds(seed, p.questions, "mc-vote-sampling", copies=n_masks) if sampled else None,
        mode=p.mode,
        markers=p.markers,
        max_question_tokens=p.max_question_tokens,
        perturbation=perturbation,
        perturbation_seeds=mask_seeds(seed, p.questions, "mc-vote", copies=n_masks),
        progress=progress,
        desc="mc-vote",
        dataset=dataset,
        prompt_key=p.prompt_key,
    )


def _voted(records: list[Record], texts: list[str], n_masks: int, scorer: ScoreFn) -> tuple[list[dict], int]:
    """(one prediction row per record, how many are correct): each record's ``n_masks`` completions vote with
    :func:`vote_key` (numbers grouped as the numeric verifier compares them); every completion is scored by
    ``scorer`` (one call, :func:`_mask_scores`), and the question is correct when a completion giving the majority
    answer (:func:`_voted_completion`) scores 1. A row's ``correct_masks`` counts its masks that score 1 (what
    :func:`pass_at_k` estimates from)."""
    values = _mask_scores(scorer, texts, records, n_masks)
    preds: list[dict] = []
    for j, r in enumerate(records):
        mine, scores = texts[j * n_masks : (j + 1) * n_masks], values[j * n_masks : (j + 1) * n_masks]
        votes = [vote_key(scorer, t, r.answer) for t in mine]
        by_number = scorer is numeric and _numeric_gold(r.answer)
        vote = majority_vote(votes, numbers_agree if by_number else None)
        # (a question without a vote shows its first completion, and scores 0)
        k = 0 if vote is None else _voted_completion(mine, votes, vote, by_number)
        score = 0.0 if vote is None else scores[k]
        row = {"question": r.question, "gold": r.answer, "votes": votes, "pred": vote, "completion": mine[k]}
        correct_masks = sum(v == 1 for v in scores)
        preds.append({**row, "correct": score == 1, "score": score, "correct_masks": correct_masks})
    return preds, sum(p["correct"] for p in preds)


def _voted_completion(texts: list[str], votes: list[str | None], vote: str, numeric_gold: bool) -> int:
    """The index of the completion scored for a vote: the first that gave it; for a number, the one the verifier
    credits with the widest rounding (:func:`dgrpo.reward.numbers_match`), the fewest decimals of 2 or more, else the
    most (the first of equals): ``36`` and ``36.00`` are one vote, as are ``2.33`` and ``2.330``, but the verifier
    takes ``36.00`` for 36.0000102016 and ``2.33``, not ``2.330``, for 2.3333..., so which came first decided the
    question."""
    given = [i for i, v in enumerate(votes) if v == vote]
    if not numeric_gold:
        return given[0]

    def widest_first(i: int) -> tuple[int, int]:
        decimals = answer_decimals(texts[i])
        return (0, decimals) if decimals >= 2 else (1, -decimals)

    return min(given, key=widest_first)


def _mask_scores(scorer: ScoreFn, texts: list[str], records: list[Record], n_masks: int) -> list[float]:
    """``scorer``'s value of each of ``texts``, ``n_masks`` completions per record (question-major), in one call; an
    error names the row as :func:`evaluate` does (the record's index) and the mask (it named the completion's index
    in the call)."""
    if not texts:
        return []
    try:
        return [float(v) for v in call_checked(scorer, scorer_name(scorer), texts, _copies(records, n_masks), "scorer")]
    except RewardError as e:
        raise RewardError(_masked_rows(str(e), n_masks, len(texts))) from None


def _copies(records: list[Record], n: int) -> list[Record]:
    """Each record ``n`` times, in order (one per mask)."""
    return [r for r in records for _ in range(n)]


#: where a scorer's error line names the completion's index in its call (:func:`~.scoring.call_checked`)
_ROW_NAMED = re.compile(r"\brow (\d+)(?= \(completion |: completion )")
_ROWS_NAMED = re.compile(r"\brows (\d+)-(\d+) together \(of the \d+ in the call\)")


def _masked_rows(line: str, n_masks: int, total: int) -> str:
    """A scorer's error ``line`` for a call of ``n_masks`` completions per record, its completions' indices in the
    call named as the record's row and the mask (``row 7`` of 2 masks: ``row 3, mask 1``)."""

    def at(i: str) -> str:
        return f"row {int(i) // n_masks}, mask {int(i) % n_masks}"

    line = _ROWS_NAMED.sub(
        lambda m: f"{at(m[1])} to {at(m[2])} together (of the {total} completions in the call, {n_masks} per row)",
        line,
    )
    return _ROW_NAMED.sub(lambda m: at(m[1]), line)


def pass_ks(n_masks: int) -> list[int]:
    """The k of :func:`evaluate_mc_vote`'s ``pass_at_k``: 1, the powers of 2 below ``n_masks``, and ``n_masks``."""
    return sorted({1, n_masks} | {2**i for i in range(n_masks.bit_length()) if 2**i < n_masks})


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimator of pass@k (Chen et al. 2021, "Evaluating Large Language Models Trained on Code"): the
    chance that k of a question's ``n`` samples, ``c`` of them correct, drawn without replacement hold a correct
    one, 1 - C(n-c, k) / C(n, k). ValueError unless 0 <= c <= n and 1 <= k <= n."""
    if not (isinstance(n, int) and isinstance(c, int) and isinstance(k, int) and 0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass_at_k: needs 0 <= c <= n and 1 <= k <= n, got n={n!r}, c={c!r}, k={k!r}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_at_k_of(correct_masks: list[int], n_masks: int) -> dict[str, float]:
    """``pass_at_k`` of an evaluation (keys: the k of :func:`pass_ks`, as strings, as results.json writes them): per k,
    :func:`pass_at_k` of each question's ``correct_masks`` of ``n_masks``, averaged (:func:`ordered_mean`; 0 for no
    question)."""
    return {str(k): ordered_mean([pass_at_k(n_masks, c, k) for c in correct_masks]) for k in pass_ks(n_masks)}


def evaluate_mc_vote(
    lm: LatentLM,
    records: list[Record],
    perturbation: Perturbation,
    *,
    n_masks: int = 8,
    dataset: str = "",
    n_latent: int | None = None,
    batch_size: int = 256,
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int = 0,
    plain: bool = False,
    shots: int = 0,
    limit: int = 0,
    max_question_tokens: int | None = None,
    progress: bool = True,
    scorer: ScoreFn | str | None = None,
    columns: Iterable[str] = (),
) -> EvalResult:
    """Monte-Carlo perturbation ensemble: greedy (by default) answers under ``n_masks`` seeded perturbations per
    question, majority vote. This is the model-average policy Dropout-GRPO optimises (paper Sec. 3.1, Sec. 6). A
    question's masks are a function of ``seed`` and its text (:func:`mask_seeds`): its vote is the same in any list or
    subset. ``temperature`` > 0 (with ``top_p``) samples each copy's answer, as :func:`evaluate` samples, from a seed
    of the copy's own (of ``seed``, the copy and the question's text), so the copies are drawn apart and the vote is
    again the same in any list. ``n_latent``, ``plain``, ``shots``, ``limit`` and ``columns`` mean what they mean to
    :func:`evaluate` (``limit`` > 0 votes on the first ``limit`` records after a plain prompt's ``shots``; the scorer
    gets every column of ``records`` and ``columns``, and scores every completion, in one call), and are checked as it
    checks them: ``evaluate_mc_vote(lm, records, perturbation, **eval_options(cfg))`` takes the config's decoding as
    :func:`evaluate` does.

    Each completion votes for its answer as ``scorer`` (default: the numeric verifier) reads it (:func:`vote_key`;
    with the numeric scorer and a numeric gold, numbers the verifier compares as one, ``2.33`` and ``2.333``, vote
    together); ties go to the answer written most often, then to the one seen first (:func:`majority_vote`). The
    question is correct when ``scorer`` scores a completion that gave the majority answer correct (the first; of a
    number's, the one written to the decimals the verifier credits most widely: ``36.00`` over ``36``, ``2.33`` over
    ``2.330``), so a vote counts exactly as that completion would in :func:`evaluate`. ``unparseable`` counts (numeric
    scorer only, as in :func:`evaluate`) the questions none of whose completions holds an answer. ``pass_at_k``
    (k: :func:`pass_ks`, 1 and ``n_masks`` among them) is the mean over questions of :func:`pass_at_k` of its masks'
    completions scoring 1 (each row's ``correct_masks``): pass@1 is the mean single mask's accuracy, pass@n_masks
    the share of questions some mask answers, beside the vote's ``accuracy``. ConfigError when
    question, latents and answer do not fit the model's context; ValueError when ``n_masks`` < 1."""
    _check_vote(n_masks, perturbation)
    p = _prompted(
        "evaluate_mc_vote",
        lm,
        records,
        scorer=scorer,
        plain=plain,
        shots=shots,
        limit=limit,
        n_latent=n_latent,
        batch_size=batch_size,
        max_question_tokens=max_question_tokens,
    )
    decoding = _decoding(seed, temperature, top_p, max_new_tokens)
    texts = _perturbed_texts(
        lm, p, perturbation, n_masks=n_masks, batch_size=batch_size, progress=progress, dataset=dataset, **decoding
    )
    preds, correct = _voted(with_columns(p.records, columns), _as_answers(texts, plain), n_masks, p.scorer)
    result = p.result(lm, dataset, correct, _unanswered(p, preds), preds, decoding)
    passed = pass_at_k_of([pred["correct_masks"] for pred in preds], n_masks)
    return replace(result, mode=f"{result.mode}+mc{n_masks}", pass_at_k=passed)


def _check_vote(n_masks: object, perturbation: object) -> None:
    """What :func:`evaluate_mc_vote` checks beyond what :func:`evaluate` does (one line each): ValueError unless
    ``n_masks`` is an int >= 1, TypeError unless ``perturbation`` is a dgrpo Perturbation."""
    if not isinstance(n_masks, int) or n_masks < 1:
        raise ValueError(
            f"evaluate_mc_vote: n_masks must be an int >= 1 (completions voting per question), got {n_masks!r}"
        )
    if not isinstance(perturbation, Perturbation):  # (None was "perturbation_seeds without a perturbation")
        raise TypeError(
            "evaluate_mc_vote: perturbation must be a dgrpo Perturbation, the masks that vote (e.g. "
            f"dgrpo.perturbation.LockedDropout(p=0.1)), got {type(perturbation).__name__}"
        )


def _unanswered(p: _Prompted, preds: list[dict]) -> int:
    """``unparseable`` of a vote, as :func:`evaluate` counts it: under the numeric verifier, the numeric golds
    without a vote (a text gold's empty answer is no number missing); 0 under another scorer."""
    if p.scorer is not numeric:
        return 0
    return sum(pred["pred"] is None and _numeric_gold(r.answer) for pred, r in zip(preds, p.records))
