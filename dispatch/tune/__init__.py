"""Tune the kernels' tiles for this GPU and write the table the launchers read: the user's own table
(``dispatch.tables.user_path``: ``$DISPATCH_TABLES`` or ``~/.cache/dispatch/tables``), layered over the
shipped one; ``--out`` names another file (the book's GPU runs write a copy of the shipped table there
and commit it). The installed package is never written.

    python -m dispatch.tune --preset olmoe-1b-7b|all [--tokens 1,8,64] [--out FILE] [--workers N]
    python -m dispatch.tune --preset all --quant int8-channel,fp8-channel   (quantized experts only)
    python -m dispatch.tune --preset all --refine [--quant ...]   (the last steps from the table's configs)
    python -m dispatch.tune --preset all --routing zipf:3   (entries for skewed routing, keyed '...,zipf:3')

Per layer shape and token-count bucket T (``dispatch.tables.BUCKETS``, 1 … 16384), on one routing
(``--routing``, :mod:`dispatch.tune.routing_dist`: by default uniform, the softmax top-K of random
logits; ``zipf:<r>`` a Zipf law with busiest/mean expert load r at 4096 tokens; ``trace`` the trained
model's recorded routes; seeded), timed under CUDA-graph replay (median of several replays). Entries
tuned under a routing other than uniform are keyed with its name (``tables.shape_key``), next to the
uniform ones, which keep their keys:

* **Grouped GEMM** (T ≥ 8), up and down kernels separately. ``block_m`` (the sort's padding, shared
  by both) from the rows per expert r = T·K/E: {16} below 12 rows, {16, 32}, {32, 64}, {64, 128},
  {128} from 160; a row block much larger than r is mostly padding, much smaller re-reads weights.
  For each block_m a curated list of (BLOCK_N, BLOCK_K, warps, stages) — the region where an H100/H200
  GEMM wins: long K steps (128) and narrow N for thin blocks (weight-bound), 128–256 wide N with 8
  warps for fat ones (compute-bound) — and, for block_m ≥ 64, the launch swizzle group_m ∈ {1, 8, 16}
  (blocks sharing a column sweep, so x rows and weight tiles are reused from L2). Candidates whose
  fp32 accumulators exceed 128 registers a thread (they spill) or whose pipeline exceeds shared
  memory are never compiled. The down kernel is timed on the base config's h. The whole path is then
  timed with the chosen tiles and with the heuristic's; the table keeps whichever was faster.
* **Decode kernels** (T ≤ 256): coordinate descent from the heuristic config — the up kernel's
  (block_i, block_h, stages), then the down kernel's (block_ho, block_id), then the grid size
  (1–16 programs per SM: no recompile), then the same tiles in one launch (``fused``: the lag of the
  down items behind the up items × the grid sizes; :mod:`dispatch.kernels.decode_fused`), and at
  T ≤ 16 split items (one launch whose items each take one I tile through gate, up and down, with
  no wait between them, then a reduction; :mod:`dispatch.kernels.decode_split`: three (block_i,
  block_ho) × the grid sizes, then the down chunk) — each step timing the whole decode, and moving
  only to a config faster than the current one.
* **Quantized experts** (``--quant``, chapter 7, :mod:`dispatch.tune.quant_search`), instead of the
  above: the decode tiles for codes in each scheme, T ≤ 64, by the same descent started from the
  bf16 decode's tiles (what the launcher takes without an entry), plus a step of longer reduction
  chunks and one of whole up and down tiles (``QUANT_TILES``); every candidate is shrunk to fit the
  scale blocks; from 8 tokens also the weight-only grouped GEMM, for the scheme's own crossover.
  Entries keyed 'bfloat16+<scheme>'.
  For fp8 schemes on sm_89+ also the w8a8 entry 'bfloat16+<scheme>+w8a8' ('<scheme>+w8a8': it
  alone): the decode tiles on fp8 activations (T ≤ 64, the same descent from the weight-only
  tiles; its own crossover against the w8a8 grouped GEMM), and the w8a8 grouped GEMM (T ≥ 128):
  up and down tiles around the launcher's default, then the whole path against the default.
* **Shared expert riding along** (layers where ``moe.shared_rides_along``: DeepSeek-MoE): the decode
  tiles again, with the shared MLP inside the kernels as n = S / I more experts; entry keyed by
  E + n experts and K + n choices, which is what the launcher looks up for it.
* **Refine** (``--refine``, :mod:`dispatch.tune.refine`), instead of a descent: from each decode
  bucket's config in the table, the down-tile step, the one-launch step and (T ≤ 16) the split
  steps, so that a grown search space (the 128-row down tiles, split items) reaches a table without
  re-tuning it; with ``--quant``, those schemes' entries (after the down step also the whole tiles of
  ``QUANT_TILES``), their weight-only grouped GEMM timed beside them for the crossover.
* **Crossover**: where both ran, the whole grouped path (sort, up, down, combine) against decode;
  the decode path serves T ≤ the last bucket before the grouped path first wins. With a shared
  expert riding along, as ``moe()`` runs them: decode with it inside against the grouped path plus
  the shared MLP in torch (the bucket's ``decode_shared_us`` and ``shared_us``).

Every candidate is checked against the base config's output (itself checked against the plain-PyTorch
reference) before it is timed. Compiling dominates a cold run, so every kernel variant is compiled
first in parallel worker processes (Triton's disk cache); the timing itself then runs in this process.
"""
from __future__ import annotations

import argparse
import datetime as dt
import os

import torch
import triton

from dispatch import files, runtime, tables
from dispatch import schemes as registry
from dispatch.config import PRESETS
from dispatch.tune import refine, routing_dist
from dispatch.tune.compile import compile_jobs, precompile, workers_that_fit
from dispatch.tune.search import BENCH_PRESETS, merge_entry, tune_preset


def default_out(device_name: str):
    """Where a run writes without ``--out``: the user's table of this device (``tables.user_path``),
    which the launchers layer over the shipped one — never a file inside the installed package."""
    return tables.user_path(tables.device_slug(device_name))


def _check_out(out: str) -> dict | None:
    """The table already at ``out`` (None if none); SystemExit naming the file if it cannot be
    written or is not a table: checked before tuning, which saves after every preset."""
    try:
        files.check_writable(out)
        return tables.load_file(out)
    except (OSError, ValueError) as e:
        raise SystemExit(f"dispatch.tune: --out: {e}") from None


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m dispatch.tune", description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", required=True, help=f"a PRESETS name, or 'all' = {','.join(BENCH_PRESETS)}")
    p.add_argument("--tokens", default=",".join(map(str, tables.BUCKETS)), help="comma-separated buckets")
    p.add_argument("--out", default=None, help="table file (default: the user's table, $DISPATCH_TABLES or "
                   "~/.cache/dispatch/tables/<device>.json, which the launchers layer over the shipped one; never "
                   "the installed package); merged into, bucket by bucket")
    p.add_argument("--quant", default="", help="instead: experts quantized in these schemes (comma-separated, "
                   "e.g. int8-channel,fp8-channel): decode tiles for T ≤ 64; fp8's w8a8 entry too (decode "
                   "tiles, grouped tiles for T ≥ 128), alone as fp8-channel+w8a8")
    p.add_argument("--refine", action="store_true", help="instead: the down-tile and one-launch steps from the "
                   "table's decode configs (bf16 and shared; with --quant, those schemes' instead; --tokens: "
                   "those buckets only; dispatch.tune.refine)")
    p.add_argument("--routing", default="uniform", help="the routing the cases draw: uniform, zipf:<busiest/mean at "
                   "4096 tokens> (e.g. zipf:3) or trace[:<layer>]; entries keyed with it unless uniform")
    p.add_argument("--workers", type=int, default=max(0, min(12, (os.cpu_count() or 2) - 2)),
                   help="compile processes (0: compile while timing)")
    a = p.parse_args(argv)
    presets = list(BENCH_PRESETS) if a.preset == "all" else a.preset.split(",")
    for name in presets:
        if name not in PRESETS:
            raise SystemExit(f"unknown preset {name!r}; choose from {sorted(PRESETS)} or 'all'")
    schemes = tuple(q for q in a.quant.split(",") if q)
    for q in schemes:
        try:
            registry.parse(q)  # a scheme of dispatch.schemes, or '<scheme>+w8a8' where fp8 activations apply
        except ValueError as e:
            raise SystemExit(f"--quant: {e}") from None
    try:
        tokens = sorted(int(t) for t in a.tokens.split(","))
    except ValueError:
        p.error(f"--tokens takes comma-separated token counts, e.g. 1,8,64; got {a.tokens!r}")
    if not tokens or tokens[0] < 1:
        p.error(f"--tokens must be positive token counts, got {a.tokens!r}")
    if a.workers < 0:
        p.error(f"--workers must be >= 0 (0: compile while timing), got {a.workers}")
    if a.out is not None:  # before anything is tuned: an --out that cannot be written loses no work
        _check_out(a.out)
    try:
        routing = routing_dist.parse(a.routing).name
    except ValueError as e:
        raise SystemExit(str(e)) from None
    if a.refine and routing != "uniform":
        raise SystemExit("--refine starts from the table's uniform entries: tune other routings without it")
    if not runtime.HAS_CUDA:
        raise SystemExit("tuning times kernels on a CUDA GPU")
    refine_tokens = set(tokens) if a.tokens != p.get_default("tokens") else None  # --refine: every bucket
    dev, dtype = torch.device("cuda"), runtime.compute_dtype()
    name = runtime.device_name(dev)
    out = a.out or str(default_out(name))
    doc = _check_out(out) or {"entries": {}}
    doc.setdefault("entries", {})
    if a.refine:  # refine what the launchers read: the file's entries, else the shipped (and user) table's
        doc["entries"] = {**tables.load(tables.device_slug(name)).get("entries", {}), **doc["entries"]}
    t0 = dt.datetime.now()
    jobs = refine.compile_jobs(presets, doc, dtype, schemes, refine_tokens) if a.refine else \
        compile_jobs(presets, tokens, dev, schemes)
    workers = workers_that_fit(jobs, a.workers, torch.cuda.mem_get_info(dev)[0])
    if workers < a.workers:
        print(f"{workers} compile workers, not {a.workers}: each holds a preset's weights on the GPU", flush=True)
    if workers:
        try:
            precompile(jobs, workers)
        except Exception as e:  # noqa: BLE001 - a broken pool only costs time: kernels compile while timing
            print(f"parallel compile failed ({e!r}); compiling while timing", flush=True)
        print(f"compiled in {(dt.datetime.now() - t0).total_seconds():.0f} s", flush=True)
    with torch.no_grad():
        for preset in presets:
            if a.refine:
                doc["entries"].update(refine.refine_preset(preset, doc, dev, dtype, schemes,
                                                           log=lambda s: print(s, flush=True), tokens=refine_tokens))
            else:
                for key, e in tune_preset(preset, tokens, dev, dtype, log=lambda s: print(s, flush=True),
                                          schemes=schemes, routing=routing).items():
                    doc["entries"][key] = merge_entry(doc["entries"].get(key), e)  # other buckets stay
            doc.update(device=name, date=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                       versions={"torch": torch.__version__, "triton": triton.__version__})
            tables.write(out, doc)  # after every preset: a run cut short keeps what it tuned
    print(f"wrote {out} in {(dt.datetime.now() - t0).total_seconds():.0f} s")

