"""Shared test settings: deterministic hypothesis runs, and skipping GPU tests without CUDA."""
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
    torch.set_num_threads(max(1, _cores // _WORKERS))


def pytest_configure(config):
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


@pytest.fixture
def small_space(monkeypatch):
    """The tuner's candidate spaces, interpreter-sized (the real ones are GPU tiles: slow under numpy);
    for tests/test_tune*.py."""
    from dispatch.tune import search

    tiles_ = ((32, 32, 4, 1), (16, 32, 4, 2), (32, 16, 4, 1))
    monkeypatch.setattr(search, "SPACE", {(k, bm): tiles_ for k in ("up", "down") for bm in (16, 64, 128)})
    monkeypatch.setattr(search, "DECODE_UP", ((16, 32, 1), (32, 16, 1)))
    monkeypatch.setattr(search, "DECODE_DOWN", ((16, 32), (32, 16)))
    monkeypatch.setattr(search, "PROGRAMS_PER_SM", (1, 4))
    monkeypatch.setattr(search, "SPLIT_TILES", ((16, 16),))
    monkeypatch.setattr(search, "SPLIT_HO", (32,))
