"""Where things live inside a Hugging Face causal LM: a token's rows (input embedding, untied head), the decoder
blocks, each block's attention and MLP, their output projections, and the perturbation sites built from them.

One table (:data:`PART_NAMES`) lists the attribute names tried, in order, for every part; it covers
Qwen2 / Llama (``self_attn.o_proj``, ``mlp.down_proj``) and GPT-2 (``attn.c_proj``, ``mlp.c_proj``), and
the usual alternatives of other families. A layer selection (``perturbation.layers``) is parsed by
:func:`dgrpo.config.parse_layer_spec` and resolved against the model's depth here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from ..config import PERTURBATION_SITES, ConfigError, parse_layer_spec

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def input_embedding_weight(model: PreTrainedModel) -> Tensor:
    """The input embedding matrix [vocab, hidden] of a causal LM."""
    weight = model.get_input_embeddings().weight
    assert isinstance(weight, Tensor)
    return weight


def token_tables(model: PreTrainedModel) -> dict[str, Tensor]:
    """Where a token's rows live: the input embedding (``input``) and, when untied, the head's weight (``output``)
    and bias (``output_bias``)."""
    emb = input_embedding_weight(model)
    tables = {"input": emb}
    out: Any = model.get_output_embeddings()
    if out is not None and out.weight.data_ptr() != emb.data_ptr():
        tables["output"] = out.weight
        if getattr(out, "bias", None) is not None:
            tables["output_bias"] = out.bias
    return tables


def float32_frequencies(model: nn.Module) -> dict[str, Tensor]:
    """The rotary position frequencies of a model (Qwen2's and Llama's ``rotary_emb.inv_freq`` and
    ``original_inv_freq``) that are float32, by buffer name: transformers computes them in float32 whatever the
    weights' dtype, and ``from_pretrained`` in bfloat16 keeps them so."""
    return {
        name: buf
        for name, buf in model.named_buffers()
        if name.rsplit(".", 1)[-1].endswith("inv_freq") and buf.dtype == torch.float32
    }


def restore_float32_frequencies(model: nn.Module, kept: dict[str, Tensor]) -> None:
    """Put back the float32 frequencies :func:`float32_frequencies` listed where a cast changed their dtype (on the
    device the cast left them)."""
    for name, value in kept.items():
        owner, _, attr = name.rpartition(".")
        module = model.get_submodule(owner)
        now = module._buffers.get(attr)
        if now is not None and now.dtype != torch.float32:
            module._buffers[attr] = value.to(now.device)


def float32_rotary_init(model: nn.Module) -> None:
    """Give the rotary modules of a model cast to a low precision before dgrpo wrapped it (``model.to(bfloat16)``,
    then ``LatentLM(model, tokenizer)``) their float32 frequencies back, recomputed from the module's config by its
    own rope function, as ``from_pretrained`` and a reload of the saved checkpoint compute them (a tiny Qwen2/Llama
    model cast before wrapping scored log-probs 1e-3 apart from the same weights cast after, 2e-2 apart from its
    reloaded checkpoint with larger weights, and decoded other greedy answers). A model with frequencies per layer
    type (Gemma 3's, OLMo 3's ``sliding_attention_inv_freq``, ...: they were left rounded, log-probs 3e-3 apart from
    the reloaded checkpoint) gets each type's. A module whose rope function is unknown, or whose frequencies come out
    of another shape, is left as it is."""
    for module in model.modules():
        for prefix in _frequency_prefixes(module):  # ("" for inv_freq; "sliding_attention_" for a layer type's)
            now = module._buffers[f"{prefix}inv_freq"]
            if now is None or now.dtype == torch.float32 or not now.is_floating_point():
                continue
            fresh = _rope_frequencies(module, prefix.removesuffix("_") or None)
            if fresh is None or fresh.shape != now.shape:
                continue
            for attr in (f"{prefix}inv_freq", f"{prefix}original_inv_freq"):
                buf = module._buffers.get(attr)
                if buf is not None and buf.dtype != torch.float32 and buf.shape == fresh.shape:
                    module._buffers[attr] = fresh.to(buf.device, copy=True)  # (each its own, as transformers')


def _frequency_prefixes(module: nn.Module) -> list[str]:
    """The prefixes of a module's rotary frequency buffers: "" for ``inv_freq``, ``LAYER_TYPE_`` for a model's
    frequencies per layer type (``sliding_attention_inv_freq``)."""
    ending = "inv_freq"
    return [
        name.removesuffix(ending)
        for name in module._buffers
        if name.endswith(ending) and not name.endswith(f"original_{ending}") and (name == ending or "_" in name)
    ]


def _rope_frequencies(module: nn.Module, layer_type: str | None = None) -> Tensor | None:
    """The float32 ``inv_freq`` a transformers rotary module computes at construction, of ``layer_type``'s layers for
    frequencies per layer type (None: not one that says how: its ``rope_type`` (by layer type) and ``config``, and
    its default rope function or transformers' table of the others)."""
    config, rope_type = getattr(module, "config", None), getattr(module, "rope_type", None)
    if isinstance(rope_type, dict):  # (one per layer type: Gemma 3's)
        rope_type = rope_type.get(layer_type) if layer_type is not None else None
    elif layer_type is not None:
        return None
    if config is None or not isinstance(rope_type, str):
        return None
    if rope_type == "default":
        init = getattr(module, "compute_default_rope_parameters", None)
    else:
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        init = ROPE_INIT_FUNCTIONS.get(rope_type)
    if init is None:
        return None
    inv_freq = init(config, **({"layer_type": layer_type} if layer_type is not None else {}))[0]
    return inv_freq.float() if isinstance(inv_freq, Tensor) else None


#: attribute names of a block's parts, tried in order (first match wins)
PART_NAMES: dict[str, tuple[str, ...]] = {
    "attn": ("self_attn", "attn", "attention"),  # Qwen2 / Llama: self_attn; GPT-2: attn
    "mlp": ("mlp", "feed_forward"),  # Qwen2 / Llama / GPT-2: mlp
    "attn_out": ("o_proj", "c_proj", "out_proj", "dense"),  # the attention's output projection
    "mlp_out": ("down_proj", "c_proj", "fc_out", "dense", "dense_4h_to_h", "fc2"),  # the MLP's output projection
}
#: where a causal LM keeps its list of blocks, tried in order (below ``model.base_model``)
LAYER_LISTS = ("layers", "h", "blocks", "decoder.layers")
#: perturbation sites: a block's attention output, MLP output, or whole output (the residual stream); the config's
SITES = PERTURBATION_SITES


def _attr_path(obj: object, dotted: str) -> object | None:
    for part in dotted.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def base_model(model: nn.Module) -> nn.Module:
    """The decoder stack below a causal LM's head: ``model.base_model``, but where that is the causal LM itself
    (Llama 4's text model names its prefix ``language_model`` and keeps the stack at ``.model``), ``model.model``."""
    base: nn.Module = getattr(model, "base_model", model)
    stack = getattr(model, "model", None)
    return stack if base is model and isinstance(stack, nn.Module) else base


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The list of transformer blocks of any HF causal LM (``model.layers``, ``transformer.h``, ...)."""
    base = base_model(model)
    for attr in LAYER_LISTS:
        obj = _attr_path(base, attr)
        if isinstance(obj, nn.ModuleList) and len(obj) > 0:
            return obj
    lists = [m for m in base.modules() if isinstance(m, nn.ModuleList)]
    if not lists:
        raise ValueError(f"cannot find the decoder layers of {type(model).__name__}")
    return max(lists, key=len)


def block_part(module: nn.Module, part: str) -> nn.Module | None:
    """``module``'s sub-module for ``part`` (a key of :data:`PART_NAMES`), or None."""
    for name in PART_NAMES[part]:
        sub = getattr(module, name, None)
        if isinstance(sub, nn.Module):
            return sub
    return None


def attention_modules(model: nn.Module) -> list[nn.Module]:
    """The attention module of every block, in order."""
    mods = []
    for block in decoder_layers(model):
        m = block_part(block, "attn")
        if m is None:
            raise ValueError(f"{type(block).__name__} has no attention module")
        mods.append(m)
    return mods


def output_projection(module: nn.Module, part: str) -> nn.Module:
    """The linear layer that writes ``module``'s output (``part`` is ``attn`` or ``mlp``)."""
    if part not in ("attn", "mlp"):
        raise ValueError(f"a {part} site has no single output projection to perturb; use attn or mlp sites")
    sub = block_part(module, f"{part}_out")
    sub = getattr(sub, "base_layer", sub)  # under LoRA (PEFT), the wrapped layer: its weight is the backbone's
    if sub is None or not hasattr(sub, "weight"):  # (a mixture of experts: one per expert)
        raise ConfigError(
            f"invalid config value perturbation.gaussian_target: weights noise perturbs a site's output projection, "
            f"and the {part} site ({type(module).__name__}) has none (a mixture of experts has one per expert): use "
            "perturbation.gaussian_target=activations, or other perturbation.sites"
        )
    return sub


def hidden_size(model: nn.Module) -> int:
    cfg: Any = model.config
    return int(cfg.hidden_size if hasattr(cfg, "hidden_size") else cfg.n_embd)


def select_layers(spec: str, n_layers: int) -> list[int]:
    """The block indices a layer selection names (grammar: :func:`dgrpo.config.parse_layer_spec`)."""
    kind, value = parse_layer_spec(spec)
    if kind == "all":
        return list(range(n_layers))
    if kind == "slice":
        start, stop = value
        chosen = list(range(n_layers))[slice(start, stop)]
        if not chosen:
            raise ConfigError(
                f"invalid config value perturbation.layers: {spec!r} selects no layer of a {n_layers}-layer model"
            )
        return chosen
    indices = [value] if isinstance(value, int) else list(value)
    for i in indices:
        if not -n_layers <= i < n_layers:
            raise ConfigError(
                f"invalid config value perturbation.layers: layer {i} out of range for a {n_layers}-layer model"
            )
    chosen = [i % n_layers for i in indices]
    if len(set(chosen)) < len(chosen):  # -1 and the last index: one layer, two masks
        raise ConfigError(f"invalid config value perturbation.layers: {spec!r} names a layer twice")
    return chosen


@dataclass
class Site:
    """One place whose output a perturbation multiplies."""

    name: str  # e.g. "layers.3.mlp"
    part: str  # attn | mlp | residual
    module: nn.Module
    width: int


def find_sites(model: nn.Module, sites: list[str], layers: str) -> list[Site]:
    """Modules whose outputs are perturbed: attention output, MLP output, block output (residual stream)."""
    blocks = decoder_layers(model)
    width = hidden_size(model)
    found = []
    for i in select_layers(layers, len(blocks)):
        block = blocks[i]
        for s in sites:
            if s not in SITES:
                raise ConfigError(
                    f"invalid config value perturbation.sites: unknown site {s!r}; expected any of {SITES}"
                )
            mod = block if s == "residual" else block_part(block, s)
            if mod is None:
                raise ConfigError(
                    f"invalid config value perturbation.sites: layer {i} of {type(model).__name__} has no {s}"
                )
            found.append(Site(f"layers.{i}.{s}", s, mod, width))
    return found
