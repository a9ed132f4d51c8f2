"""The quant benchmark's measuring loop on CPU (tiny shape, wall-clock timer): every contestant is
checked against its twin and gets the fields the chapter reads; nothing is timed for a verdict."""
import torch

from dispatch_book.bench import quant as qb


def test_measure_rows_on_tiny():
    def once(fn):
        fn()
        return {"median_ms": 1.0, "min_ms": 1.0, "max_ms": 1.0, "samples": 1}

    rows, memory = qb.measure("tiny", (2, 80), torch.device("cpu"), 1e12, timer=once, log=lambda *_: None)
    assert [r["path"] for r in rows] == ["decode", "grouped"]
    assert set(rows[0]["contestants"]) == {"bf16", *qb.quant.SCHEMES}
    assert {"fp8-block128+w8a8", "fp8-channel+w8a8"} <= set(rows[1]["contestants"])
    for r in rows:
        for name, c in r["contestants"].items():
            assert c["bytes_read"] > 0 and c["speedup_vs_bf16"] == 1.0
            if name != "bf16":
                assert c["rel_err_twin"] < 1e-5 and c["bytes_read"] < r["contestants"]["bf16"]["bytes_read"]
    assert all(0.5 <= m["ratio"] < 0.55 for m in memory)


def test_measure_honours_the_quick_schemes():
    def once(fn):
        fn()
        return {"median_ms": 1.0, "min_ms": 1.0, "max_ms": 1.0, "samples": 1}

    rows, memory = qb.measure("tiny", (80,), torch.device("cpu"), 1e12, timer=once, log=lambda *_: None,
                              schemes=qb.QUICK_SCHEMES)
    assert set(rows[0]["contestants"]) == {"bf16", "int8-channel", "fp8-block128", "fp8-block128+w8a8",
                                           "fp8-channel", "fp8-channel+w8a8"}
    assert [m["scheme"] for m in memory] == list(qb.QUICK_SCHEMES)
    assert set(qb.QUICK_SHAPES) <= set(qb.SHAPES) and {1, 8, 64, 4096, 16384} == set(qb.QUICK_TOKENS)
