"""`make check-images` fails on a broken image: the steps Dockerfile with a step module left out and USER root.

Built on the layers `make images` cached (only the last ones differ), then checked as `make check-images` checks
the real one.
"""

import subprocess
import sys
from pathlib import Path

import pytest

from images import buildah
from images.build import ROOT, Image, build_all

pytestmark = pytest.mark.images

BROKEN = "localhost/eksflow-check/broken-steps:test"


def broken_dockerfile(folder: Path) -> Path:
    """images/steps.Dockerfile as a careless edit leaves it: evaluate's package gone, and root as the user."""
    text = (ROOT / "images" / "steps.Dockerfile").read_text()
    broken = text.replace(
        "COPY eksflow ./eksflow\n", "COPY eksflow ./eksflow\nRUN rm -r eksflow/llm/steps/evaluate\n"
    ).replace("\nUSER 1000\n", "\nUSER root\n")
    assert broken.count("rm -r eksflow/llm/steps/evaluate") == 1 and "USER root" in broken
    path = folder / "steps.Dockerfile"
    path.write_text(broken)
    return path


@pytest.fixture
def broken_image(tmp_path: Path):
    build_all([Image("steps", broken_dockerfile(tmp_path), BROKEN)])
    yield BROKEN
    buildah.buildah("rmi", "--force", BROKEN)


def test_check_images_fails_on_a_missing_step_module_and_a_root_user(broken_image):
    done = subprocess.run(
        [sys.executable, "-m", "images.check", f"--image=steps={broken_image}"],
        cwd=ROOT, capture_output=True, text=True, timeout=1800, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout[-3000:]
    error = done.stderr.strip().splitlines()[-1]
    assert error.startswith("error: ") and "image checks failed" in error
    assert (
        "eksflow.llm.steps.evaluate --help (exit 1: " in error and "No module named eksflow.llm.steps.evaluate" in error
    )
    assert "USER is 1000 (the image runs as 'root')" in error
    assert "evaluate on the tiny model" in error  # the pod's own command fails as its --help did
    assert "validate_data on the demo data" not in error and "eksflow.llm.steps.validate_data --help" not in error
