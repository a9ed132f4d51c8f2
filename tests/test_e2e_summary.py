"""Chapter 6's quoted numbers come from the recordings: hand-computed on a synthetic pair."""
from dispatch_book.bench.e2e_summary import at_ceiling, decode_kernel_numbers, step_numbers

KINDS = ("experts", "router", "attention", "projections (GEMV/GEMM)", "norms, rope, elementwise",
         "sampling", "launch gaps", "step", "kernels per step")


def _row(batch, what, **v):
    return {"batch": batch, "what": what, **{k: v.get(k, 0.0) for k in KINDS}}


def test_step_numbers_by_hand():
    doc = {"read_gbps": 4000.0, "rows": [
        {"contestant": "ours", "batch": 1, "bytes_per_step": 2.0e9, "pct_roofline": 40.4},
        {"contestant": "ours", "batch": 64, "bytes_per_step": 15.2e9, "pct_roofline": 69.6, "graph_step_ms": 4.553},
        {"contestant": "hf_graph", "batch": 1, "bytes_per_step": 1.0, "pct_roofline": 1.0}]}
    pdoc = {"rows": [_row(1, "ours, eager step", step=9000.0, **{"launch gaps": 7600.0}),
                     _row(1, "ours, CUDA graph", experts=790.0, attention=190.0, step=1020.0,
                          **{"kernels per step": 231}),
                     _row(1, "ours, CUDA graph, plain launches", experts=560.0, attention=160.0, step=1160.0,
                          **{"launch gaps": 65.0}),
                     _row(1, "ours, CUDA graph, unfused", **{"norms, rope, elementwise": 1500.0}),
                     _row(1, "transformers step (dispatch experts), eager", **{"kernels per step": 1083}),
                     _row(64, "ours, CUDA graph", experts=5700.0, step=7400.0)]}
    n = step_numbers(doc, pdoc)
    assert n["b1_gb"] == "2.0 GB" and n["b1_read_ms"] == "0.50 ms"  # 2 GB / 4 TB/s
    assert n["eager_ms"] == "9.00 ms" and n["work_ms"] == "1.40 ms"
    assert n["experts_ms"] == "0.56 ms" and n["layer_us"] == "35 µs"  # 560 µs over 16 layers
    # OLMoE-1B-7B: 8 experts x 3 x 2048 x 1024 bf16 = 100.7 MB; at 4 TB/s 25 µs
    assert n["expert_mb"] == "101 MB" and n["floor_us"] == "25 µs"
    assert n["b64_step_ms"] == "4.55 ms"
    assert n["b64_touched"] == "64.0" and n["E"] == "64"  # 64 * (1 - (56/64)^64) = 63.99
    assert (n["b1_pct"], n["b64_pct"], n["b64_gb"]) == ("40%", "70%", "15 GB")
    assert n["hf_kernels"] == "1083"
    assert n["kernels"] == "231" and n["unfused_glue_ms"] == "1.50 ms"
    # the kinds from the plain-launch graph (PDL's kernel times overlap), the step from both
    assert n["sdpa_ms"] == "0.16 ms" and n["graph_step_us"] == "1020 µs" and n["plain_step_us"] == "1160 µs"
    assert n["plain_gaps_us"] == "65 µs"


def test_decode_kernel_numbers_by_hand():
    doc = {"rows": [{"contestant": "ours", "batch": 1, "decode_tok_s": 820.0},
                    {"contestant": "ours_cublas_sdpa", "batch": 1, "decode_tok_s": 725.0},
                    {"contestant": "ours", "batch": 64, "decode_tok_s": 14000.0},
                    {"contestant": "ours_cublas_sdpa", "batch": 64, "error": "x"},
                    {"contestant": "ours_no_pdl", "batch": 1, "decode_tok_s": 800.0}]}
    sdoc = {"rows": [{"shape": f"{n} [8, 8] M={m}", "contestant": c, "median_ms": t}
                     for n in ("qkv", "o", "lm_head") for m in (1, 8)
                     for c, t in (("cublas", 0.010), ("ours", 0.008))]
            + [{"shape": "B=1 S=256", "contestant": "sdpa", "median_ms": 0.0188},
               {"shape": "B=1 S=256", "contestant": "ours", "median_ms": 0.0101}]}
    n = decode_kernel_numbers(doc, sdoc)
    assert (n["dk_b1_ours"], n["dk_b1_base"], n["dk_b1_x"]) == ("820", "725", "1.13×")  # 820 / 725
    assert "dk_b64_x" not in n  # the baseline row failed: nothing quoted
    assert (n["pdl_b1_base"], n["pdl_b1_x"]) == ("800", "1.02×") and "pdl_b64_x" not in n  # 820 / 800
    assert n["gemv_qkv_ours"] == "8.0 µs" and n["gemv_o_cublas"] == "10.0 µs"
    assert (n["attn_ours"], n["attn_sdpa"]) == ("10.1 µs", "18.8 µs")


def test_at_ceiling_rescales_the_roofline_not_the_measurement():
    """At a 25% higher read ceiling the roofline is 25% higher and the same tokens/s are 20% less of it."""
    doc = {"read_gbps": 4000.0, "rows": [
        {"contestant": "ours", "batch": 1, "decode_tok_s": 900.0, "roofline_tok_s": 1800.0, "pct_roofline": 50.0},
        {"contestant": "hf", "batch": 1, "skipped": "no"}]}
    new = at_ceiling(doc, 5000.0)
    assert new["read_gbps"] == 5000.0 and new["rows"][1] == {"contestant": "hf", "batch": 1, "skipped": "no"}
    r = new["rows"][0]
    assert (r["decode_tok_s"], r["roofline_tok_s"], r["pct_roofline"]) == (900.0, 2250.0, 40.0)
    assert doc["rows"][0]["pct_roofline"] == 50.0 and doc["read_gbps"] == 4000.0  # the recording is left as it was


def test_fused_moe_sentence_reads_the_race_or_says_it_did_not_run():
    from dispatch_book.bench.e2e_summary import fused_moe_sentence

    rows = [{"contestant": "ours", "batch": 1, "decode_tok_s": 1000.0},
            {"contestant": "ours_fused_moe", "batch": 1, "decode_tok_s": 800.0}]
    assert fused_moe_sentence({"rows": rows}) == ("in the race of section 4 it decodes 800 tokens/s at batch 1 "
                                                  "against 1,000 on the default path (0.80×)")
    assert "did not time it" in fused_moe_sentence({"rows": rows[:1]})
    rows[1] = {"contestant": "ours_fused_moe", "batch": 1, "error": "OutOfMemoryError"}
    assert "did not time it" in fused_moe_sentence({"rows": rows})
