"""The kernels benchmark times what it claims: every contestant computes the same layer."""
import pytest
import torch

import dispatch  # noqa: F401
from dispatch.config import PRESETS, MoEConfig, random_weights
from dispatch.reference import moe_reference, route_reference, router_logits
from dispatch_book.bench.kernels import contestants

CFGS = {"tiny": PRESETS["tiny"], "shared": MoEConfig(64, 32, 8, 2, shared_intermediate_size=48, family="deepseek_moe"),
        "shared_2I": MoEConfig(64, 32, 8, 2, shared_intermediate_size=64, family="deepseek_moe")}


@pytest.mark.parametrize("name", list(CFGS))
@pytest.mark.parametrize("T", [1, 5])
def test_every_contestant_matches_the_reference(name, T):
    cfg = CFGS[name]
    w = random_weights(cfg, seed=4)
    x_TH = torch.randn(T, cfg.H, generator=torch.Generator().manual_seed(5))
    weights_TK, ids_TK = route_reference(router_logits(x_TH, cfg, w), cfg)
    out = contestants(cfg, w, x_TH, weights_TK, ids_TK, torch.device("cpu"))
    assert {"hf_eager", "hf_grouped_mm", "ours_grouped", "ours_decode", "ours_no_pdl", "ours_no_tma",
            "ours_layer"} <= set(out)
    fused = out.get("ours_decode_shared", (None, "no shared expert"))
    assert (fused[1] is None) == (name == "shared_2I"), fused  # S = 2I: two whole experts, S = 48: none
    want = moe_reference(x_TH, cfg, w)
    for cname, (fn, reason) in out.items():
        if fn is None or reason is not None:
            continue
        torch.testing.assert_close(fn().float(), want, rtol=1e-5, atol=1e-5, msg=lambda m, c=cname: f"{c}: {m}")


@pytest.mark.parametrize("T,E,K,bm", [(1, 8, 2, 16), (9, 4, 2, 16), (20, 8, 3, 32)])
def test_peer_fused_moe_matches_the_reference(T, E, K, bm):
    from dispatch.reference import experts_reference
    from dispatch_book.bench import peers

    g = torch.Generator().manual_seed(T)
    H, I = 48, 40  # noqa: E741  (ragged tiles)
    x = torch.randn(T, H, generator=g)
    gate_up, down = torch.randn(E, 2 * I, H, generator=g) / H ** 0.5, torch.randn(E, H, I, generator=g) / I ** 0.5
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    w = torch.rand(T, K, generator=g)
    aligned = peers.align(ids, E, bm)
    sorted_ids, expert_ids, used = aligned
    assert int(used) % bm == 0 and sorted(sorted_ids[sorted_ids < T * K].tolist()) == list(range(T * K))
    y = peers.fused_moe(x, w, ids, gate_up, down, aligned, (bm, 32, 32, 2, 4, 1))
    torch.testing.assert_close(y, experts_reference(x, w, ids, gate_up, down), rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("T", [1, 64])
def test_gpu_peer_every_config(T):
    """Every config of the peer computes the layer (bf16): the race compares like with like."""
    import triton

    from dispatch import runtime
    from dispatch.reference import experts_reference
    from dispatch_book.bench import peers

    cfg, dt = PRESETS["olmoe-1b-7b"], runtime.compute_dtype()
    w = random_weights(cfg, dtype=dt, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(T, cfg.H, device="cuda", generator=g).to(dt)
    wts, ids = route_reference(torch.randn(T, cfg.E, device="cuda", generator=g), cfg)
    ref = experts_reference(x, wts.to(dt), ids, w.gate_up_E2IH, w.down_EHI).float()
    ran = 0
    for c in peers.CONFIGS:
        try:
            y = peers.fused_moe(x, wts, ids, w.gate_up_E2IH, w.down_EHI, peers.align(ids, cfg.E, c[0]), c)
        except triton.runtime.errors.OutOfResources:  # the race skips a config this GPU cannot hold
            continue
        assert ((y.float() - ref).norm() / ref.norm()).item() < 1e-2, c
        ran += 1
    assert ran >= len(peers.CONFIGS) - 2


def test_graph_rounds_interleaves_and_takes_the_median_of_rounds(monkeypatch):
    """Rounds are taken in turn (a drift lands on every contestant), host time once, median of medians."""
    from dispatch_book.bench import harness

    calls, times = [], {"a": iter([3.0, 1.0, 2.0]), "b": iter([5.0, 9.0, 4.0])}

    def fake(fn, host=True):
        calls.append((fn(), host))
        m = next(times[fn()])
        return {"median_ms": m, "min_ms": m - 0.5, "max_ms": m + 0.5, "samples": 7, "graph": True} | (
            {"host_us": 10.0} if host else {})

    monkeypatch.setattr(harness, "graph_7x30", fake)
    out = harness.graph_rounds({"a": lambda: "a", "b": lambda: "b"}, rounds=3)
    assert calls == [("a", True), ("b", True), ("a", False), ("b", False), ("a", False), ("b", False)]
    assert out["a"]["median_ms"] == 2.0 and out["b"]["median_ms"] == 5.0
    assert (out["a"]["min_ms"], out["a"]["max_ms"], out["a"]["samples"]) == (0.5, 3.5, 21)
    assert out["b"]["round_medians_ms"] == [5.0, 9.0, 4.0] and out["b"]["host_us"] == 10.0


def test_shared_as_experts_splits_the_shared_mlp_exactly():
    """n = S / I chunks of the shared SwiGLU, summed, are the shared expert (fp32, same inputs);
    S not a multiple of I is refused; a gated shared expert (Qwen2-MoE) never rides along."""
    from dispatch.moe import shared_rides_along
    from dispatch.reference import gated_expert, shared_as_experts, shared_reference

    cfg = CFGS["shared_2I"]
    w = random_weights(cfg, seed=7)
    x = torch.randn(5, cfg.H, generator=torch.Generator().manual_seed(8))
    gate_up, down = shared_as_experts(w.shared_gate_up_2SH, w.shared_down_HS, cfg.I)
    assert gate_up.shape == (2, 2 * cfg.I, cfg.H) and down.shape == (2, cfg.H, cfg.I)
    y = sum(gated_expert(x, gate_up[j], down[j]) for j in range(2))
    torch.testing.assert_close(y, shared_reference(x, cfg, w), rtol=1e-5, atol=1e-6)
    w48 = random_weights(CFGS["shared"], seed=7)
    with pytest.raises(ValueError, match="multiple of I"):
        shared_as_experts(w48.shared_gate_up_2SH, w48.shared_down_HS, CFGS["shared"].I)
    gated = MoEConfig(64, 32, 8, 2, shared_intermediate_size=64, shared_gate=True, family="qwen2_moe")
    assert shared_rides_along(cfg) and not shared_rides_along(CFGS["shared"]) and not shared_rides_along(gated)


def test_at_ceilings_rebases_the_percentages_only():
    from dispatch_book.bench.kernels import at_ceilings

    doc = {"ceilings": {"hbm_read_gbps": 100.0, "bf16_tflops": 10.0, "source": "sheet"},
           "rows": [{"median_ms": 2.0, "tflops": 5.0, "gbps": 50.0, "pct_peak_flops": 50.0, "pct_read_bw": 50.0,
                     "pct_hbm": 50.0}, {"contestant": "x", "skipped": "no"}]}
    got = at_ceilings(doc, {"hbm_read_gbps": 200.0, "bf16_tflops": 20.0, "source": "measured"})
    assert got["rows"][0] == {"median_ms": 2.0, "tflops": 5.0, "gbps": 50.0, "pct_peak_flops": 25.0,
                              "pct_read_bw": 25.0, "pct_hbm": 25.0}
    assert got["rows"][1] == doc["rows"][1] and doc["rows"][0]["pct_hbm"] == 50.0, "a copy, not in place"
    assert got["ceilings"]["source"] == "measured" and "sheet" in got["rebased"]
