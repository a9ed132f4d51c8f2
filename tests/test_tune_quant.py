"""The tuner's quantized searches (--quant) under Triton's interpreter, with test_tune's fake timer."""

import torch

import dispatch  # noqa: F401
from dispatch import tables
from dispatch.kernels import tiles
from dispatch.kernels.tiles import DecodeConfig, GemmConfig
from dispatch.tune import quant_search, search
from dispatch.tune.compile import compile_jobs
from dispatch.tune.search import tune_preset
from tests.test_tune import fake_us


def test_quant_search_on_the_interpreter(small_space, monkeypatch):
    """--quant: one entry per scheme, decode buckets up to QUANT_MAX_T, every config fitting the
    scale blocks, the cheapest by the fake price; the launcher then reads it for that scheme."""
    from dispatch import quant
    from dispatch.kernels.quant_gemv import check_chunk

    monkeypatch.setattr(quant_search, "QUANT_CHUNKS", ((64, 64), (32, 64)))
    monkeypatch.setattr(quant_search, "QUANT_TILES", ((16, 64, 16, 64), (32, 32, 16, 32)))
    cpu, logs = torch.device("cpu"), []
    entries = tune_preset("tiny", (2, 8, 128), cpu, torch.float32, timer=fake_us, log=logs.append,
                          schemes=("int8-channel", "int8-group128"))
    assert set(entries) == {tables.shape_key(8, 64, 32, 2, f"float32+{q}") for q in ("int8-channel", "int8-group128")}
    w = search.make_case("tiny", 2, cpu, torch.float32)[1]
    for key, e in entries.items():
        assert set(e["buckets"]) == {"2", "8"}  # T = 128 > QUANT_MAX_T: not tuned
        # the weight-only grouped GEMM timed from GROUPED_MIN_T (8); its fake price (50) beats decode's (~100)
        assert "grouped_us" not in e["buckets"]["2"] and e["buckets"]["8"]["grouped_us"] == 50.0
        assert e["crossover"] == 2
        qe = quant.quantize_experts(w.gate_up_E2IH, w.down_EHI, key.split("+")[1])
        for b in e["buckets"].values():
            d = DecodeConfig(**b["decode"])
            check_chunk("block_h", d.block_h, qe.gate_up)
            check_chunk("block_id", d.block_id, qe.down)
            assert (d.block_i, d.block_ho) == (16, 16) and b["decode_us"] <= b["decode_bf16_tiles_us"]
    assert any("decode int8-group128" in s for s in logs)
    whole = quant_search.quant_steps(DecodeConfig(), 4, 2)[-1](DecodeConfig())  # the last step: whole tiles
    assert [(c.block_i, c.block_h, c.block_ho, c.block_id, c.num_stages) for c in whole] == \
        [(16, 64, 16, 64, 3), (32, 32, 16, 32, 3)]
    assert any("int8-channel: decode for T ≤ 2, grouped GEMM above" in s for s in logs)
    jobs = compile_jobs(["tiny"], (2, 8, 128), cpu, ("int8-channel",))
    assert {(j[1], j[2]) for j in jobs} == {(2, "decode:int8-channel"), (8, "decode:int8-channel")}


def test_w8a8_grouped_search_on_the_interpreter(small_space, monkeypatch):
    """--quant with an fp8 scheme: also its w8a8 entry: decode tiles on fp8 activations (16-row tiles,
    three launches) and the w8a8 grouped tiles from QUANT_GROUPED_MIN_T, up and down each the cheapest
    by the fake price, on the default's block_m; the launcher reads them near T only."""
    monkeypatch.setattr(quant_search, "QUANT_GEMM", {"up": ((32, 32, 4, 1, 1), (16, 32, 4, 2, 1)),
                                                     "down": ((32, 16, 4, 1, 1), (16, 32, 4, 1, 1))})
    cpu = torch.device("cpu")
    entries = tune_preset("tiny", (2, 128, 256), cpu, torch.float32, timer=fake_us, log=lambda s: None,
                          schemes=("fp8-channel", "int8-channel"))
    key = tables.shape_key(8, 64, 32, 2, "float32+fp8-channel+w8a8")
    assert set(entries) == {key} | {tables.shape_key(8, 64, 32, 2, f"float32+{q}")
                                    for q in ("fp8-channel", "int8-channel")}  # int8: no w8a8
    e = entries[key]
    assert set(e["buckets"]) == {"2", "128", "256"} and "crossover" not in e  # no grouped time at T=2
    d = DecodeConfig(**e["buckets"]["2"]["decode"])
    assert d.block_m == 16 and d.fused == 0 and min(d.block_h, d.block_id) >= 32  # fit_w8a8
    tiny = (128, 2, 8, 64, 32)
    bm = tiles.resolve("up", tiny, torch.float32, cpu, scheme="fp8-channel+w8a8", table=False).config.block_m
    for b in (e["buckets"][T] for T in ("128", "256")):
        up, down = GemmConfig(**b["up"]), GemmConfig(**b["down"])
        assert up.block_m == down.block_m == bm and b["grouped_us"] <= b["grouped_default_us"]
        assert (up.block_n, up.num_stages, down.block_n) == (32, 1, 32)  # the fake price's cheapest
    def pair(T):  # what tiles.resolve("grouped", scheme=...) reads from the device's table
        up, down = tiles.tuned(e, T, "up", within=1), tiles.tuned(e, T, "down", within=1)
        return (up, down) if up is not None and down is not None else None

    assert pair(200) == (GemmConfig(**e["buckets"]["256"]["up"]), GemmConfig(**e["buckets"]["256"]["down"]))
    assert pair(64) is not None and pair(16) is None  # 2× away at most
    jobs = compile_jobs(["tiny"], (2, 128), cpu, ("fp8-channel",))
    w8a8 = {(2, "decode:fp8-channel+w8a8"), (16, "up:fp8-channel"), (16, "down:fp8-channel")}
    assert {(j[1], j[2]) for j in jobs} == {(2, "decode:fp8-channel")} | w8a8
    assert {(j[1], j[2]) for j in compile_jobs(["tiny"], (2, 128), cpu, ("fp8-channel+w8a8",))} == w8a8


def test_w8a8_spaces_fit_and_hold_the_default(monkeypatch):
    """On an H200's shared memory: every w8a8 candidate fits (block scales: twice the accumulators,
    K steps of 128 only), and each space holds the launcher's default for 128-row blocks."""
    from dispatch import runtime
    from dispatch.kernels import tile_rules

    monkeypatch.setattr(runtime, "max_shared_bytes", lambda dev=None: 227 * 1024)
    monkeypatch.setattr(tile_rules, "interpreting", lambda dev: False)
    monkeypatch.setattr(tile_rules, "pick_block_m", lambda rows, E, dev: 128)
    cpu = torch.device("cpu")
    for late in (True, False):  # fp8-channel: one scale a row (late); fp8-block128: per 128 columns
        scheme = "fp8-channel+w8a8" if late else "fp8-block128+w8a8"
        base = tiles.resolve("up", (4096, 8, 64, 2048, 1024), torch.bfloat16, cpu, scheme=scheme, table=False).config
        for kind, n_b in (("up", 2), ("down", 1)):
            space = quant_search.quant_gemm_space(kind, base, cpu, late)
            assert len(space) >= 4 and base in space and all(c.block_m == 128 for c in space)
            assert all(tiles.fits_registers(c, n_b * (1 if late else 2)) for c in space)
            assert all(tiles.shared_bytes(c, n_b, elt=1) <= 227 * 1024 - tiles.HEADROOM for c in space)
            assert late or all(c.block_k == 128 for c in space)
