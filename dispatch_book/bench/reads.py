"""How fast one kernel can read N bytes on this GPU: torch's ``sum`` against a streaming Triton read.

    python -m dispatch_book.bench reads [--out results]

:func:`stream_read` is a Triton kernel that does nothing but stream a buffer: a grid of a few
programs per SM, each summing strided blocks through a software-pipelined loop, or one program per
block (``ONE_PER_BLOCK``: short programs that the GPU's scheduler keeps many of in flight). The
``hbm_read`` ceiling (``peaks``) is the fastest of torch's ``x.sum`` and these configurations over
4 GiB, and the decode race times beside each small layer a plain read of the bytes that layer reads
(``peaks.same_bytes_read``: this kernel). This suite times torch's reduction against the best of
:data:`CONFIGS` per size. Sizes: the expert bytes of one token (K experts × 3·H·I·2) of each
preset the race runs, and 1 GB. Timed as the race times its contestants (CUDA graph of 30 calls,
replayed 7 times, median per call); % of the measured ``hbm_read`` ceiling. Rows →
``results/<gpu>/reads.json``.
"""
from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

from dispatch import runtime
from dispatch.config import PRESETS
from dispatch_book import bench

SHAPES = ("olmoe-1b-7b", "qwen3-30b-a3b", "deepseek-moe-16b", "mixtral-8x7b")
ONE_PER_BLOCK = 0  # programs per SM = 0: one program per block, each reading one block and leaving
# (programs per SM, elements a load, warps, pipeline stages): the grid searched at every size
CONFIGS = tuple((m, b, w, s) for m in (2, 4, 8) for b, w in ((2048, 4), (4096, 8)) for s in (1, 3)) + \
    tuple((ONE_PER_BLOCK, b, w, 1) for b, w in ((2048, 4), (4096, 4), (4096, 8)))


def grid_name(programs_per_sm: int) -> str:
    """How a configuration of :data:`CONFIGS` launches: 'one program per block' or 'N programs per SM'."""
    return "one program per block" if programs_per_sm == ONE_PER_BLOCK else f"{programs_per_sm} programs per SM"


@triton.jit
def _stream_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, STAGES: tl.constexpr):
    """Program p sums blocks p, p + G, p + 2G, ... of x in fp32 and writes its partial sum."""
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    start = tl.program_id(0).to(tl.int64) * BLOCK  # 64-bit offsets: the ceiling's buffer holds 2^31 elements
    for i in tl.range(start, n, tl.num_programs(0).to(tl.int64) * BLOCK, num_stages=STAGES):
        offs = i + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
    tl.store(out_ptr + tl.program_id(0), tl.sum(acc, axis=0))


def stream_read(x: torch.Tensor, programs: int, block: int = 2048, warps: int = 4, stages: int = 3) -> torch.Tensor:
    """Read every element of the contiguous ``x`` once → the fp32 partial sums of ``programs`` programs
    (their total is ``x.sum()`` up to rounding). ``programs`` = ``ONE_PER_BLOCK``: one per block."""
    if not isinstance(x, torch.Tensor) or not x.is_contiguous() or not x.is_floating_point():
        raise ValueError(f"x must be a contiguous floating tensor, got {getattr(x, 'dtype', type(x).__name__)}")
    if programs < 0 or block < 16 or block & (block - 1):
        raise ValueError(f"programs must be >= 1 (or ONE_PER_BLOCK = 0) and block a power of two >= 16, "
                         f"got {programs} and {block}")
    programs = programs or max(1, triton.cdiv(x.numel(), block))
    out = torch.empty(programs, dtype=torch.float32, device=x.device)
    _stream_kernel[(programs,)](x.view(-1), out, x.numel(), BLOCK=block, STAGES=stages, num_warps=warps)
    return out


def sizes() -> list[tuple[str, int]]:
    """(what, bytes): one token's expert bytes in bf16 for each preset the race runs, and 1 GB."""
    out = [(f"{s} T=1", PRESETS[s].K * 3 * PRESETS[s].H * PRESETS[s].I * 2) for s in SHAPES]
    return out + [("1 GB", 10 ** 9)]


def measure(dev, read_gbps: float, *, timer=None, log=print) -> list[dict]:
    """Per size: torch's sum and the fastest :func:`stream_read` configuration, µs and % of the ceiling."""
    from dispatch_book.bench.harness import graph_7x30

    timer = timer or (lambda fn: graph_7x30(fn, host=False))
    sms = runtime.num_sms(dev)
    rows = []
    for what, nbytes in sizes():
        row = {"what": what, "bytes": nbytes,
               "contestants": _race(torch.ones(nbytes // 2, dtype=torch.bfloat16, device=dev), sms, timer)}
        for c in row["contestants"].values():
            c["pct_read"] = 100 * nbytes / (c["median_ms"] * 1e-3) / 1e9 / read_gbps
        rows.append(row)
        log(f"{what:22s} {nbytes / 1e6:8.1f} MB " + "  ".join(
            f"{k} {c['median_ms'] * 1e3:7.1f} us {c['pct_read']:5.1f}%" for k, c in row["contestants"].items()))
    return rows


def best_stream(x: torch.Tensor, sms: int, timer) -> dict:
    """The fastest of :data:`CONFIGS` for :func:`stream_read` over x: its timing and its config."""
    best = None
    for m, b, w, s in CONFIGS:
        t = timer(lambda m=m, b=b, w=w, s=s: stream_read(x, m * sms, b, w, s))  # m = 0: one per block
        if best is None or t["median_ms"] < best["median_ms"]:
            best = {**t, "programs_per_sm": m, "block": b, "warps": w, "stages": s}
    return best


def _race(x: torch.Tensor, sms: int, timer) -> dict:
    """torch's sum over x, and the fastest :func:`stream_read` (:func:`best_stream`)."""
    best = best_stream(x, sms, timer)
    return {"torch_sum": timer(lambda: x.sum(dtype=torch.float32)), "triton_stream": best}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m dispatch_book.bench reads", description=__doc__.split("\n\n")[0])
    bench.add_output_args(p)
    a = p.parse_args(argv)
    if not runtime.HAS_CUDA:
        raise SystemExit("the reads benchmark needs a CUDA GPU (the chapters read the recorded results)")
    dev = torch.device("cuda")
    c = bench.ceilings()
    rows = measure(dev, c["hbm_read_gbps"])
    print("wrote", bench.save("reads", rows, out=a.out, allow_dirty=a.allow_dirty,
                              extra={"read_gbps": c["hbm_read_gbps"], "read_source": c["source"],
                                     "timing": "graph_7x30"}))


if __name__ == "__main__":
    main()
