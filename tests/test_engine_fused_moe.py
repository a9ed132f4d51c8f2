"""The batch-1 MoE fusions against their twins (fp32; Triton's interpreter on CPU). Tolerance: 1e-5
relative to the largest |value| (fp32 reorderings); expert ids identical (continuous random logits)."""
import pytest
import torch

from dispatch.config import MoEConfig
from dispatch.engine import LeanModel
from dispatch.hf import tiny_model
from dispatch.kernels.fused_moe import moe_decode_1, router_topk, router_topk_torch
from dispatch.kernels.gemv import moe_decode_torch

TOL = 1e-5


def close(a, b):
    return (a - b).abs().max().item() <= TOL * max(b.abs().max().item(), 1e-30)


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("T,H,E,K,renorm", [(1, 64, 8, 2, False), (3, 96, 16, 4, True), (1, 200, 64, 8, False),
                                            (0, 64, 8, 2, True), (2, 64, 6, 6, False)])
def test_router_topk(T, H, E, K, renorm, split):
    g = torch.Generator().manual_seed(T * 7 + E)
    cfg = MoEConfig(H, 32, E, K, norm_topk_prob=renorm)
    x, w = torch.randn(T, H, generator=g), torch.randn(E, H, generator=g) / H**0.5
    wts, ids = router_topk(x, w, cfg, split=split)
    wts2, ids2 = router_topk_torch(x, w, cfg)
    assert torch.equal(ids, ids2) and (T == 0 or close(wts, wts2))


def test_split_router_rows_are_the_same_bits_alone_and_together():
    """The batch-invariant router: a token's weights and ids are the same bits in a step of 1 row or
    of 37 (fp16 x, the order of each logit's sum fixed by (E, H))."""
    g = torch.Generator().manual_seed(5)
    cfg = MoEConfig(96, 32, 24, 4, norm_topk_prob=True)
    x, w = torch.randn(37, 96, generator=g).half(), (torch.randn(24, 96, generator=g) / 10).half()
    wts, ids = router_topk(x, w, cfg, split=True)
    for t in (0, 17, 36):
        one_w, one_i = router_topk(x[t:t + 1], w, cfg, split=True)
        assert torch.equal(one_w[0], wts[t]) and torch.equal(one_i[0], ids[t]), t


@pytest.mark.parametrize("split", [False, True])
def test_router_topk_ties_and_bad_input(split):
    cfg = MoEConfig(16, 8, 4, 2)
    w = torch.zeros(4, 16)  # every logit 0: a four-way tie, the lowest ids win
    assert router_topk(torch.ones(1, 16), w, cfg, split=split)[1].tolist() == [[0, 1]]
    x = torch.randn(2, 16)
    x[1, 3] = float("nan")  # a non-finite token: K valid, distinct ids, NaN weights; the other row intact
    wts, ids = router_topk(x, torch.randn(4, 16), cfg, split=split)
    assert ids[1].unique().numel() == 2 and bool(((ids >= 0) & (ids < 4)).all())
    assert wts[1].isnan().all() and wts[0].isfinite().all()
    with pytest.raises(ValueError, match="router"):
        router_topk(torch.ones(1, 16), torch.zeros(5, 16), cfg)
    with pytest.raises(ValueError, match="softmax"):
        router_topk(torch.ones(1, 16), w, MoEConfig(16, 8, 4, 2, scoring="sigmoid"))


@pytest.mark.parametrize("H,I,E,K,bad", [(64, 32, 8, 2, False), (96, 48, 16, 4, False), (64, 32, 8, 3, True),
                                         (128, 64, 4, 4, False)])
def test_moe_decode_1(H, I, E, K, bad):  # noqa: E741
    g = torch.Generator().manual_seed(H + E + K)
    x = torch.randn(1, H, generator=g)
    gu, dn = torch.randn(E, 2 * I, H, generator=g) / H**0.5, torch.randn(E, H, I, generator=g) / I**0.5
    ids = torch.randperm(E, generator=g)[:K][None].int()
    w = torch.rand(1, K, generator=g)
    if bad:
        ids[0, 1] = E + 3  # adds nothing, as everywhere in the package
    y = moe_decode_1(x, w, ids, gu, dn)
    keep = ids < E
    ref = moe_decode_torch(x, w * keep, torch.where(keep, ids, 0), gu, dn)
    assert close(y, ref)


def test_moe_decode_1_rejects_more_tokens():
    x, gu, dn = torch.zeros(2, 16), torch.zeros(4, 32, 16), torch.zeros(4, 16, 16)
    with pytest.raises(ValueError, match="T = 1"):
        moe_decode_1(x, torch.ones(2, 2), torch.zeros(2, 2, dtype=torch.int32), gu, dn)


@pytest.mark.parametrize("family", ["olmoe", "qwen2_moe"])
def test_lean_decode_step_with_fused_moe(family):
    """Batch 1, kernels everywhere (glue, router, experts): the decode step's logits as transformers'."""
    _, model = tiny_model(family)
    lean = LeanModel.from_hf(model, fused=True, fused_moe=True, moe_path="decode")
    ids = torch.randint(0, 128, (1, 6), generator=torch.Generator().manual_seed(6))
    cache = lean.new_cache(1, 8)
    with torch.no_grad():
        ref = model(ids).logits
        lean(ids[:, :5], torch.arange(5)[None], cache, prefill=True)
        step = lean(ids[:, 5:], torch.full((1, 1), 5), cache, prefill=False)
    assert close(step[:, 0], ref[:, 5])
