"""Load-balance rules against hand-computed cases: capacity, bias update, losses, placement."""
import math
import random

import pytest
import torch

import dispatch  # noqa: F401  (sets up the runtime first)
from dispatch import balance as bal
from dispatch.parallel import Placement


# ------------------------------------------------------------ capacity
def keep_loop(ids_TK, E, cf):
    """Independent reference: walk pairs in priority order (k-major, then token order)."""
    T, K = ids_TK.shape
    cap = math.ceil(cf * T * K / E)
    used = [0] * E
    keep = [[False] * K for _ in range(T)]
    for k in range(K):
        for t in range(T):
            e = int(ids_TK[t, k])
            if used[e] < cap:
                keep[t][k] = True
                used[e] += 1
    return torch.tensor(keep, dtype=torch.bool).reshape(T, K)


def test_capacity_docstring_example():
    ids = torch.tensor([[0, 1], [0, 2], [0, 1]])
    assert bal.capacity(3, 2, 4, 1.0) == 2
    keep = bal.capacity_keep_mask(ids, 4, 1.0)
    assert keep.tolist() == [[True, True], [True, True], [False, True]]


def test_capacity_first_choices_before_second():
    # expert 0 is t0's second choice and t1's first; capacity 1 → t1 (k=0) wins although t0 comes first
    ids = torch.tensor([[1, 0], [0, 1]])
    keep = bal.capacity_keep_mask(ids, 4, 1.0)  # cap = ceil(4/4) = 1
    assert keep.tolist() == [[True, False], [True, False]]


def test_capacity_all_to_one_expert():
    ids = torch.zeros(8, 1, dtype=torch.long)
    assert bal.capacity_keep_mask(ids, 4, 1.0).flatten().tolist() == [True] * 2 + [False] * 6
    assert bal.capacity_keep_mask(ids, 4, 2.0).sum().item() == 4
    assert bal.capacity_keep_mask(ids, 4, None).all()


@pytest.mark.parametrize("cf", [0.5, 1.0, 1.25, 1.5, 2.0])
def test_capacity_matches_loop(cf):
    g = torch.Generator().manual_seed(1)
    for T, K, E in [(1, 1, 4), (7, 2, 4), (33, 4, 8), (64, 2, 16)]:
        # skewed routing so that capacity binds
        ids = torch.multinomial(torch.linspace(1, 8, E).expand(T, E), K, generator=g)
        keep = bal.capacity_keep_mask(ids, E, cf)
        assert torch.equal(keep, keep_loop(ids, E, cf))
        cap = bal.capacity(T, K, E, cf)
        assert bal.expert_counts(ids, E, keep).max() <= cap


def test_capacity_edge_cases():
    assert bal.capacity_keep_mask(torch.zeros(0, 2, dtype=torch.long), 4, 1.0).shape == (0, 2)
    with pytest.raises(ValueError, match="expert ids"):
        bal.capacity_keep_mask(torch.tensor([[4]]), 4, 1.0)
    with pytest.raises(ValueError, match="capacity_factor"):
        bal.capacity_keep_mask(torch.tensor([[0]]), 4, 0.0)
    with pytest.raises(ValueError, match=r"\[T, K\]"):
        bal.capacity_keep_mask(torch.tensor([0, 1]), 4, 1.0)


# ------------------------------------------------------------ load and losses
def test_counts_and_bias_reject_bad_input():
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        bal.expert_counts(torch.tensor([[0, 4]]), 4)  # an id past E was silently dropped before
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        bal.expert_counts(torch.tensor([[-1, 2]]), 4)
    with pytest.raises(ValueError, match="keep_TK"):
        bal.expert_counts(torch.tensor([[0, 1]]), 4, torch.tensor([True, False]))
    assert bal.expert_counts(torch.zeros(0, 2, dtype=torch.long), 3).tolist() == [0, 0, 0]
    with pytest.raises(ValueError, match=r"both be \[E\]"):
        bal.update_bias(torch.zeros(3), torch.tensor([4]), 0.1)  # would broadcast silently


def test_load_stats():
    assert bal.load_stats([2, 2, 2, 2]) == {"max_over_mean": 1.0, "min_over_mean": 1.0, "cv": 0.0}
    s = bal.load_stats([4, 0, 0, 0])
    assert s["max_over_mean"] == 4.0 and s["min_over_mean"] == 0.0
    assert s["cv"] == pytest.approx(math.sqrt(3))
    assert bal.load_stats([0, 0])["max_over_mean"] == 1.0  # no tokens: nothing is imbalanced


def test_expert_counts_with_experts_that_get_nothing():
    ids = torch.tensor([[0, 3], [3, 0], [3, 2]])
    assert bal.expert_counts(ids, 5).tolist() == [2, 0, 1, 3, 0]
    keep = torch.tensor([[True, False], [True, True], [False, True]])
    assert bal.expert_counts(ids, 5, keep).tolist() == [2, 0, 1, 1, 0]


def test_aux_loss_matches_transformers():
    from transformers.models.olmoe.modeling_olmoe import load_balancing_loss_func

    torch.manual_seed(0)
    logits = torch.randn(50, 8)
    ids = torch.topk(torch.softmax(logits, -1), 2, dim=-1).indices
    ref = load_balancing_loss_func((logits,), 8, 2)
    assert bal.aux_loss(logits, ids).item() == pytest.approx(ref.item(), rel=1e-6)
    # perfectly balanced (uniform probabilities, equal counts) → K
    ids_bal = torch.arange(16).reshape(8, 2) % 8
    assert bal.aux_loss(torch.zeros(8, 8), ids_bal).item() == pytest.approx(2.0)


def test_z_loss_hand():
    assert bal.z_loss(torch.zeros(3, 4)).item() == pytest.approx(math.log(4) ** 2)


def test_update_bias_rule():
    b = bal.update_bias(torch.zeros(3), torch.tensor([6, 2, 4]), 0.1)
    assert b.tolist() == pytest.approx([-0.1, 0.1, 0.0])
    b2 = bal.update_bias(b, torch.tensor([6, 2, 4]), 0.1)
    assert b2.tolist() == pytest.approx([-0.2, 0.2, 0.0])
    assert torch.equal(bal.update_bias(b, torch.tensor([5, 5, 5]), 0.1), b)  # balanced: no change


# ------------------------------------------------------------ placement
def check_invariants(p: Placement, load, slots_per_rank):
    assert p.slots_per_rank <= slots_per_rank
    placed = sorted({e for row in p.slots_RS for e in row})
    assert placed == list(range(p.num_experts))  # every expert placed
    per_slot = p.replica_loads(load)
    for e in range(p.num_experts):  # an expert's replicas share its load equally, and sum to it
        mine = [per_slot[r][row.index(e)] for r, row in enumerate(p.slots_RS) if e in row]
        assert len(mine) == len(p.replicas(e))
        assert all(x == pytest.approx(load[e] / len(mine)) for x in mine)
    assert sum(p.rank_loads(load)) == pytest.approx(sum(load))


def test_contiguous_placement_loads():
    p = Placement.contiguous(8, 4)
    assert p.slots_RS == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert p.rank_loads([1, 2, 3, 4, 5, 6, 7, 8]) == [3, 7, 11, 15]
    assert p.max_over_mean([1, 2, 3, 4, 5, 6, 7, 8]) == 15 / 9
    assert p.max_over_mean([0] * 8) == 1.0  # no tokens: nothing is imbalanced
    with pytest.raises(ValueError, match="8 entries"):
        p.rank_loads([1, 2, 3])


def test_replica_loads_hand_case():
    p = Placement(4, 2, ((0, 1, 2), (3, 0)))  # expert 0 on both ranks
    assert p.slots_per_rank == 3
    assert p.replicas(0) == (0, 1) and p.replicas(3) == (1,)
    assert p.replica_loads([6, 1, 2, 3]) == [[3.0, 1.0, 2.0], [3.0, 3.0]]
    assert p.rank_loads([6, 1, 2, 3]) == [6.0, 6.0]


def test_greedy_placement_hand_case():
    load = [8, 1, 1, 1, 1, 1, 1, 2]
    assert Placement.contiguous(8, 2).rank_loads(load) == [11, 5]
    p = bal.greedy_placement(load, 2, 5)  # 2 spare slots → expert 0 and expert 7 get a second replica
    check_invariants(p, load, 5)
    # Packing order by load per replica (ties: lower id): 0 (4 each) → both ranks, then 1..6 (1 each)
    # alternate onto the lighter rank (ties: rank 0), then 7 (1 each) → both ranks.
    assert p.slots_RS == ((0, 1, 3, 5, 7), (0, 2, 4, 6, 7))
    assert p.rank_loads(load) == [8.0, 8.0]
    assert p.replicas(0) == (0, 1) and p.max_over_mean(load) == 1.0


def test_greedy_without_spare_slots_partitions():
    load = [5, 1, 4, 2]
    p = bal.greedy_placement(load, 2, 2)  # 5 → r0, 4 → r1, 2 → r1, 1 → r0
    assert p.slots_RS == ((0, 1), (2, 3)) and p.rank_loads(load) == [6.0, 6.0]
    assert all(len(p.replicas(e)) == 1 for e in range(4))


@pytest.mark.parametrize("R", [2, 4, 8])
def test_greedy_placement_invariants_random(R):
    rng = random.Random(R)
    for _ in range(30):
        E = R * rng.choice([1, 2, 4])
        load = [rng.choice([0, 0, 1, 5, 50]) * rng.random() for _ in range(E)]
        for S in (E // R, E // R + 1, E // R + 3):
            p = bal.greedy_placement(load, R, S)
            check_invariants(p, load, S)
            assert isinstance(p, Placement)  # the very type the expert-parallel layer runs


def test_placement_rejects_bad_maps():
    with pytest.raises(ValueError, match="nobody holds"):
        Placement(3, 2, ((0,), (1,)))
    with pytest.raises(ValueError, match="twice"):
        Placement(2, 1, ((0, 0, 1),))
    with pytest.raises(ValueError, match="cannot hold"):
        bal.greedy_placement([1, 1, 1], 1, 2)
    with pytest.raises(ValueError, match="non-negative"):
        bal.greedy_placement([1, -1], 2, 1)


# ------------------------------------------------------------ specialisation
def test_top_tokens_hand_case():
    tokens = torch.tensor([5, 5, 7, 7, 7, 9])
    ids = torch.tensor([[0, 1], [0, 2], [1, 2], [1, 2], [0, 1], [0, 1]])
    out = bal.top_tokens(tokens, ids, 3, top=2, min_count=2)
    assert out[0] == [(5, 1.0, 2), (7, 1 / 3, 3)]  # token 9 seen once: below min_count
    assert out[1] == [(7, 1.0, 3), (5, 0.5, 2)]
    assert out[2] == [(7, 2 / 3, 3), (5, 0.5, 2)]
