"""What a request asks for and what it gets back, and what a step did (:mod:`dispatch.serve.engine`'s data).

Log-probabilities (``RequestParams.logprobs = k``): for each generated token, its own
log-probability under the model's logits (before temperature), and the k most likely tokens with
theirs. The top two give a greedy step's margin: log p1 − log p2 = logit1 − logit2 (the softmax's
normaliser cancels), which tells a near tie — two tokens within round-off — from a real difference.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from dispatch.engine.sampling import SamplingParams

MAX_LOGPROBS = 20


@dataclass(frozen=True)
class RequestParams:
    """What one request asks for: ``max_tokens`` new tokens at most; temperature 0 = greedy."""

    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None  # the log-probabilities of this many most likely tokens, each step

    def __post_init__(self):
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive int, got {self.max_tokens!r}")
        if self.logprobs is not None and (isinstance(self.logprobs, bool) or not isinstance(self.logprobs, int)
                                          or not 0 <= self.logprobs <= MAX_LOGPROBS):
            raise ValueError(f"logprobs must be None or an int in [0, {MAX_LOGPROBS}], got {self.logprobs!r}")
        SamplingParams(self.temperature, self.top_p, self.seed)  # validates them
        if isinstance(self.stop, str) or not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError(f"stop must be a tuple of non-empty strings, got {self.stop!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass
class RequestOutput:
    """What a step did for one request: its new tokens (and all so far), and whether it finished."""

    id: int
    new_tokens: list[int]
    tokens: list[int]
    finished: bool = False
    finish_reason: str | None = None  # "length" | "stop" | "abort"
    stop_at: int | None = None  # where the matched stop string starts in the output text
    # with RequestParams.logprobs: per new token (its log-probability, [(token, log-probability), ...]
    # of the most likely tokens, most likely first)
    logprobs: list[tuple[float, list[tuple[int, float]]]] | None = None


@dataclass
class Completion:
    """A finished request (:meth:`LLMEngine.generate`): tokens, why it stopped, its times."""

    tokens: list[int]
    finish_reason: str
    ttft_s: float = float("nan")
    itl_s: list[float] = field(default_factory=list)  # gaps between consecutive tokens
    margins: list[float] = field(default_factory=list)  # greedy: top-1 minus top-2 logit per token


DEFAULT = RequestParams()


class StepStat(NamedTuple):
    """One step as it ran: decode rows, prompt tokens in chunks, the cached positions the decode
    rows attended to (the KV tokens read per layer) and its wall time — the host's work and the
    device's, which the step waits for when it reads its tokens back."""

    decode_rows: int
    prefill_tokens: int
    kv_tokens: int
    seconds: float

    @property
    def tokens(self) -> int:
        return self.decode_rows + self.prefill_tokens
