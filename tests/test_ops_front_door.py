"""The front door for kernels: :mod:`dispatch.ops` offers every name it lists (each the kernel
module's own object), loads a kernel module only when one of its names is asked, and is the one
place the chapters' code cells import kernels from. Read from the notebooks' JSON with ``ast``."""
import ast
import importlib
import json
import pathlib
import subprocess
import sys

import pytest

import dispatch.ops as ops

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_every_listed_name_is_the_kernel_modules_own():
    assert len(ops.__all__) > 50
    for name in ops.__all__:
        got = getattr(ops, name)
        if name in ops.MODULES:
            assert got is importlib.import_module(f"dispatch.kernels.{name}")
        else:
            assert got is getattr(importlib.import_module(f"dispatch.kernels.{ops._WHERE[name]}"), name), name
    assert sorted(dir(ops)) == sorted(ops.__all__)


def test_the_entry_points_of_every_step_are_there():
    for name in ("route", "sort_by_expert", "moe_experts", "moe_decode", "combine", "moe_experts_quant",
                 "moe_decode_quant", "linear_small", "decode_attention", "paged_decode_attention", "resolve"):
        assert name in ops.__all__, name


def test_the_module_list_is_the_kernels_folder_but_the_names_of_functions():
    on_disk = {p.stem for p in (ROOT / "dispatch" / "kernels").glob("*.py") if p.stem != "__init__"}
    assert set(ops.MODULES) == on_disk - set(ops._WHERE)
    assert {"combine", "gated_rows"} <= on_disk - set(ops.MODULES)  # the function of that name wins


def test_an_unknown_name_is_an_attribute_error_naming_the_offer():
    with pytest.raises(AttributeError, match="has no attribute 'moe_expert'.*moe_experts"):
        ops.moe_expert  # noqa: B018
    with pytest.raises(ImportError):
        exec("from dispatch.ops import no_such_kernel", {})


def test_names_load_lazily():
    loaded = "sorted(m for m in sys.modules if m.startswith('dispatch.kernels.'))"
    code = f"import sys, json, dispatch.ops as o; before = {loaded}; o.route; print(json.dumps([before, {loaded}]))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={**__import__("os").environ, "PYTHONPATH": str(ROOT)}).stdout
    before, after = json.loads(out)
    assert before == [], before
    assert "dispatch.kernels.routing" in after and "dispatch.kernels.grouped_gemm" not in after, after


def _kernel_imports(src: str) -> tuple[list[str], list[str]]:
    """(imports of dispatch.kernels in any form, names imported from dispatch.ops) of a cell's code."""
    code = "\n".join(ln for ln in src.splitlines() if not ln.lstrip().startswith(("%", "!")))
    kernels, from_ops = [], []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [a.name for a in node.names]
            if node.module == "dispatch.kernels" or node.module.startswith("dispatch.kernels."):
                kernels.append(f"from {node.module} import {', '.join(names)}")
            elif node.module == "dispatch" and "kernels" in names:
                kernels.append("from dispatch import kernels")
            elif node.module == "dispatch.ops":
                from_ops += names
        elif isinstance(node, ast.Import):
            kernels += [f"import {a.name}" for a in node.names if a.name.startswith("dispatch.kernels")]
    return kernels, from_ops


@pytest.mark.parametrize("nb_path", NOTEBOOKS, ids=lambda p: p.stem)
def test_the_chapters_import_kernels_only_from_dispatch_ops(nb_path):
    cells = [c for c in json.loads(nb_path.read_text())["cells"] if c["cell_type"] == "code"]
    found = [_kernel_imports("".join(c["source"])) for c in cells]
    assert [k for kernels, _ in found for k in kernels] == []
    unknown = [n for _, names in found for n in names if n not in ops.__all__]
    assert unknown == []


def test_the_check_sees_kernel_imports_in_every_form():
    src = ("from dispatch.kernels.routing import route\nfrom dispatch.kernels import tiles\n"
           "from dispatch import kernels\nimport dispatch.kernels.sort\n%matplotlib inline\n"
           "from dispatch.ops import moe_decode, tiles")
    kernels, from_ops = _kernel_imports(src)
    assert len(kernels) == 4 and from_ops == ["moe_decode", "tiles"]
    assert sum(len(_kernel_imports("".join(c["source"]))[1]) for nb in NOTEBOOKS
               for c in json.loads(nb.read_text())["cells"] if c["cell_type"] == "code") > 20  # the chapters use it
