"""pytest over the whole checkout (``make test``: ``tests`` and ``notebooks`` in one run, spread over
the cores by pytest-xdist with ``--dist loadgroup``; tests/conftest.py holds the tests' own settings).

Which tests must share a worker: a notebook's cells (nbval runs them in order in one kernel), and
the tests of a module that uses a module- or session-scoped fixture of ours (computed once per
worker: spread over two workers it would be computed twice). Everything else is dealt out one test
at a time, so a file of slow tests (the tuner's) does not keep one worker busy alone.
"""
import pytest


def _shared_fixture(item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    for defs in (info.name2fixturedefs.values() if info else ()):
        for d in defs:
            if d.scope in ("module", "package", "session") and d.baseid:  # ours (pytest's own have no baseid)
                return True
    return False


def pytest_collection_modifyitems(config, items):
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        if item.path.suffix == ".ipynb" or _shared_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
