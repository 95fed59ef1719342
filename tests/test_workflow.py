"""The researcher's workflow of the README's paper recipes (sft -> grpo -> eval -> plot -> export), as the command
line meets it: each step's failure says which option to change."""

import pytest

from conftest import TINY


@pytest.mark.parametrize("key", ["data.train", "data.valid", "data.test"])
def test_a_dataset_that_cannot_be_read_names_its_key(tmp_path, run_cli, key):
    """A recipe's dataset that cannot be read (paper/grpo_dropout.yaml's ChilleD/SVAMP offline: train and test both
    name it) is one line naming the config key that holds it and the --set that replaces it: the line named the
    dataset alone, and --set data.train=... left the same error, from data.test."""
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    value = f"[{empty}]" if key == "data.test" else str(empty)
    out = tmp_path / "run"
    r = run_cli("sft", "--config", TINY, "--out", out, "--set", f"{key}={value}", "task.n_train=64")
    assert r.returncode == 2, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith(f"dgrpo: error: {key}: ") and str(empty) in line and "the file is empty" in line, line
    fix = "--set 'data.test=[...]'" if key == "data.test" else f"--set {key}=..."
    assert line.endswith(f"; {fix} names another"), line
    assert not out.exists()
