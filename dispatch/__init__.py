"""dispatch: serving Mixture-of-Experts layers fast, built chapter by chapter.

    from dispatch import MoEConfig, MoEWeights, MoELayer, moe, PRESETS, random_weights

Shape legend, used in names and docstrings everywhere:
    T tokens · H hidden · I expert intermediate · E experts · K experts per token
    N = T·K routed rows · P padded sorted rows · R ranks
"""
from dispatch import runtime  # first: turns on Triton's interpreter without CUDA, before any kernel is defined
from dispatch.config import PRESETS, MoEConfig, MoEWeights, random_weights
from dispatch.moe import MoELayer, moe

__all__ = ["PRESETS", "MoEConfig", "MoELayer", "MoEWeights", "moe", "random_weights", "runtime"]
__version__ = "0.1.0"
