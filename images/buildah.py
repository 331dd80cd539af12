"""buildah, driven by argument lists: no shell line, no value pasted into a script.

buildah builds and runs OCI images without a daemon. `--isolation chroot` needs neither user namespaces nor
cgroups, so it works inside a container that cannot run podman or docker (this machine's CI among them).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ISOLATION = "chroot"
TOOLS = ("buildah", "mmdebstrap")  # mmdebstrap makes the stand-in base where no registry can be reached


class ImagesError(Exception):
    """A build or check that cannot go on; its message is the one line the command prints."""


def require_tools() -> None:
    """Put buildah and mmdebstrap on PATH (apt-get, where this runs as root); ImagesError where they cannot be."""
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if not missing:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise ImagesError(f"{' and '.join(missing)} not installed: as root, apt-get install buildah mmdebstrap")
    print(f"installing {' and '.join(missing)} (apt-get)", flush=True)
    for argv in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *TOOLS]):
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise ImagesError(f"{' '.join(argv)} failed: {last_line(done.stderr or done.stdout)}")


def last_line(text: str) -> str:
    """The last non-blank line of a tool's output (its error, as a rule)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def without_trailer(output: str) -> str:
    """A command's output without the lines buildah adds after it fails: its own last line is the one to show."""
    return re.sub(r"(\n?(subprocess exited (with status \d+|on \w+)|Error: exit status \d+))+\s*$", "", output)


def buildah(*args: str, timeout_s: float = 600) -> subprocess.CompletedProcess[str]:
    """`buildah <args>`, its output captured."""
    return subprocess.run(["buildah", *args], capture_output=True, text=True, timeout=timeout_s, check=False)


def exists(image: str) -> bool:
    """Whether `image` is in local storage."""
    return buildah("inspect", "--type", "image", image).returncode == 0


def inspect(image: str) -> dict[str, Any]:
    """`buildah inspect` of a stored image (its OCI config under OCIv1.config)."""
    done = buildah("inspect", "--type", "image", image)
    if done.returncode != 0:
        raise ImagesError(f"no image {image} here: run `make images` first ({last_line(done.stderr)})")
    found: dict[str, Any] = json.loads(done.stdout)
    return found


def size(image: str) -> str:
    """The stored size of `image` as buildah prints it ("2.1 GB")."""
    done = buildah("images", "--json", image)
    listed = json.loads(done.stdout) if done.returncode == 0 and done.stdout.strip() else []
    return str(listed[0]["size"]) if listed else "?"


def pull(image: str, timeout_s: float = 300) -> str:
    """Pull `image`; "" when it came, else why not (one line)."""
    try:
        done = buildah("pull", "--quiet", image, timeout_s=timeout_s)
    except subprocess.TimeoutExpired:
        return f"no answer in {timeout_s:.0f} s"
    return "" if done.returncode == 0 else last_line(done.stderr)


@dataclass
class Build:
    """One `buildah bud`: a Containerfile in a context folder, its tag, build arguments and build-only mounts."""

    containerfile: Path
    context: Path
    tag: str
    build_args: dict[str, str] = field(default_factory=dict)
    mounts: Sequence[tuple[Path, str]] = ()  # (host path, path in the build's RUN steps), read-only

    def argv(self) -> list[str]:
        """The `buildah bud` command line (`--layers`: unchanged steps come from the cache)."""
        argv = [
            "buildah",
            "bud",
            "--isolation",
            ISOLATION,
            "--layers",
            "--pull=never",
            "-f",
            str(self.containerfile),
            "-t",
            self.tag,
        ]
        for name, value in sorted(self.build_args.items()):
            argv += ["--build-arg", f"{name}={value}"]
        for host, inside in self.mounts:
            argv += ["--volume", f"{host}:{inside}:ro"]
        return [*argv, str(self.context)]

    def run(self, log: Path) -> float:
        """Build; the tool's output goes to `log`, its steps to stdout. Seconds taken, or ImagesError."""
        log.parent.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        with log.open("w", encoding="utf-8") as out:
            process = subprocess.Popen(
                self.argv(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=self.context
            )
            assert process.stdout is not None
            for line in process.stdout:
                out.write(line)
                if line.startswith("STEP "):  # "STEP 7/15: RUN pip install ...": the build's progress
                    elapsed = time.monotonic() - started
                    print(f"  {elapsed:6.0f} s  {line.rstrip()[:110]}", flush=True)
            code = process.wait()
        if code != 0:
            tail = "".join(log.read_text(encoding="utf-8").splitlines(keepends=True)[-15:])
            sys.stderr.write(tail)
            raise ImagesError(f"building {self.tag} failed (buildah exit {code}); its whole output: {log}")
        return time.monotonic() - started


@dataclass
class Container:
    """A working container of an image, to run commands in as a pod would; removed on exit."""

    image: str
    name: str = ""

    def __enter__(self) -> Container:
        done = buildah("from", "--pull=never", self.image)
        if done.returncode != 0:
            raise ImagesError(f"no image {self.image} here: run `make images` first ({last_line(done.stderr)})")
        self.name = done.stdout.strip().splitlines()[-1]
        return self

    def __exit__(self, *_: object) -> None:
        buildah("rm", self.name)

    def command(
        self, argv: Sequence[str], user: str, env: dict[str, str], mounts: Sequence[tuple[Path, str]]
    ) -> list[str]:
        """The `buildah run` command line of `argv` in this container.

        As `user`, with no capability (the pods drop ALL), `env` added to the image's, and each (host folder, path)
        mount (read-write unless the path ends with `:ro`).
        """
        command = ["buildah", "run", "--isolation", ISOLATION, "--user", user, "--cap-drop", "ALL"]
        for name, value in sorted(env.items()):
            command += ["--env", f"{name}={value}"]
        for host, inside in mounts:
            command += ["--volume", f"{host}:{inside}"]
        return [*command, self.name, "--", *argv]

    def start(self, argv: Sequence[str], *, user: str, env: dict[str, str], mounts: Sequence[tuple[Path, str]],
              log: Path) -> subprocess.Popen[bytes]:  # fmt: skip
        """Start `argv` in the container in the background, its output to `log`, in a session of its own.

        eksflow.local.process.stop_tree then stops it as a whole, as a pod's end does.
        """
        with log.open("wb") as out:
            return subprocess.Popen(
                self.command(argv, user, env, mounts), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def run(
        self,
        argv: Sequence[str],
        *,
        user: str,
        env: dict[str, str] | None = None,
        mounts: Sequence[tuple[Path, str]] = (),
        timeout_s: float = 900,
    ) -> subprocess.CompletedProcess[str]:
        """Run `argv` in the container (see `command`) to its end."""
        try:
            done = buildah(*self.command(argv, user, env or {}, mounts)[1:], timeout_s=timeout_s)
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(argv, 124, "", f"no end in {timeout_s:.0f} s")
        done.stderr = without_trailer(done.stderr)
        return done
