"""Read every supported dataset (by name or file path) into ``Record`` lists; one clear ``DataError`` per bad file.

Files (JSON Lines, JSON, CSV, parquet, text, dataset folders), the registry of dataset names, the hub, the column
mapping; a row read in its format: :mod:`dgrpo.data.row_formats`."""

from __future__ import annotations

import difflib
import json
import logging
import numbers
import os
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from ..hub import EndpointError, hub_reachable, offline_requested, offline_variable
from ..paths import expand_home, where_read
from ..reward import normalize_number
from ..text import first_items
from .records import DataError, Record
from .row_formats import (
    RowParser,
    _detect_row_parser,
    _field,
    _format_number,
    _known_row_parser,
    _listed_steps,
    _NoValue,
    _python_number,
    _row_coconut_any,
    _row_coconut_numeric,
    _row_gsm8k,
    _row_multiarith,
    _row_pal,
    _row_svamp,
    _RowError,
    _same_format_check,
    _shown_keys,
    _step_annotations,
)
from .subsets import OPENMATH_HUB_ID, sample_subset, stream_openmath
from .synthetic import load_builtin
from .tables import (
    HEAD_BYTES,
    CsvTable,
    dataset_rows,
    is_hf_folder,
    not_text,
    not_utf8,
    read_csv_lines,
    read_hf_folder,
    read_parquet,
    unnamed_split,
)

__all__ = ["DATASETS", "HUB_DATASETS", "DatasetSpec", "find_data_dir", "load_dataset"]

# ./data counts as the data folder when it holds one of these.
_DATA_MARKERS = ("gsm8k", "gsm8k_aug", "svamp", "multiarith", "gsm_hard", "coconut")


# ---------------------------------------------------------------------------------------------------------
# File parsers: (path, text) -> records. A row parser of None means "detect from the first record".


def _lines(text: str) -> list[tuple[int, str]]:
    """Non-blank lines with their 1-based line numbers (split on ``\\n`` only: JSON strings may hold U+2028)."""
    return [(i, line.rstrip("\r")) for i, line in enumerate(text.split("\n"), 1) if line.strip()]


#: a row's place in a file as its errors name it (``line 4``), or what works it out when one is written
Where = str | Callable[[], str]


def _named(where: Where) -> str:
    return where if isinstance(where, str) else where()


def _apply(path: Path, where: Where, parser: RowParser, row: Any) -> Record:
    if not isinstance(row, dict):
        raise DataError(f"{path} {_named(where)}: expected a JSON object, got {type(row).__name__}")
    try:
        record = parser(row)
    except _RowError as exc:
        raise DataError(f"{path} {_named(where)}: {exc}") from None
    record.meta.setdefault("source", str(path))
    return record


def _json_value(path: Path, where: str, text: str, repeated: list[str] | None = None) -> Any:
    """``text`` parsed; an object that names a key twice (JSON keeps the last value) is noted in ``repeated``."""

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        obj = dict(items)
        if len(obj) < len(items) and repeated is not None:
            keys = [k for k, _ in items]
            repeated.append(f"{where + ': ' if where else ''}{next(k for k in keys if keys.count(k) > 1)!r}")
        return obj

    try:
        return json.loads(text, object_pairs_hook=pairs)
    except json.JSONDecodeError as exc:
        line = f"line {exc.lineno}" if where == "" else where
        raise DataError(f"{path} {line}: invalid JSON ({exc.msg}, column {exc.colno})") from None
    except (ValueError, RecursionError) as exc:  # e.g. an integer too long to convert, nesting too deep
        raise DataError(f"{path} {where or 'line 1'}: invalid JSON ({type(exc).__name__}: {str(exc)[:80]})") from None


def _rows_to_records(path: Path, rows: Iterable[tuple[Where, Any]], parser: RowParser | None) -> list[Record]:
    """Each (where, row) as a Record, by ``parser`` or the one the first row's fields call for (every later row in
    it: :func:`_same_format_check`)."""
    records: list[Record] = []
    check: Callable[[dict[str, Any]], None] | None = None
    for where, row in rows:
        try:
            if parser is None:
                parser = _detect_row_parser(row)
                check = _same_format_check(parser)
            elif check is not None and isinstance(row, dict):
                check(row)
        except _RowError as exc:
            raise DataError(f"{path} {_named(where)}: {exc}") from None
        records.append(_apply(path, where, parser, row))
    return records


def _warn_repeated_keys(path: Path, repeated: list[str]) -> None:
    """One warning per file for its objects that name a key twice (the first of them, and how many)."""
    if repeated:
        more = (
            f" ({len(repeated) - 1} more object{'s' if len(repeated) > 2 else ''} like it)" if len(repeated) > 1 else ""
        )
        warnings.warn(
            f"{path}: an object names a key twice ({repeated[0]}); the last value is read{more}", stacklevel=4
        )


def _parse_jsonl(path: Path, text: str, parser: RowParser | None) -> list[Record]:
    repeated: list[str] = []
    rows = ((f"line {n}", _json_line(path, n, line, text, repeated)) for n, line in _lines(text))
    records = _rows_to_records(path, rows, parser)
    _warn_repeated_keys(path, repeated)
    return records


def _json_line(path: Path, n: int, line: str, text: str, repeated: list[str]) -> Any:
    """Line ``n`` of a JSON Lines ``text`` parsed; one that opens an object written over several lines says so
    (:func:`_spread_object`)."""
    try:
        return _json_value(path, f"line {n}", line, repeated)
    except DataError as refused:
        raise _spread_object(path, text, n) or refused from None


#: a line's end, counted in the f-strings of the lines a JSON file's errors name
_NEWLINE = "\n"


def _spread_object(path: Path, text: str, n: int) -> DataError | None:
    """The DataError for JSON objects written over several lines, one after another, from line ``n`` of ``text`` (a
    file written with ``json.dump(row, f, indent=2)`` per row, in a .jsonl file or a .json one); None when line ``n``
    opens no such object. They were 'line 1: invalid JSON (Expecting property name enclosed in double quotes, column
    2)', or, in a .json file, 'line 5: invalid JSON (Extra data, column 1)'."""
    rest = "\n".join(text.split("\n")[n - 1 :]).lstrip()
    try:
        value, end = json.JSONDecoder().raw_decode(rest)
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, dict) or "\n" not in rest[:end]:
        return None
    return DataError(
        f"{path} lines {n}-{n + rest[:end].count(_NEWLINE)}: one JSON object written over several lines; JSON Lines "
        "holds one object per line (json.dumps(row), no indent), or give the rows as one JSON list in a .json file"
    )


def _parse_json_list(path: Path, text: str, parser: RowParser | None) -> list[Record]:
    repeated: list[str] = []
    try:
        data = _json_value(path, "", text, repeated)
    except DataError as refused:  # (objects, one after another, each written over several lines: which line opens)
        first = text[: len(text) - len(text.lstrip())].count("\n") + 1
        raise (_spread_object(path, text, first) if text.lstrip()[:1] == "{" else None) or refused from None
    _warn_repeated_keys(path, repeated)
    if isinstance(data, dict):  # tolerate {"data": [...]} wrappers
        inner = data.get("data")
        if not isinstance(inner, list):
            raise DataError(f"{path}: expected a JSON list of records, got an object without a 'data' list")
        data = inner
    if not isinstance(data, list):
        raise DataError(f"{path}: expected a JSON list of records, got {type(data).__name__}")
    return _rows_to_records(path, ((_record_at(text, i), row) for i, row in enumerate(data, 1)), parser)


def _record_at(text: str, index: int) -> Callable[[], str]:
    """Where record ``index`` (counting from 1) of a JSON list file's ``text`` is, as its error names it: ``line 5
    (record 2)``, the line it starts on (a file written by ``json.dump(rows, f, indent=2)`` named only ``record 2``,
    and a researcher counted objects to find it); ``record 2`` where the list cannot be walked. Worked out only when
    an error is written: the text is walked again up to that record."""

    def where() -> str:
        start = _list_item_start(text, index)
        return f"record {index}" if start is None else f"line {text.count(_NEWLINE, 0, start) + 1} (record {index})"

    return where


def _list_item_start(text: str, index: int) -> int | None:
    """The offset in ``text`` (a JSON list, or an object whose ``data`` key holds one) where its item ``index``
    (counting from 1) starts; None where there is none."""
    decode = json.JSONDecoder().raw_decode

    def past(at: int, mark: str = "") -> int:
        """The offset after the blanks at ``at``, and, where ``mark`` is next, after it and the blanks after it."""
        while at < len(text) and text[at] in " \t\n\r":
            at += 1
        return past(at + 1) if mark and text.startswith(mark, at) else at

    try:
        at = past(0)
        if text.startswith("{", at):  # ({"data": [...]}: the last 'data' key's value, as json.loads keeps it)
            at, inner = past(at, "{"), None
            while text.startswith('"', at):
                key, at = decode(text, at)
                at = past(at, ":")
                inner = at if key == "data" else inner
                at = past(decode(text, at)[1], ",")
            if inner is None:
                return None
            at = inner
        if not text.startswith("[", at):
            return None
        at = past(at, "[")
        for _ in range(index - 1):
            at = past(decode(text, at)[1], ",")
    except ValueError:
        return None
    return at if at < len(text) and not text.startswith("]", at) else None


def _parse_aug_text(path: Path, text: str) -> list[Record]:
    """GSM8K-Aug lines ``question||<<e1>> <<e2>> #### answer`` (steps split on whitespace, as Coconut does)."""
    records: list[Record] = []
    expected = "expected 'question||<<step>> ... #### answer'"
    for lineno, line in _lines(text):
        parts = line.split("||")
        if len(parts) != 2:
            raise DataError(f"{path} line {lineno}: {expected} with exactly one '||'")
        question, rest = parts[0].strip(), parts[1]
        if not question:
            raise DataError(f"{path} line {lineno}: empty question before '||'")
        if rest.count("####") != 1:
            raise DataError(f"{path} line {lineno}: {expected} with exactly one '####'")
        cot, _, answer_text = rest.partition("####")
        answer = normalize_number(answer_text)
        if answer is None:
            got = answer_text.strip()[:60]
            raise DataError(f"{path} line {lineno}: final answer after '####' must be a number, got {got!r}")
        records.append(Record(question, cot.split(), answer, {"source": str(path)}))
    return records


# ---------------------------------------------------------------------------------------------------------
# Registry of built-in names.

FileParser = Callable[[Path, str], list[Record]]


def _jsonl(parser: RowParser | None) -> FileParser:
    return lambda path, text: _parse_jsonl(path, text, parser)


def _json_list(parser: RowParser | None) -> FileParser:
    return lambda path, text: _parse_json_list(path, text, parser)


@dataclass(frozen=True)
class HubCopy:
    """Where the hub holds a built-in dataset: the repository, its config (None: the default) and, per split of
    ours, the hub splits that make it up (concatenated in order)."""

    repo: str
    splits: dict[str, tuple[str, ...]]
    config: str | None = None


@dataclass(frozen=True)
class DatasetSpec:
    """A built-in dataset: its files (relative to the data folder) per split, the parser of those files, and the
    hub copy read when there is no local one."""

    splits: dict[str, str]
    parser: FileParser
    description: str = ""
    hub: HubCopy | None = None

    @property
    def default_split(self) -> str:
        return "test" if "test" in self.splits else next(iter(self.splits))


DATASETS: dict[str, DatasetSpec] = {
    "gsm8k": DatasetSpec(
        {"train": "gsm8k/train.jsonl", "test": "gsm8k/test.jsonl"},
        _jsonl(_row_gsm8k),
        "GSM8K (openai/grade-school-math)",
        HubCopy("openai/gsm8k", {"train": ("train",), "test": ("test",)}, config="main"),
    ),
    "gsm8k_aug": DatasetSpec(
        {"valid": "gsm8k_aug/valid.txt", "test": "gsm8k_aug/test.txt"},
        _parse_aug_text,
        "GSM8K-Aug, iCoT text format",
        HubCopy("whynlp/gsm8k-aug", {"valid": ("validation",), "test": ("test",)}),
    ),
    "coconut_gsm8k_aug": DatasetSpec(
        {"valid": "coconut/gsm8k_aug/gsm_valid.json", "test": "coconut/gsm8k_aug/gsm_test.json"},
        _json_list(_row_coconut_numeric),
        "GSM8K-Aug in Coconut JSON",
    ),
    "prosqa": DatasetSpec(
        {"valid": "coconut/prosqa/prosqa_valid.json"}, _json_list(_row_coconut_any), "ProsQA (Coconut)"
    ),
    "svamp": DatasetSpec(
        {"test": "svamp/SVAMP.json"},
        _json_list(_row_svamp),
        "SVAMP, all 1000 problems",
        HubCopy("ChilleD/SVAMP", {"test": ("train", "test")}),  # its 700 + 300 split, joined: all 1000
    ),
    "multiarith": DatasetSpec(
        {"test": "multiarith/MultiArith.json"},
        _json_list(_row_multiarith),
        "MultiArith, 600 problems",
        HubCopy("ChilleD/MultiArith", {"test": ("train", "test")}),  # 420 + 180, joined: all 600
    ),
    "gsm_hard": DatasetSpec(
        {"test": "gsm_hard/gsmhardv2.jsonl"},
        _jsonl(_row_pal),
        "GSM-Hard (PAL gsmhardv2)",
        HubCopy("reasoning-machines/gsm-hard", {"test": ("train",)}),  # its one split holds the 1319 problems
    ),
}

#: Names read from the Hugging Face hub (through the optional ``datasets`` package): name -> hub id.
HUB_DATASETS: dict[str, str] = {"openmathinstruct2": "nvidia/OpenMathInstruct-2"}
#: the name of the paper-sized GSM-style subset of OpenMathInstruct-2 (its rule: dgrpo.data.subsets)
OPENMATH_GSM = "openmathinstruct2_gsm"
#: every dataset name :func:`load_dataset` reads as a dataset (beside ``builtin``), aliases and case aside
DATASET_NAMES = (*DATASETS, *HUB_DATASETS, OPENMATH_GSM)

_ALIASES = {
    "gsm-hard": "gsm_hard",
    "gsmhard": "gsm_hard",
    "gsm8k-aug": "gsm8k_aug",
    "coconut-gsm8k-aug": "coconut_gsm8k_aug",
    "openmathinstruct-2": "openmathinstruct2",
    "openmathinstruct_2": "openmathinstruct2",
    "openmathinstruct-2-gsm": OPENMATH_GSM,
}


def canonical_name(name: str) -> str:
    """A dataset name as the loaders look it up: lower-cased, its alias resolved (``GSM-Hard`` -> ``gsm_hard``)."""
    key = name.strip().lower()
    return _ALIASES.get(key, key)


def find_data_dir() -> Path | None:
    """The folder holding local copies of the built-in datasets, or None.

    ``$DGRPO_DATA_DIR`` (used as given; a DataError when it is set but no folder: a mistyped path silently fell back
    to ``./data`` or to the hub's copy), else ``./data`` when it holds at least one known dataset folder
    (``gsm8k/``, ``svamp/``, ...). Names not found there are looked up on the Hugging Face hub.
    """
    env = os.environ.get("DGRPO_DATA_DIR")
    if env:
        folder = expand_home(env)
        if not folder.is_dir():
            raise DataError(f"DGRPO_DATA_DIR={env}: no such folder (unset it to use ./data or the hub)")
        return folder.resolve()
    guess = Path.cwd() / "data"
    try:
        if guess.is_dir() and any((guess / marker).is_dir() for marker in _DATA_MARKERS):
            return guess.resolve()
    except OSError:
        pass
    return None


def _read_text(path: Path) -> str:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise DataError(_not_found(path)) from None
    except IsADirectoryError:
        raise DataError(f"{path}: is a directory, expected a data file") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror or exc})") from None
    refused = not_text(path, data[:HEAD_BYTES])
    if refused is not None:
        raise refused
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise not_utf8(path, data) or DataError(f"{path}: not UTF-8 text ({exc.reason})") from None
    if "\n" not in text:  # (lines ended by CR alone, classic Mac OS: a JSONL file was 'line 1: ... (Extra data)')
        text = text.replace("\r", "\n")
    return text


def _nonempty(path: Path, records: list[Record]) -> list[Record]:
    if not records:
        raise DataError(f"{path} contains no records")
    return records


def _load_file(path: Path, columns: RowParser | None = None) -> list[Record]:
    """Read a data file, its format detected from the extension and content (``columns``: a column mapping)."""
    suffix = path.suffix.lower()
    if suffix in (".csv", ".tsv"):
        table = read_csv_lines(path, "\t" if suffix == ".tsv" else ",")
        return rows_to_records(table.rows, str(path), str(path), columns, csv=table)
    if suffix in (".parquet", ".pq"):
        with hub_lines_held():  # (datasets logged 'Failed to read schema ...' above the DataError of a damaged file)
            rows = read_parquet(path)
        return rows_to_records(rows, str(path), str(path), columns)
    text = _read_text(path)
    head = text.lstrip()[:1]
    jsonl = suffix == ".jsonl" and (head != "[" or _json_lines(text, (dict, list)))  # (a .jsonl of one list: a list)
    if jsonl or (head == "{" and (suffix != ".json" or _json_lines(text))):
        records = _parse_jsonl(path, text, columns)
    elif suffix == ".json" or head == "[":
        records = _parse_json_list(path, text, columns)
    elif "||" in text:
        records = _parse_aug_text(path, text)
    elif not text.strip():
        records = []
    else:
        raise DataError(
            f"{path}: unrecognised format; expected .jsonl/.json/.csv/.tsv/.parquet records or 'question||steps #### "
            "answer' lines"
        )
    return _nonempty(path, records)


def _json_lines(text: str, kinds: tuple[type, ...] = (dict,)) -> bool:
    """Whether ``text`` is JSON Lines: an object (a value of ``kinds``) on its first line alone and more lines after
    it (a ``.json`` file so written, as ``datasets.Dataset.to_json`` writes by default, was 'line 2: invalid JSON
    (Extra data)'; so was a ``.jsonl`` whose first line is a list, read as one JSON list: now 'line 1: expected a
    JSON object')."""
    first, _, rest = text.lstrip().partition("\n")
    if not rest.strip():
        return False
    try:
        return isinstance(json.loads(first), kinds)
    except (ValueError, RecursionError):
        return False


def _load_builtin_name(name: str, split: str | None) -> list[Record]:
    spec = DATASETS[name]
    chosen = spec.default_split if split is None else split
    if chosen not in spec.splits:
        raise DataError(f"dataset {name!r} has splits {', '.join(spec.splits)}; got {chosen!r}")
    data_dir = find_data_dir()
    path = data_dir / spec.splits[chosen] if data_dir is not None else None
    if path is not None and path.is_file():
        return _nonempty(path, spec.parser(path, _read_text(path)))
    if data_dir is None:
        local = (
            f"no local copy (set DGRPO_DATA_DIR to the folder holding {spec.splits[chosen].split('/')[0]}/, or put "
            "it in ./data)"
        )
    else:
        local = f"split {chosen!r}: {path} not found (data folder {data_dir})"
    if spec.hub is None:
        raise DataError(f"dataset {name!r}: {local}")
    records: list[Record] = []
    for hub_split in spec.hub.splits[chosen]:
        records += _load_from_hub(name, hub_split, hub_id=spec.hub.repo, config=spec.hub.config, why=local)
    return records


def _hub_unreached(refusal: Callable[[str], DataError]) -> bool:
    """True when the hub is needed (neither HF_HUB_OFFLINE nor HF_DATASETS_OFFLINE is set) and cannot be reached;
    ``refusal`` of why, raised, when ``HF_ENDPOINT`` is not a URL (:class:`~dgrpo.hub.EndpointError`)."""
    try:
        return not offline_requested("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE") and not hub_reachable()
    except EndpointError as e:
        raise refusal(str(e)) from None


class HubUnreached(DataError):
    """A dataset read from the Hugging Face hub that could not be: ``reason`` why (no connection, no ``datasets``
    package, the hub's error); ``unknown``: ``name`` is no built-in's (it was looked up on the hub as named, having
    no local file or folder of that name)."""

    def __init__(self, prefix: str, reason: str, name: str, hub_id: str | None) -> None:
        super().__init__(f"{prefix} the Hugging Face hub could not be reached: {reason}")
        self.reason, self.name, self.unknown = reason, name, hub_id is None
        self._made_of = (prefix, reason, name, hub_id)

    def __reduce__(self) -> tuple[type[HubUnreached], tuple[str, str, str, str | None]]:
        """Pickled (a process pool's worker sends it back) and copied as made: from its message alone, as an
        exception is by default, it was a TypeError (``__init__() missing 3 required positional arguments``)."""
        return type(self), self._made_of


def _load_from_hub(
    name: str,
    split: str | None,
    *,
    hub_id: str | None = None,
    config: str | None = None,
    columns: RowParser | None = None,
    why: str = "",
) -> list[Record]:
    """Rows from the Hugging Face hub (``config``: the dataset's config, None for its default), through the
    optional ``datasets`` package, as Records; ``why`` says, in an error, why the hub was asked."""
    builtin = ", ".join(["builtin", *DATASET_NAMES])
    close = difflib.get_close_matches(name.lower(), DATASET_NAMES, n=1, cutoff=0.75) if "/" not in name else []
    meant = f" (did you mean {close[0]!r}?)" if close else ""  # (a built-in name's typo: 'svmap' was asked of the hub)
    prefix = f"unknown dataset {name!r}{meant}: not a local file, not a built-in name ({builtin}), and"
    if hub_id is not None:
        prefix = f"dataset {name!r}: {why}; its hub copy {hub_id!r}:" if why else f"dataset {name!r} (hub {hub_id!r}):"
    try:
        import datasets
    except ImportError:
        raise HubUnreached(
            prefix, "the optional 'datasets' package is not installed (pip install 'dgrpo[hub]')", name, hub_id
        ) from None
    repo = hub_id or name
    if _hub_unreached(lambda why: HubUnreached(prefix, why, name, hub_id)):
        raise HubUnreached(
            prefix, "no connection to it (set HF_DATASETS_OFFLINE=1 to use the local datasets cache)", name, hub_id
        )
    try:
        with hub_lines_held():
            loaded = datasets.load_dataset(repo, config, split=split)
        if split is None:  # a DatasetDict: its test split, or its only one
            named = f"{repo}:SPLIT" + (f"?config={config}" if config else "")
            split = unnamed_split(list(loaded.keys()), f"hub dataset {repo!r}", named)
            loaded = loaded[split]
        rows = dataset_rows(loaded)
    except DataError:
        raise
    except Exception as exc:  # noqa: BLE001 - any hub/network/format failure becomes one DataError line
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
        if "Config name is missing" in str(exc):
            raise DataError(
                f"dataset {repo!r} has several configs: name one as {repo}:SPLIT?config=NAME ({reason})"
            ) from None
        if "Unknown split" in str(exc):  # (datasets' words for a split the dataset does not have)
            named = f"{repo}:SPLIT" + (f"?config={config}" if config else "")
            why_not = f"hub dataset {repo!r} has no split {split!r}: name one as {named} ({reason})"
            raise DataError(why_not) from None
        raise HubUnreached(prefix, f"{reason}{offline_hint(exc)}", name, hub_id) from None
    return rows_to_records(rows, f"hub dataset {repo!r} split {split!r}", f"hf:{repo}", columns)


#: the loggers of the libraries a hub read goes through (huggingface_hub's "HTTP Error 503 thrown while requesting
#: ...", "Retrying in 1s [Retry 1/5]."; datasets' own)
HUB_LOGGERS = ("huggingface_hub", "datasets")


class _Held(logging.Handler):
    """A handler that keeps the records it is given."""

    def __init__(self) -> None:
        super().__init__(logging.NOTSET)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextmanager
def hub_lines_held(names: tuple[str, ...] = HUB_LOGGERS) -> Iterator[None]:
    """Hold what the loggers ``names`` (and theirs below) log inside the block: printed when the block ends, as they
    would have been, unless it raises. A failed hub read is then one line, dgrpo's DataError that gives the
    library's error as its reason, not the library's log lines before it (a hub answering 503 printed eleven). Only
    inside the block: the libraries' warnings elsewhere, and those of a read that succeeds, are printed."""
    held = _Held()
    loggers = [logging.getLogger(name) for name in names]
    saved = [(logger.handlers[:], logger.propagate) for logger in loggers]
    for logger in loggers:
        logger.handlers, logger.propagate = [held], False
    try:
        yield
    finally:
        for logger, (handlers, propagate) in zip(loggers, saved, strict=True):
            logger.handlers, logger.propagate = handlers, propagate
    for record in held.records:  # (not reached when the block raised)
        logging.getLogger(record.name).handle(record)


def offline_hint(exc: Exception) -> str:
    """How to get a hub dataset that offline mode (``HF_HUB_OFFLINE`` / ``HF_DATASETS_OFFLINE``) kept
    ``datasets.load_dataset`` from reading (``exc``: its failure); "" for any other failure."""
    offline = offline_variable("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    if offline is None or not (isinstance(exc, ConnectionError) or "OfflineModeIsEnabled" in str(exc)):
        return ""
    return (
        f" ({offline} is set and the dataset is not in the datasets cache: load it once where there is network "
        f"with this HF_HOME, or unset {offline})"
    )


def _load_openmath_subset(name: str) -> list[Record]:
    """``openmathinstruct2_gsm``: the paper-sized GSM-style subset of OpenMathInstruct-2 (rule: dgrpo.data.subsets),
    streamed from the hub. Without a connection to it, one line at once (as :func:`_load_from_hub`), not the hub
    libraries' retries (~25 s) and their log lines."""
    unreached = f"dataset {name!r} (hub {OPENMATH_HUB_ID!r}): the Hugging Face hub could not be reached"
    if _hub_unreached(lambda why: DataError(f"{unreached}: {why}")):
        raise DataError(f"{unreached}: no connection to it (the subset is streamed: it needs the hub)")
    try:
        with hub_lines_held():
            rows = sample_subset(stream_openmath())
    except ImportError:
        raise DataError(f"dataset {name!r} needs the optional 'datasets' package (pip install 'dgrpo[hub]')") from None
    except Exception as exc:  # noqa: BLE001 - any hub/network failure becomes one DataError line
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
        raise DataError(f"{unreached}: {reason}") from None
    return rows_to_records(rows, f"dataset {name!r}", f"hf:{OPENMATH_HUB_ID}", None)


def rows_to_records(
    rows: list[Any], where: str, source: str, parser: RowParser | None, *, csv: CsvTable | None = None
) -> list[Record]:
    """Records from row dicts (a table, a hub dataset): ``parser`` (a column mapping) or the format the first row's
    keys identify (every later row in it: :func:`_same_format_check`); one DataError line naming the row on any
    problem: its file line when ``csv`` (the CSV file ``rows`` were read from) gives them, else its number (the first
    row is row 1)."""
    records: list[Record] = []
    check: Callable[[dict[str, Any]], None] | None = None
    for index, row in enumerate(rows):
        try:
            if not isinstance(row, dict):
                raise _RowError(f"expected a record (mapping), got {type(row).__name__}")
            if parser is None:
                parser = _detect_row_parser(row)
                check = _same_format_check(parser)
            elif check is not None:
                check(row)
            record = parser(row)
        except _RowError as exc:
            if csv is None:
                raise DataError(f"{where} row {index + 1}: {exc}") from None
            problem = _short_row(exc, csv.cells[index], csv.header)
            raise DataError(f"{where} line {csv.lines[index]}: {problem}") from None
        record.meta.setdefault("source", source)
        records.append(record)
    if not records:
        raise DataError(f"{where} contains no records")
    return records


def _short_row(exc: _RowError, cells: int, header: list[str]) -> str:
    """A CSV row's problem: ``exc``, or, for a row of fewer ``cells`` than its ``header`` (the cells it lacks are None:
    a CSV value is otherwise text), which columns it has no value for and how many cells it has. A field it needs
    among them was 'field 'answer' must be a string, got NoneType', or 'is empty (null)', as if the file had said
    null. Counted from the header, not the row's keys: a column named twice is one key (of the later column's value),
    and the count was one short per repeat ('1 cell, fewer than the header's 2 columns' for 2 cells of 3)."""
    missing = list(dict.fromkeys(header[cells:]))  # (each name once, in the header's order)
    if not missing:
        return str(exc)
    short = f"the row has {cells} cell{'s' * (cells != 1)}, fewer than the header's {len(header)} columns"
    twice = [m for m in missing if m and m in header[:cells]]  # (its earlier cell is there, the later one read;
    # '': a spreadsheet's columns without a name, which are not warned of)
    if twice:
        short += f"; the header names {twice[0]!r} twice, and each row's later value is read"
    if not isinstance(exc, _NoValue):
        return f"{exc} ({short}: no value for {', '.join(repr(m) for m in missing)})"
    others = [repr(m) for m in missing if not exc.what.endswith(repr(m))]
    return f"{exc.what} has no value: {short}" + (f" (none for {', '.join(others)} either)" if others else "")


#: the columns a mapped row's record does not keep in ``meta``: the record's own fields, and TRL's prompt column
_RECORD_COLUMNS = ("question", "answer", "steps", "prompt")


def _check_scalar(value: Any, key: str, answer: bool = False) -> None:
    """A mapped question or answer column holds text or a number: a list or mapping (a chat-format prompt, several
    accepted answers) was read as its Python repr, ``"[{'role': 'user', ...}]"``, trained on and never scored right.
    A list is named for what it likely is in that column (an answer column's list was called a conversation)."""
    if value is None or isinstance(value, (str, numbers.Number)):
        return
    hint = ""
    if isinstance(value, list):
        hint = (
            " (several accepted answers? put the one to train on here, the list in another column, which a reward "
            "function reads by its name)"
            if answer
            else " (a chat-format conversation: give the question's text; data.chat_template: true wraps it in the "
            "tokenizer's chat template)"
        )
    raise _RowError(f"column {key!r} must be text or a number, got {type(value).__name__}{hint}")


class _ColumnParser:
    """The row parser :func:`column_parser` returns; it also notes the rows it maps and whether one had the steps
    column, for :meth:`check_steps`."""

    def __init__(self, question_key: str, answer_key: str, steps_key: str = "", steps_required: bool = True) -> None:
        self.question_key, self.answer_key, self.steps_key = question_key, answer_key, steps_key
        self.steps_required = steps_required
        self.start()

    def start(self) -> None:
        """Forget the rows seen so far (a new file or dataset begins)."""
        self.fields: set[str] = set()
        self.steps_seen = False

    def check_steps(self, where: str) -> None:
        """DataError when ``steps_key`` is set and required and none of the mapped rows since :meth:`start` has
        that field."""
        if self.steps_key and self.steps_required and self.fields and not self.steps_seen:
            raise DataError(
                f"{where}: missing field {self.steps_key!r} (data.steps_key) in every record; their fields: "
                f"{_shown_keys(self.fields)}"
            )

    def __call__(self, row: dict[str, Any]) -> Record:
        known = _known_row_parser(row) if self.question_key not in row else None
        if known is not None:
            return known(row)
        self.fields.update(str(key) for key in row)
        self.steps_seen = self.steps_seen or self.steps_key in row
        raw_question = _field(row, self.question_key, "data.question_key")
        if raw_question is None:  # (null: empty, not 'None')
            raise _NoValue(f"column {self.question_key!r}")
        _check_scalar(raw_question, self.question_key)
        question = str(raw_question).strip()
        if not question:
            raise _RowError(f"column {self.question_key!r} is empty")
        answer, solution = self._answer(row)
        steps = self._steps(row, solution, answer)
        # every column stays under its own name, the mapped ones too (TRL passes a reward function each column but
        # the prompt), except those the record holds as question, answer and steps
        meta = {k: v for k, v in row.items() if k not in _RECORD_COLUMNS}
        if solution is not None:
            meta.setdefault("solution", solution)  # (a GSM8K-style answer column; a column of that name wins)
        return Record(question, steps, answer, meta)

    def _answer(self, row: dict[str, Any]) -> tuple[str, str | None]:
        """(the answer, the GSM8K-style solution it was read from or None)."""
        key = self.answer_key
        raw = _field(row, key, "data.answer_key")
        if raw is None:  # (JSON null, an empty parquet cell: str() would make it the answer 'None')
            raise _NoValue(f"column {key!r}")
        _check_scalar(raw, key, answer=True)
        raw = _python_number(raw)  # (np.float32 nan was the answer 'nan', as str() printed it)
        number = isinstance(raw, (int, float, Decimal))
        answer = _format_number(raw, f"column {key!r}") if number else str(raw).strip()
        solution = answer if "####" in answer else None
        if solution is not None:
            answer = solution.rpartition("####")[2].strip()
        answer = normalize_number(answer) or answer
        if not answer:
            raise _RowError(f"column {key!r} is empty" + (" after its '####'" if solution else ""))
        return answer, solution

    def _steps(self, row: dict[str, Any], solution: str | None, answer: str) -> list[str]:
        key = self.steps_key
        steps: Any = row.get(key, []) if key else _step_annotations(solution) if solution else []
        if steps is None:  # (a missing value: parquet and Hugging Face datasets hold None where JSONL omits the key)
            steps = []
        if isinstance(steps, str):
            listed = _listed_steps(steps)
            steps = listed if listed is not None else _before_answer_line(steps, answer).splitlines()
        if not isinstance(steps, list) or not all(isinstance(s, str) for s in steps):
            raise _RowError(f"column {key!r} must be a list of strings or one string")
        steps = [s for s in steps if s.strip()]  # (blank steps dropped, as from Coconut's records)
        if steps and _before_answer_line(steps[-1], answer).strip() == "":
            # (a list that ends with '#### <answer>': the answer, not a step; checked after the blanks are dropped,
            # ['...', '#### 4', ''] kept it, its blank taken for the answer line)
            steps = steps[:-1]
        return steps


def _before_answer_line(text: str, answer: str) -> str:
    """A steps text without its end ``#### <answer>`` (a GSM8K-style solution: the answer column itself, or a
    solution column beside a column of bare answers), which was kept as the last step and trained as one: the answer
    written twice. Any other ``####`` (a Markdown heading) stays."""
    head, marker, tail = text.rpartition("####")
    return head if marker and (normalize_number(tail.strip()) or tail.strip()) == answer else text


def column_parser(question_key: str, answer_key: str, steps_key: str = "", steps_required: bool = True) -> RowParser:
    """A row parser for files whose keys are not a known format: the question, answer (a number is normalised,
    text kept; a GSM8K-style solution is read as GSM8K's: the answer after its ``####``, its ``<<...>>``
    calculations as steps) and steps (a list of strings, a list's text as a CSV cell holds one, or one string split
    on newlines) from the named columns.
    A row without the question column whose keys are a known format is read as that format, so mapped files
    can sit beside standard ones (a mapped training file, GSM8K-style validation and test files).
    Given to :func:`load_dataset`, a ``steps_key`` that no mapped record of the file has is a DataError (a
    misspelt key would silently give records without steps), unless not ``steps_required`` (held-out data)."""
    return _ColumnParser(question_key, answer_key, steps_key, steps_required)


def load_dataset(
    name_or_path: str, split: str | None = None, *, columns: RowParser | None = None, config: str | None = None
) -> list[Record]:
    """Load a dataset as a list of :class:`Record`.

    ``name_or_path`` is one of:

    * a built-in name (files under :func:`find_data_dir`): ``gsm8k`` (train/test), ``gsm8k_aug``
      (valid/test), ``coconut_gsm8k_aug`` (valid/test), ``prosqa`` (valid), ``svamp`` (test: all
      1000), ``multiarith`` (test: all 600), ``gsm_hard`` (test); without a local copy, the ones with a
      :class:`HubCopy` (all but ``prosqa`` and ``coconut_gsm8k_aug``) are read from the hub;
    * ``openmathinstruct2`` (``nvidia/OpenMathInstruct-2`` on the Hugging Face hub);
    * a name starting with ``builtin``: the project's synthetic task (``dgrpo.data.synthetic``),
      ``builtin[:split][?option=value&...]``; a ``split`` argument wins over the name's (as in
      :func:`~dgrpo.data.load_spec`);
    * a path to a data file; its format is detected from the extension and content (jsonl/JSON-list
      records keyed like any format above (a ``.json`` or ``.ndjson`` file of JSON Lines too), PAL
      ``{input, target}`` jsonl,
      OpenMathInstruct-2 ``{problem, expected_answer}`` jsonl, or GSM8K-Aug ``question||steps #### answer`` lines;
      CSV, TSV (``.tsv``: CSV with tabs) and parquet tables); a file has no splits: ``split`` with a file path is a
      DataError;
    * any other name: a Hugging Face hub dataset, read through the optional ``datasets`` package (``config``:
      which of its configs, for a dataset that has several, e.g. ``main`` of ``openai/gsm8k``).

    ``split=None`` picks ``test`` when the dataset has one, else its only split (ProsQA's ``valid``); a folder or hub
    dataset of several splits and no test split is a DataError naming them (its first, often ``train``, was read).
    Numeric answers are normalised number strings (``"40,000"`` -> ``"40000"``).

    ``columns`` (:func:`column_parser`) maps the keys of files that are not a known format.

    Raises :class:`DataError` (one line naming the file and line or record) for a missing or
    malformed file, an unknown split (or any split, for a file), an empty dataset, a name that cannot be resolved,
    or a ``columns`` steps key that no mapped record has.
    """
    return mapped_read(columns, name_or_path, lambda: _load_any(name_or_path, split, columns, config))


def mapped_read(columns: RowParser | None, where: str | os.PathLike, read: Callable[[], list[Record]]) -> list[Record]:
    """``read()``'s records, with a column mapping's (:func:`column_parser`) steps key checked over the rows it read:
    a key that no mapped record of ``where`` has is a DataError."""
    if isinstance(columns, _ColumnParser):
        columns.start()
    records = read()
    if isinstance(columns, _ColumnParser):
        columns.check_steps(os.fspath(where))
    return records


def _load_any(name_or_path: str, split: str | None, columns: RowParser | None, config: str | None) -> list[Record]:
    """:func:`load_dataset` without the steps-column check."""
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise DataError(f"dataset name or path must be a string, got {type(name_or_path).__name__}")
    raw = os.fspath(name_or_path)
    if not isinstance(raw, str) or not raw.strip():
        raise DataError("dataset name or path is empty")
    path = expand_home(raw)
    try:
        exists, is_file = path.exists(), path.is_file()
    except OSError:
        exists = is_file = False
    key = canonical_name(raw)
    if config is not None and (raw.startswith("builtin") or exists or key in DATASET_NAMES):
        raise DataError(f"{raw}: a config (?config={config}) names one of a hub dataset's configs; this is not one")
    if isinstance(name_or_path, str) and raw.startswith("builtin"):
        return load_builtin(raw, split)
    if is_file:
        if split:
            raise DataError(f"split={split!r}: {raw} is a file, which has no splits (give the split's file)")
        return _load_file(path, columns)
    if is_hf_folder(path):
        return rows_to_records(read_hf_folder(path, split), str(path), str(path), columns)
    if key in DATASETS:
        return _load_builtin_name(key, split)
    if key in HUB_DATASETS:
        return _load_from_hub(raw, split if split is not None else "train", hub_id=HUB_DATASETS[key])
    if key == OPENMATH_GSM:
        return _load_openmath_subset(raw)
    if names_a_file(raw):
        if path.is_dir():
            raise DataError(f"{path}: is a directory; give a data file or a dataset name{_files_in(path)}")
        raise DataError(_not_found(path))
    return _load_from_hub(raw, split, columns=columns, config=config)


def names_a_file(raw: str) -> bool:
    """Whether a name that is no built-in dataset is meant as a local path (a data file's extension, a leading
    ``.``, ``/`` or ``~``, or a directory), not a hub dataset."""
    path = expand_home(raw)
    return path.suffix.lower() in FILE_SUFFIXES or raw.startswith((".", "/", "~")) or path.is_dir()


#: the extensions of the data files :func:`load_dataset` reads; a name with one is a path, never a hub dataset (a
#: missing ``my_train.csv`` was looked up on the hub: 'unknown dataset ...', or a wait for the network; so was a
#: missing ``.ndjson``, JSON Lines' other name, which is read as JSON Lines where it exists)
FILE_SUFFIXES = (".json", ".jsonl", ".ndjson", ".txt", ".csv", ".tsv", ".parquet", ".pq")


def _files_in(folder: Path) -> str:
    """The data files a folder holds, as paths to give instead of it (a folder of train.jsonl and test.jsonl, read
    by Hugging Face's load_dataset as splits, was only 'is a directory')."""
    found = sorted(p for p in folder.iterdir() if p.suffix.lower() in FILE_SUFFIXES and p.is_file())
    if not found:
        return ""
    return f" (it holds {first_items(found, 4)}: name the file to read)"


def _not_found(path: Path) -> str:
    """``PATH: file not found``, saying where a relative path was looked for (a run's config.json copied to another
    folder keeps its data.test as typed), and the data files beside it that it likely meant (:func:`files_like`; a
    typo alone was 'file not found', where the same typo in a ``+``-joined spec named them)."""
    return f"{path}: file not found{where_read(path)}{files_like(path)}"


def files_like(path: Path) -> str:
    """The data files beside ``path`` (in its folder) as a message's clause: those whose names are close to its name
    (``; did you mean ...?``), else all of them (``; its folder holds ...``, the first 4); '' when its folder holds
    none or is none."""
    try:
        found = sorted(p.name for p in path.parent.iterdir() if p.suffix.lower() in FILE_SUFFIXES and p.is_file())
    except OSError:
        return ""
    close = difflib.get_close_matches(path.name, found, n=3, cutoff=0.8)
    if close:
        return f"; did you mean {first_items([str(path.parent / name) for name in close], 3)}?"
    return f"; its folder holds {first_items([str(path.parent / name) for name in found], 4)}" if found else ""


def reads_from_the_hub(name: str) -> bool:
    """Whether :func:`load_dataset` reads ``name`` (without a split or a config) as a hub dataset it names: no
    built-in name, no path that exists or is meant as one."""
    try:
        exists = expand_home(name).exists()
    except OSError:
        exists = False
    return not (exists or name.startswith("builtin") or is_dataset_name(name) or names_a_file(name))


def is_dataset_name(name: str) -> bool:
    """Whether ``name`` names one of the datasets :func:`load_dataset` knows (its aliases and case aside), which it
    reads as that dataset even where a plain folder of that name exists."""
    return canonical_name(name) in DATASET_NAMES
