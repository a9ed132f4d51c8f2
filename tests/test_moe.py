"""The entry point (``moe`` / ``MoELayer``) against the reference layer, on every path."""
from __future__ import annotations

import importlib

import pytest
import torch

from dispatch import PRESETS, MoEConfig, MoELayer, MoEWeights, moe, random_weights, runtime
from dispatch.kernels.gemv import DecodeConfig
from dispatch.kernels.tiles import GemmConfig
from dispatch.moe import DECODE_MAX_TOKENS, pick_path
from dispatch.reference import moe_reference

CFGS = {
    "tiny": PRESETS["tiny"],
    "renorm": MoEConfig(64, 32, 8, 2, norm_topk_prob=True, family="mixtral"),
    "shared": MoEConfig(64, 32, 8, 3, shared_intermediate_size=48, family="deepseek_moe"),
    "qwen2": MoEConfig(64, 32, 6, 2, shared_intermediate_size=32, shared_gate=True, family="qwen2_moe"),
    "v3": MoEConfig(64, 32, 16, 4, scoring="sigmoid", norm_topk_prob=True, n_group=4, topk_group=2,
                    routed_scaling_factor=2.5, correction_bias=True, shared_intermediate_size=32),
    "k_eq_e": MoEConfig(64, 32, 4, 4, family="olmoe"),
}


def rel_err(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("name", list(CFGS))
@pytest.mark.parametrize("path", ["torch", "triton", "decode"])
def test_paths_match_reference(name, path):
    cfg = CFGS[name]
    w = random_weights(cfg, seed=1)
    x = torch.randn(23, cfg.H, generator=torch.Generator().manual_seed(2))
    y = moe(x, cfg, w, path=path)
    assert y.shape == x.shape
    assert rel_err(y, moe_reference(x, cfg, w)) < 1e-5


@pytest.mark.parametrize("path", ["triton", "decode"])
def test_non_contiguous_input(path):
    cfg = CFGS["tiny"]
    w = random_weights(cfg, seed=6)
    x = torch.randn(cfg.H, 5, generator=torch.Generator().manual_seed(7)).T  # column-major [T, H]
    assert not x.is_contiguous()
    y = moe(x, cfg, w, path=path)
    # Against the reference on a contiguous copy. Not bitwise against moe(x.contiguous()): the
    # router and shared-expert matmuls run in torch, whose CPU BLAS rounds differently per stride
    # (the kernels themselves are stride-independent to the bit: test_grouped_gemm, test_gemv).
    assert rel_err(y, moe_reference(x.contiguous(), cfg, w)) < 1e-5


@pytest.mark.parametrize("T", [0, 1, 17, 70])
def test_auto_path_and_token_counts(T):
    cfg = CFGS["shared"]
    w = random_weights(cfg, seed=3)
    x = torch.randn(T, cfg.H, generator=torch.Generator().manual_seed(T))
    y = moe(x, cfg, w)
    assert y.shape == (T, cfg.H)
    if T:
        assert rel_err(y, moe_reference(x, cfg, w)) < 1e-5
        want = "decode" if T <= DECODE_MAX_TOKENS else "triton"  # T=1, 17 decode; 70 grouped GEMM
        assert pick_path(x) == "torch"  # CPU: the fast plain-PyTorch path; the interpreter only when asked
        assert torch.equal(y, moe_reference(x, cfg, w))
        if runtime.HAS_CUDA:
            assert pick_path(x.cuda()) == want


def test_three_d_input_and_module():
    cfg = CFGS["tiny"]
    w = random_weights(cfg, seed=4)
    x = torch.randn(2, 9, cfg.H, generator=torch.Generator().manual_seed(5))
    layer = MoELayer(cfg, w, path="triton")
    y = layer(x)
    assert y.shape == x.shape
    ref = moe_reference(x.reshape(-1, cfg.H), cfg, w).view(x.shape)
    assert rel_err(y, ref) < 1e-5
    assert torch.equal(y, layer(x)), "not bitwise repeatable"
    assert "path='triton'" in repr(layer)


def test_from_hf_block_matches_transformers():
    """MoELayer built from a transformers OLMoE block computes what the block computes."""
    from transformers import OlmoeConfig
    from transformers.models.olmoe.modeling_olmoe import OlmoeSparseMoeBlock

    torch.manual_seed(0)  # the block's own init and normal_ below draw from the global generator
    hf_cfg = OlmoeConfig(hidden_size=64, intermediate_size=32, num_experts=8, num_experts_per_tok=2)
    hf_cfg._experts_implementation = "eager"
    block = OlmoeSparseMoeBlock(hf_cfg).eval()
    for p in block.parameters():
        torch.nn.init.normal_(p, std=0.1)
    x = torch.randn(1, 13, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = block(x)
        want = out[0] if isinstance(out, tuple) else out
        y = MoELayer.from_hf(block, hf_cfg, path="triton")(x)
    assert rel_err(y, want) < 1e-5


class _LookedUp(Exception):
    pass


@pytest.mark.parametrize("pinned", [None, GemmConfig(16, 32, 32, 1, 4, 1)])
def test_auto_path_on_a_gpu_looks_up_the_shapes_crossover(monkeypatch, pinned):
    # on a GPU "auto" asks the tile resolver for the shape's crossover, pinned tiles or not (a parameter
    # named like the resolver's module must not shadow it): stopped at the lookup, the CPU stands in
    moe_module = importlib.import_module("dispatch.moe")  # the module (dispatch.moe is also the function)

    seen = []

    def resolve(kind, key, dtype, device):
        seen.append((kind, key))
        raise _LookedUp

    cfg = CFGS["tiny"]
    w = random_weights(cfg, seed=1)
    monkeypatch.setattr(moe_module, "resolve", resolve)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    with pytest.raises(_LookedUp):
        moe(torch.randn(4, cfg.H), cfg, w, path="auto", tiles=pinned)
    assert seen == [("crossover", (0, cfg.K, cfg.E, cfg.H, cfg.I))]


def test_tiles_must_match_the_chosen_path():
    cfg = CFGS["tiny"]
    w = random_weights(cfg, seed=0)
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(1))
    gemm, dec = GemmConfig(16, 32, 32, 4, 1), DecodeConfig(block_i=16, block_h=32, block_ho=16, block_id=32)
    assert rel_err(moe(x, cfg, w, path="triton", tiles=gemm), moe_reference(x, cfg, w)) < 1e-5
    assert rel_err(moe(x, cfg, w, path="decode", tiles=dec), moe_reference(x, cfg, w)) < 1e-5
    for path, tiles, match in (("decode", gemm, "path='decode', got tiles=GemmConfig"),
                               ("triton", dec, "path='triton', got tiles=DecodeConfig"),
                               ("torch", gemm, "path='torch', got tiles="),
                               ("auto", dec, "path='auto' chose 'torch'"),
                               ("triton", "fast", "got tiles='fast'")):
        with pytest.raises(ValueError, match=match):
            moe(x, cfg, w, path=path, tiles=tiles)
    with pytest.raises(TypeError):  # the old name is gone: it was silently ignored on the decode path
        moe(x, cfg, w, config=gemm)
    with pytest.raises(ValueError, match="tiles must be a GemmConfig or a DecodeConfig"):
        MoELayer(cfg, w, tiles="fast")


def test_cfg_and_weights_must_be_what_they_say():
    w = random_weights(CFGS["tiny"])
    with pytest.raises(ValueError, match="cfg must be a dispatch.MoEConfig, got str 'fast'"):
        moe(torch.randn(2, 64), "fast", w)
    with pytest.raises(ValueError, match="w must be a dispatch.MoEWeights"):
        MoELayer(CFGS["tiny"], w.tensors())


def test_torch_path_layer_is_the_reference_bit_for_bit():
    for cfg in CFGS.values():
        w = random_weights(cfg, seed=2)
        x = torch.randn(2, 7, cfg.H, generator=torch.Generator().manual_seed(3))
        assert torch.equal(MoELayer(cfg, w, path="torch")(x), moe_reference(x.view(14, -1), cfg, w).view(x.shape))


def test_layer_validates_weights_once(monkeypatch):
    cfg = CFGS["shared"]
    calls = []
    real = MoEWeights.validate
    monkeypatch.setattr(MoEWeights, "validate", lambda self, c: calls.append(1) or real(self, c))
    layer = MoELayer(cfg, random_weights(cfg), path="torch")
    assert len(calls) == 1
    for _ in range(3):
        layer(torch.randn(3, cfg.H))
    assert len(calls) == 1
    layer.to(torch.float64)  # moved or cast: checked once more, then not again
    assert len(calls) == 2 and layer.weights.gate_up_E2IH.dtype == torch.float64
    layer(torch.randn(3, cfg.H, dtype=torch.float64))
    moe(torch.randn(3, cfg.H), cfg, random_weights(cfg))  # the function validates on every call
    assert len(calls) == 3


@pytest.mark.parametrize("kw, match", [
    (dict(top_k=True), "top_k must be a positive int, got True"),
    (dict(num_experts=8.0), "num_experts must be a positive int"),
    (dict(routed_scaling_factor=float("nan")), "routed_scaling_factor must be a finite number > 0"),
    (dict(routed_scaling_factor=float("inf")), "routed_scaling_factor"),
    (dict(routed_scaling_factor=-1.0), "routed_scaling_factor"),
    (dict(routed_scaling_factor=True), "routed_scaling_factor"),
    (dict(correction_bias=True), "correction_bias .* needs scoring='sigmoid'"),
    (dict(norm_topk_prob=1), "norm_topk_prob must be a bool"),
    (dict(family=3), "family must be a non-empty string"),
    (dict(shared_intermediate_size=2.5), "shared_intermediate_size must be an int"),
])
def test_config_rejects_what_it_cannot_mean(kw, match):
    with pytest.raises(ValueError, match=match):
        MoEConfig(**{**dict(hidden_size=64, intermediate_size=32, num_experts=8, top_k=2), **kw})


@pytest.mark.parametrize("bad,match", [
    (dict(path="fast"), "path must be one of"),
    (dict(x=torch.randn(4, 32)), r"shape \[T, H=64\]"),
    (dict(x=torch.randn(4, 64).double()), "x is torch.float64 on cpu but the weights are torch.float32"),
])
def test_bad_input(bad, match):
    cfg = CFGS["tiny"]
    w = random_weights(cfg, seed=0)
    x = bad.get("x", torch.randn(4, 64))
    with pytest.raises(ValueError, match=match):
        moe(x, cfg, w, path=bad.get("path", "auto"))


def test_bf16_on_cpu_goes_to_torch():
    cfg = CFGS["tiny"]
    w = random_weights(cfg, seed=0, dtype=torch.bfloat16)
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(6)).bfloat16()
    assert pick_path(x) == "torch"
    with pytest.raises(ValueError, match="cannot compute bfloat16 under Triton's CPU interpreter"):
        moe(x, cfg, w, path="triton")
    assert torch.equal(moe(x, cfg, w), moe_reference(x, cfg, w))


@pytest.mark.gpu
@pytest.mark.skipif(not runtime.HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("T", [1, 8, 200, 3000])
def test_gpu_layer_bf16(T):
    cfg = PRESETS["olmoe-1b-7b"]
    w = random_weights(cfg, seed=0, dtype=torch.bfloat16, device="cuda")
    x = torch.randn(T, cfg.H, generator=torch.Generator().manual_seed(T)).to("cuda", torch.bfloat16)
    y = moe(x, cfg, w)
    assert rel_err(y, moe_reference(x, cfg, w)) < 1e-2
    assert torch.equal(y, moe(x, cfg, w))
