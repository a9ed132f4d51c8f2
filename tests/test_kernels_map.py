"""Where the kernels live: every ``@triton.jit`` function of the package is under dispatch/kernels/, and
the file map in ``dispatch/kernels/__init__``'s docstring lists exactly the modules of that folder.
Read from the source with ``ast`` (nothing imported)."""
import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1] / "dispatch"


def _jitted(path: pathlib.Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef):
            for d in node.decorator_list:
                target = d.func if isinstance(d, ast.Call) else d
                if ast.unparse(target) in ("triton.jit", "jit"):
                    out.append(node.name)
    return out


def test_every_triton_kernel_lives_under_kernels():
    outside = {str(p.relative_to(ROOT)): _jitted(p) for p in ROOT.rglob("*.py")
               if "kernels" not in p.relative_to(ROOT).parts and _jitted(p)}
    assert outside == {}
    assert sum(len(_jitted(p)) for p in (ROOT / "kernels").glob("*.py")) > 40  # the check sees them


def test_the_kernels_file_map_lists_exactly_the_folder():
    doc = ast.get_docstring(ast.parse((ROOT / "kernels" / "__init__.py").read_text()))
    listed = re.findall(r"^(\w+)\.py\s", doc, flags=re.M)
    on_disk = sorted(p.name[:-3] for p in (ROOT / "kernels").glob("*.py") if p.name != "__init__.py")
    assert sorted(listed) == on_disk
    assert len(listed) == len(set(listed)), "a module listed twice"
