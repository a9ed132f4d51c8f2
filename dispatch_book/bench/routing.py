"""Benchmark of chapter 1: the routing kernel and the token sort against their PyTorch twins.

    python -m dispatch_book.bench routing [--out DIR] [--shapes olmoe-1b-7b,...] [--tokens 1,16,...] [--block-m 64]

For each layer shape (E experts, top-K, its routing family) and token count T, times
``route`` vs ``route_torch`` (the reference router), ``sort_by_expert`` vs ``sort_by_expert_torch``,
and the two chained (``route+sort``). Ours is checked against the twin before it is timed. On a
GPU each call is timed from a CUDA graph (``median_ms``: the kernels alone, as a decode step runs
them), with the host's time to issue it (``host_us``) and one eager call (``eager_ms``) beside it
(:func:`measure`); on the CPU by the wall clock.
Rows go to ``<out>/<gpu>/routing_sort.json`` via ``dispatch_book.bench.save`` (``--out results``
records them for the book).
"""
from __future__ import annotations

import argparse

import torch

from dispatch import runtime
from dispatch.config import PRESETS
from dispatch.kernels.routing import route, route_torch
from dispatch.kernels.sort import sort_by_expert, sort_by_expert_torch
from dispatch_book import bench
from dispatch_book.bench.harness import graph_7x30

SHAPES = ("olmoe-1b-7b", "qwen3-30b-a3b", "deepseek-v3")  # E = 64, 128, 256; K = 8
TOKENS = (1, 4, 16, 64, 256, 1024, 4096, 16384)
CPU_TOKENS = (1, 16, 64)  # the interpreter is slow: a smoke run only
FIELDS = ("sorted_rows_P", "block_expert_B", "slot_of_N", "counts_E", "offsets_E1", "num_blocks_1")


def _case(cfg, T, dev, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    logits = (torch.randn(T, cfg.E, generator=g) * 2).to(dev, runtime.compute_dtype(dev))
    bias = (torch.randn(cfg.E, generator=g) * 0.3).to(dev) if cfg.correction_bias else None
    return logits, bias


def _check(cfg, logits, bias, block_m):
    """Ours must agree with the twin before it is timed: the sort exactly; the router's weights to
    1e-5 (softmax: everywhere, ties have equal weights; sigmoid: where the ids agree, which must be
    at least 99.9% of the tokens — the rest are near-ties, see tests/test_routing.py)."""
    w, ids = route(logits, cfg, bias)
    w_ref, ids_ref = route_torch(logits, cfg, bias)
    same = (ids == ids_ref).all(dim=1)
    if cfg.scoring == "softmax":
        torch.testing.assert_close(w, w_ref, atol=1e-5, rtol=1e-5)
    elif same.float().mean().item() < 0.999:
        raise AssertionError(f"route disagrees with its twin on {int((~same).sum())} of {len(same)} tokens")
    torch.testing.assert_close(w[same], w_ref[same], atol=1e-5, rtol=1e-5)
    a, b = sort_by_expert(ids, cfg.E, block_m), sort_by_expert_torch(ids, cfg.E, block_m)
    for f in FIELDS:
        if not torch.equal(getattr(a, f), getattr(b, f)):
            raise AssertionError(f"sort_by_expert disagrees with its twin on {f}")
    return ids


def _contestants(cfg, logits, bias, ids, block_m) -> dict:
    """(op, impl) → a call to time."""
    return {
        ("route", "ours"): lambda: route(logits, cfg, bias),
        ("route", "torch"): lambda: route_torch(logits, cfg, bias),
        ("sort", "ours"): lambda: sort_by_expert(ids, cfg.E, block_m),
        ("sort", "torch"): lambda: sort_by_expert_torch(ids, cfg.E, block_m),
        ("route+sort", "ours"): lambda: sort_by_expert(route(logits, cfg, bias)[1], cfg.E, block_m),
        ("route+sort", "torch"): lambda: sort_by_expert_torch(route_torch(logits, cfg, bias)[1], cfg.E, block_m),
    }


def measure(device: str = "auto", *, shapes=SHAPES, tokens=None, block_m: int = 64) -> list[dict]:
    """Rows of {shape, E, K, T, op, impl, median_ms, min_ms, max_ms, samples, ...} for every case.

    On a GPU every contestant is timed as a decode step runs it, from a CUDA graph (``median_ms``: the
    kernels alone, launch overhead apart), with two more numbers beside it: ``host_us``, the host's time
    to issue one eager call (Python, argument checks, launches), and ``eager_ms``, one eager call as
    ``triton.testing.do_bench`` times it (L2 flushed before each call: the GPU's clock starts when the
    flush ends, so the host's time hides behind the flush up to its length and shows beyond it)."""
    dev = runtime.device(device)
    tokens = tokens or (TOKENS if dev.type == "cuda" else CPU_TOKENS)
    rows = []
    for name in shapes:
        cfg = PRESETS[name]
        for T in tokens:
            logits, bias = _case(cfg, T, dev)
            ids = _check(cfg, logits, bias, block_m)
            fns = _contestants(cfg, logits, bias, ids, block_m)
            for (op, impl), fn in fns.items():
                row = {"shape": name, "E": cfg.E, "K": cfg.K, "T": T, "op": op, "impl": impl, "block_m": block_m,
                       "dtype": str(logits.dtype).replace("torch.", "")}
                if dev.type == "cuda":  # both are capturable (no host sync): the kernels alone
                    row |= graph_7x30(fn)
                    row["eager_ms"] = bench.time_ms(fn)["median_ms"]
                else:
                    row |= bench.time_ms(fn, warmup=1, rep=3)
                rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m dispatch_book.bench routing", description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=",".join(SHAPES), type=bench.preset_list)
    ap.add_argument("--tokens", default=None, type=bench.int_list, help="comma-separated token counts")
    ap.add_argument("--block-m", type=int, default=64)
    ap.add_argument("--device", default="auto")
    bench.add_output_args(ap)
    args = ap.parse_args(argv)
    bench.results.checked_commit(args.allow_dirty)  # refuse before measuring, not after
    tokens = tuple(args.tokens) if args.tokens else None
    rows = measure(args.device, shapes=args.shapes, tokens=tokens, block_m=args.block_m)
    path = bench.save("routing_sort", rows, out=args.out, allow_dirty=args.allow_dirty)
    by = {(r["shape"], r["T"], r["op"], r["impl"]): r["median_ms"] for r in rows}
    ops = ("route", "sort", "route+sort")
    print(f"{'shape':<16}{'T':>7}  " + "  ".join(f"{op + ' ours/torch (us, graph)':>28}" for op in ops))
    for shape, T in dict.fromkeys((r["shape"], r["T"]) for r in rows):
        cells = [f"{by[shape, T, op, 'ours'] * 1e3:>12.1f} / {by[shape, T, op, 'torch'] * 1e3:>12.1f}"
                 for op in ops]
        print(f"{shape:<16}{T:>7}  " + "  ".join(cells))
    print(f"saved {path}")


if __name__ == "__main__":
    main()
