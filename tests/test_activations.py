"""Gated activations as an axis (dispatch.activations): SwiGLU, GeGLU exact and GeGLU tanh through the
reference (transformers' own functions, bit for bit), every kernel epilogue (the ACT constexpr) against
its twin, the bitwise properties per activation (one launch = the chain; a row's bits alone = in a
batch, with pinned tiles), the quantized kernels, the transformers backend and the engine."""
import pytest
import torch
import torch.nn.functional as F

from dispatch import activations
from dispatch.config import MoEConfig
from dispatch.kernels import gemv, tiles
from dispatch.kernels import grouped_gemm as gg
from dispatch.kernels.gemv import DecodeConfig, moe_decode, moe_decode_torch
from dispatch.reference import experts_reference, gated_act, route_reference

ACTS = sorted(activations.ACTIVATIONS)
TOL = dict(atol=2e-5, rtol=2e-4)  # fp32: the kernels' erf/sigmoid and summation order against torch's
DECODE = DecodeConfig(block_i=16, block_h=32, block_ho=16, block_id=32, num_stages=1)


def case(T=6, E=8, K=2, H=48, I=40, seed=0):  # noqa: E741
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g)
    gu, dn = torch.randn(E, 2 * I, H, generator=g) / H ** 0.5, torch.randn(E, H, I, generator=g) / I ** 0.5
    w, ids = route_reference(torch.randn(T, E, generator=g), MoEConfig(H, I, E, K, norm_topk_prob=True))
    return x, w, ids, gu, dn


def test_the_table():
    codes = sorted(activations.get(n).code for n in ACTS)
    assert codes == list(range(len(ACTS))) and all(activations.by_code(c).code == c for c in codes)
    for name in ("silu", "swish", "gelu", "gelu_pytorch_tanh"):
        assert activations.from_hf(name).name in ACTS
    for bad in ("relu", "gelu_new", None):
        with pytest.raises(ValueError, match="hidden_act must be one of"):
            activations.from_hf(bad)
        with pytest.raises(ValueError, match="activation must be one of"):
            activations.get(bad)
    with pytest.raises(ValueError, match="activation must be one of"):
        MoEConfig(16, 8, 4, 2, activation="relu")
    with pytest.raises(ValueError, match="activation must be one of"):
        moe_decode(*case(), activation="relu")


@pytest.mark.parametrize("hidden_act", ["silu", "gelu", "gelu_pytorch_tanh"])
def test_the_reference_is_transformers_function_bit_for_bit(hidden_act):
    from transformers.activations import ACT2FN

    gate_up = torch.randn(33, 2 * 24, generator=torch.Generator().manual_seed(1)) * 3
    want = ACT2FN[hidden_act](gate_up[:, :24]) * gate_up[:, 24:]
    assert torch.equal(gated_act(gate_up, activations.from_hf(hidden_act).name), want)


@pytest.mark.parametrize("activation", ACTS)
def test_the_kernels_epilogue_matches_the_formula(activation):
    """One expert, one row per token: the grouped kernel's h against the activation written out."""
    x, w, ids, gu, dn = case(T=9, E=1, K=1, seed=2)
    routes = gg.sort_by_expert(ids, 1, 16)
    h = gg.grouped_up_swiglu(x, routes, gu, config=tiles.INTERPRET_CONFIG, activation=activation)
    g, u = (x @ gu[0].T).chunk(2, dim=-1)
    act = {"silu": F.silu, "gelu": F.gelu, "gelu_tanh": lambda v: 0.5 * v * (1 + torch.tanh(
        (2 / torch.pi) ** 0.5 * (v + 0.044715 * v ** 3)))}[activation]
    torch.testing.assert_close(h[routes.slot_of_N.long()], act(g) * u, **TOL)


@pytest.mark.parametrize("activation", ACTS)
def test_grouped_and_decode_match_their_twins_and_the_reference(activation):
    x, w, ids, gu, dn = case(seed=3)
    ref = experts_reference(x, w, ids, gu, dn, activation=activation)
    y_g = gg.moe_experts(x, w, ids, gu, dn, config=tiles.INTERPRET_CONFIG, activation=activation)
    y_d = moe_decode(x, w, ids, gu, dn, config=DECODE, activation=activation)
    torch.testing.assert_close(y_g, ref, **TOL)
    torch.testing.assert_close(y_d, moe_decode_torch(x, w, ids, gu, dn, activation=activation), **TOL)
    torch.testing.assert_close(y_d, ref, **TOL)
    other = [a for a in ACTS if a != activation][0]  # the switch switches: another activation, other numbers
    assert not torch.allclose(y_d, moe_decode(x, w, ids, gu, dn, config=DECODE, activation=other), atol=1e-4)


@pytest.mark.parametrize("activation", ACTS)
def test_one_launch_is_the_chain_bit_for_bit_and_split_items_agree(activation):
    from dataclasses import replace

    x, w, ids, gu, dn = case(T=3, seed=4)
    chain = moe_decode(x, w, ids, gu, dn, config=DECODE, activation=activation)
    assert torch.equal(moe_decode(x, w, ids, gu, dn, config=replace(DECODE, fused=1), activation=activation), chain)
    split = moe_decode(x, w, ids, gu, dn, config=replace(DECODE, split=1), activation=activation)
    torch.testing.assert_close(split, chain, **TOL)
    one_row = moe_decode(x[:1], w[:1], ids[:1], gu, dn, config=replace(DECODE, block_m=1), activation=activation)
    torch.testing.assert_close(one_row, chain[:1], **TOL)


@pytest.mark.parametrize("activation", ACTS)
def test_a_rows_bits_do_not_depend_on_its_batch(activation):
    """What expert parallelism relies on: with pinned tiles a token's output is the same bits computed
    alone or among others (grouped GEMM and decode kernels alike)."""
    x, w, ids, gu, dn = case(T=7, seed=5)
    for t in (0, 4):
        one = slice(t, t + 1)
        assert torch.equal(gg.moe_experts(x[one], w[one], ids[one], gu, dn, config=tiles.INTERPRET_CONFIG,
                                          activation=activation),
                           gg.moe_experts(x, w, ids, gu, dn, config=tiles.INTERPRET_CONFIG, activation=activation)[one])
        assert torch.equal(moe_decode(x[one], w[one], ids[one], gu, dn, config=DECODE, activation=activation),
                           moe_decode(x, w, ids, gu, dn, config=DECODE, activation=activation)[one])


@pytest.mark.parametrize("activation", ACTS)
def test_quantized_kernels_take_the_activation(activation):
    from dispatch.kernels.quant_gemv import moe_decode_quant, moe_decode_quant_torch
    from dispatch.kernels.quant_grouped import moe_experts_quant, moe_experts_quant_torch
    from dispatch.quant import quantize_experts

    x, w, ids, gu, dn = case(H=128, I=128, seed=6)
    qe = quantize_experts(gu, dn, "int8-group128")
    torch.testing.assert_close(moe_decode_quant(x, w, ids, qe, activation=activation),
                               moe_decode_quant_torch(x, w, ids, qe, activation=activation), **TOL)
    torch.testing.assert_close(moe_experts_quant(x, w, ids, qe, activation=activation),
                               moe_experts_quant_torch(x, w, ids, qe, activation=activation), **TOL)


@pytest.mark.parametrize("hidden_act", ["gelu", "gelu_pytorch_tanh"])
def test_transformers_geglu_models_run_through_the_backend_and_the_engine(hidden_act):
    """A model whose experts are GeGLU: the reference layer is transformers' block bit for bit, the
    'dispatch' experts backend (refused before) and the lean engine give transformers' logits."""
    from dispatch.engine import LeanModel, register, set_cpu_path
    from dispatch.hf import check_block, config_from_hf, moe_blocks, tiny_model

    hf_config, model = tiny_model("olmoe", hidden_act=hidden_act)
    assert config_from_hf(hf_config).activation == activations.from_hf(hidden_act).name
    x = torch.randn(11, 64, generator=torch.Generator().manual_seed(7))
    assert set(check_block(next(moe_blocks(model))[1], hf_config, x).values()) == {"bit-exact"}
    ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(0))
    register()
    with torch.no_grad():
        eager = model(ids).logits
        model.set_experts_implementation("dispatch")
        assert torch.equal(model(ids).logits, eager)  # CPU: the reference path, transformers' own ops
        set_cpu_path("kernels")
        try:
            torch.testing.assert_close(model(ids).logits, eager, atol=1e-4, rtol=1e-4)
        finally:
            set_cpu_path("reference")
        lean = LeanModel.from_hf(model)
        cache = lean.new_cache(2, 16)
        pos = torch.arange(9).expand(2, 9)
        torch.testing.assert_close(lean(ids, pos, cache, prefill=True), eager, atol=1e-4, rtol=1e-4)


def test_decode_rows_default_is_swiglu():
    x, w, ids, gu, dn = case(seed=8)
    assert torch.equal(gemv.decode_rows(x, w, ids, gu, dn, DECODE),
                       gemv.decode_rows(x, w, ids, gu, dn, DECODE, activation="silu"))
