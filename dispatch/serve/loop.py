"""The engine on a thread of its own, fed by an asyncio server (:mod:`dispatch.serve.server`).

Handlers on the event loop never touch the engine: they put commands (add, abort) on a queue that
the engine's thread drains before every step, and each request's outputs come back on its own
asyncio queue (``loop.call_soon_threadsafe``). So a step never races an abort: an abort takes
effect, and the request's blocks return, before the next step. An exception in a step is handed to
every waiting request (they answer 500) and stops the model: ``/health`` then says so, and every
request that comes after is answered at once with the same error, never left waiting.
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time

from dispatch.serve.engine import LLMEngine
from dispatch.serve.scheduler import QueueFull

log = logging.getLogger("dispatch.serve")
SLOW_STEP_S = 1.0  # a step this long is logged (a kernel compiling for a new shape, mostly)


class EngineLoop:
    """The engine's thread: drain commands, step, hand out outputs (see the module docstring)."""

    def __init__(self, engine: LLMEngine, loop: asyncio.AbstractEventLoop):
        self.engine, self.loop = engine, loop
        self.cmds: queue.SimpleQueue = queue.SimpleQueue()
        self.wake = threading.Event()
        self.sinks: dict[int, asyncio.Queue] = {}
        self.closed, self.error = False, None
        self.thread = threading.Thread(target=self._run, name="dispatch-engine", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def close(self) -> None:
        self.closed = True
        self.wake.set()
        self.thread.join(timeout=30)

    async def add(self, prompt: list[int], params) -> tuple[int, asyncio.Queue]:
        """Queue a request; (id, its output queue). QueueFull / ValueError as the engine raises them."""
        fut, sink = self.loop.create_future(), asyncio.Queue()
        self.cmds.put(("add", prompt, params, sink, fut))
        self.wake.set()
        try:
            return await asyncio.shield(fut), sink
        except asyncio.CancelledError:  # the client left before the engine took it: abort it once it has
            fut.add_done_callback(lambda f: f.exception() is None and self.abort(f.result()))
            raise

    def abort(self, rid: int) -> None:
        self.cmds.put(("abort", rid))
        self.wake.set()

    def _answer(self, fut, value=None, exc=None) -> None:
        def set_():
            if not fut.done():
                fut.set_exception(exc) if exc is not None else fut.set_result(value)
        self.loop.call_soon_threadsafe(set_)

    def _drain(self) -> None:
        while True:
            try:
                cmd = self.cmds.get_nowait()
            except queue.Empty:
                return
            if cmd[0] == "add":
                _, prompt, params, sink, fut = cmd
                try:
                    rid = self.engine.add_request(prompt, params)
                except (QueueFull, ValueError) as e:
                    self._answer(fut, exc=e)
                    continue
                self.sinks[rid] = sink
                self._answer(fut, rid)
            else:
                self.sinks.pop(cmd[1], None)
                self.engine.abort(cmd[1])

    def _refuse(self, error: Exception) -> None:
        """After a failed step: answer every command queued or still to come with ``error`` (the model's
        device state cannot be trusted after a fault), until the server closes."""
        while not self.closed:
            try:
                cmd = self.cmds.get(timeout=0.05)
            except queue.Empty:
                continue
            if cmd[0] == "add":
                self._answer(cmd[4], exc=RuntimeError(f"the engine failed earlier: {error}"))

    def _run(self) -> None:
        while not self.closed:
            self._drain()
            if not self.engine.has_work():
                self.wake.wait(0.05)
                self.wake.clear()
                continue
            before = self.engine.steps
            try:
                outs = self.engine.step()
            except Exception as e:  # noqa: BLE001 - every waiting handler must hear of it
                log.exception("engine step failed")
                self.error = e
                for sink in self.sinks.values():
                    self.loop.call_soon_threadsafe(sink.put_nowait, (e, time.perf_counter()))
                self.sinks.clear()
                self._refuse(e)
                return
            now = time.perf_counter()
            last = self.engine.step_log[-1] if self.engine.steps > before else None
            if last is not None and last.seconds > SLOW_STEP_S:
                log.warning("step %d took %.2f s: %d decode rows, %d prompt tokens, %d cached tokens read",
                            self.engine.steps, last.seconds, last.decode_rows, last.prefill_tokens, last.kv_tokens)
            for kernel in self.engine.fresh_compiles():  # a class of step the warm-up missed
                log.warning("step %d compiled %s", self.engine.steps, kernel)
            for o in outs:
                sink = self.sinks.pop(o.id, None) if o.finished else self.sinks.get(o.id)
                if sink is not None:
                    self.loop.call_soon_threadsafe(sink.put_nowait, (o, now))
