"""Benchmark of the routed experts: transformers' three implementations against ours, same inputs.

    python -m dispatch_book.bench kernels [--shapes olmoe-1b-7b,...] [--tokens 1,8,...] [--quick]

For each shape and token count the routing is computed once and given to every contestant; the
timed call is the experts part (plus the shared expert in torch, for every contestant alike, where
the layer has one). ``ours_grouped`` is ``moe_experts``, ``ours_decode`` chapter 3's kernels
(T ≤ 64), ``ours_persistent`` the persistent schedule (T ≥ 256). ``ours_layer`` times our whole
layer (router + routing kernel + sort + experts, the path ``moe`` picks) as a separate column. Ours is checked against the reference before it is timed. Rows are saved
with ``dispatch_book.bench.save("kernels", rows)`` to ``results/<gpu>/kernels.json``.
"""
from __future__ import annotations

import argparse
import math

import torch

from dispatch import runtime
from dispatch_book import bench
from dispatch.arithmetic import H200_BF16_FLOPS, H200_HBM_BPS
from dispatch.config import PRESETS, random_weights
from dispatch.kernels import gemm_config as gc
from dispatch.kernels import grouped_gemm as gg
from dispatch_book.bench import hf_baselines as hf
from dispatch.reference import experts_reference, route_reference, router_logits, shared_reference

SHAPES = ("olmoe-1b-7b", "mixtral-8x7b", "deepseek-moe-16b", "qwen3-30b-a3b")
TOKENS = (1, 8, 64, 256, 1024, 4096, 16384)
QUICK_TOKENS = (1, 64, 1024, 4096)
TOLERANCE = 2e-2  # ‖ours − ref‖ / ‖ref‖ in bf16 (both round differently; the reference rounds more)
MAX_CALL_MS = 2000.0


def contestants(cfg, w, x_TH, weights_TK, ids_TK, dev):
    """name -> (fn, reason it is skipped or None). Every fn returns y_TH (shared expert included)."""
    def with_shared(fn):
        return lambda: fn() if not cfg.shared_intermediate_size else fn() + shared_reference(x_TH, cfg, w)

    T, K = ids_TK.shape
    elt = x_TH.element_size()
    out = {}
    for impl in hf.IMPLEMENTATIONS:
        mod = hf.build_experts(w.gate_up_E2IH, w.down_EHI, impl)
        reason = hf.unavailable_reason(impl, dev, x_TH.dtype)
        if impl == "batched_mm":  # gathers every routed row's expert weights: N · 3HI elements
            need = T * K * 3 * cfg.H * cfg.I * elt
            free = torch.cuda.mem_get_info(dev)[0] if dev.type == "cuda" else 8 << 30
            if need > 0.7 * free:
                reason = f"would allocate {need / 2**30:.0f} GiB of gathered weights (free {free / 2**30:.0f} GiB)"
        out[f"hf_{impl}"] = (with_shared(lambda m=mod: hf.run_experts(m, x_TH, weights_TK, ids_TK)), reason)
    out["ours_grouped"] = (with_shared(lambda: gg.moe_experts(x_TH, weights_TK, ids_TK, w.gate_up_E2IH,
                                                                 w.down_EHI)), None)
    if T >= 256:
        from dispatch.kernels.persistent import moe_experts_persistent
        out["ours_persistent"] = (with_shared(lambda: moe_experts_persistent(
            x_TH, weights_TK, ids_TK, w.gate_up_E2IH, w.down_EHI)), None)
    from dispatch.kernels.gemv import moe_decode
    from dispatch.moe import DECODE_MAX_TOKENS, moe

    if T <= DECODE_MAX_TOKENS:
        out["ours_decode"] = (with_shared(lambda: moe_decode(x_TH, weights_TK, ids_TK, w.gate_up_E2IH,
                                                                w.down_EHI)), None)
    out["ours_layer"] = (lambda: moe(x_TH, cfg, w), None)
    return out


def measure_shape(name: str, tokens, dev, dtype, *, warmup: int, rep: int, log=print) -> list[dict]:
    cfg = PRESETS[name]
    w = random_weights(cfg, dtype=dtype, device=dev)
    rows = []
    for T in tokens:
        g = torch.Generator(device=dev).manual_seed(1000 + T)
        x_TH = torch.randn(T, cfg.H, device=dev, generator=g, dtype=torch.float32).to(dtype)
        weights_TK, ids_TK = route_reference(router_logits(x_TH, cfg, w), cfg, w.bias_E)  # once, for all
        ref_TH = experts_reference(x_TH, weights_TK.to(dtype), ids_TK, w.gate_up_E2IH, w.down_EHI)
        if cfg.shared_intermediate_size:
            ref_TH = ref_TH + shared_reference(x_TH, cfg, w)
        flops = 2 * 3 * cfg.H * (cfg.I * T * cfg.K + cfg.shared_intermediate_size * T)
        n_unique = int(torch.unique(ids_TK).numel())
        weight_bytes = (n_unique * 3 * cfg.H * cfg.I + 3 * cfg.H * cfg.shared_intermediate_size) * x_TH.element_size()
        for cname, (fn, reason) in contestants(cfg, w, x_TH, weights_TK, ids_TK, dev).items():
            row = {"shape": name, "tokens": T, "contestant": cname, "flops": flops,
                   "expert_bytes": weight_bytes, "unique_experts": n_unique}
            if reason is None:
                try:
                    y_TH = fn()
                    err = bench.rel_err(y_TH, ref_TH)
                    row["rel_err"] = err
                    if cname in ("ours_grouped", "ours_decode", "ours_persistent") and not err <= TOLERANCE:
                        raise AssertionError(f"{cname} is wrong on {name} T={T}: rel err {err:.3g}")
                    t0 = bench.time_ms(fn, warmup=1, rep=1) if T >= 4096 else None
                    if t0 and t0["median_ms"] > MAX_CALL_MS:
                        reason = f"takes {t0['median_ms']:.0f} ms a call (> {MAX_CALL_MS:.0f})"
                    else:
                        row.update(bench.time_ms(fn, warmup=warmup, rep=rep))
                except torch.OutOfMemoryError as e:  # noqa: PERF203
                    reason = f"out of memory: {str(e).splitlines()[0][:120]}"
                    torch.cuda.empty_cache()
            if reason is not None:
                row["skipped"] = reason
            else:
                s = row["median_ms"] / 1e3
                row["tflops"] = flops / s / 1e12
                row["pct_peak_flops"] = 100 * flops / s / H200_BF16_FLOPS
                if T <= 64:
                    row["gbps"] = weight_bytes / s / 1e9
                    row["pct_hbm"] = 100 * weight_bytes / s / H200_HBM_BPS
                if cname == "ours_grouped":
                    row["configs"] = {k: str(getattr(getattr(gg, k), "best_config", None))
                                      for k in ("_up_tuned", "_down_tuned")}
                    row["block_m"] = gc.pick_block_m(T * cfg.K, cfg.E, dev)
            rows.append(row)
            log(f"{name:18s} T={T:6d} {cname:14s} " + (f"{row['median_ms']:9.4f} ms {row['tflops']:7.1f} TF/s"
                                                      f" err {row.get('rel_err', math.nan):.2e}"
                                                      if "median_ms" in row else f"skipped: {row['skipped']}"))
        del x_TH, ref_TH
        torch.cuda.empty_cache()
    return rows


SWEEP_TILES = ((64, 64, 4, 4), (128, 64, 4, 4), (128, 64, 8, 3), (128, 64, 8, 4), (64, 128, 4, 3),
               (256, 64, 8, 3), (128, 128, 8, 3))


def sweep(shape: str, tokens, dev, dtype, log=print) -> list[dict]:
    """Time the up and down kernels alone under pinned tile configs (how the autotune list was chosen)."""
    from dispatch.kernels.gemm_config import GemmConfig
    from dispatch.kernels.sort import sort_by_expert

    cfg = PRESETS[shape]
    w = random_weights(cfg, dtype=dtype, device=dev)
    rows = []
    for T in tokens:
        g = torch.Generator().manual_seed(T)  # seeded: the same routing every run
        x_TH = torch.randn(T, cfg.H, generator=g).to(device=dev, dtype=dtype)
        weights_TK, ids_TK = route_reference(router_logits(x_TH, cfg, w), cfg, w.bias_E)
        from dispatch.kernels.combine import combine
        out_NH = torch.randn(T * cfg.K, cfg.H, generator=g).to(device=dev, dtype=dtype)
        for kind, fn in (("sort", lambda: sort_by_expert(ids_TK, cfg.E, 16)), ("combine", lambda: combine(out_NH, cfg.K)),
                         ("moe_experts", lambda: gg.moe_experts(x_TH, weights_TK, ids_TK, w.gate_up_E2IH, w.down_EHI))):
            t = bench.time_ms(fn, warmup=5, rep=20)
            rows.append({"shape": shape, "tokens": T, "kernel": kind, **t})
            log(f"sweep {shape} T={T} {kind} {t['median_ms']:.4f} ms")
        bms = (16, 32, 64) if T * cfg.K <= 64 * cfg.E else (64, 128)
        for bm, bn, bk, nw, ns in [(bm,) + tile for bm in bms for tile in SWEEP_TILES]:
            c = GemmConfig(bm, bn, bk, nw, ns)
            routes = sort_by_expert(ids_TK, cfg.E, bm)
            try:
                h_PI = gg.grouped_up_swiglu(x_TH, routes, w.gate_up_E2IH, config=c)
            except Exception:  # noqa: BLE001 - does not fit: time the down kernel on the default tiles' h
                h_PI = gg.grouped_up_swiglu(x_TH, routes, w.gate_up_E2IH, config=GemmConfig(bm, 64, 64, 4, 3))
            for kind, fn, fl in (
                    ("up", lambda: gg.grouped_up_swiglu(x_TH, routes, w.gate_up_E2IH, config=c), 2 / 3),
                    ("down", lambda: gg.grouped_down(h_PI, routes, w.down_EHI, weights_TK, config=c), 1 / 3)):
                try:
                    t = bench.time_ms(fn, warmup=5, rep=20)
                except Exception as e:  # noqa: BLE001 - a config that does not compile/fit is a result too
                    rows.append({"shape": shape, "tokens": T, "kernel": kind, "config": str(c), "error": str(e)[:200]})
                    continue
                tf = fl * 2 * 3 * cfg.H * cfg.I * T * cfg.K / (t["median_ms"] / 1e3) / 1e12
                rows.append({"shape": shape, "tokens": T, "kernel": kind, "config": [bm, bn, bk, nw, ns],
                             **t, "tflops": tf})
                log(f"sweep {shape} T={T} {kind:4s} {(bm, bn, bk, nw, ns)} {t['median_ms']:.4f} ms {tf:.0f} TF/s")
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m dispatch_book.bench kernels")
    p.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated PRESETS names")
    p.add_argument("--tokens", default=None, help="comma-separated token counts")
    p.add_argument("--quick", action="store_true", help=f"tokens {QUICK_TOKENS}, shorter timing")
    p.add_argument("--no-save", action="store_true")
    p.add_argument("--sweep", action="store_true", help="time pinned tile configs of the two kernels instead")
    a = p.parse_args(argv)
    if not runtime.HAS_CUDA:
        raise SystemExit("the kernels benchmark needs a CUDA GPU (the chapters plot the recorded results)")
    shapes = [s for s in a.shapes.split(",") if s]
    for s in shapes:
        if s not in PRESETS:
            raise SystemExit(f"unknown shape {s!r}; choose from {sorted(PRESETS)}")
    tokens = [int(t) for t in a.tokens.split(",")] if a.tokens else (QUICK_TOKENS if a.quick else TOKENS)
    dev, dtype = runtime.device("cuda"), runtime.compute_dtype()
    warmup, rep = (5, 20) if a.quick else (10, 50)
    rows = []
    with torch.no_grad():
        for s in shapes:
            rows += (sweep(s, tokens, dev, dtype) if a.sweep
                     else measure_shape(s, tokens, dev, dtype, warmup=warmup, rep=rep))
            if not a.no_save:  # after every shape, so that a run cut short keeps what it measured
                path = _save(rows, a, argv, dtype)
    if not a.no_save:
        print(f"saved {path}")


def _save(rows, a, argv, dtype):
    cmd = "python -m dispatch_book.bench kernels " + " ".join(argv or [])
    return bench.save("kernels_sweep" if a.sweep else "kernels", rows, command=cmd.strip(), extra={
        "dtype": str(dtype).replace("torch.", ""), "tolerance_rel": TOLERANCE,
        "ceilings": {"bf16_flops": H200_BF16_FLOPS, "hbm_bytes_per_s": H200_HBM_BPS}})


def ours_row(rows: list[dict], shape: str, T: int, decode_max_tokens: int) -> dict | None:
    """The row of the experts path that ``moe(path="auto")`` takes at this size."""
    want = "ours_decode" if T <= decode_max_tokens else "ours_grouped"
    by = {r["contestant"]: r for r in rows if r["shape"] == shape and r["tokens"] == T and "median_ms" in r}
    return by.get(want) or by.get("ours_grouped")


def targets(doc: dict, decode_max_tokens: int, shape: str = "olmoe-1b-7b") -> list[dict]:
    """The issue's targets, checked against a recorded run: one dict per (target, size)."""
    rows = doc["rows"]
    out = []
    for r in rows:
        if r["contestant"] != "ours_grouped" or r["shape"] != shape or r["tokens"] < 4096:
            continue
        T = r["tokens"]
        hf = {x["contestant"]: x for x in rows if x["shape"] == shape and x["tokens"] == T and "median_ms" in x}
        ratio = hf["hf_grouped_mm"]["median_ms"] / r["median_ms"]
        out.append({"target": "≥ 1.2× grouped_mm", "shape": shape, "tokens": T, "value": ratio, "met": ratio >= 1.2})
        out.append({"target": "≥ 50% of bf16 peak", "shape": shape, "tokens": T, "value": r["pct_peak_flops"],
                    "met": r["pct_peak_flops"] >= 50})
    for shape_i in dict.fromkeys(x["shape"] for x in rows):
        for T in sorted({x["tokens"] for x in rows if x["shape"] == shape_i}):
            ours = ours_row(rows, shape_i, T, decode_max_tokens)
            hf = [x for x in rows if x["shape"] == shape_i and x["tokens"] == T and x["contestant"].startswith("hf_")
                  and "median_ms" in x]
            if ours is None or not hf:
                continue
            best = min(hf, key=lambda x: x["median_ms"])
            sp = best["median_ms"] / ours["median_ms"]
            out.append({"target": "never slower than best transformers", "shape": shape_i, "tokens": T,
                        "value": sp, "met": sp >= 1.0, "ours": ours["contestant"], "best_hf": best["contestant"]})
            if T <= 64:
                out.append({"target": "≥ 80% of HBM on expert bytes", "shape": shape_i, "tokens": T,
                            "value": ours["pct_hbm"], "met": ours["pct_hbm"] >= 80, "ours": ours["contestant"]})
                bm = [x for x in hf if x["contestant"] == "hf_batched_mm"]
                if bm:
                    sp = bm[0]["median_ms"] / ours["median_ms"]
                    out.append({"target": "≥ 3× batched_mm", "shape": shape_i, "tokens": T, "value": sp,
                                "met": sp >= 3, "ours": ours["contestant"]})
    return out
