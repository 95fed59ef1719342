"""Building the LatentLM a config names (:mod:`dgrpo.model.factory`): the built-in model's shape, dtype and seed,
LoRA only for training, what an adapter's settings write into the config, and the hints and warnings of the
loading options (gaps found by mutation testing)."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest
import torch

from dgrpo.config import Config, LoraConfig, load_config
from dgrpo.model import factory


def _cfg(*sets: str) -> Config:
    return load_config(Config, "tiny.yaml", list(sets))


def test_the_built_in_model_has_the_configs_shape_dtype_and_seed():
    """model.num_heads / hidden_size / num_layers shape the built-in model; model.dtype=bfloat16 makes its weights
    bf16; ``seed`` draws them (same seed: same weights; another: others)."""
    cfg = _cfg("model.num_heads=2", "model.hidden_size=32", "model.num_layers=1", "model.dtype=bfloat16")
    lm = factory.load_model(cfg.model, cfg.task, seed=3, training=False)
    config = lm.model.config
    assert (config.num_attention_heads, config.hidden_size, config.num_hidden_layers) == (2, 32, 1)
    assert {p.dtype for p in lm.model.parameters()} == {torch.bfloat16}
    same = factory.load_model(cfg.model, cfg.task, seed=3, training=False)
    other = factory.load_model(cfg.model, cfg.task, seed=4, training=False)
    w = lm.model.get_input_embeddings().weight
    assert torch.equal(w, same.model.get_input_embeddings().weight)
    assert not torch.equal(w, other.model.get_input_embeddings().weight)
    assert lm.builtin is True


def test_lora_applies_for_training_only_and_its_adapters_are_drawn_from_the_seed(tmp_path):
    """model.lora.r > 0 on a saved model: adapters for training (their dropout set to 0), none for an evaluation;
    the new adapters start from ``seed`` whatever drew from torch before."""
    cfg = _cfg("model.lora.r=1", "model.lora.dropout=0.1", "model.num_layers=1")  # (rank 1: the smallest)
    base = factory.load_model(cfg.model, cfg.task, seed=0, training=False)
    base.save_pretrained(tmp_path / "m")
    init = str(tmp_path / "m")
    assert factory.load_model(cfg.model, cfg.task, init=init, seed=0, training=False).peft is None
    with pytest.warns(UserWarning, match="dropout"):
        a = factory.load_model(cfg.model, cfg.task, init=init, seed=0)
    assert a.peft is not None and cfg.model.lora.dropout == 0.0
    torch.rand(100)  # (another draw in between)
    b = factory.load_model(cfg.model, cfg.task, init=init, seed=0)
    adapters = [(n, p) for n, p in a.model.named_parameters() if "lora_A" in n]
    assert adapters
    for (n, p), (m, q) in zip(adapters, [(n, p) for n, p in b.model.named_parameters() if "lora_A" in n]):
        assert n == m and torch.equal(p, q)


def test_the_revision_hint_is_for_an_init_loaded_in_place_of_another_model():
    """The hint is added only when model.revision is set, ``init`` replaced the model loaded, and model.name_or_path
    named another model (not the built-in one, not the same repository)."""
    model = SimpleNamespace(name_or_path="org/base", revision="v2")
    assert "model.revision is the revision of the model loaded, org/init, not of model.name_or_path org/base" in (
        factory.revision_hint(model, "org/init")
    )
    assert factory.revision_hint(model, None) == ""
    assert factory.revision_hint(model, "org/base") == ""
    assert factory.revision_hint(SimpleNamespace(name_or_path="org/base", revision=""), "org/init") == ""
    assert factory.revision_hint(SimpleNamespace(name_or_path=factory.BUILTIN, revision="v2"), "org/init") == ""


def test_trust_remote_code_alone_for_the_built_in_model_is_warned_about():
    """model.trust_remote_code=true alone, for the built-in model: one warning naming it (singular); nothing set,
    no warning."""
    with pytest.warns(
        UserWarning, match=r"^model.trust_remote_code=true applies only to a model loaded .* it is ignored"
    ):
        factory.warn_if_loading_options_are_set(_cfg("model.trust_remote_code=true").model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        factory.warn_if_loading_options_are_set(_cfg().model)


def test_record_adapter_writes_the_adapters_settings_into_the_config():
    """The run's model.lora becomes the adapter's: rank, alpha, dropout 0, trainable latent rows, and its targets
    when it lists them (a string such as all-linear leaves the config's)."""
    cfg = LoraConfig(r=2, alpha=4.0, target_modules=["all-linear"], dropout=0.3, train_latent_tokens=False)
    saved = SimpleNamespace(r=8, lora_alpha=32, target_modules={"v_proj", "q_proj"}, trainable_token_indices=[5])
    factory.record_adapter(cfg, saved)
    assert (cfg.r, cfg.alpha, cfg.dropout, cfg.train_latent_tokens) == (8, 32.0, 0.0, True)
    assert cfg.target_modules == ["q_proj", "v_proj"]
    factory.record_adapter(cfg, SimpleNamespace(r=4, lora_alpha=8, target_modules="all-linear"))
    assert (cfg.r, cfg.train_latent_tokens, cfg.target_modules) == (4, False, ["q_proj", "v_proj"])


def test_compile_is_checked_for_the_built_in_model_only():
    """model.compile with model.arch=gpt2 is refused for the built-in model, not for a checkpoint named by
    ``init`` (its architecture is known once loaded)."""
    from dgrpo.config import ConfigError

    model = _cfg("model.arch=gpt2", "model.compile=true").model
    with pytest.raises(ConfigError, match="model.compile"):
        factory.check_builtin_compiles(model)
    factory.check_builtin_compiles(model, init="runs/sft")


def test_compile_head_follows_the_option_on_the_models_device(tokenizer):
    """compile_head: true compiles the head statistics, false makes them eager again, auto on the CPU is eager."""
    from conftest import make_lm

    lm = make_lm(tokenizer)
    for setting, compiled in (("true", True), ("false", False), ("true", True), ("auto", False)):
        factory.compile_head(lm, SimpleNamespace(compile_head=setting))
        assert lm.head_stats.compiled is compiled


def test_a_loaded_model_gets_the_configs_loading_options_and_the_device(monkeypatch):
    """``init`` (or model.name_or_path) is loaded with the config's dtype, trust_remote_code, latent_token_init and
    revision (empty: None), and the model is moved to ``device`` at the end."""
    calls: list[tuple[str, dict]] = []
    moved: list[object] = []

    class Loaded:
        peft = None

        def to(self, device):
            moved.append(device)
            return self

    def from_pretrained(name, **kw):
        calls.append((name, kw))
        return Loaded()

    monkeypatch.setattr(factory.LatentLM, "from_pretrained", from_pretrained)
    sets = ("model.trust_remote_code=true", "model.latent_token_init=coconut", "model.dtype=bfloat16")
    cfg = _cfg(*sets, "model.revision=v3")
    factory.load_model(cfg.model, cfg.task, init="org/m", device="cuda:7", training=False, announce=print)
    cfg = _cfg("model.name_or_path=org/base")
    factory.load_model(cfg.model, cfg.task, device="cpu", training=False)
    loaded = {"dtype": torch.bfloat16, "trust_remote_code": True, "latent_token_init": "coconut", "revision": "v3"}
    assert calls == [
        ("org/m", {**loaded, "announce": print, "check_config": None}),  # (the loading line's sink: rank 0 prints it)
        (
            "org/base",
            {
                "dtype": torch.float32,
                "trust_remote_code": False,
                "latent_token_init": "mean",
                "revision": None,
                "announce": None,
                "check_config": None,
            },
        ),
    ]
    assert moved == ["cuda:7", "cpu"]


def test_compile_refuses_a_model_with_adapters():
    """model.compile on a model that carries LoRA adapters is one ConfigError line; without the option, nothing."""
    from dgrpo.config import ConfigError

    lm = SimpleNamespace(peft=object(), compiled_layers=None)
    with pytest.raises(ConfigError, match="the compiled layers do not run with LoRA adapters"):
        factory.compile_layers(lm, SimpleNamespace(compile=True))
    factory.compile_layers(lm, SimpleNamespace(compile=False))


def test_pack_gqa_warns_only_when_asked_for_explicitly(monkeypatch):
    """A model whose attention cannot be packed: model.pack_gqa=true warns, auto (on CUDA) passes it by quietly."""
    monkeypatch.setattr(factory, "use_packed_gqa", lambda model, on: False)
    lm = SimpleNamespace(device=torch.device("cuda"), model=torch.nn.Identity())
    with pytest.warns(UserWarning, match="model.pack_gqa=true: Identity runs Hugging Face's attention as it is"):
        factory.pack_gqa(lm, SimpleNamespace(pack_gqa="true"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        factory.pack_gqa(lm, SimpleNamespace(pack_gqa="auto"))


def test_apply_speedups_reports_the_kernels_as_applied(monkeypatch):
    """The kernels returned are those applied: the option's value when they ran, ``none`` when they did not (Liger
    off CUDA), which the run records."""
    for name in ("compile_layers", "compile_head", "pack_gqa"):
        monkeypatch.setattr(factory, name, lambda lm, cfg: None)
    lm, cfg = SimpleNamespace(model=None), SimpleNamespace(kernels="liger")
    monkeypatch.setattr(factory, "apply_kernels", lambda model, kernels: False)
    assert factory.apply_speedups(lm, cfg) == "none"
    monkeypatch.setattr(factory, "apply_kernels", lambda model, kernels: True)
    assert factory.apply_speedups(lm, cfg) == "liger"
