"""Properties of the dispatch metadata (hypothesis): the plan of who sends which token where, and the
bit-packing of ids and weights behind each token, for any routing (bad ids included) and placement."""
import torch
from hypothesis import given
from hypothesis import strategies as st

from dispatch.parallel import Placement
from dispatch.parallel.dispatch import _pack, _unpack, plan


@st.composite
def routings(draw):
    R = draw(st.integers(1, 4))
    E = draw(st.integers(R, 8))
    K = draw(st.integers(1, E))
    T = draw(st.integers(0, 9))
    rows = [draw(st.lists(st.integers(0, E - 1), min_size=K, max_size=K, unique=True)) for _ in range(T)]
    ids_TK = torch.tensor(rows, dtype=torch.long).reshape(T, K)
    if T and draw(st.booleans()):  # ids outside [0, E): computed nowhere
        ids_TK[draw(st.integers(0, T - 1)), draw(st.integers(0, K - 1))] = draw(st.sampled_from([-1, E, E + 5]))
    extra = draw(st.lists(st.integers(0, E - 1), max_size=3))  # replicas of a few experts on every rank
    base = Placement.contiguous(E, R).slots_RS
    placement = Placement(E, R, tuple(tuple(sorted(set(row) | set(extra))) for row in base))
    return placement, ids_TK, draw(st.integers(0, R - 1)), draw(st.sampled_from([torch.float32, torch.float16]))


@given(routings())
def test_each_token_goes_once_to_each_rank_computing_one_of_its_rows(case):
    placement, ids_TK, rank, _ = case
    R, E = placement.num_ranks, placement.num_experts
    dest_TK, sends_TR, pos_TR = plan(ids_TK, placement, rank)
    valid = (ids_TK >= 0) & (ids_TK < E)
    assert bool((dest_TK[~valid] == R).all()) and bool((dest_TK[valid] < R).all())
    for d in range(R):
        assert sends_TR[:, d].tolist() == (dest_TK == d).any(1).tolist()
        # positions: 0, 1, 2, ... over the tokens sent to d, in t order
        assert pos_TR[sends_TR[:, d], d].tolist() == list(range(int(sends_TR[:, d].sum())))
    for t, k in zip(*torch.nonzero(valid, as_tuple=True), strict=True):  # a replica holds the expert
        assert int(ids_TK[t, k]) in placement.slots_RS[int(dest_TK[t, k])]


@given(routings())
def test_packing_keeps_every_bit(case):
    placement, ids_TK, rank, dtype = case
    T, K = ids_TK.shape
    R, H = placement.num_ranks, 6
    g = torch.Generator().manual_seed(T * 31 + K)
    x_TH = torch.randn(T, H, generator=g).to(dtype)
    weights_TK = torch.randn(T, K, generator=g)
    dest_TK, sends_TR, _ = plan(ids_TK, placement, rank)
    d_J, t_J = torch.nonzero(sends_TR.T, as_tuple=True)
    packed = _pack(x_TH, weights_TK, ids_TK, dest_TK, d_J, t_J)
    for d in range(R):
        rows = d_J == d
        slot_E = placement.tables()[2][d]
        L = len(placement.slots_RS[d])
        x_MH, w_MK, slots_MK = _unpack(packed[rows], H, K, slot_E, L)
        t = t_J[rows]
        assert torch.equal(x_MH.view(torch.int16 if dtype == torch.float16 else torch.int32),
                           x_TH[t].view(torch.int16 if dtype == torch.float16 else torch.int32))
        assert torch.equal(w_MK.view(torch.int32), weights_TK[t].view(torch.int32))
        here = dest_TK[t] == d
        assert bool((slots_MK[~here] == L).all())
        assert [placement.slots_RS[d][s] for s in slots_MK[here].tolist()] == ids_TK[t][here].tolist()
