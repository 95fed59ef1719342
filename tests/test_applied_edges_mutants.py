"""dgrpo.training.applied at its edges (a second pass of mutation testing): an applied.json that is not UTF-8, or
holds entries that are not objects, and entries recorded without plug-in hashes or with hashes of another shape."""

import json
import warnings

import pytest

from dgrpo.training.applied import record_applied, warn_if_plugins_changed


def test_an_applied_json_that_is_not_text_is_written_anew_with_a_warning(tmp_path):
    """Bytes that are not UTF-8 (a damaged file): one warning, and the file holds the new entry alone."""
    path = tmp_path / "applied.json"
    path.write_bytes(b"\xff\xfe[")
    with pytest.warns(UserWarning, match="is not a list of applied settings: written anew"):
        record_applied(path, 0, {"device": "cpu"})
    assert json.loads(path.read_text()) == [{"started_at_step": 0, "device": "cpu"}]


def test_entries_that_are_not_objects_are_dropped_and_odd_plugin_records_tell_nothing(tmp_path):
    """A list holding a number and a string beside a real entry: the real one is kept, the others dropped. A last
    start that recorded plugin_files as a list, or a start that records none after one that did: no warning, no
    traceback."""
    path = tmp_path / "applied.json"
    path.write_text(json.dumps([3, "x", {"started_at_step": 0, "plugin_files": ["r.py"]}]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_plugins_changed(path, 5, {"plugin_files": {"r.py": "abc"}})
        record_applied(path, 5, {"device": "cpu"})
    assert json.loads(path.read_text()) == [
        {"started_at_step": 0, "plugin_files": ["r.py"]},
        {"started_at_step": 5, "device": "cpu"},
    ]
    path.write_text(json.dumps([{"started_at_step": 0, "plugin_files": {"r.py": "abc"}}]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_plugins_changed(path, 5, {"device": "cpu"})
