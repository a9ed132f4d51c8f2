"""Quantized kernels (decode and grouped GEMM) against their twins and the reference layer.

On CPU every path runs under Triton's interpreter (int8 and fp8 codes; fp8 w8a8, grouped and decode, with the
activations pre-rounded to e4m3 in fp32, see ``quant_kernels._e4m3_round``); `-m gpu` runs the
compiled kernels in bf16 (fp8 on sm_89+).
"""
import warnings
from dataclasses import replace

import pytest
import torch
import triton
import triton.language as tl

import dispatch  # noqa: F401  (conftest imported it first: the interpreter is on before triton loads)
from dispatch import quant, runtime
from dispatch.config import MoEConfig, random_weights
from dispatch.kernels.quant_gemv import moe_decode_quant, moe_decode_quant_torch
from dispatch.kernels.quant_grouped import moe_experts_quant, moe_experts_quant_torch
from dispatch.kernels.quant_kernels import _e4m3_round, fp8_rows
from dispatch.kernels.tiles import DecodeConfig, GemmConfig
from dispatch.quant.formats import FP8, FP8_MAX, quantize_fp8_rows
from dispatch.reference import experts_reference, route_reference

SCHEMES = sorted(quant.SCHEMES)
# H = 192 and I = 160 are not multiples of 128: a 128×128 block straddles gate and up, and edges.
SHAPES = [MoEConfig(64, 32, 8, 2), MoEConfig(192, 160, 6, 3)]


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def case(cfg, T, scheme, seed=0, dev="cpu", dtype=torch.float32, one_expert=False):
    w = random_weights(cfg, seed=seed, device=dev)
    g = torch.Generator(device=dev).manual_seed(seed + 1)
    x = torch.randn(T, cfg.H, generator=g, device=dev).to(dtype)
    weights, ids = route_reference(torch.randn(T, cfg.E, generator=g, device=dev), cfg)
    if one_expert:  # every token's first choice is expert 1
        ids[:, 0] = 1
        ids[:, 1:] = torch.where(ids[:, 1:] == 1, 0, ids[:, 1:])
    return x, weights, ids, quant.quantize_experts(w.gate_up_E2IH, w.down_EHI, scheme)


def reference(x, weights, ids, qe):
    """Independent: the per-expert reference loop on the dequantized weights, fp32."""
    gu, dn = qe.dequantize(torch.float32)
    return experts_reference(x.float(), weights.float(), ids, gu, dn)


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("cfg", SHAPES, ids=["tiny", "odd"])
@pytest.mark.parametrize("T,one_expert", [(1, False), (5, True)])
def test_decode_matches_twin_and_reference(scheme, cfg, T, one_expert):
    x, w, ids, qe = case(cfg, T, scheme, seed=T, one_expert=one_expert)
    y = moe_decode_quant(x, w, ids, qe)
    assert rel(y, moe_decode_quant_torch(x, w, ids, qe)) < 1e-5
    assert rel(y, reference(x, w, ids, qe)) < 1e-5


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("T", [1, 3])
def test_decode_one_row_tiles_dequantize_as_the_dot_tiles(scheme, T):
    """block_m = 1: codes × scales by FMAs on the CUDA cores (one token's decode), per-row scales
    after the reduction, block scales per chunk; the odd shape's partial chunks and straddling blocks."""
    x, w, ids, qe = case(SHAPES[1], T, scheme, seed=T + 7)
    fma = DecodeConfig(block_m=1, block_i=16, block_h=64, block_ho=16, block_id=32, num_stages=1)
    y = moe_decode_quant(x, w, ids, qe, config=fma)
    assert rel(y, moe_decode_quant_torch(x, w, ids, qe)) < 1e-5
    assert rel(y, moe_decode_quant(x, w, ids, qe, config=replace(fma, block_m=16))) < 1e-5


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("cfg", SHAPES, ids=["tiny", "odd"])
@pytest.mark.parametrize("T", [2, 23])
def test_grouped_w8a16_matches_twin_and_reference(scheme, cfg, T):
    x, w, ids, qe = case(cfg, T, scheme, seed=T)
    y = moe_experts_quant(x, w, ids, qe)
    assert rel(y, moe_experts_quant_torch(x, w, ids, qe)) < 1e-5
    assert rel(y, reference(x, w, ids, qe)) < 1e-5


@pytest.mark.parametrize("scheme", ["fp8-channel", "fp8-block128"])
@pytest.mark.parametrize("T", [1, 12])
def test_grouped_w8a8_matches_twin(scheme, T):
    x, w, ids, qe = case(SHAPES[1], T, scheme, seed=T)
    cfg = GemmConfig(block_m=16, block_n=32, block_k=128, num_stages=1)
    y = moe_experts_quant(x, w, ids, qe, w8a8=True, config=cfg)
    assert rel(y, moe_experts_quant_torch(x, w, ids, qe, w8a8=True)) < 1e-5
    # fp8 activations cost accuracy: still close to the weight-only result (a few % of the output)
    assert rel(y, reference(x, w, ids, qe)) < 0.08


@pytest.mark.parametrize("scheme", ["fp8-channel", "fp8-block128"])
@pytest.mark.parametrize("cfg", SHAPES, ids=["tiny", "odd"])
@pytest.mark.parametrize("T,one_expert", [(1, False), (5, True), (20, False)])
def test_decode_w8a8_matches_twin(scheme, cfg, T, one_expert):
    """fp8 activations on the decode kernels: x and h quantized per token and 128 columns, the codes
    straight into the dot; rows > 16 of one expert (T = 20) in two row blocks, all tokens to one
    expert, edges of the odd shape (a 64-column last group)."""
    x, w, ids, qe = case(cfg, T, scheme, seed=T + 11, one_expert=one_expert)
    tiles_ = DecodeConfig(block_i=16, block_h=64, block_ho=16, block_id=32, num_stages=1)
    y = moe_decode_quant(x, w, ids, qe, w8a8=True, config=tiles_)
    assert rel(y, moe_decode_quant_torch(x, w, ids, qe, w8a8=True)) < 1e-5
    assert rel(y, reference(x, w, ids, qe)) < 0.08  # fp8 activations: a few % of the output
    if scheme == "fp8-block128":  # the grouped w8a8 path scales activations alike: the same layer
        assert rel(y, moe_experts_quant(x, w, ids, qe, w8a8=True, config=GemmConfig(
            block_m=16, block_n=32, block_k=128, num_stages=1))) < 1e-5


def test_decode_w8a8_fits_its_tiles_and_refuses_what_cannot_run():
    """Without a config the launcher's tiles go through fit_w8a8 (16 rows, chunks ≥ 32, three
    launches); a given config that needs that is refused, naming it; int8 codes are refused."""
    x, w, ids, qe = case(MoEConfig(128, 256, 4, 2), 3, "fp8-block128", seed=4)
    y = moe_decode_quant(x, w, ids, qe, w8a8=True)
    assert rel(y, moe_decode_quant_torch(x, w, ids, qe, w8a8=True)) < 1e-5
    for bad in (DecodeConfig(block_m=1, block_h=64, block_id=32), DecodeConfig(block_h=16, block_id=32),
                DecodeConfig(block_h=256, block_id=32), DecodeConfig(block_h=64, block_id=32, fused=1)):
        with pytest.raises(ValueError, match="w8a8 decode runs fp8 MMAs"):
            moe_decode_quant(x, w, ids, qe, w8a8=True, config=bad)
    x, w, ids, qe = case(SHAPES[0], 3, "int8-channel")
    with pytest.raises(ValueError, match="w8a8 multiplies fp8 by fp8"):
        moe_decode_quant(x, w, ids, qe, w8a8=True)


def test_grouped_w8a8_takes_an_up_down_pair_of_tiles():
    """Tuned entries give the two kernels their own tiles (one block_m: the sort's); same result."""
    x, w, ids, qe = case(SHAPES[1], 12, "fp8-channel", seed=5)
    one = GemmConfig(block_m=16, block_n=32, block_k=128, num_stages=1)
    pair = (one, GemmConfig(block_m=16, block_n=64, block_k=32, num_stages=1))
    y = moe_experts_quant(x, w, ids, qe, w8a8=True, config=pair)
    assert rel(y, moe_experts_quant_torch(x, w, ids, qe, w8a8=True)) < 1e-5
    with pytest.raises(ValueError, match="share block_m"):
        moe_experts_quant(x, w, ids, qe, w8a8=True, config=(one, GemmConfig(block_m=32)))
    with pytest.raises(ValueError, match="a GemmConfig or an"):
        moe_experts_quant(x, w, ids, qe, w8a8=True, config=(one,))


def test_grouped_w8a8_scales_each_activation_as_its_weight_demands():
    """H = 128, I = 256 in 128 × 128 blocks: x meets gate_up with one scale a row (per-token
    activation scales), h meets down with two (per 128 columns); the twin decides alike."""
    x, w, ids, qe = case(MoEConfig(128, 256, 4, 2), 9, "fp8-block128", seed=3)
    assert qe.gate_up.per_row and not qe.down.per_row
    y = moe_experts_quant(x, w, ids, qe, w8a8=True, config=GemmConfig(block_m=16, block_n=32, block_k=128,
                                                                       num_stages=1))
    assert rel(y, moe_experts_quant_torch(x, w, ids, qe, w8a8=True)) < 1e-5


@triton.jit
def _round_kernel(x_ptr, o_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(o_ptr + offs, _e4m3_round(v), mask=offs < n)


def test_e4m3_round_matches_torch_conversion():
    g = torch.Generator().manual_seed(0)
    v = torch.cat([torch.randn(4000, generator=g) * 100, torch.randn(2000, generator=g) * 0.01,
                   torch.tensor([127.4, -127.9, 0.0, 448.0, -448.0, 2 ** -10, 3 * 2 ** -10, 2 ** -6 * 0.99])])
    v = v.clamp(-448, 448)
    out = torch.empty_like(v)
    _round_kernel[(triton.cdiv(v.numel(), 512),)](v, out, v.numel(), BLOCK=512)
    assert torch.equal(out, v.to(FP8).float())


def rows_case(M, K, seed=0, dev="cpu", dtype=torch.float32):
    """Rows of mixed magnitudes, one all-zero row and one with a single huge entry."""
    g = torch.Generator(device=dev).manual_seed(seed)
    a = torch.randn(M, K, generator=g, device=dev) * torch.logspace(-3, 3, M, device=dev)[:, None]
    if M > 2:
        a[1] = 0.0
        a[2, K // 2] = 3e4
    return a.to(dtype)


@pytest.mark.parametrize("M,K", [(1, 128), (37, 192), (16, 1000)])
def test_fp8_rows_bitwise_twin(M, K):
    """The w8a8 activation quantizer: codes (as values: the interpreter may write -0 as +0) and scales
    bitwise the twin's (IEEE division in both);
    a scale is amax / 448, an all-zero row gets 1e-30 / 448 and zero codes, |codes| <= 448."""
    a = rows_case(M, K, seed=K)
    q, s = fp8_rows(a)
    q_t, s_t = quantize_fp8_rows(a)
    assert q.dtype == FP8 and q.shape == (M, K) and s.shape == (M, -(-K // 128))
    assert torch.equal(s, s_t) and torch.equal(q.float(), q_t.float())
    assert torch.equal(s[:, 0], (a[:, :128].abs().amax(1).clamp_min(1e-30) / FP8_MAX))
    assert q.float().abs().max() <= FP8_MAX
    if M > 2:
        assert not q[1].float().any() and q[2].float().abs().max() == FP8_MAX
    strided = torch.cat([a, a], dim=1)[:, ::2]  # a non-contiguous view: copied, same answer
    assert torch.equal(fp8_rows(strided)[1], quantize_fp8_rows(strided)[1])


def test_fp8_rows_used_blocks_only():
    """Given the sort's used-block count (on the device), only those blocks' rows are touched: rows
    after them may hold anything (here NaN) and are neither read nor written."""
    a = rows_case(40, 256, seed=5)
    a[32:] = float("nan")  # the unwritten slots of unused blocks
    used = torch.tensor([2], dtype=torch.int32)  # 2 blocks of 16 rows
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the interpreter warns on NaN / NaN: a NaN row was read
        q, s = fp8_rows(a, used_blocks_1=used, block_rows=16)
    q_t, s_t = quantize_fp8_rows(a[:32])
    assert torch.equal(s[:32], s_t) and torch.equal(q[:32].float(), q_t.float())
    with pytest.raises(ValueError, match="used_blocks_1 must be"):
        fp8_rows(a, used_blocks_1=used.long(), block_rows=16)


def test_fp8_rows_edges_and_bad_input():
    q, s = fp8_rows(torch.zeros(0, 256))
    assert q.shape == (0, 256) and s.shape == (0, 2)
    for bad, match in ((torch.zeros(3, 4, 5), r"\[M, K\]"), (torch.zeros(3, 4, dtype=torch.int32), "floating"),
                       ([1.0], "floating")):
        with pytest.raises(ValueError, match=match):
            fp8_rows(bad)
    with pytest.raises(ValueError, match="group must be"):
        fp8_rows(torch.zeros(2, 128), group=100)


def test_empty_batch_and_bad_inputs():
    cfg = SHAPES[0]
    x, w, ids, qe = case(cfg, 3, "int8-channel")
    assert moe_decode_quant(x[:0], w[:0], ids[:0], qe).shape == (0, cfg.H)
    assert moe_experts_quant(x[:0], w[:0], ids[:0], qe).shape == (0, cfg.H)
    bad = ids.clone()
    bad[0, 0] = cfg.E
    for fn in (moe_decode_quant, moe_experts_quant):
        with pytest.raises(ValueError, match=r"ids_TK must hold expert ids in \[0, E="):
            fn(x, w, bad, qe, check_ids=True)
        with pytest.raises(ValueError, match="QuantizedExperts"):
            fn(x, w, ids, qe.gate_up)
        with pytest.raises(ValueError, match="H="):
            fn(x[:, :32], w, ids, qe)
    with pytest.raises(ValueError, match="w8a8 multiplies fp8 by fp8"):
        moe_experts_quant(x, w, ids, qe, w8a8=True)
    x, w, ids, q8 = case(SHAPES[1], 3, "fp8-block128")  # H, I > 128: more than one scale per row
    with pytest.raises(ValueError, match="block_k must be 128"):
        moe_experts_quant(x, w, ids, q8, w8a8=True, config=GemmConfig(block_m=16, block_k=64))


def test_chunks_must_fit_the_scale_blocks():
    x, w, ids, qe = case(MoEConfig(512, 256, 4, 2), 2, "int8-group128")
    with pytest.raises(ValueError, match="block_h=256 must divide the scale block of 128"):
        moe_decode_quant(x, w, ids, qe, config=DecodeConfig(block_h=256))
    with pytest.raises(ValueError, match="block_k=256 must divide"):
        moe_experts_quant(x, w, ids, qe, config=GemmConfig(block_m=16, block_k=256))


# ---- compiled kernels on a GPU ----

@pytest.mark.gpu
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("cfg,T", [(MoEConfig(2048, 1024, 64, 8), t) for t in (1, 8, 64, 600, 4096)]
                         + [(SHAPES[1], 5), (SHAPES[1], 300)],
                         ids=["T1", "T8", "T64", "T600", "T4096", "odd-T5", "odd-T300"])
def test_gpu_quant_kernels(scheme, cfg, T):
    """Compiled kernels (QUANT=True) vs the twin; T=4096 takes the 128-row blocks, the odd shape
    (H=192, I=160) partial chunks and scale blocks straddling gate and up."""
    dev = torch.device("cuda")
    if scheme.startswith("fp8") and runtime.capability(dev) < (8, 9):
        pytest.skip("fp8 e4m3 codes need sm_89+")
    dt = runtime.compute_dtype(dev)
    x, w, ids, qe = case(cfg, T, scheme, seed=T, dev=dev, dtype=dt)
    twin = moe_experts_quant_torch(x, w, ids, qe)
    if T <= 64:
        assert rel(moe_decode_quant(x, w, ids, qe), twin) < 1e-2
    assert rel(moe_experts_quant(x, w, ids, qe), twin) < 1e-2
    if scheme.startswith("fp8") and runtime.capability(dev) >= (8, 9):
        y8 = moe_experts_quant(x, w, ids, qe, w8a8=True)
        assert rel(y8, moe_experts_quant_torch(x, w, ids, qe, w8a8=True)) < 2e-2
        assert rel(y8, twin) < 0.08
        if T <= 64:  # the decode kernels on fp8 activations: the same layer
            y8d = moe_decode_quant(x, w, ids, qe, w8a8=True)
            assert rel(y8d, moe_decode_quant_torch(x, w, ids, qe, w8a8=True)) < 2e-2
            assert rel(y8d, twin) < 0.08


def test_a_bad_fp8_conversion_setting_is_refused():
    import os
    import subprocess
    import sys

    env = {**os.environ, "DISPATCH_FP8_CVT": "fast"}
    out = subprocess.run([sys.executable, "-c", "import dispatch.kernels.quant_kernels"], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode != 0 and "DISPATCH_FP8_CVT must be 'bits' (the default) or 'hw'" in out.stderr


@pytest.mark.gpu
def test_gpu_e4m3_to_bf16_by_bits_is_exact():
    """The kernels' fp8 → bf16 bit placement (``_codes_as``) equals torch's conversion, bitwise,
    on every e4m3 code but the two NaNs (the quantizer never writes them)."""
    from dispatch.kernels.quant_kernels import _codes_as

    dev = torch.device("cuda")
    if runtime.capability(dev) < (8, 9):
        pytest.skip("fp8 e4m3 needs sm_89+")

    @triton.jit
    def convert(q_ptr, y_ptr, N, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y_ptr + offs, _codes_as(tl.load(q_ptr + offs, mask=offs < N), tl.bfloat16), mask=offs < N)

    codes = torch.arange(256, dtype=torch.uint8, device=dev).repeat(5)[3:]  # 4-code groups cut mid-way
    y = torch.empty(codes.numel(), dtype=torch.bfloat16, device=dev)
    convert[(triton.cdiv(codes.numel(), 512),)](codes.view(FP8), y, codes.numel(), BLOCK=512)
    finite = (codes & 0x7F) != 0x7F
    want = codes.view(FP8).to(torch.bfloat16)
    assert torch.equal(y.view(torch.int16)[finite], want.view(torch.int16)[finite])


@pytest.mark.gpu
def test_gpu_fp8_rows_bitwise_twin():
    dev = torch.device("cuda")
    if runtime.capability(dev) < (8, 9):
        pytest.skip("fp8 e4m3 needs sm_89+")
    for dt in (torch.float32, runtime.compute_dtype(dev)):
        a = rows_case(300, 2048 + 64, seed=3, dev=dev, dtype=dt)
        q, s = fp8_rows(a)
        q_t, s_t = quantize_fp8_rows(a)
        assert torch.equal(s, s_t) and torch.equal(q.view(torch.uint8), q_t.view(torch.uint8))


@pytest.mark.parametrize("batch,seq", [(1, 3), (2, 40)], ids=["decode", "grouped"])
def test_swapped_experts_run_our_kernels_in_a_transformers_model(batch, seq):
    from dispatch.hf import moe_blocks, tiny_model

    _, model = tiny_model("olmoe", num_hidden_layers=1)  # one MoE block: a second swaps the same way
    layers = quant.quantize_model(model, "int8-group128")
    want = quant.dequantized_model(model, layers)
    got = quant.swap_experts(quant.dequantized_model(model, layers), layers)
    assert all(type(b.experts).__name__ == "QuantizedExpertsModule" for _, b in moe_blocks(got))
    ids = torch.randint(0, 128, (batch, seq), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert rel(got(input_ids=ids).logits, want(input_ids=ids).logits) < 1e-5
    with pytest.raises(ValueError, match="do not match"):
        quant.swap_experts(model, {7: layers[0]})
