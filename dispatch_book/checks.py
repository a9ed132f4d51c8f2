"""What the chapters print about correctness, sources and ceilings: stable on every machine.

A chapter never prints raw round-off (``rel err 2.3e-07`` differs between CPUs, thread counts and
BLAS builds); it prints a verdict against a stated tolerance, or whether two tensors are bitwise
equal, and stops the notebook when the verdict fails.

    verdict("kernel vs reference", y, ref, rtol=1e-5)   # kernel vs reference: ok (rel err < 1e-05)
    bitwise("two runs", y1, y2)                         # two runs: bitwise equal, yes
    show_source(_up_tile)                               # a kernel's own source, numbered lines
    ceilings()                                          # the measured ceilings of the recording set
    table(rows, ["shape", "T", "ms"])                   # a rendered markdown table
"""
from __future__ import annotations

import inspect

import torch

__all__ = ["rel_err", "verdict", "bitwise", "tolerance", "show_source", "ceilings", "table", "exercises"]


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    """‖got − ref‖ / ‖ref‖ in fp64 (0 when both are zero); used only to decide a verdict."""
    got, ref = got.detach().double().cpu(), ref.detach().double().cpu()
    den = ref.norm().item()
    num = (got - ref).norm().item()
    return num / den if den else num


def glue(name: str, value, display: bool = False) -> None:
    """Carry ``value`` into the page's prose, where the text says ``{glue:text}`name```
    (myst-nb's glue); a no-op where myst-nb is not installed (a notebook run on Colab)."""
    try:
        from myst_nb import glue as myst_glue
    except ImportError:
        return
    myst_glue(name, value, display=display)


def tolerance(dtype: torch.dtype) -> float:
    """The relative tolerance a kernel's result is held to against an fp32-accumulating reference:
    fp32 1e-5; fp16/bf16 1e-2 (inputs and intermediates are rounded to 8–11 significant bits)."""
    return 1e-5 if dtype in (torch.float32, torch.float64) else 1e-2


def verdict(name: str, got: torch.Tensor, ref: torch.Tensor, rtol: float, *, check: bool = True) -> None:
    """Print ``name: ok (rel err < rtol)`` or ``name: FAILED (...)`` and, with ``check``, raise on
    failure. Non-finite values in ``got`` where ``ref`` is finite fail."""
    if got.shape != ref.shape:
        raise ValueError(f"{name}: shapes differ, {tuple(got.shape)} vs {tuple(ref.shape)}")
    finite = bool(torch.isfinite(got).all()) or not bool(torch.isfinite(ref).all())
    err = rel_err(got, ref) if finite else float("inf")
    ok = finite and err < rtol
    print(f"{name}: {'ok' if ok else 'FAILED'} (rel err {'<' if ok else '>='} {rtol:.0e})")
    if check and not ok:
        raise AssertionError(f"{name}: relative error {err:.3g} is not below {rtol:.0e}")


def bitwise(name: str, a: torch.Tensor, b: torch.Tensor, *, expect: bool | None = True) -> None:
    """Print ``name: bitwise equal, yes|no``; raise when ``expect`` is given and not met."""
    same = a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)
    print(f"{name}: bitwise equal, {'yes' if same else 'no'}")
    if expect is not None and same != expect:
        raise AssertionError(f"{name}: expected bitwise equal = {expect}")


COLUMN = 88  # characters of code or output the book's column shows without a scroll bar


def fill(text: str, indent: int = 4) -> str:
    """``text`` wrapped to the book's column, continuation lines indented by ``indent``."""
    import textwrap

    return "\n".join(textwrap.fill(line, COLUMN, subsequent_indent=" " * indent, break_on_hyphens=False)
                     if len(line) > COLUMN else line for line in str(text).splitlines())


def _wrap_code(line: str, width: int) -> list[str]:
    """A source line cut at spaces to ``width`` characters; continuations indented 4 past it."""
    out, lead = [], " " * (len(line) - len(line.lstrip()) + 4)
    while len(line) > width:
        cut = line.rfind(" ", len(lead), width)
        if cut <= len(lead):
            break
        out.append(line[:cut])
        line = lead + line[cut + 1:]
    return out + [line]


def show_source(fn, *, start: int | None = None, stop: int | None = None, specialise: dict | None = None) -> None:
    """Print a function's source as the package has it (a ``@triton.jit`` function's ``.fn``), with
    line numbers so the prose can point at them (a line wider than the book's column continues on
    an unnumbered line); ``start``/``stop`` pick a line range (1-based).

    ``specialise`` (switch → value, e.g. ``{"QUANT": False, "TMA": False}``): the source as a chapter
    where those switches are off needs it (:mod:`dispatch_book.specialise`: branches they rule out
    dropped, helpers they reduce inlined), numbered as shown, with one line under it saying what
    went: ``# specialised: QUANT=False, TMA=False; 14 lines dropped, 2 calls inlined``."""
    fn = getattr(fn, "fn", fn)
    listing = None
    if specialise is not None:
        from dispatch_book.specialise import specialise as _specialise

        listing = _specialise(fn, specialise)
        lines = list(listing.lines)
    else:
        lines = inspect.getsource(fn).rstrip("\n").splitlines()
    first = start or 1
    lines = lines[first - 1:stop]
    path = inspect.getsourcefile(fn) or "?"
    mod = path[path.rfind("dispatch"):].replace("\\", "/") if "dispatch" in path else path
    print(f"# {mod}: {fn.__name__}")
    for i, line in enumerate(lines, first):
        for j, part in enumerate(_wrap_code(line, COLUMN - 5)):
            print(f"{i:3d}  {part}" if j == 0 else f"     {part}")
    if listing is not None:
        print(fill(f"# {listing.summary()}"))


def ceilings(gpu: str | None = None) -> dict:
    """The ceilings a "% of peak" divides by: ``hbm_copy_gbps``, ``hbm_read_gbps``, ``bf16_tflops`` and
    ``source``, of ``gpu`` (a name or slug), or, when None, of the GPU whose recordings the chapters
    read (:func:`dispatch_book.bench.sets.current`). The one place the chapters get ceilings from."""
    from dispatch_book import bench
    from dispatch_book.bench import sets

    if gpu is None:
        gpu = sets.current()
        if gpu is None:
            raise FileNotFoundError("no complete set of recordings under results/: record one on a GPU with "
                                    "`python -m dispatch_book.bench all --out results`")
    return dict(bench.ceilings(gpu))


def _cell(v, fmt):
    if v is None or (isinstance(v, float) and v != v):
        return "–"
    return format(v, fmt) if fmt else str(v)


class Table:
    """A table that renders as HTML in the book and in Jupyter, as markdown where that is preferred,
    and as the same markdown text in plain-text outputs (what nbval compares is stable text)."""

    def __init__(self, head: list[str], body: list[list[str]], numeric: list[bool]):
        self.head, self.body, self.numeric = head, body, numeric

    def _repr_markdown_(self) -> str:
        out = ["| " + " | ".join(self.head) + " |",
               "|" + "|".join("---:" if n else "---" for n in self.numeric) + "|"]
        return "\n".join(out + ["| " + " | ".join(r) + " |" for r in self.body])

    def _repr_html_(self) -> str:
        import html

        def row(cells, tag):
            return "<tr>" + "".join(
                f'<{tag} style="text-align:{"right" if n else "left"}">{html.escape(c)}</{tag}>'
                for c, n in zip(cells, self.numeric, strict=True)) + "</tr>"

        return ('<table class="table">\n<thead>' + row(self.head, "th") + "</thead>\n<tbody>\n"
                + "\n".join(row(r, "td") for r in self.body) + "\n</tbody>\n</table>")

    def __repr__(self) -> str:
        return self._repr_markdown_()


def table(rows: list[dict], columns: list[str], formats: dict | None = None,
          headers: dict | None = None) -> Table:
    """A table of ``rows``' ``columns``, rendered in the book; ``formats`` maps a column to a format
    spec (``".2f"``: also right-aligns it), ``headers`` a column to its heading."""
    formats, headers = formats or {}, headers or {}
    return Table([headers.get(c, c) for c in columns],
                 [[_cell(r.get(c), formats.get(c)) for c in columns] for r in rows],
                 [bool(formats.get(c)) for c in columns])


def exercises(*names: str) -> None:
    """Check the reader's exercises ``names`` (files under the repository's ``exercises/``): prints
    ``passed`` or ``not yet`` and the first failure for each. Needs a clone of the repository.

    The checks run in a fresh CPU process under Triton's interpreter, as the exercises are written
    for it, also when this notebook runs on a GPU (where the interpreter is off in this process).
    """
    import os
    import pathlib
    import subprocess
    import sys

    here = [pathlib.Path(__file__).resolve().parent.parent, *pathlib.Path.cwd().resolve().parents]
    root = next((p for p in here if (p / "exercises" / "_checks.py").exists()), None)
    if root is None:
        print("the exercises live in the repository's exercises/ folder: clone it to run them")
        return
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([str(root), *filter(None, [os.environ.get("PYTHONPATH")])])}
    out = subprocess.run([sys.executable, "-m", "exercises", *names], cwd=root, env=env,
                         capture_output=True, text=True)
    print(out.stdout, end="")
    if out.returncode not in (0, 1):  # 1: some exercise is not done yet, which is no error
        raise RuntimeError(f"python -m exercises failed:\n{out.stderr[-2000:]}")


def time_graph_ms(fn) -> float:
    """Median milliseconds of one replay of ``fn`` captured in a CUDA graph (launch overhead gone):
    the harness's ``time_ms(fn, graph=True)`` (captured by :mod:`dispatch.timing`). NaN, with a printed
    note, where ``fn`` cannot be captured (it waits for the host somewhere), so that a live cell never
    stops a chapter."""
    import torch

    from dispatch_book import bench

    try:
        return bench.time_ms(fn, graph=True)["median_ms"]
    except RuntimeError as e:
        print(f"(no CUDA graph for {getattr(fn, '__name__', 'this call')}: {str(e).splitlines()[0]})")
        torch.cuda.synchronize()
        return float("nan")


def print_code(text: str) -> None:
    """Print source text (a slice of a function) with lines wider than the book's column continued
    on indented lines."""
    for line in text.rstrip("\n").splitlines():
        print("\n".join(_wrap_code(line, COLUMN)))
