"""Prints raw fp32 round-off; CI shows the perturbed setting changes it (so the second nbval run
of the notebooks really runs under different round-off).

    python .ci/roundoff.py                       # prints three raw sums
    python .ci/roundoff.py --differs-from "..."  # exits 1 if the printed line equals the given one
"""
import sys

import torch

torch.manual_seed(0)
x = torch.randn(1_000_003)
a, b = torch.randn(256, 999), torch.randn(999, 256)
line = f"{x.sum().item()!r} {(a @ b).sum().item()!r} {torch.softmax(a, -1).sum().item()!r}"
print(line)
if len(sys.argv) == 3 and sys.argv[1] == "--differs-from" and sys.argv[2] == line:
    sys.exit("the perturbed floating-point setting printed the same round-off as the default one")
