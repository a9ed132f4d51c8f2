"""A teaching kernel first, the shipped one second.

Every chapter that builds a kernel shows, before the package's kernel (its first ``show_source(``
cell, and the next one after each further teaching kernel), a short kernel written for the book
that does the chapter's one new thing, and checks it against PyTorch with a printed verdict.
Those cells carry the tag ``teaching``: a cell holding an ``@triton.jit`` kernel of at most
``MAX_KERNEL_LINES`` lines, then the cell that runs and checks it. The cells are self-contained:
given only ``dev`` (the chapter's device), they run here in a fresh namespace, under Triton's
interpreter on a CPU and compiled on a GPU.
"""
import ast
import contextlib
import io
import json
import linecache
import pathlib
import time

import pytest
import torch

import dispatch  # noqa: F401  (first: without CUDA it turns on Triton's interpreter)

ROOT = pathlib.Path(__file__).parent.parent
CHAPTERS = ["01_routing_and_sorting", "02_grouped_gemm", "03_decode", "04_expert_parallel",
            "06_end_to_end", "07_quantized_experts", "08_serving"]
MAX_KERNEL_LINES = 30
CPU_SECONDS = 30  # all of a chapter's teaching cells on the interpreter (a few seconds here)


def _cells(name: str) -> list[dict]:
    cells = json.loads((ROOT / "notebooks" / f"{name}.ipynb").read_text())["cells"]
    return [{"i": i, "type": c["cell_type"], "src": "".join(c["source"]),
             "tags": c.get("metadata", {}).get("tags", [])} for i, c in enumerate(cells)]


def teaching(name: str) -> list[dict]:
    return [c for c in _cells(name) if c["type"] == "code" and "teaching" in c["tags"]]


def jit_kernels(src: str) -> dict[str, int]:
    """Name → lines (decorator to last line) of each ``@triton.jit`` function in ``src``."""
    out = {}
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.FunctionDef):
            decs = [d for d in node.decorator_list if ast.unparse(d) in ("triton.jit", "jit")]
            if decs:
                out[node.name] = node.end_lineno - decs[0].lineno + 1
    return out


@pytest.mark.parametrize("name", CHAPTERS)
def test_a_short_teaching_kernel_comes_before_the_shipped_one(name):
    cells = _cells(name)
    shown = [c["i"] for c in cells if c["type"] == "code" and "show_source(" in c["src"]]
    assert shown, f"{name}: no cell shows the shipped kernel"
    mine = teaching(name)
    kernels = {k: n for c in mine for k, n in jit_kernels(c["src"]).items()}
    assert kernels, f"{name}: no code cell tagged 'teaching' holds an @triton.jit kernel"
    assert all(n <= MAX_KERNEL_LINES for n in kernels.values()), f"{name}: {kernels}"
    # a teaching kernel before the first listing, and after each teaching kernel a listing
    # of the shipped one before the next teaching kernel
    at = [c["i"] for c in mine if jit_kernels(c["src"])]
    assert at[0] < shown[0], f"{name}: the first show_source comes before any teaching kernel"
    for a, b in zip(at, at[1:] + [len(cells)], strict=True):
        assert any(a < s < b for s in shown), f"{name}: cell {a}'s teaching kernel has no listing after it"
    checks = [c for c in mine if not jit_kernels(c["src"])]
    assert checks and all(("verdict(" in c["src"] or "bitwise(" in c["src"]) for c in checks), \
        f"{name}: every teaching cell without a kernel checks one with a printed verdict"


def exec_cell(src: str, filename: str, ns: dict) -> None:
    """Run a cell's source in ``ns``, its lines registered as Jupyter does: a compiled (not
    interpreted) ``@triton.jit`` reads its function's source."""
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    exec(compile(src, filename, "exec"), ns)


def _run(name: str, dev: torch.device) -> tuple[str, float]:
    ns = {"dev": dev, "__name__": "__teaching__"}
    out = io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(out):
        for c in teaching(name):
            exec_cell(c["src"], f"<{name}.ipynb cell {c['i']}>", ns)
    return out.getvalue(), time.perf_counter() - t0


def _verdicts(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ": ok (rel err <" in ln or ": bitwise equal, " in ln
            or "FAILED" in ln]


@pytest.mark.parametrize("name", CHAPTERS)
def test_teaching_kernels_pass_their_checks_on_cpu(name):
    text, seconds = _run(name, torch.device("cpu"))
    lines = _verdicts(text)
    assert lines and all(ln.endswith("bitwise equal, yes") or ": ok (" in ln for ln in lines), text
    assert seconds < CPU_SECONDS, f"{name}: teaching cells took {seconds:.1f} s on the interpreter"


def test_an_interpreted_kernel_leaves_its_notebook_globals_alone():
    """A kernel defined in a notebook has ``__main__``'s globals, which hold no ``__file__``. The
    interpreter must not lend it its own (``runtime._interpreter_keeps_kernel_globals``): chapter 4's
    CPU ranks, spawned after its teaching kernel ran, re-import ``__main__`` from ``__file__``."""
    from dispatch import runtime

    if not runtime.INTERPRET:
        pytest.skip("compiled kernels are not rewritten")
    ns = {"dev": torch.device("cpu"), "__name__": "__main__"}
    for c in teaching("04_expert_parallel"):
        exec_cell(c["src"], f"<04_expert_parallel.ipynb cell {c['i']}>", ns)
    assert "__file__" not in ns and "__spec__" not in ns


@pytest.mark.gpu
@pytest.mark.parametrize("name", CHAPTERS)
def test_teaching_kernels_pass_their_checks_on_gpu(name):
    text, _ = _run(name, torch.device("cuda"))
    lines = _verdicts(text)
    assert lines and all(ln.endswith("bitwise equal, yes") or ": ok (" in ln for ln in lines), text


# Pointer types and constexprs of each teaching kernel as its check cell launches it on a GPU
# (fp16 operands there), for compiling it offline.
GPU_LAUNCH = {
    "topk_softmax_kernel": ({"logits_ptr": "*fp32", "weights_ptr": "*fp32", "ids_ptr": "*i32"},
                            {"K": 2, "BLOCK_E": 8}),
    "block_histogram_kernel": ({"ids_ptr": "*i32", "hist_ptr": "*i32"}, {"BLOCK_N": 8, "BLOCK_E": 8}),
    "grouped_tile_kernel": ({"x_ptr": "*fp16", "w_ptr": "*fp16", "y_ptr": "*fp32", "rows_ptr": "*i32",
                             "expert_ptr": "*i32"}, {"K": 2, "BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_H": 16}),
    "decode_items_kernel": ({"x_ptr": "*fp16", "w_ptr": "*fp16", "y_ptr": "*fp32", "ids_ptr": "*i32",
                             "used_ptr": "*i32"}, {"K": 2, "BLOCK_R": 16, "BLOCK_N": 16, "BLOCK_H": 32}),
    "send_rows_kernel": ({"x_ptr": "*fp32", "pos_ptr": "*i32", "out_ptr": "*fp32"},
                         {"R": 3, "ROWS": 4, "BLOCK_H": 32}),
    "add_rmsnorm_kernel": ({"x_ptr": "*fp16", "res_ptr": "*fp16", "w_ptr": "*fp16", "out_ptr": "*fp16"},
                           {"BLOCK_H": 64}),
    "int8_dot_kernel": ({"x_ptr": "*fp16", "q_ptr": "*i8", "scale_ptr": "*fp32", "y_ptr": "*fp32"},
                        {"BLOCK_T": 16, "BLOCK_N": 16, "BLOCK_H": 32}),
    "paged_decode_kernel": ({"q_ptr": "*fp16", "k_ptr": "*fp16", "v_ptr": "*fp16", "table_ptr": "*i32",
                             "out_ptr": "*fp16"}, {"BS": 4, "D": 16}),
}


def compile_all(targets=(90, 75)) -> list[str]:
    """Compile every teaching kernel for each sm_<target> (run with TRITON_INTERPRET=0 set before
    ``dispatch`` is imported); one line per kernel and target."""
    from dispatch_book import kernel_ir

    out = []
    for name in CHAPTERS:
        for c in teaching(name):
            if not jit_kernels(c["src"]):
                continue  # the check cells launch; only the kernels are compiled
            ns = {}
            exec_cell(c["src"], f"<{name}.ipynb cell {c['i']}>", ns)
            for k in jit_kernels(c["src"]):
                ptrs, const = GPU_LAUNCH[k]
                for t in targets:
                    kernel_ir._compile(ns[k], kernel_ir._signature(ns[k], const, ptrs), const, t, 4, 2)
                    out.append(f"{name} {k} sm_{t}: compiled")
    return out


def test_teaching_kernels_compile_for_gpus_offline():
    """A GPU compiles what the interpreter runs (an sm_90 H100/H200 and an sm_75 T4), checked here
    without one: Triton compiles for any target (``dispatch_book.kernel_ir``)."""
    import os
    import subprocess
    import sys

    run = subprocess.run([sys.executable, __file__], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "TRITON_INTERPRET": "0",
                              "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])},
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.splitlines()
    assert len(lines) == 2 * len(GPU_LAUNCH) and all(ln.endswith("compiled") for ln in lines), run.stdout


if __name__ == "__main__":  # the offline compile, in a process where the interpreter is off
    print("\n".join(compile_all()))
