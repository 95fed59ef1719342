"""What a user walking the README's "Your own task" meets: a checkpoint trained on mapped columns, evaluated on a file
of other columns."""

import json

from test_own_task import mapped_checkpoint


def test_eval_says_a_missing_column_is_named_by_the_checkpoints_mapping(sft_checkpoint, tmp_path, run_cli):
    """``dgrpo eval`` takes the column mapping from the checkpoint's run_config.json: a ``--data`` file of other
    columns was 'missing field 'prompt' (data.question_key)', an option the command never gave. The line now says
    the key is the checkpoint's and how to name the file's columns; a key the command gave is not said to be."""
    model = mapped_checkpoint(sft_checkpoint, tmp_path / "model", steps_key="")
    data = tmp_path / "mine.jsonl"
    rows = [{"question": f"Start at {i}.", "solution": f"#### {i}"} for i in range(2)]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))

    r = run_cli("eval", "--model", model, "--data", data, "--out", tmp_path / "e")
    assert r.returncode == 2
    (line,) = [x for x in r.stderr.splitlines() if "error" in x]
    assert "missing field 'prompt' (data.question_key)" in line
    assert "data.question_key=prompt is the checkpoint's run's column mapping" in line
    assert "--set data.question_key=... data.answer_key=..." in line

    given = ("--set", "data.question_key=prompt", "data.answer_key=target")
    r = run_cli("eval", "--model", model, "--data", data, *given, "--out", tmp_path / "f")
    assert r.returncode == 2 and "missing field 'prompt'" in r.stderr and "checkpoint's run's" not in r.stderr

    r = run_cli(
        "eval", "--model", model, "--data", data, "--set", "data.question_key=question", "data.answer_key=solution",
        "eval.max_new_tokens=2", "--out", tmp_path / "g",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads((tmp_path / "g" / "results.json").read_text())["n"] == 2
