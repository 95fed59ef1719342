"""One row (a JSON Lines object, a JSON list's element, a table's or a hub dataset's row) as a ``Record``, in every
known dataset's format; the field helpers that make each problem one line (a ``_RowError``, which the caller names
"<file> line N: <problem>"), and the format that a row's keys call for."""

from __future__ import annotations

import ast
import json
import math
import numbers
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from ..reward import narrow_number, normalize_number, numpy_rounder
from .records import Record

# ---------------------------------------------------------------------------------------------------------
# Field helpers: every problem becomes a _RowError, which the caller turns into "<file> line N: <problem>".


class _RowError(Exception):
    """One record's problem; the caller adds the file and line/record position."""


class _NoValue(_RowError):
    """A field a record needs holds None: JSON null, an empty parquet cell, or a cell a CSV row is short of (the caller
    then says so: :func:`_short_row`). ``what`` names it: ``field 'answer'``, ``column 'target'``."""

    def __init__(self, what: str) -> None:
        super().__init__(f"{what} is empty (null)")
        self.what = what


def _field(row: dict[str, Any], key: str, option: str = "") -> Any:
    """``row[key]``; a row without it is a _RowError, naming the ``option`` that named the column (a mapping's, which
    may come from a checkpoint's run)."""
    if key not in row:
        named = f" ({option})" if option else ""
        columns = [str(k) for k in row]
        apart = _one_column_hint(columns)
        shown = ", ".join(repr(c[:40]) for c in columns[:12]) + (", ..." if len(columns) > 12 else "")
        raise _RowError(f"missing field {key!r}{named}; the row's fields: {shown or 'none'}{apart}")
    return row[key]


def _one_column_hint(columns: list[str]) -> str:
    """For a row of one column whose name holds another separator, a table file read with the wrong one: a tab (a
    tab-separated file named .csv, read by its extension), a comma (a comma-separated file named .tsv), a ``;`` or a
    ``|`` (a CSV file as spreadsheets in many locales save it); else ''."""
    one = columns[0] if len(columns) == 1 else ""
    if "\t" in one:
        return " (one column: a tab-separated file is read as one when named .tsv)"
    if "," in one:
        return " (one column: a comma-separated file is read as one when named .csv)"
    return " (one column: is the file comma-separated?)" if any(c in one for c in ";|") else ""


def _spaced_names_hint(row: dict[str, Any]) -> str:
    """For a row whose column names have spaces around them, which name a known format's columns without
    (``question, answer`` as a CSV header: its second column is ' answer'), what to do; else ''."""
    spaced = [str(k) for k in row if isinstance(k, str) and k != k.strip()]
    if not spaced or _known_row_parser({str(k).strip(): v for k, v in row.items()}) is None:
        return ""
    return (
        f" (column names with spaces around them: {', '.join(repr(k) for k in spaced[:4])}; a CSV header is read "
        "as written: write it without spaces after its commas)"
    )


def _text_field(row: dict[str, Any], key: str, *, strip: bool = True, allow_empty: bool = False) -> str:
    value = _field(row, key)
    if value is None:  # (it read 'must be a string, got NoneType')
        raise _NoValue(f"field {key!r}")
    if not isinstance(value, str):
        raise _RowError(f"field {key!r} must be a string, got {type(value).__name__}")
    if strip:
        value = value.strip()
    if not allow_empty and not value.strip():
        raise _RowError(f"field {key!r} is empty")
    return value


def _steps_field(row: dict[str, Any], key: str = "steps") -> list[str]:
    value = _field(row, key)
    if isinstance(value, str) and (listed := _listed_steps(value)) is not None:
        return listed  # (a CSV cell written from a list: ['a', 'b'])
    if isinstance(value, str):  # (a CSV cell is text: every row of a question,steps,answer CSV failed unexplained)
        raise _RowError(
            f"field {key!r} must be a list of strings, got one string; to read it as one step per line (a CSV "
            f"cell, say), name the columns: --set data.question_key=question data.answer_key=answer "
            f"data.steps_key={key}"
        )
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise _RowError(f"field {key!r} must be a list of strings")
    return list(value)


def _format_number(value: Any, what: str) -> str:
    """A numeric gold as answer text: int string when whole (``8.0`` -> ``"8"``), else full precision
    without exponent (``3244047.0999999996``, ``2.0107e-06`` -> ``"0.0000020107"``). A float is the number its repr
    writes, as ``Record(answer=...)`` reads one: ``1e23`` -> ``"100000000000000000000000"`` (``str(int(1e23))``, the
    float's binary value ``"99999999999999991611392"``, was the gold, which the completion ``#### 1e23`` missed). A
    NumPy number is the Python number it was written as (:func:`_python_number`: PAL's, SVAMP's and MultiArith's
    golds of ``np.int64`` were 'must be a number, got int64')."""
    value = _python_number(value)
    if value is None:
        raise _NoValue(what)
    if isinstance(value, bool):
        raise _RowError(f"{what} must be a number, got a boolean")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _RowError(f"{what} must be a finite number, got {value!r}")
        canon = normalize_number(format(Decimal(repr(float(value))), "f"))  # (np.float64's repr names its type)
        assert canon is not None
        return canon
    if isinstance(value, Decimal):  # (a parquet decimal column: it was 'must be a string, got Decimal'; mapped, NaN)
        if not value.is_finite():
            raise _RowError(f"{what} must be a finite number, got {value}")
        return normalize_number(format(value, "f")) or format(value, "f")
    if isinstance(value, str):
        canon = normalize_number(value)
        if canon is not None:
            return canon
        raise _RowError(f"{what} must be a number, got {value[:60]!r}")
    raise _RowError(f"{what} must be a number, got {type(value).__name__}")


def _numeric_answer(text: str, what: str) -> str:
    canon = normalize_number(text)
    if canon is None:
        raise _RowError(f"{what} must be a number, got {text.strip()[:60]!r}")
    return canon


def _step_annotations(solution: str) -> list[str]:
    """GSM8K's ``<<expr=value>>`` calculator annotations, in order, exactly as GSM8K-Aug writes its steps."""
    steps: list[str] = []
    start = solution.find("<<")
    while start >= 0:
        end = solution.find(">>", start + 2)
        if end < 0:
            break
        inner = solution[start + 2 : end]
        if "<<" in inner:  # an unmatched "<<": restart at the inner one
            start = solution.find("<<", start + 2)
            continue
        steps.append(solution[start : end + 2])
        start = solution.find("<<", end + 2)
    return steps


# ---------------------------------------------------------------------------------------------------------
# Row parsers: one JSON object (a jsonl line, a JSON list element, a hub row) -> Record.

RowParser = Callable[[dict[str, Any]], Record]


def _other_fields(row: dict[str, Any], *read: str) -> dict[str, Any]:
    """A row's fields besides those its format reads: the record's ``meta``, which rewards get (a difficulty, an
    id, a unit)."""
    return {k: v for k, v in row.items() if k not in read}


def _row_gsm8k(row: dict[str, Any]) -> Record:
    question = _text_field(row, "question")
    solution = _text_field(row, "answer", strip=False)
    if "####" not in solution:
        raise _RowError("field 'answer' has no '#### <final answer>' line")
    answer = _numeric_answer(solution.rpartition("####")[2], "final answer after '####'")
    meta = _other_fields(row, "question", "answer")
    meta.setdefault("solution", solution)  # (GSM8K's answer text, as TRL names it; a column of that name wins)
    return Record(question, _step_annotations(solution), answer, meta)


def _json_number_answer(row: dict[str, Any], field: str = "answer") -> str | None:
    """A JSON number given as the answer (``field``), as answer text (as a CSV column's number would be); None for
    anything else (text, which the row's own parser reads, or a boolean, which it refuses)."""
    raw = _python_number(row.get(field))
    if isinstance(raw, (int, float, Decimal)) and not isinstance(raw, bool):
        return _format_number(raw, f"field {field!r}")
    return None


def _python_number(value: Any) -> Any:
    """A NumPy integer or float scalar (rows built in memory, ``np.float32(2.3)``) as the Python number it was written
    as (2.3, not 2.299999952316284: :func:`~dgrpo.reward.narrow_number`, as a float32 column's values are read);
    anything else as it is. (An answer of np.float32 or np.int64 was 'must be a string, got float32' unless the
    columns were mapped.)"""
    if type(value).__module__ != "numpy" or not isinstance(value, numbers.Real):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    number = float(value)
    return float(narrow_number(number, numpy_rounder(type(value)))) if math.isfinite(number) else number


def _row_coconut(row: dict[str, Any], *, numeric: bool) -> Record:
    question = _text_field(row, "question")
    # Coconut writes an empty CoT as [""] (its gsm_icot.py splits "" on spaces): blank steps are dropped.
    steps = [s for s in _steps_field(row) if s.strip()]
    answer = _json_number_answer(row) or _text_field(row, "answer")
    meta = _other_fields(row, "question", "steps", "answer")
    if "####" in answer:  # a GSM8K-style answer, read as GSM8K's (its text was the gold: no answer scored right)
        meta.setdefault("solution", answer)
        answer = answer.rpartition("####")[2].strip()
        if not answer:
            raise _RowError("field 'answer' is empty after its '####'")
    canon = normalize_number(answer)
    if canon is not None:
        answer = canon
    elif numeric:
        raise _RowError(f"field 'answer' must be a number, got {answer[:60]!r}")
    return Record(question, steps, answer, meta)


def _row_coconut_any(row: dict[str, Any]) -> Record:
    return _row_coconut(row, numeric=False)


def _row_coconut_numeric(row: dict[str, Any]) -> Record:
    return _row_coconut(row, numeric=True)


def _row_svamp(row: dict[str, Any]) -> Record:
    body = _text_field(row, "Body", allow_empty=True)
    q = _text_field(row, "Question")
    answer = _format_number(_field(row, "Answer"), "field 'Answer'")
    meta: dict[str, Any] = {k: row[k] for k in ("ID", "Equation", "Type") if k in row}
    return Record(" ".join(p for p in (body, q) if p), [], answer, meta)


def _row_multiarith(row: dict[str, Any]) -> Record:
    question = _text_field(row, "sQuestion")
    solutions = _field(row, "lSolutions")
    if not isinstance(solutions, list) or not solutions:
        raise _RowError("field 'lSolutions' must be a non-empty list of numbers")
    answer = _format_number(solutions[0], "field 'lSolutions[0]'")
    meta: dict[str, Any] = {k: row[k] for k in ("iIndex", "lEquations") if k in row}
    return Record(question, [], answer, meta)


def _row_multiarith_hub(row: dict[str, Any]) -> Record:
    """MultiArith as on the hub (``ChilleD/MultiArith``): ``question``, ``final_ans`` (a number or number text)."""
    question = _text_field(row, "question")
    answer = _format_number(_field(row, "final_ans"), "field 'final_ans'")
    return Record(question, [], answer, {})


def _row_pal(row: dict[str, Any]) -> Record:
    """PAL's ``{"input", "target"}`` rows: GSM-Hard (float target, with ``code``) and MultiArith's jsonl twin."""
    question = _text_field(row, "input")
    answer = _format_number(_field(row, "target"), "field 'target'")
    meta = {"code": row["code"]} if isinstance(row.get("code"), str) else {}
    return Record(question, [], answer, meta)


def _row_openmath(row: dict[str, Any]) -> Record:
    """OpenMathInstruct-2 rows: ``problem``, ``expected_answer`` (often LaTeX, so kept as text; a number, as a
    parquet file of one's own may hold, read as every other format reads one: it was 'must be a string, got int')."""
    question = _text_field(row, "problem")
    meta: dict[str, Any] = {k: row[k] for k in ("generated_solution", "problem_source") if k in row}
    number = _json_number_answer(row, "expected_answer")
    if number is not None:
        return Record(question, [], number, meta)
    answer = _text_field(row, "expected_answer")
    canon = normalize_number(answer)
    return Record(question, [], canon if canon is not None else answer, meta)


def _row_question_answer(row: dict[str, Any]) -> Record:
    """Plain ``{question, answer}`` rows: GSM8K style when the answer has ``####``, else the answer as is; any other
    field goes to ``meta``, as in every row format that is no particular dataset's."""
    if isinstance(row.get("answer"), str) and "####" in row["answer"]:
        try:
            return _row_gsm8k(row)
        except _RowError as exc:
            if "after '####' must be a number" not in str(exc):
                raise
            raise _RowError(  # (a file's own text golds, '#### 50%': it said only that they must be numbers)
                f"{exc} (GSM8K's format); to read a text answer after '####', name the columns: --set "
                "data.question_key=question data.answer_key=answer"
            ) from None
    question = _text_field(row, "question")
    meta = _other_fields(row, "question", "answer")
    number = _json_number_answer(row)
    if number is not None:
        return Record(question, [], number, meta)
    answer = _text_field(row, "answer")
    canon = normalize_number(answer)
    return Record(question, [], canon if canon is not None else answer, meta)


def _row_question_cot_answer(row: dict[str, Any]) -> Record:
    """GSM8K-Aug as published on the hub (e.g. ``whynlp/gsm8k-aug``): ``cot`` is ``<<e1>> <<e2>> ...``."""
    question = _text_field(row, "question")
    cot = _field(row, "cot")  # (a row without it among rows with it: it was 'field 'cot' is empty (null)')
    if cot is None:
        raise _NoValue("field 'cot'")
    if not isinstance(cot, str):
        raise _RowError(f"field 'cot' must be a string, got {type(cot).__name__}")
    answer = _numeric_answer(_text_field(row, "answer"), "field 'answer'")
    return Record(question, cot.split(), answer, _other_fields(row, "question", "cot", "answer"))


# Key sets that identify a row format, most specific first.
_ROW_FORMATS: list[tuple[frozenset[str], RowParser, str]] = [
    (frozenset({"question", "cot", "answer"}), _row_question_cot_answer, "GSM8K-Aug {question, cot, answer}"),
    (frozenset({"question", "steps", "answer"}), _row_coconut_any, "Coconut {question, steps, answer}"),
    (frozenset({"Body", "Question", "Answer"}), _row_svamp, "SVAMP {Body, Question, Answer}"),
    (frozenset({"sQuestion", "lSolutions"}), _row_multiarith, "MultiArith {sQuestion, lSolutions}"),
    (frozenset({"question", "final_ans"}), _row_multiarith_hub, "MultiArith (hub) {question, final_ans}"),
    (frozenset({"problem", "expected_answer"}), _row_openmath, "OpenMathInstruct-2 {problem, expected_answer}"),
    (frozenset({"input", "target"}), _row_pal, "PAL {input, target}"),
    (frozenset({"question", "answer"}), _row_question_answer, "{question, answer}"),
]
_KNOWN_ROW_FORMATS = "; ".join(desc for _, _, desc in _ROW_FORMATS)


def _known_row_parser(row: dict[str, Any]) -> RowParser | None:
    """The parser of the first known format whose keys the row has, or None."""
    return next((parser for keys, parser, _ in _ROW_FORMATS if keys <= row.keys()), None)


def _detect_row_parser(row: Any) -> RowParser:
    if not isinstance(row, dict):
        raise _RowError(f"expected a JSON object, got {type(row).__name__}")
    parser = _known_row_parser(row)
    if parser is not None:
        return parser
    one_column = _one_column_hint([str(k) for k in row])  # (a CSV file of another separator)
    one_column += _spaced_names_hint(row)
    raise _RowError(
        f"unrecognised record keys ({_shown_keys(row)}){one_column}; expected one of: {_KNOWN_ROW_FORMATS}; or name "
        "your columns with data.question_key and data.answer_key (from Python: dgrpo.load_dataset(path, "
        f"data=dgrpo.config.DataConfig(question_key=..., answer_key=...))){_trl_columns_hint(row)}"
    )


def _trl_columns_hint(row: dict[str, Any]) -> str:
    """What to set for a TRL dataset's columns: its ``prompt`` (text) is the question, its gold answer a column of
    its own; a conversation (``messages``, or ``prompt`` as a list of messages) has no question text to read."""
    prompt = row.get("prompt")
    if isinstance(prompt, str):
        return "; TRL's prompt column: data.question_key=prompt, and data.answer_key=<the gold answer's column>"
    if "messages" in row or prompt is not None:
        return (
            "; TRL's conversational format (a list of messages) is not read: give the question's text and its gold "
            "answer in columns of their own (data.chat_template: true wraps the question in the tokenizer's template)"
        )
    return ""


def _same_format_check(parser: RowParser) -> Callable[[dict[str, Any]], None]:
    """The check of every row after the first, whose keys picked ``parser``: refuse a row that has the keys of
    ``parser``'s format and those of a more specific one (one before it in :data:`_ROW_FORMATS`): read by the first
    row's, the fields only the other reads would go to ``meta`` unseen (a row's ``steps`` among ``{question, answer}``
    rows: the record had none, silently). A row short of the format's keys is the parser's own error (a missing
    field). The format's place is looked up once, not per row."""
    at = next(i for i, (_, p, _) in enumerate(_ROW_FORMATS) if p is parser)
    keys, _, theirs = _ROW_FORMATS[at]
    more_specific = _ROW_FORMATS[:at]

    def check(row: dict[str, Any]) -> None:
        if keys <= row.keys():
            mine = next((desc for k, _, desc in more_specific if k <= row.keys()), None)
            if mine is not None:
                raise _RowError(
                    f"a {mine} row among {theirs} rows (the format the first row's keys call for): one format per "
                    "file or list of rows, or name the columns with data.question_key, data.answer_key and "
                    "data.steps_key"
                )

    return check


def _shown_keys(keys: Any) -> str:
    """The first 8 of a record's keys, sorted and escaped (a message is one line)."""
    shown = sorted(repr(str(key))[1:-1] for key in keys)
    return ", ".join(shown[:8]) + (", ..." if len(shown) > 8 else "")


def _listed_steps(text: str) -> list[str] | None:
    """The steps of a cell holding a list of strings as its text (a CSV cell written from a list: JSON's
    ``["a", "b"]``, or pandas' ``['a', 'b']``, Python's repr), or None for any other text (which was read, one step
    per line, as the one step ``['a', 'b']``)."""
    stripped = text.strip()
    if not (stripped.startswith("[") and stripped.endswith("]")):
        return None
    try:
        value = json.loads(stripped)
    except (ValueError, RecursionError):
        try:
            value = ast.literal_eval(stripped)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return None
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return value
    return None
