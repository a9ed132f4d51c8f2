#!/usr/bin/env bash
# One GPU run (one H200, < 9.5 minutes): the split items (dispatch.kernels.decode_split) on a GPU for the
# first time — their `-m gpu` tests and the trace's, then --refine of the table's bf16 decode buckets at
# 1–16 tokens (the split steps: a bucket moves to split items only where they time faster, within
# tolerance of the chain), then the decode timeline at 1 and 8 tokens with the refined table.
#   DISPATCH_GIT_COMMIT=<sha> dispatch_book/gpu/split_run.sh "$OUT"
# Writes $OUT/tests.log, $OUT/h200.json (the refined table: commit it as dispatch/tables/h200.json),
# $OUT/tune.log, $OUT/results/h200/decode_timeline.json, $OUT/timeline.log.
# Then, in a second call, re-record the race with that table (results/h200/kernels.json first copied to
# $OUT/h200/): python -m dispatch_book.bench kernels --tokens 1,8,64 --merge --out "$OUT"
set -u
TOTAL_DEFAULT=560
. "$(dirname "$0")/prelude.sh" "$@"
nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv | tee "$OUT/gpu.txt"
timeout 150 python3 -m pytest tests -m gpu -q -p no:cacheprovider -rf -k "split or trace" > "$OUT/tests.log" 2>&1
tail -12 "$OUT/tests.log"
cp dispatch/tables/h200.json "$OUT/h200.json"
timeout 260 python3 -m dispatch.tune --preset all --refine --tokens 1,2,4,8,16 --out "$OUT/h200.json" \
    > "$OUT/tune.log" 2>&1
grep -v "^  " "$OUT/tune.log" | tail -40
if ! cmp -s "$OUT/h200.json" dispatch/tables/h200.json; then  # the timeline reads the refined table
    cp "$OUT/h200.json" dispatch/tables/h200.json
    export DISPATCH_GIT_COMMIT="${DISPATCH_GIT_COMMIT%+dirty}+dirty"
fi
timeout "$(left)" python3 -m dispatch_book.bench timeline --tokens 1,8 --out "$OUT/results" --allow-dirty \
    > "$OUT/timeline.log" 2>&1
tail -30 "$OUT/timeline.log"
echo "total $(( $(date +%s) - start )) s"
