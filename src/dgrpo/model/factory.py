"""Build the LatentLM a config names: the built-in tiny model, a local checkpoint or a Hugging Face hub id
(:mod:`~dgrpo.model.sources` resolves the name), with LoRA adapters when ``model.lora.r`` > 0."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..config import ConfigError, LoraConfig, ModelConfig, TaskConfig
from ..data.synthetic import tokenizer_corpus
from ..data.tokenizer import train_task_tokenizer
from . import lora
from .compiled_layers import COMPILABLE_MODEL_TYPES, CompiledLayers, check_compilable_config
from .gqa_attention import use_packed_gqa
from .head_stats import HeadStats
from .kernels import apply_kernels
from .latent_lm import LatentLM, LatentSettings
from .sources import BUILTIN, on_for_device, resolve_checkpoint, resolve_device
from .tiny import build_tiny_model
from .verified import CheckpointError

__all__ = [
    "BUILTIN",
    "CheckpointError",
    "build_builtin",
    "check_builtin_compiles",
    "compile_head",
    "compile_layers",
    "pack_gqa",
    "load_model",
    "resolve_checkpoint",
    "resolve_device",
]


def build_builtin(model_cfg: ModelConfig, task_cfg: TaskConfig, seed: int = 0) -> LatentLM:
    """The built-in tiny model of ``model_cfg``'s shape (``model.arch`` and the sizes) over the task's tokenizer, its
    weights drawn from ``seed``; marked ``builtin`` (a run records it as ``builtin-tiny`` with that shape)."""
    tok = train_task_tokenizer(tokenizer_corpus(task_cfg))
    model = build_tiny_model(
        model_cfg.arch,
        len(tok),
        seed=seed,
        hidden_size=model_cfg.hidden_size,
        num_layers=model_cfg.num_layers,
        num_heads=model_cfg.num_heads,
        intermediate_size=model_cfg.intermediate_size,
    )
    lm = LatentLM(model, tok, LatentSettings(), latent_token_init=model_cfg.latent_token_init)
    lm.builtin = True
    return lm


def check_builtin_compiles(model_cfg: ModelConfig, init: str | None = None) -> None:
    """A one-line ConfigError when ``model.compile`` is on for a built-in model (no ``init``) of an architecture the
    compiled layers do not run (``model.arch=gpt2``): the config knows it, and dgrpo sft / grpo refuse the run
    before its data is read and its model built (it was refused once built; an evaluation compiles nothing). A
    model loaded from a directory or the hub is checked by :func:`load_model` from its config.json, before its
    weights load (they take minutes for a 1.5B model), and once loaded (:func:`compiled_layers.check_compilable`)."""
    if model_cfg.compile and not init and model_cfg.name_or_path == BUILTIN:
        if model_cfg.arch not in COMPILABLE_MODEL_TYPES:
            raise ConfigError(
                f"invalid config value model.compile: the compiled layers run {', '.join(COMPILABLE_MODEL_TYPES)} "
                f"decoders; the built-in model is model.arch={model_cfg.arch} (set model.compile=false, or model.arch "
                "to one of them)"
            )


def load_model(
    model_cfg: ModelConfig,
    task_cfg: TaskConfig,
    *,
    init: str | None = None,
    seed: int = 0,
    device: torch.device | str = "cpu",
    training: bool = True,
    announce: Callable[[str], None] | None = None,
) -> LatentLM:
    """``init`` (a checkpoint directory, a LoRA adapter directory or a hub id) wins over ``model.name_or_path``; the
    built-in name builds a fresh tiny model (from ``seed``). For ``training``, ``model.lora`` applies
    (:func:`configure_lora`; new adapters drawn from ``seed``); for evaluation a checkpoint is used as saved. Every
    way this can fail is one :class:`CheckpointError` line. ``announce``: given the line saying what loads from where
    (``dgrpo: loading MODEL (...) ...``) just before a directory's or the hub's weights load; the built-in model,
    built in seconds, has none. For ``training`` with ``model.compile``, a model its config.json says the compiled
    layers cannot run is refused before its weights load (:func:`~.compiled_layers.check_compilable_config`)."""
    dtype = torch.bfloat16 if model_cfg.dtype == "bfloat16" else torch.float32
    name = init or model_cfg.name_or_path
    if not init and name == BUILTIN:
        warn_if_loading_options_are_set(model_cfg)
        lm = build_builtin(model_cfg, task_cfg, seed)
        lm.to(dtype)
    else:
        try:  # (from_pretrained resolves the name: a directory, or a hub id from the hub or its cache)
            lm = LatentLM.from_pretrained(
                str(name),
                dtype=dtype,
                trust_remote_code=model_cfg.trust_remote_code,
                latent_token_init=model_cfg.latent_token_init,
                revision=model_cfg.revision or None,
                announce=announce,
                check_config=check_compilable_config if training and model_cfg.compile else None,
            )
        except CheckpointError as e:
            raise CheckpointError(f"{e}{revision_hint(model_cfg, init)}") from None
    if training:
        with torch.random.fork_rng(devices=[]):  # new adapters start from ``seed``, whatever drew from torch before
            torch.manual_seed(seed)
            configure_lora(lm, model_cfg.lora)
    return lm.to(device)


def warn_if_loading_options_are_set(model_cfg: ModelConfig) -> None:
    """A warning when ``model.revision`` or ``model.trust_remote_code`` is set for the built-in model: they say how to
    load a hub id or a directory, and the built-in model is built here (they were dropped without a word, while the
    run's config.json recorded them)."""
    given = [f"model.revision={model_cfg.revision}"] if model_cfg.revision else []
    given += ["model.trust_remote_code=true"] if model_cfg.trust_remote_code else []
    if given:
        one = len(given) == 1
        warnings.warn(
            f"{' and '.join(given)} {'applies' if one else 'apply'} only to a model loaded from the hub or a "
            f"directory: model.name_or_path is {BUILTIN}, built here, and {'it is' if one else 'they are'} ignored",
            stacklevel=3,
        )


def revision_hint(model_cfg: ModelConfig, init: str | None) -> str:
    """What to add to a failed load when ``model.revision`` was probably meant for ``model.name_or_path`` but applied
    to ``init``, the repository loaded."""
    base = model_cfg.name_or_path
    if not (init and model_cfg.revision and base not in (BUILTIN, init)):
        return ""
    return f" (model.revision is the revision of the model loaded, {init}, not of model.name_or_path {base})"


def configure_lora(lm: LatentLM, cfg: LoraConfig) -> None:
    """``model.lora.r`` > 0: new adapters on a full model, or an adapter checkpoint's own adapter trained further
    (its rank, alpha and targets win: ``model.lora`` is set to them, a different one reported, so that the run's
    config records what it trains whatever was given (``all-linear`` too, which matches any adapter's targets: a
    resume under the same values records the same list), as ``dropout`` is set to the 0 every adapter uses:
    :func:`~.lora.no_dropout`).
    ``r`` = 0 on an adapter checkpoint: the adapter is merged into the base and every weight is trained."""
    if cfg.r > 0:
        lora.no_dropout(cfg)
    if cfg.r > 0 and lm.peft is None:
        lora.apply_lora(lm, cfg)
    elif cfg.r > 0:
        saved = lm.peft.peft_config[lora.POLICY]
        shape, targets = lora.adapter_shape(saved), sorted(cfg.target_modules)
        saved_targets = shape["target_modules"] if isinstance(shape["target_modules"], list) else targets
        latent_rows = shape["train_latent_tokens"]
        if (shape["r"], shape["alpha"], latent_rows) != (cfg.r, float(cfg.alpha), cfg.train_latent_tokens) or (
            targets != ["all-linear"] and targets != saved_targets
        ):
            file = Path(lm.loaded_from) / lora.ADAPTER_CONFIG if lm.loaded_from else None  # (names many targets)
            given = lora.targets_setting(targets, None, "target_modules")
            kept = lora.targets_setting(saved_targets, file, "target_modules")
            warnings.warn(
                f"model.lora (r={cfg.r}, alpha={cfg.alpha}, {given}, train_latent_tokens={cfg.train_latent_tokens}) "
                f"differs from the checkpoint's adapter (r={saved.r}, alpha={saved.lora_alpha}, {kept}, "
                f"train_latent_tokens={latent_rows}): training continues the checkpoint's adapter (the run's config "
                "records its values)",
                stacklevel=2,
            )
        record_adapter(cfg, saved)
    elif lm.peft is not None:
        warnings.warn(
            "the checkpoint is a LoRA adapter and model.lora.r=0: merging it into the base, every weight is trained "
            "(set model.lora.r to train the adapter instead)",
            stacklevel=2,
        )
        lora.merge_into_base(lm)


def lora_for_training(lm: LatentLM, cfg: LoraConfig) -> None:
    """What ``train_sft``/``train_grpo`` do with a model handed to them (the command line's comes through
    :func:`load_model`, which did it already: then nothing changes). ``model.lora.r`` > 0 puts adapters on a model
    that has none, or continues the model's own (:func:`configure_lora`); it was ignored, and every weight trained.
    A model given with its own adapters and ``r`` = 0 keeps them, and the config records theirs, so that the run's
    config says what it trains."""
    if cfg.r > 0 or lm.peft is None:
        configure_lora(lm, cfg)
        return
    record_adapter(cfg, lm.peft.peft_config[lora.POLICY])


def record_adapter(cfg: LoraConfig, saved: Any) -> None:
    """``cfg`` (the run's ``model.lora``) set to what the adapter ``saved`` (its ``peft.LoraConfig``) is
    (:func:`~.lora.adapter_shape`: its rank, alpha, targets when it lists them, and trainable latent rows), and the
    dropout of 0 every adapter uses."""
    shape = lora.adapter_shape(saved)
    cfg.r, cfg.alpha, cfg.dropout = shape["r"], shape["alpha"], 0.0  # (dgrpo's forwards: no adapter dropout)
    cfg.train_latent_tokens = shape["train_latent_tokens"]
    if isinstance(shape["target_modules"], list):
        cfg.target_modules = shape["target_modules"]


def apply_speedups(lm: LatentLM, cfg: ModelConfig) -> str:
    """The model options that change how ``lm`` computes, not what, as a trainer applies them before it trains (and
    before GRPO's reference copy, which then has them too): ``model.kernels`` first (the compiled step traces the
    layers it finds), then :func:`compile_layers`, :func:`compile_head` and :func:`pack_gqa`. Returns the kernels
    applied, as resolved (``none`` where Liger does not run: off CUDA)."""
    kernels = cfg.kernels if apply_kernels(lm.model, cfg.kernels) else "none"
    compile_layers(lm, cfg)  # (a reference copy shares the compiled step)
    compile_head(lm, cfg)  # (and the compiled head statistics)
    pack_gqa(lm, cfg)  # (and the packed attention: a copy's config is the model's)
    return kernels


def compile_layers(lm: LatentLM, cfg: ModelConfig) -> None:
    """``model.compile``: the decoder layers of ``lm`` run one compiled step (:mod:`~dgrpo.model.compiled_layers`);
    a ConfigError when its architecture cannot, or when it carries LoRA adapters (applied in Python: the config
    refuses model.lora.r > 0 with it; the step's layer template would lack the reference's adapter, and a GRPO run with
    a KL term failed in its first update with an AttributeError). Nothing when the option is off."""
    if cfg.compile and lm.peft is not None:
        raise ConfigError(
            "invalid config value model.compile: the compiled layers do not run with LoRA adapters (this model has "
            "them); set model.compile=false"
        )
    if cfg.compile and lm.compiled_layers is None:
        lm.compiled_layers = CompiledLayers(lm.model, backend=cfg.compile_backend, mode=cfg.compile_mode)


def compile_head(lm: LatentLM, cfg: ModelConfig) -> None:
    """``model.compile_head``: the head statistics of ``lm`` compiled (auto: on a CUDA device) or eager
    (:mod:`~dgrpo.model.head_stats`)."""
    on = on_for_device(cfg.compile_head, lm.device)
    if on != lm.head_stats.compiled:
        lm.head_stats = HeadStats(compiled=on)


def pack_gqa(lm: LatentLM, cfg: ModelConfig) -> None:
    """``model.pack_gqa``: the grouped-query attention of ``lm`` without repeated keys and values (auto: on a CUDA
    device; :mod:`~dgrpo.model.gqa_attention`), or Hugging Face's SDPA attention."""
    on = on_for_device(cfg.pack_gqa, lm.device)
    if not use_packed_gqa(lm.model, on) and on and cfg.pack_gqa == "true":  # (auto passes such a model by quietly)
        warnings.warn(
            f"model.pack_gqa=true: {type(lm.model).__name__} runs Hugging Face's attention as it is (packing needs "
            "SDPA attention through transformers' attention functions and fewer key/value heads than query heads)",
            stacklevel=2,
        )
