"""TMA loads in the grouped GEMM: off where they cannot run; where they run (Hopper, or forced under the
interpreter) the results are bitwise those of the pointer loads, tails and tensors TMA cannot describe
included, 8-bit expert codes (chapter 7) as well as 16-bit weights."""
import pytest
import torch

import dispatch  # noqa: F401  (first: runtime decisions)
from dispatch import quant, runtime
from dispatch.config import MoEConfig, random_weights
from dispatch.kernels import grouped_gemm as gg
from dispatch.kernels import tma
from dispatch.kernels.quant_grouped import moe_experts_quant, moe_experts_quant_torch
from dispatch.kernels.sort import sort_by_expert
from dispatch.kernels.tiles import GemmConfig
from dispatch.reference import experts_reference, rel_err, route_reference

CPU = torch.device("cpu")


def _layer(T, E, K, H, I, dtype, dev, seed=0):  # noqa: E741
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g).to(dev, dtype)
    gu = (torch.randn(E, 2 * I, H, generator=g) * H ** -0.5).to(dev, dtype)
    dn = (torch.randn(E, H, I, generator=g) * I ** -0.5).to(dev, dtype)
    ids = torch.randint(0, E, (T, K), generator=g).to(dev, torch.int32)
    wts = torch.rand(T, K, generator=g).to(dev)
    return x, wts, ids, gu, dn


def _both(fn):
    """fn() with TMA forced (where the tile and tensors allow it) and with TMA off."""
    with tma.forced():
        on = fn()
    with tma.disabled():
        off = fn()
    return on, off


def test_off_on_cpu_off_by_env_and_inside_disabled(monkeypatch):
    assert not tma.enabled(CPU)
    with tma.forced():
        assert tma.enabled(CPU)
        with tma.disabled():
            assert not tma.enabled(CPU)
        assert tma.enabled(CPU)
        monkeypatch.setenv("DISPATCH_TMA", "0")
        assert not tma.enabled(CPU)
    assert tma._mode == ["auto"]


def test_what_a_descriptor_can_describe():
    w = torch.zeros(4, 96, 64, dtype=torch.float16)
    assert tma.rows_view(w).shape == (384, 64)
    assert tma.rows_view(w.transpose(1, 2)) is None  # columns not contiguous
    assert tma.rows_view(w[:, :48]) is None  # experts not one run of rows
    assert tma.rows_view(torch.zeros(3, 4)) is None
    assert tma.describable(tma.rows_view(w), 64)
    assert not tma.describable(tma.rows_view(w), 4)  # box row of 8 bytes: below 16
    assert not tma.describable(tma.rows_view(w), 128)  # 256 bytes: above one 128-byte swizzle
    assert not tma.describable(tma.rows_view(w.float()), 32)  # 16-bit values or 8-bit codes only
    codes = torch.zeros(4, 96, 128, dtype=torch.int8)
    assert tma.describable(tma.rows_view(codes), 128)  # 128 one-byte codes: one 128-byte box row
    assert tma.describable(tma.rows_view(codes.view(torch.float8_e4m3fn)), 64)
    assert not tma.describable(tma.rows_view(codes), 8)
    assert not tma.describable(torch.zeros(8, 100, dtype=torch.float16)[:, 1:65], 32)  # base not 16-byte aligned
    assert not tma.describable(torch.zeros(8, 100, dtype=torch.float16)[:, :64], 32)  # row stride 200 bytes
    assert not tma.describable(None, 32)
    with tma.forced():
        assert tma.descriptors([(tma.rows_view(w), "n")], 64, 32, 32, CPU) is not None
        assert tma.descriptors([(tma.rows_view(w), "n")], 32, 32, 32, CPU) is None  # below MIN_BLOCK_M
        assert tma.descriptors([(None, "n")], 64, 32, 32, CPU) is None


@pytest.mark.parametrize("T,E,K,H,I,cfg", [
    (50, 6, 2, 96, 80, GemmConfig(64, 32, 32, 4, 1, 1)),    # I tail: the gate box reads up rows, masked
    (33, 5, 3, 96, 48, GemmConfig(64, 64, 64, 4, 1, 2)),    # H and I tails: zeros past the edge
    (1, 4, 2, 64, 32, GemmConfig(64, 32, 32, 4, 1, 1)),     # one token: one block per expert used
    (40, 8, 2, 64, 64, GemmConfig(128, 32, 32, 4, 1, 1)),
])
def test_tma_is_bitwise_the_pointer_loads(T, E, K, H, I, cfg):  # noqa: E741
    x, wts, ids, gu, dn = _layer(T, E, K, H, I, torch.float16, CPU, seed=T)
    on, off = _both(lambda: gg.moe_experts(x, wts, ids, gu, dn, config=cfg))
    assert torch.equal(on, off)
    ref = experts_reference(x.float(), wts, ids, gu.float(), dn.float())
    torch.testing.assert_close(on.float(), ref, rtol=1e-2, atol=1e-2)


def test_all_tokens_to_one_expert_and_experts_with_nothing():
    x, wts, ids, gu, dn = _layer(70, 6, 2, 64, 32, torch.float16, CPU)
    ids = torch.stack([torch.full((70,), 5), torch.full((70,), 2)], 1).int()  # experts 0, 1, 3, 4 get nothing
    on, off = _both(lambda: gg.moe_experts(x, wts, ids, gu, dn, config=GemmConfig(64, 32, 32, 4, 1, 1)))
    assert torch.equal(on, off)


def test_layouts_tma_cannot_describe_fall_back_to_pointers():
    x, wts, ids, gu, dn = _layer(20, 4, 2, 64, 32, torch.float16, CPU)
    gu_t = gu.transpose(1, 2).contiguous().transpose(1, 2)  # same values, H not contiguous: no rows view
    cfg = GemmConfig(64, 32, 32, 4, 1, 1)
    routes = sort_by_expert(ids, 4, 64)
    with tma.forced():
        assert tma.descriptors([(tma.rows_view(gu_t), "n")], 64, 32, 32, CPU) is None
        h = gg.grouped_up_swiglu(x, routes, gu_t, config=cfg)
    used = routes.slot_of_N.long()  # the slots of routed rows (the rest of h is never read)
    assert torch.equal(h[used], gg.grouped_up_swiglu(x, routes, gu, config=cfg)[used])


def _quant_case(scheme, T, dtype, dev, seed=0):
    cfg = MoEConfig(192, 160, 6, 3)  # H, I not multiples of 128: box tails, scale blocks across gate and up
    w = random_weights(cfg, seed=seed, device=dev)
    g = torch.Generator(device=dev).manual_seed(seed + 1)
    x = torch.randn(T, cfg.H, generator=g, device=dev).to(dtype)
    wts, ids = route_reference(torch.randn(T, cfg.E, generator=g, device=dev), cfg)
    return x, wts, ids, quant.quantize_experts(w.gate_up_E2IH, w.down_EHI, scheme)


@pytest.mark.parametrize("scheme,w8a8", [("int8-channel", False), ("fp8-block128", False),
                                         ("fp8-block128", True), ("fp8-channel", True)])
def test_tma_reads_8bit_codes_bitwise_as_the_pointer_loads(scheme, w8a8, monkeypatch):
    """Weight codes by descriptor (w8a8: down's fp8 h codes too); w8a16 with per-row and block scales
    (weight-first), w8a8 with per-token and per-128-column activation scales."""
    x, wts, ids, qe = _quant_case(scheme, 40, torch.float16, CPU)
    cfg = GemmConfig(64, 32, 128 if w8a8 else 32, 4, 1, 1)
    made, real = [], tma.descriptors

    def spy(*args):  # which launches got descriptors
        made.append(real(*args))
        return made[-1]

    monkeypatch.setattr(tma, "descriptors", spy)
    on, off = _both(lambda: moe_experts_quant(x, wts, ids, qe, w8a8=w8a8, config=cfg))
    assert [d is not None for d in made] == [True, True, False, False]  # up and down: forced, then off
    assert torch.equal(on, off)
    assert rel_err(on, moe_experts_quant_torch(x, wts, ids, qe, w8a8=w8a8)) < 1e-3


def _hopper():
    return runtime.HAS_CUDA and torch.cuda.get_device_capability() >= (9, 0)


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 300, 4096])
def test_gpu_tma_on_hopper_is_bitwise_the_pointer_loads(T):
    assert tma.enabled("cuda") == (_hopper() and tma._triton_has_descriptors())
    dev = torch.device("cuda")
    x, wts, ids, gu, dn = _layer(T, 8, 2, 1024, 1408, torch.bfloat16, dev)  # I = 1408: an I tail at block_n 256
    cfg = GemmConfig(128, 128, 64, 8, 3, 8)
    on = gg.moe_experts(x, wts, ids, gu, dn, config=cfg)
    with tma.disabled():
        off = gg.moe_experts(x, wts, ids, gu, dn, config=cfg)
    assert torch.equal(on, off)
    ref = experts_reference(x.float(), wts, ids, gu.float(), dn.float())
    torch.testing.assert_close(on.float(), ref, rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("scheme,w8a8", [("int8-channel", False), ("fp8-block128", False),
                                         ("fp8-block128", True), ("fp8-channel", True)])
@pytest.mark.parametrize("T", [300, 4096])
def test_gpu_tma_reads_8bit_codes_on_hopper_bitwise(scheme, w8a8, T):
    dev = torch.device("cuda")
    if runtime.capability(dev) < (8, 9) and scheme.startswith("fp8"):
        pytest.skip("fp8 e4m3 codes need sm_89+")
    x, wts, ids, qe = _quant_case(scheme, T, runtime.compute_dtype(dev), dev)
    cfg = GemmConfig(128, 128, 128, 8, 3, 8)
    on = moe_experts_quant(x, wts, ids, qe, w8a8=w8a8, config=cfg)
    with tma.disabled():
        off = moe_experts_quant(x, wts, ids, qe, w8a8=w8a8, config=cfg)
    assert torch.equal(on, off)
    assert rel_err(on, moe_experts_quant_torch(x, wts, ids, qe, w8a8=w8a8)) < 2e-2
