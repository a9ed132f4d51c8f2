"""The decode step's dense kernels, one at a time: our GEMV and decode attention against cuBLAS / SDPA.

    python -m dispatch_book.bench step_kernels --out DIR

At OLMoE-1B-7B's shapes (QKV [6144, 2048], O [2048, 2048], lm_head [50304, 2048]; 16 heads of 128),
bf16 (fp16 below sm_80), each call captured in a CUDA graph and its replays timed with the L2 cache
flushed in between (``harness.time_ms(graph=True)``: the weights come from HBM, as in a decode step,
where 16 layers' weights never fit in L2). Projections: ``F.linear`` (cuBLAS) against
:func:`dispatch.kernels.dense_gemv.linear_small` with its heuristic tiles and with each candidate of
``DENSE_CONFIGS``, at 1 and 8 rows; GB/s count W, x and y once. Batch-invariant mode's projections
(``invariant=True``) with its rule's config and each candidate, at 1 and 64 rows. Attention: SDPA with the boolean
mask the engine used (key position ≤ row position over the whole static cache) against
:func:`dispatch.kernels.attention.decode_attention`, at batch 1 and 64 over caches of 256 and 2048
positions, every row at the cache's last position. Each of ours is checked against its baseline
(relative error ≤ 1e-2) before it is timed.
"""
from __future__ import annotations

import argparse
from dataclasses import replace

import torch
import torch.nn.functional as F

from dispatch import runtime
from dispatch_book import bench

PROJECTIONS = {"qkv": (6144, 2048), "o": (2048, 2048), "lm_head": (50304, 2048)}
ROWS = (1, 8)
INVARIANT_ROWS = (1, 64)  # batch-invariant mode: a verify step of one row, a batch of 64
HEADS, HEAD_DIM = 16, 128
ATTENTION = [(B, S) for B in (1, 64) for S in (256, 2048)]
TOLERANCE = 1e-2


def _row(kind: str, shape: str, what: str, fn, ref, nbytes: int) -> dict:
    row = {"kind": kind, "shape": shape, "contestant": what, "rel_err": bench.rel_err(fn(), ref)}
    if not row["rel_err"] <= TOLERANCE:
        row["error"] = f"rel err {row['rel_err']:.2e} above {TOLERANCE}: not timed"
        return row
    row.update(bench.time_ms(fn, graph=True))
    row["bytes"] = nbytes
    row["gbps"] = nbytes / (row["median_ms"] * 1e-3) / 1e9
    return row


def _cases(dev, dt, Ms, seed: int):
    """(shape label, x, w, F.linear's result, bytes read and written) per projection and row count."""
    g = torch.Generator(device=dev).manual_seed(seed)
    for name, (N, K) in PROJECTIONS.items():
        w = (torch.randn(N, K, device=dev, generator=g) / K**0.5).to(dt)
        for M in Ms:
            x = torch.randn(M, K, device=dev, generator=g).to(dt)
            yield f"{name} [{N}, {K}] M={M}", x, w, F.linear(x, w), (N * K + M * K + M * N) * dt.itemsize


def _candidate(kind: str, shape: str, what: str, fn, ref, nbytes: int, config) -> dict:
    """:func:`_row` of a candidate config; one that does not fit this GPU is a row with its error."""
    try:
        r = _row(kind, shape, what, fn, ref, nbytes)
    except Exception as e:  # noqa: BLE001 - recorded, never a number
        r = {"kind": kind, "shape": shape, "contestant": what, "error": f"{type(e).__name__}: {str(e)[:120]}"}
    return r | {"config": str(config)}


def projections(dev, dt) -> list[dict]:
    from dispatch.kernels.dense_gemv import DENSE_CONFIGS, heuristic_dense, linear_small

    rows = []
    for shape, x, w, ref, nbytes in _cases(dev, dt, ROWS, seed=0):
        M, K = x.shape
        rows.append(_row("projection", shape, "cublas", lambda x=x, w=w: F.linear(x, w), ref, nbytes))
        heur = heuristic_dense(M, w.shape[0], K, dev, dt.itemsize)
        rows.append(_row("projection", shape, "ours", lambda x=x, w=w: linear_small(x, w), ref, nbytes) | {
            "config": str(heur)})
        for c in DENSE_CONFIGS:
            rows.append(_candidate("projection", shape, "ours_config",
                                   lambda c=c, x=x, w=w: linear_small(x, w, config=c), ref, nbytes, c))
        for r in rows[-len(DENSE_CONFIGS) - 2:]:
            print(f"{shape:28s} {r['contestant']:12s} {r.get('median_ms', float('nan')) * 1e3:8.1f} us "
                  f"{r.get('gbps', float('nan')):6.0f} GB/s {r.get('config', '')}", flush=True)
    return rows


def invariant_projections(dev, dt) -> list[dict]:
    """Batch-invariant mode's projections (``linear_small(invariant=True)``: 16-row tl.dot tiles, one
    config per weight): its rule's config and each candidate of ``DENSE_CONFIGS``, at 1 row (against
    the default's one-row kernel) and 64 (against cuBLAS). Any candidate kept for every M is as
    invariant as the rule's, so the fastest at both row counts can replace it."""
    from dispatch.kernels.dense_gemv import DENSE_CONFIGS, invariant_dense, linear_small

    rows = []
    for shape, x, w, ref, nbytes in _cases(dev, dt, INVARIANT_ROWS, seed=2):
        base = ("ours", lambda x=x, w=w: linear_small(x, w)) if x.shape[0] == 1 else \
            ("cublas", lambda x=x, w=w: F.linear(x, w))
        rows.append(_row("invariant_projection", shape, *base, ref, nbytes))
        rows.append(_row("invariant_projection", shape, "invariant",
                         lambda x=x, w=w: linear_small(x, w, invariant=True), ref, nbytes)
                    | {"config": str(invariant_dense(*w.shape, dev, dt.itemsize))})
        for c in dict.fromkeys(replace(c, block_n=max(16, c.block_n)) for c in DENSE_CONFIGS):  # tl.dot: 16+ rows
            rows.append(_candidate("invariant_projection", shape, "invariant_config",
                                   lambda c=c, x=x, w=w: linear_small(x, w, config=c, invariant=True), ref, nbytes, c))
        best = min((r for r in rows if r["shape"] == shape and "median_ms" in r), key=lambda r: r["median_ms"])
        print(f"{shape:28s} fastest: {best['contestant']} {best['median_ms'] * 1e3:.1f} us "
              f"{best.get('config', '')}", flush=True)
    return rows


def attention(dev, dt) -> list[dict]:
    from dispatch.kernels.attention import decode_attention

    g = torch.Generator(device=dev).manual_seed(1)
    rows = []
    for B, S in ATTENTION:
        q = torch.randn(B, HEADS, HEAD_DIM, device=dev, generator=g).to(dt)
        k = torch.randn(B, S, HEADS, HEAD_DIM, device=dev, generator=g).to(dt)
        v = torch.randn(B, S, HEADS, HEAD_DIM, device=dev, generator=g).to(dt)
        pos = torch.full((B,), S - 1, device=dev, dtype=torch.long)
        keys = torch.arange(S, device=dev)

        def sdpa(q=q, k=k, v=v, pos=pos, keys=keys):
            mask = (keys[None, :] <= pos[:, None])[:, None, None, :]
            o = F.scaled_dot_product_attention(q[:, :, None], k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask)
            return o[:, :, 0]

        ref = sdpa()
        nbytes = (2 * B * S * HEADS * HEAD_DIM + 2 * B * HEADS * HEAD_DIM) * dt.itemsize
        shape = f"B={B} S={S}"
        for what, fn in (("sdpa", sdpa), ("ours", lambda q=q, k=k, v=v, pos=pos: decode_attention(q, k, v, pos))):
            rows.append(_row("attention", shape, what, fn, ref, nbytes))
            r = rows[-1]
            print(f"attention {shape:14s} {what:6s} {r.get('median_ms', float('nan')) * 1e3:8.1f} us "
                  f"{r.get('gbps', float('nan')):6.0f} GB/s", flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(prog="python -m dispatch_book.bench step_kernels").parse_args(argv)
    if not runtime.HAS_CUDA:
        raise SystemExit("the step-kernels benchmark times CUDA graphs: it needs a CUDA GPU")
    dev, dt = torch.device("cuda"), runtime.compute_dtype()
    with torch.no_grad():
        rows = projections(dev, dt) + invariant_projections(dev, dt) + attention(dev, dt)
    print("wrote", bench.save("step_kernels", rows, extra={"dtype": str(dt), "tolerance_rel": TOLERANCE,
                                                           "timing": "CUDA graph replay, L2 flushed between calls"}))
