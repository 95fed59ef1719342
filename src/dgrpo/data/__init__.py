"""Datasets: one record type, loaders for the public math sets, the built-in synthetic task."""

from __future__ import annotations

from typing import Any

from ..paths import expand_home, where_read
from ..text import first_items
from .loaders import (
    DATASETS,
    canonical_name,
    column_parser,
    files_like,
    is_dataset_name,
    load_dataset,
    names_a_file,
    reads_from_the_hub,
)
from .records import DataError, Record, shared_questions, warn_if_marker_text, with_columns
from .synthetic import load_builtin
from .tables import hf_folder_splits, is_hf_folder


def columns_of(data=None, held_out: bool = False):
    """The row parser of a DataConfig's column mapping (None: no mapping), the mapping checked first (an
    ``answer_key`` or ``steps_key`` without ``question_key`` would be ignored); ``held_out``: see :func:`load_spec`."""
    if data is None:
        return None
    data.validate()
    if not data.question_key:
        return None
    return column_parser(data.question_key, data.answer_key, data.steps_key, steps_required=not held_out)


def load_spec(spec: str, task=None, split: str | None = None, data=None, held_out: bool = False) -> list[Record]:
    """Load ``name``, ``name:split``, a file path, or several joined by ``+`` (``gsm_hard+svamp``; a file whose name
    holds a ``+`` is one part where it exists: :func:`join_parts`); a hub dataset with several configs names one:
    ``openai/gsm8k:test?config=main``.

    ``task`` (a TaskConfig) parameterises ``builtin`` names (options in the name apply over it); ``split``, when
    given, wins over a split in the name; ``data`` (a DataConfig) gives the column mapping for files whose keys
    are not a known format (``question_key``, ``answer_key``, ``steps_key``). ``held_out``: data evaluated, not
    trained on (validation, test, ``dgrpo eval``), whose files need not have the steps column: a ``steps_key`` that no
    row has is an error only for training data (a misspelt key would train no steps).

    Every record has every column (``meta`` key) of the records loaded, None where its row lacked it, as a Hugging
    Face dataset holds a column some rows lack: a reward or scorer in TRL's form gets the same keywords whichever
    records a batch, a rank's shard or a vote holds."""
    records = with_columns(_load_spec(spec, task, split, data, held_out))
    warn_if_marker_text(records, f"{spec}" + (f" ({split})" if split else ""))
    return records


def load_rows(rows: list, data=None) -> list[Record]:
    """The records of rows in memory (a list of dicts, as ``datasets.Dataset.from_list`` takes them), read as a file of
    these rows is: a known format by its keys (``question`` / ``answer``, GSM8K's ``#### x`` answers too), else
    ``data``'s column mapping (``question_key``, ...); every other key stays in ``Record.meta``."""
    from .loaders import mapped_read, rows_to_records

    where, columns = "the rows given", columns_of(data)
    records = with_columns(mapped_read(columns, where, lambda: rows_to_records(list(rows), where, "rows", columns)))
    warn_if_marker_text(records, where)
    return records


def load_hf_dataset(dataset: Any, split: str | None = None, data=None) -> list[Record]:
    """The records of a Hugging Face ``datasets.Dataset`` in memory (or of one split of a ``DatasetDict``), read as a
    file of its rows is: a known format by its keys, else ``data``'s column mapping (every record every column)."""
    from .loaders import mapped_read, rows_to_records
    from .tables import split_rows

    where, columns = f"the {type(dataset).__name__} given", columns_of(data)

    def read() -> list[Record]:
        return rows_to_records(split_rows(dataset, split, where, "split=NAME"), where, "dataset", columns)

    records = with_columns(mapped_read(columns, where, read))
    warn_if_marker_text(records, where)
    return records


def local_path(spec: str) -> tuple[str, str | None] | None:
    """``(path, split)`` when ``spec`` names a local file or folder, alone or as ``PATH:SPLIT`` (split None when it
    names none), whatever characters the path holds (``run:1``, ``mix+svamp``, ``q?x``); None for anything else (a
    built-in or hub name, ``a+b``). ``PATH:SPLIT`` is read so only when no ``+`` follows the split: ``a:train+b`` joins.
    The one reading of a path in a spec: loading, keys, labels and checks all take it from here."""
    if spec.startswith("builtin"):
        return None
    if _is_local(spec):
        return spec, None
    folder, colon, in_folder = spec.rpartition(":")
    if colon and folder and "+" not in in_folder and _is_local(folder):
        return folder, in_folder
    return None


def join_parts(spec: str) -> list[str]:
    """The datasets a spec joined by ``+`` reads, in order: at each place the longest run of ``+``-separated pieces
    that names a local file or folder (:func:`local_path`: ``a+b.jsonl+c.csv`` is ``a+b.jsonl`` then ``c.csv`` where
    the file a+b.jsonl exists), else one piece; each stripped of spaces. ``[spec]`` for a spec that is a path."""
    pieces = spec.split("+")
    parts: list[str] = []
    i = 0
    while i < len(pieces):
        j = next(
            j for j in range(len(pieces), i, -1) if j == i + 1 or local_path("+".join(pieces[i:j]).strip()) is not None
        )
        parts.append("+".join(pieces[i:j]).strip())
        i = j
    return parts


def _is_local(path: str) -> bool:
    """Whether :func:`load_dataset` reads ``path`` as a local file or folder: one that exists, and, for a folder that
    is no ``save_to_disk`` one, not named as a built-in dataset (``gsm8k`` in a folder holding ``gsm8k/`` is GSM8K)."""
    where = expand_home(path)
    try:
        if where.is_file() or is_hf_folder(where):
            return True
        return where.exists() and not is_dataset_name(path)
    except OSError:  # (a name too long for a path, say)
        return False


def _load_spec(spec: str, task, split: str | None, data, held_out: bool) -> list[Record]:
    columns = columns_of(data, held_out)
    at_a_path = local_path(spec)
    if at_a_path is not None:
        path, in_path = at_a_path
        return load_dataset(path, split or in_path, columns=columns)
    if "+" in spec:
        parts = join_parts(spec)
        if not all(parts):  # ('a+' dropped the empty part, '+' gave no records at all)
            raise DataError(f"{spec!r}: an empty part between '+' signs; join dataset names as in gsm_hard+svamp")
        check_files_exist(spec, parts)
        return [r for part in parts for r in _load_spec(part, task, split, data, held_out)]
    if spec.startswith("builtin"):
        return load_builtin(spec, split, task)
    spec, _, query = spec.partition("?")
    name, _, in_name = spec.partition(":")
    return load_dataset(name, split or in_name or None, columns=columns, config=_hub_config(query, spec))


def check_files_exist(spec: str, parts: list[str]) -> None:
    """Before any part of a ``+``-joined spec is read, a DataError for the first part meant as a local file (a data
    file's extension, a leading ``.``, ``/`` or ``~``) that names none, naming it, and, where the parts before it name
    nothing local or built-in either, the file their pieces joined would be: ``my+dta.jsonl``, a typo of the file
    ``my+data.jsonl``, was read as the hub dataset ``my`` joined with ``dta.jsonl``, and failed on ``my`` ('unknown
    dataset', or the hub unreached) without naming the file; ``gsm8k+my_trian.jsonl`` read GSM8K before failing. The
    data files in its folder that it likely meant are named (all of them when none is close)."""
    run: list[str] = []  # (the parts before this one that name nothing local or built-in, without a split or config)
    for part in parts:
        head = part.partition("?")[0].partition(":")[0]
        if local_path(part) is not None or part.startswith("builtin") or is_dataset_name(head):
            run = []
            continue
        if not names_a_file(head):
            run.append(head)  # (as typed: data.train's 'my+dta.jsonl' is read as 'my:train+dta.jsonl')
            continue
        joined = "+".join([*run, head])
        where = where_read(expand_home(head))
        if not run:
            raise DataError(f"{spec}: its part {head} names no file{where}{files_like(expand_home(head))}")
        raise DataError(
            f"{spec}: no file {joined}{where}; read as datasets joined by '+', {head} is no file either and "
            f"{first_items(run, 3)} no local file or built-in dataset{files_like(expand_home(joined))}"
        )


def _hub_config(query: str, spec: str) -> str | None:
    """The ``config`` of ``name[:split]?config=NAME`` (a hub dataset's config), None when the query is empty."""
    if not query:
        return None
    key, _, value = query.partition("=")
    if key != "config" or not value or "&" in value:
        raise DataError(f"{spec}?{query}: a hub dataset takes one option, ?config=NAME (one of its configs)")
    return value


def dataset_key(spec: str, split: str | None = None) -> str:
    """What ``load_spec(spec, split=split)`` reads, as one comparable text: a built-in name with its aliases and
    case resolved and its split made explicit (``gsm-hard`` and ``GSM_Hard:test`` are both ``gsm_hard:test``), a
    path made absolute; ``split`` in place of a split the name gives, as load_spec takes it."""
    at_a_path = local_path(spec)
    if at_a_path is not None:
        path, in_path = at_a_path
        chosen, absolute = split or in_path, expand_home(path).resolve()
        return f"{absolute}:{chosen}" if chosen else str(absolute)
    if "+" in spec:
        return "+".join(dataset_key(part, split) for part in join_parts(spec))
    if spec.startswith("builtin"):
        head, q, query = spec.partition("?")
        return f"{head.partition(':')[0]}:{split or head.partition(':')[2] or 'test'}{q}{query}"
    head, q, query = spec.partition("?")
    name, _, in_name = head.partition(":")
    key = canonical_name(name)
    known = DATASETS.get(key)
    chosen = split or in_name or (known.default_split if known is not None else "")
    return f"{key}:{chosen}{q}{query}" if chosen else f"{key}{q}{query}"


__all__ = [
    "DataError",
    "Record",
    "dataset_key",
    "join_parts",
    "load_hf_dataset",
    "load_spec",
    "local_path",
    "shared_questions",
    "training_split",
]


def training_split(spec: str) -> str:
    """``data.train`` as read: a dataset named without a split takes its ``train`` split when it has one (a name alone
    means the test split elsewhere), each part of ``a+b`` alike: a built-in dataset (``gsm8k`` -> ``gsm8k:train``,
    ``builtin?n_steps=4`` -> ``builtin:train?n_steps=4``), a ``DatasetDict.save_to_disk`` folder and a hub dataset
    (``org/name?config=c`` -> ``org/name:train?config=c``). A folder or hub dataset without a train split is refused,
    naming its splits (a folder's test split was trained on)."""
    at_a_path = local_path(spec)
    if at_a_path is not None:
        path, in_path = at_a_path
        splits = hf_folder_splits(expand_home(path)) if in_path is None else []
        if splits and "train" not in splits:
            raise DataError(
                f"{path}: a DatasetDict folder with the splits {', '.join(splits)} and no train split; name the one "
                f"to train on as {path}:SPLIT"
            )
        return f"{spec}:train" if splits else spec
    if "+" in spec:
        return "+".join(training_split(part) for part in join_parts(spec))
    known = DATASETS.get(canonical_name(spec))
    if known is not None:
        return f"{spec}:train" if "train" in known.splits else spec
    head, q, query = spec.partition("?")
    takes_train = head == "builtin" or reads_from_the_hub(head)  # (the built-in task always has a train split)
    return f"{head}:train{q}{query}" if ":" not in head and takes_train else spec
