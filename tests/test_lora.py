"""LoRA through PEFT: the latent recurrence under adapters, trainable latent rows, exact replay, the reference as a
frozen adapter, adapter checkpoints (save / load / merge / resume) and the command line."""

import json
import re
import warnings

import pytest
import torch

from conftest import make_lm, tiny_args, tiny_config

pytest.importorskip("peft")

from dgrpo.config import ConfigError, LoraConfig  # noqa: E402
from dgrpo.model import lora  # noqa: E402
from dgrpo.model.latent_lm import LatentLM  # noqa: E402
from dgrpo.model.reference import uncached_target_logprobs  # noqa: E402
from dgrpo.model.verified import CheckpointError  # noqa: E402

N_LATENT = 3
QUESTIONS, ANSWERS = ["12 + 7 = ?", "3 * 4 + 1 = ?"], ["19 #### 19", "13 #### 13"]


@pytest.fixture
def base_dirs(lora_base_dirs):
    return lora_base_dirs


def with_lora(path, nonzero=True, **kw) -> LatentLM:
    lm = LatentLM.from_pretrained(path)
    with torch.random.fork_rng():  # PEFT draws lora_A from the global RNG: the same adapters whatever ran before
        torch.manual_seed(0)
        lora.apply_lora(lm, LoraConfig(r=4, alpha=8.0, **kw))
    if nonzero:  # B = 0 at init makes every adapter a no-op; give them a value so that they matter
        with torch.no_grad():
            gen = torch.Generator().manual_seed(1)
            for name, p in lm.model.named_parameters():
                if "lora_B" in name:
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    return lm


def batch(lm):
    q, qm = lm.encode_questions(QUESTIONS)
    t, tm = lm.encode_targets(ANSWERS)
    return q, qm, t, tm


def logprobs(lm, n_latent=N_LATENT):
    with torch.no_grad():
        return lm.target_logprobs(*batch(lm)[:2], n_latent, *batch(lm)[2:])[0]


@pytest.mark.parametrize("arch", ["qwen2", "llama", "gpt2"])
def test_recurrence_runs_under_peft(base_dirs, arch):
    """A PeftModel no longer breaks LatentLM: fresh adapters change nothing, and with trained adapters the cached
    recurrence still equals the uncached per-step recomputation."""
    plain = LatentLM.from_pretrained(base_dirs / arch)
    fresh = with_lora(base_dirs / arch, nonzero=False)
    assert torch.equal(logprobs(plain), logprobs(fresh))
    lm = with_lora(base_dirs / arch)
    q, qm, t, tm = batch(lm)
    with torch.no_grad():
        slow, _ = uncached_target_logprobs(lm, q, qm, N_LATENT, t, tm)
    assert not torch.allclose(logprobs(lm), logprobs(plain), atol=1e-3)
    torch.testing.assert_close(logprobs(lm), slow, atol=1e-5, rtol=0)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_latent_rows_and_adapters_train_through_the_recurrence(base_dirs, arch):
    lm = with_lora(base_dirs / arch)
    trainable = {n for n, p in lm.model.named_parameters() if p.requires_grad}
    assert all("lora_" in n or "trainable_tokens_delta" in n for n in trainable)
    q, qm, t, tm = batch(lm)
    (-lm.target_logprobs(q, qm, N_LATENT, t, tm)[0].sum()).backward()
    params = dict(lm.model.named_parameters())
    rows = [n for n in trainable if "trainable_tokens_delta" in n]
    assert len(rows) == (1 if arch == "qwen2" else 2)  # tied head: the same rows; untied (Llama): its own rows too
    emb = next(params[n] for n in rows if "embed_tokens" in n)
    assert emb.shape[0] == 3  # <|start-latent|>, <|latent|>, <|end-latent|> only
    # <|start-latent|> reaches the answer only through attention over the latent chain; <|end-latent|> directly
    assert emb.grad[0].abs().sum() > 0 and emb.grad[2].abs().sum() > 0
    if arch == "llama":
        head = next(params[n] for n in rows if "lm_head" in n)
        assert head.grad.abs().sum() > 0
    lora_b = [p for n, p in params.items() if "lora_B" in n]
    assert lora_b and all(p.grad is not None and p.grad.abs().sum() > 0 for p in lora_b)


@pytest.mark.parametrize("granularity", ["call", "layer"])
def test_recomputation_under_adapters_gives_full_backprops_gradients(base_dirs, granularity):
    """Activation recomputation (per call, per layer) through the PEFT-wrapped recurrence: the adapters' and
    latent rows' gradients are those of full backprop."""
    lm = with_lora(base_dirs / "qwen2")
    grads = []
    for recompute in (False, granularity):
        lm.recompute = recompute
        lm.model.zero_grad(set_to_none=True)
        (-lm.target_logprobs(*batch(lm)[:2], N_LATENT, *batch(lm)[2:])[0].sum()).backward()
        grads.append({n: p.grad.clone() for n, p in lm.model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and grads[0]
    assert max(float((grads[0][k] - grads[1][k]).abs().max()) for k in grads[0]) <= 1e-6


def test_adapter_dropout_is_forced_to_zero(base_dirs):
    with pytest.warns(UserWarning, match="replaced by 0"):
        lm = with_lora(base_dirs / "qwen2", dropout=0.1)
    assert lm.peft.peft_config[lora.POLICY].lora_dropout == 0.0
    lm.train()  # even in train mode two forwards are the same network
    assert torch.equal(logprobs(lm), logprobs(lm))


def test_reference_adapter_is_the_initial_policy_and_renews(base_dirs):
    lm = with_lora(base_dirs / "llama")
    n_before = sum(p.numel() for p in lm.model.parameters())
    adapter = sum(p.numel() for p in lm.model.parameters() if p.requires_grad)
    start = logprobs(lm)
    lora.add_reference(lm)
    # no second copy of the backbone: the reference adds exactly one adapter's worth of parameters
    assert sum(p.numel() for p in lm.model.parameters()) == n_before + adapter
    assert sum(p.numel() for p in lm.model.parameters() if p.requires_grad) == adapter  # the reference is frozen
    with torch.no_grad():
        for p in lm.model.parameters():
            if p.requires_grad:
                p.add_(0.05)
    moved = logprobs(lm)
    with lora.reference_active(lm):
        assert torch.equal(logprobs(lm), start)
    assert torch.equal(logprobs(lm), moved)  # the policy is back after the context
    lora.renew_reference(lm)
    with lora.reference_active(lm):
        assert torch.equal(logprobs(lm), moved)


@pytest.mark.slow
def test_adapter_checkpoint_save_load_and_merge(base_dirs, tmp_path, run_cli):
    lm = with_lora(base_dirs / "llama")
    lm.save_pretrained(tmp_path / "adapter")
    files = {p.name for p in (tmp_path / "adapter").iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "latent_config.json"} <= files
    assert "model.safetensors" not in files  # the adapter only: the base is named, not copied
    again = LatentLM.from_pretrained(tmp_path / "adapter")
    assert again.peft is not None and again.name_or_path == str((base_dirs / "llama").resolve())
    assert torch.equal(logprobs(again), logprobs(lm))
    r = run_cli("export", tmp_path / "adapter", "--merge", "--out", tmp_path / "merged")
    assert r.returncode == 0, r.stderr
    merged = LatentLM.from_pretrained(tmp_path / "merged")
    assert merged.peft is None and (tmp_path / "merged" / "model.safetensors").is_file()
    torch.testing.assert_close(logprobs(merged), logprobs(lm), atol=1e-5, rtol=0)
    q, qm = merged.encode_questions(QUESTIONS)
    greedy = [m.generate(q, qm, N_LATENT, max_new_tokens=12).tokens for m in (merged, lm)]
    assert torch.equal(*greedy)
    lm.run_config = {"model": {"dtype": "bfloat16", "lora": {"r": 4}}}  # (a run's: dgrpo eval loads in its dtype)
    lm.save_pretrained(tmp_path / "trained")
    for dtype, recorded in (("float32", "float32"), ("float16", "float32"), ("bfloat16", "bfloat16")):
        r = run_cli("export", tmp_path / "trained", "--merge", "--dtype", dtype, "--out", tmp_path / dtype)
        assert r.returncode == 0, r.stderr  # (it recorded the run's bfloat16: dgrpo eval rounded the export to it)
        assert json.loads((tmp_path / dtype / "run_config.json").read_text())["model"] == {
            "dtype": recorded,
            "lora": {"r": 4},
        }
    # auto takes the run's recorded bfloat16 (the dtype it trained and scored in), not the float32 base's
    r = run_cli("export", tmp_path / "trained", "--merge", "--out", tmp_path / "auto")
    assert r.returncode == 0, r.stderr
    assert "torch.bfloat16" in r.stdout
    assert json.loads((tmp_path / "auto" / "run_config.json").read_text())["model"]["dtype"] == "bfloat16"
    assert LatentLM.from_pretrained(tmp_path / "auto").model.config.dtype == torch.bfloat16
    r = run_cli("export", tmp_path / "adapter", "--out", tmp_path / "nomerge")
    assert r.returncode == 2 and "pass --merge" in r.stderr
    for taken in (tmp_path / "adapter", tmp_path / "merged"):  # the source itself, or any directory with files
        before = sorted(p.name for p in taken.iterdir())
        r = run_cli("export", tmp_path / "adapter", "--merge", "--out", taken)
        assert r.returncode == 2 and "exists and is not empty" in r.stderr
        assert sorted(p.name for p in taken.iterdir()) == before  # nothing replaced


@pytest.mark.parametrize("arch", ["llama", "gpt2"])  # an untied head, a tied one
def test_an_adapter_on_a_plain_base_reloads_the_latent_rows_it_trained_with(tokenizer, tmp_path, arch):
    """A plain LM (no latent markers in its tokenizer) gets the markers' rows from dgrpo; with
    model.lora.train_latent_tokens false the adapter did not hold them, and a reload gave them the resize's values
    (a fresh start: the embeddings' mean), not the ones trained: other log-probs than the model that was trained.
    They are kept beside the adapter (here rows moved off that start, as SFT moves them)."""
    import copy

    from dgrpo.model.tiny import build_tiny_model

    plain = tmp_path / "plain"
    build_tiny_model(
        arch, len(tokenizer), hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64
    ).save_pretrained(plain)
    copy.deepcopy(tokenizer).save_pretrained(plain)
    lm = with_lora(plain, train_latent_tokens=False)
    assert lm.new_latent_tokens  # (a plain base: dgrpo gave the markers their rows)
    ids = [lm.start_id, lm.latent_id, lm.end_id]
    with torch.no_grad():  # (trained rows; a fresh resize gives each marker the same mean, which a reload would equal)
        for get in ("get_input_embeddings", "get_output_embeddings"):
            getattr(lm.model, get)().weight[ids] += torch.arange(1.0, 4.0)[:, None]
    lm.save_pretrained(tmp_path / "adapter")
    assert (tmp_path / "adapter" / lora.LATENT_ROWS).is_file()
    again = LatentLM.from_pretrained(tmp_path / "adapter")
    for get in ("get_input_embeddings", "get_output_embeddings"):
        assert torch.equal(getattr(again.model, get)().weight[ids], getattr(lm.model, get)().weight[ids])
    assert torch.equal(logprobs(again), logprobs(lm))
    with_lora(plain).save_pretrained(tmp_path / "trained-rows")  # the adapter holds them itself
    assert not (tmp_path / "trained-rows" / lora.LATENT_ROWS).exists()
    # the reloaded markers are the saved run's, not new: grpo --init and eval warned "a plain LM ... untrained"
    assert again.new_latent_tokens == [] and LatentLM.from_pretrained(tmp_path / "trained-rows").new_latent_tokens == []


def test_init_takes_an_adapter_checkpoint(base_dirs, tmp_path):
    from dgrpo.model.factory import load_model

    lm = with_lora(base_dirs / "qwen2")
    lm.save_pretrained(tmp_path / "adapter")
    cfg = tiny_config(**{"model.lora.r": 4, "model.lora.alpha": 8.0})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the checkpoint's own settings: nothing to say
        cont = load_model(cfg.model, cfg.task, init=str(tmp_path / "adapter"))
    assert cont.peft is not None and torch.equal(logprobs(cont), logprobs(lm))  # the same adapter trains on
    other = tiny_config(**{"model.lora.r": 4, "model.lora.alpha": 8.0, "model.lora.target_modules": "[q_proj]"})
    with pytest.warns(UserWarning, match=r"target_modules=\[q_proj\], train_latent_tokens=True\) differs from"):
        load_model(other.model, cfg.task, init=str(tmp_path / "adapter"))
    saved = lm.peft.peft_config["default"]  # the run's config records what it trains (it kept the given values)
    assert (other.model.lora.r, other.model.lora.target_modules) == (saved.r, sorted(saved.target_modules))
    rows = tiny_config(**{"model.lora.r": 4, "model.lora.alpha": 8.0, "model.lora.train_latent_tokens": "false"})
    with pytest.warns(UserWarning, match="train_latent_tokens=False\\) differs from the checkpoint's adapter"):
        load_model(rows.model, cfg.task, init=str(tmp_path / "adapter"))
    assert rows.model.lora.train_latent_tokens is True  # (the adapter trains the latent rows: recorded so)
    with pytest.warns(UserWarning, match="merging it into the base"):
        full = load_model(tiny_config().model, cfg.task, init=str(tmp_path / "adapter"))
    assert full.peft is None and all(p.requires_grad for p in full.model.parameters())
    torch.testing.assert_close(logprobs(full), logprobs(lm), atol=1e-5, rtol=0)


def test_init_of_an_all_linear_adapter_names_its_file_for_many_targets(base_dirs, tmp_path):
    """The --init warning for a model.lora other than the checkpoint's adapter spells targets as resuming does
    (:func:`~dgrpo.model.lora.other_adapter`): PEFT's expansion of all-linear (14 full names on the tiny Qwen2) is
    named by the folder's adapter_config.json, not printed name by name; a few names are written as --set takes them."""
    from dgrpo.model.factory import load_model

    lm = with_lora(base_dirs / "qwen2", target_modules=["all-linear"])
    lm.save_pretrained(tmp_path / "adapter")
    assert len(lm.peft.peft_config["default"].target_modules) == 14
    other = tiny_config(**{"model.lora.r": 4, "model.lora.alpha": 8.0, "model.lora.target_modules": "[q_proj,v_proj]"})
    with pytest.warns(UserWarning) as caught:
        load_model(other.model, other.task, init=str(tmp_path / "adapter"))
    (message,) = [str(w.message) for w in caught if "differs from the checkpoint's adapter" in str(w.message)]
    file = tmp_path / "adapter" / lora.ADAPTER_CONFIG
    assert "model.lora (r=4, alpha=8.0, target_modules=[q_proj,v_proj], train_latent_tokens=True) differs" in message
    assert f"(r=4, alpha=8.0, target_modules as {file} lists them, train_latent_tokens=True)" in message
    assert "layers.0" not in message


def test_lora_needs_a_saved_base_and_no_fsdp(tokenizer):
    from dgrpo.model.factory import load_model

    cfg = tiny_config(**{"model.lora.r": 4})
    with pytest.raises(ConfigError, match="train it fully first"):
        load_model(cfg.model, cfg.task)
    with pytest.raises(ConfigError, match=r"this one was built in memory: save it first \(lm.save_pretrained"):
        lora.apply_lora(make_lm(tokenizer, "gpt2"), LoraConfig(r=4))  # a user's model: not "the built-in tiny"
    with pytest.raises(ConfigError, match="LoRA with FSDP"):
        tiny_config(**{"model.lora.r": 4, "fsdp": "full"})


def test_dgrpo_fsdp_is_the_runs_fsdp_key_so_validation_sees_it(monkeypatch):
    """DGRPO_FSDP overrides the ``fsdp`` key of dgrpo sft/grpo when the config loads: LoRA, the compiled layers and
    the latent chain are refused under it before the model loads, and the run's config.json records the mode that
    ran (it passed validation as fsdp: none and was recorded so)."""
    import argparse

    from dgrpo.cli.common import load

    from conftest import TINY

    def args(cmd, **over):
        sets = [f"{k}={v}" for k, v in over.items()]
        return argparse.Namespace(cmd=cmd, config=[TINY], overrides=sets, out=None)

    monkeypatch.setenv("DGRPO_FSDP", "1")
    assert load(args("grpo")).fsdp == "full" and load(args("sft")).fsdp == "full"
    assert load(args("eval")).fsdp == "none"  # (a one-process command: the variable is no option of it)
    with pytest.raises(ConfigError, match=r"LoRA with FSDP is not supported.*\(fsdp=full comes from DGRPO_FSDP\)"):
        load(args("grpo", **{"model.lora.r": 4}))
    monkeypatch.setenv("DGRPO_FSDP", "sharded")
    assert load(args("grpo", fsdp="none")).fsdp == "sharded"
    monkeypatch.setenv("DGRPO_FSDP", "yes")
    with pytest.raises(ConfigError, match=r"DGRPO_FSDP='yes': expected none, full or sharded \(or 0"):
        load(args("grpo"))
    from dgrpo.training.distributed import Dist

    monkeypatch.delenv("DGRPO_FSDP")
    # (Python's fsdp=: the same spellings)
    with pytest.raises(ConfigError, match=r"fsdp='yes': expected none, full or sharded \(or 0"):
        Dist.from_env(fsdp="yes")
    assert not Dist.from_env(fsdp=None).fsdp  # (None and bools, as before, in one process)


def test_adapter_checkpoint_with_a_missing_base_is_one_line(base_dirs, tmp_path):
    import json
    import shutil

    shutil.copytree(base_dirs / "qwen2", tmp_path / "base")
    lm = with_lora(tmp_path / "base")
    lm.save_pretrained(tmp_path / "adapter")
    (tmp_path / "base").rename(tmp_path / "moved")
    with pytest.raises(CheckpointError, match="its base model cannot be loaded .*not found.* base_model_name_or_path"):
        LatentLM.from_pretrained(tmp_path / "adapter")
    config = tmp_path / "adapter" / "adapter_config.json"
    assert json.loads(config.read_text())["r"] == 4
    # what the line says to do (the path alone was refused as a damaged checkpoint: the manifest holds its checksum)
    config.write_text(
        json.dumps({**json.loads(config.read_text()), "base_model_name_or_path": str(tmp_path / "moved")})
    )
    (tmp_path / "adapter" / "manifest.json").unlink()
    assert torch.equal(logprobs(LatentLM.from_pretrained(tmp_path / "adapter")), logprobs(lm))


def test_an_adapter_whose_config_does_not_fit_its_base_is_one_line(base_dirs, tmp_path):
    """An adapter directory whose adapter_config.json names modules its base lacks (one trained elsewhere, or edited)
    is one CheckpointError line naming the folder, the base and PEFT's reason: it was PEFT's raw ValueError (a
    traceback from the command line)."""
    lm = with_lora(base_dirs / "qwen2")
    lm.save_pretrained(tmp_path / "adapter")
    config = tmp_path / "adapter" / "adapter_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "target_modules": ["c_attn"]}))
    (tmp_path / "adapter" / "manifest.json").unlink()  # (as an adapter made outside dgrpo: no checksums)
    with pytest.raises(CheckpointError) as info:
        LatentLM.from_pretrained(tmp_path / "adapter")
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(f"{tmp_path / 'adapter'}: its adapter_config.json does not fit the base")
    assert f"base model {base_dirs / 'qwen2'} (PEFT: " in msg and "c_attn" in msg


def test_an_adapter_is_never_saved_over_its_base(base_dirs, tmp_path, monkeypatch):
    """Saving a LoRA model into the directory of its base (by any spelling) is refused before anything is written:
    it used to replace the base's weights with the adapter, which then named its own directory as its base."""
    import shutil

    shutil.copytree(base_dirs / "qwen2", tmp_path / "base")
    before = sorted(p.name for p in (tmp_path / "base").iterdir())
    lm = with_lora(tmp_path / "base")
    monkeypatch.chdir(tmp_path)
    for name in (tmp_path / "base", "base", "./base/", "base/../base", tmp_path):
        with pytest.raises(CheckpointError, match="holds the base model of this LoRA adapter .*name another directory"):
            lm.save_pretrained(name)
    assert sorted(p.name for p in (tmp_path / "base").iterdir()) == before
    lm.save_pretrained(tmp_path / "adapter")
    assert torch.equal(logprobs(LatentLM.from_pretrained(tmp_path / "adapter")), logprobs(lm))


def test_an_adapter_is_saved_byte_for_byte_alike(base_dirs, tmp_path):
    """The adapter file's metadata (its format and its base's fingerprint) was written from a hash map, in an order
    that changed from one save to the next: saves of one adapter differed in bytes (and a run's manifests from the
    same run resumed). Eight saves are one file, which loads as the adapter it is."""
    from safetensors import safe_open

    from dgrpo.model.lora import BASE_FINGERPRINT, adapter_state, save_adapter

    lm = with_lora(base_dirs / "qwen2")
    files = set()
    for i in range(8):
        save_adapter(lm, tmp_path / str(i))
        files.add((tmp_path / str(i) / "adapter_model.safetensors").read_bytes())
    assert len(files) == 1
    with safe_open(str(tmp_path / "0" / "adapter_model.safetensors"), "pt") as f:
        assert sorted(f.metadata()) == [BASE_FINGERPRINT, "format"] and f.metadata()["format"] == "pt"
        saved = {k: f.get_tensor(k) for k in f.keys()}
    state = adapter_state(lm)
    assert saved.keys() == state.keys() and all(torch.equal(saved[k], state[k]) for k in state)


def test_an_adapter_refuses_a_base_replaced_since_it_was_saved(base_dirs, tokenizer, tmp_path):
    """The adapter records its local base's fingerprint; another model of the same shape put at the base's path is
    refused in one line (it used to load, every prediction changed), with or without the base's manifest. The base
    it was trained on loads, and an adapter saved before fingerprints (none in its metadata) loads as before."""
    import shutil

    from safetensors.torch import load_file, save_file

    from dgrpo.model.verified import write_manifest

    shutil.copytree(base_dirs / "qwen2", tmp_path / "original")
    shutil.copytree(tmp_path / "original", tmp_path / "base")
    lm = with_lora(tmp_path / "base")
    lm.save_pretrained(tmp_path / "adapter")
    make_lm(tokenizer, "qwen2", seed=1).save_pretrained(tmp_path / "base")  # another model at the base's path
    changed = f"the base model at {tmp_path / 'base'} changed since the adapter was trained"
    with pytest.raises(CheckpointError, match=changed):
        LatentLM.from_pretrained(tmp_path / "adapter")
    (tmp_path / "base" / "manifest.json").unlink()  # a base without a manifest: its weight files are compared
    with pytest.raises(CheckpointError, match=changed):
        LatentLM.from_pretrained(tmp_path / "adapter")
    shutil.rmtree(tmp_path / "base")
    shutil.copytree(tmp_path / "original", tmp_path / "base")
    assert torch.equal(logprobs(LatentLM.from_pretrained(tmp_path / "adapter")), logprobs(lm))
    (tmp_path / "base" / "manifest.json").unlink()
    assert torch.equal(logprobs(LatentLM.from_pretrained(tmp_path / "adapter")), logprobs(lm))
    weights = tmp_path / "adapter" / "adapter_model.safetensors"
    save_file(load_file(str(weights)), str(weights), metadata={"format": "pt"})  # as saved before fingerprints
    write_manifest(tmp_path / "adapter")
    make_lm(tokenizer, "qwen2", seed=1).save_pretrained(tmp_path / "other")
    shutil.rmtree(tmp_path / "base")
    shutil.copytree(tmp_path / "other", tmp_path / "base")
    LatentLM.from_pretrained(tmp_path / "adapter")  # no fingerprint: nothing to compare


# -- GRPO under LoRA -------------------------------------------------------------------------------------------

GRPO = {
    "model.lora.r": 4,
    "model.lora.alpha": 8.0,
    "grpo.beta0": 0.02,
    "grpo.mini_epochs": 2,
    "grpo.filter": "false",
    "grpo.prompts_per_step": 4,
    "grpo.lr": 1e-3,
    "grpo.max_new_tokens": 24,
    "grpo.ref_renewal_every": 2,
}


def lora_trainer(sft_checkpoint, records, **over):
    from dgrpo.model.factory import load_model
    from dgrpo.training.grpo import GRPOTrainer

    cfg = tiny_config(**{**GRPO, **over})
    torch.manual_seed(0)
    lm = load_model(cfg.model, cfg.task, init=str(sft_checkpoint))
    return GRPOTrainer(lm, cfg, records)


@pytest.mark.parametrize("given", ["config", "model"])
def test_train_grpo_from_python_trains_the_adapters_its_config_or_model_has(
    sft_checkpoint, task_records, tmp_path, given
):
    """train_grpo handed a full model: model.lora.r > 0 in the config puts adapters on it (the config was ignored,
    and every weight trained while config.json said r = 4); a model handed with its own adapters and r = 0 keeps
    them, and config.json records their rank."""
    import json

    from dgrpo.training.grpo import train_grpo

    rank = {"model.lora.r": 4 if given == "config" else 0}
    cfg = tiny_config(**{**GRPO, **rank, "grpo.steps": 1, "grpo.filter": "false"})
    lm = LatentLM.from_pretrained(sft_checkpoint)
    if given == "model":
        lm.name_or_path = str(sft_checkpoint)  # (the saved base the adapter names)
        lora.apply_lora(lm, LoraConfig(r=4, alpha=8.0))
    train_grpo(lm, cfg, task_records, tmp_path / "run", log=lambda *a: None, progress=False)
    assert lm.peft is not None and (tmp_path / "run" / "final" / "adapter_model.safetensors").is_file()
    assert not (tmp_path / "run" / "final" / "model.safetensors").exists()
    assert json.loads((tmp_path / "run" / "config.json").read_text())["model"]["lora"]["r"] == 4


def frozen_weights(lm):
    return {n: p.detach().clone() for n, p in lm.model.named_parameters() if not p.requires_grad and "lora" not in n}


@pytest.mark.parametrize("engine", ["eager", "fast"])
def test_grpo_under_lora_replays_exactly_and_trains_only_adapters(sft_checkpoint, task_records, engine):
    """(``fast``: the rollouts and the reference adapter's scoring over fixed buffers.)"""
    from dgrpo.training.rollouts import replay_logprobs

    tr = lora_trainer(sft_checkpoint, task_records, **{"grpo.engine": engine})
    lm = tr.lm
    n_train, n_total = lora.trainable_parameters(lm)
    assert sum(p.numel() for p in tr.opt_params) == n_train < n_total / 10  # the optimizer holds the adapters only
    base = frozen_weights(lm)
    policy0 = lora.adapter_state(lm)
    m = tr.step()
    assert m["skipped"] == 0 and m["grad_norm"] > 0
    assert m["logp_replay_maxdiff"] < 1e-5  # the update's replay scores what the rollout sampled
    assert m["ratio_max"] > 1.0 > m["ratio_min"]  # mini-epoch 2's ratios: the adapters moved in mini-epoch 1
    ro, rows = tr.last_rollouts, torch.arange(4)
    kw = dict(n_latent=tr.n_latent, perturbation=tr.perturbation, seeds=ro.seeds[rows], temperature=1.0)
    with torch.no_grad():
        a, b = replay_logprobs(lm, ro, rows, **kw)[0], replay_logprobs(lm, ro, rows, **kw)[0]
        fixed = replay_logprobs(lm, ro, rows, engine="fast", **kw)[0]  # (the reference's way, here the policy's)
    assert torch.equal(a, b)  # bit-identical replay of the same masks
    assert torch.allclose(fixed, a, atol=1e-5, rtol=0)
    after = frozen_weights(lm)
    assert all(torch.equal(base[k], after[k]) for k in base)  # the backbone never moves
    assert any(not torch.equal(policy0[k], v) for k, v in lora.adapter_state(lm).items())
    assert all(torch.equal(policy0[k], v) for k, v in lora.adapter_state(lm, lora.REFERENCE).items())
    tr.step()  # step 2: renewal (ref_renewal_every = 2) copies the policy adapter into the reference
    now = lora.adapter_state(lm)
    assert all(torch.equal(now[k], v) for k, v in lora.adapter_state(lm, lora.REFERENCE).items())


@pytest.mark.slow
def test_grpo_under_lora_resumes_bit_exactly(sft_checkpoint, task_records, tmp_path):
    """Save after 2 steps, load into a fresh trainer: both then take the same steps to the same adapters."""
    from dgrpo.training.checkpoint import list_checkpoints, read_checkpoint, save_checkpoint

    timing = {"time_rollout_s", "time_update_s"}
    sets = {"grpo.ref_renewal_every": 3, "grpo.steps": 4}  # 2 steps, saved, then 2 more
    a = lora_trainer(sft_checkpoint, task_records, **sets)
    for _ in range(2):
        a.step()
    extra = {"ref": a.ref.checkpoint_state}
    save_checkpoint(tmp_path, 2, lm=a.lm, optimizer=a.opt, state={"trainer": a.state()}, extra_models=extra)
    b = lora_trainer(sft_checkpoint, task_records, **sets)
    extra_b = {"ref": b.ref.checkpoint_state}
    saved = read_checkpoint(list_checkpoints(tmp_path)[-1], lm=b.lm, optimizer=b.opt, extra_models=extra_b)
    state = saved.apply(b.lm, b.opt, extra_b)
    b.load_state(state["trainer"])
    rng = torch.random.get_rng_state()
    for _ in range(2):
        torch.random.set_rng_state(rng)
        ma = {k: v for k, v in a.step().items() if k not in timing}
        torch.random.set_rng_state(rng)
        mb = {k: v for k, v in b.step().items() if k not in timing}
        assert ma == mb
    for adapter in (lora.POLICY, lora.REFERENCE):
        sa, sb = lora.adapter_state(a.lm, adapter), lora.adapter_state(b.lm, adapter)
        assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.slow
def test_command_line_lora_sft_grpo_eval_export(sft_checkpoint, tmp_path, run_cli):
    """LoRA SFT from a full checkpoint, LoRA GRPO on its adapter, eval of the adapter run, merged export: same
    predictions."""
    over = {"model.lora.r": 4, "task.n_train": 256, "sft.num_epochs": 1, "sft.epochs_per_stage": 1}
    r = run_cli("sft", "--init", sft_checkpoint, "--out", tmp_path / "sft", *tiny_args(**over))
    assert r.returncode == 0, r.stderr
    assert "dgrpo: LoRA r=4" in r.stdout
    assert (tmp_path / "sft" / "final" / "adapter_model.safetensors").is_file()
    over = {"model.lora.r": 4, "grpo.steps": 2, "grpo.beta0": 0.02, "grpo.prompts_per_step": 4}
    r = run_cli("grpo", "--init", tmp_path / "sft", "--out", tmp_path / "grpo", *tiny_args(**over))
    assert r.returncode == 0, r.stderr
    base = lora.adapter_base(tmp_path / "grpo" / "final")
    assert base == lora.adapter_base(tmp_path / "sft" / "final") == str(sft_checkpoint.resolve())
    r = run_cli("export", tmp_path / "grpo", "--merge", "--out", tmp_path / "merged")
    assert r.returncode == 0, r.stderr
    for name in ("grpo", "merged"):
        r = run_cli("eval", "--model", tmp_path / name, "--data", "builtin:test", "--out", tmp_path / f"eval-{name}")
        assert r.returncode == 0, r.stderr
    preds = [(tmp_path / f"eval-{n}" / "predictions.jsonl").read_text() for n in ("grpo", "merged")]
    assert preds[0] == preds[1]


@pytest.mark.parametrize("kind", ["locked", "gaussian", "native"])
def test_every_perturbation_replays_under_lora(base_dirs, kind):
    """Each stochasticity source binds to the adapted model, changes its output, and replays bit for bit."""
    from dgrpo.config import PerturbationConfig
    from dgrpo.perturbation import make_perturbation, seeds_for

    lm = with_lora(base_dirs / "qwen2").eval()
    cfg = PerturbationConfig(kind=kind, p=0.3, sigma=0.5, gaussian_target="weights")
    pert = make_perturbation(cfg)
    q, qm, t, tm = (x[:1] for x in batch(lm))  # native dropout binds one rollout at a time
    seeds = seeds_for(0, 0, 0, 1)

    def run():
        with torch.no_grad(), pert.bind(lm, seeds) as pb:
            return lm.target_logprobs(q, qm, N_LATENT, t, tm, perturbation=pb, stepwise=kind == "native")[0]

    a, b = run(), run()
    assert torch.equal(a, b) and not torch.equal(a, logprobs(lm)[:1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_latent_chain_under_adapters_gives_the_recurrences_gradients(base_dirs, dtype):
    """``grpo.update_latent_graphs`` through the PEFT-wrapped model (uncaptured here): only the adapters and latent
    rows are its trainable weights, and their gradients are the step-by-step recurrence's. In float64 they agree to
    rounding (the two are one computation); in float32 the recurrence amplifies rounding by the draw's conditioning
    (over 400 adapter draws the worst was 7e-5 of the gradient's size, 98% under 1e-5), so that check takes the
    fixed draw ``with_lora`` makes."""
    from dgrpo.model.latent_chain import chained_target_logprobs

    lm = with_lora(base_dirs / "qwen2")
    lm.model.to(dtype)
    q, qm, t, tm = batch(lm)
    grads = []
    for chained in (False, True):
        lm.model.zero_grad(set_to_none=True)
        if chained:
            logp = chained_target_logprobs(lm, q, qm, N_LATENT, t, tm, keep=True)
        else:
            logp = lm.target_logprobs(q, qm, N_LATENT, t, tm, end_with_targets=True)[0]
        (-logp.sum()).backward()
        grads.append({n: p.grad.clone() for n, p in lm.model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and any("lora_B" in k for k in grads[0])
    for k in grads[0]:
        scale = max(1.0, float(grads[0][k].abs().max()))
        assert float((grads[0][k] - grads[1][k]).abs().max()) <= (1e-5 if dtype == torch.float32 else 1e-12) * scale, k


def test_target_modules_that_match_nothing_or_cannot_be_adapted_are_one_config_line(base_dirs):
    """A misspelt target among good ones is refused (PEFT would adapt the others and drop it silently), with the
    model's linear layer names; one PEFT cannot adapt (the latent rows' head) is one line too, not a traceback."""
    from dgrpo.config import ConfigError

    for arch, targets, shown in (
        ("qwen2", ["q_proj", "foo_proj"], "'foo_proj' matches no module of this model (its linear layers: "),
        ("gpt2", ["q_proj"], "c_attn"),
        ("llama", ["lm_head"], "'lm_head' holds the latent markers' rows"),
        # a head tied to the input embeddings: the KL reference adapter failed with a traceback, and a merged export
        # folded the head's adapter into the embeddings too (a different model, without a word)
        ("qwen2", ["q_proj", "lm_head"], "'lm_head' is this model's output layer, which shares its weight"),
        ("qwen2", ["lm_head"], "'lm_head' is this model's output layer, which shares its weight"),
    ):
        lm = LatentLM.from_pretrained(base_dirs / arch)
        with pytest.raises(ConfigError, match=re.escape(shown)) as e:
            lora.apply_lora(lm, LoraConfig(r=4, target_modules=targets))
        assert str(e.value).startswith("invalid config value model.lora.target_modules: ") and "\n" not in str(e.value)
        assert lm.peft is None


@pytest.mark.parametrize(
    "arch, targets, shown",
    [
        (
            "qwen2",
            ["q_proj", "mlp"],
            "'mlp' is a Qwen2MLP (model.layers.0.mlp), not a layer LoRA adapts: name its "
            "linear layers (down_proj, gate_proj, up_proj), or all-linear",
        ),
        (
            "gpt2",
            ["attn"],
            "'attn' is a GPT2Attention (transformer.h.0.attn), not a layer LoRA adapts: name its "
            "linear layers (c_attn, c_proj)",
        ),
        (
            "llama",
            ["norm"],
            "'norm' is a LlamaRMSNorm (model.norm), not a layer LoRA adapts: name this model's linear "
            "layers (down_proj, gate_proj, k_proj, o_proj, ",
        ),
    ],
)
def test_a_target_that_is_a_block_or_a_norm_names_the_linear_layers_to_write(base_dirs, arch, targets, shown):
    """A block PEFT users name by its place (mlp, self_attn) or a norm: PEFT refuses it with the module's printout,
    of which the line kept 'ValueError: Target module Qwen2MLP(' and no reason; now what it is and what to name."""
    lm = LatentLM.from_pretrained(base_dirs / arch)
    with pytest.raises(ConfigError) as e:
        lora.apply_lora(lm, LoraConfig(r=4, target_modules=targets))
    assert str(e.value).startswith("invalid config value model.lora.target_modules: " + shown)
    assert "\n" not in str(e.value) and lm.peft is None


@pytest.mark.parametrize("targets", [["embed_tokens"], ["q_proj", "model.embed_tokens"]])
def test_an_adapter_on_tied_input_embeddings_is_one_config_line(base_dirs, targets):
    """The input embeddings of a model whose head shares their weight (the built-in Qwen2): PEFT adapted them alone
    (model.lora.train_latent_tokens false), but the merged export folded the adapter into the shared weight, so its
    head moved too and it answered otherwise than the adapter checkpoint (46 of 64 test answers unparseable)."""
    lm = LatentLM.from_pretrained(base_dirs / "qwen2")
    with pytest.raises(ConfigError, match=re.escape("is this model's input embeddings, which shares its weight")) as e:
        lora.apply_lora(lm, LoraConfig(r=4, target_modules=targets, train_latent_tokens=False))
    assert str(e.value).startswith("invalid config value model.lora.target_modules: ") and "\n" not in str(e.value)
    assert "KL reference" not in str(e.value) and lm.peft is None
    untied = LatentLM.from_pretrained(base_dirs / "llama")  # its own head: the embeddings alone are adapted, merged
    lora.apply_lora(untied, LoraConfig(r=4, target_modules=targets, train_latent_tokens=False))
    assert untied.peft is not None


@pytest.mark.parametrize("targets", [["q_proj", "lm_head"], ["model.embed_tokens"]])
def test_an_adapter_where_the_latent_rows_train_names_the_option_that_frees_it(base_dirs, targets):
    """An untied head or the input embeddings as a target, beside model.lora.train_latent_tokens (the markers' rows
    trained on those modules): PEFT's TypeError was quoted, naming no option; the line names the one that works."""
    lm = LatentLM.from_pretrained(base_dirs / "llama")
    with pytest.raises(ConfigError, match="or set model.lora.train_latent_tokens=false") as e:
        lora.apply_lora(lm, LoraConfig(r=4, target_modules=targets))
    assert str(e.value).startswith("invalid config value model.lora.target_modules: ") and lm.peft is None
    lora.apply_lora(lm, LoraConfig(r=4, target_modules=targets, train_latent_tokens=False))
    assert lm.peft is not None


def test_load_model_draws_new_adapters_from_its_seed(base_dirs):
    """load_model(seed=...) with model.lora.r set drew the adapters from torch's global RNG: two calls with the same
    seed gave different adapters (the command line seeds first; a script or notebook did not)."""
    from dgrpo.model.factory import load_model

    cfg = tiny_config(**{"model.lora.r": 4})

    def adapters(seed):
        torch.rand(7)  # whatever drew from torch before
        lm = load_model(cfg.model, cfg.task, init=str(base_dirs / "qwen2"), seed=seed)
        return lora.adapter_state(lm)

    a, b, c = adapters(0), adapters(0), adapters(1)
    assert all(torch.equal(a[k], b[k]) for k in a) and not all(torch.equal(a[k], c[k]) for k in a)


# -- a LoRA run's base moved, and the run resumed there ----------------------------------------------------------


def _adapter_run(base, out, **kw):
    """A run directory's adapter folders, as a LoRA run on ``base`` writes them: best/ and a resumable checkpoint."""
    from dgrpo.training.checkpoint import save_checkpoint

    lm = with_lora(base, **kw)
    lm.save_pretrained(out / "best")
    opt = torch.optim.AdamW([p for p in lm.model.parameters() if p.requires_grad])
    save_checkpoint(out, 1, lm=lm, optimizer=opt, state={"trainer": {}})
    return lm


@pytest.mark.parametrize("fingerprint", [True, False], ids=["fingerprinted", "no-fingerprint"])
def test_a_moved_base_is_named_again_by_the_runs_adapter_folders(base_dirs, tmp_path, fingerprint):
    """A LoRA run resumed on its base at a new place: its adapter folders named the old place (best/'s test at the
    end of the run failed every time). The same weights (by the adapters' fingerprint; without one, when the old
    place is gone) are named at the new place, every manifest kept consistent; the folders load as before."""
    import shutil

    from dgrpo.model.verified import verify
    from dgrpo.training.checkpoint import repoint_run_adapters

    shutil.copytree(base_dirs / "qwen2", tmp_path / "base")
    if not fingerprint:  # (a base dgrpo did not write: the adapters record no fingerprint of it)
        (tmp_path / "base" / "manifest.json").unlink()
    out = tmp_path / "run"
    lm = _adapter_run(tmp_path / "base", out)
    assert (lora.saved_fingerprint(out / "best") is not None) == fingerprint
    (tmp_path / "base").rename(tmp_path / "moved")
    moved, said = str((tmp_path / "moved").resolve()), []
    repoint_run_adapters(out, moved, said.append)
    how = "the same weights" if fingerprint else "not compared"
    assert said == [
        f"dgrpo: the base model moved from {tmp_path / 'base'} to {moved} ({how}"
        + ("" if fingerprint else ": the adapters record no fingerprint of its weights")
        + "): best/, checkpoints/step-00000001/ now name its new place"
    ]
    step = out / "checkpoints" / "step-00000001"
    for folder, whole in ((out / "best", out / "best"), (step / "model", step)):
        assert lora.adapter_base(folder) == moved
        assert verify(whole) is None and verify(folder) is None  # (step-N's manifest and its model/'s)
        assert torch.equal(logprobs(LatentLM.from_pretrained(whole)), logprobs(lm))
    assert sorted(p.name for p in out.iterdir()) == ["best", "checkpoints"]  # (no temporary folder left)
    said.clear()
    repoint_run_adapters(out, moved, said.append)  # named already: nothing to do
    assert said == []


def test_a_run_folder_on_a_moved_base_is_told_the_resume_that_points_the_run_there(base_dirs, tmp_path):
    """eval of a LoRA run's best/ whose base moved said only to edit adapter_config.json and delete the manifest by
    hand; a run's folders are pointed to the new place by resuming the run with --init there (README), said first.
    A folder outside a run (a copy) keeps the hand-made route alone."""
    import shutil

    from dgrpo.model.verified import CheckpointError

    shutil.copytree(base_dirs / "qwen2", tmp_path / "base")
    out = tmp_path / "run"
    _adapter_run(tmp_path / "base", out)
    (out / "config.json").write_text("{}")
    shutil.copytree(out / "best", tmp_path / "copy")
    (tmp_path / "base").rename(tmp_path / "moved")
    resume = f"if the base moved, resume the run {out} with --init at the base's new place and --allow-config-change"
    for folder in (out / "best", out / "checkpoints" / "step-00000001"):
        with pytest.raises(CheckpointError, match=re.escape(resume)):
            LatentLM.from_pretrained(folder)
    with pytest.raises(CheckpointError, match=r"if the base moved, point base_model_name_or_path in "):
        LatentLM.from_pretrained(tmp_path / "copy")


def test_adapter_folders_trained_on_other_weights_keep_naming_their_base(base_dirs, tokenizer, tmp_path):
    """Only the same weights are named at the new place: folders whose fingerprint is another base's, or without a
    fingerprint and naming a base still where they say, are left as they are."""
    import shutil

    from dgrpo.training.checkpoint import repoint_run_adapters

    make_lm(tokenizer, "qwen2", seed=1).save_pretrained(tmp_path / "other")  # the same shape, other weights
    shutil.copytree(base_dirs / "qwen2", tmp_path / "base")
    shutil.copytree(base_dirs / "qwen2", tmp_path / "plain")
    (tmp_path / "plain" / "manifest.json").unlink()  # (a base dgrpo did not write: no fingerprint)
    for base in ("base", "plain"):
        out = tmp_path / f"run-{base}"
        _adapter_run(tmp_path / base, out)
        before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
        said: list[str] = []
        repoint_run_adapters(out, str(tmp_path / "other"), said.append)
        assert said == [] and lora.adapter_base(out / "best") == str(tmp_path / base)
        assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_a_folder_its_manifest_does_not_vouch_for_is_not_pointed_to_the_moved_base(base_dirs, tmp_path):
    """Pointing a folder to the base's new place rewrites its manifest: one whose adapter_config.json was changed by
    hand (lora_alpha 8 -> 64, still JSON) passed its checksum again after the move. Such a folder is left as it is."""
    import json
    import shutil

    from dgrpo.model.verified import verify
    from dgrpo.training.checkpoint import repoint_run_adapters

    shutil.copytree(base_dirs / "qwen2", tmp_path / "base")
    out = tmp_path / "run"
    _adapter_run(tmp_path / "base", out)
    config = out / "best" / "adapter_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "lora_alpha": 64}))
    (tmp_path / "base").rename(tmp_path / "moved")
    moved, said = str((tmp_path / "moved").resolve()), []
    repoint_run_adapters(out, moved, said.append)
    assert said[0] == (
        f"dgrpo: {out / 'best'} still names the base at {tmp_path / 'base'}: not intact (checksum mismatch in "
        "adapter_config.json), it is left as it is"
    )
    assert "checkpoints/step-00000001/ now name its new place" in said[1]
    assert lora.adapter_base(out / "best") == str(tmp_path / "base")
    assert verify(out / "best") == "checksum mismatch in adapter_config.json"
    (out / "best" / "manifest.json").unlink()  # (no manifest: nothing vouches, as the moved-base hint advises doing)
    repoint_run_adapters(out, moved, said.append)
    assert lora.adapter_base(out / "best") == moved and not (out / "best" / "manifest.json").exists()


@pytest.mark.parametrize(
    "given, says",
    [
        ({"r": 8}, "resume with --set model.lora.r=4 (to train another adapter"),
        ({"alpha": 16.0}, "resume with --set model.lora.alpha=8 (to"),
        ({"target_modules": ["q_proj"]}, "model.lora.target_modules as {model}/adapter_config.json lists them"),
        (
            {"target_modules": ["q_proj"], "saved": ["k_proj", "v_proj"]},
            "--set 'model.lora.target_modules=[k_proj,v_proj]'",
        ),
        ({"train_latent_tokens": False}, "resume with --set model.lora.train_latent_tokens=true (to"),
    ],
    ids=["r", "alpha", "target_modules", "few_target_modules", "train_latent_tokens"],
)
def test_a_checkpoint_of_another_adapter_is_refused_on_the_adapters_themselves(base_dirs, tmp_path, given, says):
    """A resume whose model.lora builds another adapter than the checkpoint's: another rank or other targets had
    each checkpoint skipped as damaged (the line advised --resume never, which deletes the run), another alpha
    rescaled the saved adapter. Refused in one line, on the adapters (the config a run recorded may not be the
    adapter's: an --init adapter's own settings win), naming the settings that resume it."""
    from dgrpo.config import ConfigError
    from dgrpo.training.checkpoint import list_checkpoints, read_checkpoint
    from dgrpo.training.wording import command_line_words

    out, given = tmp_path / "run", dict(given)
    saved = {"target_modules": given.pop("saved")} if "saved" in given else {}
    _adapter_run(base_dirs / "qwen2", out, **saved)
    ckpt = list_checkpoints(out)[-1]

    def resumed_with(**settings):
        lm = LatentLM.from_pretrained(base_dirs / "qwen2")
        lora.apply_lora(lm, LoraConfig(**{"r": 4, "alpha": 8.0, **settings}))
        opt = torch.optim.AdamW([p for p in lm.model.parameters() if p.requires_grad])
        return read_checkpoint(ckpt, lm=lm, optimizer=opt)

    resumed_with(**saved)  # (the same adapter)
    with pytest.raises(ConfigError) as e, command_line_words():  # (from Python: tests/test_wording2.py)
        resumed_with(**given)
    message = str(e.value)
    assert message.startswith(f"{ckpt} holds a LoRA adapter that this run's model.lora would not build: ")
    assert says.format(model=ckpt / "model") in message and "\n" not in message


@pytest.mark.parametrize(
    "given, refused",
    [
        ({"model.lora.r": 8}, "resume with --set model.lora.r=4 (to train another adapter"),
        ({"model.lora.alpha": 16.0}, "resume with --set model.lora.alpha=8 (to"),
        (
            {"model.lora.target_modules": "[q_proj]"},
            "resume with --set 'model.lora.target_modules=[k_proj,q_proj,v_proj]'",
        ),
        ({"model.lora.train_latent_tokens": "false"}, "resume with --set model.lora.train_latent_tokens=true (to"),
        ({}, None),  # (the same adapter: loaded)
        ({"model.lora.target_modules": "[all-linear]"}, None),  # (PEFT expands it on the loaded model)
        ({"model.lora.r": 8, "init": "adapter"}, None),  # (an --init adapter's own settings win: the same adapter)
    ],
    ids=["r", "alpha", "target_modules", "train_latent_tokens", "same", "all_linear", "init_adapter"],
)
def test_a_resume_that_would_build_another_adapter_is_refused_before_the_model_loads(
    base_dirs, tmp_path, monkeypatch, run_cli, given, refused
):
    """dgrpo grpo / sft resuming a LoRA run with a model.lora that builds another adapter than its checkpoints': the
    refusal came after the data were read and the base model loaded (minutes for a 1.5B base). It now comes from the
    files alone, before anything is loaded; what they cannot tell (all-linear targets, an --init adapter's own
    settings, which win) is left to the check once the model is loaded."""
    given = dict(given)
    init = tmp_path / "adapter" if given.pop("init", None) else base_dirs / "qwen2"
    targets = {"target_modules": ["k_proj", "q_proj", "v_proj"]}
    lm = _adapter_run(base_dirs / "qwen2", tmp_path / "run", **targets)
    lm.save_pretrained(tmp_path / "adapter")
    ckpt = tmp_path / "run" / "checkpoints" / "step-00000001"

    def loads(*args, **kwargs):
        raise CheckpointError("the model was loaded")

    monkeypatch.setattr(LatentLM, "from_pretrained", loads)
    lora_sets = {"model.lora.r": 4, "model.lora.alpha": 8.0, "model.lora.target_modules": "[q_proj,k_proj,v_proj]"}
    args = tiny_args(**{**lora_sets, **given, "task.n_train": 64, "task.n_valid": 8, "task.n_test": 8})
    r = run_cli("grpo", "--init", init, "--out", tmp_path / "run", *args)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    if refused is None:
        assert "the model was loaded" in r.stderr
        return
    said = f"{ckpt} holds a LoRA adapter that this run's model.lora would not build: "
    assert said in r.stderr and refused in r.stderr, r.stderr


def test_a_resume_on_other_base_weights_is_refused_before_the_model_loads(
    base_dirs, tokenizer, tmp_path, monkeypatch, run_cli
):
    """A LoRA run resumed on a base whose weights are not those its adapter was trained on (another model saved at
    the base's place): refused from the fingerprints, before the data and the model are read (it was after)."""
    import shutil

    shutil.copytree(base_dirs / "qwen2", tmp_path / "base")
    _adapter_run(tmp_path / "base", tmp_path / "run")
    ckpt = tmp_path / "run" / "checkpoints" / "step-00000001"

    def loads(*args, **kwargs):
        raise CheckpointError("the model was loaded")

    monkeypatch.setattr(LatentLM, "from_pretrained", loads)
    sets = {"model.lora.r": 4, "model.lora.alpha": 8.0, "task.n_train": 64, "task.n_valid": 8, "task.n_test": 8}
    r = run_cli("grpo", "--init", tmp_path / "base", "--out", tmp_path / "run", *tiny_args(**sets))
    assert "the model was loaded" in r.stderr  # (the same weights: loaded)
    shutil.rmtree(tmp_path / "base")
    make_lm(tokenizer, seed=1).save_pretrained(tmp_path / "base")  # (other weights at the base's place)
    r = run_cli("grpo", "--init", tmp_path / "base", "--out", tmp_path / "run", *tiny_args(**sets))
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    said = f"{ckpt}: its LoRA adapter was trained on other weights than those of its base loaded now, {tmp_path}/base"
    assert said in r.stderr


def test_an_export_whose_merged_weights_overflow_its_dtype_is_refused(base_dirs, tmp_path, capsys):
    """float16 ends at 65504: a merged weight past it was written as inf without a word."""
    from dgrpo.cli import main

    lm = with_lora(base_dirs / "qwen2")
    with torch.no_grad():
        next(p for n, p in lm.model.named_parameters() if "lora_B" in n).fill_(1e5)
    lm.save_pretrained(tmp_path / "adapter")
    capsys.readouterr()
    assert (
        main(["export", str(tmp_path / "adapter"), "--merge", "--dtype", "float16", "--out", str(tmp_path / "x")]) == 2
    )
    assert (
        "range once merged (inf): nothing written; export with --dtype bfloat16 or float32" in capsys.readouterr().err
    )
    assert not (tmp_path / "x").exists()
    assert (
        main(["export", str(tmp_path / "adapter"), "--merge", "--dtype", "float32", "--out", str(tmp_path / "y")]) == 0
    )


def test_an_export_whose_merged_weights_hold_nan_is_refused_without_dtype_advice(base_dirs, tmp_path, capsys):
    """NaN was reported as a value past float16's range, with the advice to export in a wider dtype: none helps."""
    from dgrpo.cli import main

    lm = with_lora(base_dirs / "qwen2")
    with torch.no_grad():
        next(p for n, p in lm.model.named_parameters() if "lora_B" in n)[0, 0] = float("nan")
    lm.save_pretrained(tmp_path / "adapter")
    capsys.readouterr()
    for dtype in ("float16", "float32"):
        out = tmp_path / dtype
        assert main(["export", str(tmp_path / "adapter"), "--merge", "--dtype", dtype, "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert (
            "holds NaN once merged: nothing written; the base model or the adapter is broken (no --dtype helps)" in err
        )
        assert "export with" not in err and err.count("\n") == 1 and not out.exists()


@pytest.mark.parametrize(
    ("value", "dtype", "says"),
    [
        (
            float("nan"),
            torch.float16,
            "holds NaN once merged: nothing written; the base model or the adapter is broken",
        ),
        (float("inf"), torch.float32, "holds inf in float32 once merged: nothing written; the base model or the"),
        (
            float("inf"),
            torch.float16,
            "past torch.float16's range once merged (inf): nothing written; export with --dtype bfloat16 or float32",
        ),
        (
            3.4e38,
            torch.bfloat16,
            "past torch.bfloat16's range once merged (inf): nothing written; export with --dtype float32",
        ),
    ],
    ids=["nan", "inf-in-float32", "float16-overflow", "bfloat16-overflow"],
)
def test_the_export_refusal_names_what_is_not_finite(value, dtype, says):
    """Only inf in a dtype narrower than float32 (the merge's) is a question of range that another dtype answers."""
    from dgrpo.cli.convert import refuse_non_finite
    from dgrpo.model.verified import CheckpointError

    model = torch.nn.Linear(2, 2)
    with torch.no_grad():
        model.weight[0, 0] = value
    with pytest.raises(CheckpointError) as e:
        refuse_non_finite(model.to(dtype))
    assert str(e.value).startswith("weight ") and says in str(e.value) and "\n" not in str(e.value)
    refuse_non_finite(torch.nn.Linear(2, 2).to(dtype))  # (finite: no word)


def test_the_alpha_to_resume_with_is_written_as_it_reads_back():
    assert lora._as_set(8.0) == "8" and lora._as_set(12.3456789) == "12.3456789" and lora._as_set(False) == "false"


@pytest.mark.slow
def test_a_lora_run_resumed_on_its_moved_base_finishes_and_other_weights_are_refused(sft_checkpoint, tmp_path, run_cli):
    """The probe's case: ``dgrpo grpo --init BASE`` under LoRA, BASE moved, the run resumed with --init at its new
    place (--allow-config-change: model.name_or_path changed). best/ and the earlier checkpoints still named the old
    place, and the test of best/ at the end failed every time (exit 2). The run now finishes, each adapter folder
    naming the new place. Another model at the --init (the adapter would go on training on other weights) is refused
    at the start, in one line, before anything is written."""
    import json
    import shutil

    from dgrpo.run_layout import BEST_DIR, results_folder

    shutil.copytree(sft_checkpoint, tmp_path / "base")
    out = tmp_path / "run"
    sets = {
        **{"model.lora.r": 4, "grpo.steps": 2, "grpo.save_every": 1, "grpo.keep_last": 5, "grpo.eval_every": 1},
        **{"grpo.warmup_steps": 0, "grpo.lr": 1e-12, "grpo.prompts_per_step": 4, "task.n_valid": 8, "task.n_test": 8},
    }  # (an lr of ~0: the validation accuracy stays, and best/ stays the step-0 model, saved before the resume)
    r = run_cli("grpo", "--init", tmp_path / "base", "--out", out, *tiny_args(**sets))
    assert r.returncode == 0, r.stderr

    (tmp_path / "base").rename(tmp_path / "moved")
    shorter = [*tiny_args(**{**sets, "grpo.steps": 1}), "--allow-config-change"]  # (refused after the checkpoint loads)
    r = run_cli("grpo", "--init", tmp_path / "moved", "--out", out, *shorter)
    assert r.returncode == 2 and "a run cannot be shortened" in r.stderr, r.stderr
    assert lora.adapter_base(out / "best") == str(tmp_path / "base")  # (a refused resume writes nothing)
    longer = [*tiny_args(**{**sets, "grpo.steps": 3}), "--allow-config-change"]
    r = run_cli("grpo", "--init", tmp_path / "moved", "--out", out, *longer)
    assert r.returncode == 0, r.stderr
    assert json.loads((out / "summary.json").read_text())["best_step"] == 0  # (best/: from before the resume)
    assert (out / results_folder(BEST_DIR)).is_dir()  # its test ran
    moved = str((tmp_path / "moved").resolve())
    assert f"dgrpo: the base model moved from {tmp_path / 'base'} to {moved} (the same weights)" in r.stdout
    folders = [out / "best", out / "final", *(p / "model" for p in sorted((out / "checkpoints").iterdir()))]
    assert len(folders) == 5 and all(lora.adapter_base(f) == moved for f in folders)

    other = LatentLM.from_pretrained(tmp_path / "moved")
    with torch.no_grad():
        next(other.model.parameters()).add_(0.01)
    other.save_pretrained(tmp_path / "other")
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != ".lock"}
    r = run_cli("grpo", "--init", tmp_path / "other", "--out", out, *longer)  # (allowed to change the config)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    said = "its LoRA adapter was trained on other weights than those of its base loaded now, "
    assert said in r.stderr and "resume on the weights it was trained on (--init naming where they are now)" in r.stderr
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != ".lock"} == before


def test_the_run_records_the_adapter_dropout_it_uses(base_dirs, tmp_path):
    """model.lora.dropout > 0 is replaced by 0 (exact replay), and the run's config recorded the value given: it now
    records the 0 the adapters use, for new adapters, an adapter checkpoint trained further, and a model handed to a
    trainer with its own adapters."""
    from dgrpo.model.factory import load_model, lora_for_training

    cfg = tiny_config(**{"model.lora.r": 4, "model.lora.alpha": 8.0, "model.lora.dropout": 0.1})
    with pytest.warns(UserWarning, match="model.lora.dropout=0.1 replaced by 0"):
        lm = load_model(cfg.model, cfg.task, init=str(base_dirs / "qwen2"))
    assert cfg.model.lora.dropout == 0.0 == lm.peft.peft_config[lora.POLICY].lora_dropout
    lm.save_pretrained(tmp_path / "adapter")
    again = tiny_config(**{"model.lora.r": 4, "model.lora.alpha": 8.0, "model.lora.dropout": 0.1})
    with pytest.warns(UserWarning, match="model.lora.dropout=0.1 replaced by 0"):
        load_model(again.model, again.task, init=str(tmp_path / "adapter"))
    assert again.model.lora.dropout == 0.0
    handed = tiny_config(**{"model.lora.dropout": 0.1})  # (r = 0: the model's own adapters train)
    lora_for_training(lm, handed.model.lora)
    assert (handed.model.lora.r, handed.model.lora.dropout) == (4, 0.0)
    rows = tiny_config()  # (an adapter without the latent rows, handed over: recorded so, as an --init one is)
    lora_for_training(with_lora(base_dirs / "qwen2", train_latent_tokens=False), rows.model.lora)
    assert rows.model.lora.train_latent_tokens is False


@pytest.mark.parametrize("arch", ["qwen2", "gpt2"])
def test_a_rank_beyond_the_models_width_is_one_line_before_peft(base_dirs, arch):
    """model.lora.r=100000000 ran out of memory inside peft.get_peft_model, in a traceback."""
    lm = LatentLM.from_pretrained(base_dirs / arch)
    width = lm.model.config.hidden_size
    with pytest.raises(
        ConfigError,
        match=rf"^invalid config value model.lora.r: 100000000 is more than the model's "
        rf"width \(hidden_size {width}\)",
    ):
        lora.apply_lora(lm, LoraConfig(r=100_000_000, alpha=8.0))
    assert lm.peft is None
    lora.apply_lora(lm, LoraConfig(r=width, alpha=8.0))  # (at the width: allowed)
