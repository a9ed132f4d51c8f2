"""The speculative step's bookkeeping in two launches: prompt-lookup drafts, then accept + advance.

Shapes: B rows · S history positions · k drafts (k+1 verified positions). ``hist_BS`` int64 [B, S]
holds each row's tokens by position, ``last_B`` / ``pos_B`` the position of each row's last token.

    lookup_drafts(hist_BS, last_B, k, n_max, n_min) → drafts_BK int64 [B, k]
        exactly :func:`dispatch.serve.drafters.lookup`: the longest (n_max .. n_min), then latest,
        earlier occurrence of the row's last n tokens; the tokens after it, continued periodically;
        no match: the last token, k times. One program a row: it walks the ends e < last in tiles
        of BLOCK positions, L[e] = how many of the last n_max tokens the tokens ending at e repeat,
        and keeps the largest L·S + e (``tl.max``), as the torch twin does over all of S at once.
    accept_advance(hist_BS, pos_B, drafts_BK, picks_BK1, cap_B, tok_B=None) → adv_B int64 [B]
        :func:`dispatch.serve.acceptance.greedy_accept` given its argmaxes ``picks_BK1`` [B, k+1]
        (the target's tokens: n = the leading drafts equal to them) and then
        :func:`dispatch.serve.speculative.advance`: adv = min(n + 1, max(cap − pos, 0)), picks[:adv]
        written at pos+1 .. pos+adv, pos += adv in place. ``tok_B``: also set to hist[new pos].

The twins, also what runs on a CPU without Triton's interpreter: ``lookup_drafts_torch``,
``accept_advance_torch`` (the serving code's own functions, composed).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from dispatch import runtime
from dispatch.checks import check_launch, check_tensor

MAX_K = 16  # the most drafts a step (SpeculativeEngine's bound)
MAX_N = 8  # the longest n-gram a lookup matches
BLOCK = 256  # history positions a lookup tile


@triton.jit
def _lookup_kernel(hist_ptr, last_ptr, out_ptr, S, k, n_min, s_hb, s_hs, s_l, s_ob,
                   N_MAX: tl.constexpr, BLOCK: tl.constexpr, BLOCK_K: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    row = hist_ptr + b * s_hb
    last = tl.load(last_ptr + b * s_l).to(tl.int32)
    best = tl.max(tl.full((BLOCK,), -1, tl.int32), axis=0)  # L·S + e of the best end so far
    for start in range(0, last, BLOCK):  # only ends e < last can match
        e = start + tl.arange(0, BLOCK)
        live = e < last
        run = tl.zeros((BLOCK,), tl.int32)  # leading tokens of the window ending at e that repeat the suffix
        alive = live
        for j in tl.static_range(N_MAX):
            sfx = tl.load(row + tl.maximum(last - j, 0).to(tl.int64) * s_hs)
            w = tl.load(row + tl.maximum(e - j, 0).to(tl.int64) * s_hs, mask=live, other=0)
            alive = alive & (w == sfx)
            run += alive.to(tl.int32)
        run = tl.minimum(run, e + 1)  # at most e + 1 tokens end at e
        best = tl.maximum(best, tl.max(tl.where(live, run * S + e, -1), axis=0))
    found = best >= n_min * S
    end = tl.where(found, best % S, 0)
    period = tl.maximum(last - end, 1)
    j = tl.arange(0, BLOCK_K)
    pos = tl.where(found, end + 1 + j % period, last)
    toks = tl.load(row + pos.to(tl.int64) * s_hs, mask=j < k, other=0)
    tl.store(out_ptr + b * s_ob + j, toks, mask=j < k)


@triton.jit
def _accept_advance_kernel(hist_ptr, pos_ptr, drafts_ptr, picks_ptr, cap_ptr, adv_ptr, tok_ptr, S, k,
                           s_hb, s_hs, s_p, s_db, s_dk, s_pb, s_pk, s_c, s_t,
                           WRITE_TOK: tl.constexpr, BLOCK_K: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, BLOCK_K)
    picks = tl.load(picks_ptr + b * s_pb + j * s_pk, mask=j <= k, other=0)
    drafts = tl.load(drafts_ptr + b * s_db + j * s_dk, mask=j < k, other=0)
    n = tl.min(tl.where((j < k) & (drafts != picks), j, k), axis=0)  # drafts kept: the first refusal, or k
    pos = tl.load(pos_ptr + b * s_p)
    cap = tl.load(cap_ptr + b * s_c)
    adv = tl.minimum(n + 1, tl.maximum(cap - pos, 0))
    idx = tl.minimum(pos + 1 + j, S - 1)
    tl.store(hist_ptr + b * s_hb + idx * s_hs, picks, mask=j < adv)
    new = pos + adv
    tl.store(pos_ptr + b * s_p, new)
    tl.store(adv_ptr + b, adv)
    if WRITE_TOK:
        tl.store(tok_ptr + b * s_t, tl.load(hist_ptr + b * s_hb + new * s_hs))


def _check_ints(name: str, t, shape: tuple[int, ...], dtypes=(torch.int64,)) -> None:
    check_tensor(name, t, dims=len(shape))
    if t.dtype not in dtypes or tuple(t.shape) != shape:
        want = "/".join(str(d).removeprefix("torch.") for d in dtypes)
        raise ValueError(f"{name} must be {want} of shape {list(shape)}, got {t.dtype} {tuple(t.shape)}")


def _check_hist(hist_BS, *others) -> tuple[int, int]:
    check_tensor("hist_BS", hist_BS, dims=2)
    if hist_BS.dtype != torch.int64 or hist_BS.shape[1] == 0:
        raise ValueError(f"hist_BS must be int64 [B, S >= 1], got {hist_BS.dtype} {tuple(hist_BS.shape)}")
    devices = {t.device for t in (hist_BS, *others) if isinstance(t, torch.Tensor)}
    if len(devices) > 1:
        raise ValueError(f"all inputs must be on one device, got {sorted(map(str, devices))}")
    return hist_BS.shape


def _torch_here(t: torch.Tensor, what: str) -> bool:
    """Run the twin? On a CPU without Triton's interpreter; elsewhere the kernel, if it can run."""
    if t.device.type == "cpu" and not runtime.INTERPRET:
        return True
    check_launch(what, t)
    return False


def lookup_drafts_torch(hist_BS, last_B, k: int, n_max: int = 3, n_min: int = 1) -> torch.Tensor:
    """The twin of :func:`lookup_drafts`: :func:`dispatch.serve.drafters.lookup`."""
    from dispatch.serve.drafters import lookup

    return lookup(hist_BS, last_B, k, n_max, n_min)


def lookup_drafts(hist_BS: torch.Tensor, last_B: torch.Tensor, k: int, n_max: int = 3, n_min: int = 1) -> torch.Tensor:
    """Prompt-lookup drafts [B, k] int64 in one launch (module docstring); ``last_B`` int32/int64 [B]
    with every entry in [0, S)."""
    B, S = _check_hist(hist_BS, last_B)
    _check_ints("last_B", last_B, (B,), (torch.int32, torch.int64))
    if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= MAX_K:
        raise ValueError(f"k must be an int in [0, {MAX_K}], got {k!r}")
    if not 1 <= n_min <= n_max <= MAX_N:
        raise ValueError(f"need 1 <= n_min <= n_max <= {MAX_N}, got n_min={n_min}, n_max={n_max}")
    if _torch_here(hist_BS, "lookup_drafts"):
        return lookup_drafts_torch(hist_BS, last_B, k, n_max, n_min)
    out = torch.empty(B, k, dtype=torch.int64, device=hist_BS.device)
    if B and k:
        _lookup_kernel[(B,)](hist_BS, last_B, out, S, k, n_min, hist_BS.stride(0), hist_BS.stride(1),
                             last_B.stride(0), out.stride(0), N_MAX=n_max, BLOCK=BLOCK,
                             BLOCK_K=triton.next_power_of_2(k), num_warps=4)
    return out


def accept_advance_torch(hist_BS, pos_B, drafts_BK, picks_BK1, cap_B, tok_B=None) -> torch.Tensor:
    """The twin of :func:`accept_advance`: greedy acceptance's count, then
    :func:`dispatch.serve.speculative.advance`."""
    from dispatch.serve.acceptance import leading
    from dispatch.serve.speculative import advance

    adv_B = advance(hist_BS, pos_B, picks_BK1, leading(drafts_BK == picks_BK1[:, :-1]), cap_B)
    if tok_B is not None:
        tok_B.copy_(hist_BS.gather(1, pos_B[:, None])[:, 0])
    return adv_B


def accept_advance(hist_BS: torch.Tensor, pos_B: torch.Tensor, drafts_BK: torch.Tensor, picks_BK1: torch.Tensor,
                   cap_B: torch.Tensor, tok_B: torch.Tensor | None = None) -> torch.Tensor:
    """Greedy acceptance and the rollback in one launch (module docstring). Every input int64; ``hist_BS``
    and ``pos_B`` (and ``tok_B`` [B], if given) are written in place. Returns adv_B int64 [B]."""
    B, S = _check_hist(hist_BS, pos_B, drafts_BK, picks_BK1, cap_B, tok_B)
    check_tensor("drafts_BK", drafts_BK, dims=2)
    k = drafts_BK.shape[1]
    if not 0 <= k <= MAX_K:
        raise ValueError(f"drafts_BK must hold 0 to {MAX_K} drafts a row, got {k}")
    _check_ints("drafts_BK", drafts_BK, (B, k))
    _check_ints("picks_BK1", picks_BK1, (B, k + 1))
    for name, t in (("pos_B", pos_B), ("cap_B", cap_B)) + ((("tok_B", tok_B),) if tok_B is not None else ()):
        _check_ints(name, t, (B,))
    if _torch_here(hist_BS, "accept_advance"):
        return accept_advance_torch(hist_BS, pos_B, drafts_BK, picks_BK1, cap_B, tok_B)
    adv = torch.empty(B, dtype=torch.int64, device=hist_BS.device)
    if B:
        _accept_advance_kernel[(B,)](
            hist_BS, pos_B, drafts_BK, picks_BK1, cap_B, adv, tok_B if tok_B is not None else adv, S, k,
            hist_BS.stride(0), hist_BS.stride(1), pos_B.stride(0), drafts_BK.stride(0), drafts_BK.stride(1),
            picks_BK1.stride(0), picks_BK1.stride(1), cap_B.stride(0), tok_B.stride(0) if tok_B is not None else 0,
            WRITE_TOK=tok_B is not None, BLOCK_K=triton.next_power_of_2(k + 1), num_warps=1)
    return adv
