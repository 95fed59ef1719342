"""Tests that kill mutants of SFT's start check of every training example against the context
(``sft.check_examples_fit`` / ``_longest_example``) and of the start checks' cache (``run_inputs.widest_prompt``,
``checked_once``) which the earlier tests let survive. The model: the tests' tiny one, a context of 512 positions, no
BOS before a question; tiny.yaml's curriculum (coconut, c_thought 1, max_latent_stage 1, 4 epochs of 2 a stage: the
latent layouts 0 and 1, at most 1 thought). Each test's docstring names the behaviour and the mutants it kills.

Equivalent mutants (no behaviour tells them apart), left alive:

- trained_layouts' ``max_latent_stage + 2`` -> ``+ 1`` under ``sft.uniform_prob``: the layout left out
  (``max_latent_stage + 1``, every step dropped) has at most the thoughts of layout ``max_latent_stage``
  (``max_latent_stage * c_thought``) and a target that is that layout's text or its tail (its steps dropped too),
  and ``range`` keeps layout ``max_latent_stage`` in; ``most`` reads ``latent_layout(stage, 10**6)``, the same
  thoughts at both. So no example of it is longer (a tail of a text is no more tokens), and a tie keeps the earlier
  stage.
- trained_layouts without its mode test (``s.mode in ("coconut", "pause", "no_curriculum")``): under cot and no_cot
  every stage has the same layout (``latent_layout``: (0, 0), or (n_steps, 0)) and stage 0 is trained, so the extra
  stages add no longer example and a tie keeps stage 0.
- ``_find_longest_example``'s ``longest = (-1, ...)`` -> ``(0, ...)``: every example has a target of at least one token
  (``data.max_target_tokens`` >= 1 is validated), so the first example replaces it either way.
- dropping ``found[key][0] is train`` (``run_inputs.found_once``, both caches'): the key holds ``id(train)``, and
  the cache holds ``train`` itself while the block lives, so no other list can take its id there.

trained_layouts without ``layout_stage(...)`` (each stage its own layout) is killed by
``test_the_refusal_names_a_stage_the_run_trains``: the refusal names the first stage trained at the layout.
"""

from __future__ import annotations

import pytest


def _setup(tokenizer):
    from conftest import make_lm

    return make_lm(tokenizer)  # (a context of 512 positions)


def _cfg(**over):
    from conftest import tiny_config

    return tiny_config(**{"data.max_question_tokens": 0, **over})


def _width(lm, question: str, max_q: int = 0) -> int:
    """The prompt's width as the check sees it (BOS, the question and its newline, ``<|start-latent|>``)."""
    return int(lm.encode_questions([question], max_tokens=max_q)[0].shape[1])


def _n_tokens(lm, text: str) -> int:
    return len(lm.token_ids([text])[0])


QUESTION = "1 + 1 ?"
LONG_QUESTION = "1 + " * 200 + "1 ?"  # (800 tokens)


def _long_answer(k: int):
    """A record without steps whose target (``#### 777...``) is ``k + 2`` tokens (one a digit)."""
    from dgrpo.data.records import Record

    return Record(QUESTION, [], "7" * k)


def _no_targets_tokenized(monkeypatch):
    """LatentLM.token_ids fails on a target (a text starting ``####``): the check must not tokenize the targets."""
    from dgrpo.model.latent_lm import LatentLM

    token_ids = LatentLM.token_ids

    def guarded(self, texts):
        assert not any(t.startswith("####") for t in texts), "the targets were tokenized"
        return token_ids(self, texts)

    monkeypatch.setattr(LatentLM, "token_ids", guarded)


def test_the_shortcut_counts_the_most_thoughts_and_the_end_marker(tokenizer):
    """A long answer cut to data.max_target_tokens at every stage: the widest question, stage 1's one thought, the
    end marker and the cut target one past the context are refused (naming stage 1); one token less fits. Kills
    ``most = max(...)`` -> ``min(...)``, dropping the end marker's ``+ 1`` in ``most``, and ``width + most <=
    limit`` -> ``<= limit + 1``."""
    from dgrpo.config import ConfigError
    from dgrpo.training.sft import check_examples_fit

    lm = _setup(tokenizer)
    recs = [_long_answer(600)]
    w = _width(lm, QUESTION)
    max_t = 512 + 1 - w - 1 - 1  # (width + 1 thought + end marker + max_t = 513)
    assert _n_tokens(lm, "#### " + recs[0].answer) > max_t  # (cut at every stage)
    with pytest.raises(ConfigError, match=r"^the training data: record 0 \(counting from 0\) at stage 1: "):
        check_examples_fit(lm, _cfg(**{"data.max_target_tokens": max_t}), recs)
    check_examples_fit(lm, _cfg(**{"data.max_target_tokens": max_t - 1}), recs)


def test_every_cut_target_fitting_exactly_tokenizes_no_target(tokenizer, monkeypatch):
    """The widest question with the most thoughts and a target of data.max_target_tokens filling the context exactly
    fits whatever the targets: none is tokenized (a large training set's targets take a minute). Kills ``width + most
    <= limit`` -> ``<``."""
    from dgrpo.training.sft import check_examples_fit

    lm = _setup(tokenizer)
    w = _width(lm, QUESTION)
    _no_targets_tokenized(monkeypatch)
    check_examples_fit(lm, _cfg(**{"data.max_target_tokens": 512 - w - 2}), [_long_answer(600)])


def _chat(lm):
    lm.tokenizer.chat_template = "<s>{% for m in messages %}USER: {{ m['content'] }}\n{% endfor %}ASSISTANT:"
    lm.settings.chat_template = True
    return lm


def test_under_a_chat_template_a_question_limit_that_fits_bare_questions_is_still_checked(tokenizer):
    """data.max_question_tokens + BOS + ``<|start-latent|>`` + the most thoughts, the end marker and
    data.max_target_tokens fill the context: bare questions fit whatever the data, but a chat template's own tokens
    are not in the limit, and a long question under it is refused. Kills dropping ``not lm.settings.chat_template``
    from check_examples_fit's first shortcut."""
    from dgrpo.config import ConfigError
    from dgrpo.data.records import Record
    from dgrpo.training.sft import check_examples_fit

    max_t = 20
    cfg = _cfg(**{"data.max_target_tokens": max_t, "data.max_question_tokens": 512 - 2 - (1 + 1 + max_t)})
    recs = [Record(LONG_QUESTION, [], "7" * 30)]
    check_examples_fit(_setup(tokenizer), cfg, recs)
    with pytest.raises(ConfigError, match=r"record 0 \(counting from 0\) at stage 1: "):
        check_examples_fit(_chat(_setup(tokenizer)), cfg, recs)


def test_a_question_limit_that_fills_the_context_exactly_tokenizes_nothing(tokenizer, monkeypatch):
    """data.max_question_tokens + 2 + the most thoughts, the end marker and data.max_target_tokens == the context:
    it fits whatever the data, and no question or target is encoded (as the docstring says). Kills the shortcut's
    ``max_q + 2`` -> ``+ 3`` and ``<= limit`` -> ``< limit``."""
    from dgrpo.model.latent_lm import LatentLM
    from dgrpo.training.sft import check_examples_fit

    def refused(self, *a, **kw):
        raise AssertionError("a question was encoded")

    lm = _setup(tokenizer)
    lm.question_prefix = [lm.eos_id]  # (a BOS the tokenizer would put before a text of its own)
    monkeypatch.setattr(LatentLM, "encode_questions", refused)
    _no_targets_tokenized(monkeypatch)
    max_t = 20
    cfg = _cfg(**{"data.max_target_tokens": max_t, "data.max_question_tokens": 512 - 2 - (1 + 1 + max_t)})
    check_examples_fit(lm, cfg, [_long_answer(600)])


def test_the_question_limit_counts_the_bos_before_the_question(tokenizer):
    """Under a tokenizer that puts BOS before a text, a question cut to data.max_question_tokens is BOS, those
    tokens and ``<|start-latent|>``: one past the context with the rest is refused. Kills the shortcut's ``max_q +
    2`` -> ``+ 1`` (the tokenizer without BOS cannot tell them apart: its prompt is ``max_q + 1`` wide at most)."""
    from dgrpo.config import ConfigError
    from dgrpo.data.records import Record
    from dgrpo.training.sft import check_examples_fit

    lm = _setup(tokenizer)
    lm.question_prefix = [lm.eos_id]
    max_t = 20
    max_q = 512 - 1 - (1 + 1 + max_t)  # (max_q + 2 + most: 513)
    assert _width(lm, LONG_QUESTION, max_q) == max_q + 2
    cfg = _cfg(**{"data.max_target_tokens": max_t, "data.max_question_tokens": max_q})
    with pytest.raises(ConfigError, match=r"record 0 \(counting from 0\) at stage 1: "):
        check_examples_fit(lm, cfg, [Record(LONG_QUESTION, [], "7" * 30)])


def test_an_uncut_targets_eos_is_counted(tokenizer):
    """A target shorter than data.max_target_tokens ends in EOS, which the batch holds: the widest question, stage
    1's thought, the end marker, the target and its EOS one past the context are refused; a target one token shorter
    fits. Kills ``min(len(ids) + 1, max_t)`` -> ``min(len(ids), max_t)`` in _find_longest_example."""
    from dgrpo.config import ConfigError
    from dgrpo.training.sft import check_examples_fit

    lm = _setup(tokenizer)
    w = _width(lm, QUESTION)
    k = 513 - w - 1 - 1 - 1 - 2  # (the target: k + 2 tokens, then EOS)
    cfg = _cfg(**{"data.max_target_tokens": 1000})
    with pytest.raises(ConfigError, match=r"record 0 \(counting from 0\) at stage 1: "):
        check_examples_fit(lm, cfg, [_long_answer(k)])
    check_examples_fit(lm, cfg, [_long_answer(k - 1)])


def _long_steps():
    """A record whose stage-0 target (one step of 600 tokens, then ``#### 4``) is longer than the context; at stage
    1 its step is a thought and its target ``#### 4``."""
    from dgrpo.data.records import Record

    return Record(QUESTION, ["x" * 600], "4")


def test_a_long_stage_0_target_is_counted_as_cut(tokenizer):
    """A stage-0 target longer than the context is cut to data.max_target_tokens (no EOS): with the widest question
    and the end marker it fills the context and fits; one more token of data.max_target_tokens is refused at stage
    0. Kills ``min(len(ids) + 1, max_t)`` -> ``len(ids) + 1`` in _find_longest_example."""
    from dgrpo.config import ConfigError
    from dgrpo.training.sft import check_examples_fit

    lm = _setup(tokenizer)
    max_t = 512 - _width(lm, QUESTION) - 1  # (width + 0 thoughts + end marker + max_t = 512)
    check_examples_fit(lm, _cfg(**{"data.max_target_tokens": max_t}), [_long_steps()])
    with pytest.raises(ConfigError, match=r"record 0 \(counting from 0\) at stage 0: "):
        check_examples_fit(lm, _cfg(**{"data.max_target_tokens": max_t + 1}), [_long_steps()])


def _thoughts_outweigh(lm):
    """(record, over): a record whose stage-1 example (10 thoughts and ``#### 7...``) is one past the context under
    ``over`` (sft.c_thought 10), while its stage-0 target (a step of 6 tokens more) is longer and its example fits."""
    from dgrpo.data.records import Record

    k = 513 - _width(lm, QUESTION) - 10 - 1 - 3  # (stage 1: width + 10 + end marker + k + 2 + EOS = 513)
    rec = Record(QUESTION, ["xxxxx"], "7" * k)
    assert _n_tokens(lm, "xxxxx\n#### " + rec.answer) == _n_tokens(lm, "#### " + rec.answer) + 6
    return rec, {"sft.c_thought": 10, "data.max_target_tokens": 1000}


def test_the_longest_example_counts_its_thoughts(tokenizer):
    """Stage 0's target is longer than stage 1's, but stage 1's 10 thoughts make its example the longer, one past
    the context: refused, naming stage 1. Kills comparing the targets without the thoughts (``n_latent +
    widths[target] > longest[0]`` -> ``widths[target] > ...``) in _find_longest_example."""
    from dgrpo.config import ConfigError
    from dgrpo.training.sft import check_examples_fit

    lm = _setup(tokenizer)
    rec, over = _thoughts_outweigh(lm)
    with pytest.raises(ConfigError, match=r"record 0 \(counting from 0\) at stage 1: "):
        check_examples_fit(lm, _cfg(**over), [rec])


def _fits_then_refused(lm, first, second, train, change=None):
    """Within one checked_once: ``first`` (a Config) fits ``train``; then (``change()`` run) ``second`` is refused."""
    from dgrpo.config import ConfigError
    from dgrpo.training.run_inputs import checked_once
    from dgrpo.training.sft import check_examples_fit

    with checked_once():
        check_examples_fit(lm, first, train)
        if change is not None:
            change()
        with pytest.raises(ConfigError, match=r"\(counting from 0\) at stage "):
            check_examples_fit(lm, second, train)


def test_the_longest_example_found_once_is_found_again_under_another_max_target_tokens(tokenizer):
    """Within checked_once, the same data under a larger data.max_target_tokens is checked again (the long stage-0
    target no longer cut to fit). Kills _longest_example's cache key without ``max_t``."""
    lm = _setup(tokenizer)
    max_t = 512 - _width(lm, QUESTION) - 1
    _fits_then_refused(
        lm, _cfg(**{"data.max_target_tokens": max_t}), _cfg(**{"data.max_target_tokens": 1000}), [_long_steps()]
    )


def test_the_longest_example_found_once_is_found_again_for_other_stages(tokenizer):
    """Within checked_once, the same data trained at more stages (sft.num_epochs 2 -> 4: stage 1 too) is checked
    at them. Kills _longest_example's cache key without ``tuple(stages)``."""
    lm = _setup(tokenizer)
    rec, over = _thoughts_outweigh(lm)
    _fits_then_refused(lm, _cfg(**over, **{"sft.num_epochs": 2}), _cfg(**over), [rec])


def test_the_longest_example_found_once_is_found_again_under_another_c_thought(tokenizer):
    """Within checked_once, the same data under sft.c_thought 1 -> 10 is checked again. Kills _longest_example's
    cache key without ``c_thought``."""
    lm = _setup(tokenizer)
    rec, over = _thoughts_outweigh(lm)
    _fits_then_refused(lm, _cfg(**{**over, "sft.c_thought": 1}), _cfg(**over), [rec])


def test_the_longest_example_found_once_is_found_again_with_padded_thoughts(tokenizer):
    """Within checked_once, the same data under sft.pad_latent_to_max (a record without steps given the last stage's
    thoughts) is checked again. Kills _longest_example's cache key without ``pad_latent_to_max``."""
    lm = _setup(tokenizer)
    k = 513 - _width(lm, QUESTION) - 10 - 1 - 3  # (padded: width + 10 thoughts + end marker + k + 2 + EOS = 513)
    over = {"sft.mode": "no_curriculum", "sft.num_epochs": 6, "sft.c_thought": 10, "data.max_target_tokens": 1000}
    first, second = _cfg(**over), _cfg(**over, **{"sft.pad_latent_to_max": True})
    _fits_then_refused(lm, first, second, [_long_answer(k)])


def test_the_longest_example_found_once_is_found_again_for_a_list_appended_to(tokenizer):
    """Within checked_once, a training list appended to in place (the same object) is checked again: its new record
    is one past the context. Kills _longest_example's cache key without ``len(train)``."""
    lm = _setup(tokenizer)
    k = 513 - _width(lm, QUESTION) - 1 - 1 - 3
    train = [_long_answer(k - 1)]
    cfg = _cfg(**{"data.max_target_tokens": 1000})
    _fits_then_refused(lm, cfg, cfg, train, lambda: train.append(_long_answer(k)))


def test_the_widest_prompt_found_once_is_found_again_under_another_question_limit(tokenizer):
    """Within checked_once, a long question cut to data.max_question_tokens fits; with no limit (0) it is refused.
    Kills widest_prompt's cache key without ``max_tokens``."""
    from dgrpo.data.records import Record

    max_t = 20
    max_q = 512 - 1 - (1 + 1 + max_t)  # (its cut prompt, max_q + start marker, with the most: 512; the shortcut's 513)
    lm = _setup(tokenizer)
    assert _width(lm, LONG_QUESTION, max_q) == max_q + 1
    first = _cfg(**{"data.max_target_tokens": max_t, "data.max_question_tokens": max_q})
    second = _cfg(**{"data.max_target_tokens": max_t})
    _fits_then_refused(lm, first, second, [Record(LONG_QUESTION, [], "7" * 30)])


def test_the_widest_prompt_found_once_is_found_again_for_a_list_appended_to(tokenizer):
    """Within checked_once, a training list appended to in place with a question past the context is refused. Kills
    widest_prompt's cache key without ``len(train)``."""
    from dgrpo.data.records import Record

    train = [Record(QUESTION, [], "4")]
    cfg = _cfg(**{"data.max_target_tokens": 20})
    _fits_then_refused(_setup(tokenizer), cfg, cfg, train, lambda: train.append(Record(LONG_QUESTION, [], "4")))


def _filling(lm):
    """(record, cfg): a record whose bare prompt, one thought, the end marker and its answer cut to
    data.max_target_tokens fill the context exactly."""
    return _long_answer(600), _cfg(**{"data.max_target_tokens": 512 - _width(lm, QUESTION) - 2})


def test_the_widest_prompt_found_once_is_found_again_under_a_chat_template(tokenizer):
    """Within checked_once, the data that fits bare prompts exactly is refused once the model prompts through a
    chat template (its tokens widen the prompt). Kills widest_prompt's cache key without ``chat_template``."""
    lm = _setup(tokenizer)
    rec, cfg = _filling(lm)
    _fits_then_refused(lm, cfg, cfg, [rec], lambda: _chat(lm))


def test_the_widest_prompt_found_once_is_found_again_with_a_bos_before_questions(tokenizer):
    """Within checked_once, the data that fits exactly is refused once a BOS comes before each question. Kills
    widest_prompt's cache key without ``tuple(lm.question_prefix)``."""
    lm = _setup(tokenizer)
    rec, cfg = _filling(lm)
    _fits_then_refused(lm, cfg, cfg, [rec], lambda: setattr(lm, "question_prefix", [lm.eos_id]))


def test_checked_once_starts_empty_and_leaves_nothing_behind(tokenizer):
    """checked_once holds what the checks found within it only: a nested one starts empty and, once closed, gives
    back the outer one's; after the outer block found_at_start() is None again. Kills dropping
    ``_FOUND.reset(token)`` and ``_FOUND.set({})`` -> ``_FOUND.set(_FOUND.get() or {})``."""
    from dgrpo.training.run_inputs import checked_once, found_at_start
    from dgrpo.training.sft import check_examples_fit

    lm = _setup(tokenizer)
    assert found_at_start() is None
    with checked_once():
        check_examples_fit(lm, _cfg(**{"data.max_target_tokens": 1000}), [_long_answer(10)])
        outer = found_at_start()
        assert outer and {key[0] for key in outer} == {"widest", "sft longest"}, outer
        with checked_once():
            assert found_at_start() == {}
        assert found_at_start() is outer
    assert found_at_start() is None


def test_the_refusal_names_a_stage_the_run_trains(tokenizer):
    """A no_curriculum run of 8 epochs trains stage 3 alone (it writes stage-3/), at the latent layout of stage 2
    (every step dropped past max_latent_stage): the refusal said "at stage 2", a stage the run never trains; it names
    stage 3. Kills trained_layouts without ``layout_stage(...)`` too (the layouts then differ from the stages)."""
    from dgrpo.config import ConfigError
    from dgrpo.training.sft import check_examples_fit, trained_layouts

    lm = _setup(tokenizer)
    cfg = _cfg(**{"sft.mode": "no_curriculum", "sft.num_epochs": 8, "data.max_target_tokens": 600})
    assert trained_layouts(cfg) == {2: 3}
    with pytest.raises(ConfigError, match=r"record 0 \(counting from 0\) at stage 3: "):
        check_examples_fit(lm, cfg, [_long_answer(600)])
    uniform = _cfg(**{"sft.uniform_prob": 0.5, "sft.num_epochs": 8})
    assert trained_layouts(uniform) == {0: 0, 1: 1, 2: 2}  # (a record drawn at stage 2 trains layout 2 first)
