"""Expert parallelism on GPUs: bit-identical to the one-GPU layer built from the same kernels (pinned
tiles, bf16; grouped GEMM and decode kernels) over NCCL (exact and fixed-capacity splits) and the
peer-to-peer path; CUDA graphs.

    pytest tests/test_parallel_gpu.py -m gpu      # one GPU: world size 1; two GPUs: world size 2 too
"""
import parallel_ranks as PR
import pytest
import torch

from dispatch.config import MoEConfig
from dispatch.parallel import Placement, RankError, launch
from dispatch_book import ep_steps as S

pytestmark = pytest.mark.gpu
needs_two = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                               reason="needs 2 CUDA GPUs")

CFG = MoEConfig(256, 128, 16, 4, family="olmoe")
SHARED = CFG.replace(shared_intermediate_size=128, shared_gate=True)
REPLICATED = Placement(16, 2, (tuple(range(0, 8)) + (8, 9), (0, 1) + tuple(range(8, 16))))


def cases(R):
    tok = {1: (37,), 2: (37, 21)}[R]
    out = [S.Case("random", CFG, tok, dtype="bfloat16"),
           S.Case("random, fixed capacity", CFG, tok, dtype="bfloat16", capacity=True),
           S.Case("every token to the same experts", CFG, tok, routing="one", dtype="bfloat16"),
           S.Case("whole layer", SHARED, tok, routing="router", dtype="bfloat16"),
           S.Case("one token", CFG, (1,) * R, dtype="bfloat16", capacity=True),
           S.Case("decode kernels", CFG, (5,) * R, dtype="bfloat16", path="decode"),
           S.Case("decode kernels, fixed capacity", CFG, (3,) * R, dtype="bfloat16", path="decode", capacity=True)]
    if R == 2:
        out += [S.Case("skewed", CFG, (16, 16), routing="skewed", dtype="bfloat16"),
                S.Case("zero tokens on rank 1", CFG, (9, 0), dtype="bfloat16", capacity=True),
                S.Case("replicated experts", CFG, (30, 17), placement=REPLICATED, dtype="bfloat16")]
    return out


def _check(R, transport):
    rows = [r for per in launch(S.check_cases, R, cases(R), "cuda", transport, backend="nccl", timeout_s=300)
            for r in per]
    assert len(rows) == R * len(cases(R))
    bad = [r for r in rows if not r["equal"]]
    assert not bad, bad


def test_one_gpu_bit_identical():
    _check(1, "collective")


@needs_two
@pytest.mark.parametrize("transport", ["collective", "p2p"])
def test_two_gpus_bit_identical(transport):
    _check(2, transport)


@pytest.mark.parametrize("transport", ["collective", pytest.param("p2p", marks=needs_two)])
def test_cuda_graph_replays_the_same_bits(transport):
    R = 2 if torch.cuda.device_count() >= 2 else 1
    assert launch(PR.graph_replay, R, CFG, 64, transport, backend="nccl", timeout_s=300) == [True] * R


@needs_two
def test_failing_rank_over_nccl_is_named():
    with pytest.raises(RankError, match="rank 1 of 2 raised ValueError: boom from rank 1"):
        launch(PR.rank_behaviour, 2, 1, "raise", backend="nccl", timeout_s=60)
