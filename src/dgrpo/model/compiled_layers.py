"""The decoder layers as one ``torch.compile``d step shared by every layer (``model.compile``).

Each cached forward call of the recurrence runs the whole decoder stack, one eager Hugging Face layer after the other:
a dozen small kernels per layer and per call, issued from Python. Compiling the layers as they are does not work
here: dynamo's guards read the whole ``DynamicCache`` (other layers' keys, their lengths), the layer index and the
perturbation hooks' closures, so one replay recompiles past dynamo's limit. Instead every layer calls one compiled
``step``: ``torch.func.functional_call`` of a *template* copy of a layer with layer i's weights, its past keys and
values, the 4-d attention mask, the rotary tables and the factors its perturbation multiplies the attention's and
the MLP's outputs by, all as tensor arguments, the rows marked dynamic. One set of graphs serves every layer, every
call, every micro-batch size and the reference model (its weights are arguments too).

The perturbation keeps its hooks on the real modules; a hook made by :func:`output_factor_hook` says what it
multiplies by, and the step applies that factor inside the graph (the real attention and MLP modules do not run).
Hooks on the block itself (the ``residual`` site) act as always, outside the step. Any other hook inside a layer is an
error: the step could not apply it. ``LatentLM`` installs the step for teacher-forced scoring over a growing cache
(SFT, the GRPO update, theta_old, the reference); generation keeps the layers' own forward (on a CPU the compiled
one-position calls were slower: bench/RESULTS.md). A call over another cache runs the layers' own forward too.
"""

from __future__ import annotations

import copy
import warnings
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
import torch._dynamo.exc as dynamo_exc
from torch import Tensor, nn
from transformers.cache_utils import DynamicLayer

from ..config import ConfigError
from .anatomy import block_part, decoder_layers
from .attention_mask import prebuilt_mask_applies
from .recompute import OneLayerCache, dynamic_layer, layer_forwards

#: the attribute :func:`output_factor_hook` tags its hooks with: a callable giving the factor (or None)
FACTOR_ATTR = "dgrpo_output_factor"
#: architectures whose decoder layer the step runs (rotary tables as ``position_embeddings``, a 4-d SDPA mask)
COMPILABLE_MODEL_TYPES = ("qwen2", "llama")
#: dynamo's limit on graphs per compiled function, raised to at least this while the compiled layers run (a
#: process-wide setting, put back after: :meth:`CompiledLayers.installed`)
RECOMPILE_LIMIT = 64
#: the parts of a block whose output factors the step applies (``dgrpo.model.anatomy.PART_NAMES``)
FACTOR_PARTS = ("attn", "mlp")
#: what dynamo raises, with ``fail_on_recompile_limit_hit``, where a call would need a graph past its limit
RECOMPILE_LIMIT_HIT: tuple[type[Exception], ...] = tuple(
    e for e in (getattr(dynamo_exc, "FailOnRecompileLimitHit", None),) if e is not None
)


def output_factor_hook(factor: Callable[[], Tensor | None]) -> Callable:
    """A forward hook that multiplies a module's main output (a tensor, or a tuple's first item) by ``factor()``
    (broadcast, cast to the output's dtype; None: the output unchanged), tagged so that the compiled layers can
    apply the same factor inside their graph."""

    def hook(module: nn.Module, args: Any, output: Any) -> Any:
        f = factor()
        if f is None:
            return None
        check_rows(f, output[0] if isinstance(output, tuple) else output, args)
        return _scaled(output, f)

    setattr(hook, FACTOR_ATTR, factor)
    return hook


def rows_mismatch(rows: int, batch: int) -> str:
    """The one line that says a bound perturbation (one seed per row) met a batch of another size."""
    return (
        f"the perturbation is bound for {rows} rows (one seed each); this batch has {batch} (every forward inside its "
        "with block is perturbed, perturbation= given or not: bind one seed per row of the batch run there)"
    )


def check_rows(per_row: Tensor, h: Tensor, inputs: tuple = ()) -> None:
    """ValueError (:func:`rows_mismatch`) when a bound perturbation's per-row tensor (``[rows, ...]``, a factor
    ``[rows, 1, H]`` or a weight noise ``[rows, out, in]``) meets a module input or output ``h`` ``[B, L, ...]`` of
    another batch size: a forward inside the ``with`` block over another batch (one seed's mask spread over every
    row, or a size error deep in the layer). A shape read per perturbed module. An output flattened to ``[B*T, H]``
    (Llama 4's mixture of experts) takes its batch from the module's ``inputs``, the ``[B, T, H]`` it was flattened
    from (its rows alone spread bound rows over others: 2 bound over 4 rows of 3 tokens, each mask over two rows); one
    whose inputs do not tell its batch is refused (its rows cannot be told apart)."""
    if per_row.dim() != 3 or h.dim() not in (2, 3):
        return
    batch = h.shape[0] if h.dim() == 3 else flattened_batch(h, inputs)
    if batch is None:
        raise ValueError(
            f"a perturbed module's output is flattened to {tuple(h.shape)} and no [batch, tokens, hidden] input of "
            f"it tells its rows apart: the perturbation of {per_row.shape[0]} rows cannot be applied to it; choose "
            "other perturbation.sites"
        )
    if per_row.shape[0] != batch:
        raise ValueError(rows_mismatch(per_row.shape[0], batch))


def flattened_batch(h: Tensor, inputs: tuple) -> int | None:
    """The batch ``B`` of a module output ``h`` flattened to ``[B*T, H]``: that of its first ``[B, T, H]`` input
    with ``B*T`` rows (None: none has)."""
    for x in inputs:
        if isinstance(x, Tensor) and x.dim() == 3 and x.shape[0] * x.shape[1] == h.shape[0]:
            return int(x.shape[0])
    return None


def _scaled(output: Any, f: Tensor) -> Any:
    if isinstance(output, tuple):
        return (_times(output[0], f), *output[1:])
    return _times(output, f)


def _times(h: Tensor, f: Tensor) -> Tensor:
    """``h * f``, ``f`` cast to ``h``'s dtype; a [B, 1, H] factor on a module output flattened to [B*T, H] (Llama 4's
    mixture of experts) is applied per row of the batch, as on the [B, T, H] it was flattened from."""
    f = f if f.dtype == h.dtype else f.to(h.dtype)
    if h.dim() == 2 and f.dim() == 3 and h.shape[0] % f.shape[0] == 0:
        return (h.view(f.shape[0], -1, h.shape[-1]) * f).view(h.shape)
    return h * f


def _frozen(p: Tensor | None) -> Tensor | None:
    """``p`` as a frozen model holds it (a parameter that needs no grad): the step's graphs guard on
    ``requires_grad``, and without grad the policy's weights should run the reference's graphs."""
    if p is None or not p.requires_grad:
        return p
    return nn.Parameter(p.detach(), requires_grad=False) if isinstance(p, nn.Parameter) else p.detach()


def _factor_of(module: nn.Module, where: str) -> Tensor | None:
    """The factor the tagged hook on ``module`` asks for now (None: no hook, or an inactive one)."""
    if module._forward_pre_hooks:
        raise RuntimeError(f"model.compile: {where} has a forward pre-hook, which the compiled layers cannot apply")
    found = None
    for hook in module._forward_hooks.values():
        factor = getattr(hook, FACTOR_ATTR, None)
        if factor is None:
            raise RuntimeError(
                f"model.compile: {where} has a forward hook the compiled layers cannot apply ({hook!r}); only "
                "output factors (locked dropout, Gaussian noise on activations) run inside them"
            )
        f = factor()
        if f is not None:  # (an inactive hook leaves the output, and so the others' product, as it is)
            found = f if found is None else found * f
    if found is not None and found.storage_offset() != 0:
        found = found.clone()  # a view into a larger tensor: the graph would be specialised on its offset
    return found


def check_compilable(model: nn.Module) -> None:
    """Raise ConfigError (one line) when ``model``'s layers cannot run as the compiled step."""
    config = model.config
    check_compilable_config(config)
    if not prebuilt_mask_applies(config):
        raise ConfigError(
            "invalid config value model.compile: the compiled layers need SDPA attention over full-attention layers "
            f"(attn_implementation={getattr(config, '_attn_implementation', None)!r}); set model.compile=false"
        )


def check_compilable_config(config: Any) -> None:
    """Raise ConfigError (one line) when a model of ``config`` (its transformers config, or its config.json as a
    dict, read before its weights load) cannot run as the compiled step: another architecture's, attention
    dropout, or (a config.json) attention that is not SDPA over full-attention layers: sliding-window layers, or
    an ``attn_implementation`` it names (none named: transformers loads these architectures on SDPA). That part was
    refused only once the weights had loaded (minutes for a large model); :func:`check_compilable` checks the loaded
    model again, as transformers set it up."""
    get = config.get if isinstance(config, dict) else lambda key: getattr(config, key, None)
    model_type = get("model_type")
    if model_type not in COMPILABLE_MODEL_TYPES:
        raise ConfigError(
            f"invalid config value model.compile: the compiled layers run {', '.join(COMPILABLE_MODEL_TYPES)} "
            f"decoders; this model is {model_type!r} (set model.compile=false)"
        )
    try:
        attention_dropout = float(get("attention_dropout") or 0.0)
    except (TypeError, ValueError):  # (not a number: transformers' own load says so)
        return
    if attention_dropout > 0:
        raise ConfigError(
            f"invalid config value model.compile: the model's attention_dropout is {attention_dropout}; the "
            "compiled layers run without it (it would draw from the global RNG: set it to 0, or model.compile=false)"
        )
    if isinstance(config, dict) and (built := _as_loaded(config)) is not None and not prebuilt_mask_applies(built):
        kinds = list(getattr(built, "layer_types", None) or ())
        sliding = sum(t != "full_attention" for t in kinds)
        layers = f", {sliding} of its {len(kinds)} layers not full attention" if sliding else ""
        raise ConfigError(
            "invalid config value model.compile: the compiled layers need SDPA attention over full-attention layers "
            f"(config.json: attn_implementation={built._attn_implementation!r}{layers}); set model.compile=false"
        )


def _as_loaded(config: dict) -> Any:
    """The transformers config of a model of a compilable type that config.json ``config`` describes, its attention
    implementation the one it would load with (config.json's ``attn_implementation``, else SDPA); None when
    transformers does not build it from these values (its own load says why)."""
    from transformers import AutoConfig

    values = {k: v for k, v in config.items() if k != "model_type"}
    values["attn_implementation"] = config.get("attn_implementation") or "sdpa"
    try:
        return AutoConfig.for_model(config["model_type"], **values)
    except Exception:  # noqa: BLE001 - values transformers refuses: left to its load, which says so in one line
        return None


class CompiledLayers:
    """One compiled layer step for a model's decoder layers (and any model of the same shape: the reference).

    ``installed(model)`` makes every decoder layer of ``model`` call the step while the block runs. Copying (as the
    reference copies the policy) shares the step: its weights are arguments, not part of it. A call that would need a
    graph past dynamo's recompile limit runs the step eagerly (as dynamo itself would, saying so in its log only):
    ``fallbacks`` counts those calls (a run's ``applied.json``: ``compile_fallbacks``), and a warning says so once."""

    def __init__(self, model: nn.Module, backend: str = "inductor", mode: str = "default"):
        check_compilable(model)
        layers = decoder_layers(model)
        # the layer's structure only: every weight comes in as an argument, so it holds none (the meta device)
        self.template = copy.deepcopy(layers[0]).requires_grad_(False).to("meta").eval()
        attn: Any = block_part(self.template, "attn")
        attn.layer_idx = 0  # it only ever reads the one-layer cache it is given
        self.slots: dict[str, Tensor | None] = dict.fromkeys(FACTOR_PARTS)  # (filled: no guard on it being empty)
        for part in FACTOR_PARTS:
            sub = block_part(self.template, part)
            if sub is None:
                raise ConfigError(f"invalid config value model.compile: {type(layers[0]).__name__} has no {part}")
            for handle in list(sub._forward_hooks):
                del sub._forward_hooks[handle]  # a hook copied with the layer (none in a model at rest)
            sub.register_forward_hook(self._slot_hook(part))
        self._active: set[int] = set()  # the models (by id) whose layers run the step now
        self.fallbacks = 0  # the step's calls run eagerly: past dynamo's recompile limit
        self._anatomy: weakref.WeakKeyDictionary[nn.Module, tuple] = weakref.WeakKeyDictionary()
        inductor_mode = None if backend != "inductor" or mode == "default" else mode
        self.step: Callable[..., tuple[Tensor, Tensor, Tensor]] = torch.compile(
            self._step, dynamic=True, backend=backend, mode=inductor_mode
        )

    def __deepcopy__(self, memo: dict) -> CompiledLayers:
        return self

    def _slot_hook(self, part: str) -> Callable:
        def hook(module: nn.Module, args: Any, output: Any) -> Any:
            f = self.slots.get(part)
            return None if f is None else _scaled(output, f)

        return hook

    def _step(
        self,
        params: dict[str, Tensor],
        hidden: Tensor,
        past_k: Tensor | None,
        past_v: Tensor | None,
        mask: Tensor,
        cos: Tensor,
        sin: Tensor,
        *factors: Tensor | None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """One layer: its output, and its keys and values (past and new)."""
        for part, f in zip(FACTOR_PARTS, factors):
            self.slots[part] = f
        cache = OneLayerCache(0, past_k, past_v)
        kwargs = {"attention_mask": mask, "position_embeddings": (cos, sin), "cache": cache, "use_cache": True}
        out = torch.func.functional_call(self.template, params, (hidden,), kwargs)
        assert cache.keys is not None and cache.values is not None
        # contiguous: the first call's keys are a transposed view, and the next call's graph guards on the strides
        return out, cache.keys.contiguous(), cache.values.contiguous()

    def _layer_forward(self, layer: nn.Module, i: int, own: Callable) -> Callable:
        """Layer ``i``'s forward as a call of the step (``own``: its forward, for calls over another cache)."""
        if layer not in self._anatomy:  # walked once per layer (each forward call installs the step again)
            parts = [(part, block_part(layer, part)) for part in FACTOR_PARTS]
            others = [(name, m) for name, m in layer.named_modules() if name and all(m is not p for _, p in parts)]
            owners = [
                (f"{name}.{key}" if name else key, m, table)
                for name, m in layer.named_modules()
                for table in ("_parameters", "_buffers")
                for key in getattr(m, table)
            ]
            self._anatomy[layer] = (parts, others, owners)
        parts, others, owners = self._anatomy[layer]
        # every tensor the template lacks, read from its owner at each install (the weights may have been replaced)
        params = {full: getattr(m, table)[full.rsplit(".", 1)[-1]] for full, m, table in owners}
        frozen: dict[str, Tensor | None] = {}  # (the same, as no-grad calls take them: built at the first of them)

        def forward(
            hidden_states: Tensor,
            attention_mask: Tensor | None = None,
            position_ids: Tensor | None = None,
            cache: Any = None,
            use_cache: bool | None = False,
            position_embeddings: tuple[Tensor, Tensor] | None = None,
            **kwargs: Any,
        ) -> Tensor:
            cache = kwargs.pop("past_key_values", cache)  # transformers before 5.24 name it so
            # the layer's past: its layer of a DynamicCache, or a checkpointed layer region's one-layer cache
            stored = cache if isinstance(cache, OneLayerCache) else dynamic_layer(cache, i)
            if stored is None:
                return own(hidden_states, attention_mask, position_ids, cache, use_cache, position_embeddings, **kwargs)
            if attention_mask is None or position_embeddings is None:
                raise RuntimeError("model.compile: a layer was called without a 4-d attention mask or rotary tables")
            for name, m in others:
                if m._forward_hooks or m._forward_pre_hooks:
                    raise RuntimeError(f"model.compile: layer {i}'s {name} has a hook the compiled layers cannot apply")
            factors = [_factor_of(m, f"layer {i}'s {part}") for part, m in parts]
            for f in factors:
                if f is not None:
                    check_rows(f, hidden_states)
            empty = isinstance(stored, DynamicLayer) and not stored.is_initialized
            past = (None, None) if empty else (stored.keys, stored.values)
            tensors = [hidden_states, *past, attention_mask, *position_embeddings, *factors]
            # contiguous (a latent step's input is a view of the last position): the graphs guard on the strides
            tensors = [t if t is None or t.is_contiguous() else t.contiguous() for t in tensors]
            step_params = params
            if not torch.is_grad_enabled():  # one no-grad graph whether an input came from a graph or not (the
                tensors = [None if t is None else t.detach() for t in tensors]  # graphs guard on requires_grad)
                if not frozen:  # (theta_old's scoring then runs the reference's graphs)
                    frozen.update({k: _frozen(p) for k, p in params.items()})
                step_params = frozen
            out, keys, values = self._run_step(step_params, tensors)
            if isinstance(stored, DynamicLayer) and empty:
                stored.lazy_initialization(keys, values)
            stored.keys, stored.values = keys, values
            return out

        return forward

    def _run_step(self, params: dict[str, Tensor], tensors: list) -> tuple[Tensor, Tensor, Tensor]:
        """The compiled step; where dynamo would need a graph past its recompile limit, the same step run eagerly
        and counted (dynamo runs such a call eagerly itself, and says so only in its log, once). A call outside
        :meth:`installed` (a recomputed layer's, in backward) raises the recompile limit for itself: past a lower
        limit, dynamo would run the step eagerly from then on, for every call of the process."""
        low = torch._dynamo.config.recompile_limit < RECOMPILE_LIMIT
        raised = torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT) if low else nullcontext()
        try:
            with raised:
                return self.step(params, *tensors)
        except RECOMPILE_LIMIT_HIT:
            if not self.fallbacks:
                warnings.warn(
                    f"model.compile: dynamo reached its recompile limit ({torch._dynamo.config.recompile_limit} "
                    "graphs) for the compiled decoder layers; a call that needs another graph runs them eagerly "
                    "(the same values, slower), counted in applied.json's compile_fallbacks: raise "
                    "torch._dynamo.config.recompile_limit, or set model.compile=false",
                    RuntimeWarning,
                    stacklevel=2,
                )
            self.fallbacks += 1
        return self._step(params, *tensors)

    def is_installed(self, model: nn.Module) -> bool:
        return id(model) in self._active

    @contextmanager
    def installed(self, model: nn.Module) -> Iterator[None]:
        """Within the block, ``model``'s decoder layers run the step (their own ``forward`` restored on leaving), under
        dynamo's recompile limit raised to at least :data:`RECOMPILE_LIMIT` (dynamo reads it at each call that needs a
        graph; it is put back on leaving: it was raised for the whole process, every later ``torch.compile`` too;
        the step's calls after the block, a recomputation's in backward, raise it themselves: :meth:`_run_step`)."""
        if self.is_installed(model):
            raise RuntimeError("the compiled layers are installed on this model already")
        self._active.add(id(model))
        # (past the limit dynamo raises instead of running the call eagerly without a word: _run_step counts it)
        raises = bool(RECOMPILE_LIMIT_HIT) and not torch._dynamo.config.suppress_errors  # (the two are exclusive)
        # graphs per code object: with / without grad, past and factors, one / many positions, one / many rows
        # (dynamo's default of 8 could be reached within a run; past it, dynamo would fall back to eager silently)
        limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        limit_hit = torch._dynamo.config.patch(fail_on_recompile_limit_hit=raises, recompile_limit=limit)
        try:
            with layer_forwards(model, lambda layer, i: self._layer_forward(layer, i, layer.forward)), limit_hit:
                yield
        finally:
            self._active.discard(id(model))
