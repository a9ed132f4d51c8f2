"""The kernels race's targets, read from its recordings (``kernels.json``, ``kernels_skewed.json``).

``ours_row`` picks the row of the path ``moe()`` takes; ``targets`` checks the chapter-2 targets;
``closing_rows`` / ``closing_count`` / ``closing_table`` build the race's closing table — per shape,
tokens and routing: the tuned peer, torch's grouped GEMM and ours in µs, and peer / ours — and count
its targets: ours ≤ the peer at every size, ≥ 1.10× the peer from 4096 tokens, ≥ torch's grouped
GEMM (``torch_grouped_mm``) from 256 tokens. A contestant that did not run shows its reason, never
a number, and a target it would decide is counted as not met.
"""
from __future__ import annotations

PEER_BAR, LARGE_T = 1.10, 4096  # ours ≥ 1.10× the tuned peer from 4096 tokens
GROUPED_FROM_T = 256  # ours ≥ torch's grouped GEMM from 256 tokens


def _routing(row: dict) -> str:
    return row.get("routing", "uniform")


def ours_row(rows: list[dict], shape: str, T: int, decode_max_tokens: int, routing: str | None = None) -> dict | None:
    """The row of the experts path that ``moe(path="auto")`` takes at this size (recorded ``chosen``,
    else the given crossover); ``routing``: among that routing's rows only (default: any)."""
    by = {r["contestant"]: r for r in rows if r["shape"] == shape and r["tokens"] == T and "median_ms" in r
          and (routing is None or _routing(r) == routing)}
    chosen = [r for r in by.values() if r.get("chosen")]
    if chosen:
        return chosen[0]
    return by.get("ours_decode" if T <= decode_max_tokens else "ours_grouped") or by.get("ours_grouped")


def targets(doc: dict, decode_max_tokens: int, shape: str = "olmoe-1b-7b") -> list[dict]:
    """The chapter's targets, checked against a recorded run: one dict per (target, size)."""
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


def _one(rows, shape, T, routing, name):
    got = [r for r in rows if r["shape"] == shape and r["tokens"] == T and _routing(r) == routing
           and r["contestant"] == name]
    return got[0] if got else None


def _ratio(a, b) -> float | None:
    return a / b if isinstance(a, float) and isinstance(b, float) else None


def _us_or_reason(row) -> float | str:
    if row is None:
        return "not recorded"
    if "median_ms" in row:
        return row["median_ms"] * 1e3
    why = str(row.get("skipped") or row.get("error") or row.get("status") or "no timing")
    return why if why.startswith("did not run") else f"did not run: {why}"


def closing_rows(docs, decode_max_tokens: int = 64) -> list[dict]:
    """One dict per (shape, tokens, routing) of the recordings ``docs`` (results documents, e.g.
    kernels.json and kernels_skewed.json): "peer µs", "grouped µs" (torch's grouped GEMM), "ours µs"
    (a float, or the reason it has none), "ours" (which path), "peer / ours" and "grouped / ours"
    (None where either did not run), "busiest/mean" (the draw's, where recorded)."""
    rows = [r for d in ([docs] if isinstance(docs, dict) else docs) for r in d["rows"]]
    out = []
    for key in dict.fromkeys((r["shape"], r["tokens"], _routing(r)) for r in rows):
        shape, T, routing = key
        ours = ours_row(rows, shape, T, decode_max_tokens, routing)
        peer, grouped = _one(rows, *key, "peer_fused_moe"), _one(rows, *key, "torch_grouped_mm")
        o, p, g = (_us_or_reason(ours), _us_or_reason(peer), _us_or_reason(grouped))
        skew = next((r["busiest_over_mean"] for r in rows if (r["shape"], r["tokens"], _routing(r)) == key
                     and "busiest_over_mean" in r), None)
        out.append({"shape": shape, "tokens": T, "routing": routing, "busiest/mean": skew, "peer µs": p,
                    "grouped µs": g, "ours µs": o, "ours": ours["contestant"] if ours else None,
                    "peer / ours": _ratio(p, o), "grouped / ours": _ratio(g, o)})
    return out


def closing_count(table: list[dict]) -> dict:
    """The targets over a :func:`closing_rows` table: {target: {"met", "of", "missed": ["shape T routing"]}}.
    A size whose deciding contestant did not run counts as not met."""
    def name(r):
        return f"{r['shape']} T={r['tokens']} {r['routing']}"

    checks = {"ours ≤ peer": [(r, r["peer / ours"], 1.0) for r in table],
              f"≥ {PEER_BAR:.2f}× peer from {LARGE_T} tokens": [(r, r["peer / ours"], PEER_BAR)
                                                                 for r in table if r["tokens"] >= LARGE_T],
              f"≥ torch grouped from {GROUPED_FROM_T} tokens": [(r, r["grouped / ours"], 1.0)
                                                                for r in table if r["tokens"] >= GROUPED_FROM_T]}
    out = {}
    for target, cases in checks.items():
        missed = [name(r) for r, v, bar in cases if v is None or v < bar]
        out[target] = {"met": len(cases) - len(missed), "of": len(cases), "missed": missed}
    return out


def closing_table(docs, decode_max_tokens: int = 64) -> str:
    """The closing note's table as text (markdown), then one line per target: met of how many, misses."""
    table = closing_rows(docs, decode_max_tokens)

    def fmt(v, spec):
        return "—" if v is None else v if isinstance(v, str) else format(v, spec)

    lines = ["| shape | tokens | routing | busiest/mean | peer µs | grouped µs | ours µs | peer / ours |",
             "|---|---:|---|---:|---:|---:|---:|---:|"]
    for r in table:
        lines.append(f"| {r['shape']} | {r['tokens']} | {r['routing']} | {fmt(r['busiest/mean'], '.2f')} | "
                     f"{fmt(r['peer µs'], '.1f')} | {fmt(r['grouped µs'], '.1f')} | {fmt(r['ours µs'], '.1f')} | "
                     f"{fmt(r['peer / ours'], '.3f')} |")
    for target, c in closing_count(table).items():
        lines.append(f"{target}: {c['met']} of {c['of']}" + (f" (missed: {', '.join(c['missed'])})"
                                                              if c["missed"] else ""))
    return "\n".join(lines)


def main(argv=None) -> None:
    """python -m dispatch_book.bench.kernels_targets [FILE ...]: the closing table of recorded files
    (default: this GPU's set's kernels.json and kernels_skewed.json, where they exist)."""
    import argparse
    import json
    import pathlib

    p = argparse.ArgumentParser(prog="python -m dispatch_book.bench.kernels_targets")
    p.add_argument("files", nargs="*", help="results files (kernels.json, kernels_skewed.json)")
    p.add_argument("--decode-max-tokens", type=int, default=64, help="crossover where a row has no 'chosen'")
    a = p.parse_args(argv)
    docs = [json.loads(pathlib.Path(f).read_text()) for f in a.files]
    if not docs:
        from dispatch_book import bench

        docs = [d for d in (bench.load("kernels"),) if d]
    if not docs:
        raise SystemExit("no kernels recording to read: name the files")
    print(closing_table(docs, a.decode_max_tokens))


if __name__ == "__main__":
    main()
