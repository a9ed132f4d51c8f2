#!/usr/bin/env bash
# One GPU run (one H200, < 9 minutes): every `-m gpu` test, and every chapter executed with its
# "auto" parameters on this GPU and in a T4's budget (fp16, 15 GB, 64 KiB tiles), the three at once
# (the machine has 16 cores for Triton's compiles; chapter times are therefore upper bounds).
#   DISPATCH_GIT_COMMIT=<sha> dispatch_book/gpu/book_and_tests.sh "$OUT"
# Writes $OUT/tests.log, $OUT/book_<budget>.log and $OUT/book_gpu.json (both budgets' rows).
set -u
. "$(dirname "$0")/prelude.sh" "$@"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# The Jupyter stack the chapters need (papermill, nbformat, ...): the GPU image has none and no network.
# `make gpu-wheels` downloads it into .whl here; carry .whl to the GPU machine and it is installed below.
if ! python3 -c "import papermill, nbformat" 2>/dev/null; then
  if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site:$PYTHONPATH"
  else
    echo "no papermill/nbformat here: run \`make gpu-wheels\` and carry .whl to this machine" >&2
  fi
fi
LIMIT=${LIMIT:-460}
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
timeout "$LIMIT" python3 -m pytest tests -m gpu -q -p no:cacheprovider -rf > "$OUT/tests.log" 2>&1 &
timeout "$LIMIT" python3 -m dispatch_book.build --gpu --out "$OUT/h200" > "$OUT/book_h200.log" 2>&1 &
timeout "$LIMIT" python3 -m dispatch_book.build --gpu --t4-budget --out "$OUT/t4" > "$OUT/book_t4.log" 2>&1 &
wait
tail -25 "$OUT/tests.log"; tail -12 "$OUT/book_h200.log" "$OUT/book_t4.log"
python3 - "$OUT" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
docs = [json.loads(p.read_text()) for p in sorted(out.glob("*/*/book_gpu.json"))]
if docs:
    doc = docs[0]
    doc["rows"] = [r for d in docs for r in d["rows"]]
    (out / "book_gpu.json").write_text(json.dumps(doc, indent=1) + "\n")
    for r in doc["rows"]:
        print(r.get("chapter"), r.get("budget"), r.get("ok"), round(r.get("seconds") or 0, 1),
              r.get("peak_gib"), (r.get("error") or "")[:200])
PY
