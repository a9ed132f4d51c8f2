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
    Deterministic: ``q = None`` (a point mass on each draft).
DraftModel: a smaller model of the same tokenizer, k greedy (or sampled) steps over its own
    static cache. Its cache follows the target's: each round first feeds the row's last two tokens
    (positions pos-1 and pos: the token before the pending one may be a draft it never processed,
    when all k were accepted) and rewinds like the target's — a rejected tail is overwritten.
"""
from __future__ import annotations

import torch

from dispatch.engine.sampling import draw, sampling_probs


def lookup_consts(S: int, n_max: int, k_max: int = 16, device=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The step-independent index tensors of :func:`lookup` for rows of S positions and up to k_max
    drafts: (window_idx [S · n_max]: position e − j of window e's j-th token back from its end,
    clamped at 0; ends [S]: e + 1; j: 0, 1, …). A drafter makes them once (:meth:`PromptLookup.bind`)."""
    e = torch.arange(S, device=device)
    j = torch.arange(max(n_max, k_max), device=device)
    return (e[:, None] - j[None, :n_max]).clamp(min=0).reshape(-1), e + 1, j


def lookup(hist_BS: torch.Tensor, last_B: torch.Tensor, k: int, n_max: int = 3, n_min: int = 1,
           consts: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Prompt-lookup drafts [B, k] (int64) from each row's tokens ``hist_BS[b, :last_B[b] + 1]``.

    For n = n_max .. n_min: the suffix is the row's last n tokens; a match is an earlier window
    equal to it that ends before the last token; the latest match wins, longer n first. Drafts:
    the tokens after the match, continued periodically once they reach the last token.
    Example: tokens [a, b, c, a, b] (last 4), n 2 → the match [a, b] at 0, drafts [c, a, b, c, …].

    All n at once, in a fixed number of tensor ops (kernels): for every end e < last, L[e] = how
    many of the row's last tokens (up to n_max) the tokens ending at e repeat; the match is the
    e of the largest L·S + e (longest, then latest), if L ≥ n_min. ``consts``: :func:`lookup_consts`.
    """
    if not 1 <= n_min <= n_max:
        raise ValueError(f"need 1 <= n_min <= n_max, got n_min={n_min}, n_max={n_max}")
    B, S = hist_BS.shape
    window_idx, ends, j = consts if consts is not None else lookup_consts(S, n_max, k, hist_BS.device)
    last = last_B.long()
    suffix_Bn = hist_BS.gather(1, (last[:, None] - j[None, :n_max]).clamp(min=0))  # last, last-1, …
    windows_BSn = hist_BS.index_select(1, window_idx).view(B, S, n_max)  # e, e-1, … per end e
    run_BS = (windows_BSn == suffix_Bn[:, None, :]).cumprod(dim=-1).sum(dim=-1)
    # at most e + 1 tokens end at e (the suffix then has them: e < last); ends at or past last count 0
    run_BS = torch.minimum(run_BS, ends).mul_(ends <= last[:, None])
    best = torch.add(ends - 1, run_BS, alpha=S).amax(dim=1)  # L·S + e of the longest, then latest
    found = best >= n_min * S
    end = best % S  # the match's last position: the drafts copy end + 1 .. last, then repeat
    period = (last - end).clamp(min=1)
    pos = torch.where(found[:, None], end[:, None] + 1 + j[None, :k] % period[:, None], last[:, None])
    return hist_BS.gather(1, pos)


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
        self.kernel = None
        if getattr(eng, "step_kernels", False):  # one launch: dispatch.kernels.spec_step
            from dispatch.kernels.spec_step import lookup_drafts

            self.kernel = lookup_drafts

    def start(self, eng, prompts: list[list[int]], B: int) -> None:
        """Nothing to prepare."""

    def propose(self, eng, B: int, k: int, greedy: bool):
        if self.kernel is not None:
            return self.kernel(eng.hist_BS[:B], eng.pos_B[:B], k, self.n_max, self.n_min), None
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
