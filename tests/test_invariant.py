"""Batch-invariant mode (dispatch.engine.invariant): a row's bits do not depend on the rows beside it.

CPU: Triton's interpreter, fp32, tiny random models and the shipped one; every comparison is bitwise
(``torch.equal``), except against the default forward (same model, other reduction orders: 1e-5 of the
largest |logit|). GPU (marker ``gpu``): the shipped model in bf16, T = 1 … 64, decode and verify steps;
one MoE layer of OLMoE and Qwen3 shapes, whose tuned tiles change with T.
"""
import pytest
import torch

from dispatch.engine import Engine, LeanModel
from dispatch.engine import invariant as inv
from dispatch.hf import tiny_model
from dispatch.kernels import tiles
from dispatch.kernels.attention import decode_attention, decode_attention_torch
from dispatch.kernels.dense_gemv import heuristic_dense, invariant_dense, linear_small, linear_small_torch
from dispatch.kernels.tiles import DecodeConfig
from dispatch_book.spec_study import invariance

FAMILIES = {"olmoe": {}, "mixtral": {}, "qwen3_moe": {}, "qwen2_moe": {"mlp_only_layers": [0]}}


def tiny_lean(family, **kw):
    _, model = tiny_model(family, **FAMILIES[family])
    return model, LeanModel.from_hf(model, **kw)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_linear_rows_do_not_depend_on_the_rows_beside_them(dtype):
    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(40, 72, generator=g), torch.randn(100, 72, generator=g) / 8, torch.randn(100, generator=g)
    x, w, b = x.to(dtype), w.to(dtype), b.to(dtype)
    full = linear_small(x, w, b, invariant=True)
    assert full.shape == (40, 100) and full.dtype == dtype
    torch.testing.assert_close(full, linear_small_torch(x, w, b), atol=1e-3 if dtype == torch.float16 else 1e-5,
                               rtol=1e-3 if dtype == torch.float16 else 1e-4)
    for M in (1, 2, 15, 16, 17, 33):
        assert torch.equal(linear_small(x[:M], w, b, invariant=True), full[:M]), f"rows 0..{M - 1} at M={M}"
    assert torch.equal(linear_small(x[7:8], w, invariant=True), linear_small(x, w, invariant=True)[7:8])
    assert linear_small(x[:0], w, invariant=True).shape == (0, 100)


def test_linear_config_depends_on_the_weight_only():
    assert invariant_dense(4096, 128, "cpu") == invariant_dense(4096, 128, "cpu")
    assert invariant_dense(4096, 128, "cpu").rows(2) >= 16  # the tl.dot variant
    assert heuristic_dense(1, 4096, 128, "cpu") != heuristic_dense(2, 4096, 128, "cpu")  # what the mode avoids
    with pytest.raises(ValueError, match="invariant=True"):
        linear_small(torch.zeros(17, 8), torch.zeros(4, 8))


def test_gpu_invariant_tiles_keep_programs_at_one_row_tile(monkeypatch):
    """On a 132-SM GPU (H100, H200) the rule picks, for OLMoE's weights, the configs the step_kernels
    bench measured fastest at 1 and 64 rows together: QKV 64-row tiles, O 16, the output layer 128."""
    from dispatch import runtime

    monkeypatch.setattr(runtime, "num_sms", lambda dev: 132)
    monkeypatch.setattr(runtime, "max_shared_bytes", lambda dev: 232448)
    picks = {name: invariant_dense(N, 2048, "cuda") for name, N in (("qkv", 6144), ("o", 2048), ("lm_head", 50304))}
    assert {k: (c.block_n, c.block_k) for k, c in picks.items()} == {"qkv": (64, 128), "o": (16, 512),
                                                                     "lm_head": (128, 64)}
    assert all(c.rows(2) >= 16 for c in picks.values())


@pytest.mark.parametrize("splits", [1, 3])
def test_attention_queries_per_row(splits):
    """Q queries per cache row: the twin's values, and each query's bits as when it runs alone."""
    g = torch.Generator().manual_seed(splits)
    Bc, S, KV, G, D, Q = 3, 40, 2, 2, 16, 4
    k, v = torch.randn(Bc, S, KV, D, generator=g), torch.randn(Bc, S, KV, D, generator=g)
    q = torch.randn(2 * Q, KV * G, D, generator=g)
    pos = torch.tensor([5, 6, 7, 8, 30, 31, 32, 33])
    o = decode_attention(q, k, v, pos, splits=splits, queries_per_row=Q)
    torch.testing.assert_close(o, decode_attention_torch(q, k, v, pos, queries_per_row=Q), atol=1e-5, rtol=1e-5)
    for r in range(2 * Q):
        alone = decode_attention(q[r:r + 1], k[r // Q:r // Q + 1], v[r // Q:r // Q + 1], pos[r:r + 1], splits=splits)
        assert torch.equal(o[r], alone[0]), f"query {r}"
    with pytest.raises(ValueError, match="queries_per_row"):
        decode_attention(q[:3], k, v, pos[:3], queries_per_row=2)
    with pytest.raises(ValueError, match="B_max"):
        decode_attention(q, k[:1], v[:1], pos, queries_per_row=Q)


@pytest.mark.parametrize("gate", [False, True])
def test_silu_mul_rows(gate):
    """The SwiGLU product and the shared expert's gate: the twin's values, each row's bits at any T
    (torch's own vectorised SiLU on a CPU gives an element other bits at another place in the tensor)."""
    g = torch.Generator().manual_seed(int(gate))
    a, b = torch.randn(37, 1 if gate else 48, generator=g) * 4, torch.randn(37, 48, generator=g)
    full = inv.silu_mul(a, b, gate=gate)
    torch.testing.assert_close(full, inv.silu_mul_torch(a, b, gate=gate), atol=1e-6, rtol=1e-5)
    for r in (0, 5, 36):
        assert torch.equal(inv.silu_mul(a[r:r + 1], b[r:r + 1], gate=gate), full[r:r + 1])
    with pytest.raises(ValueError, match="silu_mul"):
        inv.silu_mul(a[:3], b[:4], gate=gate)


def test_decode_tiles_keep_the_one_token_kind(monkeypatch):
    cfg = tiny_lean("olmoe")[1].moe_cfgs[0]
    assert inv.decode_tiles(cfg, torch.float32, "cpu") == inv.INTERPRET_DECODE
    assert inv.decode_tiles(cfg, torch.float32, "cpu", T=40) == inv.INTERPRET_DECODE
    # on a GPU: the table's one-token tiles, unless they are FMAs or a split sum; at T > 1, T's own
    # tiles when they are of that kind (16 rows per tl.dot, one launch or three, no split)
    inv._decode_tiles.cache_clear()
    monkeypatch.setattr(tiles, "interpreting", lambda dev: False)
    monkeypatch.setattr(tiles, "_slug", lambda dev: "fake")
    plain, fma = DecodeConfig(block_m=16, programs=64), DecodeConfig(block_m=1, programs=64)
    wide = DecodeConfig(block_m=16, block_i=64, block_ho=128, programs=264)
    heuristic = DecodeConfig(block_m=16, block_i=16)
    monkeypatch.setattr(tiles, "heuristic_decode", lambda *a: heuristic)
    fused = DecodeConfig(block_m=16, fused=64)
    by_t = {1: plain, 8: fused, 16: DecodeConfig(split=1), 32: DecodeConfig(block_m=32), 64: wide}
    try:
        for T, want in ((1, plain), (8, fused), (16, plain), (32, plain), (64, wide)):
            inv._decode_tiles.cache_clear()
            asked = []
            monkeypatch.setattr(tiles, "_lookup", lambda *a, seen=asked: seen.append(a[7]) or by_t[a[7]])  # a[7]: T
            assert inv.decode_tiles(cfg, torch.bfloat16, "cuda", T=T) == want, T
            assert asked == ([1] if T == 1 else [1, T])
        by_t[1] = fused  # one launch of the chain's items: bitwise the three launches, so kept
        inv._decode_tiles.cache_clear()
        monkeypatch.setattr(tiles, "_lookup", lambda *a: by_t[a[7]])
        assert inv.decode_tiles(cfg, torch.bfloat16, "cuda", T=1) == fused
        by_t[1] = fma  # an FMA one-token config: the heuristic's tl.dot tiles, and T's only if of their kind
        for T, want in ((1, heuristic), (64, wide), (32, heuristic)):
            inv._decode_tiles.cache_clear()
            monkeypatch.setattr(tiles, "_lookup", lambda *a: by_t[a[7]])
            assert inv.decode_tiles(cfg, torch.bfloat16, "cuda", T=T) == want, T
    finally:
        inv._decode_tiles.cache_clear()


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_rows_alone_and_together(family):
    """Decode steps of T rows: every row's logits bitwise its logits alone; the same model as the
    default forward (within fp32 reordering)."""
    model, lean = tiny_lean(family, batch_invariant=True)
    assert lean.batch_invariant and lean.fused
    rows = invariance(lean, (1, 3, 6), seed=1, cache_len=24, prompt_lens=(2, 12))
    assert [r["equal"] for r in rows] == [r["T"] for r in rows]
    ids = torch.randint(0, 128, (2, 7), generator=torch.Generator().manual_seed(2))
    plain = LeanModel.from_hf(model)
    outs = []
    for m in (lean, plain):
        cache = m.new_cache(2, 16)
        with torch.no_grad():
            m(ids[:, :6], torch.arange(6).expand(2, 6), cache, prefill=True)
            outs.append(m(ids[:, 6:], torch.full((2, 1), 6), cache, prefill=False))
    assert (outs[0] - outs[1]).abs().max() <= 1e-5 * outs[1].abs().max()


@pytest.mark.parametrize("S", [2, 5])
def test_verify_step_equals_token_by_token(S):
    """A step of S consecutive tokens per row (speculative verify): the bits of S one-token steps."""
    _, lean = tiny_lean("qwen3_moe", batch_invariant=True)
    rows = invariance(lean, (1, 2), tokens_per_row=S, seed=S, cache_len=24, prompt_lens=(2, 12))
    assert [r["equal"] for r in rows] == [1, 2]


def test_shipped_model_rows_alone_and_together():
    from dispatch.train import load

    lean = LeanModel.from_hf(load("cpu").model, batch_invariant=True)
    rows = invariance(lean, (1, 3), seed=3) + invariance(lean, (2,), tokens_per_row=3, seed=4)
    assert all(r["equal"] == r["T"] for r in rows)


def test_engine_batch_invariant_tokens_do_not_depend_on_the_batch():
    """Greedy tokens of a prompt alone (bucket 1) and among two others (bucket 4): identical."""
    model, lean = tiny_lean("olmoe")
    eng = Engine(model, max_batch=4, max_seq=16, batch_invariant=True)
    assert eng.model.batch_invariant and not lean.batch_invariant
    assert Engine(lean, batch_invariant=True).model.embed is lean.embed  # weights shared, not copied
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 128, (n,), generator=g).tolist() for n in (4, 9, 2)]
    together = eng.generate(prompts, 6).tokens
    assert eng.generate(prompts[1:2], 6).tokens[0] == together[1]


def test_refuses_what_it_does_not_cover():
    _, ds = tiny_model("deepseek_v3")
    with pytest.raises(ValueError, match="lean forward"):
        Engine(ds, batch_invariant=True)
    from dispatch.quant import quantize_model

    model, _ = tiny_lean("olmoe")
    with pytest.raises(ValueError, match="quantized"):
        LeanModel.from_hf(model, quantized=quantize_model(model, "int8-channel"), batch_invariant=True)


@pytest.mark.slow
def test_rows_alone_and_together_T_1_to_64():
    # One layer: every kernel of the step runs at every T; a second layer would repeat them on the same
    # shapes (its input rows are the first layer's, bitwise the alone ones when the claim holds). Two
    # query heads on one KV head (still grouped-query): heads are programs of their own, like rows.
    _, model = tiny_model("olmoe", num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
    lean = LeanModel.from_hf(model, batch_invariant=True)
    rows = invariance(lean, range(1, 65), seed=7, cache_len=24, prompt_lens=(2, 8))
    assert [r["equal"] for r in rows] == list(range(1, 65))


@pytest.mark.gpu
@pytest.mark.parametrize("S", [1, 5])
def test_gpu_shipped_model_T_1_to_64(S):
    """bf16 on the GPU, compiled kernels: T = 1 … 64 rows, decode (S = 1) and verify (S = 5) steps."""
    from dispatch.train import load

    lean = LeanModel.from_hf(load("cpu", device="cuda").model, batch_invariant=True)
    rows = invariance(lean, range(1, 65), tokens_per_row=S, seed=8, cache_len=160)
    assert [r["equal"] for r in rows] == list(range(1, 65))


@pytest.mark.gpu
def test_gpu_engine_graphs_batch_invariant():
    """Under CUDA graphs: a prompt's greedy tokens alone and inside a batch of 37 (bucket 64) agree."""
    from dispatch.train import load

    eng = Engine(load("cpu", device="cuda").model, max_batch=64, max_seq=96, batch_invariant=True)
    g = torch.Generator().manual_seed(9)
    prompts = [torch.randint(1, 4096, (int(n),), generator=g).tolist() for n in torch.randint(3, 30, (37,),
                                                                                              generator=g)]
    together = eng.generate(prompts, 32).tokens
    for r in (0, 17, 36):
        assert eng.generate(prompts[r:r + 1], 32).tokens[0] == together[r]


@pytest.mark.gpu
@pytest.mark.parametrize("preset", ["olmoe-1b-7b", "qwen3-30b-a3b"])
def test_gpu_tuned_layer_rows_T_1_to_64(preset):
    """One MoE layer of a preset with tuned tiles (bf16, random weights): each T takes its bucket's
    tiles where they are of the one-token kind, and every row's output is the bits it has alone."""
    from dispatch.config import PRESETS, random_weights

    cfg = PRESETS[preset]
    w = random_weights(cfg, seed=3, dtype=torch.bfloat16, device="cuda")
    x = torch.randn(64, cfg.H, generator=torch.Generator().manual_seed(4)).to("cuda", torch.bfloat16)
    alone = torch.cat([inv.moe_layer(x[r:r + 1], cfg, w) for r in range(64)])
    seen = set()
    for T in range(1, 65):
        seen.add(inv.decode_tiles(cfg, torch.bfloat16, "cuda", T))
        assert torch.equal(inv.moe_layer(x[:T], cfg, w), alone[:T]), T
    if len(seen) == 1:  # no tuned table for this GPU: one config for every T, the claim held trivially
        pytest.skip(f"one experts config for T = 1..64 on {torch.cuda.get_device_name()}")
