"""dispatch.compiles: the log of Triton compiles that a server's slow step is checked against."""
import pytest


def test_compiles_are_logged_with_their_arguments_and_earlier_hooks_still_run(monkeypatch):
    knobs = pytest.importorskip("triton").knobs
    from dispatch import compiles

    seen = []
    monkeypatch.setattr(knobs.runtime, "jit_post_compile_hook", lambda *a, **kw: seen.append(kw["repr"]))
    monkeypatch.setattr(compiles, "_WATCHING", False)
    monkeypatch.setattr(compiles, "_LOG", [])
    assert compiles.watch() and compiles.watch()  # twice: one hook
    mark = compiles.count()
    hook = knobs.runtime.jit_post_compile_hook
    hook(key=None, repr="_down_kernel[num_warps=4](N: i32, K: constexpr)", fn=None, compile={},
         is_manual_warmup=False, already_compiled=False)
    assert compiles.since(mark) == ["_down_kernel[num_warps=4](N: i32, K: constexpr)"]
    assert seen == ["_down_kernel[num_warps=4](N: i32, K: constexpr)"]  # the hook set before ours ran too
    assert compiles.since(compiles.count()) == []


def test_without_the_hook_nothing_is_watched(monkeypatch):
    pytest.importorskip("triton")
    import triton

    from dispatch import compiles

    monkeypatch.setattr(compiles, "_WATCHING", False)
    monkeypatch.setattr(triton, "knobs", type("K", (), {"runtime": object()}))
    assert compiles.watch() is False


def test_launch_class_follows_tritons_specialisation():
    """Hand-computed classes of a small kernel: a constexpr by value, an int by kind (1, a multiple of
    16, other), an int the kernel will not specialise by width alone, a tensor by dtype and alignment;
    ``run=False`` records without running, ``run=True`` runs as before."""
    pytest.importorskip("triton")
    import torch
    import triton
    import triton.language as tl

    from dispatch import compiles

    @triton.jit(do_not_specialize=["M"])
    def _fill(out_ptr, N, M, V: tl.constexpr, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK)
        tl.store(out_ptr + i, tl.zeros([BLOCK], tl.float32) + V + N + M, mask=i < BLOCK)

    out = torch.zeros(16)
    with compiles.launches(run=False) as seen:
        _fill[(1,)](out, 1, 1, V=2, BLOCK=16)
        _fill[(1,)](out, 32, 5, V=2, BLOCK=16, num_warps=2)
        _fill[(1,)](out[1:], 7, 32, V=3, BLOCK=8)
    assert out.abs().sum() == 0  # nothing ran
    ptr16, ptr = "*torch.float32:16", "*torch.float32"
    assert seen == [("_fill", ("out_ptr", ptr16), ("N", "1"), ("M", "i32"), ("V", 2), ("BLOCK", 16), ()),
                    ("_fill", ("out_ptr", ptr16), ("N", "i32:16"), ("M", "i32"), ("V", 2), ("BLOCK", 16),
                     (("num_warps", 2),)),
                    ("_fill", ("out_ptr", ptr), ("N", "i32"), ("M", "i32"), ("V", 3), ("BLOCK", 8), ())]
    with compiles.launches() as seen:
        _fill[(1,)](out, 1, 1, V=2, BLOCK=16)
    assert len(seen) == 1 and out.tolist() == [4.0] * 16


@pytest.mark.parametrize("E,K,shared", [(16, 6, 0), (64, 8, 0), (8, 2, 32)])
def test_warmup_lengths_cover_every_class_the_experts_path_launches(E, K, shared):
    """Every token count up to 300 launches kernels of classes (``compiles.launch_class``) that the
    server's warm-up lengths launched already: a real request's step compiles nothing. The classes are
    taken from the experts path's own launches (the sort, the decode kernels below the crossover, the
    grouped GEMM above it), not from a list of what ought to matter; a warm-up of powers of two alone
    misses some, so the check can fail."""
    pytest.importorskip("triton")
    import torch

    from dispatch import compiles
    from dispatch.config import MoEConfig, random_weights
    from dispatch.moe import moe, shared_rides_along
    from dispatch.serve.engine import warmup_lengths

    cfg = MoEConfig(hidden_size=32, intermediate_size=32, num_experts=E, top_k=K, shared_intermediate_size=shared)
    w = random_weights(cfg, dtype=torch.float16)
    crossover, top = 24, 300

    def classes(T):
        x = torch.randn(T, 32, dtype=torch.float16)
        with compiles.launches(run=False) as seen:
            moe(x, cfg, w, path="decode" if T <= crossover else "triton")
        return set(seen)

    per = {T: classes(T) for T in range(1, top + 1)}
    routed = tuple(sorted({K + n for n in (0, shared_rides_along(cfg))}))
    warm = set().union(*(per[T] for T in warmup_lengths(top, routed, (crossover,))))
    assert {T: len(per[T] - warm) for T in per if per[T] - warm} == {}
    pow2 = set().union(*(per[1 << i] for i in range(top.bit_length() - 1)))
    assert any(per[T] - pow2 for T in per)
