"""dgrpo eval refusing to replace another model's (or dataset's) results in its --out unless --overwrite;
evaluate_mc_vote's pass@k over its masks, and a scorer error under it naming the dataset's row and the mask."""

import json
import shutil


def test_a_second_model_into_the_first_models_out_is_refused_unless_overwrite(run_cli, sft_checkpoint, tmp_path):
    """Two checkpoints compared into one --out: the second is refused in one line naming the file and the model
    that wrote it (the first's results kept, byte for byte); the same model again replaces its own; another dataset
    is refused too; --overwrite replaces them."""
    other = tmp_path / "other"
    shutil.copytree(sft_checkpoint, other)
    out = tmp_path / "eval"
    first = run_cli("eval", "--model", sft_checkpoint, "--data", "builtin:test", "--limit", 2, "--out", out)
    assert first.returncode == 0, first.stderr
    kept = (out / "results.json").read_bytes()
    assert json.loads(kept)["model"] == str(sft_checkpoint.resolve())

    second = run_cli("eval", "--model", other, "--data", "builtin:test", "--limit", 2, "--out", out)
    assert second.returncode != 0
    [line] = [x for x in second.stderr.splitlines() if str(out / "results.json") in x]
    assert str(sft_checkpoint.resolve()) in line and "--overwrite" in line
    assert (out / "results.json").read_bytes() == kept

    again = run_cli("eval", "--model", sft_checkpoint, "--data", "builtin:test", "--limit", 3, "--out", out)
    assert again.returncode == 0, again.stderr
    assert json.loads((out / "results.json").read_text())["n"] == 3

    valid = run_cli("eval", "--model", sft_checkpoint, "--data", "builtin:valid", "--limit", 2, "--out", out)
    assert valid.returncode != 0 and "dataset builtin:test" in valid.stderr

    forced = run_cli("eval", "--model", other, "--data", "builtin:test", "--limit", 2, "--out", out, "--overwrite")
    assert forced.returncode == 0, forced.stderr
    assert json.loads((out / "results.json").read_text())["model"] == str(other.resolve())


def test_same_model_names_a_hub_id_at_any_commit_and_a_directory_alone():
    from dgrpo.cli.evaluate import _same_model

    assert _same_model("org/m@" + "a" * 40, "org/m@" + "b" * 40)
    assert _same_model("org/m", "org/m@" + "b" * 40)
    assert not _same_model("org/m@" + "a" * 40, "org/n@" + "a" * 40)
    assert _same_model("/runs/a/final", "/runs/a/final")
    assert not _same_model("/runs/a@1/final", "/runs/a@2/final")
    assert not _same_model("/runs/a/final", "org/m")


def test_pass_at_k_is_chen_et_al_s_unbiased_estimator():
    """1 - C(n-c, k)/C(n, k), by hand: n=4, c=1: pass@1 = 1/4, pass@2 = 1 - 3/6, pass@4 = 1; c=0: 0; n-c < k: 1."""
    import pytest

    from dgrpo.eval.evaluate import pass_at_k, pass_at_k_of, pass_ks

    assert pass_at_k(4, 1, 1) == 0.25 and pass_at_k(4, 1, 2) == 0.5 and pass_at_k(4, 1, 4) == 1.0
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10) and pass_at_k(5, 2, 3) == pytest.approx(1 - 1 / 10)
    assert pass_at_k(8, 0, 8) == 0.0 and pass_at_k(8, 5, 4) == 1.0 and pass_at_k(1, 1, 1) == 1.0
    assert pass_ks(1) == [1] and pass_ks(8) == [1, 2, 4, 8] and pass_ks(5) == [1, 2, 4, 5] and pass_ks(3) == [1, 2, 3]
    # averaged over questions: c = 1 and 3 of 4 masks
    assert pass_at_k_of([1, 3], 4) == {"1": 0.5, "2": (0.5 + 1.0) / 2, "4": 1.0}
    assert pass_at_k_of([], 2) == {"1": 0.0, "2": 0.0}
    for bad in ((4, 5, 1), (4, 1, 0), (4, 1, 5), (4, -1, 1)):
        with pytest.raises(ValueError, match="^pass_at_k: needs"):
            pass_at_k(*bad)


def _voted_of(monkeypatch, lm, records, texts, **kw):
    """evaluate_mc_vote of ``records`` whose perturbed completions are ``texts`` (question-major)."""
    import dgrpo.eval.evaluate as ev
    from dgrpo.perturbation import LockedDropout

    monkeypatch.setattr(ev, "_perturbed_texts", lambda *a, **k: list(texts))
    return ev.evaluate_mc_vote(lm, records, LockedDropout(p=0.1), progress=False, **kw)


def test_a_vote_reports_pass_at_k_over_its_masks_in_the_result_and_its_file(tokenizer, monkeypatch, tmp_path):
    """Question 1: 1 of 4 masks right (the vote wrong), question 2: 3 of 4 (the vote right): accuracy 0.5, pass@1
    (1/4 + 3/4) / 2, pass@4 1; each row counts its masks right; results.json holds it; shards merge to it."""
    from dgrpo.data.records import Record
    from dgrpo.eval.results import merge_results, write_results

    from conftest import make_lm

    lm = make_lm(tokenizer)
    recs = [Record("q1", [], "5"), Record("q2", [], "7")]
    texts = ["#### 5", "#### 6", "#### 6", "#### 9", "#### 7", "#### 7", "#### 1", "#### 7"]
    r = _voted_of(monkeypatch, lm, recs, texts, n_masks=4)
    assert (r.correct, [p["correct_masks"] for p in r.predictions]) == (1, [1, 3])
    assert r.pass_at_k == {"1": 0.5, "2": ((1 - 3 / 6) + 1.0) / 2, "4": 1.0}
    write_results(r, tmp_path)
    assert json.loads((tmp_path / "results.json").read_text())["pass_at_k"] == r.pass_at_k
    a = _voted_of(monkeypatch, lm, recs[:1], texts[:4], n_masks=4)
    b = _voted_of(monkeypatch, lm, recs[1:], texts[4:], n_masks=4)
    assert merge_results([a, b]).pass_at_k == r.pass_at_k
    assert merge_results([a, b]).predictions == r.predictions


def test_shards_of_a_vote_merge_pass_at_k_bit_for_bit_as_one_process_an_empty_shard_among_them(tokenizer, monkeypatch):
    """1, 1 and 3 of 3 masks right: one process's pass@1 is 0.5555555555555556; the shards' values weighted by their
    n give 0.5555555555555557, which the merge did where a rank's shard had no record (as a torchrun rank past the
    data's end has)."""
    from dgrpo.data.records import Record
    from dgrpo.eval.results import merge_results

    from conftest import make_lm

    lm = make_lm(tokenizer)
    recs = [Record("q1", [], "5"), Record("q2", [], "7"), Record("q3", [], "8")]
    texts = ["#### 5", "#### 1", "#### 2", "#### 7", "#### 1", "#### 2", "#### 8", "#### 8", "#### 8"]
    whole = _voted_of(monkeypatch, lm, recs, texts, n_masks=3)
    assert whole.pass_at_k is not None and whole.pass_at_k["1"] == 0.5555555555555556
    shards = [_voted_of(monkeypatch, lm, recs[:1], texts[:3], n_masks=3)]
    shards.append(_voted_of(monkeypatch, lm, [], [], n_masks=3))
    assert shards[-1].pass_at_k == {"1": 0.0, "2": 0.0, "3": 0.0}
    shards.append(_voted_of(monkeypatch, lm, recs[1:], texts[3:], n_masks=3))
    assert merge_results(shards).pass_at_k == whole.pass_at_k


def test_a_vote_on_a_tiny_model_reports_pass_at_1_and_pass_at_n_masks(sft_checkpoint):
    """End to end (the tiny SFT checkpoint, real generation under dropout masks): the keys are 1, 2 and 3 for 3
    masks, pass@k not falling as k grows, pass@3 the share of questions some mask answers right, pass@1 the mean
    share of masks right, and the vote's accuracy between pass@1's floor (0) and pass@3."""
    import pytest

    from dgrpo.data.synthetic import generate_split
    from dgrpo.eval.evaluate import evaluate_mc_vote
    from dgrpo.model.latent_lm import LatentLM
    from dgrpo.perturbation import LockedDropout

    from conftest import tiny_config

    lm = LatentLM.from_pretrained(str(sft_checkpoint))
    recs = generate_split(tiny_config().task, "test")[:16]
    r = evaluate_mc_vote(lm, recs, LockedDropout(p=0.3), n_masks=3, progress=False)
    assert r.pass_at_k is not None and list(r.pass_at_k) == ["1", "2", "3"]
    values = list(r.pass_at_k.values())
    assert 0 < values[0] <= values[1] <= values[2] <= 1, values
    masks = [p["correct_masks"] for p in r.predictions]
    assert r.pass_at_k["3"] == sum(c > 0 for c in masks) / 16
    assert r.pass_at_k["1"] == pytest.approx(sum(c / 3 for c in masks) / 16)
    assert r.accuracy <= r.pass_at_k["3"]


def test_a_scorer_error_in_a_vote_names_the_datasets_row_and_the_mask(tokenizer, monkeypatch):
    """Record 0 has no vote (empty completions), and the scorer fails on record 2's voted completion: the error said
    'row 1' (its index among the records with a vote); it names row 2 and the mask, as evaluate names its row."""
    import pytest

    from dgrpo.data.records import Record
    from dgrpo.eval.scoring import RewardError

    from conftest import make_lm

    def picky(completions, records):
        if any(r.question == "q3" and c == "#### 8" for c, r in zip(completions, records)):
            raise ValueError("no q3")
        return [0.0] * len(completions)

    def out_of_range(completions, records):
        return [2.0 if c == "#### 8" else 0.0 for c in completions]

    recs = [Record("q1", [], "5"), Record("q2", [], "7"), Record("q3", [], "8")]
    texts = ["", "", "#### 7", "#### 7", "#### 8", "#### 3"]  # (q3's vote: 8, the first of a tie)
    lm = make_lm(tokenizer)
    with pytest.raises(RewardError, match=r"on row 2, mask 0 \(completion '#### 8', question 'q3'\)"):
        _voted_of(monkeypatch, lm, recs, texts, n_masks=2, scorer=picky)
    with pytest.raises(RewardError, match=r"for row 2, mask 0 \(completion '#### 8'"):
        _voted_of(monkeypatch, lm, recs, texts, n_masks=2, scorer=out_of_range)
    texts[4:] = texts[5:3:-1]  # (the failing completion is mask 1, which the vote does not pick: still scored)
    with pytest.raises(RewardError, match=r"on row 2, mask 1 \(completion '#### 8'"):
        _voted_of(monkeypatch, lm, recs, texts, n_masks=2, scorer=picky)


def test_masked_rows_renames_the_rows_of_a_call_together():
    from dgrpo.eval.evaluate import _masked_rows

    line = "scorer f raised X: y on rows 4-7 together (of the 12 in the call), neither half of them alone: (row 4: "
    assert _masked_rows(line + "completion 'a', question 'b')", 4, 12) == (
        "scorer f raised X: y on row 1, mask 0 to row 1, mask 3 together (of the 12 completions in the call, 4 per "
        "row), neither half of them alone: (row 1, mask 0: completion 'a', question 'b')"
    )
    assert _masked_rows("raised X: row 5 went wrong on row 5 (completion 'a', question 'b')", 2, 8) == (
        "raised X: row 5 went wrong on row 2, mask 1 (completion 'a', question 'b')"
    )  # (the scorer's own words untouched)
