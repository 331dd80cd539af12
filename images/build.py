"""`make images`: build the CPU images with buildah, tagged as the config names them.

    python -m images.build [--only steps] [--config FILE]

Builds images/steps.Dockerfile and images/serve-cpu.Dockerfile from the repository root, as `docker build` would
in a user's CI (the GPU and Neuron images need their vendors' bases and are linted, not built, here). Where the
Dockerfile's base (BASE_IMAGE, pinned by digest) cannot be pulled, a stand-in is built from Debian's packages
(images/standin) and the output says so. Where this machine's pip reaches its index through a configuration of
its own, that configuration is passed to the build only (images.pipconf), never as a build argument: the image's
history records every build argument, so no index URL of this machine's is one. Layers are cached (`--layers`): a
change to the code rebuilds only the layers after the lock's.

Environment: TORCH_INDEX_URL (where torch's CPU build comes from; default the Dockerfile's, the PyTorch CPU index;
it is a build argument, so one holding a credential is refused: put that index in pip's configuration instead).
The LiteLLM proxy runs LiteLLM's own image (serving.proxy_image): eksflow builds none for it.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from eksflow.runtime.shown import url_credential
from images import buildah, pipconf
from images.buildah import Build, ImagesError

ROOT = Path(__file__).resolve().parents[1]
STATE = ROOT / ".eksflow" / "images"  # build logs and the stand-in's root filesystem
STANDIN = ROOT / "images" / "standin" / "Containerfile"
STANDIN_PACKAGES = ("python3", "python3-pip", "python-is-python3", "ca-certificates", "netbase", "tzdata")
STANDIN_OF = "python:3.11-slim-bookworm"  # what the stand-in replaces: Debian 12 (bookworm), Python 3.11
SUITE = "bookworm"


@dataclass(frozen=True)
class Image:
    """A CPU image: its Dockerfile and the tag the config names it by."""

    name: str
    dockerfile: Path
    tag: str


def images(config: Path | None = None) -> list[Image]:
    """The CPU images, tagged as `config` (default: the flagship's defaults) names them.

    `image` names the steps image, `serving.cpu_image` vLLM's on CPU nodes.
    """
    from eksflow.config import load_config
    from eksflow.llm.serving.objects import ServingConfig
    from pipelines.llama_lora import LlamaLoraConfig

    steps = load_config(LlamaLoraConfig, config, ())
    serving = load_config(ServingConfig, config, ())
    return [
        Image("steps", ROOT / "images" / "steps.Dockerfile", steps.image),
        Image("serve-cpu", ROOT / "images" / "serve-cpu.Dockerfile", serving.serving.cpu_image),
    ]


def shown(path: Path) -> str:
    """`path` as the output names it: relative to the repository where it lies in it."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def default_arg(dockerfile: Path, name: str) -> str:
    """The default of `ARG <name>=...` in `dockerfile`."""
    match = re.search(rf"^ARG {name}=(\S+)$", dockerfile.read_text(encoding="utf-8"), re.MULTILINE)
    if match is None:
        raise ImagesError(f"{shown(dockerfile)} has no `ARG {name}=<default>`")
    return match[1]


def base_image(dockerfile: Path) -> str:
    """The base to build `dockerfile` on: its BASE_IMAGE if stored or pullable, else the stand-in (said so)."""
    return resolved_base(default_arg(dockerfile, "BASE_IMAGE"))


@functools.cache  # the images share their base: one pull attempt (or wait for a silent registry) per run
def resolved_base(base: str) -> str:
    """`base` if stored or pullable, else the stand-in for it (said so), else ImagesError."""
    if buildah.exists(base):
        return base
    why = buildah.pull(base)
    if not why:
        return base
    if not base.startswith(f"{STANDIN_OF}@") and base != STANDIN_OF:
        raise ImagesError(f"cannot pull {base} ({why}) and no stand-in exists for it")
    standin = standin_image()
    why = why if len(why) <= 120 else f"...{why[-117:]}"
    print(f"{base} cannot be pulled here ({why}): building on {standin}, a stand-in made from Debian {SUITE}'s "
          f"packages (Python 3.11)", flush=True)  # fmt: skip
    return standin


def standin_image() -> str:
    """The stand-in base, built once per Containerfile and package list (its tag carries their digest)."""
    key = hashlib.sha256("\n".join([STANDIN.read_text(encoding="utf-8"), SUITE, *STANDIN_PACKAGES]).encode())
    tag = f"localhost/eksflow/python-standin:3.11-{SUITE}-{key.hexdigest()[:12]}"
    if buildah.exists(tag):
        return tag
    context = STATE / "standin"
    shutil.rmtree(context, ignore_errors=True)
    context.mkdir(parents=True)
    print(f"making the stand-in's root filesystem: mmdebstrap {SUITE} with {', '.join(STANDIN_PACKAGES)}", flush=True)
    started = time.monotonic()
    argv = ["mmdebstrap", "--variant=minbase", f"--include={','.join(STANDIN_PACKAGES)}", SUITE,
            str(context / "rootfs.tar")]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ImagesError(f"mmdebstrap failed: {buildah.last_line(done.stderr)}")
    shutil.copyfile(STANDIN, context / "Containerfile")
    Build(context / "Containerfile", context, tag).run(STATE / "standin.log")
    shutil.rmtree(context)
    print(f"stand-in {tag} made in {time.monotonic() - started:.0f} s", flush=True)
    return tag


def torch_index(dockerfile: Path, pip: pipconf.BuildPip) -> str:
    """Where the build takes torch's CPU build from ("": wherever the build's pip configuration says).

    $TORCH_INDEX_URL, else the Dockerfile's default if it answers, else this machine's pip configuration when one
    of its find-links folders holds the pinned CPU wheel.
    """
    if chosen := os.environ.get("TORCH_INDEX_URL"):
        if found := url_credential(chosen):
            raise ImagesError(
                f"TORCH_INDEX_URL holds a credential ({found}), and the image's history would record it as a build "
                "argument: give that index to pip's configuration (pip config set global.extra-index-url ...), "
                "which reaches the build as a mounted file only"
            )
        return chosen
    pinned = re.search(r"torch==([\d.]+)", dockerfile.read_text(encoding="utf-8"))
    default = default_arg(dockerfile, "TORCH_INDEX_URL")
    return resolved_torch_index(default, pinned[1] if pinned else "", tuple(pip.find_links))


@functools.cache  # one probe of the index per run, whichever image asks
def resolved_torch_index(default: str, version: str, find_links: tuple[Path, ...]) -> str:
    """`default` if it answers, else "" (pip's own configuration) when its find-links hold `version`'s CPU wheel."""
    try:
        urllib.request.urlopen(urllib.request.Request(f"{default}/torch/", method="HEAD"), timeout=15).close()
        return default
    except (OSError, urllib.error.URLError) as error:
        why = str(getattr(error, "reason", error))
    wheels = [w for folder in find_links for w in folder.glob(f"torch-{version}+cpu-cp311-*.whl")]
    if not wheels:
        raise ImagesError(
            f"the PyTorch CPU index {default} cannot be reached ({why}) and pip's find-links hold no "
            f"torch {version}+cpu wheel; set TORCH_INDEX_URL to an index with PyTorch's CPU builds"
        )
    print(f"the PyTorch CPU index cannot be reached ({why}): torch {version}+cpu comes from {wheels[0].parent} "
          "(this machine's pip configuration)", flush=True)  # fmt: skip
    return ""


def image_build(image: Image, pip: pipconf.BuildPip, conf: Path) -> Build:
    """The build of one image: its base and torch's index as build arguments, pip's configuration as mounts."""
    args = {"BASE_IMAGE": base_image(image.dockerfile), "TORCH_INDEX_URL": torch_index(image.dockerfile, pip)}
    mounts = list(pip.mounts)
    if pip.settings:
        args["PIP_CONFIG_FILE"] = pipconf.CONFIG_INSIDE
        mounts.append((conf, pipconf.CONFIG_INSIDE))
    return Build(image.dockerfile, ROOT, image.tag, args, mounts)


def build(image: Image, pip: pipconf.BuildPip, conf: Path) -> float:
    """Build one image; seconds taken."""
    print(f"{image.name}: building {image.tag} from {shown(image.dockerfile)}", flush=True)
    return image_build(image, pip, conf).run(STATE / f"{image.name}.log")


def build_all(chosen: list[Image]) -> dict[str, float]:
    """Build `chosen` with this machine's pip configuration passed to the builds; seconds each took, by name."""
    pip = pipconf.for_build(pipconf.host_settings())
    with tempfile.TemporaryDirectory(prefix="eksflow-pip-") as folder:
        conf = Path(folder) / "pip.conf"
        conf.write_text(pip.conf_text(), encoding="utf-8")
        return {image.name: build(image, pip, conf) for image in chosen}


def main(argv: list[str] | None = None) -> int:
    """Build the chosen images; 0, or 1 after one line naming what failed."""
    parser = argparse.ArgumentParser(prog="python -m images.build", description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", help="build only this image (steps, serve-cpu); repeatable")
    parser.add_argument("--config", type=Path, help="the config file whose image names tag the builds")
    options = parser.parse_args(argv)
    try:
        buildah.require_tools()
        known = images(options.config)
        chosen = [image for image in known if not options.only or image.name in options.only]
        unknown = sorted(set(options.only or ()) - {image.name for image in known})
        if unknown:
            raise ImagesError(f"no image named {', '.join(unknown)}; the CPU images are steps and serve-cpu")
        took = build_all(chosen)
    except ImagesError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    for image in chosen:
        print(f"{image.name}: {image.tag} built in {took[image.name]:.0f} s, {buildah.size(image.tag)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
