"""A researcher's own data files and the slips made with them: JSON Lines named ``.ndjson``, UTF-16 text (Excel's and
Notepad's 'Unicode Text'), a mistyped built-in name, a header with a space after its commas."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_data_edges2 import _hub_refused

from dgrpo.data import load_spec
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
