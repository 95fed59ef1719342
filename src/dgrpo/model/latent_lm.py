"""LatentLM: Coconut continuous thought on any Hugging Face causal LM, batched over one KV cache.

Sequence layout of one row (left padding, so every row's latents sit at the same columns)::

    [pad ...][question tokens][<|start-latent|>][h_1 ... h_T][<|end-latent|>][steps ... #### answer <eos>]

Continuous thought (Coconut, Hao et al. 2024): the last-layer hidden state at position t-1 (after the
final norm, i.e. what the LM head reads) is the input embedding at latent position t. We run the
question once, then one single-position forward per latent step over a ``DynamicCache``, then the
answer, so the work is O(T) forwards of one position instead of Coconut's T full re-forwards.
Gradients flow through every latent step: the cache holds the graph of every key and value.

Every forward goes through :meth:`LatentLM._call_base`, which tells an optional perturbation (the one given, else
the one whose ``with`` block is open over the model: :func:`open_perturbation`) which phase (``prompt`` /
``latent`` / ``answer``) is running; that is the single hook the dropout-GRPO perturbations use (see
:mod:`dgrpo.perturbation`).

The class also carries the Hugging Face conventions: ``from_pretrained`` (a directory, a hub id through
:mod:`dgrpo.model.sources`, a LoRA adapter directory through :mod:`dgrpo.model.lora`; the weights loaded strictly by
:mod:`dgrpo.model.hf_loading`) and ``save_pretrained``
(verified, atomic checkpoints: :mod:`dgrpo.model.verified`). The tokenizer's latent markers (their embedding rows,
the tokenizer's loading, padded batches of token ids) are in :mod:`dgrpo.model.tokens`; the head's log-probs, the
sampling of each answer token and its booking in :mod:`dgrpo.model.decoding`.
"""

from __future__ import annotations

import inspect
import json
import os
import typing
import weakref
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor, nn
from transformers import (
    DynamicCache,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    StaticCache,
)

from ..config import ConfigError, LatentTokenInit
from ..paths import expand_home
from ..run_layout import CHECKPOINTS_DIR, STEP_DIR
from .anatomy import (
    base_model,
    decoder_layers,
    float32_frequencies,
    float32_rotary_init,
    input_embedding_weight,
    restore_float32_frequencies,
)
from .attention_mask import additive_mask, causal_padding_mask, prebuilt_mask_applies, static_causal_padding_mask
from .compiled_layers import CompiledLayers, rows_mismatch
from .decoding import AnswerBook, DecodeState, Generation, check_decoding, check_uniforms, head_logprobs
from .head_stats import HeadStats
from .hf_loading import (
    check_saved_tokenizer,
    config_rows,
    hf_progress_bars_off,
    load_hf_model,
    loading_line,
    model_config,
    remote_code_hint,
)
from .kv_prefixes import saved_as_prefixes
from .output_head import logit_transform, output_head
from .recompute import checkpointed_layers, last_layers, recomputed_call, unrecomputable_cache_layers
from .sources import (
    hub_files,
    on_disk,
    resolve_checkpoint,
    resolve_model_source,
)
from .static_cache import static_cache
from .support import unsupported
from .tokens import (
    END_LATENT,
    LATENT,
    START_LATENT,
    add_latent_tokens,
    bos_prefix,
    check_hub_tokenizer,
    check_special_tokens,
    end_of_turn_ids,
    left_pad,
    load_tokenizer,
    right_pad,
    token_id,
)
from .verified import (
    ADAPTER_CONFIG_FILE,
    ADAPTER_WEIGHTS_FILE,
    LATENT_CONFIG_FILE,
    RESUMABLE_STATE,
    RUN_CONFIG_FILE,
    SAFETENSORS,
    SAFETENSORS_INDEX,
    SHARDED_DIR,
    CheckpointError,
    atomic_dir,
    check_intact,
    check_state_dict,
    enclosing_checkpoint,
    holds_weights,
    one_line,
    read_json_object,
    read_weights,
)

#: the files a model checkpoint directory must hold (``a|b``: either)
MODEL_FILES = ("config.json", f"{SAFETENSORS}|{SAFETENSORS_INDEX}", LATENT_CONFIG_FILE, "tokenizer_config.json")
#: the ways a checkpoint prompts (LatentSettings.mode)
LATENT_MODES = ("coconut", "pause", "cot", "no_cot", "plain")
#: the files a LoRA adapter checkpoint directory must hold (the base model lives where adapter_config.json says)
ADAPTER_FILES = (ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE, LATENT_CONFIG_FILE, "tokenizer_config.json")


@dataclass
class LatentSettings:
    """How a checkpoint reasons; saved next to the weights as ``latent_config.json``.

    ``mode``: ``coconut`` (continuous thought), ``pause`` (``<|latent|>`` pause tokens, no recurrence),
    ``cot`` / ``no_cot`` (no latents; written steps or answer only), ``plain`` (a plain causal LM
    prompted without latent markers). ``chat_template``: questions are wrapped in the tokenizer's chat
    template (instruction-tuned backbones) before the latent markers. ``markers``: False for a checkpoint trained
    without ``<|start-latent|>`` / ``<|end-latent|>`` (Coconut's own CoT and no-CoT runs, ``no_special_marker``):
    it is evaluated on the question alone; dgrpo's trainers prompt with them and set it.
    """

    mode: str = "coconut"
    c_thought: int = 1
    stage: int = 0
    n_latent: int = 0
    chat_template: bool = False
    markers: bool = True

    def __post_init__(self) -> None:
        # A hand-edited latent_config.json is read here: "false" would be a true marker flag, 1.5 a latent count
        if self.mode not in LATENT_MODES:
            raise ValueError(f"latent settings: mode {self.mode!r} is not one of {', '.join(LATENT_MODES)}")
        for name in ("c_thought", "stage", "n_latent"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < (1 if name == "c_thought" else 0):
                least = "a positive" if name == "c_thought" else "a non-negative"
                raise ValueError(f"latent settings: {name} must be {least} integer, not {value!r}")
        for name in ("chat_template", "markers"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"latent settings: {name} must be true or false, not {getattr(self, name)!r}")

    def to_json(self) -> str:
        """The settings as ``latent_config.json`` holds them."""
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_dict(cls, d: dict) -> LatentSettings:
        """Settings from a ``latent_config.json``'s dict; keys this version does not know are dropped."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


class PhaseHook(Protocol):
    """What LatentLM calls before every forward; implemented by the perturbations."""

    def before_forward(self, phase: str) -> None: ...


#: per model (the module a LatentLM wraps), the bound perturbations whose ``with`` blocks are open over it, innermost
#: last: :class:`dgrpo.perturbation.BoundPerturbation` enters itself here when its kind's ``bind`` names the model
OPEN_PERTURBATIONS: weakref.WeakKeyDictionary[nn.Module, list[PhaseHook]] = weakref.WeakKeyDictionary()


def open_perturbation(model: nn.Module) -> PhaseHook | None:
    """The innermost bound perturbation whose ``with`` block is open over ``model`` (None: none is): what a forward
    given no ``perturbation=`` runs under, so that inside ``with pert.bind(lm, seeds):`` it is perturbed as one given
    it (the same phases; native dropout's switches and reseeding: two identical calls there answered differently)."""
    opened = OPEN_PERTURBATIONS.get(model)
    return opened[-1] if opened else None


def _check_texts(what: str, name: str, texts: Any) -> None:
    """A non-empty list of strings (one string, an empty list or a None among them failed later, unclearly)."""
    if isinstance(texts, str):
        raise TypeError(f"{what} takes a list of {name}; got one string (wrap it: [text])")
    if len(texts) == 0:
        raise ValueError(f"{what}: no {name} (an empty list); give at least one")
    bad = [t for t in texts if not isinstance(t, str)]
    if bad:
        raise TypeError(f"{what}: {name} must be strings, got {type(bad[0]).__name__}")


def check_prompt(prompt_ids: Tensor, prompt_mask: Tensor) -> None:
    """Prompt ids and mask as :meth:`LatentLM.encode_questions` gives them: [batch, length] tensors both."""
    for name, t in (("prompt ids", prompt_ids), ("prompt mask", prompt_mask)):
        if not isinstance(t, Tensor):
            raise TypeError(
                f"{name} must be a torch tensor, got {type(t).__name__} (encode the questions with "
                "ids, mask = lm.encode_questions(questions))"
            )
    if prompt_ids.dim() != 2:
        raise ValueError(
            f"prompt ids must be [batch, length] (encode_questions' output), got shape {tuple(prompt_ids.shape)}"
        )
    if prompt_mask.shape != prompt_ids.shape:
        raise ValueError(
            f"prompt ids {tuple(prompt_ids.shape)} and mask {tuple(prompt_mask.shape)} differ in shape: pass the "
            "mask encode_questions gave with them"
        )


def check_phase_hook(perturbation: object) -> None:
    """A perturbation handed to a forward must be bound and active: ``with pert.bind(lm, seeds) as p:`` and ``p``
    passed inside the block. An unbound :class:`~dgrpo.perturbation.Perturbation` failed deep inside; a bound one
    not entered, or used after its block, ran the unperturbed network without a word."""
    if perturbation is None:
        return
    how = "with pert.bind(lm, seeds) as p: lm.generate(..., perturbation=p)"
    if not callable(getattr(perturbation, "before_forward", None)):
        raise TypeError(f"perturbation: {type(perturbation).__name__} is not bound to a batch ({how})")
    if getattr(perturbation, "depth", None) == 0:
        raise RuntimeError(
            f"perturbation: the bound perturbation is not active, so it would change nothing ({how}; a "
            "BoundPerturbation of your own that overrides __enter__/__exit__ must call super()'s, or put its set-up "
            "in _install/_uninstall)"
        )


def check_stepwise(perturbation: object, stepwise: bool) -> None:
    """A perturbation whose noise is drawn per forward call (its ``needs_stepwise``: native dropout on the answer)
    replays only when the targets are scored one token per forward, as they were decoded: in one forward they were
    scored under other masks, without a word (log-probs ~0.3 away)."""
    if not stepwise and getattr(perturbation, "needs_stepwise", False):
        raise ValueError(
            f"perturbation: {type(perturbation).__name__} draws its noise per forward call; score the targets as they "
            "were decoded, one token per forward: pass stepwise=True"
        )


_CACHE_KEYWORDS: dict[type, str] = {}


def static_length(cache: StaticCache) -> int:
    """The positions a static cache holds (its first layer's; every full-attention layer holds as many)."""
    layer = cache.layers[0]
    held = getattr(layer, "max_cache_len", None)  # (a static layer's, since the cache layers came in)
    return int(held if held is not None else layer.get_max_length())


def cache_keyword(decoder_type: type[nn.Module]) -> str:
    """The keyword a decoder's ``forward`` takes its KV cache by: ``cache`` from transformers 5.24 on (where
    ``past_key_values`` is deprecated, to be removed in 5.40), ``past_key_values`` before."""
    if decoder_type not in _CACHE_KEYWORDS:
        params = inspect.signature(decoder_type.forward).parameters
        _CACHE_KEYWORDS[decoder_type] = "cache" if "cache" in params else "past_key_values"
    return _CACHE_KEYWORDS[decoder_type]


def _check_loadable(
    local: Path, path: str, hub: bool, adapter: bool, trust_remote_code: bool, local_files_only: bool
) -> None:
    """:meth:`LatentLM.from_pretrained`'s checks of the files at ``local`` (a directory, or a hub id's snapshot of its
    small files) before anything loads: no FSDP shards in place of weights, a directory intact against its manifest,
    a hub snapshot's tokenizer there. Each failure is one :class:`CheckpointError` line."""
    for shards in (local, local.parent) if not holds_weights(local) else ():  # (a resumable checkpoint: beside model/)
        if (shards / SHARDED_DIR).is_dir():
            raise CheckpointError(f"{shards} holds FSDP shards (fsdp: sharded): dgrpo consolidate {shards} first")
    if not hub:  # (a hub snapshot lacks the weights until from_pretrained fetches them: the hub checks its files)
        check_intact(local, ADAPTER_FILES if adapter else MODEL_FILES)
    if hub and (adapter or not trust_remote_code):  # (its tokenizer is read from the snapshot, as a directory's)
        check_hub_tokenizer(path, local, local_files_only)


def _check_before_weights(
    local: Path, path: str, tok: PreTrainedTokenizerBase, check_config: Callable[[dict], None] | None
) -> int | None:
    """:meth:`LatentLM.from_pretrained`'s checks of what ``local``'s config.json and tokenizer tell, before the weights
    load (minutes for a large model; they were made once it had loaded): the tokenizer dgrpo saved (``local`` holds
    its latent settings) against the embedding rows config.json gives, and ``check_config``. Returns those rows
    (None: config.json does not say; the tokenizer is then checked against the model loaded). A tokenizer without an
    EOS token is refused too (:func:`check_eos`)."""
    check_eos(path, tok)
    config = model_config(str(local), None, True)
    rows = config_rows(config)
    if (local / LATENT_CONFIG_FILE).is_file():  # (dgrpo wrote it: its tokenizer holds the markers' trained rows)
        check_saved_tokenizer(path, tok, rows)
    if check_config is not None and config is not None:
        check_config(config)
    return rows


def check_eos(where: str, tok: PreTrainedTokenizerBase) -> None:
    """The model at ``where`` refused before its weights load when its tokenizer has no EOS token, as
    :class:`LatentLM` would refuse it once loaded (:func:`~.tokens.check_special_tokens`): one CheckpointError line."""
    try:
        check_special_tokens(tok, where)
    except ValueError as e:  # (its own line, not one_line's "ValueError: " before it)
        raise CheckpointError(f"cannot load the model {where}: {e}") from None


def read_latent_files(folder: Path) -> tuple[LatentSettings, dict | None]:
    """``latent_config.json`` (default settings when absent: a plain hub model) and ``run_config.json`` (or None)."""
    settings = LatentSettings()
    if (folder / LATENT_CONFIG_FILE).is_file():
        raw = read_json_object(folder / LATENT_CONFIG_FILE)
        try:
            settings = LatentSettings.from_dict(raw)
        except ValueError as e:
            raise CheckpointError(f"{folder / LATENT_CONFIG_FILE} is not valid: {e}") from None
    run = folder / RUN_CONFIG_FILE
    return settings, (read_json_object(run) if run.is_file() else None)


class KeptDecoders(dict[str, tuple[tuple, Any]]):
    """The fast engine's kept decoders of a model, by purpose: (key, decoder); ``seen``: by purpose, the key of the
    last batch that found none to fit (some are kept only once a key repeats); ``failed_captures``: the purposes
    whose CUDA graph capture failed in this process, run uncaptured from then on (a failed capture may keep the
    memory of its graph's pool: one, not one per shape). A copy of the model starts without them (their buffers and
    CUDA graphs belong to the original's weights, and graphs cannot be copied)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[str, tuple] = {}
        self.failed_captures: set[str] = set()

    def __deepcopy__(self, memo: dict) -> KeptDecoders:
        return KeptDecoders()

    def clear(self) -> None:
        super().clear()
        self.seen.clear()


class LatentLM(nn.Module):
    """A causal LM plus the Coconut latent recurrence, batched generation and teacher-forced scoring."""

    #: scoring computes fp32 logits in chunks of at most this many elements (B x positions x vocab); with
    #: grad, each chunk's logits are recomputed in backward instead of kept (a 151k vocabulary would
    #: otherwise hold GBs of logits per micro-batch; 2^28 fp32 logits: 1 GiB per chunk)
    logit_chunk_elems: int = 1 << 28

    # where the model came from and what it is for (set by from_pretrained and the trainers; per instance when set)
    run_config: dict | None = None  # the training config that produced this model (run_config.json)
    name_or_path: str | None = None  # where the weights came from (a directory or hub id; None: built here)
    revision: str | None = None  # the hub commit name_or_path was loaded at (None: a directory)
    #: what from_pretrained loaded: the checkpoint directory (absolute; an adapter's own, not its base) or the hub id
    #: (None: built here); a run's config names it as model.name_or_path (dgrpo.training.model_record)
    loaded_from: str | None = None
    #: built by dgrpo.model.factory.build_builtin from model.* (the built-in tiny model, whose shape a run's config
    #: records); a model built or wrapped in Python (LatentLM(model, tokenizer)) is not
    builtin: bool = False
    #: the hub commit of the repository this model was loaded from (an adapter's own, not its base's; None: a
    #: directory, or built here)
    hub_commit: str | None = None
    #: the run directory of a training run that stopped mid-way (an exception, Ctrl-C) with these weights: the
    #: next run must resume a checkpoint, which replaces them (dgrpo.training.run_inputs.check_restart)
    stopped_run: str | None = None

    # how the update runs (set by the trainers from their configs)
    #: activation recomputation (dgrpo.model.recompute) under grad: False (off), "call" (each forward call of the
    #: recurrence keeps only its inputs and runs again in backward; True means the same) or "layer" (each decoder
    #: layer of each call does); grpo.recompute / sft.recompute and their *_granularity
    recompute: bool | str = False
    #: with ``recompute``: whether the latent steps' calls are recomputed too, or keep their activations (one
    #: position per row: little memory, and a whole decoder stack's forward less per latent step in backward);
    #: grpo.recompute_latent_steps / sft.recompute_latent_steps
    recompute_latent_steps: bool = True
    #: with ``recompute == "layer"``: how many of the last decoder layers keep their activations instead (no
    #: second forward for them); grpo.recompute_kept_layers / sft.recompute_kept_layers
    recompute_kept_layers: int = 0
    #: under grad, the latent steps keep each layer's keys and values once for backward, as prefixes of the last
    #: step's (dgrpo.model.kv_prefixes), instead of once per step; False: as attention (or a recomputed region)
    #: saves them (the bench's other arm: the same gradients, bit for bit)
    save_kv_once: bool = True
    #: the decoder layers' compiled step (``model.compile``; dgrpo.model.compiled_layers), or None: eager layers.
    #: It runs teacher-forced scoring over a growing ``DynamicCache`` (SFT, the update, theta_old, the reference)
    compiled_layers: CompiledLayers | None = None
    _scoring = False  # within target_logprobs: the compiled layers run (on CPU they slow generation)

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        settings: LatentSettings | None = None,
        *,
        latent_token_init: LatentTokenInit = "mean",
    ):
        """Wrap ``model`` and ``tokenizer`` as they are, not copies: the latent markers are added to both when they
        lack them (the embedding grows), and the tokenizer pads on the left from here on. ``latent_token_init``: how
        the markers' rows start when ``model`` lacks them (``model.latent_token_init``: mean, or coconut)."""
        super().__init__()
        if not isinstance(model, nn.Module) or not hasattr(model, "get_input_embeddings"):
            how = "; load a checkpoint with LatentLM.from_pretrained(path)" if isinstance(model, (str, Path)) else ""
            raise TypeError(f"LatentLM: model must be a Hugging Face causal LM, got {type(model).__name__}{how}")
        if not (hasattr(tokenizer, "eos_token_id") and callable(tokenizer)):
            raise TypeError(
                f"LatentLM: tokenizer must be the model's Hugging Face tokenizer, got {type(tokenizer).__name__}"
            )
        check_special_tokens(tokenizer)
        if (why := unsupported(getattr(model, "config", None))) is not None:
            raise ConfigError(f"LatentLM: {why}")
        if latent_token_init not in typing.get_args(LatentTokenInit):
            raise ValueError(f"latent_token_init must be mean or coconut, got {latent_token_init!r}")
        #: the latent markers this model did not have (a plain LM): their embeddings are new, untrained
        self.new_latent_tokens = add_latent_tokens(model, tokenizer, latent_token_init)
        float32_rotary_init(model)  # (a model cast to bf16 before it came here: as from_pretrained would load it)
        self.model = model
        self.tokenizer = tokenizer
        self.training = model.training  # the wrapper's mode is the model's (transformers loads in eval mode)
        self.settings = settings or LatentSettings()
        #: what the model's forward does to its head's logits (softcapping, scaling), applied by every dgrpo use
        self.logit_transform = logit_transform(model.config)
        tokenizer.padding_side = "left"
        self.start_id = token_id(tokenizer, START_LATENT)
        self.latent_id = token_id(tokenizer, LATENT)
        self.end_id = token_id(tokenizer, END_LATENT)
        self.eos_id = tokenizer.eos_token_id
        #: the other tokens that end an answer, as ``generate`` would end it (:func:`~.tokens.end_of_turn_ids`)
        self.stop_ids = end_of_turn_ids(model, self.eos_id)
        self.pad_id = tokenizer.pad_token_id
        #: what the tokenizer puts before a text of its own (Llama, Mistral, Gemma: BOS; Qwen, GPT-2: nothing), put
        #: before every question as Coconut's dataset.py and Hugging Face's generate do
        self.question_prefix = bos_prefix(tokenizer)
        self.peft: Any = None  # PEFT's wrapper when LoRA adapters are on (dgrpo.model.lora), not a sub-module
        #: the fast engine's decoders kept from one batch to the next, by purpose (dgrpo.model.fixed_shape)
        self.kept_decoders = KeptDecoders()
        #: the head's log-probs and entropies over the vocabulary, eager or compiled (``model.compile_head``;
        #: dgrpo.model.head_stats)
        self.head_stats = HeadStats()

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> LatentLM:
        """``nn.Module._apply`` (what ``to``, ``bfloat16``, ``cuda`` run), except that the rotary position
        frequencies stay float32, as ``from_pretrained`` loads them in any dtype: a model cast to bfloat16 (the
        built-in model of a bf16 run) rotated positions by bf16-rounded frequencies, and its saved checkpoint,
        reloaded, computed other log-probs and greedy answers than it had."""
        kept = float32_frequencies(self.model) if "model" in self._modules else {}
        super()._apply(fn, recurse)
        restore_float32_frequencies(self.model, kept)
        return self

    # ------------------------------------------------------------------ loading / saving
    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        *,
        dtype: torch.dtype | None = None,
        device: str | torch.device | None = None,
        trust_remote_code: bool = False,
        local_files_only: bool = False,
        latent_token_init: LatentTokenInit = "mean",
        revision: str | None = None,
        announce: Callable[[str], None] | None = None,
        check_config: Callable[[dict], None] | None = None,
    ) -> LatentLM:
        """Load a checkpoint directory (or a hub id, at ``revision``: a branch, tag or commit; a directory ignores
        it): weights from safetensors only, every tensor present with its shape (a directory dgrpo wrote is first
        verified against its manifest, its tokenizer against config.json's rows). A LoRA adapter directory loads its
        base model (``adapter_config.json`` names it, and the revision) with the adapter on top. Any problem is one
        :class:`CheckpointError` line. ``latent_token_init``: how a base model's new latent markers start (mean, or
        coconut: copies of ``<<``'s rows). ``announce``: called with one line just before the weights load
        (:func:`~.hf_loading.loading_line`), as the commands print it. ``check_config``: called with the config.json
        (a dict) of the model whose weights load (an adapter's base's) before they load, to refuse it then."""
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"LatentLM.from_pretrained: path is a checkpoint directory or a hub id, got {path!r}")
        given = str(path)
        local, hub = on_disk(path), False
        # a run directory means its final/; a missing path is one line (not the hub's "Repo id must be" error)
        if local.exists() or str(path).startswith(("/", ".", "~")):
            local = resolve_checkpoint(local)
            path, revision = str(local.resolve()), None
        else:  # a hub id (or a relative path shaped like one): as the command line resolves it
            # its small files (latent settings, run config, tokenizer, adapter): read as a directory's would be
            (local, local_files_only), hub = hub_files(str(path), revision, local_files_only), True
            revision = local.name  # the commit they are from: the weights come from the same one
        adapter = (local / ADAPTER_CONFIG_FILE).is_file()
        _check_loadable(local, str(path), hub, adapter, trust_remote_code, local_files_only)
        if adapter:
            lm = cls._from_adapter_dir(local, dtype, device, trust_remote_code, given, announce, check_config)
            lm.hub_commit, lm.loaded_from = (local.name if hub else None), str(path)
            return lm
        try:
            # custom tokenizer code is not among the snapshot's files: transformers fetches it with the hub id
            tok_from, tok_at = (str(path), revision) if hub and trust_remote_code else (str(local), None)
            tok = load_tokenizer(tok_from, trust_remote_code, local_files_only, tok_at)
            settings, run_config = read_latent_files(local)
        except CheckpointError:
            raise
        except Exception as e:  # noqa: BLE001 - a damaged directory fails in many ways; each is one line for the user
            raise CheckpointError(f"cannot load the model {path}: {one_line(e)}{remote_code_hint(e)}") from None
        rows = _check_before_weights(local, str(path), tok, check_config)
        if announce is not None:
            announce(loading_line(given, str(path), local_files_only, revision))
        model = load_hf_model(str(path), dtype, trust_remote_code, local_files_only, revision)
        if rows is None and (local / LATENT_CONFIG_FILE).is_file():  # (config.json did not say the rows)
            check_saved_tokenizer(str(path), tok, input_embedding_weight(model).shape[0])
        lm = cls._built(model, tok, settings, str(path), latent_token_init)
        lm.run_config, lm.name_or_path, lm.loaded_from = run_config, str(path), str(path)
        lm.revision = lm.hub_commit = revision  # (None for a directory)
        if device is not None:
            lm.to(device)
        return lm.eval()  # as transformers' from_pretrained: training code turns train mode on

    @classmethod
    def _from_adapter_dir(
        cls,
        folder: Path,
        dtype: torch.dtype | None,
        device: str | torch.device | None,
        trust_remote_code: bool,
        given: str,
        announce: Callable[[str], None] | None,
        check_config: Callable[[dict], None] | None = None,
    ) -> LatentLM:
        """The base model an adapter directory names, with the directory's tokenizer, settings and adapter
        (``given``: the name the adapter was given by; ``announce`` and ``check_config``, of the base: as
        :meth:`from_pretrained`'s)."""
        from . import lora

        named, revision = lora.adapter_base(folder), lora.adapter_base_revision(folder)
        try:
            base, local_only = resolve_model_source(named, revision)
        except CheckpointError as e:  # the base moved or is not at hand: say it is the adapter's base
            raise CheckpointError(
                f"LoRA adapter {folder}: its base model cannot be loaded ({e}); if the base moved, "
                f"{lora.repoint_hint(folder)}"
            ) from None
        if lora.is_adapter_dir(Path(base)):
            raise CheckpointError(f"{folder}: its base model {base} is itself an adapter directory")
        if Path(base).is_dir():  # its weights as its manifest lists them: the fingerprint below reads the manifest
            check_intact(Path(base))
        lora.check_base(folder, base)
        try:
            tok = load_tokenizer(str(folder), trust_remote_code=trust_remote_code)
            settings, run_config = read_latent_files(folder)
        except Exception as e:  # noqa: BLE001
            why = f"{one_line(e)}{remote_code_hint(e)}"
            raise CheckpointError(f"cannot load the adapter checkpoint {folder}: {why}") from None
        if (folder / LATENT_CONFIG_FILE).is_file():  # (dgrpo wrote it; the base may lack the markers' rows)
            check_saved_tokenizer(str(folder), tok, None)
        check_eos(str(folder), tok)
        if check_config is not None and (config := model_config(base, revision, local_only)) is not None:
            check_config(config)
        if announce is not None:
            announce(loading_line(given, base, local_only, revision, adapter=True))
        model = load_hf_model(base, dtype, trust_remote_code, local_only, revision)
        lm = cls._built(model, tok, settings, str(folder))
        lm.run_config, lm.name_or_path, lm.revision = run_config, base, revision
        lora.attach_saved_adapter(lm, folder)
        if device is not None:
            lm.to(device)
        return lm.eval()

    @classmethod
    def _built(
        cls,
        model: PreTrainedModel,
        tok: PreTrainedTokenizerBase,
        settings: LatentSettings,
        where: str,
        latent_token_init: LatentTokenInit = "mean",
    ) -> LatentLM:
        """``cls(model, tok, settings)`` for a loaded checkpoint: what it refuses is a one-line CheckpointError."""
        try:
            return cls(model, tok, settings, latent_token_init=latent_token_init)
        except ValueError as e:
            raise CheckpointError(f"cannot load the model {where}: {one_line(e)}") from None

    def _save_target(self, path: str | Path) -> Path:
        """The directory :meth:`save_pretrained` writes (``~`` expanded, absolute), refused in one line before
        anything is written when replacing it would destroy what must be kept: a resumable training checkpoint
        (``checkpoints/step-N`` or its ``model/``: its optimizer and RNG state, verified as a whole), or the local
        base model this model's LoRA adapter needs (the adapter would name, as its base, the directory it had just
        replaced); nor a folder inside a checkpoint dgrpo wrote (outside its manifest, deleted by a run's ``--resume
        never``)."""
        final = expand_home(path).resolve()
        for ckpt in (final, final.parent):  # the checkpoint, or the model/ it holds
            named_so = ckpt.parent.name == CHECKPOINTS_DIR and STEP_DIR.fullmatch(ckpt.name)
            if (ckpt / RESUMABLE_STATE).is_file() or named_so:
                raise CheckpointError(
                    f"{ckpt} is (or would read as) a resumable training checkpoint of its run: save_pretrained does "
                    "not write into it; name a new directory"
                )
        around = enclosing_checkpoint(final)
        if around is not None:
            raise CheckpointError(
                f"{final} lies inside {around}, a checkpoint dgrpo wrote: a model saved there would sit outside its "
                "manifest; name a directory outside it"
            )
        from .lora import base_directory

        base = base_directory(self)
        if base is not None and (final == base.resolve() or final in base.resolve().parents):
            raise CheckpointError(
                f"{final} holds the base model of this LoRA adapter ({base}): saving the adapter there would delete "
                "the weights it adapts; name another directory"
            )
        return final

    def save_pretrained(
        self,
        path: str | Path,
        *,
        state_dict: dict[str, Tensor] | None = None,
        weights: bool = True,
        extra: Callable[[Path], None] | None = None,
    ) -> None:
        """Write a checkpoint directory, atomically and with a sha256 manifest (``verified.atomic_dir``): safetensors
        weights (``state_dict`` when given, e.g. gathered from FSDP shards; none with ``weights=False``),
        the model config, the tokenizer, ``latent_config.json`` and, when set, ``run_config.json`` (the training
        config that produced it: ``dgrpo eval`` rebuilds the run's task from it). Under LoRA the policy adapter in
        PEFT's format instead of the weights. ``extra(tmp_dir)`` may add files before the directory is published.
        The one place a model directory is written. Never over a resumable training checkpoint, the base of this
        model's adapter, or a directory with files its manifest does not list (:meth:`_save_target`,
        ``verified.check_replaceable``)."""
        with atomic_dir(self._save_target(path)) as tmp, hf_progress_bars_off():
            if self.peft is not None:  # LoRA: the policy adapter only, in PEFT's format (it names the base model)
                from .lora import save_adapter

                save_adapter(self, tmp)
            elif weights:
                self.model.save_pretrained(tmp, state_dict=self._untied(state_dict), safe_serialization=True)
            else:  # (config.json as the weights' save writes it, so that consolidating the shards leaves it alone)
                config = self.model.config
                config.dtype = str(self.model.dtype).removeprefix("torch.")
                config.architectures = [type(self.model).__name__.removeprefix("FSDP")]
                config.save_pretrained(tmp)
            self.tokenizer.save_pretrained(tmp)
            (tmp / LATENT_CONFIG_FILE).write_text(self.settings.to_json())
            if self.run_config is not None:
                (tmp / RUN_CONFIG_FILE).write_text(json.dumps(self.run_config, indent=2))
            if extra is not None:
                extra(tmp)

    def _untied(self, state_dict: dict[str, Tensor] | None) -> dict[str, Tensor] | None:
        """``state_dict`` without the second name of a tied weight (Qwen2.5-1.5B's ``lm_head.weight``, the input
        embedding): a gathered (FSDP) state holds a copy under each name, which Hugging Face then saved twice, as
        the model's own state dict (one storage) is not; loading ties them again."""
        if state_dict is None:
            return None
        first: dict[int, str] = {}
        tied = {n for n, p in self.model.named_parameters(remove_duplicate=False) if first.setdefault(id(p), n) != n}
        return {k: v for k, v in state_dict.items() if k not in tied}

    @property
    def checkpoint_files(self) -> tuple[str, ...]:
        """The files :meth:`save_pretrained` writes for this model (the manifest must list them)."""
        return ADAPTER_FILES if self.peft is not None else MODEL_FILES

    def read_weights_dir(self, folder: Path) -> dict[str, Tensor]:
        """The weights (under LoRA: the adapter) of a directory this model saved, checked to fit it exactly."""
        if self.peft is not None:
            from .lora import read_adapter

            return read_adapter(self, folder)
        state = read_weights(folder)
        check_state_dict(self.model, state, "model")
        return state

    def load_weights(self, state: dict[str, Tensor]) -> None:
        """Put weights from :meth:`read_weights_dir` in place."""
        if self.peft is not None:
            from .lora import load_adapter_state

            load_adapter_state(self, state)
        else:
            self.model.load_state_dict(state, strict=False)  # complete: checked by read_weights_dir

    @property
    def context_length(self) -> int | None:
        """The longest sequence the model was built for (None when its config does not say)."""
        cfg = self.model.config
        for name in ("max_position_embeddings", "n_positions", "max_sequence_length"):
            value = getattr(cfg, name, None)
            if isinstance(value, int) and value > 0:
                return value
        return None

    def check_fits(
        self,
        prompt_tokens: int,
        n_latent: int,
        answer_tokens: int,
        key: str = "n_latent",
        *,
        markers: bool = True,
        target_key: str = "",
        answer_key: str = "",
        data_key: str = "",
        prompt_key: str | None = None,
    ) -> None:
        """ConfigError (one line) when the sequence :meth:`generate` builds exceeds the model's context: a sequence
        that long would run for minutes and then read positions the model was never trained on.

        ``prompt_tokens`` is the prompt's width as :meth:`encode_questions` gives it (``<|start-latent|>`` included
        when ``markers``); then come ``n_latent`` thoughts, ``<|end-latent|>`` when ``markers``, and
        ``answer_tokens``. ``key`` is the option that set ``n_latent`` (``eval.n_latent``): its section names the
        answer's ``max_new_tokens``; ``prompt_key`` the option that shortens the prompt (None:
        ``data.max_question_tokens``; a plain LM's k-shot prompt: ``eval.shots``, or "" for none); ``target_key``
        (SFT: ``data.max_target_tokens``) says that the answer is a written target of ``answer_tokens`` tokens that
        this option bounds; ``answer_key`` names the option of a generated answer's length when it is not in
        ``key``'s section (SFT's validation: ``eval.max_new_tokens``); ``data_key`` an option that makes the data
        itself shorter (the built-in task's ``task.n_steps``). The message states every part and the options that
        shorten the sequence."""
        total, limit = prompt_tokens + n_latent + int(markers) + answer_tokens, self.context_length
        if limit is None or total <= limit:
            return
        section = key.rpartition(".")[0]
        opt = f"{section}." if section else ""
        answer_key = answer_key or f"{opt}max_new_tokens"
        n_question = prompt_tokens - int(markers)
        parts = [f"{'question' if markers else 'prompt'} ({n_question} token{'' if n_question == 1 else 's'})"]
        unprompted = n_question == 0 and markers  # (a start's check, before any question: the rest alone is too long)
        if unprompted:
            parts = []
        if n_latent or markers:
            parts.append(f"{n_latent} latent thought{'' if n_latent == 1 else 's'}")
        parts += ["2 markers"] if markers else []
        parts.append(
            f"target ({answer_tokens} token{'' if answer_tokens == 1 else 's'})"
            if target_key
            else f"answer ({answer_key} = {answer_tokens})"
        )
        lower = ([key] if n_latent else []) + [target_key or answer_key]
        prompt_key = "data.max_question_tokens" if prompt_key is None else prompt_key
        if not unprompted and prompt_key:
            lower.append(prompt_key)
        lower += [data_key] if data_key else []
        raise ConfigError(
            f"{section + ': ' if section else ''}the sequence does not fit the model's context of {limit} positions"
            f"{' even without a question' if unprompted else ''}: {' + '.join(parts)} = {total}; lower "
            f"{', '.join(lower[:-1]) + ' or ' if len(lower) > 1 else ''}{lower[-1]}"
        )

    def use_recompute(self, section: Any, key: str) -> None:
        """Set the recomputation of the update's (or SFT's) replay from a config section (``grpo``/``sft``: its
        recompute, recompute_granularity, recompute_latent_steps and recompute_kept_layers), checked against this
        model's depth."""
        if section.recompute and (kinds := unrecomputable_cache_layers(self.model.config)):
            raise ConfigError(
                f"{key}.recompute: this model's KV cache has {', '.join(kinds)} layers (sliding-window attention), "
                f"which recomputation cannot restore; set {key}.recompute=false"
            )
        self.recompute = section.recompute_granularity if section.recompute else False
        self.recompute_latent_steps = section.recompute_latent_steps
        try:  # (the check each recomputed call makes, once and as a config error)
            last_layers(len(decoder_layers(self.model)), section.recompute_kept_layers)
        except ValueError as e:
            raise ConfigError(f"{key}.recompute_kept_layers: {e}") from None
        self.recompute_kept_layers = section.recompute_kept_layers

    @property
    def device(self) -> torch.device:
        """The device of the weights (of the input embedding): where :meth:`encode_questions` puts its tensors."""
        return input_embedding_weight(self.model).device

    @property
    def base(self) -> nn.Module:
        """The decoder stack under the LM head (:func:`~dgrpo.model.anatomy.base_model`: ``model.model`` of Qwen2 /
        Llama, ``transformer`` of GPT-2)."""
        return base_model(self.model)

    def embed(self, ids: Tensor) -> Tensor:
        """The input embeddings of token ids [B, L] -> [B, L, H]."""
        return self.model.get_input_embeddings()(ids)

    def logits(self, hidden: Tensor) -> Tensor:
        """The next-token logits of last-layer hidden states, as the model's own forward computes them."""
        return output_head(self.model, self.logit_transform)(hidden)

    # ------------------------------------------------------------------ tokenization
    def encode_questions(
        self, questions: list[str], *, markers: bool = True, max_tokens: int | None = None
    ) -> tuple[Tensor, Tensor]:
        """Left-padded ``[BOS] question \\n [<|start-latent|>]`` ids and mask, [B, P] (BOS where the tokenizer starts
        its texts with it: :func:`bos_prefix`; the question in the chat template when ``settings.chat_template``).
        Each distinct question is tokenized once (a GRPO step's K copies of a prompt: 512 rows, 16 questions).
        ``max_tokens``: keep each question's last ``max_tokens`` tokens (None or 0: all; BOS is kept before them, and
        a chat template around them: :meth:`_chat_cut`)."""
        _check_texts("encode_questions", "questions", questions)
        if max_tokens is not None and max_tokens < 0:
            raise ValueError(f"encode_questions: max_tokens must be >= 0 (0: no truncation), got {max_tokens}")
        distinct = list(dict.fromkeys(questions))
        prefix = [] if self.settings.chat_template else self.question_prefix  # (a chat template writes its BOS)
        texts = self._chat_cut(distinct, max_tokens)[0] if self.settings.chat_template else distinct
        encoded: dict[str, list[int]] = {}
        for q, ids in zip(distinct, self.token_ids([self.format_question(t) for t in texts])):
            if max_tokens is not None and len(ids) > max_tokens and not self.settings.chat_template:
                ids = ids[-max_tokens:]
            encoded[q] = prefix + ids + ([self.start_id] if markers else [])
        return left_pad([encoded[q] for q in questions], self.pad_id, self.device)

    def _chat_cut(self, questions: list[str], max_tokens: int | None) -> tuple[list[str], int]:
        """Under a chat template, each question as the template wraps it: a question of more than ``max_tokens``
        tokens as the text of its last ``max_tokens`` (the template itself is not cut: its BOS, system prompt and the
        user turn's header stay); and how many were cut."""
        if not max_tokens:
            return questions, 0
        own = self.token_ids(questions)
        texts = [
            str(self.tokenizer.decode(ids[-max_tokens:])) if len(ids) > max_tokens else q
            for q, ids in zip(questions, own)
        ]
        return texts, sum(len(ids) > max_tokens for ids in own)

    def count_cut_questions(self, questions: list[str], max_tokens: int | None) -> int:
        """How many of ``questions`` :meth:`encode_questions` would cut to their last ``max_tokens`` tokens (0 for
        None or 0: no limit)."""
        if not max_tokens:
            return 0
        if self.settings.chat_template:
            return self._chat_cut(questions, max_tokens)[1]
        return sum(len(ids) > max_tokens for ids in self.token_ids([self.format_question(q) for q in questions]))

    def token_ids(self, texts: list[str]) -> list[list[int]]:
        """Each text's token ids without special tokens, in one call of the tokenizer (a fast tokenizer encodes the
        batch in Rust: 64 SFT targets of the built-in task in 1.6 ms, against 3.7 ms one call per text)."""
        if not texts:
            return []
        return [list(ids) for ids in self.tokenizer(texts, add_special_tokens=False)["input_ids"]]

    def format_question(self, question: str) -> str:
        """The text before ``<|start-latent|>``: the question and a newline, or its chat-template rendering."""
        if not self.settings.chat_template:
            return question + "\n"
        if not getattr(self.tokenizer, "chat_template", None):
            raise ConfigError("invalid config value data.chat_template: this tokenizer has no chat template")
        message = [{"role": "user", "content": question}]
        return str(self.tokenizer.apply_chat_template(message, tokenize=False, add_generation_prompt=True))

    def encode_targets(
        self, texts: list[str], *, max_tokens: int | None = None, eos: bool = True
    ) -> tuple[Tensor, Tensor]:
        """Right-padded target ids (each ending in EOS) and mask, [B, L]. A target longer than ``max_tokens`` is cut
        to its first ``max_tokens`` tokens without the EOS (with it, a cut chain would teach the model to stop there,
        before its answer)."""
        _check_texts("encode_targets", "targets", texts)
        rows = []
        for ids in self.token_ids(texts):
            if max_tokens is not None and len(ids) + int(eos) > max_tokens:
                rows.append(ids[:max_tokens])
                continue
            rows.append(ids + ([self.eos_id] if eos else []))
        return right_pad(rows, self.pad_id, self.device)

    def decode(self, tokens: Tensor, mask: Tensor) -> list[str]:
        """The texts of right-padded answer rows (special tokens dropped), from one host copy of the batch."""
        if tokens.shape != mask.shape:
            raise ValueError(f"decode: tokens {tuple(tokens.shape)} and mask {tuple(mask.shape)} differ in shape")
        kept = [[t for t, m in zip(ts, ms) if m] for ts, ms in zip(tokens.tolist(), mask.tolist())]
        return [str(self.tokenizer.decode(ids, skip_special_tokens=True)) for ids in kept]

    # ------------------------------------------------------------------ the recurrence
    def _perturbation(self, given: PhaseHook | None) -> PhaseHook | None:
        """The perturbation a forward runs under: ``given``, else the one whose ``with`` block is open over this
        model (:func:`open_perturbation`)."""
        return given if given is not None else open_perturbation(self.model)

    def _forward(
        self,
        state: DecodeState,
        phase: str,
        perturbation: PhaseHook | None,
        *,
        ids: Tensor | None = None,
        embeds: Tensor | None = None,
        new_mask: Tensor | None = None,
    ) -> Tensor:
        """Append positions to ``state`` (ids or embeddings), return their last-layer hidden states [B, L, H]."""
        x = ids if ids is not None else embeds
        assert x is not None, "give ids or embeds"
        B, L = x.shape[:2]
        if new_mask is None:
            new_mask = torch.ones(B, L, dtype=state.attention_mask.dtype, device=x.device)
        positions = state.next_position[:, None] + torch.arange(L, device=x.device)[None]
        state.attention_mask = torch.cat([state.attention_mask, new_mask.to(state.attention_mask.dtype)], dim=1)
        hidden = self._call_base(state.cache, phase, perturbation, x, state.attention_mask, positions, ids is not None)
        state.next_position = state.next_position + L
        state.last_hidden = hidden[:, -1:]
        return hidden

    def _call_base(
        self,
        cache: DynamicCache | StaticCache,
        phase: str,
        perturbation: PhaseHook | None,
        x: Tensor,
        attention_mask: Tensor,
        positions: Tensor,
        x_is_ids: bool,
    ) -> Tensor:
        """One cached forward of the decoder (``x``: ids or embeddings); its last-layer hidden states [B, L, H].
        With ``recompute`` and grad on, checkpointed regions (dgrpo.model.recompute): the call, or each layer but
        the last ``recompute_kept_layers`` (a latent step's call only with ``recompute_latent_steps``).
        Under teacher-forced scoring over a growing cache, the compiled layer step when there is one."""
        perturbation = self._perturbation(perturbation)
        rows = getattr(perturbation, "rows", None)
        if rows is not None and rows != x.shape[0]:  # (one seed's masks would otherwise broadcast over every row)
            raise ValueError(rows_mismatch(rows, x.shape[0]))
        compiled = self.compiled_layers if self._scoring and isinstance(cache, DynamicCache) else None

        def run(c: DynamicCache | StaticCache, x: Tensor, mask: Tensor, pos: Tensor) -> Tensor:
            if perturbation is not None:
                perturbation.before_forward(phase)
            with self._compiled(compiled):  # (entered again by a call's recomputation, which runs after this block)
                out = self.base(
                    input_ids=x if x_is_ids else None,
                    inputs_embeds=None if x_is_ids else x,
                    attention_mask=mask,
                    position_ids=pos,
                    use_cache=True,
                    **{cache_keyword(type(self.base)): c},
                )
            return out.last_hidden_state

        if prebuilt_mask_applies(self.model.config):
            attention_mask = self._prebuilt_mask(cache, attention_mask, x.shape[1])
        kept = phase == "latent" and not self.recompute_latent_steps  # a latent step that keeps its activations
        if not (self.recompute and torch.is_grad_enabled()) or kept:
            return run(cache, x, attention_mask, positions)
        if self.recompute == "layer":  # the compiled step goes in first: each checkpointed layer region calls it
            n_kept = self.recompute_kept_layers
            run_once = last_layers(len(decoder_layers(self.model)), n_kept) if n_kept else frozenset()
            with self._compiled(compiled), checkpointed_layers(self.model, perturbation, phase, run_once):
                return run(cache, x, attention_mask, positions)
        if self.recompute not in (True, "call"):
            raise ValueError(f"LatentLM.recompute: expected False, 'call' or 'layer', got {self.recompute!r}")
        assert isinstance(cache, DynamicCache), "recomputation runs over the growing cache (the update's replay)"
        new_cache = lambda: DynamicCache(config=self.model.config)  # noqa: E731
        return recomputed_call(run, cache, new_cache, (x, attention_mask, positions), perturbation)

    def _prebuilt_mask(self, cache: DynamicCache | StaticCache, mask: Tensor, q_len: int) -> Tensor:
        """The 4-d mask of a cached call whose last ``q_len`` columns of the 2-d ``mask`` are its queries, built on the
        device (no host read of the padding, which Hugging Face's builder makes) and additive in the queries' dtype
        (the weights', or autocast's inside an autocast block), so that SDPA does not convert it again in every
        layer. Over a static cache (the fast engine) its columns are the cache's, those not written yet masked."""
        if isinstance(cache, StaticCache):
            full = static_causal_padding_mask(mask, q_len, static_length(cache))
        else:
            full = causal_padding_mask(mask, q_len)
        device = full.device.type
        if torch.is_autocast_enabled(device):
            return additive_mask(full, torch.get_autocast_dtype(device))
        return additive_mask(full, next(self.model.get_input_embeddings().parameters()).dtype)

    def _compiled(self, compiled: CompiledLayers | None) -> AbstractContextManager[Any]:
        """``compiled``'s layer step installed on the model (nothing: None, or installed already)."""
        if compiled is None or compiled.is_installed(self.model):
            return nullcontext()
        return compiled.installed(self.model)

    def _check_prompt_ends(self, prompt_ids: Tensor, prompt_mask: Tensor, markers: bool) -> None:
        """Every row left-padded (its last position a real token: the latents start from the last one's hidden
        state) and, with ``markers``, ending in ``<|start-latent|>``, as :meth:`encode_questions` writes them: a
        tokenizer's own output (right padding, no marker) decoded other answers without a word. One host sync."""
        last, start = prompt_mask[:, -1] == 0, prompt_ids[:, -1] != self.start_id
        bad = last | start if markers else last
        if not bool(bad.any()):
            return
        row = int(bad.nonzero()[0, 0])
        if bool(last[row]):
            why = (
                "no token (its mask is all zeros)"
                if not bool(prompt_mask[row].any())
                else "padding at its end (right padding)"
            )
            raise ValueError(
                f"prompt row {row} has {why}: prompts are left-padded, each ending in its last token; encode them "
                "with lm.encode_questions(questions)"
            )
        raise ValueError(
            f"prompt row {row} does not end in {START_LATENT}: the latent thoughts follow it; encode prompts with "
            "lm.encode_questions(questions) (markers=False for a prompt without the latent markers)"
        )

    @contextmanager
    def eval_mode(self) -> Iterator[LatentLM]:
        """Every module in eval mode within the block (no dropout of the model's own), and afterwards each back in
        the mode it had, an exception too (``train(was_training)`` after it put every module in the wrapper's mode:
        a model loaded in eval mode came out with its own dropout on)."""
        modes = [(m, m.training) for m in self.modules()]
        self.eval()
        try:
            yield self
        finally:
            for m, mode in modes:
                m.training = mode

    @contextmanager
    def _scoring_block(self) -> Iterator[None]:
        """Teacher-forced scoring runs within (the compiled layers serve it, not generation)."""
        before, self._scoring = self._scoring, True
        try:
            yield
        finally:
            self._scoring = before

    def new_cache(self, cache_len: int | None = None) -> DynamicCache | StaticCache:
        """An empty KV cache: growing (``DynamicCache``), or preallocated for ``cache_len`` positions (its layers
        sharing one write offset: :mod:`dgrpo.model.static_cache`)."""
        if cache_len is None:
            return DynamicCache(config=self.model.config)
        return static_cache(self.model.config, cache_len, self.device)

    def prefill(
        self,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        n_latent: int,
        *,
        mode: str | None = None,
        perturbation: PhaseHook | None = None,
        markers: bool = True,
        cache_len: int | None = None,
        cache: StaticCache | None = None,
    ) -> DecodeState:
        """Run the question, ``n_latent`` continuous thoughts and ``<|end-latent|>``.

        Returns the state whose ``last_hidden`` predicts the first answer token. ``prompt_ids`` is the
        output of :meth:`encode_questions` (ending in ``<|start-latent|>`` when ``markers``). ``cache_len``: keep
        the keys and values in a preallocated ``StaticCache`` of that many positions (one buffer whose shape never
        changes, what graph capture needs) instead of a growing ``DynamicCache``; ``cache``: that static cache
        itself, emptied here and filled again (its buffers keep their addresses).
        """
        check_prompt(prompt_ids, prompt_mask)
        check_phase_hook(perturbation)
        mode = mode or self.settings.mode
        B = prompt_ids.shape[0]
        positions = (prompt_mask.long().cumsum(-1) - 1).clamp(min=0)
        if cache is not None:
            cache.reset()
        kv = cache if cache is not None else self.new_cache(cache_len)
        state = DecodeState(kv, prompt_mask, positions[:, -1] + 1, None)  # type: ignore[arg-type]
        hidden = self._call_base(state.cache, "prompt", perturbation, prompt_ids, prompt_mask, positions, True)
        state.last_hidden = hidden[:, -1:]
        if n_latent > 0:
            if mode == "pause":
                pause = self.embed(torch.full((B, n_latent), self.latent_id, device=prompt_ids.device))
                self._forward(state, "latent", perturbation, embeds=pause)
            elif mode == "coconut":
                self.coconut_steps(state, n_latent, perturbation)
            else:
                raise ValueError(f"mode {mode!r} has no latent thoughts; got n_latent={n_latent}")
        if markers:
            end = torch.full((B, 1), self.end_id, device=prompt_ids.device)
            self._forward(state, "answer", perturbation, ids=end)
        return state

    def coconut_steps(self, state: DecodeState, n_latent: int, perturbation: PhaseHook | None = None) -> None:
        """``n_latent`` continuous thoughts after ``state``, each the last hidden state fed back as the next input.
        With grad, the steps keep each layer's keys and values once for backward (what attention saves, or what a
        recomputed region keeps as its input), not once per step (:func:`dgrpo.model.kv_prefixes.saved_as_prefixes`;
        ``save_kv_once``)."""
        once = self.save_kv_once and not (self.compiled_layers is not None and self._scoring)
        with saved_as_prefixes(state.cache) if once else nullcontext():
            for _ in range(n_latent):
                self._forward(state, "latent", perturbation, embeds=state.last_hidden)

    def score_targets(
        self,
        state: DecodeState,
        target_ids: Tensor,
        target_mask: Tensor,
        *,
        perturbation: PhaseHook | None = None,
        temperature: float = 1.0,
        with_entropy: bool = False,
        stepwise: bool = False,
        lead_ids: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Teacher-forced log pi(target_l | prefix) for every target position, [B, L] (0 at padding).

        Feeds targets[:, :-1] over the cache in one forward (``stepwise``: one token per forward, the
        same call sequence as decoding, which RNG-replayed native dropout needs); logits only at the
        L scored positions. ``lead_ids`` [B, 1] (not with ``stepwise``): a token fed first in that same forward (the
        ``<|end-latent|>`` marker, not yet run), whose hidden state then predicts the first target. A perturbation
        whose ``needs_stepwise`` is true (native dropout) is refused without ``stepwise``.

        ``target_mask`` is right-padded (ones, then zeros: a generation up to its end, as decoding gives it). Stepwise
        scoring feeds target ``i`` under ``target_mask[i + 1]``, as decoding feeds a chosen token (a row's last token
        goes in as already finished), the one call under ``target_mask[i]``: the two differ only at each row's last
        target's column, which no scored position attends (it predicts padding), so their log-probs are equal.
        """
        perturbation = self._perturbation(perturbation)
        check_stepwise(perturbation, stepwise)
        if lead_ids is not None:
            if stepwise:
                raise ValueError("lead_ids run in the targets' one forward call; stepwise scoring has one per token")
            ones = torch.ones_like(target_mask[:, :1])
            x, new_mask = torch.cat([lead_ids, target_ids[:, :-1]], 1), torch.cat([ones, target_mask[:, :-1]], 1)
            hidden = self._forward(state, "answer", perturbation, ids=x, new_mask=new_mask)
            return self._scored(hidden, target_ids, target_mask, temperature, with_entropy)
        h_first = state.last_hidden
        if target_ids.shape[1] > 1:
            if stepwise:
                h_rest = torch.cat(
                    [
                        self._forward(
                            state,
                            "answer",
                            perturbation,
                            ids=target_ids[:, i : i + 1],
                            new_mask=target_mask[:, i + 1 : i + 2],
                        )
                        for i in range(target_ids.shape[1] - 1)
                    ],
                    dim=1,
                )
            else:
                h_rest = self._forward(
                    state, "answer", perturbation, ids=target_ids[:, :-1], new_mask=target_mask[:, :-1]
                )
            hidden = torch.cat([h_first, h_rest], dim=1)
        else:
            hidden = h_first
        return self._scored(hidden, target_ids, target_mask, temperature, with_entropy)

    def _scored(
        self, hidden: Tensor, target_ids: Tensor, target_mask: Tensor, temperature: float, with_entropy: bool
    ) -> tuple[Tensor, Tensor | None]:
        """Log-probs (and entropies) of ``target_ids`` from the hidden states that predict them, 0 at padding."""
        logp, entropy = head_logprobs(
            output_head(self.model, self.logit_transform),
            hidden,
            target_ids,
            temperature,
            with_entropy,
            self.logit_chunk_elems,
            self.head_stats,
        )
        return logp * target_mask, (entropy * target_mask if entropy is not None else None)

    def target_logprobs(
        self,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        n_latent: int,
        target_ids: Tensor,
        target_mask: Tensor,
        *,
        mode: str | None = None,
        perturbation: PhaseHook | None = None,
        temperature: float = 1.0,
        with_entropy: bool = False,
        markers: bool = True,
        stepwise: bool = False,
        end_with_targets: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Question -> latents -> teacher-forced targets, differentiable end to end: log-probs [B, L].
        ``stepwise``: the targets are fed one token per forward, the same calls as :meth:`generate` makes (slower);
        needed to replay a perturbation that draws its noise per forward call (its ``needs_stepwise``: native
        dropout, whose bound perturbation is refused here without it), else the same log-probs as one forward up to
        rounding. ``end_with_targets`` (with ``markers``, not ``stepwise``): ``<|end-latent|>`` runs in the targets'
        forward call instead of its own (one call fewer; the same positions, masks and perturbation, so the same
        log-probs up to the rounding of a wider matrix product)."""
        check_phase_hook(perturbation)
        perturbation = self._perturbation(perturbation)
        check_stepwise(perturbation, stepwise)
        lead = None
        if end_with_targets and markers and not stepwise:
            lead = torch.full((prompt_ids.shape[0], 1), self.end_id, device=prompt_ids.device)
        with self._scoring_block():
            own_marker = markers and lead is None
            state = self.prefill(
                prompt_ids, prompt_mask, n_latent, mode=mode, perturbation=perturbation, markers=own_marker
            )
            return self.score_targets(
                state,
                target_ids,
                target_mask,
                perturbation=perturbation,
                temperature=temperature,
                with_entropy=with_entropy,
                stepwise=stepwise,
                lead_ids=lead,
            )

    @torch.no_grad()
    def generate(
        self,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        n_latent: int | None = None,
        *,
        max_new_tokens: int = 64,
        temperature: float = 0.0,
        top_p: float = 1.0,
        generator: torch.Generator | None = None,
        uniforms: Tensor | None = None,
        mode: str | None = None,
        perturbation: PhaseHook | None = None,
        markers: bool = True,
        stop_ids: list[int] | None = None,
        with_entropy: bool = False,
        static_cache: bool = False,
    ) -> Generation:
        """Batched answer decoding after the latents over the KV cache; each row stops at its EOS (or another id of
        ``stop_ids`` / ``self.stop_ids``, the model's end of turn).

        Greedy when ``temperature == 0``. ``logprobs`` are log pi(token) under softmax(logits / t), with
        t = temperature when sampling and 1 when greedy: the policy the GRPO ratio is taken against. Sampling draws
        from ``uniforms`` [B, max_new_tokens] when given (each row's own, ``perturbation.base.row_sampling_uniforms``:
        a row then samples the same answer whatever batch it is decoded in), else from ``generator``.
        ``n_latent``: the number of continuous thoughts; None: the checkpoint's own (``settings.n_latent``).
        ``static_cache``: one preallocated cache for the whole sequence (the same answers, tests/test_static_cache.py).
        """
        n_latent = self.settings.n_latent if n_latent is None else n_latent
        check_decoding(n_latent, max_new_tokens, temperature, top_p)
        check_prompt(prompt_ids, prompt_mask)
        check_uniforms(uniforms, prompt_ids.shape[0], max_new_tokens)
        self._check_prompt_ends(prompt_ids, prompt_mask, markers)
        n_cols = prompt_ids.shape[1] + n_latent + int(markers) + max_new_tokens - 1  # (the last token is not fed)
        state = self.prefill(
            prompt_ids,
            prompt_mask,
            n_latent,
            mode=mode,
            perturbation=perturbation,
            markers=markers,
            cache_len=n_cols if static_cache else None,
        )
        book = AnswerBook(self, prompt_ids.shape[0], max_new_tokens, stop_ids, with_entropy)
        for i in range(max_new_tokens):
            book.choose(i, self.logits(state.last_hidden[:, -1]), temperature, top_p, generator, uniforms)
            if not book.alive.any() or i == max_new_tokens - 1:
                break
            self._forward(
                state, "answer", perturbation, ids=book.tokens[:, i : i + 1], new_mask=book.alive[:, None].long()
            )
        return book.result()
