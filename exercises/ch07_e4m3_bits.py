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
    raise NotImplementedError("complete decode in exercises/ch07_e4m3_bits.py")


def encode(x: torch.Tensor) -> torch.Tensor:
    raise NotImplementedError("complete encode in exercises/ch07_e4m3_bits.py")
