"""Convert a checkpoint of the official Coconut code (github.com/facebookresearch/coconut) to a dgrpo checkpoint.

The official ``run.py`` saves ``torch.save(model.state_dict(), ...)`` of its ``Coconut`` wrapper: every key of
the base causal LM is prefixed ``base_causallm.``, plus ``embedding.weight``, the base model's input
embedding registered a second time. Its CoT stage (stage 0) saves the plain base model's state dict, without
the prefix and without rows for the latent tokens. The tokenizer is the base model's, with
``<|start-latent|>``, ``<|end-latent|>``, ``<|latent|>`` added in that order (so on GPT-2 they are ids 50257,
50258, 50259) and the embedding matrix resized to ``len(tokenizer)``; the new rows start as copies of the
``<<`` token's row. dgrpo uses the same three strings, so the converted tokenizer carries them at the same
ids and :class:`~dgrpo.model.latent_lm.LatentLM` finds them present: their trained rows are kept.

Coconut's pause-as-thought runs (``coconut: False`` with ``cot``, ``no_thoughts`` and ``no_cot`` False) train the
plain base model with ``<|latent|>`` as an ordinary pause token: the embedding is resized (the latent rows are
there) but never wrapped, so run.py saves a plain state dict, and its eval feeds the ``<|latent|>`` token's
embedding at each latent position, never a hidden state. The file says nothing more of its run: a plain state dict
with the latent rows is imported as continuous thought (mode ``coconut``, with a warning) unless ``mode="pause"``
(``--mode pause``) is given; dgrpo's mode ``pause`` then computes what run.py computed. The wrapper's layout is
saved only by ``coconut: True`` runs, and a state dict without the latent rows is no pause run's: both refuse
``mode="pause"``.

Only ``torch.load(..., weights_only=True)`` is ever used: a file that needs code to unpickle is refused.
"""

from __future__ import annotations

import pickle
import re
import warnings
from pathlib import Path

import torch
from torch import Tensor, nn
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerBase

from ..paths import expand_home
from .anatomy import decoder_layers, input_embedding_weight
from .factory import CheckpointError
from .hf_loading import few_names
from .latent_lm import LatentLM, LatentSettings
from .sources import hub_snapshot, resolve_model_source, revision_kwargs
from .tokens import (
    END_LATENT,
    LATENT,
    START_LATENT,
    check_hub_tokenizer,
    coconut_init_row,
    init_new_embeddings,
    load_tokenizer,
)

#: the order in which Coconut's run.py adds its latent tokens to the tokenizer (it fixes their ids)
OFFICIAL_TOKEN_ORDER = (START_LATENT, END_LATENT, LATENT)
#: prefix of every base-model key in a state dict of the official ``Coconut`` module
WRAPPER_PREFIX = "base_causallm."
#: the wrapper's own key: ``Coconut.embedding`` is the base model's input embedding, saved twice
WRAPPER_EMBEDDING = "embedding.weight"
#: how the latent positions of a Coconut-stage checkpoint are read: continuous thought or pause tokens
THOUGHT_MODES = ("coconut", "pause")
#: what a checkpoint that does not fit ``--base`` asks (a GPT-2 run's file over a Llama base, another size)
WHICH_BASE = "is --base the model the run started from (its model_id)?"
#: the key prefixes of DDP's and torch.compile's wrappers, dropped from every key
WRAPPED_BY = re.compile(r"^(?:module\.|_orig_mod\.)+")
#: buffers that older transformers versions saved in state dicts and that are constants, not weights
LEGACY_BUFFERS = re.compile(r"(\.attn|\.crossattention)\.(masked_)?bias$|rotary_emb\.inv_freq$")


def _error(msg: str) -> CheckpointError:
    return CheckpointError(" ".join(msg.split()))


def _few(keys: list[str]) -> str:
    """The first 4 of ``keys`` (:func:`~dgrpo.model.hf_loading.few_names`)."""
    return few_names(keys, 4)


def read_state_dict(ckpt: Path) -> dict[str, Tensor]:
    """``torch.load(weights_only=True)`` of a flat ``{name: tensor}`` dict; anything else is a CheckpointError."""
    if ckpt.is_dir():
        raise _error(f"{ckpt} is a directory{_directory_advice(ckpt)}")
    if not ckpt.is_file():
        raise _error(f"Coconut checkpoint not found: {ckpt}")
    try:
        obj = torch.load(ckpt, map_location="cpu", weights_only=True)
    except Exception as e:  # every failure to read is one line for the user
        found = re.search(r"Unsupported global: GLOBAL (\S+)", str(e))
        if isinstance(e, pickle.UnpicklingError) and "Weights only load failed" in str(e) and found:
            what = f" (it references {found.group(1)})"
            raise _error(
                f"{ckpt}: refused: it holds pickled objects other than tensors{what}; only plain tensor state "
                "dicts are imported (torch.load weights_only=True), no code from the file is run"
            ) from None
        if _cut_short(ckpt, e):
            raise _error(
                f"{ckpt}: not a readable torch checkpoint: cut short ({ckpt.stat().st_size:,} bytes, its end missing: "
                "an interrupted save, copy or download); copy it again from the run's save_dir"
            ) from None
        # torch's own words, without its advice on weights_only (one line)
        text = str(e).split("WeightsUnpickler error:", 1)[-1].split("Check the documentation", 1)[0]
        reason = f"{type(e).__name__}: {' '.join(text.split())[:160]}" if text.strip() else type(e).__name__
        empty = " (an empty file)" if ckpt.stat().st_size == 0 else ""
        raise _error(
            f"{ckpt}: not a readable torch checkpoint, damaged or of another format{empty} ({reason})"
        ) from None
    if not isinstance(obj, dict):
        raise _error(f"{ckpt}: expected a state dict (name -> tensor), found {type(obj).__name__}")
    if not obj:
        raise _error(f"{ckpt}: an empty state dict (no tensors)")
    bad = [f"{k!r}: {type(v).__name__}" for k, v in obj.items() if not isinstance(k, str) or not isinstance(v, Tensor)]
    inner = [k for k, v in obj.items() if isinstance(v, dict) and v and all(isinstance(t, Tensor) for t in v.values())]
    if bad and inner:  # (a training script's {"model": state_dict, "optimizer": ..., "epoch": ...})
        raise _error(
            f"{ckpt}: not a state dict but a dict holding one under {inner[0]!r} (entries {_few(bad)}); save that "
            f"one alone, torch.save(torch.load(FILE)[{inner[0]!r}], NEW_FILE), and import NEW_FILE"
        )
    if bad:
        raise _error(f"{ckpt}: expected a state dict (name -> tensor), found non-tensor entries {_few(bad)}")
    return obj


def _directory_advice(folder: Path) -> str:
    """What to give instead of ``folder``: one of a run.py save_dir's ``checkpoint_N`` files (the latest named); a model
    directory (config.json: a TRL or transformers SFT output, a dgrpo checkpoint) needs no import, ``--init`` and
    ``--model`` load it as it is."""
    if (folder / "config.json").is_file() or (folder / "adapter_config.json").is_file():
        return (
            ": a model directory (a transformers or TRL output, or a dgrpo checkpoint), which needs no import: "
            "dgrpo sft --init, grpo --init and eval --model load it as it is; import-coconut reads the file Coconut's "
            "run.py saved (save_dir/checkpoint_N)"
        )
    saved = sorted(
        (int(m.group(1)), f.name)
        for f in folder.iterdir()
        if (m := re.fullmatch(r"checkpoint_(\d+)", f.name)) and f.is_file()
    )
    if saved:
        return f": give one of the checkpoint files run.py saved in it ({saved[0][1]} to {saved[-1][1]})"
    return ": give the checkpoint file Coconut's run.py saved (save_dir/checkpoint_N)"


def _cut_short(ckpt: Path, error: Exception) -> bool:
    """Whether a file ``torch.load`` failed on is a torch checkpoint whose end is missing: a zip archive (torch's
    format) without its central directory (torch says 'Invalid argument', or 'failed finding central directory'),
    or the legacy format's 'unexpected EOF'."""
    import zipfile

    with ckpt.open("rb") as f:
        zipped = f.read(4) == b"PK\x03\x04"
    return (zipped and not zipfile.is_zipfile(ckpt)) or "unexpected EOF" in str(error)


def unwrap(sd: dict[str, Tensor], ckpt: Path) -> tuple[dict[str, Tensor], bool, Tensor | None]:
    """The base model's state dict, whether it came in the official wrapper, and the wrapper's
    ``embedding.weight`` (None for a plain state dict)."""
    sd = {_without_wrappers(k): v for k, v in sd.items()}
    keys = list(sd)
    wrapped = [k for k in keys if k.startswith(WRAPPER_PREFIX)]
    if not wrapped:
        if WRAPPER_EMBEDDING in sd:
            raise _error(f"{ckpt}: has {WRAPPER_EMBEDDING!r} but no {WRAPPER_PREFIX}* keys (keys: {_few(keys)})")
        return dict(sd), False, None
    others = [k for k in keys if not k.startswith(WRAPPER_PREFIX) and k != WRAPPER_EMBEDDING]
    if others:
        raise _error(
            f"{ckpt}: neither the official Coconut layout ({WRAPPER_PREFIX}* keys) nor a plain state dict: "
            f"found both {WRAPPER_PREFIX}* keys and {_few(others)}"
        )
    inner = {k[len(WRAPPER_PREFIX) :]: v for k, v in sd.items() if k.startswith(WRAPPER_PREFIX)}
    return inner, True, sd.get(WRAPPER_EMBEDDING)


def _without_wrappers(key: str) -> str:
    """A key without the prefixes torch's wrappers put on a saved module's keys: DDP's ``module.``, torch.compile's
    ``_orig_mod.``, FSDP's ``_fsdp_wrapped_module.`` (a state dict saved from the wrapper, not from its module)."""
    return WRAPPED_BY.sub("", key.replace("_fsdp_wrapped_module.", ""))


def coconut_settings(
    c_thought: int, n_latent: int | None, stage: int | None, max_latent_stage: int | None, mode: str = "coconut"
) -> LatentSettings:
    """Settings of a Coconut-stage checkpoint by Coconut's rule, ``n_latent = c_thought * min(stage,
    max_latent_stage)``: what is not given is inferred from the rest (``stage`` defaults to ``max_latent_stage + 1``,
    the first stage with every step latent, or to the stage ``n_latent`` names when below ``max_latent_stage``); a
    combination the rule cannot give (``n_latent=2, stage=1, c_thought=1``) is a one-line CheckpointError. ``mode``:
    coconut or pause (run.py's pause-as-thought runs follow the same curriculum, with pause tokens)."""
    _check_ranges(c_thought, n_latent, stage, max_latent_stage)
    if n_latent is None and max_latent_stage is None:
        raise _error(
            "give max_latent_stage (--max-latent-stage; n_latent = c_thought * max_latent_stage) or n_latent "
            "(--n-latent)"
        )
    if n_latent is not None and n_latent % c_thought:
        raise _error(
            f"n_latent {n_latent} is not a multiple of c_thought {c_thought} (Coconut's stage k has c_thought * k "
            "latent thoughts): check both"
        )
    if n_latent is None:
        assert max_latent_stage is not None
        stage = max_latent_stage + 1 if stage is None else stage
        n_latent = c_thought * min(stage, max_latent_stage)
    elif stage is None:
        stage = _inferred_stage(c_thought, n_latent, max_latent_stage)
    _check_coconut_rule(c_thought, n_latent, stage, max_latent_stage)
    return LatentSettings(mode=mode, c_thought=c_thought, stage=stage, n_latent=n_latent)


def _check_ranges(c_thought: int, n_latent: int | None, stage: int | None, max_latent_stage: int | None) -> None:
    if c_thought < 1:
        raise _error(f"c_thought (--c-thought) must be >= 1 for a Coconut-stage checkpoint, got {c_thought}")
    for name, value in (("n_latent", n_latent), ("stage", stage), ("max_latent_stage", max_latent_stage)):
        if value is not None and value < 0:
            raise _error(f"{name} (--{name.replace('_', '-')}) must be >= 0, got {value}")


def _inferred_stage(c_thought: int, n_latent: int, max_latent_stage: int | None) -> int:
    """The stage of ``n_latent`` thoughts: ``n_latent / c_thought`` below ``max_latent_stage``, else the first stage
    past it (``max_latent_stage`` unknown: taken to be ``n_latent / c_thought``)."""
    steps = n_latent // c_thought
    if max_latent_stage is None or steps == max_latent_stage:
        return steps + 1
    if steps > max_latent_stage:
        raise _error(
            f"n_latent {n_latent} is more than c_thought * max_latent_stage = {c_thought * max_latent_stage} "
            "(Coconut's most latent thoughts): check them"
        )
    return steps


def _check_coconut_rule(c_thought: int, n_latent: int, stage: int, max_latent_stage: int | None) -> None:
    """CheckpointError unless ``n_latent == c_thought * min(stage, max_latent_stage)`` for the given (or, when None,
    some) ``max_latent_stage``."""
    steps = n_latent // c_thought
    ok = steps <= stage if max_latent_stage is None else steps == min(stage, max_latent_stage)
    if not ok:
        given = f"c_thought {c_thought}, stage {stage}" + (
            "" if max_latent_stage is None else f", max_latent_stage {max_latent_stage}"
        )
        raise _error(
            f"n_latent {n_latent} does not fit {given}: Coconut's stage k has c_thought * min(k, max_latent_stage) "
            "latent thoughts; give fewer of them (the rest is inferred)"
        )


def choose_settings(
    ckpt: Path,
    cot: bool,
    c_thought: int,
    n_latent: int | None,
    stage: int | None,
    max_latent_stage: int | None,
    mode: str = "coconut",
) -> LatentSettings:
    """Coconut settings in ``mode`` (:func:`coconut_settings`), or mode ``cot`` at stage 0 for a CoT-stage
    checkpoint."""
    if not cot:
        return coconut_settings(c_thought, n_latent, stage, max_latent_stage, mode)
    if c_thought < 0:
        raise _error(f"c_thought (--c-thought) must be >= 0 for a CoT-stage checkpoint, got {c_thought}")
    if any(v not in (None, 0) for v in (n_latent, stage, max_latent_stage)):
        raise _error(
            f"{ckpt} has no latent-token rows: a CoT-stage checkpoint (Coconut's stage 0), imported as mode "
            "cot; leave out n_latent / stage / max_latent_stage (--n-latent, --stage or --epochs-per-stage, "
            "--max-latent-stage), or give 0"
        )
    # run.py trains and evaluates its CoT stage without the markers (no_special_marker: configs.cot or no_cot); its
    # args/gsm_cot.yaml has c_thought 0, which the curriculum after it does not use: the later stages' 1 is kept
    return LatentSettings(mode="cot", c_thought=max(c_thought, 1), stage=0, n_latent=0, markers=False)


def thought_mode(ckpt: Path, asked: str | None, wrapped: bool, cot: bool) -> str:
    """The mode of a Coconut-stage checkpoint's latent positions: ``asked`` (coconut or pause; None: coconut), checked
    against what run.py's layout says of the run. The ``Coconut`` wrapper's layout is saved only by ``coconut: True``
    runs and a CoT-stage checkpoint has no latent rows: neither is a pause-as-thought run's. A plain state dict with
    the latent rows is what run.py saves for pause-as-thought, and what a hand-unwrapped Coconut model looks like:
    read as coconut when nothing is asked, with a warning naming ``--mode pause``."""
    if asked == "pause" and wrapped:
        raise _error(
            f"{ckpt} is in the Coconut wrapper's layout ({WRAPPER_PREFIX}* keys), which run.py saves only for "
            "coconut: True runs (continuous thought): leave out --mode pause"
        )
    if asked == "pause" and cot:
        raise _error(
            f"{ckpt} has no latent-token rows: a CoT-stage checkpoint, not a pause-as-thought run's (run.py resizes "
            "the embedding for those): leave out --mode pause"
        )
    if asked is None and not wrapped and not cot:
        warnings.warn(
            f"{ckpt}: a plain state dict with the latent-token rows, imported as continuous thought (mode coconut); "
            "Coconut's run.py saves this layout for its pause-as-thought runs (coconut: False), whose <|latent|> "
            "tokens are pause tokens: give --mode pause if it is one of them, --mode coconut if it is not",
            stacklevel=3,
        )
    return asked or "coconut"


def build_base(
    base: str, trust_remote_code: bool, revision: str | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, list[str]]:
    """An untrained model of ``base``'s architecture (config only), its tokenizer with the Coconut tokens added,
    and the tokens that were added (all three for a plain base model). ``revision``: a hub id's branch, tag or
    commit."""
    local_only = expand_home(base).exists()  # a base directory needs no weights: only its config and tokenizer
    if local_only:
        revision = None
        _check_base_dir(expand_home(base))
    else:  # a mistyped local path is one line, an unreachable hub too (not ~30 s of the hub's retries)
        base, local_only = resolve_model_source(base, revision)
        if not trust_remote_code:  # (files without a tokenizer: transformers built an empty one from the model type)
            check_hub_tokenizer(base, hub_snapshot(base, revision, local_only), local_only)
    try:
        config = AutoConfig.from_pretrained(
            base, trust_remote_code=trust_remote_code, local_files_only=local_only, **revision_kwargs(revision)
        )
        tokenizer = load_tokenizer(base, trust_remote_code, local_only, revision)
    except CheckpointError:
        raise
    except (OSError, ValueError) as e:
        raise _error(f"cannot load the base model's config and tokenizer from {base!r}: {e}") from None
    model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    added = [t for t in OFFICIAL_TOKEN_ORDER if t not in tokenizer.get_vocab()]
    for token in added:  # one at a time, in run.py's order: the ids come out the same
        tokenizer.add_tokens([token], special_tokens=True)
    if tokenizer.pad_token is None:  # run.py and dgrpo both pad with EOS
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer, added


def check_marker_order(base: str, tokenizer: PreTrainedTokenizerBase, added: list[str]) -> None:
    """A CheckpointError when ``base``'s tokenizer already held the latent tokens (all but those :func:`build_base`
    ``added``) in another order than run.py adds them (start, end, latent): a dgrpo checkpoint's (start, latent,
    end), not the run's model_id. Its ids would read the checkpoint's trained rows under the wrong tokens (the end
    marker's row as the thought's), without a word."""
    vocab = tokenizer.get_vocab()
    present = [(t, vocab[t]) for t in OFFICIAL_TOKEN_ORDER if t in vocab and t not in added]
    if [i for _, i in present] == sorted(i for _, i in present):
        return
    held = ", ".join(f"{t} {i}" for t, i in sorted(present, key=lambda p: p[1]))
    raise _error(
        f"--base {base}: its tokenizer already holds the latent tokens ({held}), in another order than Coconut's "
        f"run.py adds them ({', '.join(OFFICIAL_TOKEN_ORDER)}): a dgrpo checkpoint's, whose ids would read the "
        f"trained rows under other tokens; {WHICH_BASE}"
    )


def _check_base_dir(base: Path) -> None:
    """A CheckpointError naming what a local ``--base`` lacks: a model's ``config.json`` (transformers said 'Should
    have a model_type key' of a folder without one, and of a dgrpo run directory, whose config.json is the run's)."""
    import json

    config = base / "config.json"
    if not config.is_file():
        raise _error(f"--base {base}: no config.json; give the directory of the base model the Coconut run began from")
    try:
        stated = json.loads(config.read_text())
    except (OSError, ValueError):
        return  # (transformers' own error says what is wrong with it)
    if isinstance(stated, dict) and "model_type" not in stated:
        run = " (a dgrpo run's config)" if {"grpo", "sft"} & set(stated) else ""
        raise _error(
            f"--base {base}: its config.json is no model config{run}, it names no model_type; give the directory "
            "of the base model the Coconut run began from"
        )


def param_key(model: nn.Module, module: nn.Module) -> str:
    """The state-dict key of ``module.weight`` inside ``model``."""
    name = next(n for n, m in model.named_modules() if m is module)
    return f"{name}.weight" if name else "weight"


def same_values(a: Tensor, b: Tensor) -> bool:
    """Whether ``a`` and ``b`` hold the same values, NaN equal to NaN (a diverged run's tied tensors are still one)."""
    return a.shape == b.shape and bool(((a == b) | (a.isnan() & b.isnan())).all())


def fit_state_dict(model: PreTrainedModel, sd: dict[str, Tensor], wrapper_emb: Tensor | None) -> dict[str, Tensor]:
    """Drop constant buffers, restore a tied output embedding, check keys and shapes against ``model``."""
    expected = model.state_dict()
    emb_key = param_key(model, model.get_input_embeddings())
    if wrapper_emb is not None and emb_key in sd and not same_values(wrapper_emb, sd[emb_key]):
        raise _error(f"{WRAPPER_EMBEDDING} differs from {WRAPPER_PREFIX}{emb_key} (they are one tensor in Coconut)")
    derived = {n for n, _ in model.named_buffers()} - set(expected)
    sd = {k: v for k, v in sd.items() if k in expected or not (k in derived or LEGACY_BUFFERS.search(k))}
    out_emb = model.get_output_embeddings()
    if out_emb is not None and out_emb.weight is model.get_input_embeddings().weight:
        out_key = param_key(model, out_emb)
        if out_key not in sd and emb_key in sd:
            sd[out_key] = sd[emb_key]
        elif out_key in sd and emb_key in sd and not same_values(sd[out_key], sd[emb_key]):
            raise _error(f"{out_key} differs from {emb_key}, but the base model ties them: {WHICH_BASE}")
    missing = [k for k in expected if k not in sd]
    unexpected = [k for k in sd if k not in expected]
    if missing or unexpected:
        parts = [f"missing {_few(missing)}" if missing else "", f"unexpected {_few(unexpected)}" if unexpected else ""]
        # (every key the base's, some missing: a file saved or copied in part is as likely as another base; unless
        # whole layers are missing: then another base's depth)
        depth = _depths(model, sd)
        ask = WHICH_BASE if unexpected or depth else f"a file saved or copied in part, or {WHICH_BASE}"
        raise _error(f"the checkpoint does not fit the base model: {depth}{'; '.join(p for p in parts if p)}: {ask}")
    wrong = [f"{k} {tuple(sd[k].shape)} vs {tuple(v.shape)}" for k, v in expected.items() if sd[k].shape != v.shape]
    if wrong:
        raise _error(
            f"the checkpoint does not fit the base model: wrong shapes (checkpoint vs base) {_few(wrong)}: {WHICH_BASE}"
        )
    # load_state_dict would cast an integer tensor into a float weight without a word
    kinds = [f"{k} {sd[k].dtype}" for k, v in expected.items() if v.is_floating_point() != sd[k].is_floating_point()]
    if kinds:
        raise _error(f"the checkpoint does not fit the base model: tensors of another kind (not float) {_few(kinds)}")
    broken = [k for k, v in sd.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]
    if broken:  # (it imported, then evaluated at 0% with every answer unparseable)
        raise _error(f"the checkpoint holds NaN or infinite weights, a diverged run's: {_few(broken)}")
    return sd


def _depths(model: PreTrainedModel, sd: dict[str, Tensor]) -> str:
    """``"the checkpoint has 2 decoder layers, the base model 4; "`` when their depths differ (else ""): the missing
    or unexpected keys are then whole layers, which the key lists alone do not say."""
    layers = decoder_layers(model)
    prefix = next(n for n, m in model.named_modules() if m is layers)
    indices = {int(m.group(1)) for k in sd if (m := re.match(rf"{re.escape(prefix)}\.(\d+)\.", k))}
    if len(indices) == len(layers):
        return ""
    return f"the checkpoint has {len(indices)} decoder layers ({prefix}.N), the base model {len(layers)}; "


def init_latent_rows(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, tokens: list[str]) -> None:
    """Embedding rows for ``tokens`` (new latent tokens of a CoT checkpoint) as Coconut's run.py makes them: copies
    of ``<<``'s row (dgrpo's mean rule when the tokenizer has no ``<<``: the mean of the rows of the tokens before
    them, not of a padded vocabulary's spare rows, among which the markers' ids then fall); rows added past the end
    get the mean."""
    n_old = input_embedding_weight(model).shape[0]
    n_real = min(n_old, len(tokenizer) - len(tokens))  # (the tokens were appended to the tokenizer)
    if len(tokenizer) > n_old:
        model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
        init_new_embeddings(model, list(range(n_old, len(tokenizer))), n_real)
    vocab = tokenizer.get_vocab()
    init_new_embeddings(model, [vocab[t] for t in tokens], n_real, coconut_init_row(tokenizer, n_real))


def import_coconut(
    ckpt: Path,
    base: str,
    out: Path,
    *,
    c_thought: int,
    n_latent: int | None = None,
    stage: int | None = None,
    max_latent_stage: int | None = None,
    trust_remote_code: bool = False,
    revision: str | None = None,
    mode: str | None = None,
) -> Path:
    """Write ``out``, a dgrpo checkpoint directory, from the official Coconut checkpoint ``ckpt`` over ``base``.

    ``base`` is the hub id or local directory the Coconut run started from (its ``model_id``; a hub id at
    ``revision``, None: its default branch); only its config and tokenizer are read. A Coconut-stage checkpoint
    gets ``LatentSettings(mode="coconut", c_thought, stage, n_latent)`` (see :func:`coconut_settings`); a CoT-stage
    checkpoint (no latent-token rows) is imported as ``mode="cot"``, its latent rows initialised as run.py does, and
    takes no ``n_latent`` / ``stage`` / ``max_latent_stage``. ``mode``: how a Coconut-stage checkpoint's latent
    positions are read, ``coconut`` (continuous thought: each one's input is the last hidden state) or ``pause``
    (the ``<|latent|>`` token's embedding, as run.py's pause-as-thought runs trained and evaluated); None: coconut
    (with a warning for a plain state dict with the latent rows, run.py's pause-as-thought layout; see
    :func:`thought_mode`). Every problem is a one-line :class:`CheckpointError`; nothing is written then.
    """
    ckpt, out = Path(ckpt), Path(out)
    if mode is not None and mode not in THOUGHT_MODES:
        raise _error(f"mode (--mode) must be one of {', '.join(THOUGHT_MODES)}, got {mode!r}")
    if out.exists() and not out.is_dir():
        raise _error(f"output directory {out} exists and is a file")
    if out.exists() and any(out.iterdir()):
        raise _error(f"output directory {out} exists and is not empty")
    sd, wrapped, wrapper_emb = unwrap(read_state_dict(ckpt), ckpt)
    model, tokenizer, added = build_base(base, trust_remote_code, revision)
    check_marker_order(base, tokenizer, added)
    emb_key = param_key(model, model.get_input_embeddings())
    if emb_key not in sd:
        raise _error(
            f"{ckpt}: no input embedding {emb_key!r} for the base model of {base!r} (keys: {_few(list(sd))}): "
            f"{WHICH_BASE}"
        )
    rows, base_rows = sd[emb_key].shape[0], input_embedding_weight(model).shape[0]
    # run.py's CoT stage saves the plain base model, never resized; every Coconut stage has the latent rows
    cot = not wrapped and bool(added) and rows == base_rows
    latent_ids = [tokenizer.get_vocab()[t] for t in OFFICIAL_TOKEN_ORDER]
    if not cot and max(latent_ids) >= rows:
        raise _error(
            f"{ckpt}: its {rows} embedding rows stop short of the latent tokens (ids {latent_ids} in the tokenizer "
            f"of {base!r}, {len(tokenizer)} tokens with them): {WHICH_BASE}"
        )
    if not cot and rows != len(tokenizer):  # (run.py resizes to len(tokenizer): the trained latent rows went unused)
        raise _error(
            f"{ckpt}: {rows} embedding rows, but the tokenizer of {base!r} with the latent tokens has {len(tokenizer)} "
            "(Coconut's run.py resizes the embedding to exactly that): is --base the model the run started from?"
        )
    settings = choose_settings(
        ckpt, cot, c_thought, n_latent, stage, max_latent_stage, thought_mode(ckpt, mode, wrapped, cot)
    )
    if sd[emb_key].is_floating_point():
        nn.Module.to(model, sd[emb_key].dtype)  # the checkpoint dtype (PreTrainedModel.to has narrower stubs)
    if base_rows != rows:
        model.resize_token_embeddings(rows, mean_resizing=False)
    try:
        fitted = fit_state_dict(model, sd, wrapper_emb)
    except CheckpointError as e:  # (named: the other refusals of the file name it)
        raise _error(f"{ckpt}: {e}") from None
    model.load_state_dict(fitted, strict=True)
    if cot:
        init_latent_rows(model, tokenizer, added)
    n_rows = input_embedding_weight(model).shape[0]
    lm = LatentLM(model, tokenizer, settings)
    if input_embedding_weight(lm.model).shape[0] != n_rows:  # LatentLM found a marker missing: a bug here
        raise _error("internal error: LatentLM added latent tokens to the converted tokenizer")
    lm.save_pretrained(out)
    return out


__all__ = ["OFFICIAL_TOKEN_ORDER", "THOUGHT_MODES", "coconut_settings", "import_coconut", "read_state_dict"]
