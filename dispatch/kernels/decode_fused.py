"""The decode path in one launch: up+SwiGLU, down × weight and the combine in one kernel.

The three-launch chain of :mod:`dispatch.kernels.gemv` pays twice at one token for the kernel
boundaries: the down kernel cannot start before the *last* up program has written h, and the
combine cannot start before the last down program has written its rows. Each boundary drains the
GPU (the slow last programs, the next grid's ramp-up) while the weights wait to be read. Here the
same items run in one grid:

1. programs take items from one counter (a *ticket*), in an order where every up item (slot, I tile)
   of a slot comes before its down items (slot, H tile): the up items of the first ``lag`` slots, then
   for each further slot its up items followed by the down items of the slot ``lag`` places back
   (``lag`` = ``DecodeConfig.fused``; a lag ≥ the used experts puts every up item first). While the last
   slots' up items stream, the first slots' down items already read their weights. The item bodies are
   the chain's own (``gemv_kernels._up_item`` / ``_down_item``), so every row is computed the same way;
2. a finished up item adds 1 to its slot's counter (release); a down item of slot s first waits
   until s's counter holds all of s's up items (acquire). Those were handed out before it, to
   programs that are already running, so the wait ends however many programs the GPU holds at once;
3. a finished down item adds 1 to its H tile's counter; the one that completes the tile (all used
   slots done) sums that tile's rows for every token, in k order, fp32, cast once — the combine,
   with the very additions of ``combine._combine_kernel``.

The output is bitwise the chain's (same tiles, same orders). The counters live in a small int32
workspace per device, zeroed once when it is allocated; the last program to leave sets them back to
zero, so launches share it one after another. It is allocated outside any CUDA graph capture (the
first launch on a device is refused inside one: warm up first, as every capture here does): a tensor
allocated during a capture comes from the graph's memory pool, where a graph captured earlier into the
same pool may still write its temporaries — counters overwritten by activations. One-launch kernels
on one device must not run at the same time on two streams.

    lag 2:   U0 U1 | U2 D0 | U3 D1 | ... | U7 D5 | D6 D7      (Us: slot s's up items, Ds: its down items;
    lag 8:   U0 U1 ... U7 | D0 D1 ... D7                         a down item waits for its slot's Us)

Launcher: :func:`fused_launch`, which :func:`dispatch.kernels.gemv.run_decode` calls with ``DecodeConfig.fused``
(the tuner measures both).
Twin: :func:`dispatch.kernels.gemv.moe_decode_torch`.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from dispatch import runtime
from dispatch.kernels import pdl
from dispatch.kernels import trace as trace_rows
from dispatch.kernels.gemv_kernels import GROUPS as GROUPS  # the fields of this module's tuple arguments
from dispatch.kernels.gemv_kernels import _down_item, _expert_counts, _up_item
from dispatch.kernels.helpers import k_order_sum
from dispatch.kernels.pdl import pdl_enter, pdl_exit
from dispatch.kernels.trace import record, stamp

COUNTERS = tl.constexpr(2)  # ws[0]: the ticket, ws[1]: programs that have left; then a counter per slot, per H tile


@triton.jit
def _combine_tile(out, ids, y, T, K, E, H, o_tile, NS: tl.constexpr, KP: tl.constexpr, BLOCK_T: tl.constexpr,
                  BLOCK_HO: tl.constexpr):
    """y_TH[:, the H tile] = Σ_k out_NH[t·(K+NS) + k] in k order (fp32, one cast): the k-order sum of
    ``combine``; a routed row whose id is outside [0, E) is selected away (never written). Rows are read
    from L2 (other programs wrote them)."""
    out_ptr, stride_on = out
    ids_ptr, stride_it, stride_ik = ids
    y_ptr, stride_yt = y
    offs_o = o_tile * BLOCK_HO + tl.arange(0, BLOCK_HO)
    mask_o = offs_o < H
    for t0 in range(0, T, BLOCK_T):
        offs_t = t0 + tl.arange(0, BLOCK_T)
        mask_t = offs_t < T
        acc = k_order_sum(out_ptr, ids_ptr, offs_t, mask_t, offs_o, mask_o, K, E, stride_on, 1, stride_it, stride_ik,
                          NS, KP, True, ".cg", BLOCK_T, BLOCK_HO)
        tl.store(y_ptr + offs_t.to(tl.int64)[:, None] * stride_yt + offs_o[None, :], acc.to(y_ptr.dtype.element_ty),
                 mask=mask_t[:, None] & mask_o[None, :])


@triton.jit
def _ticket_item(t, used, a, b, lag):
    """Ticket t → (up?, item): the up items of the first ``lag`` slots, then per further slot s its up
    items followed by the down items of slot s - lag, then the last ``lag`` slots' down items. Every up
    item of a slot comes before its down items: a down item waits only on items already handed out."""
    lag = tl.minimum(lag, used)
    mid = (used - lag) * (a + b)  # the interleaved blocks
    t1 = t - lag * a
    j, r = t1 // (a + b), t1 % (a + b)
    up = (t < lag * a) | ((t1 < mid) & (r < a))
    item = tl.where(t < lag * a, t, tl.where(r < a, (lag + j) * a + r, j * b + r - a))
    item = tl.where(t1 >= mid, (used - lag) * b + t1 - mid, item)
    return up, item


@triton.jit
def _wait_for(ptr, target):
    """Spin until the int32 at ``ptr`` reaches ``target``, then acquire it: what its adders wrote before
    their release is visible. Plain (volatile) loads while spinning: they do not queue up in front of
    the adders' atomics as read-modify-writes would."""
    c = tl.load(ptr, volatile=True)
    while c < target:
        c = tl.load(ptr, volatile=True)
    tl.atomic_add(ptr, 0, sem="acquire")


@triton.jit
def _fused_decode_kernel(x, ids, w, gate_up, down, h, out, y, dims, T, LAG,  # operands (gemv_kernels.GROUPS), T, lag
                         ws_ptr, trace_ptr,  # the int32 counters (workspace), the trace rows
                         G: tl.constexpr, D: tl.constexpr,  # gate/up's and down's (SBR, SBC, QUANT, LATE_SCALE)
                         BLOCK_M: tl.constexpr, BLOCK_I: tl.constexpr, BLOCK_H: tl.constexpr,
                         BLOCK_HO: tl.constexpr, BLOCK_ID: tl.constexpr, BLOCK_E: tl.constexpr,
                         CHUNK_N: tl.constexpr, NUM_STAGES: tl.constexpr, NS: tl.constexpr, KP: tl.constexpr,
                         BLOCK_T: tl.constexpr,  # tiles, shared experts, the combine's k and token blocks
                         PDL: tl.constexpr, ACT: tl.constexpr, TRACE: tl.constexpr = False):
    """Every up and down item, by ticket (the module's docstring); TRACE: row ``ticket`` of trace_ptr."""
    pdl_enter(PDL)
    N, K, E, H, I = dims
    count_E, slot_E, used = _expert_counts(ids, N, K, E, NS, BLOCK_E, CHUNK_N)
    tiles_u = tl.cdiv(I, BLOCK_I)
    tiles_d = tl.cdiv(H, BLOCK_HO)
    n_up = used * tiles_u
    slot_ptr = ws_ptr + COUNTERS  # up items done, per slot
    tile_ptr = slot_ptr + BLOCK_E  # down items done, per H tile
    ticket = tl.atomic_add(ws_ptr, 1, sem="relaxed")
    while ticket < n_up + used * tiles_d:
        up, item = _ticket_item(ticket, used, tiles_u, tiles_d, LAG)
        t0 = stamp(TRACE)
        if up:  # no activation scales (never W8A8)
            slot = _up_item(item, tiles_u, count_E, slot_E, x, ids, gate_up, (x[0], 0), h, dims,
                            G[0], G[1], G[2], False, G[3], BLOCK_M, BLOCK_I, BLOCK_H, BLOCK_E, CHUNK_N, NUM_STAGES,
                            NS, ACT)
            tl.debug_barrier()  # every thread's h stores precede the release
            tl.atomic_add(slot_ptr + slot, 1, sem="release")
        else:
            _wait_for(slot_ptr + item // tiles_d, tiles_u)
            _down_item(item, tiles_d, count_E, slot_E, h, ids, w, down, out, (h[0], 0), dims,
                       D[0], D[1], D[2], False, D[3], BLOCK_M, BLOCK_HO, BLOCK_ID, BLOCK_E, CHUNK_N, NUM_STAGES, NS)
            tl.debug_barrier()
            if tl.atomic_add(tile_ptr + item % tiles_d, 1, sem="acq_rel") == used - 1:  # the tile's last row
                _combine_tile(out, ids, y, T, K, E, H, item % tiles_d, NS, KP, BLOCK_T, BLOCK_HO)
        record(trace_ptr, ticket, tl.where(up, 0, 1), t0, TRACE)
        ticket = tl.atomic_add(ws_ptr, 1, sem="relaxed")
    if tl.atomic_add(ws_ptr + 1, 1, sem="acq_rel") == tl.num_programs(0) - 1:  # the last to leave
        if used == 0:  # no row was routed to a valid expert: every row is selected away, y is zero
            for o_tile in range(0, tiles_d):
                _combine_tile(out, ids, y, T, K, E, H, o_tile, NS, KP, BLOCK_T, BLOCK_HO)
        n = COUNTERS + BLOCK_E + tiles_d
        for c0 in range(0, n, 1024):
            offs = c0 + tl.arange(0, 1024)
            tl.store(ws_ptr + offs, tl.zeros([1024], dtype=tl.int32), mask=offs < n)
    pdl_exit(PDL)


_workspaces: dict = {}  # device -> int32 counters, zero between launches
_outgrown: list = []  # workspaces replaced by larger ones
MIN_COUNTERS = 4096  # 16 KB: room for E + shared ≤ 1024 slots and H / BLOCK_HO ≤ 3070 tiles without growing


def workspace(device: torch.device, n: int) -> torch.Tensor:
    """The counters of the one-launch kernels (:func:`_fused_decode_kernel`, ``decode_split``) on this device
    (at least ``n``, zero between launches); allocated outside any CUDA graph capture."""
    ws = _workspaces.get(device)
    if ws is None or ws.numel() < n:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"the one-launch decode kernels' counters ({n} int32 on {device}) must exist before a "
                               "CUDA graph capture: run the same call once outside the capture first (a warm-up)")
        if ws is not None:  # a CUDA graph captured with it may still replay: never free it
            _outgrown.append(ws)
        ws = torch.zeros(max(MIN_COUNTERS, triton.next_power_of_2(n)), dtype=torch.int32, device=device)
        _workspaces[device] = ws
    if not ws.is_cuda:  # the interpreter: a call interrupted half-way (an exception in a program) left them
        ws.zero_()
    return ws


def weight_consts(op) -> dict:
    """The one-launch kernels' constexprs of both weights (``G``: gate/up, ``D``: down; each (SBR, SBC, QUANT,
    LATE_SCALE)) from ``op``."""
    keys = ("SBR", "SBC", "QUANT", "LATE_SCALE")
    return dict(G=tuple(op.gate_up[3][k] for k in keys), D=tuple(op.down[3][k] for k in keys))


@runtime.serial_interpreter  # its counters (workspace) are shared by every call on the device
def fused_launch(op, weights_TK, ids_TK, E: int, I: int, cfg, trace=None) -> torch.Tensor:  # noqa: E741
    """y_TH of the chain's items in one launch (inputs checked, T ≥ 1; ``op``:
    :func:`dispatch.kernels.gemv._operands`)."""
    x_TH, ns, N = op.x_TH, op.ns, op.N
    (T, H), K = x_TH.shape, ids_TK.shape[1]
    tiles_u, tiles_d = triton.cdiv(I, cfg.block_i), triton.cdiv(H, cfg.block_ho)
    ws = workspace(x_TH.device, COUNTERS.value + op.BLOCK_E + tiles_d)
    h_NI = torch.empty(N, I, dtype=x_TH.dtype, device=x_TH.device)
    out_NH = torch.empty(N, H, dtype=torch.float32, device=x_TH.device)
    y_TH = torch.empty(T, H, dtype=x_TH.dtype, device=x_TH.device)
    items = min(E + ns, N) * (tiles_u + tiles_d)  # at most: used experts × their up and down tiles
    tr, = trace_rows.buffers(trace, x_TH, ("one launch", items))
    _fused_decode_kernel[(max(1, min(cfg.programs, items)),)](
        (x_TH, x_TH.stride(0)), (ids_TK, *ids_TK.stride()), (weights_TK, *weights_TK.stride()), op.gate_up_arg,
        op.down_arg, (h_NI, h_NI.stride(0)), (out_NH, out_NH.stride(0)), (y_TH, y_TH.stride(0)), (N, K, E, H, I),
        T, cfg.fused, ws, tr,
        **weight_consts(op),
        BLOCK_M=cfg.block_m, BLOCK_I=cfg.block_i, BLOCK_H=cfg.block_h, BLOCK_HO=cfg.block_ho, BLOCK_ID=cfg.block_id,
        BLOCK_E=op.BLOCK_E, CHUNK_N=op.CHUNK_N, NUM_STAGES=cfg.num_stages, NS=ns, KP=triton.next_power_of_2(K + ns),
        BLOCK_T=min(16, triton.next_power_of_2(T)), ACT=op.ACT, num_warps=cfg.num_warps, TRACE=trace is not None,
        **pdl.launch_kw(x_TH.device, late=True))
    return y_TH
