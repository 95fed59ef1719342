"""How a run's config names the model it trains: the checkpoint or hub id it started from, and that model's shape
(``model.arch`` and the sizes describe the built-in tiny model only). The command line and the Python trainers
record them alike, so that a resume from other weights is refused in both."""

from __future__ import annotations

import copy
import json
import warnings
from pathlib import Path
from typing import Any

from ..config import BUILTIN_SHAPE, Config, ModelConfig
from ..model.factory import BUILTIN
from ..model.sources import on_disk, resolve_checkpoint
from ..model.verified import CheckpointError
from ..run_layout import CONFIG_FILE


def init_name(init: str) -> str:
    """How a run's config names its ``--init``: the checkpoint a local path resolves to, absolute (``runs/sft`` and
    ``runs/sft/final`` are one model: a resume naming the other was refused as other weights); a hub id as given."""
    if not on_disk(init).exists():  # (checkpoints/step-N names step-0000000N: the model loads from it too)
        return init
    try:
        return str(resolve_checkpoint(init).resolve())
    except CheckpointError:  # (not a checkpoint: loading it says why)
        return str(on_disk(init).resolve())  # (``~`` expanded, as the loaders read it)


def model_name(name: str, out_dir: str | Path) -> str:
    """How a run's config names ``model.name_or_path``: as :func:`init_name` names ``--init`` (a local checkpoint by
    the absolute path it resolves to: ``runs/sft``, ``runs/sft/final`` and its absolute path were three configs, and
    a resume naming another of them was refused), unless the run in ``out_dir`` recorded another spelling of the
    same model (begun before dgrpo recorded it so): that run is resumed as it recorded it."""
    if name == BUILTIN:
        return name
    recorded = _recorded_name(Path(out_dir))
    if isinstance(recorded, str) and recorded != BUILTIN and init_name(recorded) == init_name(name):
        return recorded
    return init_name(name)


def record_the_models_shape(cfg: Config, lm: Any) -> None:
    """``model.arch`` and the sizes build the built-in tiny model; a run that loads a model (``--init``, a hub id or a
    directory) records the loaded model's instead (its config.json said the options given, which built nothing),
    warning of an option set to another value than its default: it was ignored. Left as they are for an
    architecture that is none of model.arch's choices."""
    hf: Any = getattr(lm.model, "config", None)
    if cfg.model.name_or_path == BUILTIN or getattr(hf, "model_type", None) not in ("qwen2", "llama", "gpt2"):
        return
    intermediate = getattr(hf, "intermediate_size", None) or getattr(hf, "n_inner", None) or 4 * hf.hidden_size
    values = (hf.model_type, hf.hidden_size, hf.num_hidden_layers, hf.num_attention_heads, intermediate)
    shape = dict(zip(BUILTIN_SHAPE, values, strict=True))  # (GPT-2's n_inner None: 4 x hidden_size)
    default, given = ModelConfig(), cfg.model
    ignored = [k for k, v in shape.items() if getattr(given, k) not in (v, getattr(default, k))]
    if ignored:
        shown = ", ".join(f"model.{k}={getattr(given, k)} (the model's: {shape[k]})" for k in ignored)
        warnings.warn(
            f"{shown}: model.arch and the sizes build the built-in tiny model, and this run loads "
            f"{cfg.model.name_or_path}: they are ignored, and the run records the loaded model's",
            stacklevel=2,
        )
    for k, v in shape.items():
        setattr(given, k, v)


#: how a run's config names a model built or wrapped in Python whose Hugging Face config names no checkpoint
#: (``PYTHON_MODEL`` and its class: ``python:Qwen2ForCausalLM``)
PYTHON_MODEL = "python"


def recorded_model(cfg: Config, lm: Any, out_dir: Path, stacklevel: int = 3) -> Config:
    """``cfg`` as a Python trainer records it for ``lm``: a model that ``from_pretrained`` loaded (``load_model(...,
    init=...)``) named by ``model.name_or_path`` where the config names another (the built-in one: the run recorded
    ``builtin-tiny`` and its shape for a loaded GPT-2, and a resume from other weights went unnoticed), with the
    loaded model's shape; a copy (the caller's config is left as it is). The command line has set both already. A
    model wrapped in Python (``LatentLM(model, tokenizer)``) under the built-in name is named by
    :func:`python_model_name`, with its own shape (it recorded ``builtin-tiny`` and the config's sizes), and a warning
    says that a resume takes that model again. A run in ``out_dir`` that recorded the built-in name (begun before
    dgrpo recorded a loaded or wrapped model) is resumed as it recorded it. ``stacklevel``: the warning's, to name the
    trainer's caller."""
    name, loaded = cfg.model.name_or_path, getattr(lm, "loaded_from", None)
    wrapped = loaded is None and not getattr(lm, "builtin", False)
    if name == BUILTIN and (not (loaded or wrapped) or _recorded_name(out_dir) == BUILTIN):
        return cfg  # the built-in model, or a run that recorded it so
    cfg = copy.deepcopy(cfg)
    if loaded is not None and (name == BUILTIN or init_name(name) != loaded):
        cfg.model.name_or_path = loaded
    elif wrapped and name == BUILTIN:
        cfg.model.name_or_path = python_model_name(lm, out_dir)
        warnings.warn(
            f"the model was built in Python (LatentLM(model, tokenizer)): the run in {out_dir} records it as "
            f"model.name_or_path={cfg.model.name_or_path}, and a resume of it must be given that model again (its "
            "checkpoints restore the weights into the model passed); LatentLM.from_pretrained(path) records the path",
            stacklevel=stacklevel,
        )
    record_the_models_shape(cfg, lm)
    cfg.model.revision = hub_revision(cfg, lm, out_dir)
    return cfg


def python_model_name(lm: Any, out_dir: str | Path) -> str:
    """How a run's config names a model wrapped in Python: the checkpoint or hub id its Hugging Face config names
    (``_name_or_path``, set by transformers' ``from_pretrained``; a local one as :func:`model_name` names it), else
    ``python:<its class>`` (a model built from a config: no file holds its starting weights)."""
    own = getattr(getattr(lm.model, "config", None), "_name_or_path", None)
    if isinstance(own, str) and own.strip() and own != BUILTIN:
        return model_name(own, out_dir)
    return f"{PYTHON_MODEL}:{type(lm.model).__name__}"


def hub_revision(cfg: Config, lm: Any, out_dir: Path) -> str:
    """``model.revision`` as a run records it: the commit a hub id was loaded at (``''`` or a branch said which files
    the run used only on the day it started; the run printed the commit, its config.json did not), unless the run in
    ``out_dir`` recorded the revision as given for the same model (begun before dgrpo recorded the commit: that run
    is resumed as it recorded it). A directory, or a model built here, keeps the option as given."""
    commit, given = getattr(lm, "hub_commit", None), cfg.model.revision
    if not commit or getattr(lm, "loaded_from", None) != cfg.model.name_or_path:
        return given
    recorded = _recorded(Path(out_dir)).get("model", {})
    if recorded.get("name_or_path") == cfg.model.name_or_path and recorded.get("revision") == given:
        return given
    return str(commit)


def _recorded_name(out_dir: Path) -> str | None:
    """The ``model.name_or_path`` the run in ``out_dir`` recorded (None: no run there, or its config unreadable)."""
    try:
        return _recorded(out_dir)["model"]["name_or_path"]
    except (KeyError, TypeError):
        return None


def _recorded(out_dir: Path) -> dict:
    """The config the run in ``out_dir`` recorded (empty: no run there, or its config unreadable)."""
    try:
        found = json.loads((Path(out_dir) / CONFIG_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}
