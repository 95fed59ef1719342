"""Loading a model, its edges: the line a command says before the weights load (on rank 0 alone, rank 0 decided
alike by dgrpo eval, sft and grpo), the advice about a checkpoint's missing tokenizer files, and the checks that
refuse a model before its weights load (minutes for a large one), not after."""

import re

import pytest

from conftest import make_lm


def test_a_stray_rank_variable_in_one_process_silences_no_line_of_eval(tokenizer, tmp_path, run_cli, monkeypatch):
    """A ``RANK`` left set in a shell (no torchrun: no ``WORLD_SIZE`` over 1) silenced dgrpo eval's loading line, its
    note of the checkpoint's settings and its summary of several datasets, while sft and grpo (``dist.is_main``: one
    process is rank 0) said theirs: the three decide rank 0 alike now."""
    lm = make_lm(tokenizer)
    lm.run_config = {"model": {"dtype": "float32"}}
    lm.save_pretrained(tmp_path / "ckpt")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setenv("RANK", "3")
    data = ["--data", "builtin:test", "builtin:valid", "--limit", 1, "--set", "threads=1"]
    r = run_cli("eval", "--model", tmp_path / "ckpt", *data, "--out", tmp_path / "ev")
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert f"dgrpo: loading {tmp_path / 'ckpt'} (from {tmp_path / 'ckpt'}) ..." in lines, r.stdout
    assert any(line.startswith("dgrpo eval: task, data, dtype and scorer settings from") for line in lines), r.stdout
    assert any(line.startswith("dgrpo eval: builtin:test ") for line in lines), r.stdout


NEEDED = "(removed since dgrpo wrote it, and the model does not load without it: put it back, or copy the whole"
DROPPABLE = "(changed since dgrpo wrote it; if the change is yours, delete manifest.json to load it)"


def test_a_bpe_vocabularys_missing_files_are_said_to_be_needed(tokenizer, tmp_path):
    """A checkpoint with a BPE vocabulary's files (``vocab.json``, ``merges.txt``) beside its ``tokenizer.json``: a
    ``vocab.json`` without its ``merges.txt`` does not load (transformers: "`vocab` and `merges` must be both be from
    memory or both filenames"), yet a missing ``merges.txt``, or a ``tokenizer.json`` missing beside a lone
    ``vocab.json``, was said to be droppable ('delete manifest.json to load it'), and then the load failed. So did
    one missing beside a whole vocabulary: ``tokenizer.json`` alone holds the latent markers (the files converted
    lack them). A ``merges.txt`` or ``vocab.json`` missing beside ``tokenizer.json`` is droppable: it loads so."""
    from dgrpo.model.latent_lm import LatentLM
    from dgrpo.model.tokens import load_tokenizer
    from dgrpo.model.verified import CheckpointError

    lm = make_lm(tokenizer)
    bpe = {"vocab.json": '{"a": 0}', "merges.txt": "#version: 0.2\n"}
    for files, removed, says in (
        (("vocab.json", "merges.txt"), ("merges.txt",), DROPPABLE),
        (("vocab.json", "merges.txt"), ("vocab.json",), DROPPABLE),
        (("vocab.json",), ("tokenizer.json",), NEEDED),  # (a lone vocab.json left)
        (("vocab.json", "merges.txt"), ("merges.txt", "tokenizer.json"), NEEDED),
        (("vocab.json", "merges.txt"), ("tokenizer.json",), NEEDED),  # (the latent markers)
    ):
        folder = tmp_path / "-".join(files + ("without",) + removed)
        lm.save_pretrained(folder, extra=lambda tmp, files=files: [(tmp / f).write_text(bpe[f]) for f in files])
        for name in removed:
            (folder / name).unlink()
        with pytest.raises(CheckpointError) as e:
            LatentLM.from_pretrained(folder)
        assert str(e.value).startswith(f"checkpoint {folder} is damaged: missing file {removed[0]} {says}"), e.value
        if says == DROPPABLE:  # (as it says: without the manifest, the model loads)
            (folder / "manifest.json").unlink()
            LatentLM.from_pretrained(folder)

    # a directory without a manifest (a model downloaded with hf download): a lone vocab.json is no tokenizer
    folder = tmp_path / "vocab-json-without-merges"
    folder.mkdir()
    (folder / "vocab.json").write_text(bpe["vocab.json"])
    with pytest.raises(CheckpointError) as e:
        load_tokenizer(str(folder))
    assert str(e.value).startswith(
        f"no tokenizer in {folder} (vocab.json without the merges.txt it needs beside it, and none of tokenizer.json, "
        "vocab.txt, *.model, *.tiktoken): save the tokenizer beside the model"
    ), e.value


def test_an_adapter_without_its_bases_revision_loads_the_base_at_main_and_says_so_when_main_is_not_cached(
    tokenizer, tmp_path, monkeypatch
):
    """An adapter whose ``adapter_config.json`` records no revision of its hub base (PEFT's, not dgrpo's) loads the
    base at main: offline, the commit the cache's ``refs/main`` names, as ``from_pretrained`` reads it. A cache that
    holds the base only at a commit (``hf download --revision``: no ``refs/main``) was 'not in the Hugging Face
    cache'; it is 'not at main, ... (other revisions are)' now."""
    import json

    import huggingface_hub
    import torch

    from dgrpo.config import LoraConfig
    from dgrpo.model import lora
    from dgrpo.model.latent_lm import LatentLM
    from dgrpo.model.verified import CheckpointError

    repo, old, new = "org/base", "1" * 40, "2" * 40
    snapshots = tmp_path / "hub" / "models--org--base" / "snapshots"
    for commit, seed in ((old, 0), (new, 1)):
        make_lm(tokenizer, seed=seed).save_pretrained(snapshots / commit)
    refs = snapshots.parent / "refs"
    refs.mkdir()
    (refs / "main").write_text(new)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    lm = LatentLM.from_pretrained(repo, revision=old)
    lora.apply_lora(lm, LoraConfig(r=2, alpha=4.0))
    lm.save_pretrained(tmp_path / "adapter")
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["revision"] == old  # (dgrpo records it)
    (tmp_path / "adapter" / "adapter_config.json").write_text(json.dumps({**config, "revision": None}))
    (tmp_path / "adapter" / "manifest.json").unlink()

    said: list[str] = []
    loaded = LatentLM.from_pretrained(tmp_path / "adapter", announce=said.append)
    base = LatentLM.from_pretrained(snapshots / new)
    name = "model.layers.0.self_attn.q_proj.weight"
    weights = loaded.model.state_dict()
    weight = weights.get(name, weights.get(name.replace(".weight", ".base_layer.weight")))  # (adapted: PEFT's name)
    assert weight is not None and torch.equal(weight, base.model.state_dict()[name])  # (main's weights)
    assert said == [f"dgrpo: loading {tmp_path / 'adapter'} (a LoRA adapter on {repo}, from the hub cache) ..."]
    (refs / "main").unlink()  # (the base downloaded at a commit only)
    with pytest.raises(CheckpointError) as e:
        LatentLM.from_pretrained(tmp_path / "adapter")
    assert f"model '{repo}': not a local directory, and HF_HUB_OFFLINE is set but the model is not at main, the " in (
        str(e.value)
    )
    assert "revision read when none is named (other revisions are) in the Hugging Face cache" in str(e.value)


@pytest.fixture
def no_weights_load(monkeypatch):
    """Loading any model's weights fails the test: what is refused must be refused before."""
    from dgrpo.model import latent_lm

    def load_hf_model(path, *args, **kwargs):
        raise AssertionError(f"the weights of {path} were loaded")

    monkeypatch.setattr(latent_lm, "load_hf_model", load_hf_model)


def test_a_checkpoints_tokenizer_that_is_not_its_own_is_refused_before_the_weights_load(
    tokenizer, tmp_path, no_weights_load
):
    """A dgrpo checkpoint whose tokenizer is not the one saved with it (the base model's copied over it: no latent
    markers; another with tokens past the model's embedding rows), or has no EOS token, was refused once its weights
    had loaded (minutes for a 1.5B model); config.json's vocab_size gives the rows, and the tokenizer is refused
    before."""
    import json

    from dgrpo.model.latent_lm import LatentLM
    from dgrpo.model.verified import CheckpointError

    lm = make_lm(tokenizer)
    rows = lm.model.get_input_embeddings().weight.shape[0]
    lm.save_pretrained(tmp_path / "extra")
    assert json.loads((tmp_path / "extra" / "config.json").read_text())["vocab_size"] == rows
    more = lm.tokenizer
    more.add_tokens(["<extra-1>", "<extra-2>"])
    more.save_pretrained(tmp_path / "extra")
    (tmp_path / "extra" / "manifest.json").unlink()  # (the change is the user's)
    with pytest.raises(CheckpointError, match=f"it has 2 tokens past the model's {rows} embedding rows; copy back"):
        LatentLM.from_pretrained(tmp_path / "extra")

    make_lm(tokenizer).save_pretrained(tmp_path / "base-tokenizer")
    tokenizer.save_pretrained(tmp_path / "base-tokenizer")  # (the base's, without the markers)
    (tmp_path / "base-tokenizer" / "manifest.json").unlink()
    with pytest.raises(CheckpointError, match=re.escape("it lacks the latent markers <|start-latent|>, <|latent|>")):
        LatentLM.from_pretrained(tmp_path / "base-tokenizer")

    make_lm(tokenizer).save_pretrained(tmp_path / "no-eos")  # (a tokenizer without EOS: no LatentLM takes it)
    settings = json.loads((tmp_path / "no-eos" / "tokenizer_config.json").read_text())
    (tmp_path / "no-eos" / "tokenizer_config.json").write_text(json.dumps({**settings, "eos_token": None}))
    (tmp_path / "no-eos" / "manifest.json").unlink()
    with pytest.raises(CheckpointError, match=r"no-eos: the tokenizer has no EOS token \(it has a pad"):
        LatentLM.from_pretrained(tmp_path / "no-eos")


def test_model_compile_on_an_architecture_it_cannot_run_is_refused_before_the_weights_load(
    tokenizer, tmp_path, no_weights_load
):
    """``model.compile`` for a loaded GPT-2 (or a model with attention dropout) was refused once the weights had
    loaded and the trainer applied it; its config.json says so, and the training load refuses it before the weights
    load, from a directory or under a LoRA adapter (its base's). An evaluation (no training) compiles nothing."""
    import json

    from dgrpo.config import Config, ConfigError, LoraConfig
    from dgrpo.model import lora
    from dgrpo.model.factory import load_model

    gpt2 = make_lm(tokenizer, "gpt2")
    gpt2.save_pretrained(tmp_path / "gpt2")
    gpt2.name_or_path = str(tmp_path / "gpt2")  # (as loaded from there: its adapter names it as its base)
    lora.apply_lora(gpt2, LoraConfig(r=2, alpha=4.0))
    gpt2.save_pretrained(tmp_path / "adapter")
    make_lm(tokenizer, "llama").save_pretrained(tmp_path / "llama")
    config = json.loads((tmp_path / "llama" / "config.json").read_text())
    (tmp_path / "llama" / "config.json").write_text(json.dumps({**config, "attention_dropout": 0.1}))
    (tmp_path / "llama" / "manifest.json").unlink()
    cfg = Config()
    cfg.model.compile = True
    for init in ("gpt2", "adapter"):
        with pytest.raises(ConfigError, match="model.compile: the compiled layers run qwen2, llama .* is 'gpt2'"):
            load_model(cfg.model, cfg.task, init=str(tmp_path / init))
    with pytest.raises(ConfigError, match="model.compile: the model's attention_dropout is 0.1"):
        load_model(cfg.model, cfg.task, init=str(tmp_path / "llama"))
    with pytest.raises(AssertionError, match="were loaded"):  # (an evaluation: nothing compiles, nothing refused)
        load_model(cfg.model, cfg.task, init=str(tmp_path / "gpt2"), training=False)
