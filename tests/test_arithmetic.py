"""Roofline arithmetic against hand arithmetic for OLMoE-1B-7B, with ceilings passed in."""
import pytest
import torch

from dispatch.arithmetic import (
    ModelShape,
    Roofline,
    decode_step_roofline,
    expected_unique_experts,
    expert_layer_roofline,
    param_counts,
    ridge,
    unique_experts,
)
from dispatch.config import PRESETS
from dispatch.hf import hub_config, model_shape_from_hf

OLMOE = model_shape_from_hf(hub_config("allenai/OLMoE-1B-7B-0924", source="embedded"))


def test_olmoe_parameters_by_hand():
    H, I, E, K, L, V = 2048, 1024, 64, 8, 16, 50304
    expert = 3 * H * I  # 6,291,456
    attention = 4 * H * H + 2 * H  # q, k, v, o + OLMoE's q_norm, k_norm
    per_layer_common = attention + 2 * H + E * H  # + 2 RMSNorms + router
    total = 2 * V * H + H + L * (per_layer_common + E * expert)
    active = 2 * V * H + H + L * (per_layer_common + K * expert)
    p = param_counts(OLMOE)
    assert p["total"] == total == 6_919_161_856  # "7B" (OLMoE paper: 6.9B total)
    assert p["active"] == active == 1_282_017_280  # "1B" (OLMoE paper: 1.3B active)
    assert p["experts"] == L * E * expert


def test_expected_unique_experts():
    assert expected_unique_experts(64, 8, 0) == 0
    assert expected_unique_experts(64, 8, 1) == pytest.approx(8)
    assert expected_unique_experts(64, 8, 2) == pytest.approx(64 * (1 - (56 / 64) ** 2))  # 15.0
    assert expected_unique_experts(64, 64, 1) == 64
    assert expected_unique_experts(64, 8, 10_000) == pytest.approx(64)
    # the formula against a simulation of uniform routing
    g = torch.Generator().manual_seed(0)
    sims = [unique_experts(torch.rand(4, 64, generator=g).topk(8, dim=-1)[1]) for _ in range(2000)]
    assert sum(sims) / len(sims) == pytest.approx(expected_unique_experts(64, 8, 4), rel=0.01)
    assert unique_experts(torch.tensor([[0, 1], [1, 0], [5, 0]])) == 3


# Round example ceilings for the hand arithmetic (not any GPU's figures).
CEIL = dict(hbm_bps=4e12, flops_per_s=800e12)


def test_expert_layer_floors_by_hand():
    """At 1 token the 8 chosen experts are ~100 MB → 25.2 µs at 4 TB/s; at 16384 tokens the expert
    GEMMs are ~1.65 TFLOP → 2.06 ms at 800 TFLOP/s."""
    cfg = PRESETS["olmoe-1b-7b"]
    one = expert_layer_roofline(cfg, 1, **CEIL)
    assert one.bytes == (8 * 3 * 2048 * 1024 + 2 * 2048) * 2
    assert one.floor_s == pytest.approx(one.bytes / 4e12) and one.bound == "memory"
    big = expert_layer_roofline(cfg, 16384, **CEIL)
    assert big.flops == 2 * 16384 * 8 * 3 * 2048 * 1024  # 1.649e12
    assert big.floor_s == pytest.approx(big.flops / 800e12) and big.bound == "compute"
    ids = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7]] * 16)  # 16 tokens, all on the same 8 experts
    assert expert_layer_roofline(cfg, 16, ids_TK=ids, **CEIL).bytes == (8 * 3 * 2048 * 1024 + 2 * 16 * 2048) * 2
    assert ridge(4e12, 800e12) == 200.0


def test_decode_step_by_hand():
    """bs-1 decode reads ~2.35 GB (attention 0.54, experts 1.61, lm_head 0.21 GB) → 1,700 steps/s
    at 4 TB/s."""
    step = decode_step_roofline(OLMOE, 1, **CEIL)
    assert step.bytes == pytest.approx(2.35e9, rel=0.01)
    assert 1 / step.floor_s == pytest.approx(4e12 / step.bytes)
    # 2 FLOPs per active non-embedding parameter, by hand: 2 · (1,282,017,280 − 50304 · 2048)
    assert step.flops == 2 * (1_282_017_280 - 103_022_592) == 2_357_989_376
    assert decode_step_roofline(OLMOE, 1, context=100, **CEIL).flops == step.flops + 4 * 16 * 2048 * 100


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), True, "4e12"])
def test_ceilings_are_checked(bad):
    with pytest.raises(ValueError, match="hbm_bps must be a positive finite number"):
        Roofline(1.0, 1.0, hbm_bps=bad, flops_per_s=1e12)
    with pytest.raises(ValueError, match="flops_per_s must be a positive finite number"):
        expert_layer_roofline(PRESETS["tiny"], 1, hbm_bps=1e12, flops_per_s=bad)
    with pytest.raises(TypeError):  # the ceilings are required: no GPU's figures are built in
        expert_layer_roofline(PRESETS["tiny"], 1)


def test_model_shape_validates():
    with pytest.raises(ValueError, match="dense_layers"):
        ModelShape(PRESETS["tiny"], num_layers=2, vocab_size=8, num_heads=1, num_kv_heads=1, head_dim=64,
                   dense_layers=3)


def test_expert_parallel_exchange_by_hand_and_by_simulation():
    from dispatch.arithmetic import expert_parallel_exchange
    from dispatch.config import MoEConfig

    cfg = MoEConfig(hidden_size=4, intermediate_size=8, num_experts=4, top_k=2)
    # R = 2: a rank holds 2 of 4 experts; a token misses both of the other rank's with C(2,2)/C(4,2) = 1/6
    got = expert_parallel_exchange(cfg, 2, 6, itemsize=2)
    assert got == {"pairs": 6 * 2 * 0.5 * 8, "dispatch": 6 * 1 * (5 / 6) * 8, "combine": 6 * 2 * 0.5 * 8}
    assert expert_parallel_exchange(cfg, 1, 6) == {"pairs": 0.0, "dispatch": 0.0, "combine": 0.0}
    with pytest.raises(ValueError, match="ranks must divide"):
        expert_parallel_exchange(cfg, 3, 6)
    # against a draw: 20000 tokens, K of E without replacement, rank 0 counts the other ranks it sends to
    big = MoEConfig(hidden_size=1, intermediate_size=8, num_experts=64, top_k=8)
    g = torch.Generator().manual_seed(0)
    ids = torch.rand(20000, 64, generator=g).argsort(dim=1)[:, :8]
    owner = ids // 16  # R = 4, contiguous
    sent = sum(int((owner == r).any(dim=1).sum()) for r in (1, 2, 3))
    want = expert_parallel_exchange(big, 4, 20000, itemsize=1)["dispatch"]
    assert abs(sent - want) / want < 0.01
