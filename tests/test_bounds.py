"""The bounds check itself (dispatch_book.bounds): a load past a tensor's end, or a store through a
bad index, is caught and names the kernel; masked lanes and in-bounds accesses pass."""
import pytest
import torch
import triton
import triton.language as tl

from dispatch import runtime
from dispatch_book import bounds

pytestmark = pytest.mark.skipif(not runtime.INTERPRET, reason="checks Triton's interpreter")


@triton.jit
def _copy(x_ptr, y_ptr, idx_ptr, n, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    i = tl.load(idx_ptr + o, mask=o < n, other=0)
    tl.store(y_ptr + i, tl.load(x_ptr + o, mask=o < n), mask=o < n)


def test_out_of_bounds_loads_and_stores_are_caught():
    x, y = torch.arange(8.0), torch.zeros(8)
    with bounds.checking():
        _copy[(1,)](x, y, torch.arange(8), 8, BLOCK=16)  # lanes 8..15 masked: fine
        assert torch.equal(y, x)
        with pytest.raises(Exception, match="_copy: a load of 1 element"):
            _copy[(1,)](x, y, torch.arange(9), 9, BLOCK=16)  # one lane past x's end
        bad = torch.arange(8)
        bad[3] = 1000  # a block table entry gone wrong
        with pytest.raises(Exception, match="_copy: a store of 1 element"):
            _copy[(1,)](x, y, bad, 8, BLOCK=16)
    assert not bounds._saved, "the interpreter as it was after the block"
