"""The reads suite (a streaming Triton read beside torch's sum): the kernel reads every element once,
under the interpreter on CPU; the suite times each size's contestants and keeps the fastest read."""
import pytest
import torch

import dispatch  # noqa: F401  (first: runtime decisions)
from dispatch_book.bench import reads


@pytest.mark.parametrize("n,programs,block", [(1, 1, 16), (1000, 3, 64), (4096, 4, 256), (5000, 7, 128)])
def test_stream_read_sums_every_element_once(n, programs, block):
    x = torch.arange(n, dtype=torch.float32).to(torch.float16) / 64  # exact in fp16 and in an fp32 sum
    parts = reads.stream_read(x, programs, block, warps=1, stages=1)
    assert parts.shape == (programs,)
    assert parts.sum().item() == x.double().sum().item()


def test_stream_read_refuses_what_it_cannot_read():
    with pytest.raises(ValueError, match="contiguous floating"):
        reads.stream_read(torch.zeros(8, 8)[:, ::2], 2)
    with pytest.raises(ValueError, match="contiguous floating"):
        reads.stream_read(torch.zeros(8, dtype=torch.int32), 2)
    with pytest.raises(ValueError, match="power of two"):
        reads.stream_read(torch.zeros(8), 2, block=100)


def test_measure_keeps_the_fastest_read(monkeypatch):
    monkeypatch.setattr(reads, "sizes", lambda: [("tiny", 4096)])
    monkeypatch.setattr(reads.runtime, "num_sms", lambda dev: 2)
    calls = []

    def timer(fn):  # a fake clock: the i-th configuration takes 10 - i ms (the last is fastest)
        fn()
        calls.append(len(calls))
        return {"median_ms": 10.0 - calls[-1] * 0.1, "samples": 1}

    rows = reads.measure(torch.device("cpu"), 1.0, timer=timer, log=lambda *_: None)
    best = rows[0]["contestants"]["triton_stream"]
    assert len(calls) == len(reads.CONFIGS) + 1  # every configuration, then torch's sum
    assert (best["programs_per_sm"], best["block"], best["warps"], best["stages"]) == reads.CONFIGS[-1]
    assert rows[0]["contestants"]["torch_sum"]["median_ms"] == pytest.approx(10.0 - len(reads.CONFIGS) * 0.1)
    assert best["pct_read"] == pytest.approx(100 * 4096 / (best["median_ms"] * 1e-3) / 1e9)
