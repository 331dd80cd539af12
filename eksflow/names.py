"""Kubernetes' naming rules: run (workflow) names, the pipeline labels, and what a pipeline puts on a pod.

The labels say which pipeline a run and its pods belong to. The name is the one rule the local executor names its
runs by and every verb checks.

A Workflow's name is a Kubernetes object name, a DNS-1123 subdomain: lowercase letters, digits, '-' and '.', each
dot-separated label starting and ending with a letter or digit, at most 253 characters. The local executor names
a run `metadata.name`, or `metadata.generateName` plus five random letters and digits (eksflow.local.manifest), and
refuses a manifest whose names break the rule; so a name from the command line that breaks it is no run, and it is
refused before it can name a path (`../x`, `/abs`) or overflow one (a name longer than a file name may be).

The same rules, as the API server applies them, check what a pipeline puts on a pod when it is built (eksflow.pods)
and the volumes of a manifest a local run reads (eksflow.local.parse_templates): Secret, claim and volume names,
label and annotation keys, label values, mount paths. Each `*_problem` function returns why a value breaks its rule
(the value shortened and escaped: one line whatever it holds), or "".
"""

from __future__ import annotations

import re

PIPELINE_LABEL = "eksflow.dev/pipeline"  # on every workflow and job eksflow renders: `list` filters by it
MAX_WORKFLOW_NAME = 253  # a DNS-1123 subdomain
MAX_LABEL = 63  # a DNS-1123 label; also a label key's name part and a label value
MAX_ANNOTATIONS_BYTES = 256 * 1024  # the API server's limit on all of an object's annotations together
GENERATED_SUFFIX = 5  # characters generateName gets, like the API server's
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_WORKFLOW_NAME = re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*\Z")  # a DNS-1123 subdomain
_LABEL_TEXT = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?\Z")  # a label value, or a key's name if any
# Stricter than the API server (which refuses only ':' and '..'): a mount path is also a path on this machine.
_MOUNT_PATH = re.compile(r"(/[-A-Za-z0-9._@+=,~]+)+\Z")
_SHOWN = 60  # characters of a refused name repeated in the error line


def pipeline_labels(pipeline: str) -> dict[str, str]:
    """The labels of a pipeline's workflows and the jobs they create."""
    return {"app.kubernetes.io/part-of": "eksflow", PIPELINE_LABEL: pipeline}


def workflow_name_problem(name: str) -> str:
    """Why `name` is not a workflow name, naming the rule (the name shortened and escaped), or "" if it is one."""
    problem = dns_subdomain_problem(name, "a workflow name")
    return f"{problem} (`list` shows the runs)" if problem else ""


def generate_name_problem(prefix: str) -> str:
    """Why `prefix` plus five random characters would not be a workflow name, or ""."""
    if workflow_name_problem(prefix + "a" * GENERATED_SUFFIX):
        return (
            f"generateName {prefix[:_SHOWN]!r} does not begin a workflow name: lowercase letters, digits, '-' and '.', "
            f"at most {MAX_WORKFLOW_NAME - GENERATED_SUFFIX} characters"
        )
    return ""


def shown(value: str) -> str:
    """`value` as an error line repeats it: quoted and escaped, cut to its first characters."""
    return repr(value) if len(value) <= _SHOWN else f"{value[:_SHOWN]!r}... ({len(value)} characters)"


def dns_label_problem(name: str) -> str:
    """Why `name` is not a DNS-1123 label (a volume's name; a Secret eksflow mounts, which names its volume), or ""."""
    if len(name) <= MAX_LABEL and re.fullmatch(_DNS_LABEL, name):
        return ""
    return (
        f"{shown(name)} is not a DNS-1123 label: lowercase letters, digits and '-', starting and ending with a "
        f"letter or digit, at most {MAX_LABEL} characters"
    )


def dns_subdomain_problem(name: str, what: str = "a DNS-1123 subdomain") -> str:
    """Why `name` is not a DNS-1123 subdomain (an object's name: a workflow, a claim, a Secret), or ""."""
    if len(name) <= MAX_WORKFLOW_NAME and _WORKFLOW_NAME.match(name):
        return ""
    return (
        f"{shown(name)} is not {what}: lowercase letters, digits, '-' and '.', each part starting and ending with a "
        f"letter or digit, at most {MAX_WORKFLOW_NAME} characters"
    )


def label_key_problem(key: str) -> str:
    """Why `key` is not a label or annotation key (`[prefix/]name`, a qualified name), or ""."""
    prefix, _, name = key.rpartition("/")
    if (
        name
        and len(name) <= MAX_LABEL
        and _LABEL_TEXT.match(name)
        and ("/" not in key or (len(prefix) <= MAX_WORKFLOW_NAME and _WORKFLOW_NAME.match(prefix)))
    ):
        return ""
    return (
        f"{shown(key)} is not a Kubernetes key: an optional DNS subdomain and '/', then 1-{MAX_LABEL} letters, "
        "digits, '-', '_' and '.', starting and ending with a letter or digit"
    )


def label_value_problem(value: str) -> str:
    """Why `value` is not a label value (a node selector's too), or ""."""
    if len(value) <= MAX_LABEL and _LABEL_TEXT.match(value):
        return ""
    return (
        f"{shown(value)} is not a label value: at most {MAX_LABEL} letters, digits, '-', '_' and '.', starting "
        "and ending with a letter or digit (or empty)"
    )


def annotations_size_problem(annotations: dict[str, str]) -> str:
    """Why the annotations together are over the API server's limit (keys and values, UTF-8 bytes), or ""."""
    size = sum(len(key.encode()) + len(value.encode()) for key, value in annotations.items())
    if size <= MAX_ANNOTATIONS_BYTES:
        return ""
    return (
        f"{size:,} bytes together, over the {MAX_ANNOTATIONS_BYTES:,} bytes Kubernetes allows an object; keep "
        "large data in a file instead"
    )


def mount_path_problem(path: str) -> str:
    """Why `path` is not a mount path eksflow accepts (absolute, normalized, no '..' and no ':'), or ""."""
    parts = path.split("/")[1:]
    if _MOUNT_PATH.match(path) and not {".", ".."} & set(parts):
        return ""
    return (
        f"{shown(path)} is not a mount path: an absolute path of letters, digits and -._@+=,~ without '.' or "
        "'..' parts, ':' or a trailing '/'"
    )
