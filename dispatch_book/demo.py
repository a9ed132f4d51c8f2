"""Is the shipped model a demo worth running? Two measurable promises, on files it never trained on.

    python -m dispatch_book.demo [--model cpu --model demo] [--prompts 50] [--temperature 0.5] [--top-p 0.9]
                                 [--seeds 0,1,2] [--device cpu] [--json PATH]

The prompts are ``--prompts`` function definitions spread evenly over the validation files of the
standard-library corpus (``dispatch.data``: validation files are held out by file), each the
last ``PROMPT_TOKENS`` tokens of its file up to the end of the ``def`` line, so the model continues
a function body it has not seen. Two measures:

* **no loop under greedy decoding**: the first 64 new tokens do not end in a *loop*, a block of
  1 to ``MAX_PERIOD`` tokens repeated at least ``REPEATS`` times in a row (``loop_period``);
* **sampled code that parses**: one sampled completion per prompt, cut to the function (the lines
  until the first line indented no deeper than the ``def``, and without the last line when it was
  cut mid-way), parses with ``ast.parse`` (``function_parses``). A body with no complete line is
  a failure.

Each model's validation perplexity in windows of ``EVAL_SEQ`` tokens (``val_ppl``) is measured beside
them, and the README's showcase (``showcase``): ``python -m dispatch.generate --prompt "def main("``,
64 greedy tokens with the prompt's end healed (the default) and without, each with the first
``MAX_PERIOD``-token block repeated ``REPEATS`` times in a row anywhere in it (``first_loop``), if any.
The shares and each prompt's verdicts are printed; ``--json PATH`` writes them.
"""
from __future__ import annotations

import argparse
import ast
import json
import pathlib
import re
import sys

PROMPT_TOKENS = 48  # the file up to the end of the def line, its last 48 tokens
NEW_TOKENS = 64
MAX_PERIOD = 16
REPEATS = 3
EVAL_SEQ, EVAL_TOKENS = 128, 65536  # the validation windows of val_ppl (the cpu preset's final evaluation)
SHOWCASE = "def main("
_DEF = re.compile(r"^([ \t]*)def [A-Za-z_]\w*\(.*\):[ \t]*$", re.M)


def loop_period(tokens: list[int], max_period: int = MAX_PERIOD, repeats: int = REPEATS) -> int | None:
    """The shortest period p ≤ max_period such that the last p·repeats tokens are one block of p
    repeated, else None."""
    for p in range(1, max_period + 1):
        n = p * repeats
        if len(tokens) >= n and all(tokens[-n + i] == tokens[-n + i % p] for i in range(n)):
            return p
    return None


def first_loop(tokens: list[int], max_period: int = MAX_PERIOD, repeats: int = REPEATS) -> tuple[int, int] | None:
    """(end, period) of the first place where a block of ≤ max_period tokens has been repeated
    ``repeats`` times in a row (:func:`loop_period` of every prefix), else None."""
    for end in range(1, len(tokens) + 1):
        p = loop_period(tokens[:end], max_period, repeats)
        if p:
            return end, p
    return None


def showcase(model: str, device: str = "cpu") -> dict:
    """The README's command on ``model``, 64 greedy tokens, healed and not: the text and its first loop."""
    import io

    from dispatch.generate import main as generate

    out = {}
    for name, flags in (("healed", []), ("unhealed", ["--no-heal"])):
        rep = generate(["--model", model, "--device", device, "--prompt", SHOWCASE, "--max-new-tokens",
                        str(NEW_TOKENS), *flags], out=io.StringIO())
        out[name] = {"text": rep["texts"][0], "first_loop": first_loop(rep["tokens"][0])}
    return out


def function_text(def_line: str, completion: str, complete: bool) -> str:
    """The def line and the completion's lines that belong to its body; the last line is dropped
    when generation stopped in the middle of it (``complete`` False)."""
    indent = len(def_line) - len(def_line.lstrip())
    lines = completion.split("\n")
    if lines and lines[0].strip() == "":
        lines = lines[1:]
    body = []
    for line in lines:
        if line.strip() and len(line) - len(line.lstrip()) <= indent:
            complete = True  # the function ended on a finished line
            break
        body.append(line)
    if not complete and body:
        body = body[:-1]
    return "\n".join([def_line.strip("\n")[indent:], *(b[indent:] if not b[:indent].strip() else b.lstrip()
                                                       for b in body)])


def function_parses(def_line: str, completion: str, complete: bool) -> bool:
    text = function_text(def_line, completion, complete)
    if len([line for line in text.split("\n")[1:] if line.strip() and not line.strip().startswith("#")]) == 0:
        return False
    try:
        ast.parse(text)
    except (SyntaxError, ValueError):
        return False
    return True


def prompts(tok, count: int) -> list[tuple[list[int], str]]:
    """(token ids, def line) for ``count`` functions spread evenly over every ``def`` of the validation files."""
    from dispatch import data

    found = [(text, m) for text in data.split_texts("val") for m in _DEF.finditer(text)]
    if len(found) < count:
        raise ValueError(f"the validation files hold {len(found)} functions, fewer than --prompts {count}")
    out = []
    for j in range(count):
        text, m = found[j * len(found) // count]
        ids = tok(text[:m.end()])["input_ids"]  # one encoding: no token boundary the corpus never had
        out.append((ids[-PROMPT_TOKENS:], m.group(0)))
    return out


def same_corpus(preset: str = "demo") -> str:
    """SystemExit unless this machine's corpus (``dispatch.data.stdlib_dir``, ``$DISPATCH_STDLIB``) is the
    one the shipped cpu model was trained on; then puts that model's tokenizer in the tokenizer cache for
    ``preset``'s vocabulary, so a model trained here shares its vocabulary token for token. Returns the
    corpus hash."""
    from dispatch import data
    from dispatch.train import ASSETS, PRESETS

    shipped = ASSETS / "cpu"
    want = json.loads((shipped / "manifest.json").read_text())["hash"]
    have = data.manifest()["hash"]
    if have != want:
        raise SystemExit(f"the corpus at {data.stdlib_dir()} hashes to {have}, the shipped model's to {want}: "
                         "set DISPATCH_STDLIB to a copy of the *.py files of its Python's standard library")
    vocab = json.loads((shipped / "config.json").read_text())["vocab_size"]
    if PRESETS[preset].vocab_size != vocab:
        raise SystemExit(f"preset {preset!r} has vocab_size {PRESETS[preset].vocab_size}, the shipped model {vocab}")
    (data.cache_dir() / f"bpe-{have}-{vocab}.json").write_bytes((shipped / "tokenizer.json").read_bytes())
    return have


def val_ppl(loaded, seq_len: int = EVAL_SEQ, tokens: int = EVAL_TOKENS) -> float:
    """Perplexity on ``tokens`` tokens of the validation files in windows of ``seq_len`` (one window
    length for every model: a longer context alone lowers a perplexity)."""
    from dispatch import data
    from dispatch.routertap import evaluate

    ids = data.encode_split(loaded.tokenizer, "val")
    return evaluate(loaded.model, data.windows(ids, seq_len, tokens), bias_LE=loaded.bias_LE)["ppl"]


def measure(model: str = "cpu", count: int = 50, temperature: float = 0.5, top_p: float = 0.9,
            seeds: tuple[int, ...] = (0,), device: str = "cpu") -> dict:
    """Both measures of ``model`` (a preset name with a committed checkpoint or a folder): greedy once,
    one sampled completion per prompt and seed; and :func:`val_ppl`."""
    import torch

    from dispatch.engine import Engine, SamplingParams
    from dispatch.generate import cpu_threads
    from dispatch.train import load

    loaded = load(model, device=device)
    ppl = val_ppl(loaded)
    tok = loaded.tokenizer
    items = prompts(tok, count)
    longest = max(len(ids) for ids, _ in items)
    eos = loaded.model.generation_config.eos_token_id
    before = torch.get_num_threads()
    torch.set_num_threads(cpu_threads(loaded.model))  # the thread count dispatch.generate decodes with
    try:
        eng = Engine(loaded.model, max_batch=count, max_seq=longest + NEW_TOKENS, graphs=False)
        ids = [i for i, _ in items]
        greedy = eng.generate(ids, NEW_TOKENS, SamplingParams(), stop_tokens=(eos,)).tokens
        sampled = [eng.generate(ids, NEW_TOKENS, SamplingParams(temperature, top_p, seed), stop_tokens=(eos,)).tokens
                   for seed in seeds]
    finally:
        torch.set_num_threads(before)
    rows = []
    for j, ((_, def_line), g) in enumerate(zip(items, greedy, strict=True)):
        texts = [tok.decode(s[j], skip_special_tokens=True) for s in sampled]
        parses = [function_parses(def_line, t, bool(s[j]) and s[j][-1] == eos)
                  for t, s in zip(texts, sampled, strict=True)]
        rows.append({"def": def_line.strip(), "greedy_loop_period": loop_period(g[:NEW_TOKENS]),
                     "greedy": tok.decode(g, skip_special_tokens=True), "sampled_parses": parses, "sampled": texts})
    n = len(rows)
    params = sum(p.numel() for p in loaded.model.parameters())
    return {"model": str(model), "params": params, "device": device, "prompts": n, "temperature": temperature,
            "top_p": top_p, "seeds": list(seeds), f"val_ppl_{EVAL_SEQ}": round(ppl, 3),
            "greedy_without_loop": sum(r["greedy_loop_period"] is None for r in rows) / n,
            "sampled_parse_share": [sum(r["sampled_parses"][k] for r in rows) / n for k in range(len(seeds))],
            "showcase": showcase(model, device), "rows": rows}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m dispatch_book.demo", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", help="a preset with a committed checkpoint or a folder; "
                    "repeat it to measure several (default: the demo model, see dispatch.train.demo_model)")
    ap.add_argument("--prompts", type=int, default=50)
    ap.add_argument("--temperature", type=float, default=0.5)
    ap.add_argument("--top-p", type=float, default=0.9)
    ap.add_argument("--seeds", default="0", help="comma-separated sampling seeds, one sampled completion each")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", help="write the measurement here")
    a = ap.parse_args(argv)
    if a.prompts < 1:
        raise SystemExit(f"--prompts must be >= 1, got {a.prompts}")
    try:
        seeds = tuple(int(s) for s in a.seeds.split(","))
    except ValueError:
        raise SystemExit(f"--seeds must be comma-separated integers, got {a.seeds!r}") from None
    from dispatch.train import demo_model

    res = {"command": "python -m dispatch_book.demo " + " ".join(sys.argv[1:] if argv is None else argv),
           "models": []}
    for model in a.model or [demo_model()]:
        m = measure(model, a.prompts, a.temperature, a.top_p, seeds, a.device)
        res["models"].append(m)
        for r in m["rows"]:
            loop = f"loop of {r['greedy_loop_period']}" if r["greedy_loop_period"] else "no loop"
            verdicts = " ".join("parses" if ok else "fails " for ok in r["sampled_parses"])
            print(f"{r['def'][:60]:60s} greedy: {loop:11s} sampled: {verdicts}")
        for name, sc in m["showcase"].items():
            loop = "no loop" if sc["first_loop"] is None else "loops by token {}: period {}".format(*sc["first_loop"])
            print(f"{SHOWCASE!r} greedy, {name}: {loop}: {SHOWCASE + sc['text'][:50]!r}")
        shares = "/".join(f"{s:.0%}" for s in m["sampled_parse_share"])
        print(f"{model} ({m['params'] / 1e6:.1f}M parameters, val ppl {m[f'val_ppl_{EVAL_SEQ}']} in "
              f"{EVAL_SEQ}-token windows), {m['prompts']} held-out prompts: greedy without a loop "
              f"{m['greedy_without_loop']:.0%}, sampled completions that parse {shares} (temperature "
              f"{a.temperature}, top-p {a.top_p}, seeds {a.seeds})")
    if a.json:
        from dispatch.files import write_text

        write_text(pathlib.Path(a.json), json.dumps(res, indent=1) + "\n")
    return res


if __name__ == "__main__":
    sys.exit(main() and None)
