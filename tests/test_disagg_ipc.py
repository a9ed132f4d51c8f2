"""The one-copy CUDA IPC handoff (two workers on one GPU): the block copy, the prefill side's holds and
the decode side's copies on a CPU stand-in (in-process queues, CPU tensors), the ipc pair on CPU
(shared memory) answering as the co-located engine with every block back and a killed worker named,
and on a GPU the same."""
import queue
import time

import pytest
import torch
from test_disagg import killed_worker_case

from dispatch.kernels.block_copy import copy_blocks, copy_blocks_reference
from dispatch.serve import EngineConfig, LLMEngine, RequestParams
from dispatch.serve.blocks import BlockAllocator
from dispatch.serve.disagg import DisaggConfig, Disaggregated
from dispatch.serve.handoff import HandoffMeta, handoff_plan
from dispatch.serve.handoff_ipc import LinkTimeout, PoolReceiver, PoolSender, block_bytes

ENGINE = dict(block_size=4, max_seqs=8, max_step_tokens=16, num_blocks=96)
POOL = (2, 9, 4, 2, 1, 3)  # [L, NB+1, BS, 2, KV, D]


def _meta(rid: int, nb: int) -> HandoffMeta:
    return HandoffMeta(rid, tuple(range(4 * nb)), 2, {}, nb)


def _pair(max_inflight: int = 2, timeout_s: float = 5.0):
    """A prefill side (pool, allocator, sender) and a decode side (pool, receiver) over in-process queues."""
    link = (queue.Queue(), queue.Queue())
    src, alloc = torch.randn(POOL), BlockAllocator(POOL[1] - 1, POOL[2])
    tx = PoolSender(link, src, alloc.free, max_inflight=max_inflight, timeout_s=timeout_s)
    dst = torch.zeros(POOL)
    return src, alloc, tx, dst, PoolReceiver(link, dst)


def test_copy_blocks_is_torch_s_gather_then_scatter_and_refuses_other_layouts():
    src, dst = torch.randn(POOL), torch.randn(2, 5, *POOL[2:])
    s, d = torch.tensor([7, 2, 5]), torch.tensor([3, 0, 4])
    ref = dst.clone().index_copy_(1, d, src.index_select(1, s))
    copy_blocks(src, dst, s, d)
    assert torch.equal(dst, ref)
    with pytest.raises(ValueError, match="different layouts"):
        copy_blocks(src, torch.zeros(2, 5, 4, 2, 1, 4), s, d)
    before = dst.clone()
    for bad, match in ((([7, 2, 5], [3, 0, 5]), r"dst_ids must lie in \[0, 5\)"), (([9, 2, 5], [3, 0, 4]), "src_ids"),
                       (([-1, 2, 5], [3, 0, 4]), "src_ids"), (([7, 2, 5], [3, 0, 3]), "repeats"),
                       (([7, 2], [3, 0, 4]), "one destination per source")):
        with pytest.raises(ValueError, match=match):
            copy_blocks(src, dst, *bad)
    assert torch.equal(dst, before), "refused before any copy"
    ref2 = dst.clone()
    copy_blocks_reference(src, ref2, [1, 6], [2, 1])
    copy_blocks(src, dst, [1, 6], [2, 1])
    assert torch.equal(dst, ref2)
    copy_blocks(src, dst, [], [])  # nothing to copy
    assert torch.equal(dst, ref2)
    assert block_bytes(src) == 2 * 4 * 2 * 3 * 4
    for tile, warps in ((16, 1), (32, 2), (64, None)):  # blocks of 24 elements: two tiles (one part-full), or one
        out = torch.zeros_like(dst)
        copy_blocks(src, out, s, d, tile=tile, num_warps=warps)
        assert torch.equal(out, torch.zeros_like(dst).index_copy_(1, d, src.index_select(1, s)))
    for bad, match in (({"tile": 24}, "power of two"), ({"tile": 8}, ">= 16"), ({"num_warps": 3}, "num_warps")):
        with pytest.raises(ValueError, match=match):
            copy_blocks(src, dst, s, d, **bad)


def test_share_holds_blocks_past_their_table_s_free():
    alloc = BlockAllocator(8, 4)
    table, _ = alloc.allocate(list(range(10)))
    hold = alloc.share(table.blocks)
    alloc.free(table)
    assert alloc.num_free == 8 - 3
    alloc.free(hold)
    assert alloc.num_free == 8
    alloc.check()
    with pytest.raises(RuntimeError, match="only a held block"):
        alloc.share([0])


def test_prefill_blocks_stay_held_until_the_decode_side_s_done_and_land_exactly():
    src, alloc, tx, dst, rx = _pair()
    table, _ = alloc.allocate(list(range(12)))  # a 12-token prompt: 3 blocks
    hold = alloc.share(table.blocks)
    alloc.free(table)  # the prefill engine retires the request at its first token
    tx.send(_meta(5, 3), hold)
    assert alloc.num_free == 8 - 3 and tx.settle() == 0  # held: not free before "done"
    (a,) = rx.arrivals()
    assert a.meta.rid == 5 and a.blocks == tuple(hold.blocks) and rx.pool is src
    mine = [6, 1, 4]
    rx.copy(a, handoff_plan(12, 4, mine, cached_tokens=4))  # the first block from this side's prefix cache
    assert alloc.num_free == 8 - 3  # copied but not settled: still held
    ((meta, nbytes, seconds),) = rx.settle()
    assert meta.rid == 5 and nbytes == 2 * block_bytes(dst) and seconds >= 0
    assert torch.equal(dst[:, [1, 4]], src[:, list(a.blocks[1:])]) and dst[:, [6, 0, 2, 3, 5, 7, 8]].abs().sum() == 0
    assert tx.settle() == 1 and alloc.num_free == 8 and not tx.held
    alloc.check()


def test_the_prefill_side_waits_for_room_and_names_a_silent_decode_worker():
    src, alloc, tx, dst, rx = _pair(max_inflight=1, timeout_s=0.3)
    table, _ = alloc.allocate([1, 2, 3])
    tx.send(_meta(0, 1), alloc.share(table.blocks))
    assert tx.full
    t0 = time.monotonic()
    with pytest.raises(LinkTimeout, match=r"no 'done' from the decode worker within 0.3 s \(1 handoffs held\)"):
        tx.wait_room()
    assert time.monotonic() - t0 < 2
    (a,) = rx.arrivals()
    rx.copy(a, handoff_plan(3, 4, [2]))
    rx.settle()
    tx.wait_room()  # the "done" frees it
    assert not tx.full


def test_a_done_for_a_request_never_handed_off_is_refused():
    _, _, tx, _, _ = _pair()
    tx.rx.put(("done", 9))
    with pytest.raises(RuntimeError, match="request 9, which has no handoff held"):
        tx.settle()


def test_ipc_config_resolves_by_name_only():
    assert DisaggConfig(backend="ipc").resolved_backend == "ipc"
    with pytest.raises(ValueError, match="'auto', 'gloo', 'nccl', 'ipc'"):
        DisaggConfig(backend="cuda-ipc")


def _settled(d, s=5.0) -> dict:
    """The pools' stats once every "done" has reached the prefill side (it may trail the last token)."""
    end = time.monotonic() + s
    while True:
        st = d.stats()
        if st["prefill"]["held"] == 0 or time.monotonic() > end:
            return st


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU stand-in; the GPU tests below run the same")
def test_cpu_ipc_pair_answers_as_the_co_located_engine_with_every_block_back():
    """Pools of 32 blocks, ten 24-token prompts: the prefill side runs out of room and waits for "done"s."""
    from dispatch.train import load

    small = dict(ENGINE, num_blocks=32)
    prompts = [list(range(3 * i, 3 * i + 24)) for i in range(10)]
    params = [RequestParams(max_tokens=40, ignore_eos=True)] * 9 + [RequestParams(max_tokens=12, temperature=0.8,
                                                                                  seed=3)]
    with Disaggregated(DisaggConfig(**small, backend="ipc", max_inflight=4, timeout_s=60)) as d:
        outs, after = d.generate(prompts, params), _settled(d)
    torch.set_num_threads(1)
    ref = LLMEngine(load("cpu").model, EngineConfig(**small)).generate(prompts, params)
    assert [o.tokens for o in outs] == [r.tokens for r in ref]
    assert all(o.error is None and o.handoff_bytes == 6 * 4 * 4096 and o.handoff_s > 0 for o in outs)
    for role in ("prefill", "decode"):
        assert after[role]["free"] == after[role]["blocks"] == 32, after


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU stand-in")
@pytest.mark.parametrize("victim", ["decode", "prefill"])
def test_a_killed_cpu_ipc_worker_is_named(victim):
    killed_worker_case(DisaggConfig(**ENGINE, backend="ipc", timeout_s=20), victim)


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (both workers on it)")


@pytest.mark.gpu
@gpu
def test_ipc_pair_on_one_gpu_answers_as_the_co_located_engine():
    """Both workers on cuda:0, fp32: the co-located engine's tokens (a difference only at a near tie of
    its logits), every block back, the handoff's bytes as the blocks say and its time measured."""
    from dispatch.train import load

    prompts = [[5], list(range(10, 60)), list(range(100, 107)), list(range(100, 104)) + [7, 8]]
    params = [RequestParams(max_tokens=n, ignore_eos=True) for n in (20, 9, 14, 30)]
    params.append(RequestParams(max_tokens=12, temperature=0.8, seed=3))
    prompts.append(list(range(10, 17)))
    with Disaggregated(DisaggConfig(**ENGINE, backend="ipc", dtype="float32", timeout_s=120)) as d:
        assert d.backend == "ipc" and d.info["prefill"]["device"] == d.info["decode"]["device"] == "cuda:0"
        before, outs, after = d.stats(), d.generate(prompts, params), _settled(d)
    model = load("cpu", device="cuda", dtype="float32").model
    ref = LLMEngine(model, EngineConfig(**ENGINE), record_margins=True).generate(prompts, params)
    for o, r in zip(outs, ref, strict=True):
        assert o.error is None and len(o.tokens) == len(r.tokens)
        i = next((i for i, (a, b) in enumerate(zip(o.tokens, r.tokens, strict=True)) if a != b), None)
        assert i is None or r.margins[i] < 1e-3, (o.tokens, r.tokens)
    assert outs[1].handoff_bytes == -(-50 // 4) * 4 * 4096 and 0 < outs[1].handoff_s < 1
    for role in ("prefill", "decode"):
        assert after[role]["free"] == before[role]["free"] == after[role]["blocks"], role


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("victim", ["decode", "prefill"])
def test_a_killed_ipc_worker_is_named_and_requests_in_flight_get_an_error(victim):
    killed_worker_case(DisaggConfig(**ENGINE, backend="ipc", timeout_s=20), victim, bound_s=10)
