"""Run services (eksflow/local/services.py): a registered kind's objects go to a service the executor makes per run.

The service here is real and small: a FileServer object starts `python -m http.server` for the run's lifetime, and
`files://<name>/<path>` in a task's argv or env becomes that server's local address.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from eksflow.local import LocalExecutorError, RunServiceError, register_run_service, resume_workflow
from eksflow.local.manifest import parse_manifest
from eksflow.local.process import ProcessTracker
from eksflow.local.services import restarted
from eksflow.runtime.ports import free_port
from tests.unit.local.manifests import APPEND, container, lines, run, task, workflow

API, KIND = "test.eksflow.dev/v1", "FileServer"
SCHEME = "files://"
MADE: list[FileServers] = []  # every service the executor made, to look inside after a run
# Reads the URL in argv[1] and the one in $URL, writes both bodies to argv[2]; exits 1 while the file argv[3] exists.
FETCH = (
    "import os, sys, urllib.request as u\n"
    "os.path.exists(sys.argv[3]) and (os.remove(sys.argv[3]), sys.exit(1))\n"
    "bodies = [u.urlopen(url, timeout=10).read().decode() for url in (sys.argv[1], os.environ['URL'])]\n"
    "open(sys.argv[2], 'w').write(' '.join(bodies))"
)


class FileServers:
    """Serves each FileServer object's spec.directory on 127.0.0.1 while the run lasts."""

    def __init__(self, state_dir: Path, run_dir: Path, cwd: Path, tracker: ProcessTracker | None) -> None:
        self.run_dir, self.cwd, self.tracker = run_dir, cwd, tracker
        self.servers: dict[str, tuple[subprocess.Popen[bytes], int]] = {}
        self.tracked: list[int] = []  # pids the run's tracker knew while they ran
        MADE.append(self)

    def apply(self, manifest: Mapping[str, Any], where: str, stop_reason: Callable[[], str]) -> str:
        name = manifest["metadata"]["name"]
        folder = Path(manifest["spec"]["directory"])
        if not folder.is_dir():
            raise RunServiceError(f"{where}: no folder {folder}", retriable=False)
        port = free_port()
        argv = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(folder)]
        server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        assert self.tracker is not None
        self.tracker.started(f"files-{name}", server.pid)
        self.tracked += [pid for pid in self.tracker.live if pid == server.pid]
        self.servers[name] = (server, port)
        while not stop_reason():
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1).close()
                return f"FileServer {name} on 127.0.0.1:{port}"
            except OSError:
                time.sleep(0.1)
        raise RunServiceError(f"{where}: {stop_reason()}")

    def local_value(self, value: str) -> str:
        name, _, path = value.removeprefix(SCHEME).partition("/")
        if not value.startswith(SCHEME) or name not in self.servers:
            return value
        return f"http://127.0.0.1:{self.servers[name][1]}/{path}"

    def local_argv(self, argv: Sequence[str]) -> list[str]:
        return [self.local_value(item) for item in argv]

    def task_env(self) -> dict[str, str]:
        return {"FILE_SERVERS": " ".join(sorted(self.servers))} if self.servers else {}

    def stop(self) -> None:
        for server, _ in self.servers.values():
            server.terminate()
            server.wait(10)
            if self.tracker is not None:
                self.tracker.ended(server.pid)
        if self.servers:  # registered for every run of the process: a run without file servers writes nothing
            with open(self.cwd / "order.log", "a") as out:
                out.write(f"stopped {' '.join(sorted(self.servers))}\n")


def refuse_without_directory(manifest: Mapping[str, Any], where: str) -> None:
    if not (manifest.get("spec") or {}).get("directory"):
        raise RunServiceError(f"{where}.spec.directory is required: the folder the server serves")


register_run_service({(API, KIND)}, FileServers, refuse_without_directory)
register_run_service({(API, KIND)}, FileServers, refuse_without_directory)  # again, as a re-imported module would


def file_server(name: str, directory: str, **extra: Any) -> dict[str, Any]:
    manifest = {"apiVersion": API, "kind": KIND, "metadata": {"name": name}, "spec": {"directory": directory}}
    return {"name": name, "resource": {"action": "apply", "manifest": yaml.safe_dump(manifest)}, **extra}


def served(tmp_path: Path, *, fail_once: bool = False) -> dict[str, Any]:
    """A run serving a folder, a task fetching from it by its files:// address, and an exit handler."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "hello.txt").write_text("hello")
    flag = tmp_path / "fail-once"
    if fail_once:
        flag.write_text("")
    fetch = container("fetch", FETCH, "files://site/hello.txt", str(tmp_path / "fetched"), str(flag))
    fetch["container"]["env"] = [{"name": "URL", "value": "files://site/hello.txt"}]
    return workflow(
        [task("site", "site"), task("fetch", "fetch", "site")],
        [
            file_server("site", str(tmp_path / "site")),
            fetch,
            container("exit-handler", APPEND, str(tmp_path / "order.log"), "exit-handler"),
        ],
        onExit="exit-handler",
    )


def made_for(run_dir: Path) -> list[FileServers]:
    return [service for service in MADE if service.run_dir == run_dir]


def test_a_registered_kind_goes_to_the_runs_service_which_maps_addresses_and_stops_after_the_exit_handler(
    tmp_path: Path,
) -> None:
    result = run(served(tmp_path), tmp_path)
    assert result.phase == "Succeeded", result.output
    assert (tmp_path / "fetched").read_text() == "hello hello"  # the argv item and the env value, both mapped
    assert result.nodes["site"].message.startswith("FileServer site on 127.0.0.1:")
    assert lines(tmp_path / "order.log") == ["exit-handler", "stopped site"]
    [service] = made_for(result.run_dir)  # one per run
    (server, _) = service.servers["site"]
    assert server.poll() is not None and service.tracked == [server.pid]
    assert json.loads((result.run_dir / "owner.json").read_text())["processes"] == {}


def test_a_resumed_run_applies_the_services_objects_again_with_every_task_after_them(tmp_path: Path) -> None:
    manifest = served(tmp_path, fail_once=True)
    assert restarted(parse_manifest(manifest)) == {"site", "fetch"}
    first = run(manifest, tmp_path)
    assert first.phase == "Failed" and first.nodes["site"].phase == "Succeeded"
    again = resume_workflow(first.run_dir, cwd=tmp_path)
    assert again.phase == "Succeeded"
    assert (tmp_path / "fetched").read_text() == "hello hello"
    assert [list(s.servers) for s in made_for(first.run_dir)] == [["site"], ["site"]]  # a new service, served again
    assert lines(tmp_path / "order.log") == ["exit-handler", "stopped site"] * 2


def test_a_service_refusing_an_object_fails_it_once(tmp_path: Path) -> None:
    retry = {"limit": 2, "retryPolicy": "Always"}
    manifest = workflow([task("site", "site")], [file_server("site", str(tmp_path / "missing"), retryStrategy=retry)])
    result = run(manifest, tmp_path)
    assert result.phase == "Failed"
    assert "no folder" in result.nodes["site"].message and result.nodes["site"].retries in (0, None)


@pytest.mark.parametrize(
    ("manifest", "message"),
    [
        ({"apiVersion": API, "kind": KIND, "metadata": {"name": "x"}}, r"spec\.directory is required"),
        ({"apiVersion": API, "kind": "Unknown", "metadata": {"name": "x"}}, r"Unknown \(test\.eksflow\.dev/v1\) does"),
    ],
    ids=["checked", "unregistered"],
)
def test_an_object_the_run_cannot_take_fails_before_anything_runs(
    tmp_path: Path, manifest: dict[str, Any], message: str
) -> None:
    template = {"name": "site", "resource": {"action": "apply", "manifest": yaml.safe_dump(manifest)}}
    with pytest.raises(LocalExecutorError, match=message) as caught:
        run(workflow([task("site", "site")], [template]), tmp_path)
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "state").exists()


@pytest.mark.parametrize(
    ("manifest", "extra", "message"),
    [
        (
            {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "x"}},
            {},
            r"deleting RayJob \(ray\.io/v1\) is not supported locally; a delete runs here for the kinds a run service "
            r"runs: .*FileServer \(test\.eksflow\.dev/v1\)",
        ),
        ({"apiVersion": API, "kind": KIND, "metadata": {}}, {}, r"metadata\.name is required: it names the object"),
        (
            {"apiVersion": API, "kind": KIND, "metadata": {"name": "x"}},
            {"successCondition": "status.gone == true"},
            r"resource\.successCondition: Argo refuses a success or failure condition on a delete",
        ),
    ],
    ids=["a-job-kind", "unnamed", "condition"],
)
def test_a_delete_the_run_cannot_do_fails_before_anything_runs(
    tmp_path: Path, manifest: dict[str, Any], extra: dict[str, str], message: str
) -> None:
    template = {"name": "gone", "resource": {"action": "delete", "manifest": yaml.safe_dump(manifest), **extra}}
    with pytest.raises(LocalExecutorError, match=message) as caught:
        run(workflow([task("gone", "gone")], [template]), tmp_path)
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "state").exists()


def test_a_kind_goes_to_one_service_only() -> None:
    with pytest.raises(RunServiceError, match="already go to the run service") as refused:
        register_run_service({(API, KIND)}, OtherServers)
    assert refused.value.exit_code == 2  # a registration bug: no retry fixes it


class OtherServers(FileServers):
    """Another service for the same kind."""
