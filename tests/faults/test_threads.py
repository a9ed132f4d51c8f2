"""Threads: every path of the layer called from 4 threads at once, 20 calls each, gives bitwise the
results of the same calls made one after another (CPU: Triton's interpreter, serialised by the package;
GPU: compiled kernels, each thread on its own stream, no lock). Was: on CPU one thread got an
InterpreterError ("x >= grid_dim[0]"), another values off by 1e27 or NaN without an error, once a
segfault. Shapes are tiny (H = I = 16, E = 4, K = 2, one token): the interpreter's cost per launch
dominates (about a minute and a half of CPU for the 7 paths x 84 calls on one core)."""
import dataclasses
import threading

import pytest
import torch

from dispatch import MoEConfig, moe, quant, random_weights, runtime
from dispatch.kernels.quant_gemv import moe_decode_quant
from dispatch.kernels.quant_grouped import moe_experts_quant
from dispatch.kernels.routing import route
from dispatch.kernels.tiles import INTERPRET_DECODE
from dispatch.reference import router_logits

THREADS, CALLS = 4, 20
CFG = MoEConfig(16, 16, 4, 2)


def _paths(device, dtype=torch.float32):
    w = random_weights(CFG, seed=1, device=device, dtype=dtype)
    qe = quant.quantize_experts(w.gate_up_E2IH, w.down_EHI, "int8-channel")

    def quantized(kernel):
        def run(x):
            weights_TK, ids_TK = route(router_logits(x, CFG, w), CFG)
            return kernel(x, weights_TK, ids_TK, qe)
        return run
    one_launch = dataclasses.replace(INTERPRET_DECODE, fused=1) if device == "cpu" else None
    split = dataclasses.replace(INTERPRET_DECODE, split=1) if device == "cpu" else None
    paths = {
        "torch": lambda x: moe(x, CFG, w, path="torch"),
        "triton": lambda x: moe(x, CFG, w, path="triton"),
        "decode": lambda x: moe(x, CFG, w, path="decode"),
        "decode, one launch": lambda x: moe(x, CFG, w, path="decode", tiles=one_launch),
        "decode, split items": lambda x: moe(x, CFG, w, path="decode", tiles=split),
        "quantized decode": quantized(moe_decode_quant),
        "quantized grouped": quantized(moe_experts_quant),
    }
    if device != "cpu":  # the one-launch kernels on a GPU take their tiles from the table
        del paths["decode, one launch"], paths["decode, split items"]
    return paths


def _inputs(device, dtype=torch.float32):
    g = torch.Generator().manual_seed(7)
    return [torch.randn(1, CFG.H, generator=g).to(device, dtype) for _ in range(THREADS)]  # one per thread


def _race(fn, xs, streams=None):
    """THREADS threads, thread t calling fn(xs[t]) CALLS times at once: their outputs (and errors)."""
    outs, errors = [[] for _ in xs], []
    start = threading.Barrier(len(xs))

    def work(t):
        try:
            if streams:  # the inputs and weights were made on the default stream
                streams[t].wait_stream(torch.cuda.default_stream())
            ctx = torch.cuda.stream(streams[t]) if streams else torch.no_grad()
            with ctx, torch.no_grad():
                start.wait()
                for _ in range(CALLS):
                    outs[t].append(fn(xs[t]).clone())
            if streams:
                streams[t].synchronize()
        except BaseException as e:  # noqa: BLE001 - reported below, with its thread
            errors.append(f"thread {t}: {type(e).__name__}: {e}")
    threads = [threading.Thread(target=work, args=(t,)) for t in range(len(xs))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return outs, errors


def _check(paths, xs, streams=None):
    bad = []
    for name, fn in paths.items():
        with torch.no_grad():
            want = [fn(x) for x in xs]  # sequential
        outs, errors = _race(fn, xs, streams)
        bad += [f"{name}: {e}" for e in errors]
        bad += [f"{name}: thread {t} call {i} differs from the sequential result"
                for t, got in enumerate(outs) for i, y in enumerate(got) if not torch.equal(y, want[t])]
    assert not bad, "\n".join(bad[:20])


@pytest.mark.slow
def test_every_path_from_four_threads_is_bitwise_the_sequential_result():
    _check(_paths("cpu"), _inputs("cpu"))


def test_the_lock_is_one_and_where_the_launches_are():
    """Under the interpreter every launch holds the lock (Triton's interpreted run is wrapped once),
    and so do the launchers whose scratch counters are shared between calls."""
    from triton.runtime import interpreter

    from dispatch.kernels import decode_fused, decode_split

    assert runtime.INTERPRET
    assert getattr(interpreter.InterpretedFunction.run, "serial_interpreter", False)
    assert decode_fused.fused_launch.serial_interpreter and decode_split.split_launch.serial_interpreter
    runtime._interpreter_one_launch_at_a_time()  # idempotent: never wrapped twice
    assert interpreter.InterpretedFunction.run.__wrapped__.__name__ == "run"
    assert not hasattr(interpreter.InterpretedFunction.run.__wrapped__, "__wrapped__")


@pytest.mark.gpu
def test_every_path_from_four_threads_on_their_own_streams():
    dev = torch.device("cuda")
    dtype = runtime.compute_dtype(dev)
    _check(_paths(dev, dtype), _inputs(dev, dtype), streams=[torch.cuda.Stream() for _ in range(THREADS)])
