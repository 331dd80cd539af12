"""The serving fleet's objects validate strictly; the rollout tasks and their exit handler are in the workflow."""

import copy
import itertools
import re
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from eksflow.errors import ConfigError
from eksflow.llm.serving import objects as serving
from eksflow.llm.serving import policies
from eksflow.llm.serving.local_fleet import FLEET_KINDS
from eksflow.llm.serving.rollout import gitops_objects
from eksflow.llm.steps import (
    canary,
    finish_rollout,
    load_candidate,
    promote,
    serve_champion,
    shift_traffic,
)
from eksflow.llm.steps.common import fleet_names, litellm_routes, vllm_auth
from eksflow.local.manifest import parse_manifest
from eksflow.local.model import ResourceTemplate
from eksflow.pipeline import EXIT_HANDLER
from tests.argo_substitution import resource_objects
from tests.flagship import config, rendered

ROOT = Path(__file__).resolve().parents[2]
K8S = "1.32.0"
SAMPLE = {"fleet": "llama-lora-vllm-0123abcd", "model_dir": "/fsx/models/smollm2-135m-instruct"}
GPU_PROFILES = {"g5.xlarge": 1, "g6.xlarge": 1, "g6.12xlarge": 4, "p4d.24xlarge": 8}


def fleet_manifests(workflow):
    """The serving objects the workflow applies, with their input parameters filled like Argo would."""
    return resource_objects(workflow, lambda name: SAMPLE[name.removeprefix("inputs.parameters.")])


def load_config(_path=None, overrides=()):
    return config(overrides)


@pytest.fixture(scope="module")
def workflow():
    return rendered()


@pytest.mark.parametrize("overrides", [[], ["serving.instance_type=g6.12xlarge"]], ids=["cpu", "g6"])
def test_every_serving_object_is_strictly_valid(overrides):
    cfg = load_config(None, overrides)
    objects = [*fleet_manifests(rendered(overrides)).values(), *gitops_objects(cfg)]
    kinds = {"Deployment", "Service", "ConfigMap", "PodDisruptionBudget", "NetworkPolicy"}
    assert {o["kind"] for o in objects} == kinds
    for obj in objects:
        kubernetes_validate.validate(obj, K8S, strict=True)


def test_a_misspelled_field_is_rejected():
    (deployment, *_) = [o for o in gitops_objects(load_config()) if o["kind"] == "Deployment"]
    broken = copy.deepcopy(deployment)
    broken["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S, strict=True)


@pytest.mark.parametrize(("instance_type", "gpus"), sorted(GPU_PROFILES.items()))
def test_gpu_inference_profiles_request_gpus_tolerate_the_taint_and_mount_shm(instance_type, gpus):
    cfg = load_config(None, [f"serving.instance_type={instance_type}"])
    deployment = serving.vllm_deployment(cfg, SAMPLE["fleet"], SAMPLE["model_dir"])
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == cfg.serving.image
    assert container["resources"]["requests"]["nvidia.com/gpu"] == str(gpus)
    assert container["resources"]["limits"]["nvidia.com/gpu"] == str(gpus)
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert pod["nodeSelector"]["node.kubernetes.io/instance-type"] == instance_type
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    assert any(v["name"] == "dshm" and v["emptyDir"]["medium"] == "Memory" for v in pod["volumes"])
    assert f"--tensor-parallel-size={gpus}" in container["args"]
    assert "VLLM_CPU_KVCACHE_SPACE" not in {e["name"] for e in container["env"]}
    assert not any(a.startswith("--block-size") for a in container["args"])  # the GPU build's own default


def test_vllm_serves_the_base_model_from_fsx_with_runtime_adapters_and_a_generating_readiness_probe():
    cfg = load_config()
    deployment = serving.vllm_deployment(cfg, SAMPLE["fleet"], SAMPLE["model_dir"])
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]  # not the crashing CLI
    assert f"--model={SAMPLE['model_dir']}" in container["args"] and "--enable-lora" in container["args"]
    assert "--max-lora-rank=16" in container["args"] and "--max-loras=2" in container["args"]
    assert "--block-size=32" in container["args"]  # the CPU build: a chat prompt's shared prefix fills a block
    env = {e["name"]: e for e in container["env"]}
    # Every pod resolves the adapters published to the fleet's FSx folder by name (and loads no other plugin).
    assert env["VLLM_PLUGINS"]["value"] == "lora_filesystem_resolver"
    assert env["VLLM_LORA_RESOLVER_CACHE_DIR"]["value"] == "/fsx/serving/llama-lora/adapters"
    assert env["VLLM_LORA_RESOLVER_CACHE_DIR"]["value"].startswith(container["volumeMounts"][0]["mountPath"] + "/")
    assert env["VLLM_API_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "eksflow-serving", "key": "vllm-api-key"}
    # The proxy (LiteLLM's aiohttp pool: 15 s) closes an idle connection before the engine does, never reusing one
    # the engine is closing (vLLM's own 5 s gave the canary a 500 now and then)
    assert int(env["VLLM_HTTP_TIMEOUT_KEEP_ALIVE"]["value"]) > 15
    probe = container["readinessProbe"]["exec"]["command"]
    assert probe[:3] == ["python3", "-m", "eksflow.llm.steps.ready"]  # a real generation, not GET /health
    assert container["startupProbe"]["exec"]["command"] == probe
    assert {"name": "fsx", "mountPath": "/fsx"} in container["volumeMounts"]
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


def test_proxy_keys_come_from_the_secret_never_from_a_parameter(workflow):
    cfg = load_config()
    deployment = serving.proxy_deployment(cfg)
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["LITELLM_MASTER_KEY"] == {
        "name": "LITELLM_MASTER_KEY",
        "valueFrom": {"secretKeyRef": {"name": cfg.serving.secret, "key": "litellm-master-key"}},
    }
    assert "DATABASE_URL" not in env  # no database: the routes file on FSx is the one way to shift traffic
    assert env["LITELLM_LOCAL_MODEL_COST_MAP"]["value"] == "True"
    assert container["image"].endswith(":1.110.2")
    config = yaml.safe_load(serving.proxy_config_map(cfg)["data"]["config.yaml"])
    assert config["general_settings"] == {"master_key": "os.environ/LITELLM_MASTER_KEY"}
    assert config["router_settings"]["routing_strategy"] == "simple-shuffle"
    assert config["router_settings"]["num_retries"] == 0  # a failing candidate shows in the analysis
    parameters = {p["name"] for p in workflow["spec"]["arguments"]["parameters"]}
    assert not {p for p in parameters if re.search(r"(?i)key|secret|token|password|database", p)}


def test_every_proxy_pod_routes_by_the_routes_file_on_fsx_with_the_shipped_callback():
    cfg = load_config()
    pod = serving.proxy_deployment(cfg)["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["EKSFLOW_ROUTES_FILE"] == "/fsx/serving/llama-lora/routes.json"
    assert {"name": "fsx", "mountPath": "/fsx", "readOnly": True} in container["volumeMounts"]
    assert {"name": "fsx", "persistentVolumeClaim": {"claimName": cfg.storage.fsx_claim, "readOnly": True}} in pod[
        "volumes"
    ]
    data = serving.proxy_config_map(cfg)["data"]
    assert data["litellm_routes.py"] == Path(litellm_routes.__file__).read_text()  # the callback the tests run
    config = yaml.safe_load(data["config.yaml"])
    assert config["litellm_settings"]["callbacks"] == ["litellm_routes.handler"]
    assert [d["model_info"]["id"] for d in config["model_list"]] == ["llama-lora-blue", "llama-lora-green"]


def test_a_proxy_pod_routes_only_to_the_pipelines_fleets_and_is_ready_only_once_they_are_routed(workflow):
    cfg = load_config()
    (container,) = serving.proxy_deployment(cfg)["spec"]["template"]["spec"]["containers"]
    upstreams = re.compile(next(e["value"] for e in container["env"] if e["name"] == "EKSFLOW_UPSTREAMS"))
    for base_model in ("smollm2-135m-instruct", "s3://models/other"):
        fleet = fleet_names.fleet_name(cfg.name, base_model)
        assert upstreams.fullmatch(fleet_names.service_url(fleet, cfg.namespace, cfg.serving.port))
    assert not upstreams.fullmatch(f"http://{serving.proxy_name(cfg)}.{cfg.namespace}.svc.cluster.local:8000")
    # The pod's readiness probe is the shipped callback run as a script (stdlib only: the image's python3).
    assert container["readinessProbe"]["exec"]["command"] == [
        "python3", "/etc/litellm/litellm_routes.py", cfg.model_name, str(cfg.serving.proxy_port)
    ]  # fmt: skip
    templates = {t["name"]: t for t in workflow["spec"]["templates"]}
    # Not awaited: no pod is ready before serve-champion routes the name, and serve-champion runs after this task.
    assert "successCondition" not in templates["proxy"]["resource"]


@pytest.mark.parametrize("image", ["docker.litellm.ai/berriai/litellm-database:1.82.7", "litellm/litellm:latest"])
def test_compromised_or_floating_litellm_images_are_refused(image):
    with pytest.raises(ConfigError, match=r"serving\.proxy_image"):
        load_config(None, [f"serving.proxy_image={image}"])


def test_canary_tasks_and_the_exit_handler_are_in_the_workflow(workflow, argo_validator):
    errors = [e.message for e in argo_validator("Workflow").iter_errors(workflow)]
    assert errors == []
    dags = {t["name"]: t["dag"]["tasks"] for t in workflow["spec"]["templates"] if "dag" in t}
    tasks = {t["name"]: t for t in dags["main"]}
    chain = [
        "load-candidate",
        "analyze-0",  # pre-traffic: before any weight moves
        "shift-10",
        "analyze-10",
        "shift-50",
        "analyze-50",
        "shift-100",
        "analyze-100",
        "promote",
    ]
    for before, after in itertools.pairwise(chain):
        assert f"{before}.Succeeded" in tasks[after]["depends"].split(" && "), after
    assert {"register.Succeeded", "serve-champion.Succeeded"} <= set(tasks["load-candidate"]["depends"].split(" && "))
    assert tasks["prepare-fleet"]["when"] == tasks["train"]["when"]  # the fleet starts with training, not after
    assert tasks["prepare-fleet"]["depends"] == "stage-data.Succeeded"
    assert workflow["spec"]["onExit"] == EXIT_HANDLER
    # The exit handler rolls back first; the report follows whatever finish-rollout's outcome, so it shows it.
    exit_tasks = {t["name"]: t for t in dags[EXIT_HANDLER]}
    assert "finish-rollout.Failed" in exit_tasks["report"]["depends"]
    templates = {t["name"]: t for t in workflow["spec"]["templates"]}
    assert "{{workflow.status}}" in " ".join(templates["finish-rollout"]["container"]["args"])
    for name in ("vllm", "vllm-service", "proxy", "proxy-config"):
        assert templates[name]["resource"]["action"] == "apply"
        assert "setOwnerReference" not in templates[name]["resource"]  # the fleet outlives the workflow
    assert templates["vllm"]["resource"]["successCondition"] == "status.availableReplicas > 0"


@pytest.mark.parametrize(
    ("module", "name"),
    [
        (serve_champion, "serve-champion"),
        (load_candidate, "load-candidate"),
        (shift_traffic, "shift-10"),
        (canary, "analyze-10"),
        (promote, "promote"),
        (finish_rollout, "finish-rollout"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_rollout_step_args_parse_and_the_secret_is_mounted(workflow, module, name):
    (template,) = [t for t in workflow["spec"]["templates"] if t["name"] == name]
    samples = {"percent": "10", "model_version": "3", "evaluated_champion": "2", "vllm_url": "http://x:8000",
               "fleet": "llama-lora-vllm-0123abcd"}  # fmt: skip
    args = [
        re.sub(r"\{\{inputs\.parameters\.(\w+)\}\}", lambda m: samples.get(m.group(1), "/fsx/x"), a)
        .replace("{{workflow.name}}", "llama-lora-x1")
        .replace("{{workflow.status}}", "Failed")
        .replace("{{workflow.parameters.base_model}}", "smollm2-135m-instruct")
        for a in template["container"]["args"]
    ]
    parsed = module.Args.from_argv(args)
    assert parsed.secrets_dir == Path(serving.SECRETS_DIR)
    assert parsed.proxy_url == "http://llama-lora-proxy.argo.svc.cluster.local:4000"
    mounts = {m["mountPath"]: m for m in template["container"]["volumeMounts"]}
    assert mounts[serving.SECRETS_DIR]["readOnly"] is True
    assert template["volumes"] == [
        {"name": "eksflow-serving", "secret": {"secretName": "eksflow-serving", "defaultMode": 0o440}}
    ]
    assert [o["name"] for o in template["outputs"]["parameters"]] == list(module.Outputs.model_fields)


def test_the_local_executor_takes_the_serving_objects_as_fleet_objects(workflow):
    parsed = parse_manifest(workflow)
    assert parsed.on_exit is not None
    fleet = sorted(
        name
        for name, obj in resource_objects(workflow).items()
        if isinstance(parsed.templates[name], ResourceTemplate) and (obj["apiVersion"], obj["kind"]) in FLEET_KINDS
    )
    assert fleet == [
        "proxy", "proxy-config", "proxy-pdb", "proxy-policy", "proxy-service", "vllm", "vllm-pdb", "vllm-policy",
        "vllm-service",
    ]  # fmt: skip


def test_committed_serving_objects_match_a_fresh_render():
    committed = ROOT / "workflow-templates" / "serving.yaml"
    assert committed.is_file(), "run `make templates` and commit workflow-templates/"
    assert list(yaml.safe_load_all(committed.read_text())) == gitops_objects(load_config()), (
        "workflow-templates/serving.yaml is stale: run `make templates`"
    )


def _selects(selector, labels):
    return all(labels.get(k) == v for k, v in selector["matchLabels"].items())


def _admits(policy, labels, port):
    """Whether the policy lets a pod with `labels` (same namespace) reach `port` of the pods it selects."""
    return any(
        any(_selects(source["podSelector"], labels) for source in rule["from"])
        and any(p["port"] == port and p["protocol"] == "TCP" for p in rule["ports"])
        for rule in policy["spec"]["ingress"]
    )


def test_network_policies_admit_only_the_proxy_and_the_rollout_steps_to_vllm_and_only_clients_to_the_proxy(workflow):
    cfg = load_config()
    manifests = fleet_manifests(workflow)
    vllm_policy, proxy_policy = manifests["vllm-policy"], manifests["proxy-policy"]
    assert [vllm_policy, proxy_policy] == policies.network_policies(cfg)  # the rollout applies what GitOps gets
    pod_labels = {name: manifests[name]["spec"]["template"]["metadata"]["labels"] for name in ("vllm", "proxy")}
    port, proxy_port = cfg.serving.port, cfg.serving.proxy_port
    assert _selects(vllm_policy["spec"]["podSelector"], pod_labels["vllm"])
    assert not _selects(vllm_policy["spec"]["podSelector"], pod_labels["proxy"])
    assert _selects(proxy_policy["spec"]["podSelector"], pod_labels["proxy"])
    assert {p["policyTypes"] == ["Ingress"] for p in (vllm_policy["spec"], proxy_policy["spec"])} == {True}
    templates = {t["name"]: t for t in workflow["spec"]["templates"]}
    labels = {name: (t.get("metadata") or {}).get("labels") or {} for name, t in templates.items()}
    keyed = {
        name for name, t in templates.items() if any(v["name"] == cfg.serving.secret for v in t.get("volumes") or [])
    }
    assert keyed == {"serve-champion", "load-candidate", "analyze-0", "shift-10", "analyze-10", "shift-50",
                     "analyze-50", "shift-100", "analyze-100", "promote", "finish-rollout"}  # fmt: skip
    for name in keyed:  # the steps holding the keys reach both
        assert _admits(vllm_policy, labels[name], port) and _admits(proxy_policy, labels[name], proxy_port), name
    for name in set(templates) - keyed:  # training, evaluation, the report: neither
        assert not _admits(vllm_policy, labels[name], port) and not _admits(proxy_policy, labels[name], proxy_port)
    assert _admits(vllm_policy, pod_labels["proxy"], port)  # the proxy forwards to vLLM
    assert not _admits(vllm_policy, pod_labels["vllm"], port) and not _admits(
        proxy_policy, pod_labels["vllm"], proxy_port
    )
    client = {policies.client_label(cfg): "true"}
    assert _admits(proxy_policy, client, proxy_port) and not _admits(vllm_policy, client, port)  # clients: proxy only
    assert not _admits(vllm_policy, labels["serve-champion"], proxy_port)  # only the API port
    for name in ("vllm-policy", "proxy-policy"):
        assert templates[name]["resource"]["action"] == "apply" and "{{" not in templates[name]["resource"]["manifest"]
    depends = {
        t["name"]: t.get("depends", "")
        for t in next(t for t in workflow["spec"]["templates"] if t["name"] == "main")["dag"]["tasks"]
    }
    assert {"vllm-policy.Succeeded", "proxy-policy.Succeeded"} <= set(depends["serve-champion"].split(" && "))


def test_the_vllm_pods_probes_fit_the_key_on_every_route():
    cfg = load_config()
    (container,) = serving.vllm_deployment(cfg, SAMPLE["fleet"], SAMPLE["model_dir"])["spec"]["template"]["spec"][
        "containers"
    ]
    assert f"--middleware={vllm_auth.MIDDLEWARE}" in container["args"]
    assert not any("api-key" in a for a in container["args"])  # the key is in the env (secretKeyRef), never argv
    liveness = container["livenessProbe"]["httpGet"]
    assert ("GET", liveness["path"]) in vllm_auth.OPEN_ROUTES  # the kubelet sends no key
    assert container["readinessProbe"]["exec"]["command"][:3] == [
        "python3",
        "-m",
        "eksflow.llm.steps.ready",
    ]  # sends the key
    env = {e["name"]: e for e in container["env"]}
    assert env[vllm_auth.KEY_ENV]["valueFrom"]["secretKeyRef"]["name"] == cfg.serving.secret


def test_a_full_fine_tunes_rollout_serves_each_whole_model_on_a_fleet_of_its_own_and_deletes_the_one_left(
    argo_validator,
):
    """train.finetune=full: no base model fleet; publish-champion and publish-candidate name each whole model's own
    fleet, applied only when the version is one; promote's retired fleet and a rollback's discarded one are deleted."""
    workflow = rendered(["train.finetune=full"])
    assert [e.message for e in argo_validator("Workflow").iter_errors(workflow)] == []
    dags = {t["name"]: {task["name"]: task for task in t["dag"]["tasks"]} for t in workflow["spec"]["templates"]
            if "dag" in t}  # fmt: skip
    main, exit_tasks = dags["main"], dags[EXIT_HANDLER]
    assert not {"prepare-fleet", "vllm", "vllm-service"} & set(main)
    for role in ("champion", "candidate"):
        for obj in ("vllm", "vllm-service", "vllm-pdb"):
            assert main[f"{role}-{obj}"]["when"] == f"{{{{tasks.publish-{role}.outputs.parameters.own_fleet}}}} == true"
    # The step after a fleet that was not applied (an adapter champion, or none) runs all the same
    assert "champion-vllm.Skipped" in main["serve-champion"]["depends"]
    assert {"publish-candidate.Succeeded", "candidate-vllm.Skipped"} <= set(
        re.findall(r"[\w-]+\.\w+", main["load-candidate"]["depends"])
    )
    assert {"register.Succeeded", "serve-champion.Succeeded"} <= set(main["publish-candidate"]["depends"].split(" && "))
    templates = {t["name"]: t for t in workflow["spec"]["templates"]}
    for name, after, flag in [("retire", main, "promote.outputs.parameters.retires"),
                              ("discard", exit_tasks, "finish-rollout.outputs.parameters.discards")]:  # fmt: skip
        for kind in ("deployment", "service", "poddisruptionbudget"):
            assert after[f"{name}-{kind}"]["when"] == f"{{{{tasks.{flag}}}}} == true"
            assert templates[f"{name}-{kind}"]["resource"]["action"] == "delete"
    samples = {"fleet": "llama-lora-vllm-0123abcd", "model_dir": "/fsx/serving/m/models/llama-lora-v2-0123abcd",
               "served_name": "llama-lora-v2-0123abcd", "retired": "llama-lora-vllm-89abcdef",
               "discarded": "llama-lora-vllm-89abcdef"}  # fmt: skip
    made = resource_objects(workflow, lambda name: samples[name.removeprefix("inputs.parameters.")])
    for obj in made.values():
        kubernetes_validate.validate(obj, K8S, strict=True)
    (container,) = made["candidate-vllm"]["spec"]["template"]["spec"]["containers"]
    assert "--served-model-name=llama-lora-v2-0123abcd" in container["args"]
    assert "--model=/fsx/serving/m/models/llama-lora-v2-0123abcd" in container["args"]
    assert not any(a.startswith(("--enable-lora", "--max-lora")) for a in container["args"])  # no adapters to serve
    assert "VLLM_PLUGINS" not in {e["name"] for e in container["env"]}
    assert made["retire-deployment"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                         "metadata": {"name": "llama-lora-vllm-89abcdef"}}  # fmt: skip
