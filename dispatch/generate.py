"""Generate text with the decode engine, streaming it as it comes.

    python -m dispatch.generate --model cpu --prompt "def " --max-new-tokens 64
    python -m dispatch.generate --model PATH_OR_HUB_ID --prompt "..." --batch 8 --temperature 0.8 --top-p 0.9
    python -m dispatch.generate --model cpu --prompt "def " --quant int8

``--model cpu`` is the small OLMoE trained on Python's standard library that ships with the
package (offline); ``--model demo``, where it ships, a larger one (~12M parameters) on the same data,
the default then. Row 0 streams; with ``--batch B`` the other rows (the same prompt, sampled with
their own draws) are printed at the end. The last line gives prefill and decode tokens/s.

On a CPU, ``--threads auto`` (the default) decodes a small model (under ``SMALL_MODEL_PARAMS``, as
the shipped one) on one torch thread, a larger one on torch's default (one per core): see
``cpu_threads``. ``--threads N`` sets it.

``--quant int8|fp8`` (or a scheme of ``dispatch.quant.SCHEMES``; int8 = int8-channel, fp8 =
fp8-channel) quantizes the routed experts first. On a GPU they run on the quantized kernels (fp8
needs sm_89+: an older GPU is refused with a clear error); on CPU they compute on the dequantized
codes in plain PyTorch — the same numbers the kernels compute, not their speed.

A prompt that fills the model's context (``max_position_embeddings``) is refused; one that leaves
less room than ``--max-new-tokens`` generates up to the context, with a warning (transformers warns
the same way, then runs past it).

**Token healing** (on unless ``--no-heal``; transformers' ``generate(token_healing=True)``, from
Microsoft's guidance library): a prompt typed by hand often ends inside what the tokenizer would
have made one token. ``def main(`` encodes as ``def``, `` main``, ``(``, but byte-pair encoding
merges ``():`` into one token, so in training a lone ``(`` token was almost always followed by an
argument, and the model continues ``def main(file, file=file, …``. Healing backs the prompt up by its
last token and lets the first new token be any token that starts with that token's text (``(``,
``():``, ``(*``, …), chosen as the rest are (greedy or sampled); the text then continues the prompt
as typed, and the model reads ``def main():`` tokenized as it was in training. :func:`heal`.
"""
from __future__ import annotations

import argparse
import math
import sys
import warnings

# Below this many parameters a model decodes on one torch thread on CPU (cpu_threads).
SMALL_MODEL_PARAMS = 200_000_000


def cpu_threads(model, requested: str | int = "auto") -> int:
    """Torch threads for decoding ``model`` on the CPU: ``requested`` if a number, else (``auto``) 1 for a
    model under SMALL_MODEL_PARAMS and torch's default (one per physical core) above.

    A small model's decode step is hundreds of tiny ops (the shipped model: hidden size 128). Each
    op that torch splits over threads ends in a barrier, which costs more than the op's work, and on a
    machine whose cores are busy with other work a thread waiting for a descheduled one stalls the
    step. Measured on a 2-core machine, greedy decode of 64 tokens, tokens/s at 1 and 2 threads:
    the shipped model quiet, about 340 against 124 (batch 1); under load (load average ~10), 46-77
    against 2-3 (batch 1) and 330-356 against 10-19 (batch 8); random OLMoE-shaped models of 8, 32 and
    122M parameters under the same load, 42-62 against 2-4, 22-25 against 1-2 and 14-18 against 1.
    Bigger models (a hub model of billions of parameters) are bound by memory bandwidth, which more
    cores do add to: they keep torch's default."""
    import torch

    if requested != "auto":
        if not str(requested).isdigit() or int(requested) < 1:
            raise ValueError(f"--threads must be 'auto' or a positive number, got {requested!r}")
        return int(requested)
    params = sum(p.numel() for p in model.parameters())
    return 1 if params < SMALL_MODEL_PARAMS else torch.get_num_threads()


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m dispatch.generate", description=__doc__.splitlines()[0])
    p.add_argument("--model", help="'cpu' or 'demo' (bundled checkpoints), a checkpoint folder or a hub id "
                   "(default: 'demo' where it is bundled, else 'cpu')")
    p.add_argument("--prompt", required=True)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--batch", type=int, default=1, help="rows generated at once (1-256)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--no-graphs", action="store_true", help="run the decode step eagerly on CUDA")
    p.add_argument("--threads", default="auto", help="torch threads on CPU: auto (1 for a small model) or a number")
    p.add_argument("--quant", default=None, help="quantize the experts: int8 | fp8 | a dispatch.quant scheme")
    p.add_argument("--no-heal", action="store_true", help="keep the prompt's last token (no token healing)")
    a = p.parse_args(argv)
    if a.max_new_tokens < 1:
        p.error(f"--max-new-tokens must be >= 1, got {a.max_new_tokens}")
    if not 1 <= a.batch <= 256:
        p.error(f"--batch must be 1..256 rows, got {a.batch}")
    if not (math.isfinite(a.temperature) and a.temperature >= 0):
        p.error(f"--temperature must be a finite number >= 0 (0 = greedy), got {a.temperature}")
    if not 0 < a.top_p <= 1:
        p.error(f"--top-p must lie in (0, 1], got {a.top_p}")
    return a


def fit_context(prompt_len: int, max_new_tokens: int, context: int | None) -> int:
    """The new tokens that fit the model's context: ValueError if the prompt fills it, fewer than
    asked (with a warning) if the prompt leaves less room."""
    if context is None or prompt_len + max_new_tokens <= context:
        return max_new_tokens
    if prompt_len >= context:
        raise ValueError(f"the prompt is {prompt_len} tokens; the model's context is {context} "
                         "(max_position_embeddings): no room to generate")
    warnings.warn(f"prompt ({prompt_len} tokens) + --max-new-tokens {max_new_tokens} exceeds the model's "
                  f"context of {context} tokens: generating {context - prompt_len}", stacklevel=2)
    return context - prompt_len


def main(argv: list[str] | None = None, out=None) -> dict:
    """Run the command; returns the timings (and the text of every row) as a dict."""
    from dispatch.engine import SamplingParams
    from dispatch.engine.quant import quantize, scheme_name
    from dispatch.train import demo_model, load

    a = parse(argv)
    out = out or sys.stdout
    params = SamplingParams(a.temperature, a.top_p, a.seed)
    try:
        scheme = None if a.quant is None else scheme_name(a.quant)  # a bad name fails before loading
    except ValueError as e:
        raise SystemExit(f"dispatch.generate: --quant: {e}") from None
    threads = None if a.threads == "auto" else cpu_threads(None, a.threads)  # a bad number fails before loading
    try:
        a.model = a.model or demo_model()
        loaded = load(a.model, device=a.device, dtype=a.dtype)
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(f"dispatch.generate: --model {a.model}: {e}") from None
    if scheme is not None:
        quantize(loaded.model, scheme)
    import torch

    before = torch.get_num_threads()
    on_cpu = next(loaded.model.parameters()).device.type == "cpu"
    if on_cpu:
        threads = threads or cpu_threads(loaded.model)
        torch.set_num_threads(threads)
    try:
        return _generate(a, loaded, scheme, params, out, threads if on_cpu else None)
    finally:
        torch.set_num_threads(before)  # main() is also called from Python: leave the process as it was


def heal(last_logits, tok, ids: list[int], params, rows: int = 1) -> tuple[list[list[int]], str] | None:
    """Token healing (module docstring): ``ids`` backed up by its last token, plus one first token per
    row that starts with that token's text, chosen by ``params`` (greedy: the most likely; sampled: a draw,
    seeded by ``params.seed``) → (the rows' prompts, the text backed up); None when there is nothing to
    heal (a one-token prompt, or no other token starts with the last one's text). ``last_logits(prefix)``:
    the model's logits [V] after the token ids ``prefix``."""
    import torch

    from dispatch.engine.sampling import sample

    tail = tok.decode(ids[-1:])
    if len(ids) < 2 or not tail or "\ufffd" in tail:  # (a piece of a UTF-8 character: left as it is)
        return None
    special = set(getattr(tok, "all_special_ids", ()))
    # compared as the vocabulary's own strings, which keep a leading space however the tokenizer marks it
    # (GPT-2's "Ġ", SentencePiece's "▁"), where decoding one token alone may drop it
    pieces = tok.convert_ids_to_tokens(list(range(len(tok))))
    last = pieces[ids[-1]] if ids[-1] < len(pieces) else None
    if not last:
        return None
    fits = [i for i, t in enumerate(pieces) if t and t.startswith(last) and i not in special]
    if len(fits) < 2:
        return None
    logits = last_logits(ids[:-1]).float()
    masked = torch.full_like(logits, float("-inf"))
    masked[fits] = logits[fits]
    if params.greedy:
        first = sample(masked[None]).expand(rows)
    else:
        dev = logits.device
        g = torch.Generator(dev).manual_seed(params.seed)
        t, p = torch.tensor(params.temperature, device=dev), torch.tensor(params.top_p, device=dev)
        first = sample(masked.expand(rows, -1), t, p, generator=g)
    return [ids[:-1] + [f] for f in first.tolist()], tail


def _generate(a, loaded, scheme, params, out, threads) -> dict:
    import time

    import torch

    from dispatch.engine import Engine, Generation

    tok = loaded.tokenizer
    ids = tok(a.prompt)["input_ids"]
    if not ids:
        raise SystemExit(f"dispatch.generate: --prompt {a.prompt!r} encodes to no tokens: give it some text")
    try:
        new_tokens = fit_context(len(ids), a.max_new_tokens,
                                 getattr(loaded.model.config, "max_position_embeddings", None))
    except ValueError as e:
        raise SystemExit(f"dispatch.generate: {e}") from None
    eos = loaded.model.generation_config.eos_token_id
    stop = tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (eos,))
    eng = Engine(loaded.model, max_batch=a.batch, max_seq=len(ids) + new_tokens,
                 graphs=False if a.no_graphs else None)

    def last_logits(prefix: list[int]):  # the engine's own forward (its experts, quantized or not)
        x = torch.tensor([prefix], device=eng.dev)
        with torch.no_grad():
            return eng.model(x, torch.arange(len(prefix), device=eng.dev)[None],
                             eng.model.new_cache(1, len(prefix)), prefill=True)[0, -1]

    t0 = time.perf_counter()
    healed = None if a.no_heal else heal(last_logits, tok, ids, params, a.batch)
    heal_s = time.perf_counter() - t0
    prompts, tail = healed or ([ids] * a.batch, "")
    firsts = [p[-1] for p in prompts] if healed else [None] * a.batch  # new tokens before the engine's
    out.write(a.prompt)
    row0 = [firsts[0]] if healed else []
    shown = tok.decode(row0, skip_special_tokens=True)
    out.write(shown[len(tail):])
    out.flush()

    def on_token(new):
        nonlocal shown
        if new[0] is None or firsts[0] in stop:  # a healed first token that ends the text
            return
        row0.append(new[0])
        text = tok.decode(row0, skip_special_tokens=True)
        out.write(text[len(shown):])
        out.flush()
        shown = text

    if new_tokens > bool(healed):
        res = eng.generate(prompts, new_tokens - bool(healed), params, stop_tokens=stop, on_token=on_token)
    else:  # the healed token was all there was to generate
        res = Generation([[] for _ in prompts])
    out.write("\n")
    rows = [t if f is None else [f] if f in stop else [f, *t] for f, t in zip(firsts, res.tokens, strict=True)]
    texts = [tok.decode(t, skip_special_tokens=True)[len(tail):] for t in rows]
    for b in range(1, a.batch):
        out.write(f"--- row {b}\n{a.prompt}{texts[b]}\n")
    ttft = heal_s + (res.ttft_s or 0.0)
    report = {"quant": scheme, "threads": threads, "prefill_tok_s": res.prefill_tok_s, "decode_tok_s": res.decode_tok_s,
              "ttft_s": ttft, "batch": a.batch, "new_tokens": [len(t) for t in rows], "tokens": rows, "texts": texts,
              "healed": None if healed is None else [tail, tok.decode(rows[0][:1])]}
    on = f"{eng.dev} ({threads} thread{'s' * (threads > 1)})" if threads else str(eng.dev)
    fix = f" · prompt end healed: {tail!r} → {report['healed'][1]!r}" if healed else ""
    speed = (f"prefill {res.prompt_tokens} tokens: {res.prefill_tok_s:,.0f} tok/s · decode {res.decode_steps} "
             f"steps x {a.batch} rows: {res.decode_tok_s:,.0f} tok/s" if res.prompt_tokens else
             "the healed token was the one new token")
    out.write(f"[{speed} · time to first token {ttft * 1e3:.1f} ms · {on}, "
              f"{'CUDA graphs' if eng.graphs else 'eager'}{', experts ' + scheme if scheme else ''}{fix}]\n")
    return report


if __name__ == "__main__":
    main()
