"""Every chapter on a GPU with its ``"auto"`` parameters, timed and measured: ``build --gpu``.

Each chapter is executed under papermill into ``_build/gpu/<budget>/`` (never the committed
notebooks) with two cells injected: a first one that resets the peak-memory counter (and, in the
T4 budget, caps the process at 15 GB with ``torch.cuda.set_per_process_memory_fraction``) and a
last one that writes ``torch.cuda.max_memory_allocated()`` read inside the kernel. One row per
chapter goes to ``<out>/<gpu>/book_gpu.json``: chapter, budget, ok, seconds, peak GPU bytes, the
parameters and the error text. Rows of other chapters or the other budget recorded from the same
commit are kept, so runs of a few chapters at a time add up to one file with both budgets.

The T4 budget (``--t4-budget``): fp16 (``-p dtype float16`` where a chapter has ``dtype``), 15 GB
of GPU memory, and tiles fitted to a T4's 64 KiB of shared memory (``DISPATCH_MAX_SHARED_BYTES``).
"""
from __future__ import annotations

import json
import pathlib
import time

from dispatch import files

T4_MEMORY_BYTES = 15e9
T4_SHARED_BYTES = 65536
CELL_TIMEOUT_S = 600  # a hung cell is recorded as a failure, and the run goes on


def _first_cell(budget: str) -> str:
    cap = ("    total = torch.cuda.get_device_properties(0).total_memory\n"
           f"    torch.cuda.set_per_process_memory_fraction(min(1.0, {T4_MEMORY_BYTES:.0f} / total))\n"
           if budget == "t4" else "")
    return (f"# Injected by `python -m dispatch_book.build --gpu` (budget {budget}).\n"
            "import torch\n"
            "if torch.cuda.is_available():\n"
            f"{cap}"
            "    torch.cuda.reset_peak_memory_stats()")


def _last_cell(stats: pathlib.Path) -> str:
    return ("# Injected by `python -m dispatch_book.build --gpu`: the peak GPU memory of this kernel.\n"
            "import json as _json\n"
            "import torch as _torch\n"
            "_peak = _torch.cuda.max_memory_allocated() if _torch.cuda.is_available() else None\n"
            f"with open({str(stats)!r}, 'w') as _f:\n"
            "    _json.dump({'peak_gpu_bytes': _peak}, _f)")


def prepare(nb_path: pathlib.Path, dest: pathlib.Path, budget: str, stats: pathlib.Path) -> pathlib.Path:
    """A copy of the chapter with the two measuring cells injected."""
    import nbformat

    nb = nbformat.read(nb_path, as_version=4)
    tag = {"tags": ["injected-by-build-gpu"]}
    nb.cells.insert(0, nbformat.v4.new_code_cell(_first_cell(budget), metadata=tag))
    nb.cells.append(nbformat.v4.new_code_cell(_last_cell(stats), metadata=tag))
    with files.replacing(dest) as tmp:
        nbformat.write(nb, tmp)
    return dest


def run_chapter(nb_path: pathlib.Path, work: pathlib.Path, budget: str) -> dict:
    """Execute one chapter in a budget; returns its row (a failure is recorded, not raised)."""
    from dispatch_book import execute

    stats = work / f"{nb_path.stem}.stats.json"
    stats.unlink(missing_ok=True)
    src = prepare(nb_path, work / "in" / nb_path.name, budget, stats)
    params = execute.params_for(nb_path, {"dtype": "float16"} if budget == "t4" else {}, strict=False)
    env = {"DISPATCH_MAX_SHARED_BYTES": str(T4_SHARED_BYTES)} if budget == "t4" else {}
    row = {"chapter": nb_path.stem, "budget": budget, "params": params, "ok": False, "error": None}
    t0 = time.time()
    try:
        execute.execute(src, work / nb_path.name, params, strict=False, env=env, cell_timeout=CELL_TIMEOUT_S)
        row["ok"] = True
    except SystemExit as e:  # a failing cell: execute() names it
        row["error"] = str(e).strip()
    except Exception as e:  # noqa: BLE001 - a kernel that died, a timeout: recorded, and the run goes on
        row["error"] = f"{type(e).__name__}: {e}"
    row["seconds"] = round(time.time() - t0, 1)
    peak = json.loads(stats.read_text())["peak_gpu_bytes"] if stats.exists() else None
    row["peak_gpu_bytes"] = peak
    row["peak_gpu_gib"] = None if peak is None else round(peak / 2**30, 3)
    return row


def run(chapters: list[pathlib.Path], build: pathlib.Path, *, t4_budget: bool = False, out=None,
        require_cuda: bool = True, allow_dirty: bool = False) -> pathlib.Path:
    """Run the chapters in one budget, print a line each, and save ``book_gpu`` (merged with the
    rows of other chapters and budgets recorded from the same commit)."""
    import torch

    from dispatch_book.bench import results

    if require_cuda and not torch.cuda.is_available():
        raise SystemExit("build --gpu executes the chapters on a CUDA GPU; none is visible here")
    commit = results.checked_commit(allow_dirty)  # refuse before the run, not after
    budget = "t4" if t4_budget else "full"
    work = build / "gpu" / budget
    slug = results.gpu_slug()
    old_path = pathlib.Path(out if out is not None else results.SCRATCH) / slug / "book_gpu.json"
    kept = []
    if old_path.exists():
        old = json.loads(old_path.read_text())
        if old.get("git_commit") == commit:
            done = {(nb.stem, budget) for nb in chapters}
            kept = [r for r in old["rows"] if (r.get("chapter"), r.get("budget")) not in done]
    rows, path = [], None
    for nb in chapters:
        row = run_chapter(nb, work, budget)
        rows.append(row)
        mem = "?" if row["peak_gpu_gib"] is None else f"{row['peak_gpu_gib']:.2f} GiB"
        print(f"  [{budget}] {nb.stem}: {'ok' if row['ok'] else 'FAILED'} in {row['seconds']:.0f} s, peak {mem}"
              + (f"\n    {row['error']}" if row["error"] else ""), flush=True)
        # saved after every chapter: a run cut short by its time limit keeps the chapters it finished
        path = results.save("book_gpu", kept + rows, out=out, allow_dirty=allow_dirty,
                            extra={"t4_budget": {"dtype": "float16", "memory_bytes": T4_MEMORY_BYTES,
                                                 "max_shared_bytes": T4_SHARED_BYTES}})
    return path
