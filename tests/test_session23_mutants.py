"""Tests that kill mutants of session 23's code which its own tests let survive: a checkpoint's stuck generator
(``checkpoint.stuck_generator``), the earlier plug-in reward names a resume reads (``resume_check.same_reward``,
``recorded_changes``, ``check_resume_data``), the check of every training question against the context
(``grpo.check_rollouts_fit`` / ``run_inputs.widest_prompt``), a reward's identity and positional-only refusal
(``scoring.function_name`` / ``_bound_value`` / ``_refuse_keywordless``), and the data files' checks
(``data.check_files_exist`` / ``loaders.files_like``, ``loaders._spread_object``), and a W&B sweep's check
(``tracking._holds`` / ``check_sweep_parameters``). Each test's docstring names the behaviour and the mutant it kills.

Equivalent mutants (no behaviour tells them apart), left alive:

- check_rollouts_fit's shortcut ``fits + max_tokens <= limit`` -> ``<``: at equality the full check runs and passes.
- _EARLIER_PLUGIN_NAME's lazy ``(\\w+?)`` -> greedy ``(\\w+)``: the ``_<12 hex>.`` that must follow it is the last
  such run before a dot either way (``\\w`` takes no dot), so both capture the same file name.
- tables.not_utf8's ``data[: exc.start]`` -> ``data[: exc.start + 1]``: the byte at ``exc.start`` is never a newline
  (0x0A is valid UTF-8).
- loaders' ``_spread_object(...) if text.lstrip()[:1] == "{" else None`` -> always calling it: a text not opening
  with ``{`` decodes to no dict (or not at all), so _spread_object returns None either way.
"""

from __future__ import annotations

import json
import random
import re

import pytest


def test_a_state_whose_second_word_alone_is_set_is_not_stuck():
    """A Mersenne Twister state with only its second word non-zero draws numbers other than 0: not stuck, and a
    checkpoint holding it is not refused. Kills ``any(words[1:])`` -> ``any(words[2:])`` in stuck_generator."""
    from dgrpo.training.checkpoint import python_random_state, stuck_generator

    words = [0, 1] + [0] * 622
    gen = random.Random()
    gen.setstate((3, (*words, 624), None))
    assert any(gen.getrandbits(32) for _ in range(700))  # (the generator is live)
    assert not stuck_generator(words)
    assert python_random_state([3, [*words, 624], None])[1][:2] == (0, 1)
    assert stuck_generator([0x7FFFFFFF] + [0] * 623)  # (the low 31 bits of the first word are never read)


@pytest.mark.parametrize(
    "saved",
    [
        "r = mydgrpo_plugin_my_rewards_0123456789ab.reward * 1",  # (a module whose name only ends so)
        "r = dgrpo_plugin_my_rewards_abc.reward * 1",  # (no 12-digit digest: not a name an earlier dgrpo wrote)
    ],
)
def test_a_module_name_that_is_no_earlier_plugin_name_is_compared_as_it_is(saved):
    """Only a name earlier dgrpo wrote for a plug-in file (``dgrpo_plugin_<stem>_<12 hex digits>.``, a module name
    of its own) reads as that file's: another module's name is another reward. Kills dropping the ``\\b`` and
    ``{12}`` -> ``+`` in _EARLIER_PLUGIN_NAME."""
    from dgrpo.training.resume_check import same_reward

    assert not same_reward([saved], ["r = my_rewards.py:reward * 1"])
    assert same_reward([saved], [saved])


def test_recorded_changes_leaves_out_what_it_is_not_given_or_the_state_does_not_record():
    """A reward of None (not compared) reports no reward change; a state recorded before dgrpo recorded its reward
    (no ``reward``) is not compared with the reward given. Kills dropping either ``is not None`` of the reward's
    comparison in recorded_changes."""
    from dgrpo.training.resume_check import SAME_REWARD, recorded_changes

    assert recorded_changes({"train_data": "d", "reward": ["r = m.f * 1"]}, "d", None) == []
    assert recorded_changes({"train_data": "d"}, "d", ["r = m.f * 1"]) == []
    assert recorded_changes({"train_data": "d", "reward": ["r = m.f * 1"]}, "d", ["r = m.g * 1"]) == [
        ("trained with the reward r = m.f * 1, now r = m.g * 1", SAME_REWARD)
    ]


def test_the_command_lines_early_check_reads_an_earlier_plugin_name_as_its_file(tmp_path):
    """``dgrpo grpo``'s check before the model loads (check_resume_data) resumes a checkpoint whose reward an earlier
    dgrpo recorded under a plug-in module's name, as the trainer's own check does; another file's reward is still
    refused. Kills ``not same_reward(r, reward)`` -> ``r != reward`` in check_resume_data."""
    from dgrpo.cli.train import read_setting
    from dgrpo.config import ConfigError
    from dgrpo.data import training_split
    from dgrpo.data.records import fingerprint
    from dgrpo.training.resume_check import check_resume_data

    from conftest import tiny_config

    cfg = tiny_config()
    train = read_setting("data.train", training_split(cfg.data.train), cfg)
    out = tmp_path / "run"
    ckpt = out / "checkpoints" / "step-00000004"
    ckpt.mkdir(parents=True)
    earlier = ["r = dgrpo_plugin_my_rewards_0123456789ab.reward * 1"]
    (ckpt / "state.json").write_text(json.dumps({"trainer": {"train_data": fingerprint(train), "reward": earlier}}))
    check_resume_data(out, cfg, "grpo", train, ["r = my_rewards.py:reward * 1"])
    with pytest.raises(ConfigError, match="was trained with the reward"):
        check_resume_data(out, cfg, "grpo", train, ["r = other_rewards.py:reward * 1"])


def _said_limit(message: str) -> int:
    return int(message.rsplit("data.max_question_tokens=", 1)[1].split()[0])


def test_the_named_max_question_tokens_is_the_largest_that_fits(tokenizer):
    """A question past the context is refused naming data.max_question_tokens=N that fits every question: N is the
    largest such (N + 1 is refused), not one less. Kills ``+ 2`` -> ``+ 3`` in check_rollouts_fit's count of the
    tokens around the question."""
    from dgrpo.config import ConfigError
    from dgrpo.data.records import Record
    from dgrpo.training.grpo import check_rollouts_fit

    from conftest import make_lm, tiny_config

    lm = make_lm(tokenizer)  # (a context of 512 positions; one token a character)
    recs = [Record("1 + " * 200 + "1 ?", [], "1"), Record("2 + 2 ?", [], "4")]
    with pytest.raises(ConfigError) as e:
        check_rollouts_fit(lm, 2, tiny_config(**{"data.max_question_tokens": 700}), recs)
    said = _said_limit(str(e.value))
    check_rollouts_fit(lm, 2, tiny_config(**{"data.max_question_tokens": said}), recs)
    with pytest.raises(ConfigError, match=r"record 0 \(counting from 0\)"):
        check_rollouts_fit(lm, 2, tiny_config(**{"data.max_question_tokens": said + 1}), recs)


def test_the_widest_of_two_questions_is_named_when_it_is_the_second(tokenizer):
    """Two distinct questions, the second alone past the context: record 1 is named. Kills ``while hi - lo > 1`` ->
    ``> 2`` in _widest_prompt (it stopped at the pair and named its first)."""
    from dgrpo.config import ConfigError
    from dgrpo.data.records import Record
    from dgrpo.training.grpo import check_rollouts_fit

    from conftest import make_lm, tiny_config

    lm = make_lm(tokenizer)
    recs = [Record("2 + 2 ?", [], "4"), Record("1 + " * 200 + "1 ?", [], "1")]
    with pytest.raises(ConfigError, match=r": record 1 \(counting from 0\), its longest question"):
        check_rollouts_fit(lm, 2, tiny_config(**{"data.max_question_tokens": 0}), recs)


def test_the_first_of_equally_wide_questions_in_two_batches_is_named_and_batches_are_bounded(tokenizer, monkeypatch):
    """Equally wide questions in the first and the second batch of 1024: the first is named; and no encoding holds
    more than 1024 questions (a large training set is not encoded at once). Kills taking the last widest batch, and
    QUESTIONS_AT_ONCE -> unbounded."""
    from dgrpo.config import ConfigError
    from dgrpo.data.records import Record
    from dgrpo.model.latent_lm import LatentLM
    from dgrpo.training.grpo import check_rollouts_fit
    from dgrpo.training.run_inputs import QUESTIONS_AT_ONCE

    from conftest import make_lm, tiny_config

    sizes: list[int] = []
    encode = LatentLM.encode_questions
    monkeypatch.setattr(
        LatentLM, "encode_questions", lambda self, qs, **kw: sizes.append(len(qs)) or encode(self, qs, **kw)
    )
    lm = make_lm(tokenizer)
    recs = [Record(f"{i} + {i % 7} ?", [], "1") for i in range(1100)]
    recs[5] = Record("1 + " * 200 + "1 ?", [], "1")
    recs[1050] = Record("2 + " * 200 + "2 ?", [], "1")
    with pytest.raises(ConfigError, match=r": record 5 \(counting from 0\), its longest question"):
        check_rollouts_fit(lm, 2, tiny_config(**{"data.max_question_tokens": 0}), recs)
    assert QUESTIONS_AT_ONCE == 1024 and max(sizes) <= QUESTIONS_AT_ONCE, sizes


def _chat_lm(tokenizer):
    from conftest import make_lm

    lm = make_lm(tokenizer)
    lm.tokenizer.chat_template = "<s>{% for m in messages %}USER: {{ m['content'] }}\n{% endfor %}ASSISTANT:"
    lm.settings.chat_template = True
    return lm


def test_under_a_chat_template_the_question_limit_counts_the_templates_tokens(tokenizer):
    """Under a chat template its own tokens are not in data.max_question_tokens: a limit that would fit a bare
    question is still checked against the templated prompt (refused here), and no number is offered for
    data.max_question_tokens (the template's tokens are not counted in it). Kills dropping ``not
    lm.settings.chat_template`` from check_rollouts_fit's shortcut, and ``room = 0 if chat_template`` -> ``limit -
    fits``."""
    from dgrpo.config import ConfigError
    from dgrpo.data.records import Record
    from dgrpo.training.grpo import check_rollouts_fit

    from conftest import make_lm, tiny_config

    bare = make_lm(tokenizer)
    recs = [Record("1 + " * 200 + "1 ?", [], "1")]
    with pytest.raises(ConfigError) as e:
        check_rollouts_fit(bare, 2, tiny_config(**{"data.max_question_tokens": 0}), recs)
    most = int(str(e.value).split("set it to at most ", 1)[1].split()[0])
    cfg = tiny_config(**{"data.max_question_tokens": most})
    check_rollouts_fit(bare, 2, cfg, recs)  # (the largest limit that fits a bare question)
    lm = _chat_lm(tokenizer)
    with pytest.raises(ConfigError, match=r"record 0 \(counting from 0\)") as e:
        check_rollouts_fit(lm, 2, cfg, recs)
    assert "fits every question" not in str(e.value), str(e.value)
    with pytest.raises(ConfigError) as e:
        check_rollouts_fit(lm, 2, tiny_config(**{"data.max_question_tokens": 0}), recs)
    assert str(e.value).endswith(
        "; data.max_question_tokens is 0 (no limit): set it (the rollouts then see each question's last tokens), or "
        "remove the record"
    ), str(e.value)


def _scaled(completions: list[str], records: list, scale: float = 1.0) -> list[float]:
    return [scale] * len(completions)


class _Plain:  # (no repr of its own)
    def __call__(self, completions: list[str], records: list) -> list[float]:
        return [1.0] * len(completions)


def _only_before_slash(completions: list[str], records: list, /) -> list[float]:
    return [1.0] * len(completions)


def test_a_rewards_identity_names_positional_bindings_nested_partials_and_builtins():
    """A partial's positional bindings are part of its identity (``partial(f, 2.0)`` is not ``partial(f, 3.0)``); a
    bound partial or builtin is named as a function (not its repr); a repr of exactly 200 characters is written out;
    a callable object without a repr of its own is named by its class alone. Kills dropping ``fn.args``, dropping the
    builtin or the partial case of _bound_value, ``> _BOUND_REPR_CHARS`` -> ``>=``, and dropping the ``__repr__ is
    not object.__repr__`` condition of function_name."""
    import functools
    import math

    from dgrpo.eval.scoring import RewardPart

    def ident(fn) -> str:
        return RewardPart("r", fn).identity()

    assert ident(functools.partial(_scaled, [], [], 2.0)) != ident(functools.partial(_scaled, [], [], 3.0))
    inner = functools.partial(_scaled, scale=2.0)
    assert (
        ident(functools.partial(_scaled, inner))
        == f"r = partial({__name__}._scaled, partial({__name__}._scaled, scale=2.0)) * 1"
    )
    assert ident(functools.partial(_scaled, math.sqrt)) == f"r = partial({__name__}._scaled, math.sqrt) * 1"
    text = "x" * 198  # (its repr: 200 characters, quotes included)
    assert ident(functools.partial(_scaled, text)) == f"r = partial({__name__}._scaled, {text!r}) * 1"
    assert ident(_Plain()) == f"r = {__name__}._Plain * 1"


def _one_before_slash(completions: list[str], /) -> list[float]:
    return [1.0] * len(completions)


def test_positional_only_parameters_without_kwargs_are_not_said_to_be_called_by_keyword():
    """``fn(completions, records, /)`` takes dgrpo's two arguments positionally, as dgrpo calls it: called; and
    ``fn(completions, /)``, which takes no **kwargs, is not refused as a function 'taking **kwargs' called by keyword
    (its own error, one argument too many, is said). Kills ``if not only or not any(VAR_KEYWORD)`` -> ``if not
    only`` in _refuse_keywordless."""
    from dgrpo.data.records import Record
    from dgrpo.eval.scoring import RewardError, call_checked

    records = [Record("q", [], "1")]
    assert call_checked(_only_before_slash, "r", ["#### 1"], records) == [1.0]
    with pytest.raises(RewardError) as caught:
        call_checked(_one_before_slash, "r", ["#### 1"], records)
    assert "**kwargs" not in str(caught.value) and "takes 1 positional argument but 2" in str(caught.value)


def test_a_missing_file_after_a_built_in_part_is_named_alone(tmp_path):
    """A spec whose unknown part comes after a known one (a built-in dataset) names that file alone: the parts before
    the built-in one are not joined to it. Kills dropping ``run = []`` in check_files_exist."""
    from dgrpo.data import check_files_exist
    from dgrpo.data.records import DataError

    missing = tmp_path / "dta.jsonl"
    spec = f"my+builtin+{missing}"
    with pytest.raises(DataError, match="^" + re.escape(f"{spec}: its part {missing} names no file")):
        check_files_exist(spec, ["my", "builtin", str(missing)])


def test_files_beside_a_missing_one_offered_as_meant_are_close_names_and_files(tmp_path):
    """Only data files of a close name (difflib ratio 0.8) are offered as 'did you mean'; a less close one is among
    the folder's files; a folder named like a data file is never offered. Kills cutoff 0.8 -> 0.6 and dropping
    ``p.is_file()`` in _files_like."""
    from dgrpo.data.loaders import files_like as _files_like

    (tmp_path / "trains.jsonl").mkdir()
    (tmp_path / "tyzaq.jsonl").write_text("")
    said = _files_like(tmp_path / "train.jsonl")
    assert "did you mean" not in said and said == f"; its folder holds {tmp_path / 'tyzaq.jsonl'}", said


def test_only_an_object_over_several_lines_is_said_to_be_one(tmp_path):
    """The 'one JSON object written over several lines' line is for an object spread over lines: a list over several
    lines in a .jsonl file, or an object on one line followed by junk, is refused as before. Kills dropping either
    condition of _spread_object's ``not isinstance(value, dict) or "\\n" not in rest[:end]``."""
    from dgrpo.data.loaders import _spread_object
    from dgrpo.data.records import DataError

    assert _spread_object(tmp_path / "a.jsonl", "[1,\n 2]\n[3,\n 4]\n", 1) is None
    assert _spread_object(tmp_path / "a.jsonl", '{"question": "q"} x\n', 1) is None
    said = _spread_object(tmp_path / "a.jsonl", '{"question": "q",\n "answer": "1"}\n', 1)
    assert isinstance(said, DataError) and "lines 1-2: one JSON object written over several lines" in str(said)


def test_a_swept_text_is_held_by_a_recorded_spec_whose_local_part_was_made_absolute():
    """A data spec joined by '+' (``gsm8k+my.jsonl``) is recorded with its local part absolute
    (``gsm8k+/abs/my.jsonl``): it holds the sweep's value; a list holds a sweep's list of the same length only.
    Kills ``any(os.path.isabs(part) for part in recorded.split("+"))`` -> ``os.path.isabs(recorded)`` and dropping
    ``len(recorded) == len(swept)`` in tracking._holds."""
    from dgrpo.training.tracking import _holds

    assert _holds("gsm8k+/abs/my.jsonl", "gsm8k+my.jsonl")
    assert not _holds("gsm8k+other", "gsm8k+my.jsonl")
    assert not _holds(["a", "b"], ["a"]) and _holds(["a", "b"], ["a", "b"])


def test_the_sweep_check_before_the_load_does_not_warn_of_unknown_parameters(tmp_path, monkeypatch):
    """``check_sweep_parameters(config, warn=False)`` (dgrpo sft/grpo's check before the model loads) refuses alone:
    a parameter naming no dgrpo option is warned of by the tracker's own check, not twice. Kills ``if unknown and
    warn`` -> ``if unknown``."""
    import warnings

    from dgrpo.config import to_dict
    from dgrpo.training.tracking import check_sweep_parameters

    from conftest import tiny_config

    path = tmp_path / "params.yaml"
    path.write_text(json.dumps({"my_note": {"value": "x"}}))
    monkeypatch.setenv("WANDB_SWEEP_ID", "abc123")
    monkeypatch.setenv("WANDB_SWEEP_PARAM_PATH", str(path))
    config = to_dict(tiny_config())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_sweep_parameters(config, warn=False)
    with pytest.warns(UserWarning, match=r"W&B sweep parameter\(s\) my_note name no dgrpo option"):
        check_sweep_parameters(config)
