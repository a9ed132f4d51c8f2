"""Chapter 2's tuning and race tables compute what they say, on hand-made recordings."""
import matplotlib

matplotlib.use("Agg")

from dispatch import tables  # noqa: E402
from dispatch.config import PRESETS  # noqa: E402
from dispatch_book.bench.kernels import ours_row  # noqa: E402
from dispatch_book.figures import tuning  # noqa: E402

UP = {"block_m": 16, "block_n": 64, "block_k": 128, "num_warps": 4, "num_stages": 3, "group_m": 1}
BIG = {"block_m": 128, "block_n": 256, "block_k": 64, "num_warps": 8, "num_stages": 4, "group_m": 16}
DEC = {"block_i": 32, "block_h": 256, "block_ho": 64, "block_id": 128, "programs": 528}


def _table():
    c = PRESETS["olmoe-1b-7b"]
    buckets = {"1": {"decode": DEC, "decode_us": 40.0, "decode_heuristic_us": 50.0},
               "8": {"decode": DEC, "decode_us": 100.0, "decode_heuristic_us": 100.0,
                     "up": UP, "down": UP, "grouped_us": 120.0, "grouped_heuristic_us": 110.0},
               "4096": {"up": BIG, "down": BIG, "grouped_us": 800.0, "grouped_heuristic_us": 1000.0}}
    return {"entries": {tables.shape_key(c.E, c.H, c.I, c.K, "bfloat16"): {"crossover": 8, "buckets": buckets}}}


def test_tuned_rows_take_the_path_of_the_crossover_and_the_gain_heuristic_over_tuned():
    rows = tuning.tuned_rows(_table(), ["olmoe-1b-7b", "mixtral-8x7b"], (1, 8, 64, 4096))
    assert [(r["T"], r["path"]) for r in rows] == [(1, "decode"), (8, "decode"), (4096, "grouped")]
    assert rows[0]["gain"] == 50.0 / 40.0 and rows[1]["gain"] == 1.0 and rows[2]["gain"] == 1000.0 / 800.0
    assert rows[0]["tuned tiles"] == "i32·h256 ho64·id128 p528"
    assert rows[2]["tuned tiles"] == "up 128×256×64 w8 s4 g16; down 128×256×64 w8 s4 g16"


def test_crossovers_and_winners_read_the_entry():
    assert tuning.crossovers(_table(), ["olmoe-1b-7b", "mixtral-8x7b"]) == [
        {"preset": "olmoe-1b-7b", "E": 64, "I": 1024, "K": 8, "decode for T ≤": 8}]
    small = tuning.winners(_table(), ["olmoe-1b-7b"], 8, 64)
    assert small["up"]["block_m"] == [16] and small["down"]["num_warps"] == [4]
    both = tuning.winners(_table(), ["olmoe-1b-7b"], 1, 16384)
    assert both["down"]["block_n"] == [64, 256] and both["up"]["group_m"] == [1, 16]


def _rec(shape, T, name, ms, chosen=None):
    r = {"shape": shape, "tokens": T, "contestant": name, "median_ms": ms}
    return r if chosen is None else {**r, "chosen": chosen}


def _rows(persistent=False):
    rows = []
    for T, dec, grp, peer in ((1, 0.030, 0.040, 0.036), (64, 0.30, 0.20, 0.21), (4096, None, 1.00, 1.05),
                              (16384, None, 4.0, 4.8)):
        if dec is not None:
            rows.append(_rec("s", T, "ours_decode", dec, T <= 1))
        rows += [_rec("s", T, "ours_grouped", grp, T > 1), _rec("s", T, "peer_fused_moe", peer)]
        if persistent and T >= 4096:
            rows.append(_rec("s", T, "ours_persistent", grp * 0.8 if T == 4096 else grp * 1.25))
    rows.append({"shape": "s", "tokens": 16384, "contestant": "ours_decode", "skipped": "decode path: T ≤ 256"})
    return rows


def test_peer_race_uses_the_chosen_row_and_the_summary_counts_the_bars():
    rows = _rows()
    race = tuning.peer_race(rows, lambda s, T: ours_row(rows, s, T, 64))
    assert [(r["T"], r["ours"]) for r in race] == [(1, "decode"), (64, "grouped"), (4096, "grouped"),
                                                   (16384, "grouped")]
    assert abs(race[0]["peer / ours"] - 1.2) < 1e-12 and abs(race[0]["ours µs"] - 30.0) < 1e-9
    s = tuning.race_summary(race, large_T=4096, bar=1.10)
    assert s == {"sizes": 4, "at_most_peer": 4, "large": 2, "large_met": 1, "slower": [],
                 "large_missed": ["s T=4096"]}
    fig = tuning.race_figure(race)
    assert len(fig.axes[0].lines) >= 2
    assert "by round" not in race[0]  # a recording without rounds: no column
    for r in rows:  # three interleaved rounds: peer / ours per round, lowest and highest
        if r["tokens"] == 64 and "median_ms" in r:
            r["round_medians_ms"] = [0.20, 0.25, 0.16] if r["contestant"] == "ours_grouped" else [0.21, 0.21, 0.20]
    race = tuning.peer_race(rows, lambda s, T: ours_row(rows, s, T, 64))
    assert race[1]["by round"] == "0.84–1.25" and "by round" not in race[0]


def test_persistent_ratios_are_empty_without_rows_and_plain_over_persistent_with_them():
    assert tuning.persistent_ratios(_rows()) == []
    got = tuning.persistent_ratios(_rows(persistent=True))
    assert [(r["T"], round(r["plain / persistent"], 6)) for r in got] == [(4096, 1.25), (16384, 0.8)]


def test_the_shipped_h200_table_has_every_raced_preset():
    doc = tables.load("h200")
    presets = ("olmoe-1b-7b", "qwen3-30b-a3b", "deepseek-moe-16b", "mixtral-8x7b")
    assert len(tuning.crossovers(doc, presets)) == 4
    rows = tuning.tuned_rows(doc, presets, (1, 8, 64, 256, 1024, 4096, 16384))
    assert len(rows) == 28 and all(r["tuned µs"] > 0 and r["heuristic µs"] > 0 for r in rows)


def test_the_shipped_h200_crossovers_follow_their_own_times():
    """Every crossover in the shipped table is the one its buckets' times give (``search.crossover``),
    bf16 and quantized alike; a quantized entry with one timed its grouped GEMM (weight-only, or
    on fp8 activations for '+w8a8') from GROUPED_MIN_T tokens beside its decode path."""
    from dispatch.tune.search import GROUPED_MIN_T, crossover

    entries = tables.load("h200")["entries"]
    quantized = {k: e for k, e in entries.items() if "+" in k and "crossover" in e}
    assert len(quantized) >= 9  # three schemes on OLMoE, Qwen3-30B-A3B and DeepSeek-MoE at least
    for key, e in entries.items():
        if "crossover" in e:
            assert e["crossover"] == crossover(e["buckets"]), key
    for key, e in quantized.items():
        both = [int(T) for T, b in e["buckets"].items() if "grouped_us" in b and "decode_us" in b]
        assert both and min(both) == GROUPED_MIN_T, key  # grouped timed beside decode from 8 tokens
        # w8a8 entries also hold the grouped GEMM's own tiles (from 128 tokens, no decode there)
        assert all("decode_us" in b or "up" in b for b in e["buckets"].values()), key


def test_the_shipped_h100_table_is_a_whole_tuning_of_the_presets_it_holds():
    """The H100 table (``python -m dispatch.tune`` on an H100, the four benchmark presets): every bucket of
    each layer's entry, and crossovers that follow its own times; a shared expert riding along (keyed
    E + n, K + n: DeepSeek-MoE's) has a decode-only entry, every bucket up to DECODE_MAX_T, no crossover."""
    from dispatch.tune.refine import variants
    from dispatch.tune.search import BENCH_PRESETS, DECODE_MAX_T, crossover

    doc = tables.load("h100-80gb-hbm3")
    assert doc["device"] == "NVIDIA H100 80GB HBM3"
    keys = {key: kind for name in BENCH_PRESETS for key, kind, _ in variants(name, "bfloat16")}
    riding = {key for key, kind in keys.items() if kind == "decode_shared"}
    assert set(doc["entries"]) == set(keys) and riding
    for key, e in doc["entries"].items():
        if key in riding:
            assert sorted(map(int, e["buckets"])) == [b for b in tables.BUCKETS if b <= DECODE_MAX_T], key
            assert "crossover" not in e and all("decode" in b for b in e["buckets"].values()), key
            continue
        assert sorted(map(int, e["buckets"])) == list(tables.BUCKETS), key
        assert e["crossover"] == crossover(e["buckets"]), key
