"""Drafters: cheap guesses of the next k tokens, made on the device inside the speculative step.

A drafter has ``bind(eng)`` (its buffers, sized by the engine, allocated once: a captured graph keeps
their addresses), ``start(eng, prompts, B)`` (called after the engine's prefill: its own state) and
``propose(eng, B, k, greedy) → (drafts_BK int64, q_BKV or None)`` reading the engine's buffers:
``eng.hist_BS`` [B, S] the tokens of each row by position (prompt, then output) and ``eng.pos_B``
the position of each row's last token. Static shapes, no host sync: it is captured with the step.

PromptLookup (prompt lookup decoding, Saxena 2023): find the latest earlier occurrence of the
    row's last n tokens (n from ``n_max`` down to ``n_min``) in its own text and propose the k
    tokens that followed it. Where the copy runs into the present (a match close to the end), it
    keeps copying from the copy — the continuation a repeating pattern implies. No match: the last
    token, k times (a guess that rarely holds; the verify step still emits one token).
    Deterministic: ``q = None`` (a point mass on each draft). The lookup itself, as torch ops and as
    one Triton launch: :mod:`dispatch.kernels.spec_step`.
DraftModel: a smaller model of the same tokenizer, k greedy (or sampled) steps over its own
    static cache. Its cache follows the target's: each round first feeds the row's last two tokens
    (positions pos-1 and pos: the token before the pending one may be a draft it never processed,
    when all k were accepted) and rewinds like the target's — a rejected tail is overwritten.
"""
from __future__ import annotations

import torch

from dispatch.engine.sampling import draw, sampling_probs
from dispatch.kernels.spec_step import lookup, lookup_consts, lookup_drafts


class PromptLookup:
    """n-gram drafts from the row's own text (:func:`lookup`); any k ≥ 0. With the engine's
    ``step_kernels``: the same drafts in one launch (:func:`dispatch.kernels.spec_step.lookup_drafts`)."""

    k_min = 0

    def __init__(self, n_max: int = 3, n_min: int = 1):
        if not 1 <= n_min <= n_max:
            raise ValueError(f"need 1 <= n_min <= n_max, got n_min={n_min}, n_max={n_max}")
        self.n_max, self.n_min = n_max, n_min

    def bind(self, eng) -> None:
        """The lookup's index tensors for the engine's history (the drafts come from that history)."""
        self.consts = lookup_consts(eng.hist_BS.shape[1], self.n_max, eng.k, eng.dev)
        self.kernel = lookup_drafts if getattr(eng, "step_kernels", False) else None  # one launch

    def start(self, eng, prompts: list[list[int]], B: int) -> None:
        """Nothing to prepare."""

    def propose(self, eng, B: int, k: int, greedy: bool):
        if self.kernel is not None:  # straight into the verify step's ids where the engine keeps them
            ids = getattr(eng, "ids_BK1", None)
            out = ids[:B, 1:k + 1] if ids is not None and k else None
            return self.kernel(eng.hist_BS[:B], eng.pos_B[:B], k, self.n_max, self.n_min, out=out), None
        return lookup(eng.hist_BS[:B], eng.pos_B[:B], k, self.n_max, self.n_min, self.consts), None


class DraftModel:
    """A smaller model's k steps (greedy, or sampled with the target's temperature and top-p); k ≥ 1.

    ``model``: a transformers model of a lean family or a :class:`dispatch.engine.LeanModel`, on the
    target's device, with the target's vocabulary. It runs in the target's mode (batch-invariant or
    not): then a draft model equal to the target drafts exactly the target's greedy tokens."""

    k_min = 1

    def __init__(self, model):
        from dispatch.engine.engine import as_engine_model
        from dispatch.engine.model import LeanModel

        self.model = as_engine_model(model)
        if not isinstance(self.model, LeanModel):
            raise ValueError("a draft model runs on the lean forward (OLMoE, Mixtral, Qwen2/3-MoE)")
        self.cache = None

    def bind(self, eng) -> None:
        """Take the target's mode; a cache shaped like the target's (rows, positions)."""
        self.model = self.model.with_batch_invariance(eng.model.batch_invariant)
        if self.model.cfg.vocab_size != eng.model.cfg.vocab_size:
            raise ValueError(f"the draft model's vocabulary ({self.model.cfg.vocab_size}) must be the target's "
                             f"({eng.model.cfg.vocab_size}): one tokenizer")
        if self.model.device != eng.dev:
            raise ValueError(f"the draft model is on {self.model.device}, the target on {eng.dev}")
        self.cache = self.model.new_cache(eng.max_batch, eng.cache[0].shape[2])

    def start(self, eng, prompts: list[list[int]], B: int) -> None:
        """Prefill the prompts into this model's cache."""
        lens = [len(p) for p in prompts] + [1] * (B - len(prompts))
        ids = eng.hist_BS[:B, :max(lens)]
        with torch.no_grad():
            self.model(ids, torch.arange(ids.shape[1], device=eng.dev).expand_as(ids), self.cache, prefill=True)

    def propose(self, eng, B: int, k: int, greedy: bool):
        if k < 1:
            raise ValueError(f"a draft model drafts k >= 1 tokens, got k={k}")
        pos_B = eng.pos_B[:B]
        pos_B2 = pos_B[:, None] + torch.arange(-1, 1, device=eng.dev)  # [pos - 1, pos]
        ids_B1 = eng.hist_BS[:B].gather(1, pos_B2)
        drafts, qs = [], []
        with torch.no_grad():
            for j in range(k):
                logits_BV = self.model(ids_B1, pos_B2, self.cache, prefill=False)[:, -1]
                if greedy:
                    d_B = logits_BV.argmax(dim=-1)
                else:
                    q_BV = sampling_probs(logits_BV, eng.temperature, eng.top_p)
                    d_B = draw(q_BV, eng.generator)
                    qs.append(q_BV)
                drafts.append(d_B)
                ids_B1, pos_B2 = d_B[:, None], pos_B[:, None] + j + 1
        return torch.stack(drafts, dim=1), (torch.stack(qs, dim=1) if qs else None)
