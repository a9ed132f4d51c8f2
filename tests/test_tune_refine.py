"""The tuner's --refine step under Triton's interpreter, with test_tune's fake timer."""

import pytest
import torch

import dispatch  # noqa: F401
from dispatch import tables
from dispatch.kernels import tiles
from dispatch.kernels.tiles import DecodeConfig
from dispatch.tune import quant_search, search
from tests.test_tune import fake_us


@pytest.fixture
def tiny_table(small_space, monkeypatch):
    """A table with the tiny presets' decode entries (routed, shared riding along as n = 2 experts, int8)."""
    from dispatch.config import PRESETS, MoEConfig

    monkeypatch.setitem(PRESETS, "tiny-shared", MoEConfig(64, 32, 8, 2, shared_intermediate_size=64,
                                                           shared_gate=False))
    d = tiles.as_dict(tiles.INTERPRET_DECODE)
    routed = {"2": {"decode": d, "decode_us": 100.0, "decode_shared_us": 100.0, "shared_us": 1.0},
              "8": {"decode": d, "decode_us": 100.0, "grouped_us": 90.0}}  # grouped wins at 8 until decode is faster
    return {"entries": {
        tables.shape_key(8, 64, 32, 2, torch.float32): {"crossover": 2, "buckets": routed},
        tables.shape_key(10, 64, 32, 4, torch.float32): {"buckets": {"2": {"decode": d, "decode_us": 100.0}}},
        tables.shape_key(8, 64, 32, 2, "torch.float32+int8-channel"): {"buckets": {"2": {"decode": d}}}}}


def test_refine_moves_a_bucket_to_one_launch_only_where_faster(tiny_table, monkeypatch):
    """--refine: from each decode bucket's config, the one-launch step; a faster candidate replaces it
    (decode_us scaled by the measured ratio, the raw times kept), a slower one does not; the crossover is
    recomputed and the shared-expert entry's times reach the routed entry's buckets."""
    from dispatch.tune import refine

    cpu = torch.device("cpu")
    price = lambda fn, c: (fn(), 100.0 - 60.0 * (c.fused > 0) * (c.programs == 16))[1]  # noqa: E731
    jobs = refine.compile_jobs(["tiny", "tiny-shared"], tiny_table, torch.float32)
    assert {(n, T, k) for n, T, k, _ in jobs} >= {("tiny", 2, "decode"), ("tiny-shared", 2, "decode"),
                                                  ("tiny-shared", 2, "decode_shared")}
    assert {k for *_, k, _ in refine.compile_jobs(["tiny"], tiny_table, torch.float32, ("int8-channel",))} \
        == {"decode:int8-channel"}  # --quant: those schemes' entries instead
    assert {T for _, T, *_ in jobs} == {2, 8}
    for *_, cands in jobs:  # the start in one launch, the down step's tiles (three launches), split items' tiles
        assert cands[0].fused == 1 and {(c.block_ho, c.block_id) for c in cands[1:] if not c.split} \
            == set(search.DECODE_DOWN)
        assert {(c.block_i, c.block_ho) for c in cands if c.split} == set(search.SPLIT_TILES)  # T = 2, 8 ≤ 16
    assert {T for _, T, *_ in refine.compile_jobs(["tiny"], tiny_table, torch.float32, tokens={8})} == {8}
    for name, schemes in (("tiny", ("int8-channel",)), ("tiny", ()), ("tiny-shared", ())):
        out = refine.refine_preset(name, tiny_table, cpu, torch.float32, schemes, timer=price, log=lambda s: None)
        assert len(out) == (1 if schemes else 2 if name == "tiny-shared" else 1)  # int8; routed (+ shared)
        for key, e in out.items():
            for T, b in e["buckets"].items():
                if "decode" in b:
                    d = DecodeConfig(**b["decode"])
                    assert d.fused > 0 and d.programs == 16
                    assert (b["refined_us"], b["refined_from_us"]) == (40.0, 100.0)
                    tuned_us = tiny_table["entries"][key]["buckets"][T].get("decode_us", 100.0)
                    assert b["decode_us"] == pytest.approx(tuned_us * 0.4)  # the tuning run's time × this run's ratio
                    assert key in tiny_table["entries"]  # only entries the table has
        if name == "tiny-shared":
            routed = out[tables.shape_key(8, 64, 32, 2, torch.float32)]
            assert all(b["decode_shared_us"] == 40.0 for b in routed["buckets"].values() if "decode_shared_us" in b)
            assert routed["crossover"] == 8  # decode at 8 tokens now 40 µs in the tuning run's frame: under 90
    slower = refine.refine_preset("tiny", tiny_table, cpu, torch.float32, timer=lambda fn, c: (fn(), 50.0 + c.fused)[1],
                                  log=lambda s: None)
    for e in slower.values():
        for b in e["buckets"].values():
            assert "decode" not in b or DecodeConfig(**b["decode"]).fused == 0


def test_refine_moves_few_token_buckets_to_split_items_where_faster(tiny_table):
    """--refine at T ≤ SPLIT_MAX_T ends with the split steps: split items priced faster replace the
    bucket's config (checked within tolerance of the chain, not bitwise)."""
    from dispatch.tune import refine

    price = lambda fn, c: (fn(), 100.0 - 50.0 * c.split)[1]  # noqa: E731
    out = refine.refine_preset("tiny", tiny_table, torch.device("cpu"), torch.float32, timer=price,
                               log=lambda s: None)
    buckets = out[tables.shape_key(8, 64, 32, 2, torch.float32)]["buckets"]
    assert {T for T, b in buckets.items() if "decode" in b} == {"2", "8"}
    for b in (b for b in buckets.values() if "decode" in b):
        assert DecodeConfig(**b["decode"]).split == 1 and b["refined_us"] == 50.0


def test_refine_takes_faster_down_tiles_then_one_launch(tiny_table):
    """The down step first: a faster down tile (within tolerance of the start) replaces the start's, and
    the one-launch step then starts from it; ``tokens`` leaves the other buckets as they were."""
    from dispatch.tune import refine

    wide = search.DECODE_DOWN[-1]

    def price(fn, c):
        fn()
        return 100.0 - 30.0 * ((c.block_ho, c.block_id) == wide) - 20.0 * (c.fused > 0)

    out = refine.refine_preset("tiny", tiny_table, torch.device("cpu"), torch.float32, timer=price,
                               log=lambda s: None, tokens={2})
    b = out[tables.shape_key(8, 64, 32, 2, torch.float32)]["buckets"]
    d = DecodeConfig(**b["2"]["decode"])
    assert (d.block_ho, d.block_id) == wide and d.fused > 0 and b["2"]["refined_us"] == 50.0
    assert b["8"] == tiny_table["entries"][tables.shape_key(8, 64, 32, 2, torch.float32)]["buckets"]["8"]


def test_refine_drops_down_tiles_that_fail_or_stray(tiny_table, monkeypatch):
    """A down candidate that does not compile (too much shared memory) or strays beyond the tolerance is
    dropped, loudly, as in a full descent; the rest of the bucket is refined."""
    from dispatch.tune import refine

    real, logs = refine.moe_decode, []
    wide, stray = (32, 16), (16, 16)  # the start has (16, 32)
    monkeypatch.setattr(search, "DECODE_DOWN", ((16, 32), wide, stray))

    def flaky(*a, config, **kw):
        if (config.block_ho, config.block_id) == wide:
            raise RuntimeError("out of resource: shared memory")
        y = real(*a, config=config, **kw)
        return y * 1.5 if (config.block_ho, config.block_id) == stray else y

    monkeypatch.setattr(refine, "moe_decode", flaky)
    fast = lambda fn, c: (fn(), 10.0 if (c.block_ho, c.block_id) in (wide, stray) else 50.0)[1]  # noqa: E731
    out = refine.refine_preset("tiny", tiny_table, torch.device("cpu"), torch.float32, log=logs.append, timer=fast)
    d = DecodeConfig(**out[tables.shape_key(8, 64, 32, 2, torch.float32)]["buckets"]["2"]["decode"])
    assert (d.block_ho, d.block_id) not in (wide, stray)
    assert any("failed (out of resource" in s for s in logs) and any("wrong (rel err" in s for s in logs)


@pytest.mark.parametrize("scheme", ["int8-channel", "fp8-channel+w8a8"])
def test_refine_gives_a_quantized_entry_its_crossover(tiny_table, scheme):
    """A quantized entry's grouped time is measured beside its decode time from GROUPED_MIN_T tokens;
    the crossover is where the grouped GEMM first wins, on this run's two times. On fp8 activations
    ('+w8a8') both paths run w8a8 and every candidate keeps fit_w8a8's form (no one launch)."""
    from dispatch.tune import refine

    w8a8 = scheme.endswith("+w8a8")
    key = tables.shape_key(8, 64, 32, 2, f"torch.float32+{scheme}")
    d = tiles.as_dict(tiles.INTERPRET_DECODE)
    tiny_table["entries"][key] = {"buckets": {"2": {"decode": d}, "8": {"decode": d}, "32": {"decode": d}}}
    seen = []

    def price(fn, c):
        fn()
        seen.append(c)
        return 60.0 if c == ("grouped", scheme.removesuffix("+w8a8"), w8a8) else 80.0  # grouped wins from 8

    out = refine.refine_preset("tiny", tiny_table, torch.device("cpu"), torch.float32, (scheme,),
                               timer=price, log=lambda s: None)
    e = out[key]
    assert e["crossover"] == 2 and "grouped_us" not in e["buckets"]["2"]
    assert e["buckets"]["8"]["grouped_us"] == 60.0 and e["buckets"]["8"]["decode_us"] == 80.0
    if w8a8:
        assert all(c.fused == 0 and c.block_id <= 128 for c in seen if isinstance(c, DecodeConfig))


def test_refine_refuses_a_one_launch_that_is_not_bitwise(tiny_table, monkeypatch):
    from dispatch.tune import refine

    real = refine.moe_decode

    def off_by_a_bit(*a, config, **kw):
        y = real(*a, config=config, **kw)
        return y + 1e-6 if config.fused else y

    monkeypatch.setattr(refine, "moe_decode", off_by_a_bit)
    with pytest.raises(AssertionError, match="not bitwise"):
        refine.refine_preset("tiny", tiny_table, torch.device("cpu"), torch.float32, timer=fake_us, log=lambda s: None)


def test_refine_tries_whole_tiles_on_quantized_entries_only(tiny_table, monkeypatch):
    """--refine --quant: after the down step, the whole tiles of QUANT_TILES (3 stages), kept where
    faster (within tolerance of the start); a bf16 entry's refine never tries them."""
    from dispatch.tune import refine

    whole = (32, 32, 16, 32)  # (block_i, block_h, block_ho, block_id); the start has (16, 32, 16, 32)
    monkeypatch.setattr(quant_search, "QUANT_TILES", (whole,))

    def price(fn, c):
        fn()
        return 100.0 - 40.0 * ((c.block_i, c.block_h, c.block_ho, c.block_id) == whole)

    for schemes, dt in ((("int8-channel",), "torch.float32+int8-channel"), ((), torch.float32)):
        out = refine.refine_preset("tiny", tiny_table, torch.device("cpu"), torch.float32, schemes, timer=price,
                                   log=lambda s: None, tokens={2})
        b = out[tables.shape_key(8, 64, 32, 2, dt)]["buckets"]["2"]
        d = DecodeConfig(**b["decode"])
        took = (d.block_i, d.block_h, d.block_ho, d.block_id) == whole
        assert took == bool(schemes) and b["refined_us"] == (60.0 if schemes else 100.0)
        assert not took or d.num_stages == 3
    jobs = refine.compile_jobs(["tiny"], tiny_table, torch.float32, ("int8-channel",))
    assert jobs and all(any((c.block_i, c.block_h, c.block_ho, c.block_id) == whole for c in cands)
                        for *_, cands in jobs)
