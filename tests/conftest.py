"""Shared test settings: deterministic hypothesis runs, and skipping GPU tests without CUDA."""
import dataclasses
import functools
import hashlib
import os
import tempfile

import durations
import pytest
import torch
from hypothesis import HealthCheck, settings

import dispatch  # noqa: F401  (turns on Triton's interpreter when there is no CUDA)

# The launchers layer a user's own tile tables (~/.cache/dispatch/tables) over the shipped ones: the
# tests read the shipped tables alone, whatever a tuning run left in this machine's cache.
os.environ.setdefault("DISPATCH_TABLES", tempfile.mkdtemp(prefix="dispatch-tables-"))

# Derandomised: CI and every developer see the same examples; the interpreter is slow, so no
# per-example deadline. DISPATCH_HYPOTHESIS=thorough for a longer local search.
settings.register_profile("ci", derandomize=True, deadline=None, max_examples=25,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("thorough", deadline=None, max_examples=300,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("DISPATCH_HYPOTHESIS", "ci"))

# Under pytest-xdist (make test) each worker takes its share of the cores: with torch's default, one
# thread per core in every worker, the workers' threads outnumber the cores and wait on each other.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    _cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    _threads = str(max(1, _cores // _WORKERS))
    torch.set_num_threads(int(_threads))
    # the processes a worker starts (nbval's notebook kernels, servers, spawned workers) import torch
    # afresh: the same share for them, through the variables OpenMP and MKL read at start-up
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, _threads)


def pytest_configure(config):
    if os.environ.get("DISPATCH_BOUNDS") == "1":  # make test-bounds: every interpreted access checked
        from dispatch_book import bounds

        bounds.enable()
    # xdist's --dist loadfile would deal files out by their number of tests; keep the order below.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    durations.order(items, durations.load())  # longest files first: no worker is left with a long tail
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run `make test-gpu` on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _fingerprint(obj):
    """A hashable digest of a kernel call's argument: tensors by shape, dtype and bytes; dataclasses
    (routes, quantized experts, configs) and sequences by their parts."""
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        raw = t.view(torch.uint8) if t.element_size() == 1 else t
        return ("tensor", tuple(t.shape), str(t.dtype), hashlib.blake2b(raw.numpy().tobytes()).hexdigest())
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return (type(obj).__name__,) + tuple((f.name, _fingerprint(getattr(obj, f.name)))
                                             for f in dataclasses.fields(obj))
    if isinstance(obj, (tuple, list)):
        return tuple(_fingerprint(o) for o in obj)
    if isinstance(obj, dict):
        return tuple(sorted((k, _fingerprint(v)) for k, v in obj.items()))
    hash(obj)  # anything else must be a hashable value (numbers, strings, flags, dtypes, None)
    return obj


_RUNS: dict = {}  # (kernel, its arguments' fingerprint) → output, for every test of the session


def _memoised(fn):
    @functools.wraps(fn)
    def run(*args, **kwargs):
        key = (fn.__module__, fn.__name__, _fingerprint(args), _fingerprint(kwargs))
        if key not in _RUNS:
            _RUNS[key] = fn(*args, **kwargs)  # a call that raises is not kept: it raises again next time
        out = _RUNS[key]
        return out.clone() if isinstance(out, torch.Tensor) else out
    return run


@pytest.fixture
def kernel_runs(monkeypatch):
    """The tuner's kernel calls memoised by their inputs (the kernels are deterministic): a config
    that one descent (or test) already ran on the same case is not interpreted again. Every search
    step still runs, checks and prices each candidate; a test that plants a wrong kernel wraps these."""
    from dispatch.kernels import grouped_gemm
    from dispatch.tune import quant_search, refine, search

    for module, name in ((search, "moe_decode"), (refine, "moe_decode"), (refine, "moe_decode_quant"),
                         (quant_search, "moe_decode_quant"), (quant_search, "moe_experts_quant"),
                         (quant_search, "grouped_up_swiglu"), (quant_search, "grouped_down"),
                         (grouped_gemm, "grouped_up_swiglu"), (grouped_gemm, "grouped_down"),
                         (grouped_gemm, "moe_experts")):
        monkeypatch.setattr(module, name, _memoised(getattr(module, name)))


@pytest.fixture
def small_space(monkeypatch, kernel_runs):
    """The tuner's candidate spaces, interpreter-sized (the real ones are GPU tiles: slow under numpy),
    their kernel runs memoised (``kernel_runs``); for tests/test_tune*.py."""
    from dispatch.tune import search

    tiles_ = ((32, 32, 4, 1), (16, 32, 4, 2), (32, 16, 4, 1))
    monkeypatch.setattr(search, "SPACE", {(k, bm): tiles_ for k in ("up", "down") for bm in (16, 64, 128)})
    monkeypatch.setattr(search, "DECODE_UP", ((16, 32, 1), (32, 16, 1)))
    monkeypatch.setattr(search, "DECODE_DOWN", ((16, 32), (32, 16)))
    monkeypatch.setattr(search, "PROGRAMS_PER_SM", (1, 4))
    monkeypatch.setattr(search, "SPLIT_TILES", ((16, 16),))
    monkeypatch.setattr(search, "SPLIT_HO", (32,))
