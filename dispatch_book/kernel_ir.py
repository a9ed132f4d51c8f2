"""What the compiler made of a kernel, without a GPU: compile for a GPU target offline and count
what matters in its TTGIR (Triton's GPU-level IR).

    TRITON_INTERPRET=0 python -m dispatch_book.kernel_ir [--target 90] [--warps 8] [--stages 3] [--json]

Triton compiles for any target on a machine without one (its own ``ptxas`` included), so the
structure of a kernel can be checked on a CPU: is the K loop software-pipelined (asynchronous
copies into shared memory, several stages), does the next tensor-core MMA start before the last
one finished (Hopper's ``warp_group_dot_wait`` with ``pendings`` > 0), how much shared memory a
program holds, whether registers spill. Arguments are specialised as Triton does at launch: a unit
stride becomes the constant 1, pointers and other sizes are taken as multiples of 16. The kernels
must have been defined compiled, not interpreted: set ``TRITON_INTERPRET=0`` before ``dispatch``
is imported (on a machine without CUDA it would otherwise turn the interpreter on).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re

UNIT_STRIDES = {"s_xh", "s_wk", "s_hi", "s_oh", "s_sc"}  # contiguous last dims of x, w, h, out, scales
FP32_PTRS = {"m_ptr", "l_ptr", "acc_ptr", "inv_ptr", "weights_ptr", "wts_ptr"}  # fp32 buffers by name
INT32_PTRS = {"ids_ptr", "pos_ptr", "hist_ptr", "counts_ptr", "before_ptr", "offsets_ptr", "num_blocks_ptr",
              "sorted_rows_ptr", "block_expert_ptr", "slot_of_ptr", "rows_ptr", "bexp_ptr"}  # the sort's, by name
FP32_ARGS = {"eps", "scale", "qk_scale", "scaling"}


def _groups(fn) -> dict:
    """The fields of ``fn``'s tuple arguments by argument name: its module's ``GROUPS`` (none if it has none)."""
    return getattr(fn, "fn", fn).__globals__.get("GROUPS", {})


def _leaves(fn) -> dict:
    """{name: path} of every argument of ``fn`` and every field of its tuple arguments (``_groups``): (i,) for
    argument i, (i, j) for field j of a tuple argument i; a tuple argument is also named, at (i,)."""
    groups, paths = _groups(fn), {}
    for i, p in enumerate(fn.params):
        paths[p.name] = (i,)
        if not p.is_constexpr:
            paths.update(((f, (i, j)) for j, f in enumerate(groups.get(p.name, ()))))
    return paths


def _signature(fn, const: dict, ptrs: dict | None = None) -> dict:
    """``fn``'s arguments typed as a launch specialises them: the names in ``const`` constexpr; a
    pointer as ``ptrs`` says, else by name (FP32_PTRS, INT32_PTRS), else bf16; FP32_ARGS fp32; other
    scalars i32. A tuple argument (``_groups``) is the tuple of its fields' types, each typed by its name."""
    ptrs = ptrs or {}

    def typed(n):
        if n in const:
            return "constexpr"
        if n in ptrs:
            return ptrs[n]
        if n.endswith("_ptr"):
            return ptrs.get(n) or ("*fp32" if n in FP32_PTRS else "*i32" if n in INT32_PTRS else "*bf16")
        return "fp32" if n in FP32_ARGS else "i32"
    groups = _groups(fn)
    return {p.name: tuple(typed(f) for f in groups[p.name]) if p.name in groups and p.name not in const
            and not p.is_constexpr else typed(p.name) for p in fn.params}


def offline(*args: str, env: dict | None = None) -> list:
    """``python -m dispatch_book.kernel_ir ARGS --json``'s answer, parsed: run in a fresh process that
    compiles (``TRITON_INTERPRET=0``, whatever this one runs; ``env``: more variables). How a
    chapter asks the compiler from a notebook."""
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-m", "dispatch_book.kernel_ir", *args, "--json"], capture_output=True,
                         env={**os.environ, "TRITON_INTERPRET": "0", **(env or {})}, text=True, check=True)
    return json.loads(run.stdout.splitlines()[-1])


def _check_compiled(fn) -> None:
    """Refuse a kernel defined for Triton's interpreter (it cannot be compiled), saying the fix."""
    if not hasattr(fn, "cache_key"):
        raise RuntimeError("the kernels were defined for Triton's interpreter: run with TRITON_INTERPRET=0 "
                           "set before dispatch is imported")


def _compile(fn, signature: dict, constexprs: dict, target: int, num_warps: int, num_stages: int):
    """``fn`` compiled for sm_<target> as a launch specialises it (Triton's CompiledKernel)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    defaults = {p.name: p.default for p in fn.params if p.is_constexpr and p.has_default and p.name not in constexprs}
    signature = {n: "constexpr" if n in defaults else t for n, t in signature.items()}
    constexprs = {**constexprs, **defaults}  # a constexpr left out takes its default, as at a launch
    paths = _leaves(fn)  # a field of a tuple argument at its path (i, j)
    constexprs = {paths[n] if isinstance(n, str) else n: v for n, v in constexprs.items()}
    leaves = [((i, j), t) if isinstance(ts, tuple) else ((i,), ts) for i, ts in enumerate(signature.values())
              for j, t in (enumerate(ts) if isinstance(ts, tuple) else [(0, ts)])]
    attrs = {path: [["tt.divisibility", 16]] for path, t in leaves if t not in ("constexpr", "fp32")}
    src = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", target, 32 * (4 if target >= 90 else 1)),
                          options={"num_warps": num_warps, "num_stages": num_stages})


def compile_offline(fn, signature: dict, constexprs: dict, *, target: int = 90, num_warps: int = 8,
                    num_stages: int = 3) -> dict:
    """Compile ``fn`` for sm_<target> and summarise its TTGIR (counts, shared bytes, spills)."""
    return _summary(_compile(fn, signature, constexprs, target, num_warps, num_stages))


def _summary(c) -> dict:
    """What :func:`compile_offline` reports of a CompiledKernel."""
    ttgir, ptx = c.asm["ttgir"], c.asm["ptx"]
    return {"async_copies": ttgir.count("async_copy_global_to_local") + ttgir.count("async_tma_copy"),
            "tma_copies": ttgir.count("async_tma_copy"),
            "mma": len(re.findall(r"warp_group_dot |tt\.dot |ttng\.tc_gen5_mma", ttgir)),
            "mma_waits_pending": [int(p) for p in re.findall(r"pendings = (\d+)", ttgir)],
            "shared_bytes": int(c.metadata.shared),
            "spills": bool(re.search(r"\.local\s", ptx)),
            "pdl_waits": ptx.count("griddepcontrol.wait"),
            "pdl_launches": ptx.count("griddepcontrol.launch_dependents"),
            # conversions to a 16-bit float: one value an instruction, or two (packed)
            "cvt_scalar": len(re.findall(r"\bcvt(?:\.rn)?\.(?:bf16|f16)\.(?:f16|bf16|f32)\b", ptx)),
            "cvt_packed": len(re.findall(r"\bcvt\.rn(?:\.satfinite)?\.(?:bf16x2|f16x2)\.", ptx)),
            "byte_permutes": ptx.count("prmt.b32")}


def grouped(kind: str, weights: str = "bf16", *, w8a8: bool = False, late_scale: bool = False,
            weight_first: bool = False, block_m: int = 128, block_n: int = 128, block_k: int = 64,
            group_m: int = 8, tma: bool = False, pdl: int = 0, target: int = 90, num_warps: int = 8,
            num_stages: int = 3) -> dict:
    """The grouped GEMM's up (``kind="up"``) or down kernel as the launcher compiles it, with bf16
    activations and ``weights`` "bf16", "int8" or "fp8" (8-bit codes with fp32 scales); ``tma``: the
    weight tiles (and down's h tiles) by TMA descriptors, as on Hopper (:mod:`dispatch.kernels.tma`).
    Each operand is a tuple (pointer, strides): typed element by element, its last stride the constant 1."""
    os.environ.setdefault("TRITON_INTERPRET", "0")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from dispatch.kernels import grouped_kernels as gk

    fn = gk._up_swiglu_kernel if kind == "up" else gk._down_kernel
    _check_compiled(fn)
    quant = weights != "bf16"
    const = dict(TOP_K=8, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, EVEN_K=True, GROUP_M=group_m, PDL=pdl,
                 SBR=1, SBC=1 << 20 if late_scale else 128, QUANT=quant, W8A8=w8a8, LATE_SCALE=late_scale,
                 WFIRST=quant and not w8a8 and not late_scale and weight_first, TMA=tma, ACT=0)  # ACT 0: SwiGLU
    wt = {"bf16": "bf16", "int8": "i8", "fp8": "fp8e4nv"}[weights]
    a = "*fp8e4nv" if w8a8 else "*bf16"  # x (up) or h (down): fp8 codes under w8a8
    # each operand: (pointer, strides); 1 is a unit stride, a constant as a launch specialises it
    operands = dict(w=(f"*{wt}", "i32", "i32", 1), s=("*fp32", "i32", "i32", 1), a_s=("*fp32", "i32"),
                    **(dict(x=(a, "i32", 1), h=("*bf16", "i32", 1)) if kind == "up"
                       else dict(h=(a, "i32", 1), out=("*bf16", "i32", 1))))
    ptrs = {}
    if tma:  # descriptors of the [BLOCK_N, BLOCK_K] weight boxes and the [BLOCK_M, BLOCK_K] h boxes
        ht = "fp8e4nv" if w8a8 else "bf16"
        ptrs.update(w_desc=f"tensordesc<{wt}[{block_n},{block_k}]>", h_desc=f"tensordesc<{ht}[{block_m},{block_k}]>")
    sig, consts, attrs = _signature(fn, const, ptrs), {}, {}
    for i, n in enumerate(fn.arg_names):
        for j, t in enumerate(operands.get(n, (sig[n],))):
            path = (i, j) if n in operands else (i,)
            if t == 1 or t == "constexpr":
                consts[path] = 1 if t == 1 else const[n]
            elif t != "fp32":
                attrs[path] = [["tt.divisibility", 16]]
        if n in operands:
            sig[n] = tuple("constexpr" if t == 1 else t for t in operands[n])
    src = ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
    return _summary(triton.compile(src, target=GPUTarget("cuda", target, 32 * (4 if target >= 90 else 1)),
                                   options={"num_warps": num_warps, "num_stages": num_stages}))


# the decode up kernel's weight formats: (name, pointer type, bytes a weight)
DECODE_WEIGHTS = (("bf16", "*bf16", 2), ("int8", "*i8", 1), ("fp8", "*fp8e4nv", 1))
# its loop's variants: those with bf16 activations, then fp8 codes with fp8 activations (w8a8, their
# scales per 128 columns) and with fp16 activations: (name, weights' type, bytes a weight, x's type)
DECODE_LOOPS = tuple(w + ("*bf16",) for w in DECODE_WEIGHTS) + (("fp8 × fp8", "*fp8e4nv", 1, "*fp8e4nv"),
                                                                 ("fp8, fp16 x", "*fp8e4nv", 1, "*fp16"))


def _decode_up(wtype: str, *, block_i: int = 32, block_h: int = 128, stages: int = 3, xtype: str = "*bf16"):
    """(kernel, signature, constexprs) of the decode up kernel (chapter 3) with 16-row tiles, weights
    of pointer type ``wtype`` (8-bit codes with one scale per row) and activations of ``xtype``."""
    os.environ.setdefault("TRITON_INTERPRET", "0")
    from dispatch.kernels import gemv_kernels as gk

    fn = gk._up_swiglu_kernel
    _check_compiled(fn)
    q, w8a8 = wtype != "*bf16", xtype == "*fp8e4nv"
    const = dict(SBR=1, SBC=1 << 20, QUANT=q, W8A8=w8a8, LATE_SCALE=q, BLOCK_M=16, BLOCK_I=block_i, BLOCK_H=block_h,
                 BLOCK_E=64, CHUNK_N=16, NUM_STAGES=stages, PDL=False, NS=0, ACT=0)
    h = "*fp16" if xtype == "*fp16" else "*bf16"
    ptrs = {"gu_ptr": wtype, "gs_ptr": "*fp32", "x_ptr": xtype, "h_ptr": h, "xs_ptr": "*fp32"}
    return fn, _signature(fn, const, ptrs), const


def decode_conversions(target: int = 90) -> list[dict]:
    """The decode up kernel (chapter 3) with bf16, int8 and fp8 weights, one scale per row, compiled
    for sm_<target>: how its PTX turns the weights into bf16 for the MMA — conversions of one value
    an instruction, packed ones (two values), byte permutes."""
    rows = []
    for weights, wtype, _ in DECODE_WEIGHTS:
        if weights == "fp8" and target < 89:
            continue  # no fp8 below sm_89
        c = compile_offline(*_decode_up(wtype), target=target, num_warps=4)
        rows.append({"weights": weights, **{k: c[k] for k in ("cvt_scalar", "cvt_packed", "byte_permutes")}})
    return rows


def _sass(cubin: bytes) -> tuple[list[str], int]:
    """(SASS lines, registers per thread) of a cubin, by the disassemblers Triton ships."""
    import subprocess
    import tempfile

    import triton

    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([os.path.join(tools, "nvdisasm"), "-c", f.name], capture_output=True, text=True,
                              check=True).stdout.splitlines()
        usage = subprocess.run([os.path.join(tools, "cuobjdump"), "--dump-resource-usage", f.name],
                               capture_output=True, text=True, check=True).stdout
    return sass, int(re.search(r"REG:(\d+)", usage).group(1))


def mma_ops(sass: list[str]) -> dict:
    """{tensor-core MMA opcode with its modifiers: count} in SASS lines (e.g. ``HMMA.16816.F32.BF16``:
    bf16 operands, fp32 sums; ``QMMA.16832.F32.E4M3.E4M3``: fp8 operands)."""
    return dict(collections.Counter(m.group(1) for ln in sass
                                    if (m := re.search(r"\b((?:H|Q)MMA\.\S+|(?:H|Q)GMMA\.\S+)", ln))))


def mma_loop(sass: list[str]) -> list[str]:
    """The opcodes of the shortest loop (a backward branch to a label) that holds a tensor-core MMA:
    the kernel's steady state, one iteration of its reduction loop."""
    labels = {ln.strip()[:-1]: i for i, ln in enumerate(sass) if re.fullmatch(r"\s*\.L_x_\d+:\s*", ln)}
    ops = [m.group(1).split(".")[0] if (m := re.search(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)",
                                                      ln)) else None for ln in sass]
    loops = [ops[labels[m.group(1)]:j + 1] for j, ln in enumerate(sass)
             if (m := re.search(r"BRA\s+`?\(?(\.L_x_\d+)", ln)) and labels.get(m.group(1), j) < j]
    body = min((lp for lp in loops if {"HMMA", "HGMMA", "QMMA", "QGMMA"} & set(lp)), key=len)
    return [o for o in body if o]


def decode_loop_mix(target: int = 90, block_i: int = 32, block_h: int = 128, warps: int = 4,
                    stages: int = 4) -> list[dict]:
    """The decode up kernel (16-row tiles, one scale per row) compiled for sm_<target> with each of
    :data:`DECODE_LOOPS` (bf16 activations but for fp8 × fp8 and fp16 x): its reduction loop's
    instructions (per warp and iteration, by opcode), the weight bytes a warp streams per iteration,
    instructions per KiB of weights, registers a thread, and the kernel's MMA opcodes."""
    rows = []
    for weights, wtype, size, xtype in DECODE_LOOPS:
        if wtype == "*fp8e4nv" and target < 89:
            continue  # no fp8 below sm_89
        kernel = _decode_up(wtype, block_i=block_i, block_h=block_h, stages=stages, xtype=xtype)
        c = _compile(*kernel, target, warps, stages)
        sass, regs = _sass(c.asm["cubin"])
        loop = mma_loop(sass)
        per_warp = 2 * block_h * block_i * size / warps  # gate and up tiles, shared by the warps
        rows.append({"weights": weights, "loop_instructions": len(loop), "bytes_per_warp": per_warp,
                     "per_kib": len(loop) * 1024 / per_warp, "registers": regs, "mma": mma_ops(sass),
                     "top": dict(collections.Counter(loop).most_common(6))})
    return rows


# launched with launch_kw(late=True)
LATE = {"decode up", "decode down", "combine", "down_combine", "grouped up", "grouped down"}


def _decode_step_kernels() -> list[tuple[str, object, dict]]:
    """(name, kernel, constexprs) of every kernel a decode step launches with PDL (chapter 6)."""
    from dispatch.kernels import (
        attention,
        combine,
        dense_gemv,
        fused_moe,
        gemv_kernels,
        grouped_kernels,
        norm_rope,
        routing,
        sort,
    )

    dec = dict(SBR=1, SBC=1, QUANT=False, W8A8=False, LATE_SCALE=False, BLOCK_M=16, BLOCK_E=64, CHUNK_N=16,
               NUM_STAGES=3, NS=0)
    gemm = dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, EVEN_K=True, GROUP_M=8, SBR=1, SBC=1, QUANT=False,
                W8A8=False, LATE_SCALE=False, WFIRST=False, TMA=False)
    return [
        ("dense_gemv M=1", dense_gemv._dense_gemv_kernel,
         dict(HAS_BIAS=False, DOT=False, PRECISION="tf32", BLOCK_N=4, BLOCK_K=2048, NUM_STAGES=1)),
        ("dense_gemv M=2..16", dense_gemv._dense_gemv_kernel,
         dict(HAS_BIAS=True, DOT=True, PRECISION="tf32", BLOCK_N=64, BLOCK_K=128, NUM_STAGES=3)),
        ("add_rms", norm_rope._add_rms_kernel, dict(HAS_D=True, BLOCK=2048)),
        ("qk_rope", norm_rope._qk_rope_kernel, dict(NORM=1, D=128, BLOCK_NH=16, BLOCK_KV=16)),
        ("decode_attention", attention._decode_attn_kernel,
         dict(D=128, BLOCK_G=16, BLOCK_S=64, PREC="tf32", PARTIALS=True)),
        ("attention combine", attention._combine_kernel, dict(D=128, BLOCK_SP=16)),
        ("route", routing._route_kernel, dict(K=8, MODE=0, HAS_BIAS=False, RENORM=False, GROUPS=1,
                                              GROUP_SIZE=64, TOPK_GROUP=1, BLOCK_T=1, BLOCK_E=64, BLOCK_K=8,
                                              BLOCK_G=1)),
        ("decode up", gemv_kernels._up_swiglu_kernel, dict(dec, BLOCK_I=32, BLOCK_H=256, ACT=0)),
        ("decode down", gemv_kernels._down_kernel, dict(dec, BLOCK_HO=32, BLOCK_I=128)),
        ("combine", combine._combine_kernel, dict(TOP_K=8, HAS_IDS=True, BLOCK_H=1024, NS=0)),
        ("router_topk", fused_moe._router_topk_kernel, dict(K=8, RENORM=False, BLOCK_E=64, BLOCK_H=128,
                                                            BLOCK_K=8)),
        ("down_combine", fused_moe._down_combine_kernel, dict(K=8, BLOCK_HO=8, BLOCK_I=256)),
        ("router logits (split)", fused_moe._router_logits_kernel, dict(BLOCK_E=4, BLOCK_H=2048)),
        ("rank (split router)", fused_moe._rank_kernel, dict(K=8, RENORM=False, BLOCK_E=64, BLOCK_K=8)),
        # batches above the decode crossover: the sort, then chapter 2's grouped GEMM
        ("sort histogram", sort._block_histogram_kernel, dict(K=8, BLOCK_N=64, BLOCK_E=64, CHUNK=32)),
        ("sort scan", sort._scan_blocks_kernel, dict(BLOCK_B=64, BLOCK_E2=32)),
        ("sort scatter", sort._scatter_kernel, dict(K=8, BLOCK_M=64, BLOCK_N=64, BLOCK_E=32, CHUNK=32)),
        ("grouped up", grouped_kernels._up_swiglu_kernel, dict(gemm, TOP_K=8, ACT=0)),
        ("grouped down", grouped_kernels._down_kernel, gemm),
    ]


def decode_step_pdl(target: int = 90) -> list[dict]:
    """Each decode-step kernel compiled for sm_<target> with PDL as its launcher sets it: how many
    ``griddepcontrol`` wait / launch_dependents instructions its PTX holds (1 and 1 expected)."""
    os.environ.setdefault("TRITON_INTERPRET", "0")
    rows = []
    for name, fn, const in _decode_step_kernels():
        _check_compiled(fn)
        const = dict(const, PDL=2 if name in LATE else 1)
        if name.startswith("grouped"):  # operand tuples: grouped() types them
            c = grouped(name.split()[1], block_m=64, pdl=const["PDL"], target=target, num_warps=4)
        else:
            c = compile_offline(fn, _signature(fn, const), const, target=target, num_warps=4)
        rows.append({"kernel": name, "wait": c["pdl_waits"], "launch_dependents": c["pdl_launches"]})
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m dispatch_book.kernel_ir", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", type=int, default=90, help="compute capability as an int (90: H100/H200)")
    ap.add_argument("--warps", type=int, default=8)
    ap.add_argument("--stages", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="one JSON list of the summaries instead of a table")
    ap.add_argument("--pdl", action="store_true", help="the decode step's kernels: their griddepcontrol counts")
    ap.add_argument("--decode", action="store_true", help="the decode up kernel: how it converts 8-bit weights")
    ap.add_argument("--loop", action="store_true", help="the decode up kernel: its loop's SASS per KiB of weights")
    a = ap.parse_args(argv)
    if a.pdl or a.decode or a.loop:
        print(json.dumps(decode_step_pdl(a.target) if a.pdl else decode_conversions(a.target) if a.decode
                         else decode_loop_mix(a.target)))
        return
    opts, rows = dict(target=a.target, num_warps=a.warps, num_stages=a.stages), []
    for kind in ("up", "down"):
        for weights, w8a8, late, first in (("bf16", False, False, False), ("int8", False, True, False),
                                           ("int8", False, False, False), ("int8", False, False, True),
                                           ("fp8", False, False, True), ("fp8", True, False, False),
                                           ("fp8", True, True, False)):
            if weights == "fp8" and a.target < 89:
                continue  # no fp8 below sm_89
            s = grouped(kind, weights, w8a8=w8a8, late_scale=late, weight_first=first,
                        block_k=128 if w8a8 else 64, **opts)
            what = (f"fp8 × fp8, scale per {'row' if late else '128'}" if w8a8 else weights if weights == "bf16"
                    else f"{weights}, scale per {'row' if late else '128'}{', w first' if first else ''}")
            rows.append({"kernel": kind, "weights": what, **s})
        if a.target >= 90:  # Hopper's tensor memory accelerator (dispatch.kernels.tma)
            rows.append({"kernel": kind, "weights": "bf16, TMA", **grouped(kind, tma=True, **opts)})
            rows.append({"kernel": kind, "weights": "fp8 × fp8, scale per row, TMA",
                         **grouped(kind, "fp8", w8a8=True, late_scale=True, block_k=128, tma=True, **opts)})
    for s in rows if not a.json else ():
        print(f"{s['kernel']:4s} {s['weights']:28s} async copies {s['async_copies']:2d}  mma {s['mma']}  "
              f"wait pendings {s['mma_waits_pending']}  shared {s['shared_bytes'] // 1024} KiB  "
              f"spills {'yes' if s['spills'] else 'no'}")
    if a.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
