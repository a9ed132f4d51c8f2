"""Chapter 10, exercise 2: one request's TTFT and TPOT in both layouts.

One request alone (nothing else runs): a prompt of ``prompt`` tokens, ``output`` tokens to generate
(the first one included, output ≥ 2). ``prefill(T)`` is the seconds of a step carrying T prompt
tokens, ``decode(B)`` of a step of B decode rows; a step carries at most ``budget`` prompt tokens
(chunked prefill: a longer prompt takes several steps, each full but the last).

Complete ``one_request(prompt, output, prefill, decode, budget, handoff_s, disaggregated)`` →
``(ttft, tpot)`` in seconds, TPOT = (time of the last token − time of the first) / (output − 1):

* co-located: the prompt's steps, then one decode step per further token;
* disaggregated: the same prompt steps on the prefill GPU, whose last step streams the first token;
  the KV blocks then take ``handoff_s`` to reach the decode GPU, which starts decoding when they land.

Example: prompt 10, output 3, prefill(T) = 0.01 s, decode(B) = 0.001 s, budget 4, handoff 0.005 s:
co-located (0.03, 0.001); disaggregated (0.03, 0.0035).
"""


def one_request(prompt: int, output: int, prefill, decode, budget: int, handoff_s: float,
                disaggregated: bool) -> tuple[float, float]:
    raise NotImplementedError("complete one_request in exercises/ch10_ttft.py")
