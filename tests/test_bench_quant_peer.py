"""Chapter 7 says what the recording holds of transformers' fp8 experts: times, or why they did not run."""
from dispatch_book.bench.quant import peer_said


def _row(hf, ours_ms=1.0):
    return {"contestants": {"fp8-block128": {"median_ms": ours_ms}, "hf_fp8": hf}}


def test_peer_said():
    skipped = {"skipped": "ImportError: finegrained-fp8 kernel unavailable: `kernels` is not installed"}
    assert peer_said({"rows": [_row(skipped), _row(skipped)]}) == (
        "it did not run at any of the 2 sizes (ImportError: finegrained-fp8 kernel unavailable: `kernels` is not "
        "installed)")
    assert peer_said({"rows": [_row({"median_ms": 3.0}), _row(skipped)]}) == (
        "it ran at 1 of the 2 sizes, at 3.00–3.00× the time of ours on the same codes")
    assert peer_said({"rows": [{"contestants": {}}]}) == "the recording did not include it"
    assert peer_said(None) == "the recording did not include it"
