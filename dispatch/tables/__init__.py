"""Per-device tuned tile tables: the shipped ``dispatch/tables/<device-slug>.json`` (package data) with
the user's own table layered over it, read once.

The user's table lives in ``$DISPATCH_TABLES/<slug>.json``, else ``$XDG_CACHE_HOME/dispatch/tables``
(``~/.cache/dispatch/tables``): ``python -m dispatch.tune`` writes there by default (a run merges into
the file bucket by bucket), never into the installed package; an entry of the user's table replaces
the shipped entry of the same key. Read by :func:`dispatch.kernels.tiles.resolve`.
One file per device; inside, one entry per layer shape and dtype::

    {"device": "NVIDIA H200", "date": ..., "versions": {...},
     "entries": {"E=64,H=2048,I=1024,K=8,bfloat16": {
         "crossover": 32,                      # decode path for T <= crossover, grouped GEMM above
         "buckets": {"1":    {"decode": {...DecodeConfig fields...}, "decode_us": 37.1},
                     "4096": {"up": {...GemmConfig...}, "down": {...}, "grouped_us": 1001.2}, ...}}}}

Token counts T are looked up in the nearest tuned bucket (log2 distance, ties to the larger).
Quantized experts (``--quant``) have entries of their own: dtype 'bfloat16+<scheme>' (decode buckets)
and 'bfloat16+<scheme>+w8a8' (the w8a8 grouped GEMM's up/down, read only within 2× of a bucket).
A layer whose shared expert rides along in the decode kernels has a decode-only entry keyed by E + n
experts and K + n choices (n = S / I), next to its own.
Tuned under a routing other than uniform (``python -m dispatch.tune --routing zipf:3``,
:mod:`dispatch.tune.routing_dist`), an entry's key ends with that routing: 'E=64,...,bfloat16,zipf:3';
uniform entries keep the plain key.
"""
from __future__ import annotations

import functools
import importlib.resources
import json
import math
import os
import pathlib
import re

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


@functools.lru_cache(maxsize=None)
def device_slug(name: str) -> str:
    """'NVIDIA H200' → 'h200', 'NVIDIA H100 80GB HBM3' → 'h100-80gb-hbm3' (the results folders' rule)."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower().replace("nvidia", "")).strip("-") or "cpu"


def shape_key(E: int, H: int, I: int, K: int, dtype, routing: str = "uniform") -> str:  # noqa: E741
    """The key of one layer shape: 'E=64,H=2048,I=1024,K=8,bfloat16'; tuned under a routing other than
    uniform (its canonical name, ``routing_dist.parse(spec).name``), with it appended: '...,bfloat16,zipf:3'."""
    key = f"E={E},H={H},I={I},K={K},{str(dtype).removeprefix('torch.')}"
    return key if routing == "uniform" else f"{key},{routing}"


def user_dir() -> pathlib.Path:
    """Where the user's tables live: ``$DISPATCH_TABLES``, else ``$XDG_CACHE_HOME/dispatch/tables``
    (default ``~/.cache/dispatch/tables``)."""
    if os.environ.get("DISPATCH_TABLES"):
        return pathlib.Path(os.environ["DISPATCH_TABLES"]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(cache) / "dispatch" / "tables"


def user_dir_key() -> str:
    """What :func:`user_dir` depends on, as a string (a cache key: no path is built)."""
    return "|".join(os.environ.get(v, "") for v in ("DISPATCH_TABLES", "XDG_CACHE_HOME", "HOME"))


def user_path(slug: str) -> pathlib.Path:
    """The user's table of device ``slug`` (the tuner's default output)."""
    return user_dir() / f"{slug}.json"


@functools.lru_cache(maxsize=None)
def shipped(slug: str) -> dict:
    """The table of device ``slug`` that ships with the package ({} if none ships): read once."""
    try:
        text = importlib.resources.files(__name__).joinpath(f"{slug}.json").read_text()
    except (FileNotFoundError, OSError):
        return {}
    return json.loads(text)


def load(slug: str) -> dict:
    """The table of device ``slug``: the shipped one with the user's entries layered over it ({} if
    neither exists). Read once per process (and per user folder)."""
    return _load(slug, user_dir_key())


@functools.lru_cache(maxsize=None)
def _load(slug: str, user: str) -> dict:
    base, mine = shipped(slug), load_file(user_path(slug))
    if not mine:
        return base
    return {**base, **{k: v for k, v in mine.items() if k != "entries"},
            "entries": {**base.get("entries", {}), **mine.get("entries", {})}}


def entry(slug: str, E: int, H: int, I: int, K: int, dtype, routing: str = "uniform") -> dict | None:  # noqa: E741
    """The tuned entry for this device and shape (tuned under ``routing``), or None."""
    return load(slug).get("entries", {}).get(shape_key(E, H, I, K, dtype, routing))


def nearest_bucket(buckets, T: int, need: str | None = None, within: float | None = None) -> dict | None:
    """The bucket (a dict of a shape entry's "buckets") nearest to T in log2, holding ``need``;
    ``within``: None unless it lies at most that far from T in log2 (1: within 2×)."""
    held = [(int(b), v) for b, v in buckets.items() if need is None or need in v]
    if not held:
        return None
    lt = math.log2(max(T, 1))
    b, v = min(held, key=lambda bv: (abs(math.log2(bv[0]) - lt), -bv[0]))
    return v if within is None or abs(math.log2(b) - lt) <= within else None


def load_file(path) -> dict | None:
    """A table file anywhere (the tuner merges into its --out file), or None if there is none;
    ValueError naming the file if it is not a table (not JSON, or no "entries")."""
    path = pathlib.Path(path)
    if not path.exists():
        return None
    try:
        doc = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} is not a tile table (not valid JSON: {e})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("entries", {}), dict):
        raise ValueError(f"{path} is not a tile table (expected a JSON object with an \"entries\" object)")
    return doc


def write(path, doc: dict) -> pathlib.Path:
    """Write a table (the tuner's output) as sorted, indented JSON, whole or not at all: a write cut
    short leaves the table it was merging into as it was."""
    from dispatch import files

    return files.write_text(path, json.dumps(doc, indent=1, sort_keys=True) + "\n")
