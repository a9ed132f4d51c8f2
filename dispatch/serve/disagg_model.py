"""When disaggregation pays: TTFT and TPOT of two layouts of the same two GPUs, simulated step by step.

    co-located     2 replicas, each a chapter 8 engine (continuous batching, chunked prefill: a step
                   holds the decode rows and up to ``budget`` tokens of prompt chunks); a
                   load-balancer deals the requests round-robin
    disaggregated  1 prefill GPU (prompts only; the first token leaves from there) → the KV handoff
                   over one link (first come, first served) → 1 decode GPU (decode rows only)

Inputs are measured step times, each a function of the tokens in a step (:class:`StepCurve`,
piecewise linear between measured points): ``prefill(T)`` for a step that carries prompt tokens (T
counts every token of the step, decode rows too) and ``decode(B)`` for a step of B decode rows
only. The simulation replays a seeded Poisson stream of requests through the scheduler's rule
(decode rows first, then chunks, then admissions, in arrival order) and reads each request's
token times. One request alone (rate → 0), prompt P ≤ budget, N output tokens:

    co-located      TTFT = prefill(P)                 TPOT = decode(1)
    disaggregated   TTFT = prefill(P)                 TPOT = decode(1) + handoff(P) / (N − 1)

(the first token is streamed by the prefill GPU; the handoff delays the second). Memory (KV blocks)
and preemption are not modelled: a layout is compared where its cache holds its batch.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class StepCurve:
    """Seconds of one step against its tokens: measured points, linear between them; flat below the
    first point; past the last, the last segment's slope (or proportional, with one point)."""

    tokens: tuple[int, ...]
    seconds: tuple[float, ...]

    def __post_init__(self):
        if not self.tokens or len(self.tokens) != len(self.seconds):
            raise ValueError(f"tokens and seconds must be non-empty and of one length, got {self.tokens}, "
                             f"{self.seconds}")
        if list(self.tokens) != sorted(set(self.tokens)) or self.tokens[0] < 1:
            raise ValueError(f"tokens must be increasing positive ints, got {self.tokens}")
        if not all(s > 0 and math.isfinite(s) for s in self.seconds):
            raise ValueError(f"seconds must be positive and finite, got {self.seconds}")

    def __call__(self, n: int) -> float:
        xs, ys = self.tokens, self.seconds
        if n <= xs[0]:
            return ys[0]
        if len(xs) == 1:
            return ys[0] * n / xs[0]
        i = min(bisect.bisect_left(xs, n), len(xs) - 1)  # the segment (xs[i-1], xs[i]) holds n, or the last
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return max(y0 + (y1 - y0) * (n - x0) / (x1 - x0), 1e-12)


@dataclass(frozen=True)
class Workload:
    """``n`` requests at ``rate`` per second (Poisson, seeded); prompts drawn uniformly from
    ``prompts``; ``output`` tokens each (the first included)."""

    rate: float
    prompts: tuple[int, ...]
    output: int
    n: int = 200
    seed: int = 0

    def __post_init__(self):
        if not self.rate > 0:
            raise ValueError(f"rate must be > 0 requests/s, got {self.rate!r}")
        if not self.prompts or any(isinstance(p, bool) or not isinstance(p, int) or p < 1 for p in self.prompts):
            raise ValueError(f"prompts must be positive token counts, got {self.prompts!r}")
        for name in ("output", "n"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")

    def draw(self) -> tuple[list[float], list[int]]:
        """(arrival times, prompt lengths), the same for a given seed on any machine."""
        g = torch.Generator().manual_seed(self.seed)
        gaps = torch.empty(self.n, dtype=torch.float64).exponential_(self.rate, generator=g)
        arrivals = torch.cumsum(gaps, 0) - gaps[0]  # the first request at t = 0
        picks = torch.randint(len(self.prompts), (self.n,), generator=g)
        return arrivals.tolist(), [self.prompts[i] for i in picks.tolist()]


@dataclass(frozen=True)
class Layout:
    """The engines' step budget and batch limit, and the handoff: ``kv_bytes_per_token`` over a link
    of ``link_gbps`` GB/s plus ``link_latency_s`` per request. ``prefill_budget``: the prefill GPU's
    step budget when it serves prompts only (no decode rows to keep steady; None: ``budget``)."""

    budget: int = 512
    max_seqs: int = 64
    prefill_budget: int | None = None
    kv_bytes_per_token: int = 0
    link_gbps: float = 25.0
    link_latency_s: float = 0.0

    def __post_init__(self):
        if self.budget < 1 or self.max_seqs < 1 or self.kv_bytes_per_token < 0 or not self.link_gbps > 0 \
                or (self.prefill_budget is not None and self.prefill_budget < 1) or self.link_latency_s < 0:
            raise ValueError(f"budgets and max_seqs must be >= 1, bytes and latency >= 0, the link > 0: {self}")

    def handoff_s(self, prompt: int) -> float:
        return self.link_latency_s + prompt * self.kv_bytes_per_token / (self.link_gbps * 1e9)


def run_engine(arrivals: list[float], prompts: list[int], outputs: list[int], prefill: StepCurve,
               decode: StepCurve, budget: int, max_seqs: int) -> list[list[float]]:
    """Token times of each request through one engine (chapter 8's scheduling rule). ``prompts[i]``
    0: the request arrives with its prompt computed elsewhere (a decode row from its first step);
    ``outputs[i]``: the tokens it gets here."""
    order = sorted(range(len(arrivals)), key=lambda i: arrivals[i])
    times: list[list[float]] = [[] for _ in arrivals]
    p_left, o_left = list(prompts), list(outputs)
    running: list[int] = []
    nxt, t = 0, 0.0
    waiting: list[int] = []
    while nxt < len(order) or waiting or running:
        while nxt < len(order) and arrivals[order[nxt]] <= t:
            waiting.append(order[nxt])
            nxt += 1
        if not waiting and not running:
            t = arrivals[order[nxt]]
            continue
        left = budget
        rows = [i for i in running if p_left[i] == 0][:left]
        left -= len(rows)
        chunks = []
        for i in running:
            if p_left[i] > 0 and left > 0:
                chunks.append((i, min(p_left[i], left)))
                left -= chunks[-1][1]
        while waiting and left > 0 and len(running) < max_seqs:
            i = waiting.pop(0)
            running.append(i)
            if p_left[i] == 0:
                rows.append(i)
                left -= 1
            else:
                chunks.append((i, min(p_left[i], left)))
                left -= chunks[-1][1]
        n_chunk = sum(n for _, n in chunks)
        t += prefill(len(rows) + n_chunk) if n_chunk else decode(len(rows))
        for i, n in chunks:
            p_left[i] -= n
        for i in rows + [i for i, _ in chunks if p_left[i] == 0]:
            times[i].append(t)
            o_left[i] -= 1
            if o_left[i] == 0:
                running.remove(i)
    return times


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(x for x in xs if not math.isnan(x))
    if not xs:
        return float("nan")
    return xs[min(len(xs) - 1, max(0, math.ceil(q / 100 * len(xs)) - 1))]  # nearest rank


def _summary(arrivals, times, output: int) -> dict:
    ttft = [ts[0] - a for a, ts in zip(arrivals, times, strict=True)]
    tpot = [(ts[-1] - ts[0]) / (output - 1) if output > 1 else float("nan") for ts in times]
    return {"ttft_p50": _pct(ttft, 50), "ttft_p99": _pct(ttft, 99), "tpot_p50": _pct(tpot, 50),
            "tpot_p99": _pct(tpot, 99)}


def colocated(w: Workload, prefill: StepCurve, decode: StepCurve, lay: Layout, replicas: int = 2) -> dict:
    """Two (``replicas``) independent engines, requests dealt round-robin in arrival order."""
    arrivals, prompts = w.draw()
    times: list[list[float]] = [[] for _ in arrivals]
    for r in range(replicas):
        mine = list(range(r, w.n, replicas))
        got = run_engine([arrivals[i] for i in mine], [prompts[i] for i in mine], [w.output] * len(mine),
                         prefill, decode, lay.budget, lay.max_seqs)
        for i, ts in zip(mine, got, strict=True):
            times[i] = ts
    return _summary(arrivals, times, w.output)


def disaggregated(w: Workload, prefill: StepCurve, decode: StepCurve, lay: Layout) -> dict:
    """One prefill engine (each request leaves after its first token), the link, one decode engine."""
    arrivals, prompts = w.draw()
    first = run_engine(arrivals, prompts, [1] * w.n, prefill, decode, lay.prefill_budget or lay.budget, lay.max_seqs)
    landed, link = [0.0] * w.n, 0.0
    for i in sorted(range(w.n), key=lambda i: first[i][0]):  # the link: one handoff at a time
        link = landed[i] = max(first[i][0], link) + lay.handoff_s(prompts[i])
    times = [list(ts) for ts in first]
    if w.output > 1:
        rest = run_engine(landed, [0] * w.n, [w.output - 1] * w.n, prefill, decode, lay.budget, lay.max_seqs)
        for i in range(w.n):
            times[i] += rest[i]
    return _summary(arrivals, times, w.output)


def predict(prefill: StepCurve, decode: StepCurve, lay: Layout, *, rates, prompt_mixes, output: int,
            n: int = 200, seed: int = 0) -> list[dict]:
    """One row per (layout, prompt mix, rate): TTFT and TPOT p50/p99 in seconds."""
    rows = []
    for mix in prompt_mixes:
        for rate in rates:
            w = Workload(float(rate), tuple(mix), output, n, seed)
            for name, fn in (("colocated", colocated), ("disaggregated", disaggregated)):
                rows.append({"layout": name, "prompt": round(sum(mix) / len(mix)), "rate": float(rate),
                             **fn(w, prefill, decode, lay)})
    return rows


def crossover(rows: list[dict], metric: str = "tpot_p50") -> dict[int, float | None]:
    """Per mean prompt length: the lowest rate from which disaggregation's ``metric`` is lower than
    co-location's at every larger rate measured (None: never)."""
    out = {}
    for prompt in sorted({r["prompt"] for r in rows}):
        pair = {}
        for r in rows:
            if r["prompt"] == prompt:
                pair.setdefault(r["rate"], {})[r["layout"]] = r[metric]
        rates = sorted(pair)
        wins = [pair[x]["disaggregated"] < pair[x]["colocated"] for x in rates]
        out[prompt] = next((rates[i] for i in range(len(rates)) if all(wins[i:])), None)
    return out
