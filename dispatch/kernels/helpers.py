"""The ``@triton.jit`` pieces several kernels share, each written once:

    gated(g, u, ACT)       the gated activation of a gate/up tile pair, fp32 in registers: SwiGLU,
                           GeGLU (exact or tanh), the ``ACT`` code of :mod:`dispatch.activations` (the
                           up kernels' epilogue: grouped GEMM, decode, one launch, split items)
    topk(...)              K passes of "argmax, then mask it out" over rows of expert scores, ties to
                           the lowest expert id, NaN first (the router, the fused batch-1 router)
    routed_ok(...)         which tokens' row k counts: a routed row whose id lies in [0, E) (a bad id
                           adds nothing: selected away, never multiplied), or a shared expert's row
    k_order_sum(...)       y[t] = Σ_k rows[t·(K+NS) + k] in k order, fp32 from zero: the one k-order
                           combine of rows in memory (``combine``, the one-launch decode's last step)
    softmax_step(...)      one key tile of attention's online softmax: the running max, sum and
                           weighted sum of values updated (the decode and paged attention kernels)

The kernels that weight partial sums on the fly (the split decode's reduction, the fused batch-1
down kernel) take each row's validity from :func:`routed_ok` and add in the same k order.
"""
import triton
import triton.language as tl

from dispatch import activations

# the ACT codes of the gated activations (dispatch.activations holds the numbers)
GELU = tl.constexpr(activations.get("gelu").code)
GELU_TANH = tl.constexpr(activations.get("gelu_tanh").code)


@triton.jit
def gated(g, u, ACT: tl.constexpr):
    """act(g) · u of two fp32 tiles, ``ACT`` the activation's code (:mod:`dispatch.activations`):
    SILU g · sigmoid(g) (SwiGLU); GELU g · Φ(g) = ½ g (1 + erf(g / √2)); GELU_TANH ½ g (1 + tanh(z)),
    z = √(2/π) (g + 0.044715 g³), written g · sigmoid(2z) (the same function: Triton has no tanh)."""
    if ACT == GELU:
        h = 0.5 * g * (1.0 + tl.math.erf(g * 0.7071067811865476)) * u
    elif ACT == GELU_TANH:
        h = g * tl.sigmoid(1.5957691216057308 * (g + 0.044715 * g * g * g)) * u
    else:
        h = g * tl.sigmoid(g) * u
    return h


@triton.jit
def topk(choice, scores, avail, cols, K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr,
         BLOCK_K: tl.constexpr):
    """Top-K of each row of ``choice`` [BLOCK_T, BLOCK_E] (fp32) among the ``avail``able experts: K
    passes of argmax, each masking its pick out; ties to the lowest column, and a NaN choice must
    arrive as +inf (it then ranks first: a non-finite token still gets K valid, distinct ids).
    → (weights [BLOCK_T, BLOCK_K]: ``scores`` at the picks, fp32; ids [BLOCK_T, BLOCK_K] int32);
    columns K.. of both are 0."""
    neg_inf = float("-inf")
    kcols = tl.arange(0, BLOCK_K)
    w_acc = tl.zeros([BLOCK_T, BLOCK_K], tl.float32)
    id_acc = tl.zeros([BLOCK_T, BLOCK_K], tl.int32)
    for k in tl.range(K):
        c = tl.where(avail, choice, neg_inf)
        m = tl.max(c, axis=1)
        idx = tl.min(tl.where(avail & (c == m[:, None]), cols[None, :], BLOCK_E), axis=1)
        hit = cols[None, :] == idx[:, None]
        w = tl.sum(tl.where(hit, scores, 0.0), axis=1)  # the one score picked: exact
        avail = avail & (hit == 0)
        w_acc = tl.where(kcols[None, :] == k, w[:, None], w_acc)
        id_acc = tl.where(kcols[None, :] == k, idx[:, None], id_acc)
    return w_acc, id_acc


@triton.jit
def routed_ok(ids_ptr, offs_t, mask_t, k, K, E, s_it, s_ik):
    """[BLOCK_T] bools: does row k of tokens ``offs_t`` count? For k < K, where ids_TK[t, k] lies in
    [0, E) (the id is loaded only there); for k ≥ K (a shared expert riding along) wherever mask_t."""
    routed = (offs_t * 0 + k) < K
    e = tl.load(ids_ptr + offs_t * s_it + k * s_ik, mask=mask_t & routed, other=0)
    return mask_t & (((e >= 0) & (e < E)) | ~routed)


@triton.jit
def k_order_sum(out_ptr, ids_ptr, offs_t, mask_t, offs_h, mask_h, K, E, s_on, s_oh, s_it, s_ik,
                NS: tl.constexpr, KP: tl.constexpr, HAS_IDS: tl.constexpr, CACHE: tl.constexpr,
                BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr):
    """[BLOCK_T, BLOCK_H] fp32: Σ_k out[t·(K+NS) + k, offs_h] for k = 0 .. K+NS-1 in that order (KP ≥
    K+NS bounds the unrolled loop), added to a zero fp32 accumulator. A row whose id is outside
    [0, E) is selected away (``HAS_IDS``; its memory may be unwritten); the NS shared rows after each
    token's K always count. ``CACHE``: the loads' cache modifier (".cg" for rows other programs wrote)."""
    acc = tl.zeros([BLOCK_T, BLOCK_H], dtype=tl.float32)
    for k in tl.static_range(KP):
        if k < K + NS:
            ok = mask_t
            if HAS_IDS:
                ok = routed_ok(ids_ptr, offs_t, mask_t, k, K, E, s_it, s_ik)
            rows = (offs_t * (K + NS) + k).to(tl.int64)
            row = tl.load(out_ptr + rows[:, None] * s_on + offs_h[None, :] * s_oh,
                          mask=mask_t[:, None] & mask_h[None, :], other=0.0, cache_modifier=CACHE)
            acc += tl.where(ok[:, None], row.to(tl.float32), 0.0)
    return acc


@triton.jit
def softmax_step(qk, v, m_i, l_i, acc, PREC: tl.constexpr):
    """One key tile of the online softmax. ``qk`` [ROWS, KEYS]: scores times log2(e), masked keys
    -inf, each row holding at least one key; ``v`` [KEYS, D] their values. Returns the running max
    m_i, sum l_i of exp2(score - m_i) and acc, the sum of exp2(score - m_i) · v, updated (fp32)."""
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(qk - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
    return m_new, l_i, acc
