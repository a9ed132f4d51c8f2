"""dispatch: serving Mixture-of-Experts layers fast, built chapter by chapter.

Shape legend, used in names and docstrings everywhere:
    T tokens · H hidden · I expert intermediate · E experts · K experts per token
    N = T·K routed rows · P padded sorted rows · R ranks
"""
from dispatch import runtime  # noqa: F401  (first: sets TRITON_INTERPRET before triton loads)
from dispatch.config import MoEConfig

__all__ = ["MoEConfig", "runtime"]
__version__ = "0.1.0"
