"""Token sort (``sort_by_expert``) against its twin and against a plain Python loop.

CPU (Triton interpreter): the docstring's worked example, property-based over random shapes and
routings (zero / one token, every row to one expert, idle experts, N not a multiple of the block,
top_k = E, int32/int64, non-contiguous ids, several programs per launch), layout invariants,
bitwise repeatability, validation. GPU (marker ``gpu``): compiled kernels at serving sizes against
the twin (integers: exact), bitwise determinism, and capture + replay in a CUDA graph.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from dispatch.kernels.sort import SortedRoutes, default_block_n, sort_by_expert, sort_by_expert_torch, static_sizes

FIELDS = ["sorted_rows_P", "block_expert_B", "slot_of_N", "counts_E", "offsets_E1", "num_blocks_1"]


def python_sort(ids_TK, E, block_m) -> dict[str, list[int]]:
    """The layout by hand, one row at a time: independent of both implementations."""
    ids = [int(e) for e in ids_TK.reshape(-1).tolist()]
    N = len(ids)
    B, P = static_sizes(N, E, block_m)
    counts = [ids.count(e) for e in range(E)]
    offsets = [0]
    for c in counts:
        offsets.append(offsets[-1] + -(-c // block_m) * block_m)
    sorted_rows, slot_of, fill = [N] * P, [P] * N, list(offsets[:-1])  # a bad id keeps slot P
    for n, e in enumerate(ids):  # n order → stable
        if not 0 <= e < E:
            continue
        sorted_rows[fill[e]], slot_of[n] = n, fill[e]
        fill[e] += 1
    block_expert = [-1] * B
    for e in range(E):
        for s in range(offsets[e], offsets[e + 1], block_m):
            block_expert[s // block_m] = e
    return {"sorted_rows_P": sorted_rows, "block_expert_B": block_expert, "slot_of_N": slot_of,
            "counts_E": counts, "offsets_E1": offsets, "num_blocks_1": [offsets[-1] // block_m]}


def assert_same(a: SortedRoutes, b: SortedRoutes):
    for f in FIELDS:
        x, y = getattr(a, f), getattr(b, f)
        assert x.dtype == y.dtype == torch.int32, f
        assert torch.equal(x, y), f"{f}: {x.tolist()} != {y.tolist()}"
    assert (a.num_tokens, a.top_k, a.num_experts, a.block_m) == (b.num_tokens, b.top_k, b.num_experts, b.block_m)


def check_all(ids_TK, E, block_m, block_n=None):
    got = sort_by_expert(ids_TK, E, block_m, block_n=block_n)
    assert_same(got, sort_by_expert_torch(ids_TK, E, block_m))
    want = python_sort(ids_TK, E, block_m)
    for f in FIELDS:
        assert getattr(got, f).tolist() == want[f], f
    return got


def test_worked_example():  # exactly the one in sort.py's docstring
    r = sort_by_expert(torch.tensor([[2, 0], [0, 3]]), 4, 16)
    pad = 4
    assert r.counts_E.tolist() == [2, 0, 1, 1]
    assert r.offsets_E1.tolist() == [0, 16, 16, 32, 48]
    assert r.sorted_rows_P.tolist() == [1, 2] + [pad] * 14 + [0] + [pad] * 15 + [3] + [pad] * 15 + [pad] * 32
    assert r.slot_of_N.tolist() == [16, 0, 1, 32]
    assert r.block_expert_B.tolist() == [0, 2, 3, -1, -1]
    assert r.num_blocks_1.tolist() == [3]
    assert (r.num_tokens, r.top_k, r.num_experts, r.block_m, r.num_rows, r.max_blocks) == (2, 2, 4, 16, 4, 5)
    assert_same(r, sort_by_expert_torch(torch.tensor([[2, 0], [0, 3]]), 4, 16))


@st.composite
def routings(draw):
    E = draw(st.integers(1, 16))
    K = draw(st.integers(1, min(E, 8)))
    T = draw(st.integers(0, 48))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    mode = draw(st.sampled_from(["distinct", "any", "one_expert", "few_experts"]))
    if mode == "distinct":  # what a router produces: K different experts per token
        ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)]) if T else torch.zeros(0, K)
    elif mode == "any":
        ids = torch.randint(0, E, (T, K), generator=g)
    elif mode == "one_expert":
        ids = torch.full((T, K), draw(st.integers(0, E - 1)))
    else:  # most experts receive nothing
        ids = torch.randint(0, min(E, 2), (T, K), generator=g) * (E - 1)
    ids = ids.to(draw(st.sampled_from([torch.int32, torch.int64])))
    if draw(st.booleans()):  # non-contiguous: column-major copy with the same values
        ids = ids.T.contiguous().T
    return ids, E, draw(st.sampled_from([16, 32, 64])), draw(st.sampled_from([None, 16, 32]))


@given(case=routings())
def test_random_routings_match_twin_and_python(case):
    ids, E, block_m, block_n = case
    check_all(ids, E, block_m, block_n)


@given(case=routings())
def test_layout_invariants(case):
    ids, E, block_m, block_n = case
    r = sort_by_expert(ids, E, block_m, block_n=block_n)
    N = ids.numel()
    B, P = static_sizes(N, E, block_m)
    assert r.sorted_rows_P.shape == (P,) and r.block_expert_B.shape == (B,) and r.slot_of_N.shape == (N,)
    rows, slots = r.sorted_rows_P.long(), r.slot_of_N.long()
    assert torch.equal(rows[slots], torch.arange(N))  # slot_of_N inverts sorted_rows_P
    assert int((rows == N).sum()) == P - N  # every other slot is padding
    ids_N = ids.reshape(-1).long()
    used = int(r.num_blocks_1)
    assert used <= B and bool((r.block_expert_B[used:] == -1).all())
    assert torch.equal(r.block_expert_B.long()[slots // block_m], ids_N)  # one expert per block
    for e in range(E):  # stable: an expert's rows keep n order
        assert bool((torch.diff(slots[ids_N == e]) > 0).all())


@pytest.mark.parametrize("T, K, E, block_m", [(0, 2, 4, 16), (1, 1, 1, 16), (1, 4, 4, 64), (33, 4, 4, 16)])
def test_edge_shapes(T, K, E, block_m):
    g = torch.Generator().manual_seed(T)
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)]) if T else torch.zeros(0, K).long()
    r = check_all(ids, E, block_m)
    assert int(r.counts_E.sum()) == T * K


def test_zero_tokens_static_empty_outputs():
    r = sort_by_expert(torch.zeros(0, 8, dtype=torch.int32), 64, 64)
    assert r.sorted_rows_P.shape == (0,) and r.block_expert_B.shape == (0,) and r.slot_of_N.shape == (0,)
    assert r.counts_E.tolist() == [0] * 64 and r.offsets_E1.tolist() == [0] * 65 and r.num_blocks_1.tolist() == [0]


def test_every_row_to_one_expert_across_programs():
    ids = torch.full((40, 3), 5)
    r = check_all(ids, 8, 16, block_n=16)  # 120 rows over 8 programs
    assert r.counts_E.tolist() == [0] * 5 + [120, 0, 0] and r.num_blocks_1.tolist() == [8]


def test_default_block_n_is_about_sqrt_n():
    assert [default_block_n(n) for n in (0, 1, 255, 512, 2048, 8192, 32768, 131072, 10**7)] == \
        [16, 16, 16, 16, 32, 64, 128, 256, 256]
    # 700 rows over 44 programs of 16 (the default at this N), uneven experts: the twin's layout
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, 12, (175, 4), generator=g) % torch.tensor([12, 3, 12, 1])
    check_all(ids, 12, 32)


def test_bitwise_repeatable():
    ids = torch.randint(0, 16, (64, 4), generator=torch.Generator().manual_seed(1))
    a, b = sort_by_expert(ids, 16, 16, block_n=32), sort_by_expert(ids, 16, 16, block_n=32)
    assert_same(a, b)


@pytest.mark.parametrize("args, match", [
    ((torch.zeros(4, 2), 4, 16), "int32 or int64"),
    ((torch.zeros(8, dtype=torch.long), 4, 16), "2-d"),
    ((torch.zeros(4, 2, dtype=torch.long), 0, 16), "num_experts"),
    ((torch.zeros(4, 2, dtype=torch.long), 4, 8), "power of two >= 16"),
    ((torch.zeros(4, 2, dtype=torch.long), 4, 24), "power of two >= 16"),
    ((torch.zeros(4, 0, dtype=torch.long), 4, 16), "K >= 1"),
])
def test_bad_inputs_raise(args, match):
    with pytest.raises(ValueError, match=match):
        sort_by_expert(*args)


@pytest.mark.parametrize("ids", [[[0, 4]], [[-1, 2]]])
def test_check_ids_raises_naming_the_id(ids):
    for sort in (sort_by_expert, sort_by_expert_torch):
        with pytest.raises(ValueError, match=r"ids_TK must hold expert ids in \[0, E=4\): 1 do not"):
            sort(torch.tensor(ids), 4, 16, check_ids=True)


def test_bad_ids_are_placed_in_no_block():
    """Ids outside [0, E) (-1, E, BLOCK_E, and 2**32, which an int32 cast would read as 0) get no
    slot (slot_of_N = P), are counted nowhere and never overwrite another row's slot."""
    ids = torch.tensor([[2, 0], [-1, 3], [4, 0], [8, 2], [2**32, 1]])
    r = check_all(ids, 4, 16)
    P = r.sorted_rows_P.numel()
    assert r.slot_of_N.tolist()[2] == r.slot_of_N.tolist()[4] == r.slot_of_N.tolist()[6] == P
    assert r.slot_of_N.tolist()[8] == P and r.counts_E.tolist() == [2, 1, 2, 1]
    assert sorted(r.sorted_rows_P[r.sorted_rows_P < 10].tolist()) == [0, 1, 3, 5, 7, 9]


@given(st.integers(1, 40), st.integers(1, 4), st.integers(1, 9), st.sampled_from([16, 32]), st.data())
def test_random_bad_ids_match_the_loop(T, K, E, block_m, data):
    K = min(K, E)
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
    ids = torch.randint(-2, E + 3, (T, K), generator=g)  # ~30% out of range
    check_all(ids.to(data.draw(st.sampled_from([torch.int32, torch.int64]))), E, block_m)


# ---------------------------------------------------------------- GPU: compiled kernels
def serving_ids(T, K, E, seed=0, device="cuda"):
    """Router-like ids (K distinct experts per token, skewed popularity), int32."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    pop = torch.randn(E, generator=g).exp()
    scores = torch.rand(T, E, generator=g) * pop
    return scores.topk(K, dim=1).indices.to(device=device, dtype=torch.int32)


GPU_SHAPES = [(1, 8, 64, 64), (100, 8, 64, 16), (4099, 8, 128, 64), (16384, 8, 64, 128), (16384, 8, 256, 64)]


@pytest.mark.gpu
@pytest.mark.parametrize("T, K, E, block_m", GPU_SHAPES)
def test_gpu_matches_twin(T, K, E, block_m):
    ids = serving_ids(T, K, E, seed=T)
    assert_same(sort_by_expert(ids, E, block_m), sort_by_expert_torch(ids, E, block_m))
    one = torch.full((T, 1), E - 1, dtype=torch.int32, device="cuda")  # every row to one expert
    assert_same(sort_by_expert(one, E, block_m), sort_by_expert_torch(one, E, block_m))


@pytest.mark.gpu
def test_gpu_bad_ids_match_twin():
    ids = serving_ids(4099, 8, 64, seed=5)
    ids[::7, 3] = -1
    ids[::5, 0] = 64
    ids[::11, 7] = 1000
    for block_m in (16, 64, 128):
        r = sort_by_expert(ids, 64, block_m)
        assert_same(r, sort_by_expert_torch(ids, 64, block_m))
        assert (r.slot_of_N.view(4099, 8)[::7, 3] == r.sorted_rows_P.numel()).all()


@pytest.mark.gpu
def test_gpu_bitwise_deterministic():
    ids = serving_ids(16384, 8, 256, seed=1)
    runs = [sort_by_expert(ids, 256, 64) for _ in range(3)]
    for r in runs[1:]:
        assert_same(r, runs[0])


@pytest.mark.gpu
def test_gpu_cuda_graph_capture_and_replay():
    T, K, E, block_m = 2048, 8, 64, 64
    static_ids = serving_ids(T, K, E, seed=2)
    sort_by_expert(static_ids, E, block_m)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        routes = sort_by_expert(static_ids, E, block_m)
    for seed in (3, 4):
        static_ids.copy_(serving_ids(T, K, E, seed=seed))
        graph.replay()
        torch.cuda.synchronize()
        assert_same(routes, sort_by_expert_torch(static_ids, E, block_m))
