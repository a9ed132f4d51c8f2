"""dispatch: serving Mixture-of-Experts layers fast, built chapter by chapter.

    from dispatch import MoEConfig, MoEWeights, MoELayer, moe, PRESETS, random_weights

Shape legend, used in names and docstrings everywhere:
    T tokens · H hidden · I expert intermediate · E experts · K experts per token
    N = T·K routed rows · P padded sorted rows · R ranks

Only :mod:`dispatch.runtime` loads with the package (it decides, before any kernel is defined,
whether Triton runs compiled or interpreted); the names below load on first use, so
``import dispatch.config`` compiles no kernel. Kernel entry points: :mod:`dispatch.ops`.
The package's layers (each imports only from the ones below it) are in CONTRIBUTING.md.
"""
import importlib
import sys
import types

from dispatch import runtime  # first: turns on Triton's interpreter without CUDA, before any kernel is defined

_LAZY = {"PRESETS": "dispatch.config", "MoEConfig": "dispatch.config", "MoEWeights": "dispatch.config",
         "random_weights": "dispatch.config", "MoELayer": "dispatch.moe", "moe": "dispatch.moe"}

__all__ = ["PRESETS", "MoEConfig", "MoELayer", "MoEWeights", "moe", "random_weights", "runtime"]
__version__ = "0.1.0"


def __getattr__(name: str):
    """``dispatch.MoELayer`` and friends, imported when first asked for; submodules as attributes
    (``dispatch.balance`` after ``from dispatch import balance``) are Python's own."""
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'dispatch' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


class _Package(types.ModuleType):
    """``dispatch.moe`` is the function :func:`dispatch.moe.moe`, as the front door promises, even once
    the submodule of that name is loaded (the import system records a loaded submodule as an attribute
    of its package: here it is ignored, the module stays in ``sys.modules``)."""

    @property
    def moe(self):
        return importlib.import_module("dispatch.moe").moe

    @moe.setter
    def moe(self, module) -> None:
        pass


sys.modules[__name__].__class__ = _Package
