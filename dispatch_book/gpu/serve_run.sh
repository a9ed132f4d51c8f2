#!/usr/bin/env bash
# One GPU run (one H100 or H200, < 9.5 minutes) for chapter 8: the serving engine's `-m gpu` tests, then
# `python -m dispatch_book.bench serve` on OLMoE-1B-7B's config with random bf16 weights — the decode-step
# comparison (paged vs chapter 6's static engine), the offline race (256 requests, prompt and output
# lengths uniform in 100-1024: ours, the static engine, transformers' continuous batching with its
# default experts and with ours), the online sweep (Poisson arrivals: ours vs `transformers serve`)
# and the reliability run. The results file is written after every contestant, so a cut-off run keeps
# what it measured; PARTS=online,reliability in a second call merges into the same file (each part
# names the commit it was measured at: results.merged).
#   DISPATCH_GIT_COMMIT=<sha> [PARTS=step,offline,online,reliability] [RELIABILITY_N=2000] \
#       dispatch_book/gpu/serve_run.sh "$OUT"
#   DISPATCH_GIT_COMMIT=<sha> PARTS=reliability TESTS=0 dispatch_book/gpu/serve_run.sh "$OUT"   # 10,000 requests
#   DISPATCH_GIT_COMMIT=<sha> PARTS=online CONTESTANTS=ours,hf_serve TOTAL=300 dispatch_book/gpu/serve_run.sh "$OUT"
# Carry .whl (`make gpu-wheels`: aiohttp, and fastapi/uvicorn/... for `transformers serve`) when the image
# lacks them. Writes $OUT/tests.log, $OUT/bench.log, $OUT/serve-<kind>.log, $OUT/results/<gpu>/serve.json.
# DEBUG=1: every launch synchronous in the servers (CUDA_LAUNCH_BLOCKING): a kernel's illegal memory access
# is reported at that kernel, not at the next host sync (a server logs a failed step with its rows); its
# timings are not a recording then, so they go to $OUT/debug/ instead of $OUT/results/.
# STRESS=<seconds>: first `python -m dispatch_book.gpu.serve_stress` (the engine in-process, rounds of the online
# workload, the one-launch kernels' counters checked after every step) into $OUT/stress.log.
set -u
TOTAL_DEFAULT=560
RES=results
[ "${DEBUG:-0}" = 1 ] && export CUDA_LAUNCH_BLOCKING=1 && RES=debug
. "$(dirname "$0")/prelude.sh" "$@"
serve_wheels
nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv | tee "$OUT/gpu.txt"
if [ "${TESTS:-1}" = 1 ]; then
    timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider -rf tests/test_serve_gpu.py \
        tests/test_decode_fused.py::test_gpu_graphs_sharing_a_pool_leave_the_counters_alone > "$OUT/tests.log" 2>&1
    tail -4 "$OUT/tests.log"
fi
if [ "${STRESS:-0}" -gt 0 ]; then  # STRESS=<seconds>: the engine in-process under the online workload, checked every step
    timeout $(( STRESS + 120 )) python3 -m dispatch_book.gpu.serve_stress --seconds "$STRESS" > "$OUT/stress.log" 2>&1
    echo "stress: exit $?"; tail -3 "$OUT/stress.log"
fi
PARTS=${PARTS:-step,offline,online,reliability}
# the issue-sized reliability run (10,000 requests) in a call of its own; beside the races, 2,000
[ "$PARTS" = reliability ] && N_DEFAULT=10000 || N_DEFAULT=2000
timeout "$(left)" python3 -m dispatch_book.bench serve --out "$OUT/$RES" --budget-s $(( $(left) - 20 )) \
    --parts "$PARTS" ${CONTESTANTS:+--contestants "$CONTESTANTS"} --reliability-n "${RELIABILITY_N:-$N_DEFAULT}" 2>&1 \
    | tee "$OUT/bench.log" | cut -c1-400 | tail -40
cp "${TMPDIR:-/tmp}"/serve-*.log "$OUT/" 2>/dev/null || true  # the servers' own logs (a stall or a crash says why there)
echo "total $(( $(date +%s) - start )) s"
