"""The quant benchmark's measuring loop on CPU (tiny shape, wall-clock timer): every contestant is
checked against its twin and gets the fields the chapter reads; nothing is timed for a verdict."""
import pytest
import torch

from dispatch_book.bench import quant as qb


def test_measure_rows_on_tiny():
    def once(fn):
        fn()
        return {"median_ms": 1.0, "min_ms": 1.0, "max_ms": 1.0, "samples": 1}

    rows, memory = qb.measure("tiny", (2, 80), torch.device("cpu"), 1e12, timer=once, log=lambda *_: None)
    assert [r["path"] for r in rows] == ["decode", "grouped"]
    w8a8 = {"fp8-block128+w8a8", "fp8-channel+w8a8"}  # decode and grouped, on fp8 activations
    fp16 = {"fp8-block128+fp16", "fp8-channel+fp16"}  # decode only: fp8 codes beside fp16 activations
    assert set(rows[0]["contestants"]) == {"bf16", "hf_fp8", *qb.quant.SCHEMES} | w8a8 | fp16
    assert w8a8 <= set(rows[1]["contestants"]) and not fp16 & set(rows[1]["contestants"])
    for r in rows:
        # transformers' fp8 experts fetch their kernels from the Hub: here the reason is recorded
        assert "kernel" in r["contestants"].pop("hf_fp8")["skipped"]
        for name, c in r["contestants"].items():
            assert c["bytes_read"] > 0 and c["speedup_vs_bf16"] == 1.0
            if name != "bf16":  # fp16 activations: h rounded to fp16 in the kernels, kept in fp32 by the twin
                assert c["rel_err_twin"] < (2e-3 if name.endswith("+fp16") else 1e-5), (name, c)
                assert c["bytes_read"] < r["contestants"]["bf16"]["bytes_read"]
    assert all(0.5 <= m["ratio"] < 0.55 for m in memory)


def test_measure_honours_the_quick_schemes():
    def once(fn):
        fn()
        return {"median_ms": 1.0, "min_ms": 1.0, "max_ms": 1.0, "samples": 1}

    rows, memory = qb.measure("tiny", (80,), torch.device("cpu"), 1e12, timer=once, log=lambda *_: None,
                              schemes=qb.QUICK_SCHEMES)
    assert set(rows[0]["contestants"]) == {"bf16", "int8-channel", "fp8-block128", "fp8-block128+w8a8",
                                           "fp8-block128+w8a8 no TMA", "fp8-channel", "fp8-channel+w8a8",
                                           "fp8-channel+w8a8 no TMA", "hf_fp8"}
    assert [m["scheme"] for m in memory] == list(qb.QUICK_SCHEMES)
    assert set(qb.QUICK_SHAPES) <= set(qb.SHAPES) and {1, 8, 64, 4096, 16384} == set(qb.QUICK_TOKENS)


def test_transformers_fp8_experts_hold_our_codes(monkeypatch):
    """The hf_fp8 contestant's wiring, with transformers' fp8 linear replaced by its own dequantize
    + F.linear (its real kernels come from the Hub): the module then computes our weight-only twin."""
    import transformers.integrations.finegrained_fp8 as tf8

    from dispatch import quant
    from dispatch.config import MoEConfig, random_weights
    from dispatch.kernels.quant_grouped import moe_experts_quant_torch
    from dispatch.reference import route_reference
    from dispatch_book.bench import hf_baselines

    def dequant_linear(x, w, s, block_size, bias=None, activation_scale=None, *args):
        return torch.nn.functional.linear(x, tf8._dequantize_fp8_weight(w.clone(), s, block_size, x.dtype))

    monkeypatch.setattr(tf8, "fp8_linear", dequant_linear)
    cfg = MoEConfig(256, 160, 8, 2)  # two 128-blocks along H, gate and up sharing one along 2I
    w = random_weights(cfg, seed=0)
    qe = quant.quantize_experts(w.gate_up_E2IH, w.down_EHI, "fp8-block128")
    g = torch.Generator().manual_seed(1)
    x = torch.randn(12, cfg.H, generator=g)
    w_TK, ids = route_reference(torch.randn(12, cfg.E, generator=g), cfg)
    with torch.no_grad():
        y = hf_baselines.fp8_experts(qe)(x, ids, w_TK)
    want = moe_experts_quant_torch(x, w_TK, ids, qe)
    assert ((y - want).norm() / want.norm()).item() < 1e-5
    with pytest.raises(ValueError, match="fp8-block128"):
        hf_baselines.fp8_experts(quant.quantize_experts(w.gate_up_E2IH, w.down_EHI, "fp8-channel"))
