"""What ``dgrpo grpo`` checks once its data is read, before the model's weights load (minutes for a 1.5B model) and
hours before the step that would have failed: every training question against the context, the reward on gold
answers (once), and a hub id's files looked up with one probe of the hub."""

import json

import pytest
from test_hub_models import REPO, hub_cache  # noqa: F401 - (the fixture: a hub cache, offline)

from conftest import tiny_args


@pytest.fixture
def loads(monkeypatch):
    """The order of the weights' loads and the reward's gold-answer checks (``"load"``, ``"gold"``)."""
    from dgrpo.eval import scoring
    from dgrpo.model import latent_lm

    events: list[str] = []
    load, smoke = latent_lm.load_hf_model, scoring.Rewards.smoke_test

    def load_hf_model(*args, **kwargs):
        events.append("load")
        return load(*args, **kwargs)

    def smoke_test(self, *args, **kwargs):
        events.append("gold")
        return smoke(self, *args, **kwargs)

    monkeypatch.setattr(latent_lm, "load_hf_model", load_hf_model)
    monkeypatch.setattr(scoring.Rewards, "smoke_test", smoke_test)
    return events


def _training_file(tmp_path, long_at: int | None = None, n: int = 12):
    """``n`` short questions, the one at ``long_at`` longer than the tiny model's context."""
    rows = [{"question": f"{i} + 1 ?", "answer": str(i + 1)} for i in range(n)]
    if long_at is not None:
        rows[long_at] = {"question": "1 + " * 300 + "1 ?", "answer": "301"}
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def run_on(run_cli, command, init, train, out, *more):
    """``dgrpo COMMAND`` from ``init`` on the training file ``train`` alone (no validation or test set) into ``out``."""
    over = ["--set", f"data.train={train}", "data.valid=", "data.test=[]", *more]
    return run_cli(command, "--init", init, *tiny_args(), *over, "--out", out)


def _grpo(run_cli, init, train, out, *more):
    return run_on(run_cli, "grpo", init, train, out, *more)


def test_a_training_question_too_long_for_the_context_is_refused_before_the_weights_load(
    sft_checkpoint, tmp_path, run_cli, loads
):
    """With ``data.max_question_tokens=0`` (no cut) one training question past the context failed the step that
    sampled it, hours in; the whole training set is checked now, before the weights load, the line naming the
    record and the value of data.max_question_tokens that cuts it to fit."""
    train = _training_file(tmp_path, long_at=7)
    r = _grpo(run_cli, sft_checkpoint, train, tmp_path / "run", "data.max_question_tokens=0")
    assert r.returncode == 2, r.stderr[-2000:]
    assert f"data.train {train}: record 7 (counting from 0), its longest question: grpo: the sequence" in r.stderr
    assert "data.max_question_tokens is 0 (no limit): set it to at most " in r.stderr
    assert "load" not in loads and not (tmp_path / "run").exists()
    said = r.stderr.rsplit("set it to at most ", 1)[1].split()[0]  # (the value it names fits the same data)
    fit = [f"data.max_question_tokens={said}", "grpo.steps=1", "grpo.warmup_steps=0"]
    r = _grpo(run_cli, sft_checkpoint, train, tmp_path / "fit", *fit)
    assert r.returncode == 0, r.stderr[-2000:]


def test_the_training_questions_are_checked_as_the_rollouts_prompt_them(tokenizer):
    """The check finds the first record whose prompt is the widest (past the first thousand distinct questions, a
    question asked twice counted where it is first asked), counts data.max_question_tokens as the rollouts cut, and
    lets a set that fits pass: the trainer's start check, for a run from Python too."""
    from dgrpo.config import ConfigError
    from dgrpo.data.records import Record
    from dgrpo.training.grpo import check_rollouts_fit

    from conftest import make_lm, tiny_config

    lm = make_lm(tokenizer)  # (a context of 512 positions; one token a character)
    cfg = tiny_config(**{"data.max_question_tokens": 0})
    short = [Record(f"{i} + {i % 7} ?", [], "1") for i in range(1100)]
    wide = [Record(f"{d} + " * 125 + f"{d} ?", [], "1") for d in (1, 2)]  # (500 tokens and more: past the context)
    recs = [*short[:500], *short[:500], *short[500:], *wide, wide[0]]
    with pytest.raises(ConfigError, match=r": record 1600 \(counting from 0\), its longest question: grpo: the seq"):
        check_rollouts_fit(lm, 2, cfg, recs)
    check_rollouts_fit(lm, 2, cfg, short)
    check_rollouts_fit(lm, 2, tiny_config(**{"data.max_question_tokens": 64}), recs)  # (cut: they fit)


def test_the_reward_is_called_on_gold_answers_before_the_weights_load_and_once(
    sft_checkpoint, tmp_path, run_cli, loads, monkeypatch
):
    """The reward's call on gold answers (``#### <answer>``) came in the trainer, once the model had loaded: a reward
    that fails was refused minutes into a large model's start. It comes once the data is read now, before the load,
    and the trainer does not call it again; nor does it encode the training questions again (checked before the load,
    ``data.max_question_tokens=0``: each one encoded)."""
    from dgrpo.model.latent_lm import LatentLM

    rewards = tmp_path / "rewards.py"
    rewards.write_text("def broken(completions, **kw):\n    raise ValueError('no such column')\n")
    train = _training_file(tmp_path)
    r = _grpo(run_cli, sft_checkpoint, train, tmp_path / "bad", f"grpo.reward={rewards}:broken")
    assert r.returncode == 2 and "no such column" in r.stderr and "found by the check made before" in r.stderr
    assert loads == ["gold"], r.stderr[-2000:]

    encoded: list[int] = []  # (how many questions each encoding of 12, the training set's, held)
    encode = LatentLM.encode_questions
    monkeypatch.setattr(
        LatentLM, "encode_questions", lambda self, qs, **kw: encoded.append(len(qs)) or encode(self, qs, **kw)
    )
    loads.clear()
    more = ["data.max_question_tokens=0", "grpo.steps=1", "grpo.warmup_steps=0"]
    r = _grpo(run_cli, sft_checkpoint, train, tmp_path / "run", *more)
    assert r.returncode == 0, r.stderr[-2000:]
    assert loads == ["gold", "load"] and encoded.count(12) == 1, (loads, encoded)


@pytest.mark.usefixtures("hub_cache")
@pytest.mark.parametrize("command", ["sft", "grpo"])
def test_a_training_command_on_a_cached_hub_model_probes_the_hub_once(command, tmp_path, run_cli, monkeypatch):
    """Without HF_HUB_OFFLINE, dgrpo sft / grpo probed the hub for the model's files before its weights load (the
    checks of the context) and again for the load: on a network that drops packets, the probe's timeout (3 s) twice.
    One probe now; its answer (unreachable: the cache) holds for both."""
    from dgrpo import hub
    from dgrpo.training import grpo, sft

    monkeypatch.delenv("HF_HUB_OFFLINE")
    probes: list[tuple[str, int]] = []
    monkeypatch.setattr(hub, "_connects", lambda host, port, timeout: probes.append((host, port)) and False)
    trained: list[str] = []  # (the trainer is not under test: what reaches it is the model the start loaded)
    monkeypatch.setattr(sft, "train_sft", lambda lm, *a, **k: trained.append(lm.name_or_path))
    monkeypatch.setattr(grpo, "train_grpo", lambda lm, *a, **k: trained.append(lm.name_or_path))
    r = run_cli(command, "--init", REPO, *tiny_args(**{"data.test": "[]"}), "--out", tmp_path / "run")
    assert r.returncode == 0, r.stderr[-2000:]
    assert trained == [REPO] and len(probes) == 1, (trained, probes)
