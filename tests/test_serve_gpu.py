"""The serving engine on a GPU: paged kernels in bf16 against their twins, and decode steps replayed
as CUDA graphs (block tables as graph inputs) against the same engine run eagerly."""
import pytest
import torch

from dispatch.hf import tiny_model
from dispatch.serve import EngineConfig, LLMEngine, RequestParams
from dispatch.serve.attention import (
    paged_decode_attention,
    paged_decode_attention_torch,
    paged_prefill_attention,
    paged_prefill_attention_torch,
)

pytestmark = pytest.mark.gpu


def close(a, b, tol=2e-2):
    return (a.float() - b.float()).abs().max().item() <= tol * b.float().abs().max().item()


@pytest.mark.parametrize("NH,KV,D,BS", [(16, 16, 128, 16), (32, 4, 128, 16), (8, 2, 64, 32)])
def test_paged_kernels_bf16(NH, KV, D, BS):
    g = torch.Generator(device="cuda").manual_seed(0)
    NB, B, M = 300, 24, 16
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


def test_graphed_decode_equals_eager():
    _, model = tiny_model("olmoe")
    model = model.cuda().to(torch.bfloat16)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 128, (n,), generator=g).tolist() for n in (3, 40, 9, 17, 1, 25)]
    cfg = dict(max_seqs=8, max_step_tokens=32, block_size=16, max_model_len=64)
    eager = LLMEngine(model, EngineConfig(**cfg, graphs=False), eos_token_ids=()).generate(
        prompts, RequestParams(max_tokens=20))
    eng = LLMEngine(model, EngineConfig(**cfg, graphs=True), eos_token_ids=())
    eng.warmup()
    assert sorted(eng.runner._graphs) == [1, 2, 4, 8]  # every bucket up to max_seqs, before any request
    graphed = eng.generate(prompts, RequestParams(max_tokens=20))
    assert [o.tokens for o in graphed] == [o.tokens for o in eager]
    assert eng.alloc.num_used == 0
