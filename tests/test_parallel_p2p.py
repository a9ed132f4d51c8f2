"""The peer-to-peer kernels on a simulated world: R ranks in one process under Triton's interpreter
(CPU), the same kernels that write into peers' symmetric memory on GPUs. Row delivery, counts,
signals and the return trip must reproduce the single-device layer bit for bit."""
import pytest
import torch

import dispatch  # noqa: F401
from dispatch.config import PRESETS
from dispatch.parallel import Placement
from dispatch.parallel import workers as W
from dispatch.parallel.p2p import P2PTransport

K4 = PRESETS["tiny"].replace(top_k=4)


@pytest.mark.parametrize("tokens_R,routing,placement", [
    ((5, 3), "random", Placement.contiguous(8, 2)),
    ((4, 0), "skewed", Placement.contiguous(8, 2)),
    ((3, 0, 5, 2), "random", Placement.contiguous(8, 4)),
    ((4, 6), "random", Placement(8, 2, ((0, 1, 2, 3, 4), (3, 4, 5, 6, 7)))),
])
def test_p2p_simulated_world_bit_identical(tokens_R, routing, placement):
    ys, want, sl, ts = W.p2p_simulated(W.Case("p2p", K4, tokens_R, routing=routing), placement)
    for r, y in enumerate(ys):
        assert W.bitwise_equal(y, want[sl[r]]), r
    R = placement.num_ranks
    for t in ts:  # after each round every wait took its sources' signals off again
        assert t.flags.tolist() == [0] * (2 * R)
    counts = [ts[d].meta[-R:].tolist() for d in range(R)]  # rows s sent to d
    dest = [placement.dest_rank_N(W.case_inputs(W.Case("p2p", K4, tokens_R, routing=routing))[2][sl[s]], s)
            for s in range(R)]
    assert counts == [[int((dest[s] == d).sum()) for s in range(R)] for d in range(R)]


def test_p2p_rejects_too_many_tokens():
    t = P2PTransport.simulated(K4, Placement.contiguous(8, 2), max_tokens=2, dtype=torch.float32)[0]
    x = torch.zeros(3, K4.hidden_size)
    with pytest.raises(ValueError, match="max_tokens=2"):
        t.send(x, torch.ones(3, 4), torch.zeros(3, 4, dtype=torch.long))


@pytest.mark.parametrize("x_shape, k, dtype, match", [
    ((2, 64), 3, torch.float32, r"K=4"),  # top_k other than the transport's: would mis-combine
    ((2, 32), 4, torch.float32, r"H=64"),
    ((2, 64), 4, torch.float16, "built for torch.float32"),
])
def test_p2p_rejects_mismatched_inputs_before_any_launch(x_shape, k, dtype, match):
    t = P2PTransport.simulated(K4, Placement.contiguous(8, 2), max_tokens=4, dtype=torch.float32)[0]
    with pytest.raises(ValueError, match=match):
        t.send(torch.zeros(x_shape, dtype=dtype), torch.ones(2, k), torch.zeros(2, k, dtype=torch.long))
    assert t.flags.tolist() == [0] * 4  # nothing was signalled


def test_p2p_programs_loop_over_many_blocks(monkeypatch):
    """Few programs, many rows: each program walks several blocks before it signals once."""
    from dispatch.parallel import p2p

    monkeypatch.setattr(p2p, "MAX_PROGRAMS", 2)
    ys, want, sl, ts = W.p2p_simulated(W.Case("p2p", K4, (9, 6), seed=7), Placement.contiguous(8, 2))
    assert ts[0].programs_out == 2 and ts[0].programs_back == 2
    assert all(W.bitwise_equal(y, want[s]) for y, s in zip(ys, sl))
