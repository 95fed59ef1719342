"""Mutation tests of dgrpo.data.tables: each test kills mutants that the data tests let live (a CSV table's cell
counts and read errors, a dataset folder's split listing, the split a DatasetDict means, float32 columns, the
datasets progress bars), with stand-ins for the optional ``datasets`` package's objects."""

import types
from pathlib import Path

import pytest

from dgrpo.data.records import DataError
from dgrpo.data.tables import (
    dataset_rows,
    hf_folder_splits,
    progress_bars_held,
    read_csv_lines,
    split_rows,
    unnamed_split,
)


def test_a_csv_table_counts_each_rows_own_cells(tmp_path: Path) -> None:
    """CsvTable.cells: the cells each row has (a short row's count names the columns it lacks), not the header's."""
    path = tmp_path / "rows.csv"
    path.write_text("question,answer,n\nq?\nq?,1,2\nq?,1\n", "utf-8")
    table = read_csv_lines(path)
    assert table.cells == [1, 3, 2] and table.lines == [2, 3, 4] and table.header == ["question", "answer", "n"]
    assert table.rows[0] == {"question": "q?", "answer": None, "n": None}


def test_a_csv_file_that_cannot_be_read_is_one_data_error(tmp_path: Path) -> None:
    """Bytes that are not UTF-8 are a DataError naming the file, the line and the byte."""
    path = tmp_path / "rows.csv"
    path.write_bytes(b"question,answer\n\xff\xfe,1\n")
    with pytest.raises(DataError, match=r"rows\.csv line 2: not valid UTF-8 \(byte 16\)"):
        read_csv_lines(path)


def test_a_folders_split_listing_keeps_its_split_names(tmp_path: Path) -> None:
    """dataset_dict.json's ``splits``: its names (a non-text entry dropped); none listed, a listing that is not an
    object, or no readable file: []."""
    listing = tmp_path / "dataset_dict.json"
    for text, splits in (
        ('{"splits": ["train", 3, "test"]}', ["train", "test"]),
        ("{}", []),
        ('{"splits": "train"}', []),
        ('["train"]', []),
        ("{not json", []),
    ):
        listing.write_text(text)
        assert hf_folder_splits(tmp_path) == splits, text
    assert hf_folder_splits(tmp_path / "none") == []


class DatasetDict(dict):
    """A DatasetDict as split_rows reads one: splits by name, each a list of rows (no features)."""


def test_the_split_a_dataset_dict_means() -> None:
    """No split named: ``test``, else its only split; several without test, or none, is a DataError; a named split
    it lacks is a DataError naming the ones it has."""
    assert unnamed_split(["train"], "d", "d:SPLIT") == "train"
    with pytest.raises(DataError, match="d: the splits train, valid and no test split; name the one to read as d:S"):
        unnamed_split(["train", "valid"], "d", "d:S")
    with pytest.raises(DataError, match="d: has no splits"):
        unnamed_split([], "d", "d:S")
    loaded = DatasetDict(train=[{"q": 1}], valid=[{"q": 2}])
    assert split_rows(loaded, "valid", "d") == [{"q": 2}]
    assert split_rows(DatasetDict(only=[{"q": 3}]), None, "d") == [{"q": 3}]
    with pytest.raises(DataError, match="d: has splits train, valid; got 'test'"):
        split_rows(loaded, "test", "d")


def test_float16_and_float32_columns_read_as_the_numbers_written_and_non_finite_values_stay() -> None:
    """A float16 column's 0.1 (stored as 0.0999755859375) reads 0.1, as a float32 one's does; inf and nan are left as
    they are."""

    class Rows(list):
        features = {"h": types.SimpleNamespace(dtype="float16"), "f": types.SimpleNamespace(dtype="float32")}

    rows = dataset_rows(Rows([{"h": 0.0999755859375, "f": float("inf")}, {"h": float("-inf"), "f": 2.299999952316284}]))
    assert rows[0] == {"h": 0.1, "f": float("inf")} and rows[1] == {"h": float("-inf"), "f": 2.3}


def fake_datasets(disabled: bool) -> types.SimpleNamespace:
    state = {"disabled": disabled}
    utils = types.SimpleNamespace(
        are_progress_bars_disabled=lambda: state["disabled"],
        disable_progress_bars=lambda: state.update(disabled=True),
        enable_progress_bars=lambda: state.update(disabled=False),
    )
    return types.SimpleNamespace(utils=utils, state=state)


def test_progress_bars_already_off_stay_off() -> None:
    """Bars off within the block; after it, as they were before: on again, or still off when they were off."""
    for before in (False, True):
        datasets = fake_datasets(before)
        with progress_bars_held(datasets):
            assert datasets.state["disabled"]
        assert datasets.state["disabled"] is before
