"""Mutation tests of the data loaders, second pass: each test kills a mutant of ``dgrpo.data`` (loaders, records,
subsets) that the other tests let live: a gold left with its commas, a mapped file's standard rows refused, a record
boundary the fingerprint does not see, a subset that ignores its seed. Every row is made up and hand-checkable."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dgrpo.data import load_rows
from dgrpo.data.loaders import column_parser, load_dataset
from dgrpo.data.records import DataError, Record, fingerprint, shared_questions, with_columns


def _jsonl(tmp_path: Path, rows: list[dict[str, Any]], name: str = "rows.jsonl") -> Path:
    """``rows`` written as a JSONL file under ``tmp_path``."""
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), "utf-8")
    return path


# ---------------------------------------------------------------------------------------------------------
# Answers: a gold given as number text is normalised in every row format


@pytest.mark.parametrize(
    "row",
    [
        {"input": "q", "target": "1,000"},  # PAL / GSM-Hard
        {"Body": "b", "Question": "q", "Answer": "1,000"},  # SVAMP
        {"question": "q", "final_ans": "1,000"},  # MultiArith on the hub
        {"problem": "q", "expected_answer": "1,000"},  # OpenMathInstruct-2
    ],
)
def test_a_gold_given_as_number_text_is_its_normalised_number(row: dict[str, Any]) -> None:
    """A gold written ``"1,000"`` is ``"1000"`` (as a completion's ``#### 1000`` is read): kept as written, no
    answer scored right."""
    (record,) = load_rows([row])
    assert record.answer == "1000"


def test_a_numpy_integer_gold_beyond_float_precision_keeps_every_digit() -> None:
    """``np.int64(2**53 + 1)`` is the gold ``9007199254740993``, not the float it rounds to (…992)."""
    np = pytest.importorskip("numpy")
    (record,) = load_rows([{"question": "q", "answer": np.int64(2**53 + 1)}])
    assert record.answer == "9007199254740993"


# ---------------------------------------------------------------------------------------------------------
# A column mapping


def test_a_mapped_file_reads_its_rows_of_a_known_format_as_that_format(tmp_path: Path) -> None:
    """A row without the mapped question column whose keys are GSM8K's is read as GSM8K's (gold after ``####``,
    its ``<<...>>`` steps), beside the mapped rows of the same file."""
    rows = [{"prompt": "p", "gold": "2"}, {"question": "q", "answer": "x <<1+1=2>> y\n#### 2"}]
    mapped, known = load_dataset(str(_jsonl(tmp_path, rows)), columns=column_parser("prompt", "gold"))
    assert (mapped.question, mapped.answer, mapped.steps) == ("p", "2", [])
    assert (known.question, known.answer, known.steps) == ("q", "2", ["<<1+1=2>>"])


def test_a_mapped_question_is_read_without_its_surrounding_spaces(tmp_path: Path) -> None:
    """The mapped question column is stripped, as every format's question is (a prompt then ends in one space)."""
    (record,) = load_dataset(str(_jsonl(tmp_path, [{"p": "  q?\n", "g": 1}])), columns=column_parser("p", "g"))
    assert record.question == "q?"


def test_mapped_steps_text_keeps_a_heading_that_is_not_the_answer_line(tmp_path: Path) -> None:
    """Only an end line ``#### <the answer>`` leaves a steps text: a Markdown heading ``#### Check`` and the lines
    after it stay steps."""
    row = {"p": "q", "g": "5", "s": "a=2\n#### Check\nb=5"}
    (record,) = load_dataset(str(_jsonl(tmp_path, [row])), columns=column_parser("p", "g", "s"))
    assert record.steps == ["a=2", "#### Check", "b=5"]


def test_a_null_steps_cell_is_no_steps() -> None:
    """A steps cell of None (parquet and hub datasets hold None where JSONL omits the key) is a record without
    steps, not an error."""
    record = column_parser("p", "g", "s")({"p": "q", "g": "1", "s": None})
    assert record.steps == []


def test_a_steps_key_is_checked_per_file_not_over_every_file_the_mapping_read(tmp_path: Path) -> None:
    """One mapping read twice: the second file, none of whose rows has the steps column, is a DataError even though
    the first file had it."""
    columns = column_parser("p", "g", "s")
    with_steps = _jsonl(tmp_path, [{"p": "q", "g": "1", "s": ["a"]}], "a.jsonl")
    without = _jsonl(tmp_path, [{"p": "q", "g": "1"}], "b.jsonl")
    assert load_dataset(str(with_steps), columns=columns)[0].steps == ["a"]
    with pytest.raises(DataError, match=r"b\.jsonl: missing field 's' \(data\.steps_key\) in every record"):
        load_dataset(str(without), columns=columns)


# ---------------------------------------------------------------------------------------------------------
# Built-in names: the data folder


def test_a_data_folder_holding_only_one_dataset_is_found_in_the_working_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``./data`` with ``svamp/`` alone (no ``gsm8k/``) is the data folder: SVAMP is read from it, not the hub."""
    folder = tmp_path / "data" / "svamp"
    folder.mkdir(parents=True)
    (folder / "SVAMP.json").write_text(json.dumps([{"Body": "b.", "Question": "q?", "Answer": 3.0}]), "utf-8")
    monkeypatch.delenv("DGRPO_DATA_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    (record,) = load_dataset("svamp")
    assert (record.question, record.answer) == ("b. q?", "3")


# ---------------------------------------------------------------------------------------------------------
# Records: fingerprint, shared questions, to_dict, with_columns


def test_the_fingerprint_tells_where_one_record_ends_and_the_next_begins() -> None:
    """The same texts in the same order, cut into records differently, are other data: (q,[s],a),(b,c),(d,e) is
    not (q,s),(a,[b],c),(d,e)."""
    one = [Record("q", ["s"], "a"), Record("b", [], "c"), Record("d", [], "e")]
    other = [Record("q", [], "s"), Record("a", ["b"], "c"), Record("d", [], "e")]
    assert fingerprint(one) != fingerprint(other)
    assert fingerprint(one) == fingerprint([Record("q", ["s"], "a"), Record("b", [], "c"), Record("d", [], "e")])


def test_shared_questions_match_spacing_aside_and_count_the_same_answers_apart() -> None:
    """A held-out question that is a training one spaced differently is shared; only those with the training
    answer count as answered."""
    train = [Record("How many  apples?", [], "3"), Record("Why?", [], "4")]
    held_out = [Record(" How many apples?\n", [], "3"), Record("Why?", [], "5"), Record("New?", [], "1")]
    assert shared_questions(train, held_out) == (2, 1)


def test_a_record_as_a_dict_has_meta_only_when_it_holds_something() -> None:
    assert Record("q", ["s"], "1").to_dict() == {"question": "q", "steps": ["s"], "answer": "1"}
    assert Record("q", [], "1", {"id": 7}).to_dict()["meta"] == {"id": 7}


def test_with_columns_adds_the_columns_named_beside_the_records_own() -> None:
    """The columns given (the whole data's, for a shard) are in every record's meta, None where it has none."""
    (record,) = with_columns([Record("q", [], "1", {"id": 1})], ("difficulty",))
    assert record.meta == {"difficulty": None, "id": 1}


def test_the_fingerprint_begins_with_the_record_count() -> None:
    """``"<count>:<digest>"``: a resumed run's message can say how many records each side had."""
    assert fingerprint([Record("q", [], "1"), Record("r", [], "2")]).startswith("2:")


# ---------------------------------------------------------------------------------------------------------
# The OpenMathInstruct-2 subset: the paper's size and seed


def test_the_subset_is_the_paper_s_size_drawn_with_seed_0_by_default() -> None:
    """The stated rule: 69,981 items, seed 0; the defaults are that rule (a draw of 2 of 6 rows, say)."""
    from dgrpo.data.subsets import PAPER_SUBSET_SIZE, sample_subset

    rows = [{"problem": f"p{i}", "expected_answer": str(i), "problem_source": "gsm8k"} for i in range(6)]
    assert PAPER_SUBSET_SIZE == 69_981
    assert [sample_subset(rows, 2) for _ in range(2)] == [sample_subset(rows, 2, seed=0)] * 2
    assert any(sample_subset(rows, 2, seed=s) != sample_subset(rows, 2) for s in range(1, 6))


# ---------------------------------------------------------------------------------------------------------
# Specs: a split given wins over one in the name; '+' and '?config=' are checked; every record every column


def _gsm8k_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A data folder whose GSM8K splits hold one question each, named after the split."""
    for split in ("train", "test"):
        _jsonl(tmp_path / "gsm8k", [{"question": split, "answer": "#### 1"}], f"{split}.jsonl")
    monkeypatch.setenv("DGRPO_DATA_DIR", str(tmp_path))


def test_a_split_given_wins_over_the_split_a_spec_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``load_spec("gsm8k:test", split="train")`` reads train (as documented), and so does the key it is known by;
    a file's ``PATH:SPLIT`` likewise refuses the split given."""
    from dgrpo.data import dataset_key, load_spec

    _gsm8k_folder(tmp_path, monkeypatch)
    assert [r.question for r in load_spec("gsm8k:test", split="train")] == ["train"]
    assert dataset_key("builtin:test", split="train") == "builtin:train"
    path = _jsonl(tmp_path, [{"question": "q", "answer": "1"}])
    assert dataset_key(f"{path}:a", split="b") == f"{path.resolve()}:b"
    with pytest.raises(DataError, match=r"split='b': .* is a file"):
        load_spec(f"{path}:a", split="b")


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("gsm8k+", "an empty part between '\\+' signs"),
        ("org/name?config=", r"takes one option, \?config=NAME"),
        ("org/name?config=a&b=c", r"takes one option, \?config=NAME"),
    ],
)
def test_a_spec_with_an_empty_part_or_a_malformed_config_is_refused(spec: str, says: str) -> None:
    """Refused with its own reason before any file or hub is read (an empty config went to the hub as '')."""
    from dgrpo.data import load_spec

    with pytest.raises(DataError, match=says):
        load_spec(spec)


def test_every_record_of_a_spec_has_every_column_of_the_data(tmp_path: Path) -> None:
    """A column only some rows have is in every record's meta, None where the row lacked it."""
    from dgrpo.data import load_spec

    path = _jsonl(tmp_path, [{"question": "q", "answer": "1", "level": 2}, {"question": "r", "answer": "2"}])
    assert [r.meta["level"] for r in load_spec(str(path))] == [2, None]


def test_a_latent_marker_in_a_spec_s_data_is_warned_about(tmp_path: Path) -> None:
    """``load_spec`` warns of a question holding a latent marker's text (the tokenizer reads it as the marker)."""
    from dgrpo.data import load_spec

    path = _jsonl(tmp_path, [{"question": "a <|latent|> b", "answer": "1"}])
    with pytest.warns(UserWarning, match="latent marker text '<\\|latent\\|>'"):
        load_spec(str(path))


def test_a_file_named_like_the_builtin_task_is_still_the_builtin_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``builtin`` names the synthetic task even where the working folder holds a file of that name."""
    from dgrpo.data import local_path

    monkeypatch.chdir(tmp_path)
    (tmp_path / "builtin").write_text("{}\n", "utf-8")
    assert local_path("builtin") is None


def test_an_answer_column_without_a_question_column_is_refused() -> None:
    """A mapping of ``answer_key`` alone is a configuration error, not silently no mapping at all."""
    from dgrpo.config import DataConfig

    with pytest.raises(ValueError, match="question_key and answer_key go together"):
        load_rows([{"prompt": "q", "gold": "1"}], data=DataConfig(answer_key="gold"))


# ---------------------------------------------------------------------------------------------------------
# A bad row is a DataError naming it (not a record of the text 'None', an empty gold, or a crash)


@pytest.mark.parametrize(
    ("row", "says"),
    [
        ({"question": "q", "cot": None, "answer": "1"}, r"line 1 \(record 1\): field 'cot' is empty \(null\)"),
        ({"question": "q", "steps": ["a", 2], "answer": "1"}, r"line 1 \(record 1\): field 'steps' must be a list of"),
    ],
)
def test_a_malformed_row_of_a_known_format_is_named(tmp_path: Path, row: dict[str, Any], says: str) -> None:
    """A null ``cot`` (was an AttributeError), a step that is no string:
    a DataError naming the record."""
    path = tmp_path / "rows.json"
    path.write_text(json.dumps([row]), "utf-8")
    with pytest.raises(DataError, match=says):
        load_dataset(str(path))


@pytest.mark.parametrize(
    ("row", "says"),
    [
        ({"p": None, "g": "1"}, r"row 1: column 'p' is empty \(null\)"),
        ({"p": ["a", "b"], "g": "1"}, "row 1: column 'p' must be text or a number, got list"),
        ({"p": "q", "g": "  "}, "row 1: column 'g' is empty"),
    ],
)
def test_a_mapped_row_without_a_question_or_answer_is_named(row: dict[str, Any], says: str) -> None:
    """A null question was the question 'None', a list its repr, and a blank gold the answer '' (never scored)."""
    from dgrpo.config import DataConfig

    with pytest.raises(DataError, match=says):
        load_rows([row], data=DataConfig(question_key="p", answer_key="g"))


def test_a_text_file_of_blank_lines_is_a_file_of_no_records(tmp_path: Path) -> None:
    path = tmp_path / "empty.txt"
    path.write_text("\n  \n", "utf-8")
    with pytest.raises(DataError, match=r"empty.txt: the file is empty \(blank lines only\)"):
        load_dataset(str(path))


def test_a_name_is_looked_up_without_its_surrounding_spaces_and_a_file_takes_no_config(tmp_path: Path) -> None:
    """`` GSM8K `` is the dataset gsm8k; a config named with an existing file is refused (it names a hub config)."""
    from dgrpo.data import is_dataset_name

    assert is_dataset_name(" GSM8K ")
    path = _jsonl(tmp_path, [{"question": "q", "answer": "1"}], "my_rows")
    with pytest.raises(DataError, match=r"a config \(\?config=main\) names one of a hub dataset's configs"):
        load_dataset(str(path), config="main")


def test_a_gsm8k_row_without_its_final_answer_line_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GSM8K's own files need the ``#### <answer>`` line (a plain file's answer text is kept as it is)."""
    _jsonl(tmp_path / "gsm8k", [{"question": "q", "answer": "#### 1"}, {"question": "r", "answer": "5"}], "test.jsonl")
    monkeypatch.setenv("DGRPO_DATA_DIR", str(tmp_path))
    with pytest.raises(DataError, match="test.jsonl line 2: field 'answer' has no '#### <final answer>' line"):
        load_dataset("gsm8k")


def test_a_later_line_that_is_no_object_is_named(tmp_path: Path) -> None:
    """The format is detected from the first row; a later JSON line holding a list is a DataError naming it."""
    path = tmp_path / "rows.jsonl"
    path.write_text('{"question": "q", "answer": "1"}\n\n[1, 2]\n', "utf-8")
    with pytest.raises(DataError, match=r"rows\.jsonl line 3: expected a JSON object, got list"):
        load_dataset(str(path))


def test_unrecognised_keys_are_shown_eight_at_most(tmp_path: Path) -> None:
    """The message lists the first 8 keys, sorted, then '...'."""
    path = _jsonl(tmp_path, [{f"k{i}": i for i in range(9)}])
    with pytest.raises(DataError, match=r"unrecognised record keys \(k0, k1, k2, k3, k4, k5, k6, k7, \.\.\.\)"):
        load_dataset(str(path))


def test_a_steps_cell_of_json_list_text_is_read_as_json() -> None:
    """A cell written by ``json.dumps`` is read by JSON's rules (``\\/`` is ``/``), a pandas repr by Python's."""
    parse = column_parser("p", "g", "s")
    assert parse({"p": "q", "g": "1", "s": '["a\\/b", "c"]'}).steps == ["a/b", "c"]
    assert parse({"p": "q", "g": "1", "s": "['a', 'b']"}).steps == ["a", "b"]


def test_the_key_of_a_hub_name_and_of_joined_names_with_a_split() -> None:
    """A hub dataset named without a split has no split in its key; ``a+b`` with a split gives it to each part."""
    from dgrpo.data import dataset_key

    assert dataset_key("org/name") == "org/name"
    assert dataset_key("gsm8k+svamp", split="train") == "gsm8k:train+svamp:train"
