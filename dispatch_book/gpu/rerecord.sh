#!/usr/bin/env bash
# One GPU run (one H200, < 8 minutes): re-record the chapter-1 and chapter-3 benchmarks from the
# checked-out commit — the routing + sort race and the decode race (1–256 tokens, with our grouped
# GEMM beside the decode path: the crossover) — with the `-m gpu` tests of routing, sort and decode.
#   DISPATCH_GIT_COMMIT=<sha> dispatch_book/gpu/rerecord.sh "$OUT"
# Writes $OUT/results/h200/{routing_sort,decode}.json (commit them under results/h200/) and logs.
set -u
TOTAL_DEFAULT=470  # seconds left() counts down from, unless TOTAL is set
. "$(dirname "$0")/prelude.sh" "$@"
timeout 120 python3 -m pytest tests -m gpu -q -p no:cacheprovider -rf -k "routing or sort or gemv or decode" \
    > "$OUT/tests.log" 2>&1
tail -8 "$OUT/tests.log"
timeout 120 python3 -m dispatch_book.bench routing --out "$OUT/results" > "$OUT/bench.log" 2>&1
tail -12 "$OUT/bench.log"
timeout "$(left)" python3 -m dispatch_book.bench decode --out "$OUT/results" >> "$OUT/bench.log" 2>&1
tail -30 "$OUT/bench.log"
echo "total $(( $(date +%s) - start )) s"
