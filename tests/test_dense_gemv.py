"""linear_small (dispatch.kernels.dense_gemv) against F.linear, its fp32 twin and a hand-made case.

CPU: Triton's interpreter in fp32 and fp16, small shapes (N, K in 40..300). GPU (marker ``gpu``):
compiled, bf16 at OLMoE's projection shapes, repeatable bits, and capture in a CUDA graph.
"""
import pytest
import torch
import torch.nn.functional as F

from dispatch.kernels import dense_gemv, tile_configs, tile_rules
from dispatch.kernels.dense_gemv import (
    DENSE_CONFIGS,
    DenseGemvConfig,
    heuristic_dense,
    linear_small,
    linear_small_torch,
)
from dispatch.reference import rel_err

# fp32: both sides sum in fp32, only the order differs. fp16: the twin rounds the same fp32 sum once,
# so results are <= 1 fp16 ulp apart (2^-10 relative); CPU F.linear in fp16 rounds its own way: 2 ulps.
TWIN_TOL = {torch.float32: dict(atol=1e-5, rtol=1e-4), torch.float16: dict(atol=1e-3, rtol=1e-3)}
LINEAR_TOL = {torch.float32: dict(atol=1e-5, rtol=1e-4), torch.float16: dict(atol=2e-3, rtol=2e-3)}
# bf16 on a GPU: one rounding each side (2^-8 relative), cuBLAS may split K: norm-wise rel. error < 1e-2
BF16_TOL = 1e-2
OLMOE = {"qkv": (6144, 2048), "o": (2048, 2048), "lm_head": (50304, 2048)}
PINNED = (DenseGemvConfig(block_n=16, block_k=32, num_stages=1), DenseGemvConfig(block_n=4, block_k=64))


def make(M, N, K, *, dtype=torch.float32, bias=False, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g)
    w = torch.randn(N, K, generator=g) / K ** 0.5
    b = torch.randn(N, generator=g) if bias else None
    cast = dict(dtype=dtype, device=device)
    return x.to(**cast), w.to(**cast), b.to(**cast) if bias else None


def check(x, w, b, **kw):
    y = linear_small(x, w, b, **kw)
    assert y.shape == (x.shape[0], w.shape[0]) and y.dtype == x.dtype
    torch.testing.assert_close(y, linear_small_torch(x, w, b), **TWIN_TOL[x.dtype])
    torch.testing.assert_close(y, F.linear(x, w, b), **LINEAR_TOL[x.dtype])
    return y


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("M", [1, 2, 5, 16])
def test_matches_twin_and_f_linear(M, dtype, bias):
    seed = M * 10 + bias
    g = torch.Generator().manual_seed(seed)
    N, K = (int(v) for v in torch.randint(40, 301, (2,), generator=g))
    check(*make(M, 64, 96, dtype=dtype, bias=bias, seed=seed), config=PINNED[0])  # multiples of the tiles
    check(*make(M, 45, 65, dtype=dtype, bias=bias, seed=seed), config=PINNED[1])  # neither: a last K tile of 1
    check(*make(M, N, K, dtype=dtype, bias=bias, seed=seed))  # random, the heuristic's config


def test_worked_example():
    """The module docstring's example, alone (elementwise variant) and as 3 rows (tl.dot variant)."""
    x, w = torch.tensor([[1.0, 2.0]]), torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    b = torch.tensor([0.5, 0.0, -1.0])
    assert torch.equal(linear_small(x, w, b), torch.tensor([[1.5, 2.0, 2.0]]))
    x3 = torch.tensor([[1.0, 2.0], [0.0, 0.0], [-1.0, 3.0]])
    assert torch.equal(linear_small(x3, w, b), torch.tensor([[1.5, 2.0, 2.0], [0.5, 0.0, -1.0], [-0.5, 3.0, 1.0]]))


def test_strided_views():
    """x rows with a stride larger than K and a strided bias are read in place."""
    x_wide, w, b_wide = make(5, 70, 120, bias=True)[0], make(5, 70, 100)[1], torch.randn(140)
    x, b = x_wide[:, 10:110], b_wide[::2]
    check(x, w, b, config=PINNED[0])
    check(x[:1], w, b, config=PINNED[1])


def test_empty():
    x, w, _ = make(0, 40, 50)
    y = linear_small(x, w)
    assert y.shape == (0, 40) and y.dtype == torch.float32
    assert linear_small(torch.randn(3, 50), torch.randn(0, 50)).shape == (3, 0)


def test_every_candidate_config():
    x, w, b = make(3, 70, 200, bias=True, seed=7)
    for cfg in DENSE_CONFIGS:
        check(x[:1], w, b, config=cfg)
        check(x, w, b, config=cfg)


def test_rows_do_not_depend_on_the_batch():
    """Pinned tiles: a row gets the same bits among 2 rows or 16 (the heuristic only asks M == 1)."""
    x, w, b = make(16, 90, 130, bias=True, seed=3)
    y16 = linear_small(x, w, b)
    assert torch.equal(linear_small(x[:2], w, b), y16[:2])
    assert heuristic_dense(2, 6144, 2048, "cpu") == heuristic_dense(16, 6144, 2048, "cpu")


@pytest.mark.filterwarnings("ignore:invalid value encountered in matmul")  # the interpreter's numpy, on inf
def test_a_non_finite_row_leaves_the_others_alone():
    x, w, _ = make(4, 60, 80, seed=5)
    x[1, 7] = float("inf")
    y = linear_small(x, w, config=PINNED[0])
    good = [0, 2, 3]
    assert not y[1].isfinite().all() and y[good].isfinite().all()
    torch.testing.assert_close(y[good], linear_small_torch(x[good], w), **TWIN_TOL[torch.float32])


@pytest.mark.parametrize("name", list(OLMOE))
def test_heuristic_keeps_every_sm_busy(name):
    N, K = OLMOE[name]
    sms = tile_rules.DENSE_CPU_SMS  # sized as for an H100/H200
    one, eight = heuristic_dense(1, N, K, "cpu"), heuristic_dense(8, N, K, "cpu")
    assert -(-N // one.rows(1)) >= 2 * sms
    # tl.dot needs 16 rows a program: the O projection (N = 2048) then has 128 programs, one wave
    assert -(-N // eight.rows(8)) >= min(2 * sms, N // 16) and eight.rows(8) >= 16
    for M, cfg in ((1, one), (8, eight)):
        assert cfg.shared_bytes(M, 2) <= 227 * 1024 - tile_configs.HEADROOM  # an H200's per-program limit
        assert cfg.block_k <= K


BAD = {  # name: (make args, expected message)
    "x 1-D": (lambda: (torch.randn(8), torch.randn(4, 8)), r"x must be \[M, K\] and w \[N, K\]"),
    "w 3-D": (lambda: (torch.randn(2, 8), torch.randn(1, 4, 8)), r"x must be \[M, K\] and w \[N, K\]"),
    "K differs": (lambda: (torch.randn(2, 8), torch.randn(4, 9)), "must share K"),
    "K differs, M = 0": (lambda: (torch.randn(0, 8), torch.randn(4, 9)), "must share K"),
    "dtypes differ": (lambda: (torch.randn(2, 8), torch.randn(4, 8).half()), "share one float dtype"),
    "int dtype": (lambda: (torch.ones(2, 8, dtype=torch.int32),) * 2, "share one float dtype"),
    "devices differ": (lambda: (torch.randn(2, 8), torch.randn(4, 8, device="meta")), "same device"),
    "17 rows": (lambda: (torch.randn(17, 8), torch.randn(4, 8)), r"1\.\.16 rows, got M=17: use F\.linear"),
    "x last dim strided": (lambda: (torch.randn(8, 2).t(), torch.randn(4, 8)), "contiguous last dim"),
    "w last dim strided": (lambda: (torch.randn(2, 8), torch.randn(8, 4).t()), "contiguous last dim"),
    "bias shape": (lambda: (torch.randn(2, 8), torch.randn(4, 8), torch.randn(5)), r"bias must be a \[N\] = \[4\]"),
    "bias dtype": (lambda: (torch.randn(2, 8), torch.randn(4, 8), torch.randn(4).half()), "x's dtype and device"),
    "bias list": (lambda: (torch.randn(2, 8), torch.randn(4, 8), [0.0] * 4), r"bias must be a \[N\]"),
    "bf16 on CPU": (lambda: (torch.randn(2, 8).bfloat16(), torch.randn(4, 8).bfloat16()), "cannot compute bfloat16"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_inputs_raise_before_any_launch(name, monkeypatch):
    monkeypatch.setattr(dense_gemv, "_dense_gemv_kernel", None)  # a launch would fail with a TypeError
    args, message = BAD[name]
    with pytest.raises(ValueError, match=message):
        linear_small(*args())


def test_bad_configs():
    with pytest.raises(ValueError, match="config must be a DenseGemvConfig"):
        linear_small(torch.randn(2, 8), torch.randn(4, 8), config=(16, 32))
    for kw, message in [(dict(block_n=3), "block_n must be a power of two >= 1"),
                        (dict(block_k=8), "block_k must be a power of two >= 16"),
                        (dict(num_warps=3), "num_warps must be 1, 2, 4, 8 or 16"),
                        (dict(num_stages=0), r"num_stages must be an int in \[1, 8\]")]:
        with pytest.raises(ValueError, match=message):
            DenseGemvConfig(**kw)


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 8])
@pytest.mark.parametrize("name", list(OLMOE))
def test_gpu_bf16_olmoe_shapes_and_cuda_graph(name, M):
    N, K = OLMOE[name]
    x, w, b = make(M, N, K, dtype=torch.bfloat16, bias=name == "qkv", seed=M, device="cuda")
    y = linear_small(x, w, b)
    assert rel_err(y, F.linear(x, w, b)) < BF16_TOL and rel_err(y, linear_small_torch(x, w, b)) < BF16_TOL
    assert torch.equal(y, linear_small(x, w, b))  # deterministic: no atomics, fixed order
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y_graph = linear_small(x, w, b)
    for seed in (11, 12):
        x.copy_(torch.randn(M, K, generator=torch.Generator().manual_seed(seed)))  # new values, same storage
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y_graph, linear_small(x, w, b))
        assert rel_err(y_graph, F.linear(x, w, b)) < BF16_TOL
