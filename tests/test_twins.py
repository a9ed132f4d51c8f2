"""The plain-PyTorch twins of the grouped GEMM: one expert at a time (no per-row copies of expert
weights), the kernel's roundings, and the same bad-id policy."""
from __future__ import annotations

import resource

import torch

from dispatch.kernels import grouped_gemm as gg
from dispatch.kernels.combine import combine_torch
from dispatch.kernels.sort import sort_by_expert_torch
from dispatch.reference import experts_reference


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def test_twins_do_not_copy_expert_weights_per_row():
    """2048 routed rows on 2 experts of 2·256×512: a per-row gather of the weights would take
    2048 · 256 Ki · 4 B = 2 GiB (and as much again in fp32); one expert at a time needs ~1 MiB."""
    T, K, E, H, I = 2048, 1, 2, 512, 256  # noqa: E741
    g = torch.Generator().manual_seed(0)
    x = torch.randn(T, H, generator=g)
    gate_up = torch.randn(E, 2 * I, H, generator=g) / H ** 0.5
    down = torch.randn(E, H, I, generator=g) / I ** 0.5
    ids = torch.randint(0, E, (T, K), generator=g)
    w = torch.rand(T, K, generator=g)
    before = peak_rss_bytes()
    routes = sort_by_expert_torch(ids, E, 16)
    h = gg.grouped_up_swiglu_torch(x, routes, gate_up)
    out = gg.grouped_down_torch(h, routes, down, w)
    assert peak_rss_bytes() - before < 512 * 2**20
    torch.testing.assert_close(combine_torch(out, K), experts_reference(x, w, ids, gate_up, down),
                               atol=1e-4, rtol=1e-4)


def test_twins_follow_the_bad_id_policy():
    g = torch.Generator().manual_seed(1)
    T, K, E, H, I = 9, 3, 5, 32, 16  # noqa: E741
    x = torch.randn(T, H, generator=g)
    gate_up = torch.randn(E, 2 * I, H, generator=g) / H ** 0.5
    down = torch.randn(E, H, I, generator=g) / I ** 0.5
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    w = torch.rand(T, K, generator=g)
    ids[0, 1], ids[3, 0], ids[3, 2], ids[8, 0] = -1, E, 2**40, -(2**40)
    routes = sort_by_expert_torch(ids, E, 16)
    out = gg.grouped_down_torch(gg.grouped_up_swiglu_torch(x, routes, gate_up), routes, down, w)
    assert torch.equal(out[[1, 9, 11, 24]], torch.zeros(4, H))  # dropped rows: never computed
    y = combine_torch(out, K, ids_TK=ids, num_experts=E)
    torch.testing.assert_close(y, experts_reference(x, w, ids, gate_up, down), atol=1e-5, rtol=1e-4)
