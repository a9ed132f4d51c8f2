"""The MoE cost model of speculative decoding and the adaptive draft length (dispatch.serve.spec_cost),
the acceptance traces (dispatch_book.spec_study) and the replay of a recording (the speculative suite).

References: Monte Carlo draws for the formulas; the engine itself for the traces (the drafts it keeps
at fixed k must be the trace's); exhaustive fixed-k simulation for the adaptive k (within 5 % of the
best fixed k on simulated and recorded curves).
"""
import random

import pytest
import torch

from dispatch.arithmetic import decode_step_roofline, expected_unique_experts, expected_unique_experts_skewed
from dispatch.engine import LeanModel
from dispatch.hf import model_shape_from_hf, tiny_model
from dispatch.serve.drafters import PromptLookup
from dispatch.serve.spec_cost import AdaptiveK, best_k, expected_tokens, simulate, verify_bytes
from dispatch.serve.speculative import SpeculativeEngine
from dispatch_book.bench.speculative import ReplayDrafter, decode_cost, step_costs
from dispatch_book.spec_study import lookup_runs


def geometric(alpha, N, rnd, cap=16):
    out = []
    for _ in range(N):
        n = 0
        while n < cap and rnd.random() < alpha:
            n += 1
        out.append(n)
    return out


def test_expected_tokens():
    rnd = random.Random(0)
    for alpha, k in ((0.0, 3), (0.6, 4), (0.9, 8), (1.0, 5)):
        runs = geometric(alpha, 20000, rnd)
        mc = sum(min(r, k) + 1 for r in runs) / len(runs)
        assert abs(expected_tokens(alpha, k) - mc) < 0.05 * mc
    assert expected_tokens(0.5, 0) == 1.0 and expected_tokens(1.0, 3) == 4.0
    with pytest.raises(ValueError):
        expected_tokens(1.5, 2)


def test_best_k():
    flat = [1.0] * 9
    assert best_k(0.9, flat) == 8 and best_k(0.0, flat) == 0 and best_k(0.0, flat, k_min=1) == 1
    steep = [1 + 0.5 * k for k in range(9)]  # each draft costs half a step: pays only when nearly sure
    assert best_k(0.3, steep) == 0 and best_k(0.95, steep) > 0
    with pytest.raises(ValueError, match="positive"):
        best_k(0.5, [1.0, 0.0])


def test_verify_bytes_is_the_decode_roofline_of_k_plus_1_tokens():
    _, model = tiny_model("olmoe")
    shape = model_shape_from_hf(model.config)
    for k in (0, 1, 4):
        b = verify_bytes(shape, k, itemsize=2)
        ref = decode_step_roofline(shape, k + 1, hbm_bps=1.0, flops_per_s=1.0, bytes_per_param=2).bytes
        assert b["total"] == pytest.approx(ref)
        assert b["experts_per_layer"] == pytest.approx(expected_unique_experts(8, 2, k + 1))
    assert verify_bytes(shape, 3)["total"] > verify_bytes(shape, 0)["total"]


def test_distinct_experts_formulas_against_draws():
    """Uniform routing: E·(1 − (1 − K/E)^T). Skewed (independent tokens, top-K of skewed scores):
    Σ 1 − (1 − p_e)^T with p_e each expert's share of tokens — fewer distinct experts."""
    E, K, draws = 16, 2, 20000
    g = torch.Generator().manual_seed(0)
    for skew in (0.0, 1.5):
        scores = torch.randn(draws, E, generator=g) + skew * torch.linspace(0, 1, E)
        ids = scores.topk(K, dim=-1).indices  # [draws, K]
        onehot = torch.zeros(draws, E).scatter_(1, ids, 1.0)
        p_E = onehot.mean(0)
        for T in (1, 3, 5, 9):
            windows = onehot[:draws - draws % T].view(-1, T, E).amax(1).sum(1).mean().item()
            assert expected_unique_experts_skewed(p_E, T) == pytest.approx(windows, rel=0.02)
            if skew == 0.0:
                assert expected_unique_experts(E, K, T) == pytest.approx(windows, rel=0.02)
            else:
                assert expected_unique_experts_skewed(p_E, T) < expected_unique_experts(E, K, T) - 0.05 * (T > 1)
    with pytest.raises(ValueError):
        expected_unique_experts_skewed(torch.tensor([0.5, 1.5]), 2)


def test_simulate_hand_example():
    # runs: at token 0 two drafts would hold, at 3 none, at 4 five, at 7 one: k = 2 → steps at 0, 3, 4, 7
    runs = [2, 0, 0, 0, 5, 0, 0, 1, 0, 0]
    out = simulate(runs, [1.0, 1.5, 2.0], 2)
    assert out["steps"] == 4 and out["tokens"] == 9 and out["time"] == 8.0  # 0→3→4→7→9
    assert simulate(runs, [1.0, 1.5, 2.0], 0) == {"tokens": 9, "time": 9.0, "rate": 1.0, "steps": 9}


def _curves():
    rnd = random.Random(1)
    traces = {f"alpha {a}": [geometric(a, 1500, rnd) for _ in range(3)] for a in (0.2, 0.5, 0.7, 0.85, 0.95)}
    bursty = []
    for seg in range(16):
        bursty += geometric(0.92 if seg % 2 else 0.15, 150, rnd)
    traces["bursty"] = [bursty]
    costs = {"dense": [1 + 0.01 * k for k in range(9)], "moe": [1 + 0.12 * k for k in range(9)],
             "steep": [1 + 0.35 * k for k in range(9)]}
    return traces, costs


def rate(runs_list, costs, policy):
    parts = [simulate(r, costs, policy if isinstance(policy, int) else AdaptiveK(costs)) for r in runs_list]
    return sum(p["tokens"] for p in parts) / sum(p["time"] for p in parts)


def test_adaptive_k_within_5_percent_of_the_best_fixed_k_on_simulated_curves():
    traces, costs = _curves()
    for tname, runs in traces.items():
        for cname, c in costs.items():
            best = max(rate(runs, c, k) for k in range(len(c)))
            assert rate(runs, c, "adaptive") >= 0.95 * best, f"{tname}, {cname} costs"


def test_adaptive_k_within_5_percent_on_recorded_curves():
    """The shipped model's traces on held-out files, with the step costs recorded beside them (CPU),
    and every GPU recording's verify costs."""
    from dispatch_book import bench
    from dispatch_book.bench.speculative import recording

    tr = bench.load("speculative_traces", gpu="cpu")
    assert tr is not None, "results/cpu/speculative_traces.json is missing"
    curves = [[tr["cpu_step_ms"]["lookup"][str(k)] for k in range(9)]]
    gpu = recording()
    if gpu is not None:
        for model in sorted({r["shape"] for r in gpu["rows"] if r["kind"] == "verify_cost"}):
            pts = {r["k"]: r["median_ms"] for r in gpu["rows"] if r["kind"] == "verify_cost" and r["shape"] == model
                   and r["drafter"] == "lookup" and r["mode"] == "invariant"}
            if len(pts) == 9:
                curves.append([pts[k] for k in range(9)])
    for name in ("runs_lookup", "runs_draft"):
        runs = [r[name] for r in tr["rows"]]
        for c in curves:
            best = max(rate(runs, c, k) for k in range(9))
            assert rate(runs, c, "adaptive") >= 0.95 * best, f"{name}, costs {c}"


def test_adaptive_estimate_and_validation():
    ad = AdaptiveK([1.0] * 5, prior=0.5, prior_weight=2.0, decay=1.0)
    assert ad.alpha == 0.5 and ad.choose() == 4
    ad.update(4, [4, 0, 2])  # kept 6; tried 4 + 1 + 3 = 8
    assert ad.alpha == pytest.approx((6 + 1) / (8 + 2))
    ad.reset()
    assert ad.alpha == 0.5
    for kw in ({"k_min": 3, "k_max": 2}, {"prior": 1.0}, {"decay": 0.0}):
        with pytest.raises(ValueError):
            AdaptiveK([1.0] * 5, **kw)


@pytest.fixture(scope="module")
def shipped():
    from dispatch.train import load

    return load("cpu")


def test_the_engine_keeps_what_the_trace_says(shipped):
    """The prompt-lookup trace of an output predicts every step of the engine that produced it."""
    tok = shipped.tokenizer
    prompt = tok("import os\nimport sys\n\n\ndef main(argv):\n    for name in argv:\n        print(")["input_ids"]
    for k in (1, 3, 6):
        spec = SpeculativeEngine(shipped.model, PromptLookup(), k=k, max_seq=128)
        out = spec.generate([prompt], 48)
        runs, p, want = lookup_runs(prompt, out.tokens[0], k), 0, []
        while p < 47:
            n = min(k, runs[p], 46 - p)
            want.append(n)
            p += n + 1
        assert [a[0] for a in out.extra["accepted"]] == want


def test_replay_emits_the_recording_through_another_model(shipped):
    """A recorded run replayed through another model: the same tokens, the same kept drafts."""
    tok = shipped.tokenizer
    prompt = tok("class A:\n    def f(self):\n        return self.f\n\n    def g(self):\n        return ")["input_ids"]
    spec = SpeculativeEngine(shipped.model, PromptLookup(), k=4, max_seq=96)
    rec = spec.generate([prompt], 30)
    runs = lookup_runs(prompt, rec.tokens[0], 4)
    other = LeanModel.from_hf(tiny_model("olmoe", vocab_size=4096)[1])
    replay = SpeculativeEngine(other, ReplayDrafter([prompt], rec.tokens, [runs], PromptLookup()), k=4, max_seq=96)
    out = replay.generate([prompt], 30)
    assert out.tokens == rec.tokens and out.extra["accepted"] == rec.extra["accepted"]
    with pytest.raises(ValueError):
        replay.generate([prompt[1:]], 30)  # not recorded
    costs = step_costs(replay, [prompt], [0, 2])
    assert set(costs) == {0, 2} and all(c["median_ms"] > 0 for c in costs.values())
    from dispatch.engine import Engine

    assert decode_cost(Engine(other, max_seq=96), [prompt])["median_ms"] > 0


def test_acceptance_summary_by_hand():
    from dispatch_book.spec_study import acceptance

    acc = acceptance([[2, 0, 0, 5, 0, 0, 1, 0, 0, 0]], ks=[1, 2])
    # k=1: kept 1+1+1 = 3; tried 3 kept + 7 refused = 10. k=2: kept 2+2+1 = 5; tried 5 + 8 refused = 13
    assert acc[0]["alpha"] == pytest.approx(3 / 10) and acc[1]["alpha"] == pytest.approx(5 / 13)
    assert acc[1]["tokens_per_step"] == pytest.approx(9 / 4)  # 0→3→4→7→9: 4 steps emit 9 tokens


def test_gpu_summary_of_a_recording():
    from dispatch_book.spec_study import gpu_summary

    rows = [{"kind": "invariance", "shape": "olmoe", "batch": 1, "mode": m, "median_ms": v}
            for m, v in (("default", 2.0), ("invariant", 2.2))]
    rows += [{"kind": "race", "shape": "shipped", "mode": "default", "drafter": "none", "k": 0, "tok_s": 100.0},
             {"kind": "race", "shape": "shipped", "mode": "invariant", "drafter": "lookup", "k": "4",
              "tok_s": 190.0, "identical_to_plain_greedy": 12},
             {"kind": "race", "shape": "shipped", "mode": "invariant", "drafter": "draft", "k": "2",
              "skipped": "time budget spent"},
             {"kind": "peer", "shape": "shipped", "contestant": "prompt_lookup_4", "tok_s": 120.0,
              "identical_to_its_plain_greedy": 11},
             {"kind": "replay", "shape": "mixtral-8x7b", "mode": "invariant", "drafter": "lookup", "k": "2",
              "tok_s": 50.0, "speedup_vs_default_plain": 1.4}]
    s = gpu_summary({"rows": rows})
    assert s["invariance"] == [{"model": "olmoe", "batch": 1, "default ms": 2.0, "invariant ms": 2.2,
                                "x": pytest.approx(1.1)}]
    assert [r["x"] for r in s["race"]] == [1.0, 1.9, 1.2] and s["race"][1]["identical"] == 12
    assert s["replay"] == [{"model": "mixtral-8x7b", "mode": "invariant", "drafter": "lookup", "k": "2", "tok/s": 50.0,
                            "x": 1.4, "x invariant": None}]
