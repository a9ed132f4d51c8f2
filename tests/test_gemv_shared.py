"""The decode kernels with a shared expert riding along (``moe_decode(shared=)``): S / I more experts
that every token chooses with weight 1 — against the routed reference plus the shared MLP computed
apart, against the twin, and through ``moe(path="decode")``. CPU: Triton's interpreter in fp32."""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatch.config import MoEConfig, random_weights
from dispatch.kernels.gemv import DecodeConfig, moe_decode, moe_decode_torch
from dispatch.moe import moe
from dispatch.reference import experts_reference, moe_reference

FP32_TOL = dict(atol=1e-5, rtol=1e-4)  # fp32 both ways; only the summation order differs
SMALL = DecodeConfig(block_i=16, block_h=32, block_ho=16, block_id=16, num_stages=1)


def make(T, K, E, H, I, n, *, seed=0, ids=None):  # noqa: E741
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g)
    gu = torch.randn(E, 2 * I, H, generator=g) / H ** 0.5
    dn = torch.randn(E, H, I, generator=g) / I ** 0.5
    sgu = torch.randn(2 * n * I, H, generator=g) / H ** 0.5
    sdn = torch.randn(H, n * I, generator=g) / (n * I) ** 0.5
    if ids is None:
        ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)]) if T else torch.zeros(0, K)
    return x, torch.rand(T, K, generator=g), ids.long(), gu, dn, (sgu, sdn)


def shared_mlp(x, sgu, sdn):
    """The shared expert as its own three matmuls (dispatch.reference.shared_reference's meaning)."""
    S = sdn.shape[1]
    return F.linear(F.silu(F.linear(x, sgu[:S])) * F.linear(x, sgu[S:]), sdn)


def check(x, w, ids, gu, dn, shared, **kw):
    y = moe_decode(x, w, ids, gu, dn, shared=shared, **kw)
    want = experts_reference(x, w, ids, gu, dn) + shared_mlp(x, *shared)
    torch.testing.assert_close(y, want, **FP32_TOL)
    torch.testing.assert_close(y, moe_decode_torch(x, w, ids, gu, dn, shared=shared), **FP32_TOL)
    return y


@settings(max_examples=25, deadline=None)
@given(T=st.integers(1, 7), E=st.integers(1, 6), K=st.integers(1, 4), n=st.integers(1, 3),
       I=st.sampled_from([16, 24]), seed=st.integers(0, 2**16), programs=st.sampled_from([1, 3, 1024]))
def test_random_shapes_and_routings(T, E, K, n, I, seed, programs):  # noqa: E741
    K = min(K, E)
    check(*make(T, K, E, 32, I, n, seed=seed), config=DecodeConfig(
        block_i=16, block_h=32, block_ho=16, block_id=16, num_stages=1, programs=programs))


def test_ids_outside_the_routed_experts_add_nothing_and_never_alias_a_shared_one():
    """Ids E and E+1 would be the shared experts' own ids inside the kernels: they must still add
    nothing, like -1 and 99, while every token gets the shared expert once."""
    x, w, _, gu, dn, shared = make(4, 3, 4, 32, 16, 2, seed=3)
    ids = torch.tensor([[0, 4, 1], [5, -1, 2], [99, 3, 0], [1, 2, 3]])
    y = check(x, w, ids, gu, dn, shared, config=SMALL)
    ok = (ids >= 0) & (ids < 4)
    routed = experts_reference(x, torch.where(ok, w, 0.0), torch.where(ok, ids, 0), gu, dn)
    torch.testing.assert_close(y, routed + shared_mlp(x, *shared), **FP32_TOL)


def test_all_tokens_to_one_expert_and_one_token():
    x, w, _, gu, dn, shared = make(9, 1, 3, 32, 16, 2, seed=4)
    check(x, w, torch.full((9, 1), 2), gu, dn, shared, config=SMALL)  # 9 rows on expert 2: 1 row tile
    check(*make(1, 2, 4, 32, 16, 1, seed=5), config=SMALL)


def test_zero_tokens_and_bitwise_repeat():
    x, w, ids, gu, dn, shared = make(0, 2, 4, 32, 16, 2)
    assert moe_decode(x, w, ids, gu, dn, shared=shared).shape == (0, 32)
    args = make(5, 2, 4, 32, 16, 2, seed=6)
    assert torch.equal(moe_decode(*args[:5], shared=args[5], config=SMALL),
                       moe_decode(*args[:5], shared=args[5], config=SMALL))


@pytest.mark.parametrize("shared, match", [
    (lambda s: s[0], "pair"),
    (lambda s: (s[0][:, :-1], s[1]), "multiple of I"),
    (lambda s: (s[0][:-16], s[1]), "multiple of I"),
    (lambda s: (s[0][:40], s[1][:, :20]), "multiple of I"),
    (lambda s: (s[0].double(), s[1]), "float32"),
    (lambda s: (s[0], s[1].numpy()), "torch.Tensor"),
])
def test_bad_shared_inputs_raise_before_launch(shared, match):
    x, w, ids, gu, dn, s = make(3, 2, 4, 32, 16, 2)
    with pytest.raises(ValueError, match=match):
        moe_decode(x, w, ids, gu, dn, shared=shared(s))


def test_quantized_routed_experts_take_no_shared_expert():
    from dispatch import quant

    x, w, ids, gu, dn, shared = make(3, 2, 4, 128, 128, 1)
    q = quant.quantize_experts(gu, dn, "int8-channel")
    from dispatch.kernels.gemv import decode_rows
    with pytest.raises(ValueError, match="unquantized"):
        decode_rows(x, w, ids, q.gate_up, q.down, SMALL, shared=shared)


def test_moe_decode_path_runs_the_shared_expert_inside_the_kernels(monkeypatch):
    """moe(path="decode") on a DeepSeek-style layer (S = 2I, no gate) equals the reference layer, and
    the shared expert is not run apart in torch."""
    import sys

    moe_mod = sys.modules["dispatch.moe"]  # (the package exports the function moe under that name)
    cfg = MoEConfig(64, 32, 8, 2, shared_intermediate_size=64, family="deepseek_moe")
    w = random_weights(cfg, seed=2)
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(3))
    want = moe_reference(x, cfg, w)
    monkeypatch.setattr(moe_mod, "shared_reference", lambda *a: pytest.fail("shared expert run apart"))
    torch.testing.assert_close(moe(x, cfg, w, path="decode", tiles=SMALL), want, **FP32_TOL)


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 8, 64])
def test_gpu_bf16_deepseek_shape(T):
    """DeepSeek-MoE-16B's layer (E=64, K=6, H=2048, I=1408, S=2I) in bf16 against fp32 ground truth;
    two runs bitwise equal."""
    x, w, ids, gu, dn, (sgu, sdn) = make(T, 6, 64, 2048, 1408, 2, seed=T)
    cuda = [t.cuda() for t in (x, w, ids, gu, dn, sgu, sdn)]
    x, w, ids, gu, dn, sgu, sdn = [t.bfloat16() if t.is_floating_point() and t is not cuda[1] else t for t in cuda]
    y = moe_decode(x, w, ids, gu, dn, shared=(sgu, sdn))
    ref = experts_reference(x.float(), w, ids, gu.float(), dn.float()) + shared_mlp(x.float(), sgu.float(), sdn.float())
    assert ((y.float() - ref).norm() / ref.norm()).item() < 2e-2
    assert torch.equal(y, moe_decode(x, w, ids, gu, dn, shared=(sgu, sdn)))
