"""Dataset loaders: every real file in the data folder ($DGRPO_DATA_DIR, else ../shared/data) by name and by path,
the error messages, corruption fuzzing."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import warnings
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dgrpo.data.loaders import DATASETS, find_data_dir, load_dataset
from dgrpo.data.records import DataError, Record
from dgrpo.reward import normalize_number, score

from conftest import SHARED_DATA

DATA = SHARED_DATA  # $DGRPO_DATA_DIR, else ../shared/data
if not DATA.is_dir():
    pytest.skip(f"data folder {DATA} not present (set DGRPO_DATA_DIR)", allow_module_level=True)


@pytest.fixture(autouse=True)
def _data_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    """Names resolve to the shared data folder whatever the working directory."""
    monkeypatch.setenv("DGRPO_DATA_DIR", str(DATA))


# name, split, file relative to DATA, record count
REAL = [
    ("gsm8k", "test", "gsm8k/test.jsonl", 1319),
    ("gsm8k", "train", "gsm8k/train.jsonl", 7473),
    ("gsm8k_aug", "valid", "gsm8k_aug/valid.txt", 500),
    ("gsm8k_aug", "test", "gsm8k_aug/test.txt", 1319),
    ("coconut_gsm8k_aug", "valid", "coconut/gsm8k_aug/gsm_valid.json", 500),
    ("coconut_gsm8k_aug", "test", "coconut/gsm8k_aug/gsm_test.json", 1319),
    ("prosqa", "valid", "coconut/prosqa/prosqa_valid.json", 300),
    ("svamp", "test", "svamp/SVAMP.json", 1000),
    ("multiarith", "test", "multiarith/MultiArith.json", 600),
    ("gsm_hard", "test", "gsm_hard/gsmhardv2.jsonl", 1319),
]


def _comparable(records: list[Record]) -> list[tuple[str, tuple[str, ...], str]]:
    return [(r.question, tuple(r.steps), r.answer) for r in records]


@pytest.mark.parametrize(("name", "split", "rel", "count"), REAL, ids=[f"{n}-{s}" for n, s, _, _ in REAL])
@pytest.mark.slow
def test_real_file_by_name_and_path(name: str, split: str, rel: str, count: int) -> None:
    by_name = load_dataset(name, split)
    by_path = load_dataset(str(DATA / rel))
    assert len(by_name) == count
    assert _comparable(by_path) == _comparable(by_name)
    for rec in by_name:
        assert isinstance(rec, Record)
        assert rec.question and rec.question == rec.question.strip()
        assert all(isinstance(s, str) for s in rec.steps)
        assert rec.answer and "," not in rec.answer
        assert score("#### " + rec.answer, rec.answer) == 1.0, rec
        assert score(rec.answer, rec.answer) == 1.0, rec


def _near_misses(gold: str) -> list[str]:
    """Answers a numeric gold must not accept: off by one, by a half, ten times it, its negation written both ways
    (``-5`` and ``- 5``: a minus sign standing apart was dropped, so ``#### - 5`` scored 1 for 5)."""
    g = Decimal(gold)
    wrong = [g + 1, g - 1, g + Decimal("0.5"), g * 10, -g]
    written = [format(x, "f") for x in wrong if x != g]
    return written + ([f"- {gold}"] if g > 0 else [])


@pytest.mark.parametrize(("name", "split", "rel", "count"), REAL, ids=[f"{n}-{s}" for n, s, _, _ in REAL])
@pytest.mark.slow
def test_every_gold_scores_as_trained_and_its_near_misses_do_not(name: str, split: str, rel: str, count: int) -> None:
    """Each record's gold parses to a number (ProsQA's are sentences); the text the model is trained to write (its
    steps, then ``#### <answer>``) scores 1 under the numeric, exact and Coconut scorers; answers off the gold score
    0 under the numeric one."""
    from dgrpo.eval.scoring import coconut, exact, numeric
    from dgrpo.training.curriculum import format_target

    records = load_dataset(name, split)
    targets = [format_target(r.steps, r.answer) for r in records]
    for scorer in (numeric, exact, coconut):
        assert list(scorer(targets, records)) == [1.0] * count, scorer.__name__
    golds = [normalize_number(r.answer) for r in records]
    assert sum(g is None for g in golds) == (count if name == "prosqa" else 0)
    misses = [(r.answer, m) for r, g in zip(records, golds) if g is not None for m in _near_misses(g)]
    assert [(gold, m) for gold, m in misses if score(f"#### {m}", gold)] == []


@pytest.mark.slow
def test_gsm8k_solutions_score_and_steps() -> None:
    for split, count in (("test", 1319), ("train", 7473)):
        rows = [json.loads(line) for line in (DATA / "gsm8k" / f"{split}.jsonl").read_text("utf-8").splitlines()]
        records = load_dataset("gsm8k", split)
        assert len(records) == len(rows) == count
        for row, rec in zip(rows, records):
            solution = row["answer"]
            raw_gold = solution.split("#### ")[-1].strip()
            assert rec.answer == raw_gold.replace(",", "")
            assert score(solution, rec.answer) == 1.0
            assert score(solution, raw_gold) == 1.0  # "40,000" as the gold too
            assert all(s.startswith("<<") and s.endswith(">>") and "=" in s for s in rec.steps)
    first = load_dataset("gsm8k", "train")[0]
    assert first.steps == ["<<48/2=24>>", "<<48+24=72>>"]
    assert first.answer == "72"


def test_gsm8k_steps_match_gsm8k_aug_test() -> None:
    """GSM8K-Aug test is GSM8K test; its steps are GSM8K's <<expr=value>> annotations written the same way."""
    gsm, aug = load_dataset("gsm8k", "test"), load_dataset("gsm8k_aug", "test")
    assert [r.answer for r in gsm] == [r.answer for r in aug]
    assert aug[0].steps == ["<<16-3-4=9>>", "<<9*2=18>>"] == gsm[0].steps
    assert sum(a.steps == g.steps for a, g in zip(aug, gsm)) > 1200


def test_coconut_json_matches_text_format() -> None:
    """Same problems, steps and answers; Coconut's [""] for an empty CoT becomes []."""
    for split in ("valid", "test"):
        assert _comparable(load_dataset("coconut_gsm8k_aug", split)) == _comparable(load_dataset("gsm8k_aug", split))


def test_thousands_commas_removed() -> None:
    answers = {r.answer for r in load_dataset("gsm8k_aug", "test")}
    assert "1450000" in answers and "40000" in answers


def test_prosqa_meta_and_sentences() -> None:
    records = load_dataset("prosqa")  # only split: valid
    assert len(records) == 300
    first = records[0]
    assert first.answer == "Tom is a lempus."
    assert first.steps == ["Tom is a terpus.", "Every terpus is a brimpus.", "Every brimpus is a lempus."]
    for key in ("idx_to_symbol", "edges", "root", "target", "neg_target"):
        assert key in first.meta
    assert score("#### Tom is a lempus.", first.answer) == 1.0
    assert score("#### Tom is a scrompus.", first.answer) == 0.0


def test_svamp_question_and_meta() -> None:
    first = load_dataset("svamp")[0]
    assert first.question == (
        "Each pack of dvds costs 76 dollars. If there is a discount of 25 dollars on each pack "
        "How much do you have to pay to buy each pack?"
    )
    assert first.answer == "51" and first.steps == []
    assert first.meta["Equation"] == "( 76.0 - 25.0 )"
    raw = json.loads((DATA / "svamp" / "SVAMP.json").read_text("utf-8"))
    for row, rec in zip(raw, load_dataset("svamp")):
        assert score("#### " + rec.answer, row["Answer"]) == 1.0


def test_multiarith_both_files_agree() -> None:
    a = load_dataset("multiarith")
    b = load_dataset(str(DATA / "multiarith" / "mawpsmultiarith.jsonl"))
    assert len(a) == len(b) == 600
    assert [r.answer for r in a] == [r.answer for r in b]
    assert [r.question for r in a] == [r.question for r in b]
    assert a[0].answer == "39"
    for rec in b:
        assert score("#### " + rec.answer, rec.answer) == 1.0
        assert score(rec.answer, rec.answer) == 1.0


def test_gsm_hard_float_targets() -> None:
    rows = [json.loads(line) for line in (DATA / "gsm_hard" / "gsmhardv2.jsonl").read_text("utf-8").splitlines()]
    records = load_dataset("gsm_hard")
    assert len(records) == len(rows) == 1319
    non_integer = negative = 0
    for row, rec in zip(rows, records):
        target = row["target"]
        assert float(rec.answer) == target  # full precision kept
        assert "e" not in rec.answer.lower()  # no exponent notation in answer text
        non_integer += "." in rec.answer
        negative += rec.answer.startswith("-")
        assert score("#### " + rec.answer, target) == 1.0
        assert score(rec.answer, target) == 1.0
        assert score(f"The answer is {target:,.2f}.", target) == 1.0 or abs(target) < 0.005
    assert (non_integer, negative) == (303, 146)
    assert records[1].answer == "3431580"
    assert "code" in records[1].meta


@pytest.mark.slow
def test_held_out_questions_in_the_training_data_are_counted_and_warned_about() -> None:
    """GSM-Hard (the paper's GRPO training set) is GSM8K's test set with numbers changed: 329 of its questions are
    GSM8K test questions word for word (328 with the same answer); the GSM8K-Aug validation set is GSM8K train's."""
    from types import SimpleNamespace

    from dgrpo.cli.train import warn_if_held_out_is_trained_on
    from dgrpo.data import load_spec, shared_questions

    assert shared_questions(load_spec("gsm_hard"), load_spec("gsm8k:test")) == (329, 328)
    assert shared_questions(load_spec("gsm8k:train"), load_spec("gsm8k_aug:valid")) == (500, 500)
    assert shared_questions(load_spec("gsm8k:train"), load_spec("gsm8k:test")) == (0, 0)
    cfg = SimpleNamespace(data=SimpleNamespace(train="gsm_hard"))
    held_out = {"gsm8k:test": load_spec("gsm8k:test"), "svamp": load_spec("svamp")}
    with pytest.warns(UserWarning) as seen:
        warn_if_held_out_is_trained_on(cfg, load_spec("gsm_hard"), held_out)  # type: ignore[arg-type]
    assert [str(w.message) for w in seen] == [
        "329 of the 1319 questions of gsm8k:test are in the training data gsm_hard word for word (328 with the same "
        "answer): that many of its items are trained on"
    ]


def test_default_split() -> None:
    assert len(load_dataset("gsm8k")) == 1319  # test
    assert len(load_dataset("gsm8k_aug")) == 1319
    assert len(load_dataset("prosqa")) == 300  # its only split


def test_name_aliases_and_case() -> None:
    assert len(load_dataset("GSM-Hard")) == 1319
    assert len(load_dataset("SVAMP")) == 1000


def test_registry_files_exist() -> None:
    for name, spec in DATASETS.items():
        for split, rel in spec.splits.items():
            assert (DATA / rel).is_file(), (name, split, rel)


def test_find_data_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert find_data_dir() == DATA
    monkeypatch.setenv("DGRPO_DATA_DIR", str(tmp_path))
    assert find_data_dir() == tmp_path.resolve()
    monkeypatch.delenv("DGRPO_DATA_DIR")
    monkeypatch.chdir(tmp_path)  # no ./data: nothing found (the code never guesses other places)
    assert find_data_dir() is None
    (tmp_path / "data" / "gsm8k").mkdir(parents=True)
    assert find_data_dir() == (tmp_path / "data").resolve()


# ------------------------------------------------------------------ errors


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


GSM_LINE = json.dumps({"question": "What is 2+2?", "answer": "2+2=<<2+2=4>>4\n#### 4"})


def test_error_bad_jsonl(tmp_path: Path) -> None:
    path = _write(tmp_path / "test.jsonl", GSM_LINE + "\n" + '{"question": "x", "answer": \n')
    with pytest.raises(DataError, match=r"test\.jsonl line 2: invalid JSON") as info:
        load_dataset(str(path))
    assert str(path) in str(info.value)


def test_error_bad_json_list(tmp_path: Path) -> None:
    path = _write(tmp_path / "x.json", '[\n {"question": "q", "steps": [], "answer": "1"},\n {"question": \n]')
    with pytest.raises(DataError, match=r"x\.json line 4: invalid JSON"):
        load_dataset(str(path))


def test_a_jsonl_file_holding_one_json_list_is_read_as_the_list(tmp_path: Path) -> None:
    """A JSON list saved under .jsonl (SVAMP.json copied as svamp.jsonl): its records (was 'line 1: invalid JSON')."""
    rows = [{"question": "q1", "steps": [], "answer": "1"}, {"question": "q2", "steps": [], "answer": "2"}]
    path = _write(tmp_path / "list.jsonl", json.dumps(rows, indent=1))
    assert [r.answer for r in load_dataset(str(path))] == ["1", "2"]


def test_error_missing_field_jsonl(tmp_path: Path) -> None:
    path = _write(tmp_path / "test.jsonl", "\n".join([GSM_LINE, GSM_LINE, json.dumps({"question": "q", "steps": []})]))
    with pytest.raises(DataError, match=r"line 3: missing field 'answer'") as info:
        load_dataset(str(path))
    assert str(info.value).startswith(str(path))


def test_error_missing_field_json_record(tmp_path: Path) -> None:
    rows = [{"question": "q", "steps": ["a"], "answer": "1"}, {"question": "q", "answer": "2"}]
    path = _write(tmp_path / "c.json", json.dumps(rows))
    with pytest.raises(DataError, match=r"c\.json line 1 \(record 2\): missing field 'steps'"):
        load_dataset(str(path))


@pytest.mark.parametrize("suffix", [".jsonl", ".json", "rows"])
def test_a_later_row_of_a_more_specific_format_is_refused_not_read_without_its_fields(tmp_path: Path, suffix) -> None:
    """The first row's keys pick the format: a later row holding ``steps`` among ``{question, answer}`` rows was read
    as one of them, its steps put in meta unseen (a record without steps, silently); it is an error naming the row
    and both formats. Rows of one format with other columns besides still read."""
    import dgrpo

    rows: list[dict] = [
        {"question": "q1", "answer": "1", "id": 1},
        {"question": "q2", "steps": ["a", "b"], "answer": "2"},
    ]
    source: str | list[dict]
    if suffix == "rows":
        source, where = rows, "the rows given row 2"
    else:
        text = "\n".join(map(json.dumps, rows)) if suffix == ".jsonl" else json.dumps(rows)
        source = str(_write(tmp_path / f"mixed{suffix}", text))
        where = "line 2" if suffix == ".jsonl" else "line 1 (record 2)"
    with pytest.raises(DataError) as info:
        dgrpo.load_dataset(source)
    said = str(info.value)
    assert f"{where}: a Coconut {{question, steps, answer}} row among {{question, answer}} rows" in said, said
    assert "data.steps_key" in said
    rows[1] = {"question": "q2", "answer": "2", "note": "x"}
    assert [r.meta.get("note") for r in dgrpo.load_dataset(rows)] == [None, "x"]


def test_error_wrong_type(tmp_path: Path) -> None:
    path = _write(tmp_path / "c.json", json.dumps([{"question": 3, "steps": [], "answer": "1"}]))
    with pytest.raises(DataError, match=r"line 1 \(record 1\): field 'question' must be a string"):
        load_dataset(str(path))


@pytest.mark.parametrize(
    "name, text, says",
    [
        ("e.jsonl", "", "the file is empty$"),
        ("e.json", "", "the file is empty$"),  # (it was 'line 1: invalid JSON (Expecting value, column 1)')
        ("e.jsonl", "\n\n  \n", r"the file is empty \(blank lines only\)"),
        ("e.csv", "\n", r"the file is empty \(blank lines only\)"),
        ("e.json", "[]", "contains no records"),
    ],
)
def test_error_empty(tmp_path: Path, name: str, text: str, says: str) -> None:
    path = _write(tmp_path / name, text)
    with pytest.raises(DataError, match=says) as info:
        load_dataset(str(path))
    assert str(path) in str(info.value)


def test_error_non_numeric_gold(tmp_path: Path) -> None:
    bad = json.dumps({"question": "q", "answer": "so\n#### many"})
    path = _write(tmp_path / "gsm8k" / "test.jsonl", GSM_LINE + "\n" + bad + "\n")
    with pytest.raises(DataError, match=r"line 2: final answer after '####' must be a number"):
        load_dataset(str(path))
    with pytest.MonkeyPatch.context() as mp:  # the same file through the name
        mp.setenv("DGRPO_DATA_DIR", str(tmp_path))
        with pytest.raises(DataError, match=r"gsm8k/test\.jsonl line 2"):
            load_dataset("gsm8k", "test")


def test_a_gold_whose_minus_sign_stands_apart_is_negative(tmp_path: Path) -> None:
    """``#### - 5`` is -5 in every format that reads a gold from text (GSM8K's refused it, a plain answer column kept
    it as the text "- 5", which "#### -5" did not match)."""
    gsm = json.dumps({"question": "q", "answer": "<<2-7=-5>>\n#### - 5"})
    assert load_dataset(str(_write(tmp_path / "g.jsonl", gsm + "\n")))[0].answer == "-5"
    assert load_dataset(str(_write(tmp_path / "a.txt", "q||<<2-7=-5>> #### - 5\n")))[0].answer == "-5"
    plain = json.dumps({"question": "q", "answer": "- 5"})
    assert load_dataset(str(_write(tmp_path / "p.jsonl", plain + "\n")))[0].answer == "-5"


def test_error_non_finite_target(tmp_path: Path) -> None:
    path = _write(tmp_path / "h.jsonl", '{"input": "q", "target": 1.5}\n{"input": "q", "target": NaN}\n')
    with pytest.raises(DataError, match=r"h\.jsonl line 2: field 'target' must be a finite number"):
        load_dataset(str(path))


def test_error_aug_text_line(tmp_path: Path) -> None:
    path = _write(tmp_path / "valid.txt", "q||<<1+1=2>> #### 2\nno separator here #### 3\n")
    with pytest.raises(DataError, match=r"valid\.txt line 2: expected 'question\|\|"):
        load_dataset(str(path))
    path = _write(tmp_path / "valid2.txt", "q||<<1+1=2>> #### 2\nq|| #### two\n")
    with pytest.raises(DataError, match=r"line 2: final answer after '####' must be a number"):
        load_dataset(str(path))


def test_error_invalid_utf8(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(GSM_LINE.encode() + b"\n" + b'{"question": "\xff\xfe"}\n')
    with pytest.raises(DataError, match=r"bad\.jsonl line 2: not valid UTF-8"):
        load_dataset(str(path))


def test_question_answer_rows_take_a_json_number_as_the_answer(tmp_path: Path) -> None:
    path = _write(tmp_path / "n.jsonl", '{"question": "2 + 2?", "answer": 4}\n{"question": "1 / 2?", "answer": 0.5}\n')
    assert [r.answer for r in load_dataset(str(path))] == ["4", "0.5"]
    with pytest.raises(DataError, match="must be a string, got bool"):
        load_dataset(str(_write(tmp_path / "b.jsonl", '{"question": "2 + 2?", "answer": true}\n')))
    # Coconut's {question, steps, answer} rows too (they refused a number: "must be a string, got float")
    rows = '{"question": "q1", "steps": ["<<1+1=2>>"], "answer": 0.1}\n{"question": "q2", "steps": [], "answer": 3}\n'
    assert [r.answer for r in load_dataset(str(_write(tmp_path / "s.jsonl", rows)))] == ["0.1", "3"]
    with pytest.raises(DataError, match="must be a string, got bool"):
        load_dataset(str(_write(tmp_path / "sb.jsonl", '{"question": "q", "steps": [], "answer": false}\n')))


def test_error_unrecognised_keys(tmp_path: Path) -> None:
    path = _write(tmp_path / "odd.jsonl", '{"foo": 1}\n')
    with pytest.raises(DataError, match=r"odd\.jsonl line 1: unrecognised record keys \(foo\).*data\.question_key"):
        load_dataset(str(path))
    # a key with a line break (the fuzz test below found one) is shown escaped: the message stays one line
    path = _write(tmp_path / "odd.jsonl", '{"in\\nput": 1, "tar\\tget": 2}\n')
    with pytest.raises(DataError, match=r"unrecognised record keys \(in\\nput, tar\\tget\)") as err:
        load_dataset(str(path))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "row, says",
    [
        ({"prompt": "q", "solution": "#### 2"}, "; TRL's prompt column: data.question_key=prompt, and data.answer_"),
        ({"prompt": [{"role": "user", "content": "q"}]}, "; TRL's conversational format (a list of messages) is not"),
        ({"messages": [{"role": "user", "content": "q"}]}, "; TRL's conversational format (a list of messages) is not"),
    ],
)
def test_a_trl_datasets_unrecognised_columns_are_told_what_to_set(tmp_path: Path, row, says) -> None:
    """A TRL dataset (a prompt column, or a conversation) had the generic "unrecognised record keys" line alone."""
    path = _write(tmp_path / "trl.jsonl", json.dumps(row) + "\n")
    with pytest.raises(DataError, match="unrecognised record keys") as err:
        load_dataset(str(path))
    assert says in str(err.value) and "\n" not in str(err.value)


def test_error_unknown_split() -> None:
    with pytest.raises(DataError, match=r"^dataset 'gsm8k' has splits train, test; got 'val'$"):
        load_dataset("gsm8k", "val")


def test_error_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="file not found"):
        load_dataset(str(tmp_path / "nope.jsonl"))
    with pytest.MonkeyPatch.context() as mp:  # data folder without the dataset's file (one without a hub copy)
        mp.setenv("DGRPO_DATA_DIR", str(tmp_path))
        with pytest.raises(DataError, match=r"^dataset 'prosqa': split 'valid': .*prosqa_valid\.json not found"):
            load_dataset("prosqa")


@pytest.mark.slow
def test_error_unknown_name_offline(tmp_path: Path) -> None:
    """Offline mode set before the libraries start, as a user sets it: an unknown name fails at once, in one line.
    (In a process that imported ``datasets`` before the variables were set, the library still tries the network.)"""
    code = "from dgrpo.data.loaders import load_dataset\nload_dataset('no_such_dataset_xyz')"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path)}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    last = r.stderr.strip().splitlines()[-1]
    said = "dgrpo.data.loaders.HubUnreached: unknown dataset 'no_such_dataset_xyz'"  # (a DataError)
    assert r.returncode == 1 and last.startswith(said)
    assert "hub could not be reached" in last


# ------------------------------------------------------------------ corruption fuzzing

# name, split, real file: small copies (first 50 records) are corrupted and read by path and by name.
FUZZ = [(n, s, rel) for n, s, rel, _ in REAL if not (n == "gsm8k" and s == "train")]
FUZZ_EXTRA = "multiarith/mawpsmultiarith.jsonl"


def _first_50(rel: str) -> str:
    text = (DATA / rel).read_text("utf-8")
    if rel.endswith(".json"):
        return json.dumps(json.loads(text)[:50], indent=1)
    return "".join(text.splitlines(keepends=True)[:50])


SMALL = {rel: _first_50(rel) for rel in [r for _, _, r in FUZZ] + [FUZZ_EXTRA]}

_junk = st.one_of(
    st.text(max_size=12),
    st.sampled_from(
        ['"', "{", "}", "[", "]", ",", ":", "\n", "||", "####", "NaN", "null", "1e999", '"answer"', "\\", "\ud800"]
    ),
)

_KEYS = ['"question"', '"answer"', '"steps"', '"target"', '"input"', '"Answer"', '"Body"', '"lSolutions"', "||", "####"]


@st.composite
def corruption(draw: st.DrawFn) -> tuple[int, str]:
    """A file index and its small copy with 1-3 random edits (delete / insert / replace spans, drop lines, rename)"""
    index = draw(st.integers(0, len(SMALL) - 1))
    text = list(SMALL.values())[index]
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["delete", "insert", "replace", "drop_line", "rename", "retype", "truncate"]))
        pos = draw(st.integers(0, len(text)))
        if op == "delete":
            text = text[:pos] + text[pos + draw(st.integers(1, 40)) :]
        elif op == "insert":
            text = text[:pos] + draw(_junk) + text[pos:]
        elif op == "replace":
            text = text[:pos] + draw(_junk) + text[pos + draw(st.integers(1, 10)) :]
        elif op == "drop_line":
            lines = text.split("\n")
            del lines[draw(st.integers(0, len(lines) - 1))]
            text = "\n".join(lines)
        elif op == "rename":
            key = draw(st.sampled_from(_KEYS))
            text = text.replace(
                key, draw(st.sampled_from(['"x"', '"answer"', "", "|", "###"])), draw(st.integers(1, 3))
            )
        elif op == "retype":
            value = draw(st.sampled_from(["null", "[]", "{}", "true", "-1", '"7"', '"seven"', "1e400", "[1, [2]]"]))
            key = draw(st.sampled_from([k + ": " for k in _KEYS if k.startswith('"')]))
            at = text.find(key, pos)
            if at >= 0:
                end = at + len(key)
                text = text[:end] + value + ", " + '"pad": ' + text[end:]
        else:
            text = text[:pos]
    return index, text


@given(corruption())
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@pytest.mark.slow
def test_corrupted_files_raise_only_data_error(case: tuple[int, str]) -> None:
    index, text = case
    rel = list(SMALL)[index]
    named = [(n, s) for n, s, r in FUZZ if r == rel]
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as mp:
        root = Path(tmp).resolve()
        mp.setenv("DGRPO_DATA_DIR", str(root))
        path = root / rel
        path.parent.mkdir(parents=True)
        path.write_bytes(text.encode("utf-8", "surrogatepass"))
        attempts = [(str(path), None)] + named
        for name_or_path, split in attempts:
            try:
                records = load_dataset(name_or_path, split)
            except DataError as exc:
                message = str(exc)
                assert str(path) in message and "\n" not in message, message
            else:
                assert records and all(isinstance(r, Record) and isinstance(r.answer, str) for r in records)


def test_small_copies_load_cleanly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The uncorrupted small copies load, so the fuzz test really exercises the parsers."""
    monkeypatch.setenv("DGRPO_DATA_DIR", str(tmp_path))
    for rel, text in SMALL.items():
        path = _write(tmp_path / rel, text)
        assert len(load_dataset(str(path))) == 50
    for name, split, _ in FUZZ:
        assert len(load_dataset(name, split)) == 50


def test_unreachable_hub_fails_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """No offline variable set and no connection to the hub: one line at once, not the hub libraries' retries."""
    import time

    import dgrpo.data.loaders as loaders

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(loaders, "hub_reachable", lambda: False)
    with pytest.raises(DataError):  # (the first call imports datasets: ~1 s, several under load; not what is timed)
        load_dataset("no_such_dataset_xyz")
    t0 = time.monotonic()
    with pytest.raises(DataError, match=r"unknown dataset 'no_such_dataset_xyz'.*hub could not be reached") as info:
        load_dataset("no_such_dataset_xyz")
    assert time.monotonic() - t0 < 5 and "\n" not in str(info.value)
    named = str(info.value).split("not a built-in name (")[1].split(")")[0].split(", ")
    assert {"builtin", "openmathinstruct2_gsm", "gsm8k"} <= set(named), (
        named
    )  # (the task and the paper's subset were left out)


def test_unreachable_hub_fails_at_once_for_the_streamed_openmath_subset(monkeypatch: pytest.MonkeyPatch) -> None:
    """``openmathinstruct2_gsm`` without a connection: one line at once (it streamed, and the hub libraries retried
    for ~25 s, printing their retry lines, before the error)."""
    import dgrpo.data.loaders as loaders

    def stream() -> None:
        raise AssertionError("the hub was asked")

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(loaders, "hub_reachable", lambda: False)
    monkeypatch.setattr(loaders, "stream_openmath", stream)
    with pytest.raises(DataError, match=r"^dataset 'openmathinstruct2_gsm' .*hub could not be reached: no connection"):
        load_dataset("openmathinstruct2_gsm")


def test_record_refuses_steps_given_as_one_string_or_non_strings() -> None:
    with pytest.raises(
        DataError, match=r"^steps must be a list of strings, one per reasoning step; got one str: split"
    ):
        Record("q", "<<1+1=2>>\n<<2+3=5>>", "5")  # type: ignore[arg-type]
    with pytest.raises(DataError, match=r"^steps must be a list of strings; steps\[1\] is int"):
        Record("q", ["<<1+1=2>>", 5], "5")  # type: ignore[list-item]
    assert Record("q", ("<<1+1=2>>", "<<2+3=5>>"), "5").steps == ["<<1+1=2>>", "<<2+3=5>>"]  # type: ignore[arg-type]


def test_record_meta_none_is_no_columns_and_a_non_mapping_is_refused() -> None:
    """``Record(q, steps, answer, None)`` was accepted, and training then died in data_columns with a bare
    "TypeError: 'NoneType' object is not iterable"."""
    from dgrpo.data.records import data_columns

    assert Record("q", [], "5", None).meta == {}  # type: ignore[arg-type]
    assert data_columns([Record("q", [], "5", None)]) == ()  # type: ignore[arg-type]
    for bad in (["level"], "level", {1: "x"}):
        with pytest.raises(DataError, match=r"^meta must be a mapping of column names to values, got "):
            Record("q", [], "5", bad)  # type: ignore[arg-type]


def _mapped(tmp_path: Path) -> Path:
    rows = [{"prompt": "1 + 1?", "target": 2, "work": "<<1+1=2>>\n<<2*1=2>>"}, {"prompt": "2 + 3?", "target": 5}]
    return _write(tmp_path / "mapped.jsonl", "".join(json.dumps(row) + "\n" for row in rows))


def test_misspelt_steps_key_is_an_error_naming_the_fields(tmp_path: Path) -> None:
    from dgrpo.config import DataConfig
    from dgrpo.data import load_spec

    path = _mapped(tmp_path)
    with pytest.raises(DataError, match=r"mapped\.jsonl: missing field 'nope' .*: prompt, target, work$"):
        load_spec(str(path), data=DataConfig(question_key="prompt", answer_key="target", steps_key="nope"))
    good = load_spec(str(path), data=DataConfig(question_key="prompt", answer_key="target", steps_key="work"))
    assert [r.steps for r in good] == [["<<1+1=2>>", "<<2*1=2>>"], []]  # one record without steps is fine
    plain = load_spec(str(path), data=DataConfig(question_key="prompt", answer_key="target"))  # default: no steps
    assert [r.steps for r in plain] == [[], []] and plain[0].meta["work"]


def test_a_mapped_column_holding_a_list_or_a_mapping_is_refused(tmp_path: Path) -> None:
    """A TRL chat-format prompt or a list of answers under data.question_key / data.answer_key was read as its
    Python repr (the question "[{'role': 'user', ...}]", the gold "['12']"): trained on, and never scored right."""
    from dgrpo.config import DataConfig
    from dgrpo.data import load_spec

    mapping = DataConfig(question_key="prompt", answer_key="target")
    cases = {
        '{"prompt": [{"role": "user", "content": "1 + 1?"}], "target": "2"}': r"column 'prompt' must be text or a "
        r"number, got list \(a chat-format conversation: give the question's text; data.chat_template: true wraps "
        r"it in the tokenizer's chat template\)",
        '{"prompt": "1 + 1?", "target": ["2"]}': r"column 'target' must be text or a number, got list",
        '{"prompt": "1 + 1?", "target": {"value": 2}}': r"column 'target' must be text or a number, got dict",
    }
    for line, says in cases.items():
        path = _write(tmp_path / "rows.jsonl", line + "\n")
        with pytest.raises(DataError, match=r"rows\.jsonl line 1: " + says):
            load_spec(str(path), data=mapping)
    path = _write(tmp_path / "rows.jsonl", '{"prompt": 12345, "target": 2.50}\n')
    (rec,) = load_spec(str(path), data=mapping)  # numbers are still read as text
    assert (rec.question, rec.answer) == ("12345", "2.5")


def test_held_out_data_need_not_have_the_steps_column(tmp_path: Path) -> None:
    """A validation, test or ``dgrpo eval`` file without the training data's steps column (evaluation never reads
    steps) was refused for ``data.steps_key``, which a checkpoint's run hands to ``dgrpo eval``; a mapped column
    missing from a row names the option that mapped it."""
    from dgrpo.config import DataConfig
    from dgrpo.data import load_spec

    path = _mapped(tmp_path)
    mapping = DataConfig(question_key="prompt", answer_key="target", steps_key="reasoning")
    with pytest.raises(DataError, match=r"missing field 'reasoning' \(data\.steps_key\) in every record"):
        load_spec(str(path), data=mapping)  # (training data: a misspelt key would train no steps)
    assert [r.answer for r in load_spec(str(path), data=mapping, held_out=True)] == ["2", "5"]
    fields = "; the row's fields: 'prompt', 'target', 'work'$"
    with pytest.raises(DataError, match=r"line 1: missing field 'question' \(data\.question_key\)" + fields):
        load_spec(str(path), data=DataConfig(question_key="question", answer_key="target"), held_out=True)
    with pytest.raises(DataError, match=r"line 1: missing field 'answer' \(data\.answer_key\)" + fields):
        load_spec(str(path), data=DataConfig(question_key="prompt", answer_key="answer"), held_out=True)
    # a file of another delimiter: one column, named by the whole header line ('prompt' is in it, but no field)
    semi = _write(tmp_path / "semi.csv", "prompt;target\nWhat is 2+2?;4\n")
    says = "line 2: missing field 'prompt' (data.question_key); the row's fields: 'prompt;target' (one column: is the"
    with pytest.raises(DataError, match=re.escape(says)):
        load_spec(str(semi), data=DataConfig(question_key="prompt", answer_key="target"), held_out=True)


def test_top_level_load_dataset_refuses_a_split_of_a_file_and_takes_a_column_mapping(tmp_path: Path) -> None:
    import dgrpo
    from dgrpo.config import DataConfig

    path = _mapped(tmp_path)
    with pytest.raises(DataError, match=r"^split='test': .*mapped\.jsonl is a file, which has no splits"):
        dgrpo.load_dataset(str(path), split="test")
    with pytest.raises(DataError, match=r"from Python: dgrpo\.load_dataset\(path, data=dgrpo\.config\.DataConfig\("):
        dgrpo.load_dataset(str(path))
    cols = DataConfig(question_key="prompt", answer_key="target", steps_key="work")
    assert [r.answer for r in dgrpo.load_dataset(str(path), data=cols)] == ["2", "5"]
    # the names --data takes: files and splits joined by '+' (the top level tried the hub with the whole name)
    assert [r.answer for r in dgrpo.load_dataset(f"{path}+{path}", data=cols)] == ["2", "5", "2", "5"]
    joined = dgrpo.load_dataset("builtin:test+builtin:valid")
    assert len(joined) == len(dgrpo.load_dataset("builtin:test")) + len(dgrpo.load_dataset("builtin", "valid"))


def test_top_level_load_dataset_reads_a_list_of_dicts_as_rows() -> None:
    """A list of dicts in memory (TRL's habit: rows with prompt / solution columns) was "load_dataset takes a dataset
    name or a file / folder path, got list", with no way to map its columns but through datasets.Dataset.from_list;
    it reads as a file of those rows (the same records), a split refused, a bad row named."""
    import dgrpo
    from dgrpo.config import DataConfig

    rows = [
        {"question": "What is 1 plus 1?", "answer": "so #### 2", "id": 7},
        {"question": "And 2 plus 3?", "answer": 5},
    ]
    recs = dgrpo.load_dataset(rows)
    assert [(r.question, r.answer, r.meta["id"]) for r in recs] == [
        (rows[0]["question"], "2", 7),
        (rows[1]["question"], "5", None),
    ]
    trl = [{"prompt": "What is 1 plus 1?", "solution": "#### 2"}]
    mapped = dgrpo.load_dataset(trl, data=DataConfig(question_key="prompt", answer_key="solution"))
    assert [(r.question, r.answer, r.meta["solution"]) for r in mapped] == [("What is 1 plus 1?", "2", "#### 2")]
    with pytest.raises(DataError, match=r"^load_dataset: rows in memory have no splits; got split='train'"):
        dgrpo.load_dataset(rows, "train")
    with pytest.raises(DataError, match=r"^the rows given row 2: expected a record \(mapping\), got int"):
        dgrpo.load_dataset([rows[0], 3])  # type: ignore[list-item]
    with pytest.raises(DataError, match=r"^the rows given row 1: unrecognised record keys \(prompt, solution\)"):
        dgrpo.load_dataset(trl)


@pytest.mark.parametrize(
    "spec, says",
    [
        ("builtin:test?n_test=3&n_test=4", "the option n_test is given twice"),
        ("builtin:test?n_test=1_000", "expects an integer, got '1_000'"),
        ("builtin:test?n_test=+5", "expects an integer, got '' (datasets are joined by '+')"),
        ("builtin:test?n_test=10000000000000000000000", "at most 2,000,000 problems per split"),
    ],
)
def test_builtin_options_in_a_name_are_read_strictly(spec, says):
    from dgrpo.data import load_spec

    with pytest.raises(DataError, match=re.escape(says)):
        load_spec(spec)


def test_training_data_named_without_a_split_takes_the_train_split():
    """``data.train=gsm8k`` trained on GSM8K's 1,319 test problems (a name alone means the test split)."""
    from dgrpo.data import training_split

    assert training_split("gsm8k") == "gsm8k:train"
    assert training_split("gsm8k:test") == "gsm8k:test"  # a split given is kept
    assert training_split("svamp") == "svamp"  # (no train split: its one split)
    assert training_split("gsm8k+svamp+builtin:train") == "gsm8k:train+svamp+builtin:train"
    assert training_split("my_data.jsonl") == "my_data.jsonl"
    assert training_split("builtin") == "builtin:train"  # (the built-in task's name alone: its test split)
    assert training_split("builtin?n_steps=4") == "builtin:train?n_steps=4"
    assert training_split("builtin:valid") == "builtin:valid"


def test_training_data_from_a_dataset_dict_folder_takes_its_train_split(tmp_path: Path):
    """``data.train=FOLDER`` (a ``DatasetDict.save_to_disk`` folder) trained on its test split."""
    datasets = pytest.importorskip("datasets")
    from dgrpo.data import load_spec, training_split

    rows = [{"question": f"What is {i} plus 1?", "answer": f"#### {i + 1}"} for i in range(5)]
    train, test = datasets.Dataset.from_list(rows), datasets.Dataset.from_list(rows[:2])
    datasets.DatasetDict({"train": train, "test": test}).save_to_disk(str(tmp_path / "both"))
    datasets.DatasetDict({"test": test}).save_to_disk(str(tmp_path / "only_test"))
    train.save_to_disk(str(tmp_path / "one"))
    assert len(load_spec(training_split(str(tmp_path / "both")))) == 5
    assert len(load_spec(str(tmp_path / "both"))) == 2  # (elsewhere: its test split)
    with pytest.raises(DataError, match="the splits test and no train split; name the one to train on as .*:SPLIT"):
        training_split(str(tmp_path / "only_test"))  # (it trained on its test split)
    assert len(load_spec(training_split(f"{tmp_path / 'only_test'}:test"))) == 2  # (named: taken as named)
    assert training_split(str(tmp_path / "one")) == str(tmp_path / "one")  # (a Dataset has no splits)
    for name in ("run:1", "mix+svamp", "q?x"):  # (PATH:train was cut at the first ':', '+' or '?')
        (tmp_path / "both").rename(tmp_path / name)
        assert len(load_spec(training_split(str(tmp_path / name)))) == 5
        assert len(load_spec(str(tmp_path / name))) == 2
        (tmp_path / name).rename(tmp_path / "both")
    extra = _write(tmp_path / "extra.jsonl", '{"question": "What is 9 plus 1?", "answer": "#### 10"}\n')
    assert len(load_spec(training_split(f"{tmp_path / 'both'}+{extra}"))) == 6  # (PATH:train+FILE: 'train+...')
    assert training_split("GSM8K") == "GSM8K:train" and training_split("GSM-Hard") == "GSM-Hard"  # (names as loaded)


def test_two_names_of_one_dataset_have_one_key(tmp_path: Path):
    """``dgrpo eval --data gsm_hard gsm-hard`` evaluated one set twice: an alias, the case, the default split, a
    relative path are the same data."""
    from dgrpo.data import dataset_key

    same = ["gsm_hard", "gsm-hard", "GSM_Hard:test", "gsmhard"]
    assert {dataset_key(s) for s in same} == {"gsm_hard:test"}
    assert dataset_key("gsm8k:train") != dataset_key("gsm8k") == dataset_key("gsm8k", split="test")
    assert dataset_key("gsm8k:test", split="train") == "gsm8k:train"  # (--split wins, as load_spec takes it)
    assert dataset_key("builtin") == dataset_key("builtin:test") != dataset_key("builtin:test?n_steps=4")
    assert dataset_key("gsm-hard+svamp") == "gsm_hard:test+svamp:test"
    assert dataset_key("openai/gsm8k:test?config=main") == "openai/gsm8k:test?config=main"
    f = tmp_path / "mine.jsonl"
    f.write_text("{}\n")
    assert dataset_key(str(f)) == dataset_key(str(tmp_path / "." / "mine.jsonl")) == str(f.resolve())


@pytest.mark.parametrize("suffix", ["jsonl", "json"])
def test_an_object_naming_a_key_twice_is_warned_about_once_per_file(tmp_path: Path, suffix: str) -> None:
    """JSON keeps the last of two values of one key: {"answer": "3", ..., "answer": "4"} trained on 4 silently."""
    rows = [f'{{"question": "q{i}", "answer": "3", "steps": [], "answer": "{i}"}}' for i in range(3)]
    text = "\n".join(rows) if suffix == "jsonl" else "[" + ",".join(rows) + "]"
    path = _write(tmp_path / f"d.{suffix}", text)
    with pytest.warns(UserWarning) as caught:
        recs = load_dataset(str(path))
    assert [r.answer for r in recs] == ["0", "1", "2"] and len(caught) == 1
    where = "line 1: " if suffix == "jsonl" else ""
    assert str(caught[0].message) == (
        f"{path}: an object names a key twice ({where}'answer'); the last value is read (2 more objects like it)"
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_dataset(str(_write(tmp_path / f"ok.{suffix}", text.replace('"answer": "3", ', ""))))


def test_a_path_holding_colon_plus_or_query_signs_is_one_path_to_keys_labels_and_checks(tmp_path: Path):
    """``PATH:SPLIT`` loaded a folder named ``run:1`` or ``mix+svamp``, but its key, its label in results and the
    ``--split`` check cut the path at the first ``:``, ``+`` or ``?`` (``mix+svamp --split valid`` was refused as
    joined datasets; ``q?x --split train`` was labelled ``q:train?x``)."""
    from dgrpo.cli.common import check_split
    from dgrpo.cli.evaluate import dataset_label
    from dgrpo.config import ConfigError
    from dgrpo.data import dataset_key, local_path

    for name in ("run:1", "mix+svamp", "q?x"):
        folder = tmp_path / name
        folder.mkdir()
        assert local_path(str(folder)) == (str(folder), None)
        assert local_path(f"{folder}:valid") == (str(folder), "valid")
        assert dataset_key(f"{folder}:test") == dataset_key(str(folder), split="test") == f"{folder.resolve()}:test"
        assert dataset_key(str(tmp_path / "." / name)) == str(folder.resolve())
        assert dataset_label(f"{folder}:test", "valid") == dataset_label(str(folder), "valid") == f"{folder}:valid"
        check_split(str(folder), "valid")  # (a folder: its split)
        data_file = _write(folder / "d.jsonl", '{"question": "q", "answer": "1"}\n')
        with pytest.raises(ConfigError, match="is a file, which has no splits"):
            check_split(str(data_file), "valid")
    assert local_path("builtin:test") is None and local_path("gsm8k:train") is None
    assert local_path(f"{tmp_path / 'run:1'}:train+gsm8k") is None  # (joined: '+' follows the split)
    with pytest.raises(ConfigError, match="joins datasets"):
        check_split("builtin:test+builtin:ood_steps", "valid")


def test_a_dataset_dict_of_several_splits_and_no_test_split_is_read_only_with_a_split_named(tmp_path: Path):
    """``data.test=FOLDER`` of a ``{train, validation}`` DatasetDict evaluated its first split, the training data,
    without a word; its only split, or the one named, is read."""
    datasets = pytest.importorskip("datasets")
    from dgrpo.data import load_hf_dataset, load_spec

    rows = [{"question": f"What is {i} plus 1?", "answer": f"#### {i + 1}"} for i in range(5)]
    both = datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(rows), "validation": datasets.Dataset.from_list(rows[:2])}
    )
    both.save_to_disk(str(tmp_path / "dd"))
    says = f"the splits train, validation and no test split; name the one to read as {tmp_path / 'dd'}:SPLIT"
    with pytest.raises(DataError, match=re.escape(says)):
        load_spec(str(tmp_path / "dd"), held_out=True)
    assert len(load_spec(f"{tmp_path / 'dd'}:validation")) == 2
    with pytest.raises(DataError, match=r"no test split; name the one to read as split=NAME"):
        load_hf_dataset(both)
    with pytest.raises(DataError, match=r"has no splits \(an empty DatasetDict\)"):
        load_hf_dataset(datasets.DatasetDict({}))
    assert len(load_hf_dataset(both, split="train")) == 5
    datasets.DatasetDict({"validation": both["validation"]}).save_to_disk(str(tmp_path / "one"))
    assert len(load_spec(str(tmp_path / "one"))) == 2  # (its only split)


def test_a_plain_folder_named_as_a_dataset_is_that_dataset_to_keys_and_the_training_split(tmp_path, monkeypatch):
    """``load_dataset("gsm8k")`` reads GSM8K where a plain folder ``gsm8k/`` exists (the data folder itself, as
    the loaders expect it), but data.train=gsm8k was read there as that folder's path: GSM8K's test split trained."""
    from dgrpo.data import dataset_key, local_path, training_split

    (tmp_path / "gsm8k").mkdir()
    (tmp_path / "mine").mkdir()
    monkeypatch.chdir(tmp_path)
    assert local_path("gsm8k") is None and local_path("gsm8k:train") is None and local_path("mine") == ("mine", None)
    assert training_split("gsm8k") == "gsm8k:train" and dataset_key("GSM8K") == dataset_key("gsm8k") == "gsm8k:test"


def test_a_coconut_row_with_a_gsm8k_style_answer_is_read_as_gsm8k_s(tmp_path: Path) -> None:
    """{question, steps, answer} rows whose answer is GSM8K's ``... #### 5`` kept the whole text as the gold: no
    answer, not even the gold's own ``#### 5``, scored right (a {question, answer} row of the same answer read 5)."""
    rows = [
        {"question": "What is 2+3?", "steps": ["2+3=5"], "answer": "2+3=5\n#### 5"},
        {"question": "What is 1+3?", "steps": ["1+3=4"], "answer": "#### 4"},
    ]
    path = _write(tmp_path / "c.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    recs = load_dataset(str(path))
    assert [r.answer for r in recs] == ["5", "4"] and [r.steps for r in recs] == [["2+3=5"], ["1+3=4"]]
    assert recs[0].meta["solution"] == "2+3=5\n#### 5"
    assert [score("#### 5", recs[0].answer), score("#### 4", recs[1].answer)] == [1.0, 1.0]
    with pytest.raises(DataError, match="empty after its '####'"):
        load_dataset(str(_write(tmp_path / "e.jsonl", '{"question": "q", "steps": [], "answer": "x ####"}\n')))


def test_a_mapped_steps_column_drops_blank_steps_as_every_other_reader_does(tmp_path: Path) -> None:
    """A steps column given as a list kept its blank strings ("" and "  "): the curriculum then trained and counted
    them as steps, where the same steps written as one string, or in Coconut's records, lose their blank lines."""
    from dgrpo.config import DataConfig
    from dgrpo.data import load_spec

    rows = [
        {"prompt": "2 + 3 ?", "target": "5", "work": ["<<2+3=5>>", "", "  "]},
        {"prompt": "4 - 1 ?", "target": "3", "work": "<<4-1=3>>\n\n"},
    ]
    path = tmp_path / "blank.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cols = DataConfig(question_key="prompt", answer_key="target", steps_key="work")
    assert [r.steps for r in load_spec(str(path), data=cols)] == [["<<2+3=5>>"], ["<<4-1=3>>"]]


def test_a_solution_column_beside_a_gsm8k_answer_is_kept(tmp_path: Path) -> None:
    """A GSM8K-style row's answer text reaches rewards as ``solution`` (TRL's name) when no column has that name; a
    file with its own ``solution`` column lost it to the answer text (the mapped and Coconut readers kept it)."""
    rows = [
        {"question": "2 + 3 ?", "answer": "<<2+3=5>> #### 5", "solution": "add them"},
        {"question": "4 - 1 ?", "answer": "<<4-1=3>> #### 3"},
    ]
    path = tmp_path / "gsm.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    recs = load_dataset(str(path))
    assert [r.meta["solution"] for r in recs] == ["add them", "<<4-1=3>> #### 3"]
    assert [r.answer for r in recs] == ["5", "3"]


def test_a_csv_row_shorter_than_its_header_names_the_columns_it_has_no_value_for(tmp_path: Path) -> None:
    """A CSV row short of a cell the record needs ('What is 2+2?' with no ',4') read "field 'answer' must be a string,
    got NoneType", and mapped, "column 'a' is empty (null)", as if the file had said null: it is one line naming the
    file, the line, the column without a value and the row's cells. A JSON null still reads as one."""
    from dgrpo.data.loaders import column_parser

    path = tmp_path / "rows.csv"
    path.write_text("question,answer,id\nWhat is 1+1?,2,a\nWhat is 2+2?\n")
    said = "rows.csv line 3: field 'answer' has no value: the row has 1 cell, fewer than the header's 3 columns"
    with pytest.raises(DataError, match=re.escape(f"{said} (none for 'id' either)") + "$"):
        load_dataset(str(path))
    path.write_text("q,a\nWhat is 1+1?,2\nWhat is 2+2?\n")
    said = "rows.csv line 3: column 'a' has no value: the row has 1 cell, fewer than the header's 2 columns"
    with pytest.raises(DataError, match=re.escape(said) + "$"):
        load_dataset(str(path), columns=column_parser("q", "a"))
    path.write_text("Body,Question,Answer\nTwo cats.,Legs?,8\nFive birds.,Legs?\n")  # (a number field: 'NoneType')
    with pytest.raises(DataError, match=re.escape("rows.csv line 3: field 'Answer' has no value: the row has 2 cells")):
        load_dataset(str(path))
    path.write_text("input,target,code\nWhat is 1.5*2?,three\n")  # (another problem of a short row: its cells too)
    said = "line 2: field 'target' must be a number, got 'three' (the row has 2 cells, fewer than the header's 3"
    with pytest.raises(DataError, match=re.escape(f"{said} columns: no value for 'code')") + "$"):
        load_dataset(str(path))
    nulls = tmp_path / "nulls.jsonl"
    nulls.write_text(json.dumps({"question": "What is 1+1?", "answer": None}) + "\n")
    with pytest.raises(DataError, match=re.escape("nulls.jsonl line 1: field 'answer' is empty (null)") + "$"):
        load_dataset(str(nulls))


def test_a_coconut_csv_says_how_to_read_its_steps_cell(tmp_path: Path) -> None:
    """A CSV with Coconut's column names (question, steps, answer) failed on every row with "field 'steps' must be a
    list of strings": a CSV cell is text. The line says how to read it, and that way reads one step per line."""
    from dgrpo.data.loaders import column_parser

    path = tmp_path / "coconut.csv"
    path.write_text('question,steps,answer\nWhat is 2+3-1?,"<<2+3=5>>\n<<5-1=4>>",4\n')
    hint = "field 'steps' must be a list of strings, got one string; to read it as one step per line (a CSV cell, say)"
    with pytest.raises(DataError, match=re.escape(f"coconut.csv line 2: {hint}")):
        load_dataset(str(path))
    (rec,) = load_dataset(str(path), columns=column_parser("question", "answer", "steps"))
    assert (rec.question, rec.steps, rec.answer) == ("What is 2+3-1?", ["<<2+3=5>>", "<<5-1=4>>"], "4")


def test_numpy_number_answers_of_rows_in_memory_read_as_the_numbers_they_print_as() -> None:
    """Rows built in memory with a NumPy answer: np.float32 and np.int64 were 'must be a string, got float32' unless
    the columns were mapped, and np.float64 (a float whose repr names its type) a decimal.ConversionSyntax traceback.
    Each reads as the number it prints as, mapped or not."""
    import numpy as np

    import dgrpo
    from dgrpo.config import DataConfig

    values = [np.float32(2.3), np.int64(7), np.float16(0.1), np.float64(2.5), np.float32(7e10)]
    expected = ["2.3", "7", "0.1", "2.5", "70000000000"]
    plain = dgrpo.load_dataset([{"question": "q", "answer": v} for v in values])
    mapped = dgrpo.load_dataset([{"q": "q", "a": v} for v in values], data=DataConfig(question_key="q", answer_key="a"))
    assert [r.answer for r in plain] == [r.answer for r in mapped] == expected


def test_a_mapped_numpy_answer_that_is_no_finite_number_is_refused_as_a_python_one_is() -> None:
    """A mapped answer column of np.float32 / np.float16 NaN or infinity was read as the answer text 'nan' or 'inf'
    (str() of a number that is no Python float), trained on and never matched; a Python float NaN was refused. Each is
    refused alike, mapped or not."""
    import numpy as np

    import dgrpo
    from dgrpo.config import DataConfig

    mapping = DataConfig(question_key="q", answer_key="a")
    for value in (float("nan"), np.float32("nan"), np.float16("inf"), np.float32("-inf")):
        with pytest.raises(DataError, match=r"row 1: column 'a' must be a finite number, got -?(nan|inf)$"):
            dgrpo.load_dataset([{"q": "q", "a": value}], data=mapping)
        with pytest.raises(DataError, match=r"row 1: field 'answer' must be a finite number, got -?(nan|inf)$"):
            dgrpo.load_dataset([{"question": "q", "answer": value}])


def test_a_decimal_answer_reads_as_its_number_mapped_or_not(tmp_path: Path) -> None:
    """A parquet decimal column (a Python Decimal per cell) as the answer was "field 'answer' must be a string, got
    Decimal", and mapped, Decimal('NaN') was the answer text 'NaN'. A decimal answer is its number, exactly (no float
    rounding); one that is no finite number is refused, as a float's is."""
    from decimal import Decimal

    import dgrpo
    from dgrpo.config import DataConfig

    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    pytest.importorskip("datasets")
    values = [Decimal("2.50"), Decimal("1E+3"), Decimal("0.1234567890123456789")]
    expected = ["2.5", "1000", "0.1234567890123456789"]
    path = tmp_path / "decimal.parquet"
    answers = pa.array(values, pa.decimal128(25, 19))
    pq.write_table(pa.table({"question": ["q1", "q2", "q3"], "answer": answers}), str(path))
    assert [r.answer for r in load_dataset(str(path))] == expected
    mapping = DataConfig(question_key="q", answer_key="a")
    assert [r.answer for r in dgrpo.load_dataset([{"q": "q", "a": v} for v in values], data=mapping)] == expected
    for value in (Decimal("NaN"), Decimal("-Infinity")):
        with pytest.raises(DataError, match=r"row 1: column 'a' must be a finite number, got -?(NaN|Infinity)$"):
            dgrpo.load_dataset([{"q": "q", "a": value}], data=mapping)
        with pytest.raises(DataError, match=r"row 1: field 'answer' must be a finite number, got -?(NaN|Infinity)$"):
            dgrpo.load_dataset([{"question": "q", "answer": value}])


def test_a_csv_steps_cell_holding_a_list_reads_as_that_list(tmp_path: Path) -> None:
    """A Coconut file written to CSV (pandas' to_csv writes a list cell as ``['a', 'b']``; json.dumps as ``["a",
    "b"]``), read as the error line says (data.steps_key=steps): the one step ``['<<2+3=5>>', '<<5-1=4>>']``, the
    list's text trained as a step. A cell holding a list of strings is that list; other text is one step a line."""
    from dgrpo.data.loaders import column_parser

    path = tmp_path / "coconut.csv"
    rows = ["\"['<<2+3=5>>', '<<5-1=4>>']\"", '"[""<<2+3=5>>"", ""<<5-1=4>>""]"', "[2+3=5]", "[5]"]
    path.write_text("question,steps,answer\n" + "".join(f"What is 2+3-1?,{cell},4\n" for cell in rows))
    got = [r.steps for r in load_dataset(str(path), columns=column_parser("question", "answer", "steps"))]
    assert got == [["<<2+3=5>>", "<<5-1=4>>"], ["<<2+3=5>>", "<<5-1=4>>"], ["[2+3=5]"], ["[5]"]]


def test_a_hub_unreached_error_pickles_and_copies_as_it_was_made() -> None:
    """A HubUnreached raised in a process pool's worker (load_dataset of a hub name, offline) is pickled back to the
    caller: unpickled from its message alone it was a TypeError ('__init__() missing 3 required positional
    arguments'), and copy.copy too. It comes back as raised, with its name and reason."""
    import copy
    import pickle

    from dgrpo.data.loaders import HubUnreached

    exc = HubUnreached("unknown dataset 'mine': ... and", "no connection to it", "mine", None)
    for back in (pickle.loads(pickle.dumps(exc)), copy.copy(exc)):
        assert type(back) is HubUnreached and str(back) == str(exc)
        assert (back.name, back.reason, back.unknown) == ("mine", "no connection to it", True)


def test_a_coconut_csv_whose_steps_cells_hold_lists_reads_without_a_mapping(tmp_path: Path) -> None:
    """A Coconut dataset saved with pandas' to_csv writes each steps list as its text (['<<2+3=5>>', '<<5-1=4>>']):
    read by its column names (question, steps, answer) alone, every row failed as 'must be a list of strings'."""
    path = tmp_path / "coconut.csv"
    path.write_text("question,steps,answer\nWhat is 2+3-1?,\"['<<2+3=5>>', '<<5-1=4>>']\",4\n")
    (rec,) = load_dataset(str(path))
    assert (rec.question, rec.steps, rec.answer) == ("What is 2+3-1?", ["<<2+3=5>>", "<<5-1=4>>"], "4")


def test_a_short_csv_row_under_a_header_naming_a_column_twice_counts_the_header_s_columns(tmp_path: Path) -> None:
    """A header naming a column twice is one key of each row (the later column's value): a short row's cells were
    counted from the row's keys, one short per repeat ('the row has 1 cell, fewer than the header's 2 columns' for a
    row of 2 cells under 3 columns). Counted from the header, and the column read without a value is said to be the
    later one of its name."""
    path = tmp_path / "twice.csv"
    path.write_text("question,answer,answer\nWhat is 1+1?,2,2\nWhat is 2+2?,4\n")
    said = (
        "twice.csv line 3: field 'answer' has no value: the row has 2 cells, fewer than the header's 3 columns; the "
        "header names 'answer' twice, and each row's later value is read"
    )
    with pytest.warns(UserWarning, match="names the column 'answer' twice"):
        with pytest.raises(DataError, match=re.escape(said) + "$"):
            load_dataset(str(path))
    path.write_text("id,question,id,answer,note\n1,What is 1+1?,2,2,x\n1,What is 2+2?,2\n")
    said = "line 3: field 'answer' has no value: the row has 3 cells, fewer than the header's 5 columns"
    with pytest.warns(UserWarning, match="names the column 'id' twice"):
        with pytest.raises(DataError, match=re.escape(f"{said} (none for 'note' either)") + "$"):
            load_dataset(str(path))
    path.write_text(",question,answer,\n,What is 1+1?,2,\n,What is 2+2?\n")  # (columns without a name: no warning)
    said = "line 3: field 'answer' has no value: the row has 2 cells, fewer than the header's 4 columns (none for ''"
    with pytest.raises(DataError, match=re.escape(said + " either)") + "$"):
        load_dataset(str(path))


def test_a_parquet_file_is_read_without_a_copy_in_the_datasets_cache(tmp_path: Path, monkeypatch) -> None:
    """``datasets.Dataset.from_parquet`` wrote an Arrow copy of each new parquet file into the datasets cache
    (~/.cache/huggingface/datasets: a 4 MiB file of 200,000 rows left 24 MiB there), unasked. The file is read in
    memory: the cache folder stays empty, and the rows are those from_parquet gave (a float32 column's numbers as
    written, an empty cell None)."""
    datasets = pytest.importorskip("datasets")
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    cache = tmp_path / "hf"
    cache.mkdir()
    monkeypatch.setenv("HF_HOME", str(cache))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(cache / "datasets"))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache / "datasets")  # (the variable is read at import)
    path = tmp_path / "mine.parquet"
    answers = pa.array([2.3, 0.1], pa.float32())
    pq.write_table(pa.table({"question": ["a?", "b?"], "answer": answers, "id": ["x", None]}), str(path))
    recs = load_dataset(str(path))
    assert [(r.answer, r.meta["id"]) for r in recs] == [("2.3", "x"), ("0.1", None)]
    assert sorted(p.relative_to(cache).as_posix() for p in cache.rglob("*")) == []
