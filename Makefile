# Two commands do all the set-up on a fresh machine: `make book` and `make test`.
# They create (or reuse) .venv, install the package with its book and dev extras, then run.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.dispatch-installed
# torch first, pinned. Without an NVIDIA driver (no working `nvidia-smi`) on Linux: the CPU build
# (torch==X+cpu: no CUDA libraries, no nvidia-* packages), from PyTorch's CPU wheel index when it
# answers, else from the indexes and wheel folders pip is configured with (a local wheel, offline);
# a CUDA build is refused there. With a driver: PyPI's default (CUDA) build. Override TORCH_SPEC,
# TORCH_INDEX (another index, or empty for none); PIP_EXTRA goes to every pip install.
TORCH_VERSION ?= 2.13.0
HAS_NVIDIA    := $(shell nvidia-smi -L >/dev/null 2>&1 && echo yes)
CPU_BUILD     := $(if $(HAS_NVIDIA),,$(filter Linux,$(shell uname -s)))
TORCH_SPEC    ?= torch==$(TORCH_VERSION)$(if $(CPU_BUILD),+cpu)
TORCH_INDEX   ?= $(if $(CPU_BUILD),https://download.pytorch.org/whl/cpu)
PIP_EXTRA     ?=
ARGS ?=
# Figures come from matplotlib's inline backend in the kernels; a backend forced from outside
# (MPLBACKEND=Agg) would drop them and fail nbval.
unexport MPLBACKEND

.PHONY: book vendor check-html book-gpu test test-perturbed test-bounds test-gpu lint bench clean env gpu-wheels release record-gpu evidence

env: $(STAMP)

$(STAMP): pyproject.toml setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@$(PY) -c "import torch" 2>/dev/null || { index=; \
	  if [ -n "$(TORCH_INDEX)" ]; then \
	    if $(PY) -c "import sys, urllib.request as u; u.urlopen(sys.argv[1].rstrip('/') + '/torch/', timeout=30)" \
	        "$(TORCH_INDEX)" 2>/dev/null; then index="--extra-index-url $(TORCH_INDEX)"; \
	    else echo "$(TORCH_INDEX) does not answer: $(TORCH_SPEC) from pip's own indexes and wheel folders"; fi; \
	  fi; \
	  echo "pip install $(PIP_EXTRA) $$index $(TORCH_SPEC)"; \
	  $(PY) -m pip install -q $(PIP_EXTRA) $$index "$(TORCH_SPEC)"; }
	@case "$(TORCH_SPEC)" in *+cpu*) $(PY) -W ignore -c "import sys, torch; sys.exit(torch.version.cuda and \
	  f'$(VENV) holds a CUDA build of torch ({torch.__version__}) where the CPU build was asked for: ' \
	  'remove $(VENV) and run make again, or set TORCH_SPEC')";; esac
	$(PY) -m pip install -q $(PIP_EXTRA) -e ".[book,dev,serve]"
	$(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $(STAMP)

# Execute every chapter in _toc.yml on the embedded default, then build _build/html and check it.
book: $(STAMP) vendor
	$(PY) -m dispatch_book.build $(ARGS)
	$(MAKE) --no-print-directory check-html

# MathJax and the widget library at pinned versions from npm into book/_static/vendor (not
# committed), so the pages render offline; without npm the pages load them from the CDN.
vendor: $(STAMP)
	$(PY) -m dispatch_book.vendor book/_static/vendor

# The built pages: code and output lines <= 88 characters, figures drawn at >= 70% of their width,
# no words about how the book was made; then in headless Chromium (where installed; BROWSER=required
# fails without it, as CI does): no JavaScript error, no missing local file, no wide table that
# nothing scrolls, figure text >= 9 px as shown (dispatch_book/htmlcheck.py, browsercheck.py).
BROWSER ?= auto
check-html: $(STAMP)
	$(PY) -m dispatch_book.htmlcheck --browser $(BROWSER) _build/html

# Unit tests, property tests and the notebooks under nbval, in one pytest run, on the CPU (the
# committed notebook outputs are the CPU default's; kernels run under Triton's interpreter), spread
# over the cores by pytest-xdist (TEST_WORKERS=auto: one per core; 0 runs in this process), a file
# at a time (--dist loadfile: a notebook's cells share one kernel, a module its fixtures).
# TEST_CPU_MIN: what the run costs in CPU time (measured: CONTRIBUTING.md lists the slowest tests),
# to say up front how long it will take.
TEST_WORKERS ?= auto
TEST_CPU_MIN := 25
test: $(STAMP)
	@n=$$($(PY) -c "import os; print(len(os.sched_getaffinity(0)))"); w=$(TEST_WORKERS); [ "$$w" = auto ] && w=$$n; \
	  [ "$$w" -gt 0 ] 2>/dev/null || w=1; [ "$$w" -gt "$$n" ] && w=$$n; \
	  echo "make test: about $(TEST_CPU_MIN) min of CPU time; on $$w core(s) of a quiet machine about" \
	       "$$(( ($(TEST_CPU_MIN) + $$w - 1) / $$w + 1 )) min (longer while other work shares the cores)"
	CUDA_VISIBLE_DEVICES= TRITON_INTERPRET=1 $(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile tests notebooks \
	  --nbval --nbval-current-env --nbval-sanitize-with .nbval_sanitize.cfg -m "not gpu" $(ARGS)

# The notebooks again under nbval with other floating-point round-off: one thread and ATen's
# baseline (non-vectorised) CPU kernels. `.ci/roundoff.py` first shows the setting changes raw sums.
PERTURB := OMP_NUM_THREADS=1 ATEN_CPU_CAPABILITY=default
test-perturbed: $(STAMP)
	$(PY) .ci/roundoff.py --differs-from "$$($(PERTURB) $(PY) .ci/roundoff.py)"
	$(PERTURB) CUDA_VISIBLE_DEVICES= TRITON_INTERPRET=1 $(PY) -m pytest notebooks --nbval --nbval-current-env --nbval-sanitize-with .nbval_sanitize.cfg -p no:cacheprovider $(ARGS)

# ruff over the whole repository (rules in pyproject.toml).
lint: $(STAMP)
	$(VENV)/bin/ruff check .

# On a GPU: every chapter with its "auto" parameters, then in a T4's budget, recorded in
# results/<gpu>/book_gpu.json (commit first: a dirty tree is refused).
book-gpu: $(STAMP)
	$(PY) -m dispatch_book.build --gpu --out results $(ARGS)
	$(PY) -m dispatch_book.build --gpu --t4-budget --out results $(ARGS)

# The Jupyter wheels a GPU machine without network needs for book-gpu (see the script).
gpu-wheels:
	bash dispatch_book/gpu_wheels.sh .whl

# On a CPU: the kernel and serving tests with every interpreted load and store checked against the
# launch's tensors (dispatch_book/bounds.py: what would be an illegal memory access on a GPU).
test-bounds: $(STAMP)
	DISPATCH_BOUNDS=1 CUDA_VISIBLE_DEVICES= $(PY) -m pytest -q -n 2 --dist loadfile tests/test_serve_attention.py \
		tests/test_serve_engine.py tests/test_engine_fused_moe.py tests/test_invariant.py tests/test_gemv.py $(ARGS)

# On a CUDA machine: the compiled kernels against the reference.
test-gpu: $(STAMP)
	$(PY) -m pytest tests -m gpu $(ARGS)

# On a GPU: record this GPU's whole set of recordings (results/<gpu>/) from a clean commit, resumable:
# run it again until it prints "complete" (each call stops before --budget-s, default 570 s).
record-gpu: $(STAMP)
	$(PY) -m dispatch_book.bench all --out results $(ARGS)

# Which recordings the chapters read, which are stale (their code changed since), and a failure for a
# recording that is dirty, names a commit outside HEAD's history, or is read but missing.
evidence: $(STAMP)
	$(PY) -m dispatch_book.bench evidence

# A benchmark suite, e.g. make bench ARGS="kernels --out results" (without --out the file goes to
# the scratch folder _build/results, never over the recordings the book reads).
bench: $(STAMP)
	$(PY) -m dispatch_book.bench $(ARGS)

# Tag this commit v<version> of pyproject.toml: the ref every chapter's Colab badge and install cell
# name (refused on a dirty tree, stale header cells or a tag that names another commit); push the
# tag with the commit (dispatch_book/release.py).
release: $(STAMP)
	$(PY) -m dispatch_book.release

clean:
	rm -rf _build .pytest_cache book/_static/vendor
