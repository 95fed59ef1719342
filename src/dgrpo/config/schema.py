"""The options: one dataclass per section (model, task, data, sft, eval, perturbation, grpo, logging) and
:class:`Config` above them; each field's default and doc (the one source of truth, the paper's values where it
states them) and :meth:`Config.validate`'s ranges and relations between options."""

from __future__ import annotations

import math
import re
import typing
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from ..run_layout import results_name
from .base import (
    BEST_METRIC_HELP,
    LAYER_GRAMMAR,
    MAX_BUILTIN_PARAMS,
    MAX_HUBER_DELTA,
    MAX_THREADS,
    Advantage,
    Aggregation,
    Arch,
    AutoSwitch,
    BestMetric,
    CompileBackend,
    CompileMode,
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
    _at_least,
    _check,
    _learning_rate,
    _positive,
    _within,
    opt,
    parse_layer_spec,
)
from .values import _coerce_fields, _count, _fits_in, _numbers, _to_float, _to_int


def _adam_betas(obj: Any, p: str) -> None:
    """``adam_betas`` of section ``obj``: two floats in [0, 1) (torch refuses the int 0 beside a float)."""
    obj.adam_betas = _numbers(obj.adam_betas, _to_float, f"{p}.adam_betas")
    _check(
        len(obj.adam_betas) == 2
        and all(isinstance(b, (int, float)) and not isinstance(b, bool) and 0 <= b < 1 for b in obj.adam_betas),
        f"{p}.adam_betas",
        f"expected two numbers in [0, 1) (beta1, beta2), got {obj.adam_betas}",
    )
    obj.adam_betas = [float(b) for b in obj.adam_betas]


@dataclass
class LoraConfig:
    """LoRA adapters (through the ``peft`` package: pip install 'dgrpo[lora]'): the memory lever for large backbones."""

    r: int = opt(0, "adapter rank; 0 = off (every weight is trained)")
    alpha: float = opt(16.0, "scaling: the adapter adds alpha / r * B A to each targeted weight")
    target_modules: list = opt(
        ["all-linear"],
        "the linear layers that get adapters: all-linear (every linear layer but the LM head), or module names "
        "(Qwen2 / Llama: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj; GPT-2: c_attn, c_proj, c_fc)",
    )
    dropout: float = opt(
        0.0,
        "PEFT's lora_dropout; anything but 0 is replaced by 0 with a warning: it draws from the global RNG at every "
        "forward, so the update could not replay the rollout's network (the perturbation is the only noise)",
    )
    train_latent_tokens: bool = opt(
        True,
        "keep the embedding rows of <|start-latent|>, <|latent|>, <|end-latent|> trainable (PEFT trainable tokens: "
        "those rows only: the input rows, which a tied head shares; an untied head gets its own three rows)",
    )

    def validate(self, p: str = "model.lora") -> None:
        _at_least(self, p, 0, "r")
        _positive(self, p, "alpha")
        _within(self, p, "[0, 1)", "dropout")
        _check(bool(self.target_modules), f"{p}.target_modules", "must name at least one module (or all-linear)")
        _check(
            all(isinstance(m, str) and m for m in self.target_modules),
            f"{p}.target_modules",
            f"expected module names (text), got {self.target_modules}",
        )
        _check(
            "all-linear" not in self.target_modules or len(self.target_modules) == 1,
            f"{p}.target_modules",
            f"all-linear stands alone (it names every linear layer but the LM head), got {self.target_modules}",
        )


#: the model options that build the built-in tiny model (model.name_or_path builtin-tiny) and nothing else: a run that
#: loads a model records the loaded model's values in them
BUILTIN_SHAPE = ("arch", "hidden_size", "num_layers", "num_heads", "intermediate_size")


@dataclass
class ModelConfig:
    """The model: a hub id, a local checkpoint, or the built-in tiny model (whose shape is set here)."""

    name_or_path: str = opt(
        "builtin-tiny",
        "HF model id or local directory; 'builtin-tiny' builds the tiny from-scratch model of the built-in task",
    )
    revision: str = opt(
        "",
        "the hub revision of a hub id (a branch, tag or commit hash, as from_pretrained's revision=): pin a commit "
        "to make a run reproducible; empty: main, as from_pretrained's default (a run's config.json records the commit "
        "loaded). For the model loaded from the hub "
        "(model.name_or_path, or --init / dgrpo eval --model when that is a hub id); local directories ignore it. "
        "A LoRA adapter records it (adapter_config.json's revision, PEFT's field) and loads its base at it",
    )
    arch: Arch = opt(
        "qwen2",
        "architecture of the built-in tiny model: the Hugging Face Qwen2, Llama or GPT-2 blocks (qwen2, llama, gpt2)",
    )
    hidden_size: int = opt(128, "built-in tiny model: hidden size")
    num_layers: int = opt(
        4,
        f"built-in tiny model: number of layers (its layers hold at most {MAX_BUILTIN_PARAMS:,} parameters, about "
        "num_layers x "
        "(4 hidden_size^2 + 3 hidden_size x intermediate_size): a larger model is loaded)",
    )
    num_heads: int = opt(4, "built-in tiny model: attention heads")
    intermediate_size: int = opt(512, "built-in tiny model: MLP width")
    dtype: DType = opt("float32", "weight dtype: float32, or bfloat16 (bf16 weights, as the paper trains)")
    master_weights: bool = opt(
        False,
        "with bfloat16 weights: keep each trained weight in float32 in the optimizer state (a master copy, with "
        "float32 AdamW moments), step it there and round it to the bf16 weight, in sft and grpo; without it (the "
        "paper's recipe) an update under half a bf16 spacing of a weight is lost (README, 'bf16 weights'). 8 bytes "
        "a trained parameter more than AdamW on bf16 weights, and a float32 copy of the gradients during the "
        "step; saved in resumable checkpoints, and fixed for a run (a resume cannot switch it); no effect on float32 "
        "weights, nor under LoRA (PEFT keeps the adapters in float32); not with grpo.optimizer=adamw8bit",
    )
    latent_token_init: LatentTokenInit = opt(
        "mean",
        "how a model without the latent markers (a base LM) starts their embedding rows, input and untied head: mean "
        "(of the existing tokens' rows), or coconut (copies of the '<<' token's rows, as Coconut's run.py; the mean "
        "when the tokenizer has no '<<')",
    )
    trust_remote_code: bool = opt(False, "allow custom modelling code from the hub (only if you trust the repository)")
    kernels: Kernels = opt(
        "none",
        "the decoder's layers: none (Hugging Face's modules) or liger (Liger Kernel's fused Triton RMSNorm, SwiGLU MLP "
        "and rotary embedding, for the architectures Liger supports: Qwen2, Llama and more; CUDA only, pip install "
        "liger-kernel; applied by the SFT and GRPO trainers: less activation memory and fewer kernel launches in their "
        "updates; on a CPU the modules stay as they are, with a warning)",
    )
    compile: bool = opt(
        False,
        "run the decoder layers as one torch.compile'd step shared by every layer (weights, past keys/values and "
        "the perturbation's masks as its arguments; dgrpo.model.compiled_layers) wherever answers are scored "
        "teacher-forced: SFT, the GRPO update, theta_old and the reference (rollouts and evaluation keep the "
        "layers' own forward). Qwen2 / Llama with SDPA attention; perturbation none, locked or gaussian "
        "activations; not with LoRA, FSDP or model.kernels=liger (the compiler fuses those layers itself). The "
        "first calls compile (tens of seconds); log-probs agree with the eager layers to float rounding, not bitwise",
    )
    compile_backend: CompileBackend = opt(
        "inductor",
        "torch.compile backend of model.compile: inductor (generated fused kernels: Triton on a GPU, C++ on a CPU, "
        "which needs a C++ compiler), aot_eager or eager (tracing only, to debug)",
    )
    compile_mode: CompileMode = opt(
        "default",
        "inductor's mode for model.compile: default, or max-autotune-no-cudagraphs (longer compile, tuned matmuls)",
    )
    compile_head: AutoSwitch = opt(
        "auto",
        "the LM head's statistics over the vocabulary (a target's log-prob when scoring: the GRPO update, theta_old, "
        "the reference; the greedy token's log-prob and entropy in rollouts) as torch.compile'd fused reductions "
        "that read the bf16 logits as they are, instead of eager PyTorch's fp32 copy of the [rows, vocabulary] "
        "logits and its passes over it (dgrpo.model.head_stats): auto: on a CUDA device, off elsewhere; true: on any "
        "device (inductor: Triton on a GPU, C++ on a CPU); false: eager. Applied by the trainers (SFT, GRPO); the "
        "first calls compile (seconds); the same greedy tokens, log-probs to float rounding; should the compiler "
        "fail, a warning says so and the eager form runs",
    )
    pack_gqa: AutoSwitch = opt(
        "auto",
        "grouped-query attention (fewer key/value heads than query heads, as Qwen2.5's) over SDPA without repeating "
        "the keys and values per query head in calls of several positions: each group's query heads become query rows "
        "of its key/value head, the mask's rows repeated once per call (dgrpo.model.gqa_attention): auto: on a CUDA "
        "device, off elsewhere; true: on any device; false: Hugging Face's SDPA attention. Applied by the trainers "
        "(SFT, GRPO) to a model on SDPA attention; the same attention to float rounding",
    )
    lora: LoraConfig = field(default_factory=LoraConfig)

    def validate(self, p: str = "model") -> None:
        """Range checks of the model section."""
        self.lora.validate(f"{p}.lora")
        _positive(self, p, "hidden_size", "num_layers", "num_heads", "intermediate_size")
        _check(
            self.hidden_size % self.num_heads == 0,
            f"{p}.hidden_size",
            f"must be divisible by num_heads ({self.hidden_size} % {self.num_heads} != 0)",
        )
        _check(  # (rotary embeddings rotate pairs of a head's dimensions: an odd head size failed in the first forward)
            self.arch == "gpt2" or (self.hidden_size // self.num_heads) % 2 == 0,
            f"{p}.hidden_size",
            f"{self.arch} heads need an even size: hidden_size / num_heads is {self.hidden_size // self.num_heads}",
        )
        # (hidden_size 1,000,000 ended in the allocator's traceback; num_layers 100,000 built for minutes, silent)
        h, layer = self.hidden_size, 4 * self.hidden_size**2 + 3 * self.hidden_size * self.intermediate_size
        _check(
            self.num_layers * layer <= MAX_BUILTIN_PARAMS,
            f"{p}.hidden_size, num_layers, intermediate_size",
            f"the built-in model would hold about {self.num_layers * layer:.2g} parameters in its layers "
            f"(num_layers x (4 x {h}^2 + 3 x {h} x {self.intermediate_size})), over the {MAX_BUILTIN_PARAMS:,} "
            "it builds with random weights: a larger model is loaded (model.name_or_path)",
        )


@dataclass
class TaskConfig:
    """The built-in synthetic task (used when a dataset name starts with 'builtin')."""

    n_steps: int = opt(4, "operations per problem (= reasoning steps)")
    modulus: int = opt(10, "all arithmetic is modulo this number")
    max_operand: int = opt(9, "largest operand of + and - (in-distribution)")
    ood_extra_steps: int = opt(2, "the 'ood_steps' test split has n_steps + this many steps (>= 1: longer chains)")
    ood_max_operand: int = opt(99, "the 'ood_numbers' test split draws +/- operands from 10..this")
    n_train: int = opt(16000, "training problems")
    n_valid: int = opt(1000, "validation problems")
    n_test: int = opt(2000, "test problems (each test split)")
    seed: int = opt(1234, "generation seed of the task (fixed, independent of the training seed)")

    #: the most problems one split may ask for (about 2.5 KB of memory each: 5 GB, minutes to draw)
    MAX_PROBLEMS = 2_000_000
    #: the most operations one split may draw, problems x n_steps (about 20 s: 2,000,000 problems of 4 operations;
    #: task.n_steps=100,000 drew for an hour before its problems were found too long for the model)
    MAX_OPERATIONS = 10_000_000

    def validate(self, p: str = "task") -> None:
        """Range checks of the task section, and that the problems asked for can be drawn: at most
        :attr:`MAX_PROBLEMS` per split, and no more distinct problems than there are (the generator would otherwise
        draw for 50 times the count before giving up)."""
        _at_least(self, p, 1, "n_steps", "max_operand", "n_train", "n_valid", "n_test", "ood_extra_steps")
        _at_least(self, p, 2, "modulus")
        _at_least(self, p, 10, "ood_max_operand")
        for name in ("n_train", "n_valid", "n_test"):
            _check(
                getattr(self, name) <= self.MAX_PROBLEMS,
                f"{p}.{name}",
                f"at most {self.MAX_PROBLEMS:,} problems per split (got {getattr(self, name):,})",
            )
        # (the ood_steps test split's problems are the longest, by ood_extra_steps)
        most = max(max(self.n_train, self.n_valid) * self.n_steps, self.n_test * (self.n_steps + self.ood_extra_steps))
        _check(
            most <= self.MAX_OPERATIONS,
            f"{p}.n_steps",
            f"at most {self.MAX_OPERATIONS:,} operations per split (problems x operations each: about 20 s to draw); "
            f"n_steps = {self.n_steps:,} asks for {most:,}: lower n_steps or the problem counts",
        )
        ops = 2 * self.max_operand + 3  # + and - with operands 1..max_operand, * with 3, 7 or 9
        asked = self.n_train + self.n_valid + self.n_test
        _check(
            _fits_in(asked, self.modulus, ops, self.n_steps),
            f"{p}.n_train",
            f"n_train + n_valid + n_test = {asked:,} distinct problems, more than the "
            f"{_count(self.modulus, ops, self.n_steps)} there are (modulus x (2 max_operand + 3)^n_steps); raise "
            "n_steps or max_operand, or ask for fewer",
        )
        ood_ops = 2 * (self.ood_max_operand - 9) + 3
        _check(
            _fits_in(self.n_test, self.modulus, ood_ops, self.n_steps),
            f"{p}.n_test",
            f"n_test = {self.n_test:,} distinct ood_numbers problems, more than the "
            f"{_count(self.modulus, ood_ops, self.n_steps)} there are (operands 10..ood_max_operand); raise "
            "ood_max_operand or n_steps, or ask for fewer",
        )


@dataclass
class DataConfig:
    """Datasets: a dataset name (built-in, local or hub) or a file path, optionally 'name:split'."""

    train: str = opt(
        "builtin:train",
        "training data: dataset name or file path, optionally 'name:split' (a dataset with a train split named "
        "without one takes it: gsm8k is gsm8k:train here)",
    )
    valid: str = opt("builtin:valid", "held-out data for per-stage / periodic eval ('' to disable)")
    test: list = opt(
        ["builtin:test", "builtin:ood_steps", "builtin:ood_numbers"], "datasets evaluated at the end ([] for none)"
    )
    max_question_tokens: int = opt(
        256,
        "questions longer than this many tokens are cut from the left: the model sees their last tokens (a warning "
        "counts them; under data.chat_template the question is cut, the template around it kept whole); 0: no limit",
    )
    max_target_tokens: int = opt(
        256, "steps + answer longer than this are cut to it, without their EOS (the model is not taught to stop there)"
    )
    eval_limit: int = opt(500, "evaluate at most this many records of data.valid during training (0 = all)")
    question_key: str = opt(
        "",
        "column holding the question, for files whose keys are not a known format ('' = detect the format); rows "
        "without it whose keys are a known format are read as that format (standard files beside mapped ones)",
    )
    answer_key: str = opt(
        "",
        "column holding the gold answer (with question_key); a GSM8K-style solution there is read as GSM8K's (the "
        "answer after '####', its <<...>> calculations as steps)",
    )
    steps_key: str = opt(
        "",
        "column holding the reasoning steps: a list of strings, a list's text as a CSV cell holds one (['a', 'b']), "
        "or one string split on newlines, without an end "
        "'#### <answer>' (so it may name a GSM8K-style answer column: its lines before '####'); '' = none, or a "
        "GSM8K-style answer's <<...>> calculations",
    )
    chat_template: bool = opt(
        False,
        "wrap each question in the tokenizer's chat template (instruction-tuned backbones) before the latent "
        "markers; saved with the checkpoint (latent_config.json), so eval and GRPO prompt the same way",
    )

    def validate(self, p: str = "data") -> None:
        """Range checks of the data section."""
        _check(bool(self.train), f"{p}.train", "must name a dataset")
        _check(
            all(isinstance(t, str) and t.strip() for t in self.test),
            f"{p}.test",
            f"expected a list of dataset names or file paths (text), got {self.test}",
        )
        names = [results_name(t) for t in self.test]
        for i, name in enumerate(names):
            first = names.index(name)
            _check(
                first == i,
                f"{p}.test",
                f"{self.test[first]} and {self.test[i]} would write one results folder (eval/{name}): name each "
                "test set once",
            )
        given, missing = ("question_key", "answer_key") if self.question_key else ("answer_key", "question_key")
        _check(  # (the key named is the one left empty: say which one is set, and what to give)
            bool(self.question_key) == bool(self.answer_key),
            f"{p}.{missing}",
            f"question_key and answer_key go together: {p}.{given} is set, so name the "
            f"{missing.split('_')[0]}'s column too (e.g. {p}.{missing}={missing.split('_')[0]})",
        )
        _check(
            not self.steps_key or bool(self.question_key),
            f"{p}.steps_key",
            "maps a column with question_key and answer_key (set them too)",
        )
        _positive(self, p, "max_target_tokens")
        _at_least(self, p, 0, "max_question_tokens")
        _at_least(self, p, 0, "eval_limit")


#: perturbation.sites' names (dgrpo.model.anatomy.SITES): a block's attention output, its MLP output, the block's whole
#: output (the residual stream)
PERTURBATION_SITES = ("attn", "mlp", "residual")

#: sft.recompute_latent_steps and grpo.recompute_latent_steps: the same switch over the same recurrence
RECOMPUTE_LATENT_STEPS_HELP = (
    "with recompute: the latent steps' forward calls are recomputed too (true), or keep their activations (false): "
    "each holds one position per row, and the steps share one copy of each layer's keys and values (the prompt's "
    "columns are not kept again per step), little next to the prompt's and the answer's; each one not recomputed "
    "saves a forward of the whole decoder stack (its kernel launches) in backward; the same gradients"
)


#: sft.recompute_kept_layers and grpo.recompute_kept_layers
RECOMPUTE_KEPT_LAYERS_HELP = (
    "with recompute at layer granularity: how many of the last decoder layers keep their activations instead of "
    "being recomputed (0: every layer is recomputed); each one kept saves its share of the second forward (1/L of "
    "it for L layers) and keeps that layer's activations of every call until backward, the memory the "
    "recomputation saved (memory per kept layer: bench/RESULTS.md)"
)


def _check_kept_layers(section: Any, p: str) -> None:
    """``recompute_kept_layers`` >= 0, and only where layers are recomputed (a kept layer means nothing otherwise)."""
    n = section.recompute_kept_layers
    _check(
        isinstance(n, int) and not isinstance(n, bool) and n >= 0,
        f"{p}.recompute_kept_layers",
        f"must be >= 0, got {n}",
    )
    _check(
        n == 0 or (section.recompute and section.recompute_granularity == "layer"),
        f"{p}.recompute_kept_layers",
        f"keeps layers out of per-layer recomputation: set {p}.recompute=true and {p}.recompute_granularity=layer "
        f"(got recompute={section.recompute}, granularity={section.recompute_granularity})",
    )


@dataclass
class SFTConfig:
    """Supervised fine-tuning: the Coconut curriculum and its baselines."""

    mode: SFTMode = opt(
        "coconut",
        "what SFT trains: coconut (the latent curriculum), cot (written steps), no_cot "
        "(answer only), pause (pause-as-thought: <|latent|> tokens, no recurrence) or "
        "no_curriculum (coconut, the last epoch's stage from the start: every step latent, Coconut's w/o-curriculum "
        "ablation, when that stage is past max_latent_stage; the defaults' is stage 2, which still writes the steps "
        "after the second)",
    )
    c_thought: int = opt(1, "latent thoughts per reasoning step (c)")
    epochs_per_stage: int = opt(2, "epochs per curriculum stage; stage = epoch // epochs_per_stage")
    stage_epochs: list = opt(
        [],
        "epochs of stages 0, 1, ... in order, e.g. [1, 1, 2] (0 skips a stage); later stages take epochs_per_stage "
        "each; empty: epochs_per_stage for every stage (Coconut's uniform curriculum)",
    )
    max_latent_stage: int = opt(
        2, "largest stage that replaces steps one by one; later epochs drop all steps (Coconut)"
    )
    num_epochs: int = opt(6, "total epochs (Coconut: stage k for epochs [k*eps, (k+1)*eps))")
    pad_latent_to_max: bool = opt(
        False, "at stages past max_latent_stage use max_latent_stage*c latents even for short chains"
    )
    uniform_prob: float = opt(
        0.0,
        "probability of training an example at a uniformly random stage, 0 to its chain's step count (Coconut); "
        "coconut, pause and no_curriculum modes (cot and no_cot have no stages)",
    )
    reset_optimizer: bool = opt(True, "new AdamW state (and a new lr schedule) at each sft.reset_every boundary")
    reset_every: ResetEvery = opt(
        "stage",
        "with reset_optimizer: at each curriculum stage (the moments of a step's tokens are stale once it is latent), "
        "or at every epoch, as Coconut's run.py does under its Coconut configs' reset_optimizer: True (its CoT config, "
        "args/gsm_cot.yaml, keeps one AdamW: a cot run here at reset_every: stage)",
    )
    lr: float = opt(1e-3, "peak learning rate (AdamW)")
    lr_schedule: LRSchedule = opt(
        "cosine",
        "cosine: warmup, then cosine decay to 0 over the schedule (a reset's span, else the run); constant: warmup, "
        "then sft.lr (Coconut's run.py: constant, warmup_steps 0)",
    )
    adam_betas: list = opt([0.9, 0.95], "AdamW (beta1, beta2); Coconut's run.py uses torch's default [0.9, 0.999]")
    weight_decay: float = opt(0.01, "AdamW weight decay (lr x weight_decay below 1)")
    warmup_steps: int = opt(30, "linear warmup steps (after each reset when reset_optimizer)")
    batch_size: int = opt(64, "examples per optimizer step, global over ranks (split into grad_accum micro-batches)")
    grad_accum: int = opt(1, "micro-batches per optimizer step; batch_size must divide by it")
    recompute: bool = opt(
        False,
        "activation recomputation through the latent recurrence: activations are dropped in the forward and "
        "rebuilt in backward, per decoder layer or per forward call (recompute_granularity): less memory per "
        "micro-batch, about one more forward of compute",
    )
    recompute_granularity: RecomputeGranularity = opt(
        "layer",
        "with recompute: layer (each decoder layer of each call keeps its input; in backward one layer's activations "
        "at a time are rebuilt) or call (each forward call keeps only its inputs; its whole decoder stack runs again "
        "in backward, so the widest call's activations of every layer are held at once); the same gradients",
    )
    recompute_latent_steps: bool = opt(True, RECOMPUTE_LATENT_STEPS_HELP)
    recompute_kept_layers: int = opt(0, RECOMPUTE_KEPT_LAYERS_HELP)
    max_grad_norm: float = opt(1.0, "gradient clipping (0 = off)")
    bf16: AutoSwitch = opt("auto", "bf16 autocast: auto (on CUDA only), true (always on) or false (off)")
    eval_each_stage: bool = opt(
        True, "accuracy on data.valid at the end of each stage (eval.* decoding: greedy unless eval.temperature > 0)"
    )
    eval_every_epoch: bool = opt(
        False,
        "accuracy on data.valid (eval.* decoding) at the end of every epoch too, and the best epoch of the final "
        "latent layout (the last stage, with the stages past max_latent_stage: all steps latent) kept as best/ "
        "(Coconut's choice of checkpoint: it validates every epoch and one picks the best; GRPO then --init "
        "runs/sft/best)",
    )
    best_metric: BestMetric = opt("accuracy", BEST_METRIC_HELP)
    save_every: int = opt(
        500, "write a resumable checkpoint (weights, optimizer, RNG, counters) every N steps (0 = epoch ends only)"
    )
    keep_last: int = opt(2, "resumable checkpoints kept in OUT/checkpoints")
    max_nonfinite: int = opt(5, "stop (after saving) when this many steps in a row had a non-finite loss or gradient")

    def validate(self, p: str = "sft") -> None:
        """Range checks of the SFT section."""
        _at_least(
            self,
            p,
            1,
            "c_thought",
            "epochs_per_stage",
            "num_epochs",
            "batch_size",
            "grad_accum",
            "keep_last",
            "max_nonfinite",
        )
        _at_least(self, p, 0, "max_latent_stage", "weight_decay", "warmup_steps", "max_grad_norm", "save_every")
        _within(self, p, "[0, 1]", "uniform_prob")
        _learning_rate(self, p)
        _adam_betas(self, p)
        self.stage_epochs = _numbers(self.stage_epochs, _to_int, f"{p}.stage_epochs")
        _check(
            all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in self.stage_epochs),
            f"{p}.stage_epochs",
            f"expected a list of epoch counts >= 0 (0 skips the stage), got {self.stage_epochs}",
        )
        _check(
            self.batch_size % self.grad_accum == 0,
            f"{p}.grad_accum",
            f"batch_size {self.batch_size} is not divisible by grad_accum {self.grad_accum}",
        )
        _check_kept_layers(self, p)


@dataclass
class EvalConfig:
    """Evaluation: generation settings of ``dgrpo eval``, of the validation during training (an SFT stage's with
    that stage's latent count; data.eval_limit records) and of the test sets after it."""

    batch_size: int = opt(256, "prompts per generation batch")
    max_new_tokens: int = opt(64, "answer tokens generated after the latents")
    n_latent: int = opt(-1, "latent thoughts at eval; -1 = the model's own (its final stage's, or grpo.n_latent's)")
    temperature: float = opt(
        0.0, "0 = greedy pass@1; > 0 samples, each question from its own seed (the run's seed and the question's text)"
    )
    top_p: float = opt(1.0, "nucleus sampling mass (with temperature > 0)")
    limit: int = opt(0, "evaluate at most this many records (0 = all)")
    shots: int = opt(
        0,
        "plain causal LM only: worked examples in the prompt, from the start of the data (a GSM8K example written with "
        "its solution, an example of a dataset without one with its answer alone)",
    )
    plain: bool = opt(False, "evaluate as a plain causal LM (no latents, CoT prompt): the base-model rows of Table 3")
    scorer: str = opt(
        "numeric",
        "what counts as correct, for eval and (unless grpo.reward is set) the GRPO reward: numeric (the answer's "
        "number, the first after the last marker with one after it, a run of '#', 'The answer is' or '\\boxed{' "
        "(none if no marker has one; 'The answer is' after '#### 18' is passed over), else the text's last, equals "
        "the gold number), "
        "exact (the final answer text equals the gold, normalised; a number gold: the answer read as a number), "
        "choice (the answer's letter A-E equals the "
        "gold's), coconut (Coconut's run.py check: the text after the last '#', commas removed, equals the gold "
        "string; stricter than numeric), or a plug-in 'package.module:function' / 'path/to/file.py:function' (batched: "
        "(completions, records) -> a value in [0, 1] per completion, 1 for a correct one)",
    )

    def validate(self, p: str = "eval") -> None:
        """Range checks of the eval section."""
        _at_least(self, p, 1, "batch_size", "max_new_tokens")
        _at_least(self, p, 0, "temperature", "limit", "shots")
        _check(self.n_latent >= -1, f"{p}.n_latent", "must be >= 0 (or -1 for the checkpoint's value)")
        _within(self, p, "(0, 1]", "top_p")


@dataclass
class PerturbationConfig:
    """The rollout perturbation: the seed-replayable noise that makes a group's K rollouts differ."""

    kind: PerturbationKind = opt(
        "locked",
        "the noise: locked (batched shared-mask dropout on the sites and "
        "layers), native (the model's own attention dropout with the RNG state "
        "restored, one rollout at a time; sites and layers unused), gaussian "
        "(Gaussian noise of scale sigma, see gaussian_target), none "
        "(deterministic rollouts), a kind registered in Python (dgrpo.perturbation.register), or a kind of your own "
        "named by its class, path/to/file.py:Class or package.module:Class (a Perturbation subclass; the command "
        "line's way, where no module of yours is imported)",
    )
    p: float = opt(0.1, "dropout probability (locked, native)")
    sites: list = opt(
        ["mlp"],
        "where locked/gaussian noise is applied: any of attn (attention output), mlp (MLP "
        "output), residual (block output)",
    )
    layers: str = opt(
        "all", f"which layers carry the sites: {LAYER_GRAMMAR}. In a YAML file quote a slice that ends with ':' ('-2:')"
    )
    perturb_prompt: bool = opt(
        True,
        "perturb the prompt pass too (one network sample per rollout, as the "
        "variational reading needs); false = only latents and answer, the K rollouts of a prompt starting from "
        "the same prompt keys and values",
    )
    perturb_answer: bool = opt(
        True,
        "perturb the answer too: <|end-latent|> and the answer tokens decoded and scored under the rollout's noise, "
        "the posterior-sample reading of the paper (Sec. 3.1; its Eq. 3 reads as false); false = the unperturbed "
        "network decodes them (reading the perturbed latents' keys and "
        "values) in the rollout and in every replay (the update, theta_old, the reference): the ablation of the "
        "answer's noise. A kind of your own must take it (its from_config sets perturb_answer) or is refused",
    )
    sigma: float = opt(0.1, "gaussian: noise scale")
    gaussian_target: GaussianTarget = opt(
        "activations",
        "gaussian: activations (multiplicative noise on the sites' "
        "outputs, per rollout) or weights (additive noise on the "
        "output projections of attn and mlp sites; not residual ones; "
        "sigma * std(W) * N(0, 1), std(W) of the run's starting weights, held)",
    )

    def validate(self, p: str = "perturbation") -> None:
        """Range checks of the perturbation section, and the syntax of ``layers``."""
        _within(self, p, "[0, 1)", "p")
        _check(
            all(x in PERTURBATION_SITES for x in self.sites) and len(self.sites) > 0,
            f"{p}.sites",
            f"expected a non-empty list of {', '.join(PERTURBATION_SITES)}; got {self.sites}",
        )
        _check(  # a site named twice would carry two masks: dropout 1 - (1 - p)^2
            len(set(self.sites)) == len(self.sites), f"{p}.sites", f"a site is named twice in {self.sites}"
        )
        parse_layer_spec(self.layers)
        _at_least(self, p, 0, "sigma")
        _check(
            not (self.kind == "gaussian" and self.gaussian_target == "weights" and "residual" in self.sites),
            f"{p}.sites",
            "gaussian_target=weights puts the noise on a site's output projection, and a residual site (the block's "
            f"output) has none: use attn or mlp sites (got {self.sites})",
        )


@dataclass
class GRPOConfig:
    """GRPO post-training (the paper's Table 2 names in parentheses)."""

    steps: int = opt(
        50,
        "GRPO steps, the lr and beta schedules' unit (paper: 3000); each takes grpo.mini_epochs optimizer steps, all "
        "at the step's lr and beta",
    )
    prompts_per_step: int = opt(16, "prompts (groups) per step, global over all ranks (paper: 16)")
    group_size: int = opt(8, "K rollouts per prompt (paper: 32); 1 only with advantage=ema")
    n_latent: int = opt(-1, "latent thoughts per rollout (T); -1 = the checkpoint's final-stage count")
    temperature: float = opt(
        0.0,
        "answer decoding: 0 = greedy, our reading of the paper (it states no temperature; its Sec. 3.1 assumes "
        "low-temperature decoding, and all diversity comes from the masks); > 0 samples tokens, each rollout's from "
        "its own seed (the same whatever the batch or the number of ranks)",
    )
    top_p: float = opt(
        1.0,
        "nucleus mass when temperature > 0 (sampling only: the update scores tokens under the whole softmax(logits / "
        "T), as TRL's GRPO does)",
    )
    max_new_tokens: int = opt(48, "answer tokens per rollout")
    lr: float = opt(1e-5, "peak learning rate (paper: 1e-5)")
    warmup_steps: int = opt(10, "linear warmup, then cosine decay to min_lr_ratio * lr (paper: 200)")
    min_lr_ratio: float = opt(
        0.0,
        "the cosine's floor as a fraction of the peak, reached at step grpo.steps (one past the last: the last step's "
        "lr is above it by (1 - min_lr_ratio) x lr x (1 - cos(pi / (steps - warmup_steps))) / 2)",
    )
    optimizer: Optimizer = opt(
        "adamw", "adamw (torch AdamW) or adamw8bit (bitsandbytes on CUDA; falls back to adamw with a warning elsewhere)"
    )
    weight_decay: float = opt(0.0, "AdamW weight decay (lr x weight_decay below 1)")
    adam_betas: list = opt(
        [0.9, 0.999],
        "AdamW (beta1, beta2) (the paper states none: torch's defaults); with bf16 weights and no master copy, a "
        "beta2 of 0.999 is under half a bf16 step: the second moment never decays (README, bf16 weights)",
    )
    max_grad_norm: float = opt(1.0, "gradient clipping (0 = off)")
    mini_epochs: int = opt(
        1, "E: passes over each rollout batch, one optimizer step each at the step's lr (theta_old fixed within them)"
    )
    micro_batch_size: int = opt(
        64,
        "rollouts per forward/backward in the update (the loss does not depend on it; with bf16 weights the "
        "gradients add up in bf16, so its rounding does)",
    )
    recompute: bool = opt(
        False,
        "activation recomputation in the update: the replayed recurrence's activations (prompt, each latent step, "
        "the answer) are dropped in the forward and rebuilt, under the same perturbation, in backward, per decoder "
        "layer or per forward call (recompute_granularity): less memory per micro-batch (so larger micro-batches "
        "fit), about one more forward of compute",
    )
    recompute_granularity: RecomputeGranularity = opt(
        "layer",
        "with recompute: layer (each decoder layer of each call keeps its input; in backward one layer's activations "
        "at a time are rebuilt: the lower peak) or call (each forward call keeps only its inputs; its whole decoder "
        "stack runs again in backward, so the widest call's activations of every layer are held at once); the same "
        "gradients and the same compute (one more forward) either way",
    )
    recompute_latent_steps: bool = opt(True, RECOMPUTE_LATENT_STEPS_HELP)
    recompute_kept_layers: int = opt(0, RECOMPUTE_KEPT_LAYERS_HELP)
    rollout_batch_size: int = opt(512, "rollouts per batched generation call")
    rollout_cache: RolloutCache = opt(
        "dynamic",
        "the KV cache of rollout decoding: dynamic (grows by concatenation, transformers' DynamicCache) or static "
        "(preallocated for prompt + latents + answer, StaticCache: fixed shapes, the basis of graph capture on a "
        "GPU; the same answers; not under native dropout, whose masks take the shape of each forward's attention, "
        "which a static cache widens, so that the update could not replay them)",
    )
    engine: Engine = opt(
        "auto",
        "how rollouts run: auto (fast on CUDA when the perturbation is batched and the model decodes over a static "
        "cache (not Bloom's ALiBi nor GPT-Neo's local attention), else eager), eager (one forward per "
        "step, the reference) or fast (every latent and answer step a one-position forward over fixed buffers "
        "(static KV cache, full-width mask, device-side counters), rows' ends booked on the device, the host checking "
        "every 8 tokens; on CUDA each step captured as a CUDA graph and replayed (once per batch, or once per shape "
        "with keep_graphs); the same answers and log-probs; needs a batched perturbation (not native); "
        "rollout_cache does not apply; its update and reference also run <|end-latent|> in the answer's forward "
        "call, one call fewer, and the reference model (no grad) runs its latent steps over fixed buffers too, "
        "captured on CUDA; the same log-probs up to rounding); should a capture fail, a warning says so and that "
        "decoder's purpose (rollouts or the reference) runs its steps eagerly from then on",
    )
    keep_graphs: bool = opt(
        True,
        "under the fast engine: keep each decoder (rollouts; the reference's scoring) with its static KV cache, "
        "buffers and, on CUDA, graphs from one batch to the next, so that a batch of as many rows or fewer and a "
        "prompt within its columns replays the graphs captured before instead of capturing them again (on CUDA a "
        "batch of fewer rows runs padded to the decoder's: a step's last batch, the rows the group filter left the "
        "reference; columns are kept in steps of 32; the "
        "three captures left the GPU idle ~0.15 s of the paper-scale step on an H200) and copies its perturbation "
        "into the tensors they read; the cost: those caches stay allocated through the update (rows x columns x "
        "layers x 2 x the key-value width: ~1.4 GB per decoder at 512 rows of 96 columns of Qwen2.5-1.5B); off "
        "under FSDP (its weights are gathered anew for every forward) and for a perturbation that does not state "
        "its tensors",
    )
    update_latent_graphs: AutoSwitch = opt(
        "false",
        "under the fast engine: the update's T latent steps run as one unit whose forward and backward are each "
        "one CUDA graph (the gradients of the prompt's state and of the weights computed inside), replayed per "
        "micro-batch instead of ~20 small launches per layer and step; auto: on where it can run on CUDA (one "
        "process, the fast engine, a coconut model over SDPA attention, recompute_latent_steps=false, "
        "model.compile=false), off elsewhere; true: on, and an error where it cannot run (on CPU the same unit "
        "runs uncaptured, for tests); false: off. With keep_graphs the chain is captured once and kept across "
        "steps, every micro-batch run inside its shape (padded to micro_batch_size rows, or all the step's "
        "rollouts if fewer, and to the widest prompt seen: the padding cut off, adding nothing to the gradients), "
        "so that the rows the group filter leaves and the prompts' widths do not capture it again (a wider prompt "
        "does, once); without keep_graphs it is captured per micro-batch; a failed capture warns and the chain "
        "runs step by step. The cost: the forward's activations, the weights' gradients and the keys and values "
        "stay allocated in its own pool between steps (9.2 GiB at the paper recipe's sizes; 13.2 GiB with prompts "
        "up to 136 tokens wide). On an H200 the paper step took 0.94x the time without it, alternated in one run "
        "(bench/RESULTS.md)",
    )
    advantage: Advantage = opt(
        "drgrpo",
        "drgrpo: r - group mean (paper); grpo: (r - mean) / std; rloo: r - mean "
        "of the other K-1 rewards; ema: REINFORCE with a running baseline",
    )
    ema_alpha: float = opt(
        0.95,
        "EMA baseline decay (advantage=ema): b <- alpha b + (1 - alpha) mean reward of the step (all ranks' rows); "
        "b starts at 0.5 (the paper gives no start)",
    )
    eps_low: float = opt(
        0.10,
        "PPO clip below 1 (paper 0.10): the ratio's lower bound 1 - eps_low, which acts on tokens of negative "
        "advantage only (min(rho A, clip(rho) A))",
    )
    eps_high: float = opt(
        0.12, "PPO clip above 1 (paper 0.12): the upper bound 1 + eps_high, acting on tokens of positive advantage only"
    )
    aggregation: Aggregation = opt(
        "seq_mean",
        "how token losses are summed: seq_mean (mean over each answer, then "
        "over rollouts; paper), token_mean (over all answer tokens) or "
        "constant (sum / (rollouts * max_new_tokens), Dr. GRPO); an answer's tokens are those generated up to and "
        "including its stop token (the paper's |y| does not say), and the counts are the step's kept rollouts and "
        "tokens over all micro-batches and ranks (Algorithm 1's K_kept)",
    )
    beta0: float = opt(5e-3, "peak KL coefficient (paper 5e-3); 0 disables the KL term and the reference model")
    anneal_beta: bool = opt(
        True,
        "beta(t) = beta0 * lr(t) / lr_max (Eq. 7); false keeps beta0. lr(t) is the whole schedule, warmup included: "
        "beta rises from beta0 / warmup_steps at step 0 (warmup_steps > 0) to beta0 at the peak, then follows the "
        "cosine to min_lr_ratio * beta0",
    )
    kl_form: KLForm = opt(
        "unbiased",
        "the k3 argument: unbiased (x = log pi_ref - log pi, Schulman's k3) or paper "
        "(x = log pi - log pi_ref, as the paper writes it)",
    )
    huber_delta: float = opt(5.0, f"Huberized k3 threshold delta (Eq. 6); at most {MAX_HUBER_DELTA:g} (the plain k3)")
    ref_renewal_every: int = opt(
        500,
        "hard-copy the policy into the reference every N steps (0 = never): once N steps are done, then 2N, ...: "
        "steps 0..N-1 (counted from 0) score against the initial policy, steps N..2N-1 against the policy after N "
        "updates",
    )
    filter: bool = opt(
        True,
        "drop groups whose accuracy is outside [alpha_min, alpha_max] (inclusive); not applied with advantage ema "
        "(REINFORCE has no group accuracy: its K = 1 groups would all be dropped)",
    )
    alpha_min: float = opt(0.20, "group-accuracy filter lower bound")
    alpha_max: float = opt(0.95, "group-accuracy filter upper bound")
    reward: str = opt(
        "",
        "the reward: '' = eval.scorer (1 when correct; the built-in ones 0 otherwise), or a plug-in "
        "'package.module:function' / 'path/to/file.py:function': batched (completions, records) -> one finite float "
        "(or None: does not apply) per completion, or a TRL reward function (**kwargs: prompts, completions, answer "
        "and the data's columns by name)",
    )
    rewards: list = opt(
        [],
        "several rewards, weighted (replaces grpo.reward): a list of {fn: <plug-in or scorer>, weight: 1.0, name: "
        "<optional, default fn; a file's path/file.py:f is named file:f>}; the reward is the weighted sum (a part's "
        "None, TRL's 'does not apply', adds 0, as TRL's nansum); metrics log each one's mean as reward/<name> (names "
        "distinct; a weight of 0 logs a part without training on it, not "
        "every part)",
    )
    filter_reward: str = opt(
        "",
        "the reward the accuracy filter's window applies to: '' = the total reward, or the name of one of "
        "grpo.rewards (e.g. a 0/1 correctness reward); its values must lie in [0, 1] when grpo.filter is on (a None "
        "of it is refused; the total counts a part's None as 0)",
    )
    log_rollouts: int = opt(
        0,
        "write the first N rollouts of each step (prompt, completion, reward) to OUT/rollouts.jsonl (0 = none)",
    )
    shuffle_rewards: bool = opt(
        False,
        "null control: permute the rewards within each group (a fresh seeded permutation per group and step) "
        "before the filter and the advantages, so that the update carries no information about which rollout "
        "was right; everything else is unchanged",
    )
    replay: ReplayMode = opt(
        "seed",
        "the perturbation at update time: seed (the rollout's own, by mask replay: the method) or fresh_mask (new "
        "seeds per mini-epoch: the rollout's answer is scored under a network that did not produce it; an ablation "
        "of mask replay, not Proposition 6's fresh-rollout estimator, which would resample the answers too; with "
        "mini_epochs > 1 the old log-probs are the first mini-epoch's, under its masks, so the later ones' ratios "
        "are not 1 even at theta_old)",
    )
    eval_every: int = opt(
        10,
        "eval without perturbation on data.valid every N steps (0 = only at start and end); eval.* decoding: greedy "
        "unless eval.temperature > 0",
    )
    save_best: bool = opt(
        True, "keep best/ = the best post-warmup checkpoint by validation accuracy (grpo.best_metric)"
    )
    best_metric: BestMetric = opt("accuracy", BEST_METRIC_HELP)
    log_every: int = opt(1, "write a metrics row every N steps (and at the last step and every dropped update)")
    save_every: int = opt(
        50, "write a resumable checkpoint (weights, optimizer, RNG, counters) every N steps (0 = only at the end)"
    )
    keep_last: int = opt(2, "resumable checkpoints kept in OUT/checkpoints")
    max_nonfinite: int = opt(
        5,
        "stop (after saving) when this many optimizer steps in a row had a non-finite loss or gradient "
        "(grpo.mini_epochs optimizer steps per GRPO step)",
    )
    max_skip_streak: int = opt(
        100,
        "stop (after saving) when this many steps in a row skipped the update because every group was filtered out "
        "(no update is then happening; the log warns from 10 on); 0 = never stop (the deterministic ablation)",
    )

    def validate(self, p: str = "grpo") -> None:
        """Range checks of the GRPO section and the relations between its options."""
        _at_least(
            self,
            p,
            1,
            "steps",
            "prompts_per_step",
            "max_new_tokens",
            "mini_epochs",
            "micro_batch_size",
            "rollout_batch_size",
            "log_every",
            "keep_last",
            "max_nonfinite",
        )
        _at_least(
            self,
            p,
            0,
            "temperature",
            "warmup_steps",
            "weight_decay",
            "max_grad_norm",
            "eps_high",
            "beta0",
            "ref_renewal_every",
            "eval_every",
            "save_every",
            "max_skip_streak",
            "log_rollouts",
        )
        # (the window's bounds before their order: alpha_max=-1 was 'grpo.alpha_min: alpha_min (0.2) > alpha_max')
        _within(self, p, "[0, 1]", "min_lr_ratio", "alpha_min", "alpha_max")
        _check_groups(self, p)
        _adam_betas(self, p)
        _check(self.n_latent >= -1, f"{p}.n_latent", "must be >= 0 (or -1 for the checkpoint's value)")
        _within(self, p, "(0, 1]", "top_p")
        _within(self, p, "[0, 1)", "ema_alpha", "eps_low")
        _learning_rate(self, p)
        _positive(self, p, "huber_delta")
        _check(  # (the continuation's slope e^delta - 1 overflows float32 from delta 89 on: NaN gradients)
            self.huber_delta <= MAX_HUBER_DELTA,
            f"{p}.huber_delta",
            f"at most {MAX_HUBER_DELTA:g} (k3 there is e^{MAX_HUBER_DELTA:g} ~ 5e21: no log-ratio reaches it, so "
            f"{MAX_HUBER_DELTA:g} is the plain k3), got {self.huber_delta}",
        )
        _check_rewards(self.rewards, f"{p}.rewards")
        _check_filtered_total(self, p)
        if self.filter_reward and self.rewards:  # (one reward: its name is its spec's or eval.scorer's, known later)
            names = [reward_name(item) for item in self.rewards]
            _check(
                self.filter_reward in names,
                f"{p}.filter_reward",
                f"{self.filter_reward!r} is not one of grpo.rewards ({', '.join(names)}): name one, or '' for the "
                "total (it was found once the trainer was built)",
            )
        _check_kept_layers(self, p)


def _check_groups(g: GRPOConfig, p: str) -> None:
    """The group settings: K rollouts per prompt (>= 2 for a group advantage), the filter's window, the null
    control's permutation within groups."""
    if g.advantage == "ema":
        _at_least(g, p, 1, "group_size")
    else:
        _check(
            g.group_size >= 2,
            f"{p}.group_size",
            f"GRPO needs K >= 2 rollouts per prompt (got {g.group_size}); use advantage=ema for K = 1",
        )
    _check(g.alpha_min <= g.alpha_max, f"{p}.alpha_min", f"alpha_min ({g.alpha_min}) > alpha_max ({g.alpha_max})")
    _check(
        not g.shuffle_rewards or (g.advantage != "ema" and g.group_size >= 2),
        f"{p}.shuffle_rewards",
        "the null control permutes rewards within groups: it needs group_size >= 2 and a group advantage",
    )


def _unused_grpo_settings(g: GRPOConfig) -> list[str]:
    """A line for each GRPO option set away from its default that the rest of the config leaves unused (it was
    accepted and did nothing without a word): the EMA baseline's decay without ``advantage=ema``, the KL term's
    settings with ``beta0=0`` (no KL term, no reference model), the accuracy filter's without the filter, the fast
    engine's ``keep_graphs`` under ``engine=eager``, the eager engine's ``rollout_cache`` under ``engine=fast``, what
    best/ is kept by without best/ (``save_best=false``)."""
    unused = (
        (("ema_alpha",), g.advantage != "ema", f"grpo.advantage={g.advantage} (it is the EMA baseline's decay)"),
        (
            ("anneal_beta", "kl_form", "huber_delta", "ref_renewal_every"),
            g.beta0 == 0,
            "grpo.beta0=0 (no KL term, no reference model)",
        ),
        (
            ("alpha_min", "alpha_max", "filter_reward"),
            not g.filter or g.advantage == "ema",
            "grpo.filter=false" if not g.filter else "grpo.advantage=ema (no group accuracy to filter on)",
        ),
        # (keep_graphs=true under eager is not said: it is the default, and the config does not know who set it)
        (("keep_graphs",), g.engine == "eager", "grpo.engine=eager (it keeps the fast engine's decoders)"),
        (("rollout_cache",), g.engine == "fast", "grpo.engine=fast (its decoders always run over a static cache)"),
        (("best_metric",), not g.save_best, "grpo.save_best=false (no best/ is kept)"),
    )
    lines = [line for keys, idle, why in unused if idle for line in _idle_options(g, "grpo", keys, why)]
    return lines + unused_recompute_settings(g, "grpo")


def _idle_options(section: Any, name: str, keys: tuple[str, ...], why: str) -> list[str]:
    """One line naming the options ``keys`` of ``section`` (named ``name``) set away from their defaults, which
    ``why`` leaves unused; [] when none is set."""
    default = type(section)()
    changed = [f"{name}.{k}={_shown(getattr(section, k))}" for k in keys if getattr(section, k) != getattr(default, k)]
    if not changed:
        return []
    return [f"{', '.join(changed)} {'changes' if len(changed) == 1 else 'change'} nothing with {why}"]


def _unused_perturbation_settings(pert: PerturbationConfig) -> list[str]:
    """A line for a built-in kind's scale option set away from its default where the kind reads the other one (it was
    accepted and did nothing, without a word): ``sigma`` under dropout (locked, native), ``p`` under gaussian noise;
    and one for the placement options a dropout kind does not read (:func:`_unused_perturbation_placement`). (A kind
    of one's own reads what it likes; none reads neither, as its name says.)"""
    default = PerturbationConfig()
    other = {"locked": "sigma", "native": "sigma", "gaussian": "p"}.get(pert.kind)
    lines = _unused_perturbation_placement(pert)
    if other is None or getattr(pert, other) == getattr(default, other):
        return lines
    scale = "p" if other == "sigma" else "sigma"
    what = "gaussian noise's scale" if other == "sigma" else "the dropout rate of locked and native"
    return [
        f"perturbation.{other}={getattr(pert, other)} changes nothing with perturbation.kind={pert.kind}: it is "
        f"{what}; perturbation.{scale} sets this kind's",
        *lines,
    ]


def _unused_perturbation_placement(pert: PerturbationConfig) -> list[str]:
    """A line for ``gaussian_target`` under locked or native dropout, and ``sites`` and ``layers`` under native
    (the model's own attention dropout, in every layer), set away from their defaults: each was accepted and did
    nothing, without a word. ``sites: [attn]`` under native is no such setting: it names where native dropout acts
    (paper/grpo_native.yaml keeps paper/grpo_dropout.yaml's)."""
    if pert.kind == "locked":
        return _idle_options(pert, "perturbation", ("gaussian_target",), "perturbation.kind=locked (gaussian's option)")
    if pert.kind != "native":
        return []
    keys = ("layers", "gaussian_target") if pert.sites == ["attn"] else ("sites", "layers", "gaussian_target")
    why = "perturbation.kind=native (the model's own attention dropout, in every layer)"
    return _idle_options(pert, "perturbation", keys, why)


def unused_recompute_settings(section: Any, name: str) -> list[str]:
    """A line when ``section`` (``sft`` or ``grpo``, named ``name``) sets how activations are recomputed
    (``recompute_granularity``, ``recompute_latent_steps``) away from their defaults without ``recompute``: they
    were accepted and did nothing, without a word (``recompute_kept_layers`` is refused so)."""
    if section.recompute:
        return []
    return _idle_options(section, name, ("recompute_granularity", "recompute_latent_steps"), f"{name}.recompute=false")


def unused_sft_settings(s: SFTConfig) -> list[str]:
    """A line when ``sft.mode`` cot or no_cot (no latent thoughts) leaves the latent layout's options set away from
    their defaults unused: ``c_thought`` and ``pad_latent_to_max`` were accepted and did nothing, without a word; one
    when ``sft.best_metric`` is set without ``sft.eval_every_epoch`` (no best/ is kept)."""
    lines = [] if s.eval_every_epoch else _idle_options(s, "sft", ("best_metric",), "sft.eval_every_epoch=false")
    if s.mode in ("cot", "no_cot"):
        lines += _idle_options(s, "sft", ("c_thought", "pad_latent_to_max"), f"sft.mode={s.mode} (no latent thoughts)")
    return lines


def unused_model_settings(m: ModelConfig) -> list[str]:
    """A line for each group of ``model`` options set away from their defaults that the rest of the section leaves
    unused (each was accepted and did nothing, without a word): the LoRA adapters' options without adapters
    (``model.lora.r=0``), the compiler's without ``model.compile``, and ``model.master_weights`` where there is no
    low-precision weight to keep a float32 copy of (float32 weights, or LoRA, whose adapters PEFT keeps in float32)."""
    lines = []
    if m.lora.r == 0:
        why = "model.lora.r=0 (no adapters: every weight is trained)"
        lines += _idle_options(m.lora, "model.lora", ("alpha", "target_modules", "dropout", "train_latent_tokens"), why)
    if not m.compile:
        lines += _idle_options(m, "model", ("compile_backend", "compile_mode"), "model.compile=false")
    if m.dtype == "float32" or m.lora.r > 0:
        why = "model.dtype=float32 (float32 weights)" if m.dtype == "float32" else "LoRA (float32 adapters)"
        lines += _idle_options(m, "model", ("master_weights",), why)
    return lines


def _shown(value: Any) -> str:
    """An option's value as ``--set`` writes it (booleans as true / false)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _warmup_lines(g: GRPOConfig) -> list[str]:
    """A warmup as long as the run (``grpo.warmup_steps`` >= ``grpo.steps``): the learning rate never passes its
    ramp, and best/ (kept from step ``warmup_steps`` on) is the final model at most."""
    w, n = g.warmup_steps, g.steps
    if w < n:
        return []
    if w > n:
        lr = f"rises for the whole run and peaks at {g.lr * n / w:.3g}, not grpo.lr={g.lr:g}"
        best = ", and best/ is never kept (it is kept from step grpo.warmup_steps on)"
    else:
        lr = f"rises for the whole run and reaches grpo.lr={g.lr:g} at its last step only (no decay)"
        best = ", and best/ can only be the final model (it is kept from step grpo.warmup_steps on)"
    return [
        f"grpo.warmup_steps={w} is {'more than' if w > n else 'as many as'} grpo.steps={n}: the learning rate {lr}"
        f"{best if g.save_best else ''}; set grpo.warmup_steps below grpo.steps"
    ]


#: the largest CUDA index torch reads as written (its device index is 8 bits: cuda:128 was cuda:-128, cuda:32767 was
#: cuda, the current device, and cuda:2147483648 a traceback once the run had begun)
MAX_CUDA_INDEX = 127


def _check_device(device: str) -> None:
    """``device``: auto, cpu, mps, cuda or cuda:N, N an index from 0 to :data:`MAX_CUDA_INDEX` without a leading 0
    (torch refused cuda:007 with a traceback)."""
    m = re.fullmatch(r"auto|cpu|mps|cuda(?::(0|[1-9][0-9]*))?", device)
    _check(
        m is not None and (m.group(1) is None or int(m.group(1)) <= MAX_CUDA_INDEX),
        "device",
        f"expected auto, cpu, cuda, cuda:N (N a GPU index, 0 to {MAX_CUDA_INDEX}) or mps, got {device!r}",
    )


def _check_rewards(rewards: list, key: str) -> None:
    """``grpo.rewards``: each item a mapping {fn, weight, name} with a finite weight, every name its own."""
    named: dict[str, int] = {}
    for j, item in enumerate(rewards):
        shape = "a mapping {fn: ..., weight: ..., name: ...}"
        _check(isinstance(item, dict), key, f"item {j} must be {shape}, got {item!r}")
        unknown = sorted(map(str, set(item) - {"fn", "weight", "name"}))
        spaced = " (YAML reads `fn:numeric` as one key: a space after the colon, `fn: numeric`)"
        _check(
            not unknown,
            key,
            f"item {j}: unknown key(s) {', '.join(unknown)} (expected fn, weight, name)"
            f"{spaced if any(':' in k for k in unknown) else ''}",
        )
        _check(isinstance(item.get("fn"), str), key, f"item {j} needs fn: module:function, got {item!r}")
        _check(
            isinstance(item.get("name", ""), str),
            key,
            f"item {j}: name must be text (it names the reward/<name> metric), got {item.get('name')!r}",
        )
        w = item.get("weight", 1.0)
        if isinstance(w, str):  # YAML reads 1e-3 (no dot) as text: read it as the scalar options read numbers
            w = item["weight"] = _to_float(w, f"{key} item {j} weight")
        elif isinstance(w, (int, float)) and not isinstance(w, bool):  # (finite, of a size float32 holds: an int
            _to_float(w, f"{key} item {j} weight")  # past float's range was an OverflowError in math.isfinite)
        _check(
            isinstance(w, (int, float)) and not isinstance(w, bool) and math.isfinite(w),
            key,
            f"item {j}: weight must be a finite number, got {w!r}",
        )
        name = reward_name(item)
        _check(
            name not in named,
            key,
            f"item {j} is named {name!r} like item {named.get(name)} (metrics log reward/<name>, and "
            "grpo.filter_reward picks one by it): give each its own name",
        )
        named[name] = j
    _check(  # (the total reward was 0 for every rollout: no advantage, every group filtered, no update)
        not rewards or any(item.get("weight", 1.0) != 0 for item in rewards),
        key,
        "every item has weight 0: the total reward would be 0 for every rollout, with nothing to learn (a part of "
        "weight 0 beside others is logged as reward/<name> without entering the total)",
    )


#: the built-in scorers (dgrpo.eval.scoring.SCORERS): each gives a completion 0 or 1
BUILTIN_SCORERS = ("numeric", "exact", "choice", "coconut")


def _check_filtered_total(g: GRPOConfig, p: str) -> None:
    """The group filter on the total of ``grpo.rewards`` whose parts are all built-in scorers (0 or 1 each): the
    total's range is known from the weights, and must lie in [0, 1] (it was found after the model loaded and the
    first rollouts: at the paper's scale, minutes)."""
    if not g.filter or g.advantage == "ema" or g.filter_reward or not g.rewards:
        return
    if not all(item["fn"] in BUILTIN_SCORERS for item in g.rewards):
        return  # (a plug-in's range is known once it is called: the trainer checks it on gold answers)
    weights = [float(item.get("weight", 1.0)) for item in g.rewards]
    low, high = sum(min(w, 0.0) for w in weights), sum(max(w, 0.0) for w in weights)
    _check(
        low >= 0.0 and high <= 1.0,
        f"{p}.filter",
        f"the accuracy window applies to the total reward, which reaches {high if high > 1 else low:g} with these "
        "weights (each built-in scorer gives 0 or 1): set grpo.filter_reward to one of grpo.rewards, or "
        "grpo.filter=false",
    )


def reward_name(item: dict) -> str:
    """The name of one ``grpo.rewards`` item (its metric is ``reward/<name>``): its ``name``, else its ``fn``, a file's
    ``path/to/file.py:function`` written as a module's is, ``file:function`` (the path logged
    ``reward//abs/path/file.py:function``, and a run's name of a part changed with the directory it was given from).
    Two items of one name are refused (:func:`_check_rewards`)."""
    if item.get("name"):
        return str(item["name"])
    from ..plugins import plugin_file  # (stdlib only: no cycle)

    fn = str(item["fn"])
    path = plugin_file(fn)
    return fn if path is None else f"{path.stem}:{fn.rpartition(':')[2]}"


LoggingBackend = Literal["jsonl", "tensorboard", "wandb"]


@dataclass
class LoggingConfig:
    """Where training metrics go, besides OUT/metrics.jsonl (always written: resuming and `dgrpo plot` read it)."""

    backends: list = opt(
        ["jsonl"],
        "metric sinks, any of: jsonl (OUT/metrics.jsonl, always on), tensorboard (OUT/tb; needs the tensorboard "
        "package), wandb (Weights & Biases; needs the wandb package; WANDB_MODE=offline logs without network)",
    )
    project: str = opt("dgrpo", "W&B project (left at dgrpo, WANDB_PROJECT wins when it is set)")
    entity: str = opt("", "W&B entity (team or user; '' = WANDB_ENTITY, else your default)")
    run_name: str = opt(
        "",
        "the run's name in W&B ('' = WANDB_NAME when it is set, else the name of the output directory; TensorBoard "
        "names runs by folder). W&B writes under OUT/wandb, whatever WANDB_DIR says",
    )

    def validate(self, p: str = "logging") -> None:
        """Known backends only; with wandb among them, a project name W&B accepts (:func:`wandb_project_refused`)."""
        known = typing.get_args(LoggingBackend)
        bad = [b for b in self.backends if b not in known]
        _check(
            not bad,
            f"{p}.backends",
            f"unknown backend(s) {', '.join(map(str, bad))}; expected any of {', '.join(known)}",
        )
        why = wandb_project_refused(self.project) if "wandb" in self.backends else ""
        _check(not why, f"{p}.project", wandb_name_advice(why, self.project, f"{p}.entity"))


#: the characters W&B refuses in a project name, and its longest one (wandb's settings check, offline too)
WANDB_PROJECT_CHARS, WANDB_PROJECT_MAX = "/\\#?%:", 128


def wandb_name_advice(reason: str, name: str, entity: str) -> str:
    """What to do about a project ``name`` W&B refuses for ``reason``: another name, and for W&B's ``team/project``
    form, the team in ``entity`` (``logging.entity``, or ``WANDB_ENTITY`` for a name from ``WANDB_PROJECT``)."""
    team = f"; a team or user goes in {entity}" if "/" in name else ""
    return f"W&B refuses the name ({reason}): choose another{team}"


def wandb_project_refused(name: str) -> str:
    """Why ``wandb.init`` refuses the project ``name``, in W&B's words ('' when it takes it): a run found it only when
    the trackers opened, after the model and the data had loaded."""
    if len(name) > WANDB_PROJECT_MAX:
        return f"Invalid project name {name!r}: exceeded {WANDB_PROJECT_MAX} characters"
    found = [c for c in WANDB_PROJECT_CHARS if c in name]
    if not found:
        return ""
    chars = ",".join(WANDB_PROJECT_CHARS)
    return f"Invalid project name {name!r}: cannot contain characters {chars!r}, found {','.join(found)!r}"


@dataclass
class Config:
    """Everything a run reads: the top-level options and one section per stage of the pipeline."""

    seed: int = opt(0, "run seed: initialisation, data order, dropout seeds")
    device: str = opt("auto", "auto (CUDA when available), cpu, cuda, cuda:N or mps")
    threads: int = opt(0, "torch CPU threads (0 = torch default; at most 1024)")
    fsdp: FSDPMode = opt(
        "none",
        "under torchrun: none (replicated weights, gradients all-reduced), full (FSDP2; "
        "rank 0 writes gathered safetensors and resumable checkpoints) or sharded (FSDP2; every rank writes its "
        "shard of each checkpoint, the optimizer state of resumable ones included); 0 / false / off are none, 1 / true "
        "/ on full, here as in the DGRPO_FSDP environment variable, which overrides it, and the run's config.json "
        "records the mode; a resumed run may change it, as it may change the number of processes (results change at "
        "float level)",
    )
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    data: DataConfig = field(default_factory=DataConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    perturbation: PerturbationConfig = field(default_factory=PerturbationConfig)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)

    def validate(self) -> Config:
        """Check every section and the top-level options; returns ``self``. A value set on the object in Python is
        first read as a file's or ``--set``'s would be (``"1e-5"`` as 1e-5, a Path as its text), or refused in
        the same one-line error."""
        _coerce_fields(self, "")
        for f in fields(self):
            section = getattr(self, f.name)
            if hasattr(section, "validate"):
                section.validate(f.name)
        _check_device(self.device)
        _at_least(self, "", 0, "threads")
        _check(
            self.threads <= MAX_THREADS,
            "threads",
            f"at most {MAX_THREADS} (torch's CPU threads; 0: torch's default), got {self.threads}",
        )
        _check(
            not (self.grpo.engine == "fast" and self.perturbation.kind == "native"),
            "grpo.engine",
            "the fast engine needs a perturbation held in tensors for the batch (locked, gaussian or none); native "
            "dropout reseeds the RNG before every forward, one rollout at a time (set grpo.engine=eager)",
        )
        _check(
            not (
                self.grpo.rollout_cache == "static"
                and self.grpo.engine != "fast"
                and self.perturbation.kind == "native"
            ),
            "grpo.rollout_cache",
            "native dropout draws its masks in the shape of each forward's attention, which a static cache widens: the "
            "update could not replay the rollouts' masks (set grpo.rollout_cache=dynamic)",
        )
        self._validate_compile()
        self._validate_latent_graphs()
        _check(
            not (self.model.master_weights and self.grpo.optimizer == "adamw8bit"),
            "model.master_weights",
            "the master copies are stepped by torch's AdamW; bitsandbytes' 8-bit AdamW writes its update into the "
            "bf16 weight (set grpo.optimizer=adamw, or model.master_weights=false)",
        )
        _check(
            not (self.model.lora.r > 0 and self.fsdp != "none"),
            "model.lora.r",
            "LoRA with FSDP is not supported: the frozen backbone is replicated and only the adapters train "
            "(set fsdp=none: plain data parallelism)",
        )
        return self

    def _validate_compile(self) -> None:
        """What ``model.compile`` runs with (the architecture is checked when the model is loaded)."""
        if not self.model.compile:
            return
        pert = self.perturbation
        for ok, why in (
            (self.model.kernels == "none", "model.kernels=liger: the compiler fuses those layers itself"),
            (self.model.lora.r == 0, "LoRA adapters (model.lora.r > 0)"),
            (self.fsdp == "none", "FSDP (fsdp != none)"),
            (pert.kind != "native", "perturbation.kind=native (dropout modules drawing from the global RNG)"),
            (
                pert.kind != "gaussian" or pert.gaussian_target == "activations",
                "perturbation.gaussian_target=weights (a hook inside the attention / MLP)",
            ),
        ):
            _check(ok, "model.compile", f"the compiled layers do not run with {why}; set model.compile=false")

    def latent_chain_obstacle(self) -> str | None:
        """What in this config keeps ``grpo.update_latent_graphs`` from running (None: nothing here; the trainer
        checks the rest: the engine once resolved, the processes, the model)."""
        g = self.grpo
        for ok, why in (
            (  # (before the engine: the advice to set grpo.engine=fast would meet the next refusal)
                self.perturbation.kind != "native",
                "perturbation.kind=native (the chain is the fast engine's, which needs a perturbation held in tensors)",
            ),
            (g.engine != "eager", "grpo.engine=eager (the chain is the fast engine's: set grpo.engine=fast or auto)"),
            (
                not (g.recompute and g.recompute_latent_steps),
                "grpo.recompute_latent_steps=true (the chain keeps the latent steps' activations)",
            ),
            (not self.model.compile, "model.compile=true (compiled layers inside a captured graph)"),
            (self.fsdp == "none", "FSDP (fsdp != none)"),
        ):
            if not ok:
                return f"the latent chain does not run with {why}"
        return None

    def inert_eval_settings(self) -> list[str]:
        """The ``eval.*`` decoding settings that this config makes do nothing (a line each, for a warning where they
        are read: ``dgrpo eval``, and SFT's and GRPO's validation and test sets): ``eval.top_p`` under greedy
        decoding (``eval.temperature=0``), accepted without a word as grpo.top_p was not."""
        e = self.eval
        if e.top_p < 1 and e.temperature == 0:
            return [f"eval.top_p={e.top_p} changes nothing with eval.temperature=0: greedy decoding samples none"]
        return []

    def inert_settings(self) -> list[str]:
        """The GRPO settings that this config makes do nothing, or less than they say (each a line for a warning, at
        the start of GRPO training; none is an error: a null perturbation is the deterministic ablation,
        ``perturbation.kind=none``, by another name)."""
        pert, lines = self.perturbation, _warmup_lines(self.grpo)
        scale = {"locked": "p", "native": "p", "gaussian": "sigma"}.get(pert.kind)
        silent = scale is not None and getattr(pert, scale) == 0
        if silent:
            how = (
                "and, decoded greedily, give one answer: no learning signal"
                if self.grpo.temperature == 0
                else "and differ only by their sampled tokens"
            )
            lines.append(
                f"perturbation.{scale}=0 makes perturbation.kind={pert.kind} perturb nothing: the K rollouts of a "
                f"group share one network {how} (as with perturbation.kind=none)"
            )
        if self.grpo.replay == "fresh_mask" and (pert.kind == "none" or silent):
            lines.append(
                "grpo.replay=fresh_mask changes nothing without a perturbation: there is no mask to draw afresh"
            )
        if not pert.perturb_answer and (pert.kind == "none" or silent):
            lines.append("perturbation.perturb_answer=false changes nothing without a perturbation: none acts anywhere")
        lines += _unused_perturbation_settings(pert)
        g = self.grpo
        if g.top_p < 1 and g.temperature == 0:
            lines.append(f"grpo.top_p={g.top_p} changes nothing with grpo.temperature=0: greedy decoding samples none")
        lines += _unused_grpo_settings(g)
        lines += unused_model_settings(self.model)
        lines += self.inert_eval_settings()
        if 0 < g.temperature < 0.05:
            lines.append(
                f"grpo.temperature={g.temperature}: the update scores each token under softmax(logits / T), nearly "
                "one-hot this cold, so the sampled tokens' log-probs are about 0 and carry almost no gradient (0 is "
                "greedy decoding, scored at T = 1)"
            )
        return lines

    def _validate_latent_graphs(self) -> None:
        """``grpo.update_latent_graphs=true`` where this config keeps the chain from running (auto turns itself off)."""
        why = self.latent_chain_obstacle() if self.grpo.update_latent_graphs == "true" else None
        _check(why is None, "grpo.update_latent_graphs", why or "")
