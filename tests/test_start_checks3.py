"""What ``dgrpo sft`` checks once its data is read, before the model's weights load (minutes for a 1.5B model) and
hours before the batch that would have failed: every training example against the context (once), and the scorer on
gold answers; and ``dgrpo grpo``'s scorer check, made then too."""

import json

import pytest
from test_start_checks2 import loads, run_on  # noqa: F401 - (loads: the fixture, the order of the load and the checks)

from conftest import tiny_args


@pytest.fixture
def events(request):
    """test_start_checks2's ``loads``: ``"load"`` for the weights' load, ``"gold"`` for the reward's gold check."""
    return request.getfixturevalue("loads")


def _training_file(tmp_path, n: int = 12, long_question_at: int | None = None, long_steps_at: int | None = None):
    """``n`` short records; the one at ``long_question_at`` with a question, the one at ``long_steps_at`` with steps,
    longer than the tiny model's context (512 positions)."""
    rows = [{"question": f"{i} + 1 ?", "steps": [f"{i} + 1 = {i + 1}"], "answer": str(i + 1)} for i in range(n)]
    if long_question_at is not None:
        rows[long_question_at]["question"] = "1 + " * 300 + "1 ?"
    if long_steps_at is not None:
        rows[long_steps_at]["steps"] = [f"{k} + 1 = {k + 1}" for k in range(100)]
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _sft(run_cli, init, train, out, *more):
    return run_on(run_cli, "sft", init, train, out, *more)


def test_a_training_question_too_long_for_the_context_is_refused_before_the_weights_load(
    sft_checkpoint, tmp_path, run_cli, events
):
    """With ``data.max_question_tokens=0`` (no cut) one training question past the context failed the batch that
    held it, hours into dgrpo sft; every example is checked now, before the weights load, the line naming the record,
    the stage and data.max_question_tokens."""
    train = _training_file(tmp_path, long_question_at=7)
    r = _sft(run_cli, sft_checkpoint, train, tmp_path / "run", "data.max_question_tokens=0")
    assert r.returncode == 2, r.stderr[-2000:]
    said = f"data.train {train}: record 7's question with record 10's target (counting from 0) at stage 0: sft:"
    assert said in r.stderr
    assert "data.max_question_tokens is 0 (no limit): set it" in r.stderr
    assert "load" not in events and not (tmp_path / "run").exists()
    r = _sft(run_cli, sft_checkpoint, train, tmp_path / "cut", "data.max_question_tokens=64", "sft.num_epochs=1")
    assert r.returncode == 0, r.stderr[-2000:]  # (cut to fit: it trains)


def test_a_training_target_too_long_for_the_context_is_refused_before_the_weights_load(
    sft_checkpoint, tmp_path, run_cli, events
):
    """A record whose steps are longer than the context under a large ``data.max_target_tokens`` is refused before
    the load too, the line naming the widest question's record and the long target's, and the option."""
    train = _training_file(tmp_path, long_steps_at=5)
    r = _sft(run_cli, sft_checkpoint, train, tmp_path / "run", "data.max_target_tokens=4000")
    assert r.returncode == 2, r.stderr[-2000:]
    assert f"data.train {train}: record 10's question with record 5's target (counting from 0) at stage 0" in r.stderr
    assert "data.max_target_tokens" in r.stderr and "load" not in events


def test_the_examples_are_checked_as_the_batches_build_them(tokenizer):
    """The check takes the widest question with the most thoughts and the longest target of a stage the run trains
    (its steps still written, cut to data.max_target_tokens): at the trainer's start, for a run from Python too."""
    from dgrpo.config import ConfigError
    from dgrpo.data.records import Record
    from dgrpo.training.sft import check_examples_fit

    from conftest import make_lm, tiny_config

    lm = make_lm(tokenizer)  # (a context of 512 positions; one token a character)
    steps = ["1 + 1 = 2"] * 40  # (400 tokens of steps: 400 written at stage 0, fewer later)
    recs = [Record("1 + 1 ?", ["1 + 1 = 2"], "2"), Record("2 + 2 ?", steps, "4"), Record("9 ?" + " 9" * 60, [], "9")]
    cfg = tiny_config(**{"data.max_target_tokens": 1000, "sft.num_epochs": 2, "sft.epochs_per_stage": 1})
    with pytest.raises(ConfigError, match=r"^the data: record 2's question with record 1's target \(counting from 0"):
        check_examples_fit(lm, cfg, recs, "the data")
    check_examples_fit(lm, cfg, [recs[0], recs[1]])  # (the widest question alone with the long target: it fits)
    check_examples_fit(lm, tiny_config(**{"data.max_target_tokens": 256}), recs)  # (the targets cut: they fit)


def test_train_sft_refuses_a_record_too_long_before_its_run_directory_is_written(tokenizer, tmp_path):
    """train_sft (Python) makes the same check at its start, before it writes anything."""
    from dgrpo.config import ConfigError
    from dgrpo.data.records import Record
    from dgrpo.training.sft import train_sft

    from conftest import make_lm, tiny_config

    lm = make_lm(tokenizer)
    recs = [Record(f"{i} + 1 ?", [f"{i} + 1 = {i + 1}"], str(i + 1)) for i in range(8)]
    recs[3] = Record("1 + " * 300 + "1 ?", [], "301")
    cfg = tiny_config(**{"data.max_question_tokens": 0, "data.train": "mine.jsonl"})
    said = r"^the training data: record 3's question with record 0's target \(counting from 0\) at stage 0: "
    with pytest.raises(ConfigError, match=said):
        train_sft(lm, recs, cfg, tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


def test_dgrpo_sft_reads_the_training_examples_once(sft_checkpoint, tmp_path, run_cli, monkeypatch):
    """The check before the load encodes the training questions and the examples' targets; the trainer's start takes
    what it found (a training set of 385,000 examples takes a minute to tokenize)."""
    from dgrpo.model.latent_lm import LatentLM

    n = 100  # (more than a batch: sft.batch_size is 64)
    questions, targets = [], []  # (how many times all n questions, and all n stage-1 targets, were encoded)
    encode, token_ids = LatentLM.encode_questions, LatentLM.token_ids

    def encode_questions(self, qs, **kw):
        questions.append(len(qs))
        return encode(self, qs, **kw)

    def tokenized(self, texts):
        targets.append(len(texts) == n and all(t.startswith("####") for t in texts))  # (stage 1's: no step left)
        return token_ids(self, texts)

    monkeypatch.setattr(LatentLM, "encode_questions", encode_questions)
    monkeypatch.setattr(LatentLM, "token_ids", tokenized)
    train = _training_file(tmp_path, n=n)
    more = ["data.max_question_tokens=0", "data.max_target_tokens=600", "sft.num_epochs=2", "sft.epochs_per_stage=1"]
    r = _sft(run_cli, sft_checkpoint, train, tmp_path / "run", *more)
    assert r.returncode == 0, r.stderr[-2000:]
    assert questions.count(n) == 1 and targets.count(True) == 1, (questions, targets.count(True))


def test_sft_checks_its_scorer_before_the_weights_load(sft_checkpoint, tmp_path, run_cli, events):
    """``eval.scorer`` on the training data's gold answers came once the model had loaded: a scorer that fails was
    refused minutes into a large model's start. It comes before the load now."""
    scorer = tmp_path / "scorer.py"
    scorer.write_text("def broken(completions, records, **kw):\n    raise ValueError('no such column')\n")
    r = _sft(run_cli, sft_checkpoint, _training_file(tmp_path), tmp_path / "run", f"eval.scorer={scorer}:broken")
    assert r.returncode == 2 and "no such column" in r.stderr, r.stderr[-2000:]
    assert "load" not in events, events


def test_grpo_checks_its_scorer_on_the_first_test_set_before_the_weights_load(
    sft_checkpoint, tmp_path, run_cli, events
):
    """GRPO's scorer check (on the validation set, else the first test set) came once the model had loaded; it comes
    before the load now, after the reward's check on the training data's gold answers."""
    scorer = tmp_path / "scorer.py"
    scorer.write_text("def two(completions, records, **kw):\n    return [2.0] * len(completions)\n")
    test = tmp_path / "test.jsonl"
    test.write_text('{"question": "1 + 1 ?", "answer": "2"}\n{"question": "2 + 1 ?", "answer": "3"}\n')
    over = [f"data.train={_training_file(tmp_path)}", "data.valid=", f"data.test=[{test}]"]
    more = [f"eval.scorer={scorer}:two", "grpo.reward=numeric"]
    r = run_cli("grpo", "--init", sft_checkpoint, *tiny_args(), "--set", *over, *more, "--out", tmp_path / "run")
    assert r.returncode == 2 and "2.0" in r.stderr, r.stderr[-2000:]
    assert events == ["gold"], events
