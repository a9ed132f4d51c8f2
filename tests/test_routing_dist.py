"""Routing distributions (dispatch.tune.routing_dist): skew as asked, K distinct experts, seeded."""
import pytest
import torch

import dispatch  # noqa: F401
from dispatch import tables
from dispatch.config import PRESETS
from dispatch.reference import route_reference
from dispatch.tune import routing_dist as rd

BENCH = ("olmoe-1b-7b", "qwen3-30b-a3b", "deepseek-moe-16b", "mixtral-8x7b")
RATIO_TOL = 0.10  # |measured busiest/mean at 4096 tokens − asked| / asked, any seed (8 seeds' spread: ±8 %)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_parse_names_and_refusals():
    assert rd.parse("uniform") == rd.Routing() and rd.parse(" uniform ").name == "uniform"
    assert rd.parse("zipf:3").name == "zipf:3" and rd.parse("zipf:3.0").name == "zipf:3"
    assert rd.parse("zipf:1.5").ratio == 1.5 and rd.parse("trace").name == "trace:0"
    assert rd.parse("trace:2").layer == 2 and rd.parse(rd.parse("zipf:2")) == rd.parse("zipf:2")
    for bad in ("zipf", "zipf:", "zipf:1", "zipf:0.5", "uniform:2", "trace:1.5", "normal", "", "zipf:x"):
        with pytest.raises(ValueError, match="routing"):
            rd.parse(bad)
    with pytest.raises(ValueError, match="only trace"):
        rd.Routing("uniform", layer=1)


def test_busiest_over_mean_by_hand():
    # counts [2, 1, 1, 0], mean 4 pairs / 4 experts = 1
    assert rd.busiest_over_mean(torch.tensor([[0, 1], [0, 2]]), 4) == 2.0
    assert rd.busiest_over_mean(torch.tensor([[0, 1], [2, 3]]), 4) == 1.0


def test_uniform_is_the_races_routing_bitwise():
    cfg = PRESETS["olmoe-1b-7b"]
    g1, g2 = _gen(7), _gen(7)
    w, ids = rd.draw("uniform", cfg, 33, g1)
    w_ref, ids_ref = route_reference(torch.randn(33, cfg.E, generator=g2), cfg)
    assert torch.equal(ids, ids_ref) and torch.equal(w, w_ref)


@pytest.mark.parametrize("name", BENCH)
@pytest.mark.parametrize("ratio", [1.5, 3.0])
def test_zipf_hits_the_asked_skew_at_4096_tokens(name, ratio):
    cfg = PRESETS[name]
    s = rd.zipf_exponent(cfg.E, cfg.K, ratio)
    got = [rd.busiest_over_mean(rd.draw(f"zipf:{ratio}", cfg, 4096, _gen(seed))[1], cfg.E) for seed in range(4)]
    assert all(abs(r / ratio - 1) <= RATIO_TOL for r in got), (s, got)
    assert rd.zipf_exponent(cfg.E, cfg.K, 2 * ratio if 2 * ratio < cfg.E / cfg.K else 3.5) > s  # more skew, larger s


def test_zipf_refuses_what_no_exponent_gives():
    with pytest.raises(ValueError, match="out of reach"):
        rd.zipf_exponent(8, 2, 4.0)  # every token would need the busiest expert and more
    with pytest.raises(ValueError, match="below what uniform"):
        rd.zipf_exponent(128, 8, 1.01)


def _distinct_in_range(ids_TK, E):
    assert ids_TK.dtype == torch.int64 and int(ids_TK.min()) >= 0 and int(ids_TK.max()) < E
    assert all(len(set(row)) == len(row) for row in ids_TK.tolist())


@pytest.mark.parametrize("name", BENCH)
@pytest.mark.parametrize("spec", ["uniform", "zipf:3", "trace", "trace:3"])
def test_k_distinct_experts_seeded_and_reproducible(name, spec):
    cfg = PRESETS[name]
    w, ids = rd.draw(spec, cfg, 512, _gen(3))
    assert ids.shape == (512, cfg.K) and w.shape == (512, cfg.K) and w.dtype == torch.float32
    _distinct_in_range(ids, cfg.E)
    w2, ids2 = rd.draw(spec, cfg, 512, _gen(3))
    assert torch.equal(ids, ids2) and torch.equal(w, w2)
    if spec != "uniform":  # weights: a softmax over K, largest first
        assert torch.allclose(w.sum(-1), torch.ones(512)) and bool((w[:, :-1] >= w[:, 1:]).all())
    if spec.startswith("zipf") or (spec.startswith("trace") and name == "qwen3-30b-a3b"):
        assert not torch.equal(ids, rd.draw(spec, cfg, 512, _gen(4))[1])  # another seed, another draw


def test_map_ranks_by_hand():
    ranks = torch.tensor([[3, 1, 0, 2], [2, 3, 1, 0]])  # E_s = 4 experts, K_s = 2 chosen first
    # merge pairs (E = 2): [3,1,0,2] → [1,0,0,1] → first 2 distinct [1, 0]; [2,3,1,0] → [1,1,0,0] → [1, 0]
    assert rd.map_ranks(ranks, 4, 2, 2, 2, seed=0).tolist() == [[1, 0], [1, 0]]
    # split each expert in 2 (E = 8), K = 4: both children of each chosen expert, source by source
    ids = rd.map_ranks(ranks, 4, 2, 8, 4, seed=0)
    assert [sorted(r[:2]) + sorted(r[2:]) for r in ids.tolist()] == [[6, 7, 2, 3], [4, 5, 6, 7]]
    # K = 2 of 8 (one child each), seeded
    one = rd.map_ranks(ranks, 4, 2, 8, 2, seed=0)
    assert [[i // 2 for i in r] for r in one.tolist()] == [[3, 1], [2, 3]]
    with pytest.raises(ValueError, match="multiple or a divisor"):
        rd.map_ranks(ranks, 4, 2, 6, 2, seed=0)
    with pytest.raises(ValueError, match="do not fit"):
        rd.map_ranks(ranks, 4, 2, 8, 6, seed=0)
    with pytest.raises(ValueError, match="ranks a token"):
        rd.map_ranks(ranks[:, :2], 4, 2, 2, 2, seed=0)


def test_trace_keeps_the_trained_models_skew():
    ranks, meta = rd.load_trace()
    assert ranks.dtype == torch.uint8 and ranks.shape == (4, 16384, 4) and (meta["E"], meta["K"]) == ("16", "2")
    own = rd.busiest_over_mean(ranks[0, :4096, :2], 16)
    assert 1.3 < own < 1.8  # chapter 5's trained router: busiest / mean about 1.4-1.6
    olmoe = PRESETS["olmoe-1b-7b"]  # every child of both parents: the parents' loads exactly
    assert rd.busiest_over_mean(rd.draw("trace", olmoe, 4096, _gen(0))[1], 64) == pytest.approx(own, rel=1e-12)
    qwen = PRESETS["qwen3-30b-a3b"]  # 4 of 8 children: half the parent's load each, plus draw noise
    assert abs(rd.busiest_over_mean(rd.draw("trace", qwen, 4096, _gen(0))[1], 128) / own - 1) <= RATIO_TOL


def test_trace_merges_for_mixtral_as_top_k_of_merged_scores():
    """Independent reference: walk each token's recorded ranking, keep the first 2 distinct e // 2."""
    ranks = rd.load_trace()[0][1, :300].long().tolist()
    want = []
    for row in ranks:
        out = []
        for e in row:
            if e // 2 not in out:
                out.append(e // 2)
        want.append(out[:2])
    assert rd.trace_ids(8, 2, 300, layer=1).tolist() == want


def test_trace_refusals():
    with pytest.raises(ValueError, match="16384 tokens"):
        rd.trace_ids(64, 8, 16385)
    with pytest.raises(ValueError, match="layers 0..3"):
        rd.trace_ids(64, 8, 8, layer=4)
    with pytest.raises(ValueError, match="multiple or a divisor"):
        rd.trace_ids(24, 2, 8)


def test_the_shipped_trace_is_the_checkpoints(tmp_path):
    """The trace names the model it was recorded from: retraining the checkpoint means recording again
    (``python -m dispatch.tune.routing_dist --record-trace``)."""
    assert rd.load_trace()[1]["model_sha256"] == rd._model_hash()


def test_describe_records_name_skew_and_exponent():
    cfg = PRESETS["mixtral-8x7b"]
    ids = rd.draw("zipf:3", cfg, 64, _gen(0))[1]
    d = rd.describe("zipf:3.0", cfg, ids)
    assert d["routing"] == "zipf:3" and d["busiest_over_mean"] == rd.busiest_over_mean(ids, 8)
    assert d["zipf_exponent"] == rd.zipf_exponent(8, 2, 3.0)
    assert set(rd.describe("uniform", cfg, ids)) == {"routing", "busiest_over_mean"}


def test_table_keys_carry_a_routing_other_than_uniform():
    assert tables.shape_key(64, 2048, 1024, 8, torch.bfloat16) == "E=64,H=2048,I=1024,K=8,bfloat16"
    assert tables.shape_key(64, 2048, 1024, 8, torch.bfloat16, "uniform") == "E=64,H=2048,I=1024,K=8,bfloat16"
    assert tables.shape_key(64, 2048, 1024, 8, "bfloat16+int8-channel", "zipf:3") == \
        "E=64,H=2048,I=1024,K=8,bfloat16+int8-channel,zipf:3"


def test_the_tuner_keys_a_skewed_entry_by_its_routing(monkeypatch):
    """tune_preset draws its cases from the routing and keys the entry with it (decode only: T = 2)."""
    from dispatch.tune import main, search

    seen = []
    draw = rd.draw
    monkeypatch.setattr(rd, "draw", lambda spec, *a: seen.append(spec) or draw(spec, *a))
    monkeypatch.setattr(search, "decode_steps", lambda base, sms, T=None: ())  # the heuristic tiles only
    entry = search.tune_preset("tiny", (2,), torch.device("cpu"), torch.float32, timer=lambda fn, c: (fn(), 1.0)[1],
                               log=lambda s: None, routing="zipf:2.0")
    assert list(entry) == [tables.shape_key(8, 64, 32, 2, torch.float32, "zipf:2")] and seen == ["zipf:2"]
    with pytest.raises(SystemExit, match="unknown routing"):
        main(["--preset", "tiny", "--routing", "skewed"])
    with pytest.raises(SystemExit, match="--refine"):
        main(["--preset", "tiny", "--routing", "zipf:2", "--refine"])
