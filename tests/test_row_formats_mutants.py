"""Mutation tests of dgrpo.data.row_formats and dgrpo.data.tables: each test kills a change of the source that the data
tests let live (a numeric gold of another type read wrong, a format's fields lost from ``meta`` or leaked into it, a
row of another format read silently, a row of empty cells dropped, a repeated column not warned of). Every row is
made up here."""

from __future__ import annotations

import json
import math
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from dgrpo.data import load_rows
from dgrpo.data.loaders import column_parser, load_dataset
from dgrpo.data.records import DataError
from dgrpo.data.tables import is_hf_folder, read_csv_lines, split_rows


def _meta(row: dict[str, Any]) -> dict[str, Any]:
    """The ``meta`` of the one record of ``row`` read in memory, without the ``source`` the loader adds."""
    (record,) = load_rows([row])
    return {k: v for k, v in record.meta.items() if k != "source"}


# ---------------------------------------------------------------------------------------------------------
# Golds of other types: NumPy scalars, decimals, non-finite numbers


def test_numpy_float32_and_decimal_golds_are_the_numbers_written() -> None:
    """``np.float32(2.3)`` is the gold ``2.3`` (not 2.299999952316284); a decimal's trailing zeros go (``8.50`` is
    ``8.5``, ``8.0`` is ``8``), as a completion's ``#### 8.5`` is read."""
    np = pytest.importorskip("numpy")
    assert load_rows([{"question": "q", "answer": np.float32(2.3)}])[0].answer == "2.3"
    assert [r.answer for r in load_rows([{"input": "q", "target": Decimal("8.50")}])] == ["8.5"]
    assert [r.answer for r in load_rows([{"input": "q", "target": Decimal("8.0")}])] == ["8"]


@pytest.mark.parametrize("gold", [float("nan"), float("inf"), Decimal("NaN"), Decimal("-Infinity")])
def test_a_non_finite_gold_is_refused_naming_its_row(gold: Any) -> None:
    """A NaN or infinite gold (JSON's ``NaN``, a decimal column's) is a DataError naming the row, not a crash or the
    gold ``NaN`` that nothing scores."""
    with pytest.raises(DataError, match=r"row 1: field 'target' must be a finite number"):
        load_rows([{"input": "q", "target": gold}])


def test_a_numpy_boolean_gold_is_refused_not_read_as_one() -> None:
    """``np.True_`` is no number: a DataError, not the gold ``1``."""
    np = pytest.importorskip("numpy")
    with pytest.raises(DataError, match="row 1: field 'answer' must be a string, got bool"):
        load_rows([{"question": "q", "answer": np.bool_(True)}])


def test_a_plain_text_gold_is_its_normalised_number() -> None:
    """A ``{question, answer}`` row's gold ``"1,000"`` (no ``####``) is ``1000``; text that is no number stays."""
    assert [r.answer for r in load_rows([{"question": "q", "answer": "1,000"}, {"question": "r", "answer": "x"}])] == [
        "1000",
        "x",
    ]


def test_a_null_question_is_named_as_empty() -> None:
    """A JSON null question says it is empty (null), not that it must be a string."""
    with pytest.raises(DataError, match=r"row 1: field 'question' is empty \(null\)"):
        load_rows([{"question": None, "answer": "1"}])


def test_a_coconut_gold_of_a_marker_and_nothing_after_it_is_refused() -> None:
    """``"#### "`` has no gold after its marker: a DataError, not the empty gold."""
    with pytest.raises(DataError, match=r"row 1: field 'answer' is empty after its '####'"):
        load_rows([{"question": "q", "steps": [], "answer": "#### "}])


# ---------------------------------------------------------------------------------------------------------
# Each format's meta: the fields it does not read, and none it does


@pytest.mark.parametrize(
    ("row", "meta"),
    [
        ({"question": "q", "answer": "a <<1+1=2>>\n#### 2", "id": 4}, {"id": 4, "solution": "a <<1+1=2>>\n#### 2"}),
        ({"question": "q", "answer": "#### 2", "solution": "mine"}, {"solution": "mine"}),
        ({"question": "q", "steps": ["s"], "answer": "2", "id": 4}, {"id": 4}),
        ({"question": "q", "cot": "<<1+1=2>>", "answer": "2", "id": 4}, {"id": 4}),
        (
            {"ID": "c-1", "Body": "b.", "Question": "q?", "Answer": 2, "Equation": "1+1", "Type": "Add"},
            {"ID": "c-1", "Equation": "1+1", "Type": "Add"},
        ),
        (
            {"iIndex": 7, "sQuestion": "q", "lSolutions": [2.0], "lEquations": ["x=1+1"]},
            {"iIndex": 7, "lEquations": ["x=1+1"]},
        ),
        ({"input": "q", "target": 2}, {}),
        ({"input": "q", "target": 2, "code": "x = 2"}, {"code": "x = 2"}),
        (
            {"problem": "q", "expected_answer": "2", "problem_source": "gsm8k", "generated_solution": "s"},
            {"problem_source": "gsm8k", "generated_solution": "s"},
        ),
    ],
    ids=["gsm8k", "gsm8k-own-solution", "coconut", "gsm8k-aug", "svamp", "multiarith", "pal", "pal-code", "openmath"],
)
def test_each_format_keeps_its_other_fields_in_meta_and_not_those_it_reads(
    row: dict[str, Any], meta: dict[str, Any]
) -> None:
    """The fields a format reads (question, answer, steps, cot) are not in ``meta`` (a scorer would get them twice);
    the documented others are (SVAMP's ID, MultiArith's index, PAL's code, OpenMath's source); a GSM8K row's own
    ``solution`` column wins over its answer text."""
    assert _meta(row) == meta


# ---------------------------------------------------------------------------------------------------------
# One format per file: a later row of a more specific format is refused, not read as the first row's


@pytest.mark.parametrize(
    ("extra", "mine"),
    [
        ({"steps": ["a"]}, r"Coconut \{question, steps, answer\}"),
        ({"input": "q", "target": 1}, r"PAL \{input, target\}"),
    ],
)
def test_a_row_of_a_more_specific_format_among_plain_rows_is_refused(extra: dict[str, Any], mine: str) -> None:
    """Among ``{question, answer}`` rows, one that also has ``steps`` (or PAL's keys) would lose them to meta unseen:
    a DataError naming the row and both formats."""
    rows = [{"question": "q", "answer": "1"}, {"question": "r", "answer": "2", **extra}]
    with pytest.raises(DataError, match=rf"row 2: a {mine} row among \{{question, answer\}} rows"):
        load_rows(rows)


def test_the_plain_question_answer_format_is_the_last_one_tried() -> None:
    """A row that has ``question`` and ``answer`` besides another format's keys is read as that format (MultiArith's
    ``final_ans`` is its gold here, ``answer`` a field of meta)."""
    (record,) = load_rows([{"question": "q", "final_ans": "3", "answer": "9"}])
    assert record.answer == "3"


def test_unrecognised_keys_are_listed_sorted() -> None:
    """The message lists a row's keys sorted, whatever their order in the row."""
    with pytest.raises(DataError, match=r"unrecognised record keys \(a, b, c\)"):
        load_rows([{"c": 1, "a": 2, "b": 3}])


# ---------------------------------------------------------------------------------------------------------
# CSV files: list cells, rows of empty cells, one-column files, repeated columns


def test_a_coconut_csv_files_steps_cells_written_from_lists_are_its_steps(tmp_path: Path) -> None:
    """A ``question,steps,answer`` CSV written from lists (pandas' repr, or JSON) reads each cell as its steps; a cell
    holding a list that is not all text is a DataError naming its line."""
    path = tmp_path / "rows.csv"
    path.write_text('question,steps,answer\nq,"[\'a\', \'b\']",2\nr,"[""c""]",3\n', "utf-8")
    assert [r.steps for r in load_dataset(str(path))] == [["a", "b"], ["c"]]
    path.write_text('question,steps,answer\nq,"[""a"", 1]",2\n', "utf-8")
    with pytest.raises(DataError, match=r"rows\.csv line 2: field 'steps' must be a list of strings, got one string"):
        load_dataset(str(path))


def test_a_csv_row_of_empty_cells_is_a_row(tmp_path: Path) -> None:
    """A line of commas alone is a row (as csv.DictReader reads it), whose empty question is named; only a blank
    line is skipped (the row was dropped without a word)."""
    path = tmp_path / "rows.csv"
    path.write_text("question,answer\nq,1\n,\n", "utf-8")
    assert read_csv_lines(path).lines == [2, 3]
    with pytest.raises(DataError, match=r"rows\.csv line 3: field 'question' is empty"):
        load_dataset(str(path))


def test_a_csv_file_of_another_separator_is_named_as_such(tmp_path: Path) -> None:
    """A semicolon-separated file reads as one column: a mapped column's message asks whether the file is
    comma-separated."""
    path = tmp_path / "rows.csv"
    path.write_text("question;answer\nq;1\n", "utf-8")
    with pytest.raises(
        DataError, match=r"missing field 'question' \(data.question_key\); .* \(one column: is the file "
    ):
        load_dataset(str(path), columns=column_parser("question", "answer"))


def test_a_column_named_twice_is_warned_of_and_unnamed_columns_are_not(tmp_path: Path) -> None:
    """A header naming ``answer`` twice warns (the later value is read); a spreadsheet's several empty column names do
    not."""
    path = tmp_path / "rows.csv"
    path.write_text("question,answer,answer\nq,1,2\n", "utf-8")
    with pytest.warns(UserWarning, match="names the column 'answer' twice; each row's later value is read"):
        table = read_csv_lines(path)
    assert table.rows == [{"question": "q", "answer": "2"}]
    path.write_text("question,answer,,\nq,1,,\n", "utf-8")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert read_csv_lines(path).header == ["question", "answer", "", ""]


# ---------------------------------------------------------------------------------------------------------
# Dataset folders


@pytest.mark.parametrize("marker", ["dataset_info.json", "dataset_dict.json", "state.json"])
def test_a_dataset_folder_is_known_by_any_one_of_its_marker_files(tmp_path: Path, marker: str) -> None:
    """A ``save_to_disk`` folder has some of the marker files (a DatasetDict's only dataset_dict.json): any one of
    them makes a folder a dataset folder; a folder without them, or a file of that name, is none."""
    folder = tmp_path / "saved"
    folder.mkdir()
    assert not is_hf_folder(folder)
    (folder / marker).write_text("{}")
    assert is_hf_folder(folder)
    assert not is_hf_folder(folder / marker)


def test_a_dataset_dict_without_a_test_split_is_told_how_to_name_one() -> None:
    """The message names a split as its caller writes one (``split=NAME`` for a DatasetDict given in memory)."""
    with pytest.raises(DataError, match="name the one to read as split=NAME"):
        split_rows({"train": [], "valid": []}, None, "the DatasetDict given", "split=NAME")


def test_json_nan_in_a_file_is_refused(tmp_path: Path) -> None:
    """A JSON Lines gold written ``NaN`` (Python's json writes and reads it) is a DataError naming its line."""
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"input": "q", "target": math.nan}) + "\n", "utf-8")
    with pytest.raises(DataError, match=r"rows\.jsonl line 1: field 'target' must be a finite number, got nan"):
        load_dataset(str(path))


@pytest.mark.parametrize(
    ("row", "gold"),
    [
        ({"input": "q", "target": "int64:5"}, "5"),
        ({"Body": "b.", "Question": "q?", "Answer": "float32:2.3"}, "2.3"),
        ({"sQuestion": "q", "lSolutions": ["int64:7"]}, "7"),
        ({"question": "q", "final_ans": "int32:3"}, "3"),
    ],
    ids=["pal", "svamp", "multiarith", "multiarith-hub"],
)
def test_numpy_golds_are_read_in_every_numeric_format(row: dict[str, Any], gold: str) -> None:
    """A NumPy integer or float gold (rows built in memory, a dataset formatted as NumPy) is the number written, in
    PAL's, SVAMP's and MultiArith's formats as in ``{question, answer}`` rows: they were 'must be a number, got
    int64'."""
    np = pytest.importorskip("numpy")

    def numpy(value: Any) -> Any:
        if isinstance(value, list):
            return [numpy(v) for v in value]
        if isinstance(value, str) and ":" in value:
            kind, number = value.split(":")
            return getattr(np, kind)(number)
        return value

    (record,) = load_rows([{k: numpy(v) for k, v in row.items()}])
    assert record.answer == gold
    with pytest.raises(DataError, match="must be a number, got bool"):
        load_rows([{"input": "q", "target": np.bool_(True)}])


@pytest.mark.parametrize(
    ("answer", "gold"), [(18, "18"), (2.5, "2.5"), (1e23, "100000000000000000000000"), ("\\frac{1}{2}", "\\frac{1}{2}")]
)
def test_an_openmath_expected_answer_may_be_a_number(answer: Any, gold: str) -> None:
    """OpenMathInstruct-2's ``expected_answer`` as a number (a parquet file of one's own with an int column) is read
    as every other format reads a numeric gold; it was 'must be a string, got int'. LaTeX text stays as written."""
    (record,) = load_rows([{"problem": "q", "expected_answer": answer}])
    assert record.answer == gold
    with pytest.raises(DataError, match="field 'expected_answer' must be a string, got bool"):
        load_rows([{"problem": "q", "expected_answer": True}])


def test_a_gsm8k_aug_cot_that_is_no_text_is_named() -> None:
    """A ``cot`` given as a list is a DataError naming the row (it was an AttributeError)."""
    with pytest.raises(DataError, match="row 1: field 'cot' must be a string, got list"):
        load_rows([{"question": "q", "cot": ["<<1+1=2>>"], "answer": "2"}])


def test_a_coconut_gsm8k_style_answer_is_kept_as_its_solution() -> None:
    """A Coconut row whose answer is a GSM8K solution has its gold after ``####`` and the solution in meta."""
    (record,) = load_rows([{"question": "q", "steps": ["s"], "answer": "so 4\n#### 4"}])
    assert (record.answer, record.meta["solution"]) == ("4", "so 4\n#### 4")


def test_a_file_whose_first_record_is_no_object_is_named(tmp_path: Path) -> None:
    """A first JSON line holding a number, a JSON list's first element holding a list (the format is detected from
    the first record): a DataError naming it."""
    path = tmp_path / "rows.jsonl"
    path.write_text('3\n{"question": "q", "answer": "1"}\n', "utf-8")
    with pytest.raises(DataError, match=r"rows\.jsonl line 1: expected a JSON object, got int"):
        load_dataset(str(path))
    path = tmp_path / "rows.json"
    path.write_text('[[1, 2], {"question": "q", "answer": "1"}]', "utf-8")
    with pytest.raises(DataError, match=r"rows\.json line 1 \(record 1\): expected a JSON object, got list"):
        load_dataset(str(path))


def test_a_csv_file_s_first_row_after_blank_lines_and_its_header_is_named_by_its_line(tmp_path: Path) -> None:
    """Two blank lines, the header on line 3: the first row is line 4."""
    path = tmp_path / "rows.csv"
    path.write_text("\n\nquestion,answer\n ,1\n", "utf-8")
    assert read_csv_lines(path).lines == [4]
    with pytest.raises(DataError, match=r"rows\.csv line 4: field 'question' is empty"):
        load_dataset(str(path))
