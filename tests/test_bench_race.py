"""The kernels race's contestants and bookkeeping: the tuned peer, torch's grouped GEMM, routing, targets."""
import json

import pytest
import torch

import dispatch  # noqa: F401
from dispatch.config import PRESETS, random_weights
from dispatch.reference import experts_reference, route_reference
from dispatch_book.bench import kernels, kernels_targets, peer_search, peers, results, skew, torch_grouped

CPU = torch.device("cpu")


def _case(T, E, K, H=48, I=40, seed=0, ids=None):  # noqa: E741  (ragged tiles)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g)
    gate_up, down = torch.randn(E, 2 * I, H, generator=g) / H ** 0.5, torch.randn(E, H, I, generator=g) / I ** 0.5
    if ids is None:
        ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    return x, torch.rand(T, K, generator=g), ids, gate_up, down


# ---- torch's grouped GEMM (transformers' grouped_mm path) ----

@pytest.mark.parametrize("T,E,K,ids", [(1, 4, 2, None), (37, 8, 2, None), (16, 4, 2, "one"), (9, 6, 3, "skip")])
def test_torch_grouped_matches_the_reference_and_transformers(T, E, K, ids):
    """Edges: one token; every token on experts 0 and 1 (the others get nothing); expert 5 never chosen."""
    if ids == "one":
        ids = torch.tensor([[0, 1]] * T)
    elif ids == "skip":
        g = torch.Generator().manual_seed(1)
        ids = torch.stack([torch.randperm(E - 1, generator=g)[:K] for _ in range(T)])
    x, w, ids, gate_up, down = _case(T, E, K, ids=ids)
    y = torch_grouped.grouped_mm_experts(x, w, ids, gate_up, down)
    torch.testing.assert_close(y, experts_reference(x, w, ids, gate_up, down), rtol=1e-5, atol=1e-5)
    from dispatch_book.bench import hf_baselines  # the code it mirrors: transformers' own grouped_mm experts

    torch.testing.assert_close(y, hf_baselines.hf_experts(x, w, ids, gate_up, down, "grouped_mm"), rtol=1e-6,
                               atol=1e-6)


def test_torch_grouped_is_timed_from_256_tokens_or_says_why_not(monkeypatch):
    cfg = PRESETS["tiny"]
    w = random_weights(cfg, seed=0)
    for T, want in ((8, "timed from 256 tokens"), (256, None)):
        x = torch.randn(T, cfg.H)
        out = kernels.contestants(cfg, w, x, *route_reference(torch.randn(T, cfg.E), cfg), CPU)
        reason = out["torch_grouped_mm"][1]
        assert reason is None if want is None else want in reason
    import torch.nn.functional as F

    monkeypatch.delattr(F, "grouped_mm", raising=False)
    monkeypatch.delattr(torch, "_grouped_mm", raising=False)
    out = kernels.contestants(cfg, w, x, *route_reference(torch.randn(256, cfg.E), cfg), CPU)
    assert out["torch_grouped_mm"][1].startswith("did not run: torch") and "grouped_mm" in out["torch_grouped_mm"][1]


def test_a_contestant_that_fails_or_is_wrong_is_recorded_never_timed():
    ref = torch.ones(4, 8)
    for cname, fn, want in (("torch_grouped_mm", lambda: ref * 2, "wrong result"),
                            ("torch_grouped_mm", lambda: 1 / 0, "did not run: ZeroDivisionError")):
        graphed, row = {}, {"shape": "s"}
        assert want in kernels._check_and_time(cname, fn, ref, 4, 1, 3, graphed, row)
        assert not graphed and "median_ms" not in row
    graphed = {}
    assert kernels._check_and_time("torch_grouped_mm", lambda: ref, ref, 4, 1, 3, graphed, {}) is None
    assert list(graphed) == ["torch_grouped_mm"]  # timed later, in rounds with ours and the peer
    with pytest.raises(AssertionError, match="ours_grouped is wrong"):
        kernels._check_and_time("ours_grouped", lambda: ref * 2, ref, 4, 1, 3, {}, {"shape": "s"})


# ---- the peer: its kernel, its configs, its search ----

def test_silu_and_mul_matches_its_twin():
    gu = torch.randn(7, 2 * 40)
    torch.testing.assert_close(peers.silu_and_mul(gu), peers.silu_and_mul_torch(gu), rtol=1e-6, atol=1e-6)
    assert peers.silu_and_mul(torch.empty(0, 8)).shape == (0, 4)
    with pytest.raises(ValueError, match=r"\[N, 2I\]"):
        peers.silu_and_mul(torch.randn(3, 5))


@pytest.mark.parametrize("bm", peer_search.GRID["BLOCK_SIZE_M"])
def test_peer_kernel_every_tile_family_of_the_grid(bm):
    """Every (BLOCK_M, BLOCK_N, BLOCK_K) of vLLM's tuner grid computes the layer (the interpreter runs
    tiles larger than the tiny matrices: masked loads, wrapped columns), and GROUP_M swizzles right."""
    x, w, ids, gate_up, down = _case(40, 4, 2)
    ref = experts_reference(x, w, ids, gate_up, down)
    aligned = peers.align(ids, 4, bm)
    for bn in peer_search.GRID["BLOCK_SIZE_N"]:
        for bk in peer_search.GRID["BLOCK_SIZE_K"]:
            y = peers.fused_moe(x, w, ids, gate_up, down, aligned, (bm, bn, bk, 1, 4, 2))
            torch.testing.assert_close(y, ref, rtol=1e-4, atol=1e-4, msg=lambda m, c=(bm, bn, bk): f"{c}: {m}")
    for g in peer_search.GRID["GROUP_SIZE_M"][1:]:
        y = peers.fused_moe(x, w, ids, gate_up, down, aligned, (bm, 32, 64, g, 4, 2))
        torch.testing.assert_close(y, ref, rtol=1e-4, atol=1e-4)


def test_vllm_tables_are_cited_and_lie_in_vllms_grid():
    doc = json.loads(peer_search.TABLES.read_text())
    grid = set(peer_search.grid())
    for t in doc["tables"]:
        assert t["url"] == f"https://github.com/{t['repo']}/blob/{t['commit']}/{t['path']}" and len(t["commit"]) == 40
        assert f"E={t['E']},N={t['N']},device_name={t['device']}.json" in t["path"] and t["origin"] in ("vllm", "fork")
        assert {tuple(c) for c in t["configs"].values()} <= grid  # vLLM's tuner only writes grid configs
    shapes = {(c.E, c.I) for c in (PRESETS[s] for s in kernels.SHAPES)}
    assert {(t["E"], t["N"]) for t in doc["tables"]} <= shapes


def test_candidates_start_from_this_gpus_table_then_the_grid():
    qwen = PRESETS["qwen3-30b-a3b"]  # vLLM ships E=128,N=768 tables for the H100 and the H200
    cands = peer_search.candidates(4096, qwen.K, qwen.E, qwen.I, "NVIDIA H100 80GB HBM3")
    assert cands[0] == ((128, 256, 64, 1, 8, 4), "vllm NVIDIA_H100_80GB_HBM3 M=4096")
    assert any(src.startswith("vllm NVIDIA_H200") for _, src in cands)
    grid = set(peer_search.grid())
    assert all(c in grid for c, src in cands if src == "grid") and all(peer_search.fits(c) for c, _ in cands)
    assert len({c for c, _ in cands}) == len(cands)
    small = {c for c, _ in peer_search.candidates(8, qwen.K, qwen.E, qwen.I, "NVIDIA H100 80GB HBM3")}
    assert {c[0] for c in small} == {16} and any(c[2] == 256 for c in small) and any(c[1] == 32 for c in small)
    assert peer_search.block_ms(16384, 8, 64, 1.0) == (128, 256) and peer_search.block_ms(1, 8, 64, 8.0) == (16,)
    skewed = peer_search.block_ms(256, 8, 64, 3.0)  # the busiest expert's rows widen the range
    assert set(peer_search.block_ms(256, 8, 64, 1.0)) < set(skewed)


def _fake_search(budget_s=60.0, cands=None, prepare=None):
    cands = cands or [((16, 64, 64, 1, 4, 3), "a"), ((16, 32, 64, 1, 4, 3), "b"), ((16, 128, 64, 1, 4, 3), "bad"),
                      ((16, 256, 64, 1, 4, 3), "boom")]

    def run(c):
        if c[1] == 256:
            raise RuntimeError("out of resources")
        return c

    price = {}  # µs by config: narrower N and more stages cheaper; the 'bad' one is wrong
    return peer_search.search(run, lambda y: y[1] != 128, lambda fn: price.setdefault(fn(), fn()[1] - fn()[5]),
                              cands, budget_s, prepare=prepare)


def test_search_takes_the_fastest_correct_config_then_refines_it():
    prepared = []
    out = _fake_search(prepare=prepared.append)
    assert out["config"] == [16, 32, 64, 1, 4, 5] and out["source"] == "refine"  # stages 5: the grid's deepest
    assert prepared == [peer_search.neighbours((16, 32, 64, 1, 4, 3))]  # compiled together, before timing
    assert out["stopped"] == "done" and out["tried"] == 4 + len(peer_search.neighbours((16, 32, 64, 1, 4, 3)))
    nothing = _fake_search(budget_s=0.0)
    assert nothing["config"] is None and nothing["stopped"] == "budget"
    with pytest.raises(AssertionError, match="no peer config"):
        peer_search.tuned_peer(PRESETS["tiny"], random_weights(PRESETS["tiny"]), torch.randn(2, 64),
                               *route_reference(torch.randn(2, 8), PRESETS["tiny"]), torch.zeros(2, 64), CPU,
                               tolerance=1e-9, budget_s=0.0)


def test_tuned_peer_on_the_interpreter_matches_the_reference(monkeypatch):
    cfg = PRESETS["tiny"]
    w = random_weights(cfg, seed=3)
    x = torch.randn(5, cfg.H, generator=torch.Generator().manual_seed(4))
    wts, ids = route_reference(torch.randn(5, cfg.E, generator=torch.Generator().manual_seed(5)), cfg)
    few = [((16, 32, 64, 1, 4, 2), "grid"), ((16, 64, 64, 1, 4, 2), "grid")]
    monkeypatch.setattr(peer_search, "candidates", lambda *a, **k: few)
    monkeypatch.setattr(peer_search, "neighbours", lambda c: [])
    ref = experts_reference(x, wts, ids, w.gate_up_E2IH, w.down_EHI)
    fn, found = peer_search.tuned_peer(cfg, w, x, wts, ids, ref, CPU, tolerance=1e-5, budget_s=60.0)
    torch.testing.assert_close(fn(), ref, rtol=1e-5, atol=1e-5)
    assert found["timed"] == 2 and tuple(found["config"]) in {c for c, _ in few}


# ---- routing: where rows go, our tiles for it, merging ----

def test_skewed_runs_have_their_own_file_and_tiles(monkeypatch):
    assert skew.results_name("kernels", "uniform") == "kernels"
    assert skew.results_name("kernels", "zipf:3.0") == "kernels_skewed"
    with pytest.raises(SystemExit, match="unknown routing"):
        skew.parse_or_exit("zipf")
    from dispatch import tables
    from dispatch.kernels import tiles

    cfg = PRESETS["olmoe-1b-7b"]
    up = {"block_m": 64, "block_n": 128, "block_k": 64, "num_warps": 8, "num_stages": 3, "group_m": 1}
    entry = {"crossover": 8, "buckets": {"4096": {"up": up, "down": {**up, "block_n": 256}}}}
    key = tables.shape_key(cfg.E, cfg.H, cfg.I, cfg.K, torch.bfloat16, "zipf:3")
    monkeypatch.setattr(tiles, "_slug", lambda dev: "fake")
    monkeypatch.setattr(tables, "load", lambda slug: {"entries": {key: entry}} if slug == "fake" else {})
    got = skew.routed_tiles(cfg, 4096, torch.bfloat16, CPU, "zipf:3")
    assert got["source"] == "zipf:3 entry" and got["configs"][0].block_n == 128 and got["crossover"] == 8
    assert skew.routed_tiles(cfg, 4096, torch.bfloat16, CPU, "zipf:1.5")["source"] == "tile policy"
    assert skew.routed_tiles(cfg, 4096, torch.bfloat16, CPU, "uniform")["configs"] is None


def test_merge_keeps_the_rows_of_other_routings():
    def doc(rows, commit):
        return {"benchmark": "kernels_skewed", "gpu": "g", "gpu_count": 1, "versions": {}, "ceilings": {},
                "git_commit": commit, "date": "2026-12-06T00:00:00", "command": "c", "rows": rows}

    old = doc([{"shape": "a", "tokens": 8, "routing": "zipf:3", "v": 1},
               {"shape": "a", "tokens": 8, "routing": "trace:0", "v": 2}], "aaaaaaa")
    new = doc([{"shape": "a", "tokens": 8, "routing": "zipf:3", "v": 3}], "bbbbbbb")
    m = results.merged(new, old)
    assert sorted((r["routing"], r["v"]) for r in m["rows"]) == [("trace:0", 2), ("zipf:3", 3)]
    assert m["parts"][1]["sizes"] == [("a", 8, "trace:0")]
    assert "(trace:0 routing)" in results._sizes_text(m["parts"][1]["sizes"], {"a"})
    plain = results.merged(doc([{"shape": "a", "tokens": 8, "v": 4}], "bbbbbbb"),
                           doc([{"shape": "a", "tokens": 8, "routing": "uniform", "v": 5}], "aaaaaaa"))
    assert [r["v"] for r in plain["rows"]] == [4]  # no routing field is uniform


# ---- the closing table ----

def _row(shape, T, routing, contestant, us=None, **kw):
    r = {"shape": shape, "tokens": T, "routing": routing, "contestant": contestant, "busiest_over_mean": 3.0, **kw}
    if us is None:
        r["skipped"] = "did not run: no grouped_mm"
    else:
        r["median_ms"] = us / 1e3
    return r


def test_closing_table_counts_the_targets_on_hand_made_rows():
    rows = [_row("a", 8, "uniform", "ours_decode", 90.0, chosen=True), _row("a", 8, "uniform", "peer_fused_moe", 100.0),
            _row("a", 256, "zipf:3", "ours_grouped", 200.0, chosen=True),
            _row("a", 256, "zipf:3", "peer_fused_moe", 190.0), _row("a", 256, "zipf:3", "torch_grouped_mm", 400.0),
            _row("a", 4096, "zipf:3", "ours_grouped", 1000.0, chosen=True),
            _row("a", 4096, "zipf:3", "peer_fused_moe", 1050.0), _row("a", 4096, "zipf:3", "torch_grouped_mm")]
    table = kernels_targets.closing_rows({"rows": rows})
    assert [(r["tokens"], r["routing"]) for r in table] == [(8, "uniform"), (256, "zipf:3"), (4096, "zipf:3")]
    assert table[1]["peer / ours"] == pytest.approx(0.95) and table[1]["grouped / ours"] == pytest.approx(2.0)
    assert table[2]["grouped µs"].startswith("did not run") and table[2]["grouped / ours"] is None
    assert table[0]["grouped µs"] == "not recorded"
    c = kernels_targets.closing_count(table)
    assert c["ours ≤ peer"] == {"met": 2, "of": 3, "missed": ["a T=256 zipf:3"]}
    assert c["≥ 1.10× peer from 4096 tokens"] == {"met": 0, "of": 1, "missed": ["a T=4096 zipf:3"]}
    assert c["≥ torch grouped from 256 tokens"] == {"met": 1, "of": 2, "missed": ["a T=4096 zipf:3"]}
    text = kernels_targets.closing_table([{"rows": rows[:2]}, {"rows": rows[2:]}])
    assert "| a | 4096 | zipf:3 | 3.00 | 1050.0 | did not run: no grouped_mm | 1000.0 | 1.050 |" in text
    assert "ours ≤ peer: 2 of 3 (missed: a T=256 zipf:3)" in text


# ---- on the GPU (bf16): what the race times is what the reference computes ----

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("routing", ["uniform", "zipf:3"])
def test_gpu_torch_grouped_and_shipped_peer_configs(routing):
    """torch's grouped GEMM (replayed from a CUDA graph, as the race times it) and every shipped vLLM
    config nearest the size compute the layer in bf16, at a decode size and a prefill size."""
    from dispatch import runtime
    from dispatch_book.bench.harness import capture_graph

    dt = runtime.compute_dtype()
    for name in ("qwen3-30b-a3b", "mixtral-8x7b"):
        cfg = PRESETS[name]
        w = random_weights(cfg, dtype=dt, device="cuda")
        for T in (64, 4096):
            x, wts, ids = kernels.race_inputs(cfg, T, torch.device("cuda"), dt, routing)
            ref = experts_reference(x, wts.to(dt), ids, w.gate_up_E2IH, w.down_EHI).float()
            args = (x, wts, ids, w.gate_up_E2IH, w.down_EHI)
            out = torch.empty_like(ref)
            g = capture_graph(lambda a=args, o=out: o.copy_(torch_grouped.grouped_mm_experts(*a)), warmup=1)
            out.zero_()
            g.replay()
            torch.cuda.synchronize()
            assert ((out - ref).norm() / ref.norm()).item() < kernels.TOLERANCE, (name, T)
            for c, src in peer_search.shipped(cfg.E, cfg.I, T, runtime.device_name(torch.device("cuda"))):
                y = peers.fused_moe(*args, peers.align(ids, cfg.E, c[0]), c).float()
                assert ((y - ref).norm() / ref.norm()).item() < kernels.TOLERANCE, (name, T, c, src)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_peer_search_finds_a_correct_config_within_its_budget():
    from dispatch import runtime

    cfg, dt, dev = PRESETS["olmoe-1b-7b"], runtime.compute_dtype(), torch.device("cuda")
    w = random_weights(cfg, dtype=dt, device=dev)
    x, wts, ids = kernels.race_inputs(cfg, 256, dev, dt, "zipf:3")
    ref = experts_reference(x, wts.to(dt), ids, w.gate_up_E2IH, w.down_EHI)
    fn, found = peer_search.tuned_peer(cfg, w, x, wts, ids, ref, dev, kernels.TOLERANCE, budget_s=20.0)
    assert found["timed"] >= 1 and found["us"] > 0 and found["seconds"] < 20.0 + 15.0  # one candidate may overrun
    assert ((fn().float() - ref.float()).norm() / ref.float().norm()).item() < kernels.TOLERANCE


def test_a_skewed_race_on_the_cpu_records_routing_peer_and_grouped(monkeypatch):
    """The whole row-building path of one size (interpreter, the tiny preset, zipf:2 routing): timings
    faked, every other step real."""
    monkeypatch.setattr(kernels, "_ceilings", lambda: {"bf16_tflops": 1.0, "hbm_read_gbps": 1.0})
    monkeypatch.setattr(kernels, "GROUPED_MIN_T", 1)
    monkeypatch.setattr(kernels, "graph_rounds", lambda fns, rounds: {
        n: (fn(), {"median_ms": 1.0, "min_ms": 1.0, "max_ms": 1.0, "samples": 7, "graph": True})[1]
        for n, fn in fns.items()})
    saved = []  # what a cut-off run keeps: the rows so far, after every size
    rows = kernels.measure_shape("tiny", (3,), CPU, torch.float32, warmup=1, rep=1, routing="zipf:2.0",
                                 skip=("hf_",), peer_budget_s=3.0, log=lambda s: None,
                                 measured=lambda so_far: saved.append(list(so_far)))
    assert saved == [rows]
    by = {r["contestant"]: r for r in rows}
    assert {"ours_grouped", "ours_decode", "peer_fused_moe", "torch_grouped_mm", "hf_eager"} <= set(by)
    assert all(r["routing"] == "zipf:2" and r["busiest_over_mean"] >= 1 and "zipf_exponent" in r for r in rows)
    assert by["hf_eager"]["skipped"] == "not asked for (--skip)" and "median_ms" not in by["hf_eager"]
    assert by["torch_grouped_mm"]["median_ms"] == 1.0 and by["torch_grouped_mm"]["rel_err"] < kernels.TOLERANCE
    p = by["peer_fused_moe"]
    assert p["median_ms"] == 1.0 and p["rel_err"] < kernels.TOLERANCE and p["config"] == p["peer_search"]["config"]
    assert p["peer_search"]["timed"] >= 1 and by["ours_grouped"]["tiles"] == "tile policy"
    table = kernels_targets.closing_rows({"rows": rows})
    assert len(table) == 1 and table[0]["routing"] == "zipf:2" and table[0]["peer / ours"] == 1.0


def test_the_decode_and_quant_races_draw_from_the_routing():
    from dispatch.tune import routing_dist
    from dispatch_book.bench import decode
    from dispatch_book.bench import quant as qb

    cfg = PRESETS["tiny"]
    _, _, w, ids, _, _ = decode.make_case("tiny", 6, CPU, torch.float32, seed=6, routing="zipf:2")
    assert torch.equal(ids, routing_dist.draw("zipf:2", cfg, 6, torch.Generator().manual_seed(7))[1])

    def once(fn):
        fn()
        return {"median_ms": 1.0, "min_ms": 1.0, "max_ms": 1.0, "samples": 1}

    rows, _ = qb.measure("tiny", (2,), CPU, 1e12, timer=once, log=lambda *_: None, schemes=("int8-channel",),
                         routing="trace:1")
    assert rows[0]["routing"] == "trace:1" and rows[0]["busiest_over_mean"] >= 1.0
    assert "rel_err_twin" in rows[0]["contestants"]["int8-channel"]


def test_merge_by_kind_keeps_what_a_run_skipped():
    """Suites of kinds per model (speculative): a run that measured one kind of a model keeps the
    recording's other kinds of it, and a kind it only skipped keeps the recorded rows of that kind."""
    def doc(rows, commit):
        return {"benchmark": "speculative", "gpu": "g", "gpu_count": 1, "versions": {}, "git_commit": commit,
                "date": "2026-12-07T00:00:00", "command": "c", "rows": rows}

    old = doc([{"shape": "m", "kind": "invariance", "v": 1}, {"shape": "m", "kind": "replay", "v": 2},
               {"shape": "m", "kind": "verify_cost", "v": 3}, {"shape": "s", "kind": "race", "v": 4}], "aaaaaaa")
    new = doc([{"shape": "m", "kind": "invariance", "v": 5}, {"shape": "m", "kind": "replay", "skipped": "time"}],
              "bbbbbbb")
    m = results.merged(new, old)
    assert sorted((r["kind"], r.get("v")) for r in m["rows"]) == [
        ("invariance", 5), ("race", 4), ("replay", 2), ("verify_cost", 3)]
    assert [p["git_commit"] for p in m["parts"]] == ["bbbbbbb", "aaaaaaa"]
    assert results._sizes_text(m["parts"][0]["sizes"], {"m", "s"}) == "m (invariance)"
    assert results._sizes_text(m["parts"][1]["sizes"], {"m", "s"}) == "m (replay, verify_cost), s (race)"
    alone = results.merged(doc([{"shape": "m", "kind": "replay", "skipped": "time"}], "bbbbbbb"),
                           doc([{"shape": "m", "kind": "replay", "skipped": "time"}], "aaaaaaa"))
    assert alone["rows"] == [{"shape": "m", "kind": "replay", "skipped": "time"}]  # nothing measured to keep
