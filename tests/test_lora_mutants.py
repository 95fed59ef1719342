"""What mutation testing of ``dgrpo.model.lora`` found untested: each test kills a mutant that the other tests let
live (the mutant named in its docstring). Tiny models (width 32) saved once for the module."""

import pytest
import torch

from conftest import make_lm

pytest.importorskip("peft")

from dgrpo.config import ConfigError, LoraConfig  # noqa: E402
from dgrpo.model import lora  # noqa: E402
from dgrpo.model.latent_lm import LatentLM  # noqa: E402


@pytest.fixture(scope="module")
def bases(tokenizer, tmp_path_factory):
    """Tiny models saved on disk (LoRA adapts a model with a path): a tied Qwen2, an untied Llama."""
    root = tmp_path_factory.mktemp("lora-mutants")
    for arch in ("qwen2", "llama"):
        make_lm(tokenizer, arch).save_pretrained(root / arch)
    return root


def test_a_rank_one_past_the_width_is_refused(bases):
    """``model.lora.r`` = hidden_size + 1 is refused, hidden_size is not (mutant: ``r > width + 1``)."""
    lm = LatentLM.from_pretrained(bases / "qwen2")
    width = lm.model.config.hidden_size
    with pytest.raises(ConfigError, match=rf"^invalid config value model.lora.r: {width + 1} is more than the model's"):
        lora.check_rank(lm, width + 1)
    lora.check_rank(lm, width)


def test_a_target_is_a_whole_dotted_part_of_a_module_name(bases):
    """PEFT matches a list entry to the full name or its last dotted parts: ``proj`` names no module of a model whose
    layers are ``q_proj``, ``o_proj``..., and is refused by dgrpo's own line (mutant: a bare suffix matched, so
    ``proj`` passed, and PEFT's error was quoted instead)."""
    lm = LatentLM.from_pretrained(bases / "qwen2")
    with pytest.raises(ConfigError, match=r"'proj' matches no module of this model \(its linear layers: "):
        lora.apply_lora(lm, LoraConfig(r=4, target_modules=["q_proj", "proj"]))
    assert lm.peft is None
    assert lora._names("self_attn.q_proj", "model.layers.0.self_attn.q_proj")
    assert not lora._names("proj", "model.layers.0.self_attn.q_proj")


def test_the_latent_rows_beside_an_adapter_reload_each_under_its_own_marker(tokenizer, tmp_path):
    """``latent_rows.safetensors`` (an adapter without trainable latent rows, on a plain Llama base, whose head is
    untied) reloads each marker's rows under that marker, rows made distinct here as SFT leaves them (a plain base's
    new rows start as one mean, so a swap went unseen; mutant: the rows saved as start, end, latent and read back as
    start, latent, end)."""
    import copy

    from dgrpo.model.tiny import build_tiny_model

    plain = tmp_path / "plain"
    tiny = {"hidden_size": 32, "num_layers": 2, "num_heads": 4, "intermediate_size": 64}
    build_tiny_model("llama", len(tokenizer), **tiny).save_pretrained(plain)
    copy.deepcopy(tokenizer).save_pretrained(plain)
    lm = LatentLM.from_pretrained(plain)
    lora.apply_lora(lm, LoraConfig(r=4, alpha=8.0, train_latent_tokens=False))
    ids = [lm.start_id, lm.latent_id, lm.end_id]
    with torch.no_grad():
        lm.model.get_input_embeddings().weight[ids] = torch.arange(3.0)[:, None]  # rows of 0, 1, 2
        lm.model.get_output_embeddings().weight[ids] = torch.arange(3.0)[:, None] + 10.0  # the head's: 10, 11, 12
    lm.save_pretrained(tmp_path / "adapter")
    again = LatentLM.from_pretrained(tmp_path / "adapter")
    for get in ("get_input_embeddings", "get_output_embeddings"):
        assert torch.equal(getattr(again.model, get)().weight[ids], getattr(lm.model, get)().weight[ids]), get


def test_latent_rows_of_another_shape_are_refused_in_one_line(bases):
    """``latent_rows.safetensors`` rows that do not fit the model (another width, or a table it lacks) are a
    CheckpointError naming the file, before anything is written (mutant: the shape check dropped, torch's error)."""
    from dgrpo.model.verified import CheckpointError

    lm = LatentLM.from_pretrained(bases / "llama")
    rows = lora._marker_rows(lm)
    before = {k: v.clone() for k, v in rows.items()}
    name = next(iter(rows))
    for bad in ({name: torch.zeros(3, 7)}, {"no_such_table": rows[name]}):
        with pytest.raises(CheckpointError, match=r"^latent_rows.safetensors: \S+ rows of shape \(3, (7|32)\) do not"):
            lora._set_marker_rows(lm, bad)
    assert all(torch.equal(lora._marker_rows(lm)[k], before[k]) for k in before)


def test_an_adapter_state_that_does_not_fit_is_refused_whole(bases):
    """``load_adapter_state`` checks before it copies: a state missing a tensor is refused and nothing moves (mutant:
    the check dropped; PEFT loads a partial state without a word)."""
    from dgrpo.model.verified import CheckpointError

    lm = LatentLM.from_pretrained(bases / "qwen2")
    lora.apply_lora(lm, LoraConfig(r=4, alpha=8.0))
    before = lora.adapter_state(lm)
    partial = {k: v + 1.0 for k, v in list(before.items())[1:]}
    with pytest.raises(CheckpointError):
        lora.load_adapter_state(lm, partial)
    now = lora.adapter_state(lm)
    assert all(torch.equal(now[k], before[k]) for k in before)


def test_the_adapter_names_the_base_dgrpo_was_given(tokenizer, tmp_path):
    """The adapter config names ``lm.name_or_path`` (a model built in memory, saved, and named so: PEFT's own choice,
    the Hugging Face model's empty name, left an adapter that names no base; mutant: lm.name_or_path not set)."""
    lm = make_lm(tokenizer, "qwen2")
    lm.save_pretrained(tmp_path / "base")
    lm.name_or_path = str(tmp_path / "base")
    lora.apply_lora(lm, LoraConfig(r=4, alpha=8.0))
    lora.save_adapter(lm, tmp_path / "adapter")
    assert lora.adapter_base(tmp_path / "adapter") == str(tmp_path / "base")


def test_the_saved_adapters_header_keeps_the_tensors_8_byte_aligned():
    """``_sorted_metadata`` pads the rewritten header with spaces to a multiple of 8, as safetensors does, whatever
    the metadata's length; the tensors read back unchanged (mutant: the padding dropped)."""
    from safetensors.torch import load, save

    tensors = {"a": torch.arange(6.0).reshape(2, 3), "b": torch.ones(5, dtype=torch.bfloat16)}
    for n in range(8):
        data = lora._sorted_metadata(save(tensors, metadata={"z": "x" * n, "format": "pt"}))
        assert int.from_bytes(data[:8], "little") % 8 == 0, n
        back = load(data)
        assert back.keys() == tensors.keys() and all(torch.equal(back[k], tensors[k]) for k in tensors)


def test_the_base_fingerprint_is_of_its_own_weight_files(tmp_path, monkeypatch):
    """The fingerprint of a base dgrpo wrote is of its manifest's top-level weight entries: the shard index counts,
    a file in a subfolder (an evaluation's, a copy's), other files and the manifest's order do not, and the weights
    are not hashed again when a manifest lists them (mutants: nested files counted; the index not; the weights
    always hashed; the digests in the manifest's order)."""
    import json

    base = tmp_path / "base"
    base.mkdir()

    def fingerprint(**manifest):
        (base / "manifest.json").write_text(json.dumps({k.replace("__", "/"): v for k, v in manifest.items()}))
        return lora.current_fingerprint(str(base))

    monkeypatch.setattr(lora, "sha256", lambda path: pytest.fail(f"{path} hashed"))
    weights = {"model-00001-of-00002.safetensors": "a1", "model-00002-of-00002.safetensors": "a2"}
    one = fingerprint(**weights, **{"model.safetensors.index.json": "i1", "config.json": "c1"})
    assert one is not None
    assert (
        fingerprint(
            **weights, **{"model.safetensors.index.json": "i1", "config.json": "c2", "eval__x.safetensors": "e"}
        )
        == one
    )
    assert fingerprint(**weights, **{"model.safetensors.index.json": "i2", "config.json": "c1"}) != one
    backwards = dict(reversed([*weights.items(), ("model.safetensors.index.json", "i1")]))
    assert fingerprint(**backwards) == one  # (a manifest in another order: the same weights)


def test_up_to_eight_saved_target_modules_are_listed_for_set(bases, tmp_path):
    """How a saved adapter differs: 8 target modules are written out as ``--set`` takes them, 9 are left to the
    folder's adapter_config.json (mutant: ``< 8``, 8 names referred to the file)."""
    import json

    lm = LatentLM.from_pretrained(bases / "qwen2")
    lora.apply_lora(lm, LoraConfig(r=4, alpha=8.0))
    saved = lora.adapter_shape(lm.peft.peft_config[lora.POLICY])
    for n, says in ((8, "--set 'model.lora.target_modules=[m0,m1,m2,m3,m4,m5,m6,m7]'"), (9, "as ")):
        (tmp_path / str(n)).mkdir()
        config = {"r": saved["r"], "lora_alpha": saved["alpha"], "target_modules": [f"m{i}" for i in range(n)]}
        config["trainable_token_indices"] = lora.latent_token_rows(lm)
        (tmp_path / str(n) / lora.ADAPTER_CONFIG).write_text(json.dumps(config))
        assert lora.other_adapter(tmp_path / str(n), lm, True) == (
            says if n == 8 else f"model.lora.target_modules as {tmp_path / '9' / lora.ADAPTER_CONFIG} lists them"
        )


def test_an_adapter_config_without_its_base_is_one_line(tmp_path):
    """An adapter_config.json that names no base model is said so (mutant: the check dropped, the missing name
    looked up as a model called 'None')."""
    import json

    from dgrpo.model.verified import CheckpointError

    for config in ({"r": 4}, {"r": 4, "base_model_name_or_path": None}, {"r": 4, "base_model_name_or_path": ""}):
        (tmp_path / lora.ADAPTER_CONFIG).write_text(json.dumps(config))
        with pytest.raises(CheckpointError, match=r"adapter_config.json names no base model \(base_model_name_or_pa"):
            lora.adapter_base(tmp_path)


def test_an_adapter_trained_with_dropout_elsewhere_loads_without_it(bases, tmp_path):
    """An adapter whose config has lora_dropout > 0 (trained outside dgrpo) loads with dropout 0, as every replay
    needs (mutant: the saved dropout kept, redrawn at every forward)."""
    import json

    lm = LatentLM.from_pretrained(bases / "qwen2")
    lora.apply_lora(lm, LoraConfig(r=4, alpha=8.0))
    lm.save_pretrained(tmp_path / "adapter")
    config = tmp_path / "adapter" / lora.ADAPTER_CONFIG
    config.write_text(json.dumps({**json.loads(config.read_text()), "lora_dropout": 0.5}))
    (tmp_path / "adapter" / "manifest.json").unlink()  # (it holds the edited file's checksum)
    again = LatentLM.from_pretrained(tmp_path / "adapter")
    assert again.peft.peft_config[lora.POLICY].lora_dropout == 0.0


def test_adapters_are_not_put_on_a_model_twice(bases):
    """A second ``apply_lora`` on a model with adapters is refused, and its adapter is left as it was (mutant: the
    check dropped, PEFT wrapped the adapted model again)."""
    lm = LatentLM.from_pretrained(bases / "qwen2")
    lora.apply_lora(lm, LoraConfig(r=4, alpha=8.0))
    wrapper, before = lm.peft, lora.adapter_state(lm)
    with pytest.raises(ValueError, match="^this model already has LoRA adapters$"):
        lora.apply_lora(lm, LoraConfig(r=2, alpha=4.0))
    assert lm.peft is wrapper and lora.adapter_state(lm).keys() == before.keys()


def test_a_merged_model_names_no_base_and_takes_no_adapter_as_if_it_were_one(bases):
    """After ``merge_into_base`` the weights are base + adapter, no longer the base's: the model names none, and new
    adapters are refused as on a model built in memory (mutant: the base's name kept, so a new adapter named the
    base, whose weights it was not trained on)."""
    lm = LatentLM.from_pretrained(bases / "qwen2")
    lora.apply_lora(lm, LoraConfig(r=4, alpha=8.0))
    lora.merge_into_base(lm)
    assert lm.peft is None and lm.name_or_path is None
    with pytest.raises(ConfigError, match="this one was built in memory: save it first"):
        lora.apply_lora(lm, LoraConfig(r=4, alpha=8.0))


def test_a_second_reference_is_the_first_overwritten(bases):
    """``add_reference`` on a model that has one (a run stopped in the process, then started again) copies the policy
    adapter of that moment into it (mutant: the adapter added again, which PEFT refuses)."""
    lm = LatentLM.from_pretrained(bases / "qwen2")
    lora.apply_lora(lm, LoraConfig(r=4, alpha=8.0))
    lora.add_reference(lm)
    with torch.no_grad():
        for name, p in lm.model.named_parameters():
            if "lora_B" in name and f".{lora.POLICY}." in name:
                p.add_(0.1)
    lora.add_reference(lm)
    policy, reference = lora.adapter_state(lm), lora.adapter_state(lm, lora.REFERENCE)
    assert policy.keys() == reference.keys() and all(torch.equal(policy[k], reference[k]) for k in policy)
    assert any("lora_B" in k and bool(policy[k].abs().sum() > 0) for k in policy)
    assert sum(p.numel() for p in lm.model.parameters() if p.requires_grad) == sum(v.numel() for v in policy.values())


def test_saved_target_modules_given_as_a_pattern_are_left_to_the_adapter_config(bases, tmp_path):
    """A saved adapter whose target_modules is PEFT's regex string (a short one: ``q_proj``) is not spelt as a list
    for ``--set``, which would name other modules: its adapter_config.json is named (mutant: any target_modules
    of up to 8 characters listed)."""
    import json

    lm = LatentLM.from_pretrained(bases / "qwen2")
    lora.apply_lora(lm, LoraConfig(r=4, alpha=8.0))
    saved = lora.adapter_shape(lm.peft.peft_config[lora.POLICY])
    config = {"r": saved["r"], "lora_alpha": saved["alpha"], "target_modules": "q_proj"}
    config["trainable_token_indices"] = lora.latent_token_rows(lm)
    file = tmp_path / lora.ADAPTER_CONFIG
    file.write_text(json.dumps(config))
    assert lora.other_adapter(tmp_path, lm, True) == f"model.lora.target_modules as {file} lists them"


def test_the_init_warning_writes_out_every_given_target_module():
    """--init of an adapter with a model.lora of other targets: the warning writes the given ones out, however many
    (they have no file to be named by; mutant: more than 8 said to be listed by 'None')."""
    import warnings
    from types import SimpleNamespace

    from dgrpo.model import factory

    saved = SimpleNamespace(r=4, lora_alpha=8.0, target_modules={"q_proj", "v_proj"}, trainable_token_indices=None)
    lm = SimpleNamespace(peft=SimpleNamespace(peft_config={lora.POLICY: saved}), loaded_from=None)
    given = [f"m{i}" for i in range(9)]
    cfg = LoraConfig(r=4, alpha=8.0, target_modules=given, dropout=0.0, train_latent_tokens=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        factory.configure_lora(lm, cfg)
    (message,) = [str(w.message) for w in caught]
    assert f"target_modules=[{','.join(given)}], train_latent_tokens=False) differs" in message
    assert "target_modules=[q_proj,v_proj], train_latent_tokens=False): training continues" in message


def test_an_init_adapter_trained_on_records_its_own_targets_whether_or_not_model_lora_differs():
    """--init of an adapter under the default all-linear (which matches any adapter's targets, so no warning) records
    the adapter's own targets, as a differing model.lora does: the run's config says what it trains, and a resume
    under the values its first command warned about did not list target_modules as changed (all-linear recorded
    at the resume, the adapter's list at the start)."""
    import warnings
    from types import SimpleNamespace

    from dgrpo.model import factory

    saved = SimpleNamespace(r=4, lora_alpha=8.0, target_modules={"v_proj", "q_proj"}, trainable_token_indices=None)
    lm = SimpleNamespace(peft=SimpleNamespace(peft_config={lora.POLICY: saved}), loaded_from=None)
    recorded = []
    for r in (8, 4):  # the start, whose r differs (warned), then a resume under the adapter's own r (silent)
        cfg = LoraConfig(r=r, alpha=8.0, target_modules=["all-linear"], dropout=0.0, train_latent_tokens=False)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            factory.configure_lora(lm, cfg)
        assert len(caught) == (r != 4)
        recorded.append((cfg.r, cfg.target_modules))
    assert recorded == [(4, ["q_proj", "v_proj"])] * 2
