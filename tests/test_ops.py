"""The kernel entry points as ``torch.library`` ops: torch.compile traces through the layer without
graph breaks, the results are the eager ones, and a backward through a kernel path fails loudly
(the plain-PyTorch path keeps autograd). CPU: Triton's interpreter; GPU (marker ``gpu``): compiled."""
from __future__ import annotations

import pytest
import torch

from dispatch import MoEConfig, MoELayer, random_weights
from dispatch.kernels.combine import combine
from dispatch.kernels.gemm_config import GemmConfig
from dispatch.kernels.gemv import DecodeConfig

CFG = MoEConfig(32, 16, 8, 2, norm_topk_prob=True, shared_intermediate_size=16)
TILES = {"triton": GemmConfig(16, 32, 32, 4, 1), "decode": DecodeConfig(block_i=16, block_h=32, block_ho=16,
                                                                        block_id=32, num_stages=1)}


def test_ops_are_registered():
    for name in ("route", "moe_experts", "moe_decode", "combine"):
        assert hasattr(torch.ops.dispatch, name), name


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("path", ["triton", "decode"])
def test_compile_traces_through_the_kernel_paths_in_one_graph(path, backend):
    layer = MoELayer(CFG, random_weights(CFG, seed=3), path=path, tiles=TILES[path])
    x = torch.randn(6, 32, generator=torch.Generator().manual_seed(4))
    torch._dynamo.reset()
    compiled = torch.compile(layer, backend=backend, fullgraph=True)  # fullgraph: a graph break is an error
    with torch.no_grad():
        assert torch.equal(compiled(x), layer(x))


def test_backward_through_a_kernel_path_raises():
    w = random_weights(CFG, seed=5)
    for t in w.tensors().values():
        t.requires_grad_(True)
    x = torch.randn(4, 32, requires_grad=True)
    for path in ("triton", "decode"):
        y = MoELayer(CFG, w, path=path)(x)
        with pytest.raises(RuntimeError, match=r"has no backward: gradients would be lost.*path='torch'"):
            y.sum().backward()
    y = MoELayer(CFG, w, path="torch")(x)  # the reference path trains
    y.sum().backward()
    assert x.grad is not None and w.router_EH.grad is not None and w.gate_up_E2IH.grad is not None
    with pytest.raises(RuntimeError, match="has no backward"):
        combine(torch.randn(4, 8, requires_grad=True), 2).sum().backward()


@pytest.mark.gpu
@pytest.mark.parametrize("path", ["triton", "decode"])
def test_gpu_compile_matches_eager(path):
    cfg = MoEConfig(256, 128, 16, 4, norm_topk_prob=True)
    layer = MoELayer(cfg, random_weights(cfg, dtype=torch.bfloat16, device="cuda"), path=path)
    x = torch.randn(48, 256, device="cuda", dtype=torch.bfloat16)
    torch._dynamo.reset()
    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    with torch.no_grad():
        assert torch.equal(compiled(x), layer(x))
