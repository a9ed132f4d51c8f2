"""``QUANT=False`` is the unquantized kernel: compiled for an sm_90 target (no GPU needed, in a
subprocess without the interpreter), the bf16 decode and grouped kernels never touch the scale
pointer or its strides and keep their two (up) or one (down) plain ``tt.dot`` with no conversion."""
import os
import subprocess
import sys

import pytest

SCRIPT = r'''
import json, re
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from dispatch.kernels import gemv_kernels, grouped_kernels
from dispatch_book.kernel_ir import _groups, _leaves
CONST = dict(BLOCK_M=16, BLOCK_I=64, BLOCK_H=64, BLOCK_E=16, CHUNK_N=16, NUM_STAGES=2, BLOCK_HO=64,
             SBR=1, SBC=1, QUANT=False, LATE_SCALE=False, W8A8=False, WFIRST=False,
             TOP_K=2, BLOCK_N=64, BLOCK_K=64, EVEN_K=True, GROUP_M=1, NS=0, TMA=False, TRACE=False)
SCALES = ("gs_ptr", "ds_ptr", "s_ptr", "s_se", "s_sr", "s_sc", "as_ptr", "s_as", "stride_gse", "stride_gsr",
          "stride_gsc", "stride_dse", "stride_dsr", "stride_dsc", "stride_se", "stride_sr", "stride_sc", "stride_as")
typed = lambda n: "constexpr" if n in CONST else "*i32" if n in ("ids_ptr", "rows_ptr", "bexp_ptr") \
    else "*bf16" if n.endswith("_ptr") else "i32"
out = {}
cases = [(m, f, False) for m in (gemv_kernels, grouped_kernels) for f in (m._up_swiglu_kernel, m._down_kernel)]
for mod, fn, quant in cases + [(gemv_kernels, gemv_kernels._up_swiglu_kernel, True)]:  # + a positive control
    names, groups, paths = fn.arg_names, _groups(fn), _leaves(fn)  # a tuple argument's fields at paths (i, j)
    sig = {n: tuple(map(typed, groups[n])) if n in groups else typed(n) for n in names}
    consts = {paths[n]: CONST[n] for n in names if n in CONST}
    if quant:
        sig["gate_up"] = tuple({"gu_ptr": "*i8", "gs_ptr": "*fp32"}.get(f, typed(f)) for f in groups["gate_up"])
        consts[paths["QUANT"]] = True
    ir = triton.compile(ASTSource(fn, sig, consts), target=GPUTarget("cuda", 90, 32)).asm["ttir"]
    lines = ir.splitlines()
    body = "\n".join(lines[next(i for i, l in enumerate(lines) if "tt.func" in l) + 1:])
    ir_name = lambda n: f"{names[paths[n][0]]}\\.{paths[n][1]}" if len(paths[n]) > 1 else f"(arg{paths[n][0]}|{n})"
    used = [n for n in paths if n in SCALES and re.search(rf"%{ir_name(n)}\b", body)]  # a field's IR name: x.1
    name = f"{mod.__name__}.{fn.__name__}" + (" QUANT" if quant else "")
    out[name] = dict(dots=body.count("tt.dot "), fp_to_fp=body.count("tt.fp_to_fp"), scale_args_used=used)
print(json.dumps(out))
'''


def test_unquantized_kernels_never_read_scales():
    env = {**os.environ, "TRITON_INTERPRET": "0", "CUDA_VISIBLE_DEVICES": ""}
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=600)
    if r.returncode:
        if "ptxas" in r.stderr or "No such file" in r.stderr:
            pytest.skip(f"Triton cannot compile for sm_90 here: {r.stderr.strip().splitlines()[-1]}")
        raise AssertionError(r.stderr)
    import json

    got = json.loads(r.stdout.strip().splitlines()[-1])
    control = got.pop("dispatch.kernels.gemv_kernels._up_swiglu_kernel QUANT")
    assert control["scale_args_used"] == ["gs_ptr", "stride_gse", "stride_gsr", "stride_gsc"]  # the check can see a use
    assert len(got) == 4
    for name, k in got.items():
        assert k["scale_args_used"] == [], name
        assert k["fp_to_fp"] == 0, name
        assert k["dots"] == (2 if "._up_" in name else 1), name
