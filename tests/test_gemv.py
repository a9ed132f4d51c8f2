"""The decode kernels (dispatch.kernels.gemv) against the reference, the twin and hand-made cases.

CPU: Triton's interpreter in fp32 (and one fp16 case), tiny shapes. GPU (marker ``gpu``): compiled,
bf16 at the benchmark shapes, with the tolerance documented in ``BF16_TOL``, and bitwise repeats.
"""
from dataclasses import replace

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from dispatch.kernels.gemv import DecodeConfig, decode_loop_torch, expert_bytes_read, moe_decode, moe_decode_torch
from dispatch.reference import experts_reference

FP32_TOL = dict(atol=1e-5, rtol=1e-4)  # fp32 both ways; only the summation order differs
# bf16 on a GPU: the reference rounds gate/up, silu·up, down, ×weight and every running sum to bf16;
# we round h once and the output once. Measured rel. errors are ~3e-3; we allow 2e-2 (norm-wise).
BF16_TOL = 2e-2


def make(T, K, E, H, I, *, seed=0, dtype=torch.float32, device="cpu", ids=None):  # noqa: E741
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g)
    gu = torch.randn(E, 2 * I, H, generator=g) / H ** 0.5
    dn = torch.randn(E, H, I, generator=g) / I ** 0.5
    if ids is None:
        ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)]) if T else torch.zeros(0, K)
    w = torch.rand(T, K, generator=g)
    cast = dict(dtype=dtype, device=device)
    return (x.to(**cast), w.to(device), ids.long().to(device), gu.to(**cast), dn.to(**cast))


def check(args, **kw):
    y = moe_decode(*args, **kw)
    torch.testing.assert_close(y, experts_reference(*args), **FP32_TOL)
    torch.testing.assert_close(y, moe_decode_torch(*args), **FP32_TOL)
    return y


# random layers and routings (with T): programs=1, one program walks every (expert, tile) item; 3, items
# dealt round-robin, unevenly; skew, most rows crowded onto a few experts
RANDOM = dict(E=st.integers(1, 9), K=st.integers(1, 9), H=st.sampled_from([16, 40]), I=st.sampled_from([16, 24, 32]),
              seed=st.integers(0, 2**16), skew=st.booleans(), programs=st.sampled_from([1, 3, 1024]))


def random_case(T, E, K, H, I, seed, skew):  # noqa: E741
    """``make`` for a RANDOM draw (K capped at E); with ``skew`` the rows crowd onto the first and
    last experts, and the others get nothing."""
    K = min(K, E)
    x, w, ids, gu, dn = make(T, K, E, H, I, seed=seed)
    if skew and T and E > K:
        ids = torch.stack([torch.arange(K) + (t % 2) * (E - K) for t in range(T)])
    return x, w, ids, gu, dn


@given(T=st.integers(0, 12), **RANDOM)
def test_random_shapes_and_routings(T, E, K, H, I, seed, skew, programs):  # noqa: E741
    x, w, ids, gu, dn = random_case(T, E, K, H, I, seed, skew)
    # programs=1: one program walks every (expert, tile) item; 3: items dealt round-robin, unevenly
    config = DecodeConfig(block_i=16, block_h=32, block_ho=16, block_id=32, num_stages=1,
                          programs=programs)
    check((x, w, ids, gu, dn), config=config)


def test_worked_example():
    """T=3, K=2, E=4: experts 0 and 3 share token 1; expert 2 receives nothing."""
    x, w, _, gu, dn = make(3, 2, 4, 32, 16)
    ids = torch.tensor([[1, 0], [3, 0], [1, 3]])
    y = check((x, w, ids, gu, dn))
    # hand-built: token 1 = w[1,0]·expert3(x1) + w[1,1]·expert0(x1)
    def expert(e, v):
        g, u = (gu[e] @ v).chunk(2)
        return dn[e] @ (torch.nn.functional.silu(g) * u)
    torch.testing.assert_close(y[1], w[1, 0] * expert(3, x[1]) + w[1, 1] * expert(0, x[1]), **FP32_TOL)
    assert expert_bytes_read(ids, 32, 16, 4) == 3 * 3 * 32 * 16 * 4


def test_zero_tokens():
    x, w, ids, gu, dn = make(0, 2, 4, 32, 16)
    y = moe_decode(x, w, ids, gu, dn)
    assert y.shape == (0, 32)


def test_one_token_and_top_k_equals_experts():
    check(make(1, 1, 1, 32, 16))
    check(make(1, 6, 6, 48, 16, seed=3))
    check(make(5, 4, 4, 32, 16, seed=4))


def test_all_tokens_to_one_expert_spans_several_row_tiles():
    T = 37  # > 2 · block_m: the kernel loops over three row tiles of expert 5
    ids = torch.full((T, 1), 5)
    check(make(T, 1, 8, 32, 16, ids=ids))
    check(make(T, 1, 8, 32, 16, ids=ids), config=DecodeConfig(block_m=32, block_h=16, block_id=16))


def test_non_contiguous_inputs():
    x, w, ids, gu, dn = make(6, 2, 5, 32, 16, seed=7)
    args = (x.t().contiguous().t(),  # column-major x
            w.t().contiguous().t(), ids.t().contiguous().t(),
            gu.transpose(1, 2).contiguous().transpose(1, 2),  # last dim not contiguous
            dn.transpose(1, 2).contiguous().transpose(1, 2))
    assert not any(a.is_contiguous() for a in args)
    x2 = torch.empty(6, 64)[:, ::2].copy_(x)  # strided columns (copied by moe_decode)
    x3 = torch.empty(6, 80)[:, 8:40].copy_(x)  # row stride 80: read in place through stride(0)
    assert x3.stride() == (80, 1) and not x3.is_contiguous()
    for a in (args, (x2, *args[1:]), (x3, w, ids, gu, dn)):
        y = check(a)
        torch.testing.assert_close(y, moe_decode(x, w, ids, gu, dn), atol=0, rtol=0)


def test_grid_size_does_not_change_a_bit():
    """Each (expert, tile) item is computed the same way whichever program takes it: the output is
    bitwise the same for any grid, including grids with more programs than items."""
    x, w, ids, gu, dn = make(5, 3, 6, 32, 48, seed=3)
    ids[2] = torch.tensor([4, 4, 4])  # a repeated expert; expert 5 may get nothing
    tiles = dict(block_i=16, block_h=32, block_ho=16, block_id=32, num_stages=1)
    ys = [moe_decode(x, w, ids, gu, dn, config=DecodeConfig(**tiles, programs=p)) for p in (1, 2, 7, 500)]
    assert all(torch.equal(ys[0], y) for y in ys[1:])
    torch.testing.assert_close(ys[0], experts_reference(x, w, ids, gu, dn), **FP32_TOL)


def test_two_runs_are_bitwise_equal():
    args = make(12, 3, 6, 64, 32, seed=11)
    assert torch.equal(moe_decode(*args), moe_decode(*args))


def test_float16_on_the_interpreter():
    x, w, ids, gu, dn = make(4, 2, 4, 32, 16, seed=5, dtype=torch.float16)
    y = moe_decode(x, w, ids, gu, dn)
    assert y.dtype == torch.float16
    ref = experts_reference(x.float(), w, ids, gu.float(), dn.float())
    torch.testing.assert_close(y.float(), ref, atol=2e-2, rtol=2e-2)


def test_naive_loop_matches_reference():
    args = make(4, 2, 4, 32, 16, seed=9)
    torch.testing.assert_close(decode_loop_torch(*args), experts_reference(*args), **FP32_TOL)


@pytest.mark.parametrize("change, match", [
    (lambda a: (a[0][:, :-1], *a[1:]), "gate_up_E2IH"),
    (lambda a: (a[0], a[1], a[2].float(), *a[3:]), "int32 or int64"),
    (lambda a: (a[0], a[1][:, :1], *a[2:]), "weights_TK"),
    (lambda a: (a[0], a[1], a[2][:1], *a[3:]), "ids_TK"),
    (lambda a: (a[0].half(), *a[1:]), "share one dtype"),
    (lambda a: (a[0].bfloat16(), a[1], a[2], a[3].bfloat16(), a[4].bfloat16()), "cannot compute bfloat16"),
    (lambda a: (a[0].numpy(), *a[1:]), "torch.Tensor"),
    (lambda a: (a[0], torch.rand(3, 5), torch.zeros(3, 5, dtype=torch.long), *a[3:]), "K=5 experts per token"),
])
def test_bad_inputs_raise_before_launch(change, match):
    with pytest.raises(ValueError, match=match):
        moe_decode(*change(make(3, 2, 4, 32, 16)))


FMA = DecodeConfig(block_m=1, block_i=16, block_h=32, block_ho=16, block_id=32, num_stages=1)


@pytest.mark.parametrize("T,E,K,H,I", [(1, 6, 2, 40, 24), (1, 4, 4, 32, 16), (2, 5, 3, 40, 24), (6, 3, 2, 16, 32)])
def test_one_row_tiles_use_fmas_and_match(T, E, K, H, I):  # noqa: E741
    """block_m = 1 (FMAs on the CUDA cores, one row of an expert at a time): H and I tails, a token
    choosing every expert, and several rows of one expert (each its own pass over the weights)."""
    args = make(T, K, E, H, I, seed=T + E)
    y = check(args, config=FMA)
    torch.testing.assert_close(y, moe_decode(*args, config=replace(FMA, block_m=16)), **FP32_TOL)


def test_one_row_tiles_with_a_shared_expert_and_bad_ids():
    x, w, ids, gu, dn = make(2, 2, 4, 32, 16, seed=3)
    ids[1, 0] = 9  # outside [0, E): adds nothing
    sgu, sdn = torch.randn(2 * 32, 32) / 32 ** 0.5, torch.randn(32, 32) / 32 ** 0.5  # S = 2 I
    y = moe_decode(x, w, ids, gu, dn, shared=(sgu, sdn), config=FMA)
    torch.testing.assert_close(y, moe_decode_torch(x, w, ids, gu, dn, shared=(sgu, sdn)), **FP32_TOL)


def test_config_is_validated():
    with pytest.raises(ValueError, match="power of two"):
        DecodeConfig(block_i=24)
    with pytest.raises(ValueError, match="power of two"):
        DecodeConfig(block_m=2)  # 1 (FMAs) or a tl.dot tile of 16 or more
    assert DecodeConfig(block_m=1).block_m == 1
    with pytest.raises(ValueError, match="programs"):
        DecodeConfig(programs=0)
    assert DecodeConfig(programs=100).grid(8, 64) == 100  # 512 items: 5 or 6 per program
    assert DecodeConfig(programs=100).grid(8, 4) == 32  # no program without an item


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(64, 8, 2048, 1024), (8, 2, 4096, 14336), (128, 8, 2048, 768)])
@pytest.mark.parametrize("T", [1, 7, 64])
def test_gpu_bf16_against_reference(shape, T):
    E, K, H, I = shape  # noqa: E741
    x, w, ids, gu, dn = make(T, K, E, H, I, seed=T, dtype=torch.bfloat16, device="cuda")
    y = moe_decode(x, w, ids, gu, dn)
    ref = experts_reference(x.float(), w, ids, gu.float(), dn.float())  # fp32 ground truth
    assert ((y.float() - ref).norm() / ref.norm()).item() < BF16_TOL
    twin = moe_decode_torch(x, w, ids, gu, dn)
    assert ((y.float() - twin.float()).norm() / twin.float().norm()).item() < 1e-2
    assert torch.equal(y, moe_decode(x, w, ids, gu, dn))  # bitwise deterministic


@pytest.mark.gpu
def test_gpu_skewed_routing_and_int32_ids():
    T, E, H, I = 64, 64, 2048, 1024  # noqa: E741
    x, w, _, gu, dn = make(T, 8, E, H, I, dtype=torch.bfloat16, device="cuda")
    ids = torch.stack([torch.arange(8) for _ in range(T)]).int().cuda()  # 8 experts get 64 rows each
    y = moe_decode(x, w, ids, gu, dn)
    ref = experts_reference(x.float(), w, ids.long(), gu.float(), dn.float())
    assert ((y.float() - ref).norm() / ref.norm()).item() < BF16_TOL
    assert torch.equal(y, moe_decode(x, w, ids, gu, dn))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(64, 8, 2048, 1024), (8, 2, 4096, 14336), (128, 8, 2048, 768)])
def test_gpu_one_row_tiles_at_one_token(shape):
    """block_m = 1 compiled (FMAs): one token at the benchmark shapes, against fp32 and the 16-row tiles."""
    E, K, H, I = shape  # noqa: E741
    x, w, ids, gu, dn = make(1, K, E, H, I, seed=1, dtype=torch.bfloat16, device="cuda")
    y = moe_decode(x, w, ids, gu, dn, config=DecodeConfig(block_m=1, block_i=16, block_h=256, block_ho=16,
                                                          block_id=256, programs=528))
    ref = experts_reference(x.float(), w, ids, gu.float(), dn.float())
    assert ((y.float() - ref).norm() / ref.norm()).item() < BF16_TOL
    dot = moe_decode(x, w, ids, gu, dn, config=DecodeConfig(programs=528))
    assert ((y.float() - dot.float()).norm() / dot.float().norm()).item() < 1e-2
