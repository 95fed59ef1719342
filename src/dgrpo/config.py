"""Typed, validated configuration: dataclass defaults (the one source of truth), YAML files, ``--set`` overrides.

Every option is a dataclass field with a ``doc`` in its metadata; ``dgrpo config show`` prints them all.
Invalid values raise :class:`ConfigError`, which the CLI turns into one line on stderr and exit code 2.
"""
from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """An invalid configuration: unknown key, wrong type or value out of range."""


def opt(default: Any, doc: str, **kw: Any) -> Any:
    """A documented config field."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata={"doc": doc, **kw})
    return field(default=default, metadata={"doc": doc, **kw})


def _check(cond: bool, key: str, msg: str) -> None:
    if not cond:
        raise ConfigError(f"invalid config value {key}: {msg}")


@dataclass
class ModelConfig:
    name_or_path: str = opt("builtin-tiny", "HF model id or local directory; 'builtin-tiny' builds the tiny from-scratch model of the built-in task")
    arch: str = opt("qwen2", "architecture of the built-in tiny model: qwen2 | llama | gpt2")
    hidden_size: int = opt(128, "built-in tiny model: hidden size")
    num_layers: int = opt(4, "built-in tiny model: number of layers")
    num_heads: int = opt(4, "built-in tiny model: attention heads")
    intermediate_size: int = opt(512, "built-in tiny model: MLP width")
    dtype: str = opt("float32", "weight dtype: float32 | bfloat16 (bf16 weights, as the paper trains)")
    trust_remote_code: bool = opt(False, "allow custom modelling code from the hub (only if you trust the repository)")

    def validate(self, p: str = "model") -> None:
        _check(self.arch in ("qwen2", "llama", "gpt2"), f"{p}.arch", f"expected qwen2, llama or gpt2, got {self.arch!r}")
        _check(self.dtype in ("float32", "bfloat16"), f"{p}.dtype", f"expected float32 or bfloat16, got {self.dtype!r}")
        for k in ("hidden_size", "num_layers", "num_heads", "intermediate_size"):
            _check(getattr(self, k) > 0, f"{p}.{k}", "must be > 0")
        _check(self.hidden_size % self.num_heads == 0, f"{p}.hidden_size", "must be divisible by num_heads")


@dataclass
class TaskConfig:
    """The built-in synthetic task (used when a dataset name starts with 'builtin')."""

    n_steps: int = opt(4, "operations per problem (= reasoning steps)")
    modulus: int = opt(10, "all arithmetic is modulo this number")
    max_operand: int = opt(9, "largest operand of + and - (in-distribution)")
    ood_extra_steps: int = opt(2, "the 'ood_steps' test split has n_steps + this many steps")
    ood_max_operand: int = opt(99, "the 'ood_numbers' test split draws +/- operands from 10..this")
    n_train: int = opt(16000, "training problems")
    n_valid: int = opt(1000, "validation problems")
    n_test: int = opt(2000, "test problems (each test split)")
    seed: int = opt(1234, "generation seed of the task (fixed, independent of the training seed)")

    def validate(self, p: str = "task") -> None:
        _check(self.n_steps >= 1, f"{p}.n_steps", "must be >= 1")
        _check(self.modulus >= 2, f"{p}.modulus", "must be >= 2")
        _check(self.max_operand >= 1, f"{p}.max_operand", "must be >= 1")
        _check(self.ood_max_operand >= 10, f"{p}.ood_max_operand", "must be >= 10")
        for k in ("n_train", "n_valid", "n_test"):
            _check(getattr(self, k) >= 1, f"{p}.{k}", "must be >= 1")


@dataclass
class DataConfig:
    train: str = opt("builtin:train", "training data: dataset name or file path, optionally 'name:split'")
    valid: str = opt("builtin:valid", "held-out data for per-stage / periodic eval ('' to disable)")
    test: list = opt(["builtin:test", "builtin:ood_steps", "builtin:ood_numbers"], "datasets evaluated at the end")
    max_question_tokens: int = opt(256, "questions longer than this are truncated from the left")
    max_target_tokens: int = opt(256, "steps + answer longer than this are truncated")
    eval_limit: int = opt(500, "evaluate at most this many records of data.valid during training (0 = all)")

    def validate(self, p: str = "data") -> None:
        _check(bool(self.train), f"{p}.train", "must name a dataset")
        _check(self.max_question_tokens > 0 and self.max_target_tokens > 0, f"{p}.max_*_tokens", "must be > 0")
        _check(self.eval_limit >= 0, f"{p}.eval_limit", "must be >= 0")


@dataclass
class SFTConfig:
    mode: str = opt("coconut", "coconut | cot (written steps) | no_cot (answer only) | pause (pause-as-thought: <|latent|> tokens, no recurrence) | no_curriculum (coconut, final stage from the start)")
    c_thought: int = opt(1, "latent thoughts per reasoning step (c)")
    epochs_per_stage: int = opt(2, "epochs per curriculum stage; stage = epoch // epochs_per_stage")
    max_latent_stage: int = opt(2, "largest stage that replaces steps one by one; later epochs drop all steps (Coconut)")
    num_epochs: int = opt(6, "total epochs (Coconut: stage k for epochs [k*eps, (k+1)*eps))")
    pad_latent_to_max: bool = opt(False, "at stages past max_latent_stage use max_latent_stage*c latents even for short chains")
    uniform_prob: float = opt(0.0, "probability of training an example at a uniformly random earlier stage (Coconut)")
    reset_optimizer: bool = opt(True, "new AdamW state (and new warmup) at each stage boundary, as Coconut does")
    lr: float = opt(1e-3, "peak learning rate (AdamW)")
    weight_decay: float = opt(0.01, "AdamW weight decay")
    warmup_steps: int = opt(30, "linear warmup steps (per stage when reset_optimizer)")
    batch_size: int = opt(64, "examples per optimizer step, global over ranks (split into grad_accum micro-batches)")
    grad_accum: int = opt(1, "micro-batches per optimizer step; batch_size must divide by it")
    max_grad_norm: float = opt(1.0, "gradient clipping (0 = off)")
    bf16: str = opt("auto", "bf16 autocast: auto (on CUDA only) | true | false")
    eval_each_stage: bool = opt(True, "greedy accuracy on data.valid at the end of each stage")
    save_every: int = opt(500, "write a resumable checkpoint (weights, optimizer, RNG, counters) every N steps (0 = stage ends only)")
    keep_last: int = opt(2, "resumable checkpoints kept in OUT/checkpoints")
    max_nonfinite: int = opt(5, "stop (after saving) when this many steps in a row had a non-finite loss or gradient")

    def validate(self, p: str = "sft") -> None:
        _check(self.mode in ("coconut", "cot", "no_cot", "pause", "no_curriculum"), f"{p}.mode", f"unknown mode {self.mode!r}")
        _check(self.c_thought >= 1, f"{p}.c_thought", "must be >= 1")
        _check(self.epochs_per_stage >= 1, f"{p}.epochs_per_stage", "must be >= 1")
        _check(self.max_latent_stage >= 0, f"{p}.max_latent_stage", "must be >= 0")
        _check(self.num_epochs >= 1, f"{p}.num_epochs", "must be >= 1")
        _check(0.0 <= self.uniform_prob <= 1.0, f"{p}.uniform_prob", "must be in [0, 1]")
        _check(self.lr > 0, f"{p}.lr", "must be > 0")
        _check(self.batch_size >= 1 and self.grad_accum >= 1, f"{p}.batch_size", "batch_size and grad_accum must be >= 1")
        _check(self.batch_size % self.grad_accum == 0, f"{p}.grad_accum", f"batch_size {self.batch_size} is not divisible by grad_accum {self.grad_accum}")
        _check(self.bf16 in ("auto", "true", "false"), f"{p}.bf16", "expected auto, true or false")
        _check(self.warmup_steps >= 0 and self.max_grad_norm >= 0, f"{p}.warmup_steps", "must be >= 0")
        _check(self.save_every >= 0 and self.keep_last >= 1 and self.max_nonfinite >= 1, f"{p}.save_every",
               "save_every >= 0, keep_last >= 1, max_nonfinite >= 1")


@dataclass
class EvalConfig:
    batch_size: int = opt(256, "prompts per generation batch")
    max_new_tokens: int = opt(64, "answer tokens generated after the latents")
    n_latent: int = opt(-1, "latent thoughts at eval; -1 = the checkpoint's final-stage count")
    temperature: float = opt(0.0, "0 = greedy pass@1")
    top_p: float = opt(1.0, "nucleus sampling mass (with temperature > 0)")
    limit: int = opt(0, "evaluate at most this many records (0 = all)")
    shots: int = opt(0, "plain causal LM only: number of worked examples in the chain-of-thought prompt")
    plain: bool = opt(False, "evaluate as a plain causal LM (no latents, CoT prompt): the base-model rows of Table 1")

    def validate(self, p: str = "eval") -> None:
        _check(self.batch_size >= 1, f"{p}.batch_size", "must be >= 1")
        _check(self.max_new_tokens >= 1, f"{p}.max_new_tokens", "must be >= 1")
        _check(self.n_latent >= -1, f"{p}.n_latent", "must be >= 0 (or -1 for the checkpoint's value)")
        _check(self.temperature >= 0, f"{p}.temperature", "must be >= 0")
        _check(0 < self.top_p <= 1, f"{p}.top_p", "must be in (0, 1]")
        _check(self.limit >= 0 and self.shots >= 0, f"{p}.limit", "must be >= 0")


@dataclass
class PerturbationConfig:
    kind: str = opt("locked", "locked (batched shared-mask dropout) | native (model attention dropout, RNG restore, sequential) | gaussian | none")
    p: float = opt(0.1, "dropout probability (locked, native)")
    sites: list = opt(["mlp"], "where locked/gaussian noise is applied: any of attn (attention output), mlp (MLP output), residual (block output)")
    layers: str = opt("all", "which layers: all, an index, a python slice like 0:4 or -2:, or a list like 1,3")
    perturb_prompt: bool = opt(True, "perturb the prompt pass too (one network sample per rollout, as the variational reading needs); false = only latents and answer, prompt KV shared by the K rollouts")
    sigma: float = opt(0.1, "gaussian: noise scale")
    gaussian_target: str = opt("activations", "gaussian: activations (multiplicative, per rollout) | weights (additive on output projections)")

    def validate(self, p: str = "perturbation") -> None:
        _check(self.kind in ("locked", "native", "gaussian", "none"), f"{p}.kind", f"unknown kind {self.kind!r}; expected locked, native, gaussian or none")
        _check(0.0 <= self.p < 1.0, f"{p}.p", f"must be in [0, 1), got {self.p}")
        _check(all(x in ("attn", "mlp", "residual") for x in self.sites) and len(self.sites) > 0, f"{p}.sites", f"expected a non-empty list of attn, mlp, residual; got {self.sites}")
        _check(self.sigma >= 0, f"{p}.sigma", "must be >= 0")
        _check(self.gaussian_target in ("activations", "weights"), f"{p}.gaussian_target", "expected activations or weights")


@dataclass
class GRPOConfig:
    steps: int = opt(100, "optimizer steps (paper: 3000)")
    prompts_per_step: int = opt(16, "prompts (groups) per step, global over all ranks (paper: 16)")
    group_size: int = opt(8, "K rollouts per prompt (paper: 32); 1 only with advantage=ema")
    n_latent: int = opt(-1, "latent thoughts per rollout (T); -1 = the checkpoint's final-stage count")
    temperature: float = opt(0.0, "answer decoding: 0 = greedy (paper); > 0 samples tokens")
    top_p: float = opt(1.0, "nucleus mass when temperature > 0")
    max_new_tokens: int = opt(48, "answer tokens per rollout")
    lr: float = opt(1e-5, "peak learning rate (paper: 1e-5)")
    warmup_steps: int = opt(10, "linear warmup, then cosine decay to min_lr_ratio * lr (paper: 200)")
    min_lr_ratio: float = opt(0.0, "final lr as a fraction of the peak")
    optimizer: str = opt("adamw", "adamw | adamw8bit (bitsandbytes on CUDA; falls back to adamw with a warning elsewhere)")
    weight_decay: float = opt(0.0, "AdamW weight decay")
    max_grad_norm: float = opt(1.0, "gradient clipping (0 = off)")
    mini_epochs: int = opt(1, "E: passes over each rollout batch (theta_old fixed within them)")
    micro_batch_size: int = opt(64, "rollouts per forward/backward in the update (the loss does not depend on it)")
    rollout_batch_size: int = opt(512, "rollouts per batched generation call")
    advantage: str = opt("drgrpo", "drgrpo: r - mean (paper) | grpo: std-normalised | rloo | ema: REINFORCE with a running baseline")
    ema_alpha: float = opt(0.95, "EMA baseline decay (advantage=ema)")
    eps_low: float = opt(0.10, "PPO clip below 1 (paper 0.10)")
    eps_high: float = opt(0.12, "PPO clip above 1 (paper 0.12)")
    aggregation: str = opt("seq_mean", "seq_mean (paper) | token_mean | constant (Dr. GRPO)")
    beta0: float = opt(5e-3, "peak KL coefficient (paper 5e-3); 0 disables the KL term and the reference model")
    anneal_beta: bool = opt(True, "beta(t) = beta0 * lr(t) / lr_max (Eq. 8); false keeps beta0")
    kl_form: str = opt("unbiased", "unbiased: x = log pi_ref - log pi (Schulman k3) | paper: x = log pi - log pi_ref (as the paper writes it)")
    huber_delta: float = opt(5.0, "Huberized k3 threshold delta (Eq. 7)")
    ref_renewal_every: int = opt(500, "hard-copy the policy into the reference every N steps (0 = never)")
    filter: bool = opt(True, "drop groups whose accuracy is outside [alpha_min, alpha_max] (inclusive)")
    alpha_min: float = opt(0.20, "group-accuracy filter lower bound")
    alpha_max: float = opt(0.95, "group-accuracy filter upper bound")
    replay: str = opt("seed", "seed: update under the rollout's own perturbation (mask replay) | fresh: new seeds at update (CRN ablation)")
    eval_every: int = opt(20, "greedy eval without perturbation on data.valid every N steps (0 = only at start and end)")
    save_best: bool = opt(True, "keep best/ = the best post-warmup checkpoint by validation accuracy")
    log_every: int = opt(1, "write a metrics row every N steps")
    save_every: int = opt(50, "write a resumable checkpoint (weights, optimizer, RNG, counters) every N steps (0 = only at the end)")
    keep_last: int = opt(2, "resumable checkpoints kept in OUT/checkpoints")
    max_nonfinite: int = opt(5, "stop (after saving) when this many steps in a row had a non-finite loss or gradient")

    def validate(self, p: str = "grpo") -> None:
        _check(self.steps >= 1, f"{p}.steps", "must be >= 1")
        _check(self.prompts_per_step >= 1, f"{p}.prompts_per_step", "must be >= 1")
        if self.advantage == "ema":
            _check(self.group_size >= 1, f"{p}.group_size", "must be >= 1")
        else:
            _check(self.group_size >= 2, f"{p}.group_size", f"GRPO needs K >= 2 rollouts per prompt (got {self.group_size}); use advantage=ema for K = 1")
        _check(self.n_latent >= -1, f"{p}.n_latent", "must be >= 0 (or -1 for the checkpoint's value)")
        _check(self.temperature >= 0 and 0 < self.top_p <= 1, f"{p}.temperature", "temperature >= 0 and top_p in (0, 1]")
        _check(self.max_new_tokens >= 1, f"{p}.max_new_tokens", "must be >= 1")
        _check(self.lr > 0, f"{p}.lr", "must be > 0")
        _check(self.warmup_steps >= 0 and 0 <= self.min_lr_ratio <= 1, f"{p}.warmup_steps", "warmup >= 0, min_lr_ratio in [0, 1]")
        _check(self.optimizer in ("adamw", "adamw8bit"), f"{p}.optimizer", "expected adamw or adamw8bit")
        _check(self.mini_epochs >= 1 and self.micro_batch_size >= 1 and self.rollout_batch_size >= 1, f"{p}.mini_epochs", "mini_epochs, micro_batch_size, rollout_batch_size must be >= 1")
        _check(self.advantage in ("drgrpo", "grpo", "rloo", "ema"), f"{p}.advantage", f"unknown {self.advantage!r}")
        _check(0 <= self.ema_alpha < 1, f"{p}.ema_alpha", "must be in [0, 1)")
        _check(0 <= self.eps_low < 1 and self.eps_high >= 0, f"{p}.eps_low", "eps_low in [0, 1), eps_high >= 0")
        _check(self.aggregation in ("seq_mean", "token_mean", "constant"), f"{p}.aggregation", f"unknown {self.aggregation!r}")
        _check(self.beta0 >= 0, f"{p}.beta0", "must be >= 0")
        _check(self.kl_form in ("unbiased", "paper"), f"{p}.kl_form", "expected unbiased or paper")
        _check(self.huber_delta > 0, f"{p}.huber_delta", "must be > 0")
        _check(self.ref_renewal_every >= 0, f"{p}.ref_renewal_every", "must be >= 0")
        _check(0 <= self.alpha_min <= 1 and 0 <= self.alpha_max <= 1, f"{p}.alpha_min", "alpha_min and alpha_max must be in [0, 1]")
        _check(self.alpha_min <= self.alpha_max, f"{p}.alpha_min", f"alpha_min ({self.alpha_min}) > alpha_max ({self.alpha_max})")
        _check(self.replay in ("seed", "fresh"), f"{p}.replay", "expected seed or fresh")
        _check(self.eval_every >= 0 and self.log_every >= 1, f"{p}.eval_every", "eval_every >= 0, log_every >= 1")
        _check(self.save_every >= 0 and self.keep_last >= 1 and self.max_nonfinite >= 1, f"{p}.save_every",
               "save_every >= 0, keep_last >= 1, max_nonfinite >= 1")


@dataclass
class Config:
    seed: int = opt(0, "run seed: initialisation, data order, dropout seeds")
    device: str = opt("auto", "auto | cpu | cuda | cuda:N")
    threads: int = opt(0, "torch CPU threads (0 = torch default)")
    fsdp: str = opt("none", "under torchrun: none (replicated weights, gradients all-reduced) | full (FSDP2; rank 0 writes gathered "
                    "safetensors) | sharded (FSDP2; one checkpoint shard per rank). The DGRPO_FSDP environment variable overrides it")
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    data: DataConfig = field(default_factory=DataConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    perturbation: PerturbationConfig = field(default_factory=PerturbationConfig)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)

    def validate(self) -> "Config":
        for f in fields(self):
            v = getattr(self, f.name)
            if is_dataclass(v):
                v.validate(f.name)
        _check(self.threads >= 0, "threads", "must be >= 0")
        _check(self.fsdp in ("none", "full", "sharded"), "fsdp", f"expected none, full or sharded, got {self.fsdp!r}")
        return self


# ----------------------------------------------------------------------------------------------
# Loading, overriding, dumping


def _field_type(cls: type, name: str) -> Any:
    hints = typing.get_type_hints(cls)
    return hints[name]


def _coerce(value: Any, tp: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _coerce(value, args[0], key)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
            return value.lower() in ("true", "yes", "1")
        raise ConfigError(f"invalid config value {key}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ConfigError(f"invalid config value {key}: expected an integer, got {value!r}")
        try:
            f = float(value)
        except ValueError:
            raise ConfigError(f"invalid config value {key}: expected an integer, got {value!r}") from None
        if f != int(f):
            raise ConfigError(f"invalid config value {key}: expected an integer, got {value!r}")
        return int(f)
    if tp is float:
        if isinstance(value, bool):
            raise ConfigError(f"invalid config value {key}: expected a number, got {value!r}")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"invalid config value {key}: expected a number, got {value!r}") from None
    if tp is str:
        if isinstance(value, (dict, list)):
            raise ConfigError(f"invalid config value {key}: expected a string, got {value!r}")
        if isinstance(value, bool):  # YAML reads true/false/yes/no/on/off as booleans
            return "true" if value else "false"
        return "" if value is None else str(value)
    if tp is list or origin is list:
        if isinstance(value, str):
            value = [v for v in value.split(",") if v]
        if not isinstance(value, list):
            raise ConfigError(f"invalid config value {key}: expected a list, got {value!r}")
        return list(value)
    return value


def _merge(obj: Any, data: dict, prefix: str) -> None:
    if not isinstance(data, dict):
        raise ConfigError(f"invalid config value {prefix.rstrip('.') or '<root>'}: expected a mapping, got {data!r}")
    names = {f.name: f for f in fields(obj)}
    for k, v in data.items():
        key = f"{prefix}{k}"
        if k not in names:
            raise ConfigError(f"unknown config key {key!r} (known: {', '.join(sorted(names))})")
        cur = getattr(obj, k)
        if is_dataclass(cur):
            _merge(cur, v, key + ".")
        else:
            setattr(obj, k, _coerce(v, _field_type(type(obj), k), key))


def set_value(cfg: Any, dotted: str, raw: str) -> None:
    """Apply one ``a.b=value`` override; ``raw`` is parsed as YAML (so ``1e-5``, ``true``, ``[a, b]`` work)."""
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError:
        value = raw
    parts = dotted.split(".")
    nested: Any = value
    for p in reversed(parts):
        nested = {p: nested}
    _merge(cfg, nested, "")


def load_config(cls: type, path: str | Path | None = None, overrides: list[str] | None = None) -> Any:
    """Defaults of ``cls``, then the YAML file, then ``--set key=value`` overrides; validated."""
    cfg = cls()
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        try:
            data = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {p} is not valid YAML: {str(e).splitlines()[0]}") from None
        try:
            _merge(cfg, data, "")
        except ConfigError as e:
            raise ConfigError(f"{p}: {e}") from None
    for ov in overrides or []:
        if "=" not in ov:
            raise ConfigError(f"--set expects key=value, got {ov!r}")
        k, v = ov.split("=", 1)
        set_value(cfg, k.strip(), v.strip())
    cfg.validate()
    return cfg


def to_dict(cfg: Any) -> dict:
    return dataclasses.asdict(cfg)


def describe(cls: type, prefix: str = "") -> list[str]:
    """One line per option: ``key = default  # doc`` (for ``dgrpo config show`` and docs/config.md)."""
    lines = []
    inst = cls()
    for f in fields(cls):
        v = getattr(inst, f.name)
        if is_dataclass(v):
            lines.extend(describe(type(v), f"{prefix}{f.name}."))
        else:
            lines.append(f"{prefix}{f.name} = {v!r}  # {f.metadata.get('doc', '')}")
    return lines
