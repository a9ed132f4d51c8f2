"""The grouped GEMM's K loop as the compiler builds it for an H100/H200 (sm_90), compiled offline on
this CPU: software-pipelined (asynchronous copies into shared memory) with the next MMA issued
before the last one is waited for. A change that breaks either would cost the large-T speed.
Compiled in a fresh process: the kernels must be defined for the compiler, not the interpreter."""
import functools
import json
import os
import subprocess
import sys

import pytest


@pytest.fixture(scope="module")
def rows():
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    out = subprocess.run([sys.executable, "-m", "dispatch_book.kernel_ir", "--json", "--target", "90"],
                         env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return {(r["kernel"], r["weights"]): r for r in json.loads(out.stdout.strip().splitlines()[-1])}


@pytest.mark.parametrize("weights", ["bf16", "bf16, TMA"])
@pytest.mark.parametrize("kind", ["up", "down"])
def test_bf16_loop_is_pipelined_on_sm90(rows, kind, weights):
    s = rows[kind, weights]
    assert s["async_copies"] > 0, s
    assert max(s["mma_waits_pending"]) >= 1, s  # an MMA stays in flight across iterations
    assert 0 < s["shared_bytes"] <= 227 * 1024 and not s["spills"], s


def test_every_weight_format_compiles_for_sm90(rows):
    """bf16, int8 and fp8 codes (weight-only and w8a8): loads pipelined, no spills, within shared memory."""
    assert len(rows) == 18
    for s in rows.values():
        assert s["async_copies"] > 0 and s["mma"] >= 1 and not s["spills"], s
        assert s["shared_bytes"] <= 227 * 1024, s


@pytest.mark.parametrize("weights", ["bf16", "fp8 × fp8, scale per row"])
@pytest.mark.parametrize("kind", ["up", "down"])
def test_tma_loads_the_weight_tiles(rows, kind, weights):
    """Up: of the three tiles a K step loads, its two weight boxes by TMA (x rows stay gathered by
    cp.async); down: both of its tiles (w8a8: h's fp8 codes and the weights' codes). Pipelined as the
    pointer loads are (same copy count, same MMAs); without TMA, no descriptor copy at all."""
    t, p = rows[kind, f"{weights}, TMA"], rows[kind, weights]
    assert t["tma_copies"] == t["async_copies"] * (2 if kind == "up" else 3) // 3 > 0, t
    same = ("async_copies", "mma", "mma_waits_pending")
    assert [t[k] for k in same] == [p[k] for k in same]
    assert p["tma_copies"] == 0


@pytest.mark.parametrize("kind", ["up", "down"])
def test_quantized_loops_keep_an_mma_in_flight(rows, kind):
    """With block scales, weight-first w8a16 chains its MMAs like bf16 where scaling each chunk's
    product waits for every MMA (the control); per-row w8a8 chains too (its scales come after)."""
    for what in ("int8, scale per 128, w first", "fp8, scale per 128, w first", "fp8 × fp8, scale per row"):
        assert max(rows[kind, what]["mma_waits_pending"]) >= 1, (what, rows[kind, what])
    assert max(rows[kind, "int8, scale per 128"]["mma_waits_pending"]) == 0


def test_interpreted_kernels_are_refused_with_the_fix():
    from dispatch_book import kernel_ir

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("kernels compiled here")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=0"):
        kernel_ir.grouped("down")


def test_decode_step_kernels_compile_with_pdl_for_sm90():
    """Every kernel of the decode step compiles for sm_90 with PDL on (the interpreter never compiles:
    a construct only the compiler refuses is caught here), with one wait and one launch_dependents."""
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    out = subprocess.run([sys.executable, "-m", "dispatch_book.kernel_ir", "--pdl", "--target", "90"],
                         env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(rows) == 19
    for r in rows:
        assert r["wait"] == 1 and r["launch_dependents"] == 1, r


def test_decode_conversions_are_counted():
    """The decode up kernel compiles for sm_90 with every weight format; bf16 weights feed the MMA as
    they are, 8-bit codes are converted — int8 and fp8 alike by byte permutes, never one value an
    instruction (fp8 by bit placement, ``quant_kernels._e4m3_bf16``, not the hardware's e4m3 → f16 → bf16)."""
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    out = subprocess.run([sys.executable, "-m", "dispatch_book.kernel_ir", "--decode", "--target", "90"],
                         env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = {r["weights"]: r for r in json.loads(out.stdout.strip().splitlines()[-1])}
    assert set(rows) == {"bf16", "int8", "fp8"} and rows["bf16"]["cvt_scalar"] == 0
    for w in ("int8", "fp8"):
        r, bf = rows[w], rows["bf16"]
        assert r["cvt_scalar"] + r["cvt_packed"] + r["byte_permutes"] > bf["cvt_packed"] + bf["byte_permutes"], r
        assert r["cvt_scalar"] == 0 and r["byte_permutes"] > 0, r


def test_fp8_rows_compiles_for_sm90():
    """The w8a8 activation quantizer, with and without the used-block bound, compiles for sm_90."""
    script = r'''
from dispatch_book.kernel_ir import compile_offline
from dispatch.kernels import quant_kernels as q
ptrs = dict(a_ptr="*bf16", q_ptr="*fp8e4nv", s_ptr="*fp32", used_ptr="*i32")
sig = {n: ptrs.get(n, "constexpr" if n.isupper() and n not in ("M", "K", "GROUP") else "i32")
       for n in q._fp8_rows_kernel.arg_names}
for used in (0, 128):
    s = compile_offline(q._fp8_rows_kernel, sig, dict(BLOCK_M=16, BLOCK_K=128, USED=used, PRE_ROUND=False),
                        num_warps=4, num_stages=1)
    assert not s["spills"], s
print("ok")
'''
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]


def test_shared_experts_keep_the_decode_loops_pipelined():
    """With a shared expert riding along (NS = 2: its weights chosen per item by a select), the decode
    up and down kernels compile for sm_90 with as many asynchronous copies and MMAs as without."""
    script = r'''
import json
from dispatch_book.kernel_ir import _signature, compile_offline
from dispatch.kernels import gemv_kernels as gk
ptrs = dict(ids_ptr="*i32", gs_ptr="*fp32", ds_ptr="*fp32", out_ptr="*fp32", w_ptr="*fp32")
out = {}
for ns in (0, 2):
    dec = dict(SBR=1, SBC=1, QUANT=False, W8A8=False, LATE_SCALE=False, BLOCK_M=16, BLOCK_E=64, CHUNK_N=16,
               NUM_STAGES=3,
               NS=ns, PDL=False)
    for name, fn, c in (("up", gk._up_swiglu_kernel, dict(dec, BLOCK_I=32, BLOCK_H=256)),
                        ("down", gk._down_kernel, dict(dec, BLOCK_HO=32, BLOCK_I=128))):
        s = compile_offline(fn, _signature(fn, c, ptrs), c, num_warps=4)
        out[f"{name} {ns}"] = [s["async_copies"], s["mma"], s["spills"]]
print(json.dumps(out))
'''
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    for kind in ("up", "down"):
        assert got[f"{kind} 2"] == got[f"{kind} 0"] and got[f"{kind} 0"][0] > 0 and not got[f"{kind} 0"][2], got


def test_mma_loop_finds_the_innermost_loop_with_an_mma():
    """On hand-written SASS: the shortest backward branch whose body holds an HMMA, predicates and
    modifiers dropped, the outer loop and the loop without an MMA ignored."""
    from dispatch_book.kernel_ir import mma_loop

    sass = """.L_x_0:
        /*0000*/                   IMAD.MOV.U32 R1, RZ, RZ, c[0x0][0x28] ;
.L_x_1:
        /*0010*/                   LDS.64 R2, [R3] ;
        /*0020*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;
        /*0030*/              @!P0 BRA `(.L_x_1) ;
.L_x_2:
        /*0040*/                   FADD R5, R5, R6 ;
        /*0050*/               @P1 BRA `(.L_x_2) ;
        /*0060*/                   BRA `(.L_x_0) ;""".splitlines()
    assert mma_loop(sass) == ["LDS", "HMMA", "BRA"]


@functools.cache
def _loops(target: int) -> dict:
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    out = subprocess.run([sys.executable, "-m", "dispatch_book.kernel_ir", "--loop", "--target", str(target)],
                         env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return {r["weights"]: r for r in json.loads(out.stdout.strip().splitlines()[-1])}


def test_decode_loop_mix_counts_what_a_kib_of_codes_costs():
    """The decode up kernel compiled for sm_90: its loop issues several times more instructions per KiB
    of int8 or fp8 codes than per KiB of bf16 weights (the codes are converted before the MMA), and
    holds at least as many registers a thread. fp8 codes unpacked to fp16 (beside fp8 or fp16
    activations) cost fewer instructions than placing their bits into bf16."""
    rows = _loops(90)
    assert set(rows) == {"bf16", "int8", "fp8", "fp8 × fp8", "fp8, fp16 x"}
    bf = rows["bf16"]
    assert bf["top"].get("HMMA", 0) > 0 and bf["bytes_per_warp"] == 2 * rows["int8"]["bytes_per_warp"]
    for w in ("int8", "fp8"):
        assert rows[w]["per_kib"] > 3 * bf["per_kib"] and rows[w]["registers"] >= bf["registers"], rows[w]
    for w in ("fp8 × fp8", "fp8, fp16 x"):
        assert bf["per_kib"] < rows[w]["per_kib"] < rows["fp8"]["per_kib"], rows[w]


def test_decode_w8a8_runs_fp16_mmas_on_sm90_and_fp8_mmas_on_sm89():
    """What chapter 7 says of the 16-row decode tiles on fp8 activations: sm_90 has no fp8 form of
    their MMA (its fp8 MMAs are warpgroup ones), so both operands become fp16 (HMMA without .BF16);
    sm_89 multiplies the codes on its fp8 MMAs (QMMA ... E4M3)."""
    hopper, ada = _loops(90)["fp8 × fp8"]["mma"], _loops(89)["fp8 × fp8"]["mma"]
    assert hopper and all(op.startswith("HMMA.") and "BF16" not in op for op in hopper), hopper
    assert ada and all(op.startswith("QMMA.") and op.endswith("E4M3.E4M3") for op in ada), ada
    assert set(_loops(90)["bf16"]["mma"]) == {"HMMA.16816.F32.BF16"}
