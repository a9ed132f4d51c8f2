"""The denominators of every "% of peak": measured HBM copy bandwidth and bf16 matmul rate.

``python -m dispatch_book.bench ceilings`` on a GPU writes ``results/<gpu>/ceilings.json``. Copy
bandwidth counts bytes read + written (a device-to-device copy of ``2 GiB``); the matmul rate is a
square bf16 (fp16 below sm_80) product through torch, on random data.
"""
from __future__ import annotations

import argparse

import torch

from dispatch import runtime
from dispatch_book import bench


def measure(copy_bytes: int = 2 << 30, n: int = 8192) -> list[dict]:
    if not runtime.HAS_CUDA:
        raise SystemExit("ceilings are measured on a CUDA GPU")
    dt = runtime.compute_dtype()
    src = torch.empty(copy_bytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    t = bench.time_ms(lambda: dst.copy_(src))
    rows = [{"ceiling": "hbm_copy", "bytes": 2 * copy_bytes, **t,
             "GBps": 2 * copy_bytes / (t["median_ms"] * 1e-3) / 1e9}]
    del src, dst
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(n, n, device="cuda", dtype=dt, generator=g)
    b = torch.randn(n, n, device="cuda", dtype=dt, generator=g)
    t = bench.time_ms(lambda: a @ b)
    rows.append({"ceiling": f"{str(dt).removeprefix('torch.')}_matmul", "n": n, **t,
                 "TFLOPs": 2 * n ** 3 / (t["median_ms"] * 1e-3) / 1e12})
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m dispatch_book.bench ceilings")
    ap.parse_args(argv)
    rows = measure()
    for r in rows:
        print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()})
    print("wrote", bench.save("ceilings", rows))


if __name__ == "__main__":
    main()
