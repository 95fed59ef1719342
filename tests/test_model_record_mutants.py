"""dgrpo.training.model_record's rules, one by one on stand-in models (gaps found by mutation testing): how a run's
config names the model it trains (a local path absolute, an older run's own spelling kept), the loaded model's shape
recorded with a warning for options that built nothing, a loaded or wrapped model named, the hub commit recorded."""

import json
import warnings
from types import SimpleNamespace

import pytest

from dgrpo.config import Config
from dgrpo.model.factory import BUILTIN
from dgrpo.training.model_record import (
    hub_revision,
    init_name,
    model_name,
    python_model_name,
    record_the_models_shape,
    recorded_model,
)


class GPT2LMHeadModel:
    """A stand-in for a loaded GPT-2: its Hugging Face config (n_inner None: 4 x hidden_size)."""

    def __init__(self, name_or_path: str = ""):
        self.config = SimpleNamespace(
            model_type="gpt2",
            hidden_size=48,
            num_hidden_layers=3,
            num_attention_heads=4,
            n_inner=None,
            _name_or_path=name_or_path,
        )


def lm(loaded_from=None, builtin=False, hub_commit=None, name_or_path=""):
    return SimpleNamespace(
        model=GPT2LMHeadModel(name_or_path), loaded_from=loaded_from, builtin=builtin, hub_commit=hub_commit
    )


def config(name: str = BUILTIN, revision: str = "", **model) -> Config:
    cfg = Config()
    cfg.model.name_or_path, cfg.model.revision = name, revision
    for k, v in model.items():
        setattr(cfg.model, k, v)
    return cfg


def ran(out, model: dict):
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps({"model": model}))
    return out


def test_a_local_folder_is_named_by_its_absolute_path_and_the_builtin_name_stays_itself(tmp_path, monkeypatch):
    """A folder that is no checkpoint is named absolute (loading it says why it is none); a hub id as given; the
    built-in name is itself even beside a folder of that name."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "plain").mkdir()
    (tmp_path / BUILTIN).mkdir()
    assert init_name("plain") == str(tmp_path.resolve() / "plain")
    assert init_name("org/model") == "org/model"
    assert model_name(BUILTIN, tmp_path / "out") == BUILTIN


def test_an_older_runs_spelling_is_kept_for_the_same_model_only(tmp_path, monkeypatch):
    """The run in out recorded ``plain`` (relative): a resume naming it absolutely keeps ``plain``; one naming another
    model gets that model's own name."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "plain").mkdir()
    (tmp_path / "other").mkdir()
    out = ran(tmp_path / "out", {"name_or_path": "plain"})
    assert model_name(str(tmp_path / "plain"), out) == "plain"
    assert model_name("other", out) == str(tmp_path.resolve() / "other")
    assert model_name("other", tmp_path / "new") == str(tmp_path.resolve() / "other")


def test_a_loaded_models_shape_is_recorded_and_only_options_set_otherwise_are_warned_of():
    """GPT-2 (n_inner None: 4 x 48): arch, sizes and width become the model's. num_layers=7, set by the user, is
    warned of; hidden_size at its default is not. A run on the built-in model keeps its options."""
    cfg = config("org/gpt2", num_layers=7)
    with pytest.warns(UserWarning, match=r"^model.num_layers=7 \(the model's: 3\): model.arch") as said:
        record_the_models_shape(cfg, lm())
    assert len(said) == 1 and "hidden_size" not in str(said[0].message)
    m = cfg.model
    assert (m.arch, m.hidden_size, m.num_layers, m.num_heads, m.intermediate_size) == ("gpt2", 48, 3, 4, 192)
    builtin = config(num_layers=7)
    record_the_models_shape(builtin, lm())
    assert (builtin.model.arch, builtin.model.num_layers) == ("qwen2", 7)


def test_a_model_loaded_from_elsewhere_is_recorded_by_what_it_was_loaded_from_in_a_copy(tmp_path):
    """load_model(..., init=...) under a config naming another model: the copy names the loaded one with its shape
    and commit; the caller's config is left as it was."""
    cfg = config("org/other", revision="main")
    out = recorded_model(cfg, lm(loaded_from="org/loaded", hub_commit="c0ffee"), tmp_path / "out")
    assert (out.model.name_or_path, out.model.arch, out.model.revision) == ("org/loaded", "gpt2", "c0ffee")
    assert (cfg.model.name_or_path, cfg.model.arch, cfg.model.revision) == ("org/other", "qwen2", "main")


def test_the_builtin_model_and_an_older_runs_builtin_record_are_left_as_they_are(tmp_path):
    """The built-in model itself: the config object as given, no warning. A wrapped model whose run recorded the
    built-in name (begun before dgrpo named wrapped models): the same."""
    cfg = config()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert recorded_model(cfg, lm(builtin=True), tmp_path / "new") is cfg
        assert recorded_model(cfg, lm(), ran(tmp_path / "old", {"name_or_path": BUILTIN})) is cfg


def test_a_wrapped_model_is_named_by_its_own_checkpoint_or_its_class_and_a_named_one_keeps_its_name(
    tmp_path, monkeypatch
):
    """A model wrapped in Python under the built-in name: named by the checkpoint its Hugging Face config names (a
    local one absolute), else python:<class>, with a warning. Under a config that names a model: left so named."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine").mkdir()
    assert python_model_name(lm(name_or_path="org/m"), tmp_path) == "org/m"
    assert python_model_name(lm(name_or_path="mine"), tmp_path) == str(tmp_path.resolve() / "mine")
    assert python_model_name(lm(name_or_path=" "), tmp_path) == "python:GPT2LMHeadModel"
    with pytest.warns(UserWarning, match="model.name_or_path=python:GPT2LMHeadModel, and a resume"):
        assert recorded_model(config(), lm(), tmp_path / "out").model.name_or_path == "python:GPT2LMHeadModel"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert recorded_model(config("org/named"), lm(), tmp_path / "out").model.name_or_path == "org/named"


def test_the_hub_commit_is_recorded_for_the_model_loaded_unless_an_older_run_recorded_the_revision_given(tmp_path):
    """The commit a hub id was loaded at replaces the revision given, for that model only; a run in out that recorded
    the same model at the revision given keeps it; one that recorded another model does not; a config.json that is
    no object counts as none."""
    cfg = config("org/m", revision="main")
    loaded = lm(loaded_from="org/m", hub_commit="c0ffee")
    assert hub_revision(cfg, loaded, tmp_path / "new") == "c0ffee"
    assert hub_revision(cfg, lm(loaded_from="org/x", hub_commit="c0ffee"), tmp_path / "new") == "main"
    assert hub_revision(cfg, loaded, ran(tmp_path / "a", {"name_or_path": "org/m", "revision": "main"})) == "main"
    assert hub_revision(cfg, loaded, ran(tmp_path / "b", {"name_or_path": "org/y", "revision": "main"})) == "c0ffee"
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "config.json").write_text("[]")
    assert hub_revision(cfg, loaded, tmp_path / "c") == "c0ffee"


def test_a_home_relative_folder_that_is_no_checkpoint_is_named_in_the_home_folder(tmp_path, monkeypatch):
    """``--init ~/plain`` (a folder, no checkpoint: loading it says why): named by its absolute path in the home
    folder, as every loader reads it; it was named ``<cwd>/~/plain``, a folder that does not exist."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "home" / "plain").mkdir(parents=True)
    assert init_name("~/plain") == str((tmp_path / "home" / "plain").resolve())
