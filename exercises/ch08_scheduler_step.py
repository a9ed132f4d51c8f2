"""Chapter 8, exercise 2: one step of a continuous-batching scheduler with chunked prefill.

Each step runs at most ``budget`` tokens through the model. Complete ``schedule_step``:

* ``running``: ``[(id, left), ...]`` in admission order; ``left`` is how many prompt tokens the
  sequence still has to compute, 0 once it is decoding (then it needs exactly one token a step);
* ``waiting``: ``[(id, prompt_len), ...]`` in arrival order;
* return the step as ``[(id, tokens), ...]``: first every decoding sequence, one token each, in
  running order; then the running sequences still in their prompt, each the next chunk of it —
  ``min(left, budget left)``; then waiting sequences, in arrival order, admitted while budget is
  left and fewer than ``max_seqs`` sequences would be running, each with its first chunk. No entry
  has 0 tokens; the tokens never add up to more than ``budget`` (decode rows past the budget wait).

Example: running [(1, 0), (2, 0), (3, 10)], waiting [(4, 50)], budget 8, max_seqs 4 →
[(1, 1), (2, 1), (3, 6)]: the decode rows first, then the prompt in progress takes the rest.
"""


def schedule_step(running: list[tuple[int, int]], waiting: list[tuple[int, int]], budget: int,
                  max_seqs: int) -> list[tuple[int, int]]:
    raise NotImplementedError("complete schedule_step in exercises/ch08_scheduler_step.py")
