"""Chapter 8's sentences about a serving recording (``python -m dispatch_book.bench serve``'s rows, or
the chapter's live run): what each race says, computed from the rows, printed under its table.

    offline_table(rows)       the offline race as a table (tokens/s, wall time, ours' ratio)
    offline_sentence(rows)    ours' output tokens/s against each other offline contestant
    where_sentence(rows)      where ours' offline time went: decode-only steps and steps with a prompt chunk
    online_sentences(rows)    per rate: who is ahead at TTFT and TPOT p50/p99; the highest rate within a TPOT p99
    step_sentence(rows)       the paged decode step against the static engine's, per batch (held_steps)

A contestant cut off mid-run (``output_tok_s_at_most``: it needed longer than it was given) enters as
a bound: the ratio against it is "at least"; one that did not run or was skipped is named as such.
"""
from __future__ import annotations

from dispatch_book.bench.serve import OFFLINE, ONLINE  # the benchmark's contestants, by part
from dispatch_book.bench.serve_online import max_rate_within

NAMES = {"static": "the static engine (one batch at a time)",
         "hf_cb": "transformers' continuous batching (its default experts)",
         "hf_cb_dispatch": "transformers' continuous batching with our experts",
         "hf_serve": "`transformers serve`", "ours": "this engine"}


def offline_ratios(rows: list[dict]) -> dict[str, tuple[float, bool]]:
    """contestant → (ours' output tokens/s over its, whether that is a lower bound), for those measured."""
    off = {r["contestant"]: r for r in rows if r.get("part") == "offline"}
    ours = off.get("ours", {}).get("output_tok_s")
    if not ours:
        return {}
    out = {}
    for name, r in off.items():
        if name == "ours":
            continue
        if r.get("output_tok_s"):
            out[name] = (ours / r["output_tok_s"], False)
        elif r.get("output_tok_s_at_most"):
            out[name] = (ours / r["output_tok_s_at_most"], True)
    return out


def offline_table(rows: list[dict]) -> list[dict]:
    """The offline race as the chapter's table: tokens/s (a cut-off run's bound), wall time, ours' ratio
    (a lower bound against a cut-off run, as its note says)."""
    ratios = offline_ratios(rows)
    out = []
    for r in (r for r in rows if r.get("part") == "offline"):
        name = r["contestant"]
        note = f"cut off, {r['requests_done']} done: x is at least" if "output_tok_s_at_most" in r else _why(r, 28)
        x = 1.0 if name == "ours" and r.get("output_tok_s") else ratios.get(name, (None,))[0]
        out.append({"contestant": name, "output tok/s": r.get("output_tok_s") or r.get("output_tok_s_at_most"),
                    "wall s": r.get("wall_s"), "ours is x faster": x, "note": note})
    return out


def _why(r: dict, n: int) -> str:
    """Why a contestant has no number: its recorded reason, cut to ``n`` characters."""
    return (r.get("did_not_run") or r.get("skipped") or "")[:n]


def offline_sentence(rows: list[dict]) -> str:
    off = {r["contestant"]: r for r in rows if r.get("part") == "offline"}
    if not off.get("ours", {}).get("output_tok_s"):
        return "offline: this engine was not measured"
    ratios = offline_ratios(rows)
    parts = [f"{'at least ' if low else ''}{x:.2f}x {NAMES.get(n, n)}" for n, (x, low) in ratios.items()]
    parts += [f"{NAMES.get(n, n)} not measured ({_why(r, 60)})"
              for n, r in off.items() if n != "ours" and n not in ratios]
    parts += [f"{NAMES[n]} not in this recording" for n in OFFLINE if n not in off]
    return f"offline: this engine {off['ours']['output_tok_s']:,.0f} output tokens/s: " + "; ".join(parts)


def where_sentence(rows: list[dict]) -> str:
    """Ours' offline run split by step kind (its ``where`` record): steps, seconds, and per decode-only
    step the rows and the KV-cache bytes its attention read; per mixed step the prompt tokens. Empty
    when the row has no such record."""
    ours = next((r for r in rows if r.get("part") == "offline" and r.get("contestant") == "ours"), {})
    w, per_tok = ours.get("where"), ours.get("kv_bytes_per_token")
    if not w or not per_tok:
        return ""
    d, m = w["decode"], w["mixed"]
    out = [f"where this engine's {ours['wall_s']:.1f} s went:"]
    if d["steps"]:
        gb = d["kv_tokens"] * per_tok / d["steps"] / 1e9
        out.append(f"{d['steps']:,} decode-only steps, {d['s']:.1f} s ({d['s'] / d['steps'] * 1e3:.1f} ms each, "
                   f"{d['rows'] / d['steps']:.0f} rows and {gb:.1f} GB of KV cache read per step on average);")
    if m["steps"]:
        out.append(f"{m['steps']:,} steps with a prompt chunk, {m['s']:.1f} s ({m['s'] / m['steps'] * 1e3:.1f} ms "
                   f"each, {m['prefill_tokens'] / m['steps']:,.0f} prompt tokens and {m['rows'] / m['steps']:.0f} "
                   "decode rows per step on average).")
    return " ".join(out)


def online_sentences(rows: list[dict], tpot_p99_ms: float = 50.0) -> list[str]:
    """One line per rate that both ours and a peer served (ahead = lower or equal), then the highest rates
    whose TPOT p99 stays within ``tpot_p99_ms``."""
    on = [r for r in rows if r.get("part") == "online" and "ttft_ms" in r]
    by = {}
    for r in on:
        by.setdefault(r["contestant"], {})[r["rate"]] = r
    ours = by.get("ours", {})
    out = []
    for peer in (p for p in by if p != "ours"):
        for rate in sorted(set(ours) & set(by[peer])):
            a, b = ours[rate], by[peer][rate]
            said = []
            for m in ("ttft_ms", "tpot_ms"):
                for q in ("p50", "p99"):
                    x, y = a[m].get(q), b[m].get(q)
                    if x is not None and y is not None:
                        said.append(f"{m[:4].upper()} {q} {x:.0f} vs {y:.0f} ms {'ok' if x <= y else 'BEHIND'}")
            out.append(f"rate {rate:g}/s, this engine vs {NAMES.get(peer, peer)}: " + ", ".join(said))
    for r in (r for r in rows if r.get("part") == "online" and r.get("failed")):
        why = f": {r['server_error']}" if r.get("server_error") else ""
        out.append(f"rate {r['rate']:g}/s: {NAMES.get(r['contestant'], r['contestant'])} failed {r['failed']} of "
                   f"{r['requests']} requests{why}")
    for r in (r for r in rows if r.get("part") == "online" and r.get("did_not_run")):
        why = r["did_not_run"].split(" | ")[-1].strip()[-120:]  # a server's log: its last line
        out.append(f"{NAMES.get(r['contestant'], r['contestant'])} did not run: {why}")
    named = {r["contestant"] for r in rows if r.get("part") == "online"}
    out += [f"{NAMES[n]} is not in this recording" for n in ONLINE if n not in named and named]
    for name, rates in by.items():
        out += one_time_stalls(name, rates)
    for name, rates in by.items():
        best = max_rate_within(list(rates.values()), tpot_p99_ms)
        out.append(f"{NAMES.get(name, name)}: highest rate measured with TPOT p99 <= {tpot_p99_ms:g} ms: "
                   + (f"{best:g} requests/s" if best is not None else "none"))
    return out


def held_steps(rows: list[dict]) -> list[dict]:
    """The decode-step rows measured at a fixed batch: every row of the batch ran through the timed steps
    (``rows_held``), so the paged step and the static one time the same work."""
    return [r for r in rows if r.get("part") == "step" and r.get("rows_held") == r.get("batch")]


def step_sentence(rows: list[dict]) -> str:
    steps = [r for r in held_steps(rows) if r.get("paged_over_static")]
    if not steps:
        return "decode step: this recording holds no graphed paged step at a fixed batch"
    worst = max(steps, key=lambda r: r["paged_over_static"])
    return (f"decode step through the paged cache: {min(r['paged_over_static'] for r in steps):.2f}-"
            f"{worst['paged_over_static']:.2f}x the static engine's at batch "
            + ", ".join(str(r["batch"]) for r in steps) + f" (context {worst['context']})")


def one_time_stalls(name: str, rates: dict[float, dict], factor: float = 3.0) -> list[str]:
    """A TTFT p99 more than ``factor`` times the p99 at a higher rate: a queue makes tails grow with the
    load, so a tail that falls as it rises is work done once inside the slower run (a kernel compiled
    the first time a step's token count needs it), and the TPOT tail of that run shows the same stall."""
    out, order = [], sorted(rates)
    for i, lo in enumerate(order):
        hi = [r for r in order[i + 1:] if rates[r]["ttft_ms"].get("p99") is not None]
        a = rates[lo]["ttft_ms"].get("p99")
        if a is None or not hi:
            continue
        b = min(hi, key=lambda r: rates[r]["ttft_ms"]["p99"])
        x, y = rates[lo], rates[b]
        if a > factor * y["ttft_ms"]["p99"]:
            out.append(f"{NAMES.get(name, name)}: TTFT p99 {a:.0f} ms at {lo:g}/s but {y['ttft_ms']['p99']:.0f} ms "
                       f"at {b:g}/s (TPOT p99 {x['tpot_ms']['p99']:.0f} vs {y['tpot_ms']['p99']:.0f} ms): "
                       "a tail that falls as the load rises is a one-time stall, not the queue")
    return out


NEAR_TIE = 0.125  # bf16 logits of magnitude 4..8 are 1/32 apart: four rounding steps


def reliability_sentences(rows: list[dict], near: float = NEAR_TIE) -> list[str]:
    """The reliability run in a few lines: requests by kind, answers by status, blocks held afterwards,
    and the completed greedy answers that differ from the same prompt alone — how many start at a near
    tie (the prompt alone had its two best logits within ``near``) and the widest such margin."""
    rel = next((r for r in rows if r.get("part") == "reliability"), None)
    if rel is None:
        return ["this run has no reliability run (see the tests)"]
    if "statuses" not in rel:
        return [f"reliability: not measured ({rel.get('did_not_run') or rel.get('skipped')})"]
    differ = rel["differ_alone"]
    kinds = {"full": "read to the end", "disconnect": "cut off mid-stream", "malformed": "malformed"}
    sent = ", ".join(f"{n:,} {kinds.get(k, k)}" for k, n in rel["kinds"].items())
    answers = ", ".join(f"{n:,} × {code}" for code, n in sorted(rel["statuses"].items()))
    out = [f"reliability: {rel['requests']:,} requests ({sent}); answers {answers}; blocks held afterwards "
           f"{rel['blocks_held_after']}; {len(differ)} of {rel['checked_alone']} checked answers differ from the "
           f"prompt's alone"]
    if differ:
        margins = [d["margin_alone"] for d in differ]
        out.append(f"{sum(m <= near for m in margins)} of the {len(margins)} differences start at a near tie (the "
                   f"prompt alone had its two best logits within {near}); the widest margin is {max(margins):g}")
    return out
