"""The fleet's engines beside a run's first tasks, one fleet per pipeline and state folder, one run's engines per
machine, and a fleet object deleted by a later task.

Small workflows with the flagship's own proxy objects run on the real executor; the LiteLLM proxy is a script named by
$EKSFLOW_LITELLM (a broken engine, or one whose check waits for the first task), so nothing trains and no engine
installs (but where the install's failure is the point: an empty cache, no index).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from eksflow.llm.serving import engine_supply, policies
from eksflow.llm.serving import objects as serving
from eksflow.llm.serving.fleet_locks import FleetLocks
from eksflow.llm.serving.fleet_pods import FleetError
from eksflow.llm.serving.local_fleet import LocalFleet  # registers the fleet's kinds with the executor
from tests.flagship import config
from tests.unit.local.manifests import container, run, task, workflow

CFG = config()
TRACEBACK = "Traceback (most recent call last):\n  File proxy_server.py\nImportError: cannot import name 'proxy_server'"


def applied(name: str, manifest: dict[str, Any], action: str = "apply") -> dict[str, Any]:
    return {"name": name, "resource": {"action": action, "manifest": yaml.safe_dump(manifest)}}


def deleted(name: str, manifest: dict[str, Any]) -> dict[str, Any]:
    """A delete of the object `manifest` names, as resource(..., action="delete") renders it."""
    named = {"apiVersion": manifest["apiVersion"], "kind": manifest["kind"], "metadata": manifest["metadata"]}
    return applied(name, {**named, "metadata": {"name": manifest["metadata"]["name"]}}, "delete")


def fake_litellm(tmp_path: Path, body: str) -> Path:
    """A `litellm` program: `--version` runs `body`'s first part, serving its second (Python, after `#serve`)."""
    program = tmp_path / "bin" / "litellm"
    program.parent.mkdir(exist_ok=True)
    program.write_text(f"#!{sys.executable}\nimport sys, os, time\n{body}\n")
    program.chmod(0o755)
    return program


def first_then_proxy(tmp_path: Path, *, deploy: bool, first_s: int = 30) -> dict[str, Any]:
    """A first task (what would validate and train) writing `first` after `first_s`, then the proxy's ConfigMap and
    Deployment (only if `deploy`: the workflow has it either way, as a run's preparation sees it)."""
    code = "import sys, time; time.sleep(float(sys.argv[2])); open(sys.argv[1], 'w')"
    first = container("first", code, str(tmp_path / "first"), str(first_s))
    steps = [task("first", "first"), task("proxy-config", "proxy-config", "first")]
    if deploy:
        steps.append(task("proxy", "proxy", "proxy-config"))
    return workflow(
        steps,
        [
            first,
            applied("proxy-config", serving.proxy_config_map(CFG)),
            applied("proxy-policy", policies.proxy_network_policy(CFG)),  # named as the Deployment: one log once
            applied("proxy", serving.proxy_deployment(CFG)),
        ],
    )


@pytest.fixture
def engines_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("EKSFLOW_ENGINES_DIR", str(tmp_path / "engines"))
    for name in ("EKSFLOW_LITELLM", "EKSFLOW_VLLM_PYTHON", "EKSFLOW_VLLM_URL"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "engines"


def test_an_engine_that_does_not_run_stops_the_run_at_its_start_with_its_error_line(
    tmp_path: Path, engines_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    """A LiteLLM whose program fails ran validate, train and evaluate first, then failed quoting another line."""
    program = fake_litellm(tmp_path, f"print({TRACEBACK!r}, file=sys.stderr); sys.exit(1)")
    monkeypatch.setenv("EKSFLOW_LITELLM", str(program))
    result = run(first_then_proxy(tmp_path, deploy=True), tmp_path)
    assert result.phase == "Failed"
    assert result.message == (
        f"engine error: $EKSFLOW_LITELLM={program}: the LiteLLM proxy (litellm 1.110.2, ~530 MB) does not run: "
        "ImportError: cannot import name 'proxy_server'"
    )
    assert not (tmp_path / "first").exists()  # stopped at once: what trains never finished
    assert result.nodes["proxy"].phase == "Omitted"


def test_a_fleet_process_that_dies_is_named_by_its_logs_error_line(
    tmp_path: Path, engines_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    """Its log also held the NetworkPolicy of the same name, whose note the task quoted instead."""
    serve = f"if '--version' in sys.argv: sys.exit(0)\nprint({TRACEBACK!r}, file=sys.stderr); sys.exit(1)"
    monkeypatch.setenv("EKSFLOW_LITELLM", str(fake_litellm(tmp_path, serve)))
    manifest = first_then_proxy(tmp_path, deploy=True, first_s=0)
    main = manifest["spec"]["templates"][-1]["dag"]["tasks"]
    main.insert(1, task("proxy-policy", "proxy-policy", "first"))
    main[-1]["depends"] = "proxy-config && proxy-policy"
    result = run(manifest, tmp_path)
    message = result.nodes["proxy"].message
    assert result.phase == "Failed" and len(message.splitlines()) == 1, message
    assert message.startswith("llama-lora-proxy exited with code 1 before it was ready: ImportError: cannot import")
    assert "NetworkPolicy" not in message


def test_engines_are_made_ready_beside_the_first_tasks(
    tmp_path: Path, engines_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    """Both engines' installs ran before the first task (245 s on a fresh machine); the fleet is applied later."""
    order = tmp_path / "order"
    check = (
        f"deadline = time.monotonic() + 60\n"
        f"while not os.path.exists({str(tmp_path / 'first')!r}) and time.monotonic() < deadline: time.sleep(0.1)\n"
        f"open({str(order)!r}, 'a').write('checked after the first task\\n' if time.monotonic() < deadline else "
        "'checked before it\\n')"
    )
    monkeypatch.setenv("EKSFLOW_LITELLM", str(fake_litellm(tmp_path, check)))
    result = run(first_then_proxy(tmp_path, deploy=False, first_s=0), tmp_path)  # its Deployment is never applied
    assert result.phase == "Succeeded", result.output
    engine_supply.program("litellm", lambda: "", "test")  # its check, waited for
    assert order.read_text() == "checked after the first task\n"


def test_a_run_whose_engine_cannot_be_installed_stops_before_it_trains(
    tmp_path: Path, engines_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    """An empty cache and no index to install from: one line, and no half-made virtualenv left."""
    for name, value in {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": "", "PIP_CONFIG_FILE": os.devnull}.items():
        monkeypatch.setenv(name, value)  # the installer's, which runs in the executor's process
    result = run(first_then_proxy(tmp_path, deploy=True), tmp_path)
    assert result.phase == "Failed"
    assert result.message.startswith(
        "engine error: installing the LiteLLM proxy (litellm 1.110.2, ~530 MB) failed (pip exit 1): ERROR: "
    )
    assert not (tmp_path / "first").exists()
    assert [p.name for p in engines_dir.iterdir() if p.is_dir()] == []


def test_a_second_run_waits_for_the_fleet_the_first_holds_in_its_state_folder_and_says_which(tmp_path: Path):
    """A second run's proxy removed the first's routes file mid-canary and took its public name (error_rate 1.0)."""
    state = tmp_path / "state"
    first = LocalFleet(state, state / "runs" / "llama-lora-first", tmp_path)
    second = LocalFleet(state, state / "runs" / "llama-lora-second", tmp_path)
    config_map = serving.proxy_config_map(CFG)
    first.apply(config_map, "proxy-config", lambda: "")
    applied_second: list[str] = []
    waiting = threading.Thread(
        target=lambda: applied_second.append(second.apply(config_map, "proxy-config", lambda: ""))
    )
    waiting.start()
    waiting.join(3)
    assert waiting.is_alive() and applied_second == []  # waits while the first run's fleet lives
    holder = (state / "fleets" / "llama-lora.lock").read_text()
    assert holder.startswith("run llama-lora-first (pid ") and holder.endswith(f"state folder {state})")
    first.stop()  # the first run ends
    waiting.join(30)
    assert applied_second and applied_second[0].startswith("ConfigMap llama-lora-proxy")
    second.stop()


def test_a_held_lock_names_its_holder_a_stopped_run_stops_waiting_and_sigkill_frees_it(
    tmp_path: Path, engines_dir: Path
):
    """One run's local vLLM engines per machine, across runs and state folders (it was checked within a run only)."""
    said: list[str] = []
    code = (
        "import sys, time; from pathlib import Path; from eksflow.llm.serving.fleet_locks import FleetLocks\n"
        "locks = FleetLocks(Path(sys.argv[1]), Path(sys.argv[1]) / 'runs' / 'llama-lora-abcde', print)\n"
        "locks.engine('vllm', lambda: ''); print('held', flush=True); time.sleep(300)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "a")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        locks = FleetLocks(tmp_path / "b", tmp_path / "b" / "runs" / "llama-lora-fghij", said.append)
        stopping = iter(["", "interrupted"])
        with pytest.raises(FleetError, match=r"vllm: interrupted while waiting for this machine's local vLLM engines"):
            locks.engine("vllm", lambda: next(stopping))
        assert said == [
            f"vllm: waits for run llama-lora-abcde (pid {holder.pid}, state folder {tmp_path / 'a'}) to end: it holds "
            f"this machine's local vLLM engines ({engines_dir / 'local-vllm.lock'})"
        ]
        holder.kill()  # SIGKILL: no code of its runs, the kernel lets go of its lock
        holder.wait()
        locks.engine("vllm", lambda: "")
        locks.release()
    finally:
        holder.kill()
        holder.wait()


def test_a_deleted_deployment_is_stopped_and_leaves_its_service_and_a_missing_one_is_no_error(
    tmp_path: Path, engines_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    """The proxy's pod (a small HTTP server as its program) gets SIGTERM from the delete, before the run ends.

    It may route to the run's engine ports, none started yet (engine_ports.py), and to nothing else.
    """
    mark = tmp_path / "terminated"
    serve = (
        "import http.server, signal\n"
        "if '--version' in sys.argv: sys.exit(0)\n"
        f"open({str(tmp_path / 'upstreams')!r}, 'w').write(os.environ['EKSFLOW_UPSTREAMS'])\n"
        f"signal.signal(signal.SIGTERM, lambda *_: (open({str(mark)!r}, 'w').close(), sys.exit(0)))\n"
        "port = int(next(a.split('=')[1] for a in sys.argv if a.startswith('--port=')))\n"
        "class Live(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self): self.send_response(200); self.end_headers()\n"
        "http.server.HTTPServer(('127.0.0.1', port), Live).serve_forever()"
    )
    monkeypatch.setenv("EKSFLOW_LITELLM", str(fake_litellm(tmp_path, serve)))
    config_map, proxy, service, _ = serving.proxy_objects(CFG)
    engine = serving.vllm_deployment(CFG, "llama-lora-vllm-never", "/fsx/models/m")  # never applied in this run
    stopped = container("stopped", "import os, sys; sys.exit(not os.path.exists(sys.argv[1]))", str(mark))
    manifest = workflow(
        [
            task("proxy-config", "proxy-config"),
            task("proxy", "proxy", "proxy-config"),
            task("proxy-service", "proxy-service", "proxy"),
            task("delete-proxy", "delete-proxy", "proxy-service"),
            task("stopped", "stopped", "delete-proxy"),
            task("delete-engine", "delete-engine", "stopped"),
            task("delete-service", "delete-service", "stopped"),
        ],
        [
            applied("proxy-config", config_map),
            applied("proxy", proxy),
            applied("proxy-service", service),
            deleted("delete-proxy", proxy),
            stopped,
            deleted("delete-engine", engine),
            deleted("delete-service", service),
        ],
    )
    result = run(manifest, tmp_path)
    assert result.phase == "Succeeded", result.output
    assert result.nodes["delete-proxy"].message == "Deployment llama-lora-proxy: deleted, its litellm pod(s) stopped"
    assert result.nodes["delete-engine"].message == (
        "Deployment llama-lora-vllm-never: not found in this run, nothing to delete (Argo deletes with "
        "--ignore-not-found)"
    )
    assert result.nodes["delete-service"].message == "Service llama-lora-proxy: deleted, its address closed"
    endpoints = json.loads((result.run_dir / "fleet" / "endpoints" / "llama-lora-proxy.json").read_text())
    assert endpoints["items"] == []  # the proxy's pod left it, then the Service went
    origin, ports = (tmp_path / "upstreams").read_text().split(":(?:")  # the two engine ports of the run, only
    assert origin == re.escape("http://127.0.0.1") and re.fullmatch(r"\d+\|\d+\)", ports)
