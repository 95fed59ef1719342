"""Loading a Hugging Face causal LM's weights for a :class:`~dgrpo.model.latent_lm.LatentLM`, strictly: safetensors
only, a missing or wrong-shape tensor one line, the tokenizer saved with a dgrpo checkpoint checked, a repository's
own code named as the option that allows it, the line a command says before the weights load (where they come
from: a directory, the hub cache or a download), and Hugging Face's progress bars quieted while a checkpoint is
written."""

from __future__ import annotations

import importlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from transformers import (
    AutoModelForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from ..data.loaders import hub_lines_held
from ..data.records import LATENT_MARKERS
from .sources import (
    MISSING_FILES,
    NO_SAFETENSORS,
    download_hint,
    missing_weights,
    revision_kwargs,
)
from .verified import (
    UNREADABLE_WEIGHTS,
    CheckpointError,
    one_line,
)


def check_saved_tokenizer(where: str, tokenizer: PreTrainedTokenizerBase, rows: int | None) -> None:
    """A CheckpointError when a dgrpo checkpoint's tokenizer is not the one saved with it: dgrpo saves the latent
    markers in it, at ids below the model's ``rows`` embedding rows (None: an adapter's base, whose rows may lack
    them), and never more tokens than rows. Another tokenizer (the base model's, copied over it) got the markers
    added anew, over the trained rows of their ids, and the model loaded with untrained markers."""
    vocab = tokenizer.get_vocab()
    lacking = [t for t in LATENT_MARKERS if t not in vocab or (rows is not None and vocab[t] >= rows)]
    if lacking:
        what = f"it lacks the latent markers {', '.join(lacking)}"
    elif rows is not None and len(tokenizer) > rows:
        what = f"it has {len(tokenizer) - rows} tokens past the model's {rows} embedding rows"
    else:
        return
    rows_said = "" if rows is None else f", {rows} embedding rows"
    raise CheckpointError(
        f"cannot load the model {where}: its tokenizer ({len(tokenizer)} tokens{rows_said}) is not the one dgrpo "
        f"saved with it: {what}; copy back the tokenizer files saved with the checkpoint"
    )


def model_config(path: str, revision: str | None, local_files_only: bool) -> dict | None:
    """The ``config.json`` of the model ``from_pretrained`` is about to load from ``path`` (a directory, or a hub id
    at ``revision``: fetched alone, a small file the load reads first anyway), as a dict, for what can be checked
    before the weights load; None when it cannot be read (the load then says why)."""
    try:
        if Path(path).is_dir():
            file = Path(path) / "config.json"
        else:
            from huggingface_hub import hf_hub_download

            file = Path(hf_hub_download(path, "config.json", revision=revision, local_files_only=local_files_only))
        config = json.loads(file.read_text())
    except Exception:  # noqa: BLE001 - not there, not reachable, not JSON: from_pretrained's error says it
        return None
    return config if isinstance(config, dict) else None


def config_rows(config: dict | None) -> int | None:
    """The embedding rows a model built from ``config`` (config.json's dict) has: its ``vocab_size`` (a multimodal
    config's ``text_config``'s); None when it does not say, or when the model runs its repository's own code
    (``auto_map``), which may size its embedding otherwise (ChatGLM's ``padded_vocab_size``)."""
    if config is None or "auto_map" in config:
        return None
    text = config.get("text_config")
    rows = config.get("vocab_size", text.get("vocab_size") if isinstance(text, dict) else None)
    return rows if isinstance(rows, int) and not isinstance(rows, bool) and rows > 0 else None


def remote_code_hint(e: BaseException) -> str:
    """What to add to a load that failed because the model or tokenizer runs its repository's own code: the option
    that allows it (transformers' words for it, ``trust_remote_code=True``, are on a line :func:`one_line` drops)."""
    if "trust_remote_code" not in str(e):
        return ""
    return (
        " (the repository runs its own code: allow it with --set model.trust_remote_code=true, or import-coconut's "
        "and export's --trust-remote-code, only if you trust it)"
    )


def loading_line(given: str, path: str, local_files_only: bool, revision: str | None, adapter: bool = False) -> str:
    """The line a command says (rank 0) just before :func:`load_hf_model` reads ``path``'s weights, which takes minutes
    for a large hub model while transformers' bars are off: ``given`` (the name the user gave) and where the weights
    come from: a directory, the hub cache, or the hub (some of them not cached at ``revision``: a download).
    ``adapter``: ``given`` is a LoRA adapter directory and ``path`` its base."""
    if Path(path).is_dir():
        where = "" if adapter else f"from {path}"
    elif local_files_only or hub_weights_cached(path, revision):
        where = "from the hub cache"
    else:
        where = "downloading from the hub"
    said = ", ".join(x for x in (f"a LoRA adapter on {path}" if adapter else "", where) if x)
    return f"dgrpo: loading {given} ({said}) ..."


def hub_weights_cached(name: str, revision: str | None) -> bool:
    """Whether the hub cache holds every safetensors file ``from_pretrained`` reads for hub id ``name`` at
    ``revision`` (``model.safetensors``, or each shard its index lists): loading it downloads nothing."""
    from huggingface_hub import try_to_load_from_cache

    def cached(file: str) -> str | None:
        found = try_to_load_from_cache(name, file, revision=revision)
        return found if isinstance(found, str) else None

    if cached("model.safetensors"):
        return True
    index = cached("model.safetensors.index.json")
    try:
        shards = set(json.loads(Path(index).read_text())["weight_map"].values()) if index else set()
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # (a damaged index: the load says so)
        return False
    return bool(shards) and all(isinstance(s, str) and cached(s) for s in shards)


def load_hf_model(
    path: str,
    dtype: torch.dtype | None,
    trust_remote_code: bool = False,
    local_files_only: bool = False,
    revision: str | None = None,
) -> PreTrainedModel:
    """``AutoModelForCausalLM`` from safetensors, strictly: a missing or wrong-shape tensor is a CheckpointError.
    ``revision``: a hub id's branch, tag or commit (None: its default branch). What transformers logs meanwhile (its
    load report: a table of every tensor that did not fit) is written when the load succeeds, and dropped when it
    fails: the CheckpointError's one line says why."""
    with hub_lines_held(("transformers",)):
        return _load_hf_model(path, dtype, trust_remote_code, local_files_only, revision)


def _load_hf_model(
    path: str, dtype: torch.dtype | None, trust_remote_code: bool, local_files_only: bool, revision: str | None
) -> PreTrainedModel:
    """:func:`load_hf_model`, its log not held."""
    try:
        loaded: Any = AutoModelForCausalLM.from_pretrained(
            path,
            dtype=dtype or "auto",
            use_safetensors=True,
            trust_remote_code=trust_remote_code,
            local_files_only=local_files_only,
            # (transformers looks for a PEFT adapter first and does not pass local_files_only on: a cached hub id
            # would wait ~25 s for that lookup's retries on a machine without network)
            adapter_kwargs={"local_files_only": True} if local_files_only else None,
            output_loading_info=True,
            ignore_mismatched_sizes=True,  # (a wrong shape is reported in info: it raised "look at the above report")
            **revision_kwargs(revision),
        )
    except Exception as e:  # noqa: BLE001
        folder = Path(path)
        if folder.is_dir() and not any(folder.glob("*.safetensors")) and any(folder.glob("*.bin")):
            raise CheckpointError(
                f"cannot load the model {path}: it holds PyTorch .bin weights, and dgrpo loads safetensors only (a "
                "pickle can run code); convert it once: AutoModelForCausalLM.from_pretrained(DIR).save_pretrained(DIR)"
            ) from None
        if MISSING_FILES.search(str(e)):  # (transformers adds "do not set use_safetensors")
            cached = local_files_only and not folder.is_dir()  # (a hub id read from the cache: how to complete it)
            missing = missing_weights(e, path, revision)  # (no safetensors weights, or some of their shards)
            none = missing == NO_SAFETENSORS
            where = f" {'in' if none else 'from'} its files in the Hugging Face cache (an interrupted download?)"
            where, fix = (where, f": {download_hint(path, revision)}") if cached else ("", "")
            only = " (dgrpo loads safetensors only)" if none else ""
            raise CheckpointError(f"cannot load the model {path}: {missing}{where}{only}{fix}") from None
        if isinstance(e, SafetensorError):  # (a header cut short: 'incomplete metadata, file not fully covered')
            raise CheckpointError(
                f"cannot load the model {path}: unreadable safetensors weights ({one_line(e)}): {UNREADABLE_WEIGHTS}"
            ) from None
        if "Unrecognized configuration class" in str(e):  # (an encoder-decoder's, T5's, or another kind's)
            raise CheckpointError(
                f"cannot load the model {path}: it is no causal LM (its config.json is of a kind "
                "AutoModelForCausalLM does not load); give a decoder-only LM (GPT-2, Llama, Qwen2, ...)"
            ) from None
        raise CheckpointError(f"cannot load the model {path}: {one_line(e)}{remote_code_hint(e)}") from None
    model, info = loaded
    check_loading_info(path, model, info)
    return model


def check_loading_info(path: str, model: PreTrainedModel, info: dict) -> None:
    """A CheckpointError (one line) when the weights lack a tensor of the model their ``config.json`` describes, or
    hold one of another shape (``info``: what ``from_pretrained`` reports): the config is not the weights' own
    (another architecture's, another size's), or a tensor was lost."""
    missing = sorted(k if isinstance(k, str) else k[0] for k in info.get("missing_keys") or [])
    shapes = sorted(
        k if isinstance(k, str) else f"{k[0]} {tuple(k[1])} vs {tuple(k[2])}" for k in info.get("mismatched_keys") or []
    )
    if not missing and not shapes:
        return
    arch = type(model).__name__
    named = [a for a in getattr(model.config, "architectures", None) or [] if isinstance(a, str)]
    if named and arch not in named:  # (a BERT encoder: transformers builds BertLMHeadModel, and its head is missing)
        raise CheckpointError(
            f"the model {path} is no causal LM: its config.json names {', '.join(named)}, and {arch}, the causal LM "
            f"of its kind, lacks {few_names(missing or shapes)} in its weights; give a decoder-only LM (GPT-2, Llama, "
            "Qwen2, ...)"
        )
    if shapes:
        found = f"wrong-shape tensors (the weights' vs {arch}'s): {few_names(shapes)}"
    else:
        unexpected = sorted(info.get("unexpected_keys") or [])
        others = f"; it holds others {arch} has no place for: {few_names(unexpected)}" if unexpected else ""
        found = f"missing tensors: {few_names(missing)}{others}"
    raise CheckpointError(
        f"the model {path} has {found}: its weights do not fit its config.json ({arch}); put back the config.json "
        "saved with these weights (or the weights saved with it)"
    )


def few_names(names: list[str], n: int = 3) -> str:
    """The first ``n`` of ``names``, and how many there are in all when more (an error line's list of tensors)."""
    return ", ".join(names[:n]) + (f", ... ({len(names)} in all)" if len(names) > n else "")


@contextmanager
def hf_progress_bars_off() -> Iterator[None]:
    """Hugging Face's per-file progress bars off for a while (a training run's every checkpoint printed "Writing
    model shards"), then as they were: transformers' and huggingface_hub's (which transformers' switch sets too)."""
    from transformers.utils import logging as hf_logging

    hub_tqdm = importlib.import_module("huggingface_hub.utils.tqdm")  # (the module: the package's name is its class)
    was_on = hf_logging.is_progress_bar_enabled()
    hub_states = dict(getattr(hub_tqdm, "progress_bar_states", {}))  # (global and per group)
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()
        if hasattr(hub_tqdm, "progress_bar_states"):
            hub_tqdm.progress_bar_states.clear()
            hub_tqdm.progress_bar_states.update(hub_states)
