"""LoRA adapters on a LatentLM, through the ``peft`` package: wrapping, the frozen reference adapter, adapter
checkpoints (PEFT's format) and the merged export.

PEFT injects its layers into ``lm.model`` in place, so ``lm.model`` stays the Hugging Face causal LM: the latent
recurrence, the perturbation sites and every forward see the same modules as without LoRA. ``lm.peft`` holds PEFT's
wrapper for what only it does (switching adapters, adapter state dicts, merging).

- Latent tokens: the embedding rows of ``<|start-latent|>``, ``<|latent|>``, ``<|end-latent|>`` stay trainable
  through PEFT's trainable tokens (``trainable_token_indices``: those three rows only; a tied LM head shares them,
  an untied head gets its own three trainable rows).
- Exact replay: ``lora_dropout`` is always 0. PEFT's adapter dropout draws from the global RNG at every forward,
  so the update could not replay the network that produced the rollout; the seeded perturbation is the only noise.
- Reference policy for the KL term: a second adapter, ``reference``, a frozen copy of the policy adapter taken at
  the start (so the reference is the initial policy, with no second copy of the backbone). Renewal (paper Sec. 4,
  ``grpo.ref_renewal_every``) copies the policy adapter into it: reference = base + the adapter of that moment.
- Checkpoints hold the policy adapter only (``adapter_model.safetensors``, ``adapter_config.json`` naming the base
  model), with the tokenizer and ``latent_config.json`` (and ``latent_rows.safetensors``, the latent markers' rows,
  when the adapter does not train them: a plain base's files lack the rows dgrpo gave them), and a model card
  (``README.md``, :func:`adapter_card`: the base, and the lines that load the adapter);
  :func:`merge_into_base` gives base + adapters as one plain model (``dgrpo export --merge``). A local base dgrpo
  wrote is fingerprinted in the adapter's metadata: loading the adapter onto other weights at that path is refused
  (:func:`check_base`), and a run resumed on the same weights in another place points its adapter folders there
  (:func:`repoint`; :func:`~dgrpo.training.checkpoint.repoint_run_adapters`); an adapter is never saved over its base.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save, save_file
from torch import Tensor

from ..config import ConfigError
from ..run_layout import CONFIG_FILE, run_of_checkpoint
from .anatomy import token_tables
from .verified import (
    MANIFEST,
    SAFETENSORS_INDEX,
    UNREADABLE_WEIGHTS,
    CheckpointError,
    check_tensors,
    one_line,
    rewrite_files,
    sha256,
)

if TYPE_CHECKING:
    from ..config import LoraConfig
    from .latent_lm import LatentLM

POLICY, REFERENCE = "default", "reference"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
INSTALL = "LoRA needs the peft package: pip install 'dgrpo[lora]'"
#: ``adapter_model.safetensors`` metadata: a digest of the local base model's weights when the adapter was saved
BASE_FINGERPRINT = "dgrpo_base_fingerprint"
#: the latent markers' embedding rows (input; head when untied) of an adapter that does not train them
#: (``model.lora.train_latent_tokens: false``): a plain base gave them their first values, which its own files lack
LATENT_ROWS = "latent_rows.safetensors"
#: the adapter folder's model card: what it is, on which base, and how to load it (PEFT's own save writes a card)
CARD = "README.md"
#: the most target modules a message writes out (:func:`targets_setting`; more are named by the adapter's file)
LISTED_TARGETS = 8


def _peft() -> Any:
    try:
        import peft
    except ImportError:
        raise ConfigError(f"invalid config value model.lora.r: {INSTALL}") from None
    return peft


def latent_token_rows(lm: LatentLM) -> dict[str, list[int]]:
    """PEFT ``trainable_token_indices``: the latent markers' rows of the input embedding, and of an untied head."""
    ids = [lm.start_id, lm.latent_id, lm.end_id]
    names = {id(m): n.rsplit(".", 1)[-1] for n, m in lm.model.named_modules()}
    emb: Any = lm.model.get_input_embeddings()
    head: Any = lm.model.get_output_embeddings()
    rows = {names[id(emb)]: ids}
    if head is not None and head.weight.data_ptr() != emb.weight.data_ptr():
        rows[names[id(head)]] = ids
    return rows


def warn_dropout(cfg: LoraConfig, stacklevel: int = 3) -> None:
    """The warning that ``model.lora.dropout`` > 0 is replaced by 0 (see the module docstring)."""
    if cfg.dropout > 0:
        warnings.warn(
            f"model.lora.dropout={cfg.dropout} replaced by 0: PEFT's adapter dropout draws new noise at every forward, "
            "so the update could not replay the rollout's network; the perturbation is the only noise",
            stacklevel=stacklevel,
        )


def no_dropout(cfg: LoraConfig) -> None:
    """``model.lora.dropout`` set to the 0 the adapters use (a run's config records what it trains), with
    :func:`warn_dropout`'s warning when it was not."""
    warn_dropout(cfg, stacklevel=4)
    cfg.dropout = 0.0


def peft_config(lm: LatentLM, cfg: LoraConfig) -> Any:
    """The ``peft.LoraConfig`` for ``cfg`` (adapter dropout forced to 0, see the module docstring)."""
    warn_dropout(cfg)
    targets = cfg.target_modules
    return _peft().LoraConfig(
        r=cfg.r,
        lora_alpha=cfg.alpha,
        lora_dropout=0.0,
        target_modules="all-linear" if list(targets) == ["all-linear"] else list(targets),
        trainable_token_indices=latent_token_rows(lm) if cfg.train_latent_tokens else None,
        task_type="CAUSAL_LM",
    )


def check_rank(lm: LatentLM, r: int) -> None:
    """``model.lora.r`` at most the model's width (``hidden_size``): a rank beyond it adds nothing that a full update
    would not (every adapted matrix has a side of that width, or a smaller one), and 10^8 ran out of memory inside
    PEFT in a traceback."""
    width = getattr(getattr(lm.model, "config", None), "hidden_size", None)
    if isinstance(width, int) and r > width:
        raise ConfigError(
            f"invalid config value model.lora.r: {r} is more than the model's width (hidden_size {width}); a LoRA "
            "rank is a fraction of it (8-64 is usual), and at the width an adapter is a full update (model.lora.r=0)"
        )


def check_targets(lm: LatentLM, targets: list[str], latent_rows: bool = False) -> None:
    """Every name in ``model.lora.target_modules`` matches a module as PEFT matches a list (the full name, or its
    last dotted parts): a misspelt one would otherwise be left out silently while the others train. ``latent_rows``:
    ``model.lora.train_latent_tokens``, whose untied head the layers a refusal suggests leave out."""
    if targets == ["all-linear"]:
        return
    names = [n for n, _ in lm.model.named_modules() if n]
    missing = [t for t in targets if not any(_names(t, n) for n in names)]
    if missing:
        raise ConfigError(
            f"invalid config value model.lora.target_modules: {', '.join(map(repr, missing))} matches no module of "
            f"this model (its linear layers: {', '.join(_linear_leaves(lm, latent_rows)[:12])}; or all-linear)"
        )
    _refuse_unadaptable_targets(lm, targets, latent_rows)
    head, embed = lm.model.get_output_embeddings(), lm.model.get_input_embeddings()
    if head is not None and embed is not None and head.weight is embed.weight:
        _refuse_tied_targets(lm, targets, head, embed)


def _linear_leaves(lm: LatentLM, latent_rows: bool = False) -> list[str]:
    """The last dotted parts of the model's linear layers that a target may name, sorted: an output layer that shares
    its weight with the input embeddings is left out (:func:`_refuse_tied_targets` refuses it), and with
    ``latent_rows`` (``model.lora.train_latent_tokens``) an untied one too (:func:`_refuse_latent_row_targets`)."""
    head, embed = lm.model.get_output_embeddings(), lm.model.get_input_embeddings()
    tied = head is not None and embed is not None and head.weight is embed.weight
    out = head if tied or latent_rows else None
    return sorted({n.rsplit(".", 1)[-1] for n, m in lm.model.named_modules() if _is_linear(m) and m is not out})


def _refuse_unadaptable_targets(lm: LatentLM, targets: list[str], latent_rows: bool = False) -> None:
    """ConfigError when a target names a module LoRA does not adapt (a block such as ``mlp`` or ``self_attn``, a
    norm), naming the linear layers to write instead: PEFT refuses it with the module's printout, of which the line
    kept 'Target module Qwen2MLP(' alone."""
    for t in targets:
        for n, m in lm.model.named_modules():
            if n and _names(t, n) and not _adaptable(m):
                inner = sorted({c.rsplit(".", 1)[-1] for c, x in m.named_modules() if c and _is_linear(x)})
                name = "its" if inner else "this model's"
                inner = inner or _linear_leaves(lm, latent_rows)
                raise ConfigError(
                    f"invalid config value model.lora.target_modules: {t!r} is a {type(m).__name__} ({n}), not a "
                    f"layer LoRA adapts: name {name} linear layers ({', '.join(inner[:12])}), or all-linear"
                )


def _refuse_tied_targets(lm: LatentLM, targets: list[str], head: torch.nn.Module, embed: torch.nn.Module) -> None:
    """ConfigError when a target is the output layer or the input embeddings of a model whose two share one weight
    (tie_word_embeddings): PEFT adapts the one module, but merging folds the adapter into the shared weight, so the
    merged export would be another model than the adapter checkpoint (an embedding adapter would move the head too)."""
    roles = {id(head): ("output layer", "input embeddings"), id(embed): ("input embeddings", "output layer")}
    for t in targets:
        for n, m in lm.model.named_modules():
            if id(m) in roles and _names(t, n):
                own, other = roles[id(m)]
                reference = ", and the KL reference adapter cannot be added beside it" if m is head else ""
                raise ConfigError(
                    f"invalid config value model.lora.target_modules: {t!r} is this model's {own}, which shares its "
                    f"weight with the {other} (tie_word_embeddings): an adapter there would be folded into both when "
                    f"merged{reference}; leave it out"
                )


def _refuse_latent_row_targets(lm: LatentLM, targets: list[str]) -> None:
    """ConfigError when a target is a module whose latent-marker rows ``model.lora.train_latent_tokens`` trains (the
    input embeddings, an untied head): PEFT cannot put both an adapter and trainable rows on one module (it failed
    in a TypeError, and the line did not say which option to change)."""
    with_rows = {id(lm.model.get_input_embeddings()), id(lm.model.get_output_embeddings())}  # (a tied head: one)
    for t in targets:
        if any(id(m) in with_rows and _names(t, n) for n, m in lm.model.named_modules()):
            raise ConfigError(
                f"invalid config value model.lora.target_modules: {t!r} holds the latent markers' rows, which "
                "model.lora.train_latent_tokens=true trains, and PEFT cannot also put an adapter on it: leave it out, "
                "or set model.lora.train_latent_tokens=false (the markers' rows then stay as SFT left them)"
            )


def _names(target: str, module_name: str) -> bool:
    """Whether a ``model.lora.target_modules`` entry names the module, as PEFT matches a list: the full name, or its
    last dotted parts."""
    return module_name == target or module_name.endswith("." + target)


def _is_linear(module: torch.nn.Module) -> bool:
    """A layer PEFT's LoRA adapts as a linear map (torch's Linear, GPT-2's Conv1D)."""
    return isinstance(module, torch.nn.Linear) or type(module).__name__ == "Conv1D"


def _adaptable(module: torch.nn.Module) -> bool:
    """A layer PEFT's LoRA adapts: a linear one (:func:`_is_linear`), an embedding, a convolution, an attention."""
    nn = torch.nn
    return _is_linear(module) or isinstance(
        module, (nn.Embedding, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.MultiheadAttention)
    )


def apply_lora(lm: LatentLM, cfg: LoraConfig | Any) -> None:
    """Inject adapters into ``lm.model`` (in place); afterwards only the adapters (and the latent rows) are trainable.
    ``cfg``: a :class:`~dgrpo.config.LoraConfig`, or a ``peft.LoraConfig`` (a checkpoint's own)."""
    if lm.peft is not None:
        raise ValueError("this model already has LoRA adapters")
    if lm.name_or_path is None:
        raise ConfigError(
            "invalid config value model.lora.r: LoRA adapts a model saved on disk or on the hub (the adapter "
            "checkpoint names its base), and this one was built in memory: save it first (lm.save_pretrained(DIR), "
            "then LatentLM.from_pretrained(DIR)); for the built-in tiny model, train it fully first (dgrpo sft), "
            "then start from that run with --init RUN --set model.lora.r=..."
        )
    peft = _peft()
    ours = not isinstance(cfg, peft.LoraConfig)
    if ours:
        check_targets(lm, list(cfg.target_modules), cfg.train_latent_tokens)
        if cfg.train_latent_tokens:
            _refuse_latent_row_targets(lm, list(cfg.target_modules))
        check_rank(lm, cfg.r)
    config: Any = peft_config(lm, cfg) if ours else cfg
    config.base_model_name_or_path = None  # PEFT takes the model's own name; we set ours after
    with warnings.catch_warnings():  # GPT-2's Conv1D: PEFT sets fan_in_fan_out itself and says so
        warnings.filterwarnings("ignore", message=".*fan_in_fan_out.*")
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")  # PEFT reads a renamed property
        try:
            wrapper = peft.get_peft_model(lm.model, config)
        except (ValueError, TypeError) as e:  # a module PEFT cannot adapt (e.g. a tied head): one line
            if not ours:
                raise  # (a checkpoint's own config: attach_saved_adapter names its folder)
            raise ConfigError(
                f"invalid config value model.lora.target_modules: PEFT cannot adapt {list(cfg.target_modules)} "
                f"({one_line(e)[:300]})"
            ) from None
    wrapper.peft_config[POLICY].base_model_name_or_path = lm.name_or_path  # a hub id, or an absolute directory
    wrapper.peft_config[POLICY].revision = lm.revision  # the hub commit the base was loaded at (None: a directory)
    object.__setattr__(lm, "peft", wrapper)  # not a registered sub-module: lm.model holds the same parameters


def adapter_state(lm: LatentLM, adapter: str = POLICY) -> dict[str, Tensor]:
    """One adapter's tensors, in PEFT's checkpoint naming (adapter name left out), detached copies."""
    sd = _peft().get_peft_model_state_dict(lm.peft, adapter_name=adapter, save_embedding_layers=False)
    return {k: v.detach().clone().contiguous() for k, v in sd.items()}


def check_adapter_state(lm: LatentLM, state: dict[str, Tensor], where: str, adapter: str = POLICY) -> None:
    """CheckpointError unless ``state`` holds exactly the adapter's tensors with their shapes."""
    own = _peft().get_peft_model_state_dict(lm.peft, adapter_name=adapter, save_embedding_layers=False)
    check_tensors(own, state, where)


def load_adapter_state(lm: LatentLM, state: dict[str, Tensor], adapter: str = POLICY, where: str = "adapter") -> None:
    """Put ``state`` into an adapter, checked first (nothing is copied unless every tensor fits)."""
    check_adapter_state(lm, state, where, adapter)
    _peft().set_peft_model_state_dict(lm.peft, state, adapter_name=adapter)


def save_adapter(lm: LatentLM, folder: Path) -> None:
    """``adapter_config.json`` (naming the base model) and ``adapter_model.safetensors`` of the policy adapter (its
    metadata holds the base's fingerprint when the base is a local directory dgrpo wrote: :func:`check_base`)."""
    assert lm.peft is not None
    lm.peft.peft_config[POLICY].save_pretrained(str(folder))
    metadata = {"format": "pt"}
    fingerprint = base_fingerprint(lm.peft.peft_config[POLICY].base_model_name_or_path)
    if fingerprint is not None:
        metadata[BASE_FINGERPRINT] = fingerprint
    (folder / ADAPTER_WEIGHTS).write_bytes(_sorted_metadata(save(adapter_state(lm), metadata=metadata)))
    if not lm.peft.peft_config[POLICY].trainable_token_indices:
        save_file(_marker_rows(lm), str(folder / LATENT_ROWS))
    (folder / CARD).write_text(adapter_card(lm.peft.peft_config[POLICY]))


def adapter_card(config: Any) -> str:
    """The model card (``README.md``) of an adapter folder, from its ``peft.LoraConfig`` or its
    ``adapter_config.json`` read as a dict: the base it goes on (hub id and revision, or local path; a hub id is also
    the card's ``base_model``, by which the hub links an uploaded adapter to its base), the dgrpo version that wrote
    it, and the lines that load it, with dgrpo and with PEFT alone."""
    from importlib.metadata import version  # (the installed dgrpo's: the package itself is above this layer)

    get = config.get if isinstance(config, dict) else lambda k: getattr(config, k, None)
    base, revision, dgrpo = str(get("base_model_name_or_path")), get("revision"), version("dgrpo")
    hub = not Path(base).is_absolute()
    at = f" at revision `{revision}`" if revision else ""
    rows = not get("trainable_token_indices")
    front = [
        "---",
        *([f"base_model: {base}"] if hub else []),
        "library_name: peft",
        "tags:",
        "- dgrpo",
        "- lora",
        "---",
    ]
    lines = [
        *front,
        "",
        f"# LoRA adapter on `{base}`",
        "",
        f"A LoRA adapter (r = {get('r')}, alpha = {get('lora_alpha')}) of a latent-reasoning language model, written "
        f"by dgrpo {dgrpo}. Its base model is {'the hub model' if hub else 'the local folder'} `{base}`{at}, "
        "as `adapter_config.json` names it; this folder holds the adapter, the tokenizer with the latent markers "
        "(`<|start-latent|>`, `<|latent|>`, `<|end-latent|>`) and `latent_config.json`"
        + (
            ", and the markers' embedding rows (`latent_rows.safetensors`: the adapter does not train them)."
            if rows
            else "."
        ),
        "",
        "With dgrpo (the base is loaded as named, then the adapter):",
        "",
        "```python",
        "from dgrpo.model.latent_lm import LatentLM",
        "",
        'lm = LatentLM.from_pretrained("THIS_FOLDER")',
        "```",
        "",
        "or `dgrpo eval --model THIS_FOLDER --data DATASET --out DIR`; `dgrpo export THIS_FOLDER --merge --out DIR` "
        "writes base + adapter as one Hugging Face model.",
        "",
        "With PEFT alone (a plain forward; transformers' `generate` does not run the latent recurrence):",
        "",
        "```python",
        "from peft import AutoPeftModelForCausalLM",
        "",
        'lm = AutoPeftModelForCausalLM.from_pretrained("THIS_FOLDER")',
        "```",
    ]
    if rows:
        lines += [
            "",
            "then put the markers' rows of `latent_rows.safetensors` into its embeddings, as dgrpo's README shows "
            "(Large backbones: LoRA, Without dgrpo).",
        ]
    return "\n".join(lines) + "\n"


def _sorted_metadata(data: bytes) -> bytes:
    """A safetensors file's bytes ``data`` with its header's ``__metadata__`` in key order: safetensors writes it from
    a hash map, in an order that changes from one save to the next (two saves of one adapter differed in bytes, and
    so did the manifests of a run and of the same run resumed). The tensors' bytes are unchanged."""
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    header["__metadata__"] = dict(sorted(header.get("__metadata__", {}).items()))
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)  # (padded as safetensors pads it: the tensors start 8-byte aligned)
    return len(text).to_bytes(8, "little") + text + data[8 + n :]


def _marker_rows(lm: LatentLM) -> dict[str, Tensor]:
    """The latent markers' rows of each table a token's rows live in (:func:`~dgrpo.model.anatomy.token_tables`)."""
    ids = [lm.start_id, lm.latent_id, lm.end_id]
    return {name: t[ids].detach().clone().contiguous() for name, t in token_tables(lm.model).items()}


def _set_marker_rows(lm: LatentLM, rows: dict[str, Tensor]) -> None:
    """Write :func:`_marker_rows`' rows back (an adapter loaded onto its plain base, whose files lack them)."""
    ids = [lm.start_id, lm.latent_id, lm.end_id]
    targets = token_tables(lm.model)
    with torch.no_grad():
        for name, value in rows.items():
            target = targets.get(name)
            if target is None or target[ids].shape != value.shape:
                raise CheckpointError(f"{LATENT_ROWS}: {name} rows of shape {tuple(value.shape)} do not fit this model")
            target[ids] = value.to(target.dtype)


def base_directory(lm: LatentLM) -> Path | None:
    """The local directory of the base model ``lm``'s adapter names (None: no adapter, or a hub id)."""
    base = lm.peft.peft_config[POLICY].base_model_name_or_path if lm.peft is not None else None
    return Path(base) if base and Path(base).is_absolute() else None


def _is_weights_file(name: str) -> bool:
    """A model directory's own weight file (safetensors, or the index of its shards), by its relative name."""
    return "/" not in name and (name.endswith(".safetensors") or name == SAFETENSORS_INDEX)


def _weight_digests(folder: Path, from_files: bool) -> dict[str, str]:
    """sha256 of a model directory's weight files: as its manifest lists them, or with ``from_files`` computed from
    the files (a base without a manifest)."""
    if from_files:
        return {p.name: sha256(p) for p in sorted(folder.iterdir()) if p.is_file() and _is_weights_file(p.name)}
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in manifest.items() if _is_weights_file(k)} if isinstance(manifest, dict) else {}


def base_fingerprint(base: str | None, from_files: bool = False) -> str | None:
    """A digest of a local base model's weights (None: a hub id, or a directory without weights dgrpo listed)."""
    if not base or not Path(base).is_absolute() or not Path(base).is_dir():
        return None
    digests = _weight_digests(Path(base), from_files)
    return hashlib.sha256(json.dumps(digests, sort_keys=True).encode()).hexdigest() if digests else None


def saved_fingerprint(folder: Path) -> str | None:
    """The base fingerprint an adapter directory's weights record (None: none, from before fingerprints or on a hub
    base or a base without dgrpo's manifest; or weights that cannot be read, which :func:`read_adapter` reports)."""
    try:
        with safe_open(str(folder / ADAPTER_WEIGHTS), "pt") as f:
            return (f.metadata() or {}).get(BASE_FINGERPRINT)
    except Exception:  # noqa: BLE001 - unreadable weights: read_adapter says so
        return None


def current_fingerprint(base: str) -> str | None:
    """:func:`base_fingerprint` of a local base as it is now: by its manifest, or its weight files without one."""
    return base_fingerprint(base, from_files=not (Path(base) / MANIFEST).is_file())


def trained_on(folder: Path, base: str) -> bool | None:
    """Whether the adapter of ``folder`` was trained on the weights of the local base ``base`` now holds, by the
    fingerprint it records (None: it records none, so nothing tells)."""
    saved = saved_fingerprint(folder)
    return None if saved is None else current_fingerprint(base) == saved


def check_base(folder: Path, base: str) -> None:
    """CheckpointError when the local base an adapter directory names is not the one it was saved with (their
    fingerprints differ). Adapters saved without one (older, or on a hub base) are not checked."""
    if trained_on(folder, base) is False:
        raise CheckpointError(
            f"LoRA adapter {folder}: the base model at {base} changed since the adapter was trained (other weights): "
            f"put that base back there, or {repoint_hint(folder)} (an adapter does not carry over to other weights: "
            "train one on this base)"
        )


def repoint(folder: Path, base: str, whole: Path | None = None) -> None:
    """Name ``base`` (the same weights' new place) in an adapter directory's ``adapter_config.json``, the manifests
    that list it updated: ``folder``'s own, and ``whole``'s, a directory holding ``folder`` (a resumable
    checkpoint's ``model/``), replaced as one (:func:`~dgrpo.model.verified.rewrite_files`). The adapter's
    fingerprint is of the weights, not of their place: it stays as it is."""
    whole = folder if whole is None else whole
    config = {**_adapter_config(folder), "base_model_name_or_path": base}
    rel = str((folder / ADAPTER_CONFIG).relative_to(whole))
    files = {rel: json.dumps(config, indent=2, sort_keys=True).encode()}  # (as PEFT writes it)
    if (folder / CARD).is_file():  # (the card names the base too)
        files[str((folder / CARD).relative_to(whole))] = adapter_card(config).encode()
    rewrite_files(whole, files)


def repoint_hint(folder: Path) -> str:
    """How to give an adapter checkpoint its base's new place: the path, and the manifest that holds the file's
    checksum (the base's weights are still checked, by the fingerprint the adapter's weights record); for a folder of
    a run (final/, best/, stage-K/, a resumable checkpoint's model/), first the resume that points them all there."""
    run = _run_holding(folder)
    resume = (
        f"resume the run {run} with --init at the base's new place and --allow-config-change (every folder of the "
        "run is then pointed there), or "
        if run is not None
        else ""
    )
    point = f"{resume}point base_model_name_or_path in {folder / ADAPTER_CONFIG} to where the base is now"
    if not (folder / MANIFEST).is_file():  # (deleted already: nothing more to do)
        return point
    return (
        f"{point} and delete {folder / MANIFEST} (it holds that file's checksum; do it in a copy of a run's final/, "
        "best/ or stage-K/, which the run no longer takes as its own without it)"
    )


def _run_holding(folder: Path) -> Path | None:
    """The run directory (its config.json) whose final/, best/, stage-K/ or checkpoints/step-N/model is ``folder``."""
    found = run_of_checkpoint(folder)
    return found[0] if found is not None and (found[0] / CONFIG_FILE).is_file() else None


def read_adapter(lm: LatentLM, folder: Path) -> dict[str, Tensor]:
    """The policy adapter tensors of an adapter directory, checked against ``lm``'s adapter."""
    try:
        state = load_file(str(folder / ADAPTER_WEIGHTS))
    except Exception as e:  # noqa: BLE001 - truncated or foreign files: one line
        raise CheckpointError(
            f"{folder}: unreadable adapter weights {ADAPTER_WEIGHTS} ({one_line(e)}): {UNREADABLE_WEIGHTS}"
        ) from None
    check_adapter_state(lm, state, str(folder))
    return state


def is_adapter_dir(path: Path) -> bool:
    return (path / ADAPTER_CONFIG).is_file()


def adapter_shape(config: Any) -> dict[str, Any]:
    """What makes an adapter, comparable: ``r``, ``alpha``, the target modules (sorted) and whether it trains the
    latent markers' rows, from a ``peft.LoraConfig`` or an ``adapter_config.json`` read as a dict."""
    get = config.get if isinstance(config, dict) else lambda k: getattr(config, k, None)
    targets = get("target_modules")
    return {
        "r": int(get("r") or 0),
        "alpha": float(get("lora_alpha") or 0),
        "target_modules": sorted(targets) if isinstance(targets, (list, set, tuple)) else targets,
        "train_latent_tokens": bool(get("trainable_token_indices")),
    }


def _as_set(value: bool | float) -> str:
    """A value as ``--set`` reads it back exactly (``8``, ``12.3456789``, ``false``)."""
    if isinstance(value, bool):
        return str(value).lower()
    short = f"{value:g}"
    return short if float(short) == value else repr(value)


def listed_targets(targets: Any) -> bool:
    """Whether a message writes an adapter's target modules out: a list of up to :data:`LISTED_TARGETS` names."""
    return isinstance(targets, list) and len(targets) <= LISTED_TARGETS


def targets_setting(targets: Any, config: Path | str | None, key: str = "model.lora.target_modules") -> str:
    """``key`` set to an adapter's target modules, as every message spells them: written out as ``--set`` takes them
    (``KEY=[k_proj,v_proj]``) when :func:`listed_targets`; more (PEFT's expansion of ``all-linear``: a name per
    linear layer, 14 in some architectures) named by ``config``, the adapter's ``adapter_config.json`` (None: no
    file to name, the names written out)."""
    if listed_targets(targets) or config is None:
        return f"{key}=[{','.join(targets)}]" if isinstance(targets, list) else f"{key}={targets}"
    return f"{key} as {config} lists them"


def other_adapter(folder: Path, lm: LatentLM, cli: bool) -> str | None:
    """How the adapter saved in ``folder`` differs from the policy adapter ``lm`` holds (None: the same): the
    ``model.lora`` settings that would give the saved one, worded for the caller (:func:`adapter_changes`)."""
    return adapter_changes(folder, adapter_shape(lm.peft.peft_config[POLICY]), cli)


def planned_adapter(lora_cfg: dict, source: str) -> dict[str, Any] | None:
    """The adapter a run of ``lora_cfg`` (its ``model.lora``, as a config dict) on ``source`` (its
    ``model.name_or_path`` as the run records it) will train, as :func:`adapter_shape` gives it, from the files
    alone, before the model is loaded: an adapter directory's own (its settings win over ``model.lora``), else
    ``model.lora``'s values, without the target modules when they are ``all-linear`` (PEFT expands it on the loaded
    model). None when the files do not tell: ``r`` = 0 (no adapter, or one merged), a hub id, an unreadable
    ``adapter_config.json`` (loading it says why)."""
    if not int(lora_cfg.get("r") or 0) or not Path(source).is_absolute() or not Path(source).is_dir():
        return None
    if is_adapter_dir(Path(source)):
        try:
            return adapter_shape(_adapter_config(Path(source)))
        except CheckpointError:
            return None
    shape = {
        "r": int(lora_cfg["r"]),
        "alpha": float(lora_cfg.get("alpha") or 0),
        "train_latent_tokens": bool(lora_cfg.get("train_latent_tokens")),
    }
    targets = list(lora_cfg.get("target_modules") or [])
    return shape if targets == ["all-linear"] else {**shape, "target_modules": sorted(targets)}


def planned_base(source: str) -> str | None:
    """The local base directory a LoRA run on ``source`` (its ``model.name_or_path`` as the run records it) puts its
    adapter on, from the files alone, before the model is loaded: ``source`` itself, or the base an adapter
    directory names; None for a hub base, or a base that cannot be found (loading it says why)."""
    from .sources import resolve_checkpoint

    if not Path(source).is_absolute() or not Path(source).is_dir():
        return None
    if not is_adapter_dir(Path(source)):
        return source
    try:
        named = Path(adapter_base(Path(source))).expanduser()
        base = str(resolve_checkpoint(named)) if named.exists() else None
    except CheckpointError:
        return None
    return base if base is not None and Path(base).is_absolute() else None


def adapter_changes(folder: Path, now: dict[str, Any], cli: bool) -> str | None:
    """How the adapter saved in ``folder`` differs from ``now`` (:func:`adapter_shape`'s keys, or some of them: those
    compared): the ``model.lora`` settings that would give the saved one, as ``--set`` takes them (``cli``: the
    command line runs the trainer), else as a Python caller sets them in its config (``the config's model.lora.r =
    4``); target modules as :func:`targets_setting` spells them. None: no difference."""
    saved = adapter_shape(_adapter_config(folder))
    if all(saved[k] == now[k] for k in now):
        return None
    keep = []
    for key in (k for k in saved if k in now and saved[k] != now[k]):
        value, many = saved[key], key == "target_modules" and not listed_targets(saved[key])
        if many:  # (named by the adapter's file, for the command line and Python alike)
            keep.append(targets_setting(value, folder / ADAPTER_CONFIG))
        elif cli:
            spelt = targets_setting(value, None) if key == "target_modules" else f"model.lora.{key}={_as_set(value)}"
            keep.append(f"--set '{spelt}'" if key == "target_modules" else f"--set {spelt}")
        else:
            keep.append(f"model.lora.{key} = {value!r}")
    return ", ".join(keep) if cli else "the config's " + " and ".join(keep)


def _adapter_config(folder: Path) -> dict:
    """An adapter directory's ``adapter_config.json``; unreadable: a CheckpointError line."""
    try:
        return json.loads((folder / ADAPTER_CONFIG).read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{folder}: unreadable {ADAPTER_CONFIG} ({one_line(e)})") from None


def adapter_base(folder: Path) -> str:
    """The base model an adapter directory names (``base_model_name_or_path``)."""
    base = _adapter_config(folder).get("base_model_name_or_path")
    if not base:
        raise CheckpointError(f"{folder}: {ADAPTER_CONFIG} names no base model (base_model_name_or_path)")
    return str(base)


def adapter_base_revision(folder: Path) -> str | None:
    """The hub revision of the base an adapter directory names (PEFT's ``revision``; None: none recorded, by PEFT
    without dgrpo or an adapter on a local base: a hub base then loads at main, the commit the Hugging Face cache's
    ``refs/main`` names offline, as ``from_pretrained`` and PEFT's own loading read it)."""
    try:
        revision = _adapter_config(folder).get("revision")
    except CheckpointError:
        return None
    return str(revision) if revision else None


def attach_saved_adapter(lm: LatentLM, folder: Path) -> None:
    """Give ``lm`` (the base model of an adapter directory) that directory's adapter and weights."""
    try:
        config = _peft().LoraConfig.from_pretrained(str(folder))
    except Exception as e:  # noqa: BLE001
        raise CheckpointError(f"{folder}: unreadable {ADAPTER_CONFIG} ({one_line(e)})") from None
    if getattr(config, "lora_dropout", 0.0):
        config.lora_dropout = 0.0  # an adapter trained elsewhere: dropout off, as in every dgrpo forward
    try:
        apply_lora(lm, config)
    except (ValueError, TypeError) as e:  # PEFT refuses the saved config on this base (modules it does not have)
        raise CheckpointError(
            f"{folder}: its {ADAPTER_CONFIG} does not fit the base model {lm.name_or_path} (PEFT: "
            f"{one_line(e)[:300]}): an adapter goes on the base it was trained on (base_model_name_or_path)"
        ) from None
    try:  # (the config is the adapter's own: a tensor that does not fit is the base's doing)
        state = read_adapter(lm, folder)
    except CheckpointError as e:
        if str(e).startswith(f"{folder}: unreadable"):
            raise
        raise CheckpointError(
            f"LoRA adapter {folder}: it does not fit the base model {lm.name_or_path} "
            f"({str(e).removeprefix(f'{folder}: ')}), a model of another size or architecture than the one it was "
            f"trained on; point base_model_name_or_path in {folder / ADAPTER_CONFIG} to that base (an adapter does "
            "not carry over to another model: train one on this base)"
        ) from None
    load_adapter_state(lm, state, where=str(folder))
    if (folder / LATENT_ROWS).is_file():
        _set_marker_rows(lm, load_file(str(folder / LATENT_ROWS)))
    if (folder / LATENT_ROWS).is_file() or config.trainable_token_indices:
        lm.new_latent_tokens = []  # the markers' rows are the adapter's (those of the run that saved it), not new


# ---------------------------------------------------------------------- the reference adapter
def add_reference(lm: LatentLM) -> None:
    """A frozen ``reference`` adapter, a copy of the policy adapter now (the KL reference, no backbone copy). A model
    that has one (an earlier run in this process, stopped by Ctrl-C, then started again) has it overwritten."""
    assert lm.peft is not None
    if REFERENCE not in lm.peft.peft_config:
        lm.peft.add_adapter(REFERENCE, lm.peft.peft_config[POLICY])
    renew_reference(lm)
    lm.peft.set_adapter(POLICY)  # add_adapter leaves the new adapter trainable; only the policy is


def renew_reference(lm: LatentLM) -> None:
    """Reference renewal under LoRA: copy the policy adapter's current weights into the reference adapter."""
    load_adapter_state(lm, adapter_state(lm, POLICY), adapter=REFERENCE, where="reference adapter")


@contextmanager
def reference_active(lm: LatentLM) -> Iterator[LatentLM]:
    """Within: ``lm`` computes with the reference adapter (use under ``torch.no_grad``); after: the policy again."""
    assert lm.peft is not None
    lm.peft.set_adapter(REFERENCE)
    try:
        yield lm
    finally:
        lm.peft.set_adapter(POLICY)  # also makes the policy (and only it) trainable again


class ReferenceAdapterState:
    """The reference adapter as a training checkpoint sees an extra model: ``state_dict`` / ``load_state_dict``."""

    def __init__(self, lm: LatentLM):
        self.lm = lm

    def state_dict(self, keep_vars: bool = False) -> dict[str, Tensor]:
        return adapter_state(self.lm, REFERENCE)

    def load_state_dict(self, state: dict[str, Tensor], strict: bool = True) -> None:
        load_adapter_state(self.lm, state, adapter=REFERENCE, where="reference adapter")


# ---------------------------------------------------------------------- counting and merging
def trainable_parameters(lm: LatentLM) -> tuple[int, int]:
    """(trainable, total) parameter counts; the trainable tokens count as their rows only."""
    trainable = sum(p.numel() for p in lm.model.parameters() if p.requires_grad)
    return trainable, sum(p.numel() for p in lm.model.parameters())


@torch.no_grad()
def merge_into_base(lm: LatentLM) -> None:
    """Fold the policy adapter (and the trained latent rows) into the weights: ``lm.model`` becomes a plain Hugging
    Face model again, without adapters (``dgrpo export --merge``; full fine-tuning of an adapter checkpoint)."""
    assert lm.peft is not None
    if REFERENCE in lm.peft.peft_config:
        lm.peft.delete_adapter(REFERENCE)
    lm.model = lm.peft.merge_and_unload().requires_grad_(True)  # PEFT had frozen the backbone
    lm.peft, lm.name_or_path = None, None
