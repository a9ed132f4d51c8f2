"""Chapter 7, exercise 2: fp8 e4m3, read and written by its bits.

An e4m3 code is one byte: a sign bit, 4 exponent bits e (bias 7) and 3 mantissa bits m. Exponent
bits 1 … 15 give normal numbers ±2^(e − 7) · (1 + m/8); exponent bits 0 give the subnormals
±2^(−6) · m/8 (zero among them); there are no infinities, and only the two codes with every
exponent and mantissa bit set, 0x7F and 0xFF, are NaN. Complete, with integer and float
arithmetic (shifts, masks, powers of two: ``torch.ldexp``), never by converting or viewing through
``torch.float8_e4m3fn`` (the check refuses it):

* ``decode(codes)``: uint8 codes of any shape → their fp32 values;
* ``encode(x)``: fp32 → the uint8 code of the nearest e4m3 value; a tie goes to the code whose
  last bit is 0; beyond the largest finite value it saturates (what is it?); x's sign is kept,
  zero included (−0.0 and a tiny negative number give 0x80); NaN gives 0x7F.
"""
import torch


def decode(codes: torch.Tensor) -> torch.Tensor:
    c = codes.to(torch.int32)
    sign = torch.where(c & 0x80 != 0, -1.0, 1.0)
    e, m = (c >> 3) & 0xF, (c & 0x7).float()
    normal = torch.ldexp(1 + m / 8, e - 7)  # 2^(e - bias) · 1.m
    sub = torch.ldexp(m / 8, torch.full_like(e, -6))  # exponent bits 0: no implicit 1
    value = sign * torch.where(e == 0, sub, normal)
    return torch.where((e == 15) & (m == 7), torch.nan, value)


def encode(x: torch.Tensor) -> torch.Tensor:
    codes = torch.arange(256, dtype=torch.int64)
    values = decode(codes.to(torch.uint8))
    codes, values = codes[~values.isnan()], values[~values.isnan()]  # the 254 finite codes
    x32 = x.float()
    xc = x32.clamp(-448.0, 448.0)  # saturate at the largest finite value
    dist = (xc[..., None] - values).abs()
    near = dist == dist.min(-1, keepdim=True).values
    other_sign = (codes >= 0x80) != torch.signbit(xc)[..., None]
    key = torch.where(near, other_sign.long() * 2 + (codes & 1), 99)  # x's sign first, then the even code
    pick = codes[key.argmin(-1)]
    return torch.where(x32.isnan(), 0x7F, pick).to(torch.uint8)
