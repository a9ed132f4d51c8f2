"""Where one token's decode time goes: the decode path's launches, timed as they add up.

    python -m dispatch_book.bench chain [--out results]

A decode step (:func:`dispatch.kernels.gemv.moe_decode`) is three launches: up+SwiGLU, down ×
weight, the k-order combine. For each preset the race runs, at 1 and 4 tokens, with the tile
table's tiles and the tuner's inputs (bf16, :func:`dispatch.tune.search.make_case`: seeded random
weights, softmax top-K of ``randn`` logits), this suite times three prefixes of the chain: the up
kernel alone (the down launch skipped, :func:`up_only`), up then down
(:func:`dispatch.kernels.gemv.decode_rows`), and the whole path. The difference of two prefixes is
what a launch adds *inside* the chain: the up kernel's pass evicts most of down's weights from L2
as in a real step, where down timed on its own would partly read them from L2. Beside them, a
streaming read (:func:`dispatch_book.bench.reads.best_stream`) of the up kernel's bytes and of all
the bytes. Each timed as the race times its contestants (CUDA graph of 30 calls, replayed 7 times,
median per call); % of the measured ``hbm_read`` ceiling. Rows → ``results/<gpu>/decode_chain.json``.
"""
from __future__ import annotations

import argparse
import contextlib

import torch

from dispatch import runtime
from dispatch.kernels import gemv, tiles
from dispatch.tune.search import make_case
from dispatch_book import bench
from dispatch_book.bench import reads

SHAPES = reads.SHAPES
TOKENS = (1, 4)


class _NoLaunch:
    """Stands in for a kernel: ``kernel[grid](...)`` launches nothing."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


@contextlib.contextmanager
def up_only():
    """Inside this block :func:`dispatch.kernels.gemv.decode_rows` launches its up kernel only."""
    down, gemv._down_kernel = gemv._down_kernel, _NoLaunch()
    try:
        yield
    finally:
        gemv._down_kernel = down


def stages(w, x_TH, weights_TK, ids_TK) -> dict:
    """The chain's prefixes, each a no-argument call: up, up + down, the whole path."""
    args = (x_TH, weights_TK, ids_TK, w.gate_up_E2IH, w.down_EHI)
    T, K, E, H, I = x_TH.shape[0], ids_TK.shape[1], w.gate_up_E2IH.shape[0], x_TH.shape[1], w.down_EHI.shape[2]
    cfg = tiles.decode_config(T, K, E, H, I, x_TH.dtype, x_TH.device)

    def up():
        with up_only():
            return gemv.decode_rows(*args, cfg)

    return {"up": up, "up_down": lambda: gemv.decode_rows(*args, cfg),
            "whole": lambda: gemv.moe_decode(*args, config=cfg)}


def measure(dev, read_gbps: float, *, shapes=SHAPES, tokens=TOKENS, dtype=torch.bfloat16, timer=None,
            log=print) -> list[dict]:
    """Per (shape, T): µs of each prefix and of a stream of the up bytes and of all bytes, with % of
    the read ceiling (bytes = distinct experts × their gate/up or all weights)."""
    from dispatch_book.bench.harness import graph_7x30

    timer = timer or (lambda fn: graph_7x30(fn, host=False))
    sms, rows = runtime.num_sms(dev), []
    for name in shapes:
        w = None
        for T in tokens:
            _, w, x_TH, weights_TK, ids_TK = make_case(name, T, dev, dtype, w)
            used = int(torch.unique(ids_TK).numel())
            H, I, elt = x_TH.shape[1], w.down_EHI.shape[2], x_TH.element_size()
            nbytes = {"up": used * 2 * H * I * elt, "all": used * 3 * H * I * elt}
            row = {"shape": name, "T": T, "experts_read": used, "bytes": nbytes,
                   "us": {k: timer(fn)["median_ms"] * 1e3 for k, fn in stages(w, x_TH, weights_TK, ids_TK).items()}}
            for what, nb in nbytes.items():
                buf = torch.ones(nb // elt, dtype=x_TH.dtype, device=dev)
                row["us"][f"stream_{what}"] = reads.best_stream(buf, sms, timer)["median_ms"] * 1e3
                del buf
            row["pct_read"] = {k: 100 * nbytes["up" if k in ("up", "stream_up") else "all"] / (us * 1e-6) / 1e9
                               / read_gbps for k, us in row["us"].items()}
            rows.append(row)
            log(f"{name:18s} T={T}  " + "  ".join(f"{k} {us:7.1f} us" for k, us in row["us"].items()))
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m dispatch_book.bench chain", description=__doc__.split("\n\n")[0])
    bench.add_output_args(p)
    a = p.parse_args(argv)
    if not runtime.HAS_CUDA:
        raise SystemExit("the chain benchmark needs a CUDA GPU (the chapters read the recorded results)")
    c = bench.ceilings()
    rows = measure(torch.device("cuda"), c["hbm_read_gbps"])
    print("wrote", bench.save("decode_chain", rows, out=a.out, allow_dirty=a.allow_dirty,
                              extra={"read_gbps": c["hbm_read_gbps"], "read_source": c["source"],
                                     "timing": "graph_7x30", "dtype": "bfloat16"}))


if __name__ == "__main__":
    main()
