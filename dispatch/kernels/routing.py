"""The router in one Triton launch: logits_TE → scores → (group-limited) top-K → weights_TK, ids_TK.

Each program owns a tile of ``BLOCK_T`` tokens × ``BLOCK_E`` experts (E padded to a power of two,
padded columns masked to -inf) and does, all in fp32 registers, its routing family's branch
(``MODE``: the family's ``mode`` in :mod:`dispatch.families`, the one table of them):

    softmax (OLMoE, Mixtral, Qwen):   p = softmax(logits);  choose top-K of p;  w = p
    sigmoid (DeepSeek-V3):  s = sigmoid(logits);  c = s + bias_E (choice only);
        group score = sum of the top-2 c in each of n_group groups; keep the best topk_group
        groups; choose top-K of c among the kept experts;  w = s (unbiased)
    topk_softmax (Cohere2-MoE):  choose top-K of the logits;  w = softmax of those K logits
    then optionally  w /= Σ_k w  (``norm_topk_prob``, where the family renormalises),  and
    w *= routed_scaling_factor.

Top-K is K passes of "argmax, then mask it out". Ties go to the lowest expert id (the argmax is
the smallest column index whose score equals the row maximum). A NaN score counts as the largest
(as in ``torch.topk``), so a token with NaN/Inf logits still gets K valid, distinct ids in [0, E),
with NaN weights: its output row is non-finite, as in the reference, and no other row changes.
``torch.topk`` documents no tie rule — on CPU it returns e.g. [2, 4, 1] for the scores
[1, 3, 3, 0, 3] — so with tied scores the weights agree with the reference while the ids may be
a different member of the tie. Tests use continuous random logits (ties have probability 0) plus
one explicit tie test of our rule.

Tiny example (OLMoE-style softmax, K = 2, no renormalisation)::

    logits = [[0., 1., 2., 3.]]  →  p = [0.032, 0.087, 0.237, 0.644]
    route → weights = [[0.644, 0.237]], ids = [[3, 2]]
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import custom_op

from dispatch import families
from dispatch.checks import check_launch, no_backward, via_op
from dispatch.config import MoEConfig
from dispatch.kernels import pdl
from dispatch.kernels.helpers import topk
from dispatch.kernels.pdl import pdl_enter
from dispatch.reference import route_reference

_TILE = 2048  # BLOCK_T × BLOCK_E elements per program: ~16 fp32 per thread and tensor at 4 warps
# the kernel's MODE of each routing family (dispatch.families holds the numbers)
SIGMOID = tl.constexpr(families.get("sigmoid").mode)
TOPK_SOFTMAX = tl.constexpr(families.get("topk_softmax").mode)


@triton.jit
def _route_kernel(logits_ptr, bias_ptr, weights_ptr, ids_ptr, T, E, stride_t, stride_e, stride_b,
                  scaling,
                  K: tl.constexpr, MODE: tl.constexpr, HAS_BIAS: tl.constexpr, RENORM: tl.constexpr,
                  GROUPS: tl.constexpr, GROUP_SIZE: tl.constexpr, TOPK_GROUP: tl.constexpr,
                  BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
                  BLOCK_G: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)
    pid = tl.program_id(0)
    rows = pid * BLOCK_T + tl.arange(0, BLOCK_T)  # [BLOCK_T] token ids
    cols = tl.arange(0, BLOCK_E)  # [BLOCK_E] expert ids
    rmask = rows < T
    cmask = cols < E
    ptrs = logits_ptr + rows[:, None].to(tl.int64) * stride_t + cols[None, :] * stride_e
    x = tl.load(ptrs, mask=rmask[:, None] & cmask[None, :], other=0.0).to(tl.float32)
    real = (rows[:, None] >= 0) & cmask[None, :]  # [BLOCK_T, BLOCK_E]: the E real columns
    neg_inf = float("-inf")

    if MODE == SIGMOID:
        scores = 1.0 / (1.0 + tl.exp(-x))
        choice = scores
        if HAS_BIAS:
            bias = tl.load(bias_ptr + cols * stride_b, mask=cmask, other=0.0).to(tl.float32)
            choice = scores + bias[None, :]
    elif MODE == TOPK_SOFTMAX:  # choose on the logits themselves; the softmax comes after the top-K
        x = tl.where(real, x, neg_inf)
        scores = x
        choice = x
    else:  # softmax
        x = tl.where(real, x, neg_inf)
        p = tl.exp(x - tl.max(x, axis=1)[:, None])
        scores = p / tl.sum(p, axis=1)[:, None]
        choice = scores

    # NaN sorts above everything (as in torch.topk): a non-finite token still gets K valid,
    # distinct ids, and its weights (taken from ``scores``) stay NaN.
    choice = tl.where(choice != choice, float("inf"), choice)
    avail = real  # experts that may still be chosen
    if GROUPS > 1:  # DeepSeek-V3 group-limited selection
        grp = cols // GROUP_SIZE
        gcols = tl.arange(0, BLOCK_G)
        gscore = tl.full([BLOCK_T, BLOCK_G], neg_inf, tl.float32)
        for g in tl.static_range(GROUPS):
            cg = tl.where(real & (grp == g)[None, :], choice, neg_inf)
            m1 = tl.max(cg, axis=1)
            i1 = tl.min(tl.where(cg == m1[:, None], cols[None, :], BLOCK_E), axis=1)
            sg = m1
            if GROUP_SIZE > 1:  # + the second best of the group (top-2 sum)
                sg = m1 + tl.max(tl.where(cols[None, :] == i1[:, None], neg_inf, cg), axis=1)
            gscore = tl.where(gcols[None, :] == g, sg[:, None], gscore)
        keep_g = (gcols[None, :] < 0) & (rows[:, None] >= 0)  # all False, [BLOCK_T, BLOCK_G]
        gfree = (gcols[None, :] < GROUPS) & (rows[:, None] >= 0)
        for _ in tl.static_range(TOPK_GROUP):
            gs = tl.where(gfree, gscore, neg_inf)
            mg = tl.max(gs, axis=1)
            ig = tl.min(tl.where(gfree & (gs == mg[:, None]), gcols[None, :], BLOCK_G), axis=1)
            ghit = gcols[None, :] == ig[:, None]
            keep_g = keep_g | ghit
            gfree = gfree & (ghit == 0)
        keep_e = real & (cols[None, :] < 0)  # all False
        for g in tl.static_range(GROUPS):
            kept = tl.max(tl.where(gcols[None, :] == g, keep_g.to(tl.int32), 0), axis=1) > 0
            keep_e = keep_e | (kept[:, None] & (grp == g)[None, :])
        avail = real & keep_e

    w_acc, id_acc = topk(choice, scores, avail, cols, K, BLOCK_T, BLOCK_E, BLOCK_K)  # ties -> lowest expert id
    kcols = tl.arange(0, BLOCK_K)
    if MODE == TOPK_SOFTMAX:  # w = the K chosen logits → their softmax (columns K.. stay out of it)
        top = tl.where(kcols[None, :] < K, w_acc, neg_inf)
        e = tl.exp(top - tl.max(top, axis=1)[:, None])
        w_acc = e / tl.sum(e, axis=1)[:, None]
    if RENORM:
        tot = tl.sum(w_acc, axis=1)
        if MODE == SIGMOID:
            tot = tot + 1e-20  # as DeepSeek-V3 (and the reference) does
        w_acc = w_acc / tot[:, None]
    w_acc = w_acc * scaling
    out = rows[:, None].to(tl.int64) * K + kcols[None, :]
    omask = rmask[:, None] & (kcols[None, :] < K)
    tl.store(weights_ptr + out, w_acc, mask=omask)
    tl.store(ids_ptr + out, id_acc, mask=omask)


def _check_route_inputs(logits_TE, cfg, bias_E, *, triton_device: bool = True) -> None:
    if not isinstance(cfg, MoEConfig):
        raise ValueError(f"cfg must be a dispatch.MoEConfig, got {type(cfg).__name__}")
    if not isinstance(logits_TE, torch.Tensor):
        raise ValueError(f"logits must be a torch.Tensor, got {type(logits_TE).__name__}")
    if logits_TE.dim() != 2 or logits_TE.shape[1] != cfg.num_experts:
        raise ValueError(f"logits must have shape [T, E={cfg.num_experts}], got {tuple(logits_TE.shape)}")
    if logits_TE.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"logits must be float32, float16 or bfloat16, got {logits_TE.dtype}")
    if triton_device:
        check_launch("route", logits_TE, widens_bf16=True)
    if cfg.correction_bias and bias_E is None:
        raise ValueError("this config uses a correction bias (correction_bias=True): pass bias_E of shape [E]")
    if bias_E is not None:
        if not families.get(cfg.scoring).correction_bias:
            raise ValueError(f"bias_E (a selection bias) is not read by scoring={cfg.scoring!r} routing")
        if not isinstance(bias_E, torch.Tensor) or tuple(bias_E.shape) != (cfg.num_experts,):
            got = tuple(bias_E.shape) if isinstance(bias_E, torch.Tensor) else type(bias_E).__name__
            raise ValueError(f"bias_E must be a tensor of shape [E={cfg.num_experts}], got {got}")
        if not bias_E.is_floating_point():
            raise ValueError(f"bias_E must be floating point, got {bias_E.dtype}")
        if bias_E.device != logits_TE.device:
            raise ValueError(f"bias_E is on {bias_E.device} but logits are on {logits_TE.device}")


def route(logits_TE: torch.Tensor, cfg: MoEConfig, bias_E: torch.Tensor | None = None):
    """Route T tokens to K of E experts in one Triton launch.

    Args:
        logits_TE: router logits [T, E], fp32/fp16/bf16, any strides (CUDA, or CPU under the
            interpreter — there bf16 is widened to fp32 first, as the interpreter mis-loads bf16).
        cfg: the layer's :class:`MoEConfig` (its routing family, top_k, norm_topk_prob, groups, scaling).
        bias_E: DeepSeek-V3 correction bias [E] (required iff ``cfg.correction_bias``).
    Returns:
        weights_TK fp32 [T, K] and ids_TK int32 [T, K]; k = 0 is each token's best choice.
        Ties go to the lowest expert id (see the module docstring).
    """
    _check_route_inputs(logits_TE, cfg, bias_E)
    if logits_TE.device.type == "cpu" and logits_TE.dtype == torch.bfloat16:
        logits_TE = logits_TE.float()
    if bias_E is not None and bias_E.device.type == "cpu" and bias_E.dtype == torch.bfloat16:
        bias_E = bias_E.float()
    family = families.get(cfg.scoring)
    op = torch.ops.dispatch.route if via_op(logits_TE, bias_E) else _route_impl
    return op(logits_TE, bias_E, cfg.top_k, family.mode, cfg.norm_topk_prob and family.renorm,
              cfg.n_group, cfg.topk_group, float(cfg.routed_scaling_factor))


def _route_impl(logits_TE: torch.Tensor, bias_E: torch.Tensor | None, K: int, mode: int, renorm: bool,
                n_group: int, topk_group: int, scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
    T, E = logits_TE.shape
    weights_TK = torch.empty(T, K, dtype=torch.float32, device=logits_TE.device)
    ids_TK = torch.empty(T, K, dtype=torch.int32, device=logits_TE.device)
    if T == 0:
        return weights_TK, ids_TK
    BLOCK_E = triton.next_power_of_2(E)
    BLOCK_T = max(1, min(triton.next_power_of_2(T), _TILE // BLOCK_E))
    _route_kernel[(triton.cdiv(T, BLOCK_T),)](
        logits_TE, bias_E if bias_E is not None else logits_TE, weights_TK, ids_TK,
        T, E, logits_TE.stride(0), logits_TE.stride(1), bias_E.stride(0) if bias_E is not None else 0, scaling,
        K=K, MODE=mode, HAS_BIAS=bias_E is not None, RENORM=renorm,
        GROUPS=n_group, GROUP_SIZE=E // n_group, TOPK_GROUP=topk_group,
        BLOCK_T=BLOCK_T, BLOCK_E=BLOCK_E, BLOCK_K=triton.next_power_of_2(K),
        BLOCK_G=triton.next_power_of_2(n_group), num_warps=4, **pdl.launch_kw(logits_TE.device))
    return weights_TK, ids_TK


_route_op = custom_op("dispatch::route", _route_impl, mutates_args=())


@_route_op.register_fake
def _(logits_TE, bias_E, K, mode, renorm, n_group, topk_group, scaling):
    T = logits_TE.shape[0]
    return (logits_TE.new_empty(T, K, dtype=torch.float32), logits_TE.new_empty(T, K, dtype=torch.int32))


no_backward(_route_op, "dispatch.kernels.routing.route")


def route_torch(logits_TE: torch.Tensor, cfg: MoEConfig, bias_E: torch.Tensor | None = None):
    """The plain-PyTorch twin of :func:`route`: the reference router with int32 ids."""
    _check_route_inputs(logits_TE, cfg, bias_E, triton_device=False)
    weights_TK, ids_TK = route_reference(logits_TE, cfg, bias_E)
    return weights_TK.float(), ids_TK.to(torch.int32)
