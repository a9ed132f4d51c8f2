"""The speculative step's bookkeeping in two launches: prompt-lookup drafts, then accept + advance.

Shapes: B rows · S history positions · k drafts (k+1 verified positions). ``hist_BS`` int64 [B, S]
holds each row's tokens by position, ``last_B`` / ``pos_B`` the position of each row's last token.

    lookup_drafts(hist_BS, last_B, k, n_max, n_min) → drafts_BK int64 [B, k]
        exactly :func:`lookup` (its torch twin): the longest (n_max .. n_min), then latest,
        earlier occurrence of the row's last n tokens; the tokens after it, continued periodically;
        no match: the last token, k times. One program a row: it walks the ends e < last in tiles
        of BLOCK positions, L[e] = how many of the last n_max tokens the tokens ending at e repeat,
        and keeps the largest L·S + e (``tl.max``), as the torch twin does over all of S at once.
    accept_advance(hist_BS, pos_B, drafts_BK, picks_BK1, cap_B, tok_B=None) → adv_B int64 [B]
        :func:`dispatch.serve.acceptance.greedy_accept` given its argmaxes ``picks_BK1`` [B, k+1]
        (the target's tokens: n = the leading drafts equal to them, :func:`leading`) and then
        :func:`advance`: adv = min(n + 1, max(cap − pos, 0)), picks[:adv]
        written at pos+1 .. pos+adv, pos += adv in place. ``tok_B``: also set to hist[new pos].

The torch twins, which the serving code (:mod:`dispatch.serve.drafters`, :mod:`dispatch.serve.acceptance`,
:mod:`dispatch.serve.speculative`) runs without the kernels and the launchers run on a CPU without Triton's
interpreter: :func:`lookup` (``lookup_drafts_torch``), :func:`leading` and :func:`advance`
(``accept_advance_torch``).
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


def lookup_consts(S: int, n_max: int, k_max: int = MAX_K,
                  device=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The step-independent index tensors of :func:`lookup` for rows of S positions and up to k_max
    drafts: (window_idx [S · n_max]: position e − j of window e's j-th token back from its end,
    clamped at 0; ends [S]: e + 1; j: 0, 1, …). A drafter makes them once (``PromptLookup.bind``)."""
    e = torch.arange(S, device=device)
    j = torch.arange(max(n_max, k_max), device=device)
    return (e[:, None] - j[None, :n_max]).clamp(min=0).reshape(-1), e + 1, j


def lookup(hist_BS: torch.Tensor, last_B: torch.Tensor, k: int, n_max: int = 3, n_min: int = 1,
           consts: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Prompt-lookup drafts [B, k] (int64) from each row's tokens ``hist_BS[b, :last_B[b] + 1]``.

    For n = n_max .. n_min: the suffix is the row's last n tokens; a match is an earlier window
    equal to it that ends before the last token; the latest match wins, longer n first. Drafts:
    the tokens after the match, continued periodically once they reach the last token.
    Example: tokens [a, b, c, a, b] (last 4), n 2 → the match [a, b] at 0, drafts [c, a, b, c, …].

    All n at once, in a fixed number of tensor ops (kernels): for every end e < last, L[e] = how
    many of the row's last tokens (up to n_max) the tokens ending at e repeat; the match is the
    e of the largest L·S + e (longest, then latest), if L ≥ n_min. ``consts``: :func:`lookup_consts`.
    """
    if not 1 <= n_min <= n_max:
        raise ValueError(f"need 1 <= n_min <= n_max, got n_min={n_min}, n_max={n_max}")
    B, S = hist_BS.shape
    window_idx, ends, j = consts if consts is not None else lookup_consts(S, n_max, k, hist_BS.device)
    last = last_B.long()
    suffix_Bn = hist_BS.gather(1, (last[:, None] - j[None, :n_max]).clamp(min=0))  # last, last-1, …
    windows_BSn = hist_BS.index_select(1, window_idx).view(B, S, n_max)  # e, e-1, … per end e
    run_BS = (windows_BSn == suffix_Bn[:, None, :]).cumprod(dim=-1).sum(dim=-1)
    # at most e + 1 tokens end at e (the suffix then has them: e < last); ends at or past last count 0
    run_BS = torch.minimum(run_BS, ends).mul_(ends <= last[:, None])
    best = torch.add(ends - 1, run_BS, alpha=S).amax(dim=1)  # L·S + e of the longest, then latest
    found = best >= n_min * S
    end = best % S  # the match's last position: the drafts copy end + 1 .. last, then repeat
    period = (last - end).clamp(min=1)
    pos = torch.where(found[:, None], end[:, None] + 1 + j[None, :k] % period[:, None], last[:, None])
    return hist_BS.gather(1, pos)


def leading(accept_BK: torch.Tensor) -> torch.Tensor:
    """The number of leading True per row, int64 [B] (the drafts kept before the first refusal)."""
    return accept_BK.cumprod(dim=1).sum(dim=1)  # a bool cumprod counts in int64


def advance(hist_BS, pos_B, out_BK1, n_B, cap_B, offsets=None) -> torch.Tensor:
    """Write each row's emitted tokens ``out[b, :adv_b]`` at positions pos+1 .. pos+adv and move
    ``pos_B`` (in place) by adv = min(n + 1, cap − pos): the rows never pass their cap (the position
    of their last allowed token). Returns adv_B. The cache needs nothing more (:mod:`dispatch.serve.speculative`).
    ``offsets``: a tensor 0, 1, … of at least k+1 entries (made once by the caller; else here)."""
    k1 = out_BK1.shape[1]
    adv_B = torch.minimum(n_B + 1, (cap_B - pos_B).clamp(min=0))
    j = (offsets[:k1] if offsets is not None else torch.arange(k1, device=pos_B.device))[None, :]
    idx = (pos_B[:, None] + 1 + j).clamp(max=hist_BS.shape[1] - 1)
    keep = hist_BS.gather(1, idx)
    hist_BS.scatter_(1, idx, torch.where(j < adv_B[:, None], out_BK1, keep))
    pos_B.add_(adv_B)
    return adv_B


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
                           s_hb, s_hs, s_p, s_db, s_dk, s_pb, s_pk, s_c, s_t, s_a,
                           WRITE_TOK: tl.constexpr, WRITE_PICKS: tl.constexpr, BLOCK_K: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, BLOCK_K)
    picks = tl.load(picks_ptr + b * s_pb + j * s_pk, mask=j <= k, other=0)
    drafts = tl.load(drafts_ptr + b * s_db + j * s_dk, mask=j < k, other=0)
    n = tl.min(tl.where((j < k) & (drafts != picks), j, k), axis=0)  # drafts kept: the first refusal, or k
    pos = tl.load(pos_ptr + b * s_p)
    cap = tl.load(cap_ptr + b * s_c)
    adv = tl.minimum(n + 1, tl.maximum(cap - pos, 0))
    # the row's token at its new position, taken before any store: a load after the stores below
    # could run on another thread before the store that writes its address (no ordering between them)
    tok = tl.where(adv > 0, tl.sum(tl.where(j == adv - 1, picks, 0), axis=0), tl.load(hist_ptr + b * s_hb + pos * s_hs))
    idx = tl.minimum(pos + 1 + j, S - 1)
    tl.store(hist_ptr + b * s_hb + idx * s_hs, picks, mask=j < adv)
    tl.store(pos_ptr + b * s_p, pos + adv)
    tl.store(adv_ptr + b * s_a, adv)
    if WRITE_PICKS:  # the row of what the host reads: [adv, picks_0 .. picks_k]
        tl.store(adv_ptr + b * s_a + 1 + j, picks, mask=j <= k)
    if WRITE_TOK:
        tl.store(tok_ptr + b * s_t, tok)


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
    """The twin of :func:`lookup_drafts`: :func:`lookup`."""
    return lookup(hist_BS, last_B, k, n_max, n_min)


def lookup_drafts(hist_BS: torch.Tensor, last_B: torch.Tensor, k: int, n_max: int = 3, n_min: int = 1, *,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """Prompt-lookup drafts [B, k] int64 in one launch (module docstring); ``last_B`` int32/int64 [B]
    with every entry in [0, S). ``out``: an int64 [B, k] view to write them into (unit column stride:
    the verify step's ids after each row's token), returned."""
    B, S = _check_hist(hist_BS, last_B, out)
    if out is not None:
        _check_ints("out", out, (B, k))
        if k > 1 and out.stride(1) != 1:
            raise ValueError(f"out must have unit column stride, got strides {tuple(out.stride())}")
    _check_ints("last_B", last_B, (B,), (torch.int32, torch.int64))
    if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= MAX_K:
        raise ValueError(f"k must be an int in [0, {MAX_K}], got {k!r}")
    if not 1 <= n_min <= n_max <= MAX_N:
        raise ValueError(f"need 1 <= n_min <= n_max <= {MAX_N}, got n_min={n_min}, n_max={n_max}")
    if _torch_here(hist_BS, "lookup_drafts"):
        drafts = lookup_drafts_torch(hist_BS, last_B, k, n_max, n_min)
        return drafts if out is None else out.copy_(drafts)
    out = torch.empty(B, k, dtype=torch.int64, device=hist_BS.device) if out is None else out
    if B and k:
        _lookup_kernel[(B,)](hist_BS, last_B, out, S, k, n_min, hist_BS.stride(0), hist_BS.stride(1),
                             last_B.stride(0), out.stride(0), N_MAX=n_max, BLOCK=BLOCK,
                             BLOCK_K=triton.next_power_of_2(k), num_warps=4)
    return out


def accept_advance_torch(hist_BS, pos_B, drafts_BK, picks_BK1, cap_B, tok_B=None, res_BK2=None) -> torch.Tensor:
    """The twin of :func:`accept_advance`: greedy acceptance's count (:func:`leading`), then :func:`advance`."""
    adv_B = advance(hist_BS, pos_B, picks_BK1, leading(drafts_BK == picks_BK1[:, :-1]), cap_B)
    if tok_B is not None:
        tok_B.copy_(hist_BS.gather(1, pos_B[:, None])[:, 0])
    if res_BK2 is None:
        return adv_B
    res_BK2[:, 0].copy_(adv_B)
    res_BK2[:, 1:picks_BK1.shape[1] + 1].copy_(picks_BK1)
    return res_BK2[:, 0]


def accept_advance(hist_BS: torch.Tensor, pos_B: torch.Tensor, drafts_BK: torch.Tensor, picks_BK1: torch.Tensor,
                   cap_B: torch.Tensor, tok_B: torch.Tensor | None = None,
                   res_BK2: torch.Tensor | None = None) -> torch.Tensor:
    """Greedy acceptance and the rollback in one launch (module docstring). Every input int64; ``hist_BS``
    and ``pos_B`` (and ``tok_B`` [B], if given) are written in place. Returns adv_B int64 [B]; with
    ``res_BK2`` [B, ≥ k+2] (what the host reads of a step, unit column stride) adv lands in its column
    0 and the picks in columns 1 .. k+1, and adv_B is that column."""
    B, S = _check_hist(hist_BS, pos_B, drafts_BK, picks_BK1, cap_B, tok_B, res_BK2)
    check_tensor("drafts_BK", drafts_BK, dims=2)
    k = drafts_BK.shape[1]
    if not 0 <= k <= MAX_K:
        raise ValueError(f"drafts_BK must hold 0 to {MAX_K} drafts a row, got {k}")
    _check_ints("drafts_BK", drafts_BK, (B, k))
    _check_ints("picks_BK1", picks_BK1, (B, k + 1))
    for name, t in (("pos_B", pos_B), ("cap_B", cap_B)) + ((("tok_B", tok_B),) if tok_B is not None else ()):
        _check_ints(name, t, (B,))
    if res_BK2 is not None:
        check_tensor("res_BK2", res_BK2, dims=2)
        if res_BK2.dtype != torch.int64 or res_BK2.shape[0] != B or res_BK2.shape[1] < k + 2 or res_BK2.stride(1) != 1:
            raise ValueError(f"res_BK2 must be int64 [B={B}, >= k+2={k + 2}] with unit column stride, got "
                             f"{res_BK2.dtype} {tuple(res_BK2.shape)} strides {tuple(res_BK2.stride())}")
    if _torch_here(hist_BS, "accept_advance"):
        return accept_advance_torch(hist_BS, pos_B, drafts_BK, picks_BK1, cap_B, tok_B, res_BK2)
    adv = torch.empty(B, dtype=torch.int64, device=hist_BS.device) if res_BK2 is None else res_BK2
    if B:
        _accept_advance_kernel[(B,)](
            hist_BS, pos_B, drafts_BK, picks_BK1, cap_B, adv, tok_B if tok_B is not None else adv, S, k,
            hist_BS.stride(0), hist_BS.stride(1), pos_B.stride(0), drafts_BK.stride(0), drafts_BK.stride(1),
            picks_BK1.stride(0), picks_BK1.stride(1), cap_B.stride(0), tok_B.stride(0) if tok_B is not None else 0,
            adv.stride(0), WRITE_TOK=tok_B is not None, WRITE_PICKS=res_BK2 is not None,
            BLOCK_K=triton.next_power_of_2(k + 1), num_warps=1)
    return adv if res_BK2 is None else res_BK2[:, 0]
