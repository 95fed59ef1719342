"""Typed, validated configuration: dataclass defaults (the one source of truth), YAML files, ``--set`` overrides.

:func:`load_config` builds a config in this order, each step over the previous one:

1. the dataclass defaults (they are Dropout-GRPO on the built-in task);
2. the ``base:`` chain of the config file, deepest base first: a file may name one base, as a path relative to
   itself or as a packaged config name (:func:`merge_file` applies a file and its chain to an existing config);
3. the config file's own keys;
4. ``--set key=value`` overrides, each value read as YAML (:func:`set_value`);
5. :meth:`Config.validate`: ranges, relations between options and the ``perturbation.layers`` grammar.

Types are checked once, as each value is applied (:func:`_coerce`): a ``Literal`` option accepts only its
choices, a float must be finite and 0 or of a size float32 holds (:data:`FLOAT32_TINY` to :data:`FLOAT32_MAX`), an int
must fit in int64. YAML is read by :class:`ConfigLoader`, which keeps ``1:3`` a string (YAML 1.1 would read it as
the base-60 number 63) and gives a text option a number or a boolean as written (``run_name: off`` is the name 'off';
a boolean option reads yes / no / on / off / true / false as before). The packaged configs live in ``dgrpo/configs``
(:func:`packaged_configs`, :func:`resolve_config_path`). Every option is a dataclass field with a ``doc`` in its
metadata; ``dgrpo config show`` and docs/config.md (:func:`config_markdown`) list them all. Invalid values raise
:class:`ConfigError`, which the CLI turns into one line on stderr and exit code 2.

The package, one job per module (each imports only the ones before it): :mod:`.base` (ConfigError, the choices'
types, the shared checks), :mod:`.values` (a value coerced to its option's type), :mod:`.schema` (the sections'
dataclasses and their validation), :mod:`.files` (YAML, packaged configs, overrides, loading) and :mod:`.docs` (the
options listed). Every public name is imported from ``dgrpo.config``.
"""

from __future__ import annotations

from .base import (
    BEST_METRIC_HELP,
    CONFIG_DIR,
    FLOAT32_MAX,
    FLOAT32_TINY,
    FSDP_ENV,
    LAYER_GRAMMAR,
    MAX_BUILTIN_PARAMS,
    MAX_HUBER_DELTA,
    MAX_THREADS,
    REGISTERED_CHOICES,
    Advantage,
    Aggregation,
    Arch,
    AutoSwitch,
    BestMetric,
    CompileBackend,
    CompileMode,
    ConfigError,
    DType,
    Engine,
    FSDPMode,
    GaussianTarget,
    Kernels,
    KLForm,
    LatentTokenInit,
    LRSchedule,
    Optimizer,
    PerturbationKind,
    RecomputeGranularity,
    ReplayMode,
    ResetEvery,
    RolloutCache,
    SFTMode,
    fsdp_from_env,
    fsdp_mode,
    fsdp_setting,
    opt,
    parse_layer_spec,
)
from .docs import config_markdown, describe, main, matching_keys
from .files import (
    TRL_NAMES,
    ConfigLoader,
    load_config,
    merge_file,
    override_keys,
    packaged_configs,
    resolve_config_path,
    set_value,
    to_dict,
)
from .schema import (
    BUILTIN_SCORERS,
    BUILTIN_SHAPE,
    MAX_CUDA_INDEX,
    PERTURBATION_SITES,
    RECOMPUTE_KEPT_LAYERS_HELP,
    RECOMPUTE_LATENT_STEPS_HELP,
    Config,
    DataConfig,
    EvalConfig,
    GRPOConfig,
    LoggingBackend,
    LoggingConfig,
    LoraConfig,
    ModelConfig,
    PerturbationConfig,
    SFTConfig,
    TaskConfig,
    reward_name,
    unused_model_settings,
    unused_recompute_settings,
    unused_sft_settings,
    wandb_name_advice,
)
from .values import PLUGIN_CHOICES, Option

__all__ = [
    "Advantage",
    "Aggregation",
    "Arch",
    "AutoSwitch",
    "BEST_METRIC_HELP",
    "BUILTIN_SCORERS",
    "BUILTIN_SHAPE",
    "BestMetric",
    "CONFIG_DIR",
    "CompileBackend",
    "CompileMode",
    "Config",
    "ConfigError",
    "ConfigLoader",
    "DType",
    "DataConfig",
    "Engine",
    "EvalConfig",
    "FLOAT32_MAX",
    "FLOAT32_TINY",
    "FSDPMode",
    "FSDP_ENV",
    "GRPOConfig",
    "GaussianTarget",
    "KLForm",
    "Kernels",
    "LAYER_GRAMMAR",
    "LRSchedule",
    "LatentTokenInit",
    "LoggingBackend",
    "LoggingConfig",
    "LoraConfig",
    "MAX_BUILTIN_PARAMS",
    "MAX_CUDA_INDEX",
    "MAX_HUBER_DELTA",
    "MAX_THREADS",
    "ModelConfig",
    "Optimizer",
    "Option",
    "PERTURBATION_SITES",
    "PLUGIN_CHOICES",
    "PerturbationConfig",
    "PerturbationKind",
    "RECOMPUTE_KEPT_LAYERS_HELP",
    "RECOMPUTE_LATENT_STEPS_HELP",
    "REGISTERED_CHOICES",
    "RecomputeGranularity",
    "ReplayMode",
    "ResetEvery",
    "RolloutCache",
    "SFTConfig",
    "SFTMode",
    "TRL_NAMES",
    "TaskConfig",
    "config_markdown",
    "describe",
    "fsdp_from_env",
    "fsdp_mode",
    "fsdp_setting",
    "load_config",
    "main",
    "matching_keys",
    "merge_file",
    "opt",
    "override_keys",
    "packaged_configs",
    "parse_layer_spec",
    "resolve_config_path",
    "reward_name",
    "set_value",
    "to_dict",
    "unused_model_settings",
    "unused_recompute_settings",
    "unused_sft_settings",
    "wandb_name_advice",
]
