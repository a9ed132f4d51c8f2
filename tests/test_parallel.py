"""Expert parallelism on CPU ranks (gloo, Triton's interpreter, fp32): bit-identical to the one-device
layer built from the same kernels at world sizes 1, 2 and 4 — zero tokens, one token, all tokens to
one expert, experts that get nothing, replicated experts, exact and fixed-capacity splits."""
import parallel_ranks as PR  # noqa: I001  (tests/ helper, imported by name in the ranks too)
import pytest
import torch

from dispatch.moe import MoELayer
from dispatch.config import PRESETS, random_weights
from dispatch.parallel import ExpertParallelMoE, Placement, RankError, launch, parallelize
from dispatch.parallel.dispatch import plan
from dispatch_book import ep_steps as S

TINY = PRESETS["tiny"]  # H 64, I 32, E 8, K 2
K4 = TINY.replace(top_k=4)  # a k order that matters
SHARED = K4.replace(shared_intermediate_size=32, shared_gate=True)


def replicated(R):  # experts 0 and 1 on every rank, the rest in contiguous blocks
    return Placement(8, R, tuple(tuple(sorted(set(row) | {0, 1})) for row in Placement.contiguous(8, R).slots_RS))


def cases(tokens_R):
    R = len(tokens_R)
    out = [S.Case("random K=4", K4, tokens_R, seed=3),
           S.Case("random K=4, fixed capacity", K4, tokens_R, seed=4, capacity=True),
           S.Case("every token to the same experts", K4, tokens_R, routing="one", seed=5),
           S.Case("whole layer + gated shared expert", SHARED, tokens_R, routing="router", seed=2)]
    out += [S.Case("decode kernels", K4, tokens_R, seed=8, path="decode"),
            S.Case("decode kernels, fixed capacity, same experts", K4, tokens_R, routing="one", seed=9,
                   capacity=True, path="decode")]
    if R > 1:
        out += [S.Case("skewed: the other ranks' experts get nothing", TINY, tokens_R, routing="skewed", seed=1),
                S.Case("replicated experts", K4, tokens_R, placement=replicated(R), seed=6),
                S.Case("replicated, fixed capacity", K4, tokens_R, placement=replicated(R), seed=7, capacity=True),
                S.Case("replicated, decode kernels", K4, tokens_R, placement=replicated(R), seed=10, path="decode")]
    return out


TOKENS = {1: (6,), 2: (1, 5), 4: (5, 0, 7, 1)}


@pytest.mark.parametrize("R", [1, 2, 4])
def test_bit_identical_to_one_device(R):
    cs = cases(TOKENS[R])
    rows = [row for per_rank in launch(S.check_cases, R, cs, timeout_s=180) for row in per_rank]
    assert {(r["rank"], r["tokens"]) for r in rows} == set(enumerate(TOKENS[R]))
    assert len(rows) == R * len(cs)
    bad = [r for r in rows if not r["equal"]]
    assert not bad, bad


def test_zero_tokens_everywhere():
    cs = [S.Case("none", K4, (0, 0)), S.Case("none, cap", K4, (0, 0), capacity=True),
          S.Case("none, decode", K4, (0, 0), path="decode", capacity=True)]
    rows = launch(S.check_cases, 2, cs, timeout_s=60)
    assert [r["equal"] for per in rows for r in per] == [True] * 6


def test_each_token_sent_once_per_rank():
    # ids of 3 tokens, K = 4, experts 0-3 on rank 0 and 4-7 on rank 1: token 0 needs both ranks.
    ids_TK = torch.tensor([[0, 5, 1, 6], [4, 5, 6, 7], [0, 1, 2, 3]])
    dest_TK, sends_TR, pos_TR = plan(ids_TK, Placement.contiguous(8, 2), rank=0)
    assert dest_TK.tolist() == [[0, 1, 0, 1], [1, 1, 1, 1], [0, 0, 0, 0]]
    assert sends_TR.tolist() == [[True, True], [False, True], [True, False]]  # 4 token copies, not 12 rows
    assert pos_TR.gather(1, dest_TK).tolist() == [[0, 0, 0, 0], [1, 1, 1, 1], [1, 1, 1, 1]]


def test_steps_of_the_chapter():
    case = S.Case("demo", K4, (5, 3), seed=3)
    plain = launch(S.step_plain_allgather, 2, case, timeout_s=60)
    assert all(r["equal"] for r in plain) and {r["tokens_in"] for r in plain} == {8}
    final = launch(S.step_final, 2, case, timeout_s=60)
    assert all(r["equal"] for r in final)
    assert all(r["tokens_sent"] <= r["pairs_sent"] for r in final)


def test_bitwise_equal_is_strict():
    a = torch.tensor([1.0, 0.0, 2.0])
    assert S.bitwise_equal(a, a.clone())
    assert not S.bitwise_equal(a, torch.tensor([1.0, -0.0, 2.0]))  # torch.equal would say True
    assert not S.bitwise_equal(a, torch.nextafter(a, torch.full_like(a, 9.0)))
    assert not S.bitwise_equal(a, a.double())


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
    for bad, match in [(((0, 1), (2,)), "nobody holds"), (((0, 0, 1), (2, 3)), "twice"),
                       (((0, 1), (2, 3, 4)), "outside")]:
        with pytest.raises(ValueError, match=match):
            Placement(4, 2, bad)
    with pytest.raises(ValueError, match="num_ranks"):
        Placement.contiguous(2, 4)


def test_bad_routing_is_refused_before_anything_moves():
    msgs = launch(PR.bad_routing, 1, TINY, timeout_s=60)[0]
    assert "accepted" not in msgs, msgs
    assert all("ids_TK must hold expert ids in [0, 8), got min 8 max 8" in m for m in msgs[0:2])
    assert all("got min -1 max -1" in m for m in msgs[2:4])  # -1 never wraps to expert E-1
    assert all("weights_TK must be a floating [T=3, K=2]" in m for m in msgs[4:6])
    assert "ids_TK must be an int32/int64 [T=3, K=2]" in msgs[6]  # a K other than the layer's top_k
    assert all("ids_TK must be an int32/int64" in m for m in msgs[7:9]) and len(msgs) == 9  # float ids


def test_configs_that_differ_across_ranks_are_refused():
    with pytest.raises(RankError, match="different configurations"):
        launch(PR.mismatched_config, 2, TINY, timeout_s=30)


def test_decode_path_needs_fp32_rows_over_p2p():
    from dispatch.parallel.p2p import P2PTransport

    t = P2PTransport.simulated(K4, Placement.contiguous(8, 1), max_tokens=2, dtype=torch.float16)[0]
    with pytest.raises(ValueError, match="rows_dtype=torch.float32"):
        ExpertParallelMoE(K4, random_weights(K4, dtype=torch.float16), transport=t, path="decode")
    with pytest.raises(ValueError, match="path must be"):
        ExpertParallelMoE(K4, random_weights(K4), path="fast")


def test_from_layer_refuses_other_modules():
    with pytest.raises(ValueError, match="dispatch.MoELayer"):
        ExpertParallelMoE.from_layer(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="must be a dispatch.parallel.Placement"):
        parallelize(MoELayer(TINY, random_weights(TINY)), ((0, 1, 2, 3, 4, 5, 6, 7),))


def test_load_balance_placements_plug_in():
    """Chapter 5's planner returns the very Placement the layer runs."""
    from dispatch import balance

    greedy = balance.greedy_placement([9, 1, 1, 1, 1, 1, 1, 1], 2, 5)  # expert 0 replicated
    assert isinstance(greedy, Placement) and greedy.replicas(0) == (0, 1)
    assert greedy.rank_loads([9, 1, 1, 1, 1, 1, 1, 1]) == [8.0, 8.0]
    assert greedy.dest_rank_N(torch.zeros(4, 1, dtype=torch.long), 0).tolist() == [0, 1, 0, 1]


@pytest.mark.parametrize("capacity", [None, 4])
def test_unchecked_bad_ids_add_nothing(capacity):
    assert launch(PR.bad_ids_unchecked, 2, K4, capacity, timeout_s=60) == [True, True]
