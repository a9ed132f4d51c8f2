"""The package's layers, enforced: each module imports only from its own layer or the ones below, and
no two parts import each other (CONTRIBUTING.md, "Layers"). Read from the source with ``ast`` (nothing
is imported), then checked on a copy with an upward import and a cycle planted, so the check is known
to fail when it should. And ``import dispatch.config`` (or the reference layer) loads no kernel."""
from __future__ import annotations

import ast
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

# part → layer; a module belongs to the longest part that prefixes its name. Layer 1: device facts,
# configs, the one validator, tables, registries, the graph timer, atomic file writes, number formats;
# 2 the reference; 3 the kernels; 4 what a user calls; 5 the tuner; 6 the package's front door (lazy re-exports).
LAYERS = {
    "dispatch.runtime": 1, "dispatch.config": 1, "dispatch.checks": 1, "dispatch.tables": 1,
    "dispatch.families": 1, "dispatch.schemes": 1, "dispatch.activations": 1, "dispatch.timing": 1,
    "dispatch.arithmetic": 1, "dispatch.files": 1, "dispatch.compiles": 1,
    "dispatch.quant.formats": 1,
    "dispatch.reference": 2,
    "dispatch.kernels": 3, "dispatch.ops": 3,
    "dispatch.moe": 4, "dispatch.hf": 4, "dispatch.quant": 4, "dispatch.parallel": 4, "dispatch.engine": 4,
    "dispatch.serve": 4, "dispatch.placement": 4, "dispatch.balance": 4, "dispatch.routertap": 4,
    "dispatch.data": 4, "dispatch.train": 4, "dispatch.checkpoint": 4, "dispatch.generate": 4,
    "dispatch.tune": 5,
    "dispatch": 6,
}


def part_of(module: str) -> str | None:
    """The part (a key of LAYERS) that ``module`` belongs to, or None (the front door ``dispatch`` is
    the package's ``__init__`` alone, not a catch-all)."""
    parts = module.split(".")
    if module == "dispatch":
        return module
    for n in range(len(parts), 1, -1):
        if ".".join(parts[:n]) in LAYERS:
            return ".".join(parts[:n])
    return None


def modules(root: pathlib.Path) -> dict[str, pathlib.Path]:
    """dotted name → file of every module under ``root`` (the ``dispatch`` folder)."""
    out = {}
    for f in sorted(root.rglob("*.py")):
        rel = f.relative_to(root.parent).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        out[name] = f
    return out


def imports(name: str, path: pathlib.Path, known: set[str]) -> list[tuple[str, int]]:
    """(imported dispatch module, line) of every import in the file, deferred ones included;
    ``from dispatch.x import y`` names the module dispatch.x.y when that is a module."""
    out = []
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names if a.name.split(".")[0] == "dispatch"]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                base = ".".join(pkg[:len(pkg) - node.level + 1] + ([base] if base else []))
            if base.split(".")[0] != "dispatch":
                continue
            for a in node.names:
                sub = f"{base}.{a.name}"
                out.append((sub if sub in known else base, node.lineno))
    return out


def check(root: pathlib.Path) -> list[str]:
    """Every violation under ``root``: a module in no layer, an import from a higher layer, a cycle
    between parts."""
    mods = modules(root)
    problems, edges = [], {}
    for name, path in mods.items():
        src = part_of(name)
        if src is None:
            problems.append(f"{name}: in no layer (add it to LAYERS and to CONTRIBUTING.md)")
            continue
        for dep, line in imports(name, path, set(mods)):
            dst = part_of(dep)
            if dst is None or dst == src:
                continue
            if LAYERS[dst] > LAYERS[src]:
                problems.append(f"{name}:{line} imports {dep}: layer {LAYERS[dst]} above its own {LAYERS[src]}")
            edges.setdefault(src, set()).add(dst)
    # cycles between parts: a depth-first search for a back edge
    state: dict[str, int] = {}

    def visit(node, trail):
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                problems.append("cycle: " + " -> ".join(trail[trail.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    return problems


def test_every_module_imports_only_its_own_layer_or_below_and_no_parts_form_a_cycle():
    assert check(ROOT / "dispatch") == []


def test_layers_name_only_existing_parts():
    mods = set(modules(ROOT / "dispatch"))
    missing = [p for p in LAYERS if p != "dispatch.serve" and not any(m == p or m.startswith(p + ".")
                                                                       for m in mods)]
    assert missing == [], "LAYERS names parts that do not exist"


def _plant(tmp_path, file: str, line: str) -> pathlib.Path:
    copy = tmp_path / "dispatch"
    shutil.copytree(ROOT / "dispatch", copy, ignore=shutil.ignore_patterns("*.json", "assets", "__pycache__"))
    target = copy / file
    target.write_text(target.read_text() + "\n" + line + "\n")
    return copy


def test_the_check_finds_a_planted_upward_import(tmp_path):
    copy = _plant(tmp_path, "kernels/sort.py", "from dispatch.moe import MoELayer  # planted")
    found = check(copy)
    assert any("dispatch.kernels.sort" in p and "imports dispatch.moe" in p and "above" in p for p in found), found


def test_the_check_finds_a_planted_upward_deferred_import(tmp_path):
    copy = _plant(tmp_path, "reference.py", "def _f():\n    from dispatch.kernels import routing  # planted")
    assert any("dispatch.reference" in p and "dispatch.kernels.routing" in p for p in check(copy))


def test_the_check_finds_a_planted_cycle(tmp_path):
    copy = _plant(tmp_path, "placement.py", "from dispatch import balance  # planted")  # balance imports placement
    found = check(copy)
    assert any(p.startswith("cycle:") and "dispatch.balance" in p and "dispatch.placement" in p for p in found), found


def test_the_check_finds_a_module_in_no_layer(tmp_path):
    copy = _plant(tmp_path, "config.py", "")
    (copy / "stray.py").write_text("X = 1\n")
    assert any(p.startswith("dispatch.stray") for p in check(copy))


def _loaded(statement: str) -> list[str]:
    """The dispatch modules ``python -X importtime -c statement`` loads (read from its report)."""
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", statement], cwd=ROOT, capture_output=True,
                         text=True, check=True, env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    names = [line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")]
    return [n for n in names if n.startswith("dispatch")]


@pytest.mark.parametrize("statement", ["import dispatch.config", "import dispatch.reference",
                                       "import dispatch.quant.formats"])
def test_the_plain_pytorch_layers_load_no_kernel(statement):
    loaded = _loaded(statement)
    assert loaded, "importtime reported no dispatch module: the check would pass vacuously"
    assert [m for m in loaded if m.startswith(("dispatch.kernels", "dispatch.ops"))] == [], loaded
    lazy = ("dispatch", "dispatch.quant")  # packages whose __init__ loads nothing until asked
    assert all(LAYERS[part_of(m)] <= 2 for m in loaded if m not in lazy), loaded


def test_the_importtime_reading_sees_kernels_when_they_load():
    assert "dispatch.kernels.routing" in _loaded("import dispatch.kernels.routing")
