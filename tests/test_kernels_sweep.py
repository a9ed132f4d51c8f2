"""The tile sweep's rows on CPU (Triton's interpreter, fp32, the tiny preset, two small configs,
wall-clock timing in place of CUDA graphs): every config checked against the first, every kernel
and stage timed, TFLOP/s from the kernel's own GEMM."""
import torch

from dispatch.config import PRESETS
from dispatch.kernels.tiles import GemmConfig
from dispatch_book import bench
from dispatch_book.bench import kernels_sweep


def test_sweep_rows_on_cpu(monkeypatch):
    monkeypatch.setattr(kernels_sweep, "CONFIGS", (GemmConfig(16, 16, 16, 4, 1), GemmConfig(32, 32, 16, 4, 1)))
    monkeypatch.setattr(kernels_sweep, "_timed", lambda fn: bench.time_ms(fn, warmup=1, rep=3))
    rows = kernels_sweep.measure("tiny", 5, torch.device("cpu"), torch.float32)
    kinds = [r["kernel"] for r in rows]
    assert kinds == ["up", "down", "up", "down", "sort", "moe_experts", "combine"]
    cfg = PRESETS["tiny"]
    for r in rows[:4]:
        assert r["rel_err"] <= kernels_sweep.TOLERANCE and "error" not in r
        per_row = (4 if r["kernel"] == "up" else 2) * cfg.H * cfg.I  # 2·2I·H or 2·H·I FLOPs a routed row
        assert abs(r["tflops"] * 1e12 * r["median_ms"] * 1e-3 - per_row * 5 * cfg.K) < 1e-3 * per_row
    assert rows[2]["config"] == [32, 32, 16, 4, 1]
    assert all(r["median_ms"] > 0 for r in rows)
