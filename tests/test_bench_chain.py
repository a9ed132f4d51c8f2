"""The chain suite (the decode path's launches timed as they add up): its prefixes are the real
chain, the up-only prefix skips exactly the down launch, and the rows price each prefix by its bytes."""
import pytest
import torch

import dispatch  # noqa: F401  (first: runtime decisions)
from dispatch.kernels import gemv
from dispatch.kernels.combine import combine_impl
from dispatch.reference import experts_reference
from dispatch.tune.search import make_case
from dispatch_book.bench import chain

CPU = torch.device("cpu")


def test_prefixes_are_the_chain():
    _, w, x, wt, ids = make_case("tiny", 3, CPU, torch.float32)
    run = chain.stages(w, x, wt, ids)
    ref = experts_reference(x, wt, ids, w.gate_up_E2IH, w.down_EHI)
    torch.testing.assert_close(run["whole"](), ref, atol=1e-5, rtol=1e-4)
    rows = run["up_down"]()  # the rows the combine adds: the whole path less its last launch
    torch.testing.assert_close(combine_impl(rows, ids.shape[1], ids, w.gate_up_E2IH.shape[0], x.dtype), ref,
                               atol=1e-5, rtol=1e-4)


def test_up_only_skips_the_down_launch_and_restores_it():
    _, w, x, wt, ids = make_case("tiny", 2, CPU, torch.float32)
    down = gemv._down_kernel
    launched = []
    with chain.up_only():
        assert isinstance(gemv._down_kernel, chain._NoLaunch)
        up = gemv._up_swiglu_kernel
        gemv._up_swiglu_kernel = type("Spy", (), {"__getitem__": lambda s, g: lambda *a, **k: launched.append(g)})()
        try:
            chain.stages(w, x, wt, ids)["up_down"]()
        finally:
            gemv._up_swiglu_kernel = up
    assert len(launched) == 1 and gemv._down_kernel is down
    with pytest.raises(RuntimeError), chain.up_only():  # restored on an error too
        raise RuntimeError
    assert gemv._down_kernel is down


def test_measure_prices_each_prefix_by_its_bytes(monkeypatch):
    monkeypatch.setattr(chain.runtime, "num_sms", lambda dev: 2)
    monkeypatch.setattr(chain.reads, "CONFIGS", ((1, 64, 1, 1),))

    def timer(fn):  # a fake clock: 2 ms a call, after running it
        fn()
        return {"median_ms": 2.0}

    (row,) = chain.measure(CPU, 1.0, shapes=("tiny",), tokens=(1,), dtype=torch.float32, timer=timer,
                           log=lambda *_: None)
    assert set(row["us"]) == {"up", "up_down", "whole", "stream_up", "stream_all"}
    used, (H, I) = row["experts_read"], (64, 32)  # the tiny preset: K = 2 of E = 8, H = 64, I = 32
    assert row["bytes"] == {"up": used * 2 * H * I * 4, "all": used * 3 * H * I * 4} and used == 2
    assert row["pct_read"]["up"] == pytest.approx(100 * row["bytes"]["up"] / 2e-3 / 1e9)
    assert row["pct_read"]["whole"] == pytest.approx(100 * row["bytes"]["all"] / 2e-3 / 1e9)
