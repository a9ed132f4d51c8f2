"""Every exercise's check passes on its solution and fails on its stub (an exercise whose check
cannot fail teaches nothing), and every exercise is introduced by a chapter."""
import json
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # exercises/ lives in the repository, not in the installed package

import exercises  # noqa: E402
from exercises import NAMES, check  # noqa: E402


@pytest.mark.parametrize("name", NAMES)
def test_solution_passes(name):
    assert check(name, solution=True, strict=True)


@pytest.mark.parametrize("name", NAMES)
def test_stub_fails(name):
    with pytest.raises((AssertionError, NotImplementedError)):
        check(name, strict=True)


def test_every_exercise_has_a_stub_a_solution_and_a_chapter():
    files = {p.stem for p in (ROOT / "exercises").glob("ch*.py")}
    solutions = {p.stem for p in (ROOT / "exercises" / "solutions").glob("ch*.py")}
    assert files == solutions == set(NAMES)
    text = "".join("".join(c["source"]) for nb in (ROOT / "notebooks").glob("*.ipynb")
                   for c in json.loads(nb.read_text())["cells"])
    assert [n for n in NAMES if n not in text] == [], "an exercise no chapter mentions"


def test_unknown_exercise_is_a_clear_error():
    with pytest.raises(ValueError, match="no exercise"):
        exercises.load("ch09_nothing")
