"""Serve a model over HTTP with the OpenAI completions API.

    python -m dispatch.serve --model cpu                       # the shipped model, on a CPU
    python -m dispatch.serve --model PATH_OR_HUB_ID --port 8000 --max-seqs 128
    curl localhost:8000/v1/completions -d '{"model": "cpu", "prompt": "def ", "max_tokens": 32}'

``--model cpu`` is the small OLMoE trained on Python's standard library that ships with the package;
a checkpoint folder or a hub id loads through ``dispatch.train.load`` (a GPU when there is one).
Needs aiohttp (``pip install 'dispatch[serve]'``). Prints ``listening on http://HOST:PORT`` once
ready (``--port 0``: a free port); SIGTERM drains the requests in flight, then exits.
"""
from __future__ import annotations

import argparse
import sys


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m dispatch.serve", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="cpu", help="'cpu' (bundled checkpoint), a checkpoint folder or a hub id")
    p.add_argument("--served-model-name", default=None, help="the name clients ask for (default: --model)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--max-seqs", type=int, default=None, help="running sequences at once (CPU 16, GPU 256)")
    p.add_argument("--max-step-tokens", type=int, default=None, help="tokens per step (CPU 64, GPU 2048)")
    p.add_argument("--max-waiting", type=int, default=1024, help="queued requests before 429")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--num-blocks", type=int, default=None, help="KV blocks (default: from free memory)")
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--no-graphs", action="store_true")
    p.add_argument("--no-prefix-caching", action="store_true")
    p.add_argument("--drain-s", type=float, default=30.0, help="SIGTERM: longest wait for requests in flight")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: torch's)")
    return p.parse_args(argv)


def build(a: argparse.Namespace):
    """(engine, tokenizer, served name) from the parsed arguments."""
    import torch

    from dispatch import runtime
    from dispatch.serve import EngineConfig, LLMEngine
    from dispatch.train import load

    if a.threads:
        torch.set_num_threads(a.threads)
    loaded = load(a.model, device=a.device, dtype=a.dtype)
    dev = loaded.model.device
    cfg = EngineConfig(block_size=a.block_size, num_blocks=a.num_blocks, max_model_len=a.max_model_len,
                       max_seqs=a.max_seqs or runtime.pick("auto", cpu=16, gpu=256, dev=dev),
                       max_step_tokens=a.max_step_tokens or runtime.pick("auto", cpu=64, gpu=2048, dev=dev),
                       max_waiting=a.max_waiting, prefix_caching=not a.no_prefix_caching,
                       graphs=False if a.no_graphs else None)
    return LLMEngine(loaded.model, cfg, tokenizer=loaded.tokenizer), loaded.tokenizer, a.served_model_name or a.model


def main(argv=None) -> None:
    a = parse(argv)
    try:
        from dispatch.serve.server import Server
    except ImportError as e:
        raise SystemExit(f"the server needs aiohttp: pip install 'dispatch[serve]' ({e})") from None
    engine, tok, name = build(a)
    engine.warmup()  # kernels compiled, decode graphs captured: the first requests do not pay for it
    server = Server(engine, tok, name, host=a.host, port=a.port, drain_s=a.drain_s)
    server.serve_forever(ready=lambda port: print(f"listening on http://{a.host}:{port} (model {name!r})",
                                                  flush=True))
    print("drained, stopped", flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
