"""The decode timeline: the trace rows the kernels write (GPU), the summary of a trace (hand-computed),
the refusal on CPU, and the kernels compiled with and without TRACE (offline, for sm_90)."""
import json
import os
import subprocess
import sys

import pytest
import torch

from dispatch import runtime
from dispatch.config import MoEConfig, random_weights
from dispatch.kernels import gemv
from dispatch.kernels.tiles import DecodeConfig
from dispatch.reference import route_reference
from dispatch_book.bench.timeline import figure, summarize


def test_summarize_hand_computed():
    """Two SMs: SM 0 runs programs 0 and 2 (overlapping items), SM 1 program 1, which ends last; an
    item that never ran (-1) is left out. Times in ns from 1000."""
    items = [[0, 0, 0, 1000, 3000], [0, 2, 0, 2000, 4000], [1, 1, 1, 1000, 2000], [1, 1, 1, 2000, 9000],
             [-1, -1, -1, -1, -1]]
    s = summarize(items)
    assert s["items"] == 4 and s["sms"] == 2 and s["span_us"] == 8.0
    assert s["sm_finish_first_us"] == 3.0 and s["sm_finish_median_us"] == 5.5 and s["tail_us"] == 2.5
    assert s["items_per_program"] == [1, 2]
    assert s["busy_share"] == (3000 + 8000) / (2 * 8000)  # SM 0 busy 1000..4000, SM 1 1000..9000
    assert summarize([[-1] * 5]) == {"items": 0}


def test_figure_draws_a_panel_per_launch():
    items = [[0, 0, 0, 0, 2000], [1, 1, 1, 500, 3000], [0, 0, 1, 2000, 2500]]
    doc = {"rows": [{"shape": "s", "tokens": 1, "kernel": k, **summarize(items), "trace": items}
                    for k in ("up", "down")]}
    fig = figure(doc, "s", 1)
    assert len(fig.axes) == 2 and all(len(ax.patches) == 3 for ax in fig.axes)
    with pytest.raises(ValueError, match="no trace of s at T=8"):
        figure(doc, "s", 8)


def test_a_trace_is_refused_where_the_clock_cannot_be_read():
    """On CPU (the interpreter runs no inline PTX) a traced decode is refused before any kernel runs."""
    if runtime.HAS_CUDA and not runtime.INTERPRET:
        pytest.skip("a GPU here: the trace runs")
    cfg = MoEConfig(64, 32, 8, 2)  # H, I, E, K
    w = random_weights(cfg, dtype=torch.float32, seed=0)
    x = torch.randn(3, cfg.H, generator=torch.Generator().manual_seed(0))
    wt, ids = route_reference(torch.randn(3, cfg.E, generator=torch.Generator().manual_seed(1)), cfg)
    for fused in (0, 1):
        with pytest.raises(ValueError, match="needs a CUDA device"):
            gemv.run_decode(x, wt, ids, w.gate_up_E2IH, w.down_EHI, DecodeConfig(block_h=64, fused=fused), trace=[])


def test_trace_compiles_away_and_keeps_the_loops_pipelined():
    """Compiled for sm_90: with TRACE the up, down and one-launch kernels read the clock and the SM id,
    without it they hold neither; their loads are pipelined the same either way."""
    script = r'''
import json
from dispatch_book.kernel_ir import _compile, _signature
from dispatch.kernels import decode_fused as df, gemv_kernels as gk
ptrs = dict(ids_ptr="*i32", gs_ptr="*fp32", ds_ptr="*fp32", out_ptr="*fp32", w_ptr="*fp32", trace_ptr="*i64",
            ws_ptr="*i32")
dec = dict(SBR=1, SBC=1, QUANT=False, W8A8=False, LATE_SCALE=False, BLOCK_M=16, BLOCK_E=64, CHUNK_N=16,
           NUM_STAGES=3, NS=0, PDL=False)
one = dict(G=(1, 1, False, False), D=(1, 1, False, False),
           BLOCK_M=16, BLOCK_I=32, BLOCK_H=256, BLOCK_HO=32, BLOCK_ID=128, BLOCK_E=64, CHUNK_N=16, NUM_STAGES=3,
           NS=0, KP=8, BLOCK_T=8, PDL=False)
out = {}
for on in (False, True):
    for name, fn, c in (("up", gk._up_swiglu_kernel, dict(dec, BLOCK_I=32, BLOCK_H=256)),
                        ("down", gk._down_kernel, dict(dec, BLOCK_HO=32, BLOCK_I=128)),
                        ("one launch", df._fused_decode_kernel, one)):
        c = dict(c, TRACE=on)
        k = _compile(fn, _signature(fn, c, ptrs), c, 90, 4, 3)
        out[f"{name} {on}"] = [k.asm["ptx"].count("%globaltimer"), k.asm["ptx"].count("%smid"),
                               k.asm["ttgir"].count("async_copy_global_to_local")]
print(json.dumps(out))
'''
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    for name in ("up", "down", "one launch"):
        off, on = got[f"{name} False"], got[f"{name} True"]
        assert off[:2] == [0, 0] and on[0] >= 2 and on[1] >= 1, got
        assert off[2] == on[2] > 0, got


@pytest.mark.gpu
@pytest.mark.parametrize("fused", [0, 2])
def test_trace_rows_on_the_gpu(fused):
    """Every item that ran has a row (its SM on the device, its program in the grid, start ≤ end);
    rows of slots no token used stay -1; the output is bitwise the untraced call's."""
    dev = torch.device("cuda")
    cfg = MoEConfig(256, 128, 16, 4)  # H, I, E, K
    w = random_weights(cfg, dtype=torch.bfloat16, device=dev, seed=0)
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(5, cfg.H, generator=g, device=dev).to(torch.bfloat16)
    wt, ids = route_reference(torch.randn(5, cfg.E, generator=g, device=dev), cfg)
    c = DecodeConfig(block_i=32, block_h=128, block_ho=64, block_id=64, programs=24, fused=fused)
    args = (x, wt, ids, w.gate_up_E2IH, w.down_EHI, c)
    trace = []
    y = gemv.run_decode(*args, trace=trace)
    assert torch.equal(y, gemv.run_decode(*args))
    used = int(torch.unique(ids).numel())
    want = {"up": used * 4, "down": used * 4} if not fused else {"one launch": used * 8}  # I/32 and H/64 tiles
    assert {k: int((b[:, 0] >= 0).sum()) for k, b in trace} == want
    sms = runtime.num_sms(dev)
    for _, b in trace:
        ran = b[b[:, 0] >= 0].cpu()
        assert ((ran[:, 0] < sms) & (ran[:, 1] < c.programs) & (ran[:, 3] <= ran[:, 4])).all()
        assert set(ran[:, 2].tolist()) <= {0, 1} and (b[b[:, 0] < 0] == -1).all()
