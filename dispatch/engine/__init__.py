"""A whole model: the transformers experts backend and a CUDA-graph decode engine.

    from dispatch.engine import Engine, SamplingParams, register
    register()                                   # experts_implementation="dispatch" in transformers
    eng = Engine(model, max_batch=8, max_seq=256)
    out = eng.generate(prompt_ids, max_new_tokens=64)
"""
from dispatch.engine.backend import register, set_cpu_path, use_dispatch_experts
from dispatch.engine.engine import BUCKETS, Engine, Generation, bucket
from dispatch.engine.model import LeanModel
from dispatch.engine.sampling import SamplingParams, sample

__all__ = ["BUCKETS", "Engine", "Generation", "LeanModel", "SamplingParams", "bucket", "register", "sample",
           "set_cpu_path", "use_dispatch_experts"]
