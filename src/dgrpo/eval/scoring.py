"""What counts as correct, and what a rollout earns: built-in scorers, reward and scorer plug-ins, and their
weighted combination.

A scorer or reward function is batched: ``fn(completions: list[str], records: list[Record]) -> list[float]``, one
value per completion (``records[i]`` is the problem completion ``i`` answers: its ``question``, ``answer``,
``steps`` and ``meta``). A scorer returns a value in [0, 1], 1 for a correct completion (the built-in ones 1 or 0;
a value between is partial credit, counted as not correct; within :data:`SCORE_TOLERANCE` of the range, a float
sum's rounding, it is taken as its end); a reward may return any finite number, or None (below). Built-in
scorers, by name: ``numeric`` (the answer's number equals the gold number; text golds are compared as normalised
text), ``exact`` (the final answer, after the last ``#`` if any, equals the gold after normalisation: case,
spacing, a trailing period, a space between a digit and a symbol, ``50 %``; a number gold against the answer read
as a number; against a gold that holds a ``#`` itself, ``C#``, the answer is read after the last standalone marker,
``#### C#``), ``choice`` (a multiple-choice letter A-E), ``coconut`` (Coconut's run.py check, as strings). A
plug-in is named ``package.module:function`` or ``path/to/file.py:function``.

A function written for TRL's ``GRPOTrainer`` works as it is: one that takes ``**kwargs`` (no ``*args``, no
``records``; its named parameters columns of the data: :func:`trl_style`) is called with keywords,
``fn(prompts=..., completions=..., answer=..., steps=..., <column>=...)``, each a list with one entry per
completion: the question, the completion's text, the gold answer, the steps, and every other column of the data
(a record's ``meta``, ``source`` among them: the file or dataset the record was read from; None where a record
lacks it).

Every call is checked: a function that raises, returns the wrong number of values, or a value that is not a
finite number is a :class:`RewardError` (one line naming the function and the row). A reward (not a scorer) may
return None or NaN for a completion, as TRL's reward functions do for "does not apply": it adds nothing to that
completion's weighted total, as TRL's ``nansum`` (:class:`Rewards`). A number may be a Python, NumPy
or 0-d torch one, a bool counting 0 or 1 (:func:`reward_value`), so a 1-d array or tensor is a fine return value.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import decimal
import functools
import hashlib
import inspect
import math
import numbers
import re
import sys
import warnings
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, SupportsFloat, cast

from ..config import FLOAT32_MAX, reward_name
from ..data.records import Record, data_columns
from ..plugins import PluginError, import_object, name_hint
from ..reward import ANSWER_IS, extract_answer, final_answer_text, normalize_number, normalize_text, score

#: what a scorer or reward returns: one number per completion (a list, a 1-d NumPy array or tensor:
#: :func:`reward_value`)
ScoreValues = Iterable[SupportsFloat | None]
#: a scorer or reward: ``fn(completions, records)``, or a function in TRL's form called with keywords
#: (:func:`trl_style`); either may be an ``async def`` (:func:`awaited`); a reward's None: "does not apply"
ScoreFn = Callable[..., ScoreValues | Awaitable[ScoreValues]]


class RewardError(ValueError):
    """A reward or scorer that cannot be loaded, or that misbehaved on a batch (the message is one line)."""


class RewardSetupError(RewardError):
    """A trainer's reward that cannot be built (a file or function not found, not a function): what every process of
    a torchrun job meets alike, from the same files, unlike a reward's own failure on one rank's records."""


def numeric(completions: list[str], records: list[Record]) -> list[float]:
    """The verifier: the completion's answer number equals the gold answer (:func:`dgrpo.reward.score`)."""
    return [score(c, r.answer) for c, r in zip(completions, records)]


def exact(completions: list[str], records: list[Record]) -> list[float]:
    """The final answer text equals the gold after normalisation (:func:`dgrpo.reward.normalize_text`); a gold that is a
    number, which the loaders keep normalised (``$3.50`` is ``3.5``, ``007`` is ``7``), is equal to the answer text
    normalised alike (``#### $3.50`` and ``#### 007`` were wrong for the golds their own text was read as)."""
    return [_exact(c, str(r.answer)) for c, r in zip(completions, records)]


def _exact(completion: str, gold: str) -> float:
    answer = normalize_text(final_answer_text(completion, gold))
    number = normalize_number(gold)
    if number is not None and normalize_number(answer) == number:
        return 1.0
    return float(answer == normalize_text(gold))


_LETTER = re.compile(r"(?<![A-Za-z])(\()?([A-E])(?![A-Za-z])(\)|[.:])?")
_LONE_LETTER = re.compile(r"\s*\(?([A-Ea-e])\)?[.:]?\s*")


def choice_letter(text: str) -> str | None:
    """The multiple-choice letter a text answers with (None: none). After the last ``#`` the answer comes first: the
    first standalone A-E there (``#### (C) A tree`` and ``#### D, not B`` answer C and D), as after the last "The
    answer is" / "Answer:" with a letter after it ("The answer is B because A is a trap": B). Any other text (a gold
    such as ``C. A tree``, or "Options (B) and (D); (D) it is.") ends with it: its last marked letter, one in brackets
    or followed by ``.``, ``)`` or ``:``, else its last standalone A-E. A lone letter may be lower case
    (``#### c``); elsewhere a lower-case ``a`` is read as the article, so only capitals count."""
    part = final_answer_text(text)
    lone = _LONE_LETTER.fullmatch(part)
    if lone:
        return lone.group(1).upper()
    letters = list(_LETTER.finditer(part))
    found = [(m.group(2), bool(m.group(1) or m.group(3))) for m in letters]
    if not found:
        return None
    if "#" in text:
        return found[0][0]
    for marker in reversed(list(ANSWER_IS.finditer(part))):  # (the last marker with a letter after it)
        after = [m.group(2) for m in letters if m.start() >= marker.end()]
        if after:
            return after[0]
    marked = [letter for letter, is_marked in found if is_marked]
    return (marked or [letter for letter, _ in found])[-1]


def choice(completions: list[str], records: list[Record]) -> list[float]:
    """A multiple-choice answer: the completion's letter A-E equals the gold's (:func:`choice_letter`)."""
    letters = [choice_letter(c) for c in completions]
    return [float(x is not None and x == choice_letter(str(r.answer))) for x, r in zip(letters, records)]


def coconut(completions: list[str], records: list[Record]) -> list[float]:
    """Coconut's own check (its run.py): the text after the last ``#``, commas removed and stripped, equals the gold
    so written, as strings. Stricter than ``numeric``: ``5000.0``, ``$5000``, ``5000 dollars``, an answer without a
    ``#`` and the last number of a chain cut short all score 0."""
    return [
        float("#" in c and final_answer_text(c).replace(",", "").strip() == str(r.answer).replace(",", "").strip())
        for c, r in zip(completions, records)
    ]


#: scorers by name (``eval.scorer``)
SCORERS: dict[str, ScoreFn] = {"numeric": numeric, "exact": exact, "choice": choice, "coconut": coconut}


def load_function(spec: str, what: str = "reward") -> ScoreFn:
    """A built-in scorer's name, ``package.module:function`` or ``path/to/file.py:function``."""
    if spec in SCORERS:
        return SCORERS[spec]
    target, _, name = spec.rpartition(":")
    if not target or not name:
        raise RewardError(
            f"{what} {spec!r}: expected a built-in scorer ({', '.join(SCORERS)}), 'package.module:function' or "
            f"'path/to/file.py:function'{name_hint(spec)}"
        )
    try:
        fn = import_object(spec, what)
    except PluginError as e:
        raise RewardError(str(e)) from None
    if not callable(fn):
        raise RewardError(f"{what} {spec!r}: {name!r} in {target} is not a function (its type: {type(fn).__name__})")
    if inspect.isclass(fn):  # (it was called with the completions as its constructor's: 'Judge.__init__() takes ...')
        raise RewardError(
            f"{what} {spec!r}: {name!r} in {target} is a class; name a function, or an instance of it made in that "
            f"file (judge = {name}(...), then {target}:judge)"
        )
    return fn


def _parameters(fn: Callable) -> list[inspect.Parameter]:
    """``fn``'s parameters; none for a callable without a signature (a builtin)."""
    try:
        return list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return []


def trl_style(fn: Callable, columns: Iterable[str] | None = None) -> bool:
    """Whether ``fn`` is a reward function in TRL's form: it takes ``**kwargs``, no ``*args`` (a decorator's
    ``wrapper(*args, **kwargs)`` passes dgrpo's two arguments on) and no ``records``, and, given the ``columns`` it
    would be called with, its required parameters are among them unless it has some other number than two (a
    ``(completions, batch, **kw)`` is dgrpo's form under other names) or one is a keyword only TRL passes
    (``TRL_ONLY``: such a function was written for TRL, and its call fails saying how it was called)."""
    params = _parameters(fn)  # (none: a builtin without a signature, called as dgrpo's)
    kinds = {p.kind for p in params}
    if inspect.Parameter.VAR_KEYWORD not in kinds or kinds & {
        inspect.Parameter.VAR_POSITIONAL,
        inspect.Parameter.POSITIONAL_ONLY,
    }:
        return False
    if any(p.name == "records" for p in params):
        return False
    required = [p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD and p.default is p.empty]
    if columns is None or len(required) != 2 or any(name in TRL_ONLY for name in required):
        return True
    return all(name in columns for name in required)


#: the keywords TRL's GRPOTrainer gives a reward function that dgrpo does not (it has no such objects)
TRL_ONLY = ("trainer_state", "completion_ids")


def trl_columns(completions: list[str], records: list[Record], columns: Iterable[str] = ()) -> dict[str, list]:
    """The keyword arguments TRL's GRPOTrainer gives a reward function, one entry per completion: ``prompts``,
    ``completions``, ``answer``, ``steps`` and each other column of the data (``meta``; None where a record lacks
    it): those of ``records``, and the ``columns`` of the whole data (:func:`data_columns`) that no record of this
    batch has, all None (the same arguments for every batch)."""
    out: dict[str, list] = {
        "prompts": [r.question for r in records],
        "completions": list(completions),
        "answer": [r.answer for r in records],
        "steps": [r.steps for r in records],
    }
    for key in dict.fromkeys([*columns, *data_columns(records)]):
        out.setdefault(key, [r.meta.get(key) for r in records])
    return out


def call_checked(
    fn: ScoreFn,
    name: str,
    completions: list[str],
    records: list[Record],
    what: str = "reward",
    columns: Iterable[str] = (),
) -> list[float]:
    """``fn(completions, records)`` (a function in TRL's form, :func:`trl_style`: ``fn(**trl_columns(...))``),
    checked: it must return one finite number per completion (an error names it as ``what``: a reward, or a scorer in
    evaluation, whose values must lie in [0, 1]: 1 is correct); a reward may return None or NaN, TRL's "does not
    apply to this completion", which is NaN here (:class:`Rewards` leaves it out of the total). ``columns``: those
    of the whole data (:func:`data_columns`), so that the form a function is called in, and the keywords it gets, do
    not depend on which records a batch holds."""
    _refuse_keywordless(fn, name, what)
    columns = trl_columns(completions, records, columns)
    trl = trl_style(fn, columns)
    if not trl and trl_style(fn):
        _warn_called_as_dgrpo(fn, name, columns)
    elif not trl:
        _warn_prompts_first(fn, name, columns)

    def arguments(completions: list[str], records: list[Record]) -> tuple[tuple, dict[str, Any]]:
        return ((), trl_columns(completions, records, columns)) if trl else ((completions, records), {})

    def call(completions: list[str], records: list[Record]) -> Any:
        args, keywords = arguments(completions, records)
        returned = awaited(fn(*args, **keywords))
        # a generator or map() computes its values as they are read: read here, so that an error in it is the
        # function's, named with its row (it escaped bare from the reading below, a TypeError read as a bad return)
        return list(returned) if isinstance(returned, Iterator) else returned

    try:
        returned = call(completions, records)
    except RewardError:  # (a plug-in scorer's own checked call already named it: not wrapped twice)
        raise
    except (Exception, SystemExit) as e:  # noqa: BLE001 - the user's function failed: one line naming it (a
        # sys.exit() in it, too: it would end training silently; KeyboardInterrupt, Ctrl-C's or SIGTERM's, still stops)
        # (a call its signature refuses fails on every row: no row is named)
        refused = isinstance(e, TypeError) and _signature_refuses(fn, *arguments(completions, records))
        where = "" if refused else _failing_row(call, completions, records, type(e))
        missing = _trl_only_required(fn) if refused else []
        said = _failure(e, trl, missing, columns)
        raise RewardError(f"{what} {name} raised {type(e).__name__}: {said}{where}") from None
    try:
        if isinstance(returned, (str, Mapping, AbstractSet)):  # iterable, but not the values in the rows' order
            raise TypeError
        values = list(returned)
    except TypeError:  # None, one float, a dict, ...: not one value per completion
        shown = repr(returned)[:60]
        raise RewardError(f"{what} {name} returned {shown}, not one value per completion (a list of numbers)") from None
    if len(values) != len(completions):
        got, asked = len(values), len(completions)
        shape = tuple(getattr(returned, "shape", ())) if getattr(returned, "ndim", 1) > 1 else ()
        said = f" (an array of shape {shape}: one number per completion is 1-D)" if shape else ""  # (tensor([xs]))
        raise RewardError(
            f"{what} {name} returned {got} value{'s' * (got != 1)} for {asked} completion{'s' * (asked != 1)}{said}"
        )
    out = []
    for i, v in enumerate(values):
        x = reward_value(v)
        if x is None and what == "reward" and (v is None or getattr(v, "ndim", 0) == 0 and _is_nan(v)):
            out.append(math.nan)  # TRL's "does not apply", NaN as its trainer keeps it (Rewards' total leaves it out)
            continue
        if x is None:
            why = ""
            if v is None:  # (a scorer's: what counts as correct needs an answer for every completion)
                why = ": every completion needs a number in [0, 1]: return 0.0 for one not correct"
            elif isinstance(v, str):  # (a judge's reply passed on as it came: '1' read as no number, unsaid)
                why = ": a string, not a number (convert it: float(...))"
            elif getattr(returned, "ndim", 1) > 1:  # (an array of shape [n, 1]: its rows are arrays)
                shape = tuple(getattr(returned, "shape", ()))
                why = f": it returned an array of shape {shape}; one number per completion is 1-D"
            elif _is_nan(v):
                why = ": every completion needs a finite number: return 0.0 for one it cannot score"
            raise RewardError(f"{what} {name} returned {v!r} for row {i} ({_row(completions, records, i)}){why}")
        if abs(x) > FLOAT32_MAX:  # (the rewards are a float32 tensor: inf there, then NaN advantages)
            raise RewardError(
                f"{what} {name} returned {x:g} for row {i} ({_row(completions, records, i)}){_PAST_FLOAT32}"
            )
        if what == "scorer":
            x = _score_in_range(x, name, i, _row(completions, records, i))
        out.append(x)
    return out


#: why a reward past float32's range is refused
_PAST_FLOAT32 = f": past float32's range, +-{FLOAT32_MAX:.4g}, in which the rewards are kept (it would be inf there)"


def _is_nan(v: object) -> bool:
    """Whether ``v`` reads as a NaN float (a Python, NumPy or 0-d torch one)."""
    try:
        return math.isnan(float(cast(Any, v)))
    except (TypeError, ValueError, OverflowError, RuntimeError):  # (RuntimeError: a tensor of several values)
        return False


def awaited(value: Any) -> Any:
    """What an ``async def`` reward's call gave (TRL's GRPOTrainer takes those too), run to its end in an event loop
    of its own: in a thread of its own where this thread runs a loop already (a notebook's); any other value as it
    is."""
    if not inspect.isawaitable(value):
        return value

    async def result() -> Any:
        return await value

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(result())
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, result()).result()


def _refuse_keywordless(fn: Callable, name: str, what: str) -> None:
    """A RewardError for a function that takes ``**kwargs`` and parameters before a ``/`` (positional-only) and cannot
    take dgrpo's two arguments, ``fn(completions, records)``: in TRL's form it is called by keyword, as TRL's trainer
    calls it, which such a parameter refuses (``def r(completions, /, **kw)`` failed on every call, "takes 1
    positional argument but 2 were given")."""
    params = _parameters(fn)
    only = _positional_only(params)
    if not only or not any(p.kind is p.VAR_KEYWORD for p in params):
        return
    try:
        inspect.signature(fn).bind([], [])
    except TypeError:
        raise RewardError(
            f"{what} {name}: {only}, but a function taking **kwargs is called by keyword, as TRL's trainer calls it "
            "(prompts=..., completions=..., the data's columns): remove the '/', or take dgrpo's two arguments, "
            "fn(completions, records)"
        ) from None
    except ValueError:
        return


def _positional_only(params: list[inspect.Parameter]) -> str:
    """``a, b are positional-only (before '/')`` for the parameters of ``params`` that are; '' when none is."""
    only = [p.name for p in params if p.kind is p.POSITIONAL_ONLY]
    return f"{', '.join(only)} {'is' if len(only) == 1 else 'are'} positional-only (before '/')" if only else ""


def _trl_only_required(fn: Callable) -> list[str]:
    """The keywords of :data:`TRL_ONLY` that ``fn`` requires (no default): those its call here lacks."""
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [p.name for p in _parameters(fn) if p.name in TRL_ONLY and p.kind in named and p.default is p.empty]


def _failure(error: BaseException, trl: bool, missing: Sequence[str] = (), keywords: Iterable[str] = ()) -> str:
    """The first line of a reward's ``error``, and how it came about where dgrpo knows more than the error says
    (``missing``: the keywords only TRL's trainer passes that the function requires; ``keywords``: those a function
    in TRL's form is called with, named when it looked one up that is not among them, ``kwargs["solution"]``)."""
    how, keywords = "", list(keywords)
    key = error.args[0] if isinstance(error, KeyError) and len(error.args) == 1 else None
    if trl and isinstance(key, str) and key not in keywords:  # (a column the data lacks: which ones it has)
        how = (
            f" (if looked up in its **kwargs: no such keyword; it is called with {', '.join(keywords)}: the data's "
            "columns by their names, data.answer_key's too)"
        )
    if isinstance(error, SystemExit):
        how = " (sys.exit() called in it: raise an error, or return 0 for a completion it cannot score)"
    if missing:  # (TRL's trainer passes them; dgrpo has no such objects)
        defaults = ", ".join(f"{m}=None" for m in missing)
        how = (
            f" (dgrpo does not pass {' or '.join(missing)}, which TRL's GRPOTrainer passes: give "
            f"{'it' if len(missing) == 1 else 'each'} a default, {defaults}, and handle None)"
        )
    elif trl and isinstance(error, TypeError):  # (a signature mistaken for TRL's says how it was called)
        how = (
            " (called as TRL's reward functions are, by keyword: prompts, completions, answer, steps and the "
            "data's columns, completions as text, not chat messages; dgrpo's form is fn(completions, records))"
        )
    return f"{str(error).splitlines()[0] if str(error) else ''}{how}"


def _signature_refuses(fn: Callable, args: tuple, keywords: dict[str, Any]) -> bool:
    """Whether ``fn``'s signature refuses a call with these arguments (``fn(completions)`` called with two): the
    TypeError of the call itself, not of a row's value. False when ``fn`` has no signature to read (a builtin)."""
    try:
        inspect.signature(fn).bind(*args, **keywords)
    except TypeError:
        return True
    except ValueError:
        return False
    return False


def _failing_row(
    call: Callable[[list[str], list[Record]], Any],
    completions: list[str],
    records: list[Record],
    error: type[BaseException],
) -> str:
    """Where a batched call failed with an ``error``: the row found by calling halves of the batch, each time the
    first half that fails with the same kind of error (at most 2 calls per halving: 18 for 512 rows), with its
    completion and question. When neither half fails so (a failure of rows called together: a limit on the call's
    size, a value that depends on the batch), the rows that do, among the call's, and the first one's completion and
    question."""
    lo, hi = 0, len(completions)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        for a, b in ((lo, mid), (mid, hi)):
            try:
                call(completions[a:b], records[a:b])
            except error:
                lo, hi = a, b
                break
            except (Exception, SystemExit):  # noqa: BLE001 - another failure: not the one looked for
                continue
        else:
            return (
                f" on rows {lo}-{hi - 1} together (of the {len(completions)} in the call), neither half of them "
                f"alone: it depends on the rows called together, not on one row (row {lo}: "
                f"{_row(completions, records, lo)})"
            )
    if not completions:
        return ""
    return f" on row {lo} ({_row(completions, records, lo)})"


def _row(completions: list[str], records: list[Record], i: int) -> str:
    """Row ``i`` as an error line names it: its completion and question, each cut at 60 characters."""
    return f"completion {completions[i][:60]!r}, question {records[i].question[:60]!r}"


#: how far a scorer's value may lie from 1 and still be 1 (from 0 and still be 0): a float32 or float sum's rounding
#: (0.7 + 0.2 + 0.1 is 0.9999999999999999, ten float32 0.1s 1.0000001)
SCORE_TOLERANCE = 1e-6


def _score_in_range(x: float, name: str, row: int, shown: str) -> float:
    """A scorer's value, 1 within SCORE_TOLERANCE of 1 and 0 of 0; outside [0, 1] (so widened) a RewardError naming
    the row (``shown``: its completion and question)."""
    if not -SCORE_TOLERANCE <= x <= 1 + SCORE_TOLERANCE:
        raise RewardError(
            f"scorer {name} returned {float(x)!r} for row {row} ({shown}): a scorer's value is in [0, 1], 1 for a "
            "correct answer"
        )
    return 1.0 if x >= 1 - SCORE_TOLERANCE else 0.0 if x <= SCORE_TOLERANCE else x


_WARNED_DGRPO_FORM: set[str] = set()


def _warn_called_as_dgrpo(fn: Callable, name: str, columns: dict) -> None:
    """Once per function: one that takes ``**kwargs`` and two required parameters, not both columns of the data, is
    called as dgrpo's ``fn(completions, records)``; if it was written for TRL, its second parameter gets the records."""
    if name in _WARNED_DGRPO_FORM:
        return
    _WARNED_DGRPO_FORM.add(name)
    params = inspect.signature(fn).parameters.values()
    first, second = [p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD and p.default is p.empty][:2]
    missing = [p for p in (first, second) if p not in columns]
    warnings.warn(
        f"{name} takes **kwargs, but {' and '.join(map(repr, missing))} {'is' if len(missing) == 1 else 'are'} no "
        f"column of the data (columns: {', '.join(columns)}), so it is called as dgrpo's fn(completions, records): "
        f"{first!r} gets the completions and {second!r} the records. Written for TRL? Name a column (a mapped "
        "data.answer_key keeps its own name too). Written for dgrpo? Name the parameter records",
        stacklevel=3,
    )


def _warn_prompts_first(fn: Callable, name: str, columns: Iterable[str] = ()) -> None:
    """Once per function: one called as dgrpo's ``fn(completions, records)`` whose first parameter is TRL's
    ``prompts`` (``f(prompts, completions)`` without ``**kwargs``, which TRL's trainer could not call either: it
    passes more keywords) gets the completions as its prompts and the records as its completions; one whose second
    parameter is named as one of the ``columns`` it would get in TRL's form (``f(completions, solution)``) gets the
    records in it, silently (its every value 0, compared with the records)."""
    if name in _WARNED_DGRPO_FORM:
        return
    params = [p for p in _parameters(fn) if p.kind is not p.VAR_POSITIONAL]
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if params and params[0].name == "prompts":
        said = "first parameter is TRL's 'prompts'"
        gets = "'prompts' gets the completions"
    elif len(positional) >= 2 and positional[1] != "records" and positional[1] in set(columns):
        said = f"second parameter {positional[1]!r} is named as a column of the data"
        gets = f"{positional[1]!r} gets the records, not the column"
    else:
        return
    _WARNED_DGRPO_FORM.add(name)
    kwargs = any(p.kind is p.VAR_KEYWORD for p in _parameters(fn))
    only = _positional_only(params)
    if not kwargs:
        why, fix = "it takes no **kwargs", "Add **kwargs (TRL's trainer passes more keywords too)"
        if only:
            fix = "Add **kwargs and remove the '/' (TRL's trainer passes every argument by keyword)"
    elif only:  # (a '/' kept it from TRL's form: :func:`trl_style`)
        why = only
        fix = "Remove the '/' (TRL's trainer passes every argument by keyword)"
    else:  # (its *args kept it from TRL's form: a decorator's wrapper(*args, **kwargs) is dgrpo's)
        why, fix = "it takes *args", "Remove the *args (TRL's trainer passes every argument by keyword)"
    warnings.warn(
        f"{name}'s {said}, but {why}, so it is called as dgrpo's fn(completions, records): {gets}. Written for "
        f"TRL? {fix}",
        stacklevel=3,
    )


def reward_value(v: object) -> float | None:
    """``v`` as a float when it is one finite real number: a Python int / float / bool (0 or 1), a ``Fraction`` or
    ``Decimal``, a NumPy scalar or a 0-d tensor or array (so a function may return a list, a 1-d NumPy array or a 1-d
    tensor, as TRL's reward functions may); None for anything else (a string, a list, a non-finite number)."""
    if not isinstance(v, numbers.Real) and getattr(v, "ndim", None) == 0 and hasattr(v, "item"):
        v = v.item()
    if not isinstance(v, (numbers.Real, decimal.Decimal)):  # (Decimal is no numbers.Real: exact sums were refused)
        return None
    try:
        x = float(v)
    except (OverflowError, ValueError):  # an int past a float's range (10**400); Decimal('sNaN')
        return None
    return x if math.isfinite(x) else None


def gold_completions(records: list[Record]) -> list[str]:
    """Each record's gold answer written as a completion that states it (``#### <answer>``)."""
    return [f"#### {r.answer}" for r in records]


def warn_if_gold_scores_zero(values: Sequence[float], what: str) -> None:
    """Warn when ``what`` gives 0 to every gold answer it was tried on: a task whose answers never count as correct
    (a column holding whole solutions, a scorer of another answer format) trains and evaluates on zeros."""
    if values and all(v == 0 for v in values):
        warnings.warn(
            f"{what} gives 0 to the gold answer of every record it was tried on ({len(values)}, each as "
            "'#### <answer>'): check the data's answers (data.answer_key) and eval.scorer / grpo.reward",
            stacklevel=2,
        )


def check_scorer(scorer: ScoreFn, records: list[Record]) -> list[float]:
    """``scorer``'s values for the gold answers of the first two of ``records``, checked, and for each one's gold given
    to the other (wrong answers, mostly): a value outside [0, 1] is a RewardError before anything is trained, not
    at the first validation or the test sets after training."""
    firsts = records[:2]
    completions = gold_completions(firsts)
    name = getattr(scorer, "__name__", "scorer")
    with on_gold():
        values = call_checked(scorer, name, completions, firsts, "scorer")
    if len(firsts) == 2:
        with on_gold(swapped=True):
            call_checked(scorer, name, completions[::-1], firsts, "scorer")
    return values


@contextmanager
def on_gold(swapped: bool = False) -> Iterator[None]:
    """A RewardError within the block, from the check of a reward or scorer on gold answers before a run, raised
    again saying so: the completion it names (``'#### 16'``) is no answer of the model, and with ``swapped`` not
    even the question's own gold."""
    try:
        yield
    except RewardError as error:
        swap = ", each given to the other record" if swapped else ""
        raise type(error)(
            f"{error}; found by the check made before training or evaluating, on gold answers written as "
            f"'#### <answer>'{swap} (no completion of the model)"
        ) from None


def warn_if_scorer_misses_gold(scorer: ScoreFn, records: list[Record], what: str) -> None:
    """:func:`warn_if_gold_scores_zero` for ``scorer`` on the gold answers of the first two of ``records``
    (:func:`check_scorer`)."""
    warn_if_gold_scores_zero(check_scorer(scorer, records), what)
    if any(scorer is builtin for builtin in SCORERS.values()) and warn_if_golds_are_boxed_solutions(records, what):
        return  # (one warning: the box's number is also a number with other text)
    if scorer is SCORERS["numeric"]:
        warn_if_golds_are_numbers_with_text(records, what)


#: how many records' gold answers :func:`warn_if_golds_are_numbers_with_text` looks at (a training set's 385,000
#: would take seconds; a format is the file's, not one row's)
GOLDS_LOOKED_AT = 1000


def warn_if_golds_are_numbers_with_text(records: list[Record], what: str) -> None:
    """Warn when gold answers (of the first :data:`GOLDS_LOOKED_AT` records) hold a number but are not one alone
    (``50%``, ``12 kg``, ``€5``, ``1 000``): ``numeric`` compares such a gold as text, so ``#### 50`` scores 0 for
    ``50%`` (a gold is a number when it is exactly one: thousands commas, a leading ``$``, a trailing period)."""
    golds = [r.answer for r in records[:GOLDS_LOOKED_AT] if isinstance(r.answer, str)]
    texts = [g for g in golds if normalize_number(g) is None and extract_answer(g) is not None]
    if texts:
        n = len(records[:GOLDS_LOOKED_AT])
        warnings.warn(
            f"{what}: {len(texts)} of the first {n} gold answers hold a number with other text (e.g. {texts[0]!r}), "
            f"which numeric compares as text: '#### {extract_answer(texts[0])}' scores 0 for it; write the golds as "
            "numbers alone (a leading $ and thousands commas are read) or name another eval.scorer",
            stacklevel=2,
        )


def warn_if_golds_are_boxed_solutions(records: list[Record], what: str) -> bool:
    """Warn, and return True, when gold answers (of the first :data:`GOLDS_LOOKED_AT` records) hold a ``\\boxed{``
    (a MATH-style solution mapped as the answer column, or a boxed answer): the whole text is the gold, which a
    built-in scorer compares with a completion's answer, so no completion's equals it (its gold written as
    ``#### <solution>`` does: the check on gold answers does not see it); the loaders read the answer out of a
    GSM8K-style solution's ``####``, not out of a box."""
    golds = [r.answer for r in records[:GOLDS_LOOKED_AT] if isinstance(r.answer, str) and _BOXED_GOLD.search(r.answer)]
    if golds:
        n = len(records[:GOLDS_LOOKED_AT])
        warnings.warn(
            f"{what}: {len(golds)} of the first {n} gold answers hold a \\boxed{{...}} (e.g. {golds[0][:60]!r}): a "
            "built-in scorer reads the box of a completion, not of a gold, whose whole text (a MATH-style solution) "
            "no completion's answer equals; map data.answer_key to a column of bare answers (MATH-500's: "
            "data.question_key=problem data.answer_key=answer), or score with a plug-in scorer that reads the gold's "
            "box",
            stacklevel=2,
        )
    return bool(golds)


#: LaTeX's box around a final answer in a gold (``\\boxed{3}``, ``\\boxed {3}``)
_BOXED_GOLD = re.compile(r"\\boxed\s*\{")


@dataclass
class RewardPart:
    name: str
    fn: ScoreFn
    weight: float = 1.0
    _function: str = field(default="", init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        """A callable ``fn`` and a finite weight, kept as a float (a NaN weight made every total NaN, told as the
        filter's window; a weight of text failed in the first call, "can't multiply sequence")."""
        if inspect.isclass(self.fn):  # (called, it makes an instance: not one value per completion)
            raise RewardError(
                f"RewardPart {self.name!r}: fn is the class {self.fn.__name__}; pass a function, or an instance of it"
            )
        if not callable(self.fn):
            raise RewardError(
                f"RewardPart {self.name!r}: fn must be a reward function, got {type(self.fn).__name__} "
                f"{self.fn!r:.60} (a built-in scorer by name: dgrpo.eval.scoring.SCORERS[name])"
            )
        weight = None if isinstance(self.weight, bool) else reward_value(self.weight)
        if weight is None:
            raise RewardError(f"RewardPart {self.name!r}: weight must be a finite number, got {self.weight!r:.60}")
        self.weight = weight
        self._function = function_name(self.fn)  # (as built: an object's state that changes as it runs is no change)

    @property
    def may_abstain(self) -> bool:
        """Whether it may return None ("does not apply"): not a built-in scorer, which scores every completion."""
        return not any(self.fn is scorer for scorer in SCORERS.values())

    def identity(self) -> str:
        """``name = module.function * weight``: what a checkpoint records of the reward it was trained with (the
        function as :func:`function_name` names it when the part was made: a cache an object fills as it runs, in its
        ``repr``, is the same reward in the checkpoint and in the resume)."""
        return f"{self.name} = {self._function} * {self.weight:g}"


def function_name(fn: Any) -> str:
    """``module.qualname`` of a function; a plug-in file's, ``file.py:qualname`` (its file's name, not its folder's: a
    project moved elsewhere, its run resumed there, has the same reward); a partial's, of the function it wraps with
    the arguments it binds (``partial(m.f, k=2)``: one binding ``k=3`` is another reward); another callable's, of
    its class, with the object's own ``repr`` where its class writes one (a dataclass's fields)."""
    if isinstance(fn, functools.partial):
        bound = [*map(_bound_value, fn.args), *(f"{k}={_bound_value(v)}" for k, v in fn.keywords.items())]
        return f"partial({', '.join([function_name(fn.func), *bound])})"
    named = fn if hasattr(fn, "__qualname__") else type(fn)
    module = getattr(named, "__module__", None) or "?"
    file = getattr(sys.modules.get(module), "__file__", None)
    if getattr(sys.modules.get(module), "__dgrpo_version__", None) is not None and file:  # (a plug-in file's)
        where = f"{Path(file).name}:{named.__qualname__}"
    else:
        where = f"{module}.{named.__qualname__}"
    if named is type(fn) and type(fn).__repr__ is not object.__repr__:  # (Judge(threshold=0.5): its settings)
        shown, own = _bound_value(fn), named.__qualname__ + "("
        return where + shown[len(own) - 1 :] if shown.startswith(own) else f"{where}: {shown}"
    return where


#: the longest ``repr`` of a bound argument an identity writes out; a longer one is named by its type and a digest
_BOUND_REPR_CHARS = 200


def _bound_value(value: Any) -> str:
    """A partial's bound argument as a reward's identity writes it: a function by :func:`function_name`, anything
    else by its ``repr`` without memory addresses (``<object at 0x7f...>`` differs in every process), one longer
    than :data:`_BOUND_REPR_CHARS` by its type and the SHA-256 of that ``repr``."""
    if inspect.isfunction(value) or inspect.isbuiltin(value) or isinstance(value, functools.partial):
        return function_name(value)
    text = re.sub(r" at 0x[0-9a-fA-F]+", "", repr(value))
    if len(text) > _BOUND_REPR_CHARS:
        return f"<{type(value).__qualname__} sha256:{hashlib.sha256(text.encode()).hexdigest()[:16]}>"
    return text


#: the fields of a ``rollouts.jsonl`` row, beside which each reward part's value is logged under the part's name
ROLLOUT_FIELDS = ("step", "group", "seed", "question", "completion", "answer", "reward")


@dataclass
class Rewards:
    """The reward of a rollout: the weighted sum of one or more parts; ``filter_on`` names the part the accuracy
    filter's window applies to ('' = the total)."""

    parts: list[RewardPart]
    filter_on: str = ""
    last: dict[str, list[float]] = field(default_factory=dict)  # each part's values of the last call
    #: the training data's columns (:func:`data_columns`; the trainer sets them): a TRL-style part gets each of them
    #: in every batch, None where a record lacks it
    columns: tuple[str, ...] = ()
    #: whether a row every part gave None or NaN for was warned of (once per run)
    _warned_none: bool = field(default=False, init=False, repr=False)
    #: the completions, records and totals of the last call (an error of :meth:`filter_values` names its row's)
    _rows: tuple[list[str], list[Record], list[float]] = field(default=([], [], []), init=False, repr=False)

    def __post_init__(self) -> None:
        names = [p.name for p in self.parts]
        if not names:
            raise RewardError("Rewards: no reward parts (give at least one RewardPart)")
        taken = sorted(set(names) & set(ROLLOUT_FIELDS)) if len(names) > 1 else []
        if taken:  # (two parts or more: their values sit beside these in a rollouts.jsonl row, and overwrote them)
            raise RewardError(
                f"Rewards: reward part name(s) {', '.join(taken)} are fields of rollouts.jsonl's rows "
                f"({', '.join(ROLLOUT_FIELDS)}): give the part another name (grpo.rewards: an item's name; "
                "reward_fn=[...], where a function's __name__ names it: rename it, or pass a Rewards of RewardParts)"
            )
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:  # each part's values are kept by name: a second one would be summed in place of the first
            raise RewardError(
                f"Rewards: reward part name(s) {', '.join(twice)} given twice: give each part its own name"
            )
        if all(p.weight == 0 for p in self.parts):  # (as grpo.rewards refuses it)
            raise RewardError(
                "Rewards: every part has weight 0: the total reward would be 0 for every rollout, with nothing to "
                "learn (a part of weight 0 beside others is logged without entering the total)"
            )
        if self.filter_on and self.filter_on not in names:
            raise RewardError(
                f"grpo.filter_reward {self.filter_on!r} is not one of the rewards ({', '.join(names)}): name one of "
                "them, or '' for the total"
            )

    def identity(self) -> list[str]:
        """Each part's :meth:`RewardPart.identity` (a resume compares them)."""
        return [p.identity() for p in self.parts]

    def __call__(self, completions: list[str], records: list[Record]) -> list[float]:
        """Each completion's weighted total of the parts. A part's None or NaN (TRL's "does not apply") adds nothing
        to it, as TRL's ``nansum`` (kept as NaN in :attr:`last`); a row where every part gave one has total 0, and
        the first such row is warned of once (as TRL warns)."""
        total, none = self._total(completions, records)
        if none and not self._warned_none:
            self._warned_none = True
            names = ", ".join(p.name for p in self.parts)
            warnings.warn(
                f"every reward ({names}) returned None or NaN ('does not apply') for row {none[0]} "
                f"({_row(completions, records, none[0])}), and {len(none) - 1} other row(s) of this batch: their "
                "total reward is 0, as TRL's nansum gives; have at least one reward score every completion "
                "(warned once)",
                stacklevel=2,
            )
        return total

    def _total(self, completions: list[str], records: list[Record]) -> tuple[list[float], list[int]]:
        """Each completion's weighted total (:meth:`__call__`), checked to lie within float32's range, and the rows
        every part gave None or NaN for; each part's values kept in :attr:`last`, the rows in :attr:`_rows`."""
        self.last = {p.name: call_checked(p.fn, p.name, completions, records, columns=self.columns) for p in self.parts}
        given = [[p for p in self.parts if not math.isnan(self.last[p.name][i])] for i in range(len(completions))]
        total = [sum((p.weight * self.last[p.name][i] for p in parts), 0.0) for i, parts in enumerate(given)]
        self._rows = (list(completions), list(records), total)
        none = [i for i, parts in enumerate(given) if not parts]
        for i, t in enumerate(total):
            if not abs(t) <= FLOAT32_MAX:  # (weighted parts each within it may sum past it, or to inf)
                raise RewardError(
                    f"the weighted total of the rewards is {t:g} for row {i} ({_row(completions, records, i)})"
                    f"{_PAST_FLOAT32}"
                )
        return total, none

    def smoke_test(self, records: list[Record], check_filter: bool) -> None:
        """Call every reward once on gold answers (``#### <answer>``) of ``records``, before a run writes anything:
        a function that cannot be imported, raises or returns the wrong thing fails here, in one line."""
        with on_gold():  # (the filter's check too: its row is a gold answer's, no rollout's)
            if records and len(self._total(gold_completions(records), records)[1]) == len(records):
                names = ", ".join(p.name for p in self.parts)  # (one warning: not the row's and "gives 0" as well)
                warnings.warn(
                    f"every reward ({names}) returned None or NaN ('does not apply') for the gold answer of every "
                    f"record it was tried on ({len(records)}, each as '#### <answer>'): their total reward is 0, as "
                    "TRL's nansum gives; have at least one reward score every completion, and check the data's "
                    "answers (data.answer_key)",
                    stacklevel=2,
                )
                total = [0.0] * len(records)
            else:
                total = self(gold_completions(records), records)
                self._warned_none = False  # (a gold answer's row no reward applies to is warned of; the rollouts' too)
                warn_if_gold_scores_zero(total, "the reward")
            if check_filter:
                self.filter_values(total)

    def filter_values(self, total: list[float]) -> list[float]:
        """The values the accuracy window is applied to; they must lie in [0, 1] (within SCORE_TOLERANCE, taken to
        its ends, as a scorer's are: a float32 sum's 1.0000001 is 1)."""
        values = total if not self.filter_on else self.last[self.filter_on]
        for i, v in enumerate(values):
            if math.isnan(v):  # (only a part's: a total leaves a None out, 0 where every part gave one)
                raise RewardError(
                    f"grpo.filter: the accuracy window applies to reward {self.filter_on}, which returned None or NaN "
                    f"('does not apply') for {self._shown(v, i)}: the window needs whether every rollout is correct; "
                    f"have {self.filter_on} return 0 or 1 for every completion, or set grpo.filter_reward to another "
                    "reward ('' for the total, where a None adds 0)"
                )
            if not -SCORE_TOLERANCE <= v <= 1 + SCORE_TOLERANCE:
                what = f"reward {self.filter_on}" if self.filter_on else "the total reward"  # (v: 7 digits, as a
                # float32 holds them: -0.04 summed in float32 was -0.03999999910593033)
                raise RewardError(
                    f"grpo.filter: the accuracy window applies to {what}, which must lie in [0, 1]; it is {v:.7g} for "
                    f"{self._shown(v, i)}: set grpo.filter_reward to a 0/1 reward of grpo.rewards, or grpo.filter=false"
                )
        return [min(max(v, 0.0), 1.0) for v in values]

    def _shown(self, value: float, i: int) -> str:
        """The completion and question of the last call's first row whose total (or filtered part's value) is
        ``value``, as an error names a row (the values :meth:`filter_values` is given may be the rows shuffled within
        their groups, ``grpo.shuffle_rewards``: a row's index is not its completion's); ``row i`` when the last call
        gave none."""
        completions, records, totals = self._rows
        values = self.last.get(self.filter_on, []) if self.filter_on else totals
        for j, v in enumerate(values[: len(completions)]):  # (given as float32: 1.1 is 1.100000023841858)
            if math.isclose(v, value, rel_tol=1e-6, abs_tol=1e-7) or math.isnan(v) and math.isnan(value):
                return f"the row with {_row(completions, records, j)}"
        return f"row {i}"


def build_rewards(reward: str, rewards: list[dict], scorer: str, filter_reward: str = "") -> Rewards:
    """The reward a config names: ``grpo.rewards`` (several, weighted) or ``grpo.reward`` (one), else the scorer."""
    if rewards:
        if reward:
            warnings.warn(
                f"grpo.reward {reward!r} is not used: grpo.rewards is set and replaces it (add it there as an item)",
                stacklevel=2,
            )
        parts = []
        for item in rewards:
            fn_spec = str(item["fn"])
            parts.append(RewardPart(reward_name(item), load_function(fn_spec), float(item.get("weight", 1.0))))
    else:
        spec = reward or scorer
        parts = [RewardPart(spec, load_function(spec, "reward" if reward else "eval.scorer"))]
    return Rewards(parts, filter_reward)


def check_reward(grpo: Any, scorer: str) -> list[str]:
    """Build the reward a config names (``grpo.reward(s)``, ``grpo.filter_reward``, else ``eval.scorer``) once, so
    that a missing file or function fails in one line before data, models and training; it is built again once the
    data is read (``dgrpo grpo``: :func:`~dgrpo.training.grpo.checked_rewards`, told the data's columns; a plug-in
    file's module runs once per process: its own warnings come here), which warns of the config's reward then.
    Returns its :meth:`Rewards.identity` (what a resume compares with its checkpoint's)."""
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"grpo\.reward .* is not used")
            return build_rewards(grpo.reward, grpo.rewards, scorer, grpo.filter_reward).identity()
    except RewardError as e:
        raise RewardSetupError(str(e)) from None


def build_scorer(spec: str) -> ScoreFn:
    """The scorer ``eval.scorer`` names: a built-in one, or a plug-in wrapped so that every call is checked."""
    if spec in SCORERS:
        return SCORERS[spec]
    fn = load_function(spec, "eval.scorer")

    def checked(completions: list[str], records: list[Record]) -> list[float]:
        return call_checked(fn, spec, completions, records, "scorer")

    checked.__name__ = spec  # (results.json names the scorer by it)
    return checked
