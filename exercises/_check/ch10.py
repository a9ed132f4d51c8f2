"""Checks of chapter 10's exercises."""
from __future__ import annotations

import math


def _refused(fn, *args) -> bool:
    try:
        fn(*args)
    except ValueError:
        return True
    return False


def ch10_handoff_plan(mod) -> None:
    got = mod.handoff_plan(10, 4, [3, 9, 4], 4)
    assert [tuple(p) for p in got] == [(1, 9), (2, 4)], f"the example: {got}, expected [(1, 9), (2, 4)]"
    cases = [(1, 4, [5], 0, [(0, 5)]), (8, 4, [2, 6], 0, [(0, 2), (1, 6)]), (9, 4, [2, 6, 1], 8, [(2, 1)]),
             (16, 16, [7], 0, [(0, 7)]), (17, 16, [7, 3], 16, [(1, 3)]), (12, 2, [9, 8, 7, 6, 5, 4], 6,
                                                                         [(3, 6), (4, 5), (5, 4)])]
    for n, bs, dst, cached, want in cases:
        got = [tuple(p) for p in mod.handoff_plan(n, bs, list(dst), cached)]
        assert got == want, f"handoff_plan({n}, {bs}, {dst}, {cached}) = {got}, expected {want}"
    for args in [(10, 4, [3, 9], 0), (10, 4, [3, 9, 4, 1], 0), (10, 4, [3, 9, 4], 3), (8, 4, [3, 9], 8)]:
        assert _refused(mod.handoff_plan, *args), f"handoff_plan{args} must raise ValueError"



def _ref(prompt, output, prefill, decode, budget, handoff, dis):
    chunks = [budget] * (prompt // budget) + ([prompt % budget] if prompt % budget else [])
    ttft = math.fsum(prefill(n) for n in chunks)
    return ttft, decode(1) + (handoff / (output - 1) if dis else 0.0)


def ch10_ttft(mod) -> None:
    flat_p, flat_d = (lambda T: 0.01), (lambda B: 0.001)
    for dis, want in ((False, (0.03, 0.001)), (True, (0.03, 0.0035))):
        got = mod.one_request(10, 3, flat_p, flat_d, 4, 0.005, dis)
        assert all(math.isclose(g, w, rel_tol=1e-9) for g, w in zip(got, want, strict=True)), \
            f"the example (disaggregated={dis}): {got}, expected {want}"
    pre, dec = (lambda T: 0.002 + 1e-5 * T), (lambda B: 0.0007 + 1e-4 * B)
    for prompt, output, budget, handoff in [(1, 2, 8, 0.001), (100, 17, 64, 0.004), (128, 5, 128, 0.0),
                                            (300, 9, 100, 0.02), (7, 40, 2, 0.003)]:
        for dis in (False, True):
            got = mod.one_request(prompt, output, pre, dec, budget, handoff, dis)
            want = _ref(prompt, output, pre, dec, budget, handoff, dis)
            assert all(math.isclose(g, w, rel_tol=1e-9) for g, w in zip(got, want, strict=True)), \
                f"one_request({prompt}, {output}, budget={budget}, handoff={handoff}, disaggregated={dis}) = " \
                f"{got}, expected {want}"
