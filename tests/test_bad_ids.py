"""One bad-id and non-finite policy on every path (see dispatch.checks).

    an expert id outside [0, E) never addresses memory and contributes nothing;
    ``check_ids=True`` raises a ValueError naming it;
    a NaN/Inf token gives a non-finite output row and disturbs no other row;
    every launcher refuses what it cannot compute (bf16 under the CPU interpreter, K > E).

CPU: Triton's interpreter, fp32, hypothesis over random batches. GPU (marker ``gpu``): compiled
kernels in bf16, including ids far outside [0, E) and CUDA-graph capture.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from dispatch import MoEConfig, MoELayer, moe, random_weights
from dispatch.kernels.gemv import DecodeConfig, decode_loop_torch, moe_decode, moe_decode_torch
from dispatch.kernels.grouped_gemm import moe_experts
from dispatch.kernels.persistent import moe_experts_persistent
from dispatch.kernels.tiles import GemmConfig
from dispatch.reference import experts_reference

CPU_TILES = GemmConfig(block_m=16, block_n=32, block_k=32, num_warps=4, num_stages=1)
EXPERTS = {  # every implementation of the routed experts, by name
    "reference": experts_reference,
    "grouped": lambda *a, **kw: moe_experts(*a, config=CPU_TILES, **kw),
    "persistent": lambda *a, **kw: moe_experts_persistent(*a, configs=(CPU_TILES, CPU_TILES), **kw),
    "decode": moe_decode,
    "decode_torch": moe_decode_torch,
    "decode_loop": decode_loop_torch,
}
KERNELS = ("grouped", "persistent", "decode")


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equal, NaNs included (``torch.equal`` is False wherever a NaN is)."""
    ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return a.dtype == b.dtype and torch.equal(a.view(ints), b.view(ints))


def make(T, K, E, H=32, I=16, *, seed=0, dtype=torch.float32, device="cpu"):  # noqa: E741
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g)
    gu = torch.randn(E, 2 * I, H, generator=g) / H ** 0.5
    dn = torch.randn(E, H, I, generator=g) / I ** 0.5
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    w = torch.rand(T, K, generator=g)
    cast = dict(dtype=dtype, device=device)
    return [x.to(**cast), w.to(device), ids.to(device), gu.to(**cast), dn.to(**cast)]


def sprinkle(case, data, E):
    """NaN/Inf into some tokens' x, ids outside [0, E) (and NaN weights) into some routed rows."""
    x, w, ids = case[0].clone(), case[1].clone(), case[2].clone()
    T, K = ids.shape
    bad_tokens = data.draw(st.sets(st.integers(0, T - 1), max_size=max(1, T // 3)))
    for t in bad_tokens:
        x[t, data.draw(st.integers(0, x.shape[1] - 1))] = data.draw(st.sampled_from([float("nan"), float("inf")]))
    for _ in range(data.draw(st.integers(0, T * K))):
        t, k = data.draw(st.integers(0, T - 1)), data.draw(st.integers(0, K - 1))
        ids[t, k] = data.draw(st.sampled_from([-1, -(2**20), E, E + 7, 2**31 - 1]))
        if data.draw(st.booleans()):
            w[t, k] = float("nan")  # the weight of a dropped row must not leak either
    return [x, w, ids, *case[3:]], bad_tokens


def dropped(case, E):
    """The same routing with every bad id replaced by expert 0 at weight 0: what 'adds nothing' means
    for finite tokens (a NaN/Inf token still gives NaN · 0 = NaN there, so compare finite rows only)."""
    x, w, ids = case[:3]
    ok = (ids >= 0) & (ids < E)
    return [x, torch.where(ok, w, 0.0), torch.where(ok, ids, 0), *case[3:]]


@given(st.integers(1, 10), st.integers(1, 4), st.integers(2, 6), st.sampled_from([torch.int32, torch.int64]),
       st.data())
def test_every_path_drops_bad_ids_and_keeps_non_finite_tokens_to_their_rows(T, K, E, id_dtype, data):
    K = min(K, E)
    case = make(T, K, E, seed=data.draw(st.integers(0, 2**16)))
    case[2] = case[2].to(id_dtype)
    bad_case, bad_tokens = sprinkle(case, data, E)
    good = [t for t in range(T) if t not in bad_tokens]
    want = experts_reference(*dropped(bad_case, E))  # bad ids at weight 0, ids valid
    for name, experts in EXPERTS.items():
        y = experts(*bad_case)
        assert y.shape == want.shape, name
        torch.testing.assert_close(y[good], want[good], atol=1e-5, rtol=1e-4, msg=name)
        ok_T = ((bad_case[2] >= 0) & (bad_case[2] < E)).any(dim=1)
        for t in bad_tokens:  # a non-finite token with a valid expert gives a non-finite row
            assert y[t].isfinite().all() != bool(ok_T[t]), (name, t)
        if any(not (0 <= e < E) for e in bad_case[2].flatten().tolist()):
            with pytest.raises(ValueError, match=r"ids_TK must hold expert ids in \[0, E="):
                experts(*bad_case, check_ids=True) if name not in ("decode_torch", "decode_loop") else \
                    experts_reference(*bad_case, check_ids=True)


@pytest.mark.parametrize("name", KERNELS)
def test_a_token_whose_ids_are_all_bad_gives_zeros(name):
    x, w, ids, gu, dn = make(3, 2, 4)
    ids[1] = torch.tensor([-1, 4])
    y = EXPERTS[name](x, w, ids, gu, dn)
    assert torch.equal(y[1], torch.zeros(32))


@pytest.mark.parametrize("path", ["torch", "triton", "decode"])
def test_whole_layer_non_finite_tokens(path):
    cfg = MoEConfig(32, 16, 8, 2, norm_topk_prob=True, shared_intermediate_size=16)
    w = random_weights(cfg, seed=1)
    x = torch.randn(9, 32, generator=torch.Generator().manual_seed(2))
    x[2, 5], x[6, 0], x[7] = float("nan"), float("inf"), float("-inf")
    y = moe(x, cfg, w, path=path)
    assert y[[2, 6, 7]].isfinite().all(dim=1).logical_not().all()
    good = [0, 1, 3, 4, 5, 8]
    assert y[good].isfinite().all()
    torch.testing.assert_close(y[good], moe(x[good], cfg, w, path="torch"), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("launcher", ["grouped", "persistent", "decode"])
def test_launchers_refuse_bf16_on_the_interpreter_and_k_above_e(launcher):
    x, w, ids, gu, dn = make(3, 2, 4)
    with pytest.raises(ValueError, match="cannot compute bfloat16 under Triton's CPU interpreter"):
        EXPERTS[launcher](x.bfloat16(), w, ids, gu.bfloat16(), dn.bfloat16())
    with pytest.raises(ValueError, match="K=5 experts per token is more than the E=4 experts"):
        EXPERTS[launcher](x, torch.rand(3, 5), torch.zeros(3, 5, dtype=torch.long), gu, dn)


def test_layer_refuses_bf16_kernel_paths_on_cpu_but_auto_takes_torch():
    cfg = MoEConfig(32, 16, 4, 2)
    w = random_weights(cfg, dtype=torch.bfloat16)
    x = torch.randn(3, 32).bfloat16()
    for path in ("triton", "decode"):
        with pytest.raises(ValueError, match=f"path='{path}' cannot compute bfloat16"):
            moe(x, cfg, w, path=path)
    assert moe(x, cfg, w).dtype == torch.bfloat16


# ---------------------------------------------------------------- GPU: compiled kernels
@pytest.mark.gpu
@pytest.mark.parametrize("name", ["grouped", "decode"])
@pytest.mark.parametrize("T", [5, 300])
def test_gpu_bad_ids_and_non_finite_tokens(name, T):
    E, K = 64, 8
    x, w, ids, gu, dn = make(T, K, E, H=256, I=128, seed=T, dtype=torch.bfloat16, device="cuda")
    ids[::3, 1] = -1
    ids[::4, 2] = E  # the first id past the end
    ids[::5, 3] = 2**31 - 1
    w[::4, 2] = float("nan")
    x[1, 7] = float("nan")
    x[3, 0] = float("inf")
    experts = moe_experts if name == "grouped" else moe_decode
    y = experts(x, w, ids, gu, dn)
    want = experts_reference(*(t.float() if t.is_floating_point() else t for t in dropped([x, w, ids, gu, dn], E)))
    good = [t for t in range(T) if t not in (1, 3)]
    err = (y[good].float() - want[good]).norm() / want[good].norm()
    assert err < 2e-2 and not y[1].isfinite().all() and not y[3].isfinite().all()
    assert same_bits(y, experts(x, w, ids, gu, dn))  # bitwise repeatable, NaN rows included
    with pytest.raises(ValueError, match="ids_TK must hold expert ids"):
        experts(x, w, ids, gu, dn, check_ids=True)


@pytest.mark.gpu
@pytest.mark.parametrize("path, T", [("decode", 4), ("triton", 256)])
def test_gpu_layer_cuda_graph_capture_with_a_nan_token(path, T):
    cfg = MoEConfig(256, 128, 16, 4, norm_topk_prob=True)
    layer = MoELayer(cfg, random_weights(cfg, dtype=torch.bfloat16, device="cuda"), path=path,
                     tiles=GemmConfig(64, 64, 64, 4, 3) if path == "triton" else DecodeConfig())
    x = torch.randn(T, 256, device="cuda", dtype=torch.bfloat16)
    layer(x)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = layer(x)
    x[1, 3] = float("nan")
    graph.replay()
    torch.cuda.synchronize()
    assert not y[1].isfinite().any() and y[[0, *range(2, T)]].isfinite().all()
    assert same_bits(y, layer(x))  # the replay gives the eager call's bits, NaN row included
