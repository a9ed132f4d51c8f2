"""The routing/sort benchmark checks ours against the twins, then times every (op, impl) pair."""
import dispatch  # noqa: F401  (first: the interpreter is on before triton loads)
from dispatch_book.bench.routing import measure


def test_measure_on_cpu_times_every_pair_after_checking():
    rows = measure("cpu", shapes=("olmoe-1b-7b",), tokens=(3,))
    assert {(r["T"], r["op"], r["impl"]) for r in rows} == {
        (3, op, impl) for op in ("route", "sort", "route+sort") for impl in ("ours", "torch")}
    assert all(r["median_ms"] > 0 and r["min_ms"] <= r["median_ms"] <= r["max_ms"] for r in rows)
    assert not any("graph" in r or "host_us" in r for r in rows), "CUDA-graph timings exist only on a GPU"
