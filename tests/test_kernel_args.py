"""Every Triton kernel under dispatch/kernels takes at most MAX_ARGS arguments (constexprs counted):
operands travel as tuples (a pointer with its strides), grouped as the kernels' comments say."""
import ast
import pathlib

MAX_ARGS = 30
KERNELS = pathlib.Path(__file__).resolve().parents[1] / "dispatch" / "kernels"


def _is_jit(dec: ast.expr) -> bool:
    dec = dec.func if isinstance(dec, ast.Call) else dec
    return (isinstance(dec, ast.Attribute) and dec.attr == "jit") or (isinstance(dec, ast.Name) and dec.id == "jit")


def jit_arg_counts(folder: pathlib.Path = KERNELS) -> dict:
    """{"file.py:function": number of arguments} of every ``@triton.jit`` function under ``folder``."""
    counts = {}
    for path in sorted(folder.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and any(_is_jit(d) for d in node.decorator_list):
                a = node.args
                counts[f"{path.name}:{node.name}"] = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs)
    return counts


def test_every_kernel_takes_at_most_30_arguments():
    over = {k: n for k, n in jit_arg_counts().items() if n > MAX_ARGS}
    assert not over, f"more than {MAX_ARGS} arguments (group the operands into tuples): {over}"


def test_a_planted_long_kernel_is_caught(tmp_path):
    args = ", ".join(f"a{i}" for i in range(MAX_ARGS + 1))
    (tmp_path / "k.py").write_text(f"import triton\n\n@triton.jit\ndef long_kernel({args}):\n    pass\n")
    assert jit_arg_counts(tmp_path) == {"k.py:long_kernel": MAX_ARGS + 1}


def test_the_decode_kernels_are_counted():
    counts = jit_arg_counts()
    assert {"decode_fused.py:_fused_decode_kernel", "decode_split.py:_split_decode_kernel",
            "gemv_kernels.py:_up_item"} <= set(counts)
