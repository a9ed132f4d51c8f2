"""One benchmark harness and one results format for the whole book.

``time_ms(fn)``: median / min / max milliseconds of ``fn()`` — ``triton.testing.do_bench`` on CUDA
(L2 flushed between runs, host launch overhead included as a user sees it), wall clock on CPU.
``save(name, rows, ...)`` writes ``results/<gpu-slug>/<name>.json`` with the GPU name, versions,
git commit, date and the command; ``load(name)`` finds the newest recorded file for a chapter.

CLI: ``python -m dispatch_book.bench SUITE [args]`` runs a registered suite (``kernels``, ...).
"""
from __future__ import annotations

import datetime as _dt
import importlib
import json
import pathlib
import re
import statistics
import subprocess
import sys
import time

import torch

from dispatch import runtime

ROOT = pathlib.Path(__file__).resolve().parents[2]
RESULTS = ROOT / "results"

# Suites: name -> module with a ``main(argv)``. A chapter's suite lives next to its code.
SUITES = {
    "kernels": "dispatch_book.bench.kernels",
    "routing": "dispatch_book.bench.routing",
    "decode": "dispatch_book.bench.decode",
    "parallel": "dispatch_book.bench.parallel",
    "ceilings": "dispatch_book.bench.ceilings",
    "quant": "dispatch_book.bench.quant",
}


def time_ms(fn, *, warmup: int = 10, rep: int = 50) -> dict:
    """Median, min and max milliseconds of one call of ``fn`` (on the current device)."""
    if runtime.HAS_CUDA:
        import triton.testing

        # warmup / rep are milliseconds for do_bench; "all" returns every sample.
        ts = sorted(triton.testing.do_bench(fn, warmup=warmup * 2, rep=rep * 2, return_mode="all"))
    else:
        for _ in range(min(warmup, 3)):
            fn()
        ts = []
        for _ in range(max(3, min(rep, 20))):
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e3)
        ts.sort()
    return {"median_ms": statistics.median(ts), "min_ms": ts[0], "max_ms": ts[-1], "samples": len(ts)}


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    """Norm-wise relative error ‖y − ref‖ / ‖ref‖ in fp32: the benchmarks' correctness gate."""
    return ((y.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30)).item()


def gpu_slug(name: str | None = None) -> str:
    name = name or (torch.cuda.get_device_name() if runtime.HAS_CUDA else "cpu")
    return re.sub(r"[^a-z0-9]+", "-", name.lower().replace("nvidia", "")).strip("-") or "cpu"


def git_commit() -> str:
    """HEAD (+dirty), or $DISPATCH_GIT_COMMIT where the tree was copied without .git (GPU machines)."""
    import os

    if os.environ.get("DISPATCH_GIT_COMMIT"):
        return os.environ["DISPATCH_GIT_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "dispatch"], cwd=ROOT, capture_output=True,
                               text=True, timeout=10).stdout.strip()
        return out.stdout.strip() + ("+dirty" if dirty else "") if out.returncode == 0 else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def save(name: str, rows: list[dict], *, command: str | None = None, extra: dict | None = None,
         out_dir: pathlib.Path | None = None) -> pathlib.Path:
    """Write one benchmark's rows with everything needed to trust them later."""
    info = runtime.describe()
    doc = {
        "benchmark": name,
        "gpu": info.get("gpu") or "cpu",
        "gpu_count": info.get("gpu_count", 0),
        "versions": {k: info.get(k) for k in ("python", "torch", "triton", "transformers")},
        "git_commit": git_commit(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": command or " ".join(["python"] + sys.argv),
        **(extra or {}),
        "rows": rows,
    }
    d = (out_dir or RESULTS) / gpu_slug(info.get("gpu"))
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{name}.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


def load(name: str, gpu: str | None = None) -> dict | None:
    """The recorded results file for benchmark ``name`` (newest by date if several GPUs have one)."""
    paths = sorted(RESULTS.glob(f"{gpu_slug(gpu) if gpu else '*'}/{name}.json"))
    docs = [json.loads(p.read_text()) for p in paths]
    return max(docs, key=lambda d: d["date"]) if docs else None


def provenance(doc: dict) -> str:
    """One sentence saying where and when a recorded file was measured."""
    v = doc["versions"]
    return (f"Recorded on {doc.get('gpu_count') or 1}x {doc['gpu']} on {doc['date'][:10]} "
            f"(torch {v['torch']}, triton {v['triton']}, transformers {v['transformers']}, "
            f"commit {doc['git_commit'][:10]}) by `{doc['command']}`.")


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in SUITES:
        raise SystemExit(f"usage: python -m dispatch_book.bench {{{','.join(SUITES)}}} [args]")
    importlib.import_module(SUITES[argv[0]]).main(argv[1:])


if __name__ == "__main__":
    main()
