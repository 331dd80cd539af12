"""Resource tasks: a Kubernetes object created, applied or deleted by Argo (a resource template), values wired typed.

`resource(name, manifest)` adds the task. A manifest's task outputs become input parameters of the template, found
as Refs (whole values, or Refs formatted into strings), never by parsing text; every string reaches Argo as a
JSON-encoding expression (eksflow.manifests).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from hera.workflows import Parameter, Resource, RetryStrategy
from hera.workflows import models as m

from eksflow.errors import PipelineError
from eksflow.manifests import REFERENCE, SAFE_REFERENCES, ManifestError, manifest_text
from eksflow.names import shown
from eksflow.pipeline import Pipeline
from eksflow.pods import check_metadata
from eksflow.refs import Ref, TaskRef, When, formatted

# The core objects whose data maps keys to text (map[string]string in Kubernetes' API): Secret's base64 or not.
_TEXT_DATA = {"ConfigMap": ("data", "binaryData"), "Secret": ("data", "stringData")}
MAX_DATA_KEY = 253  # a ConfigMap's or Secret's key becomes a file name in a volume
_DATA_KEY = re.compile(rf"[-._a-zA-Z0-9]{{1,{MAX_DATA_KEY}}}")
# What a delete reads: Argo runs `kubectl delete --ignore-not-found -f <manifest>`, which finds the object by these.
_DELETE_KEYS = ("apiVersion", "kind", "metadata")


def resource(
    name: str,
    manifest: Mapping[str, Any],
    *,
    action: Literal["create", "apply", "delete"] = "create",
    success: str | None = None,
    failure: str | None = None,
    owned: bool = True,
    after: TaskRef | Sequence[TaskRef] = (),
    when: When | None = None,
    inputs: Mapping[str, Ref] | None = None,
    retry_strategy: RetryStrategy | None = None,
    prometheus: m.Metrics | None = None,
    memoize: m.Memoize | None = None,
    step: str = "",
    active_deadline_seconds: int | None = None,
) -> TaskRef:
    """Add a task that creates, applies or deletes a Kubernetes object (an Argo resource template); returns it.

    `manifest` is the object as a dict. Its values may be task outputs and workflow values, whole (`made.path`) or
    formatted into strings (`f"{fleet}-vllm"` with `fleet = prepared.fleet`): each task output becomes an input
    parameter of the template and makes this task depend on its producer, and every such string reaches Argo as a
    JSON-encoding expression, never as text pasted into the YAML (eksflow.manifests). `inputs` declares values a
    manifest built from a step's argv reads as `{{inputs.parameters.<name>}}`. Argo waits for `success` (e.g.
    `status.availableReplicas > 0`) or fails on `failure`; `owned` objects are deleted with the workflow (a
    serving fleet outlives it: `owned=False`). `active_deadline_seconds` bounds how long Argo waits for it.

    `action="delete"`: Argo runs `kubectl delete --ignore-not-found -f <manifest>`, so an object that is not there is
    no error; the manifest names the object (apiVersion, kind, metadata.name, nothing else), Argo refuses
    `success` and `failure` for a delete, and `owned` has nothing to own (none is set).
    """
    pipeline = Pipeline.current()
    if action == "delete":
        _check_delete(manifest, success, failure, f"resource {name!r}")
    wired = _ManifestInputs(pipeline, f"resource {name!r}", inputs or {})
    wired_manifest = wired.wire(manifest)
    check_metadata(wired_manifest, f"resource {name!r}: {manifest.get('kind', 'object')}")
    _check_text_data(wired_manifest, f"resource {name!r}")
    try:
        text = manifest_text(wired_manifest)  # parameters as JSON-encoding expressions, never as text
    except ManifestError as err:
        raise PipelineError(f"resource {name!r}: {err}") from None
    template = Resource(
        name=name,
        action=action,
        # deleting the workflow deletes the object (and a job's pods); a deleted object has no owner to be given
        set_owner_reference=(owned and action != "delete") or None,
        success_condition=success,
        failure_condition=failure,
        retry_strategy=retry_strategy,
        manifest=text,
        metrics=prometheus,
        inputs=[Parameter(name=param) for param in wired.params] or None,
        memoize=memoize,
        active_deadline_seconds=active_deadline_seconds,
    )
    kind = step or str(manifest.get("kind", "object"))
    return pipeline.add(name, template, step=kind, outputs={}, inputs=wired.params, after=after, when=when)


def _check_delete(manifest: Mapping[str, Any], success: str | None, failure: str | None, where: str) -> None:
    """A delete's manifest and conditions as Argo takes them; PipelineError naming what is refused."""
    if success is not None or failure is not None:
        raise PipelineError(f"{where}: a delete takes no success or failure condition (Argo refuses them)")
    metadata = manifest.get("metadata")
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    named = isinstance(name, Ref) or bool(name)  # a task output (a fleet a step named) is known when the task runs
    extra = [str(key) for key in manifest if key not in _DELETE_KEYS]
    extra += [f"metadata.{key}" for key in metadata if key != "name"] if isinstance(metadata, Mapping) else []
    if extra or not named or not manifest.get("apiVersion") or not manifest.get("kind"):
        got = f"got {', '.join(extra)} too" if extra else "one is missing"
        raise PipelineError(f"{where}: a delete names its object by apiVersion, kind and metadata.name only; {got}")


def _check_text_data(obj: Mapping[str, Any], where: str) -> None:
    """A core ConfigMap's or Secret's data: keys Kubernetes takes, each value text; PipelineError naming one not.

    The API server refuses a number or a mapping there (`data` is map[string]string), when the workflow runs, so
    a resource task would fail far from the code that wrote it; a task output wired in is text already.
    """
    kind = obj.get("kind")
    if obj.get("apiVersion") != "v1" or kind not in _TEXT_DATA:
        return
    for field in _TEXT_DATA[kind]:
        data = obj.get(field)
        if data is None:
            continue
        if not isinstance(data, Mapping):
            raise PipelineError(f"{where}: {kind}.{field} is {type(data).__name__}; it maps keys to text")
        for key, value in data.items():
            at = f"{where}: {kind}.{field}[{shown(key) if isinstance(key, str) else repr(key)[:60]}]"
            if not isinstance(key, str) or not _DATA_KEY.fullmatch(key) or key == "." or key.startswith(".."):
                raise PipelineError(
                    f"{at}: not a {kind} key: 1-{MAX_DATA_KEY} letters, digits, '-', '_' and '.', not '.' nor "
                    "starting with '..' (it names a file)"
                )
            if not isinstance(value, str):
                raise PipelineError(
                    f"{at}: {repr(value)[:60]} is {type(value).__name__}; Kubernetes takes only text there: "
                    "write it as a string"
                )


class _ManifestInputs:
    """A resource's manifest with its task outputs wired as input parameters, typed: each one a Ref.

    A value that is a Ref is wired as one (a joined path part by part). In a string, a tag is wired only where its
    exact text is that of a Ref formatted into the string: Ref.__str__ records it on its task, and refs.formatted
    finds it among this pipeline's tasks. Workflow values, names Argo generates and the declared `inputs` stay
    tags; any other `{{...}}` (a task output typed in by hand, a fan-out item) is refused.
    """

    def __init__(self, pipeline: Pipeline, where: str, declared: Mapping[str, Ref]) -> None:
        self.pipeline = pipeline
        self.where = where
        self.declared = set(declared)
        self.params = dict(declared)  # the template's input parameters: the declared ones, then the outputs read
        self.recorded = formatted(pipeline.tasks.values())

    def wire(self, value: Any) -> Any:
        """`value` with its task outputs as input parameters; PipelineError for a tag none of the above."""
        if isinstance(value, Mapping):
            return {key: self.wire(item) for key, item in value.items()}
        if isinstance(value, list | tuple):
            return [self.wire(item) for item in value]
        if isinstance(value, Ref):
            return self.whole(value)
        if isinstance(value, str):
            return REFERENCE.sub(self.tag, value)
        return value

    def whole(self, value: Ref) -> str:
        """A Ref given as a whole value: each task output its text holds an input parameter, in text order."""
        text = value.argo
        for part in value.parts():
            if part.producer is not None:
                text = text.replace(part.argo, self.input_for(part, part.producer))
            elif part.dag is not None:
                raise PipelineError(
                    f"{self.where}: the manifest reads {part.label}, a fan-out item, which a resource does not wire; "
                    "give task outputs and workflow values themselves (or declare an input with inputs=)"
                )
            else:  # a workflow value (a parameter, the run folder)
                for found in REFERENCE.finditer(part.argo):
                    self.kept(found)
        return text

    def tag(self, found: re.Match[str]) -> str:
        """One `{{...}}` of a string: the input parameter of a task output formatted there, or a tag kept."""
        ref = self.recorded.get(found.group(0))
        if ref is not None and ref.producer is not None:
            return self.input_for(ref, ref.producer)
        return self.kept(found)

    def kept(self, found: re.Match[str]) -> str:
        """A tag that stays one: a workflow value, a name Argo generates, a declared input; PipelineError else."""
        reference = found.group(1)
        parts = reference.split(".")
        declared = parts[:2] == ["inputs", "parameters"] and ".".join(parts[2:]) in self.declared
        if parts[0] == "workflow" or reference in SAFE_REFERENCES or declared:
            return f"{{{{{reference}}}}}"
        raise PipelineError(
            f"{self.where}: the manifest reads {{{{{reference}}}}}; give task outputs and workflow values "
            "themselves (or declare an input with inputs=)"
        )

    def input_for(self, ref: Ref, task: TaskRef) -> str:
        """The input parameter standing for an output of `task`: the one it has, or a new one named after it."""
        own = self.pipeline.tasks.get(task._name)
        if own is None or own._dag is not task._dag:
            raise PipelineError(f"{self.where}: the manifest reads {ref.label}, an output of another pipeline's task")
        for param, known in self.params.items():
            if known.argo == ref.argo:
                return f"{{{{inputs.parameters.{param}}}}}"
        param = ref.output if ref.output not in self.params else f"{task._name.replace('-', '_')}_{ref.output}"
        self.params[param] = ref
        return f"{{{{inputs.parameters.{param}}}}}"
