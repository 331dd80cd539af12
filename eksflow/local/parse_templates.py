"""Reading one template of the manifest: container, resource or DAG parts, retryStrategy, memoize, volumes."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from eksflow.local import expression_tags, node, resources, services
from eksflow.local.errors import LocalExecutorError
from eksflow.local.fields import FieldReader, duration_s, go_duration_s
from eksflow.local.model import (
    ContainerTemplate,
    Input,
    Memoize,
    Mount,
    Output,
    ResourceTemplate,
    Retry,
)
from eksflow.local.paths import path_rules
from eksflow.local.substitution import PLACEHOLDER
from eksflow.manifests import REFERENCE
from eksflow.names import dns_label_problem, dns_subdomain_problem

RETRY_POLICIES = ("Always", "OnFailure", "OnError", "OnTransientError")
# create and apply make the object run; delete ends what a run service runs (get and patch act on a live object)
RESOURCE_ACTIONS = ("create", "apply", "delete")
MEMO_KEY = re.compile(r"[a-zA-Z0-9][-a-zA-Z0-9]*")  # Argo's cacheKeyRegex: a ConfigMap key it accepts

# Keys that only shape scheduling or security on a cluster; a local process has nothing to apply them to.
CLUSTER_ONLY_TEMPLATE = frozenset({
    "affinity", "archiveLocation", "automountServiceAccountToken", "executor", "hostAliases", "metrics",
    "nodeSelector", "podSpecPatch", "priority", "priorityClassName", "schedulerName", "securityContext",
    "serviceAccountName", "synchronization", "tolerations",
})  # fmt: skip
_CLUSTER_ONLY_CONTAINER = frozenset({
    "image", "imagePullPolicy", "lifecycle", "livenessProbe", "ports", "readinessProbe", "securityContext",
    "startupProbe", "stdin", "stdinOnce", "terminationMessagePath", "terminationMessagePolicy", "tty",
})  # fmt: skip
HINTS = {
    "script": "use a container template (parameters as argv items, never spliced into source)",
    "resource": "a template is one kind: dag, container or resource",
    "steps": "use a dag template",
    "withSequence": "list the items with withItems",
    "templateRef": "inline the referenced template",
    "valueFrom": "give a literal value",
    "expression": "use valueFrom.parameter with a {{tasks...}} reference",
}

fields = FieldReader(LocalExecutorError, HINTS)


def parse_inputs(template: Mapping[str, Any], where: str) -> tuple[Input, ...]:
    """inputs.parameters (a template input's `value` acts locally as a default the task may override)."""
    inputs = fields.mapping(template.get("inputs"), f"{where}.inputs")
    fields.check_keys(inputs, f"{where}.inputs", {"parameters"})
    parsed = []
    for i, param in enumerate(fields.mappings(inputs.get("parameters"), f"{where}.inputs.parameters")):
        at = f"{where}.inputs.parameters[{i}]"
        fields.check_keys(param, at, {"name", "default", "value", "description", "enum"})
        default = fields.optional_text(param, "default", at)
        parsed.append(
            Input(fields.text(param.get("name"), f"{at}.name"), fields.optional_text(param, "value", at) or default)
        )
    return tuple(parsed)


def parse_outputs(template: Mapping[str, Any], where: str, source: str) -> tuple[Output, ...]:
    """outputs.parameters read from `source`: "path" (a file the process writes) or "parameter" (a DAG's task)."""
    outputs_spec = fields.mapping(template.get("outputs"), f"{where}.outputs")
    # An output artifact is a file the task leaves in its outputs folder; Argo uploads it, locally it stays there.
    fields.check_keys(outputs_spec, f"{where}.outputs", {"parameters"}, frozenset({"artifacts"}))
    outputs = []
    for i, param in enumerate(fields.mappings(outputs_spec.get("parameters"), f"{where}.outputs.parameters")):
        at = f"{where}.outputs.parameters[{i}]"
        fields.check_keys(param, at, {"name", "valueFrom", "description"})
        value_from = fields.mapping(param.get("valueFrom"), f"{at}.valueFrom")
        fields.check_keys(value_from, f"{at}.valueFrom", {source, "default"})
        value = fields.text(value_from.get(source), f"{at}.valueFrom.{source}")
        if source == "path" and not value.startswith("/"):
            raise LocalExecutorError(f"{at}.valueFrom.path must be absolute, got {value!r}")
        if source == "parameter" and not REFERENCE.fullmatch(value.strip()):
            raise LocalExecutorError(
                f"{at}.valueFrom.parameter must be one reference such as "
                f"'{{{{tasks.<task>.outputs.parameters.<name>}}}}', got {value!r}"
            )
        outputs.append(
            Output(
                fields.text(param.get("name"), f"{at}.name"),
                value if source == "path" else None,
                value.strip() if source == "parameter" else None,
                fields.optional_text(value_from, "default", at),
            )
        )
    return tuple(outputs)


def parse_retry(raw: Any, where: str) -> Retry | None:
    """A retryStrategy; the limit is required locally."""
    if raw is None:
        return None
    retry = fields.mapping(raw, where)
    fields.check_keys(retry, where, {"limit", "retryPolicy", "backoff", "expression"}, frozenset({"affinity"}))
    if retry.get("limit") is None:
        # Argo retries forever without a limit; locally that spins on a broken step, so the limit is required.
        raise LocalExecutorError(f"{where}.limit is required locally (retries are unbounded without it)")
    limit = int(fields.number(retry["limit"], f"{where}.limit"))
    expression = fields.optional_text(retry, "expression", where)
    # Argo >= 3.5: without a policy the expression alone decides (Always); otherwise OnFailure is the default.
    policy = fields.optional_text(retry, "retryPolicy", where) or ("Always" if expression else "OnFailure")
    if policy not in RETRY_POLICIES:
        raise LocalExecutorError(f"{where}.retryPolicy must be one of {', '.join(RETRY_POLICIES)}, got {policy!r}")
    backoff = fields.mapping(retry.get("backoff"), f"{where}.backoff")
    at = f"{where}.backoff"
    fields.check_keys(backoff, at, {"duration", "factor", "maxDuration", "cap"})
    return Retry(
        limit=limit,
        policy=policy,
        expression=expression,
        backoff_s=duration_s(backoff.get("duration", 0), f"{at}.duration", LocalExecutorError),
        factor=fields.number(backoff.get("factor", 1), f"{at}.factor"),
        max_duration_s=None
        if backoff.get("maxDuration") is None
        else duration_s(backoff["maxDuration"], f"{at}.maxDuration", LocalExecutorError),
        cap_s=None if backoff.get("cap") is None else duration_s(backoff["cap"], f"{at}.cap", LocalExecutorError),
    )


def parse_memoize(raw: Any, where: str) -> Memoize | None:
    """A template's memoize, checked against Argo's schema: key, maxAge and cache.configMap.name, nothing else."""
    if raw is None:
        return None
    memoize = fields.mapping(raw, where)
    fields.check_keys(memoize, where, {"key", "maxAge", "cache"})
    for required in ("key", "maxAge", "cache"):
        if memoize.get(required) is None:
            raise LocalExecutorError(f"{where}.{required} is required (Argo's Memoize has key, maxAge and cache)")
    key = fields.text(memoize["key"], f"{where}.key")
    if not REFERENCE.search(key) and not MEMO_KEY.fullmatch(key):
        raise LocalExecutorError(
            f"{where}.key {key!r} is not a cache key Argo accepts: letters, digits and '-', starting with a letter "
            "or digit (hash long inputs)"
        )
    max_age_text = fields.text(memoize["maxAge"], f"{where}.maxAge")
    max_age = go_duration_s(max_age_text) if max_age_text else None
    if max_age_text and (max_age is None or max_age < 0):
        raise LocalExecutorError(f"{where}.maxAge must be a Go duration such as '180s' or '24h', got {max_age_text!r}")
    cache = fields.mapping(memoize["cache"], f"{where}.cache")
    fields.check_keys(cache, f"{where}.cache", {"configMap"})
    config_map = fields.mapping(cache.get("configMap"), f"{where}.cache.configMap")
    fields.check_keys(config_map, f"{where}.cache.configMap", {"name"})
    name = fields.text(config_map.get("name"), f"{where}.cache.configMap.name")
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", name):
        raise LocalExecutorError(f"{where}.cache.configMap.name {name!r} is not a Kubernetes object name")
    return Memoize(key, max_age, name)


def parse_volumes(spec: Mapping[str, Any], where: str) -> dict[str, tuple[str, str]]:
    """Volume name -> (scope, folder): a PVC is shared by all runs, a Secret may be this machine's, else the run's."""
    volumes: dict[str, tuple[str, str]] = {}
    for i, volume in enumerate(fields.mappings(spec.get("volumes"), f"{where}.volumes")):
        name = _object_name(volume.get("name"), f"{where}.volumes[{i}].name", dns_label_problem)
        claim = fields.mapping(volume.get("persistentVolumeClaim"), f"{where}.volumes[{i}].persistentVolumeClaim")
        secret = fields.mapping(volume.get("secret"), f"{where}.volumes[{i}].secret")
        if secret:
            _object_name(secret.get("secretName"), f"{where}.volumes[{i}].secret.secretName", dns_subdomain_problem)
        if claim:
            at = f"{where}.volumes[{i}].persistentVolumeClaim.claimName"
            volumes[name] = ("state", _object_name(claim.get("claimName"), at, dns_subdomain_problem))
        elif secret and secret.get("secretName") == name:  # eksflow names a Secret's volume after it
            volumes[name] = ("secret", name)
        else:
            volumes[name] = ("run", name)
    for i, claim_template in enumerate(
        fields.mappings(spec.get("volumeClaimTemplates"), f"{where}.volumeClaimTemplates")
    ):
        metadata = fields.mapping(claim_template.get("metadata"), f"{where}.volumeClaimTemplates[{i}].metadata")
        name = fields.text(metadata.get("name"), f"{where}.volumeClaimTemplates[{i}].metadata.name")
        volumes[name] = ("run", name)  # Argo creates (and deletes) this claim per workflow
    return volumes


def _object_name(value: Any, where: str, problem: Callable[[str], str]) -> str:
    """A Kubernetes name the manifest gives (it names a folder here): LocalExecutorError unless it keeps the rule."""
    name = fields.text(value, where)
    if found := problem(name):
        raise LocalExecutorError(f"{where}: {found}")
    return name


def template_annotations(template: Mapping[str, Any], where: str) -> Mapping[str, Any]:
    """A template's metadata.annotations (its other metadata only labels the pod on a cluster)."""
    metadata = fields.mapping(template.get("metadata"), f"{where}.metadata")
    return fields.mapping(metadata.get("annotations"), f"{where}.metadata.annotations")


def _deadline(template: Mapping[str, Any], where: str) -> float | None:
    deadline = template.get("activeDeadlineSeconds")
    return None if deadline is None else fields.number(deadline, f"{where}.activeDeadlineSeconds")


def parse_container(
    template: Mapping[str, Any], where: str, spec_volumes: dict[str, tuple[str, str]]
) -> ContainerTemplate:
    """A container template."""
    container = fields.mapping(template["container"], f"{where}.container")
    at = f"{where}.container"
    fields.check_keys(
        container, at, {"name", "command", "args", "env", "volumeMounts", "resources"}, _CLUSTER_ONLY_CONTAINER
    )
    command = tuple(fields.text(c, f"{at}.command[{i}]") for i, c in enumerate(container.get("command") or []))
    if not command:
        raise LocalExecutorError(f"{at}.command is required locally: the image's entrypoint is unknown here")
    volumes = {**spec_volumes, **parse_volumes(template, where)}
    mounts = []
    for i, mount in enumerate(fields.mappings(container.get("volumeMounts"), f"{at}.volumeMounts")):
        m_at = f"{at}.volumeMounts[{i}]"
        fields.check_keys(mount, m_at, {"name", "mountPath", "subPath", "readOnly"}, frozenset({"mountPropagation"}))
        volume = fields.text(mount.get("name"), f"{m_at}.name")
        if volume not in volumes:
            raise LocalExecutorError(
                f"{m_at}.name {volume!r} matches no volume in the template's volumes, spec.volumes or "
                "spec.volumeClaimTemplates; declare the volume"
            )
        scope, folder = volumes[volume]
        mount_path = fields.text(mount.get("mountPath"), f"{m_at}.mountPath").rstrip("/")
        if not mount_path.startswith("/"):
            raise LocalExecutorError(f"{m_at}.mountPath must be absolute, got {mount_path!r}")
        sub_path = fields.optional_text(mount, "subPath", m_at) or ""
        if sub_path.startswith("/") or ".." in sub_path.split("/"):
            raise LocalExecutorError(f"{m_at}.subPath must be a relative path without '..', got {sub_path!r}")
        mounts.append(Mount(mount_path, scope, folder, sub_path))
    return ContainerTemplate(
        name=fields.text(template.get("name"), f"{where}.name"),
        inputs=parse_inputs(template, where),
        outputs=parse_outputs(template, where, "path"),
        retry=parse_retry(template.get("retryStrategy"), f"{where}.retryStrategy"),
        deadline_s=_deadline(template, where),
        memoize=parse_memoize(template.get("memoize"), f"{where}.memoize"),
        command=command,
        args=tuple(fields.text(a, f"{at}.args[{i}]") for i, a in enumerate(container.get("args") or [])),
        env=fields.env(container, at),
        mounts=tuple(mounts),
        paths=path_rules(template_annotations(template, where)),
        requests=_requests(container, at),
    )


def _requests(container: Mapping[str, Any], at: str) -> tuple[tuple[str, str], ...]:
    """The container's cpu and memory requests as written, a missing request taken from its limit (Kubernetes)."""
    resources = fields.mapping(container.get("resources"), f"{at}.resources")
    sections = {key: fields.mapping(resources.get(key), f"{at}.resources.{key}") for key in ("requests", "limits")}
    found = []
    for name in ("cpu", "memory"):
        section = "requests" if name in sections["requests"] else "limits"
        value = sections[section].get(name)
        if value is None:
            continue
        text = str(value)
        if not REFERENCE.search(text):  # a quantity the API server would refuse fails now, before anything runs
            try:
                node.quantity(value, name)
            except node.QuantityError as exc:
                raise LocalExecutorError(f"{at}.resources.{section}.{name}: {exc}") from None
        found.append((name, text))
    return tuple(found)


def parse_resource(template: Mapping[str, Any], where: str) -> ResourceTemplate:
    """A resource template; its object is described now (with placeholders), so a bad one fails before the run."""
    name = fields.text(template.get("name"), f"{where}.name")
    if template.get("outputs") is not None:
        raise LocalExecutorError(
            f"{where}.outputs is not supported locally on a resource template (jsonPath/jqFilter read the live "
            "object); have the job write files to a volume and publish them with a container task"
        )
    resource = fields.mapping(template["resource"], f"{where}.resource")
    at = f"{where}.resource"
    # Locally the job's process decides the phase (exit 0: Succeeded), so the conditions are read but not evaluated.
    fields.check_keys(resource, at, {"action", "manifest", "successCondition", "failureCondition", "setOwnerReference"})
    for key in ("successCondition", "failureCondition"):
        fields.optional_text(resource, key, at)
    action = fields.text(resource.get("action"), f"{at}.action")
    if action not in RESOURCE_ACTIONS:
        raise LocalExecutorError(
            f"{at}.action {action!r} is not supported locally; only {', '.join(RESOURCE_ACTIONS)} run here"
        )
    manifest = fields.text(resource.get("manifest"), f"{at}.manifest")
    try:
        for reference in REFERENCE.findall(manifest):
            if reference.startswith("="):
                expression_tags.check(reference[1:])
    except expression_tags.ExpressionTagError as exc:
        raise LocalExecutorError(f"{at}.manifest: {exc}") from None
    if action == "delete":
        _check_delete(resource, manifest, at)
    else:
        try:
            job = resources.describe(REFERENCE.sub(PLACEHOLDER, manifest), f"{at}.manifest")
        except resources.ResourceError as exc:
            raise LocalExecutorError(str(exc)) from None
        if job.refusal:  # its kind is never templated, so a cluster-only job is known now, before any task runs
            raise LocalExecutorError(f"template {name!r}: {job.refusal}")
    return ResourceTemplate(
        name=name,
        inputs=parse_inputs(template, where),
        outputs=(),
        retry=parse_retry(template.get("retryStrategy"), f"{where}.retryStrategy"),
        deadline_s=_deadline(template, where),
        memoize=parse_memoize(template.get("memoize"), f"{where}.memoize"),
        manifest=manifest,
        paths=path_rules(template_annotations(template, where)),
        action=action,
    )


def _check_delete(resource: Mapping[str, Any], manifest: str, at: str) -> None:
    """A delete, before the run: no conditions (Argo refuses them), an object of a run service's kind, named."""
    for key in ("successCondition", "failureCondition"):
        if resource.get(key) is not None:
            raise LocalExecutorError(f"{at}.{key}: Argo refuses a success or failure condition on a delete")
    try:
        services.deleted(REFERENCE.sub(PLACEHOLDER, manifest), f"{at}.manifest")
    except services.RunServiceError as exc:
        raise LocalExecutorError(str(exc)) from None
