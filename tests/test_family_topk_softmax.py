"""A third routing family, added as one table entry plus its kernel branch (dispatch.families,
dispatch/kernels/routing.py): top-K of the logits, then the softmax of those K — transformers'
Cohere2-MoE. The kernel against the reference under the interpreter (edges included), the layer's
kernel paths, the transformers mapping bit for bit, and the experts backend on that model."""
import pytest
import torch

from dispatch import families
from dispatch.config import MoEConfig, random_weights
from dispatch.kernels.routing import route
from dispatch.moe import MoELayer
from dispatch.reference import route_reference

CFG = MoEConfig(64, 32, 12, 3, scoring="topk_softmax", routed_scaling_factor=2.0)


def test_the_weights_are_the_softmax_of_the_chosen_logits():
    cfg = MoEConfig(8, 8, 4, 2, scoring="topk_softmax")
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]])
    w, ids = route_reference(logits, cfg)
    assert ids.tolist() == [[3, 2]]
    torch.testing.assert_close(w, torch.softmax(torch.tensor([[3.0, 2.0]]), -1))
    # the experts of softmax routing; the weights of its renormalised form, up to rounding
    w_soft, ids_soft = route_reference(logits, cfg.replace(scoring="softmax", norm_topk_prob=True))
    assert torch.equal(ids, ids_soft)
    torch.testing.assert_close(w, w_soft)
    assert not families.get("topk_softmax").renorm  # norm_topk_prob is not read: the weights sum to one
    assert torch.equal(route_reference(logits, cfg.replace(norm_topk_prob=True))[0], w)


@pytest.mark.parametrize("T", [0, 1, 7, 33])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("K", [1, 3, 12])
def test_the_kernel_matches_the_reference(T, dtype, K):
    cfg = CFG.replace(top_k=K, norm_topk_prob=True)
    logits = (torch.randn(T, 12, generator=torch.Generator().manual_seed(T + K)) * 2).to(dtype)
    w, ids = route(logits, cfg)
    w_ref, ids_ref = route_reference(logits, cfg)
    assert w.dtype == torch.float32 and ids.dtype == torch.int32 and w.shape == (T, K)
    assert torch.equal(ids.long(), ids_ref)
    torch.testing.assert_close(w, w_ref, atol=2e-6, rtol=1e-5)
    if T:
        torch.testing.assert_close(w.sum(-1), torch.full((T,), 2.0), atol=1e-5, rtol=0)  # × scaling


def test_non_finite_tokens_route_like_the_reference():
    logits = torch.randn(6, 12, generator=torch.Generator().manual_seed(5))
    logits[1] = float("nan")
    logits[2, 3] = float("inf")
    logits[4, :5] = float("-inf")  # finite routing among the other experts
    w, ids = route(logits, CFG)
    w_ref, ids_ref = route_reference(logits, CFG)
    assert all(len(set(r)) == 3 and all(0 <= e < 12 for e in r) for r in ids.tolist())
    assert w[1].isnan().all() and w[2].isnan().any() and w[4].isfinite().all()
    ok = [0, 3, 4, 5]
    assert torch.equal(ids[ok].long(), ids_ref[ok])
    torch.testing.assert_close(w[ok], w_ref[ok], atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("path", ["triton", "decode"])
def test_the_layers_kernel_paths_match_the_reference_layer(path):
    w = random_weights(CFG, seed=3)
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(4))
    y = MoELayer(CFG, w, path=path)(x)
    torch.testing.assert_close(y, MoELayer(CFG, w, path="torch")(x), atol=1e-5, rtol=1e-4)


def _tiny_cohere2(**kw):
    transformers = pytest.importorskip("transformers")
    if "cohere2_moe" not in transformers.models.auto.configuration_auto.CONFIG_MAPPING:
        pytest.skip("this transformers has no cohere2_moe")
    config = transformers.AutoConfig.for_model(
        "cohere2_moe", hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, vocab_size=128, intermediate_size=32, num_experts=8, num_experts_per_tok=2,
        max_position_embeddings=64, pad_token_id=None, bos_token_id=None, eos_token_id=None, **kw)
    config._experts_implementation = "eager"
    torch.manual_seed(0)
    return config, transformers.AutoModelForCausalLM.from_config(config).eval()


def test_the_transformers_mapping_is_bit_exact():
    from dispatch.hf import check_block, config_from_hf, moe_blocks

    hf_config, model = _tiny_cohere2()
    cfg = config_from_hf(hf_config)
    assert cfg.scoring == "topk_softmax" and (cfg.E, cfg.K, cfg.I) == (8, 2, 32) and cfg.family == "cohere2_moe"
    x = torch.randn(21, 64, generator=torch.Generator().manual_seed(2))
    for _, block in moe_blocks(model):
        assert set(check_block(block, hf_config, x).values()) == {"bit-exact"}
    with pytest.raises(ValueError, match="expert_selection_fn"):
        config_from_hf(_tiny_cohere2(expert_selection_fn="sigmoid")[0])


def test_the_experts_backend_runs_the_family():
    from dispatch.engine import register

    register()
    _, model = _tiny_cohere2()
    ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        eager = model(ids).logits
        model.set_experts_implementation("dispatch")
        ours = model(ids).logits
    torch.testing.assert_close(ours, eager, atol=1e-5, rtol=1e-5)
