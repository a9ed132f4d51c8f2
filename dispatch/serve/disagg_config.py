"""What disaggregated serving is configured with and answers (:mod:`dispatch.serve.disagg`)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from dispatch import runtime

BACKENDS = ("auto", "gloo", "nccl", "ipc")


@dataclass(frozen=True)
class DisaggConfig:
    """Both workers' engine settings (as :class:`EngineConfig`), the transport and the time bounds.
    ``model``: a checkpoint name for :func:`dispatch.train.load` ("cpu": the shipped model) or
    "module:function" building it; ``backend`` "auto": NCCL with two GPUs, else gloo on CPU; "ipc" (asked
    for by name): both workers on cuda:0, the decode worker copying the KV blocks straight out of the
    prefill worker's pool through CUDA IPC, at most ``max_inflight`` requests' blocks held for it
    (without a GPU: both on CPU, the pool in shared memory — the stand-in the tests run)."""

    model: str = "cpu"
    dtype: str = "auto"
    block_size: int = 16
    num_blocks: int | None = None
    max_seqs: int = 64
    max_step_tokens: int = 512
    prefix_caching: bool = True
    backend: str = "auto"
    max_inflight: int = 8  # handoffs the prefill worker holds before it waits for the decode side
    timeout_s: float = 60.0
    start_timeout_s: float = 180.0

    def __post_init__(self):
        for name in ("block_size", "max_seqs", "max_step_tokens", "max_inflight"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if self.num_blocks is not None and (isinstance(self.num_blocks, bool) or not isinstance(self.num_blocks, int)
                                            or self.num_blocks < 1):
            raise ValueError(f"num_blocks must be a positive int or None, got {self.num_blocks!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))}, got {self.backend!r}")
        for name in ("timeout_s", "start_timeout_s"):
            if not isinstance(getattr(self, name), (int, float)) or not getattr(self, name) > 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {getattr(self, name)!r}")
        if not isinstance(self.model, str) or not self.model:
            raise ValueError(f"model must be a checkpoint name or 'module:function', got {self.model!r}")

    @property
    def resolved_backend(self) -> str:
        if self.backend != "auto":
            return self.backend
        return "nccl" if torch.cuda.device_count() >= 2 else "gloo"

    def check_devices(self) -> None:
        """ValueError unless this machine has the GPUs the resolved backend needs."""
        n, backend = torch.cuda.device_count(), self.resolved_backend
        if backend == "nccl" and n < 2:
            raise ValueError(f"nccl needs two GPUs, found {n}")


class WorkerError(RuntimeError):
    """A worker failed; the message names it (prefill or decode) and the cause."""


@dataclass
class Result:
    """One request's answer: tokens, why it stopped ("length" | "stop" | "error"), its times (router clock)."""

    tokens: list[int]
    finish_reason: str | None = None
    error: str | None = None
    arrival: float = 0.0
    times: list[float] = field(default_factory=list)
    n_expected: int | None = None
    handoff_bytes: int = 0
    handoff_s: float = float("nan")

    @property
    def ttft_s(self) -> float:
        return self.times[0] - self.arrival if self.times else float("nan")

    @property
    def tpot_s(self) -> float:
        n = len(self.times)
        return (self.times[-1] - self.times[0]) / (n - 1) if n > 1 else float("nan")

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None and (self.error is not None or len(self.tokens) == self.n_expected)


def _death(code: int | None) -> str:
    return runtime.exit_cause(code)
