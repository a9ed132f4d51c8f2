"""Benchmark of the decode path (1–64 tokens): our grouped GEMV against transformers, same inputs.

    python -m dispatch_book.bench.decode [--shapes a,b] [--tokens 1,8,64] [--tune] [--quick]

For each shape and token count one routing (softmax top-K of random logits) is given to every
contestant: ``ours`` (``moe_decode``, as a user calls it: host overhead included), ``ours_graph``
(the same three launches replayed from a CUDA graph), ``ours_wide`` (the same kernels with wide
tiles: too few programs to fill the GPU), transformers' ``batched_mm`` and ``grouped_mm``
(``OlmoeExperts`` holding our tensors), and ``loop`` (the per-expert PyTorch loop of
``dispatch.reference``). The floor is the bytes of the distinct chosen experts over 4.3 TB/s.
``--tune`` first times a few tile configs per shape at 1 and 64 tokens and uses the best (the one
tuned at 1 token where the default is ``FEW_EXPERTS``, else the one at 64); rows record their config.
Rows go to ``results/<gpu>/decode.json`` (``dispatch_book.bench.save``).
"""
from __future__ import annotations

import argparse
import dataclasses
import json

import torch

from dispatch import runtime
from dispatch_book import bench
from dispatch.arithmetic import H200_HBM_BPS
from dispatch.config import PRESETS, random_weights
from dispatch_book.bench import hf_baselines as hf
from dispatch.kernels.gemv import FEW_EXPERTS, DecodeConfig, default_config, moe_decode
from dispatch.reference import experts_reference, route_reference

SHAPES = ("olmoe-1b-7b", "mixtral-8x7b", "qwen3-30b-a3b")
TOKENS = (1, 2, 4, 8, 16, 32, 64)
TOLERANCE = 2e-2  # ‖ours − ref‖ / ‖ref‖ in bf16 (the reference rounds after every op, we accumulate in fp32)
WIDE = DecodeConfig(block_i=128, block_h=64, block_ho=128, block_id=64)
# Tile candidates for --tune: up-kernel fields first (down fixed), then down-kernel fields.
UP_CANDIDATES = [dict(block_i=bi, block_h=bh, num_stages=s) for bi, bh, s in
                 [(32, 256, 3), (16, 256, 3), (32, 128, 4), (64, 128, 3)]]
DOWN_CANDIDATES = [dict(block_ho=bo, block_id=bd) for bo, bd in [(32, 128), (32, 256), (64, 128)]]
PROGRAM_CANDIDATES = [dict(programs=p) for p in (264, 528, 1056, 2112)]


def make_case(name: str, T: int, dev, dtype, seed: int = 0):
    """Weights drawn on the device, x and a softmax top-K routing of random logits."""
    cfg = PRESETS[name]
    w = random_weights(cfg, seed=seed, dtype=dtype, device=dev)
    g = torch.Generator(device=dev).manual_seed(seed + 1)
    x = torch.randn(T, cfg.H, generator=g, device=dev).to(dtype)
    weights, ids = route_reference(torch.randn(T, cfg.E, generator=g, device=dev), cfg)
    return cfg, x, weights, ids, w.gate_up_E2IH, w.down_EHI


def graph_of(fn):
    """fn captured in a CUDA graph (after a warm-up on a side stream); returns replay."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay


def tune(name: str, dev, dtype, log=print) -> dict[int, DecodeConfig]:
    """Best config at 1 and 64 tokens for one shape (up fields, then down fields, then programs)."""
    best = {}
    for T in (1, 64):
        cfg, x, w, ids, gu, dn = make_case(name, T, dev, dtype)
        base = default_config(T, cfg.K, cfg.E, cfg.H, cfg.I, dev)

        def t(c):
            return bench.time_ms(lambda: moe_decode(x, w, ids, gu, dn, config=c), warmup=3, rep=15)["median_ms"]

        for cands in (UP_CANDIDATES, DOWN_CANDIDATES, PROGRAM_CANDIDATES):
            timed = [(t(dataclasses.replace(base, **c)), c) for c in cands]
            ms, c = min(timed, key=lambda p: p[0])
            base = dataclasses.replace(base, **c)
            log(f"tune {name} T={T}: " + " ".join(f"{m * 1e3:.1f}us" for m, _ in timed) + f" -> {c}")
        best[T] = base
    return best


def measure(name: str, tokens, dev, dtype, configs=None, log=print) -> list[dict]:
    rows = []
    for T in tokens:
        cfg, x, w, ids, gu, dn = make_case(name, T, dev, dtype, seed=T)
        dcfg = default_config(T, cfg.K, cfg.E, cfg.H, cfg.I, dev)
        if configs:  # the tuned config of the same regime (few / many experts used) as the default
            dcfg = configs[1 if dcfg.programs == FEW_EXPERTS.programs else 64]
        ref = experts_reference(x, w.to(dtype), ids, gu, dn)
        y = moe_decode(x, w, ids, gu, dn, config=dcfg)
        err = bench.rel_err(y, ref)
        if not err <= TOLERANCE:
            raise AssertionError(f"moe_decode is wrong on {name} T={T}: rel err {err:.3g}")
        same = torch.equal(y, moe_decode(x, w, ids, gu, dn, config=dcfg))
        uniq = int(torch.unique(ids).numel())
        nbytes = uniq * 3 * cfg.H * cfg.I * x.element_size()
        row = {"shape": name, "tokens": T, "unique_experts": uniq, "expert_bytes": nbytes,
               "floor_ms": nbytes / H200_HBM_BPS * 1e3, "rel_err": err, "bitwise_repeat": same,
               "config": dataclasses.asdict(dcfg), "contestants": {}}
        fns = {"ours": lambda: moe_decode(x, w, ids, gu, dn, config=dcfg),
               "ours_graph": graph_of(lambda: moe_decode(x, w, ids, gu, dn, config=dcfg))}
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
        for cname, fn in fns.items():
            try:
                with torch.no_grad():
                    r = bench.time_ms(fn, warmup=5, rep=25)
            except torch.OutOfMemoryError as e:
                row["contestants"][cname] = {"skipped": f"out of memory: {str(e).splitlines()[0][:100]}"}
                torch.cuda.empty_cache()
                continue
            s = r["median_ms"] / 1e3
            r.update(gbps=nbytes / s / 1e9, pct_hbm=100 * nbytes / s / H200_HBM_BPS)
            row["contestants"][cname] = r
        c = row["contestants"]
        hf_ms = [c[k]["median_ms"] for k in ("batched_mm", "grouped_mm") if "median_ms" in c.get(k, {})]
        if hf_ms:
            row["speedup_vs_best_hf"] = min(hf_ms) / c["ours"]["median_ms"]
        if "median_ms" in c.get("batched_mm", {}):
            row["speedup_vs_batched_mm"] = c["batched_mm"]["median_ms"] / c["ours"]["median_ms"]
        rows.append(row)
        log(f"{name:14s} T={T:3d} uniq={uniq:3d} floor {row['floor_ms'] * 1e3:7.1f}us | " + " ".join(
            f"{k} {v['median_ms'] * 1e3:8.1f}us" if "median_ms" in v else f"{k} skip" for k, v in c.items())
            + f" | {c['ours']['pct_hbm']:.0f}% HBM (graph {c['ours_graph']['pct_hbm']:.0f}%) err {err:.1e}")
        del x, gu, dn
        torch.cuda.empty_cache()
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m dispatch_book.bench.decode")
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    p.add_argument("--tune", action="store_true", help="time tile candidates first and use the best")
    p.add_argument("--quick", action="store_true", help="tokens 1,8,64 only")
    p.add_argument("--out", default=None, help="results directory (default results/)")
    a = p.parse_args(argv)
    if not runtime.HAS_CUDA:
        raise SystemExit("bench_decode needs a CUDA GPU (the chapter plots the recorded results instead)")
    dev, dtype = torch.device("cuda"), runtime.compute_dtype()
    tokens = (1, 8, 64) if a.quick else tuple(int(t) for t in a.tokens.split(","))
    rows, tuned = [], {}
    for name in a.shapes.split(","):
        configs = tune(name, dev, dtype) if a.tune else None
        if configs:
            tuned[name] = {T: dataclasses.asdict(c) for T, c in configs.items()}
        rows += measure(name, tokens, dev, dtype, configs)
    import pathlib
    path = bench.save("decode", rows, extra={"hbm_bps": H200_HBM_BPS, "dtype": str(dtype), "tuned": tuned},
                      out=a.out)
    print(f"wrote {path}")
    if tuned:
        print("tuned:", json.dumps(tuned))


if __name__ == "__main__":
    main()
