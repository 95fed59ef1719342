"""dgrpo eval as a researcher runs it on their own test files and scorer: what a failure on one dataset of several
says, and what it leaves."""

import json


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_scorer_failing_on_the_second_dataset_names_it_and_what_was_written(
    run_cli, sft_checkpoint, tmp_path, monkeypatch
):
    """A plug-in scorer that raises on a record of the second --data: the error line names that dataset (2 of 2)
    and the folder of the first, whose results are written whole; it named neither (only a row number and a
    question, which dataset's unsaid)."""
    monkeypatch.chdir(tmp_path)  # (relative names: the results folders are named after them)
    rows = [{"question": f"Start with {i}. Add 1. Answer mod 10.", "answer": str((i + 1) % 10)} for i in range(3)]
    _write_jsonl(tmp_path / "good.jsonl", rows)
    _write_jsonl(tmp_path / "bad.jsonl", [*rows, {**rows[0], "trap": 1}])
    scorer = tmp_path / "trapped.py"
    scorer.write_text(
        "def score(completions, records):\n"
        "    return [1 / 0 if r.meta.get('trap') else float(r.answer in c) for c, r in zip(completions, records)]\n"
    )
    r = run_cli(
        "eval", "--model", sft_checkpoint, "--data", "good.jsonl", "bad.jsonl", "--out", "eval",
        "--set", f"eval.scorer={scorer}:score", "eval.max_new_tokens=8",
    )  # fmt: skip
    assert r.returncode == 2, r.stderr
    [line] = [x for x in r.stderr.splitlines() if x.startswith("dgrpo: error:")]
    assert "ZeroDivisionError" in line
    assert "while evaluating bad.jsonl (2 of 2): its results were not written" in line
    assert "written: eval/good.jsonl" in line
    summary = json.loads((tmp_path / "eval" / "good.jsonl" / "results.json").read_text())
    assert summary["n"] == 3 and not (tmp_path / "eval" / "bad.jsonl").exists()
