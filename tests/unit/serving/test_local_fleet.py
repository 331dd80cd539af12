"""The local fleet's bookkeeping: addresses mapped only where a whole value is one, objects it refuses."""

import pytest
import yaml

from eksflow.local import resources
from pipelines.serving import objects as serving
from pipelines.serving.local_fleet import FleetError, LocalFleet, _Process  # registers the fleet's kinds
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
    fleet._processes["llama-lora-proxy"] = _Process("llama-lora-proxy", "litellm", None, 41234, labels, tmp_path)
    return fleet


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
    argv = ["python", "-m", "steps.promote", f"--proxy-url={PROXY}", f"--note={PROXY} down", PROXY]
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
    assert fleet.task_env() == {"EKSFLOW_ROUTES_FILE": str(fleet.routes_file)}


def test_a_gpu_deployment_is_refused_here_with_the_way_out(fleet):
    cfg = load_config(None, ["serving.instance_type=g5.xlarge"])
    deployment = serving.vllm_deployment(cfg, "f", "/fsx/models/m")
    with pytest.raises(FleetError, match=r"asks for 1 nvidia.com/gpu.*serving.instance_type=m6i.4xlarge") as caught:
        fleet.apply(deployment, "vllm", running)
    assert caught.value.retriable is False


def test_a_second_engine_in_one_run_is_refused(fleet, tmp_path):
    fleet._processes["engine-a"] = _Process("engine-a", "vllm", None, 1, {}, tmp_path)
    deployment = serving.vllm_deployment(load_config(), "engine-b", "/fsx/models/m")
    with pytest.raises(FleetError, match="two engines stall each other"):
        fleet.apply(deployment, "vllm", running)


def test_an_unknown_deployment_is_refused_before_the_run():
    deployment = serving.proxy_deployment(load_config())
    deployment["spec"]["template"]["spec"]["containers"][0]["command"] = ["nginx"]
    with pytest.raises(resources.ResourceError, match="only as a vLLM engine"):
        resources.describe(yaml.safe_dump(deployment), "proxy")


def test_the_proxy_without_a_database_declares_the_slots_on_the_runs_engine(fleet, tmp_path):
    fleet._engine_port = 45678
    folder = fleet._proxy_folder("llama-lora-proxy", {})
    config = yaml.safe_load((folder / "config.yaml").read_text())
    assert [d["model_info"]["id"] for d in config["model_list"]] == ["llama-lora-blue", "llama-lora-green"]
    assert {d["litellm_params"]["api_base"] for d in config["model_list"]} == {"http://127.0.0.1:45678/v1"}
    assert "database_url" not in config["general_settings"]
    assert config["litellm_settings"]["callbacks"] == ["litellm_routes.handler"]
    assert (folder / "litellm_routes.py").is_file()


def test_a_resumed_run_applies_the_fleet_again_with_every_task_after_it():
    from eksflow.local.manifest import parse_manifest
    from eksflow.local.services import restarted
    from tests.flagship import rendered

    again = restarted(parse_manifest(rendered()))
    assert {"vllm", "proxy-config", "serve-champion", "load-candidate", "analyze-100", "promote"} <= again
    assert not again & {"champion", "stage-data", "train", "evaluate", "register", "prepare-fleet"}


def test_a_network_policy_is_recorded_with_a_note_that_the_cni_enforces_it(fleet, tmp_path):
    cfg = load_config()
    for policy in serving.network_policies(cfg):
        job = resources.describe(yaml.safe_dump(policy), "policy")  # a kind the local executor takes
        assert job.service_object == policy
        note = fleet.apply(policy, "policy", running)
        name = policy["metadata"]["name"]
        assert "not enforced here" in note and "CNI" in note
        assert fleet.policies[name] == policy
        assert note in (tmp_path / "run" / "logs" / f"fleet-{name}.log").read_text()
