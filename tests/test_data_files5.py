"""A researcher's own data files and the slips made with them: JSON Lines named ``.ndjson``, UTF-16 text (Excel's and
Notepad's 'Unicode Text'), a mistyped built-in name, a header with a space after its commas."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_data_edges2 import _hub_refused

from dgrpo.data import load_dataset, load_spec
from dgrpo.data.records import DataError


def test_a_missing_ndjson_file_is_a_missing_file_not_a_hub_dataset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``.ndjson`` file (JSON Lines' other name) is read as JSON Lines where it exists, but a missing or mistyped
    one was looked up on the Hugging Face hub as a dataset id ('unknown dataset', or a wait for the network), where a
    ``.jsonl`` one is 'file not found', naming the file of a close name beside it."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_train.ndjson").write_text(json.dumps({"question": "q", "answer": "18"}) + "\n", "utf-8")
    assert [r.answer for r in load_spec("my_train.ndjson")] == ["18"]
    asked = _hub_refused(monkeypatch)
    with pytest.raises(DataError, match=r"^my_trian\.ndjson: file not found .*; did you mean my_train\.ndjson\?$"):
        load_spec("my_trian.ndjson")
    with pytest.raises(DataError, match=r"^MY\.NDJSON: file not found "):
        load_spec("MY.NDJSON")
    assert asked == []


@pytest.mark.parametrize(
    ("name", "data", "encoding"),
    [
        ("rows.csv", "question,answer\nq1,18\n".encode("utf-16"), "UTF-16"),  # (a byte-order mark: FF FE)
        ("rows.tsv", b"\xfe\xff" + "question\tanswer\nq1\t18\n".encode("utf-16-be"), "UTF-16"),
        ("rows.jsonl", (json.dumps({"question": "q", "answer": "18"}) + "\n").encode("utf-16"), "UTF-16"),
        ("rows.json", json.dumps([{"question": "q", "answer": "18"}]).encode("utf-32"), "UTF-32"),
        ("rows.csv", "question,answer\nq1,18\n".encode("utf-16-le"), "UTF-16LE"),  # (no mark)
        ("rows.jsonl", (json.dumps({"question": "q", "answer": "18"}) + "\n").encode("utf-16-be"), "UTF-16BE"),
    ],
    ids=["csv-utf16", "tsv-utf16be", "jsonl-utf16", "json-utf32", "csv-utf16le-no-mark", "jsonl-utf16be-no-mark"],
)
def test_a_utf16_file_is_named_so_with_how_to_convert_it(tmp_path: Path, name: str, data: bytes, encoding: str) -> None:
    """A UTF-16 file (Excel's and Notepad's 'Unicode Text') was 'line 1: not valid UTF-8 (byte 0); save the file as
    UTF-8', which did not say what it was; one without a byte-order mark was read, its columns '\\x00q\\x00u...'
    ('unrecognised record keys'). Each is named for its encoding, with the command that converts it, which works."""
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(DataError) as info:
        load_spec(str(path))
    out = tmp_path / f"rows_utf8{path.suffix}"
    said = str(info.value)
    assert said.startswith(f"{path}: {encoding} text (as Excel's and Notepad's 'Unicode Text' is saved), not UTF-8; ")
    assert f"convert it: iconv -f {encoding} -t UTF-8 {path} > {out} (in Python: " in said
    python = said.partition("(in Python: ")[2].rpartition(")")[0]
    exec(python, {"Path": Path})  # (the Python the line gives converts the file, as written)
    assert [(r.question, r.answer) for r in load_spec(str(out))] in ([("q1", "18")], [("q", "18")])


@pytest.mark.parametrize("name", ["rows.csv", "rows.tsv", "rows.jsonl", "rows.json"])
def test_a_utf8_byte_order_mark_is_no_part_of_the_first_column(tmp_path: Path, name: str) -> None:
    """A UTF-8 file that starts with a byte-order mark (EF BB BF, as Excel's 'CSV UTF-8' writes) is read as one
    without: its first column is 'question', not '\\ufeffquestion' (checked, not changed here)."""
    text = {
        ".csv": "question,answer\nq,18\n",
        ".tsv": "question\tanswer\nq\t18\n",
        ".jsonl": json.dumps({"question": "q", "answer": "18"}) + "\n",
        ".json": json.dumps([{"question": "q", "answer": "18"}]),
    }[Path(name).suffix]
    path = tmp_path / name
    path.write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))
    assert [(r.question, r.answer) for r in load_spec(str(path))] == [("q", "18")]


def test_a_csv_header_with_spaces_after_its_commas_is_told_so(tmp_path: Path) -> None:
    """``question, answer`` as a header names a column ' answer': the refusal listed '( answer, question)', the space
    easy to miss; it now says what is wrong (a header without such spaces reads)."""
    path = tmp_path / "spaced.csv"
    path.write_text("question, answer\nWhat is 1+1?, 2\n")
    with pytest.raises(DataError, match=r"column names with spaces around them: ' answer'; a CSV header is read as"):
        load_dataset(str(path))
    path.write_text("question,answer\nWhat is 1+1?,2\n")
    assert load_dataset(str(path))[0].answer == "2"
    path.write_text("query, target\nWhat is 1+1?, 2\n")  # (no known format under the names stripped: no hint)
    with pytest.raises(DataError) as info:
        load_dataset(str(path))
    assert "spaces around them" not in str(info.value)


@pytest.mark.parametrize("name", ["sheet.xlsx", "sheet.csv", "sheet.jsonl"])
def test_an_excel_workbook_given_as_data_is_told_to_export_it(tmp_path: Path, name: str) -> None:
    """An .xlsx workbook (a zip archive) was 'unrecognised format' (as .csv: 'contains no records'): it is named, with
    how to export it or pass its rows."""
    path = tmp_path / name
    path.write_bytes(b"PK\x03\x04" + bytes(range(60)) * 2)
    with pytest.raises(DataError, match=r"a zip archive \(an Excel .xlsx workbook is one\), not text: export the"):
        load_dataset(str(path))


def test_a_gzipped_csv_is_named_so_as_a_gzipped_json_file_is(tmp_path: Path) -> None:
    """Every text reader asks one head check (tables.not_text): a gzipped .csv was 'not valid UTF-8' with a line and
    byte, where a gzipped .jsonl said gzip; both say it now."""
    import gzip

    for name in ("rows.csv", "rows.jsonl"):
        path = tmp_path / name
        path.write_bytes(gzip.compress(b"question,answer\nq,3\n"))
        with pytest.raises(DataError, match=r": a gzip-compressed file; decompress it first \(gunzip -k "):
            load_dataset(str(path))
