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
import pathlib
import time

import pytest
import torch

import dispatch  # noqa: F401  (first: without CUDA it turns on Triton's interpreter)

ROOT = pathlib.Path(__file__).parent.parent
CHAPTERS = ["01_routing_and_sorting", "02_grouped_gemm", "03_decode", "06_end_to_end",
            "07_quantized_experts", "08_serving"]
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


def _run(name: str, dev: torch.device) -> tuple[str, float]:
    ns = {"dev": dev, "__name__": "__teaching__"}
    out = io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(out):
        for c in teaching(name):
            exec(compile(c["src"], f"{name}.ipynb cell {c['i']}", "exec"), ns)
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


@pytest.mark.gpu
@pytest.mark.parametrize("name", CHAPTERS)
def test_teaching_kernels_pass_their_checks_on_gpu(name):
    text, _ = _run(name, torch.device("cuda"))
    lines = _verdicts(text)
    assert lines and all(ln.endswith("bitwise equal, yes") or ": ok (" in ln for ln in lines), text
