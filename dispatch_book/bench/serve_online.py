"""The online half of ``python -m dispatch_book.bench serve``: servers in processes of their own,
driven over HTTP by :mod:`dispatch_book.bench.serve_load`.

    with server("ours", folder, ...) as url: ...     # python -m dispatch.serve --model FOLDER
    with server("hf_serve", folder, ...) as url: ... # transformers serve FOLDER --continuous-batching

Both load the same checkpoint folder (weights, config, tokenizer) and get the same requests: token-id
prompts for ours, the same tokens as words for transformers (the folder's word tokenizer maps them
back one for one; :func:`dispatch_book.bench.serve_peers.word_tokenizer`). A server that does not
start — a missing package, no ``/v1/completions``, a time-out — raises :class:`DidNotRun` with the
reason and its last lines of output; the suite records it as a row, never as a number.
"""
from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator

from dispatch_book.bench import serve_load
from dispatch_book.bench.serve_peers import as_text, cb_blocks


class DidNotRun(RuntimeError):
    """A contestant that could not be measured (the message says why)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# transformers' runs (its server here, its continuous batching in serve.offline_row) take PyTorch's SDPA without the
# cuDNN backend: that backend fails intermittently inside transformers' paged SDPA ("mha_graph.execute(...)
# .is_good()", pytorch/pytorch#190321; an H100 run of `transformers serve` died of it at its first rate and
# answered 503 from then on). SDPA then picks flash or memory-efficient attention, as the issue advises.
PEER_ATTENTION = "PyTorch SDPA without its cuDNN backend (pytorch/pytorch#190321: it fails intermittently)"
_HF_SERVE = ("import runpy, sys, torch; torch.backends.cuda.enable_cudnn_sdp(False); sys.argv[0] = 'transformers'; "
             "runpy.run_module('transformers.cli.transformers', run_name='__main__')")


@contextlib.contextmanager
def peer_attention():
    """In-process transformers runs: SDPA without cuDNN (:data:`PEER_ATTENTION`), restored on exit."""
    import torch

    was = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(False)
    try:
        yield
    finally:
        torch.backends.cuda.enable_cudnn_sdp(was)


def last_error(path: str | None, n: int = 200) -> str | None:
    """The last line of a server's log that names an error (``...Error: ...``), or None."""
    if not path or not os.path.exists(path):
        return None
    lines = [ln.strip() for ln in open(path, errors="replace") if "Error" in ln and ":" in ln]
    return lines[-1][:n] if lines else None


def _command(kind: str, folder: str, port: int, *, max_seqs: int, max_step_tokens: int,
             cache_tokens: int | None = None) -> list[str]:
    if kind == "ours":
        return [sys.executable, "-m", "dispatch.serve", "--model", folder, "--served-model-name", "model",
                "--port", str(port), "--max-seqs", str(max_seqs), "--max-step-tokens", str(max_step_tokens),
                "--max-waiting", "100000"]
    if kind == "hf_serve":  # `transformers serve`, with the attention backends of peer_attention()
        return [sys.executable, "-c", _HF_SERVE, "serve", folder, "--continuous-batching",
                "--host", "127.0.0.1", "--port", str(port), "--cb-max-batch-tokens", str(max_step_tokens),
                *(() if cache_tokens is None else ("--cb-num-blocks", str(cb_blocks(cache_tokens))))]
    raise ValueError(f"no server kind {kind!r}")


def _die_with_parent() -> None:
    """In the child before it runs (Linux): SIGTERM when the process that started it dies, however it
    dies (a benchmark killed by its time limit must not leave a server holding the GPU's memory)."""
    import ctypes

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1


@contextlib.contextmanager
def server(kind: str, folder: str, *, max_seqs: int = 256, max_step_tokens: int = 2048, start_s: float = 180,
           log_path: str | None = None, cache_tokens: int | None = None):
    """A server process on 127.0.0.1; yields (url, model name to ask for). Stopped (SIGTERM, then
    SIGKILL) on exit. ``cache_tokens`` bounds transformers' KV cache (None: it sizes it from free memory)."""
    port = free_port()
    if kind == "hf_serve":  # its /v1/models scans the hub cache and answers 500 where the folder does not exist
        from huggingface_hub.constants import HF_HUB_CACHE
        os.makedirs(HF_HUB_CACHE, exist_ok=True)
    cmd = _command(kind, folder, port, max_seqs=max_seqs, max_step_tokens=max_step_tokens, cache_tokens=cache_tokens)
    log = open(log_path or os.devnull, "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                            preexec_fn=_die_with_parent if sys.platform == "linux" else None)
    url, name = f"http://127.0.0.1:{port}", "model" if kind == "ours" else folder
    try:
        t0 = time.perf_counter()
        while True:
            if proc.poll() is not None:
                raise DidNotRun(f"{kind} exited with {proc.returncode} before answering: {_tail(log_path)}")
            if time.perf_counter() - t0 > start_s:
                raise DidNotRun(f"{kind} did not answer within {start_s:.0f} s: {_tail(log_path)}")
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"{url}/v1/models", timeout=2) as r:
                    if r.status == 200:
                        break
            time.sleep(0.5)
        yield url, name
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        log.close()


def _tail(path: str | None, n: int = 400) -> str:
    if not path or not os.path.exists(path):
        return "(no log)"
    return open(path, errors="replace").read()[-n:].replace("\n", " | ")


def requests_for(kind: str, reqs: list) -> list:
    """Ours takes token ids; transformers' text API takes the same tokens as words."""
    if kind == "ours":
        return reqs
    return [serve_load.Request(as_text(r.prompt), r.max_tokens) for r in reqs]


def sweep(kind: str, url: str, name: str, reqs: list, rates: list[float], *, slo_ttft_s: float, slo_tpot_s: float,
          seed: int = 0, deadline: float = math.inf) -> Iterator[dict]:
    """One row per rate (Poisson arrivals), in order, each as soon as it is measured (a later rate that
    fails or is cut off loses only itself); a rate that would pass ``deadline`` is skipped."""
    body, eos = requests_for(kind, reqs), kind == "ours"  # transformers' API takes no ignore_eos:
    asyncio.run(serve_load.run_load(url, name, body[:4], math.inf, seed=seed, ignore_eos=eos))  # warm-up
    for rate in rates:  # (the saved model has no end-of-sequence token, so both run to max_tokens)
        if time.perf_counter() > deadline:
            yield {"rate": rate, "skipped": "time budget spent"}
            continue
        recs, wall = asyncio.run(serve_load.run_load(url, name, body, rate, seed=seed, ignore_eos=eos))
        yield {"rate": rate, **serve_load.summary(recs, wall, slo_ttft_s=slo_ttft_s, slo_tpot_s=slo_tpot_s)}


def max_rate_within(rows: list[dict], tpot_p99_ms: float) -> float | None:
    """The highest measured rate whose TPOT p99 stays within ``tpot_p99_ms`` (None if none does)."""
    ok = [r["rate"] for r in rows if r.get("tpot_ms", {}).get("p99") is not None and r["tpot_ms"]["p99"] <= tpot_p99_ms
          and not r.get("failed")]
    return max(ok) if ok else None
