#!/usr/bin/env bash
# One GPU run (< 240 s): disaggregated serving's one-copy KV handoff through CUDA IPC, two processes on
# one GPU (dispatch.serve.handoff_ipc) — the decode side's copy out of the prefill pool per request, its
# rate against a same-process gather of the same blocks (of_ceiling) and, timed on the device, against a
# plain copy of the same bytes (of_device_copy) at OLMoE-1B-7B's KV for 1024- and 4096-token prompts; the
# copy kernel's launch shapes; what the handoff adds to OLMoE-1B-7B's prefill (ttft); the shipped model
# served by an ipc pair against the co-located engine; then the ipc tests (tokens, every block back, a
# killed worker named).
#   DISPATCH_GIT_COMMIT=<sha> dispatch_book/gpu/ipc_run.sh "$OUT"
# Writes $OUT/gpu.txt, $OUT/bench.log, $OUT/results/<gpu>/disagg_ipc.json (commit it as
# results/<gpu>/disagg_ipc.json) and $OUT/tests.log.
set -u
TOTAL_DEFAULT=240
. "$(dirname "$0")/prelude.sh" "$@"
nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv | tee "$OUT/gpu.txt"
timeout 150 python3 -m dispatch_book.bench disagg_ipc --out "$OUT/results" > "$OUT/bench.log" 2>&1
tail -8 "$OUT/bench.log"
timeout "$(left)" python3 -m pytest -m gpu tests/test_disagg_ipc.py -q -p no:cacheprovider -rf > "$OUT/tests.log" 2>&1
tail -12 "$OUT/tests.log"
echo "total $(( $(date +%s) - start )) s"
