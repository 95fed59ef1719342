"""Mutation tests of dgrpo.data.records, dgrpo.data.subsets, dgrpo.data.synthetic and dgrpo.data.tokenizer: each test
kills a change of the source that the data tests let live (a record's fields let through unchecked, a fingerprint
blind to the answers, held-out counts that stop at one, a valid split that repeats test questions, a tokenizer that
normalises text away)."""

from __future__ import annotations

import re
import sys
import types

import pytest

from dgrpo.config import TaskConfig
from dgrpo.data.records import (
    DataError,
    Record,
    check_records,
    fingerprint,
    shared_questions,
    warn_if_marker_text,
)
from dgrpo.data.subsets import sample_subset, stream_openmath
from dgrpo.data.synthetic import generate_split, parse_builtin_name, tokenizer_corpus
from dgrpo.data.tokenizer import train_task_tokenizer

# ---------------------------------------------------------------------------------------------------------
# Records


def test_a_records_meta_of_none_is_empty_and_one_keyed_by_other_than_names_is_refused() -> None:
    """``meta=None`` is no extra fields; a mapping with a key that is no column name (an int) is a DataError."""
    assert Record("q", [], "1", None).meta == {}  # type: ignore[arg-type]
    with pytest.raises(DataError, match="meta must be a mapping of column names to values, got dict"):
        Record("q", [], "1", {1: "x"})  # type: ignore[dict-item]


def test_every_step_of_a_record_is_checked_and_its_dict_is_a_copy() -> None:
    """A step that is no text anywhere in the list is named by its index; ``to_dict``'s steps are a list of their
    own (changing them leaves the record as it was)."""
    with pytest.raises(DataError, match=r"steps\[2\] is int"):
        Record("q", ["a", "b", 3], "1")  # type: ignore[list-item]
    record = Record("q", ["a"], "1")
    record.to_dict()["steps"].append("b")
    assert record.steps == ["a"]


def test_a_numpy_boolean_answer_is_named_a_boolean() -> None:
    np = pytest.importorskip("numpy")
    with pytest.raises(DataError, match="answer must be text or a finite number, got a boolean"):
        Record("q", [], np.bool_(True))


def test_shared_questions_count_every_held_out_item_answered_and_every_training_answer() -> None:
    """Each held-out item whose answer is one of its training question's answers counts (a question trained with
    two answers has both); held out twice, it counts twice."""
    train = [Record("a?", [], "1"), Record("a?", [], "2"), Record("b?", [], "3")]
    held_out = [Record("a?", [], "1"), Record("b?", [], "3"), Record("a?", [], "2"), Record("b?", [], "9")]
    assert shared_questions(train, held_out) == (4, 3)


def test_a_marker_warning_counts_every_record_and_sees_answers() -> None:
    """Two records holding marker text, the first of them record 1 (in its answer): 'data: 2 records hold ...
    record 1's answer'."""
    records = [Record("q", [], "1"), Record("r", [], "<|end-latent|>"), Record("<|latent|> s", [], "2")]
    with pytest.warns(
        UserWarning, match=r"^data: 2 records hold the latent marker text '<\|end-latent\|>' \(record 1's answer"
    ):
        warn_if_marker_text(records, "data")


def test_the_fingerprint_sees_the_answers_and_every_character() -> None:
    """A changed gold, or a question with a space more, is other data to a resumed run."""
    base = fingerprint([Record("q", ["s"], "1")])
    assert base != fingerprint([Record("q", ["s"], "2")])
    assert base != fingerprint([Record("q ", ["s"], "1")])


def test_a_list_of_dicts_is_no_list_of_records() -> None:
    with pytest.raises(ValueError, match=r"must be a non-empty list of dgrpo Records, got a list of 2 holding dict"):
        check_records([Record("q", [], "1"), {"question": "q"}], "data.train")


# ---------------------------------------------------------------------------------------------------------
# The OpenMathInstruct-2 subset


def test_problems_that_differ_in_case_or_spacing_are_two_problems() -> None:
    """Only word-for-word repeats are one problem: ``"Add 2."`` and ``"add 2. "`` are both kept."""
    rows = [{"problem": p, "expected_answer": "2", "problem_source": "gsm8k"} for p in ("Add 2.", "add 2. ", "Add 2.")]
    assert [r["problem"] for r in sample_subset(rows, n=10)] == ["Add 2.", "add 2. "]


def test_the_stream_reads_the_split_it_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, str, bool]] = []

    def load(repo: str, split: str, streaming: bool) -> list[dict[str, str]]:
        calls.append((repo, split, streaming))
        return []

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load))
    stream_openmath("validation")
    assert calls == [("nvidia/OpenMathInstruct-2", "validation", True)]


# ---------------------------------------------------------------------------------------------------------
# The built-in task


def test_a_small_task_s_valid_and_train_splits_avoid_every_held_out_question() -> None:
    """A task of only 50 one-step problems: valid's 15 avoid test's 15, and train's 15 avoid both (with so few
    problems, a split that excluded only the last one drawn, or none, would repeat some)."""
    task = TaskConfig(n_steps=1, max_operand=1, n_test=15, n_valid=15, n_train=15)
    test, valid, train = ({r.question for r in generate_split(task, s)} for s in ("test", "valid", "train"))
    assert len(test) == len(valid) == len(train) == 15
    assert not test & valid and not train & (test | valid)


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("builtin:test?n_test=5&n_test=6", "the option n_test is given twice"),
        ("builtin:test?n_test= 5", r"option n_test expects an integer, got ' 5'"),
        ("builtins", "cannot parse built-in dataset name 'builtins'"),
    ],
)
def test_a_malformed_builtin_name_is_refused(name: str, says: str) -> None:
    with pytest.raises(DataError, match=says):
        parse_builtin_name(name, None)


def test_the_tokenizer_corpus_holds_the_out_of_distribution_problems() -> None:
    """It covers the OOD splits' text too: problems of n_steps + ood_extra_steps operations, operands above
    max_operand."""
    task = TaskConfig(n_steps=2, ood_extra_steps=3, max_operand=9, ood_max_operand=40)
    texts = tokenizer_corpus(task)
    operands = {int(x) for t in texts for x in re.findall(r"(?:Add|Minus) (\d+)\.", t)}
    assert max(operands) > 9 and {t.count("<<") for t in texts} >= {2, 5}


# ---------------------------------------------------------------------------------------------------------
# The task's tokenizer


def test_the_task_tokenizer_keeps_compatibility_characters_and_splits_as_qwen2() -> None:
    """NFC, not NFKC: ``x²`` and ``ﬁ`` come back as written (NFKC made them ``x2``, ``fi``); the pre-tokenizer is
    Qwen2's regex alone (``$abc`` one piece, which GPT-2's byte-level regex cut in two)."""
    tok = train_task_tokenizer(["Start with 3. Add 4."], vocab_size=300)
    for text in ("x² ﬁle", "Café"):
        assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text
    pieces = [p for p, _ in tok.backend_tokenizer.pre_tokenizer.pre_tokenize_str("$abc 12")]
    assert pieces == ["$abc", "Ġ", "1", "2"]


def test_the_subset_draw_may_drop_any_row_the_first_too() -> None:
    """Two of three rows, over 20 seeds: every row is sometimes left out (a draw that only ever replaced the last row
    kept the first every time)."""
    rows = [{"problem": p, "expected_answer": "1", "problem_source": "gsm8k"} for p in "abc"]
    kept = [{r["problem"] for r in sample_subset(rows, n=2, seed=seed)} for seed in range(20)]
    assert all(len(k) == 2 for k in kept) and {p for p in "abc" if any(p not in k for k in kept)} == {"a", "b", "c"}
