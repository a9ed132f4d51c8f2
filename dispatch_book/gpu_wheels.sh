#!/usr/bin/env bash
# Wheels for executing the chapters on a GPU machine whose Python (3.12) has torch, triton,
# transformers, matplotlib, ... but no Jupyter stack and no network: papermill, ipykernel,
# ipywidgets, nbformat and nbclient with their dependencies; the server's extra `serve` (aiohttp)
# and what `transformers serve` needs (its `serving` extra: fastapi, uvicorn, starlette, pydantic,
# openai) for chapter 8's peers; minus what that image already holds.
#   bash dispatch_book/gpu_wheels.sh [DIR]          (default .whl; `make gpu-wheels`)
# There:  python3 -m pip install -q --no-index --no-deps --target /tmp/site DIR/*.whl
#         PYTHONPATH=/tmp/site:$PWD python3 -m dispatch_book.build --gpu --out results
set -euo pipefail
dir=${1:-.whl}
py=${PYTHON:-python3}
mkdir -p "$dir"
plat=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
         manylinux_2_24_x86_64 manylinux_2_31_x86_64 manylinux_2_34_x86_64 manylinux1_x86_64; do
  plat+=(--platform "$p")
done
"$py" -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" \
  -d "$dir" papermill ipykernel ipywidgets nbformat nbclient
"$py" -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" \
  -d "$dir" "aiohttp>=3.9" fastapi uvicorn starlette "pydantic>=2" "openai>=1.98"
# Already in the GPU image (its package list): keep the image's own versions.
have="aiohappyeyeballs aiohttp aiosignal annotated_doc anyio attrs certifi charset_normalizer click \
filelock frozenlist fsspec h11 httpcore httpx idna jinja2 markupsafe multidict numpy packaging pip \
propcache psutil pygments python_dateutil pyyaml regex requests rich setuptools six tqdm \
typing_extensions urllib3 yarl"
for name in $have; do
  rm -f "$dir"/"$name"-*.whl "$dir"/"${name//_/-}"-*.whl
  # wheel file names normalise case and '-' to '_'
  find "$dir" -maxdepth 1 -iname "${name}-*.whl" -delete
done
ls "$dir"
