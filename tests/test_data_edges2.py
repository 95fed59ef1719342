"""A researcher's own data at its edges: data specs joined by '+' whose file part is mistyped, bytes that are not
UTF-8 named by their line and byte."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dgrpo.data import load_spec
from dgrpo.data.records import DataError

ROW = json.dumps({"question": "What is 2+2?", "answer": "2+2=4\n#### 4"}) + "\n"


def _hub_refused(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The hub datasets asked for (none may be: each ask is refused, and noted)."""
    asked: list[str] = []

    def refuse(name: str, *args: object, **kwargs: object) -> None:
        asked.append(name)
        raise AssertionError(f"the hub was asked for {name!r}")

    monkeypatch.setattr("dgrpo.data.loaders._load_from_hub", refuse)
    return asked


def test_a_mistyped_file_whose_name_holds_a_plus_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``my+dta.jsonl``, a typo of the file ``my+data.jsonl``, was read as the dataset ``my`` joined with
    ``dta.jsonl`` and failed on ``my``, looked up on the hub ('unknown dataset 'my'', or the hub unreached), naming
    neither the file nor the typo. Now one line names the file it is not, the part that names no file, and the file
    beside it that it likely meant; the hub is not asked."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my+data.jsonl").write_text(ROW)
    asked = _hub_refused(monkeypatch)
    with pytest.raises(DataError) as info:
        load_spec("my+dta.jsonl")
    said = str(info.value)
    assert said.startswith("my+dta.jsonl: no file my+dta.jsonl (a relative path is read from the working directory")
    assert "dta.jsonl is no file either and my no local file or built-in dataset" in said
    assert said.endswith("; did you mean my+data.jsonl?")
    assert "\n" not in said and asked == []
    assert len(load_spec("my+data.jsonl")) == 1  # (the file as named)


def test_a_mistyped_part_is_refused_before_any_part_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A part meant as a file (a data file's extension) that names none is refused, naming it, before the parts
    before it are read (``gsm8k+my_trian.csv`` read GSM8K, from the hub where there is no local copy, then failed)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_train.csv").write_text("question,answer\nWhat is 2+2?,4\n")
    read: list[str] = []
    monkeypatch.setattr("dgrpo.data._load_spec", _noting(read))
    with pytest.raises(DataError) as info:
        load_spec("gsm8k+my_trian.csv")
    assert str(info.value) == (
        "gsm8k+my_trian.csv: its part my_trian.csv names no file (a relative path is read from the working directory, "
        f"{tmp_path}); did you mean my_train.csv?"
    )
    assert read == ["gsm8k+my_trian.csv"]  # (the whole spec, then no part of it)


def _noting(read: list[str]) -> Callable[..., Any]:
    """dgrpo.data._load_spec, noting each spec it is given."""
    import dgrpo.data

    real = dgrpo.data._load_spec

    def noted(spec: str, *args: Any) -> Any:
        read.append(spec)
        return real(spec, *args)

    return noted


def test_a_missing_part_in_a_folder_names_its_files(tmp_path: Path) -> None:
    """A missing part with no file of a close name beside it: its folder's data files are named (an absolute path
    is not said to be read from the working directory)."""
    (tmp_path / "train.jsonl").write_text(ROW)
    (tmp_path / "notes.md").write_text("not data")
    spec = f"{tmp_path}/train.jsonl+{tmp_path}/eval_set.jsonl"
    with pytest.raises(DataError) as info:
        load_spec(spec)
    said = f"{spec}: its part {tmp_path}/eval_set.jsonl names no file; its folder holds {tmp_path}/train.jsonl"
    assert str(info.value) == said


def test_joined_specs_that_exist_still_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check refuses nothing that reads: files, a file whose name holds a '+', the built-in task, in any order."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.jsonl").write_text(ROW)
    (tmp_path / "b+c.jsonl").write_text(ROW + ROW)
    assert len(load_spec("a.jsonl+b+c.jsonl")) == 3
    assert len(load_spec("b+c.jsonl+a.jsonl")) == 3
    n = len(load_spec("builtin:test"))
    assert len(load_spec("a.jsonl+builtin:test")) == n + 1


def test_a_csv_files_bytes_that_are_not_utf8_are_named_by_line_and_byte(tmp_path: Path) -> None:
    """A spreadsheet's Latin-1 export read as UTF-8: the line and the byte where it first fails, from the file's start.
    The byte was counted from the start of the chunk the text reader was decoding (byte 4583 for 397799) and no line
    was named."""
    rows = "".join(f"question {i},{i}\n" for i in range(20_000))
    data = ("question,answer\n" + rows + "caf\xe9,4\n").encode("latin-1")
    path = tmp_path / "export.csv"
    path.write_bytes(data)
    with pytest.raises(DataError) as info:
        load_spec(str(path))
    at = data.index(b"\xe9")
    assert str(info.value) == f"{path} line 20002: not valid UTF-8 (byte {at}); save the file as UTF-8"


@pytest.mark.parametrize("name", ["rows.jsonl", "rows.csv"])
def test_a_bad_byte_after_a_byte_order_mark_is_named_on_its_own_line(tmp_path: Path, name: str) -> None:
    """In a file that starts with a byte-order mark (as Windows editors save UTF-8), a bad byte on line 2 is on line
    2, at its byte from the file's start: JSON's was counted after the mark, 3 bytes short, and named line 1 when the
    newline before it was among those 3 bytes."""
    first = '{"question": "q", "answer": "4"}' if name.endswith("jsonl") else "question,answer"
    data = b"\xef\xbb\xbf" + first.encode() + b"\n\xff\n"
    (tmp_path / name).write_bytes(data)
    with pytest.raises(DataError) as info:
        load_spec(str(tmp_path / name))
    said = f"{tmp_path / name} line 2: not valid UTF-8 (byte {len(data) - 2}); save the file as UTF-8"
    assert str(info.value) == said


def test_a_row_without_the_cot_field_among_gsm8k_aug_rows_is_said_to_lack_it(tmp_path: Path) -> None:
    """A ``{question, answer}`` row after ``{question, cot, answer}`` rows (a file whose later rows lost their ``cot``):
    'missing field', with the row's fields, not 'is empty (null)' as if the file held ``"cot": null``."""
    rows = [{"question": "q", "cot": "<<2+2=4>>", "answer": "4"}, {"question": "q2", "answer": "5"}]
    path = tmp_path / "aug.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(DataError) as info:
        load_spec(str(path))
    assert str(info.value) == f"{path} line 2: missing field 'cot'; the row's fields: 'question', 'answer'"
    path.write_text(json.dumps(rows[0]) + "\n" + json.dumps({**rows[1], "cot": None}) + "\n")
    with pytest.raises(DataError, match=r"line 2: field 'cot' is empty \(null\)$"):
        load_spec(str(path))


@pytest.mark.parametrize(("name", "blank"), [("rows.jsonl", ""), ("rows.json", "\n\n"), ("later.jsonl", None)])
def test_objects_written_over_several_lines_are_said_to_be(tmp_path: Path, name: str, blank: str | None) -> None:
    """Rows written with ``json.dump(row, f, indent=2)`` one after another: the lines of the first such object, and
    what a JSON Lines file holds. A .jsonl file's was 'line 1: invalid JSON (Expecting property name enclosed in
    double quotes, column 2)', a .json file's 'line 5: invalid JSON (Extra data, column 1)'."""
    rows = [{"question": "What is 2+2?", "answer": "4"}, {"question": "What is 3+3?", "answer": "6"}]
    if blank is None:  # (the first row on one line, the next spread: from line 2)
        text, first = json.dumps(rows[0]) + "\n" + json.dumps(rows[1], indent=2) + "\n", 2
    else:
        text, first = blank + "".join(json.dumps(row, indent=2) + "\n" for row in rows), 1 + blank.count("\n")
    (tmp_path / name).write_text(text)
    with pytest.raises(DataError) as info:
        load_spec(str(tmp_path / name))
    assert str(info.value) == (
        f"{tmp_path / name} lines {first}-{first + 3}: one JSON object written over several lines; JSON Lines holds "
        "one object per line (json.dumps(row), no indent), or give the rows as one JSON list in a .json file"
    )


def test_json_that_is_only_invalid_keeps_its_own_line(tmp_path: Path) -> None:
    """An object cut short over several lines, or a truncated line, is invalid JSON at its line, as before."""
    (tmp_path / "cut.jsonl").write_text('{\n "question": "q",\n')
    with pytest.raises(DataError, match=r"cut\.jsonl line 1: invalid JSON \(Expecting property name"):
        load_spec(str(tmp_path / "cut.jsonl"))
    (tmp_path / "end.jsonl").write_text('{"question": "q", "answer": "4"}\n{"question": "q2", "ans')
    with pytest.raises(DataError, match=r"end\.jsonl line 2: invalid JSON \(Unterminated string"):
        load_spec(str(tmp_path / "end.jsonl"))


def test_a_text_answer_after_gsm8ks_marker_is_refused_saying_how_to_read_it(tmp_path: Path) -> None:
    """A file's own GSM8K-style rows with a text gold (``#### 50%``) are refused in GSM8K's format, which needs a
    number; the line says how to read it as text (the columns named), which reads it so."""
    from dgrpo.config import DataConfig

    path = tmp_path / "pct.jsonl"
    path.write_text(json.dumps({"question": "What share is 1 of 2?", "answer": "1/2 = 50%\n#### 50%"}) + "\n")
    with pytest.raises(DataError) as info:
        load_spec(str(path))
    assert str(info.value) == (
        f"{path} line 1: final answer after '####' must be a number, got '50%' (GSM8K's format); to read a text "
        "answer after '####', name the columns: --set data.question_key=question data.answer_key=answer"
    )
    (record,) = load_spec(str(path), data=DataConfig(question_key="question", answer_key="answer"))
    assert record.answer == "50%" and record.meta["solution"] == "1/2 = 50%\n#### 50%"


def test_what_follows_a_completions_number_is_not_read_as_the_readme_says() -> None:
    """README (What counts as correct): ``#### 50%`` answers 50, right for a gold of 50, not 0.5; a ``50%`` gold is
    text, which ``#### 50%`` matches, and so does ``#### 50 %`` (no space is kept between a digit and a symbol)."""
    from dgrpo.reward import score

    assert score("#### 50%", "50") == 1.0 and score("The answer is 12 kg.", "12") == 1.0
    assert score("#### 50%", "0.5") == 0.0
    assert score("#### 50%", "50%") == 1.0 and score("#### 50 %", "50%") == 1.0
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert "`#### 50%` and `The answer is 12 kg.` answer 50 and 12" in " ".join(readme.split())


@pytest.mark.parametrize("separator", [";", "\t"])
def test_a_csv_file_of_another_separator_is_asked_about_without_a_mapping(tmp_path: Path, separator: str) -> None:
    """A spreadsheet's CSV saved with ``;`` (many locales) or tabs is one column, ``question;answer``: read by its
    keys, the line listed the known formats without the question a mapped read already asks."""
    path = tmp_path / "rows.csv"
    path.write_text(f"question{separator}answer\nWhat is 2+2?{separator}4\n")
    with pytest.raises(DataError) as info:
        load_spec(str(path))
    keys = "question;answer" if separator == ";" else "question\\tanswer"  # (escaped: one line)
    ask = "is the file comma-separated?" if separator == ";" else "a tab-separated file is read as one when named .tsv"
    assert str(info.value).startswith(f"{path} line 2: unrecognised record keys ({keys}) (one column: {ask}); expected")


def test_a_csv_cell_longer_than_the_csv_modules_limit_is_read(tmp_path: Path) -> None:
    """A cell of 200,000 characters (a reasoning model's long solution beside its answer): read whole, as a JSON Lines
    file holds it; it was 'not a readable CSV file (field larger than field limit (131072))'. The csv module's limit,
    the process's, is as it was after the read."""
    import csv

    from dgrpo.config import DataConfig

    before = csv.field_size_limit()
    solution = "Step. " * 40_000 + "#### 4"
    path = tmp_path / "long.csv"
    path.write_text(f'question,solution\nWhat is 2+2?,"{solution}"\n')
    (record,) = load_spec(str(path), data=DataConfig(question_key="question", answer_key="solution"))
    assert record.answer == "4" and record.meta["solution"] == solution
    assert csv.field_size_limit() == before


def test_a_csv_row_longer_than_its_header_is_named_as_every_other_row_is(tmp_path: Path) -> None:
    """'<file> line N: ...', as every other row's problem is named (it was '<file>: line N: ...')."""
    path = tmp_path / "rows.csv"
    path.write_text("question,answer\nWhat is 2+2?,4\nWhat is 1,000+1?,1001\n")
    with pytest.raises(DataError) as info:
        load_spec(str(path))
    assert str(info.value).startswith(f"{path} line 3: 3 cells, more than the header's 2 columns")


def test_a_mistyped_training_file_whose_name_holds_a_plus_is_named_as_typed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """data.train reads a hub name's train split, so ``my+dta.jsonl`` is read as ``my:train+dta.jsonl``: the file it
    is not is still ``my+dta.jsonl`` (it was 'no file my:train+dta.jsonl')."""
    from dgrpo.data import training_split

    monkeypatch.chdir(tmp_path)
    (tmp_path / "my+data.jsonl").write_text(ROW)
    assert training_split("my+dta.jsonl") == "my:train+dta.jsonl"
    with pytest.raises(DataError) as info:
        load_spec(training_split("my+dta.jsonl"))
    said = str(info.value)
    assert said.startswith("my:train+dta.jsonl: no file my+dta.jsonl (a relative path is read from the working")
    assert "and my no local file or built-in dataset; did you mean my+data.jsonl?" in said
