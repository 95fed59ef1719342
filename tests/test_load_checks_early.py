"""What a training load of a model with ``model.compile`` refuses from its config.json, before its weights load
(minutes for a large model): attention that is not SDPA over full-attention layers, which was refused only once the
weights had loaded (:func:`~dgrpo.model.compiled_layers.check_compilable`)."""

import json
import re

import pytest

from conftest import make_lm


@pytest.fixture
def no_weights_load(monkeypatch):
    """Loading any model's weights fails the test: what is refused must be refused before."""
    from dgrpo.model import latent_lm

    def load_hf_model(path, *args, **kwargs):
        raise AssertionError(f"the weights of {path} were loaded")

    monkeypatch.setattr(latent_lm, "load_hf_model", load_hf_model)


def _qwen2_dir(tokenizer, folder, **config) -> str:
    """A tiny Qwen2 checkpoint whose config.json holds ``config`` besides its own (changed by the user: no
    manifest)."""
    make_lm(tokenizer, "qwen2").save_pretrained(folder)
    saved = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**saved, **config}))
    (folder / "manifest.json").unlink()
    return str(folder)


@pytest.mark.parametrize(
    ("config", "said"),
    [
        ({"attn_implementation": "eager"}, "attn_implementation='eager'"),
        (
            {"layer_types": None, "use_sliding_window": True, "sliding_window": 16, "max_window_layers": 1},
            "attn_implementation='sdpa', 1 of its 2 layers not full attention",
        ),
        ({"layer_types": ["full_attention", "sliding_attention"], "sliding_window": 16}, "1 of its 2 layers"),
    ],
)
def test_compile_over_attention_it_cannot_run_is_refused_before_the_weights_load(
    tokenizer, tmp_path, no_weights_load, config, said
):
    """A config.json naming eager attention, or sliding-window layers (a Qwen2 config's ``use_sliding_window``, or
    its ``layer_types``): refused from config.json, the weights not loaded."""
    from dgrpo.config import Config, ConfigError
    from dgrpo.model.factory import load_model

    cfg = Config()
    cfg.model.compile = True
    init = _qwen2_dir(tokenizer, tmp_path / "m", **config)
    with pytest.raises(
        ConfigError,
        match="model.compile: the compiled layers need SDPA attention over full-attention "
        f"layers \\(config.json: .*{re.escape(said)}.*\\); set model.compile=false",
    ):
        load_model(cfg.model, cfg.task, init=init)


@pytest.mark.parametrize(
    "config",
    [{}, {"attn_implementation": "sdpa"}, {"layer_types": None, "use_sliding_window": False, "sliding_window": 4096}],
)
def test_compile_over_sdpa_full_attention_loads(tokenizer, tmp_path, config):
    """A Qwen2 config.json on SDPA (named, or by default) with full-attention layers only (a Qwen2.5 config's
    ``sliding_window`` with ``use_sliding_window`` false) loads for training with ``model.compile``, on SDPA."""
    from dgrpo.config import Config
    from dgrpo.model.factory import load_model

    cfg = Config()
    cfg.model.compile = True
    lm = load_model(cfg.model, cfg.task, init=_qwen2_dir(tokenizer, tmp_path / "m", **config))
    assert lm.model.config._attn_implementation == "sdpa"
