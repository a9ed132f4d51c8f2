"""Executing chapters with papermill: parameters checked, committed notebooks replaced only whole.

``execute(nb, out, overrides)`` runs ``nb`` into ``out`` (cwd = the notebook's folder) and raises
SystemExit naming the notebook and the failing cell: one that raised, one that ran past the per-cell
timeout (``CELL_TIMEOUT_S`` unless given), or one during which the kernel died. ``run_in_place(nb, overrides, scratch)``
executes into a scratch copy and replaces the committed notebook only when every cell succeeded:
a failing cell or a bad parameter value leaves it untouched.
"""
from __future__ import annotations

import os
import pathlib
import shutil
import time
from unittest import mock

from dispatch import files

CELL_TIMEOUT_S = 1200.0  # a chapter's cell runs in seconds on 2 CPU cores: 20 minutes is a hang


def declared(nb_path: pathlib.Path) -> dict:
    """The parameters a notebook declares in its cell tagged ``parameters`` (name → papermill info)."""
    import papermill

    return dict(papermill.inspect_notebook(str(nb_path)))


def params_for(nb_path: pathlib.Path, overrides: dict, *, strict: bool) -> dict:
    """The overrides this notebook declares. ``strict``: an undeclared name is a ValueError naming
    the declared ones (otherwise it is left out: a book-wide ``-p`` applies where a chapter has it)."""
    known = declared(nb_path)
    unknown = sorted(set(overrides) - set(known))
    if strict and unknown:
        raise ValueError(f"{nb_path.name} has no parameter {', '.join(map(repr, unknown))}; "
                         f"its parameters are: {', '.join(known) or '(none)'}")
    return {k: v for k, v in overrides.items() if k in known}


def execute(nb_path: pathlib.Path, out_path: pathlib.Path, overrides: dict | None = None, *,
            strict: bool = True, root: pathlib.Path | None = None, env: dict | None = None,
            cell_timeout: float | None = CELL_TIMEOUT_S) -> float:
    """Execute one notebook with papermill into ``out_path``; returns seconds. Raises SystemExit
    naming the notebook and the failing cell (the executed copy keeps the traceback). ``env``: extra
    environment of the kernel; ``cell_timeout``: seconds a cell may run (None: no limit)."""
    import papermill
    from nbclient.exceptions import CellTimeoutError, DeadKernelError
    from papermill.exceptions import PapermillExecutionError

    check_notebook(nb_path)
    if cell_timeout is not None and not cell_timeout > 0:
        raise ValueError(f"cell_timeout must be seconds > 0 or None, got {cell_timeout!r}")
    params = params_for(nb_path, overrides or {}, strict=strict)
    t0 = time.time()
    try:
        with mock.patch.dict(os.environ, env or {}):  # the kernel is a child process: it inherits these
            papermill.execute_notebook(str(nb_path), str(out_path), parameters=params, kernel_name="python3",
                                       cwd=str(nb_path.parent), progress_bar=False,
                                       execution_timeout=cell_timeout)
    except PapermillExecutionError as e:
        raise SystemExit(f"\n{_rel(nb_path, root)}: cell {e.exec_count} failed: {e.ename}: {e.evalue}\n"
                         f"(executed copy with the traceback: {out_path})") from None
    except (CellTimeoutError, DeadKernelError) as e:
        what = (f"ran past the per-cell timeout of {cell_timeout:g} s (--cell-timeout)"
                if isinstance(e, CellTimeoutError) else
                "killed the kernel (it died: out of memory, a crash in native code, or an exit)")
        raise SystemExit(f"\n{_rel(nb_path, root)}: {running_cell(out_path)} {what}\n"
                         f"(executed copy up to that cell: {out_path})") from None
    relative_paths(out_path, nb_path, root)
    render_prose(out_path, nb_path, root)
    return time.time() - t0


def check_notebook(nb_path: pathlib.Path) -> None:
    """FileNotFoundError / ValueError unless ``nb_path`` is a notebook file (``.ipynb``)."""
    nb_path = pathlib.Path(nb_path)
    if not nb_path.is_file():
        raise FileNotFoundError(f"no notebook at {nb_path}")
    if nb_path.suffix != ".ipynb":
        raise ValueError(f"{nb_path} is not a notebook (.ipynb)")


def running_cell(out_path: pathlib.Path) -> str:
    """'cell N of M (`first line`)': the last cell the executed copy started, counted in the chapter
    as committed (papermill's injected-parameters cell left out)."""
    import nbformat

    try:
        nb = nbformat.read(out_path, as_version=4)
    except Exception:  # noqa: BLE001 - no copy was written: say so rather than fail while reporting
        return "a cell (no executed copy to tell which)"
    cells = [c for c in nb.cells if "injected-parameters" not in c.metadata.get("tags", [])]
    started = [i for i, c in enumerate(cells) if (c.metadata.get("papermill") or {}).get("start_time")]
    if not started:
        return "a cell (none had started)"
    i = started[-1]
    first = next((ln for ln in cells[i].source.splitlines() if ln.strip()), "")
    return f"cell {i + 1} of {len(cells)} (`{first[:60]}`)"


def render_prose(out_path: pathlib.Path, nb_path: pathlib.Path, root: pathlib.Path | None = None) -> None:
    """Write the run's glued values into its markdown cells (:mod:`dispatch_book.prose`); SystemExit
    naming the values the prose refers to that no cell glued."""
    import nbformat

    from dispatch_book import prose

    nb = nbformat.read(out_path, as_version=4)
    missing = prose.render(nb)
    if missing:
        raise SystemExit(f"\n{_rel(nb_path, root)}: the prose refers to values no cell glued in this run: "
                         f"{', '.join(missing)} (executed copy: {out_path})")
    with files.replacing(out_path) as tmp:
        nbformat.write(nb, tmp)


def run_in_place(nb_path: pathlib.Path, overrides: dict, scratch: pathlib.Path,
                 root: pathlib.Path | None = None, cell_timeout: float | None = CELL_TIMEOUT_S) -> float:
    """Refresh a committed notebook's outputs: execute into ``scratch``, then replace ``nb_path``
    only if the whole run succeeded (an unknown parameter name fails before anything runs)."""
    nb_path = pathlib.Path(nb_path).resolve()
    scratch.mkdir(parents=True, exist_ok=True)
    out = scratch / nb_path.name
    secs = execute(nb_path, out, overrides, strict=True, root=root, cell_timeout=cell_timeout)
    with files.replacing(nb_path) as tmp:
        shutil.copyfile(out, tmp)
    return secs


def _rel(p: pathlib.Path, root: pathlib.Path | None) -> str:
    """``p`` relative to the repository when it is inside it (for messages)."""
    p = pathlib.Path(p).resolve()
    return p.relative_to(root).as_posix() if root is not None and root in p.parents else str(p)


def relative_paths(out_path: pathlib.Path, nb_path: pathlib.Path, root: pathlib.Path | None = None) -> None:
    """papermill records absolute input/output paths: record the notebook's own name for both, so
    an executed copy is the committed notebook byte for byte when its outputs are the same (each
    cell's stream pieces joined: :func:`coalesce_streams`)."""
    import nbformat

    nb = nbformat.read(out_path, as_version=4)
    pm = nb.metadata.get("papermill", {})
    for key in ("input_path", "output_path"):
        if pm.get(key):
            pm[key] = pathlib.Path(nb_path).name
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = coalesce_streams(cell.outputs)
    with files.replacing(out_path) as tmp:
        nbformat.write(nb, tmp)


def coalesce_streams(outputs: list) -> list:
    """A cell's consecutive outputs on the same stream as one: how a print arrives in pieces depends on
    when the kernel flushed (a busy machine splits it more), so the committed outputs, and the page,
    do not."""
    out = []
    for o in outputs:
        if out and o.get("output_type") == "stream" and out[-1].get("output_type") == "stream" \
                and out[-1].get("name") == o.get("name"):
            out[-1]["text"] = "".join(out[-1]["text"]) + "".join(o["text"])
        else:
            out.append(o)
    return out
