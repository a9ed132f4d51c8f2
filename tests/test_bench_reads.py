"""The reads suite (a streaming Triton read beside torch's sum): the kernel reads every element once,
under the interpreter on CPU; the suite times each size's contestants and keeps the fastest read."""
import pytest
import torch

import dispatch  # noqa: F401  (first: runtime decisions)
from dispatch_book.bench import reads


@pytest.mark.parametrize("n,programs,block", [(1, 1, 16), (1000, 3, 64), (4096, 4, 256), (5000, 7, 128),
                                              (1, 0, 16), (1000, 0, 64), (4096, 0, 256), (5000, 0, 1024)])
def test_stream_read_sums_every_element_once(n, programs, block):
    """A grid of ``programs`` strided readers, or (0 = ONE_PER_BLOCK) one program per block."""
    x = torch.arange(n, dtype=torch.float32).to(torch.float16) / 64  # exact in fp16 and in an fp32 sum
    parts = reads.stream_read(x, programs, block, warps=1, stages=1)
    assert parts.shape == (programs or -(-n // block),)
    assert parts.sum().item() == x.double().sum().item()


def test_same_bytes_read_streams_the_bytes_it_is_given():
    """The race's plain read (``peaks.same_bytes_read``) is the one-program-per-block stream over
    a buffer of that many bytes: one partial sum per 4096 elements."""
    from dispatch_book.bench import peaks

    parts = peaks.same_bytes_read(3 * 8192 + 10, torch.device("cpu"))()
    assert parts.shape == (4,) and parts.sum().item() == 0.0  # ceil((3·8192 + 10) / 2 / 4096) blocks of zeros


def test_stream_read_refuses_what_it_cannot_read():
    with pytest.raises(ValueError, match="contiguous floating"):
        reads.stream_read(torch.zeros(8, 8)[:, ::2], 2)
    with pytest.raises(ValueError, match="contiguous floating"):
        reads.stream_read(torch.zeros(8, dtype=torch.int32), 2)
    with pytest.raises(ValueError, match="power of two"):
        reads.stream_read(torch.zeros(8), 2, block=100)
    with pytest.raises(ValueError, match="ONE_PER_BLOCK"):
        reads.stream_read(torch.zeros(8), -1)


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


def test_read_ceiling_is_the_fastest_read(monkeypatch):
    """``hbm_read`` is the faster of torch's sum and the best stream configuration; torch's sum
    is kept beside it as its own row (fake clocks, CPU tensors)."""
    from dispatch_book.bench import peaks

    monkeypatch.setattr(peaks.torch, "ones", lambda n, **kw: torch.zeros(n, dtype=torch.float16))
    monkeypatch.setattr(peaks.runtime, "num_sms", lambda dev: 2)
    for sum_ms, stream_ms, winner in ((2.0, 1.0, "a streaming Triton read"), (0.5, 1.0, "x.sum")):
        def timer(fn, sum_ms=sum_ms, stream_ms=stream_ms):
            out = fn()
            ms = sum_ms if out.dim() == 0 else stream_ms  # torch's sum returns a scalar, the stream partials
            return {"median_ms": ms, "min_ms": ms, "max_ms": ms, "samples": 1}

        monkeypatch.setattr(peaks.harness, "time_ms", timer)
        read, torch_sum = peaks.read_rows(1 << 14)
        assert read["ceiling"] == "hbm_read" and read["what"].startswith(winner), read
        assert read["GBps"] == pytest.approx((1 << 14) / (min(sum_ms, stream_ms) * 1e-3) / 1e9)
        assert torch_sum["ceiling"] == "hbm_read_torch_sum"
        assert torch_sum["GBps"] == pytest.approx((1 << 14) / (sum_ms * 1e-3) / 1e9)
