"""The step-kernels bench's invariant rows on a CPU (Triton's interpreter, fp32, a small weight):
every candidate config computes the projection (rel err ≤ 1e-2 or the row says why not) and the
fastest is named. Timing is faked: the bench times CUDA graphs."""
import torch

from dispatch_book import bench
from dispatch_book.bench import step_kernels


def test_invariant_projection_rows(monkeypatch):
    monkeypatch.setattr(step_kernels, "PROJECTIONS", {"small": (40, 96)})
    monkeypatch.setattr(step_kernels, "INVARIANT_ROWS", (1, 20))
    ticks = iter(range(1, 1000))
    monkeypatch.setattr(bench, "time_ms", lambda fn, graph=False: {"median_ms": next(ticks) / 1e3})
    rows = step_kernels.invariant_projections(torch.device("cpu"), torch.float32)
    for M in (1, 20):
        mine = [r for r in rows if r["shape"] == f"small [40, 96] M={M}"]
        assert [r["contestant"] for r in mine[:2]] == ["ours" if M == 1 else "cublas", "invariant"]
        assert len(mine) > 4 and all(r["kind"] == "invariant_projection" for r in mine)
        assert all(r["rel_err"] <= 1e-2 and "error" not in r for r in mine), [r for r in mine if "error" in r]
        assert all("block_n=" in r["config"] and "block_n=4," not in r["config"] for r in mine[1:])  # 16+ rows
