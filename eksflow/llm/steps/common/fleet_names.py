"""The names and in-cluster addresses of a pipeline's vLLM fleets: one per base model, one per whole-model version.

Every fleet is `<pipeline>-vllm-<8 hex>`, so one pattern (fleet_addresses) matches every fleet of a pipeline: the
proxy sends requests, and the vLLM key, to addresses of that form only.
"""

from __future__ import annotations

import hashlib
import re


def fleet_name(pipeline: str, base_model: str, chat_template_sha256: str = "") -> str:
    """`<pipeline>-vllm-<8 hex>`: stable for a base model, different for another (a new Deployment).

    An engine applies one chat template to every request: a base model asked through train.chat_template's file
    is served by a fleet of its own, named by both.
    """
    served = f"{base_model}\0{chat_template_sha256}" if chat_template_sha256 else base_model
    return f"{pipeline}-vllm-{hashlib.sha256(served.encode()).hexdigest()[:8]}"


def service_url(name: str, namespace: str, port: int) -> str:
    """The in-cluster address of Service `name`."""
    return f"http://{name}.{namespace}.svc.cluster.local:{port}"


def fleet_addresses(pipeline: str, namespace: str, port: int) -> str:
    """A regular expression matching the address of every fleet of `pipeline`: where its proxy may send requests."""
    any_fleet = re.escape(f"{pipeline}-vllm-") + "[0-9a-f]{8}"  # fleet_name's form, for any base model
    return re.escape(service_url("\0", namespace, port)).replace(re.escape("\0"), any_fleet)
