"""Peak memory of one GRPO step, in a fresh process (``python -m dgrpo.bench.memprobe SPEC_JSON``).

One warm-up step first (one-time allocations: optimizer state, lazy imports, kernel caches), then the
measured step. CPU: freed heap is handed back to the OS (``malloc_trim``) and the resident-set
high-water mark is reset (``/proc/self/clear_refs``), so the peak is the measured step's alone;
``delta`` = peak - resident size just before the step. Where the reset is not allowed, ``ru_maxrss``
(the process's lifetime peak) is used and ``clean_peak`` is false. CUDA: ``max_memory_allocated``
after ``reset_peak_memory_stats``. Prints one JSON line.
"""

from __future__ import annotations

import gc
import json
import os
import resource
import subprocess
import sys
from typing import Any

#: the key in ``ctx.results`` of the probes run so far in a suite: {spec_key(spec): result}
PROBES = "memory_probes"


def status_kb(field: str, pid: int | str = "self") -> int:
    """A ``kB`` field (VmRSS, VmHWM, ...) of /proc/PID/status (Linux)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def malloc_trim() -> None:
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def probe(spec: dict) -> dict:
    import torch

    from ..training.grpo import GRPOTrainer
    from .workload import Shapes, add_lora, build_lm, grpo_config, task_records

    torch.set_num_threads(int(spec.get("threads", 2)))
    shapes = Shapes.from_json(spec["shapes"])
    device, dtype = torch.device(spec["device"]), getattr(torch, spec["dtype"])
    lm = build_lm(shapes, device, dtype)
    if spec.get("lora_r"):
        add_lora(lm, int(spec["lora_r"]))
    records = task_records(shapes.prompts)
    cfg = grpo_config(shapes, spec["K"], spec["T"], spec["kind"])
    cfg.grpo.recompute = bool(spec.get("recompute"))  # None / False: off; "call" / "layer" (True: "call")
    cfg.grpo.recompute_granularity = "layer" if spec.get("recompute") == "layer" else "call"
    cfg.grpo.recompute_latent_steps = bool(spec.get("recompute_latent_steps", True))
    cfg.grpo.micro_batch_size = int(spec.get("micro_batch_size", cfg.grpo.micro_batch_size))
    trainer = GRPOTrainer(lm, cfg, records)
    for _ in range(int(spec.get("warmup", 1))):
        trainer.step(prompts=records)
    gc.collect()
    malloc_trim()
    out: dict = {"spec": {k: v for k, v in spec.items() if k != "shapes"}}
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        trainer.step(prompts=records)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
        out.update(
            kind="cuda_allocated", before_bytes=before, peak_bytes=peak, delta_bytes=peak - before, clean_peak=True
        )
    else:
        clean = reset_peak_rss()
        before = status_kb("VmRSS") * 1024
        trainer.step(prompts=records)
        peak = status_kb("VmHWM") * 1024 if clean else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        out.update(kind="rss", before_bytes=before, peak_bytes=peak, delta_bytes=peak - before, clean_peak=clean)
    return out


def run_probe(
    ctx: Any, shapes: Any, K: int, T: int, kind: str = "locked", *, reuse: bool = False, **extra: Any
) -> dict:
    """Run :func:`probe` in a fresh process for ``shapes`` on ``ctx``'s device, dtype and threads (``extra``: more
    spec keys, e.g. ``lora_r``, ``recompute``, ``recompute_latent_steps``, ``micro_batch_size``); its JSON result.

    The first result of each spec is kept in ``ctx.results``; ``reuse``: return the kept one where a probe of the same
    spec already ran in this suite (the same measurement: item 9's full arm is item 5's locked run in --quick and on
    the GPU) instead of starting one more process."""
    spec = {
        "shapes": shapes.to_json(),
        "device": str(ctx.device),
        "dtype": str(ctx.dtype).replace("torch.", ""),
        "K": K,
        "T": T,
        "kind": kind,
        "threads": ctx.threads,
        "warmup": 1,
        **extra,
    }
    kept = ctx.results.setdefault(PROBES, {})
    key = spec_key(spec)
    if reuse and key in kept:
        return kept[key]
    proc = subprocess.run(
        [sys.executable, "-m", "dgrpo.bench.memprobe", json.dumps(spec)],
        capture_output=True,
        text=True,
        env=os.environ.copy(),
    )
    if proc.returncode != 0:
        what = ", ".join(f"{k}={v}" for k, v in {"kind": kind, "K": K, "T": T, **extra}.items())
        raise RuntimeError(f"memory probe failed ({what}):\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    kept.setdefault(key, result)
    return result


def spec_key(spec: dict) -> str:
    """What a probe measures, as a string: its spec, where ``lora_r`` 0 (no LoRA) is the same as no ``lora_r``."""
    return json.dumps({k: v for k, v in spec.items() if not (k == "lora_r" and not v)}, sort_keys=True)


def main() -> int:
    print(json.dumps(probe(json.loads(sys.argv[1]))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
