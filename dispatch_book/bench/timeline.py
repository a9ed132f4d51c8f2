"""Where a decode launch spends its time: a timeline of its work items on the SMs (GPU only).

    python -m dispatch_book.bench timeline [--out results] [--shapes a,b] [--tokens 1,8,64]

For each shape and token count: the layer's decode path with the tiles ``moe()`` takes (the device's
table; the shared expert riding along where the layer has one), on the kernels race's inputs (seed 0),
run warm with a trace (:mod:`dispatch.kernels.trace`): each (expert, tile) item's SM, program, kind
and start and end on the GPU's nanosecond clock. Five traced runs; the one of median span is kept.
Per kernel launch (:func:`summarize`): the span from the first item's start to the last one's end;
the SMs that ran items; when each SM finished its last item (the first to finish, the median); the
*tail*, span minus the median SM's finish, where fewer and fewer SMs still stream weights; a
program's items (fewest, most); the share of SM time spent inside items. Traced runs are not
graph-timed: the span starts at the first item, so launch latency is not in it, but the clock
reads and the stores of the trace are (a few per item). The output is checked bitwise against the
same call untraced. Rows → ``results/<gpu>/decode_timeline.json``, the items included.
"""
from __future__ import annotations

import argparse
import statistics
from collections import Counter
from dataclasses import astuple

import torch

from dispatch import runtime
from dispatch.config import PRESETS, random_weights
from dispatch.kernels import gemv
from dispatch.moe import shared_rides_along
from dispatch_book import bench
from dispatch_book.bench.kernels import race_inputs

SHAPES = ("olmoe-1b-7b", "qwen3-30b-a3b", "deepseek-moe-16b", "mixtral-8x7b")
TOKENS = (1, 8, 64)
RUNS = 5
KINDS = ((0, "C0", "up item"), (1, "C1", "down item"), (2, "C2", "split item"), (3, "C3", "reduce item"))


def summarize(items) -> dict:
    """The summary of one launch's trace rows ``[sm, program, kind, start_ns, end_ns]`` (rows of items
    that never ran hold -1 and are left out); times in µs from the first start."""
    ran = [list(map(int, r)) for r in items if r[0] >= 0]
    if not ran:
        return {"items": 0}
    t0 = min(r[3] for r in ran)
    span = max(r[4] for r in ran) - t0
    finish, spans = {}, {}
    for sm, _, _, s, e in ran:
        finish[sm] = max(finish.get(sm, 0), e - t0)
        spans.setdefault(sm, []).append((s - t0, e - t0))
    busy = 0
    for ivs in spans.values():  # the union of an SM's item intervals (its programs overlap)
        end = -1
        for s, e in sorted(ivs):
            busy += max(0, e - max(s, end))
            end = max(end, e)
    per_program = Counter(r[1] for r in ran).values()
    median = statistics.median(finish.values())
    return {"items": len(ran), "span_us": span / 1e3, "sms": len(finish),
            "sm_finish_first_us": min(finish.values()) / 1e3, "sm_finish_median_us": median / 1e3,
            "tail_us": (span - median) / 1e3, "items_per_program": [min(per_program), max(per_program)],
            "busy_share": busy / (len(finish) * span) if span else 1.0}


def trace_layer(name: str, T: int, dev, dtype) -> list[dict]:
    """Rows (one per kernel launch) of the decode path's trace for preset ``name`` at T tokens."""
    cfg = PRESETS[name]
    w = random_weights(cfg, dtype=dtype, device=dev)
    x_TH, weights_TK, ids_TK = race_inputs(cfg, T, dev, dtype)
    shared = (w.shared_gate_up_2SH, w.shared_down_HS) if shared_rides_along(cfg) else None
    ns = gemv.n_shared(shared, cfg.I)
    c = gemv.decode_tiles(x_TH, cfg.K, cfg.E, cfg.I, shared)
    args = (x_TH, weights_TK, ids_TK, w.gate_up_E2IH, w.down_EHI, c)
    want = gemv.run_decode(*args, shared=shared)
    runs = []
    for _ in range(RUNS):
        trace = []
        y = gemv.run_decode(*args, shared=shared, trace=trace)
        torch.cuda.synchronize(dev)
        if not torch.equal(y, want):
            raise AssertionError(f"{name} T={T}: the traced decode differs from the untraced one")
        runs.append([(kernel, buf.tolist()) for kernel, buf in trace])
    runs.sort(key=lambda r: sum(summarize(items).get("span_us", 0) for _, items in r))
    n_unique = int(torch.unique(ids_TK).numel()) + ns
    rows = []
    for kernel, items in runs[len(runs) // 2]:
        ran = [r for r in items if r[0] >= 0]
        t0 = min((r[3] for r in ran), default=0)
        rows.append({"shape": name, "tokens": T, "kernel": kernel, "config": list(astuple(c)),
                     "shared_experts": ns, "expert_bytes": n_unique * 3 * cfg.H * cfg.I * x_TH.element_size(),
                     **summarize(items), "trace": [r[:3] + [r[3] - t0, r[4] - t0] for r in ran]})
    return rows


def figure(doc: dict, shape: str, tokens: int):
    """One (shape, T) of a recording as a timeline: a panel per launch, a line per SM that ran items, a
    bar per item (``KINDS``: up blue, down orange, split green, reduce red; an SM's programs overlap),
    the median SM's finish dashed: what lies right of it is the tail."""
    import matplotlib.pyplot as plt

    from dispatch_book.figures import SMALL_PT, WIDTH_IN

    rows = [r for r in doc["rows"] if r["shape"] == shape and r["tokens"] == tokens and r.get("trace")]
    if not rows:
        raise ValueError(f"the recording has no trace of {shape} at T={tokens}")
    fig, axes = plt.subplots(len(rows), 1, figsize=(WIDTH_IN, 0.8 + 2.4 * len(rows)), squeeze=False)
    for ax, r in zip(axes[:, 0], rows, strict=True):
        line = {sm: i for i, sm in enumerate(sorted({t[0] for t in r["trace"]}))}
        for kind, color, label in KINDS:
            bars = [(line[sm], s / 1e3, (e - s) / 1e3) for sm, _, k, s, e in r["trace"] if k == kind]
            if bars:
                ax.barh([b[0] for b in bars], [b[2] for b in bars], left=[b[1] for b in bars], height=0.9,
                        color=color, alpha=0.35, lw=0, label=label)
        ax.axvline(r["sm_finish_median_us"], color="k", lw=0.8, ls="--", label="median SM done")
        ax.set(title=f"{r['kernel']}: {r['span_us']:.0f} µs, tail {r['tail_us']:.0f} µs", ylabel="SM",
               xlabel="µs from the first item")
        ax.legend(fontsize=SMALL_PT, loc="lower left")
    fig.suptitle(f"{shape}, {tokens} tokens", fontsize=10)
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m dispatch_book.bench timeline")
    p.add_argument("--shapes", default=",".join(SHAPES), type=bench.preset_list)
    p.add_argument("--tokens", default=",".join(map(str, TOKENS)), type=bench.int_list)
    bench.add_output_args(p)
    a = p.parse_args(argv)
    if not runtime.HAS_CUDA:
        raise SystemExit("the timeline reads the GPU's clock: it needs a CUDA GPU")
    dev, dtype = torch.device("cuda"), runtime.compute_dtype(torch.device("cuda"))
    rows = []
    for name in a.shapes:
        for T in a.tokens:
            for r in trace_layer(name, T, dev, dtype):
                print(f"{name:16s} T={T:3d} {r['kernel']:10s} span {r['span_us']:7.1f} us, tail {r['tail_us']:6.1f} us,"
                      f" {r['sms']} SMs, items/program {r['items_per_program']}, busy {r['busy_share']:.0%}")
                rows.append(r)
    path = bench.save("decode_timeline", rows, out=a.out, allow_dirty=a.allow_dirty,
                      extra={"dtype": str(dtype), "runs": RUNS})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
