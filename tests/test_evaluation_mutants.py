"""A second pass of mutation testing over :mod:`dgrpo.eval.evaluate`: what would silently change a reported number (a
row answered under another row's seed or in a batch its perturbation cannot bind, a plain prompt without its shots,
a wrong mean score, shards of different evaluations merged) or leave a results folder half written (a swap without
an exclusive lock, a missing lock refused). Each test kills a change of the source that the suite passed."""

from types import SimpleNamespace

import pytest
import torch

import dgrpo.eval.evaluate as ev
import dgrpo.eval.results as res
from dgrpo.data.records import Record
from dgrpo.eval.evaluate import generate_answers, question_seeds
from dgrpo.perturbation import LockedDropout
from dgrpo.perturbation.base import row_sampling_uniforms
from dgrpo.perturbation.native import NativeDropout

from conftest import make_lm

FAST = {"max_new_tokens": 2, "progress": False}


@pytest.fixture
def lm(tokenizer):
    return make_lm(tokenizer)


class Spy:
    """Stands in for ``lm``'s encode_questions / generate / decode: question i is the one token i; each generate
    call's rows and keyword arguments are kept; the answer to a question is ``"#### <its index>"``."""

    def __init__(self, lm, monkeypatch, questions: list[str]):
        self.questions, self.calls = questions, list[dict]()
        monkeypatch.setattr(lm, "encode_questions", self.encode)
        monkeypatch.setattr(lm, "generate", self.generate)
        monkeypatch.setattr(lm, "decode", lambda tokens, mask: [f"#### {i}" for i in tokens[:, 0].tolist()])

    def encode(self, questions, *, markers=True, max_tokens=None):
        ids = torch.tensor([[self.questions.index(q)] for q in questions])
        return ids, torch.ones_like(ids)

    def generate(self, ids, mask, n_latent=None, **kw):
        self.calls.append({"rows": ids[:, 0].tolist(), **kw})
        return SimpleNamespace(tokens=ids.clone(), mask=mask.clone())


def test_each_row_samples_from_its_own_questions_seed_in_any_batch(lm, monkeypatch):
    """At a temperature, each row of a batch gets the draws of its own question's seed (:func:`question_seeds`),
    wherever the length sort put it: the second batch reused the first rows' seeds and every test passed."""
    qs = ["a?", "bbbb?", "cc?"]  # (sorted by length: a?, cc? | bbbb?)
    spy = Spy(lm, monkeypatch, qs)
    assert generate_answers(lm, qs, batch_size=2, temperature=0.7, seed=5, **FAST) == ["#### 0", "#### 1", "#### 2"]
    for call in spy.calls:
        own = row_sampling_uniforms(question_seeds(5, [qs[i] for i in call["rows"]]), 2)
        assert torch.equal(call["uniforms"].cpu(), own)
    assert [c["rows"] for c in spy.calls] == [[0, 2], [1]]


def test_native_dropout_answers_one_question_at_a_time_whatever_the_batch_size(lm, monkeypatch):
    """Native dropout replays the global RNG stream and binds one seed: evaluating two questions under it with the
    default batch size answered them in one batch (its bind refused the two seeds)."""
    qs = ["a?", "bb?"]
    spy = Spy(lm, monkeypatch, qs)
    got = generate_answers(
        lm, qs, batch_size=8, perturbation=NativeDropout(p=0.1), perturbation_seeds=torch.tensor([3, 4]), **FAST
    )
    assert got == ["#### 0", "#### 1"] and [c["rows"] for c in spy.calls] == [[0], [1]]


def test_each_row_is_perturbed_by_its_own_seed_in_any_batch(lm, monkeypatch):
    """Each batch binds the perturbation to its own rows' seeds (``perturbation_seeds`` in the questions' order),
    however the length sort batched them: the second batch was bound to the first rows' seeds."""
    qs = ["a?", "bbbb?", "cc?"]
    Spy(lm, monkeypatch, qs)
    drop, bound = LockedDropout(p=0.1), []
    bind = drop.bind
    monkeypatch.setattr(drop, "bind", lambda model, seeds: bound.append(seeds.tolist()) or bind(model, seeds))
    generate_answers(lm, qs, batch_size=2, perturbation=drop, perturbation_seeds=torch.tensor([10, 11, 12]), **FAST)
    assert bound == [[10, 12], [11]]


def test_question_and_mask_seeds_are_of_the_seed_the_stream_the_copy_and_the_text():
    """A question's sampling seed changes with ``seed``; its mask seeds with ``seed``, the stream and the copy (copies
    of one seed voted alike: no ensemble), and are question-major and the same in any list: without any of these
    every test passed."""
    assert not torch.equal(question_seeds(1, ["q"]), question_seeds(2, ["q"]))
    assert torch.equal(question_seeds(1, ["q", "r"])[1:], question_seeds(1, ["r"]))
    three = ev.mask_seeds(0, ["q"], "mc-vote", copies=3)
    assert len(set(three.tolist())) == 3
    pair = ev.mask_seeds(0, ["q", "r"], "mc-vote", copies=2)
    assert torch.equal(pair[2:], ev.mask_seeds(0, ["r"], "mc-vote", copies=2))
    assert torch.equal(pair[:2], three[:2])
    assert not torch.equal(three, ev.mask_seeds(1, ["q"], "mc-vote", copies=3))
    assert not torch.equal(three, ev.mask_seeds(0, ["q"], "eval", copies=3))


def test_perturbation_seeds_must_be_one_per_question(lm):
    """Three seeds for two questions are refused (they were taken silently, the third unused: a caller's seeds
    misaligned with its questions went unnoticed)."""
    with pytest.raises(ValueError, match=r"^generate_answers: 3 perturbation_seeds for 2 questions$"):
        generate_answers(
            lm, ["a?", "b?"], perturbation=LockedDropout(p=0.1), perturbation_seeds=torch.tensor([1, 2, 3]), **FAST
        )


def result(questions: list[str], scores: list[float], **kw) -> ev.EvalResult:
    """A shard's result as :func:`evaluate` makes it: one row per question, correct where its score is 1."""
    rows = [{"question": q, "score": float(s), "correct": s == 1} for q, s in zip(questions, scores)]
    correct, n = sum(s == 1 for s in scores), len(rows)
    fields = {"dataset": "d", "accuracy": correct / n if n else 0.0, "n": n, "correct": correct, "unparseable": 0}
    fields |= {"seed": 0, "n_latent": 1, "mode": "coconut", "wall_s": 1.0, "mean_score": ev.ordered_mean(scores)}
    return ev.EvalResult(**{**fields, **kw}, predictions=rows)


@pytest.mark.parametrize(("field", "value"), [("seed", 1), ("limit", 5), ("scorer", "exact")])
def test_shards_that_differ_in_how_they_were_evaluated_do_not_merge_even_in_the_middle(field, value):
    """A shard answered under another seed (or limit, or scorer) is no shard of the same evaluation, wherever it
    sits (the middle of three shards too)."""
    parts = [result(["q1"], [1]), result(["q2"], [0], **{field: value}), result(["q3"], [1])]
    with pytest.raises(ValueError, match=f"^merge_results: the shards differ in {field} "):
        res.merge_results(parts)


def test_another_users_temporary_files_are_left_alone(tmp_path, monkeypatch):
    """A ``.tmp-`` file of a running process that is not ours to signal (PermissionError) may be being written:
    a write leaves it; one of a process that no longer runs is removed."""
    theirs, gone = tmp_path / ".tmp-predictions.jsonl-4000001", tmp_path / ".tmp-results.json-4000002"
    theirs.write_text("x")
    gone.write_text("x")

    def kill(pid, signal):
        raise PermissionError if pid == 4000001 else ProcessLookupError

    monkeypatch.setattr(res.os, "kill", kill)
    res.write_results(result(["q1"], [1]), tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [theirs.name, "predictions.jsonl", "results.json"]


def test_a_plain_prompt_writes_out_its_shots_before_each_question(lm, monkeypatch):
    """``plain=True, shots=1``: the first record is the worked example in every prompt (its steps, then its answer),
    and only the records after it are evaluated (the prompts lost their shots, and every test passed)."""
    seen: list[list[str]] = []
    monkeypatch.setattr(ev, "generate_answers", lambda _lm, qs, **kw: seen.append(qs) or ["#### 4", "#### 7"])
    recs = [Record("1+1?", ["<<1+1=2>>"], "2"), Record("2+2?", [], "4"), Record("3+3?", [], "6")]
    r = ev.evaluate(lm, recs, plain=True, shots=1, **FAST)
    shot = "Question: 1+1?\nAnswer: <<1+1=2>> The answer is 2.\n\n"
    assert seen == [[shot + "Question: 2+2?\nAnswer:", shot + "Question: 3+3?\nAnswer:"]]
    assert (r.n, r.correct, r.accuracy, r.shots, r.mode) == (2, 1, 0.5, 1, "plain")


def test_no_record_is_an_accuracy_of_0(lm):
    """An evaluation of no record (a rank's empty shard) reports accuracy 0.0 of n = 0, not 1.0."""
    r = ev.evaluate(lm, [], **FAST)
    assert (r.n, r.correct, r.accuracy) == (0, 0, 0.0)


def test_the_swap_holds_the_folder_exclusively(tmp_path, monkeypatch):
    """While a write swaps its files in, no other process may hold the folder's lock, not even a shared one (a
    shared lock let two writers swap at once, and every test passed)."""
    import fcntl
    import os

    replace, shared_refused = os.replace, []

    def replace_and_try_a_shared_lock(src, dst):
        fd = os.open(tmp_path, os.O_RDONLY)  # (another open file: as another process's)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            shared_refused.append(False)
        except BlockingIOError:
            shared_refused.append(True)
        finally:
            os.close(fd)
        replace(src, dst)

    monkeypatch.setattr(res.os, "replace", replace_and_try_a_shared_lock)
    res.write_results(result(["q1"], [1]), tmp_path)
    assert shared_refused == [True, True]


def test_rows_whose_scores_are_bools_are_no_per_record_scores():
    """:func:`result_scores` reads rows' ``score`` only where each is a real number other than a bool (a row's
    ``True`` is a correct flag, not a score)."""
    r = result(["q1", "q2"], [1, 0])
    assert res.result_scores(r) == [1.0, 0.0]
    r.predictions = [{**row, "score": row["correct"]} for row in r.predictions]
    assert res.result_scores(r) is None


def test_results_are_written_where_locks_are_unavailable_or_unsupported_and_other_errors_raise(tmp_path, monkeypatch):
    """NFS without its lock daemon (ENOLCK), a file system that does not support flock (EOPNOTSUPP, EINVAL): the
    results are written without the lock; an I/O error is no missing lock, and is raised."""
    import errno
    import os

    for code in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL, errno.EIO):

        def refused(fd, op, code=code):
            raise OSError(code, os.strerror(code))

        monkeypatch.setattr(res.fcntl, "flock", refused)
        if code == errno.EIO:
            with pytest.raises(OSError, match=os.strerror(errno.EIO)):
                res.write_results(result(["q1"], [1]), tmp_path / "io")
            assert not (tmp_path / "io" / "results.json").exists()
        else:
            res.write_results(result(["q1"], [1]), tmp_path / str(code))
            assert (tmp_path / str(code) / "results.json").is_file()


def test_evaluates_rows_keep_the_scorers_partial_credit(lm, monkeypatch):
    """In :func:`evaluate` a scorer's 0.5 is the row's score and counts in the mean score, not as a correct answer
    (the rows kept only 0 or 1: a mean score of 0.5 read 0.0)."""

    def halves(completions, records):
        return [0.5 if c == "#### 3" else 0.0 for c in completions]

    monkeypatch.setattr(ev, "generate_answers", lambda _lm, qs, **kw: ["#### 3", "#### 9"])
    r = ev.evaluate(lm, [Record("1+2?", [], "3"), Record("2+2?", [], "4")], scorer=halves, **FAST)
    assert [(p["score"], p["correct"]) for p in r.predictions] == [(0.5, False), (0.0, False)]
    assert (r.correct, r.accuracy, r.mean_score, r.scorer) == (0, 0.0, 0.25, "halves")


def test_a_shard_without_a_mean_score_leaves_the_merged_one_unknown():
    """One shard of two with no mean score (a result made by hand): the merged mean score is None, not the other
    shard's scores averaged with zeros for it."""
    merged = res.merge_results([result(["q1"], [1], mean_score=None), result(["q2"], [1])])
    assert (merged.n, merged.correct, merged.mean_score) == (2, 2, None)


def test_questions_cut_are_counted_over_an_evenly_spaced_sample(lm):
    """``check_at_most`` = 2 of 4 questions checks questions 0 and 2, evenly spaced, not the first two: the one long
    question, third, is found."""
    long = "1 + 2 + 3 + 4 + 5 + 6 + 7 + 8?"
    with pytest.warns(UserWarning, match=r"^1 of 2 training questions \(checked: 2, evenly spaced over 4\)"):
        assert ev.warn_if_questions_cut(lm, ["1?", "2?", long, "4?"], 3, "training", check_at_most=2) == 1


def test_a_plain_models_own_settings_answer_without_thoughts(lm, monkeypatch):
    """A model whose settings' mode is ``plain`` (a base LM) answers in coconut mode with no thought, whatever its
    n_latent, as cot and no_cot do."""
    from dataclasses import replace

    seen: list[dict] = []
    monkeypatch.setattr(ev, "generate_answers", lambda _lm, qs, **kw: seen.append(kw) or ["#### 3"] * len(qs))
    monkeypatch.setattr(lm, "settings", replace(lm.settings, mode="plain", n_latent=2))
    r = ev.evaluate(lm, [Record("1+2?", [], "3")], **FAST)
    assert (r.n_latent, seen[-1]["n_latent"], seen[-1]["mode"]) == (0, 0, "coconut")


def test_the_vote_samples_with_its_top_p(lm, monkeypatch):
    """Each masked copy is sampled with the vote's ``top_p`` (it sampled from the whole distribution, top_p 1)."""
    qs = ["a?", "bb?"]
    spy = Spy(lm, monkeypatch, qs)
    recs = [Record(q, [], "0") for q in qs]
    ev.evaluate_mc_vote(lm, recs, LockedDropout(p=0.1), n_masks=2, temperature=0.7, top_p=0.5, **FAST)
    assert spy.calls and all((c["temperature"], c["top_p"]) == (0.7, 0.5) for c in spy.calls)


def test_a_choice_vote_is_on_the_letter(lm, monkeypatch):
    """Under ``choice``, ``#### (C) A tree`` and ``#### C.`` are both a vote for C, which beats B (as texts, each was
    a vote of its own and the first, B, won)."""
    monkeypatch.setattr(ev, "_perturbed_texts", lambda *a, **k: ["#### B", "#### (C) A tree", "#### C."])
    r = ev.evaluate_mc_vote(lm, [Record("Which?", [], "C")], LockedDropout(p=0.1), n_masks=3, scorer="choice", **FAST)
    assert (r.predictions[0]["votes"], r.predictions[0]["pred"], r.correct) == (["B", "C", "C"], "C", 1)


def test_a_solution_that_is_not_text_is_no_worked_solution():
    """A ``solution`` column of another type (a list, a number) is no natural-language solution: the prompt writes
    the steps (it was an AttributeError)."""
    shot = Record("1+1?", ["<<1+1=2>>"], "2", {"solution": ["step"]})
    assert ev.worked_solution(shot) == ""
    assert (
        ev.plain_prompt("Q?", [shot]) == "Question: 1+1?\nAnswer: <<1+1=2>> The answer is 2.\n\nQuestion: Q?\nAnswer:"
    )


def test_a_text_golds_empty_answer_is_no_prediction(lm, monkeypatch):
    """Under the numeric verifier a text gold's row whose completion gives no answer after its ``#`` predicts None
    (not an empty string), and is not counted unparseable."""
    monkeypatch.setattr(ev, "generate_answers", lambda _lm, qs, **kw: ["####"])
    r = ev.evaluate(lm, [Record("Who?", [], "Tom is a lempus.")], **FAST)
    assert (r.predictions[0]["pred"], r.correct, r.unparseable) == (None, 0, 0)
