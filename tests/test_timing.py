"""The one CUDA-graph timer (dispatch.timing): nothing else in the library or the book's tooling
captures a graph to time it or reads CUDA events; on a GPU, it times what it is given."""
import pathlib
import re

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
# The engines capture their steps once per batch bucket to serve them, not to time them: the lean
# engine's decode step, the serving runner's mixed step, the speculative engine's verify step.
SERVING_GRAPHS = {"dispatch/engine/engine.py", "dispatch/serve/runner.py", "dispatch/serve/speculative.py"}
# The handoff bench's decode worker times its copy with events in its own process, inside the handoff
# (waits on the other process's event included): nothing there can be captured in a graph.
EVENT_SPANS = {"dispatch_book/bench/disagg_ipc.py"}


def test_graphs_are_captured_and_timed_in_one_place():
    found = {}
    for folder in ("dispatch", "dispatch_book"):
        for p in (ROOT / folder).rglob("*.py"):
            rel = p.relative_to(ROOT).as_posix()
            hits = re.findall(r"elapsed_time\(|CUDAGraph\(\)|torch\.cuda\.graph\(", p.read_text())
            if rel in EVENT_SPANS:
                hits = [h for h in hits if h != "elapsed_time("]
            if hits and rel not in SERVING_GRAPHS | {"dispatch/timing.py"}:
                found[rel] = hits
    assert found == {}


def test_the_tuner_and_the_harness_use_the_library_timer():
    from dispatch import timing
    from dispatch.tune import search
    from dispatch_book.bench import harness

    assert search.graph_us is timing.graph_us
    assert harness.capture_graph is timing.capture_graph


@pytest.mark.gpu
def test_graph_timer_times_a_known_amount_of_work():
    a = torch.randn(4096, 4096, device="cuda")
    small = timing_us(lambda: a.add_(1.0))
    large = timing_us(lambda: [a.add_(1.0) for _ in range(8)])
    assert 0 < small < large and large / small > 3


def timing_us(fn):
    from dispatch.timing import graph_times_ms, graph_us

    ts = graph_times_ms(fn, 3, 4)
    assert len(ts) == 4 and all(t > 0 for t in ts)
    return graph_us(fn)
