"""Every exercise's check passes on its solution, fails on its stub and rejects every wrong solution
of ``exercises/wrong/`` (the mistakes its chapter warns about: a check that lets them through
teaches nothing); every chapter has exercises, and every exercise is introduced by a chapter."""
import importlib
import json
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # exercises/ lives in the repository, not in the installed package

import exercises  # noqa: E402
from exercises import NAMES, _checks, check  # noqa: E402

WRONG = sorted(p.stem for p in (ROOT / "exercises" / "wrong").glob("ch*.py"))


def exercise_of(wrong: str) -> str:
    """The exercise a wrong solution is for: the longest exercise name it starts with."""
    return max((n for n in NAMES if wrong.startswith(n + "_")), key=len, default="")


@pytest.mark.parametrize("name", NAMES)
def test_solution_passes(name):
    assert check(name, solution=True, strict=True)


@pytest.mark.parametrize("name", NAMES)
def test_stub_fails(name):
    with pytest.raises((AssertionError, NotImplementedError)):
        check(name, strict=True)


@pytest.mark.parametrize("wrong", WRONG)
def test_wrong_solution_is_rejected(wrong):
    name = exercise_of(wrong)
    mod = importlib.import_module(f"exercises.wrong.{wrong}")
    assert mod.__doc__ and mod.__doc__.strip(), f"{wrong}: its docstring names the mistake"
    with pytest.raises(AssertionError):  # rejected by the check, not crashed in it
        getattr(_checks, name)(mod)


def test_every_exercise_has_wrong_solutions_and_every_chapter_exercises():
    assert all(exercise_of(w) for w in WRONG), [w for w in WRONG if not exercise_of(w)]
    per_exercise = {n: sum(exercise_of(w) == n for w in WRONG) for n in NAMES}
    assert min(per_exercise.values()) >= 2, {n: c for n, c in per_exercise.items() if c < 2}
    chapters = {int(n[2:4]) for n in NAMES}
    per_chapter = {c: sum(int(n[2:4]) == c for n in NAMES) for c in range(10)}
    assert set(range(10)) <= chapters and min(per_chapter.values()) >= 2, per_chapter


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
