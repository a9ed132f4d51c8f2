"""Expert parallelism (chapter 4): experts spread over ranks, each token sent once per rank.

    Placement     which rank holds which experts (:mod:`dispatch.placement`, beside the load balancer
                  that plans it: contiguous by default, replicas allowed)
    dispatch.py   dispatch / combine over torch.distributed (NCCL on GPUs, gloo on CPU)
    p2p.py        the peer-to-peer path: Triton kernels store tokens into the peer's memory
    layer.py      ExpertParallelMoE / parallelize(MoELayer): the grouped GEMM on each rank's experts
    launch.py     run a function on R ranks (notebooks, tests); torchrun helpers; fault handling
"""
from dispatch.parallel.dispatch import DispatchMeta, combine, dispatch
from dispatch.parallel.launch import RankError, launch
from dispatch.parallel.layer import ExpertParallelMoE, parallelize
from dispatch.placement import Placement

__all__ = ["DispatchMeta", "ExpertParallelMoE", "Placement", "RankError", "combine", "dispatch", "launch",
           "parallelize"]
