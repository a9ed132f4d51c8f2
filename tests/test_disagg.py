"""Disaggregated serving on CPU: two gloo workers with the shipped model answer every request with
the co-located engine's tokens, return every block on both sides, and a killed worker is named
while the requests in flight get an error, never a hang."""
import os
import signal
import time

import pytest
import torch

from dispatch.serve import EngineConfig, LLMEngine, RequestParams
from dispatch.serve.disagg import DisaggConfig, Disaggregated, WorkerError
from dispatch.serve.handoff import gather, handoff_plan, scatter

ENGINE = dict(block_size=4, max_seqs=8, max_step_tokens=16, num_blocks=96)  # a chunk is 16 tokens


@pytest.fixture(scope="module")
def shipped():
    from dispatch.train import load

    return load("cpu")


@pytest.fixture(scope="module")
def served():
    with Disaggregated(DisaggConfig(**ENGINE, timeout_s=60)) as d:
        yield d


def test_handoff_plan_example_and_a_round_trip():
    assert handoff_plan(10, 4, [3, 9, 4], cached_tokens=4) == [(1, 9), (2, 4)]
    assert handoff_plan(1, 4, [5]) == [(0, 5)]
    with pytest.raises(ValueError, match="need 3 decode blocks"):
        handoff_plan(10, 4, [3, 9])
    with pytest.raises(ValueError, match="whole blocks"):
        handoff_plan(10, 4, [3, 9, 4], cached_tokens=3)
    src = torch.randn(2, 9, 4, 2, 1, 3)  # [L, NB+1, BS, 2, KV, D]
    dst = torch.zeros_like(src)
    payload = gather(src, [7, 2, 5])
    scatter(dst, payload, handoff_plan(10, 4, [3, 0, 4]))
    assert torch.equal(dst[:, [3, 0, 4]], src[:, [7, 2, 5]]) and dst[:, [1, 2, 5, 6, 7, 8]].abs().sum() == 0


def test_every_request_gets_the_co_located_tokens_and_no_block_leaks(served, shipped):
    tok = shipped.tokenizer
    texts = ["def main(", "import os\nimport sys\nimport json\n" * 3, "class Foo:", "x = ["]
    prompts = [[tok("def")["input_ids"][0]]] + [tok(t)["input_ids"] for t in texts]  # one token, > one chunk
    assert len(prompts[0]) == 1 and max(map(len, prompts)) > ENGINE["max_step_tokens"]
    params = [RequestParams(max_tokens=n) for n in (20, 9, 14, 1, 30)]
    params.append(RequestParams(max_tokens=12, temperature=0.8, seed=3))  # the generator travels too
    prompts.append(prompts[1][:7])
    before = served.stats()
    outs = served.generate(prompts, params)
    torch.set_num_threads(1)
    ref = LLMEngine(shipped.model, EngineConfig(**ENGINE)).generate(prompts, params)
    assert [o.tokens for o in outs] == [r.tokens for r in ref]
    assert [o.finish_reason for o in outs] == [r.finish_reason for r in ref]
    assert all(o.error is None and o.ttft_s > 0 for o in outs)
    assert outs[1].handoff_bytes == -(-len(prompts[1]) // 4) * 4 * 4096  # blocks x slots x KV bytes/token
    after = served.stats()
    for role in ("prefill", "decode"):
        assert after[role]["free"] == before[role]["free"] == after[role]["blocks"], role


def test_bad_requests_and_configs_are_refused_clearly(served):
    for prompt, params, msg in [([], RequestParams(), "at least one token"),
                                ([1, 99999], RequestParams(), r"ints in \[0, 4096\)"),
                                ([1] * 120, RequestParams(max_tokens=20), "exceeds the context"),
                                ([1], RequestParams(stop=("x",)), "stop strings")]:
        with pytest.raises(ValueError, match=msg):
            served.submit(prompt, params)
    for bad, msg in [(dict(max_seqs=0), "max_seqs"), (dict(backend="mpi"), "backend"),
                     (dict(timeout_s=0), "timeout_s"), (dict(model=""), "model")]:
        with pytest.raises(ValueError, match=msg):
            DisaggConfig(**bad)


def killed_worker_case(cfg: DisaggConfig, victim: str, bound_s: float | None = None) -> None:
    """Kill ``victim`` mid-decode: every request in flight ends with an error naming it (within
    ``bound_s`` when given) and the next submit is refused; shared by every backend's test."""
    d = Disaggregated(cfg)
    try:
        ids = [d.submit(list(range(1 + i, 9 + i)), RequestParams(max_tokens=110, ignore_eos=True)) for i in range(4)]
        end = time.monotonic() + 30
        while not d.requests[ids[0]].tokens and time.monotonic() < end:
            d.poll(0.01)
        os.kill(d.pid(victim), signal.SIGKILL)
        t0 = time.monotonic()
        d.wait(ids)
        if bound_s is not None:
            assert time.monotonic() - t0 < bound_s
        assert all(d.requests[i].finish_reason == "error" for i in ids)
        assert f"the {victim} worker was killed by signal SIGKILL" in d.requests[ids[-1]].error
        with pytest.raises(WorkerError, match=f"{victim} worker was killed"):
            d.submit([1, 2], RequestParams())
    finally:
        d.close()


@pytest.mark.parametrize("victim", ["decode", "prefill"])
def test_a_killed_worker_is_named_and_requests_in_flight_get_an_error(victim):
    killed_worker_case(DisaggConfig(**ENGINE, timeout_s=20), victim, bound_s=10)


def test_a_worker_that_cannot_start_is_named_with_its_cause():
    with pytest.raises(WorkerError, match=r"the (prefill|decode) worker raised .*no-such-checkpoint"):
        Disaggregated(DisaggConfig(model="no-such-checkpoint", start_timeout_s=60))


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs (the KV blocks go over NCCL)")
def test_nccl_pair_on_two_gpus_answers_as_the_co_located_engine():
    """Prefill on cuda:0, decode on cuda:1, fp32: the co-located engine's tokens (a difference only at
    a near tie of its logits), every block back, the handoff's bytes as the blocks say."""
    from dispatch.train import load

    prompts = [[5], list(range(10, 60)), list(range(100, 107)), list(range(100, 104)) + [7, 8]]
    params = [RequestParams(max_tokens=n, ignore_eos=True) for n in (20, 9, 14, 30)]
    with Disaggregated(DisaggConfig(**ENGINE, dtype="float32", timeout_s=120)) as d:
        assert d.backend == "nccl" and d.info["decode"]["device"] == "cuda:1"
        before, outs, after = d.stats(), d.generate(prompts, params), d.stats()
    model = load("cpu", device="cuda", dtype="float32").model
    ref = LLMEngine(model, EngineConfig(**ENGINE), record_margins=True).generate(prompts, params)
    for o, r in zip(outs, ref, strict=True):
        i = next((i for i, (a, b) in enumerate(zip(o.tokens, r.tokens, strict=True)) if a != b), None)
        assert i is None or r.margins[i] < 1e-3, (o.tokens, r.tokens)
    assert outs[1].handoff_bytes == -(-50 // 4) * 4 * 4096 and outs[1].handoff_s > 0
    for role in ("prefill", "decode"):
        assert after[role]["free"] == before[role]["free"] == after[role]["blocks"], role
