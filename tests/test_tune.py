"""The tuner's search loop under Triton's interpreter: a tiny preset, a fake timer (no timed tests).
The quantized searches: tests/test_tune_quant.py; --refine: tests/test_tune_refine.py; the candidate
spaces they share (``small_space``): tests/conftest.py."""
from dataclasses import replace

import pytest
import torch

import dispatch  # noqa: F401
from dispatch import tables
from dispatch.kernels import tiles
from dispatch.kernels.tiles import DecodeConfig, GemmConfig
from dispatch.tune import main, search
from dispatch.tune.compile import compile_jobs
from dispatch.tune.search import block_ms, crossover, decode_steps, gemm_space, tune_preset


def fake_us(fn, cand):
    """Runs the candidate once (so it must work) and prices it by its config, deterministically."""
    fn()
    if isinstance(cand, GemmConfig):
        return 1000.0 / cand.block_n + cand.block_k / 64 + cand.num_stages / 10 + cand.group_m / 100
    if isinstance(cand, DecodeConfig):
        return 100.0 + cand.block_i / 16 + cand.block_ho / 32 - cand.programs / 1000
    return 50.0  # a whole grouped path


def test_search_loop_on_the_interpreter(tmp_path, small_space):
    cpu, logs = torch.device("cpu"), []
    entry = tune_preset("tiny", (2, 8, 32), cpu, torch.float32, timer=fake_us, log=logs.append)
    (key, e), = entry.items()
    assert key == tables.shape_key(8, 64, 32, 2, torch.float32)
    b = e["buckets"]
    assert set(b) == {"2", "8", "32"} and "up" not in b["2"] and {"decode", "up", "down"} <= set(b["8"])
    for T in ("8", "32"):  # the cheapest candidate by the fake price, over every block_m tried
        up, down = GemmConfig(**b[T]["up"]), GemmConfig(**b[T]["down"])
        bms = block_ms(int(T), 2, 8)
        best_up = min((c for bm in bms for c in gemm_space("up", bm, cpu)), key=lambda c: fake_us(lambda: 0, c))
        assert up.block_m in bms and down.block_m == up.block_m
        assert fake_us(lambda: 0, up) == fake_us(lambda: 0, best_up)
    d = DecodeConfig(**b["2"]["decode"])  # coordinate descent reaches the fake price's optimum:
    # the narrowest tiles, and the heuristic's programs (more than any candidate step offers: kept)
    base = tiles.heuristic_decode(2, 2, 8, 64, 32, cpu)
    assert (d.block_i, d.block_ho, d.programs) == (16, 16, base.programs) and base.programs > 4 * 4
    assert e["crossover"] == 2  # fake grouped path (50 µs) beats decode (>90 µs) from T=8
    assert any("decode" in s for s in logs)
    path = tables.write(tmp_path / "t.json", {"entries": entry})  # what the launchers will read back
    back = tables.load_file(path)["entries"][key]
    assert tiles.tuned(back, 64, "up") == GemmConfig(**b["32"]["up"])
    assert tiles.tuned(back, 1, "decode") == d


def test_shared_expert_decode_tiles_get_their_own_entry(small_space, monkeypatch):
    """A layer whose shared expert rides along (S = 2I, ungated) also gets decode tiles tuned with it
    inside the kernels, under the key the launcher reads for them: E + 2 experts, K + 2 choices."""
    from dispatch.config import PRESETS, MoEConfig

    monkeypatch.setitem(PRESETS, "tiny-shared", MoEConfig(64, 32, 8, 2, shared_intermediate_size=64,
                                                          family="deepseek_moe"))
    cpu, logs = torch.device("cpu"), []
    entries = tune_preset("tiny-shared", (2, 8), cpu, torch.float32, timer=fake_us, log=logs.append)
    routed, shared = tables.shape_key(8, 64, 32, 2, torch.float32), tables.shape_key(10, 64, 32, 4, torch.float32)
    assert set(entries) == {routed, shared}
    assert set(entries[shared]["buckets"]) == {"2", "8"}
    assert "crossover" not in entries[shared]  # moe() reads the layer's own crossover
    for T in ("2", "8"):  # which the layer's buckets compute with the shared expert on both paths
        b = entries[routed]["buckets"][T]
        assert b["decode_shared_us"] == entries[shared]["buckets"][T]["decode_us"] and b["shared_us"] == 50.0
    d = DecodeConfig(**entries[shared]["buckets"]["2"]["decode"])
    assert (d.block_i, d.block_ho) == (16, 16)  # the fake price's optimum, as for the routed tiles
    assert any("decode+shared" in s for s in logs)
    assert tiles.tuned(entries[shared], 2, "decode") == d  # what decode_config(T, K + 2, E + 2, ...) reads
    from dispatch.tune.compile import _compile_job  # its kernel variants are compiled ahead too

    jobs = [j for j in compile_jobs(["tiny-shared"], (2,), cpu) if j[2] == "decode_shared"]
    assert len(jobs) == 1 and jobs[0][3]
    assert _compile_job(("tiny-shared", 2, "decode_shared", [tiles.INTERPRET_DECODE])) == []


def test_a_partial_run_merges_into_the_entry_bucket_by_bucket():
    """Tuning a few buckets replaces those and keeps the others; the crossover is recomputed over all."""
    from dispatch.tune.search import merge_entry

    old = {"crossover": 4, "buckets": {"1": {"decode_us": 10.0}, "8": {"decode_us": 30.0, "grouped_us": 40.0},
                                       "4096": {"up": {"block_m": 128}, "grouped_us": 900.0}}}
    new = {"crossover": 1, "buckets": {"8": {"decode_us": 50.0, "grouped_us": 40.0}}}
    m = merge_entry(old, new)
    assert set(m["buckets"]) == {"1", "8", "4096"} and m["buckets"]["8"] == new["buckets"]["8"]
    assert m["buckets"]["4096"] == old["buckets"]["4096"] and m["crossover"] == 1  # grouped now wins at 8
    assert old["buckets"]["8"]["decode_us"] == 30.0  # the table's entry is not changed in place
    assert merge_entry(None, new) is new
    q = merge_entry({"buckets": {"1": {"decode_us": 5.0}}}, {"buckets": {"2": {"decode_us": 6.0}}})
    assert set(q["buckets"]) == {"1", "2"} and "crossover" not in q  # quantized / shared entries: none


def test_crossover_rule():
    b = {"1": {"decode_us": 5}, "8": {"decode_us": 9, "grouped_us": 20}, "16": {"decode_us": 30, "grouped_us": 20},
         "32": {"decode_us": 30, "grouped_us": 40}, "512": {"grouped_us": 100}}
    assert crossover(b) == 8  # the first bucket the grouped path wins ends the decode range
    assert crossover({"1": {"decode_us": 1}, "4": {"decode_us": 2}}) == 4
    assert crossover({"16": {"grouped_us": 1}}) == 0


def test_spaces_fit_and_compile_jobs_cover_them(monkeypatch):
    from dispatch import runtime

    cpu = torch.device("cpu")
    monkeypatch.setattr(runtime, "max_shared_bytes", lambda dev=None: 227 * 1024)  # an H200's
    for kind in ("up", "down"):
        for bm in (16, 32, 64, 128):
            space = gemm_space(kind, bm, cpu)
            n_b = 2 if kind == "up" else 1
            assert len(space) >= 4 and all(tiles.fits_registers(c, n_b) and c.block_m == bm for c in space)
            assert all(tiles.shared_bytes(c, n_b) <= 227 * 1024 - tiles.HEADROOM for c in space)
            assert (bm >= 64) == any(c.group_m > 1 for c in space)
    assert block_ms(1, 8, 64) == (16,) and block_ms(16384, 2, 8) == (128,) and block_ms(1024, 6, 64) == (64, 128)
    jobs = compile_jobs(["tiny"], (1, 8, 4096), cpu)
    covered = {(kind, c) for _, _, kind, cands in jobs for c in cands}
    for bm in block_ms(4096, 2, 8):
        assert all(("up", c) in covered for c in gemm_space("up", bm, cpu))
    base = tiles.heuristic_decode(1, 2, 8, 64, 32, cpu)
    assert all(("decode", c) in covered for c in decode_steps(base, 1)[0](base))
    split = decode_steps(base, 1, 1)[4](base)  # split items' tiles, once each (the grid is not compiled in)
    assert split and all(("decode", replace(c, programs=base.programs)) in covered for c in split)


def test_precompile_workers(small_space):
    """A spawned worker imports the package, runs every variant of each job once and reports failures."""
    from dispatch.tune.compile import precompile

    jobs = compile_jobs(["tiny"], (1, 8), torch.device("cpu"))
    jobs.append(("tiny", 1, "decode", [tiles.INTERPRET_DECODE]))
    jobs.append(("tiny", 1, "decode:int8-group128", [replace(tiles.INTERPRET_DECODE, block_h=64)]))  # fitted
    w8a8 = replace(tiles.INTERPRET_CONFIG, block_k=16)
    jobs += [("tiny", 16, "up:fp8-channel", [w8a8]), ("tiny", 16, "down:fp8-channel", [w8a8])]
    assert {j[2] for j in jobs} == {"decode", "up", "down", "decode:int8-group128", "up:fp8-channel",
                                    "down:fp8-channel"}
    assert precompile(jobs, workers=1, log=lambda s: None) == []  # one spawned worker takes every job


def test_compile_workers_fit_the_device_memory():
    """Each worker holds a preset's weights (x4 with codes): on an H200, 12 of them ran out of memory."""
    from dispatch.tune.compile import workers_that_fit

    mixtral = 3 * 8 * 4096 * 14336 * 2  # bf16 bytes of Mixtral's experts
    jobs = [("tiny", 1, "decode", []), ("mixtral-8x7b", 16, "up:fp8-channel", [])]
    per = (1 << 30) + 7 * mixtral  # the largest job's need: 20.8 GB
    assert workers_that_fit(jobs, 12, 140 * 10**9) == int(0.8 * 140 * 10**9) // per == 5
    assert workers_that_fit(jobs, 2, 140 * 10**9) == 2  # never more than asked
    assert workers_that_fit(jobs, 12, 10 * 10**9) == 0  # none fits: compile while timing
    assert workers_that_fit(jobs[:1], 12, 140 * 10**9) == 12  # tiny: only the CUDA context counts


def test_cli_rejects_bad_requests():
    with pytest.raises(SystemExit, match="unknown preset"):
        main(["--preset", "nope"])
    with pytest.raises(SystemExit, match="CUDA"):
        main(["--preset", "tiny"])


def test_search_never_keeps_a_slower_config(small_space, monkeypatch):
    """A step whose candidates all time slower than the current config keeps it; a whole grouped path
    that times slower with the tuned tiles than with the heuristic's keeps the heuristic's."""
    cpu = torch.device("cpu")
    base = tiles.heuristic_decode(2, 2, 8, 64, 32, cpu)

    def decode_us(fn, cand):  # the heuristic's config is the fastest decode config there is
        fn()
        return 10.0 if cand == base else 20.0

    case = search.make_case("tiny", 2, cpu, torch.float32)
    d = search.tune_decode("tiny", 2, case, cpu, decode_us, log=lambda s: None)
    assert DecodeConfig(**d["decode"]) == base and d["decode_us"] == d["decode_heuristic_us"] == 10.0

    def grouped_us(fn, cand):  # kernels price as fake_us, but the whole path is slower with tuned tiles
        if isinstance(cand, tuple) and cand[0] == "grouped":
            fn()
            return 40.0 if cand[1] == tiles.heuristic_gemm("up", cand[1].block_m, cpu) else 60.0
        return fake_us(fn, cand)

    case = search.make_case("tiny", 32, cpu, torch.float32)
    g = search.tune_grouped("tiny", 32, case, cpu, grouped_us, log=lambda s: None)
    up = GemmConfig(**g["up"])
    assert up == tiles.heuristic_gemm("up", up.block_m, cpu) and g["grouped_us"] == g["grouped_heuristic_us"] == 40.0


@pytest.mark.parametrize("one_row_faster", [True, False])
def test_one_token_also_descends_from_one_row_tiles(small_space, one_row_faster):
    """At T = 1 a second descent starts from block_m = 1 (FMAs); the faster of the two descents is
    kept, and the heuristic's time stays the first start's. Above one token: no one-row start."""
    cpu = torch.device("cpu")

    def price(fn, cand):
        fn()
        return fake_us(fn, cand) + (-50.0 if one_row_faster else 50.0) * (cand.block_m == 1)

    case = search.make_case("tiny", 1, cpu, torch.float32)
    d = search.tune_decode("tiny", 1, case, cpu, price, log=lambda s: None)
    assert (DecodeConfig(**d["decode"]).block_m == 1) == one_row_faster
    base = tiles.heuristic_decode(1, 2, 8, 64, 32, cpu)
    assert d["decode_heuristic_us"] == price(lambda: 0, base)
    assert [c.block_m for c in search.decode_starts(base, 1)] == [base.block_m, 1]
    assert search.decode_starts(base, 2) == [base]


def test_crossover_counts_the_shared_expert_where_each_path_runs_it():
    """Hand-computed: decode wins up to the last bucket before grouped first wins; where the shared
    expert rides along, decode carries it inside (decode_shared_us) and grouped pays it in torch."""
    b = {"1": {"decode_us": 10.0}, "8": {"decode_us": 30.0, "grouped_us": 29.0},
         "16": {"decode_us": 40.0, "grouped_us": 30.0}}
    assert crossover(b) == 1  # routed only: grouped wins at 8
    b["8"].update(decode_shared_us=33.0, shared_us=5.0)  # 33 against 29 + 5: decode
    b["16"].update(decode_shared_us=45.0, shared_us=5.0)  # 45 against 30 + 5: grouped
    assert crossover(b) == 8
    b["8"]["shared_us"] = 3.0  # 33 against 32: grouped
    assert crossover(b) == 1
    assert crossover({"8": {"grouped_us": 5.0}}) == 0  # no decode tuned: grouped from the start


def test_the_descent_ends_with_the_one_launch_step(small_space):
    """The last step tries the same tiles in one launch (every lag × grid size) and keeps it only if faster."""
    cpu = torch.device("cpu")
    steps = decode_steps(DecodeConfig(), 4)
    last = steps[-1](DecodeConfig())
    assert {c.fused for c in last} == set(search.LAGS) and all(c.block_i == DecodeConfig().block_i for c in last)
    assert all(c.fused == 0 for step in steps[:-1] for c in step(DecodeConfig()))
    case = search.make_case("tiny", 2, cpu, torch.float32)
    for bonus in (-30.0, 30.0):  # one launch faster, or slower, than the best three-launch config
        d = search.tune_decode("tiny", 2, case, cpu, lambda fn, c, bonus=bonus: fake_us(fn, c) + bonus * (c.fused > 0),
                               log=lambda s: None)
        assert (DecodeConfig(**d["decode"]).fused > 0) == (bonus < 0)


def test_split_items_are_tried_at_few_tokens_and_kept_only_when_faster(small_space):
    """At T ≤ SPLIT_MAX_T the descent ends with split items (every SPLIT_TILES × grid size, fused=0),
    then their down chunk; beyond, no split step. A split config wins only when timed faster, and the
    table's entry round-trips to the config the launcher runs."""
    from dispatch.kernels.decode_split import SPLIT_MAX_T

    base = DecodeConfig(fused=64)
    assert len(decode_steps(base, 4, SPLIT_MAX_T + 1)) == len(decode_steps(base, 4)) == 4
    steps = decode_steps(base, 4, 1)
    split = steps[4](base)
    assert {(c.block_i, c.block_ho) for c in split} == set(search.SPLIT_TILES)
    assert all(c.split == 1 and c.fused == 0 for c in split)
    assert len(split) == len(search.SPLIT_TILES) * len(search.PROGRAMS_PER_SM)
    assert steps[5](base) == [] and {c.block_ho for c in steps[5](split[0])} == set(search.SPLIT_HO)
    assert all(c.split == 0 for c in steps[3](split[0]))  # the one-launch step from a split config: fused only
    case = search.make_case("tiny", 2, torch.device("cpu"), torch.float32)
    for bonus in (-30.0, 30.0):
        d = search.tune_decode("tiny", 2, case, torch.device("cpu"),
                               lambda fn, c, bonus=bonus: fake_us(fn, c) + bonus * c.split, log=lambda s: None)
        assert DecodeConfig(**d["decode"]).split == (bonus < 0)
