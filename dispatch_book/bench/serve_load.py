"""A load generator for any OpenAI-compatible completions server (ours, vLLM, ``transformers serve``).

    wl = workload(n=64, prompt=(100, 1024), output=(100, 1024), vocab=V, seed=0)  # token-id prompts
    recs = asyncio.run(run_load(url, model, wl, rate=4.0))      # Poisson arrivals at 4 req/s (inf: all at once)
    summary(recs, slo_ttft_s=1.0, slo_tpot_s=0.05)             # TTFT / TPOT / ITL p50-p90-p99, tok/s, goodput

Every request streams (server-sent events, ``ignore_eos`` so it runs to its ``max_tokens``); a record
keeps its send time, the arrival time of every streamed piece and the token count the server reports
(``stream_options.include_usage``; else the number of pieces). TTFT = first piece − send; TPOT =
(last piece − first piece) / (tokens − 1); ITL = the gaps between pieces. Goodput = the requests that
met both objectives, per second of the run. :func:`reliability` mixes in disconnects and malformed
requests and checks the server's answers. Needs aiohttp (on the GPU image; ``pip install aiohttp``).
"""
from __future__ import annotations

import asyncio
import json
import math
import random
import time
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Request:
    prompt: list[int]
    max_tokens: int


@dataclass
class Record:
    sent: float = 0.0
    pieces: list[float] = field(default_factory=list)
    tokens: int = 0
    text: str = ""
    status: int = 0
    finish_reason: str | None = None
    error: str | None = None
    token_texts: list[str] = field(default_factory=list)  # with logprobs: each token's text
    margins: list[float | None] = field(default_factory=list)  # with logprobs >= 2: log p1 - log p2


def workload(n: int, prompt: tuple[int, int], output: tuple[int, int], vocab: int, seed: int = 0) -> list[Request]:
    """``n`` requests, prompt and output lengths uniform in the given inclusive ranges, random tokens."""
    rng = random.Random(seed)
    return [Request([rng.randrange(2, vocab) for _ in range(rng.randint(*prompt))], rng.randint(*output))
            for _ in range(n)]


def arrivals(n: int, rate: float, seed: int = 0) -> list[float]:
    """Send offsets (s) of a Poisson process at ``rate`` req/s (all 0 for an infinite rate)."""
    if math.isinf(rate):
        return [0.0] * n
    rng = np.random.default_rng(seed)
    return np.cumsum(rng.exponential(1.0 / rate, n)).tolist()


async def complete(session, url: str, body: dict, *, stop_after: int | None = None, timeout: float = 600) -> Record:
    """One streamed completion. ``stop_after``: close the connection after that many pieces."""
    import aiohttp

    rec = Record(sent=time.perf_counter())
    try:
        async with session.post(f"{url}/v1/completions", json=body,
                                timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            rec.status = resp.status
            if resp.status != 200:
                rec.error = (await resp.text())[:300]
                return rec
            async for line in resp.content:
                if not line.startswith(b"data: "):
                    continue
                data = line[6:].strip()
                if data == b"[DONE]":
                    break
                msg = json.loads(data)
                if msg.get("usage"):
                    rec.tokens = msg["usage"]["completion_tokens"]
                for ch in msg.get("choices", []):
                    rec.pieces.append(time.perf_counter())
                    rec.text += ch.get("text") or ""
                    rec.finish_reason = ch.get("finish_reason") or rec.finish_reason
                    _add_logprobs(rec, ch.get("logprobs"))
                if stop_after is not None and len(rec.pieces) >= stop_after:
                    resp.close()  # the client goes away mid-stream
                    rec.error = "disconnected"
                    return rec
    except (aiohttp.ClientError, asyncio.TimeoutError) as e:
        rec.error = f"{type(e).__name__}: {e}"
    rec.tokens = rec.tokens or len(rec.pieces)
    return rec


def _add_logprobs(rec: Record, lp: dict | None) -> None:
    if not lp:
        return
    for text, top in zip(lp.get("tokens", []), lp.get("top_logprobs", []), strict=False):
        vals = sorted((top or {}).values(), reverse=True)
        rec.token_texts.append(text)
        rec.margins.append(vals[0] - vals[1] if len(vals) >= 2 else None)


def body_of(model: str, req: Request, ignore_eos: bool = True, logprobs: int | None = None) -> dict:
    """A greedy streamed request; ``ignore_eos`` (a vLLM extension) only where the server takes it;
    ``logprobs``: ask for the top tokens' log-probabilities (margins of near ties)."""
    body = {"model": model, "prompt": req.prompt, "max_tokens": req.max_tokens, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True}}
    if logprobs is not None:
        body["logprobs"] = logprobs
    return {**body, "ignore_eos": True} if ignore_eos else body


async def run_load(url: str, model: str, reqs: list[Request], rate: float, *, seed: int = 0, ignore_eos: bool = True,
                   logprobs: int | None = None, concurrency: int = 1024, timeout: float = 600
                   ) -> tuple[list[Record], float]:
    """Send ``reqs`` at Poisson ``rate``; (records in request order, wall seconds of the run)."""
    import aiohttp

    offsets = arrivals(len(reqs), rate, seed)
    conn = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=conn) as session:
        t0 = time.perf_counter()

        async def one(req, at):
            await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
            return await complete(session, url, body_of(model, req, ignore_eos, logprobs), timeout=timeout)

        recs = await asyncio.gather(*(one(r, at) for r, at in zip(reqs, offsets, strict=True)))
        return list(recs), time.perf_counter() - t0


def _pcts(values: list[float], scale: float = 1e3) -> dict:
    if not values:
        return {"p50": None, "p90": None, "p99": None, "mean": None}
    a = np.asarray(values) * scale
    return {"p50": float(np.percentile(a, 50)), "p90": float(np.percentile(a, 90)), "p99": float(np.percentile(a, 99)),
            "mean": float(a.mean())}


def summary(recs: list[Record], wall_s: float, *, slo_ttft_s: float, slo_tpot_s: float) -> dict:
    """TTFT, TPOT and ITL percentiles (ms), output tok/s, goodput (req/s and share within both SLOs)."""
    ok = [r for r in recs if r.status == 200 and r.error is None and r.pieces]
    ttft = [r.pieces[0] - r.sent for r in ok]
    tpot = [(r.pieces[-1] - r.pieces[0]) / (r.tokens - 1) for r in ok if r.tokens > 1]
    itl = [b - a for r in ok for a, b in zip(r.pieces, r.pieces[1:], strict=False)]
    good = sum(1 for r in ok if r.pieces[0] - r.sent <= slo_ttft_s
               and (r.tokens <= 1 or (r.pieces[-1] - r.pieces[0]) / (r.tokens - 1) <= slo_tpot_s))
    out_tokens = sum(r.tokens for r in ok)
    return {"requests": len(recs), "completed": len(ok), "failed": len(recs) - len(ok), "wall_s": wall_s,
            "output_tokens": out_tokens, "output_tok_s": out_tokens / wall_s if wall_s else float("nan"),
            "ttft_ms": _pcts(ttft), "tpot_ms": _pcts(tpot), "itl_ms": _pcts(itl),
            "goodput_req_s": good / wall_s if wall_s else float("nan"), "goodput_share": good / max(len(recs), 1),
            "slo": {"ttft_s": slo_ttft_s, "tpot_s": slo_tpot_s},
            "errors": sorted({r.error for r in recs if r.error})[:5]}


def malformed_bodies(model: str) -> list[bytes]:
    """Bodies a server must answer with a 400 in OpenAI's error shape."""
    m = json.dumps(model)
    bodies = [f'{{"model": {m}, "prompt": [1], "max_tokens": 0}}', f'{{"model": {m}, "prompt": [1], "n": 3}}',
              f'{{"model": {m}, "prompt": [1], "max_tokens": 100000000}}', f'{{"model": {m}, "prompt": []}}',
              f'{{"model": {m}, "prompt": [1], "temperature": "hot"}}', '{"model": "no-such-model", "prompt": [1]}',
              '{not json', '[1, 2]']
    return [b.encode() for b in bodies]


async def reliability(url: str, model: str, reqs: list[Request], *, disconnect: float = 0.1, malformed: float = 0.05,
                      concurrency: int = 64, seed: int = 0, timeout: float = 600, into: dict | None = None) -> dict:
    """Send ``reqs`` (greedy, streamed) with ``concurrency`` in flight: a share of them is cut off
    mid-stream, a share replaced by malformed bodies. Returns the counts by status, the texts of the
    completed requests (index → text) and what went wrong (5xx, malformed not answered 400).
    ``into``: a dict filled as answers arrive (what a cancelled run got that far)."""
    import aiohttp

    rng, bad = random.Random(seed), malformed_bodies(model)
    kinds = ["malformed" if x < malformed else "disconnect" if x < malformed + disconnect else "full"
             for x in (rng.random() for _ in reqs)]
    sem = asyncio.Semaphore(concurrency)
    rep = into if into is not None else {}
    rep.update(statuses={}, texts={}, records={}, problems=[],
               kinds={k: kinds.count(k) for k in ("full", "disconnect", "malformed")})
    statuses: dict[int, int] = rep["statuses"]
    texts: dict[int, str] = rep["texts"]
    done: dict[int, Record] = rep["records"]
    problems: list[str] = rep["problems"]
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:
        async def one(i, req, kind):
            async with sem:
                if kind == "malformed":
                    raw = bad[i % len(bad)]
                    async with session.post(f"{url}/v1/completions", data=raw,
                                            headers={"Content-Type": "application/json"}) as resp:
                        body = await resp.json(content_type=None)
                        st = resp.status
                        if st != 400 or set(body.get("error", {})) != {"message", "type", "param", "code"}:
                            problems.append(f"malformed #{i}: {st} {str(body)[:120]}")
                else:
                    stop = rng.randint(1, 3) if kind == "disconnect" else None
                    rec = await complete(session, url, body_of(model, req, ignore_eos=False, logprobs=2),
                                         stop_after=stop, timeout=timeout)
                    st = rec.status
                    if kind == "full" and st == 200 and rec.error is None:
                        texts[i], done[i] = rec.text, rec
                    elif kind == "full" and st != 429:
                        problems.append(f"request #{i}: {st} {rec.error}")
                statuses[st] = statuses.get(st, 0) + 1
                if st >= 500:
                    problems.append(f"#{i}: status {st}")

        await asyncio.gather(*(one(i, r, k) for i, (r, k) in enumerate(zip(reqs, kinds, strict=True))))
    return rep


def first_difference(ours: Record, alone: Record) -> dict | None:
    """Where a completed answer first differs from the same request sent alone: the token index and
    the alone run's margin there (log p1 − log p2, the logit gap of its two best tokens; a near tie
    when it is within round-off), or None when the texts agree."""
    if ours.text == alone.text:
        return None
    j = next((k for k, (a, b) in enumerate(zip(ours.token_texts, alone.token_texts, strict=False)) if a != b),
             min(len(ours.token_texts), len(alone.token_texts)))
    margin = alone.margins[j] if j < len(alone.margins) else None
    return {"token": j, "margin_alone": margin}
