"""What ``dgrpo sft`` / ``dgrpo grpo`` decide from a model's tokenizer, latent settings and config.json is refused
before its weights load (minutes for a 1.5B model): a test set that does not fit the context, which came once the
model had loaded (:func:`~dgrpo.cli.common.model_without_weights`)."""

import json

import pytest

from conftest import make_lm, tiny_args


@pytest.fixture
def no_weights_load(monkeypatch):
    """Loading any model's weights fails the test: what is refused must be refused before."""
    from dgrpo.model import latent_lm

    def load_hf_model(path, *args, **kwargs):
        raise AssertionError(f"the weights of {path} were loaded")

    monkeypatch.setattr(latent_lm, "load_hf_model", load_hf_model)


def _long_test_set(tmp_path):
    long = tmp_path / "long.jsonl"
    long.write_text(json.dumps({"question": "1 + " * 300 + "1 ?", "answer": "301"}) + "\n")
    return long


@pytest.mark.parametrize("command", ["sft", "grpo"])
def test_a_test_set_too_long_for_the_context_is_refused_before_the_weights_load(
    command, sft_checkpoint, tmp_path, run_cli, no_weights_load
):
    """An --init checkpoint's test set too long for its context: refused from its tokenizer and config.json, the
    weights never read, in the words the check after the load said."""
    long = _long_test_set(tmp_path)
    key = "sft.c_thought" if command == "sft" else "grpo.n_latent"
    over = ["--set", f"data.test=[{long}]", "--set", "data.max_question_tokens=0"]
    r = run_cli(command, "--init", sft_checkpoint, *tiny_args(), *over, "--out", tmp_path / "run")
    assert r.returncode == 2 and f"data.test {long}, answered after training: " in r.stderr, r.stderr[-2000:]
    assert f"lower {key}, eval.max_new_tokens or data.max_question_tokens" in r.stderr
    r = run_cli(command, "--init", sft_checkpoint, *tiny_args(), "--set", "eval.n_latent=600", "--out", tmp_path / "b")
    assert r.returncode == 2 and "answered after training: eval: the sequence" in r.stderr, r.stderr[-2000:]


def test_a_gpt2_checkpoints_context_is_its_n_positions(tokenizer, tmp_path, run_cli, no_weights_load):
    """GPT-2's config.json gives its context as ``n_positions``: a base model's too, before its weights load, with
    the latent markers its tokenizer is given (the 2 markers counted)."""
    lm = make_lm(tokenizer, "gpt2", max_positions=64)
    lm.save_pretrained(tmp_path / "gpt2")
    assert json.loads((tmp_path / "gpt2" / "config.json").read_text())["n_positions"] == 64
    over = ["--set", "data.test=[builtin:test]", "--set", "eval.max_new_tokens=60"]
    r = run_cli("sft", "--init", tmp_path / "gpt2", *tiny_args(), *over, "--out", tmp_path / "run")
    assert r.returncode == 2 and "the sequence does not fit the model's context of 64 positions" in r.stderr
    assert "2 markers" in r.stderr and not (tmp_path / "run").exists(), r.stderr[-2000:]


@pytest.mark.parametrize("arch", ["qwen2", "gpt2"])
def test_the_model_without_weights_counts_as_the_loaded_one(arch, lora_base_dirs, tokenizer, tmp_path):
    """The same context and the same question widths (its BOS, the markers, a checkpoint's latent settings) as the
    model once loaded: one rule, decided before the load as it was after; a LoRA adapter's context is its base's."""
    from dgrpo.cli.common import model_without_weights
    from dgrpo.config import Config
    from dgrpo.model.factory import load_model

    cfg = Config()
    names = [str(lora_base_dirs / arch)]
    if arch == "qwen2":  # (a LoRA adapter directory over it)
        cfg.model.lora.r = 2
        lm = load_model(cfg.model, cfg.task, init=names[0])
        lm.save_pretrained(tmp_path / "adapter")
        names.append(str(tmp_path / "adapter"))
    questions = ["1 + 2 ?", "a longer question, of more words than the first one ?"]
    for name in names:
        unloaded = model_without_weights(name, cfg)
        loaded = load_model(cfg.model, cfg.task, init=name, training=False)
        assert unloaded is not None and unloaded.context_length == loaded.context_length
        assert unloaded.settings == loaded.settings
        for markers in (True, False):
            ids, _ = unloaded.encode_questions(questions, markers=markers)
            assert ids.device.type == "meta"
            assert ids.shape == loaded.encode_questions(questions, markers=markers)[0].shape


def test_the_built_in_model_is_checked_once_built(tmp_path, run_cli):
    """The built-in model, built in seconds, has no files to read: its test sets are checked once it is built."""
    from dgrpo.cli.common import model_without_weights
    from dgrpo.config import Config
    from dgrpo.model.sources import BUILTIN

    assert model_without_weights(BUILTIN, Config()) is None
    r = run_cli("sft", *tiny_args(), "--set", "eval.n_latent=600", "--out", tmp_path / "run")
    assert r.returncode == 2 and "data.test builtin:test, answered after training: eval: the sequence" in r.stderr


@pytest.mark.parametrize("command", ["sft", "grpo"])
def test_a_validation_set_too_long_for_the_context_is_refused_before_the_weights_load(
    command, sft_checkpoint, tmp_path, run_cli, no_weights_load
):
    """The validation set (SFT's each stage, GRPO's from step 0) too long for the context: refused before the weights
    load, where the trainer refused it once they had (GRPO's, at its first validation, in a run directory made)."""
    long = _long_test_set(tmp_path)
    key = "sft.c_thought" if command == "sft" else "grpo.n_latent"
    over = ["--set", f"data.valid={long}", "--set", "data.max_question_tokens=0", "--set", "data.test=[]"]
    r = run_cli(command, "--init", sft_checkpoint, *tiny_args(), *over, "--out", tmp_path / "run")
    assert r.returncode == 2 and "the sequence does not fit the model's context" in r.stderr, r.stderr[-2000:]
    assert f"lower {key}, eval.max_new_tokens or data.max_question_tokens" in r.stderr
    assert command == "sft" or f"data.valid {long}, validated from step 0: " in r.stderr


def test_grpo_answers_too_long_for_the_context_are_refused_before_the_weights_load(
    sft_checkpoint, tmp_path, run_cli, no_weights_load
):
    """grpo.max_new_tokens past the context (GRPOTrainer's start check): refused before the weights load."""
    r = run_cli("grpo", "--init", sft_checkpoint, *tiny_args(), "--set", "grpo.max_new_tokens=600", "--out", tmp_path)
    assert r.returncode == 2 and "grpo: the sequence does not fit the model's context" in r.stderr, r.stderr[-2000:]
    assert "grpo.max_new_tokens = 600" in r.stderr


def test_dgrpo_eval_refuses_a_set_too_long_before_the_weights_load(sft_checkpoint, tmp_path, run_cli, no_weights_load):
    """dgrpo eval's sets are checked against the context before the weights load, each named (the second of two
    was refused once the model had loaded and the first was answered); a plain k-shot prompt as it is answered."""
    long = _long_test_set(tmp_path)
    args = ["eval", "--model", sft_checkpoint, "--data", "builtin:test", "--data", long, "--out", tmp_path / "e"]
    r = run_cli(*args, "--set", "data.max_question_tokens=0")
    assert r.returncode == 2 and f"{long}: eval: the sequence does not fit the model's context" in r.stderr
    assert "lower eval.n_latent, eval.max_new_tokens or data.max_question_tokens" in r.stderr, r.stderr[-2000:]
    shots = ["--plain", "--shots", "40"]
    r = run_cli("eval", "--model", sft_checkpoint, "--data", "builtin:test", *shots, "--out", tmp_path / "p")
    assert r.returncode == 2 and "builtin:test: eval: the sequence does not fit" in r.stderr, r.stderr[-2000:]
    assert "prompt (" in r.stderr and "lower eval.max_new_tokens or eval.shots" in r.stderr


def test_dgrpo_eval_of_sets_that_fit_answers_them(sft_checkpoint, tmp_path, run_cli):
    """Sets that fit are answered, after the check that found them fitting."""
    r = run_cli("eval", "--model", sft_checkpoint, "--data", "builtin:test", "--limit", "4", "--out", tmp_path / "e")
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads((tmp_path / "e" / "results.json").read_text())["n"] == 4


def test_what_the_load_warns_of_is_said_once(tokenizer, tmp_path):
    """A tokenizer with tokens past the model's rows is warned about by the load: not a second time by the model
    built before it without weights."""
    import copy
    import warnings

    from dgrpo.cli.common import model_without_weights
    from dgrpo.config import Config
    from dgrpo.model.factory import load_model

    lm = make_lm(tokenizer, "qwen2")
    lm.save_pretrained(tmp_path / "m")
    for name in ("manifest.json", "latent_config.json"):  # (a plain model of a user's)
        (tmp_path / "m" / name).unlink()
    tok = copy.deepcopy(lm.tokenizer)
    tok.add_tokens(["zzz_new_token"])
    tok.save_pretrained(tmp_path / "m")
    cfg = Config()
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        assert model_without_weights(str(tmp_path / "m"), cfg) is not None
        assert not said
        load_model(cfg.model, cfg.task, init=str(tmp_path / "m"), training=False)
    assert ["beyond the model's" in str(w.message) for w in said] == [True]
