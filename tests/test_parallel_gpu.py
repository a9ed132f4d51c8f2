"""Expert parallelism on 2 GPUs: bit-identical to one GPU over NCCL and over the peer-to-peer path.

Run on the device (nvidia-h200-x2): ``pytest tests/test_parallel_gpu.py -m gpu``.
"""
import pytest
import torch

import dispatch  # noqa: F401  (sets up Triton before it loads)
from dispatch.config import MoEConfig
from dispatch.parallel import Placement, launch
from dispatch.parallel import workers as W

pytestmark = pytest.mark.gpu
needs_two = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                               reason="needs 2 CUDA GPUs")

CFG = MoEConfig(256, 128, 16, 4, family="olmoe")
SHARED = CFG.replace(shared_intermediate_size=128, shared_gate=True)
REPLICATED = Placement(16, 2, (tuple(range(0, 8)) + (8, 9), (0, 1) + tuple(range(8, 16))))


def cases():
    return [W.Case("random", CFG, (37, 21), dtype="bfloat16", expert_fn="loop"),
            W.Case("skewed", CFG, (16, 16), routing="skewed", dtype="bfloat16", expert_fn="loop"),
            W.Case("zero tokens on rank 1", CFG, (9, 0), dtype="bfloat16", expert_fn="loop"),
            W.Case("replicated experts", CFG, (30, 17), placement=REPLICATED, dtype="bfloat16", expert_fn="rowwise"),
            W.Case("whole layer", SHARED, (40, 24), routing="router", dtype="bfloat16", expert_fn="loop")]


@needs_two
@pytest.mark.parametrize("transport", ["collective", "p2p"])
def test_two_gpus_bit_identical(transport):
    results = launch(W.check_cases, 2, cases(), "cuda", transport, backend="nccl", timeout_s=120)
    rows = [r for per_rank in results for r in per_rank]
    assert len(rows) == 2 * len(cases())
    bad = [r for r in rows if not r["equal"]]
    assert not bad, bad


@needs_two
def test_failing_rank_over_nccl_ends_job():
    with pytest.raises(dispatch.parallel.RankError, match="boom on gpu rank 1"):
        launch(W.fail_on_rank, 2, 1, "boom on gpu rank 1", backend="nccl", timeout_s=30)


@needs_two
def test_two_gpus_with_the_grouped_gemm():
    """Expert compute = the kernels chapter's grouped GEMM (pinned tiles), replicas included."""
    cases = [W.Case("grouped", CFG, (37, 21), dtype="bfloat16", expert_fn="grouped"),
             W.Case("grouped, replicated", CFG, (30, 17), placement=REPLICATED, dtype="bfloat16", expert_fn="grouped")]
    rows = [r for per_rank in launch(W.check_cases, 2, cases, "cuda", "p2p", backend="nccl", timeout_s=120)
            for r in per_rank]
    assert len(rows) == 4 and all(r["equal"] for r in rows), rows
