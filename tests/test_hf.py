"""The reference layer against transformers' own MoE blocks, bit for bit in fp32.

For each family a tiny random transformers model is built from a config (no download), its
experts forced to the ``eager`` implementation (the per-expert loop the reference mirrors), and
each MoE block is compared with the reference layer built from it (``MoELayer(path="torch")``).
"""
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from dispatch.arithmetic import param_counts
from dispatch.config import MoEConfig
from dispatch.hf import (
    OLMOE_1B_7B,
    TINY_COMMON,
    TINY_FAMILIES,
    check_block,
    config_from_hf,
    hub_config,
    model_shape_from_hf,
    moe_blocks,
    tiny_model,
    weights_from_hf,
)
from dispatch.moe import MoELayer
from dispatch.reference import experts_reference

H = 64
COMMON, FAMILIES = TINY_COMMON, TINY_FAMILIES
# Variants: top_k == E (every expert used by every token), and top-1 where all tokens go to one expert.
VARIANTS = {
    "default": {},
    "k_eq_e": {"olmoe": dict(num_experts_per_tok=8), "mixtral": dict(num_experts_per_tok=8),
               "qwen2_moe": dict(num_experts_per_tok=8), "qwen3_moe": dict(num_experts_per_tok=8),
               "deepseek_v3": dict(num_experts_per_tok=16, topk_group=4)},
    "one_expert": {f: dict(num_experts_per_tok=1) for f in FAMILIES} | {"deepseek_v3": dict(num_experts_per_tok=1)},
}
SHAPES = [(1, 1), (3, 7), (2, 16)]  # (B, S); T = 1, 21, 32
HOT = 3  # the expert every token picks in the "one_expert" variant


def build(family: str, variant: str = "default", seed: int = 0):
    hf_cfg, model = tiny_model(family, seed=seed, **VARIANTS[variant].get(family, {}))
    assert model.config._experts_implementation == "eager"
    if variant == "one_expert":  # logits: sum(x) for expert HOT, 0 otherwise; x > 0 below
        for _, block in moe_blocks(model):
            with torch.no_grad():
                block.gate.weight.zero_()
                block.gate.weight[HOT] = 1.0
    return hf_cfg, model


def inputs(variant: str, B: int, S: int, seed: int) -> torch.Tensor:
    x = torch.randn(B, S, H, generator=torch.Generator().manual_seed(seed))
    return x.abs() if variant == "one_expert" else x


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("family", ["olmoe", "mixtral", "qwen2_moe", "qwen3_moe"])
def test_softmax_families_bit_for_bit(family, variant):
    hf_cfg, model = build(family, variant)
    blocks = list(moe_blocks(model))
    assert [i for i, _ in blocks] == [0, 1]
    for _, block in blocks:
        ref = MoELayer.from_hf(block, hf_cfg, path="torch")
        for seed, (B, S) in enumerate(SHAPES):
            x = inputs(variant, B, S, seed)
            with torch.no_grad():
                logits_hf, w_hf, ids_hf = block.gate(x.view(-1, H))
                logits, w, ids = ref.route(x.view(-1, H))
                y_hf, y = block(x), ref(x)
            assert torch.equal(logits, logits_hf)
            assert torch.equal(ids, ids_hf)
            assert torch.equal(w.to(w_hf.dtype), w_hf)
            assert torch.equal(y, y_hf)
            if variant == "one_expert":
                assert (ids == HOT).all()
            if variant == "k_eq_e":
                assert torch.equal(ids.sort(-1)[0], torch.arange(ref.cfg.E).expand_as(ids))


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_deepseek_v3_matches_up_to_k_order(variant):
    """DeepSeek-V3's router takes ``topk(sorted=False)``: its k order is an implementation detail.

    The reference keeps topk order (k = 0 is the best choice). So ids agree as sets per token; the
    experts loop agrees bit for bit given the same routing; the renormalised weights differ only
    by the order of the K-term sum in the denominator (checked: renormalising our scores in
    transformers' k order reproduces its weights exactly), i.e. by an ulp or two; the block output
    then differs by < 4 ulp of its largest entry.
    """
    hf_cfg, model = build("deepseek_v3", variant)
    blocks = list(moe_blocks(model))
    assert [i for i, _ in blocks] == [1]  # layer 0 is dense (first_k_dense_replace=1)
    block = blocks[0][1]
    ref = MoELayer.from_hf(block, hf_cfg, path="torch")
    cfg, wts = ref.cfg, ref.weights
    eps = torch.finfo(torch.float32).eps
    for seed, (B, S) in enumerate(SHAPES * 2):
        x_TH = inputs(variant, B, S, seed).view(-1, H)
        with torch.no_grad():
            logits_hf, w_hf, ids_hf = block.gate(x_TH)
            logits, w, ids = ref.route(x_TH)
            y_hf, y = block(x_TH), ref(x_TH)
            experts_hf = block.experts(x_TH, ids_hf, w_hf)
            experts = experts_reference(x_TH, w_hf, ids_hf, wts.gate_up_E2IH, wts.down_EHI)
        assert torch.equal(logits, logits_hf)
        assert torch.equal(ids.sort(-1)[0], ids_hf.sort(-1)[0])
        assert torch.equal(experts, experts_hf)
        # weights matched by expert id
        w_by_id, w_hf_by_id = w.gather(1, ids.argsort(-1)), w_hf.gather(1, ids_hf.argsort(-1))
        torch.testing.assert_close(w_by_id, w_hf_by_id, rtol=4 * eps, atol=0)
        s_TK = logits.sigmoid().gather(1, ids_hf)  # our scores, transformers' k order
        assert torch.equal(s_TK / (s_TK.sum(-1, keepdim=True) + 1e-20) * cfg.routed_scaling_factor, w_hf)
        assert (y - y_hf).abs().max() <= 4 * eps * y_hf.abs().max()
        assert not torch.equal(y, torch.zeros_like(y))


def test_reference_swapped_into_the_model_gives_the_same_logits():
    for family in ("olmoe", "qwen2_moe"):
        _, model = build(family)
        tokens = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            want = model(tokens).logits
            for idx, block in list(moe_blocks(model)):
                model.model.layers[idx].mlp = MoELayer.from_hf(block, model.config, path="torch")
            got = model(tokens).logits
        assert all(isinstance(layer.mlp, MoELayer) for layer in model.model.layers)
        assert torch.equal(got, want)


def test_config_from_hf_reads_each_family():
    want = {
        "olmoe": MoEConfig(H, 32, 8, 2, family="olmoe"),
        "mixtral": MoEConfig(H, 32, 8, 2, norm_topk_prob=True, family="mixtral"),
        "qwen2_moe": MoEConfig(H, 32, 8, 2, norm_topk_prob=True, shared_intermediate_size=48, shared_gate=True,
                               family="qwen2_moe"),
        "qwen3_moe": MoEConfig(H, 32, 8, 2, norm_topk_prob=True, family="qwen3_moe"),
        "deepseek_v3": MoEConfig(H, 32, 16, 4, scoring="sigmoid", norm_topk_prob=True, n_group=4, topk_group=2,
                                 routed_scaling_factor=2.5, correction_bias=True, shared_intermediate_size=64,
                                 family="deepseek_v3"),
    }
    for family, cfg in want.items():
        assert config_from_hf(AutoConfig.for_model(family, **COMMON, **FAMILIES[family])) == cfg


def test_bridge_errors():
    with pytest.raises(ValueError, match="model_type must be one of"):
        config_from_hf(AutoConfig.for_model("llama"))
    with pytest.raises(ValueError, match="hidden_act must be one of"):  # gated: silu (SwiGLU) or gelu (GeGLU)
        config_from_hf(AutoConfig.for_model("olmoe", hidden_act="relu"))
    with pytest.raises(ValueError, match="sparse MoE block"):
        weights_from_hf(torch.nn.Linear(2, 2), MoEConfig(2, 2, 2, 1))
    with pytest.raises(ValueError, match="layers"):
        list(moe_blocks(torch.nn.Linear(2, 2)))
    with pytest.raises(ValueError, match="source must be"):
        hub_config("allenai/OLMoE-1B-7B-0924", source="web")
    with pytest.raises(ValueError, match="MLA"):
        model_shape_from_hf(AutoConfig.for_model("deepseek_v3"))


def test_a_block_that_does_not_match_the_config_is_refused():
    """A Mixtral block read with an OLMoE config has the same tensor shapes but renormalises: the
    layer would be off by ~1e-3. The block's family and its router's settings are checked."""
    olmoe_cfg, _ = build("olmoe")
    mixtral_cfg, mixtral = build("mixtral")
    _, qwen3 = build("qwen3_moe")
    _, qwen2 = build("qwen2_moe")
    block = next(moe_blocks(mixtral))[1]
    with pytest.raises(ValueError, match="the config is 'olmoe' .* but the block is a MixtralSparseMoeBlock"):
        MoELayer.from_hf(block, olmoe_cfg)
    custom = config_from_hf(olmoe_cfg).replace(family="custom")  # no family to compare: the router decides
    with pytest.raises(ValueError, match="router has norm_topk_prob=True but the config says False"):
        weights_from_hf(next(moe_blocks(qwen3))[1], custom)
    with pytest.raises(ValueError, match="router has top_k=2 but the config says 3"):
        weights_from_hf(next(moe_blocks(qwen3))[1], custom.replace(top_k=3, norm_topk_prob=True))
    with pytest.raises(ValueError, match="has a shared expert but the config has none"):
        weights_from_hf(next(moe_blocks(qwen2))[1], custom.replace(norm_topk_prob=True))
    assert MoELayer.from_hf(block, mixtral_cfg).cfg.family == "mixtral"


def test_embedded_olmoe_config_counts_like_the_transformers_model():
    """Parameter arithmetic equals the parameters of the transformers model built (on meta) from it."""
    hf_cfg = hub_config("allenai/OLMoE-1B-7B-0924", source="embedded")
    assert {k: getattr(hf_cfg, k) for k in ("hidden_size", "intermediate_size", "num_experts",
                                            "num_experts_per_tok", "num_hidden_layers", "vocab_size")} == \
        {k: OLMOE_1B_7B[k] for k in ("hidden_size", "intermediate_size", "num_experts",
                                     "num_experts_per_tok", "num_hidden_layers", "vocab_size")}
    others = [AutoConfig.for_model(f, **COMMON, **FAMILIES[f]) for f in ("mixtral", "qwen2_moe", "qwen3_moe")]
    others += [AutoConfig.for_model(f, **COMMON, **FAMILIES[f], mlp_only_layers=[0])
               for f in ("qwen2_moe", "qwen3_moe")]
    assert model_shape_from_hf(others[-1]).dense_layers == 1
    for cfg in (hf_cfg, *others):
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(cfg)
        assert param_counts(model_shape_from_hf(cfg))["total"] == sum(p.numel() for p in model.parameters())


def test_check_block_verdicts():
    x = torch.randn(21, H, generator=torch.Generator().manual_seed(0))
    _, model = build("olmoe")
    assert set(check_block(next(moe_blocks(model))[1], model.config, x).values()) == {"bit-exact"}
    _, model = build("deepseek_v3")
    got = check_block(next(moe_blocks(model))[1], model.config, x)
    assert got["router logits"] == "bit-exact" and got["expert ids"] in ("bit-exact", "same set")
    assert got["output"] in ("bit-exact", "within 4 ulp")
    block = next(moe_blocks(model))[1]  # a real difference must show
    forward = block.forward
    block.forward = lambda h: forward(h) * 1.001
    assert check_block(block, model.config, x)["output"] == "DIFFERENT"
    with pytest.raises(ValueError, match="family must be one of"):
        tiny_model("llama")


@pytest.mark.parametrize("family", list(FAMILIES))
def test_bf16(family):
    """In bf16, OLMoE and Qwen cast the routing weights to bf16 before scaling an expert's output,
    as the reference does: bit for bit. Mixtral and DeepSeek-V3 keep them fp32 (the product is
    rounded once, after): within a few bf16 ulp of the output's largest entry."""
    hf_cfg, model = build(family)
    model = model.to(torch.bfloat16)
    x = torch.randn(21, H, generator=torch.Generator().manual_seed(0)).bfloat16()
    got = check_block(next(moe_blocks(model))[1], hf_cfg, x)
    assert got["router logits"] == "bit-exact"
    want = "within 4 ulp" if family in ("mixtral", "deepseek_v3") else "bit-exact"
    assert got["output"] in ("bit-exact", want)
