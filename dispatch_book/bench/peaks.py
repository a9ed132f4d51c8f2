"""The denominators of every "% of peak": HBM bandwidth and the dense matmul rate of a GPU.

``ceilings(gpu)`` gives them for the GPU the code runs on (or the one named): measured where
``results/<gpu>/ceilings.json`` exists, else from the vendor's datasheet (the table below, each
entry with its source). ``python -m dispatch_book.bench ceilings --out results`` measures them on
the GPU at hand:

* ``hbm_copy``: a device-to-device copy of 2 GiB; its GB/s count the bytes read *and* written, so
  it is a copy rate, not a read rate;
* ``hbm_read``: a read-only stream over a 4 GiB bf16 buffer, the fastest of torch's
  ``x.sum(dtype=torch.float32)`` and the streaming Triton read of :mod:`dispatch_book.bench.reads`
  in each of its launch configurations — the ceiling of a decode step, which reads weights and
  writes almost nothing (torch's sum is kept beside it as ``hbm_read_torch_sum``: on an H200 it
  reads about 7% slower, so as a ceiling it would flatter every "% of read bandwidth");
* ``<dtype>_matmul``: a square 8192³ product through torch on random data, in the runtime's
  dtype (bf16 on sm_80+, fp16 below).
"""
from __future__ import annotations

import argparse
import re

import torch

from dispatch import runtime
from dispatch_book.bench import harness, results

# Datasheet peaks: (slug pattern, HBM GB/s, dense bf16 TFLOP/s — fp16 on a T4, which has no bf16,
# source). Dense means without the 2:4 sparsity factor some datasheets quote.
_H200 = "NVIDIA H200 Tensor Core GPU datasheet (2024): 4.8 TB/s HBM3e"
_H100 = "NVIDIA H100 Tensor Core GPU datasheet (2023)"
_A100 = "NVIDIA A100 Tensor Core GPU datasheet (2021)"
DATASHEET = (
    (r"h200-nvl", 4800.0, 835.0, _H200 + ", 835 TFLOP/s dense BF16 (H200 NVL)"),
    (r"h200", 4800.0, 989.0, _H200 + ", 989 TFLOP/s dense BF16 (H200 SXM)"),
    (r"h100-nvl", 3900.0, 835.0, _H100 + ": 3.9 TB/s HBM3, 835 TFLOP/s dense BF16 (H100 NVL)"),
    (r"h100-pcie", 2000.0, 756.0, _H100 + ": 2.0 TB/s HBM2e, 756 TFLOP/s dense BF16 (H100 PCIe)"),
    (r"h100", 3350.0, 989.0, _H100 + ": 3.35 TB/s HBM3, 989 TFLOP/s dense BF16 (H100 SXM)"),
    (r"a100-(80gb-pcie|pcie-80gb)", 1935.0, 312.0, _A100 + ": 1.9 TB/s HBM2e, 312 TFLOP/s BF16 (A100 80GB PCIe)"),
    (r"a100.*80gb", 2039.0, 312.0, _A100 + ": 2.0 TB/s HBM2e, 312 TFLOP/s BF16 (A100 80GB SXM)"),
    (r"a100", 1555.0, 312.0, _A100 + ": 1.6 TB/s HBM2, 312 TFLOP/s BF16 (A100 40GB)"),
    (r"(^|-)t4($|-)", 320.0, 65.0, "NVIDIA T4 Tensor Core GPU datasheet (2019): 320 GB/s GDDR6, "
                                   "65 TFLOP/s FP16 tensor cores (no BF16 on a T4)"),
)
KEYS = ("hbm_copy_gbps", "hbm_read_gbps", "bf16_tflops")


def datasheet(gpu: str) -> dict | None:
    """The datasheet entry of a GPU (a name or slug), or None when the table has none."""
    slug = results.gpu_slug(gpu)
    for pattern, gbps, tflops, source in DATASHEET:
        if re.search(pattern, slug):
            return {"hbm_copy_gbps": gbps, "hbm_read_gbps": gbps, "bf16_tflops": tflops, "source": source}
    return None


def _measured(doc: dict) -> dict:
    rows = {r["ceiling"]: r for r in doc["rows"]}
    out = {}
    if "hbm_copy" in rows:
        out["hbm_copy_gbps"] = rows["hbm_copy"]["GBps"]
    if "hbm_read" in rows:
        out["hbm_read_gbps"] = rows["hbm_read"]["GBps"]
    mm = [r for name, r in rows.items() if name.endswith("_matmul")]
    if mm:
        out["bf16_tflops"] = mm[0]["TFLOPs"]
    return out


def ceilings(gpu: str | None = None) -> dict:
    """``{hbm_copy_gbps, hbm_read_gbps, bf16_tflops, source}`` for ``gpu`` (a name or slug such as
    ``"h200"``; the current CUDA device when None). Measured values (``results/<gpu>/ceilings.json``)
    win over the datasheet; ``source`` says which is which."""
    if gpu is None:
        if not torch.cuda.is_available():
            raise ValueError("no CUDA device here: name the GPU whose ceilings you want, e.g. ceilings('h200')")
        gpu = torch.cuda.get_device_name()
    slug = results.gpu_slug(gpu)
    sheet = datasheet(slug)
    doc = results.load("ceilings", slug)
    measured = _measured(doc) if doc else {}
    if sheet is None and not measured:
        known = ", ".join(p for p, *_ in DATASHEET)
        raise ValueError(f"no measured ceilings and no datasheet entry for GPU {gpu!r} (slug {slug!r}); "
                         f"measure them with `python -m dispatch_book.bench ceilings --out results` "
                         f"(datasheet entries: {known})")
    out = {k: measured.get(k, sheet[k] if sheet else None) for k in KEYS}
    parts = []
    if measured:
        parts.append(f"{', '.join(k for k in KEYS if k in measured)} measured: {results.provenance(doc).rstrip('.')}")
    rest = [k for k in KEYS if k not in measured]
    if rest and sheet:
        parts.append(f"{', '.join(rest)} from the {sheet['source']}")
    out["source"] = "; ".join(parts)
    return out


def measure(copy_bytes: int = 2 << 30, read_bytes: int = 4 << 30, n: int = 8192) -> list[dict]:
    """The three ceilings of the current GPU, as results rows, then torch's sum's read beside them."""
    if not torch.cuda.is_available():
        raise SystemExit("ceilings are measured on a CUDA GPU")
    read, torch_sum = read_rows(read_bytes)
    return [_copy(copy_bytes), read, _matmul(n), torch_sum]


def _copy(nbytes: int) -> dict:
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    t = harness.time_ms(lambda: dst.copy_(src))
    return {"ceiling": "hbm_copy", "what": "device-to-device copy; bytes counts read + written",
            "bytes": 2 * nbytes, **t, "GBps": 2 * nbytes / (t["median_ms"] * 1e-3) / 1e9}


def read_rows(nbytes: int) -> tuple[dict, dict]:
    """(the ``hbm_read`` row: the fastest read of a bf16 buffer of ``nbytes``, torch's sum's row)."""
    from dispatch_book.bench import reads

    x = torch.ones(nbytes // 2, dtype=torch.bfloat16, device="cuda")
    t_sum = harness.time_ms(lambda: x.sum(dtype=torch.float32))
    best = reads.best_stream(x, runtime.num_sms(x.device), harness.time_ms)
    gbps = lambda t: nbytes / (t["median_ms"] * 1e-3) / 1e9  # noqa: E731
    torch_sum = {"ceiling": "hbm_read_torch_sum", "what": "x.sum(dtype=torch.float32) over a bf16 buffer; "
                 "bytes read", "bytes": nbytes, **t_sum, "GBps": gbps(t_sum)}
    if t_sum["median_ms"] <= best["median_ms"]:
        return {**torch_sum, "ceiling": "hbm_read"}, torch_sum
    grid = reads.grid_name(best["programs_per_sm"])
    return {"ceiling": "hbm_read", "what": f"a streaming Triton read (reads.stream_read: {grid}, {best['block']} "
            f"elements a load, {best['warps']} warps, {best['stages']} stages; the fastest of torch's sum and "
            f"{len(reads.CONFIGS)} configurations) over a bf16 buffer; bytes read", "bytes": nbytes,
            **{k: best[k] for k in ("median_ms", "min_ms", "max_ms", "samples")}, "GBps": gbps(best)}, torch_sum


def same_bytes_read(nbytes: int, device):
    """A plain read of ``nbytes`` (the streaming Triton read of :mod:`~dispatch_book.bench.reads`, one
    program per 4096-element block of one contiguous bf16 buffer: on an H200 the fastest read from
    50 MB to 4 GiB, within 1%) as a function to time beside a kernel that reads that many bytes: what
    streaming alone costs at this size, its start and drain included, where the ceiling is measured
    on 4 GiB."""
    from dispatch_book.bench import reads

    x = torch.zeros(max(1, nbytes // 2), dtype=torch.bfloat16, device=device)
    return lambda: reads.stream_read(x, reads.ONE_PER_BLOCK, 4096, warps=4, stages=1)


def _matmul(n: int) -> dict:
    dt = runtime.compute_dtype()
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(n, n, device="cuda", dtype=dt, generator=g)
    b = torch.randn(n, n, device="cuda", dtype=dt, generator=g)
    t = harness.time_ms(lambda: a @ b)
    return {"ceiling": f"{str(dt).removeprefix('torch.')}_matmul", "what": f"{n}^3 matmul through torch",
            "n": n, **t, "TFLOPs": 2 * n ** 3 / (t["median_ms"] * 1e-3) / 1e12}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m dispatch_book.bench ceilings", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    results.add_output_args(ap)
    a = ap.parse_args(argv)
    rows = measure()
    for r in rows:
        print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()})
    print("wrote", results.save("ceilings", rows, out=a.out, allow_dirty=a.allow_dirty))
