"""Checks of chapter 7's exercises."""
from __future__ import annotations

import math

import torch

from exercises._check.common import gen, no_float8


def _weights(R: int, C: int, seed: int) -> torch.Tensor:
    g = gen(seed)
    w = torch.randn(R, C, generator=g) * 0.02
    w[torch.randint(0, R, (3,), generator=g), torch.randint(0, C, (3,), generator=g)] = \
        torch.tensor([0.9, -1.3, 0.4])  # outliers: they set their groups' scales
    return w


def ch07_quantize(mod) -> None:
    for R, C, group in ((6, 300, 128), (4, 256, 64), (3, 40, 128), (2, 7, 4)):
        w = _weights(R, C, R * C)
        w[0, :group] = 0.0  # a group of zeros
        w[1, -1] = -w[1].abs().max() * 2  # a group whose amax is a negative weight
        G = -(-C // group)
        what = f"quantize(w [{R}, {C}], group={group})"
        q, s = mod.quantize(w, group)
        assert isinstance(q, torch.Tensor) and q.dtype == torch.int8 and tuple(q.shape) == (R, C), \
            f"{what}: codes must be an int8 [{R}, {C}] tensor, got {getattr(q, 'dtype', q)} {getattr(q, 'shape', '')}"
        assert isinstance(s, torch.Tensor) and s.dtype == torch.float32 and tuple(s.shape) == (R, G), \
            f"{what}: scales must be an fp32 [{R}, {G}] tensor (one per group), got {getattr(s, 'shape', s)}"
        for r in range(R):
            for j in range(G):
                cols = slice(j * group, min((j + 1) * group, C))
                amax = w[r, cols].abs().max()
                scale = float(amax / 127) if amax > 0 else 1.0
                assert abs(float(s[r, j]) - scale) <= 1e-7 * scale, \
                    f"{what}: row {r}, group {j} has scale {float(s[r, j])}, expected amax / 127 = {scale}"
                x = w[r, cols].double() / float(s[r, j])
                codes = q[r, cols].long()
                ties = (x - x.floor() - 0.5).abs() < 1e-4  # either rounding passes here
                ref = torch.round(x).long()
                bad = ((codes != ref) & ~(ties & ((codes - x).abs() < 0.5001))).nonzero().flatten().tolist()
                assert not bad, f"{what}: row {r}, column {j * group + bad[0]}: code {int(codes[bad[0]])} for " \
                                f"w / scale = {float(x[bad[0]]):.4f} (the nearest integer, please)"
                if amax > 0:
                    top = int(w[r, cols].abs().argmax())
                    assert abs(int(codes[top])) == 127, \
                        f"{what}: row {r}, group {j}: its amax must land on ±127, got code {int(codes[top])}"
        deq = mod.dequantize(q, s, group)
        bound = mod.error_bound(s, group, C)
        assert isinstance(deq, torch.Tensor) and deq.dtype == torch.float32 and tuple(deq.shape) == (R, C), \
            f"dequantize: expected fp32 [{R}, {C}], got {getattr(deq, 'shape', deq)}"
        expand = s.repeat_interleave(group, dim=1)[:, :C]
        assert torch.equal(deq, q.float() * expand), "dequantize: not each code times its group's scale"
        assert isinstance(bound, torch.Tensor) and tuple(bound.shape) == (R, C), \
            f"error_bound: expected [{R}, {C}], got {getattr(bound, 'shape', bound)}"
        err = (w - deq).abs()
        slack = 4 * torch.finfo(torch.float32).eps * w.abs()  # the fp32 roundings of w / s and q · s
        worst = int((err - bound - slack).argmax())
        assert bool((err <= bound + slack).all()), \
            f"{what}: a weight is off by {float(err.flatten()[worst]):.3g}, above its bound " \
            f"{float(bound.flatten()[worst]):.3g}"
        assert bool((bound <= expand / 2 * (1 + 1e-6)).all()), \
            "error_bound: larger than rounding to the nearest code can be off: not the tightest bound"
    big = _weights(64, 256, 5)
    q, s = mod.quantize(big, 128)
    ratio = float(((big - mod.dequantize(q, s, 128)).abs() / mod.error_bound(s, 128, 256)).max())
    assert ratio > 0.95, f"error_bound: the error of 16384 weights reaches only {ratio:.2f} of it: not tight"


def _e4m3_value(code: int) -> float:
    sign = -1.0 if code & 0x80 else 1.0
    e, m = (code >> 3) & 0xF, code & 0x7
    if e == 0xF and m == 0x7:
        return math.nan
    if e == 0:
        return sign * 2.0 ** -6 * m / 8
    return sign * 2.0 ** (e - 7) * (1 + m / 8)


def _e4m3_encode(x: float) -> int:
    """The code of the value nearest x (saturated at ±448), a tie to the code whose last bit is 0,
    x's sign kept (also on a zero); NaN → 0x7F. By search over the 254 finite codes."""
    if math.isnan(x):
        return 0x7F
    x = max(-448.0, min(448.0, x))
    table = [(_e4m3_value(c), c) for c in range(256) if not math.isnan(_e4m3_value(c))]
    best = min(abs(v - x) for v, _ in table)
    near = [c for v, c in table if abs(v - x) == best]
    sign = 0x80 if math.copysign(1.0, x) < 0 else 0
    near = [c for c in near if c & 0x80 == sign] or near
    return min(near, key=lambda c: (c & 1, c))


def ch07_e4m3_bits(mod) -> None:
    codes = torch.arange(256, dtype=torch.uint8)
    ref = torch.tensor([_e4m3_value(c) for c in range(256)], dtype=torch.float32)
    if hasattr(torch, "float8_e4m3fn"):  # the check's own table against PyTorch's format
        theirs = codes.view(torch.float8_e4m3fn).float()
        assert torch.equal(torch.isnan(theirs), torch.isnan(ref)) and torch.equal(theirs.nan_to_num(), ref.nan_to_num())
    with no_float8("decode"):
        got = mod.decode(codes)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float32 and tuple(got.shape) == (256,), \
        f"decode: expected fp32 [256] for 256 codes, got {getattr(got, 'dtype', got)}"
    for c in range(256):
        a, b = float(got[c]), float(ref[c])
        assert (math.isnan(a) and math.isnan(b)) or a == b, \
            f"decode(0x{c:02X}) = {a!r}, expected {b!r} (sign {c >> 7}, exponent bits {(c >> 3) & 15}, " \
            f"mantissa bits {c & 7})"
    with no_float8("decode"):
        grid = mod.decode(codes.view(16, 16))
    assert tuple(grid.shape) == (16, 16), "decode keeps the codes' shape"
    finite = sorted({v for v in ref.tolist() if not math.isnan(v)})
    mids = [(a + b) / 2 for a, b in zip(finite, finite[1:], strict=False)]
    xs = finite + mids + [m * (1 + 2 ** -12) for m in mids] + [m * (1 - 2 ** -12) for m in mids] + \
        [460.0, 1e6, -500.0, -1e30, 2.0 ** -12, -(2.0 ** -11), 0.0, -0.0, math.nan]
    x = torch.tensor(xs, dtype=torch.float32)
    want = [_e4m3_encode(v) for v in x.tolist()]
    with no_float8("encode"):
        q = mod.encode(x)
    assert isinstance(q, torch.Tensor) and q.dtype == torch.uint8 and tuple(q.shape) == tuple(x.shape), \
        f"encode: expected uint8 codes of x's shape, got {getattr(q, 'dtype', q)}"
    for v, a, b in zip(x.tolist(), q.tolist(), want, strict=True):
        assert a == b, f"encode({v!r}) = 0x{a:02X}, expected 0x{b:02X} ({_e4m3_value(b)!r}: the nearest value, " \
                       "a tie to the even code, saturated at ±448)"
