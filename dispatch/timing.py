"""The one CUDA-graph timer: the tuner's and every benchmark's.

A call captured in a CUDA graph and replayed costs its GPU time and nothing of the host's launch
overhead (~10 µs a launch, more than a decode kernel runs). Timed by CUDA events around whole
replays (a graph of several calls when one call is short, so the replay's own start-up is spread
over them), read once per replay:

    capture_graph(fn, warmup=3)     fn captured once, after ``warmup`` eager calls on a side stream
    replay_ms(graph, reps)          ms of each of ``reps`` replays
    graph_times_ms(fn, calls, reps) ms per call in each of ``reps`` replays of a graph of ``calls``
    graph_us(fn, reps=7)            the tuner's timer: median µs per call, ``calls`` chosen so that a
                                    replay spans ~1 ms of GPU time (at most 30)

CUDA only; a call that waits for the host somewhere cannot be captured (a RuntimeError from torch).
"""
from __future__ import annotations

import statistics

import torch


def capture_graph(fn, warmup: int = 3) -> torch.cuda.CUDAGraph:
    """``fn`` captured in a CUDA graph, after ``warmup`` eager calls on a side stream (allocations and
    compilation out of the way; a capture must not be the first call)."""
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


def replay_ms(graph: torch.cuda.CUDAGraph, reps: int) -> list[float]:
    """Milliseconds of each of ``reps`` replays of ``graph`` (CUDA events around each, synchronised)."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for _ in range(reps):
        a.record()
        graph.replay()
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b))
    return out


def graph_times_ms(fn, calls: int, reps: int, warmup: int = 1) -> list[float]:
    """Milliseconds per call of ``fn`` in each of ``reps`` replays of a graph of ``calls`` calls (replayed
    once first; ``warmup`` eager rounds of the ``calls`` calls before the capture)."""
    graph = capture_graph(lambda: [fn() for _ in range(calls)], warmup=warmup)
    graph.replay()
    out = [t / calls for t in replay_ms(graph, reps)]
    del graph
    return out


def graph_us(fn, cand=None, reps: int = 7) -> float:
    """Median µs of one call of ``fn`` over ``reps`` replays of a CUDA graph of up to 30 calls, as many
    as span ~1 ms of GPU time (the races' 30 for decode sizes). The GPU time of a call is read from a
    one-call graph: an eager call's time is the host's launch time (~0.2 ms for the decode path), which
    would leave every small candidate a one-call graph whose replay counts the graph's own start-up —
    a few µs that favour a one-launch kernel over a chain of three. ``cand``: the tuner's label of what
    ``fn`` runs (unused here; a hand-priced timer in the tests reads it)."""
    one_ms = graph_times_ms(fn, 1, 1)[0]
    calls = max(1, min(30, int(1.0 / max(one_ms, 1e-3))))
    return statistics.median(t * 1e3 for t in graph_times_ms(fn, calls, reps, warmup=0))
