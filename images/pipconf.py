"""This machine's pip configuration, passed to an image build for the build only.

Where a machine reaches its package index through a configuration of its own (a CA certificate, an extra index or
a find-links folder on disk, a constraints file), a build inside a container sees none of it: its RUN steps would
fail certificate checks or miss local wheels. The configuration is rewritten into a pip.conf whose local paths
point at read-only mounts under /run/eksflow-build, given to the build's RUN steps as PIP_CONFIG_FILE. A mount
never becomes part of an image, but a build argument's value does: the image's history records every build
argument a RUN step sees, so an index URL (which may hold a user and a token) travels only inside the mounted file.
A machine without such a configuration passes nothing.
"""

from __future__ import annotations

import configparser
import io
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlparse

from images.buildah import ImagesError, last_line

INSIDE = "/run/eksflow-build"
CONFIG_INSIDE = f"{INSIDE}/pip.conf"
# The settings that decide where an install finds packages and how it talks to the index.
PASSED = ("index-url", "cert", "client-cert", "extra-index-url", "find-links", "constraint", "trusted-host", "timeout",
          "default-timeout", "retries", "proxy")  # fmt: skip
LISTS = ("extra-index-url", "find-links", "trusted-host", "constraint")  # whitespace-separated values
PATHS = ("index-url", "cert", "client-cert", "extra-index-url", "find-links", "constraint")  # may be local paths
INDEXES = ("index-url", "extra-index-url")  # a local index links its files relatively (../../files/...)


@dataclass
class BuildPip:
    """What a build needs of the host's pip: read-only mounts, and the pip.conf to write."""

    settings: dict[str, str] = field(default_factory=dict)  # rewritten to paths inside the build
    mounts: list[tuple[Path, str]] = field(default_factory=list)  # (host path, path inside)
    find_links: list[Path] = field(default_factory=list)  # the host's find-links folders

    def conf_text(self) -> str:
        """The pip.conf the build reads (PIP_CONFIG_FILE)."""
        parser = configparser.ConfigParser(interpolation=None)
        parser["global"] = self.settings
        out = io.StringIO()
        parser.write(out)
        return out.getvalue()


def host_settings(python: str = sys.executable) -> dict[str, str]:
    """`pip config list` of `python`'s pip (files and PIP_* variables; the environment's wins), by setting name."""
    done = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ImagesError(f"`pip config list` failed: {last_line(done.stderr)}")
    return parse_config_list(done.stdout)


def parse_config_list(listed: str) -> dict[str, str]:
    """Settings by name from `pip config list` lines (`global.cert='...'`, `:env:.cert='...'`): the env's win."""
    found: dict[str, tuple[int, str]] = {}
    for line in listed.splitlines():
        match = re.fullmatch(r"(:env:|[\w-]+)\.([\w-]+)=(['\"])(.*)\3", line.strip())
        if match is None:
            continue
        rank = 1 if match[1] == ":env:" else 0
        if match[2] not in found or rank >= found[match[2]][0]:
            found[match[2]] = (rank, match[4])
    return {name: value for name, (_, value) in found.items()}


def for_build(settings: dict[str, str]) -> BuildPip:
    """The build's view of `settings`: local paths mounted read-only under INSIDE and rewritten to point there."""
    build = BuildPip()
    mounted: dict[Path, str] = {}

    def inside(host: Path) -> str:
        if host not in mounted:
            if not host.exists():
                raise ImagesError(f"pip's configuration names {host}, which does not exist")
            mounted[host] = f"{INSIDE}/{len(mounted)}{host.suffix if host.is_file() else ''}"
            build.mounts.append((host, mounted[host]))
        return mounted[host]

    for name in PASSED:
        if name not in settings:
            continue
        values = settings[name].split() if name in LISTS else [settings[name]]
        rewritten = []
        for value in values:
            local = local_path(value) if name in PATHS else None
            if local is None:
                rewritten.append(value)
                continue
            if name == "find-links" and local.is_dir():
                build.find_links.append(local)
            if name in INDEXES:  # the index's parent goes in whole, so that its relative links resolve
                rewritten.append(f"file://{inside(local.parent)}/{local.name}")
            else:
                rewritten.append(("file://" if value.startswith("file:") else "") + inside(local))
        build.settings[name] = "\n".join(rewritten)
    return build


def local_path(value: str) -> Path | None:
    """The host path `value` names (a path or a file:// URL), or None for a remote address."""
    if value.startswith("file:"):
        return Path(unquote(urlparse(value).path))
    return Path(value) if value.startswith("/") else None
