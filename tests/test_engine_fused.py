"""The lean forward's fused glue kernels against their plain-PyTorch twins (fp32; Triton's
interpreter on CPU). Tolerance: 1e-5 relative to the largest |value| (fp32 reorderings)."""
import pytest
import torch

from dispatch.engine import LeanModel
from dispatch.hf import tiny_model
from dispatch.kernels.norm_rope import add_rms, add_rms_torch, qk_rope, qk_rope_torch

TOL = 1e-5


def close(a, b):
    return (a - b).abs().max().item() <= TOL * max(b.abs().max().item(), 1e-30)


@pytest.mark.parametrize("T,H,with_d", [(1, 64, True), (5, 96, True), (3, 128, False), (0, 64, True)])
def test_add_rms(T, H, with_d):
    g = torch.Generator().manual_seed(T + H)
    x, d, w = torch.randn(T, H, generator=g), torch.randn(T, H, generator=g), torch.randn(H, generator=g)
    x2 = x.clone()
    y = add_rms(x, d if with_d else None, w, 1e-5)
    y2 = add_rms_torch(x2, d if with_d else None, w, 1e-5)
    assert torch.allclose(x, x2) and (T == 0 or close(y, y2))


@pytest.mark.parametrize("norm,NH,NKV,S", [("none", 4, 2, 1), ("full", 4, 4, 3), ("head", 2, 1, 2), ("none", 3, 1, 4)])
def test_qk_rope_and_cache_write(norm, NH, NKV, S):
    D, B, Sc = 16, 2, 8
    g = torch.Generator().manual_seed(NH * 10 + S)
    qkv = torch.randn(B * S, (NH + 2 * NKV) * D, generator=g)
    pos = torch.randint(0, Sc, (B * S,), generator=g)
    qn = torch.randn(NH * D if norm == "full" else D, generator=g) if norm != "none" else None
    kn = torch.randn(NKV * D if norm == "full" else D, generator=g) if norm != "none" else None
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2).float() / D))
    caches = [torch.zeros(B, Sc, NKV, D) for _ in range(4)]
    q = qk_rope(qkv, pos, S, qn, kn, norm, inv, 1.0, 1e-5, caches[0], caches[1], NH)
    q2 = qk_rope_torch(qkv, pos, S, qn, kn, norm, inv, 1.0, 1e-5, caches[2], caches[3], NH)
    assert close(q, q2) and close(caches[0], caches[2]) and torch.equal(caches[1], caches[3])


def test_qk_rope_rejects_bad_shapes():
    cache = torch.zeros(1, 4, 2, 16)
    with pytest.raises(ValueError, match="qkv must be"):
        qk_rope(torch.zeros(1, 10), torch.zeros(1, dtype=torch.long), 1, None, None, "none", torch.ones(8), 1.0,
                1e-5, cache, cache, 4)
    with pytest.raises(ValueError, match="contiguous"):
        add_rms(torch.zeros(4, 8).t(), None, torch.ones(4), 1e-5)


@pytest.mark.parametrize("decode_kernels", [False, True])
@pytest.mark.parametrize("family", ["olmoe", "qwen3_moe", "qwen2_moe"])
def test_lean_forward_fused_matches_transformers(family, decode_kernels):
    """Prefill and one decode step; ``decode_kernels``: the step's projections through linear_small
    and its attention through decode_attention (else cuBLAS and SDPA with a mask)."""
    _, model = tiny_model(family)
    lean = LeanModel.from_hf(model, fused=True, decode_kernels=decode_kernels)
    assert lean.decode_kernels is decode_kernels
    ids = torch.randint(0, 128, (2, 6), generator=torch.Generator().manual_seed(4))
    cache = lean.new_cache(2, 8)
    with torch.no_grad():
        ref = model(ids).logits
        pre = lean(ids[:, :5], torch.arange(5).expand(2, 5), cache, prefill=True)
        step = lean(ids[:, 5:], torch.full((2, 1), 5), cache, prefill=False)
    assert close(pre, ref[:, :5]) and close(step[:, 0], ref[:, 5])
