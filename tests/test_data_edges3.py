"""A researcher's own data at its edges: TSV files, a mistyped file name alone, the line a JSON list's bad record
starts on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_data_edges2 import _hub_refused

from dgrpo.config import DataConfig
from dgrpo.data import load_spec
from dgrpo.data.records import DataError


def test_a_tsv_file_is_read_as_csv_with_tabs(tmp_path: Path) -> None:
    """A ``.tsv`` file (what many exports write) was 'unrecognised format'. It is read as CSV with a tab between
    cells: a quoted value may hold a tab, and a column mapping names its columns."""
    path = tmp_path / "rows.tsv"
    path.write_text('question\tanswer\tsource\n"What is\t2+2?"\t4\tme\nHow many?\t1,000\tyou\n', "utf-8")
    records = load_spec(str(path))
    assert [(r.question, r.answer, r.meta["source"]) for r in records] == [
        ("What is\t2+2?", "4", "me"),
        ("How many?", "1000", "you"),
    ]


def test_a_tsv_files_bad_row_is_named_by_its_line(tmp_path: Path) -> None:
    """A row of a TSV file is named by the line it starts on (blank lines and a value over two lines counted), and a
    row of more cells than the header says a value with a tab needs quotes."""
    path = tmp_path / "rows.tsv"
    path.write_text('question\tanswer\n"two\nlines"\t3\n\nq\t\n', "utf-8")
    with pytest.raises(DataError, match=r"rows\.tsv line 5: .*'answer'"):
        load_spec(str(path))
    path.write_text("question\tanswer\nq\t3\nq\tx\t4\n", "utf-8")
    with pytest.raises(DataError, match=r"rows\.tsv line 3: 3 cells, .* \(a value with a tab needs quotes\)$"):
        load_spec(str(path))


def test_a_missing_tsv_file_is_a_missing_file_not_a_hub_dataset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A missing ``my_train.tsv`` was looked up on the Hugging Face hub ('unknown dataset ...', or a wait for the
    network): .tsv was no data file's extension."""
    monkeypatch.chdir(tmp_path)
    asked = _hub_refused(monkeypatch)
    with pytest.raises(DataError, match=r"^my_train\.tsv: file not found \(a relative path"):
        load_spec("my_train.tsv")
    assert asked == []


def test_a_mistyped_file_alone_names_the_file_it_likely_meant(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A missing file named alone was only 'file not found', where the same typo in a '+'-joined spec named the
    file beside it of a close name; now both do (and a folder with no close name lists its data files)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_train.jsonl").write_text(json.dumps({"question": "q", "answer": "1"}) + "\n")
    with pytest.raises(DataError, match=r"^my_trian\.jsonl: file not found .*; did you mean my_train\.jsonl\?$"):
        load_spec("my_trian.jsonl")
    with pytest.raises(DataError, match=r"^.*other\.csv: file not found; its folder holds .*my_train\.jsonl$"):
        load_spec(str(tmp_path / "other.csv"))


def test_a_json_lists_bad_record_is_named_by_the_line_it_starts_on(tmp_path: Path) -> None:
    """A bad record of a JSON list written over many lines (``json.dump(rows, f, indent=2)``) was named 'record 2'
    only, and a researcher counted objects to find it; the line it starts on is named too, in a list wrapped as
    ``{"data": [...]}`` as well."""
    rows = [{"question": "q1", "steps": [], "answer": "1"}, {"question": "q2", "steps": ["a", 2], "answer": "2"}]
    path = tmp_path / "rows.json"
    path.write_text(json.dumps(rows, indent=2), "utf-8")
    with pytest.raises(DataError, match=r"rows\.json line 7 \(record 2\): field 'steps' must be a list of strings"):
        load_spec(str(path))
    path.write_text(json.dumps({"about": {"made": [1, "]"]}, "data": rows}, indent=2), "utf-8")
    lines = path.read_text().splitlines()
    start = next(n for n, line in enumerate(lines, 1) if line.strip() == "{" and '"q2"' in lines[n])
    with pytest.raises(DataError, match=rf"rows\.json line {start} \(record 2\): field 'steps'"):
        load_spec(str(path))


@pytest.mark.parametrize(("name", "header", "ask"), [("rows.csv", "q\ta", ".tsv"), ("rows.tsv", "q,a", ".csv")])
def test_a_table_of_the_other_separator_names_the_extension_that_reads_it(
    tmp_path: Path, name: str, header: str, ask: str
) -> None:
    """A tab-separated file named .csv was asked 'is the file comma-separated?' (it was not: it was tab-separated),
    and a comma-separated one named .tsv was asked nothing; each now names the extension that reads it."""
    path = tmp_path / name
    path.write_text(f"{header}\n{header.replace('q', 'What?').replace('a', '4')}\n", "utf-8")
    with pytest.raises(DataError, match=rf"one column: a \w+-separated file is read as one when named \{ask}\)"):
        load_spec(str(path))
    with pytest.raises(DataError, match=rf"one column: a \w+-separated file is read as one when named \{ask}\)$"):
        load_spec(str(path), data=DataConfig(question_key="q", answer_key="a"))
