"""Which Triton kernels compiled, and when: a log kept by Triton's post-compile hook.

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

Under ``TRITON_INTERPRET=1`` nothing compiles and the log stays empty.
"""
from __future__ import annotations

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
        _LOG.append(str(kwargs.get("repr", "?")))
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
