"""The evaluation loop around the scoring (:mod:`dgrpo.eval.evaluate`), by hand: what :func:`generate_answers` hands
the model, what :func:`evaluate` asks of it and records, and how shards merge (mutation-found gaps: each test
kills a change of the source that the suite passed)."""

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

import dgrpo.eval.evaluate as ev
import dgrpo.eval.results as res
from dgrpo.data.records import Record
from dgrpo.eval.evaluate import EvalResult, evaluate, generate_answers, mask_seeds
from dgrpo.eval.results import merge_results
from dgrpo.perturbation import LockedDropout

from conftest import make_lm

FAST = {"max_new_tokens": 2, "progress": False}


@pytest.fixture
def lm(tokenizer):
    return make_lm(tokenizer)


class ModelSpy:
    """Stands in for ``lm``'s encode_questions / generate / decode: each question is one token, its index in
    ``questions``; the answer to it is ``"answer to <question>"``; every call's arguments are kept."""

    def __init__(self, lm, monkeypatch, questions: list[str]):
        self.questions, self.encoded, self.generated = questions, list[dict](), list[dict]()
        monkeypatch.setattr(lm, "encode_questions", self.encode)
        monkeypatch.setattr(lm, "generate", self.generate)
        monkeypatch.setattr(lm, "decode", self.decode)

    def encode(self, questions, *, markers=True, max_tokens=None):
        self.encoded.append({"markers": markers, "max_tokens": max_tokens})
        ids = torch.tensor([[self.questions.index(q)] for q in questions])
        return ids, torch.ones_like(ids)

    def generate(self, ids, mask, n_latent=None, **kw):
        self.generated.append({"n_latent": n_latent, "rows": ids[:, 0].tolist(), **kw})
        return SimpleNamespace(tokens=ids.clone(), mask=mask.clone())

    def decode(self, tokens, mask):
        return [f"answer to {self.questions[i]}" for i in tokens[:, 0].tolist()]


def test_generate_answers_hands_the_model_its_decoding_prompt_cut_mode_and_markers(lm, monkeypatch):
    """top_p, the question cut (max_question_tokens), the generation mode and the markers reach the model as given:
    dropping any of them left every test passing."""
    qs = ["a?", "bb?", "c?"]
    spy = ModelSpy(lm, monkeypatch, qs)
    got = generate_answers(
        lm, qs, n_latent=2, batch_size=2, temperature=0.7, top_p=0.5, mode="pause", markers=False,
        max_question_tokens=5, **FAST,
    )  # fmt: skip
    assert got == [f"answer to {q}" for q in qs]
    assert [c["rows"] for c in spy.generated] == [[0, 2], [1]]  # (sorted by length, in batches of 2)
    for call in spy.generated:
        assert (call["n_latent"], call["temperature"], call["top_p"]) == (2, 0.7, 0.5)
        assert (call["mode"], call["markers"], call["max_new_tokens"]) == ("pause", False, 2)
    assert spy.encoded[-1] == {"markers": False, "max_tokens": 5}


def test_evaluate_answers_under_its_seed_and_records_the_question_cut(lm, monkeypatch):
    """evaluate samples from its ``seed`` and answers under the masks of :func:`mask_seeds` of that seed, and records
    ``max_question_tokens`` (None for a plain prompt, which is not cut): seed 0 in their place, or the cut left out
    of results.json, passed the suite."""
    seen: list[dict] = []
    monkeypatch.setattr(ev, "generate_answers", lambda _lm, qs, **kw: seen.append(kw) or ["#### 3"] * len(qs))
    recs = [Record("1+2?", [], "3"), Record("2+1?", [], "3")]
    r = evaluate(lm, recs, seed=7, temperature=1.0, max_question_tokens=9, perturbation=LockedDropout(p=0.1), **FAST)
    assert (seen[-1]["seed"], r.seed, seen[-1]["max_question_tokens"], r.max_question_tokens) == (7, 7, 9, 9)
    assert torch.equal(seen[-1]["perturbation_seeds"], mask_seeds(7, ["1+2?", "2+1?"], "eval"))
    assert (r.n, r.correct, r.accuracy) == (2, 2, 1.0)
    plain = evaluate(lm, recs, plain=True, max_question_tokens=9, **FAST)
    assert (seen[-1]["max_question_tokens"], plain.max_question_tokens) == (None, None)


def test_evaluate_takes_n_latent_0_and_a_model_without_thoughts_answers_with_none(lm, monkeypatch):
    """n_latent=0 is no thought (only None or < 0 is the model's own); a model trained without thoughts (cot,
    no_cot) answers with none in coconut mode, whatever its n_latent."""
    seen: list[dict] = []
    monkeypatch.setattr(ev, "generate_answers", lambda _lm, qs, **kw: seen.append(kw) or ["#### 3"] * len(qs))
    recs = [Record("1+2?", [], "3")]
    monkeypatch.setattr(lm, "settings", replace(lm.settings, n_latent=2))
    assert (evaluate(lm, recs, n_latent=0, **FAST).n_latent, seen[-1]["n_latent"]) == (0, 0)
    assert (evaluate(lm, recs, **FAST).n_latent, seen[-1]["n_latent"]) == (2, 2)
    for mode in ("cot", "no_cot"):
        monkeypatch.setattr(lm, "settings", replace(lm.settings, mode=mode, n_latent=2))
        r = evaluate(lm, recs, **FAST)
        assert (r.n_latent, r.mode, seen[-1]["n_latent"], seen[-1]["mode"]) == (0, mode, 0, "coconut")


def test_prediction_rows_hold_each_records_own_gold_and_a_plain_answer_before_the_next_question(lm, monkeypatch):
    """Each row of predictions.jsonl holds its own record's question and gold answer (the gold could be anything:
    no test read it), and a plain LM's answer is cut before the question it goes on to write, in evaluate and in
    the vote alike."""
    recs = [Record("1+2?", [], "3"), Record("2+2?", [], "4")]
    texts = ["#### 3", "#### 4\n\nQuestion: 1+1?\nAnswer: #### 2"]
    monkeypatch.setattr(ev, "generate_answers", lambda *a, **kw: list(texts))
    r = evaluate(lm, recs, plain=True, **FAST)
    rows = [(p["question"], p["gold"], p["completion"], p["pred"], p["correct"]) for p in r.predictions]
    assert rows == [("1+2?", "3", "#### 3", "3", True), ("2+2?", "4", "#### 4", "4", True)]
    voted = ev.evaluate_mc_vote(lm, recs, LockedDropout(p=0.1), n_masks=1, plain=True, **FAST)
    assert [(p["gold"], p["completion"], p["pred"]) for p in voted.predictions] == [
        ("3", "#### 3", "3"),
        ("4", "#### 4", "4"),
    ]
    assert voted.correct == 2


def shard(dataset: str, questions: list[str], scores: list[float], wall_s: float = 1.0, n: int = 0) -> EvalResult:
    """A shard's result: one row per question with its score (correct when 1); ``n`` (default: the rows) records."""
    rows = [{"question": q, "score": s, "correct": s == 1} for q, s in zip(questions, scores)]
    n = n or len(rows)
    correct = sum(s == 1 for s in scores)
    mean = ev.ordered_mean(scores)
    return EvalResult(dataset, correct / n, n, correct, 0, 0, 0, "coconut", wall_s, mean_score=mean, predictions=rows)


def test_merged_shards_keep_the_rows_in_shard_order_and_the_slowest_wall_time():
    """The merged predictions are shard 0's rows then shard 1's (predictions.jsonl in the data's order), its wall
    time the slowest shard's (each rank runs at once)."""
    merged = merge_results([shard("d", ["q1", "q2"], [1, 0], wall_s=1.0), shard("d", ["q3"], [1], wall_s=3.0)])
    assert [p["question"] for p in merged.predictions] == ["q1", "q2", "q3"]
    assert (merged.n, merged.correct, merged.wall_s) == (3, 2, 3.0)


def test_one_result_given_twice_does_not_merge_but_two_equal_shards_do():
    """``merge_results([a, a])`` doubled a's rows and counts without a word; the same object twice is refused, naming
    the positions. Two shards of equal contents are two shards (a dataset may repeat its questions)."""
    a = shard("d", ["q1", "q2"], [1, 0])
    with pytest.raises(ValueError, match=r"^merge_results: shards 0 and 2 are one result object; give each shard"):
        merge_results([a, shard("d", ["q3"], [1]), a])
    merged = merge_results([a, shard("d", ["q1", "q2"], [1, 0])])
    assert (merged.n, merged.correct, len(merged.predictions)) == (4, 2, 4)


def test_shards_of_two_datasets_do_not_merge():
    """Shards that name different datasets are no shards of one evaluation."""
    with pytest.raises(ValueError, match=r"^merge_results: the shards differ in dataset \('gsm8k', 'svamp'\)"):
        merge_results([shard("gsm8k", ["q1"], [1]), shard("svamp", ["q2"], [0])])


def test_a_shard_whose_rows_are_not_all_its_records_merges_by_its_mean():
    """A shard of n = 4 with 2 rows (made by hand) has no per-record scores: its mean (0.5) weighs 4, not 2
    (merged: (0.5 * 4 + 1) / 5 = 0.6, not the rows' (1 + 0 + 1) / 3)."""
    merged = merge_results([shard("d", ["q1", "q2"], [1, 0], n=4), shard("d", ["q3"], [1])])
    assert merged.mean_score == pytest.approx(0.6)


def test_results_json_is_the_summary_without_the_rows_which_are_in_predictions_jsonl(tmp_path):
    """results.json holds every field but the predictions, one row each of which is a line of predictions.jsonl."""
    import json

    r = shard("d", ["q1", "q2"], [1, 0])
    res.write_results(r, tmp_path)
    summary = json.loads((tmp_path / "results.json").read_text())
    assert "predictions" not in summary and (summary["n"], summary["correct"], summary["accuracy"]) == (2, 1, 0.5)
    lines = (tmp_path / "predictions.jsonl").read_text().splitlines()
    assert [json.loads(x)["question"] for x in lines] == ["q1", "q2"]


def test_a_stop_between_the_two_swaps_leaves_no_results_json_beside_other_predictions(tmp_path, monkeypatch):
    """The earlier results.json goes before the new predictions.jsonl takes its place: a stop between the two swaps
    leaves the new predictions and no results.json, never the earlier results.json beside them."""
    import json
    import os

    res.write_results(shard("d", ["old"], [1]), tmp_path)
    swap, swaps = os.replace, []

    def stopped_at_the_second(src, dst):
        swaps.append(dst)
        if len(swaps) == 2:
            raise KeyboardInterrupt
        swap(src, dst)

    monkeypatch.setattr(res.os, "replace", stopped_at_the_second)
    with pytest.raises(KeyboardInterrupt):
        res.write_results(shard("d", ["new"], [0]), tmp_path)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["predictions.jsonl"]
    assert json.loads((tmp_path / "predictions.jsonl").read_text())["question"] == "new"


def test_the_context_check_measures_every_question_not_the_first(lm):
    """A question past the context after a short one is refused, as it is before one."""
    from dgrpo.config import ConfigError

    past = "%" * 520  # (each '%' a token: past the tiny model's context)
    assert len(lm.tokenizer(past, add_special_tokens=False)["input_ids"]) > lm.context_length
    with pytest.raises(ConfigError, match="the sequence does not fit the model's context"):
        generate_answers(lm, ["1+1?", past], n_latent=0, max_question_tokens=1000, **FAST)


def test_eval_options_take_the_configs_latent_thoughts_and_seed():
    """``eval.n_latent`` and the run's ``seed`` reach evaluate (-1 and 0 in their place passed the suite)."""
    from dgrpo.config import Config

    cfg = Config()
    cfg.eval.n_latent, cfg.seed = 3, 5
    options = ev.eval_options(cfg)
    assert (options["n_latent"], options["seed"]) == (3, 5)


def test_each_datasets_folder_names_the_split_it_was_evaluated_on(tmp_path):
    """``dgrpo eval --data gsm8k svamp --split train`` writes gsm8k_train/ and svamp_train/ (the folders were named
    gsm8k/ and svamp/ whatever the split: a test split's results and a train split's took one folder)."""
    from dgrpo.cli.evaluate import output_dirs

    assert output_dirs(["gsm8k", "svamp"], "train", tmp_path) == {
        "gsm8k": tmp_path / "gsm8k_train",
        "svamp": tmp_path / "svamp_train",
    }
    assert output_dirs(["gsm8k", "svamp"], None, tmp_path) == {"gsm8k": tmp_path / "gsm8k", "svamp": tmp_path / "svamp"}


def test_limit_0_on_the_command_line_evaluates_every_record_whatever_the_config_says(tokenizer, tmp_path):
    """``--limit 0`` (0: all) wins over an ``eval.limit`` of the config or ``--set``, as any other --limit does."""
    import argparse

    from dgrpo.cli.evaluate import _eval_config

    make_lm(tokenizer).save_pretrained(tmp_path / "m")
    given = {"config": [], "overrides": ["eval.limit=5"], "plain": False, "shots": None, "data": ["builtin:test"]}
    given["split"] = None
    for limit, expected in ((0, 0), (3, 3), (None, 5)):
        args = argparse.Namespace(**given, limit=limit, out=str(tmp_path / "out"), model=str(tmp_path / "m"))
        assert _eval_config(args)[0].eval.limit == expected


def test_a_set_whose_records_are_all_shots_is_refused_before_the_model_loads(tmp_path):
    """``--plain --shots 2`` of a 2-record file leaves nothing to evaluate: one line as the data are read (1 shot
    leaves 1 record to evaluate)."""
    import json

    from dgrpo.cli.evaluate import _read_sets
    from dgrpo.config import Config
    from dgrpo.data.records import DataError
    from dgrpo.eval.scoring import numeric

    two = tmp_path / "two.jsonl"
    two.write_text("".join(json.dumps({"question": f"{i}+1?", "answer": str(i + 1)}) + "\n" for i in range(2)))
    cfg = Config()
    cfg.eval.plain, cfg.eval.shots = True, 2
    with pytest.raises(DataError, match=r"nothing to evaluate \(2 records, 2 of them used as shots\)"):
        _read_sets({str(two): tmp_path / "out"}, None, cfg, numeric)
    cfg.eval.shots = 1
    assert len(_read_sets({str(two): tmp_path / "out"}, None, cfg, numeric)[str(two)]) == 2


def test_a_votes_partial_credit_is_its_score_not_a_correct_answer(lm, monkeypatch):
    """In the vote as in evaluate, a scorer's 0.5 is the row's score and no correct answer; a question without a
    vote (its completions empty) is unparseable under the numeric verifier only (``exact`` counts none)."""

    def halves(completions, **kw):
        return [0.5] * len(completions)

    recs = [Record("1+2?", [], "3"), Record("2+2?", [], "4")]
    monkeypatch.setattr(ev, "_perturbed_texts", lambda *a, **k: ["#### 3", "#### 3", "", ""])
    r = ev.evaluate_mc_vote(lm, recs, LockedDropout(p=0.1), n_masks=2, scorer=halves, **FAST)
    assert [(p["correct"], p["score"]) for p in r.predictions] == [(False, 0.5), (False, 0.0)]  # (no vote: 0)
    assert (r.correct, r.accuracy, r.mean_score, r.unparseable) == (0, 0.0, 0.25, 0)
    numeric = ev.evaluate_mc_vote(lm, recs, LockedDropout(p=0.1), n_masks=2, **FAST)
    exact = ev.evaluate_mc_vote(lm, recs, LockedDropout(p=0.1), n_masks=2, scorer="exact", **FAST)
    assert (numeric.correct, numeric.unparseable, exact.correct, exact.unparseable) == (1, 1, 1, 0)


def test_empty_shards_merge_to_what_one_process_gives_for_no_record(lm):
    """Shards of no record (a test set smaller than the ranks' count) merge to one process's result of none: a
    mean score of 0.0, not None."""
    none = evaluate(lm, [], **FAST)
    merged = merge_results([none, evaluate(lm, [], **FAST)])
    assert (merged.n, merged.accuracy, merged.mean_score) == (0, 0.0, none.mean_score) == (0, 0.0, 0.0)


def test_split_replaces_the_split_a_dataset_or_a_file_names(tmp_path):
    """Results name what was evaluated: ``--split`` in place of the split a name or a file path gives
    (``a.jsonl:test --split train`` is ``a.jsonl:train``, not ``a.jsonl:test:train``)."""
    from dgrpo.cli.evaluate import dataset_label

    file = tmp_path / "a.jsonl"
    file.write_text("")
    assert dataset_label(f"{file}:test", "train") == dataset_label(str(file), "train") == f"{file}:train"
    assert (dataset_label("gsm8k:test", "train"), dataset_label("gsm8k", None)) == ("gsm8k:train", "gsm8k")


def test_a_plug_in_or_exact_scorers_pred_is_the_final_answer_without_its_spaces(lm, monkeypatch):
    """Under ``exact`` (and a plug-in) a row's pred is the text after the last ``#``, stripped (``#### Tom `` ->
    ``Tom``, as the scorer compares it)."""
    monkeypatch.setattr(ev, "generate_answers", lambda *a, **kw: ["#### Tom \n", "I think #### Ann"])
    r = evaluate(lm, [Record("Who?", [], "Tom"), Record("Who?", [], "Bob")], scorer="exact", **FAST)
    assert [(p["pred"], p["correct"]) for p in r.predictions] == [("Tom", True), ("Ann", False)]
