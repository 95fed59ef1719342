"""The tokenizer side of a latent model: the latent markers (``<|start-latent|>``, ``<|latent|>``,
``<|end-latent|>``) added to a tokenizer and their embedding rows initialised, the tokenizer loaded from a checkpoint,
and token ids turned into padded batches.

:class:`~dgrpo.model.latent_lm.LatentLM` adds the markers when it wraps a model that lacks them;
:mod:`dgrpo.model.coconut_import` places them where Coconut's own checkpoints have them.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from transformers import AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from ..config import LatentTokenInit
from ..data.records import LATENT_MARKERS
from .anatomy import input_embedding_weight, token_tables
from .sources import download_hint, revision_kwargs
from .verified import CheckpointError, has_tokenizer_files, no_tokenizer_files

#: the latent markers: before the thoughts, each pause thought (``mode: pause``), after the thoughts
START_LATENT, LATENT, END_LATENT = LATENT_MARKERS
#: the token whose rows Coconut's run.py copies into the latent markers' (``model.latent_token_init: coconut``)
COCONUT_INIT_TOKEN = "<<"


def init_new_embeddings(model: PreTrainedModel, ids: list[int], n_real: int, copy_of: int | None = None) -> None:
    """Rule for new special tokens: each row of ``ids`` is the mean of the rows of the ``n_real`` tokens the tokenizer
    had before (not of a padded vocabulary's unused rows: Qwen2.5 has 151,936 rows for 151,665 tokens), or, with
    ``copy_of`` (a token id below ``n_real``), a copy of that token's row (Coconut's: ``<<``).

    Applied to the input embedding and, when untied, the output embedding (with the mean, the output rows make
    the new tokens' logits the average logit, so they are neither favoured nor suppressed).
    """

    with torch.no_grad():
        for w in token_tables(model).values():  # (a copy of the row read: the rows written share its memory)
            w[ids] = w[copy_of].clone() if copy_of is not None else w[:n_real].mean(0, keepdim=True)


def coconut_init_row(tokenizer: PreTrainedTokenizerBase, n_real: int) -> int | None:
    """The id of ``<<`` (Coconut's rows for new latent tokens), or None when the tokenizer has no such token."""
    found = tokenizer.get_vocab().get(COCONUT_INIT_TOKEN)
    return found if found is not None and found < n_real else None


def token_id(tokenizer: PreTrainedTokenizerBase, token: str) -> int:
    found = tokenizer.convert_tokens_to_ids(token)
    assert isinstance(found, int)
    return found


def add_latent_tokens(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, init: LatentTokenInit = "mean"
) -> list[str]:
    """Add the three latent markers (and a pad token if missing) and initialise their embeddings (``init``: mean, or
    coconut: copies of ``<<``'s rows, :func:`init_new_embeddings`); returns the markers added (untrained): those the
    tokenizer lacked, and those it holds beyond the model's embedding rows (a tokenizer saved with the markers, its
    model without their rows)."""
    vocab, n_tokens, n_rows = tokenizer.get_vocab(), len(tokenizer), input_embedding_weight(model).shape[0]
    _warn_tokens_beyond_rows(vocab, n_rows)
    missing = [t for t in LATENT_MARKERS if t not in vocab]
    if missing:
        tokenizer.add_tokens(missing, special_tokens=True)
    missing = [t for t in LATENT_MARKERS if t in missing or vocab[t] >= n_rows]
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if len(tokenizer) > n_rows:
        model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    if missing:  # new rows, or a padded vocabulary's unused rows (the markers' ids fall among them)
        n_real = min(n_tokens, n_rows)
        copy_of = coconut_init_row(tokenizer, n_real) if init == "coconut" else None
        if init == "coconut" and copy_of is None:
            warnings.warn(
                f"model.latent_token_init=coconut: the tokenizer has no {COCONUT_INIT_TOKEN!r} token; the latent "
                "markers start at the mean of the existing rows",
                stacklevel=3,
            )
        init_new_embeddings(model, [token_id(tokenizer, t) for t in missing], n_real, copy_of)
    return missing


def _warn_tokens_beyond_rows(vocab: dict[str, int], n_rows: int) -> None:
    """Warn about tokens of the tokenizer (the latent markers aside) whose ids have no row in the model's embedding:
    a tokenizer of another model, or a model built with too small a vocab_size. The resize gave them new, untrained
    rows without a word, and the text that uses them reached the model as noise."""
    beyond = sorted((i, t) for t, i in vocab.items() if i >= n_rows and t not in LATENT_MARKERS)
    if beyond:
        warnings.warn(
            f"the tokenizer has {len(beyond)} token(s) beyond the model's {n_rows} embedding rows (ids {beyond[0][0]} "
            f"to {beyond[-1][0]}, {beyond[0][1]!r} first): they get new, untrained rows; is it another model's "
            "tokenizer? Save the model's own beside it (or build the model with vocab_size = len(tokenizer))",
            stacklevel=4,
        )


def check_special_tokens(tokenizer: PreTrainedTokenizerBase, where: str | None = None) -> None:
    """ValueError (one line) for a tokenizer without an EOS token: every answer ends with it (decoding stops there),
    and it pads when the tokenizer has no pad token. ``where``: the model folder or hub id the tokenizer was read
    from, whose file the line says to set it in (None: a tokenizer built in Python, whose ``eos_token`` it names)."""
    if tokenizer.eos_token_id is None:
        pad = "" if tokenizer.pad_token_id is None else " (it has a pad token, but answers end with EOS)"
        raise ValueError(f"the tokenizer has no EOS token{pad}: {_eos_fix(where)}")


def _eos_fix(where: str | None) -> str:
    """How to give the tokenizer of ``where`` (a folder, a hub id, or None: one built in Python) its EOS token."""
    token = "the token its texts end with (one of its vocabulary; GPT-2's and Qwen's is <|endoftext|>)"
    if where is None:
        return (
            f"set one before building the LatentLM: tokenizer.eos_token = {token}, or a new one "
            "(tokenizer.add_special_tokens({'eos_token': '<eos>'}))"
        )
    if Path(where).is_dir():
        return f'set "eos_token" in {Path(where) / "tokenizer_config.json"} to {token}'
    return (
        f'download the model (hf download {where} --local-dir DIR), set "eos_token" in DIR/tokenizer_config.json to '
        f"{token}, and load DIR"
    )


def check_hub_tokenizer(name: str, snapshot: Path, cached: bool) -> None:
    """A CheckpointError when a hub id's files (``snapshot``, the folder named by their commit) hold no tokenizer:
    read from the cache (``cached``), how to download the rest; fetched from the hub, the repository has none at
    that commit. (The line was a local directory's: save the tokenizer beside the model, in the hub's cache.)"""
    if has_tokenizer_files(snapshot):
        return
    what = f"model {name!r} at commit {snapshot.name}: no tokenizer ({no_tokenizer_files(snapshot)})"
    if cached:
        raise CheckpointError(
            f"{what} in its files in the Hugging Face cache (an interrupted download, or only some files "
            f"downloaded?): {download_hint(name, snapshot.name)}"
        )
    raise CheckpointError(
        f"{what} in the repository: download it (hf download {name} --revision {snapshot.name} --local-dir DIR), "
        "save its base model's tokenizer there (tokenizer.save_pretrained(DIR)) and load DIR"
    )


def load_tokenizer(
    path: str, trust_remote_code: bool = False, local_files_only: bool = False, revision: str | None = None
) -> PreTrainedTokenizerBase:
    """AutoTokenizer, except that a plain ``tokenizers`` file (our built-in tokenizer) is loaded as is
    (AutoTokenizer would otherwise pick the model type's tokenizer class and its decoder). A local directory without
    a vocabulary file is a CheckpointError: transformers would build an empty tokenizer from the model type (every
    question encoded as nothing, and the latent tokens given ids of ordinary vocabulary rows)."""
    folder = Path(path)
    if folder.is_dir() and not has_tokenizer_files(folder):
        raise CheckpointError(
            f"no tokenizer in {folder} ({no_tokenizer_files(folder)}): save the tokenizer beside the model "
            "(tokenizer.save_pretrained(DIR)) or copy its files from the base model"
        )
    cfg = folder / "tokenizer_config.json"
    if cfg.is_file() and json.loads(cfg.read_text()).get("tokenizer_class") in (
        "TokenizersBackend",
        "PreTrainedTokenizerFast",
    ):
        return PreTrainedTokenizerFast.from_pretrained(path)
    return AutoTokenizer.from_pretrained(
        path, trust_remote_code=trust_remote_code, local_files_only=local_files_only, **revision_kwargs(revision)
    )


def bos_prefix(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """``[bos]`` when the tokenizer's own encoding of a text starts with its BOS token (``add_special_tokens``: Llama,
    Mistral, Gemma), else ``[]`` (Qwen, GPT-2; a tokenizer without BOS)."""
    bos = tokenizer.bos_token_id
    if bos is None:
        return []
    own = tokenizer("1", add_special_tokens=True)["input_ids"]
    plain = tokenizer("1", add_special_tokens=False)["input_ids"]
    return [bos] if own[:1] == [bos] and plain[:1] != [bos] else []


def end_of_turn_ids(model: PreTrainedModel, eos_id: int | None) -> list[int]:
    """The ids other than the tokenizer's EOS that end a generated answer, as Hugging Face's ``generate`` ends it:
    the model's ``generation_config.eos_token_id`` (an id or a list; an instruction-tuned model's end of turn, such
    as Qwen2.5-Instruct's ``<|endoftext|>`` beside its ``<|im_end|>``, or Llama 3's ``<|eom_id|>``), each within the
    vocabulary."""
    found = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids = found if isinstance(found, (list, tuple)) else [found]
    vocab = input_embedding_weight(model).shape[0]
    return sorted({int(i) for i in ids if isinstance(i, int) and i != eos_id and 0 <= i < vocab})


def left_pad(rows: list[list[int]], pad_id: int, device: Any = None) -> tuple[Tensor, Tensor]:
    """Ids and mask [B, longest row], each row padded on the left (one tensor built from lists, no loop of copies)."""
    n = max(len(r) for r in rows)
    ids = torch.tensor([[pad_id] * (n - len(r)) + r for r in rows], dtype=torch.long)
    mask = torch.tensor([[0] * (n - len(r)) + [1] * len(r) for r in rows], dtype=torch.long)
    return ids.to(device), mask.to(device)


def right_pad(rows: list[list[int]], pad_id: int, device: Any = None) -> tuple[Tensor, Tensor]:
    """Ids and mask [B, longest row (at least 1)], each row padded on the right."""
    n = max(max(len(r) for r in rows), 1)
    ids = torch.tensor([r + [pad_id] * (n - len(r)) for r in rows], dtype=torch.long)
    mask = torch.tensor([[1] * len(r) + [0] * (n - len(r)) for r in rows], dtype=torch.long)
    return ids.to(device), mask.to(device)
