"""Chapter 2's tuning and race tables, read from recorded files (no GPU needed).

* the tuned tile table (``dispatch/tables/<gpu>.json``, written by ``python -m dispatch.tune``):
  tuned against heuristic time per preset and token bucket, the winning tiles, the crossover;
* the kernels race (``results/<gpu>/kernels.json``): the path ``moe()`` picks (the row marked
  ``chosen``) against the tuned fused-MoE peer, and the plain against the persistent schedule.

Legend: T tokens, E experts, I expert intermediate, K experts per token; µs per call.
"""
from __future__ import annotations

import matplotlib.pyplot as plt

from dispatch import tables
from dispatch.config import PRESETS
from dispatch_book.figures import SMALL_PT, WIDTH_IN, color

GEMM_FIELDS = ("block_m", "block_n", "block_k", "num_warps", "num_stages", "group_m")


def entry_of(doc: dict, preset: str, dtype: str = "bfloat16") -> dict | None:
    """The table entry of a PRESETS name (its E, H, I, K), or None if the table has none."""
    c = PRESETS[preset]
    return doc.get("entries", {}).get(tables.shape_key(c.E, c.H, c.I, c.K, dtype))


def gemm_tiles(d: dict) -> str:
    """{'block_m': 128, 'block_n': 256, 'block_k': 64, 'num_warps': 8, ...} → '128×256×64 w8 s3 g16'
    (BLOCK_M×N×K, warps, stages, group_m)."""
    return (f"{d['block_m']}×{d['block_n']}×{d['block_k']} "
            f"w{d['num_warps']} s{d['num_stages']} g{d['group_m']}")


def decode_tiles(d: dict) -> str:
    """A DecodeConfig dict → 'i32·h256 ho64·id128 p528' (up tile, down tile, programs), '+1L' in one launch."""
    one = " 1L" if d.get("fused") else ""
    return f"i{d['block_i']}·h{d['block_h']} ho{d['block_ho']}·id{d['block_id']} p{d['programs']}{one}"


def tuned_rows(doc: dict, presets, buckets) -> list[dict]:
    """Per preset and bucket: the path ``moe()`` takes there (decode for T ≤ the crossover), its
    heuristic and tuned µs, the gain (heuristic / tuned) and the tuned tiles."""
    out = []
    for p in presets:
        e = entry_of(doc, p)
        for T in buckets:
            b = (e or {}).get("buckets", {}).get(str(T))
            if not b:
                continue
            path = "decode" if T <= e["crossover"] and "decode_us" in b else "grouped"
            h, t = b[f"{path}_heuristic_us"], b[f"{path}_us"]
            tiles_ = (decode_tiles(b["decode"]) if path == "decode"
                      else f"up {gemm_tiles(b['up'])}; down {gemm_tiles(b['down'])}")
            out.append({"preset": p, "T": T, "path": path, "heuristic µs": h,
                        "tuned µs": t, "gain": h / t, "tuned tiles": tiles_})
    return out


def crossovers(doc: dict, presets) -> list[dict]:
    """Per preset: E, I, K and the tuned crossover (the decode path for T ≤ it)."""
    out = []
    for p in presets:
        e, c = entry_of(doc, p), PRESETS[p]
        if e:
            out.append({"preset": p, "E": c.E, "I": c.I, "K": c.K, "decode for T ≤": e["crossover"]})
    return out


def winners(doc: dict, presets, lo: int, hi: int) -> dict[str, dict[str, list[int]]]:
    """The values each tile field takes among the tuned grouped-GEMM winners of buckets lo ≤ T ≤ hi:
    {"up": {"block_m": [16, 32], ...}, "down": {...}} (sorted, distinct)."""
    seen = {k: {f: set() for f in GEMM_FIELDS} for k in ("up", "down")}
    for p in presets:
        for T, b in (entry_of(doc, p) or {}).get("buckets", {}).items():
            if lo <= int(T) <= hi and "up" in b:
                for kind in ("up", "down"):
                    for f in GEMM_FIELDS:
                        seen[kind][f].add(b[kind][f])
    return {k: {f: sorted(v) for f, v in fs.items()} for k, fs in seen.items()}


def _row(rows, shape, T, name):
    r = [x for x in rows if x["shape"] == shape and x["tokens"] == T
         and x["contestant"] == name and "median_ms" in x]
    return r[0] if r else None


def peer_race(rows: list[dict], ours_row) -> list[dict]:
    """Per shape and T where both ran: ``ours_row(shape, T)`` (the chosen path) against
    ``peer_fused_moe``, µs each and peer / ours (> 1: ours is faster); "by round": the lowest and
    highest peer / ours over the recording's interleaved timing rounds, where it has them."""
    out = []
    for s in dict.fromkeys(r["shape"] for r in rows):
        for T in sorted({r["tokens"] for r in rows if r["shape"] == s}):
            o, p = ours_row(s, T), _row(rows, s, T, "peer_fused_moe")
            if o is None or p is None:
                continue
            out.append({"shape": s, "T": T, "ours": o["contestant"].removeprefix("ours_"),
                        "ours µs": o["median_ms"] * 1e3, "peer µs": p["median_ms"] * 1e3,
                        "peer / ours": p["median_ms"] / o["median_ms"]})
            if "round_medians_ms" in o and "round_medians_ms" in p:
                by = [b / a for a, b in zip(o["round_medians_ms"], p["round_medians_ms"], strict=True)]
                out[-1]["by round"] = f"{min(by):.2f}–{max(by):.2f}"
    return out


def race_summary(race: list[dict], large_T: int = 4096, bar: float = 1.10) -> dict:
    """Counts over a ``peer_race``: sizes where ours ≤ the peer's time, sizes at T ≥ large_T where
    ours is ≥ ``bar``× faster, and the misses of each ("shape T=…")."""
    large = [r for r in race if r["T"] >= large_T]
    return {"sizes": len(race), "at_most_peer": sum(r["peer / ours"] >= 1 for r in race),
            "large": len(large), "large_met": sum(r["peer / ours"] >= bar for r in large),
            "slower": [f"{r['shape']} T={r['T']}" for r in race if r["peer / ours"] < 1],
            "large_missed": [f"{r['shape']} T={r['T']}" for r in large if r["peer / ours"] < bar]}


def persistent_ratios(rows: list[dict]) -> list[dict]:
    """Per shape and T with an ``ours_persistent`` row: plain (``ours_grouped``) / persistent time
    (> 1: the persistent schedule is faster). Empty when the recording has no such rows."""
    out = []
    for s in dict.fromkeys(r["shape"] for r in rows):
        for T in sorted({r["tokens"] for r in rows if r["shape"] == s}):
            p, g = _row(rows, s, T, "ours_persistent"), _row(rows, s, T, "ours_grouped")
            if p and g:
                out.append({"shape": s, "T": T, "plain / persistent": g["median_ms"] / p["median_ms"]})
    return out


def race_figure(race: list[dict], bar: float = 1.10, large_T: int = 4096):
    """peer / ours time against T, one line per shape; ≥ 1 means ours is at least as fast."""
    palette = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e"]  # as gemm.targets
    fig, ax = plt.subplots(figsize=(WIDTH_IN, 3.6))
    for j, s in enumerate(dict.fromkeys(r["shape"] for r in race)):
        pts = [(r["T"], r["peer / ours"]) for r in race if r["shape"] == s]
        ax.plot(*zip(*pts, strict=True), marker="o", ms=4, label=s, color=palette[j % 5])
    ax.axhline(1, color=color("ceiling"), lw=1)
    ax.hlines(bar, large_T, max(r["T"] for r in race), color=color("ceiling"), lw=1, ls="--")
    ax.set(xscale="log", xlabel="tokens", ylabel="peer time / our time",
           title="ours (the path moe() picks) vs the tuned fused-MoE peer; above 1: ours faster")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=SMALL_PT)
    fig.tight_layout()
    return fig
