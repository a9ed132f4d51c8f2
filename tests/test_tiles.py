"""The one tile policy: shared-memory fit for both kernel families, heuristics that fit a T4, the
tuned-table lookup and its fallbacks, and the grouped GEMM's launch swizzle (against its twin)."""
import pathlib
from dataclasses import replace

import pytest
import torch

import dispatch  # noqa: F401
from dispatch import runtime, tables
from dispatch.kernels import grouped_gemm as gg
from dispatch.kernels import tile_rules, tiles
from dispatch.kernels.sort import sort_by_expert
from dispatch.kernels.tiles import DecodeConfig, GemmConfig, fit_shared, shared_bytes

T4, H200 = 64 * 1024, 227 * 1024  # max shared memory per block (bytes)


@pytest.mark.parametrize("block_m", [16, 32, 64, 128])
@pytest.mark.parametrize("n_b_tiles,block_n", [(2, 128), (1, 256)])  # up (gate + up tiles), down
def test_fit_shared_gemm(block_m, n_b_tiles, block_n):
    cfg = GemmConfig(block_m, block_n, 64, 8, 3)
    assert fit_shared(cfg, H200, n_b_tiles) == cfg  # the measured H200 tiles are kept as they are
    small = fit_shared(cfg, T4, n_b_tiles)
    assert shared_bytes(small, n_b_tiles) <= T4 - tiles.HEADROOM and small.block_m == block_m
    # hand check of the formula: stages · (BM·BK + tiles·BN·BK) · 2 bytes
    assert shared_bytes(GemmConfig(64, 128, 64, 4, 3), 2) == 3 * (64 * 64 + 2 * 128 * 64) * 2 == 122880


@pytest.mark.parametrize("block_m", [16, 32, 64])
@pytest.mark.parametrize("base", [tiles.FEW_EXPERTS, tiles.MANY_EXPERTS])
def test_fit_shared_decode(block_m, base):
    cfg = replace(base, block_m=block_m)
    assert fit_shared(cfg, H200) == cfg
    small = fit_shared(cfg, T4)
    assert shared_bytes(small) <= T4 - tiles.HEADROOM and small.block_m == block_m
    assert shared_bytes(replace(tiles.FEW_EXPERTS, block_m=16)) == 3 * (16 * 256 + 2 * 32 * 256) * 2


def test_configs_validate():
    with pytest.raises(ValueError, match="power of two"):
        GemmConfig(block_m=24)
    with pytest.raises(ValueError, match="group_m"):
        GemmConfig(group_m=0)
    with pytest.raises(ValueError, match="programs"):
        DecodeConfig(programs=0)
    assert DecodeConfig(programs=100).grid(8, 64) == 100


@pytest.fixture
def fake_gpu(monkeypatch):
    """Pretend the tile policy runs on a CUDA device (name, SMs, shared memory) without one."""
    def set_gpu(name="NVIDIA H200", sms=132, shared=H200, cap=(9, 0)):
        monkeypatch.setattr(tiles, "interpreting", lambda dev: False)
        monkeypatch.setattr(tile_rules, "interpreting", lambda dev: False)
        monkeypatch.setattr(runtime, "device_name", lambda dev=None: name)
        monkeypatch.setattr(runtime, "num_sms", lambda dev=None: sms)
        monkeypatch.setattr(runtime, "max_shared_bytes", lambda dev=None: shared)
        monkeypatch.setattr(runtime, "capability", lambda dev=None: cap)
        tiles._lookup.cache_clear()  # the table answers are cached per (device, shape, T)
    yield set_gpu
    tiles._lookup.cache_clear()


SHAPES = [(64, 2048, 1024, 8), (128, 2048, 768, 8), (64, 2048, 1408, 6), (8, 4096, 14336, 2), (8, 64, 32, 2)]


@pytest.mark.parametrize("E,H,I,K", SHAPES)
def test_heuristics_fit_a_t4(fake_gpu, E, H, I, K):  # noqa: E741
    fake_gpu("Tesla T4", 40, T4, (7, 5))
    cuda = torch.device("cuda")
    for T in tables.BUCKETS:
        up, down = tiles.gemm_configs(T, K, E, H, I, torch.float16, cuda)  # no T4 table: heuristics
        assert up.block_m == down.block_m == tiles.pick_block_m(T * K, E, cuda)
        assert shared_bytes(up, 2) <= T4 - tiles.HEADROOM and shared_bytes(down, 1) <= T4 - tiles.HEADROOM
        assert tiles.fits_registers(up, 2) and tiles.fits_registers(down, 1)
        assert shared_bytes(tiles.decode_config(T, K, E, H, I, torch.float16, cuda)) <= T4 - tiles.HEADROOM
        assert tiles.decode_max_tokens(K, E, H, I, torch.float16, cuda) == tiles.DECODE_MAX_TOKENS


def test_decode_heuristic_grid_is_whole_waves(fake_gpu):
    cuda = torch.device("cuda")
    for name, sms in (("NVIDIA H200", 132), ("Tesla T4", 40)):
        fake_gpu(name, sms, H200 if sms == 132 else T4)
        few, many = (tiles.heuristic_decode(T, 8, 64, 2048, 1024, cuda) for T in (1, 64))
        assert (few.block_i, many.block_i) == (tiles.FEW_EXPERTS.block_i, tiles.MANY_EXPERTS.block_i)
        assert (few.programs, many.programs) == (8 * sms, 2 * sms)
    assert (tiles.FEW_EXPERTS.programs, tiles.MANY_EXPERTS.programs) == (8 * 132, 2 * 132)  # what H200 measured


def _table(E=64, H=2048, I=1024, K=8):  # noqa: E741
    buckets = {"1": {"decode": tiles.as_dict(replace(tiles.FEW_EXPERTS, programs=264)), "decode_us": 30.0},
               "64": {"decode": tiles.as_dict(tiles.MANY_EXPERTS), "decode_us": 200.0,
                      "up": tiles.as_dict(GemmConfig(16, 64, 128, 4, 3)),
                      "down": tiles.as_dict(GemmConfig(16, 128, 64, 4, 4)), "grouped_us": 190.0},
               "4096": {"up": tiles.as_dict(GemmConfig(128, 128, 64, 8, 4, 8)),
                        "down": tiles.as_dict(GemmConfig(128, 256, 64, 8, 3, 16)), "grouped_us": 900.0}}
    return {"device": "NVIDIA H200", "entries": {tables.shape_key(E, H, I, K, torch.bfloat16): {
        "crossover": 32, "buckets": buckets}}}


def test_table_round_trip_and_lookup(tmp_path, monkeypatch, fake_gpu):
    fake_gpu()
    path = tables.write(tmp_path / "h200.json", _table())
    doc = tables.load_file(path)
    assert doc == _table()
    monkeypatch.setattr(tables, "load", lambda slug: doc if slug == "h200" else {})
    cuda, bf16 = torch.device("cuda"), torch.bfloat16
    assert tiles.gemm_configs(5000, 8, 64, 2048, 1024, bf16, cuda) == (GemmConfig(128, 128, 64, 8, 4, 8),
                                                                       GemmConfig(128, 256, 64, 8, 3, 16))
    assert tiles.gemm_configs(48, 8, 64, 2048, 1024, bf16, cuda)[0] == GemmConfig(16, 64, 128, 4, 3)
    assert tiles.decode_config(1, 8, 64, 2048, 1024, bf16, cuda).programs == 264
    assert tiles.decode_config(16, 8, 64, 2048, 1024, bf16, cuda) == tiles.MANY_EXPERTS  # nearest: 64
    assert tiles.decode_max_tokens(8, 64, 2048, 1024, bf16, cuda) == 32
    # the routes were sorted with another block_m: that kernel falls back to the heuristic for it
    got = tiles.resolve("up", (5000, 8, 64, 2048, 1024), bf16, cuda, block_m=64)
    assert got == tiles.Tiles(tiles.heuristic_gemm("up", 64, cuda), "heuristic")
    # fallbacks: another shape, another dtype, another device, tables switched off
    for args, env in [((5000, 8, 64, 2048, 768, bf16), None), ((5000, 8, 64, 2048, 1024, torch.float16), None),
                      ((5000, 8, 64, 2048, 1024, bf16), "none"), ((5000, 8, 64, 2048, 1024, bf16), "a100")]:
        if env:
            monkeypatch.setenv("DISPATCH_TILE_TABLE", env)
        bm = tiles.pick_block_m(args[0] * args[1], args[2], cuda)
        assert tiles.gemm_configs(*args, cuda) == (tiles.heuristic_gemm("up", bm, cuda),
                                                   tiles.heuristic_gemm("down", bm, cuda))
        assert tiles.decode_max_tokens(*args[1:], cuda) == tiles.DECODE_MAX_TOKENS


def test_quantized_experts_read_their_own_decode_entry(monkeypatch, fake_gpu):
    """A scheme's entry ('bfloat16+int8-channel') first; without one, the unquantized entry's tiles."""
    fake_gpu()
    doc = _table()
    mine = replace(tiles.FEW_EXPERTS, block_h=512, programs=396)
    doc["entries"][tables.shape_key(64, 2048, 1024, 8, tiles.quant_key(torch.bfloat16, "int8-channel"))] = {
        "buckets": {"1": {"decode": tiles.as_dict(mine), "decode_us": 20.0}}}
    monkeypatch.setattr(tables, "load", lambda slug: doc if slug == "h200" else {})
    cuda, bf16 = torch.device("cuda"), torch.bfloat16
    assert tiles.quant_key(bf16, "int8-channel") == "bfloat16+int8-channel"
    assert tiles.decode_config(2, 8, 64, 2048, 1024, bf16, cuda, "int8-channel") == mine
    assert tiles.decode_config(2, 8, 64, 2048, 1024, bf16, cuda, "fp8-block128").programs == 264  # bf16's
    assert tiles.decode_config(2, 8, 64, 2048, 1024, bf16, cuda).programs == 264


def test_nearest_bucket():
    b = {"1": {"decode": 1}, "4": {"decode": 4}, "64": {"up": 64}, "128": {"decode": 128}}
    assert tables.nearest_bucket(b, 3)["decode"] == 4  # log2 distance
    assert tables.nearest_bucket(b, 2)["decode"] == 4  # a tie goes to the larger bucket
    assert tables.nearest_bucket(b, 20000, "up")["up"] == 64
    assert tables.nearest_bucket(b, 1, "down") is None and tables.nearest_bucket({}, 8) is None
    assert tables.shape_key(8, 4096, 14336, 2, torch.bfloat16) == "E=8,H=4096,I=14336,K=2,bfloat16"
    assert tables.device_slug("NVIDIA H100 80GB HBM3") == "h100-80gb-hbm3" and tables.load("no-such-gpu") == {}


def test_interpreter_policy():
    cpu = torch.device("cpu")
    assert tiles.gemm_configs(4096, 8, 64, 2048, 1024, torch.float32, cpu) == (tiles.INTERPRET_CONFIG,) * 2
    assert tiles.decode_config(4, 8, 64, 2048, 1024, torch.float32, cpu) == tiles.INTERPRET_DECODE


@pytest.mark.parametrize("group_m,T,E,K", [(2, 40, 4, 2), (3, 33, 8, 3), (16, 9, 2, 1)])
def test_swizzled_launch_matches_twins(group_m, T, E, K):
    g = torch.Generator().manual_seed(group_m)
    H, I = 48, 40  # noqa: E741  (several column tiles of 32, a ragged last one)
    x = torch.randn(T, H, generator=g)
    gate_up, down = torch.randn(E, 2 * I, H, generator=g) / H ** 0.5, torch.randn(E, H, I, generator=g) / I ** 0.5
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    w = torch.rand(T, K, generator=g)
    cfg = replace(tiles.INTERPRET_CONFIG, group_m=group_m)
    routes = sort_by_expert(ids, E, cfg.block_m)
    slots = routes.slot_of_N.long()
    h = gg.grouped_up_swiglu(x, routes, gate_up, config=cfg)
    torch.testing.assert_close(h[slots], gg.grouped_up_swiglu_torch(x, routes, gate_up)[slots], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gg.grouped_down(h, routes, down, w, config=cfg),
                               gg.grouped_down_torch(h, routes, down, w), rtol=1e-5, atol=1e-5)
    assert torch.equal(gg.moe_experts(x, w, ids, gate_up, down, config=cfg),
                       gg.moe_experts(x, w, ids, gate_up, down, config=tiles.INTERPRET_CONFIG))


gpu = pytest.mark.skipif(not runtime.HAS_CUDA, reason="needs a CUDA GPU")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("group_m", [8, 16])
@pytest.mark.parametrize("T,E,K,H,I", [(4096, 8, 2, 1024, 1792), (1500, 64, 8, 512, 384)])
def test_gpu_swizzle_bitwise(group_m, T, E, K, H, I):  # noqa: E741
    """The swizzle only reorders programs: every tile is computed the same way, bit for bit."""
    dt = runtime.compute_dtype()
    g = torch.Generator(device="cuda").manual_seed(T)
    x = torch.randn(T, H, device="cuda", generator=g).to(dt)
    gate_up = (torch.randn(E, 2 * I, H, device="cuda", generator=g) / H ** 0.5).to(dt)
    down = (torch.randn(E, H, I, device="cuda", generator=g) / I ** 0.5).to(dt)
    w, ids = torch.rand(T, K, device="cuda", generator=g), torch.randint(0, E, (T, K), device="cuda", generator=g)
    plain = GemmConfig(128, 128, 64, 8, 3)
    y = gg.moe_experts(x, w, ids, gate_up, down, config=plain)
    assert torch.equal(y, gg.moe_experts(x, w, ids, gate_up, down, config=replace(plain, group_m=group_m)))


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("name", ["olmoe-1b-7b", "qwen3-30b-a3b", "deepseek-moe-16b", "mixtral-8x7b"])
def test_gpu_policy_tiles_run_correctly(name, monkeypatch):
    """Whatever the policy picks (the shipped table, else heuristics; T4-sized too) computes the layer."""
    from dispatch.config import PRESETS, random_weights
    from dispatch.kernels.gemv import moe_decode
    from dispatch.reference import experts_reference, route_reference

    cfg, dt = PRESETS[name], runtime.compute_dtype()
    w = random_weights(cfg, dtype=dt, device="cuda")
    for T, env, shared in [(1, None, None), (64, None, None), (600, None, None), (600, "none", 64 * 1024),
                           (8, "none", 64 * 1024)]:
        if env:
            monkeypatch.setenv("DISPATCH_TILE_TABLE", env)
            monkeypatch.setattr(runtime, "max_shared_bytes", lambda dev=None, s=shared: s)
        g = torch.Generator(device="cuda").manual_seed(T)
        x = torch.randn(T, cfg.H, device="cuda", generator=g).to(dt)
        wts, ids = route_reference(torch.randn(T, cfg.E, device="cuda", generator=g), cfg)
        ref = experts_reference(x, wts.to(dt), ids, w.gate_up_E2IH, w.down_EHI).float()
        for y in (gg.moe_experts(x, wts, ids, w.gate_up_E2IH, w.down_EHI),
                  moe_decode(x, wts, ids, w.gate_up_E2IH, w.down_EHI) if T <= 64 else None):
            if y is not None:
                assert ((y.float() - ref).norm() / ref.norm()).item() < 1e-2, (name, T, env)


# ---- the one resolver: what every launcher, the EP layer and the tuner ask ----

def test_resolve_names_where_each_config_came_from(monkeypatch, fake_gpu):
    fake_gpu()
    doc = _table()
    monkeypatch.setattr(tables, "load", lambda slug: doc if slug == "h200" else {})
    cuda, bf16, olmoe = torch.device("cuda"), torch.bfloat16, (5000, 8, 64, 2048, 1024)
    got = tiles.resolve("grouped", olmoe, bf16, cuda)
    assert got.source == "table" and got.config == tiles.gemm_configs(*olmoe, bf16, cuda)
    assert tiles.resolve("grouped", olmoe, bf16, cuda, table=False).source == "heuristic"
    assert tiles.resolve("grouped", (5000, 8, 64, 2048, 768), bf16, cuda).source == "heuristic"  # no entry
    assert tiles.resolve("crossover", olmoe, bf16, cuda) == tiles.Tiles(32, "table")
    assert tiles.resolve("crossover", olmoe, torch.float16, cuda) == tiles.Tiles(tiles.DECODE_MAX_TOKENS, "heuristic")
    assert tiles.resolve("decode", (1,) + olmoe[1:], bf16, cuda).source == "table"
    mine = GemmConfig(32, 64, 64, 4, 2)
    assert tiles.resolve("grouped", olmoe, bf16, cuda, config=mine) == tiles.Tiles((mine, mine), "pinned")
    assert tiles.resolve("decode", None, None, cuda, pinned=True) == tiles.Tiles(tiles.FEW_EXPERTS, "pinned")
    # a shared expert riding along: the decode lookup is keyed by K + n choices among E + n experts
    doc["entries"][tables.shape_key(66, 2048, 1024, 10, bf16)] = {"buckets": {"1": {"decode": tiles.as_dict(
        replace(tiles.FEW_EXPERTS, programs=132))}}}
    assert tiles.resolve("decode", (1, 8, 64, 2048, 1024), bf16, cuda, routing=2).config.programs == 132
    assert tiles.resolve("decode", (1, 8, 64, 2048, 1024), bf16, cuda, routing=2, table=False) == tiles.Tiles(
        tiles.heuristic_decode(1, 10, 66, 2048, 1024, cuda), "heuristic")


def test_resolve_fits_quantized_experts_to_their_scale_blocks(fake_gpu):
    fake_gpu()
    cuda, bf16, shape = torch.device("cuda"), torch.bfloat16, (1, 8, 64, 2048, 1024)
    base = tiles.resolve("decode", shape, bf16, cuda, table=False).config
    g128 = tiles.resolve("decode", shape, bf16, cuda, scheme="int8-group128", table=False).config
    assert base.block_h == 256 and g128.block_h == 128 and 128 % g128.block_id == 0  # inside the 128-col blocks
    w8a8 = tiles.resolve("decode", shape, bf16, cuda, scheme="fp8-channel+w8a8", table=False).config
    assert w8a8 == tiles.fit_w8a8(w8a8) and w8a8.block_m >= 16 and w8a8.fused == w8a8.split == 0
    big = (4096, 8, 64, 2048, 1024)
    got = tiles.resolve("grouped", big, bf16, cuda, scheme="fp8-block128+w8a8", table=False)
    assert got.source == "heuristic" and got.config[0] == got.config[1] and got.config[0].block_k == tiles.W8A8_GROUP
    assert tiles.resolve("grouped", big, bf16, cuda, scheme="fp8-block128+w8a8").source == "table"  # the H200's


def test_resolve_refuses_what_it_does_not_know():
    cpu, shape = torch.device("cpu"), (4, 2, 8, 64, 32)
    with pytest.raises(ValueError, match="kind must be one of"):
        tiles.resolve("sideways", shape, torch.float32, cpu)
    with pytest.raises(ValueError, match="scheme must be one of"):
        tiles.resolve("decode", shape, torch.float32, cpu, scheme="int4-channel")
    with pytest.raises(ValueError, match="must be a DecodeConfig"):
        tiles.resolve("decode", shape, torch.float32, cpu, config=GemmConfig())
    with pytest.raises(ValueError, match="needs a shape"):
        tiles.resolve("decode", None, torch.float32, cpu)
    assert tiles.resolve("dense", (1, 2048, 2048), torch.float32, cpu).source == "heuristic"
    assert tiles.resolve("up", None, None, cpu, pinned=True) == tiles.Tiles(tiles.INTERPRET_CONFIG, "pinned")


def test_the_users_table_layers_over_the_shipped_one(tmp_path, monkeypatch, fake_gpu):
    """An entry of ~/.cache/dispatch/tables/<slug>.json ($DISPATCH_TABLES) replaces the shipped entry of
    its key; every other shipped entry stays; the tuner writes there by default, never into the package."""
    from dispatch import tune

    shipped = tables.shipped("h200")
    olmoe_key = tables.shape_key(64, 2048, 1024, 8, torch.bfloat16)
    assert olmoe_key in shipped["entries"] and len(shipped["entries"]) > 1
    monkeypatch.setenv("DISPATCH_TABLES", str(tmp_path / "empty"))
    assert tables.load("h200") == shipped  # no user table there
    tables.write(tmp_path / "h200.json", {"device": "NVIDIA H200", "entries": {olmoe_key: {"crossover": 7}}})
    monkeypatch.setenv("DISPATCH_TABLES", str(tmp_path))  # (read once per process and folder)
    merged = tables.load("h200")
    assert merged["entries"][olmoe_key] == {"crossover": 7}
    assert {k: v for k, v in merged["entries"].items() if k != olmoe_key} == \
        {k: v for k, v in shipped["entries"].items() if k != olmoe_key}
    fake_gpu()
    cuda = torch.device("cuda")
    assert tiles.resolve("crossover", (0, 8, 64, 2048, 1024), torch.bfloat16, cuda) == tiles.Tiles(7, "table")
    out = tune.default_out("NVIDIA H200")
    assert out == tmp_path / "h200.json"
    package = pathlib.Path(tables.__file__).parent
    assert package not in out.parents
    monkeypatch.delenv("DISPATCH_TABLES")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert tune.default_out("NVIDIA H200") == tmp_path / "cache" / "dispatch" / "tables" / "h200.json"
