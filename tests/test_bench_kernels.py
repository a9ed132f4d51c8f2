"""The kernels benchmark times what it claims: every contestant computes the same layer."""
import pytest
import torch

import dispatch  # noqa: F401
from dispatch.config import MoEConfig, PRESETS, random_weights
from dispatch_book.bench.kernels import contestants
from dispatch.reference import moe_reference, route_reference, router_logits

CFGS = {"tiny": PRESETS["tiny"], "shared": MoEConfig(64, 32, 8, 2, shared_intermediate_size=48, family="deepseek_moe")}


@pytest.mark.parametrize("name", list(CFGS))
@pytest.mark.parametrize("T", [1, 5])
def test_every_contestant_matches_the_reference(name, T):
    cfg = CFGS[name]
    w = random_weights(cfg, seed=4)
    x_TH = torch.randn(T, cfg.H, generator=torch.Generator().manual_seed(5))
    weights_TK, ids_TK = route_reference(router_logits(x_TH, cfg, w), cfg)
    out = contestants(cfg, w, x_TH, weights_TK, ids_TK, torch.device("cpu"))
    assert {"hf_eager", "hf_grouped_mm", "ours_grouped", "ours_decode", "ours_layer"} <= set(out)
    want = moe_reference(x_TH, cfg, w)
    for cname, (fn, reason) in out.items():
        if fn is None or reason is not None:
            continue
        torch.testing.assert_close(fn().float(), want, rtol=1e-5, atol=1e-5, msg=lambda m: f"{cname}: {m}")
