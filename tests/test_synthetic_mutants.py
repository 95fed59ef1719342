"""The built-in synthetic task and its tokenizer: what mutation testing found unpinned (answers, ranges, splits,
determinism, the tokenizer's documented pipeline)."""

from __future__ import annotations

import re

import pytest

from dgrpo.config import TaskConfig
from dgrpo.data.records import DataError
from dgrpo.data.synthetic import SPLITS, generate_split, load_builtin, make_problem, parse_builtin_name

#: a small task: every split drawn in milliseconds
SMALL = TaskConfig(n_train=300, n_valid=100, n_test=100)
OP = re.compile(r"(Add|Minus|Times) (\d+)\.")
STEP = re.compile(r"<<(\d+)([-+*])(\d+)=(\d+)>>")


class Scripted:
    """A stand-in for ``random.Random`` that returns the draws it is given, in order."""

    def __init__(self, start: int, ops: str, operands: list[int]):
        self.start, self.ops, self.operands = start, list(ops), list(operands)

    def randrange(self, n: int) -> int:
        assert 0 <= self.start < n
        return self.start

    def choice(self, seq):
        if seq == "+-*":
            return self.ops.pop(0)
        x = self.operands.pop(0)
        assert x in seq
        return x

    def randint(self, lo: int, hi: int) -> int:
        x = self.operands.pop(0)
        assert lo <= x <= hi
        return x


def test_a_problem_is_the_module_docstrings_example_worked_by_hand():
    """Start with 3, add 4, times 7, minus 5, mod 10: 7, 49 -> 9, 4; each step names the value before it, the
    operation, its operand and the value after it; the answer is the last value."""
    r = make_problem(Scripted(3, "+*-", [4, 7, 5]), 3, 10, 1, 9)
    assert r.question == "Start with 3. Add 4. Times 7. Minus 5. Answer mod 10."
    assert r.steps == ["<<3+4=7>>", "<<7*7=9>>", "<<9-5=4>>"]
    assert r.answer == "4"
    r = make_problem(Scripted(2, "-*+", [8, 9, 13]), 3, 7, 1, 20)
    # 2 - 8 = -6 -> 1 (mod 7, never negative); 1 * 9 = 9 -> 2; 2 + 13 = 15 -> 1
    assert r.question == "Start with 2. Minus 8. Times 9. Add 13. Answer mod 7."
    assert (r.steps, r.answer) == (["<<2-8=1>>", "<<1*9=2>>", "<<2+13=1>>"], "1")


def solve(question: str) -> tuple[int, list[tuple[int, str, int, int]]]:
    """The question's answer and its steps, read from the text alone (evaluated left to right modulo its modulus)."""
    value = int(re.match(r"Start with (\d+)\.", question).group(1))  # type: ignore[union-attr]
    modulus = int(re.search(r"Answer mod (\d+)\.$", question).group(1))  # type: ignore[union-attr]
    steps = []
    for word, x in OP.findall(question):
        op, x = {"Add": "+", "Minus": "-", "Times": "*"}[word], int(x)
        new = {"+": value + x, "-": value - x, "*": value * x}[op] % modulus
        steps.append((value, op, x, new))
        value = new
    return value, steps


def read_step(step: str) -> tuple[int, str, int, int]:
    """``<<a+x=b>>`` as (a, "+", x, b)."""
    a, op, x, b = STEP.fullmatch(step).groups()  # type: ignore[union-attr]
    return int(a), op, int(x), int(b)


@pytest.mark.parametrize("split", SPLITS)
def test_every_answer_and_step_is_the_questions_own_arithmetic(split):
    """Every record of every split: the answer is the question evaluated left to right modulo its modulus, the steps
    are that evaluation's, one per operation, the question names the task's modulus."""
    for r in generate_split(SMALL, split)[:100]:
        answer, steps = solve(r.question)
        assert r.question.endswith(f"Answer mod {SMALL.modulus}.")
        assert r.answer == str(answer), r
        assert [read_step(s) for s in r.steps] == steps
        assert r.meta == {"source": "builtin", "split": split}


def _operands(records, word):
    return [int(x) for r in records for w, x in OP.findall(r.question) if w == word]


def test_the_splits_draw_the_documented_lengths_operands_and_start_values():
    """n_steps operations (ood_steps: n_steps + ood_extra_steps); + and - operands exactly the range 1..max_operand
    (ood_numbers: 10..ood_max_operand), * operands exactly 3, 7, 9; every start value 0..modulus-1 and every
    operation drawn; the split sizes are the config's."""
    task = TaskConfig(n_train=400, n_valid=50, n_test=400, n_steps=3, ood_extra_steps=2, ood_max_operand=30)
    sizes = {"train": 400, "valid": 50, "test": 400, "ood_steps": 400, "ood_numbers": 400}
    for split in SPLITS:
        recs = generate_split(task, split)
        assert len(recs) == sizes[split], split
        want_steps = 5 if split == "ood_steps" else 3
        assert {len(OP.findall(r.question)) for r in recs} == {len(r.steps) for r in recs} == {want_steps}, split
        if split == "valid":
            continue
        lo, hi = (10, 30) if split == "ood_numbers" else (1, 9)
        assert set(_operands(recs, "Add")) == set(_operands(recs, "Minus")) == set(range(lo, hi + 1)), split
        assert set(_operands(recs, "Times")) == {3, 7, 9}, split
        assert {int(r.question.split()[2].rstrip(".")) for r in recs} == set(range(10)), split


def test_no_split_shares_a_question_with_another_nor_repeats_one():
    """Questions are distinct within a split and across train, valid and test (and the OOD splits, of other lengths
    or numbers)."""
    questions = {s: [r.question for r in generate_split(SMALL, s)] for s in SPLITS}
    for s, qs in questions.items():
        assert len(set(qs)) == len(qs), s
    for i, a in enumerate(SPLITS):
        for b in SPLITS[:i]:
            assert not set(questions[a]) & set(questions[b]), (a, b)
    # a task of 10 x (1 + 1 + 3) = 50 one-step problems: 45 of them drawn are 45 distinct ones
    tiny = TaskConfig(n_steps=1, max_operand=1, n_test=45)
    assert len({r.question for r in generate_split(tiny, "test")}) == 45


def test_a_seed_gives_the_same_data_and_another_seed_other_data():
    """Every split is a function of the task config alone (the same records on every call), and the task seed
    changes them; each split is drawn from a stream of its own (valid is not what a longer test split would draw
    next)."""
    from dataclasses import replace

    for split in SPLITS:
        once, again = generate_split(SMALL, split), generate_split(SMALL, split)
        assert [(r.question, r.steps, r.answer) for r in once] == [(r.question, r.steps, r.answer) for r in again]
        other = generate_split(replace(SMALL, seed=SMALL.seed + 1), split)
        assert {r.question for r in once}.isdisjoint(r.question for r in other), split
        assert [r.question for r in once] != [r.question for r in other], split
    longer_test = {r.question for r in generate_split(replace(SMALL, n_test=400), "test")}
    assert longer_test.isdisjoint(r.question for r in generate_split(SMALL, "valid"))
    # (a split's first records do not depend on the other splits' sizes where nothing of theirs is excluded)
    assert generate_split(replace(SMALL, n_train=5), "train")[:5] == generate_split(SMALL, "train")[:5]


def test_a_builtin_name_reads_its_split_and_options_the_split_argument_first():
    """``builtin`` is the test split; ``builtin:valid`` the valid split; an explicit split argument wins over the
    name's; options apply over the task given; an unknown split or option is a DataError."""
    assert parse_builtin_name("builtin", None) == (TaskConfig(), "test")
    assert parse_builtin_name("builtin:valid", None)[1] == "valid"
    assert parse_builtin_name("builtin:valid", "train")[1] == "train"
    cfg, split = parse_builtin_name("builtin:ood_steps?n_steps=3&n_test=7", None, SMALL)
    assert (cfg.n_steps, cfg.n_test, cfg.n_train, split) == (3, 7, SMALL.n_train, "ood_steps")
    assert [len(r.steps) for r in load_builtin("builtin:ood_steps?n_steps=3&n_test=7", task=SMALL)] == [5] * 7
    with pytest.raises(DataError, match="no option 'steps'"):
        parse_builtin_name("builtin:test?steps=3", None)
    with pytest.raises(DataError, match="has splits train, valid, test, ood_steps, ood_numbers; got 'dev'"):
        generate_split(SMALL, "dev")


# ----------------------------------------------------------------------------------------------- the tokenizer
def test_the_task_tokenizer_has_one_token_per_word_and_digit_and_its_special_ids(tokenizer):
    """pad/eos/unk are ids 0/1/2, padding on the left; every word of the task is one token with its space, each digit
    is a token of its own (the space before a number too): ``Add 4.`` is four tokens, ``Minus 15.`` five."""
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id) == (0, 1, 2)
    assert tokenizer.padding_side == "left"

    def pieces(text: str) -> list[str]:
        return tokenizer.convert_ids_to_tokens(tokenizer(text, add_special_tokens=False)["input_ids"])

    assert pieces("Start with 3. Add 4.") == ["Start", "Ġwith", "Ġ", "3", ".", "ĠAdd", "Ġ", "4", "."]
    assert pieces(" Minus 15. Times 7. Answer mod 10.") == [
        *("ĠMinus", "Ġ", "1", "5", "."),
        *("ĠTimes", "Ġ", "7", "."),
        *("ĠAnswer", "Ġmod", "Ġ", "1", "0", "."),
    ]
    # (the few-shot prompt's words, which the corpus holds for it: eval's "The answer is 4.")
    assert pieces("The answer is 4.") == ["The", "Ġanswer", "Ġis", "Ġ", "4", "."]
    batch = tokenizer([" Add 4.", "Start with 3. Add 4."], padding=True, add_special_tokens=False)["input_ids"]
    assert batch[0][:5] == [0] * 5 and batch[0][5:] == batch[1][5:]


def test_the_task_tokenizer_decodes_what_it_encodes_any_text_normalised_to_nfc(tokenizer):
    """Byte-level BPE with the byte alphabet: text the corpus never held (accents, symbols, newlines) encodes
    without unknown tokens and decodes back; decomposed text comes back composed (NFC, as Qwen2's tokenizer)."""
    for text in ("<<3+4=7>>\n#### 4", "Café costs 12€ — ok?\n\tyes", "Start with 3."):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert tokenizer.unk_token_id not in ids and tokenizer.decode(ids) == text, text
    decomposed = "Cafe\u0301"
    assert tokenizer.decode(tokenizer(decomposed, add_special_tokens=False)["input_ids"]) == "Caf\u00e9"


def test_a_builtin_names_options_are_validated_as_the_tasks():
    """Options given in a name are range-checked as the task section is (a modulus of 1 has no problems to draw)."""
    with pytest.raises(DataError, match=r"built-in dataset 'builtin:test\?modulus=1': .*task.modulus"):
        parse_builtin_name("builtin:test?modulus=1", None)
