"""Split items against the chain at a few tokens: does one launch with no hand-over pay? (GPU only)

    python -m dispatch_book.bench split [--out results] [--shapes a,b] [--tokens 1,4,16]

For each shape and token count, on the kernels race's inputs (seed 0, the shared expert riding along
where the layer has one), graph-timed side by side (:func:`dispatch.tune.search.graph_us`):

- ``chain``: the device table's decode tiles (the heuristics' without a table; ``DISPATCH_TILE_TABLE=h200``
  reads the H200's on another GPU; the file names the table as ``tile_table``) in three launches;
- ``one_launch``: the same tiles in one launch (:mod:`dispatch.kernels.decode_fused`), the best of
  its lags and grids;
- ``split``: split items (:mod:`dispatch.kernels.decode_split`), the best of ``TILES`` (block_i ×
  block_ho) × ``GRIDS`` programs per SM, every candidate checked within the tuner's tolerance of
  the chain first; the best one is then traced (:mod:`dispatch.kernels.trace`): when its last split
  item ended, when its reduce items started and ended (µs from its first item's start);
- ``stream``: a plain read of the bytes the layer reads (:func:`~dispatch_book.bench.peaks.same_bytes_read`).

Rows → ``results/<gpu>/decode_split.json``; every candidate's µs is kept. Chapter 3 reads it.
"""
from __future__ import annotations

import argparse
from dataclasses import astuple, replace

import torch

from dispatch import runtime
from dispatch.config import PRESETS, random_weights
from dispatch.kernels import gemv, tiles
from dispatch.kernels.tiles import DecodeConfig
from dispatch.moe import shared_rides_along
from dispatch.reference import rel_err
from dispatch.tune.search import LAGS, TOLERANCE, graph_us
from dispatch_book import bench
from dispatch_book.bench.kernels import race_inputs
from dispatch_book.bench.peaks import same_bytes_read
from dispatch_book.bench.timeline import SHAPES, summarize

TOKENS = (1, 4, 16)
TILES = ((16, 256), (32, 128), (64, 64), (128, 32), (32, 256), (64, 128))  # (block_i, block_ho)
GRIDS = (1, 2, 4, 8)  # programs per SM


def candidates(chain: DecodeConfig, sms: int) -> dict[str, dict[str, DecodeConfig]]:
    """The one-launch and split configs raced against ``chain`` (three launches), by label."""
    return {"one_launch": {f"lag {n}, {p}/SM": replace(chain, fused=n, programs=p * sms)
                           for n in LAGS for p in GRIDS},
            "split": {f"{i}x{o}, {p}/SM": replace(chain, split=1, block_i=i, block_ho=o, programs=p * sms)
                      for i, o in TILES for p in GRIDS}}


def phases(trace: list) -> dict:
    """From a split launch's trace [(kernel, rows [sm, program, kind, start, end])]: µs from the first
    item's start to the last split item's end, and to the first and last reduce item's start / end."""
    ran = [r for _, buf in trace for r in buf.tolist() if r[0] >= 0]
    t0 = min(r[3] for r in ran)
    split, red = [r for r in ran if r[2] == 2], [r for r in ran if r[2] == 3]
    return {"split_end_us": (max(r[4] for r in split) - t0) / 1e3,
            "reduce_start_us": (min(r[3] for r in red) - t0) / 1e3,
            "reduce_end_us": (max(r[4] for r in red) - t0) / 1e3,
            "split_items": summarize([r for r in ran if r[2] == 2])}


def _best(configs: dict, run, ref, log) -> tuple[dict, str | None]:
    """µs (or why not) of every config that runs and agrees with ``ref``, and the fastest's label."""
    timed = {}
    for label, c in configs.items():
        try:
            err = rel_err(run(c), ref)
        except Exception as e:  # noqa: BLE001 - a candidate that does not compile or fit is recorded, not fatal
            timed[label] = f"failed: {(str(e).splitlines() or [type(e).__name__])[0][:100]}"
            continue
        if err > TOLERANCE:
            raise AssertionError(f"{label}: {err:.2e} from the chain (tolerance {TOLERANCE})")
        timed[label] = graph_us(lambda c=c: run(c))
    ok = {k: v for k, v in timed.items() if isinstance(v, float)}
    best = min(ok, key=ok.get) if ok else None
    log(f"    best {best}: {ok[best]:.1f} us" if best else "    none ran")
    return timed, best


def measure(name: str, T: int, w, dev, dtype, log=print) -> dict:
    cfg = PRESETS[name]
    shared = (w.shared_gate_up_2SH, w.shared_down_HS) if shared_rides_along(cfg) else None
    x_TH, weights_TK, ids_TK = race_inputs(cfg, T, dev, dtype)
    chain = replace(gemv.decode_tiles(x_TH, cfg.K, cfg.E, cfg.I, shared), fused=0, split=0)

    def run(c, trace=None):
        return gemv.run_decode(x_TH, weights_TK, ids_TK, w.gate_up_E2IH, w.down_EHI, c, shared=shared, trace=trace)

    ref = run(chain)
    n = int(torch.unique(ids_TK).numel()) + gemv.n_shared(shared, cfg.I)
    nbytes = n * 3 * cfg.H * cfg.I * x_TH.element_size()
    row = {"shape": name, "tokens": T, "experts_read": n, "bytes": nbytes, "chain": list(astuple(chain)),
           "chain_us": graph_us(lambda: run(chain)), "stream_us": graph_us(same_bytes_read(nbytes, dev))}
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    for kind, configs in candidates(chain, sms).items():
        log(f"  {name} T={T} {kind}: {len(configs)} candidates")
        timed, best = _best(configs, run, ref, log)
        row[f"{kind}_candidates_us"] = timed
        row[f"{kind}_us"] = timed[best] if best else None
        row[kind] = list(astuple(configs[best])) if best else None
        if kind == "split" and best:
            trace = []
            run(configs[best], trace)
            torch.cuda.synchronize(dev)
            row["split_phases"] = phases(trace)
    return row


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m dispatch_book.bench split")
    p.add_argument("--shapes", default=",".join(SHAPES), type=bench.preset_list)
    p.add_argument("--tokens", default=",".join(map(str, TOKENS)), type=bench.int_list)
    bench.add_output_args(p)
    a = p.parse_args(argv)
    if not runtime.HAS_CUDA:
        raise SystemExit("the split race is graph-timed: it needs a CUDA GPU")
    dev, dtype = torch.device("cuda"), runtime.compute_dtype(torch.device("cuda"))
    rows = []
    for name in a.shapes:
        w = random_weights(PRESETS[name], dtype=dtype, device=dev)
        for T in a.tokens:
            r = measure(name, T, w, dev, dtype)
            f = lambda v: f"{v:7.1f}" if v else "      -"  # noqa: E731
            print(f"{name:16s} T={T:3d} chain {f(r['chain_us'])} one launch {f(r['one_launch_us'])} "
                  f"split {f(r['split_us'])} stream {f(r['stream_us'])} us ({r['bytes'] / 1e6:.0f} MB)", flush=True)
            rows.append(r)
        del w
        torch.cuda.empty_cache()
    path = bench.save("decode_split", rows, out=a.out, allow_dirty=a.allow_dirty,
                      extra={"dtype": str(dtype), "tolerance": TOLERANCE, "tile_table": tiles._slug(dev)})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
