"""Text to train and measure on, with nothing to download: the Python standard library's source.

Every Python install carries its standard library as ``.py`` files. :func:`manifest` lists the
top-level ones in sorted order with their SHA-256, so a corpus is named by one hash
(``manifest()["hash"]``) and a different Python version shows up as a different hash. Files are
split into train and validation *by file* (every ``VAL_EVERY``-th file is validation), so no
function leaks from one side to the other.

The tokenizer is a byte-level BPE (``tokenizers``), trained on the train files and cached under
``$DISPATCH_CACHE`` (default ``~/.cache/dispatch``) keyed by the manifest hash and vocabulary size;
training is deterministic, so deleting the cache rebuilds the same file.

The same chapter can measure OLMoE-1B-7B on WikiText-2 instead (:func:`wikitext2_text`, needs
``datasets`` and internet; imported only on that path).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import pathlib
import platform
import re
import sysconfig
import warnings

import torch

MAX_RUN = 1000  # longest run of non-space (or space) characters BPE trains on as one piece
VAL_EVERY = 10  # file i (sorted order) is validation when i % VAL_EVERY == VAL_EVERY - 1
SPECIAL = "<|endoftext|>"  # separates files; id 0


def stdlib_dir() -> pathlib.Path:
    """Where this interpreter's standard library sources live, or the folder ``$DISPATCH_STDLIB`` names
    (another Python's ``*.py`` files, copied: the corpus a checkpoint was trained on, on a machine
    whose Python is another version)."""
    return pathlib.Path(os.environ.get("DISPATCH_STDLIB") or sysconfig.get_paths()["stdlib"])


def manifest(root: pathlib.Path | None = None) -> dict:
    """The corpus, named: sorted top-level ``*.py`` files of the stdlib with sizes and SHA-256.

    Returns ``{"python": "3.11.7", "files": [{"name", "bytes", "sha256", "split"}, ...],
    "hash": sha256 of the file list}``. ``root`` defaults to :func:`stdlib_dir`.
    """
    root = pathlib.Path(root) if root is not None else stdlib_dir()
    if not root.is_dir():
        raise FileNotFoundError(f"no folder at {root} (the corpus is the *.py files of one folder)")
    paths = sorted(p for p in root.glob("*.py") if p.is_file())
    if not paths:
        raise ValueError(f"no *.py files under {root}: is this a Python install with its sources?")
    files = []
    for i, p in enumerate(paths):
        data = p.read_bytes()
        files.append({"name": p.name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                      "split": "val" if i % VAL_EVERY == VAL_EVERY - 1 else "train"})
    listing = json.dumps([(f["name"], f["sha256"]) for f in files]).encode()
    return {"python": platform.python_version(), "root": str(root), "files": files,
            "hash": hashlib.sha256(listing).hexdigest()[:16]}


def split_texts(split: str, root: pathlib.Path | None = None) -> list[str]:
    """The files of ``split`` ("train" | "val") as strings, in manifest order."""
    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")
    m = manifest(root)
    base = pathlib.Path(m["root"])
    return [(base / f["name"]).read_text(encoding="utf-8", errors="replace")
            for f in m["files"] if f["split"] == split]


def cache_dir() -> pathlib.Path:
    d = pathlib.Path(os.environ.get("DISPATCH_CACHE", pathlib.Path.home() / ".cache" / "dispatch"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def _bounded(texts):
    """The texts with every run of more than MAX_RUN non-space (or space) characters cut into pieces
    of MAX_RUN, each its own item: BPE training time grows with the square of a word's length (one
    minified line or data blob of a million characters would take many minutes). The standard
    library has no such run, so its tokenizer is the same as without the cut."""
    long = re.compile(r"\S{%d,}|\s{%d,}" % (MAX_RUN + 1, MAX_RUN + 1))
    for t in texts:
        pos = 0
        for m in long.finditer(t):
            yield t[pos:m.start()]
            yield from (t[i:min(i + MAX_RUN, m.end())] for i in range(m.start(), m.end(), MAX_RUN))
            pos = m.end()
        yield t[pos:]


def train_tokenizer(vocab_size: int = 4096, root: pathlib.Path | None = None):
    """A byte-level BPE ``tokenizers.Tokenizer`` trained on the train files (deterministic).
    ValueError if they hold no text; a warning if they are too small for ``vocab_size`` tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 300:
        raise ValueError(f"vocab_size must be an int >= 300 (256 bytes + merges), got {vocab_size!r}")
    texts = split_texts("train", root)
    if not any(t.strip() for t in texts):
        raise ValueError(f"the train split under {root or stdlib_dir()} holds no text ({len(texts)} files, "
                         "all empty): nothing to train a tokenizer on")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[SPECIAL], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_bounded(texts), trainer=trainer)
    if tok.get_vocab_size() < vocab_size:
        warnings.warn(f"the train split under {root or stdlib_dir()} yields only {tok.get_vocab_size()} tokens "
                      f"of the {vocab_size} asked for (too little distinct text)", stacklevel=2)
    return tok


def tokenizer(vocab_size: int = 4096, root: pathlib.Path | None = None, rebuild: bool = False):
    """The cached tokenizer for this corpus (trained on first use, then read from the cache)."""
    from tokenizers import Tokenizer

    path = cache_dir() / f"bpe-{manifest(root)['hash']}-{vocab_size}.json"
    if path.exists() and not rebuild:
        return Tokenizer.from_file(str(path))
    from dispatch import files

    tok = train_tokenizer(vocab_size, root)
    with files.replacing(path) as tmp:  # whole or not at all: a half-written cache file is never read
        tok.save(str(tmp))
    return tok


def encode_split(tok, split: str, root: pathlib.Path | None = None) -> torch.Tensor:
    """Token ids [n] (int64) of a split: files joined by the end-of-text token.

    ``tok`` is a ``tokenizers.Tokenizer`` or a transformers tokenizer.
    """
    texts = split_texts(split, root)
    if hasattr(tok, "encode_batch"):
        rows = [e.ids for e in tok.encode_batch(texts)]
        eot = tok.token_to_id(SPECIAL)
    else:
        rows = tok(texts, add_special_tokens=False)["input_ids"]
        eot = tok.eos_token_id
    ids = []
    for r in rows:
        ids.extend(r)
        ids.append(eot)
    return torch.tensor(ids, dtype=torch.int64)


def wikitext2_text(split: str = "test") -> str:
    """WikiText-2 (raw) as one string, from the Hugging Face hub (needs ``datasets`` + internet)."""
    try:
        import datasets
    except ImportError as e:  # only this path needs it
        raise ImportError("WikiText-2 needs the `datasets` package: pip install datasets") from e
    rows = datasets.load_dataset("wikitext", "wikitext-2-raw-v1", split=split)["text"]
    return "".join(rows)


def token_ids(tok, dataset: str = "stdlib", split: str = "val") -> torch.Tensor:
    """Token ids [n] of a split of ``dataset``: "stdlib" (this Python's, see :func:`manifest`) or
    "wikitext-2" (raw; "val" reads its test split, the one perplexities are usually quoted on).

    ``tok``: a ``tokenizers.Tokenizer`` or a transformers tokenizer (OLMoE's for WikiText-2).
    """
    if dataset == "stdlib":
        return encode_split(tok, split)
    if dataset != "wikitext-2":
        raise ValueError(f"dataset must be 'stdlib' or 'wikitext-2', got {dataset!r}")
    text = wikitext2_text({"train": "train", "val": "test"}[split])
    ids = tok.encode(text).ids if hasattr(tok, "encode_batch") else tok(text, add_special_tokens=False)["input_ids"]
    return torch.tensor(ids, dtype=torch.int64)


def unigram_perplexity(train_ids: torch.Tensor, val_ids: torch.Tensor, vocab_size: int) -> float:
    """Perplexity on ``val_ids`` of the token frequencies of ``train_ids`` (add-one smoothing).

    The baseline a language model must beat: it knows how common each token is, nothing of context.
    """
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
        raise ValueError(f"vocab_size must be a positive int, got {vocab_size!r}")
    for name, ids in (("train_ids", train_ids), ("val_ids", val_ids)):
        _check_ids(name, ids, vocab_size)
    if not val_ids.numel():
        raise ValueError("val_ids is empty: no token to measure the perplexity on")
    counts_V = torch.bincount(train_ids, minlength=vocab_size).double() + 1.0
    logp_V = counts_V.log() - counts_V.sum().log()
    return math.exp(-logp_V[val_ids].mean().item())


def _check_ids(name: str, ids, vocab_size: int | None = None) -> None:
    if not isinstance(ids, torch.Tensor) or ids.dim() != 1 or ids.dtype.is_floating_point or ids.dtype == torch.bool:
        raise ValueError(f"{name} must be a 1-D integer tensor of token ids, got "
                         f"{getattr(ids, 'dtype', type(ids).__name__)} {tuple(getattr(ids, 'shape', ()))}")
    if vocab_size is not None and ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise ValueError(f"{name} must lie in [0, vocab_size={vocab_size}), got ids from {int(ids.min())} "
                         f"to {int(ids.max())}")


def _check_sizes(**sizes) -> None:
    for name, v in sizes.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")


def batches(ids: torch.Tensor, seq_len: int, batch_size: int, *, seed: int) -> "iter[torch.Tensor]":
    """Endless random windows [batch_size, seq_len + 1] of ``ids`` (seeded, reproducible); the sizes
    are checked here, when called, not at the first batch."""
    _check_ids("ids", ids)
    _check_sizes(seq_len=seq_len, batch_size=batch_size)
    if ids.numel() <= seq_len + 1:
        raise ValueError(f"need more than seq_len + 1 = {seq_len + 1} tokens, got {ids.numel()}")
    return _batches(ids, seq_len, batch_size, seed)


def _batches(ids: torch.Tensor, seq_len: int, batch_size: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    offs_1L = torch.arange(seq_len + 1)
    while True:
        start_B = torch.randint(0, ids.numel() - seq_len - 1, (batch_size,), generator=g)
        yield ids[start_B[:, None] + offs_1L[None, :]]


def windows(ids: torch.Tensor, seq_len: int, max_tokens: int) -> torch.Tensor:
    """``max_tokens // seq_len`` windows [n, seq_len + 1], spread evenly over all of ``ids``
    (so a bounded evaluation still samples every file); within a window every token but the
    first is predicted once. With room for only n windows, they are consecutive.
    """
    _check_ids("ids", ids)
    _check_sizes(seq_len=seq_len, max_tokens=max_tokens)
    n_all = (ids.numel() - 1) // seq_len
    n = min(max_tokens // seq_len, n_all)
    if n < 1:
        raise ValueError(f"need at least seq_len + 1 = {seq_len + 1} tokens and max_tokens >= seq_len, "
                         f"got {ids.numel()} tokens, max_tokens {max_tokens}")
    starts = [(i * n_all // n) * seq_len for i in range(n)]
    return torch.stack([ids[s:s + seq_len + 1] for s in starts])
