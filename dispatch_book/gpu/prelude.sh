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
