# The CPU image of every step but GPU and Trainium training: stage_data, validate_data, evaluate, register, the
# rollout's steps (and the CPU profile's train step). Build from the repository root (`make images` builds it with
# buildah and checks it with `make check-images`):
#     docker build -f images/steps.Dockerfile -t ghcr.io/eksflow/steps:0.1.0 .
# Build arguments, each defaulting to what a normal build uses (the image's history records their values, so none
# may hold a credential):
#   BASE_IMAGE       the Python base, pinned by digest (docker-library/repo-info: Python 3.11.16, built 2026-09-19)
#   TORCH_INDEX_URL  where torch's CPU build comes from (PyPI's torch for Linux is the CUDA build); empty: wherever
#                    pip's configuration says
#   PIP_CONFIG_FILE  a pip configuration (CA certificate, a mirror and its credentials) mounted for the build only,
#                    never copied in: every install but torch's uses its index, else PyPI
ARG BASE_IMAGE=python:3.11-slim-bookworm@sha256:a36c24f9cbdf4fd0f52d67f0823eeac19c2028c637cecc392d97f980d4fec56b
FROM ${BASE_IMAGE}
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG PIP_CONFIG_FILE

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# uid 1000: the runAsUser of the restricted security context every step template sets
RUN useradd --uid 1000 --create-home --home-dir /home/eksflow --shell /usr/sbin/nologin eksflow
WORKDIR /app
# a project's own packages sit in /app (PYTHONPATH): an image FROM this one copies its `steps` and `pipelines` there
ENV PYTHONPATH=/app

# Layers from the least to the most often changed, so a change to the code rebuilds only the last ones: torch
# (pinned: an unpinned torch pulls the multi-GB CUDA build; refused if a CUDA build came anyway), then the steps'
# runtime from its lock (every file checked against its hash), then eksflow (the SDK and its LLM steps).
RUN pip install ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} torch==2.13.0 \
    && python -c "import sys, torch; sys.exit(torch.version.cuda and f'CUDA torch {torch.__version__} in a CPU image')"
COPY requirements/steps.txt ./requirements/
RUN pip install --no-deps --require-hashes -r requirements/steps.txt
COPY pyproject.toml README.md ./
COPY eksflow ./eksflow
RUN pip install --no-deps --no-build-isolation . && rm -rf build eksflow.egg-info eksflow pyproject.toml README.md requirements

USER 1000
# Argo sets command/args per template (`python -m eksflow.llm.steps.<name> --...`); this default only documents it
CMD ["python", "-m", "eksflow.llm.steps.stage_data", "--help"]
