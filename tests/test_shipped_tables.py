"""The tile tables that ship with the package (``dispatch/tables/<gpu>.json``): every entry is one the
launchers can read. A table is written on a GPU and merged into over several runs; a broken merge,
a hand edit or a config field renamed since would otherwise surface only on that GPU."""
import importlib.resources
import re

import pytest

from dispatch import quant, tables
from dispatch.config import PRESETS
from dispatch.kernels.tiles import DecodeConfig, GemmConfig
from dispatch.tune import refine

KEY = re.compile(r"E=(\d+),H=(\d+),I=(\d+),K=(\d+),(bfloat16|float16|float32)(?:\+([a-z0-9-]+?))?(\+w8a8)?$")
SHIPPED = sorted(f.name.removesuffix(".json") for f in importlib.resources.files(tables).iterdir()
                 if f.name.endswith(".json"))


def layer_shapes() -> set[tuple[int, ...]]:
    """(E, H, I, K) of every preset's decode entries as the tuner keys them (``refine.variants``: the
    layer, and E + n, K + n where its shared expert rides along as n experts)."""
    return {tuple(map(int, KEY.match(k).groups()[:4])) for name in PRESETS
            for k, *_ in refine.variants(name, "bfloat16")}


def test_the_h200_and_h100_tables_ship():
    assert {"h200", "h100-80gb-hbm3"} <= set(SHIPPED)


@pytest.mark.parametrize("slug", SHIPPED)
def test_every_shipped_entry_is_readable(slug):
    doc = tables.load(slug)
    assert tables.device_slug(doc["device"]) == slug, "a table is named after the GPU it was tuned on"
    assert doc["entries"] and {"torch", "triton"} <= set(doc["versions"])
    shapes = layer_shapes()
    for key, e in doc["entries"].items():
        m = KEY.match(key)
        assert m, f"{slug}: {key!r} is not 'E=..,H=..,I=..,K=..,<dtype>[+<scheme>[+w8a8]]'"
        assert tuple(map(int, m.groups()[:4])) in shapes, f"{slug}: {key} is no preset's layer"
        scheme, w8a8 = m.group(6), m.group(7)
        assert scheme is None and w8a8 is None or scheme in quant.SCHEMES, key
        assert w8a8 is None or scheme.startswith("fp8"), f"{key}: w8a8 multiplies fp8 codes"
        assert e["buckets"] and set(e["buckets"]) <= {str(b) for b in tables.BUCKETS}, key
        # decode for T ≤ crossover: 0 = never; no key = the launchers' default (decode-only entries)
        assert "crossover" not in e or e["crossover"] in (0, *tables.BUCKETS), key
        for T, b in e["buckets"].items():
            assert "decode" in b or {"up", "down"} <= set(b), f"{key} T={T}: neither decode nor grouped tiles"
            if "decode" in b:
                c = DecodeConfig(**b["decode"])  # validates (powers of two, fused/split)
                assert b["decode_us"] > 0 and not (c.split and c.fused), (key, T)
            for kind in ("up", "down"):
                if kind in b:
                    GemmConfig(**b[kind])

