"""What the benchmarks run on: shapes, the model (random weights), the prompts, GRPO configs, FLOP counts."""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch
from transformers import AutoModelForCausalLM

from ..config import Config, LoraConfig, TaskConfig, set_value
from ..data.records import Record
from ..data.synthetic import generate_split, tokenizer_corpus
from ..data.tokenizer import train_task_tokenizer
from ..model.latent_lm import LatentLM
from ..model.tiny import tiny_config


@dataclass
class Shapes:
    """Every size one run of the suite uses (FULL, QUICK or GPU below)."""

    name: str = "full"
    # model: Qwen2, random weights
    hidden: int = 128
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    ffn: int = 512
    vocab: int = 0  # 0 = the built-in task tokenizer's size
    # rollouts (item 1)
    prompts: int = 8
    rollout_K: tuple = (8, 32)
    T: int = 6
    max_new_tokens: int = 16
    seq_per_prompt: int = 2  # rollouts per prompt timed for the one-at-a-time baselines (scaled per rollout)
    # Coconut SFT step (item 2)
    sft_batch: int = 64
    sft_stage: int = 2
    # GRPO step scaling (items 3, 4, 6): T values at K = grpo_K_at, K values at T = grpo_T_at
    grpo_T: tuple = (3, 6, 12)
    grpo_K: tuple = (8, 16, 32)
    grpo_K_at: int = 16
    grpo_T_at: int = 6
    # dense matmul reference sizes (item 6): (m, k, n)
    mm_sizes: tuple = ((128, 512, 512), (2048, 2048, 2048))
    # the rollout's locked-mask draw (item 4): rows, sites, width (a paper step: 16 x 32 rows, Qwen2.5-1.5B's 28 x 1536)
    mask_draw: tuple = (512, 28, 1536)
    # repetitions
    reps: int = 7
    warmup: int = 1
    mem_reps: int = 3

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> Shapes:
        d = dict(d)
        for k in ("rollout_K", "grpo_T", "grpo_K", "mask_draw"):
            d[k] = tuple(d[k])
        d["mm_sizes"] = tuple(tuple(x) for x in d["mm_sizes"])
        return cls(**d)


FULL = Shapes()
QUICK = Shapes(
    name="quick",
    hidden=64,
    layers=2,
    heads=4,
    kv_heads=2,
    ffn=128,
    prompts=2,
    rollout_K=(4, 8),
    T=3,
    max_new_tokens=8,
    seq_per_prompt=1,
    sft_batch=16,
    grpo_T=(1, 2, 4),
    grpo_K=(2, 4, 8),
    grpo_K_at=4,
    grpo_T_at=2,
    mm_sizes=((128, 512, 512), (1024, 1024, 1024)),
    mask_draw=(128, 28, 1536),
    reps=5,
    warmup=1,
    mem_reps=1,
)
#: ~0.5B Qwen2 (Qwen2.5-0.5B's shape), random weights, bf16: the GPU section.
GPU = Shapes(
    name="gpu-0.5b",
    hidden=896,
    layers=24,
    heads=14,
    kv_heads=2,
    ffn=4864,
    vocab=151936,
    prompts=8,
    rollout_K=(8, 32),
    T=6,
    max_new_tokens=16,
    seq_per_prompt=1,
    sft_batch=64,
    sft_stage=2,
    grpo_T=(3, 6, 12),
    grpo_K=(8, 16, 32),
    grpo_K_at=16,
    grpo_T_at=6,
    mm_sizes=((128, 896, 4864), (4096, 896, 4864), (8192, 8192, 8192)),
    reps=5,
    warmup=1,
    mem_reps=1,
)


@dataclass
class Ctx:
    """Where and how a section runs."""

    device: torch.device
    dtype: torch.dtype
    shapes: Shapes
    log: Callable[[str], None] = print
    threads: int = 2
    results: dict = field(default_factory=dict)

    @property
    def section(self) -> str:
        return "gpu" if self.device.type == "cuda" else "cpu"


def cpu_item_shapes(ctx: Ctx, cpu: Shapes) -> Shapes:
    """An item's own shapes ``cpu`` for the full CPU section; the suite's shapes on GPU and in --quick."""
    return cpu if ctx.device.type == "cpu" and ctx.shapes.name == "full" else ctx.shapes


# --------------------------------------------------------------------------- task and model
@functools.lru_cache(maxsize=1)
def task_tokenizer():

    return train_task_tokenizer(tokenizer_corpus(TaskConfig()))


def task_records(n: int) -> list[Record]:
    """``n`` training problems of the built-in task (4 reasoning steps each)."""

    return generate_split(TaskConfig(n_train=max(n, 8), n_valid=8, n_test=8), "train")[:n]


def suppress_eos(lm: LatentLM) -> None:
    """EOS logit := -1e4 (a forward hook on the LM head): every answer runs exactly ``max_new_tokens``.

    Random weights would otherwise stop rows at random lengths, and the methods compared would not do
    the same work. Finite, so log-softmax and entropy stay finite; in place, so it costs nothing.
    """
    eos = lm.eos_id

    def hook(module, args, out):
        out[..., eos] = -1e4
        return out

    lm.model.get_output_embeddings().register_forward_hook(hook)


_BUILT: dict[tuple, LatentLM] = {}


def add_lora(lm: LatentLM, r: int = 16) -> LatentLM:
    """LoRA (rank ``r``, alpha 2r, every linear layer, the latent rows trainable) on a bench model."""
    from ..model import lora

    lm.name_or_path = "bench: random-weight Qwen2 built in memory"  # adapters name their base; never saved here
    lora.apply_lora(lm, LoraConfig(r=r, alpha=2.0 * r))
    return lm


def optimizer_state_bytes(opt: torch.optim.Optimizer) -> int:
    """The bytes of an optimizer's state tensors (moments, 8-bit blocks and their scales, step counters)."""
    return sum(v.numel() * v.element_size() for st in opt.state.values() for v in st.values() if torch.is_tensor(v))


def build_lm(
    shapes: Shapes,
    device: torch.device,
    dtype: torch.dtype,
    seed: int = 0,
    *,
    fixed_length: bool = True,
    keep: bool = True,
) -> LatentLM:
    """A Qwen2 LatentLM with random weights over the built-in tokenizer (like ``tests/conftest.py::make_lm``);
    ``fixed_length``: EOS is never generated (:func:`suppress_eos`). Each call returns a fresh copy (``keep``: the
    first build of a shape is kept on its device, so a 0.5B model is initialised once per process)."""
    if not keep:
        return _build_lm(shapes, device, dtype, seed, fixed_length)
    key = (
        shapes.hidden,
        shapes.layers,
        shapes.heads,
        shapes.kv_heads,
        shapes.ffn,
        shapes.vocab,
        str(device),
        dtype,
        seed,
        fixed_length,
    )
    if key not in _BUILT:
        _BUILT[key] = _build_lm(shapes, device, dtype, seed, fixed_length)
    return copy.deepcopy(_BUILT[key])


def _build_lm(shapes: Shapes, device: torch.device, dtype: torch.dtype, seed: int, fixed_length: bool) -> LatentLM:
    tok = copy.deepcopy(task_tokenizer())
    cfg = tiny_config(
        "qwen2",
        shapes.vocab or len(tok),
        hidden_size=shapes.hidden,
        num_layers=shapes.layers,
        num_heads=shapes.heads,
        intermediate_size=shapes.ffn,
    )
    cfg.num_key_value_heads = shapes.kv_heads
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(cfg)
    model.to(device=device, dtype=dtype)
    lm = LatentLM(model, tok)
    lm.new_latent_tokens = []  # (random weights to time: untrained markers are no concern; GRPO would warn of them)
    if fixed_length:
        suppress_eos(lm)
    return lm


def grpo_config(shapes: Shapes, K: int, T: int, kind: str = "locked", *, beta0: float | None = None) -> Config:
    """A GRPO config for timing: filter off (the update always runs), no warm-up (lr and beta > 0 from step 0)."""
    cfg = Config()
    over = {
        "grpo.group_size": K,
        "grpo.n_latent": T,
        "grpo.prompts_per_step": shapes.prompts,
        "grpo.max_new_tokens": shapes.max_new_tokens,
        "grpo.filter": "false",
        "grpo.warmup_steps": 0,
        "grpo.steps": 1_000_000,
        "perturbation.kind": kind,
        "threads": 2,
    }
    if beta0 is not None:
        over["grpo.beta0"] = beta0
    for k, v in over.items():
        set_value(cfg, k, str(v))
    return cfg.validate()


# --------------------------------------------------------------------------- FLOPs
@dataclass
class Dims:
    params_nonembedding: int
    layers: int
    d_model: int
    d_attn: int  # heads * head_dim (width of Q and of the attention output)
    vocab: int


def dims_of(lm: LatentLM) -> Dims:
    c = lm.model.config
    emb = {id(lm.model.get_input_embeddings().weight), id(lm.model.get_output_embeddings().weight)}
    n = sum(p.numel() for p in lm.model.parameters() if id(p) not in emb)
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return Dims(n, c.num_hidden_layers, c.hidden_size, c.num_attention_heads * head_dim, c.vocab_size)


FLOP_FORMULA = (
    "per row, S = P + T + L positions (prompt P, T latents, <|end-latent|>, L-1 fed answer tokens), logits at L: "
    "forward = 2*N*S + 4*layers*d_attn*S(S+1)/2 + 2*d_model*V*L; forward+backward = 3 x forward "
    "(N = non-embedding parameters; causal attention counted as QK^T + AV over the S(S+1)/2 visible keys)"
)


def recurrence_flops(d: Dims, rows: int, P: int, T: int, L: int, *, backward: bool) -> tuple[float, int]:
    """(FLOPs, positions) of ``rows`` rows through prompt -> T latents -> end -> answer (see FLOP_FORMULA)."""
    S = P + T + L
    fwd = 2 * d.params_nonembedding * S + 4 * d.layers * d.d_attn * S * (S + 1) / 2 + 2 * d.d_model * d.vocab * L
    return rows * fwd * (3 if backward else 1), rows * S


def prompt_widths(lm: LatentLM, questions: list[str], chunk: int) -> list[tuple[int, int]]:
    """(rows, padded prompt width) of each chunk the library runs (left-padded, all-pad columns trimmed)."""
    lens = [int(m.sum()) for m in lm.encode_questions(questions)[1]]
    return [(len(lens[i : i + chunk]), max(lens[i : i + chunk])) for i in range(0, len(lens), chunk)]


@functools.lru_cache(maxsize=1)
def tokenizing_lm() -> LatentLM:
    """A minimal LatentLM over the task tokenizer, for counting prompt widths without building a large model."""
    return build_lm(Shapes(hidden=8, layers=1, heads=1, kv_heads=1, ffn=8), torch.device("cpu"), torch.float32)
