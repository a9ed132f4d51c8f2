"""The peer-to-peer kernels on a simulated world: R ranks in one process under Triton's interpreter
(CPU), the same kernels that store into peers' symmetric memory on GPUs. Token delivery (each token
once per rank), counts, signals and the return trip must reproduce the one-device layer bit for bit."""
import pytest
import torch

from dispatch.config import PRESETS
from dispatch.parallel import Placement
from dispatch.parallel.dispatch import plan
from dispatch.parallel.p2p import P2PConfig, P2PTransport
from dispatch_book import ep_steps as S

K4 = PRESETS["tiny"].replace(top_k=4)


@pytest.mark.parametrize("tokens_R, routing, placement", [
    ((5, 3), "random", Placement.contiguous(8, 2)),
    ((4, 0), "skewed", Placement.contiguous(8, 2)),
    ((1, 2), "one", Placement.contiguous(8, 2)),
    ((3, 0, 5, 2), "random", Placement.contiguous(8, 4)),
    ((4, 6), "random", Placement(8, 2, ((0, 1, 2, 3, 4), (3, 4, 5, 6, 7)))),
])
def test_p2p_simulated_world_bit_identical(tokens_R, routing, placement):
    case = S.Case("p2p", K4, tokens_R, routing=routing)
    ys, want, sl, ts = S.p2p_simulated(case, placement)
    assert all(S.bitwise_equal(y, want[s]) for y, s in zip(ys, sl, strict=True))
    R = placement.num_ranks
    assert all(t.flags.tolist() == [0] * (2 * R) for t in ts)  # every wait took its signals off again
    ids = S.case_inputs(case)[2]
    sent = [plan(ids[sl[s]], placement, s)[1].sum(0).tolist() for s in range(R)]  # tokens s sent to d
    assert [ts[d].counts.tolist() for d in range(R)] == [[sent[s][d] for s in range(R)] for d in range(R)]


def test_p2p_with_the_decode_kernels():
    ys, want, sl, _ = S.p2p_simulated(S.Case("decode", K4, (3, 2), seed=4, path="decode"), Placement.contiguous(8, 2))
    assert all(S.bitwise_equal(y, want[s]) for y, s in zip(ys, sl, strict=True))


def test_p2p_round_trip_returns_every_row():
    ys, want, sl, _ = S.p2p_simulated(S.Case("rt", K4, (3, 5), seed=2), Placement.contiguous(8, 2), identity=True)
    assert all(S.bitwise_equal(y, want[s]) for y, s in zip(ys, sl, strict=True))


def test_p2p_rejects_too_many_tokens():
    t = P2PTransport.simulated(K4, Placement.contiguous(8, 2), max_tokens=2, dtype=torch.float32)[0]
    with pytest.raises(ValueError, match="max_tokens=2"):
        t.send(torch.zeros(3, 64), torch.ones(3, 4), torch.zeros(3, 4, dtype=torch.long))


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


def test_p2p_programs_loop_over_many_blocks():
    """Fewer programs than blocks: each program walks several blocks before it signals once."""
    few = P2PConfig(rows=2, programs_per_sm=1)  # 4 "SMs" on CPU: 4 programs for 5 blocks of 9 tokens
    ys, want, sl, ts = S.p2p_simulated(S.Case("loop", K4, (9, 6), seed=7), Placement.contiguous(8, 2), config=few)
    assert ts[0].programs_out == 4 and ts[0].programs_back == 4
    assert all(S.bitwise_equal(y, want[s]) for y, s in zip(ys, sl, strict=True))
