"""The Slinky objects `cluster.launcher: slurm` trains on (Slurm on EKS), for GitOps: `make templates` writes them.

    python -m pipelines.slinky [--set k=v ...] -o workflow-templates/slinky.yaml   # the flagship's config

Slinky's slurm-operator (slinky.slurm.net/v1beta1, Slurm 25.x) runs slurmctld from a Controller an operator
installs once (its Helm chart); these objects add what the training job needs next to it:

    NodeSet   the training partition: `cluster.nodes` slurmd pods on the profile's instance type (its node selector,
              tolerations, GPUs, EFA devices and /dev/shm), FSx mounted where the steps expect it, the train
              image as the slurmd container (it must carry slurmd: the job's tasks run inside it). The partition
              is named after the NodeSet (`cluster.slurm.partition`, else `<pipeline>-train`, then the cluster's
              default partition, where the Slurm task submits when none is configured). The FSx claim it mounts
              must exist in the Slurm namespace too: a second PersistentVolume on the same FSx file system.
    RestApi   slurmrestd for the Controller: what the workflow's Slurm task submits to (`cluster.slurm.url`).
    Token     a JWT for `cluster.slurm.user`, kept fresh by the operator in the Secret the Slurm task mounts
              (`cluster.slurm.token_secret`, key `token`), in the workflow's namespace; it is signed with the
              Controller's JWT key (the Helm chart's `<release>-auth-jwths256`, key jwt_hs256.key), which must be
              readable in that namespace too.

Every value comes from the validated config (names and numbers); nothing a run or a user passes at run time.
"""

from __future__ import annotations

from typing import Any

from eksflow import profiles
from eksflow.cluster import cluster_of
from eksflow.config import PipelineConfig
from eksflow.names import pipeline_labels

API_VERSION = "slinky.slurm.net/v1beta1"
SLURMRESTD_PORT = 6820
JWT_KEY = ("auth-jwths256", "jwt_hs256.key")  # the Helm chart's Secret suffix and key for the JWT signing key


def partition(cfg: PipelineConfig) -> str:
    """The training partition: the configured one, else the NodeSet's own name."""
    return cluster_of(cfg).slurm.partition or f"{cfg.name}-train"


def nodeset(cfg: PipelineConfig) -> dict[str, Any]:
    """The training partition's slurmd pods, one per node, wired like every training pod of the profile."""
    cluster = cluster_of(cfg)
    profile = profiles.profile_for(cluster.instance_type)
    pod: dict[str, Any] = {
        "nodeSelector": profiles.node_selector(profile, spot=cluster.spot, zone=cluster.zone),
        "volumes": profiles.volumes(profile, cfg.storage.fsx_claim),
        "serviceAccountName": cfg.service_account,
    }
    if tolerations := profiles.tolerations(profile):
        pod["tolerations"] = tolerations
    return {
        "apiVersion": API_VERSION,
        "kind": "NodeSet",
        "metadata": {
            "name": partition(cfg),
            "namespace": cluster.slurm.slurm_namespace,
            "labels": pipeline_labels(cfg.name),
        },
        "spec": {
            "controllerRef": {"name": cluster.slurm.controller},
            "replicas": cluster.nodes,
            # Without a configured partition the Slurm task submits to the cluster's default: make it this one.
            "partition": {"enabled": True, **({} if cluster.slurm.partition else {"config": "Default=YES"})},
            "slurmd": {
                "image": cluster.image,
                "env": profiles.env(profile),
                "resources": profiles.resources(profile),
                "volumeMounts": profiles.volume_mounts(profile, cfg.storage.fsx_mount),
            },
            "template": {"metadata": {"labels": pipeline_labels(cfg.name)}, "spec": pod},
        },
    }


def restapi(cfg: PipelineConfig) -> dict[str, Any]:
    """The Controller's slurmrestd (JWT authentication is the operator's default)."""
    slurm = cluster_of(cfg).slurm
    return {
        "apiVersion": API_VERSION,
        "kind": "RestApi",
        "metadata": {"name": slurm.controller, "namespace": slurm.slurm_namespace},
        "spec": {"controllerRef": {"name": slurm.controller}, "replicas": 1},
    }


def token(cfg: PipelineConfig) -> dict[str, Any]:
    """The JWT Secret the workflow's Slurm task mounts, refreshed by the operator before it expires."""
    slurm = cluster_of(cfg).slurm
    return {
        "apiVersion": API_VERSION,
        "kind": "Token",
        "metadata": {"name": slurm.token_secret, "namespace": cfg.namespace},
        "spec": {
            "username": slurm.user,
            "lifetime": "24h",
            "refresh": True,
            "jwtKeyRef": {"name": f"{slurm.controller}-{JWT_KEY[0]}", "key": JWT_KEY[1]},
            "secretRef": {"name": slurm.token_secret, "key": "token"},
        },
    }


def objects(cfg: PipelineConfig) -> list[dict[str, Any]]:
    """Everything the Slurm launcher needs beside Slinky's Controller, in apply order."""
    return [restapi(cfg), nodeset(cfg), token(cfg)]
