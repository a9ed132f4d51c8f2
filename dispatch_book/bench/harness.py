"""The one timing harness of every benchmark.

``time_ms(fn)`` returns the row fields every results file uses for a timing: ``median_ms``,
``min_ms``, ``max_ms`` and ``samples`` (the raw per-call milliseconds are summarised, never
rescaled). On CUDA it is ``triton.testing.do_bench`` (L2 flushed between calls, the host's launch
overhead included, as a user calling ``fn`` sees it); ``graph=True`` captures ``fn`` once in a CUDA
graph and times the graph's replays instead, which removes the launch overhead — a caller that
wants the host overhead reports the difference of the two. On the CPU it is the wall clock.

``graph_7x30(fn)`` is the races' timer (kernels, quant, routing): a graph of 30 calls replayed 7
times, plus the host time of one eager call; ``graph_rounds(fns)`` takes it in interleaved rounds.
The graphs are captured and timed by the library's one CUDA-graph timer (:mod:`dispatch.timing`).
"""
from __future__ import annotations

import statistics
import time

import torch

from dispatch.reference import rel_err  # noqa: F401  (the benchmarks' correctness gate, re-exported)
from dispatch.timing import capture_graph, graph_times_ms


def _cuda() -> bool:
    return torch.cuda.is_available()


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


def graph_7x30(fn, host: bool = True) -> dict:
    """CUDA-graph replay timing: a graph of 30 calls, replayed 7 times; median µs per call. Plus the host
    time of one eager call (launch overhead a graph removes), median of 30 (``host=False`` skips it)."""
    fn()  # compile and warm before the host timing
    host_ts = []
    for _ in range(30 if host else 0):
        t0 = time.perf_counter()
        fn()
        host_ts.append((time.perf_counter() - t0) * 1e6)
    ts = graph_times_ms(fn, 30, 7)
    out = {"median_ms": statistics.median(ts), "min_ms": min(ts), "max_ms": max(ts), "samples": 7, "graph": True}
    return out | ({"host_us": statistics.median(host_ts)} if host else {})


def graph_rounds(fns: dict, rounds: int) -> dict:
    """name -> timing of each fn, ``rounds`` rounds of :func:`graph_7x30` taken in turn (A B C, A B C, ...):
    a clock or power drift during the run then lands on every contestant alike, not on whichever is
    timed first. median_ms is the median of the rounds' medians; min/max over all 7·rounds replays."""
    per = {name: [] for name in fns}
    for r in range(rounds):
        for name, fn in fns.items():
            per[name].append(graph_7x30(fn, host=r == 0))
    return {name: {"median_ms": statistics.median(t["median_ms"] for t in ts),
                   "min_ms": min(t["min_ms"] for t in ts), "max_ms": max(t["max_ms"] for t in ts),
                   "samples": 7 * len(ts), "graph": True, "host_us": ts[0]["host_us"],
                   "round_medians_ms": [t["median_ms"] for t in ts]} for name, ts in per.items()}
