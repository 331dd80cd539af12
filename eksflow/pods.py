"""A task's pod options (labels, annotations, node selector, Secret mounts), checked when the pipeline is built.

Each is literal text known when the pipeline is built, checked by the rule the API server applies to it
(eksflow.names), so a bad value fails `render` in one line naming the field instead of the pod at run time. Values
known only when the workflow runs (a Ref) are refused: a label decides which NetworkPolicy admits a pod (the
rollout's steps reach the serving fleet's keys by theirs), so no submit-time parameter may choose one.

A Secret is mounted read-only at an absolute path that overlaps neither the FSx mount, the outputs folder nor
another Secret; its volume is named after it, so its name is a DNS-1123 label, and not the FSx volume's. The
objects a resource task creates have their metadata checked the same way (`check_metadata`): labels and
annotations that are literal, including those of the pod templates launchers write.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from typing import Any

from hera.workflows import SecretVolume

from eksflow.errors import PipelineError
from eksflow.names import (
    annotations_size_problem,
    dns_label_problem,
    label_key_problem,
    label_value_problem,
    mount_path_problem,
    shown,
)
from eksflow.refs import Ref

# Annotations eksflow writes itself: they tell the local executor which argv values are paths to map.
OWN_ANNOTATIONS = frozenset({"eksflow.dev/path-args", "eksflow.dev/path-env"})


def literal_text(option: str, values: Mapping[str, Any] | None, where: str) -> dict[str, str]:
    """`values` as a dict of text; PipelineError naming the entry that is a Ref or not text."""
    if values is None:
        return {}
    if not isinstance(values, Mapping):
        raise PipelineError(f"{where}: {option} must be a mapping of text to text, got {type(values).__name__}")
    for key, value in values.items():
        for part, what in ((key, "key"), (value, "value")):
            if isinstance(part, Ref):
                raise PipelineError(
                    f"{where}: {_field(option, key)}: the {what} {part.label} is known only when the workflow runs; "
                    f"{option} must be literal text, known when the pipeline is built"
                )
            if not isinstance(part, str):
                raise PipelineError(
                    f"{where}: {_field(option, key)}: the {what} {part!r} is {type(part).__name__}; {option} must be "
                    f"text (quote it: {str(part)!r})"
                )
    return dict(values)


def checked_labels(option: str, values: Mapping[str, Any] | None, where: str) -> dict[str, str]:
    """Labels or a node selector: Kubernetes keys and label values."""
    labels = literal_text(option, values, where)
    for key, value in labels.items():
        if problem := label_key_problem(key) or label_value_problem(value):
            raise PipelineError(f"{where}: {_field(option, key)}: {problem}")
    return labels


def checked_annotations(values: Mapping[str, Any] | None, own: Mapping[str, str], where: str) -> dict[str, str]:
    """A task's annotations and eksflow's `own`: Kubernetes keys, none of eksflow's, within the size limit."""
    annotations = literal_text("annotations", values, where)
    for key in annotations:
        if problem := label_key_problem(key):
            raise PipelineError(f"{where}: {_field('annotations', key)}: {problem}")
        if key in OWN_ANNOTATIONS:
            raise PipelineError(
                f"{where}: {_field('annotations', key)} is eksflow's own (it says which arguments are paths); "
                "leave it out"
            )
    merged = {**own, **annotations}
    if problem := annotations_size_problem(merged):
        raise PipelineError(f"{where}: annotations: {problem}")
    return merged


def secret_volumes(
    secrets: Mapping[str, Any] | None, taken: Mapping[str, str], volumes: Set[str], where: str
) -> list[SecretVolume]:
    """Each Secret (`{mount path: Secret name}`) as a read-only volume named after it.

    `taken` names the task's other folders ({path: what it is}), which no Secret may overlap; `volumes` the
    names of its other volumes.
    """
    mounts = literal_text("secrets", secrets, where)
    claimed = dict(taken)
    mounted: dict[str, str] = {}  # Secret name -> its mount path
    for path, secret in mounts.items():
        at = f"{where}: {_field('secrets', path)}"
        if problem := mount_path_problem(path):
            raise PipelineError(f"{at}: {problem}")
        if problem := dns_label_problem(secret):
            raise PipelineError(f"{at}: the Secret name (it also names the pod's volume) {problem}")
        if secret in volumes:
            raise PipelineError(f"{at}: {secret!r} names another volume of the pod; name the Secret otherwise")
        if secret in mounted:
            raise PipelineError(f"{at}: Secret {secret!r} is mounted at {mounted[secret]} already; mount it once")
        for other, what in claimed.items():
            if overlaps(path, other):
                raise PipelineError(f"{at}: {path} overlaps {what} at {other}; mount the Secret elsewhere")
        claimed[path] = f"Secret {secret!r}"
        mounted[secret] = path
    return [
        SecretVolume(name=secret, secret_name=secret, default_mode=0o440, mount_path=path, read_only=True)
        for path, secret in mounts.items()
    ]


def overlaps(path: str, other: str) -> bool:
    """Whether one folder is the other or inside it."""
    return any(a == b or a.startswith(b.rstrip("/") + "/") for a, b in ((path, other), (other, path)))


def check_metadata(value: Any, where: str) -> None:
    """Every `metadata` in a manifest (the object's, its pod templates'): Kubernetes keys, literal label values."""
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            check_metadata(item, f"{where}[{i}]")
    if not isinstance(value, Mapping):
        return
    for key, item in value.items():
        at = f"{where}.{key}"
        if key == "metadata" and isinstance(item, Mapping):
            for field in ("labels", "annotations"):
                for name, text in (item.get(field) or {}).items():
                    name_at = f"{at}.{_field(field, name)}"
                    if not isinstance(text, str):
                        raise PipelineError(f"{name_at}: {text!r} is {type(text).__name__}; {field} take text")
                    literal = "{{" not in text and field == "labels"
                    if problem := label_key_problem(str(name)) or (label_value_problem(text) if literal else ""):
                        raise PipelineError(f"{name_at}: {problem}")
        check_metadata(item, at)


def _field(option: str, key: object) -> str:
    """How a message names one entry of an option: `labels['app']`, the key shortened and escaped."""
    return f"{option}[{shown(key) if isinstance(key, str) else repr(key)[:60]}]"
