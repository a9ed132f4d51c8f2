"""The layouts' model against cases computed by hand."""
import math

import pytest

from dispatch.serve.disagg_model import (
    Layout,
    StepCurve,
    Workload,
    colocated,
    crossover,
    disaggregated,
    predict,
    run_engine,
)

PRE = StepCurve((1, 100, 1000), (0.010, 0.012, 0.030))  # prefill steps: 10 ms flat-ish, then linear
DEC = StepCurve((1, 64), (0.001, 0.003))


def test_step_curve_interpolates_and_extrapolates():
    assert PRE(1) == PRE(0) == 0.010
    assert PRE(100) == pytest.approx(0.012) and PRE(550) == pytest.approx(0.021)
    assert PRE(2000) == pytest.approx(0.050)  # the last segment's slope, 2e-5 s/token
    assert StepCurve((10,), (0.5,))(40) == pytest.approx(2.0)
    for bad in [((), ()), ((2, 1), (1.0, 1.0)), ((1,), (0.0,)), ((1, 2), (1.0,))]:
        with pytest.raises(ValueError):
            StepCurve(*bad)


def test_one_request_alone_hand_computed():
    lay = Layout(budget=512, kv_bytes_per_token=1000, link_gbps=1.0, link_latency_s=0.001)
    w = Workload(rate=1.0, prompts=(100,), output=10, n=1)
    co, dis = colocated(w, PRE, DEC, lay), disaggregated(w, PRE, DEC, lay)
    assert co["ttft_p50"] == pytest.approx(0.012) and co["tpot_p50"] == pytest.approx(0.001)
    handoff = 0.001 + 100 * 1000 / 1e9
    assert lay.handoff_s(100) == pytest.approx(handoff)
    assert dis["ttft_p50"] == pytest.approx(0.012)  # the first token leaves the prefill GPU
    assert dis["tpot_p50"] == pytest.approx(0.001 + handoff / 9)
    long = Workload(rate=1.0, prompts=(1000,), output=2, n=1)  # two chunks: 512 + 488 tokens
    assert colocated(long, PRE, DEC, lay)["ttft_p50"] == pytest.approx(PRE(512) + PRE(488))
    one_step = Layout(budget=512, prefill_budget=1024)
    assert disaggregated(long, PRE, DEC, one_step)["ttft_p50"] == pytest.approx(PRE(1000))


def test_two_requests_share_steps_as_the_scheduler_says():
    # both arrive at 0 with 4-token prompts: one step of 8 prompt tokens, then decode steps of 2 rows
    times = run_engine([0.0, 0.0], [4, 4], [3, 3], PRE, DEC, budget=16, max_seqs=8)
    p8, d2 = PRE(8), DEC(2)
    assert times[0] == times[1] == pytest.approx([p8, p8 + d2, p8 + 2 * d2])
    # a decode row rides along with a later prompt's chunk: that step costs prefill(1 + chunk)
    times = run_engine([0.0, 0.005], [4, 20], [3, 1], PRE, DEC, budget=16, max_seqs=8)
    t1 = PRE(4)  # request 0's prompt; request 1 arrives during it; then 1 row + 15 chunk tokens, 1 + 5
    assert times[0] == pytest.approx([t1, t1 + PRE(16), t1 + PRE(16) + PRE(6)])
    assert times[1] == pytest.approx([t1 + PRE(16) + PRE(6)])


def test_workload_is_seeded_and_checked():
    a = Workload(rate=5.0, prompts=(10, 20), output=4, n=50, seed=1).draw()
    assert a == Workload(rate=5.0, prompts=(10, 20), output=4, n=50, seed=1).draw()
    assert a != Workload(rate=5.0, prompts=(10, 20), output=4, n=50, seed=2).draw()
    assert a[0][0] == 0.0 and sorted(a[0]) == a[0] and set(a[1]) == {10, 20}
    for bad in [dict(rate=0), dict(prompts=()), dict(prompts=(0,)), dict(output=0), dict(n=True)]:
        with pytest.raises(ValueError):
            Workload(**{**dict(rate=1.0, prompts=(8,), output=4), **bad})


def test_interference_and_the_crossover():
    lay = Layout(budget=64, kv_bytes_per_token=100, prefill_budget=1024)
    rows = predict(PRE, DEC, lay, rates=[0.5, 50.0], prompt_mixes=[(600,)], output=32, n=60)
    by = {(r["layout"], r["rate"]): r for r in rows}
    # under load the co-located decode rows share steps with prompt chunks: TPOT well above a decode step
    assert by[("colocated", 50.0)]["tpot_p50"] > 3 * DEC(8)
    assert by[("disaggregated", 50.0)]["tpot_p50"] < by[("colocated", 50.0)]["tpot_p50"]
    assert crossover(rows) == {600: 50.0}
    assert all(math.isfinite(r["ttft_p99"]) for r in rows)
    synthetic = [{"layout": lay_, "prompt": 8, "rate": x, "tpot_p50": v} for x, c, d in
                 [(1, 1, 2), (2, 2, 1), (4, 3, 4), (8, 5, 4)] for lay_, v in (("colocated", c), ("disaggregated", d))]
    assert crossover(synthetic) == {8: 8}  # a win followed by a loss does not count


def test_the_interference_scene_keeps_each_quantity_at_its_fastest_play(monkeypatch):
    from dispatch_book import disagg_study

    plays = iter([  # the second play ran while something else loaded the machine
        {"decode_step_s": 0.008, "worst_gap_s": 0.015, "ttft_s": 0.015, "steps": [(0.015, 124)]},
        {"decode_step_s": 0.020, "worst_gap_s": 0.016, "ttft_s": 0.030, "steps": [(0.030, 124)]},
        {"decode_step_s": 0.009, "worst_gap_s": 0.025, "ttft_s": 0.016, "steps": [(0.016, 124)]}])
    monkeypatch.setattr(disagg_study, "_interference_once", lambda *a: next(plays))
    r = disagg_study.interference(None, [], [], budget=8, chunked=False, repeats=3)
    assert r == {"decode_step_s": 0.008, "worst_gap_s": 0.015, "ttft_s": 0.015, "steps": [(0.015, 124)],
                 "largest_step": 124}
