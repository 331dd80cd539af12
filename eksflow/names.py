"""What a run (workflow) name may be, and the labels that say which pipeline a run and its pods belong to.

The name is the one rule the local executor names its runs by and every verb checks.

A Workflow's name is a Kubernetes object name, a DNS-1123 subdomain: lowercase letters, digits, '-' and '.', each
dot-separated label starting and ending with a letter or digit, at most 253 characters. The local executor names
a run `metadata.name`, or `metadata.generateName` plus five random letters and digits (eksflow.local.manifest), and
refuses a manifest whose names break the rule; so a name from the command line that breaks it is no run, and it is
refused before it can name a path (`../x`, `/abs`) or overflow one (a name longer than a file name may be).
"""

from __future__ import annotations

import re

PIPELINE_LABEL = "eksflow.dev/pipeline"  # on every workflow and job eksflow renders: `list` filters by it
MAX_WORKFLOW_NAME = 253
GENERATED_SUFFIX = 5  # characters generateName gets, like the API server's
_WORKFLOW_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
_SHOWN = 60  # characters of a refused name repeated in the error line


def pipeline_labels(pipeline: str) -> dict[str, str]:
    """The labels of a pipeline's workflows and the jobs they create."""
    return {"app.kubernetes.io/part-of": "eksflow", PIPELINE_LABEL: pipeline}


def workflow_name_problem(name: str) -> str:
    """Why `name` is not a workflow name, naming the rule (the name shortened and escaped), or "" if it is one."""
    if len(name) <= MAX_WORKFLOW_NAME and _WORKFLOW_NAME.match(name):
        return ""
    quoted = repr(name) if len(name) <= _SHOWN else f"{name[:_SHOWN]!r}... ({len(name)} characters)"
    return (
        f"{quoted} is not a workflow name: lowercase letters, digits, '-' and '.', starting and ending with a "
        f"letter or digit, at most {MAX_WORKFLOW_NAME} characters (`list` shows the runs)"
    )


def generate_name_problem(prefix: str) -> str:
    """Why `prefix` plus five random characters would not be a workflow name, or ""."""
    if workflow_name_problem(prefix + "a" * GENERATED_SUFFIX):
        return (
            f"generateName {prefix[:_SHOWN]!r} does not begin a workflow name: lowercase letters, digits, '-' and '.', "
            f"at most {MAX_WORKFLOW_NAME - GENERATED_SUFFIX} characters"
        )
    return ""
