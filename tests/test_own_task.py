"""Your own task: reward and scorer plug-ins, data you bring (JSONL, CSV, parquet, dataset folders, column mapping,
chat templates), hub ids wherever a model goes, checkpoints that carry their task, and resume that refuses a
silently changed config."""

import asyncio
import json
import math
import os
import re
import shutil
import subprocess
import sys
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from dgrpo.config import Config, load_config
from dgrpo.data import load_spec
from dgrpo.data.records import Record
from dgrpo.eval.scoring import RewardError, build_rewards, choice, exact, load_function, numeric

from conftest import TEST_SETS, tiny_args, tiny_config

REWARD_FILE = '''
def reward(completions, records):
    """A made-up reward in [0, 1]: the fraction of the completion's characters that are digits."""
    return [sum(ch.isdigit() for ch in c) / max(1, len(c)) for c in completions]


def broken(completions, records):
    return [0.5] * (len(completions) - 1)


def inf(completions, records):  # (a NaN is taken: TRL's "does not apply", as a None)
    return [float("inf")] * len(completions)


def raises(completions, records):
    raise KeyError("no such field")


weight = 3
'''


@pytest.fixture
def reward_file(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text(REWARD_FILE)
    return path


# ----------------------------------------------------------------------------------- rewards and scorers
@pytest.mark.slow
def test_a_reward_written_in_a_test_file_drives_grpo_from_the_command_line(
    sft_checkpoint, reward_file, tmp_path, run_cli
):
    """The metrics' reward column is what that function returns for the logged completions."""
    out = tmp_path / "run"
    over = {"grpo.reward": f"{reward_file}:reward", "grpo.log_rollouts": 1000, "grpo.steps": 2, "grpo.filter": "false"}
    r = run_cli("grpo", "--init", sft_checkpoint, *tiny_args(**over), "--out", out)
    assert r.returncode == 0, r.stderr[-2000:]
    fn = load_function(f"{reward_file}:reward")
    logged = [json.loads(x) for x in (out / "rollouts.jsonl").read_text().splitlines()]
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if '"reward_mean"' in x]
    assert [row["step"] for row in rows] == [0, 1]
    for row in rows:
        step = [x for x in logged if x["step"] == row["step"]]
        assert len(step) == TEST_SETS["grpo.group_size"] * 8  # every rollout of the step (8 prompts x K)
        values = fn([x["completion"] for x in step], [None] * len(step))
        assert [x["reward"] for x in step] == pytest.approx(values)
        assert row["reward_mean"] == pytest.approx(sum(values) / len(values))


TRL_REWARD_FILE = '''
def accuracy_reward(completions, solution, **kwargs):
    """As written for TRL's GRPOTrainer: the data's own column (solution: '... #### 18') by name."""
    return [float(s.split("####")[-1].strip() in c) for c, s in zip(completions, solution)]


def seen(prompts, completions, answer, **kwargs):
    CALLS.append({"prompts": prompts, "completions": completions, "answer": answer, **kwargs})
    return [1.0] * len(completions)


CALLS = []
'''


@pytest.mark.slow  # (a GRPO run and an evaluation)
def test_a_reward_written_for_trl_drives_grpo_and_eval_as_it_is(sft_checkpoint, tmp_path, run_cli, monkeypatch):
    """A TRL reward function (keyword arguments: prompts, completions and the data's columns) is taken as it is, as
    the reward, one of several weighted ones and the scorer of dgrpo eval (named relative to the folder it runs in:
    results.json names it by its absolute path, as a training run does; it named the relative one); a GSM8K-style
    file's ``solution`` column reaches it by name."""
    path = tmp_path / "trl_rewards.py"
    path.write_text(TRL_REWARD_FILE)
    rows = [
        {"question": f"What is {i} plus {i}?", "answer": str(2 * i), "solution": f"{i}+{i}\n#### {2 * i}"}
        for i in range(40)
    ]
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    rewards = f"[{{fn: '{path}:accuracy_reward', weight: 1.0}}, {{fn: numeric, weight: 0.5}}]"
    sets = {"data.train": data, "grpo.rewards": rewards, "grpo.steps": 2, "grpo.filter": "false", "data.valid": "''"}
    sets |= {"data.test": "[]", "grpo.log_rollouts": 1000}
    r = run_cli("grpo", "--init", sft_checkpoint, *tiny_args(**sets), "--out", tmp_path / "g")
    assert r.returncode == 0, r.stderr[-2000:]
    from dgrpo.config import reward_name

    mine = reward_name({"fn": f"{path}:accuracy_reward"})
    logged = [json.loads(x) for x in (tmp_path / "g" / "rollouts.jsonl").read_text().splitlines()]
    assert len(logged) == 2 * 8 * TEST_SETS["grpo.group_size"], len(logged)
    for x in logged:
        gold = str(int(x["question"].split()[2]) * 2)
        assert x[mine] == float(gold in x["completion"]) and x["reward"] == x[mine] + 0.5 * x["numeric"]
    monkeypatch.chdir(tmp_path)
    r = run_cli(
        "eval",
        "--model",
        tmp_path / "g",
        "--data",
        data,
        "--limit",
        8,
        "--out",
        tmp_path / "e",
        "--set",
        "eval.scorer=trl_rewards.py:accuracy_reward",
    )
    assert r.returncode == 0, r.stderr[-2000:]
    preds = [json.loads(x) for x in (tmp_path / "e" / "predictions.jsonl").read_text().splitlines()]
    assert len(preds) == 8 and all(p["correct"] == (p["gold"] in p["completion"]) for p in preds)
    assert json.loads((tmp_path / "e" / "results.json").read_text())["scorer"] == f"{path}:accuracy_reward"


def test_a_trl_reward_gets_one_entry_per_completion_of_every_column():
    from dgrpo.data.records import Record
    from dgrpo.eval.scoring import call_checked, load_function, trl_style

    recs = [Record("q1", ["a=1"], "1", {"solution": "s1", "source": "f"}), Record("q2", [], "2", {"level": 3})]
    ns: dict = {}
    exec(TRL_REWARD_FILE, ns)
    assert call_checked(ns["seen"], "seen", ["c1", "c2"], recs) == [1.0, 1.0]
    assert ns["CALLS"] == [
        {
            "prompts": ["q1", "q2"],
            "completions": ["c1", "c2"],
            "answer": ["1", "2"],
            "steps": [["a=1"], []],
            "solution": ["s1", None],
            "source": ["f", None],
            "level": [None, 3],
        }
    ]
    assert not trl_style(load_function("numeric")) and not trl_style(lambda completions, records, **kw: [])
    assert trl_style(ns["accuracy_reward"]) and not trl_style(print)

    # dgrpo's form, under other names or behind a decorator, is still called as dgrpo's (review: both broke)
    def mine(completions, records):
        return [float(r.answer in c) for c, r in zip(completions, records)]

    def logged(fn):
        def wrapper(*args, **kwargs):  # (no functools.wraps)
            return fn(*args, **kwargs)

        return wrapper

    def renamed(completions, batch, **kw):
        return [float(r.answer in c) for c, r in zip(completions, batch)]

    assert call_checked(logged(mine), "f", ["1", "x"], recs) == [1.0, 0.0]
    match = "'batch' is no column of the data .*'completions' gets the completions and 'batch' the records"
    with pytest.warns(UserWarning, match=match):
        assert call_checked(renamed, "renamed", ["1", "x"], recs) == [1.0, 0.0]

    def texts_first(texts, answer, scale=1.0, **kw):  # (review: the warning named 'scale' as getting the records)
        return [0.0] * len(texts)

    with pytest.warns(UserWarning, match="'texts' is no column .*'texts' gets the completions and 'answer' the rec"):
        call_checked(texts_first, "texts_first", ["1", "x"], recs)
    assert not trl_style(ns["accuracy_reward"], ["prompts", "completions"])  # (no solution column: dgrpo's form)
    import numpy as np

    with pytest.raises(RewardError, match=r"returned an array of shape \(2, 1\); one number per completion is 1-D"):
        call_checked(lambda completions, records: np.zeros((2, 1)), "column", ["1", "x"], recs[:1] * 2)
    with pytest.raises(RewardError, match=r"raised TypeError: .*'level'.* dgrpo's form is fn\(completions, records\)"):
        call_checked(lambda completions, level, steps, **kw: [0.0] * len(completions), "f", ["1", "x"], recs[:1] * 2)


def test_a_trl_reward_reads_mapped_columns_by_their_own_names(tmp_path):
    """A TRL reward naming the column data.answer_key maps (``target``) was called as dgrpo's fn(completions, records)
    (that column was not passed), and scored every rollout 0; a column named ``solution`` was overwritten by the
    mapped answer's text."""
    from dgrpo.config import DataConfig
    from dgrpo.eval.scoring import call_checked

    data = tmp_path / "mine.jsonl"
    rows = [
        {"prompt": "2+2?", "target": "4", "work": "2+2=4", "level": 1},
        {"prompt": "3+3?", "target": "x #### 6", "work": "3+3=6", "solution": "my own"},
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    recs = load_spec(str(data), data=DataConfig(question_key="prompt", answer_key="target", steps_key="work"))
    assert [r.meta.get("target") for r in recs] == ["4", "x #### 6"] and recs[1].answer == "6"
    assert [r.meta.get("work") for r in recs] == ["2+2=4", "3+3=6"] and "prompt" not in recs[0].meta
    assert [r.meta.get("solution") for r in recs] == [None, "my own"]  # (the user's column, not the answer's text)

    def exact_target(completions, target, **kwargs):
        return [float(c == t) for c, t in zip(completions, target)]

    assert call_checked(exact_target, "exact_target", ["4", "6"], recs) == [1.0, 0.0]


def test_a_trl_reward_gets_a_column_of_some_records_in_every_batch():
    """A column only some records have: a batch without it called the function in dgrpo's form (its parameter got
    the records, all truthy: every rollout scored 1 on such steps, and 2 ranks disagreed with 1 process)."""
    from dgrpo.data.records import Record
    from dgrpo.eval.scoring import RewardPart, Rewards, data_columns

    def hinted(completions, hint, **kwargs):
        return [0.0 if h is None else 1.0 for h in hint]

    data = [Record("q1", [], "1", {"hint": "h"}), Record("q2", [], "2"), Record("q3", [], "3")]
    rewards = Rewards([RewardPart("hinted", hinted)])
    rewards.columns = data_columns(data)
    assert rewards.columns == ("hint",)
    assert rewards(["a", "b"], data[:2]) == [1.0, 0.0] and rewards(["b", "c"], data[1:]) == [0.0, 0.0]


def test_loaded_records_have_every_column_so_each_shard_gets_the_same_keywords(tmp_path):
    """A column some rows lack is None in those rows, as a Hugging Face dataset holds it: an eval scorer in TRL's form
    was called in dgrpo's form on a rank whose shard had no row with the column (a review: validation accuracy
    depended on the number of ranks)."""
    from dgrpo.eval.scoring import call_checked

    data = tmp_path / "hints.jsonl"
    rows = [{"question": "1+1?", "answer": "2", "hint": "add"}, {"question": "2+2?", "answer": "4"}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    recs = load_spec(str(data))
    assert [r.meta.get("hint", "absent") for r in recs] == ["add", None]

    def hinted(completions, hint, **kwargs):
        return [0.0 if h is None else 1.0 for h in hint]

    assert call_checked(hinted, "hinted", ["a"], recs[1:]) == [0.0]  # (the shard without the hint: TRL's form still)


def test_the_default_validation_gives_a_shard_of_records_made_in_python_every_column(tmp_path, monkeypatch):
    """Records made in Python need not share their ``meta`` keys (loaded ones do, above). The trainers' default
    validation scored a rank's shard as it was: on a shard with no record holding ``hint``, a scorer in TRL's form
    was called in dgrpo's form (its ``hint`` got the records). It is told the whole validation data's columns."""
    import dgrpo.eval.evaluate as ev
    from dgrpo.model.factory import load_model
    from dgrpo.training.run_inputs import default_evaluate_fn

    (tmp_path / "hinted.py").write_text(
        "def hinted(completions, hint, **kwargs):\n    return [0.0 if h is None else 1.0 for h in hint]\n"
    )
    cfg = tiny_config(**{"eval.scorer": f"{tmp_path / 'hinted.py'}:hinted"})
    lm = load_model(cfg.model, cfg.task, seed=0)
    valid = [Record("1+1?", [], "2", {"hint": "add"}), Record("2+2?", [], "4")]
    monkeypatch.setattr(ev, "generate_answers", lambda *a, **kw: ["#### 4"])
    assert default_evaluate_fn(cfg, valid)(lm, valid[1:]).correct == 0  # (a shard of one record: its hint is None)
    assert valid[1].meta == {}  # (the caller's records are not changed)


def test_the_default_validation_names_the_validation_set_in_its_warnings():
    """A test set's warning about questions cut to data.max_question_tokens names the set; the trainers' default
    validation said "4 of 16 evaluated questions are longer ..." of no set at all."""
    from dgrpo.model.factory import load_model
    from dgrpo.training.run_inputs import default_evaluate_fn

    cfg = tiny_config(**{"data.max_question_tokens": 4, "eval.max_new_tokens": 2})
    lm = load_model(cfg.model, cfg.task, seed=0)
    valid = [Record("What is 12 plus 30, counted twice over?", [], "84")]
    with pytest.warns(UserWarning, match=r"1 of 1 evaluated questions of the validation set are longer than data"):
        default_evaluate_fn(cfg, valid)(lm, valid)


def test_a_failing_scorer_plugin_is_named_once(tmp_path):
    """A plug-in scorer's error was wrapped twice: 'scorer f raised RewardError: scorer f raised ValueError: ...'."""
    from dgrpo.data.records import Record
    from dgrpo.eval.evaluate import _graded
    from dgrpo.eval.scoring import build_scorer

    path = tmp_path / "bad.py"
    path.write_text("def bad(completions, records):\n    raise ValueError('no')\n")
    with pytest.raises(RewardError) as raised:
        _graded([Record("q", [], "1")], ["#### 1"], build_scorer(f"{path}:bad"))
    assert str(raised.value) == f"scorer {path}:bad raised ValueError: no on row 0 (completion '#### 1', question 'q')"


def test_a_failing_reward_or_scorer_names_the_first_row_that_fails_alone():
    """A batched function's error named the function alone: which of a batch's completions broke it (a scorer of
    one's own failing on a model's answer at a stage's end) was left to guess."""
    from dgrpo.data.records import Record
    from dgrpo.eval.scoring import call_checked

    recs = [Record(f"question {i}", [], str(i)) for i in range(3)]

    def strict(completions, records):
        return [float(c.split("####")[1].strip() == r.answer) for c, r in zip(completions, records)]

    def strict_trl(completions, answer, **kwargs):
        return [float(c.split("####")[1].strip() == a) for c, a in zip(completions, answer)]

    for fn in (strict, strict_trl):
        with pytest.raises(RewardError) as raised:
            call_checked(fn, "mine", ["#### 0", "no marker", "#### 2"], recs, what="scorer")
        assert str(raised.value) == (
            "scorer mine raised IndexError: list index out of range on row 1 (completion 'no marker', question "
            "'question 1')"
        )

    calls = []

    def whole_batch(completions, records):  # (a judge's per-request limit: no row is to blame; each call may cost)
        calls.append(len(completions))
        if len(completions) > 1:
            raise ValueError("batch too large")
        return [0.0] * len(completions)

    many = [Record(f"question {i}", [], str(i)) for i in range(512)]
    with pytest.raises(RewardError) as raised:
        call_checked(whole_batch, "mine", ["a"] * 512, many)
    assert str(raised.value) == (
        "reward mine raised ValueError: batch too large on rows 0-1 together (of the 512 in the call), neither half of "
        "them alone: it depends on the rows called together, not on one row (row 0: completion 'a', question "
        "'question 0')"
    )
    assert len(calls) <= 1 + 2 * 9  # (the batch, then at most two halves per halving: 257 calls before)

    def pairs_only(completions, records):  # (works on pairs; its bug is on row 5's answer)
        if len(completions) % 2:
            raise ValueError("pairs only")
        return [float(c.split("####")[1] == r.answer) for c, r in zip(completions, records)]

    texts = ["#### 0", "#### 1", "#### 2", "#### 3", "#### 4", "five", "#### 6", "#### 7"]
    with pytest.raises(RewardError) as raised:  # (row 0 alone failed with another error, and was named)
        call_checked(pairs_only, "mine", texts, [Record(f"q{i}", [], str(i)) for i in range(8)])
    assert str(raised.value).endswith(  # (rows 4-5, no further: row 5 alone raises another error)
        "list index out of range on rows 4-5 together (of the 8 in the call), neither half of them alone: it depends "
        "on the rows called together, not on one row (row 4: completion '#### 4', question 'q4')"
    )
    texts[5] = "#### 5"
    texts[6] = "six"  # (a pair of rows 6-7 fails alone: no single row to name, the pair's first is not blamed)
    with pytest.raises(RewardError) as raised:
        call_checked(pairs_only, "mine", texts, [Record(f"q{i}", [], str(i)) for i in range(8)])
    assert " on row 6 " not in str(raised.value) and " on rows 6-7 together (of the 8 in the call)" in str(raised.value)


def test_a_reward_plugin_failing_on_rows_called_together_says_so_in_its_line(tmp_path):
    """A reward that fails only on several completions at once (normalized over its call: zero spread when they are
    alike; a judge's limit on a request's size) named no row, nor that no row alone fails it: the line said only the
    error, which every row called alone then contradicts."""
    from dgrpo.data.records import Record
    from dgrpo.eval.scoring import build_rewards

    path = tmp_path / "plug.py"
    path.write_text(
        "def spread(completions, records):\n"
        "    lens = [len(c) for c in completions]\n"
        "    return [(n - min(lens)) / (max(lens) - min(lens)) if len(lens) > 1 else 0.0 for n in lens]\n"
        "def at_most_two(completions, records):\n"
        "    if len(completions) > 2:\n"
        "        raise ValueError('at most 2 per request')\n"
        "    return [1.0] * len(completions)\n"
    )
    group = [Record(f"question {i // 4}", [], "1") for i in range(8)]  # (2 prompts, 4 completions each)
    for name, texts, rows, error in (
        ("spread", ["#### 1"] * 8, "0-1", "ZeroDivisionError: division by zero"),
        ("at_most_two", ["#### 1", "#### 2", "#### 3", "#### 4"] * 2, "0-3", "ValueError: at most 2 per request"),
    ):
        with pytest.raises(RewardError) as raised:
            build_rewards(f"{path}:{name}", [], "")(texts, group)
        assert str(raised.value) == (
            f"reward {path}:{name} raised {error} on rows {rows} together (of the 8 in the call), neither half of them "
            "alone: it depends on the rows called together, not on one row (row 0: completion '#### 1', question "
            "'question 0')"
        )


def test_a_kwargs_reward_called_as_dgrpos_form_says_so_once():
    """A ``**kwargs`` reward with two required parameters, the second no column of the data, is taken for dgrpo's
    form (it gets the records), with a warning, once."""
    from dgrpo.data.records import Record
    from dgrpo.eval.scoring import call_checked

    def wants_examples(completions, examples, **kwargs):
        return [0.0] * len(completions)

    recs = [Record("q", [], "1", {"level": 1})]
    with pytest.warns(UserWarning, match="'examples' is no column of the data \\(columns: prompts, completions"):
        call_checked(wants_examples, "mine.py:wants_examples", ["c"], recs)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        call_checked(wants_examples, "mine.py:wants_examples", ["c"], recs)  # (once per function)


def _wants_trainer_state(completions, trainer_state, **kwargs):
    return [0.0] * len(completions)


def _wants_completion_ids(completions, completion_ids, **kwargs):
    return [0.0] * len(completions)


def _wants_both_by_keyword(completions, *, trainer_state, completion_ids, **kwargs):
    return [0.0] * len(completions)


def _defaults_trainer_state(completions, trainer_state=None, **kwargs):
    return [float(trainer_state is None)] * len(completions)


@pytest.mark.parametrize("fn", [_wants_trainer_state, _wants_completion_ids])
def test_a_reward_requiring_what_only_trl_passes_fails_saying_dgrpo_does_not_pass_it(fn):
    """``fn(completions, trainer_state, **kwargs)`` was written for TRL: called as dgrpo's form it got the records
    as its trainer_state, with a warning, and trained; it fails as docs/from_trl.md says: dgrpo does not pass that
    keyword, and a default adapts the function (the line said only how it was called)."""
    from dgrpo.data.records import Record
    from dgrpo.eval.scoring import RewardError, call_checked

    keyword = fn.__name__.removeprefix("_wants_")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (no "called as dgrpo's form" warning)
        with pytest.raises(RewardError) as raised:
            call_checked(fn, "mine.py:f", ["c"], [Record("q", [], "1")])
    said = str(raised.value)
    assert said.startswith(f"reward mine.py:f raised TypeError: {fn.__name__}() missing 1 required positional argument")
    assert said.endswith(
        f"(dgrpo does not pass {keyword}, which TRL's GRPOTrainer passes: give it a default, {keyword}=None, and "
        "handle None)"
    ), said


def test_a_reward_requiring_both_trl_keywords_names_both_and_a_default_adapts_it():
    from dgrpo.data.records import Record
    from dgrpo.eval.scoring import RewardError, call_checked

    recs = [Record("q", [], "1")]
    with pytest.raises(RewardError, match="does not pass trainer_state or completion_ids, which TRL's GRPOTrainer "):
        call_checked(_wants_both_by_keyword, "mine.py:f", ["c"], recs)
    assert call_checked(_defaults_trainer_state, "mine.py:g", ["c"], recs) == [1.0]  # (the advice works)


async def _async_trl_reward(completions, answer, **kwargs):
    await asyncio.sleep(0)
    return [float(c == a) for c, a in zip(completions, answer)]


async def _async_dgrpo_reward(completions, records):
    if any(c == "boom" for c in completions):
        raise ValueError("no boom")
    return [float(c == r.answer) for c, r in zip(completions, records)]


def test_an_async_reward_is_awaited_as_trls_grpo_trainer_does_in_a_notebooks_running_loop_too():
    """``async def`` rewards (TRL's GRPOTrainer awaits them) returned a coroutine, "not one value per completion",
    with a "never awaited" warning; they are run to their end, in either form, from a thread that runs an event loop
    too (a notebook's); one that raises names its row as any reward does."""
    from dgrpo.data.records import Record
    from dgrpo.eval.scoring import RewardError, call_checked

    recs = [Record("q1", [], "1"), Record("q2", [], "2")]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (no "coroutine was never awaited")
        assert call_checked(_async_trl_reward, "f", ["1", "3"], recs) == [1.0, 0.0]
        assert call_checked(_async_dgrpo_reward, "g", ["0", "2"], recs) == [0.0, 1.0]

        async def in_a_running_loop() -> list[float]:
            return call_checked(_async_trl_reward, "f", ["1", "2"], recs)

        assert asyncio.run(in_a_running_loop()) == [1.0, 1.0]
    with pytest.raises(RewardError, match="reward g raised ValueError: no boom on row 1 "):
        call_checked(_async_dgrpo_reward, "g", ["2", "boom"], recs)


def test_a_reward_whose_first_parameter_is_trls_prompts_without_kwargs_is_warned_once():
    """``f(prompts, completions)`` (no ``**kwargs``: TRL's trainer, passing more keywords, could not call it) is
    called as dgrpo's form, its prompts the completions: it was silent (only a gold check giving 0 hinted at it);
    dgrpo's own form, under any names, is not warned of."""
    from dgrpo.data.records import Record
    from dgrpo.eval.scoring import call_checked

    def prompts_first(prompts, completions):
        return [0.0] * len(prompts)

    def mine(texts, rows):
        return [0.0] * len(texts)

    recs = [Record("q", [], "1")]
    with pytest.warns(UserWarning, match="first parameter is TRL's 'prompts', but it takes no \\*\\*kwargs, so"):
        call_checked(prompts_first, "mine.py:prompts_first", ["c"], recs)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        call_checked(prompts_first, "mine.py:prompts_first", ["c"], recs)  # (once per function)
        call_checked(mine, "mine.py:mine", ["c"], recs)


def test_a_runs_reward_and_scorer_files_are_recorded_by_absolute_path(reward_file, tmp_path, monkeypatch):
    """``path/file.py:function`` given relative to where training runs is kept absolute in the run's config (so
    ``dgrpo eval`` finds the checkpoint's scorer from anywhere); the parts keep their names."""
    from dgrpo.cli.train import record_init
    from dgrpo.config import Config, load_config

    monkeypatch.chdir(tmp_path)
    sets = ["eval.scorer=my_reward.py:reward", "grpo.rewards=[{fn: my_reward.py:reward}, {fn: numeric}]"]
    cfg = record_init(load_config(Config, None, [*sets, "grpo.filter_reward=numeric"]), None, tmp_path / "run")
    assert cfg.eval.scorer == f"{reward_file.resolve()}:reward"
    assert cfg.grpo.rewards == [
        {"fn": f"{reward_file.resolve()}:reward", "name": "my_reward:reward"},
        {"fn": "numeric", "name": "numeric"},
    ]
    cfg = record_init(load_config(Config, None, ["eval.scorer=nope.py:f"]), None, tmp_path / "run")
    assert cfg.eval.scorer == "nope.py:f"
    # a run that named the part by its path (dgrpo before file:function) keeps that name when resumed: its metric's
    old = {"grpo": {"rewards": [{"fn": f"{reward_file.resolve()}:reward", "name": "my_reward.py:reward"}]}}
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text(json.dumps(old))
    cfg = record_init(load_config(Config, None, sets), None, tmp_path / "run")
    assert [r["name"] for r in cfg.grpo.rewards] == ["my_reward.py:reward", "numeric"]


@pytest.mark.parametrize(
    "name,needle",
    [
        ("broken", "returned 31 values for 32 completions"),
        ("inf", "returned inf for row 0"),
        ("raises", "raised KeyError"),
        ("missing", "has no function 'missing'"),
        ("weight", "'weight' in"),  # (it said: has no function 'weight')
    ],
)
def test_a_misbehaving_reward_is_exit_2_naming_it_before_anything_is_written(
    sft_checkpoint, reward_file, tmp_path, run_cli, name, needle
):
    over = {"grpo.reward": f"{reward_file}:{name}", "grpo.prompts_per_step": 8, "grpo.group_size": 4}
    r = run_cli("grpo", "--init", sft_checkpoint, *tiny_args(**over), "--out", tmp_path / "o")
    assert r.returncode == 2, r.stderr[-2000:]
    line = r.stderr.strip().splitlines()
    assert len(line) == 1 and name in line[0] and (needle in line[0] or name == "broken"), r.stderr
    assert name != "weight" or "is not a function (its type: int)" in line[0]
    assert not (tmp_path / "o").exists()  # the reward is checked on gold answers before the run directory is made


def test_several_weighted_rewards_and_the_filter_rule(reward_file):
    from dgrpo.data.records import Record

    recs = [Record("q", [], "12"), Record("q", [], "7")]
    rw = build_rewards(
        "",
        [
            {"fn": "numeric", "weight": 1.0, "name": "correct"},
            {"fn": f"{reward_file}:reward", "weight": 0.5, "name": "digits"},
        ],
        "numeric",
        "correct",
    )
    total = rw(["#### 12", "#### 8"], recs)
    digits = [2 / 7, 1 / 6]
    assert total == pytest.approx([1.0 + 0.5 * digits[0], 0.0 + 0.5 * digits[1]])
    assert rw.filter_values(total) == [1.0, 0.0]  # the window applies to the named 0/1 reward
    rw_total = build_rewards("", [{"fn": "numeric", "weight": 2.0}], "numeric")
    with pytest.raises(RewardError, match="must lie in \\[0, 1\\]"):
        rw_total.filter_values(rw_total(["#### 12"], recs[:1]))  # a total of 2.0 cannot be an accuracy
    with pytest.raises(RewardError, match=r"it is -0\.04 for row 1: set grpo\.filter_reward"):  # (a float32's
        rw_total.filter_values([0.5, float(np.float32(-0.04))])  # value, -0.03999999910593033, in 7 digits)
    within = rw_total.filter_values([1.0000001, 0.9999999999999999, -1e-9])  # (a float sum just past 0 or 1)
    assert within == [1.0, 0.9999999999999999, 0.0]
    gold = r"for the row with completion '#### 12', .*; found by the check made before training.*on gold answers"
    with pytest.raises(RewardError, match=gold):
        rw_total.smoke_test(recs, check_filter=True)  # (its row 0 was taken for a rollout's: it is a gold answer's)
    with pytest.raises(RewardError, match="not one of the rewards"):
        build_rewards("", [{"fn": "numeric"}], "numeric", "nope")
    with pytest.warns(UserWarning, match="grpo.reward 'exact' is not used: grpo.rewards is set and replaces it"):
        build_rewards("exact", [{"fn": "numeric"}], "numeric")


def test_a_reward_that_gives_every_gold_answer_zero_is_warned_about(tmp_path):
    """The run's first call, on gold answers: a reward or scorer that counts none of them correct (answers read
    wrongly, a scorer of another format) is warned about before training on zeros; a working one is not."""
    import warnings

    from dgrpo.data.records import Record

    recs = [Record("q", [], "12"), Record("q", [], "7")]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build_rewards("", [], "numeric").smoke_test(recs, check_filter=True)
    with pytest.warns(UserWarning, match="gives 0 to the gold answer of every record it was tried on \\(2"):
        build_rewards("", [], "choice").smoke_test(recs, check_filter=True)


def test_grpo_says_when_its_scorer_or_task_is_not_the_one_its_init_checkpoint_was_trained_with():
    import warnings

    from dgrpo.cli.train import warn_if_init_differs
    from dgrpo.config import to_dict

    cfg, exact = tiny_config(), tiny_config(**{"eval.scorer": "exact"})
    with pytest.warns(UserWarning, match="eval.scorer is 'numeric' here but 'exact' in the --init checkpoint's run"):
        warn_if_init_differs(to_dict(exact), cfg)
    other_task = to_dict(cfg) | {"task": to_dict(cfg)["task"] | {"n_steps": 2}}
    with pytest.warns(UserWarning, match="the built-in task differs .*task.n_steps is 4 here, 2 there"):
        warn_if_init_differs(other_task, cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_init_differs(to_dict(exact), exact)
        warn_if_init_differs(None, cfg)  # a hub model: no run of ours behind it
        warn_if_init_differs(other_task, tiny_config(**{"data.train": "my.jsonl"}))  # not the built-in data
        warn_if_init_differs(to_dict(tiny_config(**{"task.n_train": 7})), cfg)  # fewer problems of the same task


@pytest.mark.parametrize(
    "text, letter",
    [
        ("#### (C) A tree", "C"),  # after '#', the answer comes first: it was read as the article A
        ("#### D, not B", "D"),  # (was B)
        ("#### A is correct", "A"),
        ("#### c", "C"),  # a lone letter in lower case (was None)
        ("C. A tree", "C"),  # a gold written with its option's text (was A)
        ("Options (B) and (D); the answer is (D)", "D"),  # without '#': the last marked letter
        ("A careful reading gives C", "C"),
        ("The answer is C", "C"),
        ("The answer is B because A is a trap", "B"),  # after "The answer is", the answer comes first (was A)
        ("Answer: (A) and not B.", "A"),  # (was B)
        ("(C) is my answer: yes", "C"),  # a marker with no letter after it: the last marked letter, as before
        ("a tree", None),
        ("#### 42", None),
    ],
)
def test_choice_reads_the_letter_where_the_answer_is_written(text, letter):
    from dgrpo.eval.scoring import choice_letter

    assert choice_letter(text) == letter


def test_builtin_scorers():
    from dgrpo.data.records import Record

    r = [Record("q", [], "Tom is a wumpus."), Record("q", [], "B"), Record("q", [], "40")]
    assert exact(["#### tom is a WUMPUS", "#### C", "x"], r) == [1.0, 0.0, 0.0]
    # a number gold is kept normalised by the loaders ("$3.50" is 3.5, "007" is 7): the answer is read alike
    numbers = [Record("q", [], "3.5"), Record("q", [], "7"), Record("q", [], "40000")]
    assert exact(["#### $3.50", "#### 007", "#### 40,000."], numbers) == [1.0, 1.0, 1.0]
    assert exact(["#### 3.51", "#### 7 apples", "#### 4000"], numbers) == [0.0, 0.0, 0.0]
    # Coconut's checkpoints write "### answer" (Coconut reads the text after the last '#'): it was scored 0
    assert exact(["Tom is a lempus. ### Tom is a wumpus.", "### Tom is a lempus."], [r[0], r[0]]) == [1.0, 0.0]
    assert choice(["The answer is (B).", "#### b", "#### B", "#### D, not B"], [r[1]] * 4) == [1.0, 1.0, 1.0, 0.0]
    assert numeric(["#### 40.0", "#### 41"], [r[2], r[2]]) == [1.0, 0.0]
    # Coconut's run.py check: strings after the last '#', commas dropped; what numeric also credits does not count
    from dgrpo.eval.scoring import SCORERS

    got = SCORERS["coconut"](
        ["### 40", "#### 4,0", "#### 40.0", "#### $40", "The answer is 40", "<<8*5=40>>"], [r[2]] * 6
    )
    assert got == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert numeric(["#### 40.0", "#### $40", "The answer is 40", "<<8*5=40>>"], [r[2]] * 4) == [1.0] * 4


# ----------------------------------------------------------------------------------- a text-answer task
@pytest.mark.slow
def test_a_text_answer_task_trains_and_evaluates_end_to_end(tmp_path, run_cli):
    """50 records with word answers, the exact-match scorer: SFT, GRPO and eval run and use the same definition
    of correct (eval takes the scorer from the checkpoint's run_config.json)."""
    colors = ["red", "green", "blue", "white", "black"]
    rows = [
        {"question": f"Item {i} is painted {colors[i % 5]}. What color is item {i}?", "answer": colors[i % 5]}
        for i in range(50)
    ]
    data = tmp_path / "colors.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    sets = {
        "data.train": data,
        "data.valid": data,
        "data.test": f"[{data}]",
        "eval.scorer": "exact",
        "sft.batch_size": 16,
        "sft.num_epochs": 2,
        "sft.epochs_per_stage": 1,
        "grpo.steps": 2,
        "grpo.prompts_per_step": 4,
        "grpo.max_new_tokens": 8,
        "eval.max_new_tokens": 8,
    }
    r = run_cli("sft", *tiny_args(**sets), "--out", tmp_path / "sft")
    assert r.returncode == 0, r.stderr[-2000:]
    r = run_cli("grpo", "--init", tmp_path / "sft", *tiny_args(**sets), "--out", tmp_path / "grpo")
    assert r.returncode == 0, r.stderr[-2000:]
    r = run_cli("eval", "--model", tmp_path / "grpo", "--data", data, "--out", tmp_path / "ev")
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads((tmp_path / "ev" / "results.json").read_text())
    preds = [json.loads(x) for x in (tmp_path / "ev" / "predictions.jsonl").read_text().splitlines()]
    assert res["n"] == 50 and res["correct"] == sum(p["correct"] for p in preds) and res["scorer"] == "exact"
    assert all(
        p["correct"] == (exact([p["completion"]], [type("R", (), {"answer": p["gold"]})])[0] == 1.0) for p in preds
    )


# ----------------------------------------------------------------------------------- data you bring
def test_a_float32_answer_column_is_read_as_the_number_written(tmp_path):
    """Arrow hands a float32 column's 2.3 over as 2.299999952316284: the gold was that, and '#### 2.3' scored 0."""
    datasets = pytest.importorskip("datasets")
    import numpy as np

    from dgrpo.reward import score

    answers = np.array([2.3, 0.1, 7.0, 1e-7, 7e10], dtype=np.float32)
    ds = datasets.Dataset.from_dict({"question": ["a?", "b?", "c?", "d?", "e?"], "answer": answers})
    ds.to_parquet(str(tmp_path / "f32.parquet"))
    ds.save_to_disk(str(tmp_path / "folder"))
    for path in (tmp_path / "f32.parquet", tmp_path / "folder"):
        recs = load_spec(str(path))
        assert [r.answer for r in recs] == ["2.3", "0.1", "7", "0.0000001", "70000000000"]
        assert score("#### 2.3", recs[0].answer) == 1.0


def test_a_csv_row_longer_than_its_header_is_one_line(tmp_path):
    """csv.DictReader keeps a long row's extra cells under the key None, which reached a scorer as a column; a short
    row's missing cells are None."""
    from dgrpo.data.records import DataError

    path = tmp_path / "rows.csv"
    path.write_text("question,answer,n\n1+1?,2\n")
    assert load_spec(str(path))[0].meta["n"] is None
    path.write_text("question,answer\n1+1?,2\nWhat is 1,000+1?,1001\n")
    with pytest.raises(DataError, match="line 3: 3 cells, more than the header's 2 columns"):
        load_spec(str(path))


def test_a_csv_header_naming_a_column_twice_is_warned_of(tmp_path):
    """``question,question,answer`` kept the later question of every row without a word (a JSON object naming a key
    twice is warned of); it is warned of once, naming the column, and the later value is still the one read."""
    path = tmp_path / "rows.csv"
    path.write_text("question,question,answer\nfirst?,second?,2\nthird?,fourth?,3\n")
    with pytest.warns(UserWarning, match=r"rows.csv: the header names the column 'question' twice") as caught:
        recs = load_spec(str(path))
    assert [r.question for r in recs] == ["second?", "fourth?"] and len(caught) == 1
    path.write_text("question,answer,,\nfirst?,2,,\n")  # (a spreadsheet's unnamed empty columns: nothing to say)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [r.question for r in load_spec(str(path))] == ["first?"]


def test_a_csv_rows_line_is_its_first_line_after_blank_lines_and_quoted_line_breaks(tmp_path):
    """csv.DictReader skips blank lines out of sight: the line named for a bad row was the blank line's, or one
    further up after each blank line. A quoted value that spans lines moves the next row down by as many lines."""
    from dgrpo.data.records import DataError
    from dgrpo.data.tables import read_csv_lines

    path = tmp_path / "rows.csv"
    for eol in ("\n", "\r\n"):
        path.write_bytes(eol.join(["question,answer", "", "", '"two', 'lines?",2', "", "q,6,extra", ""]).encode())
        with pytest.raises(DataError, match="line 7: 3 cells, more than the header's 2 columns"):
            load_spec(str(path))
        path.write_bytes(eol.join(["question,answer", "", '"two', 'lines?",2', "", "q3?", ""]).encode())
        assert read_csv_lines(path)[1] == [3, 6]
        with pytest.raises(DataError, match="rows.csv line 6: field 'answer'"):  # (a row's own error: its line too)
            load_spec(str(path))


def test_csv_parquet_dataset_folders_and_column_mapping(tmp_path):
    from dgrpo.config import DataConfig

    rows = [{"prompt": f"What is {i} plus 1?", "target": str(i + 1), "work": f"{i}+1={i + 1}"} for i in range(6)]
    csv = tmp_path / "d.csv"
    csv.write_text("prompt,target,work\n" + "".join(f"{r['prompt']},{r['target']},{r['work']}\n" for r in rows))
    cols = DataConfig(question_key="prompt", answer_key="target", steps_key="work")
    recs = load_spec(str(csv), data=cols)
    assert [(r.question, r.answer, r.steps) for r in recs][:2] == [
        ("What is 0 plus 1?", "1", ["0+1=1"]),
        ("What is 1 plus 1?", "2", ["1+1=2"]),
    ]
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_list(rows)
    ds.to_parquet(str(tmp_path / "d.parquet"))
    ds.save_to_disk(str(tmp_path / "folder"))
    datasets.DatasetDict({"train": ds, "test": ds.select(range(2))}).save_to_disk(str(tmp_path / "dict"))
    assert [r.answer for r in load_spec(str(tmp_path / "d.parquet"), data=cols)] == [r["target"] for r in rows]
    assert len(load_spec(str(tmp_path / "folder"), data=cols)) == 6
    assert len(load_spec(str(tmp_path / "dict"), data=cols)) == 2  # a DatasetDict: the test split
    assert len(load_spec(str(tmp_path / "dict"), data=cols, split="train")) == 6
    gaps = [{**rows[0], "work": None}, rows[1]]  # a missing chain: parquet holds None (it was refused as no list)
    datasets.Dataset.from_list(gaps).to_parquet(str(tmp_path / "gaps.parquet"))
    assert [r.steps for r in load_spec(str(tmp_path / "gaps.parquet"), data=cols)] == [[], ["1+1=2"]]
    from dgrpo.data.records import DataError

    with pytest.raises(DataError, match="d.csv line 2: missing field 'answer'"):  # (the first data row: was 'row 0')
        load_spec(str(csv), data=DataConfig(question_key="prompt", answer_key="answer"))
    nulls = tmp_path / "nulls.jsonl"  # a null answer was read as the answer 'None'
    nulls.write_text('{"prompt": "2+2?", "target": 4}\n{"prompt": "Name?", "target": null}\n')
    with pytest.raises(DataError, match="nulls.jsonl line 2: column 'target' is empty \\(null\\)"):
        load_spec(str(nulls), data=cols)
    # a GSM8K-style solution under other keys is read as GSM8K's; a standard file beside it keeps its own format
    gsm = tmp_path / "renamed.jsonl"
    gsm.write_text(json.dumps({"q": "Tom has 7 and 7 more?", "sol": "He has 7+7=<<7+7=14>>14.\n#### 14"}) + "\n")
    mapped = DataConfig(question_key="q", answer_key="sol")
    [rec] = load_spec(str(gsm), data=mapped)
    assert (rec.question, rec.steps, rec.answer) == ("Tom has 7 and 7 more?", ["<<7+7=14>>"], "14")
    assert rec.meta["solution"].endswith("#### 14") and numeric(["#### 14"], [rec]) == exact(["#### 14"], [rec]) == [
        1.0
    ]
    std = tmp_path / "std.jsonl"
    std.write_text(json.dumps({"question": "What is 2 plus 2?", "answer": "2+2=<<2+2=4>>4\n#### 4"}) + "\n")
    assert [(r.question, r.answer) for r in load_spec(f"{gsm}+{std}", data=mapped)] == [
        ("Tom has 7 and 7 more?", "14"),
        ("What is 2 plus 2?", "4"),
    ]


def test_a_list_answer_a_null_question_and_a_gzipped_file_are_named_for_what_they_are(tmp_path):
    """An answer column holding a list was called 'a chat-format conversation: give the question's text'; a null
    question was 'empty' where a null answer was 'empty (null)'; a .jsonl.gz file was 'line 1: not valid UTF-8'."""
    import gzip

    from dgrpo.config import DataConfig
    from dgrpo.data.records import DataError

    cols = DataConfig(question_key="problem", answer_key="solution", steps_key="")
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"problem": "1/2 + 1/2?", "solution": ["1", "2/2"]}) + "\n")
    with pytest.raises(DataError, match=r"column 'solution' must be text or a number, got list \(several accepted"):
        load_spec(str(path), data=cols)
    path.write_text(json.dumps({"problem": None, "solution": "1"}) + "\n")
    with pytest.raises(DataError, match=r"d.jsonl line 1: column 'problem' is empty \(null\)$"):
        load_spec(str(path), data=cols)
    packed = tmp_path / "d.jsonl.gz"
    packed.write_bytes(gzip.compress(json.dumps({"problem": "q", "solution": "1"}).encode()))
    with pytest.raises(DataError, match=r"d.jsonl.gz: a gzip-compressed file; decompress it first"):
        load_spec(str(packed), data=cols)


def test_a_gsm8k_style_steps_column_keeps_its_answer_line_out_of_the_steps(tmp_path):
    """A solution 'lines... #### 25/24' named as data.steps_key (the answer column itself, or beside a column of bare
    answers) kept '#### 25/24' as its last step: SFT trained the answer as a reasoning step, then again as the
    answer. A Markdown heading '#### ...' in the steps is no answer and stays."""
    from dgrpo.config import DataConfig

    path = tmp_path / "d.jsonl"
    rows = [
        {"q": "7/8 + 1/6?", "sol": "7/8 = 21/24\n1/6 = 4/24\n#### 25/24", "final": "25/24"},
        {"q": "1 + 1?", "sol": "#### Adding\n1 + 1 = 2\n#### 2.0", "final": "2"},
        {"q": "2 + 2?", "sol": ["2 + 2 = 4", "#### 4"], "final": "4"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    expected = [["7/8 = 21/24", "1/6 = 4/24"], ["#### Adding", "1 + 1 = 2"], ["2 + 2 = 4"]]
    beside = load_spec(str(path), data=DataConfig(question_key="q", answer_key="final", steps_key="sol"))
    assert [(r.steps, r.answer) for r in beside] == list(zip(expected, ["25/24", "2", "4"]))
    path.write_text("".join(json.dumps(r) + "\n" for r in rows[:2]))
    itself = load_spec(str(path), data=DataConfig(question_key="q", answer_key="sol", steps_key="sol"))
    assert [(r.steps, r.answer) for r in itself] == list(zip(expected, ["25/24", "2"]))


def test_a_missing_csv_or_parquet_file_is_a_missing_file_not_a_hub_dataset(tmp_path, monkeypatch):
    """A typo in data.train=my_train.csv was looked up on the Hugging Face hub ('unknown dataset ...: the hub could
    not be reached', or a wait for it): only .json, .jsonl and .txt names were taken for files. A relative path says
    where it was looked for."""
    from dgrpo.data.loaders import reads_from_the_hub
    from dgrpo.data.records import DataError

    monkeypatch.chdir(tmp_path)
    for name in ("my_train.csv", "sub/my_train.parquet", "my_train.pq", "my_train.jsonl"):
        assert not reads_from_the_hub(name)
        says = f"{name}: file not found (a relative path is read from the working directory, {tmp_path})"
        with pytest.raises(DataError, match=f"^{re.escape(says)}$"):
            load_spec(name)
    with pytest.raises(DataError, match=f"^{re.escape(str(tmp_path / 'x.csv'))}: file not found$"):
        load_spec(str(tmp_path / "x.csv"))


def test_a_folder_of_split_files_names_the_files_to_give(tmp_path, monkeypatch):
    """A folder holding train.jsonl and test.jsonl (Hugging Face's load_dataset reads it as splits) was only 'is a
    directory; give a data file or a dataset name'."""
    from dgrpo.data.records import DataError

    (tmp_path / "mine").mkdir()
    for name in ("train.jsonl", "test.jsonl", "notes.md"):
        (tmp_path / "mine" / name).write_text(json.dumps({"question": "q", "answer": "1"}) + "\n")
    monkeypatch.chdir(tmp_path)
    says = "mine: is a directory; give a data file or a dataset name (it holds mine/test.jsonl, mine/train.jsonl: name"
    with pytest.raises(DataError, match=f"^{re.escape(says)} the file to read\\)$"):
        load_spec("mine")


def test_an_empty_parquet_file_contains_no_records(tmp_path):
    """A parquet file of no rows was 'not a readable parquet file (ValueError: Instruction "train" corresponds to no
    data!)', as a JSON file of no records ([]) is 'contains no records'."""
    datasets = pytest.importorskip("datasets")
    from dgrpo.data.records import DataError

    datasets.Dataset.from_dict({"question": [], "answer": []}).to_parquet(str(tmp_path / "none.parquet"))
    with pytest.raises(DataError, match=r"none.parquet contains no records$"):
        load_spec(str(tmp_path / "none.parquet"))
    (tmp_path / "text.parquet").write_text("question,answer\n")
    with pytest.raises(DataError, match=r"text.parquet: not a readable parquet file \(ArrowInvalid"):
        load_spec(str(tmp_path / "text.parquet"))


def test_a_steps_list_ending_in_its_answer_line_and_a_blank_keeps_the_answer_out_of_the_steps(tmp_path):
    """A steps list ['2 + 2 = 4', '#### 4', ''] (a solution split on its newlines, ending in one) kept '#### 4' as its
    last step: the blank after it was taken for the answer line and dropped. The blanks go first."""
    from dgrpo.config import DataConfig

    path = tmp_path / "d.jsonl"
    rows = [{"q": "2 + 2?", "sol": ["2 + 2 = 4", "#### 4", ""], "final": "4"}]
    rows.append({"q": "3 + 3?", "sol": ["3 + 3 = 6", "#### 6", "  ", ""], "final": "6"})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    records = load_spec(str(path), data=DataConfig(question_key="q", answer_key="final", steps_key="sol"))
    assert [(r.steps, r.answer) for r in records] == [(["2 + 2 = 4"], "4"), (["3 + 3 = 6"], "6")]


def test_load_dataset_names_what_it_takes(tmp_path):
    """A list of dicts (data already in memory) failed deep inside ('list' object has no attribute 'startswith'): it
    is read as rows; another object is a one-line DataError; a Path is a path."""
    import dgrpo
    from dgrpo.data.records import DataError

    assert [r.answer for r in dgrpo.load_dataset([{"question": "q", "answer": "1"}])] == ["1"]
    with pytest.raises(DataError, match="load_dataset takes a dataset name or a file / folder path, got int"):
        dgrpo.load_dataset(3)
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"question": "q", "answer": "1"}) + "\n")
    assert [r.answer for r in dgrpo.load_dataset(path)] == ["1"]


def test_data_inspect_prints_a_record_whose_meta_is_no_json(tmp_path, run_cli):
    """A parquet file's timestamp column, kept in meta, made ``dgrpo data inspect`` die on json.dumps."""
    import datetime

    datasets = pytest.importorskip("datasets")
    row = {"question": "1+1?", "answer": "2", "when": datetime.datetime(2026, 1, 2)}
    datasets.Dataset.from_list([row]).to_parquet(str(tmp_path / "d.parquet"))
    r = run_cli("data", "inspect", tmp_path / "d.parquet")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[-1])["example"]["meta"]["when"] == "2026-01-02 00:00:00"


def test_the_other_fields_of_a_standard_row_reach_the_reward_as_meta(tmp_path):
    """A {question, answer} row (and GSM8K's, GSM8K-Aug's) dropped its other fields, while Coconut's rows and a
    column mapping kept them in ``meta``: a reward reading ``record.meta["difficulty"]`` got a KeyError."""
    from dgrpo.data import load_spec

    rows = [
        {"question": "1+1?", "answer": "2", "difficulty": 2},
        {"question": "1+2?", "answer": 3, "difficulty": 1},  # (a JSON number answer)
        {"question": "2+2?", "answer": "2+2=<<2+2=4>>4\n#### 4", "difficulty": 3},  # GSM8K
        {"question": "2+3?", "cot": "<<2+3=5>>", "answer": "5", "difficulty": 4},  # GSM8K-Aug
        {"question": "3+3?", "steps": ["<<3+3=6>>"], "answer": "6", "difficulty": 5},  # Coconut
    ]
    for i, row in enumerate(rows):
        path = tmp_path / f"{i}.jsonl"
        path.write_text(json.dumps(row) + "\n")
        [rec] = load_spec(str(path))
        assert rec.meta["difficulty"] == row["difficulty"] and rec.meta["source"] == str(path)
        assert not {"question", "answer", "cot", "steps"} & rec.meta.keys()


def test_chat_template_wraps_the_question_and_is_saved_with_the_checkpoint(tokenizer, tmp_path):
    from dgrpo.model.latent_lm import LatentLM

    from conftest import make_lm

    lm = make_lm(tokenizer)
    template = "{% for m in messages %}<|user|> {{ m['content'] }}\n{% endfor %}"
    lm.tokenizer.chat_template = template + "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    plain = lm.format_question("What is 2?")
    lm.settings.chat_template = True
    wrapped = lm.format_question("What is 2?")
    assert plain == "What is 2?\n" and wrapped == "<|user|> What is 2?\n<|assistant|>"
    ids, _ = lm.encode_questions(["What is 2?"])
    assert lm.tokenizer.decode(ids[0, :-1]) == wrapped and int(ids[0, -1]) == lm.start_id
    lm.save_pretrained(tmp_path / "ck")
    again = LatentLM.from_pretrained(tmp_path / "ck")
    assert again.settings.chat_template and again.format_question("What is 2?") == wrapped


# ----------------------------------------------------------------------------------- models and checkpoints
def test_builtin_checkpoint_tokenizer_round_trips_in_plain_transformers(sft_checkpoint):
    from transformers import AutoTokenizer

    from dgrpo.model.latent_lm import LatentLM

    ours = LatentLM.from_pretrained(sft_checkpoint).tokenizer
    plain = AutoTokenizer.from_pretrained(sft_checkpoint)
    text = "Start with 3. Add 4. Times 7. Minus 15. Answer mod 10.\n<|start-latent|><|latent|><|end-latent|>"
    text += "<<3+4=7>>\n#### 4"
    ids = plain(text, add_special_tokens=False)["input_ids"]
    assert ids == ours(text, add_special_tokens=False)["input_ids"]
    assert plain.decode(ids) == text


def test_eval_rebuilds_the_checkpoints_own_task_and_overrides_win(sft_checkpoint, tmp_path, run_cli):
    """The session checkpoint was trained on 4-step problems (TEST_SETS) over tiny.yaml's 2-step task: eval of
    builtin:test without options evaluates 4-step problems, and --set task.* still wins (and says so)."""
    run_config = json.loads((sft_checkpoint / "run_config.json").read_text())
    assert run_config["task"]["n_steps"] == 4 and run_config["task"]["n_test"] == 64
    r = run_cli("eval", "--model", sft_checkpoint, "--data", "builtin:test", "--out", tmp_path / "a")
    assert r.returncode == 0, r.stderr[-2000:]
    preds = [json.loads(x) for x in (tmp_path / "a" / "predictions.jsonl").read_text().splitlines()]
    assert len(preds) == 64 and all(p["question"].count(".") == 6 for p in preds)  # Start + 4 ops + Answer
    assert "run_config.json" in r.stdout
    r = run_cli(
        "eval",
        "--model",
        sft_checkpoint,
        "--data",
        "builtin:test",
        "--split",
        "valid",
        "--set",
        "task.n_valid=8",
        "--out",
        tmp_path / "b",
    )
    assert r.returncode == 0 and "overridden: task.n_valid" in r.stdout
    res = json.loads((tmp_path / "b" / "results.json").read_text())
    assert res["n"] == 8 and res["dataset"] == "builtin:valid"  # --split honours task.*, and wins over test


def mapped_checkpoint(checkpoint: Path, model: Path, steps_key: str) -> Path:
    """A copy at ``model`` of ``checkpoint`` whose run_config.json says its run read its data from the columns
    ``prompt`` and ``target`` (and ``steps_key``)."""
    shutil.copytree(checkpoint, model)
    run_config = json.loads((model / "run_config.json").read_text())
    run_config["data"].update(question_key="prompt", answer_key="target", steps_key=steps_key)
    (model / "run_config.json").write_text(json.dumps(run_config))
    (model / "manifest.json").unlink()  # (the change is ours)
    return model


def test_eval_of_a_file_without_the_checkpoints_steps_column(sft_checkpoint, tmp_path, run_cli):
    """A checkpoint trained with ``data.steps_key`` hands it to ``dgrpo eval``, whose test file (no steps: evaluation
    reads none) was refused: 'missing field ... (data.steps_key) in every record'."""
    model = mapped_checkpoint(sft_checkpoint, tmp_path / "model", steps_key="reasoning")
    data = tmp_path / "test.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Start at {i}. Answer?", "target": i}) + "\n" for i in range(3)))
    r = run_cli("eval", "--model", model, "--data", data, "--out", tmp_path / "e")
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads((tmp_path / "e" / "results.json").read_text())["n"] == 3
    # one key of the mapping given, over the checkpoint's others: it was refused ("question_key and answer_key go
    # together"), the options validated before the checkpoint's settings were under them
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps({"prompt": f"Start at {i}. Answer?", "gold": i}) + "\n" for i in range(2)))
    r = run_cli("eval", "--model", model, "--data", other, "--set", "data.answer_key=gold", "--out", tmp_path / "f")
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads((tmp_path / "f" / "results.json").read_text())["n"] == 2
    r = run_cli("eval", "--model", model, "--data", other, "--set", "data.question_key=", "--out", tmp_path / "g")
    assert r.returncode == 2 and "question_key and answer_key go together" in r.stderr  # (still checked, merged)
    r = run_cli(
        "eval", "--model", tmp_path / "nowhere", "--data", other, "--set", "eval.top_p=2", "--out", tmp_path / "h"
    )
    assert r.returncode == 2 and "eval.top_p" in r.stderr  # (the other options: checked before the checkpoint is read)
    # task.* over the checkpoint's task, whose sizes are not the defaults': refused for the defaults' 19,000 problems
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "run_config.json").write_text(
        json.dumps({"task": {"n_steps": 3, "n_train": 3000, "n_valid": 500, "n_test": 500}})
    )
    r = run_cli("eval", "--model", fake, "--data", "builtin:test", "--set", "task.n_steps=2", "--out", tmp_path / "i")
    assert r.returncode == 2 and "holds no model checkpoint" in r.stderr, r.stderr  # (past the config)


def test_a_run_validates_and_tests_on_files_without_the_training_datas_steps_column(tmp_path, run_cli):
    """data.steps_key maps the training file's steps; the validation and test files need none (they are evaluated,
    not trained on), and were refused: 'missing field ... (data.steps_key) in every record'."""
    rows = [{"prompt": f"What is {i} plus 1?", "target": i + 1, "work": f"{i}+1={i + 1}"} for i in range(8)]
    train, held_out = tmp_path / "train.jsonl", tmp_path / "held_out.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in rows))
    held_out.write_text("".join(json.dumps({k: r[k] for k in ("prompt", "target")}) + "\n" for r in rows[:2]))
    over = {"data.train": train, "data.valid": held_out, "data.test": f"[{held_out}]", "sft.num_epochs": 1}
    over |= {"data.question_key": "prompt", "data.answer_key": "target", "data.steps_key": "work"}
    r = run_cli("sft", *tiny_args(**over), "--out", tmp_path / "sft")
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "sft" / "eval").is_dir()


def test_eval_takes_the_task_from_a_checkpoint_named_as_checkpoints_step_n(sft_checkpoint, tmp_path):
    """``checkpoints/step-3`` (written step-00000003) loaded, but eval took none of its run's settings: the default
    task's questions were graded, without a word."""
    from dgrpo.cli.evaluate import checkpoint_settings

    ckpt = tmp_path / "run" / "checkpoints" / "step-00000003"
    shutil.copytree(sft_checkpoint, ckpt / "model")
    (ckpt / "state.json").write_text("{}")
    short = checkpoint_settings(str(tmp_path / "run" / "checkpoints" / "step-3"))[0]
    assert short == checkpoint_settings(str(ckpt))[0] and short["task"]["n_steps"] == 4


def test_eval_reads_data_with_the_column_mapping_its_checkpoint_was_trained_with(tmp_path):
    from dgrpo.cli.evaluate import checkpoint_settings

    (tmp_path / "config.json").write_text("{}")  # (only its files are looked at)
    (tmp_path / "model.safetensors").write_bytes(b"")
    (tmp_path / "run_config.json").write_text(
        json.dumps({"task": {}, "data": {"question_key": "q", "answer_key": "sol", "steps_key": ""}, "eval": {}})
    )
    got = checkpoint_settings(str(tmp_path))[0]["data"]
    assert (got["question_key"], got["answer_key"], got["steps_key"]) == ("q", "sol", "")


@pytest.mark.slow
def test_hub_ids_load_from_the_cache_wherever_a_model_goes(sft_checkpoint, tmp_path):
    """A hub id (here served from a local Hugging Face cache, offline) works for --model, --init and
    model.name_or_path."""
    cache = tmp_path / "hub"
    snap = cache / "models--tiny-org--tiny-model" / "snapshots" / "0123456789abcdef"
    snap.parent.mkdir(parents=True)
    import shutil

    shutil.copytree(sft_checkpoint, snap)
    (cache / "models--tiny-org--tiny-model" / "refs").mkdir()
    (cache / "models--tiny-org--tiny-model" / "refs" / "main").write_text("0123456789abcdef")
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}

    def run(*args):
        return subprocess.run(
            [sys.executable, "-m", "dgrpo", *map(str, args)], capture_output=True, text=True, env=env, timeout=600
        )

    r = run("eval", "--model", "tiny-org/tiny-model", "--data", "builtin:test", "--limit", 8, "--out", tmp_path / "e")
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads((tmp_path / "e" / "results.json").read_text())["model"] == "tiny-org/tiny-model@0123456789abcdef"
    assert "task, data, dtype and scorer settings from the checkpoint's run_config.json" in r.stdout  # (hub too)
    assert "decoding (eval.*) from this command\n" in r.stdout  # (no run directory to point to)
    r = run("grpo", "--init", "tiny-org/tiny-model", *tiny_args(**{"grpo.steps": 1}), "--out", tmp_path / "g")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "tiny-org/tiny-model: hub commit 0123456789abcdef (--set model.revision=0123456789abcdef pins" in r.stdout
    r = run(
        "sft",
        *tiny_args(
            **{"model.name_or_path": "tiny-org/tiny-model", "sft.num_epochs": 1, "task.n_train": 64, "data.valid": "''"}
        ),
        "--out",
        tmp_path / "s",
    )
    assert r.returncode == 0, r.stderr[-2000:]


def test_grpo_validates_tests_and_saves_the_latent_count_it_trains_with_and_the_eval_options(
    sft_checkpoint, tmp_path, run_cli
):
    """grpo.n_latent = 3 over a T = 1 checkpoint: the test set and final/ use 3 (they used the checkpoint's 1), and
    the eval.* options apply to the test sets after training (eval.limit was ignored there)."""
    out = tmp_path / "run"
    over = {"grpo.steps": 1, "grpo.n_latent": 3, "eval.limit": 5, "grpo.eval_every": 0}
    r = run_cli("grpo", "--init", sft_checkpoint, *tiny_args(**over), "--out", out)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads((out / "final" / "latent_config.json").read_text())["n_latent"] == 3
    res = json.loads((out / "eval" / "builtin_test" / "results.json").read_text())
    assert (res["n_latent"], res["n"], res["limit"]) == (3, 5, 5) and res["model"] == str((out / "final").resolve())


def test_the_test_sets_are_also_run_for_best_when_it_is_not_the_final_model(
    sft_checkpoint, tmp_path, capsys, monkeypatch
):
    """The paper reports the best post-warmup validation checkpoint: grpo tests best/ too, into eval_best/ (it
    tested only the final model); nothing when best/ is the final step's."""
    from dgrpo.cli.train import evaluate_best
    from dgrpo.data import load_spec
    from dgrpo.training.distributed import Dist

    cfg = tiny_config(**{"eval.limit": 4})
    tests = {"builtin:test": load_spec("builtin:test", cfg.task)}
    shutil.copytree(sft_checkpoint, tmp_path / "best")
    evaluate_best(
        cfg.grpo.steps, cfg.grpo.steps, tests, cfg, tmp_path, Dist.single(), "cpu"
    )  # best/ is the final model
    assert not (tmp_path / "eval_best").exists()
    evaluate_best(1, cfg.grpo.steps, tests, cfg, tmp_path, Dist.single(), "cpu")
    res = json.loads((tmp_path / "eval_best" / "builtin_test" / "results.json").read_text())
    assert res["model"] == str((tmp_path / "best").resolve()) and res["n"] == 4
    said = capsys.readouterr().out.strip().splitlines()
    assert json.loads(said[-1])["checkpoint"] == "best"
    # (best/ of a 1.5B model loads for a while after final/'s results: a line says so, as the run's start does)
    assert f"dgrpo: loading {tmp_path / 'best'} (from {tmp_path / 'best'}) ..." in said
    # under torchrun only rank 0 has the summary: every rank goes by rank 0's best step (rank 1 returned, rank 0
    # waited for it in the evaluation's gather: a hang)
    import dgrpo.cli.train as train_cli

    tested: list[str] = []
    rank1 = Dist.single()
    rank1.all_gather_objects = lambda obj: [1, obj]
    monkeypatch.setattr(train_cli, "evaluate_test_sets", lambda *a, checkpoint="final": tested.append(checkpoint))
    evaluate_best(None, cfg.grpo.steps, tests, cfg, tmp_path, rank1, "cpu")
    assert tested == ["best"]


@pytest.mark.parametrize("env", ["", "sharded"], ids=["config", "env"])
def test_the_eval_line_printed_for_best_under_fsdp_runs(sft_checkpoint, tmp_path, capsys, run_cli, monkeypatch, env):
    """Under FSDP grpo prints the ``dgrpo eval`` line that tests best/; its ``--out`` was the run's own eval_best/,
    which ``dgrpo eval`` refuses (where the training run keeps its own files): the line failed as printed. It takes
    the run's config.json, whose ``fsdp`` (sharded; or from ``DGRPO_FSDP``, still set) dgrpo eval warned it does not
    apply: a warning the user had done nothing to cause."""
    import shlex
    import warnings

    from dgrpo.cli.train import evaluate_best
    from dgrpo.config import to_dict
    from dgrpo.training.distributed import Dist

    out = tmp_path / "run"
    cfg = tiny_config(**{"eval.limit": 4, "fsdp": "sharded"})
    shutil.copytree(sft_checkpoint, out / "best")
    (out / "config.json").write_text(json.dumps(to_dict(cfg)))
    (out / "metrics.jsonl").write_text("")
    tests = {"builtin:test": load_spec("builtin:test", cfg.task)}
    monkeypatch.setenv("DGRPO_FSDP", env)
    assert evaluate_best(1, cfg.grpo.steps, tests, cfg, out, replace(Dist.single(), fsdp=True), "cpu") == {}
    line = next(ln for ln in capsys.readouterr().out.splitlines() if " dgrpo eval " in ln)
    words = shlex.split(line)
    at = words.index("dgrpo")
    for name, value in (w.split("=", 1) for w in words[:at]):  # (the variables the line sets)
        monkeypatch.setenv(name, value)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = run_cli(*words[at + 1 :])
    assert r.returncode == 0, r.stderr[-2000:]
    assert not [w for w in caught if "not applied by dgrpo eval" in str(w.message)]
    res = json.loads((out / "best_tests" / "builtin_test" / "results.json").read_text())
    assert res["model"] == str((out / "best").resolve()) and res["n"] == 4


# ----------------------------------------------------------------------------------- resume and config changes
@pytest.mark.slow
def test_resume_refuses_a_changed_config_unless_allowed(sft_checkpoint, tmp_path, run_cli):
    out = tmp_path / "run"
    args = ["grpo", "--init", sft_checkpoint, *tiny_args(**{"grpo.steps": 2, "grpo.save_every": 1}), "--out", out]
    assert run_cli(*args).returncode == 0
    assert json.loads((out / "config.json").read_text())["model"]["name_or_path"] == str(Path(sft_checkpoint).resolve())
    shutil.copytree(sft_checkpoint, tmp_path / "other")  # other weights: the run started from --init, not these
    r = run_cli(*[tmp_path / "other" if a == sft_checkpoint else a for a in args])
    assert r.returncode == 2 and "model.name_or_path" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = run_cli(*args, "--set", "grpo.lr=5e-2", "--set", "grpo.steps=3")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "grpo.lr" in r.stderr and "grpo.steps" in r.stderr and "--allow-config-change" in r.stderr
    assert json.loads((out / "config.json").read_text())["grpo"]["lr"] == 1e-4  # untouched
    r = run_cli(*args, "--set", "grpo.lr=5e-2", "--set", "grpo.steps=3", "--allow-config-change")
    assert r.returncode == 0, r.stderr[-2000:]
    first, second = (json.loads((out / f"config.{i}.json").read_text()) for i in (0, 1))
    assert first["started_at_step"] == 0 and first["config"]["grpo"]["lr"] == 1e-4
    assert second["started_at_step"] == 2 and second["config"]["grpo"]["lr"] == 5e-2
    assert json.loads((out / "config.json").read_text())["grpo"]["lr"] == 5e-2
    assert [e["started_at_step"] for e in json.loads((out / "applied.json").read_text())] == [0, 2]  # (one a start)
    steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines() if '"reward_mean"' in x]
    assert steps == [0, 1, 2]
    r = run_cli(*args, "--set", "threads=1")  # options that cannot change results are not a change
    assert r.returncode == 2 and "threads" not in r.stderr  # (the steps still differ: 2 vs 3)
    earlier = ("best", "final", "eval", "summary.json", "config.0.json", "config.1.json")
    assert all((out / name).exists() for name in earlier)
    (out / "wandb" / "offline-run-20260101_000000-abc").mkdir(parents=True)  # what W&B wrote of the earlier run
    (out / "wandb_run_id").write_text("abc")
    r = run_cli(*args, "--resume", "never", "--set", "grpo.save_best=false", "data.test=[]")
    assert r.returncode == 0 and "removed the earlier run's checkpoints, best, final, eval" in r.stdout
    # nothing of the earlier run is left to read as this one's (its best/ and test results stayed before)
    assert not any((out / name).exists() for name in ("best", "eval", "config.0.json", "config.1.json", "wandb"))
    assert json.loads((out / "summary.json").read_text())["best_step"] is None
    assert [e["started_at_step"] for e in json.loads((out / "applied.json").read_text())] == [0]  # (this run's)
    steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines() if '"reward_mean"' in x]
    assert steps == [0, 1]


@pytest.mark.slow
def test_resume_from_an_explicit_checkpoint_path(sft_checkpoint, tmp_path, run_cli):
    args = ["grpo", "--init", sft_checkpoint, *tiny_args(**{"grpo.steps": 2, "grpo.save_every": 1})]
    assert run_cli(*args, "--out", tmp_path / "a").returncode == 0
    ckpt = tmp_path / "a" / "checkpoints" / "step-00000001"
    r = run_cli(*args, "--out", tmp_path / "b", "--resume", ckpt)
    assert r.returncode == 0 and f"resumed from {ckpt}" in r.stdout
    wa = (tmp_path / "a" / "final" / "model.safetensors").read_bytes()
    wb = (tmp_path / "b" / "final" / "model.safetensors").read_bytes()
    assert wa == wb  # step 1 from a's checkpoint, then step 2: the same run


@pytest.mark.slow
def test_a_forked_checkpoint_is_held_to_its_own_config_and_a_damaged_one_is_not_skipped(
    sft_checkpoint, tmp_path, run_cli
):
    """``--resume PATH`` into a new directory: the config is compared with the one that checkpoint was trained
    with (a change needs --allow-config-change, and config.0.json is then that checkpoint's); a named checkpoint
    that does not load is an error naming it, with no fallback to another."""
    args = ["grpo", "--init", sft_checkpoint, *tiny_args(**{"grpo.steps": 4, "grpo.save_every": 1})]
    assert run_cli(*args, "--out", tmp_path / "a").returncode == 0
    ckpt = tmp_path / "a" / "checkpoints" / "step-00000003"  # after the evaluation at step 2 (its best)
    r = run_cli(*args, "--set", "grpo.lr=5e-2", "--out", tmp_path / "b", "--resume", ckpt)
    assert r.returncode == 2 and f"--resume {ckpt} is from a run started with a different config (grpo.lr)" in r.stderr
    r = run_cli(*args, "--set", "grpo.lr=5e-2", "--out", tmp_path / "b", "--resume", ckpt, "--allow-config-change")
    assert r.returncode == 0, r.stderr[-2000:]
    first = json.loads((tmp_path / "b" / "config.0.json").read_text())
    assert first["started_at_step"] == 0 and first["config"]["grpo"]["lr"] == 1e-4
    assert json.loads((tmp_path / "a" / "summary.json").read_text())["best_step"] is not None
    best = json.loads((tmp_path / "b" / "summary.json").read_text())["best_step"]  # (its own, or none)
    assert "checkpoint's best (step 2) is not in" in r.stdout and (best is None or (tmp_path / "b" / "best").is_dir())
    from dgrpo.model.latent_lm import resolve_checkpoint

    assert resolve_checkpoint(tmp_path / "a" / "checkpoints" / "step-3") == ckpt / "model"  # as the README writes it
    r = run_cli(*args, "--out", tmp_path / "c", "--resume", tmp_path / "a")
    assert (
        r.returncode == 2 and f"--resume {tmp_path / 'a'} is a run directory: name one of its checkpoints" in r.stderr
    )
    r = run_cli(*args, "--out", tmp_path / "c", "--resume", tmp_path / "a" / "final")  # (said: no manifest entry)
    assert r.returncode == 2 and "final is a model (weights without the optimizer and data state): --init" in r.stderr
    (ckpt / "rng.pt").write_bytes(b"damaged")
    r = run_cli(*args, "--out", tmp_path / "c", "--resume", ckpt)
    assert r.returncode == 2 and r.stderr.startswith(f"dgrpo: error: --resume {ckpt}: ")
    assert "falling back" not in r.stdout + r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "c").exists()  # each refusal above left an empty c/ holding a lock file


@pytest.mark.slow
def test_another_commands_run_directory_is_refused_and_left_as_it_was(sft_checkpoint, tmp_path, run_cli):
    """An SFT run's directory given to ``dgrpo grpo`` (or a GRPO run's to ``dgrpo sft``) is a wrong --out, not a
    damaged checkpoint: one line saying whose run it is, and its files untouched (no advice to start over there)."""
    sft_run = tmp_path / "sft"
    shutil.copytree(Path(sft_checkpoint).parent, sft_run)
    assert any((sft_run / "checkpoints").iterdir())
    before = sorted(str(p.relative_to(sft_run)) for p in sft_run.rglob("*"))
    r = run_cli("grpo", "--init", sft_checkpoint, *tiny_args(), "--out", sft_run)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr[-2000:]
    assert "holds a `dgrpo sft` run's checkpoint" in r.stderr and f"--init {sft_run}" in r.stderr
    assert "--resume never" not in r.stderr
    r = run_cli("grpo", "--init", sft_run, *tiny_args(), "--out", sft_run, "--resume", "never")  # (it deleted it all)
    assert r.returncode == 2 and "holds a `dgrpo sft` run's checkpoint" in r.stderr, r.stderr[-2000:]
    assert sorted(str(p.relative_to(sft_run)) for p in sft_run.rglob("*")) == before
    grpo_run = tmp_path / "grpo"
    args = ["grpo", "--init", sft_checkpoint, *tiny_args(**{"grpo.steps": 1, "grpo.save_every": 1})]
    assert run_cli(*args, "--out", grpo_run).returncode == 0
    r = run_cli("sft", *tiny_args(), "--out", grpo_run)
    assert r.returncode == 2 and "holds a `dgrpo grpo` run's checkpoint" in r.stderr, r.stderr[-2000:]
    r = run_cli("grpo", "--init", grpo_run, *tiny_args(), "--out", grpo_run, "--resume", "never")
    assert r.returncode == 2 and "the model this run starts from (--init)" in r.stderr, r.stderr[-2000:]
    assert (grpo_run / "final" / "model.safetensors").is_file()


def test_reward_values_may_be_numpy_torch_or_bool_but_not_anything():
    """As TRL takes them: a list of floats, ints or bools (0 / 1), a 1-d NumPy array or tensor; a string, a nested
    list, a 2-d tensor's rows or a non-finite value is one line naming the function and the row."""
    import numpy as np
    import torch

    from dgrpo.data.records import Record
    from dgrpo.eval.scoring import call_checked

    recs = [Record("q", [], "1")] * 3
    for values in ([1, 0.5, True], np.array([1.0, 0.5, 1.0]), torch.tensor([1.0, 0.5, 1.0]), [np.bool_(True)] * 3):
        got = call_checked(lambda c, r, v=values: v, "mine", ["a", "b", "c"], recs)
        assert got[0] == 1.0 and all(type(x) is float for x in got)
    for bad, shown in (["1", 0, 0], "'1'"), ([[1.0]] * 3, "[1.0]"), (torch.zeros(3, 1), "tensor([0.])"):
        with pytest.raises(RewardError, match=rf"reward mine returned {re.escape(shown)} for row 0"):
            call_checked(lambda c, r, v=bad: v, "mine", ["a", "b", "c"], recs)
    nan = call_checked(lambda c, r: np.array([0.0, np.nan, 1.0]), "mine", ["a", "b", "c"], recs)  # (TRL's None)
    assert nan[::2] == [0.0, 1.0] and math.isnan(nan[1])
    with pytest.raises(RewardError, match=r"returned (np\.float64\(nan\)|nan) for row 1"):  # (a scorer's is refused)
        call_checked(lambda c, r: np.array([0.0, np.nan, 1.0]), "mine", ["a", "b", "c"], recs, "scorer")
    with pytest.raises(RewardError, match=r"returned 1000000000.* for row 2"):  # (was a bare OverflowError)
        call_checked(lambda c, r: [0, 1, 10**400], "mine", ["a", "b", "c"], recs)
    for bad, shown in ((None, "None"), (1.0, "1.0"), ({"a": 1, "b": 1, "c": 1}, "{'a': 1")):  # (a dict: its keys)
        with pytest.raises(RewardError, match=rf"reward mine returned {re.escape(shown)}.*, not one value per"):
            call_checked(lambda c, r, v=bad: v, "mine", ["a", "b", "c"], recs)


def test_reward_values_may_be_fractions_or_decimals_but_not_a_set():
    """A Decimal (exact arithmetic, a number) was refused as 'returned Decimal('0.5') for row 0'; a set (no order,
    duplicates merged) was taken as the rows' values in whatever order it iterates."""
    from decimal import Decimal
    from fractions import Fraction

    from dgrpo.data.records import Record
    from dgrpo.eval.scoring import call_checked

    recs = [Record("q", [], "1")] * 2
    for values in ([Fraction(1, 2), Fraction(1)], [Decimal("0.5"), Decimal(1)]):
        assert call_checked(lambda c, r, v=values: v, "mine", ["a", "b"], recs) == [0.5, 1.0]
    nan = call_checked(lambda c, r: [Decimal(1), Decimal("NaN")], "mine", ["a", "b"], recs)  # (TRL's None, as NaN)
    assert nan[0] == 1.0 and math.isnan(nan[1])
    with pytest.raises(RewardError, match=r"reward mine returned Decimal\('sNaN'\) for row 0"):  # (a ValueError)
        call_checked(lambda c, r: [Decimal("sNaN"), Decimal(1)], "mine", ["a", "b"], recs)
    with pytest.raises(RewardError, match=r"reward mine returned \{.*\}, not one value per completion"):
        call_checked(lambda c, r: {0.5, 1.0}, "mine", ["a", "b"], recs)


def test_the_filter_reward_must_name_a_reward_and_a_python_reward_fn_replaces_the_configs(recwarn):
    """Rewards(parts, filter_on) with an unknown name is one line (was a bare KeyError at the first step); a reward
    passed to the trainer in Python replaces the config's rewards, so a grpo.filter_reward naming one of those is
    warned about and the filter applies to the Python reward's values."""
    from dgrpo.eval.scoring import RewardPart, Rewards, numeric
    from dgrpo.training.grpo import _rewards

    with pytest.raises(RewardError, match=r"grpo.filter_reward 'corect' is not one of the rewards \(correct\)"):
        Rewards([RewardPart("correct", numeric)], "corect")
    with pytest.raises(RewardError, match="no reward parts"):
        Rewards([])
    with pytest.raises(RewardError, match="reward part name\\(s\\) r given twice"):  # (its values replaced the first's)
        Rewards([RewardPart("r", numeric), RewardPart("r", exact, 0.5)])

    def mine(completions, records):
        return [1.0] * len(completions)

    cfg = load_config(Config, None, ["grpo.rewards=[{fn: numeric, name: correct}]", "grpo.filter_reward=correct"])
    with pytest.warns(UserWarning, match=r"grpo.filter_reward 'correct' is not used: reward_fn \(mine\) replaces"):
        rewards = _rewards(mine, cfg)
    assert rewards.filter_on == "" and rewards(["#### 1"], [Record("q", [], "1")]) == [1.0]
    assert _rewards(mine, load_config(Config, None, ["grpo.filter_reward=mine"])).filter_on == "mine"
    # a name is the config's (it failed at the smoke test: 'str' object is not callable, named as 'reward_fn')
    with pytest.raises(TypeError, match=r"reward_fn must be a function .* got str 'numeric': a reward by name goes in"):
        _rewards("numeric", cfg)
    # a part named as a rollouts.jsonl field replaced that field in every logged row (a probe's name: step); one
    # part is logged as the total alone, so a reward_fn named reward is fine (review: it was refused)
    with pytest.raises(RewardError, match=r"reward part name\(s\) step are fields of rollouts.jsonl's rows"):
        Rewards([RewardPart("correct", numeric), RewardPart("step", mine, 0.1)])

    def reward(completions, records):
        return [1.0] * len(completions)

    assert [p.name for p in _rewards(reward, load_config(Config, None, [])).parts] == ["reward"]


def test_a_list_of_reward_functions_is_summed_with_each_logged_by_name():
    """As TRL's reward_funcs: reward_fn=[f, g] was a TypeError (only a Rewards, undocumented, took several)."""
    from dgrpo.training.grpo import _rewards

    def correct(completions, answer, **kwargs):  # (TRL's form beside dgrpo's)
        return [float(a in c) for c, a in zip(completions, answer)]

    def short(completions, records):
        return [-0.01 * len(c) for c in completions]

    rewards = _rewards([correct, short], load_config(Config, None, ["grpo.filter_reward=correct"]))
    assert [p.name for p in rewards.parts] == ["correct", "short"] and rewards.filter_on == "correct"
    # as one function: the config's rewards replaced (warned), a filter_reward naming none of them dropped (warned);
    # two functions of one name numbered (review: a list differed on each)
    cfg = load_config(Config, None, ["grpo.rewards=[{fn: numeric, name: num}]", "grpo.filter_reward=num"])
    with pytest.warns(UserWarning) as caught:
        pair = _rewards([lambda c, r: [0.0] * len(c), lambda c, r: [1.0] * len(c)], cfg)
    assert [p.name for p in pair.parts] == ["<lambda>", "<lambda>_2"] and pair.filter_on == ""
    said = " ".join(str(w.message) for w in caught)
    assert "reward_fn replaces the config's grpo.reward" in said and "grpo.filter_reward 'num' is not used" in said
    recs = [Record("q", [], "1"), Record("q", [], "2")]
    assert rewards(["#### 1", "#### 12345"], recs) == pytest.approx([1 - 0.06, 1 - 0.1])
    assert rewards.last == {"correct": [1.0, 1.0], "short": pytest.approx([-0.06, -0.1])}


def test_evaluate_refuses_counts_that_would_drop_records_and_takes_a_scorer_by_name(sft_checkpoint):
    """limit=-1 evaluated records[:-1] (one record silently dropped); batch_size 0 was a range() error; a scorer
    may be named as eval.scorer names it."""
    from dgrpo.eval.evaluate import evaluate, generate_answers
    from dgrpo.model.latent_lm import LatentLM

    lm = LatentLM.from_pretrained(sft_checkpoint)
    recs = load_spec("builtin:test?n_test=4")
    for kw, msg in (
        ({"limit": -1}, "limit must be an int >= 0"),
        ({"batch_size": 0}, "batch_size must be an int >= 1"),
        ({"shots": -2, "plain": True}, "shots must be an int >= 0"),
    ):
        with pytest.raises(ValueError, match=f"evaluate: {msg}"):
            evaluate(lm, recs, progress=False, **kw)
    with pytest.raises(ValueError, match="generate_answers: batch_size"):
        generate_answers(lm, ["q"], n_latent=1, batch_size=0, progress=False)
    by_name = evaluate(lm, recs, scorer="exact", max_new_tokens=4, progress=False)
    assert by_name.scorer == "exact" and by_name.n == 4


def test_a_questions_perturbed_answers_do_not_depend_on_the_others_in_the_list(sft_checkpoint):
    """MC-vote and perturbed evaluation draw a question's masks from its text (they were drawn by its position:
    reversing the list changed the votes of 32 of 32 questions in a probe): the same predictions for the list, its
    reverse and a subset."""
    from dgrpo.eval.evaluate import evaluate, evaluate_mc_vote
    from dgrpo.model.latent_lm import LatentLM
    from dgrpo.perturbation import LockedDropout

    lm = LatentLM.from_pretrained(sft_checkpoint)
    recs, drop = load_spec("builtin:test?n_test=12"), LockedDropout(p=0.3)
    kw = dict(max_new_tokens=12, progress=False)
    votes = lambda rs: [p["votes"] for p in evaluate_mc_vote(lm, rs, drop, n_masks=3, **kw).predictions]  # noqa: E731
    every = votes(recs)
    assert votes(recs[::-1]) == every[::-1] and votes(recs[5:9]) == every[5:9]
    assert len({tuple(v) for v in every}) > 1 or any(len(set(v)) > 1 for v in every)  # masks differ
    preds = lambda rs: [p["completion"] for p in evaluate(lm, rs, perturbation=drop, **kw).predictions]  # noqa: E731
    assert preds(recs[::-1]) == preds(recs)[::-1]


def test_a_reward_file_that_is_not_python_is_one_line(tmp_path):
    (tmp_path / "a.yaml").write_text("x: 1\n")
    with pytest.raises(RewardError, match=r"a.yaml is not a Python file \(path/to/file.py:function\)"):
        load_function(f"{tmp_path / 'a.yaml'}:fn")  # (was 'cannot import ... (AssertionError: )')


def test_a_reward_file_imports_the_modules_beside_it_from_any_working_directory(tmp_path, monkeypatch):
    """``from helpers import parse`` in a reward file worked under ``python -m dgrpo`` run from its folder (the working
    directory is on sys.path) and was 'cannot import ... No module named' under the ``dgrpo`` command; a relative
    path that names no file did not say where it was looked for."""
    folder = tmp_path / "rewards"
    folder.mkdir()
    helper = f"helpers_{tmp_path.name.replace('-', '_')}"  # (a name of this test's own: sys.modules keeps modules)
    (folder / f"{helper}.py").write_text("def parse(c):\n    return c.split('#')[-1].strip()\n")
    (folder / "mine.py").write_text(
        f"from {helper} import parse\n\n\ndef reward(completions, records):\n"
        "    return [float(parse(c) == r.answer) for c, r in zip(completions, records)]\n"
    )
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", os.getcwd())])  # (as the dgrpo command)
    monkeypatch.chdir(tmp_path)
    fn = load_function("rewards/mine.py:reward")
    assert fn(["#### 4", "#### 5"], [Record("q", [], "4"), Record("q", [], "4")]) == [1.0, 0.0]
    assert sys.path[-1] == str(folder)  # (last: a file there named as an installed package does not replace it)
    where = f"mine.py not found (a relative path is read from the working directory, {tmp_path})"
    with pytest.raises(RewardError, match=re.escape(where)):
        load_function("mine.py:reward")


def test_a_partial_credit_scorers_values_are_in_the_predictions(tokenizer):
    """A scorer's partial credit (0.5: the right value, unreduced) counts as not correct, and was written nowhere:
    predictions.jsonl held only ``correct`` and results.json only accuracy, so a run scored by it read 0% with no
    trace of its 0.5s."""
    from dgrpo.eval.evaluate import evaluate, evaluate_mc_vote
    from dgrpo.perturbation import LockedDropout

    from conftest import make_lm

    lm, recs = make_lm(tokenizer), load_spec("builtin:test?n_test=4")

    def halves(completions, records):
        return [1.0, 0.5, 0.0, 0.25][: len(completions)]

    result = evaluate(lm, recs, scorer=halves, max_new_tokens=2, progress=False)
    assert [p["score"] for p in result.predictions] == [1.0, 0.5, 0.0, 0.25] and result.correct == 1
    assert result.summary()["mean_score"] == 0.4375 and result.accuracy == 0.25  # (results.json: mean_score)

    def halves_per_mask(completions, records):  # (a vote scores every mask's completion: 2 per record)
        return [v for v in [1.0, 0.5, 0.0, 0.25] for _ in range(2)][: len(completions)]

    voted = evaluate_mc_vote(
        lm, recs, LockedDropout(p=0.1), n_masks=2, scorer=halves_per_mask, max_new_tokens=2, progress=False
    )
    assert [p["score"] for p in voted.predictions] == [1.0, 0.5, 0.0, 0.25] and voted.mean_score == 0.4375
    from dgrpo.eval.results import merge_results

    halves_of = [evaluate(lm, recs[i : i + 2], scorer=halves, max_new_tokens=2, progress=False) for i in (0, 2)]
    assert merge_results(halves_of).mean_score == (1.0 + 0.5 + 1.0 + 0.5) / 4  # (each shard's rows start at 1.0)


def test_a_reward_module_in_the_working_directory_imports_under_the_dgrpo_command(tmp_path, monkeypatch):
    """``grpo.reward=mypkg.rewards:fn`` ran under ``python -m dgrpo`` (the working directory on sys.path) and was
    'No module named mypkg' under the ``dgrpo`` command, from the same folder."""
    package = f"mypkg_{tmp_path.name.replace('-', '_')}"  # (a name of this test's own: sys.modules keeps modules)
    (tmp_path / package).mkdir()
    (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / package / "rewards.py").write_text(
        "def fn(completions, records):\n    return [1.0] * len(completions)\n"
    )
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", os.getcwd(), str(tmp_path))])
    monkeypatch.chdir(tmp_path)
    try:
        assert load_function(f"{package}.rewards:fn")(["a"], [Record("q", [], "1")]) == [1.0]
        with pytest.raises(RewardError, match="cannot import nopkg_here.rewards \\(ModuleNotFoundError: No module"):
            load_function("nopkg_here.rewards:fn")
    finally:
        for name in (package, f"{package}.rewards"):
            sys.modules.pop(name, None)


def test_a_reward_file_that_runs_argparse_at_its_top_level_is_one_line(tmp_path):
    """A TRL script's top-level argparse read dgrpo's command line: 'usage: dgrpo [-h] [--model MODEL]', 'dgrpo: error:
    unrecognized arguments: grpo --config ...', exit code 2, as if dgrpo refused its own arguments; sys.exit() in
    one ended the run with no word of the reward."""
    (tmp_path / "script.py").write_text(
        "import argparse\nparser = argparse.ArgumentParser()\nparser.add_argument('--model')\n"
        "args = parser.parse_args(['--nope'])\n\n\ndef reward(completions, records):\n    return [0.0]\n"
    )
    says = "importing .*script.py exited \\(SystemExit: 2\\): its top level runs as a script \\(an argparse there"
    with pytest.raises(RewardError, match=says):
        load_function(f"{tmp_path / 'script.py'}:reward")


def test_a_reward_named_as_a_class_says_to_name_an_instance(tmp_path):
    """A class-based reward named by its class was called with the completions as its constructor's arguments:
    'raised TypeError: Judge.__init__() takes 2 positional arguments but 3 were given on row 0'."""
    (tmp_path / "judges.py").write_text(
        "class Judge:\n    def __init__(self, weight):\n        self.weight = weight\n\n"
        "    def __call__(self, completions, records):\n        return [self.weight] * len(completions)\n\n\n"
        "judge = Judge(1.0)\n"
    )
    with pytest.raises(RewardError, match=r"'Judge' in .*judges.py is a class; name a function, or an instance of it"):
        load_function(f"{tmp_path / 'judges.py'}:Judge")
    assert load_function(f"{tmp_path / 'judges.py'}:judge")(["a", "b"], []) == [1.0, 1.0]


def test_a_call_its_signature_refuses_names_no_row():
    """A reward whose signature does not take the call (``fn(completions)``, a TRL function missing a column) fails on
    every row: the line names none (it named row 0's completion, as if that row were the cause); a TypeError raised
    by a row's value still names its row."""
    from dgrpo.eval.scoring import call_checked

    records = [Record(f"q{i}", [], str(i)) for i in range(4)]
    completions = ["#### 0", "#### 1", "two", "#### 3"]

    def one_argument(completions):
        return [0.0] * len(completions)

    def trl_with_a_missing_column(prompts, completions, solution, **kwargs):
        return [0.0] * len(completions)

    def fails_on_text(completions, records):
        return [float(c.split()[1]) if c.startswith("#") else c.upper(1) for c in completions]

    for fn, says in (
        (one_argument, "one_argument() takes 1 positional argument but 2 were given"),
        (trl_with_a_missing_column, "missing 1 required positional argument: 'solution' (called as TRL's"),
    ):
        with pytest.raises(RewardError) as raised:
            call_checked(fn, fn.__name__, completions, records)
        assert says in str(raised.value) and " on row" not in str(raised.value)
    with pytest.raises(
        RewardError, match=r"takes no arguments \(1 given\) on row 2 \(completion 'two', question 'q2'\)$"
    ):
        call_checked(fails_on_text, "fails_on_text", completions, records)


def test_evaluate_checks_a_scorer_as_training_checks_a_reward(sft_checkpoint):
    """A scorer returning too few values or a NaN is one line naming it (evaluate counted the rest silently); the
    MC-vote evaluation gives the model back in the mode it had."""
    from dgrpo.eval.evaluate import evaluate, evaluate_mc_vote
    from dgrpo.eval.scoring import check_scorer
    from dgrpo.model.latent_lm import LatentLM
    from dgrpo.perturbation import LockedDropout

    lm = LatentLM.from_pretrained(sft_checkpoint)
    recs = load_spec("builtin:test?n_test=4")

    def short(completions, records):
        return [1.0] * (len(completions) - 2)

    with pytest.raises(RewardError, match="scorer short returned 2 values for 4 completions"):  # (was "reward")
        evaluate(lm, recs, scorer=short, max_new_tokens=4, progress=False)
    with pytest.raises(RewardError, match="returned nan for row 0"):
        evaluate(lm, recs, scorer=lambda c, r: [float("nan")] * len(c), max_new_tokens=4, progress=False)

    def closeness(completions, records):  # (partial credit was counted as correct above 0.5: 92.5% for a 5% model)
        return [1.0, True, 0, 0.925][: len(completions)]

    assert evaluate(lm, recs, scorer=closeness, max_new_tokens=4, progress=False).correct == 2

    def summed(completions, records):  # (1 as a float sum rounds it: 0.9999999999999999, float32 1.0000001)
        import torch

        return [0.7 + 0.2 + 0.1, torch.full((10,), 0.1).sum(), 1e-7, 0.0][: len(completions)]

    assert evaluate(lm, recs, scorer=summed, max_new_tokens=4, progress=False).correct == 2
    with pytest.raises(
        RewardError, match=r"scorer <lambda> returned 2.0 for row 0 .*: a scorer's value is in \[0, 1\]"
    ):
        evaluate(lm, recs, scorer=lambda c, r: [2.0] * len(c), max_new_tokens=4, progress=False)
    # a scorer on another scale is refused before a run trains, on the gold answers and on each other's
    check_scorer(closeness, recs)
    with pytest.raises(RewardError, match=r"returned -1.0 for row 0 .*: a scorer's value is in \[0, 1\]"):
        check_scorer(lambda c, r: [1 if "#### " + x.answer in t else -1 for t, x in zip(c, r)], recs)
    lm.train()
    evaluate_mc_vote(lm, recs, LockedDropout(p=0.1), n_masks=2, max_new_tokens=4, progress=False)
    assert lm.training


def test_python_api_inputs_that_were_silently_misread(sft_checkpoint, tmp_path):
    """An answer_key without its question_key was ignored (the golds came from the default 'answer' column); a
    negative max_tokens cut the question's first tokens; a question that is not text reached SFT; saving into
    checkpoints/step-N made a directory that read as a checkpoint and broke its run's pruning."""
    from dgrpo import load_dataset
    from dgrpo.config import ConfigError, DataConfig
    from dgrpo.data.records import DataError
    from dgrpo.model.latent_lm import LatentLM
    from dgrpo.model.verified import CheckpointError

    path = tmp_path / "mine.jsonl"
    path.write_text('{"question": "1+1?", "answer": "0", "final": "2"}\n')
    with pytest.raises(ConfigError, match="data.question_key: question_key and answer_key go together"):
        load_dataset(str(path), data=DataConfig(answer_key="final"))
    with pytest.raises(ConfigError, match="data.steps_key: maps a column with question_key and answer_key"):
        load_dataset(str(path), data=DataConfig(steps_key="final"))
    with pytest.raises(DataError, match="question must be text, got NoneType"):
        Record(None, [], "1")
    lm = LatentLM.from_pretrained(sft_checkpoint)
    with pytest.raises(ValueError, match="max_tokens must be >= 0"):
        lm.encode_questions(["1+1?"], max_tokens=-1)
    with pytest.raises(CheckpointError, match="would read as\\) a resumable training checkpoint"):
        lm.save_pretrained(tmp_path / "run" / "checkpoints" / "step-3")
    lm.save_pretrained(tmp_path / "checkpoints" / "my-model")  # a folder of the user's named so: fine


def unregistered_after(monkeypatch, kind: str) -> None:
    """The registry of perturbation kinds as it was once the test ends: a kind left registered was listed in every
    later config error of this process ('expected locked, native, gaussian, none, test_half_locked or ...'), and
    tests/test_config.py's check of that message failed after this file."""
    from dgrpo.config import REGISTERED_CHOICES
    from dgrpo.perturbation import PERTURBATIONS

    monkeypatch.setitem(PERTURBATIONS, kind, PERTURBATIONS["locked"])
    monkeypatch.setitem(REGISTERED_CHOICES, "perturbation.kind", list(REGISTERED_CHOICES["perturbation.kind"]))


def test_a_registered_perturbation_kind_is_a_config_value_and_the_trainer_steps_are_bounded(
    sft_checkpoint, monkeypatch
):
    """@register("name") made a kind the config refused ('expected locked, native, gaussian or none'); a trainer
    driven by hand ran steps past grpo.steps at lr 0, doing nothing."""
    from dgrpo.config import ConfigError
    from dgrpo.model.latent_lm import LatentLM
    from dgrpo.perturbation import LockedDropout, make_perturbation, register
    from dgrpo.training.grpo import GRPOTrainer

    unregistered_after(monkeypatch, "test_half_locked")

    @register("test_half_locked")
    class HalfLocked(LockedDropout):
        pass

    cfg = load_config(Config, None, ["perturbation.kind=test_half_locked", "grpo.steps=1"])
    assert isinstance(make_perturbation(cfg.perturbation), HalfLocked)
    with pytest.raises(ConfigError, match=r"perturbation.kind: expected locked, .*got 'lockd'"):
        load_config(Config, None, ["perturbation.kind=lockd"])
    lm = LatentLM.from_pretrained(sft_checkpoint)
    trainer = GRPOTrainer(lm, cfg, load_spec("builtin:train?n_train=8"))
    with pytest.raises(ValueError, match="prompts is empty"):
        trainer.step(prompts=[])
    trainer.step_idx = 1
    with pytest.raises(ValueError, match=r"step 1 is past grpo.steps = 1 \(its learning rate is 0 there\)"):
        trainer.step()


def test_a_perturbation_that_cannot_be_replayed_is_warned_about(sft_checkpoint, monkeypatch):
    """A kind whose noise is not a function of its seeds (here: fresh seeds at every bind) gave ratios of noise
    without a word (logp_replay_maxdiff 0.26 in a probe, ~1e-6 expected in fp32)."""
    import torch

    from dgrpo.model.latent_lm import LatentLM
    from dgrpo.perturbation import LockedDropout, register
    from dgrpo.training.grpo import GRPOTrainer

    unregistered_after(monkeypatch, "test_unseeded")

    @register("test_unseeded")
    class Unseeded(LockedDropout):
        def bind(self, lm, seeds):
            return super().bind(lm, torch.randint(0, 2**62, (len(seeds),)))

    sets = ["perturbation.kind=test_unseeded", "perturbation.p=0.3", "grpo.filter=false", "grpo.prompts_per_step=2"]
    cfg = load_config(Config, None, [*sets, "grpo.group_size=4", "grpo.max_new_tokens=8", "grpo.steps=2"])
    trainer = GRPOTrainer(LatentLM.from_pretrained(sft_checkpoint), cfg, load_spec("builtin:train?n_train=8"))
    with pytest.warns(UserWarning, match=r"is the perturbation \(test_unseeded\) a function of its seeds alone"):
        m = trainer.step()
    assert m["logp_replay_maxdiff"] > 1e-3


def test_shared_questions_count_spacing_blind_and_by_answer() -> None:
    from dgrpo.data import Record, shared_questions

    train = [Record("What is 2 + 3?", [], "5"), Record("What is 4 + 4?", [], "8")]
    held_out = [Record("What  is 2 + 3? ", [], "5"), Record("What is 4 + 4?", [], "9"), Record("New?", [], "1")]
    assert shared_questions(train, held_out) == (2, 1)
    assert shared_questions(train, []) == (0, 0)


def test_a_run_directory_and_its_final_checkpoint_are_one_init(sft_checkpoint, tmp_path):
    """--init runs/sft and --init runs/sft/final name one model (a resume naming the other was refused as other
    weights); a checkpoints/step-N names the model it holds."""
    from dgrpo.training.model_record import init_name

    run = tmp_path / "runs" / "sft"
    shutil.copytree(sft_checkpoint, run / "final")
    (run / "metrics.jsonl").write_text("")
    assert init_name(str(run)) == init_name(str(run / "final")) == str((run / "final").resolve())
    assert init_name("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"  # a hub id, as given


def test_a_local_model_name_or_path_is_recorded_as_init_is(sft_checkpoint, tmp_path, monkeypatch):
    """model.name_or_path=runs/sft was recorded as given: a resume naming runs/sft/final or its absolute path was
    refused as another model (as --init's spellings were), and a relative path named another folder from another
    directory. A run that recorded another spelling of the same model keeps it; a hub id is kept as given."""
    from dgrpo.cli.train import record_init
    from dgrpo.config import Config, load_config

    monkeypatch.chdir(tmp_path)
    shutil.copytree(sft_checkpoint, tmp_path / "runs" / "sft" / "final")
    final = str((tmp_path / "runs" / "sft" / "final").resolve())

    def recorded(name, out=tmp_path / "new"):
        return record_init(load_config(Config, None, [f"model.name_or_path={name}"]), None, out).model.name_or_path

    assert recorded("runs/sft") == recorded("runs/sft/final") == recorded(str(tmp_path / "runs" / "sft")) == final
    assert recorded("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B" and recorded("builtin-tiny") == "builtin-tiny"
    (tmp_path / "old").mkdir()  # a run begun when the name was recorded as given: resumed as it recorded it
    (tmp_path / "old" / "config.json").write_text(json.dumps({"model": {"name_or_path": "runs/sft"}}))
    assert recorded("runs/sft/final", tmp_path / "old") == "runs/sft"
    assert recorded("Qwen/Qwen2.5-0.5B", tmp_path / "old") == "Qwen/Qwen2.5-0.5B"  # (another model: as given)


def test_sft_on_records_without_steps_or_with_a_warmup_past_its_schedule_is_warned_about(tmp_path):
    """Coconut SFT on records without steps (a column mapping without data.steps_key) trained a curriculum with
    nothing to replace, its checkpoint still recording latent thoughts; a warmup of more steps than a schedule has
    never reached sft.lr. Both without a word."""
    import dataclasses

    from dgrpo.data.synthetic import generate_split
    from dgrpo.model.factory import load_model
    from dgrpo.training.sft import train_sft

    cfg = tiny_config(**{"sft.num_epochs": 1, "sft.epochs_per_stage": 1, "sft.max_latent_stage": 0})
    train = [dataclasses.replace(r, steps=[]) for r in generate_split(cfg.task, "train")[:64]]
    with pytest.warns(UserWarning) as seen:
        train_sft(load_model(cfg.model, cfg.task, seed=0), train, cfg, tmp_path / "sft", log=lambda *a: None)
    said = [str(w.message) for w in seen]
    assert any(
        line.startswith("none of the 64 training records has reasoning steps: sft.mode=coconut has no steps to replace")
        and "map the column that holds them with data.steps_key" in line
        for line in said
    ), said
    warmup = "sft.warmup_steps=5 is not below the 1 optimizer step of the run's lr schedule (64 examples: 1 batch of "
    assert any(
        line.startswith(warmup) and "never reaches sft.lr=0.003 there (it peaks at 0.0006)" in line for line in said
    )
    assert all(w.filename == __file__ for w in seen), [w.filename for w in seen]  # (the caller's line)


@pytest.mark.parametrize(
    "mode, says",
    [
        ("coconut", "sft.mode=coconut has no steps to replace by latent thoughts, .*records n_latent=1\\); map"),
        ("no_curriculum", "no_curriculum has no steps to replace by latent thoughts"),
        ("pause", "sft.mode=pause has no steps to replace by pause tokens"),
        ("cot", "sft.mode=cot has no written steps to train, so it trains the answer alone, as sft.mode=no_cot does"),
        ("no_cot", None),  # (the answer alone is what it trains)
    ],
)
def test_which_sft_modes_need_steps(mode, says):
    import dataclasses

    from dgrpo.data.synthetic import generate_split
    from dgrpo.training.sft import _no_steps_line

    cfg = tiny_config(**{"sft.mode": mode})
    train = generate_split(cfg.task, "train")[:4]
    bare = [dataclasses.replace(r, steps=[]) for r in train]
    assert _no_steps_line(train, cfg) == _no_steps_line([*bare, train[0]], cfg) == ""  # (one record with steps)
    line = _no_steps_line(bare, cfg)
    assert (line == "") if says is None else re.search(says, line), line
    mapped = tiny_config(**{"sft.mode": mode, "data.question_key": "q", "data.answer_key": "a", "data.steps_key": "s"})
    assert says is None or "; data.steps_key=s gives none (a list of strings" in _no_steps_line(bare, mapped)


def test_sft_without_steps_names_the_solution_column_whose_lines_would_be_steps(tmp_path):
    """Solutions 'lines... #### 25/24' without <<...>> calculations give no steps; the warning said to map 'the
    column that holds them', which is the answer column itself: it names it."""
    from dgrpo.config import DataConfig
    from dgrpo.training.sft import _no_steps_line

    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"q": "7/8 + 1/6?", "sol": "7/8 = 21/24\n1/6 = 4/24\n#### 25/24"}) + "\n")
    cfg = tiny_config(**{"data.question_key": "q", "data.answer_key": "sol"})
    train = load_spec(str(path), data=DataConfig(question_key="q", answer_key="sol"))
    assert "; data.steps_key=sol takes the lines before '####' of its GSM8K-style solutions as steps (a list" in (
        _no_steps_line(train, cfg)
    )
    path.write_text(json.dumps({"q": "7/8 + 1/6?", "sol": "#### 25/24"}) + "\n")  # (nothing before '####')
    train = load_spec(str(path), data=DataConfig(question_key="q", answer_key="sol"))
    assert "; map the column that holds them with data.steps_key (a list" in _no_steps_line(train, cfg)


@pytest.mark.parametrize(
    "sets, n_train, says",
    [
        ({}, 2048, None),  # tiny.yaml: 32 steps per epoch, 64 per stage, 5 of warmup
        ({}, 128, "is not below the 4 optimizer steps of the shortest stage's lr schedule \\(128 examples: 2 batches"),
        ({"sft.reset_every": "epoch"}, 300, "the 4 optimizer steps of an epoch's lr schedule .*peaks at 0.0024\\)"),
        ({"sft.reset_optimizer": False}, 64, "the 4 optimizer steps of the run's lr schedule"),
        ({"sft.warmup_steps": 4, "sft.reset_optimizer": False}, 64, "reaches sft.lr=0.003 at its last step only;"),
        ({"sft.warmup_steps": 3, "sft.reset_optimizer": False}, 64, None),
    ],
)
def test_an_sft_warmup_not_shorter_than_its_lr_schedule(sets, n_train, says):
    from dgrpo.training.sft import _warmup_line

    line = _warmup_line(n_train, tiny_config(**sets))
    assert (line == "") if says is None else re.search(says, line), line


def test_an_sft_batch_larger_than_the_training_data_is_warned_about(tmp_path):
    """sft.batch_size 64 on 8 examples ran one optimizer step per epoch, of all 8, without a word."""
    from dgrpo.data.synthetic import generate_split
    from dgrpo.model.factory import load_model
    from dgrpo.training.sft import train_sft

    cfg = tiny_config(**{"sft.num_epochs": 1, "sft.epochs_per_stage": 1, "sft.max_latent_stage": 0})
    lm = load_model(cfg.model, cfg.task, seed=0)
    train = generate_split(cfg.task, "train")[:8]
    with pytest.warns(UserWarning, match="sft.batch_size 64 is more than the training data's 8 examples: each epoch"):
        train_sft(lm, train, cfg, tmp_path / "sft", valid=None, evaluate_fn=None, log=lambda *a: None)
    rows = [json.loads(x) for x in (tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1]
    from dgrpo.config import ConfigError
    from dgrpo.training.distributed import Dist

    with pytest.raises(ConfigError, match="the training data's 1 example cannot be shared by 2 processes"):
        train_sft(lm, train[:1], cfg, tmp_path / "two", valid=None, dist=Dist(world_size=2), log=lambda *a: None)
    assert not (tmp_path / "two").exists()  # (a rank without an example crashed in a collective)


def test_a_hugging_face_dataset_in_memory_loads_as_its_rows_would():
    """dgrpo.load_dataset refused a datasets.Dataset ("takes a dataset name or a file / folder path"): a user's
    dataset had to be saved to disk first."""
    datasets = pytest.importorskip("datasets")
    import dgrpo
    from dgrpo.config import DataConfig
    from dgrpo.data.records import DataError

    rows = [{"prompt": "2+2?", "target": 4.0, "work": None, "lvl": 1}, {"prompt": "3+3?", "target": 6, "work": "3+3=6"}]
    ds = datasets.Dataset.from_list(rows)
    cols = DataConfig(question_key="prompt", answer_key="target", steps_key="work")
    recs = dgrpo.load_dataset(ds, data=cols)
    assert [(r.question, r.answer, r.steps, r.meta["lvl"]) for r in recs] == [
        ("2+2?", "4", [], 1),
        ("3+3?", "6", ["3+3=6"], None),
    ]
    both = datasets.DatasetDict({"train": ds, "test": ds.select([0])})
    assert (len(dgrpo.load_dataset(both, data=cols)), len(dgrpo.load_dataset(both, "train", data=cols))) == (1, 2)
    with pytest.raises(DataError, match="the Dataset given is one split"):
        dgrpo.load_dataset(ds, "train", data=cols)
    gsm = datasets.Dataset.from_list([{"question": "Tom has 7 and 7 more?", "answer": "7+7=<<7+7=14>>14\n#### 14"}])
    assert [(r.answer, r.steps) for r in dgrpo.load_dataset(gsm)] == [("14", ["<<7+7=14>>"])]  # (a known format)


def test_a_model_loaded_in_python_is_recorded_as_the_command_line_records_init(sft_checkpoint, tmp_path):
    """From Python (docs/why_replayed_dropout.md's recipe: load_model(..., init=CHECKPOINT), then train_grpo) the
    run's config.json named builtin-tiny and the built-in sizes, and a resume from other weights was not refused."""
    from dgrpo.config import ConfigError
    from dgrpo.data.synthetic import generate_split
    from dgrpo.model.factory import load_model
    from dgrpo.training.grpo import train_grpo

    cfg = tiny_config(**{"grpo.steps": 1, "model.hidden_size": 48})
    train = generate_split(cfg.task, "train")[:8]
    lm = load_model(cfg.model, cfg.task, init=str(sft_checkpoint))
    with pytest.warns(UserWarning, match=r"model.hidden_size=48 \(the model's: \d+\): .* they are ignored"):
        train_grpo(lm, cfg, train, tmp_path / "run", progress=False, log=lambda *a: None)
    recorded = json.loads((tmp_path / "run" / "config.json").read_text())["model"]
    hf = lm.model.config
    assert recorded["name_or_path"] == str(Path(sft_checkpoint).resolve())
    assert (recorded["arch"], recorded["hidden_size"], recorded["num_layers"]) == (
        hf.model_type,
        hf.hidden_size,
        hf.num_hidden_layers,
    )
    assert (cfg.model.name_or_path, cfg.model.hidden_size) == ("builtin-tiny", 48)  # the caller's config as it was
    other = tmp_path / "other"
    shutil.copytree(sft_checkpoint, other)
    lm = load_model(cfg.model, cfg.task, init=str(other))
    with pytest.raises(ConfigError, match=r"different config \(grpo.steps, model.name_or_path\)"):
        train_grpo(lm, replace(cfg, grpo=replace(cfg.grpo, steps=2)), train, tmp_path / "run", log=lambda *a: None)
    old = load_model(cfg.model, cfg.task, init=str(sft_checkpoint))
    old.loaded_from, old.builtin = None, True  # (a run begun before dgrpo recorded a loaded model: builtin-tiny)
    more = replace(cfg, grpo=replace(cfg.grpo, steps=2, save_every=1))
    train_grpo(old, more, train, tmp_path / "older", progress=False, log=lambda *a: None)
    assert json.loads((tmp_path / "older" / "config.json").read_text())["model"]["name_or_path"] == "builtin-tiny"
    shutil.rmtree(tmp_path / "older" / "final")  # (stopped after its last checkpoint: resumed by the same script)
    (tmp_path / "older" / "summary.json").unlink()
    lm = load_model(cfg.model, cfg.task, init=str(sft_checkpoint))
    said = []
    train_grpo(lm, more, train, tmp_path / "older", progress=False, log=said.append)  # (was refused: name_or_path)
    assert any("resumed from" in line for line in said), said


def test_a_model_wrapped_in_python_is_recorded_as_itself_and_its_run_resumes(tokenizer, tmp_path):
    """LatentLM(model, tokenizer) around one's own model: the run's config.json named builtin-tiny with the config's
    sizes (another model than the one trained). It names the model's own checkpoint where transformers set one, else
    python:<class>, with the model's shape; a warning says a resume takes that model again, and it resumes."""
    from dgrpo.data.synthetic import generate_split
    from dgrpo.training.grpo import train_grpo
    from dgrpo.training.sft import train_sft

    from conftest import make_lm

    lm = make_lm(tokenizer, hidden_size=24, num_layers=1)
    cfg = tiny_config(**{"grpo.steps": 2, "grpo.save_every": 1, "grpo.prompts_per_step": 2, "data.test": "[]"})
    train, out, quiet = generate_split(cfg.task, "train")[:4], tmp_path / "run", {"progress": False, "log": print}
    with pytest.warns(UserWarning, match=r"built in Python .*model.name_or_path=python:Qwen2ForCausalLM, and a resume"):
        train_grpo(lm, cfg, train, out, **quiet)
    recorded = json.loads((out / "config.json").read_text())["model"]
    assert (recorded["name_or_path"], recorded["hidden_size"], recorded["num_layers"]) == (
        "python:Qwen2ForCausalLM",
        24,
        1,
    )
    shutil.rmtree(out / "final")  # (stopped after its last checkpoint: resumed by the same script, same model)
    (out / "summary.json").unlink()
    said: list[str] = []
    with pytest.warns(UserWarning, match="a resume of it must be given that model again"):
        train_grpo(lm, cfg, train, out, progress=False, log=said.append)
    assert any("resumed from" in line for line in said), said
    lm.model.config._name_or_path = str(tmp_path)  # (what transformers' from_pretrained sets)
    sft = replace(cfg, sft=replace(cfg.sft, num_epochs=1, epochs_per_stage=1, max_latent_stage=0))
    with pytest.warns(UserWarning, match=f"model.name_or_path={tmp_path}, and a resume"):
        train_sft(lm, train, sft, tmp_path / "sft", **quiet)
    assert json.loads((tmp_path / "sft" / "config.json").read_text())["model"]["name_or_path"] == str(tmp_path)


def test_a_runs_data_files_are_recorded_by_absolute_path(tmp_path, monkeypatch):
    """Local data files and folders of ``data.train`` and ``data.valid`` are kept absolute in the run's config, as the
    reward's file is (the same command, or a resume, from another folder found the reward and not the data); built-in
    and hub names, and names of nothing on disk, stay as typed; each part of a join alike. ``data.test`` as typed (its
    specs name the results: an absolute path named them ``_home_me_my_test.jsonl``)."""
    from dgrpo.cli.train import record_init
    from dgrpo.config import Config, load_config

    monkeypatch.chdir(tmp_path)
    for name in ("my_train.jsonl", "v.jsonl", "t.csv"):
        (tmp_path / name).write_text("")
    (tmp_path / "folder").mkdir()
    sets = ["data.train=my_train.jsonl+gsm8k+t.csv", "data.valid=v.jsonl:test"]
    sets += ["data.test=[folder:test, 'builtin:test?n_steps=3', gsm8k, org/name, missing.jsonl]"]
    cfg = record_init(load_config(Config, None, sets), None, tmp_path / "run")
    here = tmp_path.resolve()
    assert cfg.data.train == f"{here}/my_train.jsonl+gsm8k+{here}/t.csv"
    assert cfg.data.valid == f"{here}/v.jsonl:test"
    assert cfg.data.test == ["folder:test", "builtin:test?n_steps=3", "gsm8k", "org/name", "missing.jsonl"]
    cfg = record_init(load_config(Config, None, ["data.valid="]), None, tmp_path / "run")
    assert (cfg.data.train, cfg.data.valid) == ("builtin:train", "")


def test_a_reward_calling_sys_exit_is_one_line_naming_it_and_the_row():
    """``sys.exit()`` inside a reward (a script's habit on a bad row) ended training with no word: the call's wrapper
    caught ``Exception`` only, and SystemExit is not one. It is a RewardError naming the reward and the row, as any
    other failure is; KeyboardInterrupt (Ctrl-C, SIGTERM's) still goes through."""
    from dgrpo.eval.scoring import call_checked

    recs = [Record(f"question {i}", [], str(i)) for i in range(4)]

    def bails(completions, records):
        if "bad" in completions:
            sys.exit("cannot parse")
        return [0.0] * len(completions)

    with pytest.raises(RewardError) as raised:
        call_checked(bails, "mine.py:bails", ["a", "b", "bad", "c"], recs)
    assert str(raised.value) == (
        "reward mine.py:bails raised SystemExit: cannot parse (sys.exit() called in it: raise an error, or return 0 "
        "for a completion it cannot score) on row 2 (completion 'bad', question 'question 2')"
    )

    def interrupted(completions, records):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        call_checked(interrupted, "mine.py:interrupted", ["a"], recs[:1])


def test_the_plugin_files_a_run_records_are_its_reward_and_scorer_files_not_builtins(tmp_path, monkeypatch):
    """applied.json's ``plugin_files``: a file spec's file and an imported package module's, by absolute path and
    SHA-256; a built-in name, a missing file and dgrpo's own modules record nothing."""
    import hashlib

    from dgrpo.plugins import source_hashes

    (tmp_path / "mine.py").write_text("def f(completions, records):\n    return [0.0] * len(completions)\n")
    package = f"mypkg_{tmp_path.name.replace('-', '_')}"  # (a name of this test's own: sys.modules keeps modules)
    (tmp_path / package).mkdir()
    (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / package / "rewards.py").write_text("def g(completions, records):\n    return []\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    load_function(f"{package}.rewards:g")
    specs = ["mine.py:f", f"{package}.rewards:g", "numeric", "gone.py:f", "dgrpo.eval.scoring:exact", ""]
    assert source_hashes(specs) == {
        str(p.resolve()): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in (tmp_path / "mine.py", tmp_path / package / "rewards.py")
    }


def test_data_holding_a_latent_markers_text_is_warned_of_once(tokenizer, tmp_path):
    """A question or answer holding ``<|latent|>`` as text was read by the latent model's tokenizer as the marker
    token itself, without a word: reading such data warns once per dataset, naming it and the first record."""
    from dgrpo.data import load_rows

    from conftest import make_lm

    lm = make_lm(tokenizer)
    assert lm.latent_id in lm.token_ids(["x <|latent|> y"])[0]  # (why it matters: the text is the marker token)
    rows = [{"question": "2 + 2?", "answer": "4"}, {"question": "what does <|latent|> mean?", "answer": "1"}]
    rows.append({"question": "q", "answer": "<|end-latent|>"})
    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_rows(rows[:1])
        load_spec(str(path))
    assert [str(w.message) for w in caught] == [
        f"{path}: 2 records hold the latent marker text '<|latent|>' (record 1's question: 'what does <|latent|> "
        "mean?'), which a latent model's tokenizer reads as the marker token, not as text: remove or respell it in "
        "the data"
    ]
    assert caught[0].filename == __file__  # (the caller's line)


def _scored(correct: int, mean_score: float | None, n: int = 4):
    """The EvalResult an ``evaluate_fn`` of one's own may return: ``correct`` of ``n`` records, their mean score."""
    from dgrpo.eval.evaluate import EvalResult

    return EvalResult("v", correct / n, n, correct, 0, 0, 0, "coconut", 0.0, mean_score=mean_score)


@pytest.mark.filterwarnings("ignore:the model's latent markers")
def test_the_default_validation_reduces_a_partial_credit_scorers_mean_score(tokenizer, tmp_path):
    """The trainers' validation returned the count of correct records only: a partial-credit scorer's 0.5s were
    nowhere in metrics.jsonl. The default evaluate_fn now returns evaluate's EvalResult; the shards' counts and
    scores are summed (a count of one's own still works, without a mean score; an EvalResult of other records than
    the shard's, or a mean score outside [0, 1], is refused)."""
    from dgrpo.training.distributed import Dist
    from dgrpo.training.run_inputs import default_evaluate_fn
    from dgrpo.training.sharded_eval import sharded_scores

    from conftest import make_lm

    (tmp_path / "half.py").write_text("def half(completions, records):\n    return [0.5] * len(completions)\n")
    cfg = tiny_config(**{"eval.scorer": f"{tmp_path / 'half.py'}:half", "eval.max_new_tokens": 2})
    lm, recs = make_lm(tokenizer), load_spec("builtin:test?n_test=3")
    fn = default_evaluate_fn(cfg, recs)
    assert sharded_scores(Dist.single(), lambda local: fn(lm, local), recs) == {"accuracy": 0.0, "mean_score": 0.5}
    assert sharded_scores(Dist.single(), lambda local: 2, recs) == {"accuracy": 2 / 3}  # (a count: as before)
    assert sharded_scores(Dist.single(), lambda local: _scored(2, None, 3), recs) == {"accuracy": 2 / 3}
    with pytest.raises(TypeError, match="returned the EvalResult of 4 records for the 3 it is given"):
        sharded_scores(Dist.single(), lambda local: _scored(2, 0.5), recs)
    with pytest.raises(TypeError, match="mean_score is 1.5, not in"):
        sharded_scores(Dist.single(), lambda local: _scored(2, 1.5, 3), recs)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:grpo.filter")
def test_grpo_logs_the_mean_score_and_keeps_best_by_the_metric_asked(sft_checkpoint, tmp_path):
    """A partial-credit scorer's validation: eval/<name>/mean_score is logged beside the accuracy (both were only
    the accuracy), and grpo.best_metric=mean_score keeps best/ by it: here accuracy's best is step 2 (2 of 4
    correct), the mean score's step 4 (one correct, three 0.9s), so each metric keeps its own step."""
    from dgrpo.data.synthetic import generate_split
    from dgrpo.eval.evaluate import evaluate
    from dgrpo.model.latent_lm import LatentLM
    from dgrpo.training.grpo import train_grpo

    base = {"grpo.steps": 4, "grpo.prompts_per_step": 2, "grpo.eval_every": 2, "grpo.save_every": 2}
    base |= {"grpo.warmup_steps": 0, "grpo.filter": "false", "grpo.max_new_tokens": 4, "eval.max_new_tokens": 2}
    scores = [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0.9, 0.9, 0.9]]  # the validations at steps 0, 2 and 4

    def run(metric: str) -> tuple[list[str], dict, list[dict]]:
        cfg, calls = tiny_config(**base, **{"grpo.best_metric": metric}), iter(scores)
        said: list[str] = []
        train = generate_split(cfg.task, "train")[:8]

        def evaluate_fn(lm, records):  # a scorer of partial credit, its values scripted by validation
            values = next(calls)
            return evaluate(lm, records, scorer=lambda c, r: values, max_new_tokens=2, progress=False)

        out = tmp_path / metric
        lm = LatentLM.from_pretrained(sft_checkpoint)
        train_grpo(
            lm, cfg, train, out, valid={"v": train[:4]}, evaluate_fn=evaluate_fn, progress=False, log=said.append
        )
        rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        return said, json.loads((out / "summary.json").read_text()), [r for r in rows if "eval/v/accuracy" in r]

    _, summary, evals = run("accuracy")
    assert [(r["step"], r["eval/v/accuracy"], r["eval/v/mean_score"]) for r in evals] == [
        (0, 0.25, 0.25),
        (2, 0.5, 0.5),
        (4, 0.25, pytest.approx(0.925)),
    ]
    assert (summary["best_step"], summary["best_metric"], summary["best_accuracy"]) == (2, "accuracy", 0.5)
    said, summary, _ = run("mean_score")
    assert (summary["best_step"], summary["best_metric"], summary["best_accuracy"]) == (4, "mean_score", 0.25)
    assert summary["best_mean_score"] == pytest.approx(0.925)
    assert any("best by mean_score 0.9250 (25.00%) at step 4" in line for line in said), said


def test_the_summary_of_a_best_kept_without_a_mean_score_under_best_metric_mean_score(tmp_path):
    """A run whose best/ was kept with no mean score (by a count, or by dgrpo before mean scores), resumed with
    grpo.best_metric=mean_score and no validation after it (resumed at its last checkpoint): its summary raised
    'unsupported format string passed to NoneType.__format__' at the very end; it names best/'s accuracy."""
    import time
    from types import SimpleNamespace

    from dgrpo.training.grpo import LoopState, _summary

    lines: list[str] = []
    run = SimpleNamespace(out_dir=tmp_path, resumed_step=2, log=lines.append)
    loop = LoopState(best_step=0, best_accuracy=0.25, last_eval=0.25, started=time.time())
    summary = _summary(run, loop, 2, {}, "mean_score")
    assert (summary["best_step"], summary["best_accuracy"], summary["best_mean_score"]) == (0, 0.25, None)
    assert "best 25.00% at step 0" in lines[0], lines


def test_the_sft_summary_of_a_best_kept_without_a_mean_score_under_best_metric_mean_score(tmp_path):
    """SFT's alike: a best/ kept by a count's accuracy, its run resumed with nothing left to train under
    sft.best_metric=mean_score, was said 'best/: epoch 0 by mean_score nan (25.0%)'; its accuracy is said."""
    import torch

    from dgrpo.data.synthetic import generate_split
    from dgrpo.model.factory import load_model
    from dgrpo.training.sft import train_sft

    over = {"sft.batch_size": 4, "sft.warmup_steps": 0, "sft.num_epochs": 1, "sft.eval_every_epoch": True}
    said: list[str] = []
    for metric, evaluate_fn in (("accuracy", lambda *a: 1), ("mean_score", lambda *a: _scored(1, 0.5))):
        cfg = tiny_config(**over, **{"sft.best_metric": metric})
        torch.manual_seed(0)
        lm, train = load_model(cfg.model, cfg.task, seed=0), generate_split(cfg.task, "train")[:4]
        kw = {"log": said.append, "progress": False, "allow_config_change": True}
        train_sft(lm, train, cfg, tmp_path, valid=train, evaluate_fn=evaluate_fn, **kw)
    assert "; best/: epoch 0 (25.0%); " in said[-1] and "nan" not in said[-1], said[-1]


def test_best_metric_mean_score_is_refused_for_an_evaluate_fn_that_returns_a_count(sft_checkpoint, tmp_path):
    """grpo.best_metric / sft.best_metric = mean_score with an evaluate_fn of one's own that returns a count (no
    mean score to keep best/ by) is refused in one line at the first validation (GRPO's, before the first step),
    before its row is written, or before anything when the function is annotated to return an int; under accuracy
    such a count still validates and keeps best/, with no mean score."""
    import torch

    from dgrpo.config import ConfigError
    from dgrpo.data.synthetic import generate_split
    from dgrpo.model.factory import load_model
    from dgrpo.model.latent_lm import LatentLM
    from dgrpo.training.grpo import train_grpo
    from dgrpo.training.sft import train_sft

    over = {"grpo.steps": 1, "grpo.prompts_per_step": 2, "grpo.warmup_steps": 0, "grpo.max_new_tokens": 4}
    cfg = tiny_config(**over, **{"grpo.best_metric": "mean_score"})
    train = generate_split(cfg.task, "train")[:8]
    lm, kw = LatentLM.from_pretrained(sft_checkpoint), {"progress": False, "log": lambda *a: None}
    refused = "grpo.best_metric=mean_score: the evaluate_fn returns a count of correct records, which has no mean_score"
    with pytest.raises(ConfigError, match=refused):
        train_grpo(lm, cfg, train, tmp_path / "g", valid={"v": train[:4]}, evaluate_fn=lambda lm, recs: 1, **kw)
    assert not (tmp_path / "g" / "metrics.jsonl").read_text()  # (refused before the step-0 row)
    cfg = tiny_config(**over)
    train_grpo(lm, cfg, train, tmp_path / "a", valid={"v": train[:4]}, evaluate_fn=lambda lm, recs: 1, **kw)
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert (summary["best_step"], summary["best_accuracy"], summary["best_mean_score"]) == (0, 0.25, None)
    sft = {"sft.num_epochs": 1, "sft.batch_size": 4, "sft.warmup_steps": 0, "sft.eval_every_epoch": True}
    cfg = tiny_config(**sft, **{"sft.best_metric": "mean_score"})
    torch.manual_seed(0)
    lm = load_model(cfg.model, cfg.task, seed=0)
    with pytest.raises(ConfigError, match=refused.replace("grpo.", "sft.")):  # (after its first epoch)
        train_sft(lm, train, cfg, tmp_path / "s", valid=train[:4], evaluate_fn=lambda lm, recs, s: 1, **kw)

    def counted(lm, records, settings) -> int:  # (annotated: refused before a run directory is touched)
        return 1

    with pytest.raises(ConfigError, match=refused.replace("grpo.", "sft.")):
        train_sft(lm, train, cfg, tmp_path / "early", valid=train[:4], evaluate_fn=counted, **kw)
    assert not (tmp_path / "early").exists()


def test_sft_logs_the_mean_score_and_keeps_best_by_it(tmp_path):
    """The same for SFT under sft.eval_every_epoch: each validation row has eval/valid/mean_score, and
    sft.best_metric=mean_score keeps best/ at the final layout's epoch of the highest mean score (epoch 3: two
    correct, 0.9), not the highest accuracy (epoch 2: three correct, 0.75); its row records both."""
    import torch

    from dgrpo.data.synthetic import generate_split
    from dgrpo.model.factory import load_model
    from dgrpo.training.sft import train_sft

    over = {"task.n_train": 16, "sft.batch_size": 8, "sft.warmup_steps": 0, "sft.num_epochs": 4}
    over |= {"sft.stage_epochs": [1], "sft.epochs_per_stage": 1, "sft.max_latent_stage": 1}
    cfg = tiny_config(**over, **{"sft.eval_every_epoch": True, "sft.best_metric": "mean_score"})
    results = iter([_scored(1, 0.25), _scored(1, 0.3), _scored(3, 0.75), _scored(2, 0.9)])  # epochs 0-3
    torch.manual_seed(0)
    lm, out, said = load_model(cfg.model, cfg.task, seed=0), tmp_path / "sft", []
    train = generate_split(cfg.task, "train")
    train_sft(lm, train, cfg, out, valid=train[:4], evaluate_fn=lambda *a: next(results), log=said.append)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["eval/valid/mean_score"] for r in rows if "eval/valid/accuracy" in r] == [0.25, 0.3, 0.75, 0.9]
    best = [(r["best_epoch"], r["best/valid/accuracy"], r["best/valid/mean_score"]) for r in rows if "best_epoch" in r]
    assert best == [(2, 0.75, 0.75), (3, 0.5, 0.9)]
    assert any("best/: epoch 3 by mean_score 0.9000 (50.0%)" in line for line in said), said


def test_best_metric_without_a_best_is_warned_of():
    """grpo.best_metric / sft.best_metric set where no best/ is kept (grpo.save_best=false; SFT without
    sft.eval_every_epoch) change nothing, and say so at the start of the run, as the other idle options do."""
    from dgrpo.config import unused_sft_settings

    mean = {"grpo.best_metric": "mean_score", "sft.best_metric": "mean_score"}
    lines = tiny_config(**mean, **{"grpo.save_best": False}).inert_settings()
    assert "grpo.best_metric=mean_score changes nothing with grpo.save_best=false (no best/ is kept)" in lines
    assert tiny_config(**mean).inert_settings() == []
    said = "sft.best_metric=mean_score changes nothing with sft.eval_every_epoch=false"
    assert unused_sft_settings(tiny_config(**mean).sft) == [said]
    assert unused_sft_settings(tiny_config(**mean, **{"sft.eval_every_epoch": True}).sft) == []


def test_the_plugin_files_a_run_records_are_as_its_process_imported_them(tmp_path, monkeypatch):
    """applied.json's ``plugin_files`` hashed each file as it was on disk when the entry was written: a reward edited
    while the run went on, its entry rewritten at the run's stop (a SIGTERM, a guard, the end) with the edit's hash,
    let the resume that imported the edit go on without a word, though the steps before it ran the file as it was.
    The hash is the file's as the process imported it: a plug-in file's as executed, a package module's as first
    hashed; a file imported again (edited, named again) is hashed again."""
    import hashlib
    import importlib

    from dgrpo.plugins import source_hashes

    def digest(text: str) -> str:
        return hashlib.sha256(text.encode()).hexdigest()

    v1, v2 = (f"def f(completions, records):\n    return [{x}] * len(completions)\n" for x in ("0.0", "1.0"))
    package = f"mypkg_{tmp_path.name.replace('-', '_')}"  # (a name of this test's own: sys.modules keeps modules)
    (tmp_path / package).mkdir()
    (tmp_path / package / "__init__.py").write_text("")
    files = {"mine.py:f": tmp_path / "mine.py", f"{package}.rewards:f": tmp_path / package / "rewards.py"}
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # (v1 and v2, of one size and second, share a .pyc's key)
    for path in files.values():
        path.write_text(v1)
    run = {spec: load_function(spec) for spec in files}
    expected = {str(path.resolve()): digest(v1) for path in files.values()}
    assert source_hashes(files) == expected  # (at the run's start)
    for path in files.values():
        path.write_text(v2)
    assert [fn(["a"], [None]) for fn in run.values()] == [[0.0], [0.0]]  # (the process runs the files it imported)
    assert source_hashes(files) == expected  # (at its stop: what it ran)
    assert load_function("mine.py:f")(["a"], [None]) == [1.0]  # (imported again: the edit runs, and is recorded)
    assert source_hashes(files)[str(files["mine.py:f"].resolve())] == digest(v2)
    importlib.reload(sys.modules[f"{package}.rewards"])  # (a notebook's reload: the package module runs the edit;
    # its hash, kept in the module, which a reload keeps, was v1's)
    assert load_function(f"{package}.rewards:f")(["a"], [None]) == [1.0]
    assert source_hashes(files)[str(files[f"{package}.rewards:f"].resolve())] == digest(v2)


class _ThreadRank:
    """One of ``world`` ranks run as threads: the collectives ``sharded_scores`` calls, each rank's value exchanged
    through shared slots (sums in rank order)."""

    def __init__(self, slots: list, barrier, rank: int) -> None:
        self.slots, self.barrier, self.rank, self.world_size = slots, barrier, rank, len(slots)

    def shard(self, items: list) -> list:
        n = len(items)
        return items[n * self.rank // self.world_size : n * (self.rank + 1) // self.world_size]

    def all_gather_objects(self, obj):
        self.slots[self.rank] = obj
        self.barrier.wait()
        out = list(self.slots)
        self.barrier.wait()
        return out

    def sum_ints(self, xs):
        return [sum(column) for column in zip(*self.all_gather_objects(list(xs)))]

    def sum_float(self, x: float) -> float:
        return sum(self.all_gather_objects(x))


def _on_thread_ranks(world: int, evaluate, recs: list) -> list:
    """``sharded_scores(rank, evaluate, recs)`` on each of ``world`` thread ranks."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from dgrpo.training.sharded_eval import sharded_scores

    slots, barrier = [None] * world, threading.Barrier(world)
    ranks = [_ThreadRank(slots, barrier, r) for r in range(world)]
    with ThreadPoolExecutor(world) as pool:
        return list(pool.map(lambda rank: sharded_scores(rank, evaluate, recs), ranks))


def _scoring(scores: dict):
    """An evaluate_fn returning evaluate's kind of EvalResult: each record's row scored ``scores[question]``."""
    from dgrpo.eval.evaluate import EvalResult, _mean_score

    def evaluate(local: list) -> EvalResult:
        rows = [{"question": r.question, "score": scores[r.question]} for r in local]
        n = len(rows)
        return EvalResult("v", 0.0, n, 0, 0, 0, 0, "coconut", 0.0, mean_score=_mean_score(rows), predictions=rows)

    return evaluate


def test_validation_mean_score_over_ranks_is_one_processs_bit_for_bit():
    """Each rank's mean score times its shard's size, summed over ranks, was 0.46428571428571436 where one process
    had 0.4642857142857143 (scores 0.25, 0.3, 0.7, 0.9, 0.1, 0.3, 0.7 on 3 ranks): a near-tie could keep another
    best/ step. The ranks' scores are gathered and summed in the records' order, as one process sums them."""
    from dgrpo.eval.evaluate import _mean_score
    from dgrpo.training.distributed import Dist
    from dgrpo.training.sharded_eval import sharded_scores

    scores = {f"q{i}": s for i, s in enumerate([0.25, 0.3, 0.7, 0.9, 0.1, 0.3, 0.7])}
    recs = [Record(q, [], "1") for q in scores]
    one = sharded_scores(Dist.single(), _scoring(scores), recs)
    assert one["mean_score"] == _mean_score([{"score": s} for s in scores.values()]) == 0.4642857142857143
    for world in (2, 3, 8):  # (8: a rank with no record)
        assert _on_thread_ranks(world, _scoring(scores), recs) == [one] * world


def test_validation_reads_prediction_rows_scores_only_where_they_are_the_results_mean():
    """An evaluate_fn of one's own whose rows' 'score' is another thing than its mean_score (a percent: 87.0 for a
    mean_score of 0.87) validated at mean_score 87.0 (the rows were read in place of the mean); a scorer's ints
    beside its floats (1 and 0.5) were read from the mean, and 2 or 3 ranks differed from one process in the last
    bit (0.4666666666666666 for 0.46666666666666673). Rows are read where their mean is the result's."""
    from dgrpo.eval.evaluate import EvalResult
    from dgrpo.training.distributed import Dist
    from dgrpo.training.sharded_eval import sharded_scores

    recs = [Record(f"q{i}", [], "1") for i in range(4)]

    def percent(local: list) -> EvalResult:
        rows = [{"question": r.question, "score": 87.0} for r in local]
        return EvalResult("v", 0.0, len(rows), 0, 0, 0, 0, "coconut", 0.0, mean_score=0.87, predictions=rows)

    assert sharded_scores(Dist.single(), percent, recs) == {"accuracy": 0.0, "mean_score": 0.87}
    values = [0, 0.3, 0, 0.7, 0.25, 1, 0.25, 0.7, 0.5, 0.7, 0.5, 0.7]
    scores = {f"q{i}": s for i, s in enumerate(values)}
    recs = [Record(q, [], "1") for q in scores]
    one = sharded_scores(Dist.single(), _scoring(scores), recs)
    assert one["mean_score"] == sum(values) / len(values) == 0.46666666666666673
    for world in (2, 3):
        assert _on_thread_ranks(world, _scoring(scores), recs) == [one] * world
