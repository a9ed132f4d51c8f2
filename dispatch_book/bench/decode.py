"""Benchmark of the decode path (1–256 tokens): our grouped GEMV against transformers and against
our own grouped GEMM (where the two paths cross over), same inputs.

    python -m dispatch_book.bench.decode [--shapes a,b] [--tokens 1,8,64] [--quick] [--routing zipf:3]

For each shape and token count one routing (``--routing``, :mod:`dispatch.tune.routing_dist`: by
default the softmax top-K of random logits; rows record its name and the draw's busiest/mean expert
load; other than uniform, rows go to ``decode_skewed.json``) is given to every
contestant: ``ours`` (``moe_decode``, as a user calls it: host overhead included), ``ours_graph``
(the same three launches from a CUDA graph, timed as the kernels race times its contestants:
``graph_7x30``), ``ours_wide`` (the same kernels with wide
tiles: too few programs to fill the GPU), ``grouped_graph`` (chapter 2's grouped GEMM, the tile
policy's tiles, replayed from a CUDA graph; ``decode_wins`` says which path is faster under graphs:
the decode/grouped crossover, measured), transformers' ``batched_mm`` and ``grouped_mm``
(``OlmoeExperts`` holding our tensors), ``loop`` (the per-expert PyTorch loop of
``dispatch.reference``) and ``stream_graph``: a plain read of the same number of bytes, contiguous
(``peaks.same_bytes_read``: a streaming Triton read, from a CUDA graph) — what streaming alone costs at this
size, ramp and tail included (``stream_pct``: ours_graph's rate as % of it). The floor is the bytes of
the distinct chosen experts over the GPU's HBM read bandwidth (``dispatch_book.bench.ceilings()``:
measured on 4 GiB, else the datasheet).
Tiles come from the tile policy (``dispatch.kernels.tiles``: this GPU's tuned table, written by
``python -m dispatch.tune``, else heuristics); rows record their config.
Rows go to ``results/<gpu>/decode.json`` (``dispatch_book.bench.save``).
"""
from __future__ import annotations

import argparse
import dataclasses

import torch

from dispatch import runtime
from dispatch.config import PRESETS, random_weights
from dispatch.kernels.gemv import moe_decode
from dispatch.kernels.grouped_gemm import moe_experts
from dispatch.kernels.tiles import DecodeConfig, decode_config
from dispatch.reference import experts_reference
from dispatch.tune import routing_dist
from dispatch_book import bench
from dispatch_book.bench import hf_baselines as hf
from dispatch_book.bench import skew
from dispatch_book.bench.harness import graph_7x30
from dispatch_book.bench.peaks import same_bytes_read

SHAPES = ("olmoe-1b-7b", "mixtral-8x7b", "qwen3-30b-a3b")
TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TOLERANCE = 2e-2  # ‖ours − ref‖ / ‖ref‖ in bf16 (the reference rounds after every op, we accumulate in fp32)
WIDE = DecodeConfig(block_i=128, block_h=64, block_ho=128, block_id=64)


def make_case(name: str, T: int, dev, dtype, seed: int = 0, routing: str = "uniform"):
    """Weights drawn on the device, x and a routing drawn from ``routing`` (uniform: the softmax top-K
    of random logits)."""
    cfg = PRESETS[name]
    w = random_weights(cfg, seed=seed, dtype=dtype, device=dev)
    g = torch.Generator(device=dev).manual_seed(seed + 1)
    x = torch.randn(T, cfg.H, generator=g, device=dev).to(dtype)
    weights, ids = routing_dist.draw(routing, cfg, T, g)
    return cfg, x, weights, ids, w.gate_up_E2IH, w.down_EHI


def measure(name: str, tokens, dev, dtype, log=print, routing: str = "uniform") -> list[dict]:
    """One row per token count: every contestant on the same inputs (tiles: the tile policy's, or the
    table's entry tuned for ``routing`` where there is one)."""
    rows, hbm_bps = [], hbm_read_bps()
    for T in tokens:
        rows.append(_measure_one(name, T, dev, dtype, hbm_bps, log, routing))
        torch.cuda.empty_cache()
    return rows


def hbm_read_bps() -> float:
    """This GPU's HBM read bandwidth in bytes/s (the floor's and the percentages' denominator)."""
    return bench.ceilings()["hbm_read_gbps"] * 1e9


def _measure_one(name: str, T: int, dev, dtype, hbm_bps: float, log, routing: str = "uniform") -> dict:
    cfg, x, w, ids, gu, dn = make_case(name, T, dev, dtype, seed=T, routing=routing)
    routed = skew.routed_tiles(cfg, T, dtype, dev, routing)
    dcfg = routed["decode"] or decode_config(T, cfg.K, cfg.E, cfg.H, cfg.I, dtype, dev)
    gemm = routed["configs"]
    ref = experts_reference(x, w.to(dtype), ids, gu, dn)
    y = moe_decode(x, w, ids, gu, dn, config=dcfg)
    err = bench.rel_err(y, ref)
    if not err <= TOLERANCE:
        raise AssertionError(f"moe_decode is wrong on {name} T={T}: rel err {err:.3g}")
    same = torch.equal(y, moe_decode(x, w, ids, gu, dn, config=dcfg))
    uniq = int(torch.unique(ids).numel())
    nbytes = uniq * 3 * cfg.H * cfg.I * x.element_size()
    row = {"shape": name, "tokens": T, **routing_dist.describe(routing, cfg, ids), "tiles": routed["source"],
           "unique_experts": uniq, "expert_bytes": nbytes,
           "floor_ms": nbytes / hbm_bps * 1e3, "rel_err": err, "bitwise_repeat": same,
           "config": dataclasses.asdict(dcfg), "contestants": {}}
    # *_graph: timed as the kernels race and the chain time theirs (graph_7x30: 30 calls in a CUDA graph,
    # replayed 7 times), so the chapters' tables of one recording set agree; the rest as a user calls them
    fns = {"ours": lambda: moe_decode(x, w, ids, gu, dn, config=dcfg),
           "ours_graph": lambda: moe_decode(x, w, ids, gu, dn, config=dcfg)}
    fns["grouped_graph"] = lambda: moe_experts(x, w, ids, gu, dn, configs=gemm)
    if T in (1, 8, 64):
        fns["ours_wide"] = lambda: moe_decode(x, w, ids, gu, dn, config=WIDE)
    for impl in ("batched_mm", "grouped_mm"):
        need = T * cfg.K * 3 * cfg.H * cfg.I * x.element_size()
        if impl == "batched_mm" and need > 0.5 * torch.cuda.mem_get_info(dev)[0]:
            row["contestants"][impl] = {"skipped": f"would gather {need / 2**30:.0f} GiB of weights"}
            continue
        mod = hf.build_experts(gu, dn, impl)
        fns[impl] = (lambda m=mod: hf.run_experts(m, x, w, ids))
    fns["loop"] = lambda: experts_reference(x, w.to(dtype), ids, gu, dn)
    fns["stream_graph"] = same_bytes_read(nbytes, dev)
    for cname, fn in fns.items():
        try:
            with torch.no_grad():
                r = graph_7x30(fn) if cname.endswith("_graph") else bench.time_ms(fn, warmup=5, rep=25)
        except torch.OutOfMemoryError as e:
            row["contestants"][cname] = {"skipped": f"out of memory: {str(e).splitlines()[0][:100]}"}
            torch.cuda.empty_cache()
            continue
        s = r["median_ms"] / 1e3
        r.update(gbps=nbytes / s / 1e9, pct_hbm=100 * nbytes / s / hbm_bps)
        row["contestants"][cname] = r
    c = row["contestants"]
    hf_ms = [c[k]["median_ms"] for k in ("batched_mm", "grouped_mm") if "median_ms" in c.get(k, {})]
    if hf_ms:
        row["speedup_vs_best_hf"] = min(hf_ms) / c["ours"]["median_ms"]
    if "median_ms" in c.get("grouped_graph", {}):
        row["decode_wins"] = c["ours_graph"]["median_ms"] <= c["grouped_graph"]["median_ms"]
    row["stream_pct"] = 100 * c["stream_graph"]["median_ms"] / c["ours_graph"]["median_ms"]
    if "median_ms" in c.get("batched_mm", {}):
        row["speedup_vs_batched_mm"] = c["batched_mm"]["median_ms"] / c["ours"]["median_ms"]
    log(f"{name:14s} T={T:3d} uniq={uniq:3d} floor {row['floor_ms'] * 1e3:7.1f}us | " + " ".join(
        f"{k} {v['median_ms'] * 1e3:8.1f}us" if "median_ms" in v else f"{k} skip" for k, v in c.items())
        + f" | {c['ours']['pct_hbm']:.0f}% HBM (graph {c['ours_graph']['pct_hbm']:.0f}%, "
        f"{row['stream_pct']:.0f}% of a same-size stream) err {err:.1e}")
    return row


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m dispatch_book.bench.decode")
    p.add_argument("--shapes", default=",".join(SHAPES), type=bench.preset_list)
    p.add_argument("--tokens", default=",".join(map(str, TOKENS)), type=bench.int_list)
    p.add_argument("--quick", action="store_true", help="tokens 1,8,64 only")
    p.add_argument("--out", default=None, help="results directory (default results/)")
    skew.add_routing_arg(p)
    a = p.parse_args(argv)
    routing = skew.parse_or_exit(a.routing)
    if not runtime.HAS_CUDA:
        raise SystemExit("bench_decode needs a CUDA GPU (the chapter plots the recorded results instead)")
    dev, dtype = torch.device("cuda"), runtime.compute_dtype()
    tokens = (1, 8, 64) if a.quick else tuple(a.tokens)
    rows = []
    for name in a.shapes:
        rows += measure(name, tokens, dev, dtype, routing=routing)
        # after every shape: a run cut short keeps what it measured
        path = bench.save(skew.results_name("decode", routing), rows,
                          extra={"hbm_bps": hbm_read_bps(), "dtype": str(dtype)}, out=a.out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
