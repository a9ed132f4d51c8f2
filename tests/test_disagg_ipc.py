"""The CUDA IPC handoff (two workers on one GPU): its ring's bookkeeping on a CPU stand-in (in-process
queues, CPU tensors), the backend's checks before any process starts, and on a GPU the shipped
model's tokens, every block back and a killed worker named."""
import multiprocessing as mp
import os
import queue
import signal
import time

import pytest
import torch

from dispatch.serve import EngineConfig, LLMEngine, RequestParams
from dispatch.serve.disagg import DisaggConfig, Disaggregated, WorkerError
from dispatch.serve.handoff import HandoffMeta
from dispatch.serve.handoff_ipc import IpcMover, LinkTimeout, make_ring

ENGINE = dict(block_size=4, max_seqs=8, max_step_tokens=16, num_blocks=96)
POOL = (2, 9, 4, 2, 1, 3)  # [L, NB+1, BS, 2, KV, D]


def _meta(rid: int, nb: int) -> HandoffMeta:
    return HandoffMeta(rid, (1,), 2, {}, nb)


def _pair(slots: int, timeout_s: float = 5.0):
    """A sender and a receiver over in-process queues; the receiver's landed (meta, tensor, seconds)."""
    link, landed = (queue.Queue(), queue.Queue()), queue.Queue()
    ring = make_ring(torch.zeros(POOL), slots, max_blocks=4)
    tx = IpcMover(link, send=True, on_done=lambda *_: None, timeout_s=timeout_s, ring=ring)
    rx = IpcMover(link, send=False, on_done=lambda *a: landed.put(a), timeout_s=timeout_s)
    return tx, rx, link, landed


def _drained(q):
    while True:
        try:
            yield q.get_nowait()
        except queue.Empty:
            return


def _wait(cond, s=5.0):
    end = time.monotonic() + s
    while not cond() and time.monotonic() < end:
        time.sleep(0.005)
    return cond()


def test_ring_shape_and_config_checks():
    assert make_ring(torch.zeros(POOL), 3, 5).shape == (3, 2, 5, 4, 2, 1, 3)
    with pytest.raises(ValueError, match="positive"):
        make_ring(torch.zeros(POOL), 0, 5)
    assert DisaggConfig(backend="ipc").resolved_backend == "ipc"
    with pytest.raises(ValueError, match="'auto', 'gloo', 'nccl', 'ipc'"):
        DisaggConfig(backend="cuda-ipc")
    with pytest.raises(ValueError, match="passes its ring"):
        IpcMover((queue.Queue(), queue.Queue()), send=True, on_done=None, timeout_s=1.0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_ipc_without_a_gpu_is_refused_before_any_process_starts():
    before = set(mp.active_children())
    t0 = time.monotonic()
    with pytest.raises(ValueError, match="ipc .* needs a CUDA GPU, found none"):
        Disaggregated(DisaggConfig(backend="ipc"))
    assert time.monotonic() - t0 < 1 and set(mp.active_children()) == before


def test_payloads_land_in_order_through_a_ring_of_two_slots_reused():
    tx, rx, link, landed = _pair(slots=2)
    sizes = [3, 1, 4, 2, 4]
    payloads = [torch.randn(2, nb, *POOL[2:]) for nb in sizes]
    for rid, p in enumerate(payloads):  # the decode side's staging tensors are announced in the same order
        rx.put(_meta(rid, p.shape[1]), torch.empty_like(p))
        tx.put(_meta(rid, p.shape[1]), p)
    got = [landed.get(timeout=5) for _ in payloads]
    assert [m.rid for m, _, _ in got] == list(range(len(sizes)))
    assert all(torch.equal(t, p) for (_, t, _), p in zip(got, payloads, strict=True))
    assert all(s >= 0 for _, _, s in got)
    assert _wait(lambda: tx.busy == rx.busy == 0) and tx.error is rx.error is None
    assert sorted([*tx.free, *_drained(link[1])]) == [0, 1]  # every slot back: five payloads through two
    tx.stop(), rx.stop()


def test_the_sender_waits_for_a_slot_and_times_out_when_none_comes_back():
    tx, rx, link, landed = _pair(slots=1, timeout_s=0.3)
    rx.stop()  # a decode side that takes nothing: the one slot never comes back
    tx.put(_meta(0, 2), torch.randn(2, 2, *POOL[2:]))
    tx.put(_meta(1, 2), torch.randn(2, 2, *POOL[2:]))
    assert _wait(lambda: tx.error is not None)
    assert isinstance(tx.error, LinkTimeout) and "no slot handed back from the decode worker" in str(tx.error)
    kinds = [m[0] for m in _drained(link[0])]
    assert kinds == ["ring", "kv"]  # the second payload never went out


def test_the_receiver_names_a_handoff_out_of_order_and_a_silent_link():
    tx, rx, _, _ = _pair(slots=2)
    rx.put(_meta(7, 1), torch.empty(2, 1, *POOL[2:]))
    tx.put(_meta(8, 1), torch.randn(2, 1, *POOL[2:]))
    assert _wait(lambda: rx.error is not None)
    assert "expected request 7's 1 blocks, got 'kv' 8's 1" in str(rx.error)
    tx.stop()
    lone = IpcMover((queue.Queue(), queue.Queue()), send=False, on_done=None, timeout_s=0.2)
    lone.put(_meta(0, 1), torch.empty(2, 1, *POOL[2:]))
    assert _wait(lambda: lone.error is not None)
    assert isinstance(lone.error, LinkTimeout) and "no staging ring from the prefill worker" in str(lone.error)


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
        before, outs, after = d.stats(), d.generate(prompts, params), d.stats()
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
    d = Disaggregated(DisaggConfig(**ENGINE, backend="ipc", timeout_s=20))
    try:
        ids = [d.submit(list(range(1 + i, 9 + i)), RequestParams(max_tokens=110, ignore_eos=True)) for i in range(4)]
        end = time.monotonic() + 30
        while not d.requests[ids[0]].tokens and time.monotonic() < end:
            d.poll(0.01)
        os.kill(d.pid(victim), signal.SIGKILL)
        t0 = time.monotonic()
        d.wait(ids)
        assert time.monotonic() - t0 < 10
        assert all(d.requests[i].finish_reason == "error" for i in ids)
        assert f"the {victim} worker was killed by signal SIGKILL" in d.requests[ids[-1]].error
        with pytest.raises(WorkerError, match=f"{victim} worker was killed"):
            d.submit([1, 2], RequestParams())
    finally:
        d.close()
