"""Decode attention (dispatch.kernels.attention) against its fp32 twin, torch's SDPA with the engine's
boolean mask, and hand-computed cases; CPU under Triton's interpreter in fp32 and fp16, bf16 on a GPU.
Tolerance: relative to the largest |reference| value, 1e-5 in fp32, 4e-3 in fp16 (p rounded to fp16
before the P·V product, the output rounded once), 2e-2 in bf16."""
import pytest
import torch
import torch.nn.functional as F

from dispatch.kernels import attention
from dispatch.kernels.attention import decode_attention, decode_attention_torch, num_splits

TOL = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 2e-2}


def close(a, b, dtype):
    return (a.float() - b.float()).abs().max().item() <= TOL[dtype] * max(b.float().abs().max().item(), 1e-30)


def sdpa(q_BHD, k_BSKD, v_BSKD, pos_B, scale=None):
    """The engine's decode attention as model.py writes it: SDPA over the whole cache, boolean mask."""
    B, NH, _ = q_BHD.shape
    keys = torch.arange(k_BSKD.shape[1], device=q_BHD.device)
    mask = (keys[None, :] <= pos_B[:, None])[:, None, None, :]
    k, v = k_BSKD[:B].transpose(1, 2), v_BSKD[:B].transpose(1, 2)
    o = F.scaled_dot_product_attention(q_BHD[:, :, None], k, v, attn_mask=mask, scale=scale,
                                       enable_gqa=k.shape[1] != NH)
    return o[:, :, 0]


def inputs(B, NH, KV, D, S, dtype, seed, extra_rows=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, NH, D, generator=g)
    k, v = (torch.randn(B + extra_rows, S, KV, D, generator=g) for _ in range(2))
    pos = torch.randint(0, S, (B,), generator=g)  # rows at both ends of the cache, the others random
    pos[:2] = torch.tensor([S - 1, 0])[:B]
    return [t.to(device=device, dtype=dtype) for t in (q, k, v)] + [pos.to(device)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("NH,KV", [(4, 4), (8, 2), (6, 1)])
@pytest.mark.parametrize("S", [1, 17, 70])
@pytest.mark.parametrize("splits", [1, 4])
def test_matches_twin_and_sdpa(dtype, NH, KV, S, splits):
    B, D = (3, 16) if splits == 1 else (1 if S == 17 else 3, 64)
    q, k, v, pos = inputs(B, NH, KV, D, S, dtype, seed=NH * 1000 + S * 10 + splits)
    o = decode_attention(q, k, v, pos, splits=splits)
    assert o.shape == (B, NH, D) and o.dtype == dtype
    assert close(o, decode_attention_torch(q, k, v, pos), dtype)
    assert close(o, sdpa(q.float(), k.float(), v.float(), pos), dtype)


@pytest.mark.parametrize("splits", [1, 3])
def test_strided_int32_positions_scale_and_several_steps(splits):
    q, k, v, pos = inputs(3, 8, 2, 16, 300, torch.float32, seed=7)  # up to 5 BLOCK_S steps per program
    pos_strided = torch.stack([pos, pos, pos], 1).int()[:, 1]  # e.g. one column of pos_BS
    o = decode_attention(q, k, v, pos_strided, 0.3, splits=splits)
    assert close(o, sdpa(q, k, v, pos, scale=0.3), torch.float32)


def test_hand_computed_cases():
    """pos 0: one key, so each head returns its kv head's v[0]; equal keys: the mean of v[0..pos]."""
    g = torch.Generator().manual_seed(1)
    q, v = torch.randn(2, 4, 16, generator=g), torch.randn(2, 9, 2, 16, generator=g)
    k = torch.randn(2, 9, 2, 16, generator=g)
    o = decode_attention(q, k, v, torch.tensor([0, 0]))
    assert torch.equal(o, v[:, 0].repeat_interleave(2, dim=1))
    o = decode_attention(q, torch.ones_like(k), v, torch.tensor([4, 8]), splits=2)
    mean = torch.stack([v[0, :5].mean(0), v[1, :9].mean(0)]).repeat_interleave(2, dim=1)
    assert close(o, mean, torch.float32)
    assert decode_attention(q[:0], k, v, torch.tensor([], dtype=torch.long)).shape == (0, 4, 16)


def test_cache_views_with_more_rows():
    """k/v as one layer of an [L, B_max, S, KV, D] cache, and as a [B, KV, S, D] tensor transposed;
    rows past q's B hold NaN and are never read."""
    q, k, v, pos = inputs(2, 4, 2, 16, 33, torch.float32, seed=3, extra_rows=3)
    k[2:], v[2:] = float("nan"), float("nan")
    cache = torch.stack([torch.zeros_like(k), k]), torch.stack([torch.zeros_like(v), v])
    ref = decode_attention_torch(q, k, v, pos)
    assert close(decode_attention(q, cache[0][1], cache[1][1], pos, splits=2), ref, torch.float32)
    kt, vt = (c.transpose(1, 2).contiguous().transpose(1, 2) for c in (k, v))
    assert close(decode_attention(q, kt, vt, pos), ref, torch.float32)
    q_view = torch.randn(2, 1, 4, 16).transpose(1, 2)[:, :, 0]  # non-contiguous rows and heads
    assert close(decode_attention(q_view, k, v, pos), decode_attention_torch(q_view, k, v, pos), torch.float32)


@pytest.mark.parametrize("garbage", [float("nan"), float("inf"), 1e30])
@pytest.mark.parametrize("splits", [1, 4])
def test_keys_past_position_never_read(garbage, splits):
    q, k, v, pos = inputs(3, 4, 4, 16, 70, torch.float32, seed=5)
    clean = decode_attention(q, k, v, pos, splits=splits)
    past_BS = torch.arange(70)[None, :] > pos[:, None]
    k[past_BS], v[past_BS] = garbage, garbage
    dirty = decode_attention(q, k, v, pos, splits=splits)
    assert torch.isfinite(dirty).all() and torch.equal(dirty, clean)
    assert close(dirty, decode_attention_torch(q, k, v, pos), torch.float32)


def test_split_policy(monkeypatch):
    monkeypatch.setattr(attention.runtime, "num_sms", lambda device=None: 132)
    assert num_splits(512, 16) == 4  # batch 1, OLMoE: 16 (b, kv) programs, chunks of 128 keys
    assert num_splits(2048, 16) == 9 and num_splits(100, 16) == 1  # fill the SMs; short caches: 1
    assert num_splits(4096, 64 * 16) == 1  # a big batch fills the SMs by itself
    for S, want in ((2048, 9), (17, 4), (70, 3), (1, 5)):
        splits, chunk, block = attention._plan(S, want, 128)
        assert splits <= want and chunk % block == 0 and (splits - 1) * chunk < S <= splits * chunk


def test_rejects_bad_inputs():
    q, k, v, pos = inputs(2, 4, 2, 16, 8, torch.float32, seed=0)
    bad = {
        "one floating dtype": (q.half(), k, v, pos), "share one floating": (q.long(), k.long(), v.long(), pos),
        "one shape": (q, k, v[:, :4], pos), "power of two": (q[..., :12], k[..., :12], v[..., :12], pos),
        "positive multiple": (q[:, :3], k, v, pos), "B_max": (q, k[:1], v[:1], pos),
        "contiguous last": (q, k.transpose(1, 3).contiguous().transpose(1, 3), v, pos),
        "pos_B must be": (q, k, v, pos.float()), "shape \\[B=2\\]": (q, k, v, pos[:1]),
        "lie in \\[0, S=8\\)": (q, k, v, torch.tensor([0, 8])), "dimensions": (q[0], k, v, pos),
        "one device": (q, k, v, pos.to("meta")),
    }
    for match, args in bad.items():
        for fn in (decode_attention, decode_attention_torch):
            with pytest.raises(ValueError, match=match):
                fn(*args)
    with pytest.raises(ValueError, match="lie in"):
        decode_attention(q, k, v, torch.tensor([-1, 0]))
    with pytest.raises(ValueError, match="scale must be"):
        decode_attention(q, k, v, pos, float("nan"))
    with pytest.raises(ValueError, match="splits must be"):
        decode_attention(q, k, v, pos, splits=0)
    with pytest.raises(ValueError, match="bfloat16"):
        decode_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), pos)


@pytest.mark.gpu
def test_gpu_bf16_and_cuda_graph():
    """OLMoE-like shapes (and one grouped-query shape) in bf16 against SDPA and the fp32
    twin, both split and unsplit; then captured in a CUDA graph and replayed with new positions."""
    for B, NH, KV, splits in ((1, 16, 16, None), (64, 16, 16, None), (1, 16, 16, 1), (64, 16, 16, 4),
                              (4, 32, 4, None), (4, 32, 4, 1)):
        q, k, v, pos = inputs(B, NH, KV, 128, 512, torch.bfloat16, seed=B + NH, extra_rows=2, device="cuda")
        o = decode_attention(q, k, v, pos, splits=splits)
        assert close(o, sdpa(q, k, v, pos), torch.bfloat16)
        assert close(o, decode_attention_torch(q, k, v, pos), torch.bfloat16)
    for B in (1, 64):
        q, k, v, pos = inputs(B, 16, 16, 128, 512, torch.bfloat16, seed=B, device="cuda")
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            decode_attention(q, k, v, pos)  # compile outside the capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            o = decode_attention(q, k, v, pos)
        for seed in (1, 2):
            new = torch.randint(0, 512, (B,), generator=torch.Generator().manual_seed(seed))
            pos.copy_(new.cuda())
            q.copy_(torch.randn_like(q))
            graph.replay()
            torch.cuda.synchronize()
            assert close(o, sdpa(q, k, v, pos), torch.bfloat16)
