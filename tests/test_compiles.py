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
