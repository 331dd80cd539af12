"""The local fleet's bookkeeping: addresses mapped only where a whole value is one, objects it refuses, the ports of
a run's several engines, their cap and the machine's engine lock."""

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from eksflow.llm.serving import adopted_engine, fleet_pods, policies
from eksflow.llm.serving import objects as serving
from eksflow.llm.serving.engine_ports import MAX_ENGINES, EnginePorts
from eksflow.llm.serving.fleet_locks import FleetLocks
from eksflow.llm.serving.fleet_process import FleetProcess
from eksflow.llm.serving.local_fleet import FleetError, LocalFleet  # registers the fleet's kinds
from eksflow.local import resources
from tests.flagship import config


def load_config(_path=None, overrides=()):
    return config(overrides)


def running() -> str:
    return ""  # the run is not stopping


PROXY = "http://llama-lora-proxy.argo.svc.cluster.local:4000"


@pytest.fixture
def fleet(tmp_path):
    fleet = LocalFleet(tmp_path / "state", tmp_path / "run", tmp_path)
    cfg = load_config()
    for obj in serving.proxy_objects(cfg):
        if obj["kind"] != "Deployment":
            fleet.apply(obj, obj["kind"], running)
    # What a started proxy looks like to the fleet (no process: these tests only map addresses).
    labels = serving.proxy_deployment(cfg)["spec"]["template"]["metadata"]["labels"]
    fleet._processes["llama-lora-proxy"] = FleetProcess("llama-lora-proxy", "litellm", None, 41234, labels, tmp_path)
    yield fleet
    fleet.stop()  # lets go of its locks: one left held made the flagship's run, in another process, wait for ever


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (PROXY, "http://127.0.0.1:41234"),
        (f"{PROXY}/v1", "http://127.0.0.1:41234/v1"),
        ("http://llama-lora-proxy:4000", "http://127.0.0.1:41234"),
        ("http://llama-lora-proxy.argo.svc:4000", "http://127.0.0.1:41234"),
        ("http://llama-lora-proxy.argo.svc.cluster.local:4001", None),  # another port: not this Service
        ("http://llama-lora-proxy.example.com:4000", None),  # another domain
        ("http://other.argo.svc.cluster.local:4000", None),  # no such Service
        (f"see {PROXY} for details", None),  # free text is never rewritten
        ("/fsx/runs/x", None),
    ],
)
def test_only_a_whole_service_address_is_mapped(fleet, value, expected):
    assert fleet.local_value(value) == (value if expected is None else expected)


def test_argv_items_map_their_value_only(fleet):
    argv = ["python", "-m", "eksflow.llm.steps.promote", f"--proxy-url={PROXY}", f"--note={PROXY} down", PROXY]
    assert fleet.local_argv(argv) == [
        *argv[:3],
        "--proxy-url=http://127.0.0.1:41234",
        argv[4],
        "http://127.0.0.1:41234",
    ]


def test_objects_without_a_process_say_what_they_are_here(fleet):
    cfg = load_config()
    pdb = serving.disruption_budget(cfg, "x", "vllm", 1)
    assert "nothing to protect" in fleet.apply(pdb, "pdb", running)
    assert fleet.task_env() == {}  # the steps get the routes file and the addresses as arguments


def test_a_gpu_deployment_is_refused_here_with_the_way_out(fleet):
    cfg = load_config(None, ["serving.instance_type=g5.xlarge"])
    deployment = serving.vllm_deployment(cfg, "f", "/fsx/models/m")
    with pytest.raises(FleetError, match=r"asks for 1 nvidia.com/gpu.*serving.instance_type=m6i.4xlarge") as caught:
        fleet.apply(deployment, "vllm", running)
    assert caught.value.retriable is False


def bound_by_another(port: int) -> bool:
    """Whether another socket can listen on 127.0.0.1:`port` now (what a stranger would need to stand behind it)."""
    with socket.socket() as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            other.bind(("127.0.0.1", port))
            other.listen(1)
        except OSError:
            return False
        return True


def test_the_proxy_may_reach_every_engine_port_of_the_run_and_nothing_else_and_each_is_held_till_its_engine():
    ports = EnginePorts()
    upstreams = re.compile(ports.upstreams())
    pool = [int(p) for p in re.findall(r"\d{4,5}", ports.upstreams())]
    assert len(pool) == MAX_ENGINES == 2
    others = ["http://127.0.0.1:1", "http://localhost:" + str(pool[0]), f"http://127.0.0.1:{pool[0]}0"]
    assert not any(upstreams.fullmatch(origin) for origin in others)
    assert not any(bound_by_another(port) for port in pool)  # held: no stranger can listen behind the proxy's list
    champion = ports.take("champion", "vllm")
    assert upstreams.fullmatch(f"http://127.0.0.1:{champion}")  # an engine started after the proxy is in its list
    assert bound_by_another(champion)  # let go for the engine to bind
    assert ports.take("champion", "vllm") == champion  # applied again: its own port
    candidate = ports.take("candidate", "vllm")
    assert {champion, candidate} == set(pool)
    with pytest.raises(FleetError) as refused:
        ports.take("third", "vllm-third")
    assert str(refused.value) == (
        "vllm-third: Deployment third would be vLLM engine 3 of this run; this machine runs at most 2 at once "
        '(candidate, champion run): delete one first (resource(..., action="delete")) or roll this out on a cluster'
    )
    assert refused.value.retriable is False
    assert ports.give_back("champion") == ""  # its engine ended: held again for the next one
    assert not bound_by_another(champion)
    assert ports.take("third", "vllm-third") == champion
    ports.close()


def vllm(name: str) -> dict:
    return serving.vllm_deployment(load_config(), name, "/fsx/models/m")


def test_a_third_engine_is_refused_before_waiting_for_the_machines_engines_and_a_deleted_one_frees_its_port(
    fleet, tmp_path
):
    engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    port = fleet._ports.take("champion", "vllm")  # what starting its engine takes (the process: a stand-in)
    fleet._processes["champion"] = FleetProcess("champion", "vllm", engine, port, {}, tmp_path)
    fleet._ports.take("candidate", "vllm")
    fleet._processes["candidate"] = FleetProcess("candidate", "vllm", None, 0, {}, tmp_path)
    waited = []
    with pytest.raises(FleetError, match="Deployment third would be vLLM engine 3 of this run"):
        fleet.apply(vllm("third"), "vllm", lambda: waited.append(1) or "stopped")
    assert waited == []  # refused at once: not after waiting for the machine's engines or the engine's install
    named = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "champion"}}
    assert fleet.delete(named, "retire") == "Deployment champion: deleted, its vllm pod(s) stopped"
    assert engine.poll() is not None  # SIGTERM, as stop() ends it
    assert fleet._ports.take("third", "vllm") == port


def test_the_run_takes_the_machines_engine_lock_once_for_all_its_engines(tmp_path, monkeypatch):
    monkeypatch.setenv("EKSFLOW_ENGINES_DIR", str(tmp_path / "engines"))
    locks = FleetLocks(tmp_path / "state", tmp_path / "run", print)
    locks.engine("champion", running)
    locks.engine("candidate", lambda: "stopped")  # a second take of its own lock would wait, and stop: it does not
    other = FleetLocks(tmp_path / "other", tmp_path / "other-run", print)
    with pytest.raises(FleetError, match="stopped while waiting for this machine's local vLLM engines"):
        other.engine("vllm", lambda: "stopped")  # another run's engines wait for this run's
    locks.release()
    other.engine("vllm", running)
    other.release()


def test_an_adopted_engine_is_adopted_by_one_deployment_of_the_run(fleet, tmp_path, monkeypatch):
    monkeypatch.setenv(adopted_engine.ADOPT_ENV, "http://127.0.0.1:9")
    fleet._processes["champion"] = FleetProcess("champion", "vllm", None, 9, {}, tmp_path)
    with pytest.raises(FleetError, match=r"EKSFLOW_VLLM_URL names one engine, which Deployment champion adopted"):
        fleet.apply(vllm("candidate"), "vllm", running)


def test_an_unknown_deployment_is_refused_before_the_run():
    deployment = serving.proxy_deployment(load_config())
    deployment["spec"]["template"]["spec"]["containers"][0]["command"] = ["nginx"]
    with pytest.raises(resources.ResourceError, match="only as a vLLM engine"):
        resources.describe(yaml.safe_dump(deployment), "proxy")


def test_the_proxy_runs_on_its_config_maps_files_unchanged(fleet):
    cfg = load_config()
    pod = serving.proxy_deployment(cfg)["spec"]["template"]["spec"]
    folder = fleet._inputs.write_config_maps(pod, "llama-lora-proxy")
    shipped = serving.proxy_config_map(cfg)["data"]
    assert sorted(p.name for p in folder.iterdir()) == sorted(shipped)  # config.yaml and the routes callback
    for name, text in shipped.items():
        assert (folder / name).read_text() == text  # what the cluster's pods get, byte for byte
    config = yaml.safe_load(shipped["config.yaml"])
    assert config["litellm_settings"]["callbacks"] == ["litellm_routes.handler"]
    assert "database_url" not in config["general_settings"]


def test_the_proxy_refuses_to_start_before_its_config_map(tmp_path):
    fleet = LocalFleet(tmp_path / "state", tmp_path / "run", tmp_path)
    pod = serving.proxy_deployment(load_config())["spec"]["template"]["spec"]
    with pytest.raises(FleetError, match="was not applied first"):
        fleet._inputs.write_config_maps(pod, "llama-lora-proxy")


def test_an_adopted_engine_shares_its_adapter_folder_with_the_run(tmp_path, monkeypatch):
    engine_folder = tmp_path / "engine-adapters"
    engine_folder.mkdir()
    (engine_folder / "llama-lora-v1-aaaaaaaa").mkdir()
    run_folder = tmp_path / "run" / "adapters"
    (run_folder / "llama-lora-v2-bbbbbbbb").mkdir(parents=True)  # published before the run adopted the engine
    monkeypatch.setenv(adopted_engine.ADOPT_ADAPTERS_ENV, str(engine_folder))
    adopted_engine.share_adapters(str(run_folder), "vllm")
    assert run_folder.is_symlink() and run_folder.resolve() == engine_folder.resolve()
    assert sorted(p.name for p in run_folder.iterdir()) == ["llama-lora-v1-aaaaaaaa", "llama-lora-v2-bbbbbbbb"]
    adopted_engine.share_adapters(str(run_folder), "vllm")  # a resumed run: already shared
    assert run_folder.resolve() == engine_folder.resolve()
    monkeypatch.delenv(adopted_engine.ADOPT_ADAPTERS_ENV)
    with pytest.raises(FleetError, match="EKSFLOW_VLLM_ADAPTERS"):
        adopted_engine.share_adapters(str(run_folder), "vllm")


@pytest.mark.parametrize("first", ["proxy", "vllm"])
def test_an_adopted_engines_key_reaches_the_proxy_whichever_deployment_comes_first(tmp_path, monkeypatch, first):
    """The engine's and the proxy's Deployments start in parallel: the proxy must get the adopted engine's key even
    when it is applied first (it once got a random key then, and every request through it was refused with 401)."""
    monkeypatch.setenv(adopted_engine.ADOPT_ENV, "http://127.0.0.1:9")
    monkeypatch.setenv(adopted_engine.ADOPT_KEY_ENV, "the-engines-own-key")
    cfg = load_config()
    containers = {
        "proxy": serving.proxy_deployment(cfg),
        "vllm": serving.vllm_deployment(cfg, "fleet", "/fsx/models/base"),
    }
    fleet = LocalFleet(tmp_path / "state", tmp_path / "run", tmp_path)
    order = [first, *(name for name in containers if name != first)]
    keys = {
        name: fleet._container_env(fleet_pods.container(containers[name], name), name)["VLLM_API_KEY"] for name in order
    }
    assert keys == {"proxy": "the-engines-own-key", "vllm": "the-engines-own-key"}


def test_a_resumed_run_applies_the_fleet_again_with_every_task_after_it():
    from eksflow.local.manifest import parse_manifest
    from eksflow.local.services import restarted
    from tests.flagship import rendered

    again = restarted(parse_manifest(rendered()))
    assert {"vllm", "proxy-config", "serve-champion", "load-candidate", "analyze-100", "promote"} <= again
    assert not again & {"champion", "stage-data", "train", "evaluate", "register", "prepare-fleet"}


def test_a_network_policy_is_recorded_with_a_note_that_the_cni_enforces_it(fleet, tmp_path):
    cfg = load_config()
    for policy in policies.network_policies(cfg):
        job = resources.describe(yaml.safe_dump(policy), "policy")  # a kind the local executor takes
        assert job.service_object == policy
        note = fleet.apply(policy, "policy", running)
        name = policy["metadata"]["name"]
        assert "not enforced here" in note and "CNI" in note
        assert fleet.policies[name] == policy
        assert note in (tmp_path / "run" / "logs" / f"networkpolicy-{name}.log").read_text()


FLAGSHIP = Path(__file__).resolve().parents[3] / "pipelines" / "llama_lora.py"


def run_flagship(state: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, str(FLAGSHIP), "run", "--state-dir", str(state)]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, check=False)


def test_an_engine_named_by_its_variable_must_exist_before_the_run_starts(tmp_path):
    env = {**os.environ, "EKSFLOW_LITELLM": str(tmp_path / "no-litellm"), "EKSFLOW_VLLM_URL": "http://127.0.0.1:9"}
    done = run_flagship(tmp_path / "state", env)
    assert done.returncode == 1
    assert done.stderr.strip() == (
        f"engine error: $EKSFLOW_LITELLM={tmp_path / 'no-litellm'}: no such file; unset it or name the LiteLLM proxy "
        "(litellm 1.110.2, ~530 MB)'s program"
    )
    assert not (tmp_path / "state" / "runs").exists()
