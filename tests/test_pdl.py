"""Programmatic dependent launch: off where it cannot run; on a GPU it changes when kernels start,
never what they compute (bitwise, kernel by kernel and for whole graphed decode steps)."""
import pytest
import torch

import dispatch  # noqa: F401  (first: runtime decisions)
from dispatch import runtime
from dispatch.kernels import pdl


def test_off_on_cpu_and_inside_disabled(monkeypatch):
    assert pdl.launch_kw("cpu") == {"PDL": False}
    assert not pdl.enabled(torch.device("cpu"))
    with pdl.disabled():
        with pdl.disabled():
            assert pdl._off == 2
        assert pdl._off == 1
    assert pdl._off == 0
    monkeypatch.setenv("DISPATCH_PDL", "0")
    assert pdl.launch_kw("cpu") == {"PDL": False}


def test_skip_names_the_launching_modules(monkeypatch):
    """DISPATCH_PDL_SKIP: the launchers of the named modules (the caller of launch_kw) launch without PDL."""
    def launch_kw():  # stands for pdl.launch_kw: _skipped looks at the frame that called it
        return pdl._skipped()

    def launcher_in(module: str):
        scope = {"__name__": module, "launch_kw": launch_kw}
        exec("def launcher():\n    return launch_kw()", scope)
        return scope["launcher"]()

    monkeypatch.delenv("DISPATCH_PDL_SKIP", raising=False)
    assert not launcher_in("dispatch.kernels.paged_attention")
    monkeypatch.setenv("DISPATCH_PDL_SKIP", "decode_fused,paged_attention")
    assert launcher_in("dispatch.kernels.paged_attention") and launcher_in("dispatch.kernels.decode_fused")
    assert not launcher_in("dispatch.kernels.attention") and not launcher_in("dispatch.kernels.sort")


def _sm90():
    return runtime.HAS_CUDA and torch.cuda.get_device_capability() >= (9, 0)


@pytest.mark.gpu
def test_on_for_hopper_and_off_by_env(monkeypatch):
    assert pdl.enabled("cuda") == (_sm90() and pdl._triton_has_pdl())
    monkeypatch.setenv("DISPATCH_PDL", "0")
    assert not pdl.enabled("cuda")


def _both(fn):
    """fn() run with PDL (where the device has it) and without: the two results."""
    on = fn()
    with pdl.disabled():
        off = fn()
    return on, off


@pytest.mark.gpu
def test_kernels_bitwise_with_and_without_pdl():
    from dispatch.config import MoEConfig, random_weights
    from dispatch.kernels.attention import decode_attention
    from dispatch.kernels.dense_gemv import linear_small
    from dispatch.kernels.norm_rope import add_rms
    from dispatch.moe import moe

    dt = runtime.compute_dtype()
    g = torch.Generator("cuda").manual_seed(0)
    for M in (1, 5):
        x = torch.randn(M, 2048, device="cuda", dtype=dt, generator=g)
        w = torch.randn(3000, 2048, device="cuda", dtype=dt, generator=g)
        on, off = _both(lambda x=x, w=w: linear_small(x, w))
        assert torch.equal(on, off)
    r = torch.randn(3, 512, device="cuda", dtype=dt, generator=g)
    d, nw = torch.randn_like(r), torch.randn(512, device="cuda", dtype=dt, generator=g)
    on, off = _both(lambda: (add_rms(r.clone(), d, nw, 1e-6)))
    assert torch.equal(on, off)
    q = torch.randn(2, 8, 64, device="cuda", dtype=dt, generator=g)
    kc, vc = (torch.randn(2, 700, 2, 64, device="cuda", dtype=dt, generator=g) for _ in range(2))
    pos = torch.tensor([5, 650], device="cuda")
    on, off = _both(lambda: decode_attention(q, kc, vc, pos))
    assert torch.equal(on, off)
    cfg = MoEConfig(hidden_size=256, intermediate_size=128, num_experts=16, top_k=4)
    wts = random_weights(cfg, seed=0, dtype=dt, device="cuda")
    for T in (1, 7, 200, 3000):  # decode kernels, then the sort and the grouped GEMM (one wave, many)
        x = torch.randn(T, 256, device="cuda", dtype=dt, generator=g)
        on, off = _both(lambda x=x: moe(x, cfg, wts))
        assert torch.equal(on, off), T


@pytest.mark.gpu
def test_graphed_decode_tokens_with_and_without_pdl():
    from dispatch.engine import Engine, LeanModel
    from dispatch_book.bench.e2e import build

    lean = LeanModel.from_hf(build(num_hidden_layers=4))
    prompts = [list(range(3 + b, 40 + 7 * b)) for b in range(3)]
    on, off = _both(lambda: Engine(lean, max_batch=3, max_seq=96).generate(prompts, 24).tokens)
    assert on == off
