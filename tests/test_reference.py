"""The reference layer on its own: hand-worked examples, bad input, empty batches, and random
shapes against a naive dense formulation y = Σ_e gate_e(x) · expert_e(x)."""
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatch import MoELayer
from dispatch.config import MoEConfig, MoEWeights, random_weights
from dispatch.reference import check_input, experts_reference, moe_reference, route_reference, router_logits

TINY = MoEConfig(16, 8, 4, 2)


def test_softmax_routing_by_hand():
    # softmax(log [1, 2, 3, 4]) = [0.1, 0.2, 0.3, 0.4]: top-2 are experts 3 and 2.
    logits_TE = torch.tensor([[1.0, 2.0, 3.0, 4.0]]).log()
    w, ids = route_reference(logits_TE, MoEConfig(8, 4, 4, 2))
    assert ids.tolist() == [[3, 2]] and ids.dtype == torch.int64 and w.dtype == torch.float32
    torch.testing.assert_close(w, torch.tensor([[0.4, 0.3]]))  # OLMoE: no renormalisation
    w, _ = route_reference(logits_TE, MoEConfig(8, 4, 4, 2, norm_topk_prob=True))
    torch.testing.assert_close(w, torch.tensor([[4 / 7, 3 / 7]]))  # Mixtral / Qwen: renormalised


def test_deepseek_routing_by_hand():
    """Sigmoid scores s = [0.9, 0.5, 0.6, 0.2], 2 groups of 2, keep 1 group, top-2.

    Without bias: group scores (sum of a group's top-2) 1.4 vs 0.8 → group 0 → experts 0, 1.
    With bias +0.8 on expert 2: choice scores [0.9, 0.5, 1.4, 0.2] → groups 1.4 vs 1.6 → group 1
    → experts 2, 3. The weights are the *unbiased* scores 0.6, 0.2, renormalised to 0.75, 0.25,
    times the routed scaling factor 2.5.
    """
    s = torch.tensor([[0.9, 0.5, 0.6, 0.2]], dtype=torch.float64)
    logits_TE = (s / (1 - s)).log().float()
    cfg = MoEConfig(8, 4, 4, 2, scoring="sigmoid", norm_topk_prob=True, n_group=2, topk_group=1,
                    routed_scaling_factor=2.5, correction_bias=True)
    w, ids = route_reference(logits_TE, cfg, torch.zeros(4))
    assert ids.tolist() == [[0, 1]]
    torch.testing.assert_close(w, torch.tensor([[0.9 / 1.4 * 2.5, 0.5 / 1.4 * 2.5]]))
    w, ids = route_reference(logits_TE, cfg, torch.tensor([0.0, 0.0, 0.8, 0.0]))
    assert ids.tolist() == [[2, 3]]
    torch.testing.assert_close(w, torch.tensor([[1.875, 0.625]]))


def test_one_token_layer_by_hand():
    """H=2, I=1, E=2, K=1. x = [1, 0]; router logits [0, 1] → expert 1, weight e/(1+e).
    Expert 1: gate = 1, up = 2, h = silu(1)·2, out = h·[1, 0.5]."""
    cfg = MoEConfig(2, 1, 2, 1)
    w = MoEWeights(router_EH=torch.tensor([[0.0, 0.0], [1.0, 0.0]]),
                   gate_up_E2IH=torch.tensor([[[5.0, 5.0], [5.0, 5.0]], [[1.0, 0.0], [2.0, 0.0]]]),
                   down_EHI=torch.tensor([[[9.0], [9.0]], [[1.0], [0.5]]]))
    y = moe_reference(torch.tensor([[1.0, 0.0]]), cfg, w)
    p = math.e / (1 + math.e)
    h = 1 / (1 + math.exp(-1)) * 2
    torch.testing.assert_close(y, torch.tensor([[p * h, p * h * 0.5]]))


def test_summation_order_is_ascending_expert_id():
    """A token's K contributions are added in ascending expert id, whatever its k order."""
    cfg, w = TINY, random_weights(TINY, seed=3)
    x = torch.randn(5, 16, generator=torch.Generator().manual_seed(0))
    weights_TK, ids_TK = route_reference(router_logits(x, cfg, w), cfg)
    y = experts_reference(x, weights_TK, ids_TK, w.gate_up_E2IH, w.down_EHI)
    y_flipped = experts_reference(x, weights_TK.flip(1), ids_TK.flip(1), w.gate_up_E2IH, w.down_EHI)
    want = torch.zeros_like(x)
    for t in range(5):
        for k in ids_TK[t].argsort().tolist():
            e = ids_TK[t, k]
            gate, up = (w.gate_up_E2IH[e] @ x[t]).chunk(2)
            want[t] += weights_TK[t, k] * (w.down_EHI[e] @ (F.silu(gate) * up))
    torch.testing.assert_close(y, want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(y_flipped, y, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("x, match", [
    (torch.zeros(3, 15), r"x must have shape \[T, H=16\], got \(3, 15\)"),
    (torch.zeros(2, 3, 16), r"x must have shape \[T, H=16\]"),
    (torch.zeros(3, 16, dtype=torch.int64), "x must be floating point, got dtype torch.int64"),
    (torch.zeros(3, 16, dtype=torch.float64), "x has dtype torch.float64 but the expert weights are torch.float32"),
    ([[0.0] * 16], "x must be a torch.Tensor, got list"),
])
def test_bad_input_is_a_clear_value_error(x, match):
    with pytest.raises(ValueError, match=match):
        moe_reference(x, TINY, random_weights(TINY))


def test_mismatched_devices():
    w = random_weights(TINY).to("meta")  # a second device on a CPU-only machine
    with pytest.raises(ValueError, match="x is on cpu but the weights are on meta"):
        check_input(torch.zeros(1, 16), TINY, w)


def test_bad_config_and_routing_inputs():
    with pytest.raises(ValueError, match=r"top_k=5 must be <= num_experts=4"):
        MoEConfig(16, 8, 4, 5)
    with pytest.raises(ValueError, match="shape"):
        random_weights(TINY).validate(MoEConfig(16, 8, 5, 2))
    with pytest.raises(ValueError, match="logits must have E=4 columns, got 3"):
        route_reference(torch.zeros(2, 3), TINY)
    with pytest.raises(ValueError, match="logits must be a floating"):
        route_reference(torch.zeros(2, 4, dtype=torch.int32), TINY)
    w = random_weights(TINY)
    with pytest.raises(ValueError, match=r"ids_TK must hold expert ids in \[0, E=4\): 1 do not"):
        experts_reference(torch.zeros(1, 16), torch.ones(1, 2), torch.tensor([[0, 4]]), w.gate_up_E2IH, w.down_EHI,
                          check_ids=True)
    with pytest.raises(ValueError, match=r"weights_TK must be a floating tensor shaped like ids_TK \(1, 2\)"):
        experts_reference(torch.zeros(1, 16), torch.ones(1, 3), torch.tensor([[0, 1]]), w.gate_up_E2IH, w.down_EHI)
    with pytest.raises(ValueError, match=r"K=5 experts per token is more than the E=4"):
        experts_reference(torch.zeros(1, 16), torch.ones(1, 5), torch.zeros(1, 5, dtype=torch.long), w.gate_up_E2IH,
                          w.down_EHI)
    with pytest.raises(ValueError, match=r"x must be a tensor \[T, H\] or \[B, S, H\]"):
        MoELayer(TINY, w, path="torch")(torch.zeros(16))


def test_reference_bad_ids_add_nothing():
    """An id outside [0, E) contributes nothing (the same policy as every kernel path)."""
    w = random_weights(TINY)
    x = torch.randn(3, 16, generator=torch.Generator().manual_seed(0))
    ids = torch.tensor([[0, 1], [2, 3], [1, 2]])
    wts = torch.rand(3, 2, generator=torch.Generator().manual_seed(1))
    bad = ids.clone()
    bad[0, 1], bad[1, 0] = 4, -1
    y, y_bad = (experts_reference(x, wts, i, w.gate_up_E2IH, w.down_EHI) for i in (ids, bad))
    keep = wts.clone()
    keep[0, 1] = keep[1, 0] = 0.0
    torch.testing.assert_close(y_bad, experts_reference(x, keep, ids, w.gate_up_E2IH, w.down_EHI))
    torch.testing.assert_close(y_bad[2], y[2])  # (other rows share the GEMMs: equal to rounding)


def test_reference_non_finite_token_gives_a_non_finite_row_only():
    cfg = MoEConfig(16, 8, 4, 2, shared_intermediate_size=8)
    w = random_weights(cfg)
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(0))
    y = moe_reference(x, cfg, w)
    x[1, 3], x[2, 0] = float("nan"), float("inf")
    y_bad = moe_reference(x, cfg, w)
    assert not y_bad[1].isfinite().any() and not y_bad[2].isfinite().all()
    torch.testing.assert_close(y_bad[[0, 3]], y[[0, 3]])  # finite, equal to rounding (GEMM batch sizes change)


@pytest.mark.parametrize("shape", [(0, 16), (0, 4, 16), (2, 0, 16)])
def test_empty_batch_gives_empty_output(shape):
    for cfg in (TINY, MoEConfig(16, 8, 4, 2, scoring="sigmoid", n_group=2, topk_group=1, correction_bias=True,
                                shared_intermediate_size=8)):
        y = MoELayer(cfg, random_weights(cfg), path="torch")(torch.zeros(shape))
        assert y.shape == shape and y.dtype == torch.float32


def naive_route(logits_TE: torch.Tensor, cfg: MoEConfig, bias_E: torch.Tensor | None) -> torch.Tensor:
    """Dense gates [T, E], token by token in Python: weight if chosen else 0."""
    T, E = logits_TE.shape
    gates = torch.zeros(T, E, dtype=torch.float64)
    for t in range(T):
        if cfg.scoring == "softmax":
            s = logits_TE[t].double().softmax(-1)
            choice = s.tolist()
        else:
            s = logits_TE[t].double().sigmoid()
            choice = (s + (bias_E.double() if bias_E is not None else 0)).tolist()
        size = E // cfg.n_group
        group_score = [sum(sorted(choice[g * size:(g + 1) * size])[-2:]) for g in range(cfg.n_group)]
        kept = sorted(range(cfg.n_group), key=lambda g: -group_score[g])[:cfg.topk_group]
        allowed = [e for e in range(E) if e // size in kept]
        chosen = sorted(allowed, key=lambda e: -choice[e])[:cfg.top_k]
        w = s[chosen]
        if cfg.norm_topk_prob:
            w = w / w.sum()
        gates[t, chosen] = w * cfg.routed_scaling_factor
    return gates


@st.composite
def layers(draw):
    E = draw(st.integers(1, 8))
    n_group = draw(st.sampled_from([g for g in (1, 2, 4) if E % g == 0 and E // g >= 2] or [1]))
    topk_group = draw(st.integers(1, n_group))
    K = draw(st.integers(1, topk_group * (E // n_group) if n_group > 1 else E))
    sigmoid = draw(st.booleans())
    S = draw(st.sampled_from([0, 4]))
    cfg = MoEConfig(draw(st.sampled_from([4, 8, 16])), draw(st.integers(1, 8)), E, K,
                    scoring="sigmoid" if sigmoid else "softmax", norm_topk_prob=draw(st.booleans()),
                    n_group=n_group if sigmoid else 1, topk_group=topk_group if sigmoid else 1,
                    routed_scaling_factor=draw(st.sampled_from([1.0, 2.5])), correction_bias=sigmoid,
                    shared_intermediate_size=S, shared_gate=bool(S) and draw(st.booleans()))
    return cfg, draw(st.integers(0, 12)), draw(st.integers(0, 2**16))


@settings(max_examples=60, deadline=None, derandomize=True)  # reproducible in CI
@given(layers())
def test_random_layers_match_the_dense_formulation(case):
    """fp64 through the reference vs y = Σ_e gate_e · expert_e(x) over all E experts (+ shared)."""
    cfg, T, seed = case
    w = random_weights(cfg, seed=seed, dtype=torch.float64)
    if w.bias_E is not None:
        w.bias_E = w.bias_E.double()
    x = torch.randn(T, cfg.H, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    y = moe_reference(x, cfg, w)
    gates_TE = naive_route(x @ w.router_EH.T, cfg, w.bias_E)
    want = torch.zeros_like(x)
    for e in range(cfg.E):
        gate, up = (x @ w.gate_up_E2IH[e].T).chunk(2, dim=-1)
        want += gates_TE[:, e, None] * ((F.silu(gate) * up) @ w.down_EHI[e].T)
    if cfg.shared_intermediate_size:
        gate, up = (x @ w.shared_gate_up_2SH.T).chunk(2, dim=-1)
        shared = (F.silu(gate) * up) @ w.shared_down_HS.T
        want += torch.sigmoid(x @ w.shared_gate_1H.T) * shared if cfg.shared_gate else shared
    # The reference takes softmax/sigmoid scores in fp32 (as transformers does), so the gates carry
    # fp32 rounding (~1e-7 relative); everything else is fp64.
    torch.testing.assert_close(y, want, rtol=1e-6, atol=1e-6)


def test_reference_module_accepts_batched_input_and_keeps_weights():
    cfg = MoEConfig(16, 8, 4, 2, shared_intermediate_size=8, shared_gate=True)
    w = random_weights(cfg, seed=1)
    layer = MoELayer(cfg, w, path="torch")
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(2))
    assert torch.equal(layer(x), moe_reference(x.view(10, 16), cfg, w).view(2, 5, 16))
    assert sorted(dict(layer.named_buffers())) == sorted(w.tensors())
    assert layer.weights.tensors().keys() == w.tensors().keys()
