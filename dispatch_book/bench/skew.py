"""Routing as a benchmark axis: the ``--routing`` argument, where a run's rows go, and our tiles for it.

The races (kernels, decode, quant) draw their routing from :mod:`dispatch.tune.routing_dist`
(``uniform`` by default, as they always did; ``zipf:<r>``, ``trace[:<l>]``). Every row records the
routing's name and the busiest/mean expert load of the draw it measured (``routing_dist.describe``).
A uniform run writes the suite's own file (``kernels.json``: what the chapters read); any other
routing writes ``<suite>_skewed.json``, whose rows may hold several routings (a merged run keeps the
rows of the other routings: ``results.merged`` keys rows by shape, tokens and routing).

Our tiles under a routing: the table's entry tuned for it where one exists (``python -m dispatch.tune
--routing zipf:3`` writes '<shape key>,zipf:3'), else the tile policy's (the uniform entry, or
heuristics); :func:`routed_tiles` says which, and the rows record it.
"""
from __future__ import annotations

from dispatch import runtime, tables
from dispatch.kernels import tiles
from dispatch.moe import shared_rides_along
from dispatch.tune import routing_dist


def add_routing_arg(parser) -> None:
    parser.add_argument("--routing", default="uniform",
                        help="routing distribution: uniform (default), zipf:<busiest/mean at 4096 tokens> (e.g. "
                             "zipf:3) or trace[:<layer>] (dispatch.tune.routing_dist); other than uniform the rows "
                             "go to <suite>_skewed.json")


def parse_or_exit(spec: str) -> str:
    """The canonical routing name, or SystemExit naming what is accepted."""
    try:
        return routing_dist.parse(spec).name
    except ValueError as e:
        raise SystemExit(str(e)) from None


def results_name(suite: str, routing: str) -> str:
    """The results file of a run: the suite's own for uniform routing, '<suite>_skewed' otherwise."""
    return suite if routing_dist.parse(routing).name == "uniform" else f"{suite}_skewed"


def routed_tiles(cfg, T: int, dtype, dev, routing: str) -> dict:
    """Our tiles at T tokens under ``routing``: {"source": "<routing> entry" | "tile policy", "configs":
    (up, down) | None, "decode": DecodeConfig | None, "decode_shared": DecodeConfig | None,
    "crossover": int | None}; None values mean the launchers' own choice (the tile policy)."""
    name = routing_dist.parse(routing).name
    out = {"source": "tile policy", "configs": None, "decode": None, "decode_shared": None, "crossover": None}
    slug = tiles._slug(dev)
    if name == "uniform" or slug is None:
        return out
    e = tables.entry(slug, cfg.E, cfg.H, cfg.I, cfg.K, dtype, name)
    if not e:
        return out
    up, down = tiles.tuned(e, T, "up"), tiles.tuned(e, T, "down")
    if up is not None and down is not None and up.block_m == down.block_m:
        out["configs"] = (up, down)
    out["decode"] = tiles.tuned(e, T, "decode")
    n = shared_rides_along(cfg)
    if n:
        out["decode_shared"] = tiles.tuned(tables.entry(slug, cfg.E + n, cfg.H, cfg.I, cfg.K + n, dtype, name),
                                           T, "decode")
    out["crossover"] = int(e["crossover"]) if "crossover" in e else None
    out["source"] = f"{name} entry"
    return out


def nominal_busiest(routing: str) -> float:
    """What busiest/mean a routing aims at (uniform 1, zipf its r, the trace about 1.5): for choosing
    which peer configs to compile ahead, before any draw."""
    r = routing_dist.parse(routing)
    return r.ratio if r.kind == "zipf" else 1.5 if r.kind == "trace" else 1.0


def device_name(dev) -> str:
    return runtime.device_name(dev) if getattr(dev, "type", "cpu") == "cuda" else "cpu"
