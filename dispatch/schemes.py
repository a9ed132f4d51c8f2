"""Quantization schemes of expert weights, one entry each: the codes' format, the kernels' constexprs,
the accuracy gate and the tuner's table keys (chapter 7).

A weight stack ``w [E, R, C]`` (R output channels, C input channels: ``gate_up_E2IH`` has R = 2I,
C = H; ``down_EHI`` has R = H, C = I) is stored as 8-bit codes and fp32 scales, one per block of
``block_rows × block_cols`` (None: the whole row). Everything that depends on the scheme reads this
table: the quantizer (:mod:`dispatch.quant.formats`), the kernels (``QUANT``, ``SBR``, ``SBC``,
``LATE_SCALE``: :meth:`QuantScheme.constexprs`), the tile resolver (chunks inside the scale blocks),
the tuner (``--quant``: :meth:`QuantScheme.table_labels`), the engine (``--quant int8|fp8``) and the
accuracy gates. An unknown name is a ValueError anywhere.

    scheme          codes        block (rows × cols)   amax of a block maps to   fp8 activations (w8a8)
    int8-channel    int8         1 × C (one per row)    127                       no
    int8-group128   int8         1 × 128                127                       no
    fp8-channel     e4m3 (fn)    1 × C                  448                       yes (sm_89+)
    fp8-block128    e4m3 (fn)    128 × 128              448  (DeepSeek-V3's)      yes (sm_89+)

A label names what runs: the scheme ('fp8-channel', weight-only: w8a16) or '<scheme>+w8a8' (fp8
activations too, per token and ``W8A8_GROUP`` columns); :func:`parse` reads one.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # the largest finite e4m3 (fn) value
W8A8_GROUP = 128  # activation columns per scale in w8a8 (per token with per-channel weights)
W8A8 = "+w8a8"  # the label suffix of fp8 activations


@dataclass(frozen=True)
class QuantScheme:
    """How one weight stack is quantized, and what follows from it.

    ``gate``: the largest relative error ‖y_q − y‖ / ‖y‖ of a layer's routed experts (fp32, random
    weights of a preset's shape: :func:`dispatch.quant.accuracy.layer_error`) the scheme may show;
    ``w8a8_gate``: the same with fp8 activations. ``min_capability``: the oldest GPU its kernels run
    on (Triton converts e4m3 from sm_89 on); the interpreter runs int8 only."""

    name: str
    dtype: torch.dtype  # torch.int8 or torch.float8_e4m3fn
    block_rows: int  # output channels per scale
    block_cols: int | None  # input channels per scale; None = the whole row (per-channel)
    gate: float
    w8a8_gate: float | None = None  # None: no fp8-activation form
    min_capability: tuple[int, int] | None = None

    @property
    def qmax(self) -> float:
        """The largest code: a block's largest |w| is mapped onto it."""
        return 127.0 if self.dtype == torch.int8 else FP8_MAX

    @property
    def w8a8(self) -> bool:
        """Whether the scheme also runs on fp8 activations ('<name>+w8a8')."""
        return self.w8a8_gate is not None

    def block(self, cols: int) -> tuple[int, int]:
        """(block_rows, block_cols) for a stack with ``cols`` input channels."""
        return self.block_rows, self.block_cols or cols

    def per_row(self, cols: int) -> bool:
        """One scale covers each whole row of a stack with ``cols`` input channels."""
        return self.block(cols)[1] >= cols

    def constexprs(self, cols: int) -> dict:
        """The kernels' weight constexprs for a stack with ``cols`` input channels in this scheme."""
        return kernel_constexprs(*self.block(cols), cols)

    def expert_bytes(self, E: int, H: int, I: int) -> int:  # noqa: E741
        """Exact bytes of E experts (gate_up [E, 2I, H] + down [E, H, I]): 1-byte codes + fp32 scales."""
        def scales(R, C):
            br, bc = self.block(C)
            return -(-R // br) * -(-C // bc)
        return E * (3 * H * I + 4 * (scales(2 * I, H) + scales(H, I)))

    def table_labels(self) -> tuple[str, ...]:
        """The tuner's entries for this scheme: weight-only, and '<name>+w8a8' where fp8 activations apply."""
        return (self.name,) + ((self.name + W8A8,) if self.w8a8 else ())

    def check_device(self, device) -> None:
        """Raise unless this scheme's kernels run on ``device`` (fp8 codes need an sm_89+ GPU)."""
        dev = torch.device(device)
        if dev.type == "cuda" and self.min_capability is not None:
            cap = torch.cuda.get_device_capability(dev)
            if cap < self.min_capability:
                need = "sm_{}{}".format(*self.min_capability)
                raise ValueError(f"{self.name} needs an {need}+ GPU for its kernels; this one is "
                                 f"sm_{cap[0]}{cap[1]}: use an int8 scheme")


def kernel_constexprs(block_rows: int, block_cols: int, cols: int) -> dict:
    """The weight constexprs of the expert kernels for codes in blocks ``block_rows × block_cols`` of a
    row of ``cols``: ``QUANT`` (8-bit codes), ``SBR``/``SBC`` (a scale's rows and columns),
    ``LATE_SCALE`` (one scale covers the row: applied once, after the reduction)."""
    return dict(SBR=block_rows, SBC=block_cols, QUANT=True, LATE_SCALE=block_cols >= cols)


SCHEMES: dict[str, QuantScheme] = {s.name: s for s in (
    QuantScheme("int8-channel", torch.int8, 1, None, gate=3e-2),
    QuantScheme("int8-group128", torch.int8, 1, 128, gate=3e-2),
    QuantScheme("fp8-channel", FP8, 1, None, gate=8e-2, w8a8_gate=0.1, min_capability=(8, 9)),
    QuantScheme("fp8-block128", FP8, 128, 128, gate=8e-2, w8a8_gate=0.1, min_capability=(8, 9)),
)}
CODE_DTYPES = (torch.int8, FP8)
ALIASES = {"int8": "int8-channel", "fp8": "fp8-channel"}  # the command lines' short names: one scale a row


def get(name: str) -> QuantScheme:
    """The scheme named ``name``; a ValueError naming the known ones otherwise."""
    scheme = SCHEMES.get(name) if isinstance(name, str) else None
    if scheme is None:
        raise ValueError(f"scheme must be one of {sorted(SCHEMES)}, got {name!r}")
    return scheme


def full_name(name: str) -> str:
    """A command line's scheme: an alias of :data:`ALIASES` ('int8', 'fp8') or a full name → the full name."""
    full = ALIASES.get(name, name) if isinstance(name, str) else name
    if full not in SCHEMES:
        raise ValueError(f"quantization must be one of {sorted(ALIASES) + sorted(SCHEMES)}, got {name!r}")
    return full


def parse(label: str) -> tuple[QuantScheme, bool]:
    """(scheme, w8a8?) of a label 'int8-channel' / 'fp8-channel+w8a8'; a ValueError for an unknown
    scheme or '+w8a8' on one without fp8 activations."""
    if not isinstance(label, str):
        raise ValueError(f"a scheme label must be a str, got {label!r}")
    w8a8 = label.endswith(W8A8)
    scheme = get(label.removesuffix(W8A8))
    if w8a8 and not scheme.w8a8:
        fp8 = sorted(s.name for s in SCHEMES.values() if s.w8a8)
        raise ValueError(f"{label!r}: '{W8A8}' (fp8 activations) needs fp8 codes: one of {fp8}")
    return scheme, w8a8
