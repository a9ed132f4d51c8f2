"""A sweep of pinned tile configs for the grouped GEMM's two kernels, one layer shape at a time.

    python -m dispatch_book.bench kernels_sweep [--shapes olmoe-1b-7b] [--tokens 64,4096,16384] --out DIR

For each shape and token count (one routing: softmax top-K of seeded random logits), the up kernel
(``grouped_up_swiglu``) and the down kernel (``grouped_down``) are each timed alone under every
config of :data:`CONFIGS` — BLOCK_M × BLOCK_N × BLOCK_K × warps × stages — after their output is
checked against the kernel run with the first config (itself checked against the reference), and
the three stages of the whole path are timed at the default tiles: the sort, ``moe_experts``, the
combine. CUDA-graph replay timing (``harness.time_ms(graph=True)``). TFLOP/s count the kernel's
own GEMM: up 2·2I·H and down 2·H·I per routed row. Rows: ``results/<gpu>/kernels_sweep.json``.
"""
from __future__ import annotations

import argparse

import torch

from dispatch import runtime
from dispatch.config import PRESETS, random_weights
from dispatch.kernels.tiles import GemmConfig
from dispatch.reference import route_reference
from dispatch_book import bench

CONFIGS = tuple(GemmConfig(*c) for c in (  # BLOCK_M, BLOCK_N, BLOCK_K, warps, stages
    (64, 64, 64, 4, 4), (64, 128, 64, 4, 4), (64, 128, 64, 8, 3), (64, 128, 64, 8, 4), (64, 64, 128, 4, 3),
    (64, 256, 64, 8, 3), (64, 128, 128, 8, 3), (128, 64, 64, 4, 4), (128, 128, 64, 4, 4), (128, 128, 64, 8, 3),
    (128, 128, 64, 8, 4), (128, 64, 128, 4, 3), (128, 256, 64, 8, 3), (128, 128, 128, 8, 3)))
TOLERANCE = 2e-2


def _timed(fn) -> dict:
    return bench.time_ms(fn, graph=True)


def measure(name: str, T: int, dev, dtype) -> list[dict]:
    from triton.runtime.errors import OutOfResources

    from dispatch.kernels import grouped_gemm as gg
    from dispatch.kernels.combine import combine_impl
    from dispatch.kernels.sort import sort_by_expert

    cfg = PRESETS[name]
    w = random_weights(cfg, dtype=dtype, device=dev)
    g = torch.Generator(device=dev).manual_seed(0)
    x_TH = torch.randn(T, cfg.H, device=dev, generator=g).to(dtype)
    weights_TK, ids_TK = route_reference(torch.randn(T, cfg.E, device=dev, generator=g), cfg)
    weights_TK = weights_TK.to(dtype)
    N = T * cfg.K  # routed rows
    flops = {"up": 2 * 2 * cfg.I * cfg.H * N, "down": 2 * cfg.H * cfg.I * N}
    rows, base = [], {}
    for c in CONFIGS:
        routes = sort_by_expert(ids_TK, cfg.E, c.block_m)
        h_PI = gg.grouped_up_swiglu_torch(x_TH, routes, w.gate_up_E2IH)  # the down kernel's input, any up tiles
        runs = {"up": lambda c=c, r=routes: gg.grouped_up_swiglu(x_TH, r, w.gate_up_E2IH, config=c),
                "down": lambda c=c, r=routes, h=h_PI: gg.grouped_down(h, r, w.down_EHI, weights_TK, config=c,
                                                                      zero_skipped=False)}
        for kernel, fn in runs.items():
            row = {"shape": name, "tokens": T, "kernel": kernel, "config": [c.block_m, c.block_n, c.block_k,
                                                                           c.num_warps, c.num_stages]}
            try:
                out = fn()
            except OutOfResources as e:  # e.g. up at 64×128×128, 3 stages: 240 KiB of shared memory
                row["error"] = f"does not fit this GPU: {e}"
                rows.append(row)
                continue
            # the up output is in slot order, which depends on block_m: compare it in routed-row order
            y = out if kernel == "down" else out[routes.slot_of_N.long()]
            base.setdefault(kernel, y)
            row["rel_err"] = bench.rel_err(y, base[kernel])
            if not row["rel_err"] <= TOLERANCE:
                row["error"] = f"rel err {row['rel_err']:.2e} against the first config: not timed"
            else:
                row.update(_timed(fn))
                row["tflops"] = flops[kernel] / (row["median_ms"] * 1e-3) / 1e12
            rows.append(row)
            print(f"{name} T={T:6d} {kernel:4s} {'×'.join(map(str, row['config'])):18s} "
                  f"{row.get('tflops', float('nan')):7.1f} TFLOP/s", flush=True)
    routes = sort_by_expert(ids_TK, cfg.E, CONFIGS[0].block_m)
    out_NH = gg.grouped_down(gg.grouped_up_swiglu(x_TH, routes, w.gate_up_E2IH), routes, w.down_EHI, weights_TK)
    stages = {"sort": lambda: sort_by_expert(ids_TK, cfg.E, CONFIGS[0].block_m),
              "moe_experts": lambda: gg.moe_experts(x_TH, weights_TK, ids_TK, w.gate_up_E2IH, w.down_EHI),
              "combine": lambda: combine_impl(out_NH, cfg.K, ids_TK, cfg.E, dtype)}
    for kernel, fn in stages.items():
        rows.append({"shape": name, "tokens": T, "kernel": kernel, **_timed(fn)})
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m dispatch_book.bench kernels_sweep")
    p.add_argument("--shapes", default="olmoe-1b-7b", type=bench.preset_list)
    p.add_argument("--tokens", default="64,4096,16384", type=bench.int_list)
    a = p.parse_args(argv)
    if not runtime.HAS_CUDA:
        raise SystemExit("the tile sweep times CUDA graphs: it needs a CUDA GPU")
    dev, dtype = torch.device("cuda"), runtime.compute_dtype()
    rows = []
    with torch.no_grad():
        for name in a.shapes:
            for T in a.tokens:
                rows += measure(name, T, dev, dtype)
    print("wrote", bench.save("kernels_sweep", rows, extra={"dtype": str(dtype), "tolerance_rel": TOLERANCE,
                                                             "timing": "CUDA graph replay, L2 flushed"}))
