"""The OpenAI completions API as data: a request body checked into engine arguments, the answers'
shapes, and errors in OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``.

No HTTP here (:mod:`dispatch.serve.server` is the transport), so every rule is tested directly.
Accepted fields of ``POST /v1/completions``: ``model`` (required, must be served), ``prompt`` (a
string or a list of token ids), ``max_tokens`` (default 16), ``temperature`` (default 1, as OpenAI's;
0 is greedy), ``top_p``, ``seed``, ``stop`` (a string or up to 4), ``stream``, ``stream_options``,
``ignore_eos`` (as vLLM's), ``logprobs`` (0–5: the log-probabilities of that many most likely tokens
at each step, in OpenAI's legacy shape), and ``n``, ``echo``, ``best_of`` only at their defaults.
Any other field is refused by name, so a typo is not silently ignored.
"""
from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass

from dispatch.serve.request import RequestParams

KNOWN = {"model", "prompt", "max_tokens", "temperature", "top_p", "seed", "stop", "stream", "stream_options",
         "ignore_eos", "n", "echo", "logprobs", "best_of", "user", "presence_penalty", "frequency_penalty"}
DEFAULTS_ONLY = {"n": (1, None), "echo": (False, None), "best_of": (1, None),
                 "presence_penalty": (0, 0.0, None), "frequency_penalty": (0, 0.0, None)}


class APIError(Exception):
    """An answer other than 200: HTTP ``status`` and the OpenAI error body."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


@dataclass(frozen=True)
class Parsed:
    prompt_ids: list[int]
    params: RequestParams
    stream: bool
    include_usage: bool


def _number(body: dict, name: str, default, lo: float, hi: float):
    v = body.get(name, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
        raise bad(f"'{name}' must be a number in [{lo}, {hi}], got {v!r}", name)
    return v


def parse_completion(raw: bytes, *, model: str, encode, vocab_size: int, context: int) -> Parsed:
    """Check a ``/v1/completions`` body; APIError(400) naming the field for anything wrong."""
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise bad(f"the body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise bad(f"the body must be a JSON object, got {type(body).__name__}")
    unknown = sorted(set(body) - KNOWN)
    if unknown:
        raise bad(f"unknown field(s) {unknown}", unknown[0])
    for name, allowed in DEFAULTS_ONLY.items():
        if name in body and body[name] not in allowed:
            raise bad(f"'{name}' is not supported here (only its default)", name)
    if body.get("model") != model:
        raise bad(f"the model {body.get('model')!r} does not exist here; this server serves {model!r}", "model",
                  "model_not_found")
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        ids = list(encode(prompt))
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        ids = prompt
        if not all(0 <= t < vocab_size for t in ids):
            raise bad(f"prompt token ids must lie in [0, {vocab_size})", "prompt")
    else:
        raise bad("'prompt' must be a string or a non-empty list of token ids (one prompt per request)", "prompt")
    if not ids:
        raise bad("the prompt encodes to no tokens", "prompt")
    max_tokens = body.get("max_tokens", 16)
    if max_tokens is None:
        max_tokens = 16
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise bad(f"'max_tokens' must be a positive integer, got {max_tokens!r}", "max_tokens")
    if len(ids) >= context:
        raise bad(f"the prompt has {len(ids)} tokens; this model's context is {context} tokens", "prompt",
                  "context_length_exceeded")
    if len(ids) + max_tokens > context:
        raise bad(f"prompt ({len(ids)} tokens) + max_tokens ({max_tokens}) exceeds the context of {context} tokens",
                  "max_tokens", "context_length_exceeded")
    stop = body.get("stop") or ()
    stop = (stop,) if isinstance(stop, str) else stop
    if not isinstance(stop, (list, tuple)) or len(stop) > 4 or not all(isinstance(s, str) and s for s in stop):
        raise bad("'stop' must be a non-empty string or a list of at most 4 of them", "stop")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise bad(f"'seed' must be an integer, got {seed!r}", "seed")
    stream, ignore_eos = body.get("stream", False), body.get("ignore_eos", False)
    for name, v in (("stream", stream), ("ignore_eos", ignore_eos)):
        if not isinstance(v, bool):
            raise bad(f"'{name}' must be true or false, got {v!r}", name)
    logprobs = body.get("logprobs")
    if logprobs is not None and (isinstance(logprobs, bool) or not isinstance(logprobs, int) or not 0 <= logprobs <= 5):
        raise bad(f"'logprobs' must be an integer in [0, 5], got {logprobs!r}", "logprobs")
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict):
        raise bad("'stream_options' must be an object", "stream_options")
    params = RequestParams(max_tokens=max_tokens, temperature=float(_number(body, "temperature", 1.0, 0.0, 2.0)),
                           top_p=float(_number(body, "top_p", 1.0, 1e-9, 1.0)),
                           seed=seed if seed is not None else uuid.uuid4().int % (1 << 63),
                           stop=tuple(stop), ignore_eos=ignore_eos, logprobs=logprobs)
    return Parsed(ids, params, stream, bool(opts.get("include_usage")))


def completion_id() -> str:
    return f"cmpl-{uuid.uuid4().hex}"


def chunk(cid: str, model: str, text: str, finish_reason: str | None, created: int | None = None) -> dict:
    """One streamed piece (or, with every piece's text, the whole answer's choice)."""
    return {"id": cid, "object": "text_completion", "created": created or int(time.time()), "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}]}


def logprobs_body(entries: list, decode, offset: int = 0) -> dict | None:
    """OpenAI's legacy completions ``logprobs`` of ``entries`` = [(token, (own lp, [(token, lp), ...]))];
    ``decode`` one token's text; ``offset`` the first token's place in the answer's text."""
    if not entries:
        return None
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for tok, (own, top) in entries:
        text = decode(tok)
        out["tokens"].append(text)
        out["token_logprobs"].append(own)
        out["top_logprobs"].append({decode(t): lp for t, lp in top})
        out["text_offset"].append(offset)
        offset += len(text)
    return out


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def models(model: str, created: int) -> dict:
    return {"object": "list", "data": [{"id": model, "object": "model", "created": created, "owned_by": "dispatch"}]}


class TextStream:
    """Incremental detokenization: the new text after each token, holding back what a stop string or
    an unfinished UTF-8 sequence could still change."""

    def __init__(self, decode, stop: tuple[str, ...]):
        self.decode, self.hold, self.sent = decode, max((len(s) for s in stop), default=1) - 1, 0

    def push(self, tokens: list[int], stop_at: int | None = None, final: bool = False) -> str:
        text = self.decode(tokens)
        if stop_at is not None:
            end = stop_at
        elif final:
            end = len(text)
        else:
            end = len(text) - self.hold
            while end > self.sent and text[end - 1] == "\ufffd":  # a character still being decoded
                end -= 1
        new = text[self.sent:max(end, self.sent)]
        self.sent = max(end, self.sent)
        return new
