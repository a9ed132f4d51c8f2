"""The decode path by split items (dispatch.kernels.decode_split) against the twin and the chain.

A split item sums over one I tile only, so the output is not bitwise the chain's: it must match the
plain-PyTorch twin (and the chain) to fp32 round-off on any routing, be bitwise the same from call
to call, whatever the grid, and leave its counters at zero. CPU: Triton's interpreter (programs run
one after another, so a reduce item never waits); GPU (marker ``gpu``): compiled, every program at
once, at the benchmark shapes, also replayed in a CUDA graph.
"""
import json
import os
import subprocess
import sys
from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatch.kernels import decode_fused, tiles
from dispatch.kernels.gemv import DecodeConfig, moe_decode, moe_decode_torch
from dispatch.kernels.quant_gemv import moe_decode_quant, moe_decode_quant_torch
from dispatch.quant import quantize_experts
from dispatch.reference import experts_reference
from tests.test_decode_fused import EDGES, edge_routing
from tests.test_gemv import FP32_TOL, RANDOM, make, random_case

CHAIN = DecodeConfig(block_i=16, block_h=32, block_ho=16, block_id=32, num_stages=1)
SPLIT = replace(CHAIN, split=1)


def split(args, config=SPLIT, **kw):
    """The split path's output, checked against the chain (fp32 round-off) and for counters left at 0."""
    y = moe_decode(*args, config=config, **kw)
    torch.testing.assert_close(y, moe_decode(*args, config=replace(config, split=0), **kw), **FP32_TOL)
    for ws in decode_fused._workspaces.values():
        assert not ws.any(), "the last program must leave the counters at zero"
    return y


# Three interpreted launches an example (split, chain, split on another grid): 3/5 of the profile's
# examples (15 in CI, tests/conftest.py); the edges have their own tests below.
@settings(max_examples=max(10, settings().max_examples * 3 // 5))
@given(T=st.integers(1, 9), block_i=st.sampled_from([16, 32]), block_m=st.sampled_from([1, 16]), **RANDOM)
def test_random_shapes_match_the_reference(T, block_i, block_m, E, K, H, I, seed, skew, programs):  # noqa: E741
    x, w, ids, gu, dn = random_case(T, E, K, H, I, seed, skew)
    cfg = replace(SPLIT, block_i=block_i, block_m=block_m, programs=programs)
    y = split((x, w, ids, gu, dn), cfg)
    torch.testing.assert_close(y, experts_reference(x, w, ids, gu, dn), **FP32_TOL)
    assert torch.equal(y, moe_decode(x, w, ids, gu, dn, config=replace(cfg, programs=7))), "the grid changed y"


def test_hand_computed_one_token_two_tiles():
    """One token, one expert of I = 32 in two tiles of 16: y = w · down @ (silu(gate x) · up x)."""
    x, w, ids, gu, dn = make(1, 1, 3, 16, 32, ids=torch.tensor([[2]]))
    g, u = gu[2, :32] @ x[0], gu[2, 32:] @ x[0]
    want = w[0, 0] * (dn[2] @ (g * torch.sigmoid(g) * u))
    y = split((x, w, ids, gu, dn))
    torch.testing.assert_close(y[0], want, **FP32_TOL)


@pytest.mark.parametrize("case", EDGES)
def test_edge_routings(case):
    x, w, ids, gu, dn = edge_routing(case)
    y = split((x, w, ids, gu, dn))
    torch.testing.assert_close(y, moe_decode_torch(x, w, ids, gu, dn), **FP32_TOL)
    if case == "no valid id":  # no split item at all: the reduce items write zeros
        assert torch.equal(y, torch.zeros_like(y))


def test_the_config_takes_the_split_launch(monkeypatch):
    """split=1 launches the split kernel (and split=0 does not), as moe_decode is called."""
    from dispatch.kernels import decode_split
    calls, launch = [], decode_split.split_launch
    monkeypatch.setattr(decode_split, "split_launch", lambda *a, **kw: calls.append(1) or launch(*a, **kw))
    args = make(3, 2, 4, 32, 32, seed=1)
    moe_decode(*args, config=replace(SPLIT, split=0))
    assert calls == []
    moe_decode(*args, config=SPLIT)
    assert calls == [1]


def test_shared_expert_rides_along():
    x, w, ids, gu, dn = make(5, 2, 4, 32, 16, seed=3)
    g = torch.Generator().manual_seed(4)
    shared = (torch.randn(2 * 32, 32, generator=g) / 32 ** 0.5, torch.randn(32, 32, generator=g) / 32 ** 0.5)
    y = split((x, w, ids, gu, dn), shared=shared)
    torch.testing.assert_close(y, moe_decode_torch(x, w, ids, gu, dn, shared=shared), **FP32_TOL)


@pytest.mark.parametrize("scheme", ["int8-channel", "int8-group128", "fp8-block128"])
def test_quantized_experts(scheme):
    """Weight-only codes: the down scales apply per I tile (block_i inside the scale block)."""
    x, w, ids, gu, dn = make(3, 2, 4, 256, 256, seed=5)
    qe = quantize_experts(gu, dn, scheme)
    cfg = tiles.fit_quant(replace(SPLIT, block_i=32), scheme, qe.H, qe.I)
    y = moe_decode_quant(x, w, ids, qe, config=cfg)
    torch.testing.assert_close(y, moe_decode_quant_torch(x, w, ids, qe), **FP32_TOL)
    torch.testing.assert_close(y, moe_decode_quant(x, w, ids, qe, config=replace(cfg, split=0)), **FP32_TOL)


def test_counters_left_dirty_on_the_cpu_are_cleared():
    x, w, ids, gu, dn = make(3, 2, 4, 32, 16, seed=7)
    ws = decode_fused.workspace(torch.device("cpu"), 64)
    ws[:4] = torch.tensor([999, 5, 3, 1], dtype=torch.int32)
    split((x, w, ids, gu, dn))


def test_config_refuses_other_values():
    for bad in (2, -1, True, 0.5):
        with pytest.raises(ValueError, match="split must be 0 or 1"):
            DecodeConfig(split=bad)
    with pytest.raises(ValueError, match="1 only with fused=0"):
        DecodeConfig(split=1, fused=2)


def test_compiles_for_sm90_with_its_loops_pipelined():
    """Compiled offline for sm_90 (no GPU needed): bf16 with 16-row and one-row tiles, a shared expert
    riding along and int8 codes all compile, their weight loads as pipelined async copies; TRACE adds the
    clock reads and nothing else to the loads."""
    script = r'''
import json
from dispatch_book.kernel_ir import _compile, _signature
from dispatch.kernels import decode_split as ds
ptrs = dict(ids_ptr="*i32", w_ptr="*fp32", gs_ptr="*fp32", ds_ptr="*fp32", p_ptr="*fp32", ws_ptr="*i32",
            trace_ptr="*i64")
base = dict(G=(1, 1, False, False), D=(1, 1, False, False),
            BLOCK_M=16, BLOCK_I=32, BLOCK_H=128, BLOCK_HO=128, BLOCK_E=64, CHUNK_N=16, NUM_STAGES=3, NS=0,
            BLOCK_T=1, BLOCK_R=ds.R_COLS, PDL=False)
int8 = dict(base, G=(1, 2048, True, True), D=(1, 1024, True, True))  # (SBR, SBC, QUANT, LATE_SCALE)
out = {}
for name, c, p in (("bf16", base, ptrs), ("one row", dict(base, BLOCK_M=1), ptrs),
                   ("shared", dict(base, NS=2, BLOCK_E=128), ptrs),
                   ("int8", int8, dict(ptrs, gu_ptr="*i8", dn_ptr="*i8")), ("trace", dict(base, TRACE=True), ptrs)):
    k = _compile(ds._split_decode_kernel, _signature(ds._split_decode_kernel, c, p), c, 90, 4, 3)
    out[name] = [k.asm["ttgir"].count("async_copy_global_to_local"), k.asm["ptx"].count("%globaltimer")]
print(json.dumps(out))
'''
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert all(copies > 0 for copies, _ in got.values()), got
    assert [clock for name, (_, clock) in got.items() if name != "trace"] == [0] * 4 and got["trace"][1] >= 2, got
    assert got["trace"][0] == got["bf16"][0], got


@pytest.mark.gpu
@pytest.mark.parametrize("preset", ["olmoe-1b-7b", "qwen3-30b-a3b", "deepseek-moe-16b", "mixtral-8x7b"])
@pytest.mark.parametrize("T", [1, 8])
def test_gpu_matches_the_chain_and_repeats_bitwise_under_graphs(preset, T):
    """Compiled, every program at once: within bf16 tolerance of the chain for every grid size and
    block_i, bitwise the same when repeated and when replayed in a CUDA graph."""
    from dispatch.kernels import tiles
    from dispatch.reference import rel_err
    from dispatch.tune.search import PROGRAMS_PER_SM, make_case
    from tests.test_gemv import BF16_TOL

    dev = torch.device("cuda")
    c, wts, x, w, ids = make_case(preset, T, dev, torch.bfloat16)
    args = (x, w, ids, wts.gate_up_E2IH, wts.down_EHI)
    cfg = replace(tiles.decode_config(T, c.K, c.E, c.H, c.I, torch.bfloat16, dev), fused=0)
    chain = moe_decode(*args, config=cfg)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    for bi in (16, 32, 64):
        first = None
        for p in PROGRAMS_PER_SM:
            y = moe_decode(*args, config=replace(cfg, split=1, block_i=bi, programs=p * sms))
            assert rel_err(y, chain) < BF16_TOL, (bi, p, rel_err(y, chain))
            first = y if first is None else first
            assert torch.equal(y, first), (bi, p)
    one = replace(cfg, split=1)
    ref = moe_decode(*args, config=one)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        ys = [moe_decode(*args, config=one) for _ in range(3)]
    g.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(y, ref) for y in ys)
