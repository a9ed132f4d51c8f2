"""The serving engine on a GPU: paged kernels in bf16 against their twins; decode steps replayed as
CUDA graphs (block tables as graph inputs) against the same engine run eagerly; the fused glue and
kernels against the plain-PyTorch step; and the paged engine against chapter 6's static engine.
Greedy tokens must agree except where the reference's two best logits are within MARGIN (a bucket's
padding rows or another row count can move a logit by round-off)."""
import pytest
import torch

from dispatch.engine import Engine, LeanModel
from dispatch.hf import tiny_model
from dispatch.kernels.paged_attention import (
    paged_decode_attention,
    paged_decode_attention_torch,
    paged_prefill_attention,
    paged_prefill_attention_torch,
)
from dispatch.serve import EngineConfig, LLMEngine, RequestParams

pytestmark = pytest.mark.gpu
MARGIN = {torch.float32: 1e-3, torch.bfloat16: 0.25}


def close(a, b, tol=2e-2):
    return (a.float() - b.float()).abs().max().item() <= tol * b.float().abs().max().item()


def same_greedy(ours, ref, margins, dtype):
    for i, (a, b) in enumerate(zip(ours, ref, strict=False)):
        if a != b:
            return margins[i] < MARGIN[dtype]
    return len(ours) == len(ref)


@pytest.mark.parametrize("NH,KV,D,BS", [(16, 16, 128, 16), (32, 4, 128, 16), (8, 2, 64, 32)])
def test_paged_kernels_bf16(NH, KV, D, BS):
    g = torch.Generator(device="cuda").manual_seed(0)
    NB, B, M = 512, 24, 16  # B·M = 384 distinct blocks of the NB
    kb = torch.randn(NB, BS, KV, D, device="cuda", dtype=torch.bfloat16, generator=g)
    vb = torch.randn(NB, BS, KV, D, device="cuda", dtype=torch.bfloat16, generator=g)
    table = torch.randperm(NB, device="cuda", generator=g)[:B * M].view(B, M).int()
    pos = torch.randint(0, M * BS, (B,), device="cuda", generator=g)
    pos[0], pos[1] = 0, M * BS - 1
    q = torch.randn(B, NH, D, device="cuda", dtype=torch.bfloat16, generator=g)
    assert close(paged_decode_attention(q, kb, vb, table, pos), paged_decode_attention_torch(q, kb, vb, table, pos))
    q_len = torch.tensor([1, 77, 16, 130], device="cuda")
    ctx = torch.tensor([5, 0, 48, 100], device="cuda")
    q_start = torch.cumsum(q_len, 0) - q_len
    q = torch.randn(int(q_len.sum()), NH, D, device="cuda", dtype=torch.bfloat16, generator=g)
    args = (q, kb, vb, table[:4], q_start, q_len, ctx)
    assert close(paged_prefill_attention(*args), paged_prefill_attention_torch(*args))


def prompts(n=(3, 40, 9, 17, 1, 25)):
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, 128, (k,), generator=g).tolist() for k in n]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_graphed_decode_equals_eager(dtype):
    _, model = tiny_model("olmoe")
    model = model.cuda().to(dtype)
    cfg = dict(max_seqs=8, max_step_tokens=32, block_size=16, max_model_len=64, num_blocks=64)
    eager = LLMEngine(model, EngineConfig(**cfg, graphs=False), eos_token_ids=(), record_margins=True).generate(
        prompts(), RequestParams(max_tokens=20))
    eng = LLMEngine(model, EngineConfig(**cfg, graphs=True), eos_token_ids=())
    eng.warmup()
    assert sorted(eng.runner._graphs) == [1, 2, 4, 8]  # every bucket up to max_seqs, before any request
    graphed = eng.generate(prompts(), RequestParams(max_tokens=20))
    for o, r in zip(graphed, eager, strict=True):
        assert same_greedy(o.tokens, r.tokens, r.margins, dtype)
    assert eng.alloc.num_used == 0


def test_fused_step_equals_the_torch_step():
    """Chapter 6's fused glue (K/V through the step's scratch) and the paged kernels, fp32, against the
    plain-PyTorch step (the twins) on the same GPU: mixed steps with chunked prefill and decode rows."""
    _, model = tiny_model("qwen3_moe")
    model = model.cuda()
    cfg = dict(max_seqs=8, max_step_tokens=24, block_size=4, max_model_len=64, num_blocks=128, graphs=False)
    plain = LLMEngine(LeanModel.from_hf(model, fused=False), EngineConfig(**cfg, kernels=False), eos_token_ids=(),
                      record_margins=True).generate(prompts(), RequestParams(max_tokens=16))
    fused = LLMEngine(LeanModel.from_hf(model), EngineConfig(**cfg, kernels=True), eos_token_ids=()).generate(
        prompts(), RequestParams(max_tokens=16))
    for o, r in zip(fused, plain, strict=True):
        assert same_greedy(o.tokens, r.tokens, r.margins, torch.float32)


def test_paged_engine_equals_the_static_engine():
    _, model = tiny_model("mixtral")
    model = model.cuda().to(torch.bfloat16)
    cfg = EngineConfig(max_seqs=8, max_step_tokens=16, block_size=16, max_model_len=64, num_blocks=64)
    outs = LLMEngine(model, cfg, eos_token_ids=()).generate(prompts(), RequestParams(max_tokens=12))
    static = Engine(model, max_batch=1, max_seq=64)
    alone = LLMEngine(model, EngineConfig(max_seqs=1, max_model_len=64, num_blocks=16), eos_token_ids=(),
                      record_margins=True)
    for p, o in zip(prompts(), outs, strict=True):
        ref = alone.generate([p], RequestParams(max_tokens=12))[0]
        assert same_greedy(o.tokens, ref.tokens, ref.margins, torch.bfloat16)
        assert same_greedy(static.generate([p], 12).tokens[0], ref.tokens, ref.margins, torch.bfloat16)
