"""Number formats for expert weights: int8 and fp8 e4m3, with per-channel, group or block scales.

A weight stack ``w [E, R, C]`` (R output channels, C input channels: ``gate_up_E2IH`` has R = 2I,
C = H; ``down_EHI`` has R = H, C = I) is stored as 8-bit codes ``q [E, R, C]`` and fp32 scales
``scale [E, ceil(R / block_rows), ceil(C / block_cols)]``; an element is ``q · scale`` of its block.
The schemes (int8-channel, int8-group128, fp8-channel, fp8-block128: codes, blocks, gates) are the
table of :mod:`dispatch.schemes`; this module quantizes with them.

int8 is uniform: 255 levels spaced ``scale`` apart, so an element's error is at most scale / 2.
e4m3 is floating point: 4 exponent and 3 mantissa bits, range ±448, a relative step of 2^-3, so an
element's error is at most 2^-4 of its size (2^-10 · scale below the smallest normal, 2^-6 · scale).
A block whose entries are all zero gets scale 1 (its codes are 0): never a zero or NaN scale.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from dispatch.schemes import (  # noqa: F401  (re-exported: the quant package's names)
    CODE_DTYPES,
    FP8,
    FP8_MAX,
    SCHEMES,
    QuantScheme,
)
from dispatch.schemes import get as get_scheme

# The schemes themselves (names, code dtypes, blocks, gates, kernel constexprs): dispatch.schemes.
Scheme = QuantScheme


def expand_scale(scale: torch.Tensor, block: tuple[int, int], rows: int, cols: int) -> torch.Tensor:
    """[E, Rb, Cb] scales → [E, rows, cols]: each element's scale."""
    br, bc = block
    return scale.repeat_interleave(br, dim=1)[:, :rows].repeat_interleave(bc, dim=2)[:, :, :cols]


@dataclass(frozen=True)
class QuantizedTensor:
    """One quantized weight stack [E, R, C]: codes, fp32 scales and the block one scale covers."""

    q: torch.Tensor  # [E, R, C] int8 or float8_e4m3fn
    scale: torch.Tensor  # [E, ceil(R / block_rows), ceil(C / block_cols)] float32, in [tiny, max / qmax]
    block_rows: int
    block_cols: int

    def __post_init__(self):
        if not isinstance(self.q, torch.Tensor) or self.q.dim() != 3 or self.q.dtype not in CODE_DTYPES:
            raise ValueError(f"q must be an int8 or float8_e4m3fn [E, R, C] tensor, got "
                             f"{getattr(self.q, 'dtype', type(self.q).__name__)} {tuple(getattr(self.q, 'shape', ()))}")
        for name in ("block_rows", "block_cols"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"QuantizedTensor.{name} must be a positive int, got {v!r}")
        E, R, C = self.q.shape
        want = (E, -(-R // self.block_rows), -(-C // self.block_cols))
        if not isinstance(self.scale, torch.Tensor) or self.scale.dtype != torch.float32 \
                or tuple(self.scale.shape) != want:
            raise ValueError(f"scale must be float32 of shape {want} for q {tuple(self.q.shape)} in blocks "
                             f"{self.block_rows}x{self.block_cols}, got {getattr(self.scale, 'dtype', None)} "
                             f"{tuple(getattr(self.scale, 'shape', ()))}")
        if self.scale.device != self.q.device:
            raise ValueError(f"q is on {self.q.device} but scale on {self.scale.device}")
        # a scale is at least float32's tiny (the quantizer's floor) and so small that q·scale stays
        # finite in fp32 (at most float32 max / the largest code): a bit flip past it is refused
        tiny = torch.finfo(torch.float32).tiny
        top = torch.finfo(torch.float32).max / (127.0 if self.q.dtype == torch.int8 else FP8_MAX)
        ok = (self.scale >= tiny) & (self.scale <= top)
        if self.scale.numel() and not bool(ok.all()):
            bad = self.scale[~ok]
            raise ValueError(f"every scale must be finite and > 0 (at least {tiny:.3g}) and at most {top:.3g} "
                             f"(q·scale finite in fp32); {bad.numel()} are not, e.g. {bad[0].item():.4g}")

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(self.q.shape)

    @property
    def block(self) -> tuple[int, int]:
        return self.block_rows, self.block_cols

    @property
    def per_row(self) -> bool:
        """One scale covers each whole row (per-channel schemes, or rows no longer than a block)."""
        return self.block_cols >= self.shape[2]

    def nbytes(self) -> int:
        """Exact bytes held: codes plus scales."""
        return self.q.numel() * self.q.element_size() + self.scale.numel() * self.scale.element_size()

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """q · scale in fp32, then cast once to ``dtype``: [E, R, C]."""
        _, R, C = self.q.shape
        return (self.q.float() * expand_scale(self.scale, self.block, R, C)).to(dtype)

    def to(self, device) -> "QuantizedTensor":
        return QuantizedTensor(self.q.to(device), self.scale.to(device), self.block_rows, self.block_cols)


def quantize_tensor(w: torch.Tensor, scheme: Scheme | str) -> QuantizedTensor:
    """Quantize a weight stack [E, R, C] (any float dtype, finite) with ``scheme``."""
    s = get_scheme(scheme) if isinstance(scheme, str) else scheme
    if not isinstance(w, torch.Tensor) or w.dim() != 3 or not w.is_floating_point():
        raise ValueError(f"w must be a floating [E, R, C] tensor, got {getattr(w, 'dtype', type(w).__name__)} "
                         f"{tuple(getattr(w, 'shape', ()))}")
    if w.numel() and not bool(torch.isfinite(w).all()):
        raise ValueError("w holds inf or NaN: such weights cannot be given a finite scale")
    E, R, C = w.shape
    br, bc = s.block(C)
    Rb, Cb = -(-R // br), -(-C // bc)
    w32 = w.float()
    padded = torch.zeros(E, Rb * br, Cb * bc, dtype=torch.float32, device=w.device)
    padded[:, :R, :C] = w32.abs()
    amax = padded.view(E, Rb, br, Cb, bc).amax(dim=(2, 4))
    tiny = torch.finfo(torch.float32).tiny
    scale = torch.where(amax > 0, (amax / s.qmax).clamp_min(tiny), torch.ones_like(amax))
    scaled = (w32 / expand_scale(scale, (br, bc), R, C)).clamp(-s.qmax, s.qmax)
    q = scaled.round().to(torch.int8) if s.dtype == torch.int8 else scaled.to(FP8)
    return QuantizedTensor(q, scale.contiguous(), br, bc)


@dataclass(frozen=True)
class QuantizedExperts:
    """A layer's routed experts, quantized: gate_up [E, 2I, H] and down [E, H, I] in one scheme.

    The router and any shared expert stay in the model's dtype (a small share of the bytes read).
    """

    scheme: str
    gate_up: QuantizedTensor  # [E, 2I, H]
    down: QuantizedTensor  # [E, H, I]

    def __post_init__(self):
        s = get_scheme(self.scheme)
        for name in ("gate_up", "down"):
            t = getattr(self, name)
            if not isinstance(t, QuantizedTensor):
                raise ValueError(f"QuantizedExperts.{name} must be a QuantizedTensor, got {type(t).__name__}")
            if t.q.dtype != s.dtype or t.block != s.block(t.shape[2]):
                raise ValueError(f"QuantizedExperts.{name} is {t.q.dtype} in blocks {t.block}, but scheme "
                                 f"{s.name} stores {s.dtype} in blocks {s.block(t.shape[2])}")
        E, I2, H = self.gate_up.shape
        if I2 % 2 or I2 == 0 or self.down.shape != (E, H, I2 // 2):
            raise ValueError(f"gate_up must be [E, 2I, H] and down [E, H, I], got {self.gate_up.shape} and "
                             f"{self.down.shape}")
        if self.gate_up.q.device != self.down.q.device:
            raise ValueError(f"gate_up is on {self.gate_up.q.device} but down on {self.down.q.device}")

    @property
    def E(self) -> int:
        return self.gate_up.shape[0]

    @property
    def H(self) -> int:
        return self.gate_up.shape[2]

    @property
    def I(self) -> int:  # noqa: E743
        return self.down.shape[2]

    @property
    def device(self) -> torch.device:
        return self.gate_up.q.device

    def nbytes(self) -> int:
        """Exact bytes of the quantized experts, scales included."""
        return self.gate_up.nbytes() + self.down.nbytes()

    def dequantize(self, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        """(gate_up_E2IH, down_EHI) as ``dtype``: what the quantized kernels compute with."""
        return self.gate_up.dequantize(dtype), self.down.dequantize(dtype)

    def to(self, device) -> "QuantizedExperts":
        return QuantizedExperts(self.scheme, self.gate_up.to(device), self.down.to(device))


def quantize_experts(gate_up_E2IH: torch.Tensor, down_EHI: torch.Tensor, scheme: str) -> QuantizedExperts:
    """Quantize a layer's experts (transformers 5 fused layout) with ``scheme`` (see :data:`SCHEMES`)."""
    return QuantizedExperts(get_scheme(scheme).name, quantize_tensor(gate_up_E2IH, scheme),
                            quantize_tensor(down_EHI, scheme))


def quantize_fp8_rows(a_MK: torch.Tensor, group: int | None = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """a [M, K] → fp8 e4m3 codes [M, K] and fp32 scales [M, ceil(K / group)]: s = amax(row, group) / 448
    (at least 1e-30 / 448), codes = fp8(a / s); ``group=None``: one scale per row.
    Twin of :func:`dispatch.kernels.quant_kernels.fp8_rows`."""
    M, K = a_MK.shape
    group = group or max(K, 1)
    G = -(-K // group)
    a = torch.zeros(M, G * group, dtype=torch.float32, device=a_MK.device)
    a[:, :K] = a_MK.float()
    a = a.view(M, G, group)
    s = a.abs().amax(dim=2, keepdim=True).clamp_min(1e-30) / FP8_MAX
    q = (a / s).clamp(-FP8_MAX, FP8_MAX).to(FP8).view(M, G * group)[:, :K].contiguous()
    return q, s.view(M, G)


def fp8_activations(a_MK: torch.Tensor, group: int | None = 128) -> torch.Tensor:
    """a [M, K] rounded through fp8 e4m3 with one scale per row and ``group`` columns (fp32 out):
    what the w8a8 kernels compute with, ``quantize_fp8_rows`` dequantized."""
    M, K = a_MK.shape
    q, s = quantize_fp8_rows(a_MK, group)
    return q.float() * s.repeat_interleave(group or max(K, 1), dim=1)[:, :K]
