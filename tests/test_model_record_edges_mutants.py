"""dgrpo.training.model_record at its edges (a second pass of mutation testing): a wrapped model whose Hugging Face
config names the built-in model is named by its class, and a run folder whose config.json is damaged or oddly
shaped names no model."""

import json
from types import SimpleNamespace

from dgrpo.model.factory import BUILTIN
from dgrpo.training.model_record import _recorded_name, python_model_name


class Qwen2ForCausalLM:
    def __init__(self, name_or_path: str):
        self.config = SimpleNamespace(_name_or_path=name_or_path)


def test_a_wrapped_model_whose_config_names_the_builtin_model_is_named_by_its_class(tmp_path):
    """A model wrapped in Python whose config says ``builtin-tiny`` (built from the built-in one's config): recorded
    as ``python:<its class>``, not as the built-in model (a resume would build that one instead)."""
    lm = SimpleNamespace(model=Qwen2ForCausalLM(BUILTIN))
    assert python_model_name(lm, tmp_path) == "python:Qwen2ForCausalLM"


def test_a_run_whose_config_is_damaged_or_oddly_shaped_recorded_no_model(tmp_path):
    """config.json not JSON, a JSON list, ``model`` not an object, ``model`` without a name: no recorded name."""
    for text in ("{", "[]", json.dumps({"model": "gpt2"}), json.dumps({"model": {}})):
        (tmp_path / "config.json").write_text(text)
        assert _recorded_name(tmp_path) is None, text
    (tmp_path / "config.json").write_text(json.dumps({"model": {"name_or_path": "gpt2"}}))
    assert _recorded_name(tmp_path) == "gpt2"
