"""Recording sets: the book stands on the recordings of one GPU at a time.

A *set* is the folder ``results/<gpu>/``; it is *complete* when it holds every suite of :data:`SET`
(the recordings the chapters read). A chapter reads one set (:func:`current`):

1. the set named by ``$DISPATCH_RESULTS_GPU`` (a slug such as ``h200``), when set — how the book is
   told to read another GPU's recordings;
2. else, on a CUDA GPU, that GPU's own set when it is complete;
3. else the newest complete set (:func:`default`): the one whose newest recording is the latest.

What each suite measured (:data:`MEASURES`) lets :mod:`dispatch_book.bench.evidence` tell a recording
whose code has changed since it was made.
"""
from __future__ import annotations

import json
import os
import pathlib

from dispatch_book.bench import results

ENV = "DISPATCH_RESULTS_GPU"

# Kernels that no suite of a one-GPU set runs: the serving engine's paged attention (chapter 8), the
# disaggregated handoff's block copy (chapter 10), expert parallelism's peer copies (chapter 4) and the
# speculative step's lookup and rollback (chapter 9). A change there leaves the set current (git pathspecs:
# evidence.changed runs `git diff -- <paths>`); the suites that do run them (serve, speculative, disagg_ipc,
# expert_parallel) name them. tests/test_bench_sets.py checks that no code a set's suite measures imports
# them, or the serving and parallel packages that do.
NOT_IN_SET = tuple(f":(exclude)dispatch/kernels/{m}.py" for m in ("paged_attention", "block_copy", "p2p", "spec_step"))
# The suites of a one-GPU set, in the order `python -m dispatch_book.bench all` records them, and the
# code each one measures: a change there after the recording makes it stale. `notebooks/` counts only
# code cells (`evidence.changed`): re-executing a chapter does not make book_gpu stale.
_KERNELS = ("dispatch/kernels", "dispatch/tables", *NOT_IN_SET)
_ROUTING = ("dispatch/tune/routing_dist.py", "dispatch/assets/traces")  # the races' routing draws, the trace replayed
_RACE = (*_KERNELS, *_ROUTING, "dispatch/moe.py",  # moe(): the race's whole-layer contestant
         "dispatch_book/bench/kernels.py", "dispatch_book/bench/peers.py", "dispatch_book/bench/peer_search.py",
         "dispatch_book/bench/data", "dispatch_book/bench/torch_grouped.py")
MEASURES = {
    "ceilings": ("dispatch_book/bench/peaks.py", "dispatch_book/bench/reads.py"),
    "reads": ("dispatch_book/bench/reads.py",),
    "routing_sort": ("dispatch/kernels/routing.py", "dispatch/kernels/sort.py", "dispatch_book/bench/routing.py"),
    "decode": (*_KERNELS, *_ROUTING, "dispatch_book/bench/decode.py"),
    "decode_chain": (*_KERNELS, "dispatch_book/bench/chain.py"),
    "kernels": _RACE,
    "kernels_sweep": (*_KERNELS, "dispatch_book/bench/kernels_sweep.py"),
    "step_kernels": ("dispatch/kernels", *NOT_IN_SET, "dispatch/engine", "dispatch_book/bench/step_kernels.py"),
    "e2e": (*_KERNELS, "dispatch/engine", "dispatch/quant", "dispatch_book/bench/e2e.py"),
    "e2e_profile": ("dispatch/kernels", *NOT_IN_SET, "dispatch/engine", "dispatch_book/bench/e2e.py"),
    "quant": (*_KERNELS, *_ROUTING, "dispatch/quant", "dispatch_book/bench/quant.py"),
}
SET = tuple(MEASURES)
# Suites a chapter reads from the set when the set has them, and measures live (or says so) when not:
# the newest suites, not yet recorded on every GPU. They do not decide whether a set is complete.
_SPECULATIVE = ("dispatch/serve/speculative.py", "dispatch/serve/drafters.py", "dispatch/serve/acceptance.py",
                "dispatch/serve/spec_cost.py")  # chapter 9's step, on chapter 6's engine
_DISAGG = ("dispatch/serve/disagg*.py", "dispatch/serve/handoff*.py")  # chapter 10's two engines
OPTIONAL = {
    # the serving engine runs neither a speculative step (chapter 9) nor a handoff (chapter 10)
    "serve": ("dispatch/serve", *(f":(exclude){p}" for p in _SPECULATIVE + _DISAGG), "dispatch/engine",
              "dispatch/kernels", ":(exclude)dispatch/kernels/spec_step.py", "dispatch_book/bench/serve.py",
              "dispatch_book/bench/serve_load.py", "dispatch_book/bench/serve_online.py",
              "dispatch_book/bench/serve_peers.py"),
    # the speculative engine is chapter 6's Engine with a drafter: no paged cache, no scheduler, no server
    "speculative": (*_SPECULATIVE, "dispatch/engine", "dispatch/kernels",
                    ":(exclude)dispatch/kernels/paged_attention.py", ":(exclude)dispatch/kernels/block_copy.py",
                    "dispatch_book/bench/speculative.py", "dispatch_book/bench/spec_record.py"),
}
# Recordings a chapter may read that are not part of a set: it names their GPU (`load(name, gpu=...)`);
# book_gpu (every chapter on the GPU, both budgets) is recorded with a set, but no chapter needs it.
EXTRA_MEASURES = {
    "book_gpu": ("dispatch", "notebooks", "dispatch_book/gpu_book.py"),
    "decode_split": (*_KERNELS, "dispatch_book/bench/split.py"),
    "quant_fp8_convert": ("dispatch/kernels", "dispatch/quant", "dispatch_book/bench/quant.py"),
    "balance_study": ("dispatch/train.py", "dispatch/balance.py", "dispatch_book/bench/balance_study.py"),
    "expert_parallel": ("dispatch/parallel", "dispatch/kernels", "dispatch_book/bench/parallel.py"),
    # the races under routing other than uniform (dispatch_book.bench.skew): the same code as their suites'
    "kernels_skewed": _RACE,
    "decode_skewed": (*_KERNELS, *_ROUTING, "dispatch_book/bench/decode.py"),
    "quant_skewed": (*_KERNELS, *_ROUTING, "dispatch/quant", "dispatch_book/bench/quant.py"),
    "disagg_ipc": ("dispatch/kernels/block_copy.py", "dispatch/serve/blocks.py", "dispatch/serve/handoff.py",
                   "dispatch/serve/handoff_ipc.py", "dispatch/serve/disagg.py",
                   "dispatch/serve/disagg_worker.py", "dispatch/serve/disagg_config.py",
                   "dispatch_book/bench/disagg_ipc.py"),
    # chapter 6's engine with a drafter on a CPU: the serving engine, its scheduler and server play no part
    "speculative_traces": ("dispatch/train.py", "dispatch/assets", *_SPECULATIVE, "dispatch/engine", "dispatch/kernels",
                           "dispatch_book/spec_study.py", "dispatch_book/bench/spec_traces.py"),
}


def measured_paths(name: str) -> tuple[str, ...]:
    """The repository paths whose change makes recording ``name`` stale (the suite's own module at least)."""
    if name in MEASURES:
        return MEASURES[name]
    if name in OPTIONAL:
        return OPTIONAL[name]
    if name in EXTRA_MEASURES:
        return EXTRA_MEASURES[name]
    raise ValueError(f"unknown recording {name!r}: add it to dispatch_book.bench.sets.MEASURES (a suite of the "
                     f"set) or EXTRA_MEASURES, with the code it measures")


def _root(root=None):
    return pathlib.Path(root) if root is not None else results.recorded()


def slugs(root=None) -> list[str]:
    """The GPU folders of a results root (CPU runs and hidden folders left out)."""
    base = _root(root)
    return sorted(d.name for d in base.iterdir() if d.is_dir() and not d.name.startswith(("cpu", "_", ".")))


def docs(slug: str, root=None) -> dict:
    """name → document of every recording of the set ``slug`` that belongs to it."""
    base = _root(root).joinpath(slug)
    out = {}
    for name in SET:
        f = base.joinpath(f"{name}.json")
        if f.is_file():
            out[name] = json.loads(f.read_text())
    return out


def missing(slug: str, root=None) -> list[str]:
    """The suites of :data:`SET` that ``results/<slug>/`` does not hold."""
    have = docs(slug, root)
    return [name for name in SET if name not in have]


def complete(root=None) -> list[str]:
    """The complete sets, newest first (by the date of each set's newest recording)."""
    full = [(max(d["date"] for d in docs(s, root).values()), s) for s in slugs(root) if not missing(s, root)]
    return [s for _, s in sorted(full, reverse=True)]


def default(root=None) -> str | None:
    """``$DISPATCH_RESULTS_GPU`` when set, else the newest complete set (None when there is none)."""
    named = os.environ.get(ENV, "").strip()
    if named:
        slug = results.gpu_slug(named)
        if slug not in slugs(root):
            raise ValueError(f"{ENV}={named!r}: there is no results/{slug}/ (sets: {', '.join(slugs(root))})")
        return slug
    full = complete(root)
    return full[0] if full else None


def current(root=None) -> str | None:
    """The set a chapter reads here: ``$DISPATCH_RESULTS_GPU``, else this GPU's own set when it is complete,
    else :func:`default`."""
    if os.environ.get(ENV, "").strip():
        return default(root)
    import torch

    if torch.cuda.is_available():
        mine = results.gpu_slug()
        if mine in slugs(root) and not missing(mine, root):
            return mine
    return default(root)


def optional_slug(name: str, root=None) -> str | None:
    """Where a chapter reads the optional suite ``name`` (:data:`OPTIONAL`): the current set when it holds
    it, else the GPU set whose recording of it is the newest (the chapter names that GPU from the
    document), else None (the chapter measures live)."""
    slug = current(root)
    if slug is not None and _root(root).joinpath(slug, f"{name}.json").is_file():
        return slug
    found = recordings(name, root)
    return max(found, key=lambda s: found[s]["date"]) if found else None


def recordings(name: str, root=None) -> dict[str, dict]:
    """slug → document of recording ``name`` (one outside the set: :data:`OPTIONAL`, :data:`EXTRA_MEASURES`) on
    every GPU that holds one: how a chapter reads a recording from whichever GPUs measured it; {} while none has."""
    measured_paths(name)  # ValueError for a recording the book does not know
    return {s: doc for s in slugs(root) if (doc := results.load(name, gpu=s, root=root)) is not None}


def gpu_name(root=None) -> str:
    """The GPU of the set the chapters read, as the book names it ("H100 80GB HBM3", "H200")."""
    slug = current(root)
    if slug is None:
        raise FileNotFoundError("no complete set of recordings under results/")
    return docs(slug, root)["ceilings"]["gpu"].removeprefix("NVIDIA ")
