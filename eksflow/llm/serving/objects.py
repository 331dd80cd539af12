"""The serving fleet as Kubernetes objects: vLLM (per base model) and the LiteLLM proxy (per pipeline).

Plain dicts from pure functions, validated strictly with kubernetes-validate by the contract tests. The workflow
applies them with Argo resource templates (action apply, no owner reference: the fleet outlives the workflow);
`make templates` writes them to workflow-templates/serving.yaml for GitOps; the local executor runs the same
objects as local processes for the run's lifetime (eksflow/llm/serving/local_fleet.py).

    <pipeline>-vllm-<8 hex>   Deployment + Service + PodDisruptionBudget: one vLLM engine per base model (the
                              base model folder from FSx; every pod resolves the adapters published to the FSx
                              adapter folder by name: eksflow/llm/steps/common/adapters.py), a readiness probe that
                              proves generation, the inference profile's GPUs, tolerations, /dev/shm
    <pipeline>-proxy          ConfigMap (LiteLLM's config and the routes callback) + Deployment + Service +
                              PodDisruptionBudget: the public model name, routed by weight across the two slots
                              by the routes file on FSx (mounted read-only: eksflow/llm/steps/common/litellm_proxy.py),
                              to the pipeline's fleet Services only; a pod is ready once the file routes the name
    <pipeline>-vllm, <pipeline>-proxy   NetworkPolicies (ingress): vLLM pods admit only the proxy's pods and the
                              workflow's rollout steps (label eksflow.dev/rollout=<pipeline>, set on the steps that
                              mount the serving Secret); the proxy admits those steps and its clients, pods labelled
                              eksflow.dev/<pipeline>-client=true. Enforced by the cluster's CNI (VPC CNI with network
                              policy enabled, Calico, Cilium); without one they are inert and the keys still guard

Keys come from one Secret (serving.secret) that an operator creates once, never from a parameter:
    kubectl create secret generic eksflow-serving --from-literal=vllm-api-key=... \
        --from-literal=litellm-master-key=sk-...

ServingConfig refuses, when the config is loaded, what its fleet could not serve once trained (servable.py): a
LoRA rank the engine cannot load. A full fine-tune's whole model, and an adapter vLLM cannot serve as a LoRA (DoRA
among them, merged into its base when it registers), get a vLLM fleet of its own (the same Deployment, Service and
PodDisruptionBudget, named by the model: eksflow/llm/steps/common/served_models.py), serving the model under its
published name, without LoRA.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from eksflow import profiles
from eksflow.config import Image, image_field, pinned_image
from eksflow.llm.pipeline import LlmPipelineConfig, base_model_field
from eksflow.llm.serving import servable
from eksflow.llm.steps.canary import CanarySettings
from eksflow.llm.steps.common import litellm_proxy, litellm_routes, rollout, vllm
from eksflow.llm.steps.common.fleet_names import fleet_addresses
from eksflow.llm.steps.evaluate import EvaluateSettings
from eksflow.llm.steps.evaluate.metrics import configured, shown
from eksflow.names import PIPELINE_LABEL
from eksflow.profiles import Profile
from eksflow.runtime.args import Location, Settings

SECRETS_DIR = str(rollout.FleetArgs.model_fields["secrets_dir"].default)
CALLBACK_SOURCE = Path(litellm_routes.__file__)  # shipped in the proxy's ConfigMap, beside config.yaml
MODEL_LABEL = "eksflow.dev/model"  # the public model name a proxy routes (the local fleet reads it)
FLEET_LABEL = "eksflow.dev/fleet"
ROLLOUT_LABEL = "eksflow.dev/rollout"  # on the workflow's pods that talk to the fleet (value: the pipeline's name)
PROXY_CONFIG_DIR = "/etc/litellm"
COMPROMISED_LITELLM = ("1.82.7", "1.82.8")  # malicious releases on PyPI: never deploy them
# Inference nodes: CPU, g5, p4d and the inference-only L4 GPUs (g6); requests/limits come from the profile.
INFERENCE_PROFILES: dict[str, Profile] = {
    **{name: p for name, p in profiles.PROFILES.items() if p.kind == "cpu" or name.startswith(("g5.", "p4d."))},
    **profiles.SERVING_ONLY,
}


class ServingSettings(Settings):
    """The serving fleet (config section `serving`)."""

    instance_type: str = Field(
        "m6i.4xlarge", description="inference node; CPU runs the vllm-cpu image, g5/g6/p4d the CUDA one"
    )
    replicas: int = Field(
        2,
        ge=2,
        le=64,
        description="vLLM pods per fleet, at least 2 (the PDB keeps one through a drain); each serves every adapter",
    )
    image: Image = image_field("ghcr.io/eksflow/serve:0.1.0", "vLLM on GPUs: FROM vllm/vllm-openai, pinned")
    cpu_image: Image = image_field("ghcr.io/eksflow/serve-cpu:0.1.0", "vLLM on CPU nodes: the vllm-cpu build")
    engine: vllm.EngineSettings = vllm.EngineSettings()
    port: int = Field(8000, ge=1, le=65535, description="vLLM Service port")
    proxy_port: int = Field(4000, ge=1, le=65535, description="LiteLLM proxy Service port")
    proxy_replicas: int = Field(2, ge=1, le=16, description="LiteLLM proxy pods (they share the database)")
    proxy_image: str = Field(
        "docker.litellm.ai/berriai/litellm-database:1.110.2",
        description="LiteLLM's own image (non-root since 1.90.6; no database used), pinned to a reviewed release",
    )
    secret: str = Field(
        "eksflow-serving",
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        description="Secret with vllm-api-key and litellm-master-key",
    )
    request_timeout_s: int = Field(120, ge=1, description="the proxy's timeout for one request to vLLM")

    @field_validator("instance_type")
    @classmethod
    def _known(cls, instance_type: str) -> str:
        if instance_type not in INFERENCE_PROFILES:
            raise ValueError(f"unknown inference instance type {instance_type!r}; known: {sorted(INFERENCE_PROFILES)}")
        return instance_type

    @field_validator("proxy_image")
    @classmethod
    def _reviewed(cls, image: str) -> str:
        pinned_image(image)
        if any(bad in image for bad in COMPROMISED_LITELLM):
            raise ValueError(f"LiteLLM {image!r} is a compromised release; use 1.110.2")
        return image


class ServingConfig(LlmPipelineConfig):
    """A pipeline that rolls its model out: the base model its fleet serves, the fleet, the canary.

    Where the pipeline also evaluates (a section of EvaluateSettings), the canary's task_metric must be one of
    its task_metrics: the canary compares the served answers' scores with the evaluation's, row by row. Every LoRA
    rank it trains (each LoraSettings section, e.g. train.lora.rank) must fit serving.engine.max_lora_rank.
    """

    base_model: Location = base_model_field()
    serving: ServingSettings = ServingSettings()
    canary: CanarySettings = CanarySettings()

    @model_validator(mode="after")
    def _canary_scores_an_evaluated_metric(self) -> ServingConfig:
        # The canary compares its scores of the served answers with evaluate's per-row scores of the same metric:
        # a metric evaluate does not score has no row to compare with, which the rollout would find after training.
        evaluated = [(key, section) for key, section in self if isinstance(section, EvaluateSettings)]
        problems = [_not_evaluated(self.canary.task_metric, section.task_metrics, key) for key, section in evaluated]
        if problem := next((p for p in problems if p), ""):
            # Raised as the field's own error is, so the one line names the key to fix: canary.task_metric.
            error = PydanticCustomError("value_error", "{problem}", {"problem": problem})
            details = InitErrorDetails(type=error, loc=("canary", "task_metric"), input=self.canary.task_metric)
            raise ValidationError.from_exception_data(type(self).__name__, [details])
        return self

    @model_validator(mode="after")
    def _servable(self) -> ServingConfig:
        servable.registered_kind(self)  # one kind: the rollout serves adapters or whole models
        servable.refuse_unservable_ranks(servable.lora_ranks(self), self.serving.engine.max_lora_rank)
        return self


def _not_evaluated(name: str, task_metrics: Sequence[str], section: str) -> str:
    """Why `canary.task_metric` names no metric of `<section>.task_metrics`; "" when it names one."""
    try:
        if configured(name, task_metrics) is not None:
            return ""
    except ValueError as err:  # a short name two of them share
        return str(err)
    return (
        f"{name!r} is none of {section}.task_metrics ({', '.join(shown(task_metrics))}): the canary compares its "
        f"scores of the served answers with evaluate's of the same metric; name one of them or add it there"
    )


def proxy_name(cfg: ServingConfig) -> str:
    """The LiteLLM proxy's Deployment and Service."""
    return f"{cfg.name}-proxy"


def proxy_url(cfg: ServingConfig) -> str:
    """The proxy's in-cluster address (the local executor maps it to 127.0.0.1)."""
    return f"http://{proxy_name(cfg)}.{cfg.namespace}.svc.cluster.local:{cfg.serving.proxy_port}"


def adapters_dir(cfg: ServingConfig) -> str:
    """The fleet's adapter folder on FSx: published adapters, resolved by name by every vLLM pod."""
    return f"{cfg.storage.fsx_mount}/serving/{cfg.model_name}/adapters"


def models_dir(cfg: ServingConfig) -> str:
    """The pipeline's model folder on FSx: published whole models, each loaded by a fleet of its own."""
    return f"{cfg.storage.fsx_mount}/serving/{cfg.model_name}/models"


def routes_file(cfg: ServingConfig) -> str:
    """The routes file on FSx: the rollout steps write it, every proxy pod routes by it."""
    return f"{cfg.storage.fsx_mount}/serving/{cfg.model_name}/routes.json"


def object_labels(cfg: ServingConfig, component: str, name: str) -> dict[str, str]:
    """The labels of a fleet object: its component and name, eksflow's, the public model name and the pipeline."""
    return {
        "app.kubernetes.io/name": component,
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/part-of": "eksflow",
        MODEL_LABEL: cfg.model_name,
        PIPELINE_LABEL: cfg.name,
    }


def _secret_env(cfg: ServingConfig, name: str, key: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": cfg.serving.secret, "key": key}}}


def _security(profile: Profile) -> dict[str, Any]:
    return {**profiles.container_security(profile), "seccompProfile": {"type": "RuntimeDefault"}}


def vllm_deployment(cfg: ServingConfig, fleet: str, model_dir: str, served_name: str = "") -> dict[str, Any]:
    """The vLLM engine on the inference profile: its model from FSx, ready when it generates.

    Without `served_name`, a base model's fleet: served as `<model>-base`, adapters resolved at run time from the
    adapter folder. With it, a whole model's own fleet (a full fine-tune: served_models.py), under that name.
    """
    profile = INFERENCE_PROFILES[cfg.serving.instance_type]
    gpus = profile.devices if profile.kind == "gpu" else 0
    settings = cfg.serving.engine
    base_name = served_name or f"{cfg.model_name}-base"
    resolved = "" if served_name else adapters_dir(cfg)
    engine_env = vllm.engine_env(settings, cpu=profile.kind == "cpu", adapters_dir=resolved)
    env = [{"name": k, "value": v} for k, v in sorted(engine_env.items())] + [
        _secret_env(cfg, litellm_proxy.VLLM_KEY_ENV, rollout.VLLM_KEY_FILE)
    ]
    probe = {"exec": {"command": ["python3", "-m", "eksflow.llm.steps.ready", f"--url=http://127.0.0.1:{cfg.serving.port}",
                                  f"--model={base_name}"]}}  # fmt: skip
    container = {
        "name": "vllm",
        "image": cfg.serving.image if gpus else cfg.serving.cpu_image,
        "command": ["python3", "-m", vllm.ENGINE_MODULE],
        "args": vllm.engine_args(model_dir, base_name, cfg.serving.port, settings, gpus=gpus, lora=not served_name),
        "env": env,
        "ports": [{"name": "http", "containerPort": cfg.serving.port}],
        "resources": profiles.resources(profile),
        "volumeMounts": profiles.volume_mounts(profile, cfg.storage.fsx_mount),
        # Loading weights takes minutes: the startup probe allows 20, then readiness is a real generation (a
        # healthy /health with broken generation is no reason to send traffic) and liveness the server itself.
        "startupProbe": {**copy.deepcopy(probe), "periodSeconds": 10, "timeoutSeconds": 60, "failureThreshold": 120},
        "readinessProbe": {**copy.deepcopy(probe), "periodSeconds": 15, "timeoutSeconds": 60, "failureThreshold": 3},
        "livenessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 20, "failureThreshold": 3},
        "securityContext": _security(profile),
    }
    pod: dict[str, Any] = {
        "securityContext": profiles.pod_security(),
        "nodeSelector": profiles.node_selector(profile, spot=False, zone=""),
        "terminationGracePeriodSeconds": 60,  # requests in flight finish before the engine stops
        "containers": [container],
        "volumes": profiles.volumes(profile, cfg.storage.fsx_claim),
    }
    if tolerations := profiles.tolerations(profile):
        pod["tolerations"] = tolerations
    labels = {**object_labels(cfg, "vllm", fleet), FLEET_LABEL: fleet}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": fleet, "labels": dict(labels)},  # copies: rendered YAML gets no anchors
        "spec": {
            "replicas": cfg.serving.replicas,
            "selector": {"matchLabels": {FLEET_LABEL: fleet}},
            # A new pod must be ready (generating) before an old one goes: no capacity dip during an update.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "template": {"metadata": {"labels": labels}, "spec": pod},
        },
    }


def service(cfg: ServingConfig, name: str, component: str, port: int, selector: dict[str, str]) -> dict[str, Any]:
    """A ClusterIP Service in front of a Deployment's pods."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": object_labels(cfg, component, name)},
        "spec": {
            "type": "ClusterIP",
            "selector": selector,
            "ports": [{"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def vllm_service(cfg: ServingConfig, fleet: str) -> dict[str, Any]:
    """The fleet's address: what the proxy's slots and the rollout steps talk to."""
    return service(cfg, fleet, "vllm", cfg.serving.port, {FLEET_LABEL: fleet})


def disruption_budget(cfg: ServingConfig, name: str, component: str, replicas: int) -> dict[str, Any]:
    """Voluntary evictions (node drains, Karpenter consolidation) keep at least one pod, and all but one of many."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "labels": object_labels(cfg, component, name)},
        "spec": {
            "minAvailable": max(replicas - 1, 1),
            "selector": {"matchLabels": {"app.kubernetes.io/instance": name}},
        },
    }


def proxy_config_map(cfg: ServingConfig) -> dict[str, Any]:
    """The proxy's config.yaml (the two slots, the master key from the environment) and its routes callback."""
    config = litellm_proxy.proxy_config(cfg.model_name, cfg.serving.request_timeout_s)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": proxy_name(cfg), "labels": object_labels(cfg, "litellm", proxy_name(cfg))},
        "data": {
            "config.yaml": yaml.safe_dump(config, sort_keys=False),
            CALLBACK_SOURCE.name: CALLBACK_SOURCE.read_text(encoding="utf-8"),
        },
    }


def proxy_deployment(cfg: ServingConfig) -> dict[str, Any]:
    """LiteLLM's proxy: the public name by weight across the slots (routes file on FSx); master key from the Secret."""
    name = proxy_name(cfg)
    profile = INFERENCE_PROFILES["m6i.4xlarge"]  # CPU pods: the proxy only forwards requests
    labels = object_labels(cfg, "litellm", name)
    fsx = {"name": "fsx", "persistentVolumeClaim": {"claimName": cfg.storage.fsx_claim, "readOnly": True}}
    container = {
        "name": "litellm",
        "image": cfg.serving.proxy_image,
        "command": ["litellm"],
        "args": [f"--config={PROXY_CONFIG_DIR}/config.yaml", f"--port={cfg.serving.proxy_port}", "--num_workers=1"],
        "env": [
            _secret_env(cfg, "LITELLM_MASTER_KEY", rollout.MASTER_KEY_FILE),
            _secret_env(cfg, litellm_proxy.VLLM_KEY_ENV, rollout.VLLM_KEY_FILE),
            {"name": litellm_routes.ROUTES_FILE_ENV, "value": routes_file(cfg)},
            # The only engines it may send a request (and the vLLM key) to: this pipeline's fleet Services.
            {"name": litellm_routes.UPSTREAMS_ENV, "value": fleet_addresses(cfg.name, cfg.namespace, cfg.serving.port)},
            {"name": "LITELLM_LOCAL_MODEL_COST_MAP", "value": "True"},  # no price-list download at every start
        ],
        "ports": [{"name": "http", "containerPort": cfg.serving.proxy_port}],
        "resources": {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "2Gi"}},
        "volumeMounts": [
            {"name": "config", "mountPath": PROXY_CONFIG_DIR, "readOnly": True},
            {"name": "fsx", "mountPath": cfg.storage.fsx_mount, "readOnly": True},  # the routes file
        ],
        # Ready (a client of the Service) once LiteLLM answers and the routes file routes the public name to one
        # of the fleets: never on a routes file naming other addresses, nor before a rollout routed the name.
        "readinessProbe": {
            "exec": {
                "command": [
                    "python3",
                    f"{PROXY_CONFIG_DIR}/{CALLBACK_SOURCE.name}",
                    cfg.model_name,
                    str(cfg.serving.proxy_port),
                ]
            },
            "periodSeconds": 5,
            "timeoutSeconds": 5,
        },
        "livenessProbe": {"httpGet": {"path": "/health/liveliness", "port": "http"}, "periodSeconds": 20},
        "securityContext": _security(profile),
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": dict(labels)},
        "spec": {
            "replicas": cfg.serving.proxy_replicas,
            "selector": {"matchLabels": {"app.kubernetes.io/instance": name}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "securityContext": profiles.pod_security(),
                    "containers": [container],
                    "volumes": [{"name": "config", "configMap": {"name": name}}, fsx],
                },
            },
        },
    }


def proxy_objects(cfg: ServingConfig) -> list[dict[str, Any]]:
    """The proxy's four objects, in apply order."""
    name = proxy_name(cfg)
    return [
        proxy_config_map(cfg),
        proxy_deployment(cfg),
        service(cfg, name, "litellm", cfg.serving.proxy_port, {"app.kubernetes.io/instance": name}),
        disruption_budget(cfg, name, "litellm", cfg.serving.proxy_replicas),
    ]
