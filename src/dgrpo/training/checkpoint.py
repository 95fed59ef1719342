"""Atomic, verifiable training checkpoints and everything a resumed run needs to continue bit-exactly.

A checkpoint is a directory ``OUT/checkpoints/step-00000123/`` holding:
  ``model/``            the policy, ``save_pretrained`` (safetensors, tokenizer, latent_config.json)
  ``<name>.safetensors`` extra models' weights (the GRPO reference model)
  ``optimizer.pt``      optimizer state (tensors and numbers only: loaded with ``weights_only=True``)
  ``rng.pt``            torch CPU/CUDA generator states (tensors, ``weights_only=True``)
  ``state.json``        counters, Python/NumPy RNG states, EMA baseline, best record, data position ...
  ``manifest.json``     sha256 of every file above, written last
It is written to ``.tmp-step-...`` and renamed into place, so a kill mid-write leaves no directory
that looks complete; a directory whose manifest is missing or whose checksums do not match is
skipped with a message, falling back to the previous checkpoint. Nothing is ever unpickled.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_model

CKPT_DIR = "checkpoints"
MANIFEST = "manifest.json"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def capture_rng() -> tuple[dict, dict[str, torch.Tensor]]:
    """(JSON-able Python/NumPy states, tensor states of torch's generators)."""
    py = random.getstate()
    np_state: Any = np.random.get_state()
    js: dict[str, list] = {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
    }
    tensors = {"torch_cpu": torch.random.get_rng_state()}
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"torch_cuda_{i}"] = s
    return js, tensors


def restore_rng(js: dict, tensors: dict[str, torch.Tensor]) -> None:
    v, state, gauss = js["python"]
    random.setstate((v, tuple(state), gauss))
    name, keys, pos, has_gauss, cached = js["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.random.set_rng_state(tensors["torch_cpu"])
    if torch.cuda.is_available():
        states = [tensors[k] for k in sorted(tensors) if k.startswith("torch_cuda_")]
        if states:
            torch.cuda.set_rng_state_all(states)


def save_checkpoint(
    out_dir: Path,
    step: int,
    *,
    lm,
    optimizer: torch.optim.Optimizer,
    state: dict[str, Any],
    extra_models: dict[str, torch.nn.Module] | None = None,
    tensors: dict[str, torch.Tensor] | None = None,
    keep_last: int = 2,
) -> Path:
    """Write ``checkpoints/step-<step>`` atomically and prune to the ``keep_last`` newest.

    ``tensors``: extra tensor state (e.g. a sampling generator's state), stored beside the RNG states."""
    root = Path(out_dir) / CKPT_DIR
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:08d}"
    tmp = root / f".tmp-step-{step:08d}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    lm.save_pretrained(tmp / "model")
    for name, model in (extra_models or {}).items():
        save_model(model, str(tmp / f"{name}.safetensors"))  # handles tied (shared) tensors
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    rng_js, rng_t = capture_rng()
    torch.save({**rng_t, **{f"extra/{k}": v for k, v in (tensors or {}).items()}}, tmp / "rng.pt")
    if os.environ.get("DGRPO_TEST_CRASH_IN_CHECKPOINT") == str(step):  # test hook: die mid-write
        os.kill(os.getpid(), 9)
    (tmp / "state.json").write_text(json.dumps({**state, "step": step, "rng": rng_js}))
    files = sorted(p for p in tmp.rglob("*") if p.is_file())
    manifest = {str(p.relative_to(tmp)): _sha256(p) for p in files}
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
    _fsync_dir(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(root)
    for old in list_checkpoints(out_dir)[:-keep_last] if keep_last > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def list_checkpoints(out_dir: Path) -> list[Path]:
    root = Path(out_dir) / CKPT_DIR
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith("step-"))


def verify(ckpt: Path) -> str | None:
    """None when the checkpoint is complete and intact, else what is wrong."""
    man = ckpt / MANIFEST
    if not man.is_file():
        return "no manifest (incomplete write)"
    try:
        manifest = json.loads(man.read_text())
    except ValueError:
        return "unreadable manifest"
    for rel, digest in manifest.items():
        p = ckpt / rel
        if not p.is_file():
            return f"missing file {rel}"
        if _sha256(p) != digest:
            return f"checksum mismatch in {rel}"
    return None


def latest_checkpoint(out_dir: Path, log=None) -> Path | None:
    """The newest intact checkpoint; corrupted or incomplete ones are reported and skipped."""
    log = log or (lambda m: print(m, file=sys.stderr))
    for ckpt in reversed(list_checkpoints(out_dir)):
        problem = verify(ckpt)
        if problem is None:
            return ckpt
        log(f"dgrpo: skipping checkpoint {ckpt}: {problem}; falling back to the previous one")
    return None


def load_checkpoint(
    ckpt: Path,
    *,
    lm,
    optimizer: torch.optim.Optimizer,
    extra_models: dict[str, torch.nn.Module] | None = None,
    restore_rngs: bool = True,
) -> dict[str, Any]:
    """Load weights (safetensors), optimizer and RNG states (``weights_only=True``); return state.json."""
    from safetensors.torch import load_model as _load_into

    _load_into(lm.model, str(ckpt / "model" / "model.safetensors"), strict=False)
    for name, model in (extra_models or {}).items():
        _load_into(model, str(ckpt / f"{name}.safetensors"))
    optimizer.load_state_dict(torch.load(ckpt / "optimizer.pt", weights_only=True, map_location=lm.device))
    state = json.loads((ckpt / "state.json").read_text())
    saved = torch.load(ckpt / "rng.pt", weights_only=True)
    if restore_rngs:
        restore_rng(state["rng"], {k: v for k, v in saved.items() if not k.startswith("extra/")})
    state["tensors"] = {k[len("extra/") :]: v for k, v in saved.items() if k.startswith("extra/")}
    return state


def count_lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.is_file() else 0


def reset_metrics(path: Path, keep_lines: int | None) -> None:
    """Before a run appends to its metrics file: resuming, keep the ``keep_lines`` rows of the checkpoint
    (:func:`truncate_metrics`); a fresh run (``None``) removes the rows of an earlier run."""
    if keep_lines is None:
        path.unlink(missing_ok=True)
    else:
        truncate_metrics(path, keep_lines)


def truncate_metrics(path: Path, n_lines: int) -> None:
    """Keep the first ``n_lines`` rows (those written before the checkpoint being resumed): rows a dead
    run wrote after its last checkpoint are dropped, so the resumed file has no duplicate or missing step."""
    if not path.is_file():
        return
    lines = path.read_text().splitlines()[:n_lines]
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(x + "\n" for x in lines))
    os.replace(tmp, path)
