#!/usr/bin/env bash
# One GPU run (< 10 minutes): chapter 9 — the batch-invariant and speculative `-m gpu` tests, then the
# speculative suite: the invariance cost of the decode step, step costs per draft length, the race on the
# shipped model (with transformers' prompt lookup and assisted generation), and the presets replaying the
# recorded accept/reject sequences (results/cpu/speculative_traces.json). Rows are saved one by one.
#   DISPATCH_GIT_COMMIT=<sha> dispatch_book/gpu/spec_run.sh "$OUT"
#   TESTS=0 MODELS=mixtral-8x7b DISPATCH_GIT_COMMIT=<sha> dispatch_book/gpu/spec_run.sh "$OUT"   # the rest
# Writes $OUT/tests.log, $OUT/bench.log and $OUT/results/<gpu>/speculative.json. A run that runs out of time
# records 'skipped' rows; a later run with MODELS= measures those models again and keeps the recording's
# other rows (the repository's results/<gpu>/speculative.json is its starting point).
set -u
TOTAL_DEFAULT=570  # seconds left() counts down from, unless TOTAL is set
. "$(dirname "$0")/prelude.sh" "$@"
if [ "${TESTS:-1}" = 1 ]; then  # TESTS=0: the tests ran in a call of their own
    timeout 240 python3 -m pytest -m gpu -q -p no:cacheprovider -rf tests/test_invariant.py \
        tests/test_speculative.py > "$OUT/tests.log" 2>&1
    tail -6 "$OUT/tests.log"
fi
slug=$(python3 -c "from dispatch_book.bench import gpu_slug; print(gpu_slug())")
if [ -f "results/$slug/speculative.json" ]; then  # rows of models this run does not measure are kept
    mkdir -p "$OUT/results/$slug" && cp "results/$slug/speculative.json" "$OUT/results/$slug/"
fi
budget=$(( $(left) - 40 ))
timeout "$(left)" python3 -m dispatch_book.bench speculative --out "$OUT/results" --budget-s "$budget" \
    ${MODELS:+--models "$MODELS"} > "$OUT/bench.log" 2>&1
grep "'kind'" "$OUT/bench.log" | cut -c1-200 | tail -60
tail -3 "$OUT/bench.log"
echo "total $(( $(date +%s) - start )) s"
