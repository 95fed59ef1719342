"""Tabular files you bring: CSV (standard library), parquet and Hugging Face dataset folders (``save_to_disk``,
through the optional ``datasets`` package). Each reader returns plain row dicts; :mod:`dgrpo.data.loaders` turns
them into records (by their keys, or by the column mapping ``data.question_key`` / ``answer_key`` / ``steps_key``).
"""

from __future__ import annotations

import csv
import math
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import zip_longest
from pathlib import Path
from typing import Any, NamedTuple

from ..reward import narrow_number, numpy_rounder
from .records import DataError

#: files that mark a folder written by ``datasets.Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``
HF_FOLDER_MARKERS = ("dataset_info.json", "dataset_dict.json", "state.json")


def is_hf_folder(path: Path) -> bool:
    return path.is_dir() and any((path / m).is_file() for m in HF_FOLDER_MARKERS)


def hf_folder_splits(path: Path) -> list[str]:
    """The split names a ``DatasetDict.save_to_disk`` folder lists in its ``dataset_dict.json`` ([] for a Dataset's
    folder, which has none, or for a listing that cannot be read: the read itself then says what is wrong)."""
    import json

    try:
        splits = json.loads((path / "dataset_dict.json").read_text()).get("splits", [])
    except (OSError, ValueError, AttributeError):
        return []
    return [s for s in splits if isinstance(s, str)] if isinstance(splits, list) else []


class CsvTable(NamedTuple):
    """A CSV file's rows (:func:`read_csv_lines`), with what a row dict does not tell: the file line each row starts
    on, the cells each row has, and the header (a column it names twice is one key of a row)."""

    rows: list[dict[str, Any]]
    lines: list[int]
    cells: list[int]
    header: list[str]


def read_csv_lines(path: Path, delimiter: str = ",") -> CsvTable:
    """The rows of a CSV file with a header line (values are strings; None in a row shorter than the header), the
    file line each row starts on (the header is line 1, or the first line that is not blank; a quoted value may span
    lines) and its cells. A row longer than the header is a DataError (its extra cells had no column name). Blank
    lines are skipped, as csv.DictReader does; csv.reader is read directly because DictReader skips them out of
    sight, and its line_num then names a line before the row. ``delimiter``: a tab for a TSV file (a CSV file
    of tabs, quoted values too, as pandas' ``read_csv`` with a tab separator reads it)."""
    kind = "TSV" if delimiter == "\t" else "CSV"
    try:
        with open(path, "rb") as raw:
            refused = not_text(path, raw.read(HEAD_BYTES))
    except OSError:
        refused = None  # (open below says what is wrong)
    if refused is not None:
        raise refused
    try:
        with open(path, newline="", encoding="utf-8-sig") as f, _cells_of_any_length():
            reader = csv.reader(f, delimiter=delimiter)
            header = next(reader, None)
            while header == []:  # (blank lines above the header, which pandas skips too: 'no header line')
                header = next(reader, None)
            if not header:
                raise DataError(f"{path}: no header line ({kind} files need one, naming the columns)")
            _warn_repeated_columns(path, header)
            table, end = CsvTable([], [], [], header), reader.line_num
            for cells in reader:  # (each record, a blank line's [] too, starts on the line after the last one read)
                start, end = end + 1, reader.line_num
                if cells:
                    table.rows.append(_row(path, header, cells, start, delimiter))
                    table.lines.append(start)
                    table.cells.append(len(cells))
            return table
    except UnicodeDecodeError as e:  # (its start counts from the chunk the decoder was given, not the file's start)
        raise not_utf8(path, path.read_bytes()) or DataError(f"{path}: not UTF-8 text ({e.reason})") from None
    except csv.Error as e:
        raise DataError(f"{path}: not a readable {kind} file ({e})") from None


#: the longest cell :func:`read_csv_lines` reads: C's 32-bit long (the csv module's own limit, 131072 characters,
#: refused a file holding a long solution, a reasoning model's trace of 30k tokens, which JSON Lines holds as it is)
CSV_CELL_LIMIT = 2**31 - 1


@contextmanager
def _cells_of_any_length() -> Iterator[None]:
    """The csv module's field size limit raised to :data:`CSV_CELL_LIMIT` inside the block, restored after it (it is
    the process's)."""
    before = csv.field_size_limit(CSV_CELL_LIMIT)
    try:
        yield
    finally:
        csv.field_size_limit(before)


#: how many of a file's first bytes :func:`not_text` looks at
HEAD_BYTES = 64


def not_text(path: Path, head: bytes) -> DataError | None:
    """The DataError for a data file whose first bytes ``head`` (:data:`HEAD_BYTES` of them, all of a shorter file)
    are not text it can read, saying what it is and what to do: empty (or blank), gzip-compressed (it was 'line 1:
    not valid UTF-8 (byte 1)'), a zip archive (an Excel ``.xlsx`` workbook is one: it was 'unrecognised format', or
    as ``.csv`` 'contains no records'), UTF-16 or UTF-32 text (:func:`wide_text`); None otherwise. Every reader of a
    text file (:func:`read_csv_lines`, the JSON and text formats') asks it before decoding."""
    if len(head) < HEAD_BYTES and not head.strip():
        return DataError(f"{path}: the file is empty" + (" (blank lines only)" if head else ""))
    if head.startswith(b"\x1f\x8b"):  # (gzip's magic bytes)
        return DataError(f"{path}: a gzip-compressed file; decompress it first (gunzip -k {path})")
    if head.startswith(b"PK\x03\x04"):
        return DataError(
            f"{path}: a zip archive (an Excel .xlsx workbook is one), not text: export the sheet as CSV UTF-8 (Excel: "
            "Save As, CSV UTF-8), or in Python pass its rows: "
            "dgrpo.load_dataset(pandas.read_excel(path).to_dict('records'))"
        )
    return wide_text(path, head)


def wide_text(path: Path, head: bytes) -> DataError | None:
    """The DataError for a file whose first bytes ``head`` are UTF-16 or UTF-32 text (a byte-order mark ``FF FE`` or
    ``FE FF``; without one, a NUL byte beside each character of the first line), saying how to convert it to UTF-8;
    None for any other. Excel's and Notepad's 'Unicode Text' is UTF-16: it was 'line 1: not valid UTF-8 (byte 0)',
    and, without a mark, its columns were read as ``\x00q\x00u...`` ('unrecognised record keys')."""
    if head.startswith((b"\xff\xfe\x00\x00", b"\x00\x00\xfe\xff")):
        encoding = "UTF-32"
    elif head.startswith((b"\xff\xfe", b"\xfe\xff")):
        encoding = "UTF-16"
    else:
        pairs = head[: len(head) // 2 * 2]
        if len(pairs) < 4 or b"\x00" not in pairs:
            return None
        low, high = pairs[0::2], pairs[1::2]
        if not high.strip(b"\x00") and low.strip(b"\x00"):
            encoding = "UTF-16LE"
        elif not low.strip(b"\x00") and high.strip(b"\x00"):
            encoding = "UTF-16BE"
        else:
            return None
    out, table = path.with_name(f"{path.stem}_utf8{path.suffix}"), path.suffix.lower() in (".csv", ".tsv")
    return DataError(
        f"{path}: {encoding} text (as Excel's and Notepad's 'Unicode Text' is saved), not UTF-8; convert it: iconv -f "
        f"{encoding} -t UTF-8 {path} > {out} (in Python: Path({str(out)!r}).write_text(Path({str(path)!r}).read_text"
        f"({encoding.lower()!r}), 'utf-8')){', or save it from Excel as CSV UTF-8' if table else ''}"
    )


def not_utf8(path: Path, data: bytes) -> DataError | None:
    """The DataError for a file's bytes ``data`` that are not UTF-8, naming the line and byte (counted from the file's
    start, a byte-order mark included) where they first are not; None when they are. A CSV file's line and byte were
    none and the byte counted from the start of the chunk being decoded (``byte 4583`` for a bad byte at 397799, on
    line 20002); a JSON file's, counted after its byte-order mark, named the line before when a newline was among the
    last 3 bytes before it."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        return DataError(f"{path} line {line}: not valid UTF-8 (byte {exc.start}); save the file as UTF-8")
    return None


def _warn_repeated_columns(path: Path, header: list[str]) -> None:
    """Warn of a header that names a column twice: each row keeps the later column's value (csv.DictReader's rule),
    as a JSON object naming a key twice keeps its last value, which is warned of too."""
    if repeated := [c for i, c in enumerate(header) if c and c in header[:i]]:  # ('': a spreadsheet's empty columns)
        warnings.warn(
            f"{path}: the header names the column {repeated[0]!r} twice; each row's later value is read", stacklevel=5
        )


def _row(path: Path, header: list[str], cells: list[str], line: int, delimiter: str = ",") -> dict[str, Any]:
    """One row as csv.DictReader makes it (a missing cell is None; a later column of a repeated name wins), but a
    row longer than the header is a DataError: DictReader kept its extra cells under the key None."""
    if len(cells) > len(header):
        separator = "a tab" if delimiter == "\t" else "a comma"
        raise DataError(
            f"{path} line {line}: {len(cells)} cells, more than the header's {len(header)} columns "
            f"(a value with {separator} needs quotes)"
        )
    return dict(zip_longest(header, cells))


def _datasets(what: str) -> Any:
    try:
        import datasets
    except ImportError:
        raise DataError(f"{what} needs the optional 'datasets' package: pip install 'dgrpo[hub]'") from None
    return datasets


def read_parquet(path: Path) -> list[dict[str, Any]]:
    """The rows of a parquet file, as ``datasets.Dataset.from_parquet`` gives them (the features its schema or its
    Hugging Face metadata name, cast to as that builder casts), read in memory: ``from_parquet`` wrote an Arrow copy
    of each new file into the datasets cache (``~/.cache/huggingface/datasets``), a big file's size again on disk,
    unasked."""
    datasets = _datasets(f"{path}: reading parquet")
    try:
        with progress_bars_held(datasets):
            return dataset_rows(_parquet_dataset(datasets, path))
    except Exception as e:  # noqa: BLE001 - a damaged or foreign file: one line
        raise DataError(f"{path}: not a readable parquet file ({type(e).__name__}: {str(e)[:200]})") from None


def _parquet_dataset(datasets: Any, path: Path) -> Any:
    """A parquet file as an in-memory ``datasets.Dataset``, without the cache copy of ``Dataset.from_parquet``."""
    import pyarrow.parquet as pq  # (a dependency of datasets)
    from datasets.table import InMemoryTable, table_cast

    table = pq.ParquetFile(str(path)).read()
    features = datasets.Features.from_arrow_schema(table.schema)
    # (a fixed fingerprint: the default hashes every row, and this dataset is only read, never cached or mapped)
    return datasets.Dataset(InMemoryTable(table_cast(table, features.arrow_schema)), fingerprint="dgrpo-parquet")


@contextmanager
def progress_bars_held(datasets: Any) -> Iterator[None]:
    """No progress bar of the ``datasets`` package within the block, as it was after: a local file's read printed
    'Generating train split: 5 examples [00:00, ...]' (the hub's lines are held by
    :func:`dgrpo.data.loaders.hub_lines_held`; a hub download's bars stay). Bars already off, or kept on by
    ``HF_DATASETS_DISABLE_PROGRESS_BARS=0``, are left as they are."""
    utils = datasets.utils
    if utils.are_progress_bars_disabled():
        yield
        return
    with warnings.catch_warnings():  # (the variable set to 0 wins: datasets warns that it cannot disable them)
        warnings.simplefilter("ignore")
        utils.disable_progress_bars()
    try:
        yield
    finally:
        if utils.are_progress_bars_disabled():
            utils.enable_progress_bars()


def read_hf_folder(path: Path, split: str | None) -> list[dict[str, Any]]:
    """The rows of a ``save_to_disk`` folder: a Dataset, or one split of a DatasetDict (``split``, else its test split
    or its only one: :func:`unnamed_split`)."""
    datasets = _datasets(f"{path}: reading a Hugging Face dataset folder")
    try:
        with progress_bars_held(datasets):  # ('Loading dataset from disk', over 16 files on a terminal)
            loaded = datasets.load_from_disk(str(path))
    except Exception as e:  # noqa: BLE001
        raise DataError(f"{path}: not a readable dataset folder ({type(e).__name__}: {str(e)[:200]})") from None
    return split_rows(loaded, split, str(path))


def split_rows(loaded: Any, split: str | None, where: str, name_one: str = "") -> list[dict[str, Any]]:
    """The rows of a ``datasets.Dataset``, or of one split of a ``DatasetDict`` (``split``, else :func:`unnamed_split`;
    ``split`` given with a Dataset, which has none, is a DataError). ``name_one``: how a split is named (``PATH:SPLIT``
    for a folder, the default)."""
    if hasattr(loaded, "features"):  # a Dataset
        if split is not None:
            raise DataError(f"{where} is one split (a Dataset, not a DatasetDict): give no split")
        return dataset_rows(loaded)
    names = list(loaded.keys())
    chosen = split or unnamed_split(names, where, name_one or f"{where}:SPLIT")
    if chosen not in names:
        raise DataError(f"{where}: has splits {', '.join(names)}; got {chosen!r}")
    return dataset_rows(loaded[chosen])


def unnamed_split(names: list[str], where: str, name_one: str) -> str:
    """The split a dataset of the splits ``names`` means when none is named: ``test``, or its only split. Several and
    no test is a DataError naming them (``name_one``: how to name one): the first, often ``train``, was evaluated."""
    if "test" in names:
        return "test"
    if len(names) == 1:
        return names[0]
    if not names:
        raise DataError(f"{where}: has no splits (an empty DatasetDict)")
    raise DataError(f"{where}: the splits {', '.join(names)} and no test split; name the one to read as {name_one}")


def dataset_rows(dataset: Any) -> list[dict[str, Any]]:
    """The rows of a ``datasets.Dataset`` as dicts. A float32 or float16 column's values, which Arrow hands over as
    the float64 of the stored bits (2.299999952316284 for a stored 2.3), are the shortest decimal of their own type
    (2.3; :func:`dgrpo.reward.narrow_number`): a gold answer of a float32 column is then the number that was written,
    as a CSV file's is."""
    import numpy as np

    rows = list(dataset)
    narrow = [
        (name, numpy_rounder(np.dtype(feature.dtype).type))
        for name, feature in (getattr(dataset, "features", None) or {}).items()
        if getattr(feature, "dtype", None) in ("float16", "float32")
    ]
    for row in rows if narrow else ():
        for name, to_type in narrow:
            value = row.get(name)
            if isinstance(value, float) and math.isfinite(value):
                row[name] = float(narrow_number(value, to_type))
    return rows
