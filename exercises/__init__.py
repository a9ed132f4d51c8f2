"""The book's exercises: a stub per exercise (``exercises/chNN_*.py``) that the reader completes,
its solution (``exercises/solutions/chNN_*.py``) and one check per exercise (``_checks.py``).

    python -m exercises                     check every exercise you have completed
    python -m exercises ch02_tile           check one
    python -m exercises --solutions         check the solutions (what CI does; the stubs must fail)

Everything runs on a CPU under Triton's interpreter (``import dispatch`` turns it on there).
"""
from __future__ import annotations

import importlib
import textwrap

import dispatch  # noqa: F401  (before triton: the interpreter on a machine without CUDA)

NAMES = ("ch00_route_v3", "ch00_crossover", "ch01_offsets", "ch01_top1", "ch02_gather_rows", "ch02_tile",
         "ch02_combine", "ch03_gemv", "ch03_experts_touched", "ch03_round_robin", "ch04_send_plan",
         "ch04_home_rows", "ch04_capacity", "ch04_all_to_all", "ch05_aux_loss", "ch05_bias_controller",
         "ch06_kv_cache", "ch06_bucket", "ch06_sampling", "ch07_quantize", "ch07_e4m3_bits",
         "ch08_block_allocator", "ch08_scheduler_step", "ch09_ngram", "ch09_accept", "ch10_handoff_plan",
         "ch10_ttft")


def load(name: str, *, solution: bool = False):
    """The module of exercise ``name``: the reader's file, or with ``solution`` the solution."""
    if name not in NAMES:
        raise ValueError(f"no exercise {name!r}; the exercises are {', '.join(NAMES)}")
    return importlib.import_module(f"exercises.{'solutions.' if solution else ''}{name}")


def check(name: str, *, solution: bool = False, strict: bool = False) -> bool:
    """Run exercise ``name``'s check. Prints ``passed`` or ``not yet`` with the first failure;
    with ``strict`` a failure raises instead (the tests use it)."""
    from exercises import _checks

    who = f"{'solution' if solution else 'exercises'}/{name}.py"
    try:
        getattr(_checks, name)(load(name, solution=solution))
    except (AssertionError, NotImplementedError) as e:
        if strict:
            raise
        first = (str(e).splitlines() or [""])[0]
        print(textwrap.fill(f"{who}: not yet ({type(e).__name__}: {first})", 88, subsequent_indent="    "))
        return False
    print(f"{who}: passed")
    return True
