"""dgrpo eval as a researcher runs it on their own test files and scorer: what a failure on one dataset of several
says, and what it leaves."""

import json
import warnings

import pytest


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


def test_sampled_copies_of_a_question_are_said_to_be_one_sample(tokenizer, task_records):
    """Records repeated k times for k samples (pass@k by hand) under temperature > 0 get one completion k times, as
    each question is drawn from the seed and its text: a warning says so and how to draw others (another seed); it
    said nothing, and pass@k was pass@1. Greedy, or distinct questions: no warning."""
    from dgrpo.eval.evaluate import evaluate

    from conftest import make_lm

    lm, one, other = make_lm(tokenizer), task_records[0], task_records[1]
    options = {"max_new_tokens": 6, "progress": False, "dataset": "mine.jsonl"}
    with pytest.warns(UserWarning, match=r"^2 of 4 sampled questions of mine\.jsonl repeat an earlier one: .*seed=N"):
        r = evaluate(lm, [one, one, other, one], temperature=1.0, **options)
    assert len({r.predictions[i]["completion"] for i in (0, 1, 3)}) == 1  # (what the warning says)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        evaluate(lm, [one, one], **options)  # greedy: one answer is what is asked
        evaluate(lm, [one, other], temperature=1.0, **options)
