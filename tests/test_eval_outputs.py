"""What a reused ``dgrpo eval --out DIR`` says of an earlier evaluation's results there that it does not rewrite
(named in a warning, kept), and data specs joining files whose names hold a ``+``."""

import json
import warnings

from dgrpo.eval.results import stale_results


def _results(folder, dataset):
    folder.mkdir(parents=True, exist_ok=True)
    summary = {"dataset": dataset, "accuracy": 0.5, "n": 2, "correct": 1, "unparseable": 0, "seed": 0}
    summary |= {"n_latent": 0, "mode": "coconut", "wall_s": 1.0}
    (folder / "results.json").write_text(json.dumps(summary))
    (folder / "predictions.jsonl").write_text("{}\n{}\n")


def test_a_reused_out_names_an_earlier_evaluations_results_and_keeps_them(run_cli, sft_checkpoint, tmp_path):
    """One --data after two: the old DIR/<name>/ results are named in a warning (a script reading them read another
    evaluation's numbers) and kept (results of other datasets gathered in one folder are the user's); two after one:
    the old DIR/results.json likewise; a user's file and a results.json of another dataset's name are not named."""
    out = tmp_path / "eval"
    common = ("eval", "--model", sft_checkpoint, "--limit", 2, "--out", out)

    def earlier(*data: str) -> list[str]:
        """The warnings naming an earlier evaluation's results of ``dgrpo eval ... --data DATA``."""
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            r = run_cli(*common, "--data", *data)
        assert r.returncode == 0, r.stderr
        return [str(w.message) for w in seen if "earlier dgrpo eval's results" in str(w.message)]

    assert earlier("builtin:test", "builtin:valid") == []
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    (out / "notes.txt").write_text("mine")
    _results(out / "mine", "builtin:test")  # (a results.json whose dataset is not named so)
    [line] = earlier("builtin:test")
    assert str(out / "builtin_test" / "results.json") in line and str(out / "builtin_valid" / "results.json") in line
    assert "mine" not in line and "(kept)" in line
    assert json.loads((out / "results.json").read_text())["dataset"] == "builtin:test"
    assert all(p.read_bytes() == b for p, b in before.items())  # (kept, untouched)
    [line] = earlier("builtin:test", "builtin:valid")
    assert str(out / "results.json") in line and "builtin_test" not in line
    assert (out / "results.json").is_file() and (out / "mine" / "results.json").is_file()


def test_stale_results_are_only_an_evaluations(tmp_path):
    """A results.json that is not an evaluation's summary (a demo's, a user's), and a pair in a folder this
    evaluation writes, are not stale."""
    (tmp_path / "results.json").write_text(json.dumps({"comparisons": []}))
    (tmp_path / "predictions.jsonl").write_text("")
    _results(tmp_path / "builtin_test", "builtin:test")
    _results(tmp_path / "gsm8k", "gsm8k")
    assert stale_results(tmp_path, [tmp_path / "builtin_test", tmp_path / "other"]) == [
        tmp_path / "gsm8k" / "results.json"
    ]
    assert stale_results(tmp_path / "absent", [tmp_path / "absent" / "a", tmp_path / "absent" / "b"]) == []


def test_a_joined_spec_reads_a_file_whose_name_holds_a_plus_as_one_part(tmp_path, monkeypatch):
    """``a+b.jsonl+other.csv`` where the file a+b.jsonl exists: a+b.jsonl then other.csv (each ``+`` split it: 'a',
    unknown); names without such a file split as before."""
    from dgrpo.cli.evaluate import spec_parts
    from dgrpo.data import dataset_key, join_parts, load_spec

    monkeypatch.chdir(tmp_path)
    (tmp_path / "a+b.jsonl").write_text('{"question": "1+1?", "answer": "2"}\n')
    (tmp_path / "other.csv").write_text("question,answer\n2+2?,4\n")
    spec = "a+b.jsonl+other.csv"
    assert join_parts(spec) == spec_parts(spec) == ["a+b.jsonl", "other.csv"]
    assert join_parts("other.csv + a+b.jsonl") == ["other.csv", "a+b.jsonl"]
    assert [r.answer for r in load_spec(spec)] == ["2", "4"]
    assert dataset_key(spec) == f"{tmp_path / 'a+b.jsonl'}+{tmp_path / 'other.csv'}"
    assert join_parts("gsm8k+svamp") == ["gsm8k", "svamp"] and join_parts("a+b.jsonl") == ["a+b.jsonl"]


def test_a_run_records_a_joined_spec_of_a_file_whose_name_holds_a_plus_with_absolute_paths(tmp_path, monkeypatch):
    """A run's config records ``a+b.jsonl+other.csv`` as the two absolute paths (a resume from another folder reads
    them): split at every ``+`` it kept ``a+b.jsonl`` relative ('a' and 'b.jsonl' name no file)."""
    from dgrpo.training.resume_check import absolute_data_spec

    monkeypatch.chdir(tmp_path)
    (tmp_path / "a+b.jsonl").write_text('{"question": "1+1?", "answer": "2"}\n')
    (tmp_path / "other.csv").write_text("question,answer\n2+2?,4\n")
    assert absolute_data_spec("a+b.jsonl+other.csv") == f"{tmp_path / 'a+b.jsonl'}+{tmp_path / 'other.csv'}"


def test_numeric_warns_of_golds_that_hold_a_number_with_other_text():
    """A gold '50%' is text to numeric ('#### 50' scores 0, '#### 50%' 1): evaluating such golds warns, naming one;
    golds that are numbers alone ('$40,000.', the built-in task's) and ProsQA's sentences do not."""
    import warnings

    import pytest

    from dgrpo.config import TaskConfig
    from dgrpo.data.records import Record
    from dgrpo.data.synthetic import generate_split
    from dgrpo.eval.scoring import SCORERS, warn_if_scorer_misses_gold
    from dgrpo.reward import score

    assert (score("#### 50", "50%"), score("#### 50%", "50%"), score("#### 40000", "$40,000.")) == (0.0, 1.0, 1.0)
    golds = [Record("q", [], a) for a in ("50%", "12", "12 kg")]
    with pytest.warns(UserWarning, match=r"^on t: 2 of the first 3 gold answers .*'50%'.*'#### 50' scores 0"):
        warn_if_scorer_misses_gold(SCORERS["numeric"], golds, "on t")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_scorer_misses_gold(SCORERS["exact"], golds, "on t")  # (exact compares as text by design)
        warn_if_scorer_misses_gold(SCORERS["numeric"], [Record("q", [], a) for a in ("$40,000.", "7")], "on t")
        warn_if_scorer_misses_gold(SCORERS["numeric"], [Record("q", [], "Tom is a lempus.")] * 2, "on t")
        warn_if_scorer_misses_gold(SCORERS["numeric"], generate_split(TaskConfig(), "test"), "on t")
