"""Hand-worked cases that pin how the latent model (dgrpo.model.latent_lm) routes its forward calls: which calls a
recomputation replays, where the compiled layer step and the once-kept keys and values apply. Each was found by a
mutation test (a small change of one branch that every test passed)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch

from dgrpo.config import ConfigError
from dgrpo.model import latent_lm

from conftest import make_lm


class _Phases:
    """A phase hook that records the phase of every forward call, a recomputation's in backward too."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def before_forward(self, phase: str) -> None:
        self.seen.append(phase)


class _FakeCompiled:
    """Stands in for the compiled layer step: records each time it is installed (the layers stay eager)."""

    def __init__(self) -> None:
        self.entered = 0

    def is_installed(self, model: Any) -> bool:
        return False

    @contextmanager
    def installed(self, model: Any) -> Iterator[None]:
        self.entered += 1
        yield


def _prompt(lm, records, n=2):
    ids, mask = lm.encode_questions([r.question for r in records[:n]])
    tg = torch.tensor([[5, 6, lm.eos_id], [7, 8, 9]][:n])
    return ids, mask, tg, torch.ones_like(tg)


def test_recompute_replays_the_latent_steps_only_when_told(tokenizer, task_records):
    """With ``recompute="call"`` the backward reruns each recomputed call (its phase announced again): every call,
    the T = 2 latent steps included, with ``recompute_latent_steps``; without it the latent steps keep their
    activations and run once."""
    replayed = {}
    for latent_too in (True, False):
        lm = make_lm(tokenizer, "qwen2").eval()
        lm.recompute, lm.recompute_latent_steps = "call", latent_too
        ids, mask, tg, tm = _prompt(lm, task_records)
        hook = _Phases()
        logp, _ = lm.target_logprobs(ids, mask, 2, tg, tm, perturbation=hook)
        assert hook.seen == ["prompt", "latent", "latent", "answer", "answer"]
        logp.sum().backward()
        replayed[latent_too] = hook.seen[5:]
    assert sorted(replayed[True]) == ["answer", "answer", "latent", "latent", "prompt"]
    assert sorted(replayed[False]) == ["answer", "answer", "prompt"]


def test_generation_under_recompute_is_not_recomputed(tokenizer, task_records):
    """Recomputation applies under grad only: ``generate`` (no grad) of a model set to recompute runs plainly, over
    a static cache too (a recomputed call needs the growing cache) and gives the answers of a model without it."""
    lm = make_lm(tokenizer, "qwen2").eval()
    ids, mask, _, _ = _prompt(lm, task_records)
    plain = lm.generate(ids, mask, 2, max_new_tokens=4, static_cache=True)
    lm.recompute = "call"
    again = lm.generate(ids, mask, 2, max_new_tokens=4, static_cache=True)
    assert torch.equal(again.tokens, plain.tokens)


def test_the_compiled_layers_serve_scoring_not_generation(tokenizer, task_records):
    """``compiled_layers`` is installed for teacher-forced scoring's calls (one per forward: question, 2 thoughts,
    marker, targets) and never while ``generate`` decodes (on CPU it slows generation)."""
    lm = make_lm(tokenizer, "qwen2").eval()
    fake = _FakeCompiled()
    lm.compiled_layers = fake
    ids, mask, tg, tm = _prompt(lm, task_records)
    with torch.no_grad():
        lm.generate(ids, mask, 2, max_new_tokens=3)
        assert fake.entered == 0
        lm.target_logprobs(ids, mask, 2, tg, tm)
    assert fake.entered == 5


def test_the_latent_steps_keep_their_keys_once_except_under_the_compiled_scoring_step(
    tokenizer, task_records, monkeypatch
):
    """``save_kv_once``: the latent steps run within ``saved_as_prefixes`` (generation, and scoring with eager
    layers), but not when the compiled layer step scores them, nor with the option off."""
    opened: list[int] = []

    @contextmanager
    def recorded(cache: Any) -> Iterator[None]:
        opened.append(1)
        yield

    monkeypatch.setattr(latent_lm, "saved_as_prefixes", recorded)
    lm = make_lm(tokenizer, "qwen2").eval()
    ids, mask, tg, tm = _prompt(lm, task_records)
    with torch.no_grad():
        lm.target_logprobs(ids, mask, 2, tg, tm)
        assert len(opened) == 1
        lm.compiled_layers = _FakeCompiled()
        lm.target_logprobs(ids, mask, 2, tg, tm)
        assert len(opened) == 1
        lm.generate(ids, mask, 2, max_new_tokens=2)  # (the compiled step serves scoring only)
        assert len(opened) == 2
        lm.compiled_layers, lm.save_kv_once = None, False
        lm.target_logprobs(ids, mask, 2, tg, tm)
        assert len(opened) == 2


def test_weights_read_from_a_saved_directory_replace_the_models_own(tokenizer, tmp_path):
    """``read_weights_dir`` then ``load_weights`` (what a resume does) puts the saved model's weights in place of
    another model's of the same shape; ``from_pretrained(device=...)`` moves the loaded model there."""
    saved, other = make_lm(tokenizer, "gpt2", seed=0), make_lm(tokenizer, "gpt2", seed=1)
    saved.save_pretrained(tmp_path / "m")
    name, p = next(iter(saved.model.state_dict().items()))
    assert not torch.equal(other.model.state_dict()[name], p)
    other.load_weights(other.read_weights_dir(tmp_path / "m"))
    for name, p in saved.model.state_dict().items():
        assert torch.equal(other.model.state_dict()[name], p), name
    assert latent_lm.LatentLM.from_pretrained(tmp_path / "m", device="meta").device.type == "meta"


def test_a_long_question_keeps_its_last_tokens(tokenizer):
    """``encode_questions(max_tokens=n)``: a longer question keeps its last n tokens (the part that asks), between the
    tokenizer's own prefix and ``<|start-latent|>``."""
    lm = make_lm(tokenizer, "qwen2")
    q = "one two three four five six seven eight nine ten"
    full = lm.token_ids([lm.format_question(q)])[0]
    ids, mask = lm.encode_questions([q], max_tokens=4)
    kept = ids[0][mask[0] == 1].tolist()
    assert kept == lm.question_prefix + full[-4:] + [lm.start_id]


def test_a_sequence_fits_up_to_the_context_length_exactly(tokenizer):
    """``check_fits``: question + thoughts + the end marker (with ``markers``) + answer may fill the context, one
    position more is a ConfigError."""
    lm = make_lm(tokenizer, "qwen2")
    limit = lm.context_length
    assert limit is not None
    lm.check_fits(limit - 7, 3, 3)  # 3 thoughts, <|end-latent|>, 3 answer tokens: the context exactly
    lm.check_fits(limit - 6, 3, 3, markers=False)
    with pytest.raises(ConfigError, match=f"= {limit + 1}; lower"):
        lm.check_fits(limit - 6, 3, 3)
