"""Expert parallelism (chapter 4): experts spread over ranks, rows sent to them and back.

    placement.py  which rank holds which experts (contiguous by default, replicas allowed)
    dispatch.py   dispatch / combine over torch.distributed (NCCL on GPUs, gloo on CPU)
    p2p.py        the peer-to-peer path: a Triton kernel writes rows into the peer's memory
    experts.py    pluggable expert compute (bit-identical whatever the batch split)
    layer.py      ExpertParallelMoE and the single-device layer it matches bit for bit
    launch.py     run a function on N ranks (notebooks, tests); torchrun helpers; fault handling
    workers.py    the functions ranks run (picklable)
    bench.py      ``torchrun --nproc_per_node N -m dispatch_book.bench.parallel``
"""
from dispatch.parallel.dispatch import DispatchMeta, combine, combine_topk, dispatch
from dispatch.parallel.layer import ExpertParallelMoE, moe_single
from dispatch.parallel.launch import RankError, launch
from dispatch.parallel.placement import Placement

__all__ = ["DispatchMeta", "ExpertParallelMoE", "Placement", "RankError", "combine", "combine_topk", "dispatch",
           "launch", "moe_single"]
