# Two commands for a fresh machine with Python 3.11 and make: `make demo` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-demo
# The extras the test suite exercises (make test installs them; make demo needs none of them).
TEST_EXTRAS := test,hf,s3,s3fast,http,text,image,ray,fast

.PHONY: install demo test test-fast lint format docs clean

# make demo: the package and its four requirements only (torch, numpy, fsspec, tqdm).
$(DEMO_STAMP): pyproject.toml Makefile
	@echo "== make demo: creating $(VENV) and installing torch 2.13.0 (CPU), numpy, fsspec, tqdm, wdsloader"
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# torch first, pinned: this version is a local CPU wheel; a range would pull a CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e .
	touch $(DEMO_STAMP)

# make test: the test stack on top (ray, datasets, transformers, lightning, moto, ...: ~2 GB).
$(STAMP): $(DEMO_STAMP) pyproject.toml Makefile
	@echo "== make test: installing the test stack into $(VENV) (extras: $(TEST_EXTRAS))"
	$(BIN)/pip install -q -e '.[$(TEST_EXTRAS)]'
	touch $(STAMP)

install: $(STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/python examples/demo.py

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m mypy
	$(BIN)/python -m pytest -q

# The quick loop: lint, types, and the tests not marked slow (no torchrun, Ray, example scripts).
test-fast: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m mypy
	$(BIN)/python -m pytest -q -m "not slow"

# The docs site from docs/ (mkdocs-material; the API reference from the docstrings) into site/:
# --strict makes every warning (a broken link or anchor, an unresolved reference) an error.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict --site-dir site

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache build *.egg-info demo_out site

# ---- benchmarks: `make bench` (full, ~20-25 min on 2 cores), `make bench-quick` ------------------
# The peers (webdataset, MosaicML Streaming, LitData, HF datasets) go into their own venv, never
# into .venv; torch is installed first and held at the same CPU build by bench/constraints.txt.
BENCH_VENV := .venv-bench
BENCH_BIN := $(BENCH_VENV)/bin
BENCH_STAMP := $(BENCH_VENV)/.installed
BENCH_ARGS ?=

.PHONY: bench bench-quick bench-install bench-remote

$(BENCH_STAMP): pyproject.toml bench/constraints.txt
	test -x $(BENCH_BIN)/python || $(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_BIN)/pip install -q torch==2.13.0
	$(BENCH_BIN)/pip install -q -c bench/constraints.txt -e '.[bench]'
	touch $(BENCH_STAMP)

bench-install: $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(BENCH_BIN)/python bench/run.py $(BENCH_ARGS)

bench-quick: $(BENCH_STAMP)
	$(BENCH_BIN)/python bench/run.py --quick --out bench/results/raw/quick $(BENCH_ARGS)

# from S3 on 127.0.0.1 (s3rver from npm; moto when npm is missing) behind our latency proxy,
# 40 ms and 2 ms RTT, num_workers 0 and 2; ~10 min on 2 cores (bench/remote/run.py)
S3RVER_PREFIX := $(HOME)/.cache/wdsloader-bench/s3rver
bench-remote: $(BENCH_STAMP)
	test -x $(S3RVER_PREFIX)/node_modules/.bin/s3rver || npm install -s --prefix $(S3RVER_PREFIX) s3rver@3.7.1 || echo "no npm: the bench falls back to moto"
	$(BENCH_BIN)/python bench/run.py --remote $(BENCH_ARGS)
