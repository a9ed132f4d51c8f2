"""The one MoE layer: a function (:func:`moe`) and a module (:class:`MoELayer`) that pick a path.

    y = moe(x, cfg, w)                              # x [T, H] or [B, S, H]
    layer = MoELayer(cfg, w); y = layer(x)          # weights validated once, here
    layer = MoELayer.from_hf(block, hf_config)      # a transformers MoE block
    ref = MoELayer(cfg, w, path="torch")            # the reference layer (``moe_reference``) as a module

Paths (``path=``):
    "torch"   the plain-PyTorch reference: bitwise ``dispatch.reference.moe_reference``; autograd works
    "triton"  routing kernel → sort → grouped GEMM up+SwiGLU → grouped down×weight → combine
    "decode"  routing kernel → the grouped-GEMV decode kernels (``dispatch.kernels.gemv``)
    "auto"    on a GPU: "decode" for T ≤ the shape's crossover (``tiles.resolve("crossover", ...)``: the
              device's tuned table, else DECODE_MAX_TOKENS), else "triton"; on CPU: "torch" (Triton's
              interpreter is for tests: it runs only when asked for with "triton" or "decode")
``tiles=`` pins the chosen path's tiles: a ``GemmConfig`` for "triton", a ``DecodeConfig`` for "decode"
(a mismatch is a ValueError); unpinned, they come from the tile resolver (:func:`dispatch.kernels.tiles.resolve`).
The shared expert runs in torch, except on "decode" where it is ungated with S a multiple of I (DeepSeek-MoE's):
there it rides along in the decode kernels as S / I more experts (``moe_decode(shared=)``, one pass over all
the weights; :func:`shared_rides_along`). The router matmul runs in torch too, except on the kernel paths on a GPU
at <= 16 tokens (a routing family with the router GEMV fast path, :mod:`dispatch.families`): there it is the
decode step's GEMV (``dense_gemv.linear_small``), one
launch that programmatic dependent launch chains to its neighbours (``dispatch.kernels.pdl``).
The kernel paths are ``torch.library`` ops: ``torch.compile`` traces through them, CUDA graphs capture
them (no host sync), and a backward through them raises (train with path="torch").
Bad ids and non-finite tokens: see :mod:`dispatch.checks` (``check_ids=True`` to raise).
"""
from __future__ import annotations

import torch
from torch import nn

from dispatch import families
from dispatch.checks import check_launch
from dispatch.config import MoEConfig, MoEWeights, _kind
from dispatch.hf import config_from_hf, weights_from_hf
from dispatch.kernels.dense_gemv import MAX_ROWS, linear_small
from dispatch.kernels.gemv import moe_decode
from dispatch.kernels.grouped_gemm import moe_experts
from dispatch.kernels.routing import route
from dispatch.kernels.tiles import DECODE_MAX_TOKENS, DecodeConfig, GemmConfig, resolve
from dispatch.reference import check_input, experts_reference, route_reference, router_logits, shared_reference

PATHS = ("auto", "triton", "decode", "torch")
TILES = {"triton": GemmConfig, "decode": DecodeConfig}  # the tile config each kernel path takes


def pick_path(x_TH: torch.Tensor, path: str = "auto", crossover: int = DECODE_MAX_TOKENS) -> str:
    """Which path runs ``x_TH`` [T, H] (ValueError for a path that cannot run it here). ``crossover``:
    "auto" takes "decode" for T ≤ it (``tiles.resolve("crossover", ...)`` per shape)."""
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    if path == "auto":
        if not x_TH.is_cuda:
            return "torch"
        return "decode" if x_TH.shape[0] <= crossover else "triton"
    if path != "torch":
        check_launch(f"path={path!r}", x_TH)
    return path


def _check_tiles(tiles, path: str, chosen: str) -> None:
    if tiles is None:
        return
    want = TILES.get(chosen)
    if want is None or not isinstance(tiles, want):
        kinds = ", ".join(f"{cls.__name__} for path={p!r}" for p, cls in TILES.items())
        how = f"path={path!r} chose {chosen!r}" if path != chosen else f"path={path!r}"
        raise ValueError(f"tiles must match the path ({kinds}); {how}, got tiles={tiles!r}")


def kernel_router_logits(x_TH: torch.Tensor, cfg: MoEConfig, w: MoEWeights) -> torch.Tensor:
    """logits_TE for the kernel paths: :func:`linear_small` on a GPU (<= 16 rows, a routing family with
    the "router_gemv" fast path, router in x's dtype; not while torch.compile traces), else
    :func:`dispatch.reference.router_logits`."""
    r = w.router_EH
    if x_TH.is_cuda and "router_gemv" in families.get(cfg.scoring).fast_paths and x_TH.shape[0] <= MAX_ROWS \
            and r.dtype == x_TH.dtype and r.stride(-1) == 1 and x_TH.stride(-1) == 1 \
            and not torch.compiler.is_compiling():
        return linear_small(x_TH, r)
    return router_logits(x_TH, cfg, w)


def shared_rides_along(cfg: MoEConfig) -> int:
    """How many experts the layer's shared expert becomes inside the decode kernels: n = S / I, chosen
    by every token with weight 1, for an ungated shared expert whose S is a multiple of I; else 0 (it
    runs in torch). The decode tiles for it are looked up, and tuned, as K + n choices among E + n."""
    S = cfg.shared_intermediate_size
    return S // cfg.I if S and S % cfg.I == 0 and not cfg.shared_gate else 0


def _forward(x: torch.Tensor, cfg: MoEConfig, w: MoEWeights, path: str, tiles, check_ids: bool) -> torch.Tensor:
    """The layer on validated weights: x [T, H] or [B, S, H] → the same shape."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"x must be a torch.Tensor [T, H] or [B, S, H], got {_kind(x)}")
    if x.dim() not in (2, 3):
        raise ValueError(f"x must be a tensor [T, H] or [B, S, H], got shape {tuple(x.shape)}")
    if x.shape[-1] != cfg.hidden_size:  # named in the caller's shape, not the flattened one
        raise ValueError(f"x must have shape [T, H={cfg.hidden_size}] or [B, S, H={cfg.hidden_size}], "
                         f"got {tuple(x.shape)}")
    x_TH = x.reshape(-1, x.shape[-1]) if x.dim() == 3 else x
    check_input(x_TH, cfg)
    if x_TH.device != w.router_EH.device or x_TH.dtype != w.gate_up_E2IH.dtype:
        raise ValueError(f"x is {x_TH.dtype} on {x_TH.device} but the weights are {w.gate_up_E2IH.dtype} "
                         f"on {w.router_EH.device}")
    crossover = DECODE_MAX_TOKENS
    if path == "auto" and x_TH.is_cuda:  # the shape's tuned crossover (a cached lookup)
        crossover = resolve("crossover", (0, cfg.K, cfg.E, cfg.H, cfg.I), x_TH.dtype, x_TH.device).config
    chosen = pick_path(x_TH, path, crossover)
    _check_tiles(tiles, path, chosen)
    if x_TH.shape[0] == 0:
        return x.new_zeros(x.shape)
    if chosen == "torch":
        weights_TK, ids_TK = route_reference(router_logits(x_TH, cfg, w), cfg, w.bias_E)
        y_TH = experts_reference(x_TH, weights_TK.to(x_TH.dtype), ids_TK, w.gate_up_E2IH, w.down_EHI,
                                 check_ids=check_ids, activation=cfg.activation)
    else:
        weights_TK, ids_TK = route(kernel_router_logits(x_TH, cfg, w), cfg, w.bias_E)
        args = (x_TH, weights_TK, ids_TK, w.gate_up_E2IH, w.down_EHI)
        if chosen == "decode" and shared_rides_along(cfg):  # the shared expert inside the kernels
            shared = (w.shared_gate_up_2SH, w.shared_down_HS)
            return moe_decode(*args, shared=shared, config=tiles, check_ids=check_ids,
                              activation=cfg.activation).view(x.shape)
        experts = moe_decode if chosen == "decode" else moe_experts
        y_TH = experts(*args, config=tiles, check_ids=check_ids, activation=cfg.activation)
    shared_TH = shared_reference(x_TH, cfg, w)
    y_TH = y_TH if shared_TH is None else y_TH + shared_TH
    return y_TH.view(x.shape)


def _check_layer(cfg, w, path) -> None:
    if not isinstance(cfg, MoEConfig):
        raise ValueError(f"cfg must be a dispatch.MoEConfig, got {type(cfg).__name__} {cfg!r}")
    if not isinstance(w, MoEWeights):
        raise ValueError(f"w must be a dispatch.MoEWeights, got {type(w).__name__}")
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    w.validate(cfg)


def moe(x: torch.Tensor, cfg: MoEConfig, w: MoEWeights, *, path: str = "auto", tiles=None,
        check_ids: bool = False) -> torch.Tensor:
    """One MoE layer: router → top-K → routed experts (+ shared expert). x [T, H] or [B, S, H].

    Validates ``cfg`` and ``w`` on every call (a :class:`MoELayer` does it once). ``tiles``: the
    chosen path's tile config (see the module docstring). ``check_ids``: raise on expert ids outside
    [0, E) (they cannot come from the router; one host sync).
    """
    _check_layer(cfg, w, path)
    return _forward(x, cfg, w, path, tiles, check_ids)


class MoELayer(nn.Module):
    """:func:`moe` as a module: the config, the weights (buffers, validated once, here), the path.

    ``MoELayer(cfg, w, path="torch")`` is the reference layer; it can replace a transformers sparse
    MoE block (``MoELayer.from_hf(block, hf_config, path="torch")``: same forward output).
    """

    def __init__(self, cfg: MoEConfig, w: MoEWeights, *, path: str = "auto", tiles=None, check_ids: bool = False):
        super().__init__()
        _check_layer(cfg, w, path)
        if tiles is not None and not isinstance(tiles, tuple(TILES.values())):
            raise ValueError(f"tiles must be a GemmConfig or a DecodeConfig, got {tiles!r}")
        self.cfg, self.path, self.tiles, self.check_ids = cfg, path, tiles, check_ids
        self._names = list(w.tensors())
        for name, t in w.tensors().items():
            self.register_buffer(name, t)
        self._w = w

    @classmethod
    def from_hf(cls, block: nn.Module, hf_config, **kw) -> "MoELayer":
        """From a transformers MoE block (e.g. ``OlmoeSparseMoeBlock``) and its model config."""
        cfg = config_from_hf(hf_config)
        return cls(cfg, weights_from_hf(block, cfg), **kw)

    def _apply(self, fn, *args, **kw):  # .to() / .half() / .cuda(): rebuild the weights view, check once
        super()._apply(fn, *args, **kw)
        self._w = MoEWeights(**{n: getattr(self, n) for n in self._names})
        self._w.validate(self.cfg)
        return self

    @property
    def weights(self) -> MoEWeights:
        return self._w

    def route(self, x_TH: torch.Tensor):
        """(logits_TE, weights_TK fp32, ids_TK) of a [T, H] input, by this layer's path's router."""
        check_input(x_TH, self.cfg, self._w)
        if pick_path(x_TH, self.path) == "torch":
            logits_TE = router_logits(x_TH, self.cfg, self._w)
            return (logits_TE, *route_reference(logits_TE, self.cfg, self._w.bias_E))
        logits_TE = kernel_router_logits(x_TH, self.cfg, self._w)
        return (logits_TE, *route(logits_TE, self.cfg, self._w.bias_E))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _forward(x, self.cfg, self._w, self.path, self.tiles, self.check_ids)

    def extra_repr(self) -> str:
        c = self.cfg
        return f"H={c.H}, I={c.I}, E={c.E}, K={c.K}, shared={c.shared_intermediate_size}, path={self.path!r}"
