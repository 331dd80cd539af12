"""The fleet's objects as one ordered list, built from the config once: what the rollout applies, one task each.

    vllm, vllm-service, vllm-pdb                        after prepare-fleet (it names the fleet and its model folder)
    proxy-config ─▶ proxy ─▶ proxy-service ─▶ proxy-pdb  the ConfigMap before the proxy that mounts it
    vllm-policy, proxy-policy                           after prepare-fleet, with the Deployments they guard

A full fine-tune's rollout has no base model fleet: each whole-model version gets a fleet of its own
(engine_objects with its served name: `champion-vllm...`, `candidate-vllm...`), and FLEET_KINDS lists what deleting one
deletes (promote retires the former champion's, a rollback the candidate's).

The rollout (rollout.py) loops over the list; `make templates` writes the same manifests to serving.yaml. The
manifests come from objects.py and policies.py (the NetworkPolicies import objects.py, hence this third module).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from eksflow.llm.serving import objects, policies
from eksflow.llm.serving.objects import ServingConfig


@dataclass(frozen=True)
class FleetObject:
    """One serving object and the workflow task that applies it."""

    task: str
    manifest: dict[str, Any]
    # The task succeeds once a pod is available (its readiness probe generated), not once the object is applied.
    awaited: bool = False
    after: str = ""  # the task of the object it is applied after; "" = after prepare-fleet


def fleet_objects(cfg: ServingConfig, fleet: str, model_dir: str) -> list[FleetObject]:
    """The base model fleet `fleet` (serving `model_dir`), the proxy and the NetworkPolicies, in apply order."""
    return engine_objects(cfg, fleet, model_dir) + shared_objects(cfg)


def engine_objects(
    cfg: ServingConfig, fleet: str, model_dir: str, served_name: str = "", prefix: str = ""
) -> list[FleetObject]:
    """One vLLM fleet's Deployment, Service and PodDisruptionBudget, its tasks named `<prefix>-vllm...` when given.

    Without `served_name`, the base model's fleet (adapters resolved at run time); with it, a whole model's own.
    """
    task = f"{prefix}-vllm" if prefix else "vllm"
    return [
        FleetObject(task, objects.vllm_deployment(cfg, fleet, model_dir, served_name), awaited=True),
        FleetObject(f"{task}-service", objects.vllm_service(cfg, fleet)),
        FleetObject(f"{task}-pdb", objects.disruption_budget(cfg, fleet, "vllm", cfg.serving.replicas)),
    ]


def shared_objects(cfg: ServingConfig) -> list[FleetObject]:
    """The pipeline's proxy and the NetworkPolicies guarding every fleet of it, whichever models they serve."""
    config_map, proxy, proxy_service, proxy_pdb = objects.proxy_objects(cfg)
    vllm_policy, proxy_policy = policies.network_policies(cfg)
    return [
        FleetObject("proxy-config", config_map),
        # Not awaited: a proxy pod is ready only once the routes file routes the public name, which serve-champion
        # (or, without a champion, the first shift) does and then waits for through the proxy's Service.
        FleetObject("proxy", proxy, after="proxy-config"),
        FleetObject("proxy-service", proxy_service, after="proxy"),
        FleetObject("proxy-pdb", proxy_pdb, after="proxy-service"),
        FleetObject("vllm-policy", vllm_policy),
        FleetObject("proxy-policy", proxy_policy),
    ]


# What deleting one vLLM fleet deletes (its objects are named as the fleet): (apiVersion, kind)
FLEET_KINDS = (("apps/v1", "Deployment"), ("v1", "Service"), ("policy/v1", "PodDisruptionBudget"))
