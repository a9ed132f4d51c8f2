# Sourced by the GPU scripts here, after `set -u`: `. "$(dirname "$0")/prelude.sh" "$@"` (set TOTAL_DEFAULT first).
# Takes the output folder ($1, created), exports the Python path and unbuffered output, refuses to run
# without DISPATCH_GIT_COMMIT (results files name the commit they measure: a copied tree has no .git),
# and defines left(): seconds remaining of TOTAL (default TOTAL_DEFAULT) since this point.
OUT=${1:?usage: $0 OUT_DIR}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
[ -n "${DISPATCH_GIT_COMMIT:-}" ] || { echo "set DISPATCH_GIT_COMMIT=<commit of this tree>"; exit 2; }
start=$(date +%s)
left() { echo $(( ${TOTAL:-${TOTAL_DEFAULT:-560}} - ($(date +%s) - start) )); }
# serve_wheels: the serving stack (`make gpu-wheels`: aiohttp, fastapi/uvicorn for `transformers serve`) from a
# carried .whl folder, beside the image's own packages.
serve_wheels() {
    if [ -d .whl ]; then
        python3 -m pip install -q --no-index --no-deps --target /tmp/serve-site .whl/*.whl > "$OUT/wheels.log" 2>&1
        export PYTHONPATH="$PYTHONPATH:/tmp/serve-site"
    fi
}
