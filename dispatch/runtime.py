"""Where code runs: which device, compiled Triton or Triton's interpreter, which dtype.

The one place that decides. Imported by ``dispatch/__init__.py``, hence before any of the
package's kernel modules: Triton reads ``TRITON_INTERPRET`` when ``@triton.jit`` decorates a
kernel (``triton.knobs.runtime.interpret``, Triton 3.x), so on a machine without CUDA we turn the
interpreter on here, before our kernels are defined, and the same kernel source runs on CPU
(slowly, for tests). Importing ``triton`` itself first does no harm. Device properties (SM count,
shared memory) are read once per device and cached.

Dtypes: bf16 on sm_80+; fp16 below sm_80 (a T4 is sm_75: Triton's bf16 fails there although
``torch.cuda.is_bf16_supported()`` says True); fp32 on CPU (the interpreter mis-loads bf16).

Threads: Triton's interpreter keeps one global state per process (the grid of the launch in flight,
``triton.language`` patched for it), so two threads launching at once corrupt each other (wrong
values, errors, crashes). Under the interpreter every launch therefore holds one lock
(:func:`serial_interpreter`, put around ``InterpretedFunction.run`` here, once); so does a launcher
whose scratch memory is shared between its calls (the one-launch decode kernels' counters). Compiled
kernels on a GPU take no lock: concurrent callers are safe on separate streams.
"""
from __future__ import annotations

import functools
import os
import platform
import threading

import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


def _interpreter_scalar_loops() -> None:
    """Triton <= 3.6's interpreter turns a scalar kernel argument (a one-element array) into a loop
    bound with ``int(array)``, which recent NumPy refuses ("only 0-dimensional arrays can be
    converted"): every loop with a runtime bound fails. Triton 3.7+ squeezes the array first; on
    older Triton we add the same squeeze to the interpreter's tensor patch (restored with it)."""
    try:
        import triton
        from triton.runtime import interpreter
    except ImportError:  # no Triton: nothing to run under the interpreter
        return
    original = getattr(interpreter, "_patch_lang_tensor", None)
    major, minor = (int(v) for v in triton.__version__.split(".")[:2])
    if original is None or (major, minor) >= (3, 7) or getattr(original, "squeezes_scalars", False):
        return

    def patch(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    patch.squeezes_scalars = True
    interpreter._patch_lang_tensor = patch


def _interpreter_patches_once() -> None:
    """Triton's interpreter re-patches ``triton.language`` (every builtin, found with
    ``inspect.getmembers``) at *each call of a device function* inside a kernel, although the
    kernel's launch has patched the same modules already and restores them only when it ends: half
    of a decode launch's time on CPU goes there. Inside a launch we skip a device function's patch
    when the modules it sees (``tl``, ``tl.core``) are already patched by that launch; the launch's
    own patch and restore are untouched, so every kernel computes what it computed before (same
    bits), about twice as fast. Left alone if the interpreter's internals are not the ones expected."""
    import inspect
    import threading

    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return
    patch_lang = getattr(interpreter, "_patch_lang", None)
    executor = getattr(interpreter, "GridExecutor", None)
    scope_type = getattr(interpreter, "_LangPatchScope", None)
    if (patch_lang is None or executor is None or scope_type is None or getattr(patch_lang, "once", False)
            or list(inspect.signature(patch_lang).parameters) != ["fn"]):
        return
    launch_call = executor.__call__
    state = threading.local()  # per thread: the modules the running launch has patched (None: none yet)

    def modules(fn) -> frozenset:
        return frozenset(id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core))

    def once(fn):
        patched = getattr(state, "patched", None)
        if patched is not None and modules(fn) <= patched:
            return scope_type()  # nothing to restore: the launch's patch is in place
        scope = patch_lang(fn)
        if getattr(state, "depth", 0):
            state.patched = (patched or frozenset()) | modules(fn)
        return scope

    def call(self, *args, **kwargs):
        outer = getattr(state, "patched", None)
        state.patched, state.depth = None, getattr(state, "depth", 0) + 1
        try:
            return launch_call(self, *args, **kwargs)
        finally:
            state.depth -= 1
            state.patched = outer

    once.once = True
    interpreter._patch_lang = once
    executor.__call__ = call


_INTERPRETER_LOCK = threading.RLock()  # re-entrant: a locked launcher launches locked kernels


def serial_interpreter(fn):
    """``fn`` run holding the interpreter's one lock when kernels are interpreted (else ``fn`` itself):
    for every interpreted launch, and for launchers that share scratch memory between calls."""
    if not INTERPRET:
        return fn

    @functools.wraps(fn)
    def locked(*args, **kwargs):
        with _INTERPRETER_LOCK:
            return fn(*args, **kwargs)
    locked.serial_interpreter = True
    return locked


def _interpreter_one_launch_at_a_time() -> None:
    """Every interpreted launch (``kernel[grid](...)``, under ``triton.heuristics`` too) goes through
    ``InterpretedFunction.run``: it holds the lock from here on."""
    try:
        from triton.runtime import interpreter
    except ImportError:
        return
    run = interpreter.InterpretedFunction.run
    if not getattr(run, "serial_interpreter", False):
        interpreter.InterpretedFunction.run = serial_interpreter(run)


def _interpreter_keeps_kernel_globals() -> None:
    """Triton's interpreter, rewriting a kernel, copies every global of its own module that the
    kernel's globals lack into them, dunders included. For a kernel defined in a notebook those
    globals are ``__main__``'s, which has no ``__file__``: it gets the interpreter's, and every later
    ``spawn``/``forkserver`` child (the CPU ranks of chapter 4) then fails re-importing that file as
    its main module. The dunders the copy added are removed after it; the rest (the names the
    rewritten kernel calls) stay. Left alone if the interpreter's internals are not the ones expected."""
    try:
        from triton.runtime import interpreter
    except ImportError:
        return
    rewriter = getattr(interpreter, "FunctionRewriter", None)
    compile_and_exec = getattr(rewriter, "_compile_and_exec", None)
    if compile_and_exec is None or getattr(compile_and_exec, "keeps_globals", False):
        return

    def keeping(self, *args, **kwargs):
        fn_globals = getattr(getattr(self, "fn", None), "__globals__", None)
        before = set(fn_globals) if isinstance(fn_globals, dict) else None
        try:
            return compile_and_exec(self, *args, **kwargs)
        finally:
            if before is not None:
                for key in [k for k in fn_globals if k not in before and k.startswith("__") and k != "__builtins__"]:
                    del fn_globals[key]
    keeping.keeps_globals = True
    rewriter._compile_and_exec = keeping


if INTERPRET:
    _interpreter_scalar_loops()
    _interpreter_patches_once()
    _interpreter_one_launch_at_a_time()
    _interpreter_keeps_kernel_globals()


def device(name: str = "auto") -> torch.device:
    """'auto' → cuda if present else cpu; 'cpu' / 'cuda' / 'cuda:1' as given (checked)."""
    if name == "auto":
        return torch.device("cuda" if HAS_CUDA else "cpu")
    try:
        dev = torch.device(name)
    except (RuntimeError, TypeError):
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda[:i]', got {name!r}")
    if dev.type == "cuda" and not HAS_CUDA:
        raise ValueError(f"device {name!r} asked for, but torch sees no CUDA GPU; use 'cpu' or 'auto'")
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda[:i]', got {name!r}")
    return dev


def capability(dev: torch.device | str | None = None) -> tuple[int, int] | None:
    """CUDA compute capability of ``dev`` (None on CPU)."""
    dev = torch.device(dev) if dev is not None else device()
    if dev.type != "cuda":
        return None
    return torch.cuda.get_device_capability(dev)


def compute_dtype(dev: torch.device | str | None = None) -> torch.dtype:
    """The dtype kernels compute in on ``dev``: bf16 (sm_80+), fp16 (older GPUs), fp32 (CPU)."""
    cap = capability(dev)
    if cap is None:
        return torch.float32
    return torch.bfloat16 if cap >= (8, 0) else torch.float16


def dtype(name: str = "auto", dev: torch.device | str | None = None) -> torch.dtype:
    """'auto' → :func:`compute_dtype`; else 'float32' | 'float16' | 'bfloat16' (checked)."""
    if name == "auto":
        return compute_dtype(dev)
    table = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16,
             "fp16": torch.float16, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
    if name not in table:
        raise ValueError(f"dtype must be 'auto' or one of {sorted(table)}, got {name!r}")
    return table[name]


# The interpreter has no SMs; persistent grids get this many programs there, each looping over tiles.
INTERPRETER_SMS = 4
# Shared memory assumed where it cannot be read (the smallest GPU we target: a T4's 64 KiB).
DEFAULT_SHARED_BYTES = 64 * 1024


def _cuda_index(dev: torch.device) -> int:
    return dev.index if dev.index is not None else torch.cuda.current_device()


@functools.lru_cache(maxsize=None)
def _properties(index: int) -> tuple[int, int | None]:
    """(SM count, max shared memory per program or None) of CUDA device ``index``, read once."""
    sms = torch.cuda.get_device_properties(index).multi_processor_count
    try:
        import triton  # deferred: only a CUDA device needs Triton's driver here

        shared = int(triton.runtime.driver.active.utils.get_device_properties(index)["max_shared_mem"])
    except Exception:  # noqa: BLE001 - an unreadable property must not stop a launch
        shared = None
    return sms, shared


@torch.compiler.assume_constant_result  # a device property: a constant to torch.compile
def num_sms(dev: torch.device | str | None = None) -> int:
    """Streaming multiprocessors of ``dev`` (read once per device); :data:`INTERPRETER_SMS` on CPU."""
    dev = torch.device(dev) if dev is not None else device()
    if dev.type != "cuda":
        return INTERPRETER_SMS
    return _properties(_cuda_index(dev))[0]


@functools.lru_cache(maxsize=None)
def _name(index: int) -> str:
    return torch.cuda.get_device_name(index)


@torch.compiler.assume_constant_result  # a device property: a constant to torch.compile
def device_name(dev: torch.device | str | None = None) -> str:
    """The device's name ("NVIDIA H200", read once per device; "cpu" off CUDA): whose tuned tables apply."""
    dev = torch.device(dev) if dev is not None else device()
    return _name(_cuda_index(dev)) if dev.type == "cuda" else "cpu"


@torch.compiler.assume_constant_result  # a device property: a constant to torch.compile
def max_shared_bytes(dev: torch.device | str | None = None) -> int:
    """Shared memory one Triton program may use on ``dev`` (read once per device: kernels ask on every
    launch). 227 KiB on an H100/H200, 64 KiB on a T4; :data:`DEFAULT_SHARED_BYTES` on CPU or when it
    cannot be read. The environment variable ``DISPATCH_MAX_SHARED_BYTES`` overrides it everywhere
    (e.g. 65536 to pick a T4's tiles on a big GPU)."""
    env = os.environ.get("DISPATCH_MAX_SHARED_BYTES")
    if env is not None:
        try:
            value = int(env)
        except ValueError:
            value = 0
        if value < 1:
            raise ValueError(f"DISPATCH_MAX_SHARED_BYTES must be a positive int (bytes), got {env!r}")
        return value
    dev = torch.device(dev) if dev is not None else device()
    if dev.type != "cuda":
        return DEFAULT_SHARED_BYTES
    shared = _properties(_cuda_index(dev))[1]
    return DEFAULT_SHARED_BYTES if shared is None else shared


def triton_ok(t: torch.Tensor) -> bool:
    """Can a Triton kernel run on this tensor here? (CUDA tensor, or CPU under the interpreter.)"""
    return t.is_cuda or (t.device.type == "cpu" and INTERPRET)


def describe() -> dict:
    """Versions and device, for results files and the top of every chapter."""
    info = {"python": platform.python_version(), "torch": torch.__version__,
            "device": "cpu", "gpu": None, "interpret": INTERPRET}
    try:
        import triton  # deferred, as transformers below: versions of optional packages, if present
        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    try:
        import transformers
        info["transformers"] = transformers.__version__
    except ImportError:
        info["transformers"] = None
    if HAS_CUDA:
        info["device"] = "cuda"
        info["gpu"] = torch.cuda.get_device_name()
        info["capability"] = ".".join(map(str, torch.cuda.get_device_capability()))
        info["gpu_count"] = torch.cuda.device_count()
    return info


def pick(value, *, cpu, gpu, dev: torch.device | str | None = None):
    """Resolve an ``"auto"`` notebook parameter: ``cpu`` on the CPU (the embedded default the book
    is executed with), ``gpu`` on a CUDA device; any other value is returned as given.

        preset = runtime.pick(preset, cpu="tiny", gpu="olmoe-1b-7b", dev=dev)
    """
    if value != "auto":
        return value
    dev = torch.device(dev) if dev is not None else device()
    return gpu if dev.type == "cuda" else cpu


def exit_cause(code: int | None) -> str:
    """How a child process ended, from its exit code: "was killed by signal SIGKILL" or "exited with code 1"."""
    import signal

    if code is not None and code < 0:
        try:
            return f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"
