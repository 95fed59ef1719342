"""What a training run applied, as resolved at run time: ``OUT/applied.json`` and ``summary.json``'s ``applied``.

``config.json`` records what was asked. Some options resolve to something else where they do not apply, with a
warning that scrolls away: ``grpo.optimizer=adamw8bit`` runs torch AdamW off CUDA (or without bitsandbytes),
``model.kernels=liger`` runs Hugging Face's modules off CUDA, ``fsdp`` is ignored in one process, ``grpo.engine``,
``grpo.update_latent_graphs``, ``model.compile_head`` and ``model.pack_gqa`` resolve ``auto`` by the device,
``grpo.keep_graphs`` applies to the fast engine only. :func:`applied_settings` reads what the trainer built (its
optimizer, its resolved engine and kernels, the model's compiled step and attention): no second resolution here.

Each process that starts or resumes a run appends its settings to ``applied.json`` with the step it started at
(another machine may resolve them otherwise); a resume drops the entries of the steps it abandons (a rewind). A
process that finishes the run writes its entry again, as at the end: what changed within (a compiler's fallback:
``compile_head`` false, ``compile_fallbacks`` the compiled layers' calls run eagerly past dynamo's recompile limit);
so does one that stops it after a step (a SIGTERM, a non-finite or stalled stop:
:meth:`~dgrpo.training.run.RunDir.stop_after_step`).
"""

from __future__ import annotations

import json
import platform
import warnings
from collections.abc import Iterable
from importlib.metadata import version
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..model.gqa_attention import PACKED_GQA
from ..model.latent_lm import LatentLM
from ..model.verified import write_text_atomically
from ..plugins import source_hashes
from .distributed import Dist
from .master_weights import MasterWeightAdamW
from .resume_check import START_OVER
from .wording import in_command_line


def optimizer_name(opt: torch.optim.Optimizer) -> str:
    """The optimizer's class by its module and name (``torch.optim.adamw.AdamW``, ``bitsandbytes...AdamW8bit``)."""
    kind = type(opt)
    return f"{kind.__module__}.{kind.__qualname__}"


def fsdp_applied(dist: Dist) -> str:
    """``fsdp`` as the processes run it: ``none`` (one process ignores it), ``full`` or ``sharded``."""
    return dist.checkpoint if dist.fsdp else "none"


def weight_dtype(model: nn.Module) -> str:
    """The dtype of the model's first trained weight (of its first weight when none trains): ``bfloat16``."""
    params = list(model.parameters())
    trained = [p for p in params if p.requires_grad] or params
    return str(trained[0].dtype).removeprefix("torch.") if trained else "none"


def versions() -> dict[str, str]:
    """The versions that ran: Python, dgrpo, torch (with its CUDA), transformers."""
    import transformers

    out = {"python": platform.python_version(), "dgrpo": version("dgrpo"), "torch": torch.__version__}
    if torch.version.cuda:
        out["cuda"] = torch.version.cuda
    out["transformers"] = transformers.__version__
    return out


def applied_settings(
    lm: LatentLM,
    dist: Dist,
    opt: torch.optim.Optimizer,
    *,
    kernels: str,
    plugins: Iterable[str] = (),
    **resolved: Any,
) -> dict[str, Any]:
    """What a trainer runs with, read from what it built: the device and processes, ``fsdp``, the optimizer's class
    and whether it keeps float32 masters, the weights' dtype, the fused ``kernels`` it applied, the compiled layers
    and head, the packed attention, ``resolved`` (a trainer's own: GRPO's engine, kept graphs, latent chain), the
    hashes of the files of the ``plugins`` specs it runs (its reward, its scorer, its perturbation kind: a resume
    after an edit is told, :func:`warn_if_plugins_changed`), and the versions."""
    device = lm.device
    out: dict[str, Any] = {"device": device.type}
    if device.type == "cuda":
        out["device_name"] = torch.cuda.get_device_name(device)
    out.update(
        processes=dist.world_size,
        fsdp=fsdp_applied(dist),
        optimizer=optimizer_name(opt),
        # (over bf16 weights: float32 masters; over float32 weights the same steps as torch AdamW)
        master_weights=isinstance(opt, MasterWeightAdamW),
        dtype=weight_dtype(lm.model),
        kernels=kernels,
        compile=lm.compiled_layers is not None,
        # (the compiled layers' calls run eagerly: dynamo's recompile limit reached; counted from the process's start)
        compile_fallbacks=lm.compiled_layers.fallbacks if lm.compiled_layers is not None else 0,
        compile_head=lm.head_stats.compiled,  # (false again should its compiler have failed)
        pack_gqa=getattr(lm.model.config, "_attn_implementation", None) == PACKED_GQA,
        **resolved,
        plugin_files=source_hashes(plugins),
        versions=versions(),
    )
    return out


def record_applied(path: Path, step: int, applied: dict[str, Any]) -> None:
    """Append ``applied`` as the entry of a process that started at ``step`` to ``path`` (``applied.json``: a list,
    oldest first), dropping the entries of steps it abandons (started at ``step`` or later: a rewind, or a resume of
    a process that wrote no checkpoint). An unreadable file is replaced, with a warning. Written whole or not at all
    (a temporary file, then renamed): a stop within the write (its rewrite at a SIGTERM's stop) keeps the entries."""
    kept = _entries_before(path, step)
    write_text_atomically(path, json.dumps([*kept, {"started_at_step": step, **applied}], indent=2) + "\n")


def warn_if_plugins_changed(path: Path, step: int, applied: dict[str, Any]) -> None:
    """Warn, one line per file, when a plug-in file ``applied`` records (``plugin_files``) has contents other than at
    the previous start recorded in ``applied.json`` at ``path`` (before ``step``): a config names a reward by its
    path, so a resume after an edit of the file would train on another reward without a word. (An unreadable file is
    :func:`record_applied`'s to warn about, once: it is read right after.) A new run is named as the caller starts
    one (:func:`~.wording.in_command_line`)."""
    before = _entries_before(path, step, warn=False)
    recorded = before[-1].get("plugin_files") if before else None
    if not isinstance(recorded, dict):  # (a new run, or one recorded before plugin_files)
        return
    new_run = START_OVER[0] if in_command_line() else START_OVER[1]
    for file, digest in applied.get("plugin_files", {}).items():
        if recorded.get(file, digest) != digest:
            warnings.warn(
                f"{file} changed since this run's start at step {before[-1].get('started_at_step')}: the steps from "
                f"{step} use the file as it is now; restore it to resume on the same code, or start a new run "
                f"({new_run})",
                stacklevel=2,
            )


def _entries_before(path: Path, step: int, warn: bool = True) -> list[dict]:
    """The entries of ``applied.json`` at ``path`` of processes that started before ``step`` (those a resume at
    ``step`` keeps)."""
    return [e for e in _entries(path, warn) if isinstance(e, dict) and e.get("started_at_step", step) < step]


def _entries(path: Path, warn: bool = True) -> list:
    """The entries of ``applied.json`` at ``path``: none without the file; none, with a warning (``warn``), for one
    that is not a JSON list."""
    if not path.is_file():
        return []
    try:
        entries = json.loads(path.read_text())
    except ValueError:
        entries = None
    if isinstance(entries, list):
        return entries
    if warn:
        warnings.warn(f"{path} is not a list of applied settings: written anew", stacklevel=3)
    return []
