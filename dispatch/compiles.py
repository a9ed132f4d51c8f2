"""Which Triton kernels compiled, and when: a log kept by Triton's post-compile hook; and which class
of compile a launch falls in, computed from its arguments alone (:func:`launches`).

A Triton kernel compiles again for each new *specialisation* of its arguments — an integer argument
equal to 1, a multiple of 16, or neither; a new constexpr; another dtype — and a compile takes
seconds on a GPU. A server that compiles while it serves stalls every request in flight, so its
warm-up runs each kind of step first; this log tells which kernels compiled after a point, and for
which arguments, when a step was slow anyway::

    from dispatch import compiles
    compiles.watch()                 # once; a no-op where Triton has no such hook
    mark = compiles.count()
    ...                              # steps
    for line in compiles.since(mark): print(line)   # "name[num_warps=..](x_ptr: *bf16, N: i32, ...)"

Under ``TRITON_INTERPRET=1`` nothing compiles and the log stays empty; :func:`launches` works there
too, so a CPU test can check that a warm-up launches every class a server's steps will::

    with compiles.launches(run=False) as seen:   # record, do not run
        moe(x_TH, cfg, w, path="triton")
    # seen: [("_scatter_kernel", ("ids_ptr", "*torch.int32:16"), ..., ("N", "i32"), ..., ("K", 8), ...)]
"""
from __future__ import annotations

import inspect
from contextlib import contextmanager

_LOG: list[str] = []  # each compile's kernel with its specialised arguments, in order
_WATCHING = False


def watch() -> bool:
    """Start logging compiles (idempotent; another hook already set is kept and called after ours).
    False where this Triton has no post-compile hook (or no Triton)."""
    global _WATCHING
    if _WATCHING:
        return True
    try:
        from triton import knobs
    except ImportError:
        return False
    runtime = getattr(knobs, "runtime", None)
    if runtime is None or not hasattr(runtime, "jit_post_compile_hook"):
        return False
    before = runtime.jit_post_compile_hook

    def hook(*args, **kwargs):  # Triton passes ``repr``: the kernel with its specialised arguments
        _LOG.append(" ".join(str(kwargs.get("repr", "?")).split()))  # one line, however Triton wraps it
        return before(*args, **kwargs) if before else None

    runtime.jit_post_compile_hook = hook
    _WATCHING = True
    return True


def count() -> int:
    """How many compiles are logged: a mark for :func:`since`."""
    return len(_LOG)


def since(mark: int) -> list[str]:
    """The kernels compiled after ``mark`` (:func:`count`), each with its specialised arguments."""
    return _LOG[mark:]


def int_kind(value: int, specialise: bool = True) -> str:
    """The kind of integer argument Triton compiles a kernel for: "1", a multiple of 16 ("i32:16"), or
    neither ("i32"; "i64" past int32), by width alone where the kernel says ``do_not_specialize``."""
    width = "i32" if -2**31 <= value < 2**31 else "i64"
    if not specialise:
        return width
    return "1" if value == 1 else f"{width}:16" if value % 16 == 0 else width


def _kind(value, specialise: bool):
    """The part of a launch argument a compile depends on (Triton's rules, a superset where unsure)."""
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return int_kind(value, specialise)
    if isinstance(value, float):
        return "fp32"
    if isinstance(value, (tuple, list)):
        return tuple(_kind(v, specialise) for v in value)
    if hasattr(value, "data_ptr") and hasattr(value, "dtype"):  # a tensor: its dtype and 16-byte alignment
        return f"*{value.dtype}" + (":16" if value.data_ptr() % 16 == 0 else "")
    return type(value).__name__ if value is not None else None


def launch_class(kernel, args: tuple, kwargs: dict) -> tuple:
    """What a launch of ``kernel`` (a ``triton.jit`` function, compiled or interpreted) compiles for:
    its name, each constexpr's value, the kind of every other argument (an int: 1, a multiple of 16
    or other, unless the kernel says ``do_not_specialize`` for it; a tensor: dtype and alignment) and
    the launch options (``num_warps``...). Two launches of one class share one compile."""
    params = list(inspect.signature(kernel.fn).parameters.values())
    dns = getattr(kernel, "do_not_specialize", None) or getattr(kernel, "kwargs", {}).get("do_not_specialize") or ()
    names = [p.name for p in params]
    bound = dict(zip(names, args, strict=False))  # fewer args: defaults
    bound.update((k, v) for k, v in kwargs.items() if k in names)
    key = [kernel.fn.__name__]
    for i, p in enumerate(params):
        if p.name not in bound:
            continue  # a default
        v = bound[p.name]
        if "constexpr" in str(p.annotation):
            key.append((p.name, v))
        else:
            key.append((p.name, _kind(v, i not in dns and p.name not in dns)))
    options = tuple(sorted((k, v) for k, v in kwargs.items() if k not in bound))
    return (*key, options)


@contextmanager
def launches(run: bool = True):
    """Record :func:`launch_class` of every Triton launch inside the block into the list it yields;
    ``run=False`` skips the kernels themselves (a launcher's host logic alone: which kernels, with
    which classes of arguments, a step of T tokens launches — in microseconds, on any machine). It
    patches Triton's launch for the whole process while the block runs: not for a serving process."""
    import triton.runtime.jit as jit

    kinds = [jit.JITFunction]
    try:
        from triton.runtime.interpreter import InterpretedFunction
        kinds.append(InterpretedFunction)
    except ImportError:  # pragma: no cover - every Triton this package supports has the interpreter
        pass
    seen: list[tuple] = []
    before = {k: k.run for k in kinds}

    def wrap(original):
        def patched(self, *args, grid, warmup, **kwargs):
            if not warmup:
                seen.append(launch_class(self, args, kwargs))
            return original(self, *args, grid=grid, warmup=warmup, **kwargs) if run or warmup else None
        return patched

    for k in kinds:
        k.run = wrap(before[k])
    try:
        yield seen
    finally:
        for k in kinds:
            k.run = before[k]
