"""Is the shipped model a demo worth running? Two measurable promises, on files it never trained on.

    python -m dispatch_book.demo --model cpu [--prompts 50] [--temperature 0.5] [--top-p 0.9] [--seed 0]

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
_DEF = re.compile(r"^([ \t]*)def [A-Za-z_]\w*\(.*\):[ \t]*$", re.M)


def loop_period(tokens: list[int], max_period: int = MAX_PERIOD, repeats: int = REPEATS) -> int | None:
    """The shortest period p ≤ max_period such that the last p·repeats tokens are one block of p
    repeated, else None."""
    for p in range(1, max_period + 1):
        n = p * repeats
        if len(tokens) >= n and all(tokens[-n + i] == tokens[-n + i % p] for i in range(n)):
            return p
    return None


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


def measure(model: str = "cpu", count: int = 50, temperature: float = 0.5, top_p: float = 0.9,
            seed: int = 0) -> dict:
    import torch

    from dispatch.engine import Engine, SamplingParams
    from dispatch.train import load

    torch.set_num_threads(1)
    loaded = load(model)
    tok = loaded.tokenizer
    items = prompts(tok, count)
    longest = max(len(ids) for ids, _ in items)
    eos = loaded.model.generation_config.eos_token_id
    eng = Engine(loaded.model, max_batch=count, max_seq=longest + NEW_TOKENS, graphs=False)
    ids = [i for i, _ in items]
    greedy = eng.generate(ids, NEW_TOKENS, SamplingParams(), stop_tokens=(eos,)).tokens
    sampled = eng.generate(ids, NEW_TOKENS, SamplingParams(temperature, top_p, seed), stop_tokens=(eos,)).tokens
    rows = []
    for (_, def_line), g, s in zip(items, greedy, sampled, strict=True):
        stopped = bool(s) and s[-1] == eos
        text = tok.decode(s, skip_special_tokens=True)
        rows.append({"def": def_line.strip(), "greedy_loop_period": loop_period(g[:NEW_TOKENS]),
                     "sampled_parses": function_parses(def_line, text, stopped), "sampled": text})
    n = len(rows)
    return {"model": model, "prompts": n, "temperature": temperature, "top_p": top_p, "seed": seed,
            "greedy_without_loop": sum(r["greedy_loop_period"] is None for r in rows) / n,
            "sampled_parse_share": sum(r["sampled_parses"] for r in rows) / n, "rows": rows}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m dispatch_book.demo", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="cpu")
    ap.add_argument("--prompts", type=int, default=50)
    ap.add_argument("--temperature", type=float, default=0.5)
    ap.add_argument("--top-p", type=float, default=0.9)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the measurement here")
    a = ap.parse_args(argv)
    if a.prompts < 1:
        raise SystemExit(f"--prompts must be >= 1, got {a.prompts}")
    res = measure(a.model, a.prompts, a.temperature, a.top_p, a.seed)
    for r in res["rows"]:
        loop = f"loop of {r['greedy_loop_period']}" if r["greedy_loop_period"] else "no loop"
        print(f"{r['def'][:60]:60s} greedy: {loop:11s} sampled: {'parses' if r['sampled_parses'] else 'fails'}")
    print(f"{res['prompts']} held-out prompts: greedy without a loop {res['greedy_without_loop']:.0%}, "
          f"sampled completions that parse {res['sampled_parse_share']:.0%} "
          f"(temperature {a.temperature}, top-p {a.top_p}, seed {a.seed})")
    if a.json:
        from dispatch.files import write_text

        write_text(pathlib.Path(a.json), json.dumps(res, indent=1) + "\n")
    return res


if __name__ == "__main__":
    sys.exit(main() and None)
