"""Shared test settings: deterministic hypothesis runs, and skipping GPU tests without CUDA."""
import os
import tempfile

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


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run `make test-gpu` on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
