"""The decode path in one launch (dispatch.kernels.decode_fused) against the three-launch chain.

The one launch runs the chain's own item bodies in another order, so its output must be *bitwise*
the chain's, on any routing; and both against the reference. CPU: Triton's interpreter (programs run
one after another, so a down item never has to wait); GPU (marker ``gpu``): compiled, programs
running at once and waiting on each other's counters, at the benchmark shapes.
"""
from dataclasses import replace

import pytest
import torch
import triton
import triton.language as tl
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatch.kernels import decode_fused
from dispatch.kernels.gemv import DecodeConfig, moe_decode, moe_decode_torch
from dispatch.kernels.quant_gemv import moe_decode_quant
from dispatch.quant import quantize_experts
from dispatch.reference import experts_reference
from tests.test_gemv import FP32_TOL, RANDOM, make, random_case

CHAIN = DecodeConfig(block_i=16, block_h=32, block_ho=16, block_id=32, num_stages=1)
ONE = replace(CHAIN, fused=2)


LAGS = (1, 2, 64)  # down items one slot behind, two, after every up item


def both(args, config=CHAIN, lags=LAGS, **kw):
    """(chain, one launch) outputs; asserts they are bitwise equal and that the counters are back to 0."""
    chain = moe_decode(*args, config=config, **kw)
    for lag in lags:
        one = moe_decode(*args, config=replace(config, fused=lag), **kw)
        assert torch.equal(chain, one), (lag, (chain - one).abs().max())
    for ws in decode_fused._workspaces.values():
        assert not ws.any(), "the last program must leave the counters at zero"
    return one


# Each example draws one lag (every lag gets a third of the examples): two interpreted launches an
# example instead of four, the profile's number of examples (deadline: none, tests/conftest.py).
@settings(max_examples=settings().max_examples)
@given(T=st.integers(1, 9), lag=st.sampled_from(LAGS), **RANDOM)
def test_random_shapes_bitwise_the_chain(T, lag, E, K, H, I, seed, skew, programs):  # noqa: E741
    x, w, ids, gu, dn = random_case(T, E, K, H, I, seed, skew)
    y = both((x, w, ids, gu, dn), replace(CHAIN, programs=programs), lags=(lag,))
    torch.testing.assert_close(y, experts_reference(x, w, ids, gu, dn), **FP32_TOL)


EDGES = ["one token", "all to one expert", "K = E", "bad ids", "no valid id"]


def edge_routing(case: str):
    """(x, w, ids, gate_up, down) of one of ``EDGES`` (the one-launch paths' edge cases)."""
    T, K, E, H, I = {"one token": (1, 2, 4, 40, 24), "K = E": (3, 4, 4, 32, 16)}.get(case, (4, 2, 5, 32, 16))
    ids = {"all to one expert": torch.full((T, K), 3), "bad ids": torch.tensor([[0, -1], [7, 2], [2, 0], [5, 4]]),
           "no valid id": torch.tensor([[-1, 5]] * T)}.get(case)
    return make(T, K, E, H, I, ids=ids)


@pytest.mark.parametrize("case", EDGES)
def test_edge_routings(case):
    x, w, ids, gu, dn = edge_routing(case)
    y = both((x, w, ids, gu, dn))
    torch.testing.assert_close(y, moe_decode_torch(x, w, ids, gu, dn), **FP32_TOL)
    if case == "no valid id":  # no item at all: the last program to leave writes the zeros
        assert torch.equal(y, torch.zeros_like(y))


@pytest.mark.parametrize("one", [ONE, replace(CHAIN, split=1)], ids=["fused", "split"])
def test_zero_tokens(one):
    x, w, ids, gu, dn = make(0, 2, 4, 32, 16)
    assert moe_decode(x, w, ids, gu, dn, config=one).shape == (0, 32)


def test_shared_expert_rides_along():
    x, w, ids, gu, dn = make(5, 2, 4, 32, 16, seed=3)
    g = torch.Generator().manual_seed(4)
    shared = (torch.randn(2 * 32, 32, generator=g) / 32 ** 0.5, torch.randn(32, 32, generator=g) / 32 ** 0.5)
    y = both((x, w, ids, gu, dn), shared=shared)
    torch.testing.assert_close(y, moe_decode_torch(x, w, ids, gu, dn, shared=shared), **FP32_TOL)


@pytest.mark.parametrize("scheme", ["int8-channel", "fp8-block128"])
def test_quantized_experts(scheme):
    x, w, ids, gu, dn = make(3, 2, 4, 128, 128, seed=5)
    qe = quantize_experts(gu, dn, scheme)
    chain = moe_decode_quant(x, w, ids, qe, config=CHAIN)
    assert torch.equal(chain, moe_decode_quant(x, w, ids, qe, config=ONE))


def test_config_refuses_other_values():
    for bad in (-1, 1.5, "1"):
        with pytest.raises(ValueError, match="fused must be 0"):
            DecodeConfig(fused=bad)


@triton.jit
def _tickets_kernel(up_ptr, item_ptr, n, used, a, b, lag, BLOCK: tl.constexpr):
    t = tl.arange(0, BLOCK)
    up, item = decode_fused._ticket_item(t, used, a, b, lag)
    tl.store(up_ptr + t, up.to(tl.int32), mask=t < n)
    tl.store(item_ptr + t, item, mask=t < n)


@pytest.mark.parametrize("used,a,b", [(1, 3, 2), (5, 2, 3), (8, 4, 1), (3, 1, 1)])
@pytest.mark.parametrize("lag", [1, 2, 3, 64])
def test_ticket_order_deals_every_item_once_up_before_down(used, a, b, lag):
    """Every up item and every down item exactly once; a slot's down items after all its up items;
    with a lag ≥ used, all up items first (slot-major), then all down items."""
    n = used * (a + b)
    up, item = torch.zeros(n, dtype=torch.int32), torch.zeros(n, dtype=torch.int32)
    _tickets_kernel[(1,)](up, item, n, used, a, b, lag, BLOCK=triton.next_power_of_2(n))
    order = [("up" if u else "down", int(i)) for u, i in zip(up.tolist(), item.tolist(), strict=True)]
    assert sorted(order) == sorted([("up", i) for i in range(used * a)] + [("down", i) for i in range(used * b)])
    last_up = {s: max(t for t, (k, i) in enumerate(order) if k == "up" and i // a == s) for s in range(used)}
    first_down = {s: min(t for t, (k, i) in enumerate(order) if k == "down" and i // b == s) for s in range(used)}
    assert all(last_up[s] < first_down[s] for s in range(used))
    if lag >= used:
        assert order == [("up", i) for i in range(used * a)] + [("down", i) for i in range(used * b)]


def test_counters_left_dirty_on_the_cpu_are_cleared():
    """A call interrupted half-way under the interpreter leaves its counters; the next call still computes."""
    x, w, ids, gu, dn = make(3, 2, 4, 32, 16, seed=7)
    ws = decode_fused.workspace(torch.device("cpu"), 64)
    ws[:8] = torch.tensor([999, 5, 3, 1, 0, 2, 7, 1], dtype=torch.int32)
    both((x, w, ids, gu, dn))


def test_counters_are_per_device_and_grow():
    a = decode_fused.workspace(torch.device("cpu"), 10)
    assert a.dtype == torch.int32 and a.numel() >= 10 and not a.any()
    assert decode_fused.workspace(torch.device("cpu"), 10) is a
    big = decode_fused.workspace(torch.device("cpu"), 2 * a.numel())
    assert big.numel() >= 2 * a.numel() and big is not a and any(w is a for w in decode_fused._outgrown)  # alive


def test_counters_are_never_allocated_inside_a_graph_capture(monkeypatch):
    """A tensor allocated during a capture comes from the graph's pool, where an earlier graph's
    temporaries may land on it at replay: the counters must exist before the first capture."""
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    monkeypatch.setattr(decode_fused, "_workspaces", {})
    with pytest.raises(RuntimeError, match="must exist before a CUDA graph capture.*warm-up"):
        decode_fused.workspace(torch.device("cuda", 0), 10)


@pytest.mark.gpu
@pytest.mark.parametrize("preset", ["olmoe-1b-7b", "qwen3-30b-a3b", "deepseek-moe-16b", "mixtral-8x7b"])
@pytest.mark.parametrize("T", [1, 4, 64])
def test_gpu_bitwise_the_chain_under_graphs(preset, T):
    """Compiled, every program at once: bitwise the chain for every grid size, also replayed in a CUDA graph."""
    from dispatch.kernels import tiles
    from dispatch.tune.search import PROGRAMS_PER_SM, make_case

    dev = torch.device("cuda")
    c, wts, x, w, ids = make_case(preset, T, dev, torch.bfloat16)
    args = (x, w, ids, wts.gate_up_E2IH, wts.down_EHI)
    cfg = tiles.decode_config(T, c.K, c.E, c.H, c.I, torch.bfloat16, dev)
    chain = moe_decode(*args, config=replace(cfg, fused=0))
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    for p in PROGRAMS_PER_SM:
        for lag in (1, 2, 64):
            one = replace(cfg, fused=lag, programs=p * sms)
            assert torch.equal(moe_decode(*args, config=one), chain), (p, lag)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        ys = [moe_decode(*args, config=replace(cfg, fused=1)) for _ in range(3)]
    g.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(y, chain) for y in ys)


@pytest.mark.gpu
def test_gpu_graphs_sharing_a_pool_leave_the_counters_alone():
    """As the engines capture their buckets: graphs of the chain first, then of the one launch, into one
    memory pool. Replaying the chain's graphs (their temporaries) between the one launch's replays must
    not touch the counters: the one launch stays bitwise the chain, its counters zero after each. (A
    graph's output is read right after its own replay, as an engine reads its logits: graphs sharing a
    pool may reuse each other's freed temporaries, so another graph's replay may overwrite it.)"""
    from dispatch.kernels import tiles
    from dispatch.tune.search import make_case

    dev, pool = torch.device("cuda"), torch.cuda.graph_pool_handle()
    c, wts, x, w, ids = make_case("olmoe-1b-7b", 12, dev, torch.bfloat16)
    args = (x, w, ids, wts.gate_up_E2IH, wts.down_EHI)
    cfg = tiles.decode_config(12, c.K, c.E, c.H, c.I, torch.bfloat16, dev)
    def call(fused):  # the kernels' buffers and y are temporaries of the graph; y * 1 its output
        return moe_decode(*args, config=replace(cfg, fused=fused)) * 1

    ref = call(0).clone()  # the chain, eager
    graphs, outs = [], []
    for fused in (0, 0, 1, 64):
        call(fused)  # the warm-up: compilation, and the counters, outside the capture
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=pool):
            outs.append(call(fused))
        graphs.append(g)
    for order in ([0, 2, 1, 3], [1, 3, 0, 2, 3, 1, 2]):
        for i in order:
            graphs[i].replay()
            torch.cuda.synchronize()
            assert not any(ws.any() for ws in decode_fused._workspaces.values()), (order, i)
            assert torch.equal(outs[i], ref), (order, i)
