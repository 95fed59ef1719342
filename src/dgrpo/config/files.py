"""YAML config files and their ``base:`` chains, the packaged configs, ``--set key=value`` overrides,
:func:`load_config` and :func:`to_dict`; an unknown key is answered with the option meant (a close spelling, a
section's option of that name, a TRL name)."""

from __future__ import annotations

import dataclasses
import difflib
import re
import typing
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

import yaml

from ..paths import expand_home
from .base import CONFIG_DIR, ConfigError, _invalid
from .schema import Config, SFTConfig
from .values import _coerce, _field_type, _option_types, _options, _TextBool, _TextFloat, _TextInt, _Written


class ConfigLoader(yaml.SafeLoader):
    """PyYAML's safe loader without YAML 1.1's base-60 numbers (``1:3`` stays the string '1:3', not 63) and octal
    ones (``010`` is ten, as in YAML 1.2 and Python's ``int('010')``, not 8), and with a key given twice in one mapping
    refused (PyYAML keeps the last: a section or option written twice lost the
    first's settings silently). A number or a boolean keeps the text it was written as, for a text option
    (``revision: 1.10`` was the revision '1.1', ``run_name: 1_000`` the name '1000', ``run_name: off`` the name
    'false'; ``--set`` gave them as typed), and a timestamp is its text (no option takes a date)."""

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        number = _TextInt(super().construct_yaml_int(node))
        number.yaml_text = node.value
        return number

    def construct_yaml_float(self, node: yaml.ScalarNode) -> float:
        number = _TextFloat(super().construct_yaml_float(node))
        number.yaml_text = node.value
        return number

    def construct_yaml_bool(self, node: yaml.ScalarNode) -> _TextBool:  # type: ignore[override]
        return _TextBool(super().construct_yaml_bool(node), node.value)

    def construct_yaml_timestamp(self, node: yaml.ScalarNode) -> str:  # type: ignore[override]
        """A timestamp as its text: no option takes a date (``run_name: 2024-12-05T10:00:00Z`` was the name
        '2024-12-05 10:00:00+00:00')."""
        return str(self.construct_scalar(node))

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        """A mapping whose keys are names: a number or a boolean as a key is the text it was written as (every key
        of a dgrpo config names an option or a part of a reward item, none a number or a boolean: ``1: a`` beside
        ``on: b`` was refused as 'the key True is given twice', 1 == True to Python, and the keys of a reward item
        were named as read, 'unknown key(s) True' for ``on:``). A key written twice is refused."""
        seen: set = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # (<<: merged keys may be overridden, as YAML says)
                continue
            key = self._key(key_node)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"the key {key!r} is given twice in one mapping", key_node.start_mark
                )
            seen.add(key)
        self.flatten_mapping(node)  # (<<: the merged keys first, then this mapping's own, which win)
        return {self._key(key_node): self.construct_object(value, deep=deep) for key_node, value in node.value}

    def _key(self, node: yaml.Node) -> Any:
        """A mapping key as the name it was written as (a number's or a boolean's text: ``on``, ``1``); a list or a
        mapping as a key is refused."""
        key = self.construct_object(node, deep=True)
        key = key.yaml_text if isinstance(key, _Written) else key
        if not isinstance(key, typing.Hashable):  # (a list or mapping as a key: '? [lr] : 1')
            raise yaml.constructor.ConstructorError(None, None, f"a key must be a name, got {key!r}", node.start_mark)
        return key

    def resolve(self, kind: type, value: Any, implicit: Any) -> str:
        """The implicit tag of a node; a number with a ':' in it, or an int with a leading 0, is a string (which an
        option of type int or float reads in base 10)."""
        tag = super().resolve(kind, value, implicit)
        if kind is yaml.ScalarNode and ":" in value and tag in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float"):
            return "tag:yaml.org,2002:str"
        if kind is yaml.ScalarNode and tag == "tag:yaml.org,2002:int" and re.fullmatch(r"[-+]?0[0-7_]+", value):
            return "tag:yaml.org,2002:str"
        return tag


ConfigLoader.add_constructor("tag:yaml.org,2002:int", ConfigLoader.construct_yaml_int)
ConfigLoader.add_constructor("tag:yaml.org,2002:float", ConfigLoader.construct_yaml_float)
ConfigLoader.add_constructor("tag:yaml.org,2002:bool", ConfigLoader.construct_yaml_bool)
ConfigLoader.add_constructor("tag:yaml.org,2002:timestamp", ConfigLoader.construct_yaml_timestamp)


def packaged_configs() -> list[str]:
    """The names of the configs shipped with the package (``builtin/sft.yaml``, ``paper/grpo_dropout.yaml``, ...)."""
    return sorted(p.relative_to(CONFIG_DIR).as_posix() for p in CONFIG_DIR.rglob("*.yaml"))


def resolve_config_path(name: str | Path, relative_to: Path | None = None) -> Path:
    """The file a config name means: an existing file path as given (taken from the folder ``relative_to`` when set
    and the path is relative), else a packaged config, with or without ``.yaml`` (``paper/grpo_dropout``) and with or
    without the packaged folder's name before it (``configs/paper/grpo_dropout.yaml``, as torchtune's recipes are
    named); a leading ``~`` is the home folder, as in a data spec (``base: ~/configs/a.yaml`` was not found)."""
    path = expand_home(name)
    if relative_to is not None and not path.is_absolute():
        path = relative_to / path
    if path.is_file():
        return path
    packaged = Path(name).as_posix().removeprefix("configs/").removesuffix(".yaml") + ".yaml"
    if packaged in packaged_configs():
        return CONFIG_DIR / packaged
    if (path / "config.json").is_file():  # (a run's folder: the config it ran with is its config.json)
        raise ConfigError(
            f"config file not found: {path} is a folder; the config a run there ran with is {path / 'config.json'}"
        )
    raise ConfigError(
        f"config file not found: {path} (not a file, and not a packaged config: {', '.join(packaged_configs())})"
    )


def _yaml_problem(e: yaml.YAMLError) -> str:
    """What PyYAML found wrong, and where (``line 4, column 1``), in one line."""
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    mark = getattr(e, "problem_mark", None)
    if problem.endswith("but got '?'"):  # (PyYAML's [...] refuses '?' in an unquoted item: a dataset's options)
        problem += ": quote an item holding '?' ('builtin:test?n_steps=3')"
    return f"{problem} (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else problem


def _read_yaml(path: Path) -> dict:
    """The mapping a YAML config file holds ({} for a file of comments only)."""
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=ConfigLoader)
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {path} is not valid YAML: {_yaml_problem(e)}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"config file {path} is not UTF-8 text (byte {e.start})") from None
    except OSError as e:
        raise ConfigError(f"config file {path}: cannot read it ({e.strerror or e})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of options, got {data!r}")
    return data


def _file_chain(path: Path, seen: tuple[Path, ...] = ()) -> list[tuple[Path, dict]]:
    """``path`` and its ``base:`` chain, deepest base first: (file, the file's own keys without ``base``)."""
    real = path.resolve()
    if real in seen:
        raise ConfigError(f"config files name each other as base in a cycle: {' -> '.join(map(str, (*seen, real)))}")
    data = _read_yaml(path)
    base = data.pop("base", None)
    if base is None:
        return [(path, data)]
    if not isinstance(base, str) or not base.strip():
        raise ConfigError(f"{path}: base must name a config file, got {base!r}")
    try:
        base_path = resolve_config_path(base, relative_to=path.parent)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    return [*_file_chain(base_path, (*seen, real)), (path, data)]


#: TRL ``GRPOConfig`` names and the dgrpo key (or command-line option) each is here: docs/from_trl.md's table, the
#: names that differ (an unknown key of one of these names says which option it is)
TRL_NAMES = {
    "num_generations": "grpo.group_size",
    "per_device_train_batch_size": "grpo.micro_batch_size",
    "gradient_accumulation_steps": "grpo.micro_batch_size",
    "max_completion_length": "grpo.max_new_tokens",
    "max_prompt_length": "data.max_question_tokens",
    "max_steps": "grpo.steps",
    "learning_rate": "grpo.lr",
    "adam_beta1": "grpo.adam_betas",
    "adam_beta2": "grpo.adam_betas",
    "optim": "grpo.optimizer",
    "beta": "grpo.beta0",
    "epsilon": "grpo.eps_low",
    "epsilon_high": "grpo.eps_high",
    "num_iterations": "grpo.mini_epochs",
    "scale_rewards": "grpo.advantage",
    "loss_type": "grpo.aggregation",
    "reward_funcs": "grpo.reward",
    "reward_weights": "grpo.rewards",
    "sync_ref_model": "grpo.ref_renewal_every",
    "ref_model_sync_steps": "grpo.ref_renewal_every",
    "gradient_checkpointing": "grpo.recompute",
    "bf16": "model.dtype",
    "torch_dtype": "model.dtype",
    "peft_config": "model.lora.r",
    "log_completions": "grpo.log_rollouts",
    "logging_steps": "grpo.log_every",
    "eval_steps": "grpo.eval_every",
    "per_device_eval_batch_size": "eval.batch_size",
    "save_steps": "grpo.save_every",
    "save_total_limit": "grpo.keep_last",
    "output_dir": "--out",
    "resume_from_checkpoint": "--resume",
    "report_to": "logging.backends",
    "run_name": "logging.run_name",
}
#: TRL options with no dgrpo option (docs/from_trl.md's "Not here" line), each with what dgrpo has instead or why
#: it has none ('' where the guide says enough): an unknown key of one of these names says so
TRL_ABSENT = {
    "mask_truncated_completions": "",
    "importance_sampling_level": "the importance ratio is per token, TRL's 'token'",
    "use_vllm": "rollouts run the latent recurrence under a replayed dropout mask, in dgrpo's engines (grpo.engine)",
    "warmup_ratio": "grpo.warmup_steps counts GRPO steps",
    "lr_scheduler_type": "the lr warms up, then decays on a cosine to grpo.min_lr_ratio x lr (1: constant)",
    "num_train_epochs": "GRPO runs grpo.steps steps of grpo.prompts_per_step prompts, in shuffled passes over the data",
    "generation_batch_size": "a step generates grpo.prompts_per_step x grpo.group_size rollouts, "
    "grpo.rollout_batch_size at a time",
    "steps_per_generation": "one optimizer step per generation batch (grpo.mini_epochs: several, each over all of it)",
    "top_k": "sampling has grpo.temperature and grpo.top_p (greedy by default)",
    "min_p": "sampling has grpo.temperature and grpo.top_p (greedy by default)",
    "repetition_penalty": "sampling has grpo.temperature and grpo.top_p (greedy by default)",
    "delta": "the ratio of a token of negative advantage has no upper bound, as in TRL by default (delta None); "
    "grpo.huber_delta is the threshold of the KL estimate's Huber form, another thing",
    "top_entropy_quantile": "every answer token is in the policy loss, as TRL's default 1.0 keeps them all",
    "adam_epsilon": "AdamW's eps is torch's 1e-8, TRL's default",
    "fp16": "no float16, in the weights or autocast: model.dtype is float32 or bfloat16",
    "disable_dropout": "the model's own dropout modules are always off in GRPO (eval mode, TRL's True); the only "
    "noise is the seeded, replayed perturbation (perturbation.*; perturbation.kind=none: none)",
    "ref_model_mixup_alpha": "the reference is renewed as a hard copy of the policy (alpha 1) every "
    "grpo.ref_renewal_every steps",
    "num_generations_eval": "validation decodes one answer per prompt, under eval.* and no perturbation",
    "multi_objective_aggregation": "the weighted parts of grpo.rewards are summed, then the advantage is taken: "
    "TRL's default sum_then_normalize",
}
#: TRL names whose option in SFT (``dgrpo sft``) is not their GRPO option's of the same name: the ``sft`` section's
#: answer, and at the top level the second one after GRPO's
TRL_SFT_NAMES = {
    "gradient_accumulation_steps": "sft.grad_accum",
    "per_device_train_batch_size": "sft.batch_size",
    "num_train_epochs": "sft.num_epochs",
    "lr_scheduler_type": "sft.lr_schedule",
    "bf16": "sft.bf16",
}
#: TRL ``SFTConfig`` options with no ``sft`` option, each with what SFT has instead (the ``sft`` section's answer)
TRL_SFT_ABSENT = {
    "warmup_ratio": "sft.warmup_steps counts optimizer steps",
    "max_steps": "SFT runs sft.num_epochs epochs, sft.epochs_per_stage per curriculum stage",
    "adam_epsilon": "AdamW's eps is torch's 1e-8, TRL's default",
    "fp16": "no float16 autocast: sft.bf16 autocasts to bfloat16 (model.dtype: float32 or bfloat16 weights)",
    "logging_steps": "SFT logs every 10th optimizer step, each epoch's last and any step not applied (metrics.jsonl)",
    "eval_steps": "SFT validates at each curriculum stage's end (sft.eval_each_stage) and, with sft.eval_every_epoch, "
    "at every epoch's end",
}
#: what the option a TRL name maps to is, where its meaning differs from TRL's (gradient_accumulation_steps counts
#: micro-batches; grpo.micro_batch_size is their size)
_NOTES = {
    "sft.batch_size": ": examples per optimizer step over all processes, in sft.grad_accum micro-batches",
    "grpo.micro_batch_size": ": rollouts per forward and backward of the update, the step's grpo.prompts_per_step x "
    "grpo.group_size rollouts however split",
    "model.lora.r": " (LoraConfig's r; its lora_alpha and target_modules are model.lora.alpha and .target_modules)",
    "model.dtype": ": the weights' dtype, float32 or bfloat16 (no float16, no 'auto')",
    "sft.bf16": ": bf16 autocast, on CUDA only by default (auto)",
    "eval.batch_size": ": prompts per generation call in each process (TRL's default 8, dgrpo's 256)",
}


#: PEFT ``LoraConfig`` names (and the rank's other common names) that are a ``model.lora`` option of another name
#: here: an unknown key of one of these names in ``model.lora`` says which option it is, and what it does here
PEFT_NAMES = {
    "lora_alpha": "model.lora.alpha",
    "lora_dropout": "model.lora.dropout",
    "rank": "model.lora.r",
    "lora_r": "model.lora.r",
    "lora_rank": "model.lora.r",
}
#: what the ``model.lora`` option a :data:`PEFT_NAMES` name maps to does here
_PEFT_NOTES = {
    "model.lora.alpha": ": the adapter adds alpha / r x B A to each targeted weight, PEFT's default scaling "
    "(no rsLoRA)",
    "model.lora.dropout": ": anything but 0 is replaced by 0 with a warning (the update replays the rollout's network; "
    "the perturbation is the only noise)",
    "model.lora.r": ": LoraConfig's r, the adapter rank (0: no adapters, every weight trained)",
}
#: PEFT ``LoraConfig`` options with no ``model.lora`` option, each with what dgrpo's adapters do (PEFT's default, or
#: what stands for it): an unknown key of one of these names in ``model.lora`` says so
PEFT_ABSENT = {
    "use_rslora": "the adapter is scaled by alpha / r, PEFT's default; rsLoRA's alpha / sqrt(r) with lora_alpha=a "
    "is model.lora.alpha=a x sqrt(r)",
    "use_dora": "plain LoRA (PEFT's default): no DoRA magnitude vectors",
    "bias": "biases stay frozen, PEFT's default 'none': the adapters train, and the latent markers' rows "
    "(model.lora.train_latent_tokens)",
    "modules_to_save": "no module trains whole beside the adapters, only the latent markers' rows "
    "(model.lora.train_latent_tokens); model.lora.r=0 trains every weight",
    "init_lora_weights": "PEFT's default: B is 0, so the adapter starts as a no-op (the policy starts as the base)",
    "fan_in_fan_out": "PEFT sets it itself for the layers that need it (GPT-2's Conv1D)",
    "layers_to_transform": "every layer's targets get adapters; model.lora.target_modules takes a module's dotted "
    "name to adapt one layer's (Qwen2: layers.0.self_attn.q_proj)",
}


def _peft_name(name: str, prefix: str) -> str:
    """' (PEFT's lora_alpha is model.lora.alpha here: ...)' for an unknown key of ``model.lora`` that is a PEFT
    ``LoraConfig`` name (:data:`PEFT_NAMES`; one of :data:`PEFT_ABSENT` has none here, and says what dgrpo does
    instead); '' for any other key or section."""
    if prefix != "model.lora.":
        return ""
    if name in PEFT_NAMES:
        key = PEFT_NAMES[name]
        whose = "" if key == "model.lora.r" else "PEFT's "  # (rank, lora_r, lora_rank: other tools' names of r)
        return f" ({whose}{name} is {key} here{_PEFT_NOTES[key]})"
    if name in PEFT_ABSENT:
        return f" (PEFT's {name} has no counterpart here: {PEFT_ABSENT[name]})"
    return ""


def _trl_name(obj: Any, name: str, prefix: str) -> str:
    """' (TRL's num_generations is grpo.group_size here; see docs/from_trl.md)' for an unknown key that is a TRL
    name (:data:`TRL_NAMES`; one of :data:`TRL_ABSENT` has none here, and says what there is instead), answered for
    its section: ``sft.*`` by :data:`TRL_SFT_NAMES` (``sft.gradient_accumulation_steps``: sft.grad_accum) or
    :data:`TRL_SFT_ABSENT` (``sft.warmup_ratio``: none, sft.warmup_steps counts optimizer steps), another
    section by its option of the same name (``sft.learning_rate``: sft.lr), or '' when it has none; at the top level
    SFT's option follows GRPO's where they differ."""
    here = prefix.rstrip(".")
    sft = TRL_SFT_NAMES.get(name)
    if here == "sft" and sft:
        return f" (TRL's {name} is {sft} here{_NOTES.get(sft, '')}; see docs/from_trl.md)"
    if here == "sft" and name in TRL_SFT_ABSENT:
        return f" (TRL's {name} has no counterpart in SFT: {TRL_SFT_ABSENT[name]}; see docs/from_trl.md)"
    also = f"; in SFT it is {sft}{_NOTES.get(sft, '')}" if sft and here == "" else ""
    if name in TRL_ABSENT:  # (GRPO's: in another section, e.g. sft.warmup_ratio, the reason would be wrong)
        why = f": {TRL_ABSENT[name]}" if TRL_ABSENT[name] else ""
        where = "here" if sft is None else "in GRPO"
        ok = here in ("", "grpo")
        return f" (TRL's {name} has no counterpart {where}{why}{also}; see docs/from_trl.md)" if ok else ""
    target = TRL_NAMES.get(name)
    if target is None:
        return ""
    section, _, leaf = target.rpartition(".")
    if here not in ("", "grpo") and section == "grpo":  # (a training option: the section's own, if it has one)
        if leaf in {f.name for f in fields(obj)}:
            target = f"{prefix}{leaf}"
        elif here != "model":
            return ""
        else:  # (the model section, both commands': GRPO's option, and SFT's)
            twin = sft or (f"sft.{leaf}" if leaf in {f.name for f in fields(SFTConfig)} else "")
            also = f"; in SFT it is {twin}{_NOTES.get(twin, '')}" if twin else ""
    return f" (TRL's {name} is {target} here{_NOTES.get(target, '')}{also}; see docs/from_trl.md)"


def _did_you_mean(obj: Any, name: str, prefix: str) -> str:
    """'; did you mean ...?' for an unknown key: a close spelling in its section, then the options of that name in
    other sections, nested ones included (``lr`` -> ``grpo.lr``, ``sft.lr``; ``sft.beta0`` -> ``grpo.beta0``;
    ``model.r`` -> ``model.lora.r``; ``task.train`` -> ``task.n_train`` or ``data.train``), and the nested sections
    of that name (``lora: {r: 8}`` at the top -> ``model.lora``); '' when nothing is close."""
    root = obj if not prefix else Config()
    keys = [k for o in _options(type(root)) for k in (o.key.rpartition(".")[0], o.key)]  # (each option's section too)
    holders = [
        k for k in dict.fromkeys(keys) if k and k.rpartition(".")[2] == name and k.rpartition(".")[0] + "." != prefix
    ]
    names = [f.name for f in fields(obj)]
    close = [n for n in names if n == name.lower()] or difflib.get_close_matches(name, names, n=1, cutoff=0.75)
    if not prefix and holders:  # (at the top: a section's option, before a close section name)
        close = []
    keys = [f"{prefix}{c}" for c in close if f"{prefix}{c}" not in holders] + holders
    return f"; did you mean {' or '.join(keys)}?" if keys else ""


def _dotted(obj: Any, key: str, prefix: str) -> str:
    """'; a config file nests it ...' for a file's dotted key (``grpo.steps: 3``, --set's form) in the section
    ``prefix`` ('' at the top, ``model.`` ...), which was 'unknown config key 'grpo.steps'' beside a list of sections
    that holds grpo; '' for any other key."""
    head, *rest = key.split(".")
    if rest and head in {f.name for f in fields(obj)} and is_dataclass(getattr(obj, head)):
        nested = "".join(f"{{{part}: " for part in rest) + "..." + "}" * len(rest)
        return f"; a config file nests it, {head}: {nested} ({prefix}{key}=... is the form of --set)"
    return ""


def _merge(obj: Any, data: dict, prefix: str) -> None:
    """Apply a nested mapping of options onto the dataclass ``obj``, coercing each value to its option's type."""
    if not isinstance(data, dict):
        raise _invalid(prefix.rstrip(".") or "<root>", f"expected a mapping, got {data!r}")
    names = {f.name: f for f in fields(obj)}
    for k, v in data.items():
        name = str(k)  # (a YAML key is the name it was written as: ConfigLoader.construct_mapping)
        key = f"{prefix}{name}"
        if k not in names:
            hint = _dotted(obj, name, prefix) or _trl_name(obj, name, prefix) or _peft_name(name, prefix)
            hint = hint or _did_you_mean(obj, name, prefix)
            if not prefix and name.strip().lower() == "base":  # (a file's base config: read before the keys)
                hint = "; did you mean base (lower case: the file this one builds on)?"
            raise ConfigError(f"unknown config key {key!r}{hint} (known: {', '.join(sorted(names))})")
        cur = getattr(obj, k)
        if is_dataclass(cur):
            _merge(cur, {} if v is None else v, key + ".")  # (None: a section whose keys are all commented out)
        else:
            setattr(obj, k, _coerce(v, _field_type(type(obj), k), key))


def merge_file(cfg: Any, path: str | Path) -> Any:
    """Apply a YAML config file (after its ``base:`` chain) onto ``cfg`` in place: no reset to the defaults, no
    validation. ``path`` is a file or a packaged config name (:func:`resolve_config_path`). Returns ``cfg``."""
    for file, data in _file_chain(resolve_config_path(path)):
        try:
            _merge(cfg, data, "")
        except ConfigError as e:
            raise ConfigError(f"{file}: {e}") from None
    return cfg


def _parse_override(raw: str) -> Any:
    """A ``--set`` value read as YAML (``1e-5``, ``true``, ``[a, b]``, ``{lr: 1}``). Text YAML cannot read, or reads
    as a block mapping (``-2:`` is YAML for ``{-2: null}``), is taken as it is; but ``[a, b]`` that YAML cannot read
    is a list of its comma-separated items, each read alone (PyYAML's ``[...]`` refuses ``?`` in an unquoted item,
    as in the dataset name ``builtin:test?n_steps=3``, which a list of test sets names)."""
    if raw == "":
        return ""
    try:
        value = yaml.load(raw, Loader=ConfigLoader)
    except yaml.YAMLError:
        if len(raw) >= 2 and raw[0] + raw[-1] == "[]" and not any(c in raw[1:-1] for c in "[]{}"):
            inner = raw[1:-1].strip()
            return [_parse_override(item.strip()) for item in inner.split(",")] if inner else []
        return raw
    return raw if isinstance(value, dict) and not raw.startswith("{") else value


def set_value(cfg: Any, dotted: str, raw: str) -> None:
    """Apply one ``a.b=value`` override; ``raw`` is parsed as YAML (so ``1e-5``, ``true``, ``[a, b]`` work), except
    for a text option, which takes the text as typed (a run named ``007`` or a dataset ``off`` stays so; YAML would
    read 7 and false); a quoted text is unquoted, and ``null`` / ``~`` are the empty text as in a YAML file. A text
    option given ``[...]`` or ``{...}`` unquoted is a ConfigError (a list meant for a text option)."""
    as_yaml = (len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "'\"") or raw in ("null", "Null", "NULL", "~")
    cls: type = type(cfg)
    text = _option_types(cls).get(dotted) is str
    if text and not as_yaml and len(raw) >= 2 and raw[0] + raw[-1] in ("[]", "{}"):
        kind = "a list" if raw[0] == "[" else "a mapping"
        raise ConfigError(
            f"invalid config value {dotted}: expected one text value, got {kind} {raw!r} (quote it, "
            f"{dotted}=\"'{raw}'\", to mean the text)"
        )
    nested: Any = raw if text and not as_yaml else _parse_override(raw)
    for p in reversed(dotted.split(".")):
        nested = {p: nested}
    _merge(cfg, nested, "")


def override_keys(override: str) -> list[str]:
    """The options a ``--set key=value`` gives a value: its key, or each key below it that a mapping sets, as
    :func:`set_value` merges it (``data={eval_limit: 50}`` sets ``data.eval_limit``)."""
    key, _, raw = override.partition("=")

    def leaves(prefix: str, value: Any) -> list[str]:
        if not isinstance(value, dict):
            return [prefix]
        return [k for sub, v in value.items() for k in leaves(f"{prefix}.{sub}", v)]

    return leaves(key.strip(), _parse_override(raw.strip()))


def _check_load_args(cls: object, overrides: object) -> None:
    """TypeError (one line) for what a Python caller of :func:`load_config` may slip on: the config class left out
    (``load_config("tiny.yaml")``: "'str' object is not callable"), ``overrides`` as one string (read a character at a
    time) or a dict (each key read as an override without ``=``)."""
    if not (isinstance(cls, type) and is_dataclass(cls)):
        raise TypeError(
            f"load_config: the first argument is the config class, got {type(cls).__name__} "
            "(load_config(Config, 'tiny.yaml', ['grpo.steps=3']))"
        )
    if overrides is not None and (
        not isinstance(overrides, (list, tuple)) or not all(isinstance(o, str) for o in overrides)
    ):
        hint = " (a dict: [f'{k}={v}' for k, v in d.items()])" if isinstance(overrides, dict) else ""
        raise TypeError(
            f"load_config: overrides must be a list of 'key=value' strings, as --set takes them, got "
            f"{type(overrides).__name__}{hint}"
        )


def load_config(
    cls: type,
    path: str | Path | list[str | Path] | tuple[str | Path, ...] | None = None,
    overrides: list[str] | tuple[str, ...] | None = None,
    *,
    start: dict | None = None,
    validate: bool = True,
) -> Any:
    """Defaults of ``cls``, then ``start`` (a nested dict of values, e.g. the settings a checkpoint was trained
    with), then each file (its ``base:`` chain first; several files apply in order), then ``--set key=value``;
    validated (``validate=False``: each value is checked as it is set, the rules between keys not yet: a part of
    the settings, applied later over others)."""
    _check_load_args(cls, overrides)
    cfg = cls()
    if start:
        _merge(cfg, start, "")
    for file in path if isinstance(path, (list, tuple)) else [path] if path is not None else []:
        merge_file(cfg, file)
    for ov in overrides or []:
        if "=" not in ov:
            raise ConfigError(f"--set expects key=value, got {ov!r} (a positional argument goes before --set)")
        k, v = ov.split("=", 1)
        set_value(cfg, k.strip(), v.strip())
    if validate:
        cfg.validate()
    return cfg


def to_dict(cfg: Any) -> dict:
    """The config as nested plain dicts (as written to a run's config.json)."""
    return dataclasses.asdict(cfg)
