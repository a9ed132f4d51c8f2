"""Every Triton kernel under dispatch/kernels takes at most MAX_ARGS arguments (constexprs counted):
operands travel as tuples (a pointer with its strides), grouped as the kernels' comments say."""
import ast
import pathlib

MAX_ARGS = 30
KERNELS = pathlib.Path(__file__).resolve().parents[1] / "dispatch" / "kernels"
# over the limit, to be grouped (never more than this many): {"file.py:function": its argument count}
KNOWN_OVER = {
    "grouped_kernels.py:_up_swiglu_kernel": 38,
    "grouped_kernels.py:_down_kernel": 38,
    "grouped_kernels.py:_up_tile": 37,
    "grouped_kernels.py:_down_tile": 37,
    "paged_attention.py:_paged_decode_kernel": 33,
}


def _is_jit(dec: ast.expr) -> bool:
    dec = dec.func if isinstance(dec, ast.Call) else dec
    return (isinstance(dec, ast.Attribute) and dec.attr == "jit") or (isinstance(dec, ast.Name) and dec.id == "jit")


def jit_arg_counts() -> dict:
    """{"file.py:function": number of arguments} of every ``@triton.jit`` function under dispatch/kernels."""
    counts = {}
    for path in sorted(KERNELS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and any(_is_jit(d) for d in node.decorator_list):
                a = node.args
                counts[f"{path.name}:{node.name}"] = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs)
    return counts


def test_every_kernel_takes_at_most_30_arguments():
    over = {k: n for k, n in jit_arg_counts().items() if n > KNOWN_OVER.get(k, MAX_ARGS)}
    assert not over, f"more than {MAX_ARGS} arguments (group the operands into tuples): {over}"


def test_the_known_over_list_is_not_stale():
    counts = jit_arg_counts()
    stale = {k: counts.get(k) for k in KNOWN_OVER if counts.get(k, 0) <= MAX_ARGS}
    assert not stale, f"within {MAX_ARGS} arguments now (or gone): remove from KNOWN_OVER: {stale}"


def test_the_decode_kernels_are_counted():
    counts = jit_arg_counts()
    assert {"decode_fused.py:_fused_decode_kernel", "decode_split.py:_split_decode_kernel",
            "gemv_kernels.py:_up_item"} <= set(counts)
