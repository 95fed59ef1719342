"""Mutation tests of the data package (loaders, records, tables, subsets): each test kills mutants the other tests let
live (a step split off, a gold read from the wrong ``####``, a row dropped or an error swallowed). Every record here is
made up, hand-checkable, and read from a temporary file or from memory: no real data file is needed."""

from __future__ import annotations

import json
import re
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from dgrpo.data import load_rows
from dgrpo.data.loaders import column_parser, load_dataset
from dgrpo.data.records import (
    DataError,
    Record,
    check_records,
    data_columns,
    fingerprint,
    warn_if_marker_text,
    with_columns,
)
from dgrpo.data.subsets import sample_subset
from dgrpo.data.tables import dataset_rows, split_rows, unnamed_split


def _file(tmp_path: Path, rows: list[dict[str, Any]], name: str = "rows.jsonl") -> Path:
    """``rows`` written as a JSONL file (a ``.json`` name: one JSON list)."""
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if name.endswith(".jsonl"):
        path.write_text("".join(json.dumps(row) + "\n" for row in rows), "utf-8")
    else:
        path.write_text(json.dumps(rows), "utf-8")
    return path


def _one(tmp_path: Path, row: dict[str, Any], name: str = "rows.jsonl") -> Record:
    """The one record of a file holding ``row``."""
    (record,) = load_dataset(str(_file(tmp_path, [row], name)))
    return record


# ---------------------------------------------------------------------------------------------------------
# GSM8K solutions: steps and the final answer


def test_gsm8k_steps_are_every_annotation_adjacent_ones_and_those_after_a_stray_open_mark(tmp_path: Path) -> None:
    """Two annotations with nothing between them are two steps, and a stray ``<<`` before one does not hide it."""
    solution = "a << b <<2+2=4>><<4*3=12>>12\n#### 12"
    record = _one(tmp_path, {"question": "q", "answer": solution})
    assert record.steps == ["<<2+2=4>>", "<<4*3=12>>"]
    assert record.answer == "12"


def test_gsm8k_gold_is_after_the_last_marker_and_the_solution_is_kept_as_written(tmp_path: Path) -> None:
    """The final answer follows the last ``####``; ``meta['solution']`` is the answer text verbatim (its newlines
    too), as a reward function reading it expects."""
    solution = "a ####-heading 3\n<<1+6=7>>7\n#### 7\n"
    record = _one(tmp_path, {"question": "q", "answer": solution})
    assert (record.answer, record.steps, record.meta["solution"]) == ("7", ["<<1+6=7>>"], solution)


# ---------------------------------------------------------------------------------------------------------
# SVAMP, MultiArith, PAL rows: numeric golds


@pytest.mark.parametrize(
    "row",
    [{"input": "q", "target": True}, {"Body": "b", "Question": "q", "Answer": False}],
    ids=["pal-target", "svamp-Answer"],
)
def test_a_boolean_gold_is_refused_not_read_as_text(tmp_path: Path, row: dict[str, Any]) -> None:
    """A JSON true/false gold is an error naming it (it was the gold answer 'True', which no number scores)."""
    with pytest.raises(DataError, match="must be a number, got a boolean"):
        _one(tmp_path, row)


def test_a_svamp_row_with_an_empty_body_is_its_question_alone(tmp_path: Path) -> None:
    record = _one(tmp_path, {"Body": "", "Question": "How many are 2 and 3?", "Answer": 5.0})
    assert (record.question, record.answer) == ("How many are 2 and 3?", "5")


def test_multiarith_gold_is_the_first_solution_and_no_solution_is_a_data_error(tmp_path: Path) -> None:
    assert _one(tmp_path, {"sQuestion": "q", "lSolutions": [5.0, 9.0]}).answer == "5"
    with pytest.raises(DataError, match=r"line 1: field 'lSolutions' must be a non-empty list"):
        _one(tmp_path, {"sQuestion": "q", "lSolutions": []})


# ---------------------------------------------------------------------------------------------------------
# Coconut and GSM8K-Aug rows: steps and answers


def test_a_coconut_answer_with_two_markers_is_the_text_after_the_last(tmp_path: Path) -> None:
    record = _one(tmp_path, {"question": "q", "steps": ["s"], "answer": "#### x #### 4"}, "rows.json")
    assert record.answer == "4"


def test_the_builtin_coconut_gsm8k_aug_refuses_a_gold_that_is_no_number(tmp_path: Path, monkeypatch) -> None:
    """``coconut_gsm8k_aug`` is a numeric dataset (a file of any answers, ProsQA's sentences, is read as it is)."""
    row = {"question": "q", "steps": ["<<1+1=2>>"], "answer": "Tom"}
    _file(tmp_path / "coconut" / "gsm8k_aug", [row], "gsm_test.json")
    monkeypatch.setenv("DGRPO_DATA_DIR", str(tmp_path))
    with pytest.raises(DataError, match=r"gsm_test.json line 1 \(record 1\): field 'answer' must be a number, got"):
        load_dataset("coconut_gsm8k_aug")


def test_a_cot_column_spaced_unevenly_is_one_step_per_annotation() -> None:
    """GSM8K-Aug's hub rows (``{question, cot, answer}``): steps split on any whitespace, no empty step."""
    (record,) = load_rows([{"question": "q", "cot": " <<1+1=2>>  <<2*2=4>>\t", "answer": "4"}])
    assert record.steps == ["<<1+1=2>>", "<<2*2=4>>"]


# ---------------------------------------------------------------------------------------------------------
# Files: layout, positions, meta


@pytest.mark.parametrize("name", ["rows.jsonl", "rows.json"])
def test_a_source_column_of_the_file_wins_over_the_file_s_path(tmp_path: Path, name: str) -> None:
    """``meta['source']`` is the file's path only for rows without a ``source`` column of their own."""
    path = _file(tmp_path, [{"question": "q", "answer": "1", "source": "mine"}, {"question": "r", "answer": "2"}], name)
    assert [r.meta["source"] for r in load_dataset(str(path))] == ["mine", str(path)]


def test_a_json_object_wrapping_its_records_in_data_is_read_as_that_list(tmp_path: Path) -> None:
    path = tmp_path / "wrapped.json"
    path.write_text(json.dumps({"version": 1, "data": [{"question": "q", "answer": "3"}]}), "utf-8")
    assert [(r.question, r.answer) for r in load_dataset(str(path))] == [("q", "3")]


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("q||<<1+1=2>> #### 2 #### 3", "exactly one '####'"),
        ("q||<<1+1=2>> #### 2||r", "exactly one '||'"),
        ("   ||<<1+1=2>> #### 2", "empty question before '||'"),
    ],
    ids=["two-answers", "two-separators", "no-question"],
)
def test_a_gsm8k_aug_line_of_another_shape_is_refused_naming_its_line(tmp_path: Path, line: str, says: str) -> None:
    """GSM8K-Aug text lines are ``question||steps #### answer``: a line of two answers, two separators (its text
    after the second was dropped) or no question is an error naming the line."""
    path = tmp_path / "aug.txt"
    path.write_text(f"q||<<1+1=2>> #### 2\n\n{line}\n", "utf-8")
    with pytest.raises(DataError, match=rf"aug\.txt line 3: .*{re.escape(says)}"):
        load_dataset(str(path))


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("bom.jsonl", '{"question": "q", "answer": "2"}\n'),
        ("bom.json", '[{"question": "q", "answer": "2"}]'),
        ("bom.txt", "q||<<1+1=2>> #### 2\n"),
    ],
    ids=["jsonl", "json", "aug-text"],
)
def test_a_file_saved_with_a_byte_order_mark_reads_as_without_it(tmp_path: Path, name: str, text: str) -> None:
    """A UTF-8 byte order mark (Windows editors write one) is no part of the first record: a JSON file was invalid, a
    GSM8K-Aug text file's first question began with U+FEFF."""
    path = tmp_path / name
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())
    (record,) = load_dataset(str(path))
    assert (record.question, record.answer) == ("q", "2")


@pytest.mark.parametrize(
    ("name", "lines"),
    [
        ("cr.jsonl", ['{"question": "q", "answer": "2"}', '{"question": "r", "answer": "3"}']),
        ("cr.json", ['{"question": "q", "answer": "2"}', '{"question": "r", "answer": "3"}']),
        ("cr.txt", ["q||<<1+1=2>> #### 2", "r||<<1+2=3>> #### 3"]),
    ],
    ids=["jsonl", "json-lines", "aug-text"],
)
def test_lines_ended_by_a_carriage_return_alone_are_lines(tmp_path: Path, name: str, lines: list[str]) -> None:
    """A file whose lines end in CR alone (classic Mac OS) reads as its lines (the JSON files were 'line 1: invalid
    JSON (Extra data)', the text file one line of two '||'), and a problem names its line."""
    path = tmp_path / name
    path.write_bytes("\r".join(lines).encode() + b"\r")
    assert [(r.question, r.answer) for r in load_dataset(str(path))] == [("q", "2"), ("r", "3")]
    path.write_bytes("\r".join([*lines, "{}" if name != "cr.txt" else "s"]).encode())
    with pytest.raises(DataError, match=r"line 3"):
        load_dataset(str(path))


def test_a_row_s_problem_is_named_by_its_row_number_counted_from_one() -> None:
    with pytest.raises(DataError, match=r"the rows given row 2: field 'question' is empty"):
        load_rows([{"question": "q", "answer": "1"}, {"question": " ", "answer": "2"}])


# ---------------------------------------------------------------------------------------------------------
# Mapped columns (data.question_key / answer_key / steps_key)


def _mapped(tmp_path: Path, rows: list[dict[str, Any]], steps_key: str = "", held_out: bool = False) -> list[Record]:
    """``rows``, as a JSONL file, read with the columns ``prompt_text`` and ``gold`` (and ``steps_key``) mapped."""
    columns = column_parser("prompt_text", "gold", steps_key, steps_required=not held_out)
    return load_dataset(str(_file(tmp_path, rows)), columns=columns)


def test_a_mapped_gsm8k_style_gold_is_after_its_last_marker_without_its_commas(tmp_path: Path) -> None:
    """A mapped answer column holding a GSM8K-style solution: the gold after the last ``####``, normalised; its
    ``<<...>>`` calculations are the steps; the solution itself is kept in meta."""
    solution = "#### Part 1\n<<20*2000=40000>>\n#### 40,000"
    (record,) = _mapped(tmp_path, [{"prompt_text": "q", "gold": solution}])
    assert (record.answer, record.steps, record.meta["solution"]) == ("40000", ["<<20*2000=40000>>"], solution)
    (plain,) = _mapped(tmp_path, [{"prompt_text": "q", "gold": " 1,250 "}])
    assert plain.answer == "1250"


def test_a_mapped_question_column_wins_over_known_keys_the_row_also_has(tmp_path: Path) -> None:
    """A row with the mapped columns is read by the mapping even when its other keys are a known format's (here
    {question, answer}); those keys stay in meta, but the record's own field names."""
    row = {"prompt_text": "mapped q", "gold": "7", "question": "other q", "answer": "9", "level": 2}
    (record,) = _mapped(tmp_path, [row])
    assert (record.question, record.answer) == ("mapped q", "7")
    assert record.meta["level"] == 2 and record.meta["prompt_text"] == "mapped q"
    assert not {"question", "answer", "steps"} & record.meta.keys()


def test_mapped_steps_text_drops_blank_lines_and_its_final_answer_line(tmp_path: Path) -> None:
    """A steps column of text is one step per line: whitespace-only lines and the last line when it is the answer's
    ``#### <gold>`` (written with a thousands comma here) are no steps; a Markdown heading stays."""
    steps = "#### Plan\n<<2*500=1000>>\n   \n<<1000+1000=2000>>\n#### 2,000"
    (record,) = _mapped(tmp_path, [{"prompt_text": "q", "gold": "2000", "work": steps}], steps_key="work")
    assert record.steps == ["#### Plan", "<<2*500=1000>>", "<<1000+1000=2000>>"]
    (listed,) = _mapped(tmp_path, [{"prompt_text": "q", "gold": "4", "work": ["a", " ", "#### 4"]}], "work")
    assert listed.steps == ["a"]


def test_a_steps_key_no_row_has_is_an_error_for_training_data_only(tmp_path: Path) -> None:
    rows = [{"prompt_text": "q", "gold": "1"}]
    with pytest.raises(DataError, match=r"missing field 'work' \(data.steps_key\) in every record"):
        _mapped(tmp_path, rows, steps_key="work")
    assert _mapped(tmp_path, rows, steps_key="work", held_out=True)[0].steps == []


# ---------------------------------------------------------------------------------------------------------
# Records


def test_record_steps_given_as_a_tuple_are_a_list() -> None:
    record = Record("q", ("a", "b"), "5")  # type: ignore[arg-type]
    assert type(record.steps) is list and record.steps == ["a", "b"]


def test_data_columns_keep_their_first_order_and_a_record_lacking_one_gets_none() -> None:
    records = [Record("q", [], "1", {"b": 1}), Record("r", [], "2", {"a": 2, "b": 3})]
    assert data_columns(records) == ("b", "a")
    assert [r.meta for r in with_columns(records)] == [{"b": 1, "a": None}, {"a": 2, "b": 3}]
    assert records[0].meta == {"b": 1}  # (the records given are not changed)


def test_the_fingerprint_tells_steps_split_differently_and_steps_changed() -> None:
    one = [Record("q", ["ab", "c"], "1")]
    assert fingerprint(one) != fingerprint([Record("q", ["a", "bc"], "1")])
    assert fingerprint(one) != fingerprint([Record("q", ["ab", "d"], "1")])
    assert fingerprint(one) == fingerprint([Record("q", ["ab", "c"], "1", {"other": 1})])  # (meta aside)


def test_a_latent_marker_in_a_step_is_warned_about() -> None:
    with pytest.warns(UserWarning, match=r"record 0's steps: '<<1\+1=2>> <\|latent\|>'"):
        warn_if_marker_text([Record("q", ["<<1+1=2>> <|latent|>"], "2")], "data")


def test_an_empty_list_of_records_is_refused_unless_allowed() -> None:
    with pytest.raises(ValueError, match="must be a non-empty list of dgrpo Records, got a list of 0"):
        check_records([], "data.train")
    check_records([], "data.train", empty=True)


# ---------------------------------------------------------------------------------------------------------
# Tables and splits


def test_a_csv_file_saved_with_a_byte_order_mark_has_its_first_column_named_plainly(tmp_path: Path) -> None:
    path = tmp_path / "bom.csv"
    path.write_bytes(b"\xef\xbb\xbfquestion,answer\r\nq,3\r\n")
    assert [(r.question, r.answer) for r in load_dataset(str(path))] == [("q", "3")]


def test_a_csv_file_s_problem_names_the_line_its_row_starts_on(tmp_path: Path) -> None:
    """Lines count from the header (line 1), across blank lines and a quoted value spanning two lines."""
    path = tmp_path / "rows.csv"
    path.write_text('question,answer\n"two\nlines",1\n\n ,2\n', "utf-8")
    with pytest.raises(DataError, match=r"rows\.csv line 5: field 'question' is empty"):
        load_dataset(str(path))


def test_a_csv_row_longer_than_its_header_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "rows.csv"
    path.write_text("question,answer\nq,1,000\n", "utf-8")
    with pytest.raises(DataError, match=r"line 2: 3 cells, more than the header's 2 columns"):
        load_dataset(str(path))


def test_a_dataset_of_several_splits_means_its_test_split_and_a_dataset_of_one_takes_no_split_name() -> None:
    assert unnamed_split(["train", "test", "validation"], "d", "d:SPLIT") == "test"
    one_split = types.SimpleNamespace(features={})  # (a Dataset: it has features, and no splits)
    with pytest.raises(DataError, match="is one split"):
        split_rows(one_split, "train", "d")


def test_a_float32_column_reads_as_the_number_written_and_a_float64_one_as_it_is() -> None:
    """Arrow hands a float32 2.3 over as 2.299999952316284: read as 2.3; a float64 column is not rounded."""

    class Rows(list):  # (a datasets.Dataset as dataset_rows reads one: its rows, and features with dtypes)
        features = {"f32": types.SimpleNamespace(dtype="float32"), "f64": types.SimpleNamespace(dtype="float64")}

    rows = dataset_rows(Rows([{"f32": 2.299999952316284, "f64": 2.299999952316284}]))
    assert rows == [{"f32": 2.3, "f64": 2.299999952316284}]


# ---------------------------------------------------------------------------------------------------------
# The OpenMathInstruct-2 subset


def test_the_subset_draw_gives_every_eligible_row_its_chance() -> None:
    """Reservoir sampling keeps each of k eligible rows with probability n/k: one of two rows, over 20 seeds, is
    sometimes the first and sometimes the second (a draw biased to the latest row kept the second every time)."""
    rows = [{"problem": p, "expected_answer": "1", "problem_source": "gsm8k"} for p in ("a", "b")]
    picked = {sample_subset(rows, n=1, seed=seed)[0]["problem"] for seed in range(20)}
    assert picked == {"a", "b"}


def test_openmathinstruct2_named_without_a_split_reads_its_train_split(monkeypatch: pytest.MonkeyPatch) -> None:
    """OpenMathInstruct-2 has no test split: its name alone reads ``train`` (a hub made up here, no network)."""
    from dgrpo.data import loaders

    calls: list[tuple[str, str | None, str | None]] = []

    def hub_load(repo: str, config: str | None = None, split: str | None = None) -> list[dict[str, Any]]:
        calls.append((repo, config, split))
        return [{"problem": "1+1?", "expected_answer": "2", "problem_source": "gsm8k"}]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=hub_load))
    monkeypatch.setattr(loaders, "hub_reachable", lambda: True)
    (record,) = load_dataset("OpenMathInstruct-2")
    assert calls == [("nvidia/OpenMathInstruct-2", None, "train")]
    assert (record.question, record.answer, record.meta["source"]) == ("1+1?", "2", "hf:nvidia/OpenMathInstruct-2")


def test_a_data_file_s_extension_is_read_in_any_case(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``ROWS.CSV`` is a CSV file, and a missing ``MISSING.CSV`` a missing file, not a hub dataset's name."""
    from dgrpo.data import loaders

    monkeypatch.setattr(loaders, "hub_reachable", lambda: False)
    path = tmp_path / "ROWS.CSV"
    path.write_text("question,answer\nq,3\n", "utf-8")
    assert [(r.question, r.answer) for r in load_dataset(str(path))] == [("q", "3")]
    monkeypatch.chdir(tmp_path)  # (a relative name: one starting with / is a path whatever its extension)
    with pytest.raises(DataError, match="MISSING.CSV: file not found"):
        load_dataset("MISSING.CSV")


def test_a_question_is_read_without_its_surrounding_spaces_and_a_cot_gold_without_its_commas() -> None:
    (plain,) = load_rows([{"question": "  How many?\n", "answer": " 3 "}])
    (aug,) = load_rows([{"question": " q ", "cot": "<<1000*2=2000>>", "answer": "2,000"}])
    assert (plain.question, plain.answer, aug.question, aug.answer) == ("How many?", "3", "q", "2000")


@pytest.mark.parametrize("row", [{"input": "q", "target": 1e23}, {"question": "q", "answer": 1e23}], ids=["pal", "qa"])
def test_a_whole_json_number_beyond_float_precision_is_the_number_written(tmp_path: Path, row: dict[str, Any]) -> None:
    """A JSON gold ``1e23`` is 100000000000000000000000, as the text "1e23" and ``Record(answer=1e23)`` are: it was
    the float's binary value, 99999999999999991611392, against which ``#### 100000000000000000000000`` scored 0."""
    assert _one(tmp_path, row).answer == "100000000000000000000000" == Record("q", [], 1e23).answer  # type: ignore[arg-type]


def test_a_json_file_written_as_json_lines_reads_as_them(tmp_path: Path) -> None:
    """``datasets.Dataset.to_json('train.json')`` writes one object per line (JSON Lines) under a ``.json`` name: its
    records are read, and a problem names its line (it was 'line 2: invalid JSON (Extra data, column 1)')."""
    path = tmp_path / "train.json"
    path.write_text('{"question": "q", "answer": "1"}\n{"question": "r", "answer": "2"}\n', "utf-8")
    assert [(r.question, r.answer) for r in load_dataset(str(path))] == [("q", "1"), ("r", "2")]
    path.write_text('{"question": "q", "answer": "1"}\n{"question": "r"}\n', "utf-8")
    with pytest.raises(DataError, match=r"train\.json line 2: missing field 'answer'"):
        load_dataset(str(path))
    pretty = tmp_path / "pretty.json"  # (a pretty-printed object is one JSON value: its 'data' list, as before)
    pretty.write_text('{\n  "data": [{"question": "q", "answer": "1"}]\n}\n', "utf-8")
    assert [r.answer for r in load_dataset(str(pretty))] == ["1"]


def test_a_jsonl_file_whose_first_line_is_a_list_names_that_line(tmp_path: Path) -> None:
    """A ``.jsonl`` whose first line is a JSON list was read as one JSON list: 'line 2: invalid JSON (Extra data)'
    about a good line; it names line 1 now. A ``.jsonl`` holding one list (on one line, or pretty-printed) is still
    read as that list."""
    path = tmp_path / "rows.jsonl"
    path.write_text('[1, 2]\n{"question": "q", "answer": "1"}\n', "utf-8")
    with pytest.raises(DataError, match=r"rows\.jsonl line 1: expected a JSON object, got list"):
        load_dataset(str(path))
    for text in ('[{"question": "q", "answer": "1"}]\n', '[\n {"question": "q", "answer": "1"}\n]\n'):
        path.write_text(text, "utf-8")
        assert [r.answer for r in load_dataset(str(path))] == ["1"]


def test_a_csv_file_with_blank_lines_above_its_header_reads_from_the_header(tmp_path: Path) -> None:
    """Its header is the first line that is not blank (as pandas reads it; it was 'no header line'), and a row's
    line is still its line in the file."""
    path = tmp_path / "rows.csv"
    path.write_text("\n\nquestion,answer\nq,3\n", "utf-8")
    assert [(r.question, r.answer) for r in load_dataset(str(path))] == [("q", "3")]
    path.write_text("\n\nquestion,answer\nq,3\n ,4\n", "utf-8")
    with pytest.raises(DataError, match=r"rows\.csv line 5: field 'question' is empty"):
        load_dataset(str(path))
    path.write_text("\n\n", "utf-8")
    with pytest.raises(DataError, match=r"the file is empty \(blank lines only\)"):
        load_dataset(str(path))


# ---------------------------------------------------------------------------------------------------------
# What the real-file tests (tests/test_loaders.py, skipped without the data folder) check, on made-up rows


def test_format_rows_read_without_the_data_folder(tmp_path: Path) -> None:
    """SVAMP's question is ``Body + " " + Question``; PAL keeps its ``code``; Coconut's blank steps are dropped;
    GSM8K-Aug text steps split on any whitespace."""
    svamp = _one(tmp_path, {"Body": "2 cats.", "Question": "Legs?", "Answer": 8.0, "Type": "x"}, "rows.json")
    assert (svamp.question, svamp.answer, svamp.meta["Type"]) == ("2 cats. Legs?", "8", "x")
    assert _one(tmp_path, {"input": "q", "code": "x = 1", "target": 1.5}).meta["code"] == "x = 1"
    assert _one(tmp_path, {"question": "q", "steps": ["", "a", " "], "answer": "2"}, "rows.json").steps == ["a"]
    path = tmp_path / "aug.txt"
    path.write_text("q||<<1+1=2>>  <<2*2=4>>\t#### 4\n", "utf-8")
    assert load_dataset(str(path))[0].steps == ["<<1+1=2>>", "<<2*2=4>>"]


def test_a_builtin_name_in_any_case_reads_its_test_split_by_default(tmp_path: Path, monkeypatch) -> None:
    for split in ("train", "test"):
        _file(tmp_path / "gsm8k", [{"question": split, "answer": "#### 1"}], f"{split}.jsonl")
    monkeypatch.setenv("DGRPO_DATA_DIR", str(tmp_path))
    assert [r.question for r in load_dataset("GSM8K")] == ["test"]
    assert [r.question for r in load_dataset("gsm8k", "train")] == ["train"]
