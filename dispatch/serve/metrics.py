"""What ``GET /metrics`` answers: Prometheus' text format (version 0.0.4), written by hand.

    dispatch_requests_waiting / dispatch_requests_running       gauges (the scheduler's queues)
    dispatch_kv_blocks_used / dispatch_kv_blocks_total          gauges (the paged cache)
    dispatch_requests_total{status="..."}                       counter per outcome (ok, aborted, 4xx, ...)
    dispatch_generated_tokens_total, dispatch_prompt_tokens_total, dispatch_prefix_cache_hit_tokens_total
    dispatch_time_to_first_token_seconds                        histogram (arrival → first token sent)
    dispatch_time_per_output_token_seconds                      histogram (per request: (last − first) / (n − 1))
"""
from __future__ import annotations

import bisect
import threading

TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0)


class Histogram:
    """Cumulative buckets (upper bounds ``le``), their sum and count, as Prometheus keeps them."""

    def __init__(self, buckets: tuple[float, ...]):
        if list(buckets) != sorted(set(buckets)) or not buckets:
            raise ValueError(f"buckets must be increasing and distinct, got {buckets!r}")
        self.buckets, self.counts, self.sum, self.count = buckets, [0] * len(buckets), 0.0, 0

    def observe(self, v: float) -> None:
        i = bisect.bisect_left(self.buckets, v)  # the first bucket whose bound is >= v
        if i < len(self.counts):
            self.counts[i] += 1
        self.sum += v
        self.count += 1

    def lines(self, name: str) -> list[str]:
        out, run = [], 0
        for le, c in zip(self.buckets, self.counts, strict=True):
            run += c
            out.append(f'{name}_bucket{{le="{le}"}} {run}')
        out += [f'{name}_bucket{{le="+Inf"}} {self.count}', f"{name}_sum {self.sum}", f"{name}_count {self.count}"]
        return out


class Metrics:
    """Counters and histograms of one server; ``render(stats)`` adds the engine's gauges. Thread-safe."""

    def __init__(self):
        self._lock = threading.Lock()
        self.requests: dict[str, int] = {}
        self.generated = self.prompt = 0
        self.ttft, self.tpot = Histogram(TTFT_BUCKETS), Histogram(TPOT_BUCKETS)

    def count(self, status: str) -> None:
        with self._lock:
            self.requests[status] = self.requests.get(status, 0) + 1

    def finished(self, prompt_tokens: int, times: list[float], arrival: float) -> None:
        """One request's token send times (``times``) since its ``arrival``."""
        with self._lock:
            self.prompt += prompt_tokens
            self.generated += len(times)
            if times:
                self.ttft.observe(times[0] - arrival)
            if len(times) > 1:
                self.tpot.observe((times[-1] - times[0]) / (len(times) - 1))

    def render(self, stats: dict) -> str:
        with self._lock:
            lines = []

            def metric(name, kind, help_, values):
                lines.extend([f"# HELP {name} {help_}", f"# TYPE {name} {kind}"])
                lines.extend(values)

            metric("dispatch_requests_waiting", "gauge", "Requests waiting for admission.",
                   [f"dispatch_requests_waiting {stats['waiting']}"])
            metric("dispatch_requests_running", "gauge", "Requests in the running batch.",
                   [f"dispatch_requests_running {stats['running']}"])
            metric("dispatch_kv_blocks_used", "gauge", "KV-cache blocks held by sequences.",
                   [f"dispatch_kv_blocks_used {stats['blocks_used']}"])
            metric("dispatch_kv_blocks_total", "gauge", "KV-cache blocks in the pool.",
                   [f"dispatch_kv_blocks_total {stats['blocks_total']}"])
            metric("dispatch_requests_total", "counter", "Requests answered, by outcome.",
                   [f'dispatch_requests_total{{status="{k}"}} {v}' for k, v in sorted(self.requests.items())])
            metric("dispatch_generated_tokens_total", "counter", "Tokens generated.",
                   [f"dispatch_generated_tokens_total {self.generated}"])
            metric("dispatch_prompt_tokens_total", "counter", "Prompt tokens of finished requests.",
                   [f"dispatch_prompt_tokens_total {self.prompt}"])
            metric("dispatch_prefix_cache_hit_tokens_total", "counter", "Prompt tokens found in the prefix cache.",
                   [f"dispatch_prefix_cache_hit_tokens_total {stats['prefix_hit_tokens']}"])
            metric("dispatch_time_to_first_token_seconds", "histogram", "Arrival to first token sent.",
                   self.ttft.lines("dispatch_time_to_first_token_seconds"))
            metric("dispatch_time_per_output_token_seconds", "histogram", "Per request: mean gap between tokens.",
                   self.tpot.lines("dispatch_time_per_output_token_seconds"))
            return "\n".join(lines) + "\n"
