"""Benchmark of the routed experts: transformers' three implementations against ours, same inputs.

    python -m dispatch_book.bench kernels [--shapes olmoe-1b-7b,...] [--tokens 1,8,...] [--quick]
        [--routing uniform|zipf:3|trace] [--peer-budget-s 20] [--skip hf_,ours_no_]

For each shape and token count the routing is drawn once (``--routing``, :mod:`dispatch.tune.routing_dist`;
rows record its name and the draw's busiest/mean expert load; other than uniform they go to
``kernels_skewed.json``, :mod:`dispatch_book.bench.skew`) and given to every contestant; the
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
kernel (``peers``), tuned per size on the race's own inputs (:mod:`~dispatch_book.bench.peer_search`:
vLLM's shipped tables, then its tuner's grid, within ``--peer-budget-s``; the row's ``peer_search``
says what was tried), its alignment step excluded; ``torch_grouped_mm`` (T ≥ 256) torch's grouped
GEMM with transformers' sort and scatter (:mod:`~dispatch_book.bench.torch_grouped`). Ours, the peer
and torch's grouped GEMM are timed under CUDA-graph replay (median of 7 replays of 30 calls), in 3 rounds taken in turn
(``graph_rounds``), with the host time of one eager call recorded apart (``host_us``);
transformers' contestants as a user calls them. ``ours_layer`` times our
whole layer. Ours is checked against the reference before it is timed. Rows: ``results/<gpu>/kernels.json``
with % of the measured read bandwidth (bytes = distinct experts × 3·H·I·2) and % of the measured bf16 peak.
"""
from __future__ import annotations

import argparse
import math
import os

import torch

from dispatch import runtime
from dispatch.config import PRESETS, random_weights
from dispatch.kernels import grouped_gemm as gg
from dispatch.kernels import pdl, tiles, tma
from dispatch.reference import experts_reference, shared_reference
from dispatch.tune import routing_dist
from dispatch_book import bench
from dispatch_book.bench import hf_baselines as hf
from dispatch_book.bench import peer_search, peers, skew, torch_grouped
from dispatch_book.bench.harness import capture_graph, graph_rounds
from dispatch_book.bench.kernels_targets import ours_row, targets  # noqa: F401  (the chapters import them here)
from dispatch_book.bench.peaks import same_bytes_read

SHAPES = ("olmoe-1b-7b", "mixtral-8x7b", "deepseek-moe-16b", "qwen3-30b-a3b")
TOKENS = (1, 8, 64, 256, 1024, 4096, 16384)
QUICK_TOKENS = (1, 64, 1024, 4096)
TOLERANCE = 2e-2  # ‖ours − ref‖ / ‖ref‖ in bf16 (both round differently; the reference rounds more)
MAX_CALL_MS = 2000.0
ROUNDS = 3  # ours and the peer: graph timings taken in 3 interleaved rounds (graph_rounds)
PEER_BUDGET_S = 20.0  # the peer's tile search at one size: seconds, compiling on demand included
GROUPED_MIN_T = 256  # torch's grouped GEMM races from here (below it the decode path is the contest)
GRAPHED = ("ours", "peer", "torch_")  # contestants timed under CUDA graphs, in interleaved rounds


def _ceilings() -> dict:
    """hbm_read_gbps / hbm_copy_gbps / bf16_tflops of this GPU (``dispatch_book.bench.ceilings()``)."""
    return bench.ceilings()


def _within(switch, fn):
    """fn launched (and captured into a graph) inside ``switch()``: ``pdl.disabled`` (plain launches),
    ``tma.disabled`` (the grouped GEMM's tiles by pointer loads)."""
    def run():
        with switch():
            return fn()
    return run


def contestants(cfg, w, x_TH, weights_TK, ids_TK, dev, ref_TH=None, *, routed=None, peer_budget_s=PEER_BUDGET_S):
    """name -> (fn, reason it is skipped or None). Every fn returns y_TH (shared expert included).
    ``routed``: our tiles for the race's routing (``skew.routed_tiles``; None: the tile policy's)."""
    t = routed or {}
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
    crossover = t.get("crossover") or tiles.decode_max_tokens(cfg.K, cfg.E, cfg.H, cfg.I, x_TH.dtype, x_TH.device)
    gemm, dec, dec_shared = t.get("configs"), t.get("decode"), t.get("decode_shared")
    out["ours_grouped"] = (with_shared(lambda: gg.moe_experts(*args, configs=gemm)), None)
    out["ours_decode"] = (with_shared(lambda: moe_decode(*args, config=dec)),
                          None if T <= 256 else "decode path: T ≤ 256")
    decode = "ours_decode"
    if shared_rides_along(cfg):  # moe's decode path runs the shared MLP inside the kernels
        shared = (w.shared_gate_up_2SH, w.shared_down_HS)
        out["ours_decode_shared"] = (lambda: moe_decode(*args, shared=shared, config=dec_shared),
                                     None if T <= 256 else "decode path: T ≤ 256")
        decode = "ours_decode_shared"
    out["ours_grouped"][0].chosen, out["ours_decode"][0].chosen = T > crossover, False
    out[decode][0].chosen = T <= crossover
    chosen = out[decode if T <= crossover else "ours_grouped"][0]
    out["ours_no_pdl"] = (_within(pdl.disabled, chosen), None)
    out["ours_no_tma"] = (_within(tma.disabled, out["ours_grouped"][0]),
                          None if T > crossover else "TMA: the grouped path, timed above the decode crossover")
    out["ours_persistent"] = (with_shared(lambda: moe_experts_persistent(*args, configs=gemm)),
                              None if T >= 256 else "persistent schedule: timed from 256 tokens")
    reason = torch_grouped.unavailable_reason(dev, x_TH.dtype)
    out["torch_grouped_mm"] = (with_shared(lambda: torch_grouped.grouped_mm_experts(*args)),
                               f"did not run: {reason}" if reason else
                               None if T >= GROUPED_MIN_T else f"torch grouped GEMM: timed from {GROUPED_MIN_T} tokens")
    if ref_TH is not None:
        fn, found = peer_search.tuned_peer(cfg, w, *args[:3], ref_TH if not cfg.shared_intermediate_size
                                           else ref_TH - shared_reference(x_TH, cfg, w), dev, TOLERANCE,
                                           peer_budget_s)
        out["peer_fused_moe"] = (with_shared(fn), None)
        out["peer_fused_moe"][0].config, out["peer_fused_moe"][0].search = found["config"], found
    out["ours_layer"] = (lambda: moe(x_TH, cfg, w), None)
    return out


def race_inputs(cfg, T: int, dev, dtype, routing: str = "uniform") -> tuple:
    """(x_TH, weights_TK, ids_TK) of the race at T tokens: one generator on the device seeded 0, x
    from randn, the routing drawn from ``routing`` (uniform: the softmax top-K of randn logits)."""
    g = torch.Generator(device=dev).manual_seed(0)
    x_TH = torch.randn(T, cfg.H, device=dev, generator=g, dtype=torch.float32).to(dtype)
    return (x_TH, *routing_dist.draw(routing, cfg, T, g))


def _check_and_time(cname, fn, ref_TH, T, warmup, rep, graphed, row) -> str | None:
    """Check one contestant and time it (graphed ones later, in rounds) → the reason it has no timing, or
    None. Ours and the peer wrong: the race stops. torch's grouped GEMM wrong or failing: recorded as such."""
    own = cname.startswith(("ours", "peer")) and cname != "ours_layer"
    try:
        row["rel_err"] = err = bench.rel_err(fn(), ref_TH)  # ours_layer routes by its router
        if own and not err <= TOLERANCE:
            raise AssertionError(f"{cname} is wrong on {row['shape']} T={T}: rel err {err:.3g}")
        if cname.startswith("torch_") and not err <= TOLERANCE:
            return f"wrong result: rel err {err:.3g} > {TOLERANCE}"
        if cname.startswith(GRAPHED) and cname != "ours_layer":
            if cname.startswith("torch_") and ref_TH.is_cuda:
                capture_graph(fn, warmup=1)  # capturable? (else no graph timing to compare)
            graphed[cname] = fn
            return None
        t0 = bench.time_ms(fn, warmup=1, rep=1) if T >= 4096 else None
        if t0 and t0["median_ms"] > MAX_CALL_MS:
            return f"takes {t0['median_ms']:.0f} ms a call (> {MAX_CALL_MS:.0f})"
        row.update(bench.time_ms(fn, warmup=warmup, rep=rep))
    except torch.OutOfMemoryError as e:
        torch.cuda.empty_cache()
        return f"out of memory: {str(e).splitlines()[0][:120]}"
    except Exception as e:  # noqa: BLE001 - torch's grouped GEMM: why it did not run is the result
        if own or not cname.startswith("torch_"):
            raise
        return f"did not run: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
    return None


def measure_shape(name: str, tokens, dev, dtype, *, warmup: int, rep: int, log=print, routing: str = "uniform",
                  skip=(), peer_budget_s: float = PEER_BUDGET_S, measured=None) -> list[dict]:
    """The race's rows of one shape at each of ``tokens``, on ``routing``; contestants whose names start
    with one of ``skip`` are recorded as skipped. ``measured(rows)``, if given, after every size with
    the shape's rows so far (a run cut short keeps what it measured)."""
    cfg = PRESETS[name]
    w = random_weights(cfg, dtype=dtype, device=dev)
    ceil, rows = _ceilings(), []
    for T in tokens:
        x_TH, weights_TK, ids_TK = race_inputs(cfg, T, dev, dtype, routing)
        ref_TH = experts_reference(x_TH, weights_TK.to(dtype), ids_TK, w.gate_up_E2IH, w.down_EHI)
        if cfg.shared_intermediate_size:
            ref_TH = ref_TH + shared_reference(x_TH, cfg, w)
        flops = 2 * 3 * cfg.H * (cfg.I * T * cfg.K + cfg.shared_intermediate_size * T)
        n_unique = int(torch.unique(ids_TK).numel())
        weight_bytes = n_unique * 3 * cfg.H * cfg.I * x_TH.element_size()
        routed = skew.routed_tiles(cfg, T, dtype, dev, routing)
        case = {"shape": name, "tokens": T, **routing_dist.describe(routing, cfg, ids_TK), "flops": flops,
                "expert_bytes": weight_bytes, "unique_experts": n_unique}
        graphed, timed = {}, []  # ours, the peer and torch's grouped GEMM: timed after the loop, in rounds
        for cname, (fn, reason) in contestants(cfg, w, x_TH, weights_TK, ids_TK, dev, ref_TH, routed=routed,
                                               peer_budget_s=peer_budget_s).items():
            row = {**case, "contestant": cname}
            if cname.startswith("ours") and cname != "ours_layer":
                row["tiles"] = routed["source"]
            for attr, key in (("config", "config"), ("search", "peer_search"), ("chosen", "chosen")):
                if hasattr(fn, attr):
                    row[key] = getattr(fn, attr)  # chosen: the path moe() takes at this size
            if reason is None and skip and cname.startswith(tuple(skip)):
                reason = "not asked for (--skip)"
            if reason is None:
                reason = _check_and_time(cname, fn, ref_TH, T, warmup, rep, graphed, row)
            if reason is not None:
                row["skipped"] = reason
            timed.append(row)
        if T <= 64 and dev.type == "cuda":  # the same bytes read plainly, timed in the same rounds
            nbytes = weight_bytes + 3 * cfg.H * cfg.shared_intermediate_size * x_TH.element_size()
            graphed["stream_same_bytes"] = same_bytes_read(nbytes, dev)
            timed.append({**case, "contestant": "stream_same_bytes", "flops": 0, "stream_bytes": nbytes})
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
            log(f"{name:18s} T={T:6d} {row['routing']:8s} {row['contestant']:16s} " + (
                f"{row['median_ms'] * 1e3:9.1f} us {row['tflops']:7.1f} TF/s {row['pct_read_bw']:5.1f}% read bw  "
                f"host {row.get('host_us', math.nan):6.1f} us" if "median_ms" in row else f"skipped: {row['skipped']}"))
        del x_TH, ref_TH
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        if measured is not None:
            measured(rows)
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m dispatch_book.bench kernels")
    p.add_argument("--shapes", default=",".join(SHAPES), type=bench.preset_list, help="comma-separated PRESETS names")
    p.add_argument("--tokens", default=None, type=bench.int_list, help="comma-separated token counts")
    p.add_argument("--quick", action="store_true", help=f"tokens {QUICK_TOKENS}, shorter timing")
    skew.add_routing_arg(p)
    p.add_argument("--peer-budget-s", type=float, default=PEER_BUDGET_S, help="the peer's tile search at one "
                   "size: seconds (compiling on demand included)")
    p.add_argument("--skip", default="", help="comma-separated contestant name prefixes not to time (e.g. "
                   "hf_,ours_no_): recorded as skipped")
    p.add_argument("--no-save", action="store_true")
    p.add_argument("--merge", action="store_true", help="keep the recorded file's rows at the sizes this run "
                   "does not measure (its runs listed in 'parts'; refused if GPU, versions or ceilings differ)")
    p.add_argument("--out", default=None, help="results directory (default results/)")
    p.add_argument("--allow-dirty", action="store_true", help=argparse.SUPPRESS)  # read by the harness's CLI
    a = p.parse_args(argv)
    routing = skew.parse_or_exit(a.routing)
    if not runtime.HAS_CUDA:
        raise SystemExit("the kernels benchmark needs a CUDA GPU (the chapters plot the recorded results)")
    shapes = a.shapes
    tokens = a.tokens or (QUICK_TOKENS if a.quick else TOKENS)
    dev, dtype = runtime.device("cuda"), runtime.compute_dtype()
    warmup, rep = (5, 20) if a.quick else (10, 50)
    rows = []
    peers.precompile(peer_search.race_configs(shapes, tokens, dev, routing),
                     workers=max(1, min(14, (os.cpu_count() or 2) - 2)))
    name, saved = skew.results_name("kernels", routing), []

    def save(shape_rows):  # after every size, so that a run cut short keeps what it measured
        if not a.no_save:
            saved.append(_save(rows + shape_rows, a, argv, dtype, name))

    with torch.no_grad():
        for s in shapes:
            rows += measure_shape(s, tokens, dev, dtype, warmup=warmup, rep=rep, routing=routing,
                                  skip=[x for x in a.skip.split(",") if x], peer_budget_s=a.peer_budget_s,
                                  measured=save)
    if saved:
        print(f"saved {saved[-1]}")


def _save(rows, a, argv, dtype, name="kernels"):
    cmd = "python -m dispatch_book.bench kernels " + " ".join(argv or [])
    return bench.save(name, rows, command=cmd.strip(), out=a.out, merge=a.merge,
                      extra={"dtype": str(dtype).replace("torch.", ""), "tolerance_rel": TOLERANCE,
                             "ceilings": _ceilings(),
                             "timing": f"ours/peer/torch grouped: CUDA graph, median of {ROUNDS} interleaved rounds "
                                       "of 7 x 30"})


def at_ceilings(doc: dict, ceil: dict) -> dict:
    """``doc`` (a kernels recording) with its % fields divided by other ceilings (``ceil``: ``hbm_read_gbps``,
    ``bf16_tflops``, e.g. the set's measured ones where a run divided by the datasheet); the measured times,
    TFLOP/s and GB/s are unchanged. Says so in ``rebased``."""
    rows = []
    for r in doc["rows"]:
        r = dict(r)
        if "tflops" in r:
            r["pct_peak_flops"] = 100 * r["tflops"] / ceil["bf16_tflops"]
        if "gbps" in r:
            r["pct_read_bw"] = r["pct_hbm"] = 100 * r["gbps"] / ceil["hbm_read_gbps"]
        rows.append(r)
    note = f"% fields re-based from {doc['ceilings'].get('source', 'other ceilings')} to {ceil.get('source', '')}"
    return {**doc, "ceilings": ceil, "rows": rows, "rebased": note}
