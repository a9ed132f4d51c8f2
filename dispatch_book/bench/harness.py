"""The one timing harness of every benchmark.

``time_ms(fn)`` returns the row fields every results file uses for a timing: ``median_ms``,
``min_ms``, ``max_ms`` and ``samples`` (the raw per-call milliseconds are summarised, never
rescaled). On CUDA it is ``triton.testing.do_bench`` (L2 flushed between calls, the host's launch
overhead included, as a user calling ``fn`` sees it); ``graph=True`` captures ``fn`` once in a CUDA
graph and times the graph's replays instead, which removes the launch overhead — a caller that
wants the host overhead reports the difference of the two. On the CPU it is the wall clock.
"""
from __future__ import annotations

import statistics
import time

import torch

from dispatch.reference import rel_err  # noqa: F401  (the benchmarks' correctness gate, re-exported)


def _cuda() -> bool:
    return torch.cuda.is_available()


def capture_graph(fn, warmup: int = 3) -> torch.cuda.CUDAGraph:
    """``fn`` captured in a CUDA graph (after ``warmup`` eager calls on a side stream)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize()
    return graph


def time_ms(fn, graph: bool = False, *, warmup: int = 10, rep: int = 50) -> dict:
    """Median, min and max milliseconds of one call of ``fn`` on the current device.

    ``graph=True`` (CUDA only) times replays of ``fn`` captured in a CUDA graph. ``warmup`` and
    ``rep`` are the number of calls on the CPU and twice as many milliseconds for ``do_bench``.
    """
    if graph and not _cuda():
        raise ValueError("time_ms(graph=True) captures a CUDA graph: it needs a CUDA device")
    if _cuda():
        import triton.testing

        target = capture_graph(fn).replay if graph else fn
        ts = sorted(triton.testing.do_bench(target, warmup=warmup * 2, rep=rep * 2, return_mode="all"))
    else:
        for _ in range(min(warmup, 3)):
            fn()
        ts = []
        for _ in range(max(3, min(rep, 20))):
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e3)
        ts.sort()
    return {"median_ms": statistics.median(ts), "min_ms": ts[0], "max_ms": ts[-1], "samples": len(ts)}


