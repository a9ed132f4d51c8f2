"""Expert parallelism on CPU ranks (gloo): bit-identical to the single-device layer at world sizes
1, 2, 4 (8: slow), skewed routing, ranks receiving nothing, ranks with zero tokens, uneven
counts, replicated experts, faults; the peer-to-peer kernel on a simulated world."""
import pytest
import torch

import dispatch  # noqa: F401  (sets TRITON_INTERPRET before triton loads)
from dispatch.config import PRESETS
from dispatch.parallel import Placement, RankError, combine_topk, launch
from dispatch.parallel import workers as W
from dispatch.parallel.experts import experts_loop, experts_rowwise, linear_rows
from dispatch.parallel.layer import experts_single, moe_single
from dispatch.reference import experts_reference, moe_reference

TINY = PRESETS["tiny"]  # H 64, I 32, E 8, K 2
K4 = TINY.replace(top_k=4)  # a k-order that matters
SHARED = TINY.replace(shared_intermediate_size=32, shared_gate=True)


def replicated(R):  # experts 0 and 1 on every rank, the rest in contiguous blocks
    return Placement(8, R, tuple(tuple(sorted(set(row) | {0, 1})) for row in Placement.contiguous(8, R).slots_RS))


def gloo_cases(tokens_R):
    R = len(tokens_R)
    wide = TINY.replace(num_experts=16)  # at R = 8, rank 0 still holds K experts for skewed routing
    cases = [W.Case("random", TINY, tokens_R), W.Case("random K=4", K4, tokens_R, seed=3),
             W.Case("skewed: every row to rank 0", wide, tokens_R, routing="skewed", seed=1),
             W.Case("whole layer + gated shared expert", SHARED, tokens_R, routing="router", seed=2),
             W.Case("fp16", K4, tokens_R, dtype="float16", seed=4),
             W.Case("top_k == E: every expert on every token", TINY.replace(top_k=8), tokens_R, seed=7)]
    if R > 1:
        cases.append(W.Case("replicated experts", K4, tokens_R, placement=replicated(R), seed=5))
    return cases


TOKENS = {1: (6,), 2: (5, 3), 4: (5, 0, 7, 2), 8: (3, 0, 4, 1, 0, 2, 5, 1)}


@pytest.mark.parametrize("R", [1, 2, pytest.param(4), pytest.param(8, marks=pytest.mark.slow)])
def test_gloo_bit_identical_to_single_device(R):
    cases = gloo_cases(TOKENS[R])
    results = launch(W.check_cases, R, cases, timeout_s=120)
    rows = [row for per_rank in results for row in per_rank]
    assert len(rows) == R * len(cases)
    assert {(r["rank"], r["tokens"]) for r in rows} == {(r, t) for r, t in enumerate(TOKENS[R])}
    bad = [r for r in rows if not r["equal"] or r["max_abs_diff"] != 0.0]
    assert not bad, bad


def test_gloo_with_the_kernels_chapters_grouped_gemm():
    """Expert compute = dispatch.kernels.grouped_gemm (Triton interpreter, pinned tiles) on 2 ranks,
    bit-identical to moe_experts over the global batch on one device."""
    from dispatch.kernels import gemm_config as gc
    from dispatch.kernels.grouped_gemm import moe_experts

    cases = [W.Case("grouped", K4, (7, 4), seed=6, expert_fn="grouped"),
             W.Case("grouped, replicated", K4, (3, 5), seed=8, expert_fn="grouped", placement=replicated(2))]
    rows = [r for per_rank in launch(W.check_cases, 2, cases, timeout_s=120) for r in per_rank]
    assert len(rows) == 4 and all(r["equal"] for r in rows), rows
    # ... and the single-device side of that check is the kernels chapter's own layer, to the bit:
    x, wt, ids, w = W.case_inputs(cases[0])
    single = experts_single(x, wt, ids, w.gate_up_E2IH, w.down_EHI, W.EXPERT_FNS["grouped"])
    assert W.bitwise_equal(single, moe_experts(x, wt, ids, w.gate_up_E2IH, w.down_EHI, config=gc.INTERPRET_CONFIG))


def test_bitwise_equal_is_strict():
    a = torch.tensor([1.0, 0.0, 2.0])
    assert W.bitwise_equal(a, a.clone())
    assert not W.bitwise_equal(a, torch.tensor([1.0, -0.0, 2.0]))  # torch.equal would say True
    assert not W.bitwise_equal(a, torch.nextafter(a, torch.full_like(a, 9.0)))
    assert not W.bitwise_equal(a, a.double())


def test_single_device_layer_matches_reference():
    case = W.Case("x", SHARED, (11,), routing="router")
    x, _, _, w = W.case_inputs(case)
    torch.testing.assert_close(moe_single(x, SHARED, w), moe_reference(x, SHARED, w), rtol=1e-5, atol=1e-5)
    x, wt, ids, w = W.case_inputs(W.Case("y", K4, (13,)))
    want = experts_reference(x, wt, ids, w.gate_up_E2IH, w.down_EHI)
    for fn in (experts_rowwise, experts_loop):
        torch.testing.assert_close(experts_single(x, wt, ids, w.gate_up_E2IH, w.down_EHI, fn), want,
                                   rtol=1e-5, atol=1e-5)


def test_linear_rows_does_not_depend_on_the_batch():
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(50, 64, generator=g), torch.randn(48, 64, generator=g)
    full = linear_rows(x, w)
    torch.testing.assert_close(full, x @ w.T, rtol=1e-5, atol=1e-5)
    for lo, hi in [(0, 1), (3, 20), (17, 50), (49, 50)]:
        assert W.bitwise_equal(linear_rows(x[lo:hi], w), full[lo:hi])


def test_combine_topk_worked_example():
    # 2 tokens, K = 3: y[t] = out[3t] + out[3t+1] + out[3t+2], added left to right in fp32.
    out_NH = torch.tensor([[1.0], [2.0], [3.0], [1e8], [1.0], [-1e8]])
    assert combine_topk(out_NH, 3).tolist() == [[6.0], [0.0]]  # (1e8 + 1) - 1e8 == 0 in fp32
    with pytest.raises(ValueError, match="K=4"):
        combine_topk(out_NH, 4)


def test_placement():
    p = Placement.contiguous(8, 3)
    assert p.slots_RS == ((0, 1, 2), (3, 4, 5), (6, 7))
    assert p.rank_loads([1] * 8) == [3.0, 3.0, 2.0]
    r = replicated(2)  # experts 0, 1 on both ranks: load split evenly
    assert r.slots_RS == ((0, 1, 2, 3), (0, 1, 4, 5, 6, 7))
    assert r.rank_loads([4, 2, 0, 0, 0, 0, 0, 1]) == [3.0, 4.0]
    # Replica rule: expert 0 of token t on origin rank o goes to replica (o + t) % 2.
    ids_TK = torch.tensor([[0, 7], [0, 2], [0, 1]])
    assert r.dest_rank_N(ids_TK, 0).tolist() == [0, 1, 1, 0, 0, 0]
    assert r.dest_rank_N(ids_TK, 1).tolist() == [1, 1, 0, 0, 1, 1]
    with pytest.raises(ValueError, match="nobody holds"):
        Placement(4, 2, ((0, 1), (2,)))
    with pytest.raises(ValueError, match="twice"):
        Placement(4, 2, ((0, 0, 1), (2, 3)))
    with pytest.raises(ValueError, match="one row per rank"):
        Placement(4, 3, ((0, 1), (2, 3)))
    with pytest.raises(ValueError, match="outside"):
        Placement(4, 2, ((0, 1), (2, 3, 4)))
    with pytest.raises(ValueError, match="num_ranks"):
        Placement.contiguous(2, 4)


def test_failing_rank_surfaces_and_ends_the_job():
    # Rank 0 waits in an all_reduce that rank 1 never joins: launch must raise rank 1's error
    # (a RankError), not a TimeoutError and not a hang. No wall-clock assertion: the collective
    # timeout (30 s) is what bounds a regression, and a TimeoutError would fail the match below.
    with pytest.raises(RankError, match="boom from rank 1") as info:
        launch(W.fail_on_rank, 2, 1, "boom from rank 1", timeout_s=30)
    assert "rank 1 of 2 failed" in str(info.value)


def test_configs_that_differ_across_ranks_are_refused():
    with pytest.raises(RankError, match="different configurations"):
        launch(W.mismatched_config, 2, TINY, timeout_s=30)


def test_bad_routing_is_refused_before_anything_moves():
    res = launch(W.bad_routing, 1, TINY)
    (id_msg, shape_msg, k_msg), = res
    assert "expert ids must lie in [0, 8)" in id_msg
    assert "weights_TK and ids_TK must both be [T=3, K]" in shape_msg
    assert "ids_TK [T, K=2]" in k_msg  # a K other than cfg.top_k is refused, not silently mis-combined


def test_launch_rejects_bad_arguments():
    with pytest.raises(ValueError, match="world_size"):
        launch(W.fail_on_rank, 0, 0, "x")
    with pytest.raises(ValueError, match="backend"):
        launch(W.fail_on_rank, 1, 0, "x", backend="mpi")


def test_load_balance_placements_plug_in():
    """Chapter 5's planner returns the very Placement the layer runs; nothing else is accepted."""
    from dispatch import balance
    from dispatch.parallel import dispatch as ep_dispatch

    greedy = balance.greedy_placement([9, 1, 1, 1, 1, 1, 1, 1], 2, 5)  # expert 0 replicated
    assert isinstance(greedy, Placement) and greedy.replicas(0) == (0, 1)
    assert greedy.rank_loads([9, 1, 1, 1, 1, 1, 1, 1]) == [8.0, 8.0]
    # The layer's replica rule serves it: expert 0's rows alternate between ranks 0 and 1.
    assert greedy.dest_rank_N(torch.zeros(4, 1, dtype=torch.long), 0).tolist() == [0, 1, 0, 1]
    x, w, ids = torch.zeros(1, 4), torch.ones(1, 1), torch.zeros(1, 1, dtype=torch.long)
    with pytest.raises(ValueError, match="must be a dispatch.parallel.Placement"):
        ep_dispatch(x, w, ids, greedy.slots_RS)
