"""Benchmark of quantized experts: bf16 (ours) vs int8 and fp8 codes, T = 1 … 16384, CUDA graphs.

    python -m dispatch_book.bench quant [--out results] [--shapes a,b] [--tokens 1,64,4096] [--quick]
        [--routing zipf:3]

``--quick`` (about two minutes on an H200, most of it compiling): OLMoE and Mixtral, T = 1, 8, 64
(decode) and 4096, 16384 (grouped), the int8-channel and fp8-block128 schemes (+ w8a8), and the
layer errors of those two shapes only.

For each shape the bf16 experts are quantized with every scheme of :data:`dispatch.quant.SCHEMES`;
for each token count one routing (``--routing``, :mod:`dispatch.tune.routing_dist`: by default the
softmax top-K of random logits; rows record its name and the draw's busiest/mean expert load; other
than uniform, rows go to ``quant_skewed.json``; tiles: the tile policy's) is given to every contestant:

    T ≤ 64   bf16 ``moe_decode``  vs  ``moe_decode_quant`` (w8a16) per scheme, and w8a8 (fp8 schemes),
             and fp8 codes beside fp16 activations (``<scheme>+fp16``: a model run in fp16, x cast
             outside the timed call, the weight-only tiles)
    T > 64   bf16 ``moe_experts`` vs  ``moe_experts_quant`` w8a16 per scheme, and w8a8 (fp8 schemes),
             also with TMA off (``<scheme>+w8a8 no TMA``: what the descriptor loads are worth, Hopper)
    any T    ``hf_fp8``: transformers' own fp8 experts on the fp8-block128 codes, where it runs
             (it fetches its kernels from the Hugging Face Hub: offline, the reason is recorded)

Every contestant is timed as the kernels race times ours and the peer's: a CUDA graph of 30 calls,
replayed 7 times, the median per call (``"timing": "graph_7x30"`` in the results file; a recording
without that key timed one call per replay, the graph's own launch included). Bandwidth counts
the bytes actually stored: distinct experts used × (codes + scales) for the quantized ones,
× 3·H·I·2 for bf16, over the device's HBM read ceiling. Each contestant is checked against its
plain-PyTorch twin before it is timed (``hf_fp8``, which has none, against bf16). Also recorded:
every scheme's exact expert bytes per layer, and the per-layer error of every preset
(:func:`dispatch.quant.layer_error`, 8 experts sampled). Rows → ``results/<gpu>/quant.json``.
"""
from __future__ import annotations

import argparse
import functools

import torch

from dispatch import quant, runtime
from dispatch.config import PRESETS, random_weights
from dispatch.kernels import quant_kernels, tma
from dispatch.kernels.gemv import moe_decode
from dispatch.kernels.grouped_gemm import moe_experts
from dispatch.kernels.quant_gemv import moe_decode_quant, moe_decode_quant_torch, quant_tiles
from dispatch.kernels.quant_grouped import moe_experts_quant, moe_experts_quant_torch
from dispatch.tune import routing_dist
from dispatch_book import bench
from dispatch_book.bench import hf_baselines, skew
from dispatch_book.bench.kernels import _within

SHAPES = ("olmoe-1b-7b", "qwen3-30b-a3b", "deepseek-moe-16b", "mixtral-8x7b")
TOKENS = (1, 8, 64, 256, 1024, 4096, 16384)
QUICK_SHAPES = ("olmoe-1b-7b", "mixtral-8x7b")
QUICK_TOKENS = (1, 8, 64, 4096, 16384)
QUICK_SCHEMES = ("int8-channel", "fp8-block128", "fp8-channel")
TWIN_TOL = 2e-2  # ‖kernel − twin‖ / ‖twin‖ in bf16
QUANT_TOL = {"int8": 3e-2, "fp8": 8e-2, "w8a8": 0.1}  # ‖quantized − bf16‖ / ‖bf16‖


def read_ceiling() -> tuple[float, str]:
    """HBM read bytes/s of this GPU and where the number comes from (``bench.ceilings``)."""
    c = bench.ceilings()
    return c["hbm_read_gbps"] * 1e9, c["source"]


def graph_time(fn) -> dict:
    """Milliseconds per call, timed as the kernels race times ours and the peer's
    (:func:`dispatch_book.bench.harness.graph_7x30`: a CUDA graph of 30 calls, replayed 7 times),
    so the graph's own launch is not in a small-T call's time."""
    from dispatch_book.bench.harness import graph_7x30

    return graph_7x30(fn)


def contestants(T, x, w_TK, ids, gu, dn, qes):
    """name → (fn, twin or None, error family) for this token count. ``hf_fp8`` (transformers' own
    fp8 experts on the fp8-block128 codes) has no twin: it is checked against bf16 only."""
    if T <= 64:
        out = {"bf16": (lambda: moe_decode(x, w_TK, ids, gu, dn), None, None)}
        for s, qe in qes.items():
            out[s] = (lambda q=qe: moe_decode_quant(x, w_TK, ids, q),
                      lambda q=qe: moe_decode_quant_torch(x, w_TK, ids, q), s.split("-")[0])
            if s.startswith("fp8"):  # on fp8 activations (on sm_90's 16-row tiles: fp16 MMAs, chapter 7)
                out[s + "+w8a8"] = (lambda q=qe: moe_decode_quant(x, w_TK, ids, q, w8a8=True),
                                    lambda q=qe: moe_decode_quant_torch(x, w_TK, ids, q, w8a8=True), "w8a8")
                out[s + "+fp16"] = _fp16_contestant(x, w_TK, ids, qe)
    else:
        out = {"bf16": (lambda: moe_experts(x, w_TK, ids, gu, dn), None, None)}
        for s, qe in qes.items():
            out[s] = (lambda q=qe: moe_experts_quant(x, w_TK, ids, q),
                      lambda q=qe: moe_experts_quant_torch(x, w_TK, ids, q), s.split("-")[0])
            if s.startswith("fp8"):
                out[s + "+w8a8"] = (lambda q=qe: moe_experts_quant(x, w_TK, ids, q, w8a8=True),
                                    lambda q=qe: moe_experts_quant_torch(x, w_TK, ids, q, w8a8=True), "w8a8")
                out[s + "+w8a8 no TMA"] = (_within(tma.disabled, out[s + "+w8a8"][0]), out[s + "+w8a8"][1], "w8a8")
    if "fp8-block128" in qes:
        build = functools.cache(lambda: hf_baselines.fp8_experts(qes["fp8-block128"]))
        out["hf_fp8"] = (lambda: build()(x, ids, w_TK.to(x.dtype)), None, "w8a8")
    return out


def _fp16_contestant(x, w_TK, ids, qe):
    """(fn, twin, family) of fp8 codes beside fp16 activations — a model run in fp16 — on the tiles the
    weight-only contestant runs (x's dtype's entry): codes unpacked to fp16 by the hardware instead of
    placed into bf16 (chapter 7 counts the loops). x is cast once, outside the timed call."""
    x16, cfg = x.half(), quant_tiles(x, ids.shape[1], qe)
    return (lambda: moe_decode_quant(x16, w_TK, ids, qe, config=cfg),
            lambda: moe_decode_quant_torch(x16, w_TK, ids, qe), "fp8")


def measure(name: str, tokens, dev, read_bps: float, *, timer=graph_time, log=print,
            schemes=quant.SCHEMES, routing: str = "uniform") -> tuple[list[dict], list[dict]]:
    """(rows per token count, memory rows per scheme) of one shape; ``timer(fn)`` → time_ms dict."""
    cfg = PRESETS[name]
    dt = runtime.compute_dtype(dev)
    w = random_weights(cfg, dtype=dt, device=dev)
    gu, dn = w.gate_up_E2IH, w.down_EHI
    cap = runtime.capability(dev)
    schemes = [s for s in schemes if s.startswith("int8") or cap is None or cap >= (8, 9)]
    qes = {s: quant.quantize_experts(gu, dn, s) for s in schemes}
    bf16_bytes = 2 * (gu.numel() + dn.numel())
    memory = [{"shape": name, "scheme": s, "expert_bytes": qe.nbytes(), "bf16_bytes": bf16_bytes,
               "ratio": qe.nbytes() / bf16_bytes} for s, qe in qes.items()]
    per_expert = {"bf16": bf16_bytes // cfg.E, **{s: qe.nbytes() // cfg.E for s, qe in qes.items()}}
    rows = []
    for T in tokens:
        g = torch.Generator(device=dev).manual_seed(T)
        x = torch.randn(T, cfg.H, generator=g, device=dev).to(dt)
        w_TK, ids = routing_dist.draw(routing, cfg, T, g)
        uniq = int(torch.unique(ids).numel())
        row = {"shape": name, "tokens": T, **routing_dist.describe(routing, cfg, ids), "unique_experts": uniq,
               "path": "decode" if T <= 64 else "grouped", "contestants": {}}
        with torch.no_grad():
            fns = contestants(T, x, w_TK, ids, gu, dn, qes)
            y_bf16 = fns["bf16"][0]()
            for cname, (fn, twin, family) in fns.items():
                try:
                    y = fn()
                except Exception as e:  # noqa: BLE001 - transformers' paths: e.g. no Hub access
                    if not cname.startswith("hf_"):
                        raise
                    row["contestants"][cname] = {"skipped": f"{type(e).__name__}: {e}"[:300]}
                    continue
                r = {}
                if family is not None:
                    r["rel_err_bf16"] = bench.rel_err(y, y_bf16)
                    if twin is not None:
                        r["rel_err_twin"] = bench.rel_err(y, twin())
                    if r.get("rel_err_twin", 0.0) > TWIN_TOL or r["rel_err_bf16"] > QUANT_TOL[family]:
                        raise AssertionError(f"{cname} is wrong on {name} T={T}: {r}")
                r.update(timer(fn))
                nbytes = uniq * per_expert[cname.split("+")[0]]
                r.update(bytes_read=nbytes, pct_read_bw=100 * nbytes / (r["median_ms"] * 1e-3) / read_bps)
                row["contestants"][cname] = r
        base = row["contestants"]["bf16"]["median_ms"]
        timed = {k: v for k, v in row["contestants"].items() if "median_ms" in v}
        for r in timed.values():
            r["speedup_vs_bf16"] = base / r["median_ms"]
        rows.append(row)
        log(f"{name:16s} T={T:5d} " + " ".join(f"{k} {v['median_ms'] * 1e3:8.1f}us ({v['speedup_vs_bf16']:.2f}x, "
                                               f"{v['pct_read_bw']:.0f}%)" for k, v in timed.items())
            + "".join(f" {k} skipped ({v['skipped']})" for k, v in row["contestants"].items() if k not in timed))
        del x
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return rows, memory


def layer_errors(dev, presets=tuple(PRESETS), schemes=quant.SCHEMES) -> list[dict]:
    """Per-layer error of each scheme on each preset (8 experts sampled, 256 tokens)."""
    out = []
    for name in presets:
        cfg = PRESETS[name]
        for s in schemes:
            out.append({"preset": name, "scheme": s, **quant.layer_error(cfg, s, experts=8, tokens=256, device=dev)})
    return out


def figure(doc: dict):
    """Speed-up over bf16 at every T (top) and % of the read ceiling in stored bytes (bottom, decode)."""
    import matplotlib.pyplot as plt

    from dispatch_book.figures import SMALL_PT, WIDTH_IN

    shapes = list(dict.fromkeys(r["shape"] for r in doc["rows"]))
    width = min(WIDTH_IN, 1.0 + 2.6 * len(shapes))  # inches: the book's widest at most
    fig, axes = plt.subplots(2, len(shapes), figsize=(width, 6.2), squeeze=False, sharey="row")
    names = [c for c in dict.fromkeys(c for r in doc["rows"] for c in r["contestants"]) if not c.endswith("no TMA")]
    top = 100.0  # the lower panels' ceiling: 100%, or the highest point (a read can beat the 4 GiB ceiling)
    for j, shape in enumerate(shapes):
        rows = [r for r in doc["rows"] if r["shape"] == shape]
        for name in names:
            pts = [(r["tokens"], r["contestants"][name]) for r in rows
                   if "median_ms" in r["contestants"].get(name, {})]
            if not pts:
                continue  # a contestant that never ran (its reason is recorded in the rows)
            style = dict(marker="o", ms=3, label=name, ls="--" if "w8a8" in name else "-")
            axes[0, j].plot([t for t, _ in pts], [c["speedup_vs_bf16"] for _, c in pts], **style)
            dec = [(t, c) for t, c in pts if t <= 64]
            axes[1, j].plot([t for t, _ in dec], [c["pct_read_bw"] for _, c in dec], **style)
            top = max([top] + [c["pct_read_bw"] for _, c in dec])
        axes[0, j].set(title=shape, xscale="log", xlabel="tokens T")
        axes[1, j].set(xscale="log", xlabel="tokens T (decode path)")
    axes[1, 0].set_ylim(0, 1.05 * top)  # shared by the row
    axes[0, 0].set_ylabel("speed-up over our bf16")
    axes[1, 0].set_ylabel("% of HBM read bandwidth\n(bytes as stored)")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    for ax in axes[0]:  # one legend below the panels, covering no curve: every contestant, once
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, fontsize=SMALL_PT, loc="lower center", ncol=3, frameon=False)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m dispatch_book.bench quant")
    p.add_argument("--shapes", default=None, type=bench.preset_list, help=f"default {','.join(SHAPES)}")
    p.add_argument("--tokens", default=None, type=bench.int_list, help=f"default {','.join(map(str, TOKENS))}")
    p.add_argument("--quick", action="store_true",
                   help=f"shapes {QUICK_SHAPES}, tokens {QUICK_TOKENS}, schemes {QUICK_SCHEMES} (~2 min)")
    skew.add_routing_arg(p)
    bench.add_output_args(p)
    a = p.parse_args(argv)
    routing = skew.parse_or_exit(a.routing)
    if not runtime.HAS_CUDA:
        raise SystemExit("the quant benchmark needs a CUDA GPU (chapter 7 plots the recorded results instead)")
    dev = torch.device("cuda")
    read_bps, source = read_ceiling()
    shapes = a.shapes or (QUICK_SHAPES if a.quick else SHAPES)
    tokens = tuple(a.tokens) if a.tokens else QUICK_TOKENS if a.quick else TOKENS
    schemes = QUICK_SCHEMES if a.quick else quant.SCHEMES
    rows, memory = [], []
    extra = {"read_bps": read_bps, "read_bps_source": source, "memory": memory,
             "dtype": str(runtime.compute_dtype(dev)), "quick": a.quick, "timing": "graph_7x30",
             "fp8_convert": "bits" if quant_kernels.BITS_CVT else "hw"}
    for name in shapes:
        r, m = measure(name, tokens, dev, read_bps, schemes=schemes, routing=routing)
        rows += r
        memory += m
        # after every shape: a run cut short keeps what it measured
        bench.save(skew.results_name("quant", routing), rows, out=a.out, allow_dirty=a.allow_dirty, extra=extra)
    extra["layer_errors"] = layer_errors(dev, QUICK_SHAPES if a.quick else tuple(PRESETS), schemes)
    path = bench.save(skew.results_name("quant", routing), rows, out=a.out, allow_dirty=a.allow_dirty, extra=extra)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()


def peer_said(doc: dict | None, name: str = "hf_fp8", ours: str = "fp8-block128") -> str:
    """What a recording holds of transformers' fp8 experts (``name``), as a clause for the prose: at how
    many sizes it ran and its time over ours on the same codes, or why it did not run."""
    cells = [r["contestants"][name] for r in (doc or {}).get("rows", []) if name in r["contestants"]]
    if not cells:
        return "the recording did not include it"
    ran = [c for c in cells if "median_ms" in c]
    if not ran:
        why = cells[0].get("skipped") or cells[0].get("error") or "no time recorded"
        return f"it did not run at any of the {len(cells)} sizes ({why[:120]})"
    x = [r["contestants"][name]["median_ms"] / r["contestants"][ours]["median_ms"] for r in doc["rows"]
         if "median_ms" in r["contestants"].get(name, {}) and "median_ms" in r["contestants"].get(ours, {})]
    span = f", at {min(x):.2f}–{max(x):.2f}× the time of ours on the same codes" if x else ""
    return f"it ran at {len(ran)} of the {len(cells)} sizes{span}"
