"""Which work on a host thread ends a CUDA graph capture under way on the main thread (CUDA only).

    python bench/capture_beside_threads.py                 # every case, each in its own process
    python bench/capture_beside_threads.py pin_unlocked    # one case, in this process

The main thread captures up to ``--captures`` small graphs (100 matmuls each, into one shared pool, on the side
stream the fast engine captures on: ``dgrpo.model.fixed_shape.captured``) while a thread works without pause; a
capture that an outside call ended raises ("operation failed due to a previous error during capture"). The cases:

* ``none``: no thread (the loop alone);
* ``cpu``: the thread draws locked-dropout keep-masks on the host only;
* ``pin_locked``: draws, then pins them (``cudaHostAlloc`` for a new size) under ``CAPTURE_LOCK``;
* ``pin_unlocked``: draws and pins without the lock (the case the lock exists for);
* ``lock_all``: draws and pins, all of it under the lock (what ``LockedDropout.prefetch`` does);
* ``empty_pinned``: allocates pinned memory under the lock, nothing else;
* ``copy_into_pinned``: copies its draws into pinned buffers allocated beforehand (no CUDA call at all).

Each case prints one line, ``<case>: OK <n> captures, thread iterations <m>`` or ``<case>: FAIL after <n> captures,
...: <error>``. bench/RESULTS.md (the paper-scale step, calls 8-10) has a run on an H200.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from dgrpo.bench.capture_probe import capture_repeatedly  # noqa: E402
from dgrpo.model.fixed_shape import CAPTURE_LOCK  # noqa: E402
from dgrpo.model.verified import one_line  # noqa: E402
from dgrpo.perturbation.locked import keep_rows  # noqa: E402

CASES = ["none", "cpu", "pin_locked", "pin_unlocked", "lock_all", "empty_pinned", "copy_into_pinned"]


def thread_work(case: str, held: list[torch.Tensor]) -> Callable[[int], None]:
    """The thread's ``i``-th piece of work in ``case``: a draw of 64-1024 rows x 4 sites x ~512 units (a new width
    each time, so that pinning meets new sizes), pinned or not; ``held`` keeps the pinned results a while (freed
    four at a time, under the lock where the case locks)."""

    def draw(i: int) -> torch.Tensor:
        rows = 64 * (1 + i % 16)
        return keep_rows(torch.arange(10_000 * i, 10_000 * i + rows), 4, 512 + i % 64, 0.3)

    def free_some() -> None:
        if len(held) > 8:
            del held[:4]

    def work(i: int) -> None:
        if case == "cpu":
            draw(i)
        elif case == "pin_locked":
            keep = draw(i)
            with CAPTURE_LOCK:
                held.append(keep.pin_memory())
                free_some()
        elif case == "pin_unlocked":
            held.append(draw(i).pin_memory())
            free_some()
        elif case == "lock_all":
            with CAPTURE_LOCK:
                held.append(draw(i).pin_memory())
                free_some()
        elif case == "empty_pinned":
            with CAPTURE_LOCK:
                held.append(torch.empty(64 * (1 + i % 16) * 4 * 576, dtype=torch.bool, pin_memory=True))
                free_some()
        elif case == "copy_into_pinned":
            keep = draw(i).flatten()
            held[i % len(held)][: keep.numel()].copy_(keep)

    return work


def run_case(case: str, max_captures: int, seconds: float) -> bool:
    """Capture while the thread works; print the case's line; True when every capture ended whole."""
    held: list[torch.Tensor] = []
    if case == "copy_into_pinned":
        held.extend(torch.empty(1024 * 4 * 576, dtype=torch.bool, pin_memory=True) for _ in range(4))
    work, stop, done = thread_work(case, held), threading.Event(), [0]

    def loop() -> None:
        while not stop.is_set():
            work(done[0])
            done[0] += 1

    thread = None if case == "none" else threading.Thread(target=loop, daemon=True)
    if thread is not None:
        thread.start()
    graphs: list[torch.cuda.CUDAGraph] = []
    deadline = time.monotonic() + seconds
    try:
        x = torch.randn(256, 256, device="cuda")
        capture_repeatedly(x, lambda: len(graphs) < max_captures and time.monotonic() < deadline, graphs)
        print(f"{case}: OK {len(graphs)} captures, thread iterations {done[0]}", flush=True)
        return True
    except RuntimeError as e:
        print(f"{case}: FAIL after {len(graphs)} captures, thread iterations {done[0]}: {one_line(e)}", flush=True)
        return False
    finally:
        stop.set()
        if thread is not None:
            thread.join(timeout=10)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("case", nargs="?", choices=CASES, help="one case in this process (default: every case)")
    ap.add_argument("--captures", type=int, default=400, help="captures per case at most")
    ap.add_argument("--seconds", type=float, default=20.0, help="seconds per case at most")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("capture_beside_threads: needs a CUDA device", file=sys.stderr)
        return 2
    if args.case:
        return 0 if run_case(args.case, args.captures, args.seconds) else 1
    # each case in its own process: after a capture ended from outside, the process's CUDA state is not to be trusted
    extra = ["--captures", str(args.captures), "--seconds", str(args.seconds)]
    for case in CASES:
        subprocess.run([sys.executable, __file__, case, *extra], check=False, timeout=args.seconds + 120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
