"""Each test file's recorded seconds (tests/durations.json), so that `make test` starts the longest first.

pytest-xdist (--dist loadfile) hands out whole files in collection order: a long file dealt last keeps
one worker busy while the others wait. tests/conftest.py orders the files by this table, longest first.
Re-record after a full run with ``--junitxml=run.xml``: ``python tests/durations.py run.xml``.
"""
import json
import statistics
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TABLE = Path(__file__).with_name("durations.json")


def load() -> dict[str, float]:
    return json.loads(TABLE.read_text()) if TABLE.exists() else {}


def file_of(classname: str) -> str:
    """A JUnit classname (tests.faults.test_threads.TestX, notebooks.08_serving.ipynb) → its file."""
    if classname.endswith(".ipynb"):
        head, name = classname[:-len(".ipynb")].split(".", 1)
        return f"{head}/{name}.ipynb"
    parts = classname.split(".")
    for n in range(len(parts), 0, -1):
        path = "/".join(parts[:n]) + ".py"
        if (ROOT / path).exists():
            return path
    return "/".join(parts) + ".py"


def record(junit_xml: str) -> dict[str, float]:
    seconds = Counter()
    for case in ET.parse(junit_xml).getroot().iter("testcase"):
        seconds[file_of(case.get("classname", ""))] += float(case.get("time", 0))
    return {f: round(s, 1) for f, s in seconds.most_common()}


def order(items, table: dict[str, float]) -> None:
    """Sort pytest items in place: files by recorded seconds, longest first (unknown files at the
    median); a file's items keep their order."""
    default = statistics.median(table.values()) if table else 0.0
    items.sort(key=lambda item: -table.get(item.nodeid.split("::", 1)[0], default))


if __name__ == "__main__":
    TABLE.write_text(json.dumps(record(sys.argv[1]), indent=0) + "\n")
