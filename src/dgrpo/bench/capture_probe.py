"""Capturing CUDA graphs again and again while other work runs, to see whether that work ends a capture under way
(the CUDA test of the mask prefetch beside captures; bench/capture_beside_threads.py)."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch import Tensor

from ..model.fixed_shape import captured, on_side_stream


def capture_repeatedly(
    x: Tensor, keep_going: Callable[[], bool], graphs: list[torch.cuda.CUDAGraph], pause_s: float = 0.001
) -> None:
    """While ``keep_going()``: capture 100 matmuls of ``x`` ([n, n], CUDA) as a graph the way the fast engine
    captures (:func:`~dgrpo.model.fixed_shape.captured`: its side stream, ``CAPTURE_LOCK`` held, one shared pool),
    replay it and append it to ``graphs`` (kept: a shared pool must outlive each capture into it), then pause
    ``pause_s`` (a moment for another thread to take the lock). A capture that an outside call ended raises
    ("operation failed due to a previous error during capture"); ``graphs`` then holds those captured before it."""
    with on_side_stream():
        x @ x  # (the side stream's first matmul, outside any capture: cuBLAS' workspace for it)
    pool = torch.cuda.graph_pool_handle()
    while keep_going():
        graph = torch.cuda.CUDAGraph()
        with captured(graph, pool):
            y = x
            for _ in range(100):
                y = (y @ x).tanh()
        graph.replay()
        graphs.append(graph)
        time.sleep(pause_s)
    torch.cuda.synchronize()
