"""The serving fleet's NetworkPolicies: vLLM admits only its proxy and the rollout's steps, the proxy only its clients.

Ingress only (egress stays open: the proxy reaches the fleets, vLLM nothing it lacks). They come first in
serving.yaml, in place before the pods they guard; the rollout applies them beside the Deployments (apply_order.py).
The local fleet records them, unenforced (eksflow/llm/serving/local_fleet.py).
"""

from __future__ import annotations

from typing import Any

from eksflow.llm.serving.objects import ROLLOUT_LABEL, ServingConfig, object_labels, proxy_name
from eksflow.names import PIPELINE_LABEL


def client_label(cfg: ServingConfig) -> str:
    """The label (value "true") a pod carries to reach the pipeline's proxy (a key per pipeline: clients of many)."""
    return f"eksflow.dev/{cfg.name}-client"


def _ingress_only_from(
    cfg: ServingConfig, name: str, component: str, pods: dict[str, str], port: int, sources: list[dict[str, str]]
) -> dict[str, Any]:
    """A NetworkPolicy: `pods` accept TCP on `port` from pods of the namespace matching one of `sources`, only."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "labels": object_labels(cfg, component, name)},
        "spec": {
            "podSelector": {"matchLabels": pods},
            "policyTypes": ["Ingress"],  # egress stays open: the proxy reaches the fleets, vLLM nothing it lacks
            "ingress": [
                {
                    "from": [{"podSelector": {"matchLabels": dict(source)}} for source in sources],
                    "ports": [{"protocol": "TCP", "port": port}],
                }
            ],
        },
    }


def vllm_network_policy(cfg: ServingConfig) -> dict[str, Any]:
    """Every vLLM pod of the pipeline (all its fleets) admits only its proxy's pods and its rollout steps' pods.

    The kubelet's probes are not pod traffic (the readiness probe runs in the pod; liveness comes from the node).
    """
    rollout_steps = {ROLLOUT_LABEL: cfg.name}
    vllm_pods = {"app.kubernetes.io/name": "vllm", PIPELINE_LABEL: cfg.name}
    proxy_pods = {"app.kubernetes.io/instance": proxy_name(cfg)}
    name = f"{cfg.name}-vllm"
    return _ingress_only_from(cfg, name, "vllm", vllm_pods, cfg.serving.port, [proxy_pods, rollout_steps])


def proxy_network_policy(cfg: ServingConfig) -> dict[str, Any]:
    """The proxy's pods admit only its clients (`client_label`) and the pipeline's rollout steps."""
    name = proxy_name(cfg)
    sources = [{client_label(cfg): "true"}, {ROLLOUT_LABEL: cfg.name}]
    pods = {"app.kubernetes.io/instance": name}
    return _ingress_only_from(cfg, name, "litellm", pods, cfg.serving.proxy_port, sources)


def network_policies(cfg: ServingConfig) -> list[dict[str, Any]]:
    """The fleet's and the proxy's NetworkPolicies (first in serving.yaml: in place before the pods they guard)."""
    return [vllm_network_policy(cfg), proxy_network_policy(cfg)]
