"""Paged attention (dispatch.kernels.paged_attention) against its fp32 twins, chapter 6's static-cache decode
attention and torch's SDPA on the same keys laid out contiguously; CPU under Triton's interpreter in
fp32 and fp16. Tolerance: relative to the largest |reference| value, 1e-5 in fp32, 4e-3 in fp16."""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatch.kernels.attention import decode_attention
from dispatch.kernels.paged_attention import (
    paged_decode_attention,
    paged_decode_attention_torch,
    paged_prefill_attention,
    paged_prefill_attention_torch,
)

TOL = {torch.float32: 1e-5, torch.float16: 4e-3}


def close(a, b, dtype):
    return (a.float() - b.float()).abs().max().item() <= TOL[dtype] * max(b.float().abs().max().item(), 1e-30)


def paged(lengths, KV, D, BS, dtype, seed, spare=3):
    """Random K/V of sequences of ``lengths`` tokens, each written into shuffled blocks of one pool.
    Returns (k_blocks, v_blocks, table [B, M], contiguous k [B, S, KV, D], v likewise)."""
    g = torch.Generator().manual_seed(seed)
    M = max(-(-n // BS) for n in lengths)
    S = M * BS
    NB = len(lengths) * M + spare
    k_blocks = torch.randn(NB, BS, KV, D, generator=g).to(dtype)  # unused slots hold garbage, not zeros
    v_blocks = torch.randn(NB, BS, KV, D, generator=g).to(dtype)
    order = torch.randperm(NB, generator=g)
    table = order[:len(lengths) * M].view(len(lengths), M).int()
    k = torch.randn(len(lengths), S, KV, D, generator=g).to(dtype)
    v = torch.randn(len(lengths), S, KV, D, generator=g).to(dtype)
    for b, n in enumerate(lengths):
        for p in range(n):
            blk, off = int(table[b, p // BS]), p % BS
            k_blocks[blk, off], v_blocks[blk, off] = k[b, p], v[b, p]
    return k_blocks, v_blocks, table, k, v


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("NH,KV,BS", [(4, 4, 16), (8, 2, 4), (6, 1, 8)])
@pytest.mark.parametrize("splits", [1, 3])
def test_decode_matches_twin_and_static_kernel(dtype, NH, KV, BS, splits):
    D = 16 if splits == 1 else 32
    lengths = [1, BS, 3 * BS, 2 * BS + 1]  # one token, exactly one block, filling the last block, one over
    k_blocks, v_blocks, table, k, v = paged(lengths, KV, D, BS, dtype, seed=NH * 100 + BS + splits)
    pos = torch.tensor(lengths) - 1
    q = torch.randn(len(lengths), NH, D, generator=torch.Generator().manual_seed(5)).to(dtype)
    o = paged_decode_attention(q, k_blocks, v_blocks, table, pos, splits=splits)
    assert o.shape == q.shape and o.dtype == dtype
    twin = paged_decode_attention_torch(q, k_blocks, v_blocks, table, pos)
    assert close(o, twin, dtype)
    assert close(o, decode_attention(q, k, v, pos, splits=splits), dtype)  # chapter 6's static cache
    mask = (torch.arange(k.shape[1])[None, :] <= pos[:, None])[:, None, None, :]
    ref = F.scaled_dot_product_attention(q.float()[:, :, None], k.float().transpose(1, 2), v.float().transpose(1, 2),
                                         attn_mask=mask, enable_gqa=NH != KV)[:, :, 0]
    assert close(o, ref, dtype) and close(twin, ref, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("NH,KV,BS", [(4, 4, 16), (8, 2, 4)])
def test_prefill_chunks_match_twin_and_sdpa(dtype, NH, KV, BS):
    D = 16
    # (cached prefix, chunk length): a whole prompt, one token, a chunk after a prefix ending mid-block,
    # a chunk ending exactly at a block's end, a chunk longer than one row tile
    chunks = [(0, 7), (5, 1), (BS + 3, 5), (BS, BS), (1, 40)]
    lengths = [p + n for p, n in chunks]
    k_blocks, v_blocks, table, k, v = paged(lengths, KV, D, BS, dtype, seed=NH + BS)
    q_len = torch.tensor([n for _, n in chunks])
    q_start = torch.cumsum(q_len, 0) - q_len
    ctx = torch.tensor([p for p, _ in chunks])
    q = torch.randn(int(q_len.sum()), NH, D, generator=torch.Generator().manual_seed(9)).to(dtype)
    o = paged_prefill_attention(q, k_blocks, v_blocks, table, q_start, q_len, ctx)
    twin = paged_prefill_attention_torch(q, k_blocks, v_blocks, table, q_start, q_len, ctx)
    assert close(o, twin, dtype)
    for c, (p0, n) in enumerate(chunks):  # SDPA over the contiguous keys: the chunk's rows are the last n of p0 + n
        rows = slice(int(q_start[c]), int(q_start[c]) + n)
        keys = torch.arange(p0 + n)
        mask = keys[None, :] <= (p0 + torch.arange(n))[:, None]
        ref = F.scaled_dot_product_attention(q[rows].float().transpose(0, 1), k[c, :p0 + n].float().transpose(0, 1),
                                             v[c, :p0 + n].float().transpose(0, 1), attn_mask=mask,
                                             enable_gqa=NH != KV).transpose(0, 1)
        assert close(o[rows], ref, dtype), c


def test_decode_row_equals_a_one_token_chunk():
    """A decode row is a chunk of one token: the two kernels agree on it."""
    k_blocks, v_blocks, table, _, _ = paged([9, 20], 2, 16, 4, torch.float32, seed=3)
    q = torch.randn(2, 4, 16, generator=torch.Generator().manual_seed(1))
    pos = torch.tensor([8, 19])
    a = paged_decode_attention(q, k_blocks, v_blocks, table, pos)
    b = paged_prefill_attention(q, k_blocks, v_blocks, table, torch.arange(2), torch.ones(2, dtype=torch.long), pos)
    assert close(a, b, torch.float32)


def test_garbage_past_the_position_never_leaks():
    k_blocks, v_blocks, table, _, _ = paged([5], 1, 16, 4, torch.float32, seed=2)
    q = torch.randn(1, 2, 16)
    pos = torch.tensor([4])
    before = paged_decode_attention(q, k_blocks, v_blocks, table, pos)
    k_blocks[table[0, 1], 1:] = float("nan")  # slots past position 4 of the sequence's second block
    v_blocks[table[0, 1], 1:] = float("inf")
    assert torch.equal(paged_decode_attention(q, k_blocks, v_blocks, table, pos), before)


def test_bad_inputs_fail_before_any_launch():
    k_blocks, v_blocks, table, _, _ = paged([5, 3], 2, 16, 4, torch.float32, seed=0)
    q = torch.randn(2, 4, 16)
    with pytest.raises(ValueError, match="positions must lie"):
        paged_decode_attention(q, k_blocks, v_blocks, table, torch.tensor([4, 8]))  # M·BS = 8
    with pytest.raises(ValueError, match="block ids outside"):
        paged_decode_attention(q, k_blocks, v_blocks, table + 100, torch.tensor([4, 2]))
    with pytest.raises(ValueError, match="multiple of the kv heads"):
        paged_decode_attention(torch.randn(2, 3, 16), k_blocks, v_blocks, table, torch.tensor([4, 2]))
    with pytest.raises(ValueError, match="table_BM must be int32/int64"):
        paged_decode_attention(q, k_blocks, v_blocks, table.float(), torch.tensor([4, 2]))
    with pytest.raises(ValueError, match="one floating dtype"):
        paged_decode_attention(q.half(), k_blocks, v_blocks, table, torch.tensor([4, 2]))
    one = torch.ones(2, dtype=torch.long)
    with pytest.raises(ValueError, match="non-empty row ranges"):
        paged_prefill_attention(q, k_blocks, v_blocks, table, torch.tensor([0, 2]), one, torch.zeros(2).long())
    with pytest.raises(ValueError, match="chunk positions"):
        paged_prefill_attention(q, k_blocks, v_blocks, table, torch.arange(2), one, torch.tensor([0, 8]))


@settings(max_examples=15)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=4), st.sampled_from([(4, 4), (4, 2), (6, 1), (8, 2)]),
       st.sampled_from([1, 3, 4, 16]), st.integers(0, 2 ** 16))
def test_random_shapes_against_twins(lengths, heads, BS, seed):
    """Random lengths, block sizes (1 and non-powers of two included) and head groupings: both
    kernels against their twins; the prefill kernel's chunks start anywhere in a sequence."""
    NH, KV = heads
    k_blocks, v_blocks, table, _, _ = paged(lengths, KV, 16, BS, torch.float32, seed=seed)
    g = torch.Generator().manual_seed(seed)
    pos = torch.tensor([torch.randint(0, n, (1,), generator=g).item() for n in lengths])
    q = torch.randn(len(lengths), NH, 16, generator=g)
    assert close(paged_decode_attention(q, k_blocks, v_blocks, table, pos),
                 paged_decode_attention_torch(q, k_blocks, v_blocks, table, pos), torch.float32)
    q_len = torch.tensor([int(torch.randint(1, n - p + 1, (1,), generator=g)) for n, p in zip(lengths, pos.tolist(),
                                                                                             strict=True)])
    q_start = torch.cumsum(q_len, 0) - q_len
    qc = torch.randn(int(q_len.sum()), NH, 16, generator=g)
    args = (qc, k_blocks, v_blocks, table, q_start, q_len, pos)
    assert close(paged_prefill_attention(*args), paged_prefill_attention_torch(*args), torch.float32)
