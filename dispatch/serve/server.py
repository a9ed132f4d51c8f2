"""An OpenAI-compatible HTTP server over :class:`dispatch.serve.LLMEngine` (aiohttp).

    POST /v1/completions   streaming (server-sent events, ``data: {...}`` then ``data: [DONE]``) or not
    GET  /v1/models        the one served model
    GET  /health           200, or 503 while shutting down or after an engine failure
    GET  /metrics          Prometheus text (:mod:`dispatch.serve.metrics`)

The engine runs on a thread of its own (:class:`dispatch.serve.loop.EngineLoop`), stepping while it has work; handlers
on the event loop talk to it through a command queue (add, abort) that it drains before every step,
and it hands each request's outputs to that request's asyncio queue. A client that goes away — a
closed stream, a cancelled request — cancels its handler, whose ``finally`` aborts the request:
its blocks return before the next step. Bad requests get OpenAI-shaped 400s
(:mod:`dispatch.serve.api`), a full queue a 429 with ``Retry-After``. SIGTERM (or SIGINT) stops
new requests (503), lets the ones in flight finish (up to ``drain_s``), then returns.
"""
from __future__ import annotations

import asyncio
import json
import logging
import signal
import socket
import threading
import time

from aiohttp import web

from dispatch.serve import api
from dispatch.serve.engine import LLMEngine
from dispatch.serve.loop import EngineLoop
from dispatch.serve.metrics import Metrics
from dispatch.serve.scheduler import QueueFull

log = logging.getLogger("dispatch.serve")


class Server:
    """The HTTP side: ``await start()`` → port; ``await shutdown()`` drains and stops."""

    def __init__(self, engine: LLMEngine, tokenizer, model_name: str, *, host: str = "127.0.0.1", port: int = 0,
                 drain_s: float = 30.0, retry_after_s: int = 1):
        self.engine, self.tok, self.model_name = engine, tokenizer, model_name
        self.host, self.port, self.drain_s, self.retry_after_s = host, port, drain_s, retry_after_s
        self.metrics, self.created = Metrics(), int(time.time())
        self.draining, self.active = False, 0
        self.loop_: EngineLoop | None = None
        self.runner: web.AppRunner | None = None

    # ---- lifecycle ----
    async def start(self) -> int:
        app = web.Application(middlewares=[self._errors])
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.prometheus)
        self.loop_ = EngineLoop(self.engine, asyncio.get_running_loop())
        self.loop_.start()
        try:
            self.runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        except TypeError:  # aiohttp < 3.9: disconnects are then seen at the next write
            self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        await web.SockSite(self.runner, sock).start()
        return self.port

    async def shutdown(self) -> None:
        """Refuse new requests, finish the ones in flight (up to ``drain_s``), stop."""
        self.draining = True
        t0 = time.perf_counter()
        while (self.active or self.engine.has_work()) and time.perf_counter() - t0 < self.drain_s:
            await asyncio.sleep(0.02)
        if self.runner is not None:
            await self.runner.cleanup()
        if self.loop_ is not None:
            self.loop_.close()

    def serve_forever(self, ready=None) -> None:
        """Run until SIGTERM / SIGINT, then drain (the ``python -m dispatch.serve`` loop)."""
        async def main():
            port = await self.start()
            stop = asyncio.Event()
            for sig in (signal.SIGTERM, signal.SIGINT):
                asyncio.get_running_loop().add_signal_handler(sig, stop.set)
            (ready or (lambda p: None))(port)
            await stop.wait()
            await self.shutdown()
        asyncio.run(main())

    # ---- handlers ----
    @web.middleware
    async def _errors(self, request, handler):
        try:
            resp = await handler(request)
        except api.APIError as e:
            self.metrics.count(str(e.status))
            return web.json_response(e.body(), status=e.status, headers=e.headers)
        except web.HTTPException as e:  # the router's 404 / 405, in OpenAI's shape
            self.metrics.count(str(e.status))
            return web.json_response(api.APIError(e.status, e.reason, type="invalid_request_error").body(),
                                     status=e.status)
        except asyncio.CancelledError:
            self.metrics.count("disconnected")
            raise
        except Exception:  # noqa: BLE001 - a bug: still an answer in the API's shape
            log.exception("request failed")
            self.metrics.count("500")
            return web.json_response(api.APIError(500, "internal error", type="server_error").body(), status=500)
        return resp

    async def health(self, request):
        if self.draining or (self.loop_ and self.loop_.error):
            return web.json_response({"status": "unavailable"}, status=503)
        return web.json_response({"status": "ok"})

    async def models(self, request):
        return web.json_response(api.models(self.model_name, self.created))

    async def prometheus(self, request):
        return web.Response(text=self.metrics.render(self.engine.stats), content_type="text/plain", charset="utf-8",
                            headers={"X-Prometheus-Format": "0.0.4"})

    async def completions(self, request):
        if self.draining:
            raise api.APIError(503, "the server is shutting down", type="server_error", code="shutting_down")
        if self.loop_.error is not None:
            raise api.APIError(503, f"the engine failed: {self.loop_.error}", type="server_error",
                               code="engine_failed")
        arrival = time.perf_counter()
        parsed = api.parse_completion(await request.read(), model=self.model_name, encode=self._encode,
                                      vocab_size=self.engine.lean.embed.shape[0], context=self.engine.max_model_len)
        try:
            rid, sink = await self.loop_.add(parsed.prompt_ids, parsed.params)
        except QueueFull as e:
            raise api.APIError(429, str(e), type="rate_limit_error", code="queue_full",
                               headers={"Retry-After": str(self.retry_after_s)}) from None
        except ValueError as e:
            raise api.bad(str(e)) from None
        self.active += 1
        done, times = False, []
        try:
            if parsed.stream:
                resp, done = await self._stream(request, parsed, sink, times)
            else:
                resp, done = await self._whole(parsed, sink, times), True
            self.metrics.count("200" if done else "disconnected")
            if done:
                self.metrics.finished(len(parsed.prompt_ids), times, arrival)
            return resp
        finally:
            self.active -= 1
            if not done:
                self.loop_.abort(rid)

    def _encode(self, text: str) -> list[int]:
        return self.tok(text)["input_ids"]

    def _decode(self, tokens: list[int]) -> str:
        return self.tok.decode(tokens, skip_special_tokens=True)

    async def _next(self, sink):
        out, t = await sink.get()
        if isinstance(out, Exception):
            raise RuntimeError(f"the engine failed: {out}") from out
        return out, t

    def _one(self, token: int) -> str:
        return self.tok.decode([token])

    async def _whole(self, parsed, sink, times):
        entries = []
        while True:
            out, t = await self._next(sink)
            times.append(t)
            entries += list(zip(out.new_tokens, out.logprobs or [], strict=False))
            if out.finished:
                break
        text = self._decode(out.tokens)
        text = text[:out.stop_at] if out.stop_at is not None else text
        body = api.chunk(api.completion_id(), self.model_name, text, out.finish_reason)
        body["choices"][0]["logprobs"] = api.logprobs_body(entries, self._one)
        body["usage"] = api.usage(len(parsed.prompt_ids), len(out.tokens))
        return web.json_response(body)

    async def _stream(self, request, parsed, sink, times):
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        cid, created, text = api.completion_id(), int(time.time()), api.TextStream(self._decode, parsed.params.stop)
        offset = 0
        try:
            while True:
                out, _ = await self._next(sink)
                piece = text.push(out.tokens, out.stop_at, final=out.finished)
                body = api.chunk(cid, self.model_name, piece, out.finish_reason, created)
                if out.logprobs:
                    lp = api.logprobs_body(list(zip(out.new_tokens, out.logprobs, strict=True)), self._one, offset)
                    body["choices"][0]["logprobs"] = lp
                    offset = lp["text_offset"][-1] + len(lp["tokens"][-1])
                await resp.write(b"data: " + json.dumps(body).encode() + b"\n\n")
                times.append(time.perf_counter())
                if out.finished:
                    break
            if parsed.include_usage:
                tail = {**api.chunk(cid, self.model_name, "", None, created), "choices": [],
                        "usage": api.usage(len(parsed.prompt_ids), len(out.tokens))}
                await resp.write(b"data: " + json.dumps(tail).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except ConnectionResetError:  # the client closed the stream (seen at a write): the caller aborts
            return resp, False
        return resp, True


class ServerThread:
    """A :class:`Server` on a background thread with its own event loop (tests, notebooks):
    ``port = st.start()``, ``st.stop()`` (drains)."""

    def __init__(self, server: Server):
        self.server, self.loop = server, asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="dispatch-http", daemon=True)

    def start(self, timeout: float = 60.0) -> int:
        self.thread.start()
        return asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(timeout)

    def stop(self, timeout: float = 60.0) -> None:
        asyncio.run_coroutine_threadsafe(self.server.shutdown(), self.loop).result(timeout)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout)
