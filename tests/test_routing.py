"""The Triton router against the reference router (``dispatch.reference.route_reference``).

CPU (Triton interpreter, fp32/fp16 logits): every routing family, property-based over random
shapes and configs (zero / one token, top_k = E, non-contiguous logits), the documented tie rule,
bitwise repeatability, input validation. GPU (marker ``gpu``): compiled kernel, bf16 and fp32
logits, against the reference with the tolerances below, and bitwise determinism.

Tolerances: both sides compute in fp32 from the same logits; they differ only in exp/sigmoid
implementations and summation order → on CPU ids exactly and weights within atol 2e-6, rtol 1e-5;
on the GPU see ``assert_matches_up_to_near_ties`` (Triton's fast exp moves scores by a few ulp).
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from dispatch import families
from dispatch.config import PRESETS, MoEConfig
from dispatch.kernels.routing import route, route_torch
from dispatch.reference import route_reference

FAMILIES = {
    "olmoe": MoEConfig(64, 32, 16, 4, family="olmoe"),
    "mixtral": MoEConfig(64, 32, 8, 2, norm_topk_prob=True, family="mixtral"),
    "scaled_softmax": MoEConfig(64, 32, 12, 3, norm_topk_prob=True, routed_scaling_factor=1.5),
    "sigmoid_plain": MoEConfig(64, 32, 10, 3, scoring="sigmoid"),
    "deepseek_v3": MoEConfig(64, 32, 16, 4, scoring="sigmoid", norm_topk_prob=True, n_group=4, topk_group=2,
                             routed_scaling_factor=2.5, correction_bias=True, family="deepseek_v3"),
    "deepseek_groups_of_1": MoEConfig(64, 32, 8, 2, scoring="sigmoid", n_group=8, topk_group=3,
                                      correction_bias=True),
}


def make_case(cfg, T, *, seed=0, dtype=torch.float32, device="cpu", transpose=False):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(T, cfg.num_experts, generator=g) * 2
    if transpose:  # same values, column-major storage: strides (1, T)
        logits = logits.T.contiguous().T
    bias = torch.randn(cfg.num_experts, generator=g) * 0.3 if cfg.correction_bias else None
    logits = logits.to(device=device, dtype=dtype)
    return logits, None if bias is None else bias.to(device)


def assert_matches(cfg, logits, bias, *, atol=2e-6, rtol=1e-5):
    w, ids = route(logits, cfg, bias)
    w_ref, ids_ref = route_reference(logits, cfg, bias)
    assert w.dtype == torch.float32 and ids.dtype == torch.int32
    assert w.shape == ids.shape == (logits.shape[0], cfg.top_k)
    assert torch.equal(ids.long(), ids_ref)
    torch.testing.assert_close(w, w_ref, atol=atol, rtol=rtol)


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_families_match_reference(family, dtype):
    cfg = FAMILIES[family]
    logits, bias = make_case(cfg, 33, seed=1, dtype=dtype)
    assert_matches(cfg, logits, bias)


@pytest.mark.parametrize("preset", ["olmoe-1b-7b", "qwen3-30b-a3b", "deepseek-v3", "tiny"])
def test_presets_match_reference(preset):
    cfg = PRESETS[preset]
    logits, bias = make_case(cfg, 9, seed=2)
    assert_matches(cfg, logits, bias)


def test_worked_example():
    w, ids = route(torch.tensor([[0.0, 1.0, 2.0, 3.0]]), MoEConfig(8, 8, 4, 2))
    assert ids.tolist() == [[3, 2]]
    torch.testing.assert_close(w, torch.softmax(torch.tensor([[3.0, 2.0, 1.0, 0.0]]), -1)[:, :2])


@st.composite
def configs(draw):
    """Every routing family of the registry, with the options it reads (groups, a selection bias)."""
    family = families.get(draw(st.sampled_from(sorted(families.FAMILIES))))
    n_group, topk_group, bias = 1, 1, False
    if family.groups and draw(st.booleans()):
        n_group = draw(st.sampled_from([2, 4, 8]))
        topk_group = draw(st.integers(1, n_group))
        E = n_group * draw(st.integers(1, 4))
        bias = family.correction_bias and draw(st.booleans())
        K = draw(st.integers(1, topk_group * (E // n_group)))
    else:
        E = draw(st.integers(1, 16))
        K = draw(st.integers(1, E))
        bias = family.correction_bias and draw(st.booleans())
    return MoEConfig(64, 32, E, K, scoring=family.name, norm_topk_prob=draw(st.booleans()), n_group=n_group,
                     topk_group=topk_group, correction_bias=bias,
                     routed_scaling_factor=draw(st.sampled_from([1.0, 2.5])))


@given(cfg=configs(), T=st.integers(0, 64), seed=st.integers(0, 2**16), transpose=st.booleans())
def test_random_configs_match_reference(cfg, T, seed, transpose):
    logits, bias = make_case(cfg, T, seed=seed, transpose=transpose)
    assert_matches(cfg, logits, bias)


@pytest.mark.parametrize("T", [0, 1])
def test_zero_and_one_token(T):
    cfg = FAMILIES["deepseek_v3"]
    logits, bias = make_case(cfg, T)
    assert_matches(cfg, logits, bias)


def test_top_k_equals_num_experts():
    cfg = MoEConfig(64, 32, 8, 8, norm_topk_prob=True)
    logits, _ = make_case(cfg, 17, seed=3)
    assert_matches(cfg, logits, None)
    ids = route(logits, cfg)[1]
    assert torch.equal(ids.sort(dim=1).values, torch.arange(8, dtype=torch.int32).expand(17, 8))


def test_non_contiguous_sliced_logits():
    cfg = FAMILIES["olmoe"]
    wide = torch.randn(20, 2 * cfg.num_experts, generator=torch.Generator().manual_seed(4))
    logits = wide[::2, 1::2]  # strides (2·2E, 2)
    assert not logits.is_contiguous()
    assert_matches(cfg, logits, None)


def test_ties_go_to_the_lowest_expert_id():
    # Our rule: among equal scores the lowest expert id wins. torch.topk has no documented rule
    # (on CPU it picks [2, 4, 1] here), so ids may differ from it inside a tie; weights may not.
    cfg = MoEConfig(8, 8, 5, 3)
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0, 3.0], [2.0, 2.0, 2.0, 2.0, 2.0]])
    w, ids = route(logits, cfg)
    assert ids.tolist() == [[1, 2, 4], [0, 1, 2]]
    w_ref, _ = route_reference(logits, cfg)
    torch.testing.assert_close(w, w_ref)
    # DeepSeek-style: tied groups also go to the lowest group id.
    cfg_g = MoEConfig(8, 8, 4, 1, scoring="sigmoid", n_group=2, topk_group=1)
    assert route(torch.zeros(1, 4), cfg_g)[1].tolist() == [[0]]


def test_bias_only_steers_the_choice():
    cfg = MoEConfig(8, 8, 4, 1, scoring="sigmoid", correction_bias=True)
    logits = torch.tensor([[2.0, 0.0, 0.0, 0.0]])
    bias = torch.tensor([0.0, 0.0, 5.0, 0.0])
    w, ids = route(logits, cfg, bias)
    assert ids.tolist() == [[2]]  # chosen with the bias ...
    torch.testing.assert_close(w, torch.sigmoid(torch.tensor([[0.0]])))  # ... weighted without it


def test_bitwise_repeatable():
    cfg = FAMILIES["deepseek_v3"]
    logits, bias = make_case(cfg, 50, seed=5)
    a, b = route(logits, cfg, bias), route(logits, cfg, bias)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_bf16_logits_on_cpu_are_widened():
    cfg = FAMILIES["mixtral"]
    logits, _ = make_case(cfg, 12, dtype=torch.bfloat16)
    w, ids = route(logits, cfg)
    w_ref, ids_ref = route_reference(logits, cfg)
    torch.testing.assert_close(w, w_ref, atol=2e-6, rtol=1e-5)
    # bf16 logits can tie: compare the chosen scores, not the ids
    probs = torch.softmax(logits.float(), -1)
    torch.testing.assert_close(probs.gather(1, ids.long()), probs.gather(1, ids_ref))


@pytest.mark.parametrize("bad, match", [
    (lambda cfg: (torch.randn(4, 7), cfg, None), "shape"),
    (lambda cfg: (torch.randn(4), cfg, None), "shape"),
    (lambda cfg: (torch.zeros(4, 16, dtype=torch.int32), cfg, None), "float32"),
    (lambda cfg: (torch.randn(4, 16), "olmoe", None), "MoEConfig"),
    (lambda cfg: (torch.randn(4, 16), cfg, torch.zeros(16)), "not read by scoring="),
    (lambda cfg: (torch.randn(4, 16), FAMILIES["deepseek_v3"], None), "correction bias"),
    (lambda cfg: (torch.randn(4, 16), FAMILIES["deepseek_v3"], torch.zeros(8)), r"shape \[E=16\]"),
    (lambda cfg: (torch.randn(4, 16), FAMILIES["deepseek_v3"], torch.zeros(16, dtype=torch.int64)), "floating"),
])
def test_bad_inputs_raise(bad, match):
    logits, cfg, bias = bad(FAMILIES["olmoe"])
    with pytest.raises(ValueError, match=match):
        route(logits, cfg, bias)


def assert_non_finite_rows_routed_like_the_reference(cfg, logits, bias, bad_rows):
    """Non-finite tokens: K valid, distinct ids and weights whose finiteness matches the reference's
    (NaN scores → NaN weights; sigmoid(±inf) is finite); every other token exactly as before."""
    w, ids = route(logits, cfg, bias)
    w_ref, _ = route_reference(logits, cfg, bias)
    E, K = cfg.num_experts, cfg.top_k
    assert ((ids >= 0) & (ids < E)).all(), ids
    assert all(len(set(row)) == K for row in ids.tolist()), "ids of a token must be distinct"
    assert torch.equal(w.isnan(), w_ref.isnan())
    good = [t for t in range(logits.shape[0]) if t not in bad_rows]
    w_ok, ids_ok = route(logits[good], cfg, bias)
    assert torch.equal(w[good], w_ok) and torch.equal(ids[good], ids_ok)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_non_finite_tokens_get_valid_distinct_ids(family):
    cfg = FAMILIES[family]
    logits, bias = make_case(cfg, 9, seed=11)
    logits[1] = float("nan")  # the whole row
    logits[3, 2] = float("nan")  # one entry
    logits[4, 0] = float("inf")
    logits[6, :] = float("-inf")
    logits[7, 1] = float("-inf")  # a finite routing: that expert is never chosen
    assert_non_finite_rows_routed_like_the_reference(cfg, logits, bias, bad_rows={1, 3, 4, 6, 7})
    w, _ = route(logits, cfg, bias)
    if cfg.scoring == "softmax":
        assert w[[1, 3, 4, 6]].isnan().all() and w[7].isfinite().all()


@given(st.sampled_from(sorted(FAMILIES)), st.integers(1, 40), st.data())
def test_random_non_finite_tokens(family, T, data):
    cfg = FAMILIES[family]
    logits, bias = make_case(cfg, T, seed=data.draw(st.integers(0, 2**16)))
    bad = data.draw(st.sets(st.integers(0, T - 1), max_size=T))
    for t in bad:
        e = data.draw(st.integers(0, cfg.num_experts - 1))
        logits[t, e] = data.draw(st.sampled_from([float("nan"), float("inf"), float("-inf")]))
    assert_non_finite_rows_routed_like_the_reference(cfg, logits, bias, bad)


def test_twin_is_the_reference_with_int32_ids():
    cfg = FAMILIES["deepseek_v3"]
    logits, bias = make_case(cfg, 8, seed=6)
    w, ids = route_torch(logits, cfg, bias)
    w_ref, ids_ref = route_reference(logits, cfg, bias)
    assert ids.dtype == torch.int32 and torch.equal(ids.long(), ids_ref) and torch.equal(w, w_ref)


# ---------------------------------------------------------------- GPU: compiled kernel
GPU_CASES = [("olmoe-1b-7b", 1), ("olmoe-1b-7b", 4099), ("qwen3-30b-a3b", 777), ("mixtral-8x7b", 513),
             ("deepseek-v3", 1), ("deepseek-v3", 16384)]


def assert_matches_up_to_near_ties(cfg, logits, bias):
    """GPU tolerances. Triton's exp differs from torch's by a few ulp, and bf16 logits tie exactly
    and often, so two experts may legitimately come out in either order.
    softmax: weights to atol = rtol = 1e-5 at every token (tied experts have equal weights), and the
        probabilities of the chosen experts agree to 1e-6 — ids may differ only inside a tie;
    sigmoid + bias (no exact ties): at most 1 token in 1000 may differ (near-ties), the weights of
        the others agree to atol = rtol = 1e-5."""
    w, ids = route(logits, cfg, bias)
    w_ref, ids_ref = route_reference(logits, cfg, bias)
    if cfg.scoring == "softmax":
        torch.testing.assert_close(w, w_ref, atol=1e-5, rtol=1e-5)
        probs = torch.softmax(logits.float(), -1)
        torch.testing.assert_close(probs.gather(1, ids.long()), probs.gather(1, ids_ref), atol=1e-6, rtol=0)
        return
    same = (ids.long() == ids_ref).all(dim=1)
    assert same.float().mean().item() >= 0.999, f"{int((~same).sum())} of {len(same)} tokens differ"
    torch.testing.assert_close(w[same], w_ref[same], atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("preset, T", GPU_CASES)
def test_gpu_matches_reference(preset, T, dtype):
    cfg = PRESETS[preset]
    logits, bias = make_case(cfg, T, seed=7, dtype=dtype, device="cuda")
    assert_matches_up_to_near_ties(cfg, logits, bias)


@pytest.mark.gpu
def test_gpu_non_contiguous_and_fp16():
    cfg = PRESETS["qwen3-30b-a3b"]
    logits, _ = make_case(cfg, 1000, seed=8, dtype=torch.float16, device="cuda", transpose=True)
    assert_matches_up_to_near_ties(cfg, logits, None)


@pytest.mark.gpu
@pytest.mark.parametrize("preset", ["olmoe-1b-7b", "deepseek-v3"])
def test_gpu_non_finite_tokens(preset):
    cfg = PRESETS[preset]
    logits, bias = make_case(cfg, 300, seed=10, dtype=torch.bfloat16, device="cuda")
    logits[5] = float("nan")
    logits[17, 3] = float("inf")
    logits[200, 0] = float("nan")
    w, ids = route(logits, cfg, bias)
    assert ((ids >= 0) & (ids < cfg.num_experts)).all()
    assert all(len(set(row)) == cfg.top_k for row in ids.tolist())
    assert torch.equal(w.isnan(), route_reference(logits, cfg, bias)[0].isnan())
    good = [t for t in range(300) if t not in (5, 17, 200)]
    w_ok, ids_ok = route(logits[good], cfg, bias)
    assert torch.equal(w[good], w_ok) and torch.equal(ids[good], ids_ok)


@pytest.mark.gpu
def test_gpu_bitwise_deterministic():
    cfg = PRESETS["deepseek-v3"]
    logits, bias = make_case(cfg, 8192, seed=9, dtype=torch.bfloat16, device="cuda")
    runs = [route(logits, cfg, bias) for _ in range(3)]
    for w, ids in runs[1:]:
        assert torch.equal(w, runs[0][0]) and torch.equal(ids, runs[0][1])
