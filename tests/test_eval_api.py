"""Argument checks of :mod:`dgrpo.eval.evaluate` called from Python (no training: an untrained tiny model)."""

import subprocess
import sys
from dataclasses import replace

import pytest

from dgrpo.eval.evaluate import EvalResult, evaluate, evaluate_mc_vote, generate_answers, warn_if_questions_cut
from dgrpo.eval.results import merge_results, write_results
from dgrpo.perturbation import LockedDropout

from conftest import make_lm

FAST = {"max_new_tokens": 2, "progress": False}


@pytest.fixture(scope="module")
def lm(tokenizer):
    return make_lm(tokenizer)


def test_a_negative_max_question_tokens_is_refused(lm, task_records):
    """-1 dropped each question's first token (ids[-max_tokens:] is ids[1:]) without a word; 0 and None still
    mean no truncation."""
    recs = task_records[:2]
    calls = {
        "evaluate": lambda: evaluate(lm, recs, max_question_tokens=-1, **FAST),
        "evaluate_mc_vote": lambda: evaluate_mc_vote(
            lm, recs, LockedDropout(p=0.1), n_masks=1, max_question_tokens=-1, **FAST
        ),
        "generate_answers": lambda: generate_answers(lm, ["q"], n_latent=0, max_question_tokens=-1, **FAST),
    }
    for what, call in calls.items():
        with pytest.raises(ValueError, match=rf"^{what}: max_question_tokens must be an int >= 0 or None .*got -1$"):
            call()
    whole = evaluate(lm, recs, **FAST).predictions
    assert evaluate(lm, recs, max_question_tokens=0, **FAST).predictions == whole


def test_questions_cut_to_max_question_tokens_are_counted_in_a_warning(lm, task_records):
    """data.max_question_tokens cuts a question to its last tokens (its beginning, where a word problem states its
    facts, never reaches the model): 392 of GSM8K's 1319 test questions under the default 256 with a small
    tokenizer, without a word. Eval and both trainers say how many."""
    from dgrpo.config import Config, load_config
    from dgrpo.training.grpo import GRPOTrainer

    recs = task_records[:6]
    longest = max(len(ids) for ids in lm.token_ids([lm.format_question(r.question) for r in recs]))
    cut = lm.count_cut_questions([r.question for r in recs], longest - 1)
    assert cut >= 1 and lm.count_cut_questions([r.question for r in recs], longest) == 0
    assert lm.count_cut_questions([r.question for r in recs], 0) == 0  # 0: no limit
    with pytest.warns(UserWarning, match=rf"^{cut} of 6 evaluated questions are longer than data.max_question_tokens"):
        evaluate(lm, recs, max_question_tokens=longest - 1, **FAST)
    cfg = load_config(Config, "tiny.yaml", [f"data.max_question_tokens={longest - 1}"])
    with pytest.warns(UserWarning, match=rf"{cut} of 6 training questions are longer .* set it to 0 for no limit"):
        GRPOTrainer(lm, cfg, recs)
    questions = [r.question for r in recs] * 2  # (a large training set: evenly spaced ones are checked)
    with pytest.warns(UserWarning, match=r"of 4 training questions \(checked: 4, evenly spaced over 12\) are longer"):
        assert warn_if_questions_cut(lm, questions, longest - 1, "training", check_at_most=4) >= 1


def test_each_dataset_with_questions_cut_gets_its_own_warning(lm, task_records):
    """The warning about questions cut names the dataset: two datasets with the same count of questions cut (dgrpo
    eval --data gsm8k gsm8k_aug --limit 5) gave one warning, naming neither, Python showing a repeated one once."""
    import warnings

    recs = task_records[:6]
    longest = max(len(ids) for ids in lm.token_ids([lm.format_question(r.question) for r in recs]))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("default")  # (Python's own: a message repeated from one place is shown once)
        for name in ("first", "second"):
            evaluate(lm, recs, dataset=name, max_question_tokens=longest - 1, **FAST)
        evaluate_mc_vote(
            lm, recs, LockedDropout(p=0.1), n_masks=1, dataset="third", max_question_tokens=longest - 1, **FAST
        )
    cut = [str(w.message) for w in seen if "are longer than data.max_question_tokens" in str(w.message)]
    assert [m.split(" are longer")[0].rpartition(" of ")[2] for m in cut] == ["first", "second", "third"]


def test_plain_shots_must_leave_a_record_and_need_plain(lm, task_records):
    """shots=10 of 6 records evaluated nothing (n=0, accuracy 0.0); shots without plain=True were dropped (the
    result said shots=0)."""
    recs = task_records[:6]
    with pytest.raises(ValueError, match=r"^evaluate: shots=10 leave no record to evaluate \(6 records\); give more"):
        evaluate(lm, recs, plain=True, shots=10, **FAST)
    with pytest.raises(ValueError, match=r"shots=6 leave no record to evaluate \(6 records\)"):
        evaluate(lm, recs, plain=True, shots=6, **FAST)
    with pytest.raises(ValueError, match=r"^evaluate: shots=2 apply to plain=True prompts only; pass plain=True or"):
        evaluate(lm, recs, shots=2, **FAST)
    r = evaluate(lm, recs, plain=True, shots=5, **FAST)
    assert (r.n, r.shots, r.mode) == (1, 5, "plain")


def result(n: int, correct: int, **settings) -> EvalResult:
    base = {"dataset": "d", "seed": 0, "n_latent": 2, "mode": "coconut", "wall_s": 1.0}
    preds = [{"correct": i < correct} for i in range(n)]
    return EvalResult(
        accuracy=correct / n, n=n, correct=correct, unparseable=0, predictions=preds, **{**base, **settings}
    )


def test_merge_results_refuses_no_shard_and_shards_of_different_evaluations():
    """[] was an IndexError; shards of another n_latent or decoding were merged under the first shard's settings."""
    merged = merge_results([result(3, 1), result(1, 1)])
    assert (merged.n, merged.correct, merged.accuracy, len(merged.predictions)) == (4, 2, 0.5, 4)
    with pytest.raises(ValueError, match=r"^merge_results: no results to merge \(an empty list\)"):
        merge_results([])
    with pytest.raises(ValueError, match=r"^merge_results: the shards differ in n_latent \(2, 1\); merge shards of"):
        merge_results([result(3, 1), result(1, 1, n_latent=1)])
    with pytest.raises(ValueError, match=r"differ in scorer \('numeric', 'exact'\); temperature \(1.0, 0.0\); merge"):
        merge_results([result(3, 1, temperature=1.0), result(1, 1), result(1, 0, scorer="exact")])


def test_merged_shards_give_the_mean_score_of_one_process_bit_for_bit():
    """The merged mean score was the shards' means weighted by their sizes: scores 0.1, 0.2, 0.3 gave 0.2 in one
    process and 0.19999999999999998 from shards of 1 and 2 (dgrpo eval under torchrun against one process). It is
    summed from the predictions' scores, in order; shards without them (made by hand) still merge by their means."""

    def scored(values: list[float]) -> EvalResult:
        r = result(len(values), 0)
        for row, v in zip(r.predictions, values):
            row["score"] = v
        return replace(r, mean_score=sum(values) / len(values))

    values = [0.1, 0.2, 0.3]
    assert sum(values[1:]) / 2 * 2 + values[0] != sum(values)  # (the case: the weighted means differ in the last bit)
    assert merge_results([scored(values[:1]), scored(values[1:])]).mean_score == scored(values).mean_score
    by_hand = [replace(result(1, 0), mean_score=0.5), replace(result(3, 0), mean_score=0.25)]
    assert merge_results(by_hand).mean_score == pytest.approx(0.3125)


def test_a_text_gold_under_the_numeric_scorer_is_predicted_as_it_is_scored(lm, monkeypatch):
    """The numeric verifier compares a text gold's final text: its row said pred null and counted as unparseable
    while correct (results.json and predictions.jsonl disagreed)."""
    import dgrpo.eval.evaluate as ev
    from dgrpo.data.records import Record

    recs = [Record("Who?", [], "Tom"), Record("2+1?", [], "3"), Record("2+2?", [], "4")]
    monkeypatch.setattr(ev, "generate_answers", lambda *a, **kw: ["#### Tom", "#### 3", "no idea"])
    r = evaluate(lm, recs, **FAST)
    assert [(p["pred"], p["correct"]) for p in r.predictions] == [("Tom", True), ("3", True), (None, False)]
    assert (r.correct, r.unparseable) == (2, 1)


def test_a_choice_answer_is_predicted_as_the_letter_it_is_scored_by(lm, monkeypatch):
    """Under the choice scorer a row's pred is the letter the scorer compares (predictions.jsonl showed the whole
    sentence, "The answer is (B).", where evaluate_mc_vote's rows show the letter)."""
    import dgrpo.eval.evaluate as ev
    from dgrpo.data.records import Record

    recs = [Record("Which?", [], "B"), Record("Which?", [], "C"), Record("Which?", [], "A")]
    monkeypatch.setattr(ev, "generate_answers", lambda *a, **kw: ["The answer is (B).", "#### D, not C", "no idea"])
    r = evaluate(lm, recs, scorer="choice", **FAST)
    assert [(p["pred"], p["correct"]) for p in r.predictions] == [("B", True), ("D", False), (None, False)]


def test_the_context_check_takes_the_longest_question_in_tokens(lm):
    """The check measured the question with the most characters: a question past the context was answered without a
    word when a longer-worded, shorter-tokenized one sat beside it."""
    from dgrpo.config import ConfigError
    from dgrpo.data.records import Record

    long_in_tokens, long_in_characters = "%" * 520, "Start with 3. " * 42
    sizes = [len(lm.tokenizer(q, add_special_tokens=False)["input_ids"]) for q in (long_in_tokens, long_in_characters)]
    assert len(long_in_tokens) < len(long_in_characters) and sizes[0] > lm.context_length > sizes[1]  # (the setting)
    records = [Record(long_in_tokens, [], "1"), Record(long_in_characters, [], "1")]
    for call in (
        lambda: evaluate(lm, records, max_question_tokens=1000, **FAST),
        lambda: generate_answers(lm, [r.question for r in records], n_latent=0, max_question_tokens=1000, **FAST),
    ):
        with pytest.raises(ConfigError, match="the sequence does not fit the model's context"):
            call()


def test_evaluation_leaves_every_module_in_the_mode_it_had(tokenizer, task_records, tmp_path):
    """evaluate put the wrapper's mode back on every module: a model loaded in eval mode (LatentLM.__init__ left the
    wrapper in train mode) came out with every module in train mode, and a GPT-2's own dropout then made greedy
    generation and scoring random."""
    import torch

    from dgrpo.model.latent_lm import LatentLM

    make_lm(tokenizer, arch="gpt2").save_pretrained(tmp_path / "m")
    lm = LatentLM.from_pretrained(tmp_path / "m")
    assert not any(m.training for m in lm.modules())  # as transformers loads a model
    for m in lm.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.5  # (hub GPT-2 configs have 0.1; the tiny one 0)
    ids, mask = lm.encode_questions([r.question for r in task_records[:2]])
    first = lm.generate(ids, mask, n_latent=1, max_new_tokens=4).logprobs
    evaluate(lm, task_records[:2], n_latent=1, **FAST)
    assert not any(m.training for m in lm.modules())
    assert torch.equal(lm.generate(ids, mask, n_latent=1, max_new_tokens=4).logprobs, first)
    lm.train()
    lm.model.transformer.drop.eval()  # mixed modes come back as they were, after an error too
    evaluate(lm, task_records[:2], n_latent=1, **FAST)
    assert not lm.model.transformer.drop.training and lm.model.transformer.h[0].training and lm.training

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    lm.generate = interrupted
    with pytest.raises(KeyboardInterrupt):
        evaluate(lm, task_records[:2], n_latent=1, **FAST)
    assert not lm.model.transformer.drop.training and lm.model.transformer.h[0].training and lm.training


def test_records_that_are_not_records_are_one_line_naming_what_they_are(lm, tmp_path):
    """evaluate(lm, ["text"]) was an AttributeError deep inside; train_grpo's message did not say what the list held;
    write_results took a Path only."""
    from dgrpo.data.records import Record

    with pytest.raises(
        ValueError,
        match=r"evaluate: records must be a list of dgrpo Records, got a list of 1 holding "
        r"str items \('what is 2\+2\?'\); make them with dgrpo.data.Record",
    ):
        evaluate(lm, ["what is 2+2?"], **FAST)
    with pytest.raises(ValueError, match="got a list of 1 holding dict items"):
        evaluate(lm, [{"question": "1+1", "answer": "2"}], **FAST)
    r = evaluate(lm, [Record(question="1+1", steps=[], answer="2")], n_latent=0, **FAST)
    write_results(r, str(tmp_path / "out"))  # a str path too
    assert (tmp_path / "out" / "results.json").is_file()


def test_the_vote_and_the_answers_check_what_they_are_given_as_evaluate_does(lm, task_records):
    """evaluate_mc_vote took no look at its records (dicts: 'dict' object has no attribute 'question'; a tuple ran,
    which evaluate refuses), a missing perturbation said "perturbation_seeds without a perturbation" (none was
    given), n_masks=2.5 was a TypeError of range(); the HF model or a checkpoint path as ``lm`` (TRL's habit) was an
    AttributeError ('settings') in each of the three; generate_answers answered each character of one string."""
    recs, pert = task_records[:2], LockedDropout(p=0.1)
    rows = [{"question": r.question, "answer": r.answer} for r in recs]
    with pytest.raises(ValueError, match="evaluate_mc_vote: records must be a list of dgrpo Records, got a list of 2"):
        evaluate_mc_vote(lm, rows, pert, n_masks=1, **FAST)
    with pytest.raises(ValueError, match="evaluate_mc_vote: records must be a list of dgrpo Records, got tuple"):
        evaluate_mc_vote(lm, tuple(recs), pert, n_masks=1, **FAST)
    with pytest.raises(TypeError, match="evaluate_mc_vote: perturbation must be a dgrpo Perturbation.*got NoneType"):
        evaluate_mc_vote(lm, recs, None, n_masks=1, **FAST)
    with pytest.raises(ValueError, match=r"evaluate_mc_vote: n_masks must be an int >= 1 .*got 2.5"):
        evaluate_mc_vote(lm, recs, pert, n_masks=2.5, **FAST)
    for what, call in {
        "evaluate": lambda m: evaluate(m, recs, **FAST),
        "evaluate_mc_vote": lambda m: evaluate_mc_vote(m, recs, pert, n_masks=1, **FAST),
        "generate_answers": lambda m: generate_answers(m, ["q"], n_latent=0, **FAST),
    }.items():
        for wrong in (lm.model, "runs/sft/final"):
            with pytest.raises(TypeError, match=rf"^{what}: lm must be a dgrpo LatentLM .*got {type(wrong).__name__}$"):
                call(wrong)
    with pytest.raises(TypeError, match=r"generate_answers: questions must be a list of strings, got str \(one"):
        generate_answers(lm, "what is 2+2?", n_latent=0, **FAST)
    assert evaluate_mc_vote(lm, [], pert, n_masks=1, **FAST).n == 0  # (an empty list still is: a rank's empty shard)


def test_n_latent_is_the_models_own_when_none_and_an_int_otherwise(lm, task_records):
    """generate_answers required n_latent and None was a TypeError deep in the context check (generate takes None as
    the model's own); n_latent=2.0 was a TypeError of range() in the latent steps."""
    qs = [r.question for r in task_records[:2]]
    own = generate_answers(lm, qs, n_latent=lm.settings.n_latent, **FAST)
    assert generate_answers(lm, qs, **FAST) == generate_answers(lm, qs, n_latent=None, **FAST) == own
    with pytest.raises(ValueError, match=r"^generate_answers: n_latent must be an int >= 0 .*got -1$"):
        generate_answers(lm, qs, n_latent=-1, **FAST)
    with pytest.raises(
        ValueError, match=r"^evaluate: n_latent must be an int \(None or < 0: the model's own\), got 2.0$"
    ):
        evaluate(lm, task_records[:2], n_latent=2.0, **FAST)


def _mc_voted(lm, monkeypatch, records, texts, **kw):
    """evaluate_mc_vote of ``records`` whose perturbed completions are ``texts`` (question-major)."""
    import dgrpo.eval.evaluate as ev

    monkeypatch.setattr(ev, "_perturbed_texts", lambda *a, **k: list(texts))
    return evaluate_mc_vote(lm, records, LockedDropout(p=0.1), progress=False, **kw)


def test_mc_votes_group_numbers_as_the_verifier_compares_them(lm, monkeypatch):
    """``2.33``, ``2.333`` and ``2.3333`` are one answer to the verifier (each scores 1 for 7/3), so they vote together
    (they were three answers, and two 5s outvoted them); numbers it tells apart stay apart (2.3 and 2.33, 18 and
    18.5); a program's float noise joins its integer."""
    from dgrpo.data.records import Record
    from dgrpo.eval.evaluate import majority_vote
    from dgrpo.reward import numbers_agree

    recs = [Record("7/3?", [], "2.3333333333333335"), Record("q", [], "18"), Record("r", [], "3431580")]
    texts = ["#### 2.33", "#### 5", "#### 2.333", "#### 5", "#### 2.3333"]
    texts += ["#### 18.5", "#### 18", "#### 18.5", "#### 18", "#### 18"]
    texts += ["#### 7", "#### 3431579.9999999995", "#### 9", "#### 3431580", "#### 5"]
    r = _mc_voted(lm, monkeypatch, recs, texts, n_masks=5)
    assert [(p["pred"], p["correct"]) for p in r.predictions] == [
        ("2.33", True),
        ("18", True),
        ("3431579.9999999995", True),
    ]
    assert r.predictions[0]["votes"] == ["2.33", "5", "2.333", "5", "2.3333"]  # (each as it was written)
    assert majority_vote(["2.3", "2.33", "2.3", "2.33", "2.33"], numbers_agree) == "2.33"
    assert majority_vote(["2.33", "2.333"]) == "2.33"  # (without a grouping: equal strings; a tie, the first)
    # agreement is not transitive: no vote order decides (0.13, wrong for 0.12456, agrees with 0.125; 2.335 with both)
    for votes in (["0.13", "0.125", "0.125"], ["0.125", "0.13", "0.125"], ["0.125", "0.125", "0.13"]):
        assert majority_vote(votes, numbers_agree) == "0.125"
    for votes in (["2.34", "2.33", "2.335", "2.335"], ["2.335", "2.34", "2.33", "2.335"], ["2.33", "2.34", "2.335"]):
        assert majority_vote(votes, numbers_agree) == "2.335"
    assert majority_vote(["5", "7", "7", "3.0000000001", "3"], numbers_agree) == "7"  # (two clusters of 2: 7 twice)


def test_a_vote_for_a_number_scores_it_as_the_verifier_credits_most_widely_whatever_the_order(lm, monkeypatch):
    """``36`` and ``36.00`` are one vote, but the verifier credits ``36.00`` to 2 decimals (right for 36.0000102016,
    ``36`` wrong), and ``2.33`` is right for 7/3 but ``2.330`` wrong: the first completion of the vote was scored, so
    the order of the masks decided the question."""
    from dgrpo.data.records import Record

    recs = [Record("q", [], "36.0000102016"), Record("7/3", [], "2.3333333333333335")]
    for order in (slice(None), slice(None, None, -1)):
        texts = ["#### 36.00", "#### 36", "#### 7"][order] + ["#### 2.33", "#### 2.330", "#### 7"][order]
        r = _mc_voted(lm, monkeypatch, recs, texts, n_masks=3)
        assert [(p["pred"], p["completion"]) for p in r.predictions] == [("36", "#### 36.00"), ("2.33", "#### 2.33")]
        assert r.correct == 2  # (the decimals the verifier credits most widely: 2 or more, the fewest)


def test_a_scorer_in_trls_form_gets_every_column_in_a_vote_and_on_a_shard(lm, monkeypatch):
    """Records made in Python need not share their ``meta`` keys. A vote scored only the records with a vote, so a
    scorer taking a column that only a record without a vote had was called in dgrpo's form (its ``unit`` got the
    records); a shard is told the whole data's columns. The caller's records are not changed."""
    import dgrpo.eval.evaluate as ev
    from dgrpo.data.records import Record

    seen = []

    def per_unit(completions, unit, **kw):
        seen.append(list(unit))
        return [1.0] * len(completions)

    recs = [Record("q1", [], "5", {"unit": "kg"}), Record("q2", [], "7")]
    r = _mc_voted(lm, monkeypatch, recs, ["", "", "#### 7", "#### 7"], n_masks=2, scorer=per_unit)
    assert (seen, r.correct) == ([["kg", "kg", None, None]], 1)  # (every mask's completion scored: pass@k)
    monkeypatch.setattr(ev, "generate_answers", lambda *a, **kw: ["#### 7"])
    assert evaluate(lm, recs[1:], scorer=per_unit, columns=("unit",), **FAST).correct == 1
    assert seen[-1] == [None] and recs[1].meta == {}


def test_a_ranks_shard_of_a_test_set_is_scored_with_the_whole_datas_columns(lm, monkeypatch):
    """The training commands' test sets (and dgrpo eval under torchrun) give each rank a shard: a TRL-form scorer
    taking a column that only another rank's records had was called in dgrpo's form on this rank (its ``unit`` got
    the records), while the validation set's shards were told the whole data's columns."""
    import dgrpo.eval.evaluate as ev
    from dgrpo.cli.common import evaluate_shards
    from dgrpo.data.records import Record

    class SecondRankOfTwo:  # (its peer's part left out of the gather: this rank's result is what is checked)
        active, is_main = True, False

        def shard(self, items):
            return items[len(items) // 2 :]

        def all_gather_objects(self, obj):
            return [obj]

    seen = []

    def per_unit(completions, unit, **kw):
        seen.append(list(unit))
        return [1.0] * len(completions)

    monkeypatch.setattr(ev, "generate_answers", lambda *a, **kw: ["#### 7"])
    recs = [Record("q1", [], "5", {"unit": "kg"}), Record("q2", [], "7")]
    r = evaluate_shards(lm, recs, SecondRankOfTwo(), limit=2, scorer=per_unit, **FAST)
    assert (r.n, r.correct, r.limit, seen) == (1, 1, 2, [[None]])


def test_results_are_written_whole_or_not_at_all(lm, task_records, tmp_path, monkeypatch):
    """results.json was written first, then predictions.jsonl row by row: a stop in between (SIGTERM, Ctrl-C) left a
    results.json beside no predictions, or beside an earlier evaluation's. Both are written under temporary names, and
    results.json takes its place last: a stop leaves the earlier pair whole (or no results.json), no temporary file."""
    import json

    import dgrpo.eval.results as res

    out = tmp_path / "out"
    first, second = (evaluate(lm, task_records[i : i + 2], n_latent=0, **FAST) for i in (0, 2))
    write_results(first, out)
    dumps = json.dumps

    def stopped_at_the_last_prediction(obj, **kw):
        if obj is second.predictions[-1]:
            raise KeyboardInterrupt
        return dumps(obj, **kw)

    monkeypatch.setattr(res.json, "dumps", stopped_at_the_last_prediction)
    with pytest.raises(KeyboardInterrupt):
        write_results(second, out)
    monkeypatch.undo()
    assert sorted(p.name for p in out.iterdir()) == ["predictions.jsonl", "results.json"]
    assert [json.loads(x) for x in (out / "predictions.jsonl").read_text().splitlines()] == first.predictions
    assert json.loads((out / "results.json").read_text()) == first.summary()
    ended = subprocess.Popen([sys.executable, "-c", ""])
    ended.wait()
    (out / f".tmp-predictions.jsonl-{ended.pid}").write_text("{")  # (a SIGKILLed write: the next removes it)
    write_results(second, out)
    assert json.loads((out / "results.json").read_text()) == second.summary()
    assert len((out / "predictions.jsonl").read_text().splitlines()) == len(second.predictions)
    assert sorted(p.name for p in out.iterdir()) == ["predictions.jsonl", "results.json"]


@pytest.mark.slow
def test_two_writes_into_one_folder_take_turns_at_the_swap(lm, task_records, tmp_path):
    """Two processes writing results into one folder: their renames interleaved, and the folder could hold one's
    results.json beside the other's predictions.jsonl. The swap holds a lock on the folder."""
    import fcntl
    import os
    import threading

    out = tmp_path / "out"
    out.mkdir()
    result = evaluate(lm, task_records[:2], n_latent=0, **FAST)
    other = os.open(out, os.O_RDONLY)  # (another writer, at its swap)
    fcntl.flock(other, fcntl.LOCK_EX)
    writer = threading.Thread(target=write_results, args=(result, out))
    writer.start()
    writer.join(timeout=1.0)
    assert writer.is_alive() and not (out / "results.json").exists()  # (waits its turn)
    os.close(other)
    writer.join(timeout=30)
    assert (out / "results.json").exists() and (out / "predictions.jsonl").exists()


def test_results_are_written_where_the_file_system_takes_no_lock(lm, task_records, tmp_path, monkeypatch):
    """NFS refuses a lock on a directory (EBADF), Lustre without its flock option has none (ENOSYS): the results
    are written as before the lock, not refused with a traceback."""
    import errno
    import json
    import os

    import dgrpo.eval.results as res

    result = evaluate(lm, task_records[:2], n_latent=0, **FAST)
    for code in (errno.EBADF, errno.ENOSYS):

        def refused(fd, op, code=code):
            raise OSError(code, os.strerror(code))

        monkeypatch.setattr(res.fcntl, "flock", refused)
        write_results(result, tmp_path / str(code))
        assert json.loads((tmp_path / str(code) / "results.json").read_text()) == result.summary()


def test_a_write_leaves_the_temporary_files_of_a_process_still_writing(lm, task_records, tmp_path):
    """Every earlier ``.tmp-`` file in the folder was removed, also that of another process writing there at that
    moment (two evaluations into one folder): its rename then failed. Only those of ended processes are removed."""
    out = tmp_path / "out"
    result = evaluate(lm, task_records[:2], n_latent=0, **FAST)
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) as writer:
        try:
            theirs = out / f".tmp-results.json-{writer.pid}"
            out.mkdir()
            theirs.write_text("{")
            write_results(result, out)
            assert theirs.exists()
        finally:
            writer.kill()


def test_a_plain_lms_answer_keeps_its_paragraphs_and_stops_at_the_next_question():
    """The cut at the first blank line lost the answer of reasoning written in paragraphs (10/10 scored 0), and a
    completion opening with a blank line was cut to nothing."""
    from dgrpo.eval.evaluate import _cut_plain

    assert _cut_plain(" Let us think.\n\nThe answer is 7.") == " Let us think.\n\nThe answer is 7."
    assert _cut_plain("\n\nThe answer is 7.") == "\n\nThe answer is 7."
    assert _cut_plain(" 3 + 4 = 7. The answer is 7.\n\nQuestion: Tom has 2 apples") == " 3 + 4 = 7. The answer is 7."
    assert _cut_plain(" The answer is 7.\nQuestion: next") == " The answer is 7."


def test_tqdm_disable_turns_the_evaluation_bar_off(lm, task_records, capsys, monkeypatch):
    """TQDM_DISABLE=1 (tqdm's own switch, which users set in batch jobs) was ignored: dgrpo passes ``disable=False``
    explicitly, and tqdm reads the variable only for bars left at the default."""
    recs = task_records[:2]
    for value in ("1", "true", "YES"):
        monkeypatch.setenv("TQDM_DISABLE", value)
        evaluate(lm, recs, max_new_tokens=2, progress=True)
        assert capsys.readouterr().err == ""
    monkeypatch.setenv("TQDM_DISABLE", "0")
    evaluate(lm, recs, max_new_tokens=2, progress=True)
    assert "%|" in capsys.readouterr().err


def test_the_vote_takes_n_latent_limit_plain_and_shots_as_evaluate_does(lm, task_records, monkeypatch):
    """evaluate_mc_vote took neither n_latent (always the model's own) nor limit, plain or shots: a vote over the
    first 100 records with 2 thoughts could not be asked for as evaluate is asked."""
    import dgrpo.eval.evaluate as ev

    seen: list[dict] = []
    answers = ev.generate_answers
    monkeypatch.setattr(ev, "generate_answers", lambda *a, **k: seen.append(k) or answers(*a, **k))
    recs, pert = task_records[:3], LockedDropout(p=0.1)
    r = evaluate_mc_vote(lm, recs, pert, n_masks=2, n_latent=lm.settings.n_latent + 1, limit=2, **FAST)
    assert (r.n, r.limit, r.n_latent, len(r.predictions)) == (2, 2, lm.settings.n_latent + 1, 2)
    assert seen[-1]["n_latent"] == lm.settings.n_latent + 1 and len(seen[-1]["perturbation_seeds"]) == 4
    own = evaluate_mc_vote(lm, recs, pert, n_masks=2, n_latent=-1, **FAST)  # (< 0: the model's own, as evaluate)
    assert own.n_latent == lm.settings.n_latent and own.n == 3
    p = evaluate_mc_vote(lm, recs, pert, n_masks=2, plain=True, shots=1, **FAST)
    assert (p.mode, p.shots, p.n, p.n_latent) == ("plain+mc2", 1, 2, 0)
    assert (seen[-1]["markers"], seen[-1]["mode"], seen[-1]["n_latent"]) == (False, "plain", 0)
    with pytest.raises(ValueError, match=r"^evaluate_mc_vote: n_latent must be an int .*got 2.0$"):
        evaluate_mc_vote(lm, recs, pert, n_latent=2.0, **FAST)
    with pytest.raises(ValueError, match=r"^evaluate_mc_vote: limit must be an int >= 0 .*got -1$"):
        evaluate_mc_vote(lm, recs, pert, limit=-1, **FAST)
    with pytest.raises(ValueError, match=r"^evaluate_mc_vote: shots=1 apply to plain=True prompts only"):
        evaluate_mc_vote(lm, recs, pert, shots=1, **FAST)


def test_the_vote_samples_at_a_temperature_each_copy_from_its_own_seed(lm, task_records, monkeypatch):
    """evaluate_mc_vote took no temperature (``**eval_options(cfg)`` was a TypeError), unlike evaluate. Sampled,
    each copy draws from its own seed: under masks that change nothing (p = 0) the copies of a question differ (one
    seed per question gave every copy the same tokens); greedy, the vote is what it was without the argument."""
    import torch

    import dgrpo.eval.evaluate as ev
    from dgrpo.config import Config, load_config
    from dgrpo.eval.evaluate import eval_options

    drawn: list[list[str]] = []
    real = ev.generate_answers
    monkeypatch.setattr(ev, "generate_answers", lambda *a, **k: drawn.append(real(*a, **k)) or drawn[-1])
    recs, same, k = task_records[:3], LockedDropout(p=0.0), {"n_masks": 4, "max_new_tokens": 6, "progress": False}
    greedy = evaluate_mc_vote(lm, recs, same, **k)
    assert evaluate_mc_vote(lm, recs, same, temperature=0.0, **k).predictions == greedy.predictions
    assert all(len(set(drawn[-1][4 * j : 4 * j + 4])) == 1 for j in range(3))  # (no mask, no sampling: one answer)
    sampled = evaluate_mc_vote(lm, recs, same, temperature=1.0, **k)
    copies = [drawn[-1][4 * j : 4 * j + 4] for j in range(3)]
    assert all(len(set(c)) == 4 for c in copies) and sampled.temperature == 1.0, copies
    assert [p["completion"] for p in sampled.predictions] != [p["completion"] for p in greedy.predictions]
    assert evaluate_mc_vote(lm, recs, same, temperature=1.0, **k).predictions == sampled.predictions
    assert evaluate_mc_vote(lm, recs[1:], same, temperature=1.0, **k).predictions == sampled.predictions[1:]
    options = {**eval_options(load_config(Config, "tiny.yaml", ["eval.temperature=0.7"])), "max_new_tokens": 6}
    assert evaluate_mc_vote(lm, recs, same, n_masks=2, progress=False, **options).temperature == 0.7
    with pytest.raises(ValueError, match=r"^generate_answers: 2 sampling_seeds for 1 questions$"):
        generate_answers(lm, ["q"], n_latent=0, temperature=1.0, sampling_seeds=torch.tensor([1, 2]), **FAST)


def test_a_prompt_past_the_context_names_the_option_that_shortens_it(lm):
    """A plain prompt without shots was told to "lower eval.shots" (it has none; max_question_tokens does not cut a
    plain prompt), and so was a checkpoint without latent markers evaluated as trained (an imported Coconut CoT
    stage), whose questions data.max_question_tokens does cut: each now names what shortens its own prompt."""
    import copy

    from dgrpo.config import ConfigError
    from dgrpo.data.records import Record

    records = [Record("Start with 3. " * 30, [], "1") for _ in range(3)]  # (~120 tokens each, a context of 512)
    long_answer = {"max_new_tokens": 500, "progress": False}
    with pytest.raises(ConfigError, match=r"\(eval.max_new_tokens = 500\) = \d+; lower eval.max_new_tokens$"):
        evaluate(lm, records, plain=True, **long_answer)
    with pytest.raises(ConfigError, match=r"; lower eval.max_new_tokens or eval.shots$"):
        evaluate(lm, records, plain=True, shots=1, **long_answer)
    with pytest.raises(ConfigError, match=r"; lower eval.max_new_tokens$"):
        evaluate_mc_vote(lm, records, LockedDropout(0.1), n_masks=2, plain=True, **long_answer)
    no_markers = copy.copy(lm)
    no_markers.settings = replace(lm.settings, mode="cot", n_latent=0, markers=False)
    with pytest.raises(
        ConfigError,
        match=r"prompt \(\d+ tokens\) \+ answer .*; lower eval.max_new_tokens or "
        r"data.max_question_tokens$",
    ):
        evaluate(no_markers, records, **long_answer)


def test_merged_mean_score_reads_rows_scores_only_where_they_are_each_shards_mean():
    """Merging shards whose rows were scored 87.0 for a mean_score of 0.87 gave 87.0; and a scorer's ints beside
    its floats (1, 0.5) were merged from the shards' means, 0.4666666666666666 where one process has
    0.46666666666666673. Rows count only where their mean is the shard's mean score; ints read as floats."""

    def shard(rows: list, mean: float) -> EvalResult:
        return EvalResult("v", 0.0, len(rows), 0, 0, 0, 0, "coconut", 0.0, mean_score=mean, predictions=rows)

    percent = [shard([{"score": 87.0}] * 2, 0.87) for _ in range(2)]
    assert merge_results(percent).mean_score == 0.87
    values = [0, 0.3, 0, 0.7, 0.25, 1, 0.25, 0.7, 0.5, 0.7, 0.5, 0.7]
    rows = [{"score": v} for v in values]
    one = sum(float(v) for v in values) / len(values)
    assert one == 0.46666666666666673
    halves = [shard(rows[:6], sum(values[:6]) / 6), shard(rows[6:], sum(values[6:]) / 6)]
    assert merge_results(halves).mean_score == one
