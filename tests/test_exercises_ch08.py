"""Chapter 8's exercise checks reject the usual mistakes: each file under tests/exercises_wrong/ is
the solution with one of them (named after ``__``), and its check must fail on it."""
import importlib.util
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # exercises/ lives in the repository, not in the installed package

from exercises import _checks  # noqa: E402

WRONG = sorted((ROOT / "tests" / "exercises_wrong").glob("ch08_*__*.py"))


def test_every_ch08_exercise_has_wrong_answers():
    assert {p.name.split("__")[0] for p in WRONG} == {"ch08_block_allocator", "ch08_scheduler_step"}
    assert len(WRONG) >= 8


@pytest.mark.parametrize("path", WRONG, ids=lambda p: p.stem)
def test_check_rejects_the_mistake(path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with pytest.raises(AssertionError):
        getattr(_checks, path.name.split("__")[0])(mod)
