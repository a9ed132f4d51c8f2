"""runtime: device and dtype choices, Triton's mode, and device properties read once per device."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import triton
import triton.language as tl

from dispatch import runtime


def test_device_and_dtype_choices_on_cpu():
    assert runtime.device("cpu") == torch.device("cpu")
    assert runtime.compute_dtype("cpu") == torch.float32 and runtime.capability("cpu") is None
    assert runtime.dtype("bf16") == torch.bfloat16 and runtime.dtype("float16") == torch.float16
    assert runtime.dtype("auto", "cpu") == torch.float32
    assert runtime.pick("auto", cpu="tiny", gpu="big", dev="cpu") == "tiny"
    assert runtime.pick("mine", cpu="tiny", gpu="big", dev="cpu") == "mine"
    with pytest.raises(ValueError, match="dtype must be"):
        runtime.dtype("int8")
    with pytest.raises(ValueError, match="device must be"):
        runtime.device("meta")
    if not runtime.HAS_CUDA:
        with pytest.raises(ValueError, match="no CUDA GPU"):
            runtime.device("cuda")
        assert runtime.device() == torch.device("cpu")


def test_triton_ok_and_describe():
    assert runtime.triton_ok(torch.zeros(1)) == runtime.INTERPRET
    info = runtime.describe()
    assert info["torch"] == torch.__version__ and info["interpret"] == runtime.INTERPRET


def test_cpu_properties():
    assert runtime.num_sms("cpu") == runtime.INTERPRETER_SMS
    assert runtime.max_shared_bytes("cpu") == runtime.DEFAULT_SHARED_BYTES == 64 * 1024


def test_max_shared_bytes_honours_the_environment(monkeypatch):
    monkeypatch.setenv("DISPATCH_MAX_SHARED_BYTES", "65536")
    assert runtime.max_shared_bytes("cpu") == 65536
    monkeypatch.setenv("DISPATCH_MAX_SHARED_BYTES", "100000")
    assert runtime.max_shared_bytes("cuda:0") == 100000  # no device query at all
    for bad in ("64KiB", "0", "-5"):
        monkeypatch.setenv("DISPATCH_MAX_SHARED_BYTES", bad)
        with pytest.raises(ValueError, match="DISPATCH_MAX_SHARED_BYTES must be a positive int"):
            runtime.max_shared_bytes("cpu")


def test_device_properties_are_read_once(monkeypatch):
    """A (pretend) CUDA device: its properties are queried once, however often they are asked for."""
    calls = []

    def props(index):
        calls.append(index)
        return SimpleNamespace(multi_processor_count=7)

    monkeypatch.setattr(torch.cuda, "get_device_properties", props)
    monkeypatch.delenv("DISPATCH_MAX_SHARED_BYTES", raising=False)
    runtime._properties.cache_clear()
    try:
        for _ in range(3):
            assert runtime.num_sms("cuda:5") == 7
            assert runtime.max_shared_bytes(torch.device("cuda:5")) > 0
        assert calls == [5]
    finally:
        runtime._properties.cache_clear()


@pytest.mark.gpu
def test_gpu_properties():
    dev = torch.device("cuda")
    assert runtime.num_sms(dev) == torch.cuda.get_device_properties(dev).multi_processor_count
    assert runtime.max_shared_bytes(dev) >= 48 * 1024


def test_old_triton_interpreter_reads_scalar_loop_bounds(monkeypatch):
    """Triton <= 3.6's interpreter reads a runtime loop bound with int(one-element array), which
    recent NumPy refuses; the shim squeezes first. Simulated here on a stand-in interpreter."""
    import types

    import numpy as np
    import triton
    from triton.runtime import interpreter

    class Scope:
        def set_attr(self, obj, name, value):
            setattr(obj, name, value)

    def old_patch(tensor, scope):  # what Triton 3.6 installs
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data))

    monkeypatch.setattr(triton, "__version__", "3.6.0")
    monkeypatch.setattr(interpreter, "_patch_lang_tensor", old_patch)
    runtime._interpreter_scalar_loops()
    Tensor = type("Tensor", (), {})
    interpreter._patch_lang_tensor(Tensor, Scope())
    bound = Tensor()
    bound.handle = types.SimpleNamespace(data=np.array([5], dtype=np.int32))
    assert list(range(0, bound, 2)) == [0, 2, 4]
    runtime._interpreter_scalar_loops()  # a second call does not wrap twice
    assert interpreter._patch_lang_tensor.squeezes_scalars


@triton.jit
def _twice(x):
    return x * 2


@triton.jit
def _times_two_to_the(x_ptr, out_ptr, n, CALLS: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    for _ in tl.static_range(CALLS):
        x = _twice(x)  # a device function call
    tl.store(out_ptr + offs, x, mask=offs < n)


@pytest.mark.skipif(not runtime.INTERPRET, reason="the interpreter's patches (CPU)")
def test_interpreter_patches_the_language_once_per_launch(monkeypatch):
    """A kernel calling a device function three times computes what it did (x·8 past a masked tail),
    patches Triton's language once per launch instead of once per call, and leaves it unpatched."""
    from triton.runtime import interpreter

    assert getattr(interpreter._patch_lang, "once", False), "runtime installs the once-per-launch patch"

    patches = []
    patch_builtin = interpreter._patch_builtin
    monkeypatch.setattr(interpreter, "_patch_builtin", lambda *a: patches.append(1) or patch_builtin(*a))
    arange = tl.arange
    x = torch.arange(20, dtype=torch.float32)
    counts = []
    for calls in (0, 3):
        out = torch.zeros_like(x)
        patches.clear()
        _times_two_to_the[(3,)](x, out, 20, CALLS=calls, BLOCK=8)
        assert torch.equal(out, x * 2 ** calls)
        counts.append(len(patches))
    assert counts[0] == counts[1] > 0, counts  # the three device calls added no patch of their own
    assert tl.arange is arange, "the launch restored the language"
