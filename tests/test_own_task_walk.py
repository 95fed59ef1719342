"""A walk through README's "Your own task" with a reward and scorer of one's own: what their errors say."""

import re
from pathlib import Path

import pytest

from dgrpo.data.records import Record
from dgrpo.eval.scoring import RewardError, RewardPart, Rewards, check_scorer


def _tagged(completions, records):
    """A reward of another answer format: it reads '<answer>N</answer>' and fails on anything else."""
    return [float(c.split("<answer>")[1].split("</answer>")[0] == r.answer) for c, r in zip(completions, records)]


def _own_gold_only(completions, records):
    """A scorer that raises on an answer not its question's own (as on the check's swapped golds)."""
    if any(c != f"#### {r.answer}" for c, r in zip(completions, records)):
        raise ValueError("not this question's answer")
    return [1.0] * len(completions)


RECS = [Record("Ann has 2 and 3 more: how many?", [], "5"), Record("Ben has 4 and 4 more: how many?", [], "8")]


def test_a_reward_failing_on_the_gold_check_says_the_completion_was_not_the_models():
    """The first call of a reward, on gold answers written as '#### <answer>' before anything is trained, named
    completion '#### 5' as if the model had written it: the line now says it came from that check."""
    with pytest.raises(RewardError) as raised:
        Rewards([RewardPart("tagged", _tagged)]).smoke_test(RECS, check_filter=True)
    line = str(raised.value)
    assert line.startswith("reward tagged raised IndexError: list index out of range on row 0 (completion '#### 5'")
    assert "found by the check made before training or evaluating, on gold answers written as '#### <answer>'" in line
    assert "\n" not in line


def test_a_scorer_failing_on_the_swapped_golds_says_so():
    """check_scorer's second call gives each record the other's gold: a failure there names a completion that is not
    even the question's own answer, and says so."""
    with pytest.raises(RewardError, match=r"'#### <answer>', each given to the other record \(no completion"):
        check_scorer(_own_gold_only, RECS)
    with pytest.raises(RewardError, match=r"on gold answers written as '#### <answer>' \(no completion"):
        check_scorer(_tagged, RECS)


def test_a_bad_value_names_the_completion_it_was_given():
    """A scorer's NaN (or a string) on a batch of the model's rollouts named the row's question alone: which of its
    group's completions made the value was left to guess. The line names the completion too."""
    from dgrpo.eval.scoring import call_checked

    def parsed(completions, records):
        return [float(c.split("#")[-1]) for c in completions]

    with pytest.raises(RewardError) as raised:
        call_checked(parsed, "parsed", ["#### 1", "#### nan"], RECS, "scorer")
    assert str(raised.value) == (
        "scorer parsed returned nan for row 1 (completion '#### nan', question 'Ben has 4 and 4 more: how many?'): "
        "every completion needs a finite number: return 0.0 for one it cannot score"
    )
    with pytest.raises(RewardError, match=r"returned 2\.0 for row 0 \(completion '#### 2', question 'Ann has"):
        call_checked(parsed, "parsed", ["#### 2"], RECS[:1], "scorer")


def test_the_summary_gives_the_final_mean_score_beside_the_best(tmp_path):
    """With grpo.best_metric=mean_score (a partial-credit scorer), summary.json had best/'s mean score and the final
    model's accuracy alone: best and final could not be compared by the metric chosen. final_mean_score is the last
    validation's mean score, and the closing line names it; a checkpoint's loop record keeps it for a resume."""
    import json
    from types import SimpleNamespace

    from dgrpo.training.grpo import LoopState, _loop_record, _summary

    lines: list[str] = []
    run = SimpleNamespace(out_dir=tmp_path, log=lines.append, resumed_step=None)
    loop = LoopState(best_step=2, best_accuracy=0.25, best_mean_score=0.5, last_eval=0.0, last_mean_score=0.375)
    summary = _summary(run, loop, 4, {}, "mean_score")
    assert summary["final_mean_score"] == 0.375 and summary["best_mean_score"] == 0.5
    assert json.loads((tmp_path / "summary.json").read_text())["final_mean_score"] == 0.375
    assert "final mean_score 0.3750 (0.00%)" in lines[-1]
    assert LoopState(**_loop_record(loop)).last_mean_score == 0.375
    assert "last_mean_score" not in _loop_record(LoopState())
    assert _summary(run, LoopState(), 4, {})["final_mean_score"] is None
    assert "; not validated;" in lines[-1]


@pytest.mark.parametrize("cmd", ["grpo", "sft"])
def test_a_missing_local_model_is_said_before_the_data_is_read_or_warned_about(run_cli, tmp_path, recwarn, cmd):
    """``--init`` (or ``model.name_or_path``) naming a folder that is not there was said only once the data had been
    read, after the warning that data.valid and data.test are the built-in task's: the one line now comes first."""
    train = tmp_path / "mine.jsonl"
    train.write_text('{"question": "q", "answer": "1"}\n')
    model = ["--init", tmp_path / "gone"] if cmd == "grpo" else ["--set", f"model.name_or_path={tmp_path}/gone"]
    r = run_cli(cmd, *model, "--set", f"data.train={train}", "--out", tmp_path / "run")
    assert (r.returncode, r.stderr) == (2, f"dgrpo: error: checkpoint directory not found: {tmp_path}/gone\n")
    assert [str(w.message) for w in recwarn] == []


def test_docs_from_trl_names_every_rollouts_field_a_part_may_not_take():
    """docs/from_trl.md listed rollouts.jsonl's fields a reward part may not be named as without ``answer`` (added to
    the rows this session): a part named answer was refused by a rule the guide did not state."""
    from pathlib import Path

    from dgrpo.eval.scoring import ROLLOUT_FIELDS

    guide = (Path(__file__).resolve().parents[1] / "docs" / "from_trl.md").read_text()
    said = guide[guide.index("may not be one of that") :].split(")")[0]
    assert said.count("`") == 2 * len(ROLLOUT_FIELDS) and all(f"`{f}`" in said for f in ROLLOUT_FIELDS), said
    with pytest.raises(RewardError, match=r"reward part name\(s\) answer are fields of rollouts.jsonl's rows"):
        Rewards([RewardPart("correct", _tagged), RewardPart("answer", _own_gold_only, 0.1)])


def _named(text: str) -> list[str]:
    """The names in backticks of a list in the docs, its parentheses' asides left out."""
    return re.findall(r"`(\w+)`", re.sub(r"\([^()]*\)", "", text))


def test_the_docs_name_every_keyword_a_trl_reward_receives(tmp_path):
    """Every record's meta holds ``source`` (the file read), so a reward in TRL's form is given a ``source`` keyword:
    neither README's "Your own task" nor docs/from_trl.md said so; both now list the keywords a file of only
    question and answer gives, and say what ``source`` holds (the file as named, ``rows``, ``builtin`` and
    ``split``)."""
    from dgrpo import load_dataset
    from dgrpo.config import TaskConfig
    from dgrpo.data import load_spec
    from dgrpo.eval.scoring import trl_columns

    path = tmp_path / "mine.jsonl"
    path.write_text('{"question": "q", "answer": "1"}\n')
    given = trl_columns(["c"], load_dataset(str(path)))
    root = Path(__file__).resolve().parents[1]
    guide = (root / "docs" / "from_trl.md").read_text()
    listed = guide[guide.index("one entry per completion:") :].split(", and every other column")[0]
    readme = (root / "README.md").read_text()
    listed_too = readme[readme.index("it is\n  called with") :].split(" and the data's other columns")[0]
    assert _named(listed) == _named(listed_too) == list(given), (listed, listed_too, list(given))
    assert given["source"] == [str(path)]
    assert trl_columns(["c"], load_dataset([{"question": "q", "answer": "1"}]))["source"] == ["rows"]
    builtin = trl_columns(["c"], load_spec("builtin:valid", TaskConfig(n_valid=1))[:1])
    assert (builtin["source"], builtin["split"]) == (["builtin"], ["valid"])
    assert all(f"`{value}`" in listed for value in ("rows", "builtin", "split"))
