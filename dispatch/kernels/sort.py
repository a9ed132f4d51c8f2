"""Token sort: routed rows n = t·K + k → expert-sorted slots, each expert padded to ``block_m``.

The grouped GEMM multiplies one expert's rows by one expert's weights, ``block_m`` rows per tile,
so it wants every expert's rows contiguous and every tile to hold a single expert. Three Triton
launches, no atomics (so the result is deterministic and stable: within an expert, slots follow
n order) and no host synchronisation (every size is static, so it can be captured in a CUDA graph):

1. ``_block_histogram_kernel`` (grid NB = cdiv(N, BLOCK_N)): each program counts its BLOCK_N rows
   per expert with one-hot sums → ``hist[NB, E]``.
2. ``_scan_blocks_kernel`` (grid cdiv(E, BLOCK_E2)): for a slice of experts, an exclusive scan
   down the blocks → ``before[b, e]`` = rows of expert e in blocks before b (in place of hist);
   the column totals are ``counts_E``.
3. ``_scatter_kernel`` (grid cdiv(P, BLOCK_N)): every program rescans the padded counts
   (E values) → ``offsets_E1``; row n of block b goes to slot
   ``offsets[e] + before[b, e] + (rows of expert e before n inside block b)`` — that last rank is a
   pairwise compare inside the block. The same program writes N into the padding slots of its
   slot range and the owner expert of its blocks; program 0 writes ``offsets_E1`` and
   ``num_blocks_1``.

Worked example (tested): ``ids = [[2, 0], [0, 3]]``, E = 4, block_m = 16 → rows n = 0..3 go to
experts [2, 0, 0, 3]; counts = [2, 0, 1, 1]; padded = [16, 0, 16, 16];
offsets = [0, 16, 16, 32, 48]; static B = cdiv(4, 16) + min(4, 4) = 5, P = 80;
sorted_rows = [1, 2, 4 × 14 | 0, 4 × 15 | 3, 4 × 15 | 4 × 32] (4 = N marks padding);
slot_of = [16, 0, 1, 32]; block_expert = [0, 2, 3, -1, -1]; num_blocks = [3].
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from dispatch.checks import check_ids_in_range, check_launch
from dispatch.kernels import pdl
from dispatch.kernels.pdl import pdl_enter


@dataclass(frozen=True)
class SortedRoutes:
    """Where each routed row sits in expert-sorted, block-padded order (all int32, on device).

    sorted_rows_P  [P]   routed row n = t·K + k held by each slot; padding slots hold N
    block_expert_B [B]   expert of each block of ``block_m`` slots; -1 past the used blocks
    slot_of_N      [N]   slot of each routed row (inverse of sorted_rows_P); P for a row whose
                         id lies outside [0, E): such rows are in no expert's block
    counts_E       [E]   rows per expert (valid ids only)
    offsets_E1     [E+1] padded start slot per expert; offsets_E1[E] = used slots
    num_blocks_1   [1]   used blocks (= offsets_E1[E] / block_m), left on device
    Static sizes: B = cdiv(N, block_m) + min(E, N), P = B · block_m.
    """

    sorted_rows_P: torch.Tensor
    block_expert_B: torch.Tensor
    slot_of_N: torch.Tensor
    counts_E: torch.Tensor
    offsets_E1: torch.Tensor
    num_blocks_1: torch.Tensor
    num_tokens: int  # T
    top_k: int  # K
    num_experts: int  # E
    block_m: int

    @property
    def num_rows(self) -> int:  # N
        return self.num_tokens * self.top_k

    @property
    def max_blocks(self) -> int:  # B
        return self.block_expert_B.shape[0]


def static_sizes(num_rows: int, num_experts: int, block_m: int) -> tuple[int, int]:
    """(B, P) for N routed rows: the most blocks any routing can need, known without a sync."""
    B = triton.cdiv(num_rows, block_m) + min(num_experts, num_rows)
    return B, B * block_m


@triton.jit
def _load_ids(ids_ptr, n, N, E, stride_t, stride_k, K: tl.constexpr, other):
    """Expert of routed rows n (int32); ``other`` past N, -1 for an id outside [0, E) (compared
    before the int32 cast, so an int64 id of 2**32 is not read as expert 0)."""
    t = n // K
    e = tl.load(ids_ptr + t.to(tl.int64) * stride_t + (n - t * K) * stride_k, mask=n < N, other=other)
    return tl.where((e >= 0) & (e < E), e, tl.where(n < N, -1, other)).to(tl.int32)


# The row and block counts (N, NB, P, B) follow every step's token count: a kernel specialised on them
# (an int equal to 1, a multiple of 16, or neither) would compile again for steps a server's warm-up
# never ran. Nothing in these kernels gains from knowing them divisible, so they are plain ints.
@triton.jit(do_not_specialize=["N"])
def _block_histogram_kernel(ids_ptr, hist_ptr, N, E, stride_t, stride_k, K: tl.constexpr,
                            BLOCK_N: tl.constexpr, BLOCK_E: tl.constexpr, CHUNK: tl.constexpr,
                            PDL: tl.constexpr):
    pdl_enter(PDL)  # chapter 6: release the next kernel, wait for the ids
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_E)
    acc = tl.zeros([BLOCK_E], tl.int32)
    for r0 in tl.range(0, BLOCK_N, CHUNK):  # one-hot sums, CHUNK rows at a time
        n = pid * BLOCK_N + r0 + tl.arange(0, CHUNK)
        e = _load_ids(ids_ptr, n, N, E, stride_t, stride_k, K, -1)
        acc += tl.sum((e[:, None] == cols[None, :]).to(tl.int32), axis=0)
    tl.store(hist_ptr + pid * E + cols, acc, mask=cols < E)


@triton.jit(do_not_specialize=["NB"])
def _scan_blocks_kernel(hist_ptr, counts_ptr, NB, E, BLOCK_B: tl.constexpr, BLOCK_E2: tl.constexpr,
                        PDL: tl.constexpr):
    pdl_enter(PDL)
    cols = tl.program_id(0) * BLOCK_E2 + tl.arange(0, BLOCK_E2)
    cmask = cols < E
    carry = tl.zeros([BLOCK_E2], tl.int32)
    for b0 in tl.range(0, NB, BLOCK_B):  # exclusive scan down the blocks, in place
        b = b0 + tl.arange(0, BLOCK_B)
        m = (b < NB)[:, None] & cmask[None, :]
        ptrs = hist_ptr + b[:, None] * E + cols[None, :]
        h = tl.load(ptrs, mask=m, other=0)
        tl.store(ptrs, tl.cumsum(h, axis=0) - h + carry[None, :], mask=m)
        carry += tl.sum(h, axis=0)
    tl.store(counts_ptr + cols, carry, mask=cmask)


@triton.jit(do_not_specialize=["N", "P", "B"])
def _scatter_kernel(ids_ptr, before_ptr, counts_ptr, offsets_ptr, num_blocks_ptr, sorted_rows_ptr,
                    block_expert_ptr, slot_of_ptr, N, E, P, B, stride_t, stride_k, K: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_E: tl.constexpr,
                    CHUNK: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)
    pid = tl.program_id(0)
    i = tl.arange(0, BLOCK_N)
    n = pid * BLOCK_N + i  # this program's routed rows, and also its slots and its blocks
    e_n = _load_ids(ids_ptr, n, N, E, stride_t, stride_k, K, -1)
    nmask = (n < N) & (e_n >= 0)  # routed rows with a valid expert: the only ones given a slot

    # rank of row n among the rows of its expert earlier in this block (pairwise, CHUNK at a time)
    rank = tl.zeros([BLOCK_N], tl.int32)
    for j0 in tl.range(0, BLOCK_N, CHUNK):
        j = j0 + tl.arange(0, CHUNK)
        e_j = _load_ids(ids_ptr, pid * BLOCK_N + j, N, E, stride_t, stride_k, K, -2)
        same = (e_j[None, :] == e_n[:, None]) & (j[None, :] < i[:, None])
        rank += tl.sum(same.to(tl.int32), axis=1)
    before = tl.load(before_ptr + pid * E + e_n, mask=nmask, other=0)

    # padded exclusive scan of counts_E, BLOCK_E experts at a time; gathers done by comparison
    start_n = tl.zeros([BLOCK_N], tl.int32)  # offsets[e_n]
    real_s = tl.zeros([BLOCK_N], tl.int32)  # slot n holds a routed row (not padding)
    owner_b = tl.zeros([BLOCK_N], tl.int32)  # experts whose padded segment ends at or before block n
    carry = tl.sum(tl.zeros([BLOCK_E], tl.int32), axis=0)
    first = tl.where(pid == 0, E, 0)  # only program 0 stores offsets_E1 / num_blocks_1
    for e0 in tl.range(0, E, BLOCK_E):
        ec = e0 + tl.arange(0, BLOCK_E)
        em = ec < E
        c = tl.load(counts_ptr + ec, mask=em, other=0)
        padded = (c + BLOCK_M - 1) // BLOCK_M * BLOCK_M
        end = carry + tl.cumsum(padded, axis=0)
        start = end - padded
        start_n += tl.sum(tl.where(ec[None, :] == e_n[:, None], start[None, :], 0), axis=1)
        inside = (start[None, :] <= n[:, None]) & (n[:, None] < start[None, :] + c[None, :])
        real_s += tl.sum(inside.to(tl.int32), axis=1)
        owner_b += tl.sum(((end[None, :] <= n[:, None] * BLOCK_M) & em[None, :]).to(tl.int32), axis=1)
        tl.store(offsets_ptr + ec, start, mask=ec < first)
        carry += tl.sum(padded, axis=0)

    slot = start_n + before + rank
    tl.store(sorted_rows_ptr + slot, n, mask=nmask)
    tl.store(slot_of_ptr + n, tl.where(nmask, slot, P), mask=n < N)  # P: in no expert's block
    tl.store(sorted_rows_ptr + n, tl.zeros([BLOCK_N], tl.int32) + N, mask=(n < P) & (real_s == 0))
    tl.store(block_expert_ptr + n, tl.where(n * BLOCK_M < carry, owner_b, -1), mask=n < B)
    last = tl.arange(0, 2)  # [offsets_E1[E], num_blocks] from program 0
    tl.store(offsets_ptr + E + last, tl.zeros([2], tl.int32) + carry, mask=last < tl.where(pid == 0, 1, 0))
    tl.store(num_blocks_ptr + last, tl.zeros([2], tl.int32) + carry // BLOCK_M,
             mask=last < tl.where(pid == 0, 1, 0))


def default_block_n(num_rows: int) -> int:
    """Routed rows per program: about √N, a power of two in [16, 256]. The scatter's rank is a
    BLOCK_N² pairwise compare and its padded scan BLOCK_N × E, per program, over N / BLOCK_N programs:
    √N balances the two: a fixed 256 rows would make few programs at small N, each paying the
    full BLOCK_N² compare."""
    return min(256, max(16, 1 << (max(num_rows, 1).bit_length() - 1) // 2))


def _check_sort_inputs(ids_TK, num_experts, block_m, check_ids, *, triton_device=True) -> None:
    if not isinstance(ids_TK, torch.Tensor) or ids_TK.dim() != 2:
        got = tuple(ids_TK.shape) if isinstance(ids_TK, torch.Tensor) else type(ids_TK).__name__
        raise ValueError(f"ids must be a 2-d tensor [T, K], got {got}")
    if ids_TK.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"ids must be int32 or int64, got {ids_TK.dtype}")
    if triton_device:
        check_launch("sort_by_expert", ids_TK)
    if not isinstance(num_experts, int) or isinstance(num_experts, bool) or num_experts < 1:
        raise ValueError(f"num_experts must be a positive int, got {num_experts!r}")
    if not isinstance(block_m, int) or block_m < 16 or block_m & (block_m - 1):
        raise ValueError(f"block_m must be a power of two >= 16, got {block_m!r}")
    if ids_TK.shape[1] < 1:
        raise ValueError(f"ids must have K >= 1 columns, got shape {tuple(ids_TK.shape)}")
    if ids_TK.numel() >= 2**31 // 2:
        raise ValueError(f"too many routed rows for int32 slots: {ids_TK.numel()}")
    if check_ids:
        check_ids_in_range(ids_TK, num_experts)


def sort_by_expert(ids_TK: torch.Tensor, num_experts: int, block_m: int, *, check_ids: bool = False,
                   block_n: int | None = None) -> SortedRoutes:
    """Sort routed rows by expert, each expert's segment padded to ``block_m`` (3 launches, no sync).

    Args:
        ids_TK: expert of each (token, k) [T, K], int32 or int64, any strides.
        num_experts: E.  block_m: the grouped GEMM's rows per tile (power of two >= 16).
        check_ids: refuse ids outside [0, E) with a ValueError (a device→host sync). By default
            such rows are placed in no block (slot_of_N = P) and the sort stays sync-free.
        block_n: routed rows per program (power of two >= 16; default :func:`default_block_n`).
    Returns:
        :class:`SortedRoutes`. See the module docstring for a worked example.
    """
    _check_sort_inputs(ids_TK, num_experts, block_m, check_ids)
    if block_n is not None and (not isinstance(block_n, int) or block_n < 16 or block_n & (block_n - 1)):
        raise ValueError(f"block_n must be a power of two >= 16, got {block_n!r}")
    T, K = ids_TK.shape
    E, N = num_experts, T * K
    B, P = static_sizes(N, E, block_m)
    BLOCK_N = block_n or default_block_n(N)
    NB = triton.cdiv(N, BLOCK_N)
    # One allocation, cut into the outputs and the scratch hist[NB, E] (fewer host calls per sort);
    # each piece starts 16-byte aligned, as Triton's pointer specialisation prefers.
    sizes = (P, B, N, E, E + 1, 1, NB * E)
    starts = [0]
    for n in sizes:
        starts.append(starts[-1] + -(-n // 4) * 4)
    buf = torch.empty(starts[-1], dtype=torch.int32, device=ids_TK.device)
    sorted_rows_P, block_expert_B, slot_of_N, counts_E, offsets_E1, num_blocks_1, hist = (
        buf[a:a + n] for a, n in zip(starts, sizes, strict=False))
    if N == 0:
        buf.zero_()  # B = P = 0: only counts, offsets and num_blocks exist, all 0
    else:
        BLOCK_E = triton.next_power_of_2(E)
        st, sk = ids_TK.stride()
        launch = pdl.launch_kw(ids_TK.device)  # three short kernels: each releases the next at its start
        _block_histogram_kernel[(NB,)](ids_TK, hist, N, E, st, sk, K=K, BLOCK_N=BLOCK_N, BLOCK_E=BLOCK_E,
                                       CHUNK=max(1, min(BLOCK_N, 4096 // BLOCK_E)), **launch)
        BLOCK_E2 = min(32, BLOCK_E)  # hist becomes `before` in place
        _scan_blocks_kernel[(triton.cdiv(E, BLOCK_E2),)](hist, counts_E, NB, E, BLOCK_B=64, BLOCK_E2=BLOCK_E2,
                                                         **launch)
        _scatter_kernel[(triton.cdiv(P, BLOCK_N),)](
            ids_TK, hist, counts_E, offsets_E1, num_blocks_1, sorted_rows_P, block_expert_B, slot_of_N,
            N, E, P, B, st, sk, K=K, BLOCK_M=block_m, BLOCK_N=BLOCK_N, BLOCK_E=min(BLOCK_E, 32),
            CHUNK=min(BLOCK_N, 32), num_warps=8, **launch)
    return SortedRoutes(sorted_rows_P, block_expert_B, slot_of_N, counts_E, offsets_E1, num_blocks_1,
                        num_tokens=T, top_k=K, num_experts=E, block_m=block_m)


def sort_by_expert_torch(ids_TK: torch.Tensor, num_experts: int, block_m: int, *,
                         check_ids: bool = False) -> SortedRoutes:
    """The plain-PyTorch twin: counts by scatter-add, a stable argsort, a padded scan (no host sync).
    Rows with an id outside [0, E) sort last and get no slot (slot_of_N = P), as in the kernel."""
    _check_sort_inputs(ids_TK, num_experts, block_m, check_ids, triton_device=False)
    T, K = ids_TK.shape
    E, N = num_experts, T * K
    B, P = static_sizes(N, E, block_m)
    dev = ids_TK.device
    raw_N = ids_TK.reshape(-1).long()
    valid_N = (raw_N >= 0) & (raw_N < E)
    ids_N = torch.where(valid_N, raw_N, E)  # bad ids: a virtual expert E after all others, never stored
    counts_E = torch.zeros(E + 1, dtype=torch.long, device=dev).scatter_add_(0, ids_N, torch.ones_like(ids_N))[:E]
    padded_E = (counts_E + block_m - 1) // block_m * block_m
    offsets_E1 = torch.cat([padded_E.new_zeros(1), padded_E.cumsum(0)])
    order_N = torch.argsort(ids_N, stable=True)  # sorted position → n
    e_sorted = ids_N[order_N]
    first_E1 = torch.cat([counts_E.cumsum(0) - counts_E, counts_E.sum(0, keepdim=True)])  # starts in the argsort
    slot_sorted = offsets_E1[e_sorted] + torch.arange(N, device=dev) - first_E1[e_sorted]
    slot_sorted = torch.where(e_sorted < E, slot_sorted, P)
    sorted_rows_P = torch.full((P + 1,), N, dtype=torch.long, device=dev).scatter_(0, slot_sorted, order_N)[:P]
    slot_of_N = torch.empty(N, dtype=torch.long, device=dev).scatter_(0, order_N, slot_sorted)
    starts_B = torch.arange(B, device=dev) * block_m
    owner_B = torch.searchsorted(offsets_E1[1:], starts_B, right=True)
    block_expert_B = torch.where(starts_B < offsets_E1[E], owner_B, -1)
    i32 = torch.int32
    return SortedRoutes(sorted_rows_P.to(i32), block_expert_B.to(i32), slot_of_N.to(i32), counts_E.to(i32),
                        offsets_E1.to(i32), (offsets_E1[E:] // block_m).to(i32),
                        num_tokens=T, top_k=K, num_experts=E, block_m=block_m)
