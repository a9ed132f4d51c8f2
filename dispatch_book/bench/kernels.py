"""Benchmark of the routed experts: transformers' three implementations against ours, same inputs.

    python -m dispatch_book.bench kernels [--shapes olmoe-1b-7b,...] [--tokens 1,8,...] [--quick]

For each shape and token count the routing is computed once and given to every contestant; the
timed call is the experts part (plus the shared expert in torch, for every contestant alike, where
the layer has one). ``ours_grouped`` / ``ours_decode`` are our two paths (tiles from
``dispatch.kernels.tiles``); the row of the one ``moe`` picks (decode for T ≤ the tuned crossover) has
``chosen``; ``ours_persistent`` the grouped path under the persistent schedule (from 256 tokens);
``ours_decode_shared`` (layers whose shared expert rides along, ``moe.shared_rides_along``; T ≤ 256)
the decode kernels with the shared MLP run as S / I more experts (``moe_decode(shared=)``, what ``moe``
runs on the decode path there) where ``ours_decode`` adds the shared expert in torch;
``stream_same_bytes`` (T ≤ 64) is no layer: a plain read of the bytes the layer reads (the distinct
routed experts, plus the shared expert where there is one), one contiguous buffer
(``peaks.same_bytes_read``), timed in the same rounds — what streaming alone costs at that size;
``ours_no_pdl`` the path ``moe`` picks with plain launches (no programmatic dependent launch, chapter 6:
what PDL is worth at each size, measured in the same run); ``ours_no_tma`` (above the crossover) the
grouped path with pointer loads where it would use TMA (``dispatch.kernels.tma``: what TMA is worth);
``peer_fused_moe`` a vLLM-design fused-MoE
kernel (``peers``), best of its configs per size, its alignment step excluded. Ours and the peer are
timed under CUDA-graph replay (median of 7 replays of 30 calls), in 3 rounds taken in turn
(``graph_rounds``), with the host time of one eager call recorded apart (``host_us``);
transformers' contestants as a user calls them. ``ours_layer`` times our
whole layer. Ours is checked against the reference before it is timed. Rows: ``results/<gpu>/kernels.json``
with % of the measured read bandwidth (bytes = distinct experts × 3·H·I·2) and % of the measured bf16 peak.
"""
from __future__ import annotations

import argparse
import math

import torch

from dispatch import runtime
from dispatch.config import PRESETS, random_weights
from dispatch.kernels import grouped_gemm as gg
from dispatch.kernels import pdl, tiles, tma
from dispatch.reference import experts_reference, route_reference, shared_reference
from dispatch_book import bench
from dispatch_book.bench import hf_baselines as hf
from dispatch_book.bench import peers
from dispatch_book.bench.harness import graph_rounds
from dispatch_book.bench.peaks import same_bytes_read

SHAPES = ("olmoe-1b-7b", "mixtral-8x7b", "deepseek-moe-16b", "qwen3-30b-a3b")
TOKENS = (1, 8, 64, 256, 1024, 4096, 16384)
QUICK_TOKENS = (1, 64, 1024, 4096)
TOLERANCE = 2e-2  # ‖ours − ref‖ / ‖ref‖ in bf16 (both round differently; the reference rounds more)
MAX_CALL_MS = 2000.0
ROUNDS = 3  # ours and the peer: graph timings taken in 3 interleaved rounds (graph_rounds)


def _ceilings() -> dict:
    """hbm_read_gbps / hbm_copy_gbps / bf16_tflops of this GPU (``dispatch_book.bench.ceilings()``)."""
    return bench.ceilings()


def peer(cfg, w, x_TH, weights_TK, ids_TK, ref_TH, dev):
    """The vLLM-design peer at its best config for this size: (fn, config). Configs are checked, then
    ranked by a short graph timing; the alignment runs outside the timed call."""
    from dispatch.tune.search import graph_us

    T, K = ids_TK.shape
    aligned = {bm: peers.align(ids_TK, cfg.E, bm) for bm in {c[0] for c in peers.CONFIGS}}
    best = None
    for c in peers.candidates(T, K, cfg.E):
        def fn(c=c):
            return peers.fused_moe(x_TH, weights_TK, ids_TK, w.gate_up_E2IH, w.down_EHI, aligned[c[0]], c)
        try:
            if not bench.rel_err(fn(), ref_TH) <= TOLERANCE:
                continue
            us = graph_us(fn, reps=3) if dev.type == "cuda" else 0.0
        except Exception:  # noqa: BLE001, S112 - a config that does not fit this GPU is not a contestant
            continue
        best = (us, fn, c) if best is None or us < best[0] else best
    return best[1], best[2]


def _within(switch, fn):
    """fn launched (and captured into a graph) inside ``switch()``: ``pdl.disabled`` (plain launches),
    ``tma.disabled`` (the grouped GEMM's tiles by pointer loads)."""
    def run():
        with switch():
            return fn()
    return run


def contestants(cfg, w, x_TH, weights_TK, ids_TK, dev, ref_TH=None):
    """name -> (fn, reason it is skipped or None). Every fn returns y_TH (shared expert included)."""
    def with_shared(fn):
        return lambda: fn() if not cfg.shared_intermediate_size else fn() + shared_reference(x_TH, cfg, w)

    from dispatch.kernels.gemv import moe_decode
    from dispatch.kernels.persistent import moe_experts_persistent
    from dispatch.moe import moe, shared_rides_along

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
    args = (x_TH, weights_TK, ids_TK, w.gate_up_E2IH, w.down_EHI)
    crossover = tiles.decode_max_tokens(cfg.K, cfg.E, cfg.H, cfg.I, x_TH.dtype, x_TH.device)
    out["ours_grouped"] = (with_shared(lambda: gg.moe_experts(*args)), None)
    out["ours_decode"] = (with_shared(lambda: moe_decode(*args)), None if T <= 256 else "decode path: T ≤ 256")
    decode = "ours_decode"
    if shared_rides_along(cfg):  # moe's decode path runs the shared MLP inside the kernels
        shared = (w.shared_gate_up_2SH, w.shared_down_HS)
        out["ours_decode_shared"] = (lambda: moe_decode(*args, shared=shared),
                                     None if T <= 256 else "decode path: T ≤ 256")
        decode = "ours_decode_shared"
    out["ours_grouped"][0].chosen, out["ours_decode"][0].chosen = T > crossover, False
    out[decode][0].chosen = T <= crossover
    chosen = out[decode if T <= crossover else "ours_grouped"][0]
    out["ours_no_pdl"] = (_within(pdl.disabled, chosen), None)
    out["ours_no_tma"] = (_within(tma.disabled, out["ours_grouped"][0]),
                          None if T > crossover else "TMA: the grouped path, timed above the decode crossover")
    out["ours_persistent"] = (with_shared(lambda: moe_experts_persistent(*args)),
                              None if T >= 256 else "persistent schedule: timed from 256 tokens")
    if ref_TH is not None:
        fn, c = peer(cfg, w, *args[:3], ref_TH if not cfg.shared_intermediate_size
                     else ref_TH - shared_reference(x_TH, cfg, w), dev)
        out["peer_fused_moe"] = (with_shared(fn), None)
        out["peer_fused_moe"][0].config = c
    out["ours_layer"] = (lambda: moe(x_TH, cfg, w), None)
    return out


def race_inputs(cfg, T: int, dev, dtype) -> tuple:
    """(x_TH, weights_TK, ids_TK) of the race at T tokens: one generator on the device seeded 0, x
    from randn, routing the softmax top-K of randn logits."""
    g = torch.Generator(device=dev).manual_seed(0)
    x_TH = torch.randn(T, cfg.H, device=dev, generator=g, dtype=torch.float32).to(dtype)
    return (x_TH, *route_reference(torch.randn(T, cfg.E, device=dev, generator=g), cfg))


def measure_shape(name: str, tokens, dev, dtype, *, warmup: int, rep: int, log=print) -> list[dict]:
    cfg = PRESETS[name]
    w = random_weights(cfg, dtype=dtype, device=dev)
    ceil, rows = _ceilings(), []
    for T in tokens:
        x_TH, weights_TK, ids_TK = race_inputs(cfg, T, dev, dtype)
        ref_TH = experts_reference(x_TH, weights_TK.to(dtype), ids_TK, w.gate_up_E2IH, w.down_EHI)
        if cfg.shared_intermediate_size:
            ref_TH = ref_TH + shared_reference(x_TH, cfg, w)
        flops = 2 * 3 * cfg.H * (cfg.I * T * cfg.K + cfg.shared_intermediate_size * T)
        n_unique = int(torch.unique(ids_TK).numel())
        weight_bytes = n_unique * 3 * cfg.H * cfg.I * x_TH.element_size()
        graphed, timed = {}, []  # ours and the peer are timed after the loop, in interleaved rounds
        for cname, (fn, reason) in contestants(cfg, w, x_TH, weights_TK, ids_TK, dev, ref_TH).items():
            row = {"shape": name, "tokens": T, "contestant": cname, "flops": flops,
                   "expert_bytes": weight_bytes, "unique_experts": n_unique}
            if hasattr(fn, "config"):
                row["config"] = list(fn.config)
            if hasattr(fn, "chosen"):
                row["chosen"] = fn.chosen  # the path moe() takes at this size
            if reason is None:
                try:
                    row["rel_err"] = err = bench.rel_err(fn(), ref_TH)  # ours_layer routes by its router
                    if cname.startswith(("ours", "peer")) and cname != "ours_layer" and not err <= TOLERANCE:
                        raise AssertionError(f"{cname} is wrong on {name} T={T}: rel err {err:.3g}")
                    if cname.startswith(("ours", "peer")) and cname != "ours_layer":
                        graphed[cname] = fn
                    else:
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
            timed.append(row)
        if T <= 64 and dev.type == "cuda":  # the same bytes read plainly, timed in the same rounds
            nbytes = weight_bytes + 3 * cfg.H * cfg.shared_intermediate_size * x_TH.element_size()
            graphed["stream_same_bytes"] = same_bytes_read(nbytes, dev)
            timed.append({"shape": name, "tokens": T, "contestant": "stream_same_bytes", "flops": 0,
                          "expert_bytes": weight_bytes, "stream_bytes": nbytes, "unique_experts": n_unique})
        for cname, t in graph_rounds(graphed, ROUNDS).items():
            next(r for r in timed if r["contestant"] == cname).update(t)
        for row in timed:
            if "median_ms" in row:
                s = row["median_ms"] / 1e3
                row["tflops"] = flops / s / 1e12
                row["pct_peak_flops"] = 100 * row["tflops"] / ceil["bf16_tflops"]
                row["gbps"] = row.get("stream_bytes", weight_bytes) / s / 1e9
                row["pct_read_bw"] = 100 * row["gbps"] / ceil["hbm_read_gbps"]
                row["pct_hbm"] = row["pct_read_bw"]
            rows.append(row)
            log(f"{name:18s} T={T:6d} {row['contestant']:15s} " + (
                f"{row['median_ms'] * 1e3:9.1f} us {row['tflops']:7.1f} TF/s {row['pct_read_bw']:5.1f}% read bw  "
                f"host {row.get('host_us', math.nan):6.1f} us" if "median_ms" in row else f"skipped: {row['skipped']}"))
        del x_TH, ref_TH
        torch.cuda.empty_cache()
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m dispatch_book.bench kernels")
    p.add_argument("--shapes", default=",".join(SHAPES), type=bench.preset_list, help="comma-separated PRESETS names")
    p.add_argument("--tokens", default=None, type=bench.int_list, help="comma-separated token counts")
    p.add_argument("--quick", action="store_true", help=f"tokens {QUICK_TOKENS}, shorter timing")
    p.add_argument("--no-save", action="store_true")
    p.add_argument("--merge", action="store_true", help="keep the recorded file's rows at the sizes this run "
                   "does not measure (its runs listed in 'parts'; refused if GPU, versions or ceilings differ)")
    p.add_argument("--out", default=None, help="results directory (default results/)")
    p.add_argument("--allow-dirty", action="store_true", help=argparse.SUPPRESS)  # read by the harness's CLI
    a = p.parse_args(argv)
    if not runtime.HAS_CUDA:
        raise SystemExit("the kernels benchmark needs a CUDA GPU (the chapters plot the recorded results)")
    shapes = a.shapes
    tokens = a.tokens or (QUICK_TOKENS if a.quick else TOKENS)
    dev, dtype = runtime.device("cuda"), runtime.compute_dtype()
    warmup, rep = (5, 20) if a.quick else (10, 50)
    rows = []
    peers.precompile()  # the peer's 14 configs compile in parallel, not one by one inside the race
    with torch.no_grad():
        for s in shapes:
            rows += measure_shape(s, tokens, dev, dtype, warmup=warmup, rep=rep)
            if not a.no_save:  # after every shape, so that a run cut short keeps what it measured
                path = _save(rows, a, argv, dtype)
    if not a.no_save:
        print(f"saved {path}")


def _save(rows, a, argv, dtype):
    cmd = "python -m dispatch_book.bench kernels " + " ".join(argv or [])
    return bench.save("kernels", rows, command=cmd.strip(), out=a.out, merge=a.merge,
                      extra={"dtype": str(dtype).replace("torch.", ""), "tolerance_rel": TOLERANCE,
                             "ceilings": _ceilings(),
                             "timing": f"ours/peer: CUDA graph, median of {ROUNDS} interleaved rounds of 7 x 30"})


def ours_row(rows: list[dict], shape: str, T: int, decode_max_tokens: int) -> dict | None:
    """The row of the experts path that ``moe(path="auto")`` takes at this size (recorded ``chosen``,
    else the given crossover)."""
    by = {r["contestant"]: r for r in rows if r["shape"] == shape and r["tokens"] == T and "median_ms" in r}
    chosen = [r for r in by.values() if r.get("chosen")]
    if chosen:
        return chosen[0]
    return by.get("ours_decode" if T <= decode_max_tokens else "ours_grouped") or by.get("ours_grouped")


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
            peer = [x for x in rows if x["shape"] == shape_i and x["tokens"] == T and "median_ms" in x
                    and x["contestant"] == "peer_fused_moe"]
            if peer:
                sp = peer[0]["median_ms"] / ours["median_ms"]
                need = 1.10 if T >= 4096 else 1.0
                out.append({"target": f"≥ {need:.2f}× the tuned fused-MoE peer", "shape": shape_i, "tokens": T,
                            "value": sp, "met": sp >= need, "ours": ours["contestant"]})
            if T == 16384 and shape_i in ("olmoe-1b-7b", "mixtral-8x7b"):
                out.append({"target": "≥ 65% of bf16 peak", "shape": shape_i, "tokens": T,
                            "value": ours["pct_peak_flops"], "met": ours["pct_peak_flops"] >= 65})
            best = min(hf, key=lambda x: x["median_ms"])
            sp = best["median_ms"] / ours["median_ms"]
            out.append({"target": "never slower than best transformers", "shape": shape_i, "tokens": T,
                        "value": sp, "met": sp >= 1.0, "ours": ours["contestant"], "best_hf": best["contestant"]})
            if T <= 64:
                out.append({"target": "≥ 85% of read bandwidth on expert bytes", "shape": shape_i, "tokens": T,
                            "value": ours["pct_hbm"], "met": ours["pct_hbm"] >= 85, "ours": ours["contestant"]})
                bm = [x for x in hf if x["contestant"] == "hf_batched_mm"]
                if bm:
                    sp = bm[0]["median_ms"] / ours["median_ms"]
                    out.append({"target": "≥ 3× batched_mm", "shape": shape_i, "tokens": T, "value": sp,
                                "met": sp >= 3, "ours": ours["contestant"]})
    return out
